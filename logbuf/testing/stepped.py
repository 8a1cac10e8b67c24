"""A media driver built in a directory and stepped by hand on the test's thread: no driver process, no
runner thread, no sleeps. Its clocks are a :class:`~logbuf.testing.clock.FakeClock`'s; give it a
:class:`~logbuf.testing.link.LinkNetwork`'s ``transport`` as ``udp_transport`` and two of them talk over a
lossy in-memory link.

The real client runs against it on the same thread: give the client's context the same clock and
``driver_agent_invoker`` a function that steps the driver (see :func:`stepped_client_context`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logbuf.client.aeron import Context
from logbuf.driver.conductor import DriverConductor
from logbuf.driver.context import DriverContext
from logbuf.driver.media_driver import MediaDriver
from logbuf.driver.system_counters import SystemCounterId
from logbuf.testing.clock import FakeClock

__all__ = ["SMALL_TERM", "SteppedDriver", "stepped_client_context"]

SMALL_TERM = 64 * 1024


class SteppedDriver:
    """A :class:`MediaDriver` whose agents (conductor, sender, receiver) the test steps with :meth:`do_work`;
    its clocks are ``clock``'s and its UDP transports come from ``udp_transport`` when given."""

    def __init__(self, directory: str, clock: FakeClock, **settings: Any) -> None:
        settings.setdefault("ipc_term_length", SMALL_TERM)
        settings.setdefault("term_length", SMALL_TERM)
        ctx = DriverContext(dir=directory, clock_ns=clock.now_ns, epoch_clock_ms=clock.epoch_ms, **settings)
        self.driver = MediaDriver.launch(ctx)
        self.driver.agents.on_start()
        self.expected_errors: list[str] = []
        """Parts of error-log entries a test expects (the others fail it)."""
        self._closed = False

    @property
    def conductor(self) -> DriverConductor:
        return self.driver.conductor

    def do_work(self) -> int:
        """One duty cycle of all three agents."""
        return self.driver.agents.do_work()

    def counter(self, counter_id: SystemCounterId) -> int:
        return self.driver.system_counters.get(counter_id)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.driver.agents.on_close()
            self.driver.close()


def stepped_client_context(directory: str, clock: FakeClock, step: Callable[[], object], **settings: Any) -> Context:
    """A client context for a driver stepped on this thread: no conductor thread (the test calls
    ``aeron.do_work()``), the fake clock's time, and ``step`` (which should advance the clock and run the
    driver's duty cycle) run while a command waits for the driver's answer."""

    def invoke() -> int:
        step()
        return 1

    return Context(
        dir=directory,
        use_conductor_thread=False,
        clock_ns=clock.now_ns,
        epoch_clock_ms=clock.epoch_ms,
        driver_agent_invoker=invoke,
        **settings,
    )
