"""Real media driver processes for system tests.

:class:`DriverProcess` runs ``python -m logbuf.driver.main --dir <dir> <args>`` with its output in a
file (never a pipe, which a chatty driver could fill and block on), waits for it with a timeout
(its own pid in the CnC and a fresh heartbeat, so a restart in a used directory waits for the new
driver), and stops it. :class:`DriverSet` starts drivers for one test, module or session and, at
the end: fails the test if a driver still running has anything in its distinct error log that the
test did not expect, prints every driver's output and counters (``logbuf-stat --once --json``) if
a test failed meanwhile, stops the drivers and removes their directories.

The pytest plugin (:mod:`logbuf.testing.pytest_plugin`) gives the ``driver_factory`` fixture: ``driver_factory(*args)``
starts a driver for the test (``DEFAULT_ARGS`` plus ``args``); modules and sessions use
``with DriverSet(request) as drivers:`` in their own fixture.

A test that provokes driver errors says so: ``driver.expected_errors.append("INVALID_CHANNEL")``
accepts errors that contain that text; ``driver.check_errors = False`` accepts any.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import pytest

from logbuf.conduit.cnc import CncFile, cnc_driver_heartbeat_ms
from logbuf.conduit.counters import CountersReader
from logbuf.conduit.error_log import read_error_log
from logbuf.conduit.system_counters_descriptor import SYSTEM_COUNTER_TYPE_IDS
from logbuf.errors import LogbufError

DEFAULT_ARGS: list[str] = [
    "--driver-timeout",
    "5s",
    "--client-liveness-timeout",
    "5s",
    "--publication-linger-timeout",
    "1s",
    "--ipc-term-length",
    "1m",
    "--dir-delete-on-shutdown",
    "false",
]
"""Settings for most system tests: small logs, timeouts short enough to test and long enough to ride out
a loaded 2-core machine. Tests that time something out pass their own."""


def quick_timeout_args(ipc_term_length: str = "1m") -> list[str]:
    """Settings for tests that watch a client or a publication go: :data:`DEFAULT_ARGS` with a 3 s driver
    timeout and 2 s client liveness (``ipc_term_length``: a small one makes back pressure come early)."""
    return [
        *("--ipc-term-length", ipc_term_length, "--driver-timeout", "3s", "--client-liveness-timeout", "2s"),
        *("--publication-linger-timeout", "1s", "--dir-delete-on-shutdown", "false"),
    ]


START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def read_output(path: str) -> str:
    """What a child process wrote to its log file ``path`` so far ("" before the file exists)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def unique_dir() -> str:
    """A fresh driver directory on /dev/shm (nothing is created)."""
    return f"/dev/shm/logbuf-test-{uuid.uuid4().hex[:12]}"


@dataclass(eq=False)
class DriverProcess:
    """One ``mediadriver`` process; ``start()`` may be called again after ``stop()`` or ``kill()``."""

    dir: str = field(default_factory=unique_dir)
    args: list[str] = field(default_factory=list)
    expected_errors: list[str] = field(default_factory=list)
    """Texts of errors the test provokes on purpose: errors containing one of them are accepted."""
    check_errors: bool = True
    """False: the error log is not checked at the end (the test accepts any error)."""
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    log_path: str = ""

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "logbuf.driver.main", "--dir", self.dir, *self.args]

    def start(self, timeout_s: float = START_TIMEOUT_S, heartbeat_timeout_ns: int = 5_000_000_000) -> DriverProcess:
        """Start the process and wait until it heartbeats in its directory as itself."""
        if self.alive:
            raise AssertionError(f"driver in {self.dir} is already running (pid {self.pid})")
        if not self.log_path:
            fd, self.log_path = tempfile.mkstemp(prefix="logbuf-driver-", suffix=".log")
            os.close(fd)
        with open(self.log_path, "ab") as log:
            log.write(f"--- {' '.join(self.command)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if self.env is None else {**os.environ, **self.env},
            )
        deadline = time.monotonic() + timeout_s
        while not self._heartbeating(heartbeat_timeout_ns):
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"driver exited with {self.proc.returncode} at start; output:\n{self.output()[-10_000:]}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"driver did not start in {timeout_s} s; output:\n{self.output()[-10_000:]}")
            time.sleep(0.01)
        return self

    def _heartbeating(self, heartbeat_timeout_ns: int) -> bool:
        """This process's CnC is in the directory and its heartbeat is fresh."""
        try:
            cnc = CncFile.open(self.dir)
        except (LogbufError, OSError):  # no file yet, not ready, or a predecessor's being replaced
            return False
        try:
            assert self.proc is not None
            age_ms = time.time_ns() // 1_000_000 - cnc_driver_heartbeat_ms(cnc)
            return cnc.pid == self.proc.pid and age_ms * 1_000_000 <= heartbeat_timeout_ns
        finally:
            cnc.close()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "driver not started"
        return self.proc.pid

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> str:
        """SIGTERM and wait (SIGKILL after ``timeout_s``); returns the driver's output so far."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        return self.output()

    def kill(self) -> None:
        """SIGKILL and reap (a zombie's pid would still look alive)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)

    def output(self) -> str:
        return read_output(self.log_path)

    # -- what the driver left in shared memory ----------------------------------------------------------
    def errors(self) -> list[str]:
        """The distinct error log's texts."""
        cnc = CncFile.open(self.dir)
        try:
            return [e.text for e in read_error_log(cnc.error_log)]
        finally:
            cnc.close()

    def unexpected_errors(self) -> list[str]:
        if not self.check_errors:
            return []
        return [e for e in self.errors() if not any(x in e for x in self.expected_errors)]

    def counters(self) -> list[dict[str, Any]]:
        """Every allocated counter, read in this process (fast; :meth:`stat_json` is the tool's view)."""
        cnc = CncFile.open(self.dir)
        try:
            reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
            return [{"id": c.counter_id, "type_id": c.type_id, "label": c.label, "value": c.value} for c in reader]
        finally:
            cnc.close()

    def system_counter(self, label: str) -> int:
        """A system counter's value by its label; Aeron's labels may go on after a colon ("Errors:
        version=...", "Conductor max cycle time doing its work in ns: SHARED"): the name before it will do."""
        values = [
            c["value"]
            for c in self.counters()
            if c["type_id"] in SYSTEM_COUNTER_TYPE_IDS and system_counter_name_matches(c["label"], label)
        ]
        assert len(values) == 1, f"no single system counter labelled {label!r} in {self.dir}"
        return int(values[0])

    def system_counters(self) -> dict[str, int]:
        """Every system counter by name (the label up to Aeron's ``: <details>``), read in this process at one
        moment: quicker than :meth:`stat_json`, and counters read together cover the same time."""
        return {
            c["label"].split(": ", 1)[0]: int(c["value"])
            for c in self.counters()
            if c["type_id"] in SYSTEM_COUNTER_TYPE_IDS
        }

    def stream_counters(self, type_id: int) -> list[int]:
        return [int(c["value"]) for c in self.counters() if c["type_id"] == type_id]

    def stat_json(self, interval_s: float = 0.05) -> dict[str, Any]:
        """``logbuf-stat --once --json`` on this driver's directory."""
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "logbuf.client.stat",
                "--dir",
                self.dir,
                "--once",
                "--json",
                "--interval",
                str(interval_s),
            ],
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0, f"logbuf-stat failed ({done.returncode}): {done.stderr.decode(errors='replace')}"
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def report(self) -> str:
        """Counters, distinct errors and output, for a failed test."""
        parts = [f"=== driver {self.dir} (args {self.args}, {'running' if self.alive else 'stopped'})"]
        if os.path.exists(os.path.join(self.dir, "cnc.dat")):
            try:
                snapshot = self.stat_json()
                parts.append("--- counters (logbuf-stat --once --json; zero system counters left out)")
                parts.extend(
                    f"{c['id']:4} {c['type_id']:4} {c['label'][:80]:80} {c['value']:,}"
                    for c in snapshot["counters"]
                    if c["value"] or c["type_id"] not in SYSTEM_COUNTER_TYPE_IDS
                )
                parts.extend(f"stream: {json.dumps(s)}" for s in snapshot["streams"])
                parts.extend(f"error (x{e['count']}): {e['text']}" for e in snapshot["errors"])
            except (AssertionError, subprocess.TimeoutExpired, ValueError) as e:
                parts.append(f"--- counters unreadable: {e}")
        parts.append(f"--- output ({self.log_path})\n{self.output()[-20_000:]}")
        return "\n".join(parts)

    def remove(self) -> None:
        """Delete the directory and the output file (the process must be gone)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.log_path:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass


class DriverSet:
    """The drivers of one test (or module, or session): checked, reported and removed at the end.

    Made from a fixture's ``request``, it also reports when any test failed while it was open; as a
    context manager, when the block raised.
    """

    def __init__(self, request: pytest.FixtureRequest | None = None) -> None:
        self._session = request.session if request is not None else None
        self._failures_before = self._session.testsfailed if self._session is not None else 0
        self.drivers: list[DriverProcess] = []

    def __call__(self, *args: str, base: list[str] | None = None, **kwargs: Any) -> DriverProcess:
        """Start a driver with ``base`` (default ``DEFAULT_ARGS``) plus ``args``; ``kwargs`` go to DriverProcess."""
        return self.start(DriverProcess(args=[*(DEFAULT_ARGS if base is None else base), *args], **kwargs))

    def start(self, driver: DriverProcess, timeout_s: float = START_TIMEOUT_S) -> DriverProcess:
        """Start ``driver`` and look after it until the end."""
        self.adopt(driver)
        return driver.start(timeout_s)

    def adopt(self, driver: DriverProcess) -> DriverProcess:
        """Look after a driver the test starts (and restarts) itself."""
        if driver not in self.drivers:
            self.drivers.append(driver)
        return driver

    def __enter__(self) -> DriverSet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(failed=exc_type is not None)

    def close(self, failed: bool = False) -> None:
        """Check the error logs, report on failure, stop and remove every driver.

        ``failed``: the caller is already failing (an exception is on its way); the report is printed
        and the error logs go into it rather than into a second failure.
        """
        unexpected: list[str] = []
        for d in self.drivers:
            if d.alive:
                try:
                    unexpected += [f"{d.dir}: {e}" for e in d.unexpected_errors()]
                except (LogbufError, OSError) as e:  # a CnC that cannot be read is itself worth failing on
                    unexpected.append(f"{d.dir}: cannot read the error log: {e!r}")
        tests_failed = self._session is not None and self._session.testsfailed > self._failures_before
        reports = [d.report() for d in self.drivers] if failed or unexpected or tests_failed else []
        for d in self.drivers:
            d.stop()
        for text in reports:
            print(text)
        for d in self.drivers:
            d.remove()
        self.drivers.clear()
        if not failed:
            assert not unexpected, f"driver error logs hold unexpected errors: {unexpected}"


def system_counter_name_matches(label: str, name: str) -> bool:
    """``name`` is the system counter's whole label, or the part before Aeron's ``: <details>``."""
    return label == name or label.startswith(name + ": ")
