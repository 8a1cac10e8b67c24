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

import argparse
import functools
import re
import warnings
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, Final, TypeVar, cast

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


def duration_argument(bare_unit: str, *, positive: bool = False) -> Callable[[str], int]:
    """An argparse ``type=`` for a duration flag: the text in nanoseconds, a bare number in ``bare_unit`` (the
    unit that flag always read); ``positive`` also refuses 0. Errors name the text."""

    def parse(text: str) -> int:
        stripped = text.strip()
        try:
            value = parse_duration_ns(stripped.removeprefix("-"), bare_unit)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration ({EXAMPLES})") from None
        if stripped.startswith("-") or (positive and value <= 0):
            raise argparse.ArgumentTypeError(
                f"{text!r} must be a {'positive' if positive else 'non-negative'} duration"
            )
        return value

    return parse


def format_duration_ns(value_ns: int) -> str:
    """``value_ns`` as one would type it: the largest unit that divides it (``10s``, ``100us``, ``0ns``)."""
    for unit in ("d", "h", "m", "s", "ms", "us"):
        if value_ns and value_ns % NS_PER_UNIT[unit] == 0:
            return f"{value_ns // NS_PER_UNIT[unit]}{unit}"
    return f"{value_ns}ns"


_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])


def renamed_duration_keywords(renames: Mapping[str, tuple[str, int]]) -> Callable[[type[_T]], type[_T]]:
    """A class decorator that keeps renamed duration keywords working for one release: ``renames`` maps each
    old keyword to its new ``*_ns`` name and the factor from the old unit to nanoseconds (``1_000_000`` for an
    old ``*_ms``, ``1_000_000_000`` for an old ``*_s`` of float seconds, ``1`` for an old name that already
    held nanoseconds). Giving an old keyword warns
    (DeprecationWarning naming the new one) and sets the new one; reading the old attribute does the same."""

    def decorate(cls: type[_T]) -> type[_T]:
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: _T, *args: Any, **kwargs: Any) -> None:
            _convert_renamed(cls.__name__, renames, kwargs)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[method-assign, assignment]
        for old, (new, factor) in renames.items():
            setattr(cls, old, _old_attribute(cls, old, new, factor))
        return cls

    return decorate


def renamed_duration_arguments(renames: Mapping[str, tuple[str, int]]) -> Callable[[_F], _F]:
    """:func:`renamed_duration_keywords` for a function: an old keyword argument warns and is converted."""

    def decorate(function: _F) -> _F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _convert_renamed(function.__name__, renames, kwargs)
            return function(*args, **kwargs)

        return cast(_F, wrapper)

    return decorate


def _convert_renamed(owner: str, renames: Mapping[str, tuple[str, int]], kwargs: dict[str, Any]) -> None:
    for old, (new, factor) in renames.items():
        if old in kwargs:
            if new in kwargs:
                raise TypeError(f"{owner}() got both {old}= and its new name {new}=")
            warnings.warn(_renamed(owner, old, new), DeprecationWarning, stacklevel=3)
            value = kwargs.pop(old)
            kwargs[new] = None if value is None else round(value * factor)


def _renamed(owner: str, old: str, new: str) -> str:
    return f"{owner}.{old} is deprecated and will be removed: use {new} (integer nanoseconds)"


def _old_attribute(cls: type, old: str, new: str, factor: int) -> property:
    def get(self: object) -> float | None:
        warnings.warn(_renamed(cls.__name__, old, new), DeprecationWarning, stacklevel=2)
        value: int | None = getattr(self, new)
        if value is None:
            return None
        return value // factor if old.endswith("_ms") or factor == 1 else value / factor  # seconds were floats

    return property(get, doc=f"Deprecated: ``{new}`` in the old unit.")
