"""System counters: which counter sits in which slot of the CnC counters, with its type id and label.

The driver allocates the system counters first, in this order, so a counter's slot (counter id) is
its position here. The first 46 are Aeron 1.53's ``aeron_system_counter_enum_t``, same slot, same
type id (0), same key (the id as int32), same label, so AeronStat, a Java or C tool that looks a
counter up by id, and ``logbuf-stat`` read either driver alike. logbuf's own counters follow, from
slot 46, with type id :data:`~logbuf.conduit.counters_descriptor.LOGBUF_SYSTEM_COUNTER_TYPE_ID` and
their own ids (from 100) in the key, so no Aeron tool takes them for one of its own::

    slot  0 .. 45   type 0      key = Aeron's id (= slot)       Aeron 1.53's system counters
    slot 46 .. 62   type 1003   key = logbuf's id (100 ..)      logbuf's own

Value record: value, registration id = the counter's id, owner id = -1 (what Aeron 1.53 writes).
Aeron counters that logbuf has no cause to move (proxy offer failures, name resolution, revocation,
...) are allocated all the same and stay 0. ``protocol_spec/counters.md`` has the table.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from importlib import metadata
from typing import Final

from logbuf.conduit import counters_descriptor as cd

AERON_RELEASE: Final[str] = "1.53.0"
"""The Aeron release whose system counters (slots, ids, type ids, labels) these are."""


def _logbuf_version() -> str:
    try:
        return metadata.version("logbuf")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        return "0.0.0"


LOGBUF_VERSION: Final[str] = _logbuf_version()

VERSION_INFO: Final[str] = f"version=logbuf-{LOGBUF_VERSION} commit=none"
"""Where Aeron's labels say ``version=1.53.0 commit=<sha>``."""

SYSTEM_COUNTER_KEY: Final[struct.Struct] = struct.Struct("<i")
"""A system counter's key: its id."""

SYSTEM_COUNTER_OWNER_ID: Final[int] = -1
"""Owner id in a system counter's value record (Aeron's null value)."""

THREADING_MODE: Final[str] = "SHARED"
"""logbuf runs conductor, sender and receiver on one duty cycle: Aeron's SHARED threading mode,
which Aeron appends to the cycle-time labels."""

CYCLE_TIME_THRESHOLD_NS: Final[int] = 100_000_000
"""A duty cycle longer than this counts in the three "exceeded threshold" counters (Aeron's default)."""


def semantic_version(major: int, minor: int, patch: int) -> int:
    """Agrona's ``SemanticVersion.compose``: one byte each, major highest."""
    for name, part in (("major", major), ("minor", minor), ("patch", patch)):
        if not 0 <= part <= 255:
            raise ValueError(f"{name}={part} must be within 0..255")
    return (major << 16) | (minor << 8) | patch


CONTROL_PROTOCOL_VERSION: Final[int] = semantic_version(1, 0, 0)
"""Value of the "Control protocol version" counter: the client/driver command protocol logbuf speaks
(Aeron 1.53 reports 1.0.0)."""


class SystemCounterId(IntEnum):
    """A system counter's id: its key. Aeron's are also their slot; logbuf's start at 100."""

    BYTES_SENT = 0
    BYTES_RECEIVED = 1
    RECEIVER_PROXY_FAILS = 2
    SENDER_PROXY_FAILS = 3
    CONDUCTOR_PROXY_FAILS = 4
    NAK_MESSAGES_SENT = 5
    NAK_MESSAGES_RECEIVED = 6
    STATUS_MESSAGES_SENT = 7
    STATUS_MESSAGES_RECEIVED = 8
    HEARTBEATS_SENT = 9
    HEARTBEATS_RECEIVED = 10
    RETRANSMITS_SENT = 11
    FLOW_CONTROL_UNDER_RUNS = 12
    FLOW_CONTROL_OVER_RUNS = 13
    INVALID_PACKETS = 14
    ERRORS = 15
    SHORT_SENDS = 16
    FREE_FAILS = 17
    SENDER_FLOW_CONTROL_LIMITS = 18
    UNBLOCKED_PUBLICATIONS = 19
    UNBLOCKED_COMMANDS = 20
    POSSIBLE_TTL_ASYMMETRY = 21
    CONTROLLABLE_IDLE_STRATEGY = 22
    LOSS_GAP_FILLS = 23
    CLIENT_TIMEOUTS = 24
    RESOLUTION_CHANGES = 25
    CONDUCTOR_MAX_CYCLE_TIME = 26
    CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED = 27
    SENDER_MAX_CYCLE_TIME = 28
    SENDER_CYCLE_TIME_THRESHOLD_EXCEEDED = 29
    RECEIVER_MAX_CYCLE_TIME = 30
    RECEIVER_CYCLE_TIME_THRESHOLD_EXCEEDED = 31
    NAME_RESOLVER_MAX_TIME = 32
    NAME_RESOLVER_TIME_THRESHOLD_EXCEEDED = 33
    AERON_VERSION = 34
    BYTES_CURRENTLY_MAPPED = 35
    RETRANSMITTED_BYTES = 36
    RETRANSMIT_OVERFLOW = 37
    ERROR_FRAMES_RECEIVED = 38
    ERROR_FRAMES_SENT = 39
    PUBLICATIONS_REVOKED = 40
    PUBLICATION_IMAGES_REVOKED = 41
    IMAGES_REJECTED = 42
    CONTROL_PROTOCOL_VERSION = 43
    STATUS_MESSAGES_REJECTED = 44
    NATIVE_RESOURCE_AGENT_PROXY_FAILS = 45
    # logbuf's own (type id LOGBUF_SYSTEM_COUNTER_TYPE_ID)
    COMMANDS_RECEIVED = 100
    DATAGRAMS_SENT = 101
    DATAGRAMS_RECEIVED = 102
    SETUPS_SENT = 103
    SETUPS_RECEIVED = 104
    ACTIVE_CLIENTS = 105
    ACTIVE_PUBLICATIONS = 106
    ACTIVE_IMAGES = 107
    SPOOFED_FRAMES_DROPPED = 108
    CONDUCTOR_BUSY_CPU_TIME = 109
    SENDER_BUSY_CPU_TIME = 110
    RECEIVER_BUSY_CPU_TIME = 111
    NAKS_MALFORMED = 112
    NAKS_FROM_NON_RECEIVERS = 113
    NAKS_WITHOUT_RESEND = 114
    RETRANSMITS_RATE_LIMITED = 115
    CORRUPT_LOG_FRAMES = 120  # an id apart from the next ones added above, which other work may take


FIRST_LOGBUF_ID: Final[int] = 100
"""logbuf's own system counter ids start here (Aeron's run 0 .. 45)."""


@dataclass(frozen=True, slots=True)
class SystemCounterDescriptor:
    id: SystemCounterId
    label: str
    udp: bool = False
    """Moved only by UDP traffic (the live view of ``logbuf-stat`` hides it, idle, on an IPC-only driver)."""

    @property
    def type_id(self) -> int:
        return cd.SYSTEM_COUNTER_TYPE_ID if self.id < FIRST_LOGBUF_ID else cd.LOGBUF_SYSTEM_COUNTER_TYPE_ID

    @property
    def key(self) -> bytes:
        return SYSTEM_COUNTER_KEY.pack(int(self.id))


_I = SystemCounterId
_D = SystemCounterDescriptor
DESCRIPTORS: Final[tuple[SystemCounterDescriptor, ...]] = (
    _D(_I.BYTES_SENT, "Bytes sent", udp=True),
    _D(_I.BYTES_RECEIVED, "Bytes received", udp=True),
    _D(_I.RECEIVER_PROXY_FAILS, "Failed offers to ReceiverProxy"),
    _D(_I.SENDER_PROXY_FAILS, "Failed offers to SenderProxy"),
    _D(_I.CONDUCTOR_PROXY_FAILS, "Failed offers to DriverConductorProxy"),
    _D(_I.NAK_MESSAGES_SENT, "NAKs sent", udp=True),
    _D(_I.NAK_MESSAGES_RECEIVED, "NAKs received", udp=True),
    _D(_I.STATUS_MESSAGES_SENT, "Status Messages sent", udp=True),
    _D(_I.STATUS_MESSAGES_RECEIVED, "Status Messages received", udp=True),
    _D(_I.HEARTBEATS_SENT, "Heartbeats sent", udp=True),
    _D(_I.HEARTBEATS_RECEIVED, "Heartbeats received", udp=True),
    _D(_I.RETRANSMITS_SENT, "Retransmits sent", udp=True),
    _D(_I.FLOW_CONTROL_UNDER_RUNS, "Flow control under runs", udp=True),
    _D(_I.FLOW_CONTROL_OVER_RUNS, "Flow control over runs", udp=True),
    _D(_I.INVALID_PACKETS, "Invalid packets", udp=True),
    _D(_I.ERRORS, f"Errors: {VERSION_INFO}"),
    _D(_I.SHORT_SENDS, "Short sends", udp=True),
    _D(_I.FREE_FAILS, "Failed attempts to free log buffers"),
    _D(_I.SENDER_FLOW_CONTROL_LIMITS, "Sender flow control limits, i.e. back-pressure events", udp=True),
    _D(_I.UNBLOCKED_PUBLICATIONS, "Unblocked Publications"),
    _D(_I.UNBLOCKED_COMMANDS, "Unblocked Control Commands"),
    _D(_I.POSSIBLE_TTL_ASYMMETRY, "Possible TTL Asymmetry", udp=True),
    _D(_I.CONTROLLABLE_IDLE_STRATEGY, "ControllableIdleStrategy status"),
    _D(_I.LOSS_GAP_FILLS, "Loss gap fills", udp=True),
    _D(_I.CLIENT_TIMEOUTS, "Client liveness timeouts"),
    _D(_I.RESOLUTION_CHANGES, "Resolution changes: driverName="),
    _D(_I.CONDUCTOR_MAX_CYCLE_TIME, f"Conductor max cycle time doing its work in ns: {THREADING_MODE}"),
    _D(
        _I.CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED,
        f"Conductor work cycle exceeded threshold count: threshold=100ms {THREADING_MODE}",
    ),
    _D(_I.SENDER_MAX_CYCLE_TIME, f"Sender max cycle time doing its work in ns: {THREADING_MODE}"),
    _D(
        _I.SENDER_CYCLE_TIME_THRESHOLD_EXCEEDED,
        f"Sender work cycle exceeded threshold count: threshold=100ms {THREADING_MODE}",
    ),
    _D(_I.RECEIVER_MAX_CYCLE_TIME, f"Receiver max cycle time doing its work in ns: {THREADING_MODE}"),
    _D(
        _I.RECEIVER_CYCLE_TIME_THRESHOLD_EXCEEDED,
        f"Receiver work cycle exceeded threshold count: threshold=100ms {THREADING_MODE}",
    ),
    _D(_I.NAME_RESOLVER_MAX_TIME, "NameResolver max time in ns"),
    _D(_I.NAME_RESOLVER_TIME_THRESHOLD_EXCEEDED, "NameResolver exceeded threshold count: threshold=5s"),
    _D(_I.AERON_VERSION, f"Aeron software: {VERSION_INFO}"),
    _D(_I.BYTES_CURRENTLY_MAPPED, "Bytes currently mapped"),
    _D(_I.RETRANSMITTED_BYTES, "Retransmitted bytes", udp=True),
    _D(_I.RETRANSMIT_OVERFLOW, "Retransmit Pool Overflow count", udp=True),
    _D(_I.ERROR_FRAMES_RECEIVED, "Error Frames received", udp=True),
    _D(_I.ERROR_FRAMES_SENT, "Error Frames sent", udp=True),
    _D(_I.PUBLICATIONS_REVOKED, "Publications Revoked"),
    _D(_I.PUBLICATION_IMAGES_REVOKED, "Publication Images Revoked", udp=True),
    _D(_I.IMAGES_REJECTED, "Images rejected", udp=True),
    _D(_I.CONTROL_PROTOCOL_VERSION, "Control protocol version"),
    _D(_I.STATUS_MESSAGES_REJECTED, "Status Messages rejected", udp=True),
    _D(_I.NATIVE_RESOURCE_AGENT_PROXY_FAILS, "Failed offers to NativeResourceAgentProxy"),
    _D(_I.COMMANDS_RECEIVED, "Client commands received"),
    _D(_I.DATAGRAMS_SENT, "Datagrams sent", udp=True),
    _D(_I.DATAGRAMS_RECEIVED, "Datagrams received", udp=True),
    _D(_I.SETUPS_SENT, "Setups sent", udp=True),
    _D(_I.SETUPS_RECEIVED, "Setups received", udp=True),
    _D(_I.ACTIVE_CLIENTS, "Active clients"),
    _D(_I.ACTIVE_PUBLICATIONS, "Active publications"),
    _D(_I.ACTIVE_IMAGES, "Active images"),
    _D(_I.SPOOFED_FRAMES_DROPPED, "Spoofed frames dropped", udp=True),
    _D(_I.CONDUCTOR_BUSY_CPU_TIME, "Conductor busy CPU time in ns"),
    _D(_I.SENDER_BUSY_CPU_TIME, "Sender busy CPU time in ns"),
    _D(_I.RECEIVER_BUSY_CPU_TIME, "Receiver busy CPU time in ns"),
    _D(_I.NAKS_MALFORMED, "NAKs malformed", udp=True),
    _D(_I.NAKS_FROM_NON_RECEIVERS, "NAKs from non-receivers", udp=True),
    _D(_I.NAKS_WITHOUT_RESEND, "NAKs with nothing to resend", udp=True),
    _D(_I.RETRANSMITS_RATE_LIMITED, "Retransmits rate limited", udp=True),
    # a frame length no publisher can write, met by a client's poll (once per image and position) or by the
    # conductor's unblocker (which then refuses to pad over it)
    _D(_I.CORRUPT_LOG_FRAMES, "Corrupt log frames"),
)
"""Every system counter in slot order: ``DESCRIPTORS[slot]``."""

AERON_SYSTEM_COUNTER_COUNT: Final[int] = sum(1 for d in DESCRIPTORS if d.id < FIRST_LOGBUF_ID)
"""How many of Aeron's system counters there are (46 in 1.53); logbuf's start at this slot."""

BY_ID: Final[dict[SystemCounterId, SystemCounterDescriptor]] = {d.id: d for d in DESCRIPTORS}
SLOTS: Final[dict[SystemCounterId, int]] = {d.id: slot for slot, d in enumerate(DESCRIPTORS)}
"""Counter id (slot) of each system counter in a logbuf driver's CnC."""

LABELS: Final[dict[SystemCounterId, str]] = {d.id: d.label for d in DESCRIPTORS}

UDP_SYSTEM_COUNTER_IDS: Final[frozenset[int]] = frozenset(int(d.id) for d in DESCRIPTORS if d.udp)
"""Ids of the system counters that only UDP traffic moves."""

SYSTEM_COUNTER_TYPE_IDS: Final[frozenset[int]] = frozenset(
    {cd.SYSTEM_COUNTER_TYPE_ID, cd.LOGBUF_SYSTEM_COUNTER_TYPE_ID}
)
"""Type ids of system counters: Aeron's and logbuf's own."""


def check_descriptors() -> None:
    """Aeron's counters sit in the slots of their ids, every id once, logbuf's after Aeron's."""
    for slot, descriptor in enumerate(DESCRIPTORS[:AERON_SYSTEM_COUNTER_COUNT]):
        if descriptor.id != slot:
            raise ValueError(f"Aeron system counter {descriptor.id.name} (id {int(descriptor.id)}) is in slot {slot}")
    if len(BY_ID) != len(DESCRIPTORS) or len(BY_ID) != len(SystemCounterId):
        raise ValueError("every SystemCounterId needs exactly one descriptor")


check_descriptors()
