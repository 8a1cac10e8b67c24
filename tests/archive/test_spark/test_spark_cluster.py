"""A real Spark standalone cluster: a master and two workers started from pyspark's own ``spark-class``, the
example job submitted with ``spark-submit --master spark://127.0.0.1:PORT``, reading an archive from the S3
API server, its result checked row for row. Every wait is bounded; every JVM is stopped (process groups)."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from logbuf.testing import wait_until
from logbuf.testing.host import free_tcp_port
from tests.archive.conftest import S3Server, archive_cli
from tests.archive.test_spark.conftest import RecordedArchive

pytestmark = pytest.mark.slow
REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "archive" / "examples" / "stream_rates.py"


def spark_home() -> pathlib.Path:
    import pyspark

    return pathlib.Path(pyspark.__file__).parent


@dataclass
class StandaloneCluster:
    master_url: str
    ui_port: int
    logs: pathlib.Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def state(self) -> dict[str, object]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    def output(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.logs.glob("*.log"))
        )


def cluster_env(work: pathlib.Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(work / "local"),
        SPARK_WORKER_DIR=str(work / "work"),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    return env


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    work = tmp_path_factory.mktemp("spark-cluster")
    logs = work / "logs"
    logs.mkdir()
    env = cluster_env(work)
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, ui_port = free_tcp_port(), free_tcp_port()
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", ui_port, logs)

    def start(name: str, *args: str) -> None:
        with open(logs / f"{name}.log", "wb") as out:
            cluster.procs.append(
                subprocess.Popen(
                    [spark_class, *args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui_port))  # fmt: skip
        wait_until(lambda: _answers(ui_port), 90, f"the master's web UI on {ui_port}\n{cluster.output()}")
        for i in (1, 2):
            start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "768m", "--webui-port", str(free_tcp_port()), "--work-dir", str(work / f"work-{i}"),
                  cluster.master_url)  # fmt: skip
        wait_until(lambda: cluster.state().get("aliveworkers") == 2, 90, f"two workers\n{cluster.output()}")
        yield cluster
    finally:
        for proc in cluster.procs:  # each JVM leads its process group, with the executors its worker started
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in cluster.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _answers(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=2).close()
        return True
    except OSError:
        return False


def test_the_example_job_on_a_standalone_cluster_reads_an_archive_from_s3(
    standalone_cluster: StandaloneCluster, recorded: RecordedArchive, s3_server: S3Server, tmp_path: pathlib.Path
) -> None:
    bucket = s3_server.new_bucket()
    uri = s3_server.uri(bucket, "archive")
    assert archive_cli(recorded.archive_dir, "upload", uri) == 0
    out = tmp_path / "rates"
    env = cluster_env(tmp_path)
    executor_env = [
        f"--conf=spark.executorEnv.{name}={os.environ[name]}"
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED")
    ]
    job = subprocess.run(
        [
            str(spark_home() / "bin" / "spark-submit"),
            "--master",
            standalone_cluster.master_url,
            "--conf=spark.executor.memory=512m",
            "--conf=spark.driver.memory=768m",
            "--conf=spark.executor.cores=1",
            "--conf=spark.ui.enabled=false",
            f"--conf=spark.pyspark.python={sys.executable}",
            f"--conf=spark.pyspark.driver.python={sys.executable}",
            *executor_env,
            str(EXAMPLE),
            uri,
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert job.returncode == 0, f"{job.stdout[-3000:]}\n{job.stderr[-6000:]}\n{standalone_cluster.output()}"
    assert f"stream_rates ({standalone_cluster.master_url})" in job.stdout
    published = recorded.published
    expected_messages: collections.Counter[int] = collections.Counter()
    expected_bytes: collections.Counter[int] = collections.Counter()
    for stamp, payload in zip(published.reserved, published.payloads):
        expected_messages[stamp // 1_000_000] += 1
        expected_bytes[stamp // 1_000_000] += len(payload)
    got = _read_parquet(out)
    assert sorted(got) == sorted(
        (recorded.recording.stream_id, second, expected_messages[second], expected_bytes[second])
        for second in expected_messages
    )
    assert f"{len(published.payloads)} messages, {sum(map(len, published.payloads))} bytes" in job.stdout
    apps = standalone_cluster.state().get("completedapps")
    assert isinstance(apps, list) and any(app.get("name") == "logbuf-stream-rates" for app in apps)


def _read_parquet(out: pathlib.Path) -> list[tuple[int, int, int, int]]:
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    column = table.column("second")
    per_second = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[column.type.unit]
    seconds = column.cast("int64").to_pylist()  # since the epoch, UTC, in the column's unit
    return [
        (stream_id, second // per_second, messages, payload_bytes)
        for stream_id, second, messages, payload_bytes in zip(
            table.column("stream_id").to_pylist(),
            seconds,
            table.column("messages").to_pylist(),
            table.column("bytes").to_pylist(),
        )
    ]


CHECK_JOB = """
import sys
from pyspark.sql import SparkSession
from logbuf.archive.spark import LogbufSourceError, register

spark = SparkSession.builder.appName("logbuf-executor-check").getOrCreate()
try:
    register(spark)
    print("registered")
except LogbufSourceError as e:
    print(f"refused: {e}")
finally:
    spark.stop()
"""


def test_executors_without_logbuf_are_named_when_the_source_is_registered(
    standalone_cluster: StandaloneCluster, tmp_path: pathlib.Path
) -> None:
    bare = tmp_path / "bare"  # this Python, without logbuf or any of its dependencies
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    job = tmp_path / "check.py"
    job.write_text(CHECK_JOB)
    run = subprocess.run(
        [
            str(spark_home() / "bin" / "spark-submit"),
            "--master",
            standalone_cluster.master_url,
            "--conf=spark.executor.memory=512m",
            "--conf=spark.driver.memory=512m",
            "--conf=spark.executor.cores=1",
            "--conf=spark.ui.enabled=false",
            f"--conf=spark.pyspark.python={bare / 'bin' / 'python'}",
            f"--conf=spark.pyspark.driver.python={sys.executable}",
            str(job),
        ],
        env=cluster_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    assert f"refused: logbuf is not installed in the executors' Python ({bare / 'bin' / 'python'}" in run.stdout
    assert "import pyarrow: ModuleNotFoundError: No module named 'pyarrow'" in run.stdout
