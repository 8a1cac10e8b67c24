"""Limits on what clients may cost the relay: incoming bytes, client messages per connection, and events
per second per address.

Theory of operation
-------------------
**Incoming frames.** Clients send the relay almost nothing (an ``options_update`` now and then), but
a websocket frame header may declare up to 2^63 bytes, and a parser that waits for the payload holds
whatever has arrived. :class:`FrameMeter` follows the client's byte stream beside the parser and
reads each frame header (RFC 6455 §5.2) as soon as it is complete, so the relay knows how long the
message in progress *says* it will be before buffering any of it. The server reserves that length
against two bounds, the per-connection message cap and a total for all connections, and closes with
1009 the moment a declaration exceeds either; the bytes of a refused frame are never buffered.
Control frames (at most 125 bytes) are not counted; the fragments of a message count together until
its final frame has arrived.

**Client messages per second.** A client message is an ``options_update`` (anything else is ignored), and
an honest client sends one when it connects (``requireHello``) and again when its filters change; one
with 10,000 DIDs is ~360 kB and costs milliseconds to validate, so the cost is in the bytes.
:class:`MessageBucket` is each connection's pair of token buckets: messages
(``max_client_messages_per_s``, burst ``client_message_burst``) and message bytes
(``max_client_message_bytes_per_s``, burst ``max_client_message_length``: one message of the largest
size always fits a fresh bucket). A message that finds either short closes the connection with 1008
before it is parsed. The per-IP connection cap bounds what one address can send to
``max_connections_per_ip`` times that.

**Events per second.** Jetstream's legacy server gives each client address a token bucket shared by
all of that address's connections (rate and burst both ``max_events_per_ip_s``, 5,000 by default) and
delays sends when it is empty; it never disconnects for it. :class:`EventRateLimiter` is that bucket,
sans-IO (``now_ns`` in). The fan-out engine asks it for a number of events before planning a range
and sends at most what it grants; what is left waits for the next pass. Within one pass an address's
tokens are shared fairly: each connection of the address may take at most its share of what the
bucket held when the pass first touched the address.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CONTROL_OPCODE_MIN",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_CONNECTIONS_PER_IP",
    "DEFAULT_CLIENT_MESSAGE_BURST",
    "DEFAULT_MAX_CLIENT_MESSAGE_BYTES_PER_S",
    "DEFAULT_MAX_CLIENT_MESSAGES_PER_S",
    "DEFAULT_MAX_EVENTS_PER_IP_S",
    "EventRateLimiter",
    "FrameMeter",
    "MessageBucket",
]

#: Connections from one client address (jetstream's legacy cap); more get 429.
DEFAULT_MAX_CONNECTIONS_PER_IP: Final = 100
#: Connections in all; more get 503 (each is a file descriptor: mind the open-files limit).
DEFAULT_MAX_CONNECTIONS: Final = 50_000
#: jetstream's legacy per-address rate (``JETSTREAM_MAX_SUB_RATE``): events/s, also the burst.
DEFAULT_MAX_EVENTS_PER_IP_S: Final = 5000.0

#: Client messages (``options_update``) per second per connection, sustained: filters change rarely.
DEFAULT_MAX_CLIENT_MESSAGES_PER_S: Final = 1.0
#: Client messages a connection may send at once (a fresh connection's bucket is full).
DEFAULT_CLIENT_MESSAGE_BURST: Final = 10
#: Client message bytes per second per connection, sustained: a 10,000-DID update (~360 kB) every ~4 s.
DEFAULT_MAX_CLIENT_MESSAGE_BYTES_PER_S: Final = 100_000

#: Opcodes 0x8 and up are control frames (close, ping, pong): at most 125 bytes, never fragmented.
CONTROL_OPCODE_MIN: Final = 0x8
_FIN: Final = 0x80
_MASK: Final = 0x80
_LEN16: Final = 126
_LEN64: Final = 127


class FrameMeter:
    """Follows a client's websocket byte stream and reports the declared length of the message in progress."""

    __slots__ = ("_header", "_need", "_payload_left", "_final", "message_length", "messages_begun")

    def __init__(self) -> None:
        self._header = bytearray()
        self._need = 2  # header bytes needed before the header can be read
        self._payload_left = 0
        self._final = False  # the frame being received ends its message
        self.message_length = 0
        """Sum of the declared payload lengths of the data frames of the message in progress (0: none)."""
        self.messages_begun = 0
        """Data messages whose first frame header has been read (a caller that compares it across
        :meth:`feed` learns whether the message in progress began in that data)."""

    def feed(self, data: bytes | memoryview) -> int:
        """Follow ``data``; returns :attr:`message_length` after it (the largest it reached if a
        message both started and ended inside ``data``)."""
        peak = self.message_length
        i, n = 0, len(data)
        while i < n:
            if self._payload_left:
                take = min(self._payload_left, n - i)
                self._payload_left -= take
                i += take
                if not self._payload_left and self._final:
                    self.message_length = 0
                continue
            take = min(self._need - len(self._header), n - i)
            self._header += data[i : i + take]
            i += take
            if len(self._header) < self._need:
                continue
            header = self._header
            if self._need == 2:  # the first two bytes say how long the header is
                len7 = header[1] & 0x7F
                self._need = 2 + (2 if len7 == _LEN16 else 8 if len7 == _LEN64 else 0) + (4 if header[1] & _MASK else 0)
                if len(header) < self._need:
                    continue
            len7 = header[1] & 0x7F
            if len7 == _LEN16:
                length = int.from_bytes(header[2:4], "big")
            elif len7 == _LEN64:
                length = int.from_bytes(header[2:10], "big")
            else:
                length = len7
            opcode = header[0] & 0x0F
            self._header = bytearray()
            self._need = 2
            self._payload_left = length
            if opcode >= CONTROL_OPCODE_MIN:
                self._final = False  # a control frame inside a fragmented message leaves it open
                continue
            self._final = bool(header[0] & _FIN)
            if opcode != 0:  # a text or binary frame begins a message; continuation frames (0) extend it
                self.messages_begun += 1
            self.message_length += length
            peak = max(peak, self.message_length)
            if length == 0 and self._final:
                self.message_length = 0
        return max(peak, self.message_length)


class MessageBucket:
    """One connection's token buckets of client messages and of their bytes (sans-IO: ``now_ns`` in);
    both start full."""

    __slots__ = ("_messages", "_bytes", "_updated_ns", "_per_ns", "_bytes_per_ns", "_burst", "_bytes_burst")

    def __init__(self, per_s: float, burst: int, bytes_per_s: float, bytes_burst: int, now_ns: int) -> None:
        for name, value in (
            ("per_s", per_s),
            ("burst", burst),
            ("bytes_per_s", bytes_per_s),
            ("bytes_burst", bytes_burst),
        ):
            if not value > 0 or not math.isfinite(value):
                raise ValueError(f"{name}={value!r} must be a finite number > 0")
        self._per_ns = per_s / 1e9
        self._bytes_per_ns = bytes_per_s / 1e9
        self._burst = self._messages = float(burst)
        self._bytes_burst = self._bytes = float(bytes_burst)
        self._updated_ns = now_ns

    def take(self, length: int, now_ns: int) -> bool:
        """Spend one message and ``length`` bytes; False (nothing spent) when either bucket is short."""
        if now_ns > self._updated_ns:
            elapsed = now_ns - self._updated_ns
            self._messages = min(self._burst, self._messages + elapsed * self._per_ns)
            self._bytes = min(self._bytes_burst, self._bytes + elapsed * self._bytes_per_ns)
            self._updated_ns = now_ns
        if self._messages < 1.0 or self._bytes < length:
            return False
        self._messages -= 1.0
        self._bytes -= length
        return True


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated_ns: int
    connections: int = 0
    pass_id: int = -1  # the fan-out pass that last computed ``share``
    share: int = 0


class EventRateLimiter:
    """Per-address token buckets of events (rate = burst = ``events_per_s``); see the module docstring.

    ``attach(ip)`` / ``detach(ip)`` as connections come and go (a bucket is forgotten with its last
    connection); ``grant(ip, wanted, now_ns, pass_id)`` returns how many of ``wanted`` events may be
    sent now and takes them from the bucket.
    """

    def __init__(self, events_per_s: float) -> None:
        if not events_per_s > 0 or not math.isfinite(events_per_s):
            raise ValueError(f"events_per_s={events_per_s!r} must be a finite number > 0")
        self.rate_per_ns = events_per_s / 1e9
        self.burst = float(events_per_s)
        self._buckets: dict[str, _Bucket] = {}
        self.throttled = 0
        """Grants that gave less than asked (the client waited for tokens)."""

    def attach(self, ip: str, now_ns: int) -> None:
        bucket = self._buckets.get(ip)
        if bucket is None:
            bucket = self._buckets[ip] = _Bucket(self.burst, now_ns)
        bucket.connections += 1

    def detach(self, ip: str) -> None:
        bucket = self._buckets.get(ip)
        if bucket is None:
            return
        bucket.connections -= 1
        if bucket.connections <= 0:
            del self._buckets[ip]

    def grant(self, ip: str, wanted: int, now_ns: int, pass_id: int) -> int:
        if wanted <= 0:
            return 0
        bucket = self._buckets.get(ip)
        if bucket is None:  # not attached: not limited
            return wanted
        if now_ns > bucket.updated_ns:
            bucket.tokens = min(self.burst, bucket.tokens + (now_ns - bucket.updated_ns) * self.rate_per_ns)
            bucket.updated_ns = now_ns
        if bucket.pass_id != pass_id:
            bucket.pass_id = pass_id
            bucket.share = max(1, math.ceil(bucket.tokens / max(1, bucket.connections)))
        granted = min(wanted, bucket.share, int(bucket.tokens))
        bucket.tokens -= granted
        if granted < wanted:
            self.throttled += 1
        return granted

    def __len__(self) -> int:
        return len(self._buckets)
