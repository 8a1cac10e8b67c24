# cython: language_level=3
"""Reading a log: the ``Header`` flyweight handed to fragment handlers, ``term_read`` (Aeron's TermReader)
and ``ImageCore``, a subscriber's poll, controlled poll and block poll as single native calls.

The loops run in C around the Python handler. A frame length read from the term is not trusted: 0 (or
minus a frame that fits: a claim being written) means "not yet"; any other length outside
[header length, what is left of the term] ends the poll before that frame, which is never delivered (no
payload view of a negative length, the position never moves past it). Such a length is a corrupt log:
when it is at the subscriber position (the frames before it were delivered by an earlier poll), the
poll raises ``logbuf.errors.CorruptLogError`` naming the image, the position and the value, and counts
it once per position in the image's fault counter (``set_fault_counter``). The check is on the cold
path only: the loop's test is the same two comparisons as before. A subscriber position that is not a
multiple of the frame alignment (a corrupted counter) is a ValueError.
"""

from cpython.buffer cimport PyBuffer_Release
cimport cython
import sys
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.object cimport PyObject
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t

from logbuf.native.atomics cimport (
    checked_address,
    lb_get_and_add_i64,
    lb_load_acquire_i32,
    lb_load_acquire_i64,
    lb_store_release_i64,
)
from logbuf.native.constants cimport *
from logbuf.native.log_view cimport LogView
from logbuf.native.topic_filter cimport TopicFilter
from logbuf.native.term cimport (
    TermBuffer,
    align_fitting_length,
    align_frame_length,
    check_term,
    frame_length_fault,
    frame_type,
    log2_of,
    partition_index,
    scan_block,
)

cdef extern from "lb_payload_view.h":
    int lb_payload_view_retarget(PyObject *o, const char *buf, Py_ssize_t length) noexcept


cdef bint _check_retarget() except -1:
    """Whether a payload view can be pointed at the next fragment on this interpreter (see
    ``lb_payload_view.h``): tried once on a private buffer, with every property a handler can read."""
    cdef bytearray data = bytearray(range(64))
    cdef object whole = memoryview(data).toreadonly()
    cdef object view = whole[0:8]
    cdef const char *base = data
    if not lb_payload_view_retarget(<PyObject *>view, base + 16, 5):
        return False
    ok = (len(view) == 5 and view.nbytes == 5 and bytes(view) == bytes(data[16:21]) and view[4] == 20
          and view.tobytes() == bytes(data[16:21]) and view.readonly and view.c_contiguous and view.shape == (5,))
    view.release()
    whole.release()
    return ok


cdef bint _RETARGET = _check_retarget()
PAYLOAD_VIEW_REUSED = _RETARGET
"""True where polls hand out one payload memoryview object, re-pointed per fragment while unshared."""


cdef inline int64_t _read_position(const char *position_address) except? -1:
    """The subscriber position (a plain load: the image is its single writer), a frame boundary."""
    cdef int64_t position = (<const int64_t *>position_address)[0]
    if position & (FRAME_ALIGNMENT - 1):
        raise ValueError(f"subscriber position={position} is not a multiple of {FRAME_ALIGNMENT} (corrupted counter)")
    return position


cdef str _fault_reason(int fault, int32_t remaining):
    if fault == FRAME_SHORT:
        return f"shorter than the {HEADER_LENGTH}-byte frame header"
    if fault == FRAME_PAST_TERM_END:
        return f"longer than the {remaining} bytes left in the term"
    return "negative and not a claim that fits the term"


cdef int _raise_corrupt(int fault, const char *term, int32_t offset, int32_t frame_length, int32_t remaining,
                        int64_t position, int32_t session_id, int32_t stream_id, object channel) except -1:
    """Raise the CorruptLogError of a bad frame length (cold path; imported here, as the base errors module
    imports nothing of the package)."""
    from logbuf.errors import CorruptLogError

    cdef uint16_t type_ = frame_type(term + offset)
    kind = "PAD" if type_ == HDR_TYPE_PAD else "DATA" if type_ == HDR_TYPE_DATA else f"type {type_}"
    raise CorruptLogError(
        f"{_fault_reason(fault, remaining)} ({kind} frame)", session_id=session_id, stream_id=stream_id,
        channel=channel, position=position, term_offset=offset, frame_length=frame_length,
    )


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
        return (<uint8_t *>(self._frame() + VERSION_OFFSET))[0]

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
        return begin + align_frame_length(<int64_t>self.frame_offset + frame_length)

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


def term_read(term_buffer, int32_t term_offset, handler, int32_t fragment_limit, Header header not None,
              int32_t initial_term_id=0) -> tuple:
    """Aeron's TermReader: deliver up to ``fragment_limit`` fragments from ``term_offset``.

    Calls ``handler(payload: memoryview, header)`` per data frame, skipping padding. Returns
    ``(fragments_read, next_term_offset)``. If the handler raises, the exception propagates;
    the caller's position may move past every fragment handed out so far (use ImageCore.poll).
    """
    cdef TermBuffer b = TermBuffer(term_buffer, False)
    check_term(b, term_offset)
    cdef const char *term = <const char *>b.view.buf
    cdef object view = memoryview(term_buffer).toreadonly()
    cdef int32_t term_length = <int32_t>b.view.len
    cdef int32_t offset = term_offset, fragments = 0, frame_length, frame_offset
    header._term = term
    header._initial_term_id = initial_term_id
    header._shift = log2_of(term_length)
    cdef int fault
    try:
        while fragments < fragment_limit and offset < term_length:
            frame_length = lb_load_acquire_i32(term + offset)
            if frame_length < HEADER_LENGTH or frame_length > term_length - offset:
                if offset == term_offset and frame_length != 0:
                    fault = frame_length_fault(frame_length, term_length - offset)
                    if fault:
                        _raise_corrupt(fault, term, offset, frame_length, term_length - offset, offset,
                                       (<int32_t *>(term + offset + SESSION_ID_OFFSET))[0],
                                       (<int32_t *>(term + offset + STREAM_ID_OFFSET))[0], None)
                break
            frame_offset = offset
            offset += align_fitting_length(frame_length)
            if frame_type(term + frame_offset) == HDR_TYPE_PAD:
                continue
            fragments += 1
            header.frame_offset = frame_offset
            handler(view[frame_offset + HEADER_LENGTH:frame_offset + frame_length], header)
    finally:
        header._term = NULL
        view.release()
    return fragments, offset


cdef class FragmentBatchCore:
    """Where :meth:`ImageCore.poll_batch` writes a batch of fragments, one element per fragment: the
    payload's offset in its term and length, the session id, flags, stream position after the frame
    and reserved value. ``count`` fragments of partition ``partition`` are valid after a poll, until the
    next poll of the image that filled it (the image stores its position past them only then).

    Made from six caller-owned buffers of one length (numpy arrays: int32 offsets, lengths and session
    ids, uint8 flags, int64 positions and reserved values); ``logbuf.logbuffer.image.FragmentBatch``
    allocates them."""

    cdef int32_t[::1] _offsets
    cdef int32_t[::1] _lengths
    cdef int32_t[::1] _session_ids
    cdef uint8_t[::1] _flags
    cdef int64_t[::1] _positions
    cdef int64_t[::1] _reserved_values
    cdef readonly int32_t capacity
    cdef readonly int32_t count
    cdef readonly int32_t partition

    def __cinit__(self, int32_t[::1] offsets not None, int32_t[::1] lengths not None,
                  int32_t[::1] session_ids not None, uint8_t[::1] flags not None,
                  int64_t[::1] positions not None, int64_t[::1] reserved_values not None):
        cdef Py_ssize_t n = offsets.shape[0]
        if (lengths.shape[0] != n or session_ids.shape[0] != n or flags.shape[0] != n or positions.shape[0] != n
                or reserved_values.shape[0] != n):
            raise ValueError(f"a fragment batch's six arrays must have one length; got {offsets.shape[0]}, "
                             f"{lengths.shape[0]}, {session_ids.shape[0]}, {flags.shape[0]}, {positions.shape[0]}, "
                             f"{reserved_values.shape[0]}")
        if n <= 0 or n > 1 << 24:
            raise ValueError(f"fragment batch capacity={n} must be within 1..{1 << 24}")
        self._offsets, self._lengths, self._session_ids = offsets, lengths, session_ids
        self._flags, self._positions, self._reserved_values = flags, positions, reserved_values
        self.capacity = <int32_t>n
        self.count = 0
        self.partition = 0


cdef class ImageCore:
    """A subscriber's view of one log: reads from its own subscriber-position counter."""

    cdef LogView _log
    cdef char *_pos
    cdef object _pos_owner
    cdef Header _header
    cdef list _views
    cdef object _payload  # the payload view handed to handlers, re-pointed while unshared
    cdef int64_t _pending  # poll_batch: the position after the batch handed out, stored on the next poll (-1: none)
    cdef int32_t _mask
    cdef int32_t _shift
    cdef readonly int32_t term_length
    cdef readonly int32_t session_id
    cdef readonly int32_t stream_id
    cdef readonly int32_t initial_term_id
    cdef bint _closed
    cdef char *_fault_counter  # where corrupt frames are counted (NULL: nowhere but corrupt_frame_count)
    cdef object _fault_counter_owner
    cdef int64_t _fault_position  # the position of the last corrupt frame counted (-1: none)
    cdef readonly int64_t corrupt_frame_count
    """Corrupt frames this image met (each counted once, at the position where it stopped)."""
    cdef public object channel
    """The image's channel, named in errors (None if unknown; the client sets it)."""

    def __cinit__(self, LogView log not None, position_buffer, Py_ssize_t position_offset):
        cdef Py_buffer view
        if log.closed:
            raise ValueError("log is closed")
        self._pos = checked_address(&view, position_buffer, position_offset, 8, True)
        PyBuffer_Release(&view)
        self._pos_owner = memoryview(position_buffer)
        self._log = log
        self.term_length = log.term_length
        self._mask = log.term_length - 1
        self._shift = log.position_bits_to_shift
        self.initial_term_id = log.initial_term_id
        self._views = list(log._term_views)
        self._payload = self._views[0][0:0]
        self._pending = -1
        self._header = Header()
        self._header._initial_term_id = log.initial_term_id
        self._header._shift = log.position_bits_to_shift
        cdef const char *hdr = log.meta + DEFAULT_FRAME_HEADER_OFFSET
        self.session_id = (<int32_t *>(hdr + SESSION_ID_OFFSET))[0]
        self.stream_id = (<int32_t *>(hdr + STREAM_ID_OFFSET))[0]
        self._closed = False
        self._fault_counter = NULL
        self._fault_counter_owner = None
        self._fault_position = -1
        self.corrupt_frame_count = 0
        self.channel = None

    def set_fault_counter(self, counter_buffer, Py_ssize_t offset) -> None:
        """Also count each corrupt frame this image meets in the 8-byte counter at ``offset`` of
        ``counter_buffer`` (an atomic add: the driver's corrupt-log-frames system counter)."""
        cdef Py_buffer view
        cdef char *address = checked_address(&view, counter_buffer, offset, 8, True)
        PyBuffer_Release(&view)
        self._fault_counter_owner = memoryview(counter_buffer)
        self._fault_counter = address

    cdef int _corrupt(self, const char *term, int32_t offset, int32_t frame_length, int64_t position) except -1:
        """The cold path of every poll, for a length outside [header length, rest of the term] at the
        subscriber position ``position`` (term offset ``offset``): 0 if nothing is there yet (0, or a claim
        being written), else count it (once per position) and raise CorruptLogError."""
        cdef int32_t remaining = self.term_length - offset
        cdef int fault = frame_length_fault(frame_length, remaining)
        if fault == FRAME_NOT_YET:
            return 0
        if position != self._fault_position:
            self._fault_position = position
            self.corrupt_frame_count += 1
            if self._fault_counter != NULL:
                lb_get_and_add_i64(self._fault_counter, 1)
        return _raise_corrupt(fault, term, offset, frame_length, remaining, position, self.session_id,
                              self.stream_id, self.channel)

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def position(self) -> int:
        """This subscriber's position in the stream."""
        if self._closed:
            raise ValueError("image is closed")
        if self._pending >= 0:
            return self._pending
        return lb_load_acquire_i64(self._pos)

    @position.setter
    def position(self, int64_t new_position) -> None:
        """Move this subscriber (frame-aligned, within the window still held in the log)."""
        if self._closed:
            raise ValueError("image is closed")
        self._commit_pending()
        cdef int64_t current = lb_load_acquire_i64(self._pos)
        if new_position % FRAME_ALIGNMENT != 0:
            raise ValueError(f"position={new_position} is not a multiple of {FRAME_ALIGNMENT}")
        if new_position < current:
            raise ValueError(f"position={new_position} is behind the current position {current}")
        lb_store_release_i64(self._pos, new_position)

    @property
    def end_of_stream_position(self) -> int:
        if self._closed:
            raise ValueError("image is closed")
        return lb_load_acquire_i64(self._log.meta + END_OF_STREAM_POSITION_OFFSET)

    @property
    def is_end_of_stream(self) -> bool:
        """True once this subscriber reached the end-of-stream position (or the image is closed)."""
        if self._closed:
            return True
        cdef int64_t position = self._pending if self._pending >= 0 else lb_load_acquire_i64(self._pos)
        return position >= lb_load_acquire_i64(self._log.meta + END_OF_STREAM_POSITION_OFFSET)

    cdef inline object _payload_at(self, object view, const char *term, int32_t frame_offset,
                                   int32_t frame_length):
        """The payload of the frame at ``frame_offset`` as a read-only memoryview: this image's own view
        re-pointed when nobody else holds it, else a fresh slice of the term (which becomes its own)."""
        if _RETARGET and lb_payload_view_retarget(<PyObject *>self._payload, term + frame_offset + HEADER_LENGTH,
                                                  frame_length - HEADER_LENGTH):
            return self._payload
        payload = view[frame_offset + HEADER_LENGTH:frame_offset + frame_length]
        if not self._closed:  # a closed image keeps no view of the log
            self._payload = payload
        return payload

    cdef inline void _commit_pending(self) noexcept:
        """Store the position past the last batch :meth:`poll_batch` handed out (its fragments are done)."""
        if self._pending >= 0:
            if self._pos != NULL:
                lb_store_release_i64(self._pos, self._pending)
            self._pending = -1

    def close(self) -> None:
        if not self._closed:
            self._commit_pending()
            self._closed = True
            if (<PyObject *>self._payload).ob_refcnt == 1:  # not in a handler's hands: let the mapping go
                self._payload.release()
            self._payload = None
            self._pos_owner.release()
            self._pos_owner = None
            self._pos = NULL
            if self._fault_counter_owner is not None:
                self._fault_counter_owner.release()
                self._fault_counter_owner = None
                self._fault_counter = NULL
            self._views = None
            self._log = None

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def poll(self, handler, int32_t fragment_limit) -> int:
        """Deliver up to ``fragment_limit`` fragments to ``handler(payload: memoryview, header)``.

        A handler with an ``unfragmented_handler`` attribute (a FragmentAssembler) has unfragmented
        fragments (BEGIN and END flags both set) go straight to that, which is what it would do with them.

        The position is stored (release) after the last fragment handed to the handler, even
        when the handler raises: a fragment whose handler raised counts as delivered.
        """
        return self._poll(handler, fragment_limit)

    cdef int32_t _poll(self, object handler, int32_t fragment_limit) except -1:
        """:meth:`poll`, callable from C (:class:`SubscriptionCore`)."""
        if self._closed:
            return 0
        self._commit_pending()
        cdef int64_t position = _read_position(self._pos)
        cdef int32_t term_offset = <int32_t>(position & self._mask)
        cdef int32_t index = partition_index(position >> self._shift)
        cdef const char *term = self._log.terms[index]
        cdef object view = self._views[index]
        cdef Header header = self._header
        cdef int32_t offset = term_offset, fragments = 0, frame_length, frame_offset
        cdef int32_t aligned
        cdef int32_t term_length = self.term_length
        # A reassembling handler (FragmentAssembler) names where whole messages go: those skip it.
        cdef object direct = getattr(handler, "unfragmented_handler", None)
        # ... and a BytesSink takes them as bytes copied here, with no Python call at all.
        cdef list sink = (<BytesSink>direct).items if type(direct) is BytesSink else None
        header._term = term
        try:
            while fragments < fragment_limit and offset < term_length:
                frame_length = lb_load_acquire_i32(term + offset)
                if frame_length < HEADER_LENGTH or frame_length > term_length - offset:
                    if offset == term_offset and frame_length != 0:  # at the position: corrupt, or not yet
                        self._corrupt(term, offset, frame_length, position)
                    break
                aligned = align_fitting_length(frame_length)
                frame_offset = offset
                offset += aligned
                if frame_type(term + frame_offset) == HDR_TYPE_PAD:
                    continue
                fragments += 1
                header.frame_offset = frame_offset
                if direct is not None and ((<uint8_t *>(term + frame_offset + FLAGS_OFFSET))[0] & UNFRAGMENTED) == UNFRAGMENTED:
                    if sink is not None:
                        sink.append(PyBytes_FromStringAndSize(term + frame_offset + HEADER_LENGTH,
                                                              frame_length - HEADER_LENGTH))
                    else:
                        direct(self._payload_at(view, term, frame_offset, frame_length), header)
                else:
                    handler(self._payload_at(view, term, frame_offset, frame_length), header)
        finally:
            header._term = NULL  # the header is valid only during the handler call
            if offset != term_offset and self._pos != NULL:  # NULL: closed from a handler
                lb_store_release_i64(self._pos, position + (offset - term_offset))
        return fragments

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def controlled_poll(self, handler, int32_t fragment_limit) -> int:
        """Like poll, but ``handler`` returns an action: ABORT (1), BREAK (2), COMMIT (3) or CONTINUE (4).

        ABORT rewinds the fragment and stops; BREAK stops after it; COMMIT stores the position
        now and continues; CONTINUE (or None) carries on.
        """
        if self._closed:
            return 0
        self._commit_pending()
        cdef int64_t initial_position = _read_position(self._pos)
        cdef int32_t initial_offset = <int32_t>(initial_position & self._mask)
        cdef int32_t index = partition_index(initial_position >> self._shift)
        cdef const char *term = self._log.terms[index]
        cdef object view = self._views[index]
        cdef Header header = self._header
        cdef int32_t offset = initial_offset, fragments = 0, frame_length, frame_offset
        cdef int32_t aligned
        cdef int32_t term_length = self.term_length
        cdef object action
        cdef int act
        cdef int32_t start_offset = initial_offset
        header._term = term
        try:
            while fragments < fragment_limit and offset < term_length:
                frame_length = lb_load_acquire_i32(term + offset)
                if frame_length < HEADER_LENGTH or frame_length > term_length - offset:
                    if offset == start_offset and frame_length != 0:  # at the position: corrupt, or not yet
                        self._corrupt(term, offset, frame_length, initial_position)
                    break
                aligned = align_fitting_length(frame_length)
                frame_offset = offset
                offset += aligned
                if frame_type(term + frame_offset) == HDR_TYPE_PAD:
                    continue
                fragments += 1
                header.frame_offset = frame_offset
                action = handler(self._payload_at(view, term, frame_offset, frame_length), header)
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
            header._term = NULL
            if offset != initial_offset and self._pos != NULL:
                lb_store_release_i64(self._pos, initial_position + (offset - initial_offset))
        return fragments

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def block_poll(self, handler, int32_t block_length_limit) -> int:
        """Hand a contiguous block of whole frames (raw, headers included) to
        ``handler(block: memoryview, term_offset, session_id, term_id)``; returns the block length.

        The block never crosses a term and stops before a padding frame (a leading padding
        frame is returned as a block of its own). The position moves past the block even if the
        handler raises.
        """
        if self._closed:
            return 0
        self._commit_pending()
        cdef int64_t position = _read_position(self._pos)
        cdef int32_t term_offset = <int32_t>(position & self._mask)
        cdef int32_t index = partition_index(position >> self._shift)
        cdef const char *term = self._log.terms[index]
        cdef int64_t limit = <int64_t>term_offset + block_length_limit
        if limit > self.term_length:
            limit = self.term_length
        cdef int32_t resulting = scan_block(term, term_offset, <int32_t>limit, self.term_length)
        cdef int32_t length = resulting - term_offset
        cdef int32_t frame_length
        if length == 0 and term_offset < self.term_length:
            frame_length = lb_load_acquire_i32(term + term_offset)
            if frame_length != 0 and (frame_length < HEADER_LENGTH or frame_length > self.term_length - term_offset):
                self._corrupt(term, term_offset, frame_length, position)
        if length > 0:
            try:
                handler(self._views[index][term_offset:resulting], term_offset,
                        (<int32_t *>(term + term_offset + SESSION_ID_OFFSET))[0],
                        (<int32_t *>(term + term_offset + TERM_ID_OFFSET))[0])
            finally:
                if self._pos != NULL:
                    lb_store_release_i64(self._pos, position + length)
        return length

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def poll_batch(self, FragmentBatchCore batch not None, int32_t fragment_limit=0x7fffffff) -> int:
        """Fill ``batch`` with up to its capacity (and ``fragment_limit``) fragments from the subscriber
        position, skipping padding, without calling Python per fragment; returns how many.

        Zero copy: payload i is ``term[offsets[i]:offsets[i] + lengths[i]]`` of partition
        ``batch.partition`` (see :meth:`term_view`). A batch never crosses a term. The fragments stay
        valid until this image's next poll of any kind (or close): only then is the position past them
        stored, so no publisher can overwrite them while they are in use. ``position`` already counts
        them.
        """
        if self._closed:
            return 0
        self._commit_pending()
        cdef int64_t position = _read_position(self._pos)
        cdef int32_t term_offset = <int32_t>(position & self._mask)
        cdef int32_t index = partition_index(position >> self._shift)
        cdef const char *term = self._log.terms[index]
        cdef int32_t offset = term_offset, n = 0, frame_length, frame_offset
        cdef int32_t term_length = self.term_length
        cdef int32_t limit = batch.capacity if batch.capacity < fragment_limit else fragment_limit
        cdef int64_t term_begin = position - term_offset
        cdef int32_t *offsets = &batch._offsets[0]
        cdef int32_t *lengths = &batch._lengths[0]
        cdef int32_t *session_ids = &batch._session_ids[0]
        cdef uint8_t *flags = &batch._flags[0]
        cdef int64_t *positions = &batch._positions[0]
        cdef int64_t *reserved_values = &batch._reserved_values[0]
        cdef const char *frame
        while n < limit and offset < term_length:
            frame_length = lb_load_acquire_i32(term + offset)
            if frame_length < HEADER_LENGTH or frame_length > term_length - offset:
                if offset == term_offset and frame_length != 0:  # at the position: corrupt, or not yet
                    batch.count = 0
                    batch.partition = index
                    self._corrupt(term, offset, frame_length, position)
                break
            frame_offset = offset
            offset += align_fitting_length(frame_length)
            frame = term + frame_offset
            if frame_type(frame) == HDR_TYPE_PAD:
                continue
            offsets[n] = frame_offset + HEADER_LENGTH
            lengths[n] = frame_length - HEADER_LENGTH
            session_ids[n] = (<int32_t *>(frame + SESSION_ID_OFFSET))[0]
            flags[n] = (<uint8_t *>(frame + FLAGS_OFFSET))[0]
            positions[n] = term_begin + offset
            reserved_values[n] = (<int64_t *>(frame + RESERVED_VALUE_OFFSET))[0]
            n += 1
        batch.count = n
        batch.partition = index
        if offset != term_offset:
            self._pending = position + (offset - term_offset)
        return n

    # -- topic-filtered polls: the loops above with one TopicFilter.accept per data frame (skipped frames are
    # consumed without reaching the handler and do not count towards the fragment limit) ------------------

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def poll_filtered(self, TopicFilter topic_filter not None, handler, int32_t fragment_limit) -> int:
        """:meth:`poll` that hands ``handler`` only the fragments ``topic_filter`` accepts; the rest (other
        topics, definitions) are consumed unseen. Returns the fragments delivered."""
        return self._poll_filtered(topic_filter, handler, fragment_limit)

    cdef int32_t _poll_filtered(self, TopicFilter topic_filter, object handler, int32_t fragment_limit) except -1:
        if self._closed:
            return 0
        self._commit_pending()
        cdef int64_t position = _read_position(self._pos)
        cdef int32_t term_offset = <int32_t>(position & self._mask)
        cdef int32_t index = partition_index(position >> self._shift)
        cdef const char *term = self._log.terms[index]
        cdef object view = self._views[index]
        cdef Header header = self._header
        cdef int32_t offset = term_offset, fragments = 0, frame_length, frame_offset, aligned
        cdef int32_t term_length = self.term_length
        cdef const char *frame
        header._term = term
        try:
            while fragments < fragment_limit and offset < term_length:
                frame_length = lb_load_acquire_i32(term + offset)
                if frame_length < HEADER_LENGTH or frame_length > term_length - offset:
                    if offset == term_offset and frame_length != 0:  # at the position: corrupt, or not yet
                        self._corrupt(term, offset, frame_length, position)
                    break
                aligned = align_fitting_length(frame_length)
                frame_offset = offset
                frame = term + frame_offset
                if frame_type(frame) == HDR_TYPE_PAD:
                    offset += aligned
                    continue
                # The position moves past a frame only once the filter has decided it: a resolver that raises
                # leaves its frame to the next poll, so no frame is lost unseen.
                if not topic_filter.accept((<int64_t *>(frame + RESERVED_VALUE_OFFSET))[0], frame + HEADER_LENGTH,
                                           frame_length - HEADER_LENGTH):
                    offset += aligned
                    continue
                offset += aligned
                fragments += 1
                header.frame_offset = frame_offset
                handler(self._payload_at(view, term, frame_offset, frame_length), header)
        finally:
            header._term = NULL
            if offset != term_offset and self._pos != NULL:
                lb_store_release_i64(self._pos, position + (offset - term_offset))
        return fragments

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def controlled_poll_filtered(self, TopicFilter topic_filter not None, handler, int32_t fragment_limit) -> int:
        """:meth:`controlled_poll` over the fragments ``topic_filter`` accepts (ABORT rewinds only the
        fragment it was returned for; skipped frames before it stay consumed)."""
        if self._closed:
            return 0
        self._commit_pending()
        cdef int64_t initial_position = _read_position(self._pos)
        cdef int32_t initial_offset = <int32_t>(initial_position & self._mask)
        cdef int32_t index = partition_index(initial_position >> self._shift)
        cdef const char *term = self._log.terms[index]
        cdef object view = self._views[index]
        cdef Header header = self._header
        cdef int32_t offset = initial_offset, fragments = 0, frame_length, frame_offset
        cdef int32_t aligned
        cdef int32_t term_length = self.term_length
        cdef const char *frame
        cdef object action
        cdef int act
        cdef int32_t start_offset = initial_offset
        header._term = term
        try:
            while fragments < fragment_limit and offset < term_length:
                frame_length = lb_load_acquire_i32(term + offset)
                if frame_length < HEADER_LENGTH or frame_length > term_length - offset:
                    if offset == start_offset and frame_length != 0:  # at the position: corrupt, or not yet
                        self._corrupt(term, offset, frame_length, initial_position)
                    break
                aligned = align_fitting_length(frame_length)
                frame_offset = offset
                frame = term + frame_offset
                if frame_type(frame) == HDR_TYPE_PAD:
                    offset += aligned
                    continue
                if not topic_filter.accept((<int64_t *>(frame + RESERVED_VALUE_OFFSET))[0], frame + HEADER_LENGTH,
                                           frame_length - HEADER_LENGTH):
                    offset += aligned  # after the decision: a resolver that raises leaves the frame to the next poll
                    continue
                offset += aligned
                fragments += 1
                header.frame_offset = frame_offset
                action = handler(self._payload_at(view, term, frame_offset, frame_length), header)
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
            header._term = NULL
            if offset != initial_offset and self._pos != NULL:
                lb_store_release_i64(self._pos, initial_position + (offset - initial_offset))
        return fragments

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def poll_batch_filtered(self, TopicFilter topic_filter not None, FragmentBatchCore batch not None,
                            int32_t fragment_limit=0x7fffffff) -> int:
        """:meth:`poll_batch` of the fragments ``topic_filter`` accepts (``reserved_values`` hold their topic
        ids). A batch with no fragment may still have consumed skipped frames."""
        if self._closed:
            return 0
        self._commit_pending()
        cdef int64_t position = _read_position(self._pos)
        cdef int32_t term_offset = <int32_t>(position & self._mask)
        cdef int32_t index = partition_index(position >> self._shift)
        cdef const char *term = self._log.terms[index]
        cdef int32_t offset = term_offset, n = 0, frame_length, frame_offset
        cdef int32_t term_length = self.term_length
        cdef int32_t limit = batch.capacity if batch.capacity < fragment_limit else fragment_limit
        cdef int64_t term_begin = position - term_offset
        cdef int32_t *offsets = &batch._offsets[0]
        cdef int32_t *lengths = &batch._lengths[0]
        cdef int32_t *session_ids = &batch._session_ids[0]
        cdef uint8_t *flags = &batch._flags[0]
        cdef int64_t *positions = &batch._positions[0]
        cdef int64_t *reserved_values = &batch._reserved_values[0]
        cdef const char *frame
        cdef int64_t value
        try:
            while n < limit and offset < term_length:
                frame_length = lb_load_acquire_i32(term + offset)
                if frame_length < HEADER_LENGTH or frame_length > term_length - offset:
                    if offset == term_offset and frame_length != 0:  # at the position: corrupt, or not yet
                        self._corrupt(term, offset, frame_length, position)
                    break
                frame_offset = offset
                frame = term + frame_offset
                if frame_type(frame) == HDR_TYPE_PAD:
                    offset += align_fitting_length(frame_length)
                    continue
                value = (<int64_t *>(frame + RESERVED_VALUE_OFFSET))[0]
                if not topic_filter.accept(value, frame + HEADER_LENGTH, frame_length - HEADER_LENGTH):
                    offset += align_fitting_length(frame_length)  # after the decision (see poll_filtered)
                    continue
                offset += align_fitting_length(frame_length)
                offsets[n] = frame_offset + HEADER_LENGTH
                lengths[n] = frame_length - HEADER_LENGTH
                session_ids[n] = (<int32_t *>(frame + SESSION_ID_OFFSET))[0]
                flags[n] = (<uint8_t *>(frame + FLAGS_OFFSET))[0]
                positions[n] = term_begin + offset
                reserved_values[n] = value
                n += 1
        finally:  # a resolver that raised: the frames before its frame stay consumed, as after a handler error
            batch.count = n
            batch.partition = index
            if offset != term_offset:
                self._pending = position + (offset - term_offset)
        return n

    def term_view(self, int partition) -> memoryview:
        """Read-only view of term ``partition`` (0-2), for reading a batch's payloads in place."""
        if self._closed:
            raise ValueError("image is closed")
        if not 0 <= partition < PARTITION_COUNT:
            raise ValueError(f"partition={partition} must be 0, 1 or 2")
        return self._views[partition]


cdef class SubscriptionCore:
    """The native half of a subscription: its images (a tuple, replaced, never mutated) and the poll
    over them, round-robin, with no Python frame between the caller and the images' polls (an empty
    poll is most of what a waiting subscriber does)."""

    cdef public tuple _images
    cdef public Py_ssize_t _round_robin

    def __cinit__(self, *args, **kwargs):
        self._images = ()
        self._round_robin = 0

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def poll(self, handler, int32_t fragment_limit) -> int:
        """Poll the images round-robin for up to ``fragment_limit`` fragments in all (see
        :meth:`ImageCore.poll`)."""
        cdef tuple images = self._images
        cdef Py_ssize_t count = len(images), i, start
        cdef int32_t fragments = 0
        if count == 1:
            return (<ImageCore?>images[0])._poll(handler, fragment_limit)
        if count == 0:
            return 0
        start = self._round_robin = (self._round_robin + 1) % count
        for i in range(count):
            fragments += (<ImageCore?>images[(start + i) % count])._poll(handler, fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments


cdef class TopicSubscriptionCore(SubscriptionCore):
    """A subscription's poll over its images through one :class:`~logbuf.native.topic_filter.TopicFilter`
    (round-robin, the fragment limit shared, as :class:`SubscriptionCore`)."""

    cdef public TopicFilter _filter

    @cython.binding(False)  # a method descriptor: one call layer less than a cyfunction
    def poll(self, handler, int32_t fragment_limit) -> int:
        """Deliver up to ``fragment_limit`` fragments of matching topics (see :meth:`ImageCore.poll_filtered`)."""
        cdef tuple images = self._images
        cdef Py_ssize_t count = len(images), i, start
        cdef int32_t fragments = 0
        cdef TopicFilter topic_filter = self._filter
        if topic_filter is None:
            raise ValueError("this topic subscription has no TopicFilter")
        if count == 1:
            return (<ImageCore?>images[0])._poll_filtered(topic_filter, handler, fragment_limit)
        if count == 0:
            return 0
        start = self._round_robin = (self._round_robin + 1) % count
        for i in range(count):
            fragments += (<ImageCore?>images[(start + i) % count])._poll_filtered(topic_filter, handler,
                                                                                  fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments


# -- whole messages as bytes, for ``async for`` ------------------------------------------------------------

cdef class BytesSink:
    """A message handler that keeps a copy of each message as ``bytes`` in :attr:`items`. As a
    FragmentAssembler's delegate it is recognised by :meth:`ImageCore.poll`, which then copies each
    unfragmented payload straight into :attr:`items` without calling Python."""

    cdef readonly list items

    def __cinit__(self):
        self.items = []

    def __call__(self, buffer, header) -> None:
        self.items.append(bytes(buffer))


cdef extern from "Python.h":
    """
    typedef PySendResult (*lb_sendfunc)(PyObject *, PyObject *, PyObject **);
    static int lb_set_am_send(PyTypeObject *type, lb_sendfunc send) {
        if (type->tp_as_async == NULL) return 0;
        type->tp_as_async->am_send = send;
        return 1;
    }
    """
    ctypedef enum PySendResult:
        PYGEN_RETURN
        PYGEN_ERROR
        PYGEN_NEXT
    ctypedef PySendResult (*lb_sendfunc)(PyObject *, PyObject *, PyObject **)
    ctypedef struct PyTypeObject:
        pass
    int lb_set_am_send(PyTypeObject *type, lb_sendfunc send)
    void Py_INCREF(PyObject *)
    void PyErr_SetString(object, const char *)


cdef class MessageStream:
    """``async for message in stream``: the messages a poll leaves in a :class:`BytesSink`, one per step.

    While messages are buffered, or one poll finds some, each step completes at once. On CPython 3.11,
    ``__anext__`` returns the stream itself as the awaitable, and its ``am_send`` slot hands the next
    message back with no frame and no ``StopIteration`` object (what an ``async def`` generator pays per
    item). From 3.12 the interpreter no longer asks ``am_send`` (it calls ``__next__``, which must raise
    ``StopIteration``) but runs a plain ``async def`` coroutine inline, so ``__anext__`` returns
    ``ready(message)``, such a coroutine that only returns its argument. Otherwise ``__anext__`` returns ``wait(stream, yield_first)``, a coroutine that idles until
    :meth:`fill` finds a message and returns :meth:`take`, or raises ``StopAsyncIteration`` at the end.
    Every ``yield_every`` polls that found messages, that coroutine is used with ``yield_first`` so the
    loop's other tasks run.
    """

    cdef object _poll
    cdef object _handler
    cdef list _items
    cdef Py_ssize_t _next
    cdef int32_t _fragment_limit
    cdef int _polls
    cdef int _yield_every
    cdef object _wait
    cdef object _ready

    def __init__(self, poll, handler, BytesSink sink not None, int32_t fragment_limit, int yield_every, wait, ready):
        if fragment_limit < 1:
            raise ValueError(f"fragment_limit={fragment_limit} must be >= 1")
        if yield_every < 1:
            raise ValueError(f"yield_every={yield_every} must be >= 1")
        self._poll = poll
        self._handler = handler
        self._items = sink.items
        self._next = 0
        self._fragment_limit = fragment_limit
        self._polls = 0
        self._yield_every = yield_every
        self._wait = wait
        self._ready = ready

    cpdef bint fill(self) except -1:
        """True when a message is ready to :meth:`take`, polling once if none is buffered."""
        if self._next < len(self._items):
            return True
        del self._items[:]
        self._next = 0
        self._poll(self._handler, self._fragment_limit)
        return len(self._items) > 0

    cpdef object take(self):
        """The next buffered message (call after :meth:`fill` returned True)."""
        item = self._items[self._next]
        self._next += 1
        return item

    def __aiter__(self):
        return self

    def __anext__(self):
        if self._next >= len(self._items):
            self._polls += 1
            if self._polls >= self._yield_every:
                self._polls = 0
                return self._wait(self, True)
            if not self.fill():
                self._polls -= 1  # an empty poll is not a busy one
                return self._wait(self, False)
        if _AWAIT_SELF:
            return self
        return self._ready(self.take())

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def __next__(self):
        # The path when am_send is not used (a tracer is active, or another interpreter): same result.
        if self._next < len(self._items):
            raise StopIteration(self.take())
        raise RuntimeError("MessageStream awaited with no message ready")


cdef PySendResult _message_stream_send(PyObject *obj, PyObject *value, PyObject **result) noexcept:
    cdef MessageStream stream = <MessageStream>obj
    cdef PyObject *item
    if stream._next < len(stream._items):
        item = <PyObject *>stream._items[stream._next]
        stream._next += 1
        Py_INCREF(item)
        result[0] = item
        return PYGEN_RETURN
    PyErr_SetString(RuntimeError, b"MessageStream awaited with no message ready")
    result[0] = NULL
    return PYGEN_ERROR


#: Whether a MessageStream step is the stream itself, completed by ``am_send`` (CPython before 3.12, when the
#: type has an async slot table to put it in), rather than a ``ready(message)`` coroutine.
MESSAGE_STREAM_AM_SEND = sys.version_info < (3, 12) and bool(
    lb_set_am_send(<PyTypeObject *>MessageStream, _message_stream_send))
cdef bint _AWAIT_SELF = MESSAGE_STREAM_AM_SEND
