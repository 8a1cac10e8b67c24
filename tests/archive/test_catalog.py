"""The catalog, segment naming and the frame walker, over files written here (no driver)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from logbuf.archive import catalog_descriptor as cat
from logbuf.archive.catalog import Catalog, CatalogError, ChecksumType, RecordingState, UnknownRecordingError
from logbuf.archive.checksum import payload_checksum, stamp_block
from logbuf.archive.segments import (
    SegmentError,
    SegmentReader,
    check_segment_length,
    segment_base_position,
    segment_file_name,
    segment_files,
)
from logbuf.archive.verify import descriptor_problem, scan_valid_prefix, verify_recording
from logbuf.logbuffer import data_header_descriptor as dh
from tests.archive.conftest import archive_cli
from tests.test_protocol_spec import tables

TERM = 64 * 1024
SEGMENT = 128 * 1024
INITIAL_TERM_ID = 100
SESSION, STREAM = 7, 3
START = 64


def add(
    catalog: Catalog,
    *,
    pid: int | None = None,
    start: int = START,
    channel: str = "aeron:ipc",
    checksum: ChecksumType = ChecksumType.NONE,
    term_length: int = TERM,
) -> int:
    return catalog.add_recording(
        channel=channel,
        source_identity="127.0.0.1:4000",
        stream_id=STREAM,
        session_id=SESSION,
        initial_term_id=INITIAL_TERM_ID,
        term_length=term_length,
        mtu=1408,
        segment_length=SEGMENT,
        start_position=start,
        start_time_ms=1_000,
        pid=pid,
        checksum=checksum,
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
        before_ms = time.time_ns() // 1_000_000
        writer.stop_recording(0, 8192)
        after_ms = time.time_ns() // 1_000_000
        d = reader.recording(0)
        assert (
            not d.active and d.stop_position == 8192 and before_ms <= d.stop_time_ms <= after_ms
        )  # stamped at the stop
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


def stopped_archive(archive: pathlib.Path, count: int, recordings: int = 1) -> list[int]:
    """``recordings`` stopped recordings of ``count`` frames each (the same bytes); returns the frame ends."""
    ends = []
    for recording_id in range(recordings):
        ends = write_recording(archive, recording_id, count)
    with Catalog.open_writable(archive) as writer:
        for _ in range(recordings):
            writer.stop_recording(add(writer), ends[-1])
    return ends


def test_an_entry_made_invalid_after_it_was_added_is_reported_by_list_verify_and_recording(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stopped_archive(tmp_path, 20, recordings=3)
    with Catalog.open_writable(tmp_path) as writer:
        writer.set_state(1, RecordingState.INVALID)
    with Catalog.open(tmp_path) as reader:
        assert [d.recording_id for d in reader.recordings()] == [0, 2]
        [problem] = reader.problems()
        assert (problem.first_recording_id, problem.last_recording_id) == (1, 1)
        assert "recording 1: its catalog entry is INVALID (state 0) below the next recording id" in problem.reason
        with pytest.raises(CatalogError, match="recording 1: its catalog entry is INVALID"):
            reader.recording(1)
    capsys.readouterr()
    assert archive_cli(tmp_path, "list") == 1
    out = capsys.readouterr().out
    assert "catalog BAD: recording 1: its catalog entry is INVALID" in out and out.count(" VALID ") == 2
    assert archive_cli(tmp_path, "verify") == 1
    out = capsys.readouterr().out
    assert "recording 0: OK" in out and "recording 2: OK" in out and "catalog BAD: recording 1" in out
    assert archive_cli(tmp_path, "verify", "1") == 1
    assert "catalog BAD: recording 1" in capsys.readouterr().out
    assert archive_cli(tmp_path, "verify", "2") == 0


def test_a_truncated_catalog_is_reported_and_recover_does_not_crash(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stopped_archive(tmp_path, 20, recordings=3)
    catalog_path = tmp_path / cat.CATALOG_FILE_NAME
    os.truncate(catalog_path, cat.entry_offset(1) + 100)  # entry 0 whole, entry 1 cut, entry 2 gone
    with Catalog.open(tmp_path) as reader:
        assert [d.recording_id for d in reader.recordings()] == [0]
        [problem] = reader.problems()
        assert (problem.first_recording_id, problem.last_recording_id) == (1, 2)
        assert "is truncated: its header counts 3 recordings but the file (2148 bytes) holds whole entries for 1" in (
            problem.reason
        )
        with pytest.raises(CatalogError, match="recording 2 is lost: catalog .* is truncated"):
            reader.recording(2)
    capsys.readouterr()
    assert archive_cli(tmp_path, "list", "--json") == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and '"last_recording_id": 2' in lines[1] and "recordings 1..2 are lost" in lines[1]
    assert archive_cli(tmp_path, "verify") == 1
    assert "recordings 1..2 are lost" in capsys.readouterr().out
    assert archive_cli(tmp_path, "recover") == 1  # struct.error before
    out = capsys.readouterr().out
    assert "no interrupted recordings" in out and "catalog BAD" in out


def test_recover_reports_damage_before_the_stored_stop_position(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ends = write_recording(tmp_path, 0, 300)
    with Catalog.open_writable(tmp_path) as writer:
        add(writer, pid=dead_pid())
        writer.position_writer(0).set_position(ends[200])  # the recorder died after storing this
    victim = ends[50]
    with open(tmp_path / segment_file_name(0, 0), "r+b") as f:
        f.seek(victim + dh.TERM_ID_FIELD_OFFSET)
        f.write((999).to_bytes(4, "little"))
    capsys.readouterr()
    assert archive_cli(tmp_path, "recover") == 1
    out = capsys.readouterr().out
    assert f"recording 0: interrupted, closed at {ends[-1]}; BAD at position {victim}: term id field 999" in out
    assert archive_cli(tmp_path, "verify") == 1
    assert f"BAD at position {victim}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "term_length, segment_length, mtu, start, stop, reason",
    [
        (3, SEGMENT, 1408, START, START, "term length 3 in the catalog is not a power of two within 65536.."),
        (TERM, TERM // 2, 1408, START, START, "segment length 32768 in the catalog is not a power-of-two multiple"),
        (TERM, SEGMENT, 1400, START, START, "MTU 1400 in the catalog is not a multiple of 32"),
        (TERM, SEGMENT, 1408, START, START - 32, "stop position 32 is before the start position 64"),
        (TERM, SEGMENT, 1408, START, START + 3, "stop position 67 in the catalog is not a non-negative multiple"),
    ],
)
def test_impossible_descriptors_are_named_before_any_walk(
    tmp_path: pathlib.Path, term_length: int, segment_length: int, mtu: int, start: int, stop: int, reason: str
) -> None:
    stopped_archive(tmp_path, 5)
    with Catalog.open(tmp_path) as reader:
        good = reader.recording(0)
    assert descriptor_problem(good) is None
    bad = dataclasses.replace(
        good, term_length=term_length, segment_length=segment_length, mtu=mtu, start_position=start, stop_position=stop
    )
    assert reason in (descriptor_problem(bad) or "")
    result = verify_recording(tmp_path, bad)
    assert not result.ok and result.frames == 0 and reason in (result.reason or "")


def stamp_segments(archive: pathlib.Path, recording_id: int) -> None:
    """What ``record --checksum crc32`` writes: every DATA frame's session id field = its payload's CRC-32."""
    for base, path in segment_files(archive, recording_id):
        data = bytearray(path.read_bytes())
        first = START if base == 0 else 0
        data[first:] = stamp_block(memoryview(data)[first:])
        path.write_bytes(bytes(data))


def test_record_checksums_catch_a_flipped_payload_byte_that_headers_cannot(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ends = write_recording(tmp_path, 0, 700)  # two terms and a PAD
    stamp_segments(tmp_path, 0)
    with Catalog.open_writable(tmp_path) as writer:
        add(writer, checksum=ChecksumType.CRC32)
        writer.stop_recording(0, ends[-1])
        d = writer.recording(0)
    assert d.checksum is ChecksumType.CRC32
    with open(tmp_path / segment_file_name(0, 0), "rb") as f:
        f.seek(ends[3] + dh.SESSION_ID_FIELD_OFFSET)
        assert int.from_bytes(f.read(4), "little", signed=True) == payload_checksum(bytes([3]) * 100)
    result = verify_recording(tmp_path, d)
    assert result.ok and result.frames == 701, result
    victim = ends[600]  # in the second term
    path = tmp_path / segment_file_name(0, segment_base_position(START, victim, TERM, SEGMENT))
    offset = victim - segment_base_position(START, victim, TERM, SEGMENT) + dh.HEADER_LENGTH + 40
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff")
    result = verify_recording(tmp_path, d)
    assert not result.ok and result.end_position == victim and result.frames == 601, result
    assert "payload checksum" in (result.reason or "") and "does not match the recorded" in (result.reason or "")
    without = dataclasses.replace(d, checksum=ChecksumType.NONE, session_id=SESSION)
    assert not verify_recording(tmp_path, without).ok  # the session ids are CRCs now
    capsys.readouterr()
    assert archive_cli(tmp_path, "verify") == 1
    assert f"BAD at position {victim}: payload checksum" in capsys.readouterr().out
    assert archive_cli(tmp_path, "list", "--json") == 0
    assert '"checksum": "CRC32"' in capsys.readouterr().out


def test_without_checksums_a_flipped_payload_byte_still_verifies(tmp_path: pathlib.Path) -> None:
    ends = stopped_archive(tmp_path, 50)
    with open(tmp_path / segment_file_name(0, 0), "r+b") as f:
        f.seek(ends[10] + dh.HEADER_LENGTH + 5)
        f.write(b"\xff")
    with Catalog.open(tmp_path) as reader:
        assert verify_recording(tmp_path, reader.recording(0)).ok  # why record checksums exist


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
    with pytest.raises(SegmentError, match=re.escape(f"segment file {tmp_path / '9-0.rec'} is missing")):
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
    """A frame length of 0x7fffffff overflowed the native block scanner (rc 139)."""
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
