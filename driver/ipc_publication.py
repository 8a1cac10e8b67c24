"""An IPC publication as the driver sees it: one log shared by its publishers and subscribers.

Lifecycle (the table is in :mod:`logbuf.driver.lifecycle`; transitions happen only through
:meth:`IpcPublication.transition`, called from :meth:`~IpcPublication.decrement_ref` and
:meth:`~IpcPublication.on_time_event`)::

    ACTIVE --last publisher removed--> DRAINING --subscribers reached EOS or linger--> DONE

The conductor calls :meth:`update_publisher_limit` every duty cycle: it cleans the log more than
a term behind the slowest subscriber, then publishes ``min(subscriber positions) + window`` as the
publisher limit (see :mod:`logbuf.logbuffer.flow_control`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from logbuf import native
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersManager
from logbuf.driver.lifecycle import PUBLICATION_TRANSITIONS, check_transition
from logbuf.driver.lifecycle import PublicationState as PublicationState
from logbuf.logbuffer.flow_control import compute_limit_and_clean
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.term_unblocker import UnblockStatus, blocking_problem_at, log_unblock

LIMIT_STEP_FRACTION = 16
"""The conductor raises a publisher limit (and cleans behind the slowest subscriber) once it lags by a
sixteenth of the term window, not on every message: each raise and clean is Python work in the duty
cycle (about 18 us), which at one message per cycle (a ping-pong) sat in every hop of the round
trip. A publisher may thus be held back by up to 1/16 of its window, never stalled: when it presses
on its limit, the subscribers catch up and the lag grows past a step."""


@dataclass
class SubscriberPosition:
    subscription_registration_id: int
    client_id: int
    counter_id: int
    position: native.Position
    join_position: int


def allocate_subscriber_position(
    counters: CountersManager,
    subscription_registration_id: int,
    client_id: int,
    session_id: int,
    stream_id: int,
    channel: str,
    join: int,
    reference_id: int = 0,
) -> SubscriberPosition:
    """A subscriber's ``sub-pos`` counter (owned by its client, referring to the publication or image
    it reads, as Aeron's), starting at ``join``."""
    label = cd.stream_label("sub-pos", subscription_registration_id, session_id, stream_id, channel, f"@{join}")
    key = cd.stream_key(subscription_registration_id, session_id, stream_id, channel)
    counter_id = counters.allocate(
        label,
        cd.SUBSCRIBER_POSITION_TYPE_ID,
        key,
        registration_id=subscription_registration_id,
        owner_id=client_id,
        reference_id=reference_id,
        initial_value=join,
    )
    return SubscriberPosition(subscription_registration_id, client_id, counter_id, counters.position(counter_id), join)


@dataclass
class IpcPublication:
    registration_id: int
    session_id: int
    stream_id: int
    channel: str
    exclusive: bool
    log: LogBuffers
    log_file_name: str
    publisher_limit_id: int
    publisher_limit: native.Position
    publisher_position_id: int
    counters: CountersManager
    linger_timeout_ns: int
    ref_count: int = 1
    clean_position: int = 0
    draining_deadline_ns: int = 0
    subscribers: dict[int, SubscriberPosition] = field(default_factory=dict)
    unblock_timeout_ns: int = 15_000_000_000
    last_consumer_position: int = -1
    time_of_last_consumer_move_ns: int = 0
    refused_position: int = -1
    """The consumer position where the unblocker last refused a corrupt frame (-1: none)."""
    unblock_refused_reason: str | None = None
    _state: PublicationState = field(default=PublicationState.ACTIVE, init=False, repr=False)

    @property
    def state(self) -> PublicationState:
        """Where the publication is in its lifecycle; it moves only through :meth:`transition`."""
        return self._state

    def transition(self, to: PublicationState) -> None:
        """Move to ``to`` if the lifecycle table allows it, else raise IllegalTransitionError."""
        self._state = check_transition(
            PUBLICATION_TRANSITIONS, self._state, to, f"publication registration_id={self.registration_id}"
        )

    @property
    def source_identity(self) -> str:
        """What ON_AVAILABLE_IMAGE names as the image's source: the log is local."""
        return "aeron:ipc"

    @property
    def term_window_length(self) -> int:
        return self.log.term_window_length

    def tail_position(self) -> int:
        return self.log.tail_position()

    # -- subscribers ------------------------------------------------------------------------------
    def add_subscriber(self, subscription_registration_id: int, client_id: int, channel: str) -> SubscriberPosition:
        """A subscriber joins at the current tail, with its own sub-pos counter."""
        sub = allocate_subscriber_position(
            self.counters,
            subscription_registration_id,
            client_id,
            self.session_id,
            self.stream_id,
            channel,
            self.tail_position(),
            reference_id=self.registration_id,
        )
        self.subscribers[subscription_registration_id] = sub
        self.log.set_connected(True)
        return sub

    def remove_subscriber(self, subscription_registration_id: int) -> SubscriberPosition | None:
        sub = self.subscribers.pop(subscription_registration_id, None)
        if sub is not None:
            sub.position.close()
            self.counters.free(sub.counter_id)
            if not self.subscribers:
                self.log.set_connected(False)
        return sub

    # -- duty cycle ----------------------------------------------------------------------------------
    def update_publisher_limit(self) -> int:
        """Clean and raise the limit; returns 1 only if the publisher was pressing on its old limit.

        A limit that moves while publishers are far from it is no urgent work: the conductor may
        then back off instead of spinning beside the application on a small machine.
        """
        if self.state is PublicationState.DONE:
            return 0
        current = self.publisher_limit.get_volatile()
        positions = self.flow_control_positions()
        if not positions:
            # Nobody reads: pin the limit to the tail so offers see NOT_CONNECTED.
            return 0
        min_position = min(positions)
        if min_position + self.term_window_length - current < self.term_window_length // LIMIT_STEP_FRACTION:
            return 0  # the common cycle: the limit is at most a step behind (cleaning lags with it)
        update = compute_limit_and_clean(
            positions,
            current_limit=current,
            clean_position=self.clean_position,
            term_length=self.log.term_length,
            term_window_length=self.term_window_length,
        )
        if update.clean_to > update.clean_from:
            self.log.clean(update.clean_from, update.clean_to)
            self.clean_position = update.clean_to
        if update.limit != current:
            self.publisher_limit.set_ordered(update.limit)
            return 1 if current - self.tail_position() < self.term_window_length // 4 else 0
        return 0

    def flow_control_positions(self) -> list[int]:
        """The positions publishers must not run more than a window ahead of: the subscribers'."""
        return [s.position.get_volatile() for s in self.subscribers.values()]

    def sample_publisher_position(self) -> None:
        self.counters.set_value(self.publisher_position_id, self.tail_position())

    def decrement_ref(self, now_ns: int) -> None:
        self.ref_count -= 1
        if self.ref_count <= 0 and self.state is PublicationState.ACTIVE:
            self.transition(PublicationState.DRAINING)
            self.draining_deadline_ns = now_ns + self.linger_timeout_ns
            self.log.set_end_of_stream_position(self.tail_position())

    def on_time_event(self, now_ns: int) -> None:
        if self.state is PublicationState.DRAINING:
            eos = self.log.end_of_stream_position()
            drained = all(s.position.get_volatile() >= eos for s in self.subscribers.values())
            if drained or now_ns >= self.draining_deadline_ns:
                self.transition(PublicationState.DONE)

    def check_for_blocked_publisher(self, now_ns: int) -> UnblockStatus:
        """Aeron's rule: the consumers (subscribers, or the sender) have not moved for the unblock
        timeout while the tail is past them, so a publisher may have died between claim and commit;
        cover its claim with padding (:mod:`logbuf.logbuffer.term_unblocker`). UNBLOCKED (or
        UNBLOCKED_TO_END) if it did; REFUSED, once per blocked position (then retried each timeout,
        silently), if what blocks the consumers is a corrupt frame, not a claim (its reason in
        ``unblock_refused_reason``); else NO_ACTION."""
        positions = self.flow_control_positions()
        if not positions or self.state is PublicationState.DONE:
            return UnblockStatus.NO_ACTION
        consumer = min(positions)
        if consumer != self.last_consumer_position or self.tail_position() <= consumer:
            self.last_consumer_position = consumer
            self.time_of_last_consumer_move_ns = now_ns
            return UnblockStatus.NO_ACTION
        if now_ns - self.time_of_last_consumer_move_ns < self.unblock_timeout_ns:
            return UnblockStatus.NO_ACTION
        status = log_unblock(self.log, consumer)
        if status is UnblockStatus.NO_ACTION:
            return status
        self.time_of_last_consumer_move_ns = now_ns  # refused: look again after another timeout
        if status is UnblockStatus.REFUSED:
            if consumer == self.refused_position:
                return UnblockStatus.NO_ACTION
            self.refused_position = consumer
            self.unblock_refused_reason = blocking_problem_at(self.log, consumer)
        return status

    def close(self) -> None:
        """Free counters, unmap and delete the log file."""
        for sub_id in list(self.subscribers):
            self.remove_subscriber(sub_id)
        self.publisher_limit.close()
        self.counters.free(self.publisher_limit_id)
        self.counters.free(self.publisher_position_id)
        self.log.close()
        try:
            os.unlink(self.log_file_name)
        except FileNotFoundError:
            pass
