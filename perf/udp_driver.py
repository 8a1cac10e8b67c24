"""UDP between two media drivers on 127.0.0.1: throughput, ping-pong latency and both drivers' CPU,
beside pyzmq over tcp://127.0.0.1 in the same run.

    python perf/udp_driver.py            # ~5 s per throughput case
    python perf/udp_driver.py --quick    # ~1 s per case

Driver A sends (its client publishes to ``aeron:udp?endpoint=127.0.0.1:PORT``), driver B receives
(its client subscribes; B binds the port). Throughput: one ``offer()`` per message, the subscriber
counts messages in its handler (through a FragmentAssembler, so 8 KiB messages are reassembled
from 6 fragments at the default MTU); 32 B, 512 B and 8 KiB at MTU 1408, and 512 B at mtu=8192.
Latency: ping A -> B on one stream, pong B -> A on another, p50/p99/max, once as the scheduler places
the processes and once pinned (driver A and the ponger on CPU 0, driver B and the pinger on CPU 1;
pyzmq's two processes likewise). The peer is pyzmq
PUSH/PULL (reliable, like this transport) for throughput and PAIR for latency, both over TCP on
loopback. A client that finds nothing to do (a failed offer, an empty poll) calls
``sched_yield``: on a 2-core machine two drivers and two clients share the cores, and a spinning
client would starve the driver agents that move its data. Writes perf/results/udp_driver.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from _common import (
    ROOT,
    collect_or_raise,
    count_until_end,
    cpu_seconds,
    new_results,
    percentiles,
    ping_pong_rtts,
    quiet,
    run_child,
    write_results,
    zmq_latency,
)

STREAM_ID = 10
PING_STREAM_ID, PONG_STREAM_ID = 20, 21
END = b"END!"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def udp_channel(port: int, mtu: int | None = None) -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}" + (f"|mtu={mtu}" if mtu else "")


# -- drivers ---------------------------------------------------------------------------------------
class Driver:
    def __init__(self, name: str, args: list[str]) -> None:
        self.name = name
        self.dir = f"/dev/shm/logbuf-perf-{name}-{uuid.uuid4().hex[:8]}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"udp-driver-{name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "logbuf.driver.main", "--dir", self.dir, *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    def wait_started(self) -> None:
        from logbuf.conduit.cnc import wait_for_driver

        try:
            wait_for_driver(self.dir, timeout_ns=20_000_000_000)
        except TimeoutError:
            raise RuntimeError(f"driver {self.name} did not start:\n{self.output()}") from None

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def output(self) -> str:
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")[-5000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.unlink(self.log.name)


# -- logbuf throughput children ------------------------------------------------------------------------
def lb_publisher(directory: str, channel: str, size: int, seconds: float, out: Any) -> None:
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_publication(channel, STREAM_ID)
        deadline = time.monotonic() + 30
        while not pub.is_connected:
            if time.monotonic() > deadline:
                out.put(("sent", -1))  # never connected
                return
            time.sleep(0.001)
        message = bytes(size)
        offer, idle = pub.offer, os.sched_yield
        sent = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(1000):
                if offer(message) > 0:
                    sent += 1
                else:
                    idle()
        end = END + bytes(size)  # the one message longer than `size`
        give_up = time.monotonic() + 30
        while pub.offer(end) < 0 and time.monotonic() < give_up:
            idle()
        out.put(("sent", sent))
        time.sleep(1.0)  # let the sender drain before the publication goes


def lb_subscriber(directory: str, channel: str, size: int, timeout_s: float, out: Any) -> None:
    quiet()
    from logbuf.client import Aeron, Context, FragmentAssembler

    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription(channel, STREAM_ID)
        out.put(("ready", 0))
        received, elapsed, done = count_until_end(sub.poll, size, timeout_s, os.sched_yield, wrap=FragmentAssembler)
        out.put(("received", received))
        out.put(("elapsed", elapsed))
        out.put(("completed", done))


def run_children(procs: list[Any], q: Any, keys: int, timeout_s: float) -> dict[str, Any]:
    ok = False
    try:
        results = collect_or_raise(q, keys, timeout_s)
        ok = True
        return results
    finally:
        for p in procs:
            p.join(10 if ok else 0.5)
            if p.is_alive():
                p.kill()
                p.join(5)


def lb_throughput(a: Driver, b: Driver, size: int, seconds: float, mtu: int | None) -> dict[str, Any]:
    port = free_udp_port()
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    sub = ctx.Process(target=run_child, args=(lb_subscriber, b.dir, udp_channel(port), size, seconds + 60, q))
    sub.start()
    run_children([], q, 1, 30)  # ready
    pub = ctx.Process(target=run_child, args=(lb_publisher, a.dir, udp_channel(port, mtu), size, seconds, q))
    pub.start()
    results = run_children([pub, sub], q, 4, seconds + 90)
    if results["sent"] < 0:
        raise RuntimeError(f"publication to {udp_channel(port, mtu)} never connected")
    if not results["completed"]:
        raise RuntimeError(f"subscriber timed out: {results['received']:.0f} of {results['sent']:.0f} messages")
    rate = results["received"] / results["elapsed"]
    return {
        "size": size,
        "mtu": mtu or 1408,
        "sent": int(results["sent"]),
        "received": int(results["received"]),
        "lost": int(results["sent"] - results["received"]),
        "msgs_per_s": rate,
        "mb_per_s": rate * size / 1e6,
    }


# -- logbuf latency --------------------------------------------------------------------------------
def lb_ponger(directory: str, ping_channel: str, pong_channel: str, count: int, cpu: int | None) -> None:
    quiet()
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription(ping_channel, PING_STREAM_ID)
        pub = aeron.add_publication(pong_channel, PONG_STREAM_ID)
        deadline = time.monotonic() + 30
        while not pub.is_connected and time.monotonic() < deadline:
            time.sleep(0.001)
        echoed = 0
        idle = os.sched_yield

        def echo(buffer: memoryview, header: Any) -> None:
            nonlocal echoed
            while pub.offer(buffer) < 0:
                idle()
            echoed += 1

        deadline = time.monotonic() + 600
        while echoed < count and time.monotonic() < deadline:
            if not sub.poll(echo, 1):
                idle()


def lb_latency(a: Driver, b: Driver, count: int, warmup: int, pinned: bool = False) -> dict[str, float]:
    """Ping-pong between a client of driver A and one of driver B. ``pinned``: driver A and the
    ponger on CPU 0, driver B and the pinger on CPU 1 (each hop then crosses to the other CPU, where
    a yielding process is waiting); unpinned, the scheduler sometimes puts both drivers on one CPU
    and the round trip doubles."""
    from logbuf.client import Aeron, Context

    ping_channel, pong_channel = udp_channel(free_udp_port()), udp_channel(free_udp_port())
    affinity = os.sched_getaffinity(0)
    if pinned:
        os.sched_setaffinity(a.proc.pid, {0})
        os.sched_setaffinity(b.proc.pid, {1})
        os.sched_setaffinity(0, {1})
    ponger = mp.get_context("spawn").Process(
        target=lb_ponger, args=(b.dir, ping_channel, pong_channel, count + warmup, 0 if pinned else None)
    )
    ponger.start()
    try:
        with Aeron.connect(Context(dir=a.dir)) as aeron:
            sub = aeron.add_subscription(pong_channel, PONG_STREAM_ID)
            pub = aeron.add_publication(ping_channel, PING_STREAM_ID)
            deadline = time.monotonic() + 30
            while not (pub.is_connected and sub.is_connected):
                if time.monotonic() > deadline:
                    raise RuntimeError("ping-pong streams never connected")
                time.sleep(0.001)
            message = bytes(32)
            rtts = ping_pong_rtts(lambda: pub.offer(message) >= 0, sub.poll, os.sched_yield, count, warmup)
    finally:
        ponger.join(30)
        if ponger.is_alive():
            ponger.kill()
        if pinned:
            for pid in (a.proc.pid, b.proc.pid, 0):
                os.sched_setaffinity(pid, affinity)
    return percentiles(rtts)


# -- pyzmq over TCP ------------------------------------------------------------------------------------
def zmq_pusher(endpoint: str, size: int, seconds: float, out: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(endpoint)
    message = bytes(size)
    sent = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(1000):
            sock.send(message, copy=False)
            sent += 1
    sock.send(END)
    out.put(("sent", sent))
    sock.close(linger=10_000)
    ctx.term()


def zmq_puller(size: int, out: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.bind("tcp://127.0.0.1:*")
    out.put(("endpoint", sock.getsockopt_string(zmq.LAST_ENDPOINT)))
    received = 0
    start = 0.0
    while True:
        message = sock.recv(copy=False)
        if not start:
            start = time.perf_counter()
        if len(message) != size:
            break
        received += 1
    out.put(("received", received))
    out.put(("elapsed", time.perf_counter() - start))
    sock.close()
    ctx.term()


def zmq_tcp_throughput(size: int, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    puller = ctx.Process(target=zmq_puller, args=(size, q))
    puller.start()
    key, endpoint = q.get(timeout=30)
    assert key == "endpoint"
    pusher = ctx.Process(target=zmq_pusher, args=(endpoint, size, seconds, q))
    pusher.start()
    results = run_children([pusher, puller], q, 3, seconds + 60)
    rate = results["received"] / results["elapsed"]
    return {
        "size": size,
        "socket": "PUSH/PULL tcp",
        "sent": results["sent"],
        "received": results["received"],
        "loss_pct": 100.0 * (results["sent"] - results["received"]) / max(1, results["sent"]),
        "msgs_per_s": rate,
        "mb_per_s": rate * size / 1e6,
    }


# -- main ------------------------------------------------------------------------------------------------
def print_latency(case: dict[str, Any]) -> None:
    lb, zq = case["logbuf"], case["pyzmq"]
    print(
        f"{case['case']}: logbuf p50 {lb['p50_us']:.1f} us p99 {lb['p99_us']:.1f} us max {lb['max_us']:.0f} us"
        f" | pyzmq tcp p50 {zq['p50_us']:.1f} us p99 {zq['p99_us']:.1f} us max {zq['max_us']:.0f} us"
        f" | pyzmq/logbuf p50 {case['ratio_p50']:.3g}x"
    )


def print_case(case: dict[str, Any]) -> None:
    lb, zq = case["logbuf"], case["pyzmq"]
    if "error" in lb:
        print(f"{case['case']:<30} logbuf FAILED: {lb['error']} | pyzmq tcp {zq['msgs_per_s'] / 1e6:6.3f} M msgs/s")
        return
    print(
        f"{case['case']:<30} logbuf {lb['msgs_per_s'] / 1e6:6.3f} M msgs/s {lb['mb_per_s']:8.1f} MB/s "
        f"lost {lb['lost']}  CPU A {lb['driver_a_cpu_pct']:.0f}% B {lb['driver_b_cpu_pct']:.0f}%"
        f" | pyzmq tcp {zq['msgs_per_s'] / 1e6:6.3f} M msgs/s | logbuf/pyzmq {case['ratio_msgs']:.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput case")
    parser.add_argument("--pings", type=int, default=20_000, help="round trips per latency case")
    parser.add_argument("--quick", action="store_true", help="1 s per case, 5,000 round trips")
    parser.add_argument(
        "--driver-arg",
        action="append",
        default=[],
        help="extra argument for both drivers (repeat: --driver-arg=--mtu --driver-arg=1408)",
    )
    args = parser.parse_args(argv)
    quiet()
    if args.quick:
        args.seconds, args.pings = 1.0, 5_000
    warmup = min(1_000, args.pings // 10)
    results = new_results(
        "udp_driver",
        seconds=args.seconds,
        pings=args.pings,
        warmup=warmup,
        driver_args=args.driver_arg,
        peer="pyzmq over tcp://127.0.0.1",
    )
    failures: list[str] = []
    a, b = Driver("a", args.driver_arg), Driver("b", args.driver_arg)
    try:
        a.wait_started()
        b.wait_started()
        time.sleep(1.0)
        ca, cb, t0 = a.cpu(), b.cpu(), time.monotonic()
        time.sleep(2.0)
        wall = time.monotonic() - t0
        results["driver_cpu_idle_pct"] = {"a": 100 * (a.cpu() - ca) / wall, "b": 100 * (b.cpu() - cb) / wall}
        print(
            f"drivers' CPU idle: A {results['driver_cpu_idle_pct']['a']:.1f}% "
            f"B {results['driver_cpu_idle_pct']['b']:.1f}% of a core"
        )
        zmq_cache: dict[int, dict[str, Any]] = {}
        for size, mtu in ((32, None), (512, None), (8192, None), (512, 8192)):
            name = f"throughput {size} B mtu {mtu or 1408}" + (" (fragmented)" if size > 1376 else "")
            ca, cb, t0 = a.cpu(), b.cpu(), time.monotonic()
            try:
                lb = lb_throughput(a, b, size, args.seconds, mtu)
                wall = time.monotonic() - t0
                lb["driver_a_cpu_pct"] = 100 * (a.cpu() - ca) / wall
                lb["driver_b_cpu_pct"] = 100 * (b.cpu() - cb) / wall
            except Exception as e:  # keep measuring the other cases; the failure is reported
                lb = {"size": size, "mtu": mtu or 1408, "error": repr(e)}
                failures.append(f"{name}: {e!r}")
            if size not in zmq_cache:
                zmq_cache[size] = zmq_tcp_throughput(size, args.seconds)
            zq = zmq_cache[size]
            case: dict[str, Any] = {"case": name, "logbuf": lb, "pyzmq": zq}
            if "error" not in lb:
                case["ratio_msgs"] = lb["msgs_per_s"] / zq["msgs_per_s"]
            results["cases"].append(case)
            print_case(case)
        for pinned in (False, True) if len(os.sched_getaffinity(0)) >= 2 else (False,):
            zq_lat = zmq_latency(args.pings, endpoint="tcp://127.0.0.1:*", warmup=warmup, pinned=pinned)
            name = "ping-pong 32 B" + (
                " (pinned: driver A + ponger on CPU 0, driver B + pinger on CPU 1)" if pinned else ""
            )
            try:
                lb_lat = lb_latency(a, b, args.pings, warmup, pinned)
                case = {
                    "case": name,
                    "logbuf": lb_lat,
                    "pyzmq": zq_lat,
                    "ratio_p50": zq_lat["p50_us"] / lb_lat["p50_us"],
                }
                print_latency(case)
            except Exception as e:
                case = {"case": name, "logbuf": {"error": repr(e)}, "pyzmq": zq_lat}
                failures.append(f"{name}: {e!r}")
                print(f"{name}: logbuf FAILED: {e!r} | pyzmq p50 {zq_lat['p50_us']:.1f} us")
            results["cases"].append(case)
    finally:
        a_alive, b_alive = a.proc.poll() is None, b.proc.poll() is None
        if failures or not (a_alive and b_alive):
            print(
                f"--- driver A output (alive {a_alive}) ---\n{a.output()}\n--- driver B output (alive {b_alive}) ---\n"
                f"{b.output()}"
            )
        a.close()
        b.close()
    if failures:
        print("not writing results; failures:\n  " + "\n  ".join(failures))
        return 1
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
