"""Range digests of stream histories: the sans-IO core of archive sync.

Theory of operation
-------------------
A *stream history* is the union of one archive's recordings of one publication (source identity, session,
stream, channel, initial term id, term length): stream positions are the same on every archive that
recorded or copied it, so a history is a set of position intervals (its *coverage*, with holes where a
recorder was down) and the bytes at those positions.

Sync compares two histories in two steps (``protocol_spec/archive-sync.md`` has the messages and costs):

1. Coverage: each side sends its intervals (16 bytes each). What one side lacks is exactly
   ``subtract(theirs, mine)``: no digest is needed to find missing ranges, because positions are a shared
   coordinate system (this is why recursive block digests over positions are used, not range-based set
   reconciliation of frame hashes: RBSR finds the difference of two *unordered* sets of items; here the
   items are already keyed by position, and what both hold must also be checked byte for byte).
2. Equality of what both hold: the common intervals are cut into aligned blocks; each side sends a digest
   per block (BLAKE2b-128 over the block's covered bytes); a block whose digests differ is cut into
   ``fanout`` children, and so on down to ``leaf_length`` bytes. A differing leaf is a *conflict*,
   reported by position: sync never overwrites it unless exactly one side's frames verify.

All functions here are pure: intervals and byte readers in, intervals and digests out.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DIGEST_LENGTH",
    "INTERVAL_LENGTH",
    "Interval",
    "ReconcileResult",
    "Verdict",
    "children",
    "clip",
    "digest_range",
    "intersect",
    "merge",
    "pack_intervals",
    "reconcile",
    "subtract",
    "top_blocks",
    "unpack_intervals",
]

Interval = tuple[int, int]
"""``[start, end)`` in stream positions."""
DIGEST_LENGTH = 16
"""BLAKE2b-128: collisions are not a concern at archive sizes (2^64 work for one by chance)."""
READ_CHUNK_LENGTH: Final = 1 << 20
"""digest_range reads at most this many bytes at a time (a 1 GiB block is never one bytes object)."""
_INTERVAL: Final = struct.Struct("<qq")
INTERVAL_LENGTH: Final = _INTERVAL.size
"""An interval on the wire: start and end as int64 LE (16 bytes)."""


class Verdict(enum.IntEnum):
    """Whether the frames that overlap a block verify (one byte per block in a ``SyncDigests``)."""

    NOT_ASKED = 0
    VERIFIES = 1
    """Every frame is well formed and its payload's CRC-32 matches (the recording has checksums)."""
    WELL_FORMED = 2
    """Every frame is well formed; the recording has no checksums, so its bytes cannot be proven."""
    FAILS = 3
    """A frame is malformed or its CRC-32 does not match."""


def pack_intervals(intervals: Sequence[Interval]) -> bytes:
    return b"".join(_INTERVAL.pack(start, end) for start, end in intervals)


def unpack_intervals(data: bytes) -> list[Interval]:
    """Intervals off the wire; raises ValueError naming the problem (a length that is not a multiple of 16,
    an empty or reversed interval, intervals out of order or overlapping)."""
    if len(data) % INTERVAL_LENGTH:
        raise ValueError(f"{len(data)} bytes of intervals is not a multiple of {INTERVAL_LENGTH}")
    out = [(int(s), int(e)) for s, e in _INTERVAL.iter_unpack(data)]
    for i, (start, end) in enumerate(out):
        if start < 0 or end <= start:
            raise ValueError(f"interval {i} [{start}, {end}) is empty, reversed or negative")
        if i and start < out[i - 1][1]:
            raise ValueError(f"interval {i} [{start}, {end}) overlaps or precedes the one before it")
    return out


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint, non-empty intervals covering the same positions (touching ones joined)."""
    out: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Positions in both (each argument merged)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Positions in ``a`` and not in ``b`` (each argument merged): what a side holding ``b`` lacks."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        cursor = start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def clip(intervals: Sequence[Interval], start: int, end: int) -> list[Interval]:
    return intersect(intervals, [(start, end)])


def digest_range(read: Callable[[int, int], bytes], coverage: Sequence[Interval], start: int, end: int) -> bytes:
    """The digest of ``[start, end)``: the covered sub-intervals (as two int64) and their bytes, in order."""
    h = hashlib.blake2b(digest_size=DIGEST_LENGTH)
    for s, e in clip(coverage, start, end):
        h.update(_INTERVAL.pack(s, e))
        for lo in range(s, e, READ_CHUNK_LENGTH):  # the digest is the same however the bytes are cut
            h.update(read(lo, min(e, lo + READ_CHUNK_LENGTH)))
    return h.digest()


def top_blocks(common: Sequence[Interval], block_length: int) -> list[Interval]:
    """The aligned blocks of ``block_length`` that hold any common position."""
    blocks: list[Interval] = []
    for start, end in common:
        lo = start - start % block_length
        while lo < end:
            if not blocks or blocks[-1][0] != lo:
                blocks.append((lo, lo + block_length))
            lo += block_length
    return blocks


def children(block: Interval, fanout: int, min_length: int = 1) -> list[Interval]:
    """``block`` cut into ``fanout`` equal parts, none shorter than ``min_length`` (the leaf length)."""
    start, end = block
    step = max((end - start) // fanout, min_length, 1)
    return [(lo, min(lo + step, end)) for lo in range(start, end, step)]


@dataclass
class ReconcileResult:
    conflicts: list[Interval]
    """Leaf ranges (within the common coverage) whose bytes differ."""
    rounds: int
    """Digest round trips."""
    digests_exchanged: int
    """Digests sent by both sides together (each DIGEST_LENGTH bytes plus 16 for its range)."""


def reconcile(
    local: Callable[[list[Interval]], list[bytes]],
    remote: Callable[[list[Interval]], list[bytes]],
    common: Sequence[Interval],
    *,
    block_length: int = 1 << 30,
    fanout: int = 16,
    leaf_length: int = 4096,
) -> ReconcileResult:
    """Descend from aligned ``block_length`` blocks of ``common`` into the blocks whose digests differ.

    ``local`` and ``remote`` each take a batch of ranges and return one digest per range (over the range
    clipped to ``common``): one call to ``remote`` is one round trip."""
    if fanout < 2 or leaf_length <= 0 or block_length < leaf_length:
        raise ValueError(f"fanout={fanout} must be >= 2 and leaf_length={leaf_length} <= block_length={block_length}")
    pending = top_blocks(common, block_length)
    conflicts: list[Interval] = []
    rounds = exchanged = 0
    while pending:
        rounds += 1
        theirs = remote(pending)
        mine = local(pending)
        exchanged += 2 * len(pending)
        differing = [block for block, x, y in zip(pending, mine, theirs, strict=True) if x != y]
        pending = []
        for block in differing:
            if block[1] - block[0] <= leaf_length:
                conflicts.extend(clip(common, *block))
            else:
                pending.extend(children(block, fanout, leaf_length))
    return ReconcileResult(merge(conflicts), rounds, exchanged)
