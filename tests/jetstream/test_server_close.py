"""Relay system tests: a client closing its ``/subscribe`` connection while events keep arriving.

RFC 6455 §5.5.1 / §7.1: once the relay has the client's close frame it sends no more data frames (the
frame being written is finished), sends its close frame (echoing the code) at once, then closes the TCP
connection. The client's close therefore completes in milliseconds, in every mode: live, past cursor
(a replay backlog), future cursor, filtered, compressed, held (``requireHello``). The tests check that it
completes (the close frame comes back, the FIN follows), not how fast: waits time out after 10 s.

Note on the clients: ``websockets`` (asyncio and sync) stops reading its socket once ``max_queue``
(16) messages wait unread, and ``close()`` does not resume reading, so a client that stops consuming
mid-stream never sees the relay's close frame or its FIN and waits out its ``close_timeout`` whatever
the server does. These clients keep reading (``max_queue=None``) and wait up to 10 s for the close, so
a slow close here is the server's; the raw-socket test checks the bytes on the wire.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect as async_connect
from websockets.frames import Close, Frame, Opcode

from logbuf.jetstream.events import parse_event
from logbuf.jetstream.generator import EventGenerator
from logbuf.testing import wait_until
from tests.jetstream._relay_support import BASE_US, DICTIONARY_PATH, RelayHandle, make_events, recv_raw, running_relay

STEP_US = 1000
HISTORY = 3000  # events before the feed starts: a past cursor has a backlog to replay
CLOSE_TIMEOUT_S = 10.0  # a close must complete while events flow; waits for it time out after this
FUTURE_US = BASE_US + 10**12

# mode: (query, events to read before closing)
MODES: dict[str, tuple[dict[str, Any], int]] = {
    "live": ({}, 5),
    "past_cursor": ({"cursor": BASE_US + 100 * STEP_US}, 5),
    "future_cursor": ({"cursor": FUTURE_US}, 5),
    "filtered": ({"wantedCollections": "app.bsky.feed.like"}, 5),
    "filtered_past_cursor": ({"wantedCollections": "app.bsky.feed.post", "cursor": BASE_US}, 5),
    "compressed": ({"compress": "true"}, 5),
    "compressed_past_cursor": ({"compress": "true", "cursor": BASE_US}, 5),
    "held": ({"requireHello": "true"}, 0),
}


class Feed:
    """A duty on the relay's loop appending one generated event per millisecond of wall time."""

    def __init__(self, relay: RelayHandle) -> None:
        self.server = relay.server
        self.generator = EventGenerator(11)
        self.started_ns = time.monotonic_ns()
        self.appended = 0

    def __call__(self) -> int:
        due = min((time.monotonic_ns() - self.started_ns) // 1_000_000, self.appended + 200)
        n = 0
        while self.appended < due:
            raw = self.generator.make_event(BASE_US + (HISTORY + self.appended) * STEP_US)
            self.server.append(raw, parse_event(raw))
            self.appended += 1
            n += 1
        return n


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayHandle]:
    overrides: dict[str, Any] = {}
    if os.path.isfile(DICTIONARY_PATH):
        overrides["zstd_dictionary"] = DICTIONARY_PATH
    with running_relay(str(tmp_path_factory.mktemp("close")), **overrides) as handle:
        handle.append(make_events(HISTORY, step_us=STEP_US))
        feed = Feed(handle)
        handle.on_loop(lambda: handle.server.add_duty(feed))
        wait_until(lambda: feed.appended >= 200, what="the feed to run")
        yield handle


def query_for(relay: RelayHandle, mode: str) -> tuple[dict[str, Any], int]:
    query, count = MODES[mode]
    if query.get("compress") and not relay.server.store.compressed:
        pytest.fail(f"jetstream's zstd dictionary not found at {DICTIONARY_PATH} (LOGBUF_JETSTREAM_ZSTD_DICT)")
    return query, count


def connections(relay: RelayHandle) -> int:
    return relay.on_loop(lambda: len(relay.server._connections))


@pytest.mark.parametrize("mode", list(MODES))
def test_a_client_close_completes_promptly_while_events_flow(relay: RelayHandle, mode: str) -> None:
    query, count = query_for(relay, mode)
    wait_until(lambda: connections(relay) == 0, what="earlier connections to be gone")
    with relay.connect(query, max_queue=None, close_timeout=10) as ws:
        got = recv_raw(ws, count)
        assert all(isinstance(m, bytes if query.get("compress") else str) for m in got)
        time.sleep(0.15)  # a few flush passes: events are on their way when we close
        ws.close()  # waits up to close_timeout for the relay's close frame
    close_rcvd = ws.protocol.close_rcvd
    assert close_rcvd is not None, f"{mode}: the relay never answered the close frame"
    assert close_rcvd.code == 1000 and ws.protocol.close_rcvd_then_sent is False  # our close, echoed
    wait_until(
        lambda: connections(relay) == 0,
        timeout_s=CLOSE_TIMEOUT_S,
        what=f"{mode}: the relay to close the TCP connection",
    )


def test_asyncio_clients_in_every_mode_close_promptly_at_once(relay: RelayHandle) -> None:
    modes = [m for m in MODES if not MODES[m][0].get("compress") or relay.server.store.compressed]

    async def one(mode: str) -> float:
        query, count = MODES[mode]
        async with async_connect(relay.url(query), compression=None, max_queue=None, close_timeout=10) as ws:
            for _ in range(count):
                await ws.recv()
            await asyncio.sleep(0.15)
            await ws.close()  # waits up to close_timeout for the relay's close frame
            close_rcvd = ws.protocol.close_rcvd
            return mode if close_rcvd is not None and close_rcvd.code == 1000 else f"{mode}: {close_rcvd}"

    async def every() -> list[str]:
        async with asyncio.timeout(30):
            return await asyncio.gather(*(one(m) for m in modes))

    assert asyncio.run(every()) == modes  # every close answered with 1000
    wait_until(lambda: connections(relay) == 0, timeout_s=CLOSE_TIMEOUT_S, what="the relay to close every connection")


def read_frames(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
    """Whole frames ``(first byte, payload)`` at the start of ``data`` and the bytes they take."""
    frames: list[tuple[int, bytes]] = []
    i = 0
    while i + 2 <= len(data):
        b0, b1 = data[i], data[i + 1]
        assert b1 & 0x80 == 0, "server frames are unmasked"
        length, header = b1 & 0x7F, 2
        if length == 126:
            if i + 4 > len(data):
                break
            length, header = int.from_bytes(data[i + 2 : i + 4], "big"), 4
        elif length == 127:
            if i + 10 > len(data):
                break
            length, header = int.from_bytes(data[i + 2 : i + 10], "big"), 10
        if i + header + length > len(data):
            break
        frames.append((b0, data[i + header : i + header + length]))
        i += header + length
    return frames, i


@pytest.mark.parametrize("mode", ["live", "past_cursor", "filtered", "compressed_past_cursor"])
def test_on_the_wire_the_close_frame_is_the_last_frame_and_the_fin_follows(relay: RelayHandle, mode: str) -> None:
    query, count = query_for(relay, mode)
    data_byte = 0x82 if query.get("compress") else 0x81
    target = relay.url(query).split(f":{relay.port}", 1)[1]
    with socket.create_connection((relay.host, relay.port), timeout=10) as sock:
        sock.sendall(
            f"GET {target} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, "EOF during the handshake"
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101")
        while len(read_frames(buf)[0]) < count:
            buf += sock.recv(65536)
        close = Frame(Opcode.CLOSE, Close(1000, "bye").serialize())
        sock.sendall(close.serialize(mask=True))
        sock.settimeout(CLOSE_TIMEOUT_S)
        while True:  # until the relay's FIN (a timeout fails the test)
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
    frames, used = read_frames(buf)
    assert used == len(buf), f"{mode}: a partial frame before the FIN"
    assert frames and frames[-1][0] == 0x88, f"{mode}: the last frame is not a close frame"
    assert Close.parse(frames[-1][1]) == Close(1000, "bye"), "the close frame echoes ours"
    assert all(b0 == data_byte for b0, _ in frames[:-1]), f"{mode}: only whole event frames before the close"
    wait_until(
        lambda: connections(relay) == 0, timeout_s=CLOSE_TIMEOUT_S, what=f"{mode}: the relay to close the connection"
    )
