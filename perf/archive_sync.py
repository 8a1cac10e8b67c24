"""Archive sync and replication: bytes moved and time, beside a full copy and rsync, in one run.

    python perf/archive_sync.py                 # 128 MiB archives (the issue asks >= 1 GiB: --size 1024)
    python perf/archive_sync.py --size 32       # a quick look

One driver, four archive services in this process (each on its own thread), IPC between them. A
publisher sends 512 B messages flat out on an IPC stream. Archive A records all of it. Archive R
replicates A's recording live (Replicate, following): its lag when the publisher stops, and how long
after that it holds everything, show whether replication keeps up. Archive B1 records the same stream
but stops one segment before the end: (a). Archive B2 records it with 100 holes of 4 KiB (its recording
stopped while exactly 8 messages pass, then started again): (b). R is the (c) case: equal histories.

For each case one ``sync_once`` round between A and the other archive: time, bytes fetched, and bytes of
control traffic (descriptors listed, requests; counted from the encoded messages), beside the missing
bytes; then a full copy (Replicate of A's whole recording into an empty archive) and ``rsync -a
--no-whole-file --stats`` of A's directory onto a copy of the other's (what a generic delta tool moves).
Goals: (c) < 0.1 % of the archive, (b) < 2x the missing bytes plus digests.

Each round also compares what both sides hold through the wire digest exchange (``SyncDigestRequest`` /
``SyncDigests``: 1 GiB top blocks, fanout 16, 4 KiB leaves): ``digest_rounds`` and ``digest_bytes`` are
those messages, counted from their encodings, and ``compared_bytes`` the common coverage they covered.
``exchanged_bytes`` is everything beside the fetched bytes: listings, digests and one replicate request
(about 200 bytes with its signals) per fetch.
Figures are noisy: the machine's 2 cores are shared. Writes perf/results/archive_sync.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import ROOT, new_results, quiet, write_results

sys.path.insert(0, str(ROOT))

SIZE = 512
HOLES = 100
HOLE_MESSAGES = 8  # 8 frames of 512 B: 4 KiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=128, help="MiB per archive (default 128)")
    args = parser.parse_args()
    quiet()
    from logbuf.archive import control_codec as cc
    from logbuf.archive.catalog import Catalog
    from logbuf.archive.client import ArchiveClient, ArchiveClientContext
    from logbuf.archive.service import ArchiveService
    from logbuf.archive.service_context import ArchiveContext
    from logbuf.archive.sync import Peer, coverage, sync_once
    from logbuf.archive.sync_digest import subtract
    from logbuf.client import Aeron, Context
    from logbuf.testing.driver_process import DriverProcess

    total = args.size << 20
    segment = 16 << 20 if total >= 64 << 20 else 1 << 20
    results = new_results("archive_sync", size_mib=args.size, message_bytes=SIZE, holes=HOLES)
    work = tempfile.mkdtemp(prefix="archive-sync-")
    driver = DriverProcess(args=["--dir-delete-on-shutdown", "true", "--ipc-term-length", "16m"]).start()
    services: dict[str, ArchiveService] = {}
    try:
        for i, name in enumerate(("a", "r", "b1", "b2", "full")):
            ctx = ArchiveContext(
                archive_dir=os.path.join(work, name),
                driver_dir=driver.dir,
                control_stream_id=100 + i,
                segment_length=segment,
                checksum="crc32",
                session_timeout_ns=600_000_000_000,  # the set-up leaves sessions idle for a long time
            )
            services[name] = ArchiveService.launch(ctx)
        with Aeron.connect(Context(dir=driver.dir)) as aeron:
            clients = {
                name: ArchiveClient.connect(
                    ArchiveClientContext(
                        aeron=aeron,
                        control_stream_id=100 + i,
                        response_stream_id=200 + i,
                        message_timeout_ns=20_000_000_000,
                    )
                )
                for i, name in enumerate(services)
            }
            peers = {name: Peer(name, clients[name], "aeron:ipc", 100 + i) for i, name in enumerate(services)}
            publication = aeron.add_exclusive_publication("aeron:ipc", 7)
            payload = bytes(SIZE - 32)

            def publish(count: int) -> None:
                for _ in range(count):
                    while publication.offer(payload) < 0:
                        time.sleep(0.0001)

            def keep_alive() -> None:  # idle sessions would time out during the long set-up
                for c in clients.values():
                    c.poll()

            def caught_up(name: str) -> None:
                keep_alive()
                client = clients[name]
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    active = [d for d in client.list_recordings() if d.stop_position < 0]
                    if all(client.recording_position(d.recording_id) >= publication.position for d in active):
                        return
                    time.sleep(0.01)
                raise TimeoutError(f"{name} did not catch up")

            for name in ("a", "b1", "b2"):
                clients[name].start_recording("aeron:ipc", 7)
            caught_up("a")
            clients["r"].replicate(0, "aeron:ipc", src_control_stream_id=100)
            messages = total // SIZE
            last_segment = segment // SIZE
            hole_every = (messages - last_segment) // (HOLES + 1) - HOLE_MESSAGES
            started = time.monotonic()
            for _ in range(HOLES):
                publish(hole_every)
                caught_up("b2")
                clients["b2"].stop_recording("aeron:ipc", 7)
                publish(HOLE_MESSAGES)
                caught_up("a")
                recordings = len(clients["b2"].list_recordings())
                clients["b2"].start_recording("aeron:ipc", 7)
                deadline = time.monotonic() + 60  # the hole is exactly the 8 messages: wait for the image to join
                while len(clients["b2"].list_recordings()) == recordings:
                    if time.monotonic() > deadline:
                        raise TimeoutError("b2's recording did not start again")
                    time.sleep(0.002)
            remaining = messages - HOLES * (hole_every + HOLE_MESSAGES)
            publish(max(0, remaining - last_segment))
            caught_up("b1")
            clients["b1"].stop_recording("aeron:ipc", 7)
            publish(last_segment)
            published_s = time.monotonic() - started
            for name in ("a", "b2"):
                caught_up(name)
            with Catalog.open(services["r"].ctx.archive_dir) as catalog:
                lag_at_end = publication.position - catalog.recording(0).stop_position
            waited = time.monotonic()
            while True:
                keep_alive()
                with Catalog.open(services["r"].ctx.archive_dir) as catalog:
                    if catalog.recording(0).stop_position >= publication.position:
                        break
                time.sleep(0.005)
            results["live_replication"] = {
                "publish_mb_per_s": publication.position / published_s / 1e6,
                "lag_bytes_when_publisher_stopped": lag_at_end,
                "caught_up_after_s": time.monotonic() - waited,
            }
            for name in ("a", "b2"):
                clients[name].stop_recording("aeron:ipc", 7)
            time.sleep(0.5)
            archive_bytes = publication.position

            def control_bytes(name: str) -> int:
                return sum(len(cc.encode(d)) for d in clients[name].list_recordings())

            cases: dict[str, Any] = {}
            for case, other in (("a_segment_at_end", "b1"), ("b_100_holes", "b2"), ("c_equal", "r")):
                listing = control_bytes("a") + control_bytes(other)
                missing = sum(
                    hi - lo
                    for lo, hi in subtract(
                        coverage(clients["a"].list_recordings()), coverage(clients[other].list_recordings())
                    )
                )
                holes = len(
                    subtract(coverage(clients["a"].list_recordings()), coverage(clients[other].list_recordings()))
                )
                keep_alive()
                before = shutil.copytree(services[other].ctx.archive_dir, os.path.join(work, f"{other}-before"))
                t0 = time.monotonic()
                report = sync_once([peers["a"], peers[other]], timeout_ns=300_000_000_000)
                elapsed = time.monotonic() - t0
                cases[case] = {
                    "sync_s": elapsed,
                    "missing_bytes": missing,
                    "missing_intervals": holes,
                    "fetched_over_missing": report.fetched_bytes / missing if missing else None,
                    "fetched_bytes": report.fetched_bytes,
                    "fetches": len(report.fetched),
                    "listing_bytes": listing,
                    "digest_rounds": report.digest_rounds,
                    "digest_bytes": report.digest_bytes,
                    "compared_bytes": report.compared_bytes,
                    "conflicts": len(report.conflicts),
                    "exchanged_bytes": report.exchanged_bytes + 200 * len(report.fetched),
                    "exchanged_pct_of_archive": (
                        100
                        * (report.fetched_bytes + report.exchanged_bytes + 200 * len(report.fetched))
                        / archive_bytes
                    ),
                    "moved_over_missing_plus_digests": (
                        (report.fetched_bytes + report.exchanged_bytes + 200 * len(report.fetched))
                        / (missing + report.digest_bytes)
                        if missing
                        else None
                    ),
                    "failed": len(report.failed),
                    "unfetchable": len(report.unfetchable),
                    "rsync": rsync(services["a"].ctx.archive_dir + "/", before),
                }
            t0 = time.monotonic()
            rid = clients["full"].replicate(0, "aeron:ipc", src_control_stream_id=100)
            while not any(
                s.subscription_id == rid and s.signal == cc.RecordingSignal.REPLICATE_END
                for s in clients["full"].signals
            ):
                clients["full"].poll()
                time.sleep(0.005)
            cases["full_copy"] = {"copy_s": time.monotonic() - t0, "bytes": archive_bytes}
            results["archive_bytes"] = archive_bytes
            results["cases"] = cases
            for client in clients.values():
                client.close()
            publication.close()
    finally:
        for service in services.values():
            service.close()
        driver.stop()
        shutil.rmtree(work, ignore_errors=True)
    results["load_average"] = os.getloadavg()
    path = write_results(results)
    print(f"archive {results['archive_bytes'] / 2**20:.0f} MiB of {SIZE} B messages")
    live = results["live_replication"]
    print(
        f"live replication: publisher {live['publish_mb_per_s']:.0f} MB/s, lag {live['lag_bytes_when_publisher_stopped']} B "
        f"at its end, caught up {live['caught_up_after_s']:.2f} s later"
    )
    for case, c in results["cases"].items():
        print(f"{case:>18}: {c}")
    print(f"results: {path}")
    return 0


def rsync(source: str, destination: str) -> dict[str, Any] | None:
    if shutil.which("rsync") is None:
        return None
    t0 = time.monotonic()
    out = subprocess.run(
        ["rsync", "-a", "--no-whole-file", "--stats", source, destination], capture_output=True, text=True, check=False
    ).stdout
    stats: dict[str, Any] = {"s": time.monotonic() - t0}
    for line in out.splitlines():
        if line.startswith(("Total bytes sent", "Total bytes received")):
            key, value = line.split(":", 1)
            stats[key.strip().lower().replace(" ", "_")] = int(value.strip().replace(",", ""))
    return stats


if __name__ == "__main__":
    sys.exit(main())
