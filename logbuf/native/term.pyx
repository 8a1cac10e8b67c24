# cython: language_level=3
"""The term algorithms as small functions over Python buffers: scan a block, scan for availability,
append, rotate, clean, gap scan, rebuild insert, check a datagram, count and index frames.

Each takes a buffer, offsets and limits and returns ints (DESIGN.md §1); the C bodies they share with
the publication and image cores are the inline functions of ``term.pxd``. Arguments are checked (a bad
offset or length is a ValueError naming it) and lengths read from a buffer are never trusted: no
content of a term, block or datagram can move a read or a write outside it.
"""

from libc.string cimport memcpy, memset

from logbuf.native.atomics cimport lb_get_and_add_i64


cdef class TermBuffer:
    def __cinit__(self, object buffer, bint writable):
        PyObject_GetBuffer(buffer, &self.view, PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
        self.held = True

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef inline void _check_metadata(TermBuffer m) except *:
    if m.view.len < LOG_META_DATA_LENGTH or (<size_t>m.view.buf) % 8 != 0:
        raise ValueError(f"metadata buffer of {m.view.len} bytes is shorter than {LOG_META_DATA_LENGTH} or misaligned")


def term_scan_block(term_buffer, int32_t term_offset, int32_t limit_offset) -> int:
    """Offset after the last whole frame from ``term_offset`` up to ``limit_offset`` (stops before padding)."""
    cdef TermBuffer b = TermBuffer(term_buffer, False)
    check_term(b, term_offset)
    cdef int32_t term_length = <int32_t>b.view.len
    if limit_offset > term_length:
        limit_offset = term_length
    return scan_block(<const char *>b.view.buf, term_offset, limit_offset, term_length)


def term_scan_for_availability(term_buffer, int32_t term_offset, int32_t max_length) -> int:
    """Bytes of committed whole frames available to send from ``term_offset``, at most ``max_length``."""
    cdef TermBuffer b = TermBuffer(term_buffer, False)
    check_term(b, term_offset)
    return scan_for_availability(<const char *>b.view.buf, term_offset, max_length, <int32_t>b.view.len)


def check_data_datagram(packet, int32_t term_length) -> int:
    """The term bytes a valid DATA-path datagram covers (0 for a heartbeat; a PAD counts its full
    length, though only its header travels), or a negative reason code for an invalid one.

    Valid: one heartbeat (a 32-byte DATA header with length 0), or consecutive DATA frames of one
    session, stream and term, each at its aligned length (the last may lack its padding),
    optionally ending with one PAD sent as its 32-byte header. With ``term_length`` > 0 the frames
    must also lie inside a term of that length. Codes: -1 short, -2 version, -3 type, -4 length,
    -5 not consecutive, -6 outside the term.
    """
    cdef TermBuffer d = TermBuffer(packet, False)
    return check_data_frames(<const char *>d.view.buf, d.view.len, term_length)


def term_rebuild_insert(term_buffer, int32_t term_offset, packet) -> bool:
    """Aeron's TermRebuilder: put a datagram of whole frames into a receiver's term at ``term_offset``.

    Skipped (False) if a frame is already there (a duplicate). Otherwise everything but the first
    frame's length is copied, then that length is release-stored, so a reader that sees it sees
    the whole datagram. The caller has checked the frames (lengths, alignment, term bounds).
    """
    cdef TermBuffer b = TermBuffer(term_buffer, True)
    cdef TermBuffer d = TermBuffer(packet, False)
    check_term(b, term_offset)
    cdef Py_ssize_t length = d.view.len
    if length < HEADER_LENGTH or length > b.view.len - term_offset:
        raise ValueError(f"datagram of {length} bytes does not fit the term at term_offset={term_offset}")
    cdef char *dst = <char *>b.view.buf + term_offset
    cdef const char *src = <const char *>d.view.buf
    return rebuild_insert(dst, src, length)


def term_gap_scan(term_buffer, int32_t rebuild_offset, int32_t hwm_offset) -> tuple:
    """From ``rebuild_offset``: (end of the contiguous frames, padding included; length of the gap
    after them up to the next frame or ``hwm_offset``). A gap length of 0 means none before the HWM;
    so does a frame that runs past the end of the term (the contiguous frames end before it).
    """
    cdef TermBuffer b = TermBuffer(term_buffer, False)
    check_term(b, rebuild_offset)
    cdef int32_t term_length = <int32_t>b.view.len
    if hwm_offset > term_length:
        hwm_offset = term_length
    cdef const char *term = <const char *>b.view.buf
    cdef int32_t offset = rebuild_offset, frame_length, gap_end
    while offset < hwm_offset:
        frame_length = lb_load_acquire_i32(term + offset)
        if frame_length <= 0:
            break
        if frame_length > term_length - offset:
            return (offset, 0)
        offset += align_fitting_length(frame_length)
    if offset >= hwm_offset:
        return (offset, 0)
    gap_end = offset + FRAME_ALIGNMENT
    while gap_end < hwm_offset and lb_load_acquire_i32(term + gap_end) == 0:
        gap_end += FRAME_ALIGNMENT
    return (offset, gap_end - offset)


def term_clean(buffer, Py_ssize_t offset, Py_ssize_t length) -> None:
    """Zero ``length`` bytes from ``offset``: all but the first 8 plainly, then those 8 with release."""
    cdef TermBuffer b = TermBuffer(buffer, True)
    if offset < 0 or length < 0 or offset > b.view.len or length > b.view.len - offset:
        raise ValueError(f"clean range offset={offset} length={length} is outside the {b.view.len}-byte buffer")
    cdef char *p = <char *>b.view.buf + offset
    if (<size_t>p) % 8 != 0:
        raise ValueError(f"clean range offset={offset} is not at an 8-byte aligned address")
    if length > 8:
        memset(p + 8, 0, length - 8)
        lb_store_release_i64(p, 0)
    elif length > 0:
        memset(p, 0, length)


def count_frames(block, bint include_padding=False) -> int:
    """Number of frames in a block of whole frames (as given to a block handler): each frame whose
    header lies in the block, up to the first length <= 0."""
    cdef TermBuffer b = TermBuffer(block, False)
    cdef const char *p = <const char *>b.view.buf
    cdef Py_ssize_t offset = 0, n = 0
    cdef int32_t frame_length
    while offset + HEADER_LENGTH <= b.view.len:
        frame_length = (<int32_t *>(p + offset))[0]
        if frame_length <= 0:
            break
        if include_padding or frame_type(p + offset) != HDR_TYPE_PAD:
            n += 1
        offset += align_frame_length(frame_length)
    return n


def reserved_value_bounds(block) -> tuple:
    """(DATA frames whose reserved value is not 0, the least and the greatest of those values; 0, 0 if
    none) in a block of whole frames (as given to a block handler): each frame whose header lies in the
    block, up to the first length <= 0. The archive's time index bounds each segment with it."""
    cdef TermBuffer b = TermBuffer(block, False)
    cdef const char *p = <const char *>b.view.buf
    cdef Py_ssize_t offset = 0, n = 0
    cdef int32_t frame_length
    cdef int64_t value, low = 0, high = 0
    while offset + HEADER_LENGTH <= b.view.len:
        frame_length = (<int32_t *>(p + offset))[0]
        if frame_length <= 0:
            break
        if frame_type(p + offset) == HDR_TYPE_DATA:
            memcpy(&value, p + offset + RESERVED_VALUE_OFFSET, 8)
            if value != 0:
                if n == 0 or value < low:
                    low = value
                if n == 0 or value > high:
                    high = value
                n += 1
        offset += align_frame_length(frame_length)
    return n, low, high


def frame_index(block, int32_t[::1] offsets not None, int32_t[::1] lengths not None) -> int:
    """Fill ``offsets``/``lengths`` with each data frame's payload offset and length in ``block``.

    Returns how many frames were found (at most ``len(offsets)``); padding is skipped. With numpy:
    ``n = frame_index(block, offs, lens)`` then ``offs[:n]``, ``lens[:n]``. Lengths are as recorded
    (frame length - 32): a frame shorter than its header gives a negative length, for the caller to judge.
    """
    cdef TermBuffer b = TermBuffer(block, False)
    cdef const char *p = <const char *>b.view.buf
    cdef Py_ssize_t offset = 0, n = 0, cap = offsets.shape[0]
    cdef int32_t frame_length
    if lengths.shape[0] < cap:
        cap = lengths.shape[0]
    while offset + HEADER_LENGTH <= b.view.len and n < cap:
        frame_length = (<int32_t *>(p + offset))[0]
        if frame_length <= 0:
            break
        if frame_type(p + offset) != HDR_TYPE_PAD:
            offsets[n] = <int32_t>(offset + HEADER_LENGTH)
            lengths[n] = frame_length - HEADER_LENGTH
            n += 1
        offset += align_frame_length(frame_length)
    return n


def term_append_unfragmented(metadata, int partition_index, term_buffer, header_template, payload,
                             int64_t reserved_value=0) -> int:
    """Claim (get-and-add on the raw tail) and write one unfragmented frame.

    Returns the resulting term offset, or -2 (TERM_APPEND_FAILED) if the claim tripped the end
    of the term, in which case the rest of the term was padded and the caller must rotate.
    """
    cdef TermBuffer m = TermBuffer(metadata, True)
    cdef TermBuffer t = TermBuffer(term_buffer, True)
    cdef TermBuffer h = TermBuffer(header_template, False)
    cdef TermBuffer s = TermBuffer(payload, False)
    check_term(t, 0)
    _check_metadata(m)
    if not 0 <= partition_index < PARTITION_COUNT:
        raise ValueError(f"partition_index={partition_index} must be 0, 1 or 2")
    if h.view.len < HEADER_LENGTH:
        raise ValueError(f"header template is {h.view.len} bytes, expected {HEADER_LENGTH}")
    cdef int32_t term_length = <int32_t>t.view.len
    if s.view.len > term_length - HEADER_LENGTH:
        raise ValueError(f"payload of {s.view.len} bytes does not fit one frame of a {term_length}-byte term")
    cdef const char *hp = <const char *>h.view.buf
    cdef int64_t vft = (<int64_t *>hp)[0] & ~(<int64_t>0xFFFFFFFF)
    cdef int64_t session_id = (<int32_t *>(hp + SESSION_ID_OFFSET))[0]
    cdef int32_t stream_id = (<int32_t *>(hp + STREAM_ID_OFFSET))[0]
    cdef int32_t length = <int32_t>s.view.len
    cdef int32_t aligned = <int32_t>align_frame_length(length + HEADER_LENGTH)
    cdef char *tail = <char *>m.view.buf + TAIL_COUNTERS_OFFSET + 8 * partition_index
    cdef int64_t raw_tail = lb_get_and_add_i64(tail, aligned)
    cdef int64_t term_offset = <int64_t>(<uint32_t>raw_tail)  # 0 .. 2^32 - 1, whatever the tail holds
    cdef int32_t term_id = <int32_t>(raw_tail >> 32)
    if term_offset > term_length - aligned:
        return handle_end_of_log(<char *>t.view.buf, term_offset, term_length, term_id, vft, session_id, stream_id)
    return write_unfragmented(<char *>t.view.buf, <int32_t>term_offset, term_id, <const char *>s.view.buf, length,
                              reserved_value, vft, session_id, stream_id)


def rotate_log(metadata, int32_t term_count, int32_t term_id) -> bool:
    """Rotate to the next term; True if this caller's CAS of the active term count won."""
    cdef TermBuffer m = TermBuffer(metadata, True)
    _check_metadata(m)
    return rotate_to_next_term(<char *>m.view.buf, term_count, term_id)
