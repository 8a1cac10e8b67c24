"""Images: a subscriber's reading of one publication's log (poll, controlled poll, block poll)."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from logbuf import native
from logbuf.native import Header

__all__ = ["ControlledPollAction", "Header", "Image"]


class ControlledPollAction(IntEnum):
    """What a controlled-poll handler tells the image to do after a fragment."""

    ABORT = 1
    """Do not consume this fragment; stop. It is delivered again on the next poll."""
    BREAK = 2
    """Consume this fragment and stop polling."""
    COMMIT = 3
    """Consume this fragment, store the position now, and continue."""
    CONTINUE = 4
    """Consume this fragment and continue (returning None means the same)."""


class Image(native.ImageCore):
    """One subscriber's reading position in one log.

    ``poll(handler, fragment_limit)`` calls ``handler(payload: memoryview, header: Header)`` for
    each message fragment; both are valid only during the call (copy with ``bytes(payload)``
    or ``header.snapshot()`` to keep them).
    """

    def __enter__(self) -> Image:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.is_closed:
            return "Image(closed)"
        return f"Image(session_id={self.session_id}, stream_id={self.stream_id}, position={self.position})"
