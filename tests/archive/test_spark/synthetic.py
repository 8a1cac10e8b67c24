"""Segment files written the way a log lays out frames, for parser tests that need exact control.

The real path (driver, recorder) is covered by the recorded-archive tests; this builder exists to
place a fake header inside a payload, or one bad byte, at a known position.
"""

from __future__ import annotations

import os
import pathlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from logbuf.archive.catalog import Catalog, ChecksumType, RecordingDescriptor, RecordingState
from logbuf.archive.checksum import stamp_block
from logbuf.archive.segments import segment_base_position, segment_file_name
from logbuf.logbuffer import data_header_descriptor as dh

TERM = 64 * 1024
MTU = dh.DEFAULT_MTU_LENGTH


@dataclass
class SyntheticRecording:
    """Frames appended as a publication would: fragmented above MTU - 32, PAD at a term's end."""

    recording_id: int = 0
    session_id: int = 77
    stream_id: int = 10
    initial_term_id: int = 1000
    term_length: int = TERM
    segment_length: int = 2 * TERM
    start_position: int = 0
    data: bytearray = field(default_factory=bytearray)
    position: int = -1
    messages: list[tuple[bytes, int, int]] = field(default_factory=list)
    """(payload, reserved value, end position) per message."""
    frames: list[tuple[int, int]] = field(default_factory=list)
    """(start position, end position) per DATA frame."""

    def __post_init__(self) -> None:
        self.position = self.start_position

    def header(self, position: int, frame_length: int, flags: int, frame_type: int, reserved: int) -> bytes:
        term_id = (self.initial_term_id + position // self.term_length) & 0xFFFFFFFF
        term_id = term_id - (1 << 32) if term_id >= 1 << 31 else term_id
        return dh.HEADER.pack(
            frame_length,
            0,
            flags,
            frame_type,
            position % self.term_length,
            self.session_id,
            self.stream_id,
            term_id,
            reserved,
        )

    def _put(self, position: int, data: bytes) -> None:
        end = position + len(data)
        if len(self.data) < end:
            self.data.extend(bytes(end - len(self.data)))
        self.data[position:end] = data

    def offer(self, payload: bytes, reserved: int = 0) -> int:
        max_payload = MTU - dh.HEADER_LENGTH
        chunks = [payload[i : i + max_payload] for i in range(0, len(payload), max_payload)] or [b""]
        total = sum(dh.align(len(c) + dh.HEADER_LENGTH) for c in chunks)
        term_offset = self.position % self.term_length
        if term_offset + total > self.term_length:  # pad the rest of the term, header only
            pad = self.term_length - term_offset
            self._put(self.position, self.header(self.position, pad, dh.UNFRAGMENTED, dh.HDR_TYPE_PAD, 0))
            self.position += pad
        for i, chunk in enumerate(chunks):
            flags = (dh.BEGIN_FLAG if i == 0 else 0) | (dh.END_FLAG if i == len(chunks) - 1 else 0)
            length = len(chunk) + dh.HEADER_LENGTH
            self._put(self.position, self.header(self.position, length, flags, dh.HDR_TYPE_DATA, reserved) + chunk)
            self.frames.append((self.position, self.position + dh.align(length)))
            self.position += dh.align(length)
        self.messages.append((payload, reserved, self.position))
        return self.position

    def descriptor(self, stop_position: int | None = None) -> RecordingDescriptor:
        return RecordingDescriptor(
            recording_id=self.recording_id,
            state=RecordingState.VALID,
            active=False,
            channel="aeron:ipc",
            source_identity="aeron:ipc",
            stream_id=self.stream_id,
            session_id=self.session_id,
            initial_term_id=self.initial_term_id,
            term_length=self.term_length,
            mtu=MTU,
            segment_length=self.segment_length,
            start_position=self.start_position,
            stop_position=self.position if stop_position is None else stop_position,
            start_time_ms=0,
            stop_time_ms=0,
            interrupted=False,
        )

    def write_segments(self, archive_dir: str | os.PathLike[str]) -> list[pathlib.Path]:
        """Full-length segment files (zeros past the data), as the recorder leaves them."""
        paths = []
        first = segment_base_position(self.start_position, self.start_position, self.term_length, self.segment_length)
        base = first
        while base < max(self.position, first + 1):
            chunk = bytes(self.data[base : base + self.segment_length])
            path = pathlib.Path(archive_dir) / segment_file_name(self.recording_id, base)
            path.write_bytes(chunk + bytes(self.segment_length - len(chunk)))
            paths.append(path)
            base += self.segment_length
        return paths

    def segment(self, base: int) -> bytes:
        chunk = bytes(self.data[base : base + self.segment_length])
        return chunk + bytes(self.segment_length - len(chunk))


def build_archive(
    archive: pathlib.Path,
    recordings: Sequence[SyntheticRecording],
    *,
    checksum: ChecksumType = ChecksumType.NONE,
) -> None:
    """Segments and a catalog entry (stopped) per synthetic recording, with ids 0, 1, ..."""
    with Catalog.open_writable(archive) as writer:
        for rec in recordings:
            if checksum:
                stamp(rec)
            rec.write_segments(archive)
            rid = writer.add_recording(
                channel="aeron:ipc",
                source_identity="aeron:ipc",
                stream_id=rec.stream_id,
                session_id=rec.session_id,
                initial_term_id=rec.initial_term_id,
                term_length=rec.term_length,
                mtu=MTU,
                segment_length=rec.segment_length,
                start_position=rec.start_position,
                checksum=checksum,
            )
            assert rid == rec.recording_id
            writer.stop_recording(rid, rec.position)


def stamp(rec: SyntheticRecording) -> None:
    """Record checksums, as ``record --checksum crc32`` writes them (frames from the start position)."""
    start = rec.start_position
    rec.data[start:] = stamp_block(memoryview(rec.data)[start:])


def recording(recording_id: int, stream_id: int, count: int, seed: int, session_id: int = 77) -> SyntheticRecording:
    rec = SyntheticRecording(recording_id=recording_id, stream_id=stream_id, session_id=session_id)
    rng = random.Random(seed)
    for i in range(count):
        rec.offer(rng.randbytes(rng.choice((0, 10, 200, MTU, 3000))), reserved=1_700_000_000_000_000 + i)
    return rec
