"""A lossy in-memory datagram network: seeded drop, duplicate and reorder, no sockets.

:class:`Link` is one direction of a link (a queue that may lose, repeat and shuffle what is sent
into it); :class:`LinkNetwork` joins transports by address, each receiving through its own
``Link``, and is a :class:`~logbuf.driver.udp.TransportFactory`: give ``network.transport`` as the
driver context's ``udp_transport`` and two drivers stepped by hand on one thread talk to each
other through it. A transport receives and sends through the native routines a UDP socket's do
(:func:`logbuf.driver._udp.insert_data_batch` decides the DATA of active images a batch at a time,
:func:`logbuf.driver._udp.term_datagrams` cuts a term into datagrams); only the syscalls differ, so the
tests over it run the data path production runs, and what the native path leaves goes through the
endpoints' real ``on_datagram``.
"""

from __future__ import annotations

import errno
import random

import numpy as np

from logbuf.driver import _udp
from logbuf.driver.network_publication import SendFrames
from logbuf.driver.publication_image import source_key
from logbuf.driver.system_counters import SystemCounters
from logbuf.driver.udp import (
    READS_PER_POLL,
    SLOT_LENGTH,
    Address,
    DatagramHandler,
    FaultInjector,
    ReceiveBatch,
    SocketSettings,
)
from logbuf.protocol.frame_header import Buffer

FIRST_EPHEMERAL_PORT = 49152


class Link:
    """One direction of a datagram link: drops, duplicates and reorders with a seeded RNG.

    What is sent waits in a queue until :meth:`take`; a reordered datagram is inserted at a random
    place among those waiting, a duplicate goes to the end."""

    def __init__(self, rng: random.Random, drop: float = 0.0, duplicate: float = 0.0, reorder: float = 0.0) -> None:
        for name, rate in (("drop", drop), ("duplicate", duplicate), ("reorder", reorder)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name}={rate} must be a fraction within 0..1")
        self.rng, self.drop, self.duplicate, self.reorder = rng, drop, duplicate, reorder
        self.queue: list[tuple[bytes, Address]] = []
        self.sent = 0
        self.dropped = 0

    def send(self, datagram: Buffer, source: Address = ("0.0.0.0", 0)) -> int:
        """Put a copy of ``datagram`` on the link (or lose it); returns its length, as a socket would."""
        data = bytes(datagram)
        self.sent += 1
        if self.rng.random() >= self.drop:
            if self.queue and self.rng.random() < self.reorder:
                self.queue.insert(self.rng.randrange(len(self.queue)), (data, source))
            else:
                self.queue.append((data, source))
            if self.rng.random() < self.duplicate:
                self.queue.append((data, source))
        else:
            self.dropped += 1
        return len(data)

    def take(self) -> list[tuple[bytes, Address]]:
        """Everything waiting, in arrival order, with each datagram's source address."""
        out, self.queue = self.queue, []
        return out


class LinkTransport:
    """A transport bound to an address of a :class:`LinkNetwork` (the driver's ``DatagramTransport``)."""

    def __init__(self, network: LinkNetwork, address: Address, inbound: Link) -> None:
        self.network = network
        self.inbound = inbound
        self._address = address
        self.closed = False
        self._batch: ReceiveBatch | None = None

    @property
    def local_address(self) -> Address:
        return self._address

    def receive(self, handler: DatagramHandler, batch: ReceiveBatch | None = None, checked: bool = False) -> int:
        """Everything waiting, to ``handler``."""
        return self.receive_data([], handler, batch, checked)

    def receive_data(
        self,
        receivers: list[_udp.ImageReceiver],
        handler: DatagramHandler,
        batch: ReceiveBatch | None = None,
        checked: bool = False,
    ) -> int:
        """Everything waiting, as a UDP transport reads it: copied into the batch's slots (up to
        READS_PER_POLL at a time, each datagram its own slot), the native data path run over them
        (:func:`logbuf.driver._udp.insert_data_batch`), and the rest handed to ``handler``."""
        datagrams = self.inbound.take()
        if not datagrams:
            return 0
        if batch is None:
            batch = self._batch = self._batch or ReceiveBatch()
        buffer, view, offsets, lengths, sources = batch.buffer, batch.view, batch.offsets, batch.lengths, batch.sources
        for first in range(0, len(datagrams), READS_PER_POLL):
            chunk = datagrams[first : first + READS_PER_POLL]
            for i, (datagram, source) in enumerate(chunk):
                offset = i * SLOT_LENGTH
                buffer[offset : offset + len(datagram)] = datagram
                offsets[i], lengths[i], sources[i] = offset, len(datagram), source_key(source)
            _udp.insert_data_batch(buffer, len(chunk), offsets, lengths, sources, receivers)
            for i, (_, source) in enumerate(chunk):
                length = int(lengths[i])
                if length >= 0:  # -1: decided by the native data path
                    handler(view[i * SLOT_LENGTH : i * SLOT_LENGTH + length], source)
        return len(datagrams)

    def readable(self) -> bool:
        return bool(self.inbound.queue)

    def send_to(self, datagram: Buffer, address: Address) -> int:
        return self.network.deliver(datagram, self._address, address)

    def frame_sender(self, destination: Address) -> SendFrames:
        """The sender's batch send: the datagrams :func:`logbuf.driver._udp.term_datagrams` cuts from the
        term (as ``sendmmsg`` sends them over UDP), each put on the link to ``destination``."""
        offsets, lengths, covers = (np.zeros(64, dtype=np.int32) for _ in range(3))

        def send_frames(
            term: memoryview, term_offset: int, max_length: int, mtu: int, max_datagrams: int
        ) -> tuple[int, int]:
            n = _udp.term_datagrams(term, term_offset, max_length, mtu, max_datagrams, offsets, lengths, covers)
            for offset, length in zip(offsets[:n].tolist(), lengths[:n].tolist(), strict=True):
                self.network.deliver(term[offset : offset + length], self._address, destination)
            return int(covers[:n].sum()), n

        return send_frames

    def fileno(self) -> int:
        return -1  # nothing to select on: the test steps the agents itself

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.network.unbind(self._address)


class LinkNetwork:
    """Transports joined by lossy links; a datagram to an address nobody is bound to is lost, as with UDP.

    Every transport receives through its own :class:`Link`, all drawing on one seeded RNG, so a run
    is repeatable. Binding port 0 takes the next free port; binding a port in use raises OSError."""

    def __init__(self, seed: int = 0, drop: float = 0.0, duplicate: float = 0.0, reorder: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.drop, self.duplicate, self.reorder = drop, duplicate, reorder
        self.transports: dict[Address, LinkTransport] = {}
        self._next_port = FIRST_EPHEMERAL_PORT

    def transport(
        self,
        bind: Address,
        *,
        sockets: SocketSettings,
        faults: FaultInjector | None,
        system_counters: SystemCounters,
    ) -> LinkTransport:
        """A :class:`~logbuf.driver.udp.TransportFactory` (the socket settings and the driver's own fault
        injector play no part: the links are lossy instead)."""
        return self.bind(bind)

    def bind(self, bind: Address) -> LinkTransport:
        """A transport at ``bind`` (port 0: the next free one; host 0.0.0.0: 127.0.0.1)."""
        host, port = bind
        if host == "0.0.0.0":
            host = "127.0.0.1"
        if port == 0:
            while (host, self._next_port) in self.transports:
                self._next_port += 1
            port = self._next_port
        address = (host, port)
        if address in self.transports:
            raise OSError(errno.EADDRINUSE, f"address {host}:{port} already in use on the link network")
        transport = self.transports[address] = LinkTransport(
            self, address, Link(self.rng, self.drop, self.duplicate, self.reorder)
        )
        return transport

    def deliver(self, datagram: Buffer, source: Address, destination: Address) -> int:
        transport = self.transports.get(destination)
        if transport is None:
            return len(datagram)  # sent into the void
        return transport.inbound.send(datagram, source)

    def unbind(self, address: Address) -> None:
        self.transports.pop(address, None)
