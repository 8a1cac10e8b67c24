"""Log parameters and log files: bad ones are rejected naming the parameter, and leave nothing behind."""

from __future__ import annotations

import pytest

from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.logbuffer.log_buffer import LogBuffers, LogParams
from logbuf.logbuffer.standalone import StreamLog
from logbuf.shm import Segment, ShmError
from tests.support.logs import TERM_LENGTH


@pytest.mark.parametrize(
    ("term_length", "message"),
    [
        (100_000, r"term_length=100000 is not a power of 2"),
        (32 * 1024, r"term_length=32768 is less than the minimum"),
        (2 * 1024**3, r"term_length=2147483648 is greater than the maximum"),
    ],
)
def test_creating_a_log_with_a_bad_term_length_fails_and_leaves_nothing_behind(
    log_name: str, term_length: int, message: str
) -> None:
    with pytest.raises(lbd.LogBufferError, match=message):
        StreamLog.create(log_name, term_length=term_length)
    with pytest.raises(lbd.LogBufferError, match=message):
        LogBuffers.create(log_name, term_length=term_length)
    with pytest.raises(ShmError, match=rf"shared memory '{log_name}' does not exist"):
        Segment.open(log_name)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"page_size": 1000}, r"page_size=1000 must be a power of 2 from 4096 to 1073741824"),
        ({"page_size": 2048}, r"page_size=2048 must be a power of 2"),
        ({"session_id": 2**31}, r"session_id=2147483648 is not a 32-bit signed integer"),
        ({"stream_id": -(2**31) - 1}, r"stream_id=-2147483649 is not a 32-bit signed integer"),
        ({"initial_term_id": 2**32}, r"initial_term_id=4294967296 is not a 32-bit signed integer"),
        (
            {"term_window_length": TERM_LENGTH},
            r"term_window_length=65536 must be within mtu_length..term_length/2 \(32768\)",
        ),
        ({"term_window_length": 64}, r"term_window_length=64 must be within mtu_length"),
    ],
)
def test_bad_log_parameters_are_rejected_naming_the_parameter(params: dict[str, int], message: str) -> None:
    with pytest.raises(lbd.LogBufferError, match=message):
        LogParams(term_length=TERM_LENGTH, **params).check()


def test_opening_a_segment_that_is_not_a_log_fails_naming_it(log_name: str) -> None:
    segment = Segment.create(log_name, 4096)
    try:
        with pytest.raises(
            lbd.LogBufferError,
            match=rf"shared memory '{log_name}' is not a valid log buffer: "
            r"log buffer of 4096 bytes is too short",
        ):
            LogBuffers.open(log_name)
    finally:
        segment.close()
