"""jetstream.filters: query and options_update parsing, validation texts, limits, close-reason cutting."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logbuf.jetstream.filters import (
    MAX_WANTED_COLLECTIONS,
    MAX_WANTED_DIDS,
    CollectionFilter,
    OptionsError,
    OptionsUpdateDecodeError,
    is_valid_did,
    is_valid_nsid,
    parse_options_update,
    parse_query,
    truncate_close_reason,
)

DID = "did:plc:abcdefghijklmnopqrstuvwx"


@pytest.mark.parametrize(
    "value, ok",
    [
        ("app.bsky.feed.post", True),
        ("chat.bsky.actor.declaration", True),
        ("com.example.fooBar", True),
        ("app.bsky", False),
        ("app.bsky.graph.fo*", False),
        ("app.bsky.feed.", False),
        ("", False),
        ("1app.bsky.feed.post", False),
        ("app.bsky.feed.1post", False),
        ("app.bsky.feed.po-st", False),
        ("app.bsky.feed.post,app.bsky.feed.like", False),
        ("a" * 64 + ".b.c", False),
    ],
)
def test_nsid_validation(value: str, ok: bool) -> None:
    assert is_valid_nsid(value) is ok


@pytest.mark.parametrize(
    "value, ok",
    [
        (DID, True),
        ("did:web:example.com", True),
        ("did:web:localhost%3A8080", True),
        ("did:plc:", False),
        ("did:PLC:abc", False),
        ("plc:abc", False),
        ("did:plc:abc:", False),
        (f"{DID},{DID}", False),
        ("did:plc:" + "a" * 3000, False),
    ],
)
def test_did_validation(value: str, ok: bool) -> None:
    assert is_valid_did(value) is ok


DID_LIST_CASES = [
    [DID, "did:plc:", DID],
    [DID, "did:web:a\ndid:web:b"],  # a newline inside a value cannot pass as two DIDs
    [DID, "did:plc:abc%"],
    [DID, "did:plc:" + "a" * 3000],
    ["did:web:example.com", "did:web:localhost%3A8080", DID],
    [DID + "\n"],
    [""],
]


@pytest.mark.parametrize("dids", DID_LIST_CASES)
def test_an_options_update_validates_a_did_list_as_each_did_alone(dids: list[str]) -> None:
    """The list is checked in one pass; the verdict and the error naming the first bad DID are those of
    is_valid_did applied to each in turn."""
    message = json.dumps({"type": "options_update", "payload": {"wantedDids": dids}})
    bad = [d for d in dids if not is_valid_did(d)]
    if bad:
        with pytest.raises(OptionsError) as info:
            parse_options_update(message)
        assert str(info.value) == f"invalid subscriber options: invalid DID: {bad[0]}"
    else:
        update = parse_options_update(message)
        assert update is not None and update.dids == frozenset(dids)


_DID_TEXT = st.text(alphabet="did:plcweb.-_%AZ09\n ", max_size=30)


@given(st.lists(st.one_of(_DID_TEXT, st.just(DID), _DID_TEXT.map(lambda t: "did:plc:" + t)), max_size=8))
def test_the_did_list_check_agrees_with_is_valid_did(dids: list[str]) -> None:
    message = json.dumps({"type": "options_update", "payload": {"wantedDids": dids}})
    try:
        parse_options_update(message)
    except OptionsError as exc:
        first_bad = next(d for d in dids if not is_valid_did(d))
        assert str(exc) == f"invalid subscriber options: invalid DID: {first_bad}"
    else:
        assert all(is_valid_did(d) for d in dids)


def test_query_defaults_mean_everything_live() -> None:
    options = parse_query({})
    assert options.wants_everything
    assert options.cursor is None and not options.compress and not options.require_hello


def test_query_collections_exact_and_prefix_keep_the_trailing_dot() -> None:
    options = parse_query({"wantedCollections": ["app.bsky.feed.post", "app.bsky.graph.*", "app.bsky.graph.*"]})
    f = options.collections
    assert f.exact == {"app.bsky.feed.post"} and f.prefixes == ("app.bsky.graph.",)
    assert f.matches("app.bsky.graph.follow") and f.matches("app.bsky.feed.post")
    assert not f.matches("app.bsky.graphx.y") and not f.matches("app.bsky.feed.like")


def test_prefix_head_is_not_validated_and_dot_star_matches_nothing() -> None:
    assert parse_query({"wantedCollections": ["app.bsky.*"]}).collections.matches("app.bsky.feed.post")
    f = parse_query({"wantedCollections": [".*"]}).collections
    assert not f.wants_all and not f.matches("app.bsky.feed.post")


@pytest.mark.parametrize(
    "query, text",
    [
        ({"cursor": ["abc"]}, "invalid cursor: abc"),
        ({"cursor": ["12.5"]}, "invalid cursor: 12.5"),
        ({"cursor": [str(1 << 63)]}, f"invalid cursor: {1 << 63}"),
        (
            {"wantedCollections": ["app.bsky.graph.fo*"]},
            "invalid subscriber options: invalid collection: app.bsky.graph.fo*",
        ),
        ({"wantedCollections": ["a.b.c,d.e.f"]}, "invalid subscriber options: invalid collection: a.b.c,d.e.f"),
        ({"wantedDids": ["did:bad"]}, "invalid subscriber options: invalid DID: did:bad"),
        (
            {"wantedCollections": [f"com.example.c{i}" for i in range(MAX_WANTED_COLLECTIONS + 1)]},
            "invalid subscriber options: too many wanted collections",
        ),
        (
            {"wantedDids": [f"did:plc:{i:024d}" for i in range(MAX_WANTED_DIDS + 1)]},
            "invalid subscriber options: too many wanted DIDs",
        ),
    ],
)
def test_query_errors_carry_jetstreams_400_text(query: dict[str, list[str]], text: str) -> None:
    with pytest.raises(OptionsError) as info:
        parse_query(query)
    assert str(info.value) == text


def test_limits_count_after_deduplication() -> None:
    cols = [f"com.example.c{i % MAX_WANTED_COLLECTIONS}" for i in range(3 * MAX_WANTED_COLLECTIONS)]
    assert len(parse_query({"wantedCollections": cols}).collections.exact) == MAX_WANTED_COLLECTIONS
    dids = [f"did:plc:{i % MAX_WANTED_DIDS:024d}" for i in range(MAX_WANTED_DIDS + 5)]
    assert len(parse_query({"wantedDids": dids}).dids) == MAX_WANTED_DIDS
    exact_and_prefixes = [f"com.example.c{i}" for i in range(50)] + [f"com.example{i}.*" for i in range(51)]
    with pytest.raises(OptionsError, match="too many wanted collections"):
        parse_query({"wantedCollections": exact_and_prefixes})


@pytest.mark.parametrize(
    "value, expected",
    [
        ("1000", 1000),
        ("0", 0),
        ("-5", 0),
        ("", 0),
        ("abc", 0),
        ("1e3", 0),
        (str(1 << 32), 0),
        (str((1 << 32) - 1), (1 << 32) - 1),
    ],
)
def test_bad_max_message_size_means_no_limit(value: str, expected: int) -> None:
    assert parse_query({"maxMessageSizeBytes": [value]}).max_message_size_bytes == expected


@pytest.mark.parametrize("value, on", [("true", True), ("True", False), ("1", False), ("yes", False), ("", False)])
def test_compress_and_require_hello_need_the_exact_string_true(value: str, on: bool) -> None:
    options = parse_query({"compress": [value], "requireHello": [value]})
    assert options.compress is on and options.require_hello is on


def test_socket_encoding_zstd_header_asks_for_compression() -> None:
    assert parse_query({}, [("Socket-Encoding", "zstd")]).compress
    assert not parse_query({}, [("Socket-Encoding", "gzip")]).compress


@pytest.mark.parametrize("raw, cursor", [("1725519626134432", 1725519626134432), ("+5", 5), ("-7", -7), ("0", 0)])
def test_cursor_is_a_go_parseint(raw: str, cursor: int) -> None:
    assert parse_query({"cursor": [raw]}).cursor == cursor
    assert parse_query({"cursor": [""]}).cursor is None


def _update(payload: Any) -> str:
    return json.dumps({"type": "options_update", "payload": payload})


def test_options_update_replaces_everything_and_missing_fields_clear() -> None:
    options = parse_options_update(
        _update({"wantedCollections": ["app.bsky.feed.post"], "wantedDids": [DID], "maxMessageSizeBytes": 1000})
    )
    assert options is not None
    assert options.collections.exact == {"app.bsky.feed.post"} and options.dids == {DID}
    assert options.max_message_size_bytes == 1000
    cleared = parse_options_update(_update({"wantedCollections": ["app.bsky.feed.post"]}))
    assert cleared is not None and not cleared.dids and cleared.max_message_size_bytes == 0
    empties: list[Any] = [{}, None, {"wantedDids": None, "wantedCollections": []}]
    for empty in empties:
        everything = parse_options_update(_update(empty))
        assert everything is not None and everything.wants_everything
    negative = parse_options_update(_update({"maxMessageSizeBytes": -3}))
    assert negative is not None and negative.max_message_size_bytes == 0


def test_other_message_types_are_ignored() -> None:
    assert parse_options_update(json.dumps({"type": "heartbeat", "payload": {}})) is None
    assert parse_options_update(json.dumps({"payload": {}})) is None


@pytest.mark.parametrize("message", ["null", " null ", '{"type": null}', '{"type": null, "payload": 5}', "{}"])
def test_null_and_a_null_type_are_ignored_as_go_decodes_them(message: str) -> None:
    """jetstream unmarshals into a Go struct: ``null`` and a null type leave the type empty (ignored)."""
    assert parse_options_update(message) is None


@pytest.mark.parametrize(
    "message, reason",
    [
        ("not json", "bad SubscriberSourcedMessage envelope"),
        ("[1, 2]", "bad SubscriberSourcedMessage envelope"),
        ('{"type": 5}', "bad SubscriberSourcedMessage envelope"),
        ("5", "bad SubscriberSourcedMessage envelope"),
        ('"options_update"', "bad SubscriberSourcedMessage envelope"),
        ('{"type": "options_update"}', "bad options_update payload"),
        ('{"type": "options_update", "payload": [1]}', "bad options_update payload"),
        ('{"type": "options_update", "payload": {"wantedDids": "did:plc:x"}}', "bad options_update payload"),
        ('{"type": "options_update", "payload": {"wantedCollections": [1]}}', "bad options_update payload"),
        ('{"type": "options_update", "payload": {"maxMessageSizeBytes": "10"}}', "bad options_update payload"),
        ('{"type": "options_update", "payload": {"maxMessageSizeBytes": 1.5}}', "bad options_update payload"),
    ],
)
def test_undecodable_messages(message: str, reason: str) -> None:
    with pytest.raises(OptionsUpdateDecodeError) as info:
        parse_options_update(message)
    assert str(info.value) == reason


def test_invalid_update_fails_validation_like_the_query() -> None:
    with pytest.raises(OptionsError, match="invalid collection: nope"):
        parse_options_update(_update({"wantedCollections": ["nope"]}))
    with pytest.raises(OptionsError, match="too many wanted DIDs"):
        parse_options_update(_update({"wantedDids": [f"did:plc:{i:024d}" for i in range(MAX_WANTED_DIDS + 1)]}))


def test_with_update_keeps_cursor_and_compression() -> None:
    base = parse_query({"cursor": ["5"], "compress": ["true"], "requireHello": ["true"]})
    update = parse_options_update(_update({"wantedDids": [DID]}))
    assert update is not None
    merged = base.with_update(update)
    assert merged.cursor == 5 and merged.compress and merged.require_hello and merged.dids == {DID}


def test_close_reason_fits_123_bytes_cut_on_a_character() -> None:
    assert truncate_close_reason("short") == "short"
    long = "é" * 100  # 200 bytes
    cut = truncate_close_reason(long)
    assert cut.endswith("...") and len(cut.encode()) <= 123
    assert cut[:-3] == "é" * 60
    exact = "x" * 123
    assert truncate_close_reason(exact) == exact


def test_empty_collection_filter_wants_all() -> None:
    assert CollectionFilter().wants_all and CollectionFilter().matches("anything.at.all")
