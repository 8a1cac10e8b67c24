"""ManyToOneRingBuffer over real shared mappings, with real producer processes."""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Iterator

import pytest

from logbuf import native
from logbuf.conduit import ring_buffer_descriptor as rd
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer, RingBufferUnblocker
from tests.logbuf._cnc_children import PRODUCER_MSG, PRODUCER_MSG_TYPE_ID, result_of, spawn

CAPACITY = 1024


def shared_file(path: str, length: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, length)
        return mmap.mmap(fd, length)
    finally:
        os.close(fd)


@pytest.fixture
def ring_file(tmp_path: object) -> Iterator[tuple[str, mmap.mmap]]:
    path = os.path.join(str(tmp_path), "ring.dat")
    mm = shared_file(path, CAPACITY + rd.TRAILER_LENGTH)
    yield path, mm


@pytest.fixture
def ring(ring_file: tuple[str, mmap.mmap]) -> ManyToOneRingBuffer:
    return ManyToOneRingBuffer(memoryview(ring_file[1]))


def drain(ring: ManyToOneRingBuffer, limit: int = 1000) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    while ring.read(lambda t, m: got.append((t, bytes(m))), limit):
        pass
    return got


def advance_to_1000(ring: ManyToOneRingBuffer) -> None:
    """Write 7 records of 128 bytes and one of 104: the tail ends 24 bytes before the end of the ring."""
    for _ in range(7):
        assert ring.write(1, b"x" * 120)
    assert ring.write(1, b"x" * 96)
    assert ring.producer_position() == 1000


def test_messages_come_out_in_order_with_their_type_ids(ring: ManyToOneRingBuffer) -> None:
    assert ring.capacity == CAPACITY and ring.max_msg_length == CAPACITY // 8
    assert ring.write(1, b"one")
    assert ring.write(2, bytearray(b"two!"))
    assert ring.write(3, memoryview(b"3333333333"))
    assert ring.write(4, b"")
    assert ring.producer_position() == 16 + 16 + 24 + 8
    assert ring.size() == 64
    got: list[tuple[int, bytes]] = []
    assert ring.read(lambda t, m: got.append((t, bytes(m)))) == 4
    assert got == [(1, b"one"), (2, b"two!"), (3, b"3333333333"), (4, b"")]
    assert ring.consumer_position() == ring.producer_position() == 64
    assert ring.size() == 0
    assert ring.read(lambda t, m: got.append((t, bytes(m)))) == 0


def test_read_honours_the_message_count_limit(ring: ManyToOneRingBuffer) -> None:
    for i in range(5):
        assert ring.write(1, bytes([i]))
    got: list[bytes] = []
    assert ring.read(lambda t, m: got.append(bytes(m)), 2) == 2
    assert got == [b"\x00", b"\x01"]
    assert ring.consumer_position() == 32
    assert ring.read(lambda t, m: got.append(bytes(m)), 10) == 3
    assert got == [bytes([i]) for i in range(5)]


def test_consumed_space_is_zeroed(ring: ManyToOneRingBuffer) -> None:
    assert ring.write(9, b"\xff" * 50)
    assert any(ring.buffer[:64])
    ring.read(lambda t, m: None)
    assert not any(ring.buffer[:CAPACITY])


def test_a_record_that_does_not_fit_before_the_end_wraps_after_a_padding_record(ring: ManyToOneRingBuffer) -> None:
    advance_to_1000(ring)
    assert len(drain(ring)) == 8
    assert ring.consumer_position() == 1000
    assert ring.write(2, b"y" * 30)  # 38 -> 40 bytes: does not fit in the last 24
    assert ring.producer_position() == 1000 + 24 + 40
    length, type_id = rd.RECORD_HEADER.unpack_from(ring.buffer, 1000)
    assert (length, type_id) == (24, rd.PADDING_MSG_TYPE_ID)
    assert rd.RECORD_HEADER.unpack_from(ring.buffer, 0) == (38, 2)
    got: list[tuple[int, bytes]] = []
    assert ring.read(lambda t, m: got.append((t, bytes(m)))) == 0  # reads to the end: only the padding
    assert ring.consumer_position() == 1024
    assert ring.read(lambda t, m: got.append((t, bytes(m)))) == 1
    assert got == [(2, b"y" * 30)]
    assert ring.consumer_position() == ring.producer_position() == 1064


def test_many_laps_of_varied_lengths_keep_order(ring: ManyToOneRingBuffer) -> None:
    sent: list[bytes] = []
    got: list[bytes] = []
    for i in range(2000):
        payload = bytes([i % 256]) * (i % 97)
        while not ring.write(1 + i % 5, payload):
            before = ring.consumer_position()
            ring.read(lambda t, m: got.append(bytes(m)), 7)  # may read only a padding record
            assert ring.consumer_position() > before
        sent.append(payload)
    got += [m for _, m in drain(ring)]
    assert got == sent
    assert ring.producer_position() > 20 * CAPACITY


def test_a_full_buffer_refuses_writes_until_the_consumer_reads(ring: ManyToOneRingBuffer) -> None:
    writes = 0
    while ring.write(1, b"z" * 120):  # 128-byte records
        writes += 1
    assert writes == CAPACITY // 128
    assert ring.size() == CAPACITY
    assert not ring.write(1, b"")
    assert ring.read(lambda t, m: None, 1) == 1
    assert ring.write(1, b"z" * 120)
    assert not ring.write(1, b"")


def test_a_wrap_needs_room_at_the_start_too(ring: ManyToOneRingBuffer) -> None:
    advance_to_1000(ring)
    assert ring.read(lambda t, m: None, 1) == 1  # head at 128: 128 bytes free at the start
    assert ring.write(1, b"a" * 8)  # 16 bytes fit before the end (1000..1016)
    assert ring.size() == 888  # 136 bytes free in all, but only 8 before the end and 128 at the start
    assert not ring.write(1, b"b" * 124)  # a 136-byte record fits in neither
    assert ring.write(1, b"b" * 112)  # 120 bytes fit at the start, after 8 bytes of padding
    assert ring.producer_position() == 1016 + 8 + 120


@pytest.mark.parametrize("msg_type_id", [0, -1, -5, 1 << 31])
def test_non_positive_type_ids_are_rejected(ring: ManyToOneRingBuffer, msg_type_id: int) -> None:
    with pytest.raises(ValueError, match=f"msg_type_id={msg_type_id} must be >= 1 and"):
        ring.write(msg_type_id, b"x")


def test_a_message_longer_than_an_eighth_of_the_capacity_is_rejected(ring: ManyToOneRingBuffer) -> None:
    assert ring.write(1, b"m" * 128)
    with pytest.raises(ValueError, match="message length=129 exceeds max_msg_length=128"):
        ring.write(1, b"m" * 129)


@pytest.mark.parametrize("length", [1000 + rd.TRAILER_LENGTH, 100, rd.TRAILER_LENGTH])
def test_the_capacity_must_be_a_power_of_two(length: int) -> None:
    with pytest.raises(ValueError, match=f"ring buffer capacity={length - rd.TRAILER_LENGTH} .* power of 2"):
        ManyToOneRingBuffer(memoryview(bytearray(length)))


def test_a_handler_error_still_consumes_the_records_handed_out(ring: ManyToOneRingBuffer) -> None:
    for i in range(4):
        assert ring.write(1, bytes([i]))
    seen: list[bytes] = []

    def handler(t: int, m: memoryview) -> None:
        seen.append(bytes(m))
        if len(seen) == 2:
            raise RuntimeError("handler failed")

    with pytest.raises(RuntimeError, match="handler failed"):
        ring.read(handler)
    assert ring.consumer_position() == 32  # both records handed out are consumed
    assert not any(ring.buffer[:32])
    assert ring.read(handler) == 2
    assert seen == [b"\x00", b"\x01", b"\x02", b"\x03"]


def test_the_view_given_to_a_handler_is_released_after_the_call(ring: ManyToOneRingBuffer) -> None:
    kept: list[memoryview] = []
    assert ring.write(1, b"abc")
    ring.read(lambda t, m: kept.append(m))
    with pytest.raises(ValueError, match="released"):
        bytes(kept[0])


def test_correlation_ids_are_unique_across_every_view_of_the_buffer(ring_file: tuple[str, mmap.mmap]) -> None:
    a = ManyToOneRingBuffer(memoryview(ring_file[1]))
    b = ManyToOneRingBuffer(memoryview(ring_file[1]))
    assert [a.next_correlation_id(), b.next_correlation_id(), a.next_correlation_id()] == [0, 1, 2]


def test_the_consumer_heartbeat_is_stored_in_the_trailer(ring: ManyToOneRingBuffer) -> None:
    assert ring.consumer_heartbeat_time() == 0
    ring.set_consumer_heartbeat_time(1_700_000_000_123)
    assert ring.consumer_heartbeat_time() == 1_700_000_000_123
    heartbeat = int.from_bytes(ring.buffer[CAPACITY + 640 : CAPACITY + 648], "little")
    assert heartbeat == 1_700_000_000_123


def test_unblock_pads_a_record_whose_producer_died_after_writing_its_negative_length(
    ring: ManyToOneRingBuffer,
) -> None:
    assert not ring.unblock()  # nothing to unblock when empty
    offset = ring._claim_capacity(rd.align(rd.HEADER_LENGTH + 20))  # a producer claims ...
    rd.record_length_fenced(ring.buffer, offset, -(rd.HEADER_LENGTH + 20))  # ... starts, then dies
    assert ring.write(5, b"after")
    assert ring.read(lambda t, m: None) == 0  # blocked behind the dead record
    assert ring.unblock()
    got = drain(ring)
    assert got == [(5, b"after")]
    assert ring.consumer_position() == ring.producer_position()


def test_unblock_pads_up_to_the_next_record_when_the_producer_died_before_writing_anything(
    ring: ManyToOneRingBuffer,
) -> None:
    ring._claim_capacity(rd.align(rd.HEADER_LENGTH + 30))  # claimed 40 bytes, never touched
    assert ring.write(6, b"next")
    assert ring.read(lambda t, m: None) == 0
    assert ring.unblock()
    assert rd.RECORD_HEADER.unpack_from(ring.buffer, 0) == (40, rd.PADDING_MSG_TYPE_ID)
    assert drain(ring) == [(6, b"next")]


def test_unblock_leaves_committed_records_alone(ring: ManyToOneRingBuffer) -> None:
    assert ring.write(1, b"fine")
    assert not ring.unblock()
    assert drain(ring) == [(1, b"fine")]


@pytest.mark.slow
def test_three_producer_processes_each_deliver_every_message_once_and_in_order(tmp_path: object) -> None:
    producers, count = 3, 20_000
    path = os.path.join(str(tmp_path), "mpsc.dat")
    mm = shared_file(path, 16 * 1024 + rd.TRAILER_LENGTH)  # small: many wraps and full rings
    ring = ManyToOneRingBuffer(memoryview(mm))
    procs = [spawn("ring_producer", path=path, producer_id=p, count=count, timeout_s=60.0) for p in range(producers)]
    next_seq = [0] * producers
    errors: list[str] = []

    def handler(msg_type_id: int, message: memoryview) -> None:
        producer_id, seq = PRODUCER_MSG.unpack_from(message)
        if msg_type_id != PRODUCER_MSG_TYPE_ID or seq != next_seq[producer_id]:
            errors.append(f"type {msg_type_id}, producer {producer_id}: got {seq}, expected {next_seq[producer_id]}")
        if bytes(message[PRODUCER_MSG.size :]) != bytes([producer_id]) * (seq % 23):
            errors.append(f"producer {producer_id} seq {seq}: corrupt filler")
        next_seq[producer_id] = seq + 1

    deadline = time.monotonic() + 60
    while ring.size() < ring.capacity - 40 and time.monotonic() < deadline - 50:
        time.sleep(0.001)  # a soft wait (no failure at its end): let the producers fill the ring first
    received = 0
    try:
        while received < producers * count:
            n = ring.read(handler, 256)
            received += n
            assert not errors, errors[:5]
            if n == 0:
                assert time.monotonic() < deadline, f"received {received} of {producers * count}: {next_seq}"
                if all(p.poll() is not None for p in procs) and ring.size() == 0:
                    break
                time.sleep(0.0002)  # pace: idle between empty reads
        results = [result_of(p, 30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert [r["written"] for r in results] == [count] * producers
    assert next_seq == [count] * producers
    assert received == producers * count
    assert ring.size() == 0 and ring.consumer_position() == ring.producer_position()
    assert ring.producer_position() > 50 * ring.capacity  # wrapped many times


# -- hostile producers: forged lengths, dead claims, moved positions -------------------
def forge_record(ring: ManyToOneRingBuffer, claimed: int, length: int, msg_type_id: int = 1) -> int:
    """Claim ``claimed`` bytes as a producer would, then commit a header that lies about the length."""
    offset = ring._claim_capacity(rd.align(claimed))
    assert offset >= 0
    rd.MSG_TYPE_ID.pack_into(ring.buffer, offset + rd.TYPE_OFFSET, msg_type_id)
    rd.record_length_ordered(ring.buffer, offset, length)
    return offset


@pytest.mark.parametrize(
    "length",
    [0x7FFFFFF0, CAPACITY + 8, 4, 1, rd.HEADER_LENGTH + CAPACITY // 8 + 1],
    ids=["huge", "past-the-ring", "shorter-than-a-header", "one", "longer-than-max-message"],
)
def test_a_record_whose_length_cannot_be_true_is_skipped_and_counted(ring: ManyToOneRingBuffer, length: int) -> None:
    skipped: list[tuple[int, int, int]] = []
    ring.invalid_record_handler = lambda offset, length, msg_type_id: skipped.append((offset, length, msg_type_id))
    assert ring.write(1, b"before")
    forge_record(ring, rd.HEADER_LENGTH, length)  # a header-only claim: the next record follows at once
    assert ring.write(2, b"after")
    assert drain(ring) == [(1, b"before"), (2, b"after")]
    assert skipped == [(16, length, 1)]
    assert ring.invalid_records == 1
    assert ring.consumer_position() == ring.producer_position()
    assert bytes(ring.buffer[:CAPACITY]) == bytes(CAPACITY)  # everything consumed is zeroed


def test_the_unknown_rest_of_a_lying_record_is_unblocked_like_a_dead_claim(ring: ManyToOneRingBuffer) -> None:
    """Where a lying record really ends is unknown: the reader skips its header only, and what follows
    (zeroes, as far as anyone can tell a claim nobody has started) waits for ``unblock``."""
    forge_record(ring, rd.HEADER_LENGTH + 200, 0x7FFFFFF0)
    assert ring.write(2, b"after")
    assert drain(ring) == []
    assert ring.invalid_records == 1 and ring.consumer_position() == rd.HEADER_LENGTH
    assert ring.unblock()
    assert drain(ring) == [(2, b"after")]
    assert ring.consumer_position() == ring.producer_position()


def test_random_bytes_after_a_lying_record_are_walked_past_to_the_next_record(ring: ManyToOneRingBuffer) -> None:
    """Negative lengths among them included: no producer writes -1_234_567_890, so none is waited for."""
    offset = forge_record(ring, rd.HEADER_LENGTH + 96, 0x7FFFFFF0)
    garbage = bytearray(os.urandom(96))
    for i in range(0, 96, rd.ALIGNMENT):  # every length slot: negative or too long, never plausible
        rd.RECORD_HEADER.pack_into(garbage, i, -1_234_567_890 if i % 16 else 0x40000000 + i, 5)
    ring.buffer[offset + rd.HEADER_LENGTH : offset + rd.HEADER_LENGTH + 96] = garbage
    assert ring.write(2, b"after")
    assert drain(ring) == [(2, b"after")]
    assert ring.invalid_records == 1  # one lying record, however many slots it left
    assert ring.consumer_position() == ring.producer_position()


def test_a_dead_claim_after_a_lying_record_is_still_waited_for(ring: ManyToOneRingBuffer) -> None:
    """A plausible negative length may be a producer mid-write: the walk stops there."""
    forge_record(ring, rd.HEADER_LENGTH, 3)
    offset = ring._claim_capacity(rd.align(rd.HEADER_LENGTH + 20))
    rd.record_length_fenced(ring.buffer, offset, -(rd.HEADER_LENGTH + 20))
    assert ring.read(lambda t, m: None) == 0
    assert ring.consumer_position() == offset
    rd.MSG_TYPE_ID.pack_into(ring.buffer, offset + rd.TYPE_OFFSET, 4)
    rd.record_length_ordered(ring.buffer, offset, rd.HEADER_LENGTH + 20)
    assert drain(ring) == [(4, bytes(20))]


def test_unblock_pads_one_slot_over_a_negative_length_no_producer_wrote(ring: ManyToOneRingBuffer) -> None:
    offset = ring._claim_capacity(64)
    rd.record_length_fenced(ring.buffer, offset, -(1 << 31))
    assert ring.read(lambda t, m: None) == 0
    assert ring.unblock()
    assert rd.RECORD_HEADER.unpack_from(ring.buffer, offset) == (rd.ALIGNMENT, rd.PADDING_MSG_TYPE_ID)


def test_the_reader_never_passes_the_producer_position(ring: ManyToOneRingBuffer) -> None:
    """Bytes beyond the tail were never claimed: a committed-looking record there is not read."""
    assert ring.write(1, b"real")
    stale = ring.producer_position()
    rd.MSG_TYPE_ID.pack_into(ring.buffer, stale + rd.TYPE_OFFSET, 3)
    rd.record_length_ordered(ring.buffer, stale, rd.HEADER_LENGTH + 4)
    assert drain(ring) == [(1, b"real")]
    assert ring.consumer_position() == stale


def test_unblock_pads_claims_never_started_all_the_way_to_the_tail(ring: ManyToOneRingBuffer) -> None:
    ring._claim_capacity(64)  # two producers claim and die before writing anything
    ring._claim_capacity(128)
    assert ring.read(lambda t, m: None) == 0
    assert ring.unblock()
    assert ring.read(lambda t, m: None) == 0
    assert ring.consumer_position() == ring.producer_position() == 192
    assert ring.write(4, b"works again")
    assert drain(ring) == [(4, b"works again")]


@pytest.mark.parametrize("tail_delta", [10 * CAPACITY, CAPACITY, -64], ids=["far-ahead", "a-lap-ahead", "behind"])
def test_unblock_repairs_a_tail_moved_out_of_place(ring: ManyToOneRingBuffer, tail_delta: int) -> None:
    assert ring.write(1, b"x")
    drain(ring)
    head = ring.consumer_position()
    native.put_int64_ordered(ring.buffer, CAPACITY + rd.TAIL_POSITION_OFFSET, head + tail_delta)
    assert ring.read(lambda t, m: None) == 0
    for _ in range(2):  # a whole lap of zeroes is two dead claims as far as anyone can tell: to the end, then on
        assert ring.unblock()
        assert ring.read(lambda t, m: None) == 0
        if ring.producer_position() == ring.consumer_position():
            break
    assert ring.producer_position() == ring.consumer_position()
    assert ring.write(5, b"producers can claim again")
    assert drain(ring) == [(5, b"producers can claim again")]


def test_the_unblocker_waits_for_a_stall_of_the_full_timeout(ring: ManyToOneRingBuffer) -> None:
    unblocker = RingBufferUnblocker(ring, timeout_ns=1_000)
    assert not unblocker.check(0)
    offset = ring._claim_capacity(rd.align(rd.HEADER_LENGTH + 20))
    rd.record_length_fenced(ring.buffer, offset, -(rd.HEADER_LENGTH + 20))
    assert ring.write(5, b"queued")
    assert not unblocker.check(10)  # the stall starts being timed here
    assert not unblocker.check(1_009)
    assert unblocker.check(1_010)
    assert drain(ring) == [(5, b"queued")]
    assert not unblocker.check(5_000)


def test_the_unblocker_does_not_count_idle_time_as_a_stall(ring: ManyToOneRingBuffer) -> None:
    unblocker = RingBufferUnblocker(ring, timeout_ns=1_000)
    assert not unblocker.check(0)
    assert not unblocker.check(1_000_000)  # an idle ring for a long time
    offset = ring._claim_capacity(rd.align(rd.HEADER_LENGTH + 4))  # a producer is mid-write right now
    assert not unblocker.check(1_000_001)
    rd.MSG_TYPE_ID.pack_into(ring.buffer, offset + rd.TYPE_OFFSET, 9)
    ring.buffer[offset + rd.HEADER_LENGTH : offset + rd.HEADER_LENGTH + 4] = b"late"
    rd.record_length_ordered(ring.buffer, offset, rd.HEADER_LENGTH + 4)
    assert not unblocker.check(1_000_002)
    assert drain(ring) == [(9, b"late")]
