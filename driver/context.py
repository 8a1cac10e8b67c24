"""The media driver's one configuration: every setting with its CLI flag, environment name,
default and trade-off, gathered in :class:`DriverContext` and validated once by ``conclude()``.

Besides the settings, the context carries what the driver's agents are given rather than make
(STYLE section 5): the clocks and the UDP transport factory. Tests swap them (a fake clock, an
in-memory lossy link); they have no CLI flag or environment name.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from typing import Any

from logbuf.agent import IDLE_STRATEGIES, parse_cpu_list
from logbuf.conduit.error_log import epoch_ms
from logbuf.directory import ENV_PREFIX, resolve_dir
from logbuf.driver.destination_tracker import AllowedSources
from logbuf.driver.udp import TransportFactory, UdpTransport
from logbuf.durations import parse_duration_ns, renamed_duration_keywords
from logbuf.errors import ConfigurationError
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd


def _size(text: str) -> int:
    """Sizes accept k/m/g suffixes (powers of 1024)."""
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024**2, "g": 1024**3}.get(t[-1:], 1)
    return int(t[:-1] if mult != 1 else t) * mult


def _duration_ns(text: str) -> int:
    """Durations in :mod:`logbuf.durations`' grammar (``100us``, ``10s``, ``5m``); a bare number is nanoseconds."""
    return parse_duration_ns(text)


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false)")


_PARSERS: dict[str, Callable[[str], Any]] = {
    "float": float,
    "size": _size,
    "duration": _duration_ns,
    "bool": _bool,
    "str": str,
    "int": int,
}


def setting(default: Any, kind: str, doc: str, default_text: str | None = None) -> Any:
    """A field with its kind (how to parse text) and the line on its trade-off; ``default_text`` says
    what the default means where the value alone does not (an empty string, a 0 that means "derived")."""
    return field(default=default, metadata={"kind": kind, "doc": doc, "default_text": default_text})


_DURATION_UNITS = (("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000), ("ns", 1))
_SIZE_UNITS = (("g", 1024**3), ("m", 1024**2), ("k", 1024))
METAVARS: dict[str, str] = {"duration": "DURATION", "size": "SIZE", "bool": "BOOL", "float": "FRACTION", "int": "N"}


def format_default(kind: str, value: Any) -> str:
    """A default as one would type it: durations with a unit (``10s``, ``100us``), sizes with k/m/g."""
    if kind == "duration" and isinstance(value, int) and value > 0:
        return next(f"{value // unit}{suffix}" for suffix, unit in _DURATION_UNITS if value % unit == 0)
    if kind == "size" and isinstance(value, int) and value > 0:
        return next((f"{value // unit}{suffix}" for suffix, unit in _SIZE_UNITS if value % unit == 0), str(value))
    if kind == "bool":
        return "true" if value else "false"
    return str(value)


def injected(default: Any) -> Any:
    """A field the driver is given, not configured: no CLI flag, no environment name, not in the summary."""
    return field(default=default, repr=False, compare=False)


def _settings(cls: type[DriverContext] | DriverContext) -> list[Field[Any]]:
    return [f for f in fields(cls) if "kind" in f.metadata]


def setting_name(setting: Field[Any]) -> str:
    """The name people type for a setting: its field's name, less the ``_ns`` a duration carries in code (people
    give the unit with the value: ``--nak-delay 100us``, ``LOGBUF_NAK_DELAY=100us``)."""
    return setting.name.removesuffix("_ns") if setting.metadata["kind"] == "duration" else setting.name


def flag_name(setting: Field[Any]) -> str:
    """The setting's command-line flag (``--nak-delay`` for ``nak_delay_ns``)."""
    return "--" + setting_name(setting).replace("_", "-")


def env_name(setting: Field[Any]) -> str:
    """The setting's environment variable (``LOGBUF_NAK_DELAY`` for ``nak_delay_ns``)."""
    return ENV_PREFIX + setting_name(setting).upper()


_RENAMED_DURATIONS = (
    "client_liveness_timeout",
    "driver_timeout",
    "publication_linger_timeout",
    "publication_unblock_timeout",
    "command_unblock_timeout",
    "timer_interval",
    "image_liveness_timeout",
    "publication_connection_timeout",
    "status_message_timeout",
    "nak_delay",
    "nak_retry_delay",
    "nak_multicast_max_backoff",
    "flow_control_receiver_timeout",
    "mdc_destination_timeout",
    "retransmit_linger",
)
"""Duration fields named without their unit before they took ``_ns`` (they held nanoseconds already)."""


@renamed_duration_keywords({old: (old + "_ns", 1) for old in _RENAMED_DURATIONS})
@dataclass
class DriverContext:
    """Media driver settings. CLI ``--term-length``/env ``LOGBUF_TERM_LENGTH`` for field ``term_length``, etc.;
    a duration field carries ``_ns`` (integer nanoseconds) and its flag and variable do not
    (``nak_delay_ns``: ``--nak-delay``, ``LOGBUF_NAK_DELAY``, given as ``100us``)."""

    dir: str = setting(
        "", "str", "Where the CnC and logs live; clients use the same.", default_text="/dev/shm/logbuf-<user>"
    )
    ipc_term_length: int = setting(
        64 * 1024 * 1024, "size", "Term length of IPC logs: larger absorbs bursts, costs 3x in shared memory."
    )
    term_length: int = setting(16 * 1024 * 1024, "size", "Term length of network logs (UDP).")
    mtu: int = setting(dh.DEFAULT_MTU_LENGTH, "size", "Largest frame: larger means fewer fragments for big messages.")
    ipc_term_window_length: int = setting(
        0,
        "size",
        "How far publishers may run ahead of the slowest subscriber.",
        default_text="0, half the IPC term length",
    )
    client_liveness_timeout_ns: int = setting(
        10_000_000_000, "duration", "A client silent this long is timed out and its resources reclaimed."
    )
    driver_timeout_ns: int = setting(
        10_000_000_000, "duration", "Clients give up on a driver whose heartbeat is older than this."
    )
    publication_linger_timeout_ns: int = setting(
        5_000_000_000, "duration", "How long a closed publication's log stays for subscribers to drain."
    )
    publication_unblock_timeout_ns: int = setting(
        15_000_000_000,
        "duration",
        "A publication whose consumers are stuck below its tail this long "
        "has a dead publisher's claim padded over (Aeron's unblock).",
    )
    command_unblock_timeout_ns: int = setting(
        0,
        "duration",
        "A command ring stuck this long behind a record nobody commits (a client died mid-write, or "
        "wrote nonsense) is unblocked; 0 = half the client liveness timeout, so that the keepalives "
        "queued behind it still arrive in time. Shorter risks padding over a slow client's command.",
    )
    timer_interval_ns: int = setting(100_000_000, "duration", "How often the conductor heartbeats and checks timeouts.")
    idle_strategy: str = setting("backoff", "str", "Conductor idle strategy: backoff, sleep, yield or spin.")
    busy_cpu_time: bool = setting(
        False,
        "bool",
        "Count each agent's busy CPU time (thread CPU of duty cycles that did work) in the conductor/sender/"
        "receiver busy CPU time counters, so a benchmark can tell work from idling: costs ~2.5 us per duty cycle.",
    )
    cpu_affinity: str = setting(
        "auto",
        "str",
        "CPUs the duty cycle runs on: a list such as 0 or 0-1, 'any' (the scheduler decides), or 'auto': a "
        "CPU no other auto-placed driver holds, from the highest down, none on a 1-CPU machine. On a small "
        "machine each driver on its own core halves UDP round trips; two sharing one double them.",
    )
    to_driver_buffer_length: int = setting(1024 * 1024, "size", "Command ring capacity (power of 2).")
    to_clients_buffer_length: int = setting(1024 * 1024, "size", "Response broadcast capacity (power of 2).")
    counters_buffer_length: int = setting(1024 * 1024, "size", "Counter values buffer (128 bytes per counter).")
    error_buffer_length: int = setting(1024 * 1024, "size", "Distinct error log length.")
    loss_report_buffer_length: int = setting(
        1024 * 1024,
        "size",
        "loss-report.dat length (rounded up to 4 KiB); one entry (64-192 bytes) per image that saw loss, "
        "and images that find it full stop reporting (Aeron's aeron.loss.report.buffer.length).",
    )
    topic_registry_length: int = setting(
        1024 * 1024,
        "size",
        "topics.dat length (a multiple of 4 KiB), reserved in the driver directory at start: one 8-byte aligned "
        "record of 16 bytes + the name per topic published or learnt on this host (~25,000 topics of 24-byte "
        "names per MiB); a full registry refuses new topics. Larger costs /dev/shm on every driver.",
    )
    group_access: bool = setting(False, "bool", "Create files group-readable/writable (0660) instead of owner-only.")
    dir_delete_on_shutdown: bool = setting(True, "bool", "Remove the driver directory on clean shutdown.")
    image_liveness_timeout_ns: int = setting(
        10_000_000_000, "duration", "An image with no packets this long becomes unavailable."
    )
    publication_connection_timeout_ns: int = setting(
        5_000_000_000, "duration", "A network publication with no status message this long is not connected."
    )
    status_message_timeout_ns: int = setting(
        200_000_000, "duration", "Longest gap between a receiver's status messages."
    )
    nak_delay_ns: int = setting(100_000, "duration", "Delay before a gap is NAKed (lets reordered data arrive).")
    nak_retry_delay_ns: int = setting(10_000_000, "duration", "Delay before a still-open gap is NAKed again.")
    nak_multicast_max_backoff_ns: int = setting(
        10_000_000,
        "duration",
        "Multicast receivers NAK after a random delay up to this (RFC 5401 back-off, Aeron's): longer means "
        "fewer duplicate NAKs from a group, slower recovery. A channel's nak-delay= replaces it.",
    )
    nak_multicast_group_size: int = setting(10, "int", "Expected multicast group size, shaping the NAK back-off.")
    flow_control_receiver_timeout_ns: int = setting(
        5_000_000_000,
        "duration",
        "A receiver of a multicast or MDC publication silent this long leaves its flow-control group (fc=...,t: "
        "per channel).",
    )
    mdc_destination_timeout_ns: int = setting(
        5_000_000_000, "duration", "A dynamic MDC destination with no status message this long is dropped."
    )
    mdc_dynamic_allow: str = setting(
        "",
        "str",
        "Sources whose status messages a control-mode=dynamic MDC publication hears: comma-separated hosts or "
        "networks, each with an optional :port (10.0.0.0/8,192.168.1.7:40456). Empty: any source, as Aeron, which lets one "
        "forged SM make the publication send its stream to a victim's address; a list closes that but a "
        "receiver not on it cannot join.",
    )
    retransmit_linger_ns: int = setting(
        10_000_000,
        "duration",
        "A byte resent for a NAK is not resent again for this long, whatever offsets later NAKs name "
        "(Aeron's retransmit linger): shorter repairs a lost retransmit sooner, longer caps what a flood of "
        "NAKs can draw from the sender.",
    )
    max_retransmits: int = setting(
        16,
        "int",
        "Retransmits of one publication lingering at once (as Aeron); NAKs beyond are counted "
        "(Retransmit Pool Overflow) and dropped, and their receivers NAK again: more repairs many scattered "
        "losses at once, fewer bounds the resends one NAK flood can draw.",
    )
    retransmit_max_rate: int = setting(
        256 * 1024,
        "size",
        "Bytes per second one publication may retransmit besides a quarter of the bytes of new data it sends "
        "(bursts of max(a tenth of a second's worth, 256 KiB) at once); NAKs beyond are counted (Retransmits "
        "rate limited) and dropped: higher repairs heavy loss (over a fifth of the stream) or loss on a blocked "
        "stream sooner, lower caps what NAKs, forged or not, add to what the sender sends.",
    )
    initial_window_length: int = setting(
        128 * 1024,
        "size",
        "Receiver window, how far past what its subscribers consumed a receiver lets a sender run (capped at "
        "term/2, at most socket_buffer_length; a channel's rcv-wnd overrides it). Aeron's 128k: one window per "
        "status-message round trip bounds a stream's rate, so fast streams want more (rcv-wnd=1m), but under "
        "fc=min a receiver whose position plus window is over a window behind the group's is not admitted "
        "(Aeron's rule), so receivers of one min/tagged group should share one window.",
    )
    max_images_per_endpoint: int = setting(
        128,
        "int",
        "Images one receive endpoint holds at most: a SETUP beyond it is counted (Images rejected) and "
        "dropped, so a SETUP flood cannot use up counters and /dev/shm. Existing images are unaffected; a "
        "new publisher cannot join while a flood holds the endpoint full (flooded images time out).",
    )
    max_image_term_length: int = setting(
        128 * 1024 * 1024,
        "size",
        "Longest term a SETUP from the network may ask for (an image takes 3 terms of /dev/shm): longer "
        "is counted (Images rejected) and dropped. Raise it to receive from publications with longer terms.",
    )
    max_client_endpoints: int = setting(
        1024,
        "int",
        "UDP endpoints (sockets) one client's publications and subscriptions may hold open at once; a "
        "registration that would open one more is refused with an error naming this setting. Each costs the "
        "driver a file descriptor, up to 2 x socket_buffer_length of kernel memory and some Python state, "
        "all shared with every other client: higher lets one client take more of it.",
    )
    max_client_registrations: int = setting(
        4096,
        "int",
        "Publications plus subscriptions one client may hold at once; beyond it a registration is refused "
        "with an error naming this setting. Bounds the driver memory and per-command work one runaway "
        "client can cause; raise it for a client that really holds thousands of streams.",
    )
    client_counters_share: float = setting(
        0.5,
        "float",
        "Fraction of the counters left beside the system counters (counters_buffer_length / 128 in all) one "
        "client's registrations may hold; beyond it a registration is refused with an error naming this "
        "setting, so one client cannot leave the others no counters for new streams. 1 = no share (first come, "
        "first served).",
    )
    socket_buffer_length: int = setting(2 * 1024 * 1024, "size", "SO_RCVBUF/SO_SNDBUF of UDP sockets.")
    udp_gso: bool = setting(
        True,
        "bool",
        "Send each run of equal-length datagrams with one UDP GSO send (Linux UDP_SEGMENT) and read coalesced "
        "datagrams (UDP_GRO): the same datagrams reach the wire and the peer, with the kernel's send and receive "
        "paths run once per run instead of once per datagram. Packet captures on the sending host (and "
        "netfilter rules there) see a run as one large packet. Off: one sendmmsg entry per datagram.",
    )
    udp_drop_rate: float = setting(0.0, "float", "Fault injection: fraction of received datagrams dropped.")
    udp_duplicate_rate: float = setting(0.0, "float", "Fault injection: fraction of received datagrams duplicated.")
    udp_reorder_rate: float = setting(0.0, "float", "Fault injection: fraction of received datagrams reordered.")
    udp_fault_seed: int = setting(0, "int", "Fault injection: random seed.")
    termination_token: str = setting(
        "", "str", "TERMINATE_DRIVER stops the driver only if it carries this token; empty denies it, as Aeron does."
    )

    # -- injected ------------------------------------------------------------------------------------
    clock_ns: Callable[[], int] = injected(time.monotonic_ns)
    """Monotonic nanoseconds: every timeout and interval of the conductor, sender and receiver."""
    epoch_clock_ms: Callable[[], int] = injected(epoch_ms)
    """Wall-clock milliseconds: the CnC heartbeat, client heartbeat counters, error log times."""
    udp_transport: TransportFactory = injected(UdpTransport)
    """Makes each UDP endpoint's transport (a bound socket by default)."""

    def conclude(self) -> DriverContext:
        """Validate everything once; errors name the setting and its value."""
        self._check_logs()
        self._check_durations()
        self._check_agents_and_buffers()
        self._check_udp()
        self._check_limits()
        return self

    def _check_logs(self) -> None:
        """The directory, term lengths, MTU and IPC window."""
        self.dir = resolve_dir(self.dir or None)
        if not os.path.isabs(self.dir):
            raise ConfigurationError(f"dir={self.dir!r} must be an absolute path")
        for name in ("ipc_term_length", "term_length"):
            try:
                lbd.check_term_length(getattr(self, name))
            except lbd.LogBufferError as e:
                raise ConfigurationError(f"{name}: {e}") from None
        try:
            dh.check_mtu_length(self.mtu, min(self.ipc_term_length, self.term_length))
        except ValueError as e:
            raise ConfigurationError(f"mtu: {e}") from None
        if self.ipc_term_window_length and not self.mtu <= self.ipc_term_window_length <= self.ipc_term_length // 2:
            raise ConfigurationError(
                f"ipc_term_window_length={self.ipc_term_window_length} must be within mtu..ipc_term_length/2"
            )

    def _check_durations(self) -> None:
        """The durations: positive (the command unblock timeout may be 0: off)."""
        for name in (
            "client_liveness_timeout_ns",
            "driver_timeout_ns",
            "publication_linger_timeout_ns",
            "publication_unblock_timeout_ns",
            "timer_interval_ns",
        ):
            self._check_positive_duration(name)
        if self.command_unblock_timeout_ns < 0:
            raise ConfigurationError(
                f"command_unblock_timeout={self.command_unblock_timeout_ns}ns must be 0 or a positive duration"
            )

    def _check_positive_duration(self, name: str) -> None:
        """Errors name the setting as people type it (``nak_retry_delay``, ``--nak-retry-delay``)."""
        if getattr(self, name) <= 0:
            raise ConfigurationError(f"{name.removesuffix('_ns')}={getattr(self, name)}ns must be a positive duration")

    def _check_agents_and_buffers(self) -> None:
        """CPU affinity, idle strategy, the CnC buffers and UDP fault rates."""
        try:
            if self.cpu_affinity not in ("auto", "any"):
                parse_cpu_list(self.cpu_affinity)
        except ConfigurationError as e:
            raise ConfigurationError(f"cpu_affinity: {e}") from None
        if self.idle_strategy not in IDLE_STRATEGIES:
            raise ConfigurationError(f"idle_strategy={self.idle_strategy!r} is not one of {sorted(IDLE_STRATEGIES)}")
        for name in ("to_driver_buffer_length", "to_clients_buffer_length"):
            value = getattr(self, name)
            if value < 4096 or value & (value - 1):
                raise ConfigurationError(f"{name}={value} must be a power of 2 >= 4096")
        if self.counters_buffer_length < 128 * 64 or self.counters_buffer_length % 128:
            raise ConfigurationError(
                f"counters_buffer_length={self.counters_buffer_length} must be a multiple of 128, at least 8192"
            )
        for name in ("udp_drop_rate", "udp_duplicate_rate", "udp_reorder_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigurationError(f"{name}={getattr(self, name)} must be a fraction within 0..1")

    def _check_udp(self) -> None:
        """The network settings: timeouts, retransmits, MDC, NAKs and windows."""
        for name in (
            "image_liveness_timeout_ns",
            "publication_connection_timeout_ns",
            "status_message_timeout_ns",
            "nak_retry_delay_ns",
            "nak_multicast_max_backoff_ns",
            "flow_control_receiver_timeout_ns",
            "mdc_destination_timeout_ns",
            "retransmit_linger_ns",
        ):
            self._check_positive_duration(name)
        if self.max_retransmits < 1:
            raise ConfigurationError(f"max_retransmits={self.max_retransmits} must be at least 1")
        if self.retransmit_max_rate < self.mtu:
            raise ConfigurationError(
                f"retransmit_max_rate={self.retransmit_max_rate} must be at least mtu={self.mtu} bytes per second"
            )
        try:
            AllowedSources.parse(self.mdc_dynamic_allow)
        except ValueError as e:
            raise ConfigurationError(f"mdc_dynamic_allow: {e}") from None
        if self.nak_multicast_group_size < 1:
            raise ConfigurationError(f"nak_multicast_group_size={self.nak_multicast_group_size} must be at least 1")
        if self.initial_window_length < self.mtu:
            raise ConfigurationError(
                f"initial_window_length={self.initial_window_length} must be at least mtu={self.mtu}"
            )
        if self.initial_window_length > self.socket_buffer_length:
            raise ConfigurationError(
                f"initial_window_length={self.initial_window_length} must be at most "
                f"socket_buffer_length={self.socket_buffer_length} (a window the socket cannot buffer loses data)"
            )

    def _check_limits(self) -> None:
        """What a peer or one client may make the driver hold, and the remaining buffers."""
        if self.max_images_per_endpoint < 1:
            raise ConfigurationError(f"max_images_per_endpoint={self.max_images_per_endpoint} must be at least 1")
        for name in ("max_client_endpoints", "max_client_registrations"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name}={getattr(self, name)} must be at least 1")
        if not 0.0 < self.client_counters_share <= 1.0:
            raise ConfigurationError(
                f"client_counters_share={self.client_counters_share} must be a fraction within (0, 1]"
            )
        try:
            lbd.check_term_length(self.max_image_term_length)
        except lbd.LogBufferError as e:
            raise ConfigurationError(f"max_image_term_length: {e}") from None
        if self.loss_report_buffer_length < 4096:
            raise ConfigurationError(
                f"loss_report_buffer_length={self.loss_report_buffer_length} must be at least 4096"
            )
        if self.topic_registry_length < 4096 or self.topic_registry_length % 4096:
            raise ConfigurationError(
                f"topic_registry_length={self.topic_registry_length} must be a multiple of 4096, at least 4096"
            )
        if self.error_buffer_length < 4096:
            raise ConfigurationError(f"error_buffer_length={self.error_buffer_length} must be at least 4096")

    @property
    def effective_command_unblock_timeout_ns(self) -> int:
        """The command ring's unblock timeout with 0 resolved (half the client liveness timeout)."""
        return self.command_unblock_timeout_ns or max(1, self.client_liveness_timeout_ns // 2)

    @property
    def file_mode(self) -> int:
        return 0o660 if self.group_access else 0o600

    @property
    def dir_mode(self) -> int:
        return 0o770 if self.group_access else 0o700

    # -- construction from the environment and the command line -----------------------------------------
    @classmethod
    def from_sources(cls, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> DriverContext:
        """Defaults, overridden by ``LOGBUF_*`` environment variables, overridden by CLI flags."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in _settings(cls):
            key = env_name(f)
            if key in env:
                values[f.name] = cls._parse(setting_name(f), f.metadata["kind"], env[key], source=key)
        parser = cls.argument_parser()
        args = parser.parse_args(argv)
        for f in _settings(cls):
            text = getattr(args, f.name)
            if text is not None:
                values[f.name] = cls._parse(setting_name(f), f.metadata["kind"], text, source=flag_name(f))
        return cls(**values)

    @staticmethod
    def _parse(name: str, kind: str, text: str, *, source: str) -> Any:
        try:
            return _PARSERS[kind](text)
        except (ValueError, IndexError) as e:
            raise ConfigurationError(f"{source}={text!r} is not a valid {kind} for {name}: {e}") from None

    @classmethod
    def argument_parser(cls) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog="mediadriver",
            description="logbuf media driver: owns shared-memory logs and counters for local clients.",
            epilog="Durations take a unit: ns, us, ms or s (10s, 500ms; a bare number is nanoseconds). Sizes take "
            "k, m or g (64m; powers of 1024). Every flag also reads from LOGBUF_<NAME> (e.g. LOGBUF_DIR, "
            "LOGBUF_IPC_TERM_LENGTH); flags win.",
        )
        for f in _settings(cls):
            kind = f.metadata["kind"]
            default = f.metadata.get("default_text") or format_default(kind, f.default)
            parser.add_argument(
                flag_name(f),
                dest=f.name,
                default=None,
                metavar=METAVARS.get(kind, f.name.upper()),
                help=f"{f.metadata['doc']} (default: {default})",
            )
        return parser

    def summary(self) -> dict[str, Any]:
        return {
            f.name: "<set>" if f.name == "termination_token" and self.termination_token else getattr(self, f.name)
            for f in _settings(self)
        }
