"""The loss report (``loss-report.dat``): the driver's writer and the tools' reader.

Layout and ordering rules: :mod:`logbuf.conduit.loss_report_descriptor` (Aeron's ``LossReport``). The
driver maps the file with :meth:`LossReportFile.create` and hands a :class:`LossReport` to its
images; ``logbuf-stat --loss`` reads any driver's file (logbuf's or Aeron's) with
:func:`read_loss_report`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from logbuf import native
from logbuf.conduit import loss_report_descriptor as lrd
from logbuf.errors import ShmError
from logbuf.shm import Segment

PAGE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class LossEntry:
    """One stream's loss as a reader saw it."""

    observation_count: int
    total_bytes_lost: int
    first_observation_ms: int
    last_observation_ms: int
    session_id: int
    stream_id: int
    channel: str
    source: str
    offset: int
    """Where the entry starts in the file."""


class LossReport:
    """Writes entries into a loss-report buffer; one writer (the receiver's duty cycle) at a time.

    :meth:`create_entry` returns the entry's offset, or -1 when the buffer is full (the caller then
    stops reporting that image, as Aeron does); :meth:`record_observation` updates an entry.
    """

    def __init__(self, buffer: memoryview, clock_ms: Callable[[], int]) -> None:
        lrd.check_loss_report_length(len(buffer))
        self.buffer = buffer
        self.clock_ms = clock_ms
        self.next_offset = _end_of_entries(buffer)
        """Where the next entry goes: after any already there (a report reopened in place)."""

    @property
    def capacity(self) -> int:
        return len(self.buffer)

    def create_entry(
        self, bytes_lost: int, session_id: int, stream_id: int, channel: str, source: str, now_ms: int | None = None
    ) -> int:
        """A new entry with its first observation; its offset, or -1 if it does not fit."""
        encoded_channel = channel.encode("ascii", "replace")
        encoded_source = source.encode("ascii", "replace")
        length = lrd.entry_length(len(encoded_channel), len(encoded_source))
        offset = self.next_offset
        if length > self.capacity - offset:
            return -1
        now_ms = self.clock_ms() if now_ms is None else now_ms
        buffer = self.buffer
        lrd.ENTRY_HEADER.pack_into(buffer, offset, 0, bytes_lost, now_ms, now_ms, session_id, stream_id)
        channel_at = offset + lrd.CHANNEL_OFFSET
        lrd.LENGTH_FIELD.pack_into(buffer, channel_at, len(encoded_channel))
        buffer[channel_at + 4 : channel_at + 4 + len(encoded_channel)] = encoded_channel
        source_at = offset + lrd.source_length_offset(len(encoded_channel))
        lrd.LENGTH_FIELD.pack_into(buffer, source_at, len(encoded_source))
        buffer[source_at + 4 : source_at + 4 + len(encoded_source)] = encoded_source
        native.put_int64_ordered(buffer, offset + lrd.OBSERVATION_COUNT_OFFSET, 1)  # publishes the entry
        self.next_offset = offset + lrd.align(length, lrd.ENTRY_ALIGNMENT)
        return offset

    def record_observation(self, offset: int, bytes_lost: int, now_ms: int | None = None) -> None:
        """One more observation of ``bytes_lost`` bytes on the entry at ``offset`` (ignored if < 0)."""
        if offset < 0:
            return
        buffer = self.buffer
        native.put_int64_ordered(
            buffer, offset + lrd.LAST_OBSERVATION_OFFSET, self.clock_ms() if now_ms is None else now_ms
        )
        native.get_and_add_int64(buffer, offset + lrd.TOTAL_BYTES_LOST_OFFSET, bytes_lost)
        native.get_and_add_int64(buffer, offset + lrd.OBSERVATION_COUNT_OFFSET, 1)


def _end_of_entries(buffer: memoryview) -> int:
    end = 0
    for entry in iter_entries(buffer):
        end = entry.offset + lrd.align(
            lrd.entry_length(
                len(entry.channel.encode("ascii", "replace")), len(entry.source.encode("ascii", "replace"))
            ),
            lrd.ENTRY_ALIGNMENT,
        )
    return end


def _get_int64(buffer: memoryview, offset: int) -> int:
    return int(native.get_int64_volatile(buffer, offset))


def iter_entries(buffer: memoryview) -> Iterator[LossEntry]:
    """The entries in a loss-report buffer, in order, up to the first with no observation.

    Lengths read from the file are not trusted: an entry whose channel or source runs past the
    buffer (or is longer than :data:`~logbuf.conduit.loss_report_descriptor.MAX_STRING_LENGTH`)
    ends the report.
    """
    capacity = len(buffer)
    offset = 0
    while offset + lrd.ENTRY_HEADER_LENGTH + lrd.LENGTH_FIELD.size <= capacity:
        count = _get_int64(buffer, offset + lrd.OBSERVATION_COUNT_OFFSET)
        if count <= 0:
            return
        _, total, first, _, session_id, stream_id = lrd.ENTRY_HEADER.unpack_from(buffer, offset)
        last = _get_int64(buffer, offset + lrd.LAST_OBSERVATION_OFFSET)
        channel_length = lrd.LENGTH_FIELD.unpack_from(buffer, offset + lrd.CHANNEL_OFFSET)[0]
        if not 0 <= channel_length <= lrd.MAX_STRING_LENGTH:
            return
        source_at = offset + lrd.source_length_offset(channel_length)
        if source_at + lrd.LENGTH_FIELD.size > capacity:
            return
        source_length = lrd.LENGTH_FIELD.unpack_from(buffer, source_at)[0]
        if not 0 <= source_length <= lrd.MAX_STRING_LENGTH or source_at + 4 + source_length > capacity:
            return
        channel_at = offset + lrd.CHANNEL_OFFSET + 4
        channel = bytes(buffer[channel_at : channel_at + channel_length]).decode("ascii", "replace")
        source = bytes(buffer[source_at + 4 : source_at + 4 + source_length]).decode("ascii", "replace")
        yield LossEntry(count, total, first, last, session_id, stream_id, channel, source, offset)
        offset += lrd.align(lrd.entry_length(channel_length, source_length), lrd.ENTRY_ALIGNMENT)


def read_loss_report(buffer: memoryview) -> list[LossEntry]:
    return list(iter_entries(buffer))


def loss_report_path(directory: str) -> str:
    return os.path.join(directory, lrd.LOSS_REPORT_FILE)


class LossReportFile:
    """``loss-report.dat`` mapped: created by a driver (zeroed, page-aligned length) or opened to read."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.buffer = memoryview(segment.buffer)

    @property
    def path(self) -> str:
        return self.segment.name

    @classmethod
    def create(
        cls, directory: str, length: int = lrd.DEFAULT_LOSS_REPORT_LENGTH, *, mode: int = 0o600
    ) -> LossReportFile:
        """A new, zeroed report of ``length`` rounded up to the page size (as Aeron sizes it)."""
        return cls(Segment.create_file(loss_report_path(directory), lrd.align(length, PAGE_SIZE), mode=mode))

    @classmethod
    def open(cls, directory: str) -> LossReportFile:
        """Map an existing report read-only (a reader needs no write permission)."""
        path = loss_report_path(directory)
        try:
            return cls(Segment.open_file(path, writable=False))
        except (ShmError, OSError) as e:
            raise LossReportError(f"cannot read the loss report {path}: {e}") from None

    def entries(self) -> list[LossEntry]:
        return read_loss_report(self.buffer)

    def close(self) -> None:
        self.buffer.release()
        self.segment.close()

    def __enter__(self) -> LossReportFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LossReportError(ShmError):
    """The loss report is missing or cannot be read."""
