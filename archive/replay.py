"""Replay: a recording's frames, from a position, into a new exclusive publication.

Theory of operation
-------------------
The replay publication is an exclusive IPC publication whose channel carries the recording's
``init-term-id``, ``term-id``/``term-offset`` (of the replay position), ``term-length`` and
``mtu``, so its positions are the recording's positions and a subscriber reads it as any stream.

Frames are not re-offered one by one: the replay appends whole raw blocks, as Aeron's
``ExclusivePublication.offerBlock`` does. Each duty cycle takes the whole frames that fit below
the publisher limit (and the term's end), copies them from the segment file into the term at the
tail, all but the first frame's length; rewrites every DATA frame's session and stream ids to the
replay publication's; then stores the first frame's length with a release store (subscribers see
the whole block at once) and publishes the new tail (rotating to the next term at a term's end).
Flags, reserved values and padding are kept as recorded, so fragments, their positions and
timestamps carried in reserved values come back unchanged. The publication's own ``offer`` is
never used (its cached tail would be stale).

Bounds (Aeron's): the position must be a multiple of 32, at least the start position, and for a
stopped recording before the stop position; it must be the start of a frame. ``length=None``
replays to the stop position, following a recording that is still active until it stops; a
length replays that many bytes (whole frames only), waiting for an active recording to reach it.
The replay ends by closing the publication; a subscriber then sees the end of stream.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import structlog

from logbuf import native
from logbuf.archive.catalog import Catalog, CatalogError, RecordingDescriptor, RecordingState
from logbuf.archive.segments import SegmentError, SegmentReader
from logbuf.channel_uri import ChannelUri
from logbuf.client import Aeron, Publication
from logbuf.durations import format_duration_ns, renamed_duration_keywords
from logbuf.errors import LogbufError
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd

__all__ = ["Replay", "ReplayError", "check_replay_bounds", "replay_channel"]


class ReplayError(LogbufError, ValueError):
    """A replay that cannot start or go on (the message names the recording and the problem)."""


def replay_channel(base_channel: str, descriptor: RecordingDescriptor, position: int) -> str:
    """``base_channel`` (``aeron:ipc``, or ``aeron:udp`` to a unicast endpoint or a multicast group) with the
    recording's log parameters at ``position``."""
    try:
        uri = ChannelUri.parse(base_channel)
    except ValueError as e:
        raise ReplayError(f"replay channel {base_channel!r}: {e}") from None
    if uri.prefix or uri.media not in ("ipc", "udp"):
        raise ReplayError(f"replay channel {base_channel!r} must be aeron:ipc or aeron:udp")
    if uri.media == "udp" and "endpoint" not in uri.params and "control" not in uri.params:
        raise ReplayError(
            f"replay channel {base_channel!r} needs an endpoint (the subscriber's address:port or a group)"
        )
    clashing = sorted({"init-term-id", "term-id", "term-offset", "term-length", "mtu"} & set(uri.params))
    if clashing:
        raise ReplayError(
            f"replay channel {base_channel!r} must not set {', '.join(clashing)}: the recording sets them"
        )
    params = (
        f"init-term-id={descriptor.initial_term_id}|term-id={descriptor.term_id_of(position)}"
        f"|term-offset={position & (descriptor.term_length - 1)}|term-length={descriptor.term_length}"
        f"|mtu={descriptor.mtu}"
    )
    return base_channel + ("|" if "?" in base_channel else "?") + params


def check_replay_bounds(
    archive_dir: str | os.PathLike[str], d: RecordingDescriptor, position: int, length: int | None
) -> None:
    """Raise :class:`ReplayError` naming the problem if the replay cannot start at ``position``."""
    rid = d.recording_id
    if d.state != RecordingState.VALID:
        raise ReplayError(f"recording {rid} is {d.state.name}, not VALID: nothing to replay")
    if position % dh.FRAME_ALIGNMENT:
        raise ReplayError(f"replay position {position} of recording {rid} is not a multiple of {dh.FRAME_ALIGNMENT}")
    if position < d.start_position:
        raise ReplayError(f"replay position {position} is before recording {rid}'s start position {d.start_position}")
    if not d.active and position >= d.stop_position:
        raise ReplayError(
            f"replay position {position} is not before recording {rid}'s stop position "
            f"{d.stop_position} (the recording is stopped)"
        )
    if d.active and position > d.stop_position:
        raise ReplayError(f"replay position {position} is past recording {rid}'s recorded position {d.stop_position}")
    if length is not None:
        if length < 0:
            raise ReplayError(f"replay length {length} must not be negative (None replays to the end)")
        if not d.active and position + length > d.stop_position:
            raise ReplayError(
                f"replay of {length} bytes from {position} runs past recording {rid}'s stop position {d.stop_position}"
            )
    if position < d.stop_position:
        with SegmentReader(archive_dir, rid, d.start_position, d.term_length, d.segment_length) as reader:
            try:
                header = reader.read(position, dh.HEADER_LENGTH)
            except SegmentError as e:
                raise ReplayError(f"recording {rid}: {e}") from None
        if len(header) < dh.HEADER_LENGTH:
            raise ReplayError(f"recording {rid}: the segment file ends before position {position}")
        frame_length, _, _, _, term_offset, _, _, term_id, _ = dh.HEADER.unpack(header)
        if frame_length <= 0 or term_offset != position & (d.term_length - 1) or term_id != d.term_id_of(position):
            raise ReplayError(f"replay position {position} is not the start of a frame in recording {rid}")


@renamed_duration_keywords({"connect_timeout_ms": ("connect_timeout_ns", 1_000_000)})
class Replay:
    """Replays one recording into a new exclusive publication; drive it with :meth:`do_work`.

    replay = Replay(aeron, "/data/archive", 0, stream_id=99)
    sub = aeron.add_subscription("aeron:ipc", 99)     # before or after: the replay waits for it
    while not replay.is_done:
        replay.do_work(); sub.poll(handler, 100)
    """

    def __init__(
        self,
        aeron: Aeron,
        archive_dir: str | os.PathLike[str],
        recording_id: int,
        *,
        stream_id: int,
        position: int | None = None,
        length: int | None = None,
        channel: str = "aeron:ipc",
        connect_timeout_ns: int = 5_000_000_000,
        limit_position: Callable[[], int] | None = None,
    ) -> None:
        self.archive_dir = archive_dir
        self._limit_position = limit_position
        """A bounded replay's limit (a position counter's value): the replay waits below it."""
        self.recording_id = recording_id
        try:
            self._catalog = Catalog.open(archive_dir)
        except CatalogError as e:
            raise ReplayError(str(e)) from None
        try:
            try:
                d = self._catalog.recording(recording_id)
            except CatalogError as e:
                raise ReplayError(str(e)) from None
            start = d.start_position if position is None else position
            check_replay_bounds(archive_dir, d, start, length)
            self.descriptor = d
            self.start_position = self.position = start
            self.end_position: int | None = None if length is None else start + length
            self.channel = replay_channel(channel, d, start)
            self.stream_id = stream_id
            self.publication: Publication = aeron.add_exclusive_publication(self.channel, stream_id)
        except BaseException:
            self._catalog.close()
            raise
        self._reader = SegmentReader(archive_dir, recording_id, d.start_position, d.term_length, d.segment_length)
        log = self.publication._log_buffers
        self._meta = log.metadata()
        self._terms = log.terms  # the log's own views; it releases them when it is unmapped
        self._term_ints = [np.frombuffer(t, dtype="<i4") for t in self._terms]
        self._mask = d.term_length - 1
        self._shift = d.term_length.bit_length() - 1
        self._known_stop = d.stop_position
        self._recording_active = d.active
        self._connected = False
        self._connect_deadline_ns = time.monotonic_ns() + connect_timeout_ns
        self.connect_timeout_ns = connect_timeout_ns
        self.is_done = False
        self.error: str | None = None
        self.subscriber_left = False
        """The replay ended because its subscribers went away (how a client stops a replay it no longer wants)."""
        self._scratch = np.empty(d.term_length // dh.HEADER_LENGTH, dtype=np.int32)
        self._scratch_lengths = np.empty_like(self._scratch)
        self._log = structlog.get_logger().bind(
            role="replay", recording_id=recording_id, stream_id=stream_id, session_id=self.publication.session_id
        )
        self._log.info("replay.started", position=start, length=length, channel=self.channel, recording_active=d.active)

    @property
    def session_id(self) -> int:
        """The replay publication's session id (the replay image's)."""
        return self.publication.session_id

    # -- duty cycle --------------------------------------------------------------------------------------
    def do_work(self) -> int:
        """Append what can be appended now; returns the bytes replayed (0 when waiting or done)."""
        if self.is_done:
            return 0
        publication = self.publication
        if not self._connected:
            if publication.is_connected:
                self._connected = True
            elif time.monotonic_ns() > self._connect_deadline_ns:
                self._fail(
                    f"no subscriber connected to {self.channel} stream {self.stream_id} within "
                    f"{format_duration_ns(self.connect_timeout_ns)}"
                )
                return 0
            else:
                return 0
        elif not publication.is_connected or publication.is_closed:
            self.subscriber_left = True
            self._fail("the replay's subscriber went away")
            return 0
        target = self._target()
        if target is None:
            return 0
        if self.position >= target:
            return 0
        return self._append(target, publication.position_limit)

    def _target(self) -> int | None:
        """How far the replay may go now (None when finished)."""
        end = self.end_position
        if self.position >= self._known_stop and self._recording_active and (end is None or self.position < end):
            d = self._catalog.recording(self.recording_id)
            if d.state != RecordingState.VALID:
                self._fail(f"recording {self.recording_id} became {d.state.name} during the replay")
                return None
            self._known_stop, self._recording_active = d.stop_position, d.active
        target = self._known_stop if end is None else min(end, self._known_stop)
        if self.position >= target and (not self._recording_active or (end is not None and self.position >= end)):
            self._finish()
            return None
        if self._limit_position is not None:
            target = min(target, self._limit_position())
        return target

    def _append(self, target: int, limit: int) -> int:
        position = self.position
        if position >= limit:
            return 0
        term_offset = position & self._mask
        term_begin = position - term_offset
        term_length = self._mask + 1
        hard_end = min(target - term_begin, term_length)
        try:
            view = self._reader.term_view(position)
        except SegmentError as e:
            self._fail(f"recording {self.recording_id}: {e}")
            return 0
        with view:
            if len(view) < term_length:
                self._fail(
                    f"recording {self.recording_id}: segment file for position {position} is truncated "
                    f"({len(view)} of {term_length} bytes of this term)"
                )
                return 0
            soft_end = min(hard_end, limit - term_begin)
            end = _whole_frames_end(view, term_offset, soft_end, hard_end)
            if end == term_offset:
                if soft_end < hard_end:  # below the limit, one frame may go past it (as any publisher's claim)
                    first = dh.align(max(int.from_bytes(view[term_offset : term_offset + 4], "little"), 0))
                    end = _whole_frames_end(view, term_offset, min(hard_end, term_offset + first), hard_end)
                if end == term_offset:
                    if self.end_position is not None and target == self.end_position and soft_end == hard_end:
                        self.end_position = position  # the next frame runs past the requested length
                    return 0
            self._copy(view, term_offset, end, position)
        self.position = term_begin + end
        return end - term_offset

    def _copy(self, view: memoryview, start: int, end: int, position: int) -> None:
        index = (position >> self._shift) % lbd.PARTITION_COUNT
        term = self._terms[index]
        src = view[start:end]
        term[start + 4 : end] = src[4:]
        count = native.frame_index(src, self._scratch, self._scratch_lengths)
        ints = self._term_ints[index]
        session_id, stream_id = self.publication.session_id, self.stream_id
        if count:
            headers = (self._scratch[:count] - dh.HEADER_LENGTH + start) // 4
            ints[headers + dh.SESSION_ID_FIELD_OFFSET // 4] = session_id
            ints[headers + dh.STREAM_ID_FIELD_OFFSET // 4] = stream_id
        for pad in self._pad_offsets(src, start, end, count):
            # padding too: a UDP receiver drops a PAD of another session, and the term would never complete
            ints[(pad + dh.SESSION_ID_FIELD_OFFSET) // 4] = session_id
            ints[(pad + dh.STREAM_ID_FIELD_OFFSET) // 4] = stream_id
        native.put_int32_ordered(term, start, int.from_bytes(src[:4], "little", signed=True))
        src.release()
        term_id = self.descriptor.term_id_of(position)
        native.put_int64_ordered(self._meta, lbd.TERM_TAIL_COUNTERS_OFFSET + 8 * index, lbd.pack_tail(term_id, end))
        if end == self._mask + 1:  # rotate, as an exclusive publication does: next tail, then the term count
            term_count = (position >> self._shift) + 1
            next_index = term_count % lbd.PARTITION_COUNT
            native.put_int64_ordered(
                self._meta, lbd.TERM_TAIL_COUNTERS_OFFSET + 8 * next_index, lbd.pack_tail(term_id + 1, 0)
            )
            native.put_int32_ordered(self._meta, lbd.LOG_ACTIVE_TERM_COUNT_OFFSET, lbd._int32(term_count))

    def _pad_offsets(self, src: memoryview, start: int, end: int, count: int) -> list[int]:
        """Term offsets of the PAD frames among the whole frames ``src`` (``start``..``end`` of the term) holds:
        the gaps between the data frames ``frame_index`` found (padding is rare: a term's end, an aborted claim)."""
        if count:
            headers = self._scratch[:count] - dh.HEADER_LENGTH
            ends = headers + (
                (self._scratch_lengths[:count] + dh.HEADER_LENGTH + dh.FRAME_ALIGNMENT - 1) & -dh.FRAME_ALIGNMENT
            )
            gaps = [int(e) for e in ends[:-1][ends[:-1] != headers[1:]]]
            if headers[0] != 0:
                gaps.insert(0, 0)
            if ends[-1] < end - start:
                gaps.append(int(ends[-1]))
        else:
            gaps = [0]
        pads = []
        data = {int(h) for h in headers} if count and gaps else set()
        for offset in gaps:  # a run of pads: walk it to the next data frame
            while offset < end - start and offset not in data:
                length = int.from_bytes(src[offset : offset + 4], "little", signed=True)
                if length <= 0:
                    break
                pads.append(start + offset)
                offset += dh.align(length)
        return pads

    # -- ending --------------------------------------------------------------------------------------------
    def _finish(self) -> None:
        self._log.info(
            "replay.finished", stop_position=self.position, replayed_length=self.position - self.start_position
        )
        self.close()

    def _fail(self, reason: str) -> None:
        self.error = reason
        self._log.warning("replay.failed", reason=reason, position=self.position)
        self.close()

    def run(self, timeout_s: float | None = None) -> None:
        """Replay until done (blocking); :class:`ReplayError` if it fails or times out."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        idle = 0.0
        while not self.is_done:
            if deadline is not None and time.monotonic() > deadline:
                self._fail(f"replay did not finish within {timeout_s} s (at position {self.position})")
                break
            if self.do_work():
                idle = 0.0
            else:
                idle = min(0.001, idle * 2 or 0.00005)
                time.sleep(idle)
        if self.error is not None:
            raise ReplayError(self.error)

    def close(self) -> None:
        """End the replay: the publication closes, its subscribers see the end of the stream."""
        if self.is_done:
            return
        self.is_done = True
        self._term_ints.clear()  # before the publication's log may be unmapped
        self._meta.release()
        self._reader.close()
        self._catalog.close()
        self.publication.close()

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _whole_frames_end(view: memoryview, start: int, limit: int, hard_limit: int) -> int:
    """Offset after the whole frames from ``start`` that end by ``limit`` (a PAD may reach ``hard_limit``)."""
    offset = start
    while offset < limit:
        end = native.term_scan_block(view, offset, limit)
        if end == offset:
            break
        if end > limit:  # a leading PAD longer than the limit
            if end <= hard_limit:
                offset = end
            break
        offset = end
    return offset
