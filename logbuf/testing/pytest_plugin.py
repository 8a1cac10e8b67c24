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
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
