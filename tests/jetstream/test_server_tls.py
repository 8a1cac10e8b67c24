"""TLS on the relay's listeners: ``--tls-cert`` / ``--tls-key`` serve ``wss://``.

A self-signed certificate is made in each test with the ``openssl`` CLI; real ``websockets`` clients
connect over ``wss://`` and check the certificate against it. The clients are websockets' asyncio
ones: its threaded (sync) client reads and writes one ``ssl.SSLSocket`` from two threads, and about one
connection in a hundred then hangs in the client before its HTTP request leaves (seen here; a
single-threaded client made 600 of 600 handshakes against the same relay)."""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from logbuf.errors import ConfigurationError
from logbuf.jetstream.server import RelayConfig, RelayServer
from logbuf.jetstream.tls import TLS_CHUNK_LENGTH
from logbuf.testing import wait_until
from tests.jetstream._ingest_support import RelayProcess, unique_driver_dir
from tests.jetstream._relay_support import WAIT_S, RelayHandle, make_events, running_relay, time_us_of


def make_certificate(directory: Path) -> tuple[str, str]:
    """A self-signed P-256 certificate for 127.0.0.1 and localhost, valid for a day: (cert, key) paths."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return str(cert), str(key)


def client_context(cert: str) -> ssl.SSLContext:
    """A client context that trusts only the test certificate (and checks the host name)."""
    context = ssl.create_default_context(cafile=cert)
    return context


def wss_connect(relay: RelayHandle, cert: str, query: str = "") -> Any:
    url = f"wss://127.0.0.1:{relay.port}/subscribe" + (f"?{query}" if query else "")
    return connect(url, ssl=client_context(cert), open_timeout=WAIT_S, close_timeout=2, max_size=None, max_queue=None)


async def recv_all(ws: ClientConnection, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        message = await asyncio.wait_for(ws.recv(), WAIT_S)
        out.append(message.encode() if isinstance(message, str) else message)
    return out


async def append(relay: RelayHandle, events: list[bytes]) -> None:
    await asyncio.to_thread(relay.append, events)


def test_a_wss_client_gets_every_event_live_and_replayed(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    events = make_events(3000)  # ~1.5 MB: many TLS chunks, and a socket that fills up on replay
    assert sum(map(len, events)) > 10 * TLS_CHUNK_LENGTH

    async def clients(relay: RelayHandle) -> None:
        async with wss_connect(relay, cert) as live:
            assert live.transport.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
            await append(relay, events[:1000])
            assert await recv_all(live, 1000) == events[:1000]
            async with wss_connect(relay, cert, f"cursor={time_us_of(events[0])}") as replay:
                await append(relay, events[1000:])
                assert await recv_all(replay, 3000) == events  # byte for byte from the frame file, through TLS
            assert await recv_all(live, 2000) == events[1000:]

    with running_relay(str(tmp_path / "data"), tls_cert=cert, tls_key=key) as relay:
        assert relay.server.tls
        asyncio.run(clients(relay))
        assert relay.server.counters.handshakes["accepted"] == 2


def test_wss_compressed_filtered_and_closes_work_as_over_plain(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    events = make_events(200)
    wanted = json.loads(events[0])["commit"]["collection"]

    async def clients(relay: RelayHandle) -> int | None:
        async with wss_connect(relay, cert, f"cursor={time_us_of(events[0])}&compress=true") as zstd:
            frames = await recv_all(zstd, 200)
            assert all(isinstance(f, bytes) for f in frames)
        assert zstd.close_code == 1000  # our close was answered
        async with wss_connect(relay, cert, f"cursor={time_us_of(events[0])}&wantedCollections={wanted}") as filtered:
            first = json.loads((await recv_all(filtered, 1))[0])
            assert first["commit"]["collection"] == wanted
        async with wss_connect(relay, cert) as ws:  # the relay's shutdown goes out as 1001
            await asyncio.to_thread(relay.server.stop)
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), WAIT_S)
        return None if closed.value.rcvd is None else closed.value.rcvd.code

    with running_relay(str(tmp_path / "data"), tls_cert=cert, tls_key=key) as relay:
        relay.append(events)
        assert asyncio.run(clients(relay)) == 1001


def test_plain_http_to_the_tls_port_is_counted_and_dropped(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    with running_relay(str(tmp_path / "data"), tls_cert=cert, tls_key=key) as relay:
        with socket.create_connection((relay.host, relay.port), timeout=WAIT_S) as raw:
            raw.sendall(b"GET /subscribe HTTP/1.1\r\nHost: x\r\n\r\n")
            assert raw.recv(4096) == b""  # closed, no plaintext answer
        wait_until(lambda: relay.server.counters.handshakes["tls_failed"] == 1, what="the failed handshake counted")
        relay.append(make_events(5))

        async def clients() -> int:
            untrusting = ssl.create_default_context()  # the system's CAs: the self-signed certificate fails
            with pytest.raises(ssl.SSLCertVerificationError):
                async with connect(f"wss://127.0.0.1:{relay.port}/subscribe", ssl=untrusting, open_timeout=WAIT_S):
                    pass
            async with wss_connect(relay, cert, "cursor=0") as ws:  # the relay serves on
                return len(await recv_all(ws, 5))

        assert asyncio.run(clients()) == 5


def test_metrics_listener_over_tls_is_optional(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    with running_relay(str(tmp_path / "a"), tls_cert=cert, tls_key=key) as relay:
        assert relay.request("/metrics", metrics=True)[0] == 200  # plain unless asked
    with running_relay(str(tmp_path / "b"), tls_cert=cert, tls_key=key, metrics_tls=True) as relay:
        address = relay.server.metrics_address
        assert address is not None
        conn = http.client.HTTPSConnection(address[0], address[1], timeout=WAIT_S, context=client_context(cert))
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200 and b"jetstream_events_emitted_total" in response.read()
        finally:
            conn.close()


def test_tls_settings_are_checked(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    data = str(tmp_path / "data")
    with pytest.raises(ConfigurationError, match="tls_cert=.* and tls_key=None: set both"):
        RelayServer(RelayConfig(data_dir=data, port=0, metrics_port=None, tls_cert=cert))
    with pytest.raises(ConfigurationError, match="tls_key='/nope.pem' is not a readable file"):
        RelayServer(RelayConfig(data_dir=data, port=0, metrics_port=None, tls_cert=cert, tls_key="/nope.pem"))
    with pytest.raises(ConfigurationError, match="not a PEM certificate chain and its key"):
        RelayServer(RelayConfig(data_dir=data, port=0, metrics_port=None, tls_cert=key, tls_key=key))
    with pytest.raises(ConfigurationError, match="metrics_tls=True needs tls_cert and tls_key"):
        RelayServer(RelayConfig(data_dir=data, port=0, metrics_port=None, metrics_tls=True))


def test_logbuf_jetstream_serves_wss_with_tls_cert_and_key(tmp_path: Path) -> None:
    from websockets.asyncio.client import connect as async_connect

    cert, key = make_certificate(tmp_path)
    relay = RelayProcess(
        ["--driver-dir", unique_driver_dir(), "--port", "0", "--rate", "300", "--tls-cert", cert, "--tls-key", key]
    )
    try:
        listening = relay.wait_for_log("jetstream.listening")
        assert listening["url"].startswith("wss://127.0.0.1:")

        async def read(count: int) -> list[str | bytes]:
            async with async_connect(listening["url"], ssl=client_context(cert), max_size=None) as ws:
                return [await asyncio.wait_for(ws.recv(), WAIT_S) for _ in range(count)]

        assert len(asyncio.run(read(20))) == 20
        assert relay.stop() == 0, "\n".join(relay.lines)
    finally:
        relay.kill()
