"""Receiver-side term algorithms: datagram checks, rebuild insertion, gap scans."""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest

from logbuf import native
from logbuf.driver import _udp
from logbuf.protocol import DataFrame, HeartbeatFrame, PadFrame, encode_datagram

TERM = 65536


def frames(*payloads: bytes, start: int = 0) -> list[DataFrame]:
    out, offset = [], start
    for payload in payloads:
        out.append(DataFrame(offset, 7, 9, 3, payload))
        offset += (32 + len(payload) + 31) // 32 * 32
    return out


def test_valid_datagrams_pass_the_check() -> None:
    assert native.check_data_datagram(encode_datagram(frames(b"a" * 10, b"b" * 40)), TERM) == 64 + 96
    assert native.check_data_datagram(HeartbeatFrame(64, 7, 9, 3).encode(), TERM) == 0
    tail = frames(b"a" * 10, start=TERM - 128)
    pad = PadFrame(TERM - 64, 7, 9, 3, 64)
    assert native.check_data_datagram(encode_datagram([*tail, pad]), TERM) == 128  # the PAD covers 64


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda d: d[:20], -1),  # short
        (lambda d: d[:4] + b"\x01" + d[5:], -2),  # version
        (lambda d: d[:6] + b"\x05\x00" + d[8:], -3),  # type
        (lambda d: b"\xff\x00\x00\x00" + d[4:], -4),  # length lies
        (lambda d: d[:64] + d[64:76] + b"\x01\x00\x00\x00" + d[80:], -5),  # second frame, other session
    ],
)
def test_invalid_datagrams_name_their_reason(mutate, code) -> None:  # type: ignore[no-untyped-def]
    datagram = encode_datagram(frames(b"a" * 10, b"b" * 40))
    assert native.check_data_datagram(mutate(datagram), TERM) == code


def test_frames_past_the_term_are_outside() -> None:
    datagram = encode_datagram(frames(b"a" * 100, start=TERM - 64))
    assert native.check_data_datagram(datagram, TERM) == -6


def test_rebuild_insert_skips_duplicates_and_gap_scan_finds_holes() -> None:
    term = bytearray(TERM)
    first, second, third = (encode_datagram([f]) for f in frames(b"a" * 10, b"b" * 10, b"c" * 10))
    assert native.term_gap_scan(term, 0, 192) == (0, 192)
    assert native.term_rebuild_insert(term, 128, third)
    assert native.term_gap_scan(term, 0, 192) == (0, 128)
    assert native.term_rebuild_insert(term, 0, first)
    assert not native.term_rebuild_insert(term, 0, first)  # duplicate
    assert native.term_gap_scan(term, 0, 192) == (64, 64)
    assert native.term_rebuild_insert(term, 64, second)
    assert native.term_gap_scan(term, 0, 192) == (192, 0)
    assert bytes(term[:192]) == first + second + third
    with pytest.raises(ValueError, match="does not fit the term"):
        native.term_rebuild_insert(term, TERM - 32, first)


def test_send_datagrams_batches_whole_frames_up_to_the_mtu_and_pads_travel_as_headers() -> None:
    term = bytearray(TERM)
    payloads = [bytes([i]) * 500 for i in range(5)]  # 544-byte frames: two per 1408 MTU
    data = encode_datagram(frames(*payloads))
    term[: len(data)] = data
    pad = PadFrame(len(data), 7, 9, 3, 1024).encode()  # a 1024-byte PAD after them
    term[len(data) : len(data) + 32] = pad
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        port = rx.getsockname()[1]
        address = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton("127.0.0.1") + bytes(8)
        assert _udp.term_send_datagrams(tx.fileno(), term, 0, TERM, 1408, address, 2) == (2 * 1088, 2, 2 * 1088, False)
        covered, sent, sent_bytes, _ = _udp.term_send_datagrams(tx.fileno(), term, 2 * 1088, TERM, 1408, address, 64)
        assert (covered, sent, sent_bytes) == (544 + 1024, 2, 544 + 32)  # the last frame, then the PAD's header
        assert _udp.term_send_datagrams(tx.fileno(), term, len(data) + 1024, TERM, 1408, address, 64) == (
            0,
            0,
            0,
            False,
        )
        buffer = bytearray(8 * 65536)
        offsets, lengths, sources = np.zeros(8, np.int32), np.zeros(8, dtype=np.int32), np.zeros(8, dtype=np.uint64)
        got, deadline = 0, time.monotonic() + 5
        while got < 4 and time.monotonic() < deadline:  # loopback delivers at once; a batch may split
            got += _udp.udp_receive_batch(
                rx.fileno(), memoryview(buffer)[got * 65536 :], 65536, offsets[got:], lengths[got:], sources[got:]
            )
        assert got == 4 and lengths[:4].tolist() == [1088, 1088, 544, 32]
        assert int(sources[0]) >> 16 == 0x7F000001 and int(sources[0]) & 0xFFFF == tx.getsockname()[1]
        assert bytes(buffer[:1088]) == bytes(term[:1088]) and bytes(buffer[3 * 65536 : 3 * 65536 + 32]) == pad


def send_term(term: bytearray, length: int, wire: int, gso: bool, gro: bool) -> list[tuple[int, int, bytes]]:
    """Send ``term[:length]`` (1408-byte MTU; ``wire`` bytes of datagrams) with ``term_send_datagrams`` to a
    socket reading with or without UDP_GRO; returns each datagram received as (offset in the buffer, length,
    bytes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        if gro:
            rx.setsockopt(socket.IPPROTO_UDP, _udp.UDP_GRO_OPTION, 1)
        rx.bind(("127.0.0.1", 0))
        port = rx.getsockname()[1]
        address = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton("127.0.0.1") + bytes(8)
        offset = 0
        while offset < length:
            covered, sent, sent_bytes, refused = _udp.term_send_datagrams(
                tx.fileno(), term, offset, length - offset, 1408, address, 64, gso
            )
            assert sent > 0 and not refused
            offset += covered
        slots = 8
        entries = slots * (_udp.UDP_GRO_SEGMENTS if gro else 1)
        buffer = bytearray(slots * 65536)
        offsets, lengths = np.zeros(entries, np.int32), np.zeros(entries, np.int32)
        sources = np.zeros(entries, np.uint64)
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 5
        while sum(n for _, n, _ in got) < wire and time.monotonic() < deadline:
            n = _udp.udp_receive_batch(rx.fileno(), buffer, 65536, offsets, lengths, sources)
            for i in range(n):
                o, size = int(offsets[i]), int(lengths[i])
                assert int(sources[i]) & 0xFFFF == tx.getsockname()[1]
                got.append((o, size, bytes(buffer[o : o + size])))
        return got


@pytest.mark.parametrize("gro", [False, True], ids=["plain-receiver", "gro-receiver"])
def test_gso_sends_the_same_datagrams_as_sendmmsg(gro: bool) -> None:
    """A run of equal datagrams goes as one GSO send; the receiver, reading one by one or coalesced, gets
    exactly the datagrams (and bytes) sendmmsg would have sent, the shorter last one and a PAD header too."""
    term = bytearray(TERM)
    payloads = [bytes([i % 250 + 1]) * 1000 for i in range(40)] + [b"x" * 500]  # 1056-byte frames, then 544
    data = encode_datagram(frames(*payloads))
    term[: len(data)] = data
    term[len(data) : len(data) + 32] = PadFrame(len(data), 7, 9, 3, 1024).encode()
    length, wire = len(data) + 1024, len(data) + 32
    expected = send_term(term, length, wire, gso=False, gro=False)
    assert [n for _, n, _ in expected] == [1056] * 40 + [544, 32]
    got = send_term(term, length, wire, gso=True, gro=gro)
    assert [(n, payload) for _, n, payload in got] == [(n, payload) for _, n, payload in expected]
    if gro:  # coalesced reads: several datagrams share a slot, each at its own offset in it
        slots = {o // 65536 for o, _, _ in got}
        assert len(slots) < len(got)
        assert all(o % 65536 + n <= 65536 for o, n, _ in got)


def test_a_gso_send_refused_by_the_kernel_says_so_and_still_sends() -> None:
    """A socket the kernel will not segment for (SO_NO_CHECK: no UDP checksum, which GSO needs) refuses the
    GSO send with EINVAL: the call says so, and sendmmsg sends the same datagrams."""
    term = bytearray(TERM)
    data = encode_datagram(frames(*[bytes([i + 1]) * 8 for i in range(8)]))  # 64-byte frames: one per 64-byte MTU
    term[: len(data)] = data
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        address = struct.pack("=H", socket.AF_INET) + struct.pack("!H", rx.getsockname()[1])
        address += socket.inet_aton("127.0.0.1") + bytes(8)
        tx.setsockopt(socket.SOL_SOCKET, 11, 1)  # SO_NO_CHECK
        result = _udp.term_send_datagrams(tx.fileno(), term, 0, len(data), 64, address, 64, True)
        assert result == (len(data), 8, len(data), True)
        rx.settimeout(5)
        assert [rx.recv(2048) for _ in range(8)] == [data[i : i + 64] for i in range(0, len(data), 64)]
