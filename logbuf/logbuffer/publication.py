"""Publications: append messages to a log (offer, batch offer, try_claim).

The hot paths are single native calls (:class:`logbuf.native.PublicationCore`); this module
adds the result vocabulary and the Python conveniences.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from logbuf import native
from logbuf.native import BufferClaim

__all__ = ["BufferClaim", "ConcurrentPublication", "ExclusivePublication", "OfferResult", "Publication"]


class OfferResult(IntEnum):
    """Negative results of ``offer``/``offer_batch``/``try_claim``, and what to do about each."""

    NOT_CONNECTED = -1
    """No subscriber is connected. Retry later, or wait for ``is_connected``."""
    BACK_PRESSURED = -2
    """The slowest subscriber is a term window behind. Retry (after an idle step)."""
    ADMIN_ACTION = -3
    """The log was rotating to the next term. Retry at once."""
    CLOSED = -4
    """The publication is closed. Stop offering."""
    MAX_POSITION_EXCEEDED = -5
    """The stream reached term_length * 2^31. Close and use a new publication."""


class Publication(native.PublicationCore):
    """A publication over one log. Use :meth:`offer` for one message, :meth:`offer_batch` for many
    small ones, :meth:`try_claim` to write in place.

    ``offer`` returns the new stream position (> 0) or a negative :class:`OfferResult`.
    """

    def __enter__(self) -> Publication:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "ExclusivePublication" if self.exclusive else "ConcurrentPublication"
        if self.is_closed:
            return f"{kind}(closed)"
        return (
            f"{kind}(session_id={self.session_id}, stream_id={self.stream_id}, position={self.position}, "
            f"position_limit={self.position_limit}, connected={self.is_connected})"
        )


# Aeron's names for the two kinds; ``exclusive`` picks the algorithm.
ConcurrentPublication = Publication
ExclusivePublication = Publication
