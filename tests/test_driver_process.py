"""The test kit's driver processes (logbuf/testing/driver_process.py): started and waited for, restarted
in the same directory, and failing the test on driver errors it did not expect, with a report."""

from __future__ import annotations

import os

import pytest

from logbuf.client import Aeron, Context, RegistrationError
from logbuf.conduit.cnc import CncFile, is_driver_active
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet


def provoke_an_invalid_channel_error(driver: DriverProcess) -> None:
    with Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=5_000_000_000)) as aeron:
        with pytest.raises(RegistrationError, match="INVALID_CHANNEL"):
            aeron.add_publication("aeron:carrier-pigeon", 1)


def test_an_unexpected_driver_error_fails_with_a_report_of_counters_and_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    drivers = DriverSet()
    driver = drivers()
    provoke_an_invalid_channel_error(driver)
    with pytest.raises(AssertionError, match=r"unexpected errors: .*INVALID_CHANNEL"):
        drivers.close()
    report = capsys.readouterr().out
    assert f"=== driver {driver.dir}" in report
    assert "Errors" in report and "error (x1): INVALID_CHANNEL" in report  # the counters and the error log
    assert "logbuf.driver.main" in report  # its output, which starts with its command line
    assert not driver.alive and not os.path.exists(driver.dir) and not os.path.exists(driver.log_path)


@pytest.mark.parametrize("opt_out", ["expected", "unchecked"])
def test_a_test_may_expect_driver_errors(opt_out: str, capsys: pytest.CaptureFixture[str]) -> None:
    drivers = DriverSet()
    driver = drivers()
    if opt_out == "expected":
        driver.expected_errors.append("INVALID_CHANNEL")
    else:
        driver.check_errors = False
    provoke_an_invalid_channel_error(driver)
    drivers.close()
    assert "=== driver" not in capsys.readouterr().out  # nothing failed: no report
    assert not driver.alive


def test_a_restart_in_the_same_directory_waits_for_the_new_driver(driver_factory: DriverSet) -> None:
    driver = driver_factory("--driver-timeout", "1s")
    first_pid = driver.pid
    driver.kill()
    # a new driver takes the directory over once the heartbeat is stale
    wait_until(
        lambda: not is_driver_active(driver.dir, timeout_ns=1_000_000_000),
        10,
        "the killed driver's heartbeat to go stale",
    )
    driver.start()  # the dead driver's CnC, fresh enough for 5 s, is still there: start() waits for the new pid
    assert driver.alive and driver.pid != first_pid
    cnc = CncFile.open(driver.dir)
    try:
        assert cnc.pid == driver.pid
    finally:
        cnc.close()
    assert driver.system_counter("Errors") == 0 and driver.errors() == []


def test_a_driver_that_cannot_start_fails_naming_what_it_said() -> None:
    with DriverSet() as drivers:
        with pytest.raises(AssertionError, match=r"driver exited with \d+ at start; output:\n(.|\n)*ipc.term.length"):
            drivers("--ipc-term-length", "3")
