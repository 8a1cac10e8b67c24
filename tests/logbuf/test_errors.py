"""Errors that name the problem, and the publication/image semantics at their edges.

Decoders are fed whole, one byte short and with trailing bytes, from a table of (fields, bytes)
cases that drives both encoding and decoding. Bad settings (term lengths, MTUs, page sizes,
shared-memory names), oversize messages and bad offsets for the native atomics must raise errors
whose message names the bad value. Then the hot-path semantics: claims that are aborted or
committed, controlled poll's four actions, block poll, exceptions in handlers (the position of
fragments already delivered, the raising one included, is kept: DESIGN.md section 3), and the
offer results CLOSED, NOT_CONNECTED, BACK_PRESSURED and MAX_POSITION_EXCEEDED.
"""

from __future__ import annotations

import mmap
import struct
import subprocess
import sys
import uuid
from array import array
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from logbuf import native
from logbuf.conduit import command_descriptor as cmd
from logbuf.errors import ConfigurationError, LogbufError
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.logbuffer.fragment_assembler import ControlledFragmentAssembler, FragmentAssembler
from logbuf.logbuffer.image import ControlledPollAction, Header, Image
from logbuf.logbuffer.log_buffer import LogBuffers, LogParams
from logbuf.logbuffer.publication import BufferClaim, OfferResult, Publication
from logbuf.logbuffer.standalone import StreamLog
from logbuf.shm import Segment, ShmError

TERM_LENGTH = 64 * 1024
MTU_LENGTH = 1408
MAX_PAYLOAD = MTU_LENGTH - dh.HEADER_LENGTH
SESSION_ID = 77
STREAM_ID = 9


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture
def log_name() -> Iterator[str]:
    name = f"t-err-{uuid.uuid4().hex[:12]}"
    yield name
    StreamLog.unlink_name(name)


@pytest.fixture
def log(log_name: str) -> Iterator[StreamLog]:
    with StreamLog.create(
        log_name, term_length=TERM_LENGTH, mtu_length=MTU_LENGTH, session_id=SESSION_ID, stream_id=STREAM_ID
    ) as stream_log:
        yield stream_log


def collect(into: list[tuple[bytes, int]]) -> Callable[[memoryview, Header], None]:
    """A fragment handler that keeps (payload, header.position)."""

    def handler(buffer: memoryview, header: Header) -> None:
        into.append((bytes(buffer), header.position))

    return handler


def offer_all(pub: Publication, messages: list[bytes]) -> list[int]:
    positions = []
    for message in messages:
        result = pub.offer(message)
        assert result > 0, OfferResult(result)
        positions.append(result)
    return positions


def frame_end(position_before: int, payload_length: int) -> int:
    return position_before + dh.align(payload_length + dh.HEADER_LENGTH)


# =================================================================================================
# Decoders: the data frame header
# =================================================================================================
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


# =================================================================================================
# Decoders: the Header flyweight over a term (term_read)
# =================================================================================================
@pytest.fixture
def term() -> Iterator[memoryview]:
    """A page-aligned, zeroed 64 KiB term."""
    mm = mmap.mmap(-1, TERM_LENGTH)
    view = memoryview(mm)
    yield view
    view.release()
    mm.close()


def test_the_header_flyweight_reads_every_field_of_the_frame_it_is_given(term: memoryview) -> None:
    initial_term_id = 0x7FFFFFFE  # term id 0x7FFFFFFF + 2 wraps to -2^31 + 1: three terms in
    term_id = -(2**31) + 1
    first = dh.HEADER.pack(37, 0, 0xC0, 1, 0, 0x01020304, 7, term_id, 0x1122334455667788) + b"hello"
    pad = dh.HEADER.pack(64, 0, 0xC0, 0, 64, 0x01020304, 7, term_id, 0)
    second = dh.HEADER.pack(33, 0, 0xC0, 1, 128, 0x01020304, 7, term_id, -5) + b"!"
    term[0 : len(first)] = first
    term[64 : 64 + len(pad)] = pad
    term[128 : 128 + len(second)] = second
    seen: list[tuple[bytes, dict[str, int], int, int]] = []

    def handler(buffer: memoryview, header: Header) -> None:
        seen.append((bytes(buffer), header.snapshot(), header.frame_offset, header.initial_term_id))

    assert native.term_read(term, 0, handler, 10, Header(), initial_term_id) == (2, 192)
    begin = 3 * TERM_LENGTH
    assert seen == [
        (
            b"hello",
            {
                "frame_length": 37,
                "version": 0,
                "flags": 0xC0,
                "type": 1,
                "term_offset": 0,
                "session_id": 0x01020304,
                "stream_id": 7,
                "term_id": term_id,
                "reserved_value": 0x1122334455667788,
                "position": begin + 64,
            },
            0,
            initial_term_id,
        ),
        (
            b"!",
            {
                "frame_length": 33,
                "version": 0,
                "flags": 0xC0,
                "type": 1,
                "term_offset": 128,
                "session_id": 0x01020304,
                "stream_id": 7,
                "term_id": term_id,
                "reserved_value": -5,
                "position": begin + 192,
            },
            128,
            initial_term_id,
        ),
    ]


def test_term_read_stops_at_the_fragment_limit_and_resumes_from_the_offset_it_returned(term: memoryview) -> None:
    for i in range(5):
        term[64 * i : 64 * i + 33] = dh.HEADER.pack(33, 0, 0xC0, 1, 64 * i, 1, 1, 0, i) + bytes([i])
    got: list[tuple[bytes, int]] = []
    assert native.term_read(term, 0, collect(got), 2, Header()) == (2, 128)
    assert native.term_read(term, 128, collect(got), 10, Header()) == (3, 320)
    assert [payload for payload, _ in got] == [bytes([i]) for i in range(5)]
    assert native.term_read(term, 320, collect(got), 10, Header()) == (0, 320)  # nothing committed there


@pytest.mark.parametrize("length", [TERM_LENGTH - 1, TERM_LENGTH + 1, TERM_LENGTH // 2, 3 * TERM_LENGTH // 2])
def test_a_term_that_is_not_a_power_of_two_of_at_least_64_kib_is_rejected_naming_its_length(length: int) -> None:
    buffer = bytearray(length)
    with pytest.raises(ValueError, match=rf"term buffer length={length} is not a power of 2 >= 65536"):
        native.term_read(buffer, 0, collect([]), 10, Header())
    with pytest.raises(ValueError, match=rf"term buffer length={length} is not a power of 2"):
        native.term_scan_block(buffer, 0, length)
    with pytest.raises(ValueError, match=rf"term buffer length={length} is not a power of 2"):
        native.term_scan_for_availability(buffer, 0, length)


@pytest.mark.parametrize("offset", [-32, 33, 8, TERM_LENGTH + 32])
def test_a_term_offset_that_is_misaligned_or_outside_the_term_is_rejected(term: memoryview, offset: int) -> None:
    with pytest.raises(ValueError, match=rf"term_offset={offset} is not a multiple of 32 within the term"):
        native.term_read(term, offset, collect([]), 10, Header())
    with pytest.raises(ValueError, match=rf"term_offset={offset} is not a multiple of 32 within the term"):
        native.term_scan_block(term, offset, TERM_LENGTH)


def test_term_read_at_the_end_of_the_term_reads_nothing(term: memoryview) -> None:
    assert native.term_read(term, TERM_LENGTH, collect([]), 10, Header()) == (0, TERM_LENGTH)


def test_an_unset_header_reports_itself_as_unset() -> None:
    header = Header()
    assert repr(header) == "Header(<unset>)"
    assert header.frame_offset == 0


_UNSET_HEADER_SCRIPT = """
from logbuf.native import Header
for field in ("frame_length", "flags", "session_id", "reserved_value", "position"):
    try:
        getattr(Header(), field)
    except ValueError as e:
        assert "not bound to a frame" in str(e), e
    else:
        raise AssertionError("no error")
"""


def test_reading_a_field_of_an_unset_header_does_not_crash_the_interpreter() -> None:
    done = subprocess.run([sys.executable, "-c", _UNSET_HEADER_SCRIPT], capture_output=True, timeout=60)
    assert done.returncode == 0, f"interpreter died with {done.returncode}: {done.stderr.decode()[-500:]}"


def test_log_view_rejects_a_buffer_too_short_for_a_log() -> None:
    with pytest.raises(ValueError, match=r"log buffer of 4096 bytes is too short for three 64 KiB terms and metadata"):
        native.LogView(bytearray(4096))


def test_log_view_rejects_a_buffer_whose_metadata_records_no_term_length() -> None:
    with mmap.mmap(-1, 3 * TERM_LENGTH + lbd.LOG_META_DATA_LENGTH) as mm:
        with pytest.raises(ValueError, match=r"log buffer of 200704 bytes holds no valid term_length"):
            native.LogView(mm)


# =================================================================================================
# Decoders: client <-> driver commands
# =================================================================================================
COMMAND_CASES: list[tuple[Any, bytes, str]] = [
    (
        cmd.PublicationCommand(1, 2, 10, "aeron:ipc"),
        struct.pack("<qqii", 1, 2, 10, 9) + b"aeron:ipc",
        r"publication command channel: string length=9 does not fit the 32-byte message",
    ),
    (
        cmd.SubscriptionCommand(3, 4, -1, 11, "aeron:ipc?x=é"),
        struct.pack("<qqqii", 3, 4, -1, 11, 14) + "aeron:ipc?x=é".encode(),
        r"subscription command channel: string length=14 does not fit the 45-byte message",
    ),
    (
        cmd.RemoveCommand(5, 6, 7),
        struct.pack("<qqq", 5, 6, 7),
        r"remove command: 23 bytes is shorter than its fixed 24-byte part",
    ),
    (
        cmd.CorrelatedCommand(8, 9),
        struct.pack("<qq", 8, 9),
        r"correlated command: 15 bytes is shorter than its fixed 16-byte part",
    ),
    (
        cmd.ErrorResponse(10, 7, "bad"),
        struct.pack("<qii", 10, 7, 3) + b"bad",
        r"error response message: string length=3 does not fit the 18-byte message",
    ),
    (
        cmd.PublicationReady(1, 2, 3, 4, 5, 6, "1.logbuffer"),
        struct.pack("<qqiiiii", 1, 2, 3, 4, 5, 6, 11) + b"1.logbuffer",
        r"publication ready log file name: string length=11 does not fit the 46-byte message",
    ),
    (
        cmd.ImageReady(1, 2, 3, 4, 5, "f", "src"),
        struct.pack("<qiiqii", 1, 2, 3, 4, 5, 1) + b"f" + struct.pack("<i", 3) + b"src",
        r"available image source identity: string length=3 does not fit the 39-byte message",
    ),
    (
        cmd.ImageMessage(1, 2, 3, ""),
        struct.pack("<qqii", 1, 2, 3, 0),
        r"unavailable image: 23 bytes is shorter than its fixed 24-byte part",
    ),
    (
        cmd.SubscriptionReady(1, 2),
        struct.pack("<qi", 1, 2),
        r"subscription ready: 11 bytes is shorter than its fixed 12-byte part",
    ),
    (
        cmd.OperationSuccess(42),
        struct.pack("<q", 42),
        r"operation success: 7 bytes is shorter than its fixed 8-byte part",
    ),
    (cmd.ClientTimeout(43), struct.pack("<q", 43), r"client timeout: 7 bytes is shorter than its fixed 8-byte part"),
]
COMMAND_IDS = [type(case[0]).__name__ for case in COMMAND_CASES]


@pytest.mark.parametrize(("message", "encoded", "short_error"), COMMAND_CASES, ids=COMMAND_IDS)
def test_commands_encode_and_decode_byte_for_byte(message: Any, encoded: bytes, short_error: str) -> None:
    assert message.encode() == encoded
    assert type(message).decode(encoded) == message
    assert type(message).decode(memoryview(encoded)) == message


@pytest.mark.parametrize(("message", "encoded", "short_error"), COMMAND_CASES, ids=COMMAND_IDS)
def test_a_command_one_byte_short_is_malformed_naming_what_does_not_fit(
    message: Any, encoded: bytes, short_error: str
) -> None:
    with pytest.raises(cmd.MalformedCommandError, match=short_error):
        type(message).decode(encoded[:-1])
    with pytest.raises(cmd.MalformedCommandError, match=r"bytes is shorter than its fixed|too short|does not fit"):
        type(message).decode(b"")


@pytest.mark.parametrize(("message", "encoded", "short_error"), COMMAND_CASES, ids=COMMAND_IDS)
def test_trailing_bytes_after_a_command_are_ignored_as_aerons_flyweights_do(
    message: Any, encoded: bytes, short_error: str
) -> None:
    # Records in the ring and broadcast buffers are length-delimited; decoders read their fields and
    # ignore what follows (forward compatibility, as Aeron's command flyweights).
    assert type(message).decode(encoded + b"\xff\x00\xff") == message


@pytest.mark.parametrize(
    ("encoded", "error"),
    [
        (struct.pack("<qqii", 1, 2, 10, -1), r"string length=-1 does not fit the 24-byte message"),
        (
            struct.pack("<qqii", 1, 2, 10, cmd.MAX_STRING_LENGTH + 1) + bytes(cmd.MAX_STRING_LENGTH + 1),
            r"string length=4097 does not fit",
        ),
        (struct.pack("<qqii", 1, 2, 10, 2) + b"\xff\xfe", r"publication command channel: string is not UTF-8"),
    ],
)
def test_bad_strings_in_a_command_are_malformed_naming_the_fault(encoded: bytes, error: str) -> None:
    with pytest.raises(cmd.MalformedCommandError, match=error):
        cmd.PublicationCommand.decode(encoded)


# =================================================================================================
# Configuration: term lengths, MTUs, page sizes, ids, windows
# =================================================================================================
@pytest.mark.parametrize(
    ("term_length", "message"),
    [
        (96 * 1024, r"term_length=98304 is not a power of 2"),
        (TERM_LENGTH + 32, r"term_length=65568 is not a power of 2"),
        (32 * 1024, r"term_length=32768 is less than the minimum 65536 \(64 KiB\)"),
        (0, r"term_length=0 is less than the minimum"),
        (-TERM_LENGTH, r"term_length=-65536 is less than the minimum"),
        (2 * 1024**3, r"term_length=2147483648 is greater than the maximum 1073741824 \(1 GiB\)"),
        (1.5 * 1024**2, r"term_length=1572864.0 must be an int"),
        (True, r"term_length=True must be an int"),
    ],
)
def test_bad_term_lengths_are_rejected_naming_the_value(term_length: Any, message: str) -> None:
    with pytest.raises(lbd.LogBufferError, match=message) as info:
        lbd.check_term_length(term_length)
    assert isinstance(info.value, ConfigurationError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("term_length", [64 * 1024, 128 * 1024, 1024**3])
def test_powers_of_two_from_64_kib_to_1_gib_are_valid_term_lengths(term_length: int) -> None:
    lbd.check_term_length(term_length)
    assert LogParams(term_length=term_length).check().term_length == term_length


@pytest.mark.parametrize(
    ("term_length", "message"),
    [
        (100_000, r"term_length=100000 is not a power of 2"),
        (32 * 1024, r"term_length=32768 is less than the minimum"),
        (2 * 1024**3, r"term_length=2147483648 is greater than the maximum"),
    ],
)
def test_creating_a_log_with_a_bad_term_length_fails_and_leaves_nothing_behind(
    log_name: str, term_length: int, message: str
) -> None:
    with pytest.raises(lbd.LogBufferError, match=message):
        StreamLog.create(log_name, term_length=term_length)
    with pytest.raises(lbd.LogBufferError, match=message):
        LogBuffers.create(log_name, term_length=term_length)
    with pytest.raises(ShmError, match=rf"shared memory '{log_name}' does not exist"):
        Segment.open(log_name)


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


def test_creating_a_log_with_an_mtu_too_big_for_its_terms_fails(log_name: str) -> None:
    with pytest.raises(ValueError, match=r"mtu_length=16384 must be at most the max message length 8192"):
        StreamLog.create(log_name, term_length=TERM_LENGTH, mtu_length=16384)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"page_size": 1000}, r"page_size=1000 must be a power of 2 from 4096 to 1073741824"),
        ({"page_size": 2048}, r"page_size=2048 must be a power of 2"),
        ({"session_id": 2**31}, r"session_id=2147483648 is not a 32-bit signed integer"),
        ({"stream_id": -(2**31) - 1}, r"stream_id=-2147483649 is not a 32-bit signed integer"),
        ({"initial_term_id": 2**32}, r"initial_term_id=4294967296 is not a 32-bit signed integer"),
        (
            {"term_window_length": TERM_LENGTH},
            r"term_window_length=65536 must be within mtu_length..term_length/2 \(32768\)",
        ),
        ({"term_window_length": 64}, r"term_window_length=64 must be within mtu_length"),
    ],
)
def test_bad_log_parameters_are_rejected_naming_the_parameter(params: dict[str, int], message: str) -> None:
    with pytest.raises(lbd.LogBufferError, match=message):
        LogParams(term_length=TERM_LENGTH, **params).check()


# =================================================================================================
# Shared-memory names and segments
# =================================================================================================
@pytest.mark.parametrize("name", ["", "a/b", "/leading-slash", "has space", "x" * 201, "tab\there", "ü", None, 7])
def test_bad_shared_memory_names_are_rejected_naming_the_name(name: Any) -> None:
    message = r"shared memory name=.* is invalid: use 1-200 letters, digits, '\.', '_' or '-' \(no '/'\)"
    with pytest.raises(ShmError, match=message) as info:
        Segment.create(name, 4096)
    assert repr(name) in str(info.value)
    with pytest.raises(ShmError, match=message):
        Segment.open(name)
    with pytest.raises(ShmError, match=message):
        StreamLog.create(name, term_length=TERM_LENGTH)
    with pytest.raises(ShmError, match=message):
        LogBuffers.open(name)


def test_a_name_of_200_allowed_characters_is_valid() -> None:
    from logbuf.shm import check_name

    assert check_name("A-z_0.9" + "x" * 193) == "/A-z_0.9" + "x" * 193


def test_creating_a_log_that_exists_fails_and_keeps_the_existing_one(log: StreamLog, log_name: str) -> None:
    with pytest.raises(ShmError, match=rf"shared memory '{log_name}' already exists"):
        StreamLog.create(log_name, term_length=TERM_LENGTH)
    with StreamLog.open(log_name) as again:  # the original is intact
        assert again.log.term_length == TERM_LENGTH and again.log.session_id == SESSION_ID


def test_opening_a_missing_log_fails_naming_it(log_name: str) -> None:
    with pytest.raises(ShmError, match=rf"shared memory '{log_name}' does not exist"):
        StreamLog.open(log_name)
    with pytest.raises(ShmError, match=rf"shared memory '{log_name}' does not exist"):
        LogBuffers.open(log_name)


def test_opening_a_segment_that_is_not_a_log_fails_naming_it(log_name: str) -> None:
    segment = Segment.create(log_name, 4096)
    try:
        with pytest.raises(
            lbd.LogBufferError,
            match=rf"shared memory '{log_name}' is not a valid log buffer: "
            r"log buffer of 4096 bytes is too short",
        ):
            LogBuffers.open(log_name)
    finally:
        segment.close()


@pytest.mark.parametrize("length", [0, -1])
def test_a_segment_of_no_length_is_rejected(log_name: str, length: int) -> None:
    with pytest.raises(ShmError, match=rf"segment length={length} must be positive"):
        Segment.create(log_name, length)


# =================================================================================================
# Oversize messages and claims
# =================================================================================================
def test_a_message_over_max_message_length_raises_and_appends_nothing(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    max_length = dh.compute_max_message_length(TERM_LENGTH)
    assert pub.max_message_length == max_length == 8192
    before = pub.position
    with pytest.raises(
        ValueError,
        match=r"message length=8193 exceeds max_message_length=8192 "
        r"\(min\(term_length / 8, 16 MiB\) for term_length=65536\)",
    ):
        pub.offer(bytes(max_length + 1))
    assert pub.position == before
    assert pub.offer(bytes(max_length)) == before + dh.compute_fragmented_length(max_length, MAX_PAYLOAD)


@pytest.mark.parametrize("length", [-1, MAX_PAYLOAD + 1, 8192])
def test_a_claim_outside_0_to_max_payload_raises(log: StreamLog, length: int) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    with pytest.raises(ValueError, match=rf"claim length={length} must be within 0..max_payload_length={MAX_PAYLOAD}"):
        pub.try_claim(length, BufferClaim())
    assert pub.position == 0


def test_batches_that_do_not_fit_raise_and_append_nothing(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    with pytest.raises(
        ValueError,
        match=rf"message 1 length={MAX_PAYLOAD + 1} exceeds max_payload_length="
        rf"{MAX_PAYLOAD}; batch messages are not fragmented",
    ):
        pub.offer_batch([b"ok", bytearray(MAX_PAYLOAD + 1)])
    with pytest.raises(ValueError, match=r"batch framed length=8448 exceeds max_message_length=8192"):
        pub.offer_batch([bytes(1000)] * 8)  # 8 frames of 1056 aligned bytes
    with pytest.raises(ValueError, match=r"batch of 65537 messages exceeds the 65536-message batch limit"):
        pub.offer_batch([b""] * 65537)
    with pytest.raises(TypeError, match=r"offer_batch expects a sequence of bytes-like messages"):
        pub.offer_batch(5)
    assert pub.position == 0


# =================================================================================================
# Native atomics: bounds, alignment, writability
# =================================================================================================
READERS_32 = [native.get_int32_volatile]
READERS_64 = [native.get_int64_volatile]
WRITERS_32: list[tuple[Callable[..., Any], tuple[int, ...]]] = [
    (native.put_int32_ordered, (1,)),
    (native.get_and_add_int32, (1,)),
    (native.compare_and_set_int32, (0, 1)),
]
WRITERS_64: list[tuple[Callable[..., Any], tuple[int, ...]]] = [
    (native.put_int64_ordered, (1,)),
    (native.get_and_add_int64, (1,)),
    (native.compare_and_set_int64, (0, 1)),
]
ALL_32 = [(f, ()) for f in READERS_32] + WRITERS_32
ALL_64 = [(f, ()) for f in READERS_64] + WRITERS_64
ALL_OPS = [(f, args, 4) for f, args in ALL_32] + [(f, args, 8) for f, args in ALL_64]
OP_IDS = [f"{f.__name__}" for f, _, _ in ALL_OPS]


@pytest.fixture(params=["bytearray", "mmap"])
def shared(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "bytearray":
        yield bytearray(64)
    else:
        with mmap.mmap(-1, 4096) as mm:
            yield mm


def _out_of_bounds(offset: int, size: int, length: int) -> str:
    return rf"offset={offset} is out of bounds for a {size}-byte access in a buffer of {length} bytes"


@pytest.mark.parametrize(("op", "args", "size"), ALL_OPS, ids=OP_IDS)
def test_negative_offsets_are_out_of_bounds(
    shared: Any, op: Callable[..., Any], args: tuple[int, ...], size: int
) -> None:
    for offset in (-1, -size, -(2**40)):
        with pytest.raises(ValueError, match=_out_of_bounds(offset, size, len(shared))):
            op(shared, offset, *args)


@pytest.mark.parametrize(("op", "args", "size"), ALL_OPS, ids=OP_IDS)
def test_offsets_past_the_end_are_out_of_bounds(
    shared: Any, op: Callable[..., Any], args: tuple[int, ...], size: int
) -> None:
    n = len(shared)
    for offset in (n, n - size + 1, n + 8, 2**40):
        with pytest.raises(ValueError, match=_out_of_bounds(offset, size, n)):
            op(shared, offset, *args)


@pytest.mark.parametrize(("op", "args"), ALL_64, ids=[f.__name__ for f, _ in ALL_64])
def test_a_64_bit_access_at_len_minus_4_is_out_of_bounds(
    shared: Any, op: Callable[..., Any], args: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError, match=_out_of_bounds(len(shared) - 4, 8, len(shared))):
        op(shared, len(shared) - 4, *args)


@pytest.mark.parametrize(("op", "args"), ALL_32, ids=[f.__name__ for f, _ in ALL_32])
def test_a_32_bit_access_at_len_minus_4_is_the_last_valid_one(
    shared: Any, op: Callable[..., Any], args: tuple[int, ...]
) -> None:
    struct.pack_into("<i", shared, len(shared) - 4, 0)
    op(shared, len(shared) - 4, *args)
    assert struct.unpack_from("<i", shared, len(shared) - 4)[0] == (0 if op is native.get_int32_volatile else 1)


@pytest.mark.parametrize(("op", "args", "size"), ALL_OPS, ids=OP_IDS)
def test_misaligned_offsets_are_rejected_naming_the_alignment(
    op: Callable[..., Any], args: tuple[int, ...], size: int
) -> None:
    with mmap.mmap(-1, 4096) as mm:  # page-aligned, so offset alignment is address alignment
        offsets = (1, 2, 3) if size == 4 else (1, 3, 4, 12)
        for offset in offsets:
            with pytest.raises(
                ValueError,
                match=rf"offset={offset} is not {size}-byte aligned "
                r"\(address alignment required for atomic access\)",
            ):
                op(mm, offset, *args)
        assert mm[:] == bytes(4096)  # nothing was written anywhere


@pytest.mark.parametrize(("op", "args"), WRITERS_32 + WRITERS_64, ids=[f.__name__ for f, _ in WRITERS_32 + WRITERS_64])
def test_writes_to_read_only_buffers_are_refused(op: Callable[..., Any], args: tuple[int, ...]) -> None:
    with pytest.raises(BufferError, match=r"not writable"):
        op(bytes(16), 0, *args)
    with pytest.raises(BufferError, match=r"not writable"):
        op(memoryview(bytearray(16)).toreadonly(), 8, *args)
    with mmap.mmap(-1, 4096, prot=mmap.PROT_READ) as mm:
        with pytest.raises(BufferError, match=r"not writable"):
            op(mm, 0, *args)


def test_reads_from_read_only_buffers_are_allowed() -> None:
    raw = struct.pack("<iiq", -7, 0, -(2**40))
    assert native.get_int32_volatile(raw, 0) == -7
    assert native.get_int64_volatile(memoryview(raw).toreadonly(), 8) == -(2**40)


@pytest.mark.parametrize(("op", "args", "size"), ALL_OPS, ids=OP_IDS)
def test_non_buffers_are_rejected(op: Callable[..., Any], args: tuple[int, ...], size: int) -> None:
    with pytest.raises(TypeError, match=r"a bytes-like object is required, not 'int'"):
        op(5, 0, *args)


def test_atomic_values_out_of_range_for_their_width_raise_overflow() -> None:
    buf = bytearray(16)
    with pytest.raises(OverflowError, match=r"int32"):
        native.put_int32_ordered(buf, 0, 2**31)
    with pytest.raises(OverflowError):
        native.put_int64_ordered(buf, 8, 2**63)
    assert buf == bytearray(16)


def test_atomics_do_what_they_say_at_valid_offsets(shared: Any) -> None:
    assert native.get_and_add_int64(shared, 8, 5) == 0
    assert native.get_and_add_int64(shared, 8, -7) == 5
    assert native.get_int64_volatile(shared, 8) == -2
    assert not native.compare_and_set_int64(shared, 8, 0, 9)
    assert native.compare_and_set_int64(shared, 8, -2, 9)
    assert native.get_int64_volatile(shared, 8) == 9
    native.put_int32_ordered(shared, 4, -1)
    assert native.get_and_add_int32(shared, 4, 1) == -1
    assert native.compare_and_set_int32(shared, 4, 0, 2**31 - 1)
    assert struct.unpack_from("<iq", shared, 4) == (2**31 - 1, 9)


def test_positions_reject_misaligned_and_out_of_range_offsets() -> None:
    with pytest.raises(ValueError, match=r"offset=4 is not 8-byte aligned"):
        native.Position(bytearray(16), 4)
    with pytest.raises(ValueError, match=r"offset=16 is out of bounds for a 8-byte access in a buffer of 16 bytes"):
        native.Position(bytearray(16), 16)


_HUGE_OFFSET_SCRIPT = """
from logbuf import native
for op, offset in ((native.get_int32_volatile, 2**63 - 4), (native.get_int64_volatile, 2**63 - 8)):
    try:
        op(bytearray(16), offset)
    except ValueError as e:
        assert "out of bounds" in str(e), e
    else:
        raise AssertionError("no error")
"""


def test_offsets_near_the_largest_ssize_t_are_out_of_bounds_not_a_crash() -> None:
    done = subprocess.run([sys.executable, "-c", _HUGE_OFFSET_SCRIPT], capture_output=True, timeout=60)
    assert done.returncode == 0, f"interpreter died with {done.returncode}: {done.stderr.decode()[-500:]}"


# =================================================================================================
# try_claim: commit, abort, misuse
# =================================================================================================
def test_an_aborted_claim_leaves_a_padding_frame_the_subscriber_skips(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    first = pub.offer(b"before")
    claim = BufferClaim()
    aborted_end = pub.try_claim(100, claim)
    assert aborted_end == frame_end(first, 100)
    claim.buffer[:] = b"x" * 100
    claim.abort()
    last = pub.offer(b"after")
    got: list[tuple[bytes, int]] = []
    assert image.poll(collect(got), 10) == 2  # the padding is not a fragment
    assert got == [(b"before", first), (b"after", last)]
    assert image.position == last
    with log.log.term_buffer(0) as term:  # the aborted frame is still there, as padding of its full length
        frame_length, _v, _flags, type_, term_offset, *_ = dh.HEADER.unpack_from(term, first)
    assert (type_, frame_length, term_offset) == (dh.HDR_TYPE_PAD, 132, first)


def test_a_committed_claim_delivers_its_bytes_reserved_value_and_flags(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication(exclusive=True)
    claim = BufferClaim()
    end = pub.try_claim(5, claim)
    assert claim.length == 5 and claim.flags == dh.UNFRAGMENTED
    claim.buffer[:] = b"12345"
    claim.reserved_value = -99
    claim.commit()
    assert claim.length == 0
    seen: list[dict[str, int]] = []
    got: list[tuple[bytes, int]] = []

    def handler(buffer: memoryview, header: Header) -> None:
        seen.append(header.snapshot())
        collect(got)(buffer, header)

    assert image.poll(handler, 10) == 1
    assert got == [(b"12345", end)]
    assert seen[0]["reserved_value"] == -99 and seen[0]["session_id"] == SESSION_ID
    assert seen[0]["stream_id"] == STREAM_ID


def test_a_claim_used_as_a_context_manager_commits_or_aborts_on_exception(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    claim = BufferClaim()
    pub.try_claim(3, claim)
    with claim:
        claim.buffer[:] = b"abc"
    pub.try_claim(3, claim)
    with pytest.raises(RuntimeError, match="filling failed"):
        with claim:
            claim.buffer[:1] = b"z"
            raise RuntimeError("filling failed")
    last = pub.offer(b"next")
    got: list[tuple[bytes, int]] = []
    image.poll(collect(got), 10)
    assert [payload for payload, _ in got] == [b"abc", b"next"]
    assert image.position == last


def test_a_finished_claim_cannot_be_used_again(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    claim = BufferClaim()
    pub.try_claim(8, claim)
    with pytest.raises(ValueError, match=r"buffer claim is still active: commit\(\) or abort\(\) it first"):
        pub.try_claim(8, claim)
    claim.commit()
    with pytest.raises(ValueError, match=r"buffer claim is not active \(already committed or aborted\)"):
        claim.commit()
    with pytest.raises(ValueError, match=r"buffer claim is not active \(already committed or aborted\)"):
        claim.abort()
    with pytest.raises(ValueError, match=r"buffer claim is not active \(already committed or aborted\)"):
        claim.buffer
    with pytest.raises(ValueError, match=r"buffer claim is not active"):
        claim.reserved_value = 1


# =================================================================================================
# controlled_poll: ABORT, BREAK, COMMIT, CONTINUE
# =================================================================================================
def _actions(image: Image, script: list[Any], got: list[tuple[bytes, int, int]]) -> Callable[..., Any]:
    """A controlled handler returning ``script``'s actions in turn; records (payload, header position, image position)."""

    def handler(buffer: memoryview, header: Header) -> Any:
        got.append((bytes(buffer), header.position, image.position))
        return script.pop(0)

    return handler


@pytest.fixture
def five(log: StreamLog) -> tuple[Image, list[int]]:
    image = log.add_subscriber()
    pub = log.add_publication()
    return image, offer_all(pub, [b"m%d" % i for i in range(5)])


def test_abort_rewinds_the_fragment_and_stops_so_it_is_delivered_again(five: tuple[Image, list[int]]) -> None:
    image, ends = five
    got: list[tuple[bytes, int, int]] = []
    A, C = ControlledPollAction.ABORT, ControlledPollAction.CONTINUE
    assert image.controlled_poll(_actions(image, [A], got), 10) == 0
    assert image.position == 0
    assert image.controlled_poll(_actions(image, [C, C, A], got), 10) == 2
    assert image.position == ends[1]  # fragments continued before the abort stay consumed
    assert image.controlled_poll(_actions(image, [C, C, C], got), 10) == 3
    assert [payload for payload, _, _ in got] == [b"m0", b"m0", b"m1", b"m2", b"m2", b"m3", b"m4"]
    assert image.position == ends[4]


def test_break_consumes_the_fragment_and_stops(five: tuple[Image, list[int]]) -> None:
    image, ends = five
    got: list[tuple[bytes, int, int]] = []
    script: list[Any] = [None, ControlledPollAction.BREAK]
    assert image.controlled_poll(_actions(image, script, got), 10) == 2
    assert image.position == ends[1] and len(got) == 2
    assert image.controlled_poll(_actions(image, [ControlledPollAction.BREAK], got), 10) == 1
    assert got[-1][:2] == (b"m2", ends[2]) and image.position == ends[2]


def test_commit_stores_the_position_at_once_and_continue_does_not(five: tuple[Image, list[int]]) -> None:
    image, ends = five
    got: list[tuple[bytes, int, int]] = []
    C, M = ControlledPollAction.CONTINUE, ControlledPollAction.COMMIT
    assert image.controlled_poll(_actions(image, [C, M, C, None, C], got), 10) == 5
    # image.position as seen from inside each handler call:
    assert [seen for _, _, seen in got] == [0, 0, ends[1], ends[1], ends[1]]
    assert image.position == ends[4]


def test_the_fragment_limit_bounds_a_controlled_poll(five: tuple[Image, list[int]]) -> None:
    image, ends = five
    got: list[tuple[bytes, int, int]] = []
    assert image.controlled_poll(_actions(image, [None] * 3, got), 3) == 3
    assert image.position == ends[2]


def test_a_controlled_handler_returning_something_else_raises_and_counts_the_fragment_delivered(
    five: tuple[Image, list[int]],
) -> None:
    image, ends = five
    got: list[tuple[bytes, int, int]] = []
    with pytest.raises(
        ValueError, match=r"controlled poll handler returned 99; expected ABORT, BREAK, COMMIT or CONTINUE"
    ):
        image.controlled_poll(_actions(image, [None, 99], got), 10)
    assert image.position == ends[1]
    assert image.controlled_poll(_actions(image, [None] * 3, got), 10) == 3
    assert [payload for payload, _, _ in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_aborting_a_reassembled_message_delivers_it_whole_again(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    big = bytes(range(256)) * 12  # 3072 bytes: three fragments
    end = pub.offer(big)
    last = pub.offer(b"small")
    got: list[bytes] = []
    script: list[Any] = [ControlledPollAction.ABORT, None, None]

    def delegate(buffer: memoryview, header: Header) -> Any:
        got.append(bytes(buffer))
        return script.pop(0)

    assembler = ControlledFragmentAssembler(delegate)
    assert image.controlled_poll(assembler, 10) == 2  # B and middle consumed, E aborted
    assert image.position == end - dh.align(3072 - 2 * MAX_PAYLOAD + dh.HEADER_LENGTH)
    assert image.controlled_poll(assembler, 10) == 2
    assert got == [big, big, b"small"]
    assert image.position == last


# =================================================================================================
# block_poll
# =================================================================================================
def test_block_poll_hands_contiguous_whole_frames_and_stops_before_padding(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    ends = offer_all(pub, [b"a", b"bb", b"ccc"])
    claim = BufferClaim()
    pub.try_claim(40, claim)
    claim.abort()
    tail_end = pub.offer(b"dddd")
    blocks: list[tuple[bytes, int, int, int]] = []

    def on_block(block: memoryview, term_offset: int, session_id: int, term_id: int) -> None:
        blocks.append((bytes(block), term_offset, session_id, term_id))

    assert image.block_poll(on_block, TERM_LENGTH) == ends[2]
    block, term_offset, session_id, term_id = blocks[0]
    assert (term_offset, session_id, term_id) == (0, SESSION_ID, 0)
    offsets, lengths = array("i", [0] * 8), array("i", [0] * 8)
    assert native.frame_index(block, offsets, lengths) == 3 == native.count_frames(block)
    assert [block[o : o + n] for o, n in zip(offsets[:3], lengths[:3])] == [b"a", b"bb", b"ccc"]
    # the aborted claim is a padding frame: a block of its own
    assert image.block_poll(on_block, TERM_LENGTH) == 96
    assert native.count_frames(blocks[1][0]) == 0 and native.count_frames(blocks[1][0], include_padding=True) == 1
    assert image.block_poll(on_block, TERM_LENGTH) == 64
    assert blocks[2][0][dh.HEADER_LENGTH : dh.HEADER_LENGTH + 4] == b"dddd" and blocks[2][1] == ends[2] + 96
    assert image.position == tail_end
    assert image.block_poll(on_block, TERM_LENGTH) == 0 and len(blocks) == 3


def test_block_poll_never_exceeds_its_length_limit_nor_splits_a_frame(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    ends = offer_all(pub, [bytes(100)] * 4)  # 160-byte frames
    sizes: list[int] = []
    assert image.block_poll(lambda b, *_: sizes.append(len(b)), 2 * 160 + 100) == 320
    assert image.block_poll(lambda b, *_: sizes.append(len(b)), 159) == 0  # less than one frame: nothing
    assert image.block_poll(lambda b, *_: sizes.append(len(b)), 1000) == 320
    assert sizes == [320, 320] and image.position == ends[3]


# =================================================================================================
# Exceptions in handlers: delivered fragments stay consumed, the raising one included
# =================================================================================================
class Boom(Exception):
    pass


def test_a_poll_handler_exception_propagates_and_keeps_the_delivered_fragments_consumed(
    five: tuple[Image, list[int]],
) -> None:
    image, ends = five
    got: list[bytes] = []

    def handler(buffer: memoryview, header: Header) -> None:
        got.append(bytes(buffer))
        if bytes(buffer) == b"m2":
            raise Boom("m2")

    with pytest.raises(Boom, match="m2"):
        image.poll(handler, 10)
    assert image.position == ends[2]  # m0, m1 and the raising m2 count as delivered
    assert image.poll(handler, 10) == 2
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4"]  # no duplicate, nothing lost


def test_a_controlled_poll_handler_exception_keeps_the_fragments_delivered(five: tuple[Image, list[int]]) -> None:
    image, ends = five
    got: list[bytes] = []

    def handler(buffer: memoryview, header: Header) -> Any:
        got.append(bytes(buffer))
        if bytes(buffer) == b"m1":
            raise Boom("m1")
        return ControlledPollAction.CONTINUE

    with pytest.raises(Boom):
        image.controlled_poll(handler, 10)
    assert image.position == ends[1]
    assert image.controlled_poll(handler, 10) == 3
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_a_block_handler_exception_moves_the_position_past_the_block(five: tuple[Image, list[int]]) -> None:
    image, ends = five

    def raising(block: memoryview, term_offset: int, session_id: int, term_id: int) -> None:
        raise Boom("block")

    with pytest.raises(Boom):
        image.block_poll(raising, 2 * 64)
    assert image.position == ends[1]
    got: list[tuple[bytes, int]] = []
    assert image.poll(collect(got), 10) == 3
    assert [p for p, _ in got] == [b"m2", b"m3", b"m4"]


def test_an_exception_from_a_reassembled_message_does_not_redeliver_it(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    big = bytes(3000)
    offer_all(pub, [big, b"after"])
    got: list[bytes] = []

    def delegate(buffer: memoryview, header: Header) -> None:
        got.append(bytes(buffer))
        if len(buffer) == 3000:
            raise Boom("big")

    assembler = FragmentAssembler(delegate)
    with pytest.raises(Boom):
        image.poll(assembler, 10)
    image.poll(assembler, 10)
    assert got == [big, b"after"]


# =================================================================================================
# Offer results: CLOSED, NOT_CONNECTED, BACK_PRESSURED, MAX_POSITION_EXCEEDED
# =================================================================================================
def test_a_closed_publication_returns_closed_for_every_append(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    pub.offer(b"x")
    pub.close()
    assert pub.is_closed and not pub.is_connected
    assert pub.offer(b"y") == OfferResult.CLOSED
    assert pub.offer_batch([b"y"]) == OfferResult.CLOSED
    assert pub.try_claim(1, BufferClaim()) == OfferResult.CLOSED
    assert pub.position == OfferResult.CLOSED == pub.position_limit
    assert log.log.tail_position() == 64  # nothing more was written
    pub.close()  # closing twice is harmless
    assert repr(pub) == "ConcurrentPublication(closed)"


def test_a_closed_image_polls_nothing_and_refuses_its_position(log: StreamLog) -> None:
    image = log.add_subscriber()
    log.add_publication().offer(b"x")
    image.close()
    assert image.poll(collect([]), 10) == 0
    assert image.controlled_poll(collect([]), 10) == 0
    assert image.block_poll(lambda *a: None, 1024) == 0
    with pytest.raises(ValueError, match="image is closed"):
        image.position


def test_moving_an_image_position_must_be_aligned_and_forward(log: StreamLog) -> None:
    image = log.add_subscriber()
    ends = offer_all(log.add_publication(), [b"a", b"b"])
    with pytest.raises(ValueError, match=r"position=33 is not a multiple of 32"):
        image.position = 33
    image.position = ends[0]
    with pytest.raises(ValueError, match=rf"position=0 is behind the current position {ends[0]}"):
        image.position = 0
    got: list[tuple[bytes, int]] = []
    image.poll(collect(got), 10)
    assert got == [(b"b", ends[1])]


def test_without_a_subscriber_appends_return_not_connected_and_write_nothing(log: StreamLog) -> None:
    for exclusive in (False, True):
        pub = log.add_publication(exclusive=exclusive)
        assert not pub.is_connected
        assert pub.offer(b"x") == OfferResult.NOT_CONNECTED
        assert pub.offer_batch([b"x", b"y"]) == OfferResult.NOT_CONNECTED
        assert pub.try_claim(4, BufferClaim()) == OfferResult.NOT_CONNECTED
        assert pub.position == 0
    with log.log.term_buffer(0) as term:
        assert bytes(term[:64]) == bytes(64)


def test_after_the_last_subscriber_leaves_appends_become_not_connected_never_back_pressured(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    assert pub.is_connected
    log.remove_subscriber(image)
    results = set()
    for _ in range(2000):
        result = pub.offer(bytes(200))
        results.add(result if result < 0 else "ok")
        if result == OfferResult.NOT_CONNECTED:
            break
    assert OfferResult.NOT_CONNECTED in results and OfferResult.BACK_PRESSURED not in results
    assert not pub.is_connected
    assert pub.position <= TERM_LENGTH // 2 + MTU_LENGTH  # it stopped at the limit the subscriber left


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_full_window_back_pressures_and_never_overwrites_unread_data(log: StreamLog, exclusive: bool) -> None:
    image = log.add_subscriber()
    pub = log.add_publication(exclusive=exclusive)
    window = TERM_LENGTH // 2
    sent: list[bytes] = []
    got: list[tuple[bytes, int]] = []
    serial = 0
    for _cycle in range(8):  # 8 windows = 4 terms: every partition is reused while the subscriber lags
        start = image.position
        while True:
            body = serial.to_bytes(4, "little") * (1 + serial % 300)
            result = pub.offer(body)
            if result == OfferResult.BACK_PRESSURED:
                break
            assert result > 0, OfferResult(result)
            sent.append(body)
            serial += 1
        # stopped at the limit: the slowest subscriber's position plus the term window
        assert pub.position_limit == start + window
        assert start + window <= pub.position < start + window + MTU_LENGTH
        tail = pub.position
        assert pub.offer(b"x") == OfferResult.BACK_PRESSURED
        assert pub.try_claim(1, BufferClaim()) == OfferResult.BACK_PRESSURED
        assert pub.offer_batch([b"x"]) == OfferResult.BACK_PRESSURED
        assert pub.position == tail == log.log.tail_position()  # back-pressure writes nothing
        while image.position < tail:
            image.poll(collect(got), 100)
        assert [payload for payload, _ in got] == sent  # all intact, in order, none overwritten
    assert image.position > 3 * TERM_LENGTH


def test_back_pressure_waits_for_the_slowest_of_two_subscribers(log: StreamLog) -> None:
    fast, slow = log.add_subscriber(), log.add_subscriber()
    pub = log.add_publication()
    sent, fast_got, slow_got = [], [], []  # type: ignore[var-annotated]
    while (result := pub.offer(bytes(500))) > 0:
        sent.append(result)
        fast.poll(collect(fast_got), 100)
    assert result == OfferResult.BACK_PRESSURED
    assert fast.position == pub.position and slow.position == 0
    assert pub.position_limit == TERM_LENGTH // 2
    while slow.poll(collect(slow_got), 100):
        pass
    assert [p for _, p in slow_got] == [p for _, p in fast_got] == sent
    assert pub.offer(bytes(500)) > 0


@pytest.fixture
def last_term(log_name: str) -> Iterator[LogBuffers]:
    """A log moved to 64 bytes before the largest position it can reach, connected, with no limit."""
    with LogBuffers.create(log_name, term_length=TERM_LENGTH) as logbuf:
        logbuf.seek_to(lbd._int32(logbuf.initial_term_id + 2**31 - 1), TERM_LENGTH - 64)
        logbuf.set_connected(True)
        yield logbuf
    Segment.unlink(log_name)


def _unlimited() -> bytearray:
    limit = bytearray(8)
    struct.pack_into("<q", limit, 0, 2**63 - 1)
    return limit


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_message_past_the_largest_possible_position_returns_max_position_exceeded(
    last_term: LogBuffers, exclusive: bool
) -> None:
    pub = Publication(last_term.view, _unlimited(), 0, exclusive)
    try:
        assert pub.max_possible_position == TERM_LENGTH * 2**31 == lbd.max_possible_position(TERM_LENGTH)
        assert pub.position == pub.max_possible_position - 64
        assert pub.offer(bytes(100)) == OfferResult.MAX_POSITION_EXCEEDED  # would need one more term
        assert pub.try_claim(100, BufferClaim()) == OfferResult.MAX_POSITION_EXCEEDED
    finally:
        pub.close()


@pytest.mark.parametrize("exclusive", [False, True])
def test_the_last_frame_that_fits_is_accepted_then_max_position_exceeded(
    last_term: LogBuffers, exclusive: bool
) -> None:
    pub = Publication(last_term.view, _unlimited(), 0, exclusive)
    try:
        assert pub.offer(bytes(32)) == pub.max_possible_position  # 64 bytes: ends the last term exactly
        assert pub.offer(b"") == OfferResult.MAX_POSITION_EXCEEDED
        assert pub.offer_batch([b""]) == OfferResult.MAX_POSITION_EXCEEDED
    finally:
        pub.close()


def test_a_batch_that_fails_releases_every_buffer_it_borrowed(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    first, big = bytearray(b"abc"), bytearray(MAX_PAYLOAD + 1)
    with pytest.raises(TypeError, match=r"a bytes-like object is required, not 'int'"):
        pub.offer_batch([first, 5])
    with pytest.raises(ValueError, match=r"message 1 length=1377 exceeds max_payload_length=1376"):
        pub.offer_batch([first, big])
    first.append(1)  # would raise BufferError if a view of it were still exported
    big.append(1)
    assert pub.position == 0


@pytest.mark.parametrize("position", [33, -32])
def test_joining_at_a_bad_position_is_rejected(log: StreamLog, position: int) -> None:
    with pytest.raises(ValueError, match=rf"join_position={position} must be a non-negative multiple of 32"):
        log.add_subscriber(join_position=position)


def test_cpu_lists_parse_and_name_what_is_wrong() -> None:
    from logbuf.agent import parse_cpu_list
    from logbuf.errors import ConfigurationError

    assert parse_cpu_list("") == frozenset()
    assert parse_cpu_list("0") == {0}
    assert parse_cpu_list("0-1") == {0, 1} == parse_cpu_list("1, 0")
    with pytest.raises(ConfigurationError, match=r"'x' is not a CPU number or a range like 0-3"):
        parse_cpu_list("0,x")
    with pytest.raises(ConfigurationError, match=r"'3-1' is not a CPU number"):
        parse_cpu_list("3-1")
    with pytest.raises(ConfigurationError, match=r"CPU \[4096\] not available"):
        parse_cpu_list("4096")
