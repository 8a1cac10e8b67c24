"""The data frame header: a table of (fields, bytes) cases drives encoding and decoding; every frame
is fed whole, one byte short and with trailing bytes; bad fields and MTUs are rejected naming the value.
"""

from __future__ import annotations

import pytest

from logbuf.errors import LogbufError
from logbuf.logbuffer import data_header_descriptor as dh
from tests.support.logs import TERM_LENGTH

# (name, header fields as HEADER packs them, the header's bytes, payload following it)
FRAME_CASES = [
    (
        "data frame, 5-byte payload",
        (37, 0, 0xC0, 1, 64, 0x01020304, 7, 3, 0x1122334455667788),
        bytes.fromhex("2500000000c00100400000000403020107000000030000008877665544332211"),
        b"hello",
    ),
    (
        "first fragment, negative ids, full MTU payload",
        (1408, 0, 0x80, 1, 0, -2, 1, 0x7FFFFFFF, -1),
        bytes.fromhex("800500000080010000000000feffffff01000000ffffff7fffffffffffffffff"),
        bytes(range(256)) * 5 + bytes(96),
    ),
    (
        "heartbeat: header alone, frame_length 0",
        (0, 0, 0xC0, 1, 4096, 9, 10, 11, 0),
        bytes.fromhex("0000000000c0010000100000090000000a0000000b0000000000000000000000"),
        b"",
    ),
    (
        "empty message: header alone, frame_length 32",
        (32, 0, 0xC0, 1, 32, 1, 1, 1, 5),
        bytes.fromhex("2000000000c00100200000000100000001000000010000000500000000000000"),
        b"",
    ),
    (
        "padding header as sent on the wire",
        (96, 0, 0xC0, 0, 128, 1, 2, -1, 0),
        bytes.fromhex("6000000000c00000800000000100000002000000ffffffff0000000000000000"),
        b"",
    ),
]


FRAME_IDS = [case[0] for case in FRAME_CASES]


@pytest.mark.parametrize(("name", "fields", "header", "payload"), FRAME_CASES, ids=FRAME_IDS)
def test_data_header_encodes_and_decodes_byte_for_byte(
    name: str, fields: tuple[int, ...], header: bytes, payload: bytes
) -> None:
    assert dh.HEADER.pack(*fields) == header
    assert dh.HEADER.unpack(header) == fields
    assert dh.HEADER.unpack_from(header + payload, 0) == fields
    dh.check_frame(header + payload)  # the whole frame is valid


@pytest.mark.parametrize(("name", "fields", "header", "payload"), FRAME_CASES, ids=FRAME_IDS)
def test_a_frame_one_byte_short_is_rejected_naming_the_length(
    name: str, fields: tuple[int, ...], header: bytes, payload: bytes
) -> None:
    frame = header + payload
    if payload:
        message = rf"frame_length={fields[0]} but only {len(frame) - 1} bytes are present"
    else:
        message = rf"frame is {len(frame) - 1} bytes, shorter than the 32-byte data header"
    with pytest.raises(dh.FrameError, match=message):
        dh.check_frame(frame[:-1])
    with pytest.raises(dh.FrameError, match=message):
        dh.check_frame(memoryview(frame)[:-1], exact=False)  # short is short, exact or not


@pytest.mark.parametrize(("name", "fields", "header", "payload"), FRAME_CASES, ids=FRAME_IDS)
def test_trailing_bytes_after_a_frame_are_rejected_unless_not_exact(
    name: str, fields: tuple[int, ...], header: bytes, payload: bytes
) -> None:
    frame = header + payload
    if fields[3] == dh.HDR_TYPE_PAD:
        message = r"3 trailing bytes after a padding header"
    else:
        message = rf"3 trailing bytes after a frame of frame_length={fields[0]}"
    with pytest.raises(dh.FrameError, match=message):
        dh.check_frame(frame + b"\x00\x01\x02")
    dh.check_frame(bytearray(frame + b"\x00\x01\x02"), exact=False)


def test_a_padding_frame_with_its_whole_padded_region_is_accepted() -> None:
    header = dh.HEADER.pack(96, 0, 0xC0, dh.HDR_TYPE_PAD, 128, 1, 2, 3, 0)
    dh.check_frame(header + bytes(64))  # frame_length bytes
    dh.check_frame(header)  # header alone, as on the wire
    with pytest.raises(dh.FrameError, match=r"32 trailing bytes after a padding header"):
        dh.check_frame(header + bytes(32))  # neither the header alone nor the whole region


def _header(
    frame_length: int = 40, version: int = 0, flags: int = 0xC0, type_: int = dh.HDR_TYPE_DATA, term_offset: int = 0
) -> bytes:
    return dh.HEADER.pack(frame_length, version, flags, type_, term_offset, 1, 2, 3, 0)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"", r"frame is 0 bytes, shorter than the 32-byte data header"),
        (_header(version=1) + bytes(8), r"version=1, expected 0"),
        (_header(type_=2) + bytes(8), r"type=0x0002 is not DATA \(0x01\) or PAD \(0x00\)"),
        (_header(type_=0x0101) + bytes(8), r"type=0x0101 is not DATA"),
        (_header(term_offset=33) + bytes(8), r"term_offset=33 is not a non-negative multiple of 32"),
        (_header(term_offset=-32) + bytes(8), r"term_offset=-32 is not a non-negative multiple of 32"),
        (_header(frame_length=16), r"frame_length=16 is shorter than the 32-byte header"),
        (_header(frame_length=-64), r"frame_length=-64 is shorter than the 32-byte header"),
        (
            _header(frame_length=16, type_=dh.HDR_TYPE_PAD),
            r"padding frame_length=16 is shorter than the 32-byte header",
        ),
        (_header(frame_length=0, type_=dh.HDR_TYPE_PAD), r"padding frame_length=0 is shorter"),
    ],
    ids=[
        "empty",
        "version",
        "type",
        "type-high-byte",
        "term-offset-misaligned",
        "term-offset-negative",
        "data-length-16",
        "data-length-negative",
        "pad-length-16",
        "pad-length-0",
    ],
)
def test_bad_header_fields_are_rejected_naming_the_field_and_value(frame: bytes, message: str) -> None:
    with pytest.raises(dh.FrameError, match=message) as info:
        dh.check_frame(frame)
    assert isinstance(info.value, ValueError) and isinstance(info.value, LogbufError)


@pytest.mark.parametrize(
    ("mtu", "term_length", "message"),
    [
        (32, None, r"mtu_length=32 must be greater than the 32-byte header"),
        (0, None, r"mtu_length=0 must be greater than the 32-byte header"),
        (65536, None, r"mtu_length=65536 must be at most 65504"),
        (1400, None, r"mtu_length=1400 must be a multiple of 32"),
        (16384, TERM_LENGTH, r"mtu_length=16384 must be at most the max message length 8192 for term_length=65536"),
    ],
)
def test_bad_mtu_lengths_are_rejected_naming_the_value(mtu: int, term_length: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dh.check_mtu_length(mtu, term_length)
