"""Topics in the Spark data source: the ``topic`` column, the names behind it and the topic filters.

Theory of operation
-------------------
A topic message is a DATA frame whose reserved value is its topic's 63-bit id; the name travels once per
publication in a *definition frame* (reserved value = id with bit 63 set, so negative as an int64; payload =
the name's UTF-8 bytes), written before the topic's first message (``protocol_spec/topics.md``). A recording
keeps both as they were sent, so the names of a recording's topics are its definition frames. A definition
counts only if its payload is a valid topic name that hashes to its id: a frame of a stream without topics
whose reserved value happens to be negative names nothing (the chance that 8 bytes of BLAKE2b agree is 2^-63).

*Names before a partition* (on the driver, :class:`TopicNames`): the definitions in the recording's segments
before the partition's first position. A complete segment whose time-index entry bounds its reserved values
at or above 0 holds no definition and is not read; the others (segments holding definitions, the segment
being written, a recording without a time index) are walked frame by frame, once per reader (a streaming
reader keeps what it found across micro-batches). *Names inside a partition* are learned on the executor
as its chunks are parsed, in position order, so a definition always precedes the rows it names.

Rows: definition frames make no row (a topic subscriber never sees them either). ``topic`` is the name of
the row's reserved value when that is a named topic id, else null (a stream without topics reads as before,
all nulls). Filters on ``topic`` (``=``, ``IN``, ``LIKE 'prefix%'``, ``LIKE '%suffix'``, ``LIKE '%part%'``)
are decided once per distinct topic id and applied to the frames' reserved values before any payload byte is
gathered (:meth:`archive.spark_filters.TopicFilter.keep_ids`); Arrow then applies them exactly to each batch as every pushed filter is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from logbuf.archive.catalog import RecordingDescriptor
from logbuf.archive.spark_frames import ChunkFrames, parse_chunk
from logbuf.archive.storage import ArchiveLocation, read_segment, read_time_index
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.topic_names import TOPIC_ID_MASK, TopicNameError, check_topic_name, topic_id_of_bytes

__all__ = ["TopicNames", "definitions_in"]

_SLOT: Final[int] = dh.FRAME_ALIGNMENT
_TYPE_SHIFT: Final[int] = (dh.TYPE_FIELD_OFFSET - dh.VERSION_FIELD_OFFSET) * 8
_RESERVED_INT64: Final[int] = dh.RESERVED_VALUE_FIELD_OFFSET // 8


def definitions_in(frames: ChunkFrames, names: dict[int, str]) -> npt.NDArray[np.bool_]:
    """Add the valid definition frames of ``frames`` to ``names`` (id -> name); returns which of its frames
    are definitions (to make no row)."""
    region = frames.region
    whole = (len(region) // _SLOT) * _SLOT
    reserved = region[:whole].view("<i8").reshape(-1, _SLOT // 8)[frames.slot, _RESERVED_INT64]
    is_data = ((frames.words >> _TYPE_SHIFT) & 0xFFFF) == dh.HDR_TYPE_DATA
    candidates = np.flatnonzero(is_data & (reserved < 0))
    found = np.zeros(len(frames.slot), dtype=bool)
    for k in candidates.tolist():
        start = int(frames.slot[k]) * _SLOT + dh.HEADER_LENGTH
        name_bytes = bytes(region[start : start + int(frames.frame_length[k]) - dh.HEADER_LENGTH])
        topic_id = int(reserved[k]) & TOPIC_ID_MASK
        if topic_id_of_bytes(name_bytes) != topic_id:
            continue
        try:
            name = name_bytes.decode("utf-8")
            check_topic_name(name)
        except (UnicodeDecodeError, TopicNameError):
            continue
        names[topic_id] = name
        found[k] = True
    return found


@dataclass
class TopicNames:
    """The names of a recording's topics defined before a position, found on the driver (see the module
    doc). What a segment's walk found is kept with how far it went, so a later call (the next micro-batch)
    walks only the frames after that."""

    _segments: dict[tuple[str, int, int], tuple[int, dict[int, str]]] = field(default_factory=dict)

    def before(self, location: ArchiveLocation, d: RecordingDescriptor, position: int) -> dict[int, str]:
        """Topic id -> name of every definition in ``d`` before ``position`` (a frame boundary or term start)."""
        names: dict[int, str] = {}
        position = min(position, d.stop_position)
        if position <= d.start_position:
            return names
        index = read_time_index(location, d.recording_id)
        base = d.start_position - (d.start_position % d.segment_length)
        while base < position:
            end = base + d.segment_length
            entry = index.get(base)
            if entry is not None and (entry.stamped_frames == 0 or entry.min_reserved >= 0):
                base = end
                continue  # no negative reserved value in this segment: no definition
            key = (location.uri, d.recording_id, base)
            walked_to, found = self._segments.get(key, (max(base, d.start_position), {}))
            wanted = min(end, position)
            if walked_to < wanted:
                found = {**found, **_definitions_of_segment(location, d, base, walked_to, wanted)}
                self._segments[key] = (wanted, found)
            names.update(found)
            base = end
        return names


def _definitions_of_segment(
    location: ArchiveLocation, d: RecordingDescriptor, base: int, lo: int, to: int
) -> dict[int, str]:
    """The definitions in segment ``base`` from the frame at ``lo`` up to ``to``, a term at a time; a damaged
    term ends the walk of that term only (its rows get their own corrupt-record treatment when read)."""
    names: dict[int, str] = {}
    try:
        with read_segment(location, d.recording_id, base, d.segment_length, lo - base, to - base) as (segment, offset):
            while lo < to:
                term_end = min(to, lo - (lo & (d.term_length - 1)) + d.term_length)
                frames = parse_chunk(segment, base + offset, lo, term_end, d)
                definitions_in(frames, names)
                lo = frames.corruption.resume_position if frames.corruption is not None else term_end
    except FileNotFoundError:
        pass  # a missing segment is reported when it is read
    return names
