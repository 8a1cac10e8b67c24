"""Where a media driver lives: the driver directory that the driver, its clients and tools share.

The driver, the client API and the tools all resolve the directory the same way, so this lives in
``logbuf`` itself: the client never imports the driver (in Aeron the arrow goes the other way).

Trust. The default path (``/dev/shm/logbuf-<user>``) is predictable and /dev/shm is writable by
every user, so another user can create it first, run a driver there, and read every message of
whoever connects. Before using a directory the driver and the client call
:func:`check_directory`: it must belong to this process's user (or, under ``--group-access``, to
one of its groups) and must not be writable by others; otherwise they refuse with
:class:`DirectoryPermissionError`, which names the owner and the mode.
"""

from __future__ import annotations

import getpass
import grp
import os
import pwd
import stat
from collections.abc import Mapping
from typing import Final

from logbuf.errors import LogbufError

ENV_PREFIX: Final[str] = "LOGBUF_"
DIR_ENV: Final[str] = ENV_PREFIX + "DIR"

OWNER_ONLY_FILE_MODE: Final[int] = 0o600
OWNER_ONLY_DIR_MODE: Final[int] = 0o700
GROUP_FILE_MODE: Final[int] = 0o660
GROUP_DIR_MODE: Final[int] = 0o770


def default_dir() -> str:
    """``/dev/shm/logbuf-<user>`` where /dev/shm exists, else ``<tmp>/logbuf-<user>``."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
    return os.path.join(base, f"logbuf-{getpass.getuser()}")


def resolve_dir(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Where a driver lives: the explicit value, else ``LOGBUF_DIR``, else :func:`default_dir`."""
    env = os.environ if env is None else env
    return explicit or env.get(DIR_ENV) or default_dir()


class DirectoryPermissionError(PermissionError, LogbufError):
    """A driver directory this process cannot reach, or must not trust (owned by another user, or
    writable by others); the message names the directory, its owner and its mode."""


def check_directory(directory: str, *, group_access: bool = False) -> bool:
    """Refuse (:class:`DirectoryPermissionError`) a driver directory this process must not trust or
    cannot reach; True if it is fine, False if it does not exist (yet).

    Trusted: owned by this process's effective user, or with ``group_access`` by one of its groups,
    and not writable by others. A symlink is followed, and must itself be ours too.
    """
    try:
        link = os.lstat(directory)
        target = os.stat(directory) if stat.S_ISLNK(link.st_mode) else link
    except FileNotFoundError:
        return False
    except PermissionError as e:
        raise DirectoryPermissionError(
            f"cannot reach driver directory {directory}: permission denied to {_user(os.geteuid())}"
            f" (uid {os.geteuid()}): a driver run by another user, or without --group-access?"
        ) from e
    if not stat.S_ISDIR(target.st_mode):
        raise DirectoryPermissionError(f"driver directory {directory} is not a directory")
    for what, info in (("symlink", link), ("directory", target)) if link is not target else (("directory", target),):
        uid = os.geteuid()
        if info.st_uid != uid and not (group_access and info.st_gid in {os.getegid(), *os.getgroups()}):
            raise DirectoryPermissionError(
                f"driver {what} {directory} is owned by {_user(info.st_uid)} (uid {info.st_uid}, group"
                f" {_group(info.st_gid)}), not by {_user(uid)} (uid {uid})"
                + (" nor by one of its groups" if group_access else "")
                + ": refusing to use it, as its owner could read every message; remove it or choose another dir"
            )
    if target.st_mode & stat.S_IWOTH:
        raise DirectoryPermissionError(
            f"driver directory {directory} is writable by every user (mode {stat.S_IMODE(target.st_mode):o}):"
            " refusing to use it; remove it or choose another dir"
        )
    return True


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"user {uid}"


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def access_modes(group_access: bool) -> tuple[int, int]:
    """(file mode, directory mode) for what a driver and its helpers create: owner-only, or shared with
    the group under ``--group-access``. Set explicitly (``fchmod``/``chmod``), never through the umask."""
    if group_access:
        return GROUP_FILE_MODE, GROUP_DIR_MODE
    return OWNER_ONLY_FILE_MODE, OWNER_ONLY_DIR_MODE


def shares_with_group(directory: str) -> bool:
    """Does the driver in ``directory`` run with group access (its directory is group-writable)?
    False if there is no such directory yet."""
    try:
        return bool(os.stat(directory).st_mode & stat.S_IWGRP)
    except OSError:
        return False
