# cython: language_level=3
"""Appending to a log: ``PublicationCore`` (offer, batch offer, try_claim as single native calls) and the
``BufferClaim`` it hands out.

Theory of operation
-------------------
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

The appender's C bodies (header write, unfragmented and fragmented writes, padding, rotation) are the
inline functions of ``term.pxd``, shared with ``term.term_append_unfragmented``. The shared metadata is
trusted no further than it must be: a raw tail past the term is a trip (nothing is written), any term
count picks a partition, and the MTU recorded in the log is checked when the core is made.
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_XDECREF
from cpython.sequence cimport PySequence_Fast, PySequence_Fast_GET_SIZE, PySequence_Fast_ITEMS
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t

from logbuf.native.atomics cimport (
    checked_address,
    lb_get_and_add_i64,
    lb_load_acquire_i32,
    lb_load_acquire_i64,
    lb_store_release_i32,
    lb_store_release_i64,
)
from logbuf.native.constants cimport *
from logbuf.native.log_view cimport LogView
from logbuf.native.term cimport (
    align_frame_length,
    fragmented_length,
    handle_end_of_log,
    header_write,
    partition_index,
    rotate_to_next_term,
    write_fragmented,
    write_unfragmented,
)

cdef extern from "lb_position_int.h":
    int LB_POSITION_INT_REUSE
    object lb_position_int(PyObject **cache, int64_t value, int reuse)


cdef bint _check_position_int() except -1:
    """Whether offers can hand back one position int, rewritten while unshared, on this interpreter (see
    ``lb_position_int.h``): tried once on a private cache, with what code can do with an int."""
    if not LB_POSITION_INT_REUSE:
        return False
    cdef PyObject *cache = NULL
    cdef int64_t v
    ok = True
    try:
        for v in (1, 5, 255, 256, 4095, (1 << 30) - 1, 1 << 30, (1 << 31) + 7, (1 << 45) - 3, (1 << 60) + 12345,
                  (1 << 62) + 1, 0x7FFFFFFFFFFFFFFF, 64):
            x = lb_position_int(&cache, v, 1)
            w = int(str(v))  # a fresh int of the same value
            ok = ok and (type(x) is int and x == w and w == x and hash(x) == hash(w) and str(x) == str(w)
                         and x + 1 == w + 1 and x - w == 0 and -x == -w and x >> 3 == w >> 3 and x & 0xFFF == w & 0xFFF
                         and x.bit_length() == w.bit_length() and x < w + 1 and not x > w and x > 0 and bool(x)
                         and {w: 1}.get(x) == 1 and x.to_bytes(8, "little") == w.to_bytes(8, "little")
                         and (x * 3) // 3 == w and float(x) == float(w) and x % 64 == w % 64)
            kept = x  # a kept position must not change under the next one
            y = lb_position_int(&cache, 7, 1)
            ok = ok and kept == w and y == 7 and id(y) != id(kept)
            del x, y, kept
        z = lb_position_int(&cache, 99, 1)
        ok = ok and z == 99 and id(z) == id(<object>cache)  # an unshared cache is the one reused
    finally:
        if cache != NULL:
            Py_DECREF(<object>cache)
    return ok


cdef bint _REUSE_POSITION_INT = _check_position_int()
POSITION_INT_REUSED = _REUSE_POSITION_INT
"""True where offers hand back one position int object per publication, rewritten while unshared."""


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

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def commit(self) -> None:
        """Publish the frame (release store of its length)."""
        if self._frame == NULL:
            raise ValueError("buffer claim is not active (already committed or aborted)")
        lb_store_release_i32(self._frame, self._frame_length)
        self._finish()

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
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
    cdef PyObject *_position_int  # the int offers hand back, rewritten while unshared (lb_position_int.h)

    def __dealloc__(self):
        Py_XDECREF(self._position_int)
        self._position_int = NULL

    cdef inline object _position_result(self, int64_t result):
        """``result`` as an int: the new position in this publication's reused int, or a failure code."""
        return lb_position_int(&self._position_int, result, _REUSE_POSITION_INT)

    def __cinit__(self, LogView log not None, limit_buffer, Py_ssize_t limit_offset, bint exclusive=False,
                  object limit_updater=None):
        cdef Py_buffer view
        if log.closed:
            raise ValueError("log is closed")
        cdef int32_t mtu = log.mtu_length
        if mtu <= HEADER_LENGTH or mtu > MAX_UDP_PAYLOAD_LENGTH or mtu % FRAME_ALIGNMENT != 0:
            raise ValueError(f"mtu_length={mtu} in the log metadata is not a multiple of {FRAME_ALIGNMENT} "
                             f"from {HEADER_LENGTH + FRAME_ALIGNMENT} to {MAX_UDP_PAYLOAD_LENGTH}")
        self._limit = checked_address(&view, limit_buffer, limit_offset, 8, False)
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
            self._active_index = partition_index(term_count)
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
        cdef int64_t raw_tail = lb_load_acquire_i64(self._meta + TAIL_COUNTERS_OFFSET + 8 * partition_index(term_count))
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
        cdef int64_t raw_tail, position, begin, tail_offset
        cdef char *tail_addr
        if self.exclusive:
            term_offset = self._term_offset
            term_id = self._term_id
            index = self._active_index
            begin = self._term_begin_position
            term_count = <int32_t>(term_id - self.initial_term_id)
        else:
            term_count = lb_load_acquire_i32(self._meta + ACTIVE_TERM_COUNT_OFFSET)
            index = partition_index(term_count)
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
        tail_offset = term_offset
        if self.exclusive:
            lb_store_release_i64(tail_addr, ((<int64_t>term_id) << 32) | (term_offset + claim_length))
        else:
            raw_tail = lb_get_and_add_i64(tail_addr, claim_length)
            tail_offset = <int64_t>(<uint32_t>raw_tail)  # 0 .. 2^32 - 1: past the term is a trip, never a write
            term_id = <int32_t>(raw_tail >> 32)
            begin = (<int64_t>(<int32_t>(term_id - self.initial_term_id))) << self._shift
        out.term = self._log.terms[index]
        out.term_offset = <int32_t>tail_offset
        out.term_id = term_id
        out.begin = begin
        if tail_offset + claim_length > self.term_length:
            handle_end_of_log(out.term, tail_offset, self.term_length, term_id, self._vft, self.session_id,
                              self.stream_id)
            if begin + self.term_length >= self._max_possible_position:
                return MAX_POSITION_EXCEEDED
            if self.exclusive:
                self._exclusive_rotate()
            else:
                rotate_to_next_term(self._meta, term_count, term_id)
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
            claim_length = <int32_t>align_frame_length(length + HEADER_LENGTH)
        else:
            claim_length = fragmented_length(length, self.max_payload_length)
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
                offset = write_unfragmented(term, offset, term_id, srcs[i], lengths[i], reserved_value, self._vft,
                                             self.session_id, self.stream_id)
            return offset
        if length <= self.max_payload_length:
            return write_unfragmented(term, term_offset, term_id, src, length, reserved_value, self._vft,
                                       self.session_id, self.stream_id)
        return write_fragmented(term, term_offset, term_id, src, length, self.max_payload_length,
                                 reserved_value, self._vft, self.session_id, self.stream_id)

    cdef void _exclusive_rotate(self) noexcept:
        cdef int32_t next_term_id = self._term_id + 1
        cdef int32_t term_count = <int32_t>(next_term_id - self.initial_term_id)
        cdef int32_t next_index = partition_index(term_count)
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

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def offer(self, buffer, int64_t reserved_value=0) -> int:
        """Append one message. Returns the new stream position, or a negative OfferResult."""
        if self._closed:
            return CLOSED
        cdef Py_ssize_t n
        if PyBytes_CheckExact(buffer):  # the common case: no buffer export to take and give back
            n = PyBytes_GET_SIZE(buffer)
            if n <= self.max_payload_length:
                return self._position_result(
                    self._offer(PyBytes_AS_STRING(buffer), <int32_t>n, reserved_value, 0, NULL, NULL, 0))
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
        return self._position_result(result)

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
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
                total += align_frame_length(lengths[i] + HEADER_LENGTH)
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

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def offer_rows(self, const uint8_t[:, ::1] rows not None, const int64_t[::1] reserved_values=None) -> int:
        """Append each row of a C-contiguous 2-D uint8 array (a numpy ``(n, size)`` array) as one message,
        with one claim: all or nothing, as :meth:`offer_batch`. ``reserved_values`` (int64, one per row)
        go into the frames' reserved value fields, else 0. Returns the position after the last message
        or a negative OfferResult."""
        if self._closed:
            return CLOSED
        cdef Py_ssize_t n = rows.shape[0], size = rows.shape[1]
        if size > self.max_payload_length:
            raise ValueError(f"row length={size} exceeds max_payload_length={self.max_payload_length}; batch "
                             "messages are not fragmented")
        if n == 0:
            return self._tail_position()
        return self._offer_packed(&rows[0, 0] if size > 0 else NULL, n, size, NULL, reserved_values)

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def offer_packed(self, const uint8_t[::1] data not None, const int32_t[::1] lengths not None,
                     const int64_t[::1] reserved_values=None) -> int:
        """Append messages laid back to back in ``data`` (message i is the next ``lengths[i]`` bytes), with
        one claim: all or nothing, as :meth:`offer_batch`; ``reserved_values`` as in :meth:`offer_rows`."""
        if self._closed:
            return CLOSED
        cdef Py_ssize_t n = lengths.shape[0], i
        cdef int64_t total = 0
        for i in range(n):
            if lengths[i] < 0 or lengths[i] > self.max_payload_length:
                raise ValueError(f"message {i} length={lengths[i]} must be within 0..max_payload_length="
                                 f"{self.max_payload_length}; batch messages are not fragmented")
            total += lengths[i]
        if total != data.shape[0]:
            raise ValueError(f"lengths add up to {total} bytes but data holds {data.shape[0]}")
        if n == 0:
            return self._tail_position()
        return self._offer_packed(&data[0] if total > 0 else NULL, n, -1, &lengths[0], reserved_values)

    cdef int64_t _offer_packed(self, const uint8_t *data, Py_ssize_t n, Py_ssize_t size, const int32_t *lengths,
                               const int64_t[::1] reserved_values) except? -9:
        """Claim once for ``n`` messages (each ``size`` bytes, or ``lengths[i]`` when size < 0) packed in
        ``data``, then write each as one frame with its reserved value."""
        if n > 65536:
            raise ValueError(f"batch of {n} messages exceeds the 65536-message batch limit")
        if reserved_values is not None and reserved_values.shape[0] != n:
            raise ValueError(f"reserved_values has {reserved_values.shape[0]} values for {n} messages")
        cdef Py_ssize_t i
        cdef int64_t total = 0
        for i in range(n):
            total += align_frame_length((size if size >= 0 else lengths[i]) + HEADER_LENGTH)
        if total > self.max_message_length:
            raise ValueError(f"batch framed length={total} exceeds max_message_length={self.max_message_length}")
        cdef _Claimed c
        cdef int64_t result
        cdef int32_t offset, length
        cdef const uint8_t *src
        cdef int attempt
        for attempt in range(3):
            result = self._claim_space(<int32_t>total, <int32_t>total, &c)
            if result == TRIPPED:
                continue
            if result != 0:
                return result
            offset, src = c.term_offset, data
            for i in range(n):
                length = <int32_t>(size if size >= 0 else lengths[i])
                offset = write_unfragmented(c.term, offset, c.term_id, <const char *>src, length,
                                            reserved_values[i] if reserved_values is not None else 0, self._vft,
                                            self.session_id, self.stream_id)
                src += length
            return c.begin + offset
        return ADMIN_ACTION

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def try_claim(self, int32_t length, BufferClaim claim not None) -> int:
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
        cdef int32_t aligned = <int32_t>align_frame_length(frame_length)
        cdef _Claimed c
        cdef int64_t result = self._claim_space(aligned, length, &c)
        if result != 0:
            return result
        header_write(c.term, c.term_offset, frame_length, c.term_id, self._vft, self.session_id, self.stream_id)
        (<int64_t *>(c.term + c.term_offset + RESERVED_VALUE_OFFSET))[0] = 0
        claim._frame = c.term + c.term_offset
        claim._frame_length = frame_length
        claim._log = self._log
        cdef Py_ssize_t start = (c.term - self._log.base) + c.term_offset + HEADER_LENGTH
        claim._view = self._log._mem[start:start + length]
        return c.begin + c.term_offset + aligned


cdef class TopicHandle:
    """Offers to one topic of a publication: each message's reserved value is the topic id
    (``protocol_spec/topics.md``), so a topic costs nothing per message over a plain :meth:`PublicationCore.offer`.

    The handle's first successful offer is preceded by the topic's definition frame (reserved value: the id
    with bit 63 set; payload: the UTF-8 name), so subscribers anywhere on the stream (another host, a
    recording) can name the topic. ``defined`` says whether it went out; :meth:`define` sends it again.
    """

    cdef PublicationCore _pub
    cdef readonly int64_t topic_id
    cdef readonly bytes name_bytes
    cdef readonly bint defined

    def __cinit__(self, PublicationCore publication not None, int64_t topic_id, bytes name_bytes not None):
        if topic_id <= 0:
            raise ValueError(f"topic_id={topic_id} must be within 1..2**63-1")
        if len(name_bytes) == 0 or len(name_bytes) > publication.max_payload_length:
            raise ValueError(f"topic name of {len(name_bytes)} bytes must be within 1..max_payload_length="
                             f"{publication.max_payload_length}")
        self._pub = publication
        self.topic_id = topic_id
        self.name_bytes = name_bytes
        self.defined = False

    @property
    def publication(self) -> PublicationCore:
        return self._pub

    def define(self) -> int:
        """Append the definition frame now: the new position or a negative OfferResult."""
        if self._pub._closed:
            return CLOSED
        cdef int64_t result = self._pub._offer(PyBytes_AS_STRING(self.name_bytes),
                                               <int32_t>PyBytes_GET_SIZE(self.name_bytes),
                                               self.topic_id | (<int64_t>1 << 63), 0, NULL, NULL, 0)
        if result > 0:
            self.defined = True
        return result

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def offer(self, buffer) -> int:
        """Append one message of this topic: the new stream position, or a negative OfferResult."""
        # The body of _offer again, not a call to it: the extra C call cost ~30 instructions (callgrind), 5 %.
        cdef PublicationCore pub = self._pub
        cdef int64_t result
        cdef Py_ssize_t n
        if not self.defined:
            result = self.define()
            if result < 0:
                return result
        if PyBytes_CheckExact(buffer) and not pub._closed:
            n = PyBytes_GET_SIZE(buffer)
            if n <= pub.max_payload_length:
                return pub._position_result(pub._offer(PyBytes_AS_STRING(buffer), <int32_t>n, self.topic_id, 0,
                                                       NULL, NULL, 0))
        return pub.offer(buffer, self.topic_id)

    cdef object _offer(self, object buffer):
        """:meth:`offer` for :class:`TopicOffers`."""
        cdef PublicationCore pub = self._pub
        cdef int64_t result
        cdef Py_ssize_t n
        if not self.defined:
            result = self.define()
            if result < 0:
                return result
        if PyBytes_CheckExact(buffer) and not pub._closed:
            n = PyBytes_GET_SIZE(buffer)
            if n <= pub.max_payload_length:
                return pub._position_result(pub._offer(PyBytes_AS_STRING(buffer), <int32_t>n, self.topic_id, 0,
                                                       NULL, NULL, 0))
        return pub.offer(buffer, self.topic_id)

    def offer_batch(self, messages) -> int:
        """:meth:`PublicationCore.offer_batch` of messages of this topic (one claim, all or nothing)."""
        cdef int64_t result
        if not self.defined:
            result = self.define()
            if result < 0:
                return result
        return self._pub.offer_batch(messages, self.topic_id)

    def __repr__(self) -> str:
        return f"TopicHandle(topic_id=0x{self.topic_id:016x}, name={self.name_bytes!r}, defined={self.defined})"


cdef class TopicOffers:
    """``offer(name, payload)`` by topic name for one publication: a dict of :class:`TopicHandle` by name, looked up
    and offered through in C; ``make(name)`` makes (and registers) the handle of a name not seen before."""

    cdef dict _handles
    cdef object _make

    def __cinit__(self, make):
        self._handles = {}
        self._make = make

    @property
    def handles(self) -> dict:
        """Name -> TopicHandle (the live dict)."""
        return self._handles

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def offer(self, name, buffer) -> int:
        """Append one message of topic ``name``: the new stream position, or a negative OfferResult."""
        cdef PyObject *found = PyDict_GetItem(self._handles, name)
        cdef TopicHandle handle
        if found == NULL:
            handle = self._make(name)
            self._handles[name] = handle
        else:
            handle = <TopicHandle>found
        return handle._offer(buffer)
