"""Walking a recording's frames: verification, and finding the valid prefix of an interrupted one.

Theory of operation
-------------------
A recording is valid when, from its start position to its stop position, every frame is where
the previous one ends: a positive length, version 0, type DATA or PAD, a term-offset field equal
to the position's offset in its term, the term id of that position, the recording's session and
stream ids, DATA frames no longer than the MTU, no frame running past the end of its term or the
stop position, and the segment file long enough to hold it. A recording made with checksums
(:mod:`archive.checksum`) carries each DATA frame's payload CRC-32 in the session id field instead:
there the checksum is recomputed and compared, in place of the session id check.

Before any frame, the descriptor itself is checked (:func:`descriptor_problem`): a catalog entry
with a term length of 3 or a stop before its start describes no walkable recording.

The walk goes a term at a time. Inside a term the native block scanner (``term_scan_block``)
jumps over runs of DATA frames in C, and numpy checks all their headers at once (``frame_index``
gives their offsets); only PAD frames, and the frame where the scanner stopped, are looked at
one by one in Python. The first frame that fails names the position and the reason.

For an interrupted recording (:func:`scan_valid_prefix`) the walk starts at the last stored stop
position and ends quietly at the first frame that is not there or not valid: the recorder
writes each block with its first frame's length last, so a block cut short by a crash reads as
"no frame here".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from logbuf import native
from logbuf.archive.checksum import checksum_mismatch
from logbuf.archive.segments import SEGMENT_MAX_LENGTH, SegmentError, SegmentReader
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd

if TYPE_CHECKING:
    from logbuf.archive.recording import RecordingDescriptor

__all__ = ["VerifyResult", "descriptor_problem", "scan_valid_prefix", "verify_recording", "walk_frames"]

_TYPE_DATA_WORD: Final[int] = dh.HDR_TYPE_DATA << 16  # version 0, any flags, type DATA (bytes 4..7)


@dataclass(frozen=True)
class VerifyResult:
    recording_id: int
    ok: bool
    frames: int
    """Frames walked before the end or the first bad one (DATA and PAD)."""
    end_position: int
    """Where the walk ended: the stop position if ``ok``, else the first bad frame's position."""
    reason: str | None = None


@dataclass(frozen=True)
class _Walk:
    end_position: int
    frames: int
    reason: str | None


def walk_frames(
    archive_dir: str | os.PathLike[str],
    descriptor: RecordingDescriptor,
    from_position: int,
    limit_position: int | None,
) -> tuple[int, int, str | None]:
    """Walk frames from ``from_position`` (up to ``limit_position``, or while valid if None).

    Returns (end position, frames walked, reason the walk stopped early or None).
    """
    walk = _walk(archive_dir, descriptor, from_position, limit_position)
    return walk.end_position, walk.frames, walk.reason


def verify_recording(archive_dir: str | os.PathLike[str], descriptor: RecordingDescriptor) -> VerifyResult:
    """Check every frame from the start to the stop position; the first bad one is reported."""
    d = descriptor
    problem = descriptor_problem(d)
    if problem is not None:
        return VerifyResult(d.recording_id, False, 0, d.start_position, problem)
    walk = _walk(archive_dir, d, d.start_position, d.stop_position)
    return VerifyResult(d.recording_id, walk.reason is None, walk.frames, walk.end_position, walk.reason)


def scan_valid_prefix(archive_dir: str | os.PathLike[str], descriptor: RecordingDescriptor, from_position: int) -> int:
    """End of the run of valid frames that starts at ``from_position`` (a frame boundary)."""
    return _walk(archive_dir, descriptor, from_position, None).end_position


def descriptor_problem(d: RecordingDescriptor) -> str | None:
    """What makes a catalog entry's stream parameters or positions impossible (None: nothing), so that
    no reader plans or walks a recording it describes wrongly. The message names the field and value."""
    rid = d.recording_id
    if not lbd.TERM_MIN_LENGTH <= d.term_length <= lbd.TERM_MAX_LENGTH or d.term_length & (d.term_length - 1):
        return (
            f"recording {rid}: term length {d.term_length} in the catalog is not a power of two "
            f"within {lbd.TERM_MIN_LENGTH}..{lbd.TERM_MAX_LENGTH}"
        )
    if not d.term_length <= d.segment_length <= SEGMENT_MAX_LENGTH or d.segment_length & (d.segment_length - 1):
        return (
            f"recording {rid}: segment length {d.segment_length} in the catalog is not a power-of-two "
            f"multiple of the term length {d.term_length} of at most {SEGMENT_MAX_LENGTH}"
        )
    if not dh.HEADER_LENGTH < d.mtu <= dh.MAX_UDP_PAYLOAD_LENGTH or d.mtu % dh.FRAME_ALIGNMENT:
        return (
            f"recording {rid}: MTU {d.mtu} in the catalog is not a multiple of 32 within "
            f"{dh.HEADER_LENGTH + dh.FRAME_ALIGNMENT}..{dh.MAX_UDP_PAYLOAD_LENGTH}"
        )
    if d.start_position < 0 or d.start_position % dh.FRAME_ALIGNMENT or d.stop_position % dh.FRAME_ALIGNMENT:
        return (
            f"recording {rid}: start position {d.start_position} or stop position {d.stop_position} "
            "in the catalog is not a non-negative multiple of 32"
        )
    if d.stop_position < d.start_position:
        return f"recording {rid}: stop position {d.stop_position} is before the start position {d.start_position}"
    return None


def _walk(
    archive_dir: str | os.PathLike[str], d: RecordingDescriptor, from_position: int, limit_position: int | None
) -> _Walk:
    mask = d.term_length - 1
    position = from_position
    frames = 0
    with SegmentReader(archive_dir, d.recording_id, d.start_position, d.term_length, d.segment_length) as reader:
        while limit_position is None or position < limit_position:
            term_begin = position - (position & mask)
            try:
                view = reader.term_view(position)
            except SegmentError as e:
                return _Walk(position, frames, None if limit_position is None else str(e))
            with view:
                term_limit = (
                    d.term_length if limit_position is None else min(d.term_length, limit_position - term_begin)
                )
                offset, count, reason = _walk_term(
                    view,
                    d,
                    position & mask,
                    term_limit,
                    d.term_id_of(position),
                    limit_position is None,
                    reader.path_of(reader.base_of(position)),
                )
            frames += count
            position = term_begin + offset
            if reason is not None or offset < term_limit:
                return _Walk(position, frames, reason)
    return _Walk(position, frames, None)


def _walk_term(
    view: memoryview,
    d: RecordingDescriptor,
    offset: int,
    term_limit: int,
    term_id: int,
    lenient: bool,
    path: os.PathLike[str],
) -> tuple[int, int, str | None]:
    """Walk one term from ``offset`` to ``term_limit``; returns (end offset, frames, reason or None).

    ``lenient`` (prefix scan): an absent or bad frame ends the walk without a reason.
    """
    available = len(view)
    full = available == d.term_length
    ints = np.frombuffer(view, dtype="<i4", count=available // 4) if available >= 4 else np.zeros(0, "<i4")
    frames = 0
    while offset < term_limit:
        if full:
            end = native.term_scan_block(view, offset, term_limit)
            if end > offset and int(ints[offset // 4 + 1]) >> 16 & 0xFFFF == dh.HDR_TYPE_DATA:
                bad = _check_block(view, ints, d, offset, end, term_id)
                if bad is not None:
                    bad_offset, bad_reason = bad
                    return bad_offset, frames + _count(view, offset, bad_offset), None if lenient else bad_reason
                frames += _count(view, offset, end)
                offset = end
                continue
        # One frame at a time: a PAD, where the scanner stopped, or a truncated file.
        reason, frame_end = _check_one(view, ints, available, d, offset, term_limit, term_id, path)
        if reason is not None:
            return offset, frames, None if lenient else reason
        frames += 1
        offset = frame_end
    return offset, frames, None


def _count(view: memoryview, start: int, end: int) -> int:
    return native.count_frames(view[start:end], True) if end > start else 0


def frame_problem(
    frame_length: int,
    version: int,
    frame_type: int,
    term_offset_field: int,
    session_id: int,
    stream_id: int,
    term_id_field: int,
    d: RecordingDescriptor,
    term_offset: int,
    term_id: int,
    term_limit: int,
) -> str | None:
    """What is wrong with the frame header at ``term_offset`` of term ``term_id`` (None: nothing), as
    ``logbuf-archive verify`` words it; ``term_limit`` is where the recorded data ends in this term.
    The Spark reader reports its corrupt frames with this too."""
    if frame_length <= 0:
        return f"no frame here (frame length {frame_length}) before the recorded stop position"
    if version != dh.CURRENT_VERSION:
        return f"frame version {version} is not {dh.CURRENT_VERSION}"
    if frame_type not in (dh.HDR_TYPE_DATA, dh.HDR_TYPE_PAD):
        return f"frame type {frame_type:#x} is neither DATA (0x1) nor PAD (0x0)"
    if term_offset_field != term_offset:
        return f"term offset field {term_offset_field} does not match the position (term offset {term_offset})"
    if term_id_field != term_id:
        return f"term id field {term_id_field} does not match the position (term id {term_id})"
    if session_id != d.session_id and not d.checksum:  # with checksums the field holds the payload's CRC
        return f"session id {session_id} is not the recording's {d.session_id}"
    if stream_id != d.stream_id:
        return f"stream id {stream_id} is not the recording's {d.stream_id}"
    if frame_length < dh.HEADER_LENGTH:
        return f"frame length {frame_length} is shorter than the {dh.HEADER_LENGTH}-byte header"
    if frame_type == dh.HDR_TYPE_DATA and frame_length > d.mtu:
        return f"frame length {frame_length} exceeds the recording's MTU {d.mtu}"
    end = term_offset + dh.align(frame_length)
    if end > d.term_length:
        return f"frame length {frame_length} runs past the end of the term (term offset {term_offset})"
    if end > term_limit:
        return f"frame length {frame_length} runs past the recorded stop position"
    return None


def _problem_at(ints: np.ndarray, d: RecordingDescriptor, offset: int, term_limit: int, term_id: int) -> str | None:
    i = offset // 4
    word = int(ints[i + 1])
    return frame_problem(
        int(ints[i]),
        word & 0xFF,
        word >> 16 & 0xFFFF,
        int(ints[i + 2]),
        int(ints[i + 3]),
        int(ints[i + 4]),
        int(ints[i + 5]),
        d,
        offset,
        term_id,
        term_limit,
    )


def _check_one(
    view: memoryview,
    ints: np.ndarray,
    available: int,
    d: RecordingDescriptor,
    offset: int,
    term_limit: int,
    term_id: int,
    path: os.PathLike[str],
) -> tuple[str | None, int]:
    if offset + dh.HEADER_LENGTH > available:
        return f"segment file {path} is truncated: it ends inside the frame header at this position", offset
    problem = _problem_at(ints, d, offset, term_limit, term_id)
    if problem is not None:
        return problem, offset
    frame_length = int(ints[offset // 4])
    end = offset + dh.align(frame_length)
    is_pad = int(ints[offset // 4 + 1]) >> 16 & 0xFFFF == dh.HDR_TYPE_PAD
    needed = offset + dh.HEADER_LENGTH if is_pad else end
    if needed > available:
        return f"segment file {path} is truncated: it ends inside the frame at this position", offset
    if d.checksum and not is_pad:
        payload = view[offset + dh.HEADER_LENGTH : offset + frame_length]
        reason = checksum_mismatch(int(ints[offset // 4 + 3]), payload)
        if reason is not None:
            return reason, offset
    return None, end


def _check_checksums(
    view: memoryview, ints: np.ndarray, headers: list[int], lengths: list[int]
) -> tuple[int, str] | None:
    """The first DATA frame (header offset, payload length) whose payload does not match the checksum
    in its session id field, and why."""
    for header, length in zip(headers, lengths):
        payload = header + dh.HEADER_LENGTH
        reason = checksum_mismatch(int(ints[header // 4 + 3]), view[payload : payload + length])
        if reason is not None:
            return header, reason
    return None


def _check_block(
    view: memoryview, ints: np.ndarray, d: RecordingDescriptor, start: int, end: int, term_id: int
) -> tuple[int, str] | None:
    """Vectorised header checks over the DATA frames in [start, end); the first bad one, if any."""
    capacity = (end - start) // dh.HEADER_LENGTH
    offsets = np.empty(capacity, dtype=np.int32)
    lengths = np.empty(capacity, dtype=np.int32)
    n = native.frame_index(view[start:end], offsets, lengths)
    headers = offsets[:n].astype(np.int64) - dh.HEADER_LENGTH + start
    idx = headers // 4
    words = ints[idx + 1]
    bad = (
        ((words & 0xFF) != dh.CURRENT_VERSION)
        | ((words >> 16 & 0xFFFF) != dh.HDR_TYPE_DATA)
        | (ints[idx + 2] != headers)
        | (ints[idx + 5] != term_id)
        | ((ints[idx + 3] != d.session_id) & (not d.checksum))
        | (ints[idx + 4] != d.stream_id)
        | (lengths[:n] + dh.HEADER_LENGTH > d.mtu)
        | (lengths[:n] < 0)
    )
    if not bad.any():
        return _check_checksums(view, ints, headers.tolist(), lengths[:n].tolist()) if d.checksum else None
    first_bad = int(np.argmax(bad))
    if d.checksum:  # a payload changed before the first bad header makes the first bad frame
        found = _check_checksums(view, ints, headers[:first_bad].tolist(), lengths[:first_bad].tolist())
        if found is not None:
            return found
    offset = int(headers[first_bad])
    problem = _problem_at(ints, d, offset, end, term_id)  # the frames lie within [start, end)
    if problem is None:  # a PAD among the DATA frames (the block scanner stops before padding)
        problem = f"frame type {int(ints[offset // 4 + 1]) >> 16 & 0xFFFF:#x} is neither DATA (0x1) nor PAD (0x0)"
    return offset, problem
