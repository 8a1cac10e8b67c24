"""A sending endpoint's NAK rules one frame at a time on the sans-IO kit (no sockets, time by hand): the
cases real drivers on loopback cannot show cheaply (multicast); ``test_nak_amplification.py`` has the
attacks against real driver processes."""

from __future__ import annotations

from logbuf.driver.system_counters import SystemCounterId
from logbuf.driver.udp import SendChannelEndpoint
from logbuf.protocol import NakFrame, StatusMessageFrame
from logbuf.testing.link import LinkNetwork
from logbuf.testing.udp_pair import TERM_LENGTH, Wire, connect
from tests.interop.test_protocol_fixes import workdir

__all__ = ["workdir"]  # the fixture, imported for this module's tests

GROUP = ("239.1.2.3", 4000)
SENDER = ("10.0.0.1", 5000)
RECEIVER = ("10.0.0.2", 4000)
STRANGER = ("10.6.6.6", 4000)


def test_a_multicast_publication_answers_naks_only_from_receivers_and_never_below_their_sm(workdir: str) -> None:
    network, publication, _, _, _, now = connect(workdir)
    system = network.system_counters
    endpoint = SendChannelEndpoint("test", GROUP, LinkNetwork().bind(SENDER), system, lambda: now)
    endpoint.publications[(network.session_id, network.stream_id)] = network
    start = network.sender_position.get()
    term_id, offset = network.log.term_of(start)
    for _ in range(8):
        assert publication.offer(b"x" * 100) > 0  # 8 frames of 160 bytes
    network.send(now, Wire().send)
    assert network.sender_position.get() == start + 8 * 160

    def nak(from_offset: int, source: tuple[str, int]) -> None:
        endpoint.on_datagram(memoryview(NakFrame(77, 5, term_id, from_offset, 320).encode()), source)

    def sm(at_offset: int, source: tuple[str, int]) -> None:
        frame = StatusMessageFrame(77, 5, term_id, at_offset, TERM_LENGTH // 2, 9)
        endpoint.on_datagram(memoryview(frame.encode()), source)

    sm(offset, RECEIVER)
    nak(offset, STRANGER)  # no SM came from there
    assert system.get(SystemCounterId.NAKS_FROM_NON_RECEIVERS) == 1
    assert system.get(SystemCounterId.RETRANSMITS_SENT) == 0
    nak(offset, RECEIVER)
    assert system.get(SystemCounterId.RETRANSMITTED_BYTES) == 320
    now += 20_000_000  # past the linger
    sm(offset + 4 * 160, RECEIVER)  # it consumed 4 frames: it cannot lack them
    nak(offset, RECEIVER)
    assert system.get(SystemCounterId.NAKS_WITHOUT_RESEND) == 1
    nak(offset + 4 * 160 + 32, RECEIVER)  # inside the fifth frame: resent from that frame's start
    assert system.get(SystemCounterId.RETRANSMITTED_BYTES) == 320 + 320
    assert system.get(SystemCounterId.RETRANSMITS_SENT) == 2
