"""A relay following another relay (both ``logbuf-jetstream`` processes) across a network drop:
the follower resumes from its rewound cursor and ends up with exactly the origin's events."""

from __future__ import annotations

import asyncio
import os
import time

from logbuf.jetstream.events import parse_event
from logbuf.testing import wait_until
from tests.jetstream._ingest_support import RelayProcess, TcpProxy, read_events, unique_driver_dir


def test_upstream_relay_drops_and_comes_back_without_losing_or_repeating_events(tmp_path: object) -> None:
    base = str(tmp_path)
    origin = RelayProcess(
        [
            "--driver-dir",
            unique_driver_dir(),
            "--port",
            "0",
            "--rate",
            "1000",
            "--data-dir",
            os.path.join(base, "origin"),
        ]
    )
    follower: RelayProcess | None = None
    proxy: TcpProxy | None = None
    try:
        origin_port = origin.port()
        proxy = TcpProxy(origin_port).start()
        follower = RelayProcess(
            [
                "--driver-dir",
                unique_driver_dir(),
                "--port",
                "0",
                "--rewind",
                "1s",
                "--upstream",
                f"ws://127.0.0.1:{proxy.port}/subscribe",
                "--data-dir",
                os.path.join(base, "follower"),
            ]
        )
        follower_port = follower.port()
        wait_until(lambda: proxy is not None and proxy.connections >= 1, 20, "the follower to connect")
        time.sleep(1.0)  # events flow through the proxy
        proxy_port = proxy.port
        proxy.cut()  # the upstream drops mid-stream...
        time.sleep(0.7)  # ...stays away (reconnects are refused)...
        proxy = TcpProxy(origin_port, port=proxy_port).start()  # ...and comes back
        wait_until(lambda: proxy is not None and proxy.connections >= 1, 20, "the follower to reconnect")
        time.sleep(1.0)  # events flow again after the reconnect (the window checked below ends 0.3 s ago)
        until = time.time_ns() // 1000 - 300_000  # both relays hold every event up to here by now

        async def both() -> tuple[list[bytes], list[bytes]]:
            mine = await read_events(f"ws://127.0.0.1:{follower_port}/subscribe?cursor=1", until_time_us=until)
            first = parse_event(mine[0]).time_us
            theirs = await read_events(f"ws://127.0.0.1:{origin_port}/subscribe?cursor={first}", until_time_us=until)
            return mine, theirs

        mine, theirs = asyncio.run(both())
        assert len(mine) > 1500
        first_diff = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        assert mine == theirs, (first_diff, len(mine), len(theirs))  # every event once, in order, byte for byte
        assert follower.stop() == 0
        stats = next(e for e in follower.log if e.get("event") == "jetstream.ingest_stats")
        assert stats["connections"] >= 2 and stats["disconnects"] >= 1
        assert stats["duplicates"] > 0 and stats["restamped"] == 0 and stats["invalid"] == 0
        resumed = [e for e in follower.log if e.get("event") == "upstream.connected" and e.get("cursor")]
        assert resumed, "the reconnect asked for a cursor"
    finally:
        for relay in (follower, origin):
            if relay is not None:
                relay.kill()
        if proxy is not None:
            proxy.cut()
