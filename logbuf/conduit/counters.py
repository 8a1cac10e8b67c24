"""Counters in shared memory: allocate, label, read and free (Agrona's CountersManager/Reader shape).

Allocation claims a record by CAS on its record state, so several processes may allocate
(standalone logs); a media driver allocates from its conductor alone. Values are read and
written through :class:`logbuf.native.Position` (acquire loads, release stores).

Allocation is O(1) in the number of counters (Agrona's free list and high-water mark): a manager
first reuses the oldest record it freed once its free-to-reuse deadline has passed, then takes the
next never-used record; only when both are exhausted does it scan every record, for records other
processes freed.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from logbuf import native
from logbuf.conduit import counters_descriptor as cd

_I32 = struct.Struct("=i")
_I64 = struct.Struct("=q")
_CLAIMING = 2
"""Record state while an allocating writer fills the record in."""


@dataclass(frozen=True, slots=True)
class CounterInfo:
    """One allocated counter as read from shared memory."""

    counter_id: int
    type_id: int
    value: int
    label: str
    key: bytes
    registration_id: int
    owner_id: int
    reference_id: int


class CountersReader:
    """Reads counters from a metadata buffer and a values buffer (never writes)."""

    def __init__(self, metadata: memoryview, values: memoryview) -> None:
        cd.check_values_length(len(values))
        if len(metadata) < (len(values) // cd.COUNTER_LENGTH) * cd.METADATA_LENGTH:
            raise ValueError(
                f"counters metadata of {len(metadata)} bytes is too short for {len(values) // cd.COUNTER_LENGTH} counters"
            )
        self.metadata = metadata
        self.values = values
        self.max_counter_id = len(values) // cd.COUNTER_LENGTH - 1

    def _check_id(self, counter_id: int) -> None:
        if not 0 <= counter_id <= self.max_counter_id:
            raise ValueError(f"counter_id={counter_id} is outside 0..{self.max_counter_id}")

    def state(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return native.get_int32_volatile(self.metadata, cd.metadata_offset(counter_id) + cd.RECORD_STATE_OFFSET)

    def type_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return int(_I32.unpack_from(self.metadata, cd.metadata_offset(counter_id) + cd.TYPE_ID_OFFSET)[0])

    def value(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return native.get_int64_volatile(self.values, cd.values_offset(counter_id))

    def label(self, counter_id: int) -> str:
        self._check_id(counter_id)
        base = cd.metadata_offset(counter_id)
        length = _I32.unpack_from(self.metadata, base + cd.LABEL_LENGTH_OFFSET)[0]
        length = max(0, min(length, cd.MAX_LABEL_LENGTH))
        return bytes(self.metadata[base + cd.LABEL_OFFSET : base + cd.LABEL_OFFSET + length]).decode("utf-8", "replace")

    def key(self, counter_id: int) -> bytes:
        self._check_id(counter_id)
        base = cd.metadata_offset(counter_id) + cd.KEY_OFFSET
        return bytes(self.metadata[base : base + cd.MAX_KEY_LENGTH])

    def owner_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return int(_I64.unpack_from(self.values, cd.values_offset(counter_id) + cd.OWNER_ID_OFFSET)[0])

    def info(self, counter_id: int) -> CounterInfo:
        base = cd.values_offset(counter_id)
        reg, owner, ref = struct.unpack_from("=qqq", self.values, base + cd.REGISTRATION_ID_OFFSET)
        return CounterInfo(
            counter_id,
            self.type_id(counter_id),
            self.value(counter_id),
            self.label(counter_id),
            self.key(counter_id),
            reg,
            owner,
            ref,
        )

    def __iter__(self) -> Iterator[CounterInfo]:
        """Allocated counters, in id order; stops at the first never-used record."""
        for counter_id in range(self.max_counter_id + 1):
            state = self.state(counter_id)
            if state == cd.RECORD_UNUSED:
                return
            if state == cd.RECORD_ALLOCATED:
                yield self.info(counter_id)

    def position(self, counter_id: int) -> native.Position:
        """A :class:`Position` over a counter's value (for readers and its single writer)."""
        self._check_id(counter_id)
        return native.Position(self.values, cd.values_offset(counter_id))


class CountersManager(CountersReader):
    """Allocates and frees counters; safe across processes (records are claimed by CAS)."""

    def __init__(self, metadata: memoryview, values: memoryview, *, free_to_reuse_timeout_ns: int = 0) -> None:
        super().__init__(metadata, values)
        self.free_to_reuse_timeout_ns = free_to_reuse_timeout_ns
        self._high_water_mark = 0
        """Records below it have been used, as far as this manager knows."""
        self._freed: deque[int] = deque()
        """Records this manager freed, oldest first (so their reuse deadlines are in order)."""
        self._owner_of: dict[int, int] = {}
        self._owned: dict[int, int] = {}
        """Counters this manager allocated and has not freed, by owner id (a driver's per-client share)."""

    @property
    def capacity(self) -> int:
        """How many counters the buffers hold."""
        return self.max_counter_id + 1

    def allocate(
        self,
        label: str,
        type_id: int = 0,
        key: bytes = b"",
        *,
        registration_id: int = 0,
        owner_id: int = 0,
        reference_id: int = 0,
        initial_value: int = 0,
    ) -> int:
        """Claim a free record and describe it; returns the counter id.

        Raises :class:`MemoryError` naming the capacity when every record is allocated or waiting
        out its free-to-reuse timeout.
        """
        encoded = label.encode("utf-8")[: cd.MAX_LABEL_LENGTH]
        if len(key) > cd.MAX_KEY_LENGTH:
            raise ValueError(f"counter key of {len(key)} bytes exceeds {cd.MAX_KEY_LENGTH}")
        counter_id = self._claim(int(time.time() * 1000))
        if counter_id < 0:
            raise MemoryError(
                f"no counter records left (capacity {self.capacity}: set counters_buffer_length"
                f" to {cd.COUNTER_LENGTH} bytes per counter) for {label!r}"
            )
        meta = cd.metadata_offset(counter_id)
        value = cd.values_offset(counter_id)
        struct.pack_into("=qqqq", self.values, value, initial_value, registration_id, owner_id, reference_id)
        struct.pack_into("=i", self.metadata, meta + cd.TYPE_ID_OFFSET, type_id)
        struct.pack_into("=q", self.metadata, meta + cd.FREE_FOR_REUSE_DEADLINE_OFFSET, cd.NOT_FREE_TO_REUSE)
        self.metadata[meta + cd.KEY_OFFSET : meta + cd.KEY_OFFSET + cd.MAX_KEY_LENGTH] = key.ljust(
            cd.MAX_KEY_LENGTH, b"\0"
        )
        struct.pack_into("=i", self.metadata, meta + cd.LABEL_LENGTH_OFFSET, len(encoded))
        self.metadata[meta + cd.LABEL_OFFSET : meta + cd.LABEL_OFFSET + len(encoded)] = encoded
        native.put_int64_ordered(self.values, value, initial_value)
        native.put_int32_ordered(self.metadata, meta + cd.RECORD_STATE_OFFSET, cd.RECORD_ALLOCATED)
        self._owner_of[counter_id] = owner_id
        self._owned[owner_id] = self._owned.get(owner_id, 0) + 1
        return counter_id

    def owned_by(self, owner_id: int) -> int:
        """How many counters this manager allocated for ``owner_id`` (a client id) and has not freed."""
        return self._owned.get(owner_id, 0)

    def has_room(self, count: int) -> bool:
        """Can ``count`` counters be allocated now? O(count): never-used records first, then the records
        this manager freed whose deadline has passed (records other processes freed are not counted)."""
        room = self.max_counter_id + 1 - self._high_water_mark
        if room >= count:
            return True
        now_ms = int(time.time() * 1000)
        for counter_id in self._freed:
            if room >= count:
                break
            meta = cd.metadata_offset(counter_id)
            if native.get_int64_volatile(self.metadata, meta + cd.FREE_FOR_REUSE_DEADLINE_OFFSET) > now_ms:
                break
            if native.get_int32_volatile(self.metadata, meta + cd.RECORD_STATE_OFFSET) == cd.RECORD_RECLAIMED:
                room += 1
        return room >= count

    def _claim(self, now_ms: int) -> int:
        """A record moved to the claiming state: a freed one whose deadline passed, else the next
        never-used one, else any reusable one (a scan); -1 if none."""
        freed = self._freed
        while freed:
            counter_id = freed[0]
            meta = cd.metadata_offset(counter_id)
            if native.get_int32_volatile(self.metadata, meta + cd.RECORD_STATE_OFFSET) != cd.RECORD_RECLAIMED:
                freed.popleft()  # reused by another process meanwhile
                continue
            if native.get_int64_volatile(self.metadata, meta + cd.FREE_FOR_REUSE_DEADLINE_OFFSET) > now_ms:
                break  # the oldest is not reusable yet, so neither is any later one
            freed.popleft()
            if self._try_claim(counter_id, cd.RECORD_RECLAIMED):
                return counter_id
        while self._high_water_mark <= self.max_counter_id:
            counter_id = self._high_water_mark
            self._high_water_mark += 1
            if self._try_claim(counter_id, cd.RECORD_UNUSED):
                return counter_id
        for counter_id in range(self.max_counter_id + 1):  # records other processes freed
            meta = cd.metadata_offset(counter_id)
            state = native.get_int32_volatile(self.metadata, meta + cd.RECORD_STATE_OFFSET)
            if state == cd.RECORD_RECLAIMED:
                deadline = native.get_int64_volatile(self.metadata, meta + cd.FREE_FOR_REUSE_DEADLINE_OFFSET)
                if deadline <= now_ms and self._try_claim(counter_id, state):
                    return counter_id
            elif state == cd.RECORD_UNUSED and self._try_claim(counter_id, state):
                return counter_id
        return -1

    def _try_claim(self, counter_id: int, expected_state: int) -> bool:
        meta = cd.metadata_offset(counter_id)
        return native.compare_and_set_int32(self.metadata, meta + cd.RECORD_STATE_OFFSET, expected_state, _CLAIMING)

    def free(self, counter_id: int) -> None:
        """Release a counter; its record may be reused after the free-to-reuse timeout."""
        self._check_id(counter_id)
        meta = cd.metadata_offset(counter_id)
        deadline = int(time.time() * 1000) + self.free_to_reuse_timeout_ns // 1_000_000  # epoch ms, as Aeron lays it
        struct.pack_into("=q", self.metadata, meta + cd.FREE_FOR_REUSE_DEADLINE_OFFSET, deadline)
        native.put_int32_ordered(self.metadata, meta + cd.RECORD_STATE_OFFSET, cd.RECORD_RECLAIMED)
        self._freed.append(counter_id)
        owner_id = self._owner_of.pop(counter_id, None)
        if owner_id is not None:
            left = self._owned[owner_id] - 1
            if left:
                self._owned[owner_id] = left
            else:
                del self._owned[owner_id]

    def set_value(self, counter_id: int, value: int) -> None:
        self._check_id(counter_id)
        native.put_int64_ordered(self.values, cd.values_offset(counter_id), value)
