"""``logbuf-stat --topics``: per-topic message rates on every stream of a driver, and every topic
subscription's patterns and lag, read from shared memory and the driver directory (no command to the driver).

Rates: the frames written since the previous sample (at most ``MAX_SCAN_BYTES`` per stream, scaled to what the
stream moved) counted per reserved value; definition frames and untagged frames are left out; names from the
registry (``topics.dat``). Subscriptions: each topic subscription leaves ``topic-subscriptions/<pid>-<registration
id>.json`` in the driver directory while it is open (patterns, channel, stream); its lag is the stream position
minus its ``sub-pos`` counters (one per image); files of dead processes are ignored.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import numpy as np

from logbuf import native
from logbuf.client.stat import MAX_SCAN_BYTES, StatReader, _sample_start
from logbuf.conduit.topic_registry import TopicRegistry, TopicRegistryError
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.process import pid_alive

__all__ = ["TOPIC_SUBSCRIPTIONS_DIR", "TopicStatReader", "count_topics", "subscription_file"]

TOPIC_SUBSCRIPTIONS_DIR: Final[str] = "topic-subscriptions"


def subscription_file(directory: str, pid: int, registration_id: int) -> str:
    return os.path.join(directory, TOPIC_SUBSCRIPTIONS_DIR, f"{pid}-{registration_id}.json")


def count_topics(log: LogBuffers, start: int, end: int, max_bytes: int = MAX_SCAN_BYTES) -> tuple[Counter[int], int]:
    """Messages per topic id (first fragments of frames with a positive reserved value) in ``[start, end)``,
    scanning at most ``max_bytes``; returns (counts, bytes scanned)."""
    term_length = log.term_length
    counts: Counter[int] = Counter()
    scanned, position = 0, start
    end = min(end, start + max_bytes)
    while position < end:
        offset = position % term_length
        length = min(end - position, term_length - offset)
        term = log.term_buffer((position // term_length) % 3)
        block = term[offset : offset + length]
        offsets = np.empty(length // dh.HEADER_LENGTH + 1, dtype=np.int32)
        lengths = np.empty_like(offsets)
        n = native.frame_index(block, offsets, lengths)
        if n:
            frames = offsets[:n] - dh.HEADER_LENGTH
            data = np.frombuffer(block, dtype=np.uint8)
            first = (data[frames + dh.FLAGS_FIELD_OFFSET] & dh.BEGIN_FLAG) != 0
            values = np.frombuffer(block, dtype=np.int64)[(frames[first] + dh.RESERVED_VALUE_FIELD_OFFSET) // 8]
            ids, per_id = np.unique(values[values > 0], return_counts=True)
            counts.update(dict(zip(ids.tolist(), per_id.tolist(), strict=True)))
        block.release()
        term.release()
        scanned += length
        position += length
    return counts, scanned


@dataclass(slots=True)
class TopicRate:
    topic_id: int
    name: str | None
    msgs_per_s: float


@dataclass(slots=True)
class TopicSubscriptionStat:
    pid: int
    registration_id: int
    channel: str
    stream_id: int
    patterns: list[str]
    lag: int | None
    """Bytes behind the stream position on its slowest image (None: no image yet)."""


@dataclass(slots=True)
class TopicSnapshot:
    topics: list[TopicRate] = field(default_factory=list)
    subscriptions: list[TopicSubscriptionStat] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class TopicStatReader:
    """Samples topic rates and topic subscriptions; the first sample is the baseline for rates."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.reader = StatReader(directory)
        try:
            self.registry: TopicRegistry | None = TopicRegistry.open(directory, writable=False)
        except TopicRegistryError:
            self.registry = None  # a driver without topics (or Aeron's)
        self._previous: dict[int, tuple[float, int]] = {}

    def close(self) -> None:
        self.reader.close()
        if self.registry is not None:
            self.registry.close()

    def sample(self, now: float) -> TopicSnapshot:
        snapshot = self.reader.sample()
        rates: dict[int, float] = {}
        for stream in snapshot.streams:
            log = self.reader._log(stream.registration_id, stream.kind)
            previous = self._previous.get(stream.registration_id)
            self._previous[stream.registration_id] = (now, stream.publisher_position)
            if log is None or previous is None or now <= previous[0]:
                continue
            moved = stream.publisher_position - previous[1]
            if moved <= 0:
                continue
            start = _sample_start(previous[1], stream.publisher_position, log.term_length)
            counts, scanned = count_topics(log, start, stream.publisher_position)
            scale = moved / scanned / (now - previous[0]) if scanned else 0.0
            for topic, n in counts.items():
                rates[topic] = rates.get(topic, 0.0) + n * scale
        if self.registry is not None:
            self.registry.poll()
        names = self.registry.names if self.registry is not None else {}
        out = TopicSnapshot(
            topics=[TopicRate(t, names.get(t), r) for t, r in sorted(rates.items(), key=lambda item: -item[1])]
        )
        lags: dict[int, int] = {}
        for stream in snapshot.streams:
            for sub in stream.subscribers:
                lags[sub.registration_id] = max(lags.get(sub.registration_id, 0), sub.lag)
        folder = os.path.join(self.dir, TOPIC_SUBSCRIPTIONS_DIR)
        for entry in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            try:
                with open(os.path.join(folder, entry)) as f:
                    record = json.load(f)
                if not pid_alive(int(record["pid"])):
                    continue
                out.subscriptions.append(
                    TopicSubscriptionStat(
                        int(record["pid"]),
                        int(record["registration_id"]),
                        str(record["channel"]),
                        int(record["stream_id"]),
                        [str(p) for p in record["patterns"]],
                        lags.get(int(record["registration_id"])),
                    )
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written or removed, or not ours
        return out


def topic_lines(snapshot: TopicSnapshot, limit: int = 50) -> list[str]:
    lines = [f"{'msgs/s':>12}  topic"]
    for rate in snapshot.topics[:limit]:
        lines.append(f"{rate.msgs_per_s:12.1f}  {rate.name or f'<unnamed 0x{rate.topic_id:016x}>'}")
    if len(snapshot.topics) > limit:
        lines.append(f"{'':>12}  ... {len(snapshot.topics) - limit} more")
    lines.append("")
    lines.append(f"{'pid':>8} {'registration':>12} {'lag (bytes)':>12}  stream  patterns")
    for sub in snapshot.subscriptions:
        lag = "-" if sub.lag is None else str(sub.lag)
        lines.append(
            f"{sub.pid:>8} {sub.registration_id:>12} {lag:>12}  {sub.channel} {sub.stream_id}  {' '.join(sub.patterns)}"
        )
    return lines


def run_topics(directory: str, args: Any) -> int:
    """``logbuf-stat --topics`` (``--once``, ``--json``, ``--interval``, ``--duration``)."""
    import sys
    import time

    from logbuf.conduit.cnc import CncError

    try:
        reader = TopicStatReader(directory)
    except CncError as e:
        print(f"logbuf-stat: {e}", file=sys.stderr)
        return 2
    try:
        reader.sample(time.monotonic())  # the baseline for rates
        deadline = None if args.duration_ns is None else time.monotonic() + args.duration_ns / 1e9
        while True:
            time.sleep(args.interval_ns / 1e9)
            snapshot = reader.sample(time.monotonic())
            print(json.dumps(snapshot.to_json()) if args.json else "\n".join(topic_lines(snapshot)), flush=True)
            if args.once or (deadline is not None and time.monotonic() >= deadline):
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        reader.close()
