"""Lifecycles of the driver's publications and images: their states and allowed transitions, as tables.

Theory of operation. Each machine is an ``Enum`` of states and a table mapping every allowed
``(from, to)`` pair to the event that causes it. An object in a machine (an
:class:`~logbuf.driver.ipc_publication.IpcPublication` or a
:class:`~logbuf.driver.network_publication.NetworkPublication`, a
:class:`~logbuf.driver.publication_image.PublicationImage`) keeps its state private, shows it
as a read-only ``state``, and moves only through its ``transition(to)``, which calls
:func:`check_transition`: a pair missing from the table raises :class:`IllegalTransitionError`
naming the object, both states and the transitions allowed from where it is. Such an error is a
driver bug; the conductor's duty cycle reports it through the agent runner's error handler
(Errors counter, distinct error log) and goes on. ``DONE`` is terminal in both machines: the
conductor frees an object's counters and log in the same cycle it reaches ``DONE``.

Publications (IPC and network)::

    ACTIVE --last publisher removed--> DRAINING --drained, or linger passed--> DONE

Images (the receiver's copy of a network publication)::

    ACTIVE --no packet for the liveness timeout--> INACTIVE --retired by the conductor--> DONE
      |                                                                                    ^
      +-------------the last subscription to its stream is removed (retired at once)-------+
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Final, TypeVar

from logbuf.errors import LogbufError

__all__ = [
    "IMAGE_TRANSITIONS",
    "PUBLICATION_TRANSITIONS",
    "IllegalTransitionError",
    "ImageState",
    "PublicationState",
    "check_transition",
]


class PublicationState(Enum):
    ACTIVE = "active"
    DRAINING = "draining"
    DONE = "done"


class ImageState(Enum):
    ACTIVE = "active"
    INACTIVE = "inactive"
    DONE = "done"


PUBLICATION_TRANSITIONS: Final[Mapping[tuple[PublicationState, PublicationState], str]] = {
    (PublicationState.ACTIVE, PublicationState.DRAINING): (
        "the last publisher is removed: end of stream is set at the tail, the linger timeout starts"
    ),
    (PublicationState.DRAINING, PublicationState.DONE): (
        "every subscriber (and, for a network publication, the sender) reached the end of stream "
        "(a network publication also waits out the linger), or the linger timeout passed"
    ),
}
"""(from, to) -> the event that moves a publication."""

IMAGE_TRANSITIONS: Final[Mapping[tuple[ImageState, ImageState], str]] = {
    (ImageState.ACTIVE, ImageState.INACTIVE): "no packet arrived for the image liveness timeout",
    (ImageState.ACTIVE, ImageState.DONE): "the last subscription to its stream on the endpoint is removed",
    (ImageState.INACTIVE, ImageState.DONE): (
        "the conductor retires it: on its next timer, or when a SETUP for the same session arrives first"
    ),
}
"""(from, to) -> the event that moves an image."""


class IllegalTransitionError(LogbufError):
    """A driver object was asked to make a transition its table does not allow (a driver bug)."""


_State = TypeVar("_State", bound=Enum)


def check_transition(table: Mapping[tuple[_State, _State], str], current: _State, to: _State, what: str) -> _State:
    """``to`` if ``(current, to)`` is in ``table``; else :class:`IllegalTransitionError` naming ``what``
    (the object), both states and the transitions allowed from ``current``."""
    if (current, to) not in table:
        allowed = sorted(target.name for source, target in table if source is current)
        raise IllegalTransitionError(
            f"{what}: {current.name} -> {to.name} is not a transition; from {current.name}: "
            f"{', '.join(allowed) if allowed else 'none (terminal)'}"
        )
    return to
