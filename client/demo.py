"""The main job: a media driver, a publisher and a subscriber, with live rates from the counters.

    logbuf-demo                    # 10 s, 32-byte messages, per-message offer
    logbuf-demo --seconds 30 --size 512 --batch 16

Starts ``mediadriver`` in a fresh directory, a publisher process and a subscriber process (both
clients of the driver, on ``aeron:ipc`` stream 1001), and shows ``logbuf-stat``'s live view of
that driver until the time is up or Ctrl-C; then stops everything and checks that the subscriber
received every message the publisher offered, in order. Exit status 1 if anything was lost.

The summary gives payload rates (messages times their size) beside the log's rate: each message
is a frame with a 32-byte header, aligned to 32 bytes, which is what the live view's positions and
bytes/s count (a 32-byte message takes 64 bytes of log).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import structlog

from logbuf.logging_config import configure_logging

STREAM_ID = 1001
CHANNEL = "aeron:ipc"
SEQ = struct.Struct("<q")


def _ignore_interrupts() -> None:
    """Ctrl-C is the demo's to handle: it stops the children itself, in order."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _publisher(directory: str, size: int, batch: int, stop: Any, out: Any) -> None:
    _ignore_interrupts()
    configure_logging("warning")
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_publication(CHANNEL, STREAM_ID)
        while not pub.is_connected and not stop.is_set():
            time.sleep(0.001)
        out.put("connected")  # the demo's clock starts here, not when this process was spawned
        started = time.monotonic()
        start_position = pub.position
        seq = 0
        messages = [bytearray(size) for _ in range(batch)]
        while not stop.is_set():
            for _ in range(256):
                for m in messages:
                    SEQ.pack_into(m, 0, seq)
                    seq += 1
                result = pub.offer_batch(messages) if batch > 1 else pub.offer(messages[0])
                if result < 0:
                    seq -= batch
                    time.sleep(0)
        out.put((seq, time.monotonic() - started, pub.position - start_position))


def _subscriber(directory: str, stop: Any, out: Any) -> None:
    _ignore_interrupts()
    configure_logging("warning")
    from logbuf.client import Aeron, Context

    expected = 0
    out_of_order = 0

    def on_fragment(buffer: memoryview, header: Any) -> None:
        nonlocal expected, out_of_order
        if SEQ.unpack_from(buffer)[0] != expected:
            out_of_order += 1
        expected += 1

    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription(CHANNEL, STREAM_ID)
        out.put("ready")
        idle_since = time.monotonic()
        while True:
            if sub.poll(on_fragment, 4096):
                idle_since = time.monotonic()
            elif stop.is_set() and time.monotonic() - idle_since > 0.5:
                break
        out.put((expected, out_of_order))


def _wait_for_connected(pub_out: Any, interrupt: threading.Event, timeout_s: float = 60.0) -> None:
    """Wait until the publisher is connected (on a loaded machine its process takes seconds to start and map
    the log), so that ``--seconds`` counts publishing time, not start-up."""
    deadline = time.monotonic() + timeout_s
    while not interrupt.is_set():
        try:
            if pub_out.get(timeout=0.1) == "connected":
                return
        except queue.Empty:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the publisher was not connected within {timeout_s:.0f} s") from None


def _publisher_result(pub_out: Any) -> tuple[int, float, int]:
    """The publisher's (published, seconds, log bytes); a "connected" it sent after an interrupt is passed over."""
    while (item := pub_out.get(timeout=30)) == "connected":
        pass
    return item  # type: ignore[no-any-return]


def _show_live_view(directory: str, seconds: float, interrupt: threading.Event) -> None:
    """``logbuf-stat``'s live view of the driver, until ``seconds`` have passed or ``interrupt`` is set."""
    from rich.live import Live

    from logbuf.client.stat import StatReader, render

    deadline = time.monotonic() + seconds
    with StatReader(directory) as reader:
        with Live(render(reader.sample()), refresh_per_second=4, screen=False) as live:
            while (left := deadline - time.monotonic()) > 0 and not interrupt.wait(min(1.0, left)):
                live.update(render(reader.sample()))
            live.update(render(reader.sample()))
        if not live.console.is_terminal:
            live.console.line()  # the final render ends without a newline when not on a terminal


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="logbuf-demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to run (default 10)")
    parser.add_argument("--size", type=int, default=32, help="message length in bytes (>= 8, default 32)")
    parser.add_argument("--batch", type=int, default=1, help="messages per offer_batch call (1 = offer)")
    parser.add_argument("--dir", default=None, help="driver directory (default: a fresh one under /dev/shm)")
    args = parser.parse_args(argv)
    from logbuf.client.stat import require_tools_extra

    require_tools_extra("rich", "the demo's live view")
    if args.size < 8:
        parser.error(f"--size={args.size} must be at least 8 (the sequence number)")
    if args.batch < 1:
        parser.error(f"--batch={args.batch} must be at least 1")
    configure_logging()
    log = structlog.get_logger().bind(role="demo")
    directory = args.dir or f"/dev/shm/logbuf-demo-{uuid.uuid4().hex[:8]}"
    # Ctrl-C reaches every process in the terminal's group. The driver runs in a session of its own and the
    # children ignore it; here it only sets ``interrupt``, so the demo stops everything in order, without a
    # traceback, and still reports what was sent and received.
    interrupt = threading.Event()
    previous_handler = signal.signal(signal.SIGINT, lambda signum, frame: interrupt.set())
    driver = subprocess.Popen(
        [sys.executable, "-m", "logbuf.driver.main", "--dir", directory],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    pub_out: Any = ctx.Queue()
    sub_out: Any = ctx.Queue()
    procs: list[Any] = []

    def start_child(target: Any, *child_args: Any) -> None:
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited through exec: ignored from the start
        try:
            child = ctx.Process(target=target, args=child_args, daemon=True)
            child.start()
            procs.append(child)
        finally:
            signal.signal(signal.SIGINT, handler)

    try:
        from logbuf.conduit.cnc import wait_for_driver

        wait_for_driver(directory)
        log.info("demo.started", dir=directory, seconds=args.seconds, size=args.size, batch=args.batch)
        start_child(_subscriber, directory, stop, sub_out)
        if sub_out.get(timeout=30) != "ready":
            raise RuntimeError("subscriber failed to start")
        start_child(_publisher, directory, args.size, args.batch, stop, pub_out)
        _wait_for_connected(pub_out, interrupt)
        if not interrupt.is_set():
            _show_live_view(directory, args.seconds, interrupt)
        if interrupt.is_set():
            log.info("demo.interrupted")
        stop.set()
        published, elapsed_s, log_bytes = _publisher_result(pub_out)
        received, out_of_order = sub_out.get(timeout=30)
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        driver.send_signal(signal.SIGTERM)
        try:
            driver.wait(10)
        except subprocess.TimeoutExpired:
            driver.kill()
        if not args.dir:
            shutil.rmtree(directory, ignore_errors=True)
        signal.signal(signal.SIGINT, previous_handler)
    lost = published - received
    seconds = max(elapsed_s, 1e-9)
    summary = {
        "published": published,
        "received": received,
        "lost": lost,
        "out_of_order": out_of_order,
        "interrupted": interrupt.is_set(),
        "seconds": round(elapsed_s, 3),
        "msgs_per_s": received / seconds,
        "payload_mb_per_s": received * args.size / seconds / 1e6,
        "log_mb_per_s": log_bytes / seconds / 1e6,
    }
    log.info("demo.finished", **summary)
    print(
        json.dumps(summary)
        if not sys.stdout.isatty()
        else f"published {published:,}  received {received:,}  lost {lost}  out of order {out_of_order}  "
        f"in {elapsed_s:.1f} s: {summary['msgs_per_s'] / 1e6:.2f} M msgs/s, {summary['payload_mb_per_s']:.0f} MB/s "
        f"of payload ({summary['log_mb_per_s']:.0f} MB/s of log: frames with their 32-byte headers, "
        "what logbuf-stat's bytes/s counts)"
    )
    return 0 if lost == 0 and out_of_order == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
