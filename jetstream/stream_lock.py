"""One relay publishes into one event stream: a lock file per (channel, stream id) in the driver's directory.

Theory of operation
-------------------
Two relays on one media driver with the same channel and stream id would publish into one stream,
and each would serve the other's events (a relay following a filtered upstream served likes and
follows). Before it adds its publication, a relay takes an exclusive ``flock`` on
``<driver dir>/jetstream-<stream id>-<channel hash>.lock`` and keeps it while it publishes; a second
relay finds it held and refuses to start, naming the holder (the file holds its pid and listen
address). The kernel drops the lock with its holder's last descriptor, so a relay killed with SIGKILL
leaves nothing that blocks its restart. Relays that only serve (``--role serve``) read the stream and
take no lock. The lock lives in the driver's directory, the scope of a stream; a driver that is
replaced in that directory removes the file with it, so :meth:`StreamLock.still_held` tells the relay
to take the lock again after reconnecting.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from typing import Final

from logbuf.errors import LogbufError

__all__ = ["StreamLock", "StreamTakenError", "lock_path"]

LOCK_PREFIX: Final = "jetstream-"


class StreamTakenError(LogbufError):
    """Another relay publishes into this stream; the message names the stream and the holder."""


def lock_path(driver_dir: str, channel: str, stream_id: int) -> str:
    digest = hashlib.sha256(channel.encode()).hexdigest()[:12]
    return os.path.join(driver_dir, f"{LOCK_PREFIX}{stream_id}-{digest}.lock")


class StreamLock:
    """An exclusive, non-blocking flock on a stream's lock file; :meth:`release` (or process exit) frees it."""

    def __init__(self, driver_dir: str, channel: str, stream_id: int, holder: str) -> None:
        self.path = lock_path(driver_dir, channel, stream_id)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                other = os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise StreamTakenError(
                f"another relay already publishes stream {stream_id} on {channel} in {driver_dir} ({other}): "
                "give this relay its own --stream-id, or use --role serve to serve that stream"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid={os.getpid()} {holder}\n".encode(), 0)
        self._fd: int | None = fd

    def still_held(self) -> bool:
        """Whether the lock file at :attr:`path` is still the one this lock holds (the driver directory
        was not replaced)."""
        if self._fd is None:
            return False
        try:
            mine, there = os.fstat(self._fd), os.stat(self.path)
        except OSError:
            return False
        return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)

    def release(self) -> None:
        """Drop the lock (closing the descriptor drops the flock). The file stays: unlinking it could let
        two later relays lock two different files of the same name."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
