"""The relay's counters and their Prometheus exposition under jetstream's metric names.

The loop only adds to plain ints (``RelayCounters``, and per-subscriber byte/event counts); nothing
is exported per send. :class:`RelayCollector` reads them when ``/metrics`` is scraped, so a scrape
costs one walk over the subscribers and the hot path no lock or label lookup.

Names (facts file §4.4): jetstream's own, ``jetstream_subscribers_connected{ip_address}``,
``jetstream_events_emitted_total``, ``jetstream_bytes_emitted_total``,
``jetstream_events_delivered_total{ip_address}``, ``jetstream_bytes_delivered_total{ip_address}``,
plus ``logbuf_jetstream_*`` for what jetstream does not have (store, retention, drops, rejects).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "BACKFILL_METRICS",
    "INGEST_METRICS",
    "STREAM_METRICS",
    "MetricsSnapshot",
    "MetricsSource",
    "RelayCollector",
    "RelayCounters",
    "stats_metrics",
]


@dataclass(slots=True)
class RelayCounters:
    """Plain counters the loop increments; names are the metric label values."""

    events_rejected: Counter[str] = field(default_factory=Counter)  # reason
    handshakes: Counter[str] = field(default_factory=Counter)  # outcome: accepted, bad_request, ...
    clients_dropped: Counter[str] = field(default_factory=Counter)  # reason
    options_updates: int = 0
    options_update_errors: Counter[str] = field(default_factory=Counter)  # reason
    client_messages_ignored: int = 0
    pings_sent: int = 0
    loop_iterations: int = 0
    flush_passes: int = 0
    sendfile_calls: int = 0
    accept_errors: int = 0
    input_after_close: int = 0  # connections closed at once for streaming on after our close / response
    connection_errors: Counter[str] = field(default_factory=Counter)  # exception type: connection closed
    rate_limited: int = 0  # sends held back by the per-address event rate (EventRateLimiter.throttled)
    forwarded_invalid: int = 0  # forwarded client addresses from trusted proxies that were not IPs
    # per IP, accumulated from subscribers that have gone
    departed_events: Counter[str] = field(default_factory=Counter)
    departed_bytes: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class MetricsSnapshot:
    connected: Counter[str]
    events_delivered: Counter[str]
    bytes_delivered: Counter[str]
    events_emitted: int
    bytes_emitted: int
    store_events: int
    store_bytes: dict[str, int]
    store_disk_bytes: dict[str, int]
    oldest_time_us: int
    newest_time_us: int
    events_retired: int
    bytes_punched: int
    punch_failures: int
    counters: RelayCounters
    messages_queued: int = 0


MetricsSource = Callable[[], Iterable[Metric]]
"""More metrics for ``/metrics``, called at each scrape on the relay's loop thread (see
:meth:`jetstream.server.RelayServer.add_metrics_source`)."""

# name suffix -> (kind, help): the stats fields exported by stats_metrics, under logbuf_jetstream_<prefix>_<field>.
INGEST_METRICS: Final[dict[str, tuple[str, str]]] = {
    "received": ("counter", "Events received from the source (upstream frames or generated events)"),
    "published": ("counter", "Events published into the event stream"),
    "published_bytes": ("counter", "JSON bytes published into the event stream"),
    "duplicates": ("counter", "Upstream events dropped as already published (rewound replays)"),
    "restamped": ("counter", "Upstream events given a new time_us (the upstream's clock was behind ours)"),
    "invalid": ("counter", "Upstream frames dropped as not v1 events"),
    "before_start": ("counter", "Upstream events skipped as older than this relay's history (or its recording)"),
    "oversized": ("counter", "Events skipped as longer than the stream's largest message"),
    "back_pressured": ("counter", "Offers refused by back-pressure (retried, never dropped)"),
    "not_connected": ("counter", "Offers refused with no subscriber yet (retried, never dropped)"),
    "connections": ("counter", "Upstream connections made"),
    "disconnects": ("counter", "Upstream connections lost or refused"),
    "topic_published": ("counter", "Events published again on the topic stream (--topics-stream-id)"),
    "topic_not_connected": ("counter", "Topic stream copies dropped: no topic subscriber anywhere"),
    "topic_back_pressured": ("counter", "Topic stream offers refused by back-pressure (retried, never dropped)"),
    "topic_overflow": ("counter", "Events sent as topic 'overflow' (collection not a topic name, or past max_topics)"),
    "last_time_us": ("gauge", "time_us of the newest event published"),
}
STREAM_METRICS: Final[dict[str, tuple[str, str]]] = {
    "appended": ("counter", "Events read from the event stream and stored"),
    "appended_bytes": ("counter", "JSON bytes read from the event stream and stored"),
    "invalid": ("counter", "Stream messages skipped as not v1 events"),
    "out_of_order": ("counter", "Stream messages skipped as not above the newest stored time_us"),
    "reserved_value_mismatch": ("counter", "Stream messages whose reserved value is not their time_us"),
    "last_time_us": ("gauge", "time_us of the newest event read from the stream"),
}
BACKFILL_METRICS: Final[dict[str, tuple[str, str]]] = {
    "recordings": ("gauge", "Recordings of the event stream read at start"),
    "events": ("counter", "Recorded events stored at start (--record)"),
    "bytes": ("counter", "JSON bytes of the recorded events stored at start"),
    "non_increasing": ("counter", "Recorded events skipped at start as not above the previous time_us"),
    "invalid": ("counter", "Recorded messages skipped at start as not v1 events"),
    "corrupt_regions": ("counter", "Corrupt regions of recordings skipped at start"),
    "first_time_us": ("gauge", "time_us of the oldest recorded event stored at start"),
    "last_time_us": ("gauge", "time_us of the newest recorded event stored at start (the ingest's floor)"),
    "duration_seconds": ("gauge", "How long reading the recordings at start took"),
    "running": ("gauge", "1 while the recorded events are still being loaded (the live stream waits)"),
}


def stats_metrics(prefix: str, table: Mapping[str, tuple[str, str]], values: Mapping[str, object]) -> Iterator[Metric]:
    """``logbuf_jetstream_<prefix>_<name>`` for each name of ``table`` found in ``values`` (numbers only)."""
    for name, (kind, doc) in table.items():
        value = values.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        metric_name = f"logbuf_jetstream_{prefix}_{name}"
        if kind == "counter":
            yield CounterMetricFamily(metric_name, doc, value=value)
        else:
            yield GaugeMetricFamily(metric_name, doc, value=value)


class RelayCollector(Collector):
    def __init__(self, snapshot: Callable[[], MetricsSnapshot]) -> None:
        self._snapshot = snapshot
        self.sources: list[MetricsSource] = []

    def collect(self) -> Iterator[Metric]:
        yield from self._relay_metrics()
        for source in self.sources:
            yield from source()

    def _relay_metrics(self) -> Iterator[Metric]:
        s = self._snapshot()
        c = s.counters

        def per_ip(metric: GaugeMetricFamily | CounterMetricFamily, values: Counter[str]) -> Metric:
            for ip, value in sorted(values.items()):
                metric.add_metric([ip], value)
            return metric

        yield per_ip(
            GaugeMetricFamily("jetstream_subscribers_connected", "Subscribers connected, by IP", labels=["ip_address"]),
            s.connected,
        )
        yield CounterMetricFamily("jetstream_events_emitted", "Events stored for emission", value=s.events_emitted)
        yield CounterMetricFamily(
            "jetstream_bytes_emitted", "JSON bytes of the events stored for emission", value=s.bytes_emitted
        )
        yield per_ip(
            CounterMetricFamily(
                "jetstream_events_delivered", "Events sent to subscribers, by IP", labels=["ip_address"]
            ),
            s.events_delivered,
        )
        yield per_ip(
            CounterMetricFamily(
                "jetstream_bytes_delivered", "Bytes (frames) sent to subscribers, by IP", labels=["ip_address"]
            ),
            s.bytes_delivered,
        )

        def labelled(name: str, doc: str, label: str, values: Counter[str]) -> Metric:
            metric = CounterMetricFamily(name, doc, labels=[label])
            for key, value in sorted(values.items()):
                metric.add_metric([key], value)
            return metric

        yield labelled(
            "logbuf_jetstream_events_rejected",
            "Appended events refused (non-increasing time_us)",
            "reason",
            c.events_rejected,
        )
        yield labelled("logbuf_jetstream_handshakes", "HTTP requests answered, by outcome", "outcome", c.handshakes)
        yield labelled(
            "logbuf_jetstream_clients_dropped", "Connections ended by the relay, by reason", "reason", c.clients_dropped
        )
        yield CounterMetricFamily(
            "logbuf_jetstream_options_updates", "Valid options_update messages", value=c.options_updates
        )
        yield labelled(
            "logbuf_jetstream_options_update_errors",
            "Client messages that closed the connection",
            "reason",
            c.options_update_errors,
        )
        yield CounterMetricFamily(
            "logbuf_jetstream_client_messages_ignored",
            "Client messages of an unknown type or binary",
            value=c.client_messages_ignored,
        )
        yield GaugeMetricFamily(
            "logbuf_jetstream_client_messages_queued",
            "Client messages received and waiting to be parsed",
            value=s.messages_queued,
        )
        yield CounterMetricFamily("logbuf_jetstream_pings_sent", "Pings sent to subscribers", value=c.pings_sent)
        yield CounterMetricFamily("logbuf_jetstream_loop_iterations", "Event-loop iterations", value=c.loop_iterations)
        yield CounterMetricFamily("logbuf_jetstream_flush_passes", "Passes over the subscribers", value=c.flush_passes)
        yield CounterMetricFamily("logbuf_jetstream_sendfile_calls", "sendfile calls", value=c.sendfile_calls)
        yield CounterMetricFamily(
            "logbuf_jetstream_accept_errors", "accept() failures (fd limit, ...)", value=c.accept_errors
        )
        yield CounterMetricFamily(
            "logbuf_jetstream_input_after_close",
            "Connections closed at once for sending more than a message after the relay's close frame or response",
            value=c.input_after_close,
        )
        yield CounterMetricFamily(
            "logbuf_jetstream_rate_limited",
            "Sends held back by the per-address event rate (max_events_per_ip_s)",
            value=c.rate_limited,
        )
        yield CounterMetricFamily(
            "logbuf_jetstream_forwarded_invalid",
            "X-Forwarded-For / X-Real-IP values from trusted proxies that were not IP addresses",
            value=c.forwarded_invalid,
        )
        yield labelled(
            "logbuf_jetstream_connection_errors",
            "Unexpected errors on one connection (that connection was closed; the relay went on)",
            "error",
            c.connection_errors,
        )
        yield GaugeMetricFamily("logbuf_jetstream_store_events", "Events retained", value=s.store_events)
        for name, doc, values in (
            ("logbuf_jetstream_store_bytes", "Apparent size of each frame file", s.store_bytes),
            ("logbuf_jetstream_store_disk_bytes", "Disk blocks of each frame file", s.store_disk_bytes),
        ):
            metric = GaugeMetricFamily(name, doc, labels=["file"])
            for key, value in values.items():
                metric.add_metric([key], value)
            yield metric
        yield GaugeMetricFamily(
            "logbuf_jetstream_oldest_time_us", "time_us of the oldest retained event", value=s.oldest_time_us
        )
        yield GaugeMetricFamily(
            "logbuf_jetstream_newest_time_us", "time_us of the newest event", value=s.newest_time_us
        )
        yield CounterMetricFamily(
            "logbuf_jetstream_events_retired", "Events dropped by retention", value=s.events_retired
        )
        yield CounterMetricFamily(
            "logbuf_jetstream_bytes_punched", "File bytes freed by hole punching", value=s.bytes_punched
        )
        yield CounterMetricFamily(
            "logbuf_jetstream_punch_failures", "fallocate(PUNCH_HOLE) failures", value=s.punch_failures
        )
