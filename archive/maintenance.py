"""Deleting recordings and dropping old segments (retention), on a writable catalog."""

from __future__ import annotations

import os
import pathlib

import structlog

from logbuf.archive.catalog import Catalog, CatalogError, RecordingState
from logbuf.archive.segments import segment_files
from logbuf.archive.time_index import append_times_file_name, time_index_file_name

__all__ = ["delete_recording", "purge_segments", "truncate_recording"]


def delete_recording(catalog: Catalog, recording_id: int) -> list[pathlib.Path]:
    """Mark the recording DELETED, then remove its segment files (and its time indexes); returns the
    segment files removed.

    A recording that a live recorder is still writing cannot be deleted (stop the recorder first).
    """
    d = catalog.recording(recording_id)
    if d.active:
        raise CatalogError(f"recording {recording_id} is still being recorded; stop its recorder first")
    catalog.set_state(recording_id, RecordingState.DELETED)
    removed = []
    for _, path in segment_files(catalog.archive_dir, recording_id):
        path.unlink(missing_ok=True)
        removed.append(path)
    (pathlib.Path(catalog.archive_dir) / time_index_file_name(recording_id)).unlink(missing_ok=True)
    (pathlib.Path(catalog.archive_dir) / append_times_file_name(recording_id)).unlink(missing_ok=True)
    structlog.get_logger().info("recording.deleted", recording_id=recording_id, segments_removed=len(removed))
    return removed


def purge_segments(
    catalog: Catalog, recording_id: int, *, before_position: int | None = None, before_time_ms: int | None = None
) -> list[pathlib.Path]:
    """Drop the recording's oldest whole segments and move its start position past them.

    A segment goes if it ends at or before ``before_position`` and/or was last written before
    ``before_time_ms`` (its file's modification time; epoch ms), and never if it holds the stop
    position. Only a prefix of the segments can go, so the recording stays contiguous. The
    catalog's start position moves first (to the first kept segment's base), then files are
    removed. Returns the files removed.
    """
    if before_position is None and before_time_ms is None:
        raise ValueError("retention needs a position or a time to drop segments before")
    d = catalog.recording(recording_id)
    if d.state != RecordingState.VALID:
        raise CatalogError(f"recording {recording_id} is {d.state.name}: no retention to apply")
    dropped: list[pathlib.Path] = []
    new_start = d.start_position
    for base, path in segment_files(catalog.archive_dir, recording_id):
        end = base + d.segment_length
        if end > d.stop_position:
            break
        if before_position is not None and end > before_position:
            break
        if before_time_ms is not None and os.stat(path).st_mtime_ns // 1_000_000 >= before_time_ms:
            break
        dropped.append(path)
        new_start = max(new_start, end)
    if not dropped:
        return []
    catalog.set_start_position(recording_id, new_start)
    for path in dropped:
        path.unlink(missing_ok=True)
    structlog.get_logger().info(
        "recording.segments_purged", recording_id=recording_id, segments_removed=len(dropped), start_position=new_start
    )
    return dropped


def truncate_recording(catalog: Catalog, recording_id: int, position: int) -> list[pathlib.Path]:
    """Cut a stopped recording at ``position`` (a frame start in ``start..stop``, or the start: empty).

    The catalog's stop position moves first (readers never see bytes past it), then the bytes from
    ``position`` to the end of its segment are zeroed (so a later prefix scan cannot find old frames) and
    every later segment file is removed, as is the time index (its entries may cover the cut bytes; readers
    then read every segment, and ``logbuf-archive index`` rebuilds it). Returns the files removed.
    """
    from logbuf.archive.segments import segment_base_position
    from logbuf.archive.verify import _walk

    d = catalog.recording(recording_id)
    if d.state != RecordingState.VALID:
        raise CatalogError(f"recording {recording_id} is {d.state.name}: nothing to truncate")
    if d.active:
        raise CatalogError(f"recording {recording_id} is still being recorded; stop it first")
    if not d.start_position <= position <= d.stop_position:
        raise CatalogError(
            f"truncate position {position} is outside recording {recording_id}'s {d.start_position}..{d.stop_position}"
        )
    if position % 32:
        raise CatalogError(f"truncate position {position} is not a multiple of 32")
    if d.start_position < position < d.stop_position:
        term_begin = max(d.start_position, position - (position & (d.term_length - 1)))  # a term starts with a frame
        if _walk(catalog.archive_dir, d, term_begin, position).end_position != position:
            raise CatalogError(f"truncate position {position} is not the start of a frame in recording {recording_id}")
    catalog.stop_recording(recording_id, position, stop_time_ms=d.stop_time_ms)
    removed = []
    cut_base = segment_base_position(d.start_position, position, d.term_length, d.segment_length)
    for base, path in segment_files(catalog.archive_dir, recording_id):
        if base > cut_base or (base == cut_base and position == base and position > d.start_position):
            path.unlink(missing_ok=True)
            removed.append(path)
        elif base == cut_base:
            with open(path, "r+b") as f:
                size = os.fstat(f.fileno()).st_size
                offset = position - base
                if offset < size:
                    os.pwrite(f.fileno(), bytes(size - offset), offset)
    (pathlib.Path(catalog.archive_dir) / time_index_file_name(recording_id)).unlink(missing_ok=True)
    structlog.get_logger().info(
        "recording.truncated", recording_id=recording_id, stop_position=position, segments_removed=len(removed)
    )
    return removed
