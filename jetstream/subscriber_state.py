"""The relay's per-connection state machine, with every transition in one table.

Theory of operation
-------------------
A connection to the relay (a ``/subscribe`` client, or any HTTP request on the public or metrics
port) lives in one :class:`State` at a time. The server and the fan-out engine never assign a state:
they report what happened as an :class:`Input` and :func:`next_state` looks the pair up in
:data:`TRANSITIONS`. A pair missing from the table is a bug in the relay, not bad input (bad input
always has a transition: it closes the connection); it raises :class:`TransitionError`, which the
server treats like any other error on one connection: counted, that connection closed, the relay
goes on. ``protocol_spec/jetstream-relay.md`` draws the same machine.

::

    accept ─> HANDSHAKE ─UPGRADED─────────> STREAMING ─┐
                 │  └──UPGRADED_HELD──> HELD ─HELLO──────┤ (OPTIONS_UPDATE: stays)
                 │  └──UPGRADED_WAITING─> WAITING ─BACKFILL_DONE─> STREAMING
                 │                     HELD ─HELLO_WAITING─> WAITING
                 └─RESPONDED (a final HTTP response, or none) ─> CLOSING
    HELD / WAITING / STREAMING ─CLOSE_QUEUED─> CLOSING ─WRITE_SHUT─> LINGER
    any state ─ENDED (peer EOF, timeout, socket error, dropped)─> CLOSED

* HANDSHAKE: reading the HTTP request (bounded by the handshake timeout and the request-size cap).
* HELD: ``requireHello``: the 101 is sent, nothing else until a valid ``options_update``.
* WAITING: upgraded while the relay is still loading its recorded events (background backfill) and
  the client's cursor lies beyond what is loaded (or it asked for live events): it starts when the
  backfill is done. A cursor inside what is loaded starts at once: later appends are all newer.
* STREAMING: receiving events (replay and live are one path).
* CLOSING: a last HTTP response or a close frame is queued; once written, the write side is shut.
* LINGER: reading until the peer closes too (bounded by the close timeout).
* CLOSED: the socket is closed and the connection forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, IntEnum
from typing import Final

from logbuf.errors import LogbufError

__all__ = ["READING_FRAMES", "TRANSITIONS", "UPGRADED", "Input", "State", "TransitionError", "next_state"]


class State(IntEnum):
    HANDSHAKE = 0
    HELD = 1
    WAITING = 2
    STREAMING = 3
    CLOSING = 4
    LINGER = 5
    CLOSED = 6


class Input(Enum):
    UPGRADED = "upgraded"  # 101 queued; the cursor can be served now
    UPGRADED_HELD = "upgraded_held"  # 101 queued; requireHello
    UPGRADED_WAITING = "upgraded_waiting"  # 101 queued; the cursor is beyond what the backfill has loaded
    RESPONDED = "responded"  # a final HTTP response queued (or the request was not HTTP: no response)
    HELLO = "hello"  # a HELD connection's first valid options_update; the cursor can be served now
    HELLO_WAITING = "hello_waiting"  # ... while its cursor is beyond what the backfill has loaded
    OPTIONS_UPDATE = "options_update"  # a later valid options_update: new filters, same state
    BACKFILL_DONE = "backfill_done"  # the background backfill finished: waiting connections start
    CLOSE_QUEUED = "close_queued"  # our close frame, or the answer to theirs, is queued
    WRITE_SHUT = "write_shut"  # everything queued is written and the write side is shut
    ENDED = "ended"  # peer EOF, handshake/close timeout, socket error, or dropped by the relay


#: Connections that completed the websocket upgrade (counted in ``jetstream_subscribers_connected``).
UPGRADED: Final = frozenset((State.HELD, State.WAITING, State.STREAMING))
#: Connections whose client frames are acted on (``options_update``); later ones are discarded.
READING_FRAMES: Final = UPGRADED

_OPEN: Final = (State.HANDSHAKE, State.HELD, State.WAITING, State.STREAMING, State.CLOSING, State.LINGER)

TRANSITIONS: Final[Mapping[tuple[State, Input], State]] = {
    (State.HANDSHAKE, Input.UPGRADED): State.STREAMING,
    (State.HANDSHAKE, Input.UPGRADED_HELD): State.HELD,
    (State.HANDSHAKE, Input.UPGRADED_WAITING): State.WAITING,
    (State.HANDSHAKE, Input.RESPONDED): State.CLOSING,
    (State.HELD, Input.HELLO): State.STREAMING,
    (State.HELD, Input.HELLO_WAITING): State.WAITING,
    (State.WAITING, Input.OPTIONS_UPDATE): State.WAITING,
    (State.STREAMING, Input.OPTIONS_UPDATE): State.STREAMING,
    (State.WAITING, Input.BACKFILL_DONE): State.STREAMING,
    (State.HELD, Input.CLOSE_QUEUED): State.CLOSING,
    (State.WAITING, Input.CLOSE_QUEUED): State.CLOSING,
    (State.STREAMING, Input.CLOSE_QUEUED): State.CLOSING,
    (State.CLOSING, Input.WRITE_SHUT): State.LINGER,
    **{(state, Input.ENDED): State.CLOSED for state in _OPEN},
}
"""(state, input) -> next state: the whole machine."""


class TransitionError(LogbufError, RuntimeError):
    """A (state, input) pair with no transition: a bug in the relay (the message names both)."""


def next_state(state: State, event: Input) -> State:
    """The state after ``event`` in ``state``; raises :class:`TransitionError` if the table has none."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise TransitionError(f"no transition from {state.name} on {event.name}") from None
