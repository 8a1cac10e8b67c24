"""IPC ping-pong round trip on two standalone shared-memory logs, beside pyzmq PAIR over ipc://.

    python perf/ipc_latency.py               # 200,000 round trips
    python perf/ipc_latency.py --quick       # 20,000

The pinger offers 32 bytes on one log and busy-polls the other for the echo; the ponger (another
process) echoes each message with ``offer`` from its handler. p50/p99/max of the round trip.
Writes perf/results/ipc_latency.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
import uuid
from typing import Any

from _common import new_results, percentiles, print_latency, quiet, write_results, zmq_latency


def ponger(ping_name: str, pong_name: str, count: int, out: Any) -> None:
    quiet()
    from logbuf.logbuffer.standalone import StreamLog

    with StreamLog.open(ping_name) as ping, StreamLog.open(pong_name) as pong:
        image = ping.add_subscriber(join_position=0)
        pub = pong.add_publication(exclusive=True)
        out.put("ready")
        echoed = 0

        def echo(buffer: memoryview, header: Any) -> None:
            nonlocal echoed
            while pub.offer(buffer) < 0:
                pass
            echoed += 1

        while echoed < count:
            image.poll(echo, 1)


def lb_latency(count: int) -> dict[str, float]:
    from logbuf.logbuffer.standalone import StreamLog

    names = [f"lbperf-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    with (
        StreamLog.create(names[0], term_length=1 << 20) as ping,
        StreamLog.create(names[1], term_length=1 << 20) as pong,
    ):
        try:
            image = pong.add_subscriber(join_position=0)
            proc = ctx.Process(target=ponger, args=(names[0], names[1], count, q))
            proc.start()
            assert q.get(timeout=30) == "ready"
            pub = ping.add_publication(exclusive=True)
            got = 0

            def on_pong(buffer: memoryview, header: Any) -> None:
                nonlocal got
                got += 1

            message = bytes(32)
            rtts = []
            perf = time.perf_counter_ns
            poll = image.poll
            for _ in range(count):
                start = perf()
                while pub.offer(message) < 0:
                    pass
                want = got + 1
                while got < want:
                    poll(on_pong, 1)
                rtts.append(perf() - start)
            proc.join(30)
        finally:
            ping.unlink()
            pong.unlink()
    return percentiles(rtts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pings", type=int, default=200_000, help="round trips")
    parser.add_argument("--quick", action="store_true", help="20,000 round trips")
    args = parser.parse_args(argv)
    quiet()
    if args.quick:
        args.pings = 20_000
    results = new_results("ipc_latency", pings=args.pings, size=32)
    lb = lb_latency(args.pings)
    zq = zmq_latency(args.pings)
    case = {"case": "ping-pong 32 B", "logbuf": lb, "pyzmq": zq, "ratio_p50": zq["p50_us"] / lb["p50_us"]}
    results["cases"].append(case)
    print_latency(case)
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
