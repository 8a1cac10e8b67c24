"""Spark ingest: the ``logbuf`` data source beside ``binaryFile`` plus a Python parser, same archive, same run.

    python perf/spark_ingest.py            # a >= 1 GiB archive (recorded once into /tmp, then reused)
    python perf/spark_ingest.py --quick    # a 128 MiB archive

The archive is made the real way, once: a ``mediadriver`` (16 MiB IPC terms), a ``logbuf-archive
record`` process (64 MiB segments) and a publisher of mixed messages (32-512 B, 1 % of 3000 B,
so fragmented; reserved value = epoch microseconds). It is kept in ``--archive-dir`` (default
/tmp/logbuf-spark-ingest-<size>) and reused while its ``complete.json`` marker is there.

Readers, each over the whole archive in one local[2] session, all producing the same columns
(ids, term id and offset, position, flags, reserved value, payload), forced with
``count(*), sum(length(payload))``:

- ``logbuf``: ``spark.read.format("logbuf")`` (one partition per segment, numpy parser, Arrow batches).
- ``binaryFile + mapInArrow (struct walk)``: the baseline a user writes: read the segment files
  with ``binaryFile`` and walk each file's frames in Python with ``struct``, reassembling fragments.
- ``binaryFile + mapInArrow (our numpy parser)``: the same input path with the data source's parser,
  to separate the parser's gain from the input path's.

Each reader runs once to warm up on one segment, then ``--runs`` times over everything (best run
kept).

At cluster scale, in the same run (``--skip-scale`` leaves them out):

- **Filter pushdown**: a 4-stream archive made from the recorded one (its segments copied under four
  recording ids, each frame's stream id rewritten to 10, 20, 30, 40), then
  ``filter(stream_id == 20)`` with and without pushdown: partitions planned and seconds.
- **Timestamp pushdown**: ``timestamp BETWEEN`` the middle tenth of the recording's time span
  (``timestampFrom=reserved_value``), with and without pushdown: partitions planned (segments pruned
  by the time index) and seconds.
- **S3 vs local**: the archive uploaded (``logbuf-archive upload``) to an S3 API server on 127.0.0.1
  (moto in server mode, from the ``test`` extra), then the same ``logbuf`` read from the directory
  and from ``s3://``: MB/s of each. moto keeps objects in memory and serves them from Python, so
  this bounds the source's remote path from below; a real object store is another measurement.

Writes perf/results/spark_ingest.json (``--quick``: spark_ingest_quick.json), with the load average
(``os.getloadavg``) at the start, at the end and beside each cluster-scale figure.

``--goals`` measures the source's own targets instead, on a 300k-message mixed archive (three
recordings of 100k messages, made the real way once and reused): ``count()``, a ``payload``-free
projection, a streaming drain without a limit and with ``maxBytesPerTrigger=4m`` (each micro-batch's
recorded bytes from the progress reports' offsets, and the rate against the unlimited drain).
Writes perf/results/spark_ingest_goals.json. ``--label`` names the run (e.g. before/after a change).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

from _common import new_results, quiet, write_results

GIB = 1 << 30
STREAM = 10


# -- the archive ----------------------------------------------------------------------------------------
def make_archive(archive_dir: str, target_bytes: int) -> dict[str, Any]:
    """Record ``target_bytes`` of mixed messages through a real driver and recorder; returns its facts."""
    from logbuf.archive.catalog import Catalog
    from logbuf.client import Aeron, Context
    from logbuf.conduit.cnc import wait_for_driver

    marker = os.path.join(archive_dir, "complete.json")
    if os.path.exists(marker):
        with open(marker) as f:
            facts: dict[str, Any] = json.load(f)
        if facts.get("target_bytes") == target_bytes:
            print(f"reusing {archive_dir} ({facts['recorded_bytes'] / 2**20:.0f} MiB, {facts['messages']} messages)")
            return facts
    shutil.rmtree(archive_dir, ignore_errors=True)
    os.makedirs(archive_dir)
    driver_dir = f"/dev/shm/logbuf-perf-{uuid.uuid4().hex[:8]}"
    driver = subprocess.Popen(
        [sys.executable, "-m", "logbuf.driver.main", "--dir", driver_dir, "--ipc-term-length", "16m"],
        stderr=subprocess.DEVNULL,
    )
    recorder: subprocess.Popen[bytes] | None = None
    try:
        wait_for_driver(driver_dir)
        recorder = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "logbuf.archive.main",
                "-d",
                archive_dir,
                "record",
                "--channel",
                "aeron:ipc",
                "--stream-id",
                str(STREAM),
                "--driver-dir",
                driver_dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        rng = random.Random(7)
        pool = [bytes(rng.randrange(256) for _ in range(16)) * 32 for _ in range(64)]
        sizes = [rng.randrange(32, 513) for _ in range(4096)]
        batches = [[pool[i % 64][: sizes[(i * 31 + j) % 4096]] for j in range(32)] for i in range(256)]
        big = bytes(3000)
        messages = 0
        started = time.monotonic()
        with Aeron.connect(Context(dir=driver_dir)) as aeron:
            pub = aeron.add_publication("aeron:ipc", STREAM)
            deadline = time.monotonic() + 30
            while not pub.is_connected:
                assert time.monotonic() < deadline, "the recorder did not subscribe in 30 s"
                time.sleep(0.01)
            i = 0
            while pub.position < target_bytes:
                stamp = time.time_ns() // 1000
                if i % 3 == 0:
                    while pub.offer(big, reserved_value=stamp) < 0:
                        os.sched_yield()
                    messages += 1
                batch = batches[i % 256]
                while pub.offer_batch(batch, reserved_value=stamp) < 0:
                    os.sched_yield()
                messages += len(batch)
                i += 1
            end_position, session_id = pub.position, pub.session_id
            pub.close()
            deadline = time.monotonic() + 120
            while True:
                with Catalog.open(archive_dir) as catalog:
                    done = [
                        d
                        for d in catalog.recordings()
                        if d.session_id == session_id and d.stop_position >= end_position
                    ]
                if done:
                    break
                assert time.monotonic() < deadline, "the recording did not catch up in 120 s"
                time.sleep(0.1)
        seconds = time.monotonic() - started
    finally:
        if recorder is not None:
            recorder.send_signal(signal.SIGTERM)
            recorder.wait(30)
        driver.send_signal(signal.SIGTERM)
        driver.wait(30)
        shutil.rmtree(driver_dir, ignore_errors=True)
    with Catalog.open(archive_dir) as catalog:
        d = catalog.recordings()[0]
    facts = {
        "target_bytes": target_bytes,
        "recorded_bytes": d.stop_position - d.start_position,
        "messages": messages,
        "term_length": d.term_length,
        "segment_length": d.segment_length,
        "record_seconds": seconds,
    }
    with open(marker, "w") as f:
        json.dump(facts, f)
    print(
        f"recorded {facts['recorded_bytes'] / 2**20:.0f} MiB, {messages} messages in {seconds:.1f} s -> {archive_dir}"
    )
    return facts


GOALS_MESSAGES = 300_000
GOALS_RECORDINGS = 3


def make_goals_archive(archive_dir: str) -> dict[str, Any]:
    """300k mixed messages (32-512 B, 1 % of 3000 B: fragmented) from three publications of one stream,
    so three recordings, through a real driver (64 KiB IPC terms) and recorder; made once, then reused."""
    from logbuf.archive.catalog import Catalog
    from logbuf.client import Aeron, Context
    from logbuf.conduit.cnc import wait_for_driver

    marker = os.path.join(archive_dir, "complete.json")
    if os.path.exists(marker):
        with open(marker) as f:
            facts: dict[str, Any] = json.load(f)
        print(f"reusing {archive_dir} ({facts['recorded_bytes'] / 2**20:.0f} MiB, {facts['messages']} messages)")
        return facts
    shutil.rmtree(archive_dir, ignore_errors=True)
    os.makedirs(archive_dir)
    driver_dir = f"/dev/shm/logbuf-perf-{uuid.uuid4().hex[:8]}"
    driver = subprocess.Popen(
        [sys.executable, "-m", "logbuf.driver.main", "--dir", driver_dir, "--ipc-term-length", "1m"],
        stderr=subprocess.DEVNULL,
    )
    recorder: subprocess.Popen[bytes] | None = None
    rng = random.Random(11)
    sizes = [3000 if rng.random() < 0.01 else rng.randrange(32, 513) for _ in range(GOALS_MESSAGES)]
    payloads = [bytes(rng.randrange(256) for _ in range(64)) * 47 for _ in range(16)]
    try:
        wait_for_driver(driver_dir)
        recorder = subprocess.Popen(
            [sys.executable, "-m", "logbuf.archive.main", "-d", archive_dir, "record", "--channel", "aeron:ipc"]
            + ["--stream-id", str(STREAM), "--driver-dir", driver_dir, "--segment-length", "4m"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with Aeron.connect(Context(dir=driver_dir)) as aeron:
            pubs = [aeron.add_exclusive_publication("aeron:ipc", STREAM) for _ in range(GOALS_RECORDINGS)]
            deadline = time.monotonic() + 30
            while not all(p.is_connected for p in pubs):
                assert time.monotonic() < deadline, "the recorder did not subscribe in 30 s"
                time.sleep(0.01)
            for i, size in enumerate(sizes):
                pub = pubs[i % GOALS_RECORDINGS]
                while pub.offer(payloads[i % 16][:size], reserved_value=time.time_ns() // 1000) < 0:
                    os.sched_yield()
            ends = {p.session_id: p.position for p in pubs}
            deadline = time.monotonic() + 120
            while True:
                with Catalog.open(archive_dir) as catalog:
                    done = [d for d in catalog.recordings() if d.stop_position >= ends.get(d.session_id, 1 << 62)]
                if len(done) == GOALS_RECORDINGS:
                    break
                assert time.monotonic() < deadline, "the recordings did not catch up in 120 s"
                time.sleep(0.1)
            for p in pubs:
                p.close()
    finally:
        if recorder is not None:
            recorder.send_signal(signal.SIGTERM)
            recorder.wait(30)
        driver.send_signal(signal.SIGTERM)
        driver.wait(30)
        shutil.rmtree(driver_dir, ignore_errors=True)
    with Catalog.open(archive_dir) as catalog:
        recorded = sum(d.stop_position - d.start_position for d in catalog.recordings())
    facts = {"messages": GOALS_MESSAGES, "recordings": GOALS_RECORDINGS, "recorded_bytes": recorded}
    with open(marker, "w") as f:
        json.dump(facts, f)
    print(f"recorded {recorded / 2**20:.0f} MiB, {GOALS_MESSAGES} messages -> {archive_dir}")
    return facts


def _moved_bytes(progress: dict[str, Any]) -> int:
    source = progress["sources"][0]

    def offsets(key: str) -> dict[str, int]:
        value = source.get(key)
        if isinstance(value, str):
            value = json.loads(value)
        return {k: int(v) for k, v in (value or {}).items()}

    start, end = offsets("startOffset"), offsets("endOffset")
    return sum(v - start.get(k, 0) for k, v in end.items() if v > 0)


def drain_stream(
    spark: Any, archive_dir: str, tmp: str, source: str = "logbuf", schema: Any = None, **options: str
) -> tuple[float, list[int]]:
    """(seconds, recorded bytes per micro-batch) of an availableNow drain of ``source`` into ``noop``."""
    checkpoint = os.path.join(tmp, f"checkpoint-{uuid.uuid4().hex[:8]}")
    reader = spark.readStream.format(source)
    query = (
        (reader if schema is None else reader.schema(schema))
        .options(**options)
        .load(archive_dir)
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
    )
    t0 = time.perf_counter()
    running = query.start()
    assert running.awaitTermination(600), "the drain did not finish in 600 s"
    seconds = time.perf_counter() - t0
    batches = [_moved_bytes(p) for p in running.recentProgress if p.get("numInputRows")]
    running.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    return seconds, batches


def file_source_judge(spark: Any, tmp: str, total_bytes: int) -> dict[str, Any]:
    """Spark's own streaming file source under the same admission control, in the same session: parquet files
    of ~4 MiB (no compression) holding ``total_bytes`` of 32-byte payloads with recording_id and position
    columns, drained availableNow into ``noop`` with no limit and with ``maxFilesPerTrigger=1`` (one 4 MiB
    micro-batch per trigger). What Spark's fixed cost per micro-batch leaves of the unlimited rate for a
    source Spark wrote itself."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = os.path.join(tmp, "parquet-judge")
    os.makedirs(src)
    rows_per_file = (4 << 20) // 64  # 32 B payload + two longs: about 4 MiB a file
    rng = np.random.default_rng(7)
    for i in range(max(1, total_bytes // (4 << 20))):
        payload = pa.array([rng.bytes(32) for _ in range(rows_per_file)], pa.binary())
        positions = np.arange(rows_per_file, dtype=np.int64) * 64
        table = pa.table({"recording_id": np.full(rows_per_file, i % 3), "position": positions, "payload": payload})
        pq.write_table(table, os.path.join(src, f"part-{i:04d}.parquet"), compression="none")
    schema = spark.read.parquet(src).schema
    found: dict[str, Any] = {
        "files": len(os.listdir(src)),
        "bytes": sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src)),
    }
    for name, options in (("unlimited", {}), ("one_file_per_trigger", {"maxFilesPerTrigger": "1"})):
        seconds, batches = drain_stream(spark, src, tmp, "parquet", schema, **options)
        found[name + "_seconds"], found[name + "_batches"] = seconds, len(batches)
    found["rate_vs_unlimited"] = found["unlimited_seconds"] / found["one_file_per_trigger_seconds"]
    shutil.rmtree(src, ignore_errors=True)
    return found


def plan_limits(archive_dir: str) -> dict[str, Any]:
    """The driver's side of admission control without Spark: every trigger's end offset of a whole drain
    (``latestOffset`` with each limit), its time per trigger, the micro-batch sizes and the first
    trigger's share per recording."""
    from pyspark.sql.streaming.datasource import ReadMaxBytes, ReadMaxRows

    from logbuf.archive.spark import LogbufStreamReader, ReadOptions

    found: dict[str, Any] = {}
    for name, limit in (("rows_20000", ReadMaxRows(20000)), ("bytes_4m", ReadMaxBytes(4 << 20))):
        reader = LogbufStreamReader(ReadOptions.parse({"path": archive_dir}))
        start = reader.initialOffset()
        moved: list[dict[str, int]] = []
        t0 = time.perf_counter()
        while (end := reader.latestOffset(start, limit)) != start:
            moved.append({k: end[k] - int(start.get(k, 0)) for k in end if end[k] != int(start.get(k, 0))})
            start = end
        seconds = time.perf_counter() - t0
        sizes = [sum(m.values()) for m in moved]
        found[name] = {
            "triggers": len(moved),
            "ms_per_trigger": 1000 * seconds / max(1, len(moved)),
            "batch_bytes": sizes,
            "first_trigger_per_recording": moved[0] if moved else {},
        }
        print(
            f"plan {name}: {len(moved)} triggers, {found[name]['ms_per_trigger']:.0f} ms per trigger, "
            f"first trigger per recording {found[name]['first_trigger_per_recording']}"
        )
    return found


def goals(
    spark: Any, archive_dir: str, facts: dict[str, Any], runs: int, label: str, streams_only: bool = False
) -> dict[str, Any]:
    """The source's targets: count(), a payload-free projection, maxBytesPerTrigger=4m vs no limit."""
    import tempfile

    results = new_results("spark_ingest_goals", label=label, runs=runs, **facts)
    results["load_avg_at_start"] = os.getloadavg()
    total = facts["recorded_bytes"]
    results["planning"] = plan_limits(archive_dir)

    def best_of(name: str, run: Any) -> float:
        best = float("inf")
        for _ in range(runs):
            t0 = time.perf_counter()
            value = run()
            best = min(best, time.perf_counter() - t0)
        results["cases"].append({"case": name, "seconds": best, "value": value, "load_avg": os.getloadavg()})
        print(f"{name:<48} {best:6.2f} s  {total / best / 1e6:7.1f} MB/s  ({value})")
        return best

    def load(**options: str) -> Any:
        return spark.read.format("logbuf").options(**options).load(archive_dir)

    # Each case twice in this run: one partition per segment piece (maxPartitionBytes=0, the plan before
    # packing) and packed (the default), so the ratio is measured under the same load.
    plans = {"one per piece": {"maxPartitionBytes": "0"}, "packed": {}}
    load().limit(1).collect()  # warm-up: planner, workers
    if streams_only:
        plans = {"packed": {}}
    for plan, options in ({} if streams_only else plans).items():
        key = "" if plan == "packed" else "_one_per_piece"
        results["count_seconds" + key] = best_of(f"count() [{plan}]", lambda o=options: load(**o).count())
        results["projection_seconds" + key] = best_of(
            f"select(recording_id, position) max [{plan}]",
            lambda o=options: load(**o).selectExpr("max(position)", "count(recording_id)").first()[1],
        )
        narrow = spark.read.format("logbuf").options(**options).schema("recording_id BIGINT, position BIGINT")
        results["schema_projection_seconds" + key] = best_of(
            f"schema(recording_id, position) count() [{plan}]", lambda n=narrow: n.load(archive_dir).count()
        )
    for name in () if streams_only else ("count_seconds", "projection_seconds", "schema_projection_seconds"):
        results[name.replace("_seconds", "_speedup_vs_one_per_piece")] = (
            results[name + "_one_per_piece"] / results[name]
        )
    with tempfile.TemporaryDirectory() as tmp:
        drains: dict[str, Any] = {}
        try:
            for plan, options in plans.items():
                drains[plan] = (
                    drain_stream(spark, archive_dir, tmp, **options),
                    drain_stream(spark, archive_dir, tmp, maxBytesPerTrigger="4m", **options),
                )
        except Exception as e:  # noqa: BLE001 - e.g. a Python worker that did not connect back under load
            results["stream_error"] = str(e).splitlines()[0][:300]
            print(f"streaming cases failed: {results['stream_error']}")
            return results
        results["spark_file_source_judge"] = judge = file_source_judge(spark, tmp, total)
        print(
            f"Spark's own parquet file source, {judge['files']} files of ~4 MiB: no limit "
            f"{judge['unlimited_seconds']:6.2f} s, maxFilesPerTrigger=1 {judge['one_file_per_trigger_seconds']:6.2f} s "
            f"({judge['rate_vs_unlimited']:.2f}x the unlimited rate, {judge['one_file_per_trigger_batches']} batches)"
        )
    for plan, ((unlimited, _), (limited, batches)) in drains.items():
        key = "" if plan == "packed" else "_one_per_piece"
        full = batches[:-1]  # the last one takes what is left
        within = [abs(b - (4 << 20)) <= 0.1 * (4 << 20) for b in full]
        results["stream_unlimited_seconds" + key] = unlimited
        results["stream_4m_seconds" + key] = limited
        results["stream_4m_batches" + key] = batches
        results["stream_4m_batches_within_10_percent" + key] = f"{sum(within)}/{len(full)}"
        results["stream_4m_rate_vs_unlimited" + key] = unlimited / limited
        print(f"[{plan}] stream, no limit: {unlimited:6.2f} s  {total / unlimited / 1e6:7.1f} MB/s")
        print(
            f"[{plan}] stream, maxBytesPerTrigger=4m: {limited:6.2f} s  {total / limited / 1e6:7.1f} MB/s "
            f"({unlimited / limited:.2f}x the unlimited rate), {len(batches)} batches, "
            f"{sum(within)}/{len(full)} within 10% of 4 MiB; median {sorted(batches)[len(batches) // 2] / 2**20:.2f} MiB"
        )
    results["load_avg_at_end"] = os.getloadavg()
    results["note"] = "2-core machine shared with other work: figures are noisy; compare runs of one label set."
    return results


# -- cluster scale: a 4-stream archive, an S3 server ------------------------------------------------------------
def make_four_stream_archive(src: str, dst: str) -> dict[str, Any]:
    """The recording's segments split in four recordings on streams 10, 20, 30, 40 (frames rewritten)."""
    import numpy as np

    from logbuf.archive.catalog import Catalog
    from logbuf.archive.segments import segment_files
    from logbuf.archive.spark_frames import parse_chunk
    from logbuf.logbuffer import data_header_descriptor as dh

    marker = os.path.join(dst, "complete.json")
    if os.path.exists(marker):
        with open(marker) as f:
            return json.load(f)  # type: ignore[no-any-return]
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    with Catalog.open(src) as catalog:
        d = catalog.recordings()[0]
    files = segment_files(src, d.recording_id)
    whole = [(base, path) for base, path in files if base + d.segment_length <= d.stop_position]
    per_stream = max(1, len(whole) // 4)
    streams = []
    with Catalog.open_writable(dst) as writer:
        for k in range(4):
            chosen = whole[k * per_stream : (k + 1) * per_stream] or whole[-1:]
            first_base, stop = chosen[0][0], chosen[-1][0] + d.segment_length
            start = max(first_base, d.start_position)
            stream_id = 10 * (k + 1)
            rid = writer.add_recording(
                channel=d.channel,
                source_identity=d.source_identity,
                stream_id=stream_id,
                session_id=d.session_id,
                initial_term_id=d.initial_term_id,
                term_length=d.term_length,
                mtu=d.mtu,
                segment_length=d.segment_length,
                start_position=start,
            )
            for base, path in chosen:
                data = np.fromfile(path, dtype=np.uint8)
                lo = max(base, d.start_position)
                frames = parse_chunk(data, base, lo, base + d.segment_length, d)
                assert frames.corruption is None, frames.corruption
                ints = data.view("<i4")
                headers = (lo - base) // 4 + frames.slot * 8
                ints[headers + dh.STREAM_ID_FIELD_OFFSET // 4] = stream_id
                data.tofile(os.path.join(dst, f"{rid}-{base}.rec"))
            writer.stop_recording(rid, stop)
            streams.append(
                {"recording_id": rid, "stream_id": stream_id, "segments": len(chosen), "bytes": stop - start}
            )
    facts = {"streams": streams, "segment_length": d.segment_length}
    with open(marker, "w") as f:
        json.dump(facts, f)
    return facts


class MotoServer:
    """moto's S3 API server on a free loopback port (``python -m moto.server``)."""

    def __init__(self) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        for name, value in (("AWS_ACCESS_KEY_ID", "perf"), ("AWS_SECRET_ACCESS_KEY", "perf"),
                            ("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_EC2_METADATA_DISABLED", "true")):  # fmt: skip
            os.environ.setdefault(name, value)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and self.proc.poll() is None, "moto server did not start"
                time.sleep(0.1)

    def uri(self, path: str) -> str:
        return f"s3://{path}?endpoint_override=127.0.0.1:{self.port}&scheme=http&allow_bucket_creation=true"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def scale_cases(spark: Any, archive_dir: str, facts: dict[str, Any], runs: int, results: dict[str, Any]) -> None:
    from pyspark.sql import functions as F

    from logbuf.archive.storage import parse_location, upload

    four = make_four_stream_archive(archive_dir, archive_dir + "-4streams")
    four_dir = archive_dir + "-4streams"
    bytes_20 = next(s["bytes"] for s in four["streams"] if s["stream_id"] == 20)
    pushdown = {}
    for label, option in (("with pushdown", "true"), ("without pushdown", "false")):

        def make(option: str = option) -> Any:
            reader = spark.read.format("logbuf").option("filterPushdown", option).option("mode", "DROPMALFORMED")
            return reader.load(four_dir).filter(F.col("stream_id") == 20)

        make().selectExpr("count(*)").first()  # warm-up
        partitions = make().rdd.getNumPartitions()
        best = float("inf")
        rows = 0
        for _ in range(runs):
            t0 = time.perf_counter()
            rows = int(make().selectExpr("count(*) AS n").first().n)
            best = min(best, time.perf_counter() - t0)
        pushdown[label] = {"partitions": partitions, "seconds": best, "rows": rows, "load_avg": os.getloadavg()}
        print(f"filter(stream_id == 20) {label:<17} {partitions:4d} partitions {best:6.2f} s {rows} rows")
    results["filter_pushdown"] = {
        "archive": "4 streams, "
        + ", ".join(f"{s['segments']} segments of stream {s['stream_id']}" for s in four["streams"]),
        "stream_20_bytes": bytes_20,
        **pushdown,
        "speedup": pushdown["without pushdown"]["seconds"] / pushdown["with pushdown"]["seconds"],
    }

    results["timestamp_pushdown"] = timestamp_case(spark, archive_dir, runs)

    server = MotoServer()
    try:
        destination = parse_location(server.uri("perf-archive/a"))
        t0 = time.perf_counter()
        upload(archive_dir, destination)
        upload_s = time.perf_counter() - t0
        print(f"uploaded {facts['recorded_bytes'] / 2**20:.0f} MiB to the S3 server in {upload_s:.1f} s")
        cases = {}
        for label, location in (("local", archive_dir), ("s3 (moto)", destination.uri)):

            def make(location: str = location) -> Any:
                return spark.read.format("logbuf").option("mode", "DROPMALFORMED").load(location)

            cases[label] = measure(
                f"logbuf data source, {label}", make, runs, facts["recorded_bytes"], facts["messages"]
            )
        results["s3_vs_local"] = {
            "upload_seconds": upload_s,
            "local_mb_per_s": cases["local"]["mb_per_s"],
            "s3_mb_per_s": cases["s3 (moto)"]["mb_per_s"],
            "ratio_s3_to_local": cases["s3 (moto)"]["mb_per_s"] / cases["local"]["mb_per_s"],
            "rows_ok": cases["local"]["rows_ok"] and cases["s3 (moto)"]["rows_ok"],
            "load_avg": os.getloadavg(),
        }
    finally:
        server.close()


def timestamp_case(spark: Any, archive_dir: str, runs: int) -> dict[str, Any]:
    """A timestamp BETWEEN over the middle tenth of the recording's time span, with and without pushdown
    (pruning by the time index: the recorder writes it; an archive recorded before it gets it here)."""
    import datetime

    from pyspark.sql import functions as F

    from logbuf.archive.catalog import Catalog
    from logbuf.archive.time_index import build_index, read_index_file, time_index_file_name

    with Catalog.open(archive_dir) as catalog:
        d = catalog.recordings()[0]
    index_path = os.path.join(archive_dir, time_index_file_name(d.recording_id))
    built = build_index(archive_dir, d)
    entries = read_index_file(index_path, d.recording_id)
    first = min(t.min_reserved for t in entries.values() if t.stamped_frames)
    last = max(t.max_reserved for t in entries.values() if t.stamped_frames)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    lo = epoch + datetime.timedelta(microseconds=first + (last - first) * 45 // 100)
    hi = epoch + datetime.timedelta(microseconds=first + (last - first) * 55 // 100)
    case: dict[str, Any] = {
        "range": "middle tenth of the recording's reserved values (epoch µs)",
        "segments_indexed": len(entries),
        "segments_indexed_here": len(built),
    }
    for label, option in (("with pushdown", "true"), ("without pushdown", "false")):

        def make(option: str = option) -> Any:
            reader = spark.read.format("logbuf").options(
                filterPushdown=option, mode="DROPMALFORMED", timestampFrom="reserved_value"
            )
            return reader.load(archive_dir).filter(F.col("timestamp").between(lo, hi))

        make().selectExpr("count(*)").first()  # warm-up
        partitions = make().rdd.getNumPartitions()
        best, rows = float("inf"), 0
        for _ in range(runs):
            t0 = time.perf_counter()
            rows = int(make().selectExpr("count(*) AS n").first().n)
            best = min(best, time.perf_counter() - t0)
        case[label] = {"partitions": partitions, "seconds": best, "rows": rows, "load_avg": os.getloadavg()}
        print(f"timestamp BETWEEN {label:<17} {partitions:4d} partitions {best:6.2f} s {rows} rows")
    case["rows_ok"] = case["with pushdown"]["rows"] == case["without pushdown"]["rows"]
    case["speedup"] = case["without pushdown"]["seconds"] / case["with pushdown"]["seconds"]
    return case


# -- the baseline parser a user would write ---------------------------------------------------------------
def struct_walk_batches(iterator: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow over binaryFile rows: walk each file's frames with struct, reassemble fragments."""
    import re
    import struct

    import pyarrow as pa

    header = struct.Struct("<iBBHiiiiq")
    schema = baseline_arrow_schema()
    for batch in iterator:
        for path, content in zip(batch.column("path").to_pylist(), batch.column("content").to_pylist()):
            base = int(re.search(r"(\d+)-(\d+)\.rec$", path).group(2))  # type: ignore[union-attr]
            cols: dict[str, list[Any]] = {name: [] for name in schema.names}
            offset, n, partial = 0, len(content), b""
            while offset + 32 <= n:
                length, _v, flags, ftype, term_offset, session, stream, term_id, reserved = header.unpack_from(
                    content, offset
                )
                if length <= 0:
                    break
                aligned = (length + 31) & ~31
                if ftype == 1:
                    payload = content[offset + 32 : offset + length]
                    if flags & 0xC0 == 0xC0:
                        message = payload
                    elif flags & 0x80:
                        partial, message = payload, None
                    else:
                        partial += payload
                        message = partial if flags & 0x40 else None
                    if message is not None:
                        for name, value in (
                            ("recording_id", 0),
                            ("stream_id", stream),
                            ("session_id", session),
                            ("term_id", term_id),
                            ("term_offset", term_offset),
                            ("position", base + offset + aligned),
                            ("flags", flags | 0xC0),
                            ("reserved_value", reserved),
                            ("payload", message),
                        ):
                            cols[name].append(value)
                offset += aligned
            if cols["position"]:
                yield pa.RecordBatch.from_pydict(cols, schema=schema)


def numpy_parser(d: Any) -> Any:
    """mapInArrow over binaryFile rows with the data source's own numpy parser (for recording ``d``)."""

    def batches(iterator: Iterator[Any]) -> Iterator[Any]:
        import re

        import numpy as np

        from logbuf.archive.spark_frames import RowSpec, arrow_schema, build_batch, parse_chunk, select_rows

        spec = RowSpec()
        full = arrow_schema(None)
        names = baseline_arrow_schema().names
        for batch in iterator:
            for path, content in zip(batch.column("path").to_pylist(), batch.column("content").to_pylist()):
                base = int(re.search(r"(\d+)-(\d+)\.rec$", path).group(2))  # type: ignore[union-attr]
                segment = np.frombuffer(content, dtype=np.uint8)
                stop = min(d.stop_position, base + d.segment_length)
                position = max(d.start_position, base)
                while position < stop:
                    end = min(stop, position + 16 * 2**20)
                    rows = select_rows(parse_chunk(segment, base, position, end, d), spec, -1, stop, d)
                    position = end
                    yield build_batch(full, d, [rows], spec).select(names)

    return batches


def baseline_arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("recording_id", pa.int64()),
            ("stream_id", pa.int32()),
            ("session_id", pa.int32()),
            ("term_id", pa.int32()),
            ("term_offset", pa.int32()),
            ("position", pa.int64()),
            ("flags", pa.int32()),
            ("reserved_value", pa.int64()),
            ("payload", pa.binary()),
        ]
    )


BASELINE_DDL = (
    "recording_id long, stream_id int, session_id int, term_id int, term_offset int, position long, "
    "flags int, reserved_value long, payload binary"
)


# -- measurement ----------------------------------------------------------------------------------------
def measure(name: str, make_df: Any, runs: int, recorded_bytes: int, expected_rows: int) -> dict[str, Any]:
    best = float("inf")
    rows = payload = 0
    for _ in range(runs):
        t0 = time.perf_counter()
        result = make_df().selectExpr("count(*) AS rows", "sum(length(payload)) AS payload").first()
        best = min(best, time.perf_counter() - t0)
        rows, payload = int(result.rows), int(result.payload or 0)
    case = {
        "reader": name,
        "seconds": best,
        "rows": rows,
        "payload_bytes": payload,
        "mb_per_s": recorded_bytes / best / 1e6,
        "rows_per_s": rows / best,
        "rows_ok": rows == expected_rows,
        "load_avg": os.getloadavg(),
    }
    print(
        f"{name:<44} {best:6.2f} s {case['mb_per_s']:8.1f} MB/s {case['rows_per_s'] / 1e6:6.2f} M rows/s"
        f"{'' if case['rows_ok'] else f'  ROWS {rows} != {expected_rows}'}"
    )
    return case


def local_spark(app_name: str, driver_memory: str) -> Any:
    """A local[2] SparkSession on loopback, quiet (no UI, no progress bars, ERROR logs), 2 shuffle partitions."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 128 MiB archive instead of >= 1 GiB")
    parser.add_argument("--archive-dir", help="where the archive is recorded once and reused")
    parser.add_argument("--runs", type=int, default=2, help="timed runs per reader (the best is kept)")
    parser.add_argument("--skip-struct-walk", action="store_true", help="leave out the slow struct-walk baseline")
    parser.add_argument("--skip-baselines", action="store_true", help="leave out the binaryFile readers")
    parser.add_argument("--skip-scale", action="store_true", help="leave out filter pushdown and S3 vs local")
    parser.add_argument("--goals", action="store_true", help="the source's targets on a 300k-message archive")
    parser.add_argument(
        "--streams-only", action="store_true", help="with --goals: only the streaming drains and Spark's file source"
    )
    parser.add_argument("--label", default="", help="a name for this run in the results (with --goals)")
    args = parser.parse_args(argv)
    quiet()
    if args.goals:
        return main_goals(args)
    target = 128 * 2**20 if args.quick else GIB + 64 * 2**20
    runs = args.runs
    archive_dir = args.archive_dir or f"/tmp/logbuf-spark-ingest-{target >> 20}m"
    facts = make_archive(archive_dir, target)

    from logbuf.archive.catalog import Catalog

    with Catalog.open(archive_dir) as catalog:
        d = catalog.recordings()[0]
    from logbuf.archive.spark import register

    spark = local_spark("spark-ingest", "4g")
    results = new_results(
        "spark_ingest",
        archive_bytes=facts["recorded_bytes"],
        messages=facts["messages"],
        term_length=facts["term_length"],
        segment_length=facts["segment_length"],
        runs=runs,
        master="local[2]",
    )
    results["load_avg_at_start"] = os.getloadavg()
    try:
        register(spark)
        files = os.path.join(archive_dir, "*.rec")
        first_file = os.path.join(archive_dir, f"{d.recording_id}-{d.start_position}.rec")
        first_stop = d.start_position + d.segment_length

        def logbuf_source(warm: bool) -> Any:
            reader = spark.read.format("logbuf").option("mode", "DROPMALFORMED")
            return (reader.option("stopPosition", first_stop) if warm else reader).load(archive_dir)

        def binary_file(parser: Any) -> Any:
            return lambda warm: (
                spark.read.format("binaryFile")
                .load(first_file if warm else files)
                .select("path", "content")
                .mapInArrow(parser, BASELINE_DDL)
            )

        readers = {"logbuf data source": logbuf_source}
        if not args.skip_baselines:
            readers["binaryFile + mapInArrow (our numpy parser)"] = binary_file(numpy_parser(d))
        if not args.skip_struct_walk and not args.skip_baselines:
            readers["binaryFile + mapInArrow (struct walk)"] = binary_file(struct_walk_batches)
        for name, make in readers.items():
            make(True).selectExpr("count(*)").first()  # warm-up on one segment: planner, workers
            results["cases"].append(
                measure(name, lambda make=make: make(False), runs, facts["recorded_bytes"], facts["messages"])
            )
        base = {c["reader"]: c for c in results["cases"]}
        ours = base["logbuf data source"]
        for name, case in base.items():
            if name != "logbuf data source":
                ratio = ours["mb_per_s"] / case["mb_per_s"]
                results[f"ratio_vs_{name}"] = ratio
                print(f"logbuf data source / {name}: {ratio:.2f}x")
        if not args.skip_scale:
            scale_cases(spark, archive_dir, facts, runs, results)
        results["note"] = (
            "2-core machine shared with other work: figures are noisy. MB/s counts the recorded "
            "bytes (headers and padding included); rows are whole messages (fragments reassembled)."
        )
    finally:
        spark.stop()
    results["load_avg_at_end"] = os.getloadavg()
    if args.quick:
        results["benchmark"] = "spark_ingest_quick"
    write_results(results)
    return 0


def main_goals(args: argparse.Namespace) -> int:
    archive_dir = args.archive_dir or "/tmp/logbuf-spark-goals-300k"
    facts = make_goals_archive(archive_dir)
    from logbuf.archive.spark import register

    spark = local_spark("spark-ingest-goals", "2g")
    try:
        register(spark)
        results = goals(spark, archive_dir, facts, args.runs, args.label, args.streams_only)
    finally:
        spark.stop()
    results["benchmark"] = "spark_ingest_goals" + (f"_{args.label}" if args.label else "")
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
