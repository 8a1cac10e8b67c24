"""Load for the jetstream relay, for its tests and benchmarks (needs the relay's ``websockets``): control-message floods: a relay process that produces live events,
flooder processes that send ``options_update`` messages as fast as TCP takes them, and an honest reader
that measures its lag.

* :func:`relay_process`: a :class:`~logbuf.jetstream.server.RelayServer` in a child process (its own
  GIL and RSS), fed by a duty that appends generated events at ``rate`` per second, each stamped with
  the wall clock when it is made (``time_us``): a loop that stops turning stops producing too.
* :func:`flood`: a child process that opens ``connections`` websocket connections spread over source
  addresses ``127.0.<k>.<n>`` (``per_address`` each), then sends one pre-masked ``options_update`` with
  ``dids`` DIDs after another on every connection, for ``seconds``, and reports how many it sent and the
  close codes and reasons it got back.
* :class:`LagMeter`: the honest client. Its lag is the age of the newest ``time_us`` it has read,
  sampled before each read (every 50 ms at most), so a client that receives nothing counts too (the
  way ``perf/jetstream_fanout.py`` measures lag).

* :func:`client_frame`: one masked websocket client frame, built by hand (a header may lie about its length).

Every wait has a timeout; the child processes are killed in ``finally``.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing as mp
import os
import random
import resource
import selectors
import socket
import string
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from websockets.sync.client import connect

WAIT_S = 30.0
UPGRADE = (
    b"GET /subscribe?requireHello=true HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
_MASK = b"\x9a\x1f\x77\x03"


def raise_nofile(want: int) -> None:
    """Raise this process's open-files soft limit towards ``want`` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def options_update(dids: int, seed: int = 1) -> bytes:
    """An ``options_update`` text message with ``dids`` distinct, valid did:plc DIDs (~36 bytes each)."""
    rng = random.Random(seed)
    alphabet = string.ascii_lowercase + "234567"
    wanted = ["did:plc:" + "".join(rng.choice(alphabet) for _ in range(24)) for _ in range(dids)]
    payload = {"wantedCollections": ["app.bsky.feed.post"], "wantedDids": wanted}
    return json.dumps({"type": "options_update", "payload": payload}, separators=(",", ":")).encode()


def masked_text_frame(payload: bytes) -> bytes:
    """One final, masked client text frame carrying ``payload`` (a fixed masking key: it is sent many times)."""
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x81, 0x80 | n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", 0x81, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
    key = int.from_bytes(_MASK * ((n + 3) // 4), "big") >> (8 * (-n % 4))
    return header + _MASK + (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")


# -- the relay ----------------------------------------------------------------------------------------------


def _serve(conn: Connection, data_dir: str, rate: float, overrides: dict[str, Any], package: str, path: str) -> None:
    if path:
        sys.path.insert(0, path)
    from logbuf.logging_config import configure_logging

    events = importlib.import_module(f"{package}.events")
    generator_module = importlib.import_module(f"{package}.generator")
    server_module = importlib.import_module(f"{package}.server")
    configure_logging("warning")
    raise_nofile(65536)
    config = server_module.RelayConfig(data_dir=data_dir, host="127.0.0.1", port=0, metrics_port=0, **overrides)
    server = server_module.RelayServer(config)
    parse_event = events.parse_event
    EventGenerator = generator_module.EventGenerator  # noqa: N806 - a class
    generator = EventGenerator(11)
    interval_ns = int(1e9 / rate)
    due = [time.monotonic_ns(), 0]  # next event due (monotonic), last time_us

    def produce() -> int:
        now = time.monotonic_ns()
        made = 0
        while due[0] <= now and made < 64:
            time_us = max(time.time_ns() // 1000, due[1] + 1)
            raw = generator.make_event(time_us)
            server.append(raw, parse_event(raw))
            due[0] += interval_ns
            due[1] = time_us
            made += 1
        if now - due[0] > 1_000_000_000:  # a stalled loop does not owe a backlog of events
            due[0] = now
        return made

    server.add_duty(produce)
    thread = server.start()
    conn.send((server.address, server.metrics_address))
    conn.poll(600)
    server.stop()
    thread.join(WAIT_S)


@dataclass
class RelayProcess:
    pid: int
    address: tuple[str, int]
    metrics_address: tuple[str, int]

    def url(self, query: str = "") -> str:
        host, port = self.address
        return f"ws://{host}:{port}/subscribe" + (f"?{query}" if query else "")

    def metrics(self, timeout_s: float = 5.0) -> str:
        """One scrape of ``/metrics`` (raises on a timeout)."""
        host, port = self.metrics_address
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:80]
        return body.decode()


@contextmanager
def relay_process(
    data_dir: str, rate: float = 200.0, *, package: str = "logbuf.jetstream", path: str = "", **overrides: Any
) -> Iterator[RelayProcess]:
    """A relay in a child process producing ``rate`` events/s. ``package`` / ``path``: the relay code to run
    (another copy of the jetstream package, importable from ``path``: perf/relay_flood.py's baseline)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, data_dir, rate, overrides, package, path), daemon=True)
    proc.start()
    try:
        assert parent.poll(WAIT_S), "relay process did not start"
        address, metrics_address = parent.recv()
        assert proc.pid is not None
        yield RelayProcess(proc.pid, tuple(address), tuple(metrics_address))
    finally:
        try:
            parent.send("stop")
        except OSError:
            pass
        proc.join(WAIT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(WAIT_S)


# -- flooders -----------------------------------------------------------------------------------------------


@dataclass
class FloodReport:
    connected: int = 0
    refused: int = 0  # upgrade answered with something other than 101, or the connect failed
    messages_sent: float = 0.0  # whole and partial messages written
    closes: Counter[str] = field(default_factory=Counter)  # "code reason" of each close frame received
    eof_without_close: int = 0


def _close_label(data: bytes) -> str | None:
    """The close frame's "code reason" if ``data`` (what the server sent after the 101) holds one."""
    i = 0
    while i + 2 <= len(data):
        opcode, len7 = data[i] & 0x0F, data[i + 1] & 0x7F
        start = i + 2 + (2 if len7 == 126 else 8 if len7 == 127 else 0)
        if len7 == 126:
            length = int.from_bytes(data[i + 2 : i + 4], "big")
        elif len7 == 127:
            length = int.from_bytes(data[i + 2 : i + 10], "big")
        else:
            length = len7
        if start + length > len(data):
            return None
        if opcode == 0x8:
            body = data[start : start + length]
            code = int.from_bytes(body[:2], "big") if len(body) >= 2 else 1005
            return f"{code} {body[2:].decode(errors='replace')}"
        i = start + length
    return None


def _flood(
    conn: Connection, address: tuple[str, int], connections: int, per_address: int, dids: int, seconds: float
) -> None:
    raise_nofile(connections + 256)
    frame = masked_text_frame(options_update(dids))
    report = FloodReport()
    socks: list[socket.socket] = []
    for i in range(connections):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(WAIT_S)
        try:
            sock.bind((f"127.0.{1 + i // per_address // 250}.{1 + i // per_address % 250}", 0))
            sock.connect(address)
            sock.sendall(UPGRADE)
        except OSError:
            report.refused += 1
            sock.close()
            continue
        socks.append(sock)
    selector = selectors.DefaultSelector()
    inbox: dict[socket.socket, bytes] = {}
    for sock in socks:
        head = b""
        try:
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                head += chunk
        except OSError:
            head = b""
        if not head.startswith(b"HTTP/1.1 101"):
            report.refused += 1
            sock.close()
            continue
        report.connected += 1
        sock.setblocking(False)
        inbox[sock] = head.partition(b"\r\n\r\n")[2]
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, 0)
    conn.send("flooding")
    offsets = dict.fromkeys(inbox, 0)
    sent_bytes = 0
    end = time.monotonic() + seconds
    while offsets and time.monotonic() < end:
        for key, mask in selector.select(0.05):
            fileobj = key.fileobj
            assert isinstance(fileobj, socket.socket)
            sock = fileobj
            if mask & selectors.EVENT_READ:
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    data = None
                except OSError:
                    data = b""
                if data is not None:
                    if len(inbox[sock]) < 1 << 20:  # only pongs and a close frame come (requireHello)
                        inbox[sock] += data
                    label = _close_label(inbox[sock])
                    if label is not None or not data:
                        if label is not None:
                            report.closes[label] += 1
                        else:
                            report.eof_without_close += 1
                        selector.unregister(sock)
                        offsets.pop(sock, None)
                        sock.close()
                        continue
            if mask & selectors.EVENT_WRITE and sock in offsets:
                offset = offsets[sock]
                try:
                    n = sock.send(memoryview(frame)[offset:])
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    report.eof_without_close += 1
                    selector.unregister(sock)
                    offsets.pop(sock, None)
                    sock.close()
                    continue
                sent_bytes += n
                offsets[sock] = (offset + n) % len(frame)
    report.messages_sent = sent_bytes / len(frame)
    for sock in offsets:
        sock.close()
    conn.send(report)


@contextmanager
def flood(
    relay: RelayProcess, connections: int, *, per_address: int = 20, dids: int = 10_000, seconds: float = 6.0
) -> Iterator[Connection]:
    """Start a flooder process; yields its pipe: ``recv()`` gives "flooding" once every connection is upgraded
    (or refused), then the :class:`FloodReport` after ``seconds``."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_flood, args=(child, relay.address, connections, per_address, dids, seconds), daemon=True)
    proc.start()
    try:
        yield parent
    finally:
        proc.join(seconds + WAIT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(WAIT_S)


def scrape_during(relay: RelayProcess, flooders: Connection, timeout_s: float = 2.0) -> tuple[list[float], float]:
    """Scrape ``/metrics`` every 0.5 s until the flooders report (read the report next): each scrape's
    seconds (``inf``: no 200 answer within ``timeout_s``), and how long the flood lasted."""
    started = time.monotonic()
    scrapes: list[float] = []
    while True:  # at least one scrape: on an idle machine the flood can be over within the first 0.5 s
        t0 = time.monotonic()
        try:
            relay.metrics(timeout_s=timeout_s)
        except (OSError, AssertionError):
            scrapes.append(float("inf"))
        else:
            scrapes.append(time.monotonic() - t0)
        if flooders.poll(0.5):
            return scrapes, time.monotonic() - started


# -- the honest client -------------------------------------------------------------------------------------


class LagMeter:
    """An honest live client on its own thread: lag samples (seconds) and the events it read."""

    def __init__(self, url: str) -> None:
        self.samples: list[tuple[float, float]] = []  # (monotonic time, lag in microseconds)
        self.events = 0
        self.newest_us = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url,), name="lag-meter", daemon=True)
        self._thread.start()

    def _run(self, url: str) -> None:
        try:
            with connect(url, open_timeout=WAIT_S, close_timeout=2, max_size=None) as ws:
                while not self._stop.is_set():
                    if self.newest_us:
                        self.samples.append((time.monotonic(), time.time_ns() / 1e3 - self.newest_us))
                    try:
                        message = ws.recv(timeout=0.05)
                    except TimeoutError:
                        continue
                    self.newest_us = max(self.newest_us, int(json.loads(message)["time_us"]))
                    self.events += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def lags_s(self, since: float) -> list[float]:
        """The lag samples taken since ``since`` (monotonic), in seconds, sorted."""
        return sorted(lag / 1e6 for t, lag in self.samples if t >= since)

    def max_lag_s(self, since: float) -> float:
        return max(self.lags_s(since), default=float("inf"))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def client_frame(opcode: int, payload: bytes, *, fin: bool = True, declared: int | None = None) -> bytes:
    """A masked client frame; ``declared``: the length its header claims (default: the payload's)."""
    length = len(payload) if declared is None else declared
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        header = struct.pack("!BB", first, 0x80 | length)
    elif length < 1 << 16:
        header = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", first, 0x80 | 127, length)
    mask = os.urandom(4)
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
