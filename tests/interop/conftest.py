"""Real Aeron for interop tests: pyaeron (the Aeron 1.53 C client with its embedded C media driver)
in its own Python >= 3.12 venv and the peers as processes, from the kit (:mod:`logbuf.testing.aeron`).
With ``CI=true`` a missing pyaeron (or tshark) fails the tests; elsewhere they skip naming what is
missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from logbuf.testing.aeron import PEER, AeronUnavailable, Interop, Peer
from logbuf.testing.aeron import pyaeron_python as find_pyaeron_python

__all__ = ["IN_CI", "PEER", "Interop", "Peer", "unavailable"]

IN_CI = os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    """Fail loudly in CI, skip with the reason elsewhere."""
    if IN_CI:
        pytest.fail(f"interop tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pyaeron_python() -> str:
    try:
        return find_pyaeron_python()
    except AeronUnavailable as e:
        unavailable(str(e))
        raise


@pytest.fixture(scope="session")
def tshark() -> str:
    path = shutil.which("tshark")
    if path is None:
        unavailable("tshark is not installed (.ci/install-tools installs it)")
    assert path is not None
    return path


@pytest.fixture
def interop(pyaeron_python: str) -> Iterator[Interop]:
    session = Interop(pyaeron_python)
    try:
        yield session
    finally:
        session.close()


Factory = Callable[..., Any]
