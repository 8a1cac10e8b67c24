"""Child-process entry points for UDP system tests (run with ``python -m tests.udp._children ROLE JSON``).

Every message carries a 16-byte header, ``seq`` (int64), ``size`` (int32, the whole message) and
the CRC-32 of the body that follows, and a body cut from a fixed blob. Sizes come from a seeded
generator that both sides run, so a subscriber checks each message on its own (sequence, length,
body checksum) and the whole stream (a running CRC-32 over every message, compared with the
publisher's). A message with ``seq == -1`` ends the stream.

stdout carries only ``ready`` and the JSON result (last line); logs go to stderr at warning level.
"""

from __future__ import annotations

import json
import random
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from logbuf.client import Aeron, Context, FragmentAssembler, OfferResult
from logbuf.logging_config import configure_logging
from logbuf.testing import wait_until

HEADER = struct.Struct("<qiI")
"""seq, size (whole message), crc32(body)."""
HEADER_LENGTH = HEADER.size
END_SEQ = -1
BLOB = random.Random(0xB10B).randbytes(16 * 1024)
MAX_PAYLOAD_AT_DEFAULT_MTU = 1408 - 32


def message_sizes(seed: int, large_max: int = 6000):  # type: ignore[no-untyped-def]
    """Mostly small, some up to one default-MTU frame, a few fragmented (> MTU - 32)."""
    rng = random.Random(seed)
    rand, randint = rng.random, rng.randint
    while True:
        r = rand()
        if r < 0.90:
            yield randint(HEADER_LENGTH, 200)
        elif r < 0.98:
            yield randint(201, MAX_PAYLOAD_AT_DEFAULT_MTU)
        else:
            yield randint(MAX_PAYLOAD_AT_DEFAULT_MTU + 1, large_max)


def body_of(seq: int, size: int) -> memoryview:
    start = (seq * 7) % 1024
    return memoryview(BLOB)[start : start + size - HEADER_LENGTH]


def _stop_on_stdin() -> threading.Event:
    """Set when the parent writes a line to stdin or closes it."""
    stop = threading.Event()

    def watch() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    return stop


def publisher(
    directory: str,
    channel: str,
    stream_id: int,
    seed: int,
    timeout_s: float,
    count: int = -1,
    exclusive: bool = False,
    large_max: int = 6000,
    pace_every: int = 0,
    pace_s: float = 0.0,
    connect_timeout_s: float = 20.0,
    destinations: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Publish ``count`` messages (``count < 0``: until a line or EOF on stdin), then the end marker.

    Prints ``ready`` once connected. Negative offer results are counted and retried (the same
    message, so the stream stays contiguous); only CLOSED and MAX_POSITION_EXCEEDED are fatal.
    """
    stop = _stop_on_stdin() if count < 0 else None
    results = {r.name: 0 for r in OfferResult}
    crc = 0
    with Aeron.connect(Context(dir=directory, driver_timeout_ns=5_000_000_000)) as aeron:
        pub = (aeron.add_exclusive_publication if exclusive else aeron.add_publication)(channel, stream_id)
        for destination in destinations:  # a control-mode=manual MDC publication
            pub.add_destination(destination)
        wait_until(lambda: pub.is_connected, connect_timeout_s, f"the publisher on {channel} connected")
        print("ready", flush=True)
        start = time.monotonic()
        deadline = start + timeout_s
        buf = bytearray(max(large_max, HEADER_LENGTH) + 64)
        view = memoryview(buf)
        sizes = message_sizes(seed, large_max)
        offer = pub.offer
        seq = 0

        def offer_until_accepted(message: memoryview) -> None:
            failures = 0
            while True:
                result = offer(message)
                if result > 0:
                    return
                name = OfferResult(result).name
                results[name] += 1
                if result in (OfferResult.CLOSED, OfferResult.MAX_POSITION_EXCEEDED):
                    raise RuntimeError(f"offer of seq {seq} failed: {name}")
                failures += 1
                if failures % 16 == 0:
                    time.sleep(0.0002)  # pace: back off on back pressure, retrying the same message
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"publisher stuck at seq {seq} after {timeout_s} s (last result {name}; {results})"
                    )

        while seq != count and not (stop is not None and stop.is_set()):
            size = next(sizes)
            body = body_of(seq, size)
            HEADER.pack_into(buf, 0, seq, size, zlib.crc32(body))
            buf[HEADER_LENGTH:size] = body
            message = view[:size]
            offer_until_accepted(message)
            crc = zlib.crc32(message, crc)
            seq += 1
            if pace_every and seq % pace_every == 0:
                time.sleep(pace_s)  # pace: the rate the test asked for
        elapsed = time.monotonic() - start
        HEADER.pack_into(buf, 0, END_SEQ, HEADER_LENGTH, 0)
        offer_until_accepted(view[:HEADER_LENGTH])
        # pace: let the sender drain before the client goes away (linger keeps the log for retransmits);
        # the client cannot see the sender's position to wait on it.
        time.sleep(0.5)
        return {
            "published": seq,
            "crc": crc,
            "elapsed_s": elapsed,
            "position": pub.position,
            "session_id": pub.session_id,
            "term_length": pub.term_length,
            "mtu_length": pub.mtu_length,
            **{k.lower(): v for k, v in results.items()},
        }


def subscriber(
    directory: str, channel: str, stream_id: int, seed: int, timeout_s: float, large_max: int = 6000
) -> dict[str, Any]:
    """Receive until the end marker, checking every message; prints ``ready`` once subscribed."""
    sizes = message_sizes(seed, large_max)
    expected = 0
    errors = 0
    first_errors: list[str] = []
    crc = 0
    done = False
    first_at = 0.0
    fragments = 0
    available: list[int] = []
    unavailable: list[int] = []

    def error(text: str) -> None:
        nonlocal errors
        errors += 1
        if len(first_errors) < 5:
            first_errors.append(text)

    def on_message(buffer: memoryview, header: Any) -> None:
        nonlocal expected, crc, done, first_at
        if not first_at:
            first_at = time.monotonic()
        if len(buffer) < HEADER_LENGTH:
            error(f"message of {len(buffer)} bytes after seq {expected - 1}")
            return
        seq, size, body_crc = HEADER.unpack_from(buffer, 0)
        if seq == END_SEQ:
            done = True
            return
        if seq != expected:
            error(f"seq {seq}, expected {expected}")
            # resynchronise the size generator only forwards (a duplicate or reorder stays an error)
            while expected < seq:
                next(sizes)
                expected += 1
            if seq < expected:
                return
        want = next(sizes)
        expected = seq + 1
        if size != want or len(buffer) != want:
            error(f"seq {seq}: {len(buffer)} bytes, header says {size}, expected {want}")
        elif zlib.crc32(buffer[HEADER_LENGTH:]) != body_crc:
            error(f"seq {seq}: body checksum mismatch")
        crc = zlib.crc32(buffer, crc)

    def count_fragment(buffer: memoryview, header: Any) -> None:
        nonlocal fragments
        fragments += 1
        assembler(buffer, header)

    assembler = FragmentAssembler(on_message)
    with Aeron.connect(Context(dir=directory, driver_timeout_ns=5_000_000_000)) as aeron:
        sub = aeron.add_subscription(
            channel,
            stream_id,
            on_available_image=lambda image: available.append(image.session_id),
            on_unavailable_image=lambda image: unavailable.append(image.session_id),
        )
        print("ready", flush=True)
        deadline = time.monotonic() + timeout_s
        poll = sub.poll
        while not done:
            if poll(count_fragment, 256) == 0:
                time.sleep(0.0002)  # pace: idle between empty polls until the end marker
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"subscriber on {channel} got {expected} messages in {timeout_s} s, no end marker "
                        f"(images available {available}, unavailable {unavailable}, errors {first_errors})"
                    )
        return {
            "received": expected,
            "errors": errors,
            "first_errors": first_errors,
            "crc": crc,
            "fragments": fragments,
            "elapsed_s": time.monotonic() - first_at if first_at else 0.0,
            "images_available": available,
            "images_unavailable": unavailable,
        }


if __name__ == "__main__":
    configure_logging("warning")  # stderr: stdout carries only "ready" and the result
    role, args = sys.argv[1], json.loads(sys.argv[2])
    roles: dict[str, Callable[..., dict[str, Any]]] = {"publisher": publisher, "subscriber": subscriber}
    result = roles[role](**args)
    print(json.dumps(result), flush=True)
