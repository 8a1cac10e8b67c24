"""The native core's edges: the Header flyweight and term_read, LogView's checks, and the atomics'
bounds, alignment and writability (a bad offset is a ValueError naming it, never a crash).
"""

from __future__ import annotations

import mmap
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from logbuf import native
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.logbuffer.image import Header
from tests.support.logs import TERM_LENGTH, collect


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
