"""The receiver agent: reads the receive endpoints into their images and sends the images' NAKs and
status messages.

Its state (the receive endpoints it polls, each one's subscribed streams and images) changes
only through its ``on_*`` commands, which the conductor sends through a
:class:`~logbuf.driver.proxies.ReceiverProxy`. It holds loops only: loss detection and status
messages are :mod:`logbuf.driver.publication_image`'s, the dispatch of each datagram is
:mod:`logbuf.driver.udp`'s.
"""

from __future__ import annotations

from collections.abc import Callable

from logbuf.driver.lifecycle import ImageState
from logbuf.driver.publication_image import PublicationImage
from logbuf.driver.system_counters import SystemCounterId
from logbuf.driver.transport_poller import TransportPoller
from logbuf.driver.udp import ReceiveChannelEndpoint


class Receiver:
    """Agent: each duty cycle, every endpoint with datagrams waiting dispatches them (its poller says
    which, with one epoll call), then every active image advances its rebuild position, NAKs its gaps
    and sends its status message when due, and MDC endpoints ask for SETUPs."""

    role_name = "receiver"

    def __init__(self, clock_ns: Callable[[], int]) -> None:
        self.clock_ns = clock_ns
        self.endpoints: list[ReceiveChannelEndpoint] = []
        self.poller: TransportPoller[ReceiveChannelEndpoint] = TransportPoller()
        self._tended: dict[ReceiveChannelEndpoint, None] = {}
        """Endpoints with images or periodic SETUP requests: the only ones a cycle has timers to run for
        (thousands of endpoints without images cost no Python per cycle)."""

    # -- agent ------------------------------------------------------------------------------------------
    def on_start(self) -> None:
        pass

    def do_work(self) -> int:
        now = self.clock_ns()
        work = 0
        poller = self.poller
        for endpoint in poller.ready():
            work += endpoint.poll(poller.batch, checked=True)
        for endpoint in poller.unselectable:
            work += endpoint.poll(poller.batch)
        for endpoint in list(self._tended):  # a command may add one meanwhile
            if endpoint.elicit_periodically:
                work += endpoint.on_idle(now)
            for image in list(endpoint.images.values()):  # a SETUP may have replaced one meanwhile
                if image.state is ImageState.ACTIVE:
                    work += image.track_rebuild(now, endpoint.sender_to(image.source_address))
        return work

    def on_close(self) -> None:
        for endpoint in self.endpoints:
            endpoint.close()
        self.endpoints.clear()
        self._tended.clear()
        self.poller.close()

    def _tend(self, endpoint: ReceiveChannelEndpoint) -> None:
        if endpoint.images or endpoint.elicit_periodically:
            self._tended[endpoint] = None
        else:
            self._tended.pop(endpoint, None)

    # -- commands (from the conductor, through ReceiverProxy) -------------------------------------------
    def on_register_receive_channel_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None:
        self.endpoints.append(endpoint)
        self.poller.add(endpoint)
        self._tend(endpoint)

    def on_close_receive_channel_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None:
        """Stop polling the endpoint and close its transport (the agent that polls a socket closes it)."""
        if endpoint in self.endpoints:
            self.endpoints.remove(endpoint)
            self.poller.remove(endpoint)
        self._tended.pop(endpoint, None)
        endpoint.images.clear()
        endpoint.close()

    def on_add_subscription(self, endpoint: ReceiveChannelEndpoint, stream_id: int) -> None:
        """SETUPs and DATA of ``stream_id`` now concern the endpoint."""
        endpoint.subscribed_stream_ids.add(stream_id)

    def on_remove_subscription(self, endpoint: ReceiveChannelEndpoint, stream_id: int) -> None:
        endpoint.subscribed_stream_ids.discard(stream_id)

    def on_new_publication_image(self, endpoint: ReceiveChannelEndpoint, image: PublicationImage) -> None:
        endpoint.images[(image.session_id, image.stream_id)] = image
        self._tend(endpoint)

    def on_remove_publication_image(self, endpoint: ReceiveChannelEndpoint, image: PublicationImage) -> None:
        """Stop feeding the image; if its stream is no longer subscribed here, tell the sender with an
        end-of-stream SM (it leaves a min/tagged flow-control group at once, not after the timeout)."""
        if image.state is ImageState.ACTIVE and image.stream_id not in endpoint.subscribed_stream_ids:
            sm = image.end_of_stream_status_message()
            image.system_counters.count_send(len(sm), endpoint.sender_to(image.source_address)(sm))
            image.system_counters.increment(SystemCounterId.STATUS_MESSAGES_SENT)
        key = (image.session_id, image.stream_id)
        if endpoint.images.get(key) is image:
            del endpoint.images[key]
        if endpoint in self.endpoints:
            self._tend(endpoint)
