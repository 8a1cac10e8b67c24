"""A real media driver per test (``media_driver``), with the settings a module may override (``driver_args``).

The driver kit itself is :mod:`logbuf.testing.driver_process`; its names are re-exported here for the
tests that import them from this module.
"""

from __future__ import annotations

import pytest

from logbuf.testing.driver_process import DriverProcess, DriverSet, quick_timeout_args, unique_dir

__all__ = ["DriverProcess", "unique_dir"]


@pytest.fixture
def driver_args() -> list[str]:
    """Override in a test module (or parametrize) for other settings."""
    return quick_timeout_args()


@pytest.fixture
def media_driver(driver_args: list[str], driver_factory: DriverSet) -> DriverProcess:
    """A running driver in a fresh directory; at the end its error log must hold only expected errors."""
    return driver_factory(*driver_args, base=[])
