"""The driver conductor: reads client commands, owns publications, subscriptions and clients.

Duty cycle (:meth:`DriverConductor.do_work`): drain up to a batch of commands from the to-driver
ring; move every IPC publication's limit (clean, then publish); every ``timer_interval``:
heartbeat into the CnC, time out silent clients, retire drained publications, sample positions.

Errors from a command are answered with ON_ERROR to the client, counted in the ERRORS counter
and recorded in the distinct error log; the conductor carries on with the next command.

The conductor never touches the sender's or the receiver's state: it opens endpoints and hands
them, with new publications, subscriptions and images, to those agents through their proxies
(:mod:`logbuf.driver.proxies`); a receive endpoint asks it for an image through its own
(:meth:`DriverConductor.on_create_publication_image`). Its clocks are the driver context's.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

import structlog

from logbuf import native
from logbuf.channel_uri import ChannelUri, InvalidChannelError
from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.broadcast import BroadcastTransmitter
from logbuf.conduit.cnc import client_liveness_lock_held, cnc_path
from logbuf.conduit.command_descriptor import MalformedCommandError
from logbuf.conduit.counters import CountersManager
from logbuf.conduit.error_log import DistinctErrorLog
from logbuf.conduit.loss_report import LossReport
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer, RingBufferUnblocker
from logbuf.conduit.system_counters_descriptor import SYSTEM_COUNTER_OWNER_ID
from logbuf.driver.context import DriverContext
from logbuf.driver.destination_tracker import AllowedSources, DestinationTracker
from logbuf.driver.ipc_publication import IpcPublication, SubscriberPosition
from logbuf.driver.lifecycle import ImageState, PublicationState
from logbuf.driver.nak_delay import OptimalMulticastDelayGenerator
from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.proxies import DriverConductorProxy, ReceiverCommands, SenderCommands
from logbuf.driver.publication_image import PublicationImage
from logbuf.driver.retransmit_handler import RetransmitHandler
from logbuf.driver.sender_flow_control import new_flow_control, parse_flow_control
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.driver.udp import (
    Address,
    FaultInjector,
    ImageSettings,
    MulticastSettings,
    ReceiveChannelEndpoint,
    SendChannelEndpoint,
    SocketSettings,
    is_multicast,
    multicast_control_address,
    resolve_interface,
)
from logbuf.errors import ErrorCode, LogbufError
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.term_unblocker import UnblockStatus
from logbuf.protocol.setup import GROUP_FLAG, SetupFrame

RESERVED_SESSION_ID_LOW = -1
RESERVED_SESSION_ID_HIGH = 1000
MAX_CLIENT_TIMEOUTS_PER_TIMER = 64
COMMANDS_EVERY_PUBLICATIONS = 256
"""With thousands of publications, the duty cycle and the timer read commands again after every this
many publications, so that a command waits for a bounded slice of a pass, not for all of it."""
"""Clients timed out per timer tick at most: a flood of clients that all go silent at once (forged
keepalives, say) is reaped over several ticks, and the heartbeat keeps its interval."""


class CommandError(LogbufError):
    """A command the driver rejects: sent back to the client as ON_ERROR."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


EndpointKey = tuple[str, object]
"""A UDP endpoint as a client's registrations hold it: ("send", canonical channel) or ("receive", address)."""


@dataclass
class ClientSession:
    client_id: int
    last_keepalive_ns: int
    heartbeat_counter_id: int
    publication_links: dict[int, IpcPublication] = field(default_factory=dict)
    subscription_ids: set[int] = field(default_factory=set)
    endpoints: dict[EndpointKey, int] = field(default_factory=dict)
    """The UDP endpoints its registrations use, each with how many of them do (``max_client_endpoints``)."""

    @property
    def registrations(self) -> int:
        return len(self.publication_links) + len(self.subscription_ids)

    def hold_endpoint(self, key: EndpointKey) -> None:
        self.endpoints[key] = self.endpoints.get(key, 0) + 1

    def release_endpoint(self, key: EndpointKey) -> None:
        left = self.endpoints.get(key, 0) - 1
        if left > 0:
            self.endpoints[key] = left
        else:
            self.endpoints.pop(key, None)


@dataclass
class SubscriptionLink:
    registration_id: int
    client_id: int
    stream_id: int
    channel: str
    canonical: str
    spy: bool = False
    endpoint_key: Address | None = None  # udp (not spy): the receive endpoint it uses


@dataclass
class ReceiveChannel:
    """The conductor's side of a receive endpoint (the receiver has the endpoint's dispatch state):
    the subscriptions to each stream, their image settings, and the images it created there."""

    endpoint: ReceiveChannelEndpoint
    subscriptions: dict[int, int] = field(default_factory=dict)  # stream id -> how many
    image_settings: dict[int, ImageSettings] = field(default_factory=dict)  # stream id -> its subscriptions'
    images: dict[tuple[int, int], PublicationImage] = field(default_factory=dict)  # (session, stream) -> image


class Subscribable(Protocol):
    """What subscribers link to: an IPC or network publication (spies), or a publication image."""

    @property
    def registration_id(self) -> int: ...
    @property
    def session_id(self) -> int: ...
    @property
    def stream_id(self) -> int: ...
    @property
    def channel(self) -> str: ...
    @property
    def log_file_name(self) -> str: ...
    @property
    def source_identity(self) -> str: ...
    @property
    def subscribers(self) -> dict[int, SubscriberPosition]: ...

    def add_subscriber(self, subscription_registration_id: int, client_id: int, channel: str) -> SubscriberPosition: ...

    def remove_subscriber(self, subscription_registration_id: int) -> SubscriberPosition | None: ...


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


@dataclass(frozen=True)
class _SendPlan:
    """How a network publication's endpoint sends: to ``destination`` (unicast or a multicast group) or to
    the ``destinations`` of an MDC tracker, from a socket bound to ``bind``."""

    destination: Address | None
    bind: Address
    multicast: MulticastSettings | None
    destinations: DestinationTracker | None
    group: bool
    """Multicast or MDC: flow control defaults to max and counts receivers."""


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
        self.loss_report = loss_report
        """Where images report loss (``loss-report.dat``); None: not reported."""
        self.to_driver = to_driver
        self._to_driver_unblocker = RingBufferUnblocker(to_driver, ctx.command_unblock_timeout_ns)
        self.to_clients = to_clients
        self.counters = counters
        self.system_counters = system_counters
        self.error_log = error_log
        self.sender = sender
        self.receiver = receiver
        self.clock_ns = ctx.clock_ns
        self.epoch_ms = ctx.epoch_clock_ms
        self.on_terminate = on_terminate
        self.clients: dict[int, ClientSession] = {}
        self.publications: list[IpcPublication] = []
        self.subscriptions: dict[int, SubscriptionLink] = {}
        # By stream id, so that adding a stream costs the same with 10 or 10,000 others.
        self._publications_by_stream: dict[int, list[IpcPublication]] = {}
        self._subscriptions_by_stream: dict[int, dict[int, SubscriptionLink]] = {}
        self._images_changed = False
        self._next_session_id = random.randint(RESERVED_SESSION_ID_HIGH + 1, 1 << 30)
        self._next_timer_ns = 0
        self._publications_dir = os.path.join(ctx.dir, "publications")
        self._images_dir = os.path.join(ctx.dir, "images")
        self.send_endpoints: dict[str, SendChannelEndpoint] = {}
        self.receive_endpoints: dict[Address, ReceiveChannel] = {}
        self.images: list[PublicationImage] = []
        self._proxy = DriverConductorProxy(self)  # what the receive endpoints it opens call back
        self._fault_seed = ctx.udp_fault_seed
        self._log = structlog.get_logger().bind(role=self.role_name)
        self._handlers: dict[int, Callable[[memoryview], None]] = {
            cmd.ADD_PUBLICATION: lambda b: self._on_add_publication(b, exclusive=False),
            cmd.ADD_EXCLUSIVE_PUBLICATION: lambda b: self._on_add_publication(b, exclusive=True),
            cmd.REMOVE_PUBLICATION: self._on_remove_publication,
            cmd.ADD_SUBSCRIPTION: self._on_add_subscription,
            cmd.REMOVE_SUBSCRIPTION: self._on_remove_subscription,
            cmd.CLIENT_KEEPALIVE: self._on_client_keepalive,
            cmd.ADD_DESTINATION: lambda b: self._on_destination(b, add=True),
            cmd.REMOVE_DESTINATION: lambda b: self._on_destination(b, add=False),
            cmd.CLIENT_CLOSE: self._on_client_close,
            cmd.TERMINATE_DRIVER: self._on_terminate_driver,
        }

    # -- agent ------------------------------------------------------------------------------------------
    def on_start(self) -> None:
        for directory in (self._publications_dir, self._images_dir):
            os.makedirs(directory, mode=self.ctx.dir_mode, exist_ok=True)
            os.chmod(directory, self.ctx.dir_mode)  # makedirs' mode goes through the umask
        self._heartbeat()

    def do_work(self) -> int:
        work = self.to_driver.read(self._on_command, 64)
        for index, publication in enumerate(self.publications):  # commands only append to the list
            work += publication.update_publisher_limit()
            if index % COMMANDS_EVERY_PUBLICATIONS == COMMANDS_EVERY_PUBLICATIONS - 1:
                work += self.to_driver.read(self._on_command, 64)
        now_ns = self.clock_ns()
        if now_ns >= self._next_timer_ns:
            self._next_timer_ns = now_ns + self.ctx.timer_interval
            work += self._on_timer(now_ns)  # counts only what changed: a heartbeat alone is no work
        return work

    def on_close(self) -> None:
        for publication in self.publications:
            publication.close()
        self.publications.clear()
        for image in self.images:
            image.close()
        self.images.clear()

    # -- command dispatch --------------------------------------------------------------------------------
    def _on_command(self, msg_type_id: int, buffer: memoryview) -> None:
        self.system_counters.increment(SystemCounterId.COMMANDS_RECEIVED)
        correlation_id = 0
        client_id = 0
        try:
            if len(buffer) >= cmd.CORRELATED_LENGTH:
                client_id, correlation_id = cmd.CORRELATED.unpack_from(buffer, 0)
            handler = self._handlers.get(msg_type_id)
            if handler is None:
                raise CommandError(ErrorCode.UNKNOWN_COMMAND_TYPE_ID, f"unknown command type id 0x{msg_type_id:x}")
            handler(buffer)
        except CommandError as e:
            self._on_error(correlation_id, e.code, str(e), e)
        except MalformedCommandError as e:
            self._on_error(correlation_id, ErrorCode.MALFORMED_COMMAND, str(e), e)
        except InvalidChannelError as e:
            self._on_error(correlation_id, ErrorCode.INVALID_CHANNEL, str(e), e)
        except Exception as e:  # never let one command take the driver down
            self._on_error(correlation_id, ErrorCode.GENERIC_ERROR, f"{type(e).__name__}: {e}", e)

    def _on_error(self, correlation_id: int, code: ErrorCode, message: str, error: BaseException) -> None:
        self.system_counters.increment(SystemCounterId.ERRORS)
        self.error_log.record(f"{code.name}: {message}")
        self._transmit(cmd.ON_ERROR, cmd.ErrorResponse(correlation_id, int(code), message).encode())

    def _transmit(self, msg_type_id: int, payload: bytes) -> None:
        self.to_clients.transmit(msg_type_id, payload)

    def _client(self, client_id: int) -> ClientSession:
        """The client's session, created (with its heartbeat counter) on its first command."""
        session = self.clients.get(client_id)
        now_ns = self.clock_ns()
        if session is None:
            counter_id = self.counters.allocate(
                f"client-heartbeat: id={client_id}",
                cd.CLIENT_HEARTBEAT_TYPE_ID,
                client_id.to_bytes(8, "little", signed=True),  # Aeron clients find their counter by this key
                registration_id=client_id,
                owner_id=client_id,
                initial_value=self.epoch_ms(),
            )
            session = self.clients[client_id] = ClientSession(client_id, now_ns, counter_id)
            self.system_counters.set(SystemCounterId.ACTIVE_CLIENTS, len(self.clients))
            self._log.info("client.connected", client_id=client_id)
        session.last_keepalive_ns = now_ns
        self.counters.set_value(session.heartbeat_counter_id, self.epoch_ms())
        return session

    # -- channels -----------------------------------------------------------------------------------------
    @staticmethod
    def _parse_channel(channel: str, *, spy_allowed: bool = False) -> ChannelUri:
        uri = ChannelUri.parse(channel)
        if uri.prefix and not (spy_allowed and uri.media == "udp"):
            raise CommandError(
                ErrorCode.INVALID_CHANNEL,
                f"channel prefix {uri.prefix!r} is only for subscriptions to udp channels: {channel}",
            )
        if uri.media == "udp":
            mode = uri.control_mode()
            if mode == "response":
                raise CommandError(ErrorCode.NOT_SUPPORTED, f"control-mode=response is not supported yet: {channel}")
            if uri.endpoint() is None and uri.control() is None and mode != "manual":
                raise CommandError(ErrorCode.INVALID_CHANNEL, f"udp channel needs endpoint=host:port: {channel}")
        return uri

    def _socket_settings(self, uri: ChannelUri) -> SocketSettings:
        rcvbuf, sndbuf = uri.socket_buffer_lengths()
        return SocketSettings(
            rcvbuf or self.ctx.socket_buffer_length, sndbuf or self.ctx.socket_buffer_length, self.ctx.udp_gso
        )

    @staticmethod
    def _interface_bind(uri: ChannelUri) -> Address:
        """Where a publication's socket binds: ``interface=host[:port][/prefix]``, else any address."""
        interface = uri.interface_address()
        if interface is None:
            return "0.0.0.0", 0
        host, port, prefix = interface
        try:
            return resolve_interface(host, prefix), port
        except OSError as e:
            raise CommandError(
                ErrorCode.INVALID_CHANNEL,
                f"channel parameter interface={uri.interface()!r}: {e}: {uri.original or uri}",
            ) from None

    @staticmethod
    def _resolve(uri: ChannelUri, key: str = "endpoint") -> Address:
        """``endpoint=`` (or ``control=``) resolved; a multicast data address must have an odd last octet
        (its control address is the next one), as Aeron requires."""
        endpoint = uri.endpoint() if key == "endpoint" else uri.control()
        assert endpoint is not None
        host, port = endpoint
        try:
            address = socket.gethostbyname(host)
        except OSError as e:
            raise CommandError(ErrorCode.UNKNOWN_HOST, f"cannot resolve {key} host {host!r}: {e}") from None
        if is_multicast(address):
            if key != "endpoint":
                raise CommandError(
                    ErrorCode.INVALID_CHANNEL, f"control={address}:{port} must not be a multicast address: {uri}"
                )
            if not int(address.split(".")[-1]) & 1:
                raise CommandError(
                    ErrorCode.INVALID_CHANNEL,
                    f"multicast data address {address} must have an odd last octet "
                    f"(the control address is {address[: address.rfind('.')]}.{int(address.split('.')[-1]) + 1}): "
                    f"{uri}",
                )
        return address, port

    def _multicast_settings(self, uri: ChannelUri) -> MulticastSettings:
        interface = uri.interface_address()
        return MulticastSettings(None if interface is None else self._interface_bind(uri)[0], uri.ttl())

    def _faults(self) -> FaultInjector | None:
        ctx = self.ctx
        if not (ctx.udp_drop_rate or ctx.udp_duplicate_rate or ctx.udp_reorder_rate):
            return None
        self._fault_seed += 1
        return FaultInjector(ctx.udp_drop_rate, ctx.udp_duplicate_rate, ctx.udp_reorder_rate, self._fault_seed)

    @staticmethod
    def _check_stream_id(stream_id: int) -> None:
        if not -(1 << 31) <= stream_id < (1 << 31):
            raise CommandError(ErrorCode.MALFORMED_COMMAND, f"stream_id={stream_id} is not a 32-bit integer")

    def _allocate_session_id(self) -> int:
        session_id = self._next_session_id
        self._next_session_id += 1
        if self._next_session_id >= (1 << 31) - 1:
            self._next_session_id = RESERVED_SESSION_ID_HIGH + 1
        return session_id

    # -- publications ----------------------------------------------------------------------------------
    def _on_add_publication(self, buffer: memoryview, *, exclusive: bool) -> None:
        command = cmd.PublicationCommand.decode(buffer)
        session = self._client(command.client_id)
        uri = self._parse_channel(command.channel)
        self._check_stream_id(command.stream_id)
        canonical = uri.canonical_form()
        endpoint_key: EndpointKey | None = ("send", canonical) if uri.media == "udp" else None
        self._check_client_limits(session, endpoint_key)
        publication = None
        if not exclusive and uri.session_id() is None:
            for candidate in self._publications_by_stream.get(command.stream_id, ()):
                if (
                    not candidate.exclusive
                    and candidate.state is PublicationState.ACTIVE
                    and candidate.stream_id == command.stream_id
                    and candidate.channel == canonical
                ):
                    publication = candidate
                    publication.ref_count += 1
                    break
        if publication is None:
            owned = (6 if endpoint_key is not None else 2) + sum(  # pub-pos, pub-lmt (snd-pos, -lmt, -bpe, -naks)
                1  # and the sub-pos counters of this client's own subscriptions that link to it
                for link in self._subscriptions_by_stream.get(command.stream_id, {}).values()
                if link.client_id == session.client_id
            )
            self._check_client_counters(session, owned, "a publication")
            publication = self._new_publication(
                command.correlation_id, command.stream_id, uri, exclusive, client_id=command.client_id
            )
        session.publication_links[command.correlation_id] = publication
        if endpoint_key is not None:
            session.hold_endpoint(endpoint_key)
        ready = cmd.PublicationReady(
            command.correlation_id,
            publication.registration_id,
            publication.session_id,
            publication.stream_id,
            publication.publisher_limit_id,
            -1,
            publication.log_file_name,
        )
        self._transmit(cmd.ON_EXCLUSIVE_PUBLICATION_READY if exclusive else cmd.ON_PUBLICATION_READY, ready.encode())

    def _new_publication(
        self, registration_id: int, stream_id: int, uri: ChannelUri, exclusive: bool, *, client_id: int = 0
    ) -> IpcPublication:
        network = uri.media == "udp"
        plan = self._send_plan(uri) if network else None
        try:
            fc_spec = parse_flow_control(
                uri.get("fc"),
                group=plan is not None and plan.group,
                default_timeout_ns=self.ctx.flow_control_receiver_timeout,
            )
        except InvalidChannelError as e:
            raise CommandError(ErrorCode.INVALID_CHANNEL, f"{e}: {uri.original}") from None
        term_length = uri.term_length() or (self.ctx.term_length if network else self.ctx.ipc_term_length)
        mtu = uri.mtu() or self.ctx.mtu
        session_id = uri.session_id()
        if session_id is None:
            session_id = self._allocate_session_id()
        initial = uri.initial_position()
        initial_term_id = initial[0] if initial else random.randint(-(1 << 31), (1 << 31) - 1)
        linger = uri.linger_ns() or self.ctx.publication_linger_timeout
        canonical = uri.canonical_form()
        path = os.path.join(self._publications_dir, f"{registration_id}.logbuffer")
        self._check_counters(
            (6 if network else 2) + len(self._subscriptions_by_stream.get(stream_id, ())), f"publication {path}"
        )
        try:
            log = LogBuffers.create_file(
                path,
                mode=self.ctx.file_mode,
                term_length=term_length,
                mtu_length=mtu,
                session_id=session_id,
                stream_id=stream_id,
                initial_term_id=initial_term_id,
                correlation_id=registration_id,
                term_window_length=min(self.ctx.ipc_term_window_length or term_length // 2, term_length // 2),
            )
        except OSError as e:
            raise CommandError(ErrorCode.STORAGE_SPACE, f"cannot create log {path}: {e}") from e
        if initial:
            log.seek_to(initial[1], initial[2])
        # Aeron's stream counters: its order, labels (with the channel as the client gave it) and keys
        label = cd.stream_label("{}", registration_id, session_id, stream_id, uri.original or canonical)
        key = cd.stream_key(registration_id, session_id, stream_id, uri.original or canonical)
        start = log.tail_position()
        pos_id = self.counters.allocate(
            label.format(cd.PUBLISHER_POSITION_EXCLUSIVE_NAME if exclusive else cd.PUBLISHER_POSITION_CONCURRENT_NAME),
            cd.PUBLISHER_POSITION_TYPE_ID,
            key,
            registration_id=registration_id,
            owner_id=client_id,
            initial_value=start,
        )
        limit_id = self.counters.allocate(
            label.format("pub-lmt"),
            cd.PUBLISHER_LIMIT_TYPE_ID,
            key,
            registration_id=registration_id,
            owner_id=client_id,
            initial_value=start,
        )
        common = _PublicationFields(
            registration_id=registration_id,
            session_id=session_id,
            stream_id=stream_id,
            channel=canonical,
            exclusive=exclusive,
            log=log,
            log_file_name=path,
            publisher_limit_id=limit_id,
            publisher_limit=self.counters.position(limit_id),
            publisher_position_id=pos_id,
            counters=self.counters,
            linger_timeout_ns=linger,
            clean_position=start,
            unblock_timeout_ns=self.ctx.publication_unblock_timeout,
        )
        publication: IpcPublication
        if plan is not None:
            snd_pos = self.counters.allocate(
                label.format("snd-pos"),
                cd.SENDER_POSITION_TYPE_ID,
                key,
                registration_id=registration_id,
                owner_id=client_id,
                initial_value=start,
            )
            snd_lmt = self.counters.allocate(
                label.format("snd-lmt"),
                cd.SENDER_LIMIT_TYPE_ID,
                key,
                registration_id=registration_id,
                owner_id=client_id,
                initial_value=start,
            )
            snd_bpe, snd_naks = (
                self.counters.allocate(
                    label.format(cd.LABEL_PREFIXES[type_id]),
                    type_id,
                    key,
                    registration_id=registration_id,
                    owner_id=client_id,
                )
                for type_id in (cd.SENDER_BPE_TYPE_ID, cd.SENDER_NAKS_RECEIVED_TYPE_ID)
            )
            network_publication = NetworkPublication(
                **common,
                sender_position_id=snd_pos,
                sender_limit_id=snd_lmt,
                sender_bpe_id=snd_bpe,
                naks_received_id=snd_naks,
                sender_position=self.counters.position(snd_pos),
                system_counters=self.system_counters,
                mtu_length=mtu,
                connection_timeout_ns=self.ctx.publication_connection_timeout,
                sender_limit=start,
                flow_control=new_flow_control(fc_spec),
                setup_flags=GROUP_FLAG if plan.group else 0,
                setup_ttl=(uri.ttl() or 0) if plan.multicast is not None else 0,
                retransmit_handler=RetransmitHandler(
                    self.ctx.retransmit_linger, self.ctx.max_retransmits, self.ctx.retransmit_max_rate
                ),
            )
            if plan.group:
                network_publication.receivers_counter_id = self.counters.allocate(
                    label.format("fc-receivers"),
                    cd.FLOW_CONTROL_RECEIVERS_TYPE_ID,
                    key,
                    registration_id=registration_id,
                )
            if plan.destinations is not None:
                network_publication.mdc_destinations_counter_id = self.counters.allocate(
                    label.format("mdc-num-dest"),
                    cd.MDC_DESTINATIONS_TYPE_ID,
                    key,
                    registration_id=registration_id,
                )
            endpoint = self.send_endpoints.get(canonical)
            if endpoint is None:
                try:
                    transport = (
                        self.ctx.udp_transport(
                            plan.bind,
                            sockets=self._socket_settings(uri),
                            faults=self._faults(),
                            system_counters=self.system_counters,
                            multicast=plan.multicast,
                        )
                        if plan.multicast is not None
                        else self.ctx.udp_transport(
                            plan.bind,
                            sockets=self._socket_settings(uri),
                            faults=self._faults(),
                            system_counters=self.system_counters,
                        )
                    )
                except OSError as e:
                    network_publication.close()
                    raise CommandError(
                        ErrorCode.CHANNEL_ENDPOINT_ERROR, f"cannot open a socket for {canonical}: {e}"
                    ) from e
                endpoint = SendChannelEndpoint(
                    canonical, plan.destination, transport, self.system_counters, self.clock_ns, plan.destinations
                )
                self.send_endpoints[canonical] = endpoint
                self.sender.register_send_channel_endpoint(endpoint)
            if endpoint.destinations is not None:
                network_publication.set_destination_count(len(endpoint.destinations.destinations))
            self.sender.new_network_publication(endpoint, network_publication)
            publication = network_publication
        else:
            publication = IpcPublication(**common)
        self.publications.append(publication)
        self._publications_by_stream.setdefault(stream_id, []).append(publication)
        self.system_counters.set(SystemCounterId.ACTIVE_PUBLICATIONS, len(self.publications))
        self._log.info(
            "publication.added",
            registration_id=registration_id,
            session_id=session_id,
            stream_id=stream_id,
            channel=canonical,
            exclusive=exclusive,
            term_length=term_length,
        )
        for link in self._subscriptions_by_stream.get(stream_id, {}).values():
            if link.stream_id == stream_id and link.canonical == canonical and link.spy == network:
                self._link_subscriber(publication, link)
        return publication

    def _send_plan(self, uri: ChannelUri) -> _SendPlan:
        """Where a publication's socket binds and where it sends: unicast, multicast or MDC."""
        mode = uri.control_mode()
        if uri.control() is not None or mode == "manual":
            bind = self._resolve(uri, "control") if uri.control() is not None else self._interface_bind(uri)
            return _SendPlan(
                None,
                bind,
                None,
                DestinationTracker(
                    manual=mode == "manual",
                    timeout_ns=self.ctx.mdc_destination_timeout,
                    allowed=AllowedSources.parse(self.ctx.mdc_dynamic_allow),
                ),
                True,
            )
        destination = self._resolve(uri)
        if is_multicast(destination[0]):
            return _SendPlan(
                destination, multicast_control_address(destination), self._multicast_settings(uri), None, True
            )
        return _SendPlan(destination, self._interface_bind(uri), None, None, False)

    def _on_destination(self, buffer: memoryview, *, add: bool) -> None:
        """ADD_DESTINATION / REMOVE_DESTINATION for a manual MDC publication of this client."""
        command = cmd.DestinationCommand.decode(buffer)
        session = self._client(command.client_id)
        publication = session.publication_links.get(command.registration_id)
        if publication is None:
            raise CommandError(
                ErrorCode.UNKNOWN_PUBLICATION, f"unknown publication registration_id={command.registration_id}"
            )
        endpoint = self.send_endpoints.get(publication.channel) if isinstance(publication, NetworkPublication) else None
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
        address = self._resolve(uri)
        tracker = endpoint.destinations
        if add:
            if not tracker.add(address, command.channel, self.clock_ns()) and address not in tracker.addresses:
                raise CommandError(
                    ErrorCode.RESOURCE_TEMPORARILY_UNAVAILABLE,
                    f"publication registration_id={publication.registration_id} already has "
                    f"{len(tracker.destinations)} destinations, the most one endpoint sends to: {command.channel}",
                )
        elif not tracker.remove(address):
            raise CommandError(ErrorCode.UNKNOWN_PUBLICATION, f"unknown destination {command.channel}")
        endpoint.on_idle(self.clock_ns())  # mdc-num-dest now
        self._log.info(
            "destination.added" if add else "destination.removed",
            registration_id=publication.registration_id,
            destination=f"{address[0]}:{address[1]}",
        )
        self._transmit(cmd.ON_OPERATION_SUCCESS, cmd.OperationSuccess(command.correlation_id).encode())

    def _on_remove_publication(self, buffer: memoryview) -> None:
        command = cmd.RemoveCommand.decode(buffer)
        session = self._client(command.client_id)
        publication = session.publication_links.pop(command.registration_id, None)
        if publication is None:
            raise CommandError(
                ErrorCode.UNKNOWN_PUBLICATION, f"unknown publication registration_id={command.registration_id}"
            )
        if isinstance(publication, NetworkPublication):
            session.release_endpoint(("send", publication.channel))
        publication.decrement_ref(self.clock_ns())
        self._transmit(cmd.ON_OPERATION_SUCCESS, cmd.OperationSuccess(command.correlation_id).encode())

    # -- subscriptions ----------------------------------------------------------------------------------
    def _on_add_subscription(self, buffer: memoryview) -> None:
        command = cmd.SubscriptionCommand.decode(buffer)
        session = self._client(command.client_id)
        uri = self._parse_channel(command.channel, spy_allowed=True)
        self._check_stream_id(command.stream_id)
        spy = bool(uri.prefix)
        link = SubscriptionLink(
            command.correlation_id, command.client_id, command.stream_id, command.channel, uri.canonical_form(), spy
        )
        links = len(self._publications_by_stream.get(link.stream_id, ()))  # at most one sub-pos counter each
        self._check_counters(links, f"subscription {link.channel}")
        udp = uri.media == "udp" and not spy
        if udp and uri.endpoint() is None:
            raise CommandError(
                ErrorCode.INVALID_CHANNEL, f"a udp subscription needs endpoint=host:port: {command.channel}"
            )
        address = self._resolve(uri) if udp else None
        self._check_client_limits(session, None if address is None else ("receive", address))
        self._check_client_counters(session, links, "a subscription")
        if address is not None:
            multicast = is_multicast(address[0])
            control: Address | None = None
            if multicast:
                control = multicast_control_address(address)
            elif uri.control() is not None:
                control = self._resolve(uri, "control")
            receive_channel = self.receive_endpoints.get(address)
            if receive_channel is None:
                try:
                    transport = (
                        self.ctx.udp_transport(
                            address,
                            sockets=self._socket_settings(uri),
                            faults=self._faults(),
                            system_counters=self.system_counters,
                            multicast=self._multicast_settings(uri),
                        )
                        if multicast
                        else self.ctx.udp_transport(
                            address,
                            sockets=self._socket_settings(uri),
                            faults=self._faults(),
                            system_counters=self.system_counters,
                        )
                    )
                except OSError as e:
                    raise CommandError(
                        ErrorCode.CHANNEL_ENDPOINT_ERROR,
                        f"cannot bind {address[0]}:{address[1]} for {command.channel}: {e}",
                    ) from e
                endpoint = ReceiveChannelEndpoint(
                    link.canonical,
                    transport,
                    self.system_counters,
                    self.clock_ns,
                    self._proxy,
                    control_address=control,
                    elicit_periodically=control is not None and not multicast,
                    multicast=multicast,
                )
                receive_channel = self.receive_endpoints[address] = ReceiveChannel(endpoint)
                self.receiver.register_receive_channel_endpoint(endpoint)
            settings = ImageSettings(uri.reliable(), uri.receiver_window_length(), uri.nak_delay_ns(), uri.group_tag())
            existing = receive_channel.image_settings.setdefault(link.stream_id, settings)
            if existing != settings:
                raise CommandError(
                    ErrorCode.INVALID_CHANNEL,
                    f"{settings} conflicts with {existing} of an existing subscription to stream "
                    f"{link.stream_id}: {command.channel}",
                )
            count = receive_channel.subscriptions.get(link.stream_id, 0)
            receive_channel.subscriptions[link.stream_id] = count + 1
            if count == 0:
                self.receiver.add_subscription(receive_channel.endpoint, link.stream_id)
            link.endpoint_key = address
            session.hold_endpoint(("receive", address))
        self.subscriptions[link.registration_id] = link
        self._subscriptions_by_stream.setdefault(link.stream_id, {})[link.registration_id] = link
        session.subscription_ids.add(link.registration_id)
        self._transmit(cmd.ON_SUBSCRIPTION_READY, cmd.SubscriptionReady(command.correlation_id, -1).encode())
        self._log.info(
            "subscription.added",
            registration_id=link.registration_id,
            stream_id=link.stream_id,
            channel=link.channel,
            client_id=link.client_id,
        )
        if link.endpoint_key is not None:
            for image in self.images:
                if (
                    image.state is ImageState.ACTIVE
                    and image.stream_id == link.stream_id
                    and image.channel == link.canonical
                ):
                    self._link_subscriber(image, link)
            return
        for publication in self._publications_by_stream.get(link.stream_id, ()):
            if (
                publication.state is PublicationState.ACTIVE
                and publication.stream_id == link.stream_id
                and publication.channel == link.canonical
                and isinstance(publication, NetworkPublication) == link.spy
            ):
                self._link_subscriber(publication, link)

    # -- images --------------------------------------------------------------------------------------------
    def on_create_publication_image(self, endpoint: ReceiveChannelEndpoint, setup: SetupFrame, source: Address) -> None:
        """A SETUP for a subscribed stream without an active image (from a receive endpoint, through the
        conductor proxy): create the image, hand it to the receiver, link subscribers.

        What a remote peer can make the driver allocate is bounded: a SETUP asking for a term longer
        than ``max_image_term_length``, or arriving while the endpoint holds ``max_images_per_endpoint``
        images, is counted ("Images rejected") and dropped before anything is made. A creation that
        fails half-way leaves nothing behind: the log file is removed and its counters freed."""
        receive_channel = self._receive_channel_of(endpoint)
        if receive_channel is None:
            return  # the endpoint was closed since (a queued request)
        key = (setup.session_id, setup.stream_id)
        others = len(receive_channel.images) - (key in receive_channel.images)
        if setup.term_length > self.ctx.max_image_term_length or others >= self.ctx.max_images_per_endpoint:
            self.system_counters.increment(SystemCounterId.IMAGES_REJECTED)
            return  # remote input: counted, not logged per SETUP
        if not self.counters.has_room(3 + len(self._subscriptions_by_stream.get(setup.stream_id, ()))):
            self.system_counters.increment(SystemCounterId.IMAGES_REJECTED)
            self.system_counters.increment(SystemCounterId.ERRORS)
            self.error_log.record(
                f"image for stream {setup.stream_id} on {endpoint.channel} rejected: the counters are full"
                f" (capacity {self.counters.capacity})"
            )  # one distinct error however many SETUPs: the text names no session or source
            return
        registration_id = self.to_driver.next_correlation_id()
        path = os.path.join(self._images_dir, f"{registration_id}.logbuffer")
        try:
            log = LogBuffers.create_file(
                path,
                mode=self.ctx.file_mode,
                term_length=setup.term_length,
                mtu_length=setup.mtu_length,
                session_id=setup.session_id,
                stream_id=setup.stream_id,
                initial_term_id=setup.initial_term_id,
                correlation_id=registration_id,
            )
        except (OSError, ValueError, LogbufError) as e:  # e.g. ShmError: the file exists
            self.system_counters.increment(SystemCounterId.IMAGES_REJECTED)
            self.system_counters.increment(SystemCounterId.ERRORS)
            self.error_log.record(f"image for stream {setup.stream_id} on {endpoint.channel} rejected: {e}")
            return
        allocated: list[int] = []
        try:
            image = self._new_image(receive_channel, endpoint, setup, source, registration_id, path, log, allocated)
        except BaseException:
            for counter_id in allocated:
                self.counters.free(counter_id)
            log.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        old = receive_channel.images.get(key)
        if old is not None:
            self._retire_image(old)
        receive_channel.images[key] = image
        self.images.append(image)
        self.receiver.new_publication_image(endpoint, image)
        self._log.info(
            "image.created",
            registration_id=registration_id,
            session_id=setup.session_id,
            stream_id=setup.stream_id,
            source=image.source_identity,
            join_position=image.join_position,
        )
        for link in self._subscriptions_by_stream.get(setup.stream_id, {}).values():
            if (
                link.endpoint_key is not None
                and link.stream_id == setup.stream_id
                and link.canonical == endpoint.channel
            ):
                self._link_subscriber(image, link)

    def _new_image(
        self,
        receive_channel: ReceiveChannel,
        endpoint: ReceiveChannelEndpoint,
        setup: SetupFrame,
        source: Address,
        registration_id: int,
        path: str,
        log: LogBuffers,
        allocated: list[int],
    ) -> PublicationImage:
        """The image over a new log, its rcv-hwm, rcv-pos and rcv-naks-sent counters appended to ``allocated`` as they
        are made (the caller frees them if this raises)."""
        log.seek_to(setup.active_term_id, setup.term_offset)
        join = log.tail_position()
        # Aeron labels an image's counters with the channel its (first) subscription gave, owned by that client
        first = next(
            (
                link
                for link in self._subscriptions_by_stream.get(setup.stream_id, {}).values()
                if link.endpoint_key is not None and link.canonical == endpoint.channel
            ),
            None,
        )
        original = first.channel if first is not None else endpoint.channel
        owner_id = first.client_id if first is not None else 0
        label = cd.stream_label("{}", registration_id, setup.session_id, setup.stream_id, original)
        key = cd.stream_key(registration_id, setup.session_id, setup.stream_id, original)
        for name, type_id, initial in (
            ("rcv-hwm", cd.RECEIVER_HWM_TYPE_ID, join),
            ("rcv-pos", cd.RECEIVER_POSITION_TYPE_ID, join),
            ("rcv-naks-sent", cd.RECEIVER_NAKS_SENT_TYPE_ID, 0),
        ):
            allocated.append(
                self.counters.allocate(
                    label.format(name),
                    type_id,
                    key,
                    registration_id=registration_id,
                    owner_id=owner_id,
                    initial_value=initial,
                )
            )
        settings = receive_channel.image_settings.get(setup.stream_id, ImageSettings())
        return PublicationImage(
            registration_id=registration_id,
            session_id=setup.session_id,
            stream_id=setup.stream_id,
            channel=endpoint.channel,
            source_identity=f"{source[0]}:{source[1]}",
            source_address=source,
            log=log,
            log_file_name=path,
            counters=self.counters,
            system_counters=self.system_counters,
            hwm_id=allocated[0],
            rebuild_id=allocated[1],
            receiver_id=endpoint.receiver_id,
            join_position=join,
            window_length=min(settings.window_length or self.ctx.initial_window_length, setup.term_length // 2),
            liveness_timeout_ns=self.ctx.image_liveness_timeout,
            nak_delay_ns=self.ctx.nak_delay if settings.nak_delay_ns is None else settings.nak_delay_ns,
            nak_retry_ns=self.ctx.nak_retry_delay,
            sm_interval_ns=self.ctx.status_message_timeout,
            now_ns=self.clock_ns(),
            reliable=settings.reliable,
            nak_delay_generator=(
                OptimalMulticastDelayGenerator(
                    settings.nak_delay_ns or self.ctx.nak_multicast_max_backoff, self.ctx.nak_multicast_group_size
                )
                if endpoint.multicast
                else None
            ),
            group_tag=settings.group_tag,
            loss_report=self.loss_report,
            original_channel=original,
            naks_sent_id=allocated[2],
        )

    def _receive_channel_of(self, endpoint: ReceiveChannelEndpoint) -> ReceiveChannel | None:
        for receive_channel in self.receive_endpoints.values():
            if receive_channel.endpoint is endpoint:
                return receive_channel
        return None

    def _retire_image(self, image: PublicationImage) -> None:
        for subscription_id in list(image.subscribers):
            self._unlink_subscriber(image, subscription_id)
        key = (image.session_id, image.stream_id)
        for receive_channel in self.receive_endpoints.values():
            if receive_channel.images.get(key) is image:
                del receive_channel.images[key]
                self.receiver.remove_publication_image(receive_channel.endpoint, image)
        image.transition(ImageState.DONE)
        image.close()
        if image in self.images:
            self.images.remove(image)
        self._count_images()
        self._log.info(
            "image.removed",
            registration_id=image.registration_id,
            session_id=image.session_id,
            stream_id=image.stream_id,
        )

    def _link_subscriber(self, publication: Subscribable, link: SubscriptionLink) -> None:
        sub = publication.add_subscriber(link.registration_id, link.client_id, link.channel)
        if isinstance(publication, IpcPublication):
            publication.update_publisher_limit()
        image = cmd.ImageReady(
            publication.registration_id,
            publication.session_id,
            publication.stream_id,
            link.registration_id,
            sub.counter_id,
            publication.log_file_name,
            publication.source_identity,
        )
        self._transmit(cmd.ON_AVAILABLE_IMAGE, image.encode())
        self._count_images()
        self._log.info(
            "image.available",
            registration_id=publication.registration_id,
            session_id=publication.session_id,
            stream_id=publication.stream_id,
            subscription_id=link.registration_id,
            join_position=sub.join_position,
        )

    def _unlink_subscriber(self, publication: Subscribable, subscription_id: int, notify: bool = True) -> None:
        sub = publication.remove_subscriber(subscription_id)
        if sub is not None and notify:
            link = self.subscriptions.get(subscription_id)
            message = cmd.ImageMessage(
                publication.registration_id,
                subscription_id,
                publication.stream_id,
                link.channel if link else publication.channel,
            )
            self._transmit(cmd.ON_UNAVAILABLE_IMAGE, message.encode())
            self._log.info(
                "image.unavailable",
                registration_id=publication.registration_id,
                session_id=publication.session_id,
                subscription_id=subscription_id,
            )
        self._count_images()

    def _count_images(self) -> None:
        self._images_changed = True  # counted on the timer: a sum over every stream is too dear per command

    def _check_counters(self, count: int, what: str) -> None:
        """Refuse a command that would run out of counters before it creates anything (nothing leaks)."""
        if not self.counters.has_room(count):
            raise CommandError(
                ErrorCode.GENERIC_ERROR,
                f"{what} needs {count} counters and the counters are full (capacity {self.counters.capacity};"
                f" counters_buffer_length={self.ctx.counters_buffer_length} sets it, 128 bytes per counter)",
            )

    def _check_client_limits(self, session: ClientSession, endpoint: EndpointKey | None) -> None:
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

    def _check_client_counters(self, session: ClientSession, count: int, what: str) -> None:
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

    def _on_remove_subscription(self, buffer: memoryview) -> None:
        command = cmd.RemoveCommand.decode(buffer)
        session = self._client(command.client_id)
        if command.registration_id not in session.subscription_ids:
            raise CommandError(
                ErrorCode.UNKNOWN_SUBSCRIPTION, f"unknown subscription registration_id={command.registration_id}"
            )
        self._remove_subscription(session, command.registration_id, notify=False)
        self._transmit(cmd.ON_OPERATION_SUCCESS, cmd.OperationSuccess(command.correlation_id).encode())

    def _remove_subscription(self, session: ClientSession, registration_id: int, *, notify: bool) -> None:
        session.subscription_ids.discard(registration_id)
        link = self.subscriptions.get(registration_id)
        for publication in self._publications_by_stream.get(link.stream_id, ()) if link else self.publications:
            if registration_id in publication.subscribers:
                self._unlink_subscriber(publication, registration_id, notify=notify)
        for image in self.images:
            if registration_id in image.subscribers:
                self._unlink_subscriber(image, registration_id, notify=notify)
        link = self.subscriptions.pop(registration_id, None)
        if link is not None and link.endpoint_key is not None:
            session.release_endpoint(("receive", link.endpoint_key))
        if link is not None:
            self._subscriptions_by_stream[link.stream_id].pop(registration_id, None)
            if not self._subscriptions_by_stream[link.stream_id]:
                del self._subscriptions_by_stream[link.stream_id]
        if link is not None and link.endpoint_key is not None:
            receive_channel = self.receive_endpoints[link.endpoint_key]
            receive_channel.subscriptions[link.stream_id] -= 1
            if receive_channel.subscriptions[link.stream_id] <= 0:
                del receive_channel.subscriptions[link.stream_id]
                del receive_channel.image_settings[link.stream_id]
                self.receiver.remove_subscription(receive_channel.endpoint, link.stream_id)
                for image in [i for i in receive_channel.images.values() if i.stream_id == link.stream_id]:
                    self._retire_image(image)
            if not receive_channel.subscriptions:
                del self.receive_endpoints[link.endpoint_key]
                self.receiver.close_receive_channel_endpoint(receive_channel.endpoint)
        self._log.info("subscription.removed", registration_id=registration_id, client_id=session.client_id)

    # -- clients ---------------------------------------------------------------------------------------
    def _on_client_keepalive(self, buffer: memoryview) -> None:
        command = cmd.CorrelatedCommand.decode(buffer)
        self._client(command.client_id)

    def _on_client_close(self, buffer: memoryview) -> None:
        command = cmd.CorrelatedCommand.decode(buffer)
        session = self.clients.get(command.client_id)
        if session is not None:
            if client_liveness_lock_held(cnc_path(self.ctx.dir), command.client_id):
                raise CommandError(
                    ErrorCode.GENERIC_ERROR,
                    f"CLIENT_CLOSE for client_id={command.client_id} refused: that client is still open"
                    " (it holds its liveness lock), so it did not send this",
                )
            self._remove_client(session, reason="closed")

    def _on_terminate_driver(self, buffer: memoryview) -> None:
        """Aeron's rule: denied unless a termination token is configured and the command carries it."""
        command = cmd.TerminateDriverCommand.decode(buffer)
        expected = self.ctx.termination_token.encode()
        allowed = bool(expected) and hmac.compare_digest(command.token, expected)
        self._log.info("driver.terminate_requested", client_id=command.client_id, allowed=allowed)
        if allowed and self.on_terminate is not None:
            self.on_terminate()

    def _remove_client(self, session: ClientSession, *, reason: str) -> None:
        now_ns = self.clock_ns()
        for publication in session.publication_links.values():
            publication.decrement_ref(now_ns)
        session.publication_links.clear()
        for registration_id in list(session.subscription_ids):
            self._remove_subscription(session, registration_id, notify=False)
        self.counters.free(session.heartbeat_counter_id)
        del self.clients[session.client_id]
        self.system_counters.set(SystemCounterId.ACTIVE_CLIENTS, len(self.clients))
        self._log.info("client.removed", client_id=session.client_id, reason=reason)

    def _remove_from_send_endpoint(self, publication: NetworkPublication) -> None:
        """Take the publication off its send endpoint; close the endpoint if it was the channel's last."""
        endpoint = self.send_endpoints.get(publication.channel)
        if endpoint is None:
            return
        self.sender.remove_network_publication(endpoint, publication)
        if not any(
            isinstance(p, NetworkPublication) and p.channel == publication.channel and p is not publication
            for p in self.publications
        ):
            del self.send_endpoints[publication.channel]
            self.sender.close_send_channel_endpoint(endpoint)

    # -- timers -----------------------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        self.to_driver.set_consumer_heartbeat_time(self.epoch_ms())

    def _on_timer(self, now_ns: int) -> int:
        work = 0
        self._heartbeat()
        if self._to_driver_unblocker.check(now_ns):
            self.system_counters.increment(SystemCounterId.UNBLOCKED_COMMANDS)
            self._log.warning("commands.unblocked", position=self._to_driver_unblocker.ring.consumer_position())
        timeouts = 0
        for session in list(self.clients.values()):
            if timeouts == MAX_CLIENT_TIMEOUTS_PER_TIMER:
                break
            # Aeron clients keep alive by writing epoch ms into their heartbeat counter, not by command
            heartbeat_age_ms = self.epoch_ms() - self.counters.value(session.heartbeat_counter_id)
            if heartbeat_age_ms * 1_000_000 < now_ns - session.last_keepalive_ns:
                session.last_keepalive_ns = now_ns - heartbeat_age_ms * 1_000_000
            if now_ns > session.last_keepalive_ns + self.ctx.client_liveness_timeout:
                self.system_counters.increment(SystemCounterId.CLIENT_TIMEOUTS)
                self._transmit(cmd.ON_CLIENT_TIMEOUT, cmd.ClientTimeout(session.client_id).encode())
                self._remove_client(session, reason="timeout")
                timeouts += 1
                work += 1
        for index, publication in enumerate(list(self.publications)):
            if index % COMMANDS_EVERY_PUBLICATIONS == COMMANDS_EVERY_PUBLICATIONS - 1:
                work += self.to_driver.read(self._on_command, 64)
            publication.sample_publisher_position()
            publication.on_time_event(now_ns)
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
            if publication.state is PublicationState.DONE:
                for subscription_id in list(publication.subscribers):
                    self._unlink_subscriber(publication, subscription_id)
                if isinstance(publication, NetworkPublication):
                    self._remove_from_send_endpoint(publication)
                publication.close()
                self.publications.remove(publication)
                self._publications_by_stream[publication.stream_id].remove(publication)
                if not self._publications_by_stream[publication.stream_id]:
                    del self._publications_by_stream[publication.stream_id]
                self.system_counters.set(SystemCounterId.ACTIVE_PUBLICATIONS, len(self.publications))
                self._log.info(
                    "publication.removed",
                    registration_id=publication.registration_id,
                    session_id=publication.session_id,
                    stream_id=publication.stream_id,
                )
                work += 1
        for image in list(self.images):
            image.on_time_event(now_ns)
            if image.state is ImageState.INACTIVE:
                self._retire_image(image)
                work += 1
        if self._images_changed:
            self._images_changed = False
            self.system_counters.set(
                SystemCounterId.ACTIVE_IMAGES,
                sum(len(p.subscribers) for p in self.publications) + sum(len(i.subscribers) for i in self.images),
            )
        return work
