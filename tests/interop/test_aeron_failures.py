"""logbuf's driver and Aeron's C driver across a crash (kill -9) of either one, in both directions.

The crashed driver's clients are killed with it, as in a machine or container failure. The other side
must notice through its own timeout (the receiver's image liveness, the sender's connection timeout),
and a driver restarted in the same directory must give a new image that delivers every message from
its join position on: no gap, no duplicate, content checked. Waits are generous bounds, not timings.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from logbuf.testing.host import free_udp_port
from tests.interop.conftest import Interop, Peer
from tests.interop.test_aeron_interop import logbuf_args

CLIENT = {"logbuf": "logbuf", "aeron": "pyaeron"}
"""Each driver's own client library: the C client on the C driver, logbuf's client on logbuf's."""
IMAGE_LIVENESS_S = 10.0
CONNECTION_TIMEOUT_S = 5.0
"""Both drivers' defaults, set explicitly so the bounds below follow them."""
FLOWING = 200
"""Messages a session delivers before the test calls it flowing."""
DIRECTIONS = [("logbuf", "aeron"), ("aeron", "logbuf")]


def start(interop: Interop, kind: str, directory: str | None = None) -> tuple[str, Peer]:
    """A driver (in ``directory`` to restart one there). logbuf's takes over a directory whose
    heartbeat is 2 s stale, so a restart after the other side noticed the crash succeeds."""
    if kind == "logbuf":
        args = [
            *logbuf_args(False),
            "--driver-timeout",
            "2s",
            "--image-liveness-timeout",
            f"{IMAGE_LIVENESS_S:g}s",
            "--publication-connection-timeout",
            f"{CONNECTION_TIMEOUT_S:g}s",
        ]
        return interop.driver("logbuf", *args, directory=directory)
    env = {
        "AERON_IMAGE_LIVENESS_TIMEOUT": f"{IMAGE_LIVENESS_S:g}s",
        "AERON_PUBLICATION_CONNECTION_TIMEOUT": f"{CONNECTION_TIMEOUT_S:g}s",
    }
    return interop.driver("aeron", env=env, directory=directory)


def watch(interop: Interop, kind: str, directory: str, channel: str) -> Peer:
    watcher = interop.peer("watch", CLIENT[kind], directory, channel=channel, count=FLOWING, timeout=300)
    watcher.wait("ready")
    return watcher


def publish(interop: Interop, kind: str, directory: str, channel: str) -> Peer:
    """A publisher streaming a message every millisecond until told to stop."""
    return interop.peer("publish", CLIENT[kind], directory, channel=channel, until_stdin=True, pace_ms=1, timeout=300)


def finish(publisher: Peer, watcher: Peer, session_id: int) -> tuple[int, dict[str, Any]]:
    """Stop the publisher; once the watcher has every message it sent, the watcher's session record."""
    publisher.go()
    sent = int(publisher.wait("sent", 60)["count"])
    watcher.go(json.dumps({"session_id": session_id, "until": sent}))
    result = watcher.wait("result", 120)
    assert result["ok"], f"the watcher did not see seq {sent - 1} of session {session_id}: {result}"
    return sent, result["sessions"]


def assert_no_gap(session: dict[str, Any], first: int, last: int) -> None:
    assert session["errors"] == [], session["errors"]
    assert session["gaps"] == 0 and session["duplicates"] == 0
    assert session["first"] == first and session["next"] == last + 1
    assert session["count"] == last + 1 - first


@pytest.mark.parametrize(("sender", "receiver"), DIRECTIONS, ids=[f"{s}-to-{r}" for s, r in DIRECTIONS])
def test_a_killed_sending_driver_ends_the_image_and_its_restart_gives_a_new_image_with_no_gap(
    interop: Interop, sender: str, receiver: str
) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    receiver_dir, _ = start(interop, receiver)
    watcher = watch(interop, receiver, receiver_dir, channel)
    sender_dir, sender_driver = start(interop, sender)
    publisher = publish(interop, sender, sender_dir, channel)
    before = watcher.wait("flowing", 60)
    assert before["first"] == 0

    sender_driver.kill()
    publisher.kill()
    gone = watcher.wait("unavailable", IMAGE_LIVENESS_S + 60)  # the receiver's image liveness timeout
    assert gone["session_id"] == before["session_id"]

    sender_dir, _ = start(interop, sender, directory=sender_dir)
    publisher = publish(interop, sender, sender_dir, channel)
    after = watcher.wait("flowing", 60)
    assert after["session_id"] != before["session_id"], "the restarted driver's publication reused the session"
    sent, sessions = finish(publisher, watcher, after["session_id"])
    assert_no_gap(sessions[str(after["session_id"])], 0, sent - 1)
    crashed = sessions[str(before["session_id"])]
    assert_no_gap(crashed, 0, crashed["next"] - 1)  # up to the crash, every message once and in order


@pytest.mark.parametrize(("sender", "receiver"), DIRECTIONS, ids=[f"{s}-to-{r}" for s, r in DIRECTIONS])
def test_a_killed_receiving_driver_is_noticed_by_the_sender_and_its_restart_joins_with_no_gap(
    interop: Interop, sender: str, receiver: str
) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    receiver_dir, receiver_driver = start(interop, receiver)
    watcher = watch(interop, receiver, receiver_dir, channel)
    sender_dir, _ = start(interop, sender)
    publisher = publish(interop, sender, sender_dir, channel)
    session_id = publisher.wait("ready")["session_id"]
    assert watcher.wait("flowing", 60)["session_id"] == session_id

    receiver_driver.kill()
    watcher.kill()
    lost = publisher.wait("disconnected", CONNECTION_TIMEOUT_S + 60)  # the sender's connection timeout

    receiver_dir, _ = start(interop, receiver, directory=receiver_dir)
    watcher = watch(interop, receiver, receiver_dir, channel)
    joined = watcher.wait("flowing", 60)
    assert joined["session_id"] == session_id
    resumed = publisher.wait("reconnected", 60)
    assert resumed["seq"] >= lost["seq"]
    sent, sessions = finish(publisher, watcher, session_id)
    assert joined["first"] <= resumed["seq"], "the new image joined after messages offered once it connected"
    assert_no_gap(sessions[str(session_id)], joined["first"], sent - 1)
