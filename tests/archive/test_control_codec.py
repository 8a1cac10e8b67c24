"""The archive control codec: fixed vectors, versions, round trips and malformed input.

The fixed vectors are written out by hand from Aeron Archive's schema (version 13, Aeron 1.52): an
SBE header (block length, template id, schema id 101, version), then one little-endian field per
helper call, then each var-length field as a u32 length and its bytes. They check the layouts
independently of the codec's own tables; ``test_control_schema.py`` checks the same messages with an
independent SBE implementation reading ``control_schema.xml``.

Hypothesis runs with no deadline: tests hold no wall-clock limits (the machine is shared and loaded).
"""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.archive import control_codec as cc
from logbuf.archive.control_codec import (
    BooleanType,
    ControlCodecError,
    ControlMessage,
    ControlResponseCode,
    RecordingSignal,
    SourceLocation,
    decode,
    encode,
)
from tests.support.control_messages import SAMPLE_IDS, SAMPLES, message_strategy, mutated


def header(block_length: int, template_id: int, version: int = 13, schema_id: int = 101) -> bytes:
    return struct.pack("<HHHH", block_length, template_id, schema_id, version)


def i64(value: int) -> bytes:
    return struct.pack("<q", value)


def i32(value: int) -> bytes:
    return struct.pack("<i", value)


def text(value: str) -> bytes:
    return struct.pack("<I", len(value)) + value.encode("ascii")


def blob(value: bytes) -> bytes:
    return struct.pack("<I", len(value)) + value


# (message, its bytes written out by hand)
CASES: list[tuple[ControlMessage, bytes]] = [
    (
        cc.ControlResponse(7, 42, 3, ControlResponseCode.ERROR, 0x010C00, "no such recording"),
        header(32, 1) + i64(7) + i64(42) + i64(3) + i32(1) + i32(0x010C00) + text("no such recording"),
    ),
    (
        cc.ControlResponse(7, 43, 9, ControlResponseCode.RECORDING_UNKNOWN, 0, ""),
        header(32, 1) + i64(7) + i64(43) + i64(9) + i32(2) + i32(0) + text(""),
    ),
    (
        cc.ConnectRequest(1, 20, 0x010C00, "aeron:udp?endpoint=localhost:8021"),
        header(16, 2) + i64(1) + i32(20) + i32(0x010C00) + text("aeron:udp?endpoint=localhost:8021"),
    ),
    (cc.CloseSessionRequest(-5), header(8, 3) + i64(-5)),
    (
        cc.StartRecordingRequest(7, 2, 1001, SourceLocation.REMOTE, "aeron:ipc"),
        header(24, 4) + i64(7) + i64(2) + i32(1001) + i32(1) + text("aeron:ipc"),
    ),
    (
        cc.StopRecordingRequest(7, 3, 1001, "aeron:ipc"),
        header(20, 5) + i64(7) + i64(3) + i32(1001) + text("aeron:ipc"),
    ),
    (
        cc.ReplayRequest(7, 4, 11, 4096, -1, 2002, 65536, cc.NULL_INT64, "aeron:udp?endpoint=b:9"),
        header(56, 6)
        + i64(7)
        + i64(4)
        + i64(11)
        + i64(4096)
        + i64(-1)
        + i32(2002)
        + i32(65536)
        + i64(-(1 << 63))
        + text("aeron:udp?endpoint=b:9"),
    ),
    (cc.StopReplayRequest(7, 5, 1 << 40), header(24, 7) + i64(7) + i64(5) + i64(1 << 40)),
    (cc.ListRecordingsRequest(7, 6, 0, 100), header(28, 8) + i64(7) + i64(6) + i64(0) + i32(100)),
    (
        cc.ListRecordingsForUriRequest(7, 7, 3, 10, 1001, "ipc"),
        header(32, 9) + i64(7) + i64(7) + i64(3) + i32(10) + i32(1001) + text("ipc"),
    ),
    (cc.ListRecordingRequest(7, 8, 12), header(24, 10) + i64(7) + i64(8) + i64(12)),
    (cc.RecordingPositionRequest(7, 9, 12), header(24, 12) + i64(7) + i64(9) + i64(12)),
    (cc.TruncateRecordingRequest(7, 10, 12, 8192), header(32, 13) + i64(7) + i64(10) + i64(12) + i64(8192)),
    (cc.StopRecordingSubscriptionRequest(7, 11, 77), header(24, 14) + i64(7) + i64(11) + i64(77)),
    (cc.StopPositionRequest(7, 12, 12), header(24, 15) + i64(7) + i64(12) + i64(12)),
    (
        cc.BoundedReplayRequest(7, 13, 12, 0, 1 << 20, 5, 2002, cc.NULL_INT32, 99, "aeron:ipc"),
        header(60, 18)
        + i64(7)
        + i64(13)
        + i64(12)
        + i64(0)
        + i64(1 << 20)
        + i32(5)
        + i32(2002)
        + i32(-(1 << 31))
        + i64(99)
        + text("aeron:ipc"),
    ),
    (cc.StopAllReplaysRequest(7, 14, cc.NULL_INT64), header(24, 19) + i64(7) + i64(14) + i64(-(1 << 63))),
    (
        cc.CatalogHeader(1, 32, 17, 64, 0),
        header(32, 20) + i32(1) + i32(32) + i64(17) + i32(64) + bytes(11) + b"\x00",
    ),
    (
        cc.RecordingDescriptorHeader(160, cc.RecordingState.DELETED, -7, 5),
        header(32, 21) + i32(160) + i32(2) + i32(-7) + bytes(19) + b"\x05",
    ),
    (
        cc.RecordingDescriptor(
            7,
            15,
            12,
            1_700_000_000_000,
            -1,
            0,
            -1,
            3,
            1 << 27,
            1 << 16,
            1408,
            -9,
            1001,
            "aeron:ipc",
            "aeron:ipc?x=1",
            "src",
        ),
        header(80, 22)
        + i64(7)
        + i64(15)
        + i64(12)
        + i64(1_700_000_000_000)
        + i64(-1)
        + i64(0)
        + i64(-1)
        + i32(3)
        + i32(1 << 27)
        + i32(1 << 16)
        + i32(1408)
        + i32(-9)
        + i32(1001)
        + text("aeron:ipc")
        + text("aeron:ipc?x=1")
        + text("src"),
    ),
    (
        cc.RecordingSubscriptionDescriptor(7, 16, 77, 1001, "aeron:ipc"),
        header(28, 23) + i64(7) + i64(16) + i64(77) + i32(1001) + text("aeron:ipc"),
    ),
    (
        cc.RecordingSignalEvent(7, 17, 12, 77, 4096, RecordingSignal.REPLICATE_END),
        header(44, 24) + i64(7) + i64(17) + i64(12) + i64(77) + i64(4096) + i32(7),
    ),
    (cc.StartPositionRequest(7, 18, 12), header(24, 52) + i64(7) + i64(18) + i64(12)),
    (
        cc.AuthConnectRequest(19, 20, 0x010C00, "aeron:ipc", b"\x00secret\xff", "logbuf 1.0"),
        header(16, 58)
        + i64(19)
        + i32(20)
        + i32(0x010C00)
        + text("aeron:ipc")
        + blob(b"\x00secret\xff")
        + text("logbuf 1.0"),
    ),
    (
        cc.Challenge(7, 19, 0x010C00, b"nonce"),
        header(20, 59) + i64(7) + i64(19) + i32(0x010C00) + blob(b"nonce"),
    ),
    (cc.ChallengeResponse(7, 19, b"answer"), header(16, 60) + i64(7) + i64(19) + blob(b"answer")),
    (cc.KeepAliveRequest(7, 20), header(16, 61) + i64(7) + i64(20)),
    (cc.RecordingPositionAtTimeRequest(7, 24, 12, -5), header(32, 1001) + i64(7) + i64(24) + i64(12) + i64(-5)),
    (
        cc.SyncDigestRequest(7, 28, -9, 1001, 5, 1 << 16, BooleanType.TRUE, "aeron:ipc", i64(0) + i64(4096), i64(0)),
        header(36, 0x4C00)
        + i64(7)
        + i64(28)
        + i32(-9)
        + i32(1001)
        + i32(5)
        + i32(1 << 16)
        + i32(1)
        + text("aeron:ipc")
        + blob(i64(0) + i64(4096))
        + blob(i64(0)),
    ),
    (
        cc.SyncDigests(7, 28, 1, bytes(range(16)), b"\x01"),
        header(20, 0x4C01) + i64(7) + i64(28) + i32(1) + blob(bytes(range(16))) + blob(b"\x01"),
    ),
    (
        cc.SyncFramesRequest(7, 29, -9, 1001, 5, 1 << 16, 4096, 8192, "aeron:ipc"),
        header(48, 0x4C02)
        + i64(7)
        + i64(29)
        + i32(-9)
        + i32(1001)
        + i32(5)
        + i32(1 << 16)
        + i64(4096)
        + i64(8192)
        + text("aeron:ipc"),
    ),
    (cc.SyncFrames(7, 29, 4064, b"\x20\x00"), header(24, 0x4C03) + i64(7) + i64(29) + i64(4064) + blob(b"\x20\x00")),
    (
        cc.SyncRepairRequest(7, 30, -9, 1001, 5, 1 << 16, 4064, "aeron:ipc", b"\x20\x00"),
        header(40, 0x4C04)
        + i64(7)
        + i64(30)
        + i32(-9)
        + i32(1001)
        + i32(5)
        + i32(1 << 16)
        + i64(4064)
        + text("aeron:ipc")
        + blob(b"\x20\x00"),
    ),
    (
        cc.StartRecordingRequest2(7, 21, 1001, SourceLocation.LOCAL, BooleanType.TRUE, "aeron:ipc"),
        header(28, 63) + i64(7) + i64(21) + i32(1001) + i32(0) + i32(1) + text("aeron:ipc"),
    ),
    (cc.StopRecordingByIdentityRequest(7, 22, 12), header(24, 65) + i64(7) + i64(22) + i64(12)),
    (
        cc.ReplicateRequest2(7, 23, 1, -1, -1, 0, 0, 10, 4096, 5, "src:ctl", "", "repl", b"cred", "src:rsp"),
        header(68, 66)
        + i64(7)
        + i64(23)
        + i64(1)
        + i64(-1)
        + i64(-1)
        + i64(0)
        + i64(0)
        + i32(10)
        + i32(4096)
        + i32(5)
        + text("src:ctl")
        + text("")
        + text("repl")
        + blob(b"cred")
        + text("src:rsp"),
    ),
    (cc.MaxRecordedPositionRequest(7, 24, 12), header(24, 67) + i64(7) + i64(24) + i64(12)),
    (cc.ArchiveIdRequest(7, 25), header(16, 68) + i64(7) + i64(25)),
    (
        cc.RecordingStarted(12, 0, -9, 1001, "aeron:ipc", "aeron:ipc"),
        header(24, 101) + i64(12) + i64(0) + i32(-9) + i32(1001) + text("aeron:ipc") + text("aeron:ipc"),
    ),
    (cc.RecordingProgress(12, 0, 1 << 33), header(24, 102) + i64(12) + i64(0) + i64(1 << 33)),
    (cc.RecordingStopped(12, 0, 1 << 33), header(24, 103) + i64(12) + i64(0) + i64(1 << 33)),
    (cc.PurgeRecordingRequest(7, 26, 12), header(24, 104) + i64(7) + i64(26) + i64(12)),
    (cc.Ping(7), header(8, 106) + i64(7)),
    (
        cc.UpdateChannelRequest(7, 27, 12, "aeron:udp?endpoint=c:1"),
        header(24, 107) + i64(7) + i64(27) + i64(12) + text("aeron:udp?endpoint=c:1"),
    ),
]
CASE_IDS = [type(message).__name__ + str(i) for i, (message, _) in enumerate(CASES)]


@pytest.mark.parametrize(("message", "wire"), CASES, ids=CASE_IDS)
def test_encode_gives_the_hand_written_bytes(message: ControlMessage, wire: bytes) -> None:
    assert encode(message) == wire


@pytest.mark.parametrize(("message", "wire"), CASES, ids=CASE_IDS)
def test_decode_of_the_hand_written_bytes_gives_the_message(message: ControlMessage, wire: bytes) -> None:
    assert decode(wire) == message
    assert decode(bytearray(wire)) == message
    assert decode(memoryview(b"xx" + wire)[2:]) == message


# --- Every message: whole, one byte short, trailing bytes -------------------------------------------------


def test_every_template_of_the_schema_is_implemented() -> None:
    assert sorted(cc.TEMPLATES) == [
        *range(1, 25),
        *range(50, 69),
        *range(101, 108),
        cc.LOGBUF_TEMPLATE_ID_BASE + 1,  # logbuf's own: RecordingPositionAtTimeRequest
        cc.SYNC_TEMPLATE_ID_BASE,  # archive sync: SyncDigestRequest
        cc.SYNC_TEMPLATE_ID_BASE + 1,  # SyncDigests
        cc.SYNC_TEMPLATE_ID_BASE + 2,  # SyncFramesRequest
        cc.SYNC_TEMPLATE_ID_BASE + 3,  # SyncFrames
        cc.SYNC_TEMPLATE_ID_BASE + 4,  # SyncRepairRequest
    ]
    assert len(cc.TEMPLATES) == 56
    for template_id, message_type in cc.TEMPLATES.items():
        assert message_type.TEMPLATE_ID == template_id
        assert dataclasses.is_dataclass(message_type)


@pytest.mark.parametrize("message", SAMPLES, ids=SAMPLE_IDS)
def test_every_decoder_whole_short_and_with_trailing_bytes(message: ControlMessage) -> None:
    wire = encode(message)
    assert decode(wire) == message
    with pytest.raises(ControlCodecError, match="truncated|runs past the end"):
        decode(wire[:-1])
    with pytest.raises(ControlCodecError, match="1 trailing bytes"):
        decode(wire + b"\x00")
    for cut in range(len(wire)):
        with pytest.raises(ControlCodecError):
            decode(wire[:cut])


# --- Versions -------------------------------------------------------------------------------------------


def test_older_sender_fields_added_later_read_as_null() -> None:
    # A version 6 ReplayRequest has no fileIoMaxLength (7) nor replayToken (10): a 44-byte block.
    old = header(44, 6, version=6) + i64(7) + i64(4) + i64(11) + i64(0) + i64(-1) + i32(2002) + text("aeron:ipc")
    assert decode(old) == cc.ReplayRequest(7, 4, 11, 0, -1, 2002, cc.NULL_INT32, cc.NULL_INT64, "aeron:ipc")
    # A version 3 ControlResponse has no version field; its 28-byte block is followed by the message.
    old = header(28, 1, version=3) + i64(1) + i64(2) + i64(3) + i32(0) + text("ok")
    assert decode(old) == cc.ControlResponse(1, 2, 3, ControlResponseCode.OK, cc.NULL_VERSION, "ok")
    # A version 11 AuthConnectRequest has no clientInfo.
    old = header(16, 58, version=11) + i64(1) + i32(20) + i32(5) + text("aeron:ipc") + blob(b"")
    assert decode(old) == cc.AuthConnectRequest(1, 20, 5, "aeron:ipc", b"", "")
    # A version 7 ReplicateRequest2 has fileIoMaxLength but not replicationSessionId nor the last two var fields.
    old = (
        header(64, 66, version=7)
        + b"".join(i64(v) for v in (1, 2, 3, 4, 5, 6, 7))
        + i32(8)
        + i32(9)
        + text("a")
        + text("b")
        + text("c")
    )
    assert decode(old) == cc.ReplicateRequest2(1, 2, 3, 4, 5, 6, 7, 8, 9, cc.NULL_INT32, "a", "b", "c", b"", "")


def test_field_of_an_older_version_is_null_even_inside_a_longer_block() -> None:
    # Acting version 6 with the whole current block: the fields added later are not read.
    wire = bytearray(encode(cc.ReplayRequest(1, 2, 3, 4, 5, 6, 7, 8, "c")))
    wire[6:8] = struct.pack("<H", 6)
    assert decode(bytes(wire)) == cc.ReplayRequest(1, 2, 3, 4, 5, 6, cc.NULL_INT32, cc.NULL_INT64, "c")


def test_newer_sender_longer_block_is_skipped_and_appended_var_data_ignored() -> None:
    newer = header(32 + 12, 1, version=14) + i64(1) + i64(2) + i64(3) + i32(0) + i32(5) + bytes(12)
    newer += text("fine") + text("a field from version 14")
    assert decode(newer) == cc.ControlResponse(1, 2, 3, ControlResponseCode.OK, 5, "fine")


def test_block_too_short_for_a_field_of_the_acting_version_is_an_error() -> None:
    wire = header(24, 6) + i64(7) + i64(4) + i64(11) + text("x")
    with pytest.raises(ControlCodecError, match="ReplayRequest: block length 24 is too short for position"):
        decode(wire)


# --- Errors name the problem ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        (b"", "truncated: need 8 bytes for the message header, have 0"),
        (header(8, 3)[:7], "truncated: need 8 bytes for the message header, have 7"),
        (header(8, 3, schema_id=100) + i64(1), "schema id 100 is not 101"),
        (header(8, 999) + i64(1), "unknown template id 999"),
        (
            header(8, 3) + i64(1)[:5],
            "CloseSessionRequest: truncated: need 16 bytes for controlSessionId at offset 8, have 13",
        ),
        (header(16, 3) + i64(1), "CloseSessionRequest: truncated: need 24 bytes for a block of 16, have 16"),
        (header(16, 61) + i64(1) + i64(2) + b"\x00", "KeepAliveRequest: 1 trailing bytes"),
        (
            header(20, 5) + i64(7) + i64(3) + i32(1) + b"\x09\x00",
            "StopRecordingRequest: truncated: need 32 bytes for the length of channel at offset 28, have 30",
        ),
        (
            header(20, 5) + i64(7) + i64(3) + i32(1) + struct.pack("<I", 10) + b"abc",
            "StopRecordingRequest: var-length channel of 10 bytes runs past the end",
        ),
        (
            header(20, 5) + i64(7) + i64(3) + i32(1) + struct.pack("<I", 0xFFFFFFFF),
            "var-length channel of 4294967295 bytes runs past the end",
        ),
        (
            header(20, 5) + i64(7) + i64(3) + i32(1) + blob(b"ab\xc3\xa9"),
            r"StopRecordingRequest: channel is not US-ASCII \(byte 0xc3 at offset 34\)",
        ),
        (
            header(24, 4) + i64(7) + i64(2) + i32(1) + i32(2) + text("x"),
            "StartRecordingRequest: sourceLocation 2 is not a SourceLocation",
        ),
        (
            header(32, 1) + i64(7) + i64(2) + i64(3) + i32(-(1 << 31)) + i32(0) + text(""),
            "ControlResponse: code -2147483648 is not a ControlResponseCode",
        ),
    ],
)
def test_malformed_input_gets_an_error_naming_the_problem(wire: bytes, match: str) -> None:
    with pytest.raises(ControlCodecError, match=match):
        decode(wire)


def test_decode_of_something_not_bytes_is_a_codec_error() -> None:
    with pytest.raises(ControlCodecError, match="not a contiguous bytes-like buffer"):
        decode("text")  # type: ignore[arg-type]
    assert issubclass(ControlCodecError, ValueError)


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (
            cc.CloseSessionRequest(1 << 63),
            r"CloseSessionRequest.control_session_id: 9223372036854775808 is out of range",
        ),
        (cc.StopRecordingRequest(1, 2, 1 << 31, "x"), "stream_id: 2147483648 is out of range for int32"),
        (cc.StopRecordingRequest(1, 2, 3, "caf\u00e9"), "channel: not US-ASCII \\('\u00e9' at index 3\\)"),
        (cc.StartRecordingRequest(1, 2, 3, 7, "x"), "source_location: 7 is not a SourceLocation"),  # type: ignore[arg-type]
        (cc.ChallengeResponse(1, 2, "text"), "encoded_credentials: 'text' is not bytes"),  # type: ignore[arg-type]
        (cc.KeepAliveRequest(1, True), "correlation_id: True is not an int"),
        (cc.KeepAliveRequest(1, 2.0), "correlation_id: 2.0 is not an int"),  # type: ignore[arg-type]
        (
            cc.StartRecordingRequest(1, 2, 3, BooleanType.TRUE, "x"),  # type: ignore[arg-type]
            "source_location: <BooleanType.TRUE: 1> is not a SourceLocation",
        ),
        (cc.StartRecordingRequest(1, 2, 3, True, "x"), "source_location: True is not a SourceLocation"),  # type: ignore[arg-type]
    ],
)
def test_encode_of_a_bad_value_names_the_field(message: ControlMessage, match: str) -> None:
    with pytest.raises(ControlCodecError, match=match):
        encode(message)


def test_encode_accepts_plain_ints_for_enums_and_decode_gives_the_enum() -> None:
    wire = encode(cc.StartRecordingRequest(1, 2, 3, 1, "x"))  # type: ignore[arg-type]
    assert decode(wire) == cc.StartRecordingRequest(1, 2, 3, SourceLocation.REMOTE, "x")
    assert type(decode(wire).source_location) is SourceLocation  # type: ignore[union-attr]


# --- Hypothesis: round trips and garbage ----------------------------------------------------------------


@pytest.mark.parametrize("layout", cc.LAYOUTS.values(), ids=lambda layout: layout.name)
@given(data=st.data())
@settings(max_examples=20, deadline=None)
def test_every_message_round_trips(layout: cc.MessageLayout, data: st.DataObject) -> None:
    message = data.draw(message_strategy(layout))
    wire = encode(message)
    assert decode(wire) == message
    var_length = sum(cc.VAR_LENGTH_HEADER_LENGTH + len(getattr(message, v.name)) for v in layout.var_fields)
    assert len(wire) == cc.MESSAGE_HEADER_LENGTH + layout.block_length + var_length


def _decode_or_codec_error(wire: bytes) -> None:
    try:
        message = decode(wire)
    except ControlCodecError:
        return
    # What decodes re-encodes to a message that decodes the same (fields at the acting version).
    assert decode(encode(message)) == message


@given(st.binary(max_size=96))
@settings(max_examples=300, deadline=None)
def test_random_bytes_decode_or_raise_a_codec_error(wire: bytes) -> None:
    _decode_or_codec_error(wire)


@given(
    st.sampled_from(list(cc.LAYOUTS)),
    st.integers(0, 96) | st.integers(0, 0xFFFF),
    st.sampled_from([0, 2, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xFFFF]),
    st.binary(max_size=120),
)
@settings(max_examples=300, deadline=None)
def test_random_body_behind_a_valid_header_decodes_or_raises_a_codec_error(
    template_id: int, block_length: int, version: int, body: bytes
) -> None:
    _decode_or_codec_error(header(block_length, template_id, version=version) + body)


@given(mutated())
@settings(max_examples=300, deadline=None)
def test_mutated_messages_decode_or_raise_a_codec_error(wire: bytes) -> None:
    _decode_or_codec_error(wire)
