"""The default ``timestamp``: when the recorder appended each frame (the append-time index), not the frames."""

from __future__ import annotations

import datetime
import os
import pathlib

import numpy as np
import pyarrow.compute as pc
import pytest
from pyspark.sql.datasource import GreaterThanOrEqual, LessThan
from structlog.testing import capture_logs

from logbuf.archive.segments import segment_file_name
from logbuf.archive.time_index import (
    APPEND_RESOLUTION_US,
    AppendTimesWriter,
    append_times_file_name,
    decode_append_times,
)
from tests.archive.test_spark.conftest import RecordedArchive
from tests.archive.test_spark.synthetic import build_archive, recording
from tests.archive.test_spark.test_spark_planning import read_all, reader_for

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _at(us: int) -> datetime.datetime:
    return EPOCH + datetime.timedelta(microseconds=us)


def test_append_time_entries_are_a_millisecond_apart_never_go_back_and_cover_rows(tmp_path: pathlib.Path) -> None:
    path = tmp_path / append_times_file_name(3)
    writer = AppendTimesWriter(path, 3, 0o644)
    t = 1_764_000_000_000_000
    for position, now in [(0, t), (64, t + 10), (128, t + APPEND_RESOLUTION_US), (4096, t + 500), (8192, t + 5000)]:
        writer.on_block(position, now)
    writer.close()
    times = decode_append_times(path.read_bytes(), 3)
    # 64: within a millisecond of the last entry; 4096: the clock went back, the run goes on.
    assert times.position.tolist() == [0, 128, 8192]
    assert times.time_us.tolist() == [t, t + 1000, t + 5000]
    micros, known = times.of_rows(np.array([64, 128, 160, 4096, 9000], np.int64))
    assert micros.tolist() == [t, t, t + 1000, t + 1000, t + 5000]
    assert known.all()
    assert times.first_position_at_or_after(t + 1) == 128
    assert times.first_position_at_or_after(t + 6000) is None
    with pytest.raises(ValueError, match="holds recording 3, not 4"):
        decode_append_times(path.read_bytes(), 4)
    torn = path.read_bytes()[:-5]
    assert decode_append_times(torn, 3).position.tolist() == [0, 128]


def test_a_recorded_archive_reads_with_the_recorders_append_time_by_default(recorded: RecordedArchive) -> None:
    d = recorded.recording
    assert os.path.exists(os.path.join(recorded.archive_dir, append_times_file_name(d.recording_id)))
    table = read_all(reader_for(pathlib.Path(recorded.archive_dir)))
    stamps = table.column("timestamp")
    assert stamps.null_count == 0
    micros = pc.cast(stamps, "int64").to_numpy()
    assert (np.diff(micros[np.argsort(table.column("position").to_numpy())]) >= 0).all()
    # the recorder's clock, while it recorded (the publisher stamped the reserved values just before)
    assert d.start_time_ms * 1000 - 1000 <= micros.min() and micros.max() <= d.stop_time_ms * 1000 + 1000
    assert micros.min() >= min(recorded.published.reserved) - 1000
    assert micros.max() >= max(recorded.published.reserved) - 1000


def test_a_time_filter_on_a_default_read_keeps_exactly_its_rows_and_plans_only_their_positions(
    recorded: RecordedArchive,
) -> None:
    archive = pathlib.Path(recorded.archive_dir)
    everything = read_all(reader_for(archive))
    micros = pc.cast(everything.column("timestamp"), "int64").to_numpy()
    low, high = int(np.quantile(micros, 0.3)), int(np.quantile(micros, 0.6))
    reader = reader_for(archive)
    assert (
        list(reader.pushFilters([GreaterThanOrEqual(("timestamp",), _at(low)), LessThan(("timestamp",), _at(high))]))
        == []
    )
    table = read_all(reader)
    expected = sorted(everything.column("position").to_numpy()[(micros >= low) & (micros < high)].tolist())
    assert 0 < len(expected) < everything.num_rows
    assert sorted(table.column("position").to_pylist()) == expected


def test_without_an_append_time_index_timestamps_are_null_and_reserved_values_remain_an_option(
    tmp_path: pathlib.Path,
) -> None:
    rec = recording(0, 10, 50, seed=70)
    build_archive(tmp_path, [rec])
    assert read_all(reader_for(tmp_path)).column("timestamp").null_count == 50
    stamped = read_all(reader_for(tmp_path, timestampFrom="reserved_value"))
    assert pc.cast(stamped.column("timestamp"), "int64").to_pylist() == [m[1] for m in rec.messages]
    with pytest.raises(ValueError, match="timestampFrom='publisher' must be one of append_time, reserved_value, none"):
        reader_for(tmp_path, timestampFrom="publisher")


def test_a_unit_that_puts_recent_data_in_1970_is_a_warning(tmp_path: pathlib.Path) -> None:
    rec = recording(0, 10, 20, seed=71)  # reserved values are epoch microseconds of 2023
    build_archive(tmp_path, [rec])
    assert (tmp_path / segment_file_name(0, 0)).exists()
    with capture_logs() as logs:
        read_all(reader_for(tmp_path, timestampFrom="reserved_value", timestampUnit="ns"))
    warnings = [e for e in logs if e["event"] == "timestamps.implausible"]
    assert len(warnings) == 1 and warnings[0]["timestamp_unit"] == "ns"
    assert warnings[0]["latest"].startswith("1970-01-")
    with capture_logs() as logs:
        read_all(reader_for(tmp_path, timestampFrom="reserved_value", timestampUnit="us"))
    assert not [e for e in logs if e["event"] == "timestamps.implausible"]


def test_starting_and_ending_timestamps_are_positions_in_the_append_time_index(recorded: RecordedArchive) -> None:
    archive = pathlib.Path(recorded.archive_dir)
    everything = read_all(reader_for(archive))
    micros = pc.cast(everything.column("timestamp"), "int64").to_numpy()
    positions = everything.column("position").to_numpy()
    ms = int(np.median(micros)) // 1000
    after = read_all(reader_for(archive, startingTimestamp=str(ms)))
    assert sorted(after.column("position").to_pylist()) == sorted(positions[micros >= ms * 1000].tolist())
    before = read_all(reader_for(archive, endingTimestamp=str(ms)))
    assert sorted(before.column("position").to_pylist()) == sorted(positions[micros < ms * 1000].tolist())
    assert 0 < before.num_rows < everything.num_rows


def test_a_starting_timestamp_without_an_append_time_index_is_an_error_naming_the_recording(
    tmp_path: pathlib.Path,
) -> None:
    build_archive(tmp_path, [recording(0, 10, 5, seed=72)])
    with pytest.raises(ValueError, match="startingTimestamp: recording 0 has no append-time index"):
        reader_for(tmp_path, startingTimestamp="1700000000000").partitions()
