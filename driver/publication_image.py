"""A publication image: the receiver's copy of a remote publication's log, rebuilt from datagrams.

Sans-IO: the receiver's transport decides its DATA-path datagrams in C, a batch at a time, with the
native half of the image (:meth:`native_receiver`, :class:`logbuf.driver._udp.ImageReceiver`: the one
insert and window rule), and the image takes the results back (:meth:`native_received`); a datagram
handed over alone goes through the same rule (:meth:`insert_packet`). The agent calls
:meth:`track_rebuild` with ``now_ns`` and a ``send`` callable for its NAKs and status messages. Positions (Aeron's counters)::

    rcv-hwm   highest position seen (data end or heartbeat), gaps allowed
    rcv-pos   end of the contiguous frames from the join position (the rebuild position)
    sub-pos   each subscriber's position; the SM reports their minimum

Datagrams land at their term offset in any order (duplicates are skipped); only data inside
``[min subscriber position, min subscriber position + term/2)`` is accepted, so nothing unread
is overwritten and the partition written to has been cleaned. Each gap between rcv-pos and rcv-hwm
(up to 16; Aeron NAKs only the first) is NAKed after ``nak_delay_ns`` and again every ``nak_retry``
while it stays; on a ``reliable=false`` subscription it is filled with a padding frame instead
(Aeron's TermGapFiller, counted in "Loss gap fills"), so subscribers skip it. An SM goes out when the
subscribers consumed a quarter of the window since the last one, every ``sm_interval``, and
within 1 ms of any progress or of a heartbeat (a sender blocked by a lost SM heartbeats every
millisecond: logbuf's addition, see :mod:`driver.network_publication`).

Lifecycle: ACTIVE -> INACTIVE -> DONE, or ACTIVE -> DONE; the table is in
:mod:`logbuf.driver.lifecycle` and the image moves only through :meth:`PublicationImage.transition`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from logbuf import native
from logbuf.conduit.counters import CountersManager
from logbuf.conduit.loss_report import LossReport
from logbuf.driver import _udp
from logbuf.driver.ipc_publication import SubscriberPosition, allocate_subscriber_position
from logbuf.driver.lifecycle import IMAGE_TRANSITIONS, check_transition
from logbuf.driver.lifecycle import ImageState as ImageState
from logbuf.driver.nak_delay import OptimalMulticastDelayGenerator, StaticDelayGenerator
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.protocol.frame_header import Buffer
from logbuf.protocol.nak import NakFrame
from logbuf.protocol.status import END_OF_STREAM_FLAG, StatusMessageFrame

Send = Callable[[Any], int]
NakDelayGenerator = StaticDelayGenerator | OptimalMulticastDelayGenerator
PROGRESS_SM_INTERVAL_NS = 1_000_000
NAK_SPIN_NS = 1_000_000
CLEAN_STEP_FRACTION = 16
"""The log behind the slowest subscriber is zeroed a sixteenth of a term at a time, not per message: data
is accepted at most half a term above that subscriber, so what it lands on was last written 2.5 terms
below it, well behind the cleaned position even when cleaning lags by a step."""
MAX_GAPS = 16
"""Any consumption progress is reported within 1 ms (besides Aeron's quarter-window and 200 ms
rules), so a lost SM stalls a blocked sender for a millisecond, not for 200."""
NO_SOURCE_KEY = 0
"""The native source key of an address that is not IPv4: it matches no datagram of a batch."""


def source_key(address: tuple[str, int]) -> int:
    """An IPv4 address as the native data path keys sources (``address << 16 | port``, host order, as
    :func:`logbuf.driver._udp.udp_receive_batch` reports them); NO_SOURCE_KEY if it is not one."""
    host, port = address
    try:
        return int.from_bytes(socket.inet_aton(host), "big") << 16 | port
    except OSError:
        return NO_SOURCE_KEY


@dataclass
class PublicationImage:
    registration_id: int  # the image's correlation id
    session_id: int
    stream_id: int
    channel: str
    source_identity: str
    source_address: tuple[str, int]
    log: LogBuffers
    log_file_name: str
    counters: CountersManager
    system_counters: SystemCounters
    hwm_id: int
    rebuild_id: int
    receiver_id: int
    join_position: int
    window_length: int
    liveness_timeout_ns: int
    nak_delay_ns: int
    nak_retry_ns: int
    sm_interval_ns: int
    now_ns: int
    reliable: bool = True
    nak_delay_generator: NakDelayGenerator | None = None
    """Multicast: Aeron's random back-off for first NAKs and retries; None: ``nak_delay_ns``/``nak_retry_ns``."""
    group_tag: int | None = None
    """Carried by every status message (``gtag=``), for senders with tagged flow control."""
    loss_report: LossReport | None = None
    """Where loss is reported (``loss-report.dat``); None once it is full, as in Aeron."""
    naks_sent_id: int = -1
    """rcv-naks-sent: NAKs this image sent; -1: none."""
    naks_sent: int = 0
    original_channel: str = ""
    """The channel as its subscription gave it (``channel`` is the canonical form): for reports."""
    loss_entry_offset: int = -1
    """This image's entry in the loss report, once it has seen loss."""
    subscribers: dict[int, SubscriberPosition] = field(default_factory=dict)
    hwm: int = 0
    rebuild: int = 0
    clean_position: int = 0
    last_sm_position: int = -1
    next_sm_ns: int = 0
    last_sm_ns: int = 0
    sm_requested: bool = False
    time_of_last_packet_ns: int = 0
    eos_position: int = -1
    nak_timers: dict[int, int] = field(default_factory=dict)  # gap position -> when to NAK it
    _state: ImageState = field(default=ImageState.ACTIVE, init=False, repr=False)

    def __post_init__(self) -> None:
        self._native: _udp.ImageReceiver | None = None
        self.hwm = self.rebuild = self.join_position
        self.clean_position = self.join_position
        self.time_of_last_packet_ns = self.now_ns
        self._hwm_counter = self.counters.position(self.hwm_id)
        self._hwm_counter.set_ordered(self.hwm)
        self.counters.set_value(self.rebuild_id, self.rebuild)

    @property
    def state(self) -> ImageState:
        """Where the image is in its lifecycle; it moves only through :meth:`transition`."""
        return self._state

    def transition(self, to: ImageState) -> None:
        """Move to ``to`` if the lifecycle table allows it, else raise IllegalTransitionError."""
        self._state = check_transition(
            IMAGE_TRANSITIONS, self._state, to, f"image registration_id={self.registration_id}"
        )

    # -- positions ---------------------------------------------------------------------------------
    def min_subscriber_position(self) -> int:
        subscribers = self.subscribers
        if len(subscribers) == 1:  # the common case, per datagram
            for s in subscribers.values():
                return s.position.get_volatile()
        positions = [s.position.get_volatile() for s in subscribers.values()]
        return min(positions) if positions else self.rebuild

    # -- subscribers (the conductor links them like an IPC publication's) ------------------------------
    def add_subscriber(self, subscription_registration_id: int, client_id: int, channel: str) -> SubscriberPosition:
        sub = allocate_subscriber_position(
            self.counters,
            subscription_registration_id,
            client_id,
            self.session_id,
            self.stream_id,
            channel,
            self.rebuild,
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
        return sub

    # -- receiving ---------------------------------------------------------------------------------
    def insert_packet(self, packet: Buffer, now_ns: int) -> int:
        """Decide one DATA, PAD or heartbeat datagram of this image (its source already checked) by the
        native rule a batch runs (:class:`logbuf.driver._udp.ImageReceiver`): inserted, a heartbeat, or
        dropped and counted; returns the ``_udp.DATA_*`` code (DATA_NOT_TAKEN: invalid, the caller counts
        it). The receive path for a datagram handed over one by one (fault injection, a test)."""
        code: int = self.native_receiver().on_datagram(packet)
        self.native_received(now_ns)
        return code

    def native_receiver(self) -> _udp.ImageReceiver:
        """This image's native receive path (made on first use), primed with rcv-pos, the slowest
        subscriber's position, the HWM and the end of the stream for the batch about to be read (see
        :func:`logbuf.driver._udp.insert_data_batch`)."""
        native_rx = self._native
        if native_rx is None:
            native_rx = self._native = _udp.ImageReceiver(
                self.log.view, self.session_id, self.stream_id, source_key(self.source_address)
            )
        native_rx.rebuild = self.rebuild
        native_rx.floor = self.min_subscriber_position()
        native_rx.hwm = self.hwm
        native_rx.eos_position = self.eos_position
        return native_rx

    def native_received(self, now_ns: int) -> None:
        """After a batch: take back what the native path decided (HWM, end of stream, the time of the last
        packet) and add its tallies to the system counters."""
        native_rx = self._native
        if native_rx is None or not native_rx.received:
            return
        self.time_of_last_packet_ns = now_ns
        if native_rx.hwm > self.hwm:
            self.hwm = native_rx.hwm
            self._hwm_counter.set_ordered(self.hwm)
        self.eos_position = native_rx.eos_position
        counters = self.system_counters
        if native_rx.heartbeats:
            counters.increment(SystemCounterId.HEARTBEATS_RECEIVED, native_rx.heartbeats)
            self.sm_requested = True  # a sender that heartbeats may be waiting for an SM we sent and lost
        if native_rx.over_runs:
            counters.increment(SystemCounterId.FLOW_CONTROL_OVER_RUNS, native_rx.over_runs)
        if native_rx.under_runs:
            counters.increment(SystemCounterId.FLOW_CONTROL_UNDER_RUNS, native_rx.under_runs)
        native_rx.received = native_rx.inserted = native_rx.heartbeats = native_rx.over_runs = 0
        native_rx.under_runs = 0

    # -- duty cycle --------------------------------------------------------------------------------
    def _scan(self) -> tuple[int, dict[int, int]]:
        """From rcv-pos towards the HWM: where the contiguous frames end (the new rebuild position),
        and the gaps after it by position (length), at most MAX_GAPS."""
        term_length = self.log.term_length
        position, first_gap = self.rebuild, -1
        gaps: dict[int, int] = {}
        while position < self.hwm and len(gaps) < MAX_GAPS:
            term_start = position - (position & (term_length - 1))
            end, length = native.term_gap_scan(
                self.log.terms[(position // term_length) % 3],
                position - term_start,
                min(self.hwm - term_start, term_length),
            )
            if length:
                if first_gap < 0:
                    first_gap = term_start + end
                gaps[term_start + end] = length
                position = term_start + end + length
            elif end < term_length:
                position = term_start + end
                break
            else:
                position = term_start + term_length
        return (position if first_gap < 0 else first_gap), gaps

    def track_rebuild(self, now_ns: int, send: Send) -> int:
        """Advance the rebuild position, NAK gaps, send status messages; returns work done."""
        work = 0
        if self.hwm != self.rebuild or self.nak_timers:  # else nothing to scan: the common idle cycle
            work += self._track_gaps(now_ns, send)
        if (
            self.eos_position >= 0
            and self.rebuild >= self.eos_position
            and self.log.end_of_stream_position() > self.rebuild
        ):
            self.log.set_end_of_stream_position(self.eos_position)
        # status messages and cleaning
        consumed = self.min_subscriber_position()
        if (
            consumed - self.last_sm_position >= self.window_length // 4
            or now_ns >= self.next_sm_ns
            or (
                (consumed > self.last_sm_position or self.sm_requested)
                and now_ns >= self.last_sm_ns + PROGRESS_SM_INTERVAL_NS
            )
        ):
            self._send(send, self._status_message(consumed))
            self.system_counters.increment(SystemCounterId.STATUS_MESSAGES_SENT)
            self.last_sm_position = consumed
            self.last_sm_ns = now_ns
            self.sm_requested = False
            self.next_sm_ns = now_ns + self.sm_interval_ns
            work += 1
        clean_to = consumed - self.log.term_length
        if clean_to - self.clean_position >= self.log.term_length // CLEAN_STEP_FRACTION:
            self.log.clean(self.clean_position, clean_to)
            self.clean_position = clean_to
        return work

    def _track_gaps(self, now_ns: int, send: Send) -> int:
        """Advance the rebuild position towards the HWM and NAK the gaps on the way; returns work done."""
        work = 0
        position, gaps = self._scan()
        if position != self.rebuild:
            self.rebuild = position
            self.counters.set_value(self.rebuild_id, position)
            work += 1
        # loss: NAK every gap between rebuild and HWM, each on its own timer
        timers: dict[int, int] = {}
        generator = self.nak_delay_generator
        for gap_start, length in gaps.items():
            due = self.nak_timers.get(gap_start, -1)
            if due < 0:
                due = now_ns + (self.nak_delay_ns if generator is None else generator.delay(False))
            if now_ns >= due and not self.reliable:
                self._record_loss(length)
                self._fill_gap(gap_start, length)
                work += 1
                continue
            if now_ns >= due:
                self._record_loss(length)
                term_id, term_offset = self.log.term_of(gap_start)
                self._send(send, NakFrame(self.session_id, self.stream_id, term_id, term_offset, length).encode())
                self.system_counters.increment(SystemCounterId.NAK_MESSAGES_SENT)
                self.naks_sent += 1
                if self.naks_sent_id >= 0:
                    self.counters.set_value(self.naks_sent_id, self.naks_sent)
                due = now_ns + (self.nak_retry_ns if generator is None else generator.delay(True))
                work += 1
            elif due - now_ns < NAK_SPIN_NS:
                work += 1  # keep the duty cycle from parking past a NAK that is due very soon
            timers[gap_start] = due
        self.nak_timers = timers
        return work

    def end_of_stream_status_message(self) -> bytes:
        """The SM a receiver sends when its last subscription to the stream goes: the EOS flag tells a
        sender with min or tagged flow control to stop waiting for this receiver at once."""
        return self._status_message(self.min_subscriber_position(), END_OF_STREAM_FLAG)

    def _status_message(self, position: int, flags: int = 0) -> bytes:
        """This receiver's SM for ``position``: its window, receiver id and group tag."""
        term_id, term_offset = self.log.term_of(position)
        return StatusMessageFrame(
            self.session_id,
            self.stream_id,
            term_id,
            term_offset,
            self.window_length,
            self.receiver_id,
            self.group_tag,
            flags,
        ).encode()

    def _record_loss(self, length: int) -> None:
        """A gap is NAKed (or filled): one observation in the loss report (Aeron's on_gap_detected)."""
        report = self.loss_report
        if report is None:
            return
        if self.loss_entry_offset >= 0:
            report.record_observation(self.loss_entry_offset, length)
            return
        self.loss_entry_offset = report.create_entry(
            length, self.session_id, self.stream_id, self.original_channel or self.channel, self.source_identity
        )
        if self.loss_entry_offset < 0:
            self.loss_report = None  # full: this image reports no more

    def _fill_gap(self, position: int, length: int) -> None:
        """Cover a gap with one padding frame (its length stored last), unless data arrived there."""
        term_id, term_offset = self.log.term_of(position)
        pad = dh.HEADER.pack(
            length,
            dh.CURRENT_VERSION,
            dh.UNFRAGMENTED,
            dh.HDR_TYPE_PAD,
            term_offset,
            self.session_id,
            self.stream_id,
            term_id,
            0,
        )
        if native.term_rebuild_insert(self.log.terms[(position // self.log.term_length) % 3], term_offset, pad):
            self.system_counters.increment(SystemCounterId.LOSS_GAP_FILLS)

    def _send(self, send: Send, datagram: bytes) -> None:
        self.system_counters.count_send(len(datagram), send(datagram))

    def on_time_event(self, now_ns: int) -> None:
        if self.state is not ImageState.ACTIVE:
            return
        if now_ns - self.time_of_last_packet_ns > self.liveness_timeout_ns or self.is_drained_to_end_of_stream():
            self.transition(ImageState.INACTIVE)

    def is_drained_to_end_of_stream(self) -> bool:
        """An end-of-stream heartbeat came, everything before it arrived and every subscriber read
        it: the image can go as soon as Aeron's would, not a liveness timeout later."""
        eos = self.eos_position
        return 0 <= eos <= self.rebuild and self.hwm <= self.rebuild and self.min_subscriber_position() >= eos

    def close(self) -> None:
        self._native = None
        for sub_id in list(self.subscribers):
            self.remove_subscriber(sub_id)
        self._hwm_counter.close()
        self.counters.free(self.hwm_id)
        self.counters.free(self.rebuild_id)
        if self.naks_sent_id >= 0:
            self.counters.free(self.naks_sent_id)
        self.log.close()
        try:
            os.unlink(self.log_file_name)
        except FileNotFoundError:
            pass
