"""Images: a subscriber's reading of one publication's log (poll, controlled poll, block poll)."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from logbuf import native
from logbuf.native import Header

__all__ = ["ControlledPollAction", "FragmentBatch", "Header", "Image"]


class ControlledPollAction(IntEnum):
    """What a controlled-poll handler tells the image to do after a fragment."""

    ABORT = 1
    """Do not consume this fragment; stop. It is delivered again on the next poll."""
    BREAK = 2
    """Consume this fragment and stop polling."""
    COMMIT = 3
    """Consume this fragment, store the position now, and continue."""
    CONTINUE = 4
    """Consume this fragment and continue (returning None means the same)."""


class FragmentBatch:
    """A batch of fragments as numpy arrays, filled by :meth:`Image.poll_batch` (logbuf's vectorised poll).

    After a poll, element ``i < count`` of each array describes one fragment: ``offsets`` (where its
    payload starts in ``term``), ``lengths`` (payload bytes), ``session_ids``, ``flags``, ``positions``
    (stream position after it) and ``reserved_values``. ``term`` is a read-only uint8 array over the
    term partition the batch lies in: zero copy. The batch is valid until the next poll of the image
    that filled it.
    """

    def __init__(self, capacity: int = 4096) -> None:
        self.offsets: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)
        self.lengths: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)
        self.session_ids: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)
        self.flags: npt.NDArray[np.uint8] = np.zeros(capacity, dtype=np.uint8)
        self.positions: npt.NDArray[np.int64] = np.zeros(capacity, dtype=np.int64)
        self.reserved_values: npt.NDArray[np.int64] = np.zeros(capacity, dtype=np.int64)
        self.core = native.FragmentBatchCore(
            self.offsets, self.lengths, self.session_ids, self.flags, self.positions, self.reserved_values
        )
        self.term: npt.NDArray[np.uint8] = np.zeros(0, dtype=np.uint8)

    @property
    def capacity(self) -> int:
        return self.core.capacity

    @property
    def count(self) -> int:
        """Fragments the last poll put in the batch."""
        return self.core.count

    def payload(self, i: int) -> npt.NDArray[np.uint8]:
        """Fragment ``i``'s payload, a view of the term (no copy)."""
        if not 0 <= i < self.core.count:
            raise IndexError(f"fragment {i} is not in this batch of {self.core.count}")
        start = int(self.offsets[i])
        return self.term[start : start + int(self.lengths[i])]

    def rows(self, size: int) -> npt.NDArray[np.uint8] | None:
        """The payloads as an ``(count, size)`` array viewing the term (no copy) when every fragment holds
        ``size`` bytes and they lie evenly in the term (as back-to-back frames of one size do); else None."""
        n = self.core.count
        if n == 0:
            return np.zeros((0, size), dtype=np.uint8)
        lengths, offsets = self.lengths[:n], self.offsets[:n]
        stride = (size + 32 + 31) & ~31
        first = int(offsets[0])
        if not (lengths == size).all() or int(offsets[n - 1]) - first != (n - 1) * stride:
            return None
        if n > 1 and not (np.diff(offsets) == stride).all():
            return None
        return np.lib.stride_tricks.as_strided(self.term[first:], shape=(n, size), strides=(stride, 1), writeable=False)


class Image(native.ImageCore):
    """One subscriber's reading position in one log.

    ``poll(handler, fragment_limit)`` calls ``handler(payload: memoryview, header: Header)`` for
    each message fragment; both are valid only during the call (copy with ``bytes(payload)``
    or ``header.snapshot()`` to keep them).

    A frame length no publisher can write (a log damaged by something that maps it) stops every poll
    there: the fragments before it are delivered, then the poll raises
    :class:`~logbuf.errors.CorruptLogError` naming the position and the value (``corrupt_frame_count``
    counts them, once per position).
    """

    _term_arrays: list[npt.NDArray[np.uint8]] | None = None

    def poll_batch(self, batch: FragmentBatch, fragment_limit: int = 0x7FFFFFFF) -> int:  # type: ignore[override]
        """Fill ``batch`` (a :class:`FragmentBatch`) with up to its capacity of fragments, with no Python
        per fragment; returns how many. The fragments stay valid (the position is stored past them)
        until this image's next poll of any kind."""
        n: int = native.ImageCore.poll_batch(self, batch.core, fragment_limit)
        self._bind_term(batch)
        return n

    def poll_batch_filtered(  # type: ignore[override]
        self, topic_filter: native.TopicFilter, batch: FragmentBatch, fragment_limit: int = 0x7FFFFFFF
    ) -> int:
        """:meth:`poll_batch` of the fragments whose topics ``topic_filter`` accepts (``reserved_values``
        hold their topic ids); skipped frames are consumed too."""
        try:
            return native.ImageCore.poll_batch_filtered(self, topic_filter, batch.core, fragment_limit)
        finally:
            self._bind_term(batch)

    def _bind_term(self, batch: FragmentBatch) -> None:
        arrays = self._term_arrays
        if arrays is None:
            arrays = self._term_arrays = [np.frombuffer(self.term_view(i), dtype=np.uint8) for i in range(3)]
        batch.term = arrays[batch.core.partition]

    def close(self) -> None:
        self._term_arrays = None  # their exports of the log's views would keep it mapped
        super().close()

    def __enter__(self) -> Image:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.is_closed:
            return "Image(closed)"
        return f"Image(session_id={self.session_id}, stream_id={self.stream_id}, position={self.position})"
