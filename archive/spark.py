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

Streaming offsets are ``{"<recording id>": position}``: per recording, the recorded position read
so far. A micro-batch ends at each recording's stop position as the catalog holds it at that moment
(every byte before it is written, so never a half-written frame); new recordings join from their
start position; a restarted query goes on from its checkpointed offsets, so nothing is read twice.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
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

from logbuf.archive.catalog import Catalog, RecordingDescriptor, RecordingState
from logbuf.archive.segments import mapped_segment, segment_base_position, segment_file_name
from logbuf.archive.spark_frames import (
    TIMESTAMP_UNITS_US,
    Mode,
    Rows,
    RowSpec,
    arrow_schema,
    build_batch,
    parse_chunk,
    select_rows,
)
from logbuf.errors import LogbufError
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logging_config import library_logger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "LogbufDataSource",
    "LogbufReader",
    "LogbufStreamReader",
    "ReadOptions",
    "SegmentPartition",
    "register",
]

FORMAT_NAME: Final[str] = "logbuf"
DEFAULT_CORRUPT_COLUMN: Final[str] = "_corrupt_record"
DEFAULT_BATCH_BYTES: Final[int] = 16 * 1024 * 1024
"""Bytes of segment parsed per Arrow batch (rounded to whole terms): larger batches amortise the
per-batch cost, smaller ones bound executor memory (about 3x this per task)."""
_MAX_POSITION: Final[int] = (1 << 63) - 1

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
    ("payload", BinaryType()),
)
"""The columns (all nullable: a PERMISSIVE corrupt row has nulls); spark_frames.arrow_schema matches."""


class LogbufSourceError(LogbufError, ValueError):
    """A bad option, or a corrupt frame in FAILFAST mode (the message names the value or position)."""


def register(spark: SparkSession) -> None:
    """Make ``format("logbuf")`` available in this session (batch and streaming)."""
    spark.dataSource.register(LogbufDataSource)


# -- options --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadOptions:
    """The data source's options, validated (errors name the option and the value).

    ``path``: the archive directory (or ``.load(dir)``). ``recordingId`` / ``streamId``: one id
    or a comma-separated list. ``startPosition`` / ``stopPosition``: rows with
    ``startPosition < position <= stopPosition``. ``rowsPer``: ``message`` (default, fragments
    reassembled) or ``frame``. ``timestampFrom``: ``none`` (default, a null ``timestamp``) or
    ``reserved_value`` with ``timestampUnit`` ``s``, ``ms``, ``us`` (default: the jetstream relay
    stamps epoch microseconds) or ``ns``; a reserved value of 0 gives null. ``mode``:
    PERMISSIVE (default), DROPMALFORMED, FAILFAST; ``columnNameOfCorruptRecord``. Streaming only:
    ``startingPositions``: ``earliest`` (default: recordings from their start) or ``latest`` (what
    is recorded when the query starts is skipped; recordings that appear later are read whole).
    """

    archive_dir: str
    recording_ids: frozenset[int] | None = None
    stream_ids: frozenset[int] | None = None
    start_position: int = -1
    stop_position: int = _MAX_POSITION
    per_message: bool = True
    timestamp_unit: str | None = None
    mode: Mode = Mode.PERMISSIVE
    corrupt_column: str = DEFAULT_CORRUPT_COLUMN
    starting: str = "earliest"
    batch_bytes: int = DEFAULT_BATCH_BYTES

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        lowered = {k.lower(): v for k, v in options.items()}

        def get(name: str) -> str | None:
            value = lowered.get(name.lower())
            return None if value is None or value == "" else str(value)

        archive_dir = get("path")
        if archive_dir is None:
            raise LogbufSourceError("no archive directory: give .load(archive_dir) or .option('path', archive_dir)")
        mode_text = (get("mode") or "PERMISSIVE").upper()
        try:
            mode = Mode(mode_text)
        except ValueError:
            raise LogbufSourceError(f"mode={mode_text!r} must be PERMISSIVE, DROPMALFORMED or FAILFAST") from None
        rows_per = (get("rowsPer") or "message").lower()
        if rows_per not in ("message", "frame"):
            raise LogbufSourceError(f"rowsPer={rows_per!r} must be 'message' or 'frame'")
        timestamp_from = (get("timestampFrom") or "none").lower()
        if timestamp_from not in ("none", "reserved_value"):
            raise LogbufSourceError(f"timestampFrom={timestamp_from!r} must be 'none' or 'reserved_value'")
        unit = (get("timestampUnit") or "us").lower()
        if unit not in TIMESTAMP_UNITS_US:
            raise LogbufSourceError(f"timestampUnit={unit!r} must be one of {', '.join(TIMESTAMP_UNITS_US)}")
        starting = (get("startingPositions") or "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise LogbufSourceError(f"startingPositions={starting!r} must be 'earliest' or 'latest'")
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
        return cls(
            archive_dir=archive_dir,
            recording_ids=_ids_option(get, "recordingId"),
            stream_ids=_ids_option(get, "streamId"),
            start_position=start,
            stop_position=stop,
            per_message=rows_per == "message",
            timestamp_unit=unit if timestamp_from == "reserved_value" else None,
            mode=mode,
            corrupt_column=corrupt_column,
            starting=starting,
            batch_bytes=batch_bytes,
        )

    @property
    def row_spec(self) -> RowSpec:
        return RowSpec(per_message=self.per_message, timestamp_unit=self.timestamp_unit)

    @property
    def corrupt_column_or_none(self) -> str | None:
        return self.corrupt_column if self.mode is Mode.PERMISSIVE else None

    def schema(self) -> StructType:
        fields = [StructField(name, data_type) for name, data_type in _COLUMNS]
        if self.mode is Mode.PERMISSIVE:
            fields.append(StructField(self.corrupt_column, StringType()))
        return StructType(fields)

    def wants(self, d: RecordingDescriptor) -> bool:
        return (
            d.state == RecordingState.VALID
            and (self.recording_ids is None or d.recording_id in self.recording_ids)
            and (self.stream_ids is None or d.stream_id in self.stream_ids)
        )


def _int_option(get: Any, name: str, default: int) -> int:
    text = get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise LogbufSourceError(f"{name}={text!r} is not an integer") from None


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
    recording: RecordingDescriptor
    base_position: int
    parse_start: int
    parse_stop: int
    from_position: int
    to_position: int
    check_mid_message: bool = False
    """``parse_start`` is a recorded position that may fall inside a fragmented message: if the
    frame there is a middle or last fragment, parse from the start of its term instead."""
    value: Any = field(default=None, compare=False)

    @property
    def path(self) -> pathlib.Path:
        return pathlib.Path(self.archive_dir) / segment_file_name(self.recording.recording_id, self.base_position)


def plan_partitions(
    options: ReadOptions, d: RecordingDescriptor, from_position: int, to_position: int, *, from_is_frame_start: bool
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
                archive_dir=options.archive_dir,
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


def _recordings(options: ReadOptions) -> list[RecordingDescriptor]:
    with Catalog.open(options.archive_dir) as catalog:
        return [d for d in catalog.recordings() if options.wants(d)]


def _check_schema(options: ReadOptions, schema: StructType) -> None:
    expected = options.schema()
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in expected.fields]:
        raise LogbufSourceError(
            f"the logbuf source has a fixed schema for mode {options.mode.value}: {expected.simpleString()}; "
            f"got {schema.simpleString()} (select or cast columns after loading instead)"
        )


# -- reading a partition (executors) ----------------------------------------------------------------
def read_partition(partition: SegmentPartition, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """The Arrow batches of one partition (a generator, as Spark requires)."""
    d = partition.recording
    schema = arrow_schema(options.corrupt_column_or_none)
    spec = options.row_spec
    with contextlib.ExitStack() as stack:
        try:
            segment = stack.enter_context(mapped_segment(partition.path, d.segment_length))
        except FileNotFoundError:
            reason = f"segment file {partition.path} is missing"
            batch = _on_corruption(options, d, partition.parse_start, reason, partition.parse_stop, schema, spec)
            if batch is not None:
                yield batch
            return
        yield from _read_segment(segment, partition, options, schema, spec)
        del segment  # so that the mapping closes now


def _read_segment(
    segment: npt.NDArray[np.uint8], p: SegmentPartition, options: ReadOptions, schema: pa.Schema, spec: RowSpec
) -> Iterator[pa.RecordBatch]:
    d = p.recording
    base = p.base_position
    term_length = d.term_length
    term_mask = term_length - 1
    terms_per_chunk = max(1, options.batch_bytes // term_length)
    position = p.parse_start
    backed_up = False
    if p.check_mid_message and _is_continuation(segment, position - base):
        position = max(d.start_position, base, position - (position & term_mask))
        backed_up = position < p.parse_start
    parts: list[Rows] = []
    corrupt: list[tuple[int, str]] = []
    pending = 0
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
        rows = select_rows(frames, spec, p.from_position, p.to_position, d)
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
            yield build_batch(schema, d, parts, spec, corrupt)
            parts, corrupt, pending = [], [], 0
    if parts or corrupt:
        yield build_batch(schema, d, parts, spec, corrupt)


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
        options = ReadOptions.parse(self.options)
        _check_schema(options, schema)
        return LogbufReader(options)

    def streamReader(self, schema: StructType) -> LogbufStreamReader:
        options = ReadOptions.parse(self.options)
        _check_schema(options, schema)
        return LogbufStreamReader(options)


class LogbufReader(DataSourceReader):
    """Batch reads: the recordings as the catalog holds them when the query is planned."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        partitions: list[InputPartition] = []
        for d in _recordings(o):
            partitions.extend(plan_partitions(o, d, o.start_position, o.stop_position, from_is_frame_start=False))
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SegmentPartition):  # Spark reads one placeholder when there are none
            yield from read_partition(partition, self.options)


class LogbufStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming reads: offsets are ``{"<recording id>": recorded position read so far}``."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._target: dict[str, int] | None = None

    def _current(self) -> dict[str, int]:
        return {str(d.recording_id): d.stop_position for d in _recordings(self.options)}

    def initialOffset(self) -> dict[str, int]:
        if self.options.starting == "latest":
            return self._current()
        return {}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._current()

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        """Each wanted recording's stop position now (or when availableNow started); ``limit`` is
        not used (every trigger reads all that is recorded). Spark before 4.2 passes no arguments."""
        latest = dict(start or {})
        current = self._current() if self._target is None else self._target
        for key, position in current.items():
            latest[key] = max(position, int(latest.get(key, -1)))
        return latest

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        changed = {int(k): int(v) for k, v in end.items() if int(v) > int(start.get(k, -1))}
        if not changed:
            return []
        with Catalog.open(self.options.archive_dir) as catalog:
            descriptors = {rid: catalog.recording(rid) for rid in changed}
        partitions: list[InputPartition] = []
        for rid, to_position in sorted(changed.items()):
            d = descriptors[rid]
            if d.state != RecordingState.VALID:
                continue
            key = str(rid)
            from_position = int(start[key]) if key in start else d.start_position
            partitions.extend(plan_partitions(self.options, d, from_position, to_position, from_is_frame_start=True))
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SegmentPartition):  # Spark reads one placeholder when there are none
            yield from read_partition(partition, self.options)

    def commit(self, end: dict[str, int]) -> None:
        pass
