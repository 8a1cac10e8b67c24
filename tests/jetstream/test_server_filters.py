"""Relay system tests: each filter parameter over the wire, prefix matching, identity/account events
passing collection filters, the DID filter on every kind, size limits, and the documented limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from logbuf.jetstream.filters import MAX_WANTED_COLLECTIONS, MAX_WANTED_DIDS
from logbuf.testing import wait_until
from tests.jetstream._relay_support import (
    BASE_US,
    DID_A,
    DID_B,
    RelayHandle,
    assert_silent,
    recv_events,
    running_relay,
    shaped_event,
)

# (name, did, kind, collection, pad)
MIX = [
    ("post_a", DID_A, "commit", "app.bsky.feed.post", 0),
    ("like_a", DID_A, "commit", "app.bsky.feed.like", 0),
    ("follow_b", DID_B, "commit", "app.bsky.graph.follow", 0),
    ("graphx_b", DID_B, "commit", "app.bsky.graphx.thing", 0),
    ("identity_a", DID_A, "identity", "", 0),
    ("account_b", DID_B, "account", "", 0),
    ("big_post_b", DID_B, "commit", "app.bsky.feed.post", 3000),
    ("chat_a", DID_A, "commit", "chat.bsky.actor.declaration", 0),
]


def feed_mix(relay: RelayHandle) -> None:
    relay.append([shaped_event(BASE_US + i, did, kind, col, pad) for i, (_, did, kind, col, pad) in enumerate(MIX)])


def names_received(relay: RelayHandle, query: Any, expected: int) -> list[str]:
    with relay.connect(query) as ws:
        got = recv_events(ws, expected)
        assert_silent(ws, 0.15)
    return [MIX[e["time_us"] - BASE_US][0] for e in got]


@pytest.mark.parametrize(
    "query, expected",
    [
        ({"wantedCollections": "app.bsky.feed.post"}, ["post_a", "identity_a", "account_b", "big_post_b"]),
        ({"wantedCollections": "app.bsky.graph.*"}, ["follow_b", "identity_a", "account_b"]),
        ({"wantedCollections": ["app.bsky.feed.like", "chat.bsky.*"]}, ["like_a", "identity_a", "account_b", "chat_a"]),
        (
            {"wantedCollections": "app.bsky.*"},
            ["post_a", "like_a", "follow_b", "graphx_b", "identity_a", "account_b", "big_post_b"],
        ),
        ({"wantedCollections": ".*"}, ["identity_a", "account_b"]),
        ({"wantedDids": DID_A}, ["post_a", "like_a", "identity_a", "chat_a"]),
        ({"wantedDids": DID_B}, ["follow_b", "graphx_b", "account_b", "big_post_b"]),
        ({"wantedDids": DID_B, "wantedCollections": "app.bsky.feed.post"}, ["account_b", "big_post_b"]),
        ({"maxMessageSizeBytes": 1000}, [n for n, *_ in MIX if n != "big_post_b"]),
        ({"maxMessageSizeBytes": "junk"}, [n for n, *_ in MIX]),
        ({}, [n for n, *_ in MIX]),
    ],
)
def test_query_filters(tmp_path: Path, query: dict[str, Any], expected: list[str]) -> None:
    with running_relay(str(tmp_path)) as relay:
        feed_mix(relay)
        assert names_received(relay, {"cursor": 0, **query}, len(expected)) == expected


def test_query_values_arrive_percent_encoded(tmp_path: Path) -> None:
    """Clients send did%3Aplc%3A... and app.bsky.graph.%2A (skyware, atproto-jetstream)."""
    with running_relay(str(tmp_path)) as relay:
        feed_mix(relay)
        encoded = f"cursor=0&wantedDids={DID_B.replace(':', '%3A')}&wantedCollections=app.bsky.graph.%2A"
        assert names_received(relay, encoded, 2) == ["follow_b", "account_b"]


def test_filters_apply_to_live_events_too(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        with relay.connect({"wantedCollections": "app.bsky.graph.*"}) as ws:
            feed_mix(relay)
            got = [MIX[e["time_us"] - BASE_US][0] for e in recv_events(ws, 3)]
            assert got == ["follow_b", "identity_a", "account_b"]
            assert_silent(ws, 0.15)


def test_options_update_replaces_the_filter_and_missing_fields_clear_it(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        with relay.connect({"wantedDids": DID_A, "wantedCollections": "app.bsky.feed.post"}) as ws:
            ws.send(json.dumps({"type": "options_update", "payload": {"wantedCollections": ["app.bsky.graph.*"]}}))
            ws.send(json.dumps({"type": "something_else", "payload": {}}))  # ignored
            ws.send(b"\x00binary is ignored")
            wait_until(
                lambda: (
                    relay.server.counters.options_updates == 1 and relay.server.counters.client_messages_ignored == 2
                ),
                what="messages handled",
            )
            feed_mix(relay)  # DID filter cleared: graph.* from anyone
            got = [MIX[e["time_us"] - BASE_US][0] for e in recv_events(ws, 3)]
            assert got == ["follow_b", "identity_a", "account_b"]


def test_maximum_collections_and_dids_are_accepted_one_more_is_refused(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        cols = [f"com.example.c{i}" for i in range(MAX_WANTED_COLLECTIONS - 1)] + ["app.bsky.graph.*"]
        with relay.connect([("cursor", 0)] + [("wantedCollections", c) for c in cols]) as ws:
            feed_mix(relay)
            assert len(recv_events(ws, 3)) == 3
        dids = [f"did:plc:{i:024d}" for i in range(MAX_WANTED_DIDS - 1)] + [DID_B]
        with relay.connect({"requireHello": "true", "cursor": 0}) as ws:
            ws.send(json.dumps({"type": "options_update", "payload": {"wantedDids": dids}}))
            got = [MIX[e["time_us"] - BASE_US][0] for e in recv_events(ws, 4)]
            assert got == ["follow_b", "graphx_b", "account_b", "big_post_b"]
        with relay.connect({"cursor": 0}) as ws:
            ws.send(
                json.dumps(
                    {"type": "options_update", "payload": {"wantedDids": dids + ["did:plc:zzzzzzzzzzzzzzzzzzzzzzzz"]}}
                )
            )
            with pytest.raises(ConnectionClosed) as info:
                for _ in range(100):
                    ws.recv(timeout=5)
            assert info.value.rcvd is not None
            assert (info.value.rcvd.code, info.value.rcvd.reason) == (
                1008,
                "invalid subscriber options: too many wanted DIDs",
            )
