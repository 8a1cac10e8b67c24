"""The UDP protocol core without sockets: two media drivers stepped by hand on one thread and one fake
clock, joined by a seeded lossy, duplicating, reordering in-memory link.

Everything the driver runs is real (the conductors taking commands from their CnC rings, the
proxies, the sender and receiver agents, each endpoint's ``on_datagram`` dispatch, the network
publication and the publication image); only the transport is swapped, through the driver
context's ``udp_transport``. The sender's datagrams take the per-datagram path
(``NetworkPublication`` without the socket's ``sendmmsg`` batch). The clients are the real client too,
on the same fake clock and thread (:func:`logbuf.testing.stepped.stepped_client_context`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.client import Aeron, FragmentAssembler
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersReader
from logbuf.conduit.loss_report import LossReportFile
from logbuf.driver.system_counters import SystemCounterId
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.image import Image
from logbuf.protocol import DataFrame, ErrorFrame, NakFrame, SetupFrame, StatusMessageFrame, status
from logbuf.testing.clock import FakeClock
from logbuf.testing.link import LinkNetwork
from logbuf.testing.stepped import SteppedDriver, stepped_client_context

TERM = 64 * 1024
MTU = 1408
STREAM = 5
STEP_NS = 50_000
HOUR_NS = 3600 * 1_000_000_000
ENDPOINT = ("127.0.0.1", 40123)
SUBSCRIPTION_CHANNEL = f"aeron:udp?endpoint={ENDPOINT[0]}:{ENDPOINT[1]}"
PUBLICATION_CHANNEL = (  # starts two terms before the int32 term id wraps
    f"{SUBSCRIPTION_CHANNEL}|mtu={MTU}|init-term-id=2147483646|term-id=2147483646|term-offset=0"
)


class Pair:
    """Driver A publishes, driver B subscribes; both on one fake clock and one link network."""

    def __init__(self, workdir: str, network: LinkNetwork) -> None:
        self.clock = FakeClock()
        self.network = network
        common = dict(
            udp_transport=network.transport,
            term_length=TERM,
            mtu=MTU,
            initial_window_length=TERM // 2,
            nak_retry_delay_ns=1_000_000,
            client_liveness_timeout_ns=HOUR_NS,
            image_liveness_timeout_ns=HOUR_NS,
        )
        self.a = SteppedDriver(os.path.join(workdir, "a"), self.clock, **common)
        self.b = SteppedDriver(os.path.join(workdir, "b"), self.clock, **common)
        # the real client, on the same clock: a command it sends steps both drivers until the answer comes
        self.publisher = Aeron.connect(stepped_client_context(self.a.driver.ctx.dir, self.clock, self.step))
        self.subscriber = Aeron.connect(stepped_client_context(self.b.driver.ctx.dir, self.clock, self.step))

    def step(self) -> None:
        self.clock.advance(STEP_NS)
        self.a.do_work()
        self.b.do_work()

    def count(self, counter_id: SystemCounterId) -> int:
        return self.a.counter(counter_id) + self.b.counter(counter_id)

    def close(self) -> None:
        self.publisher.close()
        self.subscriber.close()
        self.a.close()
        self.b.close()


@contextmanager
def pair(drop: float = 0.0, duplicate: float = 0.0, reorder: float = 0.0, seed: int = 0) -> Iterator[Pair]:
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as workdir:
        p = Pair(workdir, LinkNetwork(seed, drop, duplicate, reorder))
        try:
            yield p
        finally:
            p.close()


def run(
    p: Pair, messages: list[bytes], reliable: bool = True, max_steps: int = 200_000
) -> tuple[list[bytes], Image | None]:
    """Subscribe on B, publish ``messages`` on A (exclusive), step until all arrived (or, unreliable,
    were consumed or skipped as lost); returns what the subscriber got and its image."""
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda buffer, header: got.append(bytes(buffer)))
    subscription = p.subscriber.add_subscription(SUBSCRIPTION_CHANNEL + ("" if reliable else "|reliable=false"), STREAM)
    publication = p.publisher.add_exclusive_publication(PUBLICATION_CHANNEL, STREAM)
    image: Image | None = None
    sent = 0
    for _ in range(max_steps):
        while sent < len(messages) and publication.is_connected and publication.offer(messages[sent]) > 0:
            sent += 1
        p.step()
        if image is None:
            p.subscriber.do_work()  # the client conductor hears of the image
            if subscription.images:
                (image,) = subscription.images
            continue
        image.poll(assembler, 100)
        if len(got) == len(messages):
            break
        if sent == len(messages) and image.position >= publication.position:
            break  # everything sent was consumed (or, unreliable, skipped as lost)
    return got, image


def messages_of(sizes: list[int]) -> list[bytes]:
    return [bytes([i & 0xFF]) * size for i, size in enumerate(sizes)]


def test_lossless_link_delivers_everything_with_setup_and_status_messages() -> None:
    messages = messages_of([(i * 97) % 4000 for i in range(2_000)])
    with pair() as p:
        got, _ = run(p, messages)
        assert got == messages
        assert p.a.counter(SystemCounterId.SETUPS_SENT) >= 1
        assert p.b.counter(SystemCounterId.SETUPS_RECEIVED) >= 1
        assert p.b.counter(SystemCounterId.STATUS_MESSAGES_SENT) > 0
        assert p.a.counter(SystemCounterId.STATUS_MESSAGES_RECEIVED) > 0
        assert p.count(SystemCounterId.NAK_MESSAGES_SENT) == 0
        assert p.count(SystemCounterId.INVALID_PACKETS) == 0


@settings(max_examples=12, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3 * MTU), min_size=1, max_size=2_500),
    seed=st.integers(0, 2**32),
    drop=st.sampled_from([0.0, 0.05, 0.2]),
    duplicate=st.sampled_from([0.0, 0.1]),
    reorder=st.sampled_from([0.0, 0.1]),
)
def test_a_faulty_link_still_delivers_every_message_once_in_order(
    sizes: list[int], seed: int, drop: float, duplicate: float, reorder: float
) -> None:
    messages = messages_of(sizes)
    with pair(drop, duplicate, reorder, seed) as p:
        got, _ = run(p, messages)
        assert got == messages
        if drop and sum(sizes) > 20 * TERM:
            assert p.a.counter(SystemCounterId.RETRANSMITS_SENT) > 0
        assert p.count(SystemCounterId.INVALID_PACKETS) == 0


def test_heavy_loss_with_duplicates_and_reordering_is_repaired_by_naks() -> None:
    """A 20 % loss link once stalled a sender whose NAKed gap lay a little over half a term behind it."""
    messages = messages_of([(i * 97) % 4000 for i in range(3_000)])
    with pair(0.2, 0.1, 0.1, seed=5) as p:
        got, _ = run(p, messages)
        assert got == messages
        assert p.b.counter(SystemCounterId.NAK_MESSAGES_SENT) > 0
        assert p.a.counter(SystemCounterId.NAK_MESSAGES_RECEIVED) > 0
        assert p.a.counter(SystemCounterId.RETRANSMITS_SENT) > 0


def test_each_nak_is_a_loss_observation_in_the_receivers_loss_report() -> None:
    """Aeron's on_gap_detected: the first NAK of an image makes its entry, every later one adds an
    observation and the gap's bytes; the entry names the image (session, stream, channel, source)."""
    messages = messages_of([(i * 97) % 4000 for i in range(1_000)])
    with pair(0.1, seed=3) as p:
        got, image = run(p, messages)
        assert got == messages and image is not None
        with LossReportFile.open(p.b.driver.ctx.dir) as report:
            [entry] = report.entries()
        with LossReportFile.open(p.a.driver.ctx.dir) as report:
            assert report.entries() == []  # the sender saw no loss
        naks = p.b.counter(SystemCounterId.NAK_MESSAGES_SENT)
        assert naks > 0 and entry.observation_count == naks
        assert naks * dh.FRAME_ALIGNMENT <= entry.total_bytes_lost <= naks * TERM // 2
        assert (entry.session_id, entry.stream_id) == (image.session_id, STREAM)
        assert entry.channel == SUBSCRIPTION_CHANNEL and entry.source == image.source_identity
        assert p.clock.epoch_ms() >= entry.last_observation_ms > entry.first_observation_ms > 0
        # the stream's own counters (Aeron's rcv-naks-sent, snd-naks-received, snd-bpe) agree with the system's
        assert stream_counter(p.b, cd.RECEIVER_NAKS_SENT_TYPE_ID) == naks
        assert stream_counter(p.a, cd.SENDER_NAKS_RECEIVED_TYPE_ID) == p.a.counter(
            SystemCounterId.NAK_MESSAGES_RECEIVED
        )
        bpe = stream_counter(p.a, cd.SENDER_BPE_TYPE_ID)
        assert bpe == p.a.counter(SystemCounterId.SENDER_FLOW_CONTROL_LIMITS) > 0  # a 32 KiB window, 1.9 MB sent


def stream_counter(driver: SteppedDriver, type_id: int) -> int:
    [value] = [
        c.value
        for c in CountersReader(driver.driver.cnc.counters_metadata, driver.driver.cnc.counters_values)
        if c.type_id == type_id
    ]
    return value


def test_a_lossless_link_leaves_the_loss_report_empty() -> None:
    messages = messages_of([100] * 200)
    with pair() as p:
        got, _ = run(p, messages)
        assert got == messages
        with LossReportFile.open(p.b.driver.ctx.dir) as report:
            assert report.entries() == []


def test_an_unreliable_image_fills_lost_data_with_padding_and_never_naks() -> None:
    """reliable=false: gaps become padding frames once the NAK delay passes; the subscriber gets the
    rest whole and in order, each message at most once, and the stream keeps up with the sender."""
    messages = [i.to_bytes(4, "little") + bytes(size) for i, size in enumerate((i * 97) % 4000 for i in range(3_000))]
    with pair(0.05, 0.05, 0.05, seed=11) as p:
        got, _ = run(p, messages, reliable=False)
        order = {m[:4]: i for i, m in enumerate(messages)}
        indexes = [order[m[:4]] for m in got]
        assert indexes == sorted(set(indexes)), "delivered out of order or twice"
        assert all(messages[i] == m for i, m in zip(indexes, got)), "a message came back partial"
        assert len(messages) // 2 < len(got) < len(messages)
        assert p.b.counter(SystemCounterId.LOSS_GAP_FILLS) > 0
        with LossReportFile.open(p.b.driver.ctx.dir) as report:
            [entry] = report.entries()  # a gap filled is loss observed, as in Aeron
        assert entry.observation_count >= p.b.counter(SystemCounterId.LOSS_GAP_FILLS)
        assert p.count(SystemCounterId.NAK_MESSAGES_SENT) == 0
        assert p.count(SystemCounterId.RETRANSMITS_SENT) == 0


def data(session_id: int, stream_id: int = STREAM) -> bytes:
    return DataFrame(0, session_id, stream_id, 0, b"x" * 100).encode()


def with_byte(datagram: bytes, offset: int, value: int) -> bytes:
    return datagram[:offset] + bytes([value]) + datagram[offset + 1 :]


SETUP = SetupFrame(0, 77, STREAM, 0, 0, TERM, MTU).encode()
DISPATCH_CASES: list[tuple[str, Callable[[], bytes], int]] = [
    ("empty", lambda: b"", 1),
    ("shorter than the common header", lambda: bytes(7), 1),
    ("a version other than 0", lambda: with_byte(SETUP, dh.VERSION_FIELD_OFFSET, 1), 1),
    ("an unknown frame type", lambda: with_byte(SETUP, dh.TYPE_FIELD_OFFSET, 0x0C), 1),
    ("a DATA header cut short", lambda: data(77)[:31], 1),
    ("a DATA frame whose length lies", lambda: data(77)[:40], 1),
    ("a SETUP with trailing bytes", lambda: SETUP + b"\0", 1),
    ("a SETUP with a bad term length", lambda: SetupFrame(0, 77, STREAM, 0, 0, 1000, MTU).encode(), 1),
    ("an SM meant for a sender, malformed", lambda: StatusMessageFrame(77, STREAM, 0, 0, 0, 1).encode()[:-1], 1),
    ("an SM meant for a sender", lambda: StatusMessageFrame(77, STREAM, 0, 0, 0, 1).encode(), 0),
    ("a NAK meant for a sender", lambda: NakFrame(77, STREAM, 0, 0, 32).encode(), 0),
    ("an ERR meant for a sender", lambda: ErrorFrame(77, STREAM, 1, 13, "rejected").encode(), 0),
    ("DATA of a stream nobody subscribed to", lambda: data(77, STREAM + 1), 0),
]


@pytest.mark.parametrize(("name", "datagram", "invalid"), DISPATCH_CASES, ids=[c[0] for c in DISPATCH_CASES])
def test_the_receive_endpoint_counts_and_drops_what_it_cannot_use(
    name: str, datagram: Callable[[], bytes], invalid: int
) -> None:
    with pair() as p:
        p.subscriber.add_subscription(SUBSCRIPTION_CHANNEL, STREAM)
        p.step()
        p.network.deliver(datagram(), ("127.0.0.1", 9), ENDPOINT)
        p.step()
        assert p.b.counter(SystemCounterId.INVALID_PACKETS) == invalid
        assert p.b.conductor.images == []


def test_data_of_an_unknown_session_elicits_a_setup_at_most_every_100_ms() -> None:
    with pair() as p:
        p.subscriber.add_subscription(SUBSCRIPTION_CHANNEL, STREAM)
        p.step()
        source = p.network.bind(("127.0.0.1", 0))
        for _ in range(3):
            source.send_to(data(77), ENDPOINT)
            p.step()
        (datagram, _), *more = source.inbound.take()
        assert more == []
        sm = status.decode(datagram)
        assert sm.elicits_setup and (sm.session_id, sm.stream_id) == (77, STREAM)
        p.clock.advance(100_000_000)
        source.send_to(data(77), ENDPOINT)
        p.step()
        assert len(source.inbound.take()) == 1
        assert p.b.counter(SystemCounterId.INVALID_PACKETS) == 0
