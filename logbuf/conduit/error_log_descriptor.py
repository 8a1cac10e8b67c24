"""Distinct error log layout: Agrona's ``DistinctErrorLog`` records, one per distinct error.

Records follow each other from offset 0, each starting 8-byte aligned; a record whose length is
0 ends the log (the rest of the buffer is zeroes). Timestamps are epoch milliseconds::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                   Length (int32, header included)             |   0
    +---------------------------------------------------------------+
    |                    Observation Count (int32)                  |   4
    +---------------------------------------------------------------+
    |               Last Observation Timestamp (int64)              |   8
    +---------------------------------------------------------------+
    |              First Observation Timestamp (int64)              |  16
    +---------------------------------------------------------------+
    |                  Encoded Error (UTF-8 text)                  ...  24
    +---------------------------------------------------------------+

The length is written last with a release store: a reader that sees it sees the whole text.
"""

from __future__ import annotations

import struct
from typing import Final

LENGTH_OFFSET: Final[int] = 0
OBSERVATION_COUNT_OFFSET: Final[int] = LENGTH_OFFSET + 4
LAST_OBSERVATION_TIMESTAMP_OFFSET: Final[int] = OBSERVATION_COUNT_OFFSET + 4
FIRST_OBSERVATION_TIMESTAMP_OFFSET: Final[int] = LAST_OBSERVATION_TIMESTAMP_OFFSET + 8
ENCODED_ERROR_OFFSET: Final[int] = FIRST_OBSERVATION_TIMESTAMP_OFFSET + 8
RECORD_ALIGNMENT: Final[int] = 8

assert ENCODED_ERROR_OFFSET == 24

RECORD_HEADER: Final[struct.Struct] = struct.Struct("<iiqq")
"""length, observation_count, last_observation_ms, first_observation_ms."""


def align(value: int) -> int:
    return (value + RECORD_ALIGNMENT - 1) & ~(RECORD_ALIGNMENT - 1)


def check_buffer_length(length: int) -> None:
    """An error log buffer holds at least one header and ends on a record boundary."""
    if length < ENCODED_ERROR_OFFSET or length % RECORD_ALIGNMENT:
        raise ValueError(
            f"error log length={length} must be a multiple of {RECORD_ALIGNMENT} and >= {ENCODED_ERROR_OFFSET}"
        )
