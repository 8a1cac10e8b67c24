"""The ingest's collections as topics: each event published into the event stream goes out again on a topic
stream with its collection as the topic, through a real media driver, from the websocket upstream stand-in
(which drops once mid-stream, so the replayed overlap is there to be repeated, and must not be)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from logbuf.client import Aeron, Context
from logbuf.client.topics import TopicSubscription
from logbuf.jetstream.ingest import OVERFLOW_TOPIC, Ingest, IngestStats, Sequencer, TopicTee, UpstreamSource
from logbuf.logbuffer.fragment_assembler import FragmentAssembler
from logbuf.testing import wait_until
from logbuf.topic_names import TopicPatterns
from tests.jetstream._ingest_support import StreamReader, UpstreamStandIn, driver_process, make_events

CHANNEL = "aeron:ipc"
EVENTS_STREAM, TOPICS_STREAM = 1011, 1012


def _topic(raw: bytes) -> str:
    """The topic an event should go out as, read independently of the ingest."""
    event = json.loads(raw)
    return (event.get("commit") or {}).get("collection") or event["kind"]


class TopicReader:
    """A topic subscription's whole messages, with their topic names."""

    def __init__(self, subscription: TopicSubscription) -> None:
        self.subscription = subscription
        self.got: list[tuple[str | None, bytes]] = []
        self._assembler = FragmentAssembler(self._on_message)

    def _on_message(self, buffer: memoryview, header: Any) -> None:
        self.got.append((self.subscription.topic_name(header.reserved_value), bytes(buffer)))

    def poll(self) -> int:
        return self.subscription.poll(self._assembler, 256)


def test_collections_go_out_as_topics_each_matching_event_once_in_order_across_an_upstream_drop() -> None:
    events = make_events(1500, step_us=1000)
    upstream = UpstreamStandIn(events, rate=6000).start()
    with driver_process() as driver:
        reader = StreamReader(driver.dir, CHANNEL, EVENTS_STREAM)
        aeron = Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=3_000_000_000))
        pattern_sets = [["app.bsky.feed.*"], ["app.bsky.graph.follow"], [">"]]
        readers = [TopicReader(aeron.add_topic_subscription(CHANNEL, TOPICS_STREAM, p)) for p in pattern_sets]
        pub = aeron.add_exclusive_publication(CHANNEL, EVENTS_STREAM)
        topics = aeron.add_topic_publication(CHANNEL, TOPICS_STREAM, exclusive=True)
        wait_until(lambda: topics.is_connected and pub.is_connected, 10, "publications connected")
        source = UpstreamSource(
            upstream.url, Sequencer(rewind_us=200_000), backoff_initial_ns=50_000_000, backoff_max_ns=200_000_000
        )
        ingest = Ingest(pub, source, topics=topics)
        ingest.start()

        def poll_until(condition: Any, what: str, timeout_s: float = 30) -> None:
            wait_until(condition, timeout_s, what, do_work=lambda: sum(r.poll() for r in readers))

        try:
            poll_until(lambda: len(readers[2].got) >= 600, "the first 600 events on the topic stream")
            upstream.kill()  # mid-stream: the reconnect replays a rewound overlap
            poll_until(lambda: ingest.stats.disconnects >= 1, "the ingest to notice the drop")
            upstream = UpstreamStandIn(events, rate=6000, port=upstream.port).start()
            poll_until(lambda: len(readers[2].got) >= len(events), "every event on the topic stream")
            quiet_until = time.monotonic() + 0.2  # a repeat would arrive now
            while time.monotonic() < quiet_until:
                sum(r.poll() for r in readers)
            assert [raw for raw, _ in reader.wait_for(len(events))] == events  # the event stream is untouched
            for topic_reader, patterns in zip(readers, pattern_sets, strict=True):
                match = TopicPatterns(patterns)
                expected = [(_topic(raw), raw) for raw in events if match.matches(_topic(raw))]
                assert topic_reader.got == expected, patterns
                assert topic_reader.subscription.topic_filter.unresolved == 0
            stats = ingest.stats
            assert stats.duplicates > 0 and stats.connections == 2  # the overlap was there, and dropped
            assert stats.topic_published == len(events) and stats.topic_not_connected == stats.topic_overflow == 0
            assert {_topic(raw) for raw in events} >= {"identity", "account", "app.bsky.feed.post"}
            assert ingest.error is None
            # With no topic subscriber anywhere, a copy is dropped and counted: the relay does not stall.
            unheard = TopicTee(aeron.add_topic_publication(CHANNEL, TOPICS_STREAM + 1), stats)
            assert unheard.try_offer(events[0], "app.bsky.feed.like") and stats.topic_not_connected == 1
        finally:
            ingest.stop()
            upstream.kill()
            aeron.close()
            reader.close()


def test_the_tee_names_bad_and_surplus_collections_overflow() -> None:
    stats = IngestStats()
    tee = TopicTee(None, stats, max_topics=2)  # type: ignore[arg-type]  # naming only: nothing is offered
    commit = json.dumps({"did": "did:plc:x", "time_us": 5, "kind": "commit", "commit": {"collection": "a.b.c"}})
    assert tee.topic_of(commit.encode()) == "a.b.c"
    assert tee.topic_of(commit.replace("a.b.c", "a..b").encode()) == OVERFLOW_TOPIC  # not a topic name
    assert tee.topic_of(commit.replace("a.b.c", "x.y.z").encode()) == OVERFLOW_TOPIC  # a third distinct one
    assert tee.topic_of(commit.encode()) == "a.b.c" and stats.topic_overflow == 2
    identity = json.dumps({"did": "did:plc:x", "time_us": 6, "kind": "identity", "identity": {}}).encode()
    assert tee.topic_of(identity) == OVERFLOW_TOPIC  # still beyond max_topics
    assert TopicTee(None, stats).topic_of(identity) == "identity"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_topics=0"):
        TopicTee(None, stats, max_topics=0)  # type: ignore[arg-type]
