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

A record, 8-byte aligned (length counts the header)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                         Length (int32)                        |   0
    +---------------------------------------------------------------+
    |                     Message Type Id (int32)                   |   4
    +---------------------------------------------------------------+
    |                        Encoded Message                       ...  8
    +---------------------------------------------------------------+

Type id ``PADDING_MSG_TYPE_ID`` (-1) fills the end of the ring when a record does not fit before
the wrap. A record at ``cursor`` is intact while ``cursor + capacity > tail intent``.
"""

from __future__ import annotations

import struct
from typing import Final

from logbuf import native

# -- record -----------------------------------------------------------------------------------
LENGTH_OFFSET: Final[int] = 0
TYPE_OFFSET: Final[int] = LENGTH_OFFSET + 4
HEADER_LENGTH: Final[int] = TYPE_OFFSET + 4
RECORD_ALIGNMENT: Final[int] = HEADER_LENGTH
PADDING_MSG_TYPE_ID: Final[int] = -1
MAX_MSG_TYPE_ID: Final[int] = (1 << 31) - 1
RECORD_HEADER: Final[struct.Struct] = struct.Struct("<ii")
"""length, msg_type_id."""

# -- trailer ----------------------------------------------------------------------------------
TAIL_INTENT_COUNTER_OFFSET: Final[int] = 0
TAIL_COUNTER_OFFSET: Final[int] = TAIL_INTENT_COUNTER_OFFSET + 8
LATEST_COUNTER_OFFSET: Final[int] = TAIL_COUNTER_OFFSET + 8
TRAILER_LENGTH: Final[int] = 128


def align(value: int, alignment: int = RECORD_ALIGNMENT) -> int:
    return (value + alignment - 1) & ~(alignment - 1)


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


def check_msg_type_id(msg_type_id: int) -> None:
    if not 1 <= msg_type_id <= MAX_MSG_TYPE_ID:
        raise ValueError(
            f"msg_type_id={msg_type_id} must be >= 1 and <= {MAX_MSG_TYPE_ID} (-1 is padding, 0 is reserved)"
        )


def check_msg_length(length: int, max_length: int) -> None:
    if length > max_length:
        raise ValueError(f"message length={length} exceeds max_msg_length={max_length} (capacity / 8)")


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
