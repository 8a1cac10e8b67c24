"""UDP endpoints and the sender and receiver agents: they only move bytes.

A :class:`SendChannelEndpoint` is one socket per publication channel (ephemeral local port):
DATA, SETUP and heartbeats go to the channel's endpoint; status messages and NAKs come back to
it. A :class:`ReceiveChannelEndpoint` is one socket bound to a subscription channel's endpoint:
DATA-path datagrams and SETUPs come in; SMs and NAKs go back to each image's source address.
The protocol itself lives in :mod:`driver.network_publication` and :mod:`driver.publication_image`.

Every datagram read is checked before use; an invalid one is counted ("Invalid packets") and
dropped, never logged per packet. :class:`FaultInjector` (driver settings ``udp_drop_rate``,
``udp_duplicate_rate``, ``udp_reorder_rate``, ``udp_fault_seed``) drops, duplicates and reorders
a fraction of the datagrams an endpoint receives, for tests and demos.
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
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from logbuf import native
from logbuf.driver import _udp
from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.publication_image import ImageState, PublicationImage
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import MalformedFrameError
from logbuf.protocol import nak as nak_codec
from logbuf.protocol import rttm as rttm_codec
from logbuf.protocol import setup as setup_codec
from logbuf.protocol import status as status_codec
from logbuf.protocol.frame_header import (
    HDR_TYPE_DATA,
    HDR_TYPE_NAK,
    HDR_TYPE_PAD,
    HDR_TYPE_RTTM,
    HDR_TYPE_SETUP,
    HDR_TYPE_SM,
)

MAX_UDP_PAYLOAD = 65504
READS_PER_POLL = 32
SLOT_LENGTH = 65536
"""Each poll reads up to 32 datagrams with one recvmmsg, each into its own 64 KiB slot."""
SETUP_ELICIT_INTERVAL_NS = 100_000_000
_DATA_IDS = struct.Struct("<iiii")
"""term_offset, session_id, stream_id, term_id of a DATA/PAD header, from its byte 8."""

Handler = Callable[[memoryview, tuple[str, int]], None]


class _ControlFrame(Protocol):
    @property
    def frame_length(self) -> int: ...


_Frame = TypeVar("_Frame", bound=_ControlFrame)


class FaultInjector:
    """Seeded drop / duplicate / reorder of received datagrams (fractions 0..1)."""

    def __init__(self, drop: float, duplicate: float, reorder: float, seed: int) -> None:
        self.drop, self.duplicate, self.reorder = drop, duplicate, reorder
        self.random = random.Random(seed)
        self._held: tuple[bytes, tuple[str, int]] | None = None

    @property
    def active(self) -> bool:
        return bool(self.drop or self.duplicate or self.reorder)

    def deliver(self, datagram: memoryview, source: tuple[str, int], handler: Handler) -> None:
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

    def flush(self, handler: Handler) -> None:
        if self._held is not None:
            held, source = self._held
            self._held = None
            handler(memoryview(held), source)


@dataclass(frozen=True)
class SocketSettings:
    """Per-channel socket parameters: ``so-rcvbuf``, ``so-sndbuf`` (else the driver's socket_buffer_length)."""

    rcvbuf: int
    sndbuf: int


@dataclass(frozen=True)
class ImageSettings:
    """A subscription's receive-side parameters (``reliable``, ``rcv-wnd``, ``nak-delay``): the same for
    every subscription to one stream on one endpoint, as in Aeron."""

    reliable: bool = True
    window_length: int | None = None
    nak_delay_ns: int | None = None

    def __str__(self) -> str:
        given = {
            "rcv-wnd": self.window_length,
            "nak-delay": None if self.nak_delay_ns is None else f"{self.nak_delay_ns}ns",
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


def _decode_exact(decoder: Callable[[memoryview], _Frame], datagram: memoryview) -> _Frame:
    """Decode a control frame that must fill the datagram exactly (trailing bytes are malformed)."""
    frame = decoder(datagram)
    if len(datagram) != frame.frame_length:
        raise MalformedFrameError("trailing bytes")
    return frame


class UdpEndpoint:
    def __init__(
        self,
        bind: tuple[str, int],
        system_counters: SystemCounters,
        faults: FaultInjector | None,
        sockets: SocketSettings,
    ) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sockets.rcvbuf)
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sockets.sndbuf)
            self.socket.bind(bind)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self._readable = select.poll()  # an empty poll(0) is cheaper than a BlockingIOError per cycle
        self._readable.register(self.socket, select.POLLIN)
        self.local_address: tuple[str, int] = self.socket.getsockname()
        self.system_counters = system_counters
        self.faults = faults if faults is not None and faults.active else None
        self._buffer = bytearray(READS_PER_POLL * SLOT_LENGTH)
        self._view = memoryview(self._buffer)
        self._lengths = np.zeros(READS_PER_POLL, dtype=np.int32)
        self._sources = np.zeros(READS_PER_POLL, dtype=np.uint64)
        self._addresses: dict[int, tuple[str, int]] = {}

    def poll(self, handler: Handler) -> int:
        """Read up to READS_PER_POLL datagrams (one recvmmsg) and hand each to ``handler``; returns
        how many."""
        if not self._readable.poll(0) and self.faults is None:
            return 0
        n = _udp.udp_receive_batch(self.socket.fileno(), self._buffer, SLOT_LENGTH, self._lengths, self._sources)
        if not n:
            return 0
        lengths = self._lengths[:n].tolist()
        counters = self.system_counters
        counters.increment(SystemCounterId.BYTES_RECEIVED, sum(lengths))
        counters.increment(SystemCounterId.DATAGRAMS_RECEIVED, n)
        view = self._view
        for i, (length, source) in enumerate(zip(lengths, self._sources[:n].tolist())):
            address = self._addresses.get(source)
            if address is None:
                if len(self._addresses) > 1024:
                    self._addresses.clear()
                address = self._addresses[source] = (
                    socket.inet_ntoa((source >> 16).to_bytes(4, "big")),
                    source & 0xFFFF,
                )
            datagram = view[i * SLOT_LENGTH : i * SLOT_LENGTH + length]
            if self.faults is not None:
                self.faults.deliver(datagram, address, handler)
            else:
                handler(datagram, address)
        return n

    def send_to(self, datagram: Any, address: tuple[str, int]) -> int:
        try:
            return self.socket.sendto(datagram, address)
        except BlockingIOError:
            return 0
        except OSError:
            return 0

    def close(self) -> None:
        self.socket.close()


class SendChannelEndpoint(UdpEndpoint):
    """One publication channel: sends to ``destination``, receives SMs and NAKs."""

    def __init__(
        self,
        channel: str,
        destination: tuple[str, int],
        system_counters: SystemCounters,
        faults: FaultInjector | None,
        sockets: SocketSettings,
        bind: tuple[str, int] = ("0.0.0.0", 0),
    ) -> None:
        super().__init__(bind, system_counters, faults, sockets)
        self.channel = channel
        self.destination = destination
        self.publications: dict[tuple[int, int], NetworkPublication] = {}
        self.clock_ns: Callable[[], int] = lambda: 0
        self.send = lambda datagram: self.send_to(datagram, self.destination)
        self._sockaddr = (
            struct.pack("=H", socket.AF_INET)
            + struct.pack("!H", destination[1])
            + socket.inet_aton(destination[0])
            + bytes(8)
        )  # struct sockaddr_in

    def send_frames(
        self, term: memoryview, term_offset: int, max_length: int, mtu: int, max_datagrams: int
    ) -> tuple[int, int]:
        """Send datagrams of committed frames straight from the term with one sendmmsg (see
        :func:`logbuf.driver._udp.term_send_datagrams`): (term bytes covered, datagrams sent)."""
        covered, datagrams, sent = _udp.term_send_datagrams(
            self.socket.fileno(), term, term_offset, max_length, mtu, self._sockaddr, max_datagrams
        )
        if datagrams:
            self.system_counters.increment(SystemCounterId.BYTES_SENT, sent)
            self.system_counters.increment(SystemCounterId.DATAGRAMS_SENT, datagrams)
        return covered, datagrams

    def on_control(self, datagram: memoryview, source: tuple[str, int]) -> None:
        counters = self.system_counters
        try:
            if len(datagram) < 8 or datagram[4] != 0:
                raise MalformedFrameError("short or wrong version")
            frame_type = datagram[6] | (datagram[7] << 8)
            if frame_type == HDR_TYPE_SM:
                sm = _decode_exact(status_codec.decode, datagram)
                publication = self.publications.get((sm.session_id, sm.stream_id))
                if publication is not None:
                    counters.increment(SystemCounterId.STATUS_MESSAGES_RECEIVED)
                    publication.on_status_message(sm, self.clock_ns())
            elif frame_type == HDR_TYPE_NAK:
                nak = _decode_exact(nak_codec.decode, datagram)
                publication = self.publications.get((nak.session_id, nak.stream_id))
                if publication is not None:
                    counters.increment(SystemCounterId.NAK_MESSAGES_RECEIVED)
                    publication.on_nak(nak, self.clock_ns(), self.send)
            elif frame_type == HDR_TYPE_RTTM:
                # Our static congestion control never measures RTT, but a receiver that does (Aeron's
                # cubic) gets its probe answered: flags 0, its timestamp echoed (Aeron's sender rule).
                rttm = _decode_exact(rttm_codec.decode, datagram)
                if rttm.is_reply_requested and (rttm.session_id, rttm.stream_id) in self.publications:
                    reply = rttm_codec.RttMeasurementFrame(
                        rttm.session_id, rttm.stream_id, rttm.echo_timestamp_ns, 0, rttm.receiver_id
                    ).encode()
                    counters.count_send(len(reply), self.send_to(reply, source))
            else:
                raise MalformedFrameError(f"type {frame_type} on a send channel")
        except (MalformedFrameError, ValueError):
            counters.increment(SystemCounterId.INVALID_PACKETS)


class ReceiveChannelEndpoint(UdpEndpoint):
    """One subscription channel: bound to its endpoint, feeds images, answers with SMs and NAKs."""

    def __init__(
        self,
        channel: str,
        bind: tuple[str, int],
        system_counters: SystemCounters,
        faults: FaultInjector | None,
        sockets: SocketSettings,
        on_setup: Callable[[ReceiveChannelEndpoint, setup_codec.SetupFrame, tuple[str, int]], None],
    ) -> None:
        super().__init__(bind, system_counters, faults, sockets)
        self.channel = channel
        self.stream_ids: dict[int, int] = {}  # stream id -> subscription count
        self.image_settings: dict[int, ImageSettings] = {}  # stream id -> its subscriptions' parameters
        self.images: dict[tuple[int, int], PublicationImage] = {}
        self.receiver_id = random.getrandbits(63)
        self.on_setup = on_setup
        self.clock_ns: Callable[[], int] = lambda: 0
        self._elicited: dict[tuple[int, int], int] = {}

    def on_datagram(self, datagram: memoryview, source: tuple[str, int]) -> None:
        counters = self.system_counters
        if len(datagram) < 8 or datagram[4] != 0:
            counters.increment(SystemCounterId.INVALID_PACKETS)
            return
        frame_type = datagram[6] | (datagram[7] << 8)
        if frame_type == HDR_TYPE_DATA or frame_type == HDR_TYPE_PAD:
            if len(datagram) < 32:
                counters.increment(SystemCounterId.INVALID_PACKETS)
                return
            term_offset, session_id, stream_id, term_id = _DATA_IDS.unpack_from(datagram, 8)
            image = self.images.get((session_id, stream_id))
            term_length = image.log.term_length if image is not None else 0
            covered = native.check_data_datagram(datagram, term_length)
            if covered < 0:
                counters.increment(SystemCounterId.INVALID_PACKETS)
                return
            if image is not None:
                if image.state is ImageState.ACTIVE:
                    image.insert_packet(term_id, term_offset, datagram, covered, self.clock_ns())
            elif stream_id in self.stream_ids and not (covered == 0 and datagram[5] & dh.EOS_FLAG):
                now = self.clock_ns()
                if now >= self._elicited.get((session_id, stream_id), 0):
                    self._elicited[(session_id, stream_id)] = now + SETUP_ELICIT_INTERVAL_NS
                    sm = status_codec.StatusMessageFrame.setup_eliciting(session_id, stream_id, self.receiver_id)
                    self.send_to(sm.encode(), source)
                    counters.increment(SystemCounterId.STATUS_MESSAGES_SENT)
            return
        if frame_type == HDR_TYPE_SETUP:
            try:
                setup = _decode_exact(setup_codec.decode, datagram)
            except (MalformedFrameError, ValueError):
                counters.increment(SystemCounterId.INVALID_PACKETS)
                return
            counters.increment(SystemCounterId.SETUPS_RECEIVED)
            key = (setup.session_id, setup.stream_id)
            existing = self.images.get(key)
            if setup.stream_id in self.stream_ids and (existing is None or existing.state is not ImageState.ACTIVE):
                self.on_setup(self, setup, source)
            return
        if frame_type in (HDR_TYPE_SM, HDR_TYPE_NAK, HDR_TYPE_RTTM):
            # control frames meant for a sender: not ours, but a malformed one still counts
            decoder: Callable[[memoryview], Any] = {
                HDR_TYPE_SM: status_codec.decode,
                HDR_TYPE_NAK: nak_codec.decode,
                HDR_TYPE_RTTM: rttm_codec.decode,
            }[frame_type]
            try:
                _decode_exact(decoder, datagram)
            except (MalformedFrameError, ValueError):
                counters.increment(SystemCounterId.INVALID_PACKETS)
            return
        counters.increment(SystemCounterId.INVALID_PACKETS)


def _sender_to(endpoint: UdpEndpoint, address: tuple[str, int]) -> Callable[[Any], int]:
    return lambda datagram: endpoint.send_to(datagram, address)


_Endpoint = TypeVar("_Endpoint", bound=UdpEndpoint)


class _EndpointAgent(Generic[_Endpoint]):
    """An agent over a list of endpoints, which it closes on close."""

    def __init__(self, clock_ns: Callable[[], int]) -> None:
        self.clock_ns = clock_ns
        self.endpoints: list[_Endpoint] = []

    def on_start(self) -> None:
        pass

    def on_close(self) -> None:
        for endpoint in self.endpoints:
            endpoint.close()
        self.endpoints.clear()


class Sender(_EndpointAgent[SendChannelEndpoint]):
    """Agent: sends every network publication's data, reads their control frames."""

    role_name = "sender"

    def do_work(self) -> int:
        now = self.clock_ns()
        work = 0
        for endpoint in self.endpoints:
            for publication in list(endpoint.publications.values()):
                work += publication.send(now, endpoint.send, endpoint.send_frames)
            work += endpoint.poll(endpoint.on_control)
            if endpoint.faults is not None:
                endpoint.faults.flush(endpoint.on_control)
        return work


class Receiver(_EndpointAgent[ReceiveChannelEndpoint]):
    """Agent: reads subscription endpoints into images, sends their NAKs and SMs."""

    role_name = "receiver"

    def do_work(self) -> int:
        now = self.clock_ns()
        work = 0
        for endpoint in self.endpoints:
            work += endpoint.poll(endpoint.on_datagram)
            if endpoint.faults is not None:
                endpoint.faults.flush(endpoint.on_datagram)
            for image in list(endpoint.images.values()):
                if image.state is ImageState.ACTIVE:
                    work += image.track_rebuild(now, _sender_to(endpoint, image.source_address))
        return work
