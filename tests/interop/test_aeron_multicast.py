"""Mixed pairings on a multi-host network: Aeron's C driver among logbuf drivers, multicast and MDC.

Three hosts, each a network namespace (:mod:`logbuf.testing.netns`) with a media driver: logbuf's, or
Aeron's C driver (pyaeron's embedded one) with a pyaeron client. Host 0 publishes, hosts 1 and 2
subscribe. Either a logbuf publisher feeds a logbuf and an Aeron receiver, or an Aeron publisher feeds
two logbuf receivers; over multicast and dynamic MDC. Every receiver gets every message once, in
order, and the publisher waits for both receivers (``fc=min,g:/2``, parsed alike by both drivers), so
each side's SETUPs, SMs (receiver ids), NAKs and eliciting SMs work for the other. Needs root
(namespaces) and pyaeron (the interop venv); in CI both must be there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from logbuf.testing.driver_process import DriverProcess, DriverSet
from logbuf.testing.netns import NetnsDriverProcess, NetnsNetwork, make_network
from tests.interop.conftest import IN_CI, PEER, Interop, Peer

pytestmark = pytest.mark.skipif(not IN_CI and os.geteuid() != 0, reason="network namespaces need root (run in CI)")

COUNT, SIZE = 5_000, 200


@pytest.fixture(scope="module")
def net() -> Iterator[NetnsNetwork]:
    network = make_network(3)
    try:
        yield network
    finally:
        network.close()


def aeron_driver(interop: Interop, net: NetnsNetwork, host: int) -> str:
    directory = f"/dev/shm/aeron-h13-{uuid.uuid4().hex[:8]}"
    interop.dirs.append(directory)
    argv = ["ip", "netns", "exec", net.host(host), interop.pyaeron_python, PEER, "driver", "--dir", directory]
    peer = Peer([*argv, "--timeout", "600"], None, "C driver")
    interop.peers.append(peer)
    peer.wait("ready", 60)
    return directory


def logbuf_driver(drivers: DriverSet, net: NetnsNetwork, host: int) -> DriverProcess:
    args = ["--dir-delete-on-shutdown", "false", "--driver-timeout", "10s", "--client-liveness-timeout", "10s"]
    return drivers.start(NetnsDriverProcess(args=args, namespace=net.host(host)))


CASES = [
    # (mode, kinds of hosts 0 (publisher), 1 and 2 (receivers))
    ("multicast", ("logbuf", "logbuf", "aeron")),
    ("mdc", ("logbuf", "logbuf", "aeron")),
    ("multicast", ("aeron", "logbuf", "logbuf")),
    ("mdc", ("aeron", "logbuf", "logbuf")),
]


@pytest.mark.parametrize(("mode", "kinds"), CASES, ids=[f"{m}-{'-'.join(k)}" for m, k in CASES])
def test_mixed_drivers_one_publisher_two_receivers_every_message_once_in_order(
    interop: Interop, net: NetnsNetwork, request: pytest.FixtureRequest, mode: str, kinds: tuple[str, str, str]
) -> None:
    port = 40810 + 20 * CASES.index((mode, kinds))
    if mode == "multicast":
        group = f"aeron:udp?endpoint=239.13.0.1:{port}"
        pub_channel = f"{group}|interface={net.address(0)}|fc=min,g:/2"
        sub_channels = [f"{group}|interface={net.address(i)}" for i in (1, 2)]
    else:
        control = f"{net.address(0)}:{port}"
        pub_channel = f"aeron:udp?control={control}|control-mode=dynamic|fc=min,g:/2"
        sub_channels = [
            f"aeron:udp?endpoint={net.address(i)}:{port + 1}|control={control}|control-mode=dynamic" for i in (1, 2)
        ]
    with DriverSet(request) as drivers:
        dirs = [
            logbuf_driver(drivers, net, host).dir if kind == "logbuf" else aeron_driver(interop, net, host)
            for host, kind in enumerate(kinds)
        ]
        client = {"logbuf": "logbuf", "aeron": "pyaeron"}
        subscribers = [
            interop.peer("subscribe", client[kinds[i]], dirs[i], channel=sub_channels[i - 1], size=SIZE, count=COUNT)
            for i in (1, 2)
        ]
        for s in subscribers:
            s.wait("ready")
        publisher = interop.peer(
            "publish", client[kinds[0]], dirs[0], channel=pub_channel, size=SIZE, count=COUNT, timeout=120
        )
        publisher.wait("ready")
        publisher.wait("sent", 120)
        for s, who in zip(subscribers, kinds[1:], strict=True):
            received = s.wait("received", 120)
            assert received["count"] == COUNT, f"{who} receiver got {received['count']} of {COUNT}"
        publisher.go()
        publisher.go()
        for s in subscribers:
            result = s.wait("result", 60)
            assert result["errors"] == [] and result["received"] == COUNT and result["duplicates"] == 0, result
