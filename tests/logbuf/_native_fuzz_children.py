"""Child-process bodies of the native fuzz tests (started with multiprocessing's ``spawn``).

Each ``FUZZ[name]`` is a Hypothesis test that calls one native entry point taking a length or an
offset with hostile values (0x7fffffff, negative, unaligned, past the term, the int32 and int64 extremes)
and buffers filled with random bytes and crafted frame headers (hostile lengths and types after a run of
good frames, so the scans get going). A call must return or raise ValueError (OSError for a file
descriptor); what it returns is checked against the buffer it was given (an offset inside the term, a
count no larger than the frames that fit, ...). Values outside a parameter's C type (an offset beyond
int64) are refused by Cython with OverflowError before any native code runs; the strategies stay inside.

:func:`child_main` runs one body in a child process and reports ``None`` or a traceback on ``out``;
the parent (``test_native_fuzz.py``) turns a crash (a signal) or a hang into a failure naming the seed.
"""

from __future__ import annotations

import faulthandler
import mmap
import socket
import struct
import sys
import traceback
from collections.abc import Callable
from typing import Any

import hypothesis
import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from logbuf import native
from logbuf.driver import _udp
from logbuf.errors import CorruptLogError
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.logbuffer.publication import OfferResult

TERM = 64 * 1024
INITIAL_TERM_ID = 7
SESSION_ID, STREAM_ID = 0x1234, 9
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
C_INT_LIMITS = (INT32_MIN, INT32_MAX)
GUARD = 64 * 1024

HOSTILE_INT32 = [
    0, 1, -1, 7, 8, 31, 32, 33, 63, 64, -32, -33, TERM - 64, TERM - 33, TERM - 32, TERM - 1, TERM, TERM + 1,
    TERM + 32, 2 * TERM, 0x7FFFFFE0, 0x7FFFFFE1, INT32_MAX, INT32_MIN, INT32_MIN + 32,
]  # fmt: skip
HOSTILE_INT64 = [*HOSTILE_INT32, 2**31, 2**32, 2**32 - 32, 2**62, -(2**62), INT64_MAX, INT64_MIN]

int32s = st.one_of(st.sampled_from(HOSTILE_INT32), st.integers(INT32_MIN, INT32_MAX))
int64s = st.one_of(st.sampled_from(HOSTILE_INT64), st.integers(INT64_MIN, INT64_MAX))
term_offsets = st.one_of(st.just(0), st.integers(0, TERM // 32).map(lambda i: i * 32), int32s)
frame_lengths = st.one_of(
    st.sampled_from([INT32_MAX, 0x7FFFFFE1, 0x7FFFFFE0, -1, INT32_MIN, 1, 31, 33, TERM, TERM - 31, TERM + 1, 2 * TERM]),
    st.integers(32, 2048),
    st.integers(INT32_MIN, INT32_MAX),
)
frame_types = st.sampled_from([dh.HDR_TYPE_PAD, dh.HDR_TYPE_DATA, 2, 0xFFFF])

FUZZ: dict[str, Callable[[], None]] = {}


def fuzz(test: Callable[[], None]) -> Callable[[], None]:
    FUZZ[test.__name__.removeprefix("fuzz_")] = test
    return test


@given(st.none())
def _segfault(_: None) -> None:
    """For the harness's own test: a crash the parent must report."""
    import ctypes

    ctypes.string_at(0)


@given(st.none())
def _fails(_: None) -> None:
    """For the harness's own test: a failure the parent must report with its traceback."""
    raise AssertionError("deliberately")


HARNESS_CHECKS: dict[str, Callable[[], None]] = {"_segfault": _segfault, "_fails": _fails}


def child_main(name: str, seed: int, examples: int, out: Any) -> None:
    """Run ``FUZZ[name]`` with ``examples`` examples from ``seed``; report None or a traceback on ``out``."""
    if name != "_segfault":
        faulthandler.enable()  # a crash prints the Python stack of the call that crashed
    try:
        test = FUZZ[name] if name in FUZZ else HARNESS_CHECKS[name]
        test = settings(max_examples=examples, database=None, deadline=None, suppress_health_check=list(HealthCheck))(
            test
        )
        hypothesis.seed(seed)(test)()
    except BaseException:
        out.put(traceback.format_exc())
        sys.exit(1)
    out.put(None)


# -- buffers -------------------------------------------------------------------------------------------
def put_header(
    buffer: Any,
    at: int,
    frame_length: int,
    frame_type: int = dh.HDR_TYPE_DATA,
    *,
    term_offset: int | None = None,
    version: int = 0,
    flags: int = dh.UNFRAGMENTED,
) -> None:
    """A frame header at ``at`` (32 bytes, which must fit): fields wrapped into their widths."""
    dh.HEADER.pack_into(
        buffer,
        at,
        _int32(frame_length),
        version & 0xFF,
        flags & 0xFF,
        frame_type & 0xFFFF,
        _int32(at if term_offset is None else term_offset),
        SESSION_ID,
        STREAM_ID,
        INITIAL_TERM_ID,
        0,
    )


def _int32(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31


@st.composite
def hostile_frames(draw: st.DrawFn, buffer: Any, length: int) -> None:
    """Good frames from 0, then crafted headers with hostile lengths and types, then random bytes."""
    offset = 0
    for _ in range(draw(st.integers(0, 6))):
        frame_length = draw(st.integers(dh.HEADER_LENGTH, 1408))
        if offset + dh.align(frame_length) > length:
            break
        put_header(buffer, offset, frame_length)
        offset += dh.align(frame_length)
    places = st.one_of(
        st.just(offset),
        st.sampled_from([0, length - 32, length - 64]),
        st.integers(0, max(length // 32 - 1, 0)).map(lambda i: i * 32),
    )
    for _ in range(draw(st.integers(0, 4))):
        at = draw(places)
        if 0 <= at <= length - dh.HEADER_LENGTH:
            put_header(buffer, at, draw(frame_lengths), draw(frame_types), version=draw(st.sampled_from([0, 1])))
    if length and draw(st.booleans()):
        blob = draw(st.binary(min_size=1, max_size=min(512, length)))
        at = draw(st.integers(0, length - len(blob)))
        buffer[at : at + len(blob)] = blob


@st.composite
def terms(draw: st.DrawFn) -> mmap.mmap:
    """A 64 KiB term (page-aligned, as in a real log) holding hostile frames."""
    term = mmap.mmap(-1, TERM)
    draw(hostile_frames(term, TERM))
    return term


def crafted_term(*frames: tuple[int, int, int]) -> mmap.mmap:
    """A term with the given (offset, frame length, type) headers, for explicit examples."""
    term = mmap.mmap(-1, TERM)
    for at, frame_length, frame_type in frames:
        put_header(term, at, frame_length, frame_type)
    return term


# A frame length of 0x7fffffff overflowed the int32 alignment and sent the offset negative.
HUGE_FRAME = crafted_term((0, 64, dh.HDR_TYPE_DATA), (64, INT32_MAX, dh.HDR_TYPE_DATA))
HUGE_PAD = crafted_term((0, INT32_MAX, dh.HDR_TYPE_PAD))
PAST_THE_END = crafted_term((TERM - 32, 1024, dh.HDR_TYPE_DATA))  # fits the MTU, not the term


@st.composite
def blocks(draw: st.DrawFn) -> memoryview:
    """A block of 0..2048 bytes ending at the end of a mapping (so a read past it can fault)."""
    length = draw(st.integers(0, 2048))
    mapping = mmap.mmap(-1, 4096)
    block = memoryview(mapping)[4096 - length :]
    draw(hostile_frames(block, length))
    return block


@st.composite
def datagrams(draw: st.DrawFn) -> bytes:
    """1-4 frames as the receiver gets them: consecutive DATA frames, maybe a PAD header, hostile fields."""
    start = draw(term_offsets)
    out = bytearray()
    expected = start
    for _ in range(draw(st.integers(1, 4))):
        frame_type = draw(frame_types)
        frame_length = draw(st.one_of(frame_lengths, st.integers(0, 256)))
        header = bytearray(32)
        put_header(header, 0, frame_length, frame_type, term_offset=expected, version=draw(st.sampled_from([0, 0, 1])))
        body_length = 0 if frame_type != dh.HDR_TYPE_DATA else draw(st.integers(0, 300))
        out += header + draw(st.binary(min_size=body_length, max_size=body_length))
        expected += dh.align(32 + body_length)
    cut = draw(st.integers(0, len(out)))
    return bytes(out[:cut] if draw(st.booleans()) else out)


def make_log(mtu: int = 1408, term_length: int = TERM) -> mmap.mmap:
    """A log mapping (three terms and metadata) laid out by hand, so tests can make any field hostile."""
    log = mmap.mmap(-1, 3 * term_length + lbd.LOG_META_DATA_LENGTH)
    meta = 3 * term_length
    struct.pack_into("=i", log, meta + lbd.LOG_TERM_LENGTH_OFFSET, term_length)
    struct.pack_into("=i", log, meta + lbd.LOG_MTU_LENGTH_OFFSET, _int32(mtu))
    struct.pack_into("=i", log, meta + lbd.LOG_INITIAL_TERM_ID_OFFSET, INITIAL_TERM_ID)
    struct.pack_into("=i", log, meta + lbd.LOG_IS_CONNECTED_OFFSET, 1)
    put_header(log, meta + lbd.LOG_DEFAULT_FRAME_HEADER_OFFSET, 0, term_offset=0)
    for index in range(lbd.PARTITION_COUNT):  # as Aeron initialises them: partition i>0 awaits its rotation
        term_id = INITIAL_TERM_ID if index == 0 else INITIAL_TERM_ID + index - lbd.PARTITION_COUNT
        struct.pack_into("=q", log, meta + lbd.TERM_TAIL_COUNTERS_OFFSET + 8 * index, lbd.pack_tail(term_id, 0))
    return log


def counter(value: int) -> mmap.mmap:
    buffer = mmap.mmap(-1, 4096)
    struct.pack_into("=q", buffer, 0, value)
    return buffer


def read_q(buffer: Any, offset: int = 0) -> int:
    value: int = struct.unpack_from("=q", buffer, offset)[0]
    return value


# -- atomics -------------------------------------------------------------------------------------------
ATOMICS: list[tuple[Callable[..., Any], int, tuple[Any, ...]]] = [
    (native.get_int32_volatile, 4, ()),
    (native.get_int64_volatile, 8, ()),
    (native.put_int32_ordered, 4, (5,)),
    (native.put_int64_ordered, 8, (5,)),
    (native.get_and_add_int32, 4, (1,)),
    (native.get_and_add_int64, 8, (1,)),
    (native.compare_and_set_int32, 4, (0, 1)),
    (native.compare_and_set_int64, 8, (0, 1)),
]


@fuzz
@given(
    st.sampled_from(range(len(ATOMICS))),
    st.sampled_from([0, 1, 3, 4, 7, 8, 12, 4096]),
    st.integers(0, 7),
    int64s,
)
def fuzz_atomics(which: int, size: int, shift: int, offset: int) -> None:
    function, width, args = ATOMICS[which]
    mapping = mmap.mmap(-1, 8192)
    buffer = memoryview(mapping)[8192 - size - shift : 8192 - shift]  # ends near the end of the mapping
    try:
        function(buffer, offset, *args)
    except ValueError:
        assert not (0 <= offset <= size - width and (8192 - size - shift + offset) % width == 0)
        return
    assert 0 <= offset <= size - width, f"{function.__name__} accepted offset={offset} in {size} bytes"


@fuzz
@given(st.sampled_from([0, 7, 8, 16, 4096]), int64s, int64s)
def fuzz_position(size: int, offset: int, value: int) -> None:
    buffer = memoryview(mmap.mmap(-1, 8192))[8192 - size :]
    try:
        position = native.Position(buffer, offset)
    except ValueError:
        return
    assert 0 <= offset <= size - 8
    position.set_ordered(value)
    assert position.get_volatile() == value == position.get()
    position.propose_max_ordered(value + 1 if value < INT64_MAX else value)
    position.close()


# -- term algorithms -----------------------------------------------------------------------------------
@fuzz
@given(terms(), term_offsets, int32s)
@example(HUGE_FRAME, 0, TERM)
@example(HUGE_PAD, 0, 64)
def fuzz_term_scan_block(term: mmap.mmap, term_offset: int, limit_offset: int) -> None:
    try:
        end = native.term_scan_block(term, term_offset, limit_offset)
    except ValueError:
        assert not (0 <= term_offset <= TERM and term_offset % 32 == 0)
        return
    assert term_offset <= end <= TERM and end % 32 == 0, (term_offset, limit_offset, end)


@fuzz
@given(terms(), term_offsets, int32s)
@example(HUGE_FRAME, 64, 1408)
@example(HUGE_PAD, 0, 1408)
@example(PAST_THE_END, TERM - 32, 1408)
def fuzz_term_scan_for_availability(term: mmap.mmap, term_offset: int, max_length: int) -> None:
    try:
        available = native.term_scan_for_availability(term, term_offset, max_length)
    except ValueError:
        return
    assert 0 <= available <= TERM - term_offset and available % 32 == 0, (term_offset, max_length, available)


@fuzz
@given(terms(), term_offsets, int32s, int32s)
@example(HUGE_FRAME, 0, 10, 0)
@example(PAST_THE_END, TERM - 32, 10, 0)
def fuzz_term_read(term: mmap.mmap, term_offset: int, fragment_limit: int, initial_term_id: int) -> None:
    seen: list[tuple[int, int, int]] = []

    def handler(payload: memoryview, header: native.Header) -> None:
        bytes(payload)
        seen.append((header.frame_offset, header.frame_length, len(payload)))
        assert header.snapshot()["position"] == header.position

    try:
        fragments, end = native.term_read(term, term_offset, handler, fragment_limit, native.Header(), initial_term_id)
    except ValueError:
        return
    assert fragments == len(seen) <= max(fragment_limit, 0)
    assert term_offset <= end <= TERM
    for frame_offset, frame_length, payload_length in seen:
        assert frame_offset + dh.align(frame_length) <= TERM and 0 <= payload_length <= TERM - frame_offset - 32


@fuzz
@given(terms(), term_offsets, int32s)
@example(HUGE_FRAME, 0, TERM)
def fuzz_term_gap_scan(term: mmap.mmap, rebuild_offset: int, hwm_offset: int) -> None:
    try:
        end, gap = native.term_gap_scan(term, rebuild_offset, hwm_offset)
    except ValueError:
        return
    assert rebuild_offset <= end <= TERM and gap >= 0 and end + gap <= TERM, (rebuild_offset, hwm_offset, end, gap)


@fuzz
@given(terms(), term_offsets, datagrams())
def fuzz_term_rebuild_insert(term: mmap.mmap, term_offset: int, packet: bytes) -> None:
    try:
        inserted = native.term_rebuild_insert(term, term_offset, packet)
    except ValueError:
        return
    assert 0 <= term_offset <= TERM - max(len(packet), 32)
    if inserted:
        assert term[term_offset : term_offset + len(packet)] == packet


@fuzz
@given(datagrams(), st.one_of(st.just(TERM), st.just(0), int32s))
def fuzz_check_data_datagram(packet: bytes, term_length: int) -> None:
    covered = native.check_data_datagram(packet, term_length)
    assert covered >= -6
    if covered > 0 and term_length > 0:
        first = struct.unpack_from("<i", packet, dh.TERM_OFFSET_FIELD_OFFSET)[0]
        assert 0 <= first and first + covered <= term_length, (first, covered, term_length)


@fuzz
@given(blocks(), st.booleans())
def fuzz_count_frames(block: memoryview, include_padding: bool) -> None:
    assert 0 <= native.count_frames(block, include_padding) <= len(block) // 32


@fuzz
@given(blocks())
def fuzz_reserved_value_bounds(block: memoryview) -> None:
    n, low, high = native.reserved_value_bounds(block)
    assert 0 <= n <= len(block) // 32
    assert (low, high) == (0, 0) if n == 0 else low <= high


@fuzz
@given(blocks(), st.integers(0, 80), st.integers(0, 80))
def fuzz_frame_index(block: memoryview, offsets_length: int, lengths_length: int) -> None:
    offsets = np.full(offsets_length, -7, dtype=np.int32)
    lengths = np.full(lengths_length, -7, dtype=np.int32)
    n = native.frame_index(block, offsets, lengths)
    assert 0 <= n <= min(offsets_length, lengths_length, len(block) // 32)
    assert all(32 <= offset <= len(block) and offset % 32 == 0 for offset in offsets[:n].tolist())


@fuzz
@given(st.sampled_from([0, 8, 100, TERM]), st.integers(0, 7), int64s, int64s)
def fuzz_term_clean(size: int, shift: int, offset: int, length: int) -> None:
    mapping = mmap.mmap(-1, TERM + 4096)
    mapping[:] = b"\xab" * len(mapping)
    buffer = memoryview(mapping)[len(mapping) - size - shift : len(mapping) - shift]
    try:
        native.term_clean(buffer, offset, length)
    except ValueError:
        return
    assert 0 <= offset and 0 <= length and offset + length <= size
    assert bytes(buffer[offset : offset + length]) == bytes(length)
    assert bytes(buffer[offset + length :]) == b"\xab" * (size - offset - length)


@fuzz
@given(
    terms(),
    st.lists(int64s, min_size=3, max_size=3),
    st.integers(-1, 3),
    st.sampled_from([0, 8, 31, 32, 64]),
    st.one_of(st.integers(0, 2048), st.sampled_from([TERM - 32, TERM - 31, TERM, TERM + 1])),
)
@example(crafted_term(), [TERM - 8, 0, 0], 0, 32, 100)  # a tail off a frame boundary: no room for a PAD header
def fuzz_term_append_unfragmented(
    term: mmap.mmap, raw_tails: list[int], partition: int, template_length: int, payload_length: int
) -> None:
    metadata = memoryview(make_log())[3 * TERM :]
    for index, raw_tail in enumerate(raw_tails):
        struct.pack_into("=q", metadata, 8 * index, raw_tail)
    template = bytes(template_length)
    try:
        result = native.term_append_unfragmented(metadata, partition, term, template, bytes(payload_length), 5)
    except ValueError:
        assert not (0 <= partition < 3) or template_length < 32 or payload_length > TERM - 32
        return
    term_offset = raw_tails[partition] & 0xFFFFFFFF
    if result == -2:
        assert term_offset + dh.align(payload_length + 32) > TERM
    else:
        assert result == term_offset + dh.align(payload_length + 32) <= TERM


@fuzz
@given(st.lists(int64s, min_size=3, max_size=3), int32s, int32s, int32s)
@example([0, 0, 0], -2, -2, 2)  # a negative term count once picked partition -1: a tail inside term 2
def fuzz_rotate_log(raw_tails: list[int], active_term_count: int, term_count: int, term_id: int) -> None:
    log = make_log()
    metadata = memoryview(log)[3 * TERM :]
    for index, raw_tail in enumerate(raw_tails):
        struct.pack_into("=q", metadata, 8 * index, raw_tail)
    struct.pack_into("=i", metadata, lbd.LOG_ACTIVE_TERM_COUNT_OFFSET, active_term_count)
    before = bytes(log[: 3 * TERM])
    won = native.rotate_log(metadata, term_count, term_id)
    assert won == (active_term_count == term_count)
    assert bytes(log[: 3 * TERM]) == before  # only the metadata is touched


# -- log, image and publication cores ----------------------------------------------------------------------
@fuzz
@given(
    st.sampled_from([0, 4096, 3 * TERM, 3 * TERM + 4096, 6 * TERM + 4096, 3 * 2 * TERM + 4096 + 4096]),
    st.sampled_from([0, 1, 6 * TERM + 4096]) | int32s,
    int32s,
)
def fuzz_log_view(size: int, meta_at: int, term_length: int) -> None:
    mapping = mmap.mmap(-1, max(size, 1))
    if 0 <= meta_at <= size - lbd.LOG_META_DATA_LENGTH:
        struct.pack_into("=i", mapping, meta_at + lbd.LOG_TERM_LENGTH_OFFSET, term_length)
    buffer = memoryview(mapping)[:size]
    try:
        log = native.LogView(buffer)
    except ValueError:
        return
    assert 3 * log.term_length + lbd.LOG_META_DATA_LENGTH <= size
    assert len(log.term_buffer(2)) == log.term_length and len(log.metadata()) == lbd.LOG_META_DATA_LENGTH
    log.close()


image_ops = st.lists(
    st.tuples(st.sampled_from(["poll", "controlled_poll", "block_poll"]), int32s, st.sampled_from([None, 1, 2, 3, 4])),
    max_size=6,
)


@fuzz
@given(terms(), st.one_of(int64s, st.integers(0, 4 * TERM).map(lambda p: p * 32 % (8 * TERM))), image_ops)
@example(HUGE_FRAME, 0, [("poll", 10, None), ("block_poll", TERM, None), ("controlled_poll", 10, None)])
@example(HUGE_PAD, 0, [("block_poll", 64, None)])
@example(HUGE_FRAME, -TERM, [("poll", 10, None)])  # a negative position once picked partition -1
def fuzz_image_polls(term: mmap.mmap, position: int, ops: list[tuple[str, int, int | None]]) -> None:
    log = make_log()
    for index in range(3):
        log[index * TERM : (index + 1) * TERM] = term
    positions = counter(position)
    view = native.LogView(log)
    image = native.ImageCore(view, positions, 0)

    def fragment(payload: memoryview, header: native.Header) -> None:
        assert len(payload) == header.frame_length - 32 >= 0
        bytes(payload)
        assert header.frame_offset + dh.align(header.frame_length) <= TERM

    for kind, limit, action in ops:
        before = read_q(positions)
        try:
            if kind == "poll":
                result = image.poll(fragment, limit)
            elif kind == "controlled_poll":
                result = image.controlled_poll(lambda p, h: fragment(p, h) or action, limit)
            else:
                result = image.block_poll(lambda block, *ids: bytes(block), limit)
        except CorruptLogError as e:  # an impossible frame length at the position: it stays there
            assert read_q(positions) == before == e.position and not 32 <= e.frame_length <= TERM - (
                before & (TERM - 1)
            )
            continue
        except ValueError:
            assert before % 32 != 0
            continue
        moved = read_q(positions) - before
        assert 0 <= moved <= TERM - (before & (TERM - 1)), (kind, limit, before, moved)
        assert result >= 0 and (kind != "block_poll" or result == moved)
    image.close()
    view.close()


publication_ops = st.lists(
    st.tuples(
        st.sampled_from(["offer", "offer_batch", "try_claim"]),
        st.one_of(st.integers(0, 3000), st.sampled_from([TERM // 8, TERM // 8 + 1, TERM])),
        st.booleans(),
    ),
    max_size=8,
)


@fuzz
@given(
    st.lists(int64s, min_size=3, max_size=3),
    int32s,
    st.one_of(st.sampled_from([0, 32, 33, 64, 1408, 8192, 65504, 65536, -1]), int32s),
    st.booleans(),
    publication_ops,
)
@example([(INITIAL_TERM_ID << 32) | (TERM - 8), 0, 0], 0, 1408, False, [("offer", 100, True)])
@example([(INITIAL_TERM_ID << 32) | (TERM - 8), 0, 0], 0, 1408, True, [("offer", 100, True)])
def fuzz_publication(
    raw_tails: list[int], active_term_count: int, mtu: int, exclusive: bool, ops: list[tuple[str, int, bool]]
) -> None:
    log = make_log(mtu=mtu)
    meta = 3 * TERM
    for index, raw_tail in enumerate(raw_tails):
        struct.pack_into("=q", log, meta + 8 * index, raw_tail)
    struct.pack_into("=i", log, meta + lbd.LOG_ACTIVE_TERM_COUNT_OFFSET, active_term_count)
    limit = counter(2**62)
    view = native.LogView(log)
    try:
        publication = native.PublicationCore(view, limit, 0, exclusive)
    except ValueError:
        assert not (32 < mtu <= 65504 and mtu % 32 == 0)
        return
    results = {int(r) for r in OfferResult}
    for kind, length, commit in ops:
        try:
            if kind == "offer":
                result = publication.offer(bytes(length))
            elif kind == "offer_batch":
                result = publication.offer_batch([bytes(length % 200)] * (1 + length % 50))
            else:
                claim = native.BufferClaim()
                result = publication.try_claim(length, claim)
                if result > 0:
                    claim.buffer[:] = bytes(len(claim.buffer))
                    if commit:
                        claim.commit()
                    else:
                        claim.abort()
        except ValueError:
            continue
        # A position <= 0 only comes from metadata whose term count is negative.
        assert result > 0 or result in results or publication.position <= 0, (kind, length, result)
    publication.close()
    view.close()


# -- the driver's datagram syscalls ----------------------------------------------------------------------
def not_internet(address: bytes) -> bytes:
    """Random address bytes, but never an IPv4 or IPv6 address: the fuzzer sends nothing off this host."""
    if len(address) >= 2 and struct.unpack_from("=H", address)[0] in (socket.AF_INET, socket.AF_INET6):
        return b"\xff\xff" + address[2:]
    return address


@fuzz
@given(
    terms(),
    term_offsets,
    int32s,
    st.one_of(st.sampled_from([0, 32, 1408, 65504]), int32s),
    st.one_of(st.just(b"address"), st.binary(max_size=32).map(not_internet)),
    st.one_of(st.sampled_from([0, 1, 64, 65]), st.integers(*C_INT_LIMITS)),
    st.sampled_from(["socket", "closed", "bad"]),
    st.booleans(),
)
def fuzz_udp_term_send_datagrams(
    term: mmap.mmap,
    term_offset: int,
    max_length: int,
    mtu: int,
    address: bytes,
    max_datagrams: int,
    fd_kind: str,
    gso: bool,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        if address == b"address":
            port = rx.getsockname()[1]
            address = struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton("127.0.0.1")
            address += bytes(8)
        fd = {"socket": tx.fileno(), "closed": 1_000_000, "bad": -1}[fd_kind]
        try:
            covered, sent, sent_bytes, _ = _udp.term_send_datagrams(
                fd, term, term_offset, max_length, mtu, address, max_datagrams, gso
            )
        except (ValueError, OSError):
            return
    assert 0 <= covered <= TERM - term_offset and 0 <= sent <= min(64, max(max_datagrams, 0))
    assert 0 <= sent_bytes <= covered


@fuzz
@given(
    st.sampled_from([0, 100, 65536, 8 * 65536]),
    st.one_of(st.sampled_from([0, 1, -1, 1500, 65536, INT32_MAX, INT32_MIN]), int32s),
    st.one_of(st.integers(0, 80), st.sampled_from([64 * 8, 64 * 8 + 1])),
    st.one_of(st.integers(0, 80), st.sampled_from([64 * 8, 64 * 8 + 1])),
    st.one_of(st.integers(0, 80), st.sampled_from([64 * 8, 64 * 8 + 1])),
    st.integers(0, 5),
    st.sampled_from(["socket", "closed", "bad"]),
    st.booleans(),
)
def fuzz_udp_receive_batch(
    size: int,
    slot_length: int,
    lengths_length: int,
    sources_length: int,
    offsets_length: int,
    waiting: int,
    fd_kind: str,
    gro: bool,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        if gro:
            rx.setsockopt(socket.IPPROTO_UDP, _udp.UDP_GRO_OPTION, 1)
            tx.setsockopt(socket.IPPROTO_UDP, _udp.UDP_SEGMENT_OPTION, 100)  # each send below: 100-byte datagrams
        for i in range(waiting):  # loopback delivers at once: these are waiting when recvmmsg runs
            tx.sendto(bytes([i]) * (100 + 300 * i), rx.getsockname())
        mapping = mmap.mmap(-1, GUARD + size + GUARD)  # the guards must stay zero: nothing lands outside
        buffer = memoryview(mapping)[GUARD : GUARD + size]
        lengths = np.full(lengths_length, -7, dtype=np.int32)
        sources = np.zeros(sources_length, dtype=np.uint64)
        offsets = np.zeros(offsets_length, dtype=np.int32)
        fd = {"socket": rx.fileno(), "closed": 1_000_000, "bad": -1}[fd_kind]
        slots = min(64, lengths_length // 64 if lengths_length >= 64 else lengths_length)
        try:
            n = _udp.udp_receive_batch(fd, buffer, slot_length, offsets, lengths, sources)
        except (ValueError, OSError):
            assert (
                slot_length <= 0
                or min(slots, size // slot_length) <= 0
                or min(sources_length, offsets_length) < lengths_length
            )
            return
        finally:
            assert mapping[:GUARD] == bytes(GUARD) and mapping[GUARD + size :] == bytes(GUARD)
    datagrams = sum(-(-(100 + 300 * i) // 100) for i in range(waiting)) if gro else waiting
    assert 0 <= n <= min(lengths_length, datagrams if fd_kind == "socket" else 0)
    assert all(0 <= length <= slot_length for length in lengths[:n].tolist())
    assert all(
        0 <= offset and offset + length <= size for offset, length in zip(offsets[:n].tolist(), lengths[:n].tolist())
    )
