"""The filtered polls on a standalone log: only accepted topics reach the handler, skipped frames are consumed,
and a frame whose resolver raised is not lost (the next poll sees it again)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from logbuf.logbuffer.image import FragmentBatch, Image
from logbuf.logbuffer.publication import Publication
from logbuf.logbuffer.standalone import StreamLog
from logbuf.native import TopicFilter, TopicHandle


@pytest.fixture
def log() -> Iterator[tuple[Publication, Image]]:
    stream = StreamLog.create(f"lbtopic-{uuid.uuid4().hex[:8]}", term_length=64 * 1024)
    try:
        pub = stream.add_publication(exclusive=True)
        image = stream.add_subscriber()
        yield pub, image
        image.close()
        pub.close()
    finally:
        stream.close()
        stream.unlink()


class FlakyResolver:
    """Accepts even ids; raises the first time it is asked about ``flaky``."""

    def __init__(self, flaky: int) -> None:
        self.flaky = flaky
        self.raised = False

    def __call__(self, topic_id: int) -> bool:
        if topic_id == self.flaky and not self.raised:
            self.raised = True
            raise RuntimeError("registry unreadable just now")
        return topic_id % 2 == 0


def _offer_topics(pub: Publication) -> None:
    handles = {t: TopicHandle(pub, t, f"t.{t}".encode()) for t in (2, 3, 4)}
    for i, t in enumerate([2, 3, 4, 2, 4, 3]):
        assert handles[t].offer(f"{t}:{i}".encode()) > 0


@pytest.mark.parametrize("kind", ["poll", "controlled", "batch"])
def test_a_frame_whose_resolver_raised_is_delivered_by_the_next_poll(log: tuple[Publication, Image], kind: str) -> None:
    pub, image = log
    _offer_topics(pub)
    f = TopicFilter(FlakyResolver(4), lambda t, n: None)
    got: list[str] = []
    polls: dict[str, Callable[[], Any]] = {
        "poll": lambda: image.poll_filtered(f, lambda b, h: got.append(bytes(b).decode()), 100),
        "controlled": lambda: image.controlled_poll_filtered(f, lambda b, h: got.append(bytes(b).decode()), 100),
        "batch": lambda: _batch(image, f, got),
    }
    with pytest.raises(RuntimeError, match="unreadable"):
        polls[kind]()
    while polls[kind]():
        pass
    polls[kind]()  # a batch is consumed by the next poll
    assert got == ["2:0", "4:2", "2:3", "4:4"]  # t.4's first message was not lost; odd topics never delivered
    assert f.definitions == 3 and f.skipped == 2 and image.position == pub.position


def _batch(image: Image, f: TopicFilter, got: list[str]) -> int:
    batch = FragmentBatch(16)
    try:
        return image.poll_batch_filtered(f, batch)
    finally:  # a batch cut short by a resolver's error still holds the fragments before it
        got += [bytes(batch.payload(i)).decode() for i in range(batch.count)]
