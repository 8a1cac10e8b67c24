"""Relay HTTP and protocol details matched with jetstream's legacy server:
HEAD, OPTIONS and CORS, the metrics listener, ``null`` client messages, zstd frames with a checksum,
maxMessageSizeBytes against the bytes sent."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import zstandard

from logbuf.jetstream import BUNDLED_ZSTD_DICTIONARY
from tests.jetstream._relay_support import (
    BASE_US,
    make_events,
    recv_events,
    recv_raw,
    running_relay,
    shaped_event,
)


def test_head_answers_like_get_without_a_body(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        status, headers, body = relay.request("/", method="HEAD")
        assert (status, body) == (200, b"")
        assert headers["Content-Length"] == str(len("Welcome to Jetstream"))  # the GET's length
        status, _, body = relay.request("/nope", method="HEAD")
        assert (status, body) == (404, b"")
        status, _, body = relay.request("/subscribe", method="HEAD")  # only GET upgrades
        assert (status, body) == (405, b"")
        status, headers, body = relay.request("/metrics", method="HEAD", metrics=True)
        assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


def test_cors_allows_any_origin_for_get_head_and_options(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        status, headers, body = relay.request(
            "/subscribe",
            method="OPTIONS",
            headers={
                "Origin": "https://example.com",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "x-custom",
            },
        )
        assert (status, body) == (204, b"")
        assert headers["Access-Control-Allow-Origin"] == "*"
        assert headers["Access-Control-Allow-Methods"] == "GET, HEAD, OPTIONS"
        assert headers["Access-Control-Allow-Headers"] == "x-custom"
        status, headers, body = relay.request("/", headers={"Origin": "https://example.com"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "*" and body == b"Welcome to Jetstream"
        status, headers, _ = relay.request("/")  # no Origin: no CORS headers
        assert "Access-Control-Allow-Origin" not in headers
        status, headers, _ = relay.request("/", method="OPTIONS")
        assert status == 204 and "Access-Control-Allow-Origin" not in headers


def test_other_methods_get_405(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        for method in ("POST", "PUT", "DELETE"):
            status, headers, _ = relay.request("/subscribe", method=method)
            assert status == 405 and headers["Allow"] == "GET, HEAD, OPTIONS"
        assert relay.server.counters.handshakes["method_not_allowed"] == 3


def test_metrics_listener_is_separate_and_can_be_off(tmp_path: Path) -> None:
    with running_relay(str(tmp_path / "a")) as relay:
        metrics = relay.server.metrics_address
        assert metrics is not None and metrics[1] != relay.port
        assert relay.request("/metrics")[0] == 404
        assert b"jetstream_events_emitted_total" in relay.request("/metrics", metrics=True)[2]
    with running_relay(str(tmp_path / "b"), metrics_port=None) as relay:
        assert relay.server.metrics_address is None


def test_a_null_text_message_is_ignored(tmp_path: Path) -> None:
    with running_relay(str(tmp_path)) as relay:
        relay.append(make_events(3))
        with relay.connect({"cursor": 0}) as ws:
            ws.send("null")
            ws.send('{"type": null}')
            assert [e["time_us"] for e in recv_events(ws, 3)] == [BASE_US, BASE_US + 1000, BASE_US + 2000]
            relay.append(make_events(1, start_us=BASE_US + 5000))
            assert recv_events(ws, 1)[0]["time_us"] == BASE_US + 5000  # still open
        assert relay.server.counters.client_messages_ignored == 2


def test_max_message_size_is_compared_with_the_bytes_sent(tmp_path: Path) -> None:
    """A padded event whose JSON is over the limit but whose zstd frame is under it goes to compressed
    clients only, as the legacy server compares the length of what it sends."""
    small = shaped_event(BASE_US)
    padded = shaped_event(BASE_US + 1, pad=2000)  # 2000 repeated bytes: compresses to well under 1000
    limit = 1000
    assert len(small) < limit < len(padded)
    with running_relay(str(tmp_path)) as relay:
        relay.append([small, padded, shaped_event(BASE_US + 2)])
        packed = int(relay.server.store.payload_length[1][1])
        assert packed < limit
        query = {"cursor": 0, "maxMessageSizeBytes": limit}
        with relay.connect(query) as ws:
            plain = [json.loads(m)["time_us"] for m in recv_raw(ws, 2)]
        with relay.connect({**query, "compress": "true"}) as ws:
            frames = recv_raw(ws, 3)
    assert plain == [BASE_US, BASE_US + 2]
    with open(BUNDLED_ZSTD_DICTIONARY, "rb") as f:
        decompressor = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(f.read()))
    got = [json.loads(decompressor.decompress(frame))["time_us"] for frame in frames]  # type: ignore[arg-type]
    assert got == [BASE_US, BASE_US + 1, BASE_US + 2]


@pytest.mark.parametrize("metrics", [False, True])
def test_plain_http_requests_on_either_port_close_the_connection(tmp_path: Path, metrics: bool) -> None:
    with running_relay(str(tmp_path)) as relay:
        address = relay.server.metrics_address if metrics else relay.server.address
        assert address is not None
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert data.startswith(b"HTTP/1.1 200" if metrics else b"HTTP/1.1 404")
