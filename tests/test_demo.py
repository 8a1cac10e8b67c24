"""The main job (`python -m logbuf.client.demo`): a real driver, publisher and subscriber, and logbuf-stat's view."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from logbuf.client import demo
from logbuf.client.stat import StatReader
from logbuf.errors import LogbufError
from logbuf.testing import wait_until

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("mode", [[], ["--batch", "16"]], ids=["offer", "offer_batch"])
def test_demo_delivers_every_message_in_order_shows_the_stream_and_cleans_up(mode: list[str]) -> None:
    directory = f"/dev/shm/logbuf-test-demo-{uuid.uuid4().hex[:12]}"
    proc = subprocess.run(
        [sys.executable, "-m", "logbuf.client.demo", "--seconds", "2", "--dir", directory, *mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["published"] > 0
    assert summary["received"] == summary["published"]
    assert summary["lost"] == 0 and summary["out_of_order"] == 0
    # logbuf-stat's view (not a TTY: rendered once) shows the demo's stream and its subscriber
    assert "streams" in proc.stdout and "aeron:ipc" in proc.stdout and "1001" in proc.stdout
    assert '"event": "demo.started"' in output and '"event": "demo.finished"' in output
    assert not os.path.exists(os.path.join(directory, "cnc.dat")), "the driver did not clean up"


def test_demo_rejects_bad_arguments_before_starting_anything() -> None:
    for argv in (["--size", "4"], ["--batch", "0"]):
        with pytest.raises(SystemExit) as exc:
            demo.main(argv)
        assert exc.value.code == 2


def publishing(directory: str) -> bool:
    """The demo's publisher has written into its stream (read from the driver's counters, as logbuf-stat does)."""
    try:
        with StatReader(directory) as reader:
            return any(s.stream_id == demo.STREAM_ID and s.publisher_position > 0 for s in reader.sample().streams)
    except LogbufError:  # no CnC yet
        return False


def test_ctrl_c_stops_everything_in_order_without_a_traceback_and_reports() -> None:
    directory = f"/dev/shm/logbuf-test-demo-{uuid.uuid4().hex[:12]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "logbuf.client.demo", "--seconds", "120", "--dir", directory],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        start_new_session=True,  # its own process group, as a terminal's foreground job is
    )
    try:
        wait_until(lambda: publishing(directory) or proc.poll() is not None, 60, "the demo to publish", max_idle_s=0.1)
        assert proc.poll() is None, proc.communicate()[0]
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: every process of the group gets it
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
    assert proc.returncode == 0, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    summary = json.loads(output.strip().splitlines()[-1])
    assert summary["interrupted"] is True and summary["published"] > 0
    assert summary["received"] == summary["published"] and summary["lost"] == 0
    assert '"event": "demo.interrupted"' in output
    assert not os.path.exists(os.path.join(directory, "cnc.dat")), "the driver did not shut down cleanly"


def test_the_summary_says_what_its_rates_count() -> None:
    """Payload and log rates apart: the live view's bytes/s counts frames with their headers."""
    directory = f"/dev/shm/logbuf-test-demo-{uuid.uuid4().hex[:12]}"
    proc = subprocess.run(
        [sys.executable, "-m", "logbuf.client.demo", "--seconds", "2", "--size", "32", "--dir", directory],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["interrupted"] is False and summary["seconds"] > 0
    # a 32-byte message is a 64-byte frame (32-byte header): the log moves twice the payload
    assert summary["log_mb_per_s"] == pytest.approx(2 * summary["payload_mb_per_s"], rel=0.01)
    view = " ".join(proc.stdout.split())  # the live view wraps at the console's width
    assert "count log bytes: frames with their 32-byte headers" in view  # its legend


def test_the_clock_starts_when_the_publisher_is_connected() -> None:
    """A run shorter than the publisher's start-up still publishes: ``--seconds`` counts from the connection
    (the clock once started at spawn, and on a loaded machine a 2 s run published nothing)."""
    directory = f"/dev/shm/logbuf-test-demo-{uuid.uuid4().hex[:12]}"
    proc = subprocess.run(
        [sys.executable, "-m", "logbuf.client.demo", "--seconds", "0.05", "--dir", directory],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["published"] > 0 and summary["received"] == summary["published"]
