"""Durations as people type them, one grammar everywhere: a number and a unit (``500ns``, ``100us``, ``10ms``,
``5s``, ``15m``, ``24h``, ``1.5d``), parsed to integer nanoseconds.

The convention (STYLE "units in names"): code holds durations as ``int`` nanoseconds in ``*_ns`` names
(``*_ms`` only where a wire or file format is in milliseconds, as Aeron's CnC and counters are); people give
human strings, in environment variables, on every command line (``mediadriver``, ``logbuf-archive``,
``logbuf-jetstream``) and in channel URIs (``linger=5s``, ``nak-delay=100us``). A bare number keeps the
meaning it always had where it is read: nanoseconds in driver settings and channel URIs (Aeron's), seconds
on the archive and relay command lines.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Final

NS_PER_UNIT: Final[dict[str, int]] = {
    "ns": 1,
    "us": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": 86_400_000_000_000,
}
"""Each unit in nanoseconds."""
_DURATION: Final = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(ns|us|ms|s|m|h|d)?\s*", re.IGNORECASE)
EXAMPLES: Final[str] = "e.g. 500ns, 100us, 10ms, 5s, 15m, 24h"


def parse_duration_ns(text: str, bare_unit: str = "ns") -> int:
    """``text`` in nanoseconds (rounded down); a number without a unit is in ``bare_unit``. Raises
    ValueError naming the text if it is not a non-negative duration."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration ({EXAMPLES})")
    unit = (match[2] or bare_unit).lower()
    return int(Fraction(match[1]) * NS_PER_UNIT[unit])  # exact: 9999999999s is 9999999999000000000 ns


def format_duration_ns(value_ns: int) -> str:
    """``value_ns`` as one would type it: the largest unit that divides it (``10s``, ``100us``, ``0ns``)."""
    for unit in ("d", "h", "m", "s", "ms", "us"):
        if value_ns and value_ns % NS_PER_UNIT[unit] == 0:
            return f"{value_ns // NS_PER_UNIT[unit]}{unit}"
    return f"{value_ns}ns"
