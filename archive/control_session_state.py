"""The archive control session's state machine, as one transition table.

Theory of operation
-------------------
A control session is made by a connect request and lives until it is closed, times out or is refused.
Every change of state is an ``(state, event) -> state`` row of :data:`TRANSITIONS`; anything else is a
:class:`ControlSessionStateError` naming the state and the event (the conductor turns that into an error
response, never a crash). The conductor feeds events as things happen; the table holds no I/O.

::

    INIT --RESPONSE_ADDED--> CONNECTING --RESPONSE_CONNECTED--> ACTIVE            (no authentication)
                                        --CHALLENGE_SENT----->  CHALLENGED --CHALLENGE_ANSWERED--> ACTIVE
                                        --REJECT------------->  REJECTED   (version, auth, refused)
    CHALLENGED --REJECT--> REJECTED --FLUSHED--> DONE
    ACTIVE --REQUEST--> ACTIVE;  ACTIVE --CLOSE / TIMEOUT / RESPONSE_LOST / QUEUE_OVERFLOW--> DONE
    INIT, CONNECTING, CHALLENGED --TIMEOUT / CLOSE--> DONE

REJECTED sends its error response, then ends (FLUSHED, or TIMEOUT if the client stopped reading).
``protocol_spec/archive-control.md`` ("Session state machine") documents the same table; a test
checks that they agree.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from logbuf.errors import LogbufError

__all__ = ["TRANSITIONS", "ControlSessionStateError", "SessionEvent", "SessionState", "next_state"]


class SessionState(Enum):
    INIT = "INIT"
    """Connect request accepted; the response publication is being added."""
    CONNECTING = "CONNECTING"
    """Waiting for the client's response subscription to connect to the response publication."""
    CHALLENGED = "CHALLENGED"
    """A challenge was sent; waiting for the client's answer."""
    ACTIVE = "ACTIVE"
    """Requests are served."""
    REJECTED = "REJECTED"
    """An error response is on its way; then the session ends."""
    DONE = "DONE"
    """Closed: its replays stop and its resources go."""


class SessionEvent(Enum):
    RESPONSE_ADDED = "RESPONSE_ADDED"
    RESPONSE_CONNECTED = "RESPONSE_CONNECTED"
    CHALLENGE_SENT = "CHALLENGE_SENT"
    CHALLENGE_ANSWERED = "CHALLENGE_ANSWERED"
    REJECT = "REJECT"
    REQUEST = "REQUEST"
    FLUSHED = "FLUSHED"
    CLOSE = "CLOSE"
    TIMEOUT = "TIMEOUT"
    RESPONSE_LOST = "RESPONSE_LOST"
    QUEUE_OVERFLOW = "QUEUE_OVERFLOW"


S, E = SessionState, SessionEvent

TRANSITIONS: Final[dict[tuple[SessionState, SessionEvent], SessionState]] = {
    (S.INIT, E.RESPONSE_ADDED): S.CONNECTING,
    (S.INIT, E.REJECT): S.DONE,  # no response publication: nothing to say it on
    (S.INIT, E.TIMEOUT): S.DONE,
    (S.INIT, E.CLOSE): S.DONE,
    (S.CONNECTING, E.RESPONSE_CONNECTED): S.ACTIVE,
    (S.CONNECTING, E.CHALLENGE_SENT): S.CHALLENGED,
    (S.CONNECTING, E.REJECT): S.REJECTED,
    (S.CONNECTING, E.TIMEOUT): S.DONE,
    (S.CONNECTING, E.CLOSE): S.DONE,
    (S.CHALLENGED, E.CHALLENGE_ANSWERED): S.ACTIVE,
    (S.CHALLENGED, E.REJECT): S.REJECTED,
    (S.CHALLENGED, E.TIMEOUT): S.DONE,
    (S.CHALLENGED, E.CLOSE): S.DONE,
    (S.CHALLENGED, E.RESPONSE_LOST): S.DONE,
    (S.ACTIVE, E.REQUEST): S.ACTIVE,
    (S.ACTIVE, E.CLOSE): S.DONE,
    (S.ACTIVE, E.TIMEOUT): S.DONE,
    (S.ACTIVE, E.RESPONSE_LOST): S.DONE,
    (S.ACTIVE, E.QUEUE_OVERFLOW): S.DONE,
    (S.REJECTED, E.FLUSHED): S.DONE,
    (S.REJECTED, E.TIMEOUT): S.DONE,
    (S.REJECTED, E.CLOSE): S.DONE,
    (S.REJECTED, E.RESPONSE_LOST): S.DONE,
}
del S, E


class ControlSessionStateError(LogbufError, ValueError):
    """An event that the session's state does not allow (for example a request before the connect completed)."""

    def __init__(self, state: SessionState, event: SessionEvent) -> None:
        super().__init__(f"{event.value} is not allowed in state {state.value}")
        self.state = state
        self.event = event


def next_state(state: SessionState, event: SessionEvent) -> SessionState:
    """The state after ``event`` in ``state``; :class:`ControlSessionStateError` if the table has no row."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise ControlSessionStateError(state, event) from None
