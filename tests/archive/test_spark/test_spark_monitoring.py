"""What a pipeline sees: progress with the latest offset (lag), DESCRIBE with the table's options, and a
session without filter pushdown that still reads (with a warning)."""

from __future__ import annotations

import json
import pathlib
from typing import TYPE_CHECKING

import pytest

from logbuf.archive.spark import progress_bytes
from tests.archive.test_spark.synthetic import build_archive, recording

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow


def test_progress_reports_the_latest_offset_so_the_lag_is_visible(spark: SparkSession, tmp_path: pathlib.Path) -> None:
    recs = [recording(0, 10, 200, seed=80), recording(1, 20, 200, seed=81)]
    archive = tmp_path / "archive"
    build_archive(archive, recs)
    query = (
        spark.readStream.format("logbuf")
        .option("maxBytesPerTrigger", "128k")
        .load(str(archive))
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    ends = {"0": recs[0].position, "1": recs[1].position}
    sources = [p["sources"][0] for p in progress]

    def offsets(value: object) -> dict[str, int]:
        return json.loads(value) if isinstance(value, str) else dict(value)  # type: ignore[call-overload]

    assert all(offsets(s["latestOffset"]) == ends for s in sources)  # what is available: the backlog
    lag = [sum(ends[k] - v for k, v in offsets(s["endOffset"]).items()) for s in sources]
    assert lag[0] > 0 and lag[-1] == 0 and lag == sorted(lag, reverse=True)
    # Spark's own input bytes stay 0 for a Python source; the offsets give them exactly.
    measured = [progress_bytes(p) for p in progress]
    assert [m.lag_bytes for m in measured] == lag
    assert sum(m.input_bytes for m in measured) == sum(ends.values())
    assert all(0 < m.input_bytes <= 128 * 1024 for m in measured)
    assert progress_bytes(progress[0].json) == measured[0]


def test_describe_shows_the_tables_options(spark: SparkSession, tmp_path: pathlib.Path) -> None:
    build_archive(tmp_path, [recording(0, 20, 10, seed=82)])
    spark.sql(f"CREATE TABLE logbuf_described USING logbuf OPTIONS (path '{tmp_path}', streamId '20')")
    try:
        rows = spark.sql("DESCRIBE TABLE logbuf_described").collect()
    finally:
        spark.sql("DROP TABLE IF EXISTS logbuf_described")
    first = next(r for r in rows if r.col_name == "recording_id")
    assert first.comment.startswith("logbuf: ")  # Spark hands the options over lower-cased, the path as a URI
    assert f"{tmp_path}," in first.comment and "streamid=20" in first.comment.lower()


def test_a_session_without_filter_pushdown_reads_without_it(spark: SparkSession, tmp_path: pathlib.Path) -> None:
    recs = [recording(0, 10, 40, seed=83), recording(1, 20, 30, seed=84)]
    build_archive(tmp_path, recs)
    key = "spark.sql.python.filterPushdown.enabled"
    spark.conf.set(key, "false")
    try:
        df = spark.read.format("logbuf").load(str(tmp_path))
        assert df.count() == 70
        assert df.filter("stream_id = 20").count() == 30
    finally:
        spark.conf.set(key, "true")
