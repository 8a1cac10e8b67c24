"""``logbuf-stat``: where every stream stands, read from a media driver's shared memory.

Like AeronStat, it only reads: the CnC file's counters and distinct-error log, and the publication
log files' metadata and frames (for message rates). It never sends the driver a command, so it
works beside a busy driver and on the files a dead driver left behind (it then says so).

    logbuf-stat                      # live view (rich), refreshed every second, Ctrl-C to stop
    logbuf-stat --once --json        # one snapshot for scripts (rates measured over --interval)
    logbuf-stat --prometheus 9464    # serve the counters as Prometheus metrics, plus the live view
    logbuf-stat --loss               # the loss report, as Aeron's LossStat prints it (--json: a list)

``--loss`` is a flag of this tool rather than a command of its own: it shares the directory
resolution and ``--json``, and it reads only ``loss-report.dat`` (not the CnC), so it works on a
stopped driver's files and on a real Aeron driver's directory alike.

Per stream (a publication's session id and stream id): publisher position and limit, bytes/s from
how far the position moved, msgs/s from the messages (BEGIN frames) found in the frames written
since the last sample, and each subscriber's lag behind the publisher; the slowest is marked.
Positions, limits, lags and bytes/s count log bytes: frames with their 32-byte headers, each aligned
to 32 bytes (a 32-byte message takes 64), so they run ahead of payload rates.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import numpy as np

from logbuf import native
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.archive_counters import read_counters
from logbuf.conduit.cnc import CncError, CncFile, cnc_driver_heartbeat_ms
from logbuf.conduit.counters import CounterInfo, CountersReader
from logbuf.conduit.error_log import read_error_log
from logbuf.conduit.loss_report import LossEntry, LossReportError, LossReportFile
from logbuf.conduit.system_counters_descriptor import (
    SYSTEM_COUNTER_KEY,
    SYSTEM_COUNTER_TYPE_IDS,
    UDP_SYSTEM_COUNTER_IDS,
)
from logbuf.durations import duration_argument, format_duration_ns, renamed_duration_keywords
from logbuf.errors import ShmError
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logging_config import configure_logging
from logbuf.process import pid_alive

PUBLICATIONS_DIR = "publications"
IMAGES_DIR = "images"
DEFAULT_ALIVE_TIMEOUT_NS = 5_000_000_000
MAX_SCAN_BYTES = 1 << 20
"""Frames scanned per stream per sample to estimate messages per byte."""

LEGEND = (
    "position: where the publisher is in the stream; limit: how far it may write before it is "
    "back-pressured (the slowest subscriber's position + the term window); for an image received over "
    f"UDP, position is what subscribers can read ({cd.LABEL_PREFIXES[cd.RECEIVER_POSITION_TYPE_ID]}) and limit "
    f"the highest position received ({cd.LABEL_PREFIXES[cd.RECEIVER_HWM_TYPE_ID]}). lag: how far a subscriber is "
    "behind the position. Positions, limits, lags and bytes/s count log bytes: frames with their 32-byte headers, "
    f"aligned to {dh.FRAME_ALIGNMENT} (a 32-byte message takes 64 bytes), so they run ahead of payload rates; "
    "msgs/s counts messages."
)

__all__ = ["UDP_SYSTEM_COUNTER_IDS", "StatReader", "Snapshot", "StreamStat", "SubscriberStat", "main"]


@dataclass(slots=True)
class SubscriberStat:
    counter_id: int
    registration_id: int
    client_id: int
    position: int
    lag: int
    slowest: bool = False


@dataclass(slots=True)
class ReceiverStat:
    """One receiver of a multicast or MDC publication, as its sender sees it (its last status message)."""

    counter_id: int
    receiver_id: str
    address: str
    position: int
    lag: int
    """Bytes behind the sender position."""
    slowest: bool = False


@dataclass(slots=True)
class StreamStat:
    registration_id: int
    session_id: int
    stream_id: int
    channel: str
    publisher_position: int
    publisher_limit: int
    msgs_per_s: float | None
    bytes_per_s: float | None
    subscribers: list[SubscriberStat] = field(default_factory=list)
    kind: str = "publication"  # or "image": a remote publication received over UDP
    sender_position: int | None = None
    sender_limit: int | None = None
    receiver_hwm: int | None = None
    receivers: list[ReceiverStat] = field(default_factory=list)
    """Multicast and MDC publications: each receiver (group member or MDC destination) with its position."""
    flow_control_receivers: int | None = None
    mdc_destinations: int | None = None


@dataclass(slots=True)
class CounterStat:
    id: int
    type_id: int
    label: str
    value: int
    system_id: int | None = None
    """For a system counter: its id (Aeron's SystemCounterDescriptor, logbuf's own from 100), from its key.
    Slots, ids and labels: :mod:`logbuf.conduit.system_counters_descriptor`."""


@dataclass(slots=True)
class ErrorStat:
    count: int
    first_ms: int
    last_ms: int
    text: str


@dataclass(slots=True)
class Snapshot:
    dir: str
    alive: bool
    driver_pid: int
    heartbeat_age_ms: int
    time_ms: int
    streams: list[StreamStat]
    counters: list[CounterStat]
    errors: list[ErrorStat]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def count_messages(log: LogBuffers, start: int, end: int, max_bytes: int = MAX_SCAN_BYTES) -> tuple[int, int]:
    """Messages (frames with the BEGIN flag) in ``[start, ...)``, scanning at most ``max_bytes``.

    ``start`` must be a frame boundary (a tail position is). Returns (messages, bytes scanned); the
    caller scales. Stops at the first frame not yet committed.
    """
    term_length = log.term_length
    messages = scanned = 0
    position = start
    end = min(end, start + max_bytes)
    while position < end:
        term_count = position // term_length
        offset = position % term_length
        length = min(end - position, term_length - offset)
        term = log.term_buffer(term_count % 3)
        block = term[offset : offset + length]
        offsets = np.empty(length // dh.HEADER_LENGTH + 1, dtype=np.int32)
        lengths = np.empty_like(offsets)
        n = native.frame_index(block, offsets, lengths)
        if n:
            flags = np.frombuffer(block, dtype=np.uint8)[offsets[:n] - dh.HEADER_LENGTH + dh.FLAGS_FIELD_OFFSET]
            messages += int(np.count_nonzero(flags & dh.BEGIN_FLAG))
        block.release()
        term.release()
        scanned += length
        position += length
    return messages, scanned


def _sample_start(prev: int, now: int, term_length: int) -> int:
    """A frame boundary at or after ``prev`` whose data is still intact at ``now``.

    Frames at ``prev`` survive while the tail is within the next term; further back, the start of
    the tail's own term (or the one before, when the tail has barely entered it) is a boundary.
    """
    term_start = now - now % term_length
    if now - prev <= term_length:
        return prev
    return term_start if now - term_start >= min(term_length, MAX_SCAN_BYTES) // 2 else term_start - term_length


def _channel(info: CounterInfo) -> str:
    """A stream counter's channel: from its label, which has all of it (the key holds at most 92 bytes)."""
    label = info.label
    channel = label.split(" ", 4)[4] if label.count(" ") >= 4 else cd.stream_key_channel(info.key)
    if info.type_id == cd.SUBSCRIBER_POSITION_TYPE_ID and " @" in channel:
        channel = channel.rsplit(" @", 1)[0]
    return channel


@renamed_duration_keywords({"alive_timeout_ms": ("alive_timeout_ns", 1_000_000)})
class StatReader:
    """Samples a driver directory; keeps the previous sample to compute rates."""

    def __init__(self, directory: str, *, alive_timeout_ns: int = DEFAULT_ALIVE_TIMEOUT_NS) -> None:
        self.dir = directory
        self.alive_timeout_ns = alive_timeout_ns
        self.cnc = CncFile.open(directory)
        self.counters = CountersReader(self.cnc.counters_metadata, self.cnc.counters_values)
        self._logs: dict[int, LogBuffers | None] = {}
        self._previous: dict[int, tuple[float, int]] = {}  # pub registration id -> (monotonic s, position)

    def close(self) -> None:
        for log in self._logs.values():
            if log is not None:
                log.close()
        self._logs.clear()
        self.cnc.close()

    def __enter__(self) -> StatReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _log(self, registration_id: int, kind: str = "publication") -> LogBuffers | None:
        if registration_id not in self._logs:
            folder = PUBLICATIONS_DIR if kind == "publication" else IMAGES_DIR
            path = os.path.join(self.dir, folder, f"{registration_id}.logbuffer")
            try:
                self._logs[registration_id] = LogBuffers.open_file(path)
            except (OSError, ValueError, ShmError):
                self._logs[registration_id] = None  # gone (driver cleaned up): counters only
        return self._logs[registration_id]

    def sample(self) -> Snapshot:
        now_ms = time.time_ns() // 1_000_000
        heartbeat_age = now_ms - cnc_driver_heartbeat_ms(self.cnc)
        infos = list(self.counters)
        streams = self._streams(infos)
        return Snapshot(
            dir=self.dir,
            alive=heartbeat_age * 1_000_000 <= self.alive_timeout_ns,
            driver_pid=self.cnc.pid,
            heartbeat_age_ms=heartbeat_age,
            time_ms=now_ms,
            streams=streams,
            counters=[
                CounterStat(
                    i.counter_id,
                    i.type_id,
                    i.label,
                    i.value,
                    SYSTEM_COUNTER_KEY.unpack_from(i.key)[0] if i.type_id in SYSTEM_COUNTER_TYPE_IDS else None,
                )
                for i in infos
            ],
            errors=[
                ErrorStat(e.count, e.first_observation_ms, e.last_observation_ms, e.text)
                for e in sorted(read_error_log(self.cnc.error_log), key=lambda e: -e.last_observation_ms)
            ],
        )

    def _streams(self, infos: Iterable[CounterInfo]) -> list[StreamStat]:
        limits: dict[tuple[int, int], CounterInfo] = {}
        positions: dict[tuple[int, int], CounterInfo] = {}
        subscribers: dict[tuple[int, int], list[CounterInfo]] = {}
        extra: dict[tuple[int, int, int], CounterInfo] = {}  # (type id, session, stream) -> counter
        images: dict[tuple[int, int], CounterInfo] = {}  # rcv-pos counters
        receivers: dict[tuple[int, int], list[CounterInfo]] = {}  # fc-rcv-pos counters
        for info in infos:
            if info.type_id not in (
                cd.FLOW_CONTROL_RECEIVER_POSITION_TYPE_ID,
                cd.FLOW_CONTROL_RECEIVERS_TYPE_ID,
                cd.MDC_DESTINATIONS_TYPE_ID,
                cd.PUBLISHER_LIMIT_TYPE_ID,
                cd.PUBLISHER_POSITION_TYPE_ID,
                cd.SUBSCRIBER_POSITION_TYPE_ID,
                cd.SENDER_POSITION_TYPE_ID,
                cd.SENDER_LIMIT_TYPE_ID,
                cd.RECEIVER_HWM_TYPE_ID,
                cd.RECEIVER_POSITION_TYPE_ID,
            ):
                continue
            _, session_id, stream_id, _ = cd.STREAM_KEY.unpack_from(info.key)
            key = (session_id, stream_id)
            if info.type_id == cd.PUBLISHER_LIMIT_TYPE_ID:
                limits[key] = info
            elif info.type_id == cd.PUBLISHER_POSITION_TYPE_ID:
                positions[key] = info
            elif info.type_id == cd.SUBSCRIBER_POSITION_TYPE_ID:
                subscribers.setdefault(key, []).append(info)
            elif info.type_id == cd.RECEIVER_POSITION_TYPE_ID:
                images[key] = info
            elif info.type_id == cd.FLOW_CONTROL_RECEIVER_POSITION_TYPE_ID:
                receivers.setdefault(key, []).append(info)
            else:
                extra[(info.type_id, session_id, stream_id)] = info
        entries = [(key, info, "publication") for key, info in limits.items()]
        entries += [(key, info, "image") for key, info in images.items()]
        now = time.monotonic()
        streams = []
        live = set()
        for key, head, kind in sorted(entries, key=lambda e: (e[0][1], e[0][0], e[2])):
            registration_id = head.registration_id
            live.add(registration_id)
            log = self._log(registration_id, kind)
            if kind == "image":
                position = head.value  # the rebuild position: what subscribers can read
            else:
                position = log.tail_position() if log is not None else positions[key].value if key in positions else 0
            msgs_per_s = bytes_per_s = None
            previous = self._previous.get(registration_id)
            if previous is not None and now > previous[0]:
                elapsed = now - previous[0]
                moved = max(0, position - previous[1])
                bytes_per_s = moved / elapsed
                if moved == 0:
                    msgs_per_s = 0.0
                elif log is not None:
                    start = _sample_start(previous[1], position, log.term_length)
                    messages, scanned = count_messages(log, start, position)
                    msgs_per_s = messages / scanned * moved / elapsed if scanned else 0.0
            self._previous[registration_id] = (now, position)
            channel = _channel(head)

            def value(type_id: int, key: tuple[int, int] = key) -> int | None:
                info = extra.get((type_id, key[0], key[1]))
                return info.value if info is not None else None

            stream = StreamStat(
                registration_id,
                key[0],
                key[1],
                channel,
                position,
                head.value if kind == "publication" else (value(cd.RECEIVER_HWM_TYPE_ID) or position),
                msgs_per_s,
                bytes_per_s,
                kind=kind,
                sender_position=value(cd.SENDER_POSITION_TYPE_ID) if kind == "publication" else None,
                sender_limit=value(cd.SENDER_LIMIT_TYPE_ID) if kind == "publication" else None,
                receiver_hwm=value(cd.RECEIVER_HWM_TYPE_ID) if kind == "image" else None,
                flow_control_receivers=value(cd.FLOW_CONTROL_RECEIVERS_TYPE_ID) if kind == "publication" else None,
                mdc_destinations=value(cd.MDC_DESTINATIONS_TYPE_ID) if kind == "publication" else None,
            )
            sent = stream.sender_position if stream.sender_position is not None else position
            for receiver in receivers.get(key, []) if kind == "publication" else []:
                _, _, tail = receiver.label.rpartition(" receiver=")
                receiver_id, _, address = tail.partition(" ")
                stream.receivers.append(
                    ReceiverStat(
                        receiver.counter_id, receiver_id, address, receiver.value, max(0, sent - receiver.value)
                    )
                )
            if stream.receivers:
                min(stream.receivers, key=lambda r: r.position).slowest = True
            for sub in subscribers.get(key, []):
                stream.subscribers.append(
                    SubscriberStat(
                        sub.counter_id, sub.registration_id, sub.owner_id, sub.value, max(0, position - sub.value)
                    )
                )
            if stream.subscribers:
                min(stream.subscribers, key=lambda s: s.position).slowest = True
            streams.append(stream)
        for registration_id in [r for r in self._logs if r not in live]:
            log = self._logs.pop(registration_id)
            if log is not None:
                log.close()
            self._previous.pop(registration_id, None)
        return streams


# -- output ------------------------------------------------------------------------------------------
def _rate(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.2f} {suffix}{unit}"
    return f"{value:.0f} {unit}".rstrip()


def has_udp(snapshot: Snapshot) -> bool:
    """Whether the driver has a UDP stream: an image, or a publication with a sender."""
    return any(s.kind == "image" or s.sender_position is not None for s in snapshot.streams)


def system_counters_to_show(snapshot: Snapshot) -> tuple[list[CounterStat], int]:
    """The system counters for the live view, and how many idle UDP counters were left out.

    A counter's key holds its system counter id (Aeron's layout), which tells the UDP ones apart.
    """
    udp = has_udp(snapshot)
    shown: list[CounterStat] = []
    hidden = 0
    for c in snapshot.counters:
        if c.type_id not in SYSTEM_COUNTER_TYPE_IDS:
            continue
        if not udp and c.value == 0 and c.system_id in UDP_SYSTEM_COUNTER_IDS:
            hidden += 1
        else:
            shown.append(c)
    return shown, hidden


def render(snapshot: Snapshot) -> Any:
    """A rich renderable of a snapshot."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    state = Text("alive", style="bold green") if snapshot.alive else Text("NOT ALIVE", style="bold red")
    title = Text.assemble(
        "driver ",
        state,
        f"  pid {snapshot.driver_pid}  heartbeat {snapshot.heartbeat_age_ms} ms ago  dir {snapshot.dir}",
    )
    streams = Table(title="streams", expand=True, padding=(0, 0))
    for name, justify in (
        ("stream", "right"),
        ("session", "right"),
        ("channel", "left"),
        ("position", "right"),
        ("limit", "right"),
        ("msgs/s", "right"),
        ("log bytes/s", "right"),
    ):
        streams.add_column(
            name,
            justify=justify,  # type: ignore[arg-type]
            no_wrap=True,
            min_width=13 if name in ("position", "limit") else None,
        )
    subscribers = Table(title="subscribers (slowest of a stream in red)", expand=True)
    for name in ("stream", "session", "subscription", "client", "position", "lag (bytes)"):
        subscribers.add_column(name, justify="right", no_wrap=True)
    for s in snapshot.streams:
        channel = s.channel if s.kind == "publication" else f"{s.channel} (image)"
        streams.add_row(
            str(s.stream_id),
            str(s.session_id),
            channel,
            f"{s.publisher_position:,}",
            f"{s.publisher_limit:,}",
            _rate(s.msgs_per_s),
            _rate(s.bytes_per_s, "B"),
        )
        for sub in s.subscribers:
            style = "bold red" if sub.slowest and len(s.subscribers) > 1 and sub.lag > 0 else None
            subscribers.add_row(
                str(s.stream_id),
                str(s.session_id),
                str(sub.registration_id),
                str(sub.client_id),
                f"{sub.position:,}",
                f"{sub.lag:,}",
                style=style,
            )
    receivers = Table(title="receivers of multicast and MDC publications (slowest in red)", expand=True)
    for name in ("stream", "session", "receiver id", "address", "position", "lag (bytes)"):
        receivers.add_column(name, justify="right", no_wrap=True)
    for s in snapshot.streams:
        for r in s.receivers:
            style = "bold red" if r.slowest and len(s.receivers) > 1 and r.lag > 0 else None
            receivers.add_row(
                str(s.stream_id),
                str(s.session_id),
                r.receiver_id,
                r.address,
                f"{r.position:,}",
                f"{r.lag:,}",
                style=style,
            )
    shown, hidden = system_counters_to_show(snapshot)
    counters = Table(
        title="system counters" + (f" ({hidden} idle UDP counters hidden: no UDP stream)" if hidden else ""),
        expand=True,
    )
    counters.add_column("id", justify="right")
    counters.add_column("label")
    counters.add_column("value", justify="right")
    for c in shown:
        counters.add_row(str(c.id), c.label, f"{c.value:,}")
    parts: list[Any] = [title, streams, Text(LEGEND, style="dim"), subscribers]
    if receivers.row_count:
        parts.append(receivers)
    parts.append(counters)
    if snapshot.errors:
        errors = Table(title="distinct errors (most recent first)", expand=True)
        errors.add_column("count", justify="right")
        errors.add_column("last seen")
        errors.add_column("error")
        for e in snapshot.errors[:5]:
            errors.add_row(str(e.count), time.strftime("%H:%M:%S", time.localtime(e.last_ms / 1000)), e.text)
        parts.append(errors)
    return Group(*parts)


def serve_prometheus(
    directory: str, port: int, *, alive_timeout_ns: int = DEFAULT_ALIVE_TIMEOUT_NS, alive_timeout_ms: int | None = None
) -> Any:
    """Serve the driver's counters at ``http://0.0.0.0:port/metrics``; returns (server, reader).

    Scrapes run on the server's thread with a reader of their own. ``alive_timeout_ms`` is deprecated (one
    release): give ``alive_timeout_ns``.
    """
    if alive_timeout_ms is not None:
        warnings.warn(
            "serve_prometheus(alive_timeout_ms=...) is deprecated and will be removed: use alive_timeout_ns "
            "(integer nanoseconds)",
            DeprecationWarning,
            stacklevel=2,
        )
        alive_timeout_ns = alive_timeout_ms * 1_000_000
    reader = StatReader(directory, alive_timeout_ns=alive_timeout_ns)
    lock = threading.Lock()
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    class DriverCollector(Collector):
        def collect(self) -> Iterable[Any]:
            with lock:
                snap = reader.sample()
            alive = GaugeMetricFamily("logbuf_driver_alive", "1 while the driver heartbeats", labels=["dir"])
            alive.add_metric([snap.dir], 1.0 if snap.alive else 0.0)
            yield alive
            system = GaugeMetricFamily("logbuf_system_counter", "The driver's system counters", labels=["id", "label"])
            for c in snap.counters:
                if c.type_id in SYSTEM_COUNTER_TYPE_IDS:
                    system.add_metric([str(c.id), c.label], float(c.value))
            yield system
            labels = ["stream_id", "session_id", "channel"]
            pub = GaugeMetricFamily("logbuf_publisher_position_bytes", "Publisher position", labels=labels)
            lmt = GaugeMetricFamily("logbuf_publisher_limit_bytes", "Publisher limit", labels=labels)
            sub = GaugeMetricFamily(
                "logbuf_subscriber_position_bytes", "Subscriber position", labels=[*labels, "registration_id"]
            )
            lag = GaugeMetricFamily(
                "logbuf_subscriber_lag_bytes",
                "Subscriber lag behind the publisher",
                labels=[*labels, "registration_id"],
            )
            for s in snap.streams:
                values = [str(s.stream_id), str(s.session_id), s.channel]
                pub.add_metric(values, float(s.publisher_position))
                lmt.add_metric(values, float(s.publisher_limit))
                for p in s.subscribers:
                    sub.add_metric([*values, str(p.registration_id)], float(p.position))
                    lag.add_metric([*values, str(p.registration_id)], float(p.lag))
            snd = GaugeMetricFamily("logbuf_sender_position_bytes", "UDP sender position", labels=labels)
            hwm = GaugeMetricFamily("logbuf_receiver_hwm_bytes", "UDP receiver high-water mark", labels=labels)
            for s in snap.streams:
                values = [str(s.stream_id), str(s.session_id), s.channel]
                if s.sender_position is not None:
                    snd.add_metric(values, float(s.sender_position))
                if s.receiver_hwm is not None:
                    hwm.add_metric(values, float(s.receiver_hwm))
            receiver_labels = [*labels, "receiver_id", "address"]
            rcv = GaugeMetricFamily(
                "logbuf_group_receiver_position_bytes",
                "Multicast/MDC receiver's position (its last status message), seen by the sender",
                labels=receiver_labels,
            )
            rcv_lag = GaugeMetricFamily(
                "logbuf_group_receiver_lag_bytes",
                "Multicast/MDC receiver's lag behind the sender",
                labels=receiver_labels,
            )
            for s in snap.streams:
                values = [str(s.stream_id), str(s.session_id), s.channel]
                for r in s.receivers:
                    rcv.add_metric([*values, r.receiver_id, r.address], float(r.position))
                    rcv_lag.add_metric([*values, r.receiver_id, r.address], float(r.lag))
            yield from (pub, lmt, sub, lag, snd, hwm, rcv, rcv_lag)
            errors = GaugeMetricFamily("logbuf_distinct_errors", "Distinct errors in the driver's error log")
            errors.add_metric([], float(len(snap.errors)))
            yield errors

    registry = CollectorRegistry()
    registry.register(DriverCollector())
    server, _thread = start_http_server(port, registry=registry)
    return server, reader


# -- loss report (Aeron's LossStat) -------------------------------------------------------------------
LOSS_REPORT_CSV_HEADER: Final[str] = (
    "#OBSERVATION_COUNT,TOTAL_BYTES_LOST,FIRST_OBSERVATION,LAST_OBSERVATION,SESSION_ID,STREAM_ID,CHANNEL,SOURCE"
)
"""Aeron's ``LossReportReader.LOSS_REPORT_CSV_HEADER``."""


def format_loss_time(epoch_ms: int) -> str:
    """Aeron LossStat's ``yyyy-MM-dd HH:mm:ss.SSSZ`` in local time (``2026-11-25 18:02:03.042+0000``)."""
    seconds, millis = divmod(epoch_ms, 1000)
    local = time.localtime(seconds)
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', local)}.{millis:03d}{time.strftime('%z', local)}"


def loss_table(entries: Sequence[LossEntry]) -> list[str]:
    """LossStat's output lines: the header, one CSV line per entry, and the count."""
    lines = [LOSS_REPORT_CSV_HEADER]
    for e in entries:
        lines.append(
            f"{e.observation_count},{e.total_bytes_lost},{format_loss_time(e.first_observation_ms)},"
            f"{format_loss_time(e.last_observation_ms)},{e.session_id},{e.stream_id},{e.channel},{e.source}"
        )
    lines.append(f"{len(entries)} loss entries")
    return lines


def print_loss_report(directory: str, *, as_json: bool = False) -> int:
    """Read ``<directory>/loss-report.dat`` (no CnC needed: works on a stopped driver's files)."""
    try:
        with LossReportFile.open(directory) as report:
            entries = report.entries()
    except LossReportError as e:
        print(f"logbuf-stat: {e}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps([asdict(e) for e in entries]))
    else:
        print("\n".join(loss_table(entries)))
    return 0


def archive_counters(directories: Sequence[str]) -> list[dict[str, Any]]:
    """The archive services' counters (``<dir>/archive.counters``): one dict per directory."""
    found: list[dict[str, Any]] = []
    for directory in directories:
        read = read_counters(directory)
        if read is None:
            found.append({"archive_dir": directory, "error": "no archive counters (is a service serving it?)"})
            continue
        pid, values = read
        found.append(
            {
                "archive_dir": directory,
                "pid": pid,
                "alive": pid_alive(pid),
                "counters": values,
                "replications": _replications(directory),
            }
        )
    return found


def _replications(directory: str) -> list[dict[str, Any]]:
    """The archive's copies in progress, each with its source identity and lag (bytes behind the source)."""
    from logbuf.conduit.archive_status import read_replications, read_source

    out = []
    for entry in read_replications(directory):
        source = read_source(directory, int(entry.get("dst_recording_id", -1)))
        if source is not None:
            entry = {**entry, "source_identity": source.source_identity, "channel": source.channel}
        out.append(entry)
    return out


def render_archive(archive: dict[str, Any]) -> Any:
    from rich.table import Table

    state = archive.get("error") or ("alive" if archive["alive"] else "not running")
    table = Table(title=f"archive {archive['archive_dir']} (pid {archive.get('pid', '-')}, {state})")
    table.add_column("counter")
    table.add_column("value", justify="right")
    for label, value in archive.get("counters", {}).items():
        table.add_row(label, f"{value:,}")
    for r in archive.get("replications", []):
        source = f"archive {r.get('source_archive_id')} recording {r.get('src_recording_id')}"
        if r.get("source_identity"):
            source += f" ({r['source_identity']})"
        table.add_row(f"copy into recording {r.get('dst_recording_id')} from {source}: lag", f"{r.get('lag', -1):,} B")
    return table


# -- entry point -------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="logbuf-stat", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="driver directory (default: LOGBUF_DIR, else /dev/shm/logbuf-<user>)")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--json", action="store_true", help="JSON output (with --once: one object; else one per line)")
    parser.add_argument(
        "--interval",
        dest="interval_ns",
        type=duration_argument("s"),
        default=1_000_000_000,
        metavar="DURATION",
        help="time between samples (e.g. 500ms, 2s; a bare number is seconds; default 1s)",
    )
    parser.add_argument(
        "--duration",
        dest="duration_ns",
        type=duration_argument("s"),
        default=None,
        metavar="DURATION",
        help="stop after this long (e.g. 30s, 5m; a bare number is seconds)",
    )
    parser.add_argument("--prometheus", type=int, metavar="PORT", default=None, help="serve /metrics on PORT")
    parser.add_argument(
        "--loss",
        action="store_true",
        help="print the loss report (loss-report.dat, logbuf's or Aeron's) as Aeron's LossStat does, and exit",
    )
    parser.add_argument(
        "--archive-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="also show the counters of the archive service serving DIR (repeatable)",
    )
    parser.add_argument(
        "--topics",
        action="store_true",
        help="per-topic message rates and each topic subscription's patterns and lag (logbuf.client.topic_stat)",
    )
    parser.add_argument(
        "--alive-timeout-ms",
        dest="alive_timeout_ns",
        type=duration_argument("ms"),
        default=DEFAULT_ALIVE_TIMEOUT_NS,
        metavar="DURATION",
        help="heartbeat age beyond which the driver is reported not alive (e.g. 500ms, 5s; a bare number is "
        "milliseconds; default 5s)",
    )
    args = parser.parse_args(argv)
    if args.interval_ns <= 0:
        parser.error(f"--interval={format_duration_ns(args.interval_ns)} must be positive")
    if args.prometheus is not None and not 0 <= args.prometheus <= 65535:
        parser.error(f"--prometheus={args.prometheus} is not a TCP port")
    return args


def require_tools_extra(module: str, feature: str) -> None:
    """Exit naming the ``[tools]`` extra if ``module`` (rich, prometheus_client) is not installed: the core
    install is the transport alone."""
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"{feature} needs the [tools] extra ({module} is not installed): pip install 'logbuf[tools]'")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("warning")
    if not (args.json or args.loss or args.topics):
        require_tools_extra("rich", "logbuf-stat's view")
    if args.prometheus is not None:
        require_tools_extra("prometheus_client", "logbuf-stat --prometheus")
    from logbuf.directory import resolve_dir

    directory = resolve_dir(args.dir)
    if args.loss:
        return print_loss_report(directory, as_json=args.json)
    if args.topics:
        from logbuf.client.topic_stat import run_topics

        return run_topics(directory, args)
    try:
        reader = StatReader(directory, alive_timeout_ns=args.alive_timeout_ns)
    except CncError as e:
        print(f"logbuf-stat: {e}", file=sys.stderr)
        return 2
    prometheus: tuple[Any, StatReader] | None = None
    try:
        if args.once:
            reader.sample()  # the baseline for rates
            time.sleep(args.interval_ns / 1e9)
            snapshot = reader.sample()
            archives = archive_counters(args.archive_dir)
            if args.json:
                print(json.dumps({**snapshot.to_json(), **({"archives": archives} if args.archive_dir else {})}))
            else:
                from rich.console import Console

                console = Console()
                console.print(render(snapshot))
                for archive in archives:
                    console.print(render_archive(archive))
            return 0
        if args.prometheus is not None:
            prometheus = serve_prometheus(directory, args.prometheus, alive_timeout_ns=args.alive_timeout_ns)
        return _run_live(reader, args)
    except KeyboardInterrupt:
        return 0
    finally:
        if prometheus is not None:
            prometheus[0].shutdown()
            prometheus[1].close()
        reader.close()


def _run_live(reader: StatReader, args: argparse.Namespace) -> int:
    interval_s = args.interval_ns / 1e9
    deadline = None if args.duration_ns is None else time.monotonic() + args.duration_ns / 1e9
    if args.json:
        while deadline is None or time.monotonic() < deadline:
            print(json.dumps(reader.sample().to_json()), flush=True)
            time.sleep(interval_s)
        return 0
    from rich.live import Live

    with Live(render(reader.sample()), refresh_per_second=4, screen=False) as live:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(min(interval_s, max(0.0, deadline - time.monotonic()) if deadline else interval_s))
            live.update(render(reader.sample()))
    if not live.console.is_terminal:
        live.console.line()  # the final render ends without a newline when not on a terminal
    return 0


if __name__ == "__main__":
    sys.exit(main())
