"""One publication, many receiver drivers on many hosts: multicast, MDC and the flow-control strategies.

A real network on this machine (:mod:`logbuf.testing.netns`): host 0 publishes, hosts 1-3 receive,
each host a network namespace with its own media driver, joined by a bridge. Publishers and
subscribers are the ``tests.udp._children`` processes, which check every message (sequence, length,
body CRC) and the whole stream (a running CRC-32 compared with the publisher's). 20,000 messages of
mixed sizes (2 % fragmented) per run rather than the full 200,000, to keep this 2-core machine's
test time bounded (``LOGBUF_FANOUT_COUNT=200000`` runs the full count); the checks are the same.

The fixtures fail (not skip) when namespaces cannot be made; outside CI (``CI=true``) the module is
skipped unless run as root, since making namespaces needs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from logbuf.client import Aeron, Context, RegistrationError
from logbuf.client.stat import serve_prometheus
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.cnc import CncFile
from logbuf.conduit.counters import CountersReader
from logbuf.errors import ErrorCode
from logbuf.protocol import NakFrame
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess
from logbuf.testing.netns import NetnsNetwork, drivers_fixture, network_fixture, requires_netns
from tests.udp._children import HEADER
from tests.udp.test_udp_system import Child, InOrderReader

pytestmark = requires_netns

COUNT = int(os.environ.get("LOGBUF_FANOUT_COUNT", "20000"))
"""20,000 by default; LOGBUF_FANOUT_COUNT=200000 runs the full count."""
GROUP = "239.13.0.1"  # odd last octet: the control address is 239.13.0.2
CONTROL_GROUP = "239.13.0.2"
DRIVER_ARGS = [
    *("--dir-delete-on-shutdown", "false", "--driver-timeout", "5s", "--client-liveness-timeout", "5s"),
    *("--image-liveness-timeout", "3s", "--publication-connection-timeout", "3s", "--term-length", "4m"),
    *("--publication-linger-timeout", "1s", "--mdc-destination-timeout", "3s"),
]
RESULT_TIMEOUT_S = 240.0


net = network_fixture(4)


hosts = drivers_fixture(DRIVER_ARGS)
"""A driver on each host: [publisher host, receiver 1, receiver 2, receiver 3]."""


def multicast(port: int, host: int, **params: object) -> str:
    return f"aeron:udp?endpoint={GROUP}:{port}|interface=10.13.0.{host + 1}" + _params(params)


def _params(params: dict[str, object]) -> str:
    return "".join(f"|{k.replace('_', '-')}={v}" for k, v in params.items())


def counters_of(driver: DriverProcess, type_id: int) -> list[dict[str, Any]]:
    return [c for c in driver.counters() if c["type_id"] == type_id]


def run_stream(
    children: Callable[..., Child],
    hosts: list[DriverProcess],
    pub_channel: str,
    sub_channels: list[str],
    stream_id: int,
    *,
    count: int = COUNT,
    destinations: tuple[str, ...] = (),
    seed: int = 13,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Subscribers on hosts 1.., then the publisher on host 0; every subscriber's result checked."""
    subs = []
    for i, channel in enumerate(sub_channels, start=1):
        sub = children(
            "subscriber",
            directory=hosts[i].dir,
            channel=channel,
            stream_id=stream_id,
            seed=seed,
            timeout_s=RESULT_TIMEOUT_S,
        )
        sub.wait_ready()
        subs.append(sub)
    pub = children(
        "publisher",
        directory=hosts[0].dir,
        channel=pub_channel,
        stream_id=stream_id,
        seed=seed,
        timeout_s=RESULT_TIMEOUT_S,
        count=count,
        destinations=list(destinations),
        connect_timeout_s=30.0,
    )
    pub.wait_ready(60)
    published = pub.result(RESULT_TIMEOUT_S)
    results = [sub.result(RESULT_TIMEOUT_S) for sub in subs]
    for i, result in enumerate(results, start=1):
        assert result["errors"] == 0, f"receiver {i}: {result['first_errors']}"
        assert result["received"] == published["published"] == count, f"receiver {i}: {result}"
        assert result["crc"] == published["crc"], f"receiver {i}: stream CRC differs"
    return published, results


# -- delivery -------------------------------------------------------------------------------------------
# fc=min: "every receiver gets every message" holds only when the slowest sets the pace (under max a
# receiver more than a term behind the fastest loses data for good, as in Aeron); linger=30s: a closed
# publication stays to send its tail, which min paces to the slowest receiver.
def test_multicast_three_receivers_each_get_every_message_once_in_order(
    net: NetnsNetwork, hosts: list[DriverProcess], children: Callable[..., Child]
) -> None:
    sent_before = hosts[0].system_counter("Bytes sent")
    published, _ = run_stream(
        children,
        hosts,
        multicast(40501, 0, fc="min,g:/3", ttl=4, linger="30s"),
        [multicast(40501, i) for i in (1, 2, 3)],
        1001,
    )
    # one copy on the wire for three receivers: the sender sent about the stream once, not three times
    sent = hosts[0].system_counter("Bytes sent") - sent_before
    assert sent < 2 * published["position"], (sent, published["position"])


def test_mdc_dynamic_three_receivers_each_get_every_message_once_in_order(
    net: NetnsNetwork, hosts: list[DriverProcess], children: Callable[..., Child]
) -> None:
    control = f"{net.address(0)}:40610"
    run_stream(
        children,
        hosts,
        f"aeron:udp?control={control}|control-mode=dynamic|fc=min,g:/3|linger=30s",
        [f"aeron:udp?endpoint={net.address(i)}:40611|control={control}|control-mode=dynamic" for i in (1, 2, 3)],
        1002,
    )


def test_mdc_manual_three_receivers_each_get_every_message_once_in_order(
    net: NetnsNetwork, hosts: list[DriverProcess], children: Callable[..., Child]
) -> None:
    endpoints = [f"aeron:udp?endpoint={net.address(i)}:40621" for i in (1, 2, 3)]
    run_stream(
        children,
        hosts,
        "aeron:udp?control-mode=manual|fc=min,g:/3|linger=30s",
        endpoints,
        1003,
        destinations=tuple(endpoints),
    )


def test_mdc_num_dest_counts_manual_destinations_added_and_removed(
    net: NetnsNetwork, hosts: list[DriverProcess]
) -> None:
    with Aeron.connect(Context(dir=hosts[0].dir, driver_timeout_ns=5_000_000_000)) as aeron:
        pub = aeron.add_publication(f"aeron:udp?control={net.address(0)}:40631|control-mode=manual", 1004)
        dests = [f"aeron:udp?endpoint={net.address(i)}:40632" for i in (1, 2, 3)]
        for d in dests:
            pub.add_destination(d)

        def mdc_count() -> int:
            values = [c["value"] for c in counters_of(hosts[0], cd.MDC_DESTINATIONS_TYPE_ID) if "40631" in c["label"]]
            assert len(values) == 1
            return int(values[0])

        wait_until(lambda: mdc_count() == 3, 10, "mdc-num-dest == 3")
        pub.remove_destination(dests[1])
        wait_until(lambda: mdc_count() == 2, 10, "mdc-num-dest == 2")
        hosts[0].expected_errors += ["only be added to a control-mode=manual", "unknown destination"]
        with pytest.raises(RegistrationError, match="unknown destination"):
            pub.remove_destination(dests[1])
        dynamic = aeron.add_publication(f"aeron:udp?control={net.address(0)}:40633|control-mode=dynamic", 1004)
        with pytest.raises(RegistrationError, match="control-mode=manual") as info:
            dynamic.add_destination(dests[0])
        assert info.value.error_code == ErrorCode.INVALID_CHANNEL
        pub.close()


# -- loss and flow control --------------------------------------------------------------------------------
def stream_counter(driver: DriverProcess, type_id: int, port: int) -> int:
    values = [c["value"] for c in counters_of(driver, type_id) if f":{port}" in c["label"]]
    assert len(values) == 1, f"no single counter of type {type_id} for port {port}: {values}"
    return int(values[0])


class PositionSampler:
    """Samples one stream's position counters on several drivers, read from their cnc.dat as logbuf-stat
    reads them, on a thread, every couple of milliseconds until stopped: no clocks in the verdict.

    ``sources`` are (driver, counter type id) pairs, read in their order within each sample."""

    def __init__(self, sources: list[tuple[DriverProcess, int]], port: int) -> None:
        self.sources = sources
        self.port = port
        self.samples: list[tuple[int, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="position-sampler", daemon=True)
        self._cncs = [CncFile.open(driver.dir) for driver, _ in sources]
        self._readers = [CountersReader(cnc.counters_metadata, cnc.counters_values) for cnc in self._cncs]

    def __enter__(self) -> PositionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for cnc in self._cncs:
            cnc.close()

    def _find(self) -> list[int] | None:
        ids = []
        for reader, (_, type_id) in zip(self._readers, self.sources, strict=True):
            found = [c.counter_id for c in reader if c.type_id == type_id and f":{self.port}" in c.label]
            if len(found) != 1:
                return None
            ids.append(found[0])
        return ids

    def _run(self) -> None:
        ids = None
        while ids is None and not self._stop.wait(0.01):  # the image counters appear once each receiver joins
            ids = self._find()
        if ids is None:
            return
        pairs = list(zip(self._readers, ids, strict=True))
        while not self._stop.wait(0.002):
            self.samples.append(tuple(reader.value(counter_id) for reader, counter_id in pairs))


RECEIVER_WINDOW = 128 * 1024
"""The receivers' window (the driver's initial window; the 4 MiB term's half is larger)."""
PAD_ALLOWANCE = 256
"""How far past its limit the fc=min test lets the sender be: a padding frame at a term's end is skipped whole.
Not one frame of this stream: its messages have mixed sizes (``message_sizes`` in tests/udp/_children.py), so
such a pad can be up to an MTU long; 256 B covers the one excess seen (160 B) and no more."""


MAX_FC_COUNT = 12_000
"""Messages of the fc=max loss test: 3.49 MB of frames, under the 4 MiB term (a receiver a term behind
the sender could never be repaired)."""


@pytest.mark.parametrize("fc, port, stream_id", [("max", 40711, 1012), ("min", 40641, 1005)])
def test_five_percent_loss_on_one_receiver_recovers_by_naks_and_paces_the_sender_only_under_min(
    net: NetnsNetwork, hosts: list[DriverProcess], children: Callable[..., Child], fc: str, port: int, stream_id: int
) -> None:
    """Receiver 3 loses 5 % of what reaches it and repairs it by NAKs. While the stream runs, the sender's
    position and the receivers' rcv-pos (contiguous data received) are sampled from the drivers' counters.

    Under fc=min the sender's limit is the slowest receiver's consumption plus its window, so the sender
    is never more than a window ahead of receiver 3's rcv-pos (the sender position is read first: the
    receiver's can only have grown since). Under fc=max it paces to the fastest: while receiver 3 waits
    for a repair the sender, and the lossless receivers with it, run more than a window past it, which
    pacing to receiver 3 could never allow.

    Under max a receiver may fall far behind the sender (receiver 3, or one whose socket overflowed on a
    loaded machine) and repairs that by NAKs, window by window, after the sender is done. So that it can:
    linger=30s, since nothing else holds the closed publication for it (with the drivers' 1 s linger its
    image went with the stream's tail), and a stream shorter than a term (MAX_FC_COUNT), since what lies a
    term behind the sender is never resent (under max that receiver loses it for good, as in Aeron; it
    happened here at load 10). The linger is an upper bound: the test ends when every subscriber has the
    end marker."""
    naks_before = [h.system_counter("NAKs sent") for h in hosts]
    retransmits_before = hosts[0].system_counter("Retransmits sent")
    sources = [
        (hosts[0], cd.SENDER_POSITION_TYPE_ID),
        (hosts[1], cd.RECEIVER_POSITION_TYPE_ID),
        (hosts[2], cd.RECEIVER_POSITION_TYPE_ID),
        (hosts[3], cd.RECEIVER_POSITION_TYPE_ID),
    ]
    net.add_loss(3, 0.05)
    try:
        with PositionSampler(sources, port) as sampler:
            run_stream(
                children,
                hosts,
                multicast(port, 0, fc=f"{fc},g:/3", linger="30s"),
                [multicast(port, i) for i in (1, 2, 3)],
                stream_id,
                count=COUNT if fc == "min" else min(COUNT, MAX_FC_COUNT),
            )
        assert net.dropped(3) > 0, "the loss rule dropped nothing"
    finally:
        net.clear_loss(3)
    assert hosts[3].system_counter("NAKs sent") > naks_before[3], "the lossy receiver never NAKed"
    assert hosts[0].system_counter("Retransmits sent") > retransmits_before
    samples = sampler.samples
    assert len(samples) >= 20, f"only {len(samples)} samples of the stream's positions"
    sender_lead = max(sender - lossy for sender, _, _, lossy in samples)
    lossless_lead = max(min(first, second) - lossy for _, first, second, lossy in samples)
    assert lossless_lead > 0, "the lossless receivers were never ahead of the lossy one: did loss happen?"
    if fc == "min":
        # A padding frame at a term's end is skipped whole (Aeron's TermScanner adds its padding to the sender
        # position), so the sender may pass its limit by part of a frame (PAD_ALLOWANCE).
        assert sender_lead < RECEIVER_WINDOW + PAD_ALLOWANCE, (
            f"the sender ran {sender_lead} B past the lossy receiver under min"
        )
    else:
        assert sender_lead > RECEIVER_WINDOW, (
            f"under max the sender stayed within {sender_lead} B of the lossy receiver"
        )
        assert lossless_lead > RECEIVER_WINDOW, f"under max the lossless receivers led by at most {lossless_lead} B"


class Publisher:
    """An in-process publication offering numbered 200-byte messages."""

    SIZE = 200

    def __init__(self, aeron: Aeron, channel: str, stream_id: int) -> None:
        self.publication = aeron.add_publication(channel, stream_id)
        self.seq = 0
        self.buffer = bytearray(self.SIZE)

    def offer_some(self, limit: int = 256) -> int:
        """Offer up to ``limit`` messages; stops at the first refusal. Returns how many went."""
        sent = 0
        while sent < limit:
            body = bytes(self.buffer[HEADER.size :])
            HEADER.pack_into(self.buffer, 0, self.seq, self.SIZE, zlib.crc32(body))
            if self.publication.offer(self.buffer) < 0:
                break
            self.seq += 1
            sent += 1
        return sent


def pump(publisher: Publisher, readers: list[Any], until: Callable[[], bool], timeout_s: float, what: str) -> None:
    def step() -> None:
        publisher.offer_some()
        for reader in readers:
            reader.poll()

    wait_until(until, timeout_s, what, do_work=step)


def stalled_then_free(
    net: NetnsNetwork, hosts: list[DriverProcess], fc: str, port: int, stream_id: int, gtags: tuple[str, str, str]
) -> tuple[Publisher, list[Any], Any, list[Aeron]]:
    """Receivers 1 and 2 read; receiver 3 subscribes but never polls. Returns the publisher, the two
    readers, receiver 3's subscription and the clients (closed by the caller)."""
    clients = [Aeron.connect(Context(dir=h.dir, driver_timeout_ns=5_000_000_000)) for h in hosts]
    subs = [
        clients[i].add_subscription(multicast(port, i) + (f"|gtag={gtags[i - 1]}" if gtags[i - 1] else ""), stream_id)
        for i in (1, 2, 3)
    ]
    publisher = Publisher(clients[0], multicast(port, 0, fc=fc), stream_id)
    readers = [InOrderReader(s) for s in subs[:2]]
    wait_until(lambda: all(s.image_count for s in subs), 30, "three images", do_work=publisher.offer_some)
    return publisher, readers, subs[2], clients


def test_min_paces_the_publisher_to_a_receiver_that_stops_reading(
    net: NetnsNetwork, hosts: list[DriverProcess]
) -> None:
    publisher, readers, _, clients = stalled_then_free(net, hosts, "min,g:/3", 40651, 1006, ("", "", ""))
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            publisher.offer_some()
            for r in readers:
                r.poll()
        window = RECEIVER_WINDOW
        sender_position = stream_counter(hosts[0], cd.SENDER_POSITION_TYPE_ID, 40651)
        stalled = stream_counter(hosts[3], cd.RECEIVER_POSITION_TYPE_ID, 40651)
        assert sender_position <= stalled + window, (sender_position, stalled)
        assert all(not r.errors for r in readers)
        # logbuf-stat on the publisher's host shows each receiver, where it is, and who is slow
        (stream,) = [
            s for s in hosts[0].stat_json()["streams"] if s["stream_id"] == 1006 and s["kind"] == "publication"
        ]
        assert stream["flow_control_receivers"] == 3
        receivers = {r["address"].split(":")[0]: r for r in stream["receivers"]}
        assert set(receivers) == {net.address(i) for i in (1, 2, 3)}, stream["receivers"]
        slowest = [address for address, r in receivers.items() if r["slowest"]]
        assert slowest == [net.address(3)], stream["receivers"]
        consumed = stream_counter(hosts[3], cd.SUBSCRIBER_POSITION_TYPE_ID, 40651)  # what its SMs report
        assert receivers[net.address(3)]["position"] == consumed
        # and the Prometheus exporter has them too
        server, reader = serve_prometheus(hosts[0].dir, 0)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=30) as response:
                metrics = response.read().decode()
        finally:
            server.shutdown()
            server.server_close()
            reader.close()
        lines = [line for line in metrics.splitlines() if line.startswith("logbuf_group_receiver_position_bytes{")]
        assert sorted(net.address(i) in " ".join(lines) for i in (1, 2, 3)) == [True] * 3, lines
    finally:
        for c in clients:
            c.close()


def test_max_and_tagged_do_not_wait_for_a_receiver_that_stops_reading(
    net: NetnsNetwork, hosts: list[DriverProcess]
) -> None:
    total = 4 * 1024 * 1024  # 32 windows of the stalled receiver
    for fc, port, stream_id, gtags, members in (
        ("max,g:/3", 40661, 1007, ("", "", ""), 3),
        ("tagged,g:7/2", 40671, 1008, ("7", "7", ""), 2),
    ):
        publisher, readers, _, clients = stalled_then_free(net, hosts, fc, port, stream_id, gtags)
        try:
            target = total // Publisher.SIZE
            pump(
                publisher,
                readers,
                lambda: all(r.received >= target for r in readers),
                120,
                f"fc={fc}: readers to get {target} messages",
            )
            assert all(not r.errors for r in readers), [r.errors for r in readers]
            assert stream_counter(hosts[0], cd.SENDER_POSITION_TYPE_ID, port) > total
            assert stream_counter(hosts[0], cd.FLOW_CONTROL_RECEIVERS_TYPE_ID, port) == members
        finally:
            for c in clients:
                c.close()


def test_late_joiner_starts_at_the_current_position(net: NetnsNetwork, hosts: list[DriverProcess]) -> None:
    clients = [Aeron.connect(Context(dir=h.dir, driver_timeout_ns=5_000_000_000)) for h in hosts]
    try:
        readers = [InOrderReader(clients[i].add_subscription(multicast(40681, i), 1009)) for i in (1, 2)]
        publisher = Publisher(clients[0], multicast(40681, 0, fc="max,g:/2"), 1009)
        pump(publisher, readers, lambda: all(r.received >= 5000 for r in readers), 60, "5000 messages before the join")
        late = InOrderReader(clients[3].add_subscription(multicast(40681, 3), 1009))
        pump(publisher, [*readers, late], lambda: late.received >= 1000, 60, "the late joiner to get 1000 messages")
        (first,) = late.first_seq.values()
        assert first >= 5000, f"the late joiner started at seq {first}, not at the current position"
        assert not late.errors and all(not r.errors for r in readers)
    finally:
        for c in clients:
            c.close()


NAK_ATTACKER = """
import socket, sys, time
naks = [bytes.fromhex(line) for line in sys.stdin.read().split()]
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 4)
    for i, nak in enumerate(naks):
        s.sendto(nak, (sys.argv[1], int(sys.argv[2])))
        if i % 50 == 49:
            time.sleep(0.005)  # pace: within the driver's socket buffer
print(len(naks))
"""
"""Run in a host's namespace: sends the NAKs (hex, one per line on stdin) to a group and port, ~10,000/s."""


def test_naks_from_a_host_that_is_no_receiver_of_a_multicast_publication_get_nothing(
    net: NetnsNetwork, hosts: list[DriverProcess]
) -> None:
    """Host 3 subscribes to nothing but sends NAKs to the publication's control group (239.13.0.2), as
    any host on the network can: stepped offsets over what was sent, each asking for 1 MiB. The sender
    counts them as NAKs from non-receivers and resends nothing for them, while receivers 1 and 2 get
    every message once, in order. Its NAKs reach the publication's control socket as the members' do."""
    port, stream_id, count = 40721, 1013, 2_000
    clients = [Aeron.connect(Context(dir=h.dir, driver_timeout_ns=5_000_000_000)) for h in hosts[:3]]
    try:
        readers = [InOrderReader(clients[i].add_subscription(multicast(port, i), stream_id)) for i in (1, 2)]
        publisher = Publisher(clients[0], multicast(port, 0, fc="min,g:/2"), stream_id)
        pump(publisher, readers, lambda: all(r.received >= 500 for r in readers), 60, "500 messages each")
        image = readers[0].subscription.images[0]
        term_id = image.initial_term_id + image.position // image.term_length
        offsets = [o % image.term_length for o in range(image.position % image.term_length - 65536, image.position, 32)]
        naks = [NakFrame(publisher.publication.session_id, stream_id, term_id, o, 1 << 20).encode() for o in offsets]
        attack = [b.hex() for b in naks[-count:]]
        before = {
            name: hosts[0].system_counter(name)
            for name in ("NAKs received", "NAKs from non-receivers", "Retransmits sent", "Retransmitted bytes")
        }
        honest_before = sum(hosts[i].system_counter("NAKs sent") for i in (1, 2))
        attacker = subprocess.Popen(
            ["ip", "netns", "exec", net.host(3), sys.executable, "-c", NAK_ATTACKER, CONTROL_GROUP, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = attacker.communicate("\n".join(attack), timeout=60)
        finally:
            if attacker.poll() is None:
                attacker.kill()
                attacker.wait(10)
        assert attacker.returncode == 0 and out.split() == [str(len(attack))], err
        target = readers[0].received + 2_000
        pump(
            publisher,
            readers,
            lambda: (
                all(r.received >= target for r in readers)
                and hosts[0].system_counter("NAKs received") - before["NAKs received"] >= len(attack) // 2
            ),
            60,
            "2000 more messages each, and the non-member's NAKs counted",
        )
        assert all(not r.errors for r in readers), [r.errors for r in readers]
        after = {name: hosts[0].system_counter(name) for name in before}
        honest_naks = sum(hosts[i].system_counter("NAKs sent") for i in (1, 2)) - honest_before
    finally:
        for c in clients:
            c.close()
    received = after["NAKs received"] - before["NAKs received"]
    from_non_receivers = after["NAKs from non-receivers"] - before["NAKs from non-receivers"]
    # every NAK the sender read came from host 3, but for any the members sent (no loss here: rarely any)
    assert from_non_receivers >= received - honest_naks > 0, (received, honest_naks, from_non_receivers)
    assert after["Retransmits sent"] - before["Retransmits sent"] <= honest_naks, after
    if honest_naks == 0:
        assert after["Retransmitted bytes"] == before["Retransmitted bytes"]


def test_min_stops_waiting_for_a_killed_receiver_after_its_timeout(
    net: NetnsNetwork, hosts: list[DriverProcess]
) -> None:
    """Last in the module: it kills receiver 3's driver (and starts it again)."""
    clients = [Aeron.connect(Context(dir=h.dir, driver_timeout_ns=5_000_000_000)) for h in hosts[:3]]
    try:
        readers = [InOrderReader(clients[i].add_subscription(multicast(40691, i), 1010)) for i in (1, 2)]
        with Aeron.connect(Context(dir=hosts[3].dir, driver_timeout_ns=5_000_000_000)) as third:
            doomed = third.add_subscription(multicast(40691, 3), 1010)
            publisher = Publisher(clients[0], multicast(40691, 0, fc="min,t:2s"), 1010)
            wait_until(lambda: doomed.image_count > 0, 30, "receiver 3's image", do_work=publisher.offer_some)
            pump(publisher, [*readers, InOrderReader(doomed)], lambda: readers[0].received >= 2000, 60, "2000 messages")
            assert stream_counter(hosts[0], cd.FLOW_CONTROL_RECEIVERS_TYPE_ID, 40691) == 3
            hosts[3].kill()
            stuck_at = stream_counter(hosts[0], cd.SENDER_POSITION_TYPE_ID, 40691)
            pump(
                publisher,
                readers,
                lambda: stream_counter(hosts[0], cd.FLOW_CONTROL_RECEIVERS_TYPE_ID, 40691) == 2,
                30,
                "receiver 3 to leave the group",
            )
            pump(
                publisher,
                readers,
                lambda: stream_counter(hosts[0], cd.SENDER_POSITION_TYPE_ID, 40691) > stuck_at + 1024 * 1024,
                60,
                "the sender to go on without receiver 3",
            )
            assert all(not r.errors for r in readers)
    finally:
        for c in clients:
            c.close()
        hosts[3].start()


def test_a_receiver_that_unsubscribes_leaves_the_min_group_at_once_by_end_of_stream(
    net: NetnsNetwork, hosts: list[DriverProcess]
) -> None:
    clients = [Aeron.connect(Context(dir=h.dir, driver_timeout_ns=5_000_000_000)) for h in hosts]
    try:
        subs = [clients[i].add_subscription(multicast(40701, i), 1011) for i in (1, 2, 3)]
        readers = [InOrderReader(s) for s in subs]
        publisher = Publisher(clients[0], multicast(40701, 0, fc="min,t:120s,g:/3"), 1011)
        pump(publisher, readers, lambda: all(r.received >= 1000 for r in readers), 60, "1000 messages each")
        assert stream_counter(hosts[0], cd.FLOW_CONTROL_RECEIVERS_TYPE_ID, 40701) == 3
        subs[2].close()  # its driver sends an SM with the EOS flag: no waiting out the 120 s timeout
        pump(
            publisher,
            readers[:2],
            lambda: stream_counter(hosts[0], cd.FLOW_CONTROL_RECEIVERS_TYPE_ID, 40701) == 2,
            30,
            "receiver 3 to leave the group",
        )
        assert all(not r.errors for r in readers)
    finally:
        for c in clients:
            c.close()
