"""Positions for the Spark source: offsets a pipeline pins, frame boundaries, data loss, read limits.

Theory of operation
-------------------
An *offset* is, per recording, a recorded position: the rows read are those whose ``position`` (the
stream position just after the row's last frame) is greater than the start offset and at most the end
offset. Offsets the source hands Spark are always **frame boundaries** (a recording's start, a term
start, a recorded stop position, or the end of a frame found by walking the headers), so that a
micro-batch can start parsing at its start offset.

Positions a user gives (``startingOffsets``, ``endingOffsets``, ``startPosition``, ``stopPosition``) may
fall inside a frame. :func:`frame_boundary_at_or_before` moves such a position back to the start of the
frame holding it; no row ends between the two, so the rows selected are the same.

Frame boundaries are found from the headers alone: :func:`term_frames` runs the native frame walk
(:func:`logbuf.native.frame_index`, one C loop that reads each frame's length and type and jumps to the
next) over a term of a segment file, and reads the flags byte of each DATA header; payload bytes are
never copied or parsed. A local segment is memory-mapped, so only the header's page is touched for a
large frame; a remote one is read with one ranged read of the term (the bytes up to the cut).

Read limits (``maxBytesPerTrigger``, ``maxRecordsPerTrigger``) are shared across the recordings that
have data each trigger (:func:`fair_shares`: every recording gets an equal share of the budget and what a
recording does not need goes to the others), then each recording's share is cut at a frame boundary
(:func:`cut_bytes`, :func:`cut_rows`). A recording always moves by at least one frame (or one row), so
a budget below a frame still makes progress.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from logbuf import native
from logbuf.archive.recording import RecordingDescriptor
from logbuf.archive.segments import segment_base_position
from logbuf.archive.storage import ArchiveLocation, read_segment
from logbuf.errors import LogbufError
from logbuf.logbuffer import data_header_descriptor as dh

__all__ = [
    "BY_TIME",
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "OffsetsError",
    "TermFrames",
    "cut_bytes",
    "cut_rows",
    "fair_shares",
    "frame_boundary_at_or_before",
    "parse_offsets",
    "parse_size",
    "term_frames",
]

EARLIEST: Final[int] = -2
"""In an offsets JSON: the recording's start position (Kafka's -2)."""
LATEST: Final[int] = -1
"""In an offsets JSON: the recording's recorded position when the query starts (Kafka's -1)."""
BY_TIME: Final[int] = -3
"""Not in a JSON: the position of ``startingTimestamp`` / ``endingTimestamp`` in the append-time index."""

_SIZE_UNITS: Final[dict[str, int]] = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class OffsetsError(LogbufError, ValueError):
    """An offsets or size option that cannot be used (the message names the option and the value)."""


def parse_size(name: str, text: str) -> int:
    """A positive size: bytes, or with a k/m/g/t suffix (powers of 1024, optionally followed by ``b``
    or ``ib``), as Spark's byte strings: ``4m``, ``4MB``, ``512k``, ``1048576``."""
    t = text.strip().lower().replace("_", "")
    for suffix in ("ib", "b"):
        if t.endswith(suffix) and t[: -len(suffix)][-1:] in _SIZE_UNITS and t[: -len(suffix)][-1:].isalpha():
            t = t[: -len(suffix)]
            break
    unit = t[-1:] if t[-1:].isalpha() else ""
    number = t[: len(t) - len(unit)]
    if unit not in _SIZE_UNITS or not number.isdigit():
        raise OffsetsError(f"{name}={text!r} is not a size (bytes, or a number with k, m, g or t: '4m')")
    value = int(number) * _SIZE_UNITS[unit]
    if value <= 0:
        raise OffsetsError(f"{name}={value} must be positive")
    return value


@dataclass(frozen=True)
class OffsetSpec:
    """``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or ``{"<recording id>": position}``
    (-2 earliest, -1 latest); recordings the JSON does not name take ``default``."""

    default: int
    positions: Mapping[int, int] = field(default_factory=dict)
    timestamp_ms: int | None = None
    """``startingTimestamp`` / ``endingTimestamp``: for the recordings the JSON does not name, the first
    position appended at or after this time (epoch ms), by the append-time index."""

    def for_recording(self, recording_id: int) -> int:
        if recording_id not in self.positions and self.timestamp_ms is not None:
            return BY_TIME
        return self.positions.get(recording_id, self.default)


def parse_offsets(name: str, text: str | None, default: int) -> OffsetSpec:
    """An offsets option (errors name the option and the bad part)."""
    if text is None:
        return OffsetSpec(default)
    word = text.strip().lower()
    if word == "earliest":
        return OffsetSpec(EARLIEST)
    if word == "latest":
        return OffsetSpec(LATEST)
    try:
        given = json.loads(text)
    except ValueError:
        given = None
    if not isinstance(given, dict):
        raise OffsetsError(
            f"{name}={text!r} must be 'earliest', 'latest' or a JSON object "
            '{"<recording id>": position} (-2: earliest, -1: latest)'
        )
    positions: dict[int, int] = {}
    for key, value in given.items():
        try:
            recording_id = int(key)
        except ValueError:
            raise OffsetsError(f"{name}: {key!r} is not a recording id") from None
        if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
            raise OffsetsError(
                f"{name}: recording {recording_id}: {value!r} must be a position (>= 0), -2 (earliest) or -1 (latest)"
            )
        positions[recording_id] = value
    return OffsetSpec(default, positions)


# -- frames from headers --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TermFrames:
    """The DATA frames of one term from ``begin`` up to a limit, from their headers: each frame's start and
    end (aligned) position, and its flags. PAD frames make no entry (a PAD starts where the previous frame
    ends, or at the term's start)."""

    begin: int
    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    flags: npt.NDArray[np.uint8]


def term_frames(location: ArchiveLocation, d: RecordingDescriptor, begin: int, limit: int) -> TermFrames:
    """Walk the frame headers of the term holding ``begin`` (a frame start), from ``begin`` up to
    ``limit`` (at most the term's end). Frames that do not end by ``limit`` are left out. A missing or
    short segment file, or a header with length <= 0, ends the walk there."""
    term_end = begin - (begin & (d.term_length - 1)) + d.term_length
    limit = min(limit, term_end)
    empty = TermFrames(begin, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8))
    if limit <= begin:
        return empty
    base = segment_base_position(d.start_position, begin, d.term_length, d.segment_length)
    try:
        with read_segment(location, d.recording_id, base, d.segment_length, begin - base, limit - base) as (
            segment,
            offset,
        ):
            lo = begin - base - offset
            hi = min(len(segment), limit - base - offset)
            if hi - lo < dh.HEADER_LENGTH:
                return empty
            block = segment[lo:hi]
            capacity = (hi - lo) // dh.FRAME_ALIGNMENT + 1
            offsets = np.empty(capacity, np.int32)
            lengths = np.empty(capacity, np.int32)
            n = native.frame_index(memoryview(block), offsets, lengths)  # type: ignore[arg-type]
            header = offsets[:n].astype(np.int64) - dh.HEADER_LENGTH
            flags = block[header + dh.FLAGS_FIELD_OFFSET] if n else np.zeros(0, np.uint8)
            del segment, block
    except FileNotFoundError:
        return empty
    frame_end = header + ((lengths[:n].astype(np.int64) + dh.HEADER_LENGTH + dh.FRAME_ALIGNMENT - 1) & ~31)
    whole = (frame_end <= limit - begin) & (lengths[:n] >= 0)
    cut = int(np.argmin(whole)) if not whole.all() else n  # the first frame that does not fit ends the list
    return TermFrames(begin, begin + header[:cut], begin + frame_end[:cut], flags[:cut].astype(np.uint8))


def frame_boundary_at_or_before(location: ArchiveLocation, d: RecordingDescriptor, position: int) -> int:
    """The greatest frame boundary of ``d`` at or before ``position`` (clamped to its recorded range)."""
    position = max(d.start_position, min(position, d.stop_position))
    if position == d.stop_position:
        return position
    term_start = max(d.start_position, position - (position & (d.term_length - 1)))
    if position == term_start:
        return position
    frames = term_frames(location, d, term_start, position)
    ends = frames.end
    if len(ends) and int(ends[-1]) == position:
        return position
    # The frame holding ``position`` starts at the last frame end before it (or the term's start).
    return int(ends[-1]) if len(ends) else term_start


def _first_frame_end(location: ArchiveLocation, d: RecordingDescriptor, begin: int, end: int) -> int:
    """The end of the frame that starts at ``begin`` (a PAD: the term's end), at most ``end``; the term's
    end if no frame can be read there (the reader then reports the damage)."""
    term_end = begin - (begin & (d.term_length - 1)) + d.term_length
    frames = term_frames(location, d, begin, min(end, term_end))
    if len(frames.start) and int(frames.start[0]) == begin:
        return min(end, int(frames.end[0]))
    return min(end, term_end)  # a PAD (it runs to the term's end), or damage the reader will report


def cut_bytes(location: ArchiveLocation, d: RecordingDescriptor, begin: int, end: int, budget: int) -> int:
    """The offset after at most ``budget`` bytes of ``d`` from ``begin`` (a frame boundary), at a frame
    boundary, at most ``end``: at least one frame further than ``begin``."""
    if end - begin <= budget:
        return end
    cut = frame_boundary_at_or_before(location, d, begin + budget)
    if cut > begin:
        return cut
    return _first_frame_end(location, d, begin, end)


def cut_rows(
    location: ArchiveLocation, d: RecordingDescriptor, begin: int, end: int, budget: int, per_message: bool
) -> tuple[int, int]:
    """(the offset after at most ``budget`` rows of ``d`` in ``(begin, end]``, the rows counted) from the
    headers: a row is a DATA frame with END (per message) or any DATA frame (per frame). A damaged term
    counts the rows before the damage (the reader's corrupt-record row is not counted)."""
    rows = 0
    position = begin
    while position < end and rows < budget:
        term_end = min(end, position - (position & (d.term_length - 1)) + d.term_length)
        frames = term_frames(location, d, position, term_end)
        row_ends = frames.end if not per_message else frames.end[(frames.flags & dh.END_FLAG) != 0]
        if rows + len(row_ends) >= budget and len(row_ends):
            return int(row_ends[budget - rows - 1]), budget
        rows += len(row_ends)
        position = term_end
    return min(position, end), rows


def fair_shares(wanted: Mapping[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` across recordings that want ``wanted[key]`` each: equal shares, and what one
    does not need goes to the others (water-filling, in recording id order for the remainder)."""
    shares = dict.fromkeys(wanted, 0)
    left = dict(wanted)
    remaining = budget
    while remaining > 0 and any(v > 0 for v in left.values()):
        hungry = sorted((k for k, v in left.items() if v > 0), key=int)
        each, extra = divmod(remaining, len(hungry))
        given = 0
        for i, key in enumerate(hungry):
            take = min(left[key], each + (1 if i < extra else 0))
            shares[key] += take
            left[key] -= take
            given += take
        remaining -= given
        if given == 0:
            break
    return shares
