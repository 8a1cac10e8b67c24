"""spark.readStream.format("logbuf"): a live recording read incrementally, restarts from the checkpoint."""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

import pytest

from logbuf.client import Aeron
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess
from tests.archive.conftest import RecorderProcess
from tests.archive.test_spark.conftest import await_recorded, payloads_for, publish
from tests.archive.test_spark.synthetic import build_archive, recording

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow
STREAM = 11


def run_available_now(
    spark: SparkSession, archive_dir: str, out: pathlib.Path, checkpoint: pathlib.Path, **options: str
) -> None:
    query = (
        spark.readStream.format("logbuf")
        .options(**options)
        .load(archive_dir)
        .select("recording_id", "position", "payload")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(90), "the availableNow query did not finish in 90 s"
    finally:
        query.stop()


def rows(spark: SparkSession, out: pathlib.Path) -> list[tuple[int, int, bytes]]:
    return sorted((r.recording_id, r.position, bytes(r.payload)) for r in spark.read.parquet(str(out)).collect())


def test_stream_reads_new_positions_and_new_recordings_once_across_restarts(
    spark: SparkSession, spark_driver: DriverProcess, aeron: Aeron, tmp_path: pathlib.Path
) -> None:
    archive_dir = str(tmp_path / "archive")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    recorder = RecorderProcess(archive_dir, spark_driver.dir, "aeron:ipc", STREAM).start()
    try:
        first = aeron.add_publication("aeron:ipc", STREAM)
        wait_until(lambda: first.is_connected, 20, "the recorder to subscribe")
        batch1 = publish(first, payloads_for(11, 300))
        d1 = await_recorded(archive_dir, batch1.session_id, batch1.end_positions[-1])
        assert d1.active

        run_available_now(spark, archive_dir, out, checkpoint)
        expected = [(d1.recording_id, p, m) for p, m in zip(batch1.end_positions, batch1.payloads)]
        assert rows(spark, out) == expected

        # The recorder keeps recording the same image, and a second publisher makes a new recording.
        batch2 = publish(first, payloads_for(12, 200))
        second = aeron.add_exclusive_publication("aeron:ipc", STREAM)
        wait_until(lambda: second.is_connected, 20, "the recorder to see the second publication")
        batch3 = publish(second, payloads_for(13, 100))
        await_recorded(archive_dir, batch2.session_id, batch2.end_positions[-1])
        d2 = await_recorded(archive_dir, batch3.session_id, batch3.end_positions[-1])
        assert d2.recording_id != d1.recording_id

        run_available_now(spark, archive_dir, out, checkpoint)  # a restart from the checkpoint
        expected += [(d1.recording_id, p, m) for p, m in zip(batch2.end_positions, batch2.payloads)]
        expected += [(d2.recording_id, p, m) for p, m in zip(batch3.end_positions, batch3.payloads)]
        assert rows(spark, out) == sorted(expected)  # the new rows, and nothing read twice

        run_available_now(spark, archive_dir, out, checkpoint)  # nothing new: nothing added
        assert rows(spark, out) == sorted(expected)
        first.close()
        second.close()
    finally:
        assert recorder.stop() == 0, recorder.output()


@pytest.mark.parametrize(("option", "value"), [("maxRecordsPerTrigger", "100"), ("maxBytesPerTrigger", "70000")])
def test_admission_control_splits_the_backlog_into_micro_batches(
    spark: SparkSession, tmp_path: pathlib.Path, option: str, value: str
) -> None:
    recs = [recording(0, 10, 230, seed=50), recording(1, 20, 60, seed=51)]
    archive = tmp_path / "archive"
    build_archive(archive, recs)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = (
        spark.readStream.format("logbuf")
        .option(option, value)
        .load(str(archive))
        .select("recording_id", "position", "payload")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
        batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert sum(batches) == 290
    if option == "maxRecordsPerTrigger":
        assert batches == [100, 100, 90]
    else:  # one 64 KiB term (plus what fits) per micro-batch: the first one no longer reads everything
        assert len(batches) >= 3 and max(batches) < 290
    expected = sorted((r.recording_id, m[2], m[0]) for r in recs for m in r.messages)
    assert rows(spark, out) == expected


def test_a_query_across_a_retention_run_fails_naming_the_lost_range_or_skips_it_when_told(
    spark: SparkSession, tmp_path: pathlib.Path
) -> None:
    from pyspark.errors import StreamingQueryException

    from logbuf.archive.catalog import Catalog
    from logbuf.archive.maintenance import purge_segments

    rec = recording(0, 10, 700, seed=60)
    archive = tmp_path / "archive"
    build_archive(archive, [rec])
    read_to = rec.messages[100][2]
    purged_to = 3 * rec.segment_length
    with Catalog.open_writable(archive) as catalog:
        catalog.update_stop_position(0, read_to)  # the recording so far, as a live one would be
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    run_available_now(spark, str(archive), out, checkpoint)
    assert rows(spark, out) == [(0, m[2], m[0]) for m in rec.messages[:101]]

    with Catalog.open_writable(archive) as catalog:  # more is recorded, then retention runs
        catalog.update_stop_position(0, rec.position)
        assert purge_segments(catalog, 0, before_position=purged_to)
    with pytest.raises(StreamingQueryException, match=f"data loss: recording 0: positions {read_to} to {purged_to}"):
        run_available_now(spark, str(archive), out, checkpoint)
    assert rows(spark, out) == [(0, m[2], m[0]) for m in rec.messages[:101]]  # nothing more was written

    run_available_now(spark, str(archive), out, checkpoint, failOnDataLoss="false")
    assert rows(spark, out) == [(0, m[2], m[0]) for m in rec.messages if m[2] <= read_to or m[2] > purged_to]
