"""Control sessions of the archive service over time: an idle client kept alive past the session timeout by
its keep-alive thread, and the same client without it closed (so the timeout the test relies on is real)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from logbuf.archive.client import ArchiveClient, ArchiveClientContext
from logbuf.archive.service import ArchiveService
from logbuf.archive.service_context import ArchiveContext
from logbuf.client import Aeron, Context
from tests.archive.service_kit import await_
from tests.support.driver_process import DriverProcess

SESSION_TIMEOUT_MS = 600


@pytest.fixture
def aeron(archive_driver: DriverProcess) -> Iterator[Aeron]:
    with Aeron.connect(Context(dir=archive_driver.dir)) as client:
        yield client


@pytest.fixture
def service(archive_driver: DriverProcess, tmp_path: os.PathLike[str]) -> Iterator[ArchiveService]:
    ctx = ArchiveContext(
        archive_dir=os.path.join(tmp_path, "archive"),
        driver_dir=archive_driver.dir,
        segment_length=128 * 1024,
        session_timeout_ms=SESSION_TIMEOUT_MS,
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
    ctx = ArchiveClientContext(aeron=aeron, keep_alive_interval_ms=SESSION_TIMEOUT_MS // 4)
    with ArchiveClient.connect(ctx) as client:
        archive_id = client.archive_id()
        time.sleep(4 * SESSION_TIMEOUT_MS / 1000)  # idle: no requests, no poll()
        assert client.control_session_id in _open_sessions(service)
        assert client.keep_alives_sent >= 4
        assert client.archive_id() == archive_id


def test_without_the_keep_alive_thread_an_idle_client_is_closed_by_the_service(
    service: ArchiveService, aeron: Aeron
) -> None:
    ctx = ArchiveClientContext(aeron=aeron, keep_alive_interval_ms=SESSION_TIMEOUT_MS // 4, keep_alive_thread=False)
    with ArchiveClient.connect(ctx) as client:
        session_id = client.control_session_id
        assert session_id in _open_sessions(service)
        await_(lambda: session_id not in _open_sessions(service), 10, "the idle session to time out")
        assert client.keep_alives_sent == 0
