"""Unblocking a log whose publisher died between claim and commit (Aeron's TermUnblocker and
LogBufferUnblocker), as small functions over the buffers.

A claim reserves ``[offset, offset + aligned length)`` by moving the tail; the frame becomes
visible when its length is release-stored, positive. A publisher that dies in between leaves a
negative length (the header was written) or zeroes (it died before that), and every reader stops
there for good, although other publishers keep committing frames after it::

    term   | committed | committed | 0 0 0 0 0 0 (dead claim) | committed | ... | tail
                                   ^ blocked offset            ^ next committed frame

The driver, seeing the consumer position stuck below the tail for ``publication_unblock_timeout``,
covers the dead claim with a padding frame so readers skip it: up to the next committed frame
(after checking everything between is still zero), or to the end of the term, then rotating the
log, when no frame follows in the term.
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
    """Cover the dead claim at ``blocked_offset`` with padding if it can be bounded safely."""
    frame_length = native.get_int32_volatile(term, blocked_offset)
    if frame_length < 0:  # the header was written, the commit never came
        write_padding(term, blocked_offset, -frame_length, term_id, session_id, stream_id)
        return UnblockStatus.UNBLOCKED
    if frame_length > 0:
        return UnblockStatus.NO_ACTION  # committed meanwhile: not blocked
    offset = _zero_from(term, blocked_offset + dh.FRAME_ALIGNMENT, tail_offset)
    if offset < tail_offset:
        # a later frame is committed: pad up to it if the claim region is still all zeroes
        if native.get_int32_volatile(term, offset) != 0 and _zero_from(term, blocked_offset, offset) == offset:
            write_padding(term, blocked_offset, offset - blocked_offset, term_id, session_id, stream_id)
            return UnblockStatus.UNBLOCKED
        return UnblockStatus.NO_ACTION
    if tail_offset >= len(term) and native.get_int32_volatile(term, blocked_offset) == 0:
        write_padding(term, blocked_offset, len(term) - blocked_offset, term_id, session_id, stream_id)
        return UnblockStatus.UNBLOCKED_TO_END
    return UnblockStatus.NO_ACTION


def log_unblock(log: LogBuffers, blocked_position: int) -> bool:
    """Unblock the log at the consumer's stuck position; True if something was done."""
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
            return True
        index = lbd.index_by_term_count(blocked_term_count)
        raw = lbd.raw_tail_volatile(meta, index)
        term_id = lbd.term_id(raw)
        term = log.term_buffer(index)
        status = term_unblock(
            term, blocked_offset, lbd.term_offset(raw, term_length), term_id, log.session_id, log.stream_id
        )
        if status is UnblockStatus.UNBLOCKED_TO_END:
            native.rotate_log(meta, blocked_term_count, term_id)
        return status is not UnblockStatus.NO_ACTION
    finally:
        if term is not None:
            term.release()
        meta.release()
