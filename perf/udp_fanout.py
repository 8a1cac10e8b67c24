"""One publisher to 1, 2 and 3 receiver drivers on separate hosts: multicast vs MDC vs unicast, same run.

    sudo python perf/udp_fanout.py            # ~3 s per case, 18 cases
    sudo python perf/udp_fanout.py --quick    # ~1 s per case
    sudo python perf/udp_fanout.py --quick --rounds 3 --note "..."   # each case 3 times, median ratios

A real network on this machine (:mod:`logbuf.testing.netns`, needs root): host 0 runs the
publishing driver, hosts 1-3 a receiving driver each. Modes:

- ``multicast``: one publication to ``239.13.0.1`` (``fc=min,g:/N``: paced to the slowest of the N);
- ``mdc``: one ``control-mode=dynamic`` publication, each receiver names its control address (same fc);
- ``unicast``: N publications, one per receiver; the publisher offers each message to every one of them.

The publisher offers for the given seconds (32 B and 512 B, same run); each subscriber counts what it
receives with ``poll_batch`` (no Python per message, so the receiving hosts take less of the 2 cores
from the sender) until an end marker. Figures: aggregate delivered messages and MB per second (sum
over receivers / the longest receive time), and delivered bytes per unit of the publishing driver's
cost, three ways:

- per **sender busy CPU-second** ("the same sender CPU"): the publishing driver runs with
  ``--busy-cpu-time true`` and its "Sender busy CPU time in ns" counter (read from its cnc.dat) adds
  the duty-cycle thread's CPU time of every sender ``do_work`` that did work: sending data, reading
  SMs and NAKs, retransmitting. ``driver_busy`` adds the conductor's and receiver's busy time too.
- per **process CPU-second** of the publishing driver (the old measure, kept for comparison): while
  a stream flows the driver yields rather than parks (to stay responsive), so its process CPU time
  is about the wall time of the case, whatever it sends; it measures the case's duration, not the
  sender's work, and favours whichever mode finishes first.
- per **wire byte**: delivered bytes per byte the publishing driver put on the wire (its "Bytes
  sent" counter: about N for multicast to N receivers, 1 for unicast and MDC).

``--sender-idle-strategy sleep`` runs the publishing driver with an idle strategy that parks 1 ms
whenever a duty cycle finds nothing to do (the default yields while a stream flows), so that its
process CPU time is mostly work too: a second, coarser check of the busy counter
(``udp_fanout_sleep.json``).

The sender's work is not all sending: it also reads every receiver's status messages (so N
receivers mean N times the SMs, ``sender_sms_received``), and on this one-machine network the kernel
copies a multicast datagram to each bridge port in the sending thread's system call (its system
time, ``sender_driver_system_cpu_s``), work a switch does on a real network.

``--steer-switch`` moves that work where a switch would have it, off the sending host's thread: RPS on
the publisher's switch port processes its datagrams (the bridge's forwarding and copies) on the CPUs
its driver is not pinned to (``udp_fanout_steered.json``). Both figures are "the same sender
CPU" question asked of a one-machine network; neither is a real switch.

Clients call ``sched_yield`` when idle (2 cores shared by 4 drivers and 4 clients). The machine's
load average is recorded beside the figures: on a busy machine they are noisy. Writes
perf/results/udp_fanout.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

from _common import (
    ROOT,
    collect_or_raise,
    count_batches_until_end,
    cpu_user_system_seconds,
    new_results,
    quiet,
    run_child,
    write_results,
)

STREAM_ID = 10
END = b"END!"
GROUP = "239.13.0.1"
DRIVER_ARGS = [
    *("--dir-delete-on-shutdown", "false", "--term-length", "16m", "--publication-linger-timeout", "1s"),
    *("--driver-timeout", "10s", "--client-liveness-timeout", "10s"),
]
SENDER_DRIVER_ARGS = [*DRIVER_ARGS, "--busy-cpu-time", "true"]
"""The publishing driver also counts its agents' busy CPU time (~2.5 us per duty cycle)."""
WATCHED = {
    "sms_received": "Status Messages received",
    "datagrams_sent": "Datagrams sent",
    "naks_received": "NAKs received",
}
"""The publishing driver's counters recorded per case (what its sender handled)."""
BUSY_COUNTERS = {
    "sender": "Sender busy CPU time in ns",
    "conductor": "Conductor busy CPU time in ns",
    "receiver": "Receiver busy CPU time in ns",
}


def publisher(directory: str, channels: list[str], size: int, seconds: float, finished: Any, out: Any) -> None:
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        pubs = [aeron.add_publication(channel, STREAM_ID) for channel in channels]
        deadline = time.monotonic() + 30
        while not all(p.is_connected for p in pubs):
            if time.monotonic() > deadline:
                out.put(("error", f"publications {channels} never all connected"))
                return
            time.sleep(0.001)
        out.put(("connected", 1))
        message = bytes(size)
        idle = os.sched_yield
        offers = [p.offer for p in pubs]
        sent = 0
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            for _ in range(256):
                for offer in offers:
                    while offer(message) < 0:
                        idle()
                sent += 1
        end = END + bytes(size)
        for offer in offers:
            give_up = time.monotonic() + 30
            while offer(end) < 0 and time.monotonic() < give_up:
                idle()
        out.put(("sent", sent))
        # Keep the publications until every receiver has the end marker: under fc=min on a loaded
        # machine the sender may still be a window behind, and a closed publication lingers only 1 s.
        finished.wait(seconds + 120)


def subscriber(index: int, directory: str, channel: str, size: int, timeout_s: float, out: Any) -> None:
    quiet()
    from logbuf.client import Aeron, Context, FragmentBatch

    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription(channel, STREAM_ID)
        out.put((f"ready{index}", 1))
        batch = FragmentBatch(4096)  # 32 B and 512 B messages are one fragment each (MTU 1408)
        received, elapsed, done = count_batches_until_end(sub.poll_batch, batch, size, timeout_s, os.sched_yield)
        out.put((f"received{index}", received))
        out.put((f"elapsed{index}", elapsed))
        out.put((f"completed{index}", done))


def channels(mode: str, n: int, port: int, net: Any) -> tuple[list[str], list[str]]:
    """(publisher channels, subscriber channel per receiver)."""
    if mode == "multicast":
        pub = f"aeron:udp?endpoint={GROUP}:{port}|interface={net.address(0)}|fc=min,g:/{n}"
        return [pub], [f"aeron:udp?endpoint={GROUP}:{port}|interface={net.address(i)}" for i in range(1, n + 1)]
    if mode == "mdc":
        control = f"{net.address(0)}:{port}"
        pub = f"aeron:udp?control={control}|control-mode=dynamic|fc=min,g:/{n}"
        subs = [
            f"aeron:udp?endpoint={net.address(i)}:{port + 1}|control={control}|control-mode=dynamic"
            for i in range(1, n + 1)
        ]
        return [pub], subs
    subs = [f"aeron:udp?endpoint={net.address(i)}:{port + 1}" for i in range(1, n + 1)]
    return list(subs), subs


def run_case(mode: str, n: int, size: int, seconds: float, port: int, net: Any, drivers: list[Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    finished = ctx.Event()
    pub_channels, sub_channels = channels(mode, n, port, net)
    procs = []
    try:
        for i, channel in enumerate(sub_channels, start=1):
            p = ctx.Process(target=run_child, args=(subscriber, i, drivers[i].dir, channel, size, seconds + 90, q))
            p.start()
            procs.append(p)
        collect_or_raise(q, {f"ready{i}" for i in range(1, n + 1)}, 60)
        pub = ctx.Process(target=run_child, args=(publisher, drivers[0].dir, pub_channels, size, seconds, finished, q))
        pub.start()
        procs.append(pub)
        collect_or_raise(q, {"connected"}, 60)
        (user_before, system_before), load_before = cpu_user_system_seconds(drivers[0].pid), os.getloadavg()
        wire_before = drivers[0].system_counter("Bytes sent")
        busy_before = {role: drivers[0].system_counter(label) for role, label in BUSY_COUNTERS.items()}
        watched_before = {key: drivers[0].system_counter(label) for key, label in WATCHED.items()}
        keys = {"sent"} | {f"{k}{i}" for k in ("received", "elapsed", "completed") for i in range(1, n + 1)}
        results = collect_or_raise(q, keys, seconds + 120)
        user_after, system_after = cpu_user_system_seconds(drivers[0].pid)
        sender_user, sender_system = user_after - user_before, system_after - system_before
        sender_cpu = sender_user + sender_system
        wire_bytes = drivers[0].system_counter("Bytes sent") - wire_before
        watched = {
            f"sender_{key}": drivers[0].system_counter(label) - watched_before[key] for key, label in WATCHED.items()
        }
        busy_s = {
            role: (drivers[0].system_counter(label) - busy_before[role]) / 1e9 for role, label in BUSY_COUNTERS.items()
        }
    finally:
        finished.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    received = sum(results[f"received{i}"] for i in range(1, n + 1))
    elapsed = max(results[f"elapsed{i}"] for i in range(1, n + 1)) or float("nan")
    delivered_mb = received * size / 1e6
    return {
        "mode": mode,
        "receivers": n,
        "size": size,
        "sent": results["sent"],
        "received": received,
        "complete": all(results[f"completed{i}"] for i in range(1, n + 1))
        and all(results[f"received{i}"] == results["sent"] for i in range(1, n + 1)),
        "msgs_per_s": received / elapsed,
        "mb_per_s": delivered_mb / elapsed,
        "sender_busy_cpu_s": busy_s["sender"],
        "mb_per_sender_busy_cpu_s": delivered_mb / busy_s["sender"] if busy_s["sender"] > 0 else None,
        "sender_driver_busy_cpu_s": sum(busy_s.values()),
        "mb_per_sender_driver_busy_cpu_s": delivered_mb / sum(busy_s.values()) if sum(busy_s.values()) > 0 else None,
        "sender_driver_cpu_s": sender_cpu,
        "sender_driver_system_cpu_s": sender_system,
        "mb_per_sender_cpu_s": delivered_mb / sender_cpu if sender_cpu > 0 else None,
        "sender_wire_mb": wire_bytes / 1e6,
        "delivered_per_wire_byte": received * size / wire_bytes if wire_bytes else None,
        **watched,
        "loadavg": [round(x, 2) for x in (*load_before, *os.getloadavg())],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 s per case")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every case this many times, interleaved; ratios are the rounds' median",
    )
    parser.add_argument(
        "--only",
        default="",
        help="run only these MODE:RECEIVERS:SIZE, comma-separated (e.g. unicast:1:32,multicast:3:32); results are "
        "printed, and written only if they include the ratios' cases",
    )
    parser.add_argument(
        "--sender-idle-strategy",
        default="backoff",
        help="the publishing driver's idle strategy (e.g. sleep: it parks 1 ms whenever idle, so its process CPU "
        "time is mostly work); results go to udp_fanout_<strategy>.json unless it is the default",
    )
    parser.add_argument(
        "--steer-switch",
        action="store_true",
        help="process the publisher's datagrams in the switch on the CPUs its driver is not pinned to (RPS on "
        "its switch port), as a real switch takes forwarding off the sending host; results go to *_steered.json",
    )
    parser.add_argument("--note", default="", help="recorded in the results (e.g. what else loads the machine)")
    args = parser.parse_args(argv)
    seconds = 1.0 if args.quick else args.seconds
    only = set(filter(None, args.only.split(",")))
    sender_args = [*SENDER_DRIVER_ARGS, "--idle-strategy", args.sender_idle_strategy]
    sys.path.insert(0, ROOT)
    from logbuf.testing.driver_process import DriverSet
    from logbuf.testing.netns import NetnsDriverProcess, NetnsNetwork

    name = "udp_fanout" if args.sender_idle_strategy == "backoff" else f"udp_fanout_{args.sender_idle_strategy}"
    if args.steer_switch:
        name += "_steered"
    results = new_results(
        name,
        seconds=seconds,
        term_length="16m",
        mtu=1408,
        sender_idle_strategy=args.sender_idle_strategy,
        steer_switch=args.steer_switch,
    )
    net = NetnsNetwork(4).create()
    try:
        with DriverSet() as drivers:
            hosts = [
                drivers.start(NetnsDriverProcess(args=sender_args if i == 0 else DRIVER_ARGS, namespace=net.host(i)))
                for i in range(4)
            ]
            if args.steer_switch:
                pinned = os.sched_getaffinity(hosts[0].pid)
                others = {c for c in range(os.cpu_count() or 1) if c not in pinned} or {0}
                net.steer_port(0, others)
                results["params"]["switch_port_cpus"] = sorted(others)
                print(f"publishing driver on CPUs {sorted(pinned)}; its switch port's traffic on {sorted(others)}")
            port = 41000
            for round_ in range(1, args.rounds + 1):
                for size in (32, 512):
                    for mode in ("unicast", "multicast", "mdc"):
                        for n in (1, 2, 3):
                            port += 10
                            if only and f"{mode}:{n}:{size}" not in only:
                                continue
                            case = {"round": round_, **run_case(mode, n, size, seconds, port, net, hosts)}
                            if not case["complete"]:
                                for host in hosts:
                                    print(host.report()[:6000])
                            results["cases"].append(case)
                            print(
                                f"{mode:9} x{n} {size:4} B: {case['msgs_per_s'] / 1e6:6.3f} M msgs/s "
                                f"{case['mb_per_s']:7.1f} MB/s, {case['mb_per_sender_busy_cpu_s'] or 0:7.1f} MB per sender "
                                f"busy CPU-s ({case['mb_per_sender_cpu_s'] or 0:6.1f} per process CPU-s), "
                                f"{case['delivered_per_wire_byte'] or 0:4.2f} delivered per byte sent, "
                                f"complete={case['complete']} load={case['loadavg']}",
                                flush=True,
                            )
    finally:
        net.close()
    if only:
        print(json.dumps(results["cases"], indent=1))
    by = {(c["round"], c["mode"], c["receivers"], c["size"]): c for c in results["cases"]}
    keys = (
        "mb_per_s",
        "mb_per_sender_busy_cpu_s",
        "mb_per_sender_driver_busy_cpu_s",
        "mb_per_sender_cpu_s",
        "delivered_per_wire_byte",
    )

    def ratio(round_: int, size: int, key: str) -> float:
        multicast, unicast = by[(round_, "multicast", 3, size)][key], by[(round_, "unicast", 1, size)][key]
        return float(multicast or 0) / float(unicast or float("nan"))

    rounds = range(1, args.rounds + 1)
    sizes = [size for size in (32, 512) if not only or {f"unicast:1:{size}", f"multicast:3:{size}"} <= only]
    if not sizes:
        return 0
    results["ratios"] = {
        f"multicast3_vs_unicast1_{size}B": {
            key: {
                "median": statistics.median(ratio(r, size, key) for r in rounds),
                "rounds": [round(ratio(r, size, key), 3) for r in rounds],
            }
            for key in keys
        }
        for size in sizes
    }
    results["params"]["rounds"] = args.rounds
    results["note"] = args.note
    print(results["ratios"])
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
