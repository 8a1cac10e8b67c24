"""asyncio integration: an event loop drives the client conductor, awaits back-pressure and new messages.

Theory of operation
-------------------
The data path stays what it is: ``Publication.offer`` and ``Subscription.poll`` are native calls on the
mapped log, and an awaited offer or poll that finds work returns after that one call, without touching
the event loop. Only an offer that is refused (back-pressured, not connected, a term rotating) or a poll
that finds nothing waits, and it waits the way Aeron's back-off idle strategy does, turned into
awaits: a few zero-length sleeps (``await asyncio.sleep(0)``: other tasks run, the loop does not block),
then sleeps doubling from ``min_park_ns`` up to ``max_park_ns``. An idle subscriber thus costs one short
loop iteration every ``max_park_ns`` (5 ms) for its first second, then every ``deep_park_ns`` (50 ms); the
first message after a quiet spell is seen within that. The conductor task steps every 20 ms, and every
100 ms once a second passes with no driver event. On the machine this was measured on a bare asyncio
wake-up costs about 100 us, so 5 ms parks alone cost 2% of a core: the deep park is what brings an idle
subscriber under 1% (``perf/asyncio_subscriber.py``).

Why not a file descriptor the publisher signals: in logbuf, as in Aeron, a publisher writes the log
directly from its own process, and a network image is written by the driver's receiver; a wake-up would
put a check (and, for a parked subscriber, a system call) on every offer of every publisher, which this
module exists not to slow. The back-off keeps the hot path unchanged for everyone.

A task that never waits starves the loop: a subscriber that always finds messages would never let the
conductor send its keepalives. So every ``ASYNC_YIELD_EVERY`` (64) consecutive successful awaited calls,
one of them also yields with ``await asyncio.sleep(0)``.

The client conductor runs as a task on the loop (:class:`AsyncAeron`), every ``conductor_interval_ns`` (20 ms):
keepalives, image events and the driver-liveness check happen on the loop thread, so the image list a
subscription polls changes only between the loop's steps. Commands to the driver (add or remove a
publication or subscription) wait for the driver's response in a worker thread (``asyncio.to_thread``),
so the loop keeps running while the driver answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from logbuf.client.aeron import ASYNC_YIELD_EVERY
from logbuf.durations import renamed_duration_keywords
from logbuf.errors import ClosedError, LogbufError
from logbuf.logbuffer.fragment_assembler import FragmentAssembler
from logbuf.logbuffer.publication import OfferResult
from logbuf.logging_config import library_logger
from logbuf.native.reader import BytesSink, MessageStream

if TYPE_CHECKING:
    from logbuf.client.aeron import Aeron, Context, Image, Publication, Subscription

__all__ = ["AsyncAeron", "AsyncIdle", "MaxPositionExceededError"]


class MaxPositionExceededError(LogbufError):
    """The stream reached its maximum position (term_length * 2^31): close and use a new publication."""


@renamed_duration_keywords(
    {name + "_s": (name + "_ns", 1_000_000_000) for name in ("min_park", "max_park", "deep_park")}
)
@dataclasses.dataclass(frozen=True, slots=True)
class AsyncIdle:
    """How an awaited offer or poll waits when there is nothing to do: ``spins`` zero-length sleeps, then
    sleeps doubling from ``min_park_ns`` to ``max_park_ns``, and after ``deep_after`` waits in a row (about a
    second at the defaults) parks of ``deep_park_ns``. A shorter park sees the first message after a quiet
    spell sooner and costs more CPU while idle: one loop iteration per park, about 100 us each on the 2-core
    machine this was measured on (``perf/asyncio_subscriber.py``)."""

    spins: int = 10
    min_park_ns: int = 50_000
    max_park_ns: int = 5_000_000
    deep_park_ns: int = 50_000_000
    deep_after: int = 200

    def __post_init__(self) -> None:
        if self.spins < 0:
            raise ValueError(f"spins={self.spins} must be >= 0")
        if not 0 < self.min_park_ns <= self.max_park_ns <= self.deep_park_ns:
            raise ValueError(
                f"min_park_ns={self.min_park_ns}, max_park_ns={self.max_park_ns} and deep_park_ns={self.deep_park_ns}: "
                "need 0 < min <= max <= deep"
            )
        if self.deep_after < 0:
            raise ValueError(f"deep_after={self.deep_after} must be >= 0")

    async def idle(self, step: int) -> int:
        """Wait for the ``step``-th time in a row with nothing done; returns the next step."""
        if step < self.spins:
            await asyncio.sleep(0)
        elif step >= self.deep_after:
            await asyncio.sleep(self.deep_park_ns / 1e9)
        else:
            await asyncio.sleep(min(self.min_park_ns << min(step - self.spins, 30), self.max_park_ns) / 1e9)
        return step + 1


DEFAULT_IDLE = AsyncIdle()
CONDUCTOR_QUIET_INTERVAL_NS = 100_000_000
"""The conductor task's step once no driver event came for a second (image events then arrive within this)."""


async def offer_when_ready(
    publication: Publication,
    buffer: Any,
    reserved_value: int,
    result: int,
    idle: AsyncIdle | None,
    on_refused: Callable[[int], object] | None,
) -> int:
    """``Publication.offer_async`` after its first offer returned ``result``: the position once offered."""
    idle = idle or DEFAULT_IDLE
    step = 0
    while result <= 0:
        if result == OfferResult.CLOSED:
            raise ClosedError(f"publication {publication.channel} stream {publication.stream_id} is closed")
        if result == OfferResult.MAX_POSITION_EXCEEDED:
            raise MaxPositionExceededError(
                f"publication {publication.channel} stream {publication.stream_id} reached its maximum position"
            )
        if on_refused is not None:
            on_refused(result)
        if result != OfferResult.ADMIN_ACTION:  # a rotation is retried at once, as Aeron advises
            step = await idle.idle(step)
        result = publication.offer(buffer, reserved_value)
    return result


async def poll_when_ready(
    subscription: Subscription, handler: Callable[[memoryview, Any], Any], fragment_limit: int, idle: AsyncIdle | None
) -> int:
    """``Subscription.poll_async`` after its first poll found ``0`` fragments: waits for at least one."""
    idle = idle or DEFAULT_IDLE
    step = 0
    while True:
        if subscription.is_closed:
            raise ClosedError(f"subscription {subscription.channel} stream {subscription.stream_id} is closed")
        step = await idle.idle(step)
        count = subscription.poll(handler, fragment_limit)
        if count:
            return count


async def yield_to_loop() -> None:
    """Let the loop's other tasks run once (a zero-length sleep)."""
    await asyncio.sleep(0)


def messages(subscription: Subscription, fragment_limit: int = 256, idle: AsyncIdle | None = None) -> MessageStream:
    """Every whole message of ``subscription`` as ``bytes`` (fragmented ones reassembled), in order per
    publisher, waiting when there are none; ends when the subscription is closed.

    A native async iterator (:class:`~logbuf.native.reader.MessageStream`): a step that finds a message
    buffered, or polled at once, costs about what a poll handler call does; only a wait runs a coroutine
    (:func:`_wait_for_message`)."""
    idle = idle or DEFAULT_IDLE
    sink = BytesSink()

    async def wait(stream: MessageStream, yield_first: bool) -> bytes:
        return await _wait_for_message(subscription, stream, idle, yield_first)

    return MessageStream(
        subscription.poll, FragmentAssembler(sink), sink, fragment_limit, ASYNC_YIELD_EVERY, wait, _ready
    )


async def _ready(message: bytes) -> bytes:
    """A step of :func:`messages` whose message is already here (from CPython 3.12 the interpreter runs
    such a coroutine inline: cheaper than any awaitable completed by ``StopIteration``)."""
    return message


async def _wait_for_message(
    subscription: Subscription, stream: MessageStream, idle: AsyncIdle, yield_first: bool
) -> bytes:
    """A step of :func:`messages` that found nothing at once: idle until a poll yields a whole message."""
    if yield_first:
        await asyncio.sleep(0)
    step = 0
    while not stream.fill():
        if subscription.is_closed:
            raise StopAsyncIteration
        step = await idle.idle(step)
    return stream.take()


@renamed_duration_keywords({"conductor_interval_s": ("conductor_interval_ns", 1_000_000_000)})
class AsyncAeron:
    """A client whose conductor is a task on the running event loop::

        async with await AsyncAeron.connect(Context(dir=...)) as aeron:
            sub = await aeron.add_subscription("aeron:ipc", 10)
            async for message in sub.messages():
                ...

    Publications and subscriptions are the usual ones (``offer``/``poll`` work as ever), with
    ``Publication.offer_async``, ``Subscription.poll_async`` and ``Subscription.messages`` to await them.
    """

    def __init__(self, context: Context | None = None, *, conductor_interval_ns: int = 20_000_000) -> None:
        from logbuf.client.aeron import Context

        if conductor_interval_ns <= 0:
            raise ValueError(f"conductor_interval_ns={conductor_interval_ns} must be positive")
        self._context = dataclasses.replace(context or Context(), use_conductor_thread=False)
        self._interval_ns = conductor_interval_ns
        self._aeron: Aeron | None = None
        self._task: asyncio.Task[None] | None = None
        self._log = library_logger(role="client.aio")

    @classmethod
    async def connect(
        cls, context: Context | None = None, *, conductor_interval_ns: int = 20_000_000, **deprecated: Any
    ) -> AsyncAeron:
        """Connect to the driver (waiting for it in a worker thread) and start the conductor task
        (``conductor_interval_s=`` still works for one release, with a DeprecationWarning)."""
        if "conductor_interval_s" not in deprecated:
            deprecated["conductor_interval_ns"] = conductor_interval_ns
        client = cls(context, **deprecated)
        await client.start()
        return client

    async def start(self) -> None:
        if self._aeron is not None:
            return
        from logbuf.client.aeron import Aeron

        self._aeron = await asyncio.to_thread(Aeron.connect, self._context)
        self._task = asyncio.get_running_loop().create_task(self._run_conductor(), name="logbuf-client-conductor")

    @property
    def aeron(self) -> Aeron:
        """The synchronous client underneath (for what has no awaitable form)."""
        if self._aeron is None:
            raise ClosedError("AsyncAeron is not started: await start() or connect() first")
        return self._aeron

    async def _run_conductor(self) -> None:
        aeron = self.aeron
        quiet_steps = 0
        while not aeron.is_closed:
            try:
                quiet_steps = 0 if aeron.try_do_work() else quiet_steps + 1
            except Exception as e:  # the conductor task must not die silently
                self._log.exception("client.aio.conductor_error", error=str(e))
                handler = self._context.error_handler
                if handler is not None:
                    handler(e)
            # after a second with no driver event, step every CONDUCTOR_QUIET_INTERVAL_S (keepalives need 2/s)
            quiet = quiet_steps * self._interval_ns > 1_000_000_000
            interval_ns = max(self._interval_ns, CONDUCTOR_QUIET_INTERVAL_NS) if quiet else self._interval_ns
            await asyncio.sleep(interval_ns / 1e9)

    async def add_publication(self, channel: str, stream_id: int) -> Publication:
        return await asyncio.to_thread(self.aeron.add_publication, channel, stream_id)

    async def add_exclusive_publication(self, channel: str, stream_id: int) -> Publication:
        return await asyncio.to_thread(self.aeron.add_exclusive_publication, channel, stream_id)

    async def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], None] | None = None,
        on_unavailable_image: Callable[[Image], None] | None = None,
    ) -> Subscription:
        return await asyncio.to_thread(
            self.aeron.add_subscription, channel, stream_id, on_available_image, on_unavailable_image
        )

    async def close_resource(self, resource: Publication | Subscription) -> None:
        """Close a publication or subscription, waiting for the driver in a worker thread."""
        await asyncio.to_thread(resource.close)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._aeron is not None:
            await asyncio.to_thread(self._aeron.close)

    async def __aenter__(self) -> AsyncAeron:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
