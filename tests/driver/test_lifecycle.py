"""The publication and image lifecycles: transition tables, and objects that move only through them."""

from __future__ import annotations

import itertools
from enum import Enum

import pytest

from logbuf.driver.ipc_publication import IpcPublication
from logbuf.driver.lifecycle import (
    IMAGE_TRANSITIONS,
    PUBLICATION_TRANSITIONS,
    IllegalTransitionError,
    ImageState,
    PublicationState,
    check_transition,
)
from logbuf.driver.network_publication import NetworkPublication
from logbuf.driver.publication_image import PublicationImage
from logbuf.errors import LogbufError

MACHINES = [(PublicationState, PUBLICATION_TRANSITIONS), (ImageState, IMAGE_TRANSITIONS)]


@pytest.mark.parametrize(("states", "table"), MACHINES, ids=["publication", "image"])
def test_every_pair_in_the_table_is_allowed_and_every_other_pair_is_refused_naming_both_states(
    states: type[Enum], table: dict[tuple[Enum, Enum], str]
) -> None:
    for current, to in itertools.product(states, states):
        if (current, to) in table:
            assert check_transition(table, current, to, "thing 7") is to
        else:
            with pytest.raises(IllegalTransitionError, match=f"^thing 7: {current.name} -> {to.name} is not a"):
                check_transition(table, current, to, "thing 7")


@pytest.mark.parametrize(("states", "table"), MACHINES, ids=["publication", "image"])
def test_every_state_is_reached_from_active_and_done_is_terminal(
    states: type[Enum], table: dict[tuple[Enum, Enum], str]
) -> None:
    reached, frontier = {states["ACTIVE"]}, [states["ACTIVE"]]
    while frontier:
        current = frontier.pop()
        for source, target in table:
            if source is current and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(states)
    assert not [pair for pair in table if pair[0] is states["DONE"]]
    assert all(reason for reason in table.values()), "every transition names its event"


def test_the_error_lists_what_is_allowed_and_is_a_logbuf_error() -> None:
    with pytest.raises(LogbufError, match=r"from ACTIVE: DRAINING$"):
        check_transition(PUBLICATION_TRANSITIONS, PublicationState.ACTIVE, PublicationState.DONE, "publication 1")
    with pytest.raises(IllegalTransitionError, match=r"from DONE: none \(terminal\)$"):
        check_transition(IMAGE_TRANSITIONS, ImageState.DONE, ImageState.ACTIVE, "image 2")


@pytest.mark.parametrize("kind", [IpcPublication, NetworkPublication, PublicationImage])
def test_state_is_read_only_so_objects_move_only_through_transition(kind: type) -> None:
    state = kind.state
    assert isinstance(state, property) and state.fset is None
    assert callable(kind.transition)
