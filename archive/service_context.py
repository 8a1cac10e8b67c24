"""The archive service's settings: one dataclass, one ``conclude()`` that validates them all.

Each setting is a ``logbuf-archive serve`` option (``--max-sessions`` for ``max_sessions``) with its default
and the trade-off beside it. Errors name the setting and the value.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from logbuf.archive.segments import DEFAULT_SEGMENT_LENGTH, effective_segment_length
from logbuf.channel_uri import ChannelUri
from logbuf.durations import renamed_duration_keywords
from logbuf.errors import ConfigurationError

__all__ = [
    "ArchiveContext",
    "DEFAULT_CONTROL_STREAM_ID",
    "DEFAULT_EVENTS_STREAM_ID",
    "DEFAULT_LOCAL_CONTROL_CHANNEL",
]

DEFAULT_LOCAL_CONTROL_CHANNEL = "aeron:ipc"
DEFAULT_CONTROL_STREAM_ID = 10
"""Aeron Archive's default control stream id (local and remote)."""
DEFAULT_EVENTS_STREAM_ID = 30
"""Aeron Archive's default recording events stream id."""


@renamed_duration_keywords(
    {
        **{
            old + "_ms": (old + "_ns", 1_000_000)
            for old in ("session_timeout", "connect_timeout", "progress_interval", "driver_timeout")
        },
        "idle_sleep_s": ("idle_sleep_ns", 1_000_000_000),
    }
)
@dataclass
class ArchiveContext:
    """Archive service settings (validated by :meth:`conclude`)."""

    archive_dir: str
    driver_dir: str = ""
    """The media driver's directory (default LOGBUF_DIR or /dev/shm/logbuf-<user>)."""
    local_control_channel: str = DEFAULT_LOCAL_CONTROL_CHANNEL
    """Control requests from processes on this host (empty: none). IPC: no authentication by default, as
    anyone who can map the driver's files can read every stream anyway."""
    control_channel: str = ""
    """Control requests from other hosts, ``aeron:udp?endpoint=ADDRESS:PORT`` (empty, the default: no remote
    control). Anyone who can reach the port can ask for replays: set ``allowed_clients`` and/or
    ``auth_secret`` when the network is not trusted."""
    control_stream_id: int = DEFAULT_CONTROL_STREAM_ID
    events_channel: str = ""
    """Recording events (started, progress, stopped) are published here (empty: none). IPC or UDP."""
    events_stream_id: int = DEFAULT_EVENTS_STREAM_ID
    max_sessions: int = 64
    """Control sessions at once, connecting ones included; a connect beyond it is counted and dropped. Each
    costs a response publication (a log in the driver)."""
    max_concurrent_replays: int = 16
    """Replays at once (MAX_REPLAYS error beyond it): each maps a segment and a publication log."""
    max_concurrent_recordings: int = 32
    """Recordings at once (MAX_RECORDINGS beyond it): each holds an image and a segment file open."""
    max_recording_subscriptions: int = 32
    """Start-recording subscriptions at once (each can record many images)."""
    session_timeout_ns: int = 10_000_000_000
    """A session that sends nothing (not even a keep-alive) for this long is closed."""
    connect_timeout_ns: int = 5_000_000_000
    """A session whose response channel does not connect within this is closed (and so is a challenge
    that is not answered)."""
    allowed_clients: list[str] = field(default_factory=list)
    """Remote control clients allowed to connect: addresses or networks (``10.0.0.0/8``, ``192.168.1.7``).
    Empty: any. Applies to the UDP control channel; IPC clients are local."""
    auth_secret: bytes = b""
    """A shared secret: every connect gets a challenge (a random nonce) that the client answers with
    HMAC-SHA256(secret, nonce || session id). Empty: no challenge."""
    authenticate_local: bool = False
    """Also challenge IPC clients when ``auth_secret`` is set."""
    response_to_source_only: bool = True
    """A remote client's response channel must name the host its control requests came from, so the
    service cannot be used to send datagrams at a third host (reflection)."""
    max_request_length: int = 16 * 1024
    """Longest control request accepted; longer ones are counted and dropped."""
    max_list_count: int = 10_000
    """Most descriptors one list request returns (a larger count is clipped)."""
    response_queue_length: int = 4096
    """Responses queued for one session while its response stream is back-pressured; a session whose
    queue overflows is closed (its client is not reading)."""
    requests_per_poll: int = 64
    """Control fragments taken per duty cycle (bounds one flood's share of the service's time)."""
    progress_interval_ns: int = 100_000_000
    """Recording progress events at most this often per recording."""
    segment_length: int = DEFAULT_SEGMENT_LENGTH
    """Segment file length of new recordings (a recording uses max(this, its term length))."""
    block_length: int = 1 << 20
    """Most bytes a recording writes per duty cycle."""
    checksum: str = "none"
    """``crc32``: record each DATA frame with its payload's CRC-32 (see ``logbuf-archive record``)."""
    time_index: bool = True
    """Index complete segments by time (so replays and Spark can start from a time)."""
    idle_sleep_ns: int = 1_000_000
    """Longest sleep of the service's duty cycle when idle."""
    driver_timeout_ns: int = 10_000_000_000
    """How long without a driver heartbeat before the service gives up its client."""
    archive_id: int = -1
    """This archive's id (ArchiveIdRequest); -1: derived from the catalog's path at start."""
    allowed_networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = field(default_factory=list, init=False)

    def conclude(self) -> ArchiveContext:
        if not self.archive_dir:
            raise ConfigurationError("archive_dir is empty: the service needs an archive directory")
        for name in ("local_control_channel", "control_channel", "events_channel"):
            value = getattr(self, name)
            if not value:
                continue
            try:
                uri = ChannelUri.parse(value)
            except ValueError as e:
                raise ConfigurationError(f"{name}={value!r}: {e}") from None
            if name == "local_control_channel" and uri.media != "ipc":
                raise ConfigurationError(f"local_control_channel={value!r} must be an aeron:ipc channel")
            if name == "control_channel" and (uri.media != "udp" or "endpoint" not in uri.params):
                raise ConfigurationError(f"control_channel={value!r} must be aeron:udp?endpoint=ADDRESS:PORT")
        if not self.local_control_channel and not self.control_channel:
            raise ConfigurationError("no control channel: set local_control_channel and/or control_channel")
        for name in ("control_stream_id", "events_stream_id"):
            value = getattr(self, name)
            if not -(1 << 31) <= value < (1 << 31):
                raise ConfigurationError(f"{name}={value} is not a 32-bit signed integer")
        for name in (
            "max_sessions",
            "max_concurrent_replays",
            "max_concurrent_recordings",
            "max_recording_subscriptions",
            "session_timeout_ns",
            "connect_timeout_ns",
            "max_list_count",
            "response_queue_length",
            "requests_per_poll",
            "progress_interval_ns",
            "driver_timeout_ns",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigurationError(f"{name}={value!r} must be a positive integer")
        if self.max_request_length < 256:
            raise ConfigurationError(f"max_request_length={self.max_request_length} must be at least 256")
        try:
            effective_segment_length(self.segment_length, 64 * 1024)
        except ValueError as e:
            raise ConfigurationError(f"segment_length={self.segment_length}: {e}") from None
        if self.block_length < 4096:
            raise ConfigurationError(f"block_length={self.block_length} must be at least 4096")
        if self.checksum.lower() not in ("none", "crc32"):
            raise ConfigurationError(f"checksum={self.checksum!r} must be 'none' or 'crc32'")
        networks = []
        for text in self.allowed_clients:
            try:
                networks.append(ipaddress.ip_network(text.strip(), strict=False))
            except ValueError:
                raise ConfigurationError(f"allowed_clients: {text!r} is not an address or network") from None
        self.allowed_networks = networks
        if self.idle_sleep_ns <= 0:
            raise ConfigurationError(f"idle_sleep_ns={self.idle_sleep_ns} must be positive")
        return self

    def client_allowed(self, address: str) -> bool:
        """Whether a remote client at ``address`` (an IP, no port) may connect."""
        if not self.allowed_networks:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.allowed_networks)
