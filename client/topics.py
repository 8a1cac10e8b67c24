"""Topics over a stream: publish with a topic name, subscribe with exact names and NATS-style wildcards.

Theory of operation
-------------------
Many topics share one stream (one log): a topic message is an ordinary DATA frame whose reserved value is the
topic's 63-bit id (``logbuf.topic_names.topic_id``: a hash of the name, the same everywhere). A publication's
:class:`~logbuf.native.TopicHandle` for a topic writes the topic's *definition frame* (the name, reserved value
with bit 63 set) before its first message, and registers the name in this host's registry (``topics.dat``
beside the CnC), so any subscriber can name an id: one that joins late from the registry, one on another host
(its frames arrive through its own driver) from the definition in the stream.

A :class:`TopicSubscription` polls natively through a :class:`~logbuf.native.TopicFilter`: per frame, one probe
of a table of topic ids already decided; an id seen for the first time is named (local names, definitions,
the registry) and matched against the patterns once, in Python, and the decision is cached. Non-matching
frames are consumed without reaching the handler. Adding or removing a pattern clears the cache.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from logbuf.conduit.topic_registry import TopicRegistry, TopicRegistryFullError
from logbuf.logbuffer.image import FragmentBatch
from logbuf.native import TopicFilter, TopicHandle, TopicOffers, TopicSubscriptionCore
from logbuf.topic_names import TopicNameError, TopicPatterns, check_topic_name, topic_id_of_bytes

if TYPE_CHECKING:
    from logbuf.client.aeron import ClientConductor, Publication

from logbuf.client.aeron import Subscription

__all__ = ["TopicDirectory", "TopicPublication", "TopicSubscription"]


class TopicDirectory:
    """One client's names of topics: the driver's registry, mapped once, behind a lock (publications and
    subscriptions on any thread share it)."""

    def __init__(self, directory: str) -> None:
        self._registry = TopicRegistry.open(directory)
        self._lock = threading.Lock()
        self.invalid_definitions = 0
        """Definition frames whose name is not a topic name, does not hash to their id, or whose id another name
        has here (dropped)."""
        self.unshared_names = 0
        """Names learnt from definitions that the host's full registry could not take (this client knows them)."""

    def register(self, name: str) -> int:
        with self._lock:
            return self._registry.register(name)

    def name_of(self, topic_id: int) -> str | None:
        names = self._registry.names
        name = names.get(topic_id)
        if name is None:
            with self._lock:
                name = self._registry.name_of(topic_id)
        return name

    def learn(self, topic_id: int, name_bytes: bytes) -> str | None:
        """A definition frame's name, checked and registered here (so later local subscribers can name it).

        Checked and hashed once, appended without :meth:`TopicRegistry.register`'s second check: a receiving
        host learns each of a stream's topics this way on first sight, thousands at a stream's start."""
        known = self._registry.names.get(topic_id)
        if known is not None:
            if known.encode() == name_bytes:
                return known
            self.invalid_definitions += 1  # another name has this id here: the first one keeps it
            return None
        try:
            name = name_bytes.decode("utf-8")
            check_topic_name(name)
        except (UnicodeDecodeError, TopicNameError):
            self.invalid_definitions += 1
            return None
        if topic_id_of_bytes(name_bytes) != topic_id:
            self.invalid_definitions += 1
            return None
        with self._lock:
            registry = self._registry
            known = registry.name_of(topic_id)  # another process here may have registered it meanwhile
            if known is None:
                try:
                    registry.append(topic_id, name_bytes)
                except TopicRegistryFullError:
                    self.unshared_names += 1  # named for this client only: the host's registry is full
                registry.names[topic_id] = name
            elif known != name:
                self.invalid_definitions += 1
                return None
        return name

    @property
    def names(self) -> dict[int, str]:
        """Topic id -> name of every topic this client has seen (a live map: copy it to keep it)."""
        return self._registry.names

    def close(self) -> None:
        with self._lock:
            try:
                self._registry.close()
            except BufferError:
                pass


class TopicPublication:
    """A publication whose messages carry topics: ``offer(topic, payload)``, or a :class:`TopicHandle` per
    topic (``pub.topic(name).offer(payload)``: no name lookup, costs nothing over a plain ``offer``)."""

    def __init__(self, publication: Publication, directory: TopicDirectory) -> None:
        self.publication = publication
        self._directory = directory
        self._offers = TopicOffers(self._make_handle)
        self._handles: dict[str, TopicHandle] = self._offers.handles
        self.offer: Callable[[str, Any], int] = self._offers.offer
        """``offer(topic, payload)``: append one message of ``topic`` (the name looked up in C): the new position
        or a negative OfferResult, as a plain ``offer``."""

    def _make_handle(self, name: str) -> TopicHandle:
        topic_id = self._directory.register(name)
        return TopicHandle(self.publication, topic_id, name.encode("utf-8"))

    def topic(self, name: str) -> TopicHandle:
        """The handle of topic ``name`` (registered on first use; TopicNameError for a bad name)."""
        handle = self._handles.get(name)
        if handle is None:
            handle = self._handles[name] = self._make_handle(name)
        return handle

    @property
    def topic_count(self) -> int:
        return len(self._handles)

    @property
    def is_connected(self) -> bool:
        return self.publication.is_connected

    @property
    def position(self) -> int:
        return self.publication.position

    @property
    def is_closed(self) -> bool:
        return self.publication.is_closed

    def close(self) -> None:
        self.publication.close()
        self._handles.clear()

    def __enter__(self) -> TopicPublication:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TopicSubscription(Subscription, TopicSubscriptionCore):
    """A subscription that delivers only messages whose topic matches one of its patterns (``poll`` is
    native, as :class:`Subscription`'s). ``header.reserved_value`` is the topic id: :meth:`topic_name` names it."""

    def __init__(
        self,
        conductor: ClientConductor,
        registration_id: int,
        channel: str,
        stream_id: int,
        on_available_image: Any,
        on_unavailable_image: Any,
        patterns: Iterable[str],
        directory: TopicDirectory,
    ) -> None:
        super().__init__(conductor, registration_id, channel, stream_id, on_available_image, on_unavailable_image)
        self._directory = directory
        self._patterns = TopicPatterns(patterns)
        self._filter = TopicFilter(self._resolve, self._on_definition)
        self.skipped_bytes = 0
        """Bytes :meth:`skip_to_tail` jumped over."""

    def _publish_patterns(self) -> None:
        """Leave this subscription's patterns where ``logbuf-stat --topics`` finds them (replaced atomically)."""
        from logbuf.client.topic_stat import TOPIC_SUBSCRIPTIONS_DIR, subscription_file

        directory = self._conductor.ctx.dir
        path = subscription_file(directory, os.getpid(), self.registration_id)
        record = {
            "pid": os.getpid(),
            "registration_id": self.registration_id,
            "channel": self.channel,
            "stream_id": self.stream_id,
            "patterns": self.patterns,
        }
        try:
            os.makedirs(os.path.join(directory, TOPIC_SUBSCRIPTIONS_DIR), mode=0o700, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(record, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # telemetry only: a subscription works without it

    def close(self) -> None:
        from logbuf.client.topic_stat import subscription_file

        if not self.is_closed:
            try:
                os.unlink(subscription_file(self._conductor.ctx.dir, os.getpid(), self.registration_id))
            except OSError:
                pass
        super().close()

    # -- the filter's Python half: once per topic id, never per message -------------------------------------
    def _resolve(self, topic_id: int) -> bool | None:
        name = self._directory.name_of(topic_id)
        if name is None:
            return None
        return self._patterns.matches(name)

    def _on_definition(self, topic_id: int, name_bytes: bytes) -> None:
        self._directory.learn(topic_id, name_bytes)

    # -- patterns ------------------------------------------------------------------------------------------
    @property
    def patterns(self) -> list[str]:
        return self._patterns.patterns

    def subscribe(self, pattern: str) -> None:
        """Add a pattern (TopicNameError if it is not one); later messages of its topics are delivered."""
        if self._patterns.add(pattern):
            self._filter.reset()
            self._publish_patterns()

    def unsubscribe(self, pattern: str) -> bool:
        """Remove a pattern; False if it was not one of this subscription's."""
        if self._patterns.remove(pattern):
            self._filter.reset()
            self._publish_patterns()
            return True
        return False

    def topic_name(self, topic_id: int) -> str | None:
        """The name of a topic id (a header's ``reserved_value``), or None if no one here has named it."""
        return self._directory.name_of(topic_id)

    def lag(self) -> int:
        """Bytes this subscription is behind the publishers on its slowest image: the log's tail minus the image's
        position (the tail an IPC publisher keeps; for an image received over UDP see ``logbuf-stat --topics``).
        A subscription more than a term window behind holds its publishers back, as any subscriber does."""
        behind = 0
        for image in self._images:
            if not image.is_closed:
                behind = max(behind, image._log_buffers.tail_position() - image.position)
        return behind

    def skip_to_tail(self) -> int:
        """Jump every image to its log's tail (a lagging subscriber that chooses to skip rather than hold its
        publishers back); returns the bytes skipped, also added to :attr:`skipped_bytes`."""
        skipped = 0
        for image in self._images:
            if not image.is_closed:
                tail = image._log_buffers.tail_position()
                if tail > image.position:
                    skipped += tail - image.position
                    image.position = tail
        self.skipped_bytes += skipped
        return skipped

    @property
    def topic_filter(self) -> TopicFilter:
        """The native filter, with its counts: delivered, skipped, unresolved, definitions, resolutions."""
        return self._filter

    # -- the polls, filtered -------------------------------------------------------------------------------
    def controlled_poll(self, handler: Callable[[memoryview, Any], Any], fragment_limit: int) -> int:
        images = self._images
        count = len(images)
        if count == 0:
            return 0
        start = self._round_robin = (self._round_robin + 1) % count
        fragments = 0
        for i in range(count):
            image = images[(start + i) % count]
            fragments += image.controlled_poll_filtered(self._filter, handler, fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments

    def poll_batch(self, batch: FragmentBatch, fragment_limit: int = 0x7FFFFFFF) -> int:
        """The vectorised poll of matching fragments: fills ``batch`` from the next image that has any."""
        images = self._images
        count = len(images)
        for _ in range(count):
            start = self._round_robin = (self._round_robin + 1) % count
            n = images[start].poll_batch_filtered(self._filter, batch, fragment_limit)
            if n:
                return n
        return 0

    def block_poll(self, handler: Callable[[memoryview, int, int, int], Any], block_length_limit: int) -> int:
        raise TypeError("a topic subscription has no block poll: blocks are unfiltered (use a plain subscription)")

    def __repr__(self) -> str:
        return (
            f"TopicSubscription(registration_id={self.registration_id}, channel={self.channel!r}, "
            f"stream_id={self.stream_id}, patterns={self.patterns!r}, images={len(self._images)})"
        )
