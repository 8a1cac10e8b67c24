"""MediaDriver: prepares the driver directory and CnC, builds the three agents and runs them.

The conductor, the sender and the receiver are built here and wired with proxies (the conductor
gets a :class:`~logbuf.driver.proxies.SenderProxy` and a
:class:`~logbuf.driver.proxies.ReceiverProxy`); they share one duty cycle (Aeron's SHARED mode),
each agent's ``do_work`` in turn (sender, conductor, receiver: see :class:`_DriverAgents`). Their
clocks and UDP transports come from the driver context.

Embedded (Aeron's INVOKER threading mode): ``MediaDriver.launch(ctx, invoker=True)`` starts no duty
cycle of its own; the application calls :meth:`MediaDriver.invoke` (one cycle) from its own loop,
typically where it would idle, and gives the same callable to its client
(``Context(driver_agent_invoker=driver.invoke)``) so the client's commands are answered while it waits.
One thread then runs client and driver: no GIL hand-over, no second process to schedule.

Start-up: refuse a directory whose CnC shows a live driver (fresh heartbeat, live pid); take
over a stale one (remove its files). Shut-down: close agents, remove the directory if set to.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import threading
import time
from types import FrameType

import structlog

from logbuf.agent import (
    Agent,
    AgentRunner,
    CompositeAgent,
    CpuClaim,
    claim_cpu,
    idle_strategy_from_name,
    parse_cpu_list,
)
from logbuf.conduit.broadcast import BroadcastTransmitter
from logbuf.conduit.cnc import CncFile, is_driver_active
from logbuf.conduit.counters import CountersManager
from logbuf.conduit.error_log import DistinctErrorLog
from logbuf.conduit.loss_report import LossReport, LossReportFile
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer
from logbuf.conduit.system_counters_descriptor import CYCLE_TIME_THRESHOLD_NS
from logbuf.conduit.topic_registry import TopicRegistry
from logbuf.directory import DirectoryPermissionError, check_directory
from logbuf.driver import _udp
from logbuf.driver.conductor import DriverConductor
from logbuf.driver.context import DriverContext
from logbuf.driver.proxies import ReceiverProxy, SenderProxy
from logbuf.driver.receiver import Receiver
from logbuf.driver.sender import Sender
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.durations import format_duration_ns
from logbuf.errors import ErrorCode, LogbufError

COUNTER_FREE_TO_REUSE_TIMEOUT_NS = 1_000_000_000
JUST_BUSY_NS = 1_000_000
RECENTLY_BUSY_NS = 10_000_000
BUSY_MAX_PARK_S = 20e-6
LONG_IDLE_NS = 1_000_000_000
LONG_IDLE_PARK_S = 5e-3
"""With UDP endpoints open, a driver that did work in the last 1 ms does not park but yields (the
sender polls the logs, so a park delays every message by its length; a yield gives the core to any
client that needs it); with work in the last 10 ms it parks at most 20 us; an idle driver still
backs off to 2 ms, and after 1 s with nothing to do parks 5 ms at a time: each wake-up of the Python
duty cycle costs 30-70 us, so 2 ms parks alone held 2-3 % of a core on a loaded 2-core machine, and
5 ms ones hold about 1 %. Parks wake early when a datagram arrives; a command or a first message
after a long silence waits at most 5 ms."""


SENDER_CONTROL_POLL_EVERY = 4
"""The sender reads its sockets every 4th idle cycle (see :class:`~logbuf.driver.sender.Sender`): one
poll system call per cycle saved in 3 of 4."""


CYCLE_TIME_COUNTERS = (
    (SystemCounterId.CONDUCTOR_MAX_CYCLE_TIME, SystemCounterId.CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED),
    (SystemCounterId.SENDER_MAX_CYCLE_TIME, SystemCounterId.SENDER_CYCLE_TIME_THRESHOLD_EXCEEDED),
    (SystemCounterId.RECEIVER_MAX_CYCLE_TIME, SystemCounterId.RECEIVER_CYCLE_TIME_THRESHOLD_EXCEEDED),
)


BUSY_CPU_TIME_COUNTERS = (
    SystemCounterId.CONDUCTOR_BUSY_CPU_TIME,
    SystemCounterId.SENDER_BUSY_CPU_TIME,
    SystemCounterId.RECEIVER_BUSY_CPU_TIME,
)
"""One per agent, in the order they start (conductor, sender, receiver)."""


class _DriverAgents(CompositeAgent):
    """The conductor, sender and receiver on one duty cycle; remembers when it last did work.

    They start (and close in reverse) in that order, but each cycle runs the sender, the conductor,
    then the receiver: a message a client committed since the last cycle leaves without waiting for
    the conductor's Python, and one that arrives is in its image just before the cycle ends and the
    client (an embedded driver's caller, or a yielding one) polls.

    With ``busy_cpu_time`` each agent's ``do_work`` that did work adds the duty-cycle thread's CPU time
    it took to that agent's busy CPU time counter; calls that found nothing to do (and the idle
    strategy's spins, yields and parks) are not counted. So the counter is what the agent's work cost,
    where the process's CPU time also holds a polling driver's idling (a driver that yields after
    work, to stay responsive, uses a core's wall time whatever it sends). It costs four reads of the
    thread's CPU clock (a system call each, ~0.6 us) per duty cycle, hence off by default."""

    last_busy_ns: int = 0

    def __init__(
        self,
        conductor: DriverConductor,
        sender: Sender,
        receiver: Receiver,
        *,
        system_counters: SystemCounters,
        busy_cpu_time: bool,
    ) -> None:
        super().__init__(conductor, sender, receiver)
        self._system_counters = system_counters
        self._busy_cpu_time = busy_cpu_time
        self._cycle = (sender.do_work, conductor.do_work, receiver.do_work)
        counters = dict(zip(self.agents, BUSY_CPU_TIME_COUNTERS, strict=True))
        self._counted_cycle: tuple[tuple[Agent, SystemCounterId], ...] = tuple(
            (agent, counters[agent]) for agent in (sender, conductor, receiver)
        )

    def do_work(self) -> int:
        if self._busy_cpu_time:
            work = self._work_counting_cpu()
        else:
            send, conduct, receive = self._cycle
            work = send() + conduct() + receive()
        if work:
            self.last_busy_ns = time.monotonic_ns()
        return work

    def _work_counting_cpu(self) -> int:
        cpu_ns, increment = time.thread_time_ns, self._system_counters.increment
        work = 0
        before = cpu_ns()
        for agent, counter_id in self._counted_cycle:
            agent_work = agent.do_work()
            after = cpu_ns()
            if agent_work:
                increment(counter_id, after - before)
                work += agent_work
            before = after
        return work


class ActiveDriverError(LogbufError):
    """Another driver is alive in the directory."""


class InvokerModeError(LogbufError):
    """``run()``/``start()`` on an embedded driver, or ``invoke()`` on one that runs its own duty cycle."""


class MediaDriver:
    """One media driver: ``MediaDriver.launch(ctx)`` then ``run()`` (blocking) or ``start()`` (thread);
    or ``MediaDriver.launch(ctx, invoker=True)`` and ``invoke()`` from the application's loop."""

    def __init__(self, ctx: DriverContext, invoker: bool = False) -> None:
        self.ctx = ctx
        self.invoker = invoker
        """Embedded: the application runs the duty cycle with :meth:`invoke` (no thread, no CPU placement)."""
        self._invoker_started = False
        self._map_files(ctx)
        self._max_cycle_ns = 0
        self._cpu_claim: CpuClaim | None = None
        self.error_log = DistinctErrorLog(self.cnc.error_log, clock_ms=ctx.epoch_clock_ms)
        self.sender = Sender(ctx.clock_ns, control_poll_every=SENDER_CONTROL_POLL_EVERY)
        self.receiver = Receiver(ctx.clock_ns)
        self._park_epoll = select.epoll()
        for poller in (self.sender.poller, self.receiver.poller):
            self._park_epoll.register(poller.fileno(), select.EPOLLIN)
        self.conductor = DriverConductor(
            ctx,
            to_driver=ManyToOneRingBuffer(self.cnc.to_driver, self._on_invalid_command_record),
            to_clients=BroadcastTransmitter(self.cnc.to_clients),
            counters=self.counters,
            system_counters=self.system_counters,
            error_log=self.error_log,
            sender=SenderProxy(self.sender),
            receiver=ReceiverProxy(self.receiver),
            on_terminate=self.request_stop,
            loss_report=LossReport(self.loss_report_file.buffer, ctx.epoch_clock_ms),
        )
        self.conductor.to_driver.next_correlation_id()  # as Aeron's driver: no client or resource gets id 0
        self.agents = _DriverAgents(
            self.conductor,
            self.sender,
            self.receiver,
            system_counters=self.system_counters,
            busy_cpu_time=ctx.busy_cpu_time,
        )
        self.runner = AgentRunner(
            self.agents,
            idle_strategy_from_name(ctx.idle_strategy, park=self._park),  # parks wake when a datagram arrives
            error_handler=self._on_agent_error,
            max_cycle_ns_recorder=self._record_cycle_time,
            cpus=None if invoker else self._place(ctx.cpu_affinity),
        )
        self._log = structlog.get_logger().bind(role="driver", dir=ctx.dir)
        self._closed = False

    def _map_files(self, ctx: DriverContext) -> None:
        """The driver's shared files: the topic registry, the CnC (its counters with the system counters)
        and the loss report."""
        # Before the CnC: a client that finds the CnC finds the registry.
        self.topic_registry = TopicRegistry.create(ctx.dir, ctx.topic_registry_length, mode=ctx.file_mode)
        self.cnc = CncFile.create(
            ctx.dir,
            to_driver_capacity=ctx.to_driver_buffer_length,
            to_clients_capacity=ctx.to_clients_buffer_length,
            counters_values_length=ctx.counters_buffer_length,
            error_log_length=ctx.error_buffer_length,
            client_liveness_timeout_ns=ctx.client_liveness_timeout_ns,
            mode=ctx.file_mode,
        )
        self.counters = CountersManager(
            self.cnc.counters_metadata,
            self.cnc.counters_values,
            free_to_reuse_timeout_ns=COUNTER_FREE_TO_REUSE_TIMEOUT_NS,
        )
        self.system_counters = SystemCounters(self.counters)
        self.loss_report_file = LossReportFile.create(ctx.dir, ctx.loss_report_buffer_length, mode=ctx.file_mode)
        self.system_counters.set(
            SystemCounterId.BYTES_CURRENTLY_MAPPED,
            os.path.getsize(self.cnc.path) + len(self.loss_report_file.buffer) + len(self.topic_registry.buffer),
        )

    def _record_cycle_time(self, ns: int) -> None:
        """One duty cycle runs all three agents (Aeron's SHARED mode): it counts for each, as there.
        Called every cycle, so it touches the counters only when there is something to write."""
        if ns > self._max_cycle_ns:
            self._max_cycle_ns = ns
            for max_id, _ in CYCLE_TIME_COUNTERS:
                self.system_counters.set(max_id, ns)
        if ns > CYCLE_TIME_THRESHOLD_NS:
            for _, exceeded_id in CYCLE_TIME_COUNTERS:
                self.system_counters.increment(exceeded_id)

    def _place(self, cpu_affinity: str) -> frozenset[int] | None:
        """The CPUs for the duty cycle: as listed, none for 'any', one claimed for 'auto' (see
        :func:`logbuf.agent.claim_cpu`; the claim is held until close)."""
        if cpu_affinity == "any":
            return None
        if cpu_affinity == "auto":
            self._cpu_claim = claim_cpu()
            return frozenset({self._cpu_claim.cpu}) if self._cpu_claim is not None else None
        return parse_cpu_list(cpu_affinity) or None

    def _on_invalid_command_record(self, record_offset: int, length: int, msg_type_id: int) -> None:
        """A command record whose length cannot be true (written by something that is not a client):
        the ring skips it; counted and recorded, never raised."""
        self.system_counters.increment(SystemCounterId.ERRORS)
        self.error_log.record(
            f"{ErrorCode.MALFORMED_COMMAND.name}: command ring record of length {length} (type {msg_type_id})"
            " cannot be valid: skipped"
        )

    def _park(self, seconds: float) -> None:
        """Sleep, or with UDP sockets open wait on one epoll set holding the sender's and the receiver's
        (each readable while one of its sockets is), so a datagram wakes the duty cycle: no descriptor
        limit (``select()`` fails on descriptors past 1023) and a timeout in nanoseconds (``ppoll``)."""
        sockets = self.sender.poller.selectable or self.receiver.poller.selectable
        since_busy_ns = time.monotonic_ns() - self.agents.last_busy_ns
        if since_busy_ns > LONG_IDLE_NS:
            seconds = max(seconds, LONG_IDLE_PARK_S)
        if sockets:
            if since_busy_ns < JUST_BUSY_NS:
                os.sched_yield()  # a message stream in flight: do not park at all
                return
            if since_busy_ns < RECENTLY_BUSY_NS:
                seconds = min(seconds, BUSY_MAX_PARK_S)  # a live UDP stream: stay responsive
            _udp.wait_readable(self._park_epoll.fileno(), int(seconds * 1e9))
        else:
            time.sleep(seconds)

    @classmethod
    def launch(cls, ctx: DriverContext | None = None, invoker: bool = False) -> MediaDriver:
        """Validate settings, prepare the directory (refusing a live driver), create the CnC.
        ``invoker``: embedded, the caller runs the duty cycle with :meth:`invoke`."""
        ctx = (ctx or DriverContext()).conclude()
        prepare_directory(ctx)
        driver = cls(ctx, invoker=invoker)
        cpus = driver.runner.cpus
        placement = "invoker" if invoker else sorted(cpus) if cpus else "any"
        driver._log.info("driver.started", pid=os.getpid(), cpus=placement, **ctx.summary())
        return driver

    def _on_agent_error(self, error: BaseException) -> None:
        self.system_counters.increment(SystemCounterId.ERRORS)
        self.error_log.record(error)
        self._log.error("driver.agent_error", error=repr(error))

    def request_stop(self) -> None:
        self.runner.close(timeout_s=0)

    def run(self) -> None:
        """Run the conductor on this thread until :meth:`request_stop` (or a signal via :func:`main`)."""
        self._refuse_invoker("run")
        self.runner.run()

    def start(self) -> threading.Thread:
        self._refuse_invoker("start")
        return self.runner.start()

    def _refuse_invoker(self, method: str) -> None:
        if self.invoker:
            raise InvokerModeError(f"{method}(): this driver is embedded (invoker=True); call invoke() instead")

    def invoke(self) -> int:
        """One duty cycle of the conductor, sender and receiver on the caller's thread; returns the work
        done (0: nothing to do, the caller may idle). Agent errors are counted and logged, as in
        :meth:`run`. Embedded drivers only; the first call starts the agents, :meth:`close` closes them."""
        if not self.invoker:
            raise InvokerModeError("invoke(): this driver runs its own duty cycle (launch it with invoker=True)")
        if self._closed:
            return 0
        if not self._invoker_started:
            self._invoker_started = True
            self.agents.on_start()
        start = time.perf_counter_ns()
        try:
            work = self.agents.do_work()
        except Exception as e:  # an agent error is reported and the duty cycle goes on
            work = 1
            self._on_agent_error(e)
        self._record_cycle_time(time.perf_counter_ns() - start)
        return work

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.runner.close()
        if self._invoker_started:
            self.agents.on_close()  # a runner closes its agents when its loop ends; an invoker has none
        if self._cpu_claim is not None:
            self._cpu_claim.release()
        self._log.info("driver.stopped")
        self._park_epoll.close()
        self.cnc.close()
        self.loss_report_file.close()
        self.topic_registry.close()
        if self.ctx.dir_delete_on_shutdown:
            shutil.rmtree(self.ctx.dir, ignore_errors=True)

    def __enter__(self) -> MediaDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prepare_directory(ctx: DriverContext) -> None:
    """Create the driver directory; refuse one owned by another user or writable by others
    (:func:`check_directory`) and a live driver there; clear a stale one."""
    log = structlog.get_logger().bind(role="driver", dir=ctx.dir)
    if check_directory(ctx.dir, group_access=ctx.group_access):
        if is_driver_active(ctx.dir, timeout_ns=ctx.driver_timeout_ns):
            raise ActiveDriverError(
                f"an active media driver is already running in {ctx.dir} "
                f"(its heartbeat is fresher than --driver-timeout {format_duration_ns(ctx.driver_timeout_ns)})"
            )
        log.warning("driver.stale_directory_taken_over")
        shutil.rmtree(ctx.dir)
    try:
        os.makedirs(ctx.dir, mode=ctx.dir_mode)
    except FileExistsError:
        raise DirectoryPermissionError(
            f"driver directory {ctx.dir} was created by someone else while this driver was starting"
        ) from None
    os.chmod(ctx.dir, ctx.dir_mode)


def install_signal_handlers(driver: MediaDriver) -> None:
    """SIGINT/SIGTERM stop the duty cycle; the driver then closes cleanly."""

    def handler(signum: int, frame: FrameType | None) -> None:
        driver.request_stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
