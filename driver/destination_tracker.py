"""Multi-destination-cast (MDC): the destinations one send endpoint copies every datagram to.

Pure: addresses and ``now_ns`` in, the list of destinations out; the send endpoint
(:class:`logbuf.driver.udp.SendChannelEndpoint`) does the sending. Two modes, after Aeron's
``aeron_udp_destination_tracker``:

- ``control-mode=dynamic``: the publication's channel names ``control=host:port``, where its socket
  listens. Receivers whose subscriptions name that control address send it status messages (a
  setup-eliciting one every 100 ms until they have an image); the first SM from an address adds it
  as a destination, and a destination silent for the timeout (5 s) is dropped.
- ``control-mode=manual``: the client adds and removes destinations (ADD_DESTINATION and
  REMOVE_DESTINATION commands); they stay until removed. SMs only refresh what is known of them.

``changes`` counts additions and removals, so the owner updates ``mdc-num-dest`` only when it moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Address = tuple[str, int]
MAX_DESTINATIONS = 256
"""Destinations one endpoint sends to at most: each costs a copy of every datagram, so SMs from yet more
addresses (forged, say) add none until others time out."""


@dataclass
class Destination:
    address: Address
    time_of_last_activity_ns: int
    receiver_id: int | None = None
    channel: str = ""
    """Manual destinations: the channel the client named."""


@dataclass
class DestinationTracker:
    manual: bool
    timeout_ns: int
    destinations: list[Destination] = field(default_factory=list)
    changes: int = 0

    @property
    def addresses(self) -> list[Address]:
        return [d.address for d in self.destinations]

    def _find(self, address: Address) -> Destination | None:
        for destination in self.destinations:
            if destination.address == address:
                return destination
        return None

    def on_status_message(self, source: Address, receiver_id: int, now_ns: int) -> None:
        """An SM from ``source``: refresh it, or (dynamic) add it."""
        destination = self._find(source)
        if destination is not None:
            destination.time_of_last_activity_ns = now_ns
            destination.receiver_id = receiver_id
        elif not self.manual and len(self.destinations) < MAX_DESTINATIONS:
            self.destinations.append(Destination(source, now_ns, receiver_id))
            self.changes += 1

    def add(self, address: Address, channel: str, now_ns: int) -> bool:
        """A manual destination; False if it is there already or the endpoint has MAX_DESTINATIONS."""
        if self._find(address) is not None or len(self.destinations) >= MAX_DESTINATIONS:
            return False
        self.destinations.append(Destination(address, now_ns, None, channel))
        self.changes += 1
        return True

    def remove(self, address: Address) -> bool:
        destination = self._find(address)
        if destination is None:
            return False
        self.destinations.remove(destination)
        self.changes += 1
        return True

    def on_idle(self, now_ns: int) -> None:
        """Dynamic: drop destinations silent for the timeout."""
        if self.manual:
            return
        alive = [d for d in self.destinations if now_ns - d.time_of_last_activity_ns <= self.timeout_ns]
        if len(alive) != len(self.destinations):
            self.changes += len(self.destinations) - len(alive)
            self.destinations = alive
