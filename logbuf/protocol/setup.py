"""SETUP frame: the sender announces a stream (type 0x05, 40 bytes).

The sender sends SETUP to a new receiver until the first status message arrives, and again
whenever a status message carries the SEND_SETUP flag. The receiver creates an image from it:
the join position follows from ``active_term_id`` and ``term_offset``.

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-------------------------------------------------------------+
    |R|                 Frame Length (= 40)                         |   0
    +-+-------------+-+-+-----------+-------------------------------+
    |   Version     |R|G|  Flags    |          Type (= 0x05)        |   4
    +---------------+-+-+-----------+-------------------------------+
    |R|                       Term Offset                           |   8
    +-+-------------------------------------------------------------+
    |                          Session ID                           |  12
    +---------------------------------------------------------------+
    |                          Stream ID                            |  16
    +---------------------------------------------------------------+
    |                       Initial Term ID                         |  20
    +---------------------------------------------------------------+
    |                        Active Term ID                         |  24
    +---------------------------------------------------------------+
    |                         Term Length                           |  28
    +---------------------------------------------------------------+
    |                          MTU Length                           |  32
    +---------------------------------------------------------------+
    |                             TTL                               |  36
    +---------------------------------------------------------------+

Flags: R (0x80) asks for a response setup (response channels), G (0x40) marks group semantics.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.protocol import MalformedFrameError
from logbuf.protocol.frame_header import (
    COMMON_HEADER_LENGTH,
    CURRENT_VERSION,
    FRAME_ALIGNMENT,
    HDR_TYPE_SETUP,
    Buffer,
    WritableBuffer,
    check_common_header,
    check_frame_length,
    pack_into,
)

NAME: Final[str] = "SETUP"

# -- field offsets --------------------------------------------------------------------------
TERM_OFFSET_FIELD_OFFSET: Final[int] = COMMON_HEADER_LENGTH
SESSION_ID_FIELD_OFFSET: Final[int] = TERM_OFFSET_FIELD_OFFSET + 4
STREAM_ID_FIELD_OFFSET: Final[int] = SESSION_ID_FIELD_OFFSET + 4
INITIAL_TERM_ID_FIELD_OFFSET: Final[int] = STREAM_ID_FIELD_OFFSET + 4
ACTIVE_TERM_ID_FIELD_OFFSET: Final[int] = INITIAL_TERM_ID_FIELD_OFFSET + 4
TERM_LENGTH_FIELD_OFFSET: Final[int] = ACTIVE_TERM_ID_FIELD_OFFSET + 4
MTU_LENGTH_FIELD_OFFSET: Final[int] = TERM_LENGTH_FIELD_OFFSET + 4
TTL_FIELD_OFFSET: Final[int] = MTU_LENGTH_FIELD_OFFSET + 4
SETUP_HEADER_LENGTH: Final[int] = TTL_FIELD_OFFSET + 4
"""40 bytes; a SETUP frame is its header alone."""

# -- flags ----------------------------------------------------------------------------------
SEND_RESPONSE_SETUP_FLAG: Final[int] = 0x80
GROUP_FLAG: Final[int] = 0x40

HEADER: Final[struct.Struct] = struct.Struct("<iBBHiiiiiiii")
"""frame_length, version, flags, type, term_offset, session_id, stream_id, initial_term_id,
active_term_id, term_length, mtu_length, ttl."""
assert HEADER.size == SETUP_HEADER_LENGTH


@dataclass(frozen=True, slots=True)
class SetupFrame:
    """A decoded SETUP frame. ``frame_length`` is always 40, so it is not a field."""

    term_offset: int
    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_length: int
    mtu_length: int
    ttl: int = 0
    flags: int = 0

    @property
    def frame_length(self) -> int:
        return SETUP_HEADER_LENGTH

    def encode(self) -> bytes:
        buffer = bytearray(SETUP_HEADER_LENGTH)
        self.encode_into(buffer, 0)
        return bytes(buffer)

    def encode_into(self, buffer: WritableBuffer, offset: int) -> int:
        """Write the frame at ``offset``; return the bytes written (40)."""
        pack_into(
            HEADER, buffer, offset, self,
            SETUP_HEADER_LENGTH, CURRENT_VERSION, self.flags, HDR_TYPE_SETUP,
            self.term_offset, self.session_id, self.stream_id, self.initial_term_id,
            self.active_term_id, self.term_length, self.mtu_length, self.ttl,
        )  # fmt: skip
        return SETUP_HEADER_LENGTH


def decode(buffer: Buffer, offset: int = 0) -> SetupFrame:
    """The SETUP frame at ``offset``; bytes after it are not looked at."""
    frame_length, _, _, available = check_common_header(buffer, offset, (HDR_TYPE_SETUP,), NAME, SETUP_HEADER_LENGTH)
    check_frame_length(frame_length, available, NAME, SETUP_HEADER_LENGTH)
    if frame_length != SETUP_HEADER_LENGTH:
        raise MalformedFrameError(f"SETUP frame: frame_length={frame_length}, must be exactly {SETUP_HEADER_LENGTH}")
    (_, _, flags, _, term_offset, session_id, stream_id, initial_term_id, active_term_id,
     term_length, mtu_length, ttl) = HEADER.unpack_from(buffer, offset)  # fmt: skip
    check_values(term_offset, term_length, mtu_length, ttl)
    check_term_ids(initial_term_id, active_term_id)
    return SetupFrame(
        term_offset, session_id, stream_id, initial_term_id, active_term_id, term_length, mtu_length, ttl, flags
    )


def check_values(term_offset: int, term_length: int, mtu_length: int, ttl: int) -> None:
    """The rules a receiver needs before it can build an image from a SETUP."""
    if not lbd.TERM_MIN_LENGTH <= term_length <= lbd.TERM_MAX_LENGTH or term_length & (term_length - 1):
        raise MalformedFrameError(
            f"SETUP frame: term_length={term_length} is not a power of 2 "
            f"between {lbd.TERM_MIN_LENGTH} and {lbd.TERM_MAX_LENGTH}"
        )
    if not 0 <= term_offset < term_length or term_offset % FRAME_ALIGNMENT:
        raise MalformedFrameError(
            f"SETUP frame: term_offset={term_offset} is not a multiple of {FRAME_ALIGNMENT} "
            f"in [0, term_length={term_length})"
        )
    if mtu_length <= dh.HEADER_LENGTH or mtu_length > dh.MAX_UDP_PAYLOAD_LENGTH or mtu_length % FRAME_ALIGNMENT:
        raise MalformedFrameError(
            f"SETUP frame: mtu_length={mtu_length} is not a multiple of {FRAME_ALIGNMENT} "
            f"in ({dh.HEADER_LENGTH}, {dh.MAX_UDP_PAYLOAD_LENGTH}]"
        )
    if ttl < 0:
        raise MalformedFrameError(f"SETUP frame: ttl={ttl} is negative")


def check_term_ids(initial_term_id: int, active_term_id: int) -> None:
    """The active term is the initial term or one after it: ``active - initial``, wrapped as int32 as
    term ids are, is a term count and never negative (a receiver could not place its join position)."""
    term_count = ((active_term_id - initial_term_id + 0x8000_0000) & 0xFFFF_FFFF) - 0x8000_0000
    if term_count < 0:
        raise MalformedFrameError(
            f"SETUP frame: active_term_id={active_term_id} is before initial_term_id={initial_term_id}"
        )
