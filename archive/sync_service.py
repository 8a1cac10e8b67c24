"""The archive service's side of sync: digests of a stream history's blocks, asked for over the wire.

A ``SyncDigestRequest`` names one stream history (the publication: session, stream, initial term id, term
length, channel), the common coverage both archives hold, and the blocks to digest. The service finds its
recordings of that history in the catalog (an active one up to its recorded position), checks that it holds
all of ``common``, and answers one ``SyncDigests`` with the :func:`archive.sync_digest.digest_range` of each
block, and, when asked, a :class:`archive.sync_digest.Verdict` per block (do the frames that overlap the
block verify?). Which blocks to ask for next is the asker's business (:func:`archive.sync.compare`).

Bounds: at most :data:`MAX_SYNC_BLOCKS` blocks per request and :data:`MAX_SYNC_COMMON` common intervals (a
request that asks more is refused, naming the limit); the answer is 17 bytes per block, so a request never
amplifies (a block costs 16 bytes to ask for). Digesting reads the bytes once, on the conductor's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import structlog

from logbuf.archive import control_codec as cc
from logbuf.archive.archive_conductor import ERR, RequestError
from logbuf.archive.recording import ChecksumType, RecordingDescriptor, RecordingState
from logbuf.archive.segments import SegmentReader
from logbuf.archive.sync_digest import Interval, Verdict, clip, digest_range, merge, subtract, unpack_intervals
from logbuf.archive.verify import walk_frames
from logbuf.logbuffer.data_header_descriptor import align

__all__ = ["MAX_SYNC_BLOCKS", "MAX_SYNC_COMMON", "SyncDigestService", "history_reader", "verdict_of"]

MAX_SYNC_BLOCKS: Final = 4096
"""Blocks per SyncDigestRequest (64 KiB of digests in the answer)."""
MAX_SYNC_COMMON: Final = 4096
"""Common-coverage intervals per SyncDigestRequest."""


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
            d, stop = next((d, stop) for d, stop in recordings if d.start_position <= position < stop)
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
            if frame_length <= 0 or bad + align(frame_length) > lo:
                return False  # the bad frame overlaps the range, or where the next frame starts is unknown
            position = bad + align(frame_length)
    return True


class SyncDigestService:
    """A conductor extension (:meth:`archive.archive_conductor.ArchiveConductor.add_extension`)."""

    def __init__(self, conductor: Any) -> None:
        self.conductor = conductor
        self.digests_sent = 0
        self._log = structlog.get_logger().bind(role="archive")

    def handlers(self) -> dict[type[Any], Callable[[Any, Any], None]]:
        return {cc.SyncDigestRequest: self.on_digest_request}

    def do_work(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def history(self, m: cc.SyncDigestRequest) -> list[tuple[RecordingDescriptor, int]]:
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
        archive_dir = str(self.conductor.ctx.archive_dir)
        read, close = history_reader(archive_dir, recordings)
        try:
            digests = b"".join(digest_range(read, common, start, end) for start, end in blocks)
            verdicts = b""
            if message.verify == cc.BooleanType.TRUE:
                verdicts = bytes(verdict_of(archive_dir, recordings, clip(common, *block)) for block in blocks)
        finally:
            close()
        self.digests_sent += len(blocks)
        session.send(
            cc.SyncDigests(
                control_session_id=session.control_session_id,
                correlation_id=message.correlation_id,
                block_count=len(blocks),
                digests=digests,
                verdicts=verdicts,
            )
        )
