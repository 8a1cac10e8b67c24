"""The interop matrix and UDP 32 B throughput between logbuf and real Aeron (pyaeron: the Aeron 1.53
C client and driver), every pairing in the same run.

    python perf/interop.py            # 1,000,000 messages per pairing
    python perf/interop.py --quick    # 200,000

Each pairing is ``<driver>/<client> -> <driver>/<client>``: over ``aeron:udp?endpoint=127.0.0.1:P``
between two drivers (logbuf -> logbuf, logbuf -> C, C -> logbuf, C -> C, each with either client
library on the drivers' own side), and over ``aeron:ipc`` with the two client libraries on one
driver. The processes are those of ``logbuf/testing/aeron_peer.py`` (one offer per message, retried on
back pressure; the subscriber checks every message's sequence and content). The figure is the
subscriber's messages per second from its first message to its last; a pairing that fails is
reported as such in the matrix and the run goes on. Aeron -> Aeron is the peer measured in the same
run. Needs the pyaeron venv the interop tests make (~/.cache/logbuf-interop, or
``LOGBUF_INTEROP_CACHE``). On a shared 2-core machine two drivers and two clients share the cores:
read ratios, not absolutes; the load average is recorded beside each figure.
Writes perf/results/interop.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from logbuf.testing.aeron import Interop, pyaeron_python  # noqa: E402
from logbuf.testing.host import free_udp_port  # noqa: E402

UDP_PAIRINGS = [
    (("aeron", "pyaeron"), ("aeron", "pyaeron")),
    (("logbuf", "logbuf"), ("logbuf", "logbuf")),
    (("logbuf", "logbuf"), ("aeron", "pyaeron")),
    (("aeron", "pyaeron"), ("logbuf", "logbuf")),
    (("logbuf", "pyaeron"), ("logbuf", "pyaeron")),
    (("aeron", "logbuf"), ("aeron", "logbuf")),
]
"""The first four are the driver matrix (each driver with its own client); the last two put each
client library on the other's driver."""
IPC_PAIRINGS = [
    (("aeron", "pyaeron"), ("aeron", "pyaeron")),
    (("logbuf", "logbuf"), ("logbuf", "logbuf")),
    (("logbuf", "pyaeron"), ("logbuf", "logbuf")),
    (("logbuf", "logbuf"), ("logbuf", "pyaeron")),
    (("aeron", "logbuf"), ("aeron", "pyaeron")),
    (("aeron", "pyaeron"), ("aeron", "logbuf")),
]
NAMES = {"aeron": "C", "logbuf": "logbuf"}


def run(pub: tuple[str, str], sub: tuple[str, str], channel: str, count: int, python: str) -> float:
    """The subscriber's msgs/s; raises RuntimeError naming what went wrong."""
    interop = Interop(python)
    try:
        logbuf_args = ["--ipc-term-length", "16m"]
        sub_dir = interop.driver(sub[0], *(logbuf_args if sub[0] == "logbuf" else []))[0]
        pub_dir = (
            sub_dir
            if channel == "aeron:ipc"
            else interop.driver(pub[0], *(logbuf_args if pub[0] == "logbuf" else []))[0]
        )
        subscriber = interop.peer("subscribe", sub[1], sub_dir, channel=channel, count=count, timeout=300)
        subscriber.wait("ready")
        publisher = interop.peer("publish", pub[1], pub_dir, channel=channel, count=count, timeout=300)
        publisher.wait("sent", 300)
        publisher.go()
        publisher.go()
        result = subscriber.wait("result", 300)
        if not result["ok"]:
            raise RuntimeError(f"subscriber: {result}")
        return float(result["msgs_per_s"])
    except AssertionError as e:
        raise RuntimeError(str(e).splitlines()[0]) from None
    finally:
        interop.close()


def pairing_name(pub: tuple[str, str], sub: tuple[str, str]) -> str:
    return f"{'/'.join(pub)} -> {'/'.join(sub)}"


def print_matrix(results: list[dict[str, Any]]) -> None:
    """Publisher driver by subscriber driver (UDP, each driver with its own client), then every pairing."""
    by_name = {(r["transport"], r["pairing"]): r for r in results}

    def cell(transport: str, pub: tuple[str, str], sub: tuple[str, str]) -> str:
        r = by_name.get((transport, pairing_name(pub, sub)))
        if r is None:
            return "-"
        return f"{r['msgs_per_s'] / 1e3:,.0f} k/s" if r["ok"] else "FAIL"

    print("\nUDP 32 B, msgs/s (rows: publishing driver, columns: subscribing driver; own client each)")
    print(f"{'':>14}" + "".join(f"{NAMES[d] + ' driver':>16}" for d in ("logbuf", "aeron")))
    for pub_driver in ("logbuf", "aeron"):
        own = {"logbuf": "logbuf", "aeron": "pyaeron"}
        row = [
            cell("udp", (pub_driver, own[pub_driver]), (sub_driver, own[sub_driver]))
            for sub_driver in ("logbuf", "aeron")
        ]
        print(f"{NAMES[pub_driver] + ' driver':>14}" + "".join(f"{c:>16}" for c in row))
    print("\nInterop matrix (<driver>/<client>; C = Aeron 1.53's C driver, pyaeron = its C client)")
    for r in results:
        status = "ok  " if r["ok"] else "FAIL"
        figure = f"{r['msgs_per_s']:>12,.0f} msgs/s" if r["ok"] else f"  {r['error']}"
        print(f"  {r['transport']:4} {r['pairing']:38} {status} {figure}  (load {r['load_before'][0]:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    count = 200_000 if args.quick else 1_000_000
    python = pyaeron_python()
    results: list[dict[str, Any]] = []
    cases = [("udp", p) for p in UDP_PAIRINGS] + [("ipc", p) for p in IPC_PAIRINGS]
    for transport, (pub, sub) in cases:
        channel = "aeron:ipc" if transport == "ipc" else f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
        name = pairing_name(pub, sub)
        load_before = os.getloadavg()
        try:
            rate, ok, error = run(pub, sub, channel, count, python), True, ""
        except RuntimeError as e:
            rate, ok, error = 0.0, False, str(e)[:300]
        results.append(
            {
                "transport": transport,
                "pairing": name,
                "ok": ok,
                "msgs_per_s": rate,
                "error": error,
                "load_before": list(load_before),
                "load_after": list(os.getloadavg()),
            }
        )
        print(
            f"{transport:4} {name:40s} {rate / 1e6:6.3f} M msgs/s" if ok else f"{transport:4} {name:40s} FAIL",
            flush=True,
        )
    for transport in ("udp", "ipc"):
        base = next((r["msgs_per_s"] for r in results if r["transport"] == transport), 0.0)
        for r in results:
            if r["transport"] == transport:
                r["vs_aeron"] = r["msgs_per_s"] / base if base else 0.0
    print_matrix(results)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "interop.json")
    with open(out, "w") as f:
        json.dump(
            {"count": count, "size": 32, "cpus": os.cpu_count(), "results": results},
            f,
            indent=2,
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
