"""Catch up from the archive, then live: a subscription that starts in the past and merges onto the live stream.

Theory of operation
-------------------
Aeron's ``ReplayMerge`` replays into a multi-destination subscription, adds the live destination when the
replay is close, and lets the one image take the live stream's frames once the replay reaches them. logbuf
has no multi-destination subscriptions, and does not need one: a recording's positions are the live
stream's positions (the recorder records the live image from its join position with the same initial term
id), so two images and one rule do it:

1. ``REPLAY``: replay the recording from the start position, following it while it grows; deliver
   every fragment. Every ``progress_interval`` ask the archive for the recorded position.
2. When the replay is within ``live_add_threshold`` bytes of the recorded position (a quarter of a term by
   default, as Aeron's ``LIVE_ADD_MAX_WINDOW``), add the live subscription: ``LIVE_ADDED``.
3. The live image appears with its join position ``J`` (the live publication's tail when it joined;
   frames from ``J`` on are kept for it by flow control): ``CATCHING_UP``. The replay goes on, delivering
   fragments that end at or before ``J`` (``controlled_poll`` stops at the first that ends past it:
   frame boundaries are the same in both).
4. When the replay's position reaches ``J``: ``MERGED``. The replay is stopped and the live image is
   polled from ``J``. A message cut in two by ``J`` is completed: the partial message moves to the live
   session in the assembler.

Every message is delivered once, in order, with positions continuous across the switch. If the live
stream runs faster than the replay, step 2 waits (``behind`` says how far) and the live stream is never
held back by this subscriber before it is added; once added, the live image holds the publisher (IPC) or
the receiver window (UDP) only for the bytes between the replay and ``J``, at most the threshold.

A start position before the recording's start (its oldest segments were purged) is an
:class:`~archive.client.InvalidPositionError` naming both, or, with ``oldest_if_purged``, starts at the
oldest position kept (``skipped`` says how many bytes were lost). A replay or live image that goes away
before the merge, or a service that goes away, is an error naming which.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable
from typing import Any

import structlog

from logbuf.archive import control_codec as cc
from logbuf.archive.client import ArchiveClient, ArchiveError, InvalidPositionError, replay_image_session_id
from logbuf.client import Image, Subscription
from logbuf.durations import format_duration_ns, renamed_duration_keywords
from logbuf.logbuffer.fragment_assembler import FragmentAssembler
from logbuf.logbuffer.image import ControlledPollAction

__all__ = ["ReplayMerge", "ReplayMergeError", "ReplayMergeState", "position_at_time"]


class ReplayMergeError(ArchiveError):
    """The catch-up could not go on (the message says why: the replay or live stream went away, ...)."""


class ReplayMergeState(enum.Enum):
    REPLAY = "REPLAY"
    LIVE_ADDED = "LIVE_ADDED"
    CATCHING_UP = "CATCHING_UP"
    MERGED = "MERGED"
    FAILED = "FAILED"


@renamed_duration_keywords(
    {
        "progress_interval_ms": ("progress_interval_ns", 1_000_000),
        "live_join_timeout_ms": ("live_join_timeout_ns", 1_000_000),
    }
)
class ReplayMerge:
    """A subscription from a recording's past onto the live stream (see the module doc).

    merge = ReplayMerge(archive, recording_id, live_channel="aeron:ipc", live_stream_id=10,
                        replay_channel="aeron:ipc", replay_stream_id=99, start_position=0)
    # or start_time=<a reserved value, e.g. epoch us>: the archive (local or remote) seeks its time index
    while True:
        merge.poll(handler, 100)          # handler(payload, header): whole messages, once each, in order
    """

    def __init__(
        self,
        archive: ArchiveClient,
        recording_id: int,
        *,
        live_channel: str,
        live_stream_id: int,
        replay_channel: str,
        replay_stream_id: int,
        start_position: int | None = None,
        start_time: int | None = None,
        archive_dir: str | os.PathLike[str] | None = None,
        oldest_if_purged: bool = False,
        live_add_threshold: int | None = None,
        progress_interval_ns: int = 50_000_000,
        live_join_timeout_ns: int = 10_000_000_000,
    ) -> None:
        self.archive = archive
        self.recording_id = recording_id
        self.live_channel, self.live_stream_id = live_channel, live_stream_id
        self.replay_channel, self.replay_stream_id = replay_channel, replay_stream_id
        descriptor = archive.list_recording(recording_id)
        self.session_id = descriptor.session_id
        """The live publication's session id (the recording's)."""
        self.skipped = 0
        if start_time is not None:  # "the last 10 minutes": through the archive's time index
            if start_position is not None:
                raise ValueError("give start_time or start_position, not both")
            if archive_dir is not None:  # this host holds the archive: read it directly
                start_position = position_at_time(archive_dir, recording_id, start_time)
            else:
                start_position = archive.position_at_time(recording_id, start_time)
        start = descriptor.start_position if start_position is None else start_position
        if start < descriptor.start_position:
            if not oldest_if_purged:
                raise InvalidPositionError(
                    f"start position {start} of recording {recording_id} was purged: the oldest position kept is "
                    f"{descriptor.start_position} (pass oldest_if_purged=True to start there)",
                    cc.ArchiveErrorCode.INVALID_POSITION,
                    -1,
                )
            self.skipped = descriptor.start_position - start
            start = descriptor.start_position
        self.start_position = start
        self.position = start
        """The position after the last fragment delivered."""
        self.threshold = live_add_threshold if live_add_threshold is not None else descriptor.term_buffer_length // 4
        self.state = ReplayMergeState.REPLAY
        self.recorded_position = start
        self.live_join_position = -1
        self._progress_interval_ns = progress_interval_ns
        self._next_progress_ms = 0
        self._live_join_timeout_ns = live_join_timeout_ns
        self._live_deadline_ms = 0
        self._live_subscription: Subscription | None = None
        self._live_image: Image | None = None
        self._skip_until = -1
        self._assembler = FragmentAssembler(_no_handler)
        """Its delegate is the caller's handler: an unfragmented message costs one Python call, the caller's."""
        self._log = structlog.get_logger().bind(role="replay-merge", recording_id=recording_id)
        self._replay_subscription, self._replay_session_id = archive.replay(
            recording_id, stream_id=replay_stream_id, channel=replay_channel, position=start, length=None
        )
        self._replay_image_session = replay_image_session_id(self._replay_session_id)
        self._replay_image: Image | None = None
        self._replay_stopped = False
        self._log.info("replay_merge.started", start_position=start, threshold=self.threshold)

    # -- progress --------------------------------------------------------------------------------------------
    @property
    def is_merged(self) -> bool:
        return self.state is ReplayMergeState.MERGED

    @property
    def behind(self) -> int:
        """Bytes between what was delivered and the live stream (the recorded position, or the live image's)."""
        if self._live_image is not None and not self._live_image.is_closed:
            live = max(self.live_join_position, self._live_image_tail())
            return max(live - self.position, 0)
        return max(self.recorded_position - self.position, 0)

    def _live_image_tail(self) -> int:
        image = self._live_image
        if image is None:
            return -1
        return max(image._log_buffers.tail_position(), image.position)  # an IPC log's tail; a UDP image's may lag

    # -- polling -----------------------------------------------------------------------------------------------
    def _on_replay_fragment(self, payload: memoryview, header: Any) -> ControlledPollAction:
        if self.live_join_position >= 0 and header.position > self.live_join_position:
            return ControlledPollAction.ABORT
        self._assembler(payload, header)
        self.position = header.position
        return ControlledPollAction.CONTINUE

    def poll(self, handler: Callable[[memoryview, Any], Any], fragment_limit: int = 100) -> int:
        """Deliver up to ``fragment_limit`` fragments' worth of whole messages; returns fragments read."""
        self._assembler.delegate = handler
        if self.state is ReplayMergeState.MERGED:
            image = self._live_image
            assert image is not None
            if image.is_closed:
                raise ReplayMergeError(f"the live stream {self.live_channel} stream {self.live_stream_id} went away")
            if image.position < self._skip_until:  # the live image joined behind what the replay delivered
                skip_until, assembler = self._skip_until, self._assembler
                work = image.poll(lambda p, h: assembler(p, h) if h.position > skip_until else None, fragment_limit)
            else:
                work = image.poll(self._assembler, fragment_limit)
            self.position = max(self.position, image.position)
            return work
        if self.state is ReplayMergeState.FAILED:
            raise ReplayMergeError("this catch-up failed earlier")
        try:
            return self._poll_replay(fragment_limit)
        except BaseException:
            self.state = ReplayMergeState.FAILED
            self._close_replay()
            raise

    def _poll_replay(self, fragment_limit: int) -> int:
        now_ms = time.monotonic_ns() // 1_000_000
        if self.state is ReplayMergeState.LIVE_ADDED:
            self._find_live_image(now_ms)  # the replay waits meanwhile, so J is known before it goes on
            if self.state is ReplayMergeState.LIVE_ADDED:
                return 0
        image = self._replay_image
        if image is None:
            image = self._replay_subscription.image_by_session_id(self._replay_image_session)
            if image is None:
                self._housekeeping(now_ms)
                return 0
            self._replay_image = image
        if self.state is ReplayMergeState.CATCHING_UP:  # fragment by fragment, to stop exactly at J
            work = image.controlled_poll(self._on_replay_fragment, fragment_limit)
        else:  # nothing to stop at yet: the plain poll, the position read after it
            work = image.poll(self._assembler, fragment_limit)
            self.position = image.position
        if not work:
            if image.is_closed or image.is_end_of_stream:
                raise ReplayMergeError(
                    f"the replay of recording {self.recording_id} ended at position {self.position} before it "
                    "reached the live stream (the recording stopped, or the archive ended the replay)"
                )
            self._housekeeping(now_ms)
        if self.state is ReplayMergeState.REPLAY and self.recorded_position - self.position <= self.threshold:
            self._add_live(now_ms)
        if self.state is ReplayMergeState.CATCHING_UP and self.position >= self.live_join_position:
            self._merge()
        return work

    def _housekeeping(self, now_ms: int) -> None:
        if now_ms < self._next_progress_ms:
            return
        self._next_progress_ms = now_ms + self._progress_interval_ns // 1_000_000  # the archive client's ms clock
        self.archive.poll()
        for error in self.archive.errors:
            raise ReplayMergeError(f"the archive ended the replay: {error.error_message}")
        if self.state is ReplayMergeState.REPLAY:
            position = self.archive.max_recorded_position(self.recording_id)
            self.recorded_position = max(self.recorded_position, position)

    def _add_live(self, now_ms: int) -> None:
        self._live_subscription = self.archive.aeron.add_subscription(self.live_channel, self.live_stream_id)
        self._live_deadline_ms = now_ms + self._live_join_timeout_ns // 1_000_000
        self.state = ReplayMergeState.LIVE_ADDED
        self._log.info("replay_merge.live_added", position=self.position, recorded_position=self.recorded_position)

    def _find_live_image(self, now_ms: int) -> None:
        assert self._live_subscription is not None
        image = self._live_subscription.image_by_session_id(self.session_id)
        if image is None:
            if now_ms > self._live_deadline_ms:
                raise ReplayMergeError(
                    f"no live image of session {self.session_id} on {self.live_channel} stream {self.live_stream_id} "
                    f"within {format_duration_ns(self._live_join_timeout_ns)} (is the publisher still there?)"
                )
            return
        self._live_image = image
        self.live_join_position = image.position  # below the replay's position if this host's image lags:
        self.state = ReplayMergeState.CATCHING_UP  # then the merge skips what the replay delivered already
        self._log.info("replay_merge.live_joined", join_position=self.live_join_position, position=self.position)

    def _merge(self) -> None:
        image = self._live_image
        assert image is not None
        replay_session = self._replay_image.session_id if self._replay_image is not None else 0
        self._assembler.move_session(replay_session, image.session_id)
        self._skip_until = self.position
        self._close_replay()
        self.state = ReplayMergeState.MERGED
        self._log.info("replay_merge.merged", position=self.position, replayed=self.position - self.start_position)

    def _close_replay(self) -> None:
        if self._replay_stopped:
            return
        self._replay_stopped = True
        try:
            self.archive.stop_replay(self._replay_session_id)
        except ArchiveError as e:  # it ended already (or the archive is gone): closing the subscription is enough
            self._log.debug("replay_merge.stop_replay_failed", error=str(e))
        self._replay_subscription.close()

    def close(self) -> None:
        self._close_replay()
        if self._live_subscription is not None:
            self._live_subscription.close()
            self._live_subscription = None

    def __enter__(self) -> ReplayMerge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _no_handler(payload: memoryview, header: Any) -> None:
    raise ReplayMergeError("ReplayMerge.poll sets the handler")


def position_at_time(archive_dir: str | os.PathLike[str], recording_id: int, time_value: int) -> int:
    """The position of the first message of a recording whose reserved value (the publisher's timestamp) is
    at least ``time_value`` (the recording's stop position if none is), read from an archive directory on
    this host (a remote archive answers :meth:`ArchiveClient.position_at_time`)."""
    from logbuf.archive.catalog import Catalog
    from logbuf.archive.time_seek import seek_time

    with Catalog.open(archive_dir) as catalog:
        d = catalog.recording(recording_id)
    return seek_time(archive_dir, d, time_value, d.stop_position)
