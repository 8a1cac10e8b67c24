"""What a NAK gets resent: the sender's side of loss repair, bounded against forged and stepped NAKs.

Sans-IO and pure: positions and ``now_ns`` in, the ranges to resend out; the publication reads the
log and sends. After Aeron's ``RetransmitHandler`` (at most ``max_retransmits`` retransmits active at
once, each lingering so that the same loss is not repaired twice in a row), with three changes that
close the amplification a stream of NAKs could buy:

- Lingering is kept per byte, not per (term id, term offset): a retransmit marks the range it resent,
  and a NAK gets only the bytes of its range that no lingering retransmit covers. NAKs stepping their
  offset by 32 (or any amount) buy each byte at most once per linger interval.
- The caller clamps a NAK to what its receiver can lack before asking (:meth:`RetransmitHandler.plan`
  takes the clamped range): nothing below the receiver's last status-message position, nothing at or
  past the sender position, at most one receiver window.
- A token bucket caps retransmitted bytes: it earns ``max_rate`` bytes per second plus one byte per
  :data:`NEW_DATA_PER_RETRANSMITTED_BYTE` bytes of new data the publication sends
  (:meth:`RetransmitHandler.on_sent`), and holds at most ``max(max_rate / 10, MIN_BURST_LENGTH)``; a NAK
  that finds it empty gets nothing and is counted. So whatever NAKs arrive, retransmits add at most a
  quarter of the stream's own rate plus ``max_rate`` to what the sender sends, while loss repair is not
  starved: up to a fifth of a stream lost is repaired from what it earns, more at ``max_rate``, and a
  whole window lost at once fits in the burst.

Theory of operation: ``_active`` holds one entry per retransmit still lingering, ``(expiry_ns, start,
end)``, as positions in the stream. ``_active`` is kept in order of start, and
``plan`` drops expired entries (only once the earliest expiry has come), refuses a NAK when
``max_retransmits`` are active (Aeron's "Retransmit Pool Overflow"), cuts the lingering ranges out of
the asked range and returns the first uncovered piece, shortened to the bucket's tokens. The caller
sends it and reports what the datagrams covered with :meth:`RetransmitHandler.on_resent`, which starts
that range's linger and spends the tokens. One piece per NAK: a receiver NAKs a gap from its start, so
what lies behind a lingering range is a later gap, which it NAKs on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Final

DEFAULT_LINGER_NS: Final[int] = 10_000_000
"""Aeron 1.53's ``aeron.retransmit.unicast.linger``."""
DEFAULT_MAX_RETRANSMITS: Final[int] = 16
"""Aeron's ``aeron.retransmit.handler.max.retransmits``."""
DEFAULT_MAX_RATE: Final[int] = 256 * 1024
"""Retransmitted bytes per second per publication, besides what new data sent earns."""
BURST_INTERVAL_NS: Final[int] = 100_000_000
"""The bucket holds this much time's worth of ``max_rate`` (at least ``MIN_BURST_LENGTH``)."""
NEW_DATA_PER_RETRANSMITTED_BYTE: Final[int] = 4
"""New data sent earns retransmits of a quarter of its length."""
MIN_BURST_LENGTH: Final[int] = 256 * 1024
"""A burst of loss repaired at once: twice the default receiver window."""


_NEVER: Final[int] = 1 << 62


class NakOutcome(Enum):
    """Why a NAK got nothing (``plan`` returns one of these instead of a range)."""

    NOTHING_TO_RESEND = "nothing to resend"
    """Every byte it names lingers from a recent retransmit (or the clamped range was empty)."""
    OVERFLOW = "too many retransmits active"
    RATE_LIMITED = "retransmit rate limit reached"


@dataclass
class RetransmitHandler:
    linger_ns: int = DEFAULT_LINGER_NS
    max_retransmits: int = DEFAULT_MAX_RETRANSMITS
    max_rate: int = DEFAULT_MAX_RATE
    """Bytes per second."""
    _active: list[tuple[int, int, int]] = field(default_factory=list)
    _tokens: int = 0
    _started: bool = False
    _last_refill_ns: int = 0
    _next_expiry_ns: int = 0
    """No entry of ``_active`` expires before this: NAKs in between skip the expiry scan."""

    @property
    def burst_length(self) -> int:
        return max(MIN_BURST_LENGTH, self.max_rate * BURST_INTERVAL_NS // 1_000_000_000)

    def on_sent(self, length: int) -> None:
        """``length`` bytes of new data went out: a quarter as many may be retransmitted."""
        if self._started and self._tokens < self.burst_length:
            self._tokens = min(self.burst_length, self._tokens + length // NEW_DATA_PER_RETRANSMITTED_BYTE)

    def active_count(self, now_ns: int) -> int:
        self._expire(now_ns)
        return len(self._active)

    def plan(self, start: int, end: int, now_ns: int, mtu_length: int = 0) -> tuple[int, int] | NakOutcome:
        """The part of ``[start, end)`` (positions, already clamped to what the receiver can lack) to
        resend now: ``(start, end)``, or why nothing is. The bucket must hold the whole range or one
        ``mtu_length`` (what one datagram of whole frames needs at most)."""
        if now_ns >= self._next_expiry_ns:
            self._expire(now_ns)
        for _, lingering_start, lingering_end in self._active:  # in order of start
            if lingering_end <= start or lingering_start >= end:
                continue
            if lingering_start <= start:
                start = lingering_end  # the head lingers: what follows it
            else:
                end = lingering_start  # a later part lingers: resend up to it
            if start >= end:
                return NakOutcome.NOTHING_TO_RESEND
        if start >= end:
            return NakOutcome.NOTHING_TO_RESEND
        if len(self._active) >= self.max_retransmits:
            return NakOutcome.OVERFLOW
        self._refill(now_ns)
        if self._tokens <= 0 or self._tokens < min(end - start, mtu_length):
            return NakOutcome.RATE_LIMITED
        return start, min(end, start + self._tokens)

    def on_resent(self, start: int, end: int, now_ns: int) -> None:
        """``[start, end)`` went out again: it lingers, and its bytes are spent from the bucket."""
        if end > start:
            expiry_ns = now_ns + self.linger_ns
            active = self._active
            i = len(active)
            while i and active[i - 1][1] > start:  # kept in order of start: a NAK walks it unsorted
                i -= 1
            active.insert(i, (expiry_ns, start, end))
            self._next_expiry_ns = min(self._next_expiry_ns, expiry_ns)
            self._tokens -= end - start

    def _expire(self, now_ns: int) -> None:
        if self._active and any(expiry <= now_ns for expiry, _, _ in self._active):
            self._active = [a for a in self._active if a[0] > now_ns]
        self._next_expiry_ns = min((a[0] for a in self._active), default=_NEVER)

    def _refill(self, now_ns: int) -> None:
        burst = self.burst_length
        if not self._started:
            self._started, self._tokens, self._last_refill_ns = True, burst, now_ns
            return
        added = (now_ns - self._last_refill_ns) * self.max_rate // 1_000_000_000
        if added > 0:  # else keep the time: many NAKs a few nanoseconds apart still earn their bytes
            self._tokens = min(burst, self._tokens + added)
            self._last_refill_ns = now_ns
