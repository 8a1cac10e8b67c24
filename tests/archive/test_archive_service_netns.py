"""The archive service across hosts: two network namespaces (:mod:`logbuf.testing.netns`), a driver on each.

Host A (10.13.0.1) runs a driver, a publisher sending to host B and the archive service recording that
publication (a spy of it: the bytes A sends), with its control channel on UDP. Host B (10.13.0.2) lists A's
recordings remotely, replays a range over UDP unicast and over multicast and gets it byte for byte, and a
late joiner on B starts 2 s in the past (10 s in the issue: the point is the same, at a fifth of the time)
and catches up onto A's live stream while A keeps publishing: every message once, in order.

Clients need no namespace (they meet their driver in /dev/shm), so every client runs in this process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from logbuf.archive import control_codec as cc
from logbuf.archive.client import ArchiveClient, ArchiveClientContext, ArchiveTimeoutError, replay_image_session_id
from logbuf.archive.replay_merge import ReplayMerge
from logbuf.archive.service import ArchiveService
from logbuf.archive.service_context import ArchiveContext
from logbuf.client import Aeron, Context
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet
from logbuf.testing.netns import NetnsNetwork, network_fixture, requires_netns, start_drivers
from tests.archive.conftest import archive_cli
from tests.archive.service_kit import Received, SequencedPublisher

pytestmark = requires_netns

A, B = "10.13.0.1", "10.13.0.2"
CONTROL = f"aeron:udp?endpoint={A}:8010"
LIVE = f"aeron:udp?endpoint={B}:40456"
LIVE_STREAM = 1001
GROUP = "239.13.0.5"
TIMEOUT_S = 30
DRIVER_ARGS = [
    *("--dir-delete-on-shutdown", "false", "--driver-timeout", "5s", "--client-liveness-timeout", "5s"),
    *("--image-liveness-timeout", "3s", "--publication-connection-timeout", "3s", "--term-length", "1m"),
    *("--publication-linger-timeout", "1s"),
]


@dataclass
class Hosts:
    a: DriverProcess
    b: DriverProcess
    aeron_a: Aeron
    aeron_b: Aeron
    service: ArchiveService
    publisher: SequencedPublisher


net = network_fixture(2)


class Drain:
    """B's resident live consumer: it keeps A's publication connected and reads everything."""

    def __init__(self, aeron: Aeron) -> None:
        self.subscription = aeron.add_subscription(LIVE, LIVE_STREAM)
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            n = self.subscription.poll(lambda b, h: None, 1000)
            self.count += n
            if not n:
                time.sleep(0.0005)  # pace: idle between empty polls until stopped

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.subscription.close()


@pytest.fixture(scope="module")
def hosts(
    net: NetnsNetwork, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hosts]:
    with DriverSet(request) as drivers:
        a, b = start_drivers(drivers, net, DRIVER_ARGS)
        ctx = ArchiveContext(
            archive_dir=str(tmp_path_factory.mktemp("archive-a")),
            driver_dir=a.dir,
            control_channel=CONTROL,
            segment_length=1 << 20,
            allowed_clients=["10.13.0.0/24"],
        )
        with (
            Aeron.connect(Context(dir=a.dir)) as aeron_a,
            Aeron.connect(Context(dir=b.dir)) as aeron_b,
            ArchiveService.launch(ctx) as service,
        ):
            assert service.conductor is not None
            drain = Drain(aeron_b)
            publication = aeron_a.add_publication(LIVE, LIVE_STREAM)
            with ArchiveClient.connect(ArchiveClientContext(aeron=aeron_a)) as local:  # A records its own stream
                local.start_recording(LIVE, LIVE_STREAM)
            wait_until(lambda: publication.is_connected, TIMEOUT_S, "A's publication to reach B")
            publisher = SequencedPublisher(publication, length=64, rate=10_000).start()
            try:
                yield Hosts(a, b, aeron_a, aeron_b, service, publisher)
            finally:
                publisher.stop()
                drain.close()


def remote_client(hosts: Hosts, response_port: int) -> ArchiveClient:
    return ArchiveClient.connect(
        ArchiveClientContext(
            aeron=hosts.aeron_b,
            control_channel=CONTROL,
            response_channel=f"aeron:udp?endpoint={B}:{response_port}",
            message_timeout_ns=10_000_000_000,
        )
    )


def test_host_b_lists_a_recordings_and_replays_a_range_over_udp_byte_for_byte(hosts: Hosts) -> None:
    wait_until(lambda: hosts.publisher.sent > 5_000, TIMEOUT_S, "some history on A")
    with remote_client(hosts, 8020) as archive:
        recordings = archive.list_recordings()
        assert [(d.stream_id, d.original_channel) for d in recordings] == [(LIVE_STREAM, LIVE)]
        d = recordings[0]
        assert d.stop_position == -1 and archive.recording_position(d.recording_id) > 0  # active
        positions = list(hosts.publisher.positions[:4_000])
        for channel, stream_id, subscribe in (
            (f"aeron:udp?endpoint={B}:40500", 2001, f"aeron:udp?endpoint={B}:40500"),
            (
                f"aeron:udp?endpoint={GROUP}:40600|interface={A}",
                2002,
                f"aeron:udp?endpoint={GROUP}:40600|interface={B}",
            ),
        ):
            subscription = hosts.aeron_b.add_subscription(subscribe, stream_id)
            start, end = positions[999], positions[3_999]
            replay_session_id = archive.start_replay(
                d.recording_id, stream_id=stream_id, channel=channel, position=start, length=end - start
            )
            received = Received(length=64)
            session_id = replay_image_session_id(replay_session_id)

            def step() -> int:
                """Fragments polled; 0 (back off) while the replay's image is not there yet."""
                image = subscription.image_by_session_id(session_id)
                return image.poll(received.handler, 200) if image is not None else 0

            wait_until(lambda: len(received.seqs) >= 3_000, TIMEOUT_S, f"the replay on {channel}", do_work=step)
            received.check_once_in_order(1_000, 3_999)
            assert received.positions == positions[1_000:4_000]
            subscription.close()


def test_the_remote_list_command_on_b_prints_a_recording_of_a(hosts: Hosts, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["list", "--control", CONTROL, "--driver-dir", hosts.b.dir]
    assert archive_cli(hosts.service.ctx.archive_dir, *args, "--response-channel", f"aeron:udp?endpoint={B}:8022") == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if " VALID " in line]
    assert line.split()[:3] == ["0", "VALID", "active"] and line.endswith(f" {LIVE}")
    assert f"stream={LIVE_STREAM} " in line


def test_a_late_joiner_on_b_catches_up_from_a_onto_the_live_stream(hosts: Hosts) -> None:
    wait_until(lambda: hosts.publisher.sent > 20_000, TIMEOUT_S, "2 s of history on A")
    with remote_client(hosts, 8021) as archive:
        rid = archive.list_recordings()[0].recording_id
        received = Received(length=64)
        with ReplayMerge(
            archive,
            rid,
            live_channel=LIVE,
            live_stream_id=LIVE_STREAM,
            replay_channel=f"aeron:udp?endpoint={B}:40501",
            replay_stream_id=2003,
            start_position=0,
        ) as merge:
            wait_until(lambda: merge.is_merged, 60, "the merge", do_work=lambda: merge.poll(received.handler, 500))
            target = hosts.publisher.sent + 2_000
            wait_until(
                lambda: len(received.seqs) >= target,
                TIMEOUT_S,
                "live messages after the merge",
                do_work=lambda: merge.poll(received.handler, 500),
            )
        received.check_once_in_order(0, len(received.seqs) - 1)
        assert received.positions == hosts.publisher.positions[: len(received.seqs)]


def test_remote_connects_outside_the_allow_list_or_answered_elsewhere_are_dropped(
    hosts: Hosts, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A response channel that is not the requester's own address (the service would send at a third host)
    and a requester outside ``allowed_clients`` get no session: counted and dropped, the client times out."""
    assert hosts.service.counters is not None
    before = hosts.service.counters.requests_dropped.get()
    control = hosts.aeron_b.add_exclusive_publication(CONTROL, 10)
    wait_until(lambda: control.is_connected, TIMEOUT_S, "B's control publication")
    reflect = cc.ConnectRequest(  # from B, naming A's address: the service would send at a host that did not ask
        correlation_id=1, response_stream_id=20, version=0, response_channel=f"aeron:udp?endpoint={A}:8030"
    )
    wait_until(lambda: control.offer(cc.encode(reflect)) > 0, TIMEOUT_S, "the reflected connect offered")
    wait_until(lambda: hosts.service.counters.requests_dropped.get() > before, TIMEOUT_S, "the connect to be dropped")
    assert hosts.service.conductor is not None
    assert not [s for s in hosts.service.conductor.sessions.values() if s.response_channel.endswith(":8030")]
    control.close()
    ctx = ArchiveContext(
        archive_dir=str(tmp_path_factory.mktemp("archive-a-only")),
        driver_dir=hosts.a.dir,
        local_control_channel="",
        control_channel=f"aeron:udp?endpoint={A}:8011",
        allowed_clients=[f"{A}/32"],
    )
    with ArchiveService.launch(ctx) as only_a:
        refused = ArchiveClientContext(
            aeron=hosts.aeron_b,
            control_channel=f"aeron:udp?endpoint={A}:8011",
            response_channel=f"aeron:udp?endpoint={B}:8031",
            message_timeout_ns=1_500_000_000,
        )
        with pytest.raises(ArchiveTimeoutError):
            ArchiveClient.connect(refused)
        assert only_a.counters is not None and only_a.counters.requests_dropped.get() >= 1
        assert only_a.conductor is not None and not only_a.conductor.sessions
