"""``logbuf-gateway fastpuss``: FASTPUSS's text protocol over UDP, carried by a logbuf topic stream.

FASTPUSS clients send one UTF-8 datagram per message (``protocol_spec/topics.md``, "The FASTPUSS gateway")::

    message = verb, S, topic, S, body ;   S = { white space } ;   verb = 'PUB' | 'SUB' | 'MSG'

``PUB <topic> <body>`` publishes, ``SUB <topic>`` subscribes the datagram's source (client id ``/host:port``),
and the gateway sends ``MSG <topic>\\n<body>`` to every subscribed client. Where FASTPUSS's broker nodes share
subscription state (PULL/PUSH over TCP), gateways share the *messages*: each gateway puts every PUB it takes on
a logbuf topic stream that every gateway reads (IPC for its own host, one UDP publication per peer), and each
delivers to its own clients; a client may fail over to any gateway by sending its SUB there.

Theory of operation: :func:`parse` and :func:`encode_msg` are the sans-IO codec; :class:`FastpussGateway` is an
agent (``do_work``: read up to a batch of datagrams, poll the topic subscriptions, expire silent clients) that
only moves bytes. Malformed datagrams (not UTF-8, no verb, no topic, ``MSG`` from a client, too long) are counted
and dropped. Bounds: ``max_clients``, ``max_subscriptions_per_client``; ``client_expiry_ns`` drops the
subscriptions of a client not heard from for that long (0: never); ``allow_unsubscribe`` accepts ``UNSUB <topic>``
(not in FASTPUSS's grammar, so off by default).
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from logbuf.durations import duration_argument, renamed_duration_keywords
from logbuf.errors import ConfigurationError, LogbufError
from logbuf.topic_names import TopicNameError, check_topic_name

__all__ = ["FastpussGateway", "GatewayContext", "Message", "fastpuss_topic", "logbuf_topic", "parse", "encode_msg"]

MAX_DATAGRAM_LENGTH: Final[int] = 65_507
TOPIC_PREFIX: Final[str] = "fastpuss."
"""FASTPUSS topic ``t`` is logbuf topic ``fastpuss.t`` when that is a valid name (``fastpuss.>`` gets them all)."""
HEX_TOPIC_PREFIX: Final[str] = "fastpuss-hex."
"""... else ``fastpuss-hex.<hex of t's UTF-8>`` (a topic such as ``a..b`` or ``*``, valid in FASTPUSS)."""
_MESSAGE = re.compile(r"(PUB|SUB|MSG|UNSUB)\s*(\S+)\s*(.*)", re.DOTALL)


class MalformedMessage(LogbufError, ValueError):
    """A datagram that is not a FASTPUSS message (the text says why)."""


@dataclass(frozen=True, slots=True)
class Message:
    verb: str
    topic: str
    body: str


def parse(datagram: bytes) -> Message:
    """One datagram as a FASTPUSS message, or MalformedMessage naming the problem."""
    if len(datagram) > MAX_DATAGRAM_LENGTH:
        raise MalformedMessage(f"datagram of {len(datagram)} bytes exceeds {MAX_DATAGRAM_LENGTH}")
    try:
        text = datagram.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedMessage(f"not UTF-8: {e.reason} at byte {e.start}") from None
    found = _MESSAGE.fullmatch(text)
    if found is None:
        raise MalformedMessage(f"no verb and topic in {text[:40]!r}")
    return Message(found.group(1), found.group(2), found.group(3))


def encode_msg(topic: str, body: str) -> bytes:
    """What a subscriber receives: ``MSG <topic>\\n<body>``."""
    return f"MSG {topic}\n{body}".encode()


def logbuf_topic(fastpuss_topic_: str) -> str:
    """The logbuf topic name that carries a FASTPUSS topic."""
    name = TOPIC_PREFIX + fastpuss_topic_
    try:
        check_topic_name(name)
        return name
    except TopicNameError:
        return HEX_TOPIC_PREFIX + fastpuss_topic_.encode().hex()


def fastpuss_topic(logbuf_topic_: str) -> str | None:
    """The FASTPUSS topic a logbuf topic name carries (None: not a gateway topic)."""
    if logbuf_topic_.startswith(TOPIC_PREFIX):
        return logbuf_topic_[len(TOPIC_PREFIX) :]
    if logbuf_topic_.startswith(HEX_TOPIC_PREFIX):
        try:
            return bytes.fromhex(logbuf_topic_[len(HEX_TOPIC_PREFIX) :]).decode()
        except (ValueError, UnicodeDecodeError):
            return None
    return None


def client_id(address: tuple[str, int]) -> str:
    return f"/{address[0]}:{address[1]}"


@renamed_duration_keywords({"client_expiry_s": ("client_expiry_ns", 1_000_000_000)})
@dataclass
class GatewayContext:
    listen: tuple[str, int] = ("0.0.0.0", 7400)
    stream_id: int = 7400
    local_channel: str = "aeron:ipc"
    """Where this gateway's own PUBs go and are read back (every gateway on a host shares it)."""
    subscribe_channel: str | None = None
    """A UDP channel peers publish to (this host's endpoint), or None for a single host."""
    peer_channels: list[str] = field(default_factory=list)
    """One UDP channel per peer gateway's ``subscribe_channel``."""
    client_expiry_ns: int = 300_000_000_000
    allow_unsubscribe: bool = False
    max_clients: int = 10_000
    max_subscriptions_per_client: int = 1_000
    receive_batch: int = 256

    def conclude(self) -> GatewayContext:
        if self.client_expiry_ns < 0:
            raise ConfigurationError(f"client_expiry_ns={self.client_expiry_ns} must not be negative")
        if self.max_clients <= 0 or self.max_subscriptions_per_client <= 0:
            raise ConfigurationError("max_clients and max_subscriptions_per_client must be positive")
        return self


@dataclass(slots=True)
class _Client:
    address: tuple[str, int]
    topics: set[str]
    last_heard_ns: int


class FastpussGateway:
    """The agent. ``aeron``: a connected client of this host's driver; ``clock_ns``: monotonic nanoseconds
    (injectable)."""

    role_name = "fastpuss-gateway"

    def __init__(self, ctx: GatewayContext, aeron: Any, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.ctx = ctx.conclude()
        self._clock_ns = clock_ns
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(ctx.listen)
        self.sock.setblocking(False)
        self.address: tuple[str, int] = self.sock.getsockname()
        self._publications = [aeron.add_topic_publication(ctx.local_channel, ctx.stream_id)]
        self._publications += [aeron.add_topic_publication(c, ctx.stream_id) for c in ctx.peer_channels]
        channels = [ctx.local_channel] + ([ctx.subscribe_channel] if ctx.subscribe_channel else [])
        self._subscriptions = [aeron.add_topic_subscription(c, ctx.stream_id, []) for c in channels]
        self._clients: dict[str, _Client] = {}
        self._subscribers: dict[str, set[str]] = {}  # FASTPUSS topic -> client ids
        self.counts = {"received": 0, "published": 0, "delivered": 0, "malformed": 0, "refused": 0, "expired": 0}
        self._log = structlog.get_logger().bind(role=self.role_name, listen=client_id(self.address))
        self._next_expiry_ns = 0

    # -- the duty cycle ------------------------------------------------------------------------------------
    def do_work(self) -> int:
        work = self._receive()
        for sub in self._subscriptions:
            work += sub.poll(self._on_message, 256)
        now_ns = self._clock_ns()
        if self.ctx.client_expiry_ns and now_ns >= self._next_expiry_ns:
            self._next_expiry_ns = now_ns + min(1_000_000_000, self.ctx.client_expiry_ns // 4)
            work += self._expire(now_ns)
        return work

    def _receive(self) -> int:
        n = 0
        while n < self.ctx.receive_batch:
            try:
                datagram, address = self.sock.recvfrom(MAX_DATAGRAM_LENGTH + 1)
            except BlockingIOError:
                break
            n += 1
            self.counts["received"] += 1
            self.on_datagram(datagram, address[:2])
        return n

    def on_datagram(self, datagram: bytes, address: tuple[str, int]) -> None:
        try:
            message = parse(datagram)
        except MalformedMessage:
            self.counts["malformed"] += 1
            return
        if message.verb == "PUB":
            self._publish(message)
        elif message.verb == "SUB":
            self._subscribe(address, message.topic)
        elif message.verb == "UNSUB" and self.ctx.allow_unsubscribe:
            self._unsubscribe(address, message.topic)
        else:  # MSG goes to clients, never from them; UNSUB when not allowed
            self.counts["malformed"] += 1

    def _publish(self, message: Message) -> None:
        name = logbuf_topic(message.topic)
        body = message.body.encode()
        for pub in self._publications:
            pub.offer(name, body)  # a peer not connected or back-pressured misses it, as UDP would
        self.counts["published"] += 1

    def _subscribe(self, address: tuple[str, int], topic: str) -> None:
        key = client_id(address)
        client = self._clients.get(key)
        if client is None:
            if len(self._clients) >= self.ctx.max_clients:
                self.counts["refused"] += 1
                return
            client = self._clients[key] = _Client(address, set(), self._clock_ns())
        client.last_heard_ns = self._clock_ns()
        if topic in client.topics:
            return
        if len(client.topics) >= self.ctx.max_subscriptions_per_client:
            self.counts["refused"] += 1
            return
        client.topics.add(topic)
        clients = self._subscribers.setdefault(topic, set())
        if not clients:
            for sub in self._subscriptions:
                sub.subscribe(logbuf_topic(topic))
        clients.add(key)

    def _unsubscribe(self, address: tuple[str, int], topic: str) -> None:
        client = self._clients.get(client_id(address))
        if client is not None and topic in client.topics:
            client.topics.discard(topic)
            self._drop(client_id(address), topic)

    def _drop(self, key: str, topic: str) -> None:
        clients = self._subscribers.get(topic)
        if clients is None:
            return
        clients.discard(key)
        if not clients:
            del self._subscribers[topic]
            for sub in self._subscriptions:
                sub.unsubscribe(logbuf_topic(topic))

    def _expire(self, now_ns: int) -> int:
        stale = [k for k, c in self._clients.items() if now_ns - c.last_heard_ns > self.ctx.client_expiry_ns]
        for key in stale:
            client = self._clients.pop(key)
            for topic in client.topics:
                self._drop(key, topic)
            self.counts["expired"] += 1
            self._log.info("gateway.client_expired", client=key)
        return len(stale)

    def _on_message(self, buffer: memoryview, header: Any) -> None:
        name = self._subscriptions[0].topic_name(header.reserved_value)
        topic = fastpuss_topic(name) if name is not None else None
        clients = self._subscribers.get(topic) if topic is not None else None
        if not clients or topic is None:
            return
        try:
            datagram = encode_msg(topic, bytes(buffer).decode())
        except UnicodeDecodeError:
            self.counts["malformed"] += 1
            return
        for key in clients:
            try:
                self.sock.sendto(datagram, self._clients[key].address)
                self.counts["delivered"] += 1
            except OSError:
                pass  # a full socket buffer or an unreachable client: UDP's loss, as FASTPUSS's

    @property
    def client_ids(self) -> list[str]:
        return sorted(self._clients)

    def close(self) -> None:
        for sub in self._subscriptions:
            sub.close()
        for pub in self._publications:
            pub.close()
        self.sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="logbuf-gateway", description="Gateways from other protocols to logbuf.")
    commands = parser.add_subparsers(dest="protocol", required=True)
    fp = commands.add_parser("fastpuss", help="FASTPUSS's PUB/SUB/MSG text messages over UDP")
    fp.add_argument("--listen", required=True, help="udp://HOST:PORT for FASTPUSS clients")
    fp.add_argument("--dir", help="this host's driver directory")
    fp.add_argument("--stream-id", type=int, default=7400)
    fp.add_argument("--subscribe-channel", help="UDP channel peers publish to (this host's endpoint)")
    fp.add_argument("--peer", action="append", default=[], help="a peer gateway's subscribe channel (repeat)")
    fp.add_argument(
        "--client-expiry",
        type=duration_argument("s"),
        default=300_000_000_000,
        metavar="DURATION",
        help="silence before a client's SUBs go (e.g. 90s, 5m; a bare number is seconds; default 5m)",
    )
    fp.add_argument("--allow-unsubscribe", action="store_true", help="accept UNSUB <topic> (not FASTPUSS grammar)")
    fp.add_argument("--duration", type=duration_argument("s"), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from logbuf.client import Aeron, Context
    from logbuf.logging_config import configure_logging

    configure_logging("info")
    listen = args.listen.removeprefix("udp://")
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen={args.listen!r} is not udp://HOST:PORT")
    ctx = GatewayContext(
        listen=(host, int(port)),
        stream_id=args.stream_id,
        subscribe_channel=args.subscribe_channel,
        peer_channels=args.peer,
        client_expiry_ns=args.client_expiry,
        allow_unsubscribe=args.allow_unsubscribe,
    )
    with Aeron.connect(Context(dir=args.dir or "")) as aeron:
        gateway = FastpussGateway(ctx, aeron)
        log = structlog.get_logger().bind(role="fastpuss-gateway")
        log.info("gateway.started", listen=client_id(gateway.address))
        deadline = None if args.duration is None else time.monotonic() + args.duration / 1e9
        try:
            while deadline is None or time.monotonic() < deadline:
                if not gateway.do_work():
                    time.sleep(0.0005)
        except KeyboardInterrupt:
            pass
        finally:
            log.info("gateway.stopped", **gateway.counts)
            gateway.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
