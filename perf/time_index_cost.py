"""What the archive's time index costs the recorder: bounding a block's reserved values beside writing it.

    python perf/time_index_cost.py

For 1 MiB blocks of DATA frames with 64, 512 and 1344-byte payloads (as the recorder block-polls them),
the best of 50 runs of ``BoundsBuilder.add`` (one native walk of the block's frames,
``logbuf.native.reserved_value_bounds``) and of the ``pwrite`` of the same block to a file on /dev/shm,
in the same process, alternated, so that the ratio holds under load even when the microseconds do not.
Writes perf/results/time_index_cost.json, with the load average.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from typing import Any

from _common import new_results, quiet, write_results

BLOCK = 1 << 20
RUNS = 50


def block_of(payload: int) -> tuple[bytes, int]:
    """A block of whole DATA frames with ``payload``-byte payloads, stamped with increasing reserved values."""
    from logbuf.logbuffer import data_header_descriptor as dh

    frame = dh.align(payload + dh.HEADER_LENGTH)
    frames = BLOCK // frame
    buf = bytearray(frames * frame)
    for i in range(frames):
        dh.HEADER.pack_into(
            buf, i * frame, payload + dh.HEADER_LENGTH, 0, dh.UNFRAGMENTED, dh.HDR_TYPE_DATA, i * frame, 1, 10, 0, i + 1
        )
    return bytes(buf), frames


def main() -> int:
    quiet()
    from logbuf.archive.time_index import BoundsBuilder

    results = new_results("time_index_cost", block_bytes=BLOCK, runs=RUNS)
    results["load_avg_at_start"] = os.getloadavg()
    path = f"/dev/shm/logbuf-time-index-cost-{uuid.uuid4().hex[:8]}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        for payload in (64, 512, 1344):
            block, frames = block_of(payload)
            builder = BoundsBuilder()
            best_add = best_write = float("inf")
            for _ in range(RUNS):
                t0 = time.perf_counter()
                builder.add(block)
                t1 = time.perf_counter()
                os.pwrite(fd, block, 0)
                t2 = time.perf_counter()
                best_add, best_write = min(best_add, t1 - t0), min(best_write, t2 - t1)
            assert builder.stamped == RUNS * frames and (builder.low, builder.high) == (1, frames)
            case: dict[str, Any] = {
                "payload": payload,
                "frames_per_block": frames,
                "bounds_us": best_add * 1e6,
                "pwrite_tmpfs_us": best_write * 1e6,
                "bounds_to_pwrite": best_add / best_write,
                "load_avg": os.getloadavg(),
            }
            results["cases"].append(case)
            print(
                f"{payload:5d} B payloads, {frames:5d} frames per MiB: bounds {case['bounds_us']:6.1f} us, "
                f"pwrite to tmpfs {case['pwrite_tmpfs_us']:6.1f} us, ratio {case['bounds_to_pwrite']:.2f} "
                f"(load {case['load_avg'][0]:.1f})"
            )
    finally:
        os.close(fd)
        os.unlink(path)
    results["note"] = (
        "2-core machine shared with other work: microseconds are noisy, the ratio less so. The recorder "
        "also block-polls (a native scan of the same frames) and stores its position per block."
    )
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
