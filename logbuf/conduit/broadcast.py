"""Broadcast: one transmitter, many receivers in any process, loss detected (Agrona's algorithm).

Theory of operation (layout in :mod:`logbuf.conduit.broadcast_descriptor`):

* **Transmit.** The single transmitter announces the tail it is about to reach (*tail intent*, a
  fenced store) before overwriting anything, then writes the record (with a padding record first
  if it does not fit before the wrap), then stores *latest* (where the record starts) and finally
  the *tail* with a release store. It never waits for receivers.
* **Receive.** A receiver keeps its own cursor. When the tail is past it, the record at the cursor
  is read if still intact: ``cursor + capacity > tail intent``. Otherwise the transmitter has
  lapped the receiver: it counts a lap and jumps to *latest*. The message bytes may still be
  overwritten while the receiver looks at them, so a receiver copies them and calls ``validate()``
  afterwards; :class:`CopyBroadcastReceiver` does both.
* **Joining.** A :class:`BroadcastReceiver` starts at *latest*: its first message is the last one
  sent before it was created (if any). A :class:`CopyBroadcastReceiver` skips up to the tail when
  created, so it sees only messages sent afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from logbuf import native
from logbuf.conduit import broadcast_descriptor as bd
from logbuf.conduit.ring_buffer import byte_view
from logbuf.errors import BroadcastLappedError as BroadcastLappedError  # raised here

SCRATCH_BUFFER_LENGTH: Final[int] = 4096


class BroadcastTransmitter:
    """The one writer of a broadcast buffer (not safe for concurrent use)."""

    def __init__(self, buffer: memoryview) -> None:
        view = byte_view(buffer)
        self.capacity: int = bd.check_capacity(len(view))
        self.max_msg_length: int = bd.max_msg_length(self.capacity)
        self.buffer = view
        self._mask = self.capacity - 1
        bd.tail_volatile(view, self.capacity)  # raises if the buffer is not 8-byte aligned

    def transmit(self, msg_type_id: int, payload: bytes | bytearray | memoryview) -> None:
        """Write one message for every receiver; overwrites the oldest messages, never blocks."""
        bd.check_msg_type_id(msg_type_id)
        src = byte_view(payload) if isinstance(payload, memoryview) else payload
        length = len(src)
        bd.check_msg_length(length, self.max_msg_length)
        buffer = self.buffer
        capacity = self.capacity
        current_tail = bd.tail_volatile(buffer, capacity)
        record_offset = current_tail & self._mask
        record_length = bd.HEADER_LENGTH + length
        aligned_length = bd.align(record_length)
        new_tail = current_tail + aligned_length
        to_end = capacity - record_offset
        if to_end < aligned_length:
            bd.tail_intent_fenced(buffer, capacity, new_tail + to_end)
            bd.RECORD_HEADER.pack_into(buffer, record_offset, to_end, bd.PADDING_MSG_TYPE_ID)
            current_tail += to_end
            record_offset = 0
        else:
            bd.tail_intent_fenced(buffer, capacity, new_tail)
        bd.RECORD_HEADER.pack_into(buffer, record_offset, record_length, msg_type_id)
        start = record_offset + bd.HEADER_LENGTH
        buffer[start : start + length] = src
        bd.latest_ordered(buffer, capacity, current_tail)
        bd.tail_ordered(buffer, capacity, current_tail + aligned_length)


class BroadcastReceiver:
    """Follows a broadcast buffer from *latest* on; one per consumer, not safe for concurrent use.

    After :meth:`receive_next` returns True, :attr:`type_id`, :attr:`length` and :attr:`payload`
    describe the message; copy it and check :meth:`validate` before trusting the copy.
    """

    def __init__(self, buffer: memoryview) -> None:
        view = byte_view(buffer)
        self.capacity: int = bd.check_capacity(len(view))
        self.buffer = view
        self._mask = self.capacity - 1
        self._fenced_validate = not view.readonly
        self.lapped_count: int = 0
        """Times the transmitter lapped this receiver (each lap loses at least a buffer's worth)."""
        self._cursor: int = bd.latest_volatile(view, self.capacity)
        self._next_record: int = self._cursor
        self._record_offset: int = self._cursor & self._mask

    def receive_next(self) -> bool:
        """Move to the next message; False if there is none yet."""
        buffer = self.buffer
        capacity = self.capacity
        tail = bd.tail_volatile(buffer, capacity)
        cursor = self._next_record
        if tail <= cursor:
            return False
        record_offset = cursor & self._mask
        if not self._validate(cursor):
            self.lapped_count += 1
            cursor = bd.latest_volatile(buffer, capacity)
            record_offset = cursor & self._mask
        self._cursor = cursor
        length, type_id = bd.RECORD_HEADER.unpack_from(buffer, record_offset)
        self._next_record = cursor + bd.align(length)
        if type_id == bd.PADDING_MSG_TYPE_ID:
            record_offset = 0
            self._cursor = self._next_record
            self._next_record += bd.align(bd.RECORD_HEADER.unpack_from(buffer, 0)[0])
        self._record_offset = record_offset
        return True

    @property
    def type_id(self) -> int:
        return int(bd.RECORD_HEADER.unpack_from(self.buffer, self._record_offset)[1])

    @property
    def length(self) -> int:
        return int(bd.RECORD_HEADER.unpack_from(self.buffer, self._record_offset)[0]) - bd.HEADER_LENGTH

    @property
    def offset(self) -> int:
        """Offset of the current message in :attr:`buffer`."""
        return self._record_offset + bd.HEADER_LENGTH

    @property
    def payload(self) -> memoryview:
        """A view of the current message in the shared buffer (it may be overwritten at any time)."""
        start = self.offset
        length = max(0, min(self.length, self.capacity - start))
        return self.buffer[start : start + length]

    def validate(self) -> bool:
        """Is the current message still intact (not overwritten since :meth:`receive_next`)?"""
        return self._validate(self._cursor)

    def _replay_current(self) -> None:
        """Make the next :meth:`receive_next` return the current message again."""
        self._next_record = self._cursor

    def _rejoin_at_latest(self) -> None:
        """Count a lap and make the next :meth:`receive_next` start from *latest*."""
        self.lapped_count += 1
        self._next_record = bd.latest_volatile(self.buffer, self.capacity)

    def _validate(self, cursor: int) -> bool:
        if self._fenced_validate:
            tail_intent = bd.tail_intent_after_loads(self.buffer, self.capacity)
        else:  # a read-only mapping cannot use the read-modify-write barrier
            tail_intent = native.get_int64_volatile(self.buffer, self.capacity + bd.TAIL_INTENT_COUNTER_OFFSET)
        return cursor + self.capacity > tail_intent


class CopyBroadcastReceiver:
    """Receives whole copies of messages, checked for overwrites, one at a time.

    On creation it skips to the tail: only messages sent afterwards are received. Being lapped
    (before or while copying) counts in :attr:`lapped_count` and re-joins at *latest*, the last
    message sent. As in Agrona it then raises :class:`BroadcastLappedError` (``raise_on_lap=True``);
    the next :meth:`receive` carries on from *latest*. With ``raise_on_lap=False`` the loss is only
    counted.
    """

    def __init__(
        self, buffer: memoryview, scratch_length: int = SCRATCH_BUFFER_LENGTH, *, raise_on_lap: bool = True
    ) -> None:
        if scratch_length <= 0:
            raise ValueError(f"scratch_length={scratch_length} must be positive")
        self.receiver = BroadcastReceiver(buffer)
        self.scratch_length = scratch_length
        self.raise_on_lap = raise_on_lap
        while self.receiver.receive_next():
            pass

    @property
    def lapped_count(self) -> int:
        return self.receiver.lapped_count

    def receive(self, handler: Callable[[int, bytes], None]) -> int:
        """Hand the next message (a copy) to ``handler(msg_type_id, payload)``; returns 0 or 1."""
        receiver = self.receiver
        last_seen_lapped_count = receiver.lapped_count
        if not receiver.receive_next():
            return 0
        if receiver.lapped_count != last_seen_lapped_count and self.raise_on_lap:
            receiver._replay_current()  # re-joined at latest: deliver that message on the next call
            raise BroadcastLappedError(
                f"unable to keep up with broadcast buffer: lapped (lapped_count={receiver.lapped_count})"
            )
        length = receiver.length
        msg_type_id = receiver.type_id
        if not 0 <= length <= self.scratch_length:
            if not receiver.validate():  # a header torn by an overwrite
                return self._overwritten()
            raise ValueError(f"message length={length} exceeds scratch_length={self.scratch_length}")
        start = receiver.offset
        payload = bytes(receiver.buffer[start : start + length])
        if not receiver.validate():
            return self._overwritten()
        handler(msg_type_id, payload)
        return 1

    def _overwritten(self) -> int:
        """The message was overwritten while being read: count a lap, re-join at latest."""
        self.receiver._rejoin_at_latest()
        if self.raise_on_lap:
            raise BroadcastLappedError(
                "unable to keep up with broadcast buffer: message overwritten while being copied"
                f" (lapped_count={self.receiver.lapped_count})"
            )
        return 0
