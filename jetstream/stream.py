"""The relay's read side of the event stream: a subscription polled as a relay-server duty.

:class:`EventStreamAdapter` reads whole messages (events above MTU − 32 bytes arrive as fragments
and are reassembled), parses each (:func:`jetstream.events.parse_event`) and hands it to the
server (``append(raw, meta)``, on the server's loop thread, the only thread that calls the duty).
The server needs ``time_us`` strictly increasing: a message at or below the last appended one
(a second publisher on the stream, an old image replayed) is counted and skipped, as is a message
that is not an event. Nothing is logged per message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from logbuf.jetstream.events import EventMeta, parse_event
from logbuf.logbuffer.fragment_assembler import FragmentAssembler

__all__ = ["DEFAULT_FRAGMENT_LIMIT", "EventStreamAdapter", "StreamStats"]

DEFAULT_FRAGMENT_LIMIT: Final = 256
"""Fragments per duty call: bounds the time one call takes away from the server's clients."""


class Pollable(Protocol):
    def poll(self, handler: Callable[[memoryview, Any], Any], fragment_limit: int) -> int: ...


@dataclass
class StreamStats:
    appended: int = 0
    appended_bytes: int = 0
    invalid: int = 0
    out_of_order: int = 0
    reserved_value_mismatch: int = 0
    last_time_us: int = 0
    last_error: str = ""


class EventStreamAdapter:
    """``do_work()`` polls the subscription and calls ``append(raw, meta)`` for each new event.

    ``after_us``: skip events at or below this ``time_us`` (the newest one the server already holds).
    ``subscription`` may be None (nothing to read yet) and is swapped by :meth:`resubscribe` after a
    reconnect to the driver; ``paused`` holds reading (while the server loads its recorded events).
    """

    def __init__(
        self,
        subscription: Pollable | None,
        append: Callable[[bytes, EventMeta], None],
        *,
        after_us: int = 0,
        fragment_limit: int = DEFAULT_FRAGMENT_LIMIT,
    ) -> None:
        if fragment_limit <= 0:
            raise ValueError(f"fragment_limit={fragment_limit} must be positive")
        self.subscription = subscription
        self.append = append
        self.fragment_limit = fragment_limit
        self.stats = StreamStats(last_time_us=after_us)
        self.paused = False
        self._assembler = FragmentAssembler(self._on_message)

    def do_work(self) -> int:
        if self.subscription is None or self.paused:
            return 0
        return self.subscription.poll(self._assembler, self.fragment_limit)

    def resubscribe(self, subscription: Pollable | None) -> None:
        """Read from ``subscription`` from now on (call on the thread that calls :meth:`do_work`); a
        message half reassembled from the old one is dropped."""
        self.subscription = subscription
        self._assembler = FragmentAssembler(self._on_message)

    __call__ = do_work  # a RelayServer duty is a plain callable returning its work count

    def _on_message(self, buffer: memoryview, header: Any) -> None:
        stats = self.stats
        raw = bytes(buffer)
        try:
            meta = parse_event(raw)
        except ValueError as e:
            stats.invalid += 1
            stats.last_error = str(e)[:200]
            return
        if meta.time_us != header.reserved_value:
            stats.reserved_value_mismatch += 1  # the JSON is authoritative; counted for diagnosis
        if meta.time_us <= stats.last_time_us:
            stats.out_of_order += 1
            return
        self.append(raw, meta)
        stats.last_time_us = meta.time_us
        stats.appended += 1
        stats.appended_bytes += len(raw)
