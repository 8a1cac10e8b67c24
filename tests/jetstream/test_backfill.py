"""The relay survives a restart when it records (``logbuf-jetstream --record DIR``).

Real things throughout: a media driver and a recorder writing a real archive for the reader tests;
real ``logbuf-jetstream`` processes (generator, ``--record``) stopped with SIGTERM and SIGKILL and
started again on the same archive, with real ``websockets`` clients on 127.0.0.1 for the system test.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from logbuf.archive.catalog import Catalog
from logbuf.archive.recorder import Recorder, RecorderContext
from logbuf.client import Aeron, Context
from logbuf.jetstream.backfill import (
    BackfillResult,
    _messages_frames,
    backfill,
    matching_recordings,
    newest_recorded_time_us,
    recorded_events,
)
from logbuf.jetstream.events import EventMeta
from logbuf.jetstream.generator import EventGenerator
from logbuf.testing import wait_until
from tests.archive.conftest import publish
from tests.jetstream._ingest_support import (
    RelayProcess,
    UpstreamStandIn,
    big_event,
    driver_process,
    make_events,
    read_events,
    time_us_of,
    unique_driver_dir,
)

STREAM_ID = 6101
CHANNEL = "aeron:ipc"


@pytest.fixture(scope="module")
def recorded() -> Iterator[tuple[str, list[bytes]]]:
    """An archive of one stream: generator events with large (fragmented) ones among them, over several
    terms and segment files (1 MiB terms), plus a non-increasing event and a message that is not an event.
    Yields (archive dir, the events a backfill must return, in order)."""
    import tempfile

    archive_dir = tempfile.mkdtemp(prefix="logbuf-backfill-test-")
    gen = EventGenerator(3)
    t0 = time.time_ns() // 1000 - 600_000_000  # ten minutes ago
    payloads: list[bytes] = []
    expected: list[bytes] = []
    for i in range(6000):
        t = t0 + i * 1000
        raw = big_event(t, 20_000 + 37 * i % 5000) if i % 97 == 5 else gen.make_event(t)
        payloads.append(raw)
        expected.append(raw)
        if i == 3000:
            payloads.append(gen.make_event(t))  # same time_us again: skipped
            payloads.append(b"not an event")  # skipped
    with driver_process() as driver:
        recorder = Recorder(
            RecorderContext(
                archive_dir=archive_dir,
                channel=CHANNEL,
                stream_id=STREAM_ID,
                driver_dir=driver.dir,
                segment_length=1 << 20,
            )
        )
        thread = threading.Thread(target=recorder.run, daemon=True)
        thread.start()
        aeron = Aeron.connect(Context(dir=driver.dir))
        try:
            pub = aeron.add_exclusive_publication(CHANNEL, STREAM_ID)
            wait_until(lambda: pub.is_connected, 10, "the recorder to subscribe")
            _, ends = publish(pub, payloads)

            def recorded_all() -> bool:
                with Catalog.open(archive_dir) as catalog:
                    return any(d.stop_position >= ends[-1] for d in catalog.recordings())

            wait_until(recorded_all, 20, "the recorder to write everything")
            pub.close()
        finally:
            recorder.stop()
            thread.join(10)
            aeron.close()
    assert ends[-1] > 4 * (1 << 20), "the recording spans several terms and segments"
    yield archive_dir, expected
    import shutil

    shutil.rmtree(archive_dir, ignore_errors=True)


def collect(
    archive_dir: str, retention_ns: int | None, stream_id: int = STREAM_ID
) -> tuple[list[bytes], BackfillResult]:
    got: list[bytes] = []
    metas: list[EventMeta] = []

    def append(raw: bytes, meta: EventMeta) -> None:
        got.append(raw)
        metas.append(meta)

    result = backfill(archive_dir, CHANNEL, stream_id, append, retention_ns=retention_ns)
    assert all(a.time_us < b.time_us for a, b in zip(metas, metas[1:]))
    return got, result


def test_backfill_returns_every_recorded_event_whole_and_in_order(recorded: tuple[str, list[bytes]]) -> None:
    archive_dir, expected = recorded
    got, result = collect(archive_dir, retention_ns=None)
    assert got == expected  # fragmented events come back whole; byte for byte
    assert result.events == len(expected) and result.non_increasing == 1 and result.invalid == 1
    assert result.corrupt_regions == 0 and result.reader == "numpy"
    assert result.first_time_us == time_us_of(expected[0]) and result.last_time_us == time_us_of(expected[-1])
    assert newest_recorded_time_us(archive_dir, CHANNEL, STREAM_ID) == result.last_time_us
    assert collect(archive_dir, None, stream_id=STREAM_ID + 1)[0] == []  # another stream: nothing


def test_backfill_reads_only_the_retention_window(recorded: tuple[str, list[bytes]]) -> None:
    archive_dir, expected = recorded
    last = time_us_of(expected[-1])
    for retention_ns in (500_000_000, 2_200_000_000, 4_000_000_000):
        got, result = collect(archive_dir, retention_ns)
        cutoff = last - retention_ns // 1_000
        assert got == [e for e in expected if time_us_of(e) >= cutoff]  # nothing lost by skipping terms
        assert result.cutoff_us == cutoff


def test_frame_by_frame_reader_gives_the_same_messages(recorded: tuple[str, list[bytes]]) -> None:
    """Without pyarrow the backfill reads with archive.dump's frame walker: same messages."""
    archive_dir, _ = recorded
    (d,) = matching_recordings(archive_dir, CHANNEL, STREAM_ID)
    fast = list(recorded_events(archive_dir, d))
    problems: list[str] = []
    slow = list(_messages_frames(archive_dir, d, d.start_position, lambda p, r, e: problems.append(r)))
    assert slow == fast and not problems
    middle = d.start_position + 2 * d.term_length  # a term start, as the backfill starts reading
    assert list(recorded_events(archive_dir, d, middle)) == list(_messages_frames(archive_dir, d, middle, print))


def test_the_relay_serves_while_a_background_backfill_loads(recorded: tuple[str, list[bytes]], tmp_path: Any) -> None:
    """The relay listens at once; the recorded events are loaded by BackgroundBackfill on its loop. A
    replaying client gets every recorded event in order, compressed ones too, and a live client waits for
    the end of the backfill and then gets only what comes after it."""
    import zstandard

    from logbuf.jetstream import BUNDLED_ZSTD_DICTIONARY
    from logbuf.jetstream.backfill import BackgroundBackfill, plan_backfill
    from logbuf.jetstream.events import parse_event
    from tests.jetstream._relay_support import assert_silent, recv_raw, running_relay

    archive_dir, expected = recorded
    with running_relay(str(tmp_path), retention_ns=None, retention_bytes=1 << 30, max_events_per_ip_s=0) as relay:
        server = relay.server
        plan = plan_backfill(archive_dir, CHANNEL, STREAM_ID, retention_ns=None)
        assert plan.newest_us == time_us_of(expected[-1])
        background = BackgroundBackfill(plan, server.append, server.end_backfill, server.store.make_compressor())

        def begin() -> None:
            server.begin_backfill()
            server.add_duty(background)

        relay.on_loop(begin)
        with relay.connect() as live:  # no cursor: live, so it waits for the end of the history
            background.start()
            with relay.connect({"cursor": 0}) as replay, relay.connect({"cursor": 0, "compress": "true"}) as packed:
                assert [m.encode() for m in recv_raw(replay, len(expected), 60)] == expected  # type: ignore[union-attr]
                frames = recv_raw(packed, len(expected), 60)
            wait_until(lambda: background.done, 30, "the backfill to finish")
            assert not server.backfilling and background.error is None
            assert background.result.events == len(expected)
            assert_silent(live, 0.3)  # the history is not for a live client
            newer = make_events(3, start_us=time_us_of(expected[-1]) + 1000)
            relay.append(newer)
            assert [m.encode() for m in recv_raw(live, 3)] == newer  # type: ignore[union-attr]
    with open(BUNDLED_ZSTD_DICTIONARY, "rb") as f:
        decompressor = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(f.read()))
    assert [decompressor.decompress(frame) for frame in frames[:50]] == expected[:50]  # type: ignore[arg-type]
    assert parse_event(decompressor.decompress(frames[-1])).time_us == time_us_of(expected[-1])  # type: ignore[arg-type]


def test_during_a_backfill_loaded_cursors_start_and_the_others_wait(tmp_path: Any) -> None:
    """Appends during a backfill are all newer than what is loaded, so a cursor inside the loaded range
    can start at once; a later cursor (or live) waits for the end, then starts where it asked."""
    from tests.jetstream._relay_support import BASE_US, assert_silent, recv_events, running_relay

    events = make_events(300, start_us=BASE_US)
    t = [time_us_of(e) for e in events]
    with running_relay(str(tmp_path)) as relay:
        relay.on_loop(relay.server.begin_backfill)
        relay.append(events[:100])
        with (
            relay.connect({"cursor": t[10]}) as loaded,
            relay.connect({"cursor": t[150]}) as later,
            relay.connect() as live,
            relay.connect({"requireHello": "true", "cursor": t[160]}) as hello,
        ):
            assert [e["time_us"] for e in recv_events(loaded, 90)] == t[10:100]
            hello.send(json.dumps({"type": "options_update", "payload": {}}))
            relay.append(events[100:200])
            assert [e["time_us"] for e in recv_events(loaded, 100)] == t[100:200]
            for ws in (later, live, hello):
                assert_silent(ws, 0.2)
            relay.on_loop(relay.server.end_backfill)
            assert [e["time_us"] for e in recv_events(later, 50)] == t[150:200]
            assert [e["time_us"] for e in recv_events(hello, 40)] == t[160:200]
            assert_silent(live, 0.2)
            relay.append(events[200:])
            for ws, first in ((loaded, 200), (later, 200), (live, 200), (hello, 200)):
                assert [e["time_us"] for e in recv_events(ws, 100)] == t[first:]


def test_no_archive_yet_is_an_empty_backfill(tmp_path: Any) -> None:
    got, result = collect(str(tmp_path / "none"), retention_ns=3_600_000_000_000)
    assert got == [] and result.last_time_us == 0 and result.recordings == 0


# -- the relay process ----------------------------------------------------------------------------------


def _metrics(relay: RelayProcess) -> dict[str, float]:
    url = relay.wait_for_log("jetstream.listening")["metrics_url"]
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - the relay's metrics listener
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _start(base: str, record: str) -> RelayProcess:
    return RelayProcess(
        [
            "--driver-dir",
            unique_driver_dir(),
            "--port",
            "0",
            "--rate",
            "1000",
            "--record",
            record,
            "--data-dir",
            os.path.join(base, "frames"),
        ]
    )


async def _read_until_closed(url: str, events: list[bytes], timeout_s: float = 20.0) -> None:
    """Read events into ``events`` until the relay closes the connection (or goes away)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async with asyncio.timeout(timeout_s):
        async with connect(url, compression=None, max_size=None, max_queue=None) as ws:
            try:
                while True:
                    message = await ws.recv()
                    events.append(message.encode() if isinstance(message, str) else message)
            except ConnectionClosed:
                pass


def _check_strictly_increasing(events: list[bytes]) -> None:
    times = [time_us_of(e) for e in events]
    assert all(a < b for a, b in zip(times, times[1:])), "time_us strictly increasing"
    assert len(set(events)) == len(events), "no duplicates"


def test_relay_restarts_from_its_recording_after_sigterm_and_sigkill(tmp_path: Any) -> None:
    base = str(tmp_path)
    record = os.path.join(base, "archive")
    relays: list[RelayProcess] = []
    try:
        # 1. First run: a client follows it from the start until SIGTERM closes it.
        first = _start(base, record)
        relays.append(first)
        port = first.port()
        seen_first: list[bytes] = []
        reader = threading.Thread(
            target=lambda: asyncio.run(_read_until_closed(f"ws://127.0.0.1:{port}/subscribe?cursor=1", seen_first)),
            daemon=True,
        )
        reader.start()
        wait_until(lambda: len(seen_first) >= 800, 15, "800 events from the first run")
        assert first.stop() == 0
        reader.join(10)
        published = next(e for e in first.log if e.get("event") == "jetstream.ingest_stats")
        assert published["published"] >= len(seen_first)

        # 2. Second run on the same archive: everything the first published is there again, before live.
        second = _start(base, record)
        relays.append(second)
        port = second.port()
        filled = second.wait_for_log("jetstream.backfilled")
        order = [e.get("event") for e in second.log]
        assert order.index("jetstream.listening") < order.index("jetstream.backfilled")  # listens at once
        assert filled["events"] == published["published"]  # the recorder drained the stream at SIGTERM
        assert filled["last_time_us"] == published["last_time_us"]
        assert second.wait_for_log("jetstream.started")["floor_us"] == filled["last_time_us"]
        cursor = time_us_of(seen_first[100])
        until = time.time_ns() // 1000 + 300_000  # 0.3 s into the second run's own events
        seen = asyncio.run(read_events(f"ws://127.0.0.1:{port}/subscribe?cursor={cursor}", until_time_us=until))
        _check_strictly_increasing(seen)
        recorded_part = [e for e in seen if time_us_of(e) <= filled["last_time_us"]]
        assert recorded_part[: len(seen_first) - 100] == seen_first[100:]  # exactly what clients saw, no gap
        assert len(recorded_part) == published["published"] - 100  # and the rest the first run published
        assert len(seen) > len(recorded_part) + 100  # then live events from the second run

        # 3. kill -9 the second run while a client follows it; a third run serves the recorded part.
        seen_second: list[bytes] = []
        reader = threading.Thread(
            target=lambda: asyncio.run(_read_until_closed(f"ws://127.0.0.1:{port}/subscribe?cursor=1", seen_second)),
            daemon=True,
        )
        reader.start()
        wait_until(lambda: len(seen_second) >= published["published"] + 500, 15, "events of the second run")
        second.proc.kill()
        second.proc.wait(10)
        reader.join(10)
        third = _start(base, record)
        relays.append(third)
        port = third.port()
        refilled = third.wait_for_log("jetstream.backfilled")
        floor = refilled["last_time_us"]
        with Catalog.open(record) as catalog:
            killed = catalog.recordings()[1]
        assert killed.interrupted and killed.stop_position > 0  # closed at its valid prefix, then read
        assert floor > filled["last_time_us"] + 300_000  # the killed run's recording (recovered) counts
        everything = asyncio.run(
            read_events(f"ws://127.0.0.1:{port}/subscribe?cursor=1", until_time_us=time.time_ns() // 1000 + 200_000)
        )
        _check_strictly_increasing(everything)
        old = [e for e in everything if time_us_of(e) <= floor]
        assert len(old) == refilled["events"]
        assert old[: len(recorded_part) + 100][-len(recorded_part) :] == recorded_part  # the first run's, unchanged
        before_kill = [e for e in seen_second if time_us_of(e) <= floor]
        assert old[: len(before_kill)] == before_kill  # all the killed run served up to what was recorded
        assert [time_us_of(e) for e in everything if time_us_of(e) > floor][0] > floor  # live resumes above

        # 4. /metrics: the ingest's and the backfill's counters beside jetstream's own names.
        metrics = _metrics(third)
        assert metrics["logbuf_jetstream_backfill_events_total"] == refilled["events"]
        assert metrics["logbuf_jetstream_backfill_last_time_us"] == floor
        assert metrics["logbuf_jetstream_ingest_published_total"] > 0
        assert metrics["logbuf_jetstream_ingest_received_total"] >= metrics["logbuf_jetstream_ingest_published_total"]
        for name in ("duplicates", "restamped", "invalid"):
            assert metrics[f"logbuf_jetstream_ingest_{name}_total"] == 0
        assert metrics["logbuf_jetstream_stream_appended_total"] > 0
        assert metrics["jetstream_events_emitted_total"] >= refilled["events"]
        assert third.stop() == 0
    finally:
        for relay in relays:
            relay.kill()


def test_upstream_ingest_resumes_from_the_recording_after_a_restart(tmp_path: Any) -> None:
    """Following an upstream: the restarted relay asks for ``newest recorded − rewind`` and drops the overlap,
    so its stream holds the upstream's events exactly once, across the restart."""
    base = str(tmp_path)
    record = os.path.join(base, "archive")
    events = make_events(3000, start_us=time.time_ns() // 1000 - 60_000_000)
    upstream = UpstreamStandIn(events, rate=2000).start()
    relays: list[RelayProcess] = []

    def start() -> RelayProcess:
        relay = RelayProcess(
            [
                "--driver-dir",
                unique_driver_dir(),
                "--port",
                "0",
                "--upstream",
                upstream.url,
                "--rewind",
                "1s",
                "--record",
                record,
                "--data-dir",
                os.path.join(base, "frames"),
            ]
        )
        relays.append(relay)
        return relay

    try:
        first = start()
        port = first.port()
        asyncio.run(read_events(f"ws://127.0.0.1:{port}/subscribe?cursor=1", until_time_us=0, count=1000))
        assert first.stop() == 0
        stats = next(e for e in first.log if e.get("event") == "jetstream.ingest_stats")
        assert 1000 <= stats["published"] < len(events)
        second = start()
        port = second.port()
        filled = second.wait_for_log("jetstream.backfilled")
        assert filled["events"] == stats["published"] and filled["last_time_us"] == stats["last_time_us"]
        resumed = second.wait_for_log("upstream.connected")
        assert resumed["cursor"] == stats["last_time_us"] - 1_000_000
        got = asyncio.run(
            read_events(f"ws://127.0.0.1:{port}/subscribe?cursor=1", until_time_us=time_us_of(events[-1]))
        )
        assert got == events  # every upstream event once, in order, byte for byte, across the restart
        metrics = _metrics(second)
        assert metrics["logbuf_jetstream_ingest_before_start_total"] > 0  # the rewound overlap was dropped
        assert metrics["logbuf_jetstream_ingest_restamped_total"] == 0
        assert metrics["logbuf_jetstream_ingest_published_total"] == len(events) - stats["published"]
        assert second.stop() == 0
    finally:
        for relay in relays:
            relay.kill()
        upstream.kill()
