"""Relay limits for the internet (issue 16 item 1): per-address and total connection caps as settings,
client addresses from trusted proxies only, and jetstream's per-address event rate (a token bucket)."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from logbuf.jetstream.limits import EventRateLimiter
from logbuf.jetstream.proxy import TrustedProxies, normalize_ip
from tests.jetstream._relay_support import (
    BASE_US,
    WAIT_S,
    RelayHandle,
    make_events,
    recv_events,
    running_relay,
    wait_for,
)

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
        wait_for(lambda: relay.on_loop(lambda: dict(relay.server._per_ip)) == {}, what="counts released")


def test_the_event_rate_per_address_delays_and_never_drops(tmp_path: Path) -> None:
    """Two clients from one address share its bucket, a third address has its own; all three get every
    event in order, and at no point has an address been sent more than the bucket allows."""
    rate = 400.0
    events = make_events(1200)
    expected = [BASE_US + 1000 * i for i in range(len(events))]
    with running_relay(str(tmp_path), max_events_per_ip_s=rate, flush_interval_s=0.01) as relay:
        relay.append(events)
        got: dict[str, list[int]] = {}
        early: dict[str, tuple[float, int]] = {}

        def read(name: str, source: str) -> None:
            with connect_as(relay, "cursor=0", source=source) as ws:
                start = time.monotonic()
                times = [e["time_us"] for e in recv_events(ws, 1)]
                time.sleep(0.2)
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
