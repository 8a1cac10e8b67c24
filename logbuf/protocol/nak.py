"""NAK: the receiver asks the sender to retransmit a gap (type 0x02, 28 bytes).

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-------------------------------------------------------------+
    |R|                 Frame Length (= 28)                         |   0
    +-+-------------+---------------+-------------------------------+
    |   Version     |  Flags (= 0)  |          Type (= 0x02)        |   4
    +---------------+---------------+-------------------------------+
    |                          Session ID                           |   8
    +---------------------------------------------------------------+
    |                          Stream ID                            |  12
    +---------------------------------------------------------------+
    |                           Term ID                             |  16
    +---------------------------------------------------------------+
    |R|                       Term Offset                           |  20
    +-+-------------------------------------------------------------+
    |                            Length                             |  24
    +---------------------------------------------------------------+

``term_offset`` is where the gap starts (a frame boundary, so a multiple of 32); ``length`` is
the gap in bytes. No flags are defined.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from logbuf.protocol import MalformedFrameError
from logbuf.protocol.frame_header import (
    COMMON_HEADER_LENGTH,
    CURRENT_VERSION,
    FRAME_ALIGNMENT,
    HDR_TYPE_NAK,
    Buffer,
    WritableBuffer,
    check_common_header,
    check_frame_length,
    pack_into,
)

NAME: Final[str] = "NAK"

# -- field offsets --------------------------------------------------------------------------
SESSION_ID_FIELD_OFFSET: Final[int] = COMMON_HEADER_LENGTH
STREAM_ID_FIELD_OFFSET: Final[int] = SESSION_ID_FIELD_OFFSET + 4
TERM_ID_FIELD_OFFSET: Final[int] = STREAM_ID_FIELD_OFFSET + 4
TERM_OFFSET_FIELD_OFFSET: Final[int] = TERM_ID_FIELD_OFFSET + 4
LENGTH_FIELD_OFFSET: Final[int] = TERM_OFFSET_FIELD_OFFSET + 4
NAK_HEADER_LENGTH: Final[int] = LENGTH_FIELD_OFFSET + 4
"""28 bytes; a NAK is its header alone."""

HEADER: Final[struct.Struct] = struct.Struct("<iBBHiiiii")
"""frame_length, version, flags, type, session_id, stream_id, term_id, term_offset, length."""
assert HEADER.size == NAK_HEADER_LENGTH


@dataclass(frozen=True, slots=True)
class NakFrame:
    """A decoded NAK: retransmit ``length`` bytes of ``term_id`` from ``term_offset``."""

    session_id: int
    stream_id: int
    term_id: int
    term_offset: int
    length: int
    flags: int = 0

    @property
    def frame_length(self) -> int:
        return NAK_HEADER_LENGTH

    def encode(self) -> bytes:
        buffer = bytearray(NAK_HEADER_LENGTH)
        self.encode_into(buffer, 0)
        return bytes(buffer)

    def encode_into(self, buffer: WritableBuffer, offset: int) -> int:
        """Write the frame at ``offset``; return the bytes written (28)."""
        pack_into(
            HEADER, buffer, offset, self,
            NAK_HEADER_LENGTH, CURRENT_VERSION, self.flags, HDR_TYPE_NAK,
            self.session_id, self.stream_id, self.term_id, self.term_offset, self.length,
        )  # fmt: skip
        return NAK_HEADER_LENGTH


def decode(buffer: Buffer, offset: int = 0) -> NakFrame:
    """The NAK at ``offset``; bytes after it are not looked at."""
    frame_length, _, _, available = check_common_header(buffer, offset, (HDR_TYPE_NAK,), NAME, NAK_HEADER_LENGTH)
    check_frame_length(frame_length, available, NAME, NAK_HEADER_LENGTH)
    if frame_length != NAK_HEADER_LENGTH:
        raise MalformedFrameError(f"NAK frame: frame_length={frame_length}, must be exactly {NAK_HEADER_LENGTH}")
    _, _, flags, _, session_id, stream_id, term_id, term_offset, length = HEADER.unpack_from(buffer, offset)
    if term_offset < 0 or term_offset % FRAME_ALIGNMENT:
        raise MalformedFrameError(
            f"NAK frame: term_offset={term_offset} is not a non-negative multiple of {FRAME_ALIGNMENT}"
        )
    if length <= 0 or length % FRAME_ALIGNMENT:
        raise MalformedFrameError(f"NAK frame: length={length} is not a positive multiple of {FRAME_ALIGNMENT}")
    return NakFrame(session_id, stream_id, term_id, term_offset, length, flags)
