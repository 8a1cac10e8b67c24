"""What remote attacks do to two real drivers and their stream.

Suite ``remote``: each case starts a sending and a receiving driver, connects an honest stream, attacks
it with crafted datagrams from a raw UDP socket, then streams 3,000 more messages and reports what came
through, the drivers' counters (errors, invalid packets, spoofed frames, rejected images), leaked image
files and the receiving driver's RSS. Its last case is local: a second client of the receiving driver
holds 1,000 UDP subscriptions while the honest stream runs.

Suite ``nak``: NAK amplification and dynamic MDC. Each case streams for a few seconds without attack,
then as long again while a child process sends NAKs (forged with the receiver's own address through a
raw IP socket, or from 127.0.0.2, which is no receiver), and reports the live rate in both phases, the
NAKs sent and what the sender resent: amplification = retransmitted bytes / NAK bytes (payload, 28 bytes
a NAK; ``amplification_wire`` counts 56 with the IP and UDP headers, as the first report of this attack
did). The last cases send a dynamic MDC publication a handful of SMs from a victim's address, with and
without ``--mdc-dynamic-allow``, and count what the victim is sent.

Run before and after a fix: ``python perf/udp_attacks.py --suite nak --label before``; each run writes
``perf/results/udp_attacks_<suite>_<label>.json`` with the machine load beside the figures (a shared,
loaded machine: compare ratios measured in one run, not absolute rates across runs).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import random
import socket
import time
from collections.abc import Callable
from typing import Any

from _common import new_results, quiet, write_results

from logbuf.client import Aeron, Context, FragmentAssembler, OfferResult
from logbuf.conduit.cnc import CncFile
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import DataFrame, HeartbeatFrame, SetupFrame, StatusMessageFrame
from logbuf.testing import wait_until
from logbuf.testing.checked_stream import message, stream
from logbuf.testing.driver_process import DriverProcess
from logbuf.testing.host import free_udp_port, free_udp_ports, rss_bytes
from logbuf.testing.nak_flood import flood, naks_at_term_start, stepped_naks_at

DRIVER_ARGS = ["--dir-delete-on-shutdown", "false", "--term-length", "1m", "--image-liveness-timeout", "2s"]
"""Both drivers of every case: 1 MiB terms, images lost 2 s after their last frame."""
WATCHED = ("Errors", "Invalid packets", "Spoofed frames dropped", "Images rejected", "Active images")


def run_case(name: str, attack: Any) -> dict[str, Any]:
    a, b = DriverProcess(args=DRIVER_ARGS).start(), DriverProcess(args=DRIVER_ARGS).start()
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    port = int(channel.rsplit(":", 1)[1])
    result: dict[str, Any] = {"case": name}
    try:
        with (
            Aeron.connect(Context(dir=a.dir)) as sender,
            Aeron.connect(Context(dir=b.dir)) as receiver,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw,
        ):
            raw.bind(("127.0.0.1", 0))
            sub = receiver.add_subscription(channel, 30)
            pub = sender.add_publication(channel, 30)
            wait_until(lambda: pub.is_connected and bool(sub.images), 20, "connection")
            assert stream(pub, [sub], 200, 60) == [list(range(200))]
            rss_before = rss_bytes(b.pid)
            started = time.monotonic()
            result.update(attack(raw, ("127.0.0.1", port), pub, sub) or {})
            result["attack_s"] = round(time.monotonic() - started, 2)
            time.sleep(1.0)
            try:
                got = stream(pub, [sub], 3_000, 40)[0]
                result["stream_after"] = "intact" if got == list(range(3_000)) else f"{len(got)} of 3000, out of order"
            except AssertionError as e:
                result["stream_after"] = f"stalled: {str(e).splitlines()[0]}"
            result["receiver_rss_growth_mb"] = round((rss_bytes(b.pid) - rss_before) / 2**20, 1)
            result["image_files"] = len(os.listdir(os.path.join(b.dir, "images")))
            for role, driver in (("sender", a), ("receiver", b)):
                values = driver.system_counters()
                result[role] = {k: values[k] for k in WATCHED if k in values}
                result[role]["alive"] = driver.alive
                result[role]["distinct_errors"] = len(driver.errors())
    finally:
        for driver in (a, b):
            driver.stop()
            driver.remove()
    print(result, flush=True)
    return result


def control_address(sub: Any) -> tuple[str, int]:
    host, port = sub.images[0].source_identity.rsplit(":", 1)
    return host, int(port)


def forged_sm(raw: socket.socket, target: Any, pub: Any, sub: Any) -> dict[str, Any]:
    image = sub.images[0]
    term_id = image.initial_term_id + image.position // image.term_length
    # 1 MiB terms here: 5,000 terms ahead is past 2^31 bytes, as 1,000 is with the default 16 MiB terms
    raw.sendto(StatusMessageFrame(pub.session_id, 30, term_id + 5000, 0, 0, 1).encode(), control_address(sub))
    return {}


def setup_active_before_initial(raw: socket.socket, target: Any, pub: Any, sub: Any) -> dict[str, Any]:
    raw.sendto(SetupFrame(0, 501, 30, 100, 50, 65536, 1408).encode(), target)
    return {}


def setup_flood(raw: socket.socket, target: Any, pub: Any, sub: Any) -> dict[str, Any]:
    raw.sendto(SetupFrame(0, 900, 30, 0, 0, 256 * 1024 * 1024, 1408).encode(), target)  # a 256 MiB term
    for i in range(2_000):  # a new session per datagram, about 1k/s
        raw.sendto(SetupFrame(0, 10_000 + i, 30, 0, 0, 65536, 1408).encode(), target)
        time.sleep(0.001)
    return {"images_seen_by_subscriber": len(sub.images)}


def random_session_data(raw: socket.socket, target: Any, pub: Any, sub: Any) -> dict[str, Any]:
    rng = random.Random(4)
    for i in range(60_000):
        raw.sendto(DataFrame(0, rng.getrandbits(31), 30, 0, b"x" * 64).encode(), target)
        if i % 200 == 0:
            time.sleep(0.005)
    return {}


def spoofed_data_and_eos(raw: socket.socket, target: Any, pub: Any, sub: Any) -> dict[str, Any]:
    image = sub.images[0]
    position = image.position
    term_id, term_offset = image.initial_term_id + position // image.term_length, position % image.term_length
    raw.sendto(DataFrame(term_offset, pub.session_id, 30, term_id, b"forged").encode(), target)
    time.sleep(0.3)
    pub.offer(b"real")
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        sub.poll(lambda buffer, header: got.append(bytes(buffer)), 10)
    raw.sendto(
        HeartbeatFrame(term_offset + 64, pub.session_id, 30, term_id, flags=dh.BEGIN_END_AND_EOS_FLAGS).encode(),
        target,
    )
    time.sleep(0.5)
    return {
        "delivered_instead_of_real": [g.decode(errors="replace") for g in got],
        "image_end_of_stream": image.is_end_of_stream,
    }


HOG_ENDPOINTS = 1_000
"""Below the ~1,020 sockets at which the idle park's select() killed the driver, so before and after compare."""


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def udp_endpoint_hog(raw: socket.socket, target: Any, pub: Any, sub: Any) -> dict[str, Any]:
    """Not a remote attack: a second local client of the receiving driver opens 1,000 UDP subscriptions,
    each on its own port, and holds them while the honest stream runs 3,000 messages. Reports the time to
    open them, the driver's RSS growth, its CPU while idle with them open, and the honest stream."""
    directory = sub._conductor.ctx.dir  # the receiving driver's
    cnc = CncFile.open(directory)
    pid = cnc.pid
    cnc.close()
    ports = free_udp_ports(HOG_ENDPOINTS)
    rss_before = rss_bytes(pid)
    with Aeron.connect(Context(dir=directory)) as hog:
        started = time.monotonic()
        for port in ports:
            hog.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 1001)
        opened_s = time.monotonic() - started
        time.sleep(1.0)
        cpu_before, idle_started = process_cpu_s(pid), time.monotonic()
        time.sleep(3.0)
        idle_cpu_pct = 100 * (process_cpu_s(pid) - cpu_before) / (time.monotonic() - idle_started)
        rss_growth = rss_bytes(pid) - rss_before
        try:
            got = stream(pub, [sub], 3_000, 40)[0]
            beside = "intact" if got == list(range(3_000)) else f"{len(got)} of 3000, out of order"
        except AssertionError as e:
            beside = f"stalled: {str(e).splitlines()[0]}"
    return {
        "hog_endpoints": HOG_ENDPOINTS,
        "hog_open_s": round(opened_s, 2),
        "hog_rss_growth_mb": round(rss_growth / 2**20, 1),
        "hog_idle_driver_cpu_pct": round(idle_cpu_pct, 1),
        "stream_beside_hog": beside,
    }


CASES = {
    "forged SM (term id +5000 of 1 MiB, window 0)": forged_sm,
    "SETUP active term before initial": setup_active_before_initial,
    "SETUP flood (2,000 sessions, one 256 MiB term)": setup_flood,
    "DATA with 60,000 random session ids": random_session_data,
    "spoofed DATA and EOS from another address": spoofed_data_and_eos,
    "local client with 1,000 UDP subscriptions": udp_endpoint_hog,
}


# -- NAK amplification and dynamic MDC ----------------------------------------------------------------------
PHASE_S = 4.0
NAK_WATCHED = (
    "NAKs received",
    "Retransmits sent",
    "Retransmitted bytes",
    "NAKs from non-receivers",
    "NAKs malformed",
    "NAKs with nothing to resend",
    "Retransmit Pool Overflow count",
    "Retransmits rate limited",
    "Spoofed frames dropped",
    "Invalid packets",
)


class LiveStream:
    """Offers numbered messages and polls them back; checks each arrives once, in order."""

    def __init__(self, pub: Any, sub: Any) -> None:
        self.pub, self.sub = pub, sub
        self.sent = 0
        self.received: list[int] = []
        self.assembler = FragmentAssembler(
            lambda buffer, header: self.received.append(int.from_bytes(bytes(buffer[:8]), "little"))
        )

    def run(self, seconds: float, tick: Callable[[], None] = lambda: None) -> int:
        """Messages received in ``seconds``."""
        before = len(self.received)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            result = self.pub.offer(message(self.sent))
            if result > 0:
                self.sent += 1
            elif result not in (OfferResult.BACK_PRESSURED, OfferResult.ADMIN_ACTION):
                raise AssertionError(OfferResult(result).name)
            self.sub.poll(self.assembler, 64)
            tick()
        return len(self.received) - before

    @property
    def in_order(self) -> bool | str:
        """True, or where the sequence first goes wrong."""
        for i, seq in enumerate(self.received):
            if seq != i:
                return f"message {i} is {seq} (of {len(self.received)} received, {self.sent} sent)"
        return True


def run_nak_case(
    name: str, *, mdc: bool, source: str, rate: int, pattern: Callable[..., list[bytes]]
) -> dict[str, Any]:
    a, b = DriverProcess(args=DRIVER_ARGS).start(), DriverProcess(args=DRIVER_ARGS).start()
    data, control = free_udp_port(), free_udp_port()
    if mdc:
        pub_channel = f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic"
        sub_channel = f"aeron:udp?endpoint=127.0.0.1:{data}|control=127.0.0.1:{control}"
    else:
        pub_channel = sub_channel = f"aeron:udp?endpoint=127.0.0.1:{data}"
    attacker = ("127.0.0.1", data) if source == "receiver" else ("127.0.0.2", 40999)
    result: dict[str, Any] = {"case": name, "nak_rate_per_s": rate}
    try:
        with Aeron.connect(Context(dir=a.dir)) as sender, Aeron.connect(Context(dir=b.dir)) as receiver:
            sub = receiver.add_subscription(sub_channel, 50)
            pub = sender.add_publication(pub_channel, 50)
            wait_until(lambda: pub.is_connected and bool(sub.images), 20, "connection")
            image = sub.images[0]
            host, port = image.source_identity.rsplit(":", 1)
            live = LiveStream(pub, sub)
            live.run(1.0)  # warm up
            before = a.system_counters()
            result["live_msgs_per_s_without"] = round(live.run(PHASE_S) / PHASE_S)
            quiet_resent = a.system_counters()["Retransmitted bytes"] - before["Retransmitted bytes"]
            spawn = multiprocessing.get_context("spawn")
            position, sent, stop = spawn.Value("q", image.position), spawn.Value("q", 0), spawn.Event()
            stream_fields = (pub.session_id, 50, image.initial_term_id, image.term_length)
            child = spawn.Process(
                target=flood, args=((host, int(port)), attacker, stream_fields, position, sent, stop, rate, pattern)
            )
            child.start()
            try:
                wait_until(lambda: sent.value > 0, 30, "the flood started")
                before, naks_before = a.system_counters(), sent.value
                got = live.run(PHASE_S, lambda: setattr(position, "value", image.position))
                after, naks = a.system_counters(), sent.value - naks_before
            finally:
                stop.set()
                child.join(10)
                if child.is_alive():
                    child.kill()
            resent = after["Retransmitted bytes"] - before["Retransmitted bytes"]
            result["live_msgs_per_s_with"] = round(got / PHASE_S)
            result["live_rate_ratio"] = round(got / PHASE_S / max(1, result["live_msgs_per_s_without"]), 2)
            result["naks_sent"] = naks
            result["resent_bytes_without_attack"] = quiet_resent
            result["resent_bytes"] = resent
            result["amplification"] = round(resent / max(1, naks * 28), 2)
            result["amplification_wire"] = round(resent / max(1, naks * 56), 2)
            result["in_order"] = live.in_order
            result["sender"] = {k: after.get(k, 0) - before.get(k, 0) for k in NAK_WATCHED if k in after}
            result["errors"] = len(a.errors()) + len(b.errors())
    finally:
        for driver in (a, b):
            driver.stop()
            driver.remove()
    print(result, flush=True)
    return result


def run_mdc_victim_case(name: str, allow: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"case": name}
    try:
        a = DriverProcess(args=[*DRIVER_ARGS, *allow]).start()
    except AssertionError as e:  # a driver without the setting
        result["skipped"] = str(e).splitlines()[0][:200]
        print(result, flush=True)
        return result
    b = DriverProcess(args=DRIVER_ARGS).start()
    data, control = free_udp_port(), free_udp_port()
    try:
        with (
            Aeron.connect(Context(dir=a.dir)) as sender,
            Aeron.connect(Context(dir=b.dir)) as receiver,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as victim,
        ):
            victim.bind(("127.0.0.2", 0))
            victim.setblocking(False)
            sub = receiver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{data}|control=127.0.0.1:{control}", 51)
            pub = sender.add_publication(f"aeron:udp?control=127.0.0.1:{control}|control-mode=dynamic", 51)
            wait_until(lambda: pub.is_connected and bool(sub.images), 20, "connection")
            image = sub.images[0]
            term_id = image.initial_term_id + image.position // image.term_length
            for i in range(6):  # as the attack measured: six SMs from the victim's address
                sm = StatusMessageFrame(pub.session_id, 51, term_id, 0, 64 * 1024, 666, flags=0x80 if i == 0 else 0)
                victim.sendto(sm.encode(), ("127.0.0.1", control))
            live = LiveStream(pub, sub)
            victim_bytes = 0

            def drain() -> None:
                nonlocal victim_bytes
                try:
                    while True:
                        victim_bytes += len(victim.recv(65536))
                except BlockingIOError:
                    pass

            got = live.run(5.0, drain)
            result["live_msgs"] = got
            result["victim_bytes_in_5_s"] = victim_bytes
            result["in_order"] = live.in_order
            values = a.system_counters()
            result["status_messages_rejected"] = values.get("Status Messages rejected", 0)
    finally:
        for driver in (a, b):
            driver.stop()
            driver.remove()
    print(result, flush=True)
    return result


NAK_FLOODS: tuple[tuple[str, bool, str, int, Callable[..., list[bytes]]], ...] = (
    # (case, MDC dynamic?, NAK source, NAKs per second, pattern)
    ("forged NAKs from the receiver's address, offset 0, 100/s", False, "receiver", 100, naks_at_term_start),
    ("forged NAKs from the receiver's address, stepped offsets, 100/s", False, "receiver", 100, stepped_naks_at),
    ("forged NAKs from the receiver's address, stepped offsets, 3,000/s", False, "receiver", 3_000, stepped_naks_at),
    ("unicast, NAKs from a non-member (127.0.0.2), stepped, 3,000/s", False, "non-member", 3_000, stepped_naks_at),
    ("MDC dynamic, NAKs from a non-member (127.0.0.2), offset 0, 100/s", True, "non-member", 100, naks_at_term_start),
    ("MDC dynamic, NAKs from a non-member (127.0.0.2), stepped, 3,000/s", True, "non-member", 3_000, stepped_naks_at),
)
MDC_VICTIM_CASES: tuple[tuple[str, list[str]], ...] = (
    ("MDC dynamic, 6 SMs from a victim's address (default settings)", []),
    (
        "MDC dynamic, 6 SMs from a victim's address (--mdc-dynamic-allow 127.0.0.1)",
        ["--mdc-dynamic-allow", "127.0.0.1"],
    ),
)
NAK_CASES: list[Callable[[], dict[str, Any]]] = [
    *(
        functools.partial(run_nak_case, name, mdc=mdc, source=source, rate=rate, pattern=pattern)
        for name, mdc, source, rate, pattern in NAK_FLOODS
    ),
    *(functools.partial(run_mdc_victim_case, name, allow) for name, allow in MDC_VICTIM_CASES),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", default="after")
    parser.add_argument("--suite", choices=("remote", "nak"), default="nak")
    parser.add_argument("--cases", default="", help="comma-separated case numbers (from 0); default all")
    args = parser.parse_args()
    quiet()
    results = new_results(f"udp_attacks_{args.suite}_{args.label}", load_before=os.getloadavg())
    wanted = {int(i) for i in args.cases.split(",") if i}
    if args.suite == "remote":
        for i, (name, attack) in enumerate(CASES.items()):
            if not wanted or i in wanted:
                results["cases"].append(run_case(name, attack))
    else:
        for i, run in enumerate(NAK_CASES):
            if not wanted or i in wanted:
                results["cases"].append(run())
    results["load_after"] = os.getloadavg()
    write_results(results)


if __name__ == "__main__":
    main()
