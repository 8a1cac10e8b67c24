"""An honest client's ``options_update`` while stalled connections hold the relay's whole client-input
budget, this tree against a baseline revision in the same run.

    python perf/relay_input_budget.py --baseline 75829fb

Each case starts a relay process (default settings: 1 MB messages, 64 MiB budget) producing ``--rate``
events/s, connects an honest client that reads the live stream, then opens ``--holders`` connections
(``--per-address`` per source address) that each declare a 512 KiB message, send 10 bytes of it and
stall: 128 of them exhaust the budget. The honest client then sends an ``options_update`` naming
the three DIDs it saw most, and a new client connects. Reported per relay: whether the update was applied
(the first wanted event after it, and no unwanted event after that), how long that took, the honest
client's lag at that event, how the newcomer's request was answered, and the close codes the holders got.
Writes ``perf/results/relay_input_budget.json``. The machine is shared: compare the two cases of one run.
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from collections import Counter
from typing import Any

from _common import new_results, quiet, write_results
from relay_flood import BASELINE_PACKAGE, extract_baseline
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from logbuf.testing.relay_flood import UPGRADE, client_frame, relay_process

#: Each holder's declared message: 128 of them fill the default 64 MiB budget exactly.
DECLARED = 512 * 1024


def run_case(label: str, args: argparse.Namespace, package: str, path: str) -> dict[str, Any]:
    case: dict[str, Any] = {"relay": label}
    holders: list[socket.socket] = []
    with tempfile.TemporaryDirectory(prefix="relay-budget-") as data_dir:
        with relay_process(data_dir, rate=args.rate, package=package, path=path) as relay:
            with connect(relay.url(), open_timeout=30, close_timeout=2, max_size=None) as ws:
                seen = Counter(json.loads(ws.recv(timeout=30))["did"] for _ in range(300))
                wanted = {did for did, _ in seen.most_common(3)}
                for i in range(args.holders):
                    sock = socket.create_connection(
                        relay.address, timeout=30, source_address=(f"127.0.2.{1 + i // args.per_address}", 0)
                    )
                    sock.sendall(UPGRADE)
                    head = sock.recv(4096)
                    if head.startswith(b"HTTP/1.1 101"):
                        sock.sendall(client_frame(0x1, b"x" * 10, declared=DECLARED))
                    holders.append(sock)
                time.sleep(1.0)  # the relay has read every declaration
                sent = time.monotonic()
                sent_us = time.time_ns() // 1000
                ws.send(json.dumps({"type": "options_update", "payload": {"wantedDids": sorted(wanted)}}))
                applied_s = lag_s = None
                unwanted = 0
                try:
                    while time.monotonic() - sent < args.seconds:
                        try:
                            event = json.loads(ws.recv(timeout=0.5))
                        except TimeoutError:
                            continue
                        if event["time_us"] <= sent_us:
                            continue
                        if event["did"] in wanted:
                            if applied_s is None:
                                applied_s = time.monotonic() - sent
                                lag_s = time.time_ns() / 1e9 - event["time_us"] / 1e6
                        elif applied_s is not None:
                            unwanted += 1
                        else:
                            unwanted = 0
                    case["honest"] = "open"
                except ConnectionClosed as exc:
                    rcvd = exc.rcvd
                    case["honest"] = f"closed {rcvd.code} {rcvd.reason}" if rcvd else "closed"
                try:
                    with connect(relay.url(), open_timeout=30, close_timeout=2):
                        case["newcomer"] = 101
                except InvalidStatus as exc:
                    case["newcomer"] = exc.response.status_code
            closes: Counter[str] = Counter()
            for sock in holders:
                sock.settimeout(0.01)
                try:
                    data = sock.recv(4096)
                except (TimeoutError, OSError):
                    data = b""
                if data.startswith(b"HTTP/1.1 101"):
                    data = data.partition(b"\r\n\r\n")[2]
                closes[
                    f"{int.from_bytes(data[2:4], 'big')} {data[4:].decode(errors='replace')}" if data else "open"
                ] += 1
                sock.close()
    case.update(
        applied_s=None if applied_s is None else round(applied_s, 3),
        lag_at_first_wanted_s=None if lag_s is None else round(lag_s, 3),
        unwanted_after_applied=unwanted,
        holder_closes=dict(closes),
    )
    print(
        f"  {label:<9} update applied after {case['applied_s']} s (lag {case['lag_at_first_wanted_s']} s, "
        f"{unwanted} unwanted after); honest {case['honest']}; newcomer {case['newcomer']}; holders {dict(closes)}"
    )
    return case


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--holders", type=int, default=140, help="stalled connections (default: %(default)s)")
    p.add_argument("--per-address", type=int, default=20, help="holders per source address (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=5.0, help="how long the honest client reads (default: %(default)s)")
    p.add_argument("--rate", type=float, default=200.0, help="live events per second (default: %(default)s)")
    p.add_argument("--baseline", default=None, metavar="REV", help="git revision to compare with (default: none)")
    args = p.parse_args()
    quiet()
    results = new_results("relay_input_budget", **{k: v for k, v in vars(args).items()})
    with tempfile.TemporaryDirectory(prefix="relay-baseline-") as tmp:
        cases = [("this", "logbuf.jetstream", "")]
        if args.baseline:
            cases.insert(0, (args.baseline, BASELINE_PACKAGE, extract_baseline(args.baseline, tmp)))
        for label, package, path in cases:
            results["cases"].append(run_case(label, args, package, path))
    write_results(results)


if __name__ == "__main__":
    main()
