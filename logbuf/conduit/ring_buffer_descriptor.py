"""Many-to-one ring buffer layout: Agrona's ``RingBufferDescriptor`` and ``RecordDescriptor``.

The CnC's to-driver buffer: many client processes write commands, the driver alone reads them.
A power-of-2 ring of records followed by a 768-byte trailer; every trailer field has two cache
lines to itself so producers (tail), the consumer (head) and the heartbeat never share one::

    +----------------------------+
    |  Ring of records           |  capacity (a power of 2)
    +----------------------------+  <- trailer (offsets from its start)
    |  128 bytes padding         |    0
    |  tail position (int64)     |  128  producers claim space here by CAS
    |  head cache (int64)        |  256  producers' stale copy of head
    |  head position (int64)     |  384  the consumer's position
    |  correlation counter       |  512  next correlation id (get-and-add)
    |  consumer heartbeat (ms)   |  640  the driver's liveness, epoch ms
    +----------------------------+  768 = TRAILER_LENGTH

A record, 8-byte aligned (length counts the header, not the alignment padding)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                         Length (int32)                        |   0
    +---------------------------------------------------------------+
    |                     Message Type Id (int32)                   |   4
    +---------------------------------------------------------------+
    |                        Encoded Message                       ...  8
    +---------------------------------------------------------------+

A length <= 0 means "not committed yet" (a producer writes ``-length`` first and the positive
length last, with a release store). Type id ``PADDING_MSG_TYPE_ID`` (-1) fills the end of the
ring when a record does not fit before the wrap. Positions (head, tail) grow without wrapping;
``position & (capacity - 1)`` is the offset in the ring.
"""

from __future__ import annotations

import struct
from typing import Final

from logbuf import native

CACHE_LINE_LENGTH: Final[int] = 64

# -- record -----------------------------------------------------------------------------------
LENGTH_OFFSET: Final[int] = 0
TYPE_OFFSET: Final[int] = LENGTH_OFFSET + 4
HEADER_LENGTH: Final[int] = TYPE_OFFSET + 4
ALIGNMENT: Final[int] = HEADER_LENGTH
PADDING_MSG_TYPE_ID: Final[int] = -1
MAX_MSG_TYPE_ID: Final[int] = (1 << 31) - 1
RECORD_HEADER: Final[struct.Struct] = struct.Struct("<ii")
"""length, msg_type_id."""
MSG_TYPE_ID: Final[struct.Struct] = struct.Struct("<i")

# -- trailer ----------------------------------------------------------------------------------
TAIL_POSITION_OFFSET: Final[int] = 2 * CACHE_LINE_LENGTH
HEAD_CACHE_POSITION_OFFSET: Final[int] = TAIL_POSITION_OFFSET + 2 * CACHE_LINE_LENGTH
HEAD_POSITION_OFFSET: Final[int] = HEAD_CACHE_POSITION_OFFSET + 2 * CACHE_LINE_LENGTH
CORRELATION_COUNTER_OFFSET: Final[int] = HEAD_POSITION_OFFSET + 2 * CACHE_LINE_LENGTH
CONSUMER_HEARTBEAT_OFFSET: Final[int] = CORRELATION_COUNTER_OFFSET + 2 * CACHE_LINE_LENGTH
TRAILER_LENGTH: Final[int] = CONSUMER_HEARTBEAT_OFFSET + 2 * CACHE_LINE_LENGTH

assert (TAIL_POSITION_OFFSET, HEAD_POSITION_OFFSET, CONSUMER_HEARTBEAT_OFFSET, TRAILER_LENGTH) == (128, 384, 640, 768)

INSUFFICIENT_CAPACITY: Final[int] = -2
"""Returned by the claim step when the record does not fit."""


def align(value: int, alignment: int = ALIGNMENT) -> int:
    return (value + alignment - 1) & ~(alignment - 1)


def check_capacity(buffer_length: int) -> int:
    """The ring's capacity (``buffer_length - TRAILER_LENGTH``), which must be a power of 2 >= 8."""
    capacity = buffer_length - TRAILER_LENGTH
    if capacity < ALIGNMENT or capacity & (capacity - 1):
        raise ValueError(
            f"ring buffer capacity={capacity} (buffer length {buffer_length} - {TRAILER_LENGTH}-byte trailer)"
            f" must be a power of 2 >= {ALIGNMENT}"
        )
    return capacity


def check_msg_type_id(msg_type_id: int) -> None:
    if not 1 <= msg_type_id <= MAX_MSG_TYPE_ID:
        raise ValueError(
            f"msg_type_id={msg_type_id} must be >= 1 and <= {MAX_MSG_TYPE_ID} (-1 is padding, 0 is reserved)"
        )


def check_msg_length(length: int, max_msg_length: int) -> None:
    if length > max_msg_length:
        raise ValueError(f"message length={length} exceeds max_msg_length={max_msg_length} (capacity / 8)")


# -- ordered access (every cross-process read or write whose ordering matters) ---------------------
def record_length_volatile(buffer: memoryview, record_offset: int) -> int:
    return native.get_int32_volatile(buffer, record_offset + LENGTH_OFFSET)


def record_length_ordered(buffer: memoryview, record_offset: int, length: int) -> None:
    """Release-store of a record length: everything written before it is visible first."""
    native.put_int32_ordered(buffer, record_offset + LENGTH_OFFSET, length)


def record_length_fenced(buffer: memoryview, record_offset: int, length: int) -> None:
    """Store a (negative, uncommitted) length so that it is visible before any later store.

    Agrona writes ``putIntOrdered`` then ``storeFence``. ``logbuf.native`` has no standalone fence, so the
    store is followed by an atomic add of 0 to the same field: a sequentially consistent read-modify-
    write, which no later load or store may overtake (``lock xadd`` on x86; on ARMv8 the release
    store and the acquire read of the RMW are not reordered either).
    """
    offset = record_offset + LENGTH_OFFSET
    native.put_int32_ordered(buffer, offset, length)
    native.get_and_add_int32(buffer, offset, 0)
