"""Jetstream fan-out on loopback: how many clients stay under 1 s behind, relay vs a websockets broadcast server.

    python perf/jetstream_fanout.py              # both servers, growing client counts, 8 s windows
    python perf/jetstream_fanout.py --quick      # shorter windows, fewer steps

A server process produces ``--rate`` synthetic jetstream events per second (~480 B, the seeded
generator, ``time_us`` = the wall clock), and ``--procs`` client processes hold the connections:
raw non-blocking sockets that do the HTTP upgrade and then only read bytes, many per process. A
client's lag is the age of the newest ``time_us`` it has read, sampled just before each read and at
the end (so a starved client counts too). A step *keeps up* when every connection is still open
and no lag in the measuring window reached 1 s. Client counts grow until a step fails; the result is
the largest count that kept up, with the aggregate Gbps the clients received.

The peer, in the same run, is what a Python user would write with ``websockets``: an asyncio server
whose producer calls ``websockets.asyncio.server.broadcast(server.connections, event)``.

Kernel settings. Thousands of loopback connections need more than a desktop's defaults. The
benchmark changes none of the machine's: as root it creates a network namespace ``lbfan-<pid>``
(``ip netns add``; its loopback is brought up), sets these per-namespace sysctls inside it, runs every
server and client process there (``ip netns exec``) and deletes it in a ``finally``:

* ``net.core.somaxconn`` 65535 and ``net.ipv4.tcp_max_syn_backlog`` 65535: connections arrive in
  bursts of thousands, faster than one loop accepts them (both servers listen with a 4096 backlog);
* ``net.ipv4.ip_local_port_range`` 1024-65535: room for ephemeral ports (the clients also spread over
  many source addresses, below).

Per process, not per machine: ``RLIMIT_NOFILE`` raised (the hard limit too, when the process may:
an unprivileged container cannot, and one process then holds at most the hard limit's connections;
recorded in the results) to hold every connection. Not settable in a namespace, and not changed: ``net.ipv4.tcp_mem`` (global; recorded in the
results): each connection's socket buffers are bounded instead (the relay's 256 KiB ``SO_SNDBUF``,
the clients' 256 KiB ``SO_RCVBUF``, and clients that read often), so the kernel stays out of TCP
memory pressure. ``--no-netns`` runs in the current namespace (needs the machine's limits to suffice).

Serving workers (``--workers N``, N > 1): what an operator runs for more clients than one process holds
(README, "serving workers"): a media driver, a producer process publishing the paced events into an
``aeron:ipc`` stream, and N relay processes, each subscribed to that stream with its own frame files,
listening on one port with ``SO_REUSEPORT``; the kernel spreads the clients over them. The server CPU
figure is then the sum of the workers, the producer and the driver.

Client addresses: each client binds a source address in 127.0.0.0/8, ``CLIENTS_PER_ADDRESS`` per
address, so the relay runs with its defaults for the internet: at most 100 connections per address
and the 5,000 events/s per-address token bucket (8 clients x 500 events/s stay under it).

Clients discard what they read except the last ``TAIL_LENGTH`` bytes (``recv`` with ``MSG_TRUNC``
after ``FIONREAD``: the kernel drops the bytes without copying them), from which they read the newest
``time_us``: the lag measured is the same, and the client processes cost less of the 2 cores the
servers need (both servers face the same clients).

Writes perf/results/jetstream_fanout.json, with the load average before and after each step. The
machine is shared: figures are noisy.
"""

from __future__ import annotations

import argparse
import fcntl
import multiprocessing as mp
import os
import resource
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
from typing import Any

from _common import cpu_seconds, new_results, quiet, write_results

LAG_LIMIT_S = 1.0
#: A client process reports "caught up" once all its connections hold an event under 0.5 s old; the
#: measuring window starts (after --warmup) when every process has, or after CATCH_UP_LIMIT_S.
CAUGHT_UP_US = 500_000
MAX_EVENTS = 4096
#: Each client's receive buffer (what a client on a real network would have, rather than loopback's
#: autotuning up to 32 MiB: thousands of those push the kernel into TCP memory pressure).
CLIENT_RCVBUF = 256 * 1024
CATCH_UP_LIMIT_S = 30.0
UPGRADE = (
    b"GET /subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
MARK = b'"time_us":'
#: Clients pause this long between polls so that each read takes what arrived meanwhile (adds <= 50 ms
#: of lag; 25 events of ~480 B at 500/s): it keeps the clients' cost per frame low for both servers.
READ_PAUSE_S = 0.05
#: Bytes of each read kept (and searched for the newest ``time_us``); the rest is discarded unread.
TAIL_LENGTH = 4096
#: Clients per source address (127.x.y.z): under the relay's per-address caps (100 connections,
#: 5,000 events/s at 500 events/s each).
CLIENTS_PER_ADDRESS = 8
#: The event stream between the producer and the relay workers (``--workers`` > 1).
EVENT_CHANNEL = "aeron:ipc"
EVENT_STREAM_ID = 6008
#: The media driver of the workers' event stream: asleep when idle (500 events/s is no work for it),
#: and not pinned, so that it takes no core from the relay.
WORKER_DRIVER_ARGS = ["--idle-strategy", "sleep", "--cpu-affinity", "any"]
NETNS_SYSCTLS = {
    "net.core.somaxconn": "65535",
    "net.ipv4.tcp_max_syn_backlog": "65535",
    "net.ipv4.ip_local_port_range": "1024 65535",
}


def raise_nofile(want: int) -> int:
    """Raise this process's open-files limit to ``want`` (the hard limit too, when allowed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        with open("/proc/sys/fs/nr_open") as f:
            ceiling = int(f.read())
    except OSError:
        ceiling = hard
    target = min(max(soft, want), ceiling)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, max(hard, target)))
    except (ValueError, OSError):  # not allowed to raise the hard limit
        target = min(hard, max(soft, want))
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def client_address(i: int) -> str:
    """The source address of client ``i`` of a process (``base`` keeps processes apart)."""
    a = i // CLIENTS_PER_ADDRESS
    return f"127.{1 + a // 62500}.{(a // 250) % 250 + 1}.{a % 250 + 1}"


class Pacer:
    """Events due at ``rate``/s since start, stamped with strictly increasing wall-clock µs."""

    def __init__(self, rate: int) -> None:
        from logbuf.jetstream.generator import EventGenerator

        self.gen = EventGenerator(11)
        self.rate = rate
        self.t0 = time.monotonic()
        self.emitted = 0
        self.last_us = 0

    def due(self) -> list[bytes]:
        n = int((time.monotonic() - self.t0) * self.rate) - self.emitted
        out = []
        for _ in range(max(0, n)):
            now_us = max(time.time_ns() // 1000, self.last_us + 1)
            self.last_us = now_us
            out.append(self.gen.make_event(now_us))
        self.emitted += len(out)
        return out


# -- servers ------------------------------------------------------------------------------------------
def relay_server(
    rate: int,
    flush_interval_s: float,
    events_per_ip_s: float,
    data_parent: str | None,
    out: Any,
    stop: Any,
    port: int = 0,
    driver_dir: str | None = None,
) -> None:
    """One relay process. Alone (``driver_dir`` None) it generates the events itself; as one of several
    workers it listens with ``SO_REUSEPORT`` on ``port`` and reads the events from the logbuf stream the
    producer publishes (what ``logbuf-jetstream --role serve --reuse-port`` workers do)."""
    quiet()
    raise_nofile(1 << 20)
    from logbuf.jetstream.events import parse_event
    from logbuf.jetstream.server import RelayConfig, RelayServer

    data_dir = tempfile.mkdtemp(prefix="lbperf-jetstream-", dir=data_parent)
    server = RelayServer(
        RelayConfig(
            data_dir=data_dir,
            port=port,
            retention_ns=120_000_000_000,
            flush_interval_ns=round(flush_interval_s * 1e9),
            handshake_timeout_ns=60_000_000_000,
            metrics_port=None,
            max_events_per_ip_s=events_per_ip_s,
            reuse_port=driver_dir is not None,
        )
    )
    next_check = [0.0]

    def check_stop() -> None:
        now = time.monotonic()
        if now >= next_check[0]:
            next_check[0] = now + 0.1
            if stop.is_set():
                server.stop()

    aeron: Any = None
    if driver_dir is None:
        pacer = Pacer(rate)

        def produce() -> int:
            events = pacer.due()
            for raw in events:
                server.append(raw, parse_event(raw))
            check_stop()
            return len(events)

        server.add_duty(produce)
    else:
        from logbuf.client import Aeron, Context
        from logbuf.jetstream.stream import EventStreamAdapter

        aeron = Aeron.connect(Context(dir=driver_dir))
        adapter = EventStreamAdapter(aeron.add_subscription(EVENT_CHANNEL, EVENT_STREAM_ID), server.append)

        def consume() -> int:
            work = adapter.do_work()
            check_stop()
            return work

        server.add_duty(consume)
    out.put(("port", server.address[1]))
    profile = os.environ.get(PROFILE_ENV)
    if profile:  # py-spy on this process, collapsed stacks (idle frames left out), until it stops
        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        subprocess.Popen(
            [spy, "record", "--pid", str(os.getpid()), "--format", "raw", "--rate", "200", "-o", profile],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        server.serve_forever()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        if aeron is not None:
            aeron.close()
    drops = {k: v for k, v in server.counters.clients_dropped.items() if v}
    out.put(("stopped", server.store.next_seq, drops))


def stream_producer(rate: int, driver_dir: str, out: Any, stop: Any) -> None:
    """Publish the paced events into the logbuf stream the relay workers subscribe to."""
    quiet()
    from logbuf.client import Aeron, Context

    with Aeron.connect(Context(dir=driver_dir)) as aeron:
        pub = aeron.add_publication(EVENT_CHANNEL, EVENT_STREAM_ID)
        pacer = Pacer(rate)
        out.put(("producing", 0))
        published = 0
        while not stop.is_set():
            for raw in pacer.due():
                deadline = time.monotonic() + 5
                while pub.offer(raw) < 0:  # back-pressured or not connected yet: the workers catch up
                    if time.monotonic() > deadline:
                        raise RuntimeError("the relay workers stopped reading the event stream")
                    time.sleep(0.0005)
                published += 1
            time.sleep(0.001)
    out.put(("produced", published))


def baseline_server(rate: int, out: Any, stop: Any) -> None:
    quiet()
    raise_nofile(1 << 20)
    import asyncio
    import logging

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # "socket.send() raised" as clients leave
    logging.getLogger("websockets").setLevel(logging.CRITICAL)

    from websockets.asyncio.server import ServerConnection, broadcast, serve

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, compression=None, backlog=4096) as server:
            out.put(("port", server.sockets[0].getsockname()[1]))
            pacer = Pacer(rate)
            while not stop.is_set():
                for raw in pacer.due():
                    broadcast(server.connections, raw.decode())
                await asyncio.sleep(0.002)
            server.close()
        out.put(("stopped", pacer.emitted))

    asyncio.run(main())


# -- clients ------------------------------------------------------------------------------------------
def newest_time_us(buf: bytearray, n: int) -> int:
    """``time_us`` of the last complete ``"time_us":<digits>`` in ``buf[:n]`` (0 if none)."""
    end = n
    while True:
        p = buf.rfind(MARK, 0, end)
        if p < 0:
            return 0
        q = p + len(MARK)
        r = q
        while r < n and 48 <= buf[r] <= 57:
            r += 1
        if r < n and r > q:
            return int(buf[q:r])
        end = p


class Reader:
    """One client process's connections: read whatever arrived, track each one's newest ``time_us``."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []
        self.fd_index: dict[int, int] = {}
        self.last_us: list[int] = []
        self.max_lag_us: list[int] = []
        self.closed: list[bool] = []
        self.ep = select.epoll()
        self.buf = bytearray(1 << 18)
        self.tail = bytearray(TAIL_LENGTH)
        self.received = 0
        self.measuring = False

    def add(self, s: socket.socket, first: bytes) -> None:
        s.setblocking(False)
        i = len(self.socks)
        self.fd_index[s.fileno()] = i
        self.socks.append(s)
        self.last_us.append(newest_time_us(bytearray(first), len(first)))
        self.max_lag_us.append(0)
        self.closed.append(False)
        self.ep.register(s.fileno(), select.EPOLLIN)

    def read_ready(self, timeout_s: float) -> int:
        buf, tail = self.buf, self.tail
        events = self.ep.poll(timeout_s, MAX_EVENTS)
        now_us = time.time_ns() // 1000
        ioctl, unpack, nothing, trunc = fcntl.ioctl, struct.unpack, b"\0\0\0\0", socket.MSG_TRUNC
        for fd, _ in events:
            i = self.fd_index[fd]
            sock = self.socks[i]
            try:
                queued = unpack("i", ioctl(fd, termios.FIONREAD, nothing))[0]
                skipped = 0
                if queued > TAIL_LENGTH:  # drop all but the tail, uncopied
                    skipped = sock.recv_into(buf, min(queued - TAIL_LENGTH, len(buf)), trunc)
                k = sock.recv_into(tail)
            except BlockingIOError:
                continue
            except OSError:
                k = skipped = 0
            if k == 0 and skipped == 0:
                self.closed[i] = True
                self.ep.unregister(fd)
                continue
            if self.measuring:
                self.received += k + skipped
                if self.last_us[i] and now_us - self.last_us[i] > self.max_lag_us[i]:
                    self.max_lag_us[i] = now_us - self.last_us[i]
            t = newest_time_us(tail, k)
            if t > self.last_us[i]:
                self.last_us[i] = t
        return len(events)

    def read_all(self, timeout_s: float) -> None:
        """:meth:`read_ready` until every ready connection is read (one call reports at most MAX_EVENTS)."""
        if self.read_ready(timeout_s) == MAX_EVENTS:
            while self.read_ready(0) == MAX_EVENTS:
                pass

    def staleness_us(self) -> int:
        now_us = time.time_ns() // 1000
        return max((now_us - t if t else 10**12 for t in self.last_us), default=0)


def upgrade_batch(reader: Reader, batch: list[socket.socket]) -> None:
    """Read each socket's 101 response, draining the connections already open meanwhile.

    A process opening thousands of connections must keep reading the open ones while it waits for
    the next handshakes: a connection left unread long enough is dropped by the relay's write
    timeout, which would count against the relay rather than against the client's connect loop.
    """
    pending = {s.fileno(): (s, b"") for s in batch}
    ep = select.epoll()
    for s in batch:
        s.setblocking(False)
        ep.register(s.fileno(), select.EPOLLIN)
    deadline = time.monotonic() + 60
    try:
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} handshakes unanswered after 60 s")
            for fd, _ in ep.poll(0.01):
                s, head = pending[fd]
                try:
                    chunk = s.recv(4096)
                except BlockingIOError:
                    continue
                if not chunk:
                    raise ConnectionError("closed during the handshake")
                head += chunk
                if b"\r\n\r\n" not in head:
                    pending[fd] = (s, head)
                    continue
                if not head.startswith(b"HTTP/1.1 101"):
                    raise ConnectionError(head.split(b"\r\n", 1)[0].decode())
                ep.unregister(fd)
                del pending[fd]
                reader.add(s, head.split(b"\r\n\r\n", 1)[1])
            reader.read_all(0)  # keep the open connections drained
    finally:
        ep.close()


def client_proc(port: int, count: int, first: int, out: Any, start_measure: Any, stop: Any, window_s: float) -> None:
    raise_nofile(count + 256)
    reader = Reader()
    error = ""
    try:
        for base in range(0, count, 200):
            batch = []
            for j in range(min(200, count - base)):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)
                s.settimeout(60)
                s.bind((client_address(first + base + j), 0))
                s.connect(("127.0.0.1", port))
                s.sendall(UPGRADE)
                batch.append(s)
            upgrade_batch(reader, batch)
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    out.put(("connected", len(reader.socks), error))
    caught_up_sent = False
    window_end = 0.0
    cpu0 = 0.0
    while not stop.is_set():
        if not reader.measuring and start_measure.is_set():
            reader.measuring = True
            window_end = time.monotonic() + window_s
            cpu0 = time.process_time()
        if reader.measuring and time.monotonic() >= window_end:
            break
        time.sleep(READ_PAUSE_S)  # let bytes gather: one recv takes many frames
        reader.read_all(0.05)
        if not caught_up_sent and reader.staleness_us() < CAUGHT_UP_US:
            caught_up_sent = True
            out.put(("caught_up", 0, ""))
    if not caught_up_sent:
        out.put(("caught_up", 0, "never"))
    n = len(reader.socks)
    now_us = time.time_ns() // 1000
    if reader.measuring:
        cpu = time.process_time() - cpu0
        lags = sorted(max(m, now_us - t if t else 10**9) for m, t in zip(reader.max_lag_us, reader.last_us))
        out.put(
            (
                "result",
                {
                    "connections": n,
                    "closed": sum(reader.closed),
                    "never_received": sum(1 for t in reader.last_us if not t),
                    "bytes": reader.received,
                    "max_lag_us": lags[-1] if lags else 0,
                    "p99_lag_us": lags[int(len(lags) * 0.99)] if lags else 0,
                    "p50_lag_us": lags[len(lags) // 2] if lags else 0,
                    "cpu_s": cpu,
                },
            )
        )
    for s in reader.socks:
        s.close()


def read_global_tcp_mem() -> list[str]:
    """net.ipv4.tcp_mem (pages): global, so not visible inside a namespace (the parent passes it on)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_mem") as f:
            return f.read().split()
    except OSError:
        return os.environ.get(TCP_MEM_ENV, "").split()


# -- one step -----------------------------------------------------------------------------------------
def run_step(kind: str, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q: Any = ctx.Queue()
    stop_server = ctx.Event()
    stop_clients = ctx.Event()
    start_measure = ctx.Event()
    driver: Any = None
    producer: Any = None
    servers: list[Any] = []
    port = 0
    if kind == "relay":
        if args.workers > 1:
            from logbuf.testing.driver_process import DriverProcess

            driver = DriverProcess(args=WORKER_DRIVER_ARGS, check_errors=False).start()
        for _ in range(args.workers):  # the first binds a free port, other workers join it (SO_REUSEPORT)
            worker = ctx.Process(
                target=relay_server,
                args=(args.rate, args.flush_interval, args.max_events_per_ip, args.data_dir, q, stop_server),
                kwargs={"port": port, "driver_dir": None if driver is None else driver.dir},
            )
            worker.start()
            servers.append(worker)
            tag, port = q.get(timeout=60)
            assert tag == "port"
        if driver is not None:
            producer = ctx.Process(target=stream_producer, args=(args.rate, driver.dir, q, stop_server))
            producer.start()
            tag, _ = q.get(timeout=60)
            assert tag == "producing"
    else:
        servers.append(ctx.Process(target=baseline_server, args=(args.rate, q, stop_server)))
        servers[0].start()
        tag, port = q.get(timeout=60)
        assert tag == "port"
    server_pids = [p.pid for p in servers if p.pid is not None] + ([] if driver is None else [driver.pid])
    if producer is not None and producer.pid is not None:
        server_pids.append(producer.pid)
    procs = max(1, min(args.procs, clients // 50 or 1))
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    firsts = [sum(per[:i]) for i in range(procs)]
    client_q: Any = ctx.Queue()
    children = [
        ctx.Process(target=client_proc, args=(port, c, f, client_q, start_measure, stop_clients, args.seconds))
        for c, f in zip(per, firsts)
    ]
    load_before = os.getloadavg()
    for c in children:
        c.start()
    connected, errors, reports, caught_up = 0, [], 0, 0
    t_wait = time.monotonic()
    catch_up_s = 0.0
    while caught_up < len(children):
        limit = 300.0 if reports < len(children) else CATCH_UP_LIMIT_S
        try:
            tag, count, err = client_q.get(timeout=max(0.1, t_wait + limit - time.monotonic()))
        except Exception:  # noqa: BLE001 - queue.Empty: past the limit, measure anyway
            break
        if tag == "connected":
            reports += 1
            connected += count
            if err:
                errors.append(err)
            if reports == len(children):
                t_wait = time.monotonic()
        elif tag == "caught_up":
            caught_up += 1
    catch_up_s = time.monotonic() - t_wait
    time.sleep(args.warmup)
    cpu0 = sum(cpu_seconds(pid) for pid in server_pids)
    t0 = time.monotonic()
    start_measure.set()
    results: list[dict[str, Any]] = []
    while len(results) < len(children):
        tag, value, *_ = client_q.get(timeout=args.seconds + 120)
        if tag == "result":
            results.append(value)
    elapsed = time.monotonic() - t0
    server_cpu = sum(cpu_seconds(pid) for pid in server_pids) - cpu0
    stop_clients.set()
    for c in children:
        c.join(30)
    stop_server.set()
    drops: dict[str, int] = {}
    deadline = time.monotonic() + 30
    stopped = 0
    while stopped < len(servers) and time.monotonic() < deadline:
        try:
            message = q.get(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - queue.Empty: the servers are killed below anyway
            break
        if message[0] == "stopped":
            stopped += 1
            for reason, count in (message[2] if len(message) > 2 else {}).items():
                drops[reason] = drops.get(reason, 0) + count
    for p in [*servers, *([] if producer is None else [producer])]:
        p.join(10)
        if p.is_alive():
            p.kill()
    if driver is not None:
        driver.stop()
    total_bytes = sum(r["bytes"] for r in results)
    closed = sum(r["closed"] for r in results)
    max_lag = max((r["max_lag_us"] for r in results), default=0) / 1e6
    step = {
        "clients": clients,
        "connected": connected,
        "catch_up_s": round(catch_up_s, 2),
        "closed": closed,
        "never_received": sum(r["never_received"] for r in results),
        "server_drops": drops,
        "server_processes": len(server_pids),
        "connect_errors": errors[:3],
        "max_lag_s": max_lag,
        "p99_lag_s": max(r["p99_lag_us"] for r in results) / 1e6,
        "p50_lag_s": max(r["p50_lag_us"] for r in results) / 1e6,
        "gbps": total_bytes * 8 / args.seconds / 1e9,
        "server_cpu_pct": 100 * server_cpu / elapsed,
        "client_cpu_pct": 100 * sum(r["cpu_s"] for r in results) / args.seconds,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    step["kept_up"] = connected == clients and closed == 0 and max_lag < LAG_LIMIT_S
    print(
        f"  {kind:<8} {clients:>6} clients: {'kept up ' if step['kept_up'] else 'BEHIND  '} max lag "
        f"{max_lag:6.3f} s p99 {step['p99_lag_s']:6.3f} s  {step['gbps']:6.2f} Gbps  server CPU "
        f"{step['server_cpu_pct']:5.1f}%  clients CPU {step['client_cpu_pct']:5.1f}%  load {load_before[0]:.1f}"
        + (f"  connected {connected} closed {closed} {errors[:1]}" if connected != clients or closed else "")
        + (f"  server dropped {drops}" if drops else "")
        + (f"  {step['never_received']} never got an event" if step["never_received"] else ""),
        flush=True,
    )
    return step


def sweep(kind: str, counts: list[int], args: argparse.Namespace) -> dict[str, Any]:
    steps = []
    best: dict[str, Any] | None = None
    for clients in counts:
        step = run_step(kind, clients, args)
        steps.append(step)
        if not step["kept_up"]:
            break
        best = step
    return {
        "steps": steps,
        "max_clients_kept_up": best["clients"] if best else 0,
        "gbps_at_max": best["gbps"] if best else 0.0,
    }


NETNS_ENV = "LOGBUF_FANOUT_NETNS"
PROFILE_ENV = "LOGBUF_FANOUT_PROFILE"
TCP_MEM_ENV = "LOGBUF_FANOUT_TCP_MEM"


def run_in_namespace() -> int | None:
    """Run this script again inside a new network namespace ``lbfan-<pid>`` and delete the namespace after;
    returns its exit status, or None when no namespace can be made here (not root, no ``ip``)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("not root or no `ip`: running in this network namespace (the machine's limits apply)", flush=True)
        return None
    name = f"lbfan-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        print(f"ip netns add {name} failed ({made.stderr.strip()}): running in this namespace", flush=True)
        return None
    try:
        env = dict(os.environ, **{NETNS_ENV: name, TCP_MEM_ENV: " ".join(read_global_tcp_mem())})
        command = ["ip", "netns", "exec", name, sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
        return subprocess.run(command, env=env).returncode
    finally:
        subprocess.run(["ip", "netns", "del", name], timeout=30)


def configure_namespace() -> dict[str, str]:
    """Inside the benchmark's namespace: loopback up and the per-namespace sysctls set; returns them."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=30)
    for key, value in NETNS_SYSCTLS.items():
        with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
            f.write(value)
    return dict(NETNS_SYSCTLS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 s windows and fewer steps")
    parser.add_argument("--rate", type=int, default=500, help="events per second (default 500)")
    parser.add_argument("--seconds", type=float, default=None, help="measuring window per step")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds after connecting before measuring")
    parser.add_argument("--procs", type=int, default=3, help="client processes")
    parser.add_argument(
        "--flush-interval",
        type=float,
        default=0.05,
        help="relay's flush_interval_ns, in seconds here (time between passes over the clients)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="relay processes sharing the port (SO_REUSEPORT), fed through a logbuf stream by a producer "
        "process and a media driver (default 1: one process generating its own events)",
    )
    parser.add_argument("--relay-steps", default=None, help="comma-separated client counts for the relay")
    parser.add_argument("--baseline-steps", default=None, help="comma-separated client counts for the baseline")
    parser.add_argument("--only", choices=("relay", "baseline"), default=None)
    parser.add_argument(
        "--max-events-per-ip",
        type=float,
        default=5000.0,
        help="the relay's per-address token bucket, events/s (default 5000, its default; 0 = off)",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="where the relay's frame files go (default: the temp directory; /dev/shm keeps a busy disk's "
        "writeback stalls out of the figure)",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="record the relay process with py-spy (collapsed stacks) into FILE (last step wins)",
    )
    parser.add_argument(
        "--no-netns", action="store_true", help="run in this network namespace (no namespace, no sysctls)"
    )
    args = parser.parse_args()
    netns = os.environ.get(NETNS_ENV)
    if args.profile:
        os.environ[PROFILE_ENV] = os.path.abspath(args.profile)
    if netns is None and not args.no_netns:
        status = run_in_namespace()
        if status is not None:
            sys.exit(status)
    sysctls = configure_namespace() if netns is not None else {}
    if args.seconds is None:
        args.seconds = 3.0 if args.quick else 8.0
    quick_relay, full_relay = "1000,5000,10000", "1000,2500,5000,10000,15000,20000,25000,30000"
    quick_base, full_base = "100,300,600,1000", "100,300,600,1000,1500,2000"
    relay_steps = [int(x) for x in (args.relay_steps or (quick_relay if args.quick else full_relay)).split(",")]
    base_steps = [int(x) for x in (args.baseline_steps or (quick_base if args.quick else full_base)).split(",")]
    results = new_results(
        "jetstream_fanout",
        rate=args.rate,
        window_s=args.seconds,
        warmup_s=args.warmup,
        client_procs=args.procs,
        flush_interval_s=args.flush_interval,
        lag_limit_s=LAG_LIMIT_S,
        event_bytes_avg=480,
        kernel_tcp_mem_pages=read_global_tcp_mem(),
        netns=netns,
        netns_sysctls=sysctls,
        clients_per_address=CLIENTS_PER_ADDRESS,
        relay_max_events_per_ip_s=args.max_events_per_ip,
        relay_workers=args.workers,
        rlimit_nofile=list(resource.getrlimit(resource.RLIMIT_NOFILE)),
        relay_data_parent=args.data_dir or tempfile.gettempdir(),
        client_tail_bytes=TAIL_LENGTH,
        loadavg_start=[round(x, 2) for x in os.getloadavg()],
    )
    print(
        f"jetstream fan-out, {args.rate} events/s, lag limit {LAG_LIMIT_S} s, {args.seconds} s windows "
        f"(2 shared cores: noisy)",
        flush=True,
    )
    out: dict[str, Any] = {}
    if args.only in (None, "relay"):
        out["relay"] = sweep("relay", relay_steps, args)
    if args.only in (None, "baseline"):
        out["baseline"] = sweep("baseline", base_steps, args)
    results["cases"] = [{"case": kind, **value} for kind, value in out.items()]
    if "relay" in out and "baseline" in out:
        r, b = out["relay"]["max_clients_kept_up"], out["baseline"]["max_clients_kept_up"]
        ratio = r / b if b else float("inf")
        results["ratio_clients"] = ratio
        print(
            f"relay kept up {r} clients ({out['relay']['gbps_at_max']:.2f} Gbps), websockets broadcast {b} "
            f"({out['baseline']['gbps_at_max']:.2f} Gbps): ratio {ratio:.1f}x"
        )
    results["params"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    write_results(results)


if __name__ == "__main__":
    main()
