"""Offsets a pipeline can pin, data loss that fails loudly, fair admission control: the source's planning,
without a Spark session (``test_spark_stream.py`` runs the same through Spark).

Archives are synthetic segments (``synthetic.py``) with a real catalog; retention is the real
``purge_segments``.
"""

from __future__ import annotations

import json
import pathlib

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxRows
from structlog.testing import capture_logs

from logbuf.archive.catalog import Catalog
from logbuf.archive.maintenance import purge_segments
from logbuf.archive.spark import (
    LogbufSourceError,
    LogbufStreamReader,
    PackedPartition,
    ReadOptions,
    SegmentPartition,
    planned_segments,
)
from logbuf.archive.spark_frames import arrow_schema
from logbuf.archive.spark_offsets import fair_shares, frame_boundary_at_or_before, parse_size
from logbuf.archive.storage import parse_location
from logbuf.logbuffer import data_header_descriptor as dh
from tests.archive.test_spark.synthetic import TERM, SyntheticRecording, build_archive, recording
from tests.archive.test_spark.test_spark_planning import read_all, reader_for


def stream_reader(archive: pathlib.Path, **options: str) -> LogbufStreamReader:
    return LogbufStreamReader(ReadOptions.parse({"path": str(archive), **options}))


def micro_batch(reader: LogbufStreamReader, start: dict[str, int], end: dict[str, int]) -> list[tuple[int, int]]:
    """(recording id, position) of the rows of one micro-batch."""
    batches = [b for p in reader.partitions(start, end) for b in reader.read(p)]
    table = pa.Table.from_batches(batches, schema=arrow_schema("_corrupt_record"))
    return list(zip(table.column("recording_id").to_pylist(), table.column("position").to_pylist()))


def drain(reader: LogbufStreamReader, start: dict[str, int], limit: object) -> list[list[tuple[int, int]]]:
    batches = []
    while (end := reader.latestOffset(start, limit)) != start:
        batches.append(micro_batch(reader, start, end))
        start = end
    return batches


def positions(rec: SyntheticRecording) -> list[tuple[int, int]]:
    return [(rec.recording_id, m[2]) for m in rec.messages]


@pytest.fixture
def long_recording(tmp_path: pathlib.Path) -> tuple[pathlib.Path, SyntheticRecording]:
    """One recording of about five 128 KiB segments (two 64 KiB terms each)."""
    rec = recording(0, 10, 700, seed=30)
    build_archive(tmp_path, [rec])
    assert rec.position > 4 * rec.segment_length
    return tmp_path, rec


# -- data loss --------------------------------------------------------------------------------------------
def test_a_stream_whose_unread_segments_were_removed_fails_naming_the_lost_range(
    long_recording: tuple[pathlib.Path, SyntheticRecording],
) -> None:
    archive, rec = long_recording
    reader = stream_reader(archive, maxBytesPerTrigger="100000")
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert micro_batch(reader, start, end)  # the query has read the first ~100 KB
    read_to = end["0"]
    with Catalog.open_writable(archive) as catalog:
        purge_segments(catalog, 0, before_position=3 * rec.segment_length)
    with pytest.raises(LogbufSourceError) as e:
        reader.partitions(end, reader.latestOffset(end, ReadAllAvailable()))
    assert f"data loss: recording 0: positions {read_to} to {3 * rec.segment_length}" in str(e.value)
    assert "failOnDataLoss=false" in str(e.value)


def test_with_fail_on_data_loss_false_the_lost_range_is_skipped_and_logged(
    long_recording: tuple[pathlib.Path, SyntheticRecording],
) -> None:
    archive, rec = long_recording
    reader = stream_reader(archive, maxBytesPerTrigger="100000", failOnDataLoss="false")
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    first = micro_batch(reader, start, end)
    new_start = 3 * rec.segment_length
    with Catalog.open_writable(archive) as catalog:
        purge_segments(catalog, 0, before_position=new_start)
    with capture_logs() as logs:
        rest = drain(reader, end, ReadAllAvailable())
    lost = [e for e in logs if e["event"] == "stream.data_lost"]
    assert lost == [
        {
            "event": "stream.data_lost",
            "log_level": "warning",
            "role": "spark-source",
            "recording_id": 0,
            "lost_from": end["0"],
            "lost_to": new_start,
            "reason": f"the recording now starts at {new_start}",
        }
    ]
    got = first + [row for batch in rest for row in batch]
    assert got == [p for p in positions(rec) if p[1] <= end["0"] or p[1] > new_start]


def test_a_deleted_recording_that_was_being_read_is_data_loss(
    long_recording: tuple[pathlib.Path, SyntheticRecording],
) -> None:
    from logbuf.archive.maintenance import delete_recording

    archive, rec = long_recording
    reader = stream_reader(archive, maxBytesPerTrigger="100000")
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    with Catalog.open_writable(archive) as catalog:
        delete_recording(catalog, 0)
    with pytest.raises(LogbufSourceError, match=f"positions {end['0']} to {rec.position} .*DELETED"):
        reader.partitions(end, reader.latestOffset(end, ReadAllAvailable()))


def test_a_batch_starting_offset_before_the_retained_start_is_data_loss(
    long_recording: tuple[pathlib.Path, SyntheticRecording],
) -> None:
    archive, rec = long_recording
    with Catalog.open_writable(archive) as catalog:
        purge_segments(catalog, 0, before_position=rec.segment_length)
    with pytest.raises(LogbufSourceError, match=f"positions 0 to {rec.segment_length}"):
        reader_for(archive, startingOffsets='{"0": 0}').partitions()
    table = read_all(reader_for(archive, startingOffsets='{"0": 0}', failOnDataLoss="false"))
    assert table.column("position").to_pylist() == [p for _, p in positions(rec) if p > rec.segment_length]


# -- offsets ----------------------------------------------------------------------------------------------
@pytest.fixture
def three(tmp_path: pathlib.Path) -> tuple[pathlib.Path, list[SyntheticRecording]]:
    recs = [recording(i, 10 * (i + 1), 150, seed=40 + i, session_id=200 + i) for i in range(3)]
    build_archive(tmp_path, recs)
    return tmp_path, recs


def test_batch_starting_and_ending_offsets_select_rows_per_recording(
    three: tuple[pathlib.Path, list[SyntheticRecording]],
) -> None:
    archive, recs = three
    a, b = recs[0].messages[20][2], recs[0].messages[90][2]
    mid = recs[1].messages[40][2] - 40  # inside a frame: rows that end after it
    table = read_all(
        reader_for(
            archive,
            startingOffsets=json.dumps({"0": a, "1": mid, "2": -1}),
            endingOffsets=json.dumps({"0": b}),
        )
    )
    got = list(zip(table.column("recording_id").to_pylist(), table.column("position").to_pylist()))
    expected = [p for p in positions(recs[0]) if a < p[1] <= b] + [p for p in positions(recs[1]) if p[1] > mid]
    assert sorted(got) == sorted(expected)


def test_streaming_honours_start_and_stop_positions_and_offsets(
    three: tuple[pathlib.Path, list[SyntheticRecording]],
) -> None:
    archive, recs = three
    low, high = 30_000, 120_000
    reader = stream_reader(archive, startPosition=str(low), stopPosition=str(high), maxRecordsPerTrigger="64")
    rows = [r for batch in drain(reader, reader.initialOffset(), reader.getDefaultReadLimit()) for r in batch]
    assert sorted(rows) == sorted(p for r in recs for p in positions(r) if low < p[1] <= high)

    r1 = recs[1]
    start, stop = r1.messages[10][2] + 64, r1.messages[100][2] + 8  # both inside frames
    reader = stream_reader(
        archive,
        startingOffsets=json.dumps({"1": start, "0": -1}),
        endingOffsets=json.dumps({"1": stop, "2": -2}),
    )
    initial = reader.initialOffset()
    assert initial["0"] == recs[0].position
    rows = [r for batch in drain(reader, initial, ReadAllAvailable()) for r in batch]
    assert sorted(rows) == [p for p in positions(r1) if start < p[1] <= stop]


def test_offsets_are_checked_against_the_catalog(three: tuple[pathlib.Path, list[SyntheticRecording]]) -> None:
    archive, recs = three
    with pytest.raises(LogbufSourceError, match=r"name recording 7, not among the recordings read \(0, 1, 2\)"):
        reader_for(archive, startingOffsets='{"7": 0}').partitions()
    with pytest.raises(LogbufSourceError, match="name recording 7"):
        stream_reader(archive, endingOffsets='{"7": 0}').initialOffset()
    with pytest.raises(LogbufSourceError, match=f"recording 2 stopped at position {recs[2].position}"):
        reader_for(archive, endingOffsets=json.dumps({"2": recs[2].position + 4096})).partitions()
    for bad in ("soon", "[1]", '{"x": 1}', '{"1": -3}', '{"1": "5"}'):
        with pytest.raises(LogbufSourceError, match="Offsets"):
            ReadOptions.parse({"path": str(archive), "startingOffsets": bad})


def test_a_position_inside_a_frame_moves_back_to_that_frames_start(tmp_path: pathlib.Path) -> None:
    rec = SyntheticRecording()
    ends = [rec.offer(bytes(n)) for n in (100, 3000, 0, 5000)]
    build_archive(tmp_path, [rec])
    d = rec.descriptor()
    location = parse_location(str(tmp_path))
    starts = [s for s, _ in rec.frames]
    for start, end in rec.frames:
        assert frame_boundary_at_or_before(location, d, start) == start
        assert frame_boundary_at_or_before(location, d, start + 1) == start
        assert frame_boundary_at_or_before(location, d, end - 1) == start
    assert frame_boundary_at_or_before(location, d, ends[-1]) == ends[-1] == rec.position
    assert frame_boundary_at_or_before(location, d, 10**9) == rec.position
    assert starts[0] == 0


# -- admission control ------------------------------------------------------------------------------------
def test_sizes_are_read_as_spark_writes_them() -> None:
    assert [parse_size("s", t) for t in ("4m", "4MB", "4MiB", "512k", "1048576", "1g", "2b")] == [
        4 << 20,
        4 << 20,
        4 << 20,
        512 << 10,
        1 << 20,
        1 << 30,
        2,
    ]
    for bad in ("", "m", "4x", "-4m", "0", "4.5m"):
        with pytest.raises(ValueError, match="s="):
            parse_size("s", bad)
    assert ReadOptions.parse({"path": "x", "maxBytesPerTrigger": "4m"}).max_bytes_per_trigger == 4 << 20
    with pytest.raises(LogbufSourceError, match="maxBytesPerTrigger='4 apples' is not a size"):
        ReadOptions.parse({"path": "x", "maxBytesPerTrigger": "4 apples"})


def test_fair_shares_split_the_budget_and_pass_on_what_one_does_not_need() -> None:
    assert fair_shares({"0": 100, "1": 100, "2": 100}, 90) == {"0": 30, "1": 30, "2": 30}
    assert fair_shares({"0": 10, "1": 100, "2": 100}, 90) == {"0": 10, "1": 40, "2": 40}
    assert fair_shares({"0": 10, "1": 20}, 1000) == {"0": 10, "1": 20}
    assert fair_shares({"0": 5, "1": 5, "2": 5}, 2) == {"0": 1, "1": 1, "2": 0}


def test_a_byte_budget_is_shared_by_every_recording_each_trigger_and_cut_at_frame_boundaries(
    three: tuple[pathlib.Path, list[SyntheticRecording]],
) -> None:
    archive, recs = three
    budget = 30_000
    reader = stream_reader(archive, maxBytesPerTrigger=str(budget))
    frame_ends = {r.recording_id: {e for _, e in r.frames} | {0} for r in recs}
    for r in recs:  # a PAD's end (a term boundary) is a frame boundary too
        frame_ends[r.recording_id] |= set(range(0, r.position + 1, TERM))
    start = reader.initialOffset()
    rows: list[tuple[int, int]] = []
    triggers = 0
    while (end := reader.latestOffset(start, ReadMaxBytes(budget))) != start:
        triggers += 1
        moved = {k: end[k] - start[k] for k in end}
        for k in end:
            assert end[k] in frame_ends[int(k)] or end[k] == recs[int(k)].position
        have_data = [k for k in start if start[k] < recs[int(k)].position]
        assert all(moved[k] > 0 for k in have_data), (triggers, moved)  # no recording waits for another
        if len(have_data) == 3 and all(recs[int(k)].position - start[k] > budget for k in have_data):
            assert budget - 3 * dh.DEFAULT_MTU_LENGTH <= sum(moved.values()) <= budget
        rows += micro_batch(reader, start, end)
        start = end
    assert sorted(rows) == sorted(p for r in recs for p in positions(r))
    assert triggers >= sum(r.position for r in recs) // budget


def test_a_row_budget_is_shared_by_every_recording_each_trigger_and_exact(
    three: tuple[pathlib.Path, list[SyntheticRecording]], tmp_path: pathlib.Path
) -> None:
    archive, recs = three
    reader = stream_reader(archive, maxRecordsPerTrigger="60")
    batches = drain(reader, reader.initialOffset(), ReadMaxRows(60))
    assert [len(b) for b in batches] == [60] * 7 + [30]
    for batch in batches[:7]:
        per_recording = [sum(1 for rid, _ in batch if rid == r.recording_id) for r in recs]
        assert per_recording == [20, 20, 20]
    assert sorted(r for b in batches for r in b) == sorted(p for r in recs for p in positions(r))


# -- column pruning by schema, minPartitions ---------------------------------------------------------------
def test_a_schema_without_payload_reads_no_payload_bytes(
    three: tuple[pathlib.Path, list[SyntheticRecording]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    from logbuf.archive import spark_frames
    from logbuf.archive.spark import LogbufDataSource

    archive, recs = three
    source = LogbufDataSource({"path": str(archive)})
    narrow = StructType([StructField("recording_id", LongType()), StructField("position", LongType())])

    def no_gather(*args: object) -> None:
        raise AssertionError("payload bytes were gathered")

    monkeypatch.setattr(spark_frames, "_gather", no_gather)
    reader = source.reader(narrow)
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    assert {tuple(b.schema.names) for b in batches} == {("recording_id", "position")}
    got = [row for b in batches for row in zip(b.column(0).to_pylist(), b.column(1).to_pylist())]
    assert sorted(got) == sorted(p for r in recs for p in positions(r))
    with pytest.raises(AssertionError, match="gathered"):
        full = source.reader(source.schema())
        [b for p in full.partitions() for b in full.read(p)]
    swapped = StructType([StructField("position", LongType()), StructField("recording_id", LongType())])
    with pytest.raises(LogbufSourceError, match="may leave columns out but not rename, retype or reorder them"):
        source.reader(swapped)


def test_min_partitions_splits_segments_at_term_boundaries_and_every_row_comes_once(
    long_recording: tuple[pathlib.Path, SyntheticRecording],
) -> None:
    archive, rec = long_recording
    plain = reader_for(archive, maxPartitionBytes="0").partitions()
    split = reader_for(archive, minPartitions=str(2 * len(plain))).partitions()
    assert len(split) == -(-rec.position // TERM) > len(plain)  # one 64 KiB term each
    assert all(p.parse_stop - p.parse_start <= TERM for p in split)  # type: ignore[attr-defined]
    assert len(reader_for(archive, minPartitions="1000").partitions()) == len(split)  # a term is the least
    table = read_all(reader_for(archive, minPartitions="7"))
    assert len(reader_for(archive, minPartitions="7").partitions()) >= 7
    assert table.column("position").to_pylist() == [p for _, p in positions(rec)]


def test_small_segments_are_packed_into_few_partitions_and_every_row_comes_once(
    long_recording: tuple[pathlib.Path, SyntheticRecording],
) -> None:
    archive, rec = long_recording
    one_each = reader_for(archive, maxPartitionBytes="0").partitions()
    assert len(one_each) > 2 and all(isinstance(p, SegmentPartition) for p in one_each)
    packed = reader_for(archive).partitions()  # the default packs up to 64 MiB: one task reads them all
    assert len(packed) == 1 and isinstance(packed[0], PackedPartition) and list(packed[0].pieces) == one_each
    pairs = reader_for(archive, maxPartitionBytes=str(4 * TERM)).partitions()  # two 128 KiB segments each
    assert len(pairs) == -(-len(one_each) // 2) and planned_segments(pairs) == one_each
    for options in ({}, {"maxPartitionBytes": "0"}, {"maxPartitionBytes": "128k"}):
        table = read_all(reader_for(archive, **options))
        assert table.column("position").to_pylist() == [p for _, p in positions(rec)], options


def test_the_spec_lists_every_option_and_the_append_time_layout() -> None:
    import re

    from logbuf.archive import spark, time_index

    text = (pathlib.Path(__file__).resolve().parents[3] / "protocol_spec" / "spark-source.md").read_text()
    table = text.split("| Option | Default | Meaning |")[1].split("\n\n")[0]
    documented = set(re.findall(r"`(\w+)`", "\n".join(line.split("|")[1] for line in table.splitlines()[2:])))
    assert set(spark._OPTIONS) <= documented
    layout = text.split("## Timestamps: the recorder's append time")[1]
    assert f"`{time_index.APPEND_MAGIC:#010X}`".replace("0X", "0x") in layout
    assert f"| version (int32) | {time_index.APPEND_VERSION} |" in layout
    assert f"| entry length (int32) | {time_index.APPEND_ENTRY_LENGTH} |" in layout
    assert f"| header length (int32) | {time_index.HEADER_LENGTH} |" in layout


def test_a_stream_that_read_nothing_yet_still_fails_when_its_start_is_removed(
    long_recording: tuple[pathlib.Path, SyntheticRecording],
) -> None:
    archive, rec = long_recording
    reader = stream_reader(archive)
    start = reader.initialOffset()
    assert start == {"0": 0}
    with Catalog.open_writable(archive) as catalog:
        purge_segments(catalog, 0, before_position=rec.segment_length)
    with pytest.raises(LogbufSourceError, match=f"positions 0 to {rec.segment_length}"):
        reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
