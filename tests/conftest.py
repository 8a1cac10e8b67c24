"""Settings for the whole test run."""

from __future__ import annotations

import warnings

import pytest

from tests.support.wheel import Wheel, shared_wheel

# The test kit's fixtures for every test: ``driver_factory`` (real media driver processes), ``fake_clock``,
# and structlog's configuration put back after each test.
pytest_plugins = ["logbuf.testing.pytest_plugin"]

# On a failing example Hypothesis imports libcst (to suggest a patch), whose import warns
# (mypy_extensions.TypedDict); with filterwarnings=error that turns the failure report into a
# pytest INTERNALERROR. Import it once here with that warning silenced.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import hypothesis.extra._patching  # noqa: F401
    except ImportError:  # pragma: no cover - libcst not installed: nothing to pre-import
        pass


@pytest.fixture(scope="session")
def logbuf_wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    """The wheel built from a clean copy of the worktree, once per run (shared by the xdist workers)."""
    return shared_wheel(tmp_path_factory.getbasetemp())
