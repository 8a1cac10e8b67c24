"""``mediadriver`` console command: run a standalone media driver until SIGINT/SIGTERM."""

from __future__ import annotations

import resource
import sys
from collections.abc import Sequence

import structlog

from logbuf.driver.context import DriverContext
from logbuf.driver.media_driver import MediaDriver, install_signal_handlers
from logbuf.errors import LogbufError
from logbuf.logging_config import configure_logging


def raise_open_file_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit, as servers do: every UDP endpoint is a
    descriptor, and at the common soft limit of 1,024 a few clients' endpoints would leave the driver no
    descriptor to create any client's log with. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    log = structlog.get_logger().bind(role="driver")
    open_files = raise_open_file_limit()
    log.info("driver.open_file_limit", soft=open_files)
    try:
        ctx = DriverContext.from_sources(argv)
        driver = MediaDriver.launch(ctx)
    except LogbufError as e:
        log.error("driver.start_failed", error=str(e))
        print(f"mediadriver: {e}", file=sys.stderr)
        return 2
    install_signal_handlers(driver)
    try:
        driver.run()
    finally:
        driver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
