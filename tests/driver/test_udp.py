"""UDP between two real drivers on 127.0.0.1: delivery, spies, loss repair, garbage, liveness."""

from __future__ import annotations

import os
import re
import socket
import struct
import time
import zlib
from typing import Any

import pytest

from logbuf.client import Aeron, Context, FragmentAssembler
from logbuf.protocol import DataFrame, SetupFrame, StatusMessageFrame, encode_datagram
from logbuf.protocol import rttm as rttm_codec
from logbuf.testing import wait_until
from logbuf.testing.checked_stream import message, stream
from logbuf.testing.driver_process import DriverProcess, DriverSet
from logbuf.testing.host import free_udp_port

BASE_ARGS = ["--dir-delete-on-shutdown", "false", "--term-length", "1m", "--image-liveness-timeout", "2s"]


@pytest.fixture
def drivers(request: pytest.FixtureRequest, driver_factory: DriverSet) -> tuple[DriverProcess, DriverProcess]:
    """Two drivers (a sends, b receives) with ``BASE_ARGS`` plus the test's parameters."""
    extra: list[str] = getattr(request, "param", [])
    return driver_factory(*extra, base=BASE_ARGS), driver_factory(*extra, base=BASE_ARGS)


def counters(driver: DriverProcess) -> dict[str, int]:
    """System counters by name: the label up to Aeron's ``: <details>`` ("Errors: version=..." is "Errors")."""
    return {
        c["label"].split(": ", 1)[0]: c["value"] for c in driver.stat_json()["counters"] if c["system_id"] is not None
    }


def settled_stream(
    driver: DriverProcess, stream_id: int, check: Any, what: str, timeout_s: float = 30
) -> dict[str, Any]:
    """``logbuf-stat``'s entry for ``stream_id`` once ``check(entry)`` holds.

    Position counters move after the data does: the receiver stores rcv-pos when it next scans the
    log, the sender stores snd-pos after the send, so subscribers that already have every message
    can be ahead of what the counters say for a while (longer on a loaded machine). Wait for them.
    """
    last: list[dict[str, Any]] = []

    def settled() -> dict[str, Any] | None:
        [entry] = [s for s in driver.stat_json()["streams"] if s["stream_id"] == stream_id]
        last[:] = [entry]
        return entry if check(entry) else None

    try:
        return wait_until(settled, timeout_s, what, max_idle_s=0.05)  # each check runs logbuf-stat
    except AssertionError as e:
        raise AssertionError(f"{e}: {last}") from None


def connect(a: DriverProcess, b: DriverProcess, stream_id: int) -> tuple[Aeron, Aeron, str]:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    return Aeron.connect(Context(dir=a.dir)), Aeron.connect(Context(dir=b.dir)), channel


def test_messages_cross_to_two_subscribers_and_a_spy_in_order(drivers: tuple[DriverProcess, DriverProcess]) -> None:
    a, b = drivers
    sender, receiver, channel = connect(a, b, 10)
    with sender, receiver:
        subs = [receiver.add_subscription(channel, 10), receiver.add_subscription(channel, 10)]
        spy = sender.add_subscription("aeron-spy:" + channel, 10)
        pub = sender.add_publication(channel, 10)
        wait_until(lambda: pub.is_connected and all(s.images for s in subs), 10, "connection")
        assert subs[0].images[0].source_identity.startswith("127.0.0.1:")
        got = stream(pub, [*subs, spy], 20_000, 90)
        assert got == [list(range(20_000))] * 3
        end = subs[0].images[0].position
        assert [s.images[0].position for s in subs] == [end, end] and spy.images[0].position == pub.position == end
        image = settled_stream(
            b,
            10,
            lambda e: e["receiver_hwm"] == e["publisher_position"] == end,
            f"the receiving driver's rcv-hwm and rcv-pos to reach {end}",
        )
        assert image["kind"] == "image" and len(image["subscribers"]) == 2
        assert [s["position"] for s in image["subscribers"]] == [end, end]
        publication = settled_stream(
            a,
            10,
            lambda e: e["sender_position"] == e["publisher_position"] == end,
            f"the sending driver's snd-pos to reach {end}",
        )
        assert publication["kind"] == "publication"
    sent, received = counters(a), counters(b)
    assert sent["Setups sent"] >= 1 and received["Setups received"] >= 1
    assert received["Status Messages sent"] > 0 and sent["Status Messages received"] > 0
    assert sent["Bytes sent"] > 20_000 * 1500
    busy = ("Conductor busy CPU time in ns", "Sender busy CPU time in ns", "Receiver busy CPU time in ns")
    assert [sent[c] for c in busy] == [received[c] for c in busy] == [0, 0, 0]  # off by default


@pytest.mark.parametrize(
    "drivers",
    [
        [
            "--udp-drop-rate",
            "0.02",
            "--udp-duplicate-rate",
            "0.02",
            "--udp-reorder-rate",
            "0.02",
            "--udp-fault-seed",
            "11",
            "--initial-window-length",
            "512k",
        ]
    ],
    indirect=True,
)
def test_loss_duplication_and_reordering_are_repaired(drivers: tuple[DriverProcess, DriverProcess]) -> None:
    a, b = drivers
    sender, receiver, channel = connect(a, b, 11)
    with sender, receiver:
        sub = receiver.add_subscription(channel, 11)
        pub = sender.add_publication(channel, 11)
        wait_until(lambda: pub.is_connected and bool(sub.images), 10, "connection")
        got = stream(pub, [sub], 10_000, 120)
        assert got == [list(range(10_000))]
    sent, received = counters(a), counters(b)
    assert received["NAKs sent"] > 0 and sent["NAKs received"] > 0 and sent["Retransmits sent"] > 0


def test_garbage_is_counted_and_dropped_while_the_stream_carries_on(
    drivers: tuple[DriverProcess, DriverProcess],
) -> None:
    a, b = drivers
    sender, receiver, channel = connect(a, b, 12)
    port = int(channel.rsplit(":", 1)[1])
    with sender, receiver, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        sub = receiver.add_subscription(channel, 12)
        pub = sender.add_publication(channel, 12)
        wait_until(lambda: pub.is_connected and bool(sub.images), 10, "connection")
        valid = encode_datagram([DataFrame(0, 5, 12, 0, b"x" * 100)])
        garbage = [
            b"",
            b"\x01",
            bytes(7),
            b"\xff" * 64,
            valid[:40],
            valid[:4] + b"\x01" + valid[5:],
            b"\x00\x01\x00\x00" + valid[4:],
            SetupFrame(0, 5, 12, 0, 0, 1000, 1408).encode(),
            StatusMessageFrame(5, 12, 0, 0, 0, 1).encode() + b"trailing",
        ]
        for datagram in garbage:
            raw.sendto(datagram, ("127.0.0.1", port))
        got = stream(pub, [sub], 2_000, 60)
        assert got == [list(range(2_000))]
    assert counters(b)["Invalid packets"] >= 6


def test_image_goes_unavailable_when_the_sending_driver_dies(drivers: tuple[DriverProcess, DriverProcess]) -> None:
    a, b = drivers
    unavailable: list[Any] = []
    sender, receiver, channel = connect(a, b, 13)
    with receiver:
        sub = receiver.add_subscription(channel, 13, on_unavailable_image=unavailable.append)
        pub = sender.add_publication(channel, 13)
        wait_until(lambda: pub.is_connected and bool(sub.images), 10, "connection")
        assert pub.offer(b"before") > 0
        assert [i.session_id for i in sub.images] == [pub.session_id]
        a.kill()  # no data, heartbeats or setups any more: the image times out (image liveness 2 s)
        wait_until(lambda: (sub.poll(lambda b, h: None, 10), bool(unavailable))[1], 10, "image unavailable")
        assert [i.session_id for i in unavailable] == [pub.session_id]
        assert not sub.images
    sender.close()  # its driver is gone: closes locally without waiting


@pytest.mark.parametrize("drivers", [["--udp-drop-rate", "0.03", "--udp-fault-seed", "5"]], indirect=True)
def test_an_unreliable_subscription_skips_lost_data_without_naks(drivers: tuple[DriverProcess, DriverProcess]) -> None:
    a, b = drivers
    sender, receiver, channel = connect(a, b, 14)
    with sender, receiver:
        sub = receiver.add_subscription(channel + "|reliable=false", 14)
        pub = sender.add_publication(channel, 14)
        wait_until(lambda: pub.is_connected and bool(sub.images), 10, "connection")
        got: list[int] = []

        def on_message(buffer: memoryview, header: Any) -> None:
            data = bytes(buffer)
            assert zlib.crc32(data[:-4]) == struct.unpack("<I", data[-4:])[0], "a message came back partial"
            got.append(struct.unpack_from("<q", data)[0])

        assembler = FragmentAssembler(on_message)
        sent, deadline = 0, time.monotonic() + 60
        while sent < 5_000 or sub.images[0].position < pub.position:
            assert time.monotonic() < deadline, f"timed out: sent {sent}, received {len(got)}"
            if sent < 5_000 and pub.offer(message(sent)) > 0:
                sent += 1
            sub.poll(assembler, 64)
    assert got == sorted(set(got)) and 2_500 < len(got) < 5_000
    sent_counters, received = counters(a), counters(b)
    assert received["Loss gap fills"] > 0 and received["NAKs sent"] == 0
    assert sent_counters["Retransmits sent"] == 0


def test_a_publication_sends_from_its_interface_address(drivers: tuple[DriverProcess, DriverProcess]) -> None:
    a, b = drivers
    sender, receiver, channel = connect(a, b, 15)
    source_port = free_udp_port()
    with sender, receiver:
        sub = receiver.add_subscription(channel, 15)
        pub = sender.add_publication(f"{channel}|interface=127.0.0.1:{source_port}", 15)
        wait_until(lambda: pub.is_connected and bool(sub.images), 10, "connection")
        assert sub.images[0].source_identity == f"127.0.0.1:{source_port}"
        # a subnet picks the local address inside it (loopback here)
        other = sender.add_publication(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|interface=127.0.0.0/8", 15)
        other.close()


@pytest.mark.parametrize(
    "channel_suffix, problem",
    [
        ("|interface=10.254.253.0/24", "no local interface address in 10.254.253.0/24"),
        ("|interface=127.0.0.1:99999", "interface='127.0.0.1:99999' has a port outside 0..65535"),
        ("|interface=a:b:c", "interface='a:b:c' is not host[:port][/prefix]"),
        ("|rcv-wnd=100", "rcv-wnd='100' must be a multiple of 32"),
        ("|nak-delay=soon", "nak-delay='soon' is not a duration"),
        ("|so-rcvbuf=0", "so-rcvbuf='0' must be 1 byte to 2g"),
    ],
)
def test_bad_udp_parameters_name_the_problem(
    drivers: tuple[DriverProcess, DriverProcess], channel_suffix: str, problem: str
) -> None:
    a, _ = drivers
    a.expected_errors.append("INVALID_CHANNEL")
    with Aeron.connect(Context(dir=a.dir)) as aeron:
        with pytest.raises(Exception, match=re.escape(problem)):
            aeron.add_publication(f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}{channel_suffix}", 16)


def test_subscriptions_to_one_stream_must_agree_on_reliability(drivers: tuple[DriverProcess, DriverProcess]) -> None:
    _, b = drivers
    b.expected_errors.append("INVALID_CHANNEL")
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with Aeron.connect(Context(dir=b.dir)) as aeron:
        first = aeron.add_subscription(channel, 17)
        with pytest.raises(
            Exception, match="reliable=false conflicts with reliable=true of an existing subscription to stream 17"
        ):
            aeron.add_subscription(channel + "|reliable=false", 17)
        aeron.add_subscription(channel + "|reliable=false", 18).close()  # another stream may differ
        first.close()
        aeron.add_subscription(channel + "|reliable=false", 17).close()  # and once the first has gone


def test_a_sender_answers_an_rtt_probe_as_aeron_does(drivers: tuple[DriverProcess, DriverProcess]) -> None:
    a, b = drivers
    sender, receiver, channel = connect(a, b, 19)
    with sender, receiver, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        sub = receiver.add_subscription(channel, 19)
        pub = sender.add_publication(channel, 19)
        wait_until(lambda: pub.is_connected and bool(sub.images), 10, "connection")
        host, port = sub.images[0].source_identity.rsplit(":", 1)
        raw.settimeout(5)
        probe = rttm_codec.RttMeasurementFrame(pub.session_id, 19, 123_456_789, 0, 42, rttm_codec.REPLY_FLAG)
        raw.sendto(probe.encode(), (host, int(port)))
        reply = rttm_codec.decode(raw.recv(100))
        assert reply == rttm_codec.RttMeasurementFrame(pub.session_id, 19, 123_456_789, 0, 42, 0)


def process_cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("drivers", [["--busy-cpu-time", "true"]], indirect=True)
def test_busy_cpu_time_counts_each_agents_work_and_not_its_idling(drivers: tuple[DriverProcess, DriverProcess]) -> None:
    a, b = drivers
    sender, receiver, channel = connect(a, b, 20)
    with sender, receiver:
        sub = receiver.add_subscription(channel, 20)
        pub = sender.add_publication(channel, 20)
        wait_until(lambda: pub.is_connected and bool(sub.images), 10, "connection")
        assert stream(pub, [sub], 5_000, 60) == [list(range(5_000))]
    time.sleep(0.5)  # idle duty cycles now: the process's CPU time grows, the busy counters do not (much)
    sent, received = counters(a), counters(b)
    # The sending driver's sender sent and its receiver (no endpoint) never had work; the reverse on b.
    assert sent["Sender busy CPU time in ns"] > 0 and sent["Receiver busy CPU time in ns"] == 0
    assert received["Receiver busy CPU time in ns"] > 0 and received["Sender busy CPU time in ns"] == 0
    assert sent["Conductor busy CPU time in ns"] > 0 and received["Conductor busy CPU time in ns"] > 0  # commands
    for driver, values in ((a, sent), (b, received)):
        busy_ns = sum(values[f"{role} busy CPU time in ns"] for role in ("Conductor", "Sender", "Receiver"))
        assert busy_ns < process_cpu_ns(driver.pid)  # part of the duty-cycle thread's CPU time, never more
