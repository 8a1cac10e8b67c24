"""Sync: archives converge on the union of the stream histories they hold (``logbuf-archive sync``).

A stream history is the union of one archive's recordings of one publication (:class:`HistoryKey`); its
coverage is the merged ``[start, stop)`` of those recordings, with holes where a recorder was down
(:mod:`archive.sync_digest` has the interval algebra and the range-digest descent). One sync round between
archives, for every history either holds (optionally only some streams):

1. list every archive's recordings (the coverage exchange: one listing per side); an active recording
   counts up to its recorded position, and may be read from (a bounded replay waits for it) but is never
   extended;
2. for each pair and each history both hold, compare the bytes of the common coverage: digest rounds on
   the wire (``SyncDigestRequest``/``SyncDigests``, served by :mod:`archive.sync_service`), descending only
   into blocks whose digests differ (:func:`compare`). A differing leaf is a :class:`Conflict`, reported by
   position with each side's verdict on its frames; when only one side's frames verify, its frames replace
   the other's (``SyncFramesRequest`` from the winner, ``SyncRepairRequest`` to the loser, which checks both
   claims itself); otherwise both copies stay as they are and the conflict stays reported;
3. for each side, ``missing = theirs - mine``; each missing interval is fetched by a Replicate request to
   the side that lacks it, from the other side's recording that holds the interval's start: extending the
   lacking side's recording that ends where the hole begins (the usual case: a recorder that stopped, a
   segment at the end), or, where the source recording starts at the hole, a new copy of it;
4. wait for every replication to end; the bandwidth setting spaces the requests so that at most
   ``bandwidth_bytes_per_s`` are asked for per second.

:func:`sync_forever` runs rounds every ``interval_ns`` (anti-entropy) until told to stop. A hole that no
recording ends at and no source recording starts at is reported as ``unfetchable`` rather than fetched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from logbuf.archive import control_codec as cc
from logbuf.archive.client import ArchiveClient, ArchiveError
from logbuf.archive.sync_digest import (
    DIGEST_LENGTH,
    Interval,
    ReconcileResult,
    Verdict,
    intersect,
    merge,
    pack_intervals,
    reconcile,
    subtract,
)
from logbuf.archive.sync_service import MAX_SYNC_BLOCKS
from logbuf.durations import renamed_duration_arguments

__all__ = [
    "Conflict",
    "DigestSettings",
    "Fetch",
    "HistoryKey",
    "Peer",
    "SyncReport",
    "compare",
    "coverage",
    "histories",
    "listing",
    "plan",
    "sync_forever",
    "sync_once",
]


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
    """One archive in a sync: a connected client, how the other archives reach it as a source, and where
    they answer it when it fetches from them."""

    name: str
    client: ArchiveClient
    control_channel: str
    """This archive's control channel as the other archives see it (``aeron:ipc`` on the same host)."""
    control_stream_id: int
    response_channel: str = ""
    """This archive's endpoint for a remote source's answers when it fetches (Replicate's
    ``srcResponseChannel``; empty when every peer is on this host)."""
    replication_channel: str = ""
    """This archive's endpoint for the replays a remote source sends it (empty: IPC)."""
    connect: Callable[[], ArchiveClient] | None = None
    """How to connect again after the archive was lost (restarted, cut off): :func:`sync_forever` uses it."""


@dataclass(frozen=True)
class Conflict:
    """A range both peers hold whose bytes differ, with each side's verdict on the frames overlapping it."""

    key: HistoryKey
    interval: Interval
    peers: tuple[str, str]
    verdicts: tuple[Verdict, Verdict]
    repaired: bool = False
    """The loser's frames were replaced by the winner's (``sync.conflict_repaired``)."""

    @property
    def winner(self) -> str | None:
        """The peer whose frames verify when the other's fail (None: both or neither, kept as they are)."""
        a, b = self.verdicts
        if a == Verdict.VERIFIES and b == Verdict.FAILS:
            return self.peers[0]
        if b == Verdict.VERIFIES and a == Verdict.FAILS:
            return self.peers[1]
        return None


@dataclass(frozen=True)
class DigestSettings:
    """The digest descent (``protocol_spec/archive-sync.md``): top blocks, children per block, leaves."""

    block_length: int = 1 << 30
    fanout: int = 16
    leaf_length: int = 4096


@dataclass
class SyncReport:
    fetched: list[tuple[str, Fetch]] = field(default_factory=list)
    """(destination peer name, fetch) for each fetch that completed."""
    fetched_bytes: int = 0
    unfetchable: list[tuple[str, HistoryKey, Interval]] = field(default_factory=list)
    failed: list[tuple[str, Fetch, str]] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    compared_bytes: int = 0
    """Bytes of common coverage whose digests were compared (each pair counts its common part once)."""
    digest_rounds: int = 0
    digest_bytes: int = 0
    """Bytes of SyncDigestRequest and SyncDigests messages on the wire, both ways, all pairs."""
    coverage_bytes: int = 0
    """Bytes of the listings (recording descriptors) that gave every side's coverage."""
    behind_bytes: dict[str, int] = field(default_factory=dict)
    """How far behind the union each peer was when the round planned its fetches (bytes it lacked)."""

    @property
    def exchanged_bytes(self) -> int:
        """What crossed the network for this round beside the fetched bytes themselves."""
        return self.coverage_bytes + self.digest_bytes


def _history_fields(key: HistoryKey) -> dict[str, Any]:
    """The fields that name a stream history in the sync messages (ids are filled in by the client)."""
    return {
        "control_session_id": 0,
        "correlation_id": 0,
        "session_id": key.session_id,
        "stream_id": key.stream_id,
        "initial_term_id": key.initial_term_id,
        "term_buffer_length": key.term_length,
        "channel": key.channel,
    }


def _digest_request(
    key: HistoryKey, common: Sequence[Interval], blocks: Sequence[Interval], verify: bool
) -> cc.SyncDigestRequest:
    return cc.SyncDigestRequest(
        **_history_fields(key),
        verify=cc.BooleanType.TRUE if verify else cc.BooleanType.FALSE,
        common=pack_intervals(common),
        blocks=pack_intervals(blocks),
    )


class _DigestAsker:
    """One peer's side of a comparison: batches of blocks to SyncDigestRequests, counting wire bytes."""

    def __init__(self, peer: Peer, key: HistoryKey, common: Sequence[Interval]) -> None:
        self.peer, self.key, self.common = peer, key, list(common)
        self.wire_bytes = 0

    def ask(self, blocks: Sequence[Interval], verify: bool = False) -> tuple[list[bytes], bytes]:
        digests: list[bytes] = []
        verdicts = b""
        for i in range(0, len(blocks), MAX_SYNC_BLOCKS):
            request = _digest_request(self.key, self.common, blocks[i : i + MAX_SYNC_BLOCKS], verify)
            response = self.peer.client.sync_digests(request)
            self.wire_bytes += len(cc.encode(request)) + len(cc.encode(response))
            got = response.digests
            digests.extend(got[j : j + DIGEST_LENGTH] for j in range(0, len(got), DIGEST_LENGTH))
            verdicts += response.verdicts
        if (
            any(len(x) != DIGEST_LENGTH for x in digests)
            or len(digests) != len(blocks)
            or (verify and len(verdicts) != len(blocks))
        ):
            raise ValueError(f"peer {self.peer.name} answered {len(digests)} digests for {len(blocks)} blocks")
        return digests, verdicts

    def digests(self, blocks: list[Interval]) -> list[bytes]:
        return self.ask(blocks)[0]


def compare(
    a: Peer,
    b: Peer,
    key: HistoryKey,
    common: Sequence[Interval],
    settings: DigestSettings = DigestSettings(),
    *,
    repair: bool = True,
) -> tuple[ReconcileResult, list[Conflict], int]:
    """Compare the bytes two peers hold of ``common`` of one history through digest rounds on the wire.

    Returns the descent's result, the conflicts (each leaf range with both sides' verdicts, asked for in one
    more round) and the bytes the digest (and repair) messages took on the wire. With ``repair``, a conflict
    with a winner (its frames verify, the other side's fail) is repaired: the winner's frames overlapping the
    range are read (SyncFramesRequest) and written over the loser's (SyncRepairRequest, which the loser
    refuses unless the given frames verify and its own do not)."""
    ask_a, ask_b = _DigestAsker(a, key, common), _DigestAsker(b, key, common)
    result = reconcile(
        ask_a.digests,
        ask_b.digests,
        common,
        block_length=settings.block_length,
        fanout=settings.fanout,
        leaf_length=settings.leaf_length,
    )
    conflicts: list[Conflict] = []
    repair_bytes = 0
    if result.conflicts:
        _, verdicts_a = ask_a.ask(result.conflicts, verify=True)
        _, verdicts_b = ask_b.ask(result.conflicts, verify=True)
        for interval, va, vb in zip(result.conflicts, verdicts_a, verdicts_b, strict=True):
            conflict = Conflict(key, interval, (a.name, b.name), (Verdict(va), Verdict(vb)))
            if repair and conflict.winner is not None:
                winner, loser = (a, b) if conflict.winner == a.name else (b, a)
                repair_bytes += _repair(winner, loser, key, interval, settings.leaf_length)
                conflict = replace(conflict, repaired=True)
            conflicts.append(conflict)
    return result, conflicts, ask_a.wire_bytes + ask_b.wire_bytes + repair_bytes


def _repair(winner: Peer, loser: Peer, key: HistoryKey, interval: Interval, leaf_length: int) -> int:
    """Copy the winner's frames over the loser's, one leaf at a time; returns the bytes on the wire."""
    wire = 0
    for start in range(interval[0], interval[1], leaf_length):
        ask = cc.SyncFramesRequest(**_history_fields(key), start=start, end=min(interval[1], start + leaf_length))
        frames = winner.client.sync_frames(ask)
        write = cc.SyncRepairRequest(**_history_fields(key), position=frames.position, frames=frames.frames)
        loser.client.sync_repair(write)
        wire += len(cc.encode(ask)) + len(cc.encode(frames)) + len(cc.encode(write))
    return wire


def _compare_all(
    peers: Sequence[Peer],
    listings: dict[str, tuple[list[cc.RecordingDescriptor], set[int]]],
    settings: DigestSettings,
    report: SyncReport,
) -> None:
    log = structlog.get_logger().bind(role="archive-sync")
    for i, a in enumerate(peers):
        for b in peers[i + 1 :]:
            mine, theirs = histories(listings[a.name][0]), histories(listings[b.name][0])
            for key in sorted(mine.keys() & theirs.keys()):
                common = intersect(coverage(mine[key]), coverage(theirs[key]))
                if not common:
                    continue
                result, conflicts, wire_bytes = compare(a, b, key, common, settings)
                report.compared_bytes += sum(end - start for start, end in common)
                report.digest_rounds += result.rounds + (2 if conflicts else 0)
                report.digest_bytes += wire_bytes
                for conflict in conflicts:
                    report.conflicts.append(conflict)
                    log.warning(
                        "sync.conflict",
                        peers=list(conflict.peers),
                        stream_id=key.stream_id,
                        session_id=key.session_id,
                        start=conflict.interval[0],
                        end=conflict.interval[1],
                        verdicts=[v.name for v in conflict.verdicts],
                        winner=conflict.winner,
                        repaired=conflict.repaired,
                    )


def _replicate(dst: Peer, src: Peer, fetch: Fetch) -> int:
    return dst.client.replicate(
        fetch.src_recording_id,
        src.control_channel,
        src_control_stream_id=src.control_stream_id,
        dst_recording_id=fetch.dst_recording_id,
        stop_position=fetch.end,
        src_response_channel=dst.response_channel,
        replication_channel=dst.replication_channel,
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


@renamed_duration_arguments({"timeout_s": ("timeout_ns", 1_000_000_000)})
def sync_once(
    peers: Sequence[Peer],
    *,
    stream_ids: set[int] | None = None,
    bandwidth_bytes_per_s: int = 0,
    timeout_ns: int = 60_000_000_000,
    digests: DigestSettings | None = DigestSettings(),
) -> SyncReport:
    """One round between every pair of peers (each learns from each); 0 bandwidth: unbounded.

    ``digests`` None skips the comparison of what both hold (only missing ranges are fetched)."""
    log = structlog.get_logger().bind(role="archive-sync")
    report = SyncReport()
    listings = {p.name: listing(p.client, stream_ids) for p in peers}
    report.coverage_bytes = sum(len(cc.encode(d)) for mine, _ in listings.values() for d in mine)
    if digests is not None:
        _compare_all(peers, listings, digests, report)
    started = time.monotonic()
    for dst in peers:
        for src in peers:
            if src is dst:
                continue
            fetches, unfetchable = plan(listings[dst.name][0], listings[src.name][0], listings[dst.name][1])
            lacking = sum(f.end - f.start for f in fetches) + sum(i[1] - i[0] for _, i in unfetchable)
            report.behind_bytes[dst.name] = report.behind_bytes.get(dst.name, 0) + lacking
            report.unfetchable.extend((dst.name, key, interval) for key, interval in unfetchable)
            for fetch in fetches:
                if bandwidth_bytes_per_s > 0:
                    due = started + report.fetched_bytes / bandwidth_bytes_per_s
                    time.sleep(max(0.0, due - time.monotonic()))
                replication_id = _replicate(dst, src, fetch)
                error = _await_end(dst, replication_id, time.monotonic() + timeout_ns / 1e9)
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


def _reachable(peer: Peer, suspect: bool) -> bool:
    """Whether the peer's client still has its session; if not (or if a round with it failed: the client
    may have reported its lost session once already), one attempt to connect again."""
    log = structlog.get_logger().bind(role="archive-sync")
    try:
        peer.client.poll()
        if not suspect:
            return True
    except ArchiveError as e:
        log.warning("sync.peer_lost", peer=peer.name, error=str(e))
    if peer.connect is None:
        return not suspect
    try:
        peer.client.close()
    except (ArchiveError, OSError):
        pass
    try:
        peer.client = peer.connect()
    except ArchiveError as e:
        log.warning("sync.peer_unreachable", peer=peer.name, error=str(e))
        return False
    log.info("sync.peer_reconnected", peer=peer.name)
    return True


@renamed_duration_arguments({"interval_s": ("interval_ns", 1_000_000_000), "timeout_s": ("timeout_ns", 1_000_000_000)})
def sync_forever(
    peers: Sequence[Peer],
    stop: threading.Event,
    *,
    interval_ns: int = 1_000_000_000,
    on_report: Callable[[SyncReport], None] | None = None,
    stream_ids: set[int] | None = None,
    bandwidth_bytes_per_s: int = 0,
    timeout_ns: int = 60_000_000_000,
    digests: DigestSettings | None = DigestSettings(),
) -> int:
    """Anti-entropy: every ``interval_ns`` until ``stop`` is set, a :func:`sync_once` round for each pair of
    reachable peers; returns the pair rounds run.

    A peer whose session was lost (restarted, cut off) is connected again through :attr:`Peer.connect`; a
    pair whose round fails is logged (``sync.round_failed``) and tried again at the next interval, while the
    other pairs go on: a peer that is cut off or restarted catches up with no operator action."""
    log = structlog.get_logger().bind(role="archive-sync")
    rounds = 0
    suspects: set[str] = set()
    while not stop.is_set():
        up = [peer for peer in peers if _reachable(peer, peer.name in suspects)]
        suspects.clear()
        for i, a in enumerate(up):
            for b in up[i + 1 :]:
                if stop.is_set():
                    break
                try:
                    report = sync_once(
                        [a, b],
                        stream_ids=stream_ids,
                        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
                        timeout_ns=timeout_ns,
                        digests=digests,
                    )
                except (ArchiveError, ValueError) as e:
                    log.warning("sync.round_failed", peers=[a.name, b.name], error=str(e))
                    suspects.update((a.name, b.name))
                    continue
                rounds += 1
                if on_report is not None:
                    on_report(report)
        stop.wait(interval_ns / 1e9)
    return rounds
