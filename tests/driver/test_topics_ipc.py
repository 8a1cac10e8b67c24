"""Topics over an IPC stream through a real driver: exact and wildcard subscriptions filtered in the native
polls, a wildcard picking up a topic first published after it subscribed, a late subscriber naming topics
from the driver's registry, 100,000 distinct topics on one stream. Every matching message once and in order
per publisher, no other one."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from logbuf.client import Aeron, Context, ControlledPollAction, FragmentBatch, TopicNameError
from logbuf.client.topics import TopicPublication, TopicSubscription
from logbuf.conduit.topic_registry import TopicRegistry
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet
from logbuf.topic_names import TopicPatterns, topic_id

CHANNEL = "aeron:ipc"


DRIVER_ARGS = [
    *("--ipc-term-length", "1m", "--driver-timeout", "3s", "--client-liveness-timeout", "2s"),
    *("--publication-linger-timeout", "1s", "--dir-delete-on-shutdown", "false"),
    *("--topic-registry-length", "8m"),  # 100,000 distinct topics: ~4 MiB of names
]


@pytest.fixture(scope="module")
def media_driver(request: pytest.FixtureRequest) -> Iterator[DriverProcess]:
    """One driver for the module (each test has its own stream id), its error log checked at the end."""
    with DriverSet(request) as drivers:
        yield drivers(*DRIVER_ARGS, base=[])


@pytest.fixture
def aeron(media_driver: DriverProcess) -> Iterator[Aeron]:
    with Aeron.connect(Context(dir=media_driver.dir, driver_timeout_ns=3_000_000_000)) as client:
        yield client


def _connect(subs: list[TopicSubscription], pubs: list[TopicPublication]) -> None:
    wait_until(
        lambda: all(s.image_count == len(pubs) for s in subs) and all(p.is_connected for p in pubs),
        10,
        "every image available and every publication connected",
    )


class Collector:
    """What one subscription got: (session id, topic name, payload) per message."""

    def __init__(self, sub: TopicSubscription) -> None:
        self.sub = sub
        self.got: list[tuple[int, str, str]] = []

    def __call__(self, buffer: memoryview, header: Any) -> None:
        name = self.sub.topic_name(header.reserved_value)
        assert name is not None
        self.got.append((header.session_id, name, bytes(buffer).decode()))

    def drain(self, poll: Callable[[], int] | None = None) -> None:
        quiet_until = time.monotonic() + 0.05
        while time.monotonic() < quiet_until:
            if (poll or (lambda: self.sub.poll(self, 100)))():
                quiet_until = time.monotonic() + 0.05


def _offer(pub: TopicPublication, topic: str, payload: str) -> None:
    wait_until(lambda: pub.offer(topic, payload.encode()) > 0, 10, f"the offer of {topic}")


def _expected(sent: list[tuple[int, str, str]], patterns: list[str]) -> list[tuple[int, str, str]]:
    match = TopicPatterns(patterns)
    return [m for m in sent if match.matches(m[1])]


def _per_session(got: list[tuple[int, str, str]]) -> dict[int, list[tuple[int, str, str]]]:
    out: dict[int, list[tuple[int, str, str]]] = {}
    for m in got:
        out.setdefault(m[0], []).append(m)
    return out


TOPICS = ["md.equities.AAPL", "md.equities.MSFT", "md.equities.AAPL.bid", "md.fx.EURUSD", "ops.alerts"]
PATTERN_SETS = [["md.equities.AAPL"], ["md.equities.*"], ["md.>"], [">"], ["*.fx.*", "ops.alerts"]]


def test_exact_and_wildcard_subscriptions_get_each_matching_message_once_in_order(aeron: Aeron) -> None:
    subs = [aeron.add_topic_subscription(CHANNEL, 20, patterns) for patterns in PATTERN_SETS]
    pubs = [aeron.add_topic_publication(CHANNEL, 20, exclusive=True) for _ in range(2)]
    _connect(subs, pubs)
    sent = []
    for i in range(300):
        for k, pub in enumerate(pubs):
            topic = TOPICS[(i + k) % len(TOPICS)]
            _offer(pub, topic, f"{k}:{i}")
            sent.append((pub.publication.session_id, topic, f"{k}:{i}"))
    for sub, patterns in zip(subs, PATTERN_SETS, strict=True):
        collector = Collector(sub)
        collector.drain()
        assert _per_session(collector.got) == _per_session(_expected(sent, patterns)), patterns
        assert sub.topic_filter.definitions == 2 * len(TOPICS)  # each publication named each topic once
        assert sub.topic_filter.resolutions <= len(TOPICS)  # matched once per topic, not per message


def test_a_wildcard_picks_up_a_topic_first_published_after_it_subscribed(aeron: Aeron) -> None:
    sub = aeron.add_topic_subscription(CHANNEL, 21, ["md.equities.*"])
    pub = aeron.add_topic_publication(CHANNEL, 21)
    _connect([sub], [pub])
    _offer(pub, "md.equities.AAPL", "a")
    collector = Collector(sub)
    collector.drain()
    assert [m[1:] for m in collector.got] == [("md.equities.AAPL", "a")]
    _offer(pub, "md.equities.NEWCO", "n1")  # a name no one had seen when the subscription was made
    _offer(pub, "md.bonds.NEWCO", "x")
    _offer(pub, "md.equities.NEWCO", "n2")
    collector.drain()
    assert [m[1:] for m in collector.got][1:] == [("md.equities.NEWCO", "n1"), ("md.equities.NEWCO", "n2")]


def test_a_late_subscriber_names_topics_from_the_registry_and_patterns_change_live(aeron: Aeron) -> None:
    pub = aeron.add_topic_publication(CHANNEL, 22)
    early = aeron.add_topic_subscription(CHANNEL, 22, [">"])
    _connect([early], [pub])
    _offer(pub, "a.one", "1")  # its definition frame goes by before the late subscriber joins
    Collector(early).drain()
    late = aeron.add_topic_subscription(CHANNEL, 22, ["a.one"])
    _connect([late], [pub])
    _offer(pub, "a.one", "2")
    _offer(pub, "a.two", "3")
    collector = Collector(late)
    collector.drain()
    assert [m[1:] for m in collector.got] == [("a.one", "2")]
    assert late.topic_filter.definitions == 1  # only a.two's was in its part of the stream
    late.subscribe("a.*")
    late.unsubscribe("a.one")
    _offer(pub, "a.one", "4")
    _offer(pub, "b.one", "5")
    collector.drain()
    assert [m[1:] for m in collector.got][1:] == [("a.one", "4")]
    assert late.patterns == ["a.*"] and not late.unsubscribe("a.one")


def test_controlled_poll_and_batch_poll_filter_natively(aeron: Aeron) -> None:
    sub = aeron.add_topic_subscription(CHANNEL, 23, ["x.*"])
    pub = aeron.add_topic_publication(CHANNEL, 23)
    _connect([sub], [pub])
    for i in range(40):
        _offer(pub, "x.a" if i % 4 == 0 else "y.a", str(i))
    seen: list[str] = []

    def controlled(buffer: memoryview, header: Any) -> ControlledPollAction:
        text = bytes(buffer).decode()
        if text == "8" and "abort" not in seen:
            seen.append("abort")
            return ControlledPollAction.ABORT  # delivered again on the next poll
        seen.append(text)
        return ControlledPollAction.BREAK if text == "16" else ControlledPollAction.CONTINUE

    deadline = time.monotonic() + 5
    while "16" not in seen:
        assert time.monotonic() < deadline
        sub.controlled_poll(controlled, 100)
    assert seen == ["0", "4", "abort", "8", "12", "16"]
    batch = FragmentBatch(64)
    got: list[str] = []
    deadline = time.monotonic() + 5
    while len(got) < 5:
        assert time.monotonic() < deadline
        n = sub.poll_batch(batch)
        assert (batch.reserved_values[:n] == topic_id("x.a")).all()
        got += [bytes(batch.payload(i)).decode() for i in range(n)]
    assert got == ["20", "24", "28", "32", "36"]
    with pytest.raises(TypeError):
        sub.block_poll(lambda *a: None, 1024)


def test_bad_names_and_patterns_are_refused_by_name(aeron: Aeron) -> None:
    pub = aeron.add_topic_publication(CHANNEL, 24)
    for bad in ["", "a..b", "a b", "a.*", "a.>", ".a", "x" * 1025]:
        with pytest.raises(TopicNameError):
            pub.offer(bad, b"x")
    for bad in ["a.>.b", "a..*", "", "a b"]:
        with pytest.raises(TopicNameError):
            aeron.add_topic_subscription(CHANNEL, 24, [bad])


def test_one_hundred_thousand_distinct_topics_on_one_stream(aeron: Aeron, media_driver: DriverProcess) -> None:
    count = 100_000
    names = [f"t.{i % 100}.{i}" for i in range(count)]
    pattern_sets = [["t.7.7"], ["t.7.*"], [">"]]
    subs = [aeron.add_topic_subscription(CHANNEL, 25, p) for p in pattern_sets]
    pub = aeron.add_topic_publication(CHANNEL, 25)
    _connect(subs, [pub])
    got: list[list[str]] = [[] for _ in subs]
    handlers = [lambda b, h, g=g: g.append(bytes(b).decode()) for g in got]  # type: ignore[misc]

    def poll_all() -> int:
        return sum(s.poll(h, 4096) for s, h in zip(subs, handlers, strict=True))

    for i, name in enumerate(names):  # bounded: a client timed out on a loaded machine fails here, not hangs
        wait_until(lambda: pub.offer(name, str(i).encode()) > 0, 10, f"the offer of {name}", do_work=poll_all)
    while poll_all():
        pass
    wait_until(lambda: len(got[2]) >= count, 10, f"all {count} messages", do_work=poll_all)
    assert got[0] == ["7"]
    assert got[1] == [str(i) for i in range(count) if i % 100 == 7]
    assert got[2] == [str(i) for i in range(count)]
    for sub in subs:
        f = sub.topic_filter
        assert f.resolutions == count and f.definitions == count and f.unresolved == 0
    assert subs[1].topic_filter.skipped == count - count // 100
    with TopicRegistry.open(media_driver.dir, writable=False) as registry:
        registry.poll()
        assert set(names) <= set(registry.names.values())  # the module shares one driver


def test_topic_stat_shows_rates_per_topic_and_each_subscriptions_patterns_and_lag(
    aeron: Aeron, media_driver: DriverProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    from logbuf.client.stat import main as stat_main
    from logbuf.client.topic_stat import TopicStatReader

    sub = aeron.add_topic_subscription(CHANNEL, 26, ["s.*"])
    pub = aeron.add_topic_publication(CHANNEL, 26)
    _connect([sub], [pub])
    reader = TopicStatReader(media_driver.dir)
    try:
        reader.sample(0.0)
        for i in range(30):
            _offer(pub, "s.a" if i % 3 else "s.b", str(i))
        snapshot = reader.sample(1.0)
    finally:
        reader.close()
    assert {(r.name, round(r.msgs_per_s)) for r in snapshot.topics} == {("s.a", 20), ("s.b", 10)}
    (mine,) = [s for s in snapshot.subscriptions if s.registration_id == sub.registration_id]
    # 30 messages and 2 definitions, 64 bytes each, not yet read:
    assert mine.patterns == ["s.*"] and mine.lag == 32 * 64 == sub.lag()
    assert sub.skip_to_tail() == 32 * 64 and sub.lag() == 0 and sub.skipped_bytes == 32 * 64
    _offer(pub, "s.b", "after")
    collector = Collector(sub)
    collector.drain()
    assert [m[1:] for m in collector.got] == [("s.b", "after")]  # the skipped ones are gone, the next is not
    assert stat_main(["--dir", media_driver.dir, "--topics", "--once", "--json", "--interval", "0.05"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert any(s["patterns"] == ["s.*"] for s in printed["subscriptions"])
    sub.close()
    reader = TopicStatReader(media_driver.dir)
    try:
        assert all(s.registration_id != sub.registration_id for s in reader.sample(0.0).subscriptions)
    finally:
        reader.close()
