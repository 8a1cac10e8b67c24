"""UDP 32 B throughput between logbuf and real Aeron (pyaeron: the Aeron 1.53 C client and driver),
one figure per pairing, all in the same run.

    python perf/interop.py            # 1,000,000 messages per pairing
    python perf/interop.py --quick    # 200,000

Each pairing is ``<driver>/<client> -> <driver>/<client>`` over ``aeron:udp?endpoint=127.0.0.1:P``,
with the processes of ``tests/interop/peer.py`` (one offer per message, retried on back pressure;
the subscriber checks every message's sequence and content). The figure is the subscriber's
messages per second from its first message to its last. Aeron -> Aeron is the peer measured in
the same run. Needs the pyaeron venv the interop tests make (~/.cache/logbuf-interop). On a
shared 2-core machine two drivers and two clients share the cores: read ratios, not absolutes.
Writes perf/results/interop.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.interop.conftest import Interop, _pyaeron_python, free_udp_port  # noqa: E402

PAIRINGS = [
    (("aeron", "pyaeron"), ("aeron", "pyaeron")),
    (("logbuf", "logbuf"), ("logbuf", "logbuf")),
    (("logbuf", "pyaeron"), ("logbuf", "pyaeron")),
    (("aeron", "logbuf"), ("aeron", "logbuf")),
    (("logbuf", "logbuf"), ("aeron", "pyaeron")),
    (("aeron", "pyaeron"), ("logbuf", "logbuf")),
]


def run(pub: tuple[str, str], sub: tuple[str, str], count: int, python: str) -> float:
    interop = Interop(python)
    try:
        channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
        sub_dir, pub_dir = (
            interop.driver(kind, *(["--ipc-term-length", "16m"] if kind == "logbuf" else []))[0]
            for kind in (sub[0], pub[0])
        )
        subscriber = interop.peer("subscribe", sub[1], sub_dir, channel=channel, count=count, timeout=300)
        subscriber.wait("ready")
        publisher = interop.peer("publish", pub[1], pub_dir, channel=channel, count=count, timeout=300)
        publisher.wait("sent", 300)
        publisher.go()
        publisher.go()
        result = subscriber.wait("result", 300)
        if not result["ok"]:
            raise SystemExit(f"{pub} -> {sub}: {result}")
        return float(result["msgs_per_s"])
    finally:
        interop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    count = 200_000 if args.quick else 1_000_000
    python = _pyaeron_python()
    results = []
    for pub, sub in PAIRINGS:
        rate = run(pub, sub, count, python)
        name = f"{'/'.join(pub)} -> {'/'.join(sub)}"
        results.append({"pairing": name, "msgs_per_s": rate})
        print(f"{name:40s} {rate / 1e6:6.2f} M msgs/s", flush=True)
    base = results[0]["msgs_per_s"]
    for r in results:
        r["vs_aeron"] = r["msgs_per_s"] / base if base else 0.0
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "interop.json")
    with open(out, "w") as f:
        json.dump({"count": count, "size": 32, "results": results}, f, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
