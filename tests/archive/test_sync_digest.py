"""The sans-IO core of archive sync: interval algebra and the recursive range-digest descent."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logbuf.archive.sync_digest import (
    Interval,
    digest_range,
    intersect,
    merge,
    pack_intervals,
    reconcile,
    subtract,
    unpack_intervals,
)

intervals = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)).map(lambda t: (t[0], t[0] + t[1])), max_size=8)


def points(iv: list[Interval]) -> set[int]:
    return {p for s, e in iv for p in range(s, e)}


@given(intervals, intervals)
def test_interval_algebra_agrees_with_sets_of_positions(a: list[Interval], b: list[Interval]) -> None:
    ma, mb = merge(a), merge(b)
    assert points(ma) == points(a)
    assert all(x[1] < y[0] for x, y in zip(ma, ma[1:], strict=False))  # disjoint, not even touching
    assert points(intersect(ma, mb)) == points(a) & points(b)
    assert points(subtract(ma, mb)) == points(a) - points(b)


def digests(data: bytes, common: list[Interval]) -> Callable[[list[Interval]], list[bytes]]:
    return lambda ranges: [digest_range(lambda s, e: data[s:e], common, s, e) for s, e in ranges]


def test_equal_histories_cost_one_round_of_one_digest_per_top_block() -> None:
    data = random.Random(1).randbytes(1 << 20)
    common = [(0, len(data))]
    result = reconcile(digests(data, common), digests(data, common), common, block_length=1 << 20)
    assert (result.conflicts, result.rounds, result.digests_exchanged) == ([], 1, 2)


def test_changed_bytes_are_found_at_their_leaf_positions_and_nothing_else() -> None:
    data = random.Random(2).randbytes(1 << 20)
    other = bytearray(data)
    for position in (5, 300_000, 300_001, 1_000_000):
        other[position] ^= 0xFF
    common = [(0, 700_000), (900_000, 1 << 20)]  # holes are not compared
    result = reconcile(
        digests(data, common), digests(bytes(other), common), common, block_length=1 << 20, leaf_length=4096
    )
    assert result.conflicts == [(0, 4096), (299_008, 303_104), (999_424, 1_003_520)]
    # 1 MiB -> 64 KiB -> 4 KiB: three rounds, 16 children of each differing block
    assert result.rounds == 3
    assert result.digests_exchanged == 2 * (1 + 16 + 3 * 16)


def test_a_change_outside_the_common_coverage_is_no_conflict() -> None:
    data = random.Random(3).randbytes(1 << 16)
    other = bytearray(data)
    other[40_000] ^= 1
    common = [(0, 32_768)]
    result = reconcile(digests(data, common), digests(bytes(other), common), common, block_length=1 << 16)
    assert result.conflicts == []


@given(intervals)
def test_intervals_round_trip_through_their_wire_form(iv: list[Interval]) -> None:
    assert unpack_intervals(pack_intervals(merge(iv))) == merge(iv)


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        (pack_intervals([(0, 4096)])[:-1], "not a multiple of 16"),
        (pack_intervals([(4096, 4096)]), "empty, reversed or negative"),
        (pack_intervals([(-32, 0)]), "empty, reversed or negative"),
        (pack_intervals([(0, 4096), (4000, 8192)]), "overlaps or precedes"),
        (pack_intervals([(8192, 9000), (0, 4096)]), "overlaps or precedes"),
    ],
)
def test_intervals_off_the_wire_are_checked(wire: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        unpack_intervals(wire)


def test_a_digest_does_not_depend_on_how_the_bytes_are_read() -> None:
    data = random.Random(7).randbytes(3 << 20)
    cover = [(0, 1 << 20), (1 << 21, 3 << 20)]
    whole = digest_range(lambda s, e: data[s:e], cover, 0, 3 << 20)
    calls: list[int] = []

    def read(s: int, e: int) -> bytes:
        calls.append(e - s)
        return data[s:e]

    assert digest_range(read, cover, 0, 3 << 20) == whole and max(calls) <= 1 << 20


def test_a_1_gib_block_descends_to_4_kib_leaves_in_6_rounds() -> None:
    """1 GiB -> 64 MiB -> 4 MiB -> 256 KiB -> 16 KiB -> 4 KiB (the last cut is 4, not 16: no leaf is
    shorter than the leaf length); 16 digests per differing block."""
    changed = 700_000_123

    def side(differs: bool) -> Callable[[list[Interval]], list[bytes]]:
        return lambda blocks: [bytes([differs and s <= changed < e]) for s, e in blocks]

    result = reconcile(side(False), side(True), [(0, 1 << 30)], block_length=1 << 30, fanout=16, leaf_length=4096)
    leaf = changed - changed % 4096
    assert result.conflicts == [(leaf, leaf + 4096)]
    assert result.rounds == 6 and result.digests_exchanged == 2 * (1 + 16 * 4 + 4)
