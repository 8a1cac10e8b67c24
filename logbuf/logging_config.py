"""structlog set-up for entry points (mediadriver, tools, perf scripts, test fixtures).

Library code only calls ``structlog.get_logger()`` (or :func:`library_logger` where it runs inside
a user's program, like the client); each entry point calls :func:`configure_logging` once.
Console output on a TTY, JSON lines otherwise.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog


def configure_logging(level: str = "info", *, stream: TextIO | None = None, json: bool | None = None) -> None:
    """Configure structlog once: ISO timestamps, level, and a console or JSON renderer."""
    stream = sys.stderr if stream is None else stream
    use_json = not stream.isatty() if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )


def library_logger(**context: Any) -> Any:
    """The logger for code that runs inside a user's program (the client API): structlog as the
    program configured it, or, if it did not configure structlog, warnings and errors only, on
    stderr, so that a library is not chatty on the program's stdout."""
    if structlog.is_configured():
        return structlog.get_logger().bind(**context)
    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    ).bind(**context)
