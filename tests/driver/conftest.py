"""Real media driver processes for system tests: started per test, hard timeouts, error log checked."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from logbuf.conduit.cnc import CncFile, wait_for_driver
from logbuf.conduit.error_log import read_error_log


@dataclass
class DriverProcess:
    dir: str
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    expected_errors: list[str] = field(default_factory=list)

    def start(self, timeout_s: float = 20.0) -> DriverProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "logbuf.driver.main", "--dir", self.dir, *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_driver(self.dir, timeout_s=timeout_s, heartbeat_timeout_ms=5_000)
        except TimeoutError:
            self.proc.kill()
            out = self.proc.communicate(timeout=5)[0].decode(errors="replace")
            raise AssertionError(f"driver did not start in {timeout_s} s; output:\n{out}") from None
        return self

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
            self.proc.communicate(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> str:
        """SIGTERM and wait; returns the driver's output."""
        if self.proc is None:
            return ""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out = self.proc.communicate(timeout=timeout_s)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out = self.proc.communicate(timeout=5)[0]
        return out.decode(errors="replace")

    def errors(self) -> list[str]:
        cnc = CncFile.open(self.dir)
        try:
            return [e.text for e in read_error_log(cnc.error_log)]
        finally:
            cnc.close()

    def stat_json(self) -> dict:  # type: ignore[type-arg]
        out = subprocess.run(
            [sys.executable, "-m", "logbuf.client.stat", "--dir", self.dir, "--once", "--json"],
            capture_output=True,
            timeout=30,
            check=True,
        ).stdout
        return json.loads(out)  # type: ignore[no-any-return]


def unique_dir() -> str:
    return f"/dev/shm/logbuf-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def driver_args() -> list[str]:
    """Override in a test module for other settings."""
    return [
        "--ipc-term-length",
        "1m",
        "--driver-timeout",
        "3s",
        "--client-liveness-timeout",
        "2s",
        "--publication-linger-timeout",
        "1s",
        "--dir-delete-on-shutdown",
        "false",
    ]


@pytest.fixture
def media_driver(driver_args: list[str], request: pytest.FixtureRequest) -> Iterator[DriverProcess]:
    """A running driver in a fresh directory; on teardown its error log must hold only expected errors."""
    d = DriverProcess(unique_dir(), driver_args).start()
    failed = False
    try:
        yield d
        if d.proc is not None and d.proc.poll() is None:
            unexpected = [e for e in d.errors() if not any(x in e for x in d.expected_errors)]
            failed = bool(unexpected)
            assert not unexpected, f"driver error log holds unexpected errors: {unexpected}"
    finally:
        out = d.stop()
        if failed or getattr(request.node, "rep_call_failed", False):
            print(f"--- driver output ({d.dir}) ---\n{out}")
        shutil.rmtree(d.dir, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        item.rep_call_failed = True  # type: ignore[attr-defined]
