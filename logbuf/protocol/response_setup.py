"""RESPONSE SETUP (RSP_SETUP): ties a response stream to its request (type 0x0B, 20 bytes).

Used by response channels (``control-mode=response``, Aeron 1.44+): it tells the other side
which session the responses for this session will use. logbuf has no response channels: it decodes
these only, so that a valid one reaching an endpoint is not counted as an invalid packet.

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-------------------------------------------------------------+
    |R|                 Frame Length (= 20)                         |   0
    +-+-------------+---------------+-------------------------------+
    |   Version     |     Flags     |          Type (= 0x0B)        |   4
    +---------------+---------------+-------------------------------+
    |                          Session ID                           |   8
    +---------------------------------------------------------------+
    |                          Stream ID                            |  12
    +---------------------------------------------------------------+
    |                     Response Session ID                       |  16
    +---------------------------------------------------------------+
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from logbuf.protocol import MalformedFrameError
from logbuf.protocol.frame_header import (
    COMMON_HEADER_LENGTH,
    HDR_TYPE_RSP_SETUP,
    Buffer,
    check_common_header,
    check_frame_length,
)

NAME: Final[str] = "RSP_SETUP"

SESSION_ID_FIELD_OFFSET: Final[int] = COMMON_HEADER_LENGTH
STREAM_ID_FIELD_OFFSET: Final[int] = SESSION_ID_FIELD_OFFSET + 4
RESPONSE_SESSION_ID_FIELD_OFFSET: Final[int] = STREAM_ID_FIELD_OFFSET + 4
RESPONSE_SETUP_HEADER_LENGTH: Final[int] = RESPONSE_SESSION_ID_FIELD_OFFSET + 4
"""20 bytes; an RSP_SETUP is its header alone."""

HEADER: Final[struct.Struct] = struct.Struct("<iBBHiii")
"""frame_length, version, flags, type, session_id, stream_id, response_session_id."""
assert HEADER.size == RESPONSE_SETUP_HEADER_LENGTH


@dataclass(frozen=True, slots=True)
class ResponseSetupFrame:
    session_id: int
    stream_id: int
    response_session_id: int
    flags: int = 0

    @property
    def frame_length(self) -> int:
        return RESPONSE_SETUP_HEADER_LENGTH


def decode(buffer: Buffer, offset: int = 0) -> ResponseSetupFrame:
    """The RSP_SETUP at ``offset``; bytes after it are not looked at."""
    frame_length, _, _, available = check_common_header(
        buffer, offset, (HDR_TYPE_RSP_SETUP,), NAME, RESPONSE_SETUP_HEADER_LENGTH
    )
    check_frame_length(frame_length, available, NAME, RESPONSE_SETUP_HEADER_LENGTH)
    if frame_length != RESPONSE_SETUP_HEADER_LENGTH:
        raise MalformedFrameError(
            f"RSP_SETUP frame: frame_length={frame_length}, must be exactly {RESPONSE_SETUP_HEADER_LENGTH}"
        )
    _, _, flags, _, session_id, stream_id, response_session_id = HEADER.unpack_from(buffer, offset)
    return ResponseSetupFrame(session_id, stream_id, response_session_id, flags)
