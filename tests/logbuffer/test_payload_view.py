"""The payload view a poll hands out is re-pointed from fragment to fragment only while nobody else
holds it: a handler that keeps a view (or a view of it, or a numpy array over it) keeps its own
fragment's bytes, exactly as with a fresh slice per fragment."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from logbuf.logbuffer.image import ControlledPollAction, Header
from logbuf.logbuffer.standalone import StreamLog
from logbuf.native import reader
from tests.support.logs import offer_all

MESSAGES = [bytes([i]) * (1 + i % 40) for i in range(200)]


@pytest.fixture
def offered(log: StreamLog) -> Any:
    image = log.add_subscriber()
    offer_all(log.add_publication(), MESSAGES)
    return image


def test_this_interpreter_reuses_the_payload_view() -> None:
    assert reader.PAYLOAD_VIEW_REUSED  # CPython 3.11-3.13 with the GIL: the fast path is the one tested


def test_a_handler_that_copies_sees_every_payload_once_in_order(offered: Any) -> None:
    ids: set[int] = set()
    got: list[bytes] = []

    def handler(buffer: memoryview, header: Header) -> None:
        ids.add(id(buffer))
        assert buffer.readonly and len(buffer) == buffer.nbytes == header.frame_length - 32
        got.append(bytes(buffer))

    assert offered.poll(handler, 1000) == len(MESSAGES)
    assert got == MESSAGES
    assert len(ids) == 1  # one view object, re-pointed per fragment


def test_views_kept_by_the_handler_keep_their_own_fragment(offered: Any) -> None:
    kept: list[memoryview] = []
    slices: list[memoryview] = []
    arrays: list[np.ndarray] = []

    def handler(buffer: memoryview, header: Header) -> None:
        i = len(kept)
        if i % 3 == 0:
            kept.append(buffer)  # the view itself
        elif i % 3 == 1:
            kept.append(buffer)
            slices.append(buffer[0:1])  # a view of the view
        else:
            kept.append(buffer)
            arrays.append(np.frombuffer(buffer, dtype=np.uint8))  # a buffer export of the view

    assert offered.poll(handler, 1000) == len(MESSAGES)
    assert [bytes(v) for v in kept] == MESSAGES
    assert [bytes(s) for s in slices] == [m[0:1] for i, m in enumerate(MESSAGES) if i % 3 == 1]
    assert [a.tobytes() for a in arrays] == [m for i, m in enumerate(MESSAGES) if i % 3 == 2]


def test_a_view_released_or_hashed_in_the_handler_does_not_disturb_the_next(offered: Any) -> None:
    got: list[bytes] = []
    hashes: list[int] = []

    def handler(buffer: memoryview, header: Header) -> None:
        got.append(bytes(buffer))
        if len(got) % 2:
            hashes.append(hash(buffer))  # a read-only view caches its hash: it must not stick
        else:
            buffer.release()

    assert offered.poll(handler, 1000) == len(MESSAGES)
    assert got == MESSAGES
    assert hashes == [hash(m) for i, m in enumerate(MESSAGES) if i % 2 == 0]


def test_a_controlled_poll_hands_the_same_payloads(offered: Any) -> None:
    got: list[bytes] = []
    kept: list[memoryview] = []

    def handler(buffer: memoryview, header: Header) -> ControlledPollAction:
        got.append(bytes(buffer))
        if len(got) % 5 == 0:
            kept.append(buffer)
        return ControlledPollAction.CONTINUE

    assert offered.controlled_poll(handler, 1000) == len(MESSAGES)
    assert got == MESSAGES
    assert [bytes(v) for v in kept] == MESSAGES[4::5]


def test_closing_the_image_in_a_handler_leaves_the_handed_view_readable(offered: Any) -> None:
    seen: list[bytes] = []

    def handler(buffer: memoryview, header: Header) -> None:
        offered.close()
        seen.append(bytes(buffer))

    offered.poll(handler, 1)
    assert seen == MESSAGES[:1]
