"""The receiver's native data path (``udp_receive_data``): one recvmmsg per batch, and each DATA datagram
an image takes is inserted in C; everything else is left, untouched, for the Python dispatch."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from logbuf.driver import _udp
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.protocol import DataFrame, HeartbeatFrame, PadFrame, encode_datagram
from logbuf.protocol.status import StatusMessageFrame

TERM = 64 * 1024
SESSION, STREAM, INITIAL = 7, 9, 100
SLOT = 65536


@pytest.fixture
def log() -> Iterator[LogBuffers]:
    name = f"t-rx-{uuid.uuid4().hex[:12]}"
    log = LogBuffers.create(name, term_length=TERM, session_id=SESSION, stream_id=STREAM, initial_term_id=INITIAL)
    try:
        yield log
    finally:
        log.close()
        log.segment.unlink(name)


def data(term_offset: int, payload: bytes, *, term_id: int = INITIAL, session: int = SESSION) -> bytes:
    return encode_datagram([DataFrame(term_offset, session, STREAM, term_id, payload)])


def key_of(sock: socket.socket) -> int:
    host, port = sock.getsockname()
    return int.from_bytes(socket.inet_aton(host), "big") << 16 | port


def receive_all(rx: socket.socket, count: int, receivers: list[_udp.ImageReceiver]) -> tuple[np.ndarray, bytearray]:
    buffer = bytearray(32 * SLOT)
    offsets, lengths, sources = np.zeros(32, np.int32), np.zeros(32, dtype=np.int32), np.zeros(32, dtype=np.uint64)
    got, deadline = 0, time.monotonic() + 5
    out = np.zeros(count, dtype=np.int32)
    while got < count and time.monotonic() < deadline:
        n, total = _udp.udp_receive_data(rx.fileno(), buffer, SLOT, offsets, lengths, sources, receivers)
        assert offsets[:n].tolist() == [i * SLOT for i in range(n)]  # no UDP_GRO: a slot per datagram
        out[got : got + n] = lengths[:n]
        got += n
    assert got == count
    return out, buffer


def test_data_of_an_image_is_inserted_and_the_rest_left_for_python(log: LogBuffers) -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger,
    ):
        rx.bind(("127.0.0.1", 0))
        tx.bind(("127.0.0.1", 0))
        stranger.bind(("127.0.0.1", 0))
        receiver = _udp.ImageReceiver(log.view, SESSION, STREAM, key_of(tx))
        receiver.rebuild, receiver.floor, receiver.hwm = 0, 0, 0
        first, second = data(0, b"a" * 100), data(160, b"b" * 20)
        sends = [
            (tx, first),  # 0: taken
            (tx, first),  # 1: a duplicate: taken (skipped inside, as the rebuilder does)
            (tx, second),  # 2: taken, leaves no gap
            (stranger, data(192, b"s" * 8)),  # 3: another address: left
            (tx, data(192, b"x", session=8)),  # 4: another session: left
            (tx, HeartbeatFrame(256, SESSION, STREAM, INITIAL).encode()),  # 5: a heartbeat: left
            (tx, data(TERM // 2, b"w" * 8)),  # 6: past the window above the floor: left
            (tx, data(0, b"o", term_id=INITIAL - 1)),  # 7: behind the floor: left
            (tx, StatusMessageFrame(SESSION, STREAM, INITIAL, 0, TERM, 1).encode()),  # 8: control: left
            (tx, data(192, b"t" * 8)[:36]),  # 9: cut short: invalid, left
            (tx, encode_datagram([PadFrame(224, SESSION, STREAM, INITIAL, 64)])),  # 10: a PAD: taken
        ]
        for sock, datagram in sends:
            sock.sendto(datagram, rx.getsockname())
        lengths, _ = receive_all(rx, len(sends), [receiver])
    taken = [i for i, length in enumerate(lengths.tolist()) if length == -1]
    assert taken == [0, 1, 2, 10]
    assert [int(lengths[i]) for i in (3, 4, 5)] == [len(sends[3][1]), len(sends[4][1]), 32]
    assert receiver.inserted == 4 and receiver.hwm == 288
    term = bytes(log.terms[0][:288])
    assert term[: len(first)] == first and term[160 : 160 + len(second)] == second  # not the stranger's
    assert term[224:256] == sends[10][1]


def test_rcv_pos_and_the_floor_keep_old_data_out(log: LogBuffers) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        tx.bind(("127.0.0.1", 0))
        receiver = _udp.ImageReceiver(log.view, SESSION, STREAM, key_of(tx))
        receiver.rebuild, receiver.floor, receiver.hwm = 256, 128, 256
        for term_offset in (0, 224, 256, 128 + TERM // 2 - 64):
            tx.sendto(data(term_offset, b"z" * 32), rx.getsockname())
        lengths, _ = receive_all(rx, 4, [receiver])
    assert lengths.tolist()[:2] == [64, 64] and lengths.tolist()[2:] == [-1, -1]
    assert receiver.hwm == 128 + TERM // 2 and bytes(log.terms[0][:64]) == bytes(64)


def test_a_closed_log_takes_nothing(log: LogBuffers) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        tx.bind(("127.0.0.1", 0))
        receiver = _udp.ImageReceiver(log.view, SESSION, STREAM, key_of(tx))
        log.view.close()
        datagram = data(0, b"a")
        tx.sendto(datagram, rx.getsockname())
        lengths, _ = receive_all(rx, 1, [receiver])
    assert lengths.tolist() == [len(datagram)]  # left for Python


def test_receivers_must_be_image_receivers() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        with pytest.raises(TypeError, match="ImageReceiver"):
            _udp.udp_receive_data(
                rx.fileno(),
                bytearray(SLOT),
                SLOT,
                np.zeros(1, np.int32),
                np.zeros(1, np.int32),
                np.zeros(1, np.uint64),
                [object()],
            )
