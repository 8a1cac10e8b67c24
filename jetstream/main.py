"""``logbuf-jetstream``: run a jetstream relay (ingest → logbuf stream → ``/subscribe`` server).

Wiring (one process; the stream between ingest and server is an ordinary logbuf stream, so
``logbuf-stat`` shows it and the archive can record it)::

    upstream ws://…/subscribe ─┐                               ┌─> RelayServer.append (server loop)
      or built-in generator  ──┴─> Ingest ─offer─> aeron:ipc ──┤     └─> /subscribe clients
                                   (thread)        stream 6008 └─> Recorder (--record, thread)

With ``--record DIR`` the relay survives restarts (:mod:`jetstream.backfill`): before it serves, the
recorded events of the retention window are appended to the server again, the stream adapter
skips what the server already holds, and the ingest resumes above the newest recorded ``time_us``
(the generator's clock continues above it; an upstream is asked for ``cursor = newest − rewind``
and the overlap is dropped).

The media driver: ``--driver auto`` (default) connects to a live driver in ``--driver-dir``
(default ``LOGBUF_DIR`` or /dev/shm/logbuf-<user>) and otherwise starts one embedded in this
process (``MediaDriver.launch`` + ``start``: its conductor on a thread) in that directory, removed
at shutdown; ``embedded`` and ``external`` force one or the other.
``--role ingest`` / ``--role serve`` split the relay over two processes sharing a driver.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import structlog
from prometheus_client.core import Metric

from logbuf.client import Subscription
from logbuf.durations import duration_argument, format_duration_ns
from logbuf.errors import LogbufError
from logbuf.jetstream import BUNDLED_ZSTD_DICTIONARY
from logbuf.jetstream.backfill import (
    BackfillError,
    BackfillPlan,
    BackgroundBackfill,
    newest_recorded_time_us,
    plan_backfill,
)
from logbuf.jetstream.generator import EventGenerator
from logbuf.jetstream.http import DEFAULT_METRICS_PORT
from logbuf.jetstream.ingest import (
    DEFAULT_REWIND_S,
    GeneratorSource,
    OriginClock,
    Sequencer,
    Source,
    UpstreamSource,
    check_rate,
    check_upstream_url,
)
from logbuf.jetstream.limits import (
    DEFAULT_CLIENT_MESSAGE_BURST,
    DEFAULT_MAX_CLIENT_MESSAGE_BYTES_PER_S,
    DEFAULT_MAX_CLIENT_MESSAGES_PER_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_IP,
    DEFAULT_MAX_EVENTS_PER_IP_S,
)
from logbuf.jetstream.stream import EventStreamAdapter
from logbuf.jetstream.stream_lock import StreamTakenError
from logbuf.jetstream.supervisor import DETACH_TIMEOUT_S, RelayStopped, Supervisor, SupervisorSettings
from logbuf.logging_config import configure_logging

__all__ = ["main", "build_parser"]

DEFAULT_CHANNEL = "aeron:ipc"
DEFAULT_STREAM_ID = 6008
"""Stream id of the event stream (jetstream's port number, easy to remember)."""
DEFAULT_PORT = 6008
DEFAULT_RATE = 500.0
"""Events per second of the built-in generator: the live network's order of magnitude (300–500/s)."""
DEFAULT_DRIVER_TIMEOUT_NS = 10_000_000_000
"""The media driver's own default driver and client liveness timeouts."""


_duration_ns = duration_argument("s", positive=True)
"""Relay durations: a bare number is seconds; 0 and negatives are refused."""


def _rate(text: str) -> float:
    try:
        return check_rate(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _upstream(text: str) -> str:
    try:
        return check_upstream_url(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0..65535")
    return port


def _positive_rate(text: str) -> float:
    rate = _rate(text)
    if rate == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return rate


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def _optional_port(text: str) -> int | None:
    return None if text.strip().lower() in ("off", "none") else _port(text)


def _stream_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer stream id") from None
    if not -(1 << 31) <= value < (1 << 31):
        raise argparse.ArgumentTypeError(f"stream id {value} is not a 32-bit signed integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="logbuf-jetstream",
        description="A jetstream relay: follows an upstream jetstream (or, with no --upstream, a built-in "
        "generator of realistic synthetic events), publishes every event into a logbuf stream "
        "and serves the jetstream v1 /subscribe protocol from it.",
    )
    src = p.add_argument_group("source")
    src.add_argument(
        "--upstream",
        type=_upstream,
        default=None,
        metavar="URL",
        help="upstream jetstream to follow, e.g. wss://jetstream2.us-west.bsky.network/subscribe "
        "(uncompressed; filters in its query are kept). Default: the built-in generator",
    )
    src.add_argument(
        "--rate",
        type=_rate,
        default=DEFAULT_RATE,
        help="generator events per second; 0 = as fast as the stream takes them (default: %(default)g)",
    )
    src.add_argument("--seed", type=int, default=0, help="generator random seed (default: %(default)s)")
    src.add_argument(
        "--rewind",
        type=_duration_ns,
        default=round(DEFAULT_REWIND_S * 1e9),
        metavar="DURATION",
        help="on reconnect, ask the upstream for events from the last time_us minus this "
        f"(duplicates are dropped; default: {DEFAULT_REWIND_S:g}s)",
    )
    srv = p.add_argument_group("server")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on, 0.0.0.0 for all (default: %(default)s)")
    srv.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help="port to listen on, 0 = any free port (default: %(default)s)"
    )
    srv.add_argument(
        "--reuse-port",
        action="store_true",
        help="listen with SO_REUSEPORT: run several --role serve workers on one port (each its own "
        "--data-dir and --metrics-port); the kernel spreads clients over them, limits are per worker",
    )
    srv.add_argument(
        "--data-dir",
        default=None,
        help="directory for the frame files (default: a temporary directory removed at exit)",
    )
    srv.add_argument(
        "--retention",
        type=_duration_ns,
        default=None,
        metavar="DURATION",
        help="how long events are kept for cursor replay, e.g. 24h (default: the server's, 24h)",
    )
    srv.add_argument(
        "--zstd-dictionary",
        default=BUNDLED_ZSTD_DICTIONARY,
        metavar="FILE",
        help="zstd dictionary for compress=true clients (default: jetstream's own, bundled with the package)",
    )
    srv.add_argument(
        "--no-compression",
        action="store_true",
        help="refuse compress=true (400) and do not keep the compressed frame file",
    )
    srv.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address of the Prometheus /metrics listener (default: %(default)s; jetstream listens on all)",
    )
    srv.add_argument(
        "--metrics-port",
        type=_optional_port,
        default=DEFAULT_METRICS_PORT,
        metavar="PORT",
        help="port of the /metrics listener, 0 = any free port, off = none (default: %(default)s, jetstream's)",
    )
    srv.add_argument(
        "--tls-cert",
        default=None,
        metavar="FILE",
        help="PEM certificate chain: serve wss:// (TLS 1.2+) on --port, for operators without a proxy "
        "(needs --tls-key; default: plain ws://, e.g. behind nginx or Caddy)",
    )
    srv.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key of --tls-cert")
    srv.add_argument(
        "--metrics-tls",
        action="store_true",
        help="serve the /metrics listener over TLS too, with the same certificate (default: plain)",
    )
    lim = p.add_argument_group("limits (per client address: behind a proxy, see --trusted-proxy)")
    lim.add_argument(
        "--max-connections-per-ip",
        type=_positive_int,
        default=DEFAULT_MAX_CONNECTIONS_PER_IP,
        metavar="N",
        help="connections from one address; more get HTTP 429 (default: %(default)s, jetstream's)",
    )
    lim.add_argument(
        "--max-connections",
        type=_positive_int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="connections in all; more get HTTP 503 (default: %(default)s; mind the open-files limit)",
    )
    lim.add_argument(
        "--max-events-per-ip",
        type=_rate,
        default=DEFAULT_MAX_EVENTS_PER_IP_S,
        metavar="RATE",
        help="events per second sent to one address, shared by its connections (a token bucket that delays, "
        "never drops; 0 = no limit; default: %(default)g, jetstream's)",
    )
    lim.add_argument(
        "--max-client-messages",
        type=_positive_rate,
        default=DEFAULT_MAX_CLIENT_MESSAGES_PER_S,
        metavar="RATE",
        help="options_update messages per second per connection, sustained (more close it with 1008; "
        "default: %(default)g)",
    )
    lim.add_argument(
        "--client-message-burst",
        type=_positive_int,
        default=DEFAULT_CLIENT_MESSAGE_BURST,
        metavar="N",
        help="client messages a connection may send at once (default: %(default)s)",
    )
    lim.add_argument(
        "--max-client-message-bytes",
        type=_positive_rate,
        default=DEFAULT_MAX_CLIENT_MESSAGE_BYTES_PER_S,
        metavar="RATE",
        help="client message bytes per second per connection, sustained; the burst is one largest message, "
        "1 MB (more close it with 1008; default: %(default)g, a 10,000-DID update every ~4 s)",
    )
    lim.add_argument(
        "--trusted-proxy",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="a reverse proxy (address or network, e.g. 127.0.0.1 or 10.0.0.0/8; repeatable) whose "
        "X-Forwarded-For / X-Real-IP name the client; other peers' headers are ignored",
    )
    st = p.add_argument_group("stream and driver")
    st.add_argument("--channel", default=DEFAULT_CHANNEL, help="channel of the event stream (default: %(default)s)")
    st.add_argument(
        "--stream-id",
        type=_stream_id,
        default=DEFAULT_STREAM_ID,
        help="stream id of the event stream (default: %(default)s)",
    )
    st.add_argument(
        "--topics-stream-id",
        type=_stream_id,
        default=None,
        metavar="STREAM_ID",
        help="also publish each event on this stream of --channel with its collection (e.g. app.bsky.feed.post; "
        "identity, account) as the topic, for topic subscribers (wildcards: app.bsky.feed.*, app.bsky.>); "
        "copies are dropped and counted while no topic subscriber exists (default: off)",
    )
    st.add_argument(
        "--driver",
        choices=("auto", "embedded", "external"),
        default="auto",
        help="auto: use a live driver in --driver-dir, else start one embedded; "
        "external: require a running driver; embedded: always start one here (default: %(default)s)",
    )
    st.add_argument(
        "--driver-dir", default=None, help="media driver directory (default LOGBUF_DIR or /dev/shm/logbuf-<user>)"
    )
    st.add_argument(
        "--driver-timeout",
        type=_duration_ns,
        default=DEFAULT_DRIVER_TIMEOUT_NS,
        metavar="DURATION",
        help="a driver silent this long is lost (the relay reconnects, or restarts its embedded one, and "
        f"serves on from its files); also the embedded driver's client liveness timeout (default: "
        f"{format_duration_ns(DEFAULT_DRIVER_TIMEOUT_NS)})",
    )
    st.add_argument(
        "--role",
        choices=("all", "ingest", "serve"),
        default="all",
        help="ingest: only publish into the stream; serve: only serve what the stream carries "
        "(default: %(default)s, both)",
    )
    st.add_argument(
        "--record",
        default=None,
        metavar="ARCHIVE_DIR",
        help="also record the event stream into this archive directory; at start, its recorded events "
        "of the retention window are served again (cursor replay) and the ingest resumes after them",
    )
    p.add_argument(
        "--duration", type=_duration_ns, default=None, help="stop after this long (default: run until SIGINT/SIGTERM)"
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="log level; JSON lines on stderr unless it is a terminal (default: %(default)s)",
    )
    return p


@dataclass
class _Running:
    """Everything started, for shutdown in reverse order."""

    supervisor: Supervisor | None = None
    server: Any = None
    server_thread: threading.Thread | None = None
    adapter: EventStreamAdapter | None = None
    backfill: BackgroundBackfill | None = None
    recorder: Any = None
    recorder_thread: threading.Thread | None = None
    temp_data_dir: str | None = None


def _make_source(args: argparse.Namespace, floor_us: int) -> Source:
    """The ingest's source; nothing at or below ``floor_us`` (the newest event already held) is published again."""
    if args.upstream is None:
        return GeneratorSource(EventGenerator(args.seed), args.rate, clock=OriginClock(last_us=floor_us))
    return UpstreamSource(args.upstream, Sequencer(rewind_us=args.rewind // 1_000, floor_us=floor_us))


def _make_server(args: argparse.Namespace, run: _Running) -> Any:
    from logbuf.jetstream.server import RelayConfig, RelayServer  # the serving side (imported only when serving)

    data_dir = args.data_dir
    if data_dir is None:
        data_dir = run.temp_data_dir = tempfile.mkdtemp(prefix="logbuf-jetstream-")
    options: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "data_dir": data_dir,
        "zstd_dictionary": None if args.no_compression else args.zstd_dictionary,
        "metrics_host": args.metrics_host,
        "metrics_port": args.metrics_port,
        "max_connections_per_ip": args.max_connections_per_ip,
        "max_connections": args.max_connections,
        "max_events_per_ip_s": args.max_events_per_ip,
        "max_client_messages_per_s": args.max_client_messages,
        "client_message_burst": args.client_message_burst,
        "max_client_message_bytes_per_s": args.max_client_message_bytes,
        "trusted_proxies": tuple(args.trusted_proxy),
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "metrics_tls": args.metrics_tls,
        "reuse_port": args.reuse_port,
    }
    if args.retention is not None:
        options["retention_ns"] = args.retention
    run.server = RelayServer(RelayConfig(**options))
    return run.server


def _start_server(args: argparse.Namespace, run: _Running, plan: BackfillPlan | None, log: Any) -> None:
    """Listen at once; with a plan, load the recorded events in the background (the live stream waits)."""
    from logbuf.jetstream.metrics import BACKFILL_METRICS, INGEST_METRICS, STREAM_METRICS, stats_metrics

    server = run.server
    run.adapter = adapter = EventStreamAdapter(None, server.append)
    if plan is not None:
        adapter.paused = True

        def backfilled() -> None:  # on the loop thread, after the last recorded event
            adapter.stats.last_time_us = max(adapter.stats.last_time_us, server.store.last_time_us)
            adapter.paused = False
            server.end_backfill()

        run.backfill = background = BackgroundBackfill(
            plan, server.append, backfilled, compressor=server.store.make_compressor()
        )
        server.begin_backfill()
        server.add_duty(background)

        def backfill_metrics() -> Iterator[Metric]:
            result = background.result
            values = {**result.snapshot(), "duration_seconds": result.duration_s, "running": int(not background.done)}
            yield from stats_metrics("backfill", BACKFILL_METRICS, values)

        server.add_metrics_source(backfill_metrics)
    server.add_duty(adapter)
    server.add_metrics_source(lambda: stats_metrics("stream", STREAM_METRICS, adapter.stats.__dict__))

    def ingest_metrics() -> Iterator[Metric]:
        ingest = None if run.supervisor is None else run.supervisor.ingest
        if ingest is not None:  # this process ingests (--role all)
            yield from stats_metrics("ingest", INGEST_METRICS, ingest.stats.snapshot())

    server.add_metrics_source(ingest_metrics)
    run.server_thread = server.start()
    host, port = server.address
    metrics = server.metrics_address
    ws, http = ("wss", "https" if server.config.metrics_tls else "http") if server.tls else ("ws", "http")
    log.info(
        "jetstream.listening",
        host=host,
        port=port,
        url=f"{ws}://{host}:{port}/subscribe",
        metrics_url=None if metrics is None else f"{http}://{metrics[0]}:{metrics[1]}/metrics",
        data_dir=server.config.data_dir,
        compressed=server.store.compressed,
        backfilling=plan is not None,
    )
    if run.backfill is not None:
        run.backfill.start()  # after the relay listens: clients connect while the history loads


def _attach_to_server(run: _Running) -> Callable[[Subscription | None], None]:
    """Swap the server's subscription on its loop thread and wait for it (a reconnect to the driver)."""

    def attach(subscription: Subscription | None) -> None:
        done = threading.Event()
        server, adapter = run.server, run.adapter
        if server is None or adapter is None:
            return

        def swap() -> None:
            adapter.resubscribe(subscription)
            done.set()

        if run.server_thread is None or not run.server_thread.is_alive():
            swap()  # no loop (stopped, or not started yet): nothing polls the adapter meanwhile
            return
        server.call_soon_threadsafe(swap)
        if not done.wait(DETACH_TIMEOUT_S) and run.server_thread is not None and run.server_thread.is_alive():
            raise LogbufError("the relay's loop did not take the new subscription in time")

    return attach


def _start_recorder(args: argparse.Namespace, run: _Running, driver_dir: str) -> None:
    """Record the event stream; subscribed before the ingest publishes (it records from the first event)."""
    from logbuf.archive.recorder import Recorder, RecorderContext

    recorder = Recorder(
        RecorderContext(
            archive_dir=args.record,
            channel=args.channel,
            stream_id=args.stream_id,
            driver_dir=driver_dir,
            driver_timeout_ns=args.driver_timeout,
        )
    )
    recorder.connect()
    run.recorder = recorder
    run.recorder_thread = threading.Thread(target=recorder.run, name="jetstream-recorder", daemon=True)
    run.recorder_thread.start()


def _shutdown(run: _Running, log: Any) -> None:
    supervisor = run.supervisor
    if supervisor is not None and supervisor.ingest is not None:
        supervisor.ingest.stop()
        log.info("jetstream.ingest_stats", **supervisor.ingest.stats.snapshot())
    if run.backfill is not None:
        run.backfill.stop()
    if run.server is not None:
        run.server.stop()
        if run.server_thread is not None:
            run.server_thread.join(10)
        if run.adapter is not None:
            log.info("jetstream.stream_stats", **run.adapter.stats.__dict__)
    if run.recorder is not None:
        run.recorder.stop()
        if run.recorder_thread is not None:
            run.recorder_thread.join(10)
    if supervisor is not None:
        supervisor.close()
    if run.temp_data_dir is not None:
        shutil.rmtree(run.temp_data_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.topics_stream_id is not None and args.topics_stream_id == args.stream_id:
        parser.error(
            f"--topics-stream-id {args.topics_stream_id} must differ from --stream-id (a topic stream's "
            "reserved value is the topic id, the event stream's is time_us)"
        )
    configure_logging(args.log_level)
    log = structlog.get_logger().bind(role="jetstream")
    if args.record is not None and not os.path.isabs(args.record):
        args.record = os.path.abspath(args.record)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    run = _Running()
    status = 0
    serving = args.role in ("all", "serve")
    publishing = args.role in ("all", "ingest")
    initial_floor = 0
    try:
        plan: BackfillPlan | None = None
        if serving:
            server = _make_server(args, run)
            if args.record is not None:  # quick: lists the recordings and finds the newest event
                plan = plan_backfill(
                    args.record,
                    args.channel,
                    args.stream_id,
                    retention_ns=server.config.retention_ns,
                )
                initial_floor = plan.newest_us
            _start_server(args, run, plan, log)
        elif args.record is not None:  # --role ingest: resume above what the archive holds
            initial_floor = newest_recorded_time_us(args.record, args.channel, args.stream_id)

        def floor_us() -> int:
            """Where a new ingest starts after a reconnect: above what the relay already holds. A serving
            relay holds what its server appended, not what its ingest published: events published into
            the lost session's log but not yet read from it are gone with that log and must come again."""
            if run.server is not None:
                held: int = run.server.store.last_time_us
                return max(initial_floor, held)
            published = 0 if run.supervisor is None else run.supervisor.last_ingest_time_us
            return max(initial_floor, published)

        holder = f"role={args.role}"
        if run.server is not None:
            holder += " listening on {}:{}".format(*run.server.address)
        run.supervisor = supervisor = Supervisor(
            SupervisorSettings(
                driver_mode=args.driver,
                driver_dir=args.driver_dir,
                driver_timeout_ns=args.driver_timeout,
                channel=args.channel,
                stream_id=args.stream_id,
                publish=publishing,
                subscribe=serving,
                holder=holder,
                topics_stream_id=args.topics_stream_id,
            ),
            make_source=(lambda floor: _make_source(args, floor)) if publishing else None,
            floor_us=floor_us,
            attach=_attach_to_server(run),
            log=log,
        )
        if args.record is not None:
            supervisor.ensure_driver()
            _start_recorder(args, run, supervisor.directory)
        supervisor.start(initial_floor)
        log.info(
            "jetstream.started",
            source=args.upstream or "generator",
            rate=args.rate if args.upstream is None else None,
            channel=args.channel,
            stream_id=args.stream_id,
            relay_role=args.role,
            floor_us=initial_floor if publishing else None,
        )
        deadline = None if args.duration is None else time.monotonic() + args.duration / 1e9
        while not stop.wait(0.2):
            if deadline is not None and time.monotonic() >= deadline:
                break
            if run.server_thread is not None and not run.server_thread.is_alive():
                log.error("jetstream.server_stopped")
                status = 1
                break
            try:
                supervisor.poll()
            except RelayStopped as e:
                log.error("jetstream.failed", error=str(e))
                print(f"logbuf-jetstream: {e}", file=sys.stderr)
                status = 1
                break
    except (LogbufError, BackfillError, StreamTakenError, OSError, ValueError) as e:
        log.error("jetstream.start_failed", error=str(e))
        print(f"logbuf-jetstream: {e}", file=sys.stderr)
        status = 2
    finally:
        _shutdown(run, log)
        log.info("jetstream.stopped", status=status)
    return status


if __name__ == "__main__":
    sys.exit(main())
