"""The source through Spark Connect: a Connect server started with pyspark's ``spark-submit`` (local[1]), a
client session from ``SparkSession.builder.remote(...)`` (the ``connect`` extra's grpcio and protos)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.archive.conftest import await_, free_port
from tests.archive.test_spark.conftest import RecordedArchive
from tests.archive.test_spark.test_spark_cluster import cluster_env, spark_home

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("spark-connect")
    port = free_port()
    log = work / "connect-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(spark_home() / "bin" / "spark-submit"),
                "--master",
                "local[1]",
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--conf=spark.ui.enabled=false",
                "--conf=spark.driver.memory=768m",
                "--conf=spark.connect.grpc.binding.address=127.0.0.1",
                f"--conf=spark.connect.grpc.binding.port={port}",
                f"--conf=spark.pyspark.python={sys.executable}",
                "spark-internal",
            ],
            env=cluster_env(work),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def listening() -> bool:
            assert proc.poll() is None, f"the Connect server exited:\n{log.read_text(errors='replace')[-4000:]}"
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
            except OSError:
                return False

        await_(listening, 120, "the Spark Connect server to listen")
        yield f"sc://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_spark_connect_client_reads_an_archive(connect_url: str, recorded: RecordedArchive) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from logbuf.archive.spark import register

    spark = SparkSession.builder.remote(connect_url).getOrCreate()
    try:
        register(spark)
        df = spark.read.format("logbuf").load(recorded.archive_dir)
        rows = df.filter(F.col("stream_id") == recorded.recording.stream_id).orderBy("position").collect()
        assert [bytes(r.payload) for r in rows] == recorded.published.payloads
        assert [r.position for r in rows] == recorded.published.end_positions
        assert df.filter(F.col("stream_id") == 999).count() == 0
    finally:
        spark.stop()
