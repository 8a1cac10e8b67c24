"""CncFile: create (driver) and open (clients, tools) ``<dir>/cnc.dat``; driver liveness checks.

The creator sizes the file, fills the header, sets the to-driver ring's consumer heartbeat to the
start time and only then release-stores the version: an opener that reads version 0 (or finds the
file empty or short) knows the driver is still initialising and may retry
(:class:`CncNotReadyError`). Layout in :mod:`logbuf.conduit.cnc_descriptor`.

Views: ``to_driver``, ``to_clients``, ``counters_metadata``, ``counters_values`` and ``error_log``
are memoryviews into the mapping. :meth:`CncFile.close` releases them and unmaps; views derived
from them (slices, ``Position`` counters) must be gone by then or it raises ``BufferError``.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time

from logbuf import native
from logbuf.conduit import cnc_descriptor as cnd
from logbuf.conduit import ring_buffer_descriptor as rd
from logbuf.directory import DirectoryPermissionError
from logbuf.errors import CncError as CncError  # raised here; defined with the hierarchy
from logbuf.errors import CncNotReadyError as CncNotReadyError
from logbuf.errors import CncVersionError as CncVersionError
from logbuf.errors import ShmError
from logbuf.shm import OWNER_ONLY, Segment


class CncFile:
    """A mapped CnC file. Use :meth:`create` (the driver) or :meth:`open` (everyone else)."""

    def __init__(self, path: str, segment: Segment) -> None:
        self.path = path
        self._segment = segment
        self._base = memoryview(segment.buffer)
        base = self._base
        self.version: int = native.get_int32_volatile(base, cnd.CNC_VERSION_FIELD_OFFSET)
        (
            to_driver_length,
            to_clients_length,
            metadata_length,
            values_length,
            error_log_length,
            self.client_liveness_timeout_ns,
            self.start_timestamp_ms,
            self.pid,
        ) = cnd.HEADER_LENGTHS.unpack_from(base, cnd.TO_DRIVER_BUFFER_LENGTH_FIELD_OFFSET)
        expected = cnd.file_length(
            to_driver_length, to_clients_length, metadata_length, values_length, error_log_length
        )
        file_length = len(base)
        if min(to_driver_length, to_clients_length, metadata_length, values_length, error_log_length) <= 0 or (
            expected > file_length  # Aeron's driver pads the file up to its page size: longer is fine
        ):
            base.release()
            raise CncError(
                f"CnC file {path} is corrupt: header buffer lengths ({to_driver_length}, {to_clients_length},"
                f" {metadata_length}, {values_length}, {error_log_length}) add up to {expected} bytes,"
                f" the file has {file_length}"
            )
        offset = cnd.END_OF_METADATA_OFFSET
        views = []
        for length in (to_driver_length, to_clients_length, metadata_length, values_length, error_log_length):
            views.append(base[offset : offset + length])
            offset += length
        self.to_driver, self.to_clients, self.counters_metadata, self.counters_values, self.error_log = views

    @classmethod
    def create(
        cls,
        directory: str,
        *,
        to_driver_capacity: int = cnd.DEFAULT_TO_DRIVER_CAPACITY,
        to_clients_capacity: int = cnd.DEFAULT_TO_CLIENTS_CAPACITY,
        counters_values_length: int = cnd.DEFAULT_COUNTERS_VALUES_LENGTH,
        error_log_length: int = cnd.DEFAULT_ERROR_LOG_LENGTH,
        client_liveness_timeout_ns: int = cnd.DEFAULT_CLIENT_LIVENESS_TIMEOUT_NS,
        mode: int = OWNER_ONLY,
    ) -> CncFile:
        """Create ``<directory>/cnc.dat`` (the directory is created if missing; the file must not exist)."""
        cnd.check_lengths(to_driver_capacity, to_clients_capacity, counters_values_length, error_log_length)
        if client_liveness_timeout_ns <= 0:
            raise ValueError(f"client_liveness_timeout_ns={client_liveness_timeout_ns} must be positive")
        lengths = (
            cnd.to_driver_buffer_length(to_driver_capacity),
            cnd.to_clients_buffer_length(to_clients_capacity),
            cnd.counters_metadata_length(counters_values_length),
            counters_values_length,
            error_log_length,
        )
        os.makedirs(directory, exist_ok=True)
        path = cnc_path(directory)
        if os.path.exists(path):
            raise CncError(f"CnC file {path} already exists: a driver uses (or used) dir={directory}")
        segment = Segment.create_file(path, cnd.file_length(*lengths), mode=mode)
        start_ms = time.time_ns() // 1_000_000
        buffer = segment.buffer
        cnd.HEADER_LENGTHS.pack_into(
            buffer,
            cnd.TO_DRIVER_BUFFER_LENGTH_FIELD_OFFSET,
            *lengths,
            client_liveness_timeout_ns,
            start_ms,
            os.getpid(),
        )
        heartbeat_offset = cnd.END_OF_METADATA_OFFSET + to_driver_capacity + rd.CONSUMER_HEARTBEAT_OFFSET
        native.put_int64_ordered(buffer, heartbeat_offset, start_ms)
        native.put_int32_ordered(buffer, cnd.CNC_VERSION_FIELD_OFFSET, cnd.CNC_VERSION)
        return cls(path, segment)

    @classmethod
    def open(cls, directory: str) -> CncFile:
        """Map an existing, initialised CnC file of a compatible version.

        Raises :class:`CncError` if there is no file, :class:`CncNotReadyError` while it is being
        initialised, :class:`CncVersionError` for another major version.
        """
        path = cnc_path(directory)
        try:
            os.stat(path)
        except FileNotFoundError:
            raise CncError(f"no CnC file at {path}: is a media driver running with dir={directory}?") from None
        except PermissionError as e:  # not "no CnC file": say what is wrong
            raise DirectoryPermissionError(
                f"cannot reach the CnC file {path}: permission denied to uid {os.geteuid()}"
                " (a driver run by another user, or without --group-access?)"
            ) from e
        try:
            segment = Segment.open_file(path)
        except PermissionError as e:
            raise DirectoryPermissionError(
                f"cannot open the CnC file {path}: permission denied to uid {os.geteuid()}"
                " (a driver run by another user, or without --group-access?)"
            ) from e
        except ShmError as e:
            if os.path.exists(path):  # empty: created, not yet sized
                raise CncNotReadyError(f"CnC file {path} is being initialised (empty)") from e
            raise CncError(f"no CnC file at {path}: is a media driver running with dir={directory}?") from e
        try:
            if segment.length < cnd.END_OF_METADATA_OFFSET:
                raise CncNotReadyError(f"CnC file {path} is being initialised ({segment.length} bytes)")
            version = native.get_int32_volatile(segment.buffer, cnd.CNC_VERSION_FIELD_OFFSET)
            if version == 0:
                raise CncNotReadyError(f"CnC file {path} is being initialised (version 0)")
            check_version(version, path)
            return cls(path, segment)
        except BaseException:
            segment.close()
            raise

    def close(self) -> None:
        """Release the views and unmap (``BufferError`` if views derived from them are still alive)."""
        try:
            for view in (self.to_driver, self.to_clients, self.counters_metadata, self.counters_values, self.error_log):
                view.release()
            self._base.release()
            self._segment.close()
        except BufferError as e:  # close what holds the views (e.g. Position counters), then retry
            raise BufferError(f"cannot unmap {self.path}: a view into it is still in use ({e})") from e

    def __enter__(self) -> CncFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CncFile({self.path!r}, version={cnd.version_string(self.version)}, pid={self.pid})"


_FLOCK = struct.Struct("hhqqi4x")
"""Linux ``struct flock``: l_type, l_whence, l_start, l_len, l_pid (padded to 32 bytes)."""
_MAX_LOCK_OFFSET = (1 << 63) - 2


class ClientLivenessLock:
    """Proof, only the kernel can give, that a client is still open: a shared open-file-description
    lock on byte ``client_id`` of the CnC file, taken when the client connects and let go just before
    it sends CLIENT_CLOSE (and by the kernel when its process dies).

    Every process that maps the CnC can write a CLIENT_CLOSE naming any client id, but none can drop
    another process's lock: the driver honours a close only if nobody holds the named client's lock
    (:func:`client_liveness_lock_held`). Clients that take no lock (Aeron's own) are closed as in
    Aeron. The lock is advisory and costs nothing while held.
    """

    def __init__(self, path: str, client_id: int) -> None:
        self.path = path
        self.client_id = client_id
        self._fd = -1
        if not 0 <= client_id <= _MAX_LOCK_OFFSET:
            return
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, client_id, 1, 0))
        except OSError:  # someone holds a write lock on that byte: go without (the Aeron behaviour)
            os.close(fd)
            return
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        """Let go (closing the descriptor drops its lock); idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def client_liveness_lock_held(path: str, client_id: int) -> bool:
    """Does any process hold ``client_id``'s :class:`ClientLivenessLock` on the CnC file at ``path``?"""
    if not 0 <= client_id <= _MAX_LOCK_OFFSET:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, client_id, 1, 0)
        l_type = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe))[0]
        return bool(l_type != fcntl.F_UNLCK)
    finally:
        os.close(fd)


def cnc_path(directory: str) -> str:
    return os.path.join(directory, cnd.CNC_FILE)


def check_version(version: int, path: str = cnd.CNC_FILE) -> None:
    """Accept only the major version this code was built for."""
    if cnd.major_version(version) != cnd.major_version(cnd.CNC_VERSION):
        raise CncVersionError(
            f"CnC version not compatible: {path} has version {cnd.version_string(version)} ({version}),"
            f" this client expects {cnd.version_string(cnd.CNC_VERSION)} ({cnd.CNC_VERSION})"
        )


def cnc_driver_heartbeat_ms(cnc: CncFile) -> int:
    """The driver's last heartbeat, epoch ms: the to-driver ring buffer's consumer heartbeat."""
    capacity = len(cnc.to_driver) - rd.TRAILER_LENGTH
    return native.get_int64_volatile(cnc.to_driver, capacity + rd.CONSUMER_HEARTBEAT_OFFSET)


def is_process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process of this pid namespace (a zombie is dead; pid <= 0: unknown, True)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def initialising_cnc_pid(directory: str) -> int:
    """The pid in a CnC file's header, read without mapping it (the creator writes it before the version);
    0 when the file is missing or too short to hold it yet (unknown)."""
    try:
        with open(cnc_path(directory), "rb") as f:
            raw = os.pread(f.fileno(), 8, cnd.PID_FIELD_OFFSET)
    except OSError:
        return 0
    return int.from_bytes(raw, "little", signed=True) if len(raw) == 8 else 0


def is_driver_active(directory: str, *, timeout_ns: int, now_ms: int | None = None) -> bool:
    """Is there a compatible CnC in ``directory`` whose driver heartbeat is at most ``timeout_ns`` old
    and whose driver process (the CnC's pid) still exists? ``now_ms``: the wall clock in the heartbeat's
    unit (epoch milliseconds), for tests.

    A CnC still being initialised is waited for, up to ``timeout_ns`` (as Aeron does), unless the pid
    its creator already wrote is dead (a driver killed while starting: nothing will finish it). The pid
    check lets a driver killed with SIGKILL be taken over at once instead of after the driver timeout.
    """
    deadline = time.monotonic() + timeout_ns / 1e9
    while True:
        try:
            cnc = CncFile.open(directory)
            break
        except CncNotReadyError:
            if time.monotonic() >= deadline or not is_process_alive(initialising_cnc_pid(directory)):
                return False
            time.sleep(0.001)
        except CncError:
            return False
    try:
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return (now - cnc_driver_heartbeat_ms(cnc)) * 1_000_000 <= timeout_ns and is_process_alive(cnc.pid)
    finally:
        cnc.close()


def wait_for_driver(
    directory: str, *, timeout_ns: int = 10_000_000_000, heartbeat_timeout_ns: int = 10_000_000_000
) -> None:
    """Block until a driver in ``directory`` is active (for scripts and tests)."""
    deadline_ns = time.monotonic_ns() + timeout_ns
    while time.monotonic_ns() < deadline_ns:
        if is_driver_active(directory, timeout_ns=heartbeat_timeout_ns):
            return
        time.sleep(0.01)
    raise TimeoutError(f"no active media driver in {directory} after {timeout_ns / 1e9:g} s")
