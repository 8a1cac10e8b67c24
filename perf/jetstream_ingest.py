"""Jetstream ingest throughput: events per second into a logbuf stream, and what it costs.

    python perf/jetstream_ingest.py           # 100k upstream events, 5 s of generator
    python perf/jetstream_ingest.py --quick   # 30k events, 2 s

A real ``mediadriver`` process; the reader is a separate process polling the stream with the
relay's own read side (``EventStreamAdapter``: reassemble, parse, check order) and counting.
Cases, measured at the reader:

* ``generator``: the built-in generator at full speed (rate 0) into the stream: the origin path
  (generate + stamp + offer).
* ``upstream``: a jetstream-compatible upstream (a ``websockets`` server in its own process sending
  pre-generated events as fast as it can) followed by the ingest: receive + parse + dedupe + offer.
* ``websockets baseline``: the same upstream read by a plain ``websockets`` client that only counts
  (the ceiling a Python websocket consumer sets), in the same run.

Writes perf/results/jetstream_ingest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from typing import Any

from _common import media_driver, new_results, quiet, write_results

CHANNEL = "aeron:ipc"


def make_events(count: int) -> list[bytes]:
    from logbuf.jetstream.generator import EventGenerator

    gen = EventGenerator(1)
    start = time.time_ns() // 1000 - 3_600_000_000
    return [gen.make_event(start + i * 50) for i in range(count)]


# -- children ------------------------------------------------------------------------------------------
def reader(directory: str, stream_id: int, expected: int | None, seconds: float, ready: Any, out: Any) -> None:
    quiet()
    from logbuf.client import Aeron, Context
    from logbuf.jetstream.stream import EventStreamAdapter

    count = 0

    def append(raw: bytes, meta: object) -> None:
        nonlocal count
        count += 1

    with Aeron.connect(Context(dir=directory)) as aeron:
        sub = aeron.add_subscription(CHANNEL, stream_id)
        adapter = EventStreamAdapter(sub, append)
        ready.set()
        while count == 0:
            if adapter.do_work() == 0:
                time.sleep(0.0001)
        start = time.perf_counter()
        first = count
        deadline = start + seconds
        while time.perf_counter() < deadline and (expected is None or count < expected):
            if adapter.do_work() == 0:
                time.sleep(0.0001)
        elapsed = time.perf_counter() - start
        out.put(
            {
                "events": count - first,
                "seconds": elapsed,
                "invalid": adapter.stats.invalid,
                "out_of_order": adapter.stats.out_of_order,
                "bytes": adapter.stats.appended_bytes,
            }
        )


def upstream_server(count: int, port_out: Any) -> None:
    quiet()
    from websockets.asyncio.server import ServerConnection, serve

    events = [e.decode() for e in make_events(count)]

    async def handler(ws: ServerConnection) -> None:
        for i in range(0, len(events), 256):
            for text in events[i : i + 256]:
                await ws.send(text)
        await ws.wait_closed()

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, compression=None, max_queue=None) as server:
            port_out.put(server.sockets[0].getsockname()[1])
            await server.serve_forever()

    asyncio.run(main())


# -- cases ---------------------------------------------------------------------------------------------
def run_ingest_case(
    directory: str, stream_id: int, source_factory: Any, expected: int | None, seconds: float
) -> dict[str, Any]:
    from logbuf.client import Aeron, Context
    from logbuf.jetstream.ingest import Ingest

    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=reader, args=(directory, stream_id, expected, seconds, ready, out))
    child.start()
    assert ready.wait(30), "reader did not start"
    with Aeron.connect(Context(dir=directory)) as aeron:
        pub = aeron.add_exclusive_publication(CHANNEL, stream_id)
        ingest = Ingest(pub, source_factory())
        ingest.start()
        result: dict[str, Any] = out.get(timeout=seconds + 60)
        ingest.stop()
        pub.close()
    child.join(10)
    result["events_per_s"] = result["events"] / result["seconds"]
    result["mb_per_s"] = result["bytes"] / result["seconds"] / 1e6
    result["ingest"] = ingest.stats.snapshot()
    return result


async def baseline_client(port: int, count: int) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    async with connect(f"ws://127.0.0.1:{port}/subscribe", compression=None, max_size=None) as ws:
        await ws.recv()
        start = time.perf_counter()
        for _ in range(count - 1):
            await ws.recv()
        elapsed = time.perf_counter() - start
    return {"events": count - 1, "seconds": elapsed, "events_per_s": (count - 1) / elapsed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    quiet()
    count = 30_000 if args.quick else 100_000
    seconds = 2.0 if args.quick else 5.0
    results = new_results("jetstream_ingest", upstream_events=count, generator_seconds=seconds)
    ctx = mp.get_context("spawn")
    with media_driver("--ipc-term-length", "16m", start_timeout_s=20) as (_, directory):
        from logbuf.jetstream.generator import EventGenerator
        from logbuf.jetstream.ingest import GeneratorSource, OriginClock, Sequencer, UpstreamSource

        gen = run_ingest_case(
            directory, 2001, lambda: GeneratorSource(EventGenerator(3), 0, clock=OriginClock()), None, seconds
        )
        results["cases"].append({"case": "generator", **gen})
        print(f"generator -> stream:       {gen['events_per_s']:10,.0f} events/s  {gen['mb_per_s']:6.1f} MB/s")

        port_q = ctx.Queue()
        server = ctx.Process(target=upstream_server, args=(count, port_q), daemon=True)
        server.start()
        try:
            port = port_q.get(timeout=120)
            up = run_ingest_case(
                directory, 2002, lambda: UpstreamSource(f"ws://127.0.0.1:{port}/subscribe", Sequencer()), count - 1, 120
            )
            results["cases"].append({"case": "upstream", **up})
            print(f"upstream -> stream:        {up['events_per_s']:10,.0f} events/s  {up['mb_per_s']:6.1f} MB/s")
            base = asyncio.run(baseline_client(port, count))
            results["cases"].append({"case": "websockets_baseline", **base})
            print(f"websockets client (count): {base['events_per_s']:10,.0f} events/s")
            ratio = up["events_per_s"] / base["events_per_s"]
            results["ingest_vs_websockets_client"] = ratio
            print(f"ingest / plain websockets client: {ratio:.2f}")
        finally:
            server.terminate()
            server.join(5)
    write_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
