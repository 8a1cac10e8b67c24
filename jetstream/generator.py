"""A synthetic jetstream: realistic v1 events (facts file §3) from a seeded generator.

The relay's embedded default source (``logbuf-jetstream`` without ``--upstream``) and the tests'
event supply. Each event has jetstream's v1 shape and key order (``did``, ``time_us``, ``kind``,
then the payload object), is encoded compactly as Go's ``encoding/json`` would (no spaces, UTF-8
text as is), and looks like real traffic in kind, size and identifiers:

* commits over the common collections, in roughly the proportions of the live network (likes
  first, then follows, posts, reposts, deletes, blocks, profile updates, a non-bsky lexicon);
  posts carry replies, languages, facets and image embeds with blob refs, so the average event is
  about 500 bytes (the figure the jetstream author reports, 482 B);
* DIDs are ``did:plc:`` + 24 base32 characters (a few ``did:web``), drawn from a fixed population
  with a skewed activity (a few accounts are very busy); revs and rkeys are TIDs (13 characters of
  base32-sortable, from the event time); CIDs are CIDv1 base32 (``bafyrei`` records, ``bafkrei``
  blobs);
* identity events (some without ``handle``, as in real traffic) and account events (inactive ones
  with a ``status``), each with a firehose ``seq`` and an RFC 3339 ``time``.

``time_us`` is given by the caller (the ingest's origin clock); the same seed and the same
``time_us`` sequence give the same bytes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

__all__ = ["COLLECTIONS", "EventGenerator"]

TID_ALPHABET: Final = "234567abcdefghijklmnopqrstuvwxyz"
"""base32-sortable: TIDs sort as strings in time order."""
B32_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz234567"
"""RFC 4648 base32, lower case (multibase ``b``) for DIDs and CIDs."""

POST: Final = "app.bsky.feed.post"
LIKE: Final = "app.bsky.feed.like"
REPOST: Final = "app.bsky.feed.repost"
FOLLOW: Final = "app.bsky.graph.follow"
BLOCK: Final = "app.bsky.graph.block"
PROFILE: Final = "app.bsky.actor.profile"
CHAT_DECLARATION: Final = "chat.bsky.actor.declaration"
COLLECTIONS: Final = (POST, LIKE, REPOST, FOLLOW, BLOCK, PROFILE, CHAT_DECLARATION)

ACCOUNT_STATUSES: Final = ("deactivated", "deleted", "takendown", "suspended", "desynchronized", "throttled")

_WORDS: Final = (
    "the a to and of is in it you that this for on my just so be with not have are was at me like what but "
    "all can get out today when now one time good new people love day think know see really going post "
    "bluesky here art thread great night work thanks first year still much back feel want way make "
    "photo music game read book weather coffee morning news open source python rust release update"
).split()
_NON_ASCII_TEXTS: Final = (
    "おはようございます",
    "今日はいい天気ですね",
    "bom dia a todos",
    "ótimo fim de semana",
    "große Freude 🎉",
    "café ☕ time",
    "새해 복 많이 받으세요",
)
_LANGS: Final = (("en",), ("en",), ("en",), ("en",), ("ja",), ("pt",), ("de",), ("es",), ("ko",))


def _b32(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(B32_ALPHABET, k=n))


def tid(time_us: int, clock_id: int) -> str:
    """A TID: 53 bits of microseconds and 10 bits of clock id, as 13 base32-sortable characters."""
    value = ((time_us & ((1 << 53) - 1)) << 10) | (clock_id & 0x3FF)
    chars = []
    for _ in range(13):
        chars.append(TID_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def iso_time(time_us: int) -> str:
    """RFC 3339 with milliseconds and ``Z``, as atproto records and firehose events write it."""
    dt = datetime.fromtimestamp(time_us / 1_000_000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{(time_us // 1000) % 1000:03d}Z"


class EventGenerator:
    """Seeded source of jetstream v1 events: ``make_event(time_us) -> bytes``.

    ``accounts``: size of the DID population (activity is skewed towards its first members).
    """

    def __init__(self, seed: int = 0, *, accounts: int = 20_000, first_seq: int = 4_000_000_000) -> None:
        if accounts < 2:
            raise ValueError(f"accounts={accounts} must be at least 2")
        self._rng = random.Random(seed)
        rng = self._rng
        self._dids = [
            f"did:web:{_b32(rng, 8)}.example.com" if rng.random() < 0.002 else f"did:plc:{_b32(rng, 24)}"
            for _ in range(accounts)
        ]
        self._seq = first_seq
        self._clock_id = rng.randrange(1024)
        # Records this generator created (uri, cid) per collection: deletes and likes refer to them.
        self._recent_posts: list[tuple[str, str]] = []
        self._recent: dict[str, list[tuple[str, str]]] = {c: [] for c in (LIKE, REPOST, FOLLOW, POST)}
        makers: list[tuple[float, Callable[[int], dict[str, Any]]]] = [
            (0.40, self._like),
            (0.12, self._follow),
            (0.11, self._post),
            (0.09, self._repost),
            (0.14, self._delete),
            (0.02, self._block),
            (0.03, self._profile_update),
            (0.005, self._chat_declaration),
            (0.004, self._post_update),
            (0.018, self._identity),
            (0.013, self._account),
        ]
        total = sum(w for w, _ in makers)
        self._makers = [m for _, m in makers]
        cum = 0.0
        self._cum_weights = []
        for w, _ in makers:
            cum += w / total
            self._cum_weights.append(cum)

    # -- identifiers -------------------------------------------------------------------------

    def _did(self) -> str:
        # Skewed activity: index ~ N * u**3 puts most events on the first few percent of accounts.
        return self._dids[int(len(self._dids) * self._rng.random() ** 3)]

    def _any_did(self) -> str:
        return self._dids[self._rng.randrange(len(self._dids))]

    def _cid(self) -> str:
        return "bafyrei" + _b32(self._rng, 52)

    def _blob(self, mime: str, low: int, high: int) -> dict[str, Any]:
        return {
            "$type": "blob",
            "ref": {"$link": "bafkrei" + _b32(self._rng, 52)},
            "mimeType": mime,
            "size": self._rng.randrange(low, high),
        }

    def _next_seq(self) -> int:
        self._seq += self._rng.randrange(1, 40)
        return self._seq

    def _some_post(self) -> tuple[str, str]:
        rng = self._rng
        if self._recent_posts and rng.random() < 0.5:
            return self._recent_posts[rng.randrange(len(self._recent_posts))]
        # A post from before the generator started: a TID some hours back.
        rkey = tid(1_700_000_000_000_000 + rng.randrange(10**14), rng.randrange(1024))
        return f"at://{self._any_did()}/{POST}/{rkey}", self._cid()

    def _remember(self, collection: str, did: str, rkey: str) -> None:
        bucket = self._recent[collection]
        bucket.append((did, rkey))
        if len(bucket) > 2000:
            del bucket[:1000]

    def _text(self) -> str:
        rng = self._rng
        if rng.random() < 0.1:
            return rng.choice(_NON_ASCII_TEXTS)
        n = int(rng.expovariate(1 / 36)) + 1
        return " ".join(rng.choices(_WORDS, k=min(n, 70)))

    # -- commits -----------------------------------------------------------------------------

    def _commit(
        self, did: str, time_us: int, operation: str, collection: str, rkey: str, record: dict[str, Any] | None
    ) -> dict[str, Any]:
        commit: dict[str, Any] = {
            "rev": tid(time_us, self._clock_id),
            "operation": operation,
            "collection": collection,
            "rkey": rkey,
        }
        if record is not None:
            commit["record"] = record
            commit["cid"] = self._cid()
        return {"did": did, "time_us": time_us, "kind": "commit", "commit": commit}

    def _created(self, time_us: int) -> str:
        return iso_time(time_us - self._rng.randrange(50_000, 900_000))

    def _like(self, time_us: int) -> dict[str, Any]:
        return self._subject_record(time_us, LIKE)

    def _repost(self, time_us: int) -> dict[str, Any]:
        return self._subject_record(time_us, REPOST)

    def _subject_record(self, time_us: int, collection: str) -> dict[str, Any]:
        did, rkey = self._did(), tid(time_us, self._clock_id)
        uri, cid = self._some_post()
        record = {"$type": collection, "createdAt": self._created(time_us), "subject": {"cid": cid, "uri": uri}}
        self._remember(collection, did, rkey)
        return self._commit(did, time_us, "create", collection, rkey, record)

    def _follow(self, time_us: int) -> dict[str, Any]:
        did, rkey = self._did(), tid(time_us, self._clock_id)
        self._remember(FOLLOW, did, rkey)
        record = {"$type": FOLLOW, "createdAt": self._created(time_us), "subject": self._any_did()}
        return self._commit(did, time_us, "create", FOLLOW, rkey, record)

    def _block(self, time_us: int) -> dict[str, Any]:
        did, rkey = self._did(), tid(time_us, self._clock_id)
        record = {"$type": BLOCK, "createdAt": self._created(time_us), "subject": self._any_did()}
        return self._commit(did, time_us, "create", BLOCK, rkey, record)

    def _post_record(self, time_us: int, did: str) -> dict[str, Any]:
        rng = self._rng
        text = self._text()
        record: dict[str, Any] = {"$type": POST, "createdAt": self._created(time_us)}
        roll = rng.random()
        if roll < 0.25:
            images = [
                {
                    "alt": self._text() if rng.random() < 0.3 else "",
                    "aspectRatio": {"height": rng.randrange(400, 2000), "width": rng.randrange(400, 2000)},
                    "image": self._blob("image/jpeg", 40_000, 1_000_000),
                }
                for _ in range(rng.choice((1, 1, 1, 2, 4)))
            ]
            record["embed"] = {"$type": "app.bsky.embed.images", "images": images}
        elif roll < 0.32:
            uri, cid = self._some_post()
            record["embed"] = {"$type": "app.bsky.embed.record", "record": {"cid": cid, "uri": uri}}
        if rng.random() < 0.15 and text.isascii():
            tag = rng.choice(_WORDS)
            text = f"{text} #{tag}"
            start = len(text.encode()) - len(tag) - 1
            record["facets"] = [
                {
                    "features": [{"$type": "app.bsky.richtext.facet#tag", "tag": tag}],
                    "index": {"byteEnd": start + len(tag) + 1, "byteStart": start},
                }
            ]
        record["langs"] = list(rng.choice(_LANGS))
        if rng.random() < 0.5:
            parent = self._some_post()
            root = parent if rng.random() < 0.5 else self._some_post()
            record["reply"] = {"parent": {"cid": parent[1], "uri": parent[0]}, "root": {"cid": root[1], "uri": root[0]}}
        record["text"] = text
        return record

    def _post(self, time_us: int) -> dict[str, Any]:
        did, rkey = self._did(), tid(time_us, self._clock_id)
        event = self._commit(did, time_us, "create", POST, rkey, self._post_record(time_us, did))
        self._recent_posts.append((f"at://{did}/{POST}/{rkey}", event["commit"]["cid"]))
        if len(self._recent_posts) > 2000:
            del self._recent_posts[:1000]
        self._remember(POST, did, rkey)
        return event

    def _post_update(self, time_us: int) -> dict[str, Any]:
        bucket = self._recent[POST]
        if not bucket:
            return self._post(time_us)
        did, rkey = bucket[self._rng.randrange(len(bucket))]
        return self._commit(did, time_us, "update", POST, rkey, self._post_record(time_us, did))

    def _delete(self, time_us: int) -> dict[str, Any]:
        rng = self._rng
        collection = rng.choice((LIKE, LIKE, LIKE, FOLLOW, REPOST, POST))
        bucket = self._recent[collection]
        if bucket and rng.random() < 0.5:
            did, rkey = bucket.pop(rng.randrange(len(bucket)))
        else:
            did, rkey = self._did(), tid(time_us - rng.randrange(10**12), rng.randrange(1024))
        return self._commit(did, time_us, "delete", collection, rkey, None)

    def _profile_update(self, time_us: int) -> dict[str, Any]:
        rng = self._rng
        did = self._did()
        record: dict[str, Any] = {"$type": PROFILE}
        if rng.random() < 0.8:
            record["avatar"] = self._blob("image/jpeg", 20_000, 900_000)
        if rng.random() < 0.5:
            record["banner"] = self._blob("image/jpeg", 50_000, 1_000_000)
        record["createdAt"] = iso_time(time_us - rng.randrange(10**12))
        record["description"] = self._text()
        record["displayName"] = " ".join(rng.choices(_WORDS, k=rng.randrange(1, 4))).title()
        operation = "update" if rng.random() < 0.85 else "create"
        return self._commit(did, time_us, operation, PROFILE, "self", record)

    def _chat_declaration(self, time_us: int) -> dict[str, Any]:
        record = {"$type": CHAT_DECLARATION, "allowIncoming": self._rng.choice(("all", "following", "none"))}
        return self._commit(self._did(), time_us, "create", CHAT_DECLARATION, "self", record)

    # -- identity and account ----------------------------------------------------------------

    def _identity(self, time_us: int) -> dict[str, Any]:
        rng = self._rng
        did = self._any_did()
        body: dict[str, Any] = {"did": did}
        if rng.random() < 0.6:  # real traffic often omits the handle
            body["handle"] = f"{rng.choice(_WORDS)}{rng.randrange(10_000)}.bsky.social"
        body["seq"] = self._next_seq()
        body["time"] = iso_time(time_us - rng.randrange(100_000, 2_000_000))
        return {"did": did, "time_us": time_us, "kind": "identity", "identity": body}

    def _account(self, time_us: int) -> dict[str, Any]:
        rng = self._rng
        did = self._any_did()
        active = rng.random() < 0.7
        body: dict[str, Any] = {"active": active, "did": did, "seq": self._next_seq()}
        if not active:
            body["status"] = rng.choice(ACCOUNT_STATUSES)
        body["time"] = iso_time(time_us - rng.randrange(100_000, 2_000_000))
        return {"did": did, "time_us": time_us, "kind": "account", "account": body}

    # -- public ------------------------------------------------------------------------------

    def make_object(self, time_us: int) -> dict[str, Any]:
        """The next event as a dict (key order as on the wire)."""
        maker = self._rng.choices(self._makers, cum_weights=self._cum_weights)[0]
        return maker(time_us)

    def make_event(self, time_us: int) -> bytes:
        """The next event's JSON bytes, stamped ``time_us``."""
        return json.dumps(self.make_object(time_us), ensure_ascii=False, separators=(",", ":")).encode()
