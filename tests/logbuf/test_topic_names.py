"""Topic names, ids and NATS-style patterns (logbuf.topic_names)."""

from __future__ import annotations

import hashlib

import pytest

from logbuf.native import TopicFilter
from logbuf.topic_names import TopicNameError, TopicPatterns, check_pattern, definition_value, topic_id


def test_the_topic_id_is_blake2b_64_little_endian_with_bit_63_clear() -> None:
    digest = hashlib.blake2b(b"md.equities.AAPL", digest_size=8).digest()
    assert topic_id("md.equities.AAPL") == int.from_bytes(digest, "little") & (2**63 - 1)
    assert 0 < topic_id("é.ü") < 2**63
    assert definition_value(5) == 5 - 2**63 < 0


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("md.equities.AAPL", ["md.equities.AAPL"], ["md.equities.AAPL.bid", "md.equities", "md.equities.AAPLX"]),
        ("md.equities.*", ["md.equities.AAPL", "md.equities.X"], ["md.equities", "md.equities.AAPL.bid"]),
        ("md.*.AAPL", ["md.equities.AAPL", "md.x.AAPL"], ["md.AAPL", "md.a.b.AAPL"]),
        ("md.>", ["md.equities", "md.equities.AAPL.bid"], ["md", "mdx.a"]),
        (">", ["a", "a.b.c"], []),
        ("*", ["a"], ["a.b"]),
    ],
)
def test_patterns_match_as_nats_subjects(pattern: str, yes: list[str], no: list[str]) -> None:
    patterns = TopicPatterns([pattern])
    assert [patterns.matches(n) for n in yes] == [True] * len(yes)
    assert [patterns.matches(n) for n in no] == [False] * len(no)


@pytest.mark.parametrize("bad", ["", "a..b", ".a", "a.", "a b", "a\tb", "a.>.b", "x" * 1025])
def test_bad_patterns_are_refused_naming_the_rule(bad: str) -> None:
    with pytest.raises(TopicNameError, match="topic pattern"):
        check_pattern(bad)


def test_a_pattern_set_adds_and_removes() -> None:
    patterns = TopicPatterns(["a.b"])
    assert patterns.add("a.*") and not patterns.add("a.*")
    assert patterns.matches("a.c") and patterns.remove("a.*") and not patterns.matches("a.c")
    assert patterns.remove("a.b") and not patterns.remove("a.b") and len(patterns) == 0


def test_the_native_filter_resolves_an_id_once_and_never_delivers_definitions() -> None:
    calls: list[int] = []
    defined: list[tuple[int, bytes]] = []

    def resolve(topic: int) -> bool | None:
        calls.append(topic)
        return None if topic == 3 else topic % 2 == 0

    f = TopicFilter(resolve, lambda t, n: defined.append((t, n)))
    for _ in range(3):
        assert [f.accepts(v) for v in (2, 5, 3, 0)] == [True, False, False, False]
    assert calls == [2, 5, 3, 3, 3]  # a decided id is cached; an unnamed one asked again
    assert (f.delivered, f.skipped, f.unresolved, f.cached) == (3, 6, 3, 2)
    assert not f.accepts(definition_value(7), b"a.b") and defined == [(7, b"a.b")]
    for topic in range(10, 5000):  # grows past its first table
        f.accepts(topic * 2**40)
    assert f.cached == 2 + 4990 and f.accepts(2) and len(calls) == 5 + 4990
    f.reset()
    assert f.cached == 0 and f.accepts(2) and calls[-1] == 2
