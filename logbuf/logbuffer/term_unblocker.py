"""Unblocking a log whose publisher died between claim and commit (Aeron's TermUnblocker and
LogBufferUnblocker), as small functions over the buffers.

A claim reserves ``[offset, offset + aligned length)`` by moving the tail; the frame becomes
visible when its length is release-stored, positive. A publisher that dies in between leaves a
negative length (the header was written) or zeroes (it died before that), and every reader stops
there for good, although other publishers keep committing frames after it::

    term   | committed | committed | 0 0 0 0 0 0 (dead claim) | committed | ... | tail
                                   ^ blocked offset            ^ next committed frame

The driver, seeing the consumer position stuck below the tail for ``publication_unblock_timeout_ns``,
covers the dead claim with a padding frame so readers skip it: up to the next committed frame
(after checking everything between is still zero), or to the end of the term, then rotating the
log, when no frame follows in the term.

It pads only over what it can prove is an abandoned claim, as any process that maps the log can write
garbage into it: a negative length only if it is minus a frame length that fits below the tail (what
``header_write`` stores first), zeroes only up to the next 32-byte slot that is not zero. Anything else
at the blocked offset (a length shorter than a header, past the end of the term or the tail, a negative
that no claim can have written, INT_MIN included) is a corrupt log: the unblocker refuses it
(``UnblockStatus.REFUSED``, with the reason from :func:`blocking_frame_problem`) and writes nothing; the
subscribers' polls raise ``CorruptLogError`` there, and the conductor counts and logs the refusal.
"""

from __future__ import annotations

from enum import Enum

import numpy as np

from logbuf import native
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.logbuffer.log_buffer import LogBuffers


class UnblockStatus(Enum):
    NO_ACTION = "no action"
    UNBLOCKED = "unblocked"
    UNBLOCKED_TO_END = "unblocked to the end of the term"
    REFUSED = "refused: the frame there is corrupt, not an abandoned claim"


def _claim_fits(length: int, term_offset: int, tail_offset: int, term_length: int) -> bool:
    """Whether ``length`` bytes at ``term_offset`` can be one claim: at least a header, below the tail."""
    return dh.HEADER_LENGTH <= length and term_offset + dh.align(length) <= min(tail_offset, term_length)


def blocking_frame_problem(term: memoryview, blocked_offset: int, tail_offset: int) -> str | None:
    """Why the frame length at ``blocked_offset`` (where the consumers are stuck, the tail at
    ``tail_offset``) cannot be a frame or a claim, naming the value; None if it can (or it is 0)."""
    term_length = len(term)
    frame_length = native.get_int32_volatile(term, blocked_offset)
    if frame_length == 0:
        return None
    if frame_length < 0:
        if _claim_fits(-frame_length, blocked_offset, tail_offset, term_length):
            return None
        return f"frame_length={frame_length} is negative and not a claim that ends below the tail (at {tail_offset})"
    if frame_length < dh.HEADER_LENGTH:
        return f"frame_length={frame_length} is shorter than the {dh.HEADER_LENGTH}-byte frame header"
    if frame_length > term_length - blocked_offset:
        return f"frame_length={frame_length} runs past the end of the term ({term_length - blocked_offset} bytes left)"
    return None


def write_padding(
    term: memoryview, term_offset: int, length: int, term_id: int, session_id: int, stream_id: int
) -> None:
    """A PAD frame of ``length`` bytes at ``term_offset``: header with a negative length first, then
    the length release-stored (readers see either nothing or the whole frame)."""
    dh.HEADER.pack_into(
        term,
        term_offset,
        -length,
        dh.CURRENT_VERSION,
        dh.UNFRAGMENTED,
        dh.HDR_TYPE_PAD,
        term_offset,
        session_id,
        stream_id,
        term_id,
        0,
    )
    native.put_int32_ordered(term, term_offset, length)


def _zero_from(term: memoryview, start: int, end: int) -> int:
    """Offset of the first 32-byte slot in [start, end) whose frame length is not zero, else ``end``."""
    if start >= end:
        return end
    lengths = np.frombuffer(term, dtype=np.int32, count=(end - start) // 4, offset=start)[:: dh.FRAME_ALIGNMENT // 4]
    nonzero = np.flatnonzero(lengths)
    return start + int(nonzero[0]) * dh.FRAME_ALIGNMENT if nonzero.size else end


def term_unblock(
    term: memoryview, blocked_offset: int, tail_offset: int, term_id: int, session_id: int, stream_id: int
) -> UnblockStatus:
    """Cover the dead claim at ``blocked_offset`` with padding if it can be bounded safely; REFUSED when
    what is there is no claim (:func:`blocking_frame_problem`)."""
    if blocking_frame_problem(term, blocked_offset, tail_offset) is not None:
        return UnblockStatus.REFUSED
    frame_length = native.get_int32_volatile(term, blocked_offset)
    if frame_length < 0:  # the header was written, the commit never came
        write_padding(term, blocked_offset, -frame_length, term_id, session_id, stream_id)
        return UnblockStatus.UNBLOCKED
    if frame_length > 0:
        return UnblockStatus.NO_ACTION  # committed meanwhile: not blocked
    tail_offset = min(tail_offset, len(term))
    offset = _zero_from(term, blocked_offset + dh.FRAME_ALIGNMENT, tail_offset)
    if offset < tail_offset:
        # a later frame is committed: pad up to it if the claim region is still all zeroes (the padding
        # ends where something was written; if that is garbage, the readers stop there with an error)
        if native.get_int32_volatile(term, offset) != 0 and _zero_from(term, blocked_offset, offset) == offset:
            write_padding(term, blocked_offset, offset - blocked_offset, term_id, session_id, stream_id)
            return UnblockStatus.UNBLOCKED
        return UnblockStatus.NO_ACTION
    if tail_offset >= len(term) and native.get_int32_volatile(term, blocked_offset) == 0:
        write_padding(term, blocked_offset, len(term) - blocked_offset, term_id, session_id, stream_id)
        return UnblockStatus.UNBLOCKED_TO_END
    return UnblockStatus.NO_ACTION


def blocking_problem_at(log: LogBuffers, position: int) -> str | None:
    """:func:`blocking_frame_problem` at a stream position of ``log`` (its term's tail as the bound)."""
    index = lbd.index_by_term_count(position >> log.position_bits_to_shift)
    meta = log.metadata()
    term = log.term_buffer(index)
    try:
        tail_offset = lbd.term_offset(lbd.raw_tail_volatile(meta, index), log.term_length)
        return blocking_frame_problem(term, position & (log.term_length - 1), tail_offset)
    finally:
        term.release()
        meta.release()


def log_unblock(log: LogBuffers, blocked_position: int) -> UnblockStatus:
    """Unblock the log at the consumer's stuck position: UNBLOCKED (or UNBLOCKED_TO_END) if it padded a
    dead claim (or rotated a log whose term end was tripped), REFUSED if the frame there is corrupt."""
    term_length = log.term_length
    blocked_term_count = blocked_position >> log.position_bits_to_shift
    blocked_offset = blocked_position & (term_length - 1)
    meta = log.metadata()
    term: memoryview | None = None
    try:
        active_term_count = lbd.active_term_count_volatile(meta)
        if active_term_count == blocked_term_count - 1 and blocked_offset == 0:
            # the claim that tripped the term end died before rotating the log
            raw = lbd.raw_tail_volatile(meta, lbd.index_by_term_count(active_term_count))
            native.rotate_log(meta, active_term_count, lbd.term_id(raw))
            return UnblockStatus.UNBLOCKED
        index = lbd.index_by_term_count(blocked_term_count)
        raw = lbd.raw_tail_volatile(meta, index)
        term_id = lbd.term_id(raw)
        term = log.term_buffer(index)
        status = term_unblock(
            term, blocked_offset, lbd.term_offset(raw, term_length), term_id, log.session_id, log.stream_id
        )
        if status is UnblockStatus.UNBLOCKED_TO_END:
            native.rotate_log(meta, blocked_term_count, term_id)
        return status
    finally:
        if term is not None:
            term.release()
        meta.release()
