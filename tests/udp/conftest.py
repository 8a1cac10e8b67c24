"""Fixtures shared by the UDP system tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.udp.test_udp_system import Child


@pytest.fixture
def children() -> Iterator[Callable[..., Child]]:
    """``spawn(role, **args)``: a client child process, closed after the test."""
    spawned: list[Child] = []

    def spawn(role: str, **args: object) -> Child:
        child = Child(role, **args)
        spawned.append(child)
        return child

    yield spawn
    for child in spawned:
        child.close()
