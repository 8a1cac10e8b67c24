"""Agents and their runner: a ``do_work()`` duty cycle driven by an idle strategy.

An agent does a bounded amount of work per call and returns how much it did; the runner calls
it in a loop and lets the idle strategy back off when it returns 0. On 2 cores under the GIL,
backing off matters more than spinning: a conductor that sleeps when idle leaves the core to
the application's publishers and subscribers.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

import structlog

from logbuf.errors import ConfigurationError

__all__ = [
    "Agent",
    "AgentRunner",
    "BackoffIdleStrategy",
    "BusySpinIdleStrategy",
    "CpuClaim",
    "IdleStrategy",
    "NoOpIdleStrategy",
    "Park",
    "claim_cpu",
    "SleepingIdleStrategy",
    "YieldingIdleStrategy",
    "idle_strategy_from_name",
]


class Agent(Protocol):
    """A unit of work run by an :class:`AgentRunner`."""

    role_name: str

    def on_start(self) -> None: ...

    def do_work(self) -> int: ...

    def on_close(self) -> None: ...


class IdleStrategy(Protocol):
    def idle(self, work_count: int) -> None: ...

    def reset(self) -> None: ...


class NoOpIdleStrategy:
    """Never idles (for tests that step agents by hand)."""

    def idle(self, work_count: int) -> None:
        pass

    def reset(self) -> None:
        pass


class BusySpinIdleStrategy(NoOpIdleStrategy):
    """Spins: lowest latency, a whole core."""


class YieldingIdleStrategy:
    """Gives up the core with sched_yield when idle."""

    def idle(self, work_count: int) -> None:
        if work_count <= 0:
            os.sched_yield()

    def reset(self) -> None:
        pass


class SleepingIdleStrategy:
    """Sleeps a fixed period when idle."""

    def __init__(self, sleep_ns: int = 1_000_000) -> None:
        self.sleep_s = sleep_ns / 1e9

    def idle(self, work_count: int) -> None:
        if work_count <= 0:
            time.sleep(self.sleep_s)

    def reset(self) -> None:
        pass


PR_SET_TIMERSLACK = 29
PARK_TIMER_SLACK_NS = 1_000


def reduce_timer_slack(slack_ns: int = PARK_TIMER_SLACK_NS) -> bool:
    """Ask Linux to wake this thread's parks within ``slack_ns`` of their deadline (the default slack
    is 50 us, longer than the parks of a busy duty cycle). False where prctl is unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        return int(libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


Park = Callable[[float], None]
"""Parks the calling thread for up to the given seconds (``time.sleep``, or a wait on sockets
that wakes when a datagram arrives)."""


class BackoffIdleStrategy:
    """Spin, then yield, then park with exponential back-off up to ``max_park_ns`` (Agrona's shape)."""

    def __init__(
        self,
        max_spins: int = 10,
        max_yields: int = 20,
        min_park_ns: int = 1_000,
        max_park_ns: int = 1_000_000,
        park: Park = time.sleep,
    ):
        if not 0 < min_park_ns <= max_park_ns:
            raise ConfigurationError(f"min_park_ns={min_park_ns} must be > 0 and <= max_park_ns={max_park_ns}")
        self.max_spins = max_spins
        self.max_yields = max_yields
        self.min_park_ns = min_park_ns
        self.max_park_ns = max_park_ns
        self._spins = 0
        self._yields = 0
        self._park_ns = min_park_ns
        self.park = park

    def idle(self, work_count: int) -> None:
        if work_count > 0:
            self.reset()
            return
        if self._spins < self.max_spins:
            self._spins += 1
        elif self._yields < self.max_yields:
            self._yields += 1
            os.sched_yield()
        else:
            self.park(self._park_ns / 1e9)
            self._park_ns = min(self._park_ns * 2, self.max_park_ns)

    def reset(self) -> None:
        self._spins = 0
        self._yields = 0
        self._park_ns = self.min_park_ns


IDLE_STRATEGIES: dict[str, Callable[[Park], IdleStrategy]] = {
    # Under the GIL each wake-up costs tens of microseconds: park up to 2 ms when idle (< 5% of a core).
    # No spinning: on 2 cores a spinning agent holds the core its clients need, so it yields instead.
    "backoff": lambda park: BackoffIdleStrategy(max_spins=0, max_park_ns=2_000_000, park=park),
    "sleep": lambda park: SleepingIdleStrategy(),
    "yield": lambda park: YieldingIdleStrategy(),
    "spin": lambda park: BusySpinIdleStrategy(),
    "noop": lambda park: NoOpIdleStrategy(),
}
"""Idle strategies by name, each made with the agent's way to park (used by ``backoff``)."""


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0"``, ``"0,2"`` or ``"0-3"`` (Linux's cpu-list form) to a set of CPU numbers; the empty string
    is the empty set. Raises ConfigurationError naming the bad part or a CPU this process may not use."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, sep, high = part.partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            raise ConfigurationError(f"cpu list {text!r}: {part!r} is not a CPU number or a range like 0-3") from None
        if first < 0 or last < first:
            raise ConfigurationError(f"cpu list {text!r}: {part!r} is not a CPU number or a range like 0-3")
        cpus.update(range(first, last + 1))
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise ConfigurationError(
            f"cpu list {text!r}: CPU {sorted(cpus - allowed)} not available (this process may use {sorted(allowed)})"
        )
    return frozenset(cpus)


CPU_LOCK_DIR = "/dev/shm"
"""Where drivers placed with ``cpu_affinity=auto`` take their per-CPU lock files (one tmpfs per machine)."""


class CpuClaim:
    """A CPU taken for one process's duty cycle: an exclusive ``flock`` on ``logbuf-cpu-<n>.lock``, held
    while the claim lives (the kernel drops it when the process dies, however it dies)."""

    def __init__(self, cpu: int, fd: int) -> None:
        self.cpu = cpu
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def claim_cpu(lock_dir: str = CPU_LOCK_DIR) -> CpuClaim | None:
    """``cpu_affinity=auto``: the first CPU, from the highest this process may use down, that no other
    process placed this way holds; None when fewer than two CPUs are allowed (pinning would only take the
    client's core), when every one is held (share them, as unpinned), or when the locks cannot be made.

    Two drivers on one small machine then run on different cores: on 2 cores, sharing one doubles a
    UDP round trip, and the scheduler does that often enough when left alone."""
    import fcntl

    allowed = sorted(os.sched_getaffinity(0), reverse=True)
    if len(allowed) < 2:
        return None
    for cpu in allowed:
        try:
            fd = os.open(os.path.join(lock_dir, f"logbuf-cpu-{cpu}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return CpuClaim(cpu, fd)
    return None


def idle_strategy_from_name(name: str, park: Park = time.sleep) -> IdleStrategy:
    """``backoff`` (default), ``sleep``, ``yield``, ``spin`` or ``noop``; ``park`` is how ``backoff``
    parks."""
    try:
        return IDLE_STRATEGIES[name](park)
    except KeyError:
        raise ConfigurationError(f"idle strategy {name!r} is not one of {sorted(IDLE_STRATEGIES)}") from None


class CompositeAgent:
    """Several agents on one duty cycle (Aeron's SHARED threading mode: in Python the GIL would
    serialise separate threads anyway). Closes in reverse order."""

    def __init__(self, *agents: Agent) -> None:
        self.agents = agents
        self.role_name = agents[0].role_name if len(agents) == 1 else "[" + ",".join(a.role_name for a in agents) + "]"

    def on_start(self) -> None:
        for agent in self.agents:
            agent.on_start()

    def do_work(self) -> int:
        work = 0
        for agent in self.agents:
            work += agent.do_work()
        return work

    def on_close(self) -> None:
        for agent in reversed(self.agents):
            agent.on_close()


class AgentRunner:
    """Runs one agent's duty cycle until closed, on the calling thread (:meth:`run`) or its own (:meth:`start`)."""

    def __init__(
        self,
        agent: Agent,
        idle_strategy: IdleStrategy,
        error_handler: Callable[[BaseException], None] | None = None,
        max_cycle_ns_recorder: Callable[[int], None] | None = None,
        cpus: frozenset[int] | None = None,
    ) -> None:
        self.agent = agent
        self.idle_strategy = idle_strategy
        self.error_handler = error_handler
        self.max_cycle_ns_recorder = max_cycle_ns_recorder
        self.cpus = cpus
        """CPUs the duty-cycle thread may run on (None: wherever the scheduler puts it)."""
        self._running = threading.Event()
        self._running.set()
        self._thread: threading.Thread | None = None
        self._log = structlog.get_logger().bind(role=agent.role_name)

    @property
    def is_running(self) -> bool:
        return self._running.is_set()

    def start(self) -> threading.Thread:
        """Run the agent on a new daemon thread named after its role."""
        self._thread = threading.Thread(target=self.run, name=self.agent.role_name, daemon=True)
        self._thread.start()
        return self._thread

    def run(self) -> None:
        agent, idle = self.agent, self.idle_strategy
        recorder = self.max_cycle_ns_recorder
        reduce_timer_slack()  # per thread: parks of tens of microseconds must not become 50 us more
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)  # this thread only
        agent.on_start()
        self._log.info("agent.started")
        try:
            while self._running.is_set():
                start = time.perf_counter_ns()
                try:
                    work = agent.do_work()
                except Exception as e:  # an agent error is reported and the duty cycle goes on
                    work = 1
                    if self.error_handler is None:
                        raise
                    self.error_handler(e)
                if recorder is not None:
                    recorder(time.perf_counter_ns() - start)
                idle.idle(work)
        finally:
            agent.on_close()
            self._log.info("agent.closed")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the duty cycle; waits for the agent's thread if it has one."""
        self._running.clear()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
