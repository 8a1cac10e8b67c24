"""Child-process entry points for driver system tests (run with ``python -m tests.driver._children``)."""

from __future__ import annotations

import json
import struct
import sys
import time

from logbuf.client import Aeron, Context, FragmentAssembler, OfferResult
from logbuf.logging_config import configure_logging
from logbuf.testing import wait_until

SEQ = struct.Struct("<q")


def publisher(directory: str, stream_id: int, count: int, size: int, timeout_s: float) -> dict[str, int]:
    """Publish ``count`` messages of ``size`` bytes carrying their sequence number; count back pressure."""
    back_pressured = 0
    with Aeron.connect(Context(dir=directory, driver_timeout_ns=5_000_000_000)) as aeron:
        pub = aeron.add_publication("aeron:ipc", stream_id)
        deadline = time.monotonic() + timeout_s
        wait_until(lambda: pub.is_connected, timeout_s, "the publisher connected")
        body = bytearray(size)
        for seq in range(count):
            SEQ.pack_into(body, 0, seq)
            while True:
                result = pub.offer(body)
                if result > 0:
                    break
                if result == OfferResult.BACK_PRESSURED:
                    back_pressured += 1
                elif result not in (OfferResult.ADMIN_ACTION,):
                    raise RuntimeError(f"offer failed: {OfferResult(result).name}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"publisher stuck at seq {seq}")
        return {"published": count, "back_pressured": back_pressured, "position": pub.position}


def subscriber(
    directory: str, stream_id: int, count: int, delay_every: int, delay_s: float, timeout_s: float
) -> dict[str, int]:
    """Receive ``count`` messages in order; sleep ``delay_s`` every ``delay_every`` messages (a slow consumer)."""
    expected = 0
    errors = 0

    def on_message(buffer: memoryview, header: object) -> None:
        nonlocal expected, errors
        (seq,) = SEQ.unpack_from(buffer, 0)
        if seq != expected:
            errors += 1
        expected = seq + 1
        if delay_every and expected % delay_every == 0:
            time.sleep(delay_s)  # pace: the slow consumer the test asked for

    with Aeron.connect(Context(dir=directory, driver_timeout_ns=5_000_000_000)) as aeron:
        sub = aeron.add_subscription("aeron:ipc", stream_id)
        print("ready", flush=True)
        handler = FragmentAssembler(on_message)
        deadline = time.monotonic() + timeout_s
        while expected < count:
            if sub.poll(handler, 64) == 0:
                time.sleep(0.0001)  # pace: idle between empty polls
            if time.monotonic() > deadline:
                raise TimeoutError(f"subscriber got {expected} of {count}")
        return {"received": expected, "errors": errors}


def idle_client(directory: str, stream_id: int) -> None:
    """Add a publication and a subscription, say so, then wait to be killed."""
    with Aeron.connect(Context(dir=directory, driver_timeout_ns=5_000_000_000)) as aeron:
        aeron.add_publication("aeron:ipc", stream_id)
        aeron.add_subscription("aeron:ipc", stream_id)
        print("ready", flush=True)
        time.sleep(600)  # pace: hold the client open until the test kills this process


if __name__ == "__main__":
    configure_logging("warning")  # stderr: stdout carries only "ready" and the result
    role, args = sys.argv[1], json.loads(sys.argv[2])
    result = {"publisher": publisher, "subscriber": subscriber, "idle_client": idle_client}[role](**args)
    print(json.dumps(result), flush=True)
