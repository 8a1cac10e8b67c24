"""``NetworkPublication``'s sender duty cycle and NAK answer, one call at a time (sans-IO, time by hand).

What one ``send()`` does, in order: flow control's idle check, the SETUP when due, data up to snd-lmt,
and only when no data went, one back-pressure event per time snd-lmt is reached and the heartbeat
check (1 ms while data waits behind snd-lmt, 100 ms otherwise); it returns the bytes of SETUPs and
heartbeats sent plus the term bytes data covered. A NAK returns the bytes resent.
"""

from __future__ import annotations

from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.system_counters import SystemCounterId
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import StatusMessageFrame
from logbuf.protocol import nak as nak_codec
from logbuf.protocol import status as status_codec
from logbuf.protocol.frame_header import HDR_TYPE_DATA, HDR_TYPE_NAK, HDR_TYPE_SETUP
from logbuf.protocol.setup import SetupFrame
from logbuf.protocol.status import SEND_SETUP_FLAG
from logbuf.testing.udp_pair import MS, TERM_LENGTH, Wire, build, connect
from tests.interop.test_protocol_fixes import deliver, workdir

__all__ = ["workdir"]  # the fixture, imported for this module's tests

FRAME = 160  # a 100-byte message and its header, aligned
WINDOW = 4 * FRAME
SETUP_LENGTH = len(SetupFrame(0, 0, 0, 0, 0, 64 * 1024, 1408, 0, 0).encode())


def kinds(datagrams: list[bytes]) -> list[int]:
    return [int.from_bytes(d[6:8], "little") for d in datagrams]


def term_offset_of(datagram: bytes) -> int:
    return int.from_bytes(datagram[8:12], "little")


def status(network: NetworkPublication, position: int, flags: int = 0) -> StatusMessageFrame:
    term_id, term_offset = network.log.term_of(position)
    return StatusMessageFrame(77, 5, term_id, term_offset, WINDOW, 9, flags=flags)


def test_one_send_is_setup_then_data_and_a_heartbeat_or_a_back_pressure_event_only_when_no_data_went(
    workdir: str,
) -> None:
    network, publication, log, system, _ = build(workdir, "p")
    wire = Wire()
    now = 1_000 * MS
    assert network.send(now, wire.send) == SETUP_LENGTH  # not connected: SETUPs only, every 100 ms
    assert kinds(wire.take()) == [HDR_TYPE_SETUP]
    assert network.send(now + 99 * MS, wire.send) == 0 and wire.take() == []
    start = network.sender_position.get()
    network.on_status_message(status(network, start), now)
    network.on_status_message(status(network, start, SEND_SETUP_FLAG), now)  # asks for a SETUP again
    network.update_publisher_limit()
    for _ in range(8):
        assert publication.offer(b"x" * 100) > 0
    # the SETUP goes first, then data up to snd-lmt (one window, one datagram); the count is both
    assert network.send(now, wire.send) == SETUP_LENGTH + WINDOW
    assert [(kind, len(d)) for kind, d in zip(kinds(wire.datagrams), wire.take(), strict=True)] == [
        (HDR_TYPE_SETUP, SETUP_LENGTH),
        (HDR_TYPE_DATA, WINDOW),
    ]
    assert network.sender_position.get() == start + WINDOW and not network.should_send_setup
    assert system.get(SystemCounterId.SENDER_FLOW_CONTROL_LIMITS) == 0
    # snd-lmt reached with data waiting: one back-pressure event, then a heartbeat each ms, not sooner
    for at, sent in ((now, 0), (now, 0), (now + MS - 1, 0), (now + MS, dh.HEADER_LENGTH), (now + MS, 0)):
        assert network.send(at, wire.send) == sent
    [heartbeat] = wire.take()
    assert kinds([heartbeat]) == [HDR_TYPE_DATA] and len(heartbeat) == dh.HEADER_LENGTH
    assert term_offset_of(heartbeat) == log.term_of(start + WINDOW)[1]
    assert system.get(SystemCounterId.SENDER_FLOW_CONTROL_LIMITS) == network.sender_limit_events == 1
    assert system.get(SystemCounterId.HEARTBEATS_SENT) == 1
    # the window opens: the rest goes, and no heartbeat with it
    network.on_status_message(status(network, start + WINDOW), now + 2 * MS)
    assert network.send(now + 2 * MS, wire.send) == WINDOW
    assert [len(d) for d in wire.take()] == [WINDOW]
    # all sent: the limit reached again is a second event; nothing waits, so no heartbeat for 100 ms
    assert network.send(now + 2 * MS, wire.send) == 0
    assert system.get(SystemCounterId.SENDER_FLOW_CONTROL_LIMITS) == 2
    assert network.send(now + 3 * MS, wire.send) == 0
    assert network.send(now + 101 * MS, wire.send) == 0 and wire.take() == []
    assert network.send(now + 102 * MS, wire.send) == dh.HEADER_LENGTH
    assert [term_offset_of(d) for d in wire.take()] == [log.term_of(start + 2 * WINDOW)[1]]
    assert system.get(SystemCounterId.HEARTBEATS_SENT) == 1 + 1
    assert system.get(SystemCounterId.SETUPS_SENT) == 2


def test_a_nak_resends_the_frames_as_sent_once_per_linger_and_a_malformed_one_nothing(workdir: str) -> None:
    network, publication, log, system, _ = build(workdir, "p")
    wire = Wire()
    now = 1_000 * MS
    start = network.sender_position.get()
    network.on_status_message(status(network, start), now)
    network.update_publisher_limit()
    for _ in range(4):
        assert publication.offer(b"x" * 100) > 0
    assert network.send(now, wire.send) == WINDOW
    sent = b"".join(wire.take())
    term_id, offset = log.term_of(start)
    # a NAK from inside the second frame: resent from that frame's start, as the datagrams first went
    assert network.on_nak_range(term_id, offset + FRAME + 32, 2 * FRAME - 32, now, wire.send) == 2 * FRAME
    assert b"".join(wire.take()) == sent[FRAME : 3 * FRAME]
    assert network.on_nak_range(term_id, offset + FRAME, 2 * FRAME, now, wire.send) == 0  # it lingers
    assert system.get(SystemCounterId.NAKS_WITHOUT_RESEND) == 1
    assert network.on_nak_range(term_id, offset + 8, FRAME, now, wire.send) == 0  # not frame-aligned
    assert network.on_nak_range(term_id, offset + 3 * FRAME, WINDOW, now, wire.send) == FRAME  # to snd-pos
    assert b"".join(wire.take()) == sent[3 * FRAME :]
    assert system.get(SystemCounterId.NAKS_MALFORMED) == system.get(SystemCounterId.INVALID_PACKETS) == 1
    assert system.get(SystemCounterId.RETRANSMITS_SENT) == 2
    assert system.get(SystemCounterId.RETRANSMITTED_BYTES) == 3 * FRAME
    assert network.naks_received == 3


def test_a_receiver_over_half_a_term_behind_a_sender_that_stopped_catches_up_by_naks(workdir: str) -> None:
    """Under fc=max a faster receiver paces the sender; one that lost the stream's tail (or dropped it as
    over-runs) and is more than half a term behind the sender's end hears only heartbeats past its window.
    They tell it the window's data was all sent, so it NAKs that, and the window moves as it is read."""
    network, publication, image, subscriber, _, now = connect(workdir)
    wire, back = Wire(), Wire()
    start = network.sender_position.get()
    network.on_status_message(StatusMessageFrame(77, 5, *network.log.term_of(start), TERM_LENGTH, 99), now)  # fast
    count = 300  # 48,000 bytes of frames: past the slow receiver's window (half a term) from 8 KiB
    i = 0
    while i < count:  # offers up to the publisher limit (a term window past snd-pos), sends, and so on
        if publication.offer(i.to_bytes(4, "little") * 25) > 0:
            i += 1
            continue
        while network.send(now, wire.send):
            pass
        network.update_publisher_limit()
    while network.send(now, wire.send):
        pass
    assert network.sender_position.get() == start + count * FRAME
    datagrams = wire.take()
    head = [d for d in datagrams if term_offset_of(d) < 8 * 1024]
    deliver(image, head, now)  # the rest lost: the receiver knows of nothing past 8 KiB
    got: list[bytes] = []
    for _ in range(2_000):
        now += MS
        network.send(now, wire.send)  # heartbeats only: everything was sent
        deliver(image, wire.take(), now)
        image.track_rebuild(now, back.send)
        for datagram in back.take():
            if kinds([datagram]) == [HDR_TYPE_NAK]:
                nak = nak_codec.decode(datagram)
                network.on_nak_range(nak.term_id, nak.term_offset, nak.length, now, wire.send)
            else:
                network.on_status_message(status_codec.decode(datagram), now)
        while subscriber.poll(lambda buffer, header: got.append(bytes(buffer)), 100):
            pass
        if len(got) == count:
            break
    assert got == [i.to_bytes(4, "little") * 25 for i in range(count)], f"{len(got)} of {count} messages"
