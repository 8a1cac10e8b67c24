"""Relay hardening: one connection's trouble never ends the relay, and what
clients send is bounded in memory per connection and in total."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from logbuf.jetstream.limits import FrameMeter
from logbuf.jetstream.server import DEFAULT_MAX_CLIENT_MESSAGE_LENGTH
from logbuf.testing import wait_until
from logbuf.testing.relay_flood import client_frame
from tests.jetstream._relay_support import BASE_US, RelayHandle, make_events, recv_events, running_relay

UPGRADE = (
    "GET /subscribe{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def read_until_closed(sock: socket.socket, timeout_s: float = 10.0) -> bytes:
    sock.settimeout(timeout_s)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def raw_connection(relay: RelayHandle) -> socket.socket:
    return socket.create_connection((relay.host, relay.port), timeout=10)


def still_serves(relay: RelayHandle, start_us: int) -> None:
    relay.append(make_events(3, start_us=start_us))
    with relay.connect({"cursor": start_us}) as ws:
        assert [e["time_us"] for e in recv_events(ws, 3)] == [start_us, start_us + 1000, start_us + 2000]


def test_pipelined_requests_get_one_answer_and_the_relay_stays_up(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        with raw_connection(relay) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"Welcome to Jetstream")
        assert answer.count(b"HTTP/1.1") == 1  # one request per connection: the second is not answered
        still_serves(relay, BASE_US)
        assert not relay.server.counters.connection_errors


def test_frames_right_behind_the_upgrade_request_are_read_after_it(tmp_path: Path) -> None:
    hello = json.dumps({"type": "options_update", "payload": {"wantedCollections": ["app.bsky.feed.like"]}})
    events = make_events(50)
    likes = [json.loads(e)["time_us"] for e in events if b'"app.bsky.feed.like"' in e]
    assert likes
    with running_relay(str(tmp_path)) as relay:
        relay.append(events)
        with raw_connection(relay) as sock:
            request = UPGRADE.format(query="?requireHello=true&cursor=0").encode()
            sock.sendall(request + client_frame(0x1, hello.encode()))  # one packet: request and hello
            sock.settimeout(10)
            data = b""
            deadline = time.monotonic() + 10
            while data.count(b'"time_us"') < len(likes) and time.monotonic() < deadline:
                data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 101")
        got = [int(x.split(b",")[0]) for x in data.split(b'"time_us":')[1:]]
        assert got == likes


def test_a_request_head_over_the_cap_gets_431(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        with raw_connection(relay) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"y" * 4000) for i in range(10)))
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 431") and answer.endswith(b"request head too large")
        assert relay.server.counters.handshakes["head_too_large"] == 1
        still_serves(relay, BASE_US)


def test_garbage_instead_of_http_closes_that_connection_only(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        for garbage in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64) + b"\r\n\r\n", b"GET\r\n\r\n"):
            with raw_connection(relay) as sock:
                sock.sendall(garbage)
                read_until_closed(sock)
        wait_until(lambda: relay.server.counters.handshakes["invalid_http"] >= 2, what="both refused")
        still_serves(relay, BASE_US)


# -- incoming frames: FrameMeter (declared lengths) and the relay's bounds ------------------

METER_CASES = [
    # (frames, declared length of the message in progress after all of them)
    ([client_frame(0x1, b"hi")], 0),  # a whole small message: done
    ([client_frame(0x1, b"x" * 300)], 0),  # 16-bit length
    ([client_frame(0x2, b"x" * 70_000)], 0),  # 64-bit length
    ([client_frame(0x1, b"ab", fin=False)], 2),  # first fragment of a message
    ([client_frame(0x1, b"ab", fin=False), client_frame(0x9, b"ping"), client_frame(0x0, b"cd", fin=False)], 4),
    ([client_frame(0x1, b"ab", fin=False), client_frame(0x0, b"cd")], 0),  # completed by its final fragment
    ([client_frame(0x1, b"", fin=True)], 0),
    ([client_frame(0x1, b"xyz", declared=9_900_000)[:20]], 9_900_000),  # declared, barely started
    ([client_frame(0x8, b"\x03\xe8")], 0),  # control frames are not counted
]


@pytest.mark.parametrize("frames, expected", METER_CASES)
def test_frame_meter_reads_declared_lengths_whole_and_byte_by_byte(frames: list[bytes], expected: int) -> None:
    data = b"".join(frames)
    whole = FrameMeter()
    whole.feed(data)
    assert whole.message_length == expected
    split = FrameMeter()
    for i in range(len(data)):
        split.feed(data[i : i + 1])
    assert split.message_length == expected


def test_frame_meter_reports_a_declaration_as_soon_as_its_header_is_complete() -> None:
    frame = client_frame(0x2, b"", declared=5_000_000)  # header only: 2 + 8 + 4 bytes
    meter = FrameMeter()
    assert meter.feed(frame[:13]) == 0  # one byte short of the header
    assert meter.feed(frame[13:]) == 5_000_000
    assert meter.feed(bytes(1000)) == 5_000_000
    whole = FrameMeter()
    assert whole.feed(client_frame(0x1, b"done") + client_frame(0x1, b"tail")) == 4  # peak inside the data
    assert whole.message_length == 0


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def upgraded(relay: RelayHandle, source_ip: str) -> socket.socket:
    sock = socket.create_connection((relay.host, relay.port), timeout=10, source_address=(source_ip, 0))
    sock.sendall(UPGRADE.format(query="").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "closed during the handshake"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101")
    return sock


def close_code(sock: socket.socket) -> int | None:
    """The code of the first close frame the relay sent (None: closed without one)."""
    data = read_until_closed(sock)
    i = data.find(b"\x88")
    return int.from_bytes(data[i + 2 : i + 4], "big") if i >= 0 and len(data) >= i + 4 else None


def test_unfinished_large_frames_are_refused_with_1009_before_they_are_buffered(tmp_path: Path) -> None:
    """100 connections from two addresses each declare a 9.9 MB message and send 2 MB of it (the attack's
    attack took the relay from 114 MB to 1.08 GB): with jetstream's 10 MB cap allowed, only what fits the
    total budget is accepted; every other connection gets 1009 at once and its bytes are never kept."""
    declared = 9_900_000
    budget = 32 * 1024 * 1024
    with running_relay(
        str(tmp_path), max_client_message_length=10_000_000, max_incoming_bytes=budget, max_connections_per_ip=100
    ) as relay:
        socks = [upgraded(relay, ip) for ip in ("127.0.0.1", "127.0.0.2") for _ in range(50)]
        before = rss_bytes()
        payload = b"x" * (2 * 1024 * 1024)
        refused = 0
        try:
            for sock in socks:
                try:
                    sock.sendall(client_frame(0x1, b"", declared=declared) + payload)
                except (BrokenPipeError, ConnectionResetError):
                    refused += 1
            counters = relay.server.counters
            fits = budget // declared
            wait_until(lambda: counters.clients_dropped["incoming_full"] == len(socks) - fits, what="refusals")
            assert relay.on_loop(lambda: relay.server._incoming_reserved) == fits * declared
            grown = rss_bytes() - before
            assert grown < 64 * 1024 * 1024, f"relay grew by {grown} bytes"
        finally:
            for sock in socks:
                sock.close()
        wait_until(lambda: relay.on_loop(lambda: relay.server._incoming_reserved) == 0, what="reservations released")
        still_serves(relay, BASE_US)


def test_a_declared_length_over_the_message_cap_closes_with_1009_at_once(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        with upgraded(relay, "127.0.0.1") as sock:
            sock.sendall(client_frame(0x1, b"", declared=DEFAULT_MAX_CLIENT_MESSAGE_LENGTH + 1))  # header only
            assert close_code(sock) == 1009
        assert relay.server.counters.clients_dropped["message_too_big"] == 1


def test_a_message_that_never_finishes_is_closed_with_1008(tmp_path: Path) -> None:
    with running_relay(str(tmp_path), client_message_timeout_ns=300_000_000) as relay:
        with upgraded(relay, "127.0.0.1") as sock:
            sock.sendall(client_frame(0x1, b"", declared=1000) + b"x" * 10)
            assert close_code(sock) == 1008
        assert relay.server.counters.clients_dropped["client_message_timeout"] == 1
        assert relay.on_loop(lambda: relay.server._incoming_reserved) == 0
