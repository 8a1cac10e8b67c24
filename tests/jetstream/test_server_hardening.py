"""Relay hardening (issue 14, items 16-17): one connection's trouble never ends the relay, and what
clients send is bounded in memory per connection and in total."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path

from tests.jetstream._relay_support import (
    BASE_US,
    RelayHandle,
    make_events,
    recv_events,
    running_relay,
    wait_for,
)

UPGRADE = (
    "GET /subscribe{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


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
        wait_for(lambda: relay.server.counters.handshakes["invalid_http"] >= 2, what="both refused")
        still_serves(relay, BASE_US)
