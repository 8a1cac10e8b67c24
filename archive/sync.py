"""Sync: archives converge on the union of the stream histories they hold (``logbuf-archive sync``).

A stream history is the union of one archive's recordings of one publication (:class:`HistoryKey`); its
coverage is the merged ``[start, stop)`` of those recordings, with holes where a recorder was down
(:mod:`archive.sync_digest` has the interval algebra and the range-digest descent). One sync round between
two archives, for every history either holds (optionally only some streams):

1. list both archives' recordings (the coverage exchange: one listing per side); an active recording
   counts up to its recorded position, and may be read from (a bounded replay waits for it) but is never
   extended;
2. for each side, ``missing = theirs - mine``; each missing interval is fetched by a Replicate request to
   the side that lacks it, from the other side's recording that holds the interval's start: extending the
   lacking side's recording that ends where the hole begins (the usual case: a recorder that stopped, a
   segment at the end), or, where the source recording starts at the hole, a new copy of it;
3. wait for every replication to end; the bandwidth setting spaces the requests so that at most
   ``bandwidth_bytes_per_s`` are asked for per second.

Not done here yet (see ``protocol_spec/archive-sync.md``): the digest rounds that compare the bytes both
sides hold (conflicts) need the sync extension templates in the control codec; a hole that no recording
ends at and no source recording starts at is reported as ``unfetchable`` rather than fetched.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import structlog

from logbuf.archive import control_codec as cc
from logbuf.archive.client import ArchiveClient
from logbuf.archive.sync_digest import Interval, merge, subtract

__all__ = ["Fetch", "HistoryKey", "Peer", "SyncReport", "coverage", "histories", "listing", "plan", "sync_once"]


@dataclass(frozen=True, order=True)
class HistoryKey:
    """One publication as recorded anywhere: its positions are the same on every archive."""

    stream_id: int
    session_id: int
    channel: str
    initial_term_id: int
    term_length: int


def key_of(d: cc.RecordingDescriptor) -> HistoryKey:
    return HistoryKey(d.stream_id, d.session_id, d.original_channel, d.initial_term_id, d.term_buffer_length)


def histories(descriptors: Iterable[cc.RecordingDescriptor]) -> dict[HistoryKey, list[cc.RecordingDescriptor]]:
    """Recordings grouped by history (an active one with its recorded position as its stop position, as
    :func:`listing` gives it; one still at -1 is left out)."""
    out: dict[HistoryKey, list[cc.RecordingDescriptor]] = {}
    for d in descriptors:
        if d.stop_position >= 0 and d.stop_position > d.start_position:
            out.setdefault(key_of(d), []).append(d)
    return out


def coverage(recordings: Sequence[cc.RecordingDescriptor]) -> list[Interval]:
    return merge((d.start_position, d.stop_position) for d in recordings)


@dataclass(frozen=True)
class Fetch:
    """Copy ``[start, end)`` of the source's recording into the destination (a Replicate request)."""

    key: HistoryKey
    src_recording_id: int
    dst_recording_id: int
    """-1: a new copy of the source recording (it starts at ``start``)."""
    start: int
    end: int


def listing(client: ArchiveClient, stream_ids: set[int] | None = None) -> tuple[list[cc.RecordingDescriptor], set[int]]:
    """An archive's recordings (active ones with their recorded position as stop position) and the ids of
    the active ones (a copy may read from them but never extends them)."""
    out, active = [], set()
    for d in client.list_recordings():
        if stream_ids is not None and d.stream_id not in stream_ids:
            continue
        if d.stop_position < 0:
            active.add(d.recording_id)
            d = replace(d, stop_position=client.recording_position(d.recording_id))
        out.append(d)
    return out, active


def plan(
    mine: Sequence[cc.RecordingDescriptor],
    theirs: Sequence[cc.RecordingDescriptor],
    active_mine: set[int] | frozenset[int] = frozenset(),
) -> tuple[list[Fetch], list[tuple[HistoryKey, Interval]]]:
    """The fetches that give ``mine`` what ``theirs`` holds, and the missing intervals no fetch can reach
    (``active_mine``: my recordings being written, which cannot be extended)."""
    my_histories, their_histories = histories(mine), histories(theirs)
    fetches: list[Fetch] = []
    unfetchable: list[tuple[HistoryKey, Interval]] = []
    for key, recordings in sorted(their_histories.items()):
        own = my_histories.get(key, [])
        for lo, hi in subtract(coverage(recordings), coverage(own)):
            position = lo
            while position < hi:
                src = next((d for d in recordings if d.start_position <= position < d.stop_position), None)
                if src is None:  # cannot happen: the interval is inside their coverage
                    unfetchable.append((key, (position, hi)))
                    break
                end = min(hi, src.stop_position)
                dst = next((d for d in own if d.stop_position == position and d.recording_id not in active_mine), None)
                if dst is not None:
                    fetches.append(Fetch(key, src.recording_id, dst.recording_id, position, end))
                elif src.start_position == position:
                    fetches.append(Fetch(key, src.recording_id, -1, position, end))
                else:
                    unfetchable.append((key, (position, end)))
                position = end
    return fetches, unfetchable


@dataclass
class Peer:
    """One archive in a sync: a connected client, and how *another* archive reaches it as a source."""

    name: str
    client: ArchiveClient
    control_channel: str
    """This archive's control channel as the other archive sees it (``aeron:ipc`` on the same host)."""
    control_stream_id: int
    response_channel: str = ""
    """For a remote peer: the *other* archive's endpoint for this archive's answers."""
    replication_channel: str = ""
    """For a remote peer: the *other* archive's endpoint for replays from this archive."""


@dataclass
class SyncReport:
    fetched: list[tuple[str, Fetch]] = field(default_factory=list)
    """(destination peer name, fetch) for each fetch that completed."""
    fetched_bytes: int = 0
    unfetchable: list[tuple[str, HistoryKey, Interval]] = field(default_factory=list)
    failed: list[tuple[str, Fetch, str]] = field(default_factory=list)


def _replicate(dst: Peer, src: Peer, fetch: Fetch) -> int:
    return dst.client.replicate(
        fetch.src_recording_id,
        src.control_channel,
        src_control_stream_id=src.control_stream_id,
        dst_recording_id=fetch.dst_recording_id,
        stop_position=fetch.end,
        src_response_channel=src.response_channel,
        replication_channel=src.replication_channel,
    )


def _await_end(peer: Peer, replication_id: int, deadline: float) -> str | None:
    """None when the replication ended well, else why not."""
    while time.monotonic() < deadline:
        peer.client.poll()
        for signal in peer.client.signals:
            if signal.subscription_id == replication_id and signal.signal == cc.RecordingSignal.REPLICATE_END:
                peer.client.signals.remove(signal)
                errors = [e for e in peer.client.errors if e.error_message]
                return errors[-1].error_message if errors else None
        time.sleep(0.005)
    return f"replication {replication_id} did not end in time"


def sync_once(
    peers: Sequence[Peer],
    *,
    stream_ids: set[int] | None = None,
    bandwidth_bytes_per_s: int = 0,
    timeout_s: float = 60.0,
) -> SyncReport:
    """One round between every pair of peers (each learns from each); 0 bandwidth: unbounded."""
    log = structlog.get_logger().bind(role="archive-sync")
    report = SyncReport()
    listings = {p.name: listing(p.client, stream_ids) for p in peers}
    started = time.monotonic()
    for dst in peers:
        for src in peers:
            if src is dst:
                continue
            fetches, unfetchable = plan(listings[dst.name][0], listings[src.name][0], listings[dst.name][1])
            report.unfetchable.extend((dst.name, key, interval) for key, interval in unfetchable)
            for fetch in fetches:
                if bandwidth_bytes_per_s > 0:
                    due = started + report.fetched_bytes / bandwidth_bytes_per_s
                    time.sleep(max(0.0, due - time.monotonic()))
                replication_id = _replicate(dst, src, fetch)
                error = _await_end(dst, replication_id, time.monotonic() + timeout_s)
                if error is not None:
                    report.failed.append((dst.name, fetch, error))
                    log.warning("sync.fetch_failed", peer=dst.name, source=src.name, error=error)
                    continue
                report.fetched.append((dst.name, fetch))
                report.fetched_bytes += fetch.end - fetch.start
                log.info(
                    "sync.fetched",
                    peer=dst.name,
                    source=src.name,
                    start=fetch.start,
                    end=fetch.end,
                    stream_id=fetch.key.stream_id,
                    session_id=fetch.key.session_id,
                )
            # what dst now holds changed: later sources are planned against its fresh listing
            listings[dst.name] = listing(dst.client, stream_ids)
    return report
