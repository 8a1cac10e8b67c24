"""A frame length no publisher can write stops every poll with a clear error, never a crash or a wedge.

Anything that can map a log can write into it. The child process (``_corrupt_frame_children``) plays that
buggy client against every poll flavour (poll, controlled poll, block poll, poll_batch, the bare
``term_read`` and the three topic-filtered polls) with every impossible length: 1..31, negatives that are
no claim, INT_MIN, past the end of the term, short and huge PAD frames. It runs in a child so that a crash (a frame length of 1..31 once
handed the handler a memoryview of length -24, and ``bytes()`` of it segfaulted) fails this test with the
case named instead of killing pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.logbuffer import _corrupt_frame_children as children

TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def outcomes() -> dict[tuple[str, str], dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.logbuffer._corrupt_frame_children"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    last = lines[-1] if lines else {}
    assert done.returncode == 0 and last.get("done"), (
        f"the child died (rc {done.returncode}) at {last}: {done.stderr[-3000:]}"
    )
    return {(line["flavour"], line["case"]): line for line in lines if "starting" not in line and "done" not in line}


CORRUPT = [(flavour, case) for flavour in children.FLAVOURS for case in children.CASES]


@pytest.mark.parametrize(("flavour", "case"), CORRUPT)
def test_a_poll_delivers_what_precedes_an_impossible_frame_then_stops_there_with_an_error_naming_it(
    outcomes: dict[tuple[str, str], dict[str, Any]], flavour: str, case: str
) -> None:
    got = outcomes[flavour, case]
    assert "exception" not in got, got["exception"]
    assert got["delivered"] == ["first", "second"]  # nothing of the bad frame, no view of negative length
    assert got["position_after_first_poll"] == got["bad_position"] == got["position"]  # never past it
    first, second = got["errors"]
    assert first is not None and second is not None, f"{flavour} returned instead of raising: {got}"
    assert first == second
    assert first["frame_length"] == got["frame_length"] and first["position"] == got["bad_position"]
    message = first["message"]
    assert f"frame_length={got['frame_length']}" in message and f"position={got['bad_position']}" in message
    assert f"session_id={children.SESSION_ID}" in message and f"stream_id={children.STREAM_ID}" in message
    if flavour != "term_read":  # the bare term algorithm has no image to count in
        assert got["corrupt_frame_count"] == 1  # once per position, however often it is polled


@pytest.mark.parametrize(("flavour", "case"), [(f, c) for f in children.FLAVOURS for c in children.NOT_CORRUPT])
def test_a_claim_being_written_is_not_taken_for_corruption(
    outcomes: dict[tuple[str, str], dict[str, Any]], flavour: str, case: str
) -> None:
    got = outcomes[flavour, case]
    assert "exception" not in got, got["exception"]
    assert got["delivered"] == ["first", "second"]
    assert got["errors"] == [None, None]
    assert got["position"] == got["bad_position"] and got["corrupt_frame_count"] == 0
