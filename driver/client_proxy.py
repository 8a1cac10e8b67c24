"""The conductor's responses to clients, encoded and broadcast on the to-clients buffer.

After Aeron's ``ClientProxy``: one method per response type, so no handler encodes a response
itself and every response a client can get is listed here.
"""

from __future__ import annotations

from typing import Protocol

from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit.broadcast import BroadcastTransmitter
from logbuf.errors import ErrorCode

__all__ = ["ClientProxy", "ImageSource"]


class ImageSource(Protocol):
    """What an ON_AVAILABLE_IMAGE names: a publication image or a publication (IPC, or spied on)."""

    @property
    def registration_id(self) -> int: ...
    @property
    def session_id(self) -> int: ...
    @property
    def stream_id(self) -> int: ...
    @property
    def log_file_name(self) -> str: ...
    @property
    def source_identity(self) -> str: ...


class ClientProxy:
    """Transmits the driver's responses to every client (each filters by its correlation ids)."""

    def __init__(self, to_clients: BroadcastTransmitter) -> None:
        self.to_clients = to_clients

    def on_error(self, correlation_id: int, code: ErrorCode, message: str) -> None:
        self.to_clients.transmit(cmd.ON_ERROR, cmd.ErrorResponse(correlation_id, int(code), message).encode())

    def on_publication_ready(
        self,
        correlation_id: int,
        registration_id: int,
        session_id: int,
        stream_id: int,
        publisher_limit_id: int,
        log_file_name: str,
        *,
        exclusive: bool,
    ) -> None:
        ready = cmd.PublicationReady(
            correlation_id, registration_id, session_id, stream_id, publisher_limit_id, -1, log_file_name
        )
        self.to_clients.transmit(
            cmd.ON_EXCLUSIVE_PUBLICATION_READY if exclusive else cmd.ON_PUBLICATION_READY, ready.encode()
        )

    def on_subscription_ready(self, correlation_id: int) -> None:
        self.to_clients.transmit(cmd.ON_SUBSCRIPTION_READY, cmd.SubscriptionReady(correlation_id, -1).encode())

    def on_operation_success(self, correlation_id: int) -> None:
        self.to_clients.transmit(cmd.ON_OPERATION_SUCCESS, cmd.OperationSuccess(correlation_id).encode())

    def on_available_image(self, source: ImageSource, subscription_id: int, subscriber_position_id: int) -> None:
        image = cmd.ImageReady(
            source.registration_id,
            source.session_id,
            source.stream_id,
            subscription_id,
            subscriber_position_id,
            source.log_file_name,
            source.source_identity,
        )
        self.to_clients.transmit(cmd.ON_AVAILABLE_IMAGE, image.encode())

    def on_unavailable_image(self, registration_id: int, subscription_id: int, stream_id: int, channel: str) -> None:
        message = cmd.ImageMessage(registration_id, subscription_id, stream_id, channel)
        self.to_clients.transmit(cmd.ON_UNAVAILABLE_IMAGE, message.encode())

    def on_client_timeout(self, client_id: int) -> None:
        self.to_clients.transmit(cmd.ON_CLIENT_TIMEOUT, cmd.ClientTimeout(client_id).encode())
