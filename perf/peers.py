"""logbuf beside the real Aeron (pyaeron) and pyzmq, in the same run, on every row of the README's benchmark table.

    python perf/peers.py            # 5 s per throughput case, 20,000 round trips, every case twice
    python perf/peers.py --quick    # 1 s per case, 5,000 round trips

pyaeron (bindings for the Aeron 1.53 C client, with the C media driver embedded) needs Python >= 3.12, so
this script keeps a venv of its own (``~/.cache/logbuf-perf/py3.12``, made once from a python3.12/3.13 found
on the machine) holding pyaeron, pyzmq and an editable install of this tree. logbuf runs twice: on this
interpreter and on that one, because the headline ratio compares both on the same Python. Each case runs in
a fresh process of its implementation's interpreter (``perf/peer_cases.py``), with its own driver
processes, publisher and subscriber. Machine load is recorded before each case; the JSON goes to
``perf/results/peers.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import ROOT, new_results, write_results  # noqa: E402
from peer_cases import CASES  # noqa: E402

VENV = pathlib.Path(os.environ.get("LOGBUF_PERF_VENV") or pathlib.Path.home() / ".cache" / "logbuf-perf" / "py3.12")
"""``LOGBUF_PERF_VENV`` names another venv: two worktrees measuring at once must not reinstall each other's tree."""
PEER_PACKAGES = [
    "pyaeron",
    "pyzmq",
    "numpy",
    "posix_ipc",
    "structlog",
    "rich",
    "prometheus-client",
    "websockets",
    "zstandard",
]
THROUGHPUT = {
    "ipc-32",
    "ipc-512",
    "udp-32",
    "udp-512",
    "ipc-32-batch",
    "udp-32-batch",
    "udp-32-embedded",
    "udp-512-embedded",
}


def find_python312() -> str:
    """A Python >= 3.12 that runs (a pyenv shim for a version not selected only prints an error)."""
    names = [shutil.which(n) for n in ("python3.12", "python3.13")]
    candidates = [n for n in names if n] + sorted(
        glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3"))
    )
    for candidate in candidates:
        check = [candidate, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"]
        if subprocess.run(check, capture_output=True).returncode == 0:
            return candidate
    raise SystemExit("pyaeron needs Python >= 3.12: no working python3.12/3.13 on PATH or under ~/.pyenv")


def peer_python(build: bool) -> str:
    """The venv's interpreter, made on first use; ``build`` reinstalls this tree (a changed native core)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"making {VENV} (once) ...", flush=True)
        subprocess.run([find_python312(), "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
        build = True
    if build:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", ROOT], check=True)
    return str(python)


def run_case(python: str, impl: str, case: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    load = os.getloadavg()[0]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [python, os.path.join(ROOT, "perf", "peer_cases.py"), impl, case, json.dumps(params)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s", "load_1m": load}
    result: dict[str, Any]
    if proc.returncode != 0:
        result = {"error": (proc.stderr or proc.stdout)[-2000:]}
    else:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["load_1m"] = load
    result["wall_s"] = time.monotonic() - started
    return result


def headline(case: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return "FAILED"
    if case in THROUGHPUT:
        lost = result.get("lost", result.get("sent", 0) - result.get("received", 0))
        return f"{result['msgs_per_s'] / 1e6:.2f} M/s" + (f" ({lost} lost)" if lost else "")
    return f"{result['p50_us']:.1f}/{result['p99_us']:.1f} us"


def ratio(case: str, ours: dict[str, Any], theirs: dict[str, Any]) -> float | None:
    """logbuf over the peer, oriented so that > 1 means logbuf is better."""
    if "error" in ours or "error" in theirs:
        return None
    if case in THROUGHPUT:
        return float(ours["msgs_per_s"]) / float(theirs["msgs_per_s"])
    return float(theirs["p50_us"]) / float(ours["p50_us"])


def cell(case: str, result: dict[str, Any]) -> str:
    if "error" in result:
        return "failed"
    if case in THROUGHPUT:
        return f"{result['msgs_per_s'] / 1e6:.2f} M/s"
    return f"{result['p50_us']:.0f} / {result['p99_us']:.0f} µs"


def markdown_table(results: dict[str, Any]) -> str:
    """The README's table: one line per case and round, logbuf (on the peer's Python) beside pyaeron and
    pyzmq, the ratios oriented so that > 1 means logbuf is better, and the load when the row ran."""
    impls: list[str] = results["params"]["implementations"]
    ours = next(label for label in impls if label.startswith("logbuf") and results["params"]["peer_python"] in label)
    peer = next(label for label in impls if label.startswith("pyaeron"))
    lines = [
        "| case | round | logbuf | pyaeron | pyzmq | logbuf / pyaeron | logbuf / pyzmq | load (1 min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in results["cases"]:
        case = row["case"]
        ratios = [row.get("logbuf_over_pyaeron"), row.get("logbuf_over_pyzmq")]
        lines.append(
            f"| {case} | {row['round']} | {cell(case, row[ours])} | {cell(case, row[peer])} | "
            f"{cell(case, row['pyzmq'])} | "
            + " | ".join(f"{r:.2f}" if r else "-" for r in ratios)
            + f" | {row[ours].get('load_1m', 0):.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput case")
    parser.add_argument("--pings", type=int, default=20_000, help="round trips per latency case")
    parser.add_argument("--rounds", type=int, default=2, help="times each case runs (two by default)")
    parser.add_argument("--quick", action="store_true", help="1 s per case, 5,000 round trips")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--no-build", action="store_true", help="do not reinstall this tree into the peer venv")
    parser.add_argument(
        "--table", action="store_true", help="print perf/results/peers.json as README's table; run nothing"
    )
    args = parser.parse_args(argv)
    if args.table:
        with open(os.path.join(ROOT, "perf", "results", "peers.json"), encoding="utf-8") as f:
            print(markdown_table(json.load(f)))
        return 0
    if args.quick:
        args.seconds, args.pings = 1.0, 5_000
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; choose from {','.join(CASES)}")
    python312 = peer_python(build=not args.no_build)
    version312 = subprocess.run(
        [python312, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    impls = {
        f"logbuf py{sys.version_info.major}.{sys.version_info.minor}": (sys.executable, "logbuf"),
        f"logbuf py{version312}": (python312, "logbuf"),
        f"pyaeron py{version312}": (python312, "pyaeron"),
        "pyzmq": (sys.executable, "pyzmq"),
    }
    params = {"seconds": args.seconds, "pings": args.pings}
    results = new_results("peers", **params, rounds=args.rounds, implementations=list(impls), peer_python=version312)
    timeout_s = args.seconds * 4 + args.pings * 0.002 + 120
    ours, peer = f"logbuf py{version312}", f"pyaeron py{version312}"
    for case in cases:
        for round_ in range(1, args.rounds + 1):
            row: dict[str, Any] = {"case": case, "round": round_}
            for label, (python, impl) in impls.items():
                row[label] = run_case(python, impl, case, params, timeout_s)
            row["logbuf_over_pyaeron"] = ratio(case, row[ours], row[peer])
            row["logbuf_over_pyzmq"] = ratio(case, row[ours], row["pyzmq"])
            results["cases"].append(row)
            cells = " | ".join(f"{label} {headline(case, row[label])}" for label in impls)
            r = row["logbuf_over_pyaeron"]
            print(
                f"{case:<20} #{round_} {cells} | logbuf/pyaeron {r:.2f}x" if r else f"{case:<20} #{round_} {cells}",
                flush=True,
            )
    failures = [(row["case"], label) for row in results["cases"] for label in impls if "error" in row[label]]
    write_results(results)
    print(markdown_table(results))
    for case, label in failures:
        print(f"FAILED: {case} {label}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
