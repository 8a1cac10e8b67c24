"""Replication: the destination archive copies a recording from a source archive (Aeron's ``Replicate``).

Theory of operation
-------------------
A ``ReplicateRequest2`` reaches the *destination* archive. Its conductor starts a :class:`ReplicationSession`:
a worker thread with a driver client of its own, which connects to the source archive as an ordinary
:class:`archive.client.ArchiveClient` (IPC when the source is local, UDP when it is on another host), looks up
the source recording and the source's archive id, and hands both to the conductor. The conductor, the only
writer of the catalog, then either adds a new recording with the source's identity (channel, source identity,
session, stream, term length, initial term id, mtu, segment length, start position) or reopens the recording
that already holds a copy of the same source recording (found by its source file, below), and gives the worker
the destination recording id and the position to go on from: the destination's stop position.

The worker asks the source for a replay from that position onto the replication channel (a fresh stream id per
attempt), block-polls the replay image and writes each block at its position in the destination's segment
files, exactly as the recorder does (the first frame's length word last). A replay rewrites every frame's
session and stream ids to its own; the worker puts the recorded ones back (the source's session id, or the
payload's CRC-32 when this archive records checksums, as :mod:`archive.checksum` stamps them), so a frame is
byte-identical to the source's when both archives use the same checksum setting. The conductor copies the
worker's position into the catalog entry (whose recorder pid is the service's) and heartbeats it each duty
cycle; a kill -9 of the destination leaves an ACTIVE entry that the next start recovers to its valid prefix.

Resuming: a replay that ends early (the source killed, the link cut: the image times out; the control
session lost) is retried with a back-off from the destination's position until the target is reached, so
nothing is copied twice and nothing is skipped. The target is the request's stop position, or, with
``stop_position = -1``, the source recording's end: an active source recording is followed (live copying)
until it stops. ``StopReplicationRequest`` ends the worker; the recording stops where it is.

Source identity: ``<recordingId>.source.json`` beside the segments holds the source archive id, the source
recording id, its session, stream, channel and source identity and the source control channel. Recording ids
are this archive's own, so any number of archives replicate into one without collisions, and a second request
for the same source recording (with ``dst_recording_id = -1``) extends the copy instead of duplicating it.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from logbuf.archive import control_codec as cc
from logbuf.archive.checksum import stamp_block
from logbuf.archive.client import ArchiveClient, ArchiveClientContext, ArchiveError, replay_image_session_id
from logbuf.archive.recorder import _pwrite_all
from logbuf.archive.recording import ChecksumType
from logbuf.archive.segments import segment_base_position, segment_file_name
from logbuf.channel_uri import ChannelUri
from logbuf.client import Aeron, Context, Image, Subscription
from logbuf.conduit.archive_status import (  # noqa: F401  (re-exported: the archive's names for them)
    REPLICATIONS_FILE,
    ReplicaSource,
    read_replications,
    read_source,
    source_file_name,
    write_replications,
    write_source,
)
from logbuf.errors import LogbufError
from logbuf.logbuffer import data_header_descriptor as dh

__all__ = [
    "ReplicaSource",
    "ReplicationSession",
    "REPLICATIONS_FILE",
    "find_replica",
    "read_replications",
    "read_source",
    "source_file_name",
    "write_source",
    "REPLICATION_STREAM_ID_BASE",
]

REPLICATION_STREAM_ID_BASE = 0x5EC0_0000
"""Replay stream ids of replications: this base plus (replication id * 64 + attempt) modulo 2**24."""
_FIRST_WORD = 4
_INT32 = struct.Struct("<i")
_IDS = struct.Struct("<ii")


class _LiveGap(LogbufError):
    """The live image went past the copy's position (it lost data the copy needs): back to a replay."""


_STATUS_INTERVAL_MS = 1000


def find_replica(archive_dir: str | os.PathLike[str], source_archive_id: int, source_recording_id: int) -> int | None:
    """This archive's copy of a source recording (the newest if, by some accident, there are several)."""
    found: int | None = None
    for path in Path(archive_dir).glob("*.source.json"):
        try:
            recording_id = int(path.name.split(".", 1)[0])
        except ValueError:
            continue
        source = read_source(archive_dir, recording_id)
        if (
            source is not None
            and source.source_archive_id == source_archive_id
            and source.source_recording_id == source_recording_id
            and (found is None or recording_id > found)
        ):
            found = recording_id
    return found


@dataclass
class Assignment:
    """What the conductor gives the worker once the destination recording exists."""

    recording_id: int
    position: int
    start_position: int
    checksum: ChecksumType
    file_mode: int
    archive_dir: Path


class ReplicationSession:
    """One replication (see the module doc): a worker thread plus the state the conductor reads."""

    def __init__(
        self,
        replication_id: int,
        request: cc.ReplicateRequest2,
        *,
        archive_dir: str | os.PathLike[str],
        driver_dir: str,
        message_timeout_ns: int = 5_000_000_000,
        block_length: int = 1 << 20,
        retry_max_s: float = 1.0,
    ) -> None:
        self.replication_id = replication_id
        self.request = request
        self.archive_dir = Path(archive_dir)
        self.driver_dir = driver_dir
        self.message_timeout_ns = message_timeout_ns
        self.block_length = block_length
        self.retry_max_s = retry_max_s
        self.descriptor: cc.RecordingDescriptor | None = None
        """The source recording (set by the worker; the conductor then assigns)."""
        self.source_archive_id = -1
        self.assignment: Assignment | None = None
        self._assigned = threading.Event()
        self.position = -1
        """The destination's recorded position (whole frames written): the conductor publishes it."""
        self.target = -1
        """The position the copy goes to (-1 while the source recording is active and followed)."""
        self.source_position = -1
        """The source's recorded position when last asked (for the lag shown by tools)."""
        self.attempts = 0
        self.persistent = False
        """Resumed after a restart: retry the first lookup for ever (the source may be down as long)."""
        self.stopped_by_request = False
        self.merged = False
        """Copying from the live stream (``live_destination``) rather than from a replay."""
        self.merges = 0
        """Times the copy merged onto the live stream (the conductor sends a MERGE signal for each)."""
        self.done = False
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"logbuf-replication-{replication_id}", daemon=True)
        self._fd = -1
        self._segment_base = -1
        self._segment_end = -1
        self._log = structlog.get_logger().bind(
            role="replication",
            replication_id=replication_id,
            src_recording_id=request.src_recording_id,
            src_control_channel=request.src_control_channel,
        )

    # -- conductor side ---------------------------------------------------------------------------------------
    def start(self) -> ReplicationSession:
        self._thread.start()
        return self

    def assign(self, assignment: Assignment) -> None:
        self.position = assignment.position
        self.assignment = assignment
        self._assigned.set()

    def stop(self) -> None:
        self._stop.set()
        self._assigned.set()

    def join(self, timeout_s: float = 10.0) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def lag(self) -> int:
        """How far behind the source the copy is (bytes), as last seen."""
        if self.position < 0:
            return -1
        return max(0, max(self.source_position, self.target) - self.position)

    # -- worker --------------------------------------------------------------------------------------------------
    def _run(self) -> None:
        aeron: Aeron | None = None
        delay = 0.05
        try:
            aeron = Aeron.connect(Context(dir=self.driver_dir))
            while not self._stop.is_set() and not self.done:
                self.attempts += 1
                try:
                    if self._attempt(aeron):
                        delay = 0.05
                        continue
                except (ArchiveError, LogbufError, OSError, ValueError) as e:
                    if (
                        self.descriptor is None
                        and not self.persistent
                        and not isinstance(e, OSError)
                        and self.attempts >= 3
                    ):
                        raise  # the source never answered or refused: the request fails
                    self._log.info("replication.retry", error=str(e), position=self.position, attempt=self.attempts)
                self._stop.wait(delay)
                delay = min(delay * 2, self.retry_max_s)
        except Exception as e:  # reported to the requester by the conductor
            self.error = f"{type(e).__name__}: {e}"
            self._log.warning("replication.failed", error=self.error, position=self.position)
        finally:
            self._close_segment()
            if aeron is not None:
                aeron.close()
            self.done = True

    def _client(self, aeron: Aeron) -> ArchiveClient:
        request = self.request
        local = ChannelUri.parse(request.src_control_channel).media == "ipc"
        response = request.src_response_channel or ("aeron:ipc" if local else "")
        if not response:
            raise ValueError(
                f"source control channel {request.src_control_channel} is remote: the request needs a "
                "src_response_channel (this host's endpoint for the source's answers)"
            )
        return ArchiveClient.connect(
            ArchiveClientContext(
                aeron=aeron,
                control_channel=request.src_control_channel,
                control_stream_id=request.src_control_stream_id,
                response_channel=response,
                auth_secret=bytes(request.encoded_credentials),
                message_timeout_ns=self.message_timeout_ns,
            )
        )

    def _attempt(self, aeron: Aeron) -> bool:
        """One connection to the source: look up, replay and write until the replay ends. True if it moved."""
        request = self.request
        with self._client(aeron) as client:
            if self.descriptor is None:
                self.source_archive_id = client.archive_id()
                self.descriptor = client.list_recording(request.src_recording_id)
                self._log.info("replication.source_found", source_archive_id=self.source_archive_id)
                while not self._assigned.wait(0.05):
                    client.poll()
                if self._stop.is_set():
                    return False
            d = self.descriptor
            stop = client.stop_position(request.src_recording_id)  # -1 while the source records
            self.source_position = client.max_recorded_position(request.src_recording_id)
            self.target = request.stop_position if request.stop_position >= 0 else stop
            if self.target >= 0 and self.position >= self.target:
                self.done = True
                return True
            length = None if self.target < 0 else self.target - self.position
            channel = request.replication_channel or "aeron:ipc"
            stream_id = REPLICATION_STREAM_ID_BASE + ((self.replication_id * 64 + self.attempts) & 0xFFFFFF)
            subscription, replay_session_id = client.replay(
                d.recording_id, stream_id=stream_id, channel=channel, position=self.position, length=length
            )
            try:
                return self._copy(client, subscription, replay_image_session_id(replay_session_id), aeron)
            finally:
                subscription.close()

    def _copy(self, client: ArchiveClient, subscription: Subscription, session_id: int, aeron: Aeron) -> bool:
        start = self.position
        d = self.descriptor
        assert d is not None
        deadline = time.monotonic() + self.message_timeout_ns / 1e9
        image: Image | None = None
        while image is None:
            image = subscription.image_by_session_id(session_id)
            if image is None:
                if time.monotonic() > deadline or self._stop.is_set():
                    raise ArchiveError(f"the replay image (session {session_id}) did not arrive")
                time.sleep(0.001)
        last_poll = 0.0
        idle = 0.0
        live: Subscription | None = None
        try:
            while not self._stop.is_set():
                if image.is_closed:
                    break
                n = image.block_poll(self._on_block, self.block_length)
                if self.target >= 0 and self.position >= self.target:
                    self.done = True
                    break
                if live is not None:
                    live_image = live.image_by_session_id(d.session_id)
                    if live_image is not None and live_image.position <= self.position:
                        self._follow_live(client, live_image)
                        return self.position > start
                if n:
                    idle = 0.0
                    continue
                if image.is_end_of_stream:
                    break
                if live is None and self.request.live_destination and self.target < 0:
                    # caught up with what the source has recorded: join the live stream, and leave the replay
                    # once it reaches the live image's position
                    live = aeron.add_subscription(self.request.live_destination, d.stream_id)
                    self._log.info("replication.joining_live", live_destination=self.request.live_destination)
                now = time.monotonic()
                if now - last_poll > 0.2:
                    last_poll = now
                    client.poll()
                    for error in client.errors:
                        raise ArchiveError(f"the source's replay failed: {error.error_message}")
                idle = min(idle * 2 or 0.0001, 0.002)
                time.sleep(idle)
        finally:
            if live is not None:
                live.close()
        if not self.done and self.target < 0:
            stop = client.stop_position(self.request.src_recording_id)
            self.source_position = client.max_recorded_position(self.request.src_recording_id)
            if stop >= 0 and self.position >= stop:
                self.target = stop
                self.done = True
        return self.position > start

    def _follow_live(self, client: ArchiveClient, live_image: Image) -> None:
        """Merged: copy from the live image (whose frames are the source's, at the same positions) until it
        ends or leaves a gap; the replay is given up. A live stream lost before the source recording stops
        sends the copy back to a replay from where it stands (the next attempt)."""
        self.merged = True
        self.merges += 1
        self._log.info("replication.merged", position=self.position, live_position=live_image.position)
        last_poll = 0.0
        idle = 0.0
        try:
            while not self._stop.is_set() and not live_image.is_closed:
                n = live_image.block_poll(self._on_live_block, self.block_length)
                if n:
                    idle = 0.0
                    continue
                if live_image.is_end_of_stream:
                    break
                now = time.monotonic()
                if now - last_poll > 0.2:
                    last_poll = now
                    client.poll()  # the source session stays alive for the stop position asked after
                idle = min(idle * 2 or 0.0001, 0.002)
                time.sleep(idle)
        except _LiveGap as e:
            self._log.info("replication.live_gap", error=str(e), position=self.position)
        finally:
            self.merged = False

    def _on_live_block(self, block: memoryview, term_offset: int, session_id: int, term_id: int) -> None:
        d = self.descriptor
        assert d is not None
        shift = d.term_buffer_length.bit_length() - 1
        position = (((term_id - d.initial_term_id) & 0xFFFFFFFF) << shift) + term_offset
        end = position + len(block)
        if end <= self.position:
            return
        if position > self.position:
            raise _LiveGap(f"the live image is at {position}, the copy at {self.position}")
        self._on_block(block[self.position - position :], term_offset, session_id, term_id)

    def _on_block(self, block: memoryview, term_offset: int, session_id: int, term_id: int) -> None:
        assignment = self.assignment
        d = self.descriptor
        assert assignment is not None and d is not None
        position = self.position
        if self.target >= 0 and position + len(block) > self.target:
            block = block[: self._whole_frames(block, self.target - position)]
            if not len(block):
                return
        data = bytearray(block)
        offset = 0
        while offset < len(data):
            frame_length = _INT32.unpack_from(data, offset)[0]
            if frame_length <= 0:
                break
            _IDS.pack_into(data, offset + dh.SESSION_ID_FIELD_OFFSET, d.session_id, d.stream_id)
            offset += (frame_length + 31) & ~31
        if position >= self._segment_end:
            self._open_segment(position)
        if data[dh.TYPE_FIELD_OFFSET] == dh.HDR_TYPE_PAD and data[dh.TYPE_FIELD_OFFSET + 1] == 0:
            written = memoryview(data)[: dh.HEADER_LENGTH]
        else:
            written = memoryview(stamp_block(memoryview(data)) if assignment.checksum else data)
        file_offset = position - self._segment_base
        _pwrite_all(self._fd, written[_FIRST_WORD:], file_offset + _FIRST_WORD)
        _pwrite_all(self._fd, written[:_FIRST_WORD], file_offset)
        self.position = position + len(block)

    @staticmethod
    def _whole_frames(block: memoryview, limit: int) -> int:
        offset = 0
        while offset < len(block):
            frame_length = _INT32.unpack_from(block, offset)[0]
            aligned = (frame_length + 31) & ~31
            if frame_length <= 0 or offset + aligned > limit:
                break
            offset += aligned
        return offset

    def _open_segment(self, position: int) -> None:
        assignment, d = self.assignment, self.descriptor
        assert assignment is not None and d is not None
        self._close_segment()
        base = segment_base_position(assignment.start_position, position, d.term_buffer_length, d.segment_file_length)
        path = self.archive_dir / segment_file_name(assignment.recording_id, base)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, assignment.file_mode)
        if os.fstat(self._fd).st_size < d.segment_file_length:
            os.fchmod(self._fd, assignment.file_mode)
            os.ftruncate(self._fd, d.segment_file_length)
        self._segment_base = base
        self._segment_end = base + d.segment_file_length

    def _close_segment(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._segment_end = -1

    def describe(self) -> dict[str, Any]:
        return {
            "replication_id": self.replication_id,
            "src_recording_id": self.request.src_recording_id,
            "source_archive_id": self.source_archive_id,
            "dst_recording_id": self.assignment.recording_id if self.assignment else -1,
            "position": self.position,
            "lag": self.lag,
            "merged": self.merged,
            "attempts": self.attempts,
        }


class Replications:
    """The conductor's side of replication: requests in, catalog entries, progress and signals out.

    Runs on the conductor's thread only (it is the catalog's writer); each replication's copying runs on
    its :class:`ReplicationSession` thread. ``max_replications`` bounds the threads a client can start."""

    def __init__(self, conductor: Any, *, max_replications: int = 16) -> None:
        self.conductor = conductor
        self.max_replications = max_replications
        self.sessions: dict[int, ReplicationSession] = {}
        self._owner: dict[int, tuple[int, int]] = {}
        """replication id -> (control session id, correlation id of the request)."""
        self._writers: dict[int, Any] = {}
        self._next_id = 1
        self._status_due_ms = 0
        self._status_dirty = False
        """A copy was assigned or ended: the status file is rewritten at once."""
        self._merges_signalled: dict[int, int] = {}
        self._log = structlog.get_logger().bind(role="archive")

    def handlers(self) -> dict[type[Any], Callable[[Any, Any], None]]:
        return {cc.ReplicateRequest2: self.on_replicate, cc.StopReplicationRequest: self.on_stop_replication}

    def on_replicate(self, session: Any, message: cc.ReplicateRequest2) -> None:
        conductor = self.conductor
        if len(self.sessions) >= self.max_replications:
            raise ValueError(f"max concurrent replications reached ({self.max_replications})")
        if message.src_recording_id < 0:
            raise ValueError(f"source recording id {message.src_recording_id} must not be negative")
        if message.dst_recording_id >= 0:
            d = conductor.catalog.recording(message.dst_recording_id)  # UnknownRecordingError -> its error code
            if d.active:
                raise ValueError(f"destination recording {message.dst_recording_id} is being recorded")
        ChannelUri.parse(message.src_control_channel)  # a ValueError naming the bad part
        worker = self._new_worker(message)
        replication_id = worker.replication_id
        self._owner[replication_id] = (session.control_session_id, message.correlation_id)
        session.send_ok(message.correlation_id, replication_id)
        worker.start()
        self._log.info(
            "replication.started",
            replication_id=replication_id,
            src_recording_id=message.src_recording_id,
            src_control_channel=message.src_control_channel,
            dst_recording_id=message.dst_recording_id,
            stop_position=message.stop_position,
        )

    def resume(self) -> list[int]:
        """Start again every copy that a previous run of this service left in progress (its source file says
        so and its recording is stopped, as recovery leaves it); returns their recording ids."""
        catalog = self.conductor.catalog
        resumed = []
        for path in sorted(Path(catalog.archive_dir).glob("*.source.json")):
            try:
                recording_id = int(path.name.split(".", 1)[0])
                d = catalog.recording(recording_id)
            except (ValueError, LogbufError):
                continue
            source = read_source(catalog.archive_dir, recording_id)
            if source is None or source.complete or d.active or source.src_control_stream_id < 0:
                continue
            request = cc.ReplicateRequest2(
                control_session_id=-1,
                correlation_id=-1,
                src_recording_id=source.source_recording_id,
                dst_recording_id=recording_id,
                stop_position=source.stop_position,
                channel_tag_id=cc.NULL_INT64,
                subscription_tag_id=cc.NULL_INT64,
                src_control_stream_id=source.src_control_stream_id,
                file_io_max_length=cc.NULL_INT32,
                replication_session_id=cc.NULL_INT32,
                src_control_channel=source.source_control_channel,
                live_destination=source.live_destination,
                replication_channel=source.replication_channel,
                encoded_credentials=b"",
                src_response_channel=source.src_response_channel,
            )
            worker = self._new_worker(request)
            worker.persistent = True
            worker.start()
            resumed.append(recording_id)
            self._log.info("replication.resumed", replication_id=worker.replication_id, dst_recording_id=recording_id)
        return resumed

    def _new_worker(self, request: cc.ReplicateRequest2) -> ReplicationSession:
        """A replication with the next id, registered (the caller starts it)."""
        ctx = self.conductor.ctx
        worker = ReplicationSession(
            self._next_id,
            request,
            archive_dir=ctx.archive_dir,
            driver_dir=ctx.driver_dir,
            message_timeout_ns=ctx.connect_timeout_ns,
            block_length=ctx.block_length,
        )
        self._next_id += 1
        self.sessions[worker.replication_id] = worker
        return worker

    def on_stop_replication(self, session: Any, message: cc.StopReplicationRequest) -> None:
        worker = self.sessions.get(message.replication_id)
        if worker is None:
            raise ValueError(f"no active replication {message.replication_id}")
        worker.stopped_by_request = True
        worker.stop()
        session.send_ok(message.correlation_id)

    def do_work(self) -> int:
        work = 0
        now_ms = time.time_ns() // 1_000_000
        for replication_id, worker in tuple(self.sessions.items()):
            if worker.assignment is None and worker.descriptor is not None and not worker.done:
                self._assign(replication_id, worker)
                work += 1
            writer = self._writers.get(replication_id)
            if writer is not None and worker.position >= 0:
                writer.set_position(worker.position)
                writer.heartbeat(now_ms)
            if worker.merges > self._merges_signalled.get(replication_id, 0) and worker.assignment is not None:
                self._merges_signalled[replication_id] = worker.merges
                self._signal(replication_id, worker.assignment.recording_id, worker.position, cc.RecordingSignal.MERGE)
                work += 1
            if worker.done:
                self._merges_signalled.pop(replication_id, None)
                self._ended(replication_id, worker)
                work += 1
        if self._status_dirty or (self.sessions and now_ms >= self._status_due_ms):
            self._write_status(now_ms)
        return work

    def _write_status(self, now_ms: int) -> None:
        """Copies in progress, for ``logbuf-archive list`` and ``logbuf-stat``: rewritten about once a second
        while there are any, and at once when one is assigned or ends."""
        entries = [worker.describe() for worker in self.sessions.values()]
        try:
            write_replications(self.conductor.ctx.archive_dir, entries, now_ms)
        except OSError as e:
            self._log.warning("replication.status_not_written", error=str(e))
        self._status_due_ms = now_ms + _STATUS_INTERVAL_MS
        self._status_dirty = False

    def _assign(self, replication_id: int, worker: ReplicationSession) -> None:
        self._status_dirty = True
        conductor = self.conductor
        catalog = conductor.catalog
        d, request = worker.descriptor, worker.request
        assert d is not None
        dst = request.dst_recording_id
        if dst < 0:
            found = find_replica(catalog.archive_dir, worker.source_archive_id, request.src_recording_id)
            if found is not None and catalog.recording(found).active:
                worker.error = (
                    f"source recording {request.src_recording_id} is already being copied into recording {found}"
                )
                worker.stop()
                return
            if found is not None:
                dst = found
        signal = cc.RecordingSignal.EXTEND
        try:
            if dst >= 0:
                existing = catalog.recording(dst)
                if (existing.session_id, existing.stream_id, existing.term_length, existing.initial_term_id) != (
                    d.session_id,
                    d.stream_id,
                    d.term_buffer_length,
                    d.initial_term_id,
                ):
                    raise ValueError(
                        f"destination recording {dst} (session {existing.session_id}, stream {existing.stream_id}) "
                        f"is not a copy of source recording {d.recording_id} (session {d.session_id}, stream "
                        f"{d.stream_id})"
                    )
                if existing.active:
                    raise ValueError(f"destination recording {dst} is being recorded")
                catalog.reopen_recording(dst)
                start, position = existing.start_position, existing.stop_position
            else:
                start = position = d.start_position
                dst = catalog.add_recording(
                    channel=d.original_channel,
                    source_identity=d.source_identity,
                    stream_id=d.stream_id,
                    session_id=d.session_id,
                    initial_term_id=d.initial_term_id,
                    term_length=d.term_buffer_length,
                    mtu=d.mtu_length,
                    segment_length=d.segment_file_length,
                    start_position=d.start_position,
                    checksum=conductor._checksum,
                )
                signal = cc.RecordingSignal.START
            if signal is cc.RecordingSignal.START or read_source(catalog.archive_dir, dst) is not None:
                write_source(
                    catalog.archive_dir,
                    dst,
                    ReplicaSource(
                        source_archive_id=worker.source_archive_id,
                        source_recording_id=d.recording_id,
                        session_id=d.session_id,
                        stream_id=d.stream_id,
                        channel=d.original_channel,
                        source_identity=d.source_identity,
                        source_control_channel=request.src_control_channel,
                        src_control_stream_id=request.src_control_stream_id,
                        src_response_channel=request.src_response_channel,
                        replication_channel=request.replication_channel,
                        stop_position=request.stop_position,
                        live_destination=request.live_destination,
                        complete=False,
                    ),
                    catalog.file_mode,
                )
        except (LogbufError, ValueError, OSError) as e:
            worker.error = str(e)
            worker.stop()
            return
        self._writers[replication_id] = catalog.position_writer(dst)
        worker.assign(
            Assignment(dst, position, start, conductor._checksum, catalog.file_mode, Path(catalog.archive_dir))
        )
        self._signal(replication_id, dst, position, signal)
        self._log.info("replication.assigned", replication_id=replication_id, dst_recording_id=dst, position=position)

    def _ended(self, replication_id: int, worker: ReplicationSession) -> None:
        self._status_dirty = True
        worker.join()
        self.sessions.pop(replication_id, None)
        self._writers.pop(replication_id, None)
        assignment = worker.assignment
        if assignment is not None:
            self.conductor.catalog.stop_recording(assignment.recording_id, worker.position)
            self._signal(replication_id, assignment.recording_id, worker.position, cc.RecordingSignal.STOP)
            source = read_source(assignment.archive_dir, assignment.recording_id)
            finished = worker.target >= 0 and worker.position >= worker.target
            if source is not None and not source.complete and (finished or worker.stopped_by_request):
                write_source(
                    assignment.archive_dir,
                    assignment.recording_id,
                    replace(source, complete=True),
                    assignment.file_mode,
                )
        if worker.error is not None:
            self.conductor.counters.errors.increment()
            entry = self._control_session(replication_id)
            if entry is not None:
                entry[0].send_error(entry[1], cc.ArchiveErrorCode.GENERIC, f"replication failed: {worker.error}")
        self._signal(
            replication_id,
            assignment.recording_id if assignment else -1,
            worker.position,
            cc.RecordingSignal.REPLICATE_END,
        )
        self._log.info(
            "replication.ended",
            replication_id=replication_id,
            dst_recording_id=assignment.recording_id if assignment else -1,
            position=worker.position,
            error=worker.error,
        )
        self._owner.pop(replication_id, None)

    def _control_session(self, replication_id: int) -> tuple[Any, int] | None:
        control_session_id, correlation_id = self._owner.get(replication_id, (-1, -1))
        session = self.conductor.sessions.get(control_session_id)
        if session is None or session.is_done:
            return None
        return session, correlation_id

    def _signal(self, replication_id: int, recording_id: int, position: int, signal: cc.RecordingSignal) -> None:
        control_session_id, correlation_id = self._owner.get(replication_id, (-1, -1))
        session = self.conductor.sessions.get(control_session_id)
        if session is None or session.is_done:
            return
        session.send(
            cc.RecordingSignalEvent(
                control_session_id=control_session_id,
                correlation_id=correlation_id,
                recording_id=recording_id,
                subscription_id=replication_id,
                position=position,
                signal=signal,
            )
        )

    def close(self) -> None:
        for worker in self.sessions.values():
            worker.stop()
        for worker in tuple(self.sessions.values()):
            worker.join()
            if worker.assignment is not None:
                self.conductor.catalog.stop_recording(worker.assignment.recording_id, worker.position)
        self.sessions.clear()
