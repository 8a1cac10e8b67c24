"""The agents' transport poller: which endpoints have datagrams, past descriptor 1023, in one shared batch."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator

import pytest

from logbuf.conduit.counters import CountersManager
from logbuf.driver import _udp
from logbuf.driver.system_counters import SystemCounters
from logbuf.driver.transport_poller import TransportPoller
from logbuf.driver.udp import ChannelEndpoint, FaultInjector, SocketSettings, UdpTransport
from logbuf.protocol.frame_header import HDR_TYPE_SM

ENDPOINTS = 1_100
"""Enough that the last sockets' descriptors are past 1023, where select() fails."""


@pytest.fixture
def system_counters() -> SystemCounters:
    counters = CountersManager(memoryview(bytearray(512 * 256)), memoryview(bytearray(128 * 256)))
    return SystemCounters(counters)


@pytest.fixture
def open_files() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = ENDPOINTS + 512
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def endpoint(system_counters: SystemCounters, faults: FaultInjector | None = None) -> ChannelEndpoint:
    transport = UdpTransport(
        ("127.0.0.1", 0), sockets=SocketSettings(1 << 16, 1 << 16), faults=faults, system_counters=system_counters
    )
    channel_endpoint = ChannelEndpoint("aeron:udp", transport, system_counters, time.monotonic_ns)
    channel_endpoint.handlers = {HDR_TYPE_SM: lambda datagram, source: None}
    return channel_endpoint


def test_readable_endpoints_are_found_and_waited_for_past_descriptor_1023(
    open_files: None, system_counters: SystemCounters
) -> None:
    poller: TransportPoller[ChannelEndpoint] = TransportPoller()
    endpoints = [endpoint(system_counters) for _ in range(ENDPOINTS)]
    try:
        for e in endpoints:
            poller.add(e)
        last = endpoints[-1]
        assert last.transport.fileno() > 1023
        assert poller.ready() == []
        started = time.monotonic()
        assert not _udp.wait_readable(poller.fileno(), 20_000_000)  # a timeout, not an error
        assert time.monotonic() - started >= 0.015
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(bytes(8), last.transport.local_address)
            sender.sendto(bytes(8), last.transport.local_address)
        assert _udp.wait_readable(poller.fileno(), 5_000_000_000)
        assert poller.ready() == [last]
        assert last.poll(poller.batch, checked=True) == 2  # both datagrams into the shared batch
        assert poller.ready() == []
        poller.remove(last)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(bytes(8), last.transport.local_address)
        assert not _udp.wait_readable(poller.fileno(), 10_000_000)
        assert poller.ready() == []
    finally:
        poller.close()
        for e in endpoints:
            e.close()


def test_endpoints_share_one_batch_made_with_the_first(system_counters: SystemCounters) -> None:
    poller: TransportPoller[ChannelEndpoint] = TransportPoller()
    first, second = endpoint(system_counters), endpoint(system_counters)
    try:
        poller.add(first)
        poller.add(second)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for e in (first, second):
                sender.sendto(bytes(8), e.transport.local_address)
        assert _udp.wait_readable(poller.fileno(), 5_000_000_000)
        deadline = time.monotonic() + 5
        while len(ready := poller.ready()) < 2:
            assert time.monotonic() < deadline
        assert sorted(map(id, ready)) == sorted(map(id, (first, second)))
        assert sum(e.poll(poller.batch, checked=True) for e in ready) == 2
        for e in (first, second):
            assert isinstance(e.transport, UdpTransport) and e.transport._batch is None  # never made its own
    finally:
        poller.close()
        first.close()
        second.close()


def test_a_transport_with_fault_injection_is_polled_every_cycle(system_counters: SystemCounters) -> None:
    """A reordered datagram is held back until the next one arrives or the next poll flushes it, so the
    socket's readiness does not say whether there is something to deliver."""
    poller: TransportPoller[ChannelEndpoint] = TransportPoller()
    faulty = endpoint(system_counters, FaultInjector(0.0, 0.0, 0.5, seed=1))
    try:
        poller.add(faulty)
        assert poller.unselectable == [faulty] and not poller.selectable
    finally:
        poller.close()
        faulty.close()
