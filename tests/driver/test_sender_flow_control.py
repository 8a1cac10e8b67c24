"""Sender flow-control strategies on a fake clock (plain ints): parsing, max, min, tagged."""

from __future__ import annotations

import pytest

from logbuf.driver.sender_flow_control import (
    MAX_TRACKED_RECEIVERS,
    RECEIVER_TIMEOUT_DEFAULT_NS,
    FlowControlSpec,
    MaxFlowControl,
    MinFlowControl,
    SenderFlowControl,
    TaggedFlowControl,
    new_flow_control,
    parse_flow_control,
)
from logbuf.errors import InvalidChannelError

W = 1000  # receiver window
S = 1_000_000_000


@pytest.mark.parametrize(
    ("fc", "group", "expected"),
    [
        (None, False, FlowControlSpec("unicast")),
        (None, True, FlowControlSpec("max")),
        ("max", False, FlowControlSpec("max")),
        ("min", True, FlowControlSpec("min")),
        ("min,t:2s", True, FlowControlSpec("min", 2 * S)),
        ("min,g:/3", True, FlowControlSpec("min", group_min_size=3)),
        ("min,t:500ms,g:/2", True, FlowControlSpec("min", 500_000_000, None, 2)),
        ("tagged,g:7", True, FlowControlSpec("tagged", group_tag=7)),
        ("tagged,g:-12/2,t:100ms", True, FlowControlSpec("tagged", 100_000_000, -12, 2)),
    ],
)
def test_parse_flow_control_as_aeron_does(fc: str | None, group: bool, expected: FlowControlSpec) -> None:
    assert parse_flow_control(fc, group=group) == expected


@pytest.mark.parametrize(
    ("fc", "problem"),
    [
        ("pref", "strategy 'pref'"),
        ("min,x:1", "option 'x:1'"),
        ("min,t:soon", "timeout 'soon'"),
        ("min,g:abc", "group tag 'abc'"),
        ("min,g:1/-2", "group min size '-2'"),
        ("min,g:1/", "group min size ''"),
        ("tagged", "needs a group tag"),
        ("min,t:", "option 't:'"),
    ],
)
def test_bad_flow_control_is_named(fc: str, problem: str) -> None:
    with pytest.raises(InvalidChannelError, match=problem.replace("(", r"\(")):
        parse_flow_control(fc, group=True)


def test_new_flow_control_picks_the_named_strategy() -> None:
    assert type(new_flow_control(parse_flow_control(None, group=False))) is SenderFlowControl
    assert type(new_flow_control(parse_flow_control(None, group=True))) is MaxFlowControl
    assert type(new_flow_control(parse_flow_control("min", group=True))) is MinFlowControl
    assert type(new_flow_control(parse_flow_control("tagged,g:1", group=True))) is TaggedFlowControl


def test_max_paces_to_the_fastest_receiver() -> None:
    fc = MaxFlowControl(FlowControlSpec("max"))
    limit = fc.on_status_message(0, W, 1, None, False, 0, 0)
    limit = fc.on_status_message(5000, W, 2, None, False, limit, 1)
    assert limit == 5000 + W
    limit = fc.on_status_message(100, W, 1, None, False, limit, 2)  # the slow one does not pull it back
    assert limit == 5000 + W
    assert set(fc.receivers) == {1, 2}


def test_min_paces_to_the_slowest_live_receiver() -> None:
    fc = MinFlowControl(FlowControlSpec("min"))
    limit = fc.on_status_message(0, W, 1, None, False, 0, 0)
    assert limit == W
    limit = fc.on_status_message(500, W, 2, None, False, limit, 0)  # within a window of the slowest: admitted
    assert limit == W  # receiver 1 is still at 0
    limit = fc.on_status_message(400, W, 1, None, False, limit, 1)
    assert limit == 400 + W
    limit = fc.on_status_message(900, W, 1, None, False, limit, 2)
    assert limit == 500 + W  # now receiver 2 is the slowest


def test_min_drops_a_silent_receiver_after_the_timeout() -> None:
    fc = MinFlowControl(FlowControlSpec("min", receiver_timeout_ns=100))
    limit = fc.on_status_message(0, W, 1, None, False, 0, 0)
    limit = fc.on_status_message(0, W, 2, None, False, limit, 0)
    changes = fc.changes
    for now in range(10, 100, 10):  # receiver 2 keeps reporting, receiver 1 went silent at 0
        limit = fc.on_status_message(now * 10, W, 2, None, False, limit, now)
        limit = fc.on_idle(now, limit)
    assert limit == W and set(fc.receivers) == {1, 2}  # still waiting for 1 (timeout not yet passed)
    limit = fc.on_idle(101, limit)
    assert set(fc.receivers) == {2}
    assert fc.changes == changes + 1
    assert limit == 900 + W  # stops waiting for 1


def test_min_end_of_stream_leaves_at_once() -> None:
    fc = MinFlowControl(FlowControlSpec("min"))
    limit = fc.on_status_message(0, W, 1, None, False, 0, 0)
    limit = fc.on_status_message(800, W, 2, None, False, limit, 0)
    limit = fc.on_status_message(0, W, 1, None, True, limit, 1)  # receiver 1 closes
    assert limit == 800 + W
    fc.on_idle(2, limit)
    assert set(fc.receivers) == {2}
    limit = fc.on_status_message(0, W, 3, None, True, limit, 3)  # an EOS SM never joins
    assert set(fc.receivers) == {2}


def test_min_late_joiner_far_behind_is_not_admitted() -> None:
    fc = MinFlowControl(FlowControlSpec("min"))
    limit = fc.on_status_message(10 * W, W, 1, None, False, 0, 0)
    limit = fc.on_status_message(0, W, 2, None, False, limit, 1)  # more than a window behind
    assert set(fc.receivers) == {1}
    assert limit == 11 * W


def test_min_group_size_holds_the_limit_until_enough_receivers() -> None:
    fc = MinFlowControl(FlowControlSpec("min", group_min_size=3))
    limit = fc.on_status_message(0, W, 1, None, False, 0, 0)
    limit = fc.on_status_message(0, W, 2, None, False, limit, 0)
    assert limit == 0 and not fc.has_required_receivers()
    limit = fc.on_status_message(0, W, 3, None, False, limit, 0)
    assert limit == W and fc.has_required_receivers()


def test_tagged_counts_only_tagged_receivers() -> None:
    fc = TaggedFlowControl(FlowControlSpec("tagged", group_tag=7))
    limit = fc.on_status_message(5000, W, 1, 7, False, 0, 0)
    assert limit == 5000 + W
    limit = fc.on_status_message(0, W, 2, None, False, limit, 0)  # untagged: ignored
    limit = fc.on_status_message(0, W, 3, 8, False, limit, 0)  # another tag: ignored
    assert set(fc.receivers) == {1}
    limit = fc.on_status_message(6000, W, 1, 7, False, limit, 1)
    assert limit == 6000 + W


def test_unicast_limit_only_grows() -> None:
    fc = SenderFlowControl()
    limit = fc.on_status_message(1000, W, 1, None, False, 0, 0)
    assert fc.on_status_message(0, W, 1, None, False, limit, 1) == 1000 + W
    assert fc.on_idle(RECEIVER_TIMEOUT_DEFAULT_NS + 2, limit) == limit
    assert fc.receivers == {}  # timed out, shown no more


def test_forged_receiver_ids_cannot_grow_the_group_without_bound() -> None:
    fc = MaxFlowControl(FlowControlSpec("max", receiver_timeout_ns=100))
    limit = 0
    for receiver_id in range(MAX_TRACKED_RECEIVERS + 500):
        limit = fc.on_status_message(0, W, receiver_id, None, False, limit, 0)
    assert len(fc.receivers) == MAX_TRACKED_RECEIVERS
    fc.on_idle(101, limit)  # the silent ones time out, making room again
    fc.on_status_message(0, W, -1, None, False, limit, 102)
    assert set(fc.receivers) == {-1}
