"""ManyToOneRingBuffer: many producer processes, one consumer, over shared memory (Agrona's algorithm).

Theory of operation (layout in :mod:`logbuf.conduit.ring_buffer_descriptor`):

* **Claim.** A producer reads the tail and checks the space against its cached head (refreshing
  the head cache from the real head only when the cache says "full"). If the record does not fit
  before the end of the ring, it claims the rest of the ring as padding as well, provided the
  consumer has freed enough room at the start. The claim is one CAS on the tail
  (``tail -> tail + padding + aligned record length``); on failure it starts over.
* **Write.** The producer stores ``-length`` (visible before anything else it writes), then the
  type id and the message, then ``+length`` with a release store: that commits the record. A
  padding record is committed the same way, before the real record is written at offset 0.
* **Read.** The single consumer walks records from the head while their length is positive
  (acquire load), hands each message to the handler, then zeroes the consumed bytes and advances
  the head with a release store, so producers reuse only zeroed space. The head moves in a
  ``finally`` block: a handler that raises still consumes the records handed out, itself included.
* **Distrust.** Every process that maps the ring can write anything into it, so the consumer
  never reads past the tail (bytes there were never claimed) and checks each committed length:
  at least a header, within the claimed bytes and the end of the ring, and a message no longer
  than ``max_msg_length``. A length that cannot be true is counted and its header skipped: where
  the record really ends is unknown, so the consumer walks on 8 bytes at a time, past every length
  no producer could have written (negative ones included), to the next record that can be true.
  If it meets zeroes instead (nothing begun there), they wait for ``unblock()`` like a dead claim.
  Random bytes after a lying header thus cost one pass, not one unblock timeout per 8 bytes.
* **Unblock.** A producer that dies between claim and commit leaves a record the consumer can never
  pass (a negative length, or zeroes if it died before even that). ``unblock()`` turns such a record
  into padding (zeroes up to the next record that has begun, or up to the tail or the end of the
  ring if none has), and puts back a tail moved out of place (behind the head, or more than a lap
  ahead of it). It cannot tell a dead producer from a slow one: :class:`RingBufferUnblocker` calls
  it only when the consumer position has not moved for a timeout while records wait (Aeron: the
  driver conductor's check for blocked commands).
"""

from __future__ import annotations

from collections.abc import Callable

from logbuf import native
from logbuf.conduit import ring_buffer_descriptor as rd

MessageHandler = Callable[[int, memoryview], None]
"""``handler(msg_type_id, message)``; the view is only valid during the call."""

InvalidRecordHandler = Callable[[int, int, int], None]
"""``handler(record_offset, length, msg_type_id)`` for a committed record whose length cannot be true."""


class ManyToOneRingBuffer:
    """A ring buffer over ``buffer`` (ring + 768-byte trailer), safe for producers in many processes."""

    def __init__(self, buffer: memoryview, invalid_record_handler: InvalidRecordHandler | None = None) -> None:
        view = byte_view(buffer)
        self.capacity: int = rd.check_capacity(len(view))
        self.max_msg_length: int = self.capacity // 8
        self.buffer = view
        self._mask = self.capacity - 1
        self._tail_offset = self.capacity + rd.TAIL_POSITION_OFFSET
        self._head_cache_offset = self.capacity + rd.HEAD_CACHE_POSITION_OFFSET
        self._head_offset = self.capacity + rd.HEAD_POSITION_OFFSET
        self._correlation_offset = self.capacity + rd.CORRELATION_COUNTER_OFFSET
        self._heartbeat_offset = self.capacity + rd.CONSUMER_HEARTBEAT_OFFSET
        self.invalid_records = 0
        """Committed records the consumer skipped because their length cannot be true."""
        self.invalid_record_handler = invalid_record_handler
        self._resync_position = -1
        """Where the consumer stopped while walking what a lying record left (it goes on walking there)."""
        native.get_int64_volatile(view, self._tail_offset)  # raises if the buffer is not 8-byte aligned

    # -- producers ------------------------------------------------------------------------------
    def write(self, msg_type_id: int, payload: bytes | bytearray | memoryview) -> bool:
        """Append one message; False when there is not enough free space (retry after the consumer reads)."""
        rd.check_msg_type_id(msg_type_id)
        src = memoryview(payload)
        if src.format != "B" or src.ndim != 1:
            src = src.cast("B")
        length = len(src)
        rd.check_msg_length(length, self.max_msg_length)
        record_length = length + rd.HEADER_LENGTH
        record_offset = self._claim_capacity(rd.align(record_length))
        if record_offset == rd.INSUFFICIENT_CAPACITY:
            return False
        buffer = self.buffer
        rd.record_length_fenced(buffer, record_offset, -record_length)
        rd.MSG_TYPE_ID.pack_into(buffer, record_offset + rd.TYPE_OFFSET, msg_type_id)
        start = record_offset + rd.HEADER_LENGTH
        buffer[start : start + length] = src
        rd.record_length_ordered(buffer, record_offset, record_length)
        return True

    def _claim_capacity(self, required: int) -> int:
        """Claim ``required`` bytes (plus padding to the end of the ring if needed) by CAS on the tail."""
        buffer = self.buffer
        capacity = self.capacity
        head = native.get_int64_volatile(buffer, self._head_cache_offset)
        while True:
            tail = native.get_int64_volatile(buffer, self._tail_offset)
            if required > capacity - (tail - head):
                head = native.get_int64_volatile(buffer, self._head_offset)
                if required > capacity - (tail - head):
                    return rd.INSUFFICIENT_CAPACITY
                native.put_int64_ordered(buffer, self._head_cache_offset, head)
            padding = 0
            tail_index = tail & self._mask
            to_end = capacity - tail_index
            if required > to_end:
                head_index = head & self._mask
                if required > head_index:
                    head = native.get_int64_volatile(buffer, self._head_offset)
                    head_index = head & self._mask
                    if required > head_index:
                        return rd.INSUFFICIENT_CAPACITY
                    native.put_int64_ordered(buffer, self._head_cache_offset, head)
                padding = to_end
            if native.compare_and_set_int64(buffer, self._tail_offset, tail, tail + required + padding):
                break
        if padding:
            rd.record_length_fenced(buffer, tail_index, -padding)
            rd.MSG_TYPE_ID.pack_into(buffer, tail_index + rd.TYPE_OFFSET, rd.PADDING_MSG_TYPE_ID)
            rd.record_length_ordered(buffer, tail_index, padding)
            return 0
        return tail_index

    def next_correlation_id(self) -> int:
        """A number unique across every user of this ring (atomic get-and-add on the trailer counter)."""
        return native.get_and_add_int64(self.buffer, self._correlation_offset, 1)

    # -- the consumer ---------------------------------------------------------------------------
    def read(self, handler: MessageHandler, message_count_limit: int = 64) -> int:
        """Hand up to ``message_count_limit`` messages to ``handler``; returns how many were handed out.

        Reads at most to the end of the ring and to the tail per call. If the handler raises, the
        records already handed out (the failing one included) are still consumed, then the exception
        propagates. A record whose length cannot be true is skipped (see the module docstring).
        """
        buffer = self.buffer
        head = native.get_int64_volatile(buffer, self._head_offset)
        head_index = head & self._mask
        if rd.record_length_volatile(buffer, head_index) == 0:
            return 0  # nothing claimed at the head: the conductor's common cycle, with no state to touch
        to_end = self.capacity - head_index
        limit = self._read_limit(head, to_end)
        resyncing = head == self._resync_position
        bytes_read = 0
        messages_read = 0
        try:
            while bytes_read < limit and messages_read < message_count_limit:
                record_offset = head_index + bytes_read
                record_length = rd.record_length_volatile(buffer, record_offset)
                if record_length == 0:
                    break  # claimed, not yet begun
                aligned_length = rd.align(abs(record_length))
                if aligned_length > limit - bytes_read and limit < to_end:
                    limit = self._read_limit(head, to_end)  # claimed and committed since the tail was read?
                if record_length < 0:
                    if not resyncing or (rd.HEADER_LENGTH <= -record_length and aligned_length <= limit - bytes_read):
                        break  # begun, not yet committed (or its producer died: unblock())
                    bytes_read += rd.ALIGNMENT  # after a lying record, a length no producer could have written
                    continue
                msg_type_id = rd.MSG_TYPE_ID.unpack_from(buffer, record_offset + rd.TYPE_OFFSET)[0]
                if (
                    record_length < rd.HEADER_LENGTH
                    or aligned_length > limit - bytes_read
                    or (
                        msg_type_id != rd.PADDING_MSG_TYPE_ID and record_length - rd.HEADER_LENGTH > self.max_msg_length
                    )
                ):
                    if not resyncing:
                        self._on_invalid_record(record_offset, record_length, msg_type_id)
                        resyncing = True
                    bytes_read += rd.ALIGNMENT
                    continue
                resyncing = False
                bytes_read += aligned_length
                if msg_type_id == rd.PADDING_MSG_TYPE_ID:
                    continue
                messages_read += 1
                message = buffer[record_offset + rd.HEADER_LENGTH : record_offset + record_length]
                try:
                    handler(msg_type_id, message)
                finally:
                    _release(message)
        finally:
            self._resync_position = head + bytes_read if resyncing else -1
            if bytes_read:
                buffer[head_index : head_index + bytes_read] = bytes(bytes_read)
                native.put_int64_ordered(buffer, self._head_offset, head + bytes_read)
        return messages_read

    def _read_limit(self, head: int, to_end: int) -> int:
        """Bytes the consumer may read from ``head``: claimed (below the tail) and before the end of the
        ring; 0 when the tail is not within a lap ahead of the head (moved by someone: ``unblock`` repairs it)."""
        claimed = native.get_int64_volatile(self.buffer, self._tail_offset) - head
        if not 0 < claimed <= self.capacity:
            return 0
        return min(claimed, to_end)

    def _on_invalid_record(self, record_offset: int, length: int, msg_type_id: int) -> None:
        self.invalid_records += 1
        if self.invalid_record_handler is not None:
            self.invalid_record_handler(record_offset, length, msg_type_id)

    def consumer_heartbeat_time(self) -> int:
        """The consumer's last heartbeat, epoch ms (the driver's liveness in a CnC)."""
        return native.get_int64_volatile(self.buffer, self._heartbeat_offset)

    def set_consumer_heartbeat_time(self, epoch_ms: int) -> None:
        native.put_int64_ordered(self.buffer, self._heartbeat_offset, epoch_ms)

    # -- state ------------------------------------------------------------------------------------
    def producer_position(self) -> int:
        return native.get_int64_volatile(self.buffer, self._tail_offset)

    def consumer_position(self) -> int:
        return native.get_int64_volatile(self.buffer, self._head_offset)

    def size(self) -> int:
        """Bytes claimed but not yet consumed (a consistent tail - head snapshot)."""
        buffer = self.buffer
        head_after = native.get_int64_volatile(buffer, self._head_offset)
        while True:
            head_before = head_after
            tail = native.get_int64_volatile(buffer, self._tail_offset)
            head_after = native.get_int64_volatile(buffer, self._head_offset)
            if head_after == head_before:
                return tail - head_after

    def unblock(self) -> bool:
        """Turn a record left uncommitted at the head (its producer died) into padding, or put back a
        tail moved out of place; True if done.

        Call only when the consumer position has not moved for longer than any live producer could
        take to commit (:class:`RingBufferUnblocker`): a slow producer is indistinguishable from a dead one.
        """
        buffer = self.buffer
        head = native.get_int64_volatile(buffer, self._head_offset)
        tail = native.get_int64_volatile(buffer, self._tail_offset)
        if head == tail:
            return False
        if not 0 < tail - head <= self.capacity:  # no producer moves the tail there: start again from the head
            return native.compare_and_set_int64(buffer, self._tail_offset, tail, head)
        consumer_index = head & self._mask
        producer_index = tail & self._mask
        length = rd.record_length_volatile(buffer, consumer_index)
        if length < 0:  # claimed and started, never committed
            end = producer_index if producer_index > consumer_index else self.capacity
            padding = -length if rd.HEADER_LENGTH <= -length <= end - consumer_index else rd.ALIGNMENT
            rd.MSG_TYPE_ID.pack_into(buffer, consumer_index + rd.TYPE_OFFSET, rd.PADDING_MSG_TYPE_ID)
            rd.record_length_ordered(buffer, consumer_index, padding)
            return True
        if length == 0:  # claimed, not even started: pad up to the next record that has begun
            limit = producer_index if producer_index > consumer_index else self.capacity
            i = consumer_index + rd.ALIGNMENT
            while i < limit:
                if native.get_int32_volatile(buffer, i) != 0:
                    if not self._still_zeroed(i, consumer_index):
                        return False
                    break
                i += rd.ALIGNMENT
            # i is the next begun record, or the tail or the end of the ring if every claim up to it is dead
            rd.MSG_TYPE_ID.pack_into(buffer, consumer_index + rd.TYPE_OFFSET, rd.PADDING_MSG_TYPE_ID)
            rd.record_length_ordered(buffer, consumer_index, min(i, limit) - consumer_index)
            return True
        return False

    def _still_zeroed(self, start: int, limit: int) -> bool:
        """Scan back from ``start`` to ``limit``: still no record begun in between?"""
        i = start - rd.ALIGNMENT
        while i >= limit:
            if native.get_int32_volatile(self.buffer, i) != 0:
                return False
            i -= rd.ALIGNMENT
        return True

    def __repr__(self) -> str:
        return (
            f"ManyToOneRingBuffer(capacity={self.capacity}, producer_position={self.producer_position()},"
            f" consumer_position={self.consumer_position()})"
        )


class RingBufferUnblocker:
    """Unblocks a ring whose consumer has been stuck for ``timeout_ns`` with records waiting.

    The consumer side calls :meth:`check` from its duty cycle (the driver conductor, on its timer).
    A stall is timed from when it is first seen, never from the last time the ring moved: a ring idle
    for an hour is not stalled the moment a producer claims.
    """

    def __init__(self, ring: ManyToOneRingBuffer, timeout_ns: int) -> None:
        if timeout_ns <= 0:
            raise ValueError(f"timeout_ns={timeout_ns} must be positive")
        self.ring = ring
        self.timeout_ns = timeout_ns
        self._last_position = ring.consumer_position()
        self._stalled_since_ns: int | None = None

    def check(self, now_ns: int) -> bool:
        """True when a dead claim was padded over (or a tail put back) just now."""
        position = self.ring.consumer_position()
        if position != self._last_position or self.ring.producer_position() == position:
            self._last_position = position
            self._stalled_since_ns = None
            return False
        if self._stalled_since_ns is None:
            self._stalled_since_ns = now_ns
            return False
        if now_ns - self._stalled_since_ns < self.timeout_ns:
            return False
        self._stalled_since_ns = now_ns  # whatever happens, the next attempt is a whole timeout away
        return self.ring.unblock()


def byte_view(buffer: memoryview | bytearray) -> memoryview:
    """``buffer`` itself when it is a flat byte memoryview (so whoever made it can release it and
    unmap), else a flat byte view of it."""
    if isinstance(buffer, memoryview) and buffer.format == "B" and buffer.ndim == 1:
        return buffer
    return memoryview(buffer).cast("B")


def _release(view: memoryview) -> None:
    """Release a view handed to a handler; if the handler exported it further, leave it to the GC."""
    try:
        view.release()
    except BufferError:
        pass
