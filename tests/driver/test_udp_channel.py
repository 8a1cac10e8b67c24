"""A channel resolved once: each kind of channel to the one immutable object the conductor's handlers hold,
and each refusal to its error code before anything is made."""

from __future__ import annotations

import dataclasses

import pytest

from logbuf.driver.client_command_adapter import CommandError
from logbuf.driver.context import DriverContext
from logbuf.driver.udp import ImageSettings, MulticastSettings, SocketSettings
from logbuf.driver.udp_channel import (
    PublicationParams,
    SendPlan,
    parse_channel,
    resolve_publication_channel,
    resolve_subscription_channel,
)
from logbuf.errors import ErrorCode

CTX = DriverContext(dir="/nonexistent/never-concluded", socket_buffer_length=1 << 20, mtu=1408)
BUFFERS = SocketSettings(1 << 20, 1 << 20, CTX.udp_gso)

PUBLICATIONS = [  # (channel, its send plan)
    ("aeron:udp?endpoint=localhost:40123", SendPlan(("127.0.0.1", 40123), ("0.0.0.0", 0), None, False, False, False)),
    (
        "aeron:udp?endpoint=127.0.0.1:40123|interface=127.0.0.1:40200",
        SendPlan(("127.0.0.1", 40123), ("127.0.0.1", 40200), None, False, False, False),
    ),
    (
        "aeron:udp?endpoint=239.1.2.3:40123|ttl=4",
        SendPlan(("239.1.2.3", 40123), ("239.1.2.4", 40123), MulticastSettings(None, 4), False, False, True),
    ),
    ("aeron:udp?control=127.0.0.1:40124", SendPlan(None, ("127.0.0.1", 40124), None, True, False, True)),
    ("aeron:udp?control-mode=manual", SendPlan(None, ("0.0.0.0", 0), None, True, True, True)),
]


@pytest.mark.parametrize(("channel", "plan"), PUBLICATIONS, ids=[c for c, _ in PUBLICATIONS])
def test_a_publication_channel_resolves_to_its_send_plan(channel: str, plan: SendPlan) -> None:
    resolved = resolve_publication_channel(parse_channel(channel), CTX)
    assert (resolved.udp, resolved.send, resolved.sockets, resolved.original) == (True, plan, BUFFERS, channel)
    tracker = plan.destination_tracker(CTX)
    assert (tracker is not None, tracker is not None and tracker.manual) == (plan.mdc, plan.manual)
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.canonical = "changed"  # type: ignore[misc]


def test_an_ipc_channel_has_no_send_plan_and_takes_the_ipc_defaults() -> None:
    resolved = resolve_publication_channel(parse_channel("aeron:ipc?term-length=131072"), CTX)
    assert (resolved.udp, resolved.send) == (False, None)
    params = PublicationParams.of(resolved, CTX)
    assert (params.term_length, params.mtu, params.session_id, params.setup_ttl) == (131072, 1408, None, 0)


def test_a_subscription_channel_resolves_its_endpoint_control_and_image_settings() -> None:
    unicast = resolve_subscription_channel(
        parse_channel("aeron:udp?endpoint=localhost:40125|control=127.0.0.1:40126|reliable=false|so-rcvbuf=65536"),
        CTX,
    )
    assert (unicast.endpoint, unicast.control, unicast.multicast) == (("127.0.0.1", 40125), ("127.0.0.1", 40126), None)
    assert unicast.image == ImageSettings(reliable=False)
    assert unicast.sockets == SocketSettings(65536, 1 << 20, CTX.udp_gso)
    multicast = resolve_subscription_channel(parse_channel("aeron:udp?endpoint=239.1.2.3:40123"), CTX)
    assert (multicast.endpoint, multicast.control) == (("239.1.2.3", 40123), ("239.1.2.4", 40123))
    assert multicast.multicast == MulticastSettings(None, None)
    spy = resolve_subscription_channel(
        parse_channel("aeron-spy:aeron:udp?endpoint=127.0.0.1:40123", spy_allowed=True), CTX
    )
    assert (spy.spy, spy.udp, spy.endpoint) == (True, False, None)


REFUSALS = [  # (channel, subscription?, code, words of the message)
    ("aeron:udp?endpoint=239.1.2.4:40123", False, ErrorCode.INVALID_CHANNEL, "odd last octet"),
    ("aeron:udp?endpoint=no-such-host.invalid:40123", False, ErrorCode.UNKNOWN_HOST, "no-such-host.invalid"),
    ("aeron:udp?endpoint=127.0.0.1:1|control=239.1.2.3:2", True, ErrorCode.INVALID_CHANNEL, "must not be a multicast"),
    ("aeron:udp?control=127.0.0.1:40124", True, ErrorCode.INVALID_CHANNEL, "needs endpoint=host:port"),
    ("aeron:udp?endpoint=127.0.0.1:1|control-mode=response", False, ErrorCode.NOT_SUPPORTED, "control-mode=response"),
    ("aeron-spy:aeron:udp?endpoint=127.0.0.1:1", False, ErrorCode.INVALID_CHANNEL, "only for subscriptions"),
]


@pytest.mark.parametrize(("channel", "subscription", "code", "words"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_channel_the_driver_cannot_serve_is_refused_with_its_code(
    channel: str, subscription: bool, code: ErrorCode, words: str
) -> None:
    with pytest.raises(CommandError, match=words) as raised:
        uri = parse_channel(channel, spy_allowed=subscription)
        if subscription:
            resolve_subscription_channel(uri, CTX)
        else:
            resolve_publication_channel(uri, CTX)
    assert raised.value.code == code
