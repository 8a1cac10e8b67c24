"""Jetstream v1 events: what the relay needs to know about one event, read from its JSON bytes.

An event on the v1 wire is one JSON object (facts file §3)::

    {"did": "did:plc:…", "time_us": 1725911162329308, "kind": "commit",
     "commit": {"rev": …, "operation": "create", "collection": "app.bsky.feed.post", "rkey": …, …}}

``kind`` is ``commit``, ``identity`` or ``account``, and exactly the object named by the kind
follows. The relay never re-encodes an event: the bytes it ingests are the bytes it stores and
sends. :func:`parse_event` only extracts the fields that routing, filtering and cursors need
(:class:`EventMeta`) and rejects what is not a v1 event, with an error that names the problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

__all__ = ["EVENT_KINDS", "KIND_ACCOUNT", "KIND_COMMIT", "KIND_IDENTITY", "EventMeta", "parse_event"]

KIND_COMMIT: Final = "commit"
KIND_IDENTITY: Final = "identity"
KIND_ACCOUNT: Final = "account"
EVENT_KINDS: Final = frozenset((KIND_COMMIT, KIND_IDENTITY, KIND_ACCOUNT))

#: Largest time_us accepted: jetstream's cursor is a signed 64-bit count of microseconds.
MAX_TIME_US: Final = (1 << 63) - 1

_loads = json.loads


@dataclass(frozen=True, slots=True)
class EventMeta:
    """The routing fields of one event.

    ``collection`` is the commit's collection (``None`` for identity and account events, and for a
    commit whose collection is missing or empty: such commits pass every collection filter).
    """

    time_us: int
    did: str
    kind: str
    collection: str | None


def _preview(raw: bytes) -> str:
    return repr(raw[:60]) + ("…" if len(raw) > 60 else "")


def parse_event(raw: bytes) -> EventMeta:
    """Read ``time_us``, ``did``, ``kind`` and (commits) ``collection`` from one event's JSON bytes.

    Raises ``ValueError`` naming the problem: not JSON, not an object, ``did`` / ``time_us`` /
    ``kind`` missing or of the wrong type, an unknown kind, or a missing payload object.
    """
    try:
        obj = _loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"event is not valid JSON ({exc}): {_preview(raw)}") from None
    if type(obj) is not dict:
        raise ValueError(f"event is not a JSON object but {type(obj).__name__}: {_preview(raw)}")
    did = obj.get("did")
    if type(did) is not str:
        if did is None:
            raise ValueError(f"event has no 'did': {_preview(raw)}")
        raise ValueError(f"event 'did' is not a string: {did!r}")
    if not did.startswith("did:"):
        raise ValueError(f"event 'did' is not a DID: {did!r}")
    time_us = obj.get("time_us")
    if type(time_us) is not int:
        if time_us is None:
            raise ValueError(f"event has no 'time_us': {_preview(raw)}")
        raise ValueError(f"event 'time_us' is not an integer: {time_us!r}")
    if not 0 < time_us <= MAX_TIME_US:
        raise ValueError(f"event 'time_us' {time_us} is outside 1..2**63-1")
    kind = obj.get("kind")
    if kind is None:
        raise ValueError(f"event has no 'kind': {_preview(raw)}")
    if kind not in EVENT_KINDS:
        raise ValueError(f"event 'kind' {kind!r} is not one of commit, identity, account")
    payload = obj.get(kind)
    if type(payload) is not dict:
        raise ValueError(f"{kind} event has no {kind!r} object: {_preview(raw)}")
    if kind == KIND_COMMIT:
        collection = payload.get("collection")
        if collection is not None and type(collection) is not str:
            raise ValueError(f"commit 'collection' is not a string: {collection!r}")
        return EventMeta(time_us, did, KIND_COMMIT, collection or None)
    return EventMeta(time_us, did, kind, None)
