"""A clock the test moves by hand, for agents that take their clocks from the driver context."""

from __future__ import annotations

START_NS = 1_000_000_000
"""Where a FakeClock starts: far enough from 0 that "0 means never" timers are not due by accident."""
EPOCH_START_MS = 1_800_000_000_000
"""The wall-clock time (epoch ms) at START_NS: some day in 2027."""


class FakeClock:
    """Monotonic nanoseconds and epoch milliseconds of one made-up time that moves only by :meth:`advance`.

    Give ``now_ns`` as the driver context's ``clock_ns`` and ``epoch_ms`` as its ``epoch_clock_ms``.
    """

    def __init__(self, start_ns: int = START_NS, epoch_start_ms: int = EPOCH_START_MS) -> None:
        self.start_ns = start_ns
        self.epoch_start_ms = epoch_start_ms
        self._now_ns = start_ns

    def now_ns(self) -> int:
        return self._now_ns

    def epoch_ms(self) -> int:
        return self.epoch_start_ms + (self._now_ns - self.start_ns) // 1_000_000

    def advance(self, ns: int) -> None:
        """Move time forward by ``ns`` (at least 0)."""
        if ns < 0:
            raise ValueError(f"a clock only moves forward: advance(ns={ns})")
        self._now_ns += ns
