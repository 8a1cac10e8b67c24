"""Hostile network input, one frame at a time on the sans-IO kit (no sockets, time by hand): what
the endpoints and the protocol objects do with frames no honest peer sends. The same attacks against
real driver processes are in ``test_remote_hardening.py``."""

from __future__ import annotations

import mmap

import pytest

from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersManager
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.driver.udp import MAX_ELICITED_SESSIONS, ReceiveChannelEndpoint, SendChannelEndpoint
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import DataFrame, HeartbeatFrame, NakFrame, StatusMessageFrame
from logbuf.testing.link import LinkNetwork
from logbuf.testing.udp_pair import TERM_LENGTH, Wire, connect
from tests.interop.test_protocol_fixes import NoImages, deliver, workdir

__all__ = ["workdir"]  # the fixture, imported for this module's tests

RECEIVER = ("10.0.0.2", 4000)
SENDER = ("10.0.0.1", 5000)


def wrap(term_id: int) -> int:
    """Term ids are int32 and wrap (the kit's initial term id is 2**31 - 2)."""
    return ((term_id + 2**31) & 0xFFFFFFFF) - 2**31


def system_counters() -> SystemCounters:
    values = mmap.mmap(-1, 128 * cd.COUNTER_LENGTH)
    metadata = mmap.mmap(-1, 128 * cd.METADATA_LENGTH)
    return SystemCounters(CountersManager(memoryview(metadata), memoryview(values)))


@pytest.mark.parametrize(
    "term_delta, term_offset, window, why",
    [
        (1000, 0, 0, "far ahead of snd-pos (overflowed int32 in the batch send)"),
        (0, 64, 0, "ahead of snd-pos"),
        (-1000, 0, 0, "a negative position"),
        (0, TERM_LENGTH + 32, 0, "an offset past the term"),
        (0, 0, TERM_LENGTH // 2 + 32, "a window over half a term"),
        (0, 0, 0x7FFFFFFF, "the largest window"),
    ],
)
def test_a_status_message_no_receiver_could_send_is_counted_invalid_and_changes_nothing(
    workdir: str, term_delta: int, term_offset: int, window: int, why: str
) -> None:
    network, publication, image, subscriber, counters, now = connect(workdir)
    links = LinkNetwork()
    endpoint = SendChannelEndpoint("test", RECEIVER, links.bind(SENDER), network.system_counters, lambda: now)
    endpoint.publications[(network.session_id, network.stream_id)] = network
    network.receiver_address = RECEIVER
    term_id, _ = network.log.term_of(network.sender_position.get())
    limit = network.sender_limit
    assert network.is_plausible_status_message(StatusMessageFrame(77, 5, term_id, 0, TERM_LENGTH // 2, 9))
    forged = StatusMessageFrame(77, 5, wrap(term_id + term_delta), term_offset, window, 9)
    assert not network.is_plausible_status_message(forged), why
    endpoint.on_datagram(memoryview(forged.encode()), RECEIVER)
    assert network.system_counters.get(SystemCounterId.INVALID_PACKETS) == 1
    assert network.sender_limit == limit
    assert publication.offer(b"x" * 100) > 0
    wire = Wire()
    network.send(now, wire.send)  # nothing raised, data still goes out
    assert [len(d) for d in wire.take()] == [dh.align(dh.HEADER_LENGTH + 100)]


def test_status_messages_and_naks_from_another_address_are_spoofed_once_connected(workdir: str) -> None:
    network, _, _, _, _, now = connect(workdir)
    system = network.system_counters
    endpoint = SendChannelEndpoint("test", RECEIVER, LinkNetwork().bind(SENDER), system, lambda: now)
    endpoint.publications[(network.session_id, network.stream_id)] = network
    network.receiver_address = RECEIVER
    term_id, _ = network.log.term_of(network.sender_position.get())
    endpoint.on_datagram(
        memoryview(StatusMessageFrame(77, 5, term_id, 0, TERM_LENGTH // 2, 1).encode()), ("10.6.6.6", 1)
    )
    endpoint.on_datagram(memoryview(NakFrame(77, 5, term_id, 0, 1408).encode()), ("10.6.6.6", 1))
    assert system.get(SystemCounterId.SPOOFED_FRAMES_DROPPED) == 2
    assert system.get(SystemCounterId.NAK_MESSAGES_RECEIVED) == 0
    received = system.get(SystemCounterId.STATUS_MESSAGES_RECEIVED)
    endpoint.on_datagram(memoryview(StatusMessageFrame(77, 5, term_id, 0, TERM_LENGTH // 2, 1).encode()), RECEIVER)
    assert system.get(SystemCounterId.STATUS_MESSAGES_RECEIVED) == received + 1


def test_an_image_takes_data_and_end_of_stream_only_from_its_setups_source(workdir: str) -> None:
    network, publication, image, subscriber, counters, now = connect(workdir)
    system = image.system_counters
    endpoint = ReceiveChannelEndpoint("test", LinkNetwork().bind(RECEIVER), system, lambda: now, NoImages())
    endpoint.images[(image.session_id, image.stream_id)] = image
    term_id, term_offset = image.log.term_of(image.rebuild)
    hwm = image.hwm
    forged = DataFrame(term_offset, 77, 5, term_id, b"forged").encode()
    eos = HeartbeatFrame(term_offset, 77, 5, term_id, flags=dh.BEGIN_END_AND_EOS_FLAGS).encode()
    for datagram in (forged, eos):
        endpoint.on_datagram(memoryview(datagram), ("10.6.6.6", 1))
    assert system.get(SystemCounterId.SPOOFED_FRAMES_DROPPED) == 2
    assert (image.hwm, image.eos_position) == (hwm, -1)
    endpoint.on_datagram(memoryview(forged), image.source_address)  # from the source: the image's own
    assert image.hwm > hwm


def test_an_end_of_stream_behind_the_receive_position_or_past_the_window_is_ignored(workdir: str) -> None:
    network, publication, image, subscriber, counters, now = connect(workdir)
    wire = Wire()
    for i in range(10):
        assert publication.offer(b"m%d" % i) > 0
    network.send(now, wire.send)
    deliver(image, wire.take(), now)
    image.track_rebuild(now, wire.send)
    assert image.rebuild > image.join_position

    def eos_at(position: int) -> None:
        term_id, term_offset = image.log.term_of(position)
        heartbeat = HeartbeatFrame(term_offset, 77, 5, term_id, flags=dh.BEGIN_END_AND_EOS_FLAGS).encode()
        image.insert_packet(memoryview(heartbeat), now)

    eos_at(image.join_position)  # behind rcv-pos: would end the stream before what was received
    eos_at(image.rebuild + TERM_LENGTH)  # past the window
    assert image.eos_position == -1
    eos_at(image.rebuild)
    assert image.eos_position == image.rebuild


def test_the_sessions_asked_for_a_setup_are_bounded_and_the_oldest_forgotten() -> None:
    system = system_counters()
    links = LinkNetwork()
    endpoint = ReceiveChannelEndpoint("test", links.bind(RECEIVER), system, lambda: 0, NoImages())
    links.bind(SENDER)
    endpoint.subscribed_stream_ids.add(5)
    for session_id in range(5 * MAX_ELICITED_SESSIONS):
        endpoint.on_datagram(memoryview(DataFrame(0, session_id, 5, 0, b"x").encode()), SENDER)
    assert system.get(SystemCounterId.STATUS_MESSAGES_SENT) == 5 * MAX_ELICITED_SESSIONS
    assert len(endpoint._elicited) == MAX_ELICITED_SESSIONS
    assert (0, 5) not in endpoint._elicited and (5 * MAX_ELICITED_SESSIONS - 1, 5) in endpoint._elicited
