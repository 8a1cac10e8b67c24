"""The driver conductor: reads client commands, owns publications, subscriptions, images and clients.

Built as Aeron's is: a :class:`~logbuf.driver.client_command_adapter.ClientCommandAdapter` decodes
each command from the to-driver ring and dispatches it by type id to a handler of its family
(:mod:`~logbuf.driver.publication_handler`, :mod:`~logbuf.driver.subscription_handler`,
:mod:`~logbuf.driver.destination_handler`, :mod:`~logbuf.driver.client_handler`; a receive
endpoint's request for an image goes to :mod:`~logbuf.driver.image_handler`). A channel is resolved
once into a :class:`~logbuf.driver.udp_channel.DriverChannel`; counters come from the factories of
:mod:`~logbuf.driver.stream_counters`; responses go out through a
:class:`~logbuf.driver.client_proxy.ClientProxy`. What the handlers share is a
:class:`~logbuf.driver.conductor_registry.ConductorRegistry`.

Duty cycle (:meth:`DriverConductor.do_work`): drain up to a batch of commands from the to-driver
ring; move every IPC publication's limit (clean, then publish); every ``timer_interval_ns``:
heartbeat into the CnC, time out silent clients, retire drained publications and inactive images,
sample positions.

Errors from a command are answered with ON_ERROR to the client, counted in the ERRORS counter
and recorded in the distinct error log; the conductor carries on with the next command.

The conductor never touches the sender's or the receiver's state: it opens endpoints and hands
them, with new publications, subscriptions, images and destination changes, to those agents
through their proxies (:mod:`logbuf.driver.proxies`); a receive endpoint asks it for an image
through its own (:meth:`DriverConductor.on_create_publication_image`). Its clocks are the driver
context's.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable

import structlog

from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit.broadcast import BroadcastTransmitter
from logbuf.conduit.counters import CountersManager
from logbuf.conduit.error_log import DistinctErrorLog
from logbuf.conduit.loss_report import LossReport
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer, RingBufferUnblocker
from logbuf.driver.client_command_adapter import ClientCommandAdapter, CommandError, CommandHandler
from logbuf.driver.client_handler import ClientHandler
from logbuf.driver.client_proxy import ClientProxy
from logbuf.driver.conductor_registry import (
    ClientSession,
    ConductorRegistry,
    ReceiveChannel,
    SubscriptionLink,
)
from logbuf.driver.context import DriverContext
from logbuf.driver.destination_handler import DestinationHandler
from logbuf.driver.image_handler import ImageHandler
from logbuf.driver.ipc_publication import IpcPublication
from logbuf.driver.proxies import DriverConductorProxy, ReceiverCommands, SenderCommands
from logbuf.driver.publication_handler import COMMANDS_EVERY_PUBLICATIONS, FaultSource, PublicationHandler
from logbuf.driver.publication_image import PublicationImage
from logbuf.driver.subscription_handler import SubscriptionHandler
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.driver.udp import Address, ReceiveChannelEndpoint, SendChannelEndpoint
from logbuf.protocol.setup import SetupFrame

__all__ = ["ClientSession", "CommandError", "DriverConductor", "ReceiveChannel", "SubscriptionLink"]


class DriverConductor:
    """Agent owning the driver's state; everything else talks to it through the CnC."""

    role_name = "conductor"

    def __init__(
        self,
        ctx: DriverContext,
        *,
        to_driver: ManyToOneRingBuffer,
        to_clients: BroadcastTransmitter,
        counters: CountersManager,
        system_counters: SystemCounters,
        error_log: DistinctErrorLog,
        sender: SenderCommands,
        receiver: ReceiverCommands,
        on_terminate: Callable[[], None] | None = None,
        loss_report: LossReport | None = None,
    ) -> None:
        self.ctx = ctx
        self.to_driver = to_driver
        self._to_driver_unblocker = RingBufferUnblocker(to_driver, ctx.effective_command_unblock_timeout_ns)
        self.counters = counters
        self.system_counters = system_counters
        self.error_log = error_log
        self.on_terminate = on_terminate
        self.client_proxy = ClientProxy(to_clients)
        self.registry = ConductorRegistry(counters, ctx.counters_buffer_length, self.client_proxy)
        faults = FaultSource(ctx)
        self.client_handler = ClientHandler(
            ctx,
            self.registry,
            counters,
            system_counters,
            self.client_proxy,
            remove_subscription=lambda session, registration_id: self.subscription_handler.remove_subscription(
                session, registration_id
            ),
        )
        self.image_handler = ImageHandler(
            ctx, self.registry, to_driver, receiver, system_counters, error_log, loss_report
        )
        self.publication_handler = PublicationHandler(
            ctx, self.registry, self.client_handler, self.client_proxy, sender, system_counters, error_log, faults
        )
        self.subscription_handler = SubscriptionHandler(
            ctx,
            self.registry,
            self.client_handler,
            self.image_handler,
            self.client_proxy,
            receiver,
            DriverConductorProxy(self),  # what the receive endpoints it opens call back
            system_counters,
            faults,
        )
        self.destination_handler = DestinationHandler(
            ctx, self.registry, self.client_handler, self.client_proxy, sender
        )
        self.command_adapter = ClientCommandAdapter(
            to_driver, self._command_handlers(), self.client_proxy, system_counters, error_log
        )
        self._next_timer_ns = 0
        self._log = structlog.get_logger().bind(role=self.role_name)

    def _command_handlers(self) -> dict[int, CommandHandler]:
        publications, subscriptions = self.publication_handler, self.subscription_handler
        destinations, clients = self.destination_handler, self.client_handler
        return {
            cmd.ADD_PUBLICATION: lambda b: publications.on_add_publication(b, exclusive=False),
            cmd.ADD_EXCLUSIVE_PUBLICATION: lambda b: publications.on_add_publication(b, exclusive=True),
            cmd.REMOVE_PUBLICATION: publications.on_remove_publication,
            cmd.ADD_SUBSCRIPTION: subscriptions.on_add_subscription,
            cmd.REMOVE_SUBSCRIPTION: subscriptions.on_remove_subscription,
            cmd.CLIENT_KEEPALIVE: clients.on_client_keepalive,
            cmd.ADD_DESTINATION: lambda b: destinations.on_destination(b, add=True),
            cmd.REMOVE_DESTINATION: lambda b: destinations.on_destination(b, add=False),
            cmd.CLIENT_CLOSE: clients.on_client_close,
            cmd.TERMINATE_DRIVER: self._on_terminate_driver,
        }

    # -- what the conductor owns (read-only views for tools and tests) --------------------------------
    @property
    def clients(self) -> dict[int, ClientSession]:
        return self.registry.clients

    @property
    def publications(self) -> list[IpcPublication]:
        return self.registry.publications

    @property
    def subscriptions(self) -> dict[int, SubscriptionLink]:
        return self.registry.subscriptions

    @property
    def images(self) -> list[PublicationImage]:
        return self.registry.images

    @property
    def send_endpoints(self) -> dict[str, SendChannelEndpoint]:
        return self.registry.send_endpoints

    @property
    def receive_endpoints(self) -> dict[Address, ReceiveChannel]:
        return self.registry.receive_endpoints

    # -- agent ------------------------------------------------------------------------------------------
    def on_start(self) -> None:
        for directory in (self.publication_handler.directory, self.image_handler.directory):
            os.makedirs(directory, mode=self.ctx.dir_mode, exist_ok=True)
            os.chmod(directory, self.ctx.dir_mode)  # makedirs' mode goes through the umask
        self._heartbeat()

    def do_work(self) -> int:
        receive = self.command_adapter.receive
        work = receive()
        for index, publication in enumerate(self.registry.publications):  # commands only append to the list
            work += publication.update_publisher_limit()
            if index % COMMANDS_EVERY_PUBLICATIONS == COMMANDS_EVERY_PUBLICATIONS - 1:
                work += receive()
        now_ns = self.ctx.clock_ns()
        if now_ns >= self._next_timer_ns:
            self._next_timer_ns = now_ns + self.ctx.timer_interval_ns
            work += self._on_timer(now_ns)  # counts only what changed: a heartbeat alone is no work
        return work

    def on_close(self) -> None:
        for publication in self.registry.publications:
            publication.close()
        self.registry.publications.clear()
        for image in self.registry.images:
            image.close()
        self.registry.images.clear()

    # -- commands from the receive endpoints (through DriverConductorProxy) ------------------------------
    def on_create_publication_image(self, endpoint: ReceiveChannelEndpoint, setup: SetupFrame, source: Address) -> None:
        """A SETUP for a subscribed stream without an active image (see :class:`ImageHandler`)."""
        self.image_handler.on_create_publication_image(endpoint, setup, source)

    # -- the driver --------------------------------------------------------------------------------------
    def _on_terminate_driver(self, buffer: memoryview) -> None:
        """Aeron's rule: denied unless a termination token is configured and the command carries it."""
        command = cmd.TerminateDriverCommand.decode(buffer)
        expected = self.ctx.termination_token.encode()
        allowed = bool(expected) and hmac.compare_digest(command.token, expected)
        self._log.info("driver.terminate_requested", client_id=command.client_id, allowed=allowed)
        if allowed and self.on_terminate is not None:
            self.on_terminate()

    # -- timers -----------------------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        self.to_driver.set_consumer_heartbeat_time(self.ctx.epoch_clock_ms())

    def _on_timer(self, now_ns: int) -> int:
        self._heartbeat()
        if self._to_driver_unblocker.check(now_ns):
            self.system_counters.increment(SystemCounterId.UNBLOCKED_COMMANDS)
            self._log.warning("commands.unblocked", position=self._to_driver_unblocker.ring.consumer_position())
        work = self.client_handler.time_out_clients(now_ns)
        work += self.publication_handler.on_timer(now_ns, self.command_adapter.receive)
        work += self.image_handler.on_timer(now_ns)
        registry = self.registry
        if registry.images_changed:
            registry.images_changed = False
            self.system_counters.set(SystemCounterId.ACTIVE_IMAGES, registry.active_images())
        return work
