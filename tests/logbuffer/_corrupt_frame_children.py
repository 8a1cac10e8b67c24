"""Child process of ``test_corrupt_frames``: every poll flavour against every impossible frame length.

Run as ``python -m tests.logbuffer._corrupt_frame_children``. For each (flavour, case) it makes a fresh
standalone log, publishes one message and polls it, publishes a second, writes the bad frame after it (this
process plays the buggy client that maps the log), then polls twice: the first poll must deliver the
second message, the second must stop at the bad frame. It prints one JSON line per case *before* it runs
the case's polls, and one with the outcome after, so a crash (the old core segfaulted on a frame length of
1..31) names its case in the output the test reads.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from logbuf import native
from logbuf.errors import CorruptLogError
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.image import FragmentBatch, Image
from logbuf.logbuffer.standalone import StreamLog

TERM = 64 * 1024
SESSION_ID, STREAM_ID = 41, 42
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# case name -> (frame type, the length to write given the bytes left in the term from the bad frame)
CASES: dict[str, tuple[int, Callable[[int], int]]] = {
    **{f"length {n}": (dh.HDR_TYPE_DATA, lambda rest, n=n: n) for n in range(1, 32)},
    "negative -1": (dh.HDR_TYPE_DATA, lambda rest: -1),
    "negative -31": (dh.HDR_TYPE_DATA, lambda rest: -31),
    "negative past the term end": (dh.HDR_TYPE_DATA, lambda rest: -(rest + 32)),
    "INT_MIN": (dh.HDR_TYPE_DATA, lambda rest: INT32_MIN),
    "past the term end by 1": (dh.HDR_TYPE_DATA, lambda rest: rest + 1),
    "INT_MAX": (dh.HDR_TYPE_DATA, lambda rest: INT32_MAX),
    "short misaligned PAD": (dh.HDR_TYPE_PAD, lambda rest: 7),
    "PAD past the term end": (dh.HDR_TYPE_PAD, lambda rest: rest + 32),
    "huge PAD": (dh.HDR_TYPE_PAD, lambda rest: 0x7FFFFFE0),
    "negative PAD INT_MIN": (dh.HDR_TYPE_PAD, lambda rest: INT32_MIN),
}
NOT_CORRUPT: dict[str, tuple[int, Callable[[int], int]]] = {
    "a claim being written (-64)": (dh.HDR_TYPE_DATA, lambda rest: -64),
    "a claim of the whole rest of the term": (dh.HDR_TYPE_PAD, lambda rest: -rest),
}
"""Lengths a live publisher does write: no error, nothing delivered, the position stays."""

FLAVOURS = (
    "poll",
    "controlled_poll",
    "block_poll",
    "poll_batch",
    "term_read",
    "poll_filtered",
    "controlled_poll_filtered",
    "poll_batch_filtered",
)


def every_topic() -> native.TopicFilter:
    """A topic filter that lets untagged messages (reserved value 0, as these are) through."""
    return native.TopicFilter(lambda topic_id: True, lambda topic_id, name: None, deliver_untagged=True)


def poll_once(flavour: str, image: Image, log: StreamLog, got: list[bytes]) -> int:
    """One poll of ``flavour``; appends what it delivered to ``got``; returns its result."""

    def handler(payload: memoryview, header: Any) -> None:
        got.append(bytes(payload))  # the old core handed out views of negative length here

    if flavour == "poll":
        return image.poll(handler, 10)
    if flavour == "controlled_poll":
        return image.controlled_poll(lambda p, h: handler(p, h), 10)
    if flavour == "block_poll":
        return image.block_poll(lambda block, *ids: got.extend(bytes(p) for p in split_block(block)), 1 << 16)
    if flavour == "poll_batch":
        batch = FragmentBatch(16)
        n = image.poll_batch(batch)
        got.extend(bytes(batch.payload(i)) for i in range(n))
        return n
    if flavour == "poll_filtered":
        return image.poll_filtered(every_topic(), handler, 10)
    if flavour == "controlled_poll_filtered":
        return image.controlled_poll_filtered(every_topic(), lambda p, h: handler(p, h), 10)
    if flavour == "poll_batch_filtered":
        batch = FragmentBatch(16)
        n = image.poll_batch_filtered(every_topic(), batch)
        got.extend(bytes(batch.payload(i)) for i in range(n))
        return n
    position = image.position  # term_read: the term algorithm on its own, moving the position by hand
    term = log.log.term_buffer((position >> 16) % 3)
    try:
        fragments, end = native.term_read(term, position & (TERM - 1), handler, 10, native.Header())
    finally:
        term.release()
    image.position = position - (position & (TERM - 1)) + end
    return int(fragments)


def split_block(block: memoryview) -> list[memoryview]:
    """The payloads of a block's data frames."""
    offsets, lengths = np.zeros(64, dtype=np.int32), np.zeros(64, dtype=np.int32)
    n = native.frame_index(block, offsets, lengths)
    return [block[int(o) : int(o) + int(n_)] for o, n_ in zip(offsets[:n], lengths[:n], strict=True)]


def run_case(flavour: str, name: str, frame_type: int, length_of: Callable[[int], int]) -> dict[str, Any]:
    log = StreamLog.create(
        f"corrupt-{uuid.uuid4().hex[:10]}", term_length=TERM, session_id=SESSION_ID, stream_id=STREAM_ID
    )
    try:
        image = log.add_subscriber()
        pub = log.add_publication()
        got: list[bytes] = []
        assert pub.offer(b"first") > 0
        poll_once(flavour, image, log, got)
        assert pub.offer(b"second") > 0
        bad_position = pub.position
        offset = bad_position & (TERM - 1)
        frame_length = length_of(TERM - offset)
        term = log.log.term_buffer((bad_position >> 16) % 3)
        dh.HEADER.pack_into(
            term, offset, frame_length, 0, 0xC0, frame_type, offset, SESSION_ID, STREAM_ID, 0, 0
        )  # the buggy client's write: a header whose length no publisher writes
        term.release()
        before = image.position
        poll_once(flavour, image, log, got)
        outcome: dict[str, Any] = {"delivered": [g.decode() for g in got], "frame_length": frame_length}
        outcome["position_after_first_poll"] = image.position
        errors = []
        for _ in range(2):  # twice: still stopped there, and counted once
            try:
                poll_once(flavour, image, log, got)
                errors.append(None)
            except CorruptLogError as e:
                errors.append(
                    {
                        "message": str(e),
                        "position": e.position,
                        "frame_length": e.frame_length,
                        "session_id": e.session_id,
                        "stream_id": e.stream_id,
                    }
                )
        outcome.update(
            errors=errors,
            bad_position=bad_position,
            position=image.position,
            before=before,
            corrupt_frame_count=getattr(image, "corrupt_frame_count", None),  # None: a core without it
        )
        image.close()
        pub.close()
        return outcome
    finally:
        log.close()
        log.unlink()


def main() -> None:
    for flavour in FLAVOURS:
        for cases, corrupt in ((CASES, True), (NOT_CORRUPT, False)):
            for name, (frame_type, length_of) in cases.items():
                print(json.dumps({"flavour": flavour, "case": name, "starting": True}), flush=True)
                try:
                    result = run_case(flavour, name, frame_type, length_of)
                except Exception as e:  # anything but the expected error: the test reports it per case
                    result = {"exception": f"{type(e).__name__}: {e}"}
                    e.__traceback__ = None  # let go of the frames that hold views of the log
                print(json.dumps({"flavour": flavour, "case": name, "corrupt": corrupt, **result}), flush=True)
    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
