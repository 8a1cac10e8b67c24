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
    assert len(example.strip().splitlines()) <= 12  # the README's example stays short; the docs have the rest
    proc = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    # the position after a 5-byte message: one 32-byte header plus the payload, aligned to 32 bytes
    assert proc.stdout.splitlines() == ["64", "b'hello' 64"]


def test_readme_fits_a_screen_and_links_every_page_it_names() -> None:
    assert len(README.splitlines()) <= 90, "the README is the front page: the rest belongs in docs/"
    for target in re.findall(r"\]\(([^)#]+)", README):
        assert (ROOT / target).exists(), f"README links {target}, which does not exist"


def test_readme_names_the_prerequisites_and_a_venv_before_the_commands() -> None:
    before_commands = " ".join(setup_section().split("```", 1)[0].split())
    for needed in ("Python 3.11 or newer", "C compiler", "Java 17", "python3 -m venv .venv && . .venv/bin/activate"):
        assert needed in before_commands, needed
