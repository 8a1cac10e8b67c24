"""What each remote attack of issue 14 (items 1-5), and one local client's thousand UDP endpoints, does to
two real drivers and their stream.

Each case starts a sending and a receiving driver, connects an honest stream, attacks it with crafted
datagrams from a raw UDP socket, then streams 3,000 more messages and reports what came through, the
drivers' counters (errors, invalid packets, spoofed frames, rejected images), leaked image files and the
receiving driver's RSS. Run before and after a fix: ``python perf/udp_attacks.py --label before``; each
run writes ``perf/results/udp_attacks_<label>.json`` with the machine load beside the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import time
from typing import Any

from _common import new_results, quiet, write_results

from logbuf.client import Aeron, Context
from logbuf.conduit.cnc import CncFile
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import DataFrame, HeartbeatFrame, SetupFrame, StatusMessageFrame
from tests.driver.test_client_limits import free_ports
from tests.driver.test_local_hardening import rss_bytes
from tests.driver.test_udp import BASE_ARGS, await_, counters, free_port, stream
from tests.support.driver_process import DriverProcess

WATCHED = ("Errors", "Invalid packets", "Spoofed frames dropped", "Images rejected", "Active images")


def run_case(name: str, attack: Any) -> dict[str, Any]:
    a, b = DriverProcess(args=BASE_ARGS).start(), DriverProcess(args=BASE_ARGS).start()
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_port()}"
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
            await_(lambda: pub.is_connected and bool(sub.images), 20, "connection")
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
                values = counters(driver)
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
    ports = free_ports(HOG_ENDPOINTS)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", default="after")
    parser.add_argument("--cases", default="", help="comma-separated case numbers (from 0); default all")
    args = parser.parse_args()
    quiet()
    results = new_results(f"udp_attacks_{args.label}", load_before=os.getloadavg())
    wanted = {int(i) for i in args.cases.split(",") if i}
    for i, (name, attack) in enumerate(CASES.items()):
        if not wanted or i in wanted:
            results["cases"].append(run_case(name, attack))
    results["load_after"] = os.getloadavg()
    write_results(results)


if __name__ == "__main__":
    main()
