"""Relay system tests: cursors (replay, inclusive, future, too old), replay-to-live cutover, requireHello,
compression. Real ``websockets`` clients on 127.0.0.1 against a relay running in a thread."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import zstandard

from logbuf.testing import wait_until
from tests.jetstream._relay_support import (
    BASE_US,
    DID_A,
    assert_silent,
    make_events,
    need_dictionary,
    recv_events,
    recv_raw,
    running_relay,
    time_us_of,
)

STEP_US = 1000


def us(i: int) -> int:
    return BASE_US + i * STEP_US


def test_replay_from_a_cursor_then_live_without_gap_or_duplicate(tmp_path: Path) -> None:
    total, first_live, cursor_index = 3000, 300, 100
    events = make_events(total, step_us=STEP_US)
    with running_relay(str(tmp_path), flush_interval_ns=2_000_000) as relay:
        relay.append(events[:first_live])
        stop = threading.Event()

        def feed() -> None:  # live events keep coming while the client replays
            for i in range(first_live, total, 20):
                if stop.is_set():
                    return
                relay.append(events[i : i + 20])
                time.sleep(0.002)  # pace: a live feed's rate, 20 events per 2 ms

        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            with relay.connect({"cursor": us(cursor_index)}) as ws:
                got = [e["time_us"] for e in recv_events(ws, total - cursor_index, timeout_s=30)]
                assert_silent(ws, 0.2)
        finally:
            stop.set()
            feeder.join(10)
    assert got == [us(i) for i in range(cursor_index, total)]


def test_cursor_is_inclusive_and_future_or_absent_means_live(tmp_path: Path) -> None:
    events = make_events(20, step_us=STEP_US)
    with running_relay(str(tmp_path)) as relay:
        relay.append(events[:10])
        with (
            relay.connect({"cursor": us(4)}) as inclusive,
            relay.connect() as live,
            relay.connect({"cursor": us(10**6)}) as future,
        ):
            assert [e["time_us"] for e in recv_events(inclusive, 6)] == [us(i) for i in range(4, 10)]
            assert_silent(live, 0.2)
            assert_silent(future, 0.05)
            relay.append(events[10:])
            for ws in (inclusive, live, future):
                assert [e["time_us"] for e in recv_events(ws, 10)] == [us(i) for i in range(10, 20)]


def test_cursor_zero_or_negative_replays_everything_retained(tmp_path: Path) -> None:
    events = make_events(15, step_us=STEP_US)
    with running_relay(str(tmp_path)) as relay:
        relay.append(events)
        for cursor in (0, -1):
            with relay.connect({"cursor": cursor}) as ws:
                assert [e["time_us"] for e in recv_events(ws, 15)] == [us(i) for i in range(15)]


def test_cursor_older_than_retention_starts_at_the_oldest_kept_event(tmp_path: Path) -> None:
    events = make_events(1000, step_us=STEP_US)  # 1 s of time_us
    with running_relay(str(tmp_path), retention_ns=200_000_000, retention_check_ns=20_000_000) as relay:
        relay.append(events)
        wait_until(lambda: relay.on_loop(lambda: relay.server.store.first_seq) > 0, what="retention")
        oldest = relay.on_loop(relay.server.store.oldest_time_us)
        assert oldest == us(999) - 200_000
        with relay.connect({"cursor": BASE_US}) as ws:
            got = recv_events(ws, 201)
            assert got[0]["time_us"] == oldest and got[-1]["time_us"] == us(999)
            assert_silent(ws, 0.1)


def test_require_hello_holds_everything_until_a_valid_options_update(tmp_path: Path) -> None:
    events = make_events(30, step_us=STEP_US)
    with running_relay(str(tmp_path)) as relay:
        relay.append(events[:10])
        with (
            relay.connect({"requireHello": "true", "cursor": us(5)}) as held,
            relay.connect({"requireHello": "true"}) as held_live,
            relay.connect({"requireHello": "True"}) as not_held,
        ):
            relay.append(events[10:20])
            assert len(recv_events(not_held, 10)) == 10  # only the exact string "true" holds
            assert_silent(held, 0.3)
            assert_silent(held_live, 0.01)
            held.send(json.dumps({"type": "options_update", "payload": {"wantedDids": [], "wantedCollections": []}}))
            assert [e["time_us"] for e in recv_events(held, 15)] == [us(i) for i in range(5, 20)]
            held_live.send(json.dumps({"type": "options_update", "payload": {}}))
            wait_until(lambda: relay.server.counters.options_updates == 2, what="both hellos")
            assert_silent(held_live, 0.1)  # no cursor: live from the hello on
            relay.append(events[20:])
            assert [e["time_us"] for e in recv_events(held_live, 10)] == [us(i) for i in range(20, 30)]


def test_require_hello_with_a_filter_in_the_hello(tmp_path: Path) -> None:
    events = make_events(200, step_us=STEP_US)
    with running_relay(str(tmp_path)) as relay:
        relay.append(events)
        expected = [e for e in events if json.loads(e)["did"] == json.loads(events[3])["did"]]
        with relay.connect({"requireHello": "true", "cursor": 0}) as ws:
            ws.send(json.dumps({"type": "options_update", "payload": {"wantedDids": [json.loads(events[3])["did"]]}}))
            got = recv_events(ws, len(expected))
            assert [e["time_us"] for e in got] == [time_us_of(e) for e in expected]
            assert_silent(ws, 0.2)


def test_compressed_clients_get_zstd_frames_made_with_the_dictionary(tmp_path: Path) -> None:
    dictionary = need_dictionary()
    events = make_events(100, step_us=STEP_US)
    dctx = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(Path(dictionary).read_bytes()))
    with running_relay(str(tmp_path), zstd_dictionary=dictionary) as relay:
        relay.append(events[:50])
        with (
            relay.connect({"cursor": 0, "compress": "true"}) as zq,
            relay.connect({"cursor": 0}, additional_headers={"Socket-Encoding": "zstd"}) as zh,
            relay.connect({"cursor": 0, "compress": "yes"}) as plain,
        ):
            relay.append(events[50:])
            frames_q, frames_h = recv_raw(zq, 100), recv_raw(zh, 100)
            assert all(isinstance(f, bytes) for f in frames_q + frames_h)
            assert frames_q == frames_h  # compressed once: the same bytes for all
            assert [dctx.decompress(f) for f in frames_q] == events  # type: ignore[arg-type]
            texts = recv_raw(plain, 100)
            assert [t.encode() for t in texts] == events  # type: ignore[union-attr]
            compressed = sum(len(f) for f in frames_q)
            assert compressed < 0.7 * sum(len(e) for e in events)


def test_filtered_and_unfiltered_clients_switch_with_options_update(tmp_path: Path) -> None:
    events = make_events(400, step_us=STEP_US)
    with running_relay(str(tmp_path)) as relay:
        relay.append(events[:100])
        with relay.connect({"cursor": 0}) as ws:
            assert len(recv_events(ws, 100)) == 100
            ws.send(json.dumps({"type": "options_update", "payload": {"wantedDids": [DID_A]}}))
            wait_until(lambda: relay.server.counters.options_updates == 1, what="the update")
            relay.append(events[100:200])
            assert_silent(ws, 0.3)  # the generator never uses DID_A
            ws.send(json.dumps({"type": "options_update", "payload": {"wantedCollections": ["app.bsky.feed.like"]}}))
            wait_until(lambda: relay.server.counters.options_updates == 2, what="the second update")
            relay.append(events[200:300])
            likes = [
                e
                for e in events[200:300]
                if json.loads(e)["kind"] != "commit" or json.loads(e)["commit"]["collection"] == "app.bsky.feed.like"
            ]
            assert [e["time_us"] for e in recv_events(ws, len(likes))] == [time_us_of(e) for e in likes]
            ws.send(json.dumps({"type": "options_update", "payload": None}))  # everything again
            wait_until(lambda: relay.server.counters.options_updates == 3, what="the third update")
            relay.append(events[300:])
            assert [e["time_us"] for e in recv_events(ws, 100)] == [us(i) for i in range(300, 400)]
