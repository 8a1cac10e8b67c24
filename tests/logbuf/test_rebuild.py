"""Receiver-side term algorithms: datagram checks, rebuild insertion, gap scans."""

from __future__ import annotations

import pytest

from logbuf import _native
from logbuf.protocol import DataFrame, HeartbeatFrame, PadFrame, encode_datagram

TERM = 65536


def frames(*payloads: bytes, start: int = 0) -> list[DataFrame]:
    out, offset = [], start
    for payload in payloads:
        out.append(DataFrame(offset, 7, 9, 3, payload))
        offset += (32 + len(payload) + 31) // 32 * 32
    return out


def test_valid_datagrams_pass_the_check() -> None:
    assert _native.check_data_datagram(encode_datagram(frames(b"a" * 10, b"b" * 40)), TERM) == 64 + 96
    assert _native.check_data_datagram(HeartbeatFrame(64, 7, 9, 3).encode(), TERM) == 0
    tail = frames(b"a" * 10, start=TERM - 128)
    pad = PadFrame(TERM - 64, 7, 9, 3, 64)
    assert _native.check_data_datagram(encode_datagram([*tail, pad]), TERM) == 128  # the PAD covers 64


@pytest.mark.parametrize("mutate, code", [
    (lambda d: d[:20], -1),                                   # short
    (lambda d: d[:4] + b"\x01" + d[5:], -2),                  # version
    (lambda d: d[:6] + b"\x05\x00" + d[8:], -3),              # type
    (lambda d: b"\xff\x00\x00\x00" + d[4:], -4),              # length lies
    (lambda d: d[:64] + d[64:76] + b"\x01\x00\x00\x00" + d[80:], -5),   # second frame, other session
])
def test_invalid_datagrams_name_their_reason(mutate, code) -> None:  # type: ignore[no-untyped-def]
    datagram = encode_datagram(frames(b"a" * 10, b"b" * 40))
    assert _native.check_data_datagram(mutate(datagram), TERM) == code


def test_frames_past_the_term_are_outside() -> None:
    datagram = encode_datagram(frames(b"a" * 100, start=TERM - 64))
    assert _native.check_data_datagram(datagram, TERM) == -6


def test_rebuild_insert_skips_duplicates_and_gap_scan_finds_holes() -> None:
    term = bytearray(TERM)
    first, second, third = (encode_datagram([f]) for f in frames(b"a" * 10, b"b" * 10, b"c" * 10))
    assert _native.term_gap_scan(term, 0, 192) == (0, 192)
    assert _native.term_rebuild_insert(term, 128, third)
    assert _native.term_gap_scan(term, 0, 192) == (0, 128)
    assert _native.term_rebuild_insert(term, 0, first)
    assert not _native.term_rebuild_insert(term, 0, first)  # duplicate
    assert _native.term_gap_scan(term, 0, 192) == (64, 64)
    assert _native.term_rebuild_insert(term, 64, second)
    assert _native.term_gap_scan(term, 0, 192) == (192, 0)
    assert bytes(term[:192]) == first + second + third
    with pytest.raises(ValueError, match="does not fit the term"):
        _native.term_rebuild_insert(term, TERM - 32, first)
