"""Ingest: the sequencer (sans-IO), then real streams through a real media driver process, fed by
the generator and by a real websocket upstream that drops and comes back."""

from __future__ import annotations

import json
import time

import pytest

from logbuf.client import Aeron, Context
from logbuf.jetstream.generator import EventGenerator
from logbuf.jetstream.ingest import (
    GeneratorSource,
    Ingest,
    IngestStats,
    OriginClock,
    Sequencer,
    UpstreamSource,
    check_rate,
    check_upstream_url,
    with_cursor,
)
from logbuf.testing import wait_until
from logbuf.testing.driver_process import quick_timeout_args
from tests.jetstream._ingest_support import (
    StreamReader,
    UpstreamStandIn,
    big_event,
    driver_process,
    make_events,
    time_us_of,
    without_time_us,
)

CHANNEL = "aeron:ipc"


# -- sequencer -------------------------------------------------------------------------------


def test_sequencer_keeps_upstream_time_us_and_drops_replayed_duplicates() -> None:
    events = make_events(50)
    seq = Sequencer(rewind_us=10_000)
    out = [seq.accept(e) for e in events[:30]]
    assert [o for o in out] == [(e, time_us_of(e)) for e in events[:30]]  # bytes untouched
    assert seq.resume_cursor() == time_us_of(events[29]) - 10_000
    # A reconnect replays from the rewound cursor (inclusive): the overlap is dropped.
    replay = [e for e in events if time_us_of(e) >= seq.resume_cursor()]  # type: ignore[operator]
    out2 = [seq.accept(e) for e in replay]
    published = [o for o in out2 if o is not None]
    assert [raw for raw, _ in published] == events[30:]
    assert seq.stats.duplicates == len(replay) - 20
    assert seq.stats.restamped == 0


def test_sequencer_recognises_the_same_event_stamped_by_another_instance() -> None:
    events = make_events(40, step_us=1000)
    seq = Sequencer(rewind_us=20_000, clock=OriginClock(now_us=lambda: 0))
    for e in events[:25]:
        assert seq.accept(e) is not None
    last = seq.last_time_us
    # Instance B stamps the same events 5 ms earlier: overlap dropped by content, new ones restamped.
    shifted = [e.replace(str(time_us_of(e)).encode(), str(time_us_of(e) - 5_000).encode(), 1) for e in events]
    out = [seq.accept(e) for e in shifted[15:]]
    published = [o for o in out if o is not None]
    assert len(published) == 15 and seq.stats.duplicates == 10
    times = [t for _, t in published]
    # B's next 5 events are at or below our last: restamped by the origin clock (last + 1, ...);
    # from then on B's own stamps are above ours again and are kept.
    assert times == [last + 1 + i for i in range(5)] + [time_us_of(e) for e in shifted[30:]]
    for (raw, t), original in zip(published, events[25:]):
        assert time_us_of(raw) == t
        assert without_time_us(raw) == without_time_us(original)
    assert seq.stats.restamped == 5


def test_sequencer_restamps_when_the_upstream_clock_goes_backwards() -> None:
    gen = EventGenerator(3)
    seq = Sequencer(clock=OriginClock(now_us=lambda: 1_000))
    a = seq.accept(gen.make_event(2_000_000))
    b = seq.accept(gen.make_event(1_500_000))  # new event, earlier clock
    assert a is not None and b is not None
    assert a[1] == 2_000_000 and b[1] == 2_000_001 and time_us_of(b[0]) == 2_000_001
    c = seq.accept(gen.make_event(2_500_000))
    assert c is not None and c[1] == 2_500_000


def test_sequencer_drops_events_at_or_below_its_floor_and_resumes_from_it() -> None:
    events = make_events(10)
    floor = time_us_of(events[4])
    seq = Sequencer(rewind_us=1_000_000, floor_us=floor)
    assert seq.resume_cursor() == floor - 1_000_000
    seq.on_connect(seq.resume_cursor())
    assert [seq.accept(e) is not None for e in events] == [False] * 5 + [True] * 5
    assert seq.stats.before_start == 5 and seq.stats.restamped == 0


def test_a_rewound_replay_reaching_before_our_first_event_is_skipped_not_restamped() -> None:
    events = make_events(100, step_us=1000)
    seq = Sequencer(rewind_us=50_000)
    seq.on_connect(None)  # live: we join the upstream at events[40]
    for e in events[40:60]:
        assert seq.accept(e) is not None
    cursor = seq.resume_cursor()
    assert cursor == time_us_of(events[59]) - 50_000  # reaches back before events[40]
    seq.on_connect(cursor)
    replay = [e for e in events if time_us_of(e) >= cursor]
    published = [o for o in (seq.accept(e) for e in replay) if o is not None]
    assert [raw for raw, _ in published] == events[60:]
    assert (
        seq.stats.before_start == 31 and seq.stats.duplicates == 20
    )  # events[9:40], events[40:60] and seq.stats.restamped == 0


def test_drops_during_a_replay_do_not_walk_the_resume_point_back() -> None:
    events = make_events(100, step_us=1000)
    seq = Sequencer(rewind_us=20_000)
    for e in events[:80]:
        seq.accept(e)
    first_cursor = seq.resume_cursor()
    assert first_cursor is not None
    seq.on_connect(first_cursor)
    seq.accept(events[61])  # one replayed duplicate, then the connection drops
    assert seq.resume_cursor() == first_cursor


def test_sequencer_forgets_keys_older_than_its_window() -> None:
    seq = Sequencer(rewind_us=1_000)  # window = 2*rewind + 1 s
    for e in make_events(3000, step_us=1000):  # 3 s of events
        seq.accept(e)
    assert len(seq._keys) <= 1_003


def test_sequencer_strips_a_v2_cursor_field() -> None:
    seq = Sequencer()
    raw = (
        b'{"did":"did:plc:abcdefghijklmnopqrstuvwx","time_us":1725911162329500,"cursor":42,"kind":"identity",'
        b'"identity":{"did":"did:plc:abcdefghijklmnopqrstuvwx","seq":1,"time":"2024-09-05T06:11:04.870Z"}}'
    )
    out = seq.accept(raw)
    assert out is not None
    assert list(json.loads(out[0])) == ["did", "time_us", "kind", "identity"]


@pytest.mark.parametrize(
    "raw,problem",
    [
        (b"not json", "not valid JSON"),
        (b'{"time_us":1,"kind":"commit","commit":{}}', "no 'did'"),
        (b'{"did":"did:plc:x","kind":"commit","commit":{}}', "no 'time_us'"),
    ],
)
def test_sequencer_counts_and_drops_invalid_events(raw: bytes, problem: str) -> None:
    stats = IngestStats()
    seq = Sequencer(stats=stats)
    assert seq.accept(raw) is None
    assert stats.invalid == 1 and problem in stats.last_error


def test_origin_clock_is_strictly_increasing_even_when_the_wall_clock_stalls() -> None:
    clock = OriginClock(now_us=lambda: 5)
    assert [clock.next() for _ in range(3)] == [5, 6, 7]
    clock.observe(100)
    assert clock.next() == 101


# -- configuration errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "url,problem",
    [
        ("http://example.com/subscribe", "must start with ws:// or wss://"),
        ("jetstream1.us-east.bsky.network", "must start with ws:// or wss://"),
        ("ws:///subscribe", "has no host"),
        ("ws://host:99999/subscribe", "not a valid URL"),
        ("ws://host/subscribe#x", "fragment"),
    ],
)
def test_bad_upstream_urls_are_rejected_naming_the_problem(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check_upstream_url(url)


def test_upstream_url_defaults_to_subscribe_and_keeps_filters() -> None:
    assert (
        check_upstream_url("wss://jetstream2.us-west.bsky.network") == "wss://jetstream2.us-west.bsky.network/subscribe"
    )
    url = check_upstream_url("ws://h:1/subscribe?wantedCollections=app.bsky.graph.*&cursor=5&compress=true")
    assert with_cursor(url, 99) == "ws://h:1/subscribe?wantedCollections=app.bsky.graph.*&cursor=99"
    assert with_cursor(url, None) == "ws://h:1/subscribe?wantedCollections=app.bsky.graph.*"


@pytest.mark.parametrize("rate", [-1, float("nan"), float("inf")])
def test_bad_rates_are_rejected(rate: float) -> None:
    with pytest.raises(ValueError, match="rate="):
        check_rate(rate)
    with pytest.raises(ValueError, match="rate="):
        GeneratorSource(EventGenerator(), rate)


# -- into a real stream ----------------------------------------------------------------------


def test_generator_ingest_publishes_exactly_its_events_with_time_us_as_reserved_value() -> None:
    with driver_process() as driver:
        reader = StreamReader(driver.dir, CHANNEL, 1001)
        try:
            with Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=3_000_000_000)) as aeron:
                pub = aeron.add_exclusive_publication(CHANNEL, 1001)
                clock = OriginClock()
                ingest = Ingest(pub, GeneratorSource(EventGenerator(11), 0, count=3000, clock=clock))
                ingest.start()
                assert ingest.join(30), "generator did not finish"
                assert ingest.error is None
                messages = reader.wait_for(3000)
                time.sleep(0.05)  # the thing under test: nothing more may come
                assert len(messages) == 3000
                times = [t for _, t in messages]
                assert all(a < b for a, b in zip(times, times[1:]))
                assert [time_us_of(raw) for raw, _ in messages] == times
                # Exactly the generator's bytes for those timestamps (same seed, same stamps).
                again = EventGenerator(11)
                assert [raw for raw, _ in messages] == [again.make_event(t) for t in times]
                assert ingest.stats.published == 3000 and ingest.stats.last_time_us == times[-1]
                pub.close()
        finally:
            reader.close()


def test_back_pressure_delays_the_ingest_without_dropping() -> None:
    # 64 KiB terms: the window is 32 KiB, ~70 events; the reader pauses, the ingest must wait.
    args = quick_timeout_args("64k")
    with driver_process(args) as driver:
        reader = StreamReader(driver.dir, CHANNEL, 1002)
        try:
            with Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=3_000_000_000)) as aeron:
                pub = aeron.add_exclusive_publication(CHANNEL, 1002)
                wait_until(lambda: pub.is_connected, 10, "publication connected")
                reader.paused.set()
                ingest = Ingest(pub, GeneratorSource(EventGenerator(5), 0, count=2000))
                ingest.start()
                wait_until(lambda: ingest.stats.back_pressured > 0, 10, "back pressure")
                time.sleep(0.2)  # the thing under test: back-pressured, the ingest stays back (does not drop)
                assert ingest.stats.published < 2000
                reader.paused.clear()
                assert ingest.join(30) and ingest.error is None
                messages = reader.wait_for(2000)
                assert len(messages) == 2000 and ingest.stats.oversized == 0
                times = [t for _, t in messages]
                assert all(a < b for a, b in zip(times, times[1:]))
                pub.close()
        finally:
            reader.close()


def _follow(driver_dir: str, stream_id: int, url: str, rewind_us: int) -> tuple[Aeron, Ingest]:
    aeron = Aeron.connect(Context(dir=driver_dir, driver_timeout_ns=3_000_000_000))
    pub = aeron.add_exclusive_publication(CHANNEL, stream_id)
    source = UpstreamSource(
        url, Sequencer(rewind_us=rewind_us), backoff_initial_ns=50_000_000, backoff_max_ns=200_000_000
    )
    ingest = Ingest(pub, source)
    ingest.start()
    return aeron, ingest


def test_upstream_drops_and_comes_back_without_losing_or_repeating_events() -> None:
    events = make_events(4000, step_us=1000)  # 4 s of upstream time, served at 4000/s
    upstream = UpstreamStandIn(events, rate=4000).start()
    with driver_process() as driver:
        reader = StreamReader(driver.dir, CHANNEL, 1003)
        aeron, ingest = _follow(driver.dir, 1003, upstream.url, rewind_us=300_000)
        try:
            wait_until(lambda: len(reader.messages) >= 1500, 20, "first half")
            upstream.kill()  # mid-stream, no close frame
            wait_until(lambda: ingest.stats.disconnects >= 1, 10, "the ingest to notice")
            time.sleep(0.3)  # a few failed reconnects (connection refused) while it is down
            upstream = UpstreamStandIn(events, rate=4000, port=upstream.port).start()
            messages = reader.wait_for(len(events), 30)
            time.sleep(0.2)  # anything extra (a repeat) would arrive now
            assert len(reader.messages) == len(events)
            assert [raw for raw, _ in messages] == events  # every event once, in order, bytes as sent
            assert [t for _, t in messages] == [time_us_of(e) for e in events]
            stats = ingest.stats
            assert stats.connections == 2 and stats.duplicates > 0 and stats.restamped == 0
            resumed_at = [r for r in upstream.requests if "cursor=" in r]
            assert len(resumed_at) == 1
            cursor = int(resumed_at[0].rsplit("cursor=", 1)[1])
            assert cursor + 300_000 in {time_us_of(e) for e in events[1500:]}  # last seen − rewind
        finally:
            ingest.stop()
            aeron.close()
            reader.close()
            upstream.kill()


def test_failover_to_an_instance_with_an_earlier_clock_keeps_time_us_strictly_increasing() -> None:
    events = make_events(3000, step_us=1000)
    # Instance B stamped the same events 100 ms earlier (a different clock).
    shifted = [e.replace(str(time_us_of(e)).encode(), str(time_us_of(e) - 100_000).encode(), 1) for e in events]
    upstream = UpstreamStandIn(events, rate=4000).start()
    with driver_process() as driver:
        reader = StreamReader(driver.dir, CHANNEL, 1004)
        aeron, ingest = _follow(driver.dir, 1004, upstream.url, rewind_us=400_000)
        try:
            wait_until(lambda: len(reader.messages) >= 1000, 20, "first part")
            upstream.kill()
            upstream = UpstreamStandIn(shifted, rate=4000, port=upstream.port).start()
            messages = reader.wait_for(len(events), 30)
            time.sleep(0.2)  # the thing under test: nothing more may come (no repeat after the reconnect)
            assert len(reader.messages) == len(events)
            assert [without_time_us(raw) for raw, _ in messages] == [without_time_us(e) for e in events]
            times = [t for _, t in messages]
            assert all(a < b for a, b in zip(times, times[1:]))
            assert [time_us_of(raw) for raw, _ in messages] == times
            assert ingest.stats.restamped > 0
        finally:
            ingest.stop()
            aeron.close()
            reader.close()
            upstream.kill()


def test_an_upstream_refusing_the_subscription_with_4xx_ends_the_ingest_naming_the_answer() -> None:
    upstream = UpstreamStandIn(make_events(5)).start()
    try:
        source = UpstreamSource(
            f"ws://127.0.0.1:{upstream.port}/wrong-path", Sequencer(), backoff_initial_ns=50_000_000
        )

        class NoPublication:  # never offered to: the subscription is refused first
            max_message_length = 1 << 20

            def offer(self, buffer: bytes, reserved_value: int = 0) -> int:
                raise AssertionError("nothing to publish")

        ingest = Ingest(NoPublication(), source)
        ingest.start()
        assert ingest.join(10)
        assert ingest.error is not None
        assert "refused the subscription: HTTP 404" in str(ingest.error)
        assert "/wrong-path" in str(ingest.error)
    finally:
        upstream.kill()


def test_an_event_longer_than_the_streams_largest_message_is_counted_and_skipped() -> None:
    events = make_events(20)
    big_time = (time_us_of(events[9]) + time_us_of(events[10])) // 2
    big = big_event(big_time, 10_000)
    upstream = UpstreamStandIn(events[:10] + [big] + events[10:]).start()
    args = quick_timeout_args("64k")  # largest message 8 KiB
    with driver_process(args) as driver:
        reader = StreamReader(driver.dir, CHANNEL, 1005)
        aeron, ingest = _follow(driver.dir, 1005, upstream.url, rewind_us=0)
        try:
            reader.wait_for(20, 20)
            time.sleep(0.1)  # the thing under test: nothing more may come (the oversized event is dropped)
            assert [raw for raw, _ in reader.messages] == events
            assert ingest.stats.oversized == 1 and ingest.stats.published == 20
        finally:
            ingest.stop()
            aeron.close()
            reader.close()
            upstream.kill()
