"""IPC through the media driver: throughput, ping-pong latency and driver CPU, beside pyzmq ipc://.

    python perf/ipc_driver.py            # ~5 s per throughput case
    python perf/ipc_driver.py --quick    # ~1 s per case

Runs a real ``mediadriver`` process, a publisher process and a subscriber process (clients of the
driver), then pyzmq PUB/SUB and PAIR over ipc:// with the same sizes in the same run. Writes
perf/results/ipc_driver.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ipc_driver.json")
SEQ = struct.Struct("<q")


def quiet() -> None:
    """Benchmarks log lifecycle at warning level only (children are fresh spawned interpreters)."""
    from logbuf.logging_config import configure_logging

    configure_logging("warning")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- logbuf children -----------------------------------------------------------------------------------
def lb_publisher(directory: str, size: int, seconds: float, batch: int, out: Any) -> None:
    quiet()
    from client import Aeron, Context

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
            offer = pub.offer
            while time.perf_counter() < deadline:
                for _ in range(1000):
                    if offer(message) > 0:
                        sent += 1
        while pub.offer(b"END!" + bytes(size)) < 0:  # the one message longer than `size`
            pass
        out.put(("sent", sent))
        time.sleep(0.5)


def lb_subscriber(directory: str, size: int, batch: int, out: Any) -> None:
    quiet()
    import numpy as np

    from client import Aeron, Context
    from logbuf._native import frame_index

    offsets = np.empty(1 << 16, dtype=np.int32)
    lengths = np.empty(1 << 16, dtype=np.int32)
    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription("aeron:ipc", 10)
        out.put(("ready", 0))
        received = 0
        done = False
        start = 0.0

        def on_fragment(buffer: memoryview, header: Any) -> None:
            nonlocal received, done
            if len(buffer) == size:
                received += 1
            else:
                done = True

        def on_block(block: memoryview, term_offset: int, session_id: int, term_id: int) -> None:
            nonlocal received, done
            n = frame_index(block, offsets, lengths)
            if n and lengths[n - 1] != size:
                done = True
                n -= 1
            received += n

        while not done:
            n = sub.block_poll(on_block, 1 << 21) if batch > 1 else sub.poll(on_fragment, 4096)
            if n and not start:
                start = time.perf_counter()
        out.put(("received", received))
        out.put(("elapsed", time.perf_counter() - start))


def lb_throughput(directory: str, size: int, seconds: float, batch: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    sub = ctx.Process(target=lb_subscriber, args=(directory, size, batch, q))
    sub.start()
    assert q.get(timeout=30)[0] == "ready"
    pub = ctx.Process(target=lb_publisher, args=(directory, size, seconds, batch, q))
    pub.start()
    results: dict[str, float] = {}
    while len(results) < 3:
        key, value = q.get(timeout=seconds + 60)
        results[key] = value
    pub.join(30)
    sub.join(30)
    rate = results["received"] / results["elapsed"]
    return {"size": size, "batch": batch, "sent": results["sent"], "received": results["received"],
            "lost": results["sent"] - results["received"], "msgs_per_s": rate, "mb_per_s": rate * size / 1e6}


# -- pyzmq peer ---------------------------------------------------------------------------------------
def zmq_publisher(endpoint: str, size: int, seconds: float, out: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.bind(endpoint)
    time.sleep(1.0)  # slow joiner
    message = bytes(size)
    sent = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(1000):
            sock.send(message, copy=False)
            sent += 1
    time.sleep(0.2)
    for _ in range(20):
        sock.send(b"END!")
        time.sleep(0.01)
    out.put(("sent", sent))
    sock.close(linger=1000)
    ctx.term()


def zmq_subscriber(endpoint: str, out: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.connect(endpoint)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    out.put(("ready", 0))
    received = 0
    start = 0.0
    while True:
        message = sock.recv(copy=False)
        if not start:
            start = time.perf_counter()
        if bytes(message.buffer[:4]) == b"END!":
            break
        received += 1
    out.put(("received", received))
    out.put(("elapsed", time.perf_counter() - start))
    sock.close()
    ctx.term()


def zmq_throughput(size: int, seconds: float) -> dict[str, Any]:
    endpoint = f"ipc://{tempfile.gettempdir()}/lbperf-{uuid.uuid4().hex[:8]}"
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    sub = ctx.Process(target=zmq_subscriber, args=(endpoint, q))
    sub.start()
    assert q.get(timeout=30)[0] == "ready"
    pub = ctx.Process(target=zmq_publisher, args=(endpoint, size, seconds, q))
    pub.start()
    results: dict[str, float] = {}
    while len(results) < 3:
        key, value = q.get(timeout=seconds + 60)
        results[key] = value
    pub.join(30)
    sub.join(30)
    rate = results["received"] / results["elapsed"]
    return {"size": size, "sent": results["sent"], "received": results["received"],
            "loss_pct": 100.0 * (results["sent"] - results["received"]) / max(1, results["sent"]),
            "msgs_per_s": rate, "mb_per_s": rate * size / 1e6}


# -- latency -----------------------------------------------------------------------------------------
def lb_ponger(directory: str, count: int) -> None:
    quiet()
    from client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription("aeron:ipc", 20)
        pub = aeron.add_publication("aeron:ipc", 21)
        while not pub.is_connected:
            time.sleep(0.001)
        echoed = 0

        def echo(buffer: memoryview, header: Any) -> None:
            nonlocal echoed
            while pub.offer(buffer) < 0:
                pass
            echoed += 1

        while echoed < count:
            sub.poll(echo, 1)


def lb_latency(directory: str, count: int) -> dict[str, float]:
    from client import Aeron, Context

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
                pass
            want = got + 1
            while got < want:
                sub.poll(on_pong, 1)
            rtts.append(perf() - start)
    ponger.join(30)
    return percentiles(rtts)


def zmq_ponger(endpoint: str, count: int) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(endpoint)
    for _ in range(count):
        sock.send(sock.recv())
    sock.close()
    ctx.term()


def zmq_latency(count: int) -> dict[str, float]:
    import zmq

    endpoint = f"ipc://{tempfile.gettempdir()}/lbperf-{uuid.uuid4().hex[:8]}"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.bind(endpoint)
    proc = mp.get_context("spawn").Process(target=zmq_ponger, args=(endpoint, count))
    proc.start()
    message = bytes(32)
    rtts = []
    perf = time.perf_counter_ns
    for _ in range(count):
        start = perf()
        sock.send(message)
        sock.recv()
        rtts.append(perf() - start)
    proc.join(30)
    sock.close()
    ctx.term()
    return percentiles(rtts)


def percentiles(rtts_ns: list[int]) -> dict[str, float]:
    rtts_ns.sort()
    n = len(rtts_ns)
    return {"p50_us": rtts_ns[n // 2] / 1e3, "p99_us": rtts_ns[int(n * 0.99)] / 1e3, "max_us": rtts_ns[-1] / 1e3,
            "count": n}


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
    directory = f"/dev/shm/logbuf-perf-{uuid.uuid4().hex[:8]}"
    driver = subprocess.Popen([sys.executable, "-m", "driver.main", "--dir", directory], stderr=subprocess.DEVNULL)
    results: dict[str, Any] = {
        "benchmark": "ipc_driver", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "params": {"seconds": args.seconds, "pings": args.pings}, "cases": [],
    }
    try:
        from driver.media_driver import wait_for_driver

        wait_for_driver(directory)
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
            case = {"case": f"throughput {size} B {'batch' if batch > 1 else 'offer'}", "logbuf": lb, "pyzmq": zq}
            if zq:
                case["ratio_msgs"] = lb["msgs_per_s"] / zq["msgs_per_s"]
            results["cases"].append(case)
            print(f"{case['case']:<28} logbuf {lb['msgs_per_s'] / 1e6:6.2f} M msgs/s {lb['mb_per_s']:8.1f} MB/s "
                  f"lost {lb['lost']}  driver CPU {lb['driver_cpu_pct']:.1f}%"
                  + (f" | pyzmq {zq['msgs_per_s'] / 1e6:5.2f} M msgs/s loss {zq['loss_pct']:.1f}%"
                     f" | ratio {case['ratio_msgs']:.1f}x" if zq else ""))
        lb_lat = lb_latency(directory, args.pings)
        zq_lat = zmq_latency(args.pings)
        results["cases"].append({"case": "ping-pong 32 B", "logbuf": lb_lat, "pyzmq": zq_lat,
                                 "ratio_p50": zq_lat["p50_us"] / lb_lat["p50_us"]})
        print(f"ping-pong 32 B: logbuf p50 {lb_lat['p50_us']:.1f} us p99 {lb_lat['p99_us']:.1f} us "
              f"max {lb_lat['max_us']:.0f} us | pyzmq p50 {zq_lat['p50_us']:.1f} us p99 {zq_lat['p99_us']:.1f} us "
              f"| pyzmq/logbuf p50 {zq_lat['p50_us'] / lb_lat['p50_us']:.1f}x")
    finally:
        driver.terminate()
        driver.wait(10)
        shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
