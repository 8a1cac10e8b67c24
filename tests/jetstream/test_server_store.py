"""jetstream.store: frames stored as sent, the cursor index, filter runs, retention by hole punching."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import zstandard
from websockets.frames import Frame, Opcode

from logbuf.jetstream.store import FRAMES_FILE, PLAIN, PUNCH_ALIGN, ZSTD, FrameStore, ws_frame_header
from tests.jetstream._relay_support import BASE_US, make_events, need_dictionary

DID_A = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
DID_B = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"


def event(time_us: int, did: str = DID_A, collection: str | None = "app.bsky.feed.post", pad: int = 0) -> bytes:
    if collection is None:
        obj = {
            "did": did,
            "time_us": time_us,
            "kind": "identity",
            "identity": {"did": did, "seq": 1, "time": "2024-09-05T06:11:04.870Z"},
        }
    else:
        obj = {
            "did": did,
            "time_us": time_us,
            "kind": "commit",
            "commit": {
                "rev": "3l3qo2vutsw2e",
                "operation": "delete",
                "collection": collection,
                "rkey": "x" * (1 + pad),
            },
        }
    return json.dumps(obj, separators=(",", ":")).encode()


def append(store: FrameStore, raw: bytes) -> bool:
    obj = json.loads(raw)
    collection = obj.get("commit", {}).get("collection")
    return store.append(raw, obj["time_us"], obj["did"], collection)


@pytest.mark.parametrize("length", [0, 1, 125, 126, 65535, 65536, 70000])
def test_frame_header_matches_websockets_serialisation(length: int) -> None:
    payload = b"x" * length
    expected = Frame(Opcode.TEXT, payload).serialize(mask=False)
    assert ws_frame_header(0x1, length) + payload == expected


def test_file_holds_each_event_once_as_a_ready_frame(tmp_path: Path) -> None:
    store = FrameStore(str(tmp_path))
    events = make_events(50)
    for raw in events:
        assert append(store, raw)
    data = (tmp_path / FRAMES_FILE).read_bytes()
    assert data == b"".join(Frame(Opcode.TEXT, raw).serialize(mask=False) for raw in events)
    for seq in range(50):
        off = store.offset_of(PLAIN, seq)
        assert data[off + 2 + (2 if len(events[seq]) >= 126 else 0) :].startswith(events[seq])
    store.close()


def test_non_increasing_time_us_is_refused(tmp_path: Path) -> None:
    store = FrameStore(str(tmp_path))
    assert append(store, event(BASE_US + 10))
    assert not append(store, event(BASE_US + 10))
    assert not append(store, event(BASE_US + 5))
    assert store.next_seq == 1
    store.close()


def test_cursor_lookup_is_inclusive_and_clamps(tmp_path: Path) -> None:
    store = FrameStore(str(tmp_path))
    for i in range(10):
        append(store, event(BASE_US + 100 * i))
    assert store.seq_for_cursor(None) == 10  # live
    assert store.seq_for_cursor(BASE_US + 300) == 3  # inclusive
    assert store.seq_for_cursor(BASE_US + 301) == 4
    assert store.seq_for_cursor(0) == 0 and store.seq_for_cursor(-5) == 0
    assert store.seq_for_cursor(BASE_US + 10**9) == 10  # future: live
    store.close()


def test_index_survives_growth_and_compaction(tmp_path: Path) -> None:
    store = FrameStore(str(tmp_path), initial_capacity=16)
    for i in range(1000):
        append(store, event(BASE_US + i))
        if i % 100 == 99:
            store.retire(max_age_us=50, max_bytes=None)
    assert store.first_seq == 1000 - 51
    assert store.seq_for_cursor(BASE_US + 960) == 960
    assert store.offset_of(PLAIN, 960) < store.offset_of(PLAIN, 961)
    assert store.oldest_time_us() == BASE_US + 949
    store.close()


def test_matching_runs_groups_consecutive_wanted_frames(tmp_path: Path) -> None:
    store = FrameStore(str(tmp_path))
    spec = [
        (DID_A, "app.bsky.feed.post"),
        (DID_A, "app.bsky.feed.post"),
        (DID_B, "app.bsky.feed.post"),
        (DID_A, "app.bsky.feed.like"),
        (DID_A, None),
        (DID_A, "app.bsky.feed.post"),
    ]
    for i, (did, col) in enumerate(spec):
        append(store, event(BASE_US + i, did, col))
    allowed = np.array([True] + [name == "app.bsky.feed.post" for name in store.collection_names[1:]])
    dids = np.array([hash(DID_A)], np.int64)
    runs, scanned = store.matching_runs(PLAIN, 0, 100, allowed, dids, 0)
    assert scanned == 6
    off = [store.offset_of(PLAIN, s) for s in range(7)]
    # 0-1 post by A; 2 is B; 3 is a like; 4 (identity) passes the collection filter; 5 post by A (to the end)
    assert runs == [(off[0], off[2], 2), (off[4], off[6], 2)]
    runs, _ = store.matching_runs(PLAIN, 0, 3, allowed, None, 0)  # limit: scan 3 events only
    assert runs == [(off[0], off[3], 3)]


def test_matching_runs_size_limit_uses_the_payload_length_of_each_file(tmp_path: Path) -> None:
    """As jetstream's legacy server, maxMessageSizeBytes is compared with the bytes sent: the JSON for
    plain clients, the zstd frame for compressed ones."""
    store = FrameStore(str(tmp_path), zstd_dictionary=Path(need_dictionary()).read_bytes())
    small, big = event(BASE_US), event(BASE_US + 1, pad=500)
    append(store, small)
    append(store, big)
    allowed = np.ones(len(store.collection_names), np.bool_)
    runs, _ = store.matching_runs(PLAIN, 0, 10, allowed, None, len(small))
    assert runs == [(0, store.offset_of(PLAIN, 1), 1)]
    packed = [int(store.payload_length[ZSTD][seq]) for seq in range(2)]
    assert packed[1] < len(small) < len(big)  # 500 repeated bytes compress well
    runs, _ = store.matching_runs(ZSTD, 0, 10, allowed, None, len(small))
    assert runs == [(0, store.offset_of(ZSTD, 2), 2)]  # both fit once compressed
    runs, _ = store.matching_runs(ZSTD, 0, 10, allowed, None, min(packed) - 1)
    assert runs == []


def test_retention_punches_whole_blocks_before_the_first_kept_frame(tmp_path: Path) -> None:
    store = FrameStore(str(tmp_path))
    events = make_events(4000, step_us=1000)
    for raw in events:
        append(store, raw)
    path = tmp_path / FRAMES_FILE
    size = path.stat().st_size
    before_blocks = store.disk_bytes(PLAIN)
    retired = store.retire(max_age_us=None, max_bytes=size // 4)
    assert retired > 0 and store.first_seq == retired
    floor = store.floor(PLAIN)
    assert store.punch_supported, "this filesystem should punch holes"
    assert path.stat().st_size == size  # KEEP_SIZE: apparent size unchanged
    assert store.disk_bytes(PLAIN) < before_blocks / 2  # space returned
    data = path.read_bytes()
    punched = (floor // PUNCH_ALIGN) * PUNCH_ALIGN
    assert data[:punched] == bytes(punched)  # freed blocks read as zeros ...
    assert data[floor:] == b"".join(Frame(Opcode.TEXT, raw).serialize(mask=False) for raw in events[retired:])
    assert data[punched:floor] != bytes(floor - punched) or floor == punched  # ... nothing kept was zeroed
    # by age: keep events at most 500 ms older than the newest
    store.retire(max_age_us=500_000, max_bytes=None)
    assert store.oldest_time_us() == BASE_US + (4000 - 1) * 1000 - 500_000
    store.close()


def test_compressed_file_holds_standalone_zstd_frames_with_the_dictionary(tmp_path: Path) -> None:
    dict_data = Path(need_dictionary()).read_bytes()
    store = FrameStore(str(tmp_path), zstd_dictionary=dict_data)
    events = make_events(20)
    for raw in events:
        append(store, raw)
    data = (tmp_path / "frames-zstd.ws").read_bytes()
    dctx = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(dict_data))
    for seq, raw in enumerate(events):
        start, end = store.offset_of(ZSTD, seq), store.offset_of(ZSTD, seq + 1)
        frame = data[start:end]
        assert frame[0] == 0x82  # FIN | binary
        header = 2 if frame[1] < 126 else 4
        payload = frame[header:]
        params = zstandard.get_frame_parameters(payload)
        assert params.dict_id == 1612007021 and params.has_checksum  # as the legacy server's encoder writes
        assert params.content_size == len(raw)
        assert dctx.decompress(payload) == raw
    assert os.path.getsize(tmp_path / "frames-zstd.ws") < os.path.getsize(tmp_path / FRAMES_FILE) * 0.7
    store.close()
