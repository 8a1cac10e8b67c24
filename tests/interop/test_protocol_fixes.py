"""Aeron protocol behaviours found missing by interop with real Aeron (issue 11), held without
sockets: a NetworkPublication and a PublicationImage from the sans-IO kit, ``now_ns`` by hand."""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from logbuf import native
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersManager
from logbuf.driver.ipc_publication import PublicationState
from logbuf.driver.publication_image import ImageState, PublicationImage
from logbuf.driver.system_counters import SystemCounters
from logbuf.driver.udp import ReceiveChannelEndpoint, SocketSettings
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.image import Image
from logbuf.logbuffer.publication import OfferResult
from logbuf.protocol import data as data_codec
from logbuf.protocol import setup as setup_codec
from logbuf.protocol import status as status_codec
from logbuf.protocol.data import HeartbeatFrame
from tests.driver.test_udp_sans_io import build, image_from_setup

MS = 1_000_000


@pytest.fixture
def workdir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        yield d


class Wire:
    def __init__(self) -> None:
        self.datagrams: list[bytes] = []

    def send(self, datagram: Any) -> int:
        self.datagrams.append(bytes(datagram))
        return len(datagram)

    def take(self) -> list[bytes]:
        out, self.datagrams = self.datagrams, []
        return out


def connect(workdir: str) -> tuple[Any, Any, PublicationImage, Image, CountersManager, int]:
    """A publication and an image connected through SETUP and a first SM; returns them at time ``now``."""
    network, publication, log, system, counters = build(workdir, "p")
    wire = Wire()
    now = 1_000 * MS
    network.send(now, wire.send)
    setup = setup_codec.decode(wire.take()[0])
    image = image_from_setup(workdir, setup, counters, system, now)
    sub = image.add_subscriber(3, 0, "test")
    subscriber = Image(image.log.view, counters.values, cd.values_offset(sub.counter_id))
    image.track_rebuild(now, wire.send)
    for datagram in wire.take():
        network.on_status_message(status_codec.decode(datagram), now)
    network.update_publisher_limit()
    return network, publication, image, subscriber, counters, now


def deliver(image: PublicationImage, datagrams: list[bytes], now: int) -> None:
    for datagram in datagrams:
        view = memoryview(datagram)
        covered = native.check_data_datagram(view, image.log.term_length)
        assert covered >= 0
        image.insert_packet(
            int.from_bytes(view[20:24], "little", signed=True), int.from_bytes(view[8:12], "little"), view, covered, now
        )


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


def test_an_end_of_stream_heartbeat_from_an_unknown_session_elicits_no_setup() -> None:
    values = mmap.mmap(-1, 64 * cd.COUNTER_LENGTH)
    metadata = mmap.mmap(-1, 64 * cd.METADATA_LENGTH)
    system = SystemCounters(CountersManager(memoryview(metadata), memoryview(values)))
    endpoint = ReceiveChannelEndpoint(
        "aeron:udp?endpoint=127.0.0.1:0",
        ("127.0.0.1", 0),
        system,
        None,
        SocketSettings(1 << 16, 1 << 16),
        lambda *a: None,
    )
    sent: list[bytes] = []
    endpoint.send_to = lambda datagram, address: sent.append(bytes(datagram)) or len(datagram)  # type: ignore[method-assign]
    endpoint.stream_ids[5] = 1
    eos = HeartbeatFrame(0, 77, 5, 0, flags=dh.BEGIN_END_AND_EOS_FLAGS).encode()
    endpoint.on_datagram(memoryview(eos), ("127.0.0.1", 9))
    assert sent == []
    endpoint.on_datagram(memoryview(HeartbeatFrame(0, 78, 5, 0).encode()), ("127.0.0.1", 9))
    assert len(sent) == 1 and status_codec.decode(sent[0]).elicits_setup
    endpoint.close()
