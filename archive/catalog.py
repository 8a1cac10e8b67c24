"""The archive catalog: recording descriptors in ``<archive_dir>/archive.catalog``.

Layout and write order: :mod:`archive.catalog_descriptor`. ``Catalog.open(dir)`` maps the file
read-only from any process, also while a recorder writes it; each :meth:`Catalog.recordings`
call is a fresh snapshot. ``Catalog.open_writable(dir)`` is for recorders and tools that change
the catalog; several writers may share a directory (adding an entry takes an exclusive ``flock``
on the file). Opening writable also recovers interrupted recordings: an entry still marked
ACTIVE whose recorder is gone gets its stop position moved to the end of the valid prefix found
by walking the segment frames from the stored stop position, and is marked INTERRUPTED.

The file is memory-mapped, so every page of it is allocated (``posix_fallocate``, as the logs are) before
anything is written there: a write to a page of a sparse file that a full filesystem cannot back would be a
SIGBUS, not an error. A new file is allocated whole; an entry's page is allocated before the entry is
written (in a catalog made sparse by an earlier version too), and a catalog that must grow allocates its
new length first. If the filesystem is full, :meth:`Catalog.add_recording` raises a :class:`CatalogError`
naming the catalog and the space, and nothing of the catalog has changed.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import pathlib
import struct
import time
from dataclasses import dataclass
from typing import Final

import structlog

from logbuf.archive import catalog_descriptor as cat
from logbuf.archive.recording import ChecksumType, RecordingDescriptor, RecordingState
from logbuf.archive.verify import scan_valid_prefix
from logbuf.directory import OWNER_ONLY_DIR_MODE, OWNER_ONLY_FILE_MODE
from logbuf.errors import LogbufError
from logbuf.process import pid_alive
from logbuf.shm import StorageSpaceError, reserve

__all__ = [
    "Catalog",
    "CatalogError",
    "CatalogProblem",
    "ChecksumType",
    "RecordingDescriptor",
    "RecordingState",
    "UnknownRecordingError",
]


class CatalogError(LogbufError):
    """The catalog is missing, malformed, full, or was asked for something it cannot do."""


class UnknownRecordingError(CatalogError, KeyError):
    """No recording with this id in the catalog."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class CatalogProblem:
    """Damage to the catalog that loses recordings: entries the readers cannot trust or cannot find."""

    first_recording_id: int
    last_recording_id: int
    """The recordings affected (one, or a range for a truncated file)."""
    reason: str

    def __str__(self) -> str:
        return self.reason


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
                    try:
                        reserve(fd, length, f"archive catalog {path}")
                    except StorageSpaceError as e:
                        os.ftruncate(fd, 0)  # no half-made catalog: the next open tries again
                        raise CatalogError(str(e)) from None
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
    def from_snapshot(cls, data: bytes, label: str) -> Catalog:
        """A read-only catalog over a copy of the file's bytes (an archive on object storage); ``label``
        names it in messages. It does not change: each read is of the copy."""
        try:
            cat.check_header(data, label)
        except cat.CatalogFormatError as e:
            raise CatalogError(str(e)) from None
        buffer = mmap.mmap(-1, max(len(data), 1))  # anonymous memory, so that reads are as for a file
        buffer[: len(data)] = data
        return cls(pathlib.Path(label), -1, buffer, False)

    def snapshot_bytes(self) -> bytes:
        """A copy of the catalog file's header and entries as they are now (for uploading)."""
        self._check_open()
        count = cat.next_recording_id_volatile(self._buffer)
        buffer = self._ensure_mapped(cat.entry_offset(count))
        return bytes(buffer[: min(len(buffer), cat.entry_offset(max(count, 0)))])

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
        if len(self._buffer) < length and self._fd >= 0:
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
        """A fresh snapshot of every entry that was ever added (VALID, DELETED); entries that are damaged
        or missing are left out here and reported by :meth:`problems`."""
        self._check_open()
        count = cat.next_recording_id_volatile(self._buffer)
        buffer = self._ensure_mapped(cat.entry_offset(count))
        now_ms = _now_ms()
        result = []
        for recording_id in range(min(count, cat.capacity_entries(len(buffer)))):
            if self._entry_problem(buffer, recording_id) is not None:
                continue
            descriptor = self._read(buffer, recording_id, now_ms)
            if descriptor is not None:
                result.append(descriptor)
        return result

    def problems(self) -> list[CatalogProblem]:
        """Damage that :meth:`recordings` leaves out: entries below the next recording id that are INVALID
        (every add sets VALID before it counts the entry, so these were damaged afterwards), hold an
        unknown state or another recording's id, and recordings a truncated file no longer holds."""
        self._check_open()
        count = cat.next_recording_id_volatile(self._buffer)
        if count < 0:
            return [CatalogProblem(0, 0, f"catalog {self.path}: the next recording id {count} is negative")]
        buffer = self._ensure_mapped(cat.entry_offset(count))
        held = min(count, cat.capacity_entries(len(buffer)))
        found = []
        for recording_id in range(held):
            reason = self._entry_problem(buffer, recording_id)
            if reason is not None:
                found.append(CatalogProblem(recording_id, recording_id, reason))
        if held < count:
            found.append(
                CatalogProblem(
                    held,
                    count - 1,
                    f"catalog {self.path} is truncated: its header counts {count} recordings but the file "
                    f"({len(buffer)} bytes) holds whole entries for {held}; recordings {held}..{count - 1} are lost",
                )
            )
        return found

    def _entry_problem(self, buffer: mmap.mmap, recording_id: int) -> str | None:
        entry = cat.entry_offset(recording_id)
        state = cat.state_volatile(buffer, entry)
        if state == cat.STATE_INVALID:
            return (
                f"recording {recording_id}: its catalog entry is INVALID (state 0) below the next recording id, "
                "so it was damaged after it was added"
            )
        if state not in (cat.STATE_VALID, cat.STATE_DELETED):
            return f"recording {recording_id}: its catalog entry's state {state} is not VALID (1) or DELETED (2)"
        stored_id = cat.INT64.unpack_from(buffer, entry + cat.RECORDING_ID_OFFSET)[0]
        if stored_id != recording_id:
            return f"recording {recording_id}: its catalog entry holds recording id {stored_id}"
        checksum = cat.INT32.unpack_from(buffer, entry + cat.CHECKSUM_OFFSET)[0]
        if checksum not in (cat.CHECKSUM_NONE, cat.CHECKSUM_CRC32):
            return (
                f"recording {recording_id}: its catalog entry's checksum type {checksum} is not NONE (0) or CRC32 (1)"
            )
        return None

    def recording(self, recording_id: int) -> RecordingDescriptor:
        """The descriptor of ``recording_id``; :class:`UnknownRecordingError` naming it if there is none,
        :class:`CatalogError` naming the damage if its entry is damaged or missing from a truncated file."""
        self._check_open()
        count = cat.next_recording_id_volatile(self._buffer)
        if not isinstance(recording_id, int) or not 0 <= recording_id < count:
            raise UnknownRecordingError(
                f"no recording {recording_id!r} in {self.path} (recording ids are 0..{count - 1})"
                if count
                else f"no recording {recording_id!r} in {self.path}: the catalog is empty"
            )
        buffer = self._ensure_mapped(cat.entry_offset(recording_id + 1))
        if recording_id >= cat.capacity_entries(len(buffer)):
            raise CatalogError(
                f"recording {recording_id} is lost: catalog {self.path} is truncated ({len(buffer)} bytes, "
                f"whole entries for {cat.capacity_entries(len(buffer))} of {count} recordings)"
            )
        reason = self._entry_problem(buffer, recording_id)
        if reason is not None:
            raise CatalogError(f"{reason} (catalog {self.path})")
        descriptor = self._read(buffer, recording_id, _now_ms())
        assert descriptor is not None
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
        checksum = cat.INT32.unpack_from(buffer, entry + cat.CHECKSUM_OFFSET)[0]
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
            checksum=ChecksumType(checksum)
            if checksum in (cat.CHECKSUM_NONE, cat.CHECKSUM_CRC32)
            else ChecksumType.NONE,
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
        buffer = self._ensure_mapped(cat.entry_offset(recording_id + 1))
        if recording_id >= cat.capacity_entries(len(buffer)):
            raise CatalogError(
                f"recording {recording_id} is lost: catalog {self.path} is truncated ({len(buffer)} bytes)"
            )
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
        checksum: ChecksumType = ChecksumType.NONE,
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
            self._allocate_entry(recording_id, entry)
            buffer = self._ensure_mapped(entry + cat.ENTRY_LENGTH)
            buffer[entry : entry + cat.ENTRY_LENGTH] = bytes(cat.ENTRY_LENGTH)  # an INVALID leftover of a crash
            cat.INT32.pack_into(buffer, entry + cat.RECORDER_PID_OFFSET, os.getpid() if pid is None else pid)
            cat.INT32.pack_into(buffer, entry + cat.CHECKSUM_OFFSET, int(checksum))
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

    def _allocate_entry(self, recording_id: int, entry: int) -> None:
        """Allocate the file's blocks under entry ``recording_id`` (growing the file to twice its size, or
        just enough if that does not fit), so that writing it through the mapping cannot fault; a
        CatalogError naming the catalog and the space if the filesystem cannot give them."""
        end = entry + cat.ENTRY_LENGTH
        size = os.fstat(self._fd).st_size
        try:
            if end <= size:
                os.posix_fallocate(self._fd, entry, cat.ENTRY_LENGTH)  # a no-op where already allocated
                return
            try:
                reserve(self._fd, max(2 * size, end), f"archive catalog {self.path}")
            except StorageSpaceError:
                reserve(self._fd, end, f"archive catalog {self.path}")
        except OSError as e:
            raise CatalogError(
                f"cannot add recording {recording_id} to catalog {self.path}: {e.strerror or e} (the catalog "
                f"needs {cat.ENTRY_LENGTH} more bytes at offset {entry}; it is unchanged)"
            ) from None

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

    def reopen_recording(self, recording_id: int, pid: int | None = None) -> None:
        """Make a stopped recording ACTIVE again (this process as its recorder), to extend it from its stop
        position; a crash then recovers it to its valid prefix as any active recording."""
        self._check_writable()
        entry = self._entry(recording_id)
        buffer = self._buffer
        cat.INT32.pack_into(buffer, entry + cat.RECORDER_PID_OFFSET, os.getpid() if pid is None else pid)
        cat.INT64.pack_into(buffer, entry + cat.STOP_TIME_OFFSET, cat.NULL_TIME)
        cat.heartbeat_ordered(buffer, entry, _now_ms())
        cat.flags_ordered(buffer, entry, cat.FLAG_ACTIVE)
        self._log.info("recording.reopened", recording_id=recording_id)

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
        self._check_writable()
        recovered = []
        now_ms = _now_ms()
        count = cat.next_recording_id_volatile(self._buffer)
        buffer = self._ensure_mapped(cat.entry_offset(count))
        for recording_id in range(min(count, cat.capacity_entries(len(buffer)))):  # a truncated file: problems()
            entry = cat.entry_offset(recording_id)
            if (
                self._entry_problem(buffer, recording_id) is not None
                or cat.state_volatile(buffer, entry) != cat.STATE_VALID
            ):
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
        if self._fd >= 0:
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
