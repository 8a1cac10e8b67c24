"""The archive service's counters, in ``<archive_dir>/archive.counters`` so any process can read them.

Layout (all little-endian)::

    +---------------------------------------------------------------+
    |  magic "LBARCCNT" (8) | version (i32) | count (i32) | pid (i64) |  header, 64 bytes
    +---------------------------------------------------------------+
    |  value (i64, release-stored)  | label (UTF-8, NUL padded, 56)  |  counter 0, 64 bytes
    +---------------------------------------------------------------+
    |  ...                                                          |  counter 1..count-1
    +---------------------------------------------------------------+

One writer (the service); readers (``logbuf-stat --archive-dir``, tests) map it read-only and
acquire-load each value. Each counter has its own 64-byte record, so counters are on separate cache lines.
The service's driver counters (its publications and subscriptions) are the driver's, as for any client.
"""

from __future__ import annotations

import mmap
import os
import pathlib
import struct
from dataclasses import dataclass
from typing import Final

from logbuf import native

__all__ = ["ArchiveCounters", "COUNTERS_FILE_NAME", "Counter", "read_counters"]

COUNTERS_FILE_NAME: Final = "archive.counters"
MAGIC: Final = b"LBARCCNT"
VERSION: Final = 1
HEADER: Final = struct.Struct("<8sii q")
HEADER_LENGTH: Final = 64
RECORD_LENGTH: Final = 64
VALUE_OFFSET: Final = 0
LABEL_OFFSET: Final = 8
LABEL_MAX_LENGTH: Final = RECORD_LENGTH - LABEL_OFFSET

LABELS: Final = (
    "archive control sessions",
    "archive active recordings",
    "archive active replays",
    "archive sessions opened",
    "archive sessions closed",
    "archive recordings started",
    "archive replays started",
    "archive bytes recorded",
    "archive bytes replayed",
    "archive control requests",
    "archive control requests dropped",
    "archive errors",
    "archive authentication failures",
    "archive events dropped",
)


@dataclass
class Counter:
    buffer: mmap.mmap
    offset: int

    def increment(self, delta: int = 1) -> None:
        native.get_and_add_int64(self.buffer, self.offset, delta)

    def set(self, value: int) -> None:
        native.put_int64_ordered(self.buffer, self.offset, value)

    def get(self) -> int:
        return native.get_int64_volatile(self.buffer, self.offset)


class ArchiveCounters:
    """The service's counters file (created fresh at each start)."""

    def __init__(self, archive_dir: str | os.PathLike[str], file_mode: int = 0o600) -> None:
        self.path = pathlib.Path(archive_dir) / COUNTERS_FILE_NAME
        length = HEADER_LENGTH + RECORD_LENGTH * len(LABELS)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, file_mode)
        try:
            os.fchmod(fd, file_mode)
            os.ftruncate(fd, length)
            self._buffer = mmap.mmap(fd, length)
        finally:
            os.close(fd)
        HEADER.pack_into(self._buffer, 0, MAGIC, VERSION, len(LABELS), os.getpid())
        for i, label in enumerate(LABELS):
            encoded = label.encode()[:LABEL_MAX_LENGTH]
            start = HEADER_LENGTH + i * RECORD_LENGTH + LABEL_OFFSET
            self._buffer[start : start + len(encoded)] = encoded
        (
            self.sessions,
            self.recordings,
            self.replays,
            self.sessions_opened,
            self.sessions_closed,
            self.recordings_started,
            self.replays_started,
            self.bytes_recorded,
            self.bytes_replayed,
            self.requests,
            self.requests_dropped,
            self.errors,
            self.auth_failures,
            self.events_dropped,
        ) = (Counter(self._buffer, HEADER_LENGTH + i * RECORD_LENGTH) for i in range(len(LABELS)))

    def add_bytes_recorded(self, n: int) -> None:
        self.bytes_recorded.increment(n)

    def add_bytes_replayed(self, n: int) -> None:
        self.bytes_replayed.increment(n)

    def set_active(self, sessions: int, recordings: int, replays: int) -> None:
        self.sessions.set(sessions)
        self.recordings.set(recordings)
        self.replays.set(replays)

    def close(self) -> None:
        try:
            self._buffer.close()
        except BufferError:
            pass


def read_counters(archive_dir: str | os.PathLike[str]) -> tuple[int, dict[str, int]] | None:
    """(service pid, {label: value}) from an archive's counters file, or None if there is none."""
    path = pathlib.Path(archive_dir) / COUNTERS_FILE_NAME
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < HEADER_LENGTH:
        return None
    magic, version, count, pid = HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION or count < 0 or HEADER_LENGTH + count * RECORD_LENGTH > len(data):
        return None
    values = {}
    for i in range(count):
        start = HEADER_LENGTH + i * RECORD_LENGTH
        value = struct.unpack_from("<q", data, start + VALUE_OFFSET)[0]
        label = data[start + LABEL_OFFSET : start + RECORD_LENGTH].rstrip(b"\0").decode(errors="replace")
        values[label] = value
    return pid, values
