"""The archive as a service: ``logbuf-archive serve -d DIR``, or embedded in a process like the driver.

    service = ArchiveService.launch(ArchiveContext(archive_dir="/data/archive"))   # its own thread
    ...
    service.close()

    service = ArchiveService(ArchiveContext(...))        # embedded: the caller runs the duty cycle
    service.start()
    while running:
        service.do_work()

The service is a client of a media driver (one ``Aeron`` whose conductor is driven from the service's
own loop) and owns the archive directory's catalog for writing. Its agent is
:class:`archive.archive_conductor.ArchiveConductor`; see there for what a duty cycle does.
"""

from __future__ import annotations

import threading
import time

import structlog

from logbuf.archive.archive_conductor import ArchiveConductor
from logbuf.archive.catalog import Catalog
from logbuf.archive.replication import Replications
from logbuf.archive.service_context import ArchiveContext
from logbuf.archive.sync_service import SyncDigestService
from logbuf.client import Aeron, Context
from logbuf.conduit.archive_counters import ArchiveCounters
from logbuf.directory import access_modes, resolve_dir, shares_with_group
from logbuf.errors import ClosedError

__all__ = ["ArchiveService"]


class ArchiveService:
    """One archive service: its driver client, catalog, counters and conductor agent."""

    role_name = "archive"

    def __init__(self, ctx: ArchiveContext) -> None:
        self.ctx = ctx.conclude()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.aeron: Aeron | None = None
        self.conductor: ArchiveConductor | None = None
        self.catalog: Catalog | None = None
        self.counters: ArchiveCounters | None = None
        self._log = structlog.get_logger().bind(role="archive")

    def start(self) -> ArchiveService:
        """Connect to the driver, open the catalog (recovering interrupted recordings) and subscribe."""
        ctx = self.ctx
        file_mode, dir_mode = access_modes(shares_with_group(resolve_dir(ctx.driver_dir or None)))
        self.catalog = Catalog.open_writable(ctx.archive_dir, file_mode=file_mode, dir_mode=dir_mode)
        try:
            self.counters = ArchiveCounters(ctx.archive_dir, file_mode)
            self.aeron = Aeron.connect(
                Context(dir=ctx.driver_dir, use_conductor_thread=False, driver_timeout_ns=ctx.driver_timeout_ns)
            )
            self.conductor = ArchiveConductor(ctx, self.aeron, self.catalog, self.counters)
            replications = Replications(self.conductor)
            self.conductor.add_extension(replications)
            self.conductor.add_extension(SyncDigestService(self.conductor))
            replications.resume()  # copies a previous run left in progress (after a kill -9: recovered)
            self.conductor.on_start()
        except BaseException:
            self.close()
            raise
        return self

    @classmethod
    def launch(cls, ctx: ArchiveContext) -> ArchiveService:
        """Start the service on a thread of its own (closed by :meth:`close`)."""
        service = cls(ctx).start()
        service._thread = threading.Thread(target=service._run_loop, name="logbuf-archive", daemon=True)
        service._thread.start()
        return service

    def do_work(self) -> int:
        """One duty cycle (embedded use): the driver client's conductor, then the archive's agent."""
        assert self.aeron is not None and self.conductor is not None, "start() the service first"
        work = self.aeron.do_work()
        return work + self.conductor.do_work()

    def _run_loop(self) -> None:
        idle = 0.0
        while not self._stop.is_set():
            try:
                work = self.do_work()
            except ClosedError:  # the driver is gone and the client closed: nothing more to serve
                self._log.error("archive.driver_lost")
                raise
            except Exception as e:  # a bug: logged and counted, and the service goes on
                self._log.exception("archive.duty_cycle_failed", error=str(e))
                if self.counters is not None:
                    self.counters.errors.increment()
                work = 0
            if work:
                idle = 0.0
            else:
                idle = min(self.ctx.idle_sleep_ns / 1e9, idle * 2 or 0.00005)
                time.sleep(idle)

    def run(self) -> None:
        """Run the duty cycle on this thread until :meth:`stop` (the ``serve`` command)."""
        if self.conductor is None:
            self.start()
        try:
            self._run_loop()
        finally:
            self.close()

    def stop(self) -> None:
        """Ask the loop to end (thread- and signal-safe)."""
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
            self._thread = None
        if self.conductor is not None:
            conductor, self.conductor = self.conductor, None
            conductor.on_close()
        if self.aeron is not None:
            aeron, self.aeron = self.aeron, None
            aeron.close()
        if self.catalog is not None:
            catalog, self.catalog = self.catalog, None
            catalog.close()
        if self.counters is not None:
            counters, self.counters = self.counters, None
            counters.close()

    def __enter__(self) -> ArchiveService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
