"""A lossy in-memory datagram network: seeded drop, duplicate and reorder, no sockets.

:class:`Link` is one direction of a link (a queue that may lose, repeat and shuffle what is sent
into it); :class:`LinkNetwork` joins transports by address, each receiving through its own
``Link``, and is a :class:`~logbuf.driver.udp.TransportFactory`: give ``network.transport`` as the
driver context's ``udp_transport`` and two drivers stepped by hand on one thread talk to each
other through it, dispatching every datagram through the endpoints' real ``on_datagram``.
"""

from __future__ import annotations

import errno
import random

from logbuf.driver.system_counters import SystemCounters
from logbuf.driver.udp import Address, DatagramHandler, FaultInjector, SocketSettings
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

    @property
    def local_address(self) -> Address:
        return self._address

    def receive(self, handler: DatagramHandler) -> int:
        datagrams = self.inbound.take()
        for datagram, source in datagrams:
            handler(memoryview(datagram), source)
        return len(datagrams)

    def send_to(self, datagram: Buffer, address: Address) -> int:
        return self.network.deliver(datagram, self._address, address)

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
