"""Publisher limit and log cleaning: how far publishers may run ahead of the slowest subscriber.

Theory of operation
-------------------
``publisher_limit = min(subscriber positions) + term_window`` (term window <= term_length / 2).
Before the limit is raised, the log is cleaned (zeroed) up to ``min_position - term_length``:
everything more than a whole term behind the slowest subscriber. With the window at most
half a term, a publisher writing below the limit only ever lands in a partition whose previous
contents lie below the cleaned position, and never overtakes unread data.

The update is one small function (:func:`compute_limit_and_clean`). A media driver's conductor
calls it from one thread; standalone logs (:mod:`logbuf.logbuffer.standalone`) call it from whichever
publisher reaches the limit, serialised by a lock word in shared memory holding the pid of
the updater (a dead holder is taken over).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LimitUpdate:
    """Result of one flow-control step: what to clean and the limit to publish."""

    connected: bool
    clean_from: int
    clean_to: int
    limit: int


def compute_limit_and_clean(
    subscriber_positions: Iterable[int],
    *,
    current_limit: int,
    clean_position: int,
    term_length: int,
    term_window_length: int,
) -> LimitUpdate:
    """One flow-control step as a pure function.

    With no subscribers the stream is not connected and the limit stays where it is. Otherwise
    the clean range is ``[clean_position, min - term_length)`` (possibly empty) and the limit
    ``max(current_limit, min + term_window_length)``; clean before publishing the limit.
    """
    positions = list(subscriber_positions)
    if not positions:
        return LimitUpdate(False, clean_position, clean_position, current_limit)
    min_position = min(positions)
    clean_to = max(clean_position, min_position - term_length)
    return LimitUpdate(True, clean_position, clean_to, max(current_limit, min_position + term_window_length))
