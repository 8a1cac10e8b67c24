"""Backfill: refill the relay's frame files from its own recordings when it starts (``--record DIR``).

Theory of operation
-------------------
The frame files are recreated empty at every start (``protocol_spec/jetstream-relay.md``); the
recording of the event stream is the durable copy. With ``--record DIR`` the relay reads the events
recorded in ``DIR`` for its channel and stream id back into its frame files, so a cursor from before
the restart still replays, and the ingest is told where the recording ends so it neither publishes an
event again nor leaves a hole. :func:`plan_backfill` runs before the relay listens and is quick: it
closes interrupted recordings, lists the stream's recordings and finds the newest recorded event (the
ingest's floor). The events themselves (a 24 h retention at 500 events/s is 43 million) are read by
:class:`BackgroundBackfill` while the relay already serves: a thread reads and compresses them and
the relay's loop appends them in batches; the live stream is held (it waits in its log) until the
last recorded event is in, then continues above it. Clients whose cursor is already loaded start at
once; the others wait for the end of the backfill (``jetstream.subscriber_state``'s WAITING).
:func:`backfill` does both steps at once (tests, tools):

* **Which recordings**: every recording of the same channel and stream id, VALID (not deleted),
  whatever its state: stopped, interrupted (the relay was killed) or still active (another process
  records). Recordings whose recorder died are first closed at their valid prefix, as a recorder
  start would do (``Catalog.open_writable``); each recording is read up to its catalog
  ``stop_position``, which always ends on a complete frame. Recordings are read in id order (the
  order they began: newest last).
* **Which events**: those with ``time_us`` at or after ``newest − retention`` (``newest``: the
  newest recorded event; the server's age retention measures from its newest event the same way).
  Whole terms whose events are all older are skipped by reading one header per term (the first
  frame's reserved value, which the stream sets to ``time_us``), so an archive far longer than the
  retention costs little more than the retained part.
* **Order**: appended in reading order; an event whose ``time_us`` is not above the last appended
  one (two recordings that overlap, an upstream clock that went back) is counted and skipped, as
  the server would refuse it. An event that is not a v1 event is counted and skipped.
* **Reading**: the archive's vectorised frame parser (:mod:`archive.spark_frames`: numpy over a
  read-only mapping of each segment, whole terms at a time, fragments reassembled, frames checked
  with ``logbuf-archive verify``'s rules); a corrupt region is logged and skipped to the next term.
  That module needs ``pyarrow`` (part of the ``spark`` extra); without it the archive's frame-by-frame
  reader (:func:`archive.dump.iter_frames`) is used, slower but the same events.

Only lifecycle is logged (``jetstream.backfilled`` with the counts, ``jetstream.backfill_failed``);
nothing per event. A background backfill that fails is logged and ends: the relay serves on with what
it loaded.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

import structlog
import zstandard

from logbuf.archive import catalog_descriptor as cat
from logbuf.archive.catalog import Catalog, CatalogError, RecordingDescriptor, RecordingState
from logbuf.archive.segments import SegmentError, mapped_segment, segment_base_position, segment_file_name
from logbuf.errors import LogbufError
from logbuf.jetstream.events import EventMeta, parse_event
from logbuf.logbuffer import data_header_descriptor as dh

__all__ = [
    "BackfillError",
    "BackfillPlan",
    "BackfillResult",
    "BackgroundBackfill",
    "backfill",
    "matching_recordings",
    "newest_recorded_time_us",
    "plan_backfill",
    "recorded_events",
    "run_backfill",
]

CHUNK_BYTES: Final = 16 * 1024 * 1024
"""Bytes of recording parsed at once (whole terms; at least one term)."""
BATCH_EVENTS: Final = 512
"""Events handed from the background reader to the relay's loop at once."""
QUEUE_BATCHES: Final = 16
"""Batches the background reader may be ahead of the loop (bounds its memory to ~4 MB of events)."""
BATCHES_PER_CALL: Final = 4
"""Batches the loop appends per duty call (bounds the time taken from the clients)."""

AppendFn = Callable[[bytes, EventMeta], None]


class BackfillError(LogbufError):
    """The archive cannot be read for a backfill (the message names the directory and the problem)."""


@dataclass
class BackfillResult:
    """What a backfill did (plain ints; also exported in ``/metrics``)."""

    recordings: int = 0
    """Recordings of the stream that were read (some of their events may be older than the window)."""
    events: int = 0
    """Events appended."""
    bytes: int = 0
    """JSON bytes appended."""
    non_increasing: int = 0
    """Recorded events skipped because their time_us was not above the last appended one."""
    invalid: int = 0
    """Recorded messages skipped because they are not v1 events."""
    corrupt_regions: int = 0
    """Regions of a recording that failed verify's checks (skipped to the next term)."""
    first_time_us: int = 0
    last_time_us: int = 0
    """time_us of the newest event appended (0: none); the ingest's floor."""
    cutoff_us: int = 0
    """Events older than this were not read (0: no age limit)."""
    duration_s: float = 0.0
    reader: str = ""
    """``numpy`` (archive.spark_frames) or ``frames`` (archive.dump, without pyarrow)."""
    errors: list[str] = field(default_factory=list)

    def snapshot(self) -> dict[str, int | float | str]:
        return {k: v for k, v in self.__dict__.items() if k != "errors"}


def _open_catalog(archive_dir: str) -> Catalog | None:
    """The archive's catalog with interrupted recordings closed at their valid prefix; None if no archive yet."""
    if not os.path.exists(os.path.join(archive_dir, cat.CATALOG_FILE_NAME)):
        return None
    try:
        return Catalog.open_writable(archive_dir, create=False, recover=True)
    except PermissionError:  # a read-only archive: the stored stop positions are a safe prefix too
        return Catalog.open(archive_dir)
    except (CatalogError, OSError) as e:
        raise BackfillError(f"cannot read the archive in {archive_dir} for the backfill: {e}") from None


def matching_recordings(archive_dir: str, channel: str, stream_id: int) -> list[RecordingDescriptor]:
    """The recordings of ``channel`` / ``stream_id`` with something recorded, by id (oldest first)."""
    catalog = _open_catalog(archive_dir)
    if catalog is None:
        return []
    with catalog:
        return [
            d
            for d in catalog.recordings()
            if d.state is RecordingState.VALID
            and d.channel == channel
            and d.stream_id == stream_id
            and d.stop_position > d.start_position
        ]


# -- reading a recording -----------------------------------------------------------------------------


def _term_start(d: RecordingDescriptor, position: int) -> int:
    return position - (position & (d.term_length - 1))


def _first_reserved_value(archive_dir: str, d: RecordingDescriptor, position: int) -> int | None:
    """The reserved value of the DATA frame at ``position`` (a term start), None if there is none."""
    base = segment_base_position(d.start_position, position, d.term_length, d.segment_length)
    try:
        with open(os.path.join(archive_dir, segment_file_name(d.recording_id, base)), "rb") as f:
            header = os.pread(f.fileno(), dh.HEADER_LENGTH, position - base)
    except OSError:
        return None
    if len(header) < dh.HEADER_LENGTH:
        return None
    length, _version, _flags, frame_type, term_offset, _session, _stream, _term_id, reserved = dh.HEADER.unpack(header)
    if length < dh.HEADER_LENGTH or frame_type != dh.HDR_TYPE_DATA or term_offset != position & (d.term_length - 1):
        return None
    return int(reserved)


def _read_from(archive_dir: str, d: RecordingDescriptor, cutoff_us: int) -> int:
    """Where to start reading ``d`` so that every event at or after ``cutoff_us`` is read: the start of
    the last term whose first event is older than the cutoff (the events are in time_us order)."""
    position = d.start_position
    if cutoff_us <= 0:
        return position
    term = _term_start(d, d.start_position) + d.term_length
    while term < d.stop_position:
        first = _first_reserved_value(archive_dir, d, term)
        if first is None or first >= cutoff_us:
            break
        position = term
        term += d.term_length
    return position


def _messages_numpy(
    archive_dir: str, d: RecordingDescriptor, from_position: int, on_corrupt: Callable[[int, str, int], None]
) -> Iterator[bytes]:
    """Every complete message of ``d`` ending in ``(from_position, stop]``, with archive.spark_frames."""
    from logbuf.archive.spark_frames import (
        RowSpec,
        parse_chunk,
        select_rows,
    )  # needs pyarrow: imported by the caller first

    spec = RowSpec(per_message=True)
    stop = d.stop_position
    terms_per_chunk = max(1, CHUNK_BYTES // d.term_length)
    position = from_position
    while position < stop:
        base = segment_base_position(d.start_position, position, d.term_length, d.segment_length)
        segment_end = min(stop, base + d.segment_length)
        path = os.path.join(archive_dir, segment_file_name(d.recording_id, base))
        with contextlib.ExitStack() as stack:
            try:
                segment = stack.enter_context(mapped_segment(path, d.segment_length))
            except FileNotFoundError:
                on_corrupt(position, f"segment file {path} is missing", segment_end)
                position = segment_end
                continue
            while position < segment_end:
                chunk_end = min(segment_end, _term_start(d, position) + terms_per_chunk * d.term_length)
                frames = parse_chunk(segment, base, position, chunk_end, d)
                rows = select_rows(frames, spec, from_position, stop, d)
                bad = frames.corruption
                del frames
                offsets = rows.payload_offsets.tolist()
                data = rows.payload_values.tobytes()  # one copy; slicing bytes is cheaper than numpy per event
                del rows
                for start, end in zip(offsets, offsets[1:]):
                    yield data[start:end]
                del data
                if bad is not None:
                    on_corrupt(bad.position, bad.reason, bad.resume_position)
                    position = max(bad.resume_position, position + dh.FRAME_ALIGNMENT)
                else:
                    position = chunk_end
            del segment  # so that the mapping closes now


def _messages_frames(
    archive_dir: str, d: RecordingDescriptor, from_position: int, on_corrupt: Callable[[int, str, int], None]
) -> Iterator[bytes]:
    """The same messages as :func:`_messages_numpy`, frame by frame with :func:`archive.dump.iter_frames`
    (no pyarrow needed). It stops at the first frame that is not there, which it reports."""
    from logbuf.archive.dump import iter_frames

    parts: list[bytes] | None = None
    end = from_position
    for frame in iter_frames(archive_dir, d, from_position, d.stop_position):
        end = frame.position + dh.align(frame.frame_length)
        if frame.frame_type != dh.HDR_TYPE_DATA:
            continue
        if frame.flags & dh.BEGIN_FLAG:
            parts = []
        if parts is None:
            continue  # the middle or end of a message that began before from_position
        parts.append(frame.payload)
        if frame.flags & dh.END_FLAG:
            yield parts[0] if len(parts) == 1 else b"".join(parts)
            parts = None
    if end < d.stop_position:
        on_corrupt(
            end,
            "no valid frame here before the recorded stop position (logbuf-archive verify says why)",
            d.stop_position,
        )


def _reader() -> tuple[
    str, Callable[[str, RecordingDescriptor, int, Callable[[int, str, int], None]], Iterator[bytes]]
]:
    try:
        import logbuf.archive.spark_frames  # noqa: F401  (needs pyarrow)
    except ImportError:
        return "frames", _messages_frames
    return "numpy", _messages_numpy


def recorded_events(
    archive_dir: str,
    d: RecordingDescriptor,
    from_position: int | None = None,
    on_corrupt: Callable[[int, str, int], None] | None = None,
) -> Iterator[bytes]:
    """The complete messages of recording ``d`` (each event's JSON bytes, fragments joined), in order,
    from ``from_position`` (a frame start; default the start) to the stop position."""
    _, read = _reader()
    position = d.start_position if from_position is None else from_position
    return read(archive_dir, d, position, on_corrupt or (lambda position, reason, resume: None))


def _last_time_us(archive_dir: str, d: RecordingDescriptor) -> int:
    """time_us of the last event of ``d`` (0 if none): the last term that holds one is parsed."""
    term = _term_start(d, d.stop_position - 1)
    while True:
        start = max(term, d.start_position)
        last: bytes | None = None
        for raw in recorded_events(archive_dir, d, start):
            last = raw
        if last is not None:
            try:
                return parse_event(last).time_us
            except ValueError:
                pass  # not an event: look further back
        if start <= d.start_position:
            return 0
        term -= d.term_length


def newest_recorded_time_us(archive_dir: str, channel: str, stream_id: int) -> int:
    """time_us of the newest event recorded for ``channel`` / ``stream_id`` (0 if none)."""
    return max((_last_time_us(archive_dir, d) for d in matching_recordings(archive_dir, channel, stream_id)), default=0)


@dataclass
class BackfillPlan:
    """What a backfill will read, decided before the relay serves (:func:`plan_backfill`)."""

    archive_dir: str
    recordings: list[RecordingDescriptor]
    newest_us: int
    """time_us of the newest recorded event (0: none): the ingest's floor."""
    result: BackfillResult


def plan_backfill(archive_dir: str, channel: str, stream_id: int, *, retention_ns: int | None) -> BackfillPlan:
    """Close interrupted recordings at their valid prefix, list the stream's recordings and find the
    newest recorded event (reads one term per recording); the events are read by :func:`run_backfill`."""
    result = BackfillResult()
    result.reader, _ = _reader()
    try:
        recordings = matching_recordings(archive_dir, channel, stream_id)
        newest = max((_last_time_us(archive_dir, d) for d in recordings), default=0)
    except (CatalogError, OSError, ValueError) as e:
        raise BackfillError(f"cannot read the archive in {archive_dir} for the backfill: {e}") from None
    if retention_ns is not None and newest:
        result.cutoff_us = max(0, newest - retention_ns // 1_000)  # event times are epoch microseconds
    return BackfillPlan(archive_dir, recordings, newest, result)


def run_backfill(plan: BackfillPlan, append: AppendFn) -> BackfillResult:
    """Append the planned events to ``append`` (in order, see the module doc); returns the counts."""
    archive_dir, result = plan.archive_dir, plan.result
    log = structlog.get_logger().bind(role="jetstream.backfill", archive_dir=archive_dir)
    started = time.monotonic()
    _, read = _reader()
    cutoff = result.cutoff_us
    last = 0

    for d in plan.recordings:

        def on_corrupt(position: int, reason: str, resume: int, d: RecordingDescriptor = d) -> None:
            result.corrupt_regions += 1
            if len(result.errors) < 10:
                result.errors.append(f"recording {d.recording_id} position {position}: {reason}")
            log.warning(
                "jetstream.backfill_corrupt",
                recording_id=d.recording_id,
                position=position,
                reason=reason,
                resume_position=resume,
            )

        result.recordings += 1
        try:
            for raw in read(archive_dir, d, _read_from(archive_dir, d, cutoff), on_corrupt):
                try:
                    meta = parse_event(raw)
                except ValueError:
                    result.invalid += 1
                    continue
                t = meta.time_us
                if t < cutoff:
                    continue
                if t <= last:
                    result.non_increasing += 1
                    continue
                append(raw, meta)
                last = t
                if not result.events:
                    result.first_time_us = t
                result.events += 1
                result.bytes += len(raw)
                result.last_time_us = t
        except (OSError, ValueError, SegmentError) as e:
            raise BackfillError(
                f"cannot read recording {d.recording_id} in {archive_dir} for the backfill: {e}"
            ) from None
    result.duration_s = round(time.monotonic() - started, 3)
    log.info("jetstream.backfilled", **result.snapshot())
    return result


def backfill(
    archive_dir: str, channel: str, stream_id: int, append: AppendFn, *, retention_ns: int | None
) -> BackfillResult:
    """Append the recorded events of the last ``retention_ns`` (None: all) to ``append``; see the module doc."""
    return run_backfill(plan_backfill(archive_dir, channel, stream_id, retention_ns=retention_ns), append)


class BackgroundBackfill:
    """Runs a planned backfill while the relay serves (``--record``): a thread reads and compresses the
    recorded events, the relay's loop appends them (:meth:`do_work`, a server duty) in batches.

    ``append(raw, meta, packed)``: store one event (``packed``: it compressed by ``compressor``, or
    None); ``on_done()``: called on the loop thread once every event is appended (or the read failed).
    """

    def __init__(
        self,
        plan: BackfillPlan,
        append: Callable[[bytes, EventMeta, bytes | None], None],
        on_done: Callable[[], None],
        compressor: zstandard.ZstdCompressor | None = None,
    ) -> None:
        self.plan = plan
        self.result = plan.result
        self._append = append
        self._on_done = on_done
        self._compressor = compressor
        self._queue: queue.Queue[list[tuple[bytes, EventMeta, bytes | None]] | None] = queue.Queue(QUEUE_BATCHES)
        self._batch: list[tuple[bytes, EventMeta, bytes | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jetstream-backfill", daemon=True)
        self.error: str | None = None
        self.done = False
        self._log = structlog.get_logger().bind(role="jetstream.backfill", archive_dir=plan.archive_dir)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        while True:  # unblock a reader waiting for room
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout_s)

    def _put(self, item: list[tuple[bytes, EventMeta, bytes | None]] | None) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _on_event(self, raw: bytes, meta: EventMeta) -> None:
        if self._stop.is_set():
            raise _Stopped
        packed = None if self._compressor is None else self._compressor.compress(raw)
        self._batch.append((raw, meta, packed))
        if len(self._batch) >= BATCH_EVENTS:
            self._put(self._batch)
            self._batch = []

    def _run(self) -> None:
        try:
            run_backfill(self.plan, self._on_event)
            if self._batch:
                self._put(self._batch)
        except _Stopped:
            pass
        except BackfillError as e:
            self.error = str(e)
            self._log.error("jetstream.backfill_failed", error=self.error, events=self.result.events)
        except Exception as e:  # noqa: BLE001 - the relay serves on without the rest of its history
            self.error = f"{type(e).__name__}: {e}"
            self._log.error("jetstream.backfill_failed", error=self.error, events=self.result.events)
        finally:
            self._put(None)

    def do_work(self) -> int:
        """Append up to ``BATCHES_PER_CALL`` batches (loop thread); returns the events appended."""
        if self.done:
            return 0
        work = 0
        for _ in range(BATCHES_PER_CALL):
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                break
            if batch is None:
                self.done = True
                self._on_done()
                break
            append = self._append
            for raw, meta, packed in batch:
                append(raw, meta, packed)
            work += len(batch)
        return work

    __call__ = do_work


class _Stopped(LogbufError):
    """The relay stopped during the backfill."""
