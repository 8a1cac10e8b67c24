"""A subscription's native poll (``logbuf.native.SubscriptionCore``) over several images: round-robin, the
fragment limit shared across images, every message once and in order per publisher. A real driver
process and real shared memory; two exclusive publications on one stream make two images."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from logbuf.client import Aeron, Context
from logbuf.native import SubscriptionCore
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess


@pytest.fixture
def aeron(media_driver: DriverProcess) -> Iterator[Aeron]:
    with Aeron.connect(Context(dir=media_driver.dir, driver_timeout_ns=3_000_000_000)) as client:
        yield client


def test_poll_takes_turns_over_the_images_and_shares_the_fragment_limit(aeron: Aeron) -> None:
    sub = aeron.add_subscription("aeron:ipc", 9)
    pubs = [aeron.add_exclusive_publication("aeron:ipc", 9) for _ in range(2)]
    wait_until(
        lambda: len(sub.images) >= 2 and all(p.is_connected for p in pubs),
        10,
        "both images",
        do_work=lambda: sub.poll(lambda buffer, header: None, 1),
    )
    assert isinstance(sub, SubscriptionCore)
    for i in range(50):
        for k, pub in enumerate(pubs):
            assert pub.offer(f"{k}:{i}".encode()) > 0
    got: list[tuple[int, str]] = []

    def handler(buffer: memoryview, header: Any) -> None:
        got.append((header.session_id, bytes(buffer).decode()))

    assert sub.poll(handler, 3) == 3  # the limit holds across images
    first = got[0][0]
    assert sub.poll(handler, 1) == 1 and got[-1][0] != first  # the next poll starts at the other image
    while sub.poll(handler, 10):
        pass
    assert len(got) == 100
    for k, pub in enumerate(pubs):
        mine = [text for session, text in got if session == pub.session_id]
        assert mine == [f"{k}:{i}" for i in range(50)]  # once each, in order per publisher


def test_a_subscription_without_images_polls_nothing(aeron: Aeron) -> None:
    sub = aeron.add_subscription("aeron:ipc", 10)
    assert sub.images == () and sub.poll(lambda buffer, header: None, 10) == 0
