"""Broadcast transmitter and receivers over real shared mappings, one receiver in another process."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import pytest

from logbuf.conduit import broadcast_descriptor as bd
from logbuf.conduit.broadcast import (
    BroadcastLappedError,
    BroadcastReceiver,
    BroadcastTransmitter,
    CopyBroadcastReceiver,
)
from tests.logbuf._cnc_children import result_of, spawn

CAPACITY = 1024


@pytest.fixture
def shared(tmp_path: object) -> Iterator[tuple[str, memoryview]]:
    path = os.path.join(str(tmp_path), "broadcast.dat")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, CAPACITY + bd.TRAILER_LENGTH)
        mm = mmap.mmap(fd, CAPACITY + bd.TRAILER_LENGTH)
    finally:
        os.close(fd)
    yield path, memoryview(mm)


@pytest.fixture
def buffer(shared: tuple[str, memoryview]) -> memoryview:
    return shared[1]


def collect(receiver: CopyBroadcastReceiver, limit: int = 10_000) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    for _ in range(limit):
        if not receiver.receive(lambda t, p: got.append((t, p))):
            break
    return got


def test_a_receiver_gets_each_message_with_its_type_and_payload(buffer: memoryview) -> None:
    tx = BroadcastTransmitter(buffer)
    rx = BroadcastReceiver(buffer)
    assert not rx.receive_next()
    tx.transmit(3, b"hello")
    tx.transmit(4, b"")
    assert rx.receive_next()
    assert (rx.type_id, rx.length, bytes(rx.payload)) == (3, 5, b"hello")
    assert rx.validate()
    assert rx.receive_next()
    assert (rx.type_id, bytes(rx.payload)) == (4, b"")
    assert not rx.receive_next()
    assert rx.lapped_count == 0


def test_copy_receivers_each_get_every_message_in_order(buffer: memoryview) -> None:
    tx = BroadcastTransmitter(buffer)
    receivers = [CopyBroadcastReceiver(buffer) for _ in range(3)]
    sent = [(1 + i % 3, bytes([i]) * (i % 40)) for i in range(30)]
    for t, p in sent[:10]:
        tx.transmit(t, p)
    for r in receivers:
        assert collect(r) == sent[:10]
    for t, p in sent[10:]:
        tx.transmit(t, p)
    for r in receivers:
        assert collect(r) == sent[10:]
        assert r.lapped_count == 0


def test_records_wrap_with_padding_and_a_receiver_that_keeps_up_loses_nothing(buffer: memoryview) -> None:
    tx = BroadcastTransmitter(buffer)
    rx = CopyBroadcastReceiver(buffer)
    sent: list[tuple[int, bytes]] = []
    got: list[tuple[int, bytes]] = []
    for i in range(500):
        message = (7, bytes([i % 256]) * (i % 120))
        tx.transmit(*message)
        sent.append(message)
        if i % 3 == 2:
            got += collect(rx)
    got += collect(rx)
    assert got == sent
    assert rx.lapped_count == 0
    assert bd.tail_volatile(buffer, CAPACITY) > 20 * CAPACITY


def test_a_padding_record_fills_the_end_of_the_ring(buffer: memoryview) -> None:
    tx = BroadcastTransmitter(buffer)
    rx = BroadcastReceiver(buffer)
    for _ in range(8):
        tx.transmit(1, b"a" * 112)  # 120-byte records: 960 bytes
    tx.transmit(2, b"b" * 100)  # 108 -> 112 bytes: does not fit in the last 64
    assert bd.RECORD_HEADER.unpack_from(buffer, 960) == (64, bd.PADDING_MSG_TYPE_ID)
    assert bd.RECORD_HEADER.unpack_from(buffer, 0) == (108, 2)
    assert bd.tail_volatile(buffer, CAPACITY) == 1024 + 112
    assert bd.latest_volatile(buffer, CAPACITY) == 1024
    # rx, created before, was lapped: it re-joins at latest, the message after the padding.
    assert rx.receive_next()
    assert rx.lapped_count == 1
    assert (rx.type_id, bytes(rx.payload)) == (2, b"b" * 100)


def test_a_new_receiver_starts_at_the_latest_message_and_a_copy_receiver_after_it(buffer: memoryview) -> None:
    tx = BroadcastTransmitter(buffer)
    tx.transmit(1, b"old")
    tx.transmit(2, b"latest")
    rx = BroadcastReceiver(buffer)
    copy_rx = CopyBroadcastReceiver(buffer)
    assert rx.receive_next() and bytes(rx.payload) == b"latest"  # Agrona: joins at the latest
    assert not rx.receive_next()
    assert collect(copy_rx) == []  # only messages sent after it was created
    tx.transmit(3, b"new")
    assert collect(copy_rx) == [(3, b"new")]


def test_lapping_raises_then_resumes_from_the_latest_message(buffer: memoryview) -> None:
    tx = BroadcastTransmitter(buffer)
    rx = CopyBroadcastReceiver(buffer)
    tx.transmit(1, b"first")
    assert collect(rx) == [(1, b"first")]
    for i in range(40):  # 40 x 64 bytes: more than the capacity
        tx.transmit(5, bytes([i]) * 56)
    with pytest.raises(BroadcastLappedError, match=r"unable to keep up with broadcast buffer.*lapped_count=1"):
        rx.receive(lambda t, p: None)
    assert rx.lapped_count == 1
    assert collect(rx) == [(5, bytes([39]) * 56)]
    tx.transmit(6, b"after")
    assert collect(rx) == [(6, b"after")]
    assert rx.lapped_count == 1


def test_without_raising_a_lap_is_counted_and_the_latest_message_delivered(buffer: memoryview) -> None:
    tx = BroadcastTransmitter(buffer)
    rx = CopyBroadcastReceiver(buffer, raise_on_lap=False)
    for i in range(40):
        tx.transmit(5, bytes([i]) * 56)
    assert collect(rx) == [(5, bytes([39]) * 56)]
    assert rx.lapped_count == 1


def test_validate_fails_once_the_current_message_is_overwritten(buffer: memoryview) -> None:
    tx = BroadcastTransmitter(buffer)
    rx = BroadcastReceiver(buffer)
    tx.transmit(1, b"x" * 8)
    assert rx.receive_next()
    assert rx.validate()
    for _ in range(CAPACITY // 64 - 1):
        tx.transmit(1, b"y" * 56)
    assert rx.validate()  # the ring is exactly full: not overwritten yet
    tx.transmit(1, b"z" * 56)
    assert not rx.validate()


@pytest.mark.parametrize("msg_type_id", [0, -1, 1 << 31])
def test_non_positive_type_ids_are_rejected(buffer: memoryview, msg_type_id: int) -> None:
    with pytest.raises(ValueError, match=f"msg_type_id={msg_type_id} must be >= 1 and"):
        BroadcastTransmitter(buffer).transmit(msg_type_id, b"x")


def test_messages_longer_than_an_eighth_of_the_capacity_are_rejected(buffer: memoryview) -> None:
    tx = BroadcastTransmitter(buffer)
    tx.transmit(1, b"m" * 128)
    with pytest.raises(ValueError, match="message length=129 exceeds max_msg_length=128"):
        tx.transmit(1, b"m" * 129)


def test_a_message_longer_than_the_scratch_buffer_is_rejected(buffer: memoryview) -> None:
    tx = BroadcastTransmitter(buffer)
    rx = CopyBroadcastReceiver(buffer, scratch_length=16)
    tx.transmit(1, b"q" * 17)
    with pytest.raises(ValueError, match="message length=17 exceeds scratch_length=16"):
        rx.receive(lambda t, p: None)


@pytest.mark.parametrize("cls", [BroadcastTransmitter, BroadcastReceiver, CopyBroadcastReceiver])
def test_the_capacity_must_be_a_power_of_two(cls: type) -> None:
    with pytest.raises(ValueError, match=r"broadcast buffer capacity=1000 .* power of 2"):
        cls(memoryview(bytearray(1000 + bd.TRAILER_LENGTH)))


def test_a_receiver_in_another_process_gets_every_message(tmp_path: object) -> None:
    capacity = 64 * 1024  # holds all 200 messages: the child cannot be lapped however slow it is
    path = os.path.join(str(tmp_path), "big-broadcast.dat")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, capacity + bd.TRAILER_LENGTH)
        mm = mmap.mmap(fd, capacity + bd.TRAILER_LENGTH)
    finally:
        os.close(fd)
    tx = BroadcastTransmitter(memoryview(mm))
    tx.transmit(9, b"before the child joined")
    child = spawn("broadcast_listener", path=path, count=200, timeout_s=20.0)
    try:
        assert child.stdout is not None
        assert '"ready"' in child.stdout.readline()  # created: only messages from now on are its
        sent = [(1 + i % 4, bytes([i % 256]) * (i % 16)) for i in range(200)]
        for t, p in sent:
            tx.transmit(t, p)
        result = result_of(child, 30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    received = result["received"]
    assert isinstance(received, list)
    assert [(int(t), bytes.fromhex(p)) for t, p in received] == sent
    assert result["lapped_count"] == 0
