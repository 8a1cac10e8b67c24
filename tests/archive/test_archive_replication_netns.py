"""Replication between archives on two network-namespace hosts (Aeron's ``Replicate``).

Host A records a live IPC stream (with per-frame CRCs) in an archive service whose control channel is on UDP;
host B's archive service is asked (over its local IPC control channel) to replicate A's recording, following
it while A records. On the way the link into B is cut for a few seconds (iptables DROP of every UDP datagram),
B's service is killed with SIGKILL and restarted (it resumes the copy from its stop position by itself), and
A's service is killed with SIGKILL (its recording ends at its valid prefix) and restarted. In the end B's
copy holds exactly A's recorded bytes, position for position, every message once and in order, and its
frames verify; B keeps the source's identity beside its own recording id.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from logbuf.archive.catalog import Catalog, RecordingDescriptor
from logbuf.archive.client import ArchiveClient, ArchiveClientContext
from logbuf.archive.replication import read_source
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

LIVE = "aeron:ipc"
LIVE_STREAM = 1001
LENGTH = 200
TIMEOUT_S = 30


net = network_fixture(2)


@dataclass
class Sides:
    a: ServeProcess
    b: ServeProcess
    aeron_a: Aeron
    aeron_b: Aeron
    control_a: str


def restart(serve: ServeProcess) -> None:
    """SIGKILL the service and start it again on the same directory (waiting for its new start)."""
    serve.kill()
    started = serve.output().count("archive.started")
    serve.proc = None
    serve.start()
    wait_until(lambda: serve.output().count("archive.started") > started, TIMEOUT_S, "the service to start again")


def recording(archive_dir: str, recording_id: int) -> RecordingDescriptor:
    with Catalog.open(archive_dir) as catalog:
        return catalog.recording(recording_id)


def test_b_replicates_a_live_recording_through_a_link_cut_and_kill_9_of_either_side(
    net: NetnsNetwork, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    host_a, host_b = net.address(0), net.address(1)
    control_a = f"aeron:udp?endpoint={host_a}:8010"
    with DriverSet(request) as drivers:
        driver_a, driver_b = start_drivers(drivers, net, NETNS_DRIVER_ARGS)
        common = ["--segment-length", str(1 << 20), "--checksum", "crc32"]
        a = ServeProcess(
            str(tmp_path / "a"),
            driver_a.dir,
            [*common, "--control-channel", control_a, "--allowed-clients", f"{SUBNET}.0/24"],
            namespace=net.host(0),
        ).start()
        b = ServeProcess(str(tmp_path / "b"), driver_b.dir, common, namespace=net.host(1)).start()
        try:
            with (
                Aeron.connect(Context(dir=driver_a.dir)) as aeron_a,
                Aeron.connect(Context(dir=driver_b.dir)) as aeron_b,
            ):
                publication = aeron_a.add_exclusive_publication(LIVE, LIVE_STREAM)
                with ArchiveClient.connect(ArchiveClientContext(aeron=aeron_a)) as local_a:
                    local_a.start_recording(LIVE, LIVE_STREAM)
                    wait_until(lambda: local_a.signals, TIMEOUT_S, "A's recording to start", do_work=local_a.poll)
                publisher = SequencedPublisher(publication, length=LENGTH, rate=4_000).start()

                def replicate() -> int:
                    with ArchiveClient.connect(ArchiveClientContext(aeron=aeron_b)) as local_b:
                        return local_b.replicate(
                            0,
                            control_a,
                            src_response_channel=f"aeron:udp?endpoint={host_b}:8020",
                            replication_channel=f"aeron:udp?endpoint={host_b}:8030",
                        )

                def b_position() -> int:
                    try:
                        return recording(b.archive_dir, 0).stop_position
                    except Exception:
                        return -1

                def a_position() -> int:
                    return recording(a.archive_dir, 0).stop_position

                replicate()
                wait_until(lambda: b_position() > 200_000, TIMEOUT_S, "B's copy to follow A's recording")

                net.add_loss(1, 1.0)  # the link into B is cut
                time.sleep(3)  # pace: the length of the cut
                at_cut_end = a_position()
                net.clear_loss(1)
                wait_until(lambda: b_position() >= at_cut_end, TIMEOUT_S, "B's copy to catch up after the link cut")

                restart(b)  # SIGKILL of the destination mid-copy
                at_restart = b_position()
                assert recording(b.archive_dir, 0).active is False  # recovered at its valid prefix
                wait_until(
                    lambda: b_position() > at_restart + 100_000, TIMEOUT_S, "B's copy to go on after its restart"
                )

                restart(a)  # SIGKILL of the source mid-copy: its recording ends at its valid prefix
                publisher.stop()
                final = recording(a.archive_dir, 0)
                assert not final.active
                wait_until(
                    lambda: b_position() >= final.stop_position, TIMEOUT_S, "B's copy to reach A's stop position"
                )
                wait_until(lambda: not recording(b.archive_dir, 0).active, TIMEOUT_S, "the replication to end")

                replicate()  # the same request again, once A's recording is copied whole: extends, nothing to add
                time.sleep(1)  # pace: time for the request to start (it may end at once: nothing to add)
                wait_until(lambda: not recording(b.archive_dir, 0).active, TIMEOUT_S, "the second request to end")
                with Catalog.open(b.archive_dir) as catalog_b:
                    copies = catalog_b.recordings()
                assert [d.recording_id for d in copies] == [0], "the second request duplicated the copy"
                copy = copies[0]
                assert (copy.start_position, copy.stop_position) == (final.start_position, final.stop_position)
                assert (copy.session_id, copy.stream_id, copy.channel) == (final.session_id, final.stream_id, LIVE)
                source = read_source(b.archive_dir, 0)
                assert source is not None and source.source_recording_id == 0 and source.stream_id == LIVE_STREAM
                assert source.source_control_channel == control_a

                original = recorded_stream(a.archive_dir, final.start_position, final.stop_position)
                copied = recorded_stream(b.archive_dir, copy.start_position, copy.stop_position)
                assert len(copied) == len(original) > 1_000_000
                if copied != original:
                    first = next(i for i, (x, y) in enumerate(zip(copied, original, strict=True)) if x != y)
                    raise AssertionError(f"B's copy differs from A's recording at position {first}")
                seqs = recorded_seqs(copied, LENGTH)
                assert seqs == list(range(len(seqs))), "a message missing or copied twice"
                assert verify_recording(b.archive_dir, copy).ok
        finally:
            a.stop()
            b.stop()
