"""Where a media driver lives: the driver directory that the driver, its clients and tools share.

The driver, the client API and the tools all resolve the directory the same way, so this lives in
``logbuf`` itself: the client never imports the driver (in Aeron the arrow goes the other way).
"""

from __future__ import annotations

import getpass
import os
import stat
from collections.abc import Mapping
from typing import Final

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
