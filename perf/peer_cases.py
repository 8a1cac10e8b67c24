"""One benchmark case for one implementation, run by ``perf/peers.py`` in the implementation's own interpreter.

    <python> perf/peer_cases.py IMPL CASE '{"seconds": 5, "pings": 20000}'

IMPL is ``logbuf``, ``pyaeron`` or ``pyzmq``; CASE is one of :data:`CASES`. The last line printed is the
result as JSON. Every implementation runs the same scenario: a driver process (two for UDP, on loopback), a
publisher process and a subscriber process, 32 B or 512 B messages offered one at a time for ``seconds``,
messages received per second counted by the subscriber from its first message, and nothing lost; or a 32 B
ping-pong between two processes. pyaeron's C media driver runs in SHARED threading mode (its best on 2
cores); pyzmq uses PUB/SUB over ``ipc://`` for IPC rows and PUSH/PULL over TCP for UDP rows.

The ``*-batch`` rows are logbuf's vectorised path (see :data:`BATCH`) beside the others' per-message one.

This module imports neither logbuf nor pyaeron at the top, so any interpreter can load it.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    collect,
    count_until_end,
    media_driver,
    percentiles,
    ping_pong_rtts,
    zmq_latency,
    zmq_throughput,
)

CASES = (
    "ipc-32",
    "ipc-512",
    "ipc-pingpong",
    "udp-32",
    "udp-512",
    "udp-pingpong",
    "udp-pingpong-pinned",
    "udp-pingpong-embedded",
    "udp-32-embedded",
    "udp-512-embedded",
    "ipc-32-batch",
    "udp-32-batch",
)
BATCH = 64
"""``*-batch`` rows: logbuf offers ``BATCH`` messages per call from a numpy array (``offer_rows``) and polls
them into numpy arrays (``poll_batch``) with a numpy consumer; pyaeron has no such API, so its figure on
these rows is its per-message path (the same scenario as the row without ``-batch``), and pyzmq's too."""
EMBEDDED = "udp-pingpong-embedded"
"""``*-embedded`` rows: each side's driver lives in its client's process, 2 processes, not 4. logbuf's is
an invoker-mode driver (``MediaDriver.launch(ctx, invoker=True)``) whose duty cycle the client runs
where it would idle (and, publishing, after every ``INVOKE_EVERY`` offers); pyaeron's is its C media
driver (SHARED threading mode) on a thread of the client's process; pyzmq's figure is its row without
``-embedded`` (it has no driver)."""
INVOKE_EVERY = 1000
"""An embedded publisher's driver sends only when invoked: after this many offers it runs a cycle even
if none was back-pressured (one cycle sends up to 64 datagrams)."""
STREAM_ID = 10
PONG_STREAM_ID = 11
END = b"END!"


# -- logbuf: the existing benchmarks' scenarios ---------------------------------------------------------
def lb_batch_publisher(directory: str, channel: str, size: int, seconds: float, out: Any) -> None:
    import numpy as np

    from logbuf.client import Aeron, Context
    from logbuf.logging_config import configure_logging

    configure_logging("warning")
    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_publication(channel, STREAM_ID)
        give_up = time.monotonic() + 30
        while not pub.is_connected and time.monotonic() < give_up:
            time.sleep(0.001)
        rows = np.zeros((BATCH, size), dtype=np.uint8)
        offer_rows, idle = pub.offer_rows, os.sched_yield
        sent = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(100):
                if offer_rows(rows) > 0:
                    sent += BATCH
                else:
                    idle()
        end = END + bytes(size)
        give_up = time.monotonic() + 30
        while pub.offer(end) < 0 and time.monotonic() < give_up:
            idle()
        out.put(("sent", sent))
        time.sleep(1.0)


def lb_batch_subscriber(directory: str, channel: str, size: int, timeout_s: float, out: Any) -> None:
    from logbuf.client import Aeron, Context, FragmentBatch
    from logbuf.logging_config import configure_logging

    configure_logging("warning")
    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription(channel, STREAM_ID)
        out.put(("ready", 0))
        batch = FragmentBatch(4096)
        lengths = batch.lengths
        poll_batch, idle = sub.poll_batch, os.sched_yield
        received, done, start = 0, False, 0.0
        deadline = time.monotonic() + timeout_s
        while not done:
            n = poll_batch(batch)
            if n:
                if not start:
                    start = time.perf_counter()
                ok = int((lengths[:n] == size).sum())  # the numpy consumer: every message checked
                received += ok
                done = ok != n  # the END message is longer
            else:
                idle()
                if time.monotonic() > deadline:
                    break
        out.put(("received", received))
        out.put(("elapsed", time.perf_counter() - start if start else 0.0))


def lb_batch_throughput(pub_dir: str, sub_dir: str, channel: str, size: int, seconds: float) -> dict[str, Any]:
    result = run_throughput(lb_batch_publisher, lb_batch_subscriber, pub_dir, sub_dir, channel, size, seconds)
    return {**result, "batch": BATCH}


def lb_embedded(name: str) -> tuple[Any, Any]:
    """An invoker-mode driver and a client that runs it while its commands wait."""
    from logbuf.client import Aeron, Context
    from logbuf.driver.context import DriverContext
    from logbuf.driver.media_driver import MediaDriver

    directory = f"/dev/shm/logbuf-peers-{name}-{uuid.uuid4().hex[:8]}"
    driver = MediaDriver.launch(DriverContext(dir=directory, dir_delete_on_shutdown=True), invoker=True)
    return driver, Aeron.connect(Context(dir=directory, driver_agent_invoker=driver.invoke))


def lb_embedded_publisher(directory: str, channel: str, size: int, seconds: float, out: Any) -> None:
    from logbuf.logging_config import configure_logging

    configure_logging("warning")
    driver, aeron = lb_embedded("pub")
    invoke = driver.invoke
    try:
        pub = aeron.add_publication(channel, STREAM_ID)
        give_up = time.monotonic() + 30
        while not pub.is_connected and time.monotonic() < give_up:
            invoke()
        message, offer = bytes(size), pub.offer
        sent = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(1000 // INVOKE_EVERY):
                for _ in range(INVOKE_EVERY):
                    if offer(message) > 0:
                        sent += 1
                    else:
                        invoke()
                invoke()
        end = END + bytes(size)
        give_up = time.monotonic() + 30
        while pub.offer(end) < 0 and time.monotonic() < give_up:
            invoke()
        out.put(("sent", sent))
        linger = time.monotonic() + 1.0  # the sender drains only while this driver runs
        while time.monotonic() < linger:
            if not invoke():
                os.sched_yield()
    finally:
        aeron.close()
        driver.close()


def lb_embedded_subscriber(directory: str, channel: str, size: int, timeout_s: float, out: Any) -> None:
    from logbuf.client import FragmentAssembler
    from logbuf.logging_config import configure_logging

    configure_logging("warning")
    driver, aeron = lb_embedded("sub")
    try:
        sub = aeron.add_subscription(channel, STREAM_ID)
        out.put(("ready", 0))
        received, elapsed, _ = count_until_end(
            sub.poll, size, timeout_s, driver.invoke, wrap=FragmentAssembler, idle_when_busy=True
        )  # the receiver reads the socket only when invoked
        out.put(("received", received))
        out.put(("elapsed", elapsed))
    finally:
        aeron.close()
        driver.close()


def lb_embedded_ponger(ping: str, pong: str, count: int) -> None:
    from logbuf.logging_config import configure_logging

    configure_logging("warning")
    driver, aeron = lb_embedded("pong")
    invoke = driver.invoke
    try:
        sub = aeron.add_subscription(ping, STREAM_ID)
        pub = aeron.add_publication(pong, PONG_STREAM_ID)
        give_up = time.monotonic() + 30
        while not pub.is_connected and time.monotonic() < give_up:
            invoke()
        echoed = 0

        def echo(buffer: memoryview, header: Any) -> None:
            nonlocal echoed
            while pub.offer(buffer) < 0:
                invoke()
            echoed += 1

        poll = sub.poll
        deadline = time.monotonic() + 600
        while echoed < count and time.monotonic() < deadline:
            if not poll(echo, 1):
                invoke()
        linger = time.monotonic() + 0.5  # the last pong leaves only when this driver runs
        while time.monotonic() < linger:
            invoke()
    finally:
        aeron.close()
        driver.close()


def lb_embedded_latency(count: int, warmup: int) -> dict[str, Any]:
    ping, pong = udp(free_udp_port()), udp(free_udp_port())
    ponger = mp.get_context("spawn").Process(target=lb_embedded_ponger, args=(ping, pong, count + warmup))
    ponger.start()
    driver, aeron = lb_embedded("ping")
    invoke = driver.invoke
    try:
        sub = aeron.add_subscription(pong, PONG_STREAM_ID)
        pub = aeron.add_publication(ping, STREAM_ID)
        give_up = time.monotonic() + 30
        while not (pub.is_connected and sub.is_connected):
            invoke()
            if time.monotonic() > give_up:
                raise RuntimeError("ping-pong streams never connected")
        message, offer = bytes(32), pub.offer
        return percentiles(ping_pong_rtts(lambda: offer(message) >= 0, sub.poll, invoke, count, warmup))
    finally:
        ponger.join(30)
        if ponger.is_alive():
            ponger.kill()
        aeron.close()
        driver.close()


def logbuf_case(case: str, seconds: float, pings: int) -> dict[str, Any]:
    import ipc_driver
    import udp_driver

    if case == EMBEDDED:
        return lb_embedded_latency(pings, min(1_000, pings // 10))
    if case.endswith("-embedded"):
        size = int(case.split("-")[1])
        return run_throughput(
            lb_embedded_publisher, lb_embedded_subscriber, "", "", udp(free_udp_port()), size, seconds
        )

    size = int(case.split("-")[1]) if case.split("-")[1].isdigit() else 0
    if case.startswith("ipc") and case.endswith("batch"):
        with media_driver(prefix="logbuf-peers") as (_, directory):
            return lb_batch_throughput(directory, directory, "aeron:ipc", size, seconds)
    if case.startswith("ipc"):
        with media_driver(prefix="logbuf-peers") as (_, directory):
            if case == "ipc-pingpong":
                return ipc_driver.lb_latency(directory, pings)
            return ipc_driver.lb_throughput(directory, int(case.split("-")[1]), seconds, 1)
    a, b = udp_driver.Driver("a", []), udp_driver.Driver("b", [])
    try:
        a.wait_started()
        b.wait_started()
        if case.startswith("udp-pingpong"):
            return udp_driver.lb_latency(a, b, pings, min(1_000, pings // 10), pinned=case.endswith("pinned"))
        if case.endswith("batch"):
            return lb_batch_throughput(a.dir, b.dir, udp(free_udp_port()), size, seconds)
        return udp_driver.lb_throughput(a, b, int(case.split("-")[1]), seconds, None)
    finally:
        a.close()
        b.close()


# -- pyaeron: the same scenarios through the real Aeron C client and C media driver ----------------------
def pa_driver(directory: str, cpu: int | None, ready: Any) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # before the driver's threads exist, so they inherit it
    import pyaeron

    driver = pyaeron.MediaDriver(dir=directory, threading="shared")
    ready.put(("driver", os.getpid()))
    signal.sigwait({signal.SIGTERM})
    driver.close()


class PaDrivers:
    """pyaeron C media drivers, each in a process of its own (as logbuf's are)."""

    def __init__(self, count: int, cpus: tuple[int | None, ...] = (None, None)) -> None:
        ctx = mp.get_context("spawn")
        self.dirs = [f"/dev/shm/aeron-peers-{uuid.uuid4().hex[:8]}" for _ in range(count)]
        ready = ctx.Queue()
        self.procs = [ctx.Process(target=pa_driver, args=(d, cpus[i], ready)) for i, d in enumerate(self.dirs)]
        for p in self.procs:
            p.start()
        for _ in self.procs:
            ready.get(timeout=30)

    def close(self) -> None:
        for p in self.procs:
            if p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
            p.join(10)
            if p.is_alive():
                p.kill()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def pa_publisher(directory: str, channel: str, size: int, seconds: float, out: Any) -> None:
    import pyaeron

    with pyaeron.Aeron(dir=directory) as aeron:
        pub = aeron.add_publication(channel, STREAM_ID)
        pub.await_connected(30)
        message, offer, idle = bytes(size), pub.offer, os.sched_yield
        sent = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(1000):
                if offer(message):
                    sent += 1
                else:
                    idle()
        end = END + bytes(size)
        give_up = time.monotonic() + 30
        while not pub.offer(end) and time.monotonic() < give_up:
            idle()
        out.put(("sent", sent))
        time.sleep(1.0)


def pa_subscriber(directory: str, channel: str, size: int, timeout_s: float, out: Any) -> None:
    import pyaeron

    with pyaeron.Aeron(dir=directory) as aeron:
        sub = aeron.add_subscription(channel, STREAM_ID)
        out.put(("ready", 0))
        received, elapsed, _ = count_until_end(sub.poll, size, timeout_s, os.sched_yield)
        out.put(("received", received))
        out.put(("elapsed", elapsed))


def run_throughput(
    publisher: Any, subscriber: Any, pub_dir: str, sub_dir: str, channel: str, size: int, seconds: float
) -> dict[str, Any]:
    """One subscriber process, then one publisher process (each reporting to a queue); the receive rate."""
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    sub = ctx.Process(target=subscriber, args=(sub_dir, channel, size, seconds + 60, q))
    sub.start()
    assert q.get(timeout=30)[0] == "ready"
    pub = ctx.Process(target=publisher, args=(pub_dir, channel, size, seconds, q))
    pub.start()
    results = collect(q, 3, seconds + 90)
    pub.join(30)
    sub.join(30)
    rate = results["received"] / results["elapsed"] if results["elapsed"] else 0.0
    return {
        "size": size,
        "sent": results["sent"],
        "received": results["received"],
        "lost": results["sent"] - results["received"],
        "msgs_per_s": rate,
        "mb_per_s": rate * size / 1e6,
    }


def pa_throughput(pub_dir: str, sub_dir: str, channel: str, size: int, seconds: float) -> dict[str, Any]:
    return run_throughput(pa_publisher, pa_subscriber, pub_dir, sub_dir, channel, size, seconds)


def pa_embedded_publisher(directory: str, channel: str, size: int, seconds: float, out: Any) -> None:
    import pyaeron

    driver = pyaeron.MediaDriver(dir=directory, threading="shared")
    try:
        pa_publisher(directory, channel, size, seconds, out)
    finally:
        driver.close()


def pa_embedded_subscriber(directory: str, channel: str, size: int, timeout_s: float, out: Any) -> None:
    import pyaeron

    driver = pyaeron.MediaDriver(dir=directory, threading="shared")
    try:
        pa_subscriber(directory, channel, size, timeout_s, out)
    finally:
        driver.close()


def pa_ponger(directory: str, ping: str, pong: str, count: int, cpu: int | None, embedded: bool = False) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import pyaeron

    driver = pyaeron.MediaDriver(dir=directory, threading="shared") if embedded else None
    try:
        pa_pong(directory, ping, pong, count)
    finally:
        if driver is not None:
            driver.close()


def pa_pong(directory: str, ping: str, pong: str, count: int) -> None:
    import pyaeron

    with pyaeron.Aeron(dir=directory) as aeron:
        sub = aeron.add_subscription(ping, STREAM_ID)
        pub = aeron.add_publication(pong, PONG_STREAM_ID)
        pub.await_connected(30)
        replied = 0
        idle = os.sched_yield

        def echo(buffer: Any, header: Any) -> None:
            nonlocal replied
            data = bytes(buffer)
            while not pub.offer(data):
                idle()
            replied += 1

        poll = sub.poll
        deadline = time.monotonic() + 600
        while replied < count and time.monotonic() < deadline:
            if not poll(echo, 1):
                idle()


def pa_latency(
    ping_dir: str, pong_dir: str, ping: str, pong: str, count: int, warmup: int, pinned: bool, embedded: bool = False
) -> dict[str, float]:
    """``embedded``: each side starts its own C media driver in its process (no driver processes)."""
    import pyaeron

    affinity = os.sched_getaffinity(0)
    if pinned:
        os.sched_setaffinity(0, {1})
    ponger = mp.get_context("spawn").Process(
        target=pa_ponger, args=(pong_dir, ping, pong, count + warmup, 0 if pinned else None, embedded)
    )
    ponger.start()
    driver = pyaeron.MediaDriver(dir=ping_dir, threading="shared") if embedded else None
    try:
        with pyaeron.Aeron(dir=ping_dir) as aeron:
            pub = aeron.add_publication(ping, STREAM_ID)
            sub = aeron.add_subscription(pong, PONG_STREAM_ID)
            pub.await_connected(30)
            sub.await_connected(30)
            message, offer = bytes(32), pub.offer
            rtts = ping_pong_rtts(lambda: offer(message), sub.poll, os.sched_yield, count, warmup)
        return percentiles(rtts)
    finally:
        ponger.join(30)
        if ponger.is_alive():
            ponger.kill()
        if driver is not None:
            driver.close()
        os.sched_setaffinity(0, affinity)


def free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def udp(port: int) -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}"


def pyaeron_case(case: str, seconds: float, pings: int) -> dict[str, Any]:
    case = case.removesuffix("-batch")  # no batch API: its per-message path
    if case == EMBEDDED:
        dirs = [f"/dev/shm/aeron-peers-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        try:
            ping, pong = udp(free_udp_port()), udp(free_udp_port())
            return pa_latency(*dirs, ping, pong, pings, min(1_000, pings // 10), False, embedded=True)
        finally:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
    if case.endswith("-embedded"):
        dirs = [f"/dev/shm/aeron-peers-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        try:
            publisher, subscriber = pa_embedded_publisher, pa_embedded_subscriber
            return run_throughput(publisher, subscriber, *dirs, udp(free_udp_port()), int(case.split("-")[1]), seconds)
        finally:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
    pinned = case.endswith("pinned")
    drivers = PaDrivers(1 if case.startswith("ipc") else 2, (0, 1) if pinned else (None, None))
    try:
        if case == "ipc-pingpong":
            d = drivers.dirs[0]
            return pa_latency(d, d, "aeron:ipc", "aeron:ipc", pings, min(1_000, pings // 10), False)
        if case.startswith("ipc"):
            d = drivers.dirs[0]
            return pa_throughput(d, d, "aeron:ipc", int(case.split("-")[1]), seconds)
        a, b = drivers.dirs
        if case.startswith("udp-pingpong"):
            return pa_latency(a, b, udp(free_udp_port()), udp(free_udp_port()), pings, min(1_000, pings // 10), pinned)
        return pa_throughput(a, b, udp(free_udp_port()), int(case.split("-")[1]), seconds)
    finally:
        drivers.close()


# -- pyzmq ------------------------------------------------------------------------------------------------
def pyzmq_case(case: str, seconds: float, pings: int) -> dict[str, Any]:
    case = case.removesuffix("-batch").removesuffix("-embedded")
    if case == "ipc-pingpong":
        return zmq_latency(pings)
    if case.startswith("ipc"):
        return zmq_throughput(int(case.split("-")[1]), seconds)
    if case.startswith("udp-pingpong"):
        return zmq_latency(
            pings, endpoint="tcp://127.0.0.1:*", warmup=min(1_000, pings // 10), pinned=case.endswith("pinned")
        )
    import udp_driver

    return udp_driver.zmq_tcp_throughput(int(case.split("-")[1]), seconds)


IMPLS = {"logbuf": logbuf_case, "pyaeron": pyaeron_case, "pyzmq": pyzmq_case}


def main(argv: list[str]) -> int:
    impl, case, params = argv[0], argv[1], json.loads(argv[2])
    if impl not in IMPLS or case not in CASES:
        raise SystemExit(
            f"unknown implementation {impl!r} or case {case!r}: implementations {sorted(IMPLS)}, cases {CASES}"
        )
    if impl == "logbuf":
        from logbuf.logging_config import configure_logging

        configure_logging("warning")
    result = IMPLS[impl](case, float(params["seconds"]), int(params["pings"]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
