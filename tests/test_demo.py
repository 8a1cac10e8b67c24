"""The main job (`python -m logbuf.client.demo`): a real driver, publisher and subscriber, and logbuf-stat's view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from logbuf.client import demo

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
