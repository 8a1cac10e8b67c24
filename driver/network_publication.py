"""A network (UDP) publication: the IPC publication's log, plus the sender's side of the protocol.

Sans-IO: the sender agent calls :meth:`NetworkPublication.send` with ``now_ns`` and a ``send``
callable (bytes out), and feeds it decoded status messages and NAKs; nothing here touches a
socket. Positions (Aeron's counters)::

    pub-lmt = min(snd-pos, spy positions) + term window      (only while connected)
    snd-lmt = max(snd-lmt, SM consumption position + receiver window)
    snd-pos advances as DATA leaves, at most one MTU per datagram, never past snd-lmt

Timers: SETUP every 100 ms until the first SM (or when an SM asks for one); a heartbeat (a
32-byte DATA header, length 0, EOS flag once draining is done) after 100 ms without data, or
after 1 ms while data waits behind the sender limit (a tail-loss probe: logbuf's addition); not
connected once no SM arrived for the connection timeout.

A NAK is answered at once with what its receiver can lack, and nothing else: a NAK from an address no
accepted SM came from (within the flow-control receiver timeout) gets nothing; one whose offset or length
is not a multiple of the frame alignment is malformed, and one starting below the receiver's last SM
position gets nothing (a receiver never NAKs what it reported consumed). The rest is clamped to
``snd-pos``, to one receiver window, to its term (and to the term behind snd-pos that cleaning never
touches), moved back to the start of the frame it falls in, and handed to the
:class:`~logbuf.driver.retransmit_handler.RetransmitHandler` (per-byte linger, concurrent retransmit cap,
bandwidth cap). Every NAK that gets nothing is counted in a system counter naming why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from logbuf import native
from logbuf.conduit import counters_descriptor as cd
from logbuf.driver.ipc_publication import IpcPublication
from logbuf.driver.lifecycle import PublicationState
from logbuf.driver.retransmit_handler import NakOutcome, RetransmitHandler
from logbuf.driver.sender_flow_control import SenderFlowControl
from logbuf.driver.system_counters import SystemCounterId, SystemCounters
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol.data import HeartbeatFrame
from logbuf.protocol.nak import NakFrame
from logbuf.protocol.setup import SetupFrame
from logbuf.protocol.status import END_OF_STREAM_FLAG, SEND_SETUP_FLAG, StatusMessageFrame

SETUP_INTERVAL_NS = 100_000_000
HEARTBEAT_INTERVAL_NS = 100_000_000
BLOCKED_HEARTBEAT_INTERVAL_NS = 1_000_000
"""While flow control blocks data that is waiting, heartbeat every 1 ms: if the last datagrams
of the window were lost, the receiver learns the HWM and NAKs now rather than in 100 ms."""
MAX_NAK_SOURCES = 1024
"""Addresses whose SMs one publication remembers for NAKs at most (forged SMs from yet more addresses are
not remembered until others time out)."""
MAX_RECEIVER_COUNTERS = 64
"""``fc-rcv-pos`` counters one publication allocates at most (the CnC's counters are shared by all)."""
FLOW_CONTROL_IDLE_INTERVAL_NS = 1_000_000
"""How often the flow-control strategy times receivers out (and a min group's limit is recomputed)."""
MAX_DATAGRAMS_PER_SEND = 32

Address = tuple[str, int]
Send = Callable[[Any], int]
SendFrames = Callable[[memoryview, int, int, int, int], tuple[int, int]]
"""(term, term offset, max length, mtu, max datagrams) -> (term bytes covered, datagrams sent): the
sender endpoint's native batch (one sendmmsg); without it, ``send`` is called per datagram."""


_OUTCOME_COUNTERS: Final[dict[NakOutcome, SystemCounterId]] = {
    NakOutcome.NOTHING_TO_RESEND: SystemCounterId.NAKS_WITHOUT_RESEND,
    NakOutcome.OVERFLOW: SystemCounterId.RETRANSMIT_OVERFLOW,
    NakOutcome.RATE_LIMITED: SystemCounterId.RETRANSMITS_RATE_LIMITED,
}


@dataclass
class NakSource:
    """The receivers at one address, as their last SMs describe them: receiver id -> (consumption
    position, window). A NAK from the address may ask from the lowest position, for one window."""

    receivers: dict[int, tuple[int, int]]
    time_of_last_sm_ns: int
    lowest: tuple[int, int] = (0, 0)
    """The lowest receiver's (position, window): kept by each SM, read by each NAK."""


@dataclass
class NetworkPublication(IpcPublication):
    sender_position_id: int = 0
    sender_limit_id: int = 0
    sender_bpe_id: int = -1
    """snd-bpe: flow-control limits hit after sending (Aeron's back-pressure events); -1: none."""
    naks_received_id: int = -1
    """snd-naks-received: NAKs for this publication; -1: none."""
    sender_position: Any = None  # native.Position over snd-pos
    system_counters: SystemCounters | None = None
    mtu_length: int = dh.DEFAULT_MTU_LENGTH
    connection_timeout_ns: int = 5_000_000_000
    is_connected: bool = False
    has_received_sm: bool = False
    should_send_setup: bool = True
    sender_limit: int = 0
    time_of_last_sm_ns: int = 0
    time_of_last_send_ns: int = 0
    _next_blocked_check_ns: int = 0
    next_setup_ns: int = 0
    retransmit_handler: RetransmitHandler = field(default_factory=RetransmitHandler)
    nak_sources: dict[Address, NakSource] = field(default_factory=dict)
    """Where accepted SMs came from: the receivers at each address, and what each can lack (NAKs from
    anywhere else get nothing)."""
    receiver_address: tuple[str, int] | None = None
    """Where the SM that connected this publication came from: while connected, the send endpoint
    takes SMs and NAKs for it from there only (unicast)."""
    flow_control: SenderFlowControl = field(default_factory=SenderFlowControl)
    receivers_counter_id: int = -1
    """``fc-receivers``: how many receivers the flow-control strategy counts (-1: no counter)."""
    setup_flags: int = 0
    """GROUP_FLAG on multicast and MDC publications (group semantics), as Aeron's SETUP carries it."""
    setup_ttl: int = 0
    """The channel's multicast ``ttl=``, echoed in SETUP."""
    mdc_destinations_counter_id: int = -1
    """``mdc-num-dest``: how many destinations an MDC publication's endpoint sends to (-1: not MDC)."""
    receiver_addresses: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Receiver id -> where its last SM came from (for tools: who is slow, and where)."""
    receiver_counters: dict[int, int] = field(default_factory=dict)
    """Receiver id -> its ``fc-rcv-pos`` counter (group publications: those with ``fc-receivers``)."""
    _next_flow_control_idle_ns: int = 0
    _flow_control_changes: int = 0
    track_sender_limits: bool = False
    """Set by a send of data; the next send that finds the window used up counts one back-pressure
    event and clears it (Aeron's rule: one event per time the sender runs into snd-lmt)."""
    naks_received: int = 0
    sender_limit_events: int = 0

    # -- sender duty cycle ------------------------------------------------------------------------
    def send(self, now_ns: int, send: Send, send_frames: SendFrames | None = None) -> int:
        """Send what flow control allows; SETUP and heartbeats when due. Returns the bytes sent (of
        SETUPs and heartbeats) and of the term covered by data.

        In Aeron's order: flow control's idle check, the SETUP check, data, then (when no data went)
        the back-pressure event and the heartbeat check."""
        if now_ns >= self._next_flow_control_idle_ns:
            self._on_flow_control_idle(now_ns)
        sent = 0
        if self.should_send_setup and now_ns >= self.next_setup_ns:
            sent += self._send_setup(now_ns, send)
        if not self.has_received_sm:
            return sent
        start_position: int = self.sender_position.get()
        position, datagrams = self._send_data(start_position, send, send_frames)
        sent += position - start_position
        if datagrams:
            self.retransmit_handler.on_sent(position - start_position)
            self.sender_position.set_ordered(position)
            self.time_of_last_send_ns = now_ns
            self.track_sender_limits = True
            return sent
        if self.track_sender_limits and position >= self.sender_limit:
            self._on_sender_limit_reached()
        return sent + self._heartbeat_check(position, now_ns, send)

    def _on_flow_control_idle(self, now_ns: int) -> None:
        """Every FLOW_CONTROL_IDLE_INTERVAL_NS: time receivers out (the limit may move) and forget
        NAK sources that fell silent."""
        self._next_flow_control_idle_ns = now_ns + FLOW_CONTROL_IDLE_INTERVAL_NS
        self._set_sender_limit(self.flow_control.on_idle(now_ns, self.sender_limit))
        if self.nak_sources:
            self._forget_silent_nak_sources(now_ns)

    def _send_setup(self, now_ns: int, send: Send) -> int:
        """A SETUP at snd-pos (due every SETUP_INTERVAL_NS until an SM answers one); the bytes sent."""
        term_id, term_offset = self.log.term_of(self.sender_position.get())
        setup = SetupFrame(
            term_offset,
            self.session_id,
            self.stream_id,
            self.log.initial_term_id,
            term_id,
            self.log.term_length,
            self.mtu_length,
            self.setup_ttl,
            self.setup_flags,
        )
        sent = self._send(send, setup.encode())
        self._count(SystemCounterId.SETUPS_SENT)
        self.next_setup_ns = now_ns + SETUP_INTERVAL_NS
        if self.has_received_sm:
            self.should_send_setup = False
        return sent

    def _send_data(self, position: int, send: Send, send_frames: SendFrames | None) -> tuple[int, int]:
        """Send committed frames from ``position`` up to snd-lmt, at most MAX_DATAGRAMS_PER_SEND
        datagrams: (the position they reach, datagrams sent). Moves no counter or timer."""
        limit = self.sender_limit
        term_length = self.log.term_length
        datagrams = 0
        while position < limit and datagrams < MAX_DATAGRAMS_PER_SEND:
            term = self.log.terms[(position // term_length) % 3]
            if send_frames is not None:  # the native batch: one sendmmsg
                batch = MAX_DATAGRAMS_PER_SEND - datagrams
                covered, n = send_frames(
                    term,
                    position & (term_length - 1),
                    min(limit - position, term_length),
                    self.mtu_length,
                    batch,
                )
            else:
                covered, _ = self._send_datagram(term, position & (term_length - 1), limit - position, send)
                n = batch = 1
            if not covered:
                break
            position += covered
            datagrams += n
            if n < batch and position & (term_length - 1):
                break  # a short batch inside the term: nothing more committed (or the socket is full)
        return position, datagrams

    def _on_sender_limit_reached(self) -> None:
        """The first send that finds snd-lmt reached after data went: one back-pressure event."""
        self.track_sender_limits = False
        self.sender_limit_events += 1
        self._count(SystemCounterId.SENDER_FLOW_CONTROL_LIMITS)
        if self.sender_bpe_id >= 0:
            self.counters.set_value(self.sender_bpe_id, self.sender_limit_events)

    def _heartbeat_check(self, position: int, now_ns: int, send: Send) -> int:
        """With no data sent: a heartbeat at ``position`` after HEARTBEAT_INTERVAL_NS idle, or after
        BLOCKED_HEARTBEAT_INTERVAL_NS while data waits behind snd-lmt (with the EOS flag once a closing
        publication is drained). The bytes sent."""
        idle_ns = now_ns - self.time_of_last_send_ns
        if not (
            idle_ns >= BLOCKED_HEARTBEAT_INTERVAL_NS
            and now_ns >= self._next_blocked_check_ns
            and (idle_ns >= HEARTBEAT_INTERVAL_NS or self._blocked(position, now_ns))
        ):
            return 0
        term_id, term_offset = self.log.term_of(position)
        eos = self.state is not PublicationState.ACTIVE and position >= self.log.end_of_stream_position()
        flags = dh.BEGIN_END_AND_EOS_FLAGS if eos else dh.UNFRAGMENTED
        sent = self._send(
            send, HeartbeatFrame(term_offset, self.session_id, self.stream_id, term_id, flags=flags).encode()
        )
        self._count(SystemCounterId.HEARTBEATS_SENT)
        self.time_of_last_send_ns = now_ns
        return sent

    def _blocked(self, position: int, now_ns: int) -> bool:
        """Does data wait behind snd-lmt? If not, ask again in a millisecond (reading the tail costs)."""
        if self.tail_position() > position:
            return True
        self._next_blocked_check_ns = now_ns + BLOCKED_HEARTBEAT_INTERVAL_NS
        return False

    def _send_datagram(self, term: memoryview, term_offset: int, max_length: int, send: Send) -> tuple[int, int]:
        """Send one datagram of the committed frames at ``term_offset`` (up to the MTU and
        ``max_length``): (term bytes it covers, bytes sent). A PAD frame travels as its header."""
        covered = native.term_scan_for_availability(term, term_offset, min(self.mtu_length, max_length))
        if covered <= 0:
            return 0, 0
        frame_type = int.from_bytes(term[term_offset + 6 : term_offset + 8], "little")
        wire = dh.HEADER_LENGTH if frame_type == dh.HDR_TYPE_PAD else covered
        return covered, self._send(send, term[term_offset : term_offset + wire])

    def _send(self, send: Send, datagram: Any) -> int:
        assert self.system_counters is not None
        return self.system_counters.count_send(len(datagram), send(datagram))

    def _count(self, counter: SystemCounterId, delta: int = 1) -> None:
        assert self.system_counters is not None
        self.system_counters.increment(counter, delta)

    # -- control frames ---------------------------------------------------------------------------
    def is_plausible_status_message(self, sm: StatusMessageFrame) -> bool:
        """Could a receiver of this stream have sent ``sm``? (See :meth:`plausible_position`.)"""
        return self.plausible_position(sm) is not None

    def plausible_position(self, sm: StatusMessageFrame) -> int | None:
        """The consumption position of ``sm``, or None if no receiver of this stream could have sent it:
        its consumption offset lies within a term on a frame boundary (a multiple of 32), its window is at most half a term (Aeron's receivers
        and ours cap it there), and its consumption position lies between 0 and snd-pos (nobody consumed
        what was not sent). Checked before any arithmetic: a forged SM far ahead once raised the sender
        limit past int32 and stalled the stream for good. Setup-eliciting SMs carry zeros and are not
        checked."""
        log = self.log
        term_length = log.term_length
        if (
            sm.consumption_term_offset > term_length
            or sm.consumption_term_offset & (dh.FRAME_ALIGNMENT - 1)
            or sm.receiver_window_length > term_length // 2
        ):
            return None
        position = log.position_of(sm.consumption_term_id, sm.consumption_term_offset)
        return position if 0 <= position <= self.sender_position.get() else None

    def on_status_message(
        self, sm: StatusMessageFrame, now_ns: int, source: tuple[str, int] | None = None, position: int | None = None
    ) -> None:
        """An SM for this publication; ``position``: its consumption position when the caller has it."""
        self.time_of_last_sm_ns = now_ns
        if sm.flags & SEND_SETUP_FLAG:
            self.should_send_setup = True
            self.next_setup_ns = 0
            return
        if position is None:
            position = self.log.position_of(sm.consumption_term_id, sm.consumption_term_offset)
        flow_control = self.flow_control
        receiver_id = sm.receiver_id
        if source is not None:
            self.receiver_addresses[receiver_id] = source
            self._remember_nak_source(source, receiver_id, position, sm.receiver_window_length, now_ns)
        self._set_sender_limit(
            flow_control.on_status_message(
                position,
                sm.receiver_window_length,
                receiver_id,
                sm.group_tag,
                bool(sm.flags & END_OF_STREAM_FLAG),
                self.sender_limit,
                now_ns,
            )
        )
        counter_id = self.receiver_counters.get(receiver_id)
        if counter_id is not None:
            self.counters.set_value(counter_id, flow_control.receivers[receiver_id].last_position)
        if self.is_connected or not flow_control.has_required_receivers():
            return
        if not self.has_received_sm:
            self.has_received_sm = True
            self.should_send_setup = False
        self.is_connected = True
        self.log.set_connected(True)

    def _remember_nak_source(self, source: Address, receiver_id: int, position: int, window: int, now_ns: int) -> None:
        nak_source = self.nak_sources.get(source)
        if nak_source is None:
            if len(self.nak_sources) >= MAX_NAK_SOURCES:
                return
            nak_source = self.nak_sources[source] = NakSource({}, now_ns)
        receivers = nak_source.receivers
        if receiver_id in receivers or len(receivers) < 16:
            previous = receivers.get(receiver_id, (position, window))[0]
            receivers[receiver_id] = (max(previous, position), window)
            nak_source.lowest = min(receivers.values())
        nak_source.time_of_last_sm_ns = now_ns

    def _forget_silent_nak_sources(self, now_ns: int) -> None:
        timeout = self.flow_control.spec.receiver_timeout_ns
        silent = [a for a, s in self.nak_sources.items() if now_ns - s.time_of_last_sm_ns > timeout]
        for address in silent:
            del self.nak_sources[address]

    def set_destination_count(self, count: int) -> None:
        if self.mdc_destinations_counter_id >= 0:
            self.counters.set_value(self.mdc_destinations_counter_id, count)

    def _set_sender_limit(self, limit: int) -> None:
        if limit != self.sender_limit:
            self.sender_limit = limit
            self.counters.set_value(self.sender_limit_id, limit)
        flow_control = self.flow_control
        if flow_control.changes != self._flow_control_changes:
            self._flow_control_changes = flow_control.changes
            for receiver_id in [r for r in self.receiver_addresses if r not in flow_control.receivers]:
                del self.receiver_addresses[receiver_id]
            if self.receivers_counter_id >= 0:
                self.counters.set_value(self.receivers_counter_id, len(flow_control.receivers))
                self._sync_receiver_counters()

    def _sync_receiver_counters(self) -> None:
        """One ``fc-rcv-pos`` counter per receiver in the group, labelled with its id and address."""
        receivers = self.flow_control.receivers
        for receiver_id in [r for r in self.receiver_counters if r not in receivers]:
            self.counters.free(self.receiver_counters.pop(receiver_id))
        for receiver_id, receiver in receivers.items():
            if receiver_id in self.receiver_counters:
                continue
            if len(self.receiver_counters) >= MAX_RECEIVER_COUNTERS or not self.counters.has_room(1):
                break
            host, port = self.receiver_addresses.get(receiver_id, ("?", 0))
            label = cd.stream_label("fc-rcv-pos", self.registration_id, self.session_id, self.stream_id, self.channel)
            self.receiver_counters[receiver_id] = self.counters.allocate(
                f"{label} receiver={receiver_id & 0xFFFFFFFFFFFFFFFF:x} {host}:{port}",
                cd.FLOW_CONTROL_RECEIVER_POSITION_TYPE_ID,
                cd.STREAM_KEY.pack(self.registration_id, self.session_id, self.stream_id, 0),
                registration_id=self.registration_id,
                initial_value=receiver.last_position,
            )

    def on_nak(self, nak: NakFrame, now_ns: int, send: Send, source: Address | None = None, member: bool = True) -> int:
        """Resend what the NAK's receiver can lack of the range it names (see the module's theory);
        returns the bytes sent. ``source``: where it came from (None: trusted, as in unit tests);
        ``member``: False if the endpoint knows the source is no receiver (not an MDC destination)."""
        return self.on_nak_range(nak.term_id, nak.term_offset, nak.length, now_ns, send, source, member)

    def on_nak_range(
        self,
        term_id: int,
        term_offset: int,
        length: int,
        now_ns: int,
        send: Send,
        source: Address | None = None,
        member: bool = True,
    ) -> int:
        """:meth:`on_nak` for a NAK's fields, as the endpoint unpacks them (no frame object per NAK).
        What a flood sends is dropped by the first checks, before any list or dict is built."""
        term_length = self.log.term_length
        if (
            term_offset < 0
            or term_offset > term_length - dh.HEADER_LENGTH
            or length <= 0
            or (term_offset | length) & (dh.FRAME_ALIGNMENT - 1)  # the decoder checks; a caller may not
        ):
            self._count(SystemCounterId.INVALID_PACKETS)
            self._count(SystemCounterId.NAKS_MALFORMED)
            return 0
        if source is None:
            lowest, window = 0, term_length // 2
        else:
            nak_source = self.nak_sources.get(source) if member else None
            if nak_source is None:
                self._count(SystemCounterId.NAKS_FROM_NON_RECEIVERS)
                return 0
            lowest, window = nak_source.lowest
        self.naks_received += 1
        if self.naks_received_id >= 0:
            self.counters.set_value(self.naks_received_id, self.naks_received)
        resendable = self._resendable_range(term_id, term_offset, length, lowest, window)
        if resendable is None:
            self._count(SystemCounterId.NAKS_WITHOUT_RESEND)
            return 0
        term_start, start, end = resendable
        planned = self.retransmit_handler.plan(start, end, now_ns, self.mtu_length)
        if isinstance(planned, NakOutcome):
            self._count(_OUTCOME_COUNTERS[planned])
            return 0
        return self._resend(term_start, planned, now_ns, send)

    def _resendable_range(
        self, term_id: int, term_offset: int, length: int, lowest: int, window: int
    ) -> tuple[int, int, int] | None:
        """What a receiver whose lowest SM says (``lowest``, ``window``) can lack of a well-formed NAK's
        range: (its term's start, start, end) as stream positions, or None when that is nothing."""
        term_length = self.log.term_length
        sender_position = self.sender_position.get()
        asked = self.log.position_of(term_id, term_offset)
        term_start = asked - term_offset
        # a receiver never NAKs below what it reported consumed (its gaps start at or past its rebuild
        # position): such a NAK is stale or forged, and gets nothing rather than a clamped range
        end = min(asked + length, term_start + term_length, sender_position, asked + window)
        if asked < lowest or asked >= end or asked <= sender_position - term_length:  # cleaning: a term behind
            return None
        start = asked
        base = max(lowest, term_start) - term_start  # a frame boundary at or below the NAK's offset
        if term_offset > base:  # an offset a receiver chose: move it back to the start of its frame
            term = self.log.terms[(term_start // term_length) % 3]
            start = term_start + base + native.term_scan_for_availability(term, base, term_offset - base)
        return term_start, start, end

    def _resend(self, term_start: int, planned: tuple[int, int], now_ns: int, send: Send) -> int:
        """Send the frames of the term at ``term_start`` from ``planned`` start to end (stream positions)
        again, as they were sent; the bytes sent (Aeron's RetransmitSender.resend)."""
        term = self.log.terms[(term_start // self.log.term_length) % 3]
        start, end = planned
        offset = start - term_start
        remaining = end - start
        sent = 0
        while remaining > 0:
            covered, n = self._send_datagram(term, offset, remaining, send)
            if not covered:
                break
            sent += n
            offset += covered
            remaining -= covered
        self.retransmit_handler.on_resent(start, term_start + offset, now_ns)
        self._count(SystemCounterId.RETRANSMITS_SENT)
        self._count(SystemCounterId.RETRANSMITTED_BYTES, sent)
        return sent

    # -- conductor duty cycle ---------------------------------------------------------------------
    def flow_control_positions(self) -> list[int]:
        """Spies, and the sender position while a receiver is connected (Aeron's pub-lmt rule)."""
        positions = super().flow_control_positions()
        if self.is_connected:
            positions.append(self.sender_position.get_volatile())
        return positions

    def update_publisher_limit(self) -> int:
        """As an IPC publication's, except that with no receiver connected (and no spy) the limit is
        pinned to snd-pos, so offers see NOT_CONNECTED rather than filling the window (Aeron's rule)."""
        if self.is_connected or self.subscribers or self.state is not PublicationState.ACTIVE:
            return super().update_publisher_limit()
        sender_position = self.sender_position.get_volatile()
        if self.publisher_limit.get() > sender_position:
            self.publisher_limit.set_ordered(sender_position)
            return 1
        return 0

    def on_time_event(self, now_ns: int) -> None:
        if self.is_connected and now_ns - self.time_of_last_sm_ns > self.connection_timeout_ns:
            self.is_connected = False
            self.has_received_sm = False
            self.should_send_setup = True
            if not self.subscribers:
                self.update_publisher_limit()  # pinned to snd-pos before a client can see not-connected
                self.log.set_connected(False)
        if self.state is PublicationState.DRAINING:
            eos = self.log.end_of_stream_position()
            spies_done = all(s.position.get_volatile() >= eos for s in self.subscribers.values())
            sent = not self.is_connected or self.sender_position.get_volatile() >= eos
            if (spies_done and sent and now_ns >= self.draining_deadline_ns) or (
                now_ns >= self.draining_deadline_ns + self.linger_timeout_ns
            ):
                self.transition(PublicationState.DONE)

    def close(self) -> None:
        self.sender_position.close()
        self.counters.free(self.sender_position_id)
        self.counters.free(self.sender_limit_id)
        for counter_id in (
            self.receivers_counter_id,
            self.mdc_destinations_counter_id,
            *self.receiver_counters.values(),
            self.sender_bpe_id,
            self.naks_received_id,
        ):
            if counter_id >= 0:
                self.counters.free(counter_id)
        super().close()
