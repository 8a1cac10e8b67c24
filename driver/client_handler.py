"""Clients: their sessions (made on a client's first command), keepalives, closes, timeouts and limits.

A client keeps alive by any command, a CLIENT_KEEPALIVE, or (Aeron's clients) by writing epoch
milliseconds into its heartbeat counter; one silent for ``client_liveness_timeout_ns`` is told
ON_CLIENT_TIMEOUT and loses its publications and subscriptions. What one client may hold is bounded
(``max_client_registrations``, ``max_client_endpoints``, ``client_counters_share``), checked before
a registration makes anything.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit.cnc import client_liveness_lock_held, cnc_path
from logbuf.conduit.counters import CountersManager
from logbuf.conduit.system_counters_descriptor import SYSTEM_COUNTER_OWNER_ID
from logbuf.driver.client_command_adapter import CommandError
from logbuf.driver.client_proxy import ClientProxy
from logbuf.driver.conductor_registry import ClientSession, ConductorRegistry, EndpointKey
from logbuf.driver.context import DriverContext
from logbuf.driver.stream_counters import allocate_client_heartbeat
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.errors import ErrorCode

__all__ = ["MAX_CLIENT_TIMEOUTS_PER_TIMER", "ClientHandler"]

MAX_CLIENT_TIMEOUTS_PER_TIMER = 64
"""Clients timed out per timer tick at most: a flood of clients that all go silent at once (forged
keepalives, say) is reaped over several ticks, and the heartbeat keeps its interval."""


class ClientHandler:
    """CLIENT_KEEPALIVE and CLIENT_CLOSE, client sessions, their timeouts and their limits."""

    def __init__(
        self,
        ctx: DriverContext,
        registry: ConductorRegistry,
        counters: CountersManager,
        system_counters: SystemCounters,
        client_proxy: ClientProxy,
        remove_subscription: Callable[[ClientSession, int], None],
    ) -> None:
        self.ctx = ctx
        self.registry = registry
        self.counters = counters
        self.system_counters = system_counters
        self.client_proxy = client_proxy
        self._remove_subscription = remove_subscription
        self._log = structlog.get_logger().bind(role="conductor")

    def client(self, client_id: int) -> ClientSession:
        """The client's session, created (with its heartbeat counter) on its first command."""
        clients = self.registry.clients
        session = clients.get(client_id)
        now_ns = self.ctx.clock_ns()
        if session is None:
            counter_id = allocate_client_heartbeat(self.counters, client_id, self.ctx.epoch_clock_ms())
            session = clients[client_id] = ClientSession(client_id, now_ns, counter_id)
            self.system_counters.set(SystemCounterId.ACTIVE_CLIENTS, len(clients))
            self._log.info("client.connected", client_id=client_id)
        session.last_keepalive_ns = now_ns
        self.counters.set_value(session.heartbeat_counter_id, self.ctx.epoch_clock_ms())
        return session

    # -- commands ---------------------------------------------------------------------------------------
    def on_client_keepalive(self, buffer: memoryview) -> None:
        command = cmd.CorrelatedCommand.decode(buffer)
        self.client(command.client_id)

    def on_client_close(self, buffer: memoryview) -> None:
        command = cmd.CorrelatedCommand.decode(buffer)
        session = self.registry.clients.get(command.client_id)
        if session is not None:
            if client_liveness_lock_held(cnc_path(self.ctx.dir), command.client_id):
                raise CommandError(
                    ErrorCode.GENERIC_ERROR,
                    f"CLIENT_CLOSE for client_id={command.client_id} refused: that client is still open"
                    " (it holds its liveness lock), so it did not send this",
                )
            self.remove_client(session, reason="closed")

    def remove_client(self, session: ClientSession, *, reason: str) -> None:
        now_ns = self.ctx.clock_ns()
        for publication in session.publication_links.values():
            publication.decrement_ref(now_ns)
        session.publication_links.clear()
        for registration_id in list(session.subscription_ids):
            self._remove_subscription(session, registration_id)
        self.counters.free(session.heartbeat_counter_id)
        del self.registry.clients[session.client_id]
        self.system_counters.set(SystemCounterId.ACTIVE_CLIENTS, len(self.registry.clients))
        self._log.info("client.removed", client_id=session.client_id, reason=reason)

    # -- timer ------------------------------------------------------------------------------------------
    def time_out_clients(self, now_ns: int) -> int:
        """Remove clients silent for ``client_liveness_timeout_ns`` (at most a bounded number per call)."""
        timeouts = 0
        for session in list(self.registry.clients.values()):
            if timeouts == MAX_CLIENT_TIMEOUTS_PER_TIMER:
                break
            # Aeron clients keep alive by writing epoch ms into their heartbeat counter, not by command
            heartbeat_age_ms = self.ctx.epoch_clock_ms() - self.counters.value(session.heartbeat_counter_id)
            if heartbeat_age_ms * 1_000_000 < now_ns - session.last_keepalive_ns:
                session.last_keepalive_ns = now_ns - heartbeat_age_ms * 1_000_000
            if now_ns > session.last_keepalive_ns + self.ctx.client_liveness_timeout_ns:
                self.system_counters.increment(SystemCounterId.CLIENT_TIMEOUTS)
                self.client_proxy.on_client_timeout(session.client_id)
                self.remove_client(session, reason="timeout")
                timeouts += 1
        return timeouts

    # -- limits -----------------------------------------------------------------------------------------
    def check_limits(self, session: ClientSession, endpoint: EndpointKey | None) -> None:
        """Refuse a registration past the client's ``max_client_registrations``, or one that would open a UDP
        endpoint past its ``max_client_endpoints``, before anything is made: one client must not exhaust
        what every client shares (descriptors, driver memory, the duty cycle). The texts name no channel,
        so a client retrying at its limit adds one distinct error, not one per attempt."""
        ctx = self.ctx
        if session.registrations >= ctx.max_client_registrations:
            raise CommandError(
                ErrorCode.RESOURCE_TEMPORARILY_UNAVAILABLE,
                f"client {session.client_id} holds {session.registrations} publications and subscriptions, the most"
                f" one client may (max_client_registrations={ctx.max_client_registrations})",
            )
        if endpoint is not None and endpoint not in session.endpoints:
            if len(session.endpoints) >= ctx.max_client_endpoints:
                raise CommandError(
                    ErrorCode.RESOURCE_TEMPORARILY_UNAVAILABLE,
                    f"client {session.client_id} holds {len(session.endpoints)} UDP endpoints, the most one client"
                    f" may (max_client_endpoints={ctx.max_client_endpoints})",
                )

    def check_counters(self, session: ClientSession, count: int, what: str) -> None:
        """Refuse a registration that would take the client past its share of the counters
        (``client_counters_share``), so the counters left are there for the other clients' streams."""
        share = self.ctx.client_counters_share
        if share >= 1.0 or not self.counters.has_room(count):
            return  # no share (first come, first served), or all full: the counters-full check refuses it
        for_clients = self.counters.capacity - self.counters.owned_by(SYSTEM_COUNTER_OWNER_ID)
        limit = int(share * for_clients)
        owned = self.counters.owned_by(session.client_id)
        if count and owned + count > limit:
            raise CommandError(
                ErrorCode.RESOURCE_TEMPORARILY_UNAVAILABLE,
                f"{what} needs {count} counters and client {session.client_id} holds {owned}: one client may hold"
                f" {limit} of the {for_clients} counters left beside the system counters"
                f" (client_counters_share={share})",
            )
