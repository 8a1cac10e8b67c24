"""The relay under an ``options_update`` flood: many connections sending 10,000-DID updates as fast as TCP
takes them while an honest client reads the live stream. The honest client's lag stays under 2 s,
``/metrics`` answers, the relay's memory stays bounded and the flooders are closed (1008) for their rate."""

from __future__ import annotations

import re
import time
from pathlib import Path

from logbuf.testing import wait_until
from logbuf.testing.host import rss_bytes
from logbuf.testing.relay_flood import FloodReport, LagMeter, flood, relay_process, scrape_during

FLOODERS = 200
PER_ADDRESS = 10  # 20 addresses, under the per-address connection cap (100)
#: The flood lasts until every flooder is closed (a few seconds), at most this long.
FLOOD_S = 30.0
LAG_BOUND_S = 2.0
#: RSS the relay may gain during the flood: its client-input budget (max_incoming_bytes, 64 MiB) plus
#: per-connection state and allocator slack; without bounds it grew by hundreds of MB.
RSS_GROWTH_BOUND = 160 * 1024 * 1024
#: Close reasons of the relay's limits on client input, by the reason label of clients_dropped.
LIMIT_CLOSES = {
    "client_message_rate": "1008 client message rate exceeded",
    "incoming_full": "1009 relay busy: too much unfinished input",
    "input_evicted": "1009 relay busy: this connection holds the most unfinished input",
    "client_message_timeout": "1008 client message timeout",
}


def metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_an_options_update_flood_leaves_an_honest_client_under_2_s_of_lag(tmp_path: Path) -> None:
    with relay_process(str(tmp_path), rate=200.0) as relay:
        honest = LagMeter(relay.url())
        try:
            wait_until(lambda: honest.events >= 20 or honest.error is not None, 30, "the first events")
            assert honest.error is None, honest.error
            rss_before = rss_bytes(relay.pid)
            with flood(relay, FLOODERS, per_address=PER_ADDRESS, seconds=FLOOD_S) as flooders:
                assert flooders.poll(60), "flooders did not connect"
                assert flooders.recv() == "flooding"
                started = time.monotonic()
                # until every flooder is closed (or FLOOD_S); /metrics must answer meanwhile
                scrapes, flood_s = scrape_during(relay, flooders, timeout_s=LAG_BOUND_S)
                report = flooders.recv()
            assert isinstance(report, FloodReport)
            rss_peak = rss_bytes(relay.pid, "VmHWM")
            lag = honest.max_lag_s(since=started)
            assert honest.error is None, honest.error
        finally:
            honest.close()
        try:
            text = relay.metrics(timeout_s=10)
        except OSError as exc:
            text = f"no answer: {exc!r}"
    print(
        f"\nflood: {flood_s:.1f} s, {report.connected} connections, {report.messages_sent:.0f} messages sent, closes "
        f"{dict(report.closes)}; honest max lag {lag:.3f} s; /metrics max {max(scrapes):.3f} s; "
        f"relay RSS {rss_before / 2**20:.0f} -> {rss_peak / 2**20:.0f} MiB; /metrics after: {text[:40]!r}"
    )
    assert report.connected == FLOODERS
    assert max(scrapes) < LAG_BOUND_S, f"/metrics took {scrapes} s to answer during the flood"
    assert lag < LAG_BOUND_S, f"the honest client fell {lag:.2f} s behind during the flood"
    assert rss_peak - rss_before < RSS_GROWTH_BOUND, f"relay RSS grew {(rss_peak - rss_before) / 2**20:.0f} MiB"
    # Each flooder is closed by a limit, and the counters agree: its message rate (1008), or, while the
    # flooders together hold the relay's whole client-input budget, the budget (1009: refused, or closed as the
    # biggest holder to make room for a smaller message), or a message of its
    # left unfinished for client_message_timeout_ns while the relay read the others (1008).
    assert sum(report.closes.values()) == FLOODERS, f"flooders not all closed: {dict(report.closes)}"
    for reason, text_start in LIMIT_CLOSES.items():
        closed = sum(n for label, n in report.closes.items() if label.startswith(text_start))
        assert metric(text, "logbuf_jetstream_clients_dropped_total", f'{{reason="{reason}"}}') == closed, reason
    assert all(label.startswith(tuple(LIMIT_CLOSES.values())) for label in report.closes), report.closes
    rate_closes = sum(n for label, n in report.closes.items() if label.startswith(LIMIT_CLOSES["client_message_rate"]))
    assert rate_closes > 0
