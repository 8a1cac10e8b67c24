"""The position an offer returns is one int object per publication, rewritten while unshared
(``logbuf/native/lb_position_int.h``): a caller that keeps a position keeps its value, exactly as with a
fresh int per offer. A real driver process and real shared memory; the stream starts at 2^40 so every
position is a multi-digit int."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from logbuf.client import Aeron, Context, OfferResult
from logbuf.native import publisher
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess

TERM_LENGTH = 1 << 20  # the media_driver fixture's --ipc-term-length
START_TERM_ID = 1 << 20  # the stream starts at position 2^20 terms * 2^20 bytes = 2^40
CHANNEL = f"aeron:ipc?init-term-id=0|term-id={START_TERM_ID}|term-offset=0"
FRAME = 64  # a 32-byte message, framed


@pytest.fixture
def aeron(media_driver: DriverProcess) -> Iterator[Aeron]:
    with Aeron.connect(Context(dir=media_driver.dir, driver_timeout_ns=3_000_000_000)) as client:
        yield client


@pytest.fixture
def connected(aeron: Aeron) -> Any:
    pub = aeron.add_publication(CHANNEL, 7)
    sub = aeron.add_subscription("aeron:ipc", 7)
    wait_until(
        lambda: pub.is_connected and sub.images,
        10,
        "the publication connected",
        do_work=lambda: sub.poll(lambda buffer, header: None, 1),
    )
    return pub


def test_this_interpreter_reuses_the_position_int() -> None:
    assert publisher.POSITION_INT_REUSED  # CPython 3.11-3.13 with the GIL: the fast path is the one tested


def test_a_position_not_kept_is_the_same_object_next_time(connected: Any) -> None:
    message = bytes(32)
    first = id(connected.offer(message))
    assert id(connected.offer(message)) == first  # dropped at once: rewritten, not reallocated


def test_kept_positions_keep_their_values(connected: Any) -> None:
    message = bytes(32)
    start = connected.position
    assert start == (START_TERM_ID << 20)
    kept = [connected.offer(message) for _ in range(300)]  # a list holds every one: none may be rewritten
    assert kept == [start + FRAME * (i + 1) for i in range(300)]
    assert [str(p) for p in kept] == [str(start + FRAME * (i + 1)) for i in range(300)]
    held = connected.offer(message)  # in a variable across the offers after it
    for _ in range(50):
        assert connected.offer(message) > held
    assert held == start + FRAME * 301
    by_position = {p: i for i, p in enumerate(kept)}
    assert all(by_position[start + FRAME * (i + 1)] == i for i in range(300))  # hash and equality as fresh ints


def test_positions_compute_like_fresh_ints(connected: Any) -> None:
    message = bytes(32)
    for _ in range(100):
        before = connected.position
        position = connected.offer(message)
        fresh = int(str(before + FRAME))
        assert position == fresh and hash(position) == hash(fresh) and position - before == FRAME
        assert position >> 20 == START_TERM_ID and position & (TERM_LENGTH - 1) == fresh & (TERM_LENGTH - 1)
        assert position.to_bytes(8, "little") == fresh.to_bytes(8, "little") and type(position) is int


def test_failure_codes_are_the_plain_negative_codes(aeron: Aeron) -> None:
    pub = aeron.add_publication(CHANNEL, 8)  # nobody subscribes to stream 8
    result = pub.offer(bytes(32))
    assert result == OfferResult.NOT_CONNECTED == -1
    assert result is pub.offer(bytes(32))  # a small int: CPython's own cached object
