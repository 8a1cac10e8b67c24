"""Publication images: made when a receive endpoint asks (a SETUP for a subscribed stream, through the
conductor proxy), handed to the receiver through its proxy, retired when they go inactive.

What a remote peer can make the driver allocate is bounded: a SETUP asking for a term longer than
``max_image_term_length``, or arriving while the endpoint holds ``max_images_per_endpoint`` images,
is counted ("Images rejected") and dropped before anything is made. A creation that fails half-way
leaves nothing behind: the log file is removed and its counters freed.
"""

from __future__ import annotations

import contextlib
import os

import structlog

from logbuf.conduit.error_log import DistinctErrorLog
from logbuf.conduit.loss_report import LossReport
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer
from logbuf.driver.conductor_registry import ConductorRegistry, ReceiveChannel
from logbuf.driver.context import DriverContext
from logbuf.driver.lifecycle import ImageState
from logbuf.driver.nak_delay import OptimalMulticastDelayGenerator
from logbuf.driver.proxies import ReceiverCommands
from logbuf.driver.publication_image import PublicationImage
from logbuf.driver.stream_counters import StreamCounters
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.driver.udp import Address, ImageSettings, ReceiveChannelEndpoint
from logbuf.errors import LogbufError
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.protocol.setup import SetupFrame

__all__ = ["ImageHandler"]


class ImageHandler:
    """Creates, retires and times publication images."""

    def __init__(
        self,
        ctx: DriverContext,
        registry: ConductorRegistry,
        to_driver: ManyToOneRingBuffer,
        receiver: ReceiverCommands,
        system_counters: SystemCounters,
        error_log: DistinctErrorLog,
        loss_report: LossReport | None,
    ) -> None:
        self.ctx = ctx
        self.registry = registry
        self.counters = registry.counters
        self.to_driver = to_driver
        self.receiver = receiver
        self.system_counters = system_counters
        self.error_log = error_log
        self.loss_report = loss_report
        self.directory = os.path.join(ctx.dir, "images")
        self._log = structlog.get_logger().bind(role="conductor")

    def on_create_publication_image(self, endpoint: ReceiveChannelEndpoint, setup: SetupFrame, source: Address) -> None:
        """A SETUP for a subscribed stream without an active image: create the image, hand it to the
        receiver, link subscribers."""
        receive_channel = self._receive_channel_of(endpoint)
        if receive_channel is None or not self._admits(receive_channel, endpoint, setup):
            return  # the endpoint was closed since (a queued request), or the SETUP was refused
        registration_id = self.to_driver.next_correlation_id()
        path = os.path.join(self.directory, f"{registration_id}.logbuffer")
        try:
            log = LogBuffers.create_file(
                path,
                mode=self.ctx.file_mode,
                term_length=setup.term_length,
                mtu_length=setup.mtu_length,
                session_id=setup.session_id,
                stream_id=setup.stream_id,
                initial_term_id=setup.initial_term_id,
                correlation_id=registration_id,
            )
        except (OSError, ValueError, LogbufError) as e:  # e.g. ShmError: the file exists
            self._reject(f"image for stream {setup.stream_id} on {endpoint.channel} rejected: {e}")
            return
        allocated: list[int] = []
        try:
            image = self._new_image(receive_channel, endpoint, setup, source, registration_id, path, log, allocated)
        except BaseException:
            for counter_id in allocated:
                self.counters.free(counter_id)
            log.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise
        self._added(receive_channel, endpoint, image)

    def _admits(self, receive_channel: ReceiveChannel, endpoint: ReceiveChannelEndpoint, setup: SetupFrame) -> bool:
        key = (setup.session_id, setup.stream_id)
        others = len(receive_channel.images) - (key in receive_channel.images)
        if setup.term_length > self.ctx.max_image_term_length or others >= self.ctx.max_images_per_endpoint:
            self.system_counters.increment(SystemCounterId.IMAGES_REJECTED)
            return False  # remote input: counted, not logged per SETUP
        if not self.counters.has_room(3 + len(self.registry.stream_subscriptions(setup.stream_id))):
            self._reject(
                f"image for stream {setup.stream_id} on {endpoint.channel} rejected: the counters are full"
                f" (capacity {self.counters.capacity})"
            )  # one distinct error however many SETUPs: the text names no session or source
            return False
        return True

    def _reject(self, error: str) -> None:
        self.system_counters.increment(SystemCounterId.IMAGES_REJECTED)
        self.system_counters.increment(SystemCounterId.ERRORS)
        self.error_log.record(error)

    def _added(
        self, receive_channel: ReceiveChannel, endpoint: ReceiveChannelEndpoint, image: PublicationImage
    ) -> None:
        key = (image.session_id, image.stream_id)
        old = receive_channel.images.get(key)
        if old is not None:
            self.retire_image(old)
        receive_channel.images[key] = image
        self.registry.images.append(image)
        self.receiver.new_publication_image(endpoint, image)
        self._log.info(
            "image.created",
            registration_id=image.registration_id,
            session_id=image.session_id,
            stream_id=image.stream_id,
            source=image.source_identity,
            join_position=image.join_position,
        )
        for link in self.registry.stream_subscriptions(image.stream_id).values():
            if (
                link.endpoint_key is not None
                and link.stream_id == image.stream_id
                and link.canonical == endpoint.channel
            ):
                self.registry.link_subscriber(image, link)

    def _new_image(
        self,
        receive_channel: ReceiveChannel,
        endpoint: ReceiveChannelEndpoint,
        setup: SetupFrame,
        source: Address,
        registration_id: int,
        path: str,
        log: LogBuffers,
        allocated: list[int],
    ) -> PublicationImage:
        """The image over a new log, its rcv-hwm, rcv-pos and rcv-naks-sent counters appended to ``allocated`` as they
        are made (the caller frees them if this raises)."""
        log.seek_to(setup.active_term_id, setup.term_offset)
        join = log.tail_position()
        original, owner_id = self._first_subscription(setup.stream_id, endpoint.channel)
        factory = StreamCounters(self.counters, registration_id, setup.session_id, setup.stream_id, original, owner_id)
        allocated.append(factory.receiver_hwm(join))
        allocated.append(factory.receiver_position(join))
        allocated.append(factory.receiver_naks_sent())
        settings = receive_channel.image_settings.get(setup.stream_id, ImageSettings())
        return PublicationImage(
            registration_id=registration_id,
            session_id=setup.session_id,
            stream_id=setup.stream_id,
            channel=endpoint.channel,
            source_identity=f"{source[0]}:{source[1]}",
            source_address=source,
            log=log,
            log_file_name=path,
            counters=self.counters,
            system_counters=self.system_counters,
            hwm_id=allocated[0],
            rebuild_id=allocated[1],
            receiver_id=endpoint.receiver_id,
            join_position=join,
            window_length=min(settings.window_length or self.ctx.initial_window_length, setup.term_length // 2),
            liveness_timeout_ns=self.ctx.image_liveness_timeout_ns,
            nak_delay_ns=self.ctx.nak_delay_ns if settings.nak_delay_ns is None else settings.nak_delay_ns,
            nak_retry_ns=self.ctx.nak_retry_delay_ns,
            sm_interval_ns=self.ctx.status_message_timeout_ns,
            now_ns=self.ctx.clock_ns(),
            reliable=settings.reliable,
            nak_delay_generator=self._nak_delay_generator(endpoint, settings),
            group_tag=settings.group_tag,
            loss_report=self.loss_report,
            original_channel=original,
            naks_sent_id=allocated[2],
        )

    def _first_subscription(self, stream_id: int, channel: str) -> tuple[str, int]:
        """The channel as the stream's first subscription on ``channel`` gave it, and its client: Aeron labels
        an image's counters with that channel and has that client own them (the canonical channel and no
        client if none)."""
        for link in self.registry.stream_subscriptions(stream_id).values():
            if link.endpoint_key is not None and link.canonical == channel:
                return link.channel, link.client_id
        return channel, 0

    def _nak_delay_generator(
        self, endpoint: ReceiveChannelEndpoint, settings: ImageSettings
    ) -> OptimalMulticastDelayGenerator | None:
        if not endpoint.multicast:
            return None
        return OptimalMulticastDelayGenerator(
            settings.nak_delay_ns or self.ctx.nak_multicast_max_backoff_ns, self.ctx.nak_multicast_group_size
        )

    def _receive_channel_of(self, endpoint: ReceiveChannelEndpoint) -> ReceiveChannel | None:
        for receive_channel in self.registry.receive_endpoints.values():
            if receive_channel.endpoint is endpoint:
                return receive_channel
        return None

    def retire_image(self, image: PublicationImage) -> None:
        self.registry.unlink_all(image)
        key = (image.session_id, image.stream_id)
        for receive_channel in self.registry.receive_endpoints.values():
            if receive_channel.images.get(key) is image:
                del receive_channel.images[key]
                self.receiver.remove_publication_image(receive_channel.endpoint, image)
        image.transition(ImageState.DONE)
        image.close()
        if image in self.registry.images:
            self.registry.images.remove(image)
        self.registry.images_changed = True
        self._log.info(
            "image.removed",
            registration_id=image.registration_id,
            session_id=image.session_id,
            stream_id=image.stream_id,
        )

    def on_timer(self, now_ns: int) -> int:
        """Time every image; retire those gone inactive."""
        work = 0
        for image in list(self.registry.images):
            image.on_time_event(now_ns)
            if image.state is ImageState.INACTIVE:
                self.retire_image(image)
                work += 1
        return work
