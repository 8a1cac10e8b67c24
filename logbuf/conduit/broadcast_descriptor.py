"""Broadcast buffer layout: Agrona's ``BroadcastBufferDescriptor`` and broadcast ``RecordDescriptor``.

The CnC's to-clients buffer: one transmitter (the driver) overwrites a power-of-2 ring, any number
of receivers follow it and detect when they have been lapped. A 128-byte trailer follows the ring::

    +----------------------------+
    |  Ring of records           |  capacity (a power of 2)
    +----------------------------+  <- trailer (offsets from its start)
    |  tail intent (int64)       |    0  where the tail will be once the current record is written
    |  tail (int64)              |    8  end of the last complete record
    |  latest (int64)            |   16  start of the last complete record (where receivers join)
    |  104 bytes padding         |   24
    +----------------------------+  128 = TRAILER_LENGTH

A record is the to-driver ring buffer's (:mod:`logbuf.conduit.ring_buffer_descriptor` draws it: an
int32 length that counts the 8-byte header, an int32 message type id, the message; 8-byte aligned); its
offsets, alignment and checks are imported from there. Type id ``PADDING_MSG_TYPE_ID`` (-1) fills the
end of the ring when a record does not fit before the wrap. A record at ``cursor`` is intact while ``cursor + capacity > tail intent``.
"""

from __future__ import annotations

from typing import Final

from logbuf import native
from logbuf.conduit.ring_buffer_descriptor import ALIGNMENT
from logbuf.conduit.ring_buffer_descriptor import HEADER_LENGTH as HEADER_LENGTH
from logbuf.conduit.ring_buffer_descriptor import LENGTH_OFFSET as LENGTH_OFFSET
from logbuf.conduit.ring_buffer_descriptor import MAX_MSG_TYPE_ID as MAX_MSG_TYPE_ID
from logbuf.conduit.ring_buffer_descriptor import PADDING_MSG_TYPE_ID as PADDING_MSG_TYPE_ID
from logbuf.conduit.ring_buffer_descriptor import RECORD_HEADER as RECORD_HEADER
from logbuf.conduit.ring_buffer_descriptor import TYPE_OFFSET as TYPE_OFFSET
from logbuf.conduit.ring_buffer_descriptor import align as align
from logbuf.conduit.ring_buffer_descriptor import check_msg_length as check_msg_length
from logbuf.conduit.ring_buffer_descriptor import check_msg_type_id as check_msg_type_id

# -- record (the ring buffer's) ----------------------------------------------------------------
RECORD_ALIGNMENT: Final[int] = ALIGNMENT

# -- trailer ----------------------------------------------------------------------------------
TAIL_INTENT_COUNTER_OFFSET: Final[int] = 0
TAIL_COUNTER_OFFSET: Final[int] = TAIL_INTENT_COUNTER_OFFSET + 8
LATEST_COUNTER_OFFSET: Final[int] = TAIL_COUNTER_OFFSET + 8
TRAILER_LENGTH: Final[int] = 128


def check_capacity(buffer_length: int) -> int:
    """The ring's capacity (``buffer_length - TRAILER_LENGTH``), which must be a power of 2 >= 8."""
    capacity = buffer_length - TRAILER_LENGTH
    if capacity < RECORD_ALIGNMENT or capacity & (capacity - 1):
        raise ValueError(
            f"broadcast buffer capacity={capacity} (buffer length {buffer_length} - {TRAILER_LENGTH}-byte trailer)"
            f" must be a power of 2 >= {RECORD_ALIGNMENT}"
        )
    return capacity


def max_msg_length(capacity: int) -> int:
    return capacity // 8


# -- ordered access ----------------------------------------------------------------------------------
def tail_intent_fenced(buffer: memoryview, capacity: int, value: int) -> None:
    """Announce the tail about to be reached, visible before any record byte is overwritten.

    Agrona: plain store + ``storeFence``. ``logbuf.native`` has no standalone fence: a release store
    followed by an atomic add of 0 (a sequentially consistent read-modify-write) stands in for it.
    """
    offset = capacity + TAIL_INTENT_COUNTER_OFFSET
    native.put_int64_ordered(buffer, offset, value)
    native.get_and_add_int64(buffer, offset, 0)


def tail_intent_after_loads(buffer: memoryview, capacity: int) -> int:
    """Read the tail intent after all earlier loads (of a record being copied) have completed.

    Agrona: ``acquireFence`` then a volatile load. An acquire load alone would let earlier loads
    drift after it; an atomic add of 0 is a full barrier that returns the current value.
    """
    return native.get_and_add_int64(buffer, capacity + TAIL_INTENT_COUNTER_OFFSET, 0)


def tail_volatile(buffer: memoryview, capacity: int) -> int:
    return native.get_int64_volatile(buffer, capacity + TAIL_COUNTER_OFFSET)


def tail_ordered(buffer: memoryview, capacity: int, value: int) -> None:
    """Publish a complete record: everything written before is visible first."""
    native.put_int64_ordered(buffer, capacity + TAIL_COUNTER_OFFSET, value)


def latest_ordered(buffer: memoryview, capacity: int, value: int) -> None:
    """Store where the newest record starts (single 8-byte store: receivers never see it torn)."""
    native.put_int64_ordered(buffer, capacity + LATEST_COUNTER_OFFSET, value)


def latest_volatile(buffer: memoryview, capacity: int) -> int:
    return native.get_int64_volatile(buffer, capacity + LATEST_COUNTER_OFFSET)
