"""A real Spark standalone cluster: a master and two workers started from pyspark's own ``spark-class``, the
example job submitted with ``spark-submit --master spark://127.0.0.1:PORT``, reading an archive from the S3
API server, its result checked row for row. The workers' own Python (``python3`` on their PATH) has no logbuf,
as on a cluster nobody installed it on: the guide's recipe ships a packed virtual environment with
``--archives`` instead, and the same job runs on it. Every wait is bounded; every JVM is stopped (process
groups)."""

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
from tests.support.wheel import Wheel

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
    work: pathlib.Path
    worker_python: pathlib.Path
    """The workers' own ``python3``: first on their PATH, without logbuf or any of its dependencies."""
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
    bare = work / "worker-python"  # this Python, without logbuf or any of its dependencies
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    env = cluster_env(work)
    env["PATH"] = f"{bare / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, ui_port = free_tcp_port(), free_tcp_port()
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", ui_port, logs, work, bare / "bin" / "python3")

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
    assert sorted(_read_parquet(out)) == expected_rates(recorded)
    assert f"{len(published.payloads)} messages, {sum(map(len, published.payloads))} bytes" in job.stdout
    apps = standalone_cluster.state().get("completedapps")
    assert isinstance(apps, list) and any(app.get("name") == "logbuf-stream-rates" for app in apps)


def expected_rates(recorded: RecordedArchive) -> list[tuple[int, int, int, int]]:
    """(stream id, second, messages, payload bytes) per second of the reserved values' epoch microseconds."""
    messages: collections.Counter[int] = collections.Counter()
    payload_bytes: collections.Counter[int] = collections.Counter()
    for stamp, payload in zip(recorded.published.reserved, recorded.published.payloads):
        messages[stamp // 1_000_000] += 1
        payload_bytes[stamp // 1_000_000] += len(payload)
    return sorted(
        (recorded.recording.stream_id, second, messages[second], payload_bytes[second]) for second in messages
    )


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


@pytest.fixture(scope="module")
def packed_environment(logbuf_wheel: Wheel, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The guide's recipe (docs/guides/spark.md, "Shipping the environment"): a fresh virtual environment
    without the system's site packages, logbuf and what executors need installed from the run's wheel and the
    package index, packed by venv-pack. The archive, ``logbuf-env.tar.gz``, lies beside the environment it was
    packed from, ``logbuf-env``."""
    work = tmp_path_factory.mktemp("packed-env")
    env_dir, packed = work / "logbuf-env", work / "logbuf-env.tar.gz"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=120)
    install = subprocess.run(
        [str(env_dir / "bin" / "pip"), "install", "-q", f"{logbuf_wheel.path}[spark-executor]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if install.returncode != 0 and not os.environ.get("CI"):
        pytest.skip(f"the executors' packages could not be installed (offline?): {install.stderr[-500:]}")
    assert install.returncode == 0, install.stdout + install.stderr
    done = subprocess.run(
        [sys.executable, "-m", "venv_pack", "-p", str(env_dir), "-o", str(packed), "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return packed


def test_a_packed_environment_shipped_with_archives_runs_the_job_where_the_workers_python_has_no_logbuf(
    standalone_cluster: StandaloneCluster,
    recorded: RecordedArchive,
    packed_environment: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    env = cluster_env(tmp_path)
    del env["PYSPARK_PYTHON"]  # the executors' Python is what each command below says
    out = tmp_path / "rates"
    # The driver runs the source's planning (schema, partitions) in a Python worker of its own, started with
    # spark.pyspark.python too: submitted from a directory where ./environment is the environment that was packed.
    (tmp_path / "environment").symlink_to(packed_environment.parent / "logbuf-env", target_is_directory=True)

    def submit(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(spark_home() / "bin" / "spark-submit"),
                "--master",
                standalone_cluster.master_url,
                "--conf=spark.executor.memory=512m",
                "--conf=spark.driver.memory=512m",
                "--conf=spark.executor.cores=1",
                "--conf=spark.ui.enabled=false",
                f"--conf=spark.pyspark.driver.python={sys.executable}",
                *options,
                str(EXAMPLE),
                recorded.archive_dir,
                str(out),
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    # Without the archive, on the workers' own Python (Spark's default name, found on each worker's PATH):
    # register() names the missing install before any data is read.
    bare = submit("--conf=spark.pyspark.python=python3")
    assert bare.returncode != 0, bare.stdout[-3000:]
    # spark-submit prints the Python driver's stderr, and so its traceback, on its own stdout
    refused = [line for line in bare.stdout.splitlines() if "LogbufSourceError" in line]
    assert refused, f"{bare.stdout[-3000:]}\n{bare.stderr[-6000:]}"
    assert (
        "LogbufSourceError: logbuf is not installed in the executors' Python "
        f"({standalone_cluster.worker_python}; spark.pyspark.python=python3)"
    ) in refused[-1], refused
    assert "import pyarrow: ModuleNotFoundError: No module named 'pyarrow'" in refused[-1]
    assert not out.exists()

    shipped = submit(
        f"--archives={packed_environment}#environment", "--conf=spark.pyspark.python=./environment/bin/python"
    )
    assert shipped.returncode == 0, f"{shipped.stdout[-3000:]}\n{shipped.stderr[-6000:]}\n{standalone_cluster.output()}"
    assert sorted(_read_parquet(out)) == expected_rates(recorded)
    published = recorded.published
    assert f"{len(published.payloads)} messages, {sum(map(len, published.payloads))} bytes" in shipped.stdout
    # Spark unpacked the archive beside each executor it started, and the executors' Python came from there.
    assert list(standalone_cluster.work.glob("work-*/app-*/*/environment/bin/python"))
