"""Concurrency: several publisher processes on one log, several subscriber processes reading it.

Every message names its publisher and sequence number in its frame's reserved value, and its
length and bytes follow from a seeded RNG per publisher (see ``_concurrency_children``), so
each subscriber checks that every message — zero-length ones included — arrives exactly once,
intact, in order per publisher. 64 KiB terms with a 1408-byte MTU and messages of 0..4224 bytes
make the log rotate thousands of times and fragment most messages.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from logbuf.logbuffer.publication import OfferResult
from logbuf.logbuffer.standalone import LIVENESS_CHECK_INTERVAL_S, StreamLog
from tests.logbuf import _concurrency_children as children

TERM_LENGTH = 64 * 1024
CTX = mp.get_context("spawn")


@pytest.fixture
def log_name() -> Iterator[str]:
    name = f"t-conc-{uuid.uuid4().hex[:12]}"
    yield name
    StreamLog.unlink_name(name)


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(10)


def run_system(
    name: str, *, publishers: int, count: int, subscribers: int, exclusive: bool, timeout_s: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Subscribers first, then publishers; all children within ``timeout_s`` or they are killed.

    Returns (publisher reports, subscriber reports, the log's final tail position).
    """
    deadline = time.monotonic() + timeout_s
    ready: Any = CTX.Queue()
    out: Any = CTX.Queue()
    start = CTX.Event()
    publishers_done = CTX.Event()
    subs = [
        CTX.Process(
            target=children.subscriber_main,
            name=f"subscriber-{i}",
            args=(name, i, publishers, count, ready, publishers_done, out, timeout_s),
        )
        for i in range(subscribers)
    ]
    pubs = [
        CTX.Process(
            target=children.publisher_main,
            name=f"publisher-{i}",
            args=(name, i, count, exclusive, start, out, timeout_s),
        )
        for i in range(publishers)
    ]
    reports: list[dict[str, Any]] = []
    with StreamLog.create(name, term_length=TERM_LENGTH, mtu_length=children.MTU_LENGTH) as log:
        try:
            for proc in subs:
                proc.start()
            for _ in subs:  # every subscriber attached before any publisher starts
                ready.get(timeout=max(1.0, deadline - time.monotonic()))
            for proc in pubs:
                proc.start()
            start.set()
            procs = subs + pubs
            while len(reports) < len(procs):
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"timed out after {timeout_s} s; reports so far: {reports}; children alive: "
                        f"{[p.name for p in procs if p.is_alive()]}"
                    )
                try:
                    reports.append(out.get(timeout=0.5))
                except queue.Empty:
                    silent = [(p.name, p.exitcode) for p in procs if p.exitcode not in (None, 0)]
                    if len(silent) > len([r for r in reports if r["error"]]):
                        raise AssertionError(f"children died without reporting: {silent}; reports: {reports}") from None
                    continue
                if len([r for r in reports if r["role"] == "publisher"]) == len(pubs):
                    publishers_done.set()
            failed = [f"{r['role']} {r['index']} failed:\n{r['error']}" for r in reports if r["error"]]
            problems = [
                f"subscriber {r['index']}: {r['problem_count']} problems, first: {r['problems']}"
                for r in reports
                if r["role"] == "subscriber" and not r["error"] and r["problems"]
            ]
            assert not failed, "\n".join(problems + failed)
            for proc in procs:
                proc.join(max(1.0, deadline - time.monotonic()))
            assert [p.exitcode for p in procs] == [0] * len(procs)
            tail = log.log.tail_position()
        finally:
            _stop(subs + pubs)
    by_role = {
        role: sorted((r for r in reports if r["role"] == role), key=lambda r: r["index"])
        for role in ("publisher", "subscriber")
    }
    return by_role["publisher"], by_role["subscriber"], tail


def assert_every_message_once_in_order(
    subscriber_reports: list[dict[str, Any]], publishers: int, count: int, tail: int
) -> None:
    assert len(subscriber_reports) == 2
    for report in subscriber_reports:
        assert report["problems"] == []
        assert report["received"] == [count] * publishers
        assert report["extra_fragments"] == 0
        assert report["position"] == tail


@pytest.mark.slow
def test_four_publishers_two_subscribers_every_message_once_intact_in_order(log_name: str) -> None:
    count = 200_000
    began = time.monotonic()
    pubs, subs, tail = run_system(log_name, publishers=4, count=count, subscribers=2, exclusive=False, timeout_s=240)
    elapsed = time.monotonic() - began
    assert [p["sent"] for p in pubs] == [count] * 4
    assert_every_message_once_in_order(subs, 4, count, tail)
    assert tail > 1000 * TERM_LENGTH  # the log rotated thousands of times
    assert subs[0]["fragments"] > 4 * count  # most messages were fragmented
    print(f"4x{count} messages to 2 subscribers in {elapsed:.1f} s; {tail / TERM_LENGTH:.0f} terms; publishers: {pubs}")


def test_exclusive_publisher_two_subscribers_every_message_once_intact_in_order(log_name: str) -> None:
    count = 50_000
    pubs, subs, tail = run_system(log_name, publishers=1, count=count, subscribers=2, exclusive=True, timeout_s=120)
    assert pubs[0]["sent"] == count
    assert_every_message_once_in_order(subs, 1, count, tail)
    assert tail > 100 * TERM_LENGTH


def _drain(buffer: memoryview, header: Any) -> None:
    pass


def test_a_killed_subscriber_stops_holding_publishers_back(log_name: str) -> None:
    ready: Any = CTX.Queue()
    victim = CTX.Process(target=children.stuck_subscriber_main, args=(log_name, ready))
    with StreamLog.create(log_name, term_length=TERM_LENGTH) as log:
        try:
            victim.start()
            victim_pid = ready.get(timeout=60)
            live = log.add_subscriber()
            pub = log.add_publication()
            message = bytes(1000)
            while pub.offer(message) > 0:  # the stuck subscriber lets the publisher run one window ahead
                live.poll(_drain, 100)
            assert len(log.subscriber_positions()) == 2
            blocked_until = time.monotonic() + 5 * LIVENESS_CHECK_INTERVAL_S
            while time.monotonic() < blocked_until:  # a live, stuck subscriber holds it back
                assert pub.offer(message) == OfferResult.BACK_PRESSURED
                live.poll(_drain, 100)
                time.sleep(0.001)  # pace: the period held back is the thing under test
            stuck_at = pub.position

            os.kill(victim_pid, signal.SIGKILL)
            victim.join(10)  # reaped: a zombie's pid still looks alive
            assert victim.exitcode == -signal.SIGKILL
            deadline = time.monotonic() + 30  # the dead subscriber's counter is freed within a liveness check
            resumed = 0
            while resumed < 200:
                if pub.offer(message) > 0:
                    resumed += 1
                live.poll(_drain, 100)
                assert time.monotonic() < deadline, "publisher still back-pressured by a dead subscriber"
            assert pub.position > stuck_at + TERM_LENGTH
            assert list(log.subscriber_positions().values()) == [live.position]
        finally:
            _stop([victim])
