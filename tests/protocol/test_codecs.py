"""Wire-frame codecs: fixed vectors, round trips, malformed input, and real Aeron captures.

The fixed vectors are written out by hand from the field tables in the Aeron notes
(``../shared/reference/aeron-protocol.md`` section 1), one little-endian field per hex chunk,
so they check the layouts independently of the encoders. The captures
(``../shared/data/aeron-captures``) are an Aeron 1.48 C driver talking to itself over
loopback; every datagram must decode to what the ``*_decoded.txt`` listing says and re-encode
to the captured bytes.
"""

from __future__ import annotations

import ast
import pathlib
import re
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import (
    DataFrame,
    EncodableFrame,
    ErrorFrame,
    Frame,
    HeartbeatFrame,
    MalformedFrameError,
    NakFrame,
    PadFrame,
    ResolutionEntry,
    ResolutionFrame,
    ResponseSetupFrame,
    RttMeasurementFrame,
    SetupFrame,
    StatusMessageFrame,
    data,
    decode_datagram,
    encode_datagram,
    error_frame,
    nak,
    resolution,
    response_setup,
    rttm,
    setup,
    status,
)
from logbuf.protocol.frame_header import TYPE_NAMES
from tests.protocol.pcap import UdpDatagram, read_udp

CAPTURES = pathlib.Path(__file__).resolve().parent / "captures"  # copied from ../shared/data/aeron-captures


def h(*chunks: str) -> bytes:
    """Bytes from hex chunks (one chunk per field, spaces allowed)."""
    return bytes.fromhex("".join(chunks).replace(" ", ""))


# Shared field values: session 0x01020304, stream 1001, term id 7.
SESSION, STREAM, TERM = "04030201", "e9030000", "07000000"


@dataclass(frozen=True)
class Vector:
    name: str
    frame: Frame
    wire: bytes
    decode: Callable[..., Frame]


VECTORS = [
    Vector(
        "setup",
        SetupFrame(
            term_offset=64,
            session_id=0x01020304,
            stream_id=1001,
            initial_term_id=-1,
            active_term_id=2,
            term_length=65536,
            mtu_length=1408,
            ttl=8,
            flags=setup.GROUP_FLAG,
        ),
        h(
            "28000000",
            "00",
            "40",
            "0500",
            "40000000",
            SESSION,
            STREAM,
            "ffffffff",
            "02000000",
            "00000100",
            "80050000",
            "08000000",
        ),
        setup.decode,
    ),
    Vector(
        "status",
        StatusMessageFrame(
            session_id=0x01020304,
            stream_id=1001,
            consumption_term_id=7,
            consumption_term_offset=256,
            receiver_window_length=131072,
            receiver_id=-2,
        ),
        h("24000000", "00", "00", "0300", SESSION, STREAM, TERM, "00010000", "00000200", "feffffffffffffff"),
        status.decode,
    ),
    Vector(
        "status_group_tag",
        StatusMessageFrame(
            session_id=0x01020304,
            stream_id=1001,
            consumption_term_id=7,
            consumption_term_offset=256,
            receiver_window_length=131072,
            receiver_id=-2,
            group_tag=5,
            flags=status.END_OF_STREAM_FLAG,
        ),
        h(
            "2c000000",
            "00",
            "40",
            "0300",
            SESSION,
            STREAM,
            TERM,
            "00010000",
            "00000200",
            "feffffffffffffff",
            "0500000000000000",
        ),
        status.decode,
    ),
    Vector(
        "status_setup_eliciting",
        StatusMessageFrame.setup_eliciting(session_id=0x01020304, stream_id=1001, receiver_id=0x0102030405060708),
        h("24000000", "00", "80", "0300", SESSION, STREAM, "00000000", "00000000", "00000000", "0807060504030201"),
        status.decode,
    ),
    Vector(
        "nak",
        NakFrame(session_id=0x01020304, stream_id=1001, term_id=7, term_offset=320, length=64),
        h("1c000000", "00", "00", "0200", SESSION, STREAM, TERM, "40010000", "40000000"),
        nak.decode,
    ),
    Vector(
        "rttm",
        RttMeasurementFrame(
            session_id=0x01020304,
            stream_id=1001,
            echo_timestamp_ns=1_000_000_000,
            reception_delta_ns=0,
            receiver_id=0x0102030405060708,
            flags=rttm.REPLY_FLAG,
        ),
        h("28000000", "00", "80", "0600", SESSION, STREAM, "00ca9a3b00000000", "0000000000000000", "0807060504030201"),
        rttm.decode,
    ),
    Vector(
        "error",
        ErrorFrame(
            session_id=0x01020304,
            stream_id=1001,
            receiver_id=0x0102030405060708,
            error_code=13,
            error_message="rejected",
            group_tag=9,
            flags=error_frame.HAS_GROUP_TAG_FLAG,
        ),
        h(
            "30000000",
            "00",
            "08",
            "0400",
            SESSION,
            STREAM,
            "0807060504030201",
            "0900000000000000",
            "0d000000",
            "08000000",
            b"rejected".hex(),
        ),
        error_frame.decode,
    ),
    Vector(
        "response_setup",
        ResponseSetupFrame(session_id=0x01020304, stream_id=1001, response_session_id=5),
        h("14000000", "00", "00", "0b00", SESSION, STREAM, "05000000"),
        response_setup.decode,
    ),
    Vector(
        "resolution",
        ResolutionFrame(
            (
                ResolutionEntry(
                    res_type=1,
                    udp_port=8050,
                    age_ms=100,
                    address=bytes([127, 0, 0, 1]),
                    name="abcd",
                    res_flags=resolution.SELF_FLAG,
                ),
            )
        ),
        h(
            "20000000",
            "00",
            "00",
            "0700",
            "01",
            "80",
            "721f",
            "64000000",
            "7f000001",
            "0400",
            b"abcd".hex(),
            "000000000000",
        ),
        resolution.decode,
    ),
    Vector(
        "data",
        DataFrame(
            term_offset=64,
            session_id=0x01020304,
            stream_id=1001,
            term_id=7,
            payload=b"hello",
            reserved_value=0x1122334455667788,
        ),
        h(
            "25000000",
            "00",
            "c0",
            "0100",
            "40000000",
            SESSION,
            STREAM,
            TERM,
            "8877665544332211",
            b"hello".hex(),
            "00" * 27,
        ),
        data.decode,
    ),
    Vector(
        "heartbeat_eos",
        HeartbeatFrame(
            term_offset=128, session_id=0x01020304, stream_id=1001, term_id=7, flags=dh.BEGIN_END_AND_EOS_FLAGS
        ),
        h("00000000", "00", "e0", "0100", "80000000", SESSION, STREAM, TERM, "0000000000000000"),
        data.decode,
    ),
    Vector(
        "pad",
        PadFrame(term_offset=65440, session_id=0x01020304, stream_id=1001, term_id=7, frame_length=96),
        h("60000000", "00", "c0", "0000", "a0ff0000", SESSION, STREAM, TERM, "0000000000000000"),
        data.decode,
    ),
]
BY_NAME = {v.name: v for v in VECTORS}
F = TypeVar("F")


def vector_frame(name: str, kind: type[F]) -> F:
    """The frame of vector ``name``, typed as ``kind``."""
    frame = BY_NAME[name].frame
    assert isinstance(frame, kind)
    return frame


def vector_ids(vector: Vector) -> str:
    return vector.name


ENCODED = [v for v in VECTORS if v.name not in ("resolution", "response_setup")]
"""RES and RSP_SETUP are only decoded (logbuf has no name resolver and no response channels)."""


def encoded(vector: Vector) -> EncodableFrame:
    assert not isinstance(vector.frame, (ResolutionFrame, ResponseSetupFrame))
    return vector.frame


def reason_of(datagram: bytes) -> str | None:
    """Why the datagram is invalid, or None if it is valid."""
    try:
        decode_datagram(datagram, strict=True)
    except MalformedFrameError as exc:
        return exc.reason
    return None


# -- fixed vectors --------------------------------------------------------------------------
@pytest.mark.parametrize("vector", ENCODED, ids=vector_ids)
def test_frame_encodes_to_the_hand_built_bytes(vector: Vector) -> None:
    assert encoded(vector).encode() == vector.wire


@pytest.mark.parametrize("vector", VECTORS, ids=vector_ids)
def test_hand_built_bytes_decode_to_the_frame(vector: Vector) -> None:
    assert vector.decode(vector.wire) == vector.frame
    assert decode_datagram(vector.wire, strict=True) == [vector.frame]
    assert reason_of(vector.wire) is None


@pytest.mark.parametrize("vector", ENCODED, ids=vector_ids)
def test_encode_into_writes_at_the_offset_and_returns_the_wire_length(vector: Vector) -> None:
    buffer = bytearray(b"\xee" * (len(vector.wire) + 16))
    assert encoded(vector).encode_into(buffer, 8) == len(vector.wire)
    assert buffer[:8] == b"\xee" * 8 and buffer[-8:] == b"\xee" * 8
    assert bytes(buffer[8:-8]) == vector.wire


@pytest.mark.parametrize("vector", VECTORS, ids=vector_ids)
def test_decode_reads_at_an_offset_and_ignores_trailing_bytes(vector: Vector) -> None:
    buffer = b"\xaa" * 5 + vector.wire + b"\x55" * 7
    assert vector.decode(buffer, 5) == vector.frame
    assert vector.decode(memoryview(bytearray(buffer)), 5) == vector.frame


def test_the_frame_flag_helpers_read_their_bits() -> None:
    assert vector_frame("status_setup_eliciting", StatusMessageFrame).elicits_setup
    assert not vector_frame("status", StatusMessageFrame).elicits_setup
    assert vector_frame("status_group_tag", StatusMessageFrame).is_end_of_stream
    assert vector_frame("rttm", RttMeasurementFrame).is_reply_requested
    assert vector_frame("error", ErrorFrame).has_group_tag
    assert vector_frame("resolution", ResolutionFrame).entries[0].is_self
    heartbeat = vector_frame("heartbeat_eos", HeartbeatFrame)
    assert heartbeat.is_end_of_stream
    assert not replace(heartbeat, flags=dh.EOS_FLAG).is_end_of_stream


# -- one byte short, trailing bytes ---------------------------------------------------------
SHORT = {
    "setup": "SETUP frame truncated: 39 bytes, needs 40",
    "status": "SM frame truncated: 35 bytes, needs 36",
    "status_group_tag": "SM frame: frame_length=44 is longer than the 43 bytes available",
    "status_setup_eliciting": "SM frame truncated: 35 bytes, needs 36",
    "nak": "NAK frame truncated: 27 bytes, needs 28",
    "rttm": "RTTM frame truncated: 39 bytes, needs 40",
    "error": "ERR frame: frame_length=48 is longer than the 47 bytes available",
    "response_setup": "RSP_SETUP frame truncated: 19 bytes, needs 20",
    "resolution": "RES frame: frame_length=32 is longer than the 31 bytes available",
    "data": "DATA frame: frame_length=37 is longer than the 36 bytes available",  # cut inside the payload
    "heartbeat_eos": "DATA frame truncated: 31 bytes, needs 32",
    "pad": "DATA frame truncated: 31 bytes, needs 32",
}


@pytest.mark.parametrize("vector", VECTORS, ids=vector_ids)
def test_one_byte_short_is_rejected_naming_the_length(vector: Vector) -> None:
    short = vector.wire[: vector.frame.frame_length - 1] if vector.name == "data" else vector.wire[:-1]
    with pytest.raises(MalformedFrameError, match=re.escape(SHORT[vector.name])):
        vector.decode(short)
    assert reason_of(short) == SHORT[vector.name]
    assert decode_datagram(short) == []


def test_a_data_datagram_may_omit_the_last_frames_alignment_padding() -> None:
    vector = BY_NAME["data"]
    unpadded = vector.wire[: vector.frame.frame_length]
    assert decode_datagram(unpadded, strict=True) == [vector.frame]


@pytest.mark.parametrize(
    "vector", [v for v in VECTORS if not v.name.startswith(("data", "heartbeat", "pad"))], ids=vector_ids
)
def test_trailing_bytes_after_a_control_frame_make_the_datagram_invalid(vector: Vector) -> None:
    datagram = vector.wire + b"\x00" * 3
    reason = f"3 trailing bytes after the {len(vector.wire)}-byte {TYPE_NAMES[datagram[6]]} frame"
    with pytest.raises(MalformedFrameError, match=re.escape(reason)):
        decode_datagram(datagram, strict=True)
    assert reason_of(datagram) == reason
    assert decode_datagram(datagram) == []


def test_trailing_bytes_after_data_frames_make_the_datagram_invalid() -> None:
    data_wire = BY_NAME["data"].wire
    with pytest.raises(
        MalformedFrameError, match="^5 trailing bytes after the last frame, too short for a 32-byte header$"
    ):
        decode_datagram(data_wire + b"\x01" * 5, strict=True)
    with pytest.raises(
        MalformedFrameError, match=r"^frame 2 at datagram offset 64: PAD frame: frame_length=0 is shorter"
    ):
        decode_datagram(data_wire + bytes(32), strict=True)
    with pytest.raises(MalformedFrameError, match="^32 bytes after a PAD frame, which must end its datagram$"):
        decode_datagram(BY_NAME["pad"].wire + data_wire[:32], strict=True)
    with pytest.raises(MalformedFrameError, match=r"heartbeat\) must be alone in a 32-byte datagram, this one is 40"):
        decode_datagram(BY_NAME["heartbeat_eos"].wire + bytes(8), strict=True)


# -- bad headers and lying lengths ----------------------------------------------------------
def with_field(wire: bytes, offset: int, fmt: str, value: int) -> bytes:
    buffer = bytearray(wire)
    struct.pack_into(fmt, buffer, offset, value)
    return bytes(buffer)


@pytest.mark.parametrize("vector", VECTORS, ids=vector_ids)
def test_a_wrong_version_is_rejected(vector: Vector) -> None:
    bad = with_field(vector.wire, 4, "<B", 1)
    with pytest.raises(MalformedFrameError, match=r"frame: version=1, expected 0$"):
        vector.decode(bad)
    assert reason_of(bad) == "datagram version=1, expected 0"


@pytest.mark.parametrize(
    ("decode", "wire", "message"),
    [
        (setup.decode, BY_NAME["status"].wire, r"SETUP frame: type=0x0003 \(SM\), expected 0x0005 \(SETUP\)"),
        (status.decode, BY_NAME["nak"].wire, r"SM frame: type=0x0002 \(NAK\), expected 0x0003 \(SM\)"),
        (nak.decode, BY_NAME["rttm"].wire, r"NAK frame: type=0x0006 \(RTTM\), expected 0x0002 \(NAK\)"),
        (rttm.decode, BY_NAME["setup"].wire, r"RTTM frame: type=0x0005 \(SETUP\), expected 0x0006 \(RTTM\)"),
        (error_frame.decode, BY_NAME["setup"].wire, r"ERR frame: type=0x0005 \(SETUP\), expected 0x0004 \(ERR\)"),
        (resolution.decode, BY_NAME["nak"].wire, r"RES frame: type=0x0002 \(NAK\), expected 0x0007 \(RES\)"),
        (response_setup.decode, BY_NAME["nak"].wire, r"RSP_SETUP frame: type=0x0002 \(NAK\), expected 0x000b"),
        (data.decode, BY_NAME["setup"].wire, r"DATA frame: type=0x0005 \(SETUP\), expected 0x0001 \(DATA\) or 0x0000"),
    ],
)
def test_a_wrong_type_is_rejected_naming_both_types(decode: Callable[..., Frame], wire: bytes, message: str) -> None:
    with pytest.raises(MalformedFrameError, match=message):
        decode(wire)


@pytest.mark.parametrize("frame_type", [0x08, 0x09, 0x0A, 0x0C, 0x1234, 0xFFFF])
def test_unsupported_frame_types_are_classified_not_raised(frame_type: int) -> None:
    datagram = with_field(BY_NAME["setup"].wire, 6, "<H", frame_type)
    reason = reason_of(datagram)
    assert reason is not None and reason.startswith(f"frame type 0x{frame_type:04x} (")
    assert reason.endswith("is not supported")
    assert decode_datagram(datagram) == []


@pytest.mark.parametrize("length", range(8))
def test_a_datagram_shorter_than_the_common_header_is_invalid(length: int) -> None:
    datagram = BY_NAME["setup"].wire[:length]
    assert reason_of(datagram) == f"datagram is {length} bytes, shorter than the 8-byte common header"
    with pytest.raises(MalformedFrameError, match=f"SETUP frame truncated: {length} bytes, needs 40"):
        setup.decode(datagram)


@pytest.mark.parametrize(
    ("name", "frame_length", "message"),
    [
        ("setup", 20, "SETUP frame: frame_length=20 is shorter than its 40-byte header"),
        ("setup", -40, "SETUP frame: frame_length=-40 is shorter than its 40-byte header"),
        ("setup", 41, "SETUP frame: frame_length=41 is longer than the 40 bytes available"),
        ("status", 35, "SM frame: frame_length=35 is shorter than its 36-byte header"),
        ("status", 37, "SM frame: frame_length=37 is longer than the 36 bytes available"),
        ("nak", 0, "NAK frame: frame_length=0 is shorter than its 28-byte header"),
        ("rttm", 1 << 30, "RTTM frame: frame_length=1073741824 is longer than the 40 bytes available"),
        ("error", 39, "ERR frame: frame_length=39 is shorter than its 40-byte header"),
        ("response_setup", 8, "RSP_SETUP frame: frame_length=8 is shorter than its 20-byte header"),
        ("resolution", 4, "RES frame: frame_length=4 is shorter than its 8-byte header"),
        ("data", 31, "DATA frame: frame_length=31 is shorter than its 32-byte header"),
        ("data", -1, "DATA frame: frame_length=-1 is shorter than its 32-byte header"),
        ("data", 65, "DATA frame: frame_length=65 is longer than the 64 bytes available"),
        ("pad", 31, "PAD frame: frame_length=31 is shorter than its 32-byte header"),
    ],
)
def test_a_frame_length_that_lies_is_rejected(name: str, frame_length: int, message: str) -> None:
    vector = BY_NAME[name]
    bad = with_field(vector.wire, 0, "<i", frame_length)
    with pytest.raises(MalformedFrameError, match=f"^{re.escape(message)}$"):
        vector.decode(bad)
    assert reason_of(bad) == message


@pytest.mark.parametrize(
    ("name", "offset", "fmt", "value", "message"),
    [
        # Fixed-size frames must say their own size, even when the buffer holds more.
        ("setup", 0, "<i", 36, "SETUP frame: frame_length=36 is shorter than its 40-byte header"),
        ("status_group_tag", 0, "<i", 40, "SM frame: frame_length=40, must be 36, or 44 with a group tag"),
        (
            "setup",
            setup.TERM_LENGTH_FIELD_OFFSET,
            "<i",
            100_000,
            "SETUP frame: term_length=100000 is not a power of 2 between 65536 and 1073741824",
        ),
        ("setup", setup.TERM_LENGTH_FIELD_OFFSET, "<i", 32768, "SETUP frame: term_length=32768 is not a power of 2"),
        ("setup", setup.TERM_OFFSET_FIELD_OFFSET, "<i", 33, "SETUP frame: term_offset=33 is not a multiple of 32"),
        ("setup", setup.TERM_OFFSET_FIELD_OFFSET, "<i", 65536, "SETUP frame: term_offset=65536 is not a multiple"),
        ("setup", setup.MTU_LENGTH_FIELD_OFFSET, "<i", 1400, "SETUP frame: mtu_length=1400 is not a multiple of 32"),
        (
            "setup",
            setup.MTU_LENGTH_FIELD_OFFSET,
            "<i",
            32,
            "SETUP frame: mtu_length=32 is not a multiple of 32 in (32, 65504]",
        ),
        ("setup", setup.MTU_LENGTH_FIELD_OFFSET, "<i", 65536, "SETUP frame: mtu_length=65536"),
        ("setup", setup.TTL_FIELD_OFFSET, "<i", -1, "SETUP frame: ttl=-1 is negative"),
        (
            "setup",
            setup.ACTIVE_TERM_ID_FIELD_OFFSET,
            "<i",
            -5,
            "SETUP frame: active_term_id=-5 is before initial_term_id=-1",
        ),
        (
            "status",
            status.CONSUMPTION_TERM_OFFSET_FIELD_OFFSET,
            "<i",
            -32,
            "SM frame: consumption_term_offset=-32 is negative",
        ),
        ("status", status.RECEIVER_WINDOW_FIELD_OFFSET, "<i", -1, "SM frame: receiver_window=-1 is negative"),
        (
            "nak",
            nak.TERM_OFFSET_FIELD_OFFSET,
            "<i",
            100,
            "NAK frame: term_offset=100 is not a non-negative multiple of 32",
        ),
        ("nak", nak.LENGTH_FIELD_OFFSET, "<i", 0, "NAK frame: length=0 is not a positive multiple of 32"),
        ("nak", nak.LENGTH_FIELD_OFFSET, "<i", 100, "NAK frame: length=100 is not a positive multiple of 32"),
        ("rttm", rttm.RECEPTION_DELTA_FIELD_OFFSET, "<q", -5, "RTTM frame: reception_delta=-5 is negative"),
        (
            "error",
            error_frame.ERROR_STRING_LENGTH_FIELD_OFFSET,
            "<i",
            7,
            "ERR frame: frame_length=48 but error_string_length=7 makes 47",
        ),
        (
            "error",
            error_frame.ERROR_STRING_LENGTH_FIELD_OFFSET,
            "<i",
            5000,
            "ERR frame: error_string_length=5000 is not in [0, 1023]",
        ),
        (
            "error",
            error_frame.ERROR_STRING_FIELD_OFFSET + 2,
            "<B",
            0xE9,
            "ERR frame: error message byte 2 is not ASCII",
        ),
        ("resolution", 8, "<B", 3, "RES frame: entry 0: res_type=0x03 is not IPv4 (0x01) or IPv6 (0x02)"),
        ("resolution", 8 + 12, "<h", -1, "RES frame: entry 0: name_length=-1 is not in [0, 512]"),
        ("resolution", 8 + 12, "<h", 20, "RES frame: entry 0: name_length=20 runs past frame_length"),
        ("resolution", 8, "<B", 2, "RES frame: entry 0 truncated: 24 bytes left, needs 26"),
        (
            "data",
            dh.TERM_OFFSET_FIELD_OFFSET,
            "<i",
            65,
            "DATA frame: term_offset=65 is not a non-negative multiple of 32",
        ),
        ("pad", dh.TERM_OFFSET_FIELD_OFFSET, "<i", -32, "PAD frame: term_offset=-32 is not a non-negative multiple"),
    ],
)
def test_bad_field_values_are_rejected_naming_the_value(
    name: str, offset: int, fmt: str, value: int, message: str
) -> None:
    vector = BY_NAME[name]
    bad = with_field(vector.wire, offset, fmt, value)
    with pytest.raises(MalformedFrameError, match=f"^{re.escape(message)}"):
        vector.decode(bad)
    reason = reason_of(bad)
    assert reason is not None and reason.startswith(message)


def test_a_fixed_size_frame_longer_than_its_size_is_rejected_even_if_the_bytes_are_there() -> None:
    wire = with_field(BY_NAME["nak"].wire, 0, "<i", 32) + bytes(4)
    with pytest.raises(MalformedFrameError, match="^NAK frame: frame_length=32, must be exactly 28$"):
        nak.decode(wire)


def test_the_error_is_a_value_error_carrying_its_reason() -> None:
    with pytest.raises(ValueError) as info:
        nak.decode(b"")
    assert isinstance(info.value, MalformedFrameError)
    assert info.value.reason == "NAK frame truncated: 0 bytes, needs 28" == str(info.value)


# -- multi-frame data datagrams -------------------------------------------------------------
def data_frame(term_offset: int, payload: bytes, **changes: Any) -> DataFrame:
    return replace(DataFrame(term_offset, 0x01020304, 1001, 7, payload), **changes)


def test_a_datagram_of_consecutive_frames_ending_in_pad_decodes_in_order() -> None:
    frames: list[Frame] = [
        data_frame(65376, b"x" * 30),  # 62 -> 64 aligned
        data_frame(65440, b""),  # an empty message: frame_length 32
        PadFrame(65472, 0x01020304, 1001, 7, 64),
    ]
    datagram = encode_datagram(frames)
    assert len(datagram) == 64 + 32 + 32
    assert decode_datagram(datagram, strict=True) == frames


@pytest.mark.parametrize(
    ("second", "message"),
    [
        (
            data_frame(96, b"y"),
            "frame 2 at datagram offset 64: term_offset=96, expected 64 right after the previous frame",
        ),
        (
            data_frame(64, b"y", session_id=9),
            "frame 2 at datagram offset 64: session_id=9, the datagram's first frame has 16909060",
        ),
        (
            data_frame(64, b"y", stream_id=9),
            "frame 2 at datagram offset 64: stream_id=9, the datagram's first frame has 1001",
        ),
        (data_frame(64, b"y", term_id=8), "frame 2 at datagram offset 64: term_id=8, the datagram's first frame has 7"),
        (
            HeartbeatFrame(64, 0x01020304, 1001, 7),
            "frame 2 at datagram offset 64: frame_length=0 (heartbeat) inside a multi-frame datagram",
        ),
    ],
)
def test_frames_in_one_datagram_must_be_consecutive_in_one_term(second: Frame, message: str) -> None:
    datagram = encode_datagram([data_frame(0, b"x" * 30), second])
    with pytest.raises(MalformedFrameError, match=f"^{re.escape(message)}$"):
        decode_datagram(datagram, strict=True)


# -- encoding errors ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (NakFrame(1, 2, 3, 4, 1 << 31), r"cannot encode NakFrame\(.*length=2147483648"),
        (replace(vector_frame("setup", SetupFrame), flags=256), r"cannot encode SetupFrame\(.*flags=256"),
        (replace(vector_frame("error", ErrorFrame), error_message="é"), "error_message is not ASCII"),
        (replace(vector_frame("error", ErrorFrame), error_message="x" * 1024), "error_message is 1024 bytes, max 1023"),
    ],
)
def test_encoding_a_value_that_does_not_fit_names_it(frame: EncodableFrame, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        frame.encode()


def test_encode_into_a_buffer_too_small_raises() -> None:
    with pytest.raises(ValueError, match="cannot encode"):
        encoded(BY_NAME["setup"]).encode_into(bytearray(39), 0)
    with pytest.raises(ValueError, match="64 bytes do not fit at offset 1"):
        encoded(BY_NAME["data"]).encode_into(bytearray(64), 1)


# -- Hypothesis round trips -----------------------------------------------------------------
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
non_negative_i32 = st.integers(0, 2**31 - 1)
u8 = st.integers(0, 255)
aligned_offset = st.integers(0, (2**31 - 32) // 32).map(lambda k: k * 32)
ascii_text = st.text(alphabet=st.characters(max_codepoint=127), max_size=64)


@st.composite
def setup_frames(draw: st.DrawFn) -> SetupFrame:
    term_length = 1 << draw(st.integers(16, 30))
    initial_term_id = draw(i32)
    term_count = draw(st.integers(0, 2**31 - 1))  # the active term is never before the initial one
    return SetupFrame(
        term_offset=draw(st.integers(0, term_length // 32 - 1)) * 32,
        session_id=draw(i32),
        stream_id=draw(i32),
        initial_term_id=initial_term_id,
        active_term_id=((initial_term_id + term_count + 2**31) & 0xFFFFFFFF) - 2**31,
        term_length=term_length,
        mtu_length=draw(st.integers(2, dh.MAX_UDP_PAYLOAD_LENGTH // 32)) * 32,
        ttl=draw(non_negative_i32),
        flags=draw(u8),
    )


CONTROL_FRAMES = st.one_of(
    setup_frames(),
    st.builds(StatusMessageFrame, i32, i32, i32, non_negative_i32, non_negative_i32, i64, st.none() | i64, u8),
    st.builds(NakFrame, i32, i32, i32, aligned_offset, st.integers(1, 2**26 - 1).map(lambda n: n * 32), u8),
    st.builds(RttMeasurementFrame, i32, i32, i64, st.integers(0, 2**63 - 1), i64, u8),
    st.builds(
        ErrorFrame, i32, i32, i64, i32, st.text(alphabet=st.characters(max_codepoint=127), max_size=1023), i64, u8
    ),
)
DATA_PATH_FRAMES = st.one_of(
    st.builds(DataFrame, aligned_offset, i32, i32, i32, st.binary(max_size=1400), i64, u8),
    st.builds(HeartbeatFrame, aligned_offset, i32, i32, i32, i64, u8),
    st.builds(PadFrame, aligned_offset, i32, i32, i32, st.integers(32, 2**31 - 1), i64, u8),
)


@given(CONTROL_FRAMES | DATA_PATH_FRAMES)
def test_every_frame_survives_encode_then_decode(frame: Frame) -> None:
    wire = frame.encode()
    assert decode_datagram(wire, strict=True) == [frame]
    assert encode_datagram(decode_datagram(wire)) == wire


@given(
    st.sampled_from([36, 44, 35, 40]),
    st.integers(0, 2),
    u8,
    st.sampled_from([3, 2]),
    st.binary(min_size=40, max_size=40),
)
def test_the_one_unpack_sm_decode_agrees_with_the_checked_decode(
    frame_length: int, version: int, flags: int, frame_type: int, rest: bytes
) -> None:
    """``status.decode`` takes a well-formed 36-byte SM with one unpack; whatever the header and fields
    (negative offsets and windows included), it returns the same frame, or raises the same error, as
    the full checks."""
    wire = struct.pack("<iBBH", frame_length, version, flags, frame_type) + rest

    def outcome(decoder: Callable[[bytes, int], StatusMessageFrame]) -> object:
        try:
            return decoder(wire, 0)
        except MalformedFrameError as exc:
            return str(exc)

    assert outcome(status.decode) == outcome(status._decode_checked)


@given(
    st.lists(st.binary(max_size=200), min_size=1, max_size=8),
    st.integers(0, 2**20).map(lambda k: k * 32),
    st.booleans(),
    st.integers(32, 4096),
)
def test_a_run_of_consecutive_data_frames_survives_encode_then_decode(
    payloads: list[bytes], start: int, end_with_pad: bool, pad_length: int
) -> None:
    frames: list[Frame] = []
    offset = start
    for payload in payloads:
        frames.append(data_frame(offset, payload))
        offset += dh.align(dh.HEADER_LENGTH + len(payload))
    if end_with_pad:
        frames.append(PadFrame(offset, 0x01020304, 1001, 7, pad_length))
    datagram = encode_datagram(frames)
    assert decode_datagram(datagram, strict=True) == frames


@given(st.binary(max_size=128))
@settings(max_examples=300)
def test_garbage_never_raises_out_of_the_dispatcher(datagram: bytes) -> None:
    frames = decode_datagram(datagram)
    reason = reason_of(datagram)
    assert (frames == []) == (reason is not None)
    if frames and not isinstance(frames[0], (ResolutionFrame, ResponseSetupFrame)):  # those are decoded only
        # valid garbage: re-encoding may only differ in padding, so it decodes to the same frames
        assert decode_datagram(encode_datagram(frames), strict=True) == frames  # type: ignore[arg-type]


@given(CONTROL_FRAMES | DATA_PATH_FRAMES, st.data())
def test_corrupting_one_byte_never_raises_anything_but_malformed(frame: Frame, draw: st.DataObject) -> None:
    wire = bytearray(frame.encode())
    index = draw.draw(st.integers(0, len(wire) - 1))
    wire[index] = draw.draw(u8)
    try:
        decode_datagram(bytes(wire), strict=True)
    except MalformedFrameError:
        pass


@given(CONTROL_FRAMES | DATA_PATH_FRAMES, st.data())
def test_every_truncation_is_classified(frame: Frame, draw: st.DataObject) -> None:
    wire = frame.encode()
    cut = draw.draw(st.integers(0, len(wire) - 1))
    if isinstance(frame, DataFrame) and cut >= frame.frame_length:
        return  # only alignment padding removed: still valid
    assert reason_of(wire[:cut]) is not None


# -- real Aeron captures --------------------------------------------------------------------
@dataclass(frozen=True)
class ListedDatagram:
    number: int
    seconds: float
    src: str
    dst: str
    udp_length: int
    frames: list[dict[str, Any]]


LINE = re.compile(
    r"^#(?P<number>\d+)\s+t=\+(?P<seconds>[\d.]+) (?P<src>[\d.]+:\d+) -> (?P<dst>[\d.]+:\d+) "
    r"udp_len=(?P<udp_length>\d+) \| (?P<frames>.*)$"
)
PAYLOAD = re.compile(r" payload=(?P<value>.*) \((?P<length>\d+)B\)$")
NOTE = re.compile(r" note=(?P<note>.*)$")


def parse_listing(path: pathlib.Path) -> tuple[list[ListedDatagram], dict[str, int]]:
    """The datagrams of a ``*_decoded.txt`` listing, and its closing frame-type counts."""
    listed: list[ListedDatagram] = []
    counts: dict[str, int] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("frame type counts: "):
            counts = ast.literal_eval(line.removeprefix("frame type counts: "))
            continue
        match = LINE.match(line)
        assert match, f"{path.name}: cannot read {line[:80]!r}"
        frames = [parse_frame(text) for text in re.split(r"; (?=frame_length=)", match["frames"])]
        listed.append(
            ListedDatagram(
                int(match["number"]),
                float(match["seconds"]),
                match["src"],
                match["dst"],
                int(match["udp_length"]),
                frames,
            )
        )
    return listed, counts


def parse_frame(text: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if payload := PAYLOAD.search(text):
        fields["payload"] = (payload["value"], int(payload["length"]))
        text = text[: payload.start()]
    if note := NOTE.search(text):
        fields["note"] = note["note"]
        text = text[: note.start()]
    for token in text.split():
        key, value = token.split("=", 1)
        if key == "type":
            code, name = re.fullmatch(r"(0x[0-9a-f]+)\((\w+)\)", value).groups()  # type: ignore[union-attr]
            fields["type"], fields["type_name"] = int(code, 16), name
        else:
            fields[key] = int(value, 0)
    return fields


TYPE_CODES: dict[type, int] = {
    DataFrame: 0x01,
    HeartbeatFrame: 0x01,
    PadFrame: 0x00,
    NakFrame: 0x02,
    StatusMessageFrame: 0x03,
    ErrorFrame: 0x04,
    SetupFrame: 0x05,
    RttMeasurementFrame: 0x06,
    ResolutionFrame: 0x07,
    ResponseSetupFrame: 0x0B,
}
# Listing name -> our attribute name, where they differ (we put units in names).
ATTRIBUTES = {
    "mtu": "mtu_length",
    "receiver_window": "receiver_window_length",
    "echo_timestamp": "echo_timestamp_ns",
    "reception_delta": "reception_delta_ns",
}


def check_listed_payload(frame: DataFrame, value: str, length: int) -> None:
    assert len(frame.payload) == length
    if value.startswith(("b'", 'b"')):
        assert frame.payload == ast.literal_eval(value)
    elif value.endswith("..."):
        assert frame.payload.startswith(bytes.fromhex(value[:-3]))
    else:
        assert frame.payload == bytes.fromhex(value)


def check_frame_against_listing(frame: Frame, listed: dict[str, Any]) -> None:
    assert TYPE_CODES[type(frame)] == listed.pop("type")
    assert TYPE_NAMES[TYPE_CODES[type(frame)]] == listed.pop("type_name")
    assert listed.pop("version") == 0
    if "payload" in listed:
        assert isinstance(frame, DataFrame)
        check_listed_payload(frame, *listed.pop("payload"))
    if "note" in listed:
        assert listed.pop("note") == "heartbeat (frame_length 0)"
        assert isinstance(frame, HeartbeatFrame)
    for key, value in listed.items():
        assert getattr(frame, ATTRIBUTES.get(key, key)) == value, key


def count_key(frame: Frame) -> str:
    code = TYPE_CODES[type(frame)]
    key = f"0x{code:02x}({TYPE_NAMES[code]})"
    return key + " heartbeat" if isinstance(frame, HeartbeatFrame) else key


CAPTURE_FILES = sorted(CAPTURES.glob("*.pcap"))


def test_the_captures_are_there() -> None:
    assert {p.name for p in CAPTURE_FILES} >= {"frames.pcap", "frames_nak.pcap", "frames_pad.pcap", "frames_rttm.pcap"}


@pytest.fixture(scope="module", params=CAPTURE_FILES, ids=lambda p: p.stem)
def capture(request: pytest.FixtureRequest) -> tuple[list[UdpDatagram], list[ListedDatagram], dict[str, int]]:
    path: pathlib.Path = request.param
    listed, counts = parse_listing(path.with_name(path.stem + "_decoded.txt"))
    return read_udp(path), listed, counts


Capture = tuple[list[UdpDatagram], list[ListedDatagram], dict[str, int]]


def test_every_captured_datagram_is_in_the_listing(capture: Capture) -> None:
    datagrams, listed, _ = capture
    assert [entry.number for entry in listed] == list(range(1, len(datagrams) + 1))
    first_ns = datagrams[0].timestamp_ns
    for datagram, entry in zip(datagrams, listed, strict=True):
        assert f"{datagram.src}:{datagram.src_port}" == entry.src
        assert f"{datagram.dst}:{datagram.dst_port}" == entry.dst
        assert len(datagram.payload) == entry.udp_length
        assert abs((datagram.timestamp_ns - first_ns) / 1e9 - entry.seconds) < 2e-6


def test_every_captured_datagram_decodes_to_the_listed_fields(capture: Capture) -> None:
    datagrams, listed, counts = capture
    seen: Counter[str] = Counter()
    for datagram, entry in zip(datagrams, listed, strict=True):
        assert reason_of(datagram.payload) is None, entry.number
        frames = decode_datagram(datagram.payload, strict=True)
        assert len(frames) == len(entry.frames), entry.number
        for frame, fields in zip(frames, entry.frames, strict=True):
            check_frame_against_listing(frame, dict(fields))
        seen.update(count_key(frame) for frame in frames)
    assert dict(seen) == counts


def test_every_captured_frame_re_encodes_to_the_captured_bytes(capture: Capture) -> None:
    datagrams, _, _ = capture
    for datagram in datagrams:
        frames = decode_datagram(datagram.payload, strict=True)
        assert encode_datagram(frames) == datagram.payload, datagram.index
        position = 0
        for frame in frames:  # frame by frame too, through the per-type decoders
            encoded = frame.encode()
            assert datagram.payload[position : position + len(encoded)] == encoded
            position += len(encoded)


def test_the_captures_hold_every_frame_type_the_driver_sent() -> None:
    kinds: Counter[str] = Counter()
    for path in CAPTURE_FILES:
        for datagram in read_udp(path):
            kinds.update(type(frame).__name__ for frame in decode_datagram(datagram.payload, strict=True))
    assert set(kinds) == {
        "SetupFrame",
        "StatusMessageFrame",
        "HeartbeatFrame",
        "DataFrame",
        "PadFrame",
        "NakFrame",
        "RttMeasurementFrame",
    }


def test_the_captured_rttm_exchange_follows_the_reply_flag() -> None:
    replies_requested, answers = 0, 0
    for datagram in read_udp(CAPTURES / "frames_rttm.pcap"):
        for frame in decode_datagram(datagram.payload, strict=True):
            if isinstance(frame, RttMeasurementFrame):
                if frame.is_reply_requested:
                    replies_requested += 1
                else:
                    answers += 1
                    assert frame.reception_delta_ns == 0
    assert replies_requested > 0 and answers > 0


def test_the_captured_pad_frame_fills_the_term_and_ends_its_datagram() -> None:
    for datagram in read_udp(CAPTURES / "frames_pad.pcap"):
        frames = decode_datagram(datagram.payload, strict=True)
        pads = [frame for frame in frames if isinstance(frame, PadFrame)]
        if pads:
            (pad,) = pads
            assert frames[-1] is pad
            setup_frame = next(
                f
                for d in read_udp(CAPTURES / "frames_pad.pcap")
                for f in decode_datagram(d.payload)
                if isinstance(f, SetupFrame)
            )
            assert pad.term_offset + pad.frame_length == setup_frame.term_length
            return
    pytest.fail("no PAD frame in frames_pad.pcap")
