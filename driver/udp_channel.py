"""A channel string resolved once: what the conductor needs to open, share and describe its endpoints.

After Aeron's ``UdpChannel``: a client's channel is parsed and checked, its host names resolved and
its parameters (socket buffers, interface, multicast group and TTL, MDC control mode, a
subscription's image settings) read, all in one place, into an immutable :class:`DriverChannel`.
The handlers then hold that object, not the string: following a channel from ADD_PUBLICATION to
the sender's endpoint is one trip through :func:`resolve_publication_channel`.

Every refusal is a :class:`~logbuf.driver.client_command_adapter.CommandError` naming the channel
and the parameter at fault (INVALID_CHANNEL, UNKNOWN_HOST or NOT_SUPPORTED), raised before anything
is created.
"""

from __future__ import annotations

import dataclasses
import random
import socket
from dataclasses import dataclass

from logbuf.channel_uri import ChannelUri, InvalidChannelError
from logbuf.driver.client_command_adapter import CommandError
from logbuf.driver.context import DriverContext
from logbuf.driver.destination_tracker import AllowedSources, DestinationTracker
from logbuf.driver.sender_flow_control import FlowControlSpec, parse_flow_control
from logbuf.driver.udp import (
    Address,
    ImageSettings,
    MulticastSettings,
    SocketSettings,
    is_multicast,
    multicast_control_address,
    resolve_interface,
)
from logbuf.errors import ErrorCode

__all__ = [
    "DriverChannel",
    "PublicationParams",
    "SendPlan",
    "parse_channel",
    "resolve_publication_channel",
    "resolve_subscription_channel",
]


@dataclass(frozen=True)
class SendPlan:
    """How a network publication's endpoint sends: to ``destination`` (unicast or a multicast group) or,
    MDC, to the destinations of a tracker (``mdc``; ``manual``: the client adds them), from a socket
    bound to ``bind``."""

    destination: Address | None
    bind: Address
    multicast: MulticastSettings | None
    mdc: bool
    manual: bool
    group: bool
    """Multicast or MDC: flow control defaults to max and counts receivers."""

    def destination_tracker(self, ctx: DriverContext) -> DestinationTracker | None:
        """A new tracker for the endpoint this plan opens (MDC), else None."""
        if not self.mdc:
            return None
        return DestinationTracker(
            manual=self.manual,
            timeout_ns=ctx.mdc_destination_timeout_ns,
            allowed=AllowedSources.parse(ctx.mdc_dynamic_allow),
        )


@dataclass(frozen=True)
class DriverChannel:
    """A client's channel, parsed, checked and resolved. ``canonical`` is what endpoints and streams are
    shared by; ``original`` is the text the client gave (labels and logs show it)."""

    uri: ChannelUri
    original: str
    canonical: str
    udp: bool
    """A UDP channel (not a spy): it has an endpoint."""
    spy: bool
    sockets: SocketSettings
    send: SendPlan | None = None
    """A UDP publication's plan."""
    endpoint: Address | None = None
    """A UDP subscription's data address (what its endpoint binds)."""
    control: Address | None = None
    """A UDP subscription's control address: the multicast control group, or a dynamic MDC publication's."""
    multicast: MulticastSettings | None = None
    """A multicast subscription's group settings."""
    image: ImageSettings = ImageSettings()
    """A UDP subscription's receive-side settings."""


@dataclass(frozen=True)
class PublicationParams:
    """A new publication's log and lifecycle parameters: the channel's, else the driver's defaults."""

    term_length: int
    mtu: int
    session_id: int | None
    initial_term_id: int
    initial_position: tuple[int, int] | None
    """(active term id, term offset) to start at, from ``init-term-id``/``term-id``/``term-offset``."""
    linger_ns: int
    flow_control: FlowControlSpec
    setup_ttl: int

    @classmethod
    def of(cls, channel: DriverChannel, ctx: DriverContext) -> PublicationParams:
        uri, plan = channel.uri, channel.send
        try:
            fc_spec = parse_flow_control(
                uri.get("fc"),
                group=plan is not None and plan.group,
                default_timeout_ns=ctx.flow_control_receiver_timeout_ns,
            )
        except InvalidChannelError as e:
            raise CommandError(ErrorCode.INVALID_CHANNEL, f"{e}: {uri.original}") from None
        initial = uri.initial_position()
        return cls(
            term_length=uri.term_length() or (ctx.term_length if plan is not None else ctx.ipc_term_length),
            mtu=uri.mtu() or ctx.mtu,
            session_id=uri.session_id(),
            initial_term_id=initial[0] if initial else random.randint(-(1 << 31), (1 << 31) - 1),
            initial_position=(initial[1], initial[2]) if initial else None,
            linger_ns=uri.linger_ns() or ctx.publication_linger_timeout_ns,
            flow_control=fc_spec,
            setup_ttl=(uri.ttl() or 0) if plan is not None and plan.multicast is not None else 0,
        )


def parse_channel(channel: str, *, spy_allowed: bool = False) -> ChannelUri:
    """The channel parsed and checked for what the driver supports (no host is resolved yet)."""
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


def resolve_publication_channel(uri: ChannelUri, ctx: DriverContext) -> DriverChannel:
    """A publication's channel (from :func:`parse_channel`) with its send plan resolved (UDP)."""
    channel = _unresolved(uri, ctx, udp=uri.media == "udp", spy=False)
    return dataclasses.replace(channel, send=_send_plan(uri)) if channel.udp else channel


def resolve_subscription_channel(uri: ChannelUri, ctx: DriverContext) -> DriverChannel:
    """A subscription's channel (from :func:`parse_channel`, spies allowed): a UDP one's data address,
    control address and settings resolved."""
    spy = bool(uri.prefix)
    channel = _unresolved(uri, ctx, udp=uri.media == "udp" and not spy, spy=spy)
    if not channel.udp:
        return channel
    if uri.endpoint() is None:
        raise CommandError(ErrorCode.INVALID_CHANNEL, f"a udp subscription needs endpoint=host:port: {uri.original}")
    address = resolve_address(uri)
    multicast = is_multicast(address[0])
    control: Address | None = None
    if multicast:
        control = multicast_control_address(address)
    elif uri.control() is not None:
        control = resolve_address(uri, "control")
    return dataclasses.replace(
        channel,
        endpoint=address,
        control=control,
        multicast=_multicast_settings(uri) if multicast else None,
        image=ImageSettings(uri.reliable(), uri.receiver_window_length(), uri.nak_delay_ns(), uri.group_tag()),
    )


def resolve_address(uri: ChannelUri, key: str = "endpoint") -> Address:
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


def _unresolved(uri: ChannelUri, ctx: DriverContext, *, udp: bool, spy: bool) -> DriverChannel:
    return DriverChannel(
        uri=uri,
        original=uri.original,
        canonical=uri.canonical_form(),
        udp=udp,
        spy=spy,
        sockets=_socket_settings(uri, ctx),
    )


def _send_plan(uri: ChannelUri) -> SendPlan:
    """Where a publication's socket binds and where it sends: unicast, multicast or MDC."""
    mode = uri.control_mode()
    if uri.control() is not None or mode == "manual":
        bind = resolve_address(uri, "control") if uri.control() is not None else _interface_bind(uri)
        return SendPlan(None, bind, None, mdc=True, manual=mode == "manual", group=True)
    destination = resolve_address(uri)
    if is_multicast(destination[0]):
        return SendPlan(
            destination,
            multicast_control_address(destination),
            _multicast_settings(uri),
            mdc=False,
            manual=False,
            group=True,
        )
    return SendPlan(destination, _interface_bind(uri), None, mdc=False, manual=False, group=False)


def _socket_settings(uri: ChannelUri, ctx: DriverContext) -> SocketSettings:
    rcvbuf, sndbuf = uri.socket_buffer_lengths()
    return SocketSettings(rcvbuf or ctx.socket_buffer_length, sndbuf or ctx.socket_buffer_length, ctx.udp_gso)


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


def _multicast_settings(uri: ChannelUri) -> MulticastSettings:
    interface = uri.interface_address()
    return MulticastSettings(None if interface is None else _interface_bind(uri)[0], uri.ttl())
