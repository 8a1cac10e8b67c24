# cython: language_level=3
"""logbuf's native core: memory-ordered access to shared memory, and the hot loops.

Theory of operation
-------------------
Plain Python writes into an mmap are neither atomic nor ordered, so every access whose
ordering matters between processes goes through the ``lb_*`` functions of ``lb_atomics.h``
(GCC ``__atomic`` builtins): acquire loads, release stores, get-and-add, compare-and-set.

Publishers claim space in a term with one atomic get-and-add on the partition's raw tail
(``term_id << 32 | term_offset``). The claimer owns ``[term_offset, term_offset + length)``.
It writes the frame's first 8 bytes (negative length, version, flags, type) as one release
store, then the rest of the header and the payload, and commits with a release store of the
positive frame length. Readers acquire-load the frame length: a value <= 0 means "not yet".

A claim that runs past the end of the term makes its claimer write a PAD frame over what is
left (if anything) and rotate the log: CAS the next partition's raw tail to
``(term_id + 1) << 32`` (only if it still holds ``term_id + 1 - 3``), then CAS the active term
count from ``count`` to ``count + 1``. Only one rotator wins each CAS. Everybody else sees a
raw tail whose term id does not match the active term count and gets ADMIN_ACTION.

Cleaning (zeroing the partition that will be reused) is done by whoever advances the
publisher limit (the media driver's conductor, or the standalone flow control), *before*
the limit is raised: a publisher can therefore never write into a dirty partition.

Python-visible contract: the small functions (``term_read``, ``term_scan_block``,
``term_append_unfragmented`` ...) take buffers, offsets and limits and return ints, exactly
as the pure term algorithms are described in DESIGN.md. ``PublicationCore`` and ``ImageCore``
run the same code paths with the buffers already resolved to pointers, so that one
``offer()`` or ``poll()`` is a single call from Python.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.object cimport PyObject
from cpython.sequence cimport PySequence_Fast, PySequence_Fast_GET_SIZE, PySequence_Fast_ITEMS

import sys

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("logbuf supports little-endian hosts only (frames and metadata are little-endian)")

cdef extern from "lb_atomics.h" nogil:
    int32_t lb_load_acquire_i32(const void *p)
    int64_t lb_load_acquire_i64(const void *p)
    void lb_store_release_i32(void *p, int32_t v)
    void lb_store_release_i64(void *p, int64_t v)
    int32_t lb_get_and_add_i32(void *p, int32_t d)
    int64_t lb_get_and_add_i64(void *p, int64_t d)
    bint lb_cas_i32(void *p, int32_t expected, int32_t desired)
    bint lb_cas_i64(void *p, int64_t expected, int64_t desired)
    void lb_fence_release()
    void lb_fence_acquire()

# ---------------------------------------------------------------------------------------------
# Layout constants (the descriptor modules are the source of truth; a test checks they agree)
# ---------------------------------------------------------------------------------------------
cdef enum: HEADER_LENGTH = 32
cdef enum: FRAME_ALIGNMENT = 32
cdef enum: TYPE_OFFSET = 6
cdef enum: FLAGS_OFFSET = 5
cdef enum: TERM_OFFSET_OFFSET = 8
cdef enum: SESSION_ID_OFFSET = 12
cdef enum: STREAM_ID_OFFSET = 16
cdef enum: TERM_ID_OFFSET = 20
cdef enum: RESERVED_VALUE_OFFSET = 24
cdef enum: HDR_TYPE_PAD = 0
cdef enum: HDR_TYPE_DATA = 1
cdef enum: BEGIN_FLAG = 0x80
cdef enum: END_FLAG = 0x40
cdef enum: UNFRAGMENTED = 0xC0
cdef enum: PARTITION_COUNT = 3
cdef enum: LOG_META_DATA_LENGTH = 4096
cdef enum: TAIL_COUNTERS_OFFSET = 0
cdef enum: ACTIVE_TERM_COUNT_OFFSET = 24
cdef enum: END_OF_STREAM_POSITION_OFFSET = 128
cdef enum: IS_CONNECTED_OFFSET = 136
cdef enum: INITIAL_TERM_ID_OFFSET = 264
cdef enum: MTU_LENGTH_OFFSET = 272
cdef enum: TERM_LENGTH_OFFSET = 276
cdef enum: DEFAULT_FRAME_HEADER_OFFSET = 320
cdef enum: MAX_MESSAGE_LENGTH = 16777216

# Offer results (negative); mirrored by logbuf.logbuffer.publication.OfferResult.
cdef enum: NOT_CONNECTED = -1
cdef enum: BACK_PRESSURED = -2
cdef enum: ADMIN_ACTION = -3
cdef enum: CLOSED = -4
cdef enum: MAX_POSITION_EXCEEDED = -5
cdef enum: TERM_APPEND_FAILED = -2  # term appender: the claim tripped the end of the term
cdef enum: TRIPPED = -1002  # publication: the claim tripped the term, which was padded and rotated; retry

# Controlled poll actions; mirrored by logbuf.logbuffer.image.ControlledPollAction.
cdef enum: ACTION_ABORT = 1
cdef enum: ACTION_BREAK = 2
cdef enum: ACTION_COMMIT = 3
cdef enum: ACTION_CONTINUE = 4

NATIVE_CONSTANTS = {
    "HEADER_LENGTH": HEADER_LENGTH,
    "FRAME_ALIGNMENT": FRAME_ALIGNMENT,
    "TYPE_FIELD_OFFSET": TYPE_OFFSET,
    "FLAGS_FIELD_OFFSET": FLAGS_OFFSET,
    "TERM_OFFSET_FIELD_OFFSET": TERM_OFFSET_OFFSET,
    "SESSION_ID_FIELD_OFFSET": SESSION_ID_OFFSET,
    "STREAM_ID_FIELD_OFFSET": STREAM_ID_OFFSET,
    "TERM_ID_FIELD_OFFSET": TERM_ID_OFFSET,
    "RESERVED_VALUE_FIELD_OFFSET": RESERVED_VALUE_OFFSET,
    "HDR_TYPE_PAD": HDR_TYPE_PAD,
    "HDR_TYPE_DATA": HDR_TYPE_DATA,
    "BEGIN_FLAG": BEGIN_FLAG,
    "END_FLAG": END_FLAG,
    "PARTITION_COUNT": PARTITION_COUNT,
    "LOG_META_DATA_LENGTH": LOG_META_DATA_LENGTH,
    "TERM_TAIL_COUNTERS_OFFSET": TAIL_COUNTERS_OFFSET,
    "LOG_ACTIVE_TERM_COUNT_OFFSET": ACTIVE_TERM_COUNT_OFFSET,
    "LOG_END_OF_STREAM_POSITION_OFFSET": END_OF_STREAM_POSITION_OFFSET,
    "LOG_IS_CONNECTED_OFFSET": IS_CONNECTED_OFFSET,
    "LOG_INITIAL_TERM_ID_OFFSET": INITIAL_TERM_ID_OFFSET,
    "LOG_MTU_LENGTH_OFFSET": MTU_LENGTH_OFFSET,
    "LOG_TERM_LENGTH_OFFSET": TERM_LENGTH_OFFSET,
    "LOG_DEFAULT_FRAME_HEADER_OFFSET": DEFAULT_FRAME_HEADER_OFFSET,
    "MAX_MESSAGE_LENGTH": MAX_MESSAGE_LENGTH,
}


cdef inline int32_t _align(int32_t value) noexcept nogil:
    return (value + (FRAME_ALIGNMENT - 1)) & ~(FRAME_ALIGNMENT - 1)


# ---------------------------------------------------------------------------------------------
# Generic ordered access on any buffer, with bounds and alignment checked
# ---------------------------------------------------------------------------------------------
cdef inline char *_address(Py_buffer *view, object buffer, Py_ssize_t offset, Py_ssize_t size, bint writable) except NULL:
    cdef int flags = PyBUF_WRITABLE if writable else PyBUF_SIMPLE
    PyObject_GetBuffer(buffer, view, flags)
    if offset < 0 or offset > view.len - size:  # not offset + size: that can overflow
        PyBuffer_Release(view)
        raise ValueError(f"offset={offset} is out of bounds for a {size}-byte access in a buffer of {view.len} bytes")
    cdef char *p = <char *>view.buf + offset
    if (<size_t>p) % size != 0:
        PyBuffer_Release(view)
        raise ValueError(f"offset={offset} is not {size}-byte aligned (address alignment required for atomic access)")
    return p


def get_int32_volatile(buffer, Py_ssize_t offset) -> int:
    """Acquire-load of the int32 at ``offset``."""
    cdef Py_buffer view
    cdef char *p = _address(&view, buffer, offset, 4, False)
    cdef int32_t v = lb_load_acquire_i32(p)
    PyBuffer_Release(&view)
    return v


def get_int64_volatile(buffer, Py_ssize_t offset) -> int:
    """Acquire-load of the int64 at ``offset``."""
    cdef Py_buffer view
    cdef char *p = _address(&view, buffer, offset, 8, False)
    cdef int64_t v = lb_load_acquire_i64(p)
    PyBuffer_Release(&view)
    return v


def put_int32_ordered(buffer, Py_ssize_t offset, int32_t value) -> None:
    """Release-store of an int32 at ``offset``: earlier writes are visible before it."""
    cdef Py_buffer view
    cdef char *p = _address(&view, buffer, offset, 4, True)
    lb_store_release_i32(p, value)
    PyBuffer_Release(&view)


def put_int64_ordered(buffer, Py_ssize_t offset, int64_t value) -> None:
    """Release-store of an int64 at ``offset``: earlier writes are visible before it."""
    cdef Py_buffer view
    cdef char *p = _address(&view, buffer, offset, 8, True)
    lb_store_release_i64(p, value)
    PyBuffer_Release(&view)


def get_and_add_int32(buffer, Py_ssize_t offset, int32_t delta) -> int:
    """Atomically add ``delta`` to the int32 at ``offset``; returns the previous value."""
    cdef Py_buffer view
    cdef char *p = _address(&view, buffer, offset, 4, True)
    cdef int32_t v = lb_get_and_add_i32(p, delta)
    PyBuffer_Release(&view)
    return v


def get_and_add_int64(buffer, Py_ssize_t offset, int64_t delta) -> int:
    """Atomically add ``delta`` to the int64 at ``offset``; returns the previous value."""
    cdef Py_buffer view
    cdef char *p = _address(&view, buffer, offset, 8, True)
    cdef int64_t v = lb_get_and_add_i64(p, delta)
    PyBuffer_Release(&view)
    return v


def compare_and_set_int32(buffer, Py_ssize_t offset, int32_t expected, int32_t update) -> bool:
    """Atomically set the int32 at ``offset`` to ``update`` if it holds ``expected``."""
    cdef Py_buffer view
    cdef char *p = _address(&view, buffer, offset, 4, True)
    cdef bint ok = lb_cas_i32(p, expected, update)
    PyBuffer_Release(&view)
    return ok


def compare_and_set_int64(buffer, Py_ssize_t offset, int64_t expected, int64_t update) -> bool:
    """Atomically set the int64 at ``offset`` to ``update`` if it holds ``expected``."""
    cdef Py_buffer view
    cdef char *p = _address(&view, buffer, offset, 8, True)
    cdef bint ok = lb_cas_i64(p, expected, update)
    PyBuffer_Release(&view)
    return ok


# ---------------------------------------------------------------------------------------------
# Position: an int64 counter in shared memory (publisher limit, subscriber position, ...)
# ---------------------------------------------------------------------------------------------
cdef class Position:
    """A 64-bit position counter at a fixed, 8-byte aligned offset of a shared buffer."""

    cdef object _mem
    cdef char *_p
    cdef readonly Py_ssize_t offset

    def __cinit__(self, buffer, Py_ssize_t offset):
        cdef Py_buffer view
        self._p = _address(&view, buffer, offset, 8, True)
        PyBuffer_Release(&view)
        self._mem = memoryview(buffer)  # keeps the mapping exported (cannot be unmapped under us)
        self.offset = offset

    cdef inline void _check(self) except *:
        if self._mem is None:
            raise ValueError("position is closed")

    def get(self) -> int:
        """Plain load (only for the position's single writer)."""
        self._check()
        return (<int64_t *>self._p)[0]

    def get_volatile(self) -> int:
        """Acquire-load."""
        self._check()
        return lb_load_acquire_i64(self._p)

    def set_ordered(self, int64_t value) -> None:
        """Release-store."""
        self._check()
        lb_store_release_i64(self._p, value)

    def propose_max_ordered(self, int64_t value) -> bool:
        """Release-store ``value`` if it is larger than the current value (single writer)."""
        self._check()
        if lb_load_acquire_i64(self._p) < value:
            lb_store_release_i64(self._p, value)
            return True
        return False

    def close(self) -> None:
        if self._mem is not None:
            self._mem.release()
            self._mem = None
            self._p = NULL


# ---------------------------------------------------------------------------------------------
# Term algorithms as cdef functions over raw pointers
# ---------------------------------------------------------------------------------------------
cdef inline void _header_write(char *term, int32_t frame_offset, int32_t frame_length, int32_t term_id,
                               int64_t version_flags_type, int64_t session_id, int32_t stream_id) noexcept nogil:
    """Aeron's HeaderWriter: negative length + version/flags/type as one release store, then ids."""
    cdef int64_t first = version_flags_type | (<int64_t>(<uint32_t>(-frame_length)))
    lb_store_release_i64(term + frame_offset, first)
    lb_fence_release()
    (<int64_t *>(term + frame_offset + TERM_OFFSET_OFFSET))[0] = (session_id << 32) | (<int64_t>(<uint32_t>frame_offset))
    (<int64_t *>(term + frame_offset + STREAM_ID_OFFSET))[0] = ((<int64_t>term_id) << 32) | (<int64_t>(<uint32_t>stream_id))


cdef inline int64_t _pad_vft(int64_t version_flags_type) noexcept nogil:
    """version/flags/type word of a padding frame: same version and flags, type PAD."""
    return version_flags_type & ((<int64_t>0xFFFF) << 32)


cdef inline int32_t _handle_end_of_log(char *term, int32_t term_offset, int32_t term_length, int32_t term_id,
                                       int64_t vft, int64_t session_id, int32_t stream_id) noexcept nogil:
    """Pad the rest of the term from ``term_offset`` (if any is left) after a claim tripped it."""
    cdef int32_t padding_length
    if term_offset < term_length:
        padding_length = term_length - term_offset
        _header_write(term, term_offset, padding_length, term_id, _pad_vft(vft), session_id, stream_id)
        lb_store_release_i32(term + term_offset, padding_length)
    return TERM_APPEND_FAILED


cdef inline int32_t _write_unfragmented(char *term, int32_t term_offset, int32_t term_id, const char *src,
                                        int32_t length, int64_t reserved_value, int64_t vft,
                                        int64_t session_id, int32_t stream_id) noexcept nogil:
    cdef int32_t frame_length = length + HEADER_LENGTH
    _header_write(term, term_offset, frame_length, term_id, vft, session_id, stream_id)
    if length > 0:
        memcpy(term + term_offset + HEADER_LENGTH, src, length)
    (<int64_t *>(term + term_offset + RESERVED_VALUE_OFFSET))[0] = reserved_value
    lb_store_release_i32(term + term_offset, frame_length)
    return term_offset + _align(frame_length)


cdef inline int32_t _write_fragmented(char *term, int32_t term_offset, int32_t term_id, const char *src,
                                      int32_t length, int32_t max_payload, int64_t reserved_value, int64_t vft,
                                      int64_t session_id, int32_t stream_id) noexcept nogil:
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
        _header_write(term, frame_offset, frame_length, term_id, base_vft | ((<int64_t>flags) << 40),
                      session_id, stream_id)
        memcpy(term + frame_offset + HEADER_LENGTH, src + (length - remaining), bytes_to_write)
        (<int64_t *>(term + frame_offset + RESERVED_VALUE_OFFSET))[0] = reserved_value
        lb_store_release_i32(term + frame_offset, frame_length)
        flags = 0
        frame_offset += _align(frame_length)
        remaining -= bytes_to_write
        if remaining <= 0:
            break
    return frame_offset


cdef inline int32_t _fragmented_length(int32_t length, int32_t max_payload) noexcept nogil:
    cdef int32_t full = length // max_payload
    cdef int32_t last = length - full * max_payload
    cdef int32_t total = full * _align(max_payload + HEADER_LENGTH)
    if last > 0:
        total += _align(last + HEADER_LENGTH)
    return total


cdef inline bint _rotate_log(char *meta, int32_t term_count, int32_t term_id) noexcept nogil:
    """Aeron's rotateLog: initialise the next partition's tail, then CAS the active term count."""
    cdef int32_t next_term_id = term_id + 1
    cdef int32_t next_term_count = term_count + 1
    cdef int32_t next_index = next_term_count % PARTITION_COUNT
    cdef int32_t expected_term_id = next_term_id - PARTITION_COUNT
    cdef char *tail_addr = meta + TAIL_COUNTERS_OFFSET + 8 * next_index
    cdef int64_t raw_tail
    while True:
        raw_tail = lb_load_acquire_i64(tail_addr)
        if expected_term_id != <int32_t>(raw_tail >> 32):
            break
        if lb_cas_i64(tail_addr, raw_tail, (<int64_t>next_term_id) << 32):
            break
    return lb_cas_i32(meta + ACTIVE_TERM_COUNT_OFFSET, term_count, next_term_count)


cdef inline int32_t _scan_block(const char *term, int32_t term_offset, int32_t limit_offset) noexcept nogil:
    """Aeron's TermBlockScanner: end offset of whole frames from ``term_offset`` up to ``limit_offset``."""
    cdef int32_t offset = term_offset
    cdef int32_t frame_length, aligned
    while offset < limit_offset:
        frame_length = lb_load_acquire_i32(term + offset)
        if frame_length <= 0:
            break
        aligned = _align(frame_length)
        if (<uint16_t *>(term + offset + TYPE_OFFSET))[0] == HDR_TYPE_PAD:
            if term_offset == offset:
                offset += aligned
            break
        if offset + aligned > limit_offset:
            break
        offset += aligned
    return offset


cdef inline int32_t _scan_for_availability(const char *term, int32_t offset, int32_t max_length,
                                           int32_t term_length) noexcept nogil:
    """Aeron's TermScanner: bytes of whole frames available from ``offset``, up to ``max_length``
    (a padding frame ends the scan and counts fully)."""
    cdef int32_t available = 0
    cdef int32_t frame_length, aligned
    cdef int32_t limit = term_length - offset
    if max_length < limit:
        limit = max_length
    while available < limit:
        frame_length = lb_load_acquire_i32(term + offset + available)
        if frame_length <= 0:
            break
        aligned = _align(frame_length)
        if (<uint16_t *>(term + offset + available + TYPE_OFFSET))[0] == HDR_TYPE_PAD:
            if available == 0:
                available = aligned
            break
        if available + aligned > limit:
            if available == 0:
                available = aligned if aligned <= max_length else 0
            break
        available += aligned
    return available


# ---------------------------------------------------------------------------------------------
# Buffer helper for the Python-visible term algorithm functions
# ---------------------------------------------------------------------------------------------
cdef class _Buf:
    cdef Py_buffer view
    cdef bint held

    def __cinit__(self, object buffer, bint writable):
        PyObject_GetBuffer(buffer, &self.view, PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
        self.held = True

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


cdef inline void _check_term(_Buf b, Py_ssize_t offset) except *:
    if b.view.len < 65536 or b.view.len & (b.view.len - 1):
        raise ValueError(f"term buffer length={b.view.len} is not a power of 2 >= 65536")
    if offset < 0 or offset > b.view.len or offset % FRAME_ALIGNMENT != 0:
        raise ValueError(f"term_offset={offset} is not a multiple of {FRAME_ALIGNMENT} within the term")
    if (<size_t>b.view.buf) % 8 != 0:
        raise ValueError("term buffer is not 8-byte aligned")


def term_scan_block(term_buffer, int32_t term_offset, int32_t limit_offset) -> int:
    """Offset after the last whole frame from ``term_offset`` up to ``limit_offset`` (stops before padding)."""
    cdef _Buf b = _Buf(term_buffer, False)
    _check_term(b, term_offset)
    if limit_offset > b.view.len:
        limit_offset = <int32_t>b.view.len
    return _scan_block(<const char *>b.view.buf, term_offset, limit_offset)


def term_scan_for_availability(term_buffer, int32_t term_offset, int32_t max_length) -> int:
    """Bytes of committed whole frames available to send from ``term_offset``, at most ``max_length``."""
    cdef _Buf b = _Buf(term_buffer, False)
    _check_term(b, term_offset)
    return _scan_for_availability(<const char *>b.view.buf, term_offset, max_length, <int32_t>b.view.len)


# ---------------------------------------------------------------------------------------------
# Datagram batches: one sendmmsg / recvmmsg for many datagrams
# ---------------------------------------------------------------------------------------------
cdef extern from "<sys/uio.h>" nogil:
    cdef struct iovec:
        void *iov_base
        size_t iov_len

cdef extern from "<sys/socket.h>" nogil:
    ctypedef unsigned int socklen_t
    cdef struct msghdr:
        void *msg_name
        socklen_t msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    cdef struct mmsghdr:
        msghdr msg_hdr
        unsigned int msg_len
    int sendmmsg(int sockfd, mmsghdr *msgvec, unsigned int vlen, int flags)
    int recvmmsg(int sockfd, mmsghdr *msgvec, unsigned int vlen, int flags, void *timeout)
    enum: MSG_DONTWAIT

cdef extern from "<netinet/in.h>" nogil:
    cdef struct in_addr:
        uint32_t s_addr
    cdef struct sockaddr_in:
        uint16_t sin_family
        uint16_t sin_port
        in_addr sin_addr

cdef enum: MAX_BATCH = 64


def term_send_datagrams(int fd, term_buffer, int32_t term_offset, int32_t max_length, int32_t mtu,
                        const unsigned char[::1] address, int max_datagrams) -> tuple:
    """The sender's hot loop: datagrams of committed whole frames from ``term_offset`` (each at most
    ``mtu``, together at most ``max_length`` of the term; a PAD frame travels as its 32-byte header)
    sent to ``address`` (a packed ``struct sockaddr``) with one non-blocking sendmmsg, at most
    ``max_datagrams`` (<= 64). Returns (term bytes the sent datagrams cover, datagrams sent, bytes
    sent); a full socket buffer or a send error sends fewer (0 on error)."""
    cdef _Buf b = _Buf(term_buffer, False)
    _check_term(b, term_offset)
    if max_datagrams > MAX_BATCH:
        max_datagrams = MAX_BATCH
    cdef mmsghdr msgs[MAX_BATCH]
    cdef iovec iovs[MAX_BATCH]
    cdef int32_t covers[MAX_BATCH]
    cdef const char *term = <const char *>b.view.buf
    cdef int32_t term_length = <int32_t>b.view.len
    cdef int32_t offset = term_offset, remaining = max_length, available, wire
    cdef int n = 0, sent, i
    cdef int64_t covered = 0, sent_bytes = 0
    while n < max_datagrams and remaining > 0:
        available = _scan_for_availability(term, offset, mtu if mtu < remaining else remaining, term_length)
        if available <= 0:
            break
        wire = HEADER_LENGTH if (<uint16_t *>(term + offset + TYPE_OFFSET))[0] == HDR_TYPE_PAD else available
        iovs[n].iov_base = <void *>(term + offset)
        iovs[n].iov_len = wire
        memset(&msgs[n], 0, sizeof(mmsghdr))
        msgs[n].msg_hdr.msg_name = <void *>&address[0]
        msgs[n].msg_hdr.msg_namelen = <socklen_t>address.shape[0]
        msgs[n].msg_hdr.msg_iov = &iovs[n]
        msgs[n].msg_hdr.msg_iovlen = 1
        covers[n] = available
        offset += available
        remaining -= available
        n += 1
    if n == 0:
        return (0, 0, 0)
    with nogil:
        sent = sendmmsg(fd, msgs, n, MSG_DONTWAIT)
    if sent <= 0:
        return (0, 0, 0)
    for i in range(sent):
        covered += covers[i]
        sent_bytes += msgs[i].msg_len
    return (covered, sent, sent_bytes)


def udp_receive_batch(int fd, buffer, int32_t slot_length, int32_t[::1] lengths, uint64_t[::1] sources) -> int:
    """Receive up to ``len(lengths)`` (<= 64) datagrams with one non-blocking recvmmsg into
    ``buffer``, datagram i at offset ``i * slot_length``; its length goes to ``lengths[i]`` and its
    IPv4 source to ``sources[i]`` (address << 16 | port, both in host order). Returns the count (0
    when nothing is waiting or on an error such as a pending ICMP error)."""
    cdef _Buf b = _Buf(buffer, True)
    cdef int count = lengths.shape[0]
    if count > MAX_BATCH:
        count = MAX_BATCH
    if sources.shape[0] < count or <Py_ssize_t>count * slot_length > b.view.len:
        raise ValueError(f"buffer of {b.view.len} bytes or sources[{sources.shape[0]}] too small for {count} "
                         f"datagrams of {slot_length} bytes")
    cdef mmsghdr msgs[MAX_BATCH]
    cdef iovec iovs[MAX_BATCH]
    cdef sockaddr_in names[MAX_BATCH]
    cdef int i, received
    for i in range(count):
        iovs[i].iov_base = <char *>b.view.buf + <Py_ssize_t>i * slot_length
        iovs[i].iov_len = slot_length
        memset(&msgs[i], 0, sizeof(mmsghdr))
        msgs[i].msg_hdr.msg_name = &names[i]
        msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in)
        msgs[i].msg_hdr.msg_iov = &iovs[i]
        msgs[i].msg_hdr.msg_iovlen = 1
    with nogil:
        received = recvmmsg(fd, msgs, count, MSG_DONTWAIT, NULL)
    if received <= 0:
        return 0
    for i in range(received):
        lengths[i] = <int32_t>msgs[i].msg_len
        sources[i] = ((<uint64_t>_ntohl(names[i].sin_addr.s_addr)) << 16) | _ntohs(names[i].sin_port)
    return received


cdef inline uint32_t _ntohl(uint32_t v) noexcept nogil:
    return ((v & 0xFF) << 24) | ((v & 0xFF00) << 8) | ((v >> 8) & 0xFF00) | (v >> 24)


cdef inline uint16_t _ntohs(uint16_t v) noexcept nogil:
    return <uint16_t>(((v & 0xFF) << 8) | (v >> 8))


# Reasons check_data_datagram gives for an invalid DATA/PAD datagram (see logbuf.protocol.data).
cdef enum:
    DATAGRAM_OK = 0
    DATAGRAM_SHORT = -1
    DATAGRAM_BAD_VERSION = -2
    DATAGRAM_BAD_TYPE = -3
    DATAGRAM_BAD_LENGTH = -4
    DATAGRAM_NOT_CONSECUTIVE = -5
    DATAGRAM_OUTSIDE_TERM = -6


def check_data_datagram(packet, int32_t term_length) -> int:
    """The term bytes a valid DATA-path datagram covers (0 for a heartbeat; a PAD counts its full
    length, though only its header travels), or a negative reason code for an invalid one.

    Valid: one heartbeat (a 32-byte DATA header with length 0), or consecutive DATA frames of one
    session, stream and term, each at its aligned length (the last may lack its padding),
    optionally ending with one PAD sent as its 32-byte header. With ``term_length`` > 0 the frames
    must also lie inside a term of that length. Codes: -1 short, -2 version, -3 type, -4 length,
    -5 not consecutive, -6 outside the term.
    """
    cdef _Buf d = _Buf(packet, False)
    cdef const char *p = <const char *>d.view.buf
    cdef Py_ssize_t n = d.view.len, offset = 0
    cdef int32_t frame_length, session_id, stream_id, term_id, expected
    cdef int32_t aligned
    cdef uint16_t frame_type
    if n < HEADER_LENGTH:
        return DATAGRAM_SHORT
    session_id = (<int32_t *>(p + SESSION_ID_OFFSET))[0]
    stream_id = (<int32_t *>(p + STREAM_ID_OFFSET))[0]
    term_id = (<int32_t *>(p + TERM_ID_OFFSET))[0]
    expected = (<int32_t *>(p + TERM_OFFSET_OFFSET))[0]
    if expected < 0 or expected % FRAME_ALIGNMENT != 0 or (term_length > 0 and expected > term_length - HEADER_LENGTH):
        return DATAGRAM_OUTSIDE_TERM
    while offset < n:
        if n - offset < HEADER_LENGTH:
            return DATAGRAM_BAD_LENGTH
        frame_length = (<int32_t *>(p + offset))[0]
        if (<uint8_t *>(p + offset + 4))[0] != 0:
            return DATAGRAM_BAD_VERSION
        frame_type = (<uint16_t *>(p + offset + TYPE_OFFSET))[0]
        if ((<int32_t *>(p + offset + SESSION_ID_OFFSET))[0] != session_id
                or (<int32_t *>(p + offset + STREAM_ID_OFFSET))[0] != stream_id
                or (<int32_t *>(p + offset + TERM_ID_OFFSET))[0] != term_id
                or (<int32_t *>(p + offset + TERM_OFFSET_OFFSET))[0] != expected):
            return DATAGRAM_NOT_CONSECUTIVE
        if frame_type == HDR_TYPE_DATA:
            if frame_length == 0:
                return 0 if n == HEADER_LENGTH else DATAGRAM_BAD_LENGTH
            if frame_length < HEADER_LENGTH or frame_length > n - offset:
                return DATAGRAM_BAD_LENGTH
            aligned = _align(frame_length)
            offset += aligned if aligned <= n - offset else n - offset
        elif frame_type == HDR_TYPE_PAD:
            if frame_length < HEADER_LENGTH or offset + HEADER_LENGTH != n:
                return DATAGRAM_BAD_LENGTH
            aligned = _align(frame_length)
            offset += HEADER_LENGTH
        else:
            return DATAGRAM_BAD_TYPE
        if term_length > 0 and aligned > term_length - expected:
            return DATAGRAM_OUTSIDE_TERM
        expected += aligned
    return expected - (<int32_t *>(p + TERM_OFFSET_OFFSET))[0]


def term_rebuild_insert(term_buffer, int32_t term_offset, packet) -> bool:
    """Aeron's TermRebuilder: put a datagram of whole frames into a receiver's term at ``term_offset``.

    Skipped (False) if a frame is already there (a duplicate). Otherwise everything but the first
    frame's length is copied, then that length is release-stored, so a reader that sees it sees
    the whole datagram. The caller has checked the frames (lengths, alignment, term bounds).
    """
    cdef _Buf b = _Buf(term_buffer, True)
    cdef _Buf d = _Buf(packet, False)
    _check_term(b, term_offset)
    cdef Py_ssize_t length = d.view.len
    if length < HEADER_LENGTH or length > b.view.len - term_offset:
        raise ValueError(f"datagram of {length} bytes does not fit the term at term_offset={term_offset}")
    cdef char *dst = <char *>b.view.buf + term_offset
    cdef const char *src = <const char *>d.view.buf
    if lb_load_acquire_i32(dst) != 0:
        return False
    memcpy(dst + 4, src + 4, length - 4)
    lb_store_release_i32(dst, (<int32_t *>src)[0])
    return True


def term_gap_scan(term_buffer, int32_t rebuild_offset, int32_t hwm_offset) -> tuple:
    """From ``rebuild_offset``: (end of the contiguous frames, padding included; length of the gap
    after them up to the next frame or ``hwm_offset``). A gap length of 0 means none before the HWM.
    """
    cdef _Buf b = _Buf(term_buffer, False)
    _check_term(b, rebuild_offset)
    if hwm_offset > b.view.len:
        hwm_offset = <int32_t>b.view.len
    cdef const char *term = <const char *>b.view.buf
    cdef int32_t offset = rebuild_offset, frame_length, gap_end
    while offset < hwm_offset:
        frame_length = lb_load_acquire_i32(term + offset)
        if frame_length <= 0:
            break
        offset += _align(frame_length)
    if offset >= hwm_offset:
        return (offset, 0)
    gap_end = offset + FRAME_ALIGNMENT
    while gap_end < hwm_offset and lb_load_acquire_i32(term + gap_end) == 0:
        gap_end += FRAME_ALIGNMENT
    return (offset, gap_end - offset)


def term_clean(buffer, Py_ssize_t offset, Py_ssize_t length) -> None:
    """Zero ``length`` bytes from ``offset``: all but the first 8 plainly, then those 8 with release."""
    cdef _Buf b = _Buf(buffer, True)
    if offset < 0 or length < 0 or length > b.view.len - offset or offset % 8 != 0:
        raise ValueError(f"clean range offset={offset} length={length} is outside the {b.view.len}-byte buffer or misaligned")
    cdef char *p = <char *>b.view.buf + offset
    if length > 8:
        memset(p + 8, 0, length - 8)
        lb_store_release_i64(p, 0)
    elif length > 0:
        memset(p, 0, length)


def count_frames(block, bint include_padding=False) -> int:
    """Number of frames in a block of whole frames (as given to a block handler)."""
    cdef _Buf b = _Buf(block, False)
    cdef const char *p = <const char *>b.view.buf
    cdef Py_ssize_t offset = 0, n = 0
    cdef int32_t frame_length
    while offset + HEADER_LENGTH <= b.view.len:
        frame_length = (<int32_t *>(p + offset))[0]
        if frame_length <= 0:
            break
        if include_padding or (<uint16_t *>(p + offset + TYPE_OFFSET))[0] != HDR_TYPE_PAD:
            n += 1
        offset += _align(frame_length)
    return n


def frame_index(block, int32_t[::1] offsets, int32_t[::1] lengths) -> int:
    """Fill ``offsets``/``lengths`` with each data frame's payload offset and length in ``block``.

    Returns how many frames were found (at most ``len(offsets)``); padding is skipped. With numpy:
    ``n = frame_index(block, offs, lens)`` then ``offs[:n]``, ``lens[:n]``.
    """
    cdef _Buf b = _Buf(block, False)
    cdef const char *p = <const char *>b.view.buf
    cdef Py_ssize_t offset = 0, n = 0, cap = offsets.shape[0]
    cdef int32_t frame_length
    if lengths.shape[0] < cap:
        cap = lengths.shape[0]
    while offset + HEADER_LENGTH <= b.view.len and n < cap:
        frame_length = (<int32_t *>(p + offset))[0]
        if frame_length <= 0:
            break
        if (<uint16_t *>(p + offset + TYPE_OFFSET))[0] != HDR_TYPE_PAD:
            offsets[n] = <int32_t>(offset + HEADER_LENGTH)
            lengths[n] = frame_length - HEADER_LENGTH
            n += 1
        offset += _align(frame_length)
    return n


def term_append_unfragmented(metadata, int partition_index, term_buffer, header_template, payload,
                             int64_t reserved_value=0) -> int:
    """Claim (get-and-add on the raw tail) and write one unfragmented frame.

    Returns the resulting term offset, or -2 (TERM_APPEND_FAILED) if the claim tripped the end
    of the term, in which case the rest of the term was padded and the caller must rotate.
    """
    cdef _Buf m = _Buf(metadata, True)
    cdef _Buf t = _Buf(term_buffer, True)
    cdef _Buf h = _Buf(header_template, False)
    cdef _Buf s = _Buf(payload, False)
    _check_term(t, 0)
    if m.view.len < LOG_META_DATA_LENGTH or (<size_t>m.view.buf) % 8 != 0:
        raise ValueError(f"metadata buffer of {m.view.len} bytes is shorter than {LOG_META_DATA_LENGTH} or misaligned")
    if not 0 <= partition_index < PARTITION_COUNT:
        raise ValueError(f"partition_index={partition_index} must be 0, 1 or 2")
    if h.view.len < HEADER_LENGTH:
        raise ValueError(f"header template is {h.view.len} bytes, expected {HEADER_LENGTH}")
    cdef int32_t term_length = <int32_t>t.view.len
    cdef const char *hp = <const char *>h.view.buf
    cdef int64_t vft = (<int64_t *>hp)[0] & ~(<int64_t>0xFFFFFFFF)
    cdef int64_t session_id = (<int32_t *>(hp + SESSION_ID_OFFSET))[0]
    cdef int32_t stream_id = (<int32_t *>(hp + STREAM_ID_OFFSET))[0]
    cdef int32_t length = <int32_t>s.view.len
    cdef int32_t aligned = _align(length + HEADER_LENGTH)
    cdef int64_t raw_tail = lb_get_and_add_i64(<char *>m.view.buf + TAIL_COUNTERS_OFFSET + 8 * partition_index, aligned)
    cdef int32_t term_offset = <int32_t>(<int64_t>(<uint32_t>raw_tail))
    cdef int32_t term_id = <int32_t>(raw_tail >> 32)
    if <int64_t>term_offset + aligned > term_length:
        return _handle_end_of_log(<char *>t.view.buf, term_offset, term_length, term_id, vft, session_id, stream_id)
    return _write_unfragmented(<char *>t.view.buf, term_offset, term_id, <const char *>s.view.buf, length,
                               reserved_value, vft, session_id, stream_id)


def rotate_log(metadata, int32_t term_count, int32_t term_id) -> bool:
    """Rotate to the next term; True if this caller's CAS of the active term count won."""
    cdef _Buf m = _Buf(metadata, True)
    if m.view.len < LOG_META_DATA_LENGTH or (<size_t>m.view.buf) % 8 != 0:
        raise ValueError(f"metadata buffer of {m.view.len} bytes is shorter than {LOG_META_DATA_LENGTH} or misaligned")
    return _rotate_log(<char *>m.view.buf, term_count, term_id)


# ---------------------------------------------------------------------------------------------
# Header flyweight handed to fragment handlers
# ---------------------------------------------------------------------------------------------
cdef class Header:
    """The header of the fragment being delivered: a view, valid only during the handler call.

    Reads its fields from the term on access. ``position`` is the stream position just after
    this (aligned) frame, i.e. where the next frame starts.
    """

    cdef const char *_term
    cdef readonly int32_t frame_offset
    cdef int32_t _initial_term_id
    cdef int32_t _shift

    cdef inline const char *_frame(self) except NULL:
        if self._term == NULL:
            raise ValueError("this Header is not bound to a frame: a header is valid only during the handler call"
                             " (use header.snapshot() there to keep its fields)")
        return self._term + self.frame_offset

    @property
    def frame_length(self) -> int:
        return (<int32_t *>(self._frame()))[0]

    @property
    def version(self) -> int:
        return (<uint8_t *>(self._frame() + 4))[0]

    @property
    def flags(self) -> int:
        return (<uint8_t *>(self._frame() + FLAGS_OFFSET))[0]

    @property
    def type(self) -> int:
        return (<uint16_t *>(self._frame() + TYPE_OFFSET))[0]

    @property
    def term_offset(self) -> int:
        return (<int32_t *>(self._frame() + TERM_OFFSET_OFFSET))[0]

    @property
    def session_id(self) -> int:
        return (<int32_t *>(self._frame() + SESSION_ID_OFFSET))[0]

    @property
    def stream_id(self) -> int:
        return (<int32_t *>(self._frame() + STREAM_ID_OFFSET))[0]

    @property
    def term_id(self) -> int:
        return (<int32_t *>(self._frame() + TERM_ID_OFFSET))[0]

    @property
    def reserved_value(self) -> int:
        return (<int64_t *>(self._frame() + RESERVED_VALUE_OFFSET))[0]

    @property
    def initial_term_id(self) -> int:
        return self._initial_term_id

    @property
    def position(self) -> int:
        cdef int32_t term_id = (<int32_t *>(self._frame() + TERM_ID_OFFSET))[0]
        cdef int32_t frame_length = (<int32_t *>(self._frame()))[0]
        cdef int64_t begin = (<int64_t>(<int32_t>(term_id - self._initial_term_id))) << self._shift
        return begin + _align(self.frame_offset + frame_length)

    def snapshot(self) -> dict:
        """The header's fields as a plain dict (safe to keep after the handler returns)."""
        return {
            "frame_length": self.frame_length, "version": self.version, "flags": self.flags,
            "type": self.type, "term_offset": self.term_offset, "session_id": self.session_id,
            "stream_id": self.stream_id, "term_id": self.term_id,
            "reserved_value": self.reserved_value, "position": self.position,
        }

    def __repr__(self) -> str:
        if self._term == NULL:
            return "Header(<unset>)"
        return ("Header(session_id={}, stream_id={}, term_id={}, term_offset={}, flags=0x{:02x}, "
                "frame_length={}, position={})").format(self.session_id, self.stream_id, self.term_id,
                                                        self.term_offset, self.flags, self.frame_length,
                                                        self.position)


cdef class _TermReadState:
    cdef public int32_t fragments
    cdef public int32_t offset


def term_read(term_buffer, int32_t term_offset, handler, int32_t fragment_limit, Header header,
              int32_t initial_term_id=0) -> tuple:
    """Aeron's TermReader: deliver up to ``fragment_limit`` fragments from ``term_offset``.

    Calls ``handler(payload: memoryview, header)`` per data frame, skipping padding. Returns
    ``(fragments_read, next_term_offset)``. If the handler raises, the exception propagates;
    the caller's position may move past every fragment handed out so far (use ImageCore.poll).
    """
    cdef _Buf b = _Buf(term_buffer, False)
    _check_term(b, term_offset)
    cdef const char *term = <const char *>b.view.buf
    cdef object view = memoryview(term_buffer).toreadonly()
    cdef int32_t term_length = <int32_t>b.view.len
    cdef int32_t offset = term_offset, fragments = 0, frame_length, frame_offset
    header._term = term
    header._initial_term_id = initial_term_id
    header._shift = _log2(term_length)
    while fragments < fragment_limit and offset < term_length:
        frame_length = lb_load_acquire_i32(term + offset)
        if frame_length <= 0:
            break
        frame_offset = offset
        offset += _align(frame_length)
        if (<uint16_t *>(term + frame_offset + TYPE_OFFSET))[0] == HDR_TYPE_PAD:
            continue
        fragments += 1
        header.frame_offset = frame_offset
        handler(view[frame_offset + HEADER_LENGTH:frame_offset + frame_length], header)
    header._term = NULL
    view.release()
    return fragments, offset


cdef inline int32_t _log2(int64_t v) noexcept nogil:
    cdef int32_t n = 0
    while v > 1:
        v >>= 1
        n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Log: a mapped log buffer resolved to pointers
# ---------------------------------------------------------------------------------------------
cdef class LogView:
    """A whole log buffer (3 terms + metadata) mapped in this process, resolved to pointers."""

    cdef object _mem
    cdef char *base
    cdef char *meta
    cdef char *terms[3]
    cdef object _term_views
    cdef readonly int32_t term_length
    cdef readonly int32_t position_bits_to_shift
    cdef readonly int32_t initial_term_id
    cdef readonly int32_t mtu_length

    def __cinit__(self, buffer):
        cdef Py_buffer view
        PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
        cdef Py_ssize_t n = view.len
        cdef char *base = <char *>view.buf
        PyBuffer_Release(&view)
        if n < 3 * 65536 + LOG_META_DATA_LENGTH:
            raise ValueError(f"log buffer of {n} bytes is too short for three 64 KiB terms and metadata")
        if (<size_t>base) % 64 != 0:
            raise ValueError("log buffer is not 64-byte aligned")
        self._mem = memoryview(buffer)
        self.base = base
        # The metadata sits right after the three terms; find it from the term length recorded there,
        # validating the candidate against the mapping length.
        cdef Py_ssize_t meta_offset
        cdef int32_t term_length = _find_term_length(base, n)
        if term_length <= 0:
            raise ValueError(f"log buffer of {n} bytes holds no valid term_length in its metadata")
        meta_offset = 3 * <Py_ssize_t>term_length
        self.meta = base + meta_offset
        self.terms[0] = base
        self.terms[1] = base + term_length
        self.terms[2] = base + 2 * <Py_ssize_t>term_length
        self.term_length = term_length
        self.position_bits_to_shift = _log2(term_length)
        self.initial_term_id = (<int32_t *>(self.meta + INITIAL_TERM_ID_OFFSET))[0]
        self.mtu_length = (<int32_t *>(self.meta + MTU_LENGTH_OFFSET))[0]
        ro = self._mem.toreadonly()
        self._term_views = [ro[i * term_length:(i + 1) * term_length] for i in range(3)]

    @property
    def closed(self) -> bool:
        return self._mem is None

    def term_buffer(self, int index) -> memoryview:
        """Writable view of partition ``index``."""
        return self._mem[index * self.term_length:(index + 1) * self.term_length]

    def metadata(self) -> memoryview:
        """Writable view of the metadata section."""
        cdef Py_ssize_t off = 3 * <Py_ssize_t>self.term_length
        return self._mem[off:off + LOG_META_DATA_LENGTH]

    def close(self) -> None:
        """Drop this view's exports of the mapping (the owner can then unmap it)."""
        if self._mem is not None:
            for v in self._term_views:
                v.release()
            self._term_views = None
            self._mem.release()
            self._mem = None
            self.base = NULL
            self.meta = NULL


cdef int32_t _find_term_length(char *base, Py_ssize_t n) noexcept:
    """The metadata is at 3 * term_length; its term_length field must match that placement.

    Candidates are tried largest first: the largest term length whose 3 terms and metadata fit
    the mapping is the real one for any page size up to the term length.
    """
    cdef int32_t tl = 1073741824
    cdef int32_t recorded
    while tl >= 65536:
        if 3 * <Py_ssize_t>tl + LOG_META_DATA_LENGTH <= n:
            recorded = (<int32_t *>(base + 3 * <Py_ssize_t>tl + TERM_LENGTH_OFFSET))[0]
            if recorded == tl:
                return tl
        tl >>= 1
    return -1


# ---------------------------------------------------------------------------------------------
# Publication core: offer / batch offer / try_claim as single native calls
# ---------------------------------------------------------------------------------------------
cdef class BufferClaim:
    """Space claimed in a term by ``try_claim``: fill ``buffer``, then ``commit()`` or ``abort()``.

    Also a context manager: leaving the block commits, an exception aborts.
    """

    cdef char *_frame
    cdef object _view
    cdef int32_t _frame_length
    cdef object _log

    @property
    def buffer(self) -> memoryview:
        """Writable view of the claimed payload."""
        if self._view is None:
            raise ValueError("buffer claim is not active (already committed or aborted)")
        return self._view

    @property
    def length(self) -> int:
        return self._frame_length - HEADER_LENGTH if self._frame != NULL else 0

    @property
    def reserved_value(self) -> int:
        if self._frame == NULL:
            raise ValueError("buffer claim is not active")
        return (<int64_t *>(self._frame + RESERVED_VALUE_OFFSET))[0]

    @reserved_value.setter
    def reserved_value(self, int64_t value) -> None:
        if self._frame == NULL:
            raise ValueError("buffer claim is not active")
        (<int64_t *>(self._frame + RESERVED_VALUE_OFFSET))[0] = value

    @property
    def flags(self) -> int:
        if self._frame == NULL:
            raise ValueError("buffer claim is not active")
        return (<uint8_t *>(self._frame + FLAGS_OFFSET))[0]

    @flags.setter
    def flags(self, int value) -> None:
        if self._frame == NULL:
            raise ValueError("buffer claim is not active")
        (<uint8_t *>(self._frame + FLAGS_OFFSET))[0] = <uint8_t>value

    cdef inline void _finish(self):
        if self._view is not None:
            self._view.release()
            self._view = None
        self._frame = NULL
        self._log = None

    def commit(self) -> None:
        """Publish the frame (release store of its length)."""
        if self._frame == NULL:
            raise ValueError("buffer claim is not active (already committed or aborted)")
        lb_store_release_i32(self._frame, self._frame_length)
        self._finish()

    def abort(self) -> None:
        """Turn the claimed frame into padding so readers skip it."""
        if self._frame == NULL:
            raise ValueError("buffer claim is not active (already committed or aborted)")
        (<uint16_t *>(self._frame + TYPE_OFFSET))[0] = HDR_TYPE_PAD
        lb_store_release_i32(self._frame, self._frame_length)
        self._finish()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._frame != NULL:
            if exc_type is None:
                self.commit()
            else:
                self.abort()
        return False


cdef struct _Claimed:
    char *term
    int32_t term_offset
    int32_t term_id
    int64_t begin


cdef class PublicationCore:
    """Concurrent or exclusive publication over a mapped log, limited by a publisher-limit position.

    Concurrent: any number of publishers (threads or processes) claim with get-and-add on the
    raw tail. Exclusive: a single writer keeps the tail itself and publishes it with release
    stores (no read-modify-write).
    """

    cdef LogView _log
    cdef char *_meta
    cdef char *_limit
    cdef object _limit_owner
    cdef readonly int32_t term_length
    cdef readonly int32_t max_payload_length
    cdef readonly int32_t max_message_length
    cdef readonly int32_t mtu_length
    cdef readonly int32_t initial_term_id
    cdef readonly int32_t session_id
    cdef readonly int32_t stream_id
    cdef readonly bint exclusive
    cdef int32_t _shift
    cdef int64_t _vft
    cdef int64_t _max_possible_position
    cdef bint _closed
    cdef public object limit_updater
    # exclusive state
    cdef int32_t _term_offset
    cdef int32_t _term_id
    cdef int32_t _active_index
    cdef int64_t _term_begin_position

    def __cinit__(self, LogView log, limit_buffer, Py_ssize_t limit_offset, bint exclusive=False,
                  object limit_updater=None):
        cdef Py_buffer view
        if log.closed:
            raise ValueError("log is closed")
        self._limit = _address(&view, limit_buffer, limit_offset, 8, False)
        PyBuffer_Release(&view)
        self._limit_owner = memoryview(limit_buffer)
        self._log = log
        self._meta = log.meta
        self.term_length = log.term_length
        self._shift = log.position_bits_to_shift
        self.initial_term_id = log.initial_term_id
        self.mtu_length = log.mtu_length
        self.max_payload_length = log.mtu_length - HEADER_LENGTH
        self.max_message_length = min(log.term_length // 8, MAX_MESSAGE_LENGTH)
        self._max_possible_position = (<int64_t>log.term_length) << 31
        cdef const char *hdr = log.meta + DEFAULT_FRAME_HEADER_OFFSET
        self._vft = ((<int64_t *>hdr)[0] & ~(<int64_t>0xFFFFFFFF))
        self._vft = (self._vft & ~(<int64_t>0xFF << 40)) | ((<int64_t>UNFRAGMENTED) << 40)
        self.session_id = (<int32_t *>(hdr + SESSION_ID_OFFSET))[0]
        self.stream_id = (<int32_t *>(hdr + STREAM_ID_OFFSET))[0]
        self.exclusive = exclusive
        self.limit_updater = limit_updater
        self._closed = False
        cdef int32_t term_count
        cdef int64_t raw_tail
        if exclusive:
            term_count = lb_load_acquire_i32(self._meta + ACTIVE_TERM_COUNT_OFFSET)
            self._active_index = term_count % PARTITION_COUNT
            raw_tail = lb_load_acquire_i64(self._meta + TAIL_COUNTERS_OFFSET + 8 * self._active_index)
            self._term_id = <int32_t>(raw_tail >> 32)
            self._term_offset = <int32_t>min(<int64_t>(<uint32_t>raw_tail), <int64_t>self.term_length)
            self._term_begin_position = (<int64_t>(<int32_t>(self._term_id - self.initial_term_id))) << self._shift

    # -- state ---------------------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def is_connected(self) -> bool:
        return not self._closed and lb_load_acquire_i32(self._meta + IS_CONNECTED_OFFSET) == 1

    @property
    def position(self) -> int:
        """Current tail position of the log (where the next message would go)."""
        if self._closed:
            return CLOSED
        return self._tail_position()

    @property
    def position_limit(self) -> int:
        """Publisher limit: offers at or beyond it are back-pressured."""
        if self._closed:
            return CLOSED
        return lb_load_acquire_i64(self._limit)

    @property
    def max_possible_position(self) -> int:
        return self._max_possible_position

    cdef inline int64_t _tail_position(self) noexcept:
        cdef int32_t term_count = lb_load_acquire_i32(self._meta + ACTIVE_TERM_COUNT_OFFSET)
        cdef int64_t raw_tail = lb_load_acquire_i64(self._meta + TAIL_COUNTERS_OFFSET + 8 * (term_count % PARTITION_COUNT))
        cdef int64_t term_offset = <int64_t>(<uint32_t>raw_tail)
        if term_offset > self.term_length:
            term_offset = self.term_length
        return ((<int64_t>(<int32_t>(<int32_t>(raw_tail >> 32) - self.initial_term_id))) << self._shift) + term_offset

    def close(self) -> None:
        """Further offers return CLOSED; the mapping is released."""
        if not self._closed:
            self._closed = True
            self._limit_owner.release()
            self._limit_owner = None
            self._limit = NULL
            self._log = None
            self._meta = NULL

    cdef int64_t _back_pressure_status(self, int64_t position, int32_t length) noexcept:
        if position + length >= self._max_possible_position:
            return MAX_POSITION_EXCEEDED
        if lb_load_acquire_i32(self._meta + IS_CONNECTED_OFFSET) == 1:
            return BACK_PRESSURED
        return NOT_CONNECTED

    cdef inline int64_t _limit_for(self, int64_t position) except? -9:
        """Publisher limit, asking the updater (standalone flow control) when we are at it."""
        cdef int64_t limit = lb_load_acquire_i64(self._limit)
        if position >= limit and self.limit_updater is not None:
            self.limit_updater()
            limit = lb_load_acquire_i64(self._limit)
        return limit

    # -- appending -----------------------------------------------------------------------------
    cdef int64_t _claim_space(self, int32_t claim_length, int32_t length, _Claimed *out) except? -9:
        """Claim ``claim_length`` bytes at the tail: 0 with ``out`` filled, a negative OfferResult,
        or TRIPPED after padding the rest of the term and rotating (the caller retries).

        Concurrent: one get-and-add on the raw tail. Exclusive: the tail is ours; publish it with a
        release store (Aeron's ExclusiveTermAppender publishes it before writing the frame).
        """
        cdef int32_t term_count, index, term_offset, term_id
        cdef int64_t raw_tail, position, begin
        cdef char *tail_addr
        if self.exclusive:
            term_offset = self._term_offset
            term_id = self._term_id
            index = self._active_index
            begin = self._term_begin_position
            term_count = <int32_t>(term_id - self.initial_term_id)
        else:
            term_count = lb_load_acquire_i32(self._meta + ACTIVE_TERM_COUNT_OFFSET)
            index = term_count % PARTITION_COUNT
            raw_tail = lb_load_acquire_i64(self._meta + TAIL_COUNTERS_OFFSET + 8 * index)
            term_id = <int32_t>(raw_tail >> 32)
            term_offset = <int32_t>min(<int64_t>(<uint32_t>raw_tail), <int64_t>self.term_length)
            if term_count != <int32_t>(term_id - self.initial_term_id):
                return ADMIN_ACTION
            begin = (<int64_t>term_count) << self._shift
        position = begin + term_offset
        if position >= self._limit_for(position):
            return self._back_pressure_status(position, length)
        tail_addr = self._meta + TAIL_COUNTERS_OFFSET + 8 * index
        if self.exclusive:
            lb_store_release_i64(tail_addr, ((<int64_t>term_id) << 32) | (term_offset + claim_length))
        else:
            raw_tail = lb_get_and_add_i64(tail_addr, claim_length)
            term_offset = <int32_t>(<int64_t>(<uint32_t>raw_tail))
            term_id = <int32_t>(raw_tail >> 32)
            begin = (<int64_t>(<int32_t>(term_id - self.initial_term_id))) << self._shift
        out.term = self._log.terms[index]
        out.term_offset = term_offset
        out.term_id = term_id
        out.begin = begin
        if <int64_t>term_offset + claim_length > self.term_length:
            _handle_end_of_log(out.term, term_offset, self.term_length, term_id, self._vft, self.session_id,
                               self.stream_id)
            if begin + self.term_length >= self._max_possible_position:
                return MAX_POSITION_EXCEEDED
            if self.exclusive:
                self._exclusive_rotate()
            else:
                _rotate_log(self._meta, term_count, term_id)
            return TRIPPED
        if self.exclusive:
            self._term_offset = term_offset + claim_length
        return 0

    cdef int64_t _append(self, const char *src, int32_t length, int64_t reserved_value, int32_t batch_count,
                         const char **srcs, const int32_t *lengths, int32_t aligned_total) except? -9:
        """One attempt to append (one message, or ``batch_count`` small ones): the new position,
        a negative OfferResult, or TRIPPED."""
        cdef _Claimed c
        cdef int32_t claim_length
        if batch_count > 0:
            claim_length = aligned_total
        elif length <= self.max_payload_length:
            claim_length = _align(length + HEADER_LENGTH)
        else:
            claim_length = _fragmented_length(length, self.max_payload_length)
        cdef int64_t result = self._claim_space(claim_length, length, &c)
        if result != 0:
            return result
        return c.begin + self._write(c.term, c.term_offset, c.term_id, src, length, reserved_value, batch_count,
                                     srcs, lengths)

    cdef inline int32_t _write(self, char *term, int32_t term_offset, int32_t term_id, const char *src,
                               int32_t length, int64_t reserved_value, int32_t batch_count,
                               const char **srcs, const int32_t *lengths) noexcept:
        cdef int32_t i, offset
        if batch_count > 0:
            offset = term_offset
            for i in range(batch_count):
                offset = _write_unfragmented(term, offset, term_id, srcs[i], lengths[i], reserved_value, self._vft,
                                             self.session_id, self.stream_id)
            return offset
        if length <= self.max_payload_length:
            return _write_unfragmented(term, term_offset, term_id, src, length, reserved_value, self._vft,
                                       self.session_id, self.stream_id)
        return _write_fragmented(term, term_offset, term_id, src, length, self.max_payload_length,
                                 reserved_value, self._vft, self.session_id, self.stream_id)

    cdef void _exclusive_rotate(self) noexcept:
        cdef int32_t next_term_id = self._term_id + 1
        cdef int32_t term_count = <int32_t>(next_term_id - self.initial_term_id)
        cdef int32_t next_index = term_count % PARTITION_COUNT
        lb_store_release_i64(self._meta + TAIL_COUNTERS_OFFSET + 8 * next_index, (<int64_t>next_term_id) << 32)
        lb_store_release_i32(self._meta + ACTIVE_TERM_COUNT_OFFSET, term_count)
        self._term_id = next_term_id
        self._term_offset = 0
        self._active_index = next_index
        self._term_begin_position += self.term_length

    cdef int64_t _offer(self, const char *src, int32_t length, int64_t reserved_value, int32_t batch_count,
                        const char **srcs, const int32_t *lengths, int32_t aligned_total) except? -9:
        cdef int64_t result
        cdef int attempt
        # A trip pads and rotates; the retry then lands in the fresh term (ADMIN_ACTION if it races).
        for attempt in range(3):
            result = self._append(src, length, reserved_value, batch_count, srcs, lengths, aligned_total)
            if result != TRIPPED:
                return result
        return ADMIN_ACTION

    def offer(self, buffer, int64_t reserved_value=0) -> int:
        """Append one message. Returns the new stream position, or a negative OfferResult."""
        if self._closed:
            return CLOSED
        cdef Py_buffer view
        PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
        cdef int64_t result
        try:
            if view.len > self.max_message_length:
                raise ValueError(f"message length={view.len} exceeds max_message_length={self.max_message_length} "
                                 f"(min(term_length / 8, 16 MiB) for term_length={self.term_length})")
            result = self._offer(<const char *>view.buf, <int32_t>view.len, reserved_value, 0, NULL, NULL, 0)
        finally:
            PyBuffer_Release(&view)
        return result

    def offer_batch(self, messages, int64_t reserved_value=0) -> int:
        """Append many small messages with one claim. All or nothing.

        Each message must fit one frame (<= max_payload_length) and the batch, framed, must be
        at most ``max_message_length`` bytes. Returns the position after the last message, or a
        negative OfferResult (nothing appended).
        """
        if self._closed:
            return CLOSED
        cdef object seq = PySequence_Fast(messages, "offer_batch expects a sequence of bytes-like messages")
        cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(seq)
        if n == 0:
            return self._tail_position()
        if n > 65536:
            raise ValueError(f"batch of {n} messages exceeds the 65536-message batch limit")
        cdef PyObject **items = PySequence_Fast_ITEMS(seq)
        cdef const char *srcs_small[128]
        cdef int32_t lengths_small[128]
        cdef const char **srcs = srcs_small
        cdef int32_t *lengths = lengths_small
        cdef Py_buffer *views = NULL
        cdef uint8_t *held = NULL
        cdef bytes scratch
        cdef Py_ssize_t i
        cdef int64_t total = 0, result
        cdef PyObject *item
        if n > 128:
            scratch = PyBytes_FromStringAndSize(NULL, n * (sizeof(char *) + sizeof(int32_t)))
            srcs = <const char **>PyBytes_AS_STRING(scratch)
            lengths = <int32_t *>(PyBytes_AS_STRING(scratch) + n * sizeof(char *))
        try:
            for i in range(n):
                item = items[i]
                if PyBytes_CheckExact(<object>item):
                    srcs[i] = PyBytes_AS_STRING(<object>item)
                    lengths[i] = <int32_t>PyBytes_GET_SIZE(<object>item)
                else:
                    # Other bytes-likes: hold their buffers until the batch is written.
                    if views == NULL:
                        views = <Py_buffer *>PyMem_Calloc(n, sizeof(Py_buffer) + 1)
                        if views == NULL:
                            raise MemoryError()
                        held = <uint8_t *>(views + n)
                    PyObject_GetBuffer(<object>item, &views[i], PyBUF_SIMPLE)
                    held[i] = 1
                    srcs[i] = <const char *>views[i].buf
                    lengths[i] = <int32_t>views[i].len
                if lengths[i] > self.max_payload_length:
                    raise ValueError(f"message {i} length={lengths[i]} exceeds max_payload_length="
                                     f"{self.max_payload_length}; batch messages are not fragmented")
                total += _align(lengths[i] + HEADER_LENGTH)
            if total > self.max_message_length:
                raise ValueError(f"batch framed length={total} exceeds max_message_length={self.max_message_length}")
            result = self._offer(NULL, 0, reserved_value, <int32_t>n, srcs, lengths, <int32_t>total)
        finally:
            if views != NULL:
                for i in range(n):
                    if held[i]:
                        PyBuffer_Release(&views[i])
                PyMem_Free(views)
        return result

    def try_claim(self, int32_t length, BufferClaim claim) -> int:
        """Claim ``length`` bytes (<= max_payload_length) to fill in place; commit or abort the claim."""
        if self._closed:
            return CLOSED
        if length < 0 or length > self.max_payload_length:
            raise ValueError(f"claim length={length} must be within 0..max_payload_length={self.max_payload_length}")
        if claim._frame != NULL:
            raise ValueError("buffer claim is still active: commit() or abort() it first")
        cdef int64_t result
        cdef int attempt
        for attempt in range(3):
            result = self._claim(length, claim)
            if result != TRIPPED:
                return result
        return ADMIN_ACTION

    cdef int64_t _claim(self, int32_t length, BufferClaim claim) except? -9:
        cdef int32_t frame_length = length + HEADER_LENGTH
        cdef int32_t aligned = _align(frame_length)
        cdef _Claimed c
        cdef int64_t result = self._claim_space(aligned, length, &c)
        if result != 0:
            return result
        _header_write(c.term, c.term_offset, frame_length, c.term_id, self._vft, self.session_id, self.stream_id)
        (<int64_t *>(c.term + c.term_offset + RESERVED_VALUE_OFFSET))[0] = 0
        claim._frame = c.term + c.term_offset
        claim._frame_length = frame_length
        claim._log = self._log
        cdef Py_ssize_t start = (c.term - self._log.base) + c.term_offset + HEADER_LENGTH
        claim._view = self._log._mem[start:start + length]
        return c.begin + c.term_offset + aligned


# ---------------------------------------------------------------------------------------------
# Image core: poll / controlled poll / block poll over one publication's log
# ---------------------------------------------------------------------------------------------
cdef class ImageCore:
    """A subscriber's view of one log: reads from its own subscriber-position counter."""

    cdef LogView _log
    cdef char *_pos
    cdef object _pos_owner
    cdef Header _header
    cdef list _views
    cdef int32_t _mask
    cdef int32_t _shift
    cdef readonly int32_t term_length
    cdef readonly int32_t session_id
    cdef readonly int32_t stream_id
    cdef readonly int32_t initial_term_id
    cdef bint _closed

    def __cinit__(self, LogView log, position_buffer, Py_ssize_t position_offset):
        cdef Py_buffer view
        if log.closed:
            raise ValueError("log is closed")
        self._pos = _address(&view, position_buffer, position_offset, 8, True)
        PyBuffer_Release(&view)
        self._pos_owner = memoryview(position_buffer)
        self._log = log
        self.term_length = log.term_length
        self._mask = log.term_length - 1
        self._shift = log.position_bits_to_shift
        self.initial_term_id = log.initial_term_id
        self._views = list(log._term_views)
        self._header = Header()
        self._header._initial_term_id = log.initial_term_id
        self._header._shift = log.position_bits_to_shift
        cdef const char *hdr = log.meta + DEFAULT_FRAME_HEADER_OFFSET
        self.session_id = (<int32_t *>(hdr + SESSION_ID_OFFSET))[0]
        self.stream_id = (<int32_t *>(hdr + STREAM_ID_OFFSET))[0]
        self._closed = False

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def position(self) -> int:
        """This subscriber's position in the stream."""
        if self._closed:
            raise ValueError("image is closed")
        return lb_load_acquire_i64(self._pos)

    @position.setter
    def position(self, int64_t new_position) -> None:
        """Move this subscriber (frame-aligned, within the window still held in the log)."""
        if self._closed:
            raise ValueError("image is closed")
        cdef int64_t current = lb_load_acquire_i64(self._pos)
        if new_position % FRAME_ALIGNMENT != 0:
            raise ValueError(f"position={new_position} is not a multiple of {FRAME_ALIGNMENT}")
        if new_position < current:
            raise ValueError(f"position={new_position} is behind the current position {current}")
        lb_store_release_i64(self._pos, new_position)

    @property
    def end_of_stream_position(self) -> int:
        return lb_load_acquire_i64(self._log.meta + END_OF_STREAM_POSITION_OFFSET)

    @property
    def is_end_of_stream(self) -> bool:
        return lb_load_acquire_i64(self._pos) >= lb_load_acquire_i64(self._log.meta + END_OF_STREAM_POSITION_OFFSET)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pos_owner.release()
            self._pos_owner = None
            self._pos = NULL
            self._views = None
            self._log = None

    def poll(self, handler, int32_t fragment_limit) -> int:
        """Deliver up to ``fragment_limit`` fragments to ``handler(payload: memoryview, header)``.

        The position is stored (release) after the last fragment handed to the handler, even
        when the handler raises: a fragment whose handler raised counts as delivered.
        """
        if self._closed:
            return 0
        cdef int64_t position = (<int64_t *>self._pos)[0]
        cdef int32_t term_offset = <int32_t>(position & self._mask)
        cdef int32_t index = <int32_t>((position >> self._shift) % PARTITION_COUNT)
        cdef const char *term = self._log.terms[index]
        cdef object view = self._views[index]
        cdef Header header = self._header
        cdef int32_t offset = term_offset, fragments = 0, frame_length, frame_offset
        cdef int32_t term_length = self.term_length
        header._term = term
        try:
            while fragments < fragment_limit and offset < term_length:
                frame_length = lb_load_acquire_i32(term + offset)
                if frame_length <= 0:
                    break
                frame_offset = offset
                offset += _align(frame_length)
                if (<uint16_t *>(term + frame_offset + TYPE_OFFSET))[0] == HDR_TYPE_PAD:
                    continue
                fragments += 1
                header.frame_offset = frame_offset
                handler(view[frame_offset + HEADER_LENGTH:frame_offset + frame_length], header)
        finally:
            if offset != term_offset and self._pos != NULL:  # NULL: closed from a handler
                lb_store_release_i64(self._pos, position + (offset - term_offset))
        return fragments

    def controlled_poll(self, handler, int32_t fragment_limit) -> int:
        """Like poll, but ``handler`` returns an action: ABORT (1), BREAK (2), COMMIT (3) or CONTINUE (4).

        ABORT rewinds the fragment and stops; BREAK stops after it; COMMIT stores the position
        now and continues; CONTINUE (or None) carries on.
        """
        if self._closed:
            return 0
        cdef int64_t initial_position = (<int64_t *>self._pos)[0]
        cdef int32_t initial_offset = <int32_t>(initial_position & self._mask)
        cdef int32_t index = <int32_t>((initial_position >> self._shift) % PARTITION_COUNT)
        cdef const char *term = self._log.terms[index]
        cdef object view = self._views[index]
        cdef Header header = self._header
        cdef int32_t offset = initial_offset, fragments = 0, frame_length, frame_offset, aligned
        cdef int32_t term_length = self.term_length
        cdef object action
        cdef int act
        header._term = term
        try:
            while fragments < fragment_limit and offset < term_length:
                frame_length = lb_load_acquire_i32(term + offset)
                if frame_length <= 0:
                    break
                frame_offset = offset
                aligned = _align(frame_length)
                offset += aligned
                if (<uint16_t *>(term + frame_offset + TYPE_OFFSET))[0] == HDR_TYPE_PAD:
                    continue
                fragments += 1
                header.frame_offset = frame_offset
                action = handler(view[frame_offset + HEADER_LENGTH:frame_offset + frame_length], header)
                act = ACTION_CONTINUE if action is None else <int>action
                if act == ACTION_ABORT:
                    fragments -= 1
                    offset -= aligned
                    break
                elif act == ACTION_BREAK:
                    break
                elif act == ACTION_COMMIT:
                    initial_position += offset - initial_offset
                    initial_offset = offset
                    if self._pos != NULL:
                        lb_store_release_i64(self._pos, initial_position)
                elif act != ACTION_CONTINUE:
                    raise ValueError(f"controlled poll handler returned {action!r}; expected ABORT, BREAK, COMMIT or CONTINUE")
        finally:
            if offset != initial_offset and self._pos != NULL:
                lb_store_release_i64(self._pos, initial_position + (offset - initial_offset))
        return fragments

    def block_poll(self, handler, int32_t block_length_limit) -> int:
        """Hand a contiguous block of whole frames (raw, headers included) to
        ``handler(block: memoryview, term_offset, session_id, term_id)``; returns the block length.

        The block never crosses a term and stops before a padding frame (a leading padding
        frame is returned as a block of its own). The position moves past the block even if the
        handler raises.
        """
        if self._closed:
            return 0
        cdef int64_t position = (<int64_t *>self._pos)[0]
        cdef int32_t term_offset = <int32_t>(position & self._mask)
        cdef int32_t index = <int32_t>((position >> self._shift) % PARTITION_COUNT)
        cdef const char *term = self._log.terms[index]
        cdef int64_t limit = <int64_t>term_offset + block_length_limit
        if limit > self.term_length:
            limit = self.term_length
        cdef int32_t resulting = _scan_block(term, term_offset, <int32_t>limit)
        cdef int32_t length = resulting - term_offset
        if length > 0:
            try:
                handler(self._views[index][term_offset:resulting], term_offset,
                        (<int32_t *>(term + term_offset + SESSION_ID_OFFSET))[0],
                        (<int32_t *>(term + term_offset + TERM_ID_OFFSET))[0])
            finally:
                if self._pos != NULL:
                    lb_store_release_i64(self._pos, position + length)
        return length
