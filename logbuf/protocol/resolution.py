"""RESOLUTION (RES): name-resolver gossip between drivers (type 0x07, 8 + entries bytes).

Only Aeron's optional driver name resolver sends these. logbuf has no resolver: it decodes them
only, so that a valid one reaching an endpoint is not counted as an invalid packet. A RES frame
is the common header followed by one or more entries, packed back to back; each entry is padded
to an 8-byte boundary and ``frame_length`` covers the header and every (padded) entry.

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-------------------------------------------------------------+
    |R|                      Frame Length                           |   0
    +-+-------------+---------------+-------------------------------+
    |   Version     |     Flags     |          Type (= 0x07)        |   4
    +---------------+---------------+-------------------------------+
    |                         Entries ...                          ...  8

One entry (offsets from the entry's start; IPv6 shown in brackets)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------+-+-------------+-------------------------------+
    |   Res Type    |S|  Res Flags  |           UDP Port            |   0
    +---------------+-+-------------+-------------------------------+
    |                          Age (ms)                             |   4
    +---------------------------------------------------------------+
    |              Address (4 bytes IPv4 [16 bytes IPv6])           |   8
    +-------------------------------+-------------------------------+
    |         Name Length           |         Name ...             ...  12 [24]
    +-------------------------------+-------------------------------+

Res type 0x01 is name -> IPv4, 0x02 name -> IPv6; res flag S (0x80) marks the sender's own
entry. Names are ASCII, at most 512 bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from logbuf.protocol import MalformedFrameError
from logbuf.protocol.frame_header import (
    COMMON_HEADER_LENGTH,
    HDR_TYPE_RES,
    Buffer,
    check_common_header,
    check_frame_length,
)

NAME: Final[str] = "RES"

RES_HEADER_LENGTH: Final[int] = COMMON_HEADER_LENGTH
"""8 bytes: the common header; entries follow."""

# -- entry field offsets (from the entry's start) -------------------------------------------
RES_TYPE_FIELD_OFFSET: Final[int] = 0
RES_FLAGS_FIELD_OFFSET: Final[int] = RES_TYPE_FIELD_OFFSET + 1
UDP_PORT_FIELD_OFFSET: Final[int] = RES_FLAGS_FIELD_OFFSET + 1
AGE_IN_MS_FIELD_OFFSET: Final[int] = UDP_PORT_FIELD_OFFSET + 2
ADDRESS_FIELD_OFFSET: Final[int] = AGE_IN_MS_FIELD_OFFSET + 4
ADDRESS_LENGTH_IP4: Final[int] = 4
ADDRESS_LENGTH_IP6: Final[int] = 16
NAME_LENGTH_LENGTH: Final[int] = 2
ENTRY_ALIGNMENT: Final[int] = 8
MAX_NAME_LENGTH: Final[int] = 512

# -- entry types and flags ------------------------------------------------------------------
RES_TYPE_NAME_TO_IP4_MD: Final[int] = 0x01
RES_TYPE_NAME_TO_IP6_MD: Final[int] = 0x02
SELF_FLAG: Final[int] = 0x80

ADDRESS_LENGTHS: Final[dict[int, int]] = {
    RES_TYPE_NAME_TO_IP4_MD: ADDRESS_LENGTH_IP4,
    RES_TYPE_NAME_TO_IP6_MD: ADDRESS_LENGTH_IP6,
}

ENTRY_FIXED: Final[struct.Struct] = struct.Struct("<BBHi")
"""res_type, res_flags, udp_port, age_in_ms."""
NAME_LENGTH_FIELD: Final[struct.Struct] = struct.Struct("<h")


def name_offset(res_type: int) -> int:
    """Offset of the name-length field in an entry of ``res_type``: 12 (IPv4) or 24 (IPv6)."""
    return ADDRESS_FIELD_OFFSET + ADDRESS_LENGTHS[res_type]


def entry_length(res_type: int, name_length: int) -> int:
    """Bytes an entry takes in the frame, padding included."""
    end = name_offset(res_type) + NAME_LENGTH_LENGTH + name_length
    return (end + ENTRY_ALIGNMENT - 1) & ~(ENTRY_ALIGNMENT - 1)


@dataclass(frozen=True, slots=True)
class ResolutionEntry:
    """One name -> address entry; ``address`` is 4 bytes (IPv4) or 16 (IPv6), network order."""

    res_type: int
    udp_port: int
    age_ms: int
    address: bytes
    name: str
    res_flags: int = 0

    @property
    def is_self(self) -> bool:
        return bool(self.res_flags & SELF_FLAG)

    @property
    def length(self) -> int:
        return entry_length(self.res_type, len(self.name))


@dataclass(frozen=True, slots=True)
class ResolutionFrame:
    entries: tuple[ResolutionEntry, ...]
    flags: int = 0

    @property
    def frame_length(self) -> int:
        return RES_HEADER_LENGTH + sum(entry.length for entry in self.entries)


def decode(buffer: Buffer, offset: int = 0) -> ResolutionFrame:
    """The RES frame at ``offset``; bytes after ``frame_length`` are not looked at."""
    frame_length, flags, _, available = check_common_header(buffer, offset, (HDR_TYPE_RES,), NAME, RES_HEADER_LENGTH)
    check_frame_length(frame_length, available, NAME, RES_HEADER_LENGTH)
    end = offset + frame_length
    position = offset + RES_HEADER_LENGTH
    entries: list[ResolutionEntry] = []
    while position < end:
        entries.append(_decode_entry(buffer, position, end, len(entries)))
        position += entries[-1].length
    return ResolutionFrame(tuple(entries), flags)


def _decode_entry(buffer: Buffer, position: int, end: int, index: int) -> ResolutionEntry:
    where = f"RES frame: entry {index}"
    res_type = buffer[position]
    if res_type not in ADDRESS_LENGTHS:
        raise MalformedFrameError(f"{where}: res_type=0x{res_type:02x} is not IPv4 (0x01) or IPv6 (0x02)")
    name_at = position + name_offset(res_type)
    if name_at + NAME_LENGTH_LENGTH > end:
        raise MalformedFrameError(f"{where} truncated: {end - position} bytes left, needs {name_at + 2 - position}")
    _, res_flags, udp_port, age_ms = ENTRY_FIXED.unpack_from(buffer, position)
    (name_length,) = NAME_LENGTH_FIELD.unpack_from(buffer, name_at)
    if not 0 <= name_length <= MAX_NAME_LENGTH:
        raise MalformedFrameError(f"{where}: name_length={name_length} is not in [0, {MAX_NAME_LENGTH}]")
    name_start = name_at + NAME_LENGTH_LENGTH
    if name_start + name_length > end:
        raise MalformedFrameError(f"{where}: name_length={name_length} runs past frame_length")
    try:
        name = bytes(buffer[name_start : name_start + name_length]).decode("ascii")
    except UnicodeDecodeError as exc:
        raise MalformedFrameError(f"{where}: name byte {exc.start} is not ASCII") from None
    address = bytes(buffer[position + ADDRESS_FIELD_OFFSET : position + name_offset(res_type)])
    return ResolutionEntry(res_type, udp_port, age_ms, address, name, res_flags)
