"""The logbuf wheel, built once per test run from a clean copy of the worktree.

Building it compiles the native core in an isolated build environment (minutes on a loaded machine), and two
test files need it: the packaging tests and the Spark cluster test that ships a packed environment. Under
pytest-xdist those files may run on different workers, so the wheel is built under the run's base temporary
directory (the parent of each worker's own), by whichever worker asks first, while the others wait on a file
lock and then reuse it. Run without xdist, it lives in the session's own base directory.
"""

from __future__ import annotations

import csv
import fcntl
import io
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 900  # builds the native core, in an isolated build environment
_IGNORED = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".mypy_cache", ".hypothesis", ".venv", "*.so"
)


class Wheel:
    """A built wheel: its path, the build's output, and the files of its ``.dist-info``."""

    def __init__(self, path: pathlib.Path, build_output: str) -> None:
        self.path = path
        self.build_output = build_output
        with zipfile.ZipFile(path) as z:
            self.names = z.namelist()
            self.dist_info = next(n.split("/")[0] for n in self.names if n.split("/")[0].endswith(".dist-info"))
            self.files = {n: z.read(n).decode() for n in self.names if n.startswith(self.dist_info + "/")}

    def metadata(self, name: str) -> str | None:
        return self.files.get(f"{self.dist_info}/{name}")

    def record(self) -> list[str]:
        text = self.metadata("RECORD")
        assert text is not None, "the wheel has no RECORD"
        return [row[0] for row in csv.reader(io.StringIO(text)) if row]


def shared_wheel(session_base: pathlib.Path) -> Wheel:
    """The run's wheel, built on first use. ``session_base`` is ``tmp_path_factory.getbasetemp()``."""
    run_base = session_base.parent if os.environ.get("PYTEST_XDIST_WORKER") else session_base
    cache = run_base / "logbuf-wheel"
    cache.mkdir(exist_ok=True)
    with open(cache / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the build fails
        built = sorted((cache / "wheels").glob("logbuf-*.whl"))
        if not built:
            return _build(cache)
        return Wheel(built[0], (cache / "build-output.txt").read_text())


def _build(cache: pathlib.Path) -> Wheel:
    """A wheel built from a clean copy of the worktree (no earlier build products in it)."""
    source = cache / "src"
    shutil.rmtree(source, ignore_errors=True)  # a build that failed earlier in this run
    shutil.copytree(ROOT, source, ignore=_IGNORED)
    out = cache / "wheels-building"
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5_000:]
    [path] = out.glob("logbuf-*.whl")
    (cache / "build-output.txt").write_text(output)
    out.rename(cache / "wheels")  # only a finished build is ever found by the next worker
    return Wheel(cache / "wheels" / path.name, output)
