"""Sync between two archive services on one driver: each fetches exactly the ranges it lacks.

Archive A records a live stream from its start, stops for a while and records again (a hole); archive B
starts recording later (it lacks the beginning). One sync round extends A's first recording across its hole
from B's copy and gives B a copy of A's beginning: then both hold every position, byte for byte the same,
every message once and in order, and nothing else moved.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from logbuf.archive import control_codec as cc
from logbuf.archive.catalog import Catalog
from logbuf.archive.checksum import payload_checksum
from logbuf.archive.client import ArchiveClient, ArchiveClientContext, ArchiveRequestError
from logbuf.archive.recording import RecordingDescriptor
from logbuf.archive.segments import segment_base_position, segment_file_name
from logbuf.archive.service import ArchiveService
from logbuf.archive.service_context import ArchiveContext
from logbuf.archive.sync import DigestSettings, Peer, listing, sync_once
from logbuf.archive.sync_digest import Verdict, merge
from logbuf.archive.verify import verify_recording
from logbuf.client import Aeron, Context
from logbuf.client.stat import archive_counters
from logbuf.logbuffer import data_header_descriptor as dh
from tests.archive.service_kit import SequencedPublisher, await_, recorded_seqs, recorded_stream
from tests.support.driver_process import DriverProcess, DriverSet

LIVE, STREAM, LENGTH, TIMEOUT_S = "aeron:ipc", 1001, 100, 30


def frame_positions(data: bytes) -> list[int]:
    """Positions of the DATA frames in recorded bytes that start at position 0."""
    out, offset = [], 0
    while offset < len(data):
        frame_length = int.from_bytes(data[offset : offset + 4], "little", signed=True)
        if data[offset + dh.TYPE_FIELD_OFFSET] == dh.HDR_TYPE_DATA:
            out.append(offset)
        offset += dh.align(frame_length)
    return out


def flip_payload_byte(archive_dir: str, d: RecordingDescriptor, position: int, *, restamp: bool) -> None:
    """Change the first payload byte of the frame at ``position`` (and, with ``restamp``, its CRC to match)."""
    base = segment_base_position(d.start_position, position, d.term_length, d.segment_length)
    with open(Path(archive_dir) / segment_file_name(d.recording_id, base), "r+b") as f:
        f.seek(position - base)
        frame = bytearray(f.read(dh.HEADER_LENGTH + LENGTH))
        frame[dh.HEADER_LENGTH] ^= 0xFF
        if restamp:
            crc = payload_checksum(frame[dh.HEADER_LENGTH :])
            frame[dh.SESSION_ID_FIELD_OFFSET : dh.SESSION_ID_FIELD_OFFSET + 4] = crc.to_bytes(4, "little", signed=True)
        f.seek(position - base)
        f.write(frame)


def archive_context(
    driver: DriverProcess, archive_dir: Path, control_stream_id: int, **settings: int
) -> ArchiveContext:
    """An archive service on the test's driver, with per-frame CRCs."""
    return ArchiveContext(
        archive_dir=str(archive_dir),
        driver_dir=driver.dir,
        control_stream_id=control_stream_id,
        checksum="crc32",
        **settings,
    )


@pytest.fixture
def driver(request: pytest.FixtureRequest) -> Iterator[DriverProcess]:
    with DriverSet(request) as drivers:
        yield drivers.start(DriverProcess(args=["--dir-delete-on-shutdown", "false"]))


def test_one_sync_round_fills_a_hole_on_one_side_and_a_missing_beginning_on_the_other(
    driver: DriverProcess, tmp_path: Path
) -> None:
    def context(name: str, control_stream_id: int) -> ArchiveContext:
        return archive_context(driver, tmp_path / name, control_stream_id, segment_length=1 << 20)

    with (
        Aeron.connect(Context(dir=driver.dir)) as aeron,
        ArchiveService.launch(context("a", 10)) as service_a,
        ArchiveService.launch(context("b", 11)) as service_b,
        ArchiveClient.connect(ArchiveClientContext(aeron=aeron, control_stream_id=10)) as a,
        ArchiveClient.connect(ArchiveClientContext(aeron=aeron, control_stream_id=11)) as b,
    ):
        publication = aeron.add_exclusive_publication(LIVE, STREAM)
        publisher = SequencedPublisher(publication, length=LENGTH, rate=20_000)

        def publish(count: int) -> None:
            target = publisher.sent + count
            await_(lambda: publisher.sent >= target, TIMEOUT_S, f"{count} more messages")

        def caught_up(client: ArchiveClient) -> None:
            await_(
                lambda: all(
                    client.recording_position(d.recording_id) >= publication.position
                    for d in client.list_recordings()
                    if d.stop_position < 0
                ),
                TIMEOUT_S,
                "the recordings to catch up",
            )

        a.start_recording(LIVE, STREAM)
        publisher.start()
        publish(3_000)
        b.start_recording(LIVE, STREAM)  # B lacks the beginning
        publish(3_000)
        caught_up(a)
        a.stop_recording(LIVE, STREAM)  # A's hole starts
        publish(3_000)
        a.start_recording(LIVE, STREAM)
        publish(3_000)
        publisher.stop()
        caught_up(a)
        caught_up(b)
        end = publication.position  # both archives still record (live): sync reads from active recordings

        def covered(client: ArchiveClient) -> list[tuple[int, int]]:
            return merge((d.start_position, d.stop_position) for d in listing(client)[0])

        before_a, before_b = covered(a), covered(b)
        assert len(before_a) == 2 and before_b[0][0] > 0 and before_b[-1][1] == before_a[-1][1] == end

        report = sync_once(
            [
                Peer("a", a, "aeron:ipc", 10),
                Peer("b", b, "aeron:ipc", 11),
            ]
        )
        assert not report.failed and not report.unfetchable
        hole = before_a[0][1], before_a[1][0]
        beginning = 0, before_b[0][0]
        assert sorted((name, f.start, f.end) for name, f in report.fetched) == [("a", *hole), ("b", *beginning)]
        assert report.fetched_bytes == (hole[1] - hole[0]) + (beginning[1] - beginning[0])
        assert report.behind_bytes == {"a": hole[1] - hole[0], "b": beginning[1] - beginning[0]}
        assert covered(a) == covered(b) == [(0, end)]
        a.stop_recording(LIVE, STREAM)
        b.stop_recording(LIVE, STREAM)

        bytes_a = recorded_stream(service_a.ctx.archive_dir, 0, end)
        bytes_b = recorded_stream(service_b.ctx.archive_dir, 0, end)
        assert bytes_a == bytes_b
        assert recorded_seqs(bytes_a, LENGTH) == list(range(publisher.sent))
        for archive_dir in (service_a.ctx.archive_dir, service_b.ctx.archive_dir):
            with Catalog.open(archive_dir) as catalog:
                assert all(verify_recording(archive_dir, d).ok for d in catalog.recordings())

        listed = subprocess.run(
            [sys.executable, "-m", "logbuf.archive.main", "-d", service_b.ctx.archive_dir, "list", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        sources = [json.loads(line)["source"] for line in listed.stdout.splitlines()]
        assert sources[0] is None  # B's own recording
        assert sources[1]["source_recording_id"] == 0 and sources[1]["source_archive_id"] == a.archive_id()

        peers = [Peer("a", a, "aeron:ipc", 10), Peer("b", b, "aeron:ipc", 11)]
        again = sync_once(peers)
        assert again.fetched == [] and again.fetched_bytes == 0  # converged: nothing moves
        assert again.conflicts == [] and again.compared_bytes == end  # compared on the wire: all equal
        assert again.digest_rounds == 1 and again.digest_bytes < 300  # one top block each side

        # Two frames of B's own recording change: one payload byte (its CRC now fails: A's copy wins), and
        # another payload byte with its CRC restamped (both verify: kept as they are, reported).
        small = DigestSettings(block_length=1 << 20, fanout=16, leaf_length=4096)
        frames = frame_positions(bytes_b)
        broken, restamped = (next(p for p in frames if p > before_b[0][0] + k * 40_000) for k in (1, 2))
        with Catalog.open(service_b.ctx.archive_dir) as catalog:
            own_b = next(d for d in catalog.recordings() if d.start_position > 0)
        flip_payload_byte(service_b.ctx.archive_dir, own_b, broken, restamp=False)
        flip_payload_byte(service_b.ctx.archive_dir, own_b, restamped, restamp=True)
        before = recorded_stream(service_b.ctx.archive_dir, 0, end)
        with capture_logs() as logs:
            found = sync_once(peers, digests=small)
        assert found.fetched == []

        def leaves(*changed: int) -> tuple[int, int]:  # the 4 KiB leaves that hold the changed bytes, merged
            (interval,) = merge((x - x % 4096, x - x % 4096 + 4096) for x in changed)
            return interval

        leaf = {
            broken: leaves(broken + dh.HEADER_LENGTH),
            restamped: leaves(restamped + dh.SESSION_ID_FIELD_OFFSET, restamped + dh.HEADER_LENGTH),
        }
        assert [(c.interval, c.peers, c.verdicts, c.winner, c.repaired) for c in found.conflicts] == [
            (leaf[broken], ("a", "b"), (Verdict.VERIFIES, Verdict.FAILS), "a", True),
            (leaf[restamped], ("a", "b"), (Verdict.VERIFIES, Verdict.VERIFIES), None, False),
        ]
        assert found.digest_rounds <= 6  # 1 MiB blocks -> 64 KiB -> 4 KiB, then the verdicts (one each side)
        assert [e["start"] for e in logs if e["event"] == "sync.conflict"] == [leaf[broken][0], leaf[restamped][0]]
        after = recorded_stream(service_b.ctx.archive_dir, 0, end)
        # The failing frame now holds A's bytes; the conflict between two verifying copies is left as it was.
        assert after[broken : broken + 160] == bytes_a[broken : broken + 160] != before[broken : broken + 160]
        assert (
            after[restamped : restamped + 160]
            == before[restamped : restamped + 160]
            != bytes_a[restamped : restamped + 160]
        )

        def differing(x: bytes, y: bytes) -> list[int]:
            return [int(i) for i in np.flatnonzero(np.frombuffer(x, np.uint8) != np.frombuffer(y, np.uint8))]

        assert differing(after, bytes_a) == [i for i in differing(before, bytes_a) if not broken <= i < broken + 160]
        again = sync_once(peers, digests=small)
        assert [(c.interval, c.winner) for c in again.conflicts] == [(leaf[restamped], None)]  # stays reported
        with pytest.raises(ArchiveRequestError, match="frames in .* verify"):  # the archive refuses by itself
            b.sync_repair(
                cc.SyncRepairRequest(
                    0,
                    0,
                    own_b.session_id,
                    STREAM,
                    own_b.initial_term_id,
                    own_b.term_length,
                    restamped,
                    LIVE,
                    bytes_a[restamped : restamped + 160],
                )
            )
        assert recorded_stream(service_b.ctx.archive_dir, 0, end) == after

        cli = subprocess.run(
            [sys.executable, "-m", "logbuf.archive.main", "sync", "--driver-dir", driver.dir]
            + ["--peer", "aeron:ipc@10", "--peer", "aeron:ipc@11"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        summary = json.loads(cli.stdout.splitlines()[-1])
        assert cli.returncode == 1, cli.stderr  # a conflict stays reported: the command says so
        assert [(c["start"], c["winner"], c["repaired"]) for c in summary["conflicts"]] == [
            (leaf[restamped][0], None, False)
        ]
        assert summary["fetched"] == [] and summary["behind_bytes"] == {"aeron:ipc@10": 0, "aeron:ipc@11": 0}


def test_a_replication_of_an_unknown_recording_fails_loudly_and_stop_replication_ends_a_live_copy(
    driver: DriverProcess, tmp_path: Path
) -> None:
    def context(name: str, control_stream_id: int) -> ArchiveContext:
        return ArchiveContext(
            archive_dir=str(tmp_path / name), driver_dir=driver.dir, control_stream_id=control_stream_id
        )

    def ended(client: ArchiveClient, replication_id: int) -> bool:
        client.poll()
        return any(
            s.subscription_id == replication_id and s.signal == cc.RecordingSignal.REPLICATE_END for s in client.signals
        )

    with (
        Aeron.connect(Context(dir=driver.dir)) as aeron,
        ArchiveService.launch(context("a", 10)),
        ArchiveService.launch(context("b", 11)) as service_b,
        ArchiveClient.connect(ArchiveClientContext(aeron=aeron, control_stream_id=10)) as a,
        ArchiveClient.connect(ArchiveClientContext(aeron=aeron, control_stream_id=11)) as b,
    ):
        unknown = b.replicate(99, "aeron:ipc", src_control_stream_id=10)
        await_(lambda: ended(b, unknown), TIMEOUT_S, "the failed replication to end")
        assert any("unknown recording 99" in e.error_message for e in b.errors), b.errors
        assert b.list_recordings() == []  # nothing was made for it

        publication = aeron.add_exclusive_publication(LIVE, STREAM)
        a.start_recording(LIVE, STREAM)
        publisher = SequencedPublisher(publication, length=LENGTH, rate=5_000).start()
        live = b.replicate(0, "aeron:ipc", src_control_stream_id=10)
        await_(lambda: b.list_recordings() and b.recording_position(0) > 50_000, TIMEOUT_S, "the live copy to advance")
        # The copy in progress shows, with its source and how far behind it is, in logbuf-stat and in list.

        def copies() -> list[dict[str, Any]]:
            return list(archive_counters([service_b.ctx.archive_dir])[0]["replications"])

        await_(lambda: [c["dst_recording_id"] for c in copies()] == [0], TIMEOUT_S, "the copy in the status file")
        (copying,) = copies()
        assert (copying["dst_recording_id"], copying["src_recording_id"]) == (0, 0) and copying["lag"] >= 0
        assert copying["source_archive_id"] == a.archive_id() and copying["channel"] == LIVE
        listed = subprocess.run(
            [sys.executable, "-m", "logbuf.archive.main", "-d", service_b.ctx.archive_dir, "list"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"copy:{a.archive_id()}/0" in listed.stdout and " lag:" in listed.stdout, listed.stdout
        b.stop_replication(live)
        await_(lambda: ended(b, live), TIMEOUT_S, "the stopped replication to end")
        publisher.stop()
        with Catalog.open(service_b.ctx.archive_dir) as catalog:
            copy = catalog.recording(0)
        assert not copy.active and copy.stop_position > 50_000
        assert verify_recording(service_b.ctx.archive_dir, copy).ok


def test_a_followed_copy_merges_onto_the_live_stream_and_ends_with_it(driver: DriverProcess, tmp_path: Path) -> None:
    def context(name: str, control_stream_id: int) -> ArchiveContext:
        return archive_context(driver, tmp_path / name, control_stream_id)

    def signalled(client: ArchiveClient, replication_id: int, signal: cc.RecordingSignal) -> bool:
        client.poll()
        return any(s.subscription_id == replication_id and s.signal == signal for s in client.signals)

    with (
        Aeron.connect(Context(dir=driver.dir)) as aeron,
        ArchiveService.launch(context("a", 10)) as service_a,
        ArchiveService.launch(context("b", 11)) as service_b,
        ArchiveClient.connect(ArchiveClientContext(aeron=aeron, control_stream_id=10)) as a,
        ArchiveClient.connect(ArchiveClientContext(aeron=aeron, control_stream_id=11)) as b,
        capture_logs() as logs,
    ):
        publication = aeron.add_exclusive_publication(LIVE, STREAM)
        a.start_recording(LIVE, STREAM)
        publisher = SequencedPublisher(publication, length=LENGTH, rate=5_000).start()
        await_(lambda: publisher.sent > 2_000, TIMEOUT_S, "a history to copy")
        copy = b.replicate(0, "aeron:ipc", src_control_stream_id=10, live_destination=LIVE)
        await_(
            lambda: signalled(b, copy, cc.RecordingSignal.MERGE), TIMEOUT_S, "the copy to merge onto the live stream"
        )
        merged_at = next(s.position for s in b.signals if s.signal == cc.RecordingSignal.MERGE)
        await_(lambda: publisher.sent > 20_000, TIMEOUT_S, "the live stream to run on after the merge")
        publisher.stop()
        publication.close()  # the live stream ends: A's recording stops, and the merged copy ends with it
        await_(lambda: signalled(b, copy, cc.RecordingSignal.REPLICATE_END), TIMEOUT_S, "the copy to end")
        assert not b.errors, b.errors
        with Catalog.open(service_a.ctx.archive_dir) as catalog:
            original = catalog.recording(0)
        with Catalog.open(service_b.ctx.archive_dir) as catalog:
            copied = catalog.recording(0)
        assert not original.active and (copied.start_position, copied.stop_position) == (0, original.stop_position)
        assert 0 < merged_at < original.stop_position
        bytes_a = recorded_stream(service_a.ctx.archive_dir, 0, original.stop_position)
        assert recorded_stream(service_b.ctx.archive_dir, 0, original.stop_position) == bytes_a
        assert recorded_seqs(bytes_a, LENGTH) == list(range(publisher.sent))
        assert verify_recording(service_b.ctx.archive_dir, copied).ok
        assert [e["event"] for e in logs if e["event"].startswith("replication.merged")] == ["replication.merged"]
