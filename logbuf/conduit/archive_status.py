"""The archive's status files for copies (replications) in flight, read by ``logbuf-stat`` and
``logbuf-archive list`` as well as written by the archive service: ``<id>.source.json`` beside a replicated
recording's segments (where it came from) and ``replications.json`` (the copies in progress). Plain JSON, each
written to a temporary file and renamed over the old one, so a reader sees a whole file or none."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "REPLICATIONS_FILE",
    "ReplicaSource",
    "read_replications",
    "read_source",
    "source_file_name",
    "write_replications",
    "write_source",
]


def source_file_name(recording_id: int) -> str:
    return f"{recording_id}.source.json"


@dataclass(frozen=True)
class ReplicaSource:
    """Where a replicated recording came from (kept beside its segments)."""

    source_archive_id: int
    source_recording_id: int
    session_id: int
    stream_id: int
    channel: str
    source_identity: str
    source_control_channel: str
    src_control_stream_id: int = -1
    src_response_channel: str = ""
    replication_channel: str = ""
    stop_position: int = -1
    live_destination: str = ""
    """Where the copy merges onto the live stream once caught up (empty: it follows by replay)."""
    complete: bool = True
    """False while the copy is in progress: a restarted service resumes it (without credentials)."""


def write_source(archive_dir: str | os.PathLike[str], recording_id: int, source: ReplicaSource, file_mode: int) -> None:
    """Write the source file atomically (a temporary file renamed over it)."""
    path = Path(archive_dir) / source_file_name(recording_id)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, file_mode)
    try:
        os.write(fd, json.dumps(asdict(source), sort_keys=True).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_source(archive_dir: str | os.PathLike[str], recording_id: int) -> ReplicaSource | None:
    """The source of a replicated recording, or None for a recording made here (or an unreadable file)."""
    try:
        data = json.loads((Path(archive_dir) / source_file_name(recording_id)).read_bytes())
        return ReplicaSource(**data)
    except (OSError, ValueError, TypeError):
        return None


REPLICATIONS_FILE = "replications.json"
"""The copies in progress (each one's ``describe()``), rewritten by the service about once a second."""


def write_replications(archive_dir: str | os.PathLike[str], entries: list[dict[str, Any]], now_ms: int) -> None:
    path = Path(archive_dir) / REPLICATIONS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"updated_ms": now_ms, "pid": os.getpid(), "replications": entries}, sort_keys=True))
    os.replace(tmp, path)


def read_replications(archive_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The copies in progress as the serving archive last wrote them (none if no file or a dead service)."""
    try:
        data = json.loads((Path(archive_dir) / REPLICATIONS_FILE).read_bytes())
        pid = int(data["pid"])
        os.kill(pid, 0)
        return list(data["replications"])
    except (OSError, ValueError, TypeError, KeyError):
        return []
