"""Unblocking a log after a publisher died between claim and commit (logbuf.logbuffer.term_unblocker)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from logbuf import native
from logbuf.logbuffer.fragment_assembler import FragmentAssembler
from logbuf.logbuffer.publication import BufferClaim
from logbuf.logbuffer.standalone import StreamLog
from logbuf.logbuffer.term_unblocker import log_unblock

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
    assert log_unblock(log.log, blocked)
    assert drain(image) == [b"after"]
    assert not log_unblock(log.log, image.position)  # nothing blocked any more


def test_a_committed_frame_or_a_claim_with_nothing_after_it_is_left_alone(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    position = pub.offer(b"x")
    assert not log_unblock(log.log, position - 64)  # a committed frame there
    claim = BufferClaim()
    assert pub.try_claim(10, claim) > 0
    term = log.log.term_buffer(0)
    native.put_int32_ordered(term, position, 0)  # zeroes, and no frame after it: cannot bound it
    term.release()
    assert not log_unblock(log.log, position)
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
    assert log_unblock(log.log, blocked)
    assert log.log.active_term_count() == 1
    assert pub.offer(b"next term") > 0
    assert drain(image) == [b"next term"]
