"""DistinctErrorLog: one record per distinct error, with a count and first/last times (Agrona's).

The log lives in shared memory (the CnC's error-log buffer), so another process can read it
while the writer runs or after it has crashed (:func:`read_error_log`). An error's text is, for an
exception, its type, message and traceback (causes included) as ``traceback.format_exception`` prints
them; for a string, the string. Two errors are the same distinct error when their texts have the same
*shape* (:func:`error_shape`): the same words with every number, file path, channel URI and quoted
value taken out. Aeron's log compares an exception's class, message and stack; a message that carries
a file name, a stream id or a channel (``STORAGE_SPACE: cannot create log /dev/shm/.../1234.logbuffer``,
the counters-full refusals) would otherwise be a new record each time, and one client could fill the log
and crowd out every later error. The first observation appends a record with its full text (count 1,
then its length published with a release store); later ones of the same shape add 1 to the count
atomically and release-store the last-observation time, so a record shows the first example of its
kind, how many there were, and when the first and the last were.

Writers: any number of threads in **one** process (a lock guards appending; the next free offset
is known only to that process). Readers: any process, any time.
"""

from __future__ import annotations

import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from logbuf import native
from logbuf.conduit import error_log_descriptor as ed
from logbuf.conduit.ring_buffer import byte_view


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


def error_text(error: BaseException | str) -> str:
    """The text recorded for ``error`` (and what makes two observations the same error)."""
    if isinstance(error, str):
        return error
    return "".join(traceback.format_exception(error))


_SHAPE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"'[^'\n]*'|\"[^\"\n]*\""), "<value>"),  # quoted values (a repr of a channel, a name)
    (re.compile(r"aeron(?:-spy)?:[^\s,;)]+"), "<channel>"),  # channel URIs
    (re.compile(r"(?<![\w.])(?:[\w.-]*/)+[\w.-]*"), "<path>"),  # file paths (at least one slash)
    (re.compile(r"\[[0-9a-fA-F:.]+\](?::\d+)?"), "<address>"),  # [ipv6]:port
    (re.compile(r"-?(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)*)"), "<n>"),  # numbers, hex, dotted quads and versions
)


def error_shape(text: str) -> str:
    """``text`` with the parts that vary between errors of one kind (numbers, file paths, channel URIs,
    quoted values) replaced by placeholders: the key of a distinct error."""
    for pattern, placeholder in _SHAPE_PATTERNS:
        text = pattern.sub(placeholder, text)
    return text


@dataclass(frozen=True, slots=True)
class ErrorObservation:
    """One distinct error as read from the log."""

    count: int
    first_observation_ms: int
    last_observation_ms: int
    text: str


class DistinctErrorLog:
    """Records errors into ``buffer``; thread-safe within one process."""

    def __init__(self, buffer: memoryview, clock_ms: Callable[[], int] = epoch_ms) -> None:
        view = byte_view(buffer)
        ed.check_buffer_length(len(view))
        native.get_int64_volatile(view, 0)  # raises if the buffer is not 8-byte aligned
        self.buffer = view
        self.clock_ms = clock_ms
        self._lock = threading.Lock()
        self._offsets: dict[str, int] = {}
        self._next_offset = 0
        self._resume()

    def _resume(self) -> None:
        """Index the records already in the buffer (a log reopened by the process that wrote it)."""
        offset = 0
        capacity = len(self.buffer)
        while offset + ed.ENCODED_ERROR_OFFSET <= capacity:
            length = native.get_int32_volatile(self.buffer, offset + ed.LENGTH_OFFSET)
            if length < ed.ENCODED_ERROR_OFFSET or offset + length > capacity:
                break
            text = bytes(self.buffer[offset + ed.ENCODED_ERROR_OFFSET : offset + length]).decode("utf-8", "replace")
            self._offsets.setdefault(error_shape(text), offset)
            offset += ed.align(length)
        self._next_offset = offset

    def record(self, error: BaseException | str) -> bool:
        """Record one observation of ``error`` (counted in the record of its shape, :func:`error_shape`);
        False if the log has no room for a new distinct error."""
        timestamp_ms = self.clock_ms()
        text = error_text(error)
        shape = error_shape(text)
        with self._lock:
            offset = self._offsets.get(shape)
            if offset is None:
                return self._append(shape, text, timestamp_ms)
        native.get_and_add_int32(self.buffer, offset + ed.OBSERVATION_COUNT_OFFSET, 1)
        native.put_int64_ordered(self.buffer, offset + ed.LAST_OBSERVATION_TIMESTAMP_OFFSET, timestamp_ms)
        return True

    def _append(self, shape: str, text: str, timestamp_ms: int) -> bool:
        encoded = text.encode("utf-8", "replace")
        length = ed.ENCODED_ERROR_OFFSET + len(encoded)
        offset = self._next_offset
        if offset + length > len(self.buffer):
            return False
        buffer = self.buffer
        start = offset + ed.ENCODED_ERROR_OFFSET
        buffer[start : start + len(encoded)] = encoded
        ed.RECORD_HEADER.pack_into(buffer, offset, 0, 1, timestamp_ms, timestamp_ms)
        native.put_int32_ordered(buffer, offset + ed.LENGTH_OFFSET, length)
        self._offsets[shape] = offset
        self._next_offset = ed.align(offset + length)
        return True

    @property
    def distinct_count(self) -> int:
        return len(self._offsets)


def read_error_log(buffer: memoryview, since_ms: int = 0) -> list[ErrorObservation]:
    """Every distinct error whose last observation is at or after ``since_ms``, oldest record first."""
    view = byte_view(buffer)
    capacity = len(view)
    observations: list[ErrorObservation] = []
    offset = 0
    while offset + ed.ENCODED_ERROR_OFFSET <= capacity:
        length = native.get_int32_volatile(view, offset + ed.LENGTH_OFFSET)
        if length < ed.ENCODED_ERROR_OFFSET or offset + length > capacity:
            break  # 0: the end; anything else invalid: stop rather than misread
        last_ms = native.get_int64_volatile(view, offset + ed.LAST_OBSERVATION_TIMESTAMP_OFFSET)
        if last_ms >= since_ms:
            count = native.get_int32_volatile(view, offset + ed.OBSERVATION_COUNT_OFFSET)
            first_ms = ed.RECORD_HEADER.unpack_from(view, offset)[3]
            text = bytes(view[offset + ed.ENCODED_ERROR_OFFSET : offset + length]).decode("utf-8", "replace")
            observations.append(ErrorObservation(count, first_ms, last_ms, text))
        offset += ed.align(length)
    return observations
