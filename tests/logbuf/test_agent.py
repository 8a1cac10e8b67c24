"""Agent settings: CPU lists for the duty cycle's affinity."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from logbuf.agent import claim_cpu
from logbuf.errors import ConfigurationError


def test_cpu_lists_parse_and_name_what_is_wrong() -> None:
    from logbuf.agent import parse_cpu_list

    assert parse_cpu_list("") == frozenset()
    assert parse_cpu_list("0") == {0}
    assert parse_cpu_list("0-1") == {0, 1} == parse_cpu_list("1, 0")
    with pytest.raises(ConfigurationError, match=r"'x' is not a CPU number or a range like 0-3"):
        parse_cpu_list("0,x")
    with pytest.raises(ConfigurationError, match=r"'3-1' is not a CPU number"):
        parse_cpu_list("3-1")
    with pytest.raises(ConfigurationError, match=r"CPU \[4096\] not available"):
        parse_cpu_list("4096")


def test_auto_placement_gives_each_claimant_its_own_cpu_highest_first(tmp_path: Path) -> None:
    allowed = sorted(os.sched_getaffinity(0), reverse=True)
    if len(allowed) < 2:
        pytest.skip(f"this process may use only CPU {allowed}: auto placement pins nothing there")
    claims = [claim_cpu(str(tmp_path)) for _ in allowed]
    try:
        assert [c.cpu for c in claims if c is not None] == allowed
        assert claim_cpu(str(tmp_path)) is None  # all held: share, unpinned
        claims[0].release()  # type: ignore[union-attr]
        again = claim_cpu(str(tmp_path))
        assert again is not None and again.cpu == allowed[0]
        again.release()
    finally:
        for c in claims:
            if c is not None:
                c.release()


def test_auto_placement_pins_nothing_on_one_cpu(tmp_path: Path) -> None:
    code = (
        "import os, sys; from logbuf.agent import claim_cpu; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        f"sys.exit(0 if claim_cpu({str(tmp_path)!r}) is None else 1)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_a_claim_dies_with_its_process(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing is claimed")
    code = f"from logbuf.agent import claim_cpu; c = claim_cpu({str(tmp_path)!r}); print(c.cpu, flush=True); input()"
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            taken = int(child.stdout.readline())
            mine = claim_cpu(str(tmp_path))
            assert mine is not None and mine.cpu != taken
            mine.release()
        finally:
            child.kill()
            child.wait(10)
    first = claim_cpu(str(tmp_path))
    assert first is not None and first.cpu == taken  # free again once the holder died
    first.release()
