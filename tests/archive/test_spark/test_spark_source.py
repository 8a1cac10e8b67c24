"""spark.read.format("logbuf") on a recording made by a real driver and recorder (one SparkSession)."""

from __future__ import annotations

import datetime
import pathlib
import shutil
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from logbuf.archive.catalog import Catalog, ChecksumType, RecordingState
from logbuf.archive.segments import segment_files
from logbuf.logbuffer import data_header_descriptor as dh
from tests.archive.conftest import S3Server, archive_cli
from tests.archive.test_spark.conftest import MAX_PAYLOAD, RecordedArchive
from tests.archive.test_spark.synthetic import build_archive, recording

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession

pytestmark = pytest.mark.slow


def test_spark_reads_every_message_whole_with_its_position(spark: SparkSession, recorded: RecordedArchive) -> None:
    d, published = recorded.recording, recorded.published
    df = spark.read.format("logbuf").option("maxPartitionBytes", "0").load(recorded.archive_dir)
    assert df.columns == [
        "recording_id",
        "stream_id",
        "session_id",
        "term_id",
        "term_offset",
        "position",
        "flags",
        "reserved_value",
        "timestamp",
        "topic",
        "payload",
        "_corrupt_record",
    ]
    assert df.rdd.getNumPartitions() == len(segment_files(recorded.archive_dir, d.recording_id))  # one per segment
    assert spark.read.format("logbuf").load(recorded.archive_dir).rdd.getNumPartitions() == 1  # packed: 64 MiB
    rows = df.orderBy("position").collect()
    assert len(rows) == len(published.payloads)
    assert [bytes(r.payload) for r in rows] == published.payloads
    assert [r.position for r in rows] == published.end_positions
    assert [r.reserved_value for r in rows] == published.reserved
    assert {(r.recording_id, r.stream_id, r.session_id, r.flags) for r in rows} == {
        (d.recording_id, d.stream_id, d.session_id, dh.UNFRAGMENTED)
    }
    assert all(r._corrupt_record is None and r.timestamp is not None for r in rows)  # the append time
    assert sum(len(p) > MAX_PAYLOAD for p in published.payloads) > 500


def test_options_select_frames_streams_recordings_positions_and_timestamps(
    spark: SparkSession, recorded: RecordedArchive
) -> None:
    d, published = recorded.recording, recorded.published

    def reader() -> DataFrameReader:  # a DataFrameReader keeps the options set on it: one per query
        return spark.read.format("logbuf").option("path", recorded.archive_dir)

    frames = sum(max(1, -(-len(p) // MAX_PAYLOAD)) for p in published.payloads)
    assert reader().option("rowsPer", "frame").load().count() == frames
    assert reader().option("streamId", "999").load().count() == 0
    assert reader().option("recordingId", f"{d.recording_id + 1}").load().count() == 0
    lo, hi = published.end_positions[999], published.end_positions[2000]
    ranged = reader().option("startPosition", lo).option("stopPosition", hi).option("streamId", d.stream_id).load()
    got = ranged.orderBy("position").select("position", "payload").collect()
    assert [r.position for r in got] == published.end_positions[1000:2001]
    assert [bytes(r.payload) for r in got] == published.payloads[1000:2001]
    stamped = reader().option("timestampFrom", "reserved_value").load().orderBy("position").limit(50).collect()
    # collect() gives naive datetimes in this process's local time zone: .timestamp() undoes that.
    assert [
        int(r.timestamp.replace(microsecond=0).timestamp()) * 10**6 + r.timestamp.microsecond for r in stamped
    ] == published.reserved[:50]


def test_corrupted_and_truncated_segments_in_the_three_modes(
    spark: SparkSession, recorded: RecordedArchive, tmp_path: pathlib.Path
) -> None:
    d, published = recorded.recording, recorded.published
    archive = tmp_path / "archive"
    shutil.copytree(recorded.archive_dir, archive, ignore=shutil.ignore_patterns("*.log"))
    files = segment_files(archive, d.recording_id)
    assert len(files) >= 4
    ends = published.end_positions
    term = d.term_length
    # A corrupted frame: the term id of the message ending at ends[k] in the second segment.
    k = next(i for i, end in enumerate(ends) if end > files[1][0] + 2 * 4096 and ends[i] - ends[i - 1] < 1000)
    bad = ends[k - 1]
    base, path = files[1]
    with open(path, "r+b") as f:
        f.seek(bad - base + dh.TERM_ID_FIELD_OFFSET)
        f.write((12345).to_bytes(4, "little"))
    bad_term_end = bad - bad % term + term
    # A truncated segment: the last file cut inside a frame.
    last_base, last_path = files[-1]
    j = next(i for i, end in enumerate(ends) if ends[i - 1] > last_base + 300 and end - ends[i - 1] > 200)
    cut_frame = ends[j - 1]
    with open(last_path, "r+b") as f:
        f.truncate(cut_frame - last_base + 100)
    cut_term_end = cut_frame - cut_frame % term + term
    kept = [
        i for i, end in enumerate(ends) if not (bad < end <= bad_term_end) and not (cut_frame < end <= cut_term_end)
    ]

    permissive = spark.read.format("logbuf").load(str(archive)).orderBy("position").collect()
    corrupt = [r for r in permissive if r._corrupt_record is not None]
    assert [r.position for r in corrupt] == [bad, cut_frame]
    assert "term id field 12345 does not match the position" in corrupt[0]._corrupt_record
    assert f"skipped to position {bad_term_end}" in corrupt[0]._corrupt_record
    assert "truncated" in corrupt[1]._corrupt_record
    assert all(r.payload is None and r.flags is None for r in corrupt)
    good = [r for r in permissive if r._corrupt_record is None]
    assert [r.position for r in good] == [ends[i] for i in kept]
    assert [bytes(r.payload) for r in good] == [published.payloads[i] for i in kept]

    other_name = (
        spark.read.format("logbuf")
        .option("columnNameOfCorruptRecord", "bad")
        .load(str(archive))
        .filter("bad IS NOT NULL")
        .count()
    )
    assert other_name == 2

    dropped = spark.read.format("logbuf").option("mode", "DROPMALFORMED").load(str(archive))
    assert "_corrupt_record" not in dropped.columns
    assert sorted(r.position for r in dropped.select("position").collect()) == [ends[i] for i in kept]

    with pytest.raises(Exception, match=f"malformed frame \\(mode FAILFAST\\): term id field 12345.*position {bad}"):
        spark.read.format("logbuf").option("mode", "FAILFAST").load(str(archive)).count()


def test_filter_on_stream_id_is_pushed_down_and_prunes_partitions(spark: SparkSession, tmp_path: pathlib.Path) -> None:
    recs = [recording(i, 10 * (i + 1), 150, seed=20 + i, session_id=200 + i) for i in range(4)]
    build_archive(tmp_path, recs)
    df = spark.read.format("logbuf").option("maxPartitionBytes", "0").load(str(tmp_path))  # one per segment
    everything = df.rdd.getNumPartitions()
    filtered = df.filter(F.col("stream_id") == 20)
    assert everything == sum(len(segment_files(tmp_path, r.recording_id)) for r in recs)
    assert filtered.rdd.getNumPartitions() == len(segment_files(tmp_path, 1))  # one recording's segments only
    rows = filtered.orderBy("position").collect()
    assert [bytes(r.payload) for r in rows] == [m[0] for m in recs[1].messages]
    ranged = df.filter((F.col("position") > recs[2].messages[9][2]) & (F.col("recording_id") == 2))
    assert [r.position for r in ranged.orderBy("position").select("position").collect()] == [
        m[2] for m in recs[2].messages[10:]
    ]
    assert df.filter("stream_id IN (10, 40) AND session_id = 203").count() == len(recs[3].messages)
    # Off: the same rows, every partition planned.
    off = spark.read.format("logbuf").options(filterPushdown="false", maxPartitionBytes="0").load(str(tmp_path))
    off = off.filter("stream_id = 20")
    assert off.rdd.getNumPartitions() == everything and off.count() == len(recs[1].messages)


def test_unknown_options_and_a_damaged_catalog_fail_the_query_naming_them(
    spark: SparkSession, tmp_path: pathlib.Path
) -> None:
    recs = [recording(0, 10, 50, seed=30), recording(1, 10, 50, seed=31)]
    build_archive(tmp_path, recs)
    with pytest.raises(Exception, match=r"(?i)unknown option 'streamIds' \(did you mean 'streamId'\?\)"):
        spark.read.format("logbuf").option("streamIds", 20).load(str(tmp_path)).count()
    with Catalog.open_writable(tmp_path) as writer:
        writer.set_state(1, RecordingState.INVALID)
    rows = spark.read.format("logbuf").load(str(tmp_path)).filter("_corrupt_record IS NOT NULL").collect()
    assert [(r.recording_id, r.payload) for r in rows] == [(1, None)]
    with pytest.raises(Exception, match=r"damaged catalog \(mode FAILFAST\): recording 1"):
        spark.read.format("logbuf").option("mode", "FAILFAST").load(str(tmp_path)).count()


def test_sql_create_table_and_temporary_view_using_logbuf(spark: SparkSession, tmp_path: pathlib.Path) -> None:
    recs = [recording(0, 10, 40, seed=40), recording(1, 20, 30, seed=41)]
    build_archive(tmp_path, recs)
    spark.sql(f"CREATE TABLE logbuf_stream20 USING logbuf OPTIONS (path '{tmp_path}', streamId '20')")
    try:
        got = spark.sql("SELECT position, payload FROM logbuf_stream20 ORDER BY position").collect()
        assert [(r.position, bytes(r.payload)) for r in got] == [(m[2], m[0]) for m in recs[1].messages]
        assert spark.sql("SELECT count(*) AS n FROM logbuf_stream20 WHERE position > 0").first().n == 30
    finally:
        spark.sql("DROP TABLE IF EXISTS logbuf_stream20")
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW logbuf_all USING logbuf OPTIONS (path '{tmp_path}')")
    counts = spark.sql(
        "SELECT stream_id, count(*) AS n FROM logbuf_all GROUP BY stream_id ORDER BY stream_id"
    ).collect()
    assert [(r.stream_id, r.n) for r in counts] == [(10, 40), (20, 30)]


def test_a_recording_made_with_checksums_reads_whole_and_a_changed_byte_is_a_corrupt_record(
    spark: SparkSession, recorded_with_checksums: RecordedArchive, tmp_path: pathlib.Path
) -> None:
    d, published = recorded_with_checksums.recording, recorded_with_checksums.published
    assert d.checksum is ChecksumType.CRC32
    rows = spark.read.format("logbuf").load(recorded_with_checksums.archive_dir).orderBy("position").collect()
    assert [bytes(r.payload) for r in rows] == published.payloads
    assert {r.session_id for r in rows} == {published.session_id}
    archive = tmp_path / "archive"
    shutil.copytree(recorded_with_checksums.archive_dir, archive, ignore=shutil.ignore_patterns("*.log"))
    k = next(i for i, p in enumerate(published.payloads) if len(p) > 50 and i > 10)
    victim = published.end_positions[k - 1]  # the frame of message k starts where k - 1 ended
    base, path = segment_files(archive, d.recording_id)[victim // d.segment_length]
    with open(path, "r+b") as f:
        f.seek(victim - base + dh.HEADER_LENGTH + 20)
        f.write(bytes([published.payloads[k][20] ^ 0xFF]))
    corrupt = spark.read.format("logbuf").load(str(archive)).filter("_corrupt_record IS NOT NULL").collect()
    assert [r.position for r in corrupt] == [victim] and "payload checksum" in corrupt[0]._corrupt_record
    with pytest.raises(Exception, match=f"FAILFAST.*payload checksum.*position {victim}"):
        spark.read.format("logbuf").option("mode", "FAILFAST").load(str(archive)).count()


def test_archives_on_s3_and_lists_of_paths_read_row_for_row(
    spark: SparkSession, recorded: RecordedArchive, s3_server: S3Server, tmp_path: pathlib.Path
) -> None:
    bucket = s3_server.new_bucket()
    uri = s3_server.uri(bucket, "recorded")
    assert archive_cli(recorded.archive_dir, "upload", uri) == 0
    columns = ["recording_id", "position", "reserved_value", "payload"]
    local = spark.read.format("logbuf").load(recorded.archive_dir).select(*columns).orderBy("position").collect()
    remote = spark.read.format("logbuf").load(uri).select(*columns).orderBy("position").collect()
    assert remote == local and len(remote) == len(recorded.published.payloads)
    second = tmp_path / "second"
    build_archive(second, [recording(0, 99, 40, seed=60)])
    both = spark.read.format("logbuf").load([recorded.archive_dir, str(second)])
    assert both.columns[0] == "archive"
    counts = {(r.archive, r.n) for r in both.groupBy("archive").agg(F.count("*").alias("n")).collect()}
    assert counts == {(recorded.archive_dir, len(local)), (str(second), 40)}


def test_a_timestamp_range_prunes_the_recorders_segments_and_keeps_exactly_its_rows(
    spark: SparkSession, recorded: RecordedArchive
) -> None:
    """The recorder wrote the time index as it went: a BETWEEN on ``timestamp`` plans only the segments
    whose reserved values reach the range, and the rows are those of the unpruned read."""
    reserved = recorded.published.reserved
    lo, hi = reserved[1000], reserved[1200]
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

    def at(us: int) -> datetime.datetime:
        return epoch + datetime.timedelta(microseconds=us)

    df = spark.read.format("logbuf").options(timestampFrom="reserved_value", maxPartitionBytes="0")
    df = df.load(recorded.archive_dir)
    ranged = df.filter(F.col("timestamp").between(at(lo), at(hi)))
    everything = df.rdd.getNumPartitions()
    pruned = ranged.rdd.getNumPartitions()
    assert 0 < pruned < everything / 4
    rows = ranged.orderBy("position").select("position", "reserved_value").collect()
    assert [r.reserved_value for r in rows] == [r for r in reserved if lo <= r <= hi]
    unpruned = (
        spark.read.format("logbuf")
        .options(timestampFrom="reserved_value", filterPushdown="false", maxPartitionBytes="0")
        .load(recorded.archive_dir)
        .filter(F.col("timestamp").between(at(lo), at(hi)))
    )
    assert unpruned.rdd.getNumPartitions() == everything
    assert unpruned.orderBy("position").select("position", "reserved_value").collect() == rows
    later = df.filter(F.col("timestamp") > at(reserved[-1]))
    assert later.count() == 0 and later.rdd.getNumPartitions() <= 1
