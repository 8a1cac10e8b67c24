"""The relay's per-connection state machine: the transition table (jetstream/subscriber_state.py)."""

from __future__ import annotations

import pytest

from logbuf.jetstream.subscriber_state import (
    READING_FRAMES,
    TRANSITIONS,
    UPGRADED,
    Input,
    State,
    TransitionError,
    next_state,
)

PATHS = [
    # a plain /subscribe client, served, that closes
    ([Input.UPGRADED, Input.OPTIONS_UPDATE, Input.CLOSE_QUEUED, Input.WRITE_SHUT, Input.ENDED], State.CLOSED),
    # requireHello, released by its options_update
    ([Input.UPGRADED_HELD, Input.HELLO], State.STREAMING),
    # requireHello during a backfill whose loaded events do not reach its cursor yet
    ([Input.UPGRADED_HELD, Input.HELLO_WAITING, Input.OPTIONS_UPDATE, Input.BACKFILL_DONE], State.STREAMING),
    ([Input.UPGRADED_WAITING, Input.BACKFILL_DONE, Input.CLOSE_QUEUED], State.CLOSING),
    # 400 / 404 / 429 / metrics: a final response, then linger for the peer's EOF
    ([Input.RESPONDED, Input.WRITE_SHUT, Input.ENDED], State.CLOSED),
    # silent connection: handshake timeout
    ([Input.ENDED], State.CLOSED),
]


@pytest.mark.parametrize("inputs, final", PATHS)
def test_paths_through_the_table(inputs: list[Input], final: State) -> None:
    state = State.HANDSHAKE
    for event in inputs:
        state = next_state(state, event)
    assert state is final


def test_every_open_state_can_end_and_closed_is_terminal() -> None:
    for state in State:
        if state is State.CLOSED:
            assert not [key for key in TRANSITIONS if key[0] is State.CLOSED]
        else:
            assert next_state(state, Input.ENDED) is State.CLOSED


def test_every_state_is_reachable_from_the_handshake() -> None:
    reached = {State.HANDSHAKE}
    frontier = [State.HANDSHAKE]
    while frontier:
        state = frontier.pop()
        for (source, _), target in TRANSITIONS.items():
            if source is state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(State)


@pytest.mark.parametrize(
    "state, event",
    [
        (State.HANDSHAKE, Input.HELLO),  # an options_update before the upgrade
        (State.STREAMING, Input.UPGRADED),  # a second request on an upgraded connection
        (State.CLOSING, Input.CLOSE_QUEUED),
        (State.LINGER, Input.WRITE_SHUT),
        (State.CLOSED, Input.ENDED),
        (State.STREAMING, Input.BACKFILL_DONE),
    ],
)
def test_a_missing_transition_raises_naming_the_state_and_input(state: State, event: Input) -> None:
    with pytest.raises(TransitionError, match=f"from {state.name} on {event.name}"):
        next_state(state, event)


def test_upgraded_states_are_the_ones_between_the_101_and_the_close() -> None:
    assert UPGRADED == {State.HELD, State.WAITING, State.STREAMING} == READING_FRAMES
    for state in UPGRADED:
        assert next_state(state, Input.CLOSE_QUEUED) is State.CLOSING
