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


def setup_section() -> str:
    return README.split("## Set up a fresh machine", 1)[1].split("\n## ", 1)[0]


def test_readme_has_the_two_setup_commands_and_ci_runs_the_test_command() -> None:
    commands = [block.strip() for block in re.findall(r"^```\n(.*?)^```", setup_section(), re.S | re.M)]
    assert len(commands) == 2, "the set-up section has exactly two commands: the main job and the tests"
    assert len(re.findall(r"^```", setup_section(), re.M)) == 4  # and no other code block
    main_job, tests = commands
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


def test_readme_names_the_prerequisites_and_a_venv_before_the_commands() -> None:
    before_commands = " ".join(setup_section().split("```", 1)[0].split())
    for needed in ("Python 3.11 or newer", "C compiler", "Java 17", "python3 -m venv .venv && . .venv/bin/activate"):
        assert needed in before_commands, needed
