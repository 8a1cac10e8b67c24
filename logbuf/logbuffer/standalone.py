"""Logs by name without a media driver: create or open a stream log, attach publications and
subscribers to it from any process.

Each named log is two shared-memory segments: ``<name>`` (the log buffer, Aeron's layout) and
``<name>.cnt`` (counters: values then metadata). Counters 0-2 are the publisher limit, the
clean position and the flow-control lock; every subscriber allocates its own ``sub-pos``
counter, owned by its pid.

    log = StreamLog.create("ticks", term_length=1 << 20, stream_id=10)
    pub = log.add_publication()              # concurrent; exclusive=True for a single writer
    image = StreamLog.open("ticks").add_subscriber()   # in another process
    pub.offer(b"hello"); image.poll(handler, 10)

The media driver (``driver``) replaces this with the same pieces owned by one process.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

from logbuf import native
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersManager
from logbuf.logbuffer.flow_control import compute_limit_and_clean
from logbuf.logbuffer.image import Image
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.publication import Publication
from logbuf.process import pid_alive
from logbuf.shm import OWNER_ONLY, Segment

PUBLISHER_LIMIT_COUNTER_ID = 0
CLEAN_POSITION_COUNTER_ID = 1
FLOW_CONTROL_LOCK_COUNTER_ID = 2
DEFAULT_MAX_SUBSCRIBERS = 61  # 64 counter records in all
LIVENESS_CHECK_INTERVAL_S = 0.1
_I32 = struct.Struct("=i")
_I64 = struct.Struct("=q")

__all__ = ["StreamLog"]


class StreamLog:
    """A named log plus its position counters, shared by publisher and subscriber processes."""

    def __init__(self, log: LogBuffers, counters_segment: Segment) -> None:
        self.log = log
        self._counters_segment = counters_segment
        buf = memoryview(counters_segment.buffer)
        values_length = len(buf) // 5
        self._values = buf[:values_length]
        self._metadata = buf[values_length : 5 * values_length]
        buf.release()
        self.counters = CountersManager(self._metadata, self._values)
        self._limit = self.counters.position(PUBLISHER_LIMIT_COUNTER_ID)
        self._clean = self.counters.position(CLEAN_POSITION_COUNTER_ID)
        self._lock_offset = cd.values_offset(FLOW_CONTROL_LOCK_COUNTER_ID)
        self._pid = os.getpid()
        self._last_liveness_check = 0.0
        self._owned: list[Any] = []
        self._subscriber_counters: dict[int, int] = {}  # id(image) -> its sub-pos counter id

    @property
    def name(self) -> str:
        return self.log.name

    # -- lifecycle ---------------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        name: str,
        *,
        term_length: int = 16 * 1024 * 1024,
        mtu_length: int = 1408,
        session_id: int = 0,
        stream_id: int = 0,
        initial_term_id: int = 0,
        term_window_length: int = 0,
        max_subscribers: int = DEFAULT_MAX_SUBSCRIBERS,
        mode: int = OWNER_ONLY,
    ) -> StreamLog:
        """Create the log and its counters; fails if a log of that name exists."""
        if max_subscribers < 1:
            raise ValueError(f"max_subscribers={max_subscribers} must be at least 1")
        log = LogBuffers.create(
            name,
            mode=mode,
            term_length=term_length,
            mtu_length=mtu_length,
            session_id=session_id,
            stream_id=stream_id,
            initial_term_id=initial_term_id,
            term_window_length=term_window_length,
        )
        try:
            records = max_subscribers + 3
            counters = Segment.create(cls.counters_name(name), 5 * records * cd.COUNTER_LENGTH, mode=mode)
        except BaseException:
            log.close()
            log.unlink()
            raise
        self = cls(log, counters)
        label = f"{{}}: 0 {session_id} {stream_id} standalone:{name}"
        assert self.counters.allocate(label.format("pub-lmt"), cd.PUBLISHER_LIMIT_TYPE_ID) == PUBLISHER_LIMIT_COUNTER_ID
        assert (
            self.counters.allocate(label.format("log-clean-pos"), cd.LOG_CLEAN_POSITION_TYPE_ID)
            == CLEAN_POSITION_COUNTER_ID
        )
        assert (
            self.counters.allocate(label.format("fc-lock"), cd.FLOW_CONTROL_LOCK_TYPE_ID)
            == FLOW_CONTROL_LOCK_COUNTER_ID
        )
        return self

    @classmethod
    def open(cls, name: str) -> StreamLog:
        """Map an existing named log and its counters."""
        log = LogBuffers.open(name)
        try:
            counters = Segment.open(cls.counters_name(name))
        except BaseException:
            log.close()
            raise
        return cls(log, counters)

    @staticmethod
    def counters_name(name: str) -> str:
        return f"{name}.cnt"

    @classmethod
    def unlink_name(cls, name: str) -> None:
        """Remove a named log's segments (processes that mapped them keep their mappings)."""
        Segment.unlink(name)
        Segment.unlink(cls.counters_name(name))

    def unlink(self) -> None:
        self.unlink_name(self.name)

    def close(self) -> None:
        """Close everything this object attached, free its subscriber counters, unmap."""
        for item in self._owned:
            item.close()
        self._owned.clear()
        for counter_id in self._subscriber_counters.values():
            self.counters.free(counter_id)
        self._subscriber_counters.clear()
        self._limit.close()
        self._clean.close()
        self._values.release()
        self._metadata.release()
        self.log.close()
        self._counters_segment.close()

    def __enter__(self) -> StreamLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- attaching -----------------------------------------------------------------------------------
    def add_publication(self, *, exclusive: bool = False) -> Publication:
        """A publication on this log (concurrent by default: any number of processes may offer)."""
        pub = Publication(
            self.log.view,
            self._values,
            cd.values_offset(PUBLISHER_LIMIT_COUNTER_ID),
            exclusive,
            self.update_publisher_limit,
        )
        self._owned.append(pub)
        return pub

    def add_subscriber(self, *, join_position: int | None = None) -> Image:
        """A subscriber with its own position counter, joining at the current tail (or ``join_position``)."""
        position = self.log.tail_position() if join_position is None else join_position
        if position % 32 != 0 or position < 0:
            raise ValueError(f"join_position={position} must be a non-negative multiple of 32")
        label = f"sub-pos: 0 {self.log.session_id} {self.log.stream_id} standalone:{self.name} @{position}"
        counter_id = self.counters.allocate(
            label, cd.SUBSCRIBER_POSITION_TYPE_ID, owner_id=self._pid, initial_value=position
        )
        self._subscriber_counters[id(image := Image(self.log.view, self._values, cd.values_offset(counter_id)))] = (
            counter_id
        )
        self._owned.append(image)
        self.update_publisher_limit()
        return image

    def remove_subscriber(self, image: Image) -> None:
        """Close a subscriber and free its position counter (publishers stop waiting for it)."""
        counter_id = self._subscriber_counters.pop(id(image), None)
        if counter_id is None:
            raise ValueError(f"{image!r} was not added by this StreamLog")
        image.close()
        self._owned.remove(image)
        self.counters.free(counter_id)

    # -- flow control ------------------------------------------------------------------------------
    def subscriber_positions(self) -> dict[int, int]:
        """Live subscribers' positions by counter id (dead owners' counters are reclaimed).

        On the publisher's back-pressure path: reads each record's state and type id straight
        from shared memory (no labels decoded) and checks owners' pids only every
        ``LIVENESS_CHECK_INTERVAL_S``.
        """
        now = time.monotonic()
        check = now - self._last_liveness_check >= LIVENESS_CHECK_INTERVAL_S
        if check:
            self._last_liveness_check = now
        metadata, values = self._metadata, self._values
        get_int32, get_int64 = native.get_int32_volatile, native.get_int64_volatile
        positions = {}
        for counter_id in range(self.counters.max_counter_id + 1):
            meta = cd.metadata_offset(counter_id)
            state = get_int32(metadata, meta + cd.RECORD_STATE_OFFSET)
            if state == cd.RECORD_UNUSED:
                break
            if state != cd.RECORD_ALLOCATED or _I32.unpack_from(metadata, meta + cd.TYPE_ID_OFFSET)[0] != (
                cd.SUBSCRIBER_POSITION_TYPE_ID
            ):
                continue
            value = cd.values_offset(counter_id)
            if check:
                owner = _I64.unpack_from(values, value + cd.OWNER_ID_OFFSET)[0]
                if owner != self._pid and not pid_alive(owner):
                    self.counters.free(counter_id)
                    continue
            positions[counter_id] = get_int64(values, value)
        return positions

    def update_publisher_limit(self) -> bool:
        """Clean what no subscriber can read any more, then raise the publisher limit.

        Returns False if another live process holds the update lock (try again later).
        """
        values = self._values
        if not native.compare_and_set_int64(values, self._lock_offset, 0, self._pid):
            holder = native.get_int64_volatile(values, self._lock_offset)
            if holder == self._pid or pid_alive(holder):
                return False
            if not native.compare_and_set_int64(values, self._lock_offset, holder, self._pid):
                return False
        try:
            update = compute_limit_and_clean(
                self.subscriber_positions().values(),
                current_limit=self._limit.get_volatile(),
                clean_position=self._clean.get_volatile(),
                term_length=self.log.term_length,
                term_window_length=self.log.term_window_length,
            )
            if update.clean_to > update.clean_from:
                self.log.clean(update.clean_from, update.clean_to)
                self._clean.set_ordered(update.clean_to)
            self.log.set_connected(update.connected)
            self._limit.set_ordered(update.limit)
        finally:
            native.put_int64_ordered(values, self._lock_offset, 0)
        return True

    def __repr__(self) -> str:
        return f"StreamLog({self.log!r})"
