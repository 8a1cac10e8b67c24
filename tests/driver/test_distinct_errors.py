"""The driver's distinct error log groups errors by kind: a client that provokes the same refusal over and
over with different streams, channels or file names fills one record's count, not the log."""

from __future__ import annotations

import pytest

from logbuf.client import Aeron, Context, RegistrationError
from logbuf.conduit.cnc import CncFile
from logbuf.conduit.error_log import ErrorObservation, read_error_log
from tests.driver.conftest import DriverProcess


def error_log(directory: str) -> list[ErrorObservation]:
    cnc = CncFile.open(directory)
    try:
        return read_error_log(cnc.error_log)
    finally:
        cnc.close()


@pytest.mark.parametrize(
    "driver_args",
    [
        [
            *("--counters-buffer-length", "16k", "--client-counters-share", "1"),
            "--ipc-term-length",
            "64k",
            "--dir-delete-on-shutdown",
            "false",
        ]
    ],
)
def test_repeated_refusals_naming_different_streams_and_channels_are_one_record_with_a_count(
    media_driver: DriverProcess,
) -> None:
    media_driver.expected_errors += ["counters are full", "INVALID_CHANNEL"]
    with Aeron.connect(Context(dir=media_driver.dir, driver_timeout_ns=8_000_000_000)) as aeron:
        held = []
        with pytest.raises(RegistrationError, match="counters are full"):
            for stream_id in range(1, 200):
                held.append(aeron.add_publication("aeron:ipc", stream_id))
        refusals = 1
        for i in range(30):  # each names another stream, channel and log file
            with pytest.raises(RegistrationError, match="counters are full"):
                aeron.add_publication(f"aeron:ipc?alias=hog-{i}", 1000 + i)
            refusals += 1
        with pytest.raises(RegistrationError, match="INVALID_CHANNEL"):
            aeron.add_publication("aeron:ipc?term-length=1000", 7)
    records = error_log(media_driver.dir)
    counters_full = [r for r in records if "counters are full" in r.text]
    assert [r.count for r in counters_full] == [refusals]  # once an entry per refusal
    assert counters_full[0].first_observation_ms <= counters_full[0].last_observation_ms
    assert [r.count for r in records if "INVALID_CHANNEL" in r.text] == [1]  # another kind: its own record
