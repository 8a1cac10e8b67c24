"""Cost of the client hot paths per message, in one process, load-independent when run under callgrind.

    python perf/hot_path_cost.py                        # wall-clock ns per message of each phase
    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \\
        python perf/hot_path_cost.py --phase poll -n 200000   # instructions (Ir) of one phase

Phases over one hand-made log (16 MiB terms, so nothing rotates): ``offer`` (32 B ``offer`` in a loop of
the benchmark's shape), ``poll`` (``poll(handler, 4096)`` of what was offered; the handler does what the
benchmark's does), ``poll_batch`` (the vectorised poll into numpy arrays) and ``offer_rows`` (the
numpy batch offer). Under callgrind, run each phase with two counts and take the difference of their
totals over the difference of the counts: that is the instructions per message with start-up removed.
Wall-clock figures are printed with the machine load beside them, as they are noisy on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import struct
import sys
import time
from typing import Any

TERM = 16 << 20
INITIAL_TERM_ID = 7


def make_log() -> mmap.mmap:
    from logbuf.logbuffer import data_header_descriptor as dh
    from logbuf.logbuffer import log_buffer_descriptor as lbd

    log = mmap.mmap(-1, 3 * TERM + lbd.LOG_META_DATA_LENGTH)
    meta = 3 * TERM
    struct.pack_into("=i", log, meta + lbd.LOG_TERM_LENGTH_OFFSET, TERM)
    struct.pack_into("=i", log, meta + lbd.LOG_MTU_LENGTH_OFFSET, 1408)
    struct.pack_into("=i", log, meta + lbd.LOG_INITIAL_TERM_ID_OFFSET, INITIAL_TERM_ID)
    struct.pack_into("=i", log, meta + lbd.LOG_IS_CONNECTED_OFFSET, 1)
    dh.HEADER.pack_into(
        log, meta + lbd.LOG_DEFAULT_FRAME_HEADER_OFFSET, 32, 0, dh.UNFRAGMENTED, dh.HDR_TYPE_DATA, 0, 5, 10, 0, 0
    )
    for index in range(lbd.PARTITION_COUNT):
        term_id = INITIAL_TERM_ID if index == 0 else INITIAL_TERM_ID + index - lbd.PARTITION_COUNT
        struct.pack_into("=q", log, meta + lbd.TERM_TAIL_COUNTERS_OFFSET + 8 * index, lbd.pack_tail(term_id, 0))
    return log


def run(phase: str, count: int) -> float:
    """Runs ``phase`` over ``count`` messages; returns the seconds the measured part took."""
    from logbuf import native

    log = make_log()
    limit = mmap.mmap(-1, 4096)
    struct.pack_into("=q", limit, 0, 1 << 40)
    position = mmap.mmap(-1, 4096)
    view = native.LogView(log)
    pub = native.PublicationCore(view, limit, 0, False)
    image = native.ImageCore(view, position, 0)
    message = bytes(32)
    size = 32
    received = 0

    def on_fragment(buffer: memoryview, header: Any) -> None:
        nonlocal received
        if len(buffer) == size:
            received += 1

    offer = pub.offer
    started = time.perf_counter()
    if phase in ("offer", "poll", "poll_batch"):
        for _ in range(count // 1000):
            for _ in range(1000):
                if offer(message) > 0:
                    received += 0
    if phase == "offer":
        return time.perf_counter() - started
    if phase == "offer_rows":
        import numpy as np

        payloads = np.zeros((1000, 32), dtype=np.uint8)
        offer_rows = pub.offer_rows
        for _ in range(count // 1000):
            offer_rows(payloads)
        return time.perf_counter() - started
    started = time.perf_counter()
    if phase == "poll":
        poll = image.poll
        while received < count:
            poll(on_fragment, 4096)
    elif phase == "poll_batch":
        from logbuf.logbuffer.image import FragmentBatch

        batch = FragmentBatch(4096)
        core, poll_batch = batch.core, image.poll_batch
        while received < count:
            n = poll_batch(core)
            received += int((batch.lengths[:n] == size).sum())  # a numpy consumer
    else:
        raise SystemExit(f"unknown phase {phase!r}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=["offer", "poll", "poll_batch", "offer_rows", "all"], default="all")
    parser.add_argument("-n", "--count", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    phases = ["offer", "poll", "poll_batch", "offer_rows"] if args.phase == "all" else [args.phase]
    out = {}
    for phase in phases:
        try:
            best = min(run(phase, args.count) for _ in range(3 if args.phase == "all" else 1))
        except (AttributeError, ImportError) as e:  # a phase this tree does not have yet
            print(f"{phase:<18} n/a ({e})")
            continue
        out[phase] = best / args.count * 1e9
        print(f"{phase:<18} {out[phase]:7.1f} ns/msg  (load {os.getloadavg()[0]:.2f})", flush=True)
    print(json.dumps({"ns_per_msg": out, "load_1m": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
