"""A buggy client writes an impossible frame length into a live IPC log of a real driver.

The subscriber runs in a child process (a crash there is its exit code, not pytest's); this process
plays the buggy client, mapping the publication's log as any client can. The subscriber must get the
messages before the damage and then a CorruptLogError naming the image, the position and the bad value;
the driver must count it, refuse to pad over it (and say so in its error log), and go on serving other
streams.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from logbuf.client import Aeron, Context
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DEFAULT_ARGS, DriverProcess, DriverSet

INT32_MIN = -(2**31)

SUBSCRIBER = """
import json, sys, time
from logbuf.client import Aeron, Context, FragmentBatch
from logbuf.errors import CorruptLogError
directory, stream_id, flavour = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with Aeron.connect(Context(dir=directory, driver_timeout_ns=8_000_000_000)) as aeron:
    sub = aeron.add_subscription("aeron:ipc", stream_id)
    print("ready", flush=True)
    sys.stdin.readline()  # the log is damaged now
    got, error, batch = [], None, FragmentBatch(16)
    deadline = time.monotonic() + 20
    while error is None and time.monotonic() < deadline:
        try:
            if flavour == "poll":
                sub.poll(lambda buffer, header: got.append(bytes(buffer).decode()), 10)
            else:
                n = sub.poll_batch(batch)
                got += [bytes(batch.payload(i)).decode() for i in range(n)]
        except CorruptLogError as e:
            error = {"message": str(e), "position": e.position, "frame_length": e.frame_length,
                     "session_id": e.session_id, "stream_id": e.stream_id, "channel": e.channel}
        time.sleep(0.001)  # pace: poll every millisecond until the damage is met (or the deadline)
    print(json.dumps({"got": got, "error": error}), flush=True)
    sys.stdin.readline()  # stay subscribed (stuck at the damage) until the driver has looked at it
"""


@pytest.fixture(scope="module")
def driver(request: pytest.FixtureRequest) -> Iterator[DriverProcess]:
    with DriverSet(request) as drivers:
        d = drivers(*DEFAULT_ARGS, "--publication-unblock-timeout", "1s", base=[])
        d.expected_errors.append("corrupt log")
        yield d


@pytest.mark.parametrize(
    ("flavour", "frame_type", "frame_length"),
    [
        ("poll", dh.HDR_TYPE_DATA, 5),  # once a view of length -27 and a segfault in the handler
        ("poll", dh.HDR_TYPE_DATA, INT32_MIN),  # once a silent wedge, and an OverflowError in the unblocker
        ("poll_batch", dh.HDR_TYPE_PAD, 0x7FFFFFE0),  # a huge PAD: once a silent wedge
    ],
)
def test_a_corrupt_frame_in_a_live_ipc_log_stops_the_subscriber_with_an_error_and_the_driver_carries_on(
    driver: DriverProcess, flavour: str, frame_type: int, frame_length: int
) -> None:
    stream_id = 300 + abs(frame_length) % 1000
    counted_before = driver.system_counter("Corrupt log frames")
    with subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER, driver.dir, str(stream_id), flavour],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            run_case(driver, child, stream_id, frame_type, frame_length, counted_before)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    assert driver.alive


def run_case(
    driver: DriverProcess,
    child: subprocess.Popen[str],
    stream_id: int,
    frame_type: int,
    frame_length: int,
    counted_before: int,
) -> None:
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    with Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=8_000_000_000)) as aeron:
        pub = aeron.add_publication("aeron:ipc", stream_id)
        wait_until(lambda: pub.is_connected, 20, "the child's subscription")
        positions = []
        for text in ("m0", "m1", "m2"):
            positions.append(pub.position)
            wait_until(lambda: pub.offer(text.encode()) > 0, 20, f"the offer of {text}")
        bad_position = positions[1]
        term = pub._log_buffers.term_buffer(0)  # this process maps the log, as any client can
        dh.HEADER.pack_into(term, bad_position, frame_length, 0, 0xC0, frame_type, bad_position, 0, 0, 0, 0)
        term.release()
        child.stdin.write("damaged\n")
        child.stdin.flush()
        result = json.loads(child.stdout.readline())
        error = result["error"]
        assert result["got"] == ["m0"] and error is not None, result
        assert (error["position"], error["frame_length"]) == (bad_position, frame_length)
        assert (error["session_id"], error["stream_id"], error["channel"]) == (pub.session_id, stream_id, "aeron:ipc")
        assert f"frame_length={frame_length} at position={bad_position}" in error["message"]
        assert "channel=aeron:ipc" in error["message"]
        # the driver's unblocker, seeing the subscriber stuck for 1 s, refuses to pad from the garbage
        wait_until(
            lambda: driver.system_counter("Corrupt log frames") >= counted_before + 2, 20, "the driver's refusal"
        )
        assert any("corrupt log" in e and "not padded over" in e for e in driver.errors())
        assert driver.system_counter("Unblocked Publications") == 0
        # the driver serves other streams
        sub = aeron.add_subscription("aeron:ipc", stream_id + 1)
        other = aeron.add_publication("aeron:ipc", stream_id + 1)
        wait_until(lambda: other.is_connected, 20, "another stream")
        wait_until(lambda: other.offer(b"still serving") > 0, 20, "the offer on another stream")
        got: list[bytes] = []
        wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10) > 0, 20, "a message on another stream")
        assert got == [b"still serving"]
        child.stdin.write("exit\n")
        child.stdin.flush()
        assert child.wait(20) == 0, child.stderr.read() if child.stderr else ""
