"""Test kit for the relay server: a relay on 127.0.0.1 in a thread, events fed on its loop, real clients.

Every wait has a timeout. Events come from the seeded generator (``jetstream.generator``) with the
``time_us`` values a test chooses, so each test knows exactly which events a client must receive.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlencode

import pytest
from websockets.sync.client import ClientConnection, connect

from logbuf.jetstream import BUNDLED_ZSTD_DICTIONARY
from logbuf.jetstream.events import EventMeta, parse_event
from logbuf.jetstream.generator import EventGenerator
from logbuf.jetstream.server import RelayConfig, RelayServer

T = TypeVar("T")

DICTIONARY_PATH = os.environ.get("LOGBUF_JETSTREAM_ZSTD_DICT", BUNDLED_ZSTD_DICTIONARY)
BASE_US = 1_725_911_162_000_000
WAIT_S = 10.0


def need_dictionary() -> str:
    if not os.path.isfile(DICTIONARY_PATH):
        pytest.fail(f"jetstream's zstd dictionary not found at {DICTIONARY_PATH} (LOGBUF_JETSTREAM_ZSTD_DICT)")
    return DICTIONARY_PATH


def make_events(count: int, *, start_us: int = BASE_US, step_us: int = 1000, seed: int = 7) -> list[bytes]:
    gen = EventGenerator(seed)
    return [gen.make_event(start_us + i * step_us) for i in range(count)]


def time_us_of(raw: bytes | str) -> int:
    return int(json.loads(raw)["time_us"])


class RelayHandle:
    def __init__(self, server: RelayServer) -> None:
        self.server = server
        self.host, self.port = server.address

    def url(self, query: dict[str, Any] | Sequence[tuple[str, Any]] | str = "", path: str = "/subscribe") -> str:
        qs = query if isinstance(query, str) else urlencode(query, doseq=True)
        return f"ws://{self.host}:{self.port}{path}" + (f"?{qs}" if qs else "")

    def request(
        self, path: str, *, method: str = "GET", headers: dict[str, str] | None = None, metrics: bool = False
    ) -> tuple[int, dict[str, str], bytes]:
        """One plain HTTP request to the public port (``metrics``: the metrics port): status, headers, body."""
        if metrics:
            address = self.server.metrics_address
            assert address is not None, "the relay has no metrics listener"
            host, port = address
        else:
            host, port = self.host, self.port
        conn = http.client.HTTPConnection(host, port, timeout=WAIT_S)
        try:
            conn.request(method, path, headers=headers or {})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def on_loop(self, fn: Callable[[], T], timeout_s: float = WAIT_S) -> T:
        """Run ``fn`` on the relay's loop thread and return its result."""
        done = threading.Event()
        box: list[Any] = []

        def call() -> None:
            try:
                box.append(("ok", fn()))
            except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
                box.append(("err", exc))
            done.set()

        self.server.call_soon_threadsafe(call)
        assert done.wait(timeout_s), "relay loop did not run the call in time"
        kind, value = box[0]
        if kind == "err":
            raise value
        return value  # type: ignore[no-any-return]

    def append(self, events: Sequence[bytes]) -> None:
        metas: list[EventMeta] = [parse_event(raw) for raw in events]

        def feed() -> None:
            for raw, meta in zip(events, metas):
                self.server.append(raw, meta)

        self.on_loop(feed)

    def connect(self, query: dict[str, Any] | Sequence[tuple[str, Any]] | str = "", **kwargs: Any) -> ClientConnection:
        kwargs.setdefault("open_timeout", WAIT_S)
        kwargs.setdefault("close_timeout", 2)
        kwargs.setdefault("max_size", None)
        ws: ClientConnection = connect(self.url(query), **kwargs)
        return ws


@contextmanager
def running_relay(data_dir: str, **overrides: Any) -> Iterator[RelayHandle]:
    """A relay on 127.0.0.1 (any free port; its metrics listener too, unless ``metrics_port`` is given)."""
    overrides.setdefault("metrics_port", 0)
    config = RelayConfig(data_dir=data_dir, host="127.0.0.1", port=0, **overrides)
    server = RelayServer(config)
    thread = server.start()
    try:
        yield RelayHandle(server)
    finally:
        server.stop()
        thread.join(WAIT_S)
        assert not thread.is_alive(), "relay loop did not stop"


def recv_events(ws: ClientConnection, count: int, timeout_s: float = WAIT_S) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        message = ws.recv(timeout=max(0.01, deadline - time.monotonic()))
        assert isinstance(message, str), f"expected a text frame, got {type(message).__name__}"
        out.append(json.loads(message))
    return out


def recv_raw(ws: ClientConnection, count: int, timeout_s: float = WAIT_S) -> list[str | bytes]:
    deadline = time.monotonic() + timeout_s
    return [ws.recv(timeout=max(0.01, deadline - time.monotonic())) for _ in range(count)]


def assert_silent(ws: ClientConnection, for_s: float = 0.3) -> None:
    """Nothing arrives within ``for_s``."""
    try:
        message = ws.recv(timeout=for_s)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected message: {str(message)[:120]}")


DID_A = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
DID_B = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"


def shaped_event(
    time_us: int, did: str = DID_A, kind: str = "commit", collection: str = "app.bsky.feed.post", pad: int = 0
) -> bytes:
    """A v1 event of a chosen kind, DID and collection (key order as jetstream writes it)."""
    if kind == "identity":
        body: dict[str, Any] = {
            "did": did,
            "handle": "someone.example.com",
            "seq": 1409752997,
            "time": "2024-09-05T06:11:04.870Z",
        }
    elif kind == "account":
        body = {
            "active": False,
            "did": did,
            "seq": 1409753013,
            "status": "deactivated",
            "time": "2024-09-05T06:11:04.870Z",
        }
    else:
        body = {
            "rev": "3l3qo2vutsw2e",
            "operation": "create",
            "collection": collection,
            "rkey": "3l3dn7tku762u",
            "record": {"$type": collection, "createdAt": "2024-09-09T19:46:02.102Z", "text": "x" * pad},
            "cid": "bafyreidwaivazkwu67xztlmuobx35hs2lnfh3kolmgfmucldvhd3sgzcqi",
        }
    return json.dumps({"did": did, "time_us": time_us, "kind": kind, kind: body}, separators=(",", ":")).encode()
