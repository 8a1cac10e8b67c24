"""MDC on loopback, no namespaces needed: a real driver sends to plain UDP sockets added as destinations."""

from __future__ import annotations

import socket
import time

from logbuf.client import Aeron, Context, FragmentAssembler
from logbuf.protocol import decode_datagram
from logbuf.protocol.setup import GROUP_FLAG, SetupFrame
from logbuf.testing.driver_process import DriverProcess, DriverSet


def test_manual_mdc_sends_setup_with_the_group_flag_to_every_destination_and_stops_when_removed(
    driver_factory: DriverSet,
) -> None:
    driver: DriverProcess = driver_factory()
    sockets = []
    for _ in range(2):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.settimeout(0.2)
        sockets.append(s)
    destinations = [f"aeron:udp?endpoint=127.0.0.1:{s.getsockname()[1]}" for s in sockets]

    def setups(s: socket.socket, seconds: float) -> list[SetupFrame]:
        found: list[SetupFrame] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                frames = decode_datagram(s.recv(65536))
            except TimeoutError:
                continue
            found += [f for f in frames if isinstance(f, SetupFrame)]
        return found

    try:
        with Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=5_000_000_000)) as aeron:
            pub = aeron.add_publication("aeron:udp?control-mode=manual", 77)
            for d in destinations:
                pub.add_destination(d)
            for s in sockets:
                got = setups(s, 2.0)
                assert got, "no SETUP reached a destination"
                assert all(f.flags & GROUP_FLAG and f.stream_id == 77 for f in got), got
            pub.remove_destination(destinations[0])
            setups(sockets[0], 0.3)  # drain what was on its way
            assert setups(sockets[0], 0.5) == []
            assert setups(sockets[1], 0.5), "the remaining destination stopped getting SETUPs"
    finally:
        for s in sockets:
            s.close()


def test_a_destination_that_cannot_be_sent_to_does_not_hold_the_others_back(driver_factory: DriverSet) -> None:
    sender, receiver = driver_factory(), driver_factory()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"aeron:udp?endpoint=127.0.0.1:{port}"
    with (
        Aeron.connect(Context(dir=sender.dir, driver_timeout_ns=5_000_000_000)) as a,
        Aeron.connect(Context(dir=receiver.dir, driver_timeout_ns=5_000_000_000)) as b,
    ):
        sub = b.add_subscription(endpoint, 78)
        pub = a.add_publication("aeron:udp?control-mode=manual", 78)
        pub.add_destination("aeron:udp?endpoint=255.255.255.255:40999")  # broadcast without SO_BROADCAST: EACCES
        pub.add_destination(endpoint)
        got: list[bytes] = []
        assembler = FragmentAssembler(lambda buffer, header: got.append(bytes(buffer)))
        sent = 0
        deadline = time.monotonic() + 30
        while len(got) < 500:
            assert time.monotonic() < deadline, f"received {len(got)} of {sent}"
            if sent < 500 and pub.offer(sent.to_bytes(4, "little") * 50) > 0:
                sent += 1
            sub.poll(assembler, 64)
        assert [int.from_bytes(m[:4], "little") for m in got] == list(range(500))
