"""System tests: a real media driver process, real client processes, real shared memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from logbuf.client import Aeron, Context, DriverTimeoutError, OfferResult, RegistrationError
from logbuf.conduit.cnc import CncFile
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer
from logbuf.errors import ErrorCode, InvalidChannelError
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spawn(role: str, **args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.driver._children", role, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def wait_ready(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> None:
    assert proc.stdout is not None
    start = time.monotonic()
    line = proc.stdout.readline()  # children print "ready" once subscribed
    assert line.strip() == "ready", (
        f"child not ready after {time.monotonic() - start:.1f} s: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
    )


def result_of(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, int]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"child timed out; stderr:\n{err}") from None
    assert proc.returncode == 0, f"child failed ({proc.returncode}); stderr:\n{err}"
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture
def aeron(media_driver: DriverProcess) -> Iterator[Aeron]:
    with Aeron.connect(Context(dir=media_driver.dir, driver_timeout_ns=3_000_000_000)) as client:
        yield client


@pytest.mark.slow
def test_three_subscribers_at_different_speeds_lose_nothing_and_the_slowest_back_pressures(
    media_driver: DriverProcess,
) -> None:
    count, stream_id = 60_000, 1001
    subs = [
        spawn(
            "subscriber",
            directory=media_driver.dir,
            stream_id=stream_id,
            count=count,
            delay_every=0,
            delay_s=0.0,
            timeout_s=90,
        ),
        spawn(
            "subscriber",
            directory=media_driver.dir,
            stream_id=stream_id,
            count=count,
            delay_every=2_000,
            delay_s=0.002,
            timeout_s=90,
        ),
        spawn(
            "subscriber",
            directory=media_driver.dir,
            stream_id=stream_id,
            count=count,
            delay_every=500,
            delay_s=0.02,
            timeout_s=90,
        ),
    ]
    try:
        for sub in subs:
            wait_ready(sub)
        pub = spawn("publisher", directory=media_driver.dir, stream_id=stream_id, count=count, size=100, timeout_s=90)
        # While running, the stat tool sees the slowest subscriber lagging behind the publisher.
        lags: list[int] = []

        def lagging_or_done() -> bool:
            if pub.poll() is not None:
                return True
            for stream in media_driver.stat_json()["streams"]:
                if stream["stream_id"] == stream_id and len(stream["subscribers"]) == 3:
                    lags.append(max(s["lag"] for s in stream["subscribers"]))
            return bool(lags) and max(lags) > 0

        wait_until(lagging_or_done, 30, "logbuf-stat to see a lagging subscriber", max_idle_s=0.2)
        published = result_of(pub, 120)
        results = [result_of(sub, 120) for sub in subs]
    finally:
        for p in subs:
            p.kill()
    assert published["published"] == count
    assert published["back_pressured"] > 0, "the slowest subscriber never back-pressured the publisher"
    for result in results:
        assert result == {"received": count, "errors": 0}
    assert lags and max(lags) > 0, "logbuf-stat never reported a subscriber lagging"


def test_publication_and_subscription_round_trip(aeron: Aeron) -> None:
    pub = aeron.add_publication("aeron:ipc", 7)
    sub = aeron.add_subscription("aeron:ipc", 7)
    wait_until(lambda: sub.image_count == 1 and pub.is_connected, what="image and connection")
    received: list[bytes] = []
    for i in range(100):
        while pub.offer(b"msg-%d" % i) < 0:
            pass
    wait_until(
        lambda: (
            sub.poll(lambda b, h: received.append(bytes(b)), 100) == 0 and len(received) == 100 or len(received) == 100
        ),
        what="100 messages",
    )
    assert received == [b"msg-%d" % i for i in range(100)]
    assert pub.position_limit > pub.position


def test_late_subscriber_starts_at_the_tail(aeron: Aeron) -> None:
    pub = aeron.add_publication("aeron:ipc", 8)
    early = aeron.add_subscription("aeron:ipc", 8)
    wait_until(lambda: pub.is_connected, what="connection")
    for i in range(10):
        while pub.offer(b"early-%d" % i) < 0:
            pass
    late = aeron.add_subscription("aeron:ipc", 8)
    wait_until(lambda: late.image_count == 1, what="late image")
    assert late.images[0].position == pub.position
    while pub.offer(b"after") < 0:
        pass
    got: list[bytes] = []
    wait_until(lambda: late.poll(lambda b, h: got.append(bytes(b)), 10) > 0 or bool(got), what="late message")
    assert got == [b"after"]
    early.close()


def test_no_subscriber_means_not_connected(aeron: Aeron) -> None:
    pub = aeron.add_publication("aeron:ipc", 9)
    assert pub.offer(b"x") == OfferResult.NOT_CONNECTED
    assert not pub.is_connected


def test_bad_channels_are_rejected_with_registration_errors(aeron: Aeron, media_driver: DriverProcess) -> None:
    media_driver.expected_errors += ["INVALID_CHANNEL", "UNKNOWN_PUBLICATION", "UNKNOWN_SUBSCRIPTION"]
    for channel, fragment in [
        ("aeron:tcp?endpoint=localhost:1", "tcp"),
        ("not-a-uri", "aeron:"),
        ("aeron:ipc?term-length=1000", "term-length"),
        ("aeron:udp?endpoint=127.0.0.1:99999", "endpoint"),
        ("aeron:udp?mtu=1408", "needs an endpoint"),
        ("aeron-spy:aeron:ipc", "prefix"),
    ]:
        with pytest.raises(RegistrationError, match=fragment) as info:
            aeron.add_publication(channel, 1)
        assert info.value.error_code == ErrorCode.INVALID_CHANNEL
    with pytest.raises(RegistrationError, match="UNKNOWN_PUBLICATION"):
        aeron._conductor._await(  # remove a publication the driver never heard of
            corr := aeron._conductor.to_driver.next_correlation_id(),
            0x02,
            __import__("logbuf.conduit.command_descriptor", fromlist=["x"])
            .RemoveCommand(aeron.client_id, corr, 424242)
            .encode(),
        )
    # The driver keeps serving.
    pub = aeron.add_publication("aeron:ipc", 11)
    assert pub.registration_id > 0


def test_integers_outside_their_fields_are_refused_naming_the_field_and_its_range(
    aeron: Aeron, media_driver: DriverProcess
) -> None:
    media_driver.expected_errors.append("INVALID_CHANNEL")
    for stream_id in (2**31, -(2**31) - 1):  # once a bare struct.error from the command encoder
        with pytest.raises(InvalidChannelError, match=rf"stream_id={stream_id} is outside the int32 range"):
            aeron.add_publication("aeron:ipc", stream_id)
        with pytest.raises(InvalidChannelError, match=rf"stream_id={stream_id} is outside the int32 range"):
            aeron.add_subscription("aeron:ipc", stream_id)
    for channel, field in [
        ("aeron:ipc?init-term-id=4294967296|term-id=4294967296|term-offset=0", "init-term-id"),
        ("aeron:ipc?init-term-id=0|term-id=0|term-offset=4294967296", "term-offset"),
        ("aeron:ipc?session-id=4294967296", "session-id"),
        ("aeron:ipc?linger=9999999999s", "linger \\(in ns\\)"),
    ]:
        with pytest.raises(
            RegistrationError, match=rf"channel parameter {field}=\d+ is outside the int\d+ range"
        ) as info:
            aeron.add_publication(channel, 1)
        assert info.value.error_code == ErrorCode.INVALID_CHANNEL
    assert aeron.add_publication("aeron:ipc", 2**31 - 1).registration_id > 0  # the driver keeps serving


def test_garbage_in_the_command_ring_is_counted_and_the_driver_keeps_serving(
    aeron: Aeron, media_driver: DriverProcess
) -> None:
    media_driver.expected_errors += ["UNKNOWN_COMMAND_TYPE_ID", "MALFORMED_COMMAND"]
    cnc = CncFile.open(media_driver.dir)
    try:
        ring = ManyToOneRingBuffer(cnc.to_driver)
        assert ring.write(0x77, b"\x01\x02\x03")  # unknown type
        assert ring.write(0x01, b"\xff" * 30)  # ADD_PUBLICATION with a lying channel length
        assert ring.write(0x04, b"\x00" * 4)  # ADD_SUBSCRIPTION, too short
    finally:
        cnc.close()
    wait_until(lambda: len(media_driver.errors()) >= 2, what="errors recorded")
    errors = media_driver.errors()
    assert any("UNKNOWN_COMMAND_TYPE_ID" in e for e in errors)
    assert any("MALFORMED_COMMAND" in e for e in errors)
    pub = aeron.add_publication("aeron:ipc", 12)
    sub = aeron.add_subscription("aeron:ipc", 12)
    wait_until(lambda: pub.is_connected and sub.image_count == 1, what="connection after garbage")
    stat = media_driver.stat_json()
    errors_counter = [c for c in stat["counters"] if c["label"].startswith("Errors: version=")]
    assert errors_counter and errors_counter[0]["value"] >= 3


def test_killed_client_is_timed_out_and_its_resources_reclaimed(aeron: Aeron, media_driver: DriverProcess) -> None:
    victim = spawn("idle_client", directory=media_driver.dir, stream_id=21)
    wait_ready(victim)
    survivor_pub = aeron.add_publication("aeron:ipc", 22)
    survivor_sub = aeron.add_subscription("aeron:ipc", 22)

    def stream_counters(stream_id: int) -> list[dict]:  # type: ignore[type-arg]
        return [s for s in media_driver.stat_json()["streams"] if s["stream_id"] == stream_id]

    assert stream_counters(21) and stream_counters(21)[0]["subscribers"]
    victim.kill()
    victim.communicate(timeout=10)  # reaps it and closes its pipes
    # client liveness timeout 2 s + linger 1 s: everything of stream 21 goes away
    wait_until(lambda: not stream_counters(21), timeout_s=15, what="victim's stream reclaimed")
    stat = media_driver.stat_json()
    timeouts = [c["value"] for c in stat["counters"] if c["label"] == "Client liveness timeouts"]
    assert timeouts == [1]
    # the survivor goes on
    wait_until(lambda: survivor_pub.is_connected, what="survivor connected")
    assert survivor_pub.offer(b"still here") > 0
    got: list[bytes] = []
    wait_until(lambda: survivor_sub.poll(lambda b, h: got.append(bytes(b)), 10) > 0, what="survivor message")
    assert got == [b"still here"]


def test_killed_driver_raises_driver_timeout_and_a_new_driver_takes_over(driver_factory: DriverSet) -> None:
    first = driver_factory("--driver-timeout", "2s", "--ipc-term-length", "1m", base=[])
    client = Aeron.connect(Context(dir=first.dir, driver_timeout_ns=2_000_000_000))
    pub = client.add_publication("aeron:ipc", 5)
    first.kill()
    with pytest.raises(DriverTimeoutError):  # the driver timeout is 2 s: within 10 s the client must notice
        wait_until(
            lambda: False,
            10,
            "the client to see the driver gone",
            do_work=lambda: (client.add_subscription("aeron:ipc", 5), 0)[1],  # 0: no work, back off to 0.2 s
            max_idle_s=0.2,
        )
    assert pub.offer(b"x") == OfferResult.CLOSED
    client.close()
    # the stale directory is taken over; a live driver in it is refused
    second = driver_factory.start(DriverProcess(first.dir, ["--driver-timeout", "2s", "--ipc-term-length", "1m"]))
    third = subprocess.run(
        [sys.executable, "-m", "logbuf.driver.main", "--dir", second.dir],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert third.returncode != 0
    assert "active media driver" in third.stderr + third.stdout
    with Aeron.connect(Context(dir=second.dir, driver_timeout_ns=2_000_000_000)) as again:
        assert again.add_publication("aeron:ipc", 5).registration_id > 0


def test_a_client_in_a_program_that_did_not_configure_logging_prints_nothing(media_driver: DriverProcess) -> None:
    """The client is a library: unless the program configured structlog, only warnings and errors
    are logged, and to stderr."""
    program = (
        "from client import Aeron, Context\n"
        f"with Aeron.connect(Context(dir={media_driver.dir!r})) as aeron:\n"
        "    aeron.add_subscription('aeron:ipc', 5).close()\n"
        "    aeron.add_publication('aeron:ipc', 5).close()\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"" and done.stderr == b""


@pytest.mark.parametrize(
    "driver_args",
    [
        [
            "--ipc-term-length",
            "1m",
            "--client-liveness-timeout",
            "2s",
            "--publication-unblock-timeout",
            "1s",
            "--dir-delete-on-shutdown",
            "false",
        ]
    ],
)
def test_a_publisher_killed_mid_claim_is_unblocked_and_the_stream_goes_on(media_driver: DriverProcess) -> None:
    program = (
        "import sys, time\n"
        "from client import Aeron, Context\n"
        "from logbuf.logbuffer.publication import BufferClaim\n"
        "from logbuf.testing import wait_until\n"
        f"aeron = Aeron.connect(Context(dir={media_driver.dir!r}))\n"
        "pub = aeron.add_publication('aeron:ipc', 9)\n"
        "wait_until(lambda: pub.is_connected, 30, 'the publication connected')\n"
        "claim = BufferClaim()\n"
        "print(pub.try_claim(100, claim), flush=True)\n"
        "time.sleep(60)  # pace: hold the claim, uncommitted, until the test kills this process\n"
    )
    with Aeron.connect(Context(dir=media_driver.dir)) as aeron:
        sub = aeron.add_subscription("aeron:ipc", 9)
        pub = aeron.add_publication("aeron:ipc", 9)
        victim = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
        try:
            claimed = int(victim.stdout.readline())  # type: ignore[union-attr]
            assert claimed > 0
        finally:
            victim.kill()
            victim.communicate(timeout=10)
        sent = [f"after {i}".encode() for i in range(100)]
        for message in sent:
            wait_until(lambda: pub.offer(message) > 0, 10, f"the offer of {message!r}")
        got: list[bytes] = []
        wait_until(
            lambda: len(got) >= len(sent),
            10,
            f"all {len(sent)} messages (still blocked?)",
            do_work=lambda: sub.poll(lambda buffer, header: got.append(bytes(buffer)), 100),
        )
        assert got == sent
    unblocked = [c for c in media_driver.stat_json()["counters"] if c["label"] == "Unblocked Publications"]
    assert unblocked[0]["value"] == 1


@pytest.mark.parametrize("driver_args", [["--cpu-affinity", "1", "--dir-delete-on-shutdown", "false"]])
def test_the_duty_cycle_runs_on_the_cpus_it_is_given(media_driver: DriverProcess) -> None:
    assert media_driver.proc is not None
    pid = media_driver.proc.pid
    wait_until(lambda: os.sched_getaffinity(pid) == {1}, 10, "the duty cycle's affinity {1}")  # set as it starts
