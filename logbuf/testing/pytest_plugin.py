"""The test kit's pytest plugin: fixtures for tests that run real media drivers or a fake clock.

Load it from a ``conftest.py``::

    pytest_plugins = ["logbuf.testing.pytest_plugin"]

Fixtures:

- ``driver_factory``: ``driver_factory(*args)`` starts a media driver process for the test
  (:data:`~logbuf.testing.driver_process.DEFAULT_ARGS` plus ``args``) and returns its
  :class:`~logbuf.testing.driver_process.DriverProcess`; at the end the test fails if a driver's
  distinct error log holds an error the test did not expect, and on failure every driver's counters
  and output are printed.
- ``fake_clock``: a fresh :class:`~logbuf.testing.clock.FakeClock`.
- ``structlog_as_it_was`` (autouse: every test gets it): structlog's configuration as it was before the
  test, put back after it, so an entry point run in-process (a tool's ``main()``) that configures logging
  to pytest's capture of one test does not leave later tests logging into that closed stream.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from logbuf.testing.clock import FakeClock
from logbuf.testing.driver_process import DriverSet


@pytest.fixture
def driver_factory(request: pytest.FixtureRequest) -> Iterator[DriverSet]:
    """``driver_factory(*args)`` starts a driver (``DEFAULT_ARGS`` plus ``args``) for this test."""
    drivers = DriverSet(request)
    yield drivers
    drivers.close()


@pytest.fixture
def fake_clock() -> FakeClock:
    """A clock at :data:`~logbuf.testing.clock.START_NS` that moves only when the test advances it."""
    return FakeClock()


@pytest.fixture(autouse=True)
def structlog_as_it_was() -> Iterator[None]:
    """Put structlog's configuration back after each test.

    Entry points run in-process (``logbuf-stat``, ``logbuf-archive``, the demo) configure structlog to print
    to the stream that was ``sys.stderr`` then: pytest's capture of that one test. Later tests would log into
    that closed capture (``ValueError: I/O operation on closed file``) and threads that log, like the
    jetstream ingest and the relay's loop, would die of it.
    """
    saved, was_configured = structlog.get_config(), structlog.is_configured()
    yield
    structlog.reset_defaults()
    if was_configured:
        structlog.configure(**saved)
