"""One agent's endpoints in one epoll set, reading into one shared receive batch (Aeron's transport poller).

The sender and the receiver each own a :class:`TransportPoller`. Registering an endpoint adds its socket
to the poller's epoll set; each duty cycle :meth:`TransportPoller.ready` asks the kernel once which
sockets have datagrams (``epoll_wait`` with no timeout) and the agent polls only those, each reading into
the poller's one :class:`~logbuf.driver.udp.ReceiveBatch`. So:

- a duty cycle costs one system call however many endpoints are idle (polling each socket was one call
  per endpoint per cycle: with 2,000 UDP subscriptions, 2,000 calls before any work);
- the idle park waits on the epoll file descriptors (:meth:`fileno`), which has no limit on descriptor
  numbers: ``select()`` fails on a descriptor past 1023 ("filedescriptor out of range in select()"), and
  the driver died of that at about 1,020 sockets;
- the driver's receive memory is one 2 MiB batch per agent, not per endpoint (a datagram handed to a
  handler is a view valid only during its call, so the endpoints of one agent can share it).

Transports with no descriptor (the tests' in-memory links) and those with fault injection on (a held,
reordered datagram must be delivered even when the socket is quiet) are polled every cycle instead.
"""

from __future__ import annotations

import select
from typing import Final, Generic, TypeVar

from logbuf.driver.udp import ChannelEndpoint, ReceiveBatch

MAX_READY_PER_CYCLE: Final[int] = 32
"""Readable endpoints one cycle dispatches at most; the rest are still readable (level-triggered) next
cycle, and the kernel hands out its ready list round-robin, so none is starved. Small, because each
``epoll.poll`` allocates room for this many events: 256 cost 0.5 us a call more than ``poll``."""

E = TypeVar("E", bound=ChannelEndpoint)


class TransportPoller(Generic[E]):
    """An agent's endpoints: which have datagrams waiting, and the batch they read into."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._selected: dict[int, E] = {}
        self._fds: dict[E, int] = {}
        self.unselectable: list[E] = []
        """Polled every cycle: no descriptor, or fault injection holding datagrams back."""
        self._batch: ReceiveBatch | None = None

    @property
    def batch(self) -> ReceiveBatch:
        """The one receive batch of this agent's endpoints (made with the first endpoint: a driver with
        no UDP endpoint holds none)."""
        if self._batch is None:
            self._batch = ReceiveBatch()
        return self._batch

    @property
    def selectable(self) -> bool:
        """Some endpoint's socket is in the epoll set (a park on :meth:`fileno` can be woken by data)."""
        return bool(self._selected)

    def add(self, endpoint: E) -> None:
        transport = endpoint.transport
        fd = transport.fileno()
        if fd < 0:  # no descriptor, or one that must be polled every cycle (fault injection)
            self.unselectable.append(endpoint)
            return
        self._epoll.register(fd, select.EPOLLIN)
        self._selected[fd] = endpoint
        self._fds[endpoint] = fd

    def remove(self, endpoint: E) -> None:
        """Before the endpoint's socket is closed (a closed descriptor's number may be reused at once)."""
        if endpoint in self.unselectable:
            self.unselectable.remove(endpoint)
            return
        fd = self._fds.pop(endpoint, None)
        if fd is not None:
            del self._selected[fd]
            self._epoll.unregister(fd)

    def ready(self) -> list[E]:
        """The endpoints whose sockets are readable now (one ``epoll_wait``, no timeout)."""
        if not self._selected:
            return []
        selected = self._selected
        return [selected[fd] for fd, _ in self._epoll.poll(0, MAX_READY_PER_CYCLE)]

    def fileno(self) -> int:
        """The epoll set's descriptor: readable while any of its sockets is (a park waits on it)."""
        return self._epoll.fileno()

    def close(self) -> None:
        self._selected.clear()
        self._fds.clear()
        self.unselectable.clear()
        self._epoll.close()
