"""Publications at their edges: oversize messages and claims, try_claim (commit, abort, misuse), and the
offer results CLOSED, NOT_CONNECTED, BACK_PRESSURED and MAX_POSITION_EXCEEDED.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.logbuffer.image import Header
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.publication import BufferClaim, OfferResult, Publication
from logbuf.logbuffer.standalone import StreamLog
from logbuf.shm import Segment
from tests.support.logs import MAX_PAYLOAD, MTU_LENGTH, SESSION_ID, STREAM_ID, TERM_LENGTH, collect, frame_end


def test_a_message_over_max_message_length_raises_and_appends_nothing(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    max_length = dh.compute_max_message_length(TERM_LENGTH)
    assert pub.max_message_length == max_length == 8192
    before = pub.position
    with pytest.raises(
        ValueError,
        match=r"message length=8193 exceeds max_message_length=8192 "
        r"\(min\(term_length / 8, 16 MiB\) for term_length=65536\)",
    ):
        pub.offer(bytes(max_length + 1))
    assert pub.position == before
    assert pub.offer(bytes(max_length)) == before + dh.compute_fragmented_length(max_length, MAX_PAYLOAD)


@pytest.mark.parametrize("length", [-1, MAX_PAYLOAD + 1, 8192])
def test_a_claim_outside_0_to_max_payload_raises(log: StreamLog, length: int) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    with pytest.raises(ValueError, match=rf"claim length={length} must be within 0..max_payload_length={MAX_PAYLOAD}"):
        pub.try_claim(length, BufferClaim())
    assert pub.position == 0


def test_batches_that_do_not_fit_raise_and_append_nothing(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    with pytest.raises(
        ValueError,
        match=rf"message 1 length={MAX_PAYLOAD + 1} exceeds max_payload_length="
        rf"{MAX_PAYLOAD}; batch messages are not fragmented",
    ):
        pub.offer_batch([b"ok", bytearray(MAX_PAYLOAD + 1)])
    with pytest.raises(ValueError, match=r"batch framed length=8448 exceeds max_message_length=8192"):
        pub.offer_batch([bytes(1000)] * 8)  # 8 frames of 1056 aligned bytes
    with pytest.raises(ValueError, match=r"batch of 65537 messages exceeds the 65536-message batch limit"):
        pub.offer_batch([b""] * 65537)
    with pytest.raises(TypeError, match=r"offer_batch expects a sequence of bytes-like messages"):
        pub.offer_batch(5)
    assert pub.position == 0


def test_an_aborted_claim_leaves_a_padding_frame_the_subscriber_skips(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    first = pub.offer(b"before")
    claim = BufferClaim()
    aborted_end = pub.try_claim(100, claim)
    assert aborted_end == frame_end(first, 100)
    claim.buffer[:] = b"x" * 100
    claim.abort()
    last = pub.offer(b"after")
    got: list[tuple[bytes, int]] = []
    assert image.poll(collect(got), 10) == 2  # the padding is not a fragment
    assert got == [(b"before", first), (b"after", last)]
    assert image.position == last
    with log.log.term_buffer(0) as term:  # the aborted frame is still there, as padding of its full length
        frame_length, _v, _flags, type_, term_offset, *_ = dh.HEADER.unpack_from(term, first)
    assert (type_, frame_length, term_offset) == (dh.HDR_TYPE_PAD, 132, first)


def test_a_committed_claim_delivers_its_bytes_reserved_value_and_flags(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication(exclusive=True)
    claim = BufferClaim()
    end = pub.try_claim(5, claim)
    assert claim.length == 5 and claim.flags == dh.UNFRAGMENTED
    claim.buffer[:] = b"12345"
    claim.reserved_value = -99
    claim.commit()
    assert claim.length == 0
    seen: list[dict[str, int]] = []
    got: list[tuple[bytes, int]] = []

    def handler(buffer: memoryview, header: Header) -> None:
        seen.append(header.snapshot())
        collect(got)(buffer, header)

    assert image.poll(handler, 10) == 1
    assert got == [(b"12345", end)]
    assert seen[0]["reserved_value"] == -99 and seen[0]["session_id"] == SESSION_ID
    assert seen[0]["stream_id"] == STREAM_ID


def test_a_claim_used_as_a_context_manager_commits_or_aborts_on_exception(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    claim = BufferClaim()
    pub.try_claim(3, claim)
    with claim:
        claim.buffer[:] = b"abc"
    pub.try_claim(3, claim)
    with pytest.raises(RuntimeError, match="filling failed"):
        with claim:
            claim.buffer[:1] = b"z"
            raise RuntimeError("filling failed")
    last = pub.offer(b"next")
    got: list[tuple[bytes, int]] = []
    image.poll(collect(got), 10)
    assert [payload for payload, _ in got] == [b"abc", b"next"]
    assert image.position == last


def test_a_finished_claim_cannot_be_used_again(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    claim = BufferClaim()
    pub.try_claim(8, claim)
    with pytest.raises(ValueError, match=r"buffer claim is still active: commit\(\) or abort\(\) it first"):
        pub.try_claim(8, claim)
    claim.commit()
    with pytest.raises(ValueError, match=r"buffer claim is not active \(already committed or aborted\)"):
        claim.commit()
    with pytest.raises(ValueError, match=r"buffer claim is not active \(already committed or aborted\)"):
        claim.abort()
    with pytest.raises(ValueError, match=r"buffer claim is not active \(already committed or aborted\)"):
        claim.buffer
    with pytest.raises(ValueError, match=r"buffer claim is not active"):
        claim.reserved_value = 1


def test_a_closed_publication_returns_closed_for_every_append(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    pub.offer(b"x")
    pub.close()
    assert pub.is_closed and not pub.is_connected
    assert pub.offer(b"y") == OfferResult.CLOSED
    assert pub.offer_batch([b"y"]) == OfferResult.CLOSED
    assert pub.try_claim(1, BufferClaim()) == OfferResult.CLOSED
    assert pub.position == OfferResult.CLOSED == pub.position_limit
    assert log.log.tail_position() == 64  # nothing more was written
    pub.close()  # closing twice is harmless
    assert repr(pub) == "ConcurrentPublication(closed)"


def test_without_a_subscriber_appends_return_not_connected_and_write_nothing(log: StreamLog) -> None:
    for exclusive in (False, True):
        pub = log.add_publication(exclusive=exclusive)
        assert not pub.is_connected
        assert pub.offer(b"x") == OfferResult.NOT_CONNECTED
        assert pub.offer_batch([b"x", b"y"]) == OfferResult.NOT_CONNECTED
        assert pub.try_claim(4, BufferClaim()) == OfferResult.NOT_CONNECTED
        assert pub.position == 0
    with log.log.term_buffer(0) as term:
        assert bytes(term[:64]) == bytes(64)


def test_after_the_last_subscriber_leaves_appends_become_not_connected_never_back_pressured(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    assert pub.is_connected
    log.remove_subscriber(image)
    results = set()
    for _ in range(2000):
        result = pub.offer(bytes(200))
        results.add(result if result < 0 else "ok")
        if result == OfferResult.NOT_CONNECTED:
            break
    assert OfferResult.NOT_CONNECTED in results and OfferResult.BACK_PRESSURED not in results
    assert not pub.is_connected
    assert pub.position <= TERM_LENGTH // 2 + MTU_LENGTH  # it stopped at the limit the subscriber left


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_full_window_back_pressures_and_never_overwrites_unread_data(log: StreamLog, exclusive: bool) -> None:
    image = log.add_subscriber()
    pub = log.add_publication(exclusive=exclusive)
    window = TERM_LENGTH // 2
    sent: list[bytes] = []
    got: list[tuple[bytes, int]] = []
    serial = 0
    for _cycle in range(8):  # 8 windows = 4 terms: every partition is reused while the subscriber lags
        start = image.position
        while True:
            body = serial.to_bytes(4, "little") * (1 + serial % 300)
            result = pub.offer(body)
            if result == OfferResult.BACK_PRESSURED:
                break
            assert result > 0, OfferResult(result)
            sent.append(body)
            serial += 1
        # stopped at the limit: the slowest subscriber's position plus the term window
        assert pub.position_limit == start + window
        assert start + window <= pub.position < start + window + MTU_LENGTH
        tail = pub.position
        assert pub.offer(b"x") == OfferResult.BACK_PRESSURED
        assert pub.try_claim(1, BufferClaim()) == OfferResult.BACK_PRESSURED
        assert pub.offer_batch([b"x"]) == OfferResult.BACK_PRESSURED
        assert pub.position == tail == log.log.tail_position()  # back-pressure writes nothing
        while image.position < tail:
            image.poll(collect(got), 100)
        assert [payload for payload, _ in got] == sent  # all intact, in order, none overwritten
    assert image.position > 3 * TERM_LENGTH


def test_back_pressure_waits_for_the_slowest_of_two_subscribers(log: StreamLog) -> None:
    fast, slow = log.add_subscriber(), log.add_subscriber()
    pub = log.add_publication()
    sent, fast_got, slow_got = [], [], []  # type: ignore[var-annotated]
    while (result := pub.offer(bytes(500))) > 0:
        sent.append(result)
        fast.poll(collect(fast_got), 100)
    assert result == OfferResult.BACK_PRESSURED
    assert fast.position == pub.position and slow.position == 0
    assert pub.position_limit == TERM_LENGTH // 2
    while slow.poll(collect(slow_got), 100):
        pass
    assert [p for _, p in slow_got] == [p for _, p in fast_got] == sent
    assert pub.offer(bytes(500)) > 0


@pytest.fixture
def last_term(log_name: str) -> Iterator[LogBuffers]:
    """A log moved to 64 bytes before the largest position it can reach, connected, with no limit."""
    with LogBuffers.create(log_name, term_length=TERM_LENGTH) as logbuf:
        logbuf.seek_to(lbd._int32(logbuf.initial_term_id + 2**31 - 1), TERM_LENGTH - 64)
        logbuf.set_connected(True)
        yield logbuf
    Segment.unlink(log_name)


def _unlimited() -> bytearray:
    limit = bytearray(8)
    struct.pack_into("<q", limit, 0, 2**63 - 1)
    return limit


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_message_past_the_largest_possible_position_returns_max_position_exceeded(
    last_term: LogBuffers, exclusive: bool
) -> None:
    pub = Publication(last_term.view, _unlimited(), 0, exclusive)
    try:
        assert pub.max_possible_position == TERM_LENGTH * 2**31 == lbd.max_possible_position(TERM_LENGTH)
        assert pub.position == pub.max_possible_position - 64
        assert pub.offer(bytes(100)) == OfferResult.MAX_POSITION_EXCEEDED  # would need one more term
        assert pub.try_claim(100, BufferClaim()) == OfferResult.MAX_POSITION_EXCEEDED
    finally:
        pub.close()


@pytest.mark.parametrize("exclusive", [False, True])
def test_the_last_frame_that_fits_is_accepted_then_max_position_exceeded(
    last_term: LogBuffers, exclusive: bool
) -> None:
    pub = Publication(last_term.view, _unlimited(), 0, exclusive)
    try:
        assert pub.offer(bytes(32)) == pub.max_possible_position  # 64 bytes: ends the last term exactly
        assert pub.offer(b"") == OfferResult.MAX_POSITION_EXCEEDED
        assert pub.offer_batch([b""]) == OfferResult.MAX_POSITION_EXCEEDED
    finally:
        pub.close()


def test_a_batch_that_fails_releases_every_buffer_it_borrowed(log: StreamLog) -> None:
    log.add_subscriber()
    pub = log.add_publication()
    first, big = bytearray(b"abc"), bytearray(MAX_PAYLOAD + 1)
    with pytest.raises(TypeError, match=r"a bytes-like object is required, not 'int'"):
        pub.offer_batch([first, 5])
    with pytest.raises(ValueError, match=r"message 1 length=1377 exceeds max_payload_length=1376"):
        pub.offer_batch([first, big])
    first.append(1)  # would raise BufferError if a view of it were still exported
    big.append(1)
    assert pub.position == 0
