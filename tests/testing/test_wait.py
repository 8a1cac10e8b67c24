"""The test kit's one wait: real time with a bound, or steps on a fake clock with a bound."""

from __future__ import annotations

import itertools
import time

import pytest

from logbuf.testing import FakeClock, WaitTimeout, do_work_until, wait_until


def test_wait_until_returns_the_conditions_first_true_value() -> None:
    values = iter([0, None, "", 7, 8])
    assert wait_until(lambda: next(values), 5) == 7


def test_wait_until_runs_the_duty_cycle_between_checks_without_sleeping_while_it_works() -> None:
    work = itertools.count(1)
    done: list[int] = []
    assert wait_until(lambda: len(done) >= 1000, 5, do_work=lambda: done.append(next(work)) or 1)
    assert done == list(range(1, 1001))


def test_wait_until_fails_naming_what_it_waited_for() -> None:
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"timed out after 0.05 s waiting for the moon"):
        wait_until(lambda: False, 0.05, "the moon")
    assert time.monotonic() - started >= 0.05
    assert issubclass(WaitTimeout, AssertionError)


def test_do_work_until_steps_the_clock_and_every_agent_then_checks() -> None:
    clock = FakeClock()
    seen: list[tuple[str, int]] = []
    result = do_work_until(
        lambda: clock.now_ns() - clock.start_ns >= 3_000 and "done",
        lambda: seen.append(("a", clock.now_ns())),
        lambda: seen.append(("b", clock.now_ns())),
        clock=clock,
        step_ns=1_000,
    )
    start = clock.start_ns
    assert result == "done"
    assert seen == [(name, start + t) for t in (1_000, 2_000, 3_000) for name in "ab"]


def test_do_work_until_checks_before_the_first_step_and_gives_up_after_max_steps() -> None:
    clock = FakeClock()
    assert do_work_until(lambda: True, clock=clock) is True and clock.now_ns() == clock.start_ns
    with pytest.raises(WaitTimeout, match=r"the image did not hold after 5 steps \(0.005 s of fake time\)"):
        do_work_until(lambda: False, clock=clock, max_steps=5, what="the image")
    assert clock.now_ns() == clock.start_ns + 5_000_000
