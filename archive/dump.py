"""Frame by frame over a recording, for ``logbuf-archive dump`` (readable text or JSON lines).

One Python step per frame: this is for people reading a recording, not for bulk work (the
verifier and the Spark source walk frames in C and numpy).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from logbuf.archive.catalog import RecordingDescriptor
from logbuf.archive.segments import SegmentReader
from logbuf.logbuffer import data_header_descriptor as dh

__all__ = ["RecordedFrame", "iter_frames"]

_TYPE_NAMES = {dh.HDR_TYPE_DATA: "DATA", dh.HDR_TYPE_PAD: "PAD"}


@dataclass(frozen=True)
class RecordedFrame:
    position: int
    frame_length: int
    version: int
    flags: int
    frame_type: int
    term_offset: int
    session_id: int
    stream_id: int
    term_id: int
    reserved_value: int
    payload: bytes
    """The payload (empty for PAD frames, whose body is not recorded)."""

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES.get(self.frame_type, f"{self.frame_type:#x}")

    @property
    def flags_text(self) -> str:
        text = "".join(
            c for bit, c in ((dh.BEGIN_FLAG, "B"), (dh.END_FLAG, "E"), (dh.EOS_FLAG, "S")) if self.flags & bit
        )
        return text or "-"

    def as_dict(self, payload_bytes: int) -> dict[str, object]:
        return {
            "position": self.position,
            "type": self.type_name,
            "frame_length": self.frame_length,
            "flags": self.flags,
            "term_id": self.term_id,
            "term_offset": self.term_offset,
            "session_id": self.session_id,
            "stream_id": self.stream_id,
            "reserved_value": self.reserved_value,
            "payload_hex": self.payload[:payload_bytes].hex(),
        }

    def text(self, payload_bytes: int) -> str:
        shown = self.payload[:payload_bytes].hex()
        more = "..." if len(self.payload) > payload_bytes else ""
        return (
            f"{self.position:>14} {self.type_name:<4} len={self.frame_length:<6} flags={self.flags_text:<3} "
            f"term={self.term_id} off={self.term_offset} session={self.session_id} stream={self.stream_id} "
            f"reserved={self.reserved_value} {shown}{more}"
        )


def iter_frames(
    archive_dir: str | os.PathLike[str],
    d: RecordingDescriptor,
    from_position: int | None = None,
    to_position: int | None = None,
) -> Iterator[RecordedFrame]:
    """Frames from ``from_position`` (default start) to ``to_position`` (default stop).

    Stops quietly at a frame that is not there (length <= 0) or that the files do not hold;
    ``verify`` says why.
    """
    position = d.start_position if from_position is None else from_position
    end = d.stop_position if to_position is None else min(to_position, d.stop_position)
    mask = d.term_length - 1
    with SegmentReader(archive_dir, d.recording_id, d.start_position, d.term_length, d.segment_length) as reader:
        while position < end:
            header = reader.read(position, dh.HEADER_LENGTH)
            if len(header) < dh.HEADER_LENGTH:
                return
            length, version, flags, frame_type, term_offset, session_id, stream_id, term_id, reserved = (
                dh.HEADER.unpack(header)
            )
            aligned = dh.align(length)
            if length <= 0 or (position & mask) + aligned > d.term_length:
                return
            payload = (
                b""
                if frame_type == dh.HDR_TYPE_PAD
                else reader.read(position + dh.HEADER_LENGTH, length - dh.HEADER_LENGTH)
            )
            yield RecordedFrame(
                position,
                length,
                version,
                flags,
                frame_type,
                term_offset,
                session_id,
                stream_id,
                term_id,
                reserved,
                payload,
            )
            position += aligned
