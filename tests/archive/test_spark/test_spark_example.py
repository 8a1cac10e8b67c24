"""archive/examples/stream_rates.py: messages and bytes per stream per second, as Parquet."""

from __future__ import annotations

import collections
import pathlib
from typing import TYPE_CHECKING

import pytest

from logbuf.archive.examples import stream_rates
from tests.archive.test_spark.conftest import RecordedArchive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow


def test_stream_rates_writes_parquet_with_the_counts_per_stream_and_second(
    spark: SparkSession, recorded: RecordedArchive, tmp_path: pathlib.Path
) -> None:
    published = recorded.published
    out = tmp_path / "rates"
    args = stream_rates.build_parser().parse_args([recorded.archive_dir, str(out)])
    summary = stream_rates.run(spark, args)  # main() is the same plus the session's start and stop
    expected_messages: collections.Counter[int] = collections.Counter()
    expected_bytes: collections.Counter[int] = collections.Counter()
    for stamp, payload in zip(published.reserved, published.payloads):
        expected_messages[stamp // 1_000_000] += 1
        expected_bytes[stamp // 1_000_000] += len(payload)
    got = spark.read.parquet(str(out)).collect()
    assert {(r.stream_id, int(r.second.timestamp()), r.messages, r.bytes) for r in got} == {
        (recorded.recording.stream_id, second, expected_messages[second], expected_bytes[second])
        for second in expected_messages
    }
    assert f"{len(published.payloads)} messages, {sum(map(len, published.payloads))} bytes" in summary
    assert "0 messages without a timestamp" in summary
