"""LogBuffers: one stream's log (3 terms + metadata) in a mapped shared-memory segment."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

from logbuf import native
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.shm import OWNER_ONLY, Segment

_MAX_INT64 = (1 << 63) - 1
DEFAULT_TERM_LENGTH = 16 * 1024 * 1024


@dataclass(frozen=True)
class LogParams:
    """A new log's parameters; :meth:`check` validates them, naming the parameter and value."""

    term_length: int = DEFAULT_TERM_LENGTH
    mtu_length: int = dh.DEFAULT_MTU_LENGTH
    session_id: int = 0
    stream_id: int = 0
    initial_term_id: int = 0
    correlation_id: int = 0
    page_size: int = lbd.PAGE_MIN_SIZE
    term_window_length: int = 0

    def check(self) -> LogParams:
        lbd.check_term_length(self.term_length)
        lbd.check_page_size(self.page_size)
        dh.check_mtu_length(self.mtu_length, self.term_length)
        for field in ("session_id", "stream_id", "initial_term_id"):
            value = getattr(self, field)
            if not -(1 << 31) <= value < (1 << 31):
                raise lbd.LogBufferError(f"{field}={value} is not a 32-bit signed integer")
        window = self.term_window_length
        if window and not self.mtu_length <= window <= self.term_length // 2:
            raise lbd.LogBufferError(
                f"term_window_length={window} must be within mtu_length..term_length/2 ({self.term_length // 2})"
            )
        return self

    @property
    def log_length(self) -> int:
        return lbd.compute_log_length(self.term_length, self.page_size)

    def initialise(self, buf: mmap.mmap) -> None:
        """Write a new log's metadata: tails, term count, parameters, default header; EOS = max."""
        meta_off = lbd.metadata_offset(self.term_length)
        struct.pack_into(
            "=qiiiiiii",
            buf,
            meta_off + lbd.LOG_CORRELATION_ID_OFFSET,
            self.correlation_id,
            self.initial_term_id,
            dh.HEADER_LENGTH,
            self.mtu_length,
            self.term_length,
            self.page_size,
            self.term_window_length or self.term_length // 2,
            0,
        )
        dh.HEADER.pack_into(
            buf,
            meta_off + lbd.LOG_DEFAULT_FRAME_HEADER_OFFSET,
            0,
            dh.CURRENT_VERSION,
            dh.UNFRAGMENTED,
            dh.HDR_TYPE_DATA,
            0,
            self.session_id,
            self.stream_id,
            self.initial_term_id,
            0,
        )
        struct.pack_into("=q", buf, meta_off + lbd.LOG_END_OF_STREAM_POSITION_OFFSET, _MAX_INT64)
        for index in range(1, lbd.PARTITION_COUNT):
            tail = lbd.pack_tail(self.initial_term_id - lbd.PARTITION_COUNT + index, 0)
            struct.pack_into("=q", buf, meta_off + 8 * index, tail)
        native.put_int32_ordered(buf, meta_off + lbd.LOG_ACTIVE_TERM_COUNT_OFFSET, 0)
        native.put_int64_ordered(buf, meta_off + lbd.TERM_TAIL_COUNTERS_OFFSET, lbd.pack_tail(self.initial_term_id, 0))


class LogBuffers:
    """A log buffer mapped in this process. Create it once, open it from any process.

    ``view`` is the native :class:`~logbuf.native.LogView` that publications and images use.
    """

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.view = native.LogView(segment.buffer)
        self.term_length: int = self.view.term_length
        self.mtu_length: int = self.view.mtu_length
        self.initial_term_id: int = self.view.initial_term_id
        self.position_bits_to_shift: int = self.view.position_bits_to_shift
        meta = self.view.metadata()
        self.page_size: int = struct.unpack_from("=i", meta, lbd.LOG_PAGE_SIZE_OFFSET)[0]
        self.correlation_id: int = struct.unpack_from("=q", meta, lbd.LOG_CORRELATION_ID_OFFSET)[0]
        self.term_window_length: int = struct.unpack_from("=i", meta, lbd.LOG_PUBLICATION_WINDOW_LENGTH_OFFSET)[0]
        (_, _, _, _, _, self.session_id, self.stream_id, _, _) = dh.HEADER.unpack_from(
            meta, lbd.LOG_DEFAULT_FRAME_HEADER_OFFSET
        )
        self._meta = meta  # kept for the per-duty-cycle reads (tail_position); released by close()
        self.terms: tuple[memoryview, ...] = tuple(self.view.term_buffer(i) for i in range(lbd.PARTITION_COUNT))
        """Writable views of the three terms, for per-datagram work; released by close()."""

    @property
    def name(self) -> str:
        return self.segment.name

    @classmethod
    def create(cls, name: str, *, mode: int = OWNER_ONLY, **params: int) -> LogBuffers:
        """Create and initialise a new log in POSIX shared memory; fails if ``name`` exists.

        ``params``: the fields of :class:`LogParams`.
        """
        log_params = LogParams(**params).check()
        segment = Segment.create(name, log_params.log_length, mode=mode)
        log_params.initialise(segment.buffer)
        return cls(segment)

    @classmethod
    def create_file(cls, path: str, *, mode: int = OWNER_ONLY, **params: int) -> LogBuffers:
        """Create and initialise a new log as a file (a media driver's logs, under /dev/shm)."""
        log_params = LogParams(**params).check()
        segment = Segment.create_file(path, log_params.log_length, mode=mode)
        log_params.initialise(segment.buffer)
        return cls(segment)

    @classmethod
    def open_file(cls, path: str, *, populate: bool = False) -> LogBuffers:
        """Map an existing log file; ``populate``: fault every page in now (:func:`logbuf.shm.populate_mapping`)."""
        segment = Segment.open_file(path, populate=populate)
        try:
            return cls(segment)
        except ValueError as e:
            segment.close()
            raise lbd.LogBufferError(f"file {path!r} is not a valid log buffer: {e}") from e

    def seek_to(self, term_id: int, term_offset: int) -> None:
        """Start a fresh log at ``term_id``/``term_offset`` (channel init-term-id/term-id/term-offset)."""
        if term_offset % dh.FRAME_ALIGNMENT or not 0 <= term_offset <= self.term_length:
            raise lbd.LogBufferError(f"term_offset={term_offset} must be a multiple of 32 within the term")
        count = lbd._int32(term_id - self.initial_term_id)
        if count < 0:
            raise lbd.LogBufferError(f"term_id={term_id} is before initial_term_id={self.initial_term_id}")
        index = lbd.index_by_term_count(count)
        with self.metadata() as meta:
            for k in (1, 2):
                other = (index + k) % lbd.PARTITION_COUNT
                struct.pack_into("=q", meta, 8 * other, lbd.pack_tail(term_id + k - lbd.PARTITION_COUNT, 0))
            struct.pack_into("=q", meta, 8 * index, lbd.pack_tail(term_id, term_offset))
            native.put_int32_ordered(meta, lbd.LOG_ACTIVE_TERM_COUNT_OFFSET, count)

    @classmethod
    def open(cls, name: str) -> LogBuffers:
        """Map an existing log by name."""
        segment = Segment.open(name)
        try:
            return cls(segment)
        except ValueError as e:
            segment.close()
            raise lbd.LogBufferError(f"shared memory {name!r} is not a valid log buffer: {e}") from e

    # -- metadata accessors ------------------------------------------------------------------------
    def metadata(self) -> memoryview:
        """Writable view of the metadata section (release it when done)."""
        return self.view.metadata()

    def term_buffer(self, index: int) -> memoryview:
        """Writable view of term partition ``index``."""
        return self.view.term_buffer(index)

    def active_term_count(self) -> int:
        with self.metadata() as meta:
            return lbd.active_term_count_volatile(meta)

    def raw_tail(self, index: int) -> int:
        with self.metadata() as meta:
            return lbd.raw_tail_volatile(meta, index)

    def position_of(self, term_id: int, term_offset: int) -> int:
        """Stream position of ``term_offset`` in term ``term_id`` (term ids wrap as int32)."""
        return lbd.compute_position(term_id, term_offset, self.position_bits_to_shift, self.initial_term_id)

    def term_of(self, position: int) -> tuple[int, int]:
        """(term id, term offset) of a stream position."""
        return (
            lbd.compute_term_id_from_position(position, self.position_bits_to_shift, self.initial_term_id),
            position & (self.term_length - 1),
        )

    def tail_position(self) -> int:
        """Position of the active term's tail (where the next claim starts)."""
        meta = self._meta
        count = lbd.active_term_count_volatile(meta)
        raw = lbd.raw_tail_volatile(meta, lbd.index_by_term_count(count))
        return lbd.compute_position(
            lbd.term_id(raw), lbd.term_offset(raw, self.term_length), self.position_bits_to_shift, self.initial_term_id
        )

    def is_connected(self) -> bool:
        with self.metadata() as meta:
            return lbd.is_connected_volatile(meta)

    def set_connected(self, connected: bool) -> None:
        with self.metadata() as meta:
            native.put_int32_ordered(meta, lbd.LOG_IS_CONNECTED_OFFSET, 1 if connected else 0)

    def end_of_stream_position(self) -> int:
        with self.metadata() as meta:
            return lbd.end_of_stream_position_volatile(meta)

    def set_end_of_stream_position(self, position: int) -> None:
        with self.metadata() as meta:
            native.put_int64_ordered(meta, lbd.LOG_END_OF_STREAM_POSITION_OFFSET, position)

    def clean(self, from_position: int, to_position: int) -> int:
        """Zero the log between two positions (wrapping through the partitions); returns bytes zeroed."""
        cleaned = 0
        position = from_position
        mask = self.term_length - 1
        while position < to_position:
            index = lbd.index_by_position(position, self.position_bits_to_shift)
            offset = position & mask
            length = min(self.term_length - offset, to_position - position)
            with self.term_buffer(index) as term:
                native.term_clean(term, offset, length)
            position += length
            cleaned += length
        return cleaned

    def close(self) -> None:
        """Unmap (publications and images over this log must be closed first)."""
        self._meta.release()
        for term in self.terms:
            term.release()
        self.view.close()
        self.segment.close()

    def unlink(self) -> None:
        Segment.unlink(self.segment.name)

    def __enter__(self) -> LogBuffers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"LogBuffers(name={self.name!r}, term_length={self.term_length}, mtu_length={self.mtu_length}, "
            f"session_id={self.session_id}, stream_id={self.stream_id}, initial_term_id={self.initial_term_id})"
        )
