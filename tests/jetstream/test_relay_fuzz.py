"""The relay's fuzz test: random and mutated HTTP and websocket bytes from many
connections while an honest client is served (seeded, about 10 s). The relay's loop must stay up, the
honest client must get every event once and in order, and the relay must serve new clients after.
The UDP and command-ring part is ``tests/driver/test_network_fuzz.py``."""

from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

import pytest

from tests.jetstream._relay_support import BASE_US, RelayHandle, make_events, recv_events, running_relay
from tests.jetstream.test_server_hardening import UPGRADE, client_frame, still_serves

SEED = 1416
FUZZ_SECONDS = 10.0
EVENTS_PER_ROUND = 10


def real_requests(rng: random.Random) -> list[bytes]:
    hello = json.dumps({"type": "options_update", "payload": {"wantedCollections": ["app.bsky.feed.like"]}})
    upgrade = UPGRADE.format(query=rng.choice(["", "?cursor=0", "?requireHello=true", "?compress=true"])).encode()
    return [
        upgrade,
        upgrade + client_frame(0x1, hello.encode()),
        upgrade + client_frame(0x9, b"ping") + client_frame(0x8, b"\x03\xe8"),
        upgrade + client_frame(0x2, b"x" * 300, fin=False) + client_frame(0x0, b"y" * 70_000),
        upgrade + client_frame(0x1, b"z", declared=rng.choice([126, 70_000, 9_900_000, 2**40]))[:20],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /subscribe HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        b"GET /subscribe?wantedCollections=" + b"a" * rng.randint(1, 9000) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ]


def mutated(rng: random.Random) -> bytes:
    data = bytearray(rng.choice(real_requests(rng)))
    kind = rng.random()
    if kind < 0.3:
        for _ in range(rng.randint(1, 10)):
            bit = rng.randrange(len(data) * 8)
            data[bit // 8] ^= 1 << (bit % 8)
    elif kind < 0.5:
        del data[rng.randrange(len(data)) :]
    elif kind < 0.7:
        at = rng.randrange(len(data))
        data[at:at] = rng.choice([b"\r\n", b"\r\n\r\n", b":", b"\x00", rng.randbytes(rng.randint(1, 64))])
    elif kind < 0.8:
        return rng.randbytes(rng.randint(0, 2000))
    return bytes(data)


def attack(relay: RelayHandle, rng: random.Random) -> int:
    """One connection: a mutated request, then either hang up at once or read what comes back."""
    with socket.create_connection((relay.host, relay.port), timeout=5) as sock:
        try:
            sock.sendall(mutated(rng))
            if rng.random() < 0.5:
                sock.settimeout(0.2)
                while sock.recv(65536):
                    pass
        except (TimeoutError, ConnectionError):
            pass
    return 1


@pytest.mark.slow
def test_random_http_and_websocket_bytes_leave_the_relay_serving_an_honest_client(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    with running_relay(str(tmp_path)) as relay:
        relay.append(make_events(EVENTS_PER_ROUND))
        with relay.connect({"cursor": BASE_US}) as honest:
            received = [e["time_us"] for e in recv_events(honest, EVENTS_PER_ROUND)]
            rounds, connections = 1, 0
            deadline = time.monotonic() + FUZZ_SECONDS
            while time.monotonic() < deadline:
                for _ in range(10):
                    connections += attack(relay, rng)
                relay.append(make_events(EVENTS_PER_ROUND, start_us=BASE_US + rounds * EVENTS_PER_ROUND * 1000))
                rounds += 1
                received += [e["time_us"] for e in recv_events(honest, EVENTS_PER_ROUND)]
        assert received == [BASE_US + i * 1000 for i in range(rounds * EVENTS_PER_ROUND)]
        assert connections >= 50 and relay.server.counters.handshakes["invalid_http"] > 0  # the fuzz got in
        still_serves(relay, BASE_US + rounds * EVENTS_PER_ROUND * 1000)
