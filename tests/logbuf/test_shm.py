"""Shared-memory segment names and lengths: bad ones are rejected naming the value."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.standalone import StreamLog
from logbuf.shm import Segment, ShmError
from tests.support.logs import TERM_LENGTH


@pytest.fixture
def log_name() -> Iterator[str]:
    name = f"t-shm-{uuid.uuid4().hex[:12]}"
    yield name
    Segment.unlink(name)


@pytest.mark.parametrize("name", ["", "a/b", "/leading-slash", "has space", "x" * 201, "tab\there", "ü", None, 7])
def test_bad_shared_memory_names_are_rejected_naming_the_name(name: Any) -> None:
    message = r"shared memory name=.* is invalid: use 1-200 letters, digits, '\.', '_' or '-' \(no '/'\)"
    with pytest.raises(ShmError, match=message) as info:
        Segment.create(name, 4096)
    assert repr(name) in str(info.value)
    with pytest.raises(ShmError, match=message):
        Segment.open(name)
    with pytest.raises(ShmError, match=message):
        StreamLog.create(name, term_length=TERM_LENGTH)
    with pytest.raises(ShmError, match=message):
        LogBuffers.open(name)


def test_a_name_of_200_allowed_characters_is_valid() -> None:
    from logbuf.shm import check_name

    assert check_name("A-z_0.9" + "x" * 193) == "/A-z_0.9" + "x" * 193


@pytest.mark.parametrize("length", [0, -1])
def test_a_segment_of_no_length_is_rejected(log_name: str, length: int) -> None:
    with pytest.raises(ShmError, match=rf"segment length={length} must be positive"):
        Segment.create(log_name, length)
