"""The seams between the driver's three agents: what each accepts from the others, and the proxies
that carry it.

The conductor owns publications, images and subscriptions; the sender owns the send endpoints
it polls and the publications on each; the receiver owns the receive endpoints, their subscribed
streams and their images. No agent changes another's state: it calls a command on a proxy, and
the owner applies it in an ``on_*`` method. The Protocols below (:class:`SenderCommands`,
:class:`ReceiverCommands`, :class:`ConductorCommands`) are what crosses each seam; the proxies
implement them.

Here the three agents share one duty cycle (Aeron's SHARED threading mode; under the GIL threads
would only take turns), so a proxy calls the owner's ``on_*`` method directly, as Aeron's
proxies do when their threading mode is SHARED. A threaded mode would put a bounded queue
behind each proxy, drained by the owner's ``do_work``, and would have to hold an image's log
open until the receiver confirmed it had dropped the image, and the destination commands, which
answer at once here (the conductor replies to the client with their outcome), would answer through
a queue back to the conductor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from logbuf.driver.conductor import DriverConductor
    from logbuf.driver.network_publication import NetworkPublication
    from logbuf.driver.publication_image import PublicationImage
    from logbuf.driver.receiver import Receiver
    from logbuf.driver.sender import Sender
    from logbuf.driver.udp import Address, ReceiveChannelEndpoint, SendChannelEndpoint
    from logbuf.protocol.setup import SetupFrame

__all__ = [
    "ConductorCommands",
    "DriverConductorProxy",
    "ReceiverCommands",
    "ReceiverProxy",
    "SenderCommands",
    "SenderProxy",
]


class SenderCommands(Protocol):
    """What the conductor asks of the sender."""

    def register_send_channel_endpoint(self, endpoint: SendChannelEndpoint) -> None: ...

    def close_send_channel_endpoint(self, endpoint: SendChannelEndpoint) -> None: ...

    def new_network_publication(self, endpoint: SendChannelEndpoint, publication: NetworkPublication) -> None: ...

    def remove_network_publication(self, endpoint: SendChannelEndpoint, publication: NetworkPublication) -> None: ...

    def add_destination(self, endpoint: SendChannelEndpoint, address: Address, channel: str, now_ns: int) -> bool:
        """A manual MDC destination; False if the endpoint already sends to its most destinations (one it
        sends to already is no change, and True)."""
        ...

    def remove_destination(self, endpoint: SendChannelEndpoint, address: Address, now_ns: int) -> bool:
        """False if ``address`` is no destination of the endpoint."""
        ...


class ReceiverCommands(Protocol):
    """What the conductor asks of the receiver."""

    def register_receive_channel_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None: ...

    def close_receive_channel_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None: ...

    def add_subscription(self, endpoint: ReceiveChannelEndpoint, stream_id: int) -> None: ...

    def remove_subscription(self, endpoint: ReceiveChannelEndpoint, stream_id: int) -> None: ...

    def new_publication_image(self, endpoint: ReceiveChannelEndpoint, image: PublicationImage) -> None: ...

    def remove_publication_image(self, endpoint: ReceiveChannelEndpoint, image: PublicationImage) -> None: ...


class ConductorCommands(Protocol):
    """What a receive endpoint asks of the conductor."""

    def create_publication_image(self, endpoint: ReceiveChannelEndpoint, setup: SetupFrame, source: Address) -> None:
        """A SETUP for a subscribed stream without an active image arrived from ``source``."""
        ...


class SenderProxy:
    """The conductor's way to the sender (direct calls: one shared duty cycle)."""

    def __init__(self, sender: Sender) -> None:
        self._sender = sender

    def register_send_channel_endpoint(self, endpoint: SendChannelEndpoint) -> None:
        self._sender.on_register_send_channel_endpoint(endpoint)

    def close_send_channel_endpoint(self, endpoint: SendChannelEndpoint) -> None:
        self._sender.on_close_send_channel_endpoint(endpoint)

    def new_network_publication(self, endpoint: SendChannelEndpoint, publication: NetworkPublication) -> None:
        self._sender.on_new_network_publication(endpoint, publication)

    def remove_network_publication(self, endpoint: SendChannelEndpoint, publication: NetworkPublication) -> None:
        self._sender.on_remove_network_publication(endpoint, publication)

    def add_destination(self, endpoint: SendChannelEndpoint, address: Address, channel: str, now_ns: int) -> bool:
        return self._sender.on_add_destination(endpoint, address, channel, now_ns)

    def remove_destination(self, endpoint: SendChannelEndpoint, address: Address, now_ns: int) -> bool:
        return self._sender.on_remove_destination(endpoint, address, now_ns)


class ReceiverProxy:
    """The conductor's way to the receiver (direct calls: one shared duty cycle)."""

    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver

    def register_receive_channel_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None:
        self._receiver.on_register_receive_channel_endpoint(endpoint)

    def close_receive_channel_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None:
        self._receiver.on_close_receive_channel_endpoint(endpoint)

    def add_subscription(self, endpoint: ReceiveChannelEndpoint, stream_id: int) -> None:
        self._receiver.on_add_subscription(endpoint, stream_id)

    def remove_subscription(self, endpoint: ReceiveChannelEndpoint, stream_id: int) -> None:
        self._receiver.on_remove_subscription(endpoint, stream_id)

    def new_publication_image(self, endpoint: ReceiveChannelEndpoint, image: PublicationImage) -> None:
        self._receiver.on_new_publication_image(endpoint, image)

    def remove_publication_image(self, endpoint: ReceiveChannelEndpoint, image: PublicationImage) -> None:
        self._receiver.on_remove_publication_image(endpoint, image)


class DriverConductorProxy:
    """The receive endpoints' way to the conductor (direct calls: one shared duty cycle)."""

    def __init__(self, conductor: DriverConductor) -> None:
        self._conductor = conductor

    def create_publication_image(self, endpoint: ReceiveChannelEndpoint, setup: SetupFrame, source: Address) -> None:
        self._conductor.on_create_publication_image(endpoint, setup, source)
