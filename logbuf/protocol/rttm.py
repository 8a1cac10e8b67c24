"""RTT MEASUREMENT (RTTM): round-trip-time probe and its echo (type 0x06, 40 bytes).

The receiver sends an RTTM with the REPLY flag and its clock in ``echo_timestamp_ns``; the
sender answers at once with flags 0, the same timestamp and receiver id. The receiver's RTT is
``now - echo_timestamp_ns - reception_delta_ns``.

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-------------------------------------------------------------+
    |R|                 Frame Length (= 40)                         |   0
    +-+-------------+-+-------------+-------------------------------+
    |   Version     |R|   Flags     |          Type (= 0x06)        |   4
    +---------------+-+-------------+-------------------------------+
    |                          Session ID                           |   8
    +---------------------------------------------------------------+
    |                          Stream ID                            |  12
    +---------------------------------------------------------------+
    |                       Echo Timestamp (ns)                     |  16
    |                                                               |
    +---------------------------------------------------------------+
    |                       Reception Delta (ns)                    |  24
    |                                                               |
    +---------------------------------------------------------------+
    |                          Receiver ID                          |  32
    |                                                               |
    +---------------------------------------------------------------+

Flags: R (0x80, REPLY) on the receiver's probe; 0 on the sender's answer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from logbuf.protocol import MalformedFrameError
from logbuf.protocol.frame_header import (
    COMMON_HEADER_LENGTH,
    CURRENT_VERSION,
    HDR_TYPE_RTTM,
    Buffer,
    WritableBuffer,
    check_common_header,
    check_frame_length,
    pack_into,
)

NAME: Final[str] = "RTTM"

# -- field offsets --------------------------------------------------------------------------
SESSION_ID_FIELD_OFFSET: Final[int] = COMMON_HEADER_LENGTH
STREAM_ID_FIELD_OFFSET: Final[int] = SESSION_ID_FIELD_OFFSET + 4
ECHO_TIMESTAMP_FIELD_OFFSET: Final[int] = STREAM_ID_FIELD_OFFSET + 4
RECEPTION_DELTA_FIELD_OFFSET: Final[int] = ECHO_TIMESTAMP_FIELD_OFFSET + 8
RECEIVER_ID_FIELD_OFFSET: Final[int] = RECEPTION_DELTA_FIELD_OFFSET + 8
RTTM_HEADER_LENGTH: Final[int] = RECEIVER_ID_FIELD_OFFSET + 8
"""40 bytes; an RTTM is its header alone."""

# -- flags ----------------------------------------------------------------------------------
REPLY_FLAG: Final[int] = 0x80

HEADER: Final[struct.Struct] = struct.Struct("<iBBHiiqqq")
"""frame_length, version, flags, type, session_id, stream_id, echo_timestamp, reception_delta, receiver_id."""
assert HEADER.size == RTTM_HEADER_LENGTH


@dataclass(frozen=True, slots=True)
class RttMeasurementFrame:
    """A decoded RTTM. ``is_reply_requested`` on the receiver's probe."""

    session_id: int
    stream_id: int
    echo_timestamp_ns: int
    reception_delta_ns: int
    receiver_id: int
    flags: int = 0

    @property
    def is_reply_requested(self) -> bool:
        return bool(self.flags & REPLY_FLAG)

    @property
    def frame_length(self) -> int:
        return RTTM_HEADER_LENGTH

    def encode(self) -> bytes:
        buffer = bytearray(RTTM_HEADER_LENGTH)
        self.encode_into(buffer, 0)
        return bytes(buffer)

    def encode_into(self, buffer: WritableBuffer, offset: int) -> int:
        """Write the frame at ``offset``; return the bytes written (40)."""
        pack_into(
            HEADER, buffer, offset, self,
            RTTM_HEADER_LENGTH, CURRENT_VERSION, self.flags, HDR_TYPE_RTTM, self.session_id,
            self.stream_id, self.echo_timestamp_ns, self.reception_delta_ns, self.receiver_id,
        )  # fmt: skip
        return RTTM_HEADER_LENGTH


def decode(buffer: Buffer, offset: int = 0) -> RttMeasurementFrame:
    """The RTTM at ``offset``; bytes after it are not looked at."""
    frame_length, _, _, available = check_common_header(buffer, offset, (HDR_TYPE_RTTM,), NAME, RTTM_HEADER_LENGTH)
    check_frame_length(frame_length, available, NAME, RTTM_HEADER_LENGTH)
    if frame_length != RTTM_HEADER_LENGTH:
        raise MalformedFrameError(f"RTTM frame: frame_length={frame_length}, must be exactly {RTTM_HEADER_LENGTH}")
    _, _, flags, _, session_id, stream_id, echo_ns, delta_ns, receiver_id = HEADER.unpack_from(buffer, offset)
    if delta_ns < 0:
        raise MalformedFrameError(f"RTTM frame: reception_delta={delta_ns} is negative")
    return RttMeasurementFrame(session_id, stream_id, echo_ns, delta_ns, receiver_id, flags)
