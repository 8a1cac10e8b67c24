"""Topic names, their 63-bit ids and NATS-style wildcard patterns (``protocol_spec/topics.md``).

A topic name is UTF-8 text of 1..1024 bytes: tokens separated by ``.``, each token non-empty, no white space,
no token that is only ``*`` or ``>`` (those are pattern wildcards). Its *topic id* is the first 8 bytes of
BLAKE2b-64 (RFC 7693, ``digest_size=8``) of the name's UTF-8 bytes, read little-endian, with bit 63 cleared
(0 becomes 1): every process and host computes the same id from the name alone, with no coordination, and a
frame's reserved value carries it.

A pattern is a name whose tokens may be ``*`` (exactly one token) or, as the last token only, ``>`` (one or
more tokens): ``md.equities.*`` matches ``md.equities.AAPL`` but not ``md.equities`` or
``md.equities.AAPL.bid``; ``md.>`` matches both of the latter. A pattern with no wildcard is an exact name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Final

from logbuf.errors import ConfigurationError

__all__ = [
    "MAX_TOPIC_NAME_LENGTH",
    "TOPIC_ID_BITS",
    "TopicNameError",
    "TopicPatterns",
    "check_pattern",
    "check_topic_name",
    "definition_value",
    "topic_id",
]

MAX_TOPIC_NAME_LENGTH: Final[int] = 1024
"""Longest name in UTF-8 bytes: a definition frame holds it unfragmented within any MTU logbuf allows."""
TOPIC_ID_BITS: Final[int] = 63
TOPIC_ID_MASK: Final[int] = (1 << TOPIC_ID_BITS) - 1
DEFINITION_FLAG: Final[int] = 1 << 63
"""Set in the reserved value (as an int64: negative) of a definition frame."""
SEPARATOR: Final[str] = "."
SINGLE_WILDCARD: Final[str] = "*"
TAIL_WILDCARD: Final[str] = ">"
_WHITE_SPACE = re.compile(r"\s")


class TopicNameError(ConfigurationError):
    """A topic name or pattern breaks the rules (the message names the rule and the text)."""


def _check_tokens(text: str, what: str, *, wildcards: bool) -> bytes:
    if not isinstance(text, str):
        raise TopicNameError(f"{what} must be a str, got {type(text).__name__}")
    encoded = text.encode("utf-8", "surrogatepass")
    if not 0 < len(encoded) <= MAX_TOPIC_NAME_LENGTH:
        raise TopicNameError(f"{what} {text!r} is {len(encoded)} bytes; must be 1..{MAX_TOPIC_NAME_LENGTH}")
    if _WHITE_SPACE.search(text):
        raise TopicNameError(f"{what} {text!r} contains white space")
    tokens = text.split(SEPARATOR)
    for i, token in enumerate(tokens):
        if not token:
            raise TopicNameError(f"{what} {text!r} has an empty token (at {i})")
        if token in (SINGLE_WILDCARD, TAIL_WILDCARD):
            if not wildcards:
                raise TopicNameError(f"{what} {text!r}: a name has no wildcard token ({token!r} at {i})")
            if token == TAIL_WILDCARD and i != len(tokens) - 1:
                raise TopicNameError(f"{what} {text!r}: '>' may only be the last token")
    return encoded


def check_topic_name(name: str) -> bytes:
    """The name's UTF-8 bytes, or TopicNameError naming the broken rule."""
    return _check_tokens(name, "topic name", wildcards=False)


def check_pattern(pattern: str) -> str:
    """The pattern, or TopicNameError naming the broken rule."""
    _check_tokens(pattern, "topic pattern", wildcards=True)
    return pattern


def topic_id_of_bytes(name: bytes) -> int:
    """The topic id of a name's UTF-8 bytes (not checked)."""
    value = int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little") & TOPIC_ID_MASK
    return value or 1


def topic_id(name: str) -> int:
    """The 63-bit topic id of ``name`` (checked): the same in every process and on every host."""
    return topic_id_of_bytes(check_topic_name(name))


def definition_value(topic_id_: int) -> int:
    """The reserved value (a signed int64) of ``topic_id_``'s definition frame."""
    return topic_id_ - (1 << 63)


class TopicPatterns:
    """A set of patterns; :meth:`matches` answers for a name (called once per topic id by a subscriber's
    filter, never per message): an exact-name set lookup, then each wildcard pattern token by token."""

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self._exact: set[str] = set()
        self._wild: dict[str, tuple[str, ...]] = {}
        self._all = False
        for pattern in patterns:
            self.add(pattern)

    def add(self, pattern: str) -> bool:
        """Add a pattern; False if it was there already."""
        check_pattern(pattern)
        tokens = tuple(pattern.split(SEPARATOR))
        if SINGLE_WILDCARD in tokens or TAIL_WILDCARD in tokens:
            if pattern in self._wild:
                return False
            self._wild[pattern] = tokens
        else:
            if pattern in self._exact:
                return False
            self._exact.add(pattern)
        self._all = TAIL_WILDCARD in self._wild
        return True

    def remove(self, pattern: str) -> bool:
        """Remove a pattern; False if it was not there."""
        if pattern in self._wild:
            del self._wild[pattern]
            found = True
        elif pattern in self._exact:
            self._exact.discard(pattern)
            found = True
        else:
            found = False
        self._all = TAIL_WILDCARD in self._wild
        return found

    @property
    def patterns(self) -> list[str]:
        return sorted(self._exact) + sorted(self._wild)

    def __len__(self) -> int:
        return len(self._exact) + len(self._wild)

    def matches(self, name: str) -> bool:
        if self._all or name in self._exact:
            return True
        if not self._wild:
            return False
        tokens = name.split(SEPARATOR)
        return any(_match_tokens(pattern, tokens) for pattern in self._wild.values())


def _match_tokens(pattern: tuple[str, ...], tokens: list[str]) -> bool:
    for i, want in enumerate(pattern):
        if want == TAIL_WILDCARD:
            return len(tokens) > i
        if i >= len(tokens) or (want != SINGLE_WILDCARD and want != tokens[i]):
            return False
    return len(tokens) == len(pattern)
