"""Filter pushdown for the Spark data source: which filters it takes, the ranges they imply, and the rows
they keep.

Spark hands the reader the conjuncts of a query's ``WHERE`` (``pyspark.sql.datasource.Filter``s). The
source takes comparisons (``=``, ``<``, ``<=``, ``>``, ``>=``, ``IN``) of an integer literal with
``recording_id``, ``stream_id``, ``session_id`` or ``position``, and of a timestamp literal with
``timestamp``; anything else goes back to Spark. A taken filter is used twice:

- **Pruning** (on the driver, :class:`PushedFilters`): the ids select whole recordings (every row of a
  recording has its ids) and a position range narrows the byte range planned in each recording, so
  segments outside it are not read at all and the first and last segments are parsed from the term
  holding the range's start. A timestamp range prunes segments by the recording's time index
  (:mod:`archive.time_index`: reserved-value bounds per complete segment), in ``archive.spark``.
- **Exactness** (on the executors, :meth:`PushedFilters.keep`): each batch is filtered with Arrow
  before it goes to the JVM, with SQL's semantics (a comparison with null is not true), so a query
  returns the same rows with and without pushdown, corrupt-record rows included.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

__all__ = ["INTEGER_COLUMNS", "IntRange", "PushedFilters", "TopicFilter", "split_filters"]

INTEGER_COLUMNS: Final[tuple[str, ...]] = ("recording_id", "stream_id", "session_id", "position")
TIMESTAMP_COLUMN: Final[str] = "timestamp"
TOPIC_COLUMN: Final[str] = "topic"
_TOPIC_FILTERS: Final[tuple[type, ...]] = (EqualTo, In, StringStartsWith, StringEndsWith, StringContains)
"""What the source takes on ``topic``: ``=``, ``IN`` and the three forms of ``LIKE`` Spark pushes."""
_STRING_OPS: Final[dict[str, str]] = {
    "StringStartsWith": "starts_with",
    "StringEndsWith": "ends_with",
    "StringContains": "match_substring",
}
_COMPARISONS: Final[tuple[type, ...]] = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual, In)
_ARROW_OPS: Final[dict[type, str]] = {
    EqualTo: "equal",
    GreaterThan: "greater",
    GreaterThanOrEqual: "greater_equal",
    LessThan: "less",
    LessThanOrEqual: "less_equal",
}


@dataclass(frozen=True)
class IntRange:
    """Integers ``lo <= x <= hi`` (None: unbounded), and in ``values`` if that is set."""

    lo: int | None = None
    hi: int | None = None
    values: frozenset[int] | None = None

    def contains(self, x: int) -> bool:
        return (
            (self.lo is None or x >= self.lo)
            and (self.hi is None or x <= self.hi)
            and (self.values is None or x in self.values)
        )

    @property
    def low(self) -> int | None:
        """The least value the range can hold (None: unbounded)."""
        candidates = [v for v in (self.lo, min(self.values) if self.values else None) if v is not None]
        return max(candidates) if candidates else None

    @property
    def high(self) -> int | None:
        """The greatest value the range can hold (None: unbounded)."""
        candidates = [v for v in (self.hi, max(self.values) if self.values else None) if v is not None]
        return min(candidates) if candidates else None

    @property
    def empty(self) -> bool:
        if self.values is not None and not any(self.contains(v) for v in self.values):
            return True
        return self.lo is not None and self.hi is not None and self.lo > self.hi

    def narrowed(self, f: Filter, value: Any) -> IntRange:
        lo, hi, values = self.lo, self.hi, self.values
        if isinstance(f, In):
            chosen = frozenset(value)
            values = chosen if values is None else values & chosen
        elif isinstance(f, EqualTo):
            values = frozenset((value,)) if values is None else values & {value}
        elif isinstance(f, GreaterThan):
            lo = value + 1 if lo is None else max(lo, value + 1)
        elif isinstance(f, GreaterThanOrEqual):
            lo = value if lo is None else max(lo, value)
        elif isinstance(f, LessThan):
            hi = value - 1 if hi is None else min(hi, value - 1)
        elif isinstance(f, LessThanOrEqual):
            hi = value if hi is None else min(hi, value)
        return IntRange(lo, hi, values)


def _epoch_us(value: datetime.datetime) -> int:
    """A timestamp literal as epoch microseconds (a naive one is in this process's local time, as
    PySpark makes them from Spark's UTC microseconds)."""
    delta = value - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) if value.tzinfo else None
    if delta is None:
        return int(value.timestamp()) * 1_000_000 + value.microsecond
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _literal(f: Filter) -> tuple[str, Any] | None:
    """(column, the filter's literal as the source compares it: an int, epoch µs, or a tuple of them),
    or None if the source does not take this filter."""
    attribute: tuple[str, ...] = getattr(f, "attribute", ())
    if len(attribute) != 1:
        return None
    column = attribute[0]
    value: Any = getattr(f, "value", None)
    values = value if isinstance(f, In) else (value,)
    if column == TOPIC_COLUMN:
        if not isinstance(f, _TOPIC_FILTERS) or not all(isinstance(v, str) for v in values):
            return None
        return column, tuple(values) if isinstance(f, In) else value
    if not isinstance(f, _COMPARISONS):
        return None
    if column in INTEGER_COLUMNS:
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return None
        converted: tuple[int, ...] = tuple(values)
    elif column == TIMESTAMP_COLUMN:
        if not all(isinstance(v, datetime.datetime) for v in values):
            return None
        converted = tuple(_epoch_us(v) for v in values)
    else:
        return None
    return column, converted if isinstance(f, In) else converted[0]


@dataclass(frozen=True)
class TopicFilter:
    """The pushed ``topic`` filters as (kind, literal) pairs, decided once per topic id."""

    taken: tuple[tuple[str, object], ...] = ()

    def matches(self, name: str | None) -> bool:
        if name is None:
            return False
        for kind, literal in self.taken:
            if kind == "EqualTo" and name != literal:
                return False
            if kind == "In" and name not in literal:  # type: ignore[operator]
                return False
            if kind == "StringStartsWith" and not name.startswith(str(literal)):
                return False
            if kind == "StringEndsWith" and not name.endswith(str(literal)):
                return False
            if kind == "StringContains" and str(literal) not in name:
                return False
        return True

    def keep_ids(self, reserved: npt.NDArray[np.int64], names: dict[int, str]) -> npt.NDArray[np.bool_] | None:
        """Which of the reserved values are the ids of topics the filters keep; None with no topic filter."""
        if not self.taken:
            return None
        unique, inverse = np.unique(reserved, return_inverse=True)
        decided = np.array([self.matches(names.get(int(v))) if v > 0 else False for v in unique.tolist()], dtype=bool)
        return decided[inverse] if len(unique) else np.zeros(0, dtype=bool)


@dataclass(frozen=True)
class PushedFilters:
    """The filters the source took, with their literals, and the ranges they imply per column."""

    taken: tuple[tuple[str, str, Any], ...] = ()
    """(column, comparison class name, literal as compared) per taken filter: picklable for executors."""
    ranges: dict[str, IntRange] = field(default_factory=dict)

    @property
    def topic(self) -> TopicFilter:
        """The filters on ``topic``, decided per topic id on the executors before payloads are gathered."""
        return TopicFilter(tuple((kind, literal) for column, kind, literal in self.taken if column == TOPIC_COLUMN))

    def range_of(self, column: str) -> IntRange:
        return self.ranges.get(column, IntRange())

    @property
    def nothing(self) -> bool:
        """No row can match (an empty range, e.g. ``stream_id = 1 AND stream_id = 2``)."""
        return any(r.empty for r in self.ranges.values())

    def keep(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of ``batch`` for which every taken filter is true (SQL semantics: null is not true)."""
        if not self.taken or batch.num_rows == 0:
            return batch
        mask = None
        for column, kind, literal in self.taken:
            values = batch.column(column)
            arrow_type = values.type
            if kind in _STRING_OPS:
                test = getattr(pc, _STRING_OPS[kind])(values, pattern=literal)
            elif kind == "In":
                test = pc.is_in(values, value_set=pa.array(list(literal), type=arrow_type))
                test = pc.and_kleene(test, pc.is_valid(values))
            else:
                test = getattr(pc, _ARROW_OPS_BY_NAME[kind])(values, pa.scalar(literal, type=arrow_type))
            mask = test if mask is None else pc.and_kleene(mask, test)
        return batch.filter(pc.fill_null(mask, False))


_ARROW_OPS_BY_NAME: Final[dict[str, str]] = {cls.__name__: op for cls, op in _ARROW_OPS.items()}


def split_filters(filters: Iterable[Filter]) -> tuple[PushedFilters, list[Filter]]:
    """(what the source takes, the filters Spark must still evaluate: every one it does not take)."""
    taken: list[tuple[str, str, Any]] = []
    ranges: dict[str, IntRange] = {}
    rest: list[Filter] = []
    for f in filters:
        found = _literal(f)
        if found is None:
            rest.append(f)
            continue
        column, literal = found
        taken.append((column, type(f).__name__, literal))
        if column == TOPIC_COLUMN:
            continue
        ranges[column] = ranges.get(column, IntRange()).narrowed(f, literal)
    return PushedFilters(tuple(taken), ranges), rest


def describe(pushed: PushedFilters) -> Sequence[str]:
    """The taken filters as text (for logs and tests)."""
    return [f"{column} {kind} {literal}" for column, kind, literal in pushed.taken]
