"""The read side: EventStreamAdapter polls a real stream (through a real driver process) and
appends parsed events in strictly increasing time_us, reassembling large events."""

from __future__ import annotations

from logbuf.client import Aeron, Context, OfferResult
from logbuf.jetstream.events import EventMeta
from logbuf.jetstream.generator import EventGenerator
from logbuf.jetstream.ingest import GeneratorSource, Ingest, OriginClock
from logbuf.jetstream.stream import EventStreamAdapter
from logbuf.testing import wait_until
from tests.jetstream._ingest_support import big_event, driver_process, time_us_of

CHANNEL = "aeron:ipc"


def offer_all(pub: object, messages: list[tuple[bytes, int]]) -> None:
    for raw, reserved in messages:

        def taken() -> bool:
            result = pub.offer(raw, reserved)  # type: ignore[attr-defined]
            assert result > 0 or result in (
                OfferResult.BACK_PRESSURED,
                OfferResult.NOT_CONNECTED,
                OfferResult.ADMIN_ACTION,
            )
            return bool(result > 0)

        wait_until(taken, 10, "the offer")


def test_adapter_appends_ingested_events_in_order_including_fragmented_ones() -> None:
    with driver_process() as driver, Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=3_000_000_000)) as aeron:
        sub = aeron.add_subscription(CHANNEL, 1201)
        appended: list[tuple[bytes, EventMeta]] = []
        adapter = EventStreamAdapter(sub, lambda raw, meta: appended.append((raw, meta)))
        pub = aeron.add_exclusive_publication(CHANNEL, 1201)
        ingest = Ingest(pub, GeneratorSource(EventGenerator(9), 0, count=1500, clock=OriginClock()))
        ingest.start()
        # The adapter runs here (as the server loop would) while the ingest publishes.
        wait_until(lambda: adapter.do_work() >= 0 and not ingest.is_running, 30, "the generator to finish")
        assert ingest.error is None
        # Plus one ~100 KB event (≈ 73 fragments at MTU 1408; 1 MiB terms carry up to 128 KiB), stamped after the generator's last.
        big_time = ingest.stats.last_time_us + 1
        big = big_event(big_time, 100_000)
        offer_all(pub, [(big, big_time)])
        wait_until(lambda: adapter.do_work() >= 0 and len(appended) >= 1501, 20, "1501 events appended")
        times = [meta.time_us for _, meta in appended]
        assert all(a < b for a, b in zip(times, times[1:]))
        assert [time_us_of(raw) for raw, _ in appended] == times
        assert appended[-1][0] == big and appended[-1][1].collection == "app.bsky.feed.post"
        assert sum(len(raw) > 1376 for raw, _ in appended) > 1  # fragmented events were reassembled
        assert adapter.stats.appended == 1501 and adapter.stats.reserved_value_mismatch == 0
        pub.close()


def test_adapter_skips_stale_and_invalid_messages_and_counts_them() -> None:
    gen = EventGenerator(2)
    with driver_process() as driver, Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=3_000_000_000)) as aeron:
        sub = aeron.add_subscription(CHANNEL, 1202)
        appended: list[int] = []
        adapter = EventStreamAdapter(sub, lambda raw, meta: appended.append(meta.time_us), after_us=1_000)
        pub = aeron.add_exclusive_publication(CHANNEL, 1202)
        wait_until(lambda: pub.is_connected, 10, "publication connected")
        offer_all(
            pub,
            [
                (gen.make_event(999), 999),  # at or below after_us: already held
                (gen.make_event(2_000), 2_000),
                (b"garbage", 0),  # not an event
                (gen.make_event(1_500), 1_500),  # behind the last appended
                (gen.make_event(3_000), 7),
            ],
        )  # reserved value disagrees: JSON wins, counted
        wait_until(
            lambda: (
                adapter.do_work() >= 0
                and adapter.stats.appended + adapter.stats.invalid + adapter.stats.out_of_order >= 5
            ),
            10,
            "five messages handled",
        )
        assert appended == [2_000, 3_000]
        assert adapter.stats.invalid == 1 and "not valid JSON" in adapter.stats.last_error
        assert adapter.stats.out_of_order == 2 and adapter.stats.reserved_value_mismatch == 1
        pub.close()
