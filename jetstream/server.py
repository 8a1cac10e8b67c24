"""The relay server: jetstream's v1 ``/subscribe`` for many websocket clients, from one epoll loop.

Theory of operation (``protocol_spec/jetstream-relay.md`` has the details):

* One thread runs everything: ``epoll`` over the listening socket and every connection, the duties
  (the ingest side's stream subscription, which calls :meth:`RelayServer.append`), a pass of the
  fan-out engine (:mod:`jetstream.fanout`) at most every ``flush_interval_ns``, and timers (handshake
  and close deadlines, pings, write timeouts, retention). Nothing blocks: sockets are non-blocking.
* Each event is stored once per encoding (:mod:`jetstream.store`) as a ready websocket frame; clients
  are byte cursors into the frame files and get them with ``os.sendfile``.
* HTTP requests and client frames are parsed by ``websockets``' sans-IO ``ServerProtocol`` (request
  limits, upgrade validation and the 101 response, frame parsing with the 10 MB message cap, ping
  answers, close handshake). Its output (responses, pongs, pings, close frames) is queued and written
  between our frames; the events themselves never go through it.
* Per connection: HANDSHAKE (bounded by ``handshake_timeout_ns``) → HELD (``requireHello``) →
  STREAMING → CLOSING (a last response or close frame queued) → LINGER (write side shut, read until
  the peer closes, at most ``close_timeout_ns``) → closed.

Client messages (``options_update``) never hold up the fan-out. Reading client bytes takes at most
``READ_SLICE_NS`` of an iteration (connections left over are read first next time); a complete
message is checked against its connection's message rates (:class:`jetstream.limits.MessageBucket`:
over them, close 1008) and *queued*. Queued messages are parsed round-robin over the connections (one
message of each in turn, each connection's in order) for at most ``PARSE_SLICE_NS`` an iteration (at
least one), before the fan-out pass; their bytes stay counted in ``max_incoming_bytes`` until then, and
the rates bound what one connection can queue.
A flood of 10,000-DID updates from thousands of connections thus costs each iteration a bounded slice,
and live clients keep receiving at the flush interval; the flooders are closed by their rate.
When the budget is full, a newcomer's message or request head makes room by closing the connection
holding the most input, if it holds over twice what the newcomer would (:meth:`RelayServer._make_room`): an
honest client's small update is applied while flooders hold the budget.

Errors follow jetstream: bad query → plain-text 400 before the upgrade; a bad client message →
close 1007 (not JSON / bad payload JSON) or 1008 (fails validation, reason cut to 123 bytes); a
message over ``max_client_message_length`` → 1009; over the message rate → 1008; shutdown → 1001.
Connections over the per-IP limit get 429, over the total limit 503. Everything is counted (:mod:`jetstream.metrics`); only lifecycle is logged.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import select
import socket
import ssl
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import structlog
from prometheus_client import CollectorRegistry
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State as ProtocolState
from websockets.server import ServerProtocol

from logbuf.durations import renamed_duration_keywords
from logbuf.errors import ConfigurationError

from . import BUNDLED_ZSTD_DICTIONARY
from .events import EventMeta
from .fanout import FanOut, Subscriber
from .filters import (
    MAX_CLIENT_MESSAGE_LENGTH,
    OptionsError,
    OptionsUpdateDecodeError,
    SubscriberOptions,
    parse_options_update,
    parse_query,
    truncate_close_reason,
)
from .http import (
    DEFAULT_METRICS_PORT,
    METRICS_PATH,
    SUBSCRIBE_PATH,
    WELCOME_PATH,
    WELCOME_TEXT,
    head_response,
    method_not_allowed,
    metrics_response,
    preflight_response,
    split_target,
    text_response,
    with_cors,
)
from .limits import (
    DEFAULT_CLIENT_MESSAGE_BURST,
    DEFAULT_MAX_CLIENT_MESSAGE_BYTES_PER_S,
    DEFAULT_MAX_CLIENT_MESSAGES_PER_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_IP,
    DEFAULT_MAX_EVENTS_PER_IP_S,
    EventRateLimiter,
    MessageBucket,
)
from .metrics import MetricsSnapshot, MetricsSource, RelayCollector, RelayCounters
from .proxy import TrustedProxies, normalize_ip
from .store import PLAIN, ZSTD, FrameStore
from .subscriber_state import READING_FRAMES, UPGRADED, Input, State
from .tls import TlsSession, make_server_context

__all__ = ["CLOSE_GOING_AWAY", "CLOSE_INVALID_PAYLOAD", "CLOSE_POLICY_VIOLATION", "RelayConfig", "RelayServer"]

CLOSE_GOING_AWAY: Final = 1001
CLOSE_INVALID_PAYLOAD: Final = 1007
CLOSE_POLICY_VIOLATION: Final = 1008
SHUTDOWN_REASON: Final = "server shutting down"
TOO_SLOW_REASON: Final = "consumer too slow: cursor fell behind retention"
MESSAGE_RATE_REASON: Final = (
    "client message rate exceeded: at most {burst} messages or {bytes_burst} bytes at once, "
    "then {rate:g} messages and {bytes_rate:g} bytes per second"
)
TIMER_PERIOD_NS: Final = 100_000_000  # handshake and linger deadlines
SLOW_TIMER_PERIOD_NS: Final = 1_000_000_000  # pings and write timeouts
ACCEPT_BATCH: Final = 256
READS_PER_EVENT: Final = 16
#: Reading client bytes stops for this iteration after this long (connections left are read first next
#: iteration; the metrics port's are always read): floods of client input cannot delay the fan-out pass.
READ_SLICE_NS: Final = 10_000_000
#: Parsing queued client messages stops for this iteration after this long (at least one is parsed).
PARSE_SLICE_NS: Final = 5_000_000
RECV_SIZE: Final = 65536
MAX_EPOLL_EVENTS: Final = 4096
#: A request head (request line and headers) longer than this is answered 431 (websockets' own limits,
#: 8 KiB a line and 128 headers, answer 414/431 first for one long line); it bounds a handshake's memory.
MAX_REQUEST_HEAD_LENGTH: Final = 32 * 1024
HEAD_TOO_LARGE_TEXT: Final = "request head too large"
BUSY_TEXT: Final = "relay busy: too much unfinished input from clients"
#: A full client-input budget makes room for a connection's input by closing one that holds more than this
#: many times what the newcomer would hold (an honest update is hundreds of bytes, a flooder's ~360 kB).
DISPLACE_FACTOR: Final = 2
#: Close reason for the connection closed to make room in a full client-input budget (code 1009).
EVICTED_TEXT: Final = "relay busy: this connection holds the most unfinished input"
CLOSE_MESSAGE_TOO_BIG: Final = 1009
#: Client messages are small (``options_update``): 1 MB (decimal, as jetstream's 10 MB) by default.
DEFAULT_MAX_CLIENT_MESSAGE_LENGTH: Final = 1_000_000
#: Listener kinds: the public port (/, /subscribe) and the metrics port (/metrics).
PUBLIC: Final = 0
METRICS: Final = 1
#: Concurrent connections to the metrics port (scrapers); more get 503.
MAX_METRICS_CONNECTIONS: Final = 64
#: Addresses whose departed clients' totals are kept apart in the per-address metrics; later ones are
#: summed under ``other`` (a bound on what clients from many addresses can make the relay remember).
MAX_DEPARTED_ADDRESSES: Final = 10_000
OTHER_ADDRESSES: Final = "other"
#: Distinct unexpected connection errors logged (each once); all are counted.
MAX_DISTINCT_ERRORS_LOGGED: Final = 100

# websockets' sans-IO protocol logs "connection open" etc. at INFO per connection: keep that quiet.
_WS_LOGGER = logging.getLogger("jetstream.relay.websocket")
_WS_LOGGER.setLevel(logging.WARNING)


_RENAMED = (
    "retention_check",
    "handshake_timeout",
    "close_timeout",
    "ping_interval",
    "write_timeout",
    "flush_interval",
    "client_message_timeout",
)
"""Durations that were float seconds (``*_s``) before they took ``_ns``."""


@renamed_duration_keywords(
    {"retention": ("retention_ns", 1_000_000_000), **{name + "_s": (name + "_ns", 1_000_000_000) for name in _RENAMED}}
)
@dataclass
class RelayConfig:
    """The relay's settings; :meth:`validate` checks them all (errors name the setting and value).

    ``retention_ns`` / ``retention_bytes``: keep events at most this much older than the newest / this
    many bytes of plain frames (either or both; at least one). ``flush_interval_ns``: the shortest time
    between two passes over the subscribers: longer batches more events per ``sendfile`` (less CPU per
    client), shorter lowers the added latency. ``write_timeout_ns``: drop a client whose socket took no
    byte for that long (0: never; retention still drops it when it falls behind).
    ``zstd_dictionary``: the dictionary for ``compress=true`` (default jetstream's, bundled; None: refuse
    compression and keep no compressed file, saving one compression per event).
    ``metrics_host`` / ``metrics_port``: the Prometheus listener (None: none); its answers name client
    addresses, so it listens on localhost unless told otherwise.
    ``max_connections_per_ip`` / ``max_connections``: connections from one client address (429 beyond) /
    in all (503 beyond). ``trusted_proxies``: addresses or networks whose ``X-Forwarded-For`` /
    ``X-Real-IP`` name the client (:mod:`jetstream.proxy`); without it, behind a proxy every client has
    the proxy's address and shares its limits. ``max_events_per_ip_s``: jetstream's per-address token
    bucket, events per second shared by an address's connections (also the burst; 0: off): it delays,
    never drops; a client held back long enough falls behind retention like any slow client.
    ``max_client_message_length``: the longest client message (an ``options_update``; 10,000 DIDs take
    about 350 kB): a frame header declaring more closes the connection with 1009 before anything of it is
    buffered (jetstream allows 10 MB; a lower cap bounds what each connection can make the relay hold).
    ``max_incoming_bytes``: what all connections together may have declared and not yet finished (and
    request heads in progress): a declaration past it closes that connection with 1009 (a request head,
    503). ``client_message_timeout_ns``: a message must finish this long after it began, or 1008.
    ``max_client_messages_per_s`` / ``client_message_burst`` and ``max_client_message_bytes_per_s`` (burst:
    ``max_client_message_length``): each connection's token buckets of client messages
    (``options_update``; binary and unknown messages count too) and of their bytes: a message over either
    closes the connection with 1008 (``client message rate exceeded: ...``) before it is parsed, counted
    as ``clients_dropped{reason="client_message_rate"}``. Honest clients send one update at connect and
    one per change of filters; higher rates let each connection make the relay parse more (a 10,000-DID
    update is ~360 kB and takes milliseconds; queued ones are parsed in bounded slices, see the module
    docstring).
    ``socket_send_buffer_bytes``: each client socket's SO_SNDBUF (0: the kernel's autotuning). The frame
    file is the buffer: a small socket buffer keeps kernel memory per client bounded (thousands of
    clients with autotuned multi-MB buffers push the kernel into TCP memory pressure, which stalls
    everyone); larger speeds up catching up over long round trips.
    ``tls_cert`` / ``tls_key``: PEM certificate chain and key: the public listener speaks TLS only
    (``wss://``; :mod:`jetstream.tls`); ``metrics_tls``: the metrics listener too. TLS clients cannot be
    fed by ``sendfile``: each costs a copy and encryption per byte (a proxy in front scales further).
    ``reuse_port``: listen with ``SO_REUSEPORT``, so that several relay processes (serving workers, each
    subscribed to the same event stream with its own ``data_dir``) share one port and the kernel spreads
    new connections over them: one process is one core and one file-descriptor limit, workers add both.
    Connection limits and the per-address token bucket are then per worker.
    """

    data_dir: str
    host: str = "127.0.0.1"
    port: int = 6008
    retention_ns: int | None = 86_400 * 1_000_000_000
    retention_bytes: int | None = None
    retention_check_ns: int = 1_000_000_000
    zstd_dictionary: str | None = BUNDLED_ZSTD_DICTIONARY
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = DEFAULT_METRICS_PORT
    max_connections_per_ip: int = DEFAULT_MAX_CONNECTIONS_PER_IP
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    trusted_proxies: tuple[str, ...] = ()
    max_events_per_ip_s: float = DEFAULT_MAX_EVENTS_PER_IP_S
    handshake_timeout_ns: int = 10_000_000_000
    close_timeout_ns: int = 2_000_000_000
    ping_interval_ns: int = 30_000_000_000
    write_timeout_ns: int = 10_000_000_000
    flush_interval_ns: int = 50_000_000
    socket_send_buffer_bytes: int = 256 * 1024
    tls_cert: str | None = None
    tls_key: str | None = None
    metrics_tls: bool = False
    max_client_message_length: int = DEFAULT_MAX_CLIENT_MESSAGE_LENGTH
    max_incoming_bytes: int = 64 * 1024 * 1024
    client_message_timeout_ns: int = 10_000_000_000
    max_client_messages_per_s: float = DEFAULT_MAX_CLIENT_MESSAGES_PER_S
    client_message_burst: int = DEFAULT_CLIENT_MESSAGE_BURST
    max_client_message_bytes_per_s: float = DEFAULT_MAX_CLIENT_MESSAGE_BYTES_PER_S
    listen_backlog: int = 4096
    reuse_port: bool = False

    def validate(self) -> None:
        def positive(name: str, value: float, *, allow_zero: bool = False) -> None:
            ok = value >= 0 if allow_zero else value > 0
            if not ok or (isinstance(value, float) and not math.isfinite(value)):
                raise ConfigurationError(f"{name}={value!r} must be {'>= 0' if allow_zero else '> 0'}")

        if not self.data_dir:
            raise ConfigurationError("data_dir must be set (a directory for the frame files)")
        if not 0 <= self.port <= 65535:
            raise ConfigurationError(f"port={self.port} must be 0..65535 (0: any free port)")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigurationError(
                f"metrics_port={self.metrics_port} must be 0..65535 (0: any free port) or None (no metrics listener)"
            )
        if self.retention_ns is None and self.retention_bytes is None:
            raise ConfigurationError("retention_ns and retention_bytes are both None: set at least one")
        if self.retention_ns is not None:
            positive("retention_ns", self.retention_ns)
        if self.retention_bytes is not None:
            positive("retention_bytes", self.retention_bytes)
        positive("retention_check_ns", self.retention_check_ns)
        positive("max_connections_per_ip", self.max_connections_per_ip)
        positive("max_connections", self.max_connections)
        positive("max_events_per_ip_s", self.max_events_per_ip_s, allow_zero=True)
        try:
            TrustedProxies(self.trusted_proxies)
        except ValueError as exc:
            raise ConfigurationError(f"trusted_proxies: {exc}") from None
        positive("handshake_timeout_ns", self.handshake_timeout_ns)
        positive("close_timeout_ns", self.close_timeout_ns)
        positive("ping_interval_ns", self.ping_interval_ns)
        positive("write_timeout_ns", self.write_timeout_ns, allow_zero=True)
        positive("flush_interval_ns", self.flush_interval_ns, allow_zero=True)
        positive("max_client_message_length", self.max_client_message_length)
        if self.max_client_message_length > MAX_CLIENT_MESSAGE_LENGTH:
            raise ConfigurationError(
                f"max_client_message_length={self.max_client_message_length} is over jetstream's "
                f"{MAX_CLIENT_MESSAGE_LENGTH} bytes"
            )
        positive("max_incoming_bytes", self.max_incoming_bytes)
        if self.max_incoming_bytes < self.max_client_message_length:
            raise ConfigurationError(
                f"max_incoming_bytes={self.max_incoming_bytes} must be at least "
                f"max_client_message_length={self.max_client_message_length}"
            )
        positive("client_message_timeout_ns", self.client_message_timeout_ns)
        positive("max_client_messages_per_s", self.max_client_messages_per_s)
        positive("client_message_burst", self.client_message_burst)
        positive("max_client_message_bytes_per_s", self.max_client_message_bytes_per_s)
        if self.client_message_burst != int(self.client_message_burst):
            raise ConfigurationError(f"client_message_burst={self.client_message_burst!r} must be an integer")
        positive("listen_backlog", self.listen_backlog)
        positive("socket_send_buffer_bytes", self.socket_send_buffer_bytes, allow_zero=True)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigurationError(
                f"tls_cert={self.tls_cert!r} and tls_key={self.tls_key!r}: set both (TLS) or neither (plain)"
            )
        if self.tls_cert is not None and self.tls_key is not None:
            make_server_context(self.tls_cert, self.tls_key)
        elif self.metrics_tls:
            raise ConfigurationError("metrics_tls=True needs tls_cert and tls_key")
        if self.zstd_dictionary is not None and not os.path.isfile(self.zstd_dictionary):
            raise ConfigurationError(f"zstd_dictionary={self.zstd_dictionary!r} is not a readable file")


def _listen(host: str, port: int, backlog: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind((host, port))
        listener.listen(backlog)
    except OSError as exc:
        listener.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc}") from exc
    listener.setblocking(False)
    return listener


class RelayServer:
    """Serve ``/subscribe`` from the frame store; see the module docstring.

    ``append`` and duties run on the loop thread; other threads use :meth:`call_soon_threadsafe`.
    """

    def __init__(self, config: RelayConfig) -> None:
        config.validate()
        self.config = config
        dictionary: bytes | None = None
        if config.zstd_dictionary is not None:
            with open(config.zstd_dictionary, "rb") as f:
                dictionary = f.read()
        self.counters = RelayCounters()
        self.registry = CollectorRegistry()
        self._collector = RelayCollector(self._snapshot)
        self.registry.register(self._collector)
        self._log = structlog.get_logger().bind(role="jetstream-relay")
        self._listener = _listen(config.host, config.port, config.listen_backlog, reuse_port=config.reuse_port)
        self._metrics_listener: socket.socket | None = None
        if config.metrics_port is not None:
            try:
                self._metrics_listener = _listen(config.metrics_host, config.metrics_port, 64)
            except ConfigurationError:
                self._listener.close()
                raise
        self._epoll = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._tls: ssl.SSLContext | None = None
        if config.tls_cert is not None and config.tls_key is not None:
            self._tls = make_server_context(config.tls_cert, config.tls_key)
        self._tls_listeners = {self._listener.fileno()} if self._tls is not None else set()
        if self._metrics_listener is not None and config.metrics_tls:
            self._tls_listeners.add(self._metrics_listener.fileno())
        self._listeners: dict[int, tuple[socket.socket, int]] = {self._listener.fileno(): (self._listener, PUBLIC)}
        if self._metrics_listener is not None:
            self._listeners[self._metrics_listener.fileno()] = (self._metrics_listener, METRICS)
        for fd in self._listeners:
            self._epoll.register(fd, select.EPOLLIN)
        self._epoll.register(self._wake_fd, select.EPOLLIN)
        self.store = FrameStore(config.data_dir, zstd_dictionary=dictionary)
        self.proxies = TrustedProxies(config.trusted_proxies)
        self.limiter = EventRateLimiter(config.max_events_per_ip_s) if config.max_events_per_ip_s else None
        self.fanout = FanOut(self.store, self._drop, self._on_linger, self._failed, self.limiter)
        self._connections: dict[int, Subscriber] = {}
        self._handshaking: dict[int, Subscriber] = {}
        self._lingering: dict[int, Subscriber] = {}
        # Connections with input left to read, oldest first (a dict as an ordered set: fair under floods).
        self._read_again: dict[Subscriber, None] = {}
        # Client messages waiting to be parsed: per connection in order; connections in turn (round-robin).
        self._pending: dict[Subscriber, deque[bytes]] = {}
        self._pending_count = 0
        self._rate_reason = truncate_close_reason(
            MESSAGE_RATE_REASON.format(
                burst=config.client_message_burst,
                bytes_burst=config.max_client_message_length,
                rate=config.max_client_messages_per_s,
                bytes_rate=config.max_client_message_bytes_per_s,
            )
        )
        self._per_ip: Counter[str] = Counter()
        self._metrics_connections = 0
        self._duties: list[Callable[[], int]] = []
        self._calls: deque[Callable[[], None]] = deque()
        self._stop = threading.Event()
        self._dirty = False
        self._duty_work = 0
        self._accept_paused_until_ns = 0
        self._flush_interval_ns = config.flush_interval_ns
        self._next_flush_ns = 0
        self._next_timer_ns = 0
        self._next_slow_timer_ns = 0
        self._next_retention_ns = 0
        self._punch_warned = False
        self._errors_logged: set[str] = set()
        self._incoming_reserved = 0  # bytes held or declared by clients (max_incoming_bytes)
        self._backfilling = False
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- public API ------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """The public listener's (host, port)."""
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def tls(self) -> bool:
        """Whether the public listener speaks TLS (``wss://``)."""
        return self._tls is not None

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """The metrics listener's (host, port); None when it is off."""
        if self._metrics_listener is None:
            return None
        host, port = self._metrics_listener.getsockname()[:2]
        return str(host), int(port)

    def append(self, raw: bytes, meta: EventMeta, packed: bytes | None = None) -> None:
        """Store one event (loop thread). A ``time_us`` not above the newest one's is counted and dropped.
        ``packed``: the event already compressed with a ``store.make_compressor()`` compressor."""
        if self.store.append(raw, meta.time_us, meta.did, meta.collection, packed):
            self._dirty = True
        else:
            self.counters.events_rejected["non_increasing_time_us"] += 1

    @property
    def backfilling(self) -> bool:
        return self._backfilling

    def begin_backfill(self) -> None:
        """Recorded events are being appended while the relay serves (loop thread, or before
        :meth:`start`): until :meth:`end_backfill`, a client whose cursor is not loaded yet (or that
        asked for live events) is upgraded and WAITING; a cursor already loaded starts at once."""
        self._backfilling = True

    def end_backfill(self) -> None:
        """Every recorded event is in (loop thread): WAITING clients start at their cursor."""
        self._backfilling = False
        for sub in list(self.fanout.subscribers.values()):
            if sub.state is State.WAITING:
                sub.move(Input.BACKFILL_DONE)
                self.fanout.start(sub, self.store.seq_for_cursor(sub.options.cursor))
        self._dirty = True

    def _servable(self, cursor: int | None) -> bool:
        """Whether a client with this cursor can start now (always, unless a backfill is running and the
        first event at or after the cursor may not be loaded yet)."""
        if not self._backfilling:
            return True
        store = self.store
        return cursor is not None and store.next_seq > store.first_seq and cursor <= store.last_time_us

    def add_duty(self, duty: Callable[[], int]) -> None:
        """Call ``duty()`` every loop iteration; it returns its work count (0 lets the loop sleep ~1 ms)."""
        self._duties.append(duty)

    def add_metrics_source(self, source: MetricsSource) -> None:
        """Add ``source()``'s metrics to every ``/metrics`` answer (called on the loop thread at each
        scrape; e.g. the ingest's counters). Add sources before :meth:`start`."""
        self._collector.sources.append(source)

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop thread at its next iteration (from any thread)."""
        self._calls.append(fn)
        os.eventfd_write(self._wake_fd, 1)

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self.serve_forever, name="jetstream-relay", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close every client with 1001 and stop the loop (waits for it when it runs on another thread)."""
        self._stop.set()
        try:
            os.eventfd_write(self._wake_fd, 1)
        except OSError:
            pass
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def serve_forever(self) -> None:
        self._log.info(
            "relay.started", address=self.address, data_dir=self.config.data_dir, compressed=self.store.compressed
        )
        try:
            while not self._stop.is_set():
                self._iterate()
        except BaseException as exc:
            self._log.error("relay.failed", error=repr(exc))
            raise
        finally:
            try:
                self._duties = []  # a failing duty must not fail the goodbyes too
                self._shut_down()
            finally:
                self._close_everything()
                self._log.info("relay.stopped", events=self.store.next_seq)

    # -- the loop --------------------------------------------------------------------------------

    def _iterate(self, *, accepting: bool = True) -> None:
        now = time.monotonic_ns()
        if self._calls or self._read_again or self._duty_work or self._pending:
            timeout = 0.0
        elif self._dirty:
            timeout = max(0.0, (self._next_flush_ns - now) / 1e9)
        else:
            timeout = 0.001 if self._duties else 0.05
        timeout = min(timeout, max(0.0, (self._next_timer_ns - now) / 1e9))
        events = self._epoll.poll(timeout, MAX_EPOLL_EVENTS)
        listeners = self._listeners
        readable: list[Subscriber] = []
        for fd, mask in events:
            if fd in listeners:
                if accepting:
                    self._accept(*listeners[fd])
            elif fd == self._wake_fd:
                try:
                    os.eventfd_read(self._wake_fd)
                except BlockingIOError:
                    pass
            else:
                sub = self._connections.get(fd)
                if sub is None:
                    continue
                if mask & select.EPOLLOUT and not sub.writable:
                    sub.writable = True
                    sub.blocked_since_ns = 0
                    self._dirty = True
                if mask & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR | select.EPOLLRDHUP):
                    readable.append(sub)
        self._read_input(readable)
        if self._pending:
            self._parse_pending()
        while self._calls:
            self._calls.popleft()()
        work = 0
        for duty in self._duties:
            work += duty()
        self._duty_work = work
        self.counters.loop_iterations += 1
        now = time.monotonic_ns()
        if self._dirty and now >= self._next_flush_ns:
            self._dirty = False
            self.counters.flush_passes += 1
            if self.fanout.flush(now) or self.fanout.throttled:
                self._dirty = True  # someone may still be owed bytes (or tokens): look again next pass
            self._next_flush_ns = now + self._flush_interval_ns
        if now >= self._next_timer_ns:
            self._timers(now)
            self._next_timer_ns = now + TIMER_PERIOD_NS
        if accepting and self._accept_paused_until_ns and now >= self._accept_paused_until_ns:
            self._accept_paused_until_ns = 0
            for fd in listeners:
                self._epoll.register(fd, select.EPOLLIN)

    def _accept(self, listener: socket.socket, kind: int) -> None:
        cfg = self.config
        now = time.monotonic_ns()
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                self.counters.accept_errors += 1
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: stop accepting for 100 ms rather than spin on the listeners.
                    for fd in self._listeners:
                        self._epoll.unregister(fd)
                    self._accept_paused_until_ns = now + 100_000_000
                return
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if cfg.socket_send_buffer_bytes:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.socket_send_buffer_bytes)
            ip = normalize_ip(str(addr[0]))
            protocol = ServerProtocol(max_size=cfg.max_client_message_length, logger=_WS_LOGGER)
            sub = Subscriber(conn, ip, protocol, now + cfg.handshake_timeout_ns)
            sub.listener = kind
            if self._tls is not None and listener.fileno() in self._tls_listeners:
                sub.tls = TlsSession(self._tls)
            if kind == METRICS:
                if self._metrics_connections >= MAX_METRICS_CONNECTIONS:
                    sub.over_limit = "total"
                self._metrics_connections += 1
            else:
                # A trusted proxy's connections are counted per client once its request names the client.
                if not self.proxies.trusts(ip) and self._per_ip[ip] >= cfg.max_connections_per_ip:
                    sub.over_limit = "ip"
                elif len(self._connections) - self._metrics_connections >= cfg.max_connections:
                    sub.over_limit = "total"
                self._per_ip[ip] += 1
            self._connections[sub.fd] = sub
            self._handshaking[sub.fd] = sub
            self._epoll.register(sub.fd, select.EPOLLIN | select.EPOLLOUT | select.EPOLLRDHUP | select.EPOLLET)

    def _read_input(self, readable: list[Subscriber]) -> None:
        """Read the connections left over from the last iteration, then those epoll reported, for at most
        ``READ_SLICE_NS`` (the metrics port's always); the rest wait in ``_read_again``."""
        again = self._read_again
        deadline = time.monotonic_ns() + READ_SLICE_NS
        for sub in [*again, *readable]:
            if self._connections.get(sub.fd) is not sub:
                again.pop(sub, None)
            elif sub.listener == METRICS or time.monotonic_ns() < deadline:
                self._guarded(self._read, sub)
            elif sub not in again:
                again[sub] = None

    def _read(self, sub: Subscriber) -> None:
        self._read_again.pop(sub, None)
        for _ in range(READS_PER_EVENT):
            try:
                data = sub.sock.recv(RECV_SIZE)
            except BlockingIOError:
                return
            except OSError:
                self._close(sub)
                return
            if not data:  # the peer closed: nothing more can reach it
                self._close(sub)
                return
            if sub.tls is not None:
                data = self._decrypt(sub, data)
                if sub.fd not in self._connections:
                    return
                if not data:
                    continue
            if sub.state is State.LINGER or sub.state is State.CLOSING:
                # Our close frame or last response is out or queued: what comes is discarded. A peer may
                # finish a message it had begun, no more: one that keeps streaming is closed at once.
                sub.discarded += len(data)
                if sub.discarded > self.config.max_client_message_length:
                    self.counters.input_after_close += 1
                    self._close(sub)
                    return
                continue
            if sub.state is State.HANDSHAKE:
                self._on_head_bytes(sub, data)
            elif sub.state in READING_FRAMES:
                self._on_frame_bytes(sub, data)
            # CLOSING after an HTTP response: one request per connection, the rest is discarded
            if sub.fd not in self._connections:
                return
        self._read_again[sub] = None  # edge-triggered: come back for the rest (after the others)

    def _decrypt(self, sub: Subscriber, data: bytes) -> bytes:
        """A TLS connection's bytes -> plaintext; its handshake records are sent at once. A failed handshake
        or a corrupt record closes the connection (counted); the peer's close_notify is its EOF."""
        tls = sub.tls
        assert tls is not None
        handshaking = not tls.handshake_done
        try:
            plain = tls.receive(data)
        except ssl.SSLError:
            if handshaking:
                self._handshaking.pop(sub.fd, None)
                self.counters.handshakes["tls_failed"] += 1
            else:
                self.counters.clients_dropped["tls_error"] += 1
            self._close(sub)
            return b""
        if tls.out:
            self.fanout.send_records(sub)
        if tls.closed and not plain:
            self._close(sub)
        return plain

    def _on_head_bytes(self, sub: Subscriber, data: bytes) -> None:
        """Hand websockets the HTTP request head as it arrives, and nothing after its end: one request
        per connection (pipelined requests are not answered), frames behind an upgrade wait for it."""
        tail = sub.head  # the last 3 bytes seen: the blank line may straddle two reads
        end = (tail + data).find(b"\r\n\r\n")
        if end >= 0:
            cut = end + 4 - len(tail)
            data, rest = data[:cut], data[cut:]
        else:
            rest = b""
            sub.head = (tail + data)[-3:]
        # The metrics port is outside the budget (at most 64 connections of 32 KiB heads): a flood of
        # client input must not blind the operator.
        if sub.listener != METRICS and not self._make_room(sub, len(data)):
            self._respond(sub, "busy", text_response(503, "Service Unavailable", BUSY_TEXT))
            return
        sub.head_length += len(data)
        self._reserve(sub, sub.head_length)
        sub.protocol.receive_data(data)
        self._on_protocol_events(sub)
        if sub.state is State.HANDSHAKE and sub.head_length > MAX_REQUEST_HEAD_LENGTH:
            self._respond(
                sub, "head_too_large", text_response(431, "Request Header Fields Too Large", HEAD_TOO_LARGE_TEXT)
            )
        if sub.state is not State.HANDSHAKE:
            self._reserve(sub, 0)
        if rest and sub.fd in self._connections and sub.state in READING_FRAMES:
            self._on_frame_bytes(sub, rest)  # frames sent right behind the upgrade request

    def _on_frame_bytes(self, sub: Subscriber, data: bytes) -> None:
        """Client frames: their declared lengths are checked against the caps before websockets buffers them."""
        meter = sub.meter
        begun = meter.messages_begun
        declared = meter.feed(data)
        cfg = self.config
        if declared > cfg.max_client_message_length:
            self._refuse_message(sub, "message_too_big", f"message too big: {declared} bytes declared")
            return
        if declared > sub.reserved and not self._make_room(sub, declared - sub.reserved):
            self._refuse_message(sub, "incoming_full", "relay busy: too much unfinished input")
            return
        self._reserve(sub, declared)
        sub.protocol.receive_data(data)
        self._on_protocol_events(sub)
        self._reserve(sub, meter.message_length)
        if meter.message_length and meter.messages_begun != begun:
            # The message in progress began in this data (back-to-back messages never let the reservation
            # fall to 0): its client_message_timeout_ns counts from now, not from an earlier message.
            sub.reserved_since_ns = time.monotonic_ns()

    def _make_room(self, sub: Subscriber, extra: int) -> bool:
        """Whether ``sub`` may hold ``extra`` more bytes of input within ``max_incoming_bytes``. When the budget
        is exhausted, the connection holding the most input (declared, buffered and queued) is closed to make
        room, if it holds more than ``DISPLACE_FACTOR`` times what ``sub`` would: a newcomer with a small message
        displaces the biggest holder, never a smaller one, and flooders of one size do not displace each other
        in turn. One such close always makes room (the budget held before, and the closed connection freed
        more than ``extra``); if no connection holds that much, False: ``sub`` is refused."""
        limit = self.config.max_incoming_bytes
        if self._incoming_reserved + extra <= limit:
            return True
        would_hold = sub.reserved + sub.queued + extra
        victim: Subscriber | None = None
        most = DISPLACE_FACTOR * would_hold
        for other in self._connections.values():
            held = other.reserved + other.queued
            if held > most and other is not sub and other.listener != METRICS:
                victim, most = other, held
        if victim is None:
            return False
        self._evict(victim)
        return self._incoming_reserved + extra <= limit

    def _evict(self, sub: Subscriber) -> None:
        """Close ``sub`` to make room in the input budget: 1009 (503 to a request head), counted as
        ``clients_dropped{reason=input_evicted}``; its queued messages are not parsed, and what it sends
        after our close frame is discarded."""
        self.counters.clients_dropped["input_evicted"] += 1
        self._unqueue(sub)
        if sub.state is State.HANDSHAKE:
            self._respond(sub, "busy", text_response(503, "Service Unavailable", BUSY_TEXT))
            return
        self._reserve(sub, 0)
        if sub.protocol.state is ProtocolState.OPEN:
            sub.protocol.send_close(CLOSE_MESSAGE_TOO_BIG, EVICTED_TEXT)
        self._guarded(self._pump, sub)
        # Free what it held, not only its count: after our close frame nothing of it is parsed (its later
        # bytes are discarded in _read), so the partial frame websockets buffered and its fragments can go.
        sub.protocol.reader.buffer.clear()
        sub.message = None

    def _reserve(self, sub: Subscriber, length: int) -> None:
        """Set what ``sub`` holds (or has declared) against ``max_incoming_bytes``."""
        if length and not sub.reserved:
            sub.reserved_since_ns = time.monotonic_ns()
        self._incoming_reserved += length - sub.reserved
        sub.reserved = length

    def _refuse_message(self, sub: Subscriber, reason: str, text: str) -> None:
        """Close with 1009 before buffering the message; nothing more from this client is parsed."""
        self.counters.clients_dropped[reason] += 1
        self._reserve(sub, 0)
        if sub.protocol.state is ProtocolState.OPEN:
            sub.protocol.send_close(CLOSE_MESSAGE_TOO_BIG, text)
        self._pump(sub)

    def _on_protocol_events(self, sub: Subscriber) -> None:
        for event in sub.protocol.events_received():
            if isinstance(event, Request):
                if sub.state is State.HANDSHAKE:
                    self._on_request(sub, event)
            elif isinstance(event, Frame):
                self._on_frame(sub, event)
        self._pump(sub)

    def _pump(self, sub: Subscriber) -> None:
        """Move the protocol's output (responses, pongs, close frames) into the subscriber's queue."""
        protocol = sub.protocol
        for data in protocol.data_to_send():
            if data:
                self.fanout.queue_control(sub, data)
            else:
                sub.eof_after_out = True
        if sub.state is State.HANDSHAKE and (sub.out or sub.eof_after_out):
            # The request failed to parse (websockets queued a 4xx or just EOF): nothing to upgrade.
            self._handshaking.pop(sub.fd, None)
            self.counters.handshakes["invalid_http"] += 1
            sub.move(Input.RESPONDED)
            sub.eof_after_out = True
            self.fanout.add(sub)
        if protocol.state in (ProtocolState.CLOSING, ProtocolState.CLOSED) and sub.state in READING_FRAMES:
            sub.move(Input.CLOSE_QUEUED)
            sub.eof_after_out = True  # after our close frame: shut the write side, linger for theirs
        if (sub.out or sub.eof_after_out) and sub.writable and sub.pos >= sub.range_end:
            self.fanout.send_out(sub)
        self._dirty = True

    def _respond(self, sub: Subscriber, outcome: str, response: Response) -> None:
        """Answer the request with a final response of our own (without websockets) and close."""
        self._handshaking.pop(sub.fd, None)
        self.counters.handshakes[outcome] += 1
        self._reserve(sub, 0)
        sub.move(Input.RESPONDED)
        self.fanout.add(sub)
        self.fanout.queue_control(sub, response.serialize())
        sub.eof_after_out = True
        self._pump(sub)

    def _guarded(self, handler: Callable[[Subscriber], None], sub: Subscriber) -> None:
        """Run one connection's handler; an error in it ends that connection only (see :meth:`_failed`)."""
        try:
            handler(sub)
        except Exception as exc:  # noqa: BLE001 - one connection's trouble must never end the relay
            self._failed(sub, exc)

    def _failed(self, sub: Subscriber, exc: BaseException) -> None:
        """Count an unexpected error on one connection, log each distinct one once, close that connection."""
        kind = type(exc).__name__
        self.counters.connection_errors[kind] += 1
        key = f"{kind}: {exc}"[:200]
        if key not in self._errors_logged and len(self._errors_logged) < MAX_DISTINCT_ERRORS_LOGGED:
            self._errors_logged.add(key)
            self._log.warning("relay.connection_error", error=key, state=sub.state.name, ip=sub.ip)
        try:
            self._close(sub)
        except Exception:  # noqa: BLE001 - the socket is gone either way
            self._connections.pop(sub.fd, None)
            self.fanout.remove(sub)

    # -- HTTP ------------------------------------------------------------------------------------

    def _on_request(self, sub: Subscriber, request: Request) -> None:
        self._handshaking.pop(sub.fd, None)
        protocol = sub.protocol
        path, query = split_target(request.path)
        method = request.method
        options: SubscriberOptions | None = None
        if sub.listener == PUBLIC and self.proxies and not sub.over_limit:
            self._identify_client(sub, request)
        if sub.over_limit:
            if sub.over_limit == "ip":
                outcome, response = (
                    "over_ip_limit",
                    text_response(429, "Too Many Requests", "too many connections from this address"),
                )
            else:
                outcome, response = "over_limit", text_response(503, "Service Unavailable", "too many connections")
        elif method == "OPTIONS":
            outcome, response = "preflight", preflight_response(request.headers)
        elif method not in ("GET", "HEAD"):
            outcome, response = "method_not_allowed", method_not_allowed()
        elif sub.listener == METRICS:
            if path == METRICS_PATH:
                outcome, response = "metrics", metrics_response(self.registry)
            else:
                outcome, response = "not_found", text_response(404, "Not Found", "404 page not found")
        elif path == WELCOME_PATH:
            outcome, response = "welcome", text_response(200, "OK", WELCOME_TEXT)
        elif path != SUBSCRIBE_PATH:
            outcome, response = "not_found", text_response(404, "Not Found", "404 page not found")
        else:
            try:
                options = parse_query(query, request.headers.raw_items())
                if options.compress and not self.store.compressed:
                    raise OptionsError(
                        "invalid subscriber options: compress=true is not available: this relay has no zstd dictionary"
                    )
            except OptionsError as exc:
                options = None
                outcome, response = "bad_request", text_response(400, "Bad Request", str(exc))
            else:
                response = protocol.accept(request)
                outcome = "accepted" if response.status_code == 101 else "upgrade_failed"
        if response.status_code != 101:
            response = with_cors(response, request.headers)
            if method == "HEAD":
                response = head_response(response)
        self.counters.handshakes[outcome] += 1
        protocol.send_response(response)
        self.fanout.add(sub)
        if response.status_code != 101 or options is None:
            sub.move(Input.RESPONDED)
            sub.eof_after_out = True
            return
        sub.kind = ZSTD if options.compress else PLAIN
        now = time.monotonic_ns()
        cfg = self.config
        sub.messages = MessageBucket(
            cfg.max_client_messages_per_s,
            cfg.client_message_burst,
            cfg.max_client_message_bytes_per_s,
            cfg.max_client_message_length,
            now,
        )
        if self.limiter is not None:
            self.limiter.attach(sub.ip, now)
            sub.rate_limited = True
        self.fanout.set_options(sub, options)
        sub.next_ping_ns = time.monotonic_ns() + self.config.ping_interval_ns
        if options.require_hello:
            sub.move(Input.UPGRADED_HELD)
        elif not self._servable(options.cursor):
            sub.move(Input.UPGRADED_WAITING)
        else:
            sub.move(Input.UPGRADED)
            self.fanout.start(sub, self.store.seq_for_cursor(options.cursor))

    def _identify_client(self, sub: Subscriber, request: Request) -> None:
        """Behind a trusted proxy: re-key the connection on the forwarded client address and apply
        the per-address cap to it."""
        client = self.proxies.client_ip(sub.ip, request.headers.raw_items())
        if client == sub.ip:
            return
        self._per_ip[sub.ip] -= 1
        if self._per_ip[sub.ip] <= 0:
            del self._per_ip[sub.ip]
        if self._per_ip[client] >= self.config.max_connections_per_ip and not self.proxies.trusts(client):
            sub.over_limit = "ip"
        sub.ip = client
        self._per_ip[client] += 1

    # -- client messages -------------------------------------------------------------------------

    def _on_frame(self, sub: Subscriber, frame: Frame) -> None:
        if sub.state not in READING_FRAMES:
            return
        opcode = frame.opcode
        data = bytes(frame.data)
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            if frame.fin:
                self._on_message(sub, opcode is Opcode.TEXT, data)
            else:
                sub.message = [b"T" if opcode is Opcode.TEXT else b"B", data]
        elif opcode is Opcode.CONT and sub.message is not None:
            sub.message.append(data)
            if frame.fin:
                parts, sub.message = sub.message, None
                self._on_message(sub, parts[0] == b"T", b"".join(parts[1:]))
        # PING (answered by the protocol), PONG and CLOSE (answered by the protocol) need nothing here.

    def _on_message(self, sub: Subscriber, text: bool, data: bytes) -> None:
        """A complete client message: over the connection's message rate, close 1008; else queue it for
        :meth:`_parse_pending`."""
        protocol = sub.protocol
        if protocol.state is not ProtocolState.OPEN:
            return  # our close frame is queued: what the client sent after it is not acted on
        if sub.messages is not None and not sub.messages.take(len(data), time.monotonic_ns()):
            self.counters.clients_dropped["client_message_rate"] += 1
            self._unqueue(sub)
            protocol.send_close(CLOSE_POLICY_VIOLATION, self._rate_reason)
            return
        if not text:
            self.counters.client_messages_ignored += 1  # binary frames are ignored, as jetstream does
            return
        queue = self._pending.get(sub)
        if queue is None:
            queue = self._pending[sub] = deque()
        queue.append(data)
        self._pending_count += 1
        sub.queued += len(data)
        self._incoming_reserved += len(data)

    def _unqueue(self, sub: Subscriber) -> None:
        """Forget ``sub``'s queued messages (their bytes leave the incoming budget)."""
        queue = self._pending.pop(sub, None)
        if queue:
            self._pending_count -= len(queue)
            self._incoming_reserved -= sub.queued
        sub.queued = 0

    def _parse_pending(self) -> None:
        """Parse queued client messages, one per connection in turn, for at most ``PARSE_SLICE_NS`` (at least one)."""
        pending = self._pending
        deadline = time.monotonic_ns() + PARSE_SLICE_NS
        while pending:
            sub = next(iter(pending))
            queue = pending.pop(sub)
            data = queue.popleft()
            if queue:
                pending[sub] = queue  # its next message waits for every other connection's turn
            self._pending_count -= 1
            sub.queued -= len(data)
            self._incoming_reserved -= len(data)
            if sub.state in READING_FRAMES and sub.protocol.state is ProtocolState.OPEN:
                try:
                    self._apply_message(sub, data)
                    self._pump(sub)
                except Exception as exc:  # noqa: BLE001 - one connection's trouble must never end the relay
                    self._failed(sub, exc)
            if time.monotonic_ns() >= deadline:
                return

    def _apply_message(self, sub: Subscriber, data: bytes) -> None:
        protocol = sub.protocol
        try:
            update = parse_options_update(data)
        except OptionsUpdateDecodeError as exc:
            self.counters.options_update_errors["bad_json"] += 1
            if protocol.state is ProtocolState.OPEN:
                protocol.send_close(CLOSE_INVALID_PAYLOAD, str(exc))
            return
        except OptionsError as exc:
            self.counters.options_update_errors["invalid_options"] += 1
            if protocol.state is ProtocolState.OPEN:
                protocol.send_close(CLOSE_POLICY_VIOLATION, truncate_close_reason(str(exc)))
            return
        if update is None:
            self.counters.client_messages_ignored += 1
            return
        self.counters.options_updates += 1
        options = sub.options.with_update(update)
        self.fanout.set_options(sub, options)
        if sub.state is State.HELD:
            if self._servable(options.cursor):
                sub.move(Input.HELLO)
                self.fanout.start(sub, self.store.seq_for_cursor(options.cursor))
            else:
                sub.move(Input.HELLO_WAITING)
        else:
            sub.move(Input.OPTIONS_UPDATE)

    # -- ending connections ----------------------------------------------------------------------

    def _on_linger(self, sub: Subscriber) -> None:
        self.fanout.remove(sub)
        sub.deadline_ns = time.monotonic_ns() + self.config.close_timeout_ns
        self._lingering[sub.fd] = sub

    def _drop(self, sub: Subscriber, reason: str) -> None:
        """End a connection from our side: a close frame if one can go at a frame boundary, then close."""
        self.counters.clients_dropped[reason] += 1
        protocol = sub.protocol
        if reason != "socket_error" and protocol.state is ProtocolState.OPEN and sub.pos >= sub.range_end:
            code, text = (
                (CLOSE_POLICY_VIOLATION, TOO_SLOW_REASON)
                if reason == "behind_retention"
                else (CLOSE_POLICY_VIOLATION, reason.replace("_", " "))
            )
            protocol.send_close(code, text)
            self.fanout.send_now(sub, bytes(sub.out) + b"".join(protocol.data_to_send()))
        self._close(sub)

    def _close(self, sub: Subscriber) -> None:
        fd = sub.fd
        if self._connections.pop(fd, None) is None:
            return
        sub.move(Input.ENDED)
        self._handshaking.pop(fd, None)
        self._lingering.pop(fd, None)
        self._read_again.pop(sub, None)
        self._unqueue(sub)
        self.fanout.remove(sub)
        if sub.range_events and sub.pos >= sub.range_end:
            sub.events_sent += sub.range_events
            sub.range_events = 0
        if sub.bytes_sent:
            departed = self.counters.departed_bytes
            label = sub.ip if sub.ip in departed or len(departed) < MAX_DEPARTED_ADDRESSES else OTHER_ADDRESSES
            self.counters.departed_events[label] += sub.events_sent
            departed[label] += sub.bytes_sent
        self._reserve(sub, 0)
        if sub.rate_limited and self.limiter is not None:
            self.limiter.detach(sub.ip)
        if sub.listener == METRICS:
            self._metrics_connections -= 1
        else:
            self._per_ip[sub.ip] -= 1
            if self._per_ip[sub.ip] <= 0:
                del self._per_ip[sub.ip]
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass
        sub.sock.close()

    # -- timers ----------------------------------------------------------------------------------

    def _timers(self, now: int) -> None:
        for sub in [s for s in self._handshaking.values() if now >= s.deadline_ns]:
            self.counters.handshakes["timeout"] += 1
            self._close(sub)
        for sub in [s for s in self._lingering.values() if now >= s.deadline_ns]:
            self._close(sub)
        if now >= self._next_slow_timer_ns:
            self._next_slow_timer_ns = now + SLOW_TIMER_PERIOD_NS
            self._pings_and_write_timeouts(now)
        if now >= self._next_retention_ns:
            self._next_retention_ns = now + self.config.retention_check_ns
            self._retention()

    def _pings_and_write_timeouts(self, now: int) -> None:
        cfg = self.config
        write_timeout_ns = cfg.write_timeout_ns
        ping_ns = cfg.ping_interval_ns
        stuck: list[Subscriber] = []
        message_timeout_ns = cfg.client_message_timeout_ns
        for sub in list(self.fanout.subscribers.values()):
            if sub.reserved and sub.state in READING_FRAMES and now - sub.reserved_since_ns > message_timeout_ns:
                self.counters.clients_dropped["client_message_timeout"] += 1
                self._reserve(sub, 0)
                if sub.protocol.state is ProtocolState.OPEN:
                    sub.protocol.send_close(CLOSE_POLICY_VIOLATION, "client message timeout")
                self._guarded(self._pump, sub)
                continue
            if (
                write_timeout_ns
                and not sub.writable
                and sub.blocked_since_ns
                and now - sub.blocked_since_ns > write_timeout_ns
            ):
                stuck.append(sub)
            elif sub.state in UPGRADED and now >= sub.next_ping_ns:
                sub.next_ping_ns = now + ping_ns
                if sub.protocol.state is ProtocolState.OPEN:
                    sub.protocol.send_ping(b"")
                    self.counters.pings_sent += 1
                    self._guarded(self._pump, sub)
        for sub in stuck:
            self._drop(sub, "write_timeout")

    def _retention(self) -> None:
        cfg = self.config
        max_age_us = None if cfg.retention_ns is None else cfg.retention_ns // 1_000  # event times are epoch us
        if not self.store.retire(max_age_us=max_age_us, max_bytes=cfg.retention_bytes):
            return
        if not self.store.punch_supported and not self._punch_warned:
            self._punch_warned = True
            self._log.warning(
                "relay.punch_unsupported",
                data_dir=cfg.data_dir,
                effect="retention applies to clients and the index; disk space is not returned",
            )
        for sub in [s for s in self.fanout.subscribers.values() if self.fanout.is_behind(s)]:
            self._drop(sub, "behind_retention")

    # -- shutdown --------------------------------------------------------------------------------

    def _shut_down(self) -> None:
        """Close 1001 to every client at its next frame boundary; give them ``close_timeout_ns``."""
        for fd in self._listeners:
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):
                pass
        for sub in list(self._handshaking.values()):
            self._close(sub)
        for sub in list(self.fanout.subscribers.values()):
            if sub.protocol.state is ProtocolState.OPEN:
                sub.protocol.send_close(CLOSE_GOING_AWAY, SHUTDOWN_REASON)
                self._pump(sub)
        deadline = time.monotonic_ns() + self.config.close_timeout_ns
        self._next_flush_ns = 0
        while self._connections and time.monotonic_ns() < deadline:
            self._dirty = True
            self._iterate(accepting=False)

    def _close_everything(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sub in list(self._connections.values()):
            self._close(sub)
        self._epoll.close()
        for listener, _ in self._listeners.values():
            listener.close()
        os.close(self._wake_fd)
        self.store.close()

    # -- metrics ---------------------------------------------------------------------------------

    def _snapshot(self) -> MetricsSnapshot:
        connected: Counter[str] = Counter()
        events = Counter(self.counters.departed_events)
        sent = Counter(self.counters.departed_bytes)
        for sub in self._connections.values():
            if sub.state in UPGRADED:
                connected[sub.ip] += 1
            if sub.bytes_sent:
                events[sub.ip] += sub.events_sent
                sent[sub.ip] += sub.bytes_sent
        store = self.store
        names = ["plain", "zstd"][: len(store.files)]
        self.counters.sendfile_calls = self.fanout.sendfile_calls
        self.counters.rate_limited = 0 if self.limiter is None else self.limiter.throttled
        self.counters.forwarded_invalid = self.proxies.forwarded_invalid
        return MetricsSnapshot(
            connected=connected,
            events_delivered=events,
            bytes_delivered=sent,
            events_emitted=store.stats.events_appended,
            bytes_emitted=store.stats.bytes_appended,
            store_events=store.next_seq - store.first_seq,
            store_bytes={n: store.end(k) for k, n in enumerate(names)},
            store_disk_bytes={n: store.disk_bytes(k) for k, n in enumerate(names)},
            oldest_time_us=store.oldest_time_us(),
            newest_time_us=store.last_time_us,
            events_retired=store.stats.events_retired,
            bytes_punched=store.stats.bytes_punched,
            punch_failures=store.stats.punch_failures,
            counters=self.counters,
            messages_queued=self._pending_count,
        )
