"""A checked stream between a publication and subscriptions: every message once, in order, intact.

:func:`message` makes message ``seq``: its sequence number, a body of varying length (up to ~3 KB, so at
an MTU of 1408 many span two or three fragments) and a CRC-32 of the rest. :func:`stream` offers messages
while polling every subscription, checks each message's CRC as it arrives and returns the sequence numbers
each subscription received, for the test (or benchmark) to compare with ``list(range(count))``.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Callable
from typing import Any

from logbuf.client import FragmentAssembler, OfferResult, Publication, Subscription

__all__ = ["message", "stream"]


def message(seq: int) -> bytes:
    """Message ``seq``: ``seq`` (int64 LE), a body of ``8 + (seq * 7919) % 3000 - 12`` bytes, its CRC-32."""
    size = 8 + (seq * 7919) % 3000
    body = struct.pack("<q", seq) + bytes((seq + i) & 0xFF for i in range(size - 12))
    return body + struct.pack("<I", zlib.crc32(body))


def stream(
    pub: Publication,
    subs: list[Subscription],
    count: int,
    timeout_s: float,
    between: Callable[[], object] = lambda: None,
) -> list[list[int]]:
    """Offer messages ``0 .. count - 1`` on ``pub`` while polling every subscription (and calling ``between``
    after each round: an attack, say) until each has ``count``; returns each one's sequence numbers.

    Fails (``AssertionError``) on a corrupt message, an offer result other than back pressure or an admin
    action, or after ``timeout_s`` seconds, naming what was sent and received.
    """
    received: list[list[int]] = [[] for _ in subs]

    def handler_for(i: int) -> FragmentAssembler:
        def on_message(buffer: memoryview, header: Any) -> None:
            data = bytes(buffer)
            assert zlib.crc32(data[:-4]) == struct.unpack("<I", data[-4:])[0], "corrupt message"
            received[i].append(struct.unpack_from("<q", data)[0])

        return FragmentAssembler(on_message)

    assemblers = [handler_for(i) for i in range(len(subs))]
    deadline = time.monotonic() + timeout_s
    sent = 0
    while min(len(r) for r in received) < count:
        assert time.monotonic() < deadline, f"timed out: sent {sent}, received {[len(r) for r in received]}"
        if sent < count:
            result = pub.offer(message(sent))
            if result > 0:
                sent += 1
            else:
                assert result in (OfferResult.BACK_PRESSURED, OfferResult.ADMIN_ACTION), OfferResult(result).name
        for sub, assembler in zip(subs, assemblers):
            sub.poll(assembler, 64)
        between()
    return received
