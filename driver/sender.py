"""The sender agent: sends every network publication's data and reads its send endpoints.

Its state (the send endpoints it polls, the publications on each) changes only through its
``on_*`` commands, which the conductor sends through a :class:`~logbuf.driver.proxies.SenderProxy`.
It holds loops only: what to send and when is :mod:`logbuf.driver.network_publication`'s, how
a datagram is dispatched is :mod:`logbuf.driver.udp`'s.
"""

from __future__ import annotations

from collections.abc import Callable

from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.transport_poller import TransportPoller
from logbuf.driver.udp import Address, SendChannelEndpoint


class Sender:
    """Agent: each duty cycle, every publication sends what flow control allows, then every endpoint
    with something waiting (its poller says which, with one epoll call) dispatches the status messages,
    NAKs and RTT probes that came back."""

    role_name = "sender"

    def __init__(self, clock_ns: Callable[[], int], control_poll_every: int = 1) -> None:
        if control_poll_every < 1:
            raise ValueError(f"control_poll_every={control_poll_every} must be at least 1")
        self.clock_ns = clock_ns
        self.endpoints: list[SendChannelEndpoint] = []
        self.poller: TransportPoller[SendChannelEndpoint] = TransportPoller()
        self.control_poll_every = control_poll_every
        """Read the endpoints' sockets (SMs, NAKs, RTT probes) every this many idle cycles: each read is
        a system call, and a status message that waits a few cycles changes nothing while the window
        it grants is still open. A cycle that read something reads again the next one."""
        self._cycles_to_control_poll = 0

    # -- agent ------------------------------------------------------------------------------------------
    def on_start(self) -> None:
        pass

    def do_work(self) -> int:
        now = self.clock_ns()
        work = 0
        poll_control = self._cycles_to_control_poll <= 0
        received = 0
        for endpoint in self.endpoints:
            for publication in endpoint.publications.values():
                work += publication.send(now, endpoint.send, endpoint.send_frames)
            if endpoint.destinations is not None:
                endpoint.on_idle(now)
        if poll_control:
            poller = self.poller
            for endpoint in poller.ready():
                received += endpoint.poll(poller.batch, checked=True)
            for endpoint in poller.unselectable:
                received += endpoint.poll(poller.batch)
            self._cycles_to_control_poll = 0 if received else self.control_poll_every - 1
        else:
            self._cycles_to_control_poll -= 1
        return work + received

    def on_close(self) -> None:
        for endpoint in self.endpoints:
            endpoint.close()
        self.endpoints.clear()
        self.poller.close()

    # -- commands (from the conductor, through SenderProxy) ---------------------------------------------
    def on_register_send_channel_endpoint(self, endpoint: SendChannelEndpoint) -> None:
        self.endpoints.append(endpoint)
        self.poller.add(endpoint)

    def on_close_send_channel_endpoint(self, endpoint: SendChannelEndpoint) -> None:
        """Stop polling the endpoint and close its transport (the agent that polls a socket closes it)."""
        if endpoint in self.endpoints:
            self.endpoints.remove(endpoint)
            self.poller.remove(endpoint)
        endpoint.close()

    def on_new_network_publication(self, endpoint: SendChannelEndpoint, publication: NetworkPublication) -> None:
        if endpoint.destinations is not None:
            publication.set_destination_count(len(endpoint.destinations.destinations))
        endpoint.publications[(publication.session_id, publication.stream_id)] = publication

    def on_remove_network_publication(self, endpoint: SendChannelEndpoint, publication: NetworkPublication) -> None:
        key = (publication.session_id, publication.stream_id)
        if endpoint.publications.get(key) is publication:
            del endpoint.publications[key]

    def on_add_destination(self, endpoint: SendChannelEndpoint, address: Address, channel: str, now_ns: int) -> bool:
        """A manual MDC destination added (True, also if it was one already); False: the endpoint has its most."""
        tracker = endpoint.destinations
        assert tracker is not None, "destinations are added to MDC endpoints only"
        if not tracker.add(address, channel, now_ns) and not tracker.holds(address):
            return False
        endpoint.on_idle(now_ns)  # mdc-num-dest now
        return True

    def on_remove_destination(self, endpoint: SendChannelEndpoint, address: Address, now_ns: int) -> bool:
        tracker = endpoint.destinations
        assert tracker is not None, "destinations are removed from MDC endpoints only"
        if not tracker.remove(address):
            return False
        endpoint.on_idle(now_ns)  # mdc-num-dest now
        return True
