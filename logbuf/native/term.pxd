# cython: language_level=3
"""The term algorithms as inline C functions over raw pointers, shared by the native modules: the Python
wrappers in ``term.pyx``, the publication and image cores, and the driver's datagram sender
(``logbuf.driver._udp``). Inline here, they compile into each user: a hot loop never calls across modules.

Lengths read from a term are not trusted: the scans align them in 64 bits (``align_frame_length``, no
overflow for any int32, 0x7fffffff included) and stop before a frame that runs past their limit or the
end of the term; the readers stop at a length that runs past the end of the term before aligning it in
32 bits (``align_fitting_length``). No frame length can move an offset outside the term.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t
from libc.string cimport memcpy

from logbuf.native.atomics cimport (
    lb_cas_i32,
    lb_cas_i64,
    lb_fence_release,
    lb_load_acquire_i32,
    lb_load_acquire_i64,
    lb_store_release_i32,
    lb_store_release_i64,
)
from logbuf.native.constants cimport *


# -- arithmetic ------------------------------------------------------------------------------------------
cdef inline int64_t align_frame_length(int64_t length) noexcept nogil:
    """``length`` rounded up to FRAME_ALIGNMENT, in 64 bits: no overflow for any int32 frame length."""
    return (length + (FRAME_ALIGNMENT - 1)) & ~(<int64_t>(FRAME_ALIGNMENT - 1))


cdef inline int32_t align_fitting_length(int32_t length) noexcept nogil:
    """``length`` rounded up to FRAME_ALIGNMENT in 32 bits, for a length already checked to fit what is
    left of a term (at most 1 GiB): the hot loops check ``0 < frame_length <= term_length - offset``
    first, so this cannot overflow, and from a frame boundary the aligned frame still fits the term."""
    return (length + (FRAME_ALIGNMENT - 1)) & ~(FRAME_ALIGNMENT - 1)


cdef inline int32_t partition_index(int64_t term_count) noexcept nogil:
    """The partition (0, 1 or 2) of a term count; never negative, whatever the count."""
    cdef int64_t index = term_count % PARTITION_COUNT
    return <int32_t>(index + PARTITION_COUNT if index < 0 else index)


cdef inline int32_t log2_of(int64_t v) noexcept nogil:
    cdef int32_t n = 0
    while v > 1:
        v >>= 1
        n += 1
    return n


cdef inline uint16_t frame_type(const char *frame) noexcept nogil:
    return (<uint16_t *>(frame + TYPE_OFFSET))[0]


# -- appending (Aeron's TermAppender, HeaderWriter and LogBufferDescriptor.rotateLog) ---------------------
cdef inline void header_write(char *term, int32_t frame_offset, int32_t frame_length, int32_t term_id,
                              int64_t version_flags_type, int64_t session_id, int32_t stream_id) noexcept nogil:
    """Aeron's HeaderWriter: negative length + version/flags/type as one release store, then ids."""
    cdef int64_t first = version_flags_type | (<int64_t>(<uint32_t>(-frame_length)))
    lb_store_release_i64(term + frame_offset, first)
    lb_fence_release()
    (<int64_t *>(term + frame_offset + TERM_OFFSET_OFFSET))[0] = (session_id << 32) | (<int64_t>(<uint32_t>frame_offset))
    (<int64_t *>(term + frame_offset + STREAM_ID_OFFSET))[0] = ((<int64_t>term_id) << 32) | (<int64_t>(<uint32_t>stream_id))


cdef inline int64_t pad_vft(int64_t version_flags_type) noexcept nogil:
    """version/flags/type word of a padding frame: same version and flags, type PAD."""
    return version_flags_type & ((<int64_t>0xFFFF) << 32)


cdef inline int32_t handle_end_of_log(char *term, int64_t term_offset, int32_t term_length, int32_t term_id,
                                      int64_t vft, int64_t session_id, int32_t stream_id) noexcept nogil:
    """Pad the rest of the term from ``term_offset`` (if any is left) after a claim tripped it.
    ``term_offset`` is the raw tail's offset (0 .. 2^32 - 1): past the end of the term, or off a frame
    boundary (a corrupted tail, where the 32-byte header might not fit), nothing is written."""
    cdef int32_t padding_length
    if 0 <= term_offset < term_length and term_offset % FRAME_ALIGNMENT == 0:
        padding_length = <int32_t>(term_length - term_offset)
        header_write(term, <int32_t>term_offset, padding_length, term_id, pad_vft(vft), session_id, stream_id)
        lb_store_release_i32(term + term_offset, padding_length)
    return TERM_APPEND_FAILED


cdef inline int32_t write_unfragmented(char *term, int32_t term_offset, int32_t term_id, const char *src,
                                       int32_t length, int64_t reserved_value, int64_t vft,
                                       int64_t session_id, int32_t stream_id) noexcept nogil:
    """Write and commit one frame whose claim (``term_offset``, aligned length) the caller holds."""
    cdef int32_t frame_length = length + HEADER_LENGTH
    header_write(term, term_offset, frame_length, term_id, vft, session_id, stream_id)
    if length > 0:
        memcpy(term + term_offset + HEADER_LENGTH, src, length)
    (<int64_t *>(term + term_offset + RESERVED_VALUE_OFFSET))[0] = reserved_value
    lb_store_release_i32(term + term_offset, frame_length)
    return term_offset + <int32_t>align_frame_length(frame_length)


cdef inline int32_t write_fragmented(char *term, int32_t term_offset, int32_t term_id, const char *src,
                                     int32_t length, int32_t max_payload, int64_t reserved_value, int64_t vft,
                                     int64_t session_id, int32_t stream_id) noexcept nogil:
    """Write and commit BEGIN, middle and END fragments of one message into a claim the caller holds."""
    cdef int32_t remaining = length
    cdef int32_t frame_offset = term_offset
    cdef int32_t bytes_to_write, frame_length
    cdef uint8_t flags = BEGIN_FLAG
    cdef int64_t base_vft = vft & ~(<int64_t>0xFF << 40)
    while True:
        bytes_to_write = remaining if remaining < max_payload else max_payload
        frame_length = bytes_to_write + HEADER_LENGTH
        if remaining <= max_payload:
            flags |= END_FLAG
        header_write(term, frame_offset, frame_length, term_id, base_vft | ((<int64_t>flags) << 40),
                     session_id, stream_id)
        memcpy(term + frame_offset + HEADER_LENGTH, src + (length - remaining), bytes_to_write)
        (<int64_t *>(term + frame_offset + RESERVED_VALUE_OFFSET))[0] = reserved_value
        lb_store_release_i32(term + frame_offset, frame_length)
        flags = 0
        frame_offset += <int32_t>align_frame_length(frame_length)
        remaining -= bytes_to_write
        if remaining <= 0:
            break
    return frame_offset


cdef inline int32_t fragmented_length(int32_t length, int32_t max_payload) noexcept nogil:
    """Aligned term space of a ``length``-byte message cut into ``max_payload`` fragments (max_payload > 0)."""
    cdef int32_t full = length // max_payload
    cdef int32_t last = length - full * max_payload
    cdef int32_t total = full * <int32_t>align_frame_length(max_payload + HEADER_LENGTH)
    if last > 0:
        total += <int32_t>align_frame_length(last + HEADER_LENGTH)
    return total


cdef inline bint rotate_to_next_term(char *meta, int32_t term_count, int32_t term_id) noexcept nogil:
    """Aeron's rotateLog: initialise the next partition's tail, then CAS the active term count."""
    cdef int32_t next_term_id = term_id + 1
    cdef int32_t next_term_count = term_count + 1
    cdef int32_t expected_term_id = next_term_id - PARTITION_COUNT
    cdef char *tail_addr = meta + TAIL_COUNTERS_OFFSET + 8 * partition_index(next_term_count)
    cdef int64_t raw_tail
    while True:
        raw_tail = lb_load_acquire_i64(tail_addr)
        if expected_term_id != <int32_t>(raw_tail >> 32):
            break
        if lb_cas_i64(tail_addr, raw_tail, (<int64_t>next_term_id) << 32):
            break
    return lb_cas_i32(meta + ACTIVE_TERM_COUNT_OFFSET, term_count, next_term_count)


# -- checking a frame length read from a log -------------------------------------------------------------
cdef inline int frame_length_fault(int32_t frame_length, int32_t remaining) noexcept nogil:
    """Why ``frame_length``, read at a frame boundary with ``remaining`` bytes of the term from it, cannot
    be a frame (FRAME_SHORT, FRAME_PAST_TERM_END, FRAME_NEGATIVE), else FRAME_NOT_YET (0): nothing
    committed there yet, or a length that fits. The readers call it only on their cold path, for a length
    outside [HEADER_LENGTH, remaining]. A claimer writes its frame's negative length first
    (``header_write``), so a negative length is a claim in progress only if it is minus a frame length
    that fits the term; a PAD frame is checked as any other (an aborted claim's PAD keeps its unaligned
    frame length, as in Aeron, so alignment alone proves nothing)."""
    cdef int64_t claimed
    if frame_length == 0:
        return FRAME_NOT_YET
    if frame_length < 0:
        claimed = -(<int64_t>frame_length)  # 64 bits: -INT_MIN does not fit an int32
        return FRAME_NOT_YET if HEADER_LENGTH <= claimed <= remaining else FRAME_NEGATIVE
    if frame_length < HEADER_LENGTH:
        return FRAME_SHORT
    if frame_length > remaining:
        return FRAME_PAST_TERM_END
    return FRAME_NOT_YET


# -- scanning (Aeron's TermBlockScanner and TermScanner) -------------------------------------------------
cdef inline int32_t scan_block(const char *term, int32_t term_offset, int32_t limit_offset,
                               int32_t term_length) noexcept nogil:
    """Aeron's TermBlockScanner: end offset of whole frames from ``term_offset`` up to ``limit_offset``.

    Stops before padding (a leading padding frame is a block of its own), at a length shorter than a
    header (0: not yet; negative: a claim being written; 1..31: no frame), before a length that runs past
    the end of the term and before a frame running past ``limit_offset``.
    ``term_offset`` is a multiple of FRAME_ALIGNMENT, ``limit_offset`` <= ``term_length``.
    """
    cdef int64_t offset = term_offset, end, limit = limit_offset  # 64 bits: no frame length can wrap them
    cdef int32_t frame_length
    while offset < limit:
        frame_length = lb_load_acquire_i32(term + offset)
        if frame_length < HEADER_LENGTH:  # not yet, or no frame (a corrupt log: the block poll raises)
            break
        end = offset + align_frame_length(frame_length)
        if frame_type(term + offset) == HDR_TYPE_PAD:
            if term_offset == offset and end <= term_length:
                offset = end
            break
        if end > limit:
            break
        offset = end
    return <int32_t>offset


cdef inline int32_t scan_for_availability(const char *term, int32_t offset, int32_t max_length,
                                          int32_t term_length) noexcept nogil:
    """Aeron's TermScanner: bytes of whole frames available from ``offset``, up to ``max_length``.

    A padding frame ends the scan and counts fully (it is sent as its header). A frame running past
    ``max_length`` or the end of the term ends it before that frame. ``offset`` is a multiple of
    FRAME_ALIGNMENT within the term.
    """
    cdef int64_t available = 0, end  # 64 bits: no frame length can wrap them
    cdef int64_t limit = term_length - offset
    cdef const char *start = term + offset
    cdef int32_t frame_length
    if max_length < limit:
        limit = max_length
    while available < limit:
        frame_length = lb_load_acquire_i32(start + available)
        if frame_length < HEADER_LENGTH:  # not yet, or no frame (a corrupt log): nothing to send from here
            break
        end = available + align_frame_length(frame_length)
        if frame_type(start + available) == HDR_TYPE_PAD:
            if available == 0 and end <= term_length - offset:
                available = end
            break
        if end > limit:
            break
        available = end
    return <int32_t>available


# -- receiving (Aeron's DataPacketDispatcher checks and TermRebuilder) -----------------------------------
cdef inline int64_t check_data_frames(const char *p, Py_ssize_t n, int32_t term_length) noexcept nogil:
    """``check_data_datagram``'s body: the term bytes the DATA-path datagram of ``n`` bytes at ``p`` covers
    (0: a heartbeat), or a negative DATAGRAM_* reason code."""
    cdef Py_ssize_t offset = 0
    cdef int32_t frame_length, session_id, stream_id, term_id, first
    cdef int64_t aligned, expected
    cdef uint16_t type_
    if n < HEADER_LENGTH:
        return DATAGRAM_SHORT
    session_id = (<int32_t *>(p + SESSION_ID_OFFSET))[0]
    stream_id = (<int32_t *>(p + STREAM_ID_OFFSET))[0]
    term_id = (<int32_t *>(p + TERM_ID_OFFSET))[0]
    first = (<int32_t *>(p + TERM_OFFSET_OFFSET))[0]
    if first < 0 or first % FRAME_ALIGNMENT != 0 or (term_length > 0 and first > term_length - HEADER_LENGTH):
        return DATAGRAM_OUTSIDE_TERM
    expected = first
    while offset < n:
        if n - offset < HEADER_LENGTH:
            return DATAGRAM_BAD_LENGTH
        frame_length = (<int32_t *>(p + offset))[0]
        if (<uint8_t *>(p + offset + VERSION_OFFSET))[0] != 0:
            return DATAGRAM_BAD_VERSION
        type_ = frame_type(p + offset)
        if ((<int32_t *>(p + offset + SESSION_ID_OFFSET))[0] != session_id
                or (<int32_t *>(p + offset + STREAM_ID_OFFSET))[0] != stream_id
                or (<int32_t *>(p + offset + TERM_ID_OFFSET))[0] != term_id
                or (<int32_t *>(p + offset + TERM_OFFSET_OFFSET))[0] != expected):
            return DATAGRAM_NOT_CONSECUTIVE
        if type_ == HDR_TYPE_DATA:
            if frame_length == 0:
                return 0 if n == HEADER_LENGTH else DATAGRAM_BAD_LENGTH
            if frame_length < HEADER_LENGTH or frame_length > n - offset:
                return DATAGRAM_BAD_LENGTH
            aligned = align_frame_length(frame_length)
            offset += aligned if aligned <= n - offset else n - offset
        elif type_ == HDR_TYPE_PAD:
            if frame_length < HEADER_LENGTH or offset + HEADER_LENGTH != n:
                return DATAGRAM_BAD_LENGTH
            aligned = align_frame_length(frame_length)
            offset += HEADER_LENGTH
        else:
            return DATAGRAM_BAD_TYPE
        if term_length > 0 and aligned > term_length - expected:
            return DATAGRAM_OUTSIDE_TERM
        expected += aligned
    return expected - first


cdef inline bint rebuild_insert(char *dst, const char *src, Py_ssize_t length) noexcept nogil:
    """``term_rebuild_insert``'s body: skip (False) if a frame is already at ``dst``, else copy all but the
    first frame's length, then release-store it."""
    if lb_load_acquire_i32(dst) != 0:
        return False
    memcpy(dst + 4, src + 4, length - 4)
    lb_store_release_i32(dst, (<int32_t *>src)[0])
    return True


# -- Python buffers ----------------------------------------------------------------------------------------
cdef class TermBuffer:
    """A Python buffer held (and released on deallocation) for the length of one native call."""
    cdef Py_buffer view
    cdef bint held


cdef inline void check_term(TermBuffer b, Py_ssize_t offset) except *:
    """A term: a power of two from 64 KiB to 1 GiB, 8-byte aligned; ``offset`` a frame boundary in it."""
    if b.view.len < TERM_MIN_LENGTH or b.view.len > TERM_MAX_LENGTH or b.view.len & (b.view.len - 1):
        raise ValueError(f"term buffer length={b.view.len} is not a power of 2 >= {TERM_MIN_LENGTH} and <= {TERM_MAX_LENGTH}")
    if offset < 0 or offset > b.view.len or offset % FRAME_ALIGNMENT != 0:
        raise ValueError(f"term_offset={offset} is not a multiple of {FRAME_ALIGNMENT} within the term")
    if (<size_t>b.view.buf) % 8 != 0:
        raise ValueError("term buffer is not 8-byte aligned")
