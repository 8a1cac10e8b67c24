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

import pytest

from logbuf.archive import control_codec as cc
from logbuf.archive.catalog import Catalog
from logbuf.archive.client import ArchiveClient, ArchiveClientContext
from logbuf.archive.service import ArchiveService
from logbuf.archive.service_context import ArchiveContext
from logbuf.archive.sync import Peer, listing, sync_once
from logbuf.archive.sync_digest import merge
from logbuf.archive.verify import verify_recording
from logbuf.client import Aeron, Context
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet
from tests.archive.service_kit import SequencedPublisher, recorded_seqs, recorded_stream

LIVE, STREAM, LENGTH, TIMEOUT_S = "aeron:ipc", 1001, 100, 30


@pytest.fixture
def driver(request: pytest.FixtureRequest) -> Iterator[DriverProcess]:
    with DriverSet(request) as drivers:
        yield drivers.start(DriverProcess(args=["--dir-delete-on-shutdown", "false"]))


def test_one_sync_round_fills_a_hole_on_one_side_and_a_missing_beginning_on_the_other(
    driver: DriverProcess, tmp_path: Path
) -> None:
    def context(name: str, control_stream_id: int) -> ArchiveContext:
        return ArchiveContext(
            archive_dir=str(tmp_path / name),
            driver_dir=driver.dir,
            control_stream_id=control_stream_id,
            segment_length=1 << 20,
            checksum="crc32",
        )

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
            wait_until(lambda: publisher.sent >= target, TIMEOUT_S, f"{count} more messages")

        def caught_up(client: ArchiveClient) -> None:
            wait_until(
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

        again = sync_once([Peer("a", a, "aeron:ipc", 10), Peer("b", b, "aeron:ipc", 11)])
        assert again.fetched == [] and again.fetched_bytes == 0  # converged: nothing moves


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
        wait_until(lambda: ended(b, unknown), TIMEOUT_S, "the failed replication to end")
        assert any("unknown recording 99" in e.error_message for e in b.errors), b.errors
        assert b.list_recordings() == []  # nothing was made for it

        publication = aeron.add_exclusive_publication(LIVE, STREAM)
        a.start_recording(LIVE, STREAM)
        publisher = SequencedPublisher(publication, length=LENGTH, rate=5_000).start()
        live = b.replicate(0, "aeron:ipc", src_control_stream_id=10)
        wait_until(
            lambda: b.list_recordings() and b.recording_position(0) > 50_000, TIMEOUT_S, "the live copy to advance"
        )
        b.stop_replication(live)
        wait_until(lambda: ended(b, live), TIMEOUT_S, "the stopped replication to end")
        publisher.stop()
        with Catalog.open(service_b.ctx.archive_dir) as catalog:
            copy = catalog.recording(0)
        assert not copy.active and copy.stop_position > 50_000
        assert verify_recording(service_b.ctx.archive_dir, copy).ok
