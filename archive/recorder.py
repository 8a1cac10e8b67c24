"""The recorder: subscribes like any client and writes each image's raw frames to segment files.

Theory of operation
-------------------
``Recorder`` runs in its own process (``logbuf-archive record``). It connects to the media
driver with the client API, adds one subscription, and starts a :class:`RecordingSession` for
each image (publisher session) as it becomes available, from the image's join position. A session
block-polls its image (whole raw frames, headers included, never crossing a term) and writes each
block at file offset ``position - segment base`` of the segment file for that position, then
release-stores the new stop position in the catalog. The block's first frame length goes to the
file last, so a crash mid-block leaves "no frame here" where the block began, which is what the
prefix recovery walks up to. A PAD frame is written as its 32-byte header only. With record
checksums (``RecorderContext.checksum``) each block is copied and every DATA frame's session id
field is replaced by its payload's CRC-32 before the write (:mod:`archive.checksum`). The reserved
values of each segment's DATA frames are bounded as the blocks go by, and when a segment is complete
its bounds are appended to the recording's time index (:mod:`archive.time_index`), which lets a reader
skip segments outside a time range. The time each block is appended (this process's clock, at most one
entry per millisecond) goes to the append-time index before the stop position moves past the block:
the Spark source's default ``timestamp``, as Kafka's log-append time; the frames stay as they were.

Keeping up: the recorder's subscriber position is an ordinary ``sub-pos`` counter, so a recorder
that falls a term window behind back-pressures the publishers; nothing is dropped.

Lifecycle: an image that goes away (publication closed and drained, or a UDP image timing out) is
drained and its recording stopped. If the driver dies, every image is drained (the logs stay
mapped), the recordings are stopped, and the recorder reconnects when a driver is back, starting
new recordings for the new images. ``stop()`` (SIGTERM/SIGINT in the CLI) stops all recordings.
A recording that cannot start (the catalog cannot take its entry: a full filesystem) is logged at
error level (``recording.start_failed``, naming the catalog and the space) and its image is drained
and discarded, as a recording that failed to write is, so its publisher is not held back; the other
recordings go on.
Everything runs on one thread: the client conductor is driven from this loop
(``use_conductor_thread=False``), so image callbacks and polls never race.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from logbuf.archive.catalog import Catalog, CatalogError, ChecksumType, RecordingPositionWriter
from logbuf.archive.catalog_descriptor import RECORDER_HEARTBEAT_INTERVAL_MS
from logbuf.archive.checksum import stamp_block
from logbuf.archive.segments import (
    DEFAULT_SEGMENT_LENGTH,
    effective_segment_length,
    segment_base_position,
    segment_file_name,
)
from logbuf.archive.time_index import (
    AppendTimesWriter,
    BoundsBuilder,
    append_entry,
    append_times_file_name,
    time_index_file_name,
)
from logbuf.channel_uri import ChannelUri
from logbuf.client import Aeron, Context, Image, Subscription
from logbuf.directory import access_modes, resolve_dir, shares_with_group
from logbuf.durations import renamed_duration_keywords
from logbuf.errors import DriverTimeoutError, LogbufError
from logbuf.logbuffer import data_header_descriptor as dh

__all__ = ["Recorder", "RecorderContext", "RecordingSession"]

_FIRST_WORD = 4  # the frame length field, written last


@renamed_duration_keywords(
    {
        "driver_timeout_ms": ("driver_timeout_ns", 1_000_000),
        "busy_idle_sleep_s": ("busy_idle_sleep_ns", 1_000_000_000),
        "max_idle_sleep_s": ("max_idle_sleep_ns", 1_000_000_000),
    }
)
@dataclass
class RecorderContext:
    """Recorder settings (each is a ``logbuf-archive record`` option)."""

    archive_dir: str
    channel: str
    stream_id: int
    driver_dir: str = ""
    """The media driver's directory (default LOGBUF_DIR or /dev/shm/logbuf-<user>)."""
    segment_length: int = DEFAULT_SEGMENT_LENGTH
    """Power of two, 64 KiB..1 GiB; a recording uses max(this, term length). Larger: fewer files,
    coarser retention."""
    block_length: int = 1 << 20
    """Most bytes written per block poll (one pwrite). Larger: fewer syscalls when behind."""
    driver_timeout_ns: int = 10_000_000_000
    """How long without a driver heartbeat before the recordings are stopped and a reconnect starts."""
    reconnect: bool = True
    """After losing the driver, wait for a new one (else the recorder ends)."""
    busy_idle_sleep_ns: int = 200_000
    """Longest sleep while the stream was busy in the last 10 ms (shorter: faster catch-up, as the
    publishers wait for the recorder at their limit; measured 1.2-1.4 GB/s at 200 us vs ~0.4-1 at 1 ms)."""
    max_idle_sleep_ns: int = 2_000_000
    """Longest sleep when nothing was recorded for 10 ms (the recorder's CPU use when idle)."""
    checksum: str = "none"
    """``crc32``: each DATA frame is recorded with its payload's CRC-32 in its session id field (Aeron
    Archive's record checksum), so verify and the Spark reader detect a changed payload byte. Costs a
    copy of each block and one CRC per frame; ``none`` writes the log's bytes as they are."""
    time_index: bool = True
    """Bound each complete segment's reserved values in ``<recordingId>.times`` (:mod:`archive.time_index`),
    so that timestamp filters skip segments. Costs one more native walk of each block's frames;
    without it (``--no-time-index``) timestamp filters read every segment."""

    def conclude(self) -> RecorderContext:
        ChannelUri.parse(self.channel)  # InvalidChannelError (a ValueError) naming the bad part
        if not -(1 << 31) <= self.stream_id < (1 << 31):
            raise ValueError(f"stream_id={self.stream_id} is not a 32-bit signed integer")
        effective_segment_length(self.segment_length, 64 * 1024)
        if self.block_length < 4096:
            raise ValueError(f"block_length={self.block_length} must be at least 4096")
        if self.driver_timeout_ns <= 0:
            raise ValueError(f"driver_timeout_ns={self.driver_timeout_ns} must be positive")
        if self.checksum_type is None:
            raise ValueError(f"checksum={self.checksum!r} must be 'none' or 'crc32'")
        return self

    @property
    def checksum_type(self) -> ChecksumType | None:
        return {"none": ChecksumType.NONE, "crc32": ChecksumType.CRC32}.get(self.checksum.lower())


class RecordingSession:
    """Records one image into one recording (segment files + the catalog entry's stop position)."""

    def __init__(
        self,
        catalog: Catalog,
        image: Image,
        channel: str,
        segment_length: int,
        block_length: int,
        checksum: ChecksumType = ChecksumType.NONE,
        *,
        time_index: bool = True,
    ) -> None:
        log = image._log_buffers
        self.image = image
        self.catalog = catalog
        self.archive_dir = catalog.archive_dir
        self.term_length = image.term_length
        self.segment_length = effective_segment_length(segment_length, self.term_length)
        self.block_length = block_length
        self.start_position = image.position
        self.position = self.start_position
        self._position_of = log.position_of
        self.checksum = checksum
        self.recording_id = catalog.add_recording(
            channel=channel,
            source_identity=image.source_identity,
            stream_id=image.stream_id,
            session_id=image.session_id,
            initial_term_id=image.initial_term_id,
            term_length=self.term_length,
            mtu=log.mtu_length,
            segment_length=self.segment_length,
            start_position=self.start_position,
            checksum=checksum,
        )
        self._writer: RecordingPositionWriter = catalog.position_writer(self.recording_id)
        self._fd = -1
        self._times: BoundsBuilder | None = BoundsBuilder() if time_index else None
        self._times_fd = -1
        self._appends: AppendTimesWriter | None = (
            AppendTimesWriter(
                self.archive_dir / append_times_file_name(self.recording_id), self.recording_id, catalog.file_mode
            )
            if time_index
            else None
        )
        self._segment_base = -1
        self._segment_end = -1
        self._next_heartbeat_ms = 0
        self.stopped = False
        self.failed: str | None = None
        """Why writing failed (the recording then stopped as interrupted at its last whole block)."""
        self._log = structlog.get_logger().bind(
            role="recorder", recording_id=self.recording_id, session_id=image.session_id, stream_id=image.stream_id
        )
        self._log.info(
            "recording.started",
            channel=channel,
            start_position=self.start_position,
            term_length=self.term_length,
            segment_length=self.segment_length,
            checksum=checksum.name,
        )

    def do_work(self) -> int:
        """Record what the image holds now (one block); returns the bytes recorded."""
        if self.image.is_closed:
            return 0
        if self.stopped:
            # A recording that failed to write keeps consuming (and discarding) its image, so the
            # publishers are not held back by a recording that no longer exists; it was stopped
            # as interrupted and logged at error level.
            return self.image.block_poll(_discard, self.block_length) if self.failed else 0
        try:
            return self.image.block_poll(self._on_block, self.block_length)
        except OSError as e:  # disk full, file removed, I/O error: this recording ends here
            self.failed = f"{type(e).__name__}: {e}"
            self._log.error("recording.write_failed", error=self.failed, stop_position=self.position)
            self._close_segment()
            self._close_index()
            self.stopped = True
            self.catalog.stop_recording(self.recording_id, self.position, interrupted=True)
            return 0

    def _on_block(self, block: memoryview, term_offset: int, session_id: int, term_id: int) -> None:
        position = self._position_of(term_id, term_offset)
        if position != self.position:
            raise LogbufError(
                f"recording {self.recording_id}: block at position {position}, "
                f"expected {self.position} (term id {term_id}, offset {term_offset})"
            )
        if position >= self._segment_end:
            self._open_segment(position)
        if self._appends is not None:
            self._note_append_time(position)
        length = len(block)
        file_offset = position - self._segment_base
        if block[dh.TYPE_FIELD_OFFSET] == dh.HDR_TYPE_PAD and block[dh.TYPE_FIELD_OFFSET + 1] == 0:
            written = block[: dh.HEADER_LENGTH]  # a PAD: its header only; the offset moves by its whole length
        else:
            if self._times is not None:
                self._times.add(block)
            written = memoryview(stamp_block(block)) if self.checksum else block
        _pwrite_all(self._fd, written[_FIRST_WORD:], file_offset + _FIRST_WORD)
        _pwrite_all(self._fd, written[:_FIRST_WORD], file_offset)
        self.position = position + length
        self._writer.set_position(self.position)

    def _note_append_time(self, position: int) -> None:
        """The append-time entry for a block, before the stop position moves past it. A failure costs the
        recording its append times from here (readers give null timestamps there), not its frames."""
        assert self._appends is not None
        try:
            self._appends.on_block(position, time.time_ns() // 1000)
        except OSError as e:
            self._log.warning("recording.append_times_failed", position=position, error=str(e))
            self._appends.close()
            self._appends = None

    def _open_segment(self, position: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._index_segment()
        base = segment_base_position(self.start_position, position, self.term_length, self.segment_length)
        path = self.archive_dir / segment_file_name(self.recording_id, base)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, self.catalog.file_mode)
        if os.fstat(self._fd).st_size == 0:
            os.fchmod(self._fd, self.catalog.file_mode)  # not through the umask
        if os.fstat(self._fd).st_size < self.segment_length:
            os.ftruncate(self._fd, self.segment_length)  # sparse, full length: zeros past the recorded position
        self._segment_base = base
        self._segment_end = base + self.segment_length

    def _index_segment(self) -> None:
        """Append the time index entry of the segment just completed (every byte of it is written). A
        failure costs that segment its entry (readers then read it), not the recording."""
        if self._times is None:
            return
        times = self._times.times(self._segment_base)
        self._times.reset()
        try:
            if self._times_fd < 0:
                path = self.archive_dir / time_index_file_name(self.recording_id)
                self._times_fd = os.open(path, os.O_RDWR | os.O_CREAT, self.catalog.file_mode)
                os.fchmod(self._times_fd, self.catalog.file_mode)
            append_entry(self._times_fd, self.recording_id, times)
        except OSError as e:
            self._log.warning("recording.index_failed", segment_base=times.base_position, error=str(e))

    def _close_index(self) -> None:
        if self._times_fd >= 0:
            os.close(self._times_fd)
            self._times_fd = -1
        if self._appends is not None:
            self._appends.close()

    def _close_segment(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._segment_end = -1

    def heartbeat(self, now_ms: int) -> None:
        if now_ms >= self._next_heartbeat_ms:
            self._next_heartbeat_ms = now_ms + RECORDER_HEARTBEAT_INTERVAL_MS // 2
            self._writer.heartbeat(now_ms)

    def drain(self, max_bytes: int = 1 << 62) -> int:
        """Record everything the image holds now (up to ``max_bytes``)."""
        total = 0
        while total < max_bytes:
            n = self.do_work()
            if n == 0:
                break
            total += n
        return total

    def stop(self, reason: str) -> None:
        """Drain what is there, close the segment and mark the recording stopped."""
        if self.stopped:
            return
        try:
            self.drain(max_bytes=64 * self.term_length)
        except (ValueError, OSError) as e:  # the image's log went away under us
            self._log.warning("recording.drain_failed", error=str(e))
        if self.stopped:  # writing failed during the drain
            return
        self.stopped = True
        if self._fd >= 0:  # the last segment is complete now: the recording ends here
            self._index_segment()
        self._close_index()
        self._close_segment()
        self.catalog.stop_recording(self.recording_id, self.position)
        self._log.info(
            "recording.session_stopped",
            reason=reason,
            stop_position=self.position,
            recorded_length=self.position - self.start_position,
        )


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (a short write is retried; a full disk then raises OSError)."""
    while len(data):
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _discard(block: memoryview, term_offset: int, session_id: int, term_id: int) -> None:
    return None


class Recorder:
    """Records every image of one channel and stream id into an archive directory (see the module doc)."""

    def __init__(
        self, ctx: RecorderContext, *, on_recording_started: Callable[[RecordingSession], None] | None = None
    ) -> None:
        self.ctx = ctx.conclude()
        file_mode, dir_mode = access_modes(shares_with_group(resolve_dir(ctx.driver_dir or None)))
        self.catalog = Catalog.open_writable(ctx.archive_dir, file_mode=file_mode, dir_mode=dir_mode)
        self.sessions: dict[int, RecordingSession] = {}
        """Active sessions by image correlation id."""
        self.refused: dict[int, Image] = {}
        """Images whose recording could not start (by correlation id): drained and discarded."""
        self.finished: list[int] = []
        self._on_started = on_recording_started
        self._stop = threading.Event()
        self._aeron: Aeron | None = None
        self._subscription: Subscription | None = None
        self._log = structlog.get_logger().bind(role="recorder", channel=ctx.channel, stream_id=ctx.stream_id)

    # -- client callbacks (on this thread, from aeron.do_work()) -----------------------------------
    def _on_available_image(self, image: Image) -> None:
        checksum = self.ctx.checksum_type
        assert checksum is not None  # conclude() checked it
        try:
            session = RecordingSession(
                self.catalog,
                image,
                self.ctx.channel,
                self.ctx.segment_length,
                self.ctx.block_length,
                checksum,
                time_index=self.ctx.time_index,
            )
        except CatalogError as e:  # no room for its entry: this recording fails, the others go on
            self.refused[image.correlation_id] = image
            self._log.error(
                "recording.start_failed",
                session_id=image.session_id,
                source_identity=image.source_identity,
                position=image.position,
                error=str(e),
            )
            return
        self.sessions[image.correlation_id] = session
        if self._on_started is not None:
            self._on_started(session)

    def _on_unavailable_image(self, image: Image) -> None:
        self.refused.pop(image.correlation_id, None)
        session = self.sessions.pop(image.correlation_id, None)
        if session is not None:
            session.stop("image unavailable")
            self.finished.append(session.recording_id)

    # -- lifecycle -------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Connect to the driver (waiting up to the driver timeout) and subscribe."""
        context = Context(
            dir=self.ctx.driver_dir, use_conductor_thread=False, driver_timeout_ns=self.ctx.driver_timeout_ns
        )
        self._aeron = Aeron.connect(context)
        self._subscription = self._aeron.add_subscription(
            self.ctx.channel, self.ctx.stream_id, self._on_available_image, self._on_unavailable_image
        )
        self._log.info("recorder.connected", driver_dir=self._aeron.context.dir, archive_dir=self.ctx.archive_dir)

    def do_work(self) -> int:
        """One duty cycle: record a block from each image, run the client conductor, heartbeat."""
        work = 0
        for session in tuple(self.sessions.values()):
            work += session.do_work()
        for image in tuple(self.refused.values()):
            if not image.is_closed:
                work += image.block_poll(_discard, self.ctx.block_length)
        aeron = self._aeron
        if aeron is not None:
            aeron.do_work()
            now_ms = time.time_ns() // 1_000_000
            for session in self.sessions.values():
                session.heartbeat(now_ms)
            if self._subscription is not None and self._subscription.is_closed:
                self._on_driver_lost()
        return work

    def _on_driver_lost(self) -> None:
        self._log.warning("recorder.driver_lost", recordings=[s.recording_id for s in self.sessions.values()])
        self._stop_sessions("driver lost")
        self._close_client()

    def _stop_sessions(self, reason: str) -> None:
        self.refused.clear()
        for key, session in list(self.sessions.items()):
            session.stop(reason)
            self.finished.append(session.recording_id)
            del self.sessions[key]

    def _close_client(self) -> None:
        if self._aeron is not None:
            try:
                self._aeron.close()
            except LogbufError:
                pass
        self._aeron = None
        self._subscription = None

    def run(self, *, until: Callable[[], bool] | None = None) -> None:
        """Connect and record until :meth:`stop` (or ``until()`` is true); reconnects after driver loss."""
        idle_s = 0.0
        last_work_s = 0.0
        try:
            while not self._stop.is_set() and not (until is not None and until()):
                if self._aeron is None:
                    try:
                        self.connect()
                    except DriverTimeoutError as e:
                        if not self.ctx.reconnect:
                            raise
                        self._log.info("recorder.waiting_for_driver", error=str(e))
                        self._stop.wait(0.2)
                        continue
                work = self.do_work()
                if self._aeron is None and not self.ctx.reconnect:
                    break
                if work:
                    idle_s = 0.0
                    last_work_s = time.monotonic()
                else:
                    busy = time.monotonic() - last_work_s < 0.01
                    cap = (self.ctx.busy_idle_sleep_ns if busy else self.ctx.max_idle_sleep_ns) / 1e9
                    idle_s = min(cap, idle_s * 2 or 0.00005)
                    time.sleep(idle_s)
        finally:
            self.close()

    def stop(self) -> None:
        """Ask :meth:`run` to end (thread- and signal-safe)."""
        self._stop.set()

    def close(self) -> None:
        """Stop every recording (draining what is there) and disconnect."""
        self._stop_sessions("recorder closed")
        self._close_client()
        self.catalog.close()
        self._log.info("recorder.closed", recordings=self.finished)
