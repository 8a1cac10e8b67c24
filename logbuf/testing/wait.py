"""Waiting on a condition, never on a duration: the one wait of the test kit, in two flavours.

:func:`wait_until` is for real things (driver processes, sockets, threads): it checks a condition until
it holds, running a duty cycle between checks when given one and backing off otherwise, and fails with
:class:`WaitTimeout` naming what it waited for once ``timeout_s`` of real time has passed. The timeout
only bounds a test that would otherwise hang; a passing test returns as soon as the condition holds.

:func:`do_work_until` is for agents stepped by hand on a :class:`~logbuf.testing.clock.FakeClock`: each
step moves the clock and runs every duty cycle once, and it fails after ``max_steps`` steps, so the run
is the same on an idle machine and a loaded one.

A test that is about a duration ("the linger has not passed yet") still sleeps or advances the clock by
that duration itself, in plain sight.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, TypeVar

from logbuf.errors import LogbufError
from logbuf.testing.clock import FakeClock

__all__ = ["WaitTimeout", "do_work_until", "wait_until"]

T = TypeVar("T")

DEFAULT_TIMEOUT_S: Final[float] = 10.0
"""Long enough to ride out a loaded 2-core CI machine; a passing wait returns far sooner."""
FIRST_IDLE_S: Final[float] = 0.0005
MAX_IDLE_S: Final[float] = 0.01
"""An idle wait sleeps 0.5 ms, doubling to at most 10 ms: quick to notice, cheap while it waits."""
DEFAULT_STEP_NS: Final[int] = 1_000_000
DEFAULT_MAX_STEPS: Final[int] = 100_000


class WaitTimeout(LogbufError, AssertionError):
    """A condition did not hold in time; the message names the condition and how long was waited. An
    ``AssertionError``, so pytest reports it as the test's failure."""


def wait_until(
    condition: Callable[[], T],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    what: str = "condition",
    *,
    do_work: Callable[[], object] | None = None,
    max_idle_s: float = MAX_IDLE_S,
) -> T:
    """Check ``condition()`` until it returns something true, and return that.

    ``do_work``: a duty cycle to run between checks (``aeron.do_work``, ``subscription.poll`` wrapped in a
    lambda, an embedded driver's ``invoke``); when it returns a true value (work done) the next check
    follows at once, otherwise the wait backs off from 0.5 ms to ``max_idle_s``. Raises
    :class:`WaitTimeout` naming ``what`` after ``timeout_s`` seconds of real time.
    """
    deadline = time.monotonic() + timeout_s
    idle_s = FIRST_IDLE_S
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout_s} s waiting for {what}")
        if do_work is not None and do_work():
            idle_s = FIRST_IDLE_S
            continue
        time.sleep(idle_s)
        idle_s = min(idle_s * 2, max_idle_s)


def do_work_until(
    condition: Callable[[], T],
    *do_work: Callable[[], object],
    clock: FakeClock | None = None,
    step_ns: int = DEFAULT_STEP_NS,
    max_steps: int = DEFAULT_MAX_STEPS,
    what: str = "condition",
) -> T:
    """Step agents by hand until ``condition()`` returns something true, and return that.

    Each step advances ``clock`` (when given) by ``step_ns``, then runs each ``do_work`` once, then checks;
    the condition is checked once before the first step too. Raises :class:`WaitTimeout` naming ``what``
    after ``max_steps`` steps: no real time is involved, so a run repeats exactly.
    """
    if step_ns < 0 or max_steps < 0:
        raise ValueError(f"step_ns={step_ns} and max_steps={max_steps} must not be negative")
    result = condition()
    steps = 0
    while not result:
        if steps == max_steps:
            spent = f" ({steps * step_ns / 1e9:g} s of fake time)" if clock is not None else ""
            raise WaitTimeout(f"{what} did not hold after {steps} steps{spent}")
        steps += 1
        if clock is not None:
            clock.advance(step_ns)
        for work in do_work:
            work()
        result = condition()
    return result
