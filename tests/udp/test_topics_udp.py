"""Topics over UDP between two network-namespace hosts, each with its own driver: the names travel in the
stream's definition frames, the receiving host's subscribers learn them (and write them into that host's
registry, where a later subscriber there finds them), exact and wildcard subscriptions get every matching
message once and in order, a wildcard picks up a topic first published after it subscribed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from logbuf.client import Aeron, Context
from logbuf.client.topics import TopicPublication, TopicSubscription
from logbuf.conduit.topic_registry import TopicRegistry
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess
from logbuf.testing.netns import drivers_fixture, network_fixture, requires_netns
from logbuf.topic_names import TopicPatterns

pytestmark = requires_netns

DRIVER_ARGS = [
    *("--dir-delete-on-shutdown", "false", "--driver-timeout", "5s", "--client-liveness-timeout", "5s"),
    *("--term-length", "1m", "--publication-linger-timeout", "1s"),
]
PORT = 24_777


net = network_fixture(2)


hosts = drivers_fixture(DRIVER_ARGS)


@pytest.fixture
def clients(hosts: list[DriverProcess]) -> Iterator[list[Aeron]]:
    a = Aeron.connect(Context(dir=hosts[0].dir, driver_timeout_ns=5_000_000_000))
    b = Aeron.connect(Context(dir=hosts[1].dir, driver_timeout_ns=5_000_000_000))
    try:
        yield [a, b]
    finally:
        a.close()
        b.close()


def _channel(port: int) -> str:
    return f"aeron:udp?endpoint=10.13.0.2:{port}"  # host 1 receives


def _offer(pub: TopicPublication, topic: str, payload: str) -> None:
    wait_until(lambda: pub.offer(topic, payload.encode()) > 0, 10, f"the offer of {topic}")


def _drain(sub: TopicSubscription, got: list[tuple[str, str]], want: int, timeout_s: float = 20) -> None:
    def handler(buffer: memoryview, header: Any) -> None:
        name = sub.topic_name(header.reserved_value)
        assert name is not None
        got.append((name, bytes(buffer).decode()))

    wait_until(lambda: len(got) >= want, timeout_s, f"{want} messages", do_work=lambda: sub.poll(handler, 256))
    quiet_until = time.monotonic() + 0.2  # and nothing more
    while time.monotonic() < quiet_until:
        sub.poll(handler, 256)
    assert len(got) == want, got[want:]


TOPICS = [f"md.{sector}.{sym}" for sector in ("eq", "fx", "rates") for sym in ("A", "B", "C")]


def test_exact_and_wildcard_subscribers_on_another_host_get_every_match_once_in_order(
    clients: list[Aeron], hosts: list[DriverProcess]
) -> None:
    a, b = clients
    pattern_sets = [["md.fx.B"], ["md.eq.*"], [">"]]
    subs = [b.add_topic_subscription(_channel(PORT), 30, p) for p in pattern_sets]
    pub = a.add_topic_publication(_channel(PORT), 30)
    wait_until(lambda: pub.is_connected and all(s.image_count == 1 for s in subs), 15, "UDP stream not connected")
    sent = []
    for i in range(2000):
        topic = TOPICS[i % len(TOPICS)]
        _offer(pub, topic, str(i))
        sent.append((topic, str(i)))
    _offer(pub, "md.eq.LATE", "late")  # first published after every subscription was made
    sent.append(("md.eq.LATE", "late"))
    for sub, patterns in zip(subs, pattern_sets, strict=True):
        match = TopicPatterns(patterns)
        expected = [m for m in sent if match.matches(m[0])]
        got: list[tuple[str, str]] = []
        _drain(sub, got, len(expected))
        assert got == expected, patterns
        assert sub.topic_filter.unresolved == 0 and sub.topic_filter.definitions == len(TOPICS) + 1
    with TopicRegistry.open(hosts[1].dir, writable=False) as registry:  # the receiving host learnt the names
        registry.poll()
        assert set(registry.names.values()) == {*TOPICS, "md.eq.LATE"}


def test_a_later_subscriber_on_the_receiving_host_names_topics_from_its_registry(clients: list[Aeron]) -> None:
    a, b = clients
    first = b.add_topic_subscription(_channel(PORT + 1), 31, [">"])
    pub = a.add_topic_publication(_channel(PORT + 1), 31)
    wait_until(lambda: pub.is_connected and first.image_count == 1, 15, "UDP stream not connected")
    _offer(pub, "x.one", "1")  # its definition is seen by `first` only
    _drain(first, [], 1)
    later = b.add_topic_subscription(_channel(PORT + 1), 31, ["x.*"])
    wait_until(lambda: later.image_count == 1, 15, "no image for the later subscription")
    _offer(pub, "x.one", "2")
    got: list[tuple[str, str]] = []
    _drain(later, got, 1)
    assert got == [("x.one", "2")] and later.topic_filter.definitions == 0


def test_two_publishers_on_one_host_each_arrive_once_in_order_and_a_lagging_subscribers_lag_shows_in_stat(
    clients: list[Aeron], hosts: list[DriverProcess]
) -> None:
    from logbuf.client.topic_stat import TopicStatReader

    a, b = clients
    wild, idle = (b.add_topic_subscription(_channel(PORT + 2), 32, p) for p in (["q.*"], ["q.one"]))
    pubs = [a.add_topic_publication(_channel(PORT + 2), 32, exclusive=True) for _ in range(2)]
    wait_until(
        lambda: all(p.is_connected for p in pubs) and wild.image_count == idle.image_count == 2, 15, "not connected"
    )
    sent: list[tuple[int, str, str]] = []
    for i in range(400):
        for k, pub in enumerate(pubs):
            topic = ("q.one", "q.two", "r.one")[(i + k) % 3]
            _offer(pub, topic, f"{k}:{i}")
            sent.append((k, topic, f"{k}:{i}"))
    got: list[tuple[str, str]] = []
    expected = [(t, body) for _, t, body in sent if t.startswith("q.")]
    _drain(wild, got, len(expected))
    for k in (0, 1):  # once each, in order per publisher, nothing of r.one
        assert [m for m in got if m[1].startswith(f"{k}:")] == [m for m in expected if m[1].startswith(f"{k}:")]
    # `idle` has read nothing: the receiving host's logbuf-stat --topics shows it behind by all its slowest image
    # holds (as TopicSubscription.lag does for IPC).
    behind = max(p.position for p in pubs)
    reader = TopicStatReader(hosts[1].dir)
    try:
        wait_until(
            lambda: _lag_of(reader, idle.registration_id) == behind,
            15,
            f"idle's lag to reach {behind} bytes (is {_lag_of(reader, idle.registration_id)})",
        )
        assert _lag_of(reader, wild.registration_id) == 0
    finally:
        reader.close()
    idle.close()
    wild.close()
    for pub in pubs:
        pub.close()


def _lag_of(reader: Any, registration_id: int) -> int | None:
    for sub in reader.sample(time.monotonic()).subscriptions:
        if sub.registration_id == registration_id:
            return int(sub.lag) if sub.lag is not None else None
    return None
