"""The control session's transition table: the spec's table is the code's, and nothing outside it happens."""

from __future__ import annotations

import itertools
import pathlib
import re

import pytest

from logbuf.archive.control_session_state import (
    TRANSITIONS,
    ControlSessionStateError,
    SessionEvent,
    SessionState,
    next_state,
)

SPEC = pathlib.Path(__file__).resolve().parents[2] / "protocol_spec" / "archive-control.md"


def spec_rows() -> dict[tuple[str, str], str]:
    section = SPEC.read_text(encoding="utf-8").split("## Session state machine", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| ([A-Z_]+) \| ([A-Z_]+) \| ([A-Z_]+) \|$", section, re.M)
    return {(state, event): after for state, event, after in rows}


def test_the_spec_table_is_the_transition_table() -> None:
    code = {(state.value, event.value): after.value for (state, event), after in TRANSITIONS.items()}
    assert spec_rows() == code


@pytest.mark.parametrize("state, event", list(itertools.product(SessionState, SessionEvent)))
def test_every_pair_outside_the_table_is_an_error_naming_both(state: SessionState, event: SessionEvent) -> None:
    if (state, event) in TRANSITIONS:
        assert next_state(state, event) is TRANSITIONS[(state, event)]
        return
    with pytest.raises(ControlSessionStateError, match=f"{event.value} is not allowed in state {state.value}"):
        next_state(state, event)


def test_every_state_can_end_and_done_is_final() -> None:
    assert not [key for key in TRANSITIONS if key[0] is SessionState.DONE]
    for state in SessionState:
        if state is not SessionState.DONE:
            assert next_state(state, SessionEvent.CLOSE) is SessionState.DONE  # a client can always leave
    # only a connected response stream (or a right answer to the challenge) makes a session ACTIVE
    into_active = {key for key, after in TRANSITIONS.items() if after is SessionState.ACTIVE and key[0] is not after}
    assert into_active == {
        (SessionState.CONNECTING, SessionEvent.RESPONSE_CONNECTED),
        (SessionState.CHALLENGED, SessionEvent.CHALLENGE_ANSWERED),
    }
