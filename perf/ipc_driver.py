"""IPC through the media driver: throughput, ping-pong latency and driver CPU, beside pyzmq ipc://.

    python perf/ipc_driver.py            # ~5 s per throughput case
    python perf/ipc_driver.py --quick    # ~1 s per case

Runs a real ``mediadriver`` process, a publisher process and a subscriber process (clients of the
driver), then pyzmq PUB/SUB and PAIR over ipc:// with the same sizes in the same run. Writes
perf/results/ipc_driver.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from typing import Any

from _common import (
    count_log_until_end,
    cpu_seconds,
    media_driver,
    new_results,
    percentiles,
    print_latency,
    print_throughput,
    quiet,
    run_pair,
    write_results,
    zmq_latency,
    zmq_throughput,
)


# -- logbuf children -----------------------------------------------------------------------------------
def lb_publisher(directory: str, size: int, seconds: float, batch: int, out: Any) -> None:
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_publication("aeron:ipc", 10)
        while not pub.is_connected:
            time.sleep(0.001)
        message = bytes(size)
        sent = 0
        deadline = time.perf_counter() + seconds
        if batch > 1:
            messages = [message] * batch
            while time.perf_counter() < deadline:
                for _ in range(100):
                    if pub.offer_batch(messages) > 0:
                        sent += batch
        else:
            offer, idle = pub.offer, os.sched_yield  # idle as the peers' publishers do
            while time.perf_counter() < deadline:
                for _ in range(1000):
                    if offer(message) > 0:
                        sent += 1
                    else:
                        idle()
        while pub.offer(b"END!" + bytes(size)) < 0:  # the one message longer than `size`
            pass
        out.put(("sent", sent))
        time.sleep(0.5)


def lb_subscriber(directory: str, size: int, batch: int, out: Any) -> None:
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription("aeron:ipc", 10)
        out.put(("ready", 0))
        # idle: sched_yield, as the peers' subscribers do: a spinning one holds the core the publisher needs
        received, elapsed = count_log_until_end(sub, size, batch, os.sched_yield)
        out.put(("received", received))
        out.put(("elapsed", elapsed))


def lb_throughput(directory: str, size: int, seconds: float, batch: int) -> dict[str, Any]:
    results = run_pair(
        lb_subscriber, (directory, size, batch), lb_publisher, (directory, size, seconds, batch), seconds
    )
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


# -- latency -----------------------------------------------------------------------------------------
def lb_ponger(directory: str, count: int) -> None:
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription("aeron:ipc", 20)
        pub = aeron.add_publication("aeron:ipc", 21)
        while not pub.is_connected:
            time.sleep(0.001)
        echoed = 0

        def echo(buffer: memoryview, header: Any) -> None:
            nonlocal echoed
            while pub.offer(buffer) < 0:
                os.sched_yield()
            echoed += 1

        while echoed < count:
            if not sub.poll(echo, 1):
                os.sched_yield()


def lb_latency(directory: str, count: int) -> dict[str, float]:
    from logbuf.client import Aeron, Context

    ctx = mp.get_context("spawn")
    ponger = ctx.Process(target=lb_ponger, args=(directory, count))
    ponger.start()
    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_publication("aeron:ipc", 20)
        sub = aeron.add_subscription("aeron:ipc", 21)
        while not (pub.is_connected and sub.is_connected):
            time.sleep(0.001)
        rtts = []
        got = 0

        def on_pong(buffer: memoryview, header: Any) -> None:
            nonlocal got
            got += 1

        message = bytes(32)
        perf = time.perf_counter_ns
        for _ in range(count):
            start = perf()
            while pub.offer(message) < 0:
                os.sched_yield()
            want = got + 1
            while got < want:
                if not sub.poll(on_pong, 1):
                    os.sched_yield()
            rtts.append(perf() - start)
    ponger.join(30)
    return percentiles(rtts)


# -- main --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput case")
    parser.add_argument("--pings", type=int, default=50_000, help="round trips per latency case")
    parser.add_argument("--quick", action="store_true", help="1 s per case, 10,000 round trips")
    args = parser.parse_args(argv)
    quiet()
    if args.quick:
        args.seconds, args.pings = 1.0, 10_000
    results = new_results("ipc_driver", seconds=args.seconds, pings=args.pings)
    with media_driver() as (driver, directory):
        time.sleep(1.0)
        c0, t0 = cpu_seconds(driver.pid), time.monotonic()
        time.sleep(3.0)
        idle = 100 * (cpu_seconds(driver.pid) - c0) / (time.monotonic() - t0)
        results["driver_cpu_idle_pct"] = idle
        print(f"driver CPU idle: {idle:.1f}% of a core")
        for size, batch in ((32, 1), (512, 1), (32, 64), (512, 16)):
            c0, t0 = cpu_seconds(driver.pid), time.monotonic()
            lb = lb_throughput(directory, size, args.seconds, batch)
            lb["driver_cpu_pct"] = 100 * (cpu_seconds(driver.pid) - c0) / (time.monotonic() - t0)
            zq = zmq_throughput(size, args.seconds) if batch == 1 else None
            case: dict[str, Any] = {
                "case": f"throughput {size} B {'batch' if batch > 1 else 'offer'}",
                "logbuf": lb,
                "pyzmq": zq,
            }
            if zq:
                case["ratio_msgs"] = lb["msgs_per_s"] / zq["msgs_per_s"]
            results["cases"].append(case)
            print_throughput(case)
        lb_lat = lb_latency(directory, args.pings)
        zq_lat = zmq_latency(args.pings)
        case = {
            "case": "ping-pong 32 B",
            "logbuf": lb_lat,
            "pyzmq": zq_lat,
            "ratio_p50": zq_lat["p50_us"] / lb_lat["p50_us"],
        }
        results["cases"].append(case)
        print_latency(case)
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
