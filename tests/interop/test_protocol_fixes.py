"""Aeron protocol behaviours found missing by interop with real Aeron, held without
sockets: a NetworkPublication and a PublicationImage from the sans-IO kit, ``now_ns`` by hand."""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterator

import pytest

from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersManager
from logbuf.driver import _udp
from logbuf.driver.ipc_publication import PublicationState
from logbuf.driver.publication_image import ImageState, PublicationImage
from logbuf.driver.system_counters import SystemCounters
from logbuf.driver.udp import ReceiveChannelEndpoint
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.publication import OfferResult
from logbuf.protocol import data as data_codec
from logbuf.protocol import status as status_codec
from logbuf.protocol.data import HeartbeatFrame
from logbuf.testing.link import LinkNetwork
from logbuf.testing.udp_pair import MS, Wire, connect


@pytest.fixture
def workdir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        yield d


def deliver(image: PublicationImage, datagrams: list[bytes], now: int) -> None:
    for datagram in datagrams:
        assert image.insert_packet(memoryview(datagram), now) != _udp.DATA_NOT_TAKEN


def test_heartbeats_carry_flags_in_the_flags_byte_and_a_zero_reserved_value(workdir: str) -> None:
    network, publication, image, subscriber, counters, now = connect(workdir)
    wire = Wire()
    now += 200 * MS
    network.send(now, wire.send)
    (heartbeat,) = wire.take()
    assert len(heartbeat) == 32 and heartbeat[5] == dh.UNFRAGMENTED and heartbeat[24:32] == bytes(8)
    network.decrement_ref(now)
    now += 200 * MS
    network.send(now, wire.send)
    (eos,) = wire.take()
    frame = data_codec.decode(eos)
    assert isinstance(frame, HeartbeatFrame)
    assert eos[5] == dh.BEGIN_END_AND_EOS_FLAGS and frame.is_end_of_stream and frame.reserved_value == 0
    subscriber.close()
    publication.close()


def test_a_closed_publication_image_goes_inactive_once_drained_not_after_the_liveness_timeout(workdir: str) -> None:
    network, publication, image, subscriber, counters, now = connect(workdir)
    wire, back = Wire(), Wire()
    for i in range(10):
        assert publication.offer(bytes([i]) * 100) > 0
    network.send(now, wire.send)
    deliver(image, wire.take(), now)
    image.track_rebuild(now, back.send)
    network.decrement_ref(now)
    for _ in range(5):
        now += 100 * MS
        network.send(now, wire.send)
        deliver(image, wire.take(), now)
        image.track_rebuild(now, back.send)
        for datagram in back.take():
            network.on_status_message(status_codec.decode(datagram), now)
        image.on_time_event(now)
    assert image.state is ImageState.ACTIVE, "unread data: the image stays until its subscriber drained it"
    got: list[bytes] = []
    while subscriber.poll(lambda buffer, header: got.append(bytes(buffer)), 100):
        pass
    assert got == [bytes([i]) * 100 for i in range(10)]
    now += 100 * MS
    network.send(now, wire.send)
    deliver(image, wire.take(), now)
    image.track_rebuild(now, back.send)
    image.on_time_event(now)
    assert image.state is ImageState.INACTIVE  # well inside the 10 s liveness timeout
    assert subscriber.is_end_of_stream
    subscriber.close()
    publication.close()


def test_offers_see_not_connected_once_the_receiver_is_gone(workdir: str) -> None:
    network, publication, image, subscriber, counters, now = connect(workdir)
    assert network.is_connected and publication.offer(b"x" * 64) > 0
    now += network.connection_timeout_ns + 1
    network.on_time_event(now)
    network.update_publisher_limit()
    assert not network.is_connected
    assert publication.offer(b"x" * 64) == OfferResult.NOT_CONNECTED
    assert network.publisher_limit.get() == network.sender_position.get()
    assert network.state is PublicationState.ACTIVE
    subscriber.close()
    publication.close()


class NoImages:
    """The conductor's side of a receive endpoint, for a test that must see no SETUP handed on."""

    def create_publication_image(self, endpoint: object, setup: object, source: object) -> None:
        raise AssertionError(f"no image expected, got SETUP {setup}")


def test_an_end_of_stream_heartbeat_from_an_unknown_session_elicits_no_setup() -> None:
    values = mmap.mmap(-1, 128 * cd.COUNTER_LENGTH)
    metadata = mmap.mmap(-1, 128 * cd.METADATA_LENGTH)
    system = SystemCounters(CountersManager(memoryview(metadata), memoryview(values)))
    network = LinkNetwork()
    endpoint = ReceiveChannelEndpoint(
        "aeron:udp?endpoint=127.0.0.1:0", network.bind(("127.0.0.1", 0)), system, lambda: 0, NoImages()
    )
    peer = network.bind(("127.0.0.1", 0))
    endpoint.subscribed_stream_ids.add(5)
    eos = HeartbeatFrame(0, 77, 5, 0, flags=dh.BEGIN_END_AND_EOS_FLAGS).encode()
    endpoint.on_datagram(memoryview(eos), peer.local_address)
    sent: list[bytes] = []
    peer.receive(lambda datagram, source: sent.append(bytes(datagram)))
    assert sent == []
    endpoint.on_datagram(memoryview(HeartbeatFrame(0, 78, 5, 0).encode()), peer.local_address)
    peer.receive(lambda datagram, source: sent.append(bytes(datagram)))
    assert len(sent) == 1 and status_codec.decode(sent[0]).elicits_setup
    endpoint.close()
