"""Child-process entry points for the concurrency tests (started with multiprocessing's ``spawn``).

Message scheme
--------------
Publisher ``p`` draws its message lengths from ``random.Random(SIZE_SEED + p)``; message ``seq``
is :func:`message_body` ``(p, seq, length)``: the little-endian ``(p, seq)`` pair followed by a
slice of a fixed random pattern whose start depends on ``(p, seq)``, cut to ``length`` (so a
message shorter than 8 bytes is a prefix of the pair, and a 0-byte message is empty). The frame's
reserved value carries ``p << 32 | seq``: every fragment of a message has it, so the header a
:class:`FragmentAssembler` passes with the whole message names it even when the body is empty.
A subscriber replays each publisher's RNG, so it knows the length and every byte of the message
it expects next from each publisher, and compares them in full.

Every child puts one report (a dict with ``role``, ``index`` and ``error`` = None or a
traceback) on the ``out`` queue and exits 0, or 1 after reporting an error.

Idling: when a publisher is back-pressured or a subscriber finds nothing, it calls
``os.sched_yield()``. With more busy processes than cores a pure busy-spin leaves the one process
everybody waits for (usually the slowest subscriber) off the CPU for a whole time slice at
every window, which makes the run 20-50 times slower.
"""

from __future__ import annotations

import os
import random
import struct
import time
import traceback
from collections.abc import Callable
from typing import Any

from logbuf.logbuffer.fragment_assembler import FragmentAssembler
from logbuf.logbuffer.image import Header
from logbuf.logbuffer.publication import OfferResult
from logbuf.logbuffer.standalone import StreamLog

MTU_LENGTH = 1408
MAX_MESSAGE_SIZE = 3 * MTU_LENGTH
SIZE_SEED = 1000
PATTERN = random.Random(77).randbytes(2 * MAX_MESSAGE_SIZE + 8192)
PATTERN_STARTS = 8192
PAIR = struct.Struct("<II")
FRAGMENT_LIMIT = 1024
CHECK_EVERY = 4096
"""Idle iterations between deadline checks (time.monotonic() is not free)."""

Report = dict[str, Any]


def message_sizes(publisher: int, count: int) -> list[int]:
    """Publisher ``publisher``'s message lengths, 0..MAX_MESSAGE_SIZE inclusive."""
    rnd = random.Random(SIZE_SEED + publisher)
    return [rnd.randint(0, MAX_MESSAGE_SIZE) for _ in range(count)]


def message_body(publisher: int, seq: int, length: int) -> bytes:
    start = (seq * 2_654_435_761 + publisher * 40_503) % PATTERN_STARTS
    return (PAIR.pack(publisher, seq) + PATTERN[start : start + length])[:length]


def reserved_value(publisher: int, seq: int) -> int:
    return (publisher << 32) | seq


def _run(role: str, index: int, out: Any, body: Callable[[], Report]) -> None:
    try:
        report = body()
    except BaseException:
        out.put({"role": role, "index": index, "error": traceback.format_exc()})
        raise SystemExit(1) from None
    out.put({"role": role, "index": index, "error": None, **report})


def publisher_main(
    name: str, publisher: int, count: int, exclusive: bool, start: Any, out: Any, timeout_s: float
) -> None:
    """Offer ``count`` messages once ``start`` is set; report the offer counts by result."""

    def body() -> Report:
        sizes = message_sizes(publisher, count)
        with StreamLog.open(name) as log:
            pub = log.add_publication(exclusive=exclusive)
            if not start.wait(timeout_s):
                raise TimeoutError(f"start was not set within {timeout_s} s")
            began = time.monotonic()
            deadline = began + timeout_s
            back_pressured = admin_actions = 0
            retry = (OfferResult.BACK_PRESSURED, OfferResult.ADMIN_ACTION)
            for seq, length in enumerate(sizes):
                message = message_body(publisher, seq, length)
                reserved = reserved_value(publisher, seq)
                while (result := pub.offer(message, reserved)) < 0:
                    if result not in retry:
                        raise AssertionError(
                            f"publisher {publisher} seq {seq}: offer returned {OfferResult(result).name}"
                        )
                    if result == OfferResult.ADMIN_ACTION:
                        admin_actions += 1
                        continue
                    back_pressured += 1
                    os.sched_yield()
                    if back_pressured % CHECK_EVERY == 0 and time.monotonic() > deadline:
                        raise TimeoutError(f"publisher {publisher} back-pressured for over {timeout_s} s at seq {seq}")
            return {
                "sent": count,
                "back_pressured": back_pressured,
                "admin_actions": admin_actions,
                "seconds": time.monotonic() - began,
            }

    _run("publisher", publisher, out, body)


def subscriber_main(
    name: str, index: int, publishers: int, count: int, ready: Any, publishers_done: Any, out: Any, timeout_s: float
) -> None:
    """Attach, signal ``ready``, check every message from every publisher, then report.

    A message out of sequence or with wrong bytes is noted (the first 10 are reported) and
    reading goes on, so publishers are never left waiting for a failed subscriber. Reading stops
    once each publisher's last message has arrived, or once ``publishers_done`` is set and
    nothing more is there. Then, with the publishers done, one more poll must find nothing. The
    report holds per-publisher counts, the problems, fragment counts and the final position.
    """

    def body() -> Report:
        sizes = [message_sizes(p, count) for p in range(publishers)]
        received = [0] * publishers
        problems: list[str] = []

        def on_message(buffer: memoryview, header: Header) -> None:
            reserved = header.reserved_value
            publisher, seq = reserved >> 32, reserved & 0xFFFFFFFF
            if publisher >= publishers or seq >= count:
                problems.append(f"unknown message: publisher {publisher} seq {seq} at position {header.position}")
                return
            if seq != received[publisher]:
                problems.append(
                    f"publisher {publisher}: seq {seq} where {received[publisher]} was due, "
                    f"at position {header.position}"
                )
            received[publisher] = seq + 1
            if bytes(buffer) != message_body(publisher, seq, sizes[publisher][seq]):
                problems.append(
                    f"publisher {publisher} seq {seq}: {len(buffer)} bytes differ from the "
                    f"{sizes[publisher][seq]} sent, at position {header.position}"
                )

        assembler = FragmentAssembler(on_message)
        complete = [count] * publishers
        with StreamLog.open(name) as log:
            image = log.add_subscriber()
            ready.put(index)
            deadline = time.monotonic() + timeout_s
            idle = fragments = 0
            while received != complete:
                polled = image.poll(assembler, FRAGMENT_LIMIT)
                if polled:
                    fragments += polled
                    continue
                idle += 1
                os.sched_yield()
                if idle % CHECK_EVERY == 0:
                    if publishers_done.is_set():
                        polled = image.poll(assembler, FRAGMENT_LIMIT)
                        fragments += polled
                        if polled == 0:
                            problems.append(f"publishers finished; messages per publisher: {received}")
                            break
                    if time.monotonic() > deadline:
                        problems.append(f"timed out after {timeout_s} s; messages per publisher: {received}")
                        break
            if not publishers_done.wait(timeout_s):
                problems.append(f"publishers_done not set within {timeout_s} s")
            extra = image.poll(assembler, FRAGMENT_LIMIT)
            return {
                "received": received,
                "problems": problems[:10],
                "problem_count": len(problems),
                "fragments": fragments,
                "extra_fragments": extra,
                "position": image.position,
            }

    _run("subscriber", index, out, body)


def stuck_subscriber_main(name: str, ready: Any) -> None:
    """Attach a subscriber that never polls, signal ``ready``, and sleep until killed."""
    with StreamLog.open(name) as log:
        log.add_subscriber()
        ready.put(os.getpid())
        time.sleep(600)  # pace: a live subscriber that never reads, until the test kills this process
