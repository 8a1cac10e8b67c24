"""Loss report layout: ``loss-report.dat`` in the driver directory, Aeron's ``LossReport`` byte for byte.

The receiver keeps one entry per image that has seen loss. An entry is created the first time a
gap is NAKed (or filled, on an unreliable subscription) and updated on every later NAK of any gap
of that image: one more observation, the gap's bytes added to the total, the last-observation time
moved. Entries follow one another, each starting on a 64-byte boundary; the first entry whose
observation count is 0 ends the report. The file is written by the driver and only read by tools
(AeronStat's sibling LossStat, ``logbuf-stat --loss``), also after the driver is gone.

One entry (all little-endian, ``#pragma pack(4)`` in Aeron's C)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                    Observation Count (int64)                  |   0
    +---------------------------------------------------------------+
    |                     Total Bytes Lost (int64)                  |   8
    +---------------------------------------------------------------+
    |             First Observation Timestamp, ms (int64)           |  16
    +---------------------------------------------------------------+
    |              Last Observation Timestamp, ms (int64)           |  24
    +---------------------------------------------------------------+
    |                          Session Id                           |  32
    +---------------------------------------------------------------+
    |                           Stream Id                           |  36
    +---------------------------------------------------------------+
    |                        Channel Length                         |  40
    +---------------------------------------------------------------+
    |         Channel (ASCII), padded to 4 bytes                   ...  44
    +---------------------------------------------------------------+
    |                         Source Length                         |
    +---------------------------------------------------------------+
    |         Source (ASCII, "address:port")                       ...
    +---------------------------------------------------------------+

Writer order (Aeron's): every field but the count, then the count with a release store (1), so a
reader that acquire-loads a count > 0 sees the whole entry. Updates: a release store of the last
observation time, then atomic adds to the total and the count. Only the receiver writes.
"""

from __future__ import annotations

import struct
from typing import Final

LOSS_REPORT_FILE: Final[str] = "loss-report.dat"
"""The file's name in the driver directory (Aeron's ``AERON_LOSS_REPORT_FILE``)."""

OBSERVATION_COUNT_OFFSET: Final[int] = 0
TOTAL_BYTES_LOST_OFFSET: Final[int] = OBSERVATION_COUNT_OFFSET + 8
FIRST_OBSERVATION_OFFSET: Final[int] = TOTAL_BYTES_LOST_OFFSET + 8
LAST_OBSERVATION_OFFSET: Final[int] = FIRST_OBSERVATION_OFFSET + 8
SESSION_ID_OFFSET: Final[int] = LAST_OBSERVATION_OFFSET + 8
STREAM_ID_OFFSET: Final[int] = SESSION_ID_OFFSET + 4
CHANNEL_OFFSET: Final[int] = STREAM_ID_OFFSET + 4
"""The channel's int32 length, then its bytes."""
ENTRY_HEADER_LENGTH: Final[int] = CHANNEL_OFFSET
"""Bytes before the channel (Aeron's ``sizeof(aeron_loss_reporter_entry_t)``)."""
assert ENTRY_HEADER_LENGTH == 40

ENTRY_ALIGNMENT: Final[int] = 64
"""Each entry starts on a cache line."""

DEFAULT_LOSS_REPORT_LENGTH: Final[int] = 1024 * 1024
"""Aeron's ``aeron.loss.report.buffer.length`` default; the file is this rounded up to the page size."""

MAX_STRING_LENGTH: Final[int] = 4096
"""Longest channel or source a reader accepts; anything longer is a corrupt entry, not a string."""

ENTRY_HEADER: Final[struct.Struct] = struct.Struct("<qqqqii")
"""observation count, total bytes lost, first and last observation (ms), session id, stream id."""
LENGTH_FIELD: Final[struct.Struct] = struct.Struct("<i")


def align(value: int, alignment: int) -> int:
    return (value + alignment - 1) & ~(alignment - 1)


def source_length_offset(channel_length: int) -> int:
    """Where the source's length sits in an entry with a channel of ``channel_length`` bytes."""
    return CHANNEL_OFFSET + align(LENGTH_FIELD.size + channel_length, 4)


def entry_length(channel_length: int, source_length: int) -> int:
    """Bytes an entry takes, before aligning to :data:`ENTRY_ALIGNMENT`."""
    return source_length_offset(channel_length) + LENGTH_FIELD.size + source_length


def check_loss_report_length(length: int) -> None:
    """A loss report holds at least one entry's header and a whole number of 64-byte lines."""
    if length < ENTRY_ALIGNMENT or length % ENTRY_ALIGNMENT:
        raise ValueError(f"loss report length={length} must be a positive multiple of {ENTRY_ALIGNMENT}")
