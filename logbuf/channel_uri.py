"""Channel URIs: ``aeron:ipc`` and ``aeron:udp?endpoint=host:port|...`` (Aeron's ChannelUri shape).

Grammar: ``[aeron-spy:]aeron:<media>[?key=value|key=value...]``. Unknown keys, empty or duplicate
keys and bad values raise :class:`InvalidChannelError`, naming the part and quoting the URI.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from logbuf.durations import parse_duration_ns
from logbuf.errors import InvalidChannelError as InvalidChannelError  # raised here

SCHEME = "aeron"
SPY_PREFIX = "aeron-spy"
MEDIA = ("ipc", "udp")

# key -> one line on what it means; which media accept it.
COMMON_PARAMS: dict[str, str] = {
    "term-length": "term buffer length (power of 2, 64k..1g)",
    "mtu": "largest frame length (multiple of 32, <= 65504)",
    "init-term-id": "initial term id (with term-id and term-offset)",
    "term-id": "term id to start at (with init-term-id and term-offset)",
    "term-offset": "offset in that term to start at (multiple of 32)",
    "session-id": "fixed session id instead of a driver-assigned one",
    "linger": "how long a closed publication lingers (duration)",
    "sparse": "sparse log files (true/false)",
    "tether": "whether slow subscribers hold publishers back (true/false)",
    "rejoin": "rejoin after an image is lost (true/false)",
    "group": "group semantics for the subscription (true/false)",
    "eos": "end-of-stream signalling (true/false)",
    "alias": "a name for logs and tools; does not identify the stream",
    "tags": "comma-separated tags for matching channels",
    "pub-wnd": "publisher term window (bytes)",
    "ssc": "spies simulate connection (true/false)",
}
UDP_PARAMS: dict[str, str] = {
    "endpoint": "data address host:port (unicast) or multicast group:port",
    "interface": "local interface address[/prefix] to send or receive on",
    "control": "control address host:port (multi-destination or multicast control)",
    "control-mode": "dynamic, manual or response",
    "reliable": "retransmit lost data (true) or fill gaps with padding (false)",
    "ttl": "multicast time to live (0..255)",
    "rcv-wnd": "receiver window length (bytes)",
    "so-sndbuf": "socket send buffer length (bytes)",
    "so-rcvbuf": "socket receive buffer length (bytes)",
    "nak-delay": "delay before the first NAK (duration)",
    "fc": "flow control strategy: max, min or tagged[,args]",
    "cc": "congestion control: static or cubic",
    "gtag": "group tag this receiver's status messages carry (for fc=tagged)",
}
KNOWN_PARAMS: dict[str, dict[str, str]] = {"ipc": COMMON_PARAMS, "udp": {**COMMON_PARAMS, **UDP_PARAMS}}
IDENTITY_PARAMS: dict[str, tuple[str, ...]] = {
    "ipc": (),
    "udp": ("endpoint", "control", "control-mode", "interface"),
}

_SIZE = re.compile(r"^(\d+)([kmg]?)$", re.IGNORECASE)
_INTERFACE = re.compile(r"^(?P<host>[A-Za-z0-9.\-_]+)(?::(?P<port>\d+))?(?:/(?P<prefix>\d+))?$")
_ENDPOINT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.\-_]+)):(?P<port>\d+)$")


@dataclass(frozen=True)
class ChannelUri:
    prefix: str
    media: str
    params: Mapping[str, str] = field(default_factory=dict)
    original: str = ""

    @classmethod
    def parse(cls, uri: str) -> ChannelUri:
        if not isinstance(uri, str) or not uri:
            raise InvalidChannelError(f"channel must be a non-empty string, got {uri!r}")
        rest = uri
        prefix = ""
        if rest.startswith(SPY_PREFIX + ":"):
            prefix, rest = SPY_PREFIX, rest[len(SPY_PREFIX) + 1 :]
        if not rest.startswith(SCHEME + ":"):
            raise InvalidChannelError(f"channel must start with 'aeron:' (e.g. aeron:ipc): {uri!r}")
        rest = rest[len(SCHEME) + 1 :]
        media, _, query = rest.partition("?")
        if media not in MEDIA:
            raise InvalidChannelError(f"channel media {media!r} is not one of {', '.join(MEDIA)}: {uri!r}")
        params: dict[str, str] = {}
        if query:
            for part in query.split("|"):
                key, sep, value = part.partition("=")
                if not sep or not key:
                    raise InvalidChannelError(f"channel parameter {part!r} is not key=value: {uri!r}")
                if not value:
                    raise InvalidChannelError(f"channel parameter {key!r} has an empty value: {uri!r}")
                if key in params:
                    raise InvalidChannelError(f"channel parameter {key!r} is given twice: {uri!r}")
                if key not in KNOWN_PARAMS[media]:
                    raise InvalidChannelError(f"channel parameter {key!r} is not known for aeron:{media}: {uri!r}")
                params[key] = value
        self = cls(prefix, media, MappingProxyType(params), uri)
        self._validate()
        return self

    def _error(self, key: str, problem: str) -> InvalidChannelError:
        return InvalidChannelError(
            f"channel parameter {key}={self.params.get(key)!r} {problem}: {self.original or self}"
        )

    def _validate(self) -> None:
        if (
            self.media == "udp"
            and "endpoint" not in self.params
            and "control" not in self.params
            and self.params.get("control-mode") != "manual"
        ):
            raise InvalidChannelError(
                f"aeron:udp needs an endpoint (or control, or control-mode=manual) parameter: {self.original!r}"
            )
        self.term_length()
        self.mtu()
        self.session_id()
        self.linger_ns()
        self.nak_delay_ns()
        self.receiver_window_length()
        self.socket_buffer_lengths()
        for key in ("reliable", "sparse", "tether", "rejoin", "group", "eos", "ssc"):
            self._bool(key)
        self.initial_position()
        self.endpoint()
        self.interface_address()
        if "control" in self.params:
            self._endpoint("control")
        self.group_tag()
        ttl = self._int("ttl")
        if ttl is not None and not 0 <= ttl <= 255:
            raise self._error("ttl", "must be 0..255")
        if self.params.get("control-mode", "dynamic") not in ("dynamic", "manual", "response"):
            raise self._error("control-mode", "must be dynamic, manual or response")

    # -- typed accessors --------------------------------------------------------------------------------
    def get(self, key: str, default: str | None = None) -> str | None:
        return self.params.get(key, default)

    def _int(self, key: str, bits: int = 32) -> int | None:
        """``key``'s value as an integer that fits a signed ``bits``-bit field (as it goes on the wire or into
        the log metadata): outside that range, an error naming the key and the range."""
        if key not in self.params:
            return None
        try:
            value = int(self.params[key])
        except ValueError:
            raise self._error(key, "is not an integer") from None
        check_int_range(f"channel parameter {key}", value, bits, self.original or str(self))
        return value

    def _size(self, key: str) -> int | None:
        if key not in self.params:
            return None
        match = _SIZE.match(self.params[key])
        if not match:
            raise self._error(key, "is not a size (e.g. 65536, 64k, 16m, 1g)")
        return int(match[1]) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[match[2].lower()]

    def _bool(self, key: str) -> bool | None:
        if key not in self.params:
            return None
        value = self.params[key].lower()
        if value not in ("true", "false"):
            raise self._error(key, "must be true or false")
        return value == "true"

    def term_length(self) -> int | None:
        value = self._size("term-length")
        if value is not None and (value < 64 * 1024 or value > 1024**3 or value & (value - 1)):
            raise self._error("term-length", "must be a power of 2 from 64k to 1g")
        return value

    def mtu(self) -> int | None:
        value = self._size("mtu")
        if value is not None and (value <= 32 or value > 65504 or value % 32):
            raise self._error("mtu", "must be a multiple of 32, greater than 32 and at most 65504")
        return value

    def session_id(self) -> int | None:
        return self._int("session-id")

    def _duration_ns(self, key: str) -> int | None:
        if key not in self.params:
            return None
        try:
            value = parse_duration_ns(self.params[key])  # a bare number: nanoseconds, as in Aeron's URIs
        except ValueError:
            raise self._error(key, "is not a duration (e.g. 5s, 100ms, 10us, 500ns)") from None
        check_int_range(f"channel parameter {key} (in ns)", value, 64, self.original or str(self))
        return value

    def linger_ns(self) -> int | None:
        return self._duration_ns("linger")

    def nak_delay_ns(self) -> int | None:
        return self._duration_ns("nak-delay")

    def socket_buffer_lengths(self) -> tuple[int | None, int | None]:
        """``so-rcvbuf`` and ``so-sndbuf`` (bytes), None where not given."""
        lengths = []
        for key in ("so-rcvbuf", "so-sndbuf"):
            value = self._size(key)
            if value is not None and not 0 < value <= 1 << 31:
                raise self._error(key, "must be 1 byte to 2g")
            lengths.append(value)
        return lengths[0], lengths[1]

    def receiver_window_length(self) -> int | None:
        value = self._size("rcv-wnd")
        if value is not None and (value < 32 or value % 32):
            raise self._error("rcv-wnd", "must be a multiple of 32, at least 32")
        return value

    def reliable(self) -> bool:
        value = self._bool("reliable")
        return True if value is None else value

    def sparse(self) -> bool | None:
        return self._bool("sparse")

    def tether(self) -> bool:
        value = self._bool("tether")
        return True if value is None else value

    def initial_position(self) -> tuple[int, int, int] | None:
        keys = ("init-term-id", "term-id", "term-offset")
        given = [k for k in keys if k in self.params]
        if not given:
            return None
        if len(given) != 3:
            raise InvalidChannelError(
                f"channel parameters init-term-id, term-id and term-offset go together (got {', '.join(given)}): "
                f"{self.original!r}"
            )
        init, term_id, offset = (self._int(k) for k in keys)
        assert init is not None and term_id is not None and offset is not None
        if offset < 0 or offset % 32:
            raise self._error("term-offset", "must be a non-negative multiple of 32")
        if offset > (self.term_length() or 16 * 1024 * 1024):
            raise self._error("term-offset", "must be at most the term length")
        if not 0 <= (term_id - init) & 0xFFFFFFFF < (1 << 31):
            raise self._error("term-id", "must not be before init-term-id")
        return init, term_id, offset

    def _endpoint(self, key: str) -> tuple[str, int] | None:
        if key not in self.params:
            return None
        match = _ENDPOINT.match(self.params[key])
        if not match:
            raise self._error(key, "is not host:port or [ipv6]:port")
        port = int(match["port"])
        if not 1 <= port <= 65535:
            raise self._error(key, "has a port outside 1..65535")
        return (match["v6"] or match["host"]), port

    def endpoint(self) -> tuple[str, int] | None:
        return self._endpoint("endpoint")

    def control(self) -> tuple[str, int] | None:
        return self._endpoint("control")

    def interface(self) -> str | None:
        return self.params.get("interface")

    def interface_address(self) -> tuple[str, int, int | None] | None:
        """``interface=host[:port][/prefix]`` as (host, port or 0, prefix length or None)."""
        if "interface" not in self.params:
            return None
        match = _INTERFACE.match(self.params["interface"])
        if not match:
            raise self._error("interface", "is not host[:port][/prefix]")
        port = int(match["port"] or 0)
        if not 0 <= port <= 65535:
            raise self._error("interface", "has a port outside 0..65535")
        prefix = int(match["prefix"]) if match["prefix"] is not None else None
        if prefix is not None and not 0 <= prefix <= 32:
            raise self._error("interface", "has a prefix length outside 0..32")
        return match["host"], port, prefix

    def control_mode(self) -> str | None:
        return self.params.get("control-mode")

    def group_tag(self) -> int | None:
        """``gtag=``: a 64-bit integer."""
        return self._int("gtag", 64)

    def ttl(self) -> int | None:
        return self._int("ttl")

    def alias(self) -> str | None:
        return self.params.get("alias")

    def canonical_form(self) -> str:
        """What identifies the stream's transport: ``aeron:ipc``, or udp with its addresses."""
        identity = [f"{k}={self.params[k]}" for k in IDENTITY_PARAMS[self.media] if k in self.params]
        return f"{SCHEME}:{self.media}" + ("?" + "|".join(identity) if identity else "")

    def __str__(self) -> str:
        head = (f"{self.prefix}:" if self.prefix else "") + f"{SCHEME}:{self.media}"
        return head + ("?" + "|".join(f"{k}={v}" for k, v in self.params.items()) if self.params else "")


def check_int_range(name: str, value: int, bits: int = 32, where: str = "") -> int:
    """``value`` if it fits a signed ``bits``-bit field, else an :class:`InvalidChannelError` naming ``name``,
    the value and the range (so that a stream id or a URI's int parameter never reaches a ``struct.pack``
    that would fail with a bare ``struct.error``)."""
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not low <= value <= high:
        suffix = f": {where}" if where else ""
        raise InvalidChannelError(f"{name}={value} is outside the int{bits} range {low}..{high}{suffix}")
    return value


def check_stream_id(stream_id: int) -> int:
    """A stream id as given beside a channel: an int32 (an :class:`InvalidChannelError` names it otherwise)."""
    if isinstance(stream_id, bool) or not isinstance(stream_id, int):
        raise InvalidChannelError(f"stream_id={stream_id!r} is not an integer")
    return check_int_range("stream_id", stream_id)
