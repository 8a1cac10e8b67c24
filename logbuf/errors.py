"""logbuf's error vocabulary: one base class, errors that name the bad value.

Hot paths (offer, poll) return codes, not exceptions: see :class:`logbuf.publication.OfferResult`.
Exceptions are for misuse (bad arguments, closed resources) and lifecycle problems.
"""

from __future__ import annotations


class LogbufError(Exception):
    """Base of every error logbuf raises on purpose."""


class ConfigurationError(LogbufError, ValueError):
    """A setting or argument is invalid; the message names it and its value."""
