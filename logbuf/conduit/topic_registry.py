"""The topic registry (``topics.dat``, layout in :mod:`topic_registry_descriptor`): names of the topics seen
on this host, appended by any client, scanned by any reader.

``TopicRegistry.create(directory)`` (the driver) or ``TopicRegistry.open(directory)`` (clients, tools);
:meth:`TopicRegistry.register` appends a name unless this registry already holds it; :meth:`TopicRegistry.poll`
reads the records appended since the last poll into the local ``names`` map (id -> name).
"""

from __future__ import annotations

import os
import time
from typing import Final

from logbuf import native
from logbuf.conduit import topic_registry_descriptor as trd
from logbuf.errors import LogbufError, ShmError
from logbuf.shm import Segment
from logbuf.topic_names import check_topic_name, topic_id_of_bytes

__all__ = ["TopicRegistry", "TopicRegistryError", "TopicRegistryFullError", "topic_registry_path"]

STUCK_RECORD_TIMEOUT_NS: Final[int] = 1_000_000_000
"""A record left half-written this long (its writer died) is skipped by readers."""


class TopicRegistryError(ShmError):
    """The registry is missing, not a registry, or its records cannot be trusted."""


class TopicRegistryFullError(LogbufError):
    """No room for another name: raise the driver's ``topic_registry_length``."""


class TopicCollisionError(LogbufError):
    """Two names with one topic id (a 63-bit hash collision, or a forged record)."""


def topic_registry_path(directory: str) -> str:
    return os.path.join(directory, trd.TOPIC_REGISTRY_FILE)


class TopicRegistry:
    """A mapped registry with this process's scan cursor and the names read so far."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.buffer = memoryview(segment.buffer)
        if len(self.buffer) < trd.HEADER_LENGTH:
            raise TopicRegistryError(f"{segment.name}: {len(self.buffer)} bytes is shorter than its header")
        magic, capacity = trd.FILE_HEADER.unpack_from(self.buffer, 0)
        if magic != trd.MAGIC:
            raise TopicRegistryError(f"{segment.name}: magic 0x{magic:016x} is not a topic registry's")
        if capacity != len(self.buffer) - trd.HEADER_LENGTH:
            raise TopicRegistryError(f"{segment.name}: records capacity {capacity} does not fit the file")
        self.capacity: int = capacity
        self.names: dict[int, str] = {}
        """Topic id -> name of every record read so far."""
        self.invalid_records = 0
        """Records skipped: an id that is not its name's, a name that is not a topic name, a stuck writer."""
        self._cursor = 0
        self._stuck_since_ns = 0

    @property
    def path(self) -> str:
        return self.segment.name

    @classmethod
    def create(
        cls, directory: str, length: int = trd.DEFAULT_TOPIC_REGISTRY_LENGTH, *, mode: int = 0o600
    ) -> TopicRegistry:
        segment = Segment.create_file(topic_registry_path(directory), trd.check_registry_length(length), mode=mode)
        trd.FILE_HEADER.pack_into(segment.buffer, 0, trd.MAGIC, length - trd.HEADER_LENGTH)
        return cls(segment)

    @classmethod
    def open(cls, directory: str, *, writable: bool = True) -> TopicRegistry:
        path = topic_registry_path(directory)
        try:
            return cls(Segment.open_file(path, writable=writable))
        except (ShmError, OSError) as e:
            if isinstance(e, TopicRegistryError):
                raise
            raise TopicRegistryError(
                f"cannot map the topic registry {path}: {e} (a driver with topics makes it)"
            ) from None

    @property
    def used_length(self) -> int:
        """Record bytes claimed so far (may exceed the capacity once a claim failed)."""
        return native.get_int64_volatile(self.buffer, trd.TAIL_OFFSET)

    def poll(self) -> int:
        """Read the records committed since the last poll into :attr:`names`; returns how many were new."""
        buffer, capacity = self.buffer, self.capacity
        tail = min(native.get_int64_volatile(buffer, trd.TAIL_OFFSET), capacity)
        found = 0
        while self._cursor + trd.RECORD_HEADER_LENGTH <= tail:
            offset = trd.RECORDS_OFFSET + self._cursor
            length = native.get_int32_volatile(buffer, offset)
            if length <= 0:
                if not self._skip_stuck(length):
                    break
                continue
            self._stuck_since_ns = 0
            _, name_length, topic_id = trd.RECORD_HEADER.unpack_from(buffer, offset)
            if (
                length % trd.RECORD_ALIGNMENT
                or self._cursor + length > capacity
                or not 0 < name_length <= length - trd.RECORD_HEADER_LENGTH
            ):
                self.invalid_records += 1
                at, self._cursor = self._cursor, capacity  # a length that cannot be true: nothing after it is trusted
                raise TopicRegistryError(f"{self.path}: the record at {at} has length {length}, which cannot be true")
            self._cursor += length
            name_bytes = bytes(buffer[offset + trd.NAME_OFFSET : offset + trd.NAME_OFFSET + name_length])
            if topic_id_of_bytes(name_bytes) != topic_id:
                self.invalid_records += 1
                continue
            try:
                name = name_bytes.decode("utf-8")
                check_topic_name(name)
            except (UnicodeDecodeError, ValueError):
                self.invalid_records += 1
                continue
            if self.names.setdefault(topic_id, name) == name:
                found += 1
            else:
                self.invalid_records += 1
        return found

    def _skip_stuck(self, length: int) -> bool:
        """A record being written (< 0: its length known) that stays so for the timeout is skipped."""
        now_ns = time.monotonic_ns()
        if length == 0 or self._stuck_since_ns == 0:
            if self._stuck_since_ns == 0:
                self._stuck_since_ns = now_ns
            return False
        if now_ns - self._stuck_since_ns < STUCK_RECORD_TIMEOUT_NS:
            return False
        self.invalid_records += 1
        self._cursor += -length
        self._stuck_since_ns = 0
        return True

    def name_of(self, topic_id: int) -> str | None:
        """The name of ``topic_id``, polling for new records if it is not known yet."""
        name = self.names.get(topic_id)
        if name is None and self.poll():
            name = self.names.get(topic_id)
        return name

    def register(self, name: str) -> int:
        """The topic id of ``name``, appending a record unless one is already here (TopicCollisionError if
        another name has its id; TopicRegistryFullError if there is no room)."""
        name_bytes = check_topic_name(name)
        topic_id = topic_id_of_bytes(name_bytes)
        known = self.name_of(topic_id)
        if known == name:
            return topic_id
        if known is not None:
            raise TopicCollisionError(f"topic {name!r} has the id 0x{topic_id:016x} of topic {known!r}")
        self.append(topic_id, name_bytes)
        self.names[topic_id] = name
        return topic_id

    def append(self, topic_id: int, name_bytes: bytes) -> None:
        """Append one record (not checked against the records already here)."""
        length = trd.record_length(len(name_bytes))
        claimed = native.get_and_add_int64(self.buffer, trd.TAIL_OFFSET, length)
        if claimed + length > self.capacity:
            raise TopicRegistryFullError(
                f"{self.path} is full ({self.capacity} bytes of records): raise the driver's topic_registry_length"
            )
        offset = trd.RECORDS_OFFSET + claimed
        native.put_int32_ordered(self.buffer, offset, -length)
        trd.RECORD_HEADER.pack_into(self.buffer, offset, -length, len(name_bytes), topic_id)
        self.buffer[offset + trd.NAME_OFFSET : offset + trd.NAME_OFFSET + len(name_bytes)] = name_bytes
        native.put_int32_ordered(self.buffer, offset, length)

    def close(self) -> None:
        self.buffer.release()
        self.segment.close()

    def __enter__(self) -> TopicRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
