"""Data frame header: the 32-byte header of every DATA and PAD frame, in the log and on the wire.

Byte-for-byte Aeron transport protocol version 0 (``DataHeaderFlyweight``). All fields are
little-endian. ``frame_length`` holds the *unaligned* length (header + payload); frames start
on 32-byte boundaries, so the next frame is at ``align(frame_length, FRAME_ALIGNMENT)``.

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-------------------------------------------------------------+
    |R|                       Frame Length                          |   0
    +-+-------------+---------------+-------------------------------+
    |   Version     |B|E|S| Flags   |             Type              |   4
    +---------------+---------------+-------------------------------+
    |R|                       Term Offset                           |   8
    +-+-------------------------------------------------------------+
    |                          Session ID                           |  12
    +---------------------------------------------------------------+
    |                          Stream ID                            |  16
    +---------------------------------------------------------------+
    |                           Term ID                             |  20
    +---------------------------------------------------------------+
    |                        Reserved Value                         |  24
    |                                                               |
    +---------------------------------------------------------------+
    |                           Payload                            ...  32

A frame being written has a *negative* ``frame_length`` (written by one release store of the
first 8 bytes); readers treat ``frame_length <= 0`` as "nothing here yet". The commit is a
release store of the positive length (:func:`frame_length_ordered`).

A PAD frame (type 0) has the same header; its ``frame_length`` covers the whole padded region.
A heartbeat is a DATA header alone with ``frame_length == 0``.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Final

from logbuf import native
from logbuf.errors import FrameError as FrameError  # raised here

if TYPE_CHECKING:
    from typing_extensions import Buffer

# -- field offsets --------------------------------------------------------------------------
FRAME_LENGTH_FIELD_OFFSET: Final[int] = 0
VERSION_FIELD_OFFSET: Final[int] = FRAME_LENGTH_FIELD_OFFSET + 4
FLAGS_FIELD_OFFSET: Final[int] = VERSION_FIELD_OFFSET + 1
TYPE_FIELD_OFFSET: Final[int] = FLAGS_FIELD_OFFSET + 1
TERM_OFFSET_FIELD_OFFSET: Final[int] = TYPE_FIELD_OFFSET + 2
SESSION_ID_FIELD_OFFSET: Final[int] = TERM_OFFSET_FIELD_OFFSET + 4
STREAM_ID_FIELD_OFFSET: Final[int] = SESSION_ID_FIELD_OFFSET + 4
TERM_ID_FIELD_OFFSET: Final[int] = STREAM_ID_FIELD_OFFSET + 4
RESERVED_VALUE_FIELD_OFFSET: Final[int] = TERM_ID_FIELD_OFFSET + 4
DATA_OFFSET: Final[int] = RESERVED_VALUE_FIELD_OFFSET + 8

HEADER_LENGTH: Final[int] = DATA_OFFSET
"""Length of a DATA/PAD frame header: 32 bytes."""

MIN_HEADER_LENGTH: Final[int] = TERM_OFFSET_FIELD_OFFSET
"""Length of the common header every frame type starts with: 8 bytes."""

FRAME_ALIGNMENT: Final[int] = 32
"""Every frame starts on a 32-byte boundary of its term."""

CURRENT_VERSION: Final[int] = 0

# -- frame types ----------------------------------------------------------------------------
HDR_TYPE_PAD: Final[int] = 0x00
HDR_TYPE_DATA: Final[int] = 0x01

# -- flags ----------------------------------------------------------------------------------
BEGIN_FLAG: Final[int] = 0x80
END_FLAG: Final[int] = 0x40
EOS_FLAG: Final[int] = 0x20
UNFRAGMENTED: Final[int] = BEGIN_FLAG | END_FLAG
BEGIN_END_AND_EOS_FLAGS: Final[int] = BEGIN_FLAG | END_FLAG | EOS_FLAG

# -- limits ---------------------------------------------------------------------------------
MAX_MESSAGE_LENGTH: Final[int] = 16 * 1024 * 1024
"""Hard cap on one message, fragmented or not (Aeron's ``FrameDescriptor.MAX_MESSAGE_LENGTH``)."""

MAX_UDP_PAYLOAD_LENGTH: Final[int] = 65504
"""Largest MTU: 65535 - 8 (UDP) - 20 (IPv4), rounded down to a multiple of 32."""

DEFAULT_MTU_LENGTH: Final[int] = 1408

HEADER: Final[struct.Struct] = struct.Struct("<iBBHiiiiq")
"""frame_length, version, flags, type, term_offset, session_id, stream_id, term_id, reserved_value."""

assert HEADER.size == HEADER_LENGTH


def align(value: int, alignment: int = FRAME_ALIGNMENT) -> int:
    """Round ``value`` up to a multiple of ``alignment`` (a power of two)."""
    return (value + alignment - 1) & ~(alignment - 1)


def compute_max_message_length(term_length: int) -> int:
    """Largest message a publication on a log with ``term_length`` accepts: min(term/8, 16 MiB)."""
    return min(term_length // 8, MAX_MESSAGE_LENGTH)


def compute_max_payload_length(mtu_length: int) -> int:
    """Largest payload of a single (unfragmented) frame for an MTU."""
    return mtu_length - HEADER_LENGTH


def compute_fragmented_length(length: int, max_payload_length: int) -> int:
    """Space in the term, aligned, taken by a message of ``length`` bytes once fragmented."""
    full, last = divmod(length, max_payload_length)
    total = full * align(max_payload_length + HEADER_LENGTH)
    if last > 0:
        total += align(last + HEADER_LENGTH)
    return total


def check_mtu_length(mtu_length: int, term_length: int | None = None) -> None:
    """An MTU is > 32, <= 65504, a multiple of 32 and (for a term) <= its max message length."""
    if mtu_length <= HEADER_LENGTH:
        raise ValueError(f"mtu_length={mtu_length} must be greater than the {HEADER_LENGTH}-byte header")
    if mtu_length > MAX_UDP_PAYLOAD_LENGTH:
        raise ValueError(f"mtu_length={mtu_length} must be at most {MAX_UDP_PAYLOAD_LENGTH}")
    if mtu_length % FRAME_ALIGNMENT != 0:
        raise ValueError(f"mtu_length={mtu_length} must be a multiple of {FRAME_ALIGNMENT}")
    if term_length is not None and mtu_length > compute_max_message_length(term_length):
        raise ValueError(
            f"mtu_length={mtu_length} must be at most the max message length "
            f"{compute_max_message_length(term_length)} for term_length={term_length}"
        )


def check_frame(buffer: bytes | bytearray | memoryview, *, exact: bool = True) -> None:
    """Validate that ``buffer`` holds one DATA or PAD frame; raise :class:`FrameError` naming the fault.

    With ``exact`` the buffer must be the frame and nothing more (for DATA: frame_length bytes;
    for PAD: the 32-byte header alone is accepted, as PAD goes on the wire header-only).
    """
    n = len(buffer)
    if n < HEADER_LENGTH:
        raise FrameError(f"frame is {n} bytes, shorter than the {HEADER_LENGTH}-byte data header")
    frame_length, version, _flags, type_, term_offset, *_ = HEADER.unpack_from(buffer, 0)
    if version != CURRENT_VERSION:
        raise FrameError(f"version={version}, expected {CURRENT_VERSION}")
    if type_ not in (HDR_TYPE_DATA, HDR_TYPE_PAD):
        raise FrameError(f"type=0x{type_:04x} is not DATA (0x01) or PAD (0x00)")
    if term_offset < 0 or term_offset % FRAME_ALIGNMENT != 0:
        raise FrameError(f"term_offset={term_offset} is not a non-negative multiple of {FRAME_ALIGNMENT}")
    if type_ == HDR_TYPE_DATA:
        if frame_length != 0 and frame_length < HEADER_LENGTH:
            raise FrameError(f"frame_length={frame_length} is shorter than the {HEADER_LENGTH}-byte header")
        wanted = max(frame_length, HEADER_LENGTH)
        if n < wanted:
            raise FrameError(f"frame_length={frame_length} but only {n} bytes are present")
        if exact and n != wanted:
            raise FrameError(f"{n - wanted} trailing bytes after a frame of frame_length={frame_length}")
    else:
        if frame_length < HEADER_LENGTH:
            raise FrameError(f"padding frame_length={frame_length} is shorter than the {HEADER_LENGTH}-byte header")
        if exact and n not in (HEADER_LENGTH, frame_length):
            raise FrameError(f"{n - HEADER_LENGTH} trailing bytes after a padding header")


def frame_length_ordered(buffer: Buffer, frame_offset: int, frame_length: int) -> None:
    """Release-store of a frame's length: commits everything written before it."""
    native.put_int32_ordered(buffer, frame_offset + FRAME_LENGTH_FIELD_OFFSET, frame_length)
