"""Ingest: events from an upstream jetstream (or the built-in generator) into a logbuf stream.

Theory of operation
-------------------
One ingest thread runs an asyncio loop with one *source*:

* :class:`UpstreamSource` follows ``ws://…/subscribe`` (uncompressed, text frames) with the
  ``websockets`` client. An HTTP 4xx answer to the subscription (a bad filter or path in the URL;
  not 408/429) ends the ingest with :class:`IngestError`: retrying would not help. When the
  connection ends for any other reason (refused, reset, 5xx, timeout) it reconnects with exponential
  back-off (``backoff_initial_ns`` doubling up to ``backoff_max_ns``, reset after a connection that
  delivered events), asking for ``cursor = last upstream time_us − rewind`` (default rewind 5 s:
  jetstream's README advises rewinding "a few seconds" when switching instances, @atcute rewinds
  10 s on failover). Replay is inclusive and rewound, so the first events of a new connection are
  mostly ones already published: the :class:`Sequencer` drops them.
* :class:`GeneratorSource` is the relay acting as *origin*: it stamps each synthetic event with
  the next value of an :class:`OriginClock` (wall-clock µs, strictly increasing).

Every event is published as one message, the event's JSON bytes exactly as on the v1 wire, with
``reserved_value = time_us``. The publication is exclusive (one writer thread). ``offer`` results:
``ADMIN_ACTION`` retries at once; ``BACK_PRESSURED`` (the slowest subscriber is a term window
behind) and ``NOT_CONNECTED`` (no subscriber yet) are awaited by ``Publication.offer_async``
(:mod:`logbuf.client.aio`), backing off from 50 µs to 10 ms, so nothing is dropped: while the ingest waits it stops reading its
websocket, and TCP flow control holds the upstream back (a wait beyond the upstream's patience only
costs a reconnect, which resumes from the cursor). ``CLOSED`` (the driver or its client went away:
:class:`PublicationClosedError`, which ``logbuf-jetstream`` answers by reconnecting and starting a
new ingest) and ``MAX_POSITION_EXCEEDED`` end the ingest with :class:`IngestError`. An event longer than the stream's largest message
(min(term length / 8, 16 MiB): 2 MiB with ``logbuf-jetstream``'s embedded driver) cannot be carried:
it is counted as ``oversized`` and skipped (real events reach ~1 MB).

The :class:`Sequencer` (sans-IO: bytes in, bytes and ``time_us`` out) keeps the published stream
strictly increasing in ``time_us`` without losing or repeating events:

* **Duplicates** are recognised by content, not by ``time_us``: the key of an event is its bytes
  without the ``time_us`` digits (kept as its 64-bit SipHash), so the same event served again by
  the same upstream, or by another instance that stamped it differently, is recognised. Keys of the events published in the
  last ``window`` (2 × rewind + 1 s of ``time_us``) are kept. The point a reconnect resumes from
  only moves forward (a drop during a replay does not rewind further), except when the upstream's
  clock is found behind ours (then it follows the upstream's clock).
* **History start**: the first event taken (or ``floor_us`` + 1, e.g. the newest event a restarted
  relay already holds) is where our history begins. A rewound replay that reaches back before it
  (the upstream's events from before we started following) is skipped up to that point, counted
  as ``before_start``.
* An event whose ``time_us`` is above the last published one keeps the upstream's ``time_us``
  (cursors stay interchangeable between the upstream and this relay). An event that is new but
  not above (the upstream's clock went backwards: another instance, a restarted upstream) is
  **restamped**: the relay acts as origin and writes the next :class:`OriginClock` value into the
  bytes in place of the old digits.
* A v2 upstream's extra top-level ``"cursor"`` field is removed (strict v1 clients reject unknown
  keys).
* Frames that are not v1 events (bad JSON, missing fields, binary frames) are counted and dropped.

**Collections as topics** (optional, a :class:`TopicTee`): every event published is then offered again on a
second stream, a topic stream (:mod:`logbuf.client.topics`), with its collection as the topic
(``app.bsky.feed.post``; ``identity``, ``account`` and ``commit`` for events without one: single tokens, which
no collection NSID can be), so a subscriber takes ``app.bsky.feed.*`` or ``app.bsky.>`` filtered in its native
poll. It is a second stream, not the event stream itself, because a topic stream's reserved value is the topic
id while the relay, its recordings and backfill read ``time_us`` from the event stream's. The topic offer follows
the event's own offer, so the topic stream carries the same events in the same order; back-pressure waits as on
the event stream, but ``NOT_CONNECTED`` (no topic subscriber anywhere) drops the copy, counted as
``topic_not_connected``, rather than stall the relay. Distinct topics are bounded (``max_topics``, an upstream
cannot fill the host's topic registry): a collection beyond it, or one that is not a topic name, goes out as
topic ``overflow``, counted.
"""

from __future__ import annotations

import asyncio
import collections
import math
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import structlog
import websockets
from websockets.asyncio.client import connect

from logbuf.client.aio import AsyncIdle, MaxPositionExceededError
from logbuf.durations import renamed_duration_keywords
from logbuf.errors import ClosedError, LogbufError
from logbuf.jetstream.events import KIND_COMMIT, parse_event
from logbuf.jetstream.generator import EventGenerator
from logbuf.logbuffer.publication import OfferResult
from logbuf.topic_names import TopicNameError, check_topic_name

__all__ = [
    "DEFAULT_REWIND_S",
    "GeneratorSource",
    "Ingest",
    "IngestError",
    "IngestStats",
    "OriginClock",
    "PublicationClosedError",
    "Sequencer",
    "TopicTee",
    "UpstreamSource",
    "check_rate",
    "check_upstream_url",
]

DEFAULT_REWIND_S: Final = 5.0
"""How far back a reconnect asks the upstream to start, in seconds of time_us."""
UPSTREAM_MAX_MESSAGE_LENGTH: Final = 16 * 1024 * 1024
CLOSE_GOING_AWAY: Final = 1001
"""The close code the ingest leaves an upstream with when it is stopped."""
"""Largest upstream frame accepted (real events reach ~1 MB; legacy #49 shows 1,088,193 bytes)."""
_OFFER_IDLE: Final = AsyncIdle(spins=0, min_park_ns=50_000, max_park_ns=10_000_000)
"""How a back-pressured or unconnected offer waits: parks doubling from 50 us to 10 ms."""
_TIME_US_KEY: Final = b'"time_us"'
_CURSOR_KEY: Final = b',"cursor":'


class IngestError(LogbufError):
    """The ingest cannot go on (the publication closed or reached its maximum position)."""


class PublicationClosedError(IngestError):
    """The publication was closed under the ingest (driver lost, client timed out): reconnect."""


class Publisher(Protocol):
    """What the ingest needs from a publication (``client.Publication`` has it)."""

    def offer(self, buffer: bytes, reserved_value: int = 0) -> int: ...

    async def offer_async(
        self,
        buffer: bytes,
        reserved_value: int = 0,
        *,
        idle: AsyncIdle | None = None,
        on_refused: Callable[[int], object] | None = None,
    ) -> int: ...

    @property
    def max_message_length(self) -> int: ...


class TopicPublisher(Protocol):
    """What the topic tee needs from a topic publication (``client.topics.TopicPublication`` has it)."""

    def offer(self, topic: str, payload: bytes) -> int: ...


def wall_clock_us() -> int:
    return time.time_ns() // 1000


class OriginClock:
    """Strictly increasing µs timestamps: wall-clock time, or the last value + 1 if that is not later."""

    def __init__(self, now_us: Callable[[], int] = wall_clock_us, last_us: int = 0) -> None:
        self._now_us = now_us
        self.last_us = last_us

    def next(self) -> int:
        t = self._now_us()
        if t <= self.last_us:
            t = self.last_us + 1
        self.last_us = t
        return t

    def observe(self, time_us: int) -> None:
        """Never hand out a value at or below ``time_us`` (already used by someone else)."""
        if time_us > self.last_us:
            self.last_us = time_us


@dataclass
class IngestStats:
    """Counts since the ingest started (plain ints, read from any thread)."""

    received: int = 0
    published: int = 0
    published_bytes: int = 0
    duplicates: int = 0
    restamped: int = 0
    invalid: int = 0
    before_start: int = 0
    oversized: int = 0
    back_pressured: int = 0
    not_connected: int = 0
    connections: int = 0
    disconnects: int = 0
    topic_published: int = 0
    topic_not_connected: int = 0
    topic_back_pressured: int = 0
    topic_overflow: int = 0
    last_time_us: int = 0
    last_error: str = ""

    def snapshot(self) -> dict[str, int | str]:
        return dict(self.__dict__)


def _time_us_span(raw: bytes, time_us: int) -> tuple[int, int] | None:
    """Where the top-level ``time_us`` digits are in ``raw`` (None if the layout is unusual)."""
    i = raw.find(_TIME_US_KEY)
    if i < 0:
        return None
    i += len(_TIME_US_KEY)
    n = len(raw)
    while i < n and raw[i] in b" \t\r\n":
        i += 1
    if i >= n or raw[i] != 0x3A:  # ':'
        return None
    i += 1
    while i < n and raw[i] in b" \t\r\n":
        i += 1
    start = i
    while i < n and 0x30 <= raw[i] <= 0x39:
        i += 1
    if i == start or int(raw[start:i]) != time_us:
        return None  # the first "time_us" was not the top-level one: keys out of v1 order
    return start, i


class Sequencer:
    """Decides, event by event, what goes into the stream: see the module docstring.

    ``accept(raw)`` returns ``(bytes_to_publish, time_us)``, or None for a duplicate or invalid
    event. ``resume_cursor()`` is where a reconnect asks the upstream to start.
    """

    def __init__(
        self,
        *,
        rewind_us: int = int(DEFAULT_REWIND_S * 1e6),
        floor_us: int = 0,
        clock: OriginClock | None = None,
        stats: IngestStats | None = None,
    ) -> None:
        if rewind_us < 0:
            raise ValueError(f"rewind_us={rewind_us} must not be negative")
        if floor_us < 0:
            raise ValueError(f"floor_us={floor_us} must not be negative")
        self.stats = stats or IngestStats()
        self.rewind_us = rewind_us
        self.window_us = 2 * rewind_us + 1_000_000
        self.last_time_us = floor_us
        self.history_start_us: int | None = floor_us + 1 if floor_us else None
        """Upstream time_us where our history begins (first event taken, or just above the floor)."""
        self.resume_base_us: int | None = floor_us or None
        """Upstream time_us a reconnect resumes from (minus the rewind)."""
        self.clock = clock or OriginClock()
        self.clock.observe(floor_us)
        self._skip_below = 0
        self._window: collections.deque[tuple[int, int]] = collections.deque()
        self._keys: dict[int, int] = {}

    def resume_cursor(self) -> int | None:
        """``resume base − rewind``; None (live) before the first event and without a floor."""
        if self.resume_base_us is None:
            return None
        return max(self.resume_base_us - self.rewind_us, 1)

    def on_connect(self, cursor: int | None) -> None:
        """A new upstream connection starting at ``cursor``: a replay that reaches back before our
        history's start is skipped up to that start (those events were never ours to publish)."""
        start = self.history_start_us
        self._skip_below = start if start is not None and cursor is not None and cursor < start else 0

    def accept(self, raw: bytes) -> tuple[bytes, int] | None:
        stats = self.stats
        stats.received += 1
        try:
            meta = parse_event(raw)
        except ValueError as e:
            stats.invalid += 1
            stats.last_error = str(e)[:200]
            return None
        upstream_time_us = meta.time_us
        if upstream_time_us < self._skip_below:
            stats.before_start += 1
            return None
        self._skip_below = 0  # the replay reached our history: from here on, every event counts
        span = _time_us_span(raw, upstream_time_us)
        if span is None:
            stats.invalid += 1
            stats.last_error = "time_us is not the second key (not jetstream's key order)"
            return None
        start, end = span
        if raw.startswith(_CURSOR_KEY, end):  # a v2 upstream's extra field: strict v1 clients reject it
            j = end + len(_CURSOR_KEY)
            while j < len(raw) and 0x30 <= raw[j] <= 0x39:
                j += 1
            raw = raw[:end] + raw[j:]
        head, tail = raw[:start], raw[end:]
        key = hash(head + tail)
        base = self.resume_base_us
        if key in self._keys:
            stats.duplicates += 1
            if base is None or upstream_time_us > base:  # never walk the resume point back
                self.resume_base_us = upstream_time_us
            return None
        if self.history_start_us is None:
            self.history_start_us = upstream_time_us
        if upstream_time_us > self.last_time_us:
            time_us = upstream_time_us
            self.clock.observe(time_us)
            if base is None or upstream_time_us > base:
                self.resume_base_us = upstream_time_us
        else:  # new, but the upstream's clock is behind ours: act as origin, resume on its clock
            time_us = self.clock.next()
            raw = head + str(time_us).encode() + tail
            stats.restamped += 1
            self.resume_base_us = upstream_time_us
        self.last_time_us = time_us
        self._remember(time_us, key)
        return raw, time_us

    def _remember(self, time_us: int, key: int) -> None:
        window, keys = self._window, self._keys
        window.append((time_us, key))
        keys[key] = keys.get(key, 0) + 1
        horizon = time_us - self.window_us
        while window[0][0] < horizon:
            _, old = window.popleft()
            left = keys[old] - 1
            if left:
                keys[old] = left
            else:
                del keys[old]


class StreamPublisher:
    """Offers events into the stream, retrying without dropping (see the module docstring), and with a
    :class:`TopicTee` each one again on the topic stream, after it."""

    def __init__(self, publication: Publisher, stats: IngestStats, tee: TopicTee | None = None) -> None:
        self.publication = publication
        self.stats = stats
        self.tee = tee
        self._pending_topic: str | None = None
        """The topic of the event in the stream whose copy the topic stream has not taken yet."""

    def try_publish(self, raw: bytes, time_us: int) -> bool:
        """One offer, no waiting: True when the event is in the stream (or dropped as oversized),
        False when the caller must ``await publish(...)`` (back-pressure and the like)."""
        if self._pending_topic is None:
            try:
                result = self.publication.offer(raw, time_us)
            except ValueError:  # longer than the stream's largest message: cannot be carried
                self.stats.oversized += 1
                return True
            if result < 0:
                return False
            self._published(raw, time_us)
            if self.tee is None:
                return True
            self._pending_topic = self.tee.topic_of(raw)
        assert self.tee is not None
        if self.tee.try_offer(raw, self._pending_topic):
            self._pending_topic = None
            return True
        return False

    async def publish(self, raw: bytes, time_us: int) -> None:
        """Offer until the event is in the stream, awaiting (backing off) while back-pressured."""
        if self.try_publish(raw, time_us):
            return
        if self._pending_topic is None:  # the event stream refused it
            try:
                await self.publication.offer_async(raw, time_us, idle=_OFFER_IDLE, on_refused=self._count_refusal)
            except ClosedError:
                raise PublicationClosedError("publication offer failed: CLOSED") from None
            except MaxPositionExceededError as e:
                raise IngestError(f"publication offer failed: MAX_POSITION_EXCEEDED ({e})") from None
            self._published(raw, time_us)
            if self.tee is None:
                return
            self._pending_topic = self.tee.topic_of(raw)
        assert self.tee is not None
        await self.tee.offer(raw, self._pending_topic)
        self._pending_topic = None

    def _published(self, raw: bytes, time_us: int) -> None:
        stats = self.stats
        stats.published += 1
        stats.published_bytes += len(raw)
        stats.last_time_us = time_us

    def _count_refusal(self, result: int) -> None:
        if result == OfferResult.BACK_PRESSURED:
            self.stats.back_pressured += 1
        elif result == OfferResult.NOT_CONNECTED:
            self.stats.not_connected += 1


OVERFLOW_TOPIC: Final = "overflow"
"""The topic of events whose collection is not a topic name, or is new beyond ``max_topics``."""
DEFAULT_MAX_TOPICS: Final = 4096
"""Distinct collections the tee names (the live network has a few hundred); each costs a registry record."""


class TopicTee:
    """Offers each published event again on a topic stream, its topic the event's collection (see the module
    docstring): ``topic_of(raw)``, then ``try_offer`` or ``await offer``."""

    def __init__(
        self, publication: TopicPublisher, stats: IngestStats, *, max_topics: int = DEFAULT_MAX_TOPICS
    ) -> None:
        if max_topics < 1:
            raise ValueError(f"max_topics={max_topics} must be at least 1")
        self.publication = publication
        self.stats = stats
        self.max_topics = max_topics
        self._topics: dict[str, str] = {}
        """Collection (or kind) -> the topic its events go out as."""

    def topic_of(self, raw: bytes) -> str:
        """The topic of an event already accepted into the stream (so it parses)."""
        meta = parse_event(raw)
        key = meta.collection if meta.kind == KIND_COMMIT and meta.collection else meta.kind
        topic = self._topics.get(key)
        if topic is None:
            if len(self._topics) >= self.max_topics:
                topic = OVERFLOW_TOPIC
            else:
                try:
                    check_topic_name(key)
                    topic = key
                except TopicNameError:
                    topic = OVERFLOW_TOPIC
                self._topics[key] = topic
        if topic is OVERFLOW_TOPIC:
            self.stats.topic_overflow += 1
        return topic

    def try_offer(self, raw: bytes, topic: str) -> bool:
        """One offer: True when it is done (in the topic stream, or dropped for want of any topic subscriber,
        counted), False when the caller must ``await offer(...)``."""
        stats = self.stats
        try:
            result = self.publication.offer(topic, raw)
        except ValueError:  # longer than the topic stream's largest message
            stats.oversized += 1
            return True
        if result >= 0:
            stats.topic_published += 1
            return True
        if result == OfferResult.NOT_CONNECTED:
            stats.topic_not_connected += 1
            return True
        if result == OfferResult.CLOSED:
            raise PublicationClosedError("topic publication offer failed: CLOSED")
        if result == OfferResult.MAX_POSITION_EXCEEDED:
            raise IngestError("topic publication offer failed: MAX_POSITION_EXCEEDED")
        if result == OfferResult.BACK_PRESSURED:
            stats.topic_back_pressured += 1
        return False  # BACK_PRESSURED, ADMIN_ACTION: again

    async def offer(self, raw: bytes, topic: str) -> None:
        """Offer until done, parking from 50 µs doubling to 10 ms while the topic stream back-pressures."""
        park_ns = _OFFER_IDLE.min_park_ns
        while not self.try_offer(raw, topic):
            await asyncio.sleep(park_ns / 1e9)
            park_ns = min(park_ns * 2, _OFFER_IDLE.max_park_ns)


class Source(Protocol):
    async def run(self, publisher: StreamPublisher) -> None: ...


def check_rate(rate: float) -> float:
    """A generator rate in events/s: finite and >= 0 (0 = as fast as the stream takes them)."""
    if not isinstance(rate, (int, float)) or math.isnan(rate) or math.isinf(rate) or rate < 0:
        raise ValueError(f"rate={rate!r} must be a finite number of events per second >= 0 (0 = unlimited)")
    return float(rate)


class GeneratorSource:
    """The relay as origin: synthetic events at ``rate`` events/s (0 = unlimited), ``count`` of them
    (None = forever), stamped by an :class:`OriginClock`."""

    def __init__(
        self, generator: EventGenerator, rate: float, *, count: int | None = None, clock: OriginClock | None = None
    ) -> None:
        self.generator = generator
        self.rate = check_rate(rate)
        if count is not None and count < 0:
            raise ValueError(f"count={count} must not be negative")
        self.count = count
        self.clock = clock or OriginClock()

    async def run(self, publisher: StreamPublisher) -> None:
        gen, clock, rate = self.generator, self.clock, self.rate
        produced = 0
        start = time.monotonic()
        while self.count is None or produced < self.count:
            if rate > 0:
                elapsed = time.monotonic() - start
                due = int(elapsed * rate) + 1 - produced
                if due <= 0:
                    await asyncio.sleep((produced + 1) / rate - elapsed)
                    continue
                if due > rate:  # more than a second behind (back-pressure): do not burst to catch up
                    start += (due - rate) / rate
                    due = int(rate) or 1
            else:
                due = 256
            if self.count is not None:
                due = min(due, self.count - produced)
            for _ in range(min(due, 1024)):
                time_us = clock.next()
                publisher.stats.received += 1
                raw = gen.make_event(time_us)
                if not publisher.try_publish(raw, time_us):
                    await publisher.publish(raw, time_us)
                produced += 1
            await asyncio.sleep(0)


def check_upstream_url(url: str) -> str:
    """A ``ws://`` or ``wss://`` URL; a bare host or ``/`` path gets ``/subscribe``. Errors name the problem."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"upstream URL {url!r} is not a valid URL: {e}") from None
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"upstream URL {url!r} must start with ws:// or wss:// (got scheme {parts.scheme!r})")
    if not parts.hostname:
        raise ValueError(f"upstream URL {url!r} has no host")
    if port == 0:
        raise ValueError(f"upstream URL {url!r} has port 0")
    if parts.fragment:
        raise ValueError(f"upstream URL {url!r} must not have a #fragment")
    path = parts.path if parts.path not in ("", "/") else "/subscribe"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def with_cursor(url: str, cursor: int | None) -> str:
    """``url`` with its ``cursor`` parameter replaced (other parameters, e.g. filters, kept)."""
    parts = urllib.parse.urlsplit(url)
    query = [
        (k, v)
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        if k not in ("cursor", "compress")
    ]
    if cursor is not None:
        query.append(("cursor", str(cursor)))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query, safe=":*")))


@renamed_duration_keywords(
    {
        name + "_s": (name + "_ns", 1_000_000_000)
        for name in ("backoff_initial", "backoff_max", "open_timeout", "ping_interval")
    }
)
class UpstreamSource:
    """Follow an upstream jetstream, reconnecting with back-off (see the module docstring)."""

    def __init__(
        self,
        url: str,
        sequencer: Sequencer,
        *,
        backoff_initial_ns: int = 250_000_000,
        backoff_max_ns: int = 10_000_000_000,
        open_timeout_ns: int = 10_000_000_000,
        ping_interval_ns: int = 20_000_000_000,
    ) -> None:
        self.url = check_upstream_url(url)
        if not 0 < backoff_initial_ns <= backoff_max_ns:
            raise ValueError(
                f"backoff_initial_ns={backoff_initial_ns} and backoff_max_ns={backoff_max_ns} "
                "must satisfy 0 < initial <= max"
            )
        self.sequencer = sequencer
        self.backoff_initial_ns = backoff_initial_ns
        self.backoff_max_ns = backoff_max_ns
        self.open_timeout_ns = open_timeout_ns
        self.ping_interval_ns = ping_interval_ns
        self._log = structlog.get_logger().bind(role="jetstream.ingest", upstream=self.url)

    async def run(self, publisher: StreamPublisher) -> None:
        stats, sequencer = publisher.stats, self.sequencer
        sequencer.stats = stats
        delay_ns = self.backoff_initial_ns
        while True:
            cursor = sequencer.resume_cursor()
            url = with_cursor(self.url, cursor)
            received_before = stats.received
            try:
                async with connect(
                    url,
                    compression=None,
                    max_size=UPSTREAM_MAX_MESSAGE_LENGTH,
                    open_timeout=self.open_timeout_ns / 1e9,
                    ping_interval=self.ping_interval_ns / 1e9,
                    ping_timeout=self.ping_interval_ns / 1e9,
                    close_timeout=2,
                    user_agent_header="logbuf-jetstream",
                ) as ws:
                    stats.connections += 1
                    sequencer.on_connect(cursor)
                    self._log.info("upstream.connected", cursor=cursor)
                    accept, try_publish, publish = sequencer.accept, publisher.try_publish, publisher.publish
                    try:
                        while True:
                            message = await ws.recv()  # str for a text frame, bytes for a binary one
                            if isinstance(message, str):
                                out = accept(message.encode())
                                if out is not None and not try_publish(*out):
                                    await publish(*out)
                            else:
                                stats.received += 1
                                stats.invalid += 1
                                stats.last_error = "binary frame (a compressed upstream?): dropped"
                    except (asyncio.CancelledError, LogbufError):
                        # Stopped, or the stream's publication closed (a new driver session follows): say
                        # "going away", not the 1011 websockets sends when an exception leaves the block.
                        await ws.close(CLOSE_GOING_AWAY, "relay ingest stopping")
                        raise
            except asyncio.CancelledError:
                raise
            except websockets.exceptions.InvalidStatus as e:
                status = e.response.status_code
                body = bytes(e.response.body or b"").decode(errors="replace").strip()[:200]
                if 400 <= status < 500 and status not in (408, 429):  # our request is wrong: retrying won't help
                    raise IngestError(f"upstream {url} refused the subscription: HTTP {status} {body}") from None
                stats.disconnects += 1
                stats.last_error = f"HTTP {status} {body}"[:200]
                self._log.warning("upstream.refused", status=status, body=body, retry_in_s=round(delay_ns / 1e9, 3))
            except (TimeoutError, OSError, websockets.exceptions.WebSocketException) as e:
                stats.disconnects += 1
                stats.last_error = f"{type(e).__name__}: {e}"[:200]
                self._log.warning(
                    "upstream.disconnected",
                    error=stats.last_error,
                    events=stats.received - received_before,
                    retry_in_s=round(delay_ns / 1e9, 3),
                )
            if stats.received > received_before:
                delay_ns = self.backoff_initial_ns
            await asyncio.sleep(delay_ns / 1e9)
            delay_ns = min(delay_ns * 2, self.backoff_max_ns)


class Ingest:
    """Runs one source into a publication on its own thread: ``start()``, ``stop()``, ``stats``."""

    def __init__(
        self,
        publication: Publisher,
        source: Source,
        *,
        topics: TopicPublisher | None = None,
        max_topics: int = DEFAULT_MAX_TOPICS,
    ) -> None:
        """``topics``: also offer each event on this topic publication, its collection as the topic."""
        self.stats = IngestStats()
        tee = TopicTee(topics, self.stats, max_topics=max_topics) if topics is not None else None
        self.publisher = StreamPublisher(publication, self.stats, tee)
        self.source = source
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self.error: BaseException | None = None
        self._log = structlog.get_logger().bind(role="jetstream.ingest")

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._run, name="jetstream-ingest", daemon=True)
        self._thread.start()
        self._started.wait(10)
        return self._thread

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._started.set()
        self._log.info("ingest.started", source=type(self.source).__name__)
        try:
            await self.source.run(self.publisher)
        except asyncio.CancelledError:
            pass
        except Exception as e:
            self.error = e
            self._log.error("ingest.failed", error=repr(e))
        finally:
            self._log.info("ingest.stopped", **self.stats.snapshot())

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the source to finish (a generator with a count); True if it did."""
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed in between
                pass
        self.join(timeout_s)
