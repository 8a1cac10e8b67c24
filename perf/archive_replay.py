"""Replay rates of the archive service beside live rates, and a late joiner's catch-up, in one run.

    sudo python perf/archive_replay.py            # 3 s per rate case, 10 s of history for the catch-up
    sudo python perf/archive_replay.py --quick    # 1 s per case, 3 s of history

A network of two namespaces (:mod:`logbuf.testing.netns`, needs root): host A (10.13.0.1) runs a driver
and the archive service (in this process, on its own thread); host B (10.13.0.2) a driver. Publishers and
subscribers are child processes; a subscriber counts with ``poll_batch`` (no Python per message). For
32 B and 512 B:

- **live IPC**: a publisher on A offers flat out for the case's seconds, then an end marker, on an IPC
  stream the service records; a subscriber on A counts it.
- **replay IPC**: that recording replayed from its start to an IPC subscriber on A.
- **live UDP**: a publisher on A flat out to a subscriber on B over unicast UDP (not recorded).
- **replay UDP**: the IPC recording replayed over UDP unicast to a subscriber on B.

Rates are messages and MB per second from the first message to the end marker. The goal: replay UDP
at least 80% of live UDP.

**Catch-up**: a publisher on A sends 512 B messages to B over UDP at half the live UDP rate measured
above, recorded by the service (a spy of the publication); B has a live subscriber from the start.
After ``--behind`` seconds a late joiner on B (a child: a remote ``ArchiveClient`` over UDP and
``ReplayMerge``, counting in its handler) starts at position 0, and the time until it has merged onto
the live stream is measured, with the messages it delivered and whether they were all, once, in order.

Everything shares the machine's 2 cores with the other processes on it: figures are noisy; the load
average is recorded beside them. Writes perf/results/archive_replay.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from typing import Any

from _common import ROOT, collect_or_raise, count_batches_until_end, new_results, quiet, run_child, write_results

A, B = "10.13.0.1", "10.13.0.2"
END = b"END!"
CONTROL = f"aeron:udp?endpoint={A}:8010"
DRIVER_ARGS = [
    *("--dir-delete-on-shutdown", "true", "--driver-timeout", "10s", "--client-liveness-timeout", "10s"),
    *("--term-length", "16m", "--ipc-term-length", "16m", "--publication-linger-timeout", "2s"),
]


def publisher(directory: str, channel: str, stream_id: int, size: int, seconds: float, rate: float, out: Any) -> None:
    """Offer ``size``-byte messages (each starting with its sequence number) for ``seconds`` (``rate`` per
    second, 0: flat out), then the end marker."""
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_publication(channel, stream_id)
        deadline = time.monotonic() + 30
        while not pub.is_connected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{channel} stream {stream_id} never connected")
            time.sleep(0.001)
        out.put(("connected", 1))
        message = bytearray(size)
        offer, idle = pub.offer, os.sched_yield
        sent = 0
        start = time.perf_counter()
        stop = start + seconds
        while (now := time.perf_counter()) < stop:
            if rate and sent > (now - start) * rate:
                time.sleep(0.0002)
                continue
            for _ in range(64):
                message[:8] = sent.to_bytes(8, "little")
                while offer(message) < 0:
                    idle()
                sent += 1
        while offer(END + bytes(size)) < 0:
            idle()
        out.put(("sent", sent))
        time.sleep(3)  # let the end marker reach every subscriber before the publication goes


def counter(name: str, directory: str, channel: str, stream_id: int, size: int, timeout_s: float, out: Any) -> None:
    """Count the ``size``-byte messages of every image until the end marker."""
    quiet()
    from logbuf.client import Aeron, Context, FragmentBatch

    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription(channel, stream_id)
        out.put((f"{name}.ready", 1))
        result = count_batches_until_end(sub.poll_batch, FragmentBatch(4096), size, timeout_s, os.sched_yield)
        out.put((f"{name}.result", result))


def late_joiner(directory: str, live: str, stream_id: int, recording_id: int, timeout_s: float, out: Any) -> None:
    """Catch up from position 0 of the recording onto the live stream; report the time to merge."""
    quiet()
    from logbuf.archive.client import ArchiveClient, ArchiveClientContext
    from logbuf.archive.replay_merge import ReplayMerge
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        archive = ArchiveClient.connect(
            ArchiveClientContext(aeron=aeron, control_channel=CONTROL, response_channel=f"aeron:udp?endpoint={B}:8020")
        )
        state = {"next": 0, "bad": 0}

        def handler(payload: Any, header: Any) -> None:
            seq = int.from_bytes(payload[:8], "little")
            if seq != state["next"] and bytes(payload[:4]) != END:
                state["bad"] += 1
            state["next"] = seq + 1

        start = time.perf_counter()
        merge = ReplayMerge(
            archive,
            recording_id,
            live_channel=live,
            live_stream_id=stream_id,
            replay_channel=f"aeron:udp?endpoint={B}:40700",
            replay_stream_id=7001,
            start_position=0,
            live_add_threshold=4 << 20,
        )
        behind_at_start = merge.recorded_position
        deadline = time.monotonic() + timeout_s
        while not merge.is_merged and time.monotonic() < deadline:
            merge.poll(handler, 4096)
            behind_at_start = max(behind_at_start, merge.recorded_position)
        merged_s = time.perf_counter() - start
        out.put(
            (
                "catchup",
                {
                    "merged": merge.is_merged,
                    "seconds_to_merge": merged_s,
                    "messages_delivered": state["next"],
                    "out_of_order": state["bad"],
                    "bytes_caught_up": merge.position,
                    "recorded_when_started": behind_at_start,
                },
            )
        )
        merge.close()
        archive.close()


def spawn(ctx: Any, target: Any, *args: Any) -> Any:
    proc = ctx.Process(target=run_child, args=(target, *args), daemon=True)
    proc.start()
    return proc


def rate(result: tuple[int, float, bool], size: int) -> dict[str, Any]:
    received, seconds, done = result
    return {
        "messages": received,
        "seconds": seconds,
        "complete": done,
        "msgs_per_s": received / seconds if seconds else 0.0,
        "mb_per_s": received * size / seconds / 1e6 if seconds else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 s per rate case, 3 s of history for the catch-up")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--behind", type=float, default=10.0, help="history before the late joiner starts (s)")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    seconds = 1.0 if args.quick else args.seconds
    behind = 3.0 if args.quick else args.behind
    sys.path.insert(0, ROOT)
    quiet()
    from logbuf.archive.client import ArchiveClient, ArchiveClientContext
    from logbuf.archive.service import ArchiveService
    from logbuf.archive.service_context import ArchiveContext
    from logbuf.testing.driver_process import DriverSet
    from logbuf.testing.netns import NetnsDriverProcess, NetnsNetwork

    results = new_results("archive_replay", seconds=seconds, behind_s=behind, term_length="16m", note=args.note)
    mpx = mp.get_context("spawn")
    q: Any = mpx.Queue()
    net = NetnsNetwork(2).create()
    archive_dir = tempfile.mkdtemp(prefix="archive-replay-")
    try:
        with DriverSet() as drivers:
            a = drivers.start(NetnsDriverProcess(args=DRIVER_ARGS, namespace=net.host(0)))
            b = drivers.start(NetnsDriverProcess(args=DRIVER_ARGS, namespace=net.host(1)))
            ctx = ArchiveContext(
                archive_dir=archive_dir, driver_dir=a.dir, control_channel=CONTROL, session_timeout_ns=3_600_000_000_000
            )  # this process waits on its children without keep-alives
            with (
                ArchiveService.launch(ctx) as service,
                ArchiveClient.connect(ArchiveClientContext(driver_dir=a.dir)) as archive,
            ):
                del service
                stream = 100
                for size in (32, 512):
                    stream += 10
                    case: dict[str, Any] = {"size": size}
                    # live IPC, recorded
                    archive.start_recording("aeron:ipc", stream)
                    sub = spawn(mpx, counter, "live_ipc", a.dir, "aeron:ipc", stream, size, 120.0, q)
                    collect_or_raise(q, {"live_ipc.ready"}, 30)
                    pub = spawn(mpx, publisher, a.dir, "aeron:ipc", stream, size, seconds, 0.0, q)
                    got = collect_or_raise(q, {"sent", "live_ipc.result"}, 180)
                    case["live_ipc"] = rate(got["live_ipc.result"], size)
                    pub.join(30), sub.join(30)
                    rid = max(d.recording_id for d in archive.list_recordings() if d.stream_id == stream)
                    time.sleep(0.5)
                    archive.stop_recording("aeron:ipc", stream)
                    # replay IPC
                    sub = spawn(mpx, counter, "replay_ipc", a.dir, "aeron:ipc", stream + 1, size, 120.0, q)
                    collect_or_raise(q, {"replay_ipc.ready"}, 30)
                    archive.start_replay(rid, stream_id=stream + 1, channel="aeron:ipc", position=0)
                    case["replay_ipc"] = rate(
                        collect_or_raise(q, {"replay_ipc.result"}, 180)["replay_ipc.result"], size
                    )
                    sub.join(30)
                    # live UDP, A to B
                    udp = f"aeron:udp?endpoint={B}:{41000 + stream}"
                    sub = spawn(mpx, counter, "live_udp", b.dir, udp, stream + 2, size, 120.0, q)
                    collect_or_raise(q, {"live_udp.ready"}, 30)
                    pub = spawn(mpx, publisher, a.dir, udp, stream + 2, size, seconds, 0.0, q)
                    got = collect_or_raise(q, {"sent", "live_udp.result"}, 180)
                    case["live_udp"] = rate(got["live_udp.result"], size)
                    pub.join(30), sub.join(30)
                    # replay UDP, A to B
                    udp = f"aeron:udp?endpoint={B}:{42000 + stream}"
                    sub = spawn(mpx, counter, "replay_udp", b.dir, udp, stream + 3, size, 120.0, q)
                    collect_or_raise(q, {"replay_udp.ready"}, 30)
                    archive.start_replay(rid, stream_id=stream + 3, channel=udp, position=0)
                    case["replay_udp"] = rate(
                        collect_or_raise(q, {"replay_udp.result"}, 180)["replay_udp.result"], size
                    )
                    sub.join(30)
                    for kind in ("ipc", "udp"):
                        live = case[f"live_{kind}"]["msgs_per_s"]
                        case[f"replay_vs_live_{kind}"] = case[f"replay_{kind}"]["msgs_per_s"] / live if live else None
                    case["loadavg"] = os.getloadavg()[0]
                    results["cases"].append(case)
                    print(
                        f"{size:4} B  live IPC {case['live_ipc']['msgs_per_s'] / 1e6:6.3f} M msgs/s "
                        f"replay IPC {case['replay_ipc']['msgs_per_s'] / 1e6:6.3f} ({case['replay_vs_live_ipc']:.2f}x) | "
                        f"live UDP {case['live_udp']['msgs_per_s'] / 1e6:6.3f} M msgs/s "
                        f"{case['live_udp']['mb_per_s']:6.1f} MB/s, replay UDP "
                        f"{case['replay_udp']['msgs_per_s'] / 1e6:6.3f} M msgs/s {case['replay_udp']['mb_per_s']:6.1f} MB/s "
                        f"({case['replay_vs_live_udp']:.2f}x)  load {case['loadavg']:.1f}",
                        flush=True,
                    )
                # catch-up at half the live UDP rate of 512 B
                half = results["cases"][-1]["live_udp"]["msgs_per_s"] / 2
                live = f"aeron:udp?endpoint={B}:40800"
                drain = spawn(mpx, counter, "drain", b.dir, live, 900, 512, behind + 300.0, q)
                collect_or_raise(q, {"drain.ready"}, 30)
                archive.start_recording(live, 900)
                pub = spawn(mpx, publisher, a.dir, live, 900, 512, behind + 120.0, half, q)
                collect_or_raise(q, {"connected"}, 30)
                time.sleep(behind)
                rid = max(d.recording_id for d in archive.list_recordings() if d.stream_id == 900)
                joiner = spawn(mpx, late_joiner, b.dir, live, 900, rid, 110.0, q)
                catchup = collect_or_raise(q, {"catchup"}, 180)["catchup"]
                catchup.update(publish_rate_msgs_per_s=half, behind_s=behind, loadavg=os.getloadavg()[0])
                results["catchup"] = catchup
                print(
                    f"catch-up from {behind:.0f} s behind at {half / 1e3:.0f} k msgs/s of 512 B: merged={catchup['merged']} "
                    f"in {catchup['seconds_to_merge']:.2f} s, {catchup['messages_delivered']} messages, "
                    f"{catchup['out_of_order']} out of order",
                    flush=True,
                )
                for proc in (joiner, pub, drain):
                    proc.terminate()
                    proc.join(10)
    finally:
        net.close()
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
