"""Unblocking a log after a publisher died between claim and commit (logbuf.logbuffer.term_unblocker)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from logbuf import native
from logbuf.errors import CorruptLogError
from logbuf.logbuffer.fragment_assembler import FragmentAssembler
from logbuf.logbuffer.publication import BufferClaim
from logbuf.logbuffer.standalone import StreamLog
from logbuf.logbuffer.term_unblocker import UnblockStatus, blocking_problem_at, log_unblock

TERM = 64 * 1024


@pytest.fixture
def log() -> Iterator[StreamLog]:
    stream_log = StreamLog.create(f"unblock-{uuid.uuid4().hex[:8]}", term_length=TERM, stream_id=3)
    try:
        yield stream_log
    finally:
        stream_log.close()
        stream_log.unlink()


def drain(image: Any) -> list[bytes]:
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda buffer, header: got.append(bytes(buffer)))
    while True:  # padding moves the position without counting as a fragment
        before = image.position
        if not image.poll(assembler, 100) and image.position == before:
            return got


def dead_claim(pub: Any, length: int) -> int:
    """Claim and never commit (a publisher killed mid-claim: the header holds a negative length);
    returns the claim's position."""
    claim = BufferClaim()
    end = pub.try_claim(length, claim)
    assert end > 0
    start = end - ((length + 32 + 31) & ~31)
    return start


@pytest.mark.parametrize("header_written", [True, False])
def test_a_dead_claim_followed_by_committed_frames_is_padded_over(log: StreamLog, header_written: bool) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    assert pub.offer(b"before") > 0
    blocked = dead_claim(pub, 100)
    if not header_written:  # it died before even writing the header: zeroes
        term = log.log.term_buffer(0)
        term[blocked : blocked + 32] = bytes(32)
        term.release()
    assert pub.offer(b"after") > 0
    assert drain(image) == [b"before"]  # stuck at the dead claim
    assert image.position == blocked
    assert log_unblock(log.log, blocked) is UnblockStatus.UNBLOCKED
    assert drain(image) == [b"after"]
    assert log_unblock(log.log, image.position) is UnblockStatus.NO_ACTION  # nothing blocked any more


def test_a_committed_frame_or_a_claim_with_nothing_after_it_is_left_alone(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    position = pub.offer(b"x")
    assert log_unblock(log.log, position - 64) is UnblockStatus.NO_ACTION  # a committed frame there
    claim = BufferClaim()
    assert pub.try_claim(10, claim) > 0
    term = log.log.term_buffer(0)
    native.put_int32_ordered(term, position, 0)  # zeroes, and no frame after it: cannot bound it
    term.release()
    assert log_unblock(log.log, position) is UnblockStatus.NO_ACTION
    assert drain(image) == [b"x"]


def test_a_dead_claim_at_the_end_of_a_term_is_padded_to_the_end_and_the_log_rotates(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    message = bytes(1000)
    while pub.position + 2 * 1056 < TERM:
        assert pub.offer(message) > 0
        drain(image)
    blocked = dead_claim(pub, 1000)
    term = log.log.term_buffer(0)
    term[blocked : blocked + 32] = bytes(32)
    # the last claim in the term: pretend its publisher also died, so nothing follows in this term
    end = blocked + 1056
    rest = TERM - end
    claim = BufferClaim()
    assert pub.try_claim(rest - 32, claim) > 0
    term[end : end + 32] = bytes(32)
    term.release()
    assert log.log.active_term_count() == 0
    assert log_unblock(log.log, blocked) is UnblockStatus.UNBLOCKED_TO_END
    assert log.log.active_term_count() == 1
    assert pub.offer(b"next term") > 0
    assert drain(image) == [b"next term"]


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


@pytest.mark.parametrize(
    ("frame_type", "frame_length", "problem"),
    [
        (1, 5, "shorter than the 32-byte frame header"),
        (1, 31, "shorter than the 32-byte frame header"),
        (1, -5, "negative and not a claim"),
        (1, INT32_MIN, "negative and not a claim"),  # once an OverflowError in the conductor
        # fits the term, so a reader takes it for a claim being written and waits; but it runs past the tail
        (1, -(TERM - 64), "negative and not a claim"),
        (1, TERM, "runs past the end of the term"),
        (0, INT32_MAX, "runs past the end of the term"),  # a huge PAD
        (0, 7, "shorter than the 32-byte frame header"),
    ],
)
def test_a_corrupt_frame_where_the_readers_stopped_is_refused_not_padded_from(
    log: StreamLog, frame_type: int, frame_length: int, problem: str
) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    assert pub.offer(b"before") > 0
    blocked = pub.position
    for _ in range(3):
        assert pub.offer(b"after") > 0  # committed frames behind the damage: the tail is past it
    term = log.log.term_buffer(0)
    native.put_int32_ordered(term, blocked, frame_length)
    term[blocked + 6 : blocked + 8] = frame_type.to_bytes(2, "little")
    damaged = bytes(term)
    term.release()
    if 32 <= -frame_length <= TERM - blocked:  # a reader waits for it: only the unblocker can tell
        assert drain(image) == [b"before"]
    else:
        assert drain_until_error(image) == [b"before"]
    assert problem in (blocking_problem_at(log.log, blocked) or "")
    assert log_unblock(log.log, blocked) is UnblockStatus.REFUSED
    term = log.log.term_buffer(0)
    assert bytes(term) == damaged  # nothing written
    term.release()
    assert image.position == blocked


def test_a_claim_in_progress_is_not_reported_as_corrupt(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    blocked = dead_claim(pub, 100)
    assert pub.offer(b"after") > 0
    assert blocking_problem_at(log.log, blocked) is None


def drain_until_error(image: Any) -> list[bytes]:
    """Poll until the image stops with a CorruptLogError; what it delivered before."""
    got: list[bytes] = []
    for _ in range(10):
        try:
            image.poll(lambda buffer, header: got.append(bytes(buffer)), 100)
        except CorruptLogError:
            return got
    raise AssertionError(f"no CorruptLogError after {got}")
