"""logbuf's test kit: what its own tests use, public so that applications can test against logbuf the same way.

- :class:`FakeClock`: time that moves only when the test says; give ``now_ns`` and ``epoch_ms`` to a driver
  context (``clock_ns``, ``epoch_clock_ms``) and to a client context (the same names).
- :class:`LinkNetwork`: a seeded lossy, duplicating, reordering in-memory datagram network; its ``transport``
  is a driver context's ``udp_transport``.
- :class:`SteppedDriver` and :func:`stepped_client_context`: a media driver and the real client on one
  thread and one fake clock, stepped by hand.
- :class:`DriverProcess` and :class:`DriverSet`: real media driver processes (``DEFAULT_ARGS``, or
  :func:`quick_timeout_args` for tests that watch a client or publication time out), checked for errors and
  reported on failure; the pytest plugin :mod:`logbuf.testing.pytest_plugin` gives the ``driver_factory``
  and ``fake_clock`` fixtures.
- :func:`wait_until` (real time) and :func:`do_work_until` (stepped, fake time): the one way tests wait.
  Imported at once and light (no driver, numpy or pytest), so a test's child processes use it cheaply;
  the names above load their modules on first use.

Modules for particular jobs, imported by name: :mod:`~logbuf.testing.udp_pair` (a network publication and a
publication image connected by hand, no sockets), :mod:`~logbuf.testing.checked_stream` (every message once,
in order, intact, between real drivers), :mod:`~logbuf.testing.aeron` (real Aeron's C driver and client
beside logbuf's, as processes), :mod:`~logbuf.testing.nak_flood` (the NAK amplification attacker),
:mod:`~logbuf.testing.relay_flood`, :mod:`~logbuf.testing.netns` and :mod:`~logbuf.testing.host`.

See the "Testing with logbuf" page of the documentation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The wait is imported at once and stays light (no driver, numpy or pytest), so child processes of a test
# can use it cheaply; the rest is imported on first use.
from logbuf.testing.wait import WaitTimeout, do_work_until, wait_until

if TYPE_CHECKING:
    from logbuf.testing.clock import FakeClock
    from logbuf.testing.driver_process import DEFAULT_ARGS, DriverProcess, DriverSet, quick_timeout_args, unique_dir
    from logbuf.testing.link import Link, LinkNetwork, LinkTransport
    from logbuf.testing.stepped import SteppedDriver, stepped_client_context

_LAZY = {
    "DEFAULT_ARGS": "driver_process",
    "DriverProcess": "driver_process",
    "DriverSet": "driver_process",
    "FakeClock": "clock",
    "Link": "link",
    "LinkNetwork": "link",
    "LinkTransport": "link",
    "SteppedDriver": "stepped",
    "stepped_client_context": "stepped",
    "unique_dir": "driver_process",
    "quick_timeout_args": "driver_process",
}

__all__ = [
    "DEFAULT_ARGS",
    "DriverProcess",
    "DriverSet",
    "FakeClock",
    "Link",
    "LinkNetwork",
    "LinkTransport",
    "SteppedDriver",
    "WaitTimeout",
    "do_work_until",
    "quick_timeout_args",
    "stepped_client_context",
    "unique_dir",
    "wait_until",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
