"""One client against what every client of a driver shares: UDP endpoints, registrations, counters.

Each test plays a runaway (or hostile) client against a real driver process and shows that the driver
stays up and small, that the client is refused at its limit with a registration error naming the
setting (and counted), and that another client's streams keep working meanwhile.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator

import pytest

from logbuf.client import Aeron, Context, RegistrationError
from logbuf.driver.system_counters import SystemCounterId
from logbuf.errors import ErrorCode
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet
from logbuf.testing.host import free_udp_ports, rss_bytes

HOG_ENDPOINTS = 2_000
RSS_GROWTH_BOUND = 128 * 1024 * 1024
"""What 2,000 UDP subscriptions may add to the driver's resident memory. Each endpoint had its own 2 MiB
receive buffer, so 2,000 took about 4 GB (and the idle park's select() killed the driver at ~1,020)."""


@pytest.fixture
def open_files() -> Iterator[None]:
    """Room for the test's own probe sockets and the driver's (the driver inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * HOG_ENDPOINTS + 1_024
    if soft < wanted:
        assert hard == resource.RLIM_INFINITY or hard >= wanted, f"RLIMIT_NOFILE hard limit {hard} < {wanted}"
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def connect(driver: DriverProcess) -> Aeron:
    return Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=8_000_000_000))


def round_trip(aeron: Aeron, channel: str, stream_id: int) -> None:
    """A new publication and subscription on ``channel`` carry three messages, in order."""
    sub = aeron.add_subscription(channel, stream_id)
    pub = aeron.add_publication(channel, stream_id)
    try:
        wait_until(lambda: pub.is_connected and sub.is_connected, 10, f"{channel} connected")
        sent = [b"one", b"two", b"three"]
        for message in sent:
            wait_until(lambda m=message: pub.offer(m) > 0, 10, "offer")  # type: ignore[misc]
        got: list[bytes] = []
        wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10) >= 0 and len(got) >= 3, 10, "messages")
        assert got == sent
    finally:
        pub.close()
        sub.close()


def errors_counted(driver: DriverProcess) -> int:
    return driver.system_counter("Errors")


def test_a_client_with_2000_udp_subscriptions_leaves_the_driver_up_small_and_serving_others(
    open_files: None, driver_factory: DriverSet
) -> None:
    driver = driver_factory("--max-client-endpoints", str(HOG_ENDPOINTS))
    driver.expected_errors.append("max_client_endpoints")
    rss_at_start = rss_bytes(driver.pid)
    ports = free_udp_ports(HOG_ENDPOINTS + 2)
    honest_port = ports.pop()
    with connect(driver) as honest, connect(driver) as hog:
        for port in ports[:HOG_ENDPOINTS]:
            hog.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 1001)
        time.sleep(1.0)  # idle: the duty cycle parks on its sockets (select() failed here, past fd 1023)
        assert driver.alive, driver.output()[-5_000:]
        grown = rss_bytes(driver.pid) - rss_at_start
        assert grown < RSS_GROWTH_BOUND, f"{HOG_ENDPOINTS} UDP endpoints grew the driver by {grown / 2**20:.0f} MiB"
        print(f"{HOG_ENDPOINTS} UDP endpoints grew the driver by {grown / 2**20:.1f} MiB")

        errors_before = errors_counted(driver)
        with pytest.raises(RegistrationError, match=f"max_client_endpoints={HOG_ENDPOINTS}") as refused:
            hog.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{ports[HOG_ENDPOINTS]}", 1001)
        assert refused.value.error_code == ErrorCode.RESOURCE_TEMPORARILY_UNAVAILABLE
        assert f"holds {HOG_ENDPOINTS} UDP endpoints" in refused.value.driver_message
        assert errors_counted(driver) == errors_before + 1
        # a second subscription on an endpoint the client holds opens nothing: not refused
        hog.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{ports[0]}", 1002)

        # the other client's streams, with all of that open
        round_trip(honest, "aeron:ipc", 2001)
        round_trip(honest, f"aeron:udp?endpoint=127.0.0.1:{honest_port}", 2002)
        assert driver.alive
    wait_until(lambda: driver.system_counter("Active clients") == 0, 10, "clients closed")
    assert driver.alive


@pytest.mark.parametrize("driver_args", [["--counters-buffer-length", "16k", "--max-client-endpoints", "1024"]])
def test_one_client_takes_at_most_its_share_of_the_counters_and_others_still_publish(
    driver_args: list[str], driver_factory: DriverSet
) -> None:
    driver = driver_factory(*driver_args)
    driver.expected_errors.append("client_counters_share")
    for_clients = 128 - len(SystemCounterId)  # 16 KiB of 128-byte records; the default share is half of these
    with connect(driver) as hog, connect(driver) as honest:
        held = []
        with pytest.raises(RegistrationError, match="client_counters_share=0.5") as refused:
            for stream_id in range(100, 200):
                held.append(hog.add_publication("aeron:ipc", stream_id))
        assert refused.value.error_code == ErrorCode.RESOURCE_TEMPORARILY_UNAVAILABLE
        assert f"may hold {for_clients // 2} of the {for_clients} counters" in refused.value.driver_message
        assert len(held) == (for_clients // 2 - 1) // 2  # its heartbeat, then pub-pos and pub-lmt each
        # the rest of the counters are there for everyone else's new streams
        round_trip(honest, "aeron:ipc", 300)
        round_trip(honest, "aeron:ipc", 301)
        # closing one of the hog's publications gives it room again once the counters are reusable (the
        # attempts before that may find all of them taken, the honest streams' lingering included)
        driver.expected_errors.append("counters are full")
        held.pop().close()

        def added() -> bool:
            try:
                held.append(hog.add_publication("aeron:ipc", 400))
            except RegistrationError:
                return False
            return True

        wait_until(added, 10, "the hog's freed counters to come back to it", max_idle_s=0.2)
    assert driver.alive


@pytest.mark.parametrize("driver_args", [["--max-client-registrations", "100"]])
def test_registrations_past_the_per_client_limit_are_refused_and_counted(
    driver_args: list[str], driver_factory: DriverSet
) -> None:
    driver = driver_factory(*driver_args)
    driver.expected_errors.append("max_client_registrations")
    with connect(driver) as hog, connect(driver) as honest:
        subs = [hog.add_subscription("aeron:ipc", stream_id) for stream_id in range(1000, 1100)]
        errors_before = errors_counted(driver)
        for attempt in range(3):
            with pytest.raises(RegistrationError, match="max_client_registrations=100") as refused:
                if attempt % 2:
                    hog.add_publication("aeron:ipc", 1000)
                else:
                    hog.add_subscription("aeron:ipc", 2000 + attempt)
            assert refused.value.error_code == ErrorCode.RESOURCE_TEMPORARILY_UNAVAILABLE
        assert errors_counted(driver) == errors_before + 3
        assert len(driver.errors()) == 1  # one distinct error however often the client retries
        round_trip(honest, "aeron:ipc", 1000)  # the stream the hog subscribes to: it gets an image too
        subs.pop().close()
        hog.add_subscription("aeron:ipc", 2000)  # room again
    assert driver.alive
    assert driver.system_counter("Errors") == errors_before + 3


def test_the_driver_raises_its_open_file_limit_to_the_hard_limit(driver_factory: DriverSet) -> None:
    """At the usual soft limit of 1,024 descriptors a few clients' UDP endpoints would leave no descriptor
    for anyone's new log; the driver takes what the hard limit allows, as servers do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1_024:
        pytest.fail(f"RLIMIT_NOFILE hard limit {hard}: nothing to raise to")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1_024, hard))  # the driver inherits it
    try:
        driver = driver_factory()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with open(f"/proc/{driver.pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max open files"))
    driver_soft, driver_hard = line.split()[3:5]
    assert driver_soft == driver_hard != "1024", line
