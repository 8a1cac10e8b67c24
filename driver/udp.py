"""UDP channel endpoints: the one receive path, dispatching each datagram on its frame type.

A :class:`SendChannelEndpoint` is one transport per publication channel (ephemeral local port):
DATA, SETUP and heartbeats go to the channel's endpoint; status messages and NAKs come back to
it. A :class:`ReceiveChannelEndpoint` is one transport bound to a subscription channel's
endpoint: DATA-path datagrams and SETUPs come in; SMs and NAKs go back to each image's source
address. The protocol itself lives in :mod:`driver.network_publication` and
:mod:`driver.publication_image`; the sender and receiver agents (:mod:`driver.sender`,
:mod:`driver.receiver`) poll the endpoints and own their dispatch state.

**Dispatch.** The DATA of active images is decided in C a batch at a time
(:func:`logbuf.driver._udp.insert_data_batch`: inserted, a heartbeat, or an over- or under-run, by each
image's :class:`~logbuf.driver._udp.ImageReceiver`); everything else comes to
:meth:`ChannelEndpoint.on_datagram`, which checks the common header (length, version), picks the handler
for the frame type from a table built of :mod:`logbuf.protocol`'s constants and calls it. DATA and PAD it
sees are checked in C (``check_data_datagram``) and handed to their image's same native rule one by one;
every control frame goes through :func:`logbuf.protocol.codec.decode_exact` or
:func:`~logbuf.protocol.codec.decode_control` (one frame filling the datagram). A datagram that is
short, of another version, of a type the endpoint has no handler for, or malformed is counted
("Invalid packets") and dropped, never raised or logged per packet. Control frames meant for the
other side (an SM at a receive endpoint, an ERR at either) are decoded only so that a malformed
one counts.

**The socket seam.** An endpoint moves bytes through a :class:`DatagramTransport`, whose batch receive and
batch send run the native data path: a :class:`UdpTransport` (a non-blocking socket, ``recvmmsg`` batches,
``sendmmsg`` straight from the term) in the driver, an in-memory lossy link in the tests (the same native
routines without the syscalls), so the tests drive this same dispatch and the same C. The driver
context's ``udp_transport`` makes them. :class:`FaultInjector` (driver settings ``udp_drop_rate``,
``udp_duplicate_rate``, ``udp_reorder_rate``, ``udp_fault_seed``) drops, duplicates and reorders a
fraction of the datagrams a UDP transport receives, for tests and demos (those go through
:meth:`ChannelEndpoint.on_datagram` one by one).
"""

from __future__ import annotations

import fcntl
import ipaddress
import random
import select
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, TypeAlias

import numpy as np

from logbuf import native
from logbuf.driver import _udp
from logbuf.driver.destination_tracker import DestinationTracker
from logbuf.driver.lifecycle import ImageState
from logbuf.driver.network_publication import NetworkPublication, SendFrames
from logbuf.driver.publication_image import PublicationImage
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import nak as nak_codec
from logbuf.protocol import rttm as rttm_codec
from logbuf.protocol import setup as setup_codec
from logbuf.protocol import status as status_codec
from logbuf.protocol.codec import decode_control, decode_exact
from logbuf.protocol.frame_header import (
    COMMON_HEADER,
    COMMON_HEADER_LENGTH,
    CURRENT_VERSION,
    HDR_TYPE_DATA,
    HDR_TYPE_ERR,
    HDR_TYPE_NAK,
    HDR_TYPE_PAD,
    HDR_TYPE_RES,
    HDR_TYPE_RSP_SETUP,
    HDR_TYPE_RTTM,
    HDR_TYPE_SETUP,
    HDR_TYPE_SM,
    Buffer,
)

if TYPE_CHECKING:
    from logbuf.driver.proxies import ConductorCommands

READS_PER_POLL: Final[int] = 32
SLOT_LENGTH: Final[int] = 65536
"""Each poll reads up to 32 datagrams with one recvmmsg, each into its own 64 KiB slot (a coalesced
UDP_GRO read fills a slot with up to 64 datagrams)."""
SETUP_ELICIT_INTERVAL_NS: Final[int] = 100_000_000
MAX_ELICITED_SESSIONS: Final[int] = 1024
"""Unknown sessions a receive endpoint remembers having asked for a SETUP (the oldest is forgotten
first): DATA with a new session id per datagram must not grow the driver."""
_DATA_PREFIX: Final[struct.Struct] = struct.Struct("<iBBHiiii")
"""frame_length, version, flags, type, term_offset, session_id, stream_id, term_id: a DATA/PAD header up
to its reserved value, read with one unpack on the hot path."""
assert _DATA_PREFIX.size == dh.RESERVED_VALUE_FIELD_OFFSET

Address: TypeAlias = tuple[str, int]
DatagramHandler: TypeAlias = Callable[[memoryview, Address], None]
"""Called with each datagram received (valid only during the call) and its source address."""


class ReceiveBatch:
    """Where one ``recvmmsg`` lands: ``READS_PER_POLL`` slots of ``SLOT_LENGTH`` bytes (2 MiB) and, per
    datagram, its offset, length and source. Datagrams handed out are views into it, valid only during
    the handler's call, so every endpoint an agent polls can share one (Aeron's transport poller holds one
    buffer for all its transports): per endpoint it would be 2 MiB of driver memory per UDP subscription."""

    def __init__(self) -> None:
        self.buffer = bytearray(READS_PER_POLL * SLOT_LENGTH)
        self.view = memoryview(self.buffer)
        entries = READS_PER_POLL * _udp.UDP_GRO_SEGMENTS  # a coalesced read is many datagrams
        self.offsets = np.zeros(entries, dtype=np.int32)
        self.lengths = np.zeros(entries, dtype=np.int32)
        self.sources = np.zeros(entries, dtype=np.uint64)


class FaultInjector:
    """Seeded drop / duplicate / reorder of received datagrams (fractions 0..1)."""

    def __init__(self, drop: float, duplicate: float, reorder: float, seed: int) -> None:
        self.drop, self.duplicate, self.reorder = drop, duplicate, reorder
        self.random = random.Random(seed)
        self._held: tuple[bytes, Address] | None = None

    @property
    def active(self) -> bool:
        return bool(self.drop or self.duplicate or self.reorder)

    def deliver(self, datagram: memoryview, source: Address, handler: DatagramHandler) -> None:
        r = self.random.random
        if r() < self.drop:
            return
        if r() < self.reorder and self._held is None:
            self._held = (bytes(datagram), source)  # delivered after the next one
            return
        handler(datagram, source)
        if r() < self.duplicate:
            handler(datagram, source)
        self.flush(handler)

    def flush(self, handler: DatagramHandler) -> None:
        if self._held is not None:
            held, source = self._held
            self._held = None
            handler(memoryview(held), source)


@dataclass(frozen=True)
class SocketSettings:
    """Per-channel socket parameters: ``so-rcvbuf``, ``so-sndbuf`` (else the driver's socket_buffer_length),
    and ``gso``: send runs of equal datagrams with one UDP GSO send and read coalesced (UDP_GRO) datagrams
    (the driver's ``udp_gso``)."""

    rcvbuf: int
    sndbuf: int
    gso: bool = False


@dataclass(frozen=True)
class MulticastSettings:
    """A multicast transport: it binds the group address (the data group for a subscription, the control
    group for a publication) with SO_REUSEADDR, joins it on ``interface`` (an address; None: the kernel's
    choice by route) and sends through that interface with ``ttl`` (None: the OS default), looped back to
    this host's other members."""

    interface: str | None = None
    ttl: int | None = None


def is_multicast(address: str) -> bool:
    return ipaddress.ip_address(address).is_multicast


def multicast_control_address(data: Address) -> Address:
    """The control address of a multicast data address: its last octet plus 1, the same port (Aeron)."""
    return str(ipaddress.ip_address(data[0]) + 1), data[1]


@dataclass(frozen=True)
class ImageSettings:
    """A subscription's receive-side parameters (``reliable``, ``rcv-wnd``, ``nak-delay``): the same for
    every subscription to one stream on one endpoint, as in Aeron."""

    reliable: bool = True
    window_length: int | None = None
    nak_delay_ns: int | None = None
    group_tag: int | None = None

    def __str__(self) -> str:
        given = {
            "rcv-wnd": self.window_length,
            "nak-delay": None if self.nak_delay_ns is None else f"{self.nak_delay_ns}ns",
            "gtag": self.group_tag,
        }
        return "|".join(
            [f"reliable={str(self.reliable).lower()}"] + [f"{k}={v}" for k, v in given.items() if v is not None]
        )


def local_ipv4_addresses() -> list[str]:
    """This machine's IPv4 interface addresses (Linux SIOCGIFADDR per interface)."""
    addresses = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                ifreq = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue  # no IPv4 address on this interface
            addresses.append(socket.inet_ntoa(ifreq[20:24]))
    return addresses


def resolve_interface(host: str, prefix: int | None) -> str:
    """``interface=host[/prefix]`` to a local address: the host itself, or with a prefix shorter than
    32 the first local address in that subnet (Aeron's rule). Raises OSError naming the problem."""
    address = socket.gethostbyname(host)
    if prefix is None or prefix == 32:
        return address
    subnet = ipaddress.ip_network(f"{address}/{prefix}", strict=False)
    for candidate in local_ipv4_addresses():
        if ipaddress.ip_address(candidate) in subnet:
            return candidate
    raise OSError(f"no local interface address in {subnet}")


def _is_multicast(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_multicast
    except ValueError:  # a name (in-memory test links)
        return False


# -- the socket seam ---------------------------------------------------------------------------------
class DatagramTransport(Protocol):
    """What an endpoint needs from the network: receive batches through the native data path, send one
    datagram or a run of a term's frames. :class:`UdpTransport` is the driver's; the tests' in-memory link
    (``logbuf`` tests: ``tests/support/link.py``) runs the same native routines (:mod:`logbuf.driver._udp`:
    ``insert_data_batch`` for what arrives, ``term_datagrams`` for what goes), so a test over it exercises
    the data path production runs."""

    @property
    def local_address(self) -> Address:
        """Where this transport is bound (its ephemeral port resolved)."""
        ...

    def receive(self, handler: DatagramHandler, batch: ReceiveBatch | None = None, checked: bool = False) -> int:
        """Hand every datagram that has arrived (up to a batch) to ``handler``; returns how many. ``batch``:
        where they land (the agent's shared one; else the transport's own); ``checked``: the caller has just
        seen the transport readable."""
        ...

    def receive_data(
        self,
        receivers: list[_udp.ImageReceiver],
        handler: DatagramHandler,
        batch: ReceiveBatch | None = None,
        checked: bool = False,
    ) -> int:
        """:meth:`receive` with the native data path first: DATA-path datagrams that one of ``receivers``
        decides (:func:`logbuf.driver._udp.insert_data_batch`) never reach ``handler``; the rest do."""
        ...

    def readable(self) -> bool:
        """Datagrams (or fault-injected deliveries) wait: :meth:`receive` would do something."""
        ...

    def send_to(self, datagram: Buffer, address: Address) -> int:
        """Send one datagram; returns the bytes the network took (0 if it took none)."""
        ...

    def frame_sender(self, destination: Address) -> SendFrames:
        """The batch send of committed frames straight from a term to ``destination`` (the sender's hot
        path; see :data:`logbuf.driver.network_publication.SendFrames`)."""
        ...

    def fileno(self) -> int:
        """A file descriptor that is readable when datagrams wait (the agent's epoll set holds it, and the
        duty cycle parks on that), or -1 if there is none or the transport must be polled every cycle
        anyway (fault injection holding a datagram back): then the agent polls it every cycle."""
        ...

    def close(self) -> None: ...


class TransportFactory(Protocol):
    """Makes the transport of a new endpoint: :class:`UdpTransport` unless the driver context says
    otherwise. Raises OSError if it cannot bind."""

    def __call__(
        self,
        bind: Address,
        *,
        sockets: SocketSettings,
        faults: FaultInjector | None,
        system_counters: SystemCounters,
        multicast: MulticastSettings | None = None,
    ) -> DatagramTransport: ...


class UdpTransport:
    """A non-blocking UDP socket: reads batches with one ``recvmmsg`` (counting bytes and datagrams
    received), sends single datagrams with ``sendto`` and runs of frames with one ``sendmmsg``."""

    def __init__(
        self,
        bind: Address,
        *,
        sockets: SocketSettings,
        faults: FaultInjector | None,
        system_counters: SystemCounters,
        multicast: MulticastSettings | None = None,
    ) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockets.rcvbuf)
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockets.sndbuf)
            if multicast is not None:
                self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(bind)
            if multicast is not None:
                interface = socket.inet_aton(multicast.interface or "0.0.0.0")
                self.socket.setsockopt(
                    socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, socket.inet_aton(bind[0]) + interface
                )
                if multicast.interface:
                    self.socket.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, interface)
                if multicast.ttl:
                    self.socket.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, multicast.ttl)
                self.socket.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        except OSError:
            self.socket.close()
            raise
        self.gso = sockets.gso
        if self.gso:
            try:
                self.socket.setsockopt(socket.IPPROTO_UDP, _udp.UDP_GRO_OPTION, 1)
            except OSError:  # a kernel without UDP GRO (before 5.0): datagrams arrive one by one
                pass
        self.socket.setblocking(False)
        self._readable = select.poll()  # an empty poll(0) is cheaper than a BlockingIOError per cycle
        self._readable.register(self.socket, select.POLLIN)
        self._local_address: Address = self.socket.getsockname()
        self.system_counters = system_counters
        self.faults = faults if faults is not None and faults.active else None
        self._batch: ReceiveBatch | None = None
        """Used only when no batch is given: an agent's endpoints all read into its poller's batch."""
        self._addresses: dict[int, Address] = {}
        self._fd = self.socket.fileno()

    @property
    def local_address(self) -> Address:
        return self._local_address

    def _own_batch(self) -> ReceiveBatch:
        if self._batch is None:
            self._batch = ReceiveBatch()
        return self._batch

    def receive(self, handler: DatagramHandler, batch: ReceiveBatch | None = None, checked: bool = False) -> int:
        """:meth:`DatagramTransport.receive` into ``batch`` (the agent's shared one; else one of its own).
        ``checked``: the caller's epoll has just said the socket is readable (no poll syscall here)."""
        faults = self.faults
        if not checked and not self._readable.poll(0):
            if faults is not None:
                faults.flush(handler)
            return 0
        b = batch or self._own_batch()
        n = _udp.udp_receive_batch(self._fd, b.buffer, SLOT_LENGTH, b.offsets, b.lengths, b.sources)
        if n:
            lengths = b.lengths[:n].tolist()
            offsets = b.offsets[:n].tolist()
            counters = self.system_counters
            counters.increment(SystemCounterId.BYTES_RECEIVED, sum(lengths))
            counters.increment(SystemCounterId.DATAGRAMS_RECEIVED, n)
            view = b.view
            addresses = self._addresses
            sources = b.sources  # read one by one: most control reads bring one or two datagrams
            for i in range(n):
                source = int(sources[i])
                address = addresses.get(source) or self._address_of(source)
                datagram = view[offsets[i] : offsets[i] + lengths[i]]
                if faults is not None:
                    faults.deliver(datagram, address, handler)
                else:
                    handler(datagram, address)
        if faults is not None:
            faults.flush(handler)
        return n

    def receive_data(
        self,
        receivers: list[_udp.ImageReceiver],
        handler: DatagramHandler,
        batch: ReceiveBatch | None = None,
        checked: bool = False,
    ) -> int:
        """:meth:`receive` with the data path in C: DATA that one of ``receivers`` takes is inserted
        with no Python per datagram (see :func:`logbuf.driver._udp.udp_receive_data`); ``handler`` gets
        the rest. With fault injection on, everything goes through :meth:`receive`. ``checked``: the caller
        has just seen the socket readable (one poll syscall per cycle, not two)."""
        if self.faults is not None:
            return self.receive(handler, batch)
        if not checked and not self._readable.poll(0):
            return 0
        b = batch or self._own_batch()
        n, received_bytes = _udp.udp_receive_data(
            self._fd, b.buffer, SLOT_LENGTH, b.offsets, b.lengths, b.sources, receivers
        )
        if n:
            counters = self.system_counters
            counters.increment(SystemCounterId.BYTES_RECEIVED, received_bytes)
            counters.increment(SystemCounterId.DATAGRAMS_RECEIVED, n)
            view, offsets, sources = b.view, b.offsets, b.sources
            for i, length in enumerate(b.lengths[:n].tolist()):
                if length >= 0:  # -1: taken by the native data path
                    offset = int(offsets[i])
                    handler(view[offset : offset + length], self._address_of(int(sources[i])))
        return n

    def readable(self) -> bool:
        """A datagram (or fault-injected delivery) is waiting: :meth:`receive` would do something."""
        return self.faults is not None or bool(self._readable.poll(0))

    def _address_of(self, source: int) -> Address:
        address = self._addresses.get(source)
        if address is None:
            if len(self._addresses) > 1024:
                self._addresses.clear()
            address = self._addresses[source] = (
                socket.inet_ntoa((source >> 16).to_bytes(4, "big")),
                source & 0xFFFF,
            )
        return address

    def send_to(self, datagram: Buffer, address: Address) -> int:
        try:
            return self.socket.sendto(datagram, address)
        except OSError:  # BlockingIOError (buffer full) included: the caller counts a short send
            return 0

    def frame_sender(self, destination: Address) -> SendFrames:
        """Sends runs of committed frames straight from a term to ``destination`` with one sendmmsg
        (see :func:`logbuf.native.term_send_datagrams`), counting bytes and datagrams sent."""
        sockaddr = (
            struct.pack("=H", socket.AF_INET)
            + struct.pack("!H", destination[1])
            + socket.inet_aton(destination[0])
            + bytes(8)
        )  # struct sockaddr_in
        fd, counters = self.socket.fileno(), self.system_counters

        def send_frames(
            term: memoryview, term_offset: int, max_length: int, mtu: int, max_datagrams: int
        ) -> tuple[int, int]:
            covered, datagrams, sent, refused = _udp.term_send_datagrams(
                fd, term, term_offset, max_length, mtu, sockaddr, max_datagrams, self.gso
            )
            if refused:  # the route's device cannot segment: one datagram per sendmmsg entry from now on
                self.gso = False
            if datagrams:
                counters.increment(SystemCounterId.BYTES_SENT, sent)
                counters.increment(SystemCounterId.DATAGRAMS_SENT, datagrams)
            return covered, datagrams

        return send_frames

    def fileno(self) -> int:
        return -1 if self.faults is not None else self._fd  # a held, reordered datagram needs a poll every cycle

    def close(self) -> None:
        self.socket.close()


# -- endpoints ------------------------------------------------------------------------------------------
class ChannelEndpoint:
    """What both endpoints share: a transport, the system counters, a clock and the dispatch."""

    def __init__(
        self,
        channel: str,
        transport: DatagramTransport,
        system_counters: SystemCounters,
        clock_ns: Callable[[], int],
    ) -> None:
        self.channel = channel
        self.transport = transport
        self.system_counters = system_counters
        self.clock_ns = clock_ns
        self.handlers: dict[int, DatagramHandler] = {}
        """Frame type -> handler; a type missing here is an invalid packet at this endpoint."""

    def on_datagram(self, datagram: memoryview, source: Address) -> None:
        """The one receive path: check the common header, dispatch on the frame type; count and drop
        what is invalid."""
        if len(datagram) >= COMMON_HEADER_LENGTH:
            _, version, _, frame_type = COMMON_HEADER.unpack_from(datagram, 0)
            handler = self.handlers.get(frame_type)
            if version == CURRENT_VERSION and handler is not None:
                try:
                    handler(datagram, source)
                    return
                except ValueError:  # MalformedFrameError, or a field no sender produces
                    pass
        self.system_counters.increment(SystemCounterId.INVALID_PACKETS)

    def poll(self, batch: ReceiveBatch | None = None, checked: bool = False) -> int:
        """Dispatch what the transport has received; returns how many datagrams. A UDP transport reads
        into ``batch`` (its agent's); ``checked``: the agent's epoll found the socket readable."""
        return self.transport.receive(self.on_datagram, batch, checked)

    def send_to(self, datagram: Buffer, address: Address) -> int:
        return self.transport.send_to(datagram, address)

    def _on_foreign_control(self, datagram: memoryview, source: Address) -> None:
        """A control frame this endpoint has no use for: decoded only, so a malformed one counts."""
        decode_control(datagram)

    def close(self) -> None:
        self.transport.close()


_NAK_HEADER_UNPACK: Final = nak_codec.HEADER.unpack_from
_FRAME_ALIGNMENT_MASK: Final[int] = dh.FRAME_ALIGNMENT - 1


class SendChannelEndpoint(ChannelEndpoint):
    """One publication channel: sends to ``destination`` (a unicast address or a multicast data group)
    or, for multi-destination-cast, to every destination its ``destinations`` tracker holds; receives
    SMs, NAKs and RTT probes. Its ``publications`` belong to the sender agent."""

    def __init__(
        self,
        channel: str,
        destination: Address | None,
        transport: DatagramTransport,
        system_counters: SystemCounters,
        clock_ns: Callable[[], int],
        destinations: DestinationTracker | None = None,
    ) -> None:
        super().__init__(channel, transport, system_counters, clock_ns)
        self.destination = destination
        self.binds_receiver = destination is not None and not _is_multicast(destination[0])
        """Unicast (not multicast, not MDC): each connected publication takes control frames from its receiver's address only."""
        self.destinations = destinations
        """MDC: the destinations (then ``destination`` is None); changed by SMs (dynamic) or commands."""
        self._destination_changes = 0
        self.publications: dict[tuple[int, int], NetworkPublication] = {}
        self._frame_senders: dict[Address, SendFrames] = {}
        self.send_frames: SendFrames = (
            transport.frame_sender(destination) if destination is not None else self._send_frames_to_all
        )
        """The batch send of committed frames (the transport's, or MDC's to every destination)."""
        self.handlers = {
            HDR_TYPE_SM: self._on_status_message,
            HDR_TYPE_NAK: self._on_nak,
            HDR_TYPE_RTTM: self._on_rtt_measurement,
            HDR_TYPE_ERR: self._on_foreign_control,
            HDR_TYPE_RES: self._on_foreign_control,
            HDR_TYPE_RSP_SETUP: self._on_foreign_control,
        }

    def send(self, datagram: Buffer) -> int:
        if self.destination is not None:
            return self.transport.send_to(datagram, self.destination)
        assert self.destinations is not None
        sent = 0
        for destination in self.destinations.destinations:
            sent = self.transport.send_to(datagram, destination.address)
        return sent if self.destinations.destinations else len(datagram)  # nobody to send to is not a short send

    def _send_frames_to_all(
        self, term: memoryview, term_offset: int, max_length: int, mtu: int, max_datagrams: int
    ) -> tuple[int, int]:
        """MDC's batch send: the first destination that takes the batch decides how far it goes, the others
        get exactly the same datagrams. A destination whose send fails (unreachable, buffer full) misses
        the batch and NAKs it later; it does not hold the others back."""
        assert self.destinations is not None
        covered = datagrams = 0
        for destination in self.destinations.destinations:
            sender = self._frame_senders.get(destination.address)
            if sender is None:
                if len(self._frame_senders) > 1024:
                    self._frame_senders.clear()
                sender = self._frame_senders[destination.address] = self.transport.frame_sender(destination.address)
            if not datagrams:
                covered, datagrams = sender(term, term_offset, max_length, mtu, max_datagrams)
            else:
                sender(term, term_offset, covered, mtu, datagrams)
        return covered, datagrams

    def on_idle(self, now_ns: int) -> None:
        """MDC: time dynamic destinations out and keep ``mdc-num-dest`` current."""
        if self.destinations is not None:
            self.destinations.on_idle(now_ns)
            self._count_destinations()

    def _count_destinations(self) -> None:
        tracker = self.destinations
        if tracker is not None and tracker.changes != self._destination_changes:
            self._destination_changes = tracker.changes
            for publication in self.publications.values():
                publication.set_destination_count(len(tracker.destinations))

    def _from_receiver(self, publication: NetworkPublication, source: Address) -> bool:
        """SMs and NAKs of a connected unicast publication come from the receiver that connected it
        (the source of the SM that did); from another address they are counted as spoofed and dropped.
        A publication not connected takes its receiver from the next SM (a restarted receiver, or one
        at another address, connects again once the connection timed out). Multicast publications
        hear many receivers and bind none."""
        if not self.binds_receiver or not publication.is_connected:
            return True
        bound = publication.receiver_address
        if bound is None or source is bound or source == bound:
            return True
        self.system_counters.increment(SystemCounterId.SPOOFED_FRAMES_DROPPED)
        return False

    def _on_status_message(self, datagram: memoryview, source: Address) -> None:
        sm = decode_exact(status_codec.decode, datagram)
        if self.destinations is not None and not self.destinations.admits(source):
            self.system_counters.increment(SystemCounterId.STATUS_MESSAGES_REJECTED)
            return
        now = self.clock_ns()
        publication = self.publications.get((sm.session_id, sm.stream_id))
        if publication is None:
            if sm.elicits_setup:  # a receiver without an image yet (MDC, multicast): every publication of the stream
                self.system_counters.increment(SystemCounterId.STATUS_MESSAGES_RECEIVED)
                self._track_destination(source, sm.receiver_id, now)
                for candidate in self.publications.values():
                    if candidate.stream_id == sm.stream_id:
                        candidate.on_status_message(sm, now, source)
            return
        if not self._from_receiver(publication, source):
            return
        position = None
        if not sm.flags & status_codec.SEND_SETUP_FLAG:
            position = publication.plausible_position(sm)
            if position is None:
                self.system_counters.increment(SystemCounterId.INVALID_PACKETS)
                return
            if not publication.is_connected:
                publication.receiver_address = source
        self.system_counters.increment(SystemCounterId.STATUS_MESSAGES_RECEIVED)
        self._track_destination(source, sm.receiver_id, now)
        publication.on_status_message(sm, now, source, position)

    def _track_destination(self, source: Address, receiver_id: int, now_ns: int) -> None:
        """MDC: an SM adds (dynamic) or refreshes its source as a destination."""
        if self.destinations is not None:
            self.destinations.on_status_message(source, receiver_id, now_ns)
            self._count_destinations()

    def _on_nak(self, datagram: memoryview, source: Address) -> None:
        """A NAK from a receiver of the publication gets what that receiver can lack (the publication
        decides); from anyone else, nothing. MDC: only the destinations are receivers.

        A flood of NAKs takes this path thousands of times a second, so a well-formed NAK (the common
        header was checked by :meth:`on_datagram`) is unpacked once, into ints, with no frame object;
        anything else goes through the codec, which raises naming what is wrong."""
        if len(datagram) == nak_codec.NAK_HEADER_LENGTH:
            frame_length, _, _, _, session_id, stream_id, term_id, term_offset, length = _NAK_HEADER_UNPACK(datagram)
            well_formed = (
                frame_length == nak_codec.NAK_HEADER_LENGTH
                and term_offset >= 0
                and length > 0
                and not (term_offset | length) & _FRAME_ALIGNMENT_MASK
            )
        else:
            well_formed = False
        if not well_formed:
            try:
                nak = decode_exact(nak_codec.decode, datagram)
            except ValueError:  # an unaligned offset or length, say: counted here and (by the caller) as invalid
                self.system_counters.increment(SystemCounterId.NAKS_MALFORMED)
                raise
            session_id, stream_id, term_id, term_offset, length = (
                nak.session_id,
                nak.stream_id,
                nak.term_id,
                nak.term_offset,
                nak.length,
            )
        publication = self.publications.get((session_id, stream_id))
        if publication is None or (self.binds_receiver and not self._from_receiver(publication, source)):
            return
        self.system_counters.increment(SystemCounterId.NAK_MESSAGES_RECEIVED)
        destinations = self.destinations
        member = destinations is None or destinations.holds(source)
        publication.on_nak_range(term_id, term_offset, length, self.clock_ns(), self.send, source, member)

    def _on_rtt_measurement(self, datagram: memoryview, source: Address) -> None:
        # Our static congestion control never measures RTT, but a receiver that does (Aeron's cubic)
        # gets its probe answered: flags 0, its timestamp echoed (Aeron's sender rule).
        rttm = decode_exact(rttm_codec.decode, datagram)
        # Answered from any address: the reply is no larger than the probe and goes back to its source.
        if rttm.is_reply_requested and (rttm.session_id, rttm.stream_id) in self.publications:
            reply = rttm_codec.RttMeasurementFrame(
                rttm.session_id, rttm.stream_id, rttm.echo_timestamp_ns, 0, rttm.receiver_id
            ).encode()
            self.system_counters.count_send(len(reply), self.send_to(reply, source))


class ReceiveChannelEndpoint(ChannelEndpoint):
    """One subscription channel: bound to its endpoint, feeds images, answers with SMs and NAKs.

    ``subscribed_stream_ids`` and ``images`` are the receiver agent's (changed only by its ``on_*``
    commands); a SETUP for a subscribed stream without an active image asks the conductor, through
    its proxy, to create one."""

    def __init__(
        self,
        channel: str,
        transport: DatagramTransport,
        system_counters: SystemCounters,
        clock_ns: Callable[[], int],
        conductor: ConductorCommands,
        control_address: Address | None = None,
        elicit_periodically: bool = False,
        multicast: bool = False,
    ) -> None:
        super().__init__(channel, transport, system_counters, clock_ns)
        self.conductor = conductor
        self.control_address = control_address
        """Multicast and MDC: where SMs and NAKs go (else to each image's source)."""
        self._senders: dict[Address, Callable[[Buffer], int]] = {}
        self.elicit_periodically = elicit_periodically
        """MDC (control-mode=dynamic): ask the control address for SETUPs every 100 ms while a subscribed
        stream has no image, which is also how the publication learns this destination."""
        self._next_periodic_elicit_ns = 0
        self.multicast = multicast
        """Bound to a multicast group: its images NAK with the random multicast back-off."""
        self.subscribed_stream_ids: set[int] = set()
        self.images: dict[tuple[int, int], PublicationImage] = {}  # (session id, stream id) -> image
        self.receiver_id = random.getrandbits(63)
        self._elicited: dict[tuple[int, int], int] = {}
        self.handlers = {
            HDR_TYPE_DATA: self._on_data,  # on_datagram goes straight to _on_data_frame for a whole header
            HDR_TYPE_PAD: self._on_data,
            HDR_TYPE_SETUP: self._on_setup,
            HDR_TYPE_SM: self._on_foreign_control,
            HDR_TYPE_NAK: self._on_foreign_control,
            HDR_TYPE_RTTM: self._on_foreign_control,
            HDR_TYPE_ERR: self._on_foreign_control,
            HDR_TYPE_RES: self._on_foreign_control,
            HDR_TYPE_RSP_SETUP: self._on_foreign_control,
        }

    def poll(self, batch: ReceiveBatch | None = None, checked: bool = False) -> int:
        """Dispatch what arrived: the DATA of active images is decided in C, a batch per call
        (:meth:`DatagramTransport.receive_data`), and only the rest comes through :meth:`on_datagram`; the
        images' positions are handed to the native side before the batch and what it decided taken back
        after it."""
        transport = self.transport
        if not self.images:
            return transport.receive(self.on_datagram, batch, checked)
        if not checked and not transport.readable():  # the common idle cycle: no receivers to prime
            return 0
        active = [image for image in self.images.values() if image.state is ImageState.ACTIVE]
        receivers = [image.native_receiver() for image in active]
        n = transport.receive_data(receivers, self.on_datagram, batch, checked=True)
        if n:
            now = self.clock_ns()
            for image in active:
                image.native_received(now)
        return n

    def on_datagram(self, datagram: memoryview, source: Address) -> None:
        """:meth:`ChannelEndpoint.on_datagram`, with the hot path first: a whole DATA or PAD header, read
        with one unpack, goes straight to its handler without the table lookup."""
        if len(datagram) >= dh.HEADER_LENGTH:
            _, version, _, frame_type, term_offset, session_id, stream_id, term_id = _DATA_PREFIX.unpack_from(datagram)
            if (frame_type == HDR_TYPE_DATA or frame_type == HDR_TYPE_PAD) and version == CURRENT_VERSION:
                self._on_data_frame(datagram, source, term_offset, session_id, stream_id, term_id)
                return
        super().on_datagram(datagram, source)

    def _on_data(self, datagram: memoryview, source: Address) -> None:
        """DATA, PAD or heartbeat through the table (a header cut short: invalid)."""
        if len(datagram) < dh.HEADER_LENGTH:
            self.system_counters.increment(SystemCounterId.INVALID_PACKETS)
            return
        _, _, _, _, term_offset, session_id, stream_id, term_id = _DATA_PREFIX.unpack_from(datagram)
        self._on_data_frame(datagram, source, term_offset, session_id, stream_id, term_id)

    def _on_data_frame(
        self, datagram: memoryview, source: Address, term_offset: int, session_id: int, stream_id: int, term_id: int
    ) -> None:
        """Checked in C, inserted into the session's image if it has one and it came from the image's
        source address (else counted as spoofed and dropped); DATA of a subscribed stream without an
        image asks the sender for a SETUP (at most every 100 ms per session, remembering at most
        MAX_ELICITED_SESSIONS sessions)."""
        counters = self.system_counters
        image = self.images.get((session_id, stream_id))
        covered = native.check_data_datagram(datagram, image.log.term_length if image is not None else 0)
        if covered < 0:
            counters.increment(SystemCounterId.INVALID_PACKETS)
            return
        if image is not None:
            bound = image.source_address
            if source is not bound and source != bound:
                counters.increment(SystemCounterId.SPOOFED_FRAMES_DROPPED)
            elif image.state is ImageState.ACTIVE:
                image.insert_packet(datagram, self.clock_ns())  # the native rule, as a batch decides
        elif stream_id in self.subscribed_stream_ids and not (covered == 0 and datagram[5] & dh.EOS_FLAG):
            now, key, elicited = self.clock_ns(), (session_id, stream_id), self._elicited
            due = elicited.get(key)
            if due is None or now >= due:
                if due is not None:
                    del elicited[key]  # re-inserted last: the dict is oldest-first
                elif len(elicited) >= MAX_ELICITED_SESSIONS:
                    del elicited[next(iter(elicited))]
                elicited[key] = now + SETUP_ELICIT_INTERVAL_NS
                sm = status_codec.StatusMessageFrame.setup_eliciting(session_id, stream_id, self.receiver_id).encode()
                counters.count_send(len(sm), self.send_to(sm, self.control_address or source))
                counters.increment(SystemCounterId.STATUS_MESSAGES_SENT)

    def _on_setup(self, datagram: memoryview, source: Address) -> None:
        setup = decode_exact(setup_codec.decode, datagram)
        self.system_counters.increment(SystemCounterId.SETUPS_RECEIVED)
        if setup.stream_id in self.subscribed_stream_ids:
            existing = self.images.get((setup.session_id, setup.stream_id))
            if existing is None or existing.state is not ImageState.ACTIVE:
                self.conductor.create_publication_image(self, setup, source)

    def on_idle(self, now_ns: int) -> int:
        """MDC dynamic: the periodic setup-eliciting SMs of subscribed streams without an image."""
        if not self.elicit_periodically or now_ns < self._next_periodic_elicit_ns or self.control_address is None:
            return 0
        self._next_periodic_elicit_ns = now_ns + SETUP_ELICIT_INTERVAL_NS
        with_image = {stream_id for (_, stream_id), image in self.images.items() if image.state is ImageState.ACTIVE}
        work = 0
        for stream_id in self.subscribed_stream_ids - with_image:
            sm = status_codec.StatusMessageFrame.setup_eliciting(0, stream_id, self.receiver_id).encode()
            self.system_counters.count_send(len(sm), self.send_to(sm, self.control_address))
            self.system_counters.increment(SystemCounterId.STATUS_MESSAGES_SENT)
            work += 1
        return work

    def sender_to(self, address: Address) -> Callable[[Buffer], int]:
        """A ``send`` for an image's NAKs and SMs: to the control address if the channel has one, else to
        the image's source address."""
        send = self._senders.get(address)
        if send is None:  # made once per source: the receiver asks every cycle for every image
            if len(self._senders) > 1024:
                self._senders.clear()
            target, transport = self.control_address or address, self.transport
            send = self._senders[address] = lambda datagram: transport.send_to(datagram, target)
        return send
