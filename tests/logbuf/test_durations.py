"""One grammar for durations: every unit everywhere, a bare number in the unit its reader always used."""

from __future__ import annotations

import pytest

from logbuf.durations import format_duration_ns, parse_duration_ns


@pytest.mark.parametrize(
    ("text", "bare_unit", "ns"),
    [
        ("500ns", "ns", 500),
        ("100us", "ns", 100_000),
        ("10ms", "s", 10_000_000),
        ("5s", "ns", 5_000_000_000),
        ("1.5s", "ns", 1_500_000_000),
        ("15m", "ns", 900_000_000_000),
        ("24h", "s", 86_400_000_000_000),
        ("1.5d", "s", 129_600_000_000_000),
        ("9999999999s", "ns", 9_999_999_999_000_000_000),  # exact, not through a float
        (" 7 S ", "ns", 7_000_000_000),
        ("250000", "ns", 250_000),  # driver settings and channel URIs: a bare number is nanoseconds
        ("90", "s", 90_000_000_000),  # the archive and relay command lines: seconds
    ],
)
def test_a_duration_is_parsed_to_nanoseconds(text: str, bare_unit: str, ns: int) -> None:
    assert parse_duration_ns(text, bare_unit) == ns


@pytest.mark.parametrize("text", ["", "soon", "-5s", "5 parsecs", "s", "1..5s"])
def test_what_is_not_a_duration_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="is not a"):
        parse_duration_ns(text)


def test_a_duration_is_formatted_in_its_largest_whole_unit() -> None:
    assert [format_duration_ns(v) for v in (0, 1, 100_000, 10_000_000_000, 3_600_000_000_000)] == [
        "0ns",
        "1ns",
        "100us",
        "10s",
        "1h",
    ]
