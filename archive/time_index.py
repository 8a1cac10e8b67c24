"""Time index: ``<recordingId>.times``, the reserved-value bounds of each complete segment of a recording,
and ``<recordingId>.appended``, the time the recorder appended each run of frames (see
:class:`AppendTimesWriter`; the Spark source's default ``timestamp``, Kafka's log-append time).

What lets a timestamp filter skip segments. The Spark source's ``timestamp`` is a frame's reserved value
in a unit (``timestampUnit``), and reserved values are the publisher's, in no particular order, so the
catalog cannot bound them; this file does, one entry per segment, written once the segment is complete.

File (little-endian; a header, then entries appended one at a time)::

    +---------------------------------------------------------------+
    |                       Magic "LBTI" (int32)                    |   0
    +---------------------------------------------------------------+
    |                         Version (int32)                       |   4
    +---------------------------------------------------------------+
    |                      Header Length (int32)                    |   8
    +---------------------------------------------------------------+
    |                      Entry Length (int32)                     |  12
    +---------------------------------------------------------------+
    |                      Recording Id (int64)                     |  16
    +---------------------------------------------------------------+
    |                       8 bytes reserved                        |  24
    +---------------------------------------------------------------+

Entry (one per complete segment)::

    +---------------------------------------------------------------+
    |                 Segment Base Position (int64)                 |   0
    +---------------------------------------------------------------+
    |   Stamped Frames (int64): DATA frames with a reserved value   |   8
    |   other than 0 (0 gives a null timestamp)                     |
    +---------------------------------------------------------------+
    |              Least Reserved Value of those (int64)            |  16
    +---------------------------------------------------------------+
    |            Greatest Reserved Value of those (int64)           |  24
    +---------------------------------------------------------------+

Rules: an entry is appended (one ``pwrite`` at the file's end) only after every byte of its segment is
written, so a segment with an entry never changes; a segment without one (the one being written, or one
of an archive recorded before this file existed) is read, never skipped. A torn last entry (a crash
mid-write) is ignored. A file with another magic or version is ignored as a whole: it can cost pruning,
never rows. Two entries for the same segment are merged (the wider bounds), so building the index again
is harmless.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from logbuf import native
from logbuf.errors import LogbufError

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from logbuf.archive.catalog import RecordingDescriptor

__all__ = [
    "APPEND_RESOLUTION_US",
    "AppendTimes",
    "AppendTimesWriter",
    "ENTRY_LENGTH",
    "HEADER_LENGTH",
    "BoundsBuilder",
    "SegmentTimes",
    "TimeIndexError",
    "append_entry",
    "append_times_file_name",
    "decode_append_times",
    "build_index",
    "decode_index",
    "encode_header",
    "read_index_file",
    "segment_may_match",
    "time_index_file_name",
]

TIME_INDEX_SUFFIX: Final[str] = ".times"
MAGIC: Final[int] = 0x4954424C  # "LBTI" little-endian
VERSION: Final[int] = 1

# -- header -----------------------------------------------------------------------------------------
MAGIC_OFFSET: Final[int] = 0
VERSION_OFFSET: Final[int] = MAGIC_OFFSET + 4
HEADER_LENGTH_OFFSET: Final[int] = VERSION_OFFSET + 4
ENTRY_LENGTH_OFFSET: Final[int] = HEADER_LENGTH_OFFSET + 4
RECORDING_ID_OFFSET: Final[int] = ENTRY_LENGTH_OFFSET + 4
HEADER_LENGTH: Final[int] = 32
HEADER: Final[struct.Struct] = struct.Struct("<iiiiq8x")

# -- entry --------------------------------------------------------------------------------------------
BASE_POSITION_OFFSET: Final[int] = 0
STAMPED_FRAMES_OFFSET: Final[int] = BASE_POSITION_OFFSET + 8
MIN_RESERVED_OFFSET: Final[int] = STAMPED_FRAMES_OFFSET + 8
MAX_RESERVED_OFFSET: Final[int] = MIN_RESERVED_OFFSET + 8
ENTRY_LENGTH: Final[int] = MAX_RESERVED_OFFSET + 8
ENTRY: Final[struct.Struct] = struct.Struct("<qqqq")


class TimeIndexError(LogbufError, ValueError):
    """A time index file that cannot be used (the message names the file and why)."""


def time_index_file_name(recording_id: int) -> str:
    """``<recordingId>.times``."""
    return f"{recording_id}{TIME_INDEX_SUFFIX}"


@dataclass(frozen=True)
class SegmentTimes:
    """The reserved values of one complete segment's DATA frames (those other than 0)."""

    base_position: int
    stamped_frames: int
    min_reserved: int
    max_reserved: int

    def merged(self, other: SegmentTimes) -> SegmentTimes:
        if not self.stamped_frames:
            return other
        if not other.stamped_frames:
            return self
        return SegmentTimes(
            self.base_position,
            self.stamped_frames + other.stamped_frames,
            min(self.min_reserved, other.min_reserved),
            max(self.max_reserved, other.max_reserved),
        )


def encode_header(recording_id: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, HEADER_LENGTH, ENTRY_LENGTH, recording_id)


def encode_entry(times: SegmentTimes) -> bytes:
    return ENTRY.pack(times.base_position, times.stamped_frames, times.min_reserved, times.max_reserved)


def decode_index(data: bytes, recording_id: int, name: str = "time index") -> dict[int, SegmentTimes]:
    """Entries by segment base position. TimeIndexError (naming ``name``) for a file this version
    cannot read or one of another recording; a torn last entry is left out."""
    if len(data) < HEADER_LENGTH:
        raise TimeIndexError(f"{name}: {len(data)} bytes, shorter than its {HEADER_LENGTH}-byte header")
    magic, version, header_length, entry_length, rid = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise TimeIndexError(f"{name}: magic {magic:#x} is not {MAGIC:#x}")
    if version != VERSION or header_length != HEADER_LENGTH or entry_length != ENTRY_LENGTH:
        raise TimeIndexError(
            f"{name}: version {version} (header {header_length}, entry {entry_length} bytes) is not "
            f"version {VERSION} ({HEADER_LENGTH}, {ENTRY_LENGTH})"
        )
    if rid != recording_id:
        raise TimeIndexError(f"{name}: holds recording {rid}, not {recording_id}")
    found: dict[int, SegmentTimes] = {}
    for offset in range(HEADER_LENGTH, len(data) - ENTRY_LENGTH + 1, ENTRY_LENGTH):
        times = SegmentTimes(*ENTRY.unpack_from(data, offset))
        if times.stamped_frames < 0 or (times.stamped_frames and times.min_reserved > times.max_reserved):
            raise TimeIndexError(f"{name}: entry at offset {offset} is impossible: {times}")
        previous = found.get(times.base_position)
        found[times.base_position] = times if previous is None else previous.merged(times)
    return found


def append_entry(fd: int, recording_id: int, times: SegmentTimes) -> None:
    """Append one entry to an open index file (``O_RDWR``), writing its header first if it is empty.
    A torn entry left by a crash is overwritten: entries start at whole entry offsets."""
    size = os.fstat(fd).st_size
    if size < HEADER_LENGTH:
        os.pwrite(fd, encode_header(recording_id), 0)
        size = HEADER_LENGTH
    offset = size - (size - HEADER_LENGTH) % ENTRY_LENGTH
    os.pwrite(fd, encode_entry(times), offset)


class BoundsBuilder:
    """Running bounds of the reserved values in blocks of whole frames (a recorder's block, a term).

    :meth:`add` is one native call (:func:`logbuf.native.reserved_value_bounds`): one walk of the block's
    frame chain, no Python work per frame.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.stamped = 0
        self.low = 0
        self.high = 0

    def add(self, block: Buffer) -> None:
        """Take the DATA frames of ``block`` (whole frames from a frame start; a length of 0 ends it)."""
        count, low, high = native.reserved_value_bounds(block)
        if not count:
            return
        if self.stamped:
            low, high = min(low, self.low), max(high, self.high)
        self.stamped += count
        self.low, self.high = low, high

    def times(self, base_position: int) -> SegmentTimes:
        return SegmentTimes(base_position, self.stamped, self.low, self.high)


def segment_may_match(
    times: SegmentTimes | None,
    low_us: int | None,
    high_us: int | None,
    values_us: frozenset[int] | None,
    to_us: tuple[int, int],
    spark_range_us: tuple[int, int],
) -> bool:
    """Whether a segment may hold a row whose timestamp is within ``[low_us, high_us]`` (None:
    unbounded) and, if given, in ``values_us``. ``to_us`` is (multiply, divide): a row's timestamp is
    ``reserved * multiply // divide`` µs, as the reader computes it. A segment without an entry may; one
    with no stamped frame holds only null timestamps, which no comparison keeps; one whose bounds fall
    outside ``spark_range_us`` is kept, so that the reader reports the wrong unit as it would unfiltered."""
    if times is None:
        return True
    if not times.stamped_frames:
        return False
    multiply, divide = to_us
    first, last = times.min_reserved * multiply // divide, times.max_reserved * multiply // divide
    if first < spark_range_us[0] or last > spark_range_us[1]:
        return True
    if (low_us is not None and last < low_us) or (high_us is not None and first > high_us):
        return False
    return values_us is None or any(first <= v <= last for v in values_us)


def read_index_file(path: str | os.PathLike[str], recording_id: int) -> dict[int, SegmentTimes]:
    """A local index file's entries ({} if there is none)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    return decode_index(data, recording_id, os.fspath(path))


def build_index(archive_dir: str | os.PathLike[str], d: RecordingDescriptor) -> list[SegmentTimes]:
    """Append entries for the complete segments of a stopped recording that have none (an archive
    recorded before the index existed); returns them. The recording is checked with verify's rules
    first: if its frame chain is broken nothing is indexed, since the reader would resume after the
    damage at frames a walk from here would not see."""
    from logbuf.archive.segments import mapped_segment, segment_base_position, segment_file_name
    from logbuf.archive.verify import verify_recording

    if d.active or d.stop_position <= d.start_position:
        return []
    path = os.path.join(os.fspath(archive_dir), time_index_file_name(d.recording_id))
    try:
        existing = read_index_file(path, d.recording_id)
    except TimeIndexError:
        return []  # a file this version cannot extend: leave it as it is
    if not verify_recording(archive_dir, d).ok:
        return []
    added: list[SegmentTimes] = []
    builder = BoundsBuilder()
    base = segment_base_position(d.start_position, d.start_position, d.term_length, d.segment_length)
    with contextlib.ExitStack() as stack:
        fd = -1
        while base < d.stop_position:
            if base not in existing:
                name = os.path.join(os.fspath(archive_dir), segment_file_name(d.recording_id, base))
                builder.reset()
                with mapped_segment(name, d.segment_length) as segment:
                    begin = max(base, d.start_position)
                    end = min(base + d.segment_length, d.stop_position)
                    while begin < end:  # a term at a time: each starts with a frame
                        term_end = min(end, begin - begin % d.term_length + d.term_length)
                        builder.add(memoryview(segment[begin - base : term_end - base]))  # type: ignore[arg-type]
                        begin = term_end
                    del segment
                if fd < 0:  # with the segment files' mode (the archive's sharing, as the recorder set it)
                    mode = os.stat(name).st_mode & 0o777
                    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
                    stack.callback(os.close, fd)
                    if os.fstat(fd).st_size == 0:
                        os.fchmod(fd, mode)
                times = builder.times(base)
                append_entry(fd, d.recording_id, times)
                added.append(times)
            base += d.segment_length
    return added


# -- append times -------------------------------------------------------------------------------------------
APPEND_TIMES_SUFFIX: Final[str] = ".appended"
APPEND_MAGIC: Final[int] = 0x4154424C  # "LBTA" little-endian
APPEND_VERSION: Final[int] = 1
APPEND_ENTRY: Final[struct.Struct] = struct.Struct("<qq")
APPEND_ENTRY_LENGTH: Final[int] = APPEND_ENTRY.size
APPEND_RESOLUTION_US: Final[int] = 1_000
"""A new entry when the recorder's clock has moved this far since the last one (Kafka's log append time
is in milliseconds too): at most 16 bytes per millisecond of recording."""


def append_times_file_name(recording_id: int) -> str:
    """``<recordingId>.appended``: when the recorder appended each run of frames (the append-time index)."""
    return f"{recording_id}{APPEND_TIMES_SUFFIX}"


class AppendTimesWriter:
    """The recorder's side of the append-time index.

    File: a header laid out as the ``.times`` one (magic "LBTA", its own version, entry length 16), then
    entries of (position: int64, append time: int64 epoch microseconds by the recorder's clock), in
    position order. An entry says: the frames from ``position`` up to the next entry's position were
    appended (written to their segment) at that time. Entries are made at block starts (frame
    boundaries), and :meth:`on_block` writes one *before* the catalog's stop position moves past its
    frames, so every recorded frame is covered. Times never go back (a clock step back repeats the last
    time), so a time range is a position range.
    """

    def __init__(self, path: str | os.PathLike[str], recording_id: int, file_mode: int) -> None:
        self._path = path
        self._recording_id = recording_id
        self._file_mode = file_mode
        self._fd = -1
        self._last_us = -1
        self._offset = HEADER_LENGTH

    def on_block(self, position: int, now_us: int) -> None:
        """A block starting at ``position`` is being appended at ``now_us``."""
        if self._last_us >= 0 and now_us - self._last_us < APPEND_RESOLUTION_US:
            return
        now_us = max(now_us, self._last_us)
        if self._fd < 0:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, self._file_mode)
            os.fchmod(self._fd, self._file_mode)
            header = HEADER.pack(APPEND_MAGIC, APPEND_VERSION, HEADER_LENGTH, APPEND_ENTRY_LENGTH, self._recording_id)
            os.pwrite(self._fd, header, 0)
        os.pwrite(self._fd, APPEND_ENTRY.pack(position, now_us), self._offset)
        self._offset += APPEND_ENTRY_LENGTH
        self._last_us = now_us

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class AppendTimes:
    """Append-time entries as arrays: ``position[i]`` (ascending) and ``time_us[i]`` (never decreasing)."""

    position: npt.NDArray[np.int64]
    time_us: npt.NDArray[np.int64]

    def of_rows(self, row_end: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """(append time in epoch µs, known) of rows ending at ``row_end``: the entry at or before the row's
        last frame; a row before the first entry has none."""
        i = np.searchsorted(self.position, row_end - 1, side="right") - 1
        known = i >= 0
        return self.time_us[np.maximum(i, 0)] if len(self.time_us) else np.zeros(len(row_end), np.int64), known

    def first_position_at_or_after(self, time_us: int) -> int | None:
        """The position of the first entry appended at or after ``time_us`` (None: none is)."""
        i = int(np.searchsorted(self.time_us, time_us, side="left"))
        return int(self.position[i]) if i < len(self.position) else None


def decode_append_times(data: Buffer, recording_id: int, name: str = "append-time index") -> AppendTimes:
    """The entries of an append-time index file (a torn last entry left out); TimeIndexError naming
    ``name`` for another format or recording."""
    view = memoryview(data)
    if len(view) < HEADER_LENGTH:
        raise TimeIndexError(f"{name}: {len(view)} bytes, shorter than its {HEADER_LENGTH}-byte header")
    magic, version, header_length, entry_length, rid = HEADER.unpack_from(view)
    if (magic, version, header_length, entry_length) != (
        APPEND_MAGIC,
        APPEND_VERSION,
        HEADER_LENGTH,
        APPEND_ENTRY_LENGTH,
    ):
        raise TimeIndexError(
            f"{name}: magic {magic:#x} version {version} is not an append-time index version {APPEND_VERSION}"
        )
    if rid != recording_id:
        raise TimeIndexError(f"{name}: holds recording {rid}, not {recording_id}")
    n = (len(view) - HEADER_LENGTH) // APPEND_ENTRY_LENGTH
    entries = np.frombuffer(view, dtype="<i8", count=2 * n, offset=HEADER_LENGTH).reshape(n, 2)
    return AppendTimes(entries[:, 0], entries[:, 1])  # views: a mapped file is read where it is needed
