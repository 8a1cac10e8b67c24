"""logbuf-stat against a real driver: rates, lag, the slowest consumer, Prometheus, a dead driver."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

from logbuf.client import Aeron, Context, OfferResult
from logbuf.client.stat import UDP_SYSTEM_COUNTER_IDS, ReceiverStat, Snapshot, StatReader, StreamStat, render
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet, unique_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _stat(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logbuf.client.stat", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def _publish(pub, count: int, size: int) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 10
    sent = 0
    while sent < count:
        result = pub.offer(bytes(size))
        if result > 0:
            sent += 1
        else:
            assert result in (OfferResult.BACK_PRESSURED, OfferResult.ADMIN_ACTION), OfferResult(result).name
            assert time.monotonic() < deadline, "publisher stuck"


def test_rates_lag_and_the_slowest_subscriber(media_driver: DriverProcess) -> None:
    with Aeron.connect(Context(dir=media_driver.dir)) as aeron:
        pub = aeron.add_publication("aeron:ipc", 31)
        fast = aeron.add_subscription("aeron:ipc", 31)
        slow = aeron.add_subscription("aeron:ipc", 31)
        wait_until(lambda: pub.is_connected and fast.images and slow.images, 10, "connected")
        with StatReader(media_driver.dir) as reader:
            first = reader.sample()
            [stream] = [s for s in first.streams if s.stream_id == 31]
            assert stream.msgs_per_s is None  # no baseline yet
            start = stream.publisher_position
            _publish(pub, 1000, 100)
            while fast.poll(lambda b, h: None, 100) > 0:
                pass
            snap = reader.sample()
        [stream] = [s for s in snap.streams if s.stream_id == 31]
        frame = (dh.HEADER_LENGTH + 100 + 31) // 32 * 32
        assert stream.publisher_position == start + 1000 * frame
        assert stream.channel == "aeron:ipc"
        assert stream.msgs_per_s is not None and stream.bytes_per_s is not None
        # every frame since the baseline was scanned: the message rate is exact relative to the byte rate
        assert abs(stream.msgs_per_s / stream.bytes_per_s - 1 / frame) < 1e-9
        lags = sorted(s.lag for s in stream.subscribers)
        assert lags == [0, 1000 * frame]
        [slowest] = [s for s in stream.subscribers if s.slowest]
        assert slowest.lag == 1000 * frame
        assert snap.alive and snap.driver_pid == media_driver.proc.pid  # type: ignore[union-attr]


def test_once_json_prometheus_and_live_view(media_driver: DriverProcess) -> None:
    with Aeron.connect(Context(dir=media_driver.dir)) as aeron:
        pub = aeron.add_publication("aeron:ipc", 32)
        sub = aeron.add_subscription("aeron:ipc", 32)
        wait_until(lambda: pub.is_connected and sub.images, 10, "connected")
        _publish(pub, 10, 64)  # unread: lag 10 frames of 96 bytes

        once = _stat("--dir", media_driver.dir, "--once", "--json", "--interval", "0.1")
        assert once.returncode == 0, once.stderr
        snapshot = json.loads(once.stdout)
        [stream] = [s for s in snapshot["streams"] if s["stream_id"] == 32]
        assert [s["lag"] for s in stream["subscribers"]] == [960]
        assert any(c["label"] == "Active publications" and c["value"] == 1 for c in snapshot["counters"])

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "logbuf.client.stat",
                "--dir",
                media_driver.dir,
                "--json",
                "--prometheus",
                str(port),
                "--duration",
                "20",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:

            def scraped() -> str:
                try:
                    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                except OSError:  # not listening yet
                    return ""
                return body if "logbuf_subscriber_lag_bytes" in body else ""

            body = wait_until(scraped, 15, "/metrics with a subscriber's lag", max_idle_s=0.1)
            lines = body.splitlines()
            assert f'logbuf_driver_alive{{dir="{media_driver.dir}"}} 1.0' in lines
            [lag] = [line for line in lines if line.startswith("logbuf_subscriber_lag_bytes{")]
            assert 'stream_id="32"' in lag and lag.endswith(" 960.0")
            assert any(
                line.startswith('logbuf_system_counter{id="') and 'label="Active clients"' in line for line in lines
            )
        finally:
            server.kill()
            server.communicate(timeout=10)

    live = _stat("--dir", media_driver.dir, "--duration", "0.5", "--interval", "0.2")
    assert live.returncode == 0, live.stderr
    assert "streams" in live.stdout and "system counters" in live.stdout and "alive" in live.stdout


def test_the_live_view_says_what_it_counts_and_hides_idle_udp_counters_on_an_ipc_driver(
    media_driver: DriverProcess,
) -> None:
    with Aeron.connect(Context(dir=media_driver.dir)) as aeron:
        aeron.add_publication("aeron:ipc", 34)
        aeron.add_subscription("aeron:ipc", 34)
        live = _stat("--dir", media_driver.dir, "--once", "--interval", "0.1")
        once = _stat("--dir", media_driver.dir, "--once", "--json", "--interval", "0.1")
    assert live.returncode == 0 and once.returncode == 0, live.stderr + once.stderr
    view = " ".join(live.stdout.split())  # rich wraps the legend at the console's width
    assert "log bytes/s" in view and "lag (bytes)" in view
    assert "limit: how far it may write before it is back-pressured" in view
    assert "lag: how far a subscriber is behind the position" in view
    assert "count log bytes: frames with their 32-byte headers" in view
    counters = json.loads(once.stdout)["counters"]
    udp = [c for c in counters if c["system_id"] in UDP_SYSTEM_COUNTER_IDS]
    assert len(udp) == len(UDP_SYSTEM_COUNTER_IDS) and all(c["value"] == 0 for c in udp)  # JSON keeps them all
    assert f"({len(udp)} idle UDP counters hidden: no UDP stream)" in view
    assert "NAKs sent" not in view and "Bytes received" not in view
    assert "Errors" in view and "Active publications" in view


def test_the_udp_counter_ids_come_from_the_descriptor_and_are_the_network_counters() -> None:
    from logbuf.conduit import system_counters_descriptor as scd

    assert UDP_SYSTEM_COUNTER_IDS is scd.UDP_SYSTEM_COUNTER_IDS  # one definition, not a copy
    network_words = ("Bytes", "NAK", "Status", "Heartbeat", "Retransmit", "Flow", "Invalid", "Short", "gap",
                     "Datagram", "Setup", "TTL", "Frames", "Images", "flow control", "Spoofed")  # fmt: skip
    expected = {int(d.id) for d in scd.DESCRIPTORS if any(w in d.label for w in network_words)}
    expected.discard(scd.SystemCounterId.BYTES_CURRENTLY_MAPPED)  # mapped log bytes: IPC too
    assert UDP_SYSTEM_COUNTER_IDS == expected


def test_dead_driver_is_reported_not_alive_with_what_it_left(driver_factory: DriverSet) -> None:
    driver = driver_factory("--ipc-term-length", "64k", "--dir-delete-on-shutdown", "false", base=[])
    with Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=60_000_000_000)) as aeron:
        pub = aeron.add_publication("aeron:ipc", 33)
        aeron.add_subscription("aeron:ipc", 33)
        wait_until(lambda: pub.is_connected, 10, "connected")
        assert pub.offer(b"left behind") > 0
        driver.kill()
        time.sleep(0.6)  # pace: past the alive timeout given below
        out = _stat("--dir", driver.dir, "--once", "--json", "--interval", "0.1", "--alive-timeout-ms", "500")
        assert out.returncode == 0, out.stderr
        snapshot = json.loads(out.stdout)
        assert snapshot["alive"] is False and snapshot["heartbeat_age_ms"] > 500
        [stream] = [s for s in snapshot["streams"] if s["stream_id"] == 33]
        assert stream["publisher_position"] == 64  # one 43-byte frame, aligned
        live = _stat("--dir", driver.dir, "--once", "--interval", "0.1", "--alive-timeout-ms", "500")
        assert "NOT ALIVE" in live.stdout


def test_missing_directory_and_bad_arguments_name_the_problem() -> None:
    missing = unique_dir()
    out = _stat("--dir", missing, "--once")
    assert out.returncode == 2
    assert f"no CnC file at {missing}/cnc.dat" in out.stderr
    bad = _stat("--dir", missing, "--interval", "0")
    assert bad.returncode == 2 and "--interval=0ns must be positive" in bad.stderr
    unitless = _stat("--dir", missing, "--interval", "2 parsecs")
    assert unitless.returncode == 2 and "'2 parsecs' is not a duration" in unitless.stderr


def test_the_live_view_lists_each_receiver_of_a_group_publication_slowest_marked() -> None:
    """The receivers table (multicast members, MDC destinations) as the live view renders it."""
    from rich.console import Console

    stream = StreamStat(7, 42, 1001, "aeron:udp?endpoint=239.1.1.1:40001", 9000, 9000, None, None)
    stream.sender_position, stream.flow_control_receivers = 9000, 2
    stream.receivers = [
        ReceiverStat(10, "1a2b", "10.13.0.2:40001", 9000, 0),
        ReceiverStat(11, "3c4d", "10.13.0.3:40001", 4096, 4904, slowest=True),
    ]
    snapshot = Snapshot("/dev/shm/x", True, 1, 0, 0, [stream], [], [])
    with open(os.devnull, "w") as sink:
        console = Console(width=200, record=True, file=sink)
        console.print(render(snapshot))
    text = console.export_text()
    assert "receivers of multicast and MDC publications" in text
    assert "10.13.0.3:40001" in text and "4,904" in text and "3c4d" in text


def test_loss_prints_aerons_lossstat_table_from_the_report_alone() -> None:
    """--loss reads only loss-report.dat: a directory with no CnC will do (a stopped driver's, or Aeron's)."""
    from logbuf.client.stat import LOSS_REPORT_CSV_HEADER
    from logbuf.conduit.loss_report import LossReport, LossReportFile

    directory = unique_dir()
    os.makedirs(directory)
    try:
        with LossReportFile.create(directory, 4096) as report_file:
            report = LossReport(report_file.buffer, clock_ms=lambda: 1_764_093_723_042)
            offset = report.create_entry(1408, -5, 1001, "aeron:udp?endpoint=127.0.0.1:40123", "127.0.0.1:5000")
            report.record_observation(offset, 64, now_ms=1_764_093_724_001)
            report.create_entry(96, 8, 1002, "aeron:udp?endpoint=127.0.0.1:40124", "127.0.0.1:5001")
        env_utc = {**os.environ, "TZ": "UTC"}
        out = subprocess.run(
            [sys.executable, "-m", "logbuf.client.stat", "--dir", directory, "--loss"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=ROOT,
            env=env_utc,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [
            LOSS_REPORT_CSV_HEADER,
            "2,1472,2025-11-25 18:02:03.042+0000,2025-11-25 18:02:04.001+0000,-5,1001,"
            "aeron:udp?endpoint=127.0.0.1:40123,127.0.0.1:5000",
            "1,96,2025-11-25 18:02:03.042+0000,2025-11-25 18:02:03.042+0000,8,1002,"
            "aeron:udp?endpoint=127.0.0.1:40124,127.0.0.1:5001",
            "2 loss entries",
        ]
        as_json = json.loads(_stat("--dir", directory, "--loss", "--json").stdout)
        assert [(e["observation_count"], e["total_bytes_lost"], e["session_id"]) for e in as_json] == [
            (2, 1472, -5),
            (1, 96, 8),
        ]
    finally:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def test_loss_on_a_live_driver_and_on_a_missing_report(media_driver: DriverProcess) -> None:
    out = _stat("--dir", media_driver.dir, "--loss")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1:] == ["0 loss entries"]  # an IPC driver: no loss
    missing = unique_dir()
    gone = _stat("--dir", missing, "--loss")
    assert gone.returncode == 2 and f"cannot read the loss report {missing}/loss-report.dat" in gone.stderr
