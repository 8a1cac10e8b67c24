"""NAK delay generators: when a receiver NAKs a gap it found (pure; the random source is injected).

Unicast: a fixed delay (``nak-delay``, 100 µs) and a fixed retry (10 ms). Multicast: RFC 5401's
optimal random back-off, as Aeron's ``OptimalMulticastDelayGenerator``, so that when one datagram
is lost to the whole group, one receiver's NAK (and the retransmit, multicast to every receiver)
comes before the others' timers run out, and the group does not answer one loss with a NAK
each. For a maximum back-off ``T`` and a group size ``N``, with ``λ = ln N + 1``::

    x     = uniform(0, λ/T) + λ / (T (e^λ − 1))
    delay = (T/λ) · ln(x · (e^λ − 1) · T/λ)          in 0..T, most of the mass near T

Retries draw a fresh delay the same way.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


@dataclass
class StaticDelayGenerator:
    """Unicast: ``delay_ns`` before the first NAK of a gap, ``retry_ns`` between the next ones."""

    delay_ns: int
    retry_ns: int

    def delay(self, retry: bool) -> int:
        return self.retry_ns if retry else self.delay_ns


@dataclass
class OptimalMulticastDelayGenerator:
    """Multicast: a random delay in ``0..max_backoff_ns`` (RFC 5401), for first NAKs and retries alike."""

    max_backoff_ns: int
    group_size: int
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.max_backoff_ns <= 0 or self.group_size < 1:
            raise ValueError(f"max_backoff_ns={self.max_backoff_ns} and group_size={self.group_size} must be positive")
        t = float(self.max_backoff_ns)
        lam = math.log(self.group_size) + 1.0
        self._rand_max = lam / t
        self._base_x = lam / (t * (math.exp(lam) - 1.0))
        self._constant_t = t / lam
        self._factor_t = (math.exp(lam) - 1.0) * (t / lam)

    def delay(self, retry: bool) -> int:
        x = self.rng.random() * self._rand_max + self._base_x
        return max(0, int(self._constant_t * math.log(x * self._factor_t)))
