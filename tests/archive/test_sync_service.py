"""The checks an archive makes before it lets a sync repair overwrite its frames (no service needed)."""

from __future__ import annotations

import pytest

from logbuf.archive.checksum import payload_checksum
from logbuf.archive.recording import ChecksumType, RecordingDescriptor, RecordingState
from logbuf.archive.sync_service import frames_problem
from logbuf.logbuffer import data_header_descriptor as dh

TERM_LENGTH, INITIAL_TERM_ID, STREAM = 1 << 16, 5, 1001


def descriptor(checksum: ChecksumType = ChecksumType.CRC32) -> RecordingDescriptor:
    return RecordingDescriptor(
        recording_id=0,
        state=RecordingState.VALID,
        active=False,
        channel="aeron:ipc",
        source_identity="aeron:ipc",
        stream_id=STREAM,
        session_id=-9,
        initial_term_id=INITIAL_TERM_ID,
        term_length=TERM_LENGTH,
        mtu=1408,
        segment_length=1 << 20,
        start_position=0,
        stop_position=1 << 20,
        start_time_ms=0,
        stop_time_ms=0,
        interrupted=False,
        checksum=checksum,
    )


def frame(position: int, payload: bytes, *, crc: int | None = None, term_offset: int | None = None) -> bytes:
    term_id = INITIAL_TERM_ID + position // TERM_LENGTH
    offset = position % TERM_LENGTH if term_offset is None else term_offset
    session = payload_checksum(payload) if crc is None else crc
    length = dh.HEADER_LENGTH + len(payload)
    header = dh.HEADER.pack(length, 0, 0xC0, dh.HDR_TYPE_DATA, offset, session, STREAM, term_id, 0)
    return (header + payload).ljust(dh.align(length), b"\0")


def test_frames_that_verify_at_their_positions_are_accepted() -> None:
    two = frame(4064, b"a" * 100) + frame(4064 + 160, b"b" * 100)
    assert frames_problem(descriptor(), 4064, two) is None


@pytest.mark.parametrize(
    ("position", "frames", "problem"),
    [
        (4064, frame(4064, b"a" * 100, crc=1), "payload checksum"),
        (4064, frame(4064, b"a" * 100, term_offset=0), "term offset field 0 does not match"),
        (4096, frame(4064, b"a" * 100), "does not match the position"),
        (4064, frame(4064, b"a" * 100)[:-40], "runs past the bytes given"),
        (4064, frame(4064, b"a" * 100) + b"\0" * 8, "not a whole frame"),
        (4065, frame(4064, b"a" * 100), "not frame aligned"),
    ],
)
def test_frames_that_do_not_verify_are_refused_naming_the_problem(position: int, frames: bytes, problem: str) -> None:
    found = frames_problem(descriptor(), position, frames)
    assert found is not None and problem in found


def test_a_recording_without_checksums_takes_no_repair() -> None:
    found = frames_problem(descriptor(ChecksumType.NONE), 4064, frame(4064, b"a" * 100))
    assert found is not None and "no checksums" in found
