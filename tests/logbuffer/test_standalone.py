"""Standalone logs by name: creating one that exists, opening one that does not, an MTU too big for the terms."""

from __future__ import annotations

import pytest

from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.standalone import StreamLog
from logbuf.shm import ShmError
from tests.support.logs import SESSION_ID, TERM_LENGTH


def test_creating_a_log_with_an_mtu_too_big_for_its_terms_fails(log_name: str) -> None:
    with pytest.raises(ValueError, match=r"mtu_length=16384 must be at most the max message length 8192"):
        StreamLog.create(log_name, term_length=TERM_LENGTH, mtu_length=16384)


def test_creating_a_log_that_exists_fails_and_keeps_the_existing_one(log: StreamLog, log_name: str) -> None:
    with pytest.raises(ShmError, match=rf"shared memory '{log_name}' already exists"):
        StreamLog.create(log_name, term_length=TERM_LENGTH)
    with StreamLog.open(log_name) as again:  # the original is intact
        assert again.log.term_length == TERM_LENGTH and again.log.session_id == SESSION_ID


def test_opening_a_missing_log_fails_naming_it(log_name: str) -> None:
    with pytest.raises(ShmError, match=rf"shared memory '{log_name}' does not exist"):
        StreamLog.open(log_name)
    with pytest.raises(ShmError, match=rf"shared memory '{log_name}' does not exist"):
        LogBuffers.open(log_name)
