"""The conductor's duty cycle on a fake clock: a real CnC in a temporary directory, the real client on the
same thread and clock sending its commands, ``do_work()`` called by hand on this thread; time moves only
when the test advances it (and by 1 ms for each step a command waits on)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator

import pytest

from logbuf.client import Aeron, Image
from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit.cnc import cnc_driver_heartbeat_ms
from logbuf.conduit.error_log import read_error_log
from logbuf.driver.lifecycle import PublicationState
from logbuf.driver.proxies import SenderProxy
from logbuf.driver.system_counters import SystemCounterId
from logbuf.errors import ClosedError, ErrorCode, RegistrationError
from logbuf.testing.clock import FakeClock
from logbuf.testing.stepped import SteppedDriver, stepped_client_context

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
            timer_interval_ns=TIMER_NS,
            client_liveness_timeout_ns=LIVENESS_NS,
            publication_linger_timeout_ns=LINGER_NS,
        )
        try:
            yield stepped
            errors = [e.text for e in read_error_log(stepped.driver.cnc.error_log)]
            unexpected = [e for e in errors if not any(x in e for x in stepped.expected_errors)]
            assert unexpected == [], f"driver error log: {unexpected}"
        finally:
            stepped.close()


class Client:
    """The real client of the stepped driver, with what its callbacks heard."""

    def __init__(self, driver: SteppedDriver, clock: FakeClock) -> None:
        self.errors: list[BaseException] = []
        self.lost_images: list[Image] = []

        def step() -> None:  # while a command waits: time passes and the driver works
            clock.advance(MS)
            driver.do_work()

        self.aeron = Aeron.connect(
            stepped_client_context(
                driver.driver.ctx.dir,
                clock,
                step,
                error_handler=self.errors.append,
                on_unavailable_image=self.lost_images.append,
            )
        )


@pytest.fixture
def client(driver: SteppedDriver, clock: FakeClock) -> Iterator[Client]:
    c = Client(driver, clock)
    try:
        yield c
    finally:
        c.aeron.close()


def run_for(driver: SteppedDriver, clock: FakeClock, ns: int, step_ns: int = 10 * MS) -> None:
    """Advance the clock by ``ns`` in steps, one duty cycle after each."""
    for _ in range(ns // step_ns):
        clock.advance(step_ns)
        driver.do_work()


def test_the_conductor_heartbeats_into_the_cnc_once_per_timer_interval(
    driver: SteppedDriver, client: Client, clock: FakeClock
) -> None:
    started_ms = clock.epoch_ms()
    driver.do_work()
    assert cnc_driver_heartbeat_ms(client.aeron.cnc) == started_ms
    clock.advance(TIMER_NS // 2)
    driver.do_work()
    assert cnc_driver_heartbeat_ms(client.aeron.cnc) == started_ms, "heartbeat before the timer was due"
    clock.advance(TIMER_NS // 2)
    driver.do_work()
    assert cnc_driver_heartbeat_ms(client.aeron.cnc) == started_ms + TIMER_NS // MS


def test_a_client_that_keeps_alive_stays_and_a_silent_one_is_timed_out(
    driver: SteppedDriver, client: Client, clock: FakeClock
) -> None:
    publication = client.aeron.add_publication(IPC, 10)
    subscription = client.aeron.add_subscription(IPC, 11)
    log_file_name = publication.log_file_name
    assert driver.counter(SystemCounterId.ACTIVE_CLIENTS) == 1
    for _ in range(3):  # three liveness timeouts pass, with a keepalive every half
        for _ in range(2):
            run_for(driver, clock, LIVENESS_NS // 2)
            client.aeron.do_work()  # its keepalive is due (every 500 ms)
    driver.do_work()
    client.aeron.do_work()
    assert client.errors == [] and not client.aeron.is_closed
    assert driver.counter(SystemCounterId.CLIENT_TIMEOUTS) == 0

    run_for(driver, clock, LIVENESS_NS + TIMER_NS)  # the client falls silent
    client.aeron.do_work()  # and hears that the driver timed it out: its own client id
    assert [str(e) for e in client.errors] == ["the media driver timed this client out"]
    assert isinstance(client.errors[0], ClosedError) and client.aeron.is_closed
    assert publication.is_closed and subscription.is_closed  # the client closed them itself
    assert driver.counter(SystemCounterId.CLIENT_TIMEOUTS) == 1
    assert driver.counter(SystemCounterId.ACTIVE_CLIENTS) == 0
    # its publication was released, and with no subscriber to drain it went in the same timer pass
    assert driver.conductor.publications == []
    assert not os.path.exists(log_file_name)


def test_a_removed_publication_lingers_for_its_slow_subscriber_then_is_deleted(
    driver: SteppedDriver, client: Client, clock: FakeClock
) -> None:
    publication = client.aeron.add_publication(IPC, 10)
    subscription = client.aeron.add_subscription(IPC, 10)
    driver.do_work()
    client.aeron.do_work()
    (image,) = subscription.images  # mapped, never polled: the subscriber stays at its join position
    assert image.subscription is subscription
    assert image.log_file_name == publication.log_file_name
    assert publication.offer(b"unread") > 0

    publication.close()
    driver.do_work()
    (state,) = [p.state for p in driver.conductor.publications]
    assert state is PublicationState.DRAINING
    keepalive_every = LIVENESS_NS // 4
    for _ in range(LINGER_NS // keepalive_every - 1):  # the linger has not passed yet
        run_for(driver, clock, keepalive_every)
        client.aeron.do_work()
    assert [p.state for p in driver.conductor.publications] == [PublicationState.DRAINING]
    assert os.path.exists(publication.log_file_name)
    assert client.lost_images == [] and subscription.images == (image,)

    run_for(driver, clock, keepalive_every + TIMER_NS)
    assert driver.conductor.publications == []
    assert driver.counter(SystemCounterId.ACTIVE_PUBLICATIONS) == 0
    assert not os.path.exists(publication.log_file_name)
    client.aeron.do_work()
    assert client.lost_images == [image] and subscription.images == ()
    assert image.correlation_id == publication.registration_id


def test_a_bad_command_is_answered_with_an_error_and_the_conductor_goes_on(
    driver: SteppedDriver, client: Client, clock: FakeClock
) -> None:
    with pytest.raises(RegistrationError) as refused:
        client.aeron.add_publication("aeron:udp?endpoint=127.0.0.1:40001|control-mode=response", 10)
    assert refused.value.error_code == ErrorCode.NOT_SUPPORTED
    assert driver.counter(SystemCounterId.ERRORS) == 1
    client.aeron.add_publication(IPC, 10)  # the next command is served
    errors = read_error_log(driver.driver.cnc.error_log)
    assert [e.text.split(":")[0] for e in errors] == ["NOT_SUPPORTED"]
    driver.expected_errors.append("NOT_SUPPORTED: control-mode=response")


def test_the_client_has_a_handler_for_every_response_the_driver_broadcasts(client: Client) -> None:
    responses = {value for name, value in vars(cmd).items() if name.startswith("ON_") and isinstance(value, int)}
    assert len(responses) == 8
    assert set(client.aeron._conductor._response_handlers) == responses


def test_a_network_publication_gets_aeron_s_stream_counters_in_aeron_s_order(
    driver: SteppedDriver, client: Client
) -> None:
    channel = "aeron:udp?control=127.0.0.1:40312"  # dynamic MDC: every kind of publication counter is made
    publication = client.aeron.add_publication(channel, 10)
    prefix = f": {publication.registration_id} {publication.session_id} 10 {channel}"
    mine = [
        c
        for c in driver.driver.counters
        if c.registration_id == publication.registration_id and c.label.endswith(prefix)
    ]
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
    assert [c.owner_id for c in mine] == [client.aeron.client_id] * 6 + [0, 0]


def test_destinations_change_through_the_sender_proxy_and_each_command_is_answered(
    driver: SteppedDriver, client: Client
) -> None:
    publication = client.aeron.add_publication("aeron:udp?control-mode=manual", 10)
    (endpoint,) = driver.driver.sender.endpoints
    assert endpoint.destinations is not None
    mdc_num_dest = next(
        c.counter_id
        for c in driver.driver.counters
        if c.label.startswith(f"mdc-num-dest: {publication.registration_id} ")
    )

    def destination(change: Callable[[str], None], channel: str) -> int:
        change(channel)  # returns once the driver answered with success (an error would raise)
        return driver.driver.counters.value(mdc_num_dest)

    first, second = "aeron:udp?endpoint=127.0.0.1:40321", "aeron:udp?endpoint=localhost:40322"
    counts = [destination(publication.add_destination, first), destination(publication.add_destination, second)]
    counts.append(destination(publication.add_destination, first))  # there already: no change, still a success
    assert endpoint.destinations.addresses == [("127.0.0.1", 40321), ("127.0.0.1", 40322)]
    counts.append(destination(publication.remove_destination, first))
    assert counts == [1, 2, 2, 1]
    with pytest.raises(RegistrationError) as refused:
        publication.remove_destination(first)
    assert refused.value.error_code == ErrorCode.UNKNOWN_PUBLICATION
    assert endpoint.destinations.addresses == [("127.0.0.1", 40322)]
    driver.expected_errors.append("UNKNOWN_PUBLICATION: unknown destination")

    # the sender applies the change; the conductor only sends it through the proxy
    assert SenderProxy(driver.driver.sender).remove_destination(endpoint, ("127.0.0.1", 40322), 0)
    assert (endpoint.destinations.addresses, driver.driver.counters.value(mdc_num_dest)) == ([], 0)
