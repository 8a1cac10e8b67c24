"""Publications: ADD_PUBLICATION, ADD_EXCLUSIVE_PUBLICATION, REMOVE_PUBLICATION, their send endpoints,
and each timer tick's checks (blocked publishers, drained publications retired).

A non-exclusive publication is shared by every add of the same stream and canonical channel (and
no ``session-id``); an exclusive one is the adder's alone. A network publication's endpoint is
opened on the first publication of its channel and handed to the sender through the sender proxy;
it is closed (through the proxy too) when the channel's last publication is retired.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import TypedDict

import structlog

from logbuf import native
from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit.counters import CountersManager
from logbuf.conduit.error_log import DistinctErrorLog
from logbuf.driver.client_command_adapter import CommandError
from logbuf.driver.client_handler import ClientHandler
from logbuf.driver.client_proxy import ClientProxy
from logbuf.driver.conductor_registry import ConductorRegistry, EndpointKey
from logbuf.driver.context import DriverContext
from logbuf.driver.ipc_publication import IpcPublication
from logbuf.driver.lifecycle import PublicationState
from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.proxies import SenderCommands
from logbuf.driver.retransmit_handler import RetransmitHandler
from logbuf.driver.sender_flow_control import new_flow_control
from logbuf.driver.stream_counters import StreamCounters
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.driver.udp import FaultInjector, SendChannelEndpoint
from logbuf.driver.udp_channel import (
    DriverChannel,
    PublicationParams,
    SendPlan,
    parse_channel,
    resolve_publication_channel,
)
from logbuf.errors import ErrorCode
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.term_unblocker import UnblockStatus
from logbuf.protocol.setup import GROUP_FLAG

__all__ = ["COMMANDS_EVERY_PUBLICATIONS", "PublicationHandler", "check_stream_id"]

RESERVED_SESSION_ID_LOW = -1
RESERVED_SESSION_ID_HIGH = 1000
COMMANDS_EVERY_PUBLICATIONS = 256
"""With thousands of publications, the duty cycle and the timer read commands again after every this
many publications, so that a command waits for a bounded slice of a pass, not for all of it."""


class _PublicationFields(TypedDict):
    """What an IPC and a network publication are built from alike."""

    registration_id: int
    session_id: int
    stream_id: int
    channel: str
    exclusive: bool
    log: LogBuffers
    log_file_name: str
    publisher_limit_id: int
    publisher_limit: native.Position
    publisher_position_id: int
    counters: CountersManager
    linger_timeout_ns: int
    clean_position: int
    unblock_timeout_ns: int


def check_stream_id(stream_id: int) -> None:
    if not -(1 << 31) <= stream_id < (1 << 31):
        raise CommandError(ErrorCode.MALFORMED_COMMAND, f"stream_id={stream_id} is not a 32-bit integer")


class FaultSource:
    """The UDP fault injectors of the driver's ``udp_*_rate`` settings, each endpoint its own seed."""

    def __init__(self, ctx: DriverContext) -> None:
        self.ctx = ctx
        self._seed = ctx.udp_fault_seed

    def __call__(self) -> FaultInjector | None:
        ctx = self.ctx
        if not (ctx.udp_drop_rate or ctx.udp_duplicate_rate or ctx.udp_reorder_rate):
            return None
        self._seed += 1
        return FaultInjector(ctx.udp_drop_rate, ctx.udp_duplicate_rate, ctx.udp_reorder_rate, self._seed)


class PublicationHandler:
    """Adds, shares, removes and retires publications; opens and closes their send endpoints."""

    def __init__(
        self,
        ctx: DriverContext,
        registry: ConductorRegistry,
        clients: ClientHandler,
        client_proxy: ClientProxy,
        sender: SenderCommands,
        system_counters: SystemCounters,
        error_log: DistinctErrorLog,
        faults: FaultSource,
    ) -> None:
        self.ctx = ctx
        self.registry = registry
        self.clients = clients
        self.client_proxy = client_proxy
        self.sender = sender
        self.counters = registry.counters
        self.system_counters = system_counters
        self.error_log = error_log
        self.faults = faults
        self.directory = os.path.join(ctx.dir, "publications")
        self._next_session_id = random.randint(RESERVED_SESSION_ID_HIGH + 1, 1 << 30)
        self._log = structlog.get_logger().bind(role="conductor")

    # -- commands ---------------------------------------------------------------------------------------
    def on_add_publication(self, buffer: memoryview, *, exclusive: bool) -> None:
        command = cmd.PublicationCommand.decode(buffer)
        session = self.clients.client(command.client_id)
        uri = parse_channel(command.channel)
        check_stream_id(command.stream_id)
        channel = resolve_publication_channel(uri, self.ctx)
        endpoint_key: EndpointKey | None = ("send", channel.canonical) if channel.udp else None
        self.clients.check_limits(session, endpoint_key)
        publication = None if exclusive or uri.session_id() is not None else self._shared(command.stream_id, channel)
        if publication is not None:
            publication.ref_count += 1
        else:
            owned = (6 if channel.udp else 2) + sum(  # pub-pos, pub-lmt (snd-pos, -lmt, -bpe, -naks)
                1  # and the sub-pos counters of this client's own subscriptions that link to it
                for link in self.registry.stream_subscriptions(command.stream_id).values()
                if link.client_id == session.client_id
            )
            self.clients.check_counters(session, owned, "a publication")
            publication = self.new_publication(
                command.correlation_id, command.stream_id, channel, exclusive, client_id=command.client_id
            )
        session.publication_links[command.correlation_id] = publication
        if endpoint_key is not None:
            session.hold_endpoint(endpoint_key)
        self.client_proxy.on_publication_ready(
            command.correlation_id,
            publication.registration_id,
            publication.session_id,
            publication.stream_id,
            publication.publisher_limit_id,
            publication.log_file_name,
            exclusive=exclusive,
        )

    def _shared(self, stream_id: int, channel: DriverChannel) -> IpcPublication | None:
        """The active non-exclusive publication of this stream and channel, if any."""
        for candidate in self.registry.publications_by_stream.get(stream_id, ()):
            if (
                not candidate.exclusive
                and candidate.state is PublicationState.ACTIVE
                and candidate.stream_id == stream_id
                and candidate.channel == channel.canonical
            ):
                return candidate
        return None

    def on_remove_publication(self, buffer: memoryview) -> None:
        command = cmd.RemoveCommand.decode(buffer)
        session = self.clients.client(command.client_id)
        publication = session.publication_links.pop(command.registration_id, None)
        if publication is None:
            raise CommandError(
                ErrorCode.UNKNOWN_PUBLICATION, f"unknown publication registration_id={command.registration_id}"
            )
        if isinstance(publication, NetworkPublication):
            session.release_endpoint(("send", publication.channel))
        publication.decrement_ref(self.ctx.clock_ns())
        self.client_proxy.on_operation_success(command.correlation_id)

    # -- creation ---------------------------------------------------------------------------------------
    def new_publication(
        self, registration_id: int, stream_id: int, channel: DriverChannel, exclusive: bool, *, client_id: int = 0
    ) -> IpcPublication:
        """A new publication (its log, counters and, on UDP, its place on a send endpoint), linked to the
        subscriptions already waiting for it."""
        params = PublicationParams.of(channel, self.ctx)
        session_id = params.session_id if params.session_id is not None else self._allocate_session_id()
        path = os.path.join(self.directory, f"{registration_id}.logbuffer")
        self.registry.check_counters(
            (6 if channel.udp else 2) + len(self.registry.stream_subscriptions(stream_id)), f"publication {path}"
        )
        log = self._create_log(path, registration_id, session_id, stream_id, params)
        factory = StreamCounters(
            self.counters, registration_id, session_id, stream_id, channel.original or channel.canonical, client_id
        )
        start = log.tail_position()
        pos_id = factory.publisher_position(start, exclusive=exclusive)
        limit_id = factory.publisher_limit(start)
        common = _PublicationFields(
            registration_id=registration_id,
            session_id=session_id,
            stream_id=stream_id,
            channel=channel.canonical,
            exclusive=exclusive,
            log=log,
            log_file_name=path,
            publisher_limit_id=limit_id,
            publisher_limit=self.counters.position(limit_id),
            publisher_position_id=pos_id,
            counters=self.counters,
            linger_timeout_ns=params.linger_ns,
            clean_position=start,
            unblock_timeout_ns=self.ctx.publication_unblock_timeout_ns,
        )
        if channel.send is not None:
            publication: IpcPublication = self._new_network_publication(common, channel, channel.send, params, factory)
        else:
            publication = IpcPublication(**common)
        self._added(publication, channel, term_length=params.term_length)
        return publication

    def _allocate_session_id(self) -> int:
        session_id = self._next_session_id
        self._next_session_id += 1
        if self._next_session_id >= (1 << 31) - 1:
            self._next_session_id = RESERVED_SESSION_ID_HIGH + 1
        return session_id

    def _create_log(
        self, path: str, registration_id: int, session_id: int, stream_id: int, params: PublicationParams
    ) -> LogBuffers:
        term_length = params.term_length
        try:
            log = LogBuffers.create_file(
                path,
                mode=self.ctx.file_mode,
                term_length=term_length,
                mtu_length=params.mtu,
                session_id=session_id,
                stream_id=stream_id,
                initial_term_id=params.initial_term_id,
                correlation_id=registration_id,
                term_window_length=min(self.ctx.ipc_term_window_length or term_length // 2, term_length // 2),
            )
        except OSError as e:
            raise CommandError(ErrorCode.STORAGE_SPACE, f"cannot create log {path}: {e}") from e
        if params.initial_position is not None:
            log.seek_to(*params.initial_position)
        return log

    def _new_network_publication(
        self,
        common: _PublicationFields,
        channel: DriverChannel,
        plan: SendPlan,
        params: PublicationParams,
        factory: StreamCounters,
    ) -> NetworkPublication:
        start = common["clean_position"]
        snd_pos = factory.sender_position(start)
        snd_lmt = factory.sender_limit(start)
        snd_bpe = factory.sender_bpe()
        snd_naks = factory.sender_naks_received()
        publication = NetworkPublication(
            **common,
            sender_position_id=snd_pos,
            sender_limit_id=snd_lmt,
            sender_bpe_id=snd_bpe,
            naks_received_id=snd_naks,
            sender_position=self.counters.position(snd_pos),
            system_counters=self.system_counters,
            mtu_length=params.mtu,
            connection_timeout_ns=self.ctx.publication_connection_timeout_ns,
            sender_limit=start,
            flow_control=new_flow_control(params.flow_control),
            setup_flags=GROUP_FLAG if plan.group else 0,
            setup_ttl=params.setup_ttl,
            retransmit_handler=RetransmitHandler(
                self.ctx.retransmit_linger_ns, self.ctx.max_retransmits, self.ctx.retransmit_max_rate
            ),
        )
        if plan.group:
            publication.receivers_counter_id = factory.flow_control_receivers()
        if plan.mdc:
            publication.mdc_destinations_counter_id = factory.mdc_destinations()
        try:
            endpoint = self._send_endpoint(channel, plan)
        except BaseException:
            publication.close()
            raise
        self.sender.new_network_publication(endpoint, publication)
        return publication

    def _send_endpoint(self, channel: DriverChannel, plan: SendPlan) -> SendChannelEndpoint:
        """The channel's send endpoint, opened (and handed to the sender) if it is the first publication's."""
        endpoint = self.registry.send_endpoints.get(channel.canonical)
        if endpoint is not None:
            return endpoint
        try:
            if plan.multicast is not None:
                transport = self.ctx.udp_transport(
                    plan.bind,
                    sockets=channel.sockets,
                    faults=self.faults(),
                    system_counters=self.system_counters,
                    multicast=plan.multicast,
                )
            else:
                transport = self.ctx.udp_transport(
                    plan.bind, sockets=channel.sockets, faults=self.faults(), system_counters=self.system_counters
                )
        except OSError as e:
            raise CommandError(
                ErrorCode.CHANNEL_ENDPOINT_ERROR, f"cannot open a socket for {channel.canonical}: {e}"
            ) from e
        endpoint = SendChannelEndpoint(
            channel.canonical,
            plan.destination,
            transport,
            self.system_counters,
            self.ctx.clock_ns,
            plan.destination_tracker(self.ctx),
        )
        self.registry.send_endpoints[channel.canonical] = endpoint
        self.sender.register_send_channel_endpoint(endpoint)
        return endpoint

    def _added(self, publication: IpcPublication, channel: DriverChannel, *, term_length: int) -> None:
        registry = self.registry
        registry.add_publication(publication)
        self.system_counters.set(SystemCounterId.ACTIVE_PUBLICATIONS, len(registry.publications))
        self._log.info(
            "publication.added",
            registration_id=publication.registration_id,
            session_id=publication.session_id,
            stream_id=publication.stream_id,
            channel=channel.canonical,
            exclusive=publication.exclusive,
            term_length=term_length,
        )
        network = channel.udp
        for link in registry.stream_subscriptions(publication.stream_id).values():
            if link.stream_id == publication.stream_id and link.canonical == channel.canonical and link.spy == network:
                registry.link_subscriber(publication, link)

    # -- timer ------------------------------------------------------------------------------------------
    def on_timer(self, now_ns: int, read_commands: Callable[[], int]) -> int:
        """Sample, time and unblock every publication; retire those done. ``read_commands`` is called every
        :data:`COMMANDS_EVERY_PUBLICATIONS` publications (a long pass must not hold commands up)."""
        work = 0
        for index, publication in enumerate(list(self.registry.publications)):
            if index % COMMANDS_EVERY_PUBLICATIONS == COMMANDS_EVERY_PUBLICATIONS - 1:
                work += read_commands()
            publication.sample_publisher_position()
            publication.on_time_event(now_ns)
            self._check_blocked(publication, now_ns)
            if publication.state is PublicationState.DONE:
                self._retire(publication)
                work += 1
        return work

    def _check_blocked(self, publication: IpcPublication, now_ns: int) -> None:
        unblock = publication.check_for_blocked_publisher(now_ns)
        if unblock is UnblockStatus.REFUSED:
            self.system_counters.increment(SystemCounterId.CORRUPT_LOG_FRAMES)
            self.error_log.record(
                f"corrupt log: publication registration_id={publication.registration_id} stream_id="
                f"{publication.stream_id} is blocked at position={publication.last_consumer_position} by a "
                f"frame that is no abandoned claim, not padded over: {publication.unblock_refused_reason}"
            )
            self._log.error(
                "publication.unblock_refused",
                registration_id=publication.registration_id,
                session_id=publication.session_id,
                stream_id=publication.stream_id,
                position=publication.last_consumer_position,
                reason=publication.unblock_refused_reason,
            )
        elif unblock is not UnblockStatus.NO_ACTION:
            self.system_counters.increment(SystemCounterId.UNBLOCKED_PUBLICATIONS)
            self._log.warning(
                "publication.unblocked",
                registration_id=publication.registration_id,
                session_id=publication.session_id,
                stream_id=publication.stream_id,
                position=publication.last_consumer_position,
            )

    def _retire(self, publication: IpcPublication) -> None:
        self.registry.unlink_all(publication)
        if isinstance(publication, NetworkPublication):
            self._remove_from_send_endpoint(publication)
        publication.close()
        self.registry.remove_publication(publication)
        self.system_counters.set(SystemCounterId.ACTIVE_PUBLICATIONS, len(self.registry.publications))
        self._log.info(
            "publication.removed",
            registration_id=publication.registration_id,
            session_id=publication.session_id,
            stream_id=publication.stream_id,
        )

    def _remove_from_send_endpoint(self, publication: NetworkPublication) -> None:
        """Take the publication off its send endpoint; close the endpoint if it was the channel's last."""
        endpoint = self.registry.send_endpoints.get(publication.channel)
        if endpoint is None:
            return
        self.sender.remove_network_publication(endpoint, publication)
        if not any(
            isinstance(p, NetworkPublication) and p.channel == publication.channel and p is not publication
            for p in self.registry.publications
        ):
            del self.registry.send_endpoints[publication.channel]
            self.sender.close_send_channel_endpoint(endpoint)
