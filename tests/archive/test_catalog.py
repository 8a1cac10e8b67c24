"""The catalog, segment naming and the frame walker, over files written here (no driver)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from logbuf.archive import catalog_descriptor as cat
from logbuf.archive.catalog import Catalog, CatalogError, RecordingState, UnknownRecordingError
from logbuf.archive.segments import (
    SegmentReader,
    check_segment_length,
    segment_base_position,
    segment_file_name,
    segment_files,
)
from logbuf.archive.verify import scan_valid_prefix, verify_recording
from logbuf.logbuffer import data_header_descriptor as dh
from tests.test_protocol_spec import tables

TERM = 64 * 1024
SEGMENT = 128 * 1024
INITIAL_TERM_ID = 100
SESSION, STREAM = 7, 3
START = 64


def add(catalog: Catalog, *, pid: int | None = None, start: int = START, channel: str = "aeron:ipc") -> int:
    return catalog.add_recording(
        channel=channel,
        source_identity="127.0.0.1:4000",
        stream_id=STREAM,
        session_id=SESSION,
        initial_term_id=INITIAL_TERM_ID,
        term_length=TERM,
        mtu=1408,
        segment_length=SEGMENT,
        start_position=start,
        start_time_ms=1_000,
        pid=pid,
    )


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(10)
    return child.pid


def frame(position: int, payload: bytes, *, frame_type: int = dh.HDR_TYPE_DATA, length: int | None = None) -> bytes:
    term_id = INITIAL_TERM_ID + position // TERM
    header = dh.HEADER.pack(
        32 + len(payload) if length is None else length,
        0,
        dh.UNFRAGMENTED,
        frame_type,
        position % TERM,
        SESSION,
        STREAM,
        term_id,
        position,
    )
    return header + payload


def write_recording(archive: pathlib.Path, recording_id: int, count: int) -> list[int]:
    """``count`` 100-byte messages from START, a PAD at the end of the first term; returns each frame's position."""
    positions, position = [], START
    blobs: dict[int, bytearray] = {}
    for i in range(count):
        if position % TERM + 160 > TERM:  # pad the rest of the term (its header only is recorded)
            pad = frame(position, b"", frame_type=dh.HDR_TYPE_PAD, length=TERM - position % TERM)
            _put(blobs, position, pad)
            position += TERM - position % TERM
        positions.append(position)
        _put(blobs, position, frame(position, bytes([i % 256]) * 100))
        position += 160
    for base, blob in blobs.items():
        (archive / segment_file_name(recording_id, base)).write_bytes(bytes(blob))
    return positions + [position]


def _put(blobs: dict[int, bytearray], position: int, data: bytes) -> None:
    base = segment_base_position(START, position, TERM, SEGMENT)
    blob = blobs.setdefault(base, bytearray(SEGMENT))
    blob[position - base : position - base + len(data)] = data


# -- catalog -------------------------------------------------------------------------------------------
def test_descriptor_fields_round_trip_and_readers_see_progress_live(tmp_path: pathlib.Path) -> None:
    with Catalog.open_writable(tmp_path) as writer, Catalog.open(tmp_path) as reader:
        assert reader.recordings() == []
        rid = add(writer)
        assert rid == 0 and add(writer, channel="aeron:ipc?alias=two") == 1
        d = reader.recording(0)
        assert (d.recording_id, d.state, d.active, d.interrupted) == (0, RecordingState.VALID, True, False)
        assert (d.channel, d.source_identity, d.stream_id, d.session_id) == ("aeron:ipc", "127.0.0.1:4000", 3, 7)
        assert (d.initial_term_id, d.term_length, d.mtu, d.segment_length) == (100, TERM, 1408, SEGMENT)
        assert (d.start_position, d.stop_position, d.start_time_ms, d.stop_time_ms) == (64, 64, 1_000, -1)
        writer.position_writer(0).set_position(4096)
        assert reader.recording(0).stop_position == 4096 and reader.recording(0).active
        writer.stop_recording(0, 8192)
        d = reader.recording(0)
        assert not d.active and d.stop_position == 8192 and d.stop_time_ms >= time.time_ns() // 1_000_000 - 60_000
        assert [r.channel for r in reader.recordings()] == ["aeron:ipc", "aeron:ipc?alias=two"]
        assert d.term_id_of(TERM * 3 + 32) == 103


def test_the_catalog_grows_past_its_capacity_and_open_readers_follow(tmp_path: pathlib.Path) -> None:
    with Catalog.open_writable(tmp_path, capacity=cat.HEADER_LENGTH + 2 * cat.ENTRY_LENGTH) as writer:
        reader = Catalog.open(tmp_path)
        ids = [add(writer) for _ in range(5)]
        assert ids == [0, 1, 2, 3, 4]
        assert os.path.getsize(tmp_path / cat.CATALOG_FILE_NAME) >= cat.entry_offset(5)
        assert [d.recording_id for d in reader.recordings()] == ids
        assert reader.recording(4).session_id == SESSION
        reader.close()


def test_catalog_errors_name_the_problem(tmp_path: pathlib.Path) -> None:
    with pytest.raises(CatalogError, match=re.escape(f"no archive catalog at {tmp_path / 'archive.catalog'}")):
        Catalog.open(tmp_path)
    with Catalog.open_writable(tmp_path) as writer:
        add(writer)
        with pytest.raises(ValueError, match="channel is 600 bytes long; the catalog holds at most 576"):
            add(writer, channel="x" * 600)
        with pytest.raises(CatalogError, match="start_position=33 must be a non-negative multiple of 32"):
            add(writer, start=33)
    with Catalog.open(tmp_path) as reader:
        with pytest.raises(UnknownRecordingError, match=r"no recording 7 in .* \(recording ids are 0..0\)"):
            reader.recording(7)
        with pytest.raises(CatalogError, match="opened read-only"):
            reader.stop_recording(0, 64)
    other = tmp_path / "other"
    other.mkdir()
    (other / cat.CATALOG_FILE_NAME).write_bytes(b"\x00" * 2048)
    with pytest.raises(CatalogError, match="magic 0x0 is not 0x4341424c"):
        Catalog.open(other)


def test_a_dead_recorder_is_reported_interrupted_and_recovery_keeps_the_valid_prefix(tmp_path: pathlib.Path) -> None:
    ends = write_recording(tmp_path, 0, 700)  # ~110 KB: two terms, a PAD between them
    assert ends[-1] > TERM
    # A block cut short by the crash: its frames are there but its first frame's length is not.
    base = segment_base_position(START, ends[-1], TERM, SEGMENT)
    with open(tmp_path / segment_file_name(0, base), "r+b") as f:
        f.seek(ends[-1] - base)
        f.write(frame(ends[-1], b"z" * 100)[4:].rjust(132, b"\x00"))
    with Catalog.open_writable(tmp_path) as writer:
        add(writer, pid=dead_pid())
        writer.position_writer(0).set_position(ends[5])
        alive = add(writer)  # this process: alive and heartbeating
        stale = add(writer)  # this process, but its heartbeat stopped long ago
        writer.position_writer(stale).heartbeat(time.time_ns() // 1_000_000 - cat.RECORDER_TIMEOUT_MS - 1_000)
    with Catalog.open(tmp_path) as reader:
        d = reader.recording(0)
        assert d.interrupted and not d.active and d.stop_position == ends[5] and d.stop_time_ms > 0
        assert reader.recording(alive).active and not reader.recording(alive).interrupted
        assert reader.recording(stale).interrupted
    assert scan_valid_prefix(tmp_path, d, ends[5]) == ends[-1]
    with Catalog.open_writable(tmp_path) as writer:  # recovery on open
        d = writer.recording(0)
        assert d.interrupted and d.stop_position == ends[-1]
        assert writer.raw_entry(0)[0] == cat.FLAG_INTERRUPTED
        assert writer.recording(alive).active
    result = verify_recording(tmp_path, d)
    assert result.ok and result.frames == 700 + 1 and result.end_position == ends[-1], result


# -- segments --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "start, position, term, segment, expected",
    [
        (0, 0, TERM, SEGMENT, 0),
        (0, SEGMENT - 32, TERM, SEGMENT, 0),
        (0, SEGMENT, TERM, SEGMENT, SEGMENT),
        (TERM + 4096, TERM + 4096, TERM, SEGMENT, TERM),  # the grid starts at the start's term
        (TERM + 4096, TERM + SEGMENT, TERM, SEGMENT, TERM + SEGMENT),
        (TERM + 4096, TERM + SEGMENT - 32, TERM, SEGMENT, TERM),
        (5 * TERM, 9 * TERM, TERM, TERM, 9 * TERM),
    ],
)
def test_segment_base_position_follows_aerons_grid(
    start: int, position: int, term: int, segment: int, expected: int
) -> None:
    assert segment_base_position(start, position, term, segment) == expected


def test_segment_files_are_found_by_name_and_sorted(tmp_path: pathlib.Path) -> None:
    for name in ("3-262144.rec", "3-0.rec", "3-131072.rec", "31-0.rec", "3-x.rec", "3-0.rec.tmp"):
        (tmp_path / name).write_bytes(b"")
    assert [(b, p.name) for b, p in segment_files(tmp_path, 3)] == [
        (0, "3-0.rec"),
        (131072, "3-131072.rec"),
        (262144, "3-262144.rec"),
    ]
    assert segment_file_name(3, 131072) == "3-131072.rec"
    with pytest.raises(ValueError, match="segment_length=100000 must be a power of two"):
        check_segment_length(100_000)
    with pytest.raises(ValueError, match=re.escape(f"segment file {tmp_path / '9-0.rec'} is missing")):
        SegmentReader(tmp_path, 9, 0, TERM, SEGMENT).term_view(0)


# -- verify ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field_offset, value, reason",
    [
        (dh.TERM_OFFSET_FIELD_OFFSET, 96, "term offset field 96 does not match"),
        (dh.SESSION_ID_FIELD_OFFSET, 8, "session id 8 is not the recording's 7"),
        (dh.STREAM_ID_FIELD_OFFSET, 4, "stream id 4 is not the recording's 3"),
        (dh.FRAME_LENGTH_FIELD_OFFSET, 5000, "frame length 5000 exceeds the recording's MTU 1408"),
        (dh.FRAME_LENGTH_FIELD_OFFSET, 0, "no frame here"),
        (dh.FRAME_LENGTH_FIELD_OFFSET, 20, "frame length 20 is shorter than the 32-byte header"),
        (dh.TYPE_FIELD_OFFSET, 7, "frame type 0x7 is neither DATA"),
    ],
)
def test_verify_names_the_first_bad_frame(tmp_path: pathlib.Path, field_offset: int, value: int, reason: str) -> None:
    ends = write_recording(tmp_path, 0, 300)
    with Catalog.open_writable(tmp_path) as writer:
        add(writer)
        writer.stop_recording(0, ends[-1])
        d = writer.recording(0)
    assert verify_recording(tmp_path, d).ok
    victim = ends[123]
    with open(tmp_path / segment_file_name(0, 0), "r+b") as f:
        f.seek(victim + field_offset)
        f.write(value.to_bytes(2 if field_offset == dh.TYPE_FIELD_OFFSET else 4, "little"))
    result = verify_recording(tmp_path, d)
    assert not result.ok and result.end_position == victim and result.frames == 123, result
    assert result.reason is not None and reason in result.reason


def test_verify_reports_a_stop_position_inside_a_frame(tmp_path: pathlib.Path) -> None:
    ends = write_recording(tmp_path, 0, 50)
    with Catalog.open_writable(tmp_path) as writer:
        add(writer)
        writer.stop_recording(0, ends[10] + 64)
        d = writer.recording(0)
    result = verify_recording(tmp_path, d)
    assert (result.ok, result.end_position) == (False, ends[10])
    assert result.reason == "frame length 132 runs past the recorded stop position"


@pytest.mark.parametrize(
    "frame_type, frame_length, reason",
    [
        (dh.HDR_TYPE_DATA, 0x7FFFFFFF, "frame length 2147483647 exceeds the recording's MTU 1408"),
        (dh.HDR_TYPE_DATA, 0x7FFFFFE1, "frame length 2147483617 exceeds the recording's MTU 1408"),
        (dh.HDR_TYPE_PAD, 0x7FFFFFFF, "frame length 2147483647 runs past the end of the term"),
        (dh.HDR_TYPE_PAD, TERM + 32, f"frame length {TERM + 32} runs past the end of the term"),
        (dh.HDR_TYPE_DATA, -1, "no frame here (frame length -1)"),
    ],
)
def test_verify_reports_a_hostile_frame_length_instead_of_crashing(
    tmp_path: pathlib.Path, frame_type: int, frame_length: int, reason: str
) -> None:
    """Issue 14 item 12: a frame length of 0x7fffffff overflowed the native block scanner (rc 139)."""
    ends = write_recording(tmp_path, 0, 300)
    with Catalog.open_writable(tmp_path) as writer:
        add(writer)
        writer.stop_recording(0, ends[-1])
    victim = ends[123]
    with open(tmp_path / segment_file_name(0, 0), "r+b") as f:
        f.seek(victim)
        f.write(frame_length.to_bytes(4, "little", signed=True))
        f.seek(victim + dh.TYPE_FIELD_OFFSET)
        f.write(frame_type.to_bytes(2, "little"))
    verify = [sys.executable, "-m", "logbuf.archive.main", "-d", str(tmp_path), "--log-level", "warning", "verify", "0"]
    done = subprocess.run(verify, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)  # a crash would be -11 (rc 139)
    assert f"recording 0: BAD at position {victim}: {reason}" in done.stdout, done.stdout


# -- spec ----------------------------------------------------------------------------------------------------
def test_protocol_spec_archive_tables_match_the_catalog_descriptor() -> None:
    text = (pathlib.Path(__file__).resolve().parents[2] / "protocol_spec" / "archive.md").read_text(encoding="utf-8")
    checked = set()
    for header, body in tables(text):
        if "archive constant" not in header:
            continue
        number_col = header.index("offset") if "offset" in header else header.index("value")
        constant_col = header.index("archive constant")
        for _, cells in body:
            if not cells[constant_col]:
                continue
            name = cells[constant_col].strip("`").removeprefix("catalog_descriptor.")
            assert getattr(cat, name) == int(cells[number_col], 0), f"{cells[0]}: {name}"
            checked.add(name)
    offsets = {name for name in vars(cat) if name.endswith("_OFFSET") and name != "NEXT_RECORDING_ID_OFFSET"}
    assert offsets | {"NEXT_RECORDING_ID_OFFSET", "HEADER_LENGTH", "ENTRY_LENGTH"} <= checked
