"""Relay limits for the internet : per-address and total connection caps as settings,
client addresses from trusted proxies only, and jetstream's per-address event rate (a token bucket)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from logbuf.jetstream.generator import EventGenerator
from logbuf.jetstream.limits import EventRateLimiter, MessageBucket
from logbuf.jetstream.proxy import TrustedProxies, normalize_ip
from logbuf.testing import wait_until
from tests.jetstream._relay_support import BASE_US, WAIT_S, RelayHandle, make_events, recv_events, running_relay
from tests.jetstream.test_server_hardening import UPGRADE, client_frame, raw_connection, upgraded

# -- TrustedProxies ----------------------------------------------------------------------------------------

PROXIES = TrustedProxies(["127.0.0.1", "10.0.0.0/8", "fd00::/8"])

CLIENT_CASES = [
    # (peer, headers, client)
    ("203.0.113.9", [("X-Forwarded-For", "198.51.100.1")], "203.0.113.9"),  # untrusted peer: headers ignored
    ("127.0.0.1", [], "127.0.0.1"),  # a trusted proxy that forwards nothing: itself
    ("127.0.0.1", [("X-Forwarded-For", "198.51.100.1")], "198.51.100.1"),
    ("127.0.0.1", [("X-Forwarded-For", "198.51.100.66, 198.51.100.1, 10.1.2.3")], "198.51.100.1"),  # walk past ours
    ("127.0.0.1", [("X-Forwarded-For", "198.51.100.66"), ("X-Forwarded-For", "198.51.100.1")], "198.51.100.1"),
    ("127.0.0.1", [("X-Forwarded-For", "10.0.0.2, 10.0.0.3")], "10.0.0.2"),  # all trusted: the leftmost
    ("127.0.0.1", [("X-Forwarded-For", "unknown, 10.0.0.3")], "10.0.0.3"),  # garbage stops the walk
    ("127.0.0.1", [("X-Real-IP", "198.51.100.7")], "198.51.100.7"),
    ("127.0.0.1", [("X-Real-IP", "nope")], "127.0.0.1"),
    ("127.0.0.1", [("X-Forwarded-For", "198.51.100.1"), ("X-Real-IP", "198.51.100.7")], "198.51.100.1"),
    ("127.0.0.1", [("x-forwarded-for", "[2001:db8::1]:443")], "2001:db8::1"),  # port dropped
    ("127.0.0.1", [("X-Forwarded-For", "198.51.100.1:5000")], "198.51.100.1"),
    ("::ffff:127.0.0.1", [("X-Forwarded-For", "::ffff:198.51.100.1")], "198.51.100.1"),  # v4-mapped
    ("fd00::5", [("X-Forwarded-For", "2001:db8::2")], "2001:db8::2"),
]


@pytest.mark.parametrize("peer, headers, client", CLIENT_CASES)
def test_client_address_comes_from_trusted_proxies_only(peer: str, headers: list[tuple[str, str]], client: str) -> None:
    assert PROXIES.client_ip(peer, headers) == client


def test_bad_proxy_specs_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="trusted proxy 'nginx' is not an IP address or network"):
        TrustedProxies(["10.0.0.1", "nginx"])
    assert not TrustedProxies() and TrustedProxies(["::1"])
    assert normalize_ip("::ffff:10.0.0.1") == "10.0.0.1" and normalize_ip("not-an-ip") == "not-an-ip"


# -- EventRateLimiter ----------------------------------------------------------------------------------------


def test_rate_limiter_grants_the_burst_then_the_rate() -> None:
    limiter = EventRateLimiter(100)
    limiter.attach("a", 0)
    assert limiter.grant("a", 150, 0, pass_id=1) == 100  # the burst
    assert limiter.grant("a", 50, 0, pass_id=2) == 0
    assert limiter.grant("a", 50, 100_000_000, pass_id=3) == 10  # 0.1 s at 100/s
    assert limiter.grant("a", 500, 10_000_000_000, pass_id=4) == 100  # refilled, never past the burst
    assert limiter.throttled == 4
    assert limiter.grant("b", 1000, 0, pass_id=5) == 1000  # an address not attached is not limited


def test_rate_limiter_shares_an_address_fairly_within_a_pass() -> None:
    limiter = EventRateLimiter(90)
    for _ in range(3):
        limiter.attach("a", 0)
    limiter.attach("b", 0)
    assert [limiter.grant("a", 1000, 0, pass_id=1) for _ in range(3)] == [30, 30, 30]
    assert limiter.grant("b", 1000, 0, pass_id=1) == 90  # another address: its own bucket
    limiter.detach("b")
    assert len(limiter) == 1
    with pytest.raises(ValueError, match="events_per_s=0"):
        EventRateLimiter(0)


# -- MessageBucket ----------------------------------------------------------------------------------------


def test_message_bucket_grants_the_bursts_then_the_rates() -> None:
    bucket = MessageBucket(per_s=2, burst=3, bytes_per_s=1000, bytes_burst=5000, now_ns=0)
    assert [bucket.take(100, 0) for _ in range(4)] == [True, True, True, False]  # 3 messages at once
    assert bucket.take(100, 500_000_000)  # one more message after 0.5 s at 2/s
    assert not bucket.take(100, 500_000_000)
    bucket = MessageBucket(per_s=100, burst=100, bytes_per_s=1000, bytes_burst=5000, now_ns=0)
    assert bucket.take(5000, 0)  # the byte burst: one message of the largest size fits
    assert not bucket.take(1, 0)
    assert not bucket.take(600, 500_000_000)  # 500 bytes refilled: 600 do not fit, and nothing is spent
    assert bucket.take(500, 500_000_000)
    assert bucket.take(5000, 60_000_000_000) and not bucket.take(1, 60_000_000_000)  # refilled to the burst only
    with pytest.raises(ValueError, match="bytes_per_s=0"):
        MessageBucket(per_s=1, burst=1, bytes_per_s=0, bytes_burst=1, now_ns=0)


# -- the relay ----------------------------------------------------------------------------------------------


def connect_as(relay: RelayHandle, query: str = "", headers: dict[str, str] | None = None, source: str = "127.0.0.1"):  # type: ignore[no-untyped-def]
    sock = socket.create_connection((relay.host, relay.port), timeout=WAIT_S, source_address=(source, 0))
    return connect(relay.url(query), sock=sock, additional_headers=headers or {}, open_timeout=WAIT_S, close_timeout=2)


def refused(relay: RelayHandle, **kwargs: Any) -> int:
    with pytest.raises(InvalidStatus) as info:
        with connect_as(relay, **kwargs):
            pass
    return info.value.response.status_code


def test_caps_are_settings(tmp_path: Path) -> None:
    with running_relay(str(tmp_path), max_connections_per_ip=3, max_connections=4) as relay, ExitStack() as held:
        for _ in range(3):
            held.enter_context(connect_as(relay))
        assert refused(relay) == 429
        # the refused connection counts until the relay has seen it close
        wait_until(lambda: relay.on_loop(lambda: len(relay.server._connections)) == 3, what="the refused one gone")
        held.enter_context(connect_as(relay, source="127.0.0.2"))
        assert refused(relay, source="127.0.0.3") == 503


def test_behind_a_trusted_proxy_clients_are_counted_by_their_forwarded_address(tmp_path: Path) -> None:
    with running_relay(str(tmp_path), trusted_proxies=("127.0.0.1",), max_connections_per_ip=2) as relay:
        alice = {"X-Forwarded-For": "203.0.113.7"}
        with ExitStack() as stack:
            held = [stack.enter_context(connect_as(relay, headers=alice)) for _ in range(2)]
            assert refused(relay, headers=alice) == 429  # alice's third, although the proxy has more
            held.append(stack.enter_context(connect_as(relay, headers={"X-Real-IP": "203.0.113.8"})))  # bob
            # a peer that is not a trusted proxy cannot pick an address: it is counted as itself
            held.append(stack.enter_context(connect_as(relay, headers=alice, source="127.0.0.2")))
            relay.append(make_events(1))
            for ws in held:
                assert len(recv_events(ws, 1)) == 1
            text = relay.request("/metrics", metrics=True)[2].decode()
            for ip, count in (("203.0.113.7", 2), ("203.0.113.8", 1), ("127.0.0.2", 1)):
                assert f'jetstream_subscribers_connected{{ip_address="{ip}"}} {count}.0' in text
            assert 'ip_address="127.0.0.1"' not in text  # the proxy itself serves no one
        wait_until(lambda: relay.on_loop(lambda: dict(relay.server._per_ip)) == {}, what="counts released")


def test_the_event_rate_per_address_delays_and_never_drops(tmp_path: Path) -> None:
    """Two clients from one address share its bucket, a third address has its own; all three get every
    event in order, and at no point has an address been sent more than the bucket allows."""
    rate = 400.0
    events = make_events(1200)
    expected = [BASE_US + 1000 * i for i in range(len(events))]
    with running_relay(str(tmp_path), max_events_per_ip_s=rate, flush_interval_ns=10_000_000) as relay:
        relay.append(events)
        got: dict[str, list[int]] = {}
        early: dict[str, tuple[float, int]] = {}

        def read(name: str, source: str) -> None:
            with connect_as(relay, "cursor=0", source=source) as ws:
                start = time.monotonic()
                times = [e["time_us"] for e in recv_events(ws, 1)]
                time.sleep(0.2)  # pace: the period measured: what the relay sends in 0.2 s
                while True:  # everything the relay has sent by now
                    try:
                        times += [e["time_us"] for e in recv_events(ws, 1, timeout_s=0.001)]
                    except TimeoutError:
                        break
                early[name] = (time.monotonic() - start, len(times))
                times += [e["time_us"] for e in recv_events(ws, len(events) - len(times), timeout_s=30)]
                got[name] = times

        threads = [
            threading.Thread(target=read, args=(name, source))
            for name, source in (("a1", "127.0.0.1"), ("a2", "127.0.0.1"), ("b", "127.0.0.2"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(40)
        limiter = relay.server.limiter
        assert limiter is not None and limiter.throttled > 0
    assert got == {"a1": expected, "a2": expected, "b": expected}  # all of it, in order, nothing dropped
    a_elapsed = max(early["a1"][0], early["a2"][0])
    assert early["a1"][1] + early["a2"][1] <= rate + rate * (a_elapsed + 0.5), early  # one bucket for both
    assert early["b"][1] <= rate + rate * (early["b"][0] + 0.5), early


def close_of(ws: Any) -> tuple[int, str]:
    """Read until the relay closes; its close code and reason."""
    with pytest.raises(ConnectionClosed) as info:
        while True:
            ws.recv(timeout=WAIT_S)
    rcvd = info.value.rcvd
    assert rcvd is not None, "closed without a close frame"
    return rcvd.code, rcvd.reason


def test_a_client_over_its_message_rate_is_closed_with_1008_before_the_message_is_parsed(tmp_path: Path) -> None:
    update = json.dumps({"type": "options_update", "payload": {"wantedCollections": ["app.bsky.feed.post"]}})
    with running_relay(str(tmp_path), max_client_messages_per_s=0.001, client_message_burst=3) as relay:
        with connect_as(relay) as ws, connect_as(relay) as other:
            for _ in range(3):
                ws.send(update)  # the burst
            wait_until(lambda: relay.server.counters.options_updates == 3, what="the burst parsed")
            ws.send(update)
            code, reason = close_of(ws)
            assert code == 1008
            assert reason.startswith("client message rate exceeded: at most 3 messages or 1000000 bytes at once")
            counters = relay.server.counters
            assert counters.options_updates == 3 and counters.clients_dropped["client_message_rate"] == 1
            relay.append(make_events(1))  # the other connection is not affected
            assert len(recv_events(other, 1)) == 1
        text = relay.request("/metrics", metrics=True)[2].decode()
        assert 'logbuf_jetstream_clients_dropped_total{reason="client_message_rate"} 1.0' in text


def test_a_client_over_its_message_byte_rate_is_closed_with_1008(tmp_path: Path) -> None:
    big = json.dumps({"type": "options_update", "payload": {"wantedDids": [f"did:plc:{i:024d}" for i in range(400)]}})
    assert len(big) > 5000
    with running_relay(
        str(tmp_path), max_client_message_length=20_000, max_client_message_bytes_per_s=1.0, max_incoming_bytes=10**6
    ) as relay:
        with connect_as(relay) as ws:
            for _ in range(20_000 // len(big)):
                ws.send(big)
            ws.send(big)
            assert close_of(ws)[0] == 1008
        assert relay.server.counters.clients_dropped["client_message_rate"] == 1


def test_metrics_answer_while_client_input_fills_the_relay_budget(tmp_path: Path) -> None:
    """Unfinished messages holding all of max_incoming_bytes: a request head bigger than what any of them
    holds gets 503 on the public port, a smaller one gets in by closing the biggest holder (1009); the
    metrics port is outside that budget."""
    with running_relay(str(tmp_path), max_client_message_length=300, max_incoming_bytes=600) as relay:
        with raw_connection(relay) as a, raw_connection(relay) as b:
            for sock in (a, b):
                sock.sendall(UPGRADE.format(query="").encode())
                assert sock.recv(4096).startswith(b"HTTP/1.1 101")
                sock.sendall(client_frame(0x1, b"x" * 10, declared=300))  # declares 300, sends 10
            wait_until(lambda: relay.server._incoming_reserved == 600, what="the budget held")
            status, _, body = relay.request("/", headers={"X-Pad": "p" * 400})
            assert (status, body) == (503, b"relay busy: too much unfinished input from clients")
            status, _, body = relay.request("/metrics", metrics=True)
            assert status == 200 and b"jetstream_events_emitted_total" in body
            assert relay.server.counters.clients_dropped["input_evicted"] == 0
            status, _, body = relay.request("/")
            assert status == 200
            assert relay.server.counters.clients_dropped["input_evicted"] == 1
            codes = set()
            for sock in (a, b):
                sock.settimeout(0.5)
                try:
                    codes.add(sock.recv(4096)[2:4])
                except TimeoutError:
                    codes.add(b"")
            assert codes == {b"", (1009).to_bytes(2, "big")}  # one holder closed, the other left alone


def test_a_client_that_streams_on_after_its_close_frame_is_cut_off(tmp_path: Path) -> None:
    with running_relay(str(tmp_path), max_client_message_length=10_000, close_timeout_ns=30_000_000_000) as relay:
        with raw_connection(relay) as sock:
            sock.sendall(UPGRADE.format(query="").encode())
            assert sock.recv(4096).startswith(b"HTTP/1.1 101")
            sock.sendall(client_frame(0x1, b"not json"))  # closed 1007
            sock.settimeout(WAIT_S)
            sent = 0
            with pytest.raises(OSError):  # reset once the relay closes the socket
                while sent < 50_000_000:
                    sock.sendall(b"\x00" * 65536)
                    sent += 65536
        assert relay.server.counters.input_after_close == 1
        assert sent < 10_000_000  # long before the close timeout (30 s) or its whole stream


# -- the client-input budget under a flood ------------------------------------------------------------------


def test_a_full_input_budget_closes_its_biggest_holder_not_an_honest_clients_update(tmp_path: Path) -> None:
    """Stalled connections each declare a big message and hold the relay's whole client-input budget while
    events stream live. An honest client's small options_update still gets in: the connection holding the
    most input is closed (1009) to make room, the update is applied (the client then gets only the DIDs it
    asked for, under 2 s behind), and a newcomer's request head is answered the same way."""
    declared, budget, holders = 100_000, 1_000_000, 12
    gen = EventGenerator(5)
    sample = [json.loads(gen.make_event(BASE_US + i))["did"] for i in range(300)]
    wanted = {did for did, _ in Counter(sample).most_common(3)}
    update = json.dumps({"type": "options_update", "payload": {"wantedDids": sorted(wanted)}})
    stop = threading.Event()
    with running_relay(
        str(tmp_path),
        max_client_message_length=declared,
        max_incoming_bytes=budget,
        client_message_timeout_ns=60_000_000_000,
    ) as relay:

        def produce() -> None:  # ~200 events/s stamped with the wall clock
            while not stop.wait(0.005):
                relay.append([gen.make_event(time.time_ns() // 1000)])

        producer = threading.Thread(target=produce, daemon=True)
        with ExitStack() as stack:
            ws = stack.enter_context(connect_as(relay))
            producer.start()
            stack.callback(producer.join, WAIT_S)
            stack.callback(stop.set)
            assert len(recv_events(ws, 5)) == 5
            socks = [stack.enter_context(upgraded(relay, "127.0.0.2")) for _ in range(holders)]
            for sock in socks:
                sock.sendall(client_frame(0x1, b"x" * 10, declared=declared))  # declares 100,000, sends 10
            counters = relay.server.counters
            wait_until(
                lambda: counters.clients_dropped["incoming_full"] == holders - budget // declared, what="refusals"
            )
            assert relay.on_loop(lambda: relay.server._incoming_reserved) == budget  # the budget is exhausted
            ws.send(update)
            wait_until(lambda: counters.options_updates == 1, what="the update applied")
            applied_us = time.time_ns() // 1000
            assert counters.clients_dropped["input_evicted"] == 1
            got: list[tuple[str, float]] = []
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                for event in recv_events(ws, 1, timeout_s=WAIT_S):
                    if event["time_us"] > applied_us:
                        got.append((event["did"], time.time_ns() / 1000 - event["time_us"]))
            assert len(got) >= 5, got
            assert {did for did, _ in got} <= wanted, got
            lag_s = max(lag_us for _, lag_us in got) / 1e6
            assert lag_s < 2.0, f"the honest client fell {lag_s:.2f} s behind"
            # a new client's request head gets in the same way (another holder is closed)
            refill = stack.enter_context(upgraded(relay, "127.0.0.2"))
            refill.sendall(client_frame(0x1, b"x" * 10, declared=declared))
            wait_until(
                lambda: relay.on_loop(lambda: relay.server._incoming_reserved) == budget, what="the budget refilled"
            )
            with connect_as(relay, "wantedCollections=app.bsky.feed.post") as newcomer:
                assert len(recv_events(newcomer, 1)) == 1
            assert counters.clients_dropped["input_evicted"] == 2
            assert relay.on_loop(lambda: relay.server._incoming_reserved) <= budget
        text = relay.request("/metrics", metrics=True)[2].decode()
        assert 'logbuf_jetstream_clients_dropped_total{reason="input_evicted"} 2.0' in text


def test_the_unfinished_message_timer_restarts_with_each_message(tmp_path: Path) -> None:
    """Back-to-back messages, each sent whole within 0.3 s but each read arriving with the next one's first
    bytes, keep a connection busy for longer than client_message_timeout_ns: none of them is late."""
    update = json.dumps({"type": "options_update", "payload": {"wantedCollections": ["app.bsky.feed.post"]}})
    frame = client_frame(0x1, update.encode())
    with running_relay(
        str(tmp_path), client_message_timeout_ns=500_000_000, max_client_messages_per_s=100.0, client_message_burst=100
    ) as relay:
        with upgraded(relay, "127.0.0.1") as sock:
            cut = 10  # the 6-byte header and 4 bytes of the payload: the message has begun
            sock.sendall(frame[:cut])
            for _ in range(10):  # 2.5 s: five timeouts' worth, two slow-timer checks at least
                time.sleep(0.25)
                sock.sendall(frame[cut:] + frame[:cut])  # the end of one message and the start of the next
            sock.sendall(frame[cut:])
            wait_until(lambda: relay.server.counters.options_updates == 11, what="every update applied")
        assert relay.server.counters.clients_dropped["client_message_timeout"] == 0
        assert relay.on_loop(lambda: relay.server._incoming_reserved) == 0
