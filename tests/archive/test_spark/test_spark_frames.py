"""The data source's reading path without Spark: planning, the vectorised parser, corrupt frames.

Synthetic segments (``synthetic.py``) place fake headers and bad bytes at known positions; the
recorded-archive tests check the same path against a real driver and recorder.
"""

from __future__ import annotations

import pathlib
import random
import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from logbuf.archive.catalog import RecordingDescriptor
from logbuf.archive.spark import LogbufSourceError, ReadOptions, plan_partitions, read_partition
from logbuf.archive.spark_frames import Mode, arrow_schema, parse_chunk
from logbuf.logbuffer import data_header_descriptor as dh
from tests.archive.test_spark.conftest import RecordedArchive
from tests.archive.test_spark.synthetic import MTU, TERM, SyntheticRecording


def read_table(
    archive_dir: str | pathlib.Path,
    d: RecordingDescriptor,
    *,
    start: int = -1,
    stop: int = (1 << 63) - 1,
    frame_start: bool = False,
    **options: str,
) -> pa.Table:
    o = ReadOptions.parse({"path": str(archive_dir), **options})
    batches = [
        b for p in plan_partitions(o, d, start, stop, from_is_frame_start=frame_start) for b in read_partition(p, o)
    ]
    return pa.Table.from_batches(batches, schema=arrow_schema(o.corrupt_column_or_none))


def synthetic(seed: int, count: int, start_position: int = 0) -> SyntheticRecording:
    rec = SyntheticRecording(start_position=start_position)
    rng = random.Random(seed)
    for i in range(count):
        size = rng.choice((0, 1, 31, MTU - 32, MTU - 31, 3000, rng.randrange(8000)))
        rec.offer(rng.randbytes(size), reserved=1_700_000_000_000_000 + i)
    return rec


def test_recorded_archive_reads_back_every_message_whole(recorded: RecordedArchive) -> None:
    d, published = recorded.recording, recorded.published
    table = read_table(recorded.archive_dir, d)
    assert table.column("payload").to_pylist() == published.payloads
    assert table.column("position").to_pylist() == published.end_positions
    assert table.column("reserved_value").to_pylist() == published.reserved
    assert set(table.column("flags").to_pylist()) == {dh.UNFRAGMENTED}
    assert set(table.column("session_id").to_pylist()) == {published.session_id}
    assert table.column("_corrupt_record").null_count == len(table)
    assert sum(len(p) > MTU - 32 for p in published.payloads) > 500  # fragmented ones were there


def test_recorded_archive_per_frame_rows_are_the_fragments(recorded: RecordedArchive) -> None:
    d, published = recorded.recording, recorded.published
    table = read_table(recorded.archive_dir, d, rowsPer="frame")
    max_payload = MTU - dh.HEADER_LENGTH
    expected = [p[i : i + max_payload] for p in published.payloads for i in range(0, max(1, len(p)), max_payload)]
    assert table.column("payload").to_pylist() == expected
    flags = table.column("flags").to_pylist()
    assert (
        flags.count(dh.BEGIN_FLAG) == flags.count(dh.END_FLAG) == sum(len(p) > max_payload for p in published.payloads)
    )
    positions = table.column("position").to_pylist()
    assert positions == sorted(positions) and positions[-1] == d.stop_position


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(0, 300), start_terms=st.integers(0, 3))
def test_synthetic_recordings_parse_to_what_was_offered(
    tmp_path_factory: pytest.TempPathFactory, seed: int, count: int, start_terms: int
) -> None:
    rec = SyntheticRecording(start_position=start_terms * TERM + 32 * 4 * (seed % 3))
    rng = random.Random(seed)
    for i in range(count):
        rec.offer(rng.randbytes(rng.choice((0, 5, MTU - 32, MTU, 4000, rng.randrange(8000)))), reserved=i + 1)
    directory = tmp_path_factory.mktemp("synthetic")
    rec.write_segments(directory)
    table = read_table(directory, rec.descriptor(), timestampFrom="reserved_value", timestampUnit="ms")
    assert table.column("payload").to_pylist() == [m[0] for m in rec.messages]
    assert table.column("position").to_pylist() == [m[2] for m in rec.messages]
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert stamps == [m[1] * 1000 for m in rec.messages]
    frames = read_table(directory, rec.descriptor(), rowsPer="frame")
    assert frames.column("position").to_pylist() == [end for _, end in rec.frames]
    assert frames.column("term_offset").to_pylist() == [start % TERM for start, _ in rec.frames]


def test_header_lookalike_inside_a_payload_is_not_taken_for_a_frame(tmp_path: pathlib.Path) -> None:
    rec = synthetic(1, 20)
    # A payload whose first 32 bytes are a valid header for exactly where they land in the term.
    where = rec.position + dh.HEADER_LENGTH
    fake = rec.header(where, 64, dh.UNFRAGMENTED, dh.HDR_TYPE_DATA, 5)
    rec.offer(fake + bytes(500), reserved=9)
    rec.offer(b"after", reserved=10)
    rec.write_segments(tmp_path)
    ints = np.frombuffer(rec.segment(0), dtype="<i4").reshape(-1, 8)
    assert ints[where // 32, 2] == where % TERM  # it is a candidate the fast path would take
    table = read_table(tmp_path, rec.descriptor())
    assert table.column("payload").to_pylist() == [m[0] for m in rec.messages]


CORRUPTIONS = [
    # (field offset in the header, value packed as <i or <B, reason fragment)
    (dh.FRAME_LENGTH_FIELD_OFFSET, 0, "no frame here (frame length 0)"),
    (dh.FRAME_LENGTH_FIELD_OFFSET, 20, "shorter than the 32-byte header"),
    (dh.FRAME_LENGTH_FIELD_OFFSET, 5000, "exceeds the recording's MTU 1408"),
    (dh.VERSION_FIELD_OFFSET, 3, "frame version 3 is not 0"),
    (dh.TERM_OFFSET_FIELD_OFFSET, 8, "term offset field 8 does not match the position"),
    (dh.TERM_ID_FIELD_OFFSET, 5, "term id field 5 does not match the position"),
    (dh.SESSION_ID_FIELD_OFFSET, 1, "session id 1 is not the recording's 77"),
]


@pytest.mark.parametrize(("field_offset", "value", "reason"), CORRUPTIONS, ids=[c[2][:24] for c in CORRUPTIONS])
def test_corrupt_frame_is_named_and_reading_resumes_at_the_next_term(
    tmp_path: pathlib.Path, field_offset: int, value: int, reason: str
) -> None:
    rec = synthetic(2, 300)  # about 7 terms
    victim = next(i for i, (start, _) in enumerate(rec.frames) if start > TERM + 5000)
    bad_position = rec.frames[victim][0]
    if field_offset == dh.VERSION_FIELD_OFFSET:
        rec.data[bad_position + field_offset] = value
    else:
        rec.data[bad_position + field_offset : bad_position + field_offset + 4] = value.to_bytes(
            4, "little", signed=True
        )
    rec.write_segments(tmp_path)
    d = rec.descriptor()
    term_end = bad_position - bad_position % TERM + TERM
    expected = [m for m in rec.messages if m[2] <= bad_position or m[2] > term_end]

    permissive = read_table(tmp_path, d)
    corrupt = permissive.filter(permissive.column("_corrupt_record").is_valid())
    assert corrupt.num_rows == 1
    row = corrupt.to_pylist()[0]
    assert row["position"] == bad_position and row["term_offset"] == bad_position % TERM
    assert reason in row["_corrupt_record"] and f"skipped to position {term_end}" in row["_corrupt_record"]
    assert row["payload"] is None and row["flags"] is None and row["session_id"] == rec.session_id
    good = permissive.filter(permissive.column("_corrupt_record").is_null())
    assert good.column("position").to_pylist() == [m[2] for m in expected]
    assert good.column("payload").to_pylist() == [m[0] for m in expected]

    with capture_logs() as logs:
        dropped = read_table(tmp_path, d, mode="DROPMALFORMED")
    assert [(e["event"], e["position"]) for e in logs] == [("frames.malformed_dropped", bad_position)]
    assert "_corrupt_record" not in dropped.column_names
    assert dropped.column("position").to_pylist() == [m[2] for m in expected]

    with pytest.raises(LogbufSourceError, match=f"FAILFAST.*{re.escape(reason)}.*position {bad_position}"):
        read_table(tmp_path, d, mode="failfast")


def test_truncated_segment_file_is_reported_where_the_file_ends(tmp_path: pathlib.Path) -> None:
    rec = synthetic(3, 200)
    paths = rec.write_segments(tmp_path)
    cut = next(start for start, end in rec.frames if start > 90_000 and end - start > 200) + 100  # inside a frame
    assert cut < rec.segment_length
    with open(paths[0], "r+b") as f:
        f.truncate(cut)
    table = read_table(tmp_path, rec.descriptor())
    corrupt = table.filter(table.column("_corrupt_record").is_valid()).to_pylist()
    bad_frame = max(start for start, _ in rec.frames if start < cut)
    assert corrupt[0]["position"] == bad_frame
    assert "truncated" in corrupt[0]["_corrupt_record"]
    good = table.filter(table.column("_corrupt_record").is_null()).column("position").to_pylist()
    assert good == [m[2] for m in rec.messages if m[2] <= bad_frame or m[2] > rec.segment_length]


def test_missing_segment_file_is_one_corrupt_row(tmp_path: pathlib.Path) -> None:
    rec = synthetic(4, 400)
    paths = rec.write_segments(tmp_path)
    assert len(paths) >= 3
    paths[1].unlink()
    table = read_table(tmp_path, rec.descriptor())
    corrupt = table.filter(table.column("_corrupt_record").is_valid()).to_pylist()
    assert len(corrupt) == 1 and "is missing" in corrupt[0]["_corrupt_record"]
    assert corrupt[0]["position"] == rec.segment_length
    good = table.filter(table.column("_corrupt_record").is_null()).column("position").to_pylist()
    assert good == [m[2] for m in rec.messages if not rec.segment_length < m[2] <= 2 * rec.segment_length]


def test_position_range_selects_rows_by_end_position_and_completes_cut_messages(tmp_path: pathlib.Path) -> None:
    rec = synthetic(5, 300)
    rec.write_segments(tmp_path)
    d = rec.descriptor()
    fragmented = next(m for m in rec.messages[50:] if len(m[0]) > 3000)
    inside = fragmented[2] - 64  # inside its last fragment: its row's position is > inside
    stop = rec.messages[250][2]
    table = read_table(tmp_path, d, start=inside, stop=stop)
    expected = [m for m in rec.messages if inside < m[2] <= stop]
    assert table.column("payload").to_pylist() == [m[0] for m in expected]
    assert expected[0] is fragmented
    # From a recorded position inside that message (as a streaming offset is), the same.
    first_fragment_end = next(
        end for start, end in rec.frames if start < fragmented[2] and end > fragmented[2] - len(fragmented[0]) - 32
    )
    streamed = read_table(tmp_path, d, start=first_fragment_end, stop=stop, frame_start=True)
    assert streamed.column("payload").to_pylist() == [m[0] for m in rec.messages if first_fragment_end < m[2] <= stop]


def test_parse_chunk_of_an_empty_range_has_no_frames_and_no_corruption() -> None:
    rec = synthetic(6, 3)
    segment = np.frombuffer(rec.segment(0), dtype=np.uint8)
    frames = parse_chunk(segment, 0, 0, 0, rec.descriptor())
    assert len(frames.slot) == 0 and frames.corruption is None
    frames = parse_chunk(segment, 0, 0, rec.position, rec.descriptor())
    assert frames.corruption is None and len(frames.slot) == len(rec.frames)


def test_options_are_validated_naming_the_option() -> None:
    for options, message in [
        ({}, "no archive directory"),
        ({"path": "x", "mode": "LENIENT"}, "mode='LENIENT'"),
        ({"path": "x", "rowsPer": "term"}, "rowsPer='term'"),
        ({"path": "x", "timestampUnit": "h"}, "timestampUnit='h'"),
        ({"path": "x", "startPosition": "ten"}, "startPosition='ten'"),
        ({"path": "x", "startPosition": "10", "stopPosition": "5"}, "stopPosition=5 is before"),
        ({"path": "x", "streamId": "1,x"}, "streamId='1,x'"),
        ({"path": "x", "columnNameOfCorruptRecord": "payload"}, "already a column"),
    ]:
        with pytest.raises(LogbufSourceError, match=message):
            ReadOptions.parse(options)
    o = ReadOptions.parse({"PATH": "x", "MODE": "dropmalformed", "streamid": "1, 2"})
    assert o.mode is Mode.DROPMALFORMED and o.stream_ids == frozenset({1, 2})


def test_arrow_batches_have_the_types_spark_expects_and_the_spec_lists_the_columns() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    for options in (
        {"path": "x"},
        {"path": "x", "mode": "FAILFAST"},
        {"path": "x", "columnNameOfCorruptRecord": "bad"},
    ):
        o = ReadOptions.parse(options)
        assert arrow_schema(o.corrupt_column_or_none).equals(to_arrow_schema(o.schema(), timezone="UTC"))
    spec = (pathlib.Path(__file__).resolve().parents[3] / "protocol_spec" / "spark-source.md").read_text()
    table = spec.split("| Column | Spark type |")[1].split("\n\n")[0]
    documented = re.findall(r"^\| `(\w+)` \| (\w+) \|", table, re.MULTILINE)
    assert [(f.name, f.dataType.simpleString().upper()) for f in ReadOptions.parse({"path": "x"}).schema().fields] == [
        (name, spark_type) for name, spark_type in documented
    ]
