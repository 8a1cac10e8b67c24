"""The archive service's side of sync: digests of a stream history's blocks, asked for over the wire.

A ``SyncDigestRequest`` names one stream history (the publication: session, stream, initial term id, term
length, channel), the common coverage both archives hold, and the blocks to digest. The service finds its
recordings of that history in the catalog (an active one up to its recorded position), checks that it holds
all of ``common``, and answers one ``SyncDigests`` (worked out on a digest thread: reading and hashing a 1 GiB
block takes seconds, and the conductor records meanwhile) with the :func:`archive.sync_digest.digest_range` of each
block, and, when asked, a :class:`archive.sync_digest.Verdict` per block (do the frames that overlap the
block verify?). Which blocks to ask for next is the asker's business (:func:`archive.sync.compare`).

Bounds: at most :data:`MAX_SYNC_BLOCKS` blocks per request and :data:`MAX_SYNC_COMMON` common intervals (a
request that asks more is refused, naming the limit); the answer is 17 bytes per block, so a request never
amplifies (a block costs 16 bytes to ask for); at most :data:`MAX_SYNC_JOBS` requests are worked on at once.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

import structlog

from logbuf.archive import control_codec as cc
from logbuf.archive.archive_conductor import ERR, RequestError
from logbuf.archive.checksum import checksum_mismatch
from logbuf.archive.recorder import _pwrite_all
from logbuf.archive.recording import ChecksumType, RecordingDescriptor, RecordingState
from logbuf.archive.segments import SegmentReader, segment_base_position, segment_file_name
from logbuf.archive.sync_digest import Interval, Verdict, clip, digest_range, merge, subtract, unpack_intervals
from logbuf.archive.verify import frame_problem, walk_frames
from logbuf.logbuffer import data_header_descriptor as dh

__all__ = [
    "MAX_SYNC_BLOCKS",
    "MAX_SYNC_COMMON",
    "MAX_SYNC_FRAMES_LENGTH",
    "MAX_SYNC_JOBS",
    "SyncDigestService",
    "frames_problem",
    "history_reader",
    "verdict_of",
]

MAX_SYNC_BLOCKS: Final = 4096
"""Blocks per SyncDigestRequest (64 KiB of digests in the answer)."""
MAX_SYNC_COMMON: Final = 4096
"""Common-coverage intervals per SyncDigestRequest."""
MAX_SYNC_JOBS: Final = 8
"""Digest requests being worked on at once (more are refused, to be asked again)."""
MAX_SYNC_FRAMES_LENGTH: Final = 1 << 20
"""Bytes of frames per SyncFramesRequest or SyncRepairRequest."""


def history_reader(
    archive_dir: str, recordings: Sequence[tuple[RecordingDescriptor, int]]
) -> tuple[Callable[[int, int], bytes], Callable[[], None]]:
    """``read(start, end)`` over the union of ``recordings`` ((descriptor, recorded position) pairs that
    together hold ``[start, end)``), and a ``close()`` for the mappings it opened."""
    readers: dict[int, SegmentReader] = {}

    def read(start: int, end: int) -> bytes:
        out = bytearray()
        position = start
        while position < end:
            found = next(((d, stop) for d, stop in recordings if d.start_position <= position < stop), None)
            if found is None:
                raise RequestError(ERR.GENERIC, f"no recording here holds position {position} any more")
            d, stop = found
            reader = readers.get(d.recording_id)
            if reader is None:
                reader = SegmentReader(archive_dir, d.recording_id, d.start_position, d.term_length, d.segment_length)
                readers[d.recording_id] = reader
            term_end = position - (position & (d.term_length - 1)) + d.term_length
            chunk = reader.read(position, min(end, stop, term_end) - position)
            if not chunk:
                raise RequestError(ERR.GENERIC, f"recording {d.recording_id} has no bytes at position {position}")
            out += chunk
            position += len(chunk)
        return bytes(out)

    def close() -> None:
        for reader in readers.values():
            reader.close()

    return read, close


def verdict_of(
    archive_dir: str, recordings: Sequence[tuple[RecordingDescriptor, int]], ranges: list[Interval]
) -> Verdict:
    """Whether every frame that overlaps ``ranges`` (whole terms' walks, from the term's start or the
    recording's) is well formed and, where the recording has checksums, carries its payload's CRC-32."""
    proven = True
    for start, end in ranges:
        for d, stop in recordings:
            lo, hi = max(start, d.start_position), min(end, stop)
            if lo >= hi:
                continue
            if not _frames_verify(archive_dir, d, lo, hi, stop):
                return Verdict.FAILS
            proven = proven and d.checksum == ChecksumType.CRC32
    return Verdict.VERIFIES if proven else Verdict.WELL_FORMED


def _frames_verify(archive_dir: str, d: RecordingDescriptor, lo: int, hi: int, stop: int) -> bool:
    """Walk from the start of ``lo``'s term (frames begin there) to the end of the frame that holds ``hi - 1``;
    a bad frame wholly before ``lo`` is stepped over by its length word (it is not this range's)."""
    mask = d.term_length - 1
    position = max(d.start_position, lo - (lo & mask))
    last = hi - 1
    walk_to = min(stop, last - (last & mask) + d.term_length)
    with SegmentReader(archive_dir, d.recording_id, d.start_position, d.term_length, d.segment_length) as reader:
        while position < walk_to:
            bad, _, reason = walk_frames(archive_dir, d, position, walk_to)
            if reason is None or bad >= hi:
                return True
            frame_length = int.from_bytes(reader.read(bad, 4), "little", signed=True)
            if frame_length <= 0 or bad + dh.align(frame_length) > lo:
                return False  # the bad frame overlaps the range, or where the next frame starts is unknown
            position = bad + dh.align(frame_length)
    return True


def frames_problem(d: RecordingDescriptor, position: int, frames: bytes) -> str | None:
    """What is wrong with ``frames`` as this recording's frames from ``position`` (None: each is well formed
    at its position and its payload's CRC-32 is in its session id field)."""
    if d.checksum != ChecksumType.CRC32:
        return f"recording {d.recording_id} has no checksums: a repair cannot be proven"
    if position % dh.FRAME_ALIGNMENT:
        return f"position {position} is not frame aligned"
    mask = d.term_length - 1
    offset = 0
    while offset < len(frames):
        if len(frames) - offset < dh.HEADER_LENGTH:
            return f"{len(frames) - offset} bytes at the end are not a whole frame"
        length, version, flags, kind, term_offset, session, stream, term_id = dh.HEADER.unpack_from(frames, offset)[:8]
        p = position + offset
        problem = frame_problem(
            length, version, kind, term_offset, session, stream, term_id, d, p & mask, d.term_id_of(p), d.term_length
        )
        if problem is None and offset + dh.align(length) > len(frames):
            problem = f"frame length {length} runs past the bytes given"
        if problem is None and kind == dh.HDR_TYPE_DATA:
            problem = checksum_mismatch(session, frames[offset + dh.HEADER_LENGTH : offset + length])
        if problem is not None:
            return f"frame at position {p}: {problem}"
        offset += dh.align(length)
    return None


def _digest_job(
    archive_dir: str,
    recordings: list[tuple[RecordingDescriptor, int]],
    common: list[Interval],
    blocks: list[Interval],
    verify: bool,
) -> tuple[bytes, bytes]:
    """The digests (and verdicts) of ``blocks``: run on the digest thread (hashing and reading release the GIL)."""
    read, close = history_reader(archive_dir, recordings)
    try:
        digests = b"".join(digest_range(read, common, start, end) for start, end in blocks)
        verdicts = bytes(verdict_of(archive_dir, recordings, clip(common, *b)) for b in blocks) if verify else b""
    finally:
        close()
    return digests, verdicts


class SyncDigestService:
    """A conductor extension (:meth:`archive.archive_conductor.ArchiveConductor.add_extension`)."""

    def __init__(self, conductor: Any) -> None:
        self.conductor = conductor
        self.digests_sent = 0
        self._log = structlog.get_logger().bind(role="archive")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="logbuf-sync-digests")
        self._jobs: deque[tuple[Any, int, int, Future[tuple[bytes, bytes]]]] = deque()
        """(session, correlation id, block count, digests being worked out), in request order."""

    def handlers(self) -> dict[type[Any], Callable[[Any, Any], None]]:
        return {
            cc.SyncDigestRequest: self.on_digest_request,
            cc.SyncFramesRequest: self.on_frames_request,
            cc.SyncRepairRequest: self.on_repair_request,
        }

    def do_work(self) -> int:
        """Answer the digest requests whose digests are done (they are worked out on a thread of their own,
        reading only recorded bytes, so recording goes on meanwhile)."""
        work = 0
        while self._jobs and self._jobs[0][3].done():
            session, correlation_id, count, job = self._jobs.popleft()
            work += 1
            if session.is_done:
                continue
            try:
                digests, verdicts = job.result()
            except RequestError as e:
                session.send_error(correlation_id, e.code, str(e))
                continue
            except Exception as e:  # a file truncated or purged meanwhile, ...: the asker is told, the service goes on
                session.send_error(correlation_id, ERR.GENERIC, f"sync digests failed: {type(e).__name__}: {e}")
                continue
            self.digests_sent += count
            session.send(
                cc.SyncDigests(
                    control_session_id=session.control_session_id,
                    correlation_id=correlation_id,
                    block_count=count,
                    digests=digests,
                    verdicts=verdicts,
                )
            )
        return work

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._jobs.clear()

    def history(
        self, m: cc.SyncDigestRequest | cc.SyncFramesRequest | cc.SyncRepairRequest
    ) -> list[tuple[RecordingDescriptor, int]]:
        """This archive's recordings of the request's history, with their recorded positions."""
        out = []
        for d in self.conductor.catalog.recordings():
            if d.state == RecordingState.VALID and (
                d.session_id,
                d.stream_id,
                d.initial_term_id,
                d.term_length,
                d.channel,
            ) == (m.session_id, m.stream_id, m.initial_term_id, m.term_buffer_length, m.channel):
                stop = self.conductor._recorded_position(d)
                if stop > d.start_position:
                    out.append((d, stop))
        return out

    def on_digest_request(self, session: Any, message: cc.SyncDigestRequest) -> None:
        try:
            common = unpack_intervals(message.common)
            blocks = unpack_intervals(message.blocks)
        except ValueError as e:
            raise RequestError(ERR.GENERIC, f"sync digest request: {e}") from None
        if len(blocks) > MAX_SYNC_BLOCKS or len(common) > MAX_SYNC_COMMON:
            raise RequestError(
                ERR.GENERIC,
                f"sync digest request of {len(blocks)} blocks and {len(common)} common intervals is over the "
                f"limits ({MAX_SYNC_BLOCKS}, {MAX_SYNC_COMMON})",
            )
        recordings = self.history(message)
        lacking = subtract(common, merge((d.start_position, stop) for d, stop in recordings))
        if lacking:
            raise RequestError(
                ERR.INVALID_POSITION,
                f"this archive does not hold [{lacking[0][0]}, {lacking[0][1]}) of stream {message.stream_id} "
                f"session {message.session_id} (the common coverage asked for)",
            )
        if len(self._jobs) >= MAX_SYNC_JOBS:
            raise RequestError(ERR.GENERIC, f"{MAX_SYNC_JOBS} sync digest requests are being worked on: try again")
        verify = message.verify == cc.BooleanType.TRUE
        job = self._executor.submit(
            _digest_job, str(self.conductor.ctx.archive_dir), recordings, common, blocks, verify
        )
        self._jobs.append((session, message.correlation_id, len(blocks), job))

    def _holding(
        self, message: cc.SyncFramesRequest | cc.SyncRepairRequest, start: int, end: int
    ) -> tuple[RecordingDescriptor, int]:
        if not 0 <= start < end or end - start > MAX_SYNC_FRAMES_LENGTH:
            raise RequestError(
                ERR.GENERIC, f"sync range [{start}, {end}) is empty, negative or over {MAX_SYNC_FRAMES_LENGTH} bytes"
            )
        for d, stop in self.history(message):
            if d.start_position <= start and end <= stop:
                return d, stop
        raise RequestError(
            ERR.INVALID_POSITION,
            f"no recording here holds [{start}, {end}) of stream {message.stream_id} session {message.session_id}",
        )

    def on_frames_request(self, session: Any, message: cc.SyncFramesRequest) -> None:
        d, stop = self._holding(message, message.start, message.end)
        mask = d.term_length - 1
        position = max(d.start_position, message.start - (message.start & mask))
        first = -1
        out = bytearray()
        with SegmentReader(
            self.conductor.ctx.archive_dir, d.recording_id, d.start_position, d.term_length, d.segment_length
        ) as reader:
            while position < min(message.end, stop):
                length = int.from_bytes(reader.read(position, 4), "little", signed=True)
                if length <= 0:
                    raise RequestError(ERR.GENERIC, f"no frame at position {position} of recording {d.recording_id}")
                end = position + dh.align(length)
                if end > message.start:
                    if first < 0:
                        first = position
                    out += reader.read(position, end - position)
                    if len(out) > MAX_SYNC_FRAMES_LENGTH + d.mtu:
                        raise RequestError(ERR.GENERIC, f"frames over {MAX_SYNC_FRAMES_LENGTH} bytes")
                position = end
        session.send(
            cc.SyncFrames(
                control_session_id=session.control_session_id,
                correlation_id=message.correlation_id,
                position=first,
                frames=bytes(out),
            )
        )

    def on_repair_request(self, session: Any, message: cc.SyncRepairRequest) -> None:
        start, end = message.position, message.position + len(message.frames)
        d, stop = self._holding(message, start, end)
        problem = frames_problem(d, start, message.frames)
        if problem is not None:
            raise RequestError(ERR.GENERIC, f"sync repair refused: the given {problem}")
        archive_dir = str(self.conductor.ctx.archive_dir)
        if _frames_verify(archive_dir, d, start, end, stop):
            raise RequestError(
                ERR.GENERIC,
                f"sync repair refused: this archive's frames in [{start}, {end}) of recording {d.recording_id} "
                "verify (a conflict between two verifying copies is left to an operator)",
            )
        position = start
        while position < end:
            base = segment_base_position(d.start_position, position, d.term_length, d.segment_length)
            piece_end = min(end, base + d.segment_length)
            fd = os.open(os.path.join(archive_dir, segment_file_name(d.recording_id, base)), os.O_WRONLY)
            try:
                _pwrite_all(fd, memoryview(message.frames)[position - start : piece_end - start], position - base)
                os.fsync(fd)
            finally:
                os.close(fd)
            position = piece_end
        self._log.warning(
            "sync.conflict_repaired", recording_id=d.recording_id, start=start, end=end, stream_id=d.stream_id
        )
        session.send_ok(message.correlation_id, end - start)
