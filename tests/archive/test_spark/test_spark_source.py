"""spark.read.format("logbuf") on a recording made by a real driver and recorder (one SparkSession)."""

from __future__ import annotations

import pathlib
import shutil
from typing import TYPE_CHECKING

import pytest

from logbuf.archive.segments import segment_files
from logbuf.logbuffer import data_header_descriptor as dh
from tests.archive.test_spark.conftest import MAX_PAYLOAD, RecordedArchive

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession

pytestmark = pytest.mark.slow


def test_spark_reads_every_message_whole_with_its_position(spark: SparkSession, recorded: RecordedArchive) -> None:
    d, published = recorded.recording, recorded.published
    df = spark.read.format("logbuf").load(recorded.archive_dir)
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
        "payload",
        "_corrupt_record",
    ]
    assert df.rdd.getNumPartitions() == len(segment_files(recorded.archive_dir, d.recording_id))
    rows = df.orderBy("position").collect()
    assert len(rows) == len(published.payloads)
    assert [bytes(r.payload) for r in rows] == published.payloads
    assert [r.position for r in rows] == published.end_positions
    assert [r.reserved_value for r in rows] == published.reserved
    assert {(r.recording_id, r.stream_id, r.session_id, r.flags) for r in rows} == {
        (d.recording_id, d.stream_id, d.session_id, dh.UNFRAGMENTED)
    }
    assert all(r._corrupt_record is None and r.timestamp is None for r in rows)
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
