"""CnC ("command and control") file layout: Aeron's ``CncFileDescriptor``, ``<dir>/cnc.dat``.

The media driver creates it; clients map it to send commands (to-driver ring), hear responses
(to-clients broadcast), read counters and the driver's error log::

    +-----------------------------+
    |  Metadata header (48 bytes) |    0
    |  padding to 128             |   48
    +-----------------------------+  128 = END_OF_METADATA_OFFSET
    |  To-driver ring buffer      |  to_driver_capacity + 768-byte trailer
    +-----------------------------+
    |  To-clients broadcast       |  to_clients_capacity + 128-byte trailer
    +-----------------------------+
    |  Counters metadata          |  4 x counters values length
    +-----------------------------+
    |  Counters values            |  counters_values_length
    +-----------------------------+
    |  Error log                  |  error_log_length
    +-----------------------------+

Metadata header::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                      CnC Version (int32)                      |   0
    +---------------------------------------------------------------+
    |                 To-driver Buffer Length (int32)               |   4
    +---------------------------------------------------------------+
    |                To-clients Buffer Length (int32)               |   8
    +---------------------------------------------------------------+
    |              Counters Metadata Buffer Length (int32)          |  12
    +---------------------------------------------------------------+
    |               Counters Values Buffer Length (int32)           |  16
    +---------------------------------------------------------------+
    |                  Error Log Buffer Length (int32)              |  20
    +---------------------------------------------------------------+
    |               Client Liveness Timeout, ns (int64)             |  24
    +---------------------------------------------------------------+
    |               Driver Start Timestamp, epoch ms (int64)        |  32
    +---------------------------------------------------------------+
    |                        Driver PID (int64)                     |  40
    +---------------------------------------------------------------+

The version is written last, with a release store: 0 means "still being initialised".
Versions are semantic, ``major << 16 | minor << 8 | patch``; a client accepts only its own major.
"""

from __future__ import annotations

import struct
from typing import Final

from logbuf.conduit import broadcast_descriptor as bd
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit import error_log_descriptor as ed
from logbuf.conduit import ring_buffer_descriptor as rd

CNC_FILE: Final[str] = "cnc.dat"


def semantic_version(major: int, minor: int, patch: int) -> int:
    return (major << 16) | (minor << 8) | patch


def version_string(version: int) -> str:
    return f"{(version >> 16) & 0xFF}.{(version >> 8) & 0xFF}.{version & 0xFF}"


def major_version(version: int) -> int:
    return (version >> 16) & 0xFF


CNC_VERSION: Final[int] = semantic_version(0, 2, 0)
assert CNC_VERSION == 512

# -- header ----------------------------------------------------------------------------------
CNC_VERSION_FIELD_OFFSET: Final[int] = 0
TO_DRIVER_BUFFER_LENGTH_FIELD_OFFSET: Final[int] = CNC_VERSION_FIELD_OFFSET + 4
TO_CLIENTS_BUFFER_LENGTH_FIELD_OFFSET: Final[int] = TO_DRIVER_BUFFER_LENGTH_FIELD_OFFSET + 4
COUNTERS_METADATA_BUFFER_LENGTH_FIELD_OFFSET: Final[int] = TO_CLIENTS_BUFFER_LENGTH_FIELD_OFFSET + 4
COUNTERS_VALUES_BUFFER_LENGTH_FIELD_OFFSET: Final[int] = COUNTERS_METADATA_BUFFER_LENGTH_FIELD_OFFSET + 4
ERROR_LOG_BUFFER_LENGTH_FIELD_OFFSET: Final[int] = COUNTERS_VALUES_BUFFER_LENGTH_FIELD_OFFSET + 4
CLIENT_LIVENESS_TIMEOUT_FIELD_OFFSET: Final[int] = ERROR_LOG_BUFFER_LENGTH_FIELD_OFFSET + 4
START_TIMESTAMP_FIELD_OFFSET: Final[int] = CLIENT_LIVENESS_TIMEOUT_FIELD_OFFSET + 8
PID_FIELD_OFFSET: Final[int] = START_TIMESTAMP_FIELD_OFFSET + 8
META_DATA_LENGTH: Final[int] = PID_FIELD_OFFSET + 8
END_OF_METADATA_OFFSET: Final[int] = 128

assert META_DATA_LENGTH == 48

HEADER_LENGTHS: Final[struct.Struct] = struct.Struct("<iiiiiqqq")
"""Everything after the version, from offset 4: the five buffer lengths, liveness timeout, start ms, pid."""
assert HEADER_LENGTHS.size == META_DATA_LENGTH - 4

# -- defaults (Aeron's) -------------------------------------------------------------------------
DEFAULT_TO_DRIVER_CAPACITY: Final[int] = 1024 * 1024
DEFAULT_TO_CLIENTS_CAPACITY: Final[int] = 1024 * 1024
DEFAULT_COUNTERS_VALUES_LENGTH: Final[int] = 1024 * 1024
DEFAULT_ERROR_LOG_LENGTH: Final[int] = 1024 * 1024
DEFAULT_CLIENT_LIVENESS_TIMEOUT_NS: Final[int] = 10_000_000_000
MIN_BUFFER_CAPACITY: Final[int] = 1024
"""Smallest ring/broadcast capacity accepted here (keeps every section 128-byte aligned)."""
MAX_BUFFER_LENGTH: Final[int] = (1 << 31) - 1


def check_capacity(name: str, capacity: int) -> None:
    if capacity < MIN_BUFFER_CAPACITY or capacity & (capacity - 1):
        raise ValueError(f"{name}={capacity} must be a power of 2 >= {MIN_BUFFER_CAPACITY}")


def check_lengths(
    to_driver_capacity: int, to_clients_capacity: int, counters_values_length: int, error_log_length: int
) -> None:
    """Validate the sizes a driver asks for; errors name the setting and its value."""
    check_capacity("to_driver_capacity", to_driver_capacity)
    check_capacity("to_clients_capacity", to_clients_capacity)
    cd.check_values_length(counters_values_length)
    if error_log_length < ed.ENCODED_ERROR_OFFSET or error_log_length % ed.RECORD_ALIGNMENT:
        raise ValueError(
            f"error_log_length={error_log_length} must be a multiple of {ed.RECORD_ALIGNMENT} >= {ed.ENCODED_ERROR_OFFSET}"
        )
    for name, length in (
        ("to_driver_capacity", to_driver_buffer_length(to_driver_capacity)),
        ("to_clients_capacity", to_clients_buffer_length(to_clients_capacity)),
        ("counters_values_length", counters_metadata_length(counters_values_length)),
        ("error_log_length", error_log_length),
    ):
        if length > MAX_BUFFER_LENGTH:
            raise ValueError(
                f"{name} makes a {length}-byte buffer; the header holds int32 lengths (max {MAX_BUFFER_LENGTH})"
            )


def to_driver_buffer_length(capacity: int) -> int:
    return capacity + rd.TRAILER_LENGTH


def to_clients_buffer_length(capacity: int) -> int:
    return capacity + bd.TRAILER_LENGTH


def counters_metadata_length(counters_values_length: int) -> int:
    return counters_values_length * (cd.METADATA_LENGTH // cd.COUNTER_LENGTH)


def file_length(
    to_driver_length: int, to_clients_length: int, metadata_length: int, values_length: int, error_log_length: int
) -> int:
    """Total CnC file length from the buffer lengths as stored in the header."""
    return (
        END_OF_METADATA_OFFSET
        + to_driver_length
        + to_clients_length
        + metadata_length
        + values_length
        + error_log_length
    )
