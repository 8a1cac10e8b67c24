"""Recording rate: a stream's publish rate alone, then with a recorder (``logbuf-archive record``) on it.

    python perf/archive_record.py            # 3 s per case
    python perf/archive_record.py --quick    # 1 s per case

Runs a real ``mediadriver`` (16 MiB IPC terms), a publisher process and either a plain consumer
process that block-polls and discards (the stream's rate with the fastest possible reader) or a
recorder process writing segment files, once to disk (``--archive-dir``, default a fresh
directory under the system temp dir, removed afterwards) and once to /dev/shm (the recorder's own
cost, without the disk's write-back), and once more to /dev/shm with record checksums
(``--checksum crc32``: a copy of each block and a CRC-32 per frame), and once to /dev/shm without the
time index (``--no-time-index``: what bounding each block's reserved values costs). Reports the publish rate in all runs, the
recording rate (the publish rate with the recorder back-pressuring it) and checks that
every published byte was recorded. Writes perf/results/archive_record.json.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from _common import ROOT, cpu_seconds, new_results, quiet, write_results

STREAM = 10


def publisher(directory: str, size: int, batch: int, seconds: float, out: Any) -> None:
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_publication("aeron:ipc", STREAM)
        while not pub.is_connected:
            time.sleep(0.001)
        out.put(("connected", 0))
        start_position = pub.position
        messages = [bytes(size)] * batch
        sent = 0
        start = time.perf_counter()
        deadline = start + seconds
        offer = (lambda: pub.offer_batch(messages)) if batch > 1 else (lambda: pub.offer(messages[0]))
        while time.perf_counter() < deadline:
            for _ in range(100):
                if offer() > 0:
                    sent += batch
                else:  # back-pressured: give the core to the reader (2 cores, shared)
                    os.sched_yield()
        elapsed = time.perf_counter() - start
        out.put(("sent", sent))
        out.put(("publish_elapsed", elapsed))
        out.put(("published_bytes", pub.position - start_position))
        out.put(("session_id", pub.session_id))
        out.put(("end_position", pub.position))
        pub.close()


def consumer(directory: str, out: Any) -> None:
    """The fastest reader: block polls, nothing done with the bytes."""
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription("aeron:ipc", STREAM)
        out.put(("ready", 0))
        while not sub.images:
            time.sleep(0.0005)
        image = sub.images[0]
        on_block = lambda block, term_offset, session_id, term_id: None  # noqa: E731
        while not image.is_end_of_stream and not image.is_closed:
            if not image.block_poll(on_block, 1 << 22):
                time.sleep(0)
        out.put(("consumed_position", image.position))


def _collect(q: Any, keys: int, timeout_s: float) -> dict[str, Any]:
    """Like _common.collect, but a timeout names what did arrive."""
    results: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(results) < keys:
        try:
            key, value = q.get(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            raise TimeoutError(f"children reported only {sorted(results)} within {timeout_s} s") from None
        results[key] = value
    return results


def run_case(
    directory: str, archive_dir: str | None, size: int, batch: int, seconds: float, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    recorder: subprocess.Popen[bytes] | None = None
    reader: Any = None
    if archive_dir is None:
        reader = ctx.Process(target=consumer, args=(directory, q))
        reader.start()
        assert q.get(timeout=30)[0] == "ready"
        watched_pid = reader.pid
    else:
        recorder = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "logbuf.archive.main",
                "-d",
                archive_dir,
                "--log-level",
                "warning",
                "record",
                "--channel",
                "aeron:ipc",
                "--stream-id",
                str(STREAM),
                "--driver-dir",
                directory,
                *extra,
            ],
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        )
        watched_pid = recorder.pid
    pub = ctx.Process(target=publisher, args=(directory, size, batch, seconds, q))
    pub.start()
    assert q.get(timeout=30)[0] == "connected"
    c0 = cpu_seconds(watched_pid)
    results = _collect(q, 5 if archive_dir is not None else 6, seconds + 60)
    cpu_s = cpu_seconds(watched_pid) - c0
    pub.join(30)
    case: dict[str, Any] = {
        "size": size,
        "batch": batch,
        "sent": results["sent"],
        "publish_mb_per_s": results["published_bytes"] / results["publish_elapsed"] / 1e6,
        "publish_msgs_per_s": results["sent"] / results["publish_elapsed"],
    }
    case["reader_cpu_pct"] = 100 * cpu_s / results["publish_elapsed"]
    if archive_dir is None:
        reader.join(30)
        case["consumed_all"] = results["consumed_position"] == results["end_position"]
        return case
    assert recorder is not None
    from logbuf.archive.catalog import Catalog

    deadline = time.monotonic() + 60
    while True:  # the recording stops once the publication is closed and drained
        with Catalog.open(archive_dir) as catalog:
            found = [d for d in catalog.recordings() if d.session_id == results["session_id"]]
        if found and not found[0].active:
            break
        assert time.monotonic() < deadline, "recording did not stop"
        time.sleep(0.05)
    d = found[0]
    recorder.send_signal(signal.SIGTERM)
    recorder.wait(30)
    recorded = d.stop_position - d.start_position
    case.update(
        {
            "recorded_bytes": recorded,
            "published_bytes": results["published_bytes"],
            "recorded_everything": d.stop_position == results["end_position"],
            # The recorder's sub-pos back-pressures the publisher, so it is at most a term window
            # (8 MiB) behind when publishing ends: the recording rate is the publish rate.
            "record_mb_per_s": results["published_bytes"] / results["publish_elapsed"] / 1e6,
        }
    )
    return case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="publishing time per case")
    parser.add_argument("--quick", action="store_true", help="1 s per case")
    parser.add_argument(
        "--archive-dir",
        help="where the recorder writes to disk (default: the temp dir); a fresh directory there is removed afterwards",
    )
    parser.add_argument("--no-tmpfs", action="store_true", help="skip the runs recording to /dev/shm")
    parser.add_argument("--no-checksum", action="store_true", help="skip the run with record checksums")
    args = parser.parse_args(argv)
    quiet()
    if args.quick:
        args.seconds = 1.0
    directory = f"/dev/shm/logbuf-perf-{uuid.uuid4().hex[:8]}"
    driver = subprocess.Popen(
        [sys.executable, "-m", "logbuf.driver.main", "--dir", directory, "--ipc-term-length", "16m"],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )
    targets: list[tuple[str, str, tuple[str, ...]]] = [("disk", args.archive_dir or tempfile.gettempdir(), ())]
    if not args.no_tmpfs:
        targets.append(("tmpfs", "/dev/shm", ()))
    if not args.no_tmpfs:
        targets.append(("tmpfs_no_time_index", "/dev/shm", ("--no-time-index",)))
    if not args.no_checksum:
        targets.append(("tmpfs_crc32", "/dev/shm", ("--checksum", "crc32")))
    results = new_results("archive_record", seconds=args.seconds, ipc_term_length=16 << 20, segment_length=64 << 20)
    try:
        from logbuf.conduit.cnc import wait_for_driver

        wait_for_driver(directory)
        for size, batch in ((512, 16), (1344, 1), (64, 64)):
            alone = run_case(directory, None, size, batch, args.seconds)
            case: dict[str, Any] = {
                "case": f"{size} B {'batch ' + str(batch) if batch > 1 else 'offer'}",
                "publisher_alone": alone,
            }
            line = (
                f"{case['case']:<16} publish alone {alone['publish_mb_per_s']:7.0f} MB/s (reader CPU "
                f"{alone['reader_cpu_pct']:.0f}%)"
            )
            for target, base, extra in targets:
                archive_dir = os.path.join(base, f"logbuf-archive-perf-{uuid.uuid4().hex[:8]}")
                try:
                    recorded = run_case(directory, archive_dir, size, batch, args.seconds, extra)
                finally:
                    shutil.rmtree(archive_dir, ignore_errors=True)
                recorded["archive_fs"] = target
                recorded["publish_rate_ratio"] = recorded["publish_mb_per_s"] / alone["publish_mb_per_s"]
                case[f"with_recorder_{target}"] = recorded
                line += (
                    f" | recording to {target} {recorded['record_mb_per_s']:6.0f} MB/s "
                    f"({100 * recorded['publish_rate_ratio']:.0f}%, recorder CPU {recorded['reader_cpu_pct']:.0f}%, "
                    f"all recorded: {recorded['recorded_everything']})"
                )
            case["load_avg"] = os.getloadavg()
            results["cases"].append(case)
            print(line + f" | load {case['load_avg'][0]:.1f}")
        results["note"] = (
            "2-core machine shared with other work: figures are noisy. With a recorder, the publish "
            "rate is the recording rate (the recorder's sub-pos back-pressures the publisher; "
            "recorded_everything says nothing was dropped)."
        )
        write_results(results)
    finally:
        driver.send_signal(signal.SIGTERM)
        try:
            driver.wait(15)
        except subprocess.TimeoutExpired:
            driver.kill()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
