"""DistinctErrorLog and read_error_log over real shared mappings, read from another process."""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterator

import pytest

from logbuf.conduit import error_log_descriptor as ed
from logbuf.conduit.error_log import DistinctErrorLog, ErrorObservation, error_shape, error_text, read_error_log
from tests.logbuf._cnc_children import spawn

LENGTH = 8192


class FakeClock:
    def __init__(self, now_ms: int = 1_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def mapped_file(path: str, length: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, length)
        return mmap.mmap(fd, length)
    finally:
        os.close(fd)


@pytest.fixture
def buffer(tmp_path: object) -> Iterator[memoryview]:
    yield memoryview(mapped_file(os.path.join(str(tmp_path), "errors.dat"), LENGTH))


def fail(message: str) -> None:
    raise ValueError(message)


def caught(message: str) -> BaseException:
    try:
        fail(message)
    except ValueError as e:
        return e
    raise AssertionError("unreachable")


def test_repeats_of_one_error_share_a_record_with_a_count_and_first_and_last_times(buffer: memoryview) -> None:
    clock = FakeClock(1_000)
    log = DistinctErrorLog(buffer, clock)
    for now in (1_000, 2_000, 3_000):
        clock.now_ms = now
        assert log.record(caught("bad frame"))
    clock.now_ms = 2_500
    assert log.record(caught("other problem"))
    observations = read_error_log(buffer)
    assert [(o.count, o.first_observation_ms, o.last_observation_ms) for o in observations] == [
        (3, 1_000, 3_000),
        (1, 2_500, 2_500),
    ]
    assert observations[0].text.startswith("Traceback (most recent call last):")
    assert "ValueError: bad frame" in observations[0].text and "in fail" in observations[0].text
    assert observations[1].text.endswith("ValueError: other problem\n")
    assert log.distinct_count == 2


def test_the_same_message_raised_from_elsewhere_is_a_distinct_error(buffer: memoryview) -> None:
    log = DistinctErrorLog(buffer, FakeClock())
    log.record(caught("same"))
    try:
        raise ValueError("same")  # a different traceback
    except ValueError as e:
        log.record(e)
    log.record(ValueError("same"))  # never raised: no traceback at all
    assert [o.count for o in read_error_log(buffer)] == [1, 1, 1]


def test_strings_are_recorded_as_given(buffer: memoryview) -> None:
    log = DistinctErrorLog(buffer, FakeClock())
    assert log.record("INVALID_CHANNEL: bad uri")
    assert log.record("INVALID_CHANNEL: bad uri")
    assert read_error_log(buffer) == [ErrorObservation(2, 1_000, 1_000, "INVALID_CHANNEL: bad uri")]


def test_the_record_layout_is_agronas(buffer: memoryview) -> None:
    DistinctErrorLog(buffer, FakeClock(77)).record("abc")
    log = DistinctErrorLog(buffer, FakeClock(88))
    log.record("defgh")
    assert ed.RECORD_HEADER.unpack_from(buffer, 0) == (24 + 3, 1, 77, 77)
    assert bytes(buffer[24:27]) == b"abc"
    # The second record starts 8-byte aligned after the first (27 -> 32).
    assert ed.RECORD_HEADER.unpack_from(buffer, 32) == (24 + 5, 1, 88, 88)
    assert bytes(buffer[56:61]) == b"defgh"


def test_a_full_log_refuses_new_errors_but_still_counts_known_ones(buffer: memoryview) -> None:
    log = DistinctErrorLog(buffer, FakeClock())
    big = "x" * (LENGTH - 2 * ed.ENCODED_ERROR_OFFSET - 16)
    assert log.record(big)
    assert not log.record("y" * 40)
    assert log.record("small")  # 24 + 5 still fits
    assert log.record(big)
    assert [(o.count, len(o.text)) for o in read_error_log(buffer)] == [(2, len(big)), (1, 5)]


def test_read_since_filters_on_the_last_observation(buffer: memoryview) -> None:
    clock = FakeClock(100)
    log = DistinctErrorLog(buffer, clock)
    log.record("early")
    clock.now_ms = 200
    log.record("late")
    clock.now_ms = 300
    log.record("early")
    assert [o.text for o in read_error_log(buffer, since_ms=250)] == ["early"]
    assert [o.text for o in read_error_log(buffer, since_ms=150)] == ["early", "late"]
    assert read_error_log(buffer, since_ms=301) == []


def test_a_log_reopened_over_the_same_buffer_keeps_counting(buffer: memoryview) -> None:
    DistinctErrorLog(buffer, FakeClock()).record("again")
    reopened = DistinctErrorLog(buffer, FakeClock(5_000))
    reopened.record("again")
    reopened.record("new")
    assert [(o.text, o.count, o.last_observation_ms) for o in read_error_log(buffer)] == [
        ("again", 2, 5_000),
        ("new", 1, 5_000),
    ]


def test_threads_recording_concurrently_lose_no_observation(buffer: memoryview) -> None:
    log = DistinctErrorLog(buffer, FakeClock())

    def worker(n: int) -> None:
        for i in range(500):
            log.record(("error alpha", "error beta", "error gamma")[i % 3])

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted((o.text, o.count) for o in read_error_log(buffer)) == [
        ("error alpha", 668),
        ("error beta", 668),
        ("error gamma", 664),
    ]


def test_errors_of_one_kind_that_differ_only_in_names_and_numbers_share_a_record(buffer: memoryview) -> None:
    """A STORAGE_SPACE error names its log file, a counters-full refusal its stream and channel: each kind is
    one record however many files, streams and channels, with the first example, the count and the times."""
    clock = FakeClock(1_000)
    log = DistinctErrorLog(buffer, clock)
    for i in range(500):
        clock.now_ms = 1_000 + i
        assert log.record(
            f"STORAGE_SPACE: cannot create log /dev/shm/logbuf-root/publications/{1000 + i}.logbuffer: "
            f"[Errno 28] No space left on device (cannot reserve {3149824 + i} bytes)"
        )
        assert log.record(
            f"image for stream {i} on 'aeron:udp?endpoint=10.0.{i % 256}.1:{2000 + i}|alias=c{i}' rejected: "
            "the counters are full"
        )
        assert log.record(f"GENERIC_ERROR: publication aeron:ipc?alias=x{i} stream_id={i} needs 6 counters")
    observations = read_error_log(buffer)
    assert [(o.count, o.first_observation_ms, o.last_observation_ms) for o in observations] == [(500, 1_000, 1_499)] * 3
    assert observations[0].text.startswith("STORAGE_SPACE: cannot create log /dev/shm/logbuf-root/publications/1000.")
    assert log.distinct_count == 3
    assert log.record("a new kind of error")  # the log did not fill: later errors still get a record


def test_errors_of_different_kinds_or_wording_stay_distinct(buffer: memoryview) -> None:
    log = DistinctErrorLog(buffer, FakeClock())
    for text in (
        "STORAGE_SPACE: cannot create log /a/1.logbuffer: no space",
        "GENERIC_ERROR: cannot create log /a/1.logbuffer: no space",
        "STORAGE_SPACE: cannot map log /a/1.logbuffer: no space",
        "STORAGE_SPACE: cannot create log /a/2.logbuffer: no space",  # the first again, another file
    ):
        log.record(text)
    assert [o.count for o in read_error_log(buffer)] == [2, 1, 1]


def test_error_shape_takes_out_numbers_paths_channels_and_quoted_values() -> None:
    shape = error_shape("INVALID_CHANNEL: mtu='99' in aeron:udp?endpoint=1.2.3.4:5|mtu=99 (file /x/y.py, line 12)")
    assert shape == "INVALID_CHANNEL: mtu=<value> in <channel> (file <path>, line <n>)"


def test_a_reopened_log_groups_new_errors_with_the_records_already_there(buffer: memoryview) -> None:
    DistinctErrorLog(buffer, FakeClock()).record("STORAGE_SPACE: cannot create log /d/1.logbuffer")
    reopened = DistinctErrorLog(buffer, FakeClock(5_000))
    reopened.record("STORAGE_SPACE: cannot create log /d/2.logbuffer")
    assert [(o.count, o.last_observation_ms) for o in read_error_log(buffer)] == [(2, 5_000)]


def test_errors_are_readable_from_another_process_after_the_writer_crashed(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "crash.dat")
    mapped_file(path, LENGTH).close()
    child = spawn("error_writer_then_crash", path=path, repeats=5)
    try:
        child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert child.returncode == 3  # it died without cleaning up
    fd = os.open(path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, LENGTH, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    observations = read_error_log(memoryview(mm))
    assert [(o.count, o.first_observation_ms, o.last_observation_ms) for o in observations] == [
        (5, 1_000, 1_000),
        (1, 1_000, 1_000),
    ]
    assert "RuntimeError: disk on fire" in observations[0].text
    assert observations[1].text == "plain text error"


def test_reading_stops_at_a_corrupt_length(buffer: memoryview) -> None:
    log = DistinctErrorLog(buffer, FakeClock())
    log.record("good")
    ed.RECORD_HEADER.pack_into(buffer, 32, LENGTH * 2, 1, 1, 1)  # a length past the end
    assert [o.text for o in read_error_log(buffer)] == ["good"]


def test_error_text_of_a_chained_exception_includes_the_cause() -> None:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as e:
        text = error_text(e)
    assert "KeyError: 'inner'" in text and "RuntimeError: outer" in text


def test_a_buffer_of_a_bad_length_is_rejected() -> None:
    with pytest.raises(ValueError, match="error log length=100 must be a multiple of 8"):
        DistinctErrorLog(memoryview(bytearray(100)))
