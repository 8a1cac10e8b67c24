"""The source through Spark Connect: a Connect server started with pyspark's ``spark-submit`` (local[1]), a
client session from ``SparkSession.builder.remote(...)`` (the ``connect`` extra's grpcio and protos)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from logbuf.testing import wait_until
from logbuf.testing.host import free_tcp_port
from tests.archive.test_spark.conftest import RecordedArchive
from tests.archive.test_spark.test_spark_cluster import cluster_env, spark_home

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("spark-connect")
    port = free_tcp_port()
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

        wait_until(listening, 120, "the Spark Connect server to listen")
        yield f"sc://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


CLIENT = """
import hashlib, json, sys
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from logbuf.archive.spark import register

url, archive, stream_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
spark = SparkSession.builder.remote(url).getOrCreate()
try:
    register(spark)
    df = spark.read.format("logbuf").load(archive)
    rows = df.filter(F.col("stream_id") == stream_id).orderBy("position").collect()
    print(json.dumps({
        "rows": [[r.position, hashlib.sha256(bytes(r.payload)).hexdigest()] for r in rows],
        "other_stream": df.filter(F.col("stream_id") == 999).count(),
        "session": type(spark).__module__,
    }))
finally:
    spark.stop()
"""


def test_a_spark_connect_client_reads_an_archive(connect_url: str, recorded: RecordedArchive) -> None:
    # The client runs in its own process: a Connect session changes process-wide pyspark state (it sets
    # SPARK_CONNECT_MODE_ENABLED and more), which would turn the other tests' local session into one.
    client = subprocess.run(
        [sys.executable, "-c", CLIENT, connect_url, recorded.archive_dir, str(recorded.recording.stream_id)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert client.returncode == 0, client.stderr[-4000:]
    result = json.loads(client.stdout.strip().splitlines()[-1])
    published = recorded.published
    assert result["rows"] == [
        [end, hashlib.sha256(payload).hexdigest()] for end, payload in zip(published.end_positions, published.payloads)
    ]
    assert result["other_stream"] == 0
    assert result["session"] == "pyspark.sql.connect.session"
