"""A partition between three archive hosts heals by itself: continuous sync on network-namespace hosts.

Three hosts each run a driver and an archive service (control channel on UDP, per-frame CRCs); all three
record the same live multicast stream from a publisher on host 0. While it runs, host 2 is cut off
(iptables DROP of every UDP datagram into it) and, during the cut, host 1's archive service is killed with
SIGKILL and started again a few seconds later (its recorder is then asked to record again, as a supervisor
would). A continuous sync (``sync_forever``, on host 0, a client of all three over UDP) runs throughout and
is never told about any of it. In the end all three archives hold every position of the stream, byte for
byte the same, every message once and in order, and every recording's frames verify.
"""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import pytest

from logbuf.archive.catalog import Catalog
from logbuf.archive.client import ArchiveClient, ArchiveClientContext
from logbuf.archive.sync import Peer, SyncReport, sync_forever
from logbuf.archive.sync_digest import merge
from logbuf.archive.verify import verify_recording
from logbuf.client import Aeron, Context
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverSet
from logbuf.testing.netns import (
    SUBNET,
    NetnsNetwork,
    network_fixture,
    requires_netns,
    start_drivers,
)
from tests.archive.service_kit import (
    NETNS_DRIVER_ARGS,
    SequencedPublisher,
    ServeProcess,
    recorded_seqs,
    recorded_stream,
)

pytestmark = requires_netns

LIVE = f"aeron:udp?endpoint=224.0.1.27:40740|interface={SUBNET}.0/24"
"""The same channel string on every host, so the three recordings are one stream history."""
LIVE_STREAM = 1001
LENGTH = 200
TIMEOUT_S = 30


net = network_fixture(3)


def recording_count(archive_dir: str) -> int:
    with Catalog.open(archive_dir) as catalog:
        return len(catalog.recordings())


def coverage(archive_dir: str) -> list[tuple[int, int]]:
    """What an archive holds of the stream (an active recording up to its recorded position)."""
    with Catalog.open(archive_dir) as catalog:
        return merge((d.start_position, d.stop_position) for d in catalog.recordings() if d.stop_position > 0)


def test_three_archives_converge_after_a_link_cut_and_a_killed_recorder(
    net: NetnsNetwork, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    hosts = [net.address(i) for i in range(3)]
    controls = [f"aeron:udp?endpoint={h}:8010" for h in hosts]
    common = ["--segment-length", str(1 << 20), "--checksum", "crc32", "--allowed-clients", f"{SUBNET}.0/24"]
    with DriverSet(request) as drivers:
        driver_dirs = [d.dir for d in start_drivers(drivers, net, NETNS_DRIVER_ARGS)]
        serves = [
            ServeProcess(
                str(tmp_path / f"h{i}"),
                driver_dirs[i],
                [*common, "--control-channel", controls[i]],
                namespace=net.host(i),
            ).start()
            for i in range(3)
        ]
        stop_sync = threading.Event()
        reports: list[SyncReport] = []
        sync_thread: threading.Thread | None = None
        try:
            with (
                Aeron.connect(Context(dir=driver_dirs[0])) as aeron_0,
                Aeron.connect(Context(dir=driver_dirs[1])) as aeron_1,
                Aeron.connect(Context(dir=driver_dirs[2])) as aeron_2,
            ):
                aerons = [aeron_0, aeron_1, aeron_2]

                def record(i: int) -> None:
                    with ArchiveClient.connect(ArchiveClientContext(aeron=aerons[i])) as local:
                        local.start_recording(LIVE, LIVE_STREAM, remote=True)

                publication = aeron_0.add_exclusive_publication(LIVE + "|fc=max", LIVE_STREAM)
                for i in range(3):
                    record(i)
                wait_until(
                    lambda: all(recording_count(s.archive_dir) for s in serves), TIMEOUT_S, "the recordings to start"
                )
                publisher = SequencedPublisher(publication, length=LENGTH, rate=4_000).start()

                def peer(i: int) -> Peer:
                    ctx = ArchiveClientContext(
                        aeron=aeron_0,
                        control_channel=controls[i],
                        response_channel=f"aeron:udp?endpoint={hosts[0]}:{8100 + i}",
                        response_stream_id=20 + i,
                        message_timeout_ns=3_000_000_000,
                    )
                    return Peer(
                        f"h{i}",
                        ArchiveClient.connect(ctx),
                        controls[i],
                        10,
                        response_channel=f"aeron:udp?endpoint={hosts[i]}:8020",
                        replication_channel=f"aeron:udp?endpoint={hosts[i]}:8030",
                        connect=functools.partial(ArchiveClient.connect, ctx),
                    )

                peers = [peer(i) for i in range(3)]
                sync_thread = threading.Thread(
                    target=sync_forever,
                    args=(peers, stop_sync),
                    kwargs={"interval_ns": 500_000_000, "timeout_ns": 20_000_000_000, "on_report": reports.append},
                    daemon=True,
                )
                sync_thread.start()

                wait_until(lambda: publisher.sent > 4_000, TIMEOUT_S, "the stream to run")
                net.add_loss(2, 1.0)  # host 2 is cut off
                time.sleep(2)  # pace: the stream runs 2 s into the cut
                serves[1].kill()  # host 1's recorder is killed during the cut
                time.sleep(3)  # pace: 3 s more of the cut with host 1's recorder down
                started = serves[1].output().count("archive.started")
                serves[1].proc = None
                serves[1].start()
                wait_until(
                    lambda: serves[1].output().count("archive.started") > started, TIMEOUT_S, "h1 to start again"
                )
                record(1)
                net.clear_loss(2)
                wait_until(lambda: publisher.sent > 40_000, TIMEOUT_S, "the stream to run on after the partition")
                publisher.stop()
                end = publication.position

                wait_until(
                    lambda: all(coverage(s.archive_dir) == [(0, end)] for s in serves),
                    TIMEOUT_S,
                    "continuous sync to make every archive hold the whole stream",
                )
                assert any(r.fetched for r in reports), "nothing was fetched: the partition left no holes"
                stop_sync.set()
                sync_thread.join(TIMEOUT_S)

                for i, serve in enumerate(serves):
                    with Catalog.open(serve.archive_dir) as catalog:
                        recordings = catalog.recordings()
                    assert all(verify_recording(serve.archive_dir, d).ok for d in recordings), f"h{i}"
                streams = [recorded_stream(s.archive_dir, 0, end) for s in serves]
                assert len(streams[0]) == end
                for i in (1, 2):
                    if streams[i] != streams[0]:
                        first = next(p for p, (x, y) in enumerate(zip(streams[i], streams[0], strict=True)) if x != y)
                        raise AssertionError(f"h{i} differs from h0 at position {first}")
                assert recorded_seqs(streams[0], LENGTH) == list(range(publisher.sent))
                assert not any(r.conflicts for r in reports)
                for p in peers:
                    p.client.close()
        finally:
            stop_sync.set()
            if sync_thread is not None:
                sync_thread.join(TIMEOUT_S)
            net.clear_loss(2)
            for serve in serves:
                serve.stop()
