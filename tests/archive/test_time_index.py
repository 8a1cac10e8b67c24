"""The time index (``<recordingId>.times``): bounds per segment, the file's rules, the offline builder, and the
recorder writing it as segments complete."""

from __future__ import annotations

import collections
import os
import pathlib

import pytest

from logbuf.archive import time_index as ti
from logbuf.archive.catalog import Catalog
from logbuf.archive.segments import segment_files
from logbuf.archive.spark_frames import TIMESTAMP_UNITS_US
from logbuf.client import Aeron, Context
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess
from tests.archive.conftest import RecorderProcess, archive_cli, publish
from tests.archive.test_spark.synthetic import SyntheticRecording, build_archive, recording
from tests.test_protocol_spec import tables

US = TIMESTAMP_UNITS_US["us"]
SPARK_RANGE = (-62_135_596_800_000_000, 253_402_300_799_999_999)


def expected_bounds(rec: SyntheticRecording) -> dict[int, tuple[int, int, int]]:
    """(stamped frames, least, greatest reserved value) per segment base, from the frames as written."""
    by_segment: dict[int, list[int]] = collections.defaultdict(list)
    messages = iter(rec.messages)
    _payload, reserved, end = next(messages)
    for start, frame_end in rec.frames:  # a message's frames share its reserved value
        while frame_end > end:
            _payload, reserved, end = next(messages)
        if reserved:
            by_segment[start - start % rec.segment_length].append(reserved)
    return {base: (len(v), min(v), max(v)) for base, v in by_segment.items()}


def test_built_index_bounds_each_segment_and_building_again_adds_nothing(tmp_path: pathlib.Path) -> None:
    rec = recording(0, 10, 600, seed=3)
    rec.offer(b"unstamped", reserved=0)  # 0 is a null timestamp: not counted
    build_archive(tmp_path, [rec])
    for segment in tmp_path.glob("*.rec"):
        segment.chmod(0o640)  # a group-shared archive: the index gets the segments' mode
    with Catalog.open(tmp_path) as catalog:
        d = catalog.recording(0)
    added = ti.build_index(tmp_path, d)
    assert len(added) == len(segment_files(tmp_path, 0)) >= 4
    entries = ti.read_index_file(tmp_path / "0.times", 0)
    assert {b: (t.stamped_frames, t.min_reserved, t.max_reserved) for b, t in entries.items()} == expected_bounds(rec)
    assert ti.build_index(tmp_path, d) == []
    assert ti.read_index_file(tmp_path / "0.times", 0) == entries
    assert (tmp_path / "0.times").stat().st_mode & 0o777 == 0o640


def test_a_recording_whose_frames_do_not_verify_is_not_indexed(tmp_path: pathlib.Path) -> None:
    rec = recording(0, 10, 300, seed=4)
    build_archive(tmp_path, [rec])
    victim = rec.frames[120][0]
    path = tmp_path / f"0-{victim - victim % rec.segment_length}.rec"
    data = bytearray(path.read_bytes())
    data[victim % rec.segment_length + 8] ^= 0xFF  # its term offset field
    path.write_bytes(bytes(data))
    with Catalog.open(tmp_path) as catalog:
        assert ti.build_index(tmp_path, catalog.recording(0)) == []
    assert not (tmp_path / "0.times").exists()


def test_index_file_rules_torn_entry_duplicates_and_foreign_files(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "7.times"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        ti.append_entry(fd, 7, ti.SegmentTimes(0, 3, 10, 20))
        os.pwrite(fd, b"\x01" * 11, os.fstat(fd).st_size)  # a torn entry, as a crash mid-write leaves it
        assert ti.read_index_file(path, 7) == {0: ti.SegmentTimes(0, 3, 10, 20)}
        ti.append_entry(fd, 7, ti.SegmentTimes(0, 2, 5, 12))  # written over the torn one
        ti.append_entry(fd, 7, ti.SegmentTimes(65536, 0, 0, 0))
    finally:
        os.close(fd)
    assert os.path.getsize(path) == ti.HEADER_LENGTH + 3 * ti.ENTRY_LENGTH
    assert ti.read_index_file(path, 7) == {0: ti.SegmentTimes(0, 5, 5, 20), 65536: ti.SegmentTimes(65536, 0, 0, 0)}
    with pytest.raises(ti.TimeIndexError, match="holds recording 7, not 8"):
        ti.read_index_file(path, 8)
    path.write_bytes(b"LBAC" + path.read_bytes()[4:])
    with pytest.raises(ti.TimeIndexError, match=r"7\.times: magic 0x4341424c is not 0x4954424c"):
        ti.read_index_file(path, 7)
    assert ti.read_index_file(tmp_path / "nothing.times", 1) == {}


@pytest.mark.parametrize(
    ("low", "high", "values", "expected"),
    [
        (None, None, None, True),
        (100, None, None, True),  # overlaps at the top
        (201, None, None, False),
        (None, 99, None, False),
        (None, 100, None, True),
        (150, 160, None, True),
        (None, None, frozenset({50, 250}), False),  # IN, values outside
        (None, None, frozenset({50, 150}), True),
    ],
)
def test_segment_may_match_compares_the_bounds_in_microseconds(
    low: int | None, high: int | None, values: frozenset[int] | None, expected: bool
) -> None:
    times = ti.SegmentTimes(0, 5, 100, 200)
    assert ti.segment_may_match(times, low, high, values, US, SPARK_RANGE) is expected
    assert ti.segment_may_match(None, 201, None, None, US, SPARK_RANGE)  # no entry: read it
    assert not ti.segment_may_match(ti.SegmentTimes(0, 0, 0, 0), None, None, None, US, SPARK_RANGE)  # nulls only
    seconds = ti.SegmentTimes(0, 1, 1_700_000_000_000_000, 1_700_000_000_000_000)  # µs read as s: out of range
    assert ti.segment_may_match(seconds, None, 0, None, TIMESTAMP_UNITS_US["s"], SPARK_RANGE)


def test_recorder_appends_an_entry_per_completed_segment(archive_driver: DriverProcess, tmp_path: pathlib.Path) -> None:
    archive = str(tmp_path / "archive")
    recorder = RecorderProcess(archive, archive_driver.dir, "aeron:ipc", 31).start()
    try:
        with Aeron.connect(Context(dir=archive_driver.dir)) as aeron:
            pub = aeron.add_publication("aeron:ipc", 31)
            wait_until(lambda: pub.is_connected, 20, "the recorder to subscribe")
            reserved, ends = publish(pub, [bytes(range(256)) * 4] * 1200)
            session_id = pub.session_id

            def recorded() -> bool:
                if not os.path.exists(os.path.join(archive, "archive.catalog")):
                    return False
                with Catalog.open(archive) as catalog:
                    return any(d.session_id == session_id and d.stop_position >= ends[-1] for d in catalog.recordings())

            wait_until(recorded, 20, "the messages to be recorded")
            middle = ti.read_index_file(os.path.join(archive, "0.times"), 0)
            pub.close()
    finally:
        assert recorder.stop() == 0, recorder.output()
    with Catalog.open(archive) as catalog:
        d = catalog.recording(0)
    bases = [base for base, _ in segment_files(archive, 0)]
    assert len(bases) >= 8
    assert set(middle) <= set(bases[:-1])  # while recording: completed segments only
    entries = ti.read_index_file(os.path.join(archive, "0.times"), 0)
    assert sorted(entries) == bases  # stopped: the last one too
    segment = d.segment_length
    for base, times in entries.items():
        stamps = [r for r, end in zip(reserved, ends, strict=True) if base < end <= base + segment]
        assert (times.stamped_frames, times.min_reserved, times.max_reserved) == (
            len(stamps),
            min(stamps),
            max(stamps),
        )
    # The CLI builds nothing more for a recording the recorder indexed.
    assert archive_cli(archive, "index") == 0
    assert ti.read_index_file(os.path.join(archive, "0.times"), 0) == entries


def test_protocol_spec_time_index_table_matches_the_descriptor() -> None:
    text = (pathlib.Path(__file__).resolve().parents[2] / "protocol_spec" / "archive.md").read_text(encoding="utf-8")
    checked = set()
    for header, body in tables(text):
        if "time index constant" not in header:
            continue
        offset_col, constant_col = header.index("offset"), header.index("time index constant")
        for _, cells in body:
            name = cells[constant_col].strip("`")
            assert getattr(ti, name) == int(cells[offset_col]), name
            checked.add(name)
    assert checked == {name for name in vars(ti) if name.endswith("_OFFSET")}
    assert ti.HEADER.size == ti.HEADER_LENGTH and ti.ENTRY.size == ti.ENTRY_LENGTH == ti.MAX_RESERVED_OFFSET + 8


def record_until_stopped(recorder: RecorderProcess, count: int) -> list[int]:
    """Start ``recorder``, publish ``count`` messages of 1000 B on its stream, close the publication, wait
    for the recording to stop and stop the recorder (status 0); returns the messages' end positions."""
    archive = pathlib.Path(recorder.archive_dir)
    recorder.start()
    try:
        with Aeron.connect(Context(dir=recorder.driver_dir)) as aeron:
            pub = aeron.add_publication(recorder.channel, recorder.stream_id)
            wait_until(lambda: pub.is_connected, 20, "the recorder to subscribe")
            _, ends = publish(pub, [bytes(1000)] * count)
            pub.close()

            def stopped() -> bool:
                if not (archive / "archive.catalog").exists():
                    return False
                with Catalog.open(archive) as catalog:
                    return any(not d.active and d.stop_position >= ends[-1] for d in catalog.recordings())

            wait_until(stopped, 20, "the recording to stop")
    finally:
        assert recorder.stop() == 0, recorder.output()
    return ends


def test_a_time_index_the_recorder_cannot_write_costs_pruning_not_the_recording(
    archive_driver: DriverProcess, tmp_path: pathlib.Path
) -> None:
    archive = tmp_path / "archive"
    (archive / "0.times").mkdir(parents=True)  # in the way: every append fails
    recorder = RecorderProcess(str(archive), archive_driver.dir, "aeron:ipc", 32)
    ends = record_until_stopped(recorder, 400)  # ~3 segments of 128 KiB
    with Catalog.open(archive) as catalog:
        d = catalog.recording(0)
    assert not d.interrupted and d.stop_position == ends[-1]
    assert recorder.output().count("recording.index_failed") == len(segment_files(archive, 0)) >= 3
    assert archive_cli(archive, "verify") == 0


def test_record_no_time_index_writes_none(archive_driver: DriverProcess, tmp_path: pathlib.Path) -> None:
    archive = tmp_path / "archive"
    recorder = RecorderProcess(str(archive), archive_driver.dir, "aeron:ipc", 33, ["--no-time-index"])
    record_until_stopped(recorder, 300)
    assert len(segment_files(archive, 0)) >= 2 and not (archive / "0.times").exists()
