"""The driver's settings as a newcomer meets them: ``mediadriver --help`` shows each default once, as one
would type it (``10s``, ``64m``), and those texts parse back to the defaults."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import Field, fields
from typing import Any

import pytest

from logbuf.driver.context import DriverContext, flag_name, format_default
from logbuf.errors import ConfigurationError


@pytest.fixture(scope="module")
def help_text() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "logbuf.driver.main", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def option_help(help_text: str) -> dict[str, str]:
    """Each option's help, joined onto one line, by flag."""
    options = help_text.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    entries = re.split(r"\n(?=  --)", options)
    return {entry.split()[0]: " ".join(entry.split()) for entry in entries if entry.lstrip().startswith("--")}


def test_help_shows_durations_and_sizes_with_units(help_text: str) -> None:
    by_flag = option_help(help_text)
    assert "(default: 10s)" in by_flag["--driver-timeout"]
    assert "(default: 100ms)" in by_flag["--timer-interval"]
    assert "(default: 100us)" in by_flag["--nak-delay"]
    assert "(default: 64m)" in by_flag["--ipc-term-length"]
    assert "(default: 128k)" in by_flag["--initial-window-length"]
    assert "(default: true)" in by_flag["--dir-delete-on-shutdown"]
    assert "--driver-timeout DURATION" in by_flag["--driver-timeout"]
    assert not re.search(r"\d{7,}", help_text), "a raw nanosecond or byte count in --help"
    assert "Durations take a unit: ns, us, ms or s" in " ".join(help_text.split())


def test_help_gives_every_setting_one_default(help_text: str) -> None:
    by_flag = option_help(help_text)
    flags = {flag_name(f) for f in fields(DriverContext) if "kind" in f.metadata}
    assert flags <= set(by_flag)
    for flag in flags:
        assert by_flag[flag].lower().count("default") == 1, by_flag[flag]
    assert "(default: /dev/shm/logbuf-<user>)" in by_flag["--dir"]


@pytest.mark.parametrize(
    "setting",
    [f for f in fields(DriverContext) if "kind" in f.metadata and not f.metadata["default_text"]],
    ids=lambda f: f.name,
)
def test_each_default_shown_parses_back_to_the_default(setting: Field[Any]) -> None:
    text = format_default(setting.metadata["kind"], setting.default)
    assert DriverContext._parse(setting.name, setting.metadata["kind"], text, source="--help") == setting.default


@pytest.mark.parametrize(
    ("kind", "value", "text"),
    [
        ("duration", 10_000_000_000, "10s"),
        ("duration", 1_500_000_000, "1500ms"),
        ("duration", 100_000, "100us"),
        ("duration", 7, "7ns"),
        ("size", 64 * 1024**2, "64m"),
        ("size", 1024**3, "1g"),
        ("size", 1408, "1408"),
        ("bool", False, "false"),
    ],
)
def test_defaults_are_written_in_the_largest_exact_unit(kind: str, value: int, text: str) -> None:
    assert format_default(kind, value) == text


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--max-images-per-endpoint", "0"], "max_images_per_endpoint=0 must be at least 1"),
        (["--max-image-term-length", "3m"], "max_image_term_length: term_length=3145728 is not a power of 2"),
        (["--max-image-term-length", "2g"], "max_image_term_length: term_length=2147483648 is greater than"),
        (
            ["--initial-window-length", "4m", "--socket-buffer-length", "2m"],
            "initial_window_length=4194304 must be at most socket_buffer_length=2097152",
        ),
    ],
)
def test_the_caps_on_what_the_network_may_allocate_are_validated(argv: list[str], problem: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        DriverContext.from_sources(["--dir", "/dev/shm/logbuf-never-made", *argv], env={}).conclude()
