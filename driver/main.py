"""``mediadriver`` console command: run a standalone media driver until SIGINT/SIGTERM."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import structlog

from logbuf.driver.context import DriverContext
from logbuf.driver.media_driver import MediaDriver, install_signal_handlers
from logbuf.errors import LogbufError
from logbuf.logging_config import configure_logging


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    log = structlog.get_logger().bind(role="driver")
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
