"""The relay rides out what the driver side does to it: a pause longer than the driver
timeout, an external driver killed and restarted, a restart after SIGKILL on the same driver directory,
and two relays on one driver that would publish into one stream.

Real things only: ``logbuf-jetstream`` processes, real media driver processes, real websocket clients and
a stand-in upstream jetstream (a real ``websockets`` server)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from logbuf.conduit.cnc import is_process_alive
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess
from tests.jetstream._ingest_support import (
    DRIVER_ARGS,
    ROOT,
    RelayProcess,
    UpstreamStandIn,
    make_events,
    read_events,
    time_us_of,
    unique_driver_dir,
)


class Follower:
    """A websocket client on a thread that keeps every event it gets and notes how its connection ended."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.events: list[bytes] = []
        self.closed: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed

        async with connect(self.url, compression=None, max_size=None, max_queue=None, ping_interval=None) as ws:
            try:
                while not self._stop.is_set():
                    try:
                        message = await asyncio.wait_for(ws.recv(), 0.2)
                    except TimeoutError:
                        continue
                    self.events.append(message.encode() if isinstance(message, str) else message)
            except ConnectionClosed as e:
                self.closed = repr(e)

    def wait_for(self, count: int, timeout_s: float = 30.0) -> None:
        wait_until(lambda: len(self.events) >= count or self.closed is not None, timeout_s, f"{count} events")
        assert self.closed is None, f"the relay closed the connection: {self.closed}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def events_named(relay: RelayProcess, name: str) -> list[dict[str, Any]]:
    return [e for e in relay.log if e.get("event") == name]


def test_a_relay_paused_past_the_driver_timeout_reconnects_and_loses_no_event() -> None:
    """SIGSTOP for twice the driver timeout (a 12 s pause, scaled down): the driver times the relay's
    client out and the client sees the driver's heartbeat stale. The relay reconnects, its clients stay
    connected, and following an upstream, a client gets every upstream event exactly once.

    Under load this lost events: the new ingest resumed above the newest event the old one had
    *published*, so the events still unread in the lost session's log (often a hundred) never came. It
    now resumes above the newest event the server *holds*. (The 1011 in the failures' captured log was
    the old ingest leaving the stand-in upstream; it now says 1001.)"""
    events = make_events(3000)
    upstream = UpstreamStandIn(events, rate=500).start()
    relay = RelayProcess(
        ["--driver-dir", unique_driver_dir(), "--port", "0", "--upstream", upstream.url, "--driver-timeout", "2s"]
    )
    try:
        port = relay.port()
        follower = Follower(f"ws://127.0.0.1:{port}/subscribe?cursor=1")
        try:
            follower.wait_for(300)
            relay.proc.send_signal(signal.SIGSTOP)
            time.sleep(4.0)  # the pause itself (not a wait for something)
            relay.proc.send_signal(signal.SIGCONT)
            relay.wait_for_log("jetstream.driver_reconnected", 20)
            follower.wait_for(len(events), 40)
            time.sleep(0.3)  # nothing more may come: every event once
        finally:
            follower.stop()
        assert follower.events == events  # byte for byte, in order, none lost or repeated
        lost = events_named(relay, "jetstream.driver_lost")
        # at least the pause's; at a load average of 20 a 2 s liveness timeout can lapse once more
        assert lost and all(entry["level"] == "warning" for entry in lost)
        reconnected = relay.wait_for_log("jetstream.driver_reconnected")
        stopped = events_named(relay, "ingest.stopped")[0]  # the first session's ingest
        assert reconnected["floor_us"] <= stopped["last_time_us"]  # not above what it published
        wait_until(lambda: len(upstream.close_codes) >= 1, 10, "the first upstream connection to end")
        assert upstream.close_codes[0] == 1001  # the first session's ingest left its upstream "going away"
        assert relay.stop() == 0, "\n".join(relay.lines)
    finally:
        relay.kill()
        upstream.kill()


def test_an_external_driver_killed_and_restarted_is_reconnected() -> None:
    directory = unique_driver_dir()
    driver = DriverProcess(directory, DRIVER_ARGS).start()
    relay: RelayProcess | None = None
    try:
        relay = RelayProcess(
            [
                "--driver",
                "external",
                "--driver-dir",
                directory,
                "--port",
                "0",
                "--rate",
                "300",
                "--driver-timeout",
                "2s",
            ]
        )
        port = relay.port()
        follower = Follower(f"ws://127.0.0.1:{port}/subscribe")
        try:
            follower.wait_for(100)
            driver.kill()  # SIGKILL: its CnC stays behind with a dead pid
            relay.wait_for_log("jetstream.driver_lost", 20)
            before = len(follower.events)
            driver = DriverProcess(directory, DRIVER_ARGS).start()  # takes the directory over at once
            relay.wait_for_log("jetstream.driver_reconnected", 30)
            follower.wait_for(before + 100)
        finally:
            follower.stop()
        times = [time_us_of(e) for e in follower.events]
        assert all(a < b for a, b in zip(times, times[1:]))  # one connection throughout, never repeated
        assert relay.stop() == 0, "\n".join(relay.lines)
    finally:
        if relay is not None:
            relay.kill()
        driver.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_relay_restarted_after_sigkill_takes_its_driver_directory_over_at_once() -> None:
    """The embedded driver died with the relay; its CnC's heartbeat is fresh for another driver timeout,
    but its pid is gone: the next relay on the same --driver-dir starts its driver there at once (before:
    "an active media driver is already running", or it connected to the dead driver and exited).

    The first relay is killed once its driver runs (it listens before its driver starts: killed then, it
    can leave a half-written CnC, which is taken over at once too, see test_cnc)."""
    directory = unique_driver_dir()
    first = RelayProcess(["--driver-dir", directory, "--port", "0", "--rate", "200"])
    second: RelayProcess | None = None
    try:
        first.wait_for_log("jetstream.started")
        first.proc.kill()
        first.proc.wait(10)
        second = RelayProcess(["--driver-dir", directory, "--port", "0", "--rate", "200"])
        port = second.port()
        got = asyncio.run(read_events(f"ws://127.0.0.1:{port}/subscribe", until_time_us=0, count=20))
        assert len(got) == 20
        assert events_named(second, "driver.stale_directory_taken_over")
        assert events_named(second, "jetstream.driver_embedded")
        assert second.stop() == 0, "\n".join(second.lines)
    finally:
        first.kill()
        if second is not None:
            second.kill()
        shutil.rmtree(directory, ignore_errors=True)


def run_relay(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logbuf.jetstream.main", "--metrics-port", "0", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_two_relays_on_one_driver_cannot_publish_one_stream() -> None:
    directory = unique_driver_dir()
    driver = DriverProcess(directory, DRIVER_ARGS).start()
    relays: list[RelayProcess] = []
    common = ["--driver", "external", "--driver-dir", directory]
    try:
        first = RelayProcess(["--role", "ingest", "--stream-id", "1201", "--rate", "500", *common])
        relays.append(first)
        first.wait_for_log("jetstream.started")
        refused = run_relay("--port", "0", "--stream-id", "1201", *common)
        assert refused.returncode == 2
        assert "another relay already publishes stream 1201 on aeron:ipc" in refused.stderr
        assert f"pid={first.proc.pid}" in refused.stderr  # names the holder
        # serving that stream is fine (no lock), and so is publishing another stream
        server = RelayProcess(["--role", "serve", "--port", "0", "--stream-id", "1201", *common])
        relays.append(server)
        got = asyncio.run(read_events(f"ws://127.0.0.1:{server.port()}/subscribe", until_time_us=0, count=50))
        assert len(got) == 50
        other = RelayProcess(["--port", "0", "--stream-id", "1202", "--rate", "500", *common])
        relays.append(other)
        other.wait_for_log("jetstream.started")
        # the holder killed: its lock went with it, the stream can be taken at once
        first.proc.kill()
        first.proc.wait(10)
        again = RelayProcess(["--role", "ingest", "--stream-id", "1201", "--rate", "500", *common])
        relays.append(again)
        again.wait_for_log("jetstream.started")
        for relay in (server, other, again):
            assert relay.stop() == 0, "\n".join(relay.lines)
    finally:
        for relay in relays:
            relay.kill()
        driver.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_is_process_alive_sees_exited_and_zombie_processes() -> None:
    assert is_process_alive(os.getpid())
    assert is_process_alive(0)  # unknown: the heartbeat decides
    child = subprocess.Popen([sys.executable, "-c", "pass"])

    def zombie() -> bool:
        with open(f"/proc/{child.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"

    wait_until(zombie, 10, "the child to exit")
    assert not is_process_alive(child.pid)  # exited, not yet reaped
    child.wait(5)
    assert not is_process_alive(child.pid)  # gone


def test_stream_lock_file_names_the_holder(tmp_path: Any) -> None:
    from logbuf.jetstream.stream_lock import StreamLock, StreamTakenError

    lock = StreamLock(str(tmp_path), "aeron:ipc", 7, "role=all listening on 127.0.0.1:6008")
    assert lock.still_held()
    with pytest.raises(StreamTakenError, match=r"stream 7 on aeron:ipc .*pid=\d+ role=all listening"):
        StreamLock(str(tmp_path), "aeron:ipc", 7, "another")
    StreamLock(str(tmp_path), "aeron:ipc", 8, "another").release()  # another stream: its own lock
    os.unlink(lock.path)
    assert not lock.still_held()  # its directory was replaced: take it again
    lock.release()
