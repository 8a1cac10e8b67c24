"""The conductor's duty cycle on a fake clock: a real CnC in a temporary directory, commands written into
its ring as a client writes them, ``do_work()`` called by hand on this thread; time moves only when
the test advances it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit.cnc import cnc_driver_heartbeat_ms
from logbuf.conduit.error_log import read_error_log
from logbuf.driver.lifecycle import PublicationState
from logbuf.driver.proxies import SenderProxy
from logbuf.driver.system_counters import SystemCounterId
from logbuf.errors import ErrorCode
from tests.driver._stepped import CncClient, SteppedDriver
from tests.support.clock import FakeClock

MS = 1_000_000
S = 1_000_000_000
TIMER_NS = 100 * MS
LIVENESS_NS = 2 * S
LINGER_NS = 1 * S
IPC = "aeron:ipc"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def driver(clock: FakeClock) -> Iterator[SteppedDriver]:
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as parent:
        stepped = SteppedDriver(
            os.path.join(parent, "driver"),
            clock,
            timer_interval=TIMER_NS,
            client_liveness_timeout=LIVENESS_NS,
            publication_linger_timeout=LINGER_NS,
        )
        try:
            yield stepped
            errors = [e.text for e in read_error_log(stepped.driver.cnc.error_log)]
            unexpected = [e for e in errors if not any(x in e for x in stepped.expected_errors)]
            assert unexpected == [], f"driver error log: {unexpected}"
        finally:
            stepped.close()


@pytest.fixture
def client(driver: SteppedDriver) -> Iterator[CncClient]:
    c = CncClient(driver.driver.ctx.dir)
    try:
        yield c
    finally:
        c.close()


def run_for(driver: SteppedDriver, clock: FakeClock, ns: int, step_ns: int = 10 * MS) -> None:
    """Advance the clock by ``ns`` in steps, one duty cycle after each."""
    for _ in range(ns // step_ns):
        clock.advance(step_ns)
        driver.do_work()


def ready_publication(client: CncClient, driver: SteppedDriver, channel: str = IPC) -> cmd.PublicationReady:
    correlation_id = client.add_publication(channel, 10)
    driver.do_work()
    (payload,) = client.of_type(cmd.ON_PUBLICATION_READY)
    ready = cmd.PublicationReady.decode(payload)
    assert ready.correlation_id == correlation_id
    return ready


def test_the_conductor_heartbeats_into_the_cnc_once_per_timer_interval(
    driver: SteppedDriver, client: CncClient, clock: FakeClock
) -> None:
    started_ms = clock.epoch_ms()
    driver.do_work()
    assert cnc_driver_heartbeat_ms(client.cnc) == started_ms
    clock.advance(TIMER_NS // 2)
    driver.do_work()
    assert cnc_driver_heartbeat_ms(client.cnc) == started_ms, "heartbeat before the timer was due"
    clock.advance(TIMER_NS // 2)
    driver.do_work()
    assert cnc_driver_heartbeat_ms(client.cnc) == started_ms + TIMER_NS // MS


def test_a_client_that_keeps_alive_stays_and_a_silent_one_is_timed_out(
    driver: SteppedDriver, client: CncClient, clock: FakeClock
) -> None:
    ready = ready_publication(client, driver)
    assert driver.counter(SystemCounterId.ACTIVE_CLIENTS) == 1
    for _ in range(3):  # three liveness timeouts pass, with a keepalive every half
        for _ in range(2):
            run_for(driver, clock, LIVENESS_NS // 2)
            client.keepalive()
    driver.do_work()
    assert client.of_type(cmd.ON_CLIENT_TIMEOUT) == []
    assert driver.counter(SystemCounterId.CLIENT_TIMEOUTS) == 0

    run_for(driver, clock, LIVENESS_NS + TIMER_NS)
    (timeout,) = client.of_type(cmd.ON_CLIENT_TIMEOUT)
    assert cmd.ClientTimeout.decode(timeout).client_id == client.client_id
    assert driver.counter(SystemCounterId.CLIENT_TIMEOUTS) == 1
    assert driver.counter(SystemCounterId.ACTIVE_CLIENTS) == 0
    # its publication was released, and with no subscriber to drain it went in the same timer pass
    assert driver.conductor.publications == []
    assert not os.path.exists(ready.log_file_name)


def test_a_removed_publication_lingers_for_its_slow_subscriber_then_is_deleted(
    driver: SteppedDriver, client: CncClient, clock: FakeClock
) -> None:
    ready = ready_publication(client, driver)
    subscription_id = client.add_subscription(IPC, 10)
    driver.do_work()
    (available,) = client.of_type(cmd.ON_AVAILABLE_IMAGE)
    image_ready = cmd.ImageReady.decode(available)
    assert image_ready.subscription_registration_id == subscription_id
    publication = client.publication(ready)
    client.image(image_ready)  # mapped, never polled: the subscriber stays at its join position
    assert publication.offer(b"unread") > 0

    client.remove_publication(ready.registration_id)
    driver.do_work()
    (state,) = [p.state for p in driver.conductor.publications]
    assert state is PublicationState.DRAINING
    keepalive_every = LIVENESS_NS // 4
    for _ in range(LINGER_NS // keepalive_every - 1):  # the linger has not passed yet
        run_for(driver, clock, keepalive_every)
        client.keepalive()
    assert [p.state for p in driver.conductor.publications] == [PublicationState.DRAINING]
    assert os.path.exists(ready.log_file_name)
    assert client.of_type(cmd.ON_UNAVAILABLE_IMAGE) == []

    run_for(driver, clock, keepalive_every + TIMER_NS)
    assert driver.conductor.publications == []
    assert driver.counter(SystemCounterId.ACTIVE_PUBLICATIONS) == 0
    assert not os.path.exists(ready.log_file_name)
    (unavailable,) = client.of_type(cmd.ON_UNAVAILABLE_IMAGE)
    assert cmd.ImageMessage.decode(unavailable).correlation_id == ready.registration_id


def test_a_bad_command_is_answered_with_an_error_and_the_conductor_goes_on(
    driver: SteppedDriver, client: CncClient, clock: FakeClock
) -> None:
    correlation_id = client.add_publication("aeron:udp?endpoint=127.0.0.1:40001|control-mode=response", 10)
    driver.do_work()
    (error,) = client.of_type(cmd.ON_ERROR)
    response = cmd.ErrorResponse.decode(error)
    assert response.offending_correlation_id == correlation_id
    assert response.error_code == ErrorCode.NOT_SUPPORTED
    assert driver.counter(SystemCounterId.ERRORS) == 1
    ready_publication(client, driver)  # the next command is served
    errors = read_error_log(driver.driver.cnc.error_log)
    assert [e.text.split(":")[0] for e in errors] == ["NOT_SUPPORTED"]
    driver.expected_errors.append("NOT_SUPPORTED: control-mode=response")


def test_a_network_publication_gets_aeron_s_stream_counters_in_aeron_s_order(
    driver: SteppedDriver, client: CncClient
) -> None:
    channel = "aeron:udp?control=127.0.0.1:40312"  # dynamic MDC: every kind of publication counter is made
    ready = ready_publication(client, driver, channel)
    counters = driver.driver.counters
    prefix = f": {ready.registration_id} {ready.session_id} 10 {channel}"
    mine = [c for c in counters if c.registration_id == ready.registration_id and c.label.endswith(prefix)]
    assert [c.label for c in mine] == [
        name + prefix
        for name in (
            "pub-pos (concurrent)",
            "pub-lmt",
            "snd-pos",
            "snd-lmt",
            "snd-bpe",
            "snd-naks-received",
            "fc-receivers",
            "mdc-num-dest",
        )
    ]
    assert [c.owner_id for c in mine] == [client.client_id] * 6 + [0, 0]
    assert mine[1].counter_id == ready.position_limit_counter_id


def test_destinations_change_through_the_sender_proxy_and_each_command_is_answered(
    driver: SteppedDriver, client: CncClient
) -> None:
    ready = ready_publication(client, driver, "aeron:udp?control-mode=manual")
    (endpoint,) = driver.driver.sender.endpoints
    assert endpoint.destinations is not None
    mdc_num_dest = next(
        c.counter_id for c in driver.driver.counters if c.label.startswith(f"mdc-num-dest: {ready.registration_id} ")
    )

    def destination(msg_type_id: int, channel: str, registration_id: int = ready.registration_id) -> tuple[int, int]:
        correlation_id = client.to_driver.next_correlation_id()
        command = cmd.DestinationCommand(client.client_id, correlation_id, registration_id, channel)
        client._send(msg_type_id, command.encode())
        driver.do_work()
        return correlation_id, driver.driver.counters.value(mdc_num_dest)

    first, second = "aeron:udp?endpoint=127.0.0.1:40321", "aeron:udp?endpoint=localhost:40322"
    answered = [destination(cmd.ADD_DESTINATION, first), destination(cmd.ADD_DESTINATION, second)]
    answered.append(destination(cmd.ADD_DESTINATION, first))  # there already: no change, still a success
    assert endpoint.destinations.addresses == [("127.0.0.1", 40321), ("127.0.0.1", 40322)]
    answered.append(destination(cmd.REMOVE_DESTINATION, first))
    assert [count for _, count in answered] == [1, 2, 2, 1]
    assert [cmd.OperationSuccess.decode(p).correlation_id for p in client.of_type(cmd.ON_OPERATION_SUCCESS)] == [
        correlation_id for correlation_id, _ in answered
    ]
    unknown, _ = destination(cmd.REMOVE_DESTINATION, first)
    (error,) = [cmd.ErrorResponse.decode(p) for p in client.of_type(cmd.ON_ERROR)]
    assert (error.offending_correlation_id, error.error_code) == (unknown, ErrorCode.UNKNOWN_PUBLICATION)
    assert endpoint.destinations.addresses == [("127.0.0.1", 40322)]
    driver.expected_errors.append("UNKNOWN_PUBLICATION: unknown destination")

    # the sender applies the change; the conductor only sends it through the proxy
    assert SenderProxy(driver.driver.sender).remove_destination(endpoint, ("127.0.0.1", 40322), 0)
    assert (endpoint.destinations.addresses, driver.driver.counters.value(mdc_num_dest)) == ([], 0)
