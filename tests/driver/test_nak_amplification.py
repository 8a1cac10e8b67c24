"""NAK amplification: what NAKs from an attacker make a real sending driver resend.

Two real drivers on loopback carry a live stream while an attacker sends NAKs: forged with the honest
receiver's own source address (a raw IP socket: we are root), or plainly from 127.0.0.2, which is no
receiver of the publication. Amplification is the sender's "Retransmitted bytes" over the NAK bytes the
attacker sent; the honest receiver must still get every message once, in order. Speed (the live rate
under attack) is measured in ``perf/udp_attacks.py``, not here.
"""

from __future__ import annotations

import multiprocessing
import socket
import time
from collections.abc import Iterator

import pytest

from logbuf.client import Aeron, Context, Subscription
from logbuf.protocol import NakFrame, StatusMessageFrame
from logbuf.testing import wait_until
from logbuf.testing.checked_stream import stream
from logbuf.testing.driver_process import DriverSet
from logbuf.testing.host import free_udp_port
from logbuf.testing.nak_flood import Forger, flood, stepped_naks_at
from tests.driver.test_udp import BASE_ARGS

NAK_LENGTH = 28
"""A NAK frame's bytes (the UDP payload; IP and UDP headers not counted, nor in what the sender resends)."""
MAX_AMPLIFICATION = 16


@pytest.fixture
def forger() -> Iterator[Forger]:
    f = Forger()
    yield f
    f.close()


def sender_address(sub: Subscription) -> tuple[str, int]:
    """Where the sending driver's endpoint listens for SMs and NAKs (the image's source)."""
    host, port = sub.images[0].source_identity.rsplit(":", 1)
    return host, int(port)


def stepped_naks(session_id: int, stream_id: int, sub: Subscription) -> list[bytes]:
    image = sub.images[0]
    return stepped_naks_at(session_id, stream_id, image.initial_term_id, image.term_length, image.position)


def test_a_flood_of_forged_naks_from_the_receivers_address_costs_at_most_16_times_its_bytes(
    driver_factory: DriverSet, forger: Forger
) -> None:
    """Before: stepping the offset defeated the linger, and each NAK got everything from its offset to
    the sender position: thousands of times its bytes."""
    a, b = driver_factory(base=BASE_ARGS), driver_factory(base=BASE_ARGS)
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    receiver_address = ("127.0.0.1", port)  # the receive endpoint's socket sends the SMs and NAKs
    with Aeron.connect(Context(dir=a.dir)) as sender, Aeron.connect(Context(dir=b.dir)) as receiver:
        sub = receiver.add_subscription(channel, 40)
        pub = sender.add_publication(channel, 40)
        wait_until(lambda: pub.is_connected and bool(sub.images), 20, "connection")
        target = sender_address(sub)
        image = sub.images[0]
        spawn = multiprocessing.get_context("spawn")
        position, sent, stop = spawn.Value("q", image.position), spawn.Value("q", 0), spawn.Event()
        stream_fields = (pub.session_id, 40, image.initial_term_id, image.term_length)
        child = spawn.Process(target=flood, args=(target, receiver_address, stream_fields, position, sent, stop))
        child.start()
        try:
            wait_until(lambda: sent.value > 0, 30, "the flood started")
            before, naks_before = a.system_counters(), sent.value
            [got] = stream(pub, [sub], 2_000, 60, lambda: setattr(position, "value", image.position))
            after, naks = a.system_counters(), sent.value - naks_before
        finally:
            stop.set()
            child.join(10)
            if child.is_alive():
                child.kill()
        assert got == list(range(2_000))
    resent = after["Retransmitted bytes"] - before["Retransmitted bytes"]
    nak_bytes = naks * NAK_LENGTH
    received = after["NAKs received"] - before["NAKs received"]
    assert received >= naks // 4, f"{received} of {naks} forged NAKs reached the sender"
    assert resent <= MAX_AMPLIFICATION * nak_bytes, f"{resent} bytes resent for {naks} NAKs ({nak_bytes} bytes)"


@pytest.mark.parametrize("mode", ["dynamic", "manual"])
def test_naks_from_an_address_that_is_no_destination_of_an_mdc_publication_get_nothing(
    driver_factory: DriverSet, mode: str
) -> None:
    """Before: 127.0.0.2 is no destination, yet each of its NAKs was answered (to every destination)."""
    a, b = driver_factory(base=BASE_ARGS), driver_factory(base=BASE_ARGS)
    control, data = free_udp_port(), free_udp_port()
    endpoint = f"127.0.0.1:{data}"
    if mode == "dynamic":
        pub_channel = f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic"
        sub_channel = f"aeron:udp?endpoint={endpoint}|control=127.0.0.1:{control}"
    else:
        pub_channel = "aeron:udp?control-mode=manual"
        sub_channel = f"aeron:udp?endpoint={endpoint}"
    with (
        Aeron.connect(Context(dir=a.dir)) as sender,
        Aeron.connect(Context(dir=b.dir)) as receiver,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker,
    ):
        attacker.bind(("127.0.0.2", 0))
        sub = receiver.add_subscription(sub_channel, 41)
        pub = sender.add_publication(pub_channel, 41)
        if mode == "manual":
            pub.add_destination(f"aeron:udp?endpoint={endpoint}")
        wait_until(lambda: pub.is_connected and bool(sub.images), 20, "connection")
        target = sender_address(sub)
        before_a, before_b = a.system_counters(), b.system_counters()
        naks = 0
        batch: list[bytes] = []

        def attack() -> None:
            nonlocal naks, batch
            if naks >= 2_000:
                return
            if not batch:
                batch = stepped_naks(pub.session_id, 41, sub)
            attacker.sendto(batch.pop(), target)
            naks += 1

        assert stream(pub, [sub], 500, 60, attack) == [list(range(500))]
        after_a, after_b = a.system_counters(), b.system_counters()
    # whatever was resent, the honest receiver asked for (loopback rarely loses, a loaded machine may)
    honest_naks = after_b["NAKs sent"] - before_b["NAKs sent"]
    from_non_receivers = after_a["NAKs from non-receivers"] - before_a.get("NAKs from non-receivers", 0)
    assert from_non_receivers >= min(naks, after_a["NAKs received"] - before_a["NAKs received"] - honest_naks) > 0
    assert after_a["Retransmits sent"] - before_a["Retransmits sent"] <= honest_naks


def test_naks_with_unaligned_offsets_or_lengths_are_counted_as_malformed_and_get_nothing(
    driver_factory: DriverSet, forger: Forger
) -> None:
    """Before: lengths 100 and 1 were answered (offsets 4 and 16 were already refused by the decoder, as
    invalid packets), and no counter said why any was dropped."""
    a, b = driver_factory(base=BASE_ARGS), driver_factory(base=BASE_ARGS)
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    with Aeron.connect(Context(dir=a.dir)) as sender, Aeron.connect(Context(dir=b.dir)) as receiver:
        sub = receiver.add_subscription(channel, 42)
        pub = sender.add_publication(channel, 42)
        wait_until(lambda: pub.is_connected and bool(sub.images), 20, "connection")
        got: list[bytes] = []
        for i in range(50):
            while pub.offer(b"m%03d" % i + bytes(200)) < 0:
                sub.poll(lambda buffer, header: got.append(bytes(buffer)), 64)
        wait_until(
            lambda: sub.poll(lambda buffer, header: got.append(bytes(buffer)), 64) >= 0 and len(got) == 50, 20, "50"
        )
        image = sub.images[0]
        term_id = image.initial_term_id + image.position // image.term_length
        before = a.system_counters()
        malformed = [(4, 1408), (16, 1408), (0, 100), (64, 1)]
        for offset, length in malformed:
            forger.send(
                NakFrame(pub.session_id, 42, term_id, offset, length).encode(), ("127.0.0.1", port), sender_address(sub)
            )
        wait_until(
            lambda: a.system_counters()["NAKs malformed"] - before.get("NAKs malformed", 0) == len(malformed),
            10,
            "the malformed NAKs counted",
        )
        after = a.system_counters()
    assert after["Retransmitted bytes"] == before["Retransmitted bytes"]
    assert after["Invalid packets"] - before["Invalid packets"] == len(malformed)


def test_with_an_allow_list_a_forged_sm_does_not_make_a_dynamic_mdc_publication_send_to_its_victim(
    driver_factory: DriverSet,
) -> None:
    """Without the list (Aeron's behaviour too), one SM from the victim's address makes it a destination."""
    a = driver_factory("--mdc-dynamic-allow", "127.0.0.1", base=BASE_ARGS)
    b = driver_factory(base=BASE_ARGS)
    control, data = free_udp_port(), free_udp_port()
    with (
        Aeron.connect(Context(dir=a.dir)) as sender,
        Aeron.connect(Context(dir=b.dir)) as receiver,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as victim,
    ):
        victim.bind(("127.0.0.2", 0))
        victim.settimeout(0.05)
        sub = receiver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{data}|control=127.0.0.1:{control}", 43)
        pub = sender.add_publication(f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic", 43)
        wait_until(lambda: pub.is_connected and bool(sub.images), 20, "connection")
        image = sub.images[0]
        term_id = image.initial_term_id + image.position // image.term_length
        for setup in (True, False):  # a setup-eliciting SM, then one with a position
            sm = StatusMessageFrame(pub.session_id, 43, term_id, 0, 64 * 1024, 666, flags=0x80 if setup else 0)
            victim.sendto(sm.encode(), ("127.0.0.1", control))
        wait_until(lambda: a.system_counters()["Status Messages rejected"] >= 2, 10, "the victim's SMs rejected")
        got: list[bytes] = []
        for i in range(200):
            while pub.offer(b"m%03d" % i) < 0:
                sub.poll(lambda buffer, header: got.append(bytes(buffer)), 64)
        deadline = time.monotonic() + 20
        while len(got) < 200:
            assert time.monotonic() < deadline, f"the listed receiver got {len(got)} of 200"
            sub.poll(lambda buffer, header: got.append(bytes(buffer)), 64)
        assert got == [b"m%03d" % i for i in range(200)]
        leaked = 0
        try:
            while True:
                leaked += len(victim.recv(65536))
        except TimeoutError:
            pass
        assert leaked == 0, f"the victim was sent {leaked} bytes"
