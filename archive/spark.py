"""``spark.read.format("logbuf")`` and ``spark.readStream.format("logbuf")``: an archive as a DataFrame.

A PySpark Python data source (``pyspark.sql.datasource``, Spark 4). :func:`register` adds it to a
session; then ``spark.read.format("logbuf").load(archive_dir)`` gives one row per message (or per
frame) of every recording in the archive, and ``spark.readStream.format("logbuf").load(dir)``
follows the recordings as the recorder writes them.

Theory of operation
-------------------
*Planning* (on the driver, :class:`LogbufReader.partitions`) reads the catalog once and makes one
:class:`SegmentPartition` per segment file that overlaps the positions asked for. Segments hold
whole terms and a message never crosses a term, so each partition reassembles its own messages.
*Reading* (on the executors, :func:`read_partition`) maps the segment file read-only and parses
it a chunk of whole terms at a time with :mod:`archive.spark_frames` (numpy over the raw frames,
no Python loop per frame), yielding ``pyarrow.RecordBatch``es that go to the JVM as they are.

Rows and positions: ``position`` is the stream position just after a row's last frame (what
``offer()`` returned, Aeron's ``Header.position``); ``startPosition`` / ``stopPosition`` select
rows with ``startPosition < position <= stopPosition``. When a range starts inside a fragmented
message the reader goes back to the start of that term (a term always starts with a frame) so the
message still comes back whole, from the micro-batch in which its last fragment was recorded.

Corrupt frames follow Spark's ``mode`` option. A frame is corrupt when it breaks the rules
``logbuf-archive verify`` checks (see :mod:`archive.spark_frames`), or its segment file is
missing or too short. After a corrupt frame nothing can be trusted up to the end of its term (the
frame's length is what says where the next frame is), so the rest of the term is skipped and
reading resumes at the next term, whose first frame is at term offset 0. PERMISSIVE (default):
one extra row per skipped region, with ``position`` = where the bad frame starts, the
recording's ids, the term id and offset of that position, nulls elsewhere and the reason plus the
resume position in the corrupt-record column (``_corrupt_record``, or
``columnNameOfCorruptRecord``). DROPMALFORMED: the region is skipped silently (one warning per
region on the executor's stderr). FAILFAST: the query fails with the reason.

Damage the catalog shows (an entry INVALID after it was added, a truncated catalog file, a descriptor
with impossible stream parameters such as a term length of 3) is reported in the same three ways,
before any segment is planned: a PERMISSIVE row with the recording id and the reason, a warning, or a
FAILFAST error. A lost recording never reads as "no rows".

Filters (:mod:`archive.spark_filters`): comparisons of the ids and ``position`` with literals prune
recordings and segments, ``timestamp`` ranges prune segments by the recording's time index
(:mod:`archive.time_index`; a segment without an entry is read); every taken filter is then applied
exactly to each batch.
Spark only calls the reader's ``pushFilters`` with ``spark.sql.python.filterPushdown.enabled`` set,
and refuses a reader that has it otherwise: :func:`register` sets it, and ``filterPushdown=false``
gives a reader without it.

Streaming offsets are ``{"<recording id>": position}``: per recording, the recorded position read
so far, always a frame boundary. A micro-batch ends at each recording's stop position as the catalog
holds it at that moment (every byte before it is written, so never a half-written frame); new
recordings join from their start position; a restarted query goes on from its checkpointed offsets,
so nothing is read twice. ``startingOffsets`` / ``endingOffsets`` (and the timestamps) pin the range
per recording, in batch and streaming (:mod:`archive.spark_offsets`). Positions removed by retention
or deletion before the query read them fail it (``failOnDataLoss``), naming them. The read limits
share each trigger's budget across the recordings and cut it at frame boundaries from the headers.
``timestamp`` is the recorder's append time by default (the append-time index).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, Filter, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from logbuf.archive.catalog import CatalogError, RecordingDescriptor, RecordingState
from logbuf.archive.segments import segment_base_position, segment_file_name
from logbuf.archive.spark_filters import TIMESTAMP_COLUMN, IntRange, PushedFilters, split_filters
from logbuf.archive.spark_frames import (
    TIMESTAMP_UNITS_US,
    Mode,
    Rows,
    RowSpec,
    arrow_schema,
    build_batch,
    parse_chunk,
    problem_batch,
    select_rows,
)
from logbuf.archive.spark_offsets import (
    BY_TIME,
    EARLIEST,
    LATEST,
    OffsetsError,
    OffsetSpec,
    cut_bytes,
    cut_rows,
    fair_shares,
    frame_boundary_at_or_before,
    parse_offsets,
    parse_size,
)
from logbuf.archive.spark_topics import TopicNames, definitions_in
from logbuf.archive.storage import (
    ArchiveLocation,
    StorageError,
    expand_locations,
    has_glob,
    open_catalog,
    parse_location,
    read_append_times,
    read_segment,
    read_time_index,
)
from logbuf.archive.time_index import AppendTimes, segment_may_match
from logbuf.archive.verify import descriptor_problem
from logbuf.errors import LogbufError
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logging_config import library_logger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "LogbufDataSource",
    "check_executor_python",
    "LogbufFilteringReader",
    "LogbufReader",
    "LogbufSourceError",
    "ProblemPartition",
    "LogbufStreamReader",
    "PackedPartition",
    "ReadOptions",
    "SegmentPartition",
    "planned_segments",
    "progress_bytes",
    "ProgressBytes",
    "register",
]

FORMAT_NAME: Final[str] = "logbuf"
DEFAULT_CORRUPT_COLUMN: Final[str] = "_corrupt_record"
ARCHIVE_COLUMN: Final[str] = "archive"
"""First column when several archives are read: the archive's path or URI."""
DEFAULT_BATCH_BYTES: Final[int] = 16 * 1024 * 1024
"""Bytes of segment parsed per Arrow batch (rounded to whole terms): larger batches amortise the
per-batch cost, smaller ones bound executor memory (about 3x this per task)."""
_MAX_POSITION: Final[int] = (1 << 63) - 1
DEFAULT_MAX_PARTITION_BYTES: Final[int] = 64 * 1024 * 1024
"""Segment bytes packed into one Spark partition (``maxPartitionBytes``), as Spark packs small files up to
``spark.sql.files.maxPartitionBytes``: each task costs Spark a fixed amount (scheduling, a Python worker's
round trip), which dominated reads of small segments and small micro-batches (one task per segment piece)."""

_COLUMNS: Final[tuple[tuple[str, DataType], ...]] = (
    ("recording_id", LongType()),
    ("stream_id", IntegerType()),
    ("session_id", IntegerType()),
    ("term_id", IntegerType()),
    ("term_offset", IntegerType()),
    ("position", LongType()),
    ("flags", IntegerType()),
    ("reserved_value", LongType()),
    ("timestamp", TimestampType()),
    ("topic", StringType()),
    ("payload", BinaryType()),
)
"""The columns (all nullable: a PERMISSIVE corrupt row has nulls); spark_frames.arrow_schema matches."""


class LogbufSourceError(LogbufError, ValueError):
    """A bad option, or a corrupt frame in FAILFAST mode (the message names the value or position)."""


def register(spark: SparkSession, *, check_executors: bool = True) -> None:
    """Make ``format("logbuf")`` available in this session (batch and streaming), with filter pushdown
    enabled (``spark.sql.python.filterPushdown.enabled``; a session without it reads without pushdown).

    ``check_executors``: first run one small task to check that the executors' Python can import the
    source (:func:`check_executor_python`), so that a cluster without logbuf fails here, naming the
    cause, rather than in the first query with an import error about one of its dependencies."""
    if check_executors and not _is_connect(spark):
        check_executor_python(spark)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(LogbufDataSource)


_EXECUTOR_MODULES: Final[tuple[str, ...]] = ("pyarrow", "numpy", "logbuf.archive.spark")


_PROBE_SOURCE: Final[str] = """
def probe(names):
    import importlib
    import sys

    problem = ""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:
            problem = "import %s: %s: %s" % (name, type(e).__name__, e)
            break
    yield sys.executable, problem
"""
"""The task that imports the source's modules on an executor. Compiled from text, so that Spark pickles
the function itself rather than a reference to this module, which an executor without logbuf cannot
import (the failure would then name cloudpickle's import, not the cause)."""


def _probe() -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(_PROBE_SOURCE, "<logbuf executor check>", "exec"), namespace)  # noqa: S102 - our own text
    return namespace["probe"]


def check_executor_python(spark: SparkSession) -> None:
    """Import the source's modules in one task on the executors; LogbufSourceError saying that logbuf is
    not installed in the executors' Python (``spark.pyspark.python``), with the import that failed."""
    context = spark.sparkContext
    names = list(_EXECUTOR_MODULES)
    try:
        found = context.parallelize([names], 1).flatMap(_probe()).collect()
    except Exception as e:  # noqa: BLE001 - the executors' Python could not run a task at all
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        found = [("?", f"a Python task failed on the executors: {first}")]
    for executable, problem in found:
        if problem:
            configured = context.getConf().get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
            raise LogbufSourceError(
                f"logbuf is not installed in the executors' Python ({executable}; spark.pyspark.python="
                f"{configured or 'unset'}): {problem}. Install logbuf there, point spark.pyspark.python "
                "(and PYSPARK_PYTHON for spark-sql) at a Python that has it, or ship one with --archives "
                "(docs/guides/spark.md: Shipping the environment)"
            )


def _is_connect(spark: SparkSession) -> bool:
    """A Spark Connect session (no SparkContext: its server's executors are checked by its first query)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


@dataclass(frozen=True)
class ProgressBytes:
    """A micro-batch's bytes, from its progress's offsets (Spark shows no input bytes for a Python source)."""

    input_bytes: int
    """Recorded bytes the micro-batch read: ``endOffset - startOffset`` summed over the recordings (a recording
    without a start offset counts from position 0)."""
    lag_bytes: int
    """Recorded bytes available but not read yet: ``latestOffset - endOffset`` summed."""
    per_recording: dict[str, int]
    """Input bytes per recording id."""


def progress_bytes(progress: Any, source: int = 0) -> ProgressBytes:
    """The input and lag bytes of one micro-batch of a ``format("logbuf")`` stream, from its
    ``StreamingQueryProgress`` (``query.lastProgress``, a listener's ``event.progress``, or its JSON text).

    Spark reports ``inputBytes`` (task input metrics) as 0 for every Python data source, and a Python source
    cannot add metrics to the progress (Spark 4.3's Python micro-batch stream does not implement
    ``ReportsSourceMetrics`` and its partition readers do not update input metrics); our offsets are recorded
    positions, so their differences are exactly the bytes read and the bytes behind."""
    if isinstance(progress, str):
        progress = json.loads(progress)
    found = progress["sources"][source]

    def offsets(key: str) -> dict[str, int]:
        value = found[key]
        if isinstance(value, str):
            value = json.loads(value)
        return {str(k): int(v) for k, v in (value or {}).items()}

    start, end, latest = offsets("startOffset"), offsets("endOffset"), offsets("latestOffset")
    per_recording = {k: v - start.get(k, 0) for k, v in end.items() if v > start.get(k, 0)}
    lag = sum(max(0, v - end.get(k, 0)) for k, v in latest.items())
    return ProgressBytes(sum(per_recording.values()), lag, per_recording)


# -- options --------------------------------------------------------------------------------------
_OPTIONS: Final[tuple[str, ...]] = (
    "path",
    "paths",
    "recordingId",
    "streamId",
    "startPosition",
    "stopPosition",
    "rowsPer",
    "timestampFrom",
    "timestampUnit",
    "mode",
    "columnNameOfCorruptRecord",
    "batchBytes",
    "filterPushdown",
    "startingPositions",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "failOnDataLoss",
    "minPartitions",
    "maxPartitionBytes",
    "maxBytesPerTrigger",
    "maxRecordsPerTrigger",
)
"""Every option the source reads; any other is an error (a misspelt ``streamIds`` must not read all)."""
TIMESTAMP_SOURCES: Final[tuple[str, ...]] = ("append_time", "reserved_value", "none")
"""``timestampFrom``: the recorder's append time (default), the publisher's reserved value, or null."""
_TABLE_KEYS: Final[frozenset[str]] = frozenset({"location", "owner", "provider", "comment", "external"})
"""Keys Spark adds when ``CREATE TABLE ... USING logbuf`` asks for the schema (not options)."""
_TABLE_OPTIONS_METADATA: Final[str] = "logbuf.options"
"""Schema field metadata that carries a catalog table's options from CREATE TABLE to its queries: Spark
keeps a Python data source table's schema but calls its reader with no options (Spark 4.3)."""
TIMESTAMP_RANGE_US: Final[tuple[int, int]] = (-62_135_596_800_000_000, 253_402_300_799_999_999)
"""Spark's TIMESTAMP range, 0001-01-01 to 9999-12-31 23:59:59.999999 UTC, in epoch microseconds."""


@dataclass(frozen=True)
class ReadOptions:
    """The data source's options, validated (errors name the option and the value).

    ``path``: the archive directory (or ``.load(dir)``; a ``file:`` URI too). ``recordingId`` /
    ``streamId``: one id or a comma-separated list. ``startPosition`` / ``stopPosition``: rows with
    ``startPosition < position <= stopPosition``. ``rowsPer``: ``message`` (default, fragments
    reassembled) or ``frame``. ``timestampFrom``: ``append_time`` (default: when the recorder appended
    the row's last frame), ``none`` (null) or ``reserved_value`` with ``timestampUnit`` ``s``, ``ms``,
    ``us`` (default: the jetstream relay stamps epoch microseconds) or ``ns``; a reserved value of 0
    gives null. ``mode``: PERMISSIVE (default), DROPMALFORMED, FAILFAST; ``columnNameOfCorruptRecord``.
    ``filterPushdown``: ``true`` (default) or ``false``. ``startingOffsets``, ``endingOffsets``,
    ``startingTimestamp``, ``endingTimestamp``, ``failOnDataLoss``, ``minPartitions``: see
    :mod:`archive.spark_offsets` and protocol_spec/spark-source.md. Streaming only:
    ``maxBytesPerTrigger`` (a size such as ``4m``) or ``maxRecordsPerTrigger``. Any other option is an
    error.
    """

    archive_dir: str
    """The archive (a path or URI, maybe a glob), or the first of several."""
    recording_ids: frozenset[int] | None = None
    stream_ids: frozenset[int] | None = None
    start_position: int = -1
    stop_position: int = _MAX_POSITION
    per_message: bool = True
    timestamp_unit: str | None = None
    append_time: bool = True
    """``timestampFrom=append_time`` (the default): the recorder's append time."""
    mode: Mode = Mode.PERMISSIVE
    corrupt_column: str = DEFAULT_CORRUPT_COLUMN
    starting: OffsetSpec = field(default_factory=lambda: OffsetSpec(EARLIEST))
    """``startingOffsets`` (``startingPositions`` is the same with only earliest or latest)."""
    ending: OffsetSpec = field(default_factory=lambda: OffsetSpec(LATEST))
    """``endingOffsets``."""
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    """``maxPartitionBytes``: segment pieces (of any recordings) are packed into one Spark partition up to this
    many bytes (0: one partition per piece)."""
    """``minPartitions``: split the largest segments at term boundaries until there are this many."""
    columns: tuple[str, ...] | None = None
    """The columns of a user schema that is part of the source's (``.schema(...)``), None for all: a
    schema without ``payload`` reads no payload bytes."""
    batch_bytes: int = DEFAULT_BATCH_BYTES
    filter_pushdown: bool = True
    max_bytes_per_trigger: int | None = None
    max_records_per_trigger: int | None = None
    table_options: tuple[tuple[str, str], ...] = ()
    """The options as given, when they come from ``CREATE TABLE ... USING logbuf`` (kept in the schema)."""
    archives: tuple[str, ...] = ()
    """Every archive path or URI given (``path``, or ``paths`` from ``.load([...])``), globs unexpanded."""

    @property
    def several(self) -> bool:
        """Several archives (a list, or a glob): rows then carry an ``archive`` column, since recording
        ids repeat across archives."""
        return len(self.archives) > 1 or any(has_glob(a) for a in self.archives)

    def locations(self) -> list[ArchiveLocation]:
        """The archives, globs expanded (on the driver: a glob lists directories)."""
        try:
            return expand_locations(self.archives)
        except StorageError as e:
            raise LogbufSourceError(str(e)) from None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        lowered = {k.lower(): str(v) for k, v in options.items()}
        table = "provider" in lowered  # CREATE TABLE: Spark's table keys come along with the options
        known = {name.lower() for name in _OPTIONS}
        unknown = sorted(
            key
            for key in lowered
            if key not in known and not (table and (key in _TABLE_KEYS or key.startswith("option.")))
        )
        if unknown:
            names = {k.lower(): k for k in options}
            by_lower = {n.lower(): n for n in _OPTIONS}

            def hint(key: str) -> str:
                close = difflib.get_close_matches(key, list(by_lower), 1)
                return repr(names[key]) + (f" (did you mean {by_lower[close[0]]!r}?)" if close else "")

            raise LogbufSourceError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(hint, unknown))} "
                f"for format('logbuf'); the options are: {', '.join(_OPTIONS)}"
            )

        def get(name: str) -> str | None:
            value = lowered.get(name.lower())
            return None if value is None or value == "" else value

        single = get("path")
        archives = _paths_option(get("paths")) or ([single] if single else [])
        if not archives:
            raise LogbufSourceError("no archive directory: give .load(archive_dir) or .option('path', archive_dir)")
        try:
            archives = [parse_location(a).uri for a in archives]
        except StorageError as e:
            raise LogbufSourceError(str(e)) from None
        archive_dir = archives[0]
        mode_text = (get("mode") or "PERMISSIVE").upper()
        try:
            mode = Mode(mode_text)
        except ValueError:
            raise LogbufSourceError(f"mode={mode_text!r} must be PERMISSIVE, DROPMALFORMED or FAILFAST") from None
        rows_per = (get("rowsPer") or "message").lower()
        if rows_per not in ("message", "frame"):
            raise LogbufSourceError(f"rowsPer={rows_per!r} must be 'message' or 'frame'")
        timestamp_from = (get("timestampFrom") or "append_time").lower()
        if timestamp_from not in TIMESTAMP_SOURCES:
            raise LogbufSourceError(f"timestampFrom={timestamp_from!r} must be one of {', '.join(TIMESTAMP_SOURCES)}")
        unit = (get("timestampUnit") or "us").lower()
        if unit not in TIMESTAMP_UNITS_US:
            raise LogbufSourceError(f"timestampUnit={unit!r} must be one of {', '.join(TIMESTAMP_UNITS_US)}")
        old_starting = get("startingPositions")
        if old_starting is not None and old_starting.lower() not in ("earliest", "latest"):
            raise LogbufSourceError(f"startingPositions={old_starting!r} must be 'earliest' or 'latest'")
        if old_starting is not None and get("startingOffsets") is not None:
            raise LogbufSourceError("startingPositions and startingOffsets: give one of them (startingOffsets)")
        fail_on_loss = (get("failOnDataLoss") or "true").lower()
        if fail_on_loss not in ("true", "false"):
            raise LogbufSourceError(f"failOnDataLoss={fail_on_loss!r} must be 'true' or 'false'")
        try:
            starting = parse_offsets("startingOffsets", get("startingOffsets") or old_starting, EARLIEST)
            ending = parse_offsets("endingOffsets", get("endingOffsets"), LATEST)
            starting = dataclasses.replace(starting, timestamp_ms=_time_ms_option(get, "startingTimestamp"))
            ending = dataclasses.replace(ending, timestamp_ms=_time_ms_option(get, "endingTimestamp"))
            max_bytes = _size_option(get, "maxBytesPerTrigger")
        except OffsetsError as e:
            raise LogbufSourceError(str(e)) from None
        corrupt_column = get("columnNameOfCorruptRecord") or DEFAULT_CORRUPT_COLUMN
        if corrupt_column in [name for name, _ in _COLUMNS]:
            raise LogbufSourceError(f"columnNameOfCorruptRecord={corrupt_column!r} is already a column")
        start = _int_option(get, "startPosition", -1)
        stop = _int_option(get, "stopPosition", _MAX_POSITION)
        if stop < start:
            raise LogbufSourceError(f"stopPosition={stop} is before startPosition={start}")
        batch_bytes = _int_option(get, "batchBytes", DEFAULT_BATCH_BYTES)
        if batch_bytes <= 0:
            raise LogbufSourceError(f"batchBytes={batch_bytes} must be positive")
        pushdown = (get("filterPushdown") or "true").lower()
        if pushdown not in ("true", "false"):
            raise LogbufSourceError(f"filterPushdown={pushdown!r} must be 'true' or 'false'")
        max_records = _positive_option(get, "maxRecordsPerTrigger")
        try:
            unpacked = (get("maxPartitionBytes") or "").strip() == "0"
            max_partition_bytes = 0 if unpacked else _size_option(get, "maxPartitionBytes")
        except OffsetsError as e:
            raise LogbufSourceError(str(e)) from None
        if max_partition_bytes is None:
            max_partition_bytes = DEFAULT_MAX_PARTITION_BYTES
        if max_bytes is not None and max_records is not None:
            raise LogbufSourceError(
                f"maxBytesPerTrigger={max_bytes} and maxRecordsPerTrigger={max_records}: give one of them"
            )
        return cls(
            archive_dir=archive_dir,
            recording_ids=_ids_option(get, "recordingId"),
            stream_ids=_ids_option(get, "streamId"),
            start_position=start,
            stop_position=stop,
            per_message=rows_per == "message",
            timestamp_unit=unit if timestamp_from == "reserved_value" else None,
            append_time=timestamp_from == "append_time",
            mode=mode,
            corrupt_column=corrupt_column,
            starting=starting,
            ending=ending,
            fail_on_data_loss=fail_on_loss == "true",
            min_partitions=_positive_option(get, "minPartitions"),
            max_partition_bytes=max_partition_bytes,
            batch_bytes=batch_bytes,
            filter_pushdown=pushdown == "true",
            max_bytes_per_trigger=max_bytes,
            max_records_per_trigger=max_records,
            table_options=tuple(sorted((k, str(v)) for k, v in options.items() if k.lower() in known) if table else ()),
            archives=tuple(archives),
        )

    @property
    def row_spec(self) -> RowSpec:
        payload = self.columns is None or "payload" in self.columns
        return RowSpec(self.per_message, self.timestamp_unit, payload, self.append_time)

    @property
    def corrupt_column_or_none(self) -> str | None:
        return self.corrupt_column if self.mode is Mode.PERMISSIVE else None

    def schema(self) -> StructType:
        fields = [StructField(name, data_type) for name, data_type in _COLUMNS]
        if self.several:
            fields.insert(0, StructField(ARCHIVE_COLUMN, StringType()))
        if self.table_options:  # CREATE TABLE: the table keeps its options in its schema
            first = fields[0]
            shown = ", ".join(f"{k}={v}" for k, v in self.table_options)
            metadata = {_TABLE_OPTIONS_METADATA: json.dumps(dict(self.table_options)), "comment": f"logbuf: {shown}"}
            fields[0] = StructField(first.name, first.dataType, first.nullable, metadata)
        if self.mode is Mode.PERMISSIVE:
            fields.append(StructField(self.corrupt_column, StringType()))
        return StructType(fields)

    def wants(self, d: RecordingDescriptor) -> bool:
        return (
            d.state == RecordingState.VALID
            and (self.recording_ids is None or d.recording_id in self.recording_ids)
            and (self.stream_ids is None or d.stream_id in self.stream_ids)
        )


_PLANNER_FILE: Final[str] = os.path.join("worker", "plan_data_source_read.py")


def _planner_allows_pushdown() -> bool:
    """False when the reader is being made by Spark's planner for a session with
    ``spark.sql.python.filterPushdown.enabled`` false, which refuses a reader that takes filters
    (``DATA_SOURCE_PUSHDOWN_DISABLED``). Spark (4.3) does not tell the data source; its planner holds the
    setting in a local variable (``enable_pushdown``) of the frame that calls ``reader()``."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_PLANNER_FILE) and "enable_pushdown" in frame.f_locals:
            return bool(frame.f_locals["enable_pushdown"])
        frame = frame.f_back  # type: ignore[assignment]
    return True


def _options_for(options: Mapping[str, str], schema: StructType | None) -> Mapping[str, str]:
    """The options a reader uses: those given, or a catalog table's (kept in its schema) when Spark gives
    none, as it does for ``SELECT`` from a table made by ``CREATE TABLE ... USING logbuf``."""
    if options or schema is None or not schema.fields:
        return options
    stored = schema.fields[0].metadata.get(_TABLE_OPTIONS_METADATA)
    return json.loads(stored) if stored else options


def _paths_option(text: str | None) -> list[str]:
    """Spark's ``paths`` (from ``.load([a, b])``): a JSON array of strings."""
    if text is None:
        return []
    try:
        paths = json.loads(text)
    except ValueError:
        raise LogbufSourceError(f"paths={text!r} is not a JSON array of archive paths") from None
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise LogbufSourceError(f"paths={text!r} is not a JSON array of archive paths")
    return paths


def _int_option(get: Any, name: str, default: int) -> int:
    text = get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise LogbufSourceError(f"{name}={text!r} is not an integer") from None


def _time_ms_option(get: Any, name: str) -> int | None:
    text = get(name)
    if text is None:
        return None
    value = _int_option(get, name, 0)
    if value < 0:
        raise LogbufSourceError(f"{name}={value} must be epoch milliseconds (>= 0)")
    return value


def _size_option(get: Any, name: str) -> int | None:
    text = get(name)
    return None if text is None else parse_size(name, text)


def _positive_option(get: Any, name: str) -> int | None:
    if get(name) is None:
        return None
    value = _int_option(get, name, 0)
    if value <= 0:
        raise LogbufSourceError(f"{name}={value} must be positive")
    return value


def _ids_option(get: Any, name: str) -> frozenset[int] | None:
    text = get(name)
    if text is None:
        return None
    try:
        return frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise LogbufSourceError(f"{name}={text!r} must be an integer or a comma-separated list of them") from None


# -- partitions -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SegmentPartition(InputPartition):
    """One segment file's share of a read: rows with ``from_position < position <= to_position``.

    Parsing runs over ``[parse_start, parse_stop)``: ``parse_start`` is a frame start (the
    recording's start, a term start, or a recorded position), ``parse_stop`` the end of a term or
    a recorded stop position, so the frame chain must end exactly there.
    """

    archive_dir: str
    """The archive's path or URI."""
    recording: RecordingDescriptor
    base_position: int
    parse_start: int
    parse_stop: int
    from_position: int
    to_position: int
    check_mid_message: bool = False
    """``parse_start`` is a recorded position that may fall inside a fragmented message: if the
    frame there is a middle or last fragment, parse from the start of its term instead."""
    topics: tuple[tuple[int, str], ...] = ()
    """(topic id, name) of the recording's topics defined before ``parse_start`` (found on the driver); the
    partition learns those defined in its own range as it parses."""
    value: Any = field(default=None, compare=False)

    @property
    def location(self) -> ArchiveLocation:
        return ArchiveLocation(self.archive_dir)

    @property
    def path(self) -> str:
        return self.location.file_path(segment_file_name(self.recording.recording_id, self.base_position))


@dataclass(frozen=True)
class ProblemPartition(InputPartition):
    """A recording the catalog lost or describes impossibly: one corrupt-record row (PERMISSIVE)."""

    recording_id: int
    stream_id: int | None
    session_id: int | None
    reason: str
    archive_dir: str = ""
    value: Any = field(default=None, compare=False)


def plan_partitions(
    options: ReadOptions,
    d: RecordingDescriptor,
    from_position: int,
    to_position: int,
    *,
    from_is_frame_start: bool,
    archive: str | None = None,
) -> list[SegmentPartition]:
    """Partitions (one per segment) for rows of ``d`` with ``from_position < position <= to_position``.

    ``to_position`` is capped at the recorded stop position; with ``from_is_frame_start`` the
    range starts at a recorded position, else parsing starts at the term holding it.
    """
    start, stop = d.start_position, d.stop_position
    to_position = min(to_position, stop)
    from_position = max(from_position, start)
    if to_position <= from_position:
        return []
    term_mask = d.term_length - 1
    if from_position == start or from_is_frame_start:
        first_parse = from_position
    else:
        first_parse = max(start, from_position - (from_position & term_mask))
    last_term_end = (to_position - 1) - ((to_position - 1) & term_mask) + d.term_length
    parse_stop_all = min(stop, last_term_end)
    partitions = []
    base = segment_base_position(start, first_parse, d.term_length, d.segment_length)
    while base < parse_stop_all:
        segment_end = base + d.segment_length
        parse_start = max(first_parse, base)
        partitions.append(
            SegmentPartition(
                archive_dir=options.archive_dir if archive is None else archive,
                recording=d,
                base_position=base,
                parse_start=parse_start,
                parse_stop=min(parse_stop_all, segment_end),
                from_position=max(from_position, base),
                to_position=min(to_position, segment_end),
                check_mid_message=options.per_message and from_is_frame_start and parse_start == from_position,
            )
        )
        base = segment_end
    return partitions


def _with_topics(partitions: list[SegmentPartition], names: TopicNames) -> list[SegmentPartition]:
    """``partitions`` (of one recording) with the names of the topics defined before them."""
    if not partitions:
        return partitions
    first = partitions[0]
    found = names.before(first.location, first.recording, max(p.parse_start for p in partitions))
    if not found:
        return partitions
    topics = tuple(sorted(found.items()))
    return [dataclasses.replace(p, topics=topics) for p in partitions]


def split_partitions(partitions: list[InputPartition], min_partitions: int | None) -> list[InputPartition]:
    """Split the largest segment partitions at term boundaries (a term starts with a frame and no message
    crosses one, so each row falls in exactly one half) until there are ``min_partitions`` or no partition
    holds more than one term."""
    if min_partitions is None or len(partitions) >= min_partitions:
        return partitions
    result = list(partitions)
    while len(result) < min_partitions:
        sizes = [
            (p.parse_stop - p.parse_start, i)
            for i, p in enumerate(result)
            if isinstance(p, SegmentPartition) and _term_after(p) < p.parse_stop
        ]
        if not sizes:
            break
        _, i = max(sizes)
        p = result[i]
        assert isinstance(p, SegmentPartition)
        mask = p.recording.term_length - 1
        middle = p.parse_start + (p.parse_stop - p.parse_start) // 2
        cut = max(_term_after(p), middle - (middle & mask))
        result[i : i + 1] = [
            dataclasses.replace(p, parse_stop=cut, to_position=min(p.to_position, cut)),
            dataclasses.replace(p, parse_start=cut, from_position=max(p.from_position, cut), check_mid_message=False),
        ]
    return result


@dataclass(frozen=True)
class PackedPartition(InputPartition):
    """Several segment pieces read by one Spark task, in order (:func:`pack_partitions`)."""

    pieces: tuple[SegmentPartition, ...]
    value: Any = field(default=None, compare=False)


def pack_partitions(partitions: list[InputPartition], options: ReadOptions) -> list[InputPartition]:
    """Pack consecutive segment pieces into partitions of at most ``maxPartitionBytes`` parsed bytes (and no
    fewer partitions than ``minPartitions`` asks for); a piece larger than that stays alone, a problem row too."""
    target = options.max_partition_bytes
    pieces = [p for p in partitions if isinstance(p, SegmentPartition)]
    if target <= 0 or len(pieces) < 2:
        return partitions
    if options.min_partitions is not None:
        total = sum(p.parse_stop - p.parse_start for p in pieces)
        target = min(target, -(-total // options.min_partitions))
    packed: list[InputPartition] = [p for p in partitions if not isinstance(p, SegmentPartition)]
    group: list[SegmentPartition] = []
    size = 0
    for p in pieces:
        length = p.parse_stop - p.parse_start
        if group and size + length > target:
            packed.append(group[0] if len(group) == 1 else PackedPartition(tuple(group)))
            group, size = [], 0
        group.append(p)
        size += length
    if group:
        packed.append(group[0] if len(group) == 1 else PackedPartition(tuple(group)))
    return packed


def planned_segments(partitions: Iterable[InputPartition]) -> list[SegmentPartition]:
    """The segment pieces of planned partitions, packed or not, in order (what a plan reads)."""
    return [piece for p in partitions for piece in _pieces(p) if isinstance(piece, SegmentPartition)]


def _pieces(partition: InputPartition) -> Sequence[SegmentPartition | ProblemPartition]:
    """What one Spark partition reads (nothing for the placeholder Spark reads when there are none)."""
    if isinstance(partition, PackedPartition):
        return partition.pieces
    if isinstance(partition, (SegmentPartition, ProblemPartition)):
        return (partition,)
    return ()


def _term_after(p: SegmentPartition) -> int:
    """The first term boundary after ``p``'s parse start."""
    return p.parse_start - (p.parse_start & (p.recording.term_length - 1)) + p.recording.term_length


def _append_time_positions(
    location: ArchiveLocation, d: RecordingDescriptor, times: IntRange
) -> tuple[int, int] | None:
    """The rows of ``d`` whose append time may lie in ``times`` (epoch µs), as a range of positions
    (rows with ``from < position <= to``); None when none can (no append-time index: every timestamp is
    null). Append times never go back, so the entries in the range are contiguous."""
    appends = read_append_times(location, d.recording_id)
    if appends is None or not len(appends.position):
        return None
    n = len(appends.position)
    low, high = times.low, times.high
    a = 0 if low is None else int(np.searchsorted(appends.time_us, low, side="left"))
    b = n if high is None else int(np.searchsorted(appends.time_us, high, side="right"))
    if a >= b:
        return None
    return int(appends.position[a]), _MAX_POSITION if b == n else int(appends.position[b])


def _in_time_range(partitions: list[SegmentPartition], times: IntRange, options: ReadOptions) -> list[SegmentPartition]:
    """The partitions whose segment may hold a row with a timestamp in ``times`` (epoch µs), by the
    recording's time index; a segment the index does not cover is kept."""
    assert options.timestamp_unit is not None
    first = partitions[0]
    index = read_time_index(first.location, first.recording.recording_id)
    if not index:
        return partitions
    to_us = TIMESTAMP_UNITS_US[options.timestamp_unit]
    values = None if times.values is None else frozenset(v for v in times.values if times.contains(v))
    return [
        p
        for p in partitions
        if segment_may_match(index.get(p.base_position), times.low, times.high, values, to_us, TIMESTAMP_RANGE_US)
    ]


@dataclass(frozen=True)
class _Planned:
    archive: str
    recording: RecordingDescriptor


def _catalog_view(
    options: ReadOptions, ids: IntRange | None = None, locations: Sequence[ArchiveLocation] | None = None
) -> tuple[list[_Planned], list[ProblemPartition]]:
    """The wanted recordings whose descriptors can be read, and a :class:`ProblemPartition` for each
    damaged or impossible entry that may be wanted (its stream id may be unknown), over every archive.
    FAILFAST raises for the first problem; DROPMALFORMED logs each one and drops it."""
    good: list[_Planned] = []
    problems: list[ProblemPartition] = []
    for location in options.locations() if locations is None else locations:
        with open_catalog(location) as catalog:
            descriptors = catalog.recordings()
            damaged = catalog.problems()
        problems += [
            ProblemPartition(p.first_recording_id, None, None, p.reason, location.uri)
            for p in damaged
            if _may_hold(options.recording_ids, ids, p.first_recording_id, p.last_recording_id)
        ]
        for d in descriptors:
            if not options.wants(d) or (ids is not None and not ids.contains(d.recording_id)):
                continue
            reason = descriptor_problem(d)
            if reason is None:
                good.append(_Planned(location.uri, d))
            else:
                problems.append(ProblemPartition(d.recording_id, d.stream_id, d.session_id, reason, location.uri))
    if problems and options.mode is Mode.FAILFAST:
        raise LogbufSourceError(f"damaged catalog (mode FAILFAST): {problems[0].reason}")
    if problems and options.mode is Mode.DROPMALFORMED:
        for problem in problems:
            library_logger(role="spark-source").warning(
                "catalog.problem_dropped", recording_id=problem.recording_id, reason=problem.reason
            )
        problems = []
    return good, problems


def _may_hold(chosen: frozenset[int] | None, ids: IntRange | None, first: int, last: int) -> bool:
    """Whether recordings ``first..last`` may include one the ``recordingId`` option and filters select."""
    if chosen is not None and not any(first <= r <= last for r in chosen):
        return False
    if ids is None:
        return True
    if ids.values is not None:
        return any(first <= r <= last and ids.contains(r) for r in ids.values)
    return (ids.lo is None or ids.lo <= last) and (ids.hi is None or ids.hi >= first)


def _resolve_offset(o: ReadOptions, d: RecordingDescriptor, name: str, value: int, location: ArchiveLocation) -> int:
    """A ``startingOffsets`` / ``endingOffsets`` value for ``d`` as a position, checked against the catalog:
    before the recording's start is data loss (retention removed it), past the end of a stopped recording
    an error. A time (``startingTimestamp`` / ``endingTimestamp``) is the first position appended at or
    after it (the recording's end if none is)."""
    if value == BY_TIME:
        spec = o.starting if name == "startingOffsets" else o.ending
        assert spec.timestamp_ms is not None
        appends = read_append_times(location, d.recording_id)
        if appends is None:
            raise LogbufSourceError(
                f"{'startingTimestamp' if spec is o.starting else 'endingTimestamp'}: recording {d.recording_id} "
                "has no append-time index (recorded before it existed, or with --no-time-index); "
                "give its position in startingOffsets/endingOffsets instead"
            )
        found = appends.first_position_at_or_after(spec.timestamp_ms * 1000)
        return d.stop_position if found is None else max(d.start_position, min(found, d.stop_position))
    if value == EARLIEST:
        return d.start_position
    if value == LATEST:
        return d.stop_position
    if value < d.start_position:
        on_data_loss(o, d.recording_id, value, d.start_position, f"{name} asks for position {value}")
        return d.start_position
    if value > d.stop_position and not d.active:
        raise LogbufSourceError(
            f"{name}: recording {d.recording_id} stopped at position {d.stop_position}; position {value} is past its end"
        )
    return value


def on_data_loss(o: ReadOptions, recording_id: int, lost_from: int, lost_to: int, why: str) -> None:
    """Positions ``lost_from..lost_to`` of a recording were removed before they were read: the query fails
    (``failOnDataLoss``, the default) naming them, or they are skipped with a warning."""
    text = (
        f"recording {recording_id}: positions {lost_from} to {lost_to} are no longer in the archive "
        f"(removed by retention or deletion) and were not read; {why}"
    )
    if o.fail_on_data_loss:
        raise LogbufSourceError(
            f"data loss: {text}. Set failOnDataLoss=false to skip them (the query then goes on from {lost_to})"
        )
    library_logger(role="spark-source").warning(
        "stream.data_lost", recording_id=recording_id, lost_from=lost_from, lost_to=lost_to, reason=why
    )


def _check_named_recordings(o: ReadOptions, planned: Sequence[_Planned]) -> None:
    """Recording ids in ``startingOffsets`` / ``endingOffsets`` must be recordings the read can see."""
    named = set(o.starting.positions) | set(o.ending.positions)
    if not named:
        return
    known = {item.recording.recording_id for item in planned}
    unknown = sorted(named - known)
    if unknown:
        raise LogbufSourceError(
            f"startingOffsets/endingOffsets name recording{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(str, unknown))}, not among the recordings read "
            f"({', '.join(map(str, sorted(known))) or 'none'})"
        )


def _with_schema(options: ReadOptions, schema: StructType) -> ReadOptions:
    """``options`` for reading ``schema``: the source's schema, or some of its columns in its order (a
    user schema: the columns left out are not read, so one without ``payload`` copies no payload byte)."""
    expected = options.schema()
    given = [(f.name, f.dataType) for f in schema.fields]
    full = [(f.name, f.dataType) for f in expected.fields]
    if given == full:
        return options
    it = iter(full)
    if given and all(any(column == candidate for candidate in it) for column in given):
        return dataclasses.replace(options, columns=tuple(name for name, _ in given))
    raise LogbufSourceError(
        f"the logbuf source's schema for mode {options.mode.value} is {expected.simpleString()}; "
        f"got {schema.simpleString()}: a user schema may leave columns out but not rename, retype or "
        "reorder them (select or cast columns after loading instead)"
    )


# -- reading a partition (executors) ----------------------------------------------------------------
def read_partition(
    partition: SegmentPartition | ProblemPartition, options: ReadOptions, pushed: PushedFilters | None = None
) -> Iterator[pa.RecordBatch]:
    """The Arrow batches of one partition (a generator, as Spark requires), filtered by ``pushed``."""
    warned = False
    for batch in _read_unfiltered(partition, options, pushed):
        _check_timestamps(batch, options)
        if not warned and isinstance(partition, SegmentPartition):
            warned = _warn_if_1970(batch, options, partition.recording)
        if options.several:
            batch = _with_archive(batch, partition.archive_dir)
        if pushed is not None:
            batch = pushed.keep(batch)
        if options.columns is not None:
            batch = batch.select(list(options.columns))
        if batch.num_rows:
            yield batch


def _with_archive(batch: pa.RecordBatch, archive: str) -> pa.RecordBatch:
    column = pa.array([archive] * batch.num_rows, pa.string())
    return pa.RecordBatch.from_arrays(
        [column, *batch.columns], schema=batch.schema.insert(0, pa.field(ARCHIVE_COLUMN, pa.string()))
    )


def _read_unfiltered(
    partition: SegmentPartition | ProblemPartition, options: ReadOptions, pushed: PushedFilters | None = None
) -> Iterator[pa.RecordBatch]:
    schema = arrow_schema(options.corrupt_column_or_none)
    if isinstance(partition, ProblemPartition):
        if options.mode is Mode.PERMISSIVE:  # the other modes dealt with it when planning
            p = partition
            yield problem_batch(schema, p.recording_id, p.stream_id, p.session_id, p.reason)
        return
    d = partition.recording
    spec = options.row_spec
    base = partition.base_position
    first_term = partition.parse_start - (partition.parse_start & (d.term_length - 1))  # a mid-message start backs up
    with contextlib.ExitStack() as stack:
        try:
            segment, offset = stack.enter_context(
                read_segment(
                    partition.location,
                    d.recording_id,
                    base,
                    d.segment_length,
                    max(0, first_term - base),
                    partition.parse_stop - base,
                )
            )
        except FileNotFoundError:
            reason = f"segment file {partition.path} is missing"
            batch = _on_corruption(options, d, partition.parse_start, reason, partition.parse_stop, schema, spec)
            if batch is not None:
                yield batch
            return
        appends = read_append_times(partition.location, d.recording_id) if options.append_time else None
        yield from _read_segment(segment, base + offset, partition, options, schema, spec, appends, pushed)
        del segment  # so that the mapping closes now


_RECENT_US: Final[int] = 315_532_800_000_000
"""1980-01-01 in epoch µs: a reserved-value timestamp before it, in a recording made after it, is a
wrong ``timestampUnit`` (epoch microseconds read as nanoseconds give January 1970)."""


def _warn_if_1970(batch: pa.RecordBatch, options: ReadOptions, d: RecordingDescriptor) -> bool:
    """Warn (once per partition: returns True) when ``timestampUnit`` turns recent data into dates in 1970."""
    if options.timestamp_unit is None or batch.num_rows == 0 or d.start_time_ms * 1000 < _RECENT_US:
        return False
    latest = pc.max(batch.column("timestamp")).as_py()
    if latest is None or latest.timestamp() * 1_000_000 >= _RECENT_US:
        return False
    library_logger(role="spark-source").warning(
        "timestamps.implausible",
        recording_id=d.recording_id,
        timestamp_unit=options.timestamp_unit,
        latest=latest.isoformat(),
        recorded_from_ms=d.start_time_ms,
        hint="the reserved values give dates before 1980 for a recording made later: is timestampUnit right?",
    )
    return True


def _check_timestamps(batch: pa.RecordBatch, options: ReadOptions) -> None:
    """A reserved value that ``timestampUnit`` makes a time Spark cannot hold is a wrong unit, not a date:
    the error names the value, its recording and position (numpy would wrap it silently)."""
    unit = options.timestamp_unit
    if unit is None or batch.num_rows == 0:
        return
    multiply, divide = TIMESTAMP_UNITS_US[unit]
    lo_us, hi_us = TIMESTAMP_RANGE_US
    lowest, highest = -((-lo_us * divide) // multiply), hi_us * divide // multiply  # reserved values that fit
    reserved = batch.column("reserved_value")
    extremes = pc.min_max(reserved)
    smallest, largest = extremes["min"].as_py(), extremes["max"].as_py()
    if smallest is None or (smallest >= lowest and largest <= highest):
        return
    i = pc.index(pc.or_(pc.less(reserved, lowest), pc.greater(reserved, highest)), True).as_py()
    value = reserved[i].as_py()
    raise LogbufSourceError(
        f"timestampUnit={unit}: reserved value {value} (recording {batch.column('recording_id')[i].as_py()}, "
        f"position {batch.column('position')[i].as_py()}) is {value * multiply // divide} microseconds "
        f"from 1970, outside Spark's TIMESTAMP range (years 1..9999): is the unit right?"
    )


def _read_segment(
    segment: npt.NDArray[np.uint8],
    base: int,
    p: SegmentPartition,
    options: ReadOptions,
    schema: pa.Schema,
    spec: RowSpec,
    appends: AppendTimes | None = None,
    pushed: PushedFilters | None = None,
) -> Iterator[pa.RecordBatch]:
    """Rows of ``p`` from ``segment``, the segment file's bytes from position ``base`` on. Topic definitions
    make no row and name the topics of the rows after them; ``pushed`` topic filters drop rows before their
    payloads are gathered."""
    d = p.recording
    term_length = d.term_length
    term_mask = term_length - 1
    terms_per_chunk = max(1, options.batch_bytes // term_length)
    position = p.parse_start
    backed_up = False
    if p.check_mid_message and _is_continuation(segment, position - base):
        position = max(d.start_position, p.base_position, position - (position & term_mask))
        backed_up = position < p.parse_start
    parts: list[Rows] = []
    corrupt: list[tuple[int, str]] = []
    pending = 0
    names = dict(p.topics)
    topic_filter = pushed.topic if pushed is not None else None

    def keep(reserved: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_] | None:
        return topic_filter.keep_ids(reserved, names) if topic_filter is not None else None

    while position < p.parse_stop and position < p.to_position:
        chunk_end = min(p.parse_stop, position - (position & term_mask) + terms_per_chunk * term_length)
        frames = parse_chunk(segment, base, position, chunk_end, d)
        bad = frames.corruption
        if backed_up and bad is not None and bad.position < p.parse_start:
            # The term before our range is damaged: start at the recorded position after all (a
            # message that began before it stays incomplete, as for any range cut mid-message).
            position, backed_up = p.parse_start, False
            continue
        backed_up = False
        definitions = definitions_in(frames, names)
        rows = select_rows(frames, spec, p.from_position, p.to_position, d, definitions, keep)
        if len(rows):
            parts.append(rows)
            pending += len(rows.payload_values) + 64 * len(rows)
        if bad is not None and p.from_position <= bad.position < p.to_position:
            text = (
                f"{bad.reason} (recording {d.recording_id}, position {bad.position}; "
                f"skipped to position {bad.resume_position})"
            )
            if options.mode is Mode.FAILFAST:
                raise LogbufSourceError(f"malformed frame (mode FAILFAST): {text}")
            if options.mode is Mode.PERMISSIVE:
                corrupt.append((bad.position, text))
            else:
                library_logger(role="spark-source").warning(
                    "frames.malformed_dropped",
                    recording_id=d.recording_id,
                    position=bad.position,
                    reason=bad.reason,
                    resume_position=bad.resume_position,
                )
        position = bad.resume_position if bad is not None else chunk_end
        if pending >= options.batch_bytes or corrupt:
            yield build_batch(schema, d, parts, spec, corrupt, appends, names)
            parts, corrupt, pending = [], [], 0
    if parts or corrupt:
        yield build_batch(schema, d, parts, spec, corrupt, appends, names)


def _is_continuation(segment: npt.NDArray[np.uint8], offset: int) -> bool:
    """The frame at ``offset`` is a DATA frame without BEGIN (a message's middle or end)."""
    if offset < 0 or offset + dh.HEADER_LENGTH > len(segment):
        return False
    flags = int(segment[offset + dh.FLAGS_FIELD_OFFSET])
    frame_type = int(segment[offset + dh.TYPE_FIELD_OFFSET]) | int(segment[offset + dh.TYPE_FIELD_OFFSET + 1]) << 8
    return frame_type == dh.HDR_TYPE_DATA and not flags & dh.BEGIN_FLAG


def _on_corruption(
    options: ReadOptions,
    d: RecordingDescriptor,
    position: int,
    reason: str,
    resume: int,
    schema: pa.Schema,
    spec: RowSpec,
) -> pa.RecordBatch | None:
    text = f"{reason} (recording {d.recording_id}, position {position}; skipped to position {resume})"
    if options.mode is Mode.FAILFAST:
        raise LogbufSourceError(f"malformed frame (mode FAILFAST): {text}")
    if options.mode is Mode.DROPMALFORMED:
        library_logger(role="spark-source").warning(
            "frames.malformed_dropped",
            recording_id=d.recording_id,
            position=position,
            reason=reason,
            resume_position=resume,
        )
        return None
    return build_batch(schema, d, [], spec, [(position, text)])


# -- the data source --------------------------------------------------------------------------------
class LogbufDataSource(DataSource):
    """``format("logbuf")``: an archive directory's recordings, one row per message or frame."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return ReadOptions.parse(self.options).schema()

    def reader(self, schema: StructType) -> LogbufReader:
        options = _with_schema(ReadOptions.parse(_options_for(self.options, schema)), schema)
        if options.filter_pushdown and not _planner_allows_pushdown():
            library_logger(role="spark-source").warning(
                "filter_pushdown.disabled",
                hint="spark.sql.python.filterPushdown.enabled is false in this session: reading without filter "
                "pushdown (every segment is read and Spark applies the filters); set it to true, or "
                "filterPushdown=false to say so",
            )
            return LogbufReader(options)
        return LogbufFilteringReader(options) if options.filter_pushdown else LogbufReader(options)

    def streamReader(self, schema: StructType) -> LogbufStreamReader:
        options = _with_schema(ReadOptions.parse(_options_for(self.options, schema)), schema)
        return LogbufStreamReader(options)


class LogbufReader(DataSourceReader):
    """Batch reads: the recordings as the catalog holds them when the query is planned."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.pushed = PushedFilters()
        self.topic_names = TopicNames()

    def partitions(self) -> Sequence[InputPartition]:
        o, pushed = self.options, self.pushed
        if pushed.nothing:
            return []
        positions = pushed.range_of("position")
        low, high = positions.low, positions.high
        from_position = o.start_position if low is None else max(o.start_position, low - 1)
        to_position = o.stop_position if high is None else min(o.stop_position, high)
        times = pushed.ranges.get(TIMESTAMP_COLUMN)
        if times is not None and o.timestamp_unit is None and not o.append_time:
            return []  # every timestamp is null (timestampFrom=none): no comparison keeps a row
        planned, problems = _catalog_view(o, pushed.ranges.get("recording_id"))
        if "recording_id" not in pushed.ranges:
            _check_named_recordings(o, planned)
        partitions: list[InputPartition] = list(problems)
        for item in planned:
            d = item.recording
            location = ArchiveLocation(item.archive)
            if not (
                pushed.range_of("stream_id").contains(d.stream_id)
                and pushed.range_of("session_id").contains(d.session_id)
            ):
                continue
            first = max(
                from_position,
                _resolve_offset(o, d, "startingOffsets", o.starting.for_recording(d.recording_id), location),
            )
            last = min(
                to_position,
                _resolve_offset(o, d, "endingOffsets", o.ending.for_recording(d.recording_id), location),
            )
            if times is not None and o.append_time:
                appended = _append_time_positions(location, d, times)
                if appended is None:
                    continue
                first, last = max(first, appended[0]), min(last, appended[1])
            planned_here = plan_partitions(o, d, first, last, from_is_frame_start=False, archive=item.archive)
            if times is not None and planned_here and not o.append_time:
                planned_here = _in_time_range(planned_here, times, o)
            partitions.extend(_with_topics(planned_here, self.topic_names))
        return pack_partitions(split_partitions(partitions, o.min_partitions), o)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for piece in _pieces(partition):
            yield from read_partition(piece, self.options, self.pushed)


class LogbufFilteringReader(LogbufReader):
    """A batch reader that takes filters (Spark asks for them only with filter pushdown enabled)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        self.pushed, rest = split_filters(filters)
        return rest


class LogbufStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reads: offsets are ``{"<recording id>": recorded position read so far}``."""

    def __init__(self, options: ReadOptions) -> None:
        if options.several:
            raise LogbufSourceError(
                f"a streaming read follows one archive; got {', '.join(options.archives)} "
                "(start one query per archive, or union their streams)"
            )
        self.options = options
        self.location = parse_location(options.archive_dir)
        self._target: dict[str, int] | None = None
        self._latest: dict[str, int] | None = None
        self.topic_names = TopicNames()

    def _current(self) -> dict[str, int]:
        """Each wanted recording's end now: its stop position, or ``endingOffsets`` / ``stopPosition`` if
        that comes first (at a frame boundary); 0 for a damaged entry, so its problem is read once."""
        planned, problems = _catalog_view(self.options, locations=[self.location])
        current = {str(item.recording.recording_id): self._last(item.recording) for item in planned}
        for problem in problems:
            current.setdefault(str(problem.recording_id), 0)
        return current

    def _first(self, d: RecordingDescriptor) -> int:
        """Where a recording the offsets do not hold yet starts: ``startingOffsets`` (a recording that
        appears after the query started is read from its start) and ``startPosition``, at a frame boundary."""
        o = self.options
        given = o.starting.for_recording(d.recording_id)
        if given == LATEST:  # a recording that appeared after the query started: read whole
            given = EARLIEST
        first = max(_resolve_offset(o, d, "startingOffsets", given, self.location), o.start_position)
        return min(frame_boundary_at_or_before(self.location, d, first), self._last(d))

    def _last(self, d: RecordingDescriptor) -> int:
        o = self.options
        last = min(
            _resolve_offset(o, d, "endingOffsets", o.ending.for_recording(d.recording_id), self.location),
            o.stop_position,
        )
        if last >= d.stop_position:
            return d.stop_position
        return frame_boundary_at_or_before(self.location, d, max(last, d.start_position))

    def initialOffset(self) -> dict[str, int]:
        """Each recording's start: ``startingOffsets`` (``latest``: what is recorded now is skipped)."""
        o = self.options
        planned, _ = _catalog_view(o, locations=[self.location])
        _check_named_recordings(o, planned)
        offsets: dict[str, int] = {}
        for d in (item.recording for item in planned):
            if o.starting.for_recording(d.recording_id) == LATEST:
                offsets[str(d.recording_id)] = self._last(d)
            else:
                offsets[str(d.recording_id)] = self._first(d)
        return offsets

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._current()

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_bytes_per_trigger is not None:
            return ReadMaxBytes(o.max_bytes_per_trigger)
        if o.max_records_per_trigger is not None:
            return ReadMaxRows(o.max_records_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        """Each wanted recording's end now (or when availableNow started), as far as ``limit`` (from
        ``maxBytesPerTrigger`` / ``maxRecordsPerTrigger``) allows. Spark before 4.2 passes no arguments
        (and so no limit)."""
        start = dict(start or {})
        current = self._current() if self._target is None else self._target
        self._latest = current
        latest = dict(start)
        for key, position in current.items():
            latest[key] = max(position, int(latest.get(key, -1)))
        if isinstance(limit, ReadMaxBytes):
            return self._limit_bytes(start, latest, limit.max_bytes)
        if isinstance(limit, ReadMaxRows):
            return self._limit_rows(start, latest, limit.max_rows)
        return latest

    def reportLatestOffset(self) -> dict[str, int] | None:
        """What is available (each recording's end), for the progress report's ``latestOffset``: the lag
        is its distance from ``endOffset``."""
        return dict(self._latest) if self._latest is not None else None

    def _descriptors(self, keys: Iterable[str]) -> dict[int, RecordingDescriptor]:
        with open_catalog(self.location) as catalog:
            found = {}
            for key in keys:
                with contextlib.suppress(CatalogError):
                    found[int(key)] = catalog.recording(int(key))
            return found

    def _moving(
        self, start: dict[str, int], latest: dict[str, int]
    ) -> tuple[dict[str, int], dict[str, tuple[RecordingDescriptor, int, int]]]:
        """(offsets of recordings with nothing to count, {key: (descriptor, begin, end)} of the others)."""
        fixed = dict(start)
        moving: dict[str, tuple[RecordingDescriptor, int, int]] = {}
        keys = [k for k, v in latest.items() if v > int(start.get(k, -1))]
        descriptors = self._descriptors(keys)
        for key in keys:
            d = descriptors.get(int(key))
            if d is None or descriptor_problem(d) is not None:
                fixed[key] = latest[key]  # a problem row (or nothing): no bytes or rows to count
                continue
            begin = max(int(start[key]), d.start_position) if key in start else self._first(d)
            moving[key] = (d, begin, latest[key])
        return fixed, moving

    def _limit_bytes(self, start: dict[str, int], latest: dict[str, int], budget: int) -> dict[str, int]:
        """The budget shared fairly across the recordings with data (:func:`fair_shares`), each share cut at
        a frame boundary from the headers; every recording with a share moves at least one frame."""
        limited, moving = self._moving(start, latest)
        shares = fair_shares({k: end - begin for k, (_, begin, end) in moving.items()}, budget)
        for key, (d, begin, end) in moving.items():
            if shares[key] > 0:
                limited[key] = cut_bytes(self.location, d, begin, end, shares[key])
            elif key in start:
                limited[key] = int(start[key])
        return limited

    def _limit_rows(self, start: dict[str, int], latest: dict[str, int], budget: int) -> dict[str, int]:
        """The budget shared fairly across the recordings with rows: rounds of equal shares, each counted
        from the frame headers (:func:`cut_rows`), until the budget is used or every recording is drained."""
        limited, moving = self._moving(start, latest)
        position = {k: begin for k, (_, begin, _) in moving.items()}
        hungry = sorted(moving, key=int)
        while budget > 0 and hungry:
            each, extra = divmod(budget, len(hungry))
            still = []
            for i, key in enumerate(hungry):
                share = each + (1 if i < extra else 0)
                if share == 0:
                    still.append(key)
                    continue
                d, _, end = moving[key]
                position[key], got = cut_rows(self.location, d, position[key], end, share, self.options.per_message)
                budget -= got
                if position[key] < end and got == share:
                    still.append(key)
            if len(still) == len(hungry) and each == 0:
                break
            hungry = still
        for key, (_, begin, _) in moving.items():
            if position[key] > begin or key not in start:
                limited[key] = position[key]
        return limited

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        changed = {int(k): int(v) for k, v in end.items() if int(v) > int(start.get(k, -1))}
        self._check_loss(start)
        if not changed:
            return []
        planned, problems = _catalog_view(self.options, IntRange(values=frozenset(changed)), [self.location])
        partitions: list[InputPartition] = [p for p in problems if p.recording_id in changed]
        for d in (item.recording for item in planned):
            key = str(d.recording_id)
            from_position = max(int(start[key]), d.start_position) if key in start else self._first(d)
            planned_here = plan_partitions(
                self.options, d, from_position, changed[d.recording_id], from_is_frame_start=True
            )
            partitions.extend(_with_topics(planned_here, self.topic_names))
        return pack_partitions(split_partitions(partitions, self.options.min_partitions), self.options)

    def _check_loss(self, start: dict[str, int]) -> None:
        """A recording read up to ``start[key]`` whose positions after it are gone: retention moved its
        start past the offset, or the recording was deleted."""
        for rid, d in sorted(self._descriptors(start).items()):
            read_to = int(start[str(rid)])
            if descriptor_problem(d) is not None:
                continue
            if d.state != RecordingState.VALID and read_to < d.stop_position:
                on_data_loss(self.options, rid, read_to, d.stop_position, f"the recording is {d.state.name}")
            elif read_to < d.start_position:
                on_data_loss(
                    self.options, rid, read_to, d.start_position, f"the recording now starts at {d.start_position}"
                )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for piece in _pieces(partition):
            yield from read_partition(piece, self.options)

    def commit(self, end: dict[str, int]) -> None:
        pass
