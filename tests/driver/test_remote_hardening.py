"""Remote hardening: anyone who can send a UDP datagram to a driver.

Each test plays the attacker with crafted datagrams from a raw UDP socket against real driver
processes and shows the driver counts and drops what it must, and that the honest stream carries on.
The drivers' error logs must stay empty (``DriverSet`` checks): bad network input is counted, not
raised inside the duty cycle.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from logbuf.client import Aeron, Context, Subscription
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import DataFrame, HeartbeatFrame, SetupFrame, StatusMessageFrame, decode_datagram
from logbuf.protocol import setup as setup_codec
from logbuf.protocol.frame_header import COMMON_HEADER, HDR_TYPE_DATA, HDR_TYPE_SETUP
from logbuf.testing import wait_until
from logbuf.testing.checked_stream import stream
from logbuf.testing.driver_process import DriverProcess, DriverSet
from logbuf.testing.host import free_udp_port, rss_bytes
from tests.driver.test_udp import BASE_ARGS, counters

SPOOFED = "Spoofed frames dropped"
REJECTED = "Images rejected"


@pytest.fixture
def raw() -> Iterator[socket.socket]:
    """The attacker's socket, bound to its own port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        yield s


def receive_frame(raw: socket.socket, frame_type: int, timeout_s: float = 10) -> tuple[bytes, tuple[str, int]]:
    """The next datagram of ``frame_type`` (others are skipped) and where it came from."""
    deadline = time.monotonic() + timeout_s
    while True:
        raw.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            datagram, source = raw.recvfrom(65536)
        except TimeoutError:
            raise AssertionError(f"no frame of type {frame_type} within {timeout_s} s") from None
        if len(datagram) >= 8 and COMMON_HEADER.unpack_from(datagram)[3] == frame_type:
            return datagram, source


def drain(raw: socket.socket) -> None:
    raw.settimeout(0)
    try:
        while True:
            raw.recv(65536)
    except BlockingIOError:
        pass


def images_dir_files(driver: DriverProcess) -> list[str]:
    return sorted(os.listdir(os.path.join(driver.dir, "images")))


# -- item 1 -----------------------------------------------------------------------------------------------
def test_a_forged_status_message_is_counted_and_dropped_and_the_sender_goes_on(
    driver_factory: DriverSet, raw: socket.socket
) -> None:
    """The raw socket is the receiver: it connects the publication with honest SMs, then sends SMs
    whose fields no receiver can produce. Before: term id 1000 with window 0 overflowed int32 in the
    sender's batch send, which raised on every duty cycle and never sent again."""
    a = driver_factory(base=BASE_ARGS)
    with Aeron.connect(Context(dir=a.dir)) as sender:
        pub = sender.add_publication(f"aeron:udp?endpoint=127.0.0.1:{raw.getsockname()[1]}", 21)
        datagram, control = receive_frame(raw, HDR_TYPE_SETUP)
        setup = setup_codec.decode(datagram)
        term_length, receiver_id = setup.term_length, 77

        def honest_sm() -> None:  # as a receiver at the join position would send, again and again
            sm = StatusMessageFrame(pub.session_id, 21, setup.active_term_id, setup.term_offset, 64 * 1024, receiver_id)
            raw.sendto(sm.encode(), control)

        honest_sm()
        wait_until(lambda: pub.is_connected, 10, "the publication connected by the raw receiver")
        invalid_before = counters(a)["Invalid packets"]
        forged = [
            (setup.active_term_id + 1000, 0, 0),  # far ahead of anything sent: overflowed int32
            (setup.active_term_id - 1000, 0, 0),  # a negative position
            (setup.active_term_id, term_length + 32, 0),  # offset past the term
            (setup.active_term_id, setup.term_offset, 0x7FFFFFFF),  # a window bigger than the term
        ]
        for term_id, term_offset, window in forged:
            raw.sendto(
                StatusMessageFrame(pub.session_id, 21, term_id, term_offset, window, receiver_id).encode(), control
            )
        wait_until(lambda: counters(a)["Invalid packets"] >= invalid_before + len(forged), 10, "forged SMs counted")
        # the sender still sends what honest SMs allow
        drain(raw)
        deadline = time.monotonic() + 30
        for i in range(20):
            wait_until(  # NOT_CONNECTED if a loaded machine let the connection time out: the SMs reconnect it
                lambda: pub.offer(b"after %d" % i) > 0,
                max(1.0, deadline - time.monotonic()),
                f"offer {i} taken",
                do_work=lambda: (honest_sm(), 0)[1],  # 0: no work done, so back off, to 10 ms between SMs
            )
        seen: list[bytes] = []
        while len(seen) < 20:
            assert time.monotonic() < deadline, f"the sender stopped sending: {seen}"
            honest_sm()
            datagram, _ = receive_frame(raw, HDR_TYPE_DATA, timeout_s=max(1.0, deadline - time.monotonic()))
            seen += [f.payload for f in decode_datagram(datagram) if isinstance(f, DataFrame) and f.payload]
        assert seen == [b"after %d" % i for i in range(20)]
    assert a.errors() == []


# -- item 2 -----------------------------------------------------------------------------------------------
def test_a_setup_with_its_active_term_before_its_initial_term_leaks_nothing_and_the_batch_goes_on(
    driver_factory: DriverSet, raw: socket.socket
) -> None:
    b = driver_factory("--image-liveness-timeout", "30s", base=BASE_ARGS)  # the good image outlives the checks
    port = free_udp_port()
    with Aeron.connect(Context(dir=b.dir)) as receiver:
        sub = receiver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 22)
        invalid_before = counters(b)["Invalid packets"]
        bad = SetupFrame(0, 501, 22, initial_term_id=100, active_term_id=50, term_length=65536, mtu_length=1408)
        good = SetupFrame(0, 502, 22, initial_term_id=7, active_term_id=9, term_length=65536, mtu_length=1408)
        raw.sendto(bad.encode(), ("127.0.0.1", port))
        raw.sendto(good.encode(), ("127.0.0.1", port))  # the same receive batch, most likely
        wait_until(lambda: [i.session_id for i in sub.images] == [502], 10, "the good SETUP's image")
        assert counters(b)["Invalid packets"] >= invalid_before + 1
        assert len(images_dir_files(b)) == 1
    assert b.errors() == []


# -- item 3 -----------------------------------------------------------------------------------------------
def test_a_setup_flood_is_capped_per_endpoint_and_the_real_stream_is_unaffected(
    driver_factory: DriverSet, raw: socket.socket
) -> None:
    cap = ["--max-images-per-endpoint", "8", "--max-image-term-length", "1m"]
    a, b = driver_factory(base=BASE_ARGS), driver_factory(*cap, base=BASE_ARGS)
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    port = int(channel.rsplit(":", 1)[1])
    with Aeron.connect(Context(dir=a.dir)) as sender, Aeron.connect(Context(dir=b.dir)) as receiver:
        sub = receiver.add_subscription(channel, 23)
        pub = sender.add_publication(channel, 23)
        wait_until(lambda: pub.is_connected and bool(sub.images), 10, "connection")
        counters_before = len(b.counters())
        # a term longer than the cap: refused before anything is allocated
        raw.sendto(SetupFrame(0, 900, 23, 0, 0, 2 * 1024 * 1024, 1408).encode(), ("127.0.0.1", port))
        for session_id in range(1000, 1200):  # a new session per datagram
            raw.sendto(SetupFrame(0, session_id, 23, 0, 0, 65536, 1408).encode(), ("127.0.0.1", port))
            if session_id % 50 == 0:
                time.sleep(0.01)  # within the driver's socket buffer
        wait_until(lambda: counters(b)[REJECTED] >= 150, 20, "the flood rejected")
        got = stream(pub, [sub], 2_000, 60)
        assert got == [list(range(2_000))]
        assert 900 not in [i.session_id for i in sub.images]
        assert len(images_dir_files(b)) <= 8
        assert len(b.counters()) <= counters_before + 7 * 4  # rcv-hwm, rcv-pos, rcv-naks-sent and sub-pos per image
    assert b.errors() == []


# -- item 4 -----------------------------------------------------------------------------------------------
def test_data_with_random_session_ids_does_not_grow_the_driver(driver_factory: DriverSet, raw: socket.socket) -> None:
    b = driver_factory(base=BASE_ARGS)
    assert b.proc is not None
    port = free_udp_port()
    rng = random.Random(4)
    with Aeron.connect(Context(dir=b.dir)) as receiver:
        receiver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 24)

        def flood(count: int) -> None:
            for i in range(count):
                frame = DataFrame(0, rng.getrandbits(31), 24, 0, b"x" * 64).encode()
                raw.sendto(frame, ("127.0.0.1", port))
                if i % 200 == 0:
                    time.sleep(0.005)  # pace: within the driver's socket buffer
                    drain(raw)  # the setup-eliciting SMs that come back

        flood(5_000)  # warm up: caches, allocator arenas
        received_before = counters(b)["Datagrams received"]
        rss_before = rss_bytes(b.pid)
        flood(60_000)
        wait_until(lambda: counters(b)["Datagrams received"] >= received_before + 30_000, 30, "the flood read")
        rss_after = rss_bytes(b.pid)
    # 60,000 unknown sessions kept for good cost ~12 MB; bounded, nothing grows
    assert rss_after - rss_before < 6 * 1024 * 1024, (rss_before, rss_after)
    assert b.errors() == []


# -- item 5 -----------------------------------------------------------------------------------------------
def test_frames_for_a_session_from_another_address_are_dropped_as_spoofed(
    driver_factory: DriverSet, raw: socket.socket
) -> None:
    """Before: forged DATA at the receive position was delivered as the session's (the real frame
    then dropped as a duplicate), and a forged end-of-stream heartbeat ended the image."""
    a, b = driver_factory(base=BASE_ARGS), driver_factory(base=BASE_ARGS)
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    port = int(channel.rsplit(":", 1)[1])
    with Aeron.connect(Context(dir=a.dir)) as sender, Aeron.connect(Context(dir=b.dir)) as receiver:
        sub: Subscription = receiver.add_subscription(channel, 25)
        pub = sender.add_publication(channel, 25)
        wait_until(lambda: pub.is_connected and bool(sub.images), 10, "connection")
        got: list[bytes] = []

        def poll() -> Any:
            return sub.poll(lambda buffer, header: got.append(bytes(buffer)), 100)

        assert pub.offer(b"first") > 0
        wait_until(lambda: (poll(), got == [b"first"])[1], 10, "the first message")
        image = sub.images[0]
        position = image.position
        term_id = image.initial_term_id + position // image.term_length
        term_offset = position % image.term_length
        target = ("127.0.0.1", port)
        raw.sendto(DataFrame(term_offset, pub.session_id, 25, term_id, b"forged").encode(), target)
        raw.sendto(
            HeartbeatFrame(term_offset, pub.session_id, 25, term_id, flags=dh.BEGIN_END_AND_EOS_FLAGS).encode(),
            target,
        )
        control = tuple(image.source_identity.rsplit(":", 1))
        # at the sender: an SM that would open the window wide, from an address that is not the receiver's
        raw.sendto(
            StatusMessageFrame(pub.session_id, 25, term_id, term_offset, 512 * 1024, 5).encode(),
            (control[0], int(control[1])),
        )
        wait_until(lambda: counters(b)[SPOOFED] >= 2 and counters(a)[SPOOFED] >= 1, 10, "spoofed frames counted")
        assert pub.offer(b"second") > 0
        wait_until(lambda: (poll(), len(got) >= 2)[1], 10, "the second message")
        assert got == [b"first", b"second"]
        assert not image.is_end_of_stream
        assert stream(pub, [sub], 500, 60) == [list(range(500))]  # the image is still live
    assert a.errors() == [] and b.errors() == []
