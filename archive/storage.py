"""Where an archive lives: a local directory, or a URI that pyarrow's filesystems read, and uploading one.

A *location* is a local path (or a ``file:`` URI), or ``s3://bucket/prefix``, ``hdfs://host:port/path``,
``gs://...`` (the schemes ``pyarrow.fs.FileSystem.from_uri`` knows, :data:`REMOTE_SCHEMES`; any other is
an error naming it). The URI's query parameters configure the filesystem, e.g.
``s3://bucket/archive?endpoint_override=127.0.0.1:9000&scheme=http`` for an S3 API server that is not
AWS; credentials come from the usual environment, ``AWS_ACCESS_KEY_ID`` and so on.

Reading: local archives are memory-mapped as before (the catalog can change under a reader, and
segments are read in place). A remote archive's catalog is read whole into memory (a snapshot: 1 KiB
per recording) and a segment is read with one ranged read of the bytes a partition needs.

Uploading (``logbuf-archive upload DEST``, :func:`upload`): segment files first, each once it is
complete (a stopped recording's, or an active one's whose end the recording has passed; the last
segment of a stopped recording is cut at its stop position) and each recording's time index, then the
catalog, whose stop positions are set back to what was uploaded. Object stores write an object whole or not at all, so a reader of
the destination never sees a catalog that points past the segments it can read. With ``--follow``
the upload repeats until stopped, segment by segment as each completes.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import pathlib
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt
import structlog

from logbuf.archive import catalog_descriptor as cat
from logbuf.archive.catalog import Catalog, CatalogError
from logbuf.archive.segments import mapped_segment, segment_file_name, segment_files
from logbuf.archive.time_index import (
    AppendTimes,
    SegmentTimes,
    TimeIndexError,
    append_times_file_name,
    decode_append_times,
    decode_index,
    time_index_file_name,
)
from logbuf.errors import LogbufError

if TYPE_CHECKING:
    import pyarrow.fs as pafs  # type: ignore[import-untyped]

__all__ = [
    "ArchiveLocation",
    "StorageError",
    "UploadReport",
    "expand_locations",
    "has_glob",
    "open_catalog",
    "parse_location",
    "read_segment",
    "read_append_times",
    "read_time_index",
    "upload",
]

_GLOB_CHARS: Final[str] = "*?["
REMOTE_SCHEMES: Final[tuple[str, ...]] = ("s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
"""URI schemes of the filesystems pyarrow builds from a URI (besides ``file:``, read as a local path)."""
_SCHEME_HINTS: Final[dict[str, str]] = {
    "webhdfs": "; for WebHDFS use hdfs:// (pyarrow's HadoopFileSystem), or upload the archive to s3://",
    "s3a": "; use s3:// (pyarrow's S3 filesystem, configured by the URI's query and the AWS_* variables)",
    "s3n": "; use s3:// (pyarrow's S3 filesystem, configured by the URI's query and the AWS_* variables)",
    "http": "; HTTP is not a filesystem: upload the archive to s3:// and read it there",
    "https": "; HTTP is not a filesystem: upload the archive to s3:// and read it there",
}
_HADOOP_NEEDS: Final[str] = (
    "hdfs:// and viewfs:// go through pyarrow's HadoopFileSystem, which needs libhdfs.so (ARROW_LIBHDFS_DIR, "
    "or HADOOP_HOME/lib/native), a JVM (JAVA_HOME) and the Hadoop client jars on CLASSPATH "
    "(`hadoop classpath --glob`), on the Spark driver and on every executor"
)
_COPY_CHUNK: Final[int] = 8 * 1024 * 1024


class StorageError(LogbufError, ValueError):
    """A location that cannot be used (the message names it and why)."""


@dataclass(frozen=True)
class ArchiveLocation:
    """One archive directory: a local path, or a filesystem URI (kept as text so that it pickles)."""

    uri: str
    """A local path, or ``scheme://netloc/path?query``."""

    @property
    def is_local(self) -> bool:
        return "://" not in self.uri

    @property
    def local_path(self) -> str:
        if not self.is_local:
            raise StorageError(f"{self.uri} is not a local directory")
        return self.uri

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """(pyarrow filesystem, the archive's path in it)."""
        return _filesystem(self.uri)

    def file_path(self, name: str) -> str:
        """Where file ``name`` of the archive is: a local path, or its path in :meth:`filesystem`."""
        if self.is_local:
            return os.path.join(self.uri, name)
        return f"{self.filesystem()[1].rstrip('/')}/{name}"

    def __str__(self) -> str:
        return self.uri


def parse_location(text: str) -> ArchiveLocation:
    """A location from a path or URI (``file:`` URIs become local paths)."""
    text = text.strip()
    if not text:
        raise StorageError("an empty archive location")
    if text.startswith("file:"):
        return ArchiveLocation(urllib.parse.unquote(urllib.parse.urlparse(text).path) or "/")
    if "://" in text:
        scheme = text.split("://", 1)[0]
        if not scheme.isidentifier() and not scheme.replace("+", "").replace("-", "").isalnum():
            raise StorageError(f"{text!r}: {scheme!r} is not a URI scheme")
        if scheme.lower() not in REMOTE_SCHEMES:
            hint = _SCHEME_HINTS.get(scheme.lower(), "")
            raise StorageError(
                f"{text}: unsupported scheme {scheme!r}; an archive location is a local path or a file://, "
                f"{', '.join(s + '://' for s in REMOTE_SCHEMES)} URI (pyarrow's filesystems){hint}"
            )
        return ArchiveLocation(text)
    return ArchiveLocation(os.path.abspath(text))


@functools.lru_cache(maxsize=64)
def _filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)  # type: ignore[no-any-return]
    except (ValueError, OSError) as e:
        text = str(e)
        if uri.split("://", 1)[0].lower() in ("hdfs", "viewfs") and any(
            word in text for word in ("libhdfs", "libjvm", "CLASSPATH", "JAVA_HOME")
        ):
            reason = text.strip().splitlines()[0] if text.strip() else type(e).__name__
            raise StorageError(f"cannot open {uri}: {_HADOOP_NEEDS} (pyarrow: {reason})") from None
        raise StorageError(f"cannot open {uri}: {e}") from None


def _split(uri: str) -> tuple[str, str, str]:
    """(scheme://netloc, path, ?query or '') of a URI."""
    parts = urllib.parse.urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}", parts.path, f"?{parts.query}" if parts.query else ""


def has_glob(text: str) -> bool:
    """Whether a path or URI's path (not its query) holds glob characters."""
    path = _split(text)[1] if "://" in text else text
    return any(c in path for c in _GLOB_CHARS)


def expand_locations(texts: Sequence[str]) -> list[ArchiveLocation]:
    """Each path or URI as a location; one with glob characters (``*``, ``?``, ``[``) becomes every
    matching directory that holds an archive catalog (in name order). A glob that matches none is an
    error naming it."""
    found: list[ArchiveLocation] = []
    for text in texts:
        location = parse_location(text)
        if not has_glob(location.uri):
            found.append(location)
            continue
        matches = _glob_local(location.uri) if location.is_local else _glob_remote(location.uri)
        if not matches:
            raise StorageError(f"{text}: no archive directory (holding {cat.CATALOG_FILE_NAME}) matches")
        found.extend(matches)
    return found


def _glob_local(pattern: str) -> list[ArchiveLocation]:
    import glob

    return [
        ArchiveLocation(path)
        for path in sorted(glob.glob(pattern))
        if os.path.isfile(os.path.join(path, cat.CATALOG_FILE_NAME))
    ]


def _glob_remote(uri: str) -> list[ArchiveLocation]:
    """``scheme://netloc/static/prefix/pat*tern?query``: list under the static prefix, keep directories
    that hold a catalog and match the pattern at its depth."""
    import pyarrow.fs as pafs

    root, path, query = _split(uri)
    pattern = path.strip("/")
    components = pattern.split("/")
    static = []
    for component in components:
        if any(c in component for c in _GLOB_CHARS):
            break
        static.append(component)
    prefix = "/".join(static)
    fs, base = _filesystem(f"{root}/{prefix}{query}")
    base = base.rstrip("/")
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    matches = []
    for info in infos:
        if info.type != pafs.FileType.File or info.base_name != cat.CATALOG_FILE_NAME:
            continue
        relative = info.path[len(base) : -len(cat.CATALOG_FILE_NAME)].strip("/")
        candidate = f"{prefix}/{relative}" if prefix else relative
        if candidate.count("/") == pattern.count("/") and fnmatch.fnmatchcase(candidate, pattern):
            matches.append(ArchiveLocation(f"{root}/{candidate}{query}"))
    return sorted(matches, key=lambda location: location.uri)


def open_catalog(location: ArchiveLocation) -> Catalog:
    """The archive's catalog: mapped (local, live) or read whole (remote, a snapshot)."""
    if location.is_local:
        return Catalog.open(location.local_path)
    fs, _ = location.filesystem()
    path = location.file_path(cat.CATALOG_FILE_NAME)
    try:
        with fs.open_input_file(path) as f:
            data = f.readall()
    except FileNotFoundError:
        raise CatalogError(f"no archive catalog at {location.uri} ({path} does not exist)") from None
    except OSError as e:
        raise CatalogError(f"cannot read the archive catalog at {location.uri}: {e}") from None
    return Catalog.from_snapshot(data, f"{location.uri}/{cat.CATALOG_FILE_NAME}")


@contextlib.contextmanager
def read_segment(
    location: ArchiveLocation,
    recording_id: int,
    base_position: int,
    segment_length: int,
    from_offset: int,
    to_offset: int,
) -> Iterator[tuple[npt.NDArray[np.uint8], int]]:
    """The bytes of segment file (``recording_id``, ``base_position``) that hold file offsets
    ``[from_offset, to_offset)`` as (array, file offset of its first byte); shorter if the file is.
    Local files are mapped whole (the offset is 0); remote ones are read in one ranged read.
    FileNotFoundError if the file is missing."""
    name = segment_file_name(recording_id, base_position)
    if location.is_local:
        with mapped_segment(location.file_path(name), segment_length) as mapped:
            yield mapped, 0
        return
    fs, _ = location.filesystem()
    with fs.open_input_file(location.file_path(name)) as f:
        size = min(f.size(), segment_length)
        start = min(from_offset, size)
        data = f.read_at(max(0, min(to_offset, size) - start), start)
    yield np.frombuffer(data, dtype=np.uint8), start


def read_time_index(location: ArchiveLocation, recording_id: int) -> dict[int, SegmentTimes]:
    """The recording's time index entries by segment base position: {} when it has none, or one this
    version cannot read (logged: it costs pruning, never rows)."""
    path = location.file_path(time_index_file_name(recording_id))
    try:
        if location.is_local:
            with open(path, "rb") as f:
                data = f.read()
        else:
            with location.filesystem()[0].open_input_file(path) as f:
                data = f.readall()
    except FileNotFoundError:
        return {}
    except OSError as e:
        structlog.get_logger().warning("time_index.unreadable", path=path, error=str(e))
        return {}
    try:
        return decode_index(data, recording_id, path)
    except TimeIndexError as e:
        structlog.get_logger().warning("time_index.ignored", path=path, error=str(e))
        return {}


def read_append_times(location: ArchiveLocation, recording_id: int) -> AppendTimes | None:
    """The recording's append-time index (None when it has none, or one this version cannot read: logged;
    its rows then have null timestamps). A local file is mapped, not read."""
    import mmap

    path = location.file_path(append_times_file_name(recording_id))
    try:
        if location.is_local:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data: bytes | mmap.mmap = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) if size else b""
        else:
            with location.filesystem()[0].open_input_file(path) as f:
                data = f.readall()
    except FileNotFoundError:
        return None
    except OSError as e:
        structlog.get_logger().warning("append_times.unreadable", path=path, error=str(e))
        return None
    try:
        return decode_append_times(data, recording_id, path)
    except TimeIndexError as e:
        structlog.get_logger().warning("append_times.ignored", path=path, error=str(e))
        return None


# -- uploading -----------------------------------------------------------------------------------------
@dataclass
class UploadReport:
    segments: list[str] = field(default_factory=list)
    """Segment files written in this pass."""
    recordings: int = 0
    catalog_bytes: int = 0


def upload(archive_dir: str | os.PathLike[str], destination: ArchiveLocation) -> UploadReport:
    """One pass: complete segments not yet at ``destination`` (by name and size), then the catalog with
    stop positions set back to the uploaded extent of each recording."""
    import pyarrow.fs as pafs

    if destination.is_local:
        pathlib.Path(destination.local_path).mkdir(parents=True, exist_ok=True)
        fs: pafs.FileSystem = pafs.LocalFileSystem()
    else:
        fs = destination.filesystem()[0]
        with contextlib.suppress(OSError):  # a bucket that exists, or one we may not create
            fs.create_dir(destination.filesystem()[1], recursive=True)
    log = structlog.get_logger().bind(role="archive-upload", destination=destination.uri)
    report = UploadReport()
    with Catalog.open(archive_dir) as catalog:
        snapshot = bytearray(catalog.snapshot_bytes())
        recordings = catalog.recordings()
    existing = _sizes(fs, destination)
    for d in recordings:
        if d.state.name != "VALID":
            continue
        uploaded_end = d.start_position
        for base, path in segment_files(archive_dir, d.recording_id):
            segment_end = base + d.segment_length
            if d.active and segment_end > d.stop_position:
                break  # still being written
            length = min(d.segment_length, max(0, d.stop_position - base))
            name = path.name
            if existing.get(name) != length:
                _copy(path, fs, destination.file_path(name), length)
                report.segments.append(name)
                log.info("segment.uploaded", segment=name, bytes=length)
            uploaded_end = min(segment_end, d.stop_position)
        index = pathlib.Path(archive_dir) / time_index_file_name(d.recording_id)
        with contextlib.suppress(FileNotFoundError):
            times = index.read_bytes()  # entries name complete segments only: copied whole, after them
            if existing.get(index.name) != len(times):
                _write_whole(fs, destination.file_path(index.name), times)
                log.info("time_index.uploaded", file=index.name, bytes=len(times))
        appended = pathlib.Path(archive_dir) / append_times_file_name(d.recording_id)
        with contextlib.suppress(FileNotFoundError):
            data = appended.read_bytes()  # after the segments: entries past the uploaded end are never used
            if existing.get(appended.name) != len(data):
                _write_whole(fs, destination.file_path(appended.name), data)
                log.info("append_times.uploaded", file=appended.name, bytes=len(data))
        if uploaded_end < d.stop_position:
            cat.INT64.pack_into(snapshot, cat.entry_offset(d.recording_id) + cat.STOP_POSITION_OFFSET, uploaded_end)
        report.recordings += 1
    _write_whole(fs, destination.file_path(cat.CATALOG_FILE_NAME), bytes(snapshot))
    report.catalog_bytes = len(snapshot)
    log.info("catalog.uploaded", recordings=report.recordings, segments=len(report.segments))
    return report


def _sizes(fs: pafs.FileSystem, destination: ArchiveLocation) -> dict[str, int]:
    import pyarrow.fs as pafs

    base = destination.local_path if destination.is_local else destination.filesystem()[1]
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    return {info.base_name: info.size for info in infos if info.type == pafs.FileType.File}


def _copy(path: pathlib.Path, fs: pafs.FileSystem, target: str, length: int) -> None:
    with open(path, "rb") as source, fs.open_output_stream(target) as out:
        remaining = length
        while remaining > 0:
            chunk = source.read(min(_COPY_CHUNK, remaining))
            if not chunk:
                break
            out.write(chunk)
            remaining -= len(chunk)
        if remaining > 0:  # a sparse tail the file no longer holds
            out.write(bytes(remaining))


def _write_whole(fs: pafs.FileSystem, target: str, data: bytes) -> None:
    """Write ``data`` so that readers see the old object or the new one, never a part."""
    import pyarrow.fs as pafs

    if isinstance(fs, pafs.LocalFileSystem):
        temporary = f"{target}.uploading"
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, target)
        return
    with fs.open_output_stream(target) as out:  # an object store replaces an object whole
        out.write(data)
