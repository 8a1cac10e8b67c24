"""A network publication and a publication image connected by hand: the UDP protocol's two ends without
sockets, threads or a driver, at a time the caller passes in.

:func:`connect` builds both in a directory (a 64 KiB term, MTU 1408, session 77, stream 5, the initial
term id two short of wrapping), passes the publication's SETUP to make the image and the image's first
status message back, and returns them with a subscriber's view of the image and the time ``now_ns``. The
caller then moves frames between them itself: ``network.send(now, wire.send)`` collects what the sender
would put on the wire in a :class:`Wire`, ``image.insert_packet(datagram, now)`` takes it in, and
``image.track_rebuild(now, wire.send)`` collects the receiver's SMs and NAKs. For tests of one protocol
rule, and for benchmarks of one path's cost.
"""

from __future__ import annotations

import mmap
import os
from typing import Final, NamedTuple

from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersManager
from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.publication_image import PublicationImage
from logbuf.driver.system_counters import SystemCounters
from logbuf.logbuffer.image import Image
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.publication import Publication
from logbuf.protocol import setup as setup_codec
from logbuf.protocol import status as status_codec

__all__ = ["MS", "MTU_LENGTH", "TERM_LENGTH", "ConnectedPair", "Wire", "build", "connect", "image_from_setup"]

MS: Final[int] = 1_000_000
"""A millisecond in nanoseconds."""
TERM_LENGTH: Final[int] = 64 * 1024
MTU_LENGTH: Final[int] = 1408


def build(
    workdir: str, name: str
) -> tuple[NetworkPublication, Publication, LogBuffers, SystemCounters, CountersManager]:
    """A network publication with its log in ``workdir/<name>.pub``, a publisher on it, and fresh counters."""
    values = mmap.mmap(-1, 128 * cd.COUNTER_LENGTH)
    metadata = mmap.mmap(-1, 128 * cd.METADATA_LENGTH)
    counters = CountersManager(memoryview(metadata), memoryview(values))
    system = SystemCounters(counters)
    path = os.path.join(workdir, f"{name}.pub")
    log = LogBuffers.create_file(
        path,
        term_length=TERM_LENGTH,
        mtu_length=MTU_LENGTH,
        session_id=77,
        stream_id=5,
        initial_term_id=2**31 - 2,
        term_window_length=TERM_LENGTH // 2,
    )
    ids = [
        counters.allocate(label, type_id)
        for label, type_id in (
            ("pub-lmt", cd.PUBLISHER_LIMIT_TYPE_ID),
            ("pub-pos", cd.PUBLISHER_POSITION_TYPE_ID),
            ("snd-pos", cd.SENDER_POSITION_TYPE_ID),
            ("snd-lmt", cd.SENDER_LIMIT_TYPE_ID),
        )
    ]
    network = NetworkPublication(
        registration_id=1,
        session_id=77,
        stream_id=5,
        channel="aeron:udp?endpoint=test:1",
        exclusive=True,
        log=log,
        log_file_name=path,
        publisher_limit_id=ids[0],
        publisher_limit=counters.position(ids[0]),
        publisher_position_id=ids[1],
        counters=counters,
        linger_timeout_ns=10**9,
        sender_position_id=ids[2],
        sender_limit_id=ids[3],
        sender_position=counters.position(ids[2]),
        system_counters=system,
        mtu_length=MTU_LENGTH,
    )
    publication = Publication(log.view, values, cd.values_offset(ids[0]), True, None)
    return network, publication, log, system, counters


def image_from_setup(
    workdir: str,
    setup: setup_codec.SetupFrame,
    counters: CountersManager,
    system: SystemCounters,
    now: int,
    reliable: bool = True,
) -> PublicationImage:
    """The image a receiver makes for ``setup``, its log in ``workdir/image``."""
    path = os.path.join(workdir, "image")
    log = LogBuffers.create_file(
        path,
        term_length=setup.term_length,
        mtu_length=setup.mtu_length,
        session_id=setup.session_id,
        stream_id=setup.stream_id,
        initial_term_id=setup.initial_term_id,
    )
    log.seek_to(setup.active_term_id, setup.term_offset)
    hwm = counters.allocate("rcv-hwm", cd.RECEIVER_HWM_TYPE_ID)
    rebuild = counters.allocate("rcv-pos", cd.RECEIVER_POSITION_TYPE_ID)
    return PublicationImage(
        registration_id=2,
        session_id=setup.session_id,
        stream_id=setup.stream_id,
        channel="aeron:udp?endpoint=test:1",
        source_identity="test",
        source_address=("test", 1),
        log=log,
        log_file_name=path,
        counters=counters,
        system_counters=system,
        hwm_id=hwm,
        rebuild_id=rebuild,
        receiver_id=9,
        join_position=log.tail_position(),
        window_length=TERM_LENGTH // 2,
        liveness_timeout_ns=10**10,
        nak_delay_ns=100_000,
        nak_retry_ns=1_000_000,
        sm_interval_ns=200_000_000,
        now_ns=now,
        reliable=reliable,
    )


class Wire:
    """Collects datagrams as a socket would send them: ``send`` is what the agents' send callbacks take."""

    def __init__(self) -> None:
        self.datagrams: list[bytes] = []

    def send(self, datagram: bytes | memoryview) -> int:
        self.datagrams.append(bytes(datagram))
        return len(datagram)

    def take(self) -> list[bytes]:
        out, self.datagrams = self.datagrams, []
        return out


class ConnectedPair(NamedTuple):
    network: NetworkPublication
    publication: Publication
    image: PublicationImage
    subscriber: Image
    counters: CountersManager
    now: int
    """The time the pair was connected at, in ns: carry on from it."""


def connect(workdir: str) -> ConnectedPair:
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
    return ConnectedPair(network, publication, image, subscriber, counters, now)
