"""Property tests of the log: what goes in through a publication comes out of an image, intact.

Each example builds a fresh standalone log (64 KiB terms, an MTU drawn from 64 to 8192 bytes),
optionally moved with ``seek_to`` to a later term and to a term offset close to the end of the
term, so that the few dozen messages of an example still pad and rotate; the initial term id is
drawn too, including values whose term ids wrap past 2^31 - 1. Messages of 0..3 MTU payloads
(now and then exactly the max message length) go in through ``offer``, ``try_claim`` and
``offer_batch`` on concurrent and exclusive publications; a subscriber polls them out through a
:class:`FragmentAssembler`, sometimes between offers with a small fragment limit, so that
messages are reassembled across polls.

An independent model of the appender (:class:`TailModel`: align, fragment, pad to the end of
the term when a claim does not fit, rotate) predicts the position every append must return,
and each delivered message is checked against it: bytes, order, reserved value, term id,
header position, fragment flags. The last tests check the pure term functions
(``term_append_unfragmented``, ``term_read``, ``term_scan_block``) and the position arithmetic.
"""

from __future__ import annotations

import mmap
import random
import struct
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from logbuf import native
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.logbuffer.fragment_assembler import FragmentAssembler
from logbuf.logbuffer.image import Header, Image
from logbuf.logbuffer.publication import BufferClaim, OfferResult
from logbuf.logbuffer.standalone import StreamLog

TERM_LENGTH = 64 * 1024
MAX_MESSAGE_LENGTH = dh.compute_max_message_length(TERM_LENGTH)  # 8 KiB
MTUS = [64, 96, 128, 256, 1408, 4096, 8192]
INITIAL_TERM_IDS = [0, 1, -7, 123_456, 2**31 - 1, 2**31 - 2, -(2**31)]

PROPERTY_SETTINGS = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


# -- helpers -------------------------------------------------------------------------------------
@contextmanager
def stream_log(
    *, mtu_length: int, initial_term_id: int = 0, term_count: int = 0, start_offset: int = 0
) -> Iterator[StreamLog]:
    """A fresh standalone log, moved to ``term_count`` terms in at ``start_offset``; unlinked after."""
    name = f"t-prop-{uuid.uuid4().hex[:12]}"
    log = StreamLog.create(
        name,
        term_length=TERM_LENGTH,
        mtu_length=mtu_length,
        initial_term_id=initial_term_id,
        session_id=4242,
        stream_id=7,
    )
    try:
        if term_count or start_offset:
            log.log.seek_to(lbd._int32(initial_term_id + term_count), start_offset)
        yield log
    finally:
        StreamLog.unlink_name(name)  # first: a failed example may leave views that make close() raise
        log.close()


def message_body(index: int, length: int) -> bytes:
    return random.Random(index * 7919 + length).randbytes(length)


def claim_length(length: int, max_payload: int) -> int:
    """Aligned bytes one message takes in a term (computed from the descriptor, not the native code)."""
    if length <= max_payload:
        return dh.align(length + dh.HEADER_LENGTH)
    return dh.compute_fragmented_length(length, max_payload)


def fragment_count(length: int, max_payload: int) -> int:
    return max(1, -(-length // max_payload))


@dataclass
class TailModel:
    """Where the appender must put the next claim: pad and rotate when it does not fit the term."""

    tail: int
    padded_terms: list[int] = field(default_factory=list)

    def append(self, length: int) -> int:
        assert length <= TERM_LENGTH
        offset = self.tail % TERM_LENGTH
        if offset + length > TERM_LENGTH:
            if offset < TERM_LENGTH:
                self.padded_terms.append(self.tail // TERM_LENGTH)
            self.tail += TERM_LENGTH - offset
        self.tail += length
        return self.tail


@dataclass(frozen=True)
class Delivered:
    body: bytes
    reserved_value: int
    position: int
    term_id: int
    session_id: int
    stream_id: int


class Subscriber:
    """An image read through one long-lived FragmentAssembler, checking every raw fragment."""

    def __init__(self, image: Image, max_payload: int) -> None:
        self.image = image
        self.max_payload = max_payload
        self.messages: list[Delivered] = []
        self.fragments: list[tuple[int, int, int]] = []  # (flags, type, payload length)
        self.assembler = FragmentAssembler(self._on_message)

    def _on_fragment(self, buffer: memoryview, header: Header) -> None:
        self.fragments.append((header.flags, header.type, len(buffer)))
        assert len(buffer) == header.frame_length - dh.HEADER_LENGTH
        assert header.term_offset == header.frame_offset
        self.assembler(buffer, header)

    def _on_message(self, buffer: memoryview, header: Header) -> None:
        self.messages.append(
            Delivered(
                bytes(buffer),
                header.reserved_value,
                header.position,
                header.term_id,
                header.session_id,
                header.stream_id,
            )
        )

    def poll(self, fragment_limit: int) -> int:
        return self.image.poll(self._on_fragment, fragment_limit)

    def drain(self, to_position: int, fragment_limit: int = 64) -> None:
        """Poll until the image reaches ``to_position`` (a poll over padding alone reads 0 fragments)."""
        for _ in range(10_000):
            if self.image.position >= to_position:
                break
            self.poll(fragment_limit)
        assert self.image.position == to_position


def offer_until_accepted(attempt: Callable[[], int], subscriber: Subscriber, tail: Callable[[], int]) -> int:
    """Run ``attempt`` (an offer or claim); if back-pressured, drain the subscriber and try once more."""
    result = attempt()
    if result == OfferResult.BACK_PRESSURED:
        subscriber.drain(tail())
        result = attempt()
    assert result > 0, f"append failed with {OfferResult(result)!r}"
    return result


# -- strategies ------------------------------------------------------------------------------------
@st.composite
def log_setup(draw: st.DrawFn) -> dict[str, int]:
    mtu = draw(st.sampled_from(MTUS))
    term_count = draw(st.integers(0, 4))
    # Start anywhere, but usually within a few KiB of the end of the term so that it pads and rotates.
    near_end = st.integers(0, 2048 // 32).map(lambda k: TERM_LENGTH - 32 * k)
    anywhere = st.integers(0, TERM_LENGTH // 32).map(lambda k: 32 * k)
    start_offset = draw(st.one_of(near_end, near_end, near_end, anywhere))
    return {
        "mtu_length": mtu,
        "initial_term_id": draw(st.sampled_from(INITIAL_TERM_IDS)),
        "term_count": term_count,
        "start_offset": start_offset,
    }


def message_lengths(mtu: int, max_size: int = 60) -> st.SearchStrategy[list[int]]:
    max_payload = dh.compute_max_payload_length(mtu)
    small = st.integers(0, min(3 * max_payload, MAX_MESSAGE_LENGTH))
    edges = st.sampled_from(
        sorted(
            {
                0,
                1,
                max_payload - 1,
                max_payload,
                min(max_payload + 1, MAX_MESSAGE_LENGTH),
                MAX_MESSAGE_LENGTH - 1,
                MAX_MESSAGE_LENGTH,
            }
        )
    )
    return st.lists(st.one_of(small, small, small, edges), min_size=1, max_size=max_size)


# -- round trips through a publication and an image --------------------------------------------------
def check_delivered(
    sub: Subscriber, sent: list[tuple[bytes, int]], expected_positions: list[int], initial_term_id: int
) -> None:
    assert [m.body for m in sub.messages] == [body for body, _ in sent]
    assert [m.reserved_value for m in sub.messages] == [reserved for _, reserved in sent]
    assert [m.position for m in sub.messages] == expected_positions
    for message in sub.messages:
        last_frame_start = message.position - 1  # the message's last frame lies in the term before its end
        assert message.term_id == lbd.compute_term_id_from_position(last_frame_start, 16, initial_term_id)
        assert (message.session_id, message.stream_id) == (4242, 7)


@PROPERTY_SETTINGS
@given(setup=log_setup(), exclusive=st.booleans(), data=st.data())
def test_offered_messages_come_back_byte_identical_in_order_at_the_offered_positions(
    setup: dict[str, int], exclusive: bool, data: st.DataObject
) -> None:
    mtu = setup["mtu_length"]
    max_payload = dh.compute_max_payload_length(mtu)
    lengths = data.draw(message_lengths(mtu), label="lengths")
    polls_between = data.draw(
        st.lists(st.integers(0, 3), min_size=len(lengths), max_size=len(lengths)),
        label="fragment limit of a poll after each offer (0: none)",
    )
    with stream_log(**setup) as log:
        image = log.add_subscriber()
        start = image.position
        assert start == lbd.compute_position(
            lbd._int32(setup["initial_term_id"] + setup["term_count"]),
            setup["start_offset"],
            16,
            setup["initial_term_id"],
        )
        pub = log.add_publication(exclusive=exclusive)
        assert pub.position == start and pub.max_payload_length == max_payload
        sub = Subscriber(image, max_payload)
        model = TailModel(start)
        sent: list[tuple[bytes, int]] = []
        returned: list[int] = []
        for index, (length, poll_limit) in enumerate(zip(lengths, polls_between)):
            body = message_body(index, length)
            result = offer_until_accepted(lambda: pub.offer(body, index), sub, lambda: pub.position)
            assert result == model.append(claim_length(length, max_payload))
            assert pub.position == result == log.log.tail_position()
            sent.append((body, index))
            returned.append(result)
            if poll_limit:
                sub.poll(poll_limit)  # may stop mid-message: the assembler carries it to the next poll
        sub.drain(returned[-1])
        check_delivered(sub, sent, returned, setup["initial_term_id"])
        assert all(type_ == dh.HDR_TYPE_DATA for _, type_, _ in sub.fragments)  # padding is never delivered
        assert len(sub.fragments) == sum(fragment_count(n, max_payload) for n in lengths)
        assert image.position == pub.position == log.log.tail_position() == model.tail
        assert image.position - start == sum(claim_length(n, max_payload) for n in lengths) + sum(
            (TERM_LENGTH - (p % TERM_LENGTH)) % TERM_LENGTH for p in _pad_starts(start, lengths, max_payload)
        )
        assert image.poll(sub._on_fragment, 10) == 0 and image.position == model.tail  # nothing twice
        event(f"terms padded and rotated: {min(len(model.padded_terms), 2)}+")
        event(f"fragmented messages: {any(n > max_payload for n in lengths)}")


def _pad_starts(start: int, lengths: list[int], max_payload: int) -> list[int]:
    """Tail positions at which a claim did not fit the rest of its term (the rest became padding)."""
    starts, tail = [], start
    for n in lengths:
        claim = claim_length(n, max_payload)
        if tail % TERM_LENGTH + claim > TERM_LENGTH:
            starts.append(tail)
            tail += TERM_LENGTH - tail % TERM_LENGTH
        tail += claim
    return starts


@PROPERTY_SETTINGS
@given(setup=log_setup(), exclusive=st.booleans(), data=st.data())
def test_fragments_carry_begin_and_end_flags_and_reassemble_across_single_fragment_polls(
    setup: dict[str, int], exclusive: bool, data: st.DataObject
) -> None:
    mtu = setup["mtu_length"]
    max_payload = dh.compute_max_payload_length(mtu)
    lengths = data.draw(message_lengths(mtu, max_size=12), label="lengths")
    with stream_log(**setup) as log:
        sub = Subscriber(log.add_subscriber(), max_payload)
        pub = log.add_publication(exclusive=exclusive)
        bodies = [message_body(i, n) for i, n in enumerate(lengths)]
        end = 0
        for i, body in enumerate(bodies):
            end = offer_until_accepted(lambda: pub.offer(body, i), sub, lambda: pub.position)
        for _ in range(100_000):  # one fragment per poll: every fragmented message spans polls
            if sub.image.position >= end:
                break
            sub.poll(1)
        assert [m.body for m in sub.messages] == bodies
        # Flags per message: B|E alone, or B, middles with no flag, E.
        flags = [f & dh.UNFRAGMENTED for f, _, _ in sub.fragments]
        expected_flags: list[int] = []
        expected_lengths: list[int] = []
        for n in lengths:
            count = fragment_count(n, max_payload)
            if count == 1:
                expected_flags.append(dh.UNFRAGMENTED)
                expected_lengths.append(n)
            else:
                expected_flags += [dh.BEGIN_FLAG] + [0] * (count - 2) + [dh.END_FLAG]
                expected_lengths += [max_payload] * (count - 1) + [n - max_payload * (count - 1)]
        assert flags == expected_flags
        assert [n for _, _, n in sub.fragments] == expected_lengths


@settings(max_examples=15, deadline=None, database=None)
@given(
    setup=log_setup(),
    exclusive=st.booleans(),
    lengths=st.lists(st.integers(2048, MAX_MESSAGE_LENGTH), min_size=40, max_size=80),
)
def test_a_stream_of_several_terms_reuses_every_partition_and_loses_nothing(
    setup: dict[str, int], exclusive: bool, lengths: list[int]
) -> None:
    """Enough data to go round the three partitions: cleaning and reuse must not corrupt anything."""
    max_payload = dh.compute_max_payload_length(setup["mtu_length"])
    with stream_log(**setup) as log:
        sub = Subscriber(log.add_subscriber(), max_payload)
        pub = log.add_publication(exclusive=exclusive)
        start = pub.position
        model = TailModel(start)
        bodies = [message_body(i, n) for i, n in enumerate(lengths)]
        positions = []
        for i, body in enumerate(bodies):
            result = offer_until_accepted(lambda: pub.offer(body, i), sub, lambda: pub.position)
            assert result == model.append(claim_length(len(body), max_payload))
            positions.append(result)
        sub.drain(model.tail)
        assert [m.body for m in sub.messages] == bodies
        assert [m.position for m in sub.messages] == positions
        assert model.tail - start > TERM_LENGTH  # at least one rotation (usually three or more)
        assert log.log.active_term_count() == (positions[-1] - 1) // TERM_LENGTH  # the last claim's term
        event(f"partitions reused: {(model.tail - start) // TERM_LENGTH >= 3}")


@st.composite
def operations(draw: st.DrawFn, max_payload: int) -> list[tuple[str, Any]]:
    """A mix of offers, claims (committed or aborted) and batches, each valid for the log."""
    small = st.integers(0, min(max_payload, 600))
    op = st.one_of(
        st.tuples(st.just("offer"), st.integers(0, min(3 * max_payload, MAX_MESSAGE_LENGTH))),
        st.tuples(st.just("claim"), st.tuples(st.integers(0, max_payload), st.booleans(), st.booleans())),
        st.tuples(st.just("batch"), st.lists(small, min_size=0, max_size=12)),
    )
    ops = draw(st.lists(op, min_size=1, max_size=40))
    fixed: list[tuple[str, Any]] = []
    for kind, arg in ops:
        if kind == "batch":  # keep a batch within max_message_length when framed
            batch, total = [], 0
            for n in arg:
                if total + dh.align(n + dh.HEADER_LENGTH) > MAX_MESSAGE_LENGTH:
                    break
                batch.append(n)
                total += dh.align(n + dh.HEADER_LENGTH)
            arg = batch
        fixed.append((kind, arg))
    return fixed


@PROPERTY_SETTINGS
@given(setup=log_setup(), exclusive=st.booleans(), data=st.data())
def test_offer_try_claim_and_offer_batch_interleave_and_come_back_in_order(
    setup: dict[str, int], exclusive: bool, data: st.DataObject
) -> None:
    mtu = setup["mtu_length"]
    max_payload = dh.compute_max_payload_length(mtu)
    ops = data.draw(operations(max_payload), label="operations")
    with stream_log(**setup) as log:
        sub = Subscriber(log.add_subscriber(), max_payload)
        pub = log.add_publication(exclusive=exclusive)
        model = TailModel(pub.position)
        claim = BufferClaim()
        sent: list[tuple[bytes, int]] = []
        positions: list[int] = []
        serial = 0
        for kind, arg in ops:
            serial += 1
            if kind == "offer":
                body = message_body(serial, arg)
                result = offer_until_accepted(lambda: pub.offer(body, serial), sub, lambda: pub.position)
                assert result == model.append(claim_length(arg, max_payload))
                sent.append((body, serial))
                positions.append(result)
            elif kind == "claim":
                length, commit, use_context = arg
                body = message_body(serial, length)
                result = offer_until_accepted(lambda: pub.try_claim(length, claim), sub, lambda: pub.position)
                assert result == model.append(claim_length(length, max_payload))
                assert claim.length == length and len(claim.buffer) == length
                claim.buffer[:] = body
                claim.reserved_value = serial
                if use_context and commit:
                    with claim:
                        pass
                elif commit:
                    claim.commit()
                else:
                    claim.abort()
                if commit:
                    sent.append((body, serial))
                    positions.append(result)
            else:
                bodies = [message_body(serial * 1000 + i, n) for i, n in enumerate(arg)]
                before = pub.position
                if not bodies:
                    assert pub.offer_batch(bodies, serial) == before  # an empty batch appends nothing
                    continue
                result = offer_until_accepted(lambda: pub.offer_batch(bodies, serial), sub, lambda: pub.position)
                assert result == model.append(sum(dh.align(n + dh.HEADER_LENGTH) for n in arg))
                # all-or-nothing in one claim: the batch's frames are contiguous, in one term
                frame_end = result - sum(dh.align(n + dh.HEADER_LENGTH) for n in arg)
                assert frame_end // TERM_LENGTH == (result - 1) // TERM_LENGTH
                for body, n in zip(bodies, arg):
                    frame_end += dh.align(n + dh.HEADER_LENGTH)
                    sent.append((body, serial))
                    positions.append(frame_end)
            assert pub.position == model.tail == log.log.tail_position()
        sub.drain(model.tail)
        assert [m.body for m in sub.messages] == [b for b, _ in sent]
        assert [m.reserved_value for m in sub.messages] == [r for _, r in sent]
        assert [m.position for m in sub.messages] == positions
        assert all(type_ == dh.HDR_TYPE_DATA for _, type_, _ in sub.fragments)


@PROPERTY_SETTINGS
@given(setup=log_setup(), data=st.data())
def test_two_concurrent_publications_interleave_and_two_subscribers_both_see_everything(
    setup: dict[str, int], data: st.DataObject
) -> None:
    mtu = setup["mtu_length"]
    max_payload = dh.compute_max_payload_length(mtu)
    lengths = data.draw(message_lengths(mtu, max_size=40), label="lengths")
    which = data.draw(st.lists(st.integers(0, 1), min_size=len(lengths), max_size=len(lengths)), label="publisher")
    with stream_log(**setup) as log:
        subs = [Subscriber(log.add_subscriber(), max_payload) for _ in range(2)]
        pubs = [log.add_publication(), log.add_publication()]
        model = TailModel(pubs[0].position)
        sent, positions = [], []

        def drain_all() -> None:
            for sub in subs:
                sub.drain(pubs[0].position)

        for i, (n, p) in enumerate(zip(lengths, which)):
            body = message_body(i, n)
            result = pubs[p].offer(body, i)
            if result == OfferResult.BACK_PRESSURED:
                drain_all()
                result = pubs[p].offer(body, i)
            assert result == model.append(claim_length(n, max_payload))
            assert pubs[0].position == pubs[1].position == result  # one shared tail
            sent.append(body)
            positions.append(result)
        for sub in subs:
            sub.drain(model.tail)
            assert [m.body for m in sub.messages] == sent
            assert [m.position for m in sub.messages] == positions
            assert [m.reserved_value for m in sub.messages] == list(range(len(lengths)))


@PROPERTY_SETTINGS
@given(setup=log_setup(), data=st.data())
def test_block_poll_hands_over_the_exact_frames_and_never_mixes_padding_with_data(
    setup: dict[str, int], data: st.DataObject
) -> None:
    mtu = setup["mtu_length"]
    max_payload = dh.compute_max_payload_length(mtu)
    lengths = data.draw(message_lengths(mtu, max_size=30), label="lengths")
    block_limit = data.draw(st.integers(mtu, 3 * TERM_LENGTH // 4), label="block_length_limit (>= one MTU)")
    with stream_log(**setup) as log:
        image = log.add_subscriber()
        pub = log.add_publication(exclusive=data.draw(st.booleans(), label="exclusive"))
        bodies = [message_body(i, n) for i, n in enumerate(lengths)]
        frames: list[tuple[int, bytes]] = []  # (flags, payload) of data frames, in order
        blocks: list[tuple[int, int]] = []
        pads = 0

        def on_block(block: memoryview, term_offset: int, session_id: int, term_id: int) -> None:
            nonlocal pads
            assert session_id == 4242
            assert len(block) <= block_limit or _is_pad(block)
            blocks.append((term_offset, len(block)))
            offset, n_data = 0, 0
            while offset < len(block):
                frame_length, _v, flags, type_, frame_term_offset, _s, _st, frame_term_id, _r = dh.HEADER.unpack_from(
                    block, offset
                )
                assert frame_term_offset == term_offset + offset and frame_term_id == term_id
                if type_ == dh.HDR_TYPE_PAD:
                    assert offset == 0 and dh.align(frame_length) == len(block)  # a padding block stands alone
                    dh.check_frame(block[: dh.HEADER_LENGTH])
                    pads += 1
                else:
                    dh.check_frame(block[offset : offset + frame_length])
                    frames.append((flags, bytes(block[offset + dh.HEADER_LENGTH : offset + frame_length])))
                    n_data += 1
                offset += dh.align(frame_length)
            assert offset == len(block)
            assert native.count_frames(block) == n_data
            assert native.count_frames(block, include_padding=True) == n_data + (1 if _is_pad(block) else 0)

        end = image.position
        for i, body in enumerate(bodies):
            result = pub.offer(body, i)
            while result == OfferResult.BACK_PRESSURED:
                assert image.block_poll(on_block, block_limit) > 0
                result = pub.offer(body, i)
            assert result > 0
            end = result
        for _ in range(10_000):
            if image.position >= end:
                break
            assert image.block_poll(on_block, block_limit) > 0
        assert image.position == end
        # Rebuild messages from the frames' flags, as an assembler would.
        messages, partial = [], b""
        for flags, payload in frames:
            if flags & dh.BEGIN_FLAG:
                partial = b""
            partial += payload
            if flags & dh.END_FLAG:
                messages.append(partial)
        assert messages == bodies
        assert pads == sum(1 for p in _pad_starts(_start(setup), lengths, max_payload) if p % TERM_LENGTH)


def _start(setup: dict[str, int]) -> int:
    return setup["term_count"] * TERM_LENGTH + setup["start_offset"]


def _is_pad(block: memoryview) -> bool:
    return (
        len(block) >= dh.HEADER_LENGTH and struct.unpack_from("<H", block, dh.TYPE_FIELD_OFFSET)[0] == dh.HDR_TYPE_PAD
    )


def test_a_batch_of_more_than_128_mixed_bytes_likes_round_trips() -> None:
    """Over 128 messages the batch takes its scratch path; bytearrays and memoryviews are borrowed."""
    raw = [message_body(i, 5) if i % 8 == 0 else b"" for i in range(200)]
    batch: list[Any] = [m if i % 3 == 0 else bytearray(m) if i % 3 == 1 else memoryview(m) for i, m in enumerate(raw)]
    with stream_log(mtu_length=1408) as log:
        sub = Subscriber(log.add_subscriber(), 1376)
        pub = log.add_publication()
        end = pub.offer_batch(batch, 3)
        assert end == 25 * 64 + 175 * 32 == pub.position
        sub.drain(end, fragment_limit=1000)
        assert [m.body for m in sub.messages] == raw
        assert {m.reserved_value for m in sub.messages} == {3}
        assert sub.messages[-1].position == end


# -- pure term functions -----------------------------------------------------------------------------
@contextmanager
def bare_term() -> Iterator[tuple[memoryview, memoryview, mmap.mmap]]:
    """One 64 KiB term plus a metadata section, page-aligned (anonymous mapping)."""
    mm = mmap.mmap(-1, TERM_LENGTH + lbd.LOG_META_DATA_LENGTH)
    view = memoryview(mm)
    term, meta = view[:TERM_LENGTH], view[TERM_LENGTH:]
    try:
        yield term, meta, mm
    finally:
        term.release()
        meta.release()
        view.release()
        mm.close()


@PROPERTY_SETTINGS
@given(
    lengths=st.lists(st.integers(0, 4000), min_size=1, max_size=80),
    term_id=st.integers(-(2**31), 2**31 - 1),
    fragment_limit=st.integers(1, 200),
)
def test_term_append_unfragmented_then_term_read_round_trips_and_pads_the_tripped_term(
    lengths: list[int], term_id: int, fragment_limit: int
) -> None:
    with bare_term() as (term, meta, _):
        struct.pack_into("<q", meta, 0, lbd.pack_tail(term_id, 0))
        template = dh.HEADER.pack(0, 0, dh.UNFRAGMENTED, dh.HDR_TYPE_DATA, 0, 99, 5, term_id, 0)
        appended: list[tuple[bytes, int]] = []
        tripped_at = None
        expected_offset = 0
        for i, n in enumerate(lengths):
            body = message_body(i, n)
            result = native.term_append_unfragmented(meta, 0, term, template, body, i)
            aligned = dh.align(n + dh.HEADER_LENGTH)
            if expected_offset + aligned > TERM_LENGTH:
                assert result == -2  # TERM_APPEND_FAILED: the caller must rotate
                tripped_at = expected_offset
                break
            expected_offset += aligned
            assert result == expected_offset
            appended.append((body, i))
        got: list[tuple[bytes, int, int, int]] = []
        header = Header()

        def handler(buffer: memoryview, h: Header) -> None:
            got.append((bytes(buffer), h.reserved_value, h.term_id, h.session_id))

        offset, total = 0, 0
        while True:
            fragments, offset = native.term_read(term, offset, handler, fragment_limit, header, term_id)
            assert fragments <= fragment_limit
            total += fragments
            if fragments == 0:
                break
        assert [(b, r) for b, r, _, _ in got] == appended
        assert all(t == term_id and s == 99 for _, _, t, s in got)
        assert total == len(appended)
        if tripped_at is not None:
            # the rest of the term is one padding frame, which term_read skips to the end of the term
            frame_length, _v, _f, type_, pad_offset, *_ = dh.HEADER.unpack_from(term, tripped_at)
            if tripped_at < TERM_LENGTH:
                assert (type_, frame_length, pad_offset) == (dh.HDR_TYPE_PAD, TERM_LENGTH - tripped_at, tripped_at)
            assert offset == TERM_LENGTH
            assert native.term_scan_block(term, tripped_at, TERM_LENGTH) == TERM_LENGTH
        else:
            assert offset == expected_offset
        assert native.term_scan_block(term, 0, TERM_LENGTH) == expected_offset  # stops before the padding


@settings(max_examples=50, deadline=None, database=None)
@given(
    initial_term_id=st.integers(-(2**31), 2**31 - 1),
    term_count=st.integers(0, 2**31 - 1),
    offset_units=st.integers(0, TERM_LENGTH // 32 - 1),
    shift=st.integers(16, 30),
)
def test_position_arithmetic_round_trips_through_term_ids_that_wrap(
    initial_term_id: int, term_count: int, offset_units: int, shift: int
) -> None:
    term_length = 1 << shift
    offset = 32 * offset_units % term_length
    term_id = lbd._int32(initial_term_id + term_count)
    position = lbd.compute_position(term_id, offset, shift, initial_term_id)
    assert position == (term_count << shift) + offset
    assert 0 <= position < lbd.max_possible_position(term_length)
    assert lbd.compute_term_id_from_position(position, shift, initial_term_id) == term_id
    assert lbd.index_by_position(position, shift) == lbd.index_by_term(initial_term_id, term_id) == term_count % 3
    raw = lbd.pack_tail(term_id, offset)
    assert (lbd.term_id(raw), lbd.term_offset(raw, term_length)) == (term_id, offset)
    assert -(2**63) <= raw < 2**63
