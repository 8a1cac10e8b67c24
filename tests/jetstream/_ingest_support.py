"""Support for the ingest and CLI tests: a media driver process, a stand-in upstream jetstream,
and a stream reader.

The stand-in upstream is an external service's double, not a mock of our parts: a real
``websockets`` server on 127.0.0.1 that speaks the v1 ``/subscribe`` contract the ingest relies on
(``cursor`` inclusive in µs; text frames of event JSON) over a fixed list of events. Without a
cursor it starts at the first event (as if the list were the live feed from then on). It can be
killed (connections aborted without a close frame, listener closed) and started again on the
same port, possibly with a different list (another instance that stamped the same events with a
different clock).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from logbuf.client import Aeron, Context, FragmentAssembler
from logbuf.jetstream.generator import EventGenerator
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet, quick_timeout_args, unique_dir

DRIVER_ARGS = quick_timeout_args()


def big_event(time_us: int, text_length: int) -> bytes:
    """A commit event whose post's text is ``text_length`` bytes: longer than the MTU (fragmented in the
    stream), or than the stream's largest message when ``text_length`` is large enough."""
    return json.dumps(
        {
            "did": "did:plc:abcdefghijklmnopqrstuvwx",
            "time_us": time_us,
            "kind": "commit",
            "commit": {
                "rev": "3l3qo2vutsw2b",
                "operation": "create",
                "collection": "app.bsky.feed.post",
                "rkey": "3l3qo2vuowo2b",
                "record": {"text": "x" * text_length},
                "cid": "bafyrei" + "a" * 52,
            },
        },
        separators=(",", ":"),
    ).encode()


@contextmanager
def driver_process(args: list[str] | None = None) -> Iterator[DriverProcess]:
    """A real media driver process in a fresh directory; its error log must stay empty (the kit's
    :class:`~logbuf.testing.driver_process.DriverSet` checks it, and reports on failure)."""
    drivers = DriverSet()
    failed = False
    try:
        yield drivers(base=DRIVER_ARGS if args is None else args)
    except BaseException:
        failed = True
        raise
    finally:
        drivers.close(failed=failed)


def unique_driver_dir() -> str:
    return unique_dir()


def make_events(count: int, *, seed: int = 7, start_us: int | None = None, step_us: int = 1000) -> list[bytes]:
    """``count`` generated events stamped ``start_us``, ``start_us + step_us``, ..."""
    gen = EventGenerator(seed)
    start = start_us if start_us is not None else time.time_ns() // 1000 - 3_600_000_000
    return [gen.make_event(start + i * step_us) for i in range(count)]


def time_us_of(raw: bytes) -> int:
    return int(json.loads(raw)["time_us"])


def without_time_us(raw: bytes) -> dict[str, Any]:
    obj = json.loads(raw)
    del obj["time_us"]
    return obj  # type: ignore[no-any-return]


class UpstreamStandIn:
    """A jetstream v1 ``/subscribe`` server over a fixed list of events, on its own thread."""

    def __init__(self, events: list[bytes], *, rate: float = 5000.0, port: int = 0) -> None:
        self.events = events
        self.times = [time_us_of(e) for e in events]
        self.rate = rate
        self.port = port
        self.requests: list[str] = []
        self.sent = 0
        self.close_codes: list[int | None] = []  # each connection's close code from the relay (None: none)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self) -> UpstreamStandIn:
        ready = threading.Event()
        self._stopped.clear()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            async with serve(
                self._handler, "127.0.0.1", self.port, process_request=self._check_path, compression=None
            ) as server:
                self._server = server
                self.port = server.sockets[0].getsockname()[1]
                ready.set()
                await server.wait_closed()

        self._thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        self._thread.start()
        assert ready.wait(10), "stand-in upstream did not start"
        return self

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/subscribe"

    def _check_path(self, connection: ServerConnection, request: Request) -> Response | None:
        self.requests.append(request.path)
        if urllib.parse.urlsplit(request.path).path != "/subscribe":
            return connection.respond(404, "not found\n")
        return None

    async def _handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(ws.request.path).query)
        start = 0
        if "cursor" in query:
            start = bisect.bisect_left(self.times, int(query["cursor"][0]))  # inclusive, like jetstream
        batch = max(1, int(self.rate / 100))
        try:
            for i in range(start, len(self.events), batch):
                for raw in self.events[i : i + batch]:
                    await ws.send(raw.decode())
                    self.sent += 1
                await asyncio.sleep(batch / self.rate)
            await ws.wait_closed()  # live tail with nothing new
        except ConnectionClosed:
            pass
        rcvd = ws.protocol.close_rcvd
        self.close_codes.append(None if rcvd is None else rcvd.code)

    def kill(self) -> None:
        """Abort every connection (no close frame, as a crash) and stop listening."""
        loop, server = self._loop, self._server
        assert loop is not None and server is not None

        def abort() -> None:
            for connection in list(server.connections):
                connection.transport.abort()
            server.close(close_connections=False)

        loop.call_soon_threadsafe(abort)
        if self._thread is not None:
            self._thread.join(10)
            assert not self._thread.is_alive(), "stand-in upstream did not stop"


class TcpProxy:
    """A TCP forwarder on 127.0.0.1 that can cut every connection (a network drop) and come back."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        self.port = port
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._transports: list[asyncio.WriteTransport] = []
        self._thread: threading.Thread | None = None

    def start(self) -> TcpProxy:
        ready = threading.Event()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._server = await asyncio.start_server(self._on_client, "127.0.0.1", self.port)
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            try:
                await self._server.serve_forever()
            except asyncio.CancelledError:
                pass

        self._thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        self._thread.start()
        assert ready.wait(10), "proxy did not start"
        return self

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._transports += [writer.transport, up_writer.transport]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except asyncio.CancelledError:
            pass

    def cut(self) -> None:
        """Abort every forwarded connection (no close frames) and stop listening."""
        loop, server = self._loop, self._server
        assert loop is not None and server is not None

        def abort() -> None:
            for transport in self._transports:
                transport.abort()
            server.close()
            for task in asyncio.all_tasks(loop):
                task.cancel()

        loop.call_soon_threadsafe(abort)
        if self._thread is not None:
            self._thread.join(10)
            assert not self._thread.is_alive(), "proxy did not stop"


async def read_events(
    url: str, *, until_time_us: int, count: int | None = None, timeout_s: float = 20.0
) -> list[bytes]:
    """Events from a jetstream ``/subscribe`` URL up to the first with time_us >= ``until_time_us``
    (or ``count`` events)."""
    from websockets.asyncio.client import connect

    events: list[bytes] = []
    async with asyncio.timeout(timeout_s):
        # max_queue=None: websockets stops reading once 16 messages wait unread and close() does not resume,
        # so leaving mid-stream would wait out close_timeout for a close frame already sent (test_server_close).
        async with connect(url, compression=None, max_size=None, max_queue=None) as ws:
            while True:
                message = await ws.recv()
                raw = message.encode() if isinstance(message, str) else message
                events.append(raw)
                if count is not None and len(events) >= count:
                    return events
                if count is None and time_us_of(raw) >= until_time_us:
                    return events


class StreamReader:
    """Reads (bytes, reserved_value) messages from a stream through a driver on a background thread."""

    def __init__(self, directory: str, channel: str, stream_id: int) -> None:
        self.aeron = Aeron.connect(Context(dir=directory, driver_timeout_ns=3_000_000_000))
        self.subscription = self.aeron.add_subscription(channel, stream_id)
        self.messages: list[tuple[bytes, int]] = []
        self.paused = threading.Event()
        self._stop = threading.Event()
        self._assembler = FragmentAssembler(self._on_message)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_message(self, buffer: memoryview, header: Any) -> None:
        self.messages.append((bytes(buffer), header.reserved_value))

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.paused.is_set() or self.subscription.poll(self._assembler, 256) == 0:
                time.sleep(0.0005)  # pace: idle while paused or between empty polls

    def wait_for(self, count: int, timeout_s: float = 20.0) -> list[tuple[bytes, int]]:
        wait_until(lambda: len(self.messages) >= count, timeout_s, f"{count} messages (have {len(self.messages)})")
        return self.messages

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.subscription.close()
        self.aeron.close()


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RelayProcess:
    """``python -m logbuf.jetstream.main ARGS`` with its JSON log lines (stderr) collected on a thread."""

    def __init__(self, args: list[str]) -> None:
        if "--metrics-port" not in args:  # jetstream's 6009 may be taken by another relay on this machine
            args = [*args, "--metrics-port", "0"]
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "logbuf.jetstream.main", *args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.lines: list[str] = []
        self.log: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            text = line.decode(errors="replace").rstrip("\n")
            self.lines.append(text)
            try:
                self.log.append(json.loads(text))
            except ValueError:
                pass

    def wait_for_log(self, event: str, timeout_s: float = 20.0) -> dict[str, Any]:
        def found() -> bool:
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(
                    f"relay exited ({self.proc.returncode}) before {event!r}:\n" + "\n".join(self.lines)
                )
            return any(entry.get("event") == event for entry in self.log)

        wait_until(found, timeout_s, f"log event {event!r}")
        return next(entry for entry in self.log if entry.get("event") == event)

    def port(self, timeout_s: float = 20.0) -> int:
        return int(self.wait_for_log("jetstream.listening", timeout_s)["port"])

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError("relay did not stop on SIGTERM:\n" + "\n".join(self.lines)) from None
        finally:
            self._close_pipe()
        return self.proc.returncode

    def _close_pipe(self) -> None:
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def kill(self) -> None:
        """Cleanup: SIGTERM (SIGKILL after 10 s); then remove the embedded driver's directory if left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._close_pipe()
        if "external" not in self.args and "--driver-dir" in self.args:
            shutil.rmtree(self.args[self.args.index("--driver-dir") + 1], ignore_errors=True)


__all__ = [
    "DRIVER_ARGS",
    "big_event",
    "TcpProxy",
    "read_events",
    "unique_driver_dir",
    "RelayProcess",
    "StreamReader",
    "UpstreamStandIn",
    "driver_process",
    "make_events",
    "time_us_of",
    "without_time_us",
]
