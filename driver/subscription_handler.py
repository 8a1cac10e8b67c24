"""Subscriptions: ADD_SUBSCRIPTION and REMOVE_SUBSCRIPTION, and the receive endpoints they open.

An IPC subscription links to the IPC publications of its stream, a spy (``aeron-spy:``) to the
network publications of its channel, a UDP subscription to the images its receive endpoint
creates. A UDP subscription opens its channel's receive endpoint if it is the first (handed to the
receiver through the receiver proxy), and the last one to a stream closes the stream there, its
images with it; the last one to an endpoint closes the endpoint.
"""

from __future__ import annotations

import structlog

from logbuf.conduit import command_descriptor as cmd
from logbuf.driver.client_command_adapter import CommandError
from logbuf.driver.client_handler import ClientHandler
from logbuf.driver.client_proxy import ClientProxy
from logbuf.driver.conductor_registry import ClientSession, ConductorRegistry, ReceiveChannel, SubscriptionLink
from logbuf.driver.context import DriverContext
from logbuf.driver.image_handler import ImageHandler
from logbuf.driver.lifecycle import ImageState, PublicationState
from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.proxies import ConductorCommands, ReceiverCommands
from logbuf.driver.publication_handler import FaultSource, check_stream_id
from logbuf.driver.system_counters import SystemCounters
from logbuf.driver.udp import Address, ReceiveChannelEndpoint
from logbuf.driver.udp_channel import DriverChannel, parse_channel, resolve_subscription_channel
from logbuf.errors import ErrorCode

__all__ = ["SubscriptionHandler"]


class SubscriptionHandler:
    """Adds and removes subscriptions; opens and closes receive endpoints."""

    def __init__(
        self,
        ctx: DriverContext,
        registry: ConductorRegistry,
        clients: ClientHandler,
        images: ImageHandler,
        client_proxy: ClientProxy,
        receiver: ReceiverCommands,
        conductor_proxy: ConductorCommands,
        system_counters: SystemCounters,
        faults: FaultSource,
    ) -> None:
        self.ctx = ctx
        self.registry = registry
        self.clients = clients
        self.images = images
        self.client_proxy = client_proxy
        self.receiver = receiver
        self.conductor_proxy = conductor_proxy
        self.system_counters = system_counters
        self.faults = faults
        self._log = structlog.get_logger().bind(role="conductor")

    # -- commands ---------------------------------------------------------------------------------------
    def on_add_subscription(self, buffer: memoryview) -> None:
        command = cmd.SubscriptionCommand.decode(buffer)
        session = self.clients.client(command.client_id)
        uri = parse_channel(command.channel, spy_allowed=True)
        check_stream_id(command.stream_id)
        channel = resolve_subscription_channel(uri, self.ctx)
        link = SubscriptionLink(
            command.correlation_id,
            command.client_id,
            command.stream_id,
            command.channel,
            channel.canonical,
            channel.spy,
        )
        links = len(self.registry.publications_by_stream.get(link.stream_id, ()))  # at most one sub-pos each
        self.registry.check_counters(links, f"subscription {link.channel}")
        address = channel.endpoint
        self.clients.check_limits(session, None if address is None else ("receive", address))
        self.clients.check_counters(session, links, "a subscription")
        if address is not None:
            self._subscribe_endpoint(channel, address, link.stream_id)
            link.endpoint_key = address
            session.hold_endpoint(("receive", address))
        self.registry.add_subscription(link)
        session.subscription_ids.add(link.registration_id)
        self.client_proxy.on_subscription_ready(command.correlation_id)
        self._log.info(
            "subscription.added",
            registration_id=link.registration_id,
            stream_id=link.stream_id,
            channel=link.channel,
            client_id=link.client_id,
        )
        self._link(link)

    def _subscribe_endpoint(self, channel: DriverChannel, address: Address, stream_id: int) -> None:
        """The stream subscribed on the channel's receive endpoint (opened if it is the first subscription)."""
        receive_channel = self.registry.receive_endpoints.get(address)
        if receive_channel is None:
            receive_channel = self._open_endpoint(channel, address)
        settings = channel.image
        existing = receive_channel.image_settings.setdefault(stream_id, settings)
        if existing != settings:
            raise CommandError(
                ErrorCode.INVALID_CHANNEL,
                f"{settings} conflicts with {existing} of an existing subscription to stream "
                f"{stream_id}: {channel.original}",
            )
        count = receive_channel.subscriptions.get(stream_id, 0)
        receive_channel.subscriptions[stream_id] = count + 1
        if count == 0:
            self.receiver.add_subscription(receive_channel.endpoint, stream_id)

    def _open_endpoint(self, channel: DriverChannel, address: Address) -> ReceiveChannel:
        try:
            if channel.multicast is not None:
                transport = self.ctx.udp_transport(
                    address,
                    sockets=channel.sockets,
                    faults=self.faults(),
                    system_counters=self.system_counters,
                    multicast=channel.multicast,
                )
            else:
                transport = self.ctx.udp_transport(
                    address, sockets=channel.sockets, faults=self.faults(), system_counters=self.system_counters
                )
        except OSError as e:
            raise CommandError(
                ErrorCode.CHANNEL_ENDPOINT_ERROR,
                f"cannot bind {address[0]}:{address[1]} for {channel.original}: {e}",
            ) from e
        multicast = channel.multicast is not None
        endpoint = ReceiveChannelEndpoint(
            channel.canonical,
            transport,
            self.system_counters,
            self.ctx.clock_ns,
            self.conductor_proxy,
            control_address=channel.control,
            elicit_periodically=channel.control is not None and not multicast,
            multicast=multicast,
        )
        receive_channel = self.registry.receive_endpoints[address] = ReceiveChannel(endpoint)
        self.receiver.register_receive_channel_endpoint(endpoint)
        return receive_channel

    def _link(self, link: SubscriptionLink) -> None:
        """Link a new subscription to the images (UDP) or publications (IPC, spy) already there."""
        registry = self.registry
        if link.endpoint_key is not None:
            for image in registry.images:
                if (
                    image.state is ImageState.ACTIVE
                    and image.stream_id == link.stream_id
                    and image.channel == link.canonical
                ):
                    registry.link_subscriber(image, link)
            return
        for publication in registry.publications_by_stream.get(link.stream_id, ()):
            if (
                publication.state is PublicationState.ACTIVE
                and publication.stream_id == link.stream_id
                and publication.channel == link.canonical
                and isinstance(publication, NetworkPublication) == link.spy
            ):
                registry.link_subscriber(publication, link)

    def on_remove_subscription(self, buffer: memoryview) -> None:
        command = cmd.RemoveCommand.decode(buffer)
        session = self.clients.client(command.client_id)
        if command.registration_id not in session.subscription_ids:
            raise CommandError(
                ErrorCode.UNKNOWN_SUBSCRIPTION, f"unknown subscription registration_id={command.registration_id}"
            )
        self.remove_subscription(session, command.registration_id)
        self.client_proxy.on_operation_success(command.correlation_id)

    def remove_subscription(self, session: ClientSession, registration_id: int) -> None:
        """Unlink the subscription (its client is not told: it removed it, or it is gone) and close what
        only it used."""
        registry = self.registry
        session.subscription_ids.discard(registration_id)
        link = registry.subscriptions.get(registration_id)
        for publication in registry.publications_by_stream.get(link.stream_id, ()) if link else registry.publications:
            if registration_id in publication.subscribers:
                registry.unlink_subscriber(publication, registration_id, notify=False)
        for image in registry.images:
            if registration_id in image.subscribers:
                registry.unlink_subscriber(image, registration_id, notify=False)
        link = registry.remove_subscription(registration_id)
        if link is not None and link.endpoint_key is not None:
            session.release_endpoint(("receive", link.endpoint_key))
            self._unsubscribe_endpoint(link.endpoint_key, link.stream_id)
        self._log.info("subscription.removed", registration_id=registration_id, client_id=session.client_id)

    def _unsubscribe_endpoint(self, address: Address, stream_id: int) -> None:
        receive_channel = self.registry.receive_endpoints[address]
        receive_channel.subscriptions[stream_id] -= 1
        if receive_channel.subscriptions[stream_id] <= 0:
            del receive_channel.subscriptions[stream_id]
            del receive_channel.image_settings[stream_id]
            self.receiver.remove_subscription(receive_channel.endpoint, stream_id)
            for image in [i for i in receive_channel.images.values() if i.stream_id == stream_id]:
                self.images.retire_image(image)
        if not receive_channel.subscriptions:
            del self.registry.receive_endpoints[address]
            self.receiver.close_receive_channel_endpoint(receive_channel.endpoint)
