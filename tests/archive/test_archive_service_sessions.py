"""Control sessions and caps of the archive service: an idle client kept alive past the session timeout by
its keep-alive thread (and, without it, closed), a flood of connects whose response channels never connect
(sessions capped, the rest dropped and counted, each timed out, an honest client served after), the cap on
recordings, and a REMOTE source location recording the network image."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from logbuf.archive import control_codec as cc
from logbuf.archive.client import ArchiveClient, ArchiveClientContext, ArchiveRequestError
from logbuf.archive.service import ArchiveService
from logbuf.archive.service_context import ArchiveContext
from logbuf.client import Aeron
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess
from logbuf.testing.host import free_tcp_port
from tests.archive.service_kit import sequenced

SESSION_TIMEOUT_MS = 600
CONNECT_TIMEOUT_MS = 400
MAX_SESSIONS = 4
MAX_RECORDING_SUBSCRIPTIONS = 2


@pytest.fixture
def service(archive_driver: DriverProcess, tmp_path: os.PathLike[str]) -> Iterator[ArchiveService]:
    ctx = ArchiveContext(
        archive_dir=os.path.join(tmp_path, "archive"),
        driver_dir=archive_driver.dir,
        segment_length=128 * 1024,
        session_timeout_ns=SESSION_TIMEOUT_MS * 1_000_000,
        connect_timeout_ns=CONNECT_TIMEOUT_MS * 1_000_000,
        max_sessions=MAX_SESSIONS,
        max_recording_subscriptions=MAX_RECORDING_SUBSCRIPTIONS,
        events_channel="aeron:ipc",
    )
    with ArchiveService.launch(ctx) as svc:
        yield svc


def _open_sessions(service: ArchiveService) -> set[int]:
    assert service.conductor is not None
    return set(service.conductor.sessions)


def test_an_idle_client_is_kept_alive_past_the_session_timeout_by_its_keep_alive_thread(
    service: ArchiveService, aeron: Aeron
) -> None:
    ctx = ArchiveClientContext(aeron=aeron, keep_alive_interval_ns=SESSION_TIMEOUT_MS // 4 * 1_000_000)
    with ArchiveClient.connect(ctx) as client:
        archive_id = client.archive_id()
        time.sleep(4 * SESSION_TIMEOUT_MS / 1000)  # pace: the thing under test, idle: no requests, no poll()
        assert client.control_session_id in _open_sessions(service)
        assert client.keep_alives_sent >= 4
        assert client.archive_id() == archive_id


def test_without_the_keep_alive_thread_an_idle_client_is_closed_by_the_service(
    service: ArchiveService, aeron: Aeron
) -> None:
    ctx = ArchiveClientContext(
        aeron=aeron, keep_alive_interval_ns=SESSION_TIMEOUT_MS // 4 * 1_000_000, keep_alive_thread=False
    )
    with ArchiveClient.connect(ctx) as client:
        session_id = client.control_session_id
        assert session_id in _open_sessions(service)
        wait_until(lambda: session_id not in _open_sessions(service), 10, "the idle session to time out")
        assert client.keep_alives_sent == 0


def test_a_flood_of_connects_is_capped_each_timed_out_and_counted_and_an_honest_client_served_after(
    service: ArchiveService, aeron: Aeron
) -> None:
    counters = service.counters
    assert counters is not None
    dropped, closed = counters.requests_dropped.get(), counters.sessions_closed.get()
    flood = aeron.add_exclusive_publication(service.ctx.local_control_channel, service.ctx.control_stream_id)
    wait_until(lambda: flood.is_connected, 10, "the control stream")
    for i in range(50):  # response channels nobody subscribes to: they never connect
        request = cc.ConnectRequest(
            correlation_id=i,
            response_stream_id=7_000 + i,
            version=cc.PROTOCOL_SEMANTIC_VERSION,
            response_channel="aeron:ipc",
        )
        wait_until(lambda: flood.offer(cc.encode(request)) > 0, 10, f"connect request {i} offered", max_idle_s=0.001)
    most = 0

    def watch() -> None:
        nonlocal most
        most = max(most, len(_open_sessions(service)))

    wait_until(
        lambda: counters.requests_dropped.get() - dropped >= 50 - MAX_SESSIONS,
        10,
        "the surplus dropped",
        do_work=watch,
        max_idle_s=0.002,
    )
    assert most <= MAX_SESSIONS
    wait_until(
        lambda: not _open_sessions(service), 10, "the unconnected sessions to time out", do_work=watch, max_idle_s=0.002
    )
    assert most <= MAX_SESSIONS
    assert counters.sessions_closed.get() - closed == MAX_SESSIONS  # each one that was opened, timed out
    flood.close()
    with ArchiveClient.connect(ArchiveClientContext(aeron=aeron)) as honest:
        assert honest.list_recordings() == []


def test_the_recordings_cap_refuses_one_more_with_max_recordings_until_one_stops(
    service: ArchiveService, aeron: Aeron
) -> None:
    with ArchiveClient.connect(ArchiveClientContext(aeron=aeron)) as client:
        for stream_id in range(MAX_RECORDING_SUBSCRIPTIONS):
            client.start_recording("aeron:ipc", 8_000 + stream_id)
        with pytest.raises(ArchiveRequestError, match="max recording subscriptions") as refused:
            client.start_recording("aeron:ipc", 8_100)
        assert refused.value.error_code == cc.ArchiveErrorCode.MAX_RECORDINGS
        client.stop_recording("aeron:ipc", 8_000)
        client.start_recording("aeron:ipc", 8_100)


def test_a_remote_source_records_the_network_image_and_needs_a_udp_channel(
    service: ArchiveService, aeron: Aeron
) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_tcp_port()}"
    with ArchiveClient.connect(ArchiveClientContext(aeron=aeron)) as client:
        with pytest.raises(ArchiveRequestError, match="REMOTE source needs an aeron:udp channel"):
            client.start_recording("aeron:ipc", 8_200, remote=True)
        client.start_recording(channel, 8_200, remote=True)
        publication = aeron.add_publication(channel, 8_200)
        wait_until(lambda: publication.is_connected, 10, "the recording's network subscription")
        end = 0
        for i in range(200):
            end = wait_until(
                lambda: max(0, publication.offer(sequenced(i, 100))), 10, f"message {i} offered", max_idle_s=0.001
            )
        (d,) = [d for d in client.list_recordings() if d.stream_id == 8_200]
        assert d.source_identity.startswith("127.0.0.1:")  # the sender's address: a network image, not a spy
        wait_until(lambda: client.max_recorded_position(d.recording_id) >= end, 10, "the recording")
        client.stop_recording(channel, 8_200)
        publication.close()
