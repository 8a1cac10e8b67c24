"""ERROR frame: the receiver tells the sender it rejects the stream (type 0x04, 40 + n bytes).

A receiver sends it instead of status messages once the application has rejected an image;
the sender reports it to its clients as a publication error.

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-------------------------------------------------------------+
    |R|              Frame Length (= 40 + message length)           |   0
    +-+-------------+-------+-+-----+-------------------------------+
    |   Version     | Flags |G|     |          Type (= 0x04)        |   4
    +---------------+-------+-+-----+-------------------------------+
    |                          Session ID                           |   8
    +---------------------------------------------------------------+
    |                          Stream ID                            |  12
    +---------------------------------------------------------------+
    |                          Receiver ID                          |  16
    |                                                               |
    +---------------------------------------------------------------+
    |                 Group Tag (valid when G is set)               |  24
    |                                                               |
    +---------------------------------------------------------------+
    |                          Error Code                           |  32
    +---------------------------------------------------------------+
    |                     Error Message Length                      |  36
    +---------------------------------------------------------------+
    |                  Error Message (ASCII) ...                   ...  40

Flags: G (0x08, HAS_GROUP_TAG) says the group tag field is meaningful. The field is on the
wire either way, so this codec keeps its raw value (``group_tag``) whatever the flag says.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from logbuf.protocol import MalformedFrameError
from logbuf.protocol.frame_header import (
    COMMON_HEADER_LENGTH,
    CURRENT_VERSION,
    HDR_TYPE_ERR,
    Buffer,
    WritableBuffer,
    check_common_header,
    check_frame_length,
    pack_into,
)

NAME: Final[str] = "ERR"

# -- field offsets --------------------------------------------------------------------------
SESSION_ID_FIELD_OFFSET: Final[int] = COMMON_HEADER_LENGTH
STREAM_ID_FIELD_OFFSET: Final[int] = SESSION_ID_FIELD_OFFSET + 4
RECEIVER_ID_FIELD_OFFSET: Final[int] = STREAM_ID_FIELD_OFFSET + 4
GROUP_TAG_FIELD_OFFSET: Final[int] = RECEIVER_ID_FIELD_OFFSET + 8
ERROR_CODE_FIELD_OFFSET: Final[int] = GROUP_TAG_FIELD_OFFSET + 8
ERROR_STRING_LENGTH_FIELD_OFFSET: Final[int] = ERROR_CODE_FIELD_OFFSET + 4
ERROR_STRING_FIELD_OFFSET: Final[int] = ERROR_STRING_LENGTH_FIELD_OFFSET + 4
ERROR_HEADER_LENGTH: Final[int] = ERROR_STRING_FIELD_OFFSET
"""40 bytes: the frame before its message."""

MAX_ERROR_MESSAGE_LENGTH: Final[int] = 1023
MAX_ERROR_FRAME_LENGTH: Final[int] = ERROR_HEADER_LENGTH + MAX_ERROR_MESSAGE_LENGTH

# -- flags ----------------------------------------------------------------------------------
HAS_GROUP_TAG_FLAG: Final[int] = 0x08

# -- error codes this frame carries (Aeron's ErrorCode) -------------------------------------
IMAGE_REJECTED_ERROR_CODE: Final[int] = 13

HEADER: Final[struct.Struct] = struct.Struct("<iBBHiiqqii")
"""frame_length, version, flags, type, session_id, stream_id, receiver_id, group_tag,
error_code, error_string_length."""
assert HEADER.size == ERROR_HEADER_LENGTH


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    """A decoded ERR frame; ``error_message`` is ASCII text of at most 1023 characters."""

    session_id: int
    stream_id: int
    receiver_id: int
    error_code: int
    error_message: str
    group_tag: int = 0
    flags: int = 0

    @property
    def has_group_tag(self) -> bool:
        return bool(self.flags & HAS_GROUP_TAG_FLAG)

    @property
    def frame_length(self) -> int:
        return ERROR_HEADER_LENGTH + len(self.error_message)

    def encode(self) -> bytes:
        buffer = bytearray(self.frame_length)
        self.encode_into(buffer, 0)
        return bytes(buffer)

    def encode_into(self, buffer: WritableBuffer, offset: int) -> int:
        """Write the frame at ``offset``; return the bytes written (40 + message length)."""
        try:
            message = self.error_message.encode("ascii")
        except UnicodeEncodeError:
            raise ValueError(f"cannot encode {self!r}: error_message is not ASCII") from None
        if len(message) > MAX_ERROR_MESSAGE_LENGTH:
            raise ValueError(
                f"cannot encode ERR frame: error_message is {len(message)} bytes, max {MAX_ERROR_MESSAGE_LENGTH}"
            )
        frame_length = ERROR_HEADER_LENGTH + len(message)
        if offset < 0 or len(buffer) - offset < frame_length:
            raise ValueError(f"cannot encode ERR frame: {frame_length} bytes do not fit at offset {offset}")
        pack_into(
            HEADER, buffer, offset, self,
            frame_length, CURRENT_VERSION, self.flags, HDR_TYPE_ERR, self.session_id, self.stream_id,
            self.receiver_id, self.group_tag, self.error_code, len(message),
        )  # fmt: skip
        start = offset + ERROR_STRING_FIELD_OFFSET
        buffer[start : start + len(message)] = message
        return frame_length


def decode(buffer: Buffer, offset: int = 0) -> ErrorFrame:
    """The ERR frame at ``offset``; bytes after ``frame_length`` are not looked at."""
    frame_length, _, _, available = check_common_header(buffer, offset, (HDR_TYPE_ERR,), NAME, ERROR_HEADER_LENGTH)
    check_frame_length(frame_length, available, NAME, ERROR_HEADER_LENGTH)
    (_, _, flags, _, session_id, stream_id, receiver_id, group_tag, error_code,
     length) = HEADER.unpack_from(buffer, offset)  # fmt: skip
    if not 0 <= length <= MAX_ERROR_MESSAGE_LENGTH:
        raise MalformedFrameError(f"ERR frame: error_string_length={length} is not in [0, {MAX_ERROR_MESSAGE_LENGTH}]")
    if frame_length != ERROR_HEADER_LENGTH + length:
        raise MalformedFrameError(
            f"ERR frame: frame_length={frame_length} but error_string_length={length} "
            f"makes {ERROR_HEADER_LENGTH + length}"
        )
    start = offset + ERROR_STRING_FIELD_OFFSET
    try:
        message = bytes(buffer[start : start + length]).decode("ascii")
    except UnicodeDecodeError as exc:
        raise MalformedFrameError(f"ERR frame: error message byte {exc.start} is not ASCII") from None
    return ErrorFrame(session_id, stream_id, receiver_id, error_code, message, group_tag, flags)
