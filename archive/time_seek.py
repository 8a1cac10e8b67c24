"""Seek a recording by time: the position of its first message stamped at or after a time.

The publisher's timestamp is each message's reserved value (the time index keeps, per segment, the
largest one). The index skips every segment whose messages are all older, then the frames of the first
segment that may hold the time are walked. Used by the archive service (a remote client's
``RecordingPositionAtTimeRequest``) and by :func:`logbuf.archive.replay_merge.position_at_time` on the
archive's host.
"""

from __future__ import annotations

import os

from logbuf.archive.catalog import RecordingDescriptor
from logbuf.archive.dump import iter_frames
from logbuf.archive.time_index import read_index_file, time_index_file_name
from logbuf.logbuffer import data_header_descriptor as dh

__all__ = ["seek_time"]


def seek_time(
    archive_dir: str | os.PathLike[str], d: RecordingDescriptor, time_value: int, recorded_position: int
) -> int:
    """The position of the first message of recording ``d`` whose reserved value is at least ``time_value``;
    ``recorded_position`` (how far it is recorded: its stop position, or an active recording's position) if
    none is."""
    index = {}
    try:
        index = read_index_file(os.path.join(archive_dir, time_index_file_name(d.recording_id)), d.recording_id)
    except (OSError, ValueError):
        pass
    start = d.start_position
    for base in sorted(index):
        times = index[base]
        end = base + d.segment_length
        if end <= d.start_position:
            continue
        if times.stamped_frames and times.max_reserved < time_value:
            start = max(start, end)  # every message of this segment is older
        else:
            break
    if start >= recorded_position:
        return recorded_position
    for frame in iter_frames(archive_dir, d, start, recorded_position):
        if frame.frame_type == dh.HDR_TYPE_DATA and frame.flags & dh.BEGIN_FLAG and frame.reserved_value >= time_value:
            return frame.position
    return recorded_position
