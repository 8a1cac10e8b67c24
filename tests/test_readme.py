"""README.md's commands and standalone example work as written; CI runs the README's test command."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.S | re.M)


def test_readme_has_the_two_setup_commands_and_ci_runs_the_test_command() -> None:
    commands = [block.strip() for block in code_blocks("")]
    assert len(commands) >= 2
    main_job, tests = commands[0], commands[1]
    assert main_job.startswith("pip install") and "client.demo" in main_job
    assert tests.startswith("pip install") and "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "set -euo pipefail" in ci
    assert tests in ci.splitlines(), f".ci/run does not run the README's test command {tests!r}"


def test_readme_standalone_example_runs() -> None:
    example = code_blocks("python")[0]
    assert "StreamLog.create" in example
    proc = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    # hello and a reassembled/unfragmented; b consumed by the controlled poll; then c, world and
    # the 3 fragments of the 4000-byte message in one block.
    assert proc.stdout.splitlines() == ["b'hello' 5 0 64", "b'a' 1 0 128", "5 frames"]
