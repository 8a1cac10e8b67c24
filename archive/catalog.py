"""The archive catalog: recording descriptors in ``<archive_dir>/archive.catalog``.

Layout and write order: :mod:`archive.catalog_descriptor`. ``Catalog.open(dir)`` maps the file
read-only from any process, also while a recorder writes it; each :meth:`Catalog.recordings`
call is a fresh snapshot. ``Catalog.open_writable(dir)`` is for recorders and tools that change
the catalog; several writers may share a directory (adding an entry takes an exclusive ``flock``
on the file). Opening writable also recovers interrupted recordings: an entry still marked
ACTIVE whose recorder is gone gets its stop position moved to the end of the valid prefix found
by walking the segment frames from the stored stop position, and is marked INTERRUPTED.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import pathlib
import struct
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import structlog

from logbuf.archive import catalog_descriptor as cat
from logbuf.directory import OWNER_ONLY_DIR_MODE, OWNER_ONLY_FILE_MODE
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.process import pid_alive

__all__ = ["Catalog", "CatalogError", "RecordingDescriptor", "RecordingState", "UnknownRecordingError"]


class RecordingState(IntEnum):
    INVALID = 0
    VALID = 1
    DELETED = 2


class CatalogError(ValueError):
    """The catalog is missing, malformed, full, or was asked for something it cannot do."""


class UnknownRecordingError(CatalogError, KeyError):
    """No recording with this id in the catalog."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class RecordingDescriptor:
    """One recording's entry, as read at one moment."""

    recording_id: int
    state: RecordingState
    active: bool
    """A recorder is still writing it (its process is alive and heartbeating)."""
    channel: str
    source_identity: str
    stream_id: int
    session_id: int
    initial_term_id: int
    term_length: int
    mtu: int
    segment_length: int
    start_position: int
    stop_position: int
    """While active: the recorded position so far (every byte before it is written and complete)."""
    start_time_ms: int
    stop_time_ms: int
    """Epoch ms; -1 while active."""
    interrupted: bool
    """The recorder died; stop_position is the end of the verified valid prefix."""

    @property
    def position_bits_to_shift(self) -> int:
        return self.term_length.bit_length() - 1

    @property
    def recorded_length(self) -> int:
        return self.stop_position - self.start_position

    def term_id_of(self, position: int) -> int:
        """Term id of the term holding ``position`` (wrapping as int32)."""
        return lbd.compute_term_id_from_position(position, self.position_bits_to_shift, self.initial_term_id)


def recorder_alive(pid: int, heartbeat_ms: int, now_ms: int) -> bool:
    """Whether the recorder of an ACTIVE entry still lives: its pid exists and it heartbeated lately."""
    return pid_alive(pid) and now_ms - heartbeat_ms <= cat.RECORDER_TIMEOUT_MS


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


_LOG_NAME: Final[str] = "archive.catalog"


class Catalog:
    """The recording descriptors of one archive directory (context manager)."""

    def __init__(self, path: pathlib.Path, fd: int, buffer: mmap.mmap, writable: bool) -> None:
        self.path = path
        self.file_mode = OWNER_ONLY_FILE_MODE
        """The mode of segment files created in this archive."""
        self.archive_dir = path.parent
        self._fd = fd
        self._buffer = buffer
        self._writable = writable
        self._closed = False
        self._log = structlog.get_logger().bind(role="archive", catalog=str(path))

    # -- opening ----------------------------------------------------------------------------------
    @classmethod
    def open(cls, archive_dir: str | os.PathLike[str]) -> Catalog:
        """Map the catalog read-only (any process, also while a recorder writes it)."""
        path = pathlib.Path(archive_dir) / cat.CATALOG_FILE_NAME
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise CatalogError(f"no archive catalog at {path} (is {archive_dir} an archive directory?)") from None
        return cls._map(path, fd, writable=False)

    @classmethod
    def open_writable(
        cls,
        archive_dir: str | os.PathLike[str],
        *,
        create: bool = True,
        capacity: int = cat.DEFAULT_CAPACITY,
        recover: bool = True,
        file_mode: int = OWNER_ONLY_FILE_MODE,
        dir_mode: int = OWNER_ONLY_DIR_MODE,
    ) -> Catalog:
        """Map the catalog for writing (creating the directory and file if ``create``).

        With ``recover``, recordings whose recorder died are closed at their valid prefix. A new
        directory, catalog and segment files get ``dir_mode`` and ``file_mode`` (the driver's: see
        :func:`logbuf.directory.access_modes`), whatever the umask.
        """
        directory = pathlib.Path(archive_dir)
        path = directory / cat.CATALOG_FILE_NAME
        if create and not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            os.chmod(directory, dir_mode)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        try:
            fd = os.open(path, flags, file_mode)
        except FileNotFoundError:
            raise CatalogError(f"no archive catalog at {path} (is {archive_dir} an archive directory?)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.fstat(fd).st_size == 0:
                    os.fchmod(fd, file_mode)
                    length = max(capacity, cat.HEADER_LENGTH + cat.ENTRY_LENGTH)
                    os.ftruncate(fd, length)
                    header = cat.HEADER.pack(cat.MAGIC, cat.VERSION, cat.HEADER_LENGTH, cat.ENTRY_LENGTH)
                    os.pwrite(fd, header, 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(fd)
            raise
        catalog = cls._map(path, fd, writable=True)
        catalog.file_mode = file_mode
        if recover:
            try:
                catalog.recover_interrupted()
            except BaseException:
                catalog.close()
                raise
        return catalog

    @classmethod
    def _map(cls, path: pathlib.Path, fd: int, *, writable: bool) -> Catalog:
        try:
            size = os.fstat(fd).st_size
            if size < cat.HEADER_LENGTH:
                raise CatalogError(f"catalog {path}: {size} bytes is shorter than its {cat.HEADER_LENGTH}-byte header")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            buffer = mmap.mmap(fd, size, prot=prot)
            try:
                cat.check_header(buffer, str(path))
            except cat.CatalogFormatError as e:
                buffer.close()
                raise CatalogError(str(e)) from None
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, buffer, writable)

    def _ensure_mapped(self, length: int) -> mmap.mmap:
        """Remap if the file grew (another writer added entries past our mapping)."""
        if len(self._buffer) < length:
            size = os.fstat(self._fd).st_size
            if size > len(self._buffer):
                prot = mmap.PROT_READ | (mmap.PROT_WRITE if self._writable else 0)
                old = self._buffer
                self._buffer = mmap.mmap(self._fd, size, prot=prot)
                try:
                    old.close()
                except BufferError:
                    pass
        return self._buffer

    # -- reading --------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise CatalogError(f"catalog {self.path} is closed")

    @property
    def next_recording_id(self) -> int:
        self._check_open()
        return cat.next_recording_id_volatile(self._buffer)

    def recordings(self) -> list[RecordingDescriptor]:
        """A fresh snapshot of every entry that was ever added (VALID, DELETED; INVALID ones skipped)."""
        self._check_open()
        count = cat.next_recording_id_volatile(self._buffer)
        buffer = self._ensure_mapped(cat.entry_offset(count))
        now_ms = _now_ms()
        result = []
        for recording_id in range(min(count, cat.capacity_entries(len(buffer)))):
            descriptor = self._read(buffer, recording_id, now_ms)
            if descriptor is not None:
                result.append(descriptor)
        return result

    def recording(self, recording_id: int) -> RecordingDescriptor:
        """The descriptor of ``recording_id``; :class:`UnknownRecordingError` naming it if there is none."""
        self._check_open()
        count = cat.next_recording_id_volatile(self._buffer)
        if not isinstance(recording_id, int) or not 0 <= recording_id < count:
            raise UnknownRecordingError(
                f"no recording {recording_id!r} in {self.path} (recording ids are 0..{count - 1})"
                if count
                else f"no recording {recording_id!r} in {self.path}: the catalog is empty"
            )
        buffer = self._ensure_mapped(cat.entry_offset(recording_id + 1))
        descriptor = self._read(buffer, recording_id, _now_ms())
        if descriptor is None:
            raise UnknownRecordingError(f"recording {recording_id} in {self.path} was never completely added (INVALID)")
        return descriptor

    def _read(self, buffer: mmap.mmap, recording_id: int, now_ms: int) -> RecordingDescriptor | None:
        entry = cat.entry_offset(recording_id)
        state = cat.state_volatile(buffer, entry)
        if state == cat.STATE_INVALID:
            return None
        flags = cat.flags_volatile(buffer, entry)
        stop_position = cat.stop_position_volatile(buffer, entry)
        heartbeat_ms = cat.heartbeat_volatile(buffer, entry)
        pid = cat.INT32.unpack_from(buffer, entry + cat.RECORDER_PID_OFFSET)[0]
        rid, start_position, start_time_ms, stop_time_ms = cat.IDENTITY.unpack_from(
            buffer, entry + cat.RECORDING_ID_OFFSET
        )
        initial_term_id, term_length, mtu, segment_length, session_id, stream_id = cat.STREAM_PARAMS.unpack_from(
            buffer, entry + cat.INITIAL_TERM_ID_OFFSET
        )
        channel = _string(buffer, entry + cat.CHANNEL_LENGTH_OFFSET, cat.CHANNEL_MAX_LENGTH)
        source_identity = _string(buffer, entry + cat.SOURCE_IDENTITY_LENGTH_OFFSET, cat.SOURCE_IDENTITY_MAX_LENGTH)
        active = bool(flags & cat.FLAG_ACTIVE)
        interrupted = bool(flags & cat.FLAG_INTERRUPTED)
        if active and not recorder_alive(pid, heartbeat_ms, now_ms):
            # Not yet recovered by a writer: the stored stop position is a safe (maybe short) prefix.
            active, interrupted, stop_time_ms = False, True, heartbeat_ms
        return RecordingDescriptor(
            recording_id=rid,
            state=RecordingState(state) if state in (1, 2) else RecordingState.INVALID,
            active=active,
            channel=channel,
            source_identity=source_identity,
            stream_id=stream_id,
            session_id=session_id,
            initial_term_id=initial_term_id,
            term_length=term_length,
            mtu=mtu,
            segment_length=segment_length,
            start_position=start_position,
            stop_position=stop_position,
            start_time_ms=start_time_ms,
            stop_time_ms=stop_time_ms if not active else cat.NULL_TIME,
            interrupted=interrupted,
        )

    # -- writing ---------------------------------------------------------------------------------------
    def _check_writable(self) -> None:
        self._check_open()
        if not self._writable:
            raise CatalogError(f"catalog {self.path} was opened read-only; use Catalog.open_writable()")

    def _entry(self, recording_id: int) -> int:
        count = cat.next_recording_id_volatile(self._buffer)
        if not 0 <= recording_id < count:
            raise UnknownRecordingError(f"no recording {recording_id!r} in {self.path}")
        self._ensure_mapped(cat.entry_offset(recording_id + 1))
        return cat.entry_offset(recording_id)

    def add_recording(
        self,
        *,
        channel: str,
        source_identity: str,
        stream_id: int,
        session_id: int,
        initial_term_id: int,
        term_length: int,
        mtu: int,
        segment_length: int,
        start_position: int,
        start_time_ms: int | None = None,
        pid: int | None = None,
    ) -> int:
        """Add an ACTIVE recording (this process as its recorder); returns its id."""
        self._check_writable()
        channel_bytes = cat.check_string("channel", channel, cat.CHANNEL_MAX_LENGTH)
        source_bytes = cat.check_string("source_identity", source_identity, cat.SOURCE_IDENTITY_MAX_LENGTH)
        if start_position < 0 or start_position % 32:
            raise CatalogError(f"start_position={start_position} must be a non-negative multiple of 32")
        now_ms = _now_ms() if start_time_ms is None else start_time_ms
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            self._ensure_mapped(0)
            recording_id = cat.next_recording_id_volatile(self._buffer)
            entry = cat.entry_offset(recording_id)
            if entry + cat.ENTRY_LENGTH > os.fstat(self._fd).st_size:
                os.ftruncate(self._fd, max(2 * os.fstat(self._fd).st_size, entry + cat.ENTRY_LENGTH))
            buffer = self._ensure_mapped(entry + cat.ENTRY_LENGTH)
            buffer[entry : entry + cat.ENTRY_LENGTH] = bytes(cat.ENTRY_LENGTH)  # an INVALID leftover of a crash
            cat.INT32.pack_into(buffer, entry + cat.RECORDER_PID_OFFSET, os.getpid() if pid is None else pid)
            cat.IDENTITY.pack_into(
                buffer, entry + cat.RECORDING_ID_OFFSET, recording_id, start_position, now_ms, cat.NULL_TIME
            )
            cat.STREAM_PARAMS.pack_into(
                buffer,
                entry + cat.INITIAL_TERM_ID_OFFSET,
                initial_term_id,
                term_length,
                mtu,
                segment_length,
                session_id,
                stream_id,
            )
            cat.INT32.pack_into(buffer, entry + cat.CHANNEL_LENGTH_OFFSET, len(channel_bytes))
            buffer[entry + cat.CHANNEL_OFFSET : entry + cat.CHANNEL_OFFSET + len(channel_bytes)] = channel_bytes
            cat.INT32.pack_into(buffer, entry + cat.SOURCE_IDENTITY_LENGTH_OFFSET, len(source_bytes))
            start = entry + cat.SOURCE_IDENTITY_OFFSET
            buffer[start : start + len(source_bytes)] = source_bytes
            cat.stop_position_ordered(buffer, entry, start_position)
            cat.heartbeat_ordered(buffer, entry, _now_ms())
            cat.flags_ordered(buffer, entry, cat.FLAG_ACTIVE)
            cat.state_ordered(buffer, entry, cat.STATE_VALID)
            cat.next_recording_id_ordered(buffer, recording_id + 1)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._log.info(
            "recording.added",
            recording_id=recording_id,
            channel=channel,
            stream_id=stream_id,
            session_id=session_id,
            start_position=start_position,
        )
        return recording_id

    def position_writer(self, recording_id: int) -> RecordingPositionWriter:
        """The recorder's handle on one entry's hot fields (stop position, heartbeat)."""
        self._check_writable()
        return RecordingPositionWriter(self, self._entry(recording_id))

    def update_stop_position(self, recording_id: int, position: int) -> None:
        self._check_writable()
        cat.stop_position_ordered(self._buffer, self._entry(recording_id), position)

    def stop_recording(
        self, recording_id: int, stop_position: int, *, interrupted: bool = False, stop_time_ms: int | None = None
    ) -> None:
        """Record the final stop position and time and clear ACTIVE (INTERRUPTED if ``interrupted``)."""
        self._check_writable()
        entry = self._entry(recording_id)
        buffer = self._buffer
        cat.stop_position_ordered(buffer, entry, stop_position)
        cat.INT64.pack_into(buffer, entry + cat.STOP_TIME_OFFSET, _now_ms() if stop_time_ms is None else stop_time_ms)
        cat.flags_ordered(buffer, entry, cat.FLAG_INTERRUPTED if interrupted else 0)
        self._log.info(
            "recording.stopped", recording_id=recording_id, stop_position=stop_position, interrupted=interrupted
        )

    def set_state(self, recording_id: int, state: RecordingState) -> None:
        self._check_writable()
        cat.state_ordered(self._buffer, self._entry(recording_id), int(state))

    def set_start_position(self, recording_id: int, start_position: int) -> None:
        """Move the start position (retention: whole segments before it were dropped)."""
        self._check_writable()
        entry = self._entry(recording_id)
        cat.INT64.pack_into(self._buffer, entry + cat.START_POSITION_OFFSET, start_position)

    def raw_entry(self, recording_id: int) -> tuple[int, int, int]:
        """(flags, recorder pid, heartbeat ms) as stored (for tools and tests)."""
        self._check_open()
        entry = self._entry(recording_id) if self._writable else cat.entry_offset(recording_id)
        buffer = self._ensure_mapped(entry + cat.ENTRY_LENGTH)
        pid = cat.INT32.unpack_from(buffer, entry + cat.RECORDER_PID_OFFSET)[0]
        return cat.flags_volatile(buffer, entry), pid, cat.heartbeat_volatile(buffer, entry)

    def recover_interrupted(self) -> list[int]:
        """Close every ACTIVE recording whose recorder died at its valid prefix; returns their ids."""
        from logbuf.archive.verify import scan_valid_prefix  # verify reads descriptors: imported late

        self._check_writable()
        recovered = []
        now_ms = _now_ms()
        count = cat.next_recording_id_volatile(self._buffer)
        buffer = self._ensure_mapped(cat.entry_offset(count))
        for recording_id in range(count):
            entry = cat.entry_offset(recording_id)
            if cat.state_volatile(buffer, entry) != cat.STATE_VALID:
                continue
            flags = cat.flags_volatile(buffer, entry)
            if not flags & cat.FLAG_ACTIVE:
                continue
            pid = cat.INT32.unpack_from(buffer, entry + cat.RECORDER_PID_OFFSET)[0]
            heartbeat_ms = cat.heartbeat_volatile(buffer, entry)
            if recorder_alive(pid, heartbeat_ms, now_ms):
                continue
            descriptor = self._read(buffer, recording_id, now_ms)
            assert descriptor is not None
            stored = descriptor.stop_position
            end = scan_valid_prefix(self.archive_dir, descriptor, stored)
            self.stop_recording(recording_id, end, interrupted=True, stop_time_ms=heartbeat_ms)
            self._log.warning(
                "recording.interrupted",
                recording_id=recording_id,
                recorder_pid=pid,
                stored_stop_position=stored,
                recovered_stop_position=end,
            )
            recovered.append(recording_id)
        return recovered

    # -- closing ----------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._buffer.close()
        except BufferError:
            pass
        os.close(self._fd)

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Catalog(path={str(self.path)!r}, writable={self._writable})"


class RecordingPositionWriter:
    """Release-stores one recording's stop position and heartbeat (the recorder's hot path)."""

    def __init__(self, catalog: Catalog, entry: int) -> None:
        self._catalog = catalog
        self._entry = entry

    def set_position(self, position: int) -> None:
        cat.stop_position_ordered(self._catalog._buffer, self._entry, position)

    def heartbeat(self, now_ms: int) -> None:
        cat.heartbeat_ordered(self._catalog._buffer, self._entry, now_ms)


def _string(buffer: mmap.mmap, length_offset: int, max_length: int) -> str:
    length = struct.unpack_from("<i", buffer, length_offset)[0]
    length = max(0, min(length, max_length))
    start = length_offset + 4
    return bytes(buffer[start : start + length]).decode(errors="replace")
