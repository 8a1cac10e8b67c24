"""STATUS MESSAGE (SM): the receiver's position and window, sent to the sender (type 0x03).

36 bytes, or 44 when the receiver has a group tag configured. The sender's flow control turns
the consumption position plus ``receiver_window_length`` into how far it may send.

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-------------------------------------------------------------+
    |R|              Frame Length (= 36 or 44)                      |   0
    +-+-------------+-+-+-----------+-------------------------------+
    |   Version     |S|E|  Flags    |          Type (= 0x03)        |   4
    +---------------+-+-+-----------+-------------------------------+
    |                          Session ID                           |   8
    +---------------------------------------------------------------+
    |                          Stream ID                            |  12
    +---------------------------------------------------------------+
    |                     Consumption Term ID                       |  16
    +---------------------------------------------------------------+
    |R|                 Consumption Term Offset                     |  20
    +-+-------------------------------------------------------------+
    |                        Receiver Window                        |  24
    +---------------------------------------------------------------+
    |                          Receiver ID                          |  28
    |                    (int64, not 8-byte aligned)                |
    +---------------------------------------------------------------+
    |                   Group Tag (optional, int64)                 |  36
    |                                                               |
    +---------------------------------------------------------------+

Flags: S (0x80, SEND_SETUP) asks the sender for a SETUP; E (0x40) says the receiver is leaving.
A *setup-eliciting* SM is one with S set and term id, term offset and window all 0: a receiver
sends it when DATA arrives for a session it has no image for.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from logbuf.protocol import MalformedFrameError
from logbuf.protocol.frame_header import (
    COMMON_HEADER_LENGTH,
    CURRENT_VERSION,
    HDR_TYPE_SM,
    Buffer,
    WritableBuffer,
    check_common_header,
    check_frame_length,
    pack_into,
)

NAME: Final[str] = "SM"

# -- field offsets --------------------------------------------------------------------------
SESSION_ID_FIELD_OFFSET: Final[int] = COMMON_HEADER_LENGTH
STREAM_ID_FIELD_OFFSET: Final[int] = SESSION_ID_FIELD_OFFSET + 4
CONSUMPTION_TERM_ID_FIELD_OFFSET: Final[int] = STREAM_ID_FIELD_OFFSET + 4
CONSUMPTION_TERM_OFFSET_FIELD_OFFSET: Final[int] = CONSUMPTION_TERM_ID_FIELD_OFFSET + 4
RECEIVER_WINDOW_FIELD_OFFSET: Final[int] = CONSUMPTION_TERM_OFFSET_FIELD_OFFSET + 4
RECEIVER_ID_FIELD_OFFSET: Final[int] = RECEIVER_WINDOW_FIELD_OFFSET + 4
GROUP_TAG_FIELD_OFFSET: Final[int] = RECEIVER_ID_FIELD_OFFSET + 8
STATUS_MESSAGE_HEADER_LENGTH: Final[int] = GROUP_TAG_FIELD_OFFSET
"""36 bytes: an SM without a group tag."""
GROUP_TAG_LENGTH: Final[int] = 8
STATUS_MESSAGE_WITH_GROUP_TAG_LENGTH: Final[int] = GROUP_TAG_FIELD_OFFSET + GROUP_TAG_LENGTH
"""44 bytes: an SM with a group tag. Aeron accepts no other length."""

# -- flags ----------------------------------------------------------------------------------
SEND_SETUP_FLAG: Final[int] = 0x80
END_OF_STREAM_FLAG: Final[int] = 0x40

HEADER: Final[struct.Struct] = struct.Struct("<iBBHiiiiiq")
"""frame_length, version, flags, type, session_id, stream_id, consumption_term_id,
consumption_term_offset, receiver_window, receiver_id."""
GROUP_TAG: Final[struct.Struct] = struct.Struct("<q")
assert HEADER.size == STATUS_MESSAGE_HEADER_LENGTH


class StatusMessageFrame(NamedTuple):
    """A decoded SM. ``group_tag`` is None when the frame is 36 bytes long.

    A named tuple, not a frozen dataclass like the other frames: a sender decodes one SM per receiver
    every few hundred microseconds, and a frozen dataclass costs five times as much to build."""

    session_id: int
    stream_id: int
    consumption_term_id: int
    consumption_term_offset: int
    receiver_window_length: int
    receiver_id: int
    group_tag: int | None = None
    flags: int = 0

    @classmethod
    def setup_eliciting(
        cls, session_id: int, stream_id: int, receiver_id: int, group_tag: int | None = None
    ) -> StatusMessageFrame:
        """The SM a receiver sends to ask an unknown sender for a SETUP."""
        return cls(session_id, stream_id, 0, 0, 0, receiver_id, group_tag, SEND_SETUP_FLAG)

    @property
    def elicits_setup(self) -> bool:
        """The receiver asks for a SETUP (SEND_SETUP flag)."""
        return bool(self.flags & SEND_SETUP_FLAG)

    @property
    def is_end_of_stream(self) -> bool:
        return bool(self.flags & END_OF_STREAM_FLAG)

    @property
    def frame_length(self) -> int:
        return STATUS_MESSAGE_HEADER_LENGTH if self.group_tag is None else STATUS_MESSAGE_WITH_GROUP_TAG_LENGTH

    def encode(self) -> bytes:
        buffer = bytearray(self.frame_length)
        self.encode_into(buffer, 0)
        return bytes(buffer)

    def encode_into(self, buffer: WritableBuffer, offset: int) -> int:
        """Write the frame at ``offset``; return the bytes written (36 or 44)."""
        frame_length = self.frame_length
        pack_into(
            HEADER, buffer, offset, self,
            frame_length, CURRENT_VERSION, self.flags, HDR_TYPE_SM, self.session_id, self.stream_id,
            self.consumption_term_id, self.consumption_term_offset, self.receiver_window_length,
            self.receiver_id,
        )  # fmt: skip
        if self.group_tag is not None:
            pack_into(GROUP_TAG, buffer, offset + GROUP_TAG_FIELD_OFFSET, self, self.group_tag)
        return frame_length


def decode(buffer: Buffer, offset: int = 0) -> StatusMessageFrame:
    """The SM at ``offset``; bytes after ``frame_length`` are not looked at. A well-formed 36-byte SM
    takes one unpack; anything else goes through the checks that name what is wrong."""
    if offset >= 0 and len(buffer) - offset >= STATUS_MESSAGE_HEADER_LENGTH:
        (frame_length, version, flags, frame_type, session_id, stream_id, term_id, term_offset, window,
         receiver_id) = HEADER.unpack_from(buffer, offset)  # fmt: skip
        if (
            frame_length == STATUS_MESSAGE_HEADER_LENGTH
            and frame_type == HDR_TYPE_SM
            and version == CURRENT_VERSION
            and term_offset >= 0
            and window >= 0
        ):
            return StatusMessageFrame(session_id, stream_id, term_id, term_offset, window, receiver_id, None, flags)
    return _decode_checked(buffer, offset)


def _decode_checked(buffer: Buffer, offset: int) -> StatusMessageFrame:
    frame_length, _, _, available = check_common_header(
        buffer, offset, (HDR_TYPE_SM,), NAME, STATUS_MESSAGE_HEADER_LENGTH
    )
    check_frame_length(frame_length, available, NAME, STATUS_MESSAGE_HEADER_LENGTH)
    if frame_length not in (STATUS_MESSAGE_HEADER_LENGTH, STATUS_MESSAGE_WITH_GROUP_TAG_LENGTH):
        raise MalformedFrameError(
            f"SM frame: frame_length={frame_length}, must be {STATUS_MESSAGE_HEADER_LENGTH}, "
            f"or {STATUS_MESSAGE_WITH_GROUP_TAG_LENGTH} with a group tag"
        )
    (_, _, flags, _, session_id, stream_id, term_id, term_offset, window,
     receiver_id) = HEADER.unpack_from(buffer, offset)  # fmt: skip
    if term_offset < 0:
        raise MalformedFrameError(f"SM frame: consumption_term_offset={term_offset} is negative")
    if window < 0:
        raise MalformedFrameError(f"SM frame: receiver_window={window} is negative")
    group_tag: int | None = None
    if frame_length == STATUS_MESSAGE_WITH_GROUP_TAG_LENGTH:
        (group_tag,) = GROUP_TAG.unpack_from(buffer, offset + GROUP_TAG_FIELD_OFFSET)
    return StatusMessageFrame(session_id, stream_id, term_id, term_offset, window, receiver_id, group_tag, flags)
