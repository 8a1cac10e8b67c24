"""Shared pieces of the perf/ benchmarks: the pyzmq peer, percentiles, CPU sampling, results files, a
media driver process and the throughput subscribers' counting loops.

The benchmarks run as scripts (``python perf/<name>.py``); this module sits beside them on sys.path
and spawned children import it from there.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def quiet() -> None:
    """Benchmarks log lifecycle at warning level only (children are fresh spawned interpreters)."""
    from logbuf.logging_config import configure_logging

    configure_logging("warning")


def cpu_user_system_seconds(pid: int) -> tuple[float, float]:
    """A process's user and system CPU seconds (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    return sum(cpu_user_system_seconds(pid))


class MediaDriver(NamedTuple):
    process: subprocess.Popen[bytes]
    directory: str


@contextmanager
def media_driver(*args: str, prefix: str = "logbuf-perf", start_timeout_s: float = 10.0) -> Iterator[MediaDriver]:
    """A ``mediadriver`` process with ``args`` in a fresh /dev/shm directory, active (its CnC heartbeat
    seen within ``start_timeout_s``) when the block starts; terminated and its directory removed after."""
    from logbuf.conduit.cnc import wait_for_driver

    directory = f"/dev/shm/{prefix}-{uuid.uuid4().hex[:8]}"
    process = subprocess.Popen(
        [sys.executable, "-m", "logbuf.driver.main", "--dir", directory, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_driver(directory, timeout_ns=round(start_timeout_s * 1e9))
        yield MediaDriver(process, directory)
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def new_results(benchmark: str, **params: Any) -> dict[str, Any]:
    return {
        "benchmark": benchmark,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "params": params,
        "cases": [],
    }


def write_results(results: dict[str, Any]) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{results['benchmark']}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {path}")
    return path


def percentiles(rtts_ns: list[int]) -> dict[str, float]:
    rtts_ns.sort()
    n = len(rtts_ns)
    return {
        "p50_us": rtts_ns[n // 2] / 1e3,
        "p99_us": rtts_ns[int(n * 0.99)] / 1e3,
        "max_us": rtts_ns[-1] / 1e3,
        "count": n,
    }


def ping_pong_rtts(
    ping: Callable[[], object],
    poll: Callable[[Callable[[Any, Any], None], int], int],
    idle: Callable[[], object],
    count: int,
    warmup: int,
) -> list[int]:
    """Round trips over a publication/subscription pair, ns: ``count + warmup`` times, ``ping()`` until it
    is taken (truthy), then ``poll(handler, 1)`` until the pong arrives, calling ``idle()`` after every
    refused offer and empty poll; the first ``warmup`` are not kept. A pong 10 s late raises."""
    got = 0

    def on_pong(buffer: Any, header: Any) -> None:
        nonlocal got
        got += 1

    rtts: list[int] = []
    clock = time.perf_counter_ns
    for i in range(count + warmup):
        t0 = clock()
        while not ping():
            idle()
        want = got + 1
        give_up = t0 + 10_000_000_000
        while got < want:
            if not poll(on_pong, 1):
                idle()
                if clock() > give_up:
                    raise RuntimeError(f"no pong for ping {i} in 10 s")
        if i >= warmup:
            rtts.append(clock() - t0)
    return rtts


def count_until_end(
    poll: Callable[[Any, int], int],
    size: int,
    timeout_s: float,
    idle: Callable[[], object],
    *,
    wrap: Callable[[Callable[[Any, Any], None]], Any] | None = None,
    idle_when_busy: bool = False,
) -> tuple[int, float, bool]:
    """A throughput subscriber's loop: ``poll(handler, 4096)`` counting the messages of ``size`` until the
    one longer message (the END marker) or ``timeout_s`` without it. Returns (messages, seconds from the
    first fragment to the end, whether the end arrived). ``idle()`` runs after an empty poll, and after
    every poll with ``idle_when_busy`` (an embedded driver's duty cycle, which must run for anything to
    arrive); ``wrap`` wraps the handler (a FragmentAssembler)."""
    received, done, start = 0, False, 0.0

    def on_message(buffer: Any, header: Any) -> None:
        nonlocal received, done
        if len(buffer) == size:
            received += 1
        else:
            done = True

    handler = on_message if wrap is None else wrap(on_message)
    deadline = time.monotonic() + timeout_s
    while not done:
        if poll(handler, 4096):
            if not start:
                start = time.perf_counter()
            if idle_when_busy:
                idle()
        else:
            idle()
            if time.monotonic() > deadline:
                break
    return received, time.perf_counter() - start if start else 0.0, done


def count_log_until_end(source: Any, size: int, batch: int, idle: Callable[[], object]) -> tuple[int, float]:
    """A throughput subscriber's loop over a log ``source`` (a Subscription, or a standalone log's Image):
    ``block_poll`` with ``batch`` > 1 (frames indexed in place), else ``poll``, counting the ``size``-byte
    messages until the one longer message (the END marker); ``idle()`` after an empty poll. Returns
    (messages, seconds from the first fragment to the end)."""
    import numpy as np

    from logbuf.native import frame_index

    offsets = np.empty(1 << 16, dtype=np.int32)
    lengths = np.empty(1 << 16, dtype=np.int32)
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
        n = source.block_poll(on_block, 1 << 21) if batch > 1 else source.poll(on_fragment, 4096)
        if n:
            if not start:
                start = time.perf_counter()
        else:
            idle()
    return received, time.perf_counter() - start


def count_batches_until_end(
    poll_batch: Callable[[Any], int], batch: Any, size: int, timeout_s: float, idle: Callable[[], object]
) -> tuple[int, float, bool]:
    """:func:`count_until_end` for a batch subscriber: ``poll_batch(batch)`` into a FragmentBatch (messages of
    one fragment each), counting the ``size``-byte fragments until the one longer fragment (the END marker)
    or ``timeout_s``. Returns (messages, seconds from the first fragment to the end, whether the end arrived)."""
    received, done, start = 0, False, 0.0
    lengths = batch.lengths
    deadline = time.monotonic() + timeout_s
    while not done and time.monotonic() < deadline:
        count = poll_batch(batch)
        if count:
            if not start:
                start = time.perf_counter()
            full = int((lengths[:count] == size).sum())
            received += full
            done = full < count
        else:
            idle()
    return received, time.perf_counter() - start if start else 0.0, done


def run_child(target: Callable[..., object], *args: Any) -> None:
    """Process target: ``target(*args)``, an exception also reported on the queue (the last argument) as
    ("error", text), so the parent never waits out a timeout for a dead child."""
    try:
        target(*args)
    except BaseException as e:
        args[-1].put(("error", f"{target.__name__}: {e!r}"))
        raise


def collect_or_raise(q: Any, keys: int | set[str], timeout_s: float) -> dict[str, Any]:
    """Like :func:`collect`, but a child's ("error", text) report raises at once. ``keys``: how many
    reports, or which names (others that arrive meanwhile are kept too)."""
    results: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(results) < keys if isinstance(keys, int) else not keys <= results.keys():
        key, value = q.get(timeout=max(0.1, deadline - time.monotonic()))
        if key == "error":
            raise RuntimeError(value)
        results[key] = value
    return results


def collect(q: Any, keys: int, timeout_s: float) -> dict[str, float]:
    """Read ``keys`` (name, value) pairs from a queue of child reports."""
    results: dict[str, float] = {}
    while len(results) < keys:
        key, value = q.get(timeout=timeout_s)
        results[key] = value
    return results


def run_pair(
    subscriber: Callable[..., object],
    subscriber_args: tuple[Any, ...],
    publisher: Callable[..., object],
    publisher_args: tuple[Any, ...],
    seconds: float,
) -> dict[str, float]:
    """A throughput case's two processes (spawned; each gets the report queue as its last argument): the
    subscriber, which reports ("ready", 0) once subscribed, then the publisher, which runs ``seconds``. The
    three reports that follow (sent, received, elapsed), once both have reported."""
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    sub = ctx.Process(target=subscriber, args=(*subscriber_args, q))
    sub.start()
    assert q.get(timeout=30)[0] == "ready"
    pub = ctx.Process(target=publisher, args=(*publisher_args, q))
    pub.start()
    results = collect(q, 3, seconds + 60)
    pub.join(30)
    sub.join(30)
    return results


def print_throughput(case: dict[str, Any]) -> None:
    lb, zq = case["logbuf"], case.get("pyzmq")
    extra = f"  driver CPU {lb['driver_cpu_pct']:.1f}%" if "driver_cpu_pct" in lb else ""
    print(
        f"{case['case']:<28} logbuf {lb['msgs_per_s'] / 1e6:6.2f} M msgs/s {lb['mb_per_s']:8.1f} MB/s "
        f"lost {lb['lost']}{extra}"
        + (
            f" | pyzmq {zq['msgs_per_s'] / 1e6:5.2f} M msgs/s loss {zq['loss_pct']:.1f}%"
            f" | ratio {case['ratio_msgs']:.1f}x"
            if zq
            else ""
        )
    )


def print_latency(case: dict[str, Any]) -> None:
    lb, zq = case["logbuf"], case["pyzmq"]
    print(
        f"{case['case']}: logbuf p50 {lb['p50_us']:.1f} us p99 {lb['p99_us']:.1f} us max {lb['max_us']:.0f} us"
        f" | pyzmq p50 {zq['p50_us']:.1f} us p99 {zq['p99_us']:.1f} us | pyzmq/logbuf p50 {case['ratio_p50']:.1f}x"
    )


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
    results = run_pair(zmq_subscriber, (endpoint,), zmq_publisher, (endpoint, size, seconds), seconds)
    rate = results["received"] / results["elapsed"]
    return {
        "size": size,
        "sent": results["sent"],
        "received": results["received"],
        "loss_pct": 100.0 * (results["sent"] - results["received"]) / max(1, results["sent"]),
        "msgs_per_s": rate,
        "mb_per_s": rate * size / 1e6,
    }


def zmq_ponger(endpoint: str, count: int, cpu: int | None = None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(endpoint)
    for _ in range(count):
        sock.send(sock.recv())
    sock.close()
    ctx.term()


def zmq_latency(count: int, *, endpoint: str | None = None, warmup: int = 0, pinned: bool = False) -> dict[str, float]:
    """pyzmq PAIR ping-pong of 32 B over ``endpoint`` (default a fresh ``ipc://`` path; ``tcp://127.0.0.1:*``
    binds any port); the first ``warmup`` round trips are not counted. ``pinned``: the ponger on CPU 0,
    this process on CPU 1 (restored after)."""
    import zmq

    affinity = os.sched_getaffinity(0)
    if pinned:
        os.sched_setaffinity(0, {1})
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.bind(endpoint or f"ipc://{tempfile.gettempdir()}/lbperf-{uuid.uuid4().hex[:8]}")
    proc = mp.get_context("spawn").Process(
        target=zmq_ponger, args=(sock.getsockopt_string(zmq.LAST_ENDPOINT), count + warmup, 0 if pinned else None)
    )
    proc.start()
    message = bytes(32)
    rtts = []
    perf = time.perf_counter_ns
    for i in range(count + warmup):
        start = perf()
        sock.send(message)
        sock.recv()
        if i >= warmup:
            rtts.append(perf() - start)
    proc.join(30)
    sock.close()
    ctx.term()
    os.sched_setaffinity(0, affinity)
    return percentiles(rtts)
