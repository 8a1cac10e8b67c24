"""Relay system test: a client that never reads does not hold the others back, is dropped once its
cursor falls behind retention, and what it was sent is whole frames of real events (never zeros)."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

from websockets.frames import Frame, Opcode

from logbuf.testing import wait_until
from tests.jetstream._relay_support import BASE_US, make_events, recv_events, running_relay

STEP_US = 100


def parse_frames(data: bytes) -> tuple[list[bytes], bytes, int | None]:
    """Whole text-frame payloads, the trailing partial frame's bytes, and a close code if one came."""
    payloads: list[bytes] = []
    i = 0
    while i < len(data):
        if i + 2 > len(data):
            return payloads, data[i:], None
        b0, b1 = data[i], data[i + 1]
        assert b1 & 0x80 == 0, "server frames are unmasked"
        length, header = b1 & 0x7F, 2
        if length == 126:
            if i + 4 > len(data):
                return payloads, data[i:], None
            length, header = int.from_bytes(data[i + 2 : i + 4], "big"), 4
        assert length != 127, "events here are short"
        if i + header + length > len(data):
            assert b0 == 0x81, f"partial frame with first byte {b0:#x}"
            return payloads, data[i:], None
        payload = data[i + header : i + header + length]
        if b0 == 0x88:
            return payloads, b"", int.from_bytes(payload[:2], "big")
        assert b0 == 0x81, f"frame {len(payloads)} starts with {b0:#x}: not a text frame (zeros?)"
        payloads.append(payload)
        i += header + length
    return payloads, b"", None


def test_a_client_that_never_reads_slows_no_one_and_is_dropped_behind_retention(tmp_path: Path) -> None:
    total = 12_000
    events = make_events(total, step_us=STEP_US)  # about 6 MB of frames
    with running_relay(
        str(tmp_path),
        retention_ns=None,
        retention_bytes=1_000_000,
        retention_check_ns=50_000_000,
        write_timeout_ns=0,
        flush_interval_ns=2_000_000,
        max_events_per_ip_s=0,  # 12,000 events at once to one address: not what this test is about
    ) as relay:
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.settimeout(10)
        slow.connect((relay.host, relay.port))
        slow.sendall(
            b"GET /subscribe HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += slow.recv(1)
        assert head.startswith(b"HTTP/1.1 101")
        with relay.connect() as fast:
            got: list[int] = []

            def read_fast() -> None:
                got.extend(e["time_us"] for e in recv_events(fast, total, timeout_s=30))

            reader = threading.Thread(target=read_fast)
            reader.start()
            for i in range(0, total, 500):
                relay.append(events[i : i + 500])
                time.sleep(0.01)  # pace: the feed's rate, 500 events per 10 ms
            reader.join(35)  # recv_events gives up after 30 s: the slow client must not hold the fast one back
            assert got == [BASE_US + STEP_US * i for i in range(total)]
            wait_until(lambda: relay.server.counters.clients_dropped["behind_retention"] == 1, what="the drop")
        data = b""
        while True:  # the slow client reads at last: until EOF
            try:
                chunk = slow.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
        slow.close()
    payloads, partial, close_code = parse_frames(data)
    assert 0 < len(payloads) < total
    assert payloads == events[: len(payloads)]  # a gapless prefix of the real events
    if partial:
        expected = Frame(Opcode.TEXT, events[len(payloads)]).serialize(mask=False)
        assert expected.startswith(partial)  # cut mid-frame by the close, never zero-filled
    assert close_code in (None, 1008)
    assert all(json.loads(p)["time_us"] >= BASE_US for p in payloads)


def test_a_client_whose_socket_takes_nothing_is_dropped_after_the_write_timeout(tmp_path: Path) -> None:
    events = make_events(12_000, step_us=STEP_US)
    with running_relay(
        str(tmp_path), write_timeout_ns=300_000_000, flush_interval_ns=2_000_000, max_events_per_ip_s=0
    ) as relay:
        with socket.socket() as slow:
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            slow.settimeout(10)
            slow.connect((relay.host, relay.port))
            slow.sendall(
                b"GET /subscribe?cursor=0 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            relay.append(events)
            wait_until(lambda: relay.server.counters.clients_dropped["write_timeout"] == 1, what="the drop")
            with relay.connect({"cursor": 0}) as fast:  # everything is still there for others
                assert len(recv_events(fast, len(events), timeout_s=20)) == len(events)
