"""``logbuf-jetstream`` (``python -m logbuf.jetstream.main``) as a user runs it: real processes, a real
media driver, real websocket clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from logbuf.client import Aeron, Context
from logbuf.jetstream import BUNDLED_ZSTD_DICTIONARY
from logbuf.jetstream.events import parse_event
from logbuf.jetstream.main import main
from logbuf.logbuffer.fragment_assembler import FragmentAssembler
from tests.jetstream._ingest_support import ROOT, RelayProcess, StreamReader, driver_process, unique_driver_dir


def run_cli(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    if "--metrics-port" not in args:  # jetstream's 6009 may be taken by another relay on this machine
        args = (*args, "--metrics-port", "0")
    return subprocess.run(
        [sys.executable, "-m", "logbuf.jetstream.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_help_lists_the_options() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for option in (
        "--upstream",
        "--rate",
        "--port",
        "--data-dir",
        "--retention",
        "--zstd-dictionary",
        "--channel",
        "--stream-id",
        "--driver-dir",
        "--record",
        "--rewind",
        "--no-compression",
        "--metrics-host",
        "--metrics-port",
    ):
        assert option in result.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--rate", "-5"], "rate=-5.0 must be a finite number"),
        (["--rate", "fast"], "argument --rate"),
        (["--upstream", "http://example.com/subscribe"], "must start with ws:// or wss://"),
        (["--upstream", "ws://"], "has no host"),
        (["--port", "70000"], "port 70000 is outside 0..65535"),
        (["--retention", "soon"], "'soon' is not a duration"),
        (["--rewind=-1s"], "'-1s' must be a positive duration"),
        (["--stream-id", "1e3"], "'1e3' is not an integer stream id"),
        (["--driver", "maybe"], "invalid choice: 'maybe'"),
        (["--stream-id", "7", "--topics-stream-id", "7"], "--topics-stream-id 7 must differ from --stream-id"),
    ],
)
def test_bad_options_are_rejected_naming_the_problem(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:  # argparse rejects them before anything starts
        main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_external_driver_required_but_absent_fails_clearly() -> None:
    result = run_cli("--driver", "external", "--driver-dir", unique_driver_dir(), "--role", "ingest")
    assert result.returncode == 2
    assert "no running media driver in" in result.stderr


def test_ingest_role_publishes_generated_events_into_the_drivers_stream_and_collections_as_topics() -> None:
    with driver_process() as driver:
        reader = StreamReader(driver.dir, "aeron:ipc", 1101)
        topic_aeron = Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=3_000_000_000))
        feed = topic_aeron.add_topic_subscription("aeron:ipc", 1102, ["app.bsky.feed.*"])
        try:
            relay = RelayProcess(
                [
                    "--role",
                    "ingest",
                    "--driver",
                    "external",
                    "--driver-dir",
                    driver.dir,
                    "--stream-id",
                    "1101",
                    "--rate",
                    "2000",
                    "--seed",
                    "3",
                    "--topics-stream-id",
                    "1102",
                ]
            )
            feed_events: list[bytes] = []
            try:
                messages = reader.wait_for(500, 30)
            finally:
                status = relay.stop()
            assembler = FragmentAssembler(lambda buffer, header: feed_events.append(bytes(buffer)))
            quiet_until = time.monotonic() + 0.5  # a poll may end at a term's end having only skipped: poll on
            while time.monotonic() < quiet_until:
                if feed.poll(assembler, 256):
                    quiet_until = time.monotonic() + 0.5
            assert status == 0, "\n".join(relay.lines)
            times = [t for _, t in messages]
            assert all(a < b for a, b in zip(times, times[1:]))
            for raw, reserved_value in messages:
                assert parse_event(raw).time_us == reserved_value
            events = [e.get("event") for e in relay.log]
            assert "jetstream.started" in events and "jetstream.stopped" in events
            stats = next(e for e in relay.log if e.get("event") == "jetstream.ingest_stats")
            assert stats["published"] >= len(messages)
            assert all(json.loads(line) for line in relay.lines)  # JSON logs when not a TTY, nothing else
            # The topic stream: exactly the event stream's app.bsky.feed.* events, in order.
            reader.wait_for(stats["published"])  # the event stream read to its end
            in_feed = [
                raw for raw, _ in reader.messages if (parse_event(raw).collection or "").startswith("app.bsky.feed.")
            ]
            assert len(feed_events) >= 100 and feed_events == in_feed[: len(feed_events)]
            assert len(in_feed) - len(feed_events) <= 1  # at most the one being offered when the relay stopped
        finally:
            topic_aeron.close()
            reader.close()


def test_no_per_event_logging() -> None:
    with driver_process() as driver:
        reader = StreamReader(driver.dir, "aeron:ipc", 1102)
        try:
            relay = RelayProcess(
                [
                    "--role",
                    "ingest",
                    "--driver-dir",
                    driver.dir,
                    "--stream-id",
                    "1102",
                    "--rate",
                    "0",
                    "--duration",
                    "1.5",
                ]
            )
            reader.wait_for(2000, 30)
            assert relay.proc.wait(30) == 0
            relay.stop()
            assert len(relay.lines) < 20, relay.lines
        finally:
            reader.close()


def test_embedded_driver_directory_is_removed_at_exit() -> None:
    directory = unique_driver_dir()
    relay = RelayProcess(["--role", "ingest", "--driver-dir", directory, "--duration", "1"])
    assert relay.proc.wait(30) == 0, "\n".join(relay.lines)
    relay.stop()
    assert any(e.get("event") == "jetstream.driver_embedded" for e in relay.log)
    assert not os.path.exists(directory)


def test_record_option_records_the_event_stream_into_an_archive(tmp_path: object) -> None:
    from logbuf.archive.catalog import Catalog
    from logbuf.archive.verify import verify_recording

    archive_dir = os.path.join(str(tmp_path), "archive")
    with driver_process() as driver:
        relay = RelayProcess(
            [
                "--role",
                "ingest",
                "--driver-dir",
                driver.dir,
                "--stream-id",
                "1103",
                "--rate",
                "1000",
                "--record",
                archive_dir,
                "--duration",
                "2",
            ]
        )
        assert relay.proc.wait(30) == 0, "\n".join(relay.lines)
        relay.stop()
    published = next(e for e in relay.log if e.get("event") == "jetstream.ingest_stats")["published"]
    assert published > 500
    with Catalog.open(archive_dir) as catalog:
        recordings = catalog.recordings()
        assert len(recordings) == 1
        d = recordings[0]
        assert d.stream_id == 1103 and d.channel == "aeron:ipc" and not d.active
        result = verify_recording(archive_dir, d)
    assert result.ok, result.reason
    assert result.frames >= published  # one frame per event (a few large ones are fragmented)


DICTIONARY = BUNDLED_ZSTD_DICTIONARY


def test_full_run_with_the_generator_serves_subscribe_clients(tmp_path: object) -> None:
    import asyncio

    import zstandard
    from websockets.asyncio.client import connect

    driver_dir = unique_driver_dir()
    relay = RelayProcess(
        [
            "--driver-dir",
            driver_dir,
            "--port",
            "0",
            "--rate",
            "1000",
            "--data-dir",
            os.path.join(str(tmp_path), "data"),
        ]
    )
    try:
        port = relay.port()

        async def clients() -> tuple[list[bytes], list[bytes], list[bytes]]:
            async with asyncio.timeout(20):
                # max_queue=None: websockets stops reading once 16 messages wait unread and close() does not
                # resume, so a client leaving mid-stream never sees the relay's close frame (test_server_close).
                url = f"ws://127.0.0.1:{port}/subscribe"
                async with connect(url, compression=None, max_queue=None) as ws:
                    live = [(await ws.recv()).encode() for _ in range(200)]  # type: ignore[union-attr]
                times = [parse_event(raw).time_us for raw in live]
                async with connect(f"{url}?cursor={times[50]}", compression=None, max_queue=None) as ws:
                    replay = [(await ws.recv()).encode() for _ in range(150)]  # type: ignore[union-attr]
                with open(DICTIONARY, "rb") as f:
                    decompressor = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(f.read()))
                async with connect(f"{url}?cursor={times[0]}&compress=true", compression=None, max_queue=None) as ws:
                    frames = [await ws.recv() for _ in range(20)]
                    assert all(isinstance(f, bytes) for f in frames)
                    compressed = [decompressor.decompress(f) for f in frames]  # type: ignore[arg-type]
                return live, replay, compressed

        live, replay, compressed = asyncio.run(clients())
        import urllib.request

        metrics_url = relay.wait_for_log("jetstream.listening")["metrics_url"]
        with urllib.request.urlopen(metrics_url, timeout=10) as response:  # noqa: S310 - our own listener
            assert b"jetstream_events_emitted_total" in response.read()
        times = [parse_event(raw).time_us for raw in live]
        assert all(a < b for a, b in zip(times, times[1:]))
        assert replay == live[50:]  # cursor replay is inclusive and identical
        assert compressed == live[:20]  # the same events, zstd with jetstream's dictionary
        assert relay.stop() == 0, "\n".join(relay.lines)
        assert not os.path.exists(driver_dir)  # the embedded driver removed its directory
        stream = next(e for e in relay.log if e.get("event") == "jetstream.stream_stats")
        assert stream["appended"] > 0 and stream["invalid"] == 0 and stream["out_of_order"] == 0
    finally:
        relay.kill()


def test_ingest_and_serve_roles_in_two_processes_share_a_driver(tmp_path: object) -> None:
    import asyncio

    from tests.jetstream._ingest_support import read_events

    with driver_process() as driver:
        common = ["--driver", "external", "--driver-dir", driver.dir, "--stream-id", "1104"]
        server = RelayProcess(
            ["--role", "serve", "--port", "0", "--data-dir", os.path.join(str(tmp_path), "d"), *common]
        )
        ingest: RelayProcess | None = None
        try:
            port = server.port()
            ingest = RelayProcess(["--role", "ingest", "--rate", "1000", *common])
            ingest.wait_for_log("jetstream.started")
            url = f"ws://127.0.0.1:{port}/subscribe?cursor=1"
            events = asyncio.run(read_events(url, until_time_us=0, count=300))
            times = [parse_event(raw).time_us for raw in events]
            assert len(times) == 300 and all(a < b for a, b in zip(times, times[1:]))
            assert ingest.stop() == 0 and server.stop() == 0
        finally:
            server.kill()
            if ingest is not None:
                ingest.kill()


def test_start_up_errors_exit_2_naming_the_problem() -> None:
    import socket

    result = run_cli("--driver-dir", unique_driver_dir(), "--port", "0", "--zstd-dictionary", "/nonexistent/zstd.dict")
    assert result.returncode == 2
    assert "zstd_dictionary='/nonexistent/zstd.dict' is not a readable file" in result.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        directory = unique_driver_dir()
        result = run_cli("--driver-dir", directory, "--port", str(port))
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert not os.path.exists(directory)  # the embedded driver was shut down and its directory removed


def test_an_upstream_refusing_the_subscription_stops_the_relay_with_status_1() -> None:
    from tests.jetstream._ingest_support import UpstreamStandIn, make_events

    upstream = UpstreamStandIn(make_events(3)).start()
    try:
        result = run_cli(
            "--driver-dir",
            unique_driver_dir(),
            "--port",
            "0",
            "--upstream",
            f"ws://127.0.0.1:{upstream.port}/not-subscribe",
        )
    finally:
        upstream.kill()
    assert result.returncode == 1
    assert "ingest failed: upstream" in result.stderr and "HTTP 404" in result.stderr


def test_serve_workers_share_one_port_with_reuse_port(tmp_path: object) -> None:
    """Two ``--role serve --reuse-port`` workers on one port, both subscribed to the ingest's stream: the
    kernel spreads the clients over them and every client gets the same ordered events from its worker."""
    import asyncio
    import urllib.request

    from tests.jetstream._ingest_support import read_events

    with driver_process() as driver:
        common = ["--driver", "external", "--driver-dir", driver.dir, "--stream-id", "1105"]
        workers: list[RelayProcess] = []
        ingest: RelayProcess | None = None
        try:
            first = RelayProcess(
                ["--role", "serve", "--reuse-port", "--port", "0", "--data-dir", os.path.join(str(tmp_path), "w0")]
                + common
            )
            workers.append(first)
            port = first.port()
            second = RelayProcess(
                [
                    "--role",
                    "serve",
                    "--reuse-port",
                    "--port",
                    str(port),
                    "--data-dir",
                    os.path.join(str(tmp_path), "w1"),
                ]
                + common
            )
            workers.append(second)
            assert second.port() == port
            # Without SO_REUSEPORT the port is taken: a clear start-up error naming it.
            lone = run_cli("--role", "serve", "--port", str(port), *common)
            assert lone.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in lone.stderr, lone.stderr
            ingest = RelayProcess(["--role", "ingest", "--rate", "2000", *common])
            ingest.wait_for_log("jetstream.started")
            url = f"ws://127.0.0.1:{port}/subscribe?cursor=1"

            async def clients() -> list[list[bytes]]:
                return list(await asyncio.gather(*(read_events(url, until_time_us=0, count=100) for _ in range(24))))

            for events in asyncio.run(clients()):
                times = [parse_event(raw).time_us for raw in events]
                assert len(times) == 100 and all(a < b for a, b in zip(times, times[1:]))
            accepted = []
            for worker in workers:
                metrics_url = worker.wait_for_log("jetstream.listening")["metrics_url"]
                with urllib.request.urlopen(metrics_url, timeout=10) as response:  # noqa: S310 - our own listener
                    text = response.read().decode()
                line = next(
                    (
                        x
                        for x in text.splitlines()
                        if x.startswith('logbuf_jetstream_handshakes_total{outcome="accepted"}')
                    ),
                    "accepted{} 0",
                )
                accepted.append(float(line.rsplit(" ", 1)[1]))
            assert sum(accepted) == 24 and all(a > 0 for a in accepted), accepted  # both workers served clients
            assert ingest.stop() == 0 and all(w.stop() == 0 for w in workers)
        finally:
            for process in [*workers, *([] if ingest is None else [ingest])]:
                process.kill()
