"""The synthetic jetstream: realistic identifiers, mix and sizes; deterministic for a seed."""

from __future__ import annotations

import collections
import json
import re

import pytest

from logbuf.jetstream.generator import COLLECTIONS, EventGenerator, iso_time, tid

T0 = 1_725_911_162_329_308
DID_PLC = re.compile(r"^did:plc:[a-z2-7]{24}$")
DID_WEB = re.compile(r"^did:web:[a-z0-9.-]+$")
TID = re.compile(r"^[2-7a-j][2-7a-z]{12}$")
RECORD_CID = re.compile(r"^bafyrei[a-z2-7]{52}$")
BLOB_CID = re.compile(r"^bafkrei[a-z2-7]{52}$")
RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def sample(seed: int = 0, n: int = 5000) -> list[bytes]:
    gen = EventGenerator(seed)
    return [gen.make_event(T0 + i * 2000) for i in range(n)]


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    assert sample(4, 300) == sample(4, 300)
    assert sample(4, 300) != sample(5, 300)


def test_average_size_is_about_500_bytes_with_a_realistic_spread() -> None:
    sizes = [len(e) for e in sample(1, 20_000)]
    mean = sum(sizes) / len(sizes)
    assert 420 <= mean <= 560, mean  # the jetstream author reports 482 B
    assert min(sizes) >= 150 and max(sizes) > 1000  # facts: real events ~200 B to 1.2 KB


def test_mix_of_kinds_collections_and_operations() -> None:
    kinds: collections.Counter[str] = collections.Counter()
    cols: collections.Counter[str] = collections.Counter()
    ops: collections.Counter[str] = collections.Counter()
    events = [json.loads(e) for e in sample(2, 20_000)]
    for ev in events:
        kinds[ev["kind"]] += 1
        if ev["kind"] == "commit":
            cols[ev["commit"]["collection"]] += 1
            ops[ev["commit"]["operation"]] += 1
    assert set(cols) == set(COLLECTIONS)
    assert cols.most_common(1)[0][0] == "app.bsky.feed.like"  # likes dominate, as on the network
    assert ops["create"] > ops["delete"] > ops["update"] > 0
    assert 0 < kinds["identity"] < 0.05 * len(events) and 0 < kinds["account"] < 0.05 * len(events)


def test_identifiers_have_real_formats() -> None:
    for ev in map(json.loads, sample(3, 5000)):
        assert DID_PLC.match(ev["did"]) or DID_WEB.match(ev["did"]), ev["did"]
        if ev["kind"] == "commit":
            c = ev["commit"]
            assert TID.match(c["rev"])
            assert TID.match(c["rkey"]) or c["rkey"] == "self"
            if c["operation"] != "delete":
                assert RECORD_CID.match(c["cid"])
                record = c["record"]
                if "createdAt" in record:
                    assert RFC3339_MS.match(record["createdAt"])
                for blob in _blobs(record):
                    assert BLOB_CID.match(blob["ref"]["$link"]) and blob["mimeType"] == "image/jpeg"
                subject = record.get("subject")
                if isinstance(subject, dict):
                    assert subject["uri"].startswith("at://did:") and RECORD_CID.match(subject["cid"])
        else:
            body = ev[ev["kind"]]
            assert isinstance(body["seq"], int) and RFC3339_MS.match(body["time"])


def _blobs(value: object) -> list[dict]:  # type: ignore[type-arg]
    if isinstance(value, dict):
        if value.get("$type") == "blob":
            return [value]
        return [b for v in value.values() for b in _blobs(v)]
    if isinstance(value, list):
        return [b for v in value for b in _blobs(v)]
    return []


def test_some_identity_events_lack_a_handle_and_inactive_accounts_have_a_status() -> None:
    events = [json.loads(e) for e in sample(6, 20_000)]
    identities = [e["identity"] for e in events if e["kind"] == "identity"]
    assert any("handle" in i for i in identities) and any("handle" not in i for i in identities)
    accounts = [e["account"] for e in events if e["kind"] == "account"]
    assert any(a["active"] for a in accounts) and any(not a["active"] for a in accounts)
    assert all(("status" in a) != a["active"] for a in accounts)


def test_tids_sort_in_time_order_and_encode_the_time() -> None:
    assert tid(T0, 0) < tid(T0 + 1, 0) < tid(T0 + 10**9, 0)
    assert tid(1725911162329308, 0)[:8] == "3l3qo2vx"  # the facts file's rev of that instant: 3l3qo2vutsw2b
    assert iso_time(T0) == "2024-09-09T19:46:02.329Z"


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="accounts=1"):
        EventGenerator(accounts=1)
