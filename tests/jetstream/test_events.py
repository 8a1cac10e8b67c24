"""parse_event: the facts file's example events, every generated shape, and errors that name the problem."""

from __future__ import annotations

import json

import pytest

from logbuf.jetstream.events import EventMeta, parse_event
from logbuf.jetstream.generator import EventGenerator

DID = "did:plc:abcdefghijklmnopqrstuvwx"
# The examples of the facts file (§3), as one line each.
COMMIT_CREATE = (
    b'{"did":"did:plc:abcdefghijklmnopqrstuvwx","time_us":1725911162329308,"kind":"commit",'
    b'"commit":{"rev":"3l3qo2vutsw2b","operation":"create","collection":"app.bsky.feed.post","rkey":"3l3qo2vuowo2b",'
    b'"record":{"$type":"app.bsky.feed.post","createdAt":"2024-09-09T19:46:02.102Z","langs":["en"],"text":"hello",'
    b'"reply":{"root":{"cid":"bafyrei","uri":"at://did:plc:x/app.bsky.feed.post/3l3p"},'
    b'"parent":{"cid":"bafyrei","uri":"at://did:plc:x/app.bsky.feed.post/3l3p"}}},'
    b'"cid":"bafyreidwaivazkwu67xztlmuobx35hs2lnfh3kolmgfmucldvhd3sgzcqi"}}'
)
COMMIT_DELETE = (
    b'{"did":"did:plc:abcdefghijklmnopqrstuvwx","time_us":1725911162329400,"kind":"commit",'
    b'"commit":{"rev":"3l3qo2vutsw2e","operation":"delete","collection":"app.bsky.graph.follow","rkey":"3l3dn7tku762u"}}'
)
IDENTITY = (
    b'{"did":"did:plc:abcdefghijklmnopqrstuvwx","time_us":1725911162329500,"kind":"identity",'
    b'"identity":{"did":"did:plc:abcdefghijklmnopqrstuvwx","handle":"someone.example.com","seq":1409752997,'
    b'"time":"2024-09-05T06:11:04.870Z"}}'
)
IDENTITY_NO_HANDLE = (
    b'{"did":"did:plc:abcdefghijklmnopqrstuvwx","time_us":1725911162329501,"kind":"identity",'
    b'"identity":{"did":"did:plc:abcdefghijklmnopqrstuvwx","seq":1409752998,"time":"2024-09-05T06:11:04.870Z"}}'
)
ACCOUNT = (
    b'{"did":"did:plc:abcdefghijklmnopqrstuvwx","time_us":1725911162329600,"kind":"account",'
    b'"account":{"active":false,"did":"did:plc:abcdefghijklmnopqrstuvwx","seq":1409753013,"status":"deactivated",'
    b'"time":"2024-09-05T06:11:04.870Z"}}'
)


@pytest.mark.parametrize(
    "raw,meta",
    [
        (COMMIT_CREATE, EventMeta(1725911162329308, DID, "commit", "app.bsky.feed.post")),
        (COMMIT_DELETE, EventMeta(1725911162329400, DID, "commit", "app.bsky.graph.follow")),
        (IDENTITY, EventMeta(1725911162329500, DID, "identity", None)),
        (IDENTITY_NO_HANDLE, EventMeta(1725911162329501, DID, "identity", None)),
        (ACCOUNT, EventMeta(1725911162329600, DID, "account", None)),
    ],
)
def test_the_facts_file_examples_parse(raw: bytes, meta: EventMeta) -> None:
    assert parse_event(raw) == meta


def test_a_commit_without_collection_has_none_so_it_passes_collection_filters() -> None:
    raw = b'{"did":"did:plc:x","time_us":5,"kind":"commit","commit":{"rev":"r","operation":"create","collection":""}}'
    assert parse_event(raw).collection is None


TOP_KEYS = ["did", "time_us", "kind"]
COMMIT_KEYS = {
    "create": ["rev", "operation", "collection", "rkey", "record", "cid"],
    "delete": ["rev", "operation", "collection", "rkey"],
}
PAYLOAD_KEYS = {
    "identity": (["did", "handle", "seq", "time"], ["did", "seq", "time"]),  # handle optional
    "account": (["active", "did", "seq", "status", "time"], ["active", "did", "seq", "time"]),
}


def test_generated_events_parse_and_have_the_v1_shapes_and_key_order() -> None:
    seen_ops: set[str] = set()
    seen_kinds: set[str] = set()
    for seed in (0, 1, 2):
        gen = EventGenerator(seed)
        for i in range(3000):
            time_us = 1_725_911_162_329_308 + i * 700
            raw = gen.make_event(time_us)
            meta = parse_event(raw)
            obj = json.loads(raw)
            assert meta.time_us == time_us and meta.did == obj["did"]
            assert list(obj) == TOP_KEYS + [meta.kind]  # exactly one payload object, in order
            seen_kinds.add(meta.kind)
            body = obj[meta.kind]
            if meta.kind == "commit":
                op = body["operation"]
                seen_ops.add(op)
                assert list(body) == COMMIT_KEYS["delete" if op == "delete" else "create"]
                assert meta.collection == body["collection"]
                if op != "delete":
                    assert body["record"]["$type"] == body["collection"]
            else:
                assert list(body) in PAYLOAD_KEYS[meta.kind]
                assert body["did"] == obj["did"] and meta.collection is None
                if meta.kind == "account":
                    assert ("status" in body) == (body["active"] is False)
    assert seen_kinds == {"commit", "identity", "account"}
    assert seen_ops == {"create", "update", "delete"}


@pytest.mark.parametrize(
    "raw,problem",
    [
        (b"", "not valid JSON"),
        (COMMIT_DELETE[:-1], "not valid JSON"),  # one byte short
        (COMMIT_DELETE + b"}", "not valid JSON"),  # a trailing byte
        (COMMIT_DELETE + b'{"did":1}', "not valid JSON"),  # two events in one message
        (b"\xff\xfe", "not valid JSON"),
        (b"[1,2]", "not a JSON object but list"),
        (b'{"time_us":1,"kind":"account","account":{}}', "no 'did'"),
        (b'{"did":7,"time_us":1,"kind":"account","account":{}}', "'did' is not a string"),
        (b'{"did":"plc:x","time_us":1,"kind":"account","account":{}}', "'did' is not a DID"),
        (b'{"did":"did:plc:x","kind":"account","account":{}}', "no 'time_us'"),
        (b'{"did":"did:plc:x","time_us":"17","kind":"account","account":{}}', "'time_us' is not an integer"),
        (b'{"did":"did:plc:x","time_us":1.5,"kind":"account","account":{}}', "'time_us' is not an integer"),
        (b'{"did":"did:plc:x","time_us":true,"kind":"account","account":{}}', "'time_us' is not an integer"),
        (b'{"did":"did:plc:x","time_us":-3,"kind":"account","account":{}}', "'time_us' -3 is outside"),
        (b'{"did":"did:plc:x","time_us":9223372036854775808,"kind":"account","account":{}}', "is outside"),
        (b'{"did":"did:plc:x","time_us":1,"account":{}}', "no 'kind'"),
        (b'{"did":"did:plc:x","time_us":1,"kind":"heartbeat"}', "'kind' 'heartbeat' is not one of"),
        (b'{"did":"did:plc:x","time_us":1,"kind":"commit"}', "commit event has no 'commit' object"),
        (b'{"did":"did:plc:x","time_us":1,"kind":"identity","identity":[]}', "identity event has no 'identity' object"),
        (b'{"did":"did:plc:x","time_us":1,"kind":"commit","commit":{"collection":3}}', "'collection' is not a string"),
    ],
)
def test_parse_errors_name_the_problem(raw: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_event(raw)
