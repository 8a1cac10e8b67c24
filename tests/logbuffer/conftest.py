"""Fixtures for the log buffer tests: a standalone log under a unique name, removed afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from logbuf.logbuffer.standalone import StreamLog
from tests.support.logs import MTU_LENGTH, SESSION_ID, STREAM_ID, TERM_LENGTH


@pytest.fixture
def log_name() -> Iterator[str]:
    name = f"t-log-{uuid.uuid4().hex[:12]}"
    yield name
    StreamLog.unlink_name(name)


@pytest.fixture
def log(log_name: str) -> Iterator[StreamLog]:
    with StreamLog.create(
        log_name, term_length=TERM_LENGTH, mtu_length=MTU_LENGTH, session_id=SESSION_ID, stream_id=STREAM_ID
    ) as stream_log:
        yield stream_log
