"""The relay under an ``options_update`` flood, this tree against a baseline revision in the same run.

    python perf/relay_flood.py --baseline 6ad7b54            # 2,000 flooders, 20 s at most per relay
    python perf/relay_flood.py --flooders 400 --seconds 10   # smaller

Each case starts a relay process producing ``--rate`` events/s (``time_us`` = the wall clock), an honest
client that reads the live stream (its lag: the age of the newest ``time_us`` it has read, sampled
every 50 ms at most, so a starved client counts too), then a flooder process with ``--flooders``
websocket connections (``--per-address`` from each source address in 127.0.0.0/8, under the relay's
per-address cap) sending ``--dids``-DID ``options_update`` messages as fast as TCP takes them, until
every flooder is closed or ``--seconds`` pass. Meanwhile ``/metrics`` is scraped every 0.5 s (2 s
timeout). Reported per relay: the honest client's lag (median, p99, max) during the flood, the slowest
scrape and how many failed, the relay's RSS before and its peak (VmHWM), its CPU seconds, how long the
flood lasted, messages the flooders wrote, and the close codes they got.

The baseline is the ``jetstream/`` tree of ``--baseline`` (``git archive``), run as package
``jetstream_baseline`` beside this tree's ``logbuf`` (its relative imports make it whole; its
``logbuf.*`` imports are this tree's driver and helpers). Both relays face the same flood in one run;
the machine is shared, so compare the two, not figures across runs. Writes
``perf/results/relay_flood.json``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tarfile
import tempfile
import time
from io import BytesIO
from typing import Any

from _common import ROOT, cpu_seconds, new_results, quiet, write_results

from logbuf.testing import wait_until
from logbuf.testing.host import rss_bytes
from logbuf.testing.relay_flood import FloodReport, LagMeter, flood, relay_process, scrape_during

BASELINE_PACKAGE = "jetstream_baseline"


def extract_baseline(revision: str, into: str) -> str:
    """``jetstream/`` at ``revision`` as package ``jetstream_baseline`` under ``into``; returns ``into``."""
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", "--format=tar", revision, "jetstream"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    os.rename(os.path.join(into, "jetstream"), os.path.join(into, BASELINE_PACKAGE))
    return into


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("inf")


def run_case(label: str, args: argparse.Namespace, package: str, path: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="relay-flood-") as data_dir:
        with relay_process(data_dir, rate=args.rate, package=package, path=path) as relay:
            honest = LagMeter(relay.url())
            try:
                wait_until(lambda: honest.events >= 20 or honest.error is not None, 30, "the first events")
                rss_before = rss_bytes(relay.pid)
                cpu_before = cpu_seconds(relay.pid)
                with flood(
                    relay, args.flooders, per_address=args.per_address, dids=args.dids, seconds=args.seconds
                ) as flooders:
                    if not flooders.poll(120):
                        raise RuntimeError("flooders did not connect")
                    assert flooders.recv() == "flooding"
                    started = time.monotonic()
                    scrapes, flood_s = scrape_during(relay, flooders)
                    report = flooders.recv()
                assert isinstance(report, FloodReport)
                lags = honest.lags_s(since=started)
                rss_peak = rss_bytes(relay.pid, "VmHWM")
                cpu = cpu_seconds(relay.pid) - cpu_before
            finally:
                honest.close()
    answered = [s for s in scrapes if s != float("inf")]
    case = {
        "relay": label,
        "flood_s": round(flood_s, 2),
        "connected": report.connected,
        "refused": report.refused,
        "messages_sent": round(report.messages_sent),
        "closes": dict(report.closes),
        "eof_without_close": report.eof_without_close,
        "lag_p50_s": round(percentile(lags, 0.5), 3),
        "lag_p99_s": round(percentile(lags, 0.99), 3),
        "lag_max_s": round(lags[-1] if lags else float("inf"), 3),
        "metrics_scrapes": len(scrapes),
        "metrics_failed": len(scrapes) - len(answered),
        "metrics_max_s": round(max(answered), 3) if answered else None,
        "rss_before_mib": round(rss_before / 2**20),
        "rss_peak_mib": round(rss_peak / 2**20),
        "relay_cpu_s": round(cpu, 2),
        "load_average": os.getloadavg(),
    }
    closes = ", ".join(f"{n} x {label[:40]}" for label, n in report.closes.items()) or "none"
    print(
        f"  {label:<9} flood {flood_s:5.1f} s  lag p50 {case['lag_p50_s']:7.3f} p99 {case['lag_p99_s']:7.3f} "
        f"max {case['lag_max_s']:7.3f} s  /metrics {case['metrics_failed']}/{len(scrapes)} failed, "
        f"slowest {case['metrics_max_s']} s  RSS {case['rss_before_mib']} -> {case['rss_peak_mib']} MiB  "
        f"CPU {cpu:.1f} s\n            {report.connected} flooders, {report.messages_sent:.0f} messages; closes: {closes}"
    )
    return case


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flooders", type=int, default=2000, help="flooding connections (default: %(default)s)")
    p.add_argument("--per-address", type=int, default=20, help="flooders per source address (default: %(default)s)")
    p.add_argument("--dids", type=int, default=10_000, help="DIDs in each options_update (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=20.0, help="longest flood per relay (default: %(default)s)")
    p.add_argument("--rate", type=float, default=200.0, help="live events per second (default: %(default)s)")
    p.add_argument("--baseline", default=None, metavar="REV", help="git revision to compare with (default: none)")
    args = p.parse_args()
    quiet()
    results = new_results("relay_flood", **{k: v for k, v in vars(args).items()})
    print(
        f"relay flood: {args.flooders} connections x {args.dids}-DID options_update, {args.rate:g} events/s, "
        f"at most {args.seconds:g} s; load {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory(prefix="relay-baseline-") as tmp:
        cases = [("this", "logbuf.jetstream", "")]
        if args.baseline:
            cases.insert(0, (args.baseline, BASELINE_PACKAGE, extract_baseline(args.baseline, tmp)))
        for label, package, path in cases:
            results["cases"].append(run_case(label, args, package, path))
    if len(results["cases"]) == 2:
        before, after = results["cases"]
        print(
            f"  max lag {before['lag_max_s']} -> {after['lag_max_s']} s; "
            f"RSS peak growth {before['rss_peak_mib'] - before['rss_before_mib']} -> "
            f"{after['rss_peak_mib'] - after['rss_before_mib']} MiB; "
            f"/metrics failures {before['metrics_failed']} -> {after['metrics_failed']}"
        )
    write_results(results)


if __name__ == "__main__":
    main()
