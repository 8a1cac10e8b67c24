"""Images: controlled poll's four actions, block poll, exceptions in handlers (the fragments already
delivered, the raising one included, stay consumed: DESIGN.md section 3), closing and moving the position.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import pytest

from logbuf import native
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.image import ControlledPollAction, Header, Image
from logbuf.logbuffer.publication import BufferClaim
from logbuf.logbuffer.standalone import StreamLog
from tests.support.logs import SESSION_ID, TERM_LENGTH, collect, offer_all


def _actions(image: Image, script: list[Any], got: list[tuple[bytes, int, int]]) -> Callable[..., Any]:
    """A controlled handler returning ``script``'s actions in turn; records (payload, header position, image position)."""

    def handler(buffer: memoryview, header: Header) -> Any:
        got.append((bytes(buffer), header.position, image.position))
        return script.pop(0)

    return handler


@pytest.fixture
def five(log: StreamLog) -> tuple[Image, list[int]]:
    image = log.add_subscriber()
    pub = log.add_publication()
    return image, offer_all(pub, [b"m%d" % i for i in range(5)])


def test_abort_rewinds_the_fragment_and_stops_so_it_is_delivered_again(five: tuple[Image, list[int]]) -> None:
    image, ends = five
    got: list[tuple[bytes, int, int]] = []
    A, C = ControlledPollAction.ABORT, ControlledPollAction.CONTINUE
    assert image.controlled_poll(_actions(image, [A], got), 10) == 0
    assert image.position == 0
    assert image.controlled_poll(_actions(image, [C, C, A], got), 10) == 2
    assert image.position == ends[1]  # fragments continued before the abort stay consumed
    assert image.controlled_poll(_actions(image, [C, C, C], got), 10) == 3
    assert [payload for payload, _, _ in got] == [b"m0", b"m0", b"m1", b"m2", b"m2", b"m3", b"m4"]
    assert image.position == ends[4]


def test_break_consumes_the_fragment_and_stops(five: tuple[Image, list[int]]) -> None:
    image, ends = five
    got: list[tuple[bytes, int, int]] = []
    script: list[Any] = [None, ControlledPollAction.BREAK]
    assert image.controlled_poll(_actions(image, script, got), 10) == 2
    assert image.position == ends[1] and len(got) == 2
    assert image.controlled_poll(_actions(image, [ControlledPollAction.BREAK], got), 10) == 1
    assert got[-1][:2] == (b"m2", ends[2]) and image.position == ends[2]


def test_commit_stores_the_position_at_once_and_continue_does_not(five: tuple[Image, list[int]]) -> None:
    image, ends = five
    got: list[tuple[bytes, int, int]] = []
    C, M = ControlledPollAction.CONTINUE, ControlledPollAction.COMMIT
    assert image.controlled_poll(_actions(image, [C, M, C, None, C], got), 10) == 5
    # image.position as seen from inside each handler call:
    assert [seen for _, _, seen in got] == [0, 0, ends[1], ends[1], ends[1]]
    assert image.position == ends[4]


def test_the_fragment_limit_bounds_a_controlled_poll(five: tuple[Image, list[int]]) -> None:
    image, ends = five
    got: list[tuple[bytes, int, int]] = []
    assert image.controlled_poll(_actions(image, [None] * 3, got), 3) == 3
    assert image.position == ends[2]


def test_a_controlled_handler_returning_something_else_raises_and_counts_the_fragment_delivered(
    five: tuple[Image, list[int]],
) -> None:
    image, ends = five
    got: list[tuple[bytes, int, int]] = []
    with pytest.raises(
        ValueError, match=r"controlled poll handler returned 99; expected ABORT, BREAK, COMMIT or CONTINUE"
    ):
        image.controlled_poll(_actions(image, [None, 99], got), 10)
    assert image.position == ends[1]
    assert image.controlled_poll(_actions(image, [None] * 3, got), 10) == 3
    assert [payload for payload, _, _ in got] == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_block_poll_hands_contiguous_whole_frames_and_stops_before_padding(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    ends = offer_all(pub, [b"a", b"bb", b"ccc"])
    claim = BufferClaim()
    pub.try_claim(40, claim)
    claim.abort()
    tail_end = pub.offer(b"dddd")
    blocks: list[tuple[bytes, int, int, int]] = []

    def on_block(block: memoryview, term_offset: int, session_id: int, term_id: int) -> None:
        blocks.append((bytes(block), term_offset, session_id, term_id))

    assert image.block_poll(on_block, TERM_LENGTH) == ends[2]
    block, term_offset, session_id, term_id = blocks[0]
    assert (term_offset, session_id, term_id) == (0, SESSION_ID, 0)
    offsets, lengths = array("i", [0] * 8), array("i", [0] * 8)
    assert native.frame_index(block, offsets, lengths) == 3 == native.count_frames(block)
    assert [block[o : o + n] for o, n in zip(offsets[:3], lengths[:3])] == [b"a", b"bb", b"ccc"]
    # the aborted claim is a padding frame: a block of its own
    assert image.block_poll(on_block, TERM_LENGTH) == 96
    assert native.count_frames(blocks[1][0]) == 0 and native.count_frames(blocks[1][0], include_padding=True) == 1
    assert image.block_poll(on_block, TERM_LENGTH) == 64
    assert blocks[2][0][dh.HEADER_LENGTH : dh.HEADER_LENGTH + 4] == b"dddd" and blocks[2][1] == ends[2] + 96
    assert image.position == tail_end
    assert image.block_poll(on_block, TERM_LENGTH) == 0 and len(blocks) == 3


def test_block_poll_never_exceeds_its_length_limit_nor_splits_a_frame(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    ends = offer_all(pub, [bytes(100)] * 4)  # 160-byte frames
    sizes: list[int] = []
    assert image.block_poll(lambda b, *_: sizes.append(len(b)), 2 * 160 + 100) == 320
    assert image.block_poll(lambda b, *_: sizes.append(len(b)), 159) == 0  # less than one frame: nothing
    assert image.block_poll(lambda b, *_: sizes.append(len(b)), 1000) == 320
    assert sizes == [320, 320] and image.position == ends[3]


class Boom(Exception):
    pass


def test_a_poll_handler_exception_propagates_and_keeps_the_delivered_fragments_consumed(
    five: tuple[Image, list[int]],
) -> None:
    image, ends = five
    got: list[bytes] = []

    def handler(buffer: memoryview, header: Header) -> None:
        got.append(bytes(buffer))
        if bytes(buffer) == b"m2":
            raise Boom("m2")

    with pytest.raises(Boom, match="m2"):
        image.poll(handler, 10)
    assert image.position == ends[2]  # m0, m1 and the raising m2 count as delivered
    assert image.poll(handler, 10) == 2
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4"]  # no duplicate, nothing lost


def test_a_controlled_poll_handler_exception_keeps_the_fragments_delivered(five: tuple[Image, list[int]]) -> None:
    image, ends = five
    got: list[bytes] = []

    def handler(buffer: memoryview, header: Header) -> Any:
        got.append(bytes(buffer))
        if bytes(buffer) == b"m1":
            raise Boom("m1")
        return ControlledPollAction.CONTINUE

    with pytest.raises(Boom):
        image.controlled_poll(handler, 10)
    assert image.position == ends[1]
    assert image.controlled_poll(handler, 10) == 3
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_a_block_handler_exception_moves_the_position_past_the_block(five: tuple[Image, list[int]]) -> None:
    image, ends = five

    def raising(block: memoryview, term_offset: int, session_id: int, term_id: int) -> None:
        raise Boom("block")

    with pytest.raises(Boom):
        image.block_poll(raising, 2 * 64)
    assert image.position == ends[1]
    got: list[tuple[bytes, int]] = []
    assert image.poll(collect(got), 10) == 3
    assert [p for p, _ in got] == [b"m2", b"m3", b"m4"]


def test_a_closed_image_polls_nothing_and_refuses_its_position(log: StreamLog) -> None:
    image = log.add_subscriber()
    log.add_publication().offer(b"x")
    image.close()
    assert image.poll(collect([]), 10) == 0
    assert image.controlled_poll(collect([]), 10) == 0
    assert image.block_poll(lambda *a: None, 1024) == 0
    with pytest.raises(ValueError, match="image is closed"):
        image.position


def test_moving_an_image_position_must_be_aligned_and_forward(log: StreamLog) -> None:
    image = log.add_subscriber()
    ends = offer_all(log.add_publication(), [b"a", b"b"])
    with pytest.raises(ValueError, match=r"position=33 is not a multiple of 32"):
        image.position = 33
    image.position = ends[0]
    with pytest.raises(ValueError, match=rf"position=0 is behind the current position {ends[0]}"):
        image.position = 0
    got: list[tuple[bytes, int]] = []
    image.poll(collect(got), 10)
    assert got == [(b"b", ends[1])]


@pytest.mark.parametrize("position", [33, -32])
def test_joining_at_a_bad_position_is_rejected(log: StreamLog, position: int) -> None:
    with pytest.raises(ValueError, match=rf"join_position={position} must be a non-negative multiple of 32"):
        log.add_subscriber(join_position=position)
