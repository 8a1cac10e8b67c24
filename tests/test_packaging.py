"""The wheel installs one import package, ``logbuf``: everything importable lives under ``logbuf/``, the
console scripts point into it, and the build warns about no package it left out. Repaired by auditwheel into
a manylinux wheel, it installs into a fresh virtual environment with ``--only-binary :all:`` (no compiler, no
source build of anything) and runs the demo from there: a driver, a publisher, a subscriber and logbuf-stat."""

from __future__ import annotations

import configparser
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.wheel import ROOT, Wheel

SCRIPTS = {
    "mediadriver": "logbuf.driver.main:main",
    "logbuf-stat": "logbuf.client.stat:main",
    "logbuf-demo": "logbuf.client.demo:main",
    "logbuf-archive": "logbuf.archive.main:main",
    "logbuf-jetstream": "logbuf.jetstream.main:main",
    "logbuf-gateway": "logbuf.client.fastpuss:main",
}
# What setuptools prints when a folder inside a package (data, say) is not in its `packages` list.
LEFT_OUT = re.compile(r"Package '[^']+' is absent|Package would be ignored|absent from setuptools' `packages`")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(logbuf_wheel: Wheel) -> Wheel:
    """The run's wheel (tests/support/wheel.py: built once, shared with the Spark cluster test)."""
    return logbuf_wheel


SPARK_PLUGIN_MODULE = "pyspark_logbuf"


def test_everything_importable_is_under_logbuf(wheel: Wheel) -> None:
    # One import package. Beside it, one plain module: Spark's plugin hook, which Spark finds only as a
    # top-level module named pyspark_* (see pyspark_logbuf.py); it holds nothing but that hook.
    top_level = wheel.metadata("top_level.txt")
    if top_level is not None:
        assert sorted(top_level.split()) == ["logbuf", SPARK_PLUGIN_MODULE]
    outside = [p for p in wheel.record() if not (p.startswith("logbuf/") or p.startswith(wheel.dist_info + "/"))]
    assert outside == [SPARK_PLUGIN_MODULE + ".py"]
    record = set(wheel.record())
    for expected in (
        "logbuf/__init__.py",
        "logbuf/py.typed",
        "logbuf/driver/main.py",
        "logbuf/client/demo.py",
        "logbuf/archive/catalog.py",
        "logbuf/archive/control_schema.xml",  # read by the control protocol tests from the installed package
        "logbuf/jetstream/main.py",
        "logbuf/jetstream/data/jetstream-zstd.dict",
        "logbuf/testing/wait.py",  # the public test kit
    ):
        assert expected in record, expected
    assert any(re.fullmatch(r"logbuf/.+\.cpython-.+\.so", p) for p in record), "no compiled native core"


def test_console_scripts_point_into_logbuf(wheel: Wheel) -> None:
    text = wheel.metadata("entry_points.txt")
    assert text is not None, "the wheel has no entry_points.txt"
    entry_points = configparser.ConfigParser()
    entry_points.read_string(text)
    assert dict(entry_points["console_scripts"]) == SCRIPTS


def test_the_build_leaves_out_no_package(wheel: Wheel) -> None:
    assert "running build_py" in wheel.build_output  # the build's own output was captured
    assert LEFT_OUT.findall(wheel.build_output) == []


def test_the_warning_pattern_matches_what_setuptools_prints() -> None:
    printed = [  # setuptools' _IncludePackageDataAbuse warning, summary and details
        "Package 'logbuf.jetstream.data' is absent from the `packages` configuration.",
        "# Package would be ignored #",
        "but it is absent from setuptools' `packages` configuration.",
    ]
    assert all(LEFT_OUT.search(line) for line in printed)
    assert not LEFT_OUT.search("adding 'logbuf/jetstream/data/jetstream-zstd.dict'")


@pytest.fixture(scope="module")
def repaired_wheel(wheel: Wheel, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The wheel as released: ``auditwheel repair`` checks it against the manylinux policies and tags it."""
    out = tmp_path_factory.mktemp("wheelhouse")
    done = subprocess.run(
        [sys.executable, "-m", "auditwheel", "repair", "-w", str(out), str(wheel.path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [path] = out.glob("logbuf-*.whl")
    return path


def test_the_repaired_wheel_is_manylinux(repaired_wheel: pathlib.Path) -> None:
    tags = repaired_wheel.name.removesuffix(".whl").split("-")[-1].split(".")
    assert tags and all(
        re.fullmatch(r"manylinux_\d+_\d+_(x86_64|aarch64)|manylinux\d+_(x86_64|aarch64)", t) for t in tags
    )


def test_the_core_install_pulls_only_what_the_transport_needs(wheel: Wheel) -> None:
    metadata = wheel.metadata("METADATA")
    assert metadata is not None
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    core = sorted(re.split(r"[<>=;\[ ]", r, maxsplit=1)[0].lower() for r in requires if "extra ==" not in r)
    assert core == ["numpy", "posix-ipc", "structlog"] or core == ["numpy", "posix_ipc", "structlog"], core
    extras = {r.split("extra ==")[1].strip().strip("'\"") for r in requires if "extra ==" in r}
    assert {"tools", "jetstream", "test"} <= extras


def test_the_wheel_installs_without_a_compiler_and_runs_the_demo(
    repaired_wheel: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    # Binary wheels only, for logbuf and every dependency: nothing may need a compiler or the Python headers.
    done = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--only-binary", ":all:", f"{repaired_wheel}[tools]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    elsewhere = tmp_path_factory.mktemp("cwd")  # not the repository: nothing may be imported from the source tree
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOGBUF_DIR")}
    env["LOGBUF_IPC_TERM_LENGTH"] = "1m"
    where = subprocess.run(
        [python, "-c", "import logbuf.native.reader as r, logbuf.driver._udp as u; print(r.__file__, u.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=elsewhere,
        env=env,
    )
    assert where.returncode == 0 and str(venv) in where.stdout and str(ROOT) not in where.stdout, where
    relay = subprocess.run(  # the relay's extra is not installed: its import says which extra to install
        [python, "-c", "import logbuf.jetstream"], capture_output=True, text=True, timeout=60, cwd=elsewhere, env=env
    )
    assert relay.returncode != 0 and "logbuf[jetstream]" in relay.stderr, relay.stderr
    for script in ("mediadriver", "logbuf-stat", "logbuf-archive"):
        helped = subprocess.run([str(venv / "bin" / script), "--help"], capture_output=True, timeout=60, env=env)
        assert helped.returncode == 0, (script, helped.stderr)
    directory = f"/dev/shm/logbuf-wheel-smoke-{os.getpid()}"
    demo = subprocess.run(
        [str(venv / "bin" / "logbuf-demo"), "--seconds", "1", "--dir", directory],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=elsewhere,
        env=env,
    )
    shutil.rmtree(directory, ignore_errors=True)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    summary = json.loads(demo.stdout.strip().splitlines()[-1])
    assert summary["published"] > 0 and summary["received"] == summary["published"]
    assert "aeron:ipc" in demo.stdout  # logbuf-stat's view of the stream
