"""Reassembly at its edges: an aborted message is delivered whole again; one whose handler raised is not."""

from __future__ import annotations

from typing import Any

import pytest

from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.fragment_assembler import ControlledFragmentAssembler, FragmentAssembler
from logbuf.logbuffer.image import ControlledPollAction, Header
from logbuf.logbuffer.standalone import StreamLog
from tests.support.logs import MAX_PAYLOAD, offer_all


class Boom(Exception):
    pass


def test_aborting_a_reassembled_message_delivers_it_whole_again(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    big = bytes(range(256)) * 12  # 3072 bytes: three fragments
    end = pub.offer(big)
    last = pub.offer(b"small")
    got: list[bytes] = []
    script: list[Any] = [ControlledPollAction.ABORT, None, None]

    def delegate(buffer: memoryview, header: Header) -> Any:
        got.append(bytes(buffer))
        return script.pop(0)

    assembler = ControlledFragmentAssembler(delegate)
    assert image.controlled_poll(assembler, 10) == 2  # B and middle consumed, E aborted
    assert image.position == end - dh.align(3072 - 2 * MAX_PAYLOAD + dh.HEADER_LENGTH)
    assert image.controlled_poll(assembler, 10) == 2
    assert got == [big, big, b"small"]
    assert image.position == last


def test_an_exception_from_a_reassembled_message_does_not_redeliver_it(log: StreamLog) -> None:
    image = log.add_subscriber()
    pub = log.add_publication()
    big = bytes(3000)
    offer_all(pub, [big, b"after"])
    got: list[bytes] = []

    def delegate(buffer: memoryview, header: Header) -> None:
        got.append(bytes(buffer))
        if len(buffer) == 3000:
            raise Boom("big")

    assembler = FragmentAssembler(delegate)
    with pytest.raises(Boom):
        image.poll(assembler, 10)
    image.poll(assembler, 10)
    assert got == [big, b"after"]


def test_poll_hands_unfragmented_messages_straight_to_the_delegate(log: StreamLog) -> None:
    class Counting(FragmentAssembler):
        calls = 0

        def __call__(self, buffer: memoryview, header: Header) -> None:
            self.calls += 1
            super().__call__(buffer, header)

    image, pub = log.add_subscriber(), log.add_publication()
    messages = [b"a", b"b" * (3 * MAX_PAYLOAD - 7), b"c"]
    offer_all(pub, messages)
    got: list[bytes] = []
    assembler = Counting(lambda buffer, header: got.append(bytes(buffer)))
    while image.poll(assembler, 10):
        pass
    assert got == messages
    assert assembler.calls == 3  # only the three fragments of the long message went through it
