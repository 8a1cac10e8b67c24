"""DATA, PAD and heartbeat frames as they travel in datagrams (types 0x01 and 0x00).

The 32-byte header (type DATA 1 or PAD 0, the payload after it) is drawn and laid out in
:mod:`logbuf.logbuffer.data_header_descriptor`, one layout in one module: the log stores frames exactly
as they are sent. This module adds the wire view: a frozen dataclass per kind of frame, and the rules
for a datagram of them.

Datagram rules (what an Aeron sender produces, and what :func:`decode_datagram` accepts):

- A **DATA datagram** holds one or more consecutive frames of one term: same session, stream and
  term id, each frame starting where the previous one's *aligned* length ends. Every frame is
  padded with zeros to a multiple of 32, so the datagram is the sum of aligned lengths (the
  last frame's padding may be missing; we accept that, we always send it).
- A **PAD frame** goes on the wire as its 32-byte header alone, while its ``frame_length`` keeps
  the full padded length; it always ends its datagram.
- A **heartbeat** is a DATA header with ``frame_length`` 0, alone in a 32-byte datagram.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import MalformedFrameError
from logbuf.protocol.frame_header import Buffer, WritableBuffer, check_common_header, check_frame_length, pack_into

NAME: Final[str] = "DATA"
HEADER_LENGTH: Final[int] = dh.HEADER_LENGTH
HEARTBEAT_LENGTH: Final[int] = dh.HEADER_LENGTH
"""A heartbeat datagram is exactly one 32-byte header."""
PAD_WIRE_LENGTH: Final[int] = dh.HEADER_LENGTH
"""A PAD frame occupies 32 bytes of its datagram, whatever its ``frame_length``."""


@dataclass(frozen=True, slots=True)
class DataFrame:
    """A DATA frame: one message or fragment. ``frame_length`` is 32 + payload length."""

    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    payload: bytes = b""
    reserved_value: int = 0
    flags: int = dh.UNFRAGMENTED

    @property
    def frame_length(self) -> int:
        return dh.HEADER_LENGTH + len(self.payload)

    @property
    def encoded_length(self) -> int:
        """Bytes the frame takes in a datagram: ``frame_length`` aligned to 32."""
        return dh.align(self.frame_length)

    def encode(self) -> bytes:
        buffer = bytearray(self.encoded_length)
        self.encode_into(buffer, 0)
        return bytes(buffer)

    def encode_into(self, buffer: WritableBuffer, offset: int) -> int:
        """Write header, payload and zero padding at ``offset``; return the aligned length."""
        length = self.encoded_length
        if offset < 0 or len(buffer) - offset < length:
            raise ValueError(f"cannot encode DATA frame: {length} bytes do not fit at offset {offset}")
        pack_into(
            dh.HEADER, buffer, offset, self,
            self.frame_length, dh.CURRENT_VERSION, self.flags, dh.HDR_TYPE_DATA, self.term_offset,
            self.session_id, self.stream_id, self.term_id, self.reserved_value,
        )  # fmt: skip
        start, end = offset + dh.HEADER_LENGTH, offset + length
        buffer[start:end] = self.payload + bytes(end - start - len(self.payload))
        return length


@dataclass(frozen=True, slots=True)
class HeartbeatFrame:
    """A heartbeat: a DATA header with ``frame_length`` 0 at the sender's current position."""

    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    reserved_value: int = 0
    flags: int = dh.UNFRAGMENTED

    @property
    def frame_length(self) -> int:
        return 0

    @property
    def is_end_of_stream(self) -> bool:
        """Aeron counts only flags == 0xE0 (B, E and S together) as end of stream."""
        return self.flags == dh.BEGIN_END_AND_EOS_FLAGS

    def encode(self) -> bytes:
        buffer = bytearray(HEARTBEAT_LENGTH)
        self.encode_into(buffer, 0)
        return bytes(buffer)

    def encode_into(self, buffer: WritableBuffer, offset: int) -> int:
        """Write the 32-byte heartbeat at ``offset``; return 32."""
        pack_into(
            dh.HEADER, buffer, offset, self,
            0, dh.CURRENT_VERSION, self.flags, dh.HDR_TYPE_DATA, self.term_offset,
            self.session_id, self.stream_id, self.term_id, self.reserved_value,
        )  # fmt: skip
        return HEARTBEAT_LENGTH


@dataclass(frozen=True, slots=True)
class PadFrame:
    """A PAD frame: ``frame_length`` bytes of the term that readers skip; 32 bytes on the wire."""

    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    frame_length: int
    reserved_value: int = 0
    flags: int = dh.UNFRAGMENTED

    def encode(self) -> bytes:
        buffer = bytearray(PAD_WIRE_LENGTH)
        self.encode_into(buffer, 0)
        return bytes(buffer)

    def encode_into(self, buffer: WritableBuffer, offset: int) -> int:
        """Write the 32-byte PAD header at ``offset``; return 32."""
        pack_into(
            dh.HEADER, buffer, offset, self,
            self.frame_length, dh.CURRENT_VERSION, self.flags, dh.HDR_TYPE_PAD, self.term_offset,
            self.session_id, self.stream_id, self.term_id, self.reserved_value,
        )  # fmt: skip
        return PAD_WIRE_LENGTH


DataPathFrame: TypeAlias = DataFrame | HeartbeatFrame | PadFrame


def wire_length(frame: DataPathFrame) -> int:
    """Bytes ``frame`` occupies in a datagram."""
    return frame.encoded_length if isinstance(frame, DataFrame) else dh.HEADER_LENGTH


def decode(buffer: Buffer, offset: int = 0) -> DataPathFrame:
    """The DATA, heartbeat or PAD frame at ``offset``; bytes after it are not looked at."""
    frame_length, _, frame_type, available = check_common_header(
        buffer, offset, (dh.HDR_TYPE_DATA, dh.HDR_TYPE_PAD), NAME, dh.HEADER_LENGTH
    )
    _, _, flags, _, term_offset, session_id, stream_id, term_id, reserved = dh.HEADER.unpack_from(buffer, offset)
    name = "PAD" if frame_type == dh.HDR_TYPE_PAD else NAME
    if term_offset < 0 or term_offset % dh.FRAME_ALIGNMENT:
        raise MalformedFrameError(
            f"{name} frame: term_offset={term_offset} is not a non-negative multiple of {dh.FRAME_ALIGNMENT}"
        )
    if frame_type == dh.HDR_TYPE_PAD:
        if frame_length < dh.HEADER_LENGTH:
            raise MalformedFrameError(
                f"PAD frame: frame_length={frame_length} is shorter than its {dh.HEADER_LENGTH}-byte header"
            )
        return PadFrame(term_offset, session_id, stream_id, term_id, frame_length, reserved, flags)
    if frame_length == 0:
        return HeartbeatFrame(term_offset, session_id, stream_id, term_id, reserved, flags)
    check_frame_length(frame_length, available, NAME, dh.HEADER_LENGTH)
    start = offset + dh.HEADER_LENGTH
    payload = bytes(buffer[start : offset + frame_length])
    return DataFrame(term_offset, session_id, stream_id, term_id, payload, reserved, flags)


def decode_datagram(buffer: Buffer) -> list[DataPathFrame]:
    """Every frame of a DATA/PAD/heartbeat datagram; :class:`MalformedFrameError` if any rule breaks."""
    length = len(buffer)
    first = decode(buffer, 0)
    if isinstance(first, HeartbeatFrame):
        if length != HEARTBEAT_LENGTH:
            raise MalformedFrameError(
                f"DATA frame: frame_length=0 (heartbeat) must be alone in a {HEARTBEAT_LENGTH}-byte datagram, "
                f"this one is {length} bytes"
            )
        return [first]
    frames: list[DataPathFrame] = [first]
    position = wire_length(first)
    while position < length:
        where = f"frame {len(frames) + 1} at datagram offset {position}"
        if isinstance(frames[-1], PadFrame):
            raise MalformedFrameError(f"{length - position} bytes after a PAD frame, which must end its datagram")
        if length - position < dh.HEADER_LENGTH:
            raise MalformedFrameError(
                f"{length - position} trailing bytes after the last frame, "
                f"too short for a {dh.HEADER_LENGTH}-byte header"
            )
        try:
            frame = decode(buffer, position)
        except MalformedFrameError as exc:
            raise MalformedFrameError(f"{where}: {exc.reason}") from None
        _check_consecutive(first, frames[-1], frame, where)
        frames.append(frame)
        position += wire_length(frame)
    return frames


def _check_consecutive(first: DataPathFrame, previous: DataPathFrame, frame: DataPathFrame, where: str) -> None:
    if isinstance(frame, HeartbeatFrame):
        raise MalformedFrameError(f"{where}: frame_length=0 (heartbeat) inside a multi-frame datagram")
    for field in ("session_id", "stream_id", "term_id"):
        value, wanted = getattr(frame, field), getattr(first, field)
        if value != wanted:
            raise MalformedFrameError(f"{where}: {field}={value}, the datagram's first frame has {wanted}")
    expected = previous.term_offset + dh.align(previous.frame_length)
    if frame.term_offset != expected:
        raise MalformedFrameError(
            f"{where}: term_offset={frame.term_offset}, expected {expected} right after the previous frame"
        )
