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

See the "Testing with logbuf" page of the documentation.
"""

from __future__ import annotations

from logbuf.testing.clock import FakeClock
from logbuf.testing.driver_process import DEFAULT_ARGS, DriverProcess, DriverSet, quick_timeout_args, unique_dir
from logbuf.testing.link import Link, LinkNetwork, LinkTransport
from logbuf.testing.stepped import SteppedDriver, stepped_client_context
from logbuf.testing.wait import WaitTimeout, do_work_until, wait_until

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
