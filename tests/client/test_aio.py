"""asyncio: an event loop drives the client conductor and awaits back-pressure and new messages, against a
real media driver; every message once and in order per publisher."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import struct
import sys
from typing import Any

import pytest

from logbuf.client import Aeron, ClosedError, Context
from logbuf.client.aio import AsyncAeron, AsyncIdle
from logbuf.testing.driver_process import DriverProcess, DriverSet

SEQ = struct.Struct("<iq")  # publisher id, sequence number
CHANNEL = "aeron:ipc"
SPAWN = mp.get_context("spawn")


@pytest.fixture
def driver(driver_factory: DriverSet) -> DriverProcess:
    return driver_factory("--ipc-term-length", "64k", "--client-liveness-timeout", "2s")


def _publish(
    directory: str, channel: str, stream_id: int, publisher_id: int, count: int, size: int, done: Any, finish: Any
) -> None:
    """A plain (not asyncio) publisher process: ``count`` messages of ``size`` bytes, as fast as it can; then
    it says so and keeps its publication open (a closed one's unread messages go after its linger) until
    ``finish``."""
    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_exclusive_publication(channel, stream_id)
        message = bytearray(size)
        seq = 0
        while seq < count:
            SEQ.pack_into(message, 0, publisher_id, seq)
            if pub.offer(message) > 0:
                seq += 1
        done.put(publisher_id)
        finish.wait(120)


def _start_publisher(*args: Any) -> Any:
    process = SPAWN.Process(target=_publish, args=args, daemon=True)
    process.start()
    return process


def test_messages_delivers_every_message_once_in_order_while_the_loop_keeps_running(driver: DriverProcess) -> None:
    """The publishers finish first (the 8 MiB term holds all they send), so every poll finds messages and
    only the iterator's own periodic yield lets another task run while it delivers."""
    count, publishers = 30_000, 2
    channel = "aeron:ipc?term-length=8m"

    async def main() -> tuple[dict[int, int], int, int]:
        async with await AsyncAeron.connect(Context(dir=driver.dir)) as aeron:
            sub = await aeron.add_subscription(channel, 7)
            done, finish = SPAWN.Queue(), SPAWN.Event()
            children = [_start_publisher(driver.dir, channel, 7, p, count, 32, done, finish) for p in range(publishers)]
            for _ in children:
                await asyncio.to_thread(done.get, True, 120)
            ticks = 0
            ticks_at_start = ticks_while_receiving = -1

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0)

            task = asyncio.get_running_loop().create_task(ticker())
            expected = dict.fromkeys(range(publishers), 0)
            received = 0
            async with asyncio.timeout(120):
                async for message in sub.messages():
                    publisher_id, seq = SEQ.unpack_from(message)
                    assert seq == expected[publisher_id], (publisher_id, seq, expected)
                    expected[publisher_id] = seq + 1
                    received += 1
                    if received == 1:
                        ticks_at_start = ticks
                    elif received == count:
                        ticks_while_receiving = ticks - ticks_at_start
                    if received == count * publishers:
                        break
            task.cancel()
            finish.set()
            for child in children:
                await asyncio.to_thread(child.join, 30)
            return expected, ticks_while_receiving, received

    expected, ticks_while_receiving, received = asyncio.run(main())
    assert received == count * publishers
    assert expected == dict.fromkeys(range(publishers), count)
    # a stream that always has messages still lets the loop's other tasks run
    assert ticks_while_receiving > 0


def test_offer_async_awaits_back_pressure_and_every_message_arrives(driver: DriverProcess) -> None:
    """A 64 KiB term holds ~1,000 32-byte frames: 20,000 offers are back-pressured many times over, and each
    is awaited, not lost."""
    count = 20_000

    async def main() -> list[int]:
        async with await AsyncAeron.connect(Context(dir=driver.dir)) as aeron:
            sub = await aeron.add_subscription(CHANNEL, 8)
            pub = await aeron.add_exclusive_publication(CHANNEL, 8)
            seen: list[int] = []

            def on_fragment(buffer: memoryview, header: Any) -> None:
                seen.append(SEQ.unpack_from(buffer)[1])

            async def publish() -> None:
                message = bytearray(32)
                for seq in range(count):
                    SEQ.pack_into(message, 0, 0, seq)
                    assert await pub.offer_async(message) > 0

            async def subscribe() -> None:
                while len(seen) < count:
                    await sub.poll_async(on_fragment, 64)

            async with asyncio.timeout(120):
                await asyncio.gather(publish(), subscribe())
            return seen

    assert asyncio.run(main()) == list(range(20_000))


def test_fragmented_messages_arrive_whole(driver: DriverProcess) -> None:
    async def main() -> list[bytes]:
        async with await AsyncAeron.connect(Context(dir=driver.dir)) as aeron:
            sub = await aeron.add_subscription(CHANNEL, 9)
            pub = await aeron.add_exclusive_publication(CHANNEL, 9)
            sent = [bytes([i]) * (5_000 + i) for i in range(5)]  # each several MTUs long
            for message in sent:
                await pub.offer_async(message)
            got = []
            async with asyncio.timeout(30):
                async for message in sub.messages():
                    got.append(message)
                    if len(got) == len(sent):
                        break
            assert got == sent
            return got

    asyncio.run(main())


@pytest.mark.parametrize("traced", [False, True], ids=["am_send", "traced"])
def test_messages_steps_give_the_same_messages_with_and_without_a_tracer(driver: DriverProcess, traced: bool) -> None:
    """A step of ``messages()`` completes through the stream's ``am_send`` slot (CPython 3.11), or, while a
    tracer (a debugger, coverage) is set, through ``__next__``'s ``StopIteration``; from 3.12 it is a
    ``ready(message)`` coroutine either way: each gives every message, in order, whole ones and fragmented
    ones mixed."""
    from logbuf.native.reader import MESSAGE_STREAM_AM_SEND

    assert MESSAGE_STREAM_AM_SEND == (sys.version_info < (3, 12)), "MessageStream's fast step is not the expected one"

    async def main() -> list[bytes]:
        async with await AsyncAeron.connect(Context(dir=driver.dir)) as aeron:
            sub = await aeron.add_subscription(CHANNEL, 12)
            pub = await aeron.add_exclusive_publication(CHANNEL, 12)
            sent = [SEQ.pack(1, i) + bytes(3_000 if i % 50 == 7 else 20) for i in range(2_000)]
            got: list[bytes] = []

            async def consume() -> None:
                async for message in sub.messages(64):
                    got.append(message)
                    if len(got) == len(sent):
                        return

            async with asyncio.timeout(30):
                consumer = asyncio.create_task(consume())
                for message in sent:
                    await pub.offer_async(message)
                await consumer
            return got

    if traced:
        sys.settrace(lambda *args: None)
    try:
        got = asyncio.run(main())
    finally:
        sys.settrace(None)
    assert [SEQ.unpack_from(m)[1] for m in got] == list(range(2_000))
    assert all(len(m) == SEQ.size + (3_000 if i % 50 == 7 else 20) for i, m in enumerate(got))


def test_closed_resources_raise_instead_of_waiting_forever(driver: DriverProcess) -> None:
    async def main() -> None:
        async with await AsyncAeron.connect(Context(dir=driver.dir)) as aeron:
            sub = await aeron.add_subscription(CHANNEL, 10)
            pub = await aeron.add_publication(CHANNEL, 11)  # no subscriber: not connected
            waiting = asyncio.get_running_loop().create_task(sub.poll_async(lambda b, h: None))
            await asyncio.sleep(0.05)
            assert not waiting.done()  # nothing published: it waits
            await aeron.close_resource(sub)
            with pytest.raises(ClosedError):
                async with asyncio.timeout(10):
                    await waiting
            offering = asyncio.get_running_loop().create_task(pub.offer_async(b"x" * 8))
            await asyncio.sleep(0.05)
            assert not offering.done()  # not connected: it waits
            await aeron.close_resource(pub)
            with pytest.raises(ClosedError):
                async with asyncio.timeout(10):
                    await offering
            ended = [m async for m in sub.messages()]  # a closed subscription's iterator ends
            assert ended == []

    asyncio.run(main())


def test_the_loop_keeps_the_client_alive_past_the_liveness_timeout(driver: DriverProcess) -> None:
    """No conductor thread: the keepalives come from the loop's conductor task (the driver's client
    liveness timeout here is 2 s)."""

    async def main() -> None:
        async with await AsyncAeron.connect(Context(dir=driver.dir)) as aeron:
            sub = await aeron.add_subscription(CHANNEL, 12)
            await asyncio.sleep(3.5)
            assert not sub.is_closed
            pub = await aeron.add_exclusive_publication(CHANNEL, 12)
            await pub.offer_async(b"still here")
            async with asyncio.timeout(10):
                message = await anext(sub.messages())
            assert message == b"still here"

    asyncio.run(main())


def test_idle_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="min_park_ns"):
        AsyncIdle(min_park_ns=10_000_000, max_park_ns=1_000_000)
    with pytest.raises(ValueError, match="deep_park_ns"):
        AsyncIdle(max_park_ns=10_000_000, deep_park_ns=1_000_000)
    with pytest.raises(ValueError, match="spins"):
        AsyncIdle(spins=-1)
