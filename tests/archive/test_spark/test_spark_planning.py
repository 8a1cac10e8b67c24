"""The data source's planning without a Spark session: catalog damage, checksums, filters, options, read limits.

Archives here are synthetic segments (``synthetic.py``) with a real catalog written by ``Catalog``; the
Spark-session tests check the same paths end to end.
"""

from __future__ import annotations

import datetime
import os
import pathlib
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows
from structlog.testing import capture_logs

from logbuf.archive import catalog_descriptor as cat
from logbuf.archive.catalog import Catalog, ChecksumType, RecordingState
from logbuf.archive.spark import (
    LogbufDataSource,
    LogbufFilteringReader,
    LogbufReader,
    LogbufSourceError,
    LogbufStreamReader,
    ProblemPartition,
    ReadOptions,
    SegmentPartition,
    planned_segments,
)
from logbuf.archive.spark_frames import arrow_schema
from logbuf.logbuffer import data_header_descriptor as dh
from tests.archive.conftest import archive_cli
from tests.archive.test_spark.synthetic import TERM, SyntheticRecording, build_archive, recording


def read_all(reader: LogbufReader) -> pa.Table:
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    return pa.Table.from_batches(batches, schema=arrow_schema(reader.options.corrupt_column_or_none))


def reader_for(archive: pathlib.Path, **options: str) -> LogbufReader:
    source = LogbufDataSource({"path": str(archive), **options})
    reader = source.reader(source.schema())
    assert isinstance(reader, LogbufReader)
    return reader


@pytest.fixture
def four_streams(tmp_path: pathlib.Path) -> tuple[pathlib.Path, list[SyntheticRecording]]:
    """Four recordings on streams 10, 20, 30, 40, each ~3 segments."""
    recs = [recording(i, 10 * (i + 1), 250, seed=i, session_id=100 + i) for i in range(4)]
    build_archive(tmp_path, recs)
    return tmp_path, recs


# -- catalog damage and impossible descriptors -----------------------------------------
def test_a_damaged_catalog_is_a_corrupt_row_a_warning_or_a_failure_never_no_rows(
    four_streams: tuple[pathlib.Path, list[SyntheticRecording]],
) -> None:
    archive, recs = four_streams
    with Catalog.open_writable(archive) as writer:
        writer.set_state(1, RecordingState.INVALID)
    table = read_all(reader_for(archive))
    corrupt = table.filter(table.column("_corrupt_record").is_valid()).to_pylist()
    assert [(r["recording_id"], r["stream_id"], r["payload"]) for r in corrupt] == [(1, None, None)]
    assert "recording 1: its catalog entry is INVALID" in corrupt[0]["_corrupt_record"]
    assert table.num_rows == 1 + sum(len(r.messages) for r in recs if r.recording_id != 1)
    with capture_logs() as logs:
        assert read_all(reader_for(archive, mode="DROPMALFORMED")).num_rows == table.num_rows - 1
    assert [(e["event"], e["recording_id"]) for e in logs] == [("catalog.problem_dropped", 1)]
    with pytest.raises(LogbufSourceError, match=r"damaged catalog \(mode FAILFAST\): recording 1: its catalog entry"):
        reader_for(archive, mode="FAILFAST").partitions()
    assert read_all(reader_for(archive, mode="FAILFAST", recordingId="2")).num_rows == len(recs[2].messages)

    os.truncate(archive / cat.CATALOG_FILE_NAME, cat.entry_offset(3))  # recording 3 lost
    with pytest.raises(LogbufSourceError, match=r"catalog .* is truncated: .* recordings 3..3 are lost"):
        reader_for(archive, mode="FAILFAST", recordingId="3").partitions()


def test_an_impossible_term_length_is_reported_before_planning(tmp_path: pathlib.Path) -> None:
    recs = [recording(0, 10, 100, seed=1), recording(1, 10, 100, seed=2)]
    build_archive(tmp_path, recs)
    with open(tmp_path / cat.CATALOG_FILE_NAME, "r+b") as f:  # recording 1's term length becomes 3
        f.seek(cat.entry_offset(1) + cat.TERM_LENGTH_OFFSET)
        f.write((3).to_bytes(4, "little"))
    reader = reader_for(tmp_path)
    partitions = reader.partitions()
    assert [type(p).__name__ for p in partitions] == ["ProblemPartition"] + ["SegmentPartition"] * len(
        [p for p in partitions if isinstance(p, SegmentPartition)]
    )
    assert all(p.recording.recording_id == 0 for p in partitions if isinstance(p, SegmentPartition))
    problem = partitions[0]
    assert isinstance(problem, ProblemPartition) and "term length 3 in the catalog" in problem.reason
    table = read_all(reader)
    assert table.filter(table.column("_corrupt_record").is_valid()).column("stream_id").to_pylist() == [10]
    with pytest.raises(LogbufSourceError, match="FAILFAST.*recording 1: term length 3"):
        reader_for(tmp_path, mode="FAILFAST").partitions()


# -- record checksums ------------------------------------------------------------------------
def test_a_changed_payload_byte_is_a_corrupt_record_when_the_recording_has_checksums(tmp_path: pathlib.Path) -> None:
    rec = recording(0, 10, 300, seed=3)
    build_archive(tmp_path, [rec], checksum=ChecksumType.CRC32)
    clean = read_all(reader_for(tmp_path))
    assert clean.column("payload").to_pylist() == [m[0] for m in rec.messages]
    assert set(clean.column("session_id").to_pylist()) == {rec.session_id}  # the entry's, not the CRCs
    victim_start, victim_end = next((s, e) for s, e in rec.frames if s > TERM + 1000 and e - s > 100)
    path = tmp_path / f"0-{victim_start - victim_start % rec.segment_length}.rec"
    with open(path, "r+b") as f:
        f.seek(victim_start % rec.segment_length + dh.HEADER_LENGTH + 7)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    term_end = victim_start - victim_start % TERM + TERM
    table = read_all(reader_for(tmp_path))
    corrupt = table.filter(table.column("_corrupt_record").is_valid()).to_pylist()
    assert [r["position"] for r in corrupt] == [victim_start]
    assert (
        "payload checksum" in corrupt[0]["_corrupt_record"]
        and "(CRC-32) does not match" in corrupt[0]["_corrupt_record"]
    )
    good = table.filter(table.column("_corrupt_record").is_null())
    assert good.column("position").to_pylist() == [
        m[2] for m in rec.messages if m[2] <= victim_start or m[2] > term_end
    ]
    with pytest.raises(LogbufSourceError, match=f"FAILFAST.*payload checksum.*position {victim_start}"):
        read_all(reader_for(tmp_path, mode="FAILFAST"))


# -- filter pushdown ---------------------------------------------------------------------------
def test_stream_id_filter_prunes_recordings_and_keeps_exactly_the_matching_rows(
    four_streams: tuple[pathlib.Path, list[SyntheticRecording]],
) -> None:
    archive, recs = four_streams
    everything = reader_for(archive)
    assert isinstance(everything, LogbufFilteringReader)
    all_partitions = planned_segments(everything.partitions())
    reader = reader_for(archive)
    not_taken = IsNotNull(("payload",))
    rest = list(reader.pushFilters([EqualTo(("stream_id",), 20), not_taken]))
    assert rest == [not_taken]
    partitions = planned_segments(reader.partitions())
    assert {p.recording.stream_id for p in partitions if isinstance(p, SegmentPartition)} == {20}
    assert len(partitions) * 4 == len(all_partitions)
    table = read_all(reader)
    assert table.column("payload").to_pylist() == [m[0] for m in recs[1].messages]

    reader = reader_for(archive)
    list(reader.pushFilters([In(("recording_id",), (0, 3)), GreaterThan(("session_id",), 100)]))
    assert set(read_all(reader).column("recording_id").to_pylist()) == {3}
    reader = reader_for(archive)
    list(reader.pushFilters([EqualTo(("stream_id",), 20), EqualTo(("stream_id",), 30)]))
    assert reader.partitions() == []


def test_position_filter_prunes_segments_and_reads_only_its_byte_range(
    four_streams: tuple[pathlib.Path, list[SyntheticRecording]],
) -> None:
    archive, recs = four_streams
    rec = recs[0]
    lo, hi = rec.messages[100][2], rec.messages[120][2]
    reader = reader_for(archive, recordingId="0")
    assert list(reader.pushFilters([GreaterThan(("position",), lo), LessThanOrEqual(("position",), hi)])) == []
    partitions = planned_segments(reader.partitions())
    assert (
        len(partitions) == 1
        and partitions[0].base_position <= lo < hi <= partitions[0].base_position + rec.segment_length
    )
    assert partitions[0].parse_start == lo - lo % TERM  # from the term holding the range's start
    table = read_all(reader)
    assert table.column("position").to_pylist() == [m[2] for m in rec.messages[101:121]]


def test_timestamp_filters_are_exact_and_match_nothing_without_timestamps(
    four_streams: tuple[pathlib.Path, list[SyntheticRecording]],
) -> None:
    archive, recs = four_streams
    cut_us = 1_700_000_000_000_000 + 200
    cut = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(microseconds=cut_us)
    reader = reader_for(archive, timestampFrom="reserved_value", streamId="10")
    assert list(reader.pushFilters([GreaterThan(("timestamp",), cut)])) == []
    assert read_all(reader).column("reserved_value").to_pylist() == [m[1] for m in recs[0].messages if m[1] > cut_us]
    reader = reader_for(archive)  # timestamp is null for every row: no row can match
    list(reader.pushFilters([GreaterThan(("timestamp",), cut)]))
    assert read_all(reader).num_rows == 0


def test_filter_pushdown_can_be_turned_off() -> None:
    source = LogbufDataSource({"path": "x", "filterPushdown": "false"})
    assert type(source.reader(source.schema())) is LogbufReader


# -- options ----------------------------------------------------------------------------------
def test_unknown_options_are_errors_that_list_the_options() -> None:
    with pytest.raises(
        LogbufSourceError,
        match=r"unknown option 'streamIds' \(did you mean 'streamId'\?\) for format\('logbuf'\); the options are: path",
    ):
        ReadOptions.parse({"path": "x", "streamIds": "20"})
    with pytest.raises(
        LogbufSourceError,
        match="unknown options 'fooBar', 'maxFilesPerTrigger' \\(did you mean 'maxBytesPerTrigger'\\?\\)",
    ):
        ReadOptions.parse({"path": "x", "maxFilesPerTrigger": "1", "fooBar": "2"})
    with pytest.raises(LogbufSourceError, match="maxBytesPerTrigger=0 must be positive"):
        ReadOptions.parse({"path": "x", "maxBytesPerTrigger": "0"})
    with pytest.raises(LogbufSourceError, match="give one of them"):
        ReadOptions.parse({"path": "x", "maxBytesPerTrigger": "10", "maxRecordsPerTrigger": "10"})


def test_timestamp_unit_that_overflows_spark_timestamps_is_an_error(tmp_path: pathlib.Path) -> None:
    rec = recording(0, 10, 20, seed=4)  # reserved values are epoch microseconds
    build_archive(tmp_path, [rec])
    assert read_all(reader_for(tmp_path, timestampFrom="reserved_value", timestampUnit="us")).num_rows == 20
    with pytest.raises(
        LogbufSourceError,
        match=r"timestampUnit=s: reserved value 1700000000000000 \(recording 0, position \d+\) is .* outside "
        r"Spark's TIMESTAMP range \(years 1..9999\): is the unit right\?",
    ):
        read_all(reader_for(tmp_path, timestampFrom="reserved_value", timestampUnit="s"))


def test_a_catalog_tables_options_travel_in_its_schema(tmp_path: pathlib.Path) -> None:
    rec = recording(0, 10, 20, seed=5)
    build_archive(tmp_path, [rec])
    # What Spark gives schema() for CREATE TABLE t USING logbuf OPTIONS (path '...', streamId '10') ...
    created = LogbufDataSource(
        {
            "location": f"file:{tmp_path}",
            "option.streamid": "10",
            "streamid": "10",
            "owner": "me",
            "path": f"file:{tmp_path}",
            "provider": "logbuf",
        }
    )
    schema = created.schema()
    # ... and what it gives the reader for SELECT * FROM t: no options, the stored schema.
    selected = LogbufDataSource({})
    reader = selected.reader(schema)
    assert reader.options.archive_dir == str(tmp_path) and reader.options.stream_ids == frozenset({10})
    assert read_all(reader).num_rows == 20
    with pytest.raises(LogbufSourceError, match="no archive directory"):
        LogbufDataSource({}).reader(ReadOptions.parse({"path": "x"}).schema())


# -- streaming admission control -----------------------------------------------------------------
def test_max_bytes_per_trigger_advances_at_frame_boundaries_and_covers_everything(tmp_path: pathlib.Path) -> None:
    recs = [recording(0, 10, 300, seed=6), recording(1, 10, 100, seed=7)]
    build_archive(tmp_path, recs)
    reader = LogbufStreamReader(ReadOptions.parse({"path": str(tmp_path), "maxBytesPerTrigger": str(TERM + 100)}))
    assert reader.getDefaultReadLimit() == ReadMaxBytes(TERM + 100)
    start: dict[str, int] = reader.initialOffset()
    rows: list[int] = []
    batches = 0
    while True:
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        if end == start:
            break
        batches += 1
        moved = sum(end[k] - start.get(k, 0) for k in end)
        assert moved <= TERM + 100 or moved <= TERM * 2  # one term, or the rest of a term at most
        rows += [b.num_rows for p in reader.partitions(start, end) for b in reader.read(p)]
        start = end
    assert sum(rows) == sum(len(r.messages) for r in recs)
    total = sum(r.position for r in recs)
    assert batches >= total // (TERM + 100)
    assert reader.latestOffset({}, ReadAllAvailable()) == {"0": recs[0].position, "1": recs[1].position}


def test_max_records_per_trigger_reads_that_many_rows_per_micro_batch(tmp_path: pathlib.Path) -> None:
    recs = [recording(0, 10, 120, seed=8), recording(1, 10, 45, seed=9)]
    build_archive(tmp_path, recs)
    reader = LogbufStreamReader(ReadOptions.parse({"path": str(tmp_path), "maxRecordsPerTrigger": "50"}))
    assert reader.getDefaultReadLimit() == ReadMaxRows(50)
    start: dict[str, int] = {}
    counts = []
    positions = []
    while (end := reader.latestOffset(start, ReadMaxRows(50))) != start:
        table = pa.Table.from_batches(
            [b for p in reader.partitions(start, end) for b in reader.read(p)],
            schema=arrow_schema("_corrupt_record"),
        )
        counts.append(table.num_rows)
        positions += list(zip(table.column("recording_id").to_pylist(), table.column("position").to_pylist()))
        start = end
    assert counts == [50, 50, 50, 15]
    assert sorted(positions) == [(r.recording_id, m[2]) for r in recs for m in r.messages]  # shared fairly


def test_the_static_registration_module_is_what_spark_looks_up() -> None:
    import tomllib

    from pyspark.sql.datasource import DataSource

    import pyspark_logbuf

    # What pyspark.sql.worker.lookup_data_sources requires of an installed pyspark_* module.
    assert issubclass(pyspark_logbuf.DefaultSource, DataSource) and pyspark_logbuf.DefaultSource.name() == "logbuf"
    pyproject = tomllib.loads((pathlib.Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert "pyspark_logbuf" in pyproject["tool"]["setuptools"]["py-modules"]


# -- timestamp pruning (by the time index) ---------------------------------------------------------
def _at(us: int) -> datetime.datetime:
    return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(microseconds=us)


@pytest.fixture
def stamped_archive(tmp_path: pathlib.Path) -> tuple[pathlib.Path, list[SyntheticRecording]]:
    """Two recordings (streams 10 and 20) of ~5 segments each, stamped 1.7e15 + i µs, with a time index."""
    recs = [recording(i, 10 * (i + 1), 600, seed=40 + i, session_id=300 + i) for i in range(2)]
    build_archive(tmp_path, recs)
    assert archive_cli(tmp_path, "index") == 0
    return tmp_path, recs


T0 = 1_700_000_000_000_000


@pytest.mark.parametrize(
    ("filters", "wanted"),
    [
        ([EqualTo(("timestamp",), _at(T0 + 300))], lambda r: r == T0 + 300),
        ([LessThan(("timestamp",), _at(T0 + 100))], lambda r: r < T0 + 100),
        ([LessThanOrEqual(("timestamp",), _at(T0 + 100))], lambda r: r <= T0 + 100),
        ([GreaterThan(("timestamp",), _at(T0 + 500))], lambda r: r > T0 + 500),
        ([GreaterThanOrEqual(("timestamp",), _at(T0 + 500))], lambda r: r >= T0 + 500),
        (  # BETWEEN is the pair
            [GreaterThanOrEqual(("timestamp",), _at(T0 + 250)), LessThanOrEqual(("timestamp",), _at(T0 + 260))],
            lambda r: T0 + 250 <= r <= T0 + 260,
        ),
        ([In(("timestamp",), (_at(T0 + 5), _at(T0 + 590)))], lambda r: r in (T0 + 5, T0 + 590)),
    ],
)
def test_timestamp_filters_prune_segments_by_the_time_index_and_keep_exactly_the_matching_rows(
    stamped_archive: tuple[pathlib.Path, list[SyntheticRecording]], filters: list[Filter], wanted: Any
) -> None:
    archive, recs = stamped_archive
    everything = planned_segments(reader_for(archive, timestampFrom="reserved_value").partitions())
    reader = reader_for(archive, timestampFrom="reserved_value")
    assert list(reader.pushFilters(filters)) == []
    partitions = planned_segments(reader.partitions())
    assert 0 < len(partitions) < len(everything)
    table = read_all(reader)
    expected = sorted((r.recording_id, m[1]) for r in recs for m in r.messages if wanted(m[1]))
    assert sorted(zip(table.column("recording_id").to_pylist(), table.column("reserved_value").to_pylist())) == expected
    # The same rows with the filters evaluated on every segment (no index: nothing pruned).
    for rec in recs:
        (archive / f"{rec.recording_id}.times").unlink()
    unindexed = reader_for(archive, timestampFrom="reserved_value")
    list(unindexed.pushFilters(filters))
    assert len(planned_segments(unindexed.partitions())) == len(everything)
    assert read_all(unindexed).sort_by("position").equals(table.sort_by("position"))


def test_timestamp_pruning_combines_with_stream_and_position_filters(
    stamped_archive: tuple[pathlib.Path, list[SyntheticRecording]],
) -> None:
    archive, recs = stamped_archive
    rec = recs[1]
    reader = reader_for(archive, timestampFrom="reserved_value")
    lo_position = rec.messages[100][2]
    filters = [
        EqualTo(("stream_id",), 20),
        GreaterThan(("position",), lo_position),
        LessThan(("timestamp",), _at(T0 + 400)),
    ]
    assert list(reader.pushFilters(filters)) == []
    partitions = planned_segments(reader.partitions())
    assert {p.recording.recording_id for p in partitions} == {1}
    last_end = rec.messages[399][2]
    assert max(p.base_position for p in partitions) <= last_end  # segments after T0+400 are not planned
    assert min(p.base_position for p in partitions) <= lo_position
    everything_of_1 = planned_segments(reader_for(archive).partitions())
    assert len(partitions) < len(everything_of_1) // 2
    table = read_all(reader)
    assert table.column("reserved_value").to_pylist() == [m[1] for m in rec.messages[101:400]]
    # A timestamp filter without timestampFrom matches nothing: nothing is planned.
    reader = reader_for(archive)
    list(reader.pushFilters([GreaterThan(("timestamp",), _at(0))]))
    assert reader.partitions() == []
