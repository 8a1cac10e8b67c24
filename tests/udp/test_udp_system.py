"""UDP system tests: two real media drivers on 127.0.0.1, real client processes, real sockets.

Driver A sends (its clients publish to ``aeron:udp?endpoint=127.0.0.1:PORT``), driver B receives
(its clients subscribe to the same channel and B binds the port). Every wait has a timeout; every
driver still alive at the end must have an empty error log (bar expected errors); on failure the
drivers' counters and output are printed.
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logbuf.client import Aeron, Context, FragmentAssembler, Image, RegistrationError, Subscription
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.cnc import CncFile, cnc_driver_heartbeat_ms, is_driver_active
from logbuf.errors import ErrorCode
from logbuf.protocol import decode_datagram
from logbuf.protocol.data import DataFrame, HeartbeatFrame
from logbuf.protocol.frame_header import HDR_TYPE_NAK, HDR_TYPE_RTTM, HDR_TYPE_SM
from logbuf.protocol.nak import NakFrame
from logbuf.protocol.rttm import RttMeasurementFrame
from logbuf.protocol.setup import SetupFrame
from logbuf.protocol.status import StatusMessageFrame
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet
from logbuf.testing.host import free_udp_port
from tests.udp._children import END_SEQ, HEADER, HEADER_LENGTH

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BASE_ARGS = ["--dir-delete-on-shutdown", "false", "--driver-timeout", "5s", "--client-liveness-timeout", "3s"]
UDP_ARGS = ["--image-liveness-timeout", "2s", "--publication-connection-timeout", "2s", "--term-length", "1m"]
IMAGE_LIVENESS_TIMEOUT_S = 2.0


def faults(rate: float, seed: int) -> list[str]:
    """Drop, duplicate and reorder ``rate`` of the datagrams this driver receives (seeded)."""
    return [
        "--udp-drop-rate",
        str(rate),
        "--udp-duplicate-rate",
        str(rate),
        "--udp-reorder-rate",
        str(rate),
        "--udp-fault-seed",
        str(seed),
    ]


def udp_channel(port: int, **params: object) -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}" + "".join(f"|{k.replace('_', '-')}={v}" for k, v in params.items())


# -- drivers -------------------------------------------------------------------------------------------
@pytest.fixture
def drivers(driver_factory: DriverSet) -> Callable[..., DriverProcess]:
    """``drivers(*extra_args)`` starts a driver with the default args plus ``extra_args``."""
    return lambda *extra: driver_factory(*extra, base=[*BASE_ARGS, *UDP_ARGS])


# -- child processes ----------------------------------------------------------------------------------
class Child:
    """A ``tests.udp._children`` process: stdout lines read by a thread, stderr to a temp file."""

    def __init__(self, role: str, **args: object) -> None:
        self.role = role
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.udp._children", role, json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            cwd=ROOT,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def stderr(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")[-10_000:]

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"{self.role} not ready after {timeout_s} s; stderr:\n{self.stderr()}") from None
        if line != "ready":
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            raise AssertionError(
                f"{self.role} said {line!r} instead of ready (exit {self.proc.poll()}); stderr:\n{self.stderr()}"
            )

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Tell a streaming publisher to finish (it then sends the end marker and reports)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def result(self, timeout_s: float) -> dict[str, Any]:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.role} timed out after {timeout_s} s; stderr:\n{self.stderr()}") from None
        lines = []
        while True:
            try:
                line = self._lines.get(timeout=10)
            except queue.Empty:
                break
            if line is None:
                break
            lines.append(line)
        assert self.proc.returncode == 0, f"{self.role} failed ({self.proc.returncode}); stderr:\n{self.stderr()}"
        assert lines, f"{self.role} printed no result; stderr:\n{self.stderr()}"
        return json.loads(lines[-1])  # type: ignore[no-any-return]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        self.kill()
        self._reader.join(10)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:  # stdin: a write the dead child never read
                    pass
        self._err.close()


class InOrderReader:
    """Polls a subscription in this process; within each image, sequence numbers must be contiguous."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.received = 0
        self.errors: list[str] = []
        self.first_seq: dict[int, int] = {}
        self.last_seq: dict[int, int] = {}
        self._assembler = FragmentAssembler(self._on_message)

    def _on_message(self, buffer: memoryview, header: Any) -> None:
        seq, size, body_crc = HEADER.unpack_from(buffer, 0)
        if seq == END_SEQ:
            return
        session = header.session_id
        last = self.last_seq.get(session)
        if last is None:
            self.first_seq[session] = seq
        elif seq != last + 1:
            self.errors.append(f"session {session}: seq {seq} after {last}")
        self.last_seq[session] = seq
        if len(buffer) != size or zlib.crc32(buffer[HEADER_LENGTH:]) != body_crc:
            self.errors.append(f"seq {seq}: {len(buffer)} bytes, header says {size}, or body checksum differs")
        self.received += 1

    def poll(self) -> int:
        return self.subscription.poll(self._assembler, 256)

    def receive(self, count: int, timeout_s: float, what: str) -> None:
        target = self.received + count
        wait_until(lambda: self.received >= target, timeout_s, f"{what} ({self.received}/{target})", do_work=self.poll)


def connect(driver: DriverProcess) -> Aeron:
    return Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=5_000_000_000))


# -- tests ----------------------------------------------------------------------------------------------
def test_channel_params_reach_both_ends_and_counters_track_the_stream(drivers: Callable[..., DriverProcess]) -> None:
    sender, receiver = drivers(), drivers()
    port, stream_id = free_udp_port(), 5
    available: list[Image] = []
    with connect(sender) as a, connect(receiver) as b:
        sub = b.add_subscription(udp_channel(port), stream_id, on_available_image=available.append)
        pub = a.add_exclusive_publication(udp_channel(port, mtu=8192, term_length="1m", session_id=777), stream_id)
        assert (pub.mtu_length, pub.term_length, pub.session_id) == (8192, 1 << 20, 777)
        wait_until(lambda: pub.is_connected and sub.image_count == 1, 15, "connection and image")
        assert [i.session_id for i in available] == [777]
        image = sub.images[0]
        assert (image.session_id, image.term_length) == (777, 1 << 20)

        messages = [b"small-%d" % i for i in range(50)] + [bytes([i]) * 5000 for i in range(5)] + [b"\x07" * 20_000]
        for message in messages:
            wait_until(lambda: pub.offer(message) > 0, 10, "offer accepted")
        got: list[bytes] = []
        fragments = 0
        assembler = FragmentAssembler(lambda buffer, header: got.append(bytes(buffer)))

        def on_fragment(buffer: memoryview, header: Any) -> None:
            nonlocal fragments
            fragments += 1
            assembler(buffer, header)

        wait_until(lambda: len(got) == len(messages), 15, "all messages", do_work=lambda: sub.poll(on_fragment, 64))
        assert got == messages
        # mtu=8192: 5000 B fits one frame (8160 B payload), 20,000 B takes 3
        assert fragments == 50 + 5 + 3

        # Positions: sender position on A, receiver HWM/position and subscriber position on B all reach the end.
        end = pub.position
        wait_until(lambda: sender.stream_counters(cd.SENDER_POSITION_TYPE_ID) == [end], 10, "snd-pos at the end")
        for type_id in (cd.RECEIVER_HWM_TYPE_ID, cd.RECEIVER_POSITION_TYPE_ID, cd.SUBSCRIBER_POSITION_TYPE_ID):
            wait_until(lambda: receiver.stream_counters(type_id) == [end], 10, f"type {type_id} at {end}")
        assert sender.stream_counters(cd.SENDER_LIMIT_TYPE_ID)[0] >= end

        # The stat tool (a separate process) sees the same, by label and type id.
        a_stat = {c["label"]: c["value"] for c in sender.stat_json()["counters"] if c["system_id"] is not None}
        b_stat = receiver.stat_json()["counters"]
        b_system = {c["label"]: c["value"] for c in b_stat if c["system_id"] is not None}
        for label in ("Setups sent", "Status Messages received", "Datagrams sent", "Bytes sent"):
            assert a_stat[label] > 0, f"sender {label!r} is {a_stat[label]}"
        for label in ("Setups received", "Status Messages sent", "Datagrams received", "Bytes received"):
            assert b_system[label] > 0, f"receiver {label!r} is {b_system[label]}"
        assert a_stat["Bytes sent"] >= sum(len(m) for m in messages)
        assert b_system["Bytes received"] >= sum(len(m) for m in messages)
        assert {c["type_id"] for c in b_stat} >= {3, 4, 5}
        assert a_stat["Invalid packets"] == 0 and b_system["Invalid packets"] == 0


BAD_CHANNELS = [
    ("aeron:udp", "endpoint"),
    ("aeron:udp?endpoint=127.0.0.1", "endpoint|port"),
    ("aeron:udp?endpoint=127.0.0.1:notaport", "endpoint|port|notaport"),
    ("aeron:udp?endpoint=127.0.0.1:99999", "endpoint|port|99999"),
    ("aeron:udp?endpoint=127.0.0.1:40123|mtu=100", "mtu"),
    ("aeron:udp?endpoint=127.0.0.1:40123|mtu=70000", "mtu"),
    ("aeron:udp?endpoint=127.0.0.1:40123|term-length=1000", "term-length"),
    ("aeron:udp?endpoint=127.0.0.1:40123|term-length=3m", "term-length"),
    ("aeron:udp?endpoint=127.0.0.1:40123|session-id=abc", "session-id"),
    ("aeron:udp?endpoint=127.0.0.1:40123|linger=forever", "linger"),
    ("aeron:udp?endpoint=127.0.0.1:40123|reliable=maybe", "reliable"),
    ("aeron:udp?endpoint=224.0.1.2:40123", "224.0.1.2.*odd last octet"),
    ("aeron:udp?endpoint=127.0.0.1:40123|gtag=seven", "gtag"),
    ("aeron:udp?endpoint=127.0.0.1:40123|control=224.0.1.1:40124", "control.*multicast"),
]


def test_bad_udp_channels_are_rejected_naming_the_bad_part(drivers: Callable[..., DriverProcess]) -> None:
    driver = drivers()
    driver.expected_errors += ["INVALID_CHANNEL"]
    with connect(driver) as aeron:
        for add in (aeron.add_publication, aeron.add_exclusive_publication, aeron.add_subscription):
            for channel, pattern in BAD_CHANNELS:
                with pytest.raises(RegistrationError) as info:
                    add(channel, 1)
                assert info.value.error_code == ErrorCode.INVALID_CHANNEL, channel
                # The message names the bad part itself, not only by quoting the whole channel back.
                explanation = str(info.value).replace(channel, "")
                assert re.search(pattern, explanation), f"{add.__name__}({channel!r}): {info.value}"
        for channel, pattern in (
            ("aeron:udp?endpoint=224.0.1.1:40123|fc=pref", "strategy 'pref'"),
            ("aeron:udp?endpoint=224.0.1.1:40123|fc=tagged", "needs a group tag"),
            ("aeron:udp?endpoint=224.0.1.1:40123|fc=min,g:1/x", "group min size 'x'"),
        ):  # fc= concerns publications only
            with pytest.raises(RegistrationError, match=pattern) as info:
                aeron.add_publication(channel, 1)
            assert info.value.error_code == ErrorCode.INVALID_CHANNEL
        # and it keeps serving
        assert aeron.add_publication(udp_channel(free_udp_port()), 1).registration_id > 0


def transfer(
    children: Callable[..., Child],
    sender: DriverProcess,
    receiver: DriverProcess,
    count: int,
    stream_id: int,
    seed: int,
    timeout_s: float,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A subscriber child on ``receiver``, then a publisher child of ``count`` seeded messages on ``sender``,
    over a fresh UDP channel; returns their results once the publisher has published every message."""
    channel = udp_channel(free_udp_port())
    sub = children(
        "subscriber", directory=receiver.dir, channel=channel, stream_id=stream_id, seed=seed, timeout_s=timeout_s
    )
    sub.wait_ready()
    pub = children(
        "publisher",
        directory=sender.dir,
        channel=channel,
        stream_id=stream_id,
        seed=seed,
        count=count,
        timeout_s=timeout_s,
    )
    published = pub.result(timeout_s + 20)
    received = sub.result(60)
    assert published["published"] == count
    return published, received


@pytest.mark.slow
def test_a_million_mixed_messages_arrive_once_in_order_through_drops_duplicates_and_reordering(
    drivers: Callable[..., DriverProcess],
    children: Callable[..., Child],
) -> None:
    count, stream_id, seed = 1_000_000, 1001, 42
    sender, receiver = drivers(*faults(0.05, 1)), drivers(*faults(0.05, 2))
    published, received = transfer(children, sender, receiver, count, stream_id, seed, timeout_s=150)
    summary = (
        f"published in {published['elapsed_s']:.1f} s, received {received['received']} in "
        f"{received['elapsed_s']:.1f} s, errors {received['first_errors']}"
    )
    assert received["errors"] == 0, summary
    assert received["received"] == count, summary
    assert received["crc"] == published["crc"], summary
    assert received["images_available"] == [published["session_id"]]
    assert received["fragments"] > count, "no message was fragmented"
    naks_sent, naks_received = receiver.system_counter("NAKs sent"), sender.system_counter("NAKs received")
    retransmits = sender.system_counter("Retransmits sent")
    print(f"{summary}; NAKs sent {naks_sent}, received {naks_received}; retransmits {retransmits}")
    assert naks_sent > 0
    assert naks_received > 0
    assert retransmits > 0


@pytest.mark.parametrize("gso", ["true", "false"], ids=["gso", "sendmmsg"])
def test_messages_arrive_once_in_order_with_and_without_udp_gso(
    drivers: Callable[..., DriverProcess], children: Callable[..., Child], gso: str
) -> None:
    """With UDP GSO (the default: runs of equal datagrams in one send, coalesced reads) and without it, every
    message arrives once, in order, and the receiver counts (within 1 %) the datagrams the sender counts."""
    count, stream_id, seed = 200_000, 1002, 7
    sender, receiver = drivers("--udp-gso", gso), drivers("--udp-gso", gso)
    published, received = transfer(children, sender, receiver, count, stream_id, seed, timeout_s=60)
    assert received["errors"] == 0 and received["received"] == count and received["crc"] == published["crc"]
    assert sender.system_counter("Retransmits sent") == 0
    # the receiver counts datagrams, not reads: with GSO a coalesced read of ~40 datagrams counts ~40
    sent = sender.system_counter("Datagrams sent")
    assert sent > count // 50
    wait_until(lambda: receiver.system_counter("Datagrams received") >= 0.99 * sent, 10, "the datagrams counted")
    assert 0.99 * sent <= receiver.system_counter("Datagrams received") <= 1.01 * sent


@pytest.mark.slow
def test_two_subscribers_and_a_spy_each_receive_every_message_in_order(
    drivers: Callable[..., DriverProcess],
    children: Callable[..., Child],
) -> None:
    count, stream_id, seed = 100_000, 1002, 7
    sender, receiver = drivers(), drivers()
    port = free_udp_port()
    channel = udp_channel(port)
    subs = [
        children("subscriber", directory=receiver.dir, channel=channel, stream_id=stream_id, seed=seed, timeout_s=90)
        for _ in range(2)
    ]
    spy = children(
        "subscriber", directory=sender.dir, channel=f"aeron-spy:{channel}", stream_id=stream_id, seed=seed, timeout_s=90
    )
    for s in (*subs, spy):
        s.wait_ready()
    pub = children(
        "publisher",
        directory=sender.dir,
        channel=channel,
        stream_id=stream_id,
        seed=seed,
        count=count,
        exclusive=True,
        timeout_s=90,
    )
    published = pub.result(110)
    results = [s.result(30) for s in (*subs, spy)]
    assert published["published"] == count
    for name, result in zip(("subscriber 1", "subscriber 2", "spy"), results):
        assert (result["received"], result["errors"], result["crc"]) == (count, 0, published["crc"]), (
            f"{name}: {result}"
        )
        assert result["images_available"] == [published["session_id"]], name


@pytest.mark.slow
def test_receiver_driver_killed_and_restarted_the_sender_carries_on_and_a_new_image_forms(
    drivers: Callable[..., DriverProcess],
    children: Callable[..., Child],
) -> None:
    stream_id, seed = 1003, 3
    sender = drivers()
    receiver = drivers("--driver-timeout", "2s")  # a restart may take over the directory 2 s after the kill
    channel = udp_channel(free_udp_port())
    first = connect(receiver)
    try:
        images: list[int] = []
        reader = InOrderReader(
            first.add_subscription(channel, stream_id, on_available_image=lambda i: images.append(i.session_id))
        )
        pub = children(
            "publisher",
            directory=sender.dir,
            channel=channel,
            stream_id=stream_id,
            seed=seed,
            count=-1,
            pace_every=10,
            pace_s=0.002,
            timeout_s=120,
        )
        pub.wait_ready()
        reader.receive(300, 20, "messages before the kill")
        assert not reader.errors, reader.errors
        last_before = max(reader.last_seq.values())

        receiver.kill()
    finally:
        first.close()
    killed_at = time.monotonic()
    wait_until(
        lambda: not is_driver_active(receiver.dir, timeout_ns=2_000_000_000), 10, "the killed driver to be seen dead"
    )
    # A dead driver is taken over at once (its pid is gone); stay down as long as a stale heartbeat would
    # have kept us, so the publisher meets the missing receiver (back-pressure or not-connected) first.
    with CncFile.open(receiver.dir) as cnc:
        wait_until(
            lambda: time.time() * 1000 - cnc_driver_heartbeat_ms(cnc) > 6_000, 20, "six seconds without the receiver"
        )
    receiver.start(heartbeat_timeout_ns=1_000_000_000)
    assert pub.running, f"publisher died with the receiving driver; stderr:\n{pub.stderr()}"

    with connect(receiver) as second:
        again: list[int] = []
        sub = second.add_subscription(channel, stream_id, on_available_image=lambda i: again.append(i.session_id))
        reader = InOrderReader(sub)
        resubscribed_at = time.monotonic()
        wait_until(lambda: bool(again), 20, "a new image after the restart", do_work=reader.poll)
        took = time.monotonic() - resubscribed_at
        reader.receive(300, 20, "messages after the restart")
        assert not reader.errors, reader.errors
        assert min(reader.first_seq.values()) > last_before
    assert pub.running, f"publisher died; stderr:\n{pub.stderr()}"
    pub.stop()
    published = pub.result(30)
    assert published["published"] > last_before + 300
    assert published["not_connected"] + published["back_pressured"] > 0, published
    assert receiver.system_counter("Setups received") >= 1
    print(
        f"new image {time.monotonic() - killed_at:.1f} s after the kill ({took:.1f} s after re-subscribing); "
        f"publisher {published}"
    )


@pytest.mark.slow
def test_sender_driver_killed_the_image_goes_unavailable_after_the_liveness_timeout(
    drivers: Callable[..., DriverProcess],
    children: Callable[..., Child],
) -> None:
    stream_id, seed = 1004, 4
    sender, receiver = drivers(), drivers()
    channel = udp_channel(free_udp_port())
    unavailable: list[tuple[float, int]] = []
    with connect(receiver) as b:
        sub = b.add_subscription(
            channel, stream_id, on_unavailable_image=lambda i: unavailable.append((time.monotonic(), i.session_id))
        )
        reader = InOrderReader(sub)
        pub = children(
            "publisher",
            directory=sender.dir,
            channel=channel,
            stream_id=stream_id,
            seed=seed,
            count=-1,
            pace_every=10,
            pace_s=0.002,
            timeout_s=60,
        )
        pub.wait_ready()
        reader.receive(200, 20, "messages before the kill")
        session_id = sub.images[0].session_id
        sender.kill()
        killed_at = time.monotonic()
        pub.kill()
        wait_until(lambda: bool(unavailable), IMAGE_LIVENESS_TIMEOUT_S + 8, "image unavailable", do_work=reader.poll)
        after = unavailable[0][0] - killed_at
        print(f"image unavailable {after:.2f} s after the sending driver was killed")
        assert [s for _, s in unavailable] == [session_id]  # that image, once, and nothing about durations
        assert sub.image_count == 0
        assert not reader.errors, reader.errors


SENDER_BOUND_TYPES = (HDR_TYPE_NAK, HDR_TYPE_SM, HDR_TYPE_RTTM)


def valid_frames(session_id: int, stream_id: int) -> list[bytes]:
    """One of each frame a receiver may see, encoded with logbuf.protocol's encoders."""
    return [
        DataFrame(
            term_offset=0, session_id=session_id, stream_id=stream_id, term_id=0, payload=bytes(range(100))
        ).encode(),
        DataFrame(
            term_offset=1024, session_id=session_id, stream_id=stream_id, term_id=5, payload=b"x" * 1000
        ).encode(),
        HeartbeatFrame(term_offset=64, session_id=session_id, stream_id=stream_id, term_id=0).encode(),
        SetupFrame(
            term_offset=0,
            session_id=session_id,
            stream_id=stream_id,
            initial_term_id=0,
            active_term_id=0,
            term_length=1 << 20,
            mtu_length=1408,
        ).encode(),
        StatusMessageFrame(session_id, stream_id, 0, 0, 128 * 1024, 99).encode(),
        NakFrame(session_id, stream_id, 0, 0, 1408).encode(),
        RttMeasurementFrame(session_id, stream_id, 1, 0, 99).encode(),
    ]


def corrupted_copies(frame: bytes) -> Iterator[bytes]:
    """Every truncation, a wrong version, and a frame length that overstates or understates the datagram."""
    for cut in range(len(frame)):
        yield frame[:cut]
    yield frame[:4] + b"\x01" + frame[5:]
    yield struct.pack("<i", len(frame) + 64) + frame[4:]
    yield struct.pack("<i", 7) + frame[4:]
    yield struct.pack("<i", -len(frame)) + frame[4:]


@pytest.mark.slow
def test_garbage_and_truncated_frames_are_counted_as_invalid_and_the_stream_carries_on(
    drivers: Callable[..., DriverProcess],
    children: Callable[..., Child],
) -> None:
    stream_id, seed, session_id = 1005, 5, 424242
    sender, receiver = drivers(), drivers()
    port = free_udp_port()
    channel = udp_channel(port)
    sub = children("subscriber", directory=receiver.dir, channel=channel, stream_id=stream_id, seed=seed, timeout_s=90)
    sub.wait_ready()
    pub = children(
        "publisher",
        directory=sender.dir,
        channel=udp_channel(port, session_id=session_id),
        stream_id=stream_id,
        seed=seed,
        count=-1,
        pace_every=20,
        pace_s=0.001,
        timeout_s=90,
    )
    pub.wait_ready()
    invalid_before = receiver.system_counter("Invalid packets")
    must_count = 0  # invalid datagrams the receiver must count
    sender_bound = 0  # malformed SM/NAK/RTTM bodies behind a good common header: a receive endpoint may ignore them
    addr = ("127.0.0.1", port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:

        def send(datagram: bytes) -> None:
            nonlocal must_count, sender_bound
            if decode_datagram(datagram):  # valid after all (e.g. cut inside a DATA frame's padding)
                return
            sock.sendto(datagram, addr)
            if len(datagram) >= 8 and datagram[4] == 0 and (datagram[6] | datagram[7] << 8) in SENDER_BOUND_TYPES:
                sender_bound += 1  # malformed SM/NAK/RTTM: counted too, though meant for a sender
            must_count += 1
            time.sleep(0.0003)  # stay well inside the receiver's socket buffer

        header_then_junk = st.builds(
            lambda length, flags, type_, rest: struct.pack("<iBBH", length, 0, flags, type_) + rest,
            st.integers(-(2**31), 2**31 - 1),
            st.integers(0, 255),
            st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 0x0B, 0xFFFF]),
            st.binary(max_size=1500),
        )

        @settings(
            max_examples=400,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(st.one_of(st.binary(max_size=2048), header_then_junk))
        def send_garbage(datagram: bytes) -> None:
            send(datagram)

        send_garbage()
        for session in (session_id, 99):  # the live session and an unknown one
            for frame in valid_frames(session, stream_id):
                for datagram in corrupted_copies(frame):
                    send(datagram)
    assert must_count > 500

    def counted() -> int:
        return receiver.system_counter("Invalid packets") - invalid_before

    try:
        wait_until(lambda: counted() >= must_count, 15, f"'Invalid packets' to grow by {must_count}")
    finally:
        time.sleep(0.3)  # pace: let late datagrams be counted before the diagnostic line below
        print(
            f"sent {must_count} invalid datagrams + {sender_bound} malformed SM/NAK/RTTM; receiver counted {counted()}"
        )
    assert pub.running and sub.running, f"a child died: {pub.stderr()} {sub.stderr()}"
    time.sleep(0.5)  # the stream keeps running after the garbage
    pub.stop()
    published = pub.result(60)
    received = sub.result(60)
    assert published["session_id"] == session_id
    assert (received["received"], received["errors"], received["crc"]) == (
        published["published"],
        0,
        published["crc"],
    ), received
    assert received["images_available"] == [session_id]
