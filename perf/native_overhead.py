"""Per-call cost of the native core's atomics from Python, beside plain (non-atomic) struct access.

    python perf/native_overhead.py           # 2,000,000 calls per operation
    python perf/native_overhead.py --quick   # 200,000

Each operation runs on an 8-aligned offset of an anonymous shared mmap (as the logs and counters
are), in a loop of the same shape as the peer's: ``struct.unpack_from`` / ``pack_into`` on the same
buffer, the plain Python way to touch shared memory, which is neither atomic nor ordered. The
ratio says what the atomics cost over that. Also times one ``offer`` + ``poll`` of 32 bytes in
one process. Writes perf/results/native_overhead.json.
"""

from __future__ import annotations

import argparse
import mmap
import struct
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from _common import new_results, quiet, write_results


def per_call_ns(fn: Callable[[], Any], calls: int) -> float:
    """Best of 3 runs of ``calls`` calls (unrolled by 10), in ns per call."""
    best = float("inf")
    loops = calls // 10
    for _ in range(3):
        start = time.perf_counter_ns()
        for _ in range(loops):
            fn()
            fn()
            fn()
            fn()
            fn()
            fn()
            fn()
            fn()
            fn()
            fn()  # noqa: E702
        best = min(best, (time.perf_counter_ns() - start) / (loops * 10))
    return best


def cas_plain(i64: struct.Struct, buf: mmap.mmap, off: int) -> bool:
    """What a compare-and-set looks like without atomics (and without its guarantee)."""
    if i64.unpack_from(buf, off)[0] != 0:
        return False
    i64.pack_into(buf, off, 0)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2_000_000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    quiet()
    if args.quick:
        args.calls = 200_000
    from logbuf.logbuffer.standalone import StreamLog
    from logbuf.native import atomics

    buf = mmap.mmap(-1, 4096)
    i64, i32 = struct.Struct("=q"), struct.Struct("=i")
    off = 64
    ops: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
        ("get_int64_volatile", lambda: atomics.get_int64_volatile(buf, off), lambda: i64.unpack_from(buf, off)),
        ("put_int64_ordered", lambda: atomics.put_int64_ordered(buf, off, 7), lambda: i64.pack_into(buf, off, 7)),
        (
            "get_and_add_int64",
            lambda: atomics.get_and_add_int64(buf, off, 1),
            lambda: i64.pack_into(buf, off, i64.unpack_from(buf, off)[0] + 1),
        ),
        (
            "compare_and_set_int64",
            lambda: atomics.compare_and_set_int64(buf, off, 0, 0),
            lambda: cas_plain(i64, buf, off),
        ),
        (
            "get_and_add_int32",
            lambda: atomics.get_and_add_int32(buf, off, 1),
            lambda: i32.pack_into(buf, off, i32.unpack_from(buf, off)[0] + 1),
        ),
    ]
    results = new_results("native_overhead", calls=args.calls)
    for name, native, plain in ops:
        buf[off : off + 8] = bytes(8)
        n = per_call_ns(native, args.calls)
        p = per_call_ns(plain, args.calls)
        case = {"case": name, "logbuf_ns": n, "plain_struct_ns": p, "ratio": n / p}
        results["cases"].append(case)
        print(f"{name:<24} native {n:6.1f} ns/call | plain struct (not atomic) {p:6.1f} ns | ratio {n / p:.2f}x")

    name = f"lbperf-{uuid.uuid4().hex[:8]}"
    with StreamLog.create(name, term_length=16 << 20) as log:
        try:
            image = log.add_subscriber()
            pub = log.add_publication()
            message = bytes(32)
            handler: Callable[[memoryview, Any], None] = lambda buffer, header: None  # noqa: E731

            def offer_poll() -> None:
                pub.offer(message)
                image.poll(handler, 1)

            for _ in range(1_000_000):  # touch every page of the log once first
                offer_poll()
            n = per_call_ns(offer_poll, args.calls)
        finally:
            log.unlink()
    results["cases"].append({"case": "offer+poll 32 B, one process", "logbuf_ns": n})
    print(f"{'offer+poll 32 B':<24} {n:6.1f} ns per message (one process, both calls)")
    buf.close()
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
