"""Real Aeron beside logbuf: Aeron 1.53's C media driver and C client (``pyaeron``) and logbuf's, each
in its own process, for interop tests and benchmarks.

pyaeron needs Python >= 3.12 while logbuf runs on 3.11, so the two never share an interpreter:
:func:`pyaeron_python` finds (or makes, from PyPI, in a venv cached outside the repository:
``~/.cache/logbuf-interop`` or ``$LOGBUF_INTEROP_CACHE``) a Python with pyaeron, and :class:`Interop` starts
drivers of either kind and client peers (:data:`PEER`, the script :mod:`logbuf.testing.aeron_peer`) with
whichever Python has the library. A :class:`Peer` prints JSON lines (``ready``, ``result``, ...) that
``wait`` reads; ``go`` writes it a line. ``Interop.close()`` stops them all and removes the directories.
"""

from __future__ import annotations

import glob
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Final

from logbuf.conduit.cnc import wait_for_driver
from logbuf.errors import LogbufError

__all__ = ["CACHE", "PEER", "AeronUnavailable", "Interop", "Peer", "pyaeron_python", "unique_dir"]

PEER: Final[str] = str(Path(__file__).resolve().parent / "aeron_peer.py")
"""The peer script: ``python PEER ROLE --client {pyaeron,logbuf} --dir DIR [options]`` (see its docstring)."""
CACHE: Final[Path] = Path(os.environ.get("LOGBUF_INTEROP_CACHE", Path.home() / ".cache" / "logbuf-interop"))
TEARDOWN_GRACE_S: Final[float] = 3.0
"""How long teardown lets peers finish after their stdin closes, all together, before signalling them."""


class AeronUnavailable(LogbufError):
    """No Python with pyaeron on this machine, and none could be made; the message says why."""


def _python_candidates() -> list[str]:
    found = [shutil.which(name) for name in ("python3.13", "python3.12")]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")), reverse=True)
    found += sorted(glob.glob("/root/.pyenv/versions/3.1[2-9]*/bin/python3"), reverse=True)
    return [p for p in dict.fromkeys(found) if p]


def pyaeron_python() -> str:
    """The cached venv's python with pyaeron, made on first use from a Python >= 3.12 on the machine (needs
    PyPI then); raises :class:`AeronUnavailable` saying why when there is none."""
    for existing in sorted(CACHE.glob("venv-py3.1*/bin/python")):
        if subprocess.run([str(existing), "-c", "import pyaeron"], capture_output=True, timeout=60).returncode == 0:
            return str(existing)
    problems = []
    for base in _python_candidates():
        version = subprocess.run(
            [base, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        venv = CACHE / f"venv-py{version}"
        made = subprocess.run([base, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True, timeout=300)
        python = venv / "bin" / "python"
        if made.returncode == 0:
            installed = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "pyaeron"], capture_output=True, text=True, timeout=600
            )
            if installed.returncode == 0:
                return str(python)
            problems.append(f"{base}: pip install pyaeron failed: {installed.stderr.strip()[-300:]}")
        else:
            problems.append(f"{base}: venv failed: {made.stderr.strip()[-300:]}")
    raise AeronUnavailable(f"no Python >= 3.12 with pyaeron ({'; '.join(problems) or 'no python3.12/3.13 found'})")


def unique_dir(kind: str) -> str:
    """A fresh directory name on /dev/shm for a ``kind`` (``logbuf`` or ``aeron``) driver."""
    return f"/dev/shm/interop-{kind}-{uuid.uuid4().hex[:10]}"


class Peer:
    """A process printing JSON lines; ``go()`` writes a line to its stdin."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, name: str = "") -> None:
        self.name = name or argv[2]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr or []), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                self.stderr.append(f"(stdout) {line}")
        self.events.put({"event": "exit"})

    def wait(self, event: str, timeout_s: float = 60.0) -> dict[str, Any]:
        while True:
            try:
                got = self.events.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(
                    f"{self.name}: no {event!r} in {timeout_s} s; stderr:\n{''.join(self.stderr)}"
                ) from None
            if got["event"] == event:
                return got
            if got["event"] in ("exit", "result") and event != got["event"]:
                raise AssertionError(f"{self.name}: wanted {event!r}, got {got}; stderr:\n{''.join(self.stderr)}")

    def go(self, line: str = "") -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._release()

    def _release(self) -> None:
        for thread in self._threads:
            thread.join(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def close_stdin(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass

    def finish(self, deadline: float) -> None:
        """Wait for the process until ``deadline`` (monotonic), then SIGTERM it, then SIGKILL it."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._release()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=15)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._release()


class Interop:
    """Starts drivers (logbuf's ``mediadriver`` or Aeron's C driver) and client peers; stops them all."""

    def __init__(self, pyaeron_python: str) -> None:
        self.pyaeron_python = pyaeron_python
        self.peers: list[Peer] = []
        self.dirs: list[str] = []

    def python(self, client: str) -> str:
        return self.pyaeron_python if client == "pyaeron" else sys.executable

    def driver(
        self, kind: str, *args: str, env: dict[str, str] | None = None, directory: str | None = None
    ) -> tuple[str, Peer]:
        """Start a driver in a new directory, or in ``directory`` (a restart after a crash there)."""
        if directory is None:
            directory = unique_dir(kind)
            self.dirs.append(directory)
        if kind == "logbuf":
            argv = [sys.executable, "-m", "logbuf.driver.main", "--dir", directory, "--dir-delete-on-shutdown", "true"]
            peer = Peer(argv + list(args), env=env, name="logbuf driver")
            self.peers.append(peer)
            wait_for_driver(directory, timeout_ns=30_000_000_000, heartbeat_timeout_ns=5_000_000_000)
        else:
            peer = Peer([self.pyaeron_python, PEER, "driver", "--dir", directory, "--timeout", "600"], env, "C driver")
            self.peers.append(peer)
            peer.wait("ready", 30)
        return directory, peer

    def peer(self, role: str, client: str, directory: str, **options: Any) -> Peer:
        argv = [self.python(client), PEER, role, "--client", client, "--dir", directory]
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            argv += [flag] if value is True else [flag, str(value)]
        peer = Peer(argv, name=f"{client} {role}")
        self.peers.append(peer)
        return peer

    def close(self) -> None:
        """Teardown: every peer's stdin closed at once, then a shared grace period for them to finish;
        what is left gets SIGTERM (logbuf's driver, a daemon, only stops on a signal), then SIGKILL."""
        for peer in reversed(self.peers):
            peer.close_stdin()
        deadline = time.monotonic() + TEARDOWN_GRACE_S
        for peer in reversed(self.peers):
            peer.finish(deadline)
        for directory in self.dirs:
            shutil.rmtree(directory, ignore_errors=True)
