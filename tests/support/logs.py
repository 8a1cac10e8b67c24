"""Standalone logs for unit tests: the usual parameters and small helpers over images and publications."""

from __future__ import annotations

from collections.abc import Callable

from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.image import Header
from logbuf.logbuffer.publication import OfferResult, Publication

TERM_LENGTH = 64 * 1024
MTU_LENGTH = 1408
MAX_PAYLOAD = MTU_LENGTH - dh.HEADER_LENGTH
SESSION_ID = 77
STREAM_ID = 9


def collect(into: list[tuple[bytes, int]]) -> Callable[[memoryview, Header], None]:
    """A fragment handler that keeps (payload, header.position)."""

    def handler(buffer: memoryview, header: Header) -> None:
        into.append((bytes(buffer), header.position))

    return handler


def offer_all(pub: Publication, messages: list[bytes]) -> list[int]:
    positions = []
    for message in messages:
        result = pub.offer(message)
        assert result > 0, OfferResult(result)
        positions.append(result)
    return positions


def frame_end(position_before: int, payload_length: int) -> int:
    return position_before + dh.align(payload_length + dh.HEADER_LENGTH)
