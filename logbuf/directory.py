"""Where a media driver lives: the driver directory that the driver, its clients and tools share.

The driver, the client API and the tools all resolve the directory the same way, so this lives in
``logbuf`` itself: the client never imports the driver (in Aeron the arrow goes the other way).
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping
from typing import Final

ENV_PREFIX: Final[str] = "LOGBUF_"
DIR_ENV: Final[str] = ENV_PREFIX + "DIR"


def default_dir() -> str:
    """``/dev/shm/logbuf-<user>`` where /dev/shm exists, else ``<tmp>/logbuf-<user>``."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
    return os.path.join(base, f"logbuf-{getpass.getuser()}")


def resolve_dir(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Where a driver lives: the explicit value, else ``LOGBUF_DIR``, else :func:`default_dir`."""
    env = os.environ if env is None else env
    return explicit or env.get(DIR_ENV) or default_dir()
