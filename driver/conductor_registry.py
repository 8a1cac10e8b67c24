"""What the conductor owns, shared by its handlers: clients, publications, subscriptions, images, the
endpoints it opened, and the links between subscriptions and what they subscribe to.

The handlers (:mod:`~logbuf.driver.publication_handler`, :mod:`~logbuf.driver.subscription_handler`,
:mod:`~logbuf.driver.image_handler`, :mod:`~logbuf.driver.destination_handler`,
:mod:`~logbuf.driver.client_handler`) each change their family's entries here; linking a subscriber
(and telling its client) is here because every family does it. Indexes by stream id keep adding a
stream as cheap with 10,000 others as with 10.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import structlog

from logbuf.conduit.counters import CountersManager
from logbuf.driver.client_command_adapter import CommandError
from logbuf.driver.client_proxy import ClientProxy, ImageSource
from logbuf.driver.ipc_publication import IpcPublication, SubscriberPosition
from logbuf.driver.publication_image import PublicationImage
from logbuf.driver.udp import Address, ImageSettings, ReceiveChannelEndpoint, SendChannelEndpoint
from logbuf.errors import ErrorCode

__all__ = [
    "ClientSession",
    "ConductorRegistry",
    "EndpointKey",
    "ReceiveChannel",
    "Subscribable",
    "SubscriptionLink",
]

EndpointKey = tuple[str, object]
"""A UDP endpoint as a client's registrations hold it: ("send", canonical channel) or ("receive", address)."""


@dataclass
class ClientSession:
    client_id: int
    last_keepalive_ns: int
    heartbeat_counter_id: int
    publication_links: dict[int, IpcPublication] = field(default_factory=dict)
    subscription_ids: set[int] = field(default_factory=set)
    endpoints: dict[EndpointKey, int] = field(default_factory=dict)
    """The UDP endpoints its registrations use, each with how many of them do (``max_client_endpoints``)."""

    @property
    def registrations(self) -> int:
        return len(self.publication_links) + len(self.subscription_ids)

    def hold_endpoint(self, key: EndpointKey) -> None:
        self.endpoints[key] = self.endpoints.get(key, 0) + 1

    def release_endpoint(self, key: EndpointKey) -> None:
        left = self.endpoints.get(key, 0) - 1
        if left > 0:
            self.endpoints[key] = left
        else:
            self.endpoints.pop(key, None)


@dataclass
class SubscriptionLink:
    registration_id: int
    client_id: int
    stream_id: int
    channel: str
    canonical: str
    spy: bool = False
    endpoint_key: Address | None = None  # udp (not spy): the receive endpoint it uses


@dataclass
class ReceiveChannel:
    """The conductor's side of a receive endpoint (the receiver has the endpoint's dispatch state):
    the subscriptions to each stream, their image settings, and the images it created there."""

    endpoint: ReceiveChannelEndpoint
    subscriptions: dict[int, int] = field(default_factory=dict)  # stream id -> how many
    image_settings: dict[int, ImageSettings] = field(default_factory=dict)  # stream id -> its subscriptions'
    images: dict[tuple[int, int], PublicationImage] = field(default_factory=dict)  # (session, stream) -> image


class Subscribable(ImageSource, Protocol):
    """What subscribers link to: an IPC or network publication (spies), or a publication image."""

    @property
    def channel(self) -> str: ...
    @property
    def subscribers(self) -> dict[int, SubscriberPosition]: ...

    def add_subscriber(self, subscription_registration_id: int, client_id: int, channel: str) -> SubscriberPosition: ...

    def remove_subscriber(self, subscription_registration_id: int) -> SubscriberPosition | None: ...


class ConductorRegistry:
    """The conductor's resources, with the links between them."""

    def __init__(self, counters: CountersManager, counters_buffer_length: int, client_proxy: ClientProxy) -> None:
        self.counters = counters
        self.counters_buffer_length = counters_buffer_length
        self.client_proxy = client_proxy
        self.clients: dict[int, ClientSession] = {}
        self.publications: list[IpcPublication] = []
        self.subscriptions: dict[int, SubscriptionLink] = {}
        self.images: list[PublicationImage] = []
        self.send_endpoints: dict[str, SendChannelEndpoint] = {}
        self.receive_endpoints: dict[Address, ReceiveChannel] = {}
        self.publications_by_stream: dict[int, list[IpcPublication]] = {}
        self.subscriptions_by_stream: dict[int, dict[int, SubscriptionLink]] = {}
        self.images_changed = False
        """Set when a subscriber is linked or unlinked: the timer counts active images then (a sum over
        every stream is too dear per command)."""
        self._log = structlog.get_logger().bind(role="conductor")

    # -- indexes ----------------------------------------------------------------------------------------
    def add_publication(self, publication: IpcPublication) -> None:
        self.publications.append(publication)
        self.publications_by_stream.setdefault(publication.stream_id, []).append(publication)

    def remove_publication(self, publication: IpcPublication) -> None:
        self.publications.remove(publication)
        same_stream = self.publications_by_stream[publication.stream_id]
        same_stream.remove(publication)
        if not same_stream:
            del self.publications_by_stream[publication.stream_id]

    def add_subscription(self, link: SubscriptionLink) -> None:
        self.subscriptions[link.registration_id] = link
        self.subscriptions_by_stream.setdefault(link.stream_id, {})[link.registration_id] = link

    def remove_subscription(self, registration_id: int) -> SubscriptionLink | None:
        link = self.subscriptions.pop(registration_id, None)
        if link is not None:
            same_stream = self.subscriptions_by_stream[link.stream_id]
            same_stream.pop(registration_id, None)
            if not same_stream:
                del self.subscriptions_by_stream[link.stream_id]
        return link

    def stream_subscriptions(self, stream_id: int) -> dict[int, SubscriptionLink]:
        return self.subscriptions_by_stream.get(stream_id, {})

    # -- links ------------------------------------------------------------------------------------------
    def link_subscriber(self, publication: Subscribable, link: SubscriptionLink) -> None:
        sub = publication.add_subscriber(link.registration_id, link.client_id, link.channel)
        if isinstance(publication, IpcPublication):
            publication.update_publisher_limit()
        self.client_proxy.on_available_image(publication, link.registration_id, sub.counter_id)
        self.images_changed = True
        self._log.info(
            "image.available",
            registration_id=publication.registration_id,
            session_id=publication.session_id,
            stream_id=publication.stream_id,
            subscription_id=link.registration_id,
            join_position=sub.join_position,
        )

    def unlink_subscriber(self, publication: Subscribable, subscription_id: int, notify: bool = True) -> None:
        sub = publication.remove_subscriber(subscription_id)
        if sub is not None and notify:
            link = self.subscriptions.get(subscription_id)
            self.client_proxy.on_unavailable_image(
                publication.registration_id,
                subscription_id,
                publication.stream_id,
                link.channel if link else publication.channel,
            )
            self._log.info(
                "image.unavailable",
                registration_id=publication.registration_id,
                session_id=publication.session_id,
                subscription_id=subscription_id,
            )
        self.images_changed = True

    def unlink_all(self, publication: Subscribable) -> None:
        for subscription_id in list(publication.subscribers):
            self.unlink_subscriber(publication, subscription_id)

    def active_images(self) -> int:
        return sum(len(p.subscribers) for p in self.publications) + sum(len(i.subscribers) for i in self.images)

    # -- limits -----------------------------------------------------------------------------------------
    def check_counters(self, count: int, what: str) -> None:
        """Refuse a command that would run out of counters before it creates anything (nothing leaks)."""
        if not self.counters.has_room(count):
            raise CommandError(
                ErrorCode.GENERIC_ERROR,
                f"{what} needs {count} counters and the counters are full (capacity {self.counters.capacity};"
                f" counters_buffer_length={self.counters_buffer_length} sets it, 128 bytes per counter)",
            )
