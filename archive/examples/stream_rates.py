"""Messages and bytes per stream per second from a logbuf archive, written as Parquet.

The same command line runs on a laptop and on a cluster::

    python archive/examples/stream_rates.py ARCHIVE_DIR OUT        # local[*] when no master is set
    spark-submit archive/examples/stream_rates.py ARCHIVE_DIR OUT  # the master spark-submit gives
    spark-submit --master spark://HOST:7077 archive/examples/stream_rates.py s3://bucket/archive OUT

Each message's time is its reserved value read as epoch time (``--timestamp-unit``, default
microseconds: the jetstream relay's convention); messages with no stamp (reserved value 0) are
counted apart and left out of the per-second rows. It runs on the installed logbuf (``pip install``
it first; it never imports the source tree beside it). On a cluster, every executor must be able to
import ``logbuf.archive.spark`` (install logbuf there) and read ARCHIVE_DIR: a shared filesystem, or an
archive uploaded to object storage (``logbuf-archive upload s3://...``; ARCHIVE_DIR is then that URI, and
the executors need the store's credentials, e.g. ``AWS_ACCESS_KEY_ID`` in ``spark.executorEnv``).

Output columns: stream_id, second (timestamp, UTC), messages, bytes (payload bytes).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("archive_dir", help="the archive directory (logbuf-archive record -d DIR), or its URI")
    parser.add_argument("out", help="where to write the Parquet output (replaced if it exists)")
    parser.add_argument("--stream-id", default="", help="only these stream ids (comma-separated)")
    parser.add_argument(
        "--timestamp-unit",
        default="us",
        choices=("s", "ms", "us", "ns"),
        help="unit of the epoch time in each message's reserved value (default us)",
    )
    return parser


def stream_rates(
    spark: SparkSession, archive_dir: str, *, stream_ids: str = "", timestamp_unit: str = "us"
) -> tuple[DataFrame, int]:
    """(per stream and second: messages and bytes; how many messages had no timestamp)."""
    from pyspark.sql import functions as F

    from logbuf.archive.spark import register

    register(spark)
    reader = (
        spark.read.format("logbuf")
        .option("timestampFrom", "reserved_value")
        .option("timestampUnit", timestamp_unit)
        .option("mode", "DROPMALFORMED")
    )
    if stream_ids:
        reader = reader.option("streamId", stream_ids)
    messages = reader.load(archive_dir).select("stream_id", "timestamp", F.length("payload").alias("length"))
    unstamped = messages.filter(F.col("timestamp").isNull()).count()
    rates = (
        messages.filter(F.col("timestamp").isNotNull())
        .groupBy("stream_id", F.date_trunc("second", "timestamp").alias("second"))
        .agg(F.count("*").alias("messages"), F.sum("length").alias("bytes"))
        .orderBy("stream_id", "second")
    )
    return rates, unstamped


def session() -> SparkSession:
    """The session spark-submit configured, or local[*] when no master is set."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    SparkContext._ensure_initialized()  # the JVM: spark-submit's own, or one started here
    builder = SparkSession.builder.appName("logbuf-stream-rates").config("spark.sql.session.timeZone", "UTC")
    if not SparkConf().contains("spark.master"):  # SparkConf() now holds what spark-submit was given
        builder = builder.master("local[*]")
    return builder.getOrCreate()


def run(spark: SparkSession, args: argparse.Namespace) -> str:
    """Compute and write the rates; returns the one-line summary."""
    rates, unstamped = stream_rates(
        spark, args.archive_dir, stream_ids=args.stream_id, timestamp_unit=args.timestamp_unit
    )
    rates.write.mode("overwrite").parquet(args.out)
    written = spark.read.parquet(args.out)
    totals = written.groupBy().sum("messages", "bytes").first()
    messages, payload_bytes = (totals[0] or 0, totals[1] or 0) if totals is not None else (0, 0)
    return (
        f"stream_rates ({spark.sparkContext.master}): {written.count()} rows (stream, second), {messages} messages, {payload_bytes} bytes"
        f" -> {args.out}; {unstamped} messages without a timestamp"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import logbuf.archive.spark  # noqa: F401  (before a Spark JVM is started for nothing)
    except ImportError as e:
        print(f"stream_rates: logbuf is not installed in {sys.executable} ({e}); pip install logbuf", file=sys.stderr)
        return 2
    if "://" not in args.archive_dir and not os.path.isdir(args.archive_dir):
        print(f"stream_rates: {args.archive_dir} is not a directory", file=sys.stderr)
        return 2
    spark = session()
    try:
        print(run(spark, args))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
