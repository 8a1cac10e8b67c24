"""The multicast NAK back-off and the MDC destination tracker (pure; a seeded random source, plain-int clock)."""

from __future__ import annotations

import random

import pytest

from logbuf.driver.destination_tracker import MAX_DESTINATIONS, DestinationTracker
from logbuf.driver.nak_delay import OptimalMulticastDelayGenerator, StaticDelayGenerator

MS = 1_000_000


def test_static_delay_is_the_delay_then_the_retry() -> None:
    generator = StaticDelayGenerator(100_000, 10 * MS)
    assert generator.delay(False) == 100_000
    assert generator.delay(True) == 10 * MS


def test_multicast_back_off_stays_within_the_maximum_and_mostly_near_it() -> None:
    generator = OptimalMulticastDelayGenerator(10 * MS, 10, random.Random(13))
    delays = [generator.delay(i % 2 == 1) for i in range(20_000)]
    assert 0 <= min(delays) and max(delays) <= 10 * MS
    # RFC 5401's distribution leans late: most receivers wait, so the first NAK's repair reaches them first
    assert sum(d > 5 * MS for d in delays) > 0.6 * len(delays)
    assert sum(d < 1 * MS for d in delays) > 0  # someone NAKs early
    assert len(set(delays)) > 1000  # random, not one value


def test_of_ten_receivers_seeing_one_loss_few_would_nak_before_the_first_repair() -> None:
    """With a 1 ms round trip, receivers whose timer fires within 1 ms of the first NAK also NAK
    (their repair is not there yet); the back-off keeps them few."""
    rng = random.Random(5)
    generator = OptimalMulticastDelayGenerator(10 * MS, 10, rng)
    extra = 0
    for _ in range(1000):
        timers = sorted(generator.delay(False) for _ in range(10))
        extra += sum(1 for t in timers[1:] if t < timers[0] + 1 * MS)
    assert extra / 1000 < 3, extra / 1000  # far fewer than 9 duplicate NAKs per loss


def test_multicast_back_off_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="max_backoff_ns=0"):
        OptimalMulticastDelayGenerator(0, 10)


def test_dynamic_destinations_join_on_their_first_sm_and_leave_after_the_timeout() -> None:
    tracker = DestinationTracker(manual=False, timeout_ns=100)
    tracker.on_status_message(("10.0.0.2", 4000), 1, 0)
    tracker.on_status_message(("10.0.0.3", 4000), 2, 10)
    tracker.on_status_message(("10.0.0.2", 4000), 1, 50)  # a refresh, not a new one
    assert tracker.addresses == [("10.0.0.2", 4000), ("10.0.0.3", 4000)]
    assert tracker.changes == 2
    tracker.on_idle(111)  # 10.0.0.3 silent since 10
    assert tracker.addresses == [("10.0.0.2", 4000)]
    assert tracker.changes == 3
    tracker.on_idle(151)
    assert tracker.addresses == []


def test_manual_destinations_stay_until_removed_and_sms_do_not_add_any() -> None:
    tracker = DestinationTracker(manual=True, timeout_ns=100)
    assert tracker.add(("10.0.0.2", 4000), "aeron:udp?endpoint=10.0.0.2:4000", 0)
    assert not tracker.add(("10.0.0.2", 4000), "aeron:udp?endpoint=10.0.0.2:4000", 0)
    tracker.on_status_message(("10.0.0.9", 4000), 7, 5)  # not a destination: ignored
    tracker.on_status_message(("10.0.0.2", 4000), 3, 5)
    assert tracker.destinations[0].receiver_id == 3
    tracker.on_idle(10_000)
    assert tracker.addresses == [("10.0.0.2", 4000)]
    assert tracker.remove(("10.0.0.2", 4000))
    assert not tracker.remove(("10.0.0.2", 4000))
    assert tracker.addresses == [] and tracker.changes == 2


def test_sms_from_ever_more_addresses_add_at_most_max_destinations() -> None:
    tracker = DestinationTracker(manual=False, timeout_ns=100)
    for i in range(MAX_DESTINATIONS + 100):
        tracker.on_status_message(("10.0.0.1", 1000 + i), i, 0)
    assert len(tracker.destinations) == MAX_DESTINATIONS
    manual = DestinationTracker(manual=True, timeout_ns=100)
    added = [manual.add(("10.0.0.1", 1000 + i), "", 0) for i in range(MAX_DESTINATIONS + 1)]
    assert added.count(True) == MAX_DESTINATIONS and added[-1] is False
