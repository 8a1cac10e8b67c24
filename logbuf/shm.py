"""POSIX shared memory segments (posix_ipc) and files under /dev/shm, mmap'd, with names checked up front.

A new segment's space is reserved (``posix_fallocate``) before it is mapped. A sparse file on a
full tmpfs maps fine, and then the first write to a page that cannot be allocated kills the
writer with SIGBUS: a publishing client, or a driver rebuilding an image. Reserving up front turns
that into a :class:`StorageSpaceError` when the log is created, and the half-made file is removed.
"""

from __future__ import annotations

import mmap
import os
import re
from typing import Final

import posix_ipc

from logbuf.errors import LogbufError
from logbuf.errors import ShmError as ShmError  # raised here; defined with the hierarchy

NAME_PATTERN: Final[re.Pattern[str]] = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
OWNER_ONLY: Final[int] = 0o600
OWNER_AND_GROUP: Final[int] = 0o660


class StorageSpaceError(LogbufError, OSError):
    """There is not enough space (tmpfs, disk or memory) to reserve a new segment; the message says how much."""


def reserve(fd: int, length: int, what: str) -> None:
    """Allocate ``length`` bytes for the file behind ``fd`` now, so that no later write can fault."""
    try:
        os.posix_fallocate(fd, 0, length)
    except OSError as e:
        try:
            free = os.fstatvfs(fd)
            available = f"{free.f_bavail * free.f_frsize} bytes available"
        except OSError:
            available = "space available unknown"
        raise StorageSpaceError(e.errno, f"cannot reserve {length} bytes for {what} ({available}): {e.strerror}") from e


MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
"""Linux 5.14's madvise advice: fault every page of a range in now (for reading, or for writing)."""


def populate_mapping(mm: mmap.mmap, writable: bool) -> bool:
    """Map every page of ``mm`` into this process now, with one madvise, instead of one page fault the
    first time each page is touched (on this machine a fault in the middle of a ping-pong cost 20-30 us:
    every 64th 32-byte round trip through a fresh log). False on a kernel without MADV_POPULATE_*, where
    pages keep faulting in as they are first used."""
    try:
        mm.madvise(MADV_POPULATE_WRITE if writable else MADV_POPULATE_READ, 0, len(mm))
    except OSError:
        return False
    return True


def check_name(name: str) -> str:
    """A segment name: 1-200 characters of letters, digits, '.', '_' or '-' (no slashes)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ShmError(f"shared memory name={name!r} is invalid: use 1-200 letters, digits, '.', '_' or '-' (no '/')")
    return "/" + name


class Segment:
    """A mapped shared-memory segment. ``buffer`` is the mmap; ``close()`` unmaps it."""

    def __init__(self, name: str, mm: mmap.mmap, created: bool) -> None:
        self.name = name
        self.buffer = mm
        self.created = created

    @property
    def length(self) -> int:
        return len(self.buffer)

    @classmethod
    def create(cls, name: str, length: int, *, mode: int = OWNER_ONLY, exclusive: bool = True) -> Segment:
        path = check_name(name)
        if length <= 0:
            raise ShmError(f"segment length={length} must be positive")
        flags = posix_ipc.O_CREX if exclusive else posix_ipc.O_CREAT
        try:
            shm = posix_ipc.SharedMemory(path, flags, mode=mode)
        except posix_ipc.ExistentialError as e:
            raise ShmError(f"shared memory {name!r} already exists") from e
        try:
            if exclusive:
                os.fchmod(shm.fd, mode)  # not subject to the umask
            if os.fstat(shm.fd).st_size < length:
                reserve(shm.fd, length, f"shared memory {name!r}")
            mm = mmap.mmap(shm.fd, length)
        except BaseException:
            if exclusive:
                shm.unlink()
            raise
        finally:
            shm.close_fd()
        return cls(name, mm, True)

    @classmethod
    def open(cls, name: str) -> Segment:
        path = check_name(name)
        try:
            shm = posix_ipc.SharedMemory(path)
        except posix_ipc.ExistentialError as e:
            raise ShmError(f"shared memory {name!r} does not exist") from e
        try:
            size = os.fstat(shm.fd).st_size
            if size == 0:
                raise ShmError(f"shared memory {name!r} is empty")
            mm = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        return cls(name, mm, False)

    @classmethod
    def create_file(cls, path: str, length: int, *, mode: int = OWNER_ONLY) -> Segment:
        """Create a new file (normally under /dev/shm, a tmpfs) of ``length`` bytes and map it."""
        if length <= 0:
            raise ShmError(f"segment length={length} must be positive")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError as e:
            raise ShmError(f"file {path!r} already exists") from e
        try:
            os.fchmod(fd, mode)  # not subject to the umask
            reserve(fd, length, f"file {path!r}")
            mm = mmap.mmap(fd, length)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(path, mm, True)

    @classmethod
    def open_file(cls, path: str, *, writable: bool = True, populate: bool = False) -> Segment:
        """Map an existing file in full. ``populate``: map every page now (see :func:`populate`)."""
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError as e:
            raise ShmError(f"file {path!r} does not exist") from e
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise ShmError(f"file {path!r} is empty")
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
            if populate:
                populate_mapping(mm, writable)
        finally:
            os.close(fd)
        return cls(path, mm, False)

    def close(self) -> None:
        """Unmap (views handed out must have been released first)."""
        if not self.buffer.closed:
            self.buffer.close()

    @staticmethod
    def unlink(name: str) -> bool:
        """Remove the segment's name; mappings stay valid until unmapped. False if it did not exist."""
        try:
            posix_ipc.unlink_shared_memory(check_name(name))
            return True
        except posix_ipc.ExistentialError:
            return False
