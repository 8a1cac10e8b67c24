"""IPC throughput on a standalone shared-memory log: one publisher process, one subscriber process.

    python perf/ipc_throughput.py            # ~5 s per case
    python perf/ipc_throughput.py --quick    # ~1 s per case

32-byte and 512-byte messages, per-message ``offer()`` (subscriber: ``poll`` with a Python handler
per message) and the batch API (``offer_batch``; subscriber: ``block_poll`` counting frames in C),
beside pyzmq PUB/SUB over ipc:// with the same sizes in the same run. Counts what the subscriber
received: lost = sent - received. Writes perf/results/ipc_throughput.json.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import Any

from _common import count_log_until_end, new_results, print_throughput, quiet, run_pair, write_results, zmq_throughput

TERM_LENGTH = 16 * 1024 * 1024


def publisher(name: str, size: int, seconds: float, batch: int, out: Any) -> None:
    quiet()
    from logbuf.logbuffer.standalone import StreamLog

    with StreamLog.open(name) as log:
        pub = log.add_publication()
        message = bytes(size)
        sent = 0
        deadline = time.perf_counter() + seconds
        if batch > 1:
            messages = [message] * batch
            offer_batch = pub.offer_batch
            while time.perf_counter() < deadline:
                for _ in range(100):
                    if offer_batch(messages) > 0:
                        sent += batch
        else:
            offer = pub.offer
            while time.perf_counter() < deadline:
                for _ in range(1000):
                    if offer(message) > 0:
                        sent += 1
        while pub.offer(b"END!" + message) < 0:  # the one message longer than `size`
            pass
        out.put(("sent", sent))


def subscriber(name: str, size: int, batch: int, out: Any) -> None:
    quiet()
    from logbuf.logbuffer.standalone import StreamLog

    with StreamLog.open(name) as log:
        image = log.add_subscriber(join_position=0)
        out.put(("ready", 0))
        received, elapsed = count_log_until_end(image, size, batch, spin)  # no driver: the reader spins
        out.put(("received", received))
        out.put(("elapsed", elapsed))


def spin() -> None:
    """The idle of a spinning reader: nothing."""


def lb_throughput(size: int, seconds: float, batch: int) -> dict[str, Any]:
    from logbuf.logbuffer.standalone import StreamLog

    name = f"lbperf-{uuid.uuid4().hex[:8]}"
    with StreamLog.create(name, term_length=TERM_LENGTH, stream_id=10) as log:
        try:
            results = run_pair(subscriber, (name, size, batch), publisher, (name, size, seconds, batch), seconds)
        finally:
            log.unlink()
    rate = results["received"] / results["elapsed"]
    return {
        "size": size,
        "batch": batch,
        "sent": results["sent"],
        "received": results["received"],
        "lost": results["sent"] - results["received"],
        "msgs_per_s": rate,
        "mb_per_s": rate * size / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each case")
    parser.add_argument("--quick", action="store_true", help="1 s per case")
    args = parser.parse_args(argv)
    quiet()
    if args.quick:
        args.seconds = 1.0
    results = new_results("ipc_throughput", seconds=args.seconds, term_length=TERM_LENGTH)
    peers: dict[int, dict[str, Any]] = {}
    for size, batch in ((32, 1), (512, 1), (32, 64), (512, 16)):
        lb = lb_throughput(size, args.seconds, batch)
        if size not in peers:
            peers[size] = zmq_throughput(size, args.seconds)
        zq = peers[size]
        case = {
            "case": f"throughput {size} B {'batch' if batch > 1 else 'offer'}",
            "logbuf": lb,
            "pyzmq": zq,
            "ratio_msgs": lb["msgs_per_s"] / zq["msgs_per_s"],
        }
        results["cases"].append(case)
        print_throughput(case)
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
