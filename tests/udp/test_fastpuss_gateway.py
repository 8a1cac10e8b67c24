"""The FASTPUSS gateway: a client written from FASTPUSS's grammar (plain UDP sockets) against two gateways whose
drivers sit on two network-namespace hosts. A SUB taken by either gateway gets the PUBs taken by either, in
order and once; malformed text is counted and dropped; silent clients expire; a client fails over by sending
its SUB to the other gateway. The gateways run in this process (their FASTPUSS sockets on 127.0.0.1); the logbuf
stream between them crosses the namespace network."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from logbuf.client import Aeron, Context
from logbuf.client.fastpuss import FastpussGateway, GatewayContext, MalformedMessage, Message, logbuf_topic, parse
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess
from logbuf.testing.netns import NetnsNetwork, drivers_fixture, network_fixture, requires_netns

pytestmark = requires_netns

DRIVER_ARGS = [
    *("--dir-delete-on-shutdown", "false", "--driver-timeout", "5s", "--client-liveness-timeout", "5s"),
    *("--term-length", "1m", "--publication-linger-timeout", "1s"),
]
PORT = 25_400
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STREAM = 7400


class FakeClock:
    def __init__(self) -> None:
        self.now_ns = 1_000_000_000_000

    def __call__(self) -> int:
        return self.now_ns


net = network_fixture(2)


hosts = drivers_fixture(DRIVER_ARGS)


@pytest.fixture
def gateways(hosts: list[DriverProcess]) -> Iterator[tuple[list[FastpussGateway], FakeClock]]:
    clients = [Aeron.connect(Context(dir=h.dir, driver_timeout_ns=5_000_000_000)) for h in hosts]
    clock = FakeClock()
    made: list[FastpussGateway] = []
    try:
        for i in range(2):
            ctx = GatewayContext(
                listen=("127.0.0.1", 0),
                stream_id=STREAM,
                subscribe_channel=f"aeron:udp?endpoint=10.13.0.{i + 1}:{PORT}",
                peer_channels=[f"aeron:udp?endpoint=10.13.0.{2 - i}:{PORT}"],
                client_expiry_ns=60_000_000_000,
                allow_unsubscribe=True,
            )
            made.append(FastpussGateway(ctx, clients[i], clock_ns=clock))
        wait_until(
            lambda: all(p.is_connected for g in made for p in g._publications),
            15,
            "the gateways' streams connected",
            do_work=lambda: sum(g.do_work() for g in made),
        )
        yield made, clock
    finally:
        for g in made:
            g.close()
        for c in clients:
            c.close()


@pytest.fixture
def sockets() -> Iterator[Callable[[], socket.socket]]:
    """FASTPUSS clients: plain UDP sockets on 127.0.0.1, closed after the test."""
    made: list[socket.socket] = []

    def make() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made.append(s)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        return s

    yield make
    for s in made:
        s.close()


def _pump(gateways: list[FastpussGateway], seconds: float = 0.3) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if not sum(g.do_work() for g in gateways):
            time.sleep(0.0005)  # pace: idle while the gateways run for the period asked


def _received(s: socket.socket) -> list[Message]:
    out = []
    while True:
        try:
            datagram = s.recv(70_000)
        except BlockingIOError:
            return out
        out.append(parse(datagram))


def _until(gateways: list[FastpussGateway], s: socket.socket, count: int, got: list[Message]) -> list[Message]:
    deadline = time.monotonic() + 15
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} MSGs"
        _pump(gateways, 0.02)
        got += _received(s)
    _pump(gateways, 0.1)
    got += _received(s)
    return got


def test_subscribers_on_either_gateway_get_pubs_taken_by_either_in_order_once(
    gateways: tuple[list[FastpussGateway], FakeClock], sockets: Callable[[], socket.socket]
) -> None:
    (a, b), _ = gateways
    x, y, z, p = sockets(), sockets(), sockets(), sockets()
    x.sendto(b"SUB room/1\n", a.address)
    y.sendto(b"SUB   room/1\n", b.address)  # white space is any run of \s
    z.sendto(b"SUB a..b\n", b.address)  # a FASTPUSS topic that is no logbuf name: carried hex-encoded
    _pump([a, b])
    assert a.client_ids == [f"/127.0.0.1:{x.getsockname()[1]}"]
    for i in range(100):
        p.sendto(f"PUB room/1\n{i} x\ty".encode(), (a if i % 2 else b).address)
    p.sendto("PUB a..b\n\u00e9t\u00e9".encode(), a.address)
    expected = [Message("MSG", "room/1", f"{i} x\ty") for i in range(100)]
    for s in (x, y):
        got = _until([a, b], s, 100, [])
        assert sorted(got, key=lambda m: int(m.body.split()[0])) == expected  # each once
        for parity in (0, 1):  # in order per gateway that took the PUBs
            mine = [m for m in got if int(m.body.split()[0]) % 2 == parity]
            assert mine == [m for m in expected if int(m.body.split()[0]) % 2 == parity]
    assert _until([a, b], z, 1, []) == [Message("MSG", "a..b", "\u00e9t\u00e9")]
    assert logbuf_topic("a..b").startswith("fastpuss-hex.")


def test_malformed_text_is_counted_and_dropped(
    gateways: tuple[list[FastpussGateway], FakeClock], sockets: Callable[[], socket.socket]
) -> None:
    (a, b), _ = gateways
    x, p = sockets(), sockets()
    x.sendto(b"SUB t\n", a.address)
    _pump([a, b])
    before = a.counts["malformed"]
    for bad in [b"\xff\xfe", b"HELLO t body", b"MSG t body", b"PUB", b"PUB   ", b"SUB\n"]:
        p.sendto(bad, a.address)
    p.sendto(b"PUB t\nok", a.address)
    got = _until([a, b], x, 1, [])
    assert got == [Message("MSG", "t", "ok")] and a.counts["malformed"] - before == 6


def test_silent_clients_expire_and_a_client_fails_over_by_subscribing_elsewhere(
    gateways: tuple[list[FastpussGateway], FakeClock], sockets: Callable[[], socket.socket]
) -> None:
    (a, b), clock = gateways
    x, p = sockets(), sockets()
    x.sendto(b"SUB e\n", a.address)
    _pump([a, b])
    p.sendto(b"PUB e\n1", b.address)
    assert _until([a, b], x, 1, []) == [Message("MSG", "e", "1")]
    clock.now_ns += 61_000_000_000  # x says nothing for longer than the expiry
    _pump([a, b])
    assert a.client_ids == [] and a.counts["expired"] == 1
    p.sendto(b"PUB e\n2", b.address)
    _pump([a, b])
    assert _received(x) == []
    x.sendto(b"SUB e\n", b.address)  # fail over to the other gateway
    _pump([a, b])
    p.sendto(b"PUB e\n3", a.address)
    assert _until([a, b], x, 1, []) == [Message("MSG", "e", "3")]
    x.sendto(b"UNSUB e\n", b.address)
    _pump([a, b])
    p.sendto(b"PUB e\n4", a.address)
    _pump([a, b])
    assert _received(x) == []


@pytest.mark.parametrize(
    ("datagram", "message"),
    [
        (b"PUB topic1\n41.88 12.48", Message("PUB", "topic1", "41.88 12.48")),
        (b"SUB topic1\n", Message("SUB", "topic1", "")),
        (b"PUB\t t  \n body\nline", Message("PUB", "t", "body\nline")),
        ("PUB caf\u00e9 \u00fc".encode(), Message("PUB", "caf\u00e9", "\u00fc")),
        (b"PUBx", Message("PUB", "x", "")),  # S may be empty: the grammar's own reading
    ],
)
def test_the_codec_reads_fastpuss_grammar(datagram: bytes, message: Message) -> None:
    assert parse(datagram) == message


@pytest.mark.parametrize("datagram", [b"", b"PUB", b"PUB \n", b"pub t x", b"\xc3", b" PUB t x", b"x" * 65_508])
def test_the_codec_refuses_what_is_not_fastpuss(datagram: bytes) -> None:
    with pytest.raises(MalformedMessage):
        parse(datagram)


def test_logbuf_gateway_processes_on_two_hosts_serve_a_readme_grammar_client_on_either(
    net: NetnsNetwork, hosts: list[DriverProcess]
) -> None:
    """Two ``logbuf-gateway fastpuss`` processes, one per namespace host, each with its host's driver; a client
    (``_fastpuss_client``: plain sockets, the README's grammar) on host 0 subscribes at both and publishes to
    both: each subscriber gets every PUB once, in order per gateway that took it."""
    port, listen_port, stream, count = PORT + 10, PORT + 11, STREAM + 1, 200
    gateways = []
    for i, host in enumerate(hosts):
        command = [
            *("ip", "netns", "exec", net.host(i), sys.executable, "-m", "logbuf.client.fastpuss", "fastpuss"),
            *("--listen", f"udp://{net.address(i)}:{listen_port}", "--dir", host.dir, "--stream-id", str(stream)),
            *("--subscribe-channel", f"aeron:udp?endpoint={net.address(i)}:{port}"),
            *("--peer", f"aeron:udp?endpoint={net.address(1 - i)}:{port}", "--duration", "60"),
        ]
        gateways.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    try:
        client = subprocess.run(
            [
                *("ip", "netns", "exec", net.host(0), sys.executable, "-m", "tests.udp._fastpuss_client"),
                *(f"{net.address(0)}:{listen_port}", f"{net.address(1)}:{listen_port}", str(count)),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert client.returncode == 0, client.stderr
        result = json.loads(client.stdout.strip().splitlines()[-1])
        if "error" in result:
            for g in gateways:
                g.send_signal(signal.SIGINT)
            outputs = [g.communicate(timeout=15)[1].decode(errors="replace")[-3000:] for g in gateways]
            pytest.fail(f"{result['error']}; the gateways said: {outputs}")
        expected = [f"{i % 2}:{i}" for i in range(count)]
        for name in ("x", "y"):  # x subscribed at host 1's gateway, y at host 0's
            got = result["got"][name]
            assert sorted(got, key=lambda b: int(b.split(":")[1])) == expected, name  # each once
            for k in (0, 1):
                assert [b for b in got if b.startswith(f"{k}:")] == [b for b in expected if b.startswith(f"{k}:")]
        assert result["malformed"] == []
    finally:
        for g in gateways:
            g.send_signal(signal.SIGINT)  # the gateway closes its client cleanly
        for g in gateways:
            try:
                _, stderr = g.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                g.kill()
                g.communicate()
