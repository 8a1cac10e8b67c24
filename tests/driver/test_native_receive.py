"""The receiver's native data path (``udp_receive_data``): one recvmmsg per batch, and each DATA-path datagram
of an image is decided in C by the one window rule (inserted, a heartbeat, an over-run or an under-run);
everything else is left, untouched, for the Python dispatch."""

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
            (tx, HeartbeatFrame(256, SESSION, STREAM, INITIAL).encode()),  # 5: a heartbeat: taken, counted
            (tx, data(TERM // 2, b"w" * 8)),  # 6: past the window above the floor: an over-run, counted
            (tx, data(0, b"o", term_id=INITIAL - 1)),  # 7: behind the floor: an under-run, counted
            (tx, StatusMessageFrame(SESSION, STREAM, INITIAL, 0, TERM, 1).encode()),  # 8: control: left
            (tx, data(192, b"t" * 8)[:36]),  # 9: cut short: invalid, left
            (tx, encode_datagram([PadFrame(224, SESSION, STREAM, INITIAL, 64)])),  # 10: a PAD: taken
        ]
        for sock, datagram in sends:
            sock.sendto(datagram, rx.getsockname())
        lengths, _ = receive_all(rx, len(sends), [receiver])
    taken = [i for i, length in enumerate(lengths.tolist()) if length == -1]
    assert taken == [0, 1, 2, 5, 6, 7, 10]
    assert [int(lengths[i]) for i in (3, 4, 8, 9)] == [len(sends[i][1]) for i in (3, 4, 8, 9)]
    assert (receiver.received, receiver.inserted, receiver.heartbeats) == (7, 4, 1)
    assert (receiver.over_runs, receiver.under_runs, receiver.hwm) == (1, 1, TERM // 2)  # the over-run's window end
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
    assert lengths.tolist() == [-1] * 4  # all decided: behind the floor, behind rcv-pos, and two inserted
    assert (receiver.under_runs, receiver.over_runs, receiver.inserted) == (1, 0, 2)
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


def test_one_datagram_is_decided_by_the_rule_a_batch_runs(log: LogBuffers) -> None:
    receiver = _udp.ImageReceiver(log.view, SESSION, STREAM, 0)
    receiver.rebuild, receiver.floor, receiver.hwm = 64, 64, 64
    eos = HeartbeatFrame(64, SESSION, STREAM, INITIAL, flags=0xE0).encode()
    cases = [
        (data(64, b"a" * 8), _udp.DATA_INSERTED),
        (data(0, b"b" * 8), _udp.DATA_UNDER_RUN),
        (data(TERM // 2 + 64, b"c" * 8), _udp.DATA_OVER_RUN),
        (eos, _udp.DATA_HEARTBEAT),
        (data(64, b"d" * 8)[:36], _udp.DATA_NOT_TAKEN),
    ]
    assert [receiver.on_datagram(datagram) for datagram, _ in cases] == [code for _, code in cases]
    assert (receiver.eos_position, receiver.hwm, receiver.received) == (64, 64 + TERM // 2, 4)  # the over-run
    assert bytes(log.terms[0][64 : 64 + len(cases[0][0])]) == cases[0][0]


def test_a_heartbeat_or_data_past_the_window_raises_the_hwm_to_the_windows_end(log: LogBuffers) -> None:
    """The sender is past the window, so it sent all of it: what is missing is NAKed (the HWM says how far).
    An EOS heartbeat past the window does not mark the end yet."""
    receiver = _udp.ImageReceiver(log.view, SESSION, STREAM, 0)
    window_end = 64 + TERM // 2
    receiver.rebuild, receiver.floor, receiver.hwm = 64, 64, 128
    past = HeartbeatFrame(window_end + 64, SESSION, STREAM, INITIAL, flags=0xE0).encode()
    assert receiver.on_datagram(past) == _udp.DATA_HEARTBEAT
    assert (receiver.hwm, receiver.eos_position) == (window_end, -1)
    inside = HeartbeatFrame(256, SESSION, STREAM, INITIAL).encode()
    assert receiver.on_datagram(inside) == _udp.DATA_HEARTBEAT and receiver.hwm == window_end  # never lowered
    receiver.hwm = 128
    assert receiver.on_datagram(data(window_end - 32, b"o" * 32)) == _udp.DATA_OVER_RUN  # ends past the window
    assert receiver.hwm == window_end and bytes(log.terms[0][128:]) == bytes(TERM - 128)


def test_a_batch_already_received_goes_through_the_same_path(log: LogBuffers) -> None:
    receiver = _udp.ImageReceiver(log.view, SESSION, STREAM, 42)
    datagrams = [data(0, b"x" * 8), data(64, b"y"), data(96, b"z")]
    buffer = bytearray(3 * SLOT)
    offsets = np.arange(3, dtype=np.int32) * SLOT
    lengths = np.array([len(d) for d in datagrams], dtype=np.int32)
    sources = np.array([42, 42, 7], dtype=np.uint64)  # the last from another source: left
    for i, datagram in enumerate(datagrams):
        buffer[i * SLOT : i * SLOT + len(datagram)] = datagram
    total = _udp.insert_data_batch(buffer, 3, offsets, lengths, sources, [receiver])
    assert total == sum(len(d) for d in datagrams)
    assert lengths.tolist() == [-1, -1, len(datagrams[2])] and receiver.inserted == 2
    with pytest.raises(ValueError, match="count=4"):
        _udp.insert_data_batch(buffer, 4, offsets, lengths, sources, [receiver])


def test_a_source_key_of_zero_matches_nothing(log: LogBuffers) -> None:
    receiver = _udp.ImageReceiver(log.view, SESSION, STREAM, 0)  # not an IPv4 source
    datagram = data(0, b"a")
    buffer = bytearray(datagram)
    lengths = np.array([len(datagram)], dtype=np.int32)
    _udp.insert_data_batch(buffer, 1, np.zeros(1, np.int32), lengths, np.zeros(1, np.uint64), [receiver])
    assert lengths.tolist() == [len(datagram)] and receiver.received == 0
