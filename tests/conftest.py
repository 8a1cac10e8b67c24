"""Settings for the whole test run."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import structlog

from tests.support.wheel import Wheel, shared_wheel

# The test kit's fixtures for every test: ``driver_factory`` (real media driver processes).
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


@pytest.fixture(autouse=True)
def _structlog_as_it_was() -> Iterator[None]:
    """Entry points run in-process (``logbuf-stat``, ``logbuf-archive``, the demo) configure structlog
    to print to the stream that was ``sys.stderr`` then: pytest's capture of that one test. Later tests
    would log into that closed capture (``ValueError: I/O operation on closed file``) and threads that
    log, like the jetstream ingest and the relay's loop, would die of it. Put the configuration back."""
    saved, was_configured = structlog.get_config(), structlog.is_configured()
    yield
    structlog.reset_defaults()
    if was_configured:
        structlog.configure(**saved)


@pytest.fixture(scope="session")
def logbuf_wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    """The wheel built from a clean copy of the worktree, once per run (shared by the xdist workers)."""
    return shared_wheel(tmp_path_factory.getbasetemp())
