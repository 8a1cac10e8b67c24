"""No input may crash the native core: every entry point that takes a length or an offset, fuzzed.

Each entry point's Hypothesis body (``_native_fuzz_children``) runs in a child process, so a segfault
or an endless loop fails one test with the entry point and the seed instead of killing pytest. The run
is seeded and bounded: ``LOGBUF_FUZZ_SEED`` and ``LOGBUF_FUZZ_EXAMPLES`` (examples per entry point)
reproduce or widen it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
from typing import Any

import pytest

from tests.logbuf import _native_fuzz_children as children

CTX = mp.get_context("spawn")
SEED = int(os.environ.get("LOGBUF_FUZZ_SEED", "20261123"))
EXAMPLES = int(os.environ.get("LOGBUF_FUZZ_EXAMPLES", "150"))
TIMEOUT_S = 240.0
NO_REPORT = object()


def run_child(name: str, seed: int, examples: int) -> tuple[int | None, Any]:
    """Run one fuzz body in a child; (its exit code, or None if it had to be killed; its report)."""
    out: Any = CTX.Queue()
    child = CTX.Process(target=children.child_main, args=(name, seed, examples, out), daemon=True)
    child.start()
    deadline = time.monotonic() + TIMEOUT_S
    report: Any = NO_REPORT
    try:
        while time.monotonic() < deadline:
            try:
                report = out.get(timeout=0.2)
                break
            except queue.Empty:
                if not child.is_alive():
                    break
        child.join(max(deadline - time.monotonic(), 0.1))
        if child.is_alive():
            return None, report
        if report is NO_REPORT and child.exitcode == 0:
            report = out.get(timeout=10)  # put just before a clean exit
        return child.exitcode, report
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
        out.close()


@pytest.mark.parametrize("name", sorted(children.FUZZ))
def test_native_entry_point_survives_hostile_lengths_and_offsets(name: str) -> None:
    exitcode, report = run_child(name, SEED, EXAMPLES)
    rerun = f"LOGBUF_FUZZ_SEED={SEED} LOGBUF_FUZZ_EXAMPLES={EXAMPLES} pytest {__file__} -k {name}"
    assert exitcode is not None, f"{name} did not finish within {TIMEOUT_S:.0f} s (an endless loop?); rerun: {rerun}"
    assert exitcode >= 0, f"{name} crashed the process with {signal.Signals(-exitcode).name}; rerun: {rerun}"
    assert report is None and exitcode == 0, f"{name} failed (exit code {exitcode}); rerun: {rerun}\n{report}"


def test_the_harness_reports_a_crash_and_a_failure() -> None:
    """The check above can fail: a child killed by a signal, and one whose body raises, are both reported."""
    assert run_child("_segfault", SEED, 1) == (-signal.SIGSEGV, NO_REPORT)
    exitcode, report = run_child("_fails", SEED, 1)
    assert exitcode == 1 and "AssertionError: deliberately" in report


def test_values_outside_a_c_parameter_type_are_refused_before_native_code_runs() -> None:
    from logbuf import native

    with pytest.raises(OverflowError):
        native.get_int64_volatile(bytearray(8), 2**63)
    with pytest.raises(OverflowError):
        native.term_scan_block(bytearray(65536), 0, 2**31)
