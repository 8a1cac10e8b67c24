"""ADD_DESTINATION and REMOVE_DESTINATION: a client's destinations of its manual MDC publication.

The destination tracker is the sender's (its endpoint sends to every destination), so the change
goes through the sender proxy; the conductor checks the command and answers the client.
"""

from __future__ import annotations

import structlog

from logbuf.channel_uri import ChannelUri
from logbuf.conduit import command_descriptor as cmd
from logbuf.driver.client_command_adapter import CommandError
from logbuf.driver.client_handler import ClientHandler
from logbuf.driver.client_proxy import ClientProxy
from logbuf.driver.conductor_registry import ConductorRegistry
from logbuf.driver.context import DriverContext
from logbuf.driver.destination_tracker import MAX_DESTINATIONS
from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.proxies import SenderCommands
from logbuf.driver.udp_channel import resolve_address
from logbuf.errors import ErrorCode

__all__ = ["DestinationHandler"]


class DestinationHandler:
    """Checks destination commands and has the sender apply them."""

    def __init__(
        self,
        ctx: DriverContext,
        registry: ConductorRegistry,
        clients: ClientHandler,
        client_proxy: ClientProxy,
        sender: SenderCommands,
    ) -> None:
        self.ctx = ctx
        self.registry = registry
        self.clients = clients
        self.client_proxy = client_proxy
        self.sender = sender
        self._log = structlog.get_logger().bind(role="conductor")

    def on_destination(self, buffer: memoryview, *, add: bool) -> None:
        """ADD_DESTINATION / REMOVE_DESTINATION for a manual MDC publication of this client."""
        command = cmd.DestinationCommand.decode(buffer)
        session = self.clients.client(command.client_id)
        publication = session.publication_links.get(command.registration_id)
        if publication is None:
            raise CommandError(
                ErrorCode.UNKNOWN_PUBLICATION, f"unknown publication registration_id={command.registration_id}"
            )
        endpoint = (
            self.registry.send_endpoints.get(publication.channel)
            if isinstance(publication, NetworkPublication)
            else None
        )
        if endpoint is None or endpoint.destinations is None or not endpoint.destinations.manual:
            raise CommandError(
                ErrorCode.INVALID_CHANNEL,
                f"destinations can only be added to a control-mode=manual publication, not {publication.channel}",
            )
        uri = ChannelUri.parse(command.channel)
        if uri.media != "udp" or uri.endpoint() is None:
            raise CommandError(
                ErrorCode.INVALID_CHANNEL, f"a destination must be aeron:udp?endpoint=host:port: {command.channel}"
            )
        address = resolve_address(uri)
        now_ns = self.ctx.clock_ns()
        if add:
            if not self.sender.add_destination(endpoint, address, command.channel, now_ns):
                raise CommandError(
                    ErrorCode.RESOURCE_TEMPORARILY_UNAVAILABLE,
                    f"publication registration_id={publication.registration_id} already has "
                    f"{MAX_DESTINATIONS} destinations, the most one endpoint sends to: {command.channel}",
                )
        elif not self.sender.remove_destination(endpoint, address, now_ns):
            raise CommandError(ErrorCode.UNKNOWN_PUBLICATION, f"unknown destination {command.channel}")
        self._log.info(
            "destination.added" if add else "destination.removed",
            registration_id=publication.registration_id,
            destination=f"{address[0]}:{address[1]}",
        )
        self.client_proxy.on_operation_success(command.correlation_id)
