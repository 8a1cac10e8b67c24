"""Subscriber options of jetstream's v1 ``/subscribe``: the query string and ``options_update``.

Both sources give the same :class:`SubscriberOptions`, validated by the same rules (facts file
§1.2, §1.3, §2):

* ``wantedCollections``: exact NSIDs, or prefixes ending in ``.*`` (``app.bsky.graph.*`` keeps the
  trailing dot and matches by starts-with; the head is *not* validated, as in jetstream). Empty
  means all collections. At most 100 after de-duplicating exact names and prefixes.
* ``wantedDids``: DIDs, at most 10,000 after de-duplication. Empty means all DIDs.
* ``maxMessageSizeBytes``: events whose JSON is longer are skipped; 0 / negative / not a number /
  above 2**32-1 mean no limit (v2's reading: compared with the uncompressed JSON length).
* ``cursor`` (query only): a decimal int64 (``+``/``-`` allowed, as Go's ``ParseInt``); anything
  else is ``invalid cursor: X``. Values <= 0 replay everything retained.
* ``compress`` / ``requireHello`` (query only): on for the exact string ``true`` only.

Errors are :class:`OptionsError` whose text is what jetstream answers: the HTTP 400 body for the
query, the close reason (1008) for an ``options_update``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from logbuf.errors import LogbufError

__all__ = [
    "MAX_CLIENT_MESSAGE_LENGTH",
    "MAX_WANTED_COLLECTIONS",
    "MAX_WANTED_DIDS",
    "CollectionFilter",
    "OptionsError",
    "OptionsUpdateDecodeError",
    "SubscriberOptions",
    "is_valid_did",
    "is_valid_nsid",
    "parse_options_update",
    "parse_query",
    "truncate_close_reason",
]

MAX_WANTED_COLLECTIONS: Final = 100
MAX_WANTED_DIDS: Final = 10_000
#: v2's anti-abuse bound on the raw list before de-duplication: 100 times the cap.
RAW_LIST_FACTOR: Final = 100
#: Client→server messages: 10 MB (decimal); longer ones close the connection with 1009.
MAX_CLIENT_MESSAGE_LENGTH: Final = 10_000_000
MAX_UINT32: Final = (1 << 32) - 1
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1
#: A close reason fits in 123 bytes (RFC 6455 §5.5: 125-byte control payload minus the code).
MAX_CLOSE_REASON_LENGTH: Final = 123

# atproto NSID: domain-authority segments (hostname rules, the first not starting with a digit), then a
# name segment of letters and digits not starting with a digit; at least three segments, <= 317 chars.
_NSID_RE: Final = re.compile(
    r"[a-zA-Z]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)+"
    r"(\.[a-zA-Z][a-zA-Z0-9]{0,62})"
)
_NSID_MAX_LENGTH: Final = 317
# atproto DID: "did:" method ":" method-specific id; at most 2 KiB.
_DID_RE: Final = re.compile(r"did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]")
_DID_MAX_LENGTH: Final = 2048
# The same rule for a whole list at once, one DID a line (one regex pass over the joined list instead of a
# call per DID: 10,000 DIDs in ~3 ms rather than ~10 ms); possessive, so it never backtracks.
_DID_LINES_RE: Final = re.compile(r"(?:did:[a-z]++:[a-zA-Z0-9._:%-]*+(?<=[a-zA-Z0-9._-])\n)*+")
_CURSOR_RE: Final = re.compile(r"[+-]?[0-9]+")
_INVALID_OPTIONS: Final = "invalid subscriber options"


class OptionsError(LogbufError, ValueError):
    """Options that fail validation; ``str()`` is jetstream's text for it."""


class OptionsUpdateDecodeError(LogbufError, ValueError):
    """A client message that is not a well-formed envelope or ``options_update`` payload (close 1007)."""


def is_valid_nsid(value: str) -> bool:
    return len(value) <= _NSID_MAX_LENGTH and _NSID_RE.fullmatch(value) is not None


def is_valid_did(value: str) -> bool:
    return len(value) <= _DID_MAX_LENGTH and _DID_RE.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class CollectionFilter:
    """Exact NSIDs plus starts-with prefixes (each ending in a dot); empty = all collections."""

    exact: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    @property
    def wants_all(self) -> bool:
        return not self.exact and not self.prefixes

    def matches(self, collection: str) -> bool:
        """Whether a commit in ``collection`` passes (identity/account events are not asked)."""
        if self.wants_all or collection in self.exact:
            return True
        return any(collection.startswith(p) for p in self.prefixes)


@dataclass(frozen=True, slots=True)
class SubscriberOptions:
    collections: CollectionFilter = field(default_factory=CollectionFilter)
    dids: frozenset[str] = frozenset()
    max_message_size_bytes: int = 0  # 0: no limit
    cursor: int | None = None  # query only: None = live
    compress: bool = False  # query only
    require_hello: bool = False  # query only

    @property
    def wants_everything(self) -> bool:
        """No filter at all: the client is a plain byte cursor into the frame file."""
        return self.collections.wants_all and not self.dids and self.max_message_size_bytes == 0

    def with_update(self, update: SubscriberOptions) -> SubscriberOptions:
        """An ``options_update`` replaces the filters and size limit; cursor and compression stay."""
        return SubscriberOptions(
            update.collections,
            update.dids,
            update.max_message_size_bytes,
            self.cursor,
            self.compress,
            self.require_hello,
        )


def _collection_filter(values: Sequence[str]) -> CollectionFilter:
    if len(values) > MAX_WANTED_COLLECTIONS * RAW_LIST_FACTOR:
        raise OptionsError(f"{_INVALID_OPTIONS}: too many wanted collections")
    exact: set[str] = set()
    prefixes: dict[str, None] = {}
    for value in dict.fromkeys(values):  # each distinct value once, in order
        if value.endswith(".*"):
            prefixes[value[:-1]] = None  # keep the trailing dot: "app.bsky.graph." never matches graphx
        elif is_valid_nsid(value):
            exact.add(value)
        else:
            raise OptionsError(f"{_INVALID_OPTIONS}: invalid collection: {value}")
    if len(exact) + len(prefixes) > MAX_WANTED_COLLECTIONS:
        raise OptionsError(f"{_INVALID_OPTIONS}: too many wanted collections")
    return CollectionFilter(frozenset(exact), tuple(prefixes))


def _did_set(values: Sequence[str]) -> frozenset[str]:
    if len(values) > MAX_WANTED_DIDS * RAW_LIST_FACTOR:
        raise OptionsError(f"{_INVALID_OPTIONS}: too many wanted DIDs")
    if not _all_valid_dids(values):
        for value in values:
            if not is_valid_did(value):
                raise OptionsError(f"{_INVALID_OPTIONS}: invalid DID: {value}")
    dids = frozenset(values)
    if len(dids) > MAX_WANTED_DIDS:
        raise OptionsError(f"{_INVALID_OPTIONS}: too many wanted DIDs")
    return dids


def _all_valid_dids(values: Sequence[str]) -> bool:
    """Whether every value is a valid DID (the fast path of :func:`is_valid_did` over a list)."""
    if not values:
        return True
    if max(map(len, values)) > _DID_MAX_LENGTH:
        return False
    lines = "\n".join(values) + "\n"
    return lines.count("\n") == len(values) and _DID_LINES_RE.fullmatch(lines) is not None


def _size_limit(value: int) -> int:
    return value if 0 < value <= MAX_UINT32 else 0


def parse_query(query: Mapping[str, Sequence[str]], headers: Iterable[tuple[str, str]] = ()) -> SubscriberOptions:
    """Options from a percent-decoded query (repeated keys as lists, as ``urllib.parse.parse_qs``).

    ``headers``: the request's headers; ``Socket-Encoding`` containing ``zstd`` asks for compression
    as ``compress=true`` does. Raises :class:`OptionsError` with jetstream's 400 text.
    """
    collections = _collection_filter(query.get("wantedCollections", ()))
    dids = _did_set(query.get("wantedDids", ()))
    size_values = query.get("maxMessageSizeBytes", ())
    max_size = 0
    if size_values and re.fullmatch(r"[+-]?[0-9]+", size_values[0]):
        max_size = _size_limit(int(size_values[0]))
    cursor: int | None = None
    cursor_values = query.get("cursor", ())
    if cursor_values and cursor_values[0] != "":
        raw = cursor_values[0]
        if _CURSOR_RE.fullmatch(raw) is None or not INT64_MIN <= int(raw) <= INT64_MAX:
            raise OptionsError(f"invalid cursor: {raw}")
        cursor = int(raw)
    compress = query.get("compress", ("",))[0] == "true" or any(
        name.lower() == "socket-encoding" and "zstd" in value for name, value in headers
    )
    require_hello = query.get("requireHello", ("",))[0] == "true"
    return SubscriberOptions(collections, dids, max_size, cursor, compress, require_hello)


def _string_list(payload: Mapping[str, Any], key: str) -> list[str]:
    value = payload.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not set(map(type, value)) <= {str}:  # one C-level pass (10,000 DIDs)
        raise OptionsUpdateDecodeError("bad options_update payload")
    return value


def parse_options_update(message: str | bytes) -> SubscriberOptions | None:
    """Decode one client text message.

    Returns the new options for an ``options_update`` (filters and size only), ``None`` for any
    other ``type`` and for ``null`` (ignored, as jetstream does: Go decodes ``null`` and a null or
    missing ``type`` into an empty type). Raises :class:`OptionsUpdateDecodeError` (close
    1007: bad envelope or bad payload JSON) or :class:`OptionsError` (close 1008: fails validation).
    """
    try:
        envelope = json.loads(message)
    except ValueError:
        raise OptionsUpdateDecodeError("bad SubscriberSourcedMessage envelope") from None
    if envelope is None:
        return None  # Go decodes JSON null into an empty envelope: type "", ignored
    type_ = envelope.get("type") if isinstance(envelope, dict) else 0
    if type_ is not None and not isinstance(type_, str):
        raise OptionsUpdateDecodeError("bad SubscriberSourcedMessage envelope")
    if type_ != "options_update":
        return None  # an unknown (or null, or missing) type is ignored, as jetstream does
    if "payload" not in envelope:
        raise OptionsUpdateDecodeError("bad options_update payload")
    payload = envelope["payload"]
    if payload is None:
        payload = {}  # JSON null decodes to an empty update: every filter off
    if not isinstance(payload, dict):
        raise OptionsUpdateDecodeError("bad options_update payload")
    size = payload.get("maxMessageSizeBytes")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int)):
        raise OptionsUpdateDecodeError("bad options_update payload")
    collections = _collection_filter(_string_list(payload, "wantedCollections"))
    dids = _did_set(_string_list(payload, "wantedDids"))
    return SubscriberOptions(collections, dids, _size_limit(size or 0))


def truncate_close_reason(text: str) -> str:
    """Fit ``text`` into a close reason: at most 123 UTF-8 bytes, cut on a character, ``...`` appended."""
    data = text.encode()
    if len(data) <= MAX_CLOSE_REASON_LENGTH:
        return text
    cut = data[: MAX_CLOSE_REASON_LENGTH - 3].decode("utf-8", errors="ignore")
    return cut + "..."
