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
* **Unblock.** A producer that dies between claim and commit leaves a record the consumer can never
  pass (a negative length, or zeroes if it died before even that). ``unblock()`` turns such a record
  into padding. It cannot tell a dead producer from a slow one: call it only when the consumer
  position has not moved for a long time (Aeron: the client liveness timeout).
"""

from __future__ import annotations

from collections.abc import Callable

from logbuf import native
from logbuf.conduit import ring_buffer_descriptor as rd

MessageHandler = Callable[[int, memoryview], None]
"""``handler(msg_type_id, message)``; the view is only valid during the call."""


class ManyToOneRingBuffer:
    """A ring buffer over ``buffer`` (ring + 768-byte trailer), safe for producers in many processes."""

    def __init__(self, buffer: memoryview) -> None:
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

        Reads at most to the end of the ring per call. If the handler raises, the records already
        handed out (the failing one included) are still consumed, then the exception propagates.
        """
        buffer = self.buffer
        head = native.get_int64_volatile(buffer, self._head_offset)
        head_index = head & self._mask
        max_block_length = self.capacity - head_index
        bytes_read = 0
        messages_read = 0
        try:
            while bytes_read < max_block_length and messages_read < message_count_limit:
                record_offset = head_index + bytes_read
                record_length = rd.record_length_volatile(buffer, record_offset)
                if record_length <= 0:
                    break
                bytes_read += rd.align(record_length)
                msg_type_id = rd.MSG_TYPE_ID.unpack_from(buffer, record_offset + rd.TYPE_OFFSET)[0]
                if msg_type_id == rd.PADDING_MSG_TYPE_ID:
                    continue
                messages_read += 1
                message = buffer[record_offset + rd.HEADER_LENGTH : record_offset + record_length]
                try:
                    handler(msg_type_id, message)
                finally:
                    _release(message)
        finally:
            if bytes_read:
                buffer[head_index : head_index + bytes_read] = bytes(bytes_read)
                native.put_int64_ordered(buffer, self._head_offset, head + bytes_read)
        return messages_read

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
        """Turn a record left uncommitted at the head (its producer died) into padding; True if done.

        Call only when the consumer position has not moved for longer than any live producer could
        take to commit: a slow producer is indistinguishable from a dead one.
        """
        buffer = self.buffer
        head = native.get_int64_volatile(buffer, self._head_offset)
        tail = native.get_int64_volatile(buffer, self._tail_offset)
        if head == tail:
            return False
        consumer_index = head & self._mask
        producer_index = tail & self._mask
        length = rd.record_length_volatile(buffer, consumer_index)
        if length < 0:  # claimed and started, never committed
            rd.MSG_TYPE_ID.pack_into(buffer, consumer_index + rd.TYPE_OFFSET, rd.PADDING_MSG_TYPE_ID)
            rd.record_length_ordered(buffer, consumer_index, -length)
            return True
        if length == 0:  # claimed, not even started: pad up to the next record that has begun
            limit = producer_index if producer_index > consumer_index else self.capacity
            i = consumer_index + rd.ALIGNMENT
            while i < limit:
                if native.get_int32_volatile(buffer, i) != 0:
                    if self._still_zeroed(i, consumer_index):
                        rd.MSG_TYPE_ID.pack_into(buffer, consumer_index + rd.TYPE_OFFSET, rd.PADDING_MSG_TYPE_ID)
                        rd.record_length_ordered(buffer, consumer_index, i - consumer_index)
                        return True
                    return False
                i += rd.ALIGNMENT
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
