"""The embedded driver (invoker mode): the application runs the driver's duty cycle on its own thread.

Real drivers, real shared memory, real UDP on 127.0.0.1: one driver embedded in this test process and
invoked by it, talking IPC to a client on the same thread, or UDP to a standalone driver process.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from logbuf.client import Aeron, Context
from logbuf.driver.context import DriverContext
from logbuf.driver.media_driver import InvokerModeError, MediaDriver
from logbuf.testing.driver_process import DriverSet, unique_dir
from logbuf.testing.host import free_udp_port

TIMEOUT_S = 20.0


@pytest.fixture
def embedded() -> Iterator[MediaDriver]:
    driver = MediaDriver.launch(
        DriverContext(dir=unique_dir(), dir_delete_on_shutdown=True, ipc_term_length=1 << 20), invoker=True
    )
    try:
        yield driver
    finally:
        driver.close()


def invoke_until(driver: MediaDriver, condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        driver.invoke()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {TIMEOUT_S} s")


def test_ipc_round_trip_on_one_thread_with_the_driver_invoked_by_the_client(embedded: MediaDriver) -> None:
    with Aeron.connect(Context(dir=embedded.ctx.dir, driver_agent_invoker=embedded.invoke)) as aeron:
        sub = aeron.add_subscription("aeron:ipc", 7)  # answered only because the client invokes the driver
        pub = aeron.add_publication("aeron:ipc", 7)
        invoke_until(embedded, lambda: pub.is_connected, "publication connected")
        received: list[bytes] = []
        for i in range(1_000):
            message = i.to_bytes(4, "little") * 8
            while pub.offer(message) < 0:
                embedded.invoke()

        def drained() -> bool:
            sub.poll(lambda b, h: received.append(bytes(b)), 100)
            return len(received) >= 1_000

        invoke_until(embedded, drained, "1,000 messages over IPC")
        assert received == [i.to_bytes(4, "little") * 8 for i in range(1_000)]


def test_an_idle_embedded_driver_reports_no_work(embedded: MediaDriver) -> None:
    context = Context(dir=embedded.ctx.dir, driver_agent_invoker=embedded.invoke, use_conductor_thread=False)
    with Aeron.connect(context) as aeron:  # no conductor thread: no keepalive lands between the two calls
        aeron.add_subscription("aeron:ipc", 7)
        deadline = time.monotonic() + TIMEOUT_S
        while embedded.invoke() and time.monotonic() < deadline:
            pass
        assert embedded.invoke() == 0


def test_udp_from_an_embedded_driver_to_a_driver_process(embedded: MediaDriver, driver_factory: DriverSet) -> None:
    remote = driver_factory()
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    with (
        Aeron.connect(Context(dir=remote.dir)) as far,
        Aeron.connect(Context(dir=embedded.ctx.dir, driver_agent_invoker=embedded.invoke)) as near,
    ):
        sub = far.add_subscription(channel, 9)
        pub = near.add_publication(channel, 9)
        invoke_until(embedded, lambda: pub.is_connected, "UDP publication connected")
        received: list[bytes] = []
        for i in range(200):
            while pub.offer(bytes([i]) * 100) < 0:
                embedded.invoke()

        def drained() -> bool:
            sub.poll(lambda b, h: received.append(bytes(b)), 100)
            return len(received) >= 200

        invoke_until(embedded, drained, "200 messages over UDP")  # the embedded sender runs only when invoked
        assert received == [bytes([i]) * 100 for i in range(200)]


def test_close_releases_the_embedded_drivers_sockets(embedded: MediaDriver) -> None:
    port = free_udp_port()
    with Aeron.connect(Context(dir=embedded.ctx.dir, driver_agent_invoker=embedded.invoke)) as aeron:
        aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 9)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", port))  # the embedded receiver holds it
    embedded.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", port))
    assert embedded.invoke() == 0  # a closed driver does nothing


def test_run_start_and_invoke_refuse_the_wrong_mode(embedded: MediaDriver) -> None:
    with pytest.raises(InvokerModeError, match="embedded"):
        embedded.run()
    with pytest.raises(InvokerModeError, match="embedded"):
        embedded.start()
    threaded = MediaDriver.launch(DriverContext(dir=unique_dir(), dir_delete_on_shutdown=True, cpu_affinity="any"))
    try:
        with pytest.raises(InvokerModeError, match="invoker=True"):
            threaded.invoke()
    finally:
        threaded.close()
