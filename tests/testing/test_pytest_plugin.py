"""The kit's pytest plugin puts structlog's configuration back after each test.

The two tests run in this order, in one process (whole files go to one worker): the first configures
structlog as an entry point run in-process would, the second sees the configuration from before it.
"""

from __future__ import annotations

import io

import structlog

MARK = io.StringIO()


def test_a_test_that_configures_structlog() -> None:
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(MARK))
    assert structlog.get_config()["logger_factory"].__dict__.get("_file") is MARK


def test_the_next_test_logs_as_before_it() -> None:
    assert structlog.get_config()["logger_factory"].__dict__.get("_file") is not MARK
    structlog.get_logger().info("plugin.check")
    assert MARK.getvalue() == ""
