"""Segment files: a recording's raw log frames in files of ``segment_length`` bytes.

A recording's bytes live in ``<recordingId>-<segmentBasePosition>.rec`` files, each holding the
frames of positions ``[base, base + segment_length)`` at file offset ``position - base``, exactly
as they were in the log (DATA headers included; for a PAD frame only its 32-byte header is
written, the offset still advances by its whole length). Bytes before the start position in the
first term and past the recorded position are zero: files are created sparse at full length.

Bases follow Aeron's ``segmentFileBasePosition``: segments are laid on a grid that starts at the
start position rounded down to its term, so a segment always holds whole terms and a term never
spans two files.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pathlib
import re
from collections.abc import Iterator
from typing import Final

import numpy as np
import numpy.typing as npt

from logbuf.errors import LogbufError
from logbuf.logbuffer import log_buffer_descriptor as lbd

__all__ = [
    "DEFAULT_SEGMENT_LENGTH",
    "SEGMENT_MAX_LENGTH",
    "SEGMENT_MIN_LENGTH",
    "SegmentError",
    "SegmentReader",
    "check_segment_length",
    "effective_segment_length",
    "segment_base_position",
    "segment_file_name",
    "segment_files",
]

SEGMENT_MIN_LENGTH: Final[int] = 64 * 1024
SEGMENT_MAX_LENGTH: Final[int] = 1024 * 1024 * 1024
DEFAULT_SEGMENT_LENGTH: Final[int] = 64 * 1024 * 1024
"""Default segment length (Aeron's is 128 MiB); a recording uses max(this, term length)."""
SEGMENT_SUFFIX: Final[str] = ".rec"
_NAME = re.compile(r"^(\d+)-(\d+)\.rec$")


class SegmentError(LogbufError):
    """A segment file is missing, truncated or unreadable (the message names the file and position)."""


def segment_file_name(recording_id: int, base_position: int) -> str:
    """``<recordingId>-<segmentBasePosition>.rec``."""
    return f"{recording_id}-{base_position}{SEGMENT_SUFFIX}"


def check_segment_length(segment_length: int) -> None:
    """A power of two within 64 KiB..1 GiB, or a ValueError naming the value."""
    if not SEGMENT_MIN_LENGTH <= segment_length <= SEGMENT_MAX_LENGTH or segment_length & (segment_length - 1):
        raise ValueError(
            f"segment_length={segment_length} must be a power of two within {SEGMENT_MIN_LENGTH}..{SEGMENT_MAX_LENGTH}"
        )


def effective_segment_length(configured: int, term_length: int) -> int:
    """The segment length a recording uses: max(configured, term length) (both powers of two)."""
    check_segment_length(configured)
    lbd.check_term_length(term_length)
    return max(configured, term_length)


def segment_base_position(start_position: int, position: int, term_length: int, segment_length: int) -> int:
    """Base position of the segment holding ``position`` (Aeron's ``segmentFileBasePosition``)."""
    start_term_base = start_position - (start_position & (term_length - 1))
    length_from_base = position - start_term_base
    return start_term_base + (length_from_base - length_from_base % segment_length)


def segment_files(archive_dir: str | os.PathLike[str], recording_id: int) -> list[tuple[int, pathlib.Path]]:
    """The recording's segment files present in ``archive_dir``, as (base position, path), by base."""
    found: list[tuple[int, pathlib.Path]] = []
    prefix = f"{recording_id}-"
    for entry in os.scandir(archive_dir):
        if not entry.name.startswith(prefix):
            continue
        match = _NAME.match(entry.name)
        if match and int(match.group(1)) == recording_id:
            found.append((int(match.group(2)), pathlib.Path(entry.path)))
    found.sort()
    return found


class SegmentReader:
    """Read-only mappings of one recording's segment files, opened as positions need them.

    ``term_view(position)`` gives the bytes of the term holding ``position`` as mapped (a full
    term, or less if the file is truncated), from the term's start. Mappings stay open until
    :meth:`close`; a file that is missing raises :class:`SegmentError` naming it.
    """

    def __init__(
        self,
        archive_dir: str | os.PathLike[str],
        recording_id: int,
        start_position: int,
        term_length: int,
        segment_length: int,
    ) -> None:
        self.archive_dir = pathlib.Path(archive_dir)
        self.recording_id = recording_id
        self.start_position = start_position
        self.term_length = term_length
        self.segment_length = segment_length
        self._maps: dict[int, mmap.mmap | None] = {}

    def base_of(self, position: int) -> int:
        return segment_base_position(self.start_position, position, self.term_length, self.segment_length)

    def path_of(self, base_position: int) -> pathlib.Path:
        return self.archive_dir / segment_file_name(self.recording_id, base_position)

    def segment(self, base_position: int) -> mmap.mmap | None:
        """The mapped file (None if it is empty); raises SegmentError if it does not exist."""
        if base_position in self._maps:
            return self._maps[base_position]
        path = self.path_of(base_position)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise SegmentError(f"segment file {path} is missing") from None
        try:
            size = min(os.fstat(fd).st_size, self.segment_length)
            mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size > 0 else None
        finally:
            os.close(fd)
        self._maps[base_position] = mapped
        return mapped

    def term_view(self, position: int) -> memoryview:
        """The mapped bytes of the term holding ``position``, from the term's start (maybe short)."""
        base = self.base_of(position)
        mapped = self.segment(base)
        term_start = (position - (position & (self.term_length - 1))) - base
        if mapped is None:
            return memoryview(b"")
        end = min(term_start + self.term_length, len(mapped))
        return memoryview(mapped)[term_start : max(term_start, end)]

    def read(self, position: int, length: int) -> bytes:
        """Copy ``length`` bytes from ``position`` (within one term); short if the file is."""
        view = self.term_view(position)
        offset = position & (self.term_length - 1)
        with view:
            return bytes(view[offset : offset + length])

    def close(self) -> None:
        for mapped in self._maps.values():
            if mapped is not None:
                try:
                    mapped.close()
                except BufferError:  # a view is still held by the caller: the mapping goes with it
                    pass
        self._maps.clear()

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def mapped_segment(path: str | os.PathLike[str], segment_length: int) -> Iterator[npt.NDArray[np.uint8]]:
    """A segment file mapped read-only as a uint8 array of at most ``segment_length`` bytes (empty for
    an empty file); FileNotFoundError if it is missing. The mapping is closed on leaving the block,
    or, if an array still refers to it then, when the last such array goes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = min(os.fstat(fd).st_size, segment_length)
        mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size > 0 else None
    finally:
        os.close(fd)
    try:
        yield np.frombuffer(mapped, dtype=np.uint8) if mapped is not None else np.zeros(0, np.uint8)
    finally:
        if mapped is not None:
            try:
                mapped.close()
            except BufferError:  # an array still refers to it: the mapping goes with it
                pass
