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

Dynamic mode trusts the source address of an SM, which UDP does not authenticate: anyone who can send
the control address one SM with a victim's source address makes the publication send the victim its
stream until the destination times out (Aeron's dynamic MDC behaves the same). ``allowed`` (the
driver's ``mdc-dynamic-allow`` list) closes that: an SM from an address outside it adds nothing and is
not heard at all (the endpoint counts it as "Status Messages rejected"). Listing was chosen over a
challenge (send a nonce to the new address, add it once echoed): a challenge needs a control frame
Aeron's receivers do not speak, a list works with any receiver and is what an operator who knows their
subscribers can state.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

Address = tuple[str, int]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_DESTINATIONS = 256
"""Destinations one endpoint sends to at most: each costs a copy of every datagram, so SMs from yet more
addresses (forged, say) add none until others time out."""


@dataclass(frozen=True)
class AllowedSources:
    """An ``mdc-dynamic-allow`` list: hosts or networks (``10.1.2.3``, ``10.1.0.0/16``), each with an optional
    port (``10.1.2.3:40456``); empty: any source, as Aeron."""

    entries: tuple[tuple[Network, int | None], ...] = ()

    @classmethod
    def parse(cls, text: str) -> AllowedSources:
        """Raises ValueError naming the entry that is not ``host[/prefix][:port]``."""
        entries: list[tuple[Network, int | None]] = []
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            host, port = item, None
            if item.count(":") == 1 or item.startswith("["):  # host:port or [v6]:port
                host, _, port_text = item.rpartition(":")
                host = host.strip("[]")
                if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                    raise ValueError(f"{item!r}: port {port_text!r} is not 1..65535")
                port = int(port_text)
            try:
                entries.append((ipaddress.ip_network(host, strict=False), port))
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network (host[/prefix][:port])") from None
        return cls(tuple(entries))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def admits(self, address: Address) -> bool:
        if not self.entries:
            return True
        try:
            ip = ipaddress.ip_address(address[0])
        except ValueError:
            return False
        return any(ip in network and (port is None or port == address[1]) for network, port in self.entries)


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
    allowed: AllowedSources = field(default_factory=AllowedSources)
    """Dynamic mode: the sources whose SMs are heard (empty: any)."""

    @property
    def addresses(self) -> list[Address]:
        return [d.address for d in self.destinations]

    def _find(self, address: Address) -> Destination | None:
        for destination in self.destinations:
            if destination.address == address:
                return destination
        return None

    def holds(self, address: Address) -> bool:
        """Is ``address`` a destination (a receiver this endpoint sends to)?"""
        return self._find(address) is not None

    def admits(self, source: Address) -> bool:
        """Is an SM from ``source`` heard? Dynamic mode with an allow list: only from listed sources."""
        return self.manual or self.allowed.admits(source)

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
