"""The client API: ``Aeron.connect()`` then publications and subscriptions through a media driver.

Theory of operation
-------------------
Commands go to the driver through the CnC's to-driver ring buffer, each with a fresh
correlation id; responses and image events come back on the to-clients broadcast buffer. The
client conductor (:class:`ClientConductor`) owns all of that: it is driven by the caller's thread
while a command awaits its response, and by a small background thread otherwise (keepalives
every ``keepalive_interval_ns``, image events, the driver-liveness check, closing lingering
resources). One re-entrant lock serialises them.

The data path never touches the conductor: ``Publication.offer`` and ``Image.poll`` are native
calls on the mapped log and the position counters in the CnC.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from types import ModuleType
from typing import TYPE_CHECKING, Any

from logbuf.channel_uri import check_stream_id
from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.broadcast import CopyBroadcastReceiver
from logbuf.conduit.cnc import ClientLivenessLock, CncFile, cnc_driver_heartbeat_ms
from logbuf.conduit.error_log import epoch_ms
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer
from logbuf.conduit.system_counters_descriptor import SLOTS, SystemCounterId
from logbuf.directory import ENV_PREFIX, DirectoryPermissionError, check_directory, resolve_dir
from logbuf.durations import format_duration_ns, renamed_duration_keywords
from logbuf.errors import ClosedError, ConfigurationError, DriverTimeoutError, ErrorCode, RegistrationError
from logbuf.logbuffer.image import FragmentBatch
from logbuf.logbuffer.image import Image as _Image
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.publication import Publication as _Publication
from logbuf.logging_config import library_logger
from logbuf.native import SubscriptionCore
from logbuf.shm import ShmError

_INT32 = struct.Struct("<i")
_INT64 = struct.Struct("<q")

if TYPE_CHECKING:
    from logbuf.client.aio import AsyncIdle
    from logbuf.client.topics import TopicDirectory, TopicPublication, TopicSubscription

__all__ = ["Aeron", "Context", "Image", "Publication", "Subscription"]

GROUP_ACCESS_ENV = ENV_PREFIX + "GROUP_ACCESS"
ASYNC_YIELD_EVERY = 64
"""An awaited offer or poll that finds work does not wait; every this many in a row, one yields to the event
loop once, so a busy stream cannot starve the loop's other tasks (the conductor's keepalives among them)."""
RESOURCE_LINGER_NS = 3_000_000_000
"""Closed images and logs stay mapped this long: a poll still running on another thread is safe."""


@renamed_duration_keywords(
    {
        "driver_timeout_ms": ("driver_timeout_ns", 1_000_000),
        "keepalive_interval_ms": ("keepalive_interval_ns", 1_000_000),
    }
)
@dataclass
class Context:
    """Client settings. ``dir``: where the driver lives (default ``LOGBUF_DIR`` or /dev/shm/logbuf-<user>).
    Durations are integer nanoseconds (``driver_timeout_ns=5_000_000_000``); the old ``*_ms`` keywords still
    work, with a DeprecationWarning, for one release."""

    dir: str = ""
    driver_timeout_ns: int = 10_000_000_000
    """A driver whose CnC heartbeat is older than this is dead; a command unanswered this long fails."""
    keepalive_interval_ns: int = 500_000_000
    """How often the conductor tells the driver this client is alive (and checks the driver's heartbeat)."""
    error_handler: Callable[[BaseException], None] | None = None
    on_available_image: Callable[[Image], None] | None = None
    on_unavailable_image: Callable[[Image], None] | None = None
    use_conductor_thread: bool = True
    driver_agent_invoker: Callable[[], int] | None = None
    """An embedded driver's duty cycle (``MediaDriver.invoke`` of a driver launched with
    ``invoker=True`` on this thread): called while a command waits for the driver, instead of sleeping,
    since nothing else runs that driver."""
    group_access: bool = False
    """Trust a driver directory owned by one of this user's groups, as a driver run with
    ``--group-access`` by another member makes (also ``LOGBUF_GROUP_ACCESS=true``)."""
    clock_ns: Callable[[], int] = field(default=time.monotonic_ns, repr=False, compare=False)
    """The monotonic clock the conductor's timers and command deadlines read (keepalives, lingering
    resources, the driver timeout). Tests give a fake clock's, as they do to the driver's context."""
    epoch_clock_ms: Callable[[], int] = field(default=epoch_ms, repr=False, compare=False)
    """Wall-clock milliseconds, compared with the driver's heartbeat in the CnC (which the driver writes
    from its own ``epoch_clock_ms``)."""
    pre_touch_mapped_memory: bool = True
    """Map every page of a log when it is mapped (a publication added, an image available) rather than on
    first use: a page fault on the data path cost 20-30 us here, on every 4 KiB of a fresh log (every
    64th 32-byte message), where mapping a 64 MiB-term IPC log's 192 MiB up front costs ~50 ms once,
    on the client conductor. Aeron has the same setting, off by default there."""

    def conclude(self) -> Context:
        self.dir = resolve_dir(self.dir or None)
        if os.environ.get(GROUP_ACCESS_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
            self.group_access = True
        if self.driver_timeout_ns <= 0:
            raise ConfigurationError(f"driver_timeout_ns={self.driver_timeout_ns} must be positive")
        if self.keepalive_interval_ns <= 0:
            raise ConfigurationError(f"keepalive_interval_ns={self.keepalive_interval_ns} must be positive")
        return self


def _aio() -> ModuleType:
    """The asyncio module, imported when first awaited (a plain client never loads asyncio)."""
    from logbuf.client import aio

    return aio


class Publication(_Publication):
    """A publication registered with the media driver (concurrent or exclusive)."""

    _async_calls = 0

    def __new__(
        cls,
        conductor: ClientConductor,
        registration_id: int,
        channel: str,
        log_file_name: str,
        log_buffers: LogBuffers,
        limit_offset: int,
        exclusive: bool,
    ) -> Publication:
        # The native core takes its log and limit counter when it is made (in tp_new), before __init__.
        return super().__new__(cls, log_buffers.view, conductor.cnc.counters_values, limit_offset, exclusive, None)

    def __init__(
        self,
        conductor: ClientConductor,
        registration_id: int,
        channel: str,
        log_file_name: str,
        log_buffers: LogBuffers,
        limit_offset: int,
        exclusive: bool,
    ) -> None:
        """Made by the client conductor from the driver's PUBLICATION_READY (``limit_offset``: where the
        publisher-limit counter is in the CnC's counter values); use :meth:`Aeron.add_publication`."""
        self._conductor = conductor
        self.registration_id = registration_id
        self.channel = channel
        self._log_file_name = log_file_name
        self._log_buffers = log_buffers

    @property
    def log_file_name(self) -> str:
        """The path of the log this publication writes (the driver's file)."""
        return self._log_file_name

    def close(self) -> None:
        """Remove the publication from the driver; further offers return CLOSED."""
        if self.is_closed:
            return
        super().close()
        self._conductor.release_publication(self)

    async def offer_async(
        self,
        buffer: Any,
        reserved_value: int = 0,
        *,
        idle: AsyncIdle | None = None,
        on_refused: Callable[[int], object] | None = None,
    ) -> int:
        """Offer ``buffer``, awaiting (not spinning) while the stream is back-pressured or not connected:
        the new position. ``on_refused(result)`` hears of each refusal that made it wait (a metric's hook).
        Raises :class:`ClosedError` once closed and :class:`~logbuf.client.aio.MaxPositionExceededError` at
        the stream's end. An offer that succeeds at once costs one native call (see :mod:`logbuf.client.aio`)."""
        result = self.offer(buffer, reserved_value)
        if result > 0:
            calls = self._async_calls + 1
            if calls < ASYNC_YIELD_EVERY:
                self._async_calls = calls
                return result
            self._async_calls = 0
            await _aio().yield_to_loop()
            return result
        self._async_calls = 0
        return int(await _aio().offer_when_ready(self, buffer, reserved_value, result, idle, on_refused))

    def add_destination(self, endpoint_channel: str) -> None:
        """Send to one more receiver (``aeron:udp?endpoint=host:port``): a ``control-mode=manual``
        multi-destination publication only. Raises RegistrationError if the driver refuses."""
        self._conductor.destination_command(self, endpoint_channel, add=True)

    def remove_destination(self, endpoint_channel: str) -> None:
        """Stop sending to a destination added with :meth:`add_destination`."""
        self._conductor.destination_command(self, endpoint_channel, add=False)


class Image(_Image):
    """One publisher's stream as seen by a subscription."""

    def __new__(
        cls,
        subscription: Subscription,
        correlation_id: int,
        source_identity: str,
        log_file_name: str,
        log_buffers: LogBuffers,
        counters_values: Any,
        position_offset: int,
    ) -> Image:
        # The native core takes its log and subscriber-position counter when it is made, before __init__.
        return super().__new__(cls, log_buffers.view, counters_values, position_offset)

    def __init__(
        self,
        subscription: Subscription,
        correlation_id: int,
        source_identity: str,
        log_file_name: str,
        log_buffers: LogBuffers,
        counters_values: Any,
        position_offset: int,
    ) -> None:
        """Made by the client conductor from the driver's AVAILABLE_IMAGE (``position_offset``: where the
        subscriber-position counter is in ``counters_values``)."""
        self.subscription = subscription
        self.correlation_id = correlation_id
        self.source_identity = source_identity
        self.channel = subscription.channel
        self._log_file_name = log_file_name
        self._log_buffers = log_buffers

    @property
    def log_file_name(self) -> str:
        """The path of the log this image reads (the driver's file)."""
        return self._log_file_name


class Subscription(SubscriptionCore):
    """Receives from every image (publisher session) matching its channel and stream id. ``poll`` is
    native (:class:`~logbuf.native.SubscriptionCore`): round-robin over the images, no Python frame."""

    _images: tuple[Image, ...]
    _async_calls = 0

    def __init__(
        self,
        conductor: ClientConductor,
        registration_id: int,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], None] | None,
        on_unavailable_image: Callable[[Image], None] | None,
    ) -> None:
        self._conductor = conductor
        self.registration_id = registration_id
        self.channel = channel
        self.stream_id = stream_id
        self.on_available_image = on_available_image
        self.on_unavailable_image = on_unavailable_image
        self._images = ()
        self._round_robin = 0
        self._closed = False

    @property
    def images(self) -> tuple[Image, ...]:
        """The images now connected (a snapshot; the list is replaced, never mutated)."""
        return self._images

    @property
    def image_count(self) -> int:
        return len(self._images)

    @property
    def is_connected(self) -> bool:
        return any(not image.is_closed for image in self._images)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def image_by_session_id(self, session_id: int) -> Image | None:
        for image in self._images:
            if image.session_id == session_id:
                return image
        return None

    def poll_batch(self, batch: FragmentBatch, fragment_limit: int = 0x7FFFFFFF) -> int:
        """The vectorised poll: fill ``batch`` from the next image (round-robin) that has fragments;
        returns how many (``batch.session_ids`` says whose). See :meth:`Image.poll_batch`."""
        images = self._images
        count = len(images)
        if count == 1:
            return images[0].poll_batch(batch, fragment_limit)
        for _ in range(count):
            start = self._round_robin = (self._round_robin + 1) % count
            n = images[start].poll_batch(batch, fragment_limit)
            if n:
                return n
        return 0

    def controlled_poll(self, handler: Callable[[memoryview, Any], Any], fragment_limit: int) -> int:
        images = self._images
        count = len(images)
        if count == 0:
            return 0
        start = self._round_robin = (self._round_robin + 1) % count
        fragments = 0
        for i in range(count):
            fragments += images[(start + i) % count].controlled_poll(handler, fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments

    def block_poll(self, handler: Callable[[memoryview, int, int, int], Any], block_length_limit: int) -> int:
        """Block-poll each image once; returns the bytes consumed."""
        consumed = 0
        for image in self._images:
            consumed += image.block_poll(handler, block_length_limit)
        return consumed

    async def poll_async(
        self, handler: Callable[[memoryview, Any], Any], fragment_limit: int = 256, idle: AsyncIdle | None = None
    ) -> int:
        """:meth:`poll`, awaiting (backing off, not spinning) until at least one fragment is delivered: the
        number delivered. Raises :class:`ClosedError` once the subscription is closed."""
        count = self.poll(handler, fragment_limit)
        if count:
            calls = self._async_calls + 1
            if calls < ASYNC_YIELD_EVERY:
                self._async_calls = calls
                return count
            self._async_calls = 0
            await _aio().yield_to_loop()
            return count
        self._async_calls = 0
        return int(await _aio().poll_when_ready(self, handler, fragment_limit, idle))

    def messages(self, fragment_limit: int = 256, idle: AsyncIdle | None = None) -> AsyncIterator[bytes]:
        """``async for message in subscription.messages()``: every whole message as ``bytes`` (fragments
        reassembled), in order per publisher, awaiting when there are none; ends when the subscription closes."""
        iterator: AsyncIterator[bytes] = _aio().messages(self, fragment_limit, idle)
        return iterator

    def _add_image(self, image: Image) -> None:
        self._images = self._images + (image,)

    def _remove_image(self, correlation_id: int) -> Image | None:
        for image in self._images:
            if image.correlation_id == correlation_id:
                self._images = tuple(i for i in self._images if i is not image)
                return image
        return None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._conductor.release_subscription(self)

    def internal_close(self) -> list[Image]:
        """Closed by the client conductor itself (the client closing, the driver gone or timing it out): no
        command to the driver. Returns the images it held, for the conductor to retire."""
        self._closed = True
        images, self._images = self._images, ()
        return list(images)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Subscription(registration_id={self.registration_id}, channel={self.channel!r}, "
            f"stream_id={self.stream_id}, images={len(self._images)})"
        )


@dataclass
class _Pending:
    correlation_id: int
    response: tuple[int, Any] | None = None


@dataclass
class _MappedLog:
    log: LogBuffers
    ref_count: int = 0
    linger_until_ns: int = 0
    users: list[Any] = field(default_factory=list)


class ClientConductor:
    """The client's side of the driver conversation (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.cnc = _await_cnc(ctx)
        self.to_driver = ManyToOneRingBuffer(self.cnc.to_driver)
        self.to_clients = CopyBroadcastReceiver(self.cnc.to_clients, raise_on_lap=False)
        self.client_id = self.to_driver.next_correlation_id()
        self._liveness_lock = ClientLivenessLock(self.cnc.path, self.client_id)  # so no one else can close us
        self._lock = threading.RLock()
        self._pending: dict[int, _Pending] = {}
        self._response_handlers = self._response_table()
        self._subscriptions: dict[int, Subscription] = {}
        self._publications: dict[int, Publication] = {}
        self._logs: dict[str, _MappedLog] = {}
        self._lingering: list[tuple[int, Any]] = []
        self._closed = False
        self._topic_directory: TopicDirectory | None = None
        self._driver_error: DriverTimeoutError | None = None
        self._next_keepalive_ns = 0
        self._log = library_logger(role="client", client_id=self.client_id)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._send(cmd.CLIENT_KEEPALIVE, cmd.CorrelatedCommand(self.client_id, 0).encode())
        if ctx.use_conductor_thread:
            self._thread = threading.Thread(target=self._run, name=f"logbuf-client-{self.client_id}", daemon=True)
            self._thread.start()

    # -- duty cycle ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(0.01):
            try:
                self.do_work()
            except Exception as e:  # the conductor thread must not die silently
                self._handle_error(e)

    def do_work(self) -> int:
        with self._lock:
            if self._closed:
                return 0
            work = self.to_clients.receive(self._on_response)
            now_ns = self.ctx.clock_ns()
            if now_ns >= self._next_keepalive_ns:
                self._next_keepalive_ns = now_ns + self.ctx.keepalive_interval_ns
                self._check_driver()
                if self._driver_error is None:
                    self._send(cmd.CLIENT_KEEPALIVE, cmd.CorrelatedCommand(self.client_id, 0).encode())
                self._close_lingering(now_ns)
            return work

    def try_do_work(self) -> int:
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            return self.do_work()
        finally:
            self._lock.release()

    def _check_driver(self) -> None:
        if self._driver_error is not None:
            return
        age_ms = self.ctx.epoch_clock_ms() - cnc_driver_heartbeat_ms(self.cnc)
        if age_ms * 1_000_000 > self.ctx.driver_timeout_ns:
            self._driver_error = DriverTimeoutError(
                f"media driver in {self.ctx.dir} has not heartbeated for {age_ms} ms "
                f"(driver_timeout_ns={format_duration_ns(self.ctx.driver_timeout_ns)})"
            )
            self._log.error("client.driver_timeout", age_ms=age_ms)
            self._force_close_resources()
            self._handle_error(self._driver_error)

    def _handle_error(self, error: BaseException) -> None:
        if self.ctx.error_handler is not None:
            self.ctx.error_handler(error)

    def _ensure_usable(self) -> None:
        if self._driver_error is not None:
            raise self._driver_error
        if self._closed:
            raise ClosedError("client is closed")

    # -- commands -----------------------------------------------------------------------------------------
    def _send(self, msg_type_id: int, payload: bytes) -> None:
        deadline_ns = self.ctx.clock_ns() + self.ctx.driver_timeout_ns
        while not self.to_driver.write(msg_type_id, payload):
            if self.ctx.clock_ns() > deadline_ns:
                timeout = format_duration_ns(self.ctx.driver_timeout_ns)
                raise DriverTimeoutError(f"command ring full for {timeout}: driver not consuming")
            self._idle(0.001)

    def _idle(self, seconds: float) -> None:
        """Wait for the driver: run it if it is embedded in this thread, else sleep."""
        invoker = self.ctx.driver_agent_invoker
        if invoker is None:
            time.sleep(seconds)
        elif not invoker():
            os.sched_yield()

    def _await(self, correlation_id: int, msg_type_id: int, payload: bytes) -> tuple[int, Any]:
        pending = self._pending[correlation_id] = _Pending(correlation_id)
        try:
            self._send(msg_type_id, payload)
            deadline_ns = self.ctx.clock_ns() + self.ctx.driver_timeout_ns
            while pending.response is None:
                self.do_work()
                if pending.response is not None:
                    break
                self._ensure_usable()
                if self.ctx.clock_ns() > deadline_ns:
                    with self._lock:  # a dead driver closes this client's resources, whenever the keepalive is due
                        self._check_driver()
                    self._ensure_usable()
                    raise DriverTimeoutError(
                        f"no response from the media driver in {self.ctx.dir} within "
                        f"{format_duration_ns(self.ctx.driver_timeout_ns)} for {cmd.COMMAND_NAMES.get(msg_type_id, msg_type_id)}"
                    )
                self._idle(0.0002)
        finally:
            self._pending.pop(correlation_id, None)
        type_id, response = pending.response
        if type_id == cmd.ON_ERROR:
            raise RegistrationError(correlation_id, response.error_code, response.message)
        return type_id, response

    def _on_response(self, msg_type_id: int, payload: bytes) -> None:
        handler = self._response_handlers.get(msg_type_id)
        if handler is not None:  # responses of types this client does not know are another client's business
            handler(msg_type_id, payload)

    def _response_table(self) -> dict[int, Callable[[int, bytes], None]]:
        """What the conductor does with each response type the driver broadcasts (as the driver's command table)."""
        return {
            cmd.ON_ERROR: self._completes(cmd.ErrorResponse.decode, attrgetter("offending_correlation_id")),
            cmd.ON_PUBLICATION_READY: self._completes(cmd.PublicationReady.decode),
            cmd.ON_EXCLUSIVE_PUBLICATION_READY: self._completes(cmd.PublicationReady.decode),
            cmd.ON_SUBSCRIPTION_READY: self._completes(cmd.SubscriptionReady.decode),
            cmd.ON_OPERATION_SUCCESS: self._completes(cmd.OperationSuccess.decode),
            cmd.ON_AVAILABLE_IMAGE: lambda _, payload: self._on_available_image(cmd.ImageReady.decode(payload)),
            cmd.ON_UNAVAILABLE_IMAGE: lambda _, payload: self._on_unavailable_image(cmd.ImageMessage.decode(payload)),
            cmd.ON_CLIENT_TIMEOUT: self._on_client_timeout,
        }

    def _completes(
        self, decode: Callable[[bytes], Any], correlation_id: Callable[[Any], int] = attrgetter("correlation_id")
    ) -> Callable[[int, bytes], None]:
        """A handler for a response that answers a command: decoded, it completes the command it names."""

        def on_response(msg_type_id: int, payload: bytes) -> None:
            response = decode(payload)
            self._complete(correlation_id(response), msg_type_id, response)

        return on_response

    def _on_client_timeout(self, msg_type_id: int, payload: bytes) -> None:
        if cmd.ClientTimeout.decode(payload).client_id == self.client_id:
            self._log.error("client.timed_out_by_driver")
            self._force_close_resources()
            self._liveness_lock.release()
            self._closed = True
            self._handle_error(ClosedError("the media driver timed this client out"))

    def _complete(self, correlation_id: int, msg_type_id: int, response: Any) -> None:
        pending = self._pending.get(correlation_id)
        if pending is not None:
            pending.response = (msg_type_id, response)

    # -- logs -----------------------------------------------------------------------------------------------
    def _map_log(self, path: str) -> LogBuffers:
        mapped = self._logs.get(path)
        if mapped is None:
            try:
                log = LogBuffers.open_file(path, populate=self.ctx.pre_touch_mapped_memory)
                mapped = self._logs[path] = _MappedLog(log)
            except ShmError as e:
                raise RegistrationError(0, ErrorCode.GENERIC_ERROR, f"cannot map log {path}: {e}") from e
        mapped.ref_count += 1
        return mapped.log

    def _unmap_log(self, path: str) -> None:
        mapped = self._logs.get(path)
        if mapped is not None:
            mapped.ref_count -= 1
            if mapped.ref_count <= 0:
                del self._logs[path]
                self._linger(mapped.log)

    def _linger(self, resource: Any) -> None:
        self._lingering.append((self.ctx.clock_ns() + RESOURCE_LINGER_NS, resource))

    def _close_lingering(self, now_ns: int) -> None:
        keep = []
        for deadline, resource in self._lingering:
            if now_ns < deadline:
                keep.append((deadline, resource))
                continue
            try:
                resource.close()
            except BufferError:  # a view handed to a handler is still alive: try again later
                keep.append((now_ns + RESOURCE_LINGER_NS, resource))
        self._lingering = keep

    # -- publications -------------------------------------------------------------------------------------
    def add_publication(self, channel: str, stream_id: int, *, exclusive: bool) -> Publication:
        check_stream_id(stream_id)
        with self._lock:
            self._ensure_usable()
            correlation_id = self.to_driver.next_correlation_id()
            command = cmd.PublicationCommand(self.client_id, correlation_id, stream_id, channel)
            _, ready = self._await(
                correlation_id, cmd.ADD_EXCLUSIVE_PUBLICATION if exclusive else cmd.ADD_PUBLICATION, command.encode()
            )
            log = self._map_log(ready.log_file_name)
            publication = Publication(
                self,
                correlation_id,
                channel,
                ready.log_file_name,
                log,
                cd.values_offset(ready.position_limit_counter_id),
                exclusive,
            )
            self._publications[correlation_id] = publication
            self._log.info(
                "client.publication_added",
                registration_id=correlation_id,
                channel=channel,
                stream_id=stream_id,
                session_id=ready.session_id,
                exclusive=exclusive,
            )
            return publication

    def release_publication(self, publication: Publication) -> None:
        with self._lock:
            if self._publications.pop(publication.registration_id, None) is None:
                return
            self._unmap_log(publication._log_file_name)
            if self._closed or self._driver_error is not None:
                return
            correlation_id = self.to_driver.next_correlation_id()
            command = cmd.RemoveCommand(self.client_id, correlation_id, publication.registration_id)
            self._await(correlation_id, cmd.REMOVE_PUBLICATION, command.encode())

    def destination_command(self, publication: Publication, channel: str, *, add: bool) -> None:
        with self._lock:
            self._ensure_usable()
            if publication.is_closed:
                raise ClosedError("publication is closed")
            correlation_id = self.to_driver.next_correlation_id()
            command = cmd.DestinationCommand(self.client_id, correlation_id, publication.registration_id, channel)
            self._await(correlation_id, cmd.ADD_DESTINATION if add else cmd.REMOVE_DESTINATION, command.encode())

    # -- topics -------------------------------------------------------------------------------------------
    def topic_directory(self) -> TopicDirectory:
        """This client's view of the driver's topic registry, mapped on first use."""
        with self._lock:
            self._ensure_usable()
            if self._topic_directory is None:
                from logbuf.client.topics import TopicDirectory

                self._topic_directory = TopicDirectory(self.ctx.dir)
            return self._topic_directory

    # -- subscriptions ------------------------------------------------------------------------------------
    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], None] | None,
        on_unavailable_image: Callable[[Image], None] | None,
        factory: Callable[..., Subscription] | None = None,
    ) -> Subscription:
        """``factory``: makes the subscription object (a TopicSubscription) from the arguments Subscription takes."""
        check_stream_id(stream_id)
        with self._lock:
            self._ensure_usable()
            correlation_id = self.to_driver.next_correlation_id()
            subscription = (factory or Subscription)(
                self,
                correlation_id,
                channel,
                stream_id,
                on_available_image or self.ctx.on_available_image,
                on_unavailable_image or self.ctx.on_unavailable_image,
            )
            # Registered before the command goes out: image events may follow the ready response at once.
            self._subscriptions[correlation_id] = subscription
            command = cmd.SubscriptionCommand(self.client_id, correlation_id, -1, stream_id, channel)
            try:
                self._await(correlation_id, cmd.ADD_SUBSCRIPTION, command.encode())
            except BaseException:
                self._subscriptions.pop(correlation_id, None)
                raise
            self._log.info(
                "client.subscription_added", registration_id=correlation_id, channel=channel, stream_id=stream_id
            )
            return subscription

    def release_subscription(self, subscription: Subscription) -> None:
        with self._lock:
            if self._subscriptions.pop(subscription.registration_id, None) is None:
                return
            for image in subscription.images:
                subscription._remove_image(image.correlation_id)
                self._retire_image(image)
            if self._closed or self._driver_error is not None:
                return
            correlation_id = self.to_driver.next_correlation_id()
            command = cmd.RemoveCommand(self.client_id, correlation_id, subscription.registration_id)
            self._await(correlation_id, cmd.REMOVE_SUBSCRIPTION, command.encode())

    def _corrupt_log_frames_offset(self) -> int | None:
        """Offset of the driver's "Corrupt log frames" counter in the CnC's counter values, if the record in its
        slot is that system counter (a driver of another version may have another counter there)."""
        slot = SLOTS[SystemCounterId.CORRUPT_LOG_FRAMES]
        values, metadata = self.cnc.counters_values, self.cnc.counters_metadata
        if cd.metadata_offset(slot + 1) > len(metadata) or cd.values_offset(slot + 1) > len(values):
            return None
        (type_id,) = _INT32.unpack_from(metadata, cd.metadata_offset(slot) + cd.TYPE_ID_OFFSET)
        (registration_id,) = _INT64.unpack_from(values, cd.values_offset(slot) + cd.REGISTRATION_ID_OFFSET)
        if type_id != cd.LOGBUF_SYSTEM_COUNTER_TYPE_ID or registration_id != SystemCounterId.CORRUPT_LOG_FRAMES:
            return None
        return cd.values_offset(slot)

    def _on_available_image(self, event: cmd.ImageReady) -> None:
        subscription = self._subscriptions.get(event.subscription_registration_id)
        if subscription is None or subscription.is_closed:
            return
        log = self._map_log(event.log_file_name)
        image = Image(
            subscription,
            event.correlation_id,
            event.source_identity,
            event.log_file_name,
            log,
            self.cnc.counters_values,
            cd.values_offset(event.subscriber_position_id),
        )
        fault_counter = self._corrupt_log_frames_offset()
        if fault_counter is not None:  # the poll counts a corrupt frame it meets there, as well as raising
            image.set_fault_counter(self.cnc.counters_values, fault_counter)
        subscription._add_image(image)
        if subscription.on_available_image is not None:
            try:
                subscription.on_available_image(image)
            except Exception as e:
                self._handle_error(e)

    def _on_unavailable_image(self, event: cmd.ImageMessage) -> None:
        subscription = self._subscriptions.get(event.subscription_registration_id)
        if subscription is None:
            return
        image = subscription._remove_image(event.correlation_id)
        if image is None:
            return
        if subscription.on_unavailable_image is not None:
            try:
                subscription.on_unavailable_image(image)
            except Exception as e:
                self._handle_error(e)
        self._retire_image(image)

    def _retire_image(self, image: Image) -> None:
        """Images close after a linger, so a poll in flight on another thread stays safe."""
        self._linger(image)
        self._unmap_log(image._log_file_name)

    # -- closing --------------------------------------------------------------------------------------------
    def _force_close_resources(self) -> None:
        for publication in list(self._publications.values()):
            _Publication.close(publication)
        for subscription in list(self._subscriptions.values()):
            for image in subscription.internal_close():
                self._linger(image)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            # As Aeron's client: close everything locally and tell the driver once, without waiting
            # (it releases all of this client's resources on CLIENT_CLOSE, or on its liveness timeout
            # if the command never arrives), so closing never blocks on a dead driver.
            self._force_close_resources()
            self._liveness_lock.release()  # first: the driver honours a CLIENT_CLOSE only from an unlocked client
            if self._driver_error is None:
                self.to_driver.write(cmd.CLIENT_CLOSE, cmd.CorrelatedCommand(self.client_id, 0).encode())
            self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2)
        for _, resource in self._lingering:
            try:
                resource.close()
            except BufferError:
                pass
        self._lingering.clear()
        for mapped in self._logs.values():
            try:
                mapped.log.close()
            except BufferError:
                pass
        self._logs.clear()
        if self._topic_directory is not None:
            self._topic_directory.close()
        try:
            self.cnc.close()
        except BufferError:  # a view handed to user code is still alive: the mapping goes with the process
            pass
        self._log.info("client.closed")


def _await_cnc(ctx: Context) -> CncFile:
    """Map the driver's CnC, waiting up to the driver timeout for an active driver."""
    deadline_ns = ctx.clock_ns() + ctx.driver_timeout_ns
    last_error: Exception | None = None
    while True:
        try:
            check_directory(ctx.dir, group_access=ctx.group_access)  # DirectoryPermissionError: no point waiting
            cnc = CncFile.open(ctx.dir)
            age_ms = ctx.epoch_clock_ms() - cnc_driver_heartbeat_ms(cnc)
            if age_ms * 1_000_000 <= ctx.driver_timeout_ns:
                return cnc
            cnc.close()
            last_error = DriverTimeoutError(f"media driver in {ctx.dir} is not alive (heartbeat {age_ms} ms old)")
        except DirectoryPermissionError:
            raise
        except (ShmError, ValueError, OSError) as e:
            last_error = e
        if ctx.clock_ns() > deadline_ns:
            raise DriverTimeoutError(
                f"no active media driver found in {ctx.dir} within {format_duration_ns(ctx.driver_timeout_ns)}: {last_error}"
            )
        time.sleep(0.01)


class Aeron:
    """A connection to a media driver (context manager).

    with Aeron.connect() as aeron:
        pub = aeron.add_publication("aeron:ipc", 10)
        sub = aeron.add_subscription("aeron:ipc", 10)
    """

    def __init__(self, ctx: Context) -> None:
        self.context = ctx
        self._conductor = ClientConductor(ctx)

    @classmethod
    def connect(cls, context: Context | None = None) -> Aeron:
        """Map the driver's CnC (waiting up to the driver timeout) and start the client conductor."""
        return cls((context or Context()).conclude())

    @property
    def client_id(self) -> int:
        return self._conductor.client_id

    @property
    def is_closed(self) -> bool:
        return self._conductor._closed

    @property
    def cnc(self) -> CncFile:
        return self._conductor.cnc

    def add_publication(self, channel: str, stream_id: int) -> Publication:
        """A concurrent publication (shared with other publishers of the same channel and stream)."""
        return self._conductor.add_publication(channel, stream_id, exclusive=False)

    def add_exclusive_publication(self, channel: str, stream_id: int) -> Publication:
        """A publication with its own session, for a single writer thread."""
        return self._conductor.add_publication(channel, stream_id, exclusive=True)

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: Callable[[Image], None] | None = None,
        on_unavailable_image: Callable[[Image], None] | None = None,
    ) -> Subscription:
        return self._conductor.add_subscription(channel, stream_id, on_available_image, on_unavailable_image)

    def add_topic_publication(self, channel: str, stream_id: int, *, exclusive: bool = False) -> TopicPublication:
        """A publication whose messages carry topic names: ``offer(topic, payload)`` or ``topic(name).offer(payload)``
        (see :mod:`logbuf.client.topics`). Any number of topics share the stream."""
        from logbuf.client.topics import TopicPublication

        directory = self._conductor.topic_directory()
        return TopicPublication(self._conductor.add_publication(channel, stream_id, exclusive=exclusive), directory)

    def add_topic_subscription(
        self,
        channel: str,
        stream_id: int,
        patterns: Iterable[str],
        on_available_image: Callable[[Image], None] | None = None,
        on_unavailable_image: Callable[[Image], None] | None = None,
    ) -> TopicSubscription:
        """A subscription that delivers only the messages whose topic matches one of ``patterns`` (exact names,
        ``*`` for one token, ``>`` for the rest), filtered inside the native poll."""
        from logbuf.client.topics import TopicSubscription
        from logbuf.topic_names import check_pattern

        patterns = [check_pattern(p) for p in patterns]
        directory = self._conductor.topic_directory()

        def factory(
            conductor: ClientConductor,
            registration_id: int,
            channel_: str,
            stream_id_: int,
            on_available: Callable[[Image], None] | None,
            on_unavailable: Callable[[Image], None] | None,
        ) -> TopicSubscription:
            return TopicSubscription(
                conductor, registration_id, channel_, stream_id_, on_available, on_unavailable, patterns, directory
            )

        subscription = self._conductor.add_subscription(
            channel, stream_id, on_available_image, on_unavailable_image, factory
        )
        assert isinstance(subscription, TopicSubscription)
        subscription._publish_patterns()
        return subscription

    def do_work(self) -> int:
        """Run one client-conductor duty cycle (when ``use_conductor_thread`` is off)."""
        return self._conductor.do_work()

    def try_do_work(self) -> int:
        """:meth:`do_work`, unless another thread holds the conductor (a command waiting for the driver,
        which runs the duty cycle itself meanwhile): then nothing, at once. For an event loop that must not
        block (:class:`logbuf.client.aio.AsyncAeron`)."""
        return self._conductor.try_do_work()

    def close(self) -> None:
        self._conductor.close()

    def __enter__(self) -> Aeron:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Aeron(client_id={self.client_id}, dir={self.context.dir!r})"
