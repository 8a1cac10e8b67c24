"""Segment bytes to Arrow record batches: the vectorised frame parser behind the Spark data source.

Theory of operation
-------------------
A segment holds whole terms, and the frames of a recording follow each other without gaps from
its start position: every frame starts where the previous one ends (at its 32-byte aligned
length), a term's last frame (often a PAD) ends exactly at the term's end, so the chain runs on
across terms. :func:`parse_chunk` finds that chain over a chunk of positions ``[lo, hi)`` (``lo``
a frame start, ``hi`` the end of recorded data or of the chunk's last term) without a Python loop
per frame:

1. View the chunk as 32-byte slots of eight int32s. A slot is a *candidate* frame start when its
   term-offset field equals its own offset in the term and its length is positive (zeros, the
   unwritten tail of a PAD and most payload bytes fail this).
2. Each candidate points at the slot after it (``slot + aligned length / 32``). When candidate
   ``k`` points at candidate ``k + 1`` for all ``k`` (the normal case) the candidates *are* the
   chain. A payload that happens to hold a header-like slot at the matching offset breaks one
   link: the walk then jumps from the real frame to where it ends and goes on with the next run
   (one ``searchsorted`` per such break, not per frame).
3. Every frame of the chain is checked at once, with the same rules as ``logbuf-archive verify``
   (:mod:`archive.verify`): positive length of at least a header, version 0, type DATA or PAD,
   term offset and term id equal to the position's, the recording's session and stream ids, DATA
   frames no longer than the MTU, no frame past its term or the recorded stop position, and the
   segment file long enough to hold it. The first frame that fails is *corrupt*; the reason is
   worded as verify words it.
4. A recording made with record checksums (:mod:`archive.checksum`) has each DATA frame's payload
   CRC-32 in the session id field: step 3 skips the session id there, and the chain's DATA frames
   have their CRC recomputed (one zlib call per frame); the first mismatch is corrupt.

After a corrupt frame its length cannot be trusted, so nothing up to the end of that term is
read; the next term starts with a frame at term offset 0, which is where reading resumes.

Rows: per frame (DATA frames; PAD frames carry nothing) or per message (the default). Messages
are reassembled with arrays too: a BEGIN flag opens a message, the END flag closes it, and a
group of frames counts only if it opens with BEGIN, holds exactly one END and ends with it; the
payload bytes of all selected frames are gathered in one masked copy. A message never crosses a
term (Aeron fragments a message inside one claim), so a chunk made of whole terms holds whole
messages. A row's ``position`` is the stream position just after its last frame (what
``offer()`` returned for it, Aeron's ``Header.position``); its term id and term offset are those of
its first frame. A range of positions ``(from, to]`` selects rows by that position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]

from logbuf.archive.catalog import RecordingDescriptor
from logbuf.archive.checksum import checksum_mismatch
from logbuf.archive.time_index import AppendTimes
from logbuf.archive.verify import frame_problem
from logbuf.logbuffer import data_header_descriptor as dh

__all__ = [
    "ChunkFrames",
    "Corruption",
    "Mode",
    "RowSpec",
    "Rows",
    "arrow_schema",
    "build_batch",
    "describe_bad_frame",
    "empty_rows",
    "parse_chunk",
    "problem_batch",
    "select_rows",
]

_SLOT: Final[int] = dh.FRAME_ALIGNMENT
_INTS_PER_SLOT: Final[int] = _SLOT // 4
_LENGTH_INT: Final[int] = dh.FRAME_LENGTH_FIELD_OFFSET // 4
_WORD_INT: Final[int] = dh.VERSION_FIELD_OFFSET // 4  # version, flags, type
_TERM_OFFSET_INT: Final[int] = dh.TERM_OFFSET_FIELD_OFFSET // 4
_SESSION_INT: Final[int] = dh.SESSION_ID_FIELD_OFFSET // 4
_STREAM_INT: Final[int] = dh.STREAM_ID_FIELD_OFFSET // 4
_TERM_ID_INT: Final[int] = dh.TERM_ID_FIELD_OFFSET // 4
_RESERVED_INT: Final[int] = dh.RESERVED_VALUE_FIELD_OFFSET // 4
_FLAGS_SHIFT: Final[int] = (dh.FLAGS_FIELD_OFFSET - dh.VERSION_FIELD_OFFSET) * 8
_TYPE_SHIFT: Final[int] = (dh.TYPE_FIELD_OFFSET - dh.VERSION_FIELD_OFFSET) * 8

TIMESTAMP_UNITS_US: Final[dict[str, tuple[int, int]]] = {
    "s": (1_000_000, 1),
    "ms": (1_000, 1),
    "us": (1, 1),
    "ns": (1, 1_000),
}
"""Unit of the reserved value -> (multiply, divide) that gives epoch microseconds."""

Int64Array = npt.NDArray[np.int64]


class Mode(str, Enum):
    """Spark's ``mode`` option for malformed input."""

    PERMISSIVE = "PERMISSIVE"
    DROPMALFORMED = "DROPMALFORMED"
    FAILFAST = "FAILFAST"


def arrow_schema(corrupt_column: str | None) -> pa.Schema:
    """The Arrow schema of the batches (what Spark's ``to_arrow_schema(schema, "UTC")`` gives)."""
    fields = [
        pa.field("recording_id", pa.int64()),
        pa.field("stream_id", pa.int32()),
        pa.field("session_id", pa.int32()),
        pa.field("term_id", pa.int32()),
        pa.field("term_offset", pa.int32()),
        pa.field("position", pa.int64()),
        pa.field("flags", pa.int32()),
        pa.field("reserved_value", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("topic", pa.string()),
        pa.field("payload", pa.binary()),
    ]
    if corrupt_column is not None:
        fields.append(pa.field(corrupt_column, pa.string()))
    return pa.schema(fields)


@dataclass(frozen=True)
class Corruption:
    position: int
    """Where the first bad frame starts."""
    reason: str
    resume_position: int
    """Where reading resumes: the next term boundary (or the end of the range)."""


@dataclass
class ChunkFrames:
    """The valid frames of a chunk, in order (DATA and PAD), and the first bad one if any."""

    region: npt.NDArray[np.uint8]
    """The chunk's bytes from ``lo`` (what the file holds of it)."""
    lo: int
    slot: Int64Array
    """Each frame's slot in ``region`` (its offset / 32)."""
    frame_length: npt.NDArray[np.int32]
    words: npt.NDArray[np.int32]
    """version | flags << 8 | type << 16."""
    corruption: Corruption | None


@dataclass(frozen=True)
class RowSpec:
    """How frames become rows."""

    per_message: bool = True
    timestamp_unit: str | None = None
    """Unit of epoch time in ``reserved_value`` (s, ms, us, ns), or None for no timestamp from it."""
    payload: bool = True
    """Gather the payload bytes (False: the ``payload`` column is not read, so none is copied)."""
    from_append_time: bool = False
    """The timestamp is the recorder's append time (the append-time index); else from the reserved value,
    or null."""


@dataclass
class Rows:
    """Columns of rows from one chunk, before they become an Arrow batch."""

    term_id: npt.NDArray[np.int32]
    term_offset: npt.NDArray[np.int32]
    position: Int64Array
    flags: npt.NDArray[np.int32]
    reserved_value: Int64Array
    payload_offsets: npt.NDArray[np.int32]
    payload_values: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return len(self.position)


def empty_rows() -> Rows:
    return Rows(
        np.zeros(0, np.int32),
        np.zeros(0, np.int32),
        np.zeros(0, np.int64),
        np.zeros(0, np.int32),
        np.zeros(0, np.int64),
        np.zeros(1, np.int32),
        np.zeros(0, np.uint8),
    )


def parse_chunk(
    segment: npt.NDArray[np.uint8], segment_base: int, lo: int, hi: int, d: RecordingDescriptor
) -> ChunkFrames:
    """The frame chain over positions ``[lo, hi)`` of one segment (``segment`` = the file's bytes).

    ``lo`` must be a frame start and ``hi`` the end of a term or the recorded stop position, both
    inside the segment. A chain that does not reach ``hi`` ends in a :class:`Corruption`.
    """
    term_mask = d.term_length - 1
    start_in_file = lo - segment_base
    available = max(0, min(len(segment) - start_in_file, hi - lo))
    region = segment[start_in_file : start_in_file + available]
    n = available // _SLOT  # whole slots present
    n_full = (hi - lo) // _SLOT  # slots the chain must cover
    ints = region[: n * _SLOT].view("<i4").reshape(n, _INTS_PER_SLOT)
    lengths = ints[:, _LENGTH_INT]
    expected_offset = ((lo & term_mask) + _SLOT * np.arange(n, dtype=np.int64)) & term_mask
    candidates = np.flatnonzero((ints[:, _TERM_OFFSET_INT] == expected_offset) & (lengths > 0))
    flen = lengths[candidates].astype(np.int64)
    words = ints[candidates, _WORD_INT]
    nxt = candidates + ((flen + (_SLOT - 1)) >> 5)
    good = _frame_checks(ints, candidates, flen, words, nxt, n_full, available, lo, d)

    m = len(candidates)
    parts: list[tuple[int, int]] = []
    bad_slot = -1
    if n_full == 0:
        pass
    elif m == 0 or candidates[0] != 0:
        bad_slot = 0
    else:
        linked = np.zeros(m, dtype=bool)
        linked[:-1] = (nxt[:-1] == candidates[1:]) & good[:-1]
        breaks = np.flatnonzero(~linked)  # the last candidate is always a break
        i = 0
        while True:
            j = int(breaks[np.searchsorted(breaks, i)])
            if not good[j]:
                parts.append((i, j))
                bad_slot = int(candidates[j])
                break
            parts.append((i, j + 1))
            end = int(nxt[j])
            if end == n_full:
                break
            k = int(np.searchsorted(candidates, end))
            if k < m and candidates[k] == end:
                i = k
                continue
            bad_slot = end
            break
    chosen = np.concatenate([np.arange(a, b) for a, b in parts]) if parts else np.zeros(0, np.int64)
    corruption = None
    checksum_reason = None
    if d.checksum and len(chosen):
        mismatch = _first_checksum_mismatch(region, ints, candidates[chosen], flen[chosen], words[chosen])
        if mismatch is not None:  # the chain ends at the first frame whose payload changed
            k, checksum_reason = mismatch
            bad_slot = int(candidates[chosen[k]])
            chosen = chosen[:k]
    if bad_slot >= 0:
        bad_position = lo + bad_slot * _SLOT
        term_end = bad_position - (bad_position & term_mask) + d.term_length
        corruption = Corruption(
            bad_position,
            checksum_reason or describe_bad_frame(region, lo, bad_position, hi, d),
            min(term_end, hi if hi > bad_position else term_end),
        )
    return ChunkFrames(region, lo, candidates[chosen], lengths[candidates[chosen]], words[chosen], corruption)


def _first_checksum_mismatch(
    region: npt.NDArray[np.uint8],
    ints: npt.NDArray[np.int32],
    slots: Int64Array,
    flen: Int64Array,
    words: npt.NDArray[np.int32],
) -> tuple[int, str] | None:
    """The index (in ``slots``) of the first DATA frame whose payload CRC-32 is not the one in its
    session id field, and why; None if all match."""
    is_data = ((words >> _TYPE_SHIFT) & 0xFFFF) == dh.HDR_TYPE_DATA
    data = memoryview(region)  # type: ignore[arg-type]
    stored = ints[slots, _SESSION_INT].tolist()
    for k in np.flatnonzero(is_data).tolist():
        start = int(slots[k]) * _SLOT + dh.HEADER_LENGTH
        reason = checksum_mismatch(stored[k], data[start : start + int(flen[k]) - dh.HEADER_LENGTH])
        if reason is not None:
            return k, reason
    return None


def _frame_checks(
    ints: npt.NDArray[np.int32],
    candidates: Int64Array,
    flen: Int64Array,
    words: npt.NDArray[np.int32],
    nxt: Int64Array,
    n_full: int,
    available: int,
    lo: int,
    d: RecordingDescriptor,
) -> npt.NDArray[np.bool_]:
    """verify's rules, for every candidate at once (term offset and length > 0 already hold)."""
    version = words & 0xFF
    frame_type = (words >> _TYPE_SHIFT) & 0xFFFF
    is_data = frame_type == dh.HDR_TYPE_DATA
    shift = d.position_bits_to_shift
    positions = lo + candidates * _SLOT
    expected_term_id = ((d.initial_term_id + (positions >> shift)) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    return (  # type: ignore[no-any-return]
        (version == dh.CURRENT_VERSION)
        & (is_data | (frame_type == dh.HDR_TYPE_PAD))
        & (ints[candidates, _TERM_ID_INT] == expected_term_id)
        & ((ints[candidates, _SESSION_INT] == d.session_id) | bool(d.checksum))
        & (ints[candidates, _STREAM_INT] == d.stream_id)
        & (flen >= dh.HEADER_LENGTH)
        & (~is_data | (flen <= d.mtu))
        & (nxt <= n_full)
        & (~is_data | (nxt * _SLOT <= available))
    )


_HEADER = dh.HEADER


def describe_bad_frame(region: npt.NDArray[np.uint8], lo: int, position: int, hi: int, d: RecordingDescriptor) -> str:
    """Why the frame at ``position`` is not valid, worded as ``logbuf-archive verify`` words it."""
    offset = position - lo
    term_mask = d.term_length - 1
    term_offset = position & term_mask
    if offset + dh.HEADER_LENGTH > len(region):
        return "segment file is truncated: it ends inside the frame header at this position"
    frame_length, version, _flags, frame_type, term_offset_field, session_id, stream_id, term_id, _reserved = (
        _HEADER.unpack_from(region.data, offset)
    )
    problem = frame_problem(
        frame_length,
        version,
        frame_type,
        term_offset_field,
        session_id,
        stream_id,
        term_id,
        d,
        term_offset,
        d.term_id_of(position),
        hi - (position - term_offset),
    )
    if problem is not None:
        return problem
    return "segment file is truncated: it ends inside the frame at this position"


def select_rows(
    frames: ChunkFrames,
    spec: RowSpec,
    from_position: int,
    to_position: int,
    d: RecordingDescriptor,
    skip: npt.NDArray[np.bool_] | None = None,
    keep_rows: Callable[[Int64Array], npt.NDArray[np.bool_] | None] | None = None,
) -> Rows:
    """Rows (frames or whole messages) of a chunk whose position lies in ``(from_position, to_position]``.

    ``skip``: frames (of ``frames``) that make no row (topic definitions); given the reserved values
    of the candidate rows (a message's first frame's), ``keep_rows`` says which to keep (None: all), decided before any payload
    byte is gathered."""
    words = frames.words
    is_data = ((words >> _TYPE_SHIFT) & 0xFFFF) == dh.HDR_TYPE_DATA
    slot = frames.slot[is_data]
    skip_data = skip[is_data] if skip is not None and skip.any() else None
    region = frames.region
    whole = (len(region) // _SLOT) * _SLOT
    ints = region[:whole].view("<i4").reshape(-1, _INTS_PER_SLOT)
    reserved = region[:whole].view("<i8").reshape(-1, _INTS_PER_SLOT // 2)
    flen = frames.frame_length[is_data].astype(np.int64)
    flags = ((words[is_data] >> _FLAGS_SHIFT) & 0xFF).astype(np.int32)
    lo = frames.lo
    ends = lo + (slot + ((flen + (_SLOT - 1)) >> 5)) * _SLOT
    if spec.per_message and len(slot):
        begin = (flags & dh.BEGIN_FLAG) != 0
        end_flag = (flags & dh.END_FLAG) != 0
        group = np.cumsum(begin) - 1  # frames before the first BEGIN: group -1, dropped
        keep = group >= 0
        groups = int(group[-1]) + 1 if len(group) else 0
        ends_in_group = np.bincount(group[keep], weights=end_flag[keep], minlength=groups)
        first = np.flatnonzero(begin)
        last = np.append(first[1:], len(flags)) - 1
        complete = (ends_in_group == 1) & end_flag[last]
        if skip_data is not None:
            complete &= ~skip_data[first]
        row_position = ends[last]
        complete &= (row_position > from_position) & (row_position <= to_position)
        first, last = first[complete], last[complete]
        kept = keep_rows(reserved[slot[first], _RESERVED_INT // 2]) if keep_rows is not None else None
        if kept is not None:
            first, last = first[kept], last[kept]
        frame_in_row = np.zeros(len(flags), dtype=bool)
        if len(first):
            marks = np.bincount(first, minlength=len(flags) + 1) - np.bincount(last + 1, minlength=len(flags) + 1)
            frame_in_row = np.cumsum(marks[:-1]) > 0
        row_flags = flags[first] | flags[last]
        row_slot = slot[first]
        row_position = ends[last]
        row_reserved_slot = slot[first]
        payload_slot = slot[frame_in_row]
        payload_length = flen[frame_in_row] - dh.HEADER_LENGTH
        row_id = np.cumsum(begin[frame_in_row]) - 1  # in a complete message only its first frame has BEGIN
        row_lengths = np.bincount(row_id, weights=payload_length, minlength=len(first)).astype(np.int64)
    else:
        selected = (ends > from_position) & (ends <= to_position)
        if skip_data is not None:
            selected &= ~skip_data
        kept = keep_rows(reserved[slot[selected], _RESERVED_INT // 2]) if keep_rows is not None else None
        if kept is not None:
            selected[selected] = kept
        row_slot = slot[selected]
        row_flags = flags[selected]
        row_position = ends[selected]
        row_reserved_slot = row_slot
        payload_slot = row_slot
        payload_length = flen[selected] - dh.HEADER_LENGTH
        row_lengths = payload_length
    positions = lo + row_slot * _SLOT
    offsets = np.zeros(len(row_lengths) + 1, dtype=np.int64)
    np.cumsum(row_lengths, out=offsets[1:])
    if not spec.payload:
        offsets[:] = 0
    elif offsets[-1] >= 1 << 31:
        raise ValueError(f"a chunk of {offsets[-1]} payload bytes is too large for one Arrow binary column")
    return Rows(
        term_id=ints[row_slot, _TERM_ID_INT].astype(np.int32),
        term_offset=(positions & (d.term_length - 1)).astype(np.int32),
        position=row_position.astype(np.int64),
        flags=row_flags.astype(np.int32),
        reserved_value=reserved[row_reserved_slot, _RESERVED_INT // 2].astype(np.int64),
        payload_offsets=offsets.astype(np.int32),
        payload_values=_gather(region, payload_slot * _SLOT + dh.HEADER_LENGTH, payload_length)
        if spec.payload
        else np.zeros(0, np.uint8),
    )


def _gather(region: npt.NDArray[np.uint8], starts: Int64Array, lengths: Int64Array) -> npt.NDArray[np.uint8]:
    """The bytes of ``[start, start + length)`` ranges of ``region`` (ascending, disjoint), concatenated.

    Zero-copy, ``region`` becomes a binary array whose values alternate between the ranges and the
    bytes between them (headers, alignment); Arrow's ``take`` of the even values then copies the
    ranges out back to back in C++ (a boolean mask over every byte was ~10x slower).
    """
    n = len(starts)
    if n == 0 or int(lengths.sum()) == 0:
        return np.zeros(0, np.uint8)
    first = int(starts[0])
    offsets = np.empty(2 * n, dtype=np.int32)
    offsets[0::2] = starts - first
    offsets[1::2] = starts + lengths - first
    values = pa.Array.from_buffers(pa.binary(), 2 * n - 1, [None, pa.py_buffer(offsets), pa.py_buffer(region[first:])])
    taken = values.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))
    data = taken.buffers()[2]
    return np.frombuffer(data, dtype=np.uint8)[: int(lengths.sum())]


def build_batch(
    schema: pa.Schema,
    recording: RecordingDescriptor,
    parts: Sequence[Rows],
    spec: RowSpec,
    corrupt: Sequence[tuple[int, str]] = (),
    append_times: AppendTimes | None = None,
    topics: dict[int, str] | None = None,
) -> pa.RecordBatch:
    """One Arrow batch of the rows of ``parts`` then, if any, PERMISSIVE rows for ``corrupt``
    (position, text) pairs. The schema has the corrupt-record column only in PERMISSIVE mode."""
    rows = _concat(parts)
    n_good = len(rows)
    n_bad = len(corrupt)
    n = n_good + n_bad
    position = rows.position
    term_id, term_offset = rows.term_id, rows.term_offset
    if n_bad:
        bad_pos = np.array([p for p, _ in corrupt], dtype=np.int64)
        position = np.concatenate([position, bad_pos])
        term_id = np.concatenate([term_id, np.array([recording.term_id_of(int(p)) for p in bad_pos], np.int32)])
        term_offset = np.concatenate([term_offset, (bad_pos & (recording.term_length - 1)).astype(np.int32)])
    valid = None
    if n_bad:
        valid = pa.py_buffer(np.packbits(np.arange(n) < n_good, bitorder="little"))

    def nullable(values: npt.NDArray[np.generic], arrow_type: pa.DataType) -> pa.Array:
        if not n_bad:
            return pa.array(values, type=arrow_type)
        padded = np.concatenate([values, np.zeros(n_bad, values.dtype)])
        return pa.Array.from_buffers(arrow_type, n, [valid, pa.py_buffer(padded)], null_count=n_bad)

    if spec.from_append_time:
        timestamp = _append_timestamps(rows.position, append_times, n_bad)
    else:
        timestamp = _timestamps(rows.reserved_value, spec.timestamp_unit, n_bad)
    payload_offsets = rows.payload_offsets
    if n_bad:
        payload_offsets = np.concatenate([payload_offsets, np.full(n_bad, payload_offsets[-1], np.int32)])
    payload = pa.Array.from_buffers(
        pa.binary(), n, [valid, pa.py_buffer(payload_offsets), pa.py_buffer(rows.payload_values)], null_count=n_bad
    )
    columns: list[pa.Array] = [
        pa.array(np.full(n, recording.recording_id, np.int64)),
        pa.array(np.full(n, recording.stream_id, np.int32)),
        pa.array(np.full(n, recording.session_id, np.int32)),
        pa.array(term_id, type=pa.int32()),
        pa.array(term_offset, type=pa.int32()),
        pa.array(position, type=pa.int64()),
        nullable(rows.flags, pa.int32()),
        nullable(rows.reserved_value, pa.int64()),
        timestamp,
        _topics(rows.reserved_value, topics, n_bad),
        payload,
    ]
    if len(schema) > len(columns):
        columns.append(pa.array([None] * n_good + [text for _, text in corrupt], type=pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def problem_batch(
    schema: pa.Schema, recording_id: int, stream_id: int | None, session_id: int | None, text: str
) -> pa.RecordBatch:
    """One PERMISSIVE row for a recording the catalog lost or describes impossibly: its id (and stream
    and session ids when the entry still holds them), nulls elsewhere, ``text`` in the corrupt column."""
    columns = [
        pa.array([recording_id], pa.int64()),
        pa.array([stream_id], pa.int32()),
        pa.array([session_id], pa.int32()),
    ]
    columns += [pa.nulls(1, field.type) for field in list(schema)[3:-1]]
    columns.append(pa.array([text], pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _timestamps(reserved: Int64Array, unit: str | None, n_bad: int) -> pa.Array:
    arrow_type = pa.timestamp("us", tz="UTC")
    n = len(reserved) + n_bad
    if unit is None:
        return pa.nulls(n, type=arrow_type)
    multiply, divide = TIMESTAMP_UNITS_US[unit]
    micros = reserved * multiply // divide if divide > 1 else reserved * multiply
    mask = np.concatenate([reserved == 0, np.ones(n_bad, dtype=bool)])  # 0: the publisher did not stamp it
    values = np.concatenate([micros, np.zeros(n_bad, np.int64)])
    return pa.array(values, type=arrow_type, mask=mask)


def _append_timestamps(row_end: Int64Array, append_times: AppendTimes | None, n_bad: int) -> pa.Array:
    """Each row's append time (its last frame's entry in the append-time index); null without one."""
    arrow_type = pa.timestamp("us", tz="UTC")
    if append_times is None or not len(append_times.position):
        return pa.nulls(len(row_end) + n_bad, type=arrow_type)
    micros, known = append_times.of_rows(row_end)
    mask = np.concatenate([~known, np.ones(n_bad, dtype=bool)])
    values = np.concatenate([micros, np.zeros(n_bad, np.int64)])
    return pa.array(values, type=arrow_type, mask=mask)


def _topics(reserved: Int64Array, names: dict[int, str] | None, n_bad: int) -> pa.Array:
    """Each row's topic name (a named topic id in its reserved value), else null."""
    n = len(reserved) + n_bad
    if not names or not len(reserved):
        return pa.nulls(n, type=pa.string())
    unique, inverse = np.unique(reserved, return_inverse=True)
    dictionary = pa.array([names.get(int(v)) if v > 0 else None for v in unique.tolist()], type=pa.string())
    values = dictionary.take(pa.array(inverse.astype(np.int32)))
    return pa.concat_arrays([values, pa.nulls(n_bad, type=pa.string())]) if n_bad else values


def _concat(parts: Sequence[Rows]) -> Rows:
    if not parts:
        return empty_rows()
    if len(parts) == 1:
        return parts[0]
    shifts = np.cumsum([0] + [int(p.payload_offsets[-1]) for p in parts[:-1]])
    if int(shifts[-1]) + int(parts[-1].payload_offsets[-1]) >= 1 << 31:
        raise ValueError("too many payload bytes for one Arrow binary column")
    offsets = np.concatenate(
        [np.zeros(1, np.int32)] + [p.payload_offsets[1:] + np.int32(s) for p, s in zip(parts, shifts)]
    )
    return Rows(
        term_id=np.concatenate([p.term_id for p in parts]),
        term_offset=np.concatenate([p.term_offset for p in parts]),
        position=np.concatenate([p.position for p in parts]),
        flags=np.concatenate([p.flags for p in parts]),
        reserved_value=np.concatenate([p.reserved_value for p in parts]),
        payload_offsets=offsets.astype(np.int32),
        payload_values=np.concatenate([p.payload_values for p in parts]),
    )
