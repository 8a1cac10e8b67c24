"""Archive catalog layout: ``archive.catalog``, a header and fixed-size recording descriptor entries.

Like Aeron's ``Catalog``: one memory-mapped file of 1024-byte entries, updated in place; the
entry of recording ``id`` is at ``HEADER_LENGTH + id * ENTRY_LENGTH`` (ids are dense, from 0).
All fields are little-endian. A recorder updates its entries' hot fields (stop position and
heartbeat) with release stores while any process reads them with acquire loads.

Header (first 1024 bytes)::

    +---------------------------------------------------------------+
    |                       Magic "LBAC" (int32)                    |   0
    +---------------------------------------------------------------+
    |                         Version (int32)                       |   4
    +---------------------------------------------------------------+
    |                      Header Length (int32)                    |   8
    +---------------------------------------------------------------+
    |                      Entry Length (int32)                     |  12
    +---------------------------------------------------------------+
    |                      48 bytes reserved                       ...  16
    +---------------------------------------------------------------+
    |                 Next Recording Id (int64, hot)                |  64
    +---------------------------------------------------------------+
    |                     reserved to 1024                         ...  72
    +---------------------------------------------------------------+

Recording descriptor entry (1024 bytes)::

    +---------------------------------------------------------------+
    |        State (int32): INVALID 0, VALID 1, DELETED 2           |   0
    +---------------------------------------------------------------+
    |        Flags (int32): ACTIVE 1, INTERRUPTED 2                 |   4
    +---------------------------------------------------------------+
    |                     Recorder Pid (int32)                      |   8
    +---------------------------------------------------------------+
    |        Checksum (int32): NONE 0, CRC32 1                      |  12
    +---------------------------------------------------------------+
    |                      Recording Id (int64)                     |  16
    +---------------------------------------------------------------+
    |                     Start Position (int64)                    |  24
    +---------------------------------------------------------------+
    |                   Start Time, epoch ms (int64)                |  32
    +---------------------------------------------------------------+
    |           Stop Time, epoch ms (int64; -1 while active)        |  40
    +---------------------------------------------------------------+
    |                       16 bytes reserved                      ...  48
    +---------------------------------------------------------------+
    |                 Stop Position (int64, hot)                    |  64
    +---------------------------------------------------------------+
    |            Recorder Heartbeat, epoch ms (int64, hot)          |  72
    +---------------------------------------------------------------+
    |                       48 bytes reserved                      ...  80
    +---------------------------------------------------------------+
    |   Initial Term Id   |   Term Length    |   MTU Length         | 128
    +---------------------------------------------------------------+
    |   Segment Length    |   Session Id     |   Stream Id          | 140
    +---------------------------------------------------------------+
    |                     Channel Length (int32)                    | 152
    +---------------------------------------------------------------+
    |                 576 bytes of channel (UTF-8)                 ... 156
    +---------------------------------------------------------------+
    |                 Source Identity Length (int32)                | 732
    +---------------------------------------------------------------+
    |             256 bytes of source identity (UTF-8)             ... 736
    +---------------------------------------------------------------+
    |                     reserved to 1024                         ... 992
    +---------------------------------------------------------------+

Write order (what makes the entry safe to read while it changes):

- **Add**: every cold field, the flags (ACTIVE), pid, stop position (= start) and heartbeat are
  written while the state is still INVALID (0); then the state VALID with a release store; then
  the header's next recording id with a release store. A crash before that leaves an INVALID
  entry that the next add overwrites.
- **Progress**: the recorder writes segment bytes first (``pwrite``; the page cache is coherent
  between processes), then stores the new stop position with a release store. So every byte
  before a stop position read with an acquire load is written and complete.
- **Stop**: stop position (release), stop time, then the flags without ACTIVE (release). A reader
  loads the flags first (acquire), then the stop position: if it saw the flags cleared, it sees
  the final stop position.
- **Checksum**: written with the cold fields at add (0 in catalogs made before the field existed,
  which was reserved and zero: no checksums). See :data:`CHECKSUM_CRC32`.
- **Interrupted**: an ACTIVE entry whose recorder pid is gone (or whose heartbeat is older than
  :data:`RECORDER_TIMEOUT_MS`) was interrupted. Readers report it as such; the next writer to open
  the catalog walks the segment frames from the stored stop position, stores the end of the
  valid prefix and sets INTERRUPTED (and clears ACTIVE).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Final

from logbuf import native
from logbuf.errors import LogbufError

if TYPE_CHECKING:
    from typing_extensions import Buffer

CATALOG_FILE_NAME: Final[str] = "archive.catalog"
MAGIC: Final[int] = 0x4341424C  # "LBAC" little-endian
VERSION: Final[int] = 1

# -- header ---------------------------------------------------------------------------------
MAGIC_OFFSET: Final[int] = 0
VERSION_OFFSET: Final[int] = MAGIC_OFFSET + 4
HEADER_LENGTH_OFFSET: Final[int] = VERSION_OFFSET + 4
ENTRY_LENGTH_OFFSET: Final[int] = HEADER_LENGTH_OFFSET + 4
NEXT_RECORDING_ID_OFFSET: Final[int] = 64
HEADER_LENGTH: Final[int] = 1024
ENTRY_LENGTH: Final[int] = 1024
HEADER: Final[struct.Struct] = struct.Struct("<iiii")

# -- entry: cold identity fields --------------------------------------------------------------
STATE_OFFSET: Final[int] = 0
FLAGS_OFFSET: Final[int] = STATE_OFFSET + 4
RECORDER_PID_OFFSET: Final[int] = FLAGS_OFFSET + 4
CHECKSUM_OFFSET: Final[int] = RECORDER_PID_OFFSET + 4
RECORDING_ID_OFFSET: Final[int] = CHECKSUM_OFFSET + 4
START_POSITION_OFFSET: Final[int] = RECORDING_ID_OFFSET + 8
START_TIME_OFFSET: Final[int] = START_POSITION_OFFSET + 8
STOP_TIME_OFFSET: Final[int] = START_TIME_OFFSET + 8
# -- entry: hot fields, a cache line away from the cold ones ----------------------------------
STOP_POSITION_OFFSET: Final[int] = 64
HEARTBEAT_OFFSET: Final[int] = STOP_POSITION_OFFSET + 8
# -- entry: stream parameters and strings ---------------------------------------------------
INITIAL_TERM_ID_OFFSET: Final[int] = 128
TERM_LENGTH_OFFSET: Final[int] = INITIAL_TERM_ID_OFFSET + 4
MTU_LENGTH_OFFSET: Final[int] = TERM_LENGTH_OFFSET + 4
SEGMENT_LENGTH_OFFSET: Final[int] = MTU_LENGTH_OFFSET + 4
SESSION_ID_OFFSET: Final[int] = SEGMENT_LENGTH_OFFSET + 4
STREAM_ID_OFFSET: Final[int] = SESSION_ID_OFFSET + 4
CHANNEL_LENGTH_OFFSET: Final[int] = STREAM_ID_OFFSET + 4
CHANNEL_OFFSET: Final[int] = CHANNEL_LENGTH_OFFSET + 4
CHANNEL_MAX_LENGTH: Final[int] = 576
SOURCE_IDENTITY_LENGTH_OFFSET: Final[int] = CHANNEL_OFFSET + CHANNEL_MAX_LENGTH
SOURCE_IDENTITY_OFFSET: Final[int] = SOURCE_IDENTITY_LENGTH_OFFSET + 4
SOURCE_IDENTITY_MAX_LENGTH: Final[int] = 256
ENTRY_USED_LENGTH: Final[int] = SOURCE_IDENTITY_OFFSET + SOURCE_IDENTITY_MAX_LENGTH

# recording id, start position, start time, stop time (at RECORDING_ID_OFFSET)
IDENTITY: Final[struct.Struct] = struct.Struct("<qqqq")
# initial term id, term length, mtu, segment length, session id, stream id (at INITIAL_TERM_ID_OFFSET)
STREAM_PARAMS: Final[struct.Struct] = struct.Struct("<iiiiii")
INT32: Final[struct.Struct] = struct.Struct("<i")
INT64: Final[struct.Struct] = struct.Struct("<q")

# -- flags and states -----------------------------------------------------------------------
FLAG_ACTIVE: Final[int] = 1
FLAG_INTERRUPTED: Final[int] = 2
STATE_INVALID: Final[int] = 0
STATE_VALID: Final[int] = 1
STATE_DELETED: Final[int] = 2

# -- record checksums (the checksum field) ---------------------------------------------------------
CHECKSUM_NONE: Final[int] = 0
CHECKSUM_CRC32: Final[int] = 1
"""Each DATA frame's session id field holds the CRC-32 (zlib's) of its payload, in place of the
session id (Aeron Archive's record checksum placement); the session id is the entry's."""

NULL_TIME: Final[int] = -1
RECORDER_HEARTBEAT_INTERVAL_MS: Final[int] = 1_000
RECORDER_TIMEOUT_MS: Final[int] = 10_000
"""An ACTIVE entry whose heartbeat is older than this counts as interrupted even if its pid exists."""

DEFAULT_CAPACITY: Final[int] = 1024 * 1024
"""Initial catalog file length (1023 entries); the file doubles when full."""

assert ENTRY_USED_LENGTH <= ENTRY_LENGTH
assert STOP_TIME_OFFSET + 8 <= STOP_POSITION_OFFSET
assert HEARTBEAT_OFFSET + 8 <= INITIAL_TERM_ID_OFFSET


class CatalogFormatError(LogbufError, ValueError):
    """The catalog file is not one this version understands (named in the message)."""


def entry_offset(recording_id: int) -> int:
    """File offset of recording ``recording_id``'s entry."""
    return HEADER_LENGTH + recording_id * ENTRY_LENGTH


def capacity_entries(file_length: int) -> int:
    """How many entries a catalog file of ``file_length`` bytes holds."""
    return max(0, (file_length - HEADER_LENGTH) // ENTRY_LENGTH)


def check_header(buffer: Buffer, path: str) -> None:
    """Raise :class:`CatalogFormatError` naming the file and the bad field."""
    with memoryview(buffer) as view:
        length = len(view)
        fields = HEADER.unpack_from(view, 0) if length >= HEADER_LENGTH else None
    if fields is None:
        raise CatalogFormatError(f"catalog {path}: {length} bytes is shorter than its {HEADER_LENGTH}-byte header")
    magic, version, header_length, entry_length = fields
    if magic != MAGIC:
        raise CatalogFormatError(f"catalog {path}: magic {magic:#x} is not {MAGIC:#x} ('LBAC'): not a logbuf catalog")
    if version != VERSION:
        raise CatalogFormatError(f"catalog {path}: version {version} is not supported (this code reads {VERSION})")
    if header_length != HEADER_LENGTH or entry_length != ENTRY_LENGTH:
        raise CatalogFormatError(
            f"catalog {path}: header_length={header_length} entry_length={entry_length}, "
            f"expected {HEADER_LENGTH} and {ENTRY_LENGTH}"
        )


def check_string(name: str, value: str, max_length: int) -> bytes:
    """UTF-8 bytes of ``value``, or a ValueError naming the field and its length limit."""
    encoded = value.encode()
    if len(encoded) > max_length:
        raise ValueError(
            f"{name} is {len(encoded)} bytes long; the catalog holds at most {max_length}: {value[:80]!r}..."
        )
    return encoded


# -- ordered accessors (the only reads and writes whose ordering matters) --------------------
def state_volatile(buffer: Buffer, entry: int) -> int:
    return native.get_int32_volatile(buffer, entry + STATE_OFFSET)


def state_ordered(buffer: Buffer, entry: int, state: int) -> None:
    native.put_int32_ordered(buffer, entry + STATE_OFFSET, state)


def flags_volatile(buffer: Buffer, entry: int) -> int:
    return native.get_int32_volatile(buffer, entry + FLAGS_OFFSET)


def flags_ordered(buffer: Buffer, entry: int, flags: int) -> None:
    native.put_int32_ordered(buffer, entry + FLAGS_OFFSET, flags)


def stop_position_volatile(buffer: Buffer, entry: int) -> int:
    return native.get_int64_volatile(buffer, entry + STOP_POSITION_OFFSET)


def stop_position_ordered(buffer: Buffer, entry: int, position: int) -> None:
    native.put_int64_ordered(buffer, entry + STOP_POSITION_OFFSET, position)


def heartbeat_volatile(buffer: Buffer, entry: int) -> int:
    return native.get_int64_volatile(buffer, entry + HEARTBEAT_OFFSET)


def heartbeat_ordered(buffer: Buffer, entry: int, now_ms: int) -> None:
    native.put_int64_ordered(buffer, entry + HEARTBEAT_OFFSET, now_ms)


def next_recording_id_volatile(buffer: Buffer) -> int:
    return native.get_int64_volatile(buffer, NEXT_RECORDING_ID_OFFSET)


def next_recording_id_ordered(buffer: Buffer, value: int) -> None:
    native.put_int64_ordered(buffer, NEXT_RECORDING_ID_OFFSET, value)
