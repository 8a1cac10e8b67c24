"""Sender flow-control strategies: how status messages from many receivers set one sender limit.

Sans-IO and pure: a strategy takes decoded status-message fields and ``now_ns`` and returns the new
sender limit (``snd-lmt``); it holds no socket, clock or counter. :class:`NetworkPublication
<logbuf.driver.network_publication.NetworkPublication>` calls it on every SM and, about every
millisecond, :meth:`SenderFlowControl.on_idle` (which times receivers out).

Chosen by the channel's ``fc=`` parameter, parsed as Aeron's C driver does
(``aeron_flow_control_parse_tagged_options``): a strategy name, then comma-separated options::

    fc=max                      pace to the fastest receiver (multicast and MDC default)
    fc=min[,t:<duration>][,g:/<min group size>]
                                pace to the slowest live receiver
    fc=tagged,g:<tag>[/<min group size>][,t:<duration>]
                                min over the receivers whose SM carries group tag <tag>

Unicast channels without ``fc=`` keep the unicast strategy (one receiver: the limit only grows, to
the SM's position plus its window).

Receivers are tracked by the receiver id their SMs carry (several receivers may share one source
address: drivers on one host), so ``logbuf-stat`` can show each one. Under ``min``/``tagged`` a
receiver leaves the group when no SM came for the receiver timeout (``t:``, default 5 s) or at once
when its SM carries the end-of-stream flag; a receiver that would join more than one window behind
the slowest member is not admitted (Aeron's rule: a late joiner does not pull the group back).
Until ``min group size`` receivers are members the limit does not move
(:meth:`SenderFlowControl.has_required_receivers` is False, so the publication is not connected).
``max`` and unicast track receivers only to show them (and drop them after the same timeout);
their limit never depends on the group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from logbuf.errors import InvalidChannelError

RECEIVER_TIMEOUT_DEFAULT_NS: Final[int] = 5_000_000_000
"""Aeron's ``aeron.flow.control.receiver.timeout``."""
MAX_TRACKED_RECEIVERS: Final[int] = 1024
"""Receivers one publication tracks at most: SMs carrying yet more receiver ids (forged, say) are not
tracked until others time out, so they cannot grow the driver's memory without bound."""
STRATEGIES: Final[tuple[str, ...]] = ("max", "min", "tagged")
_DURATION = re.compile(r"^(\d+)(ns|us|ms|s)?$", re.IGNORECASE)
_UNITS: Final[dict[str, int]] = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "": 1}


@dataclass(frozen=True)
class FlowControlSpec:
    """A parsed ``fc=`` value: ``unicast`` when the channel is unicast and names none."""

    strategy: str = "unicast"
    receiver_timeout_ns: int = RECEIVER_TIMEOUT_DEFAULT_NS
    group_tag: int | None = None
    group_min_size: int = 0

    def __str__(self) -> str:
        parts = [self.strategy]
        if self.group_tag is not None or self.group_min_size:
            tag = "" if self.group_tag is None else str(self.group_tag)
            parts.append(f"g:{tag}" + (f"/{self.group_min_size}" if self.group_min_size else ""))
        if self.receiver_timeout_ns != RECEIVER_TIMEOUT_DEFAULT_NS:
            parts.append(f"t:{self.receiver_timeout_ns}ns")
        return ",".join(parts)


def parse_flow_control(
    fc: str | None, *, group: bool, default_timeout_ns: int = RECEIVER_TIMEOUT_DEFAULT_NS
) -> FlowControlSpec:
    """``fc=`` to a spec; ``group``: the channel is multicast or MDC (default ``max``), else unicast.
    Raises InvalidChannelError naming the bad part."""
    if fc is None:
        return FlowControlSpec("max" if group else "unicast", default_timeout_ns)
    name, *options = fc.split(",")
    if name not in STRATEGIES:
        raise InvalidChannelError(f"fc={fc!r}: strategy {name!r} is not one of {', '.join(STRATEGIES)}")
    timeout_ns = default_timeout_ns
    group_tag: int | None = None
    group_min_size = 0
    for option in options:
        key, sep, value = option.partition(":")
        if not sep or key not in ("g", "t") or not value:
            raise InvalidChannelError(f"fc={fc!r}: option {option!r} is not g:<tag>[/<min size>] or t:<duration>")
        if key == "t":
            match = _DURATION.match(value)
            if not match:
                raise InvalidChannelError(f"fc={fc!r}: timeout {value!r} is not a duration (e.g. 5s, 500ms)")
            timeout_ns = int(match[1]) * _UNITS[(match[2] or "").lower()]
            continue
        tag_text, slash, size_text = value.partition("/")
        if tag_text:
            try:
                group_tag = int(tag_text)
            except ValueError:
                raise InvalidChannelError(f"fc={fc!r}: group tag {tag_text!r} is not an integer") from None
            if not -(1 << 63) <= group_tag < (1 << 63):
                raise InvalidChannelError(f"fc={fc!r}: group tag {tag_text!r} is not a 64-bit integer")
        if slash:
            if not size_text.isdigit() or int(size_text) > (1 << 31) - 1:
                raise InvalidChannelError(f"fc={fc!r}: group min size {size_text!r} is not 0..2^31-1")
            group_min_size = int(size_text)
    if name == "tagged" and group_tag is None:
        raise InvalidChannelError(f"fc={fc!r}: tagged flow control needs a group tag (g:<tag>)")
    return FlowControlSpec(name, timeout_ns, group_tag, group_min_size)


@dataclass
class TrackedReceiver:
    """One receiver as its last SM described it."""

    receiver_id: int
    last_position: int
    last_position_plus_window: int
    time_of_last_sm_ns: int
    group_tag: int | None = None
    eos_flagged: bool = False


@dataclass
class SenderFlowControl:
    """The unicast strategy, and the base of the others: limit = max(limit, SM position + window).
    ``receivers`` (by receiver id) are the members of the group as the strategy counts them."""

    spec: FlowControlSpec = field(default_factory=FlowControlSpec)
    receivers: dict[int, TrackedReceiver] = field(default_factory=dict)
    changes: int = 0
    """Incremented whenever a receiver joins or leaves (the publication updates its counter then)."""

    def matches(self, group_tag: int | None) -> bool:
        """Does an SM with this group tag count in the group?"""
        return True

    def has_required_receivers(self) -> bool:
        return len(self.receivers) >= self.spec.group_min_size

    def _track(
        self, position: int, window: int, receiver_id: int, group_tag: int | None, eos: bool, now_ns: int
    ) -> None:
        receiver = self.receivers.get(receiver_id)
        if receiver is not None:
            receiver.last_position = max(receiver.last_position, position)
            receiver.last_position_plus_window = position + window
            receiver.time_of_last_sm_ns = now_ns
            receiver.group_tag = group_tag
            receiver.eos_flagged = eos
        elif not eos and len(self.receivers) < MAX_TRACKED_RECEIVERS and self._admits(position, window):
            self.receivers[receiver_id] = TrackedReceiver(receiver_id, position, position + window, now_ns, group_tag)
            self.changes += 1

    def _admits(self, position: int, window: int) -> bool:
        return True

    def on_status_message(
        self,
        position: int,
        window: int,
        receiver_id: int,
        group_tag: int | None,
        eos: bool,
        sender_limit: int,
        now_ns: int,
    ) -> int:
        """A (non setup-eliciting) SM: the new sender limit."""
        self._track(position, window, receiver_id, group_tag, eos, now_ns)
        return max(sender_limit, position + window)

    def on_idle(self, now_ns: int, sender_limit: int) -> int:
        """Drop receivers silent for the timeout or flagged end-of-stream; the new sender limit."""
        timeout = self.spec.receiver_timeout_ns
        gone = [
            r.receiver_id for r in self.receivers.values() if r.eos_flagged or now_ns - r.time_of_last_sm_ns > timeout
        ]
        for receiver_id in gone:
            del self.receivers[receiver_id]
            self.changes += 1
        return sender_limit


class MaxFlowControl(SenderFlowControl):
    """``fc=max``: the fastest receiver sets the pace (slower ones NAK or fall behind)."""


class MinFlowControl(SenderFlowControl):
    """``fc=min``: the slowest live member sets the pace."""

    def _admits(self, position: int, window: int) -> bool:
        if not self.receivers:
            return True
        slowest = min(r.last_position_plus_window for r in self.receivers.values())
        return position + window >= slowest - window

    def _min_limit(self) -> int | None:
        members = [r.last_position_plus_window for r in self.receivers.values() if not r.eos_flagged]
        return min(members) if members else None

    def on_status_message(
        self,
        position: int,
        window: int,
        receiver_id: int,
        group_tag: int | None,
        eos: bool,
        sender_limit: int,
        now_ns: int,
    ) -> int:
        if self.matches(group_tag):
            self._track(position, window, receiver_id, group_tag, eos, now_ns)
        if not self.has_required_receivers():
            return sender_limit
        limit = self._min_limit()
        if limit is None:  # no member (min group size 0): this SM alone
            return max(sender_limit, position + window)
        return max(sender_limit, limit)

    def on_idle(self, now_ns: int, sender_limit: int) -> int:
        super().on_idle(now_ns, sender_limit)
        limit = self._min_limit()
        if limit is None or not self.has_required_receivers():
            return sender_limit
        return max(sender_limit, limit)


class TaggedFlowControl(MinFlowControl):
    """``fc=tagged,g:<tag>``: min over the receivers whose SMs carry the tag; others are ignored."""

    def matches(self, group_tag: int | None) -> bool:
        return group_tag is not None and group_tag == self.spec.group_tag


def new_flow_control(spec: FlowControlSpec) -> SenderFlowControl:
    """The strategy a spec names."""
    kind = {"unicast": SenderFlowControl, "max": MaxFlowControl, "min": MinFlowControl, "tagged": TaggedFlowControl}
    return kind[spec.strategy](spec)
