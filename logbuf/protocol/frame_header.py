"""The 8-byte header every wire frame starts with, the frame type codes, and shared checks.

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-------------------------------------------------------------+
    |R|                       Frame Length                          |   0
    +-+-------------+---------------+-------------------------------+
    |   Version     |     Flags     |             Type              |   4
    +---------------+---------------+-------------------------------+
    |                  Frame-type specific fields                  ...  8

``frame_length`` (int32) is the frame's unaligned length; ``version`` is 0; the meaning of
``flags`` depends on ``type`` (uint16). All little-endian. The offsets are the ones of
:mod:`logbuf.logbuffer.data_header_descriptor`, re-exported here so control-frame modules need one import.

The two ``check_*`` helpers run the checks every decoder shares, in a fixed order so that a
given bad buffer always gets the same reason: enough bytes for the common header, version,
type, enough bytes for the frame type's fixed part, then ``frame_length`` against the
header length and against the bytes available.
"""

from __future__ import annotations

import struct
from typing import Final, TypeAlias

from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import MalformedFrameError

Buffer: TypeAlias = bytes | bytearray | memoryview
"""Anything frames are decoded from (one byte per item)."""
WritableBuffer: TypeAlias = bytearray | memoryview
"""Anything frames are encoded into (one writable byte per item)."""

# -- common header fields -------------------------------------------------------------------
FRAME_LENGTH_FIELD_OFFSET: Final[int] = dh.FRAME_LENGTH_FIELD_OFFSET
VERSION_FIELD_OFFSET: Final[int] = dh.VERSION_FIELD_OFFSET
FLAGS_FIELD_OFFSET: Final[int] = dh.FLAGS_FIELD_OFFSET
TYPE_FIELD_OFFSET: Final[int] = dh.TYPE_FIELD_OFFSET
COMMON_HEADER_LENGTH: Final[int] = dh.MIN_HEADER_LENGTH
"""8 bytes: frame_length, version, flags, type."""

CURRENT_VERSION: Final[int] = dh.CURRENT_VERSION
FRAME_ALIGNMENT: Final[int] = dh.FRAME_ALIGNMENT

COMMON_HEADER: Final[struct.Struct] = struct.Struct("<iBBH")
"""frame_length, version, flags, type."""
assert COMMON_HEADER.size == COMMON_HEADER_LENGTH

# -- frame types (the ``type`` field) -------------------------------------------------------
HDR_TYPE_PAD: Final[int] = dh.HDR_TYPE_PAD
HDR_TYPE_DATA: Final[int] = dh.HDR_TYPE_DATA
HDR_TYPE_NAK: Final[int] = 0x02
HDR_TYPE_SM: Final[int] = 0x03
HDR_TYPE_ERR: Final[int] = 0x04
HDR_TYPE_SETUP: Final[int] = 0x05
HDR_TYPE_RTTM: Final[int] = 0x06
HDR_TYPE_RES: Final[int] = 0x07
HDR_TYPE_RSP_SETUP: Final[int] = 0x0B
HDR_TYPE_EXT: Final[int] = 0xFFFF
"""Extension frames: reserved, never sent by Aeron's open-source drivers; we count them as invalid."""

TYPE_NAMES: Final[dict[int, str]] = {
    HDR_TYPE_PAD: "PAD",
    HDR_TYPE_DATA: "DATA",
    HDR_TYPE_NAK: "NAK",
    HDR_TYPE_SM: "SM",
    HDR_TYPE_ERR: "ERR",
    HDR_TYPE_SETUP: "SETUP",
    HDR_TYPE_RTTM: "RTTM",
    HDR_TYPE_RES: "RES",
    0x08: "ATS_DATA",
    0x09: "ATS_SM/ATS_SETUP",  # Java and C disagree on 0x09/0x0A; both are Aeron Premium only
    0x0A: "ATS_SETUP/ATS_SM",
    HDR_TYPE_RSP_SETUP: "RSP_SETUP",
    HDR_TYPE_EXT: "EXT",
}


def type_name(frame_type: int) -> str:
    """``'0x0005 (SETUP)'``: a type code as the error messages print it."""
    return f"0x{frame_type:04x} ({TYPE_NAMES.get(frame_type, 'unknown')})"


def check_common_header(
    buffer: Buffer, offset: int, frame_types: tuple[int, ...], name: str, min_length: int
) -> tuple[int, int, int, int]:
    """Check a frame's common header; return ``(frame_length, flags, type, available)``.

    ``frame_types`` are the acceptable type codes, ``name`` the frame name used in messages,
    ``min_length`` the length of the frame type's fixed part. ``frame_length`` is not checked
    here (see :func:`check_frame_length`): DATA's heartbeat makes 0 a legal value.
    """
    available = len(buffer) - offset
    if offset < 0 or available < COMMON_HEADER_LENGTH:
        raise MalformedFrameError(f"{name} frame truncated: {max(available, 0)} bytes, needs {min_length}")
    frame_length, version, flags, frame_type = COMMON_HEADER.unpack_from(buffer, offset)
    if version != CURRENT_VERSION:
        raise MalformedFrameError(f"{name} frame: version={version}, expected {CURRENT_VERSION}")
    if frame_type not in frame_types:
        wanted = " or ".join(type_name(t) for t in frame_types)
        raise MalformedFrameError(f"{name} frame: type={type_name(frame_type)}, expected {wanted}")
    if available < min_length:
        raise MalformedFrameError(f"{name} frame truncated: {available} bytes, needs {min_length}")
    return frame_length, flags, frame_type, available


def check_frame_length(frame_length: int, available: int, name: str, header_length: int) -> None:
    """``frame_length`` must cover the fixed header and fit in the bytes available."""
    if frame_length < header_length:
        raise MalformedFrameError(
            f"{name} frame: frame_length={frame_length} is shorter than its {header_length}-byte header"
        )
    if frame_length > available:
        raise MalformedFrameError(
            f"{name} frame: frame_length={frame_length} is longer than the {available} bytes available"
        )


def pack_into(layout: struct.Struct, buffer: WritableBuffer, offset: int, frame: object, *values: int) -> None:
    """``layout.pack_into`` whose error names the frame being encoded (a ValueError)."""
    try:
        layout.pack_into(buffer, offset, *values)
    except struct.error as exc:
        raise ValueError(f"cannot encode {frame!r}: {exc}") from None
