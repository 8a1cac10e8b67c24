"""Archive system-test kit: a media driver per module, recorder processes (``logbuf-archive record``) and
an S3 API server (moto in server mode) for archives on object storage."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from logbuf.client import Aeron, Context, Publication
from logbuf.logbuffer.publication import OfferResult
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet, read_output
from logbuf.testing.host import free_tcp_port

# Credentials for the S3 API server the tests start (moto accepts any), set before any Spark JVM starts so
# that its Python workers inherit them; no request ever leaves 127.0.0.1.
for _name, _value in (
    ("AWS_ACCESS_KEY_ID", "logbuf-test"),
    ("AWS_SECRET_ACCESS_KEY", "logbuf-test"),
    ("AWS_DEFAULT_REGION", "us-east-1"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
):
    os.environ.setdefault(_name, _value)

ARCHIVE_DRIVER_ARGS = [
    "--ipc-term-length",
    "64k",
    "--driver-timeout",
    "2s",
    "--client-liveness-timeout",
    "2s",
    "--publication-linger-timeout",
    "1s",
    "--image-liveness-timeout",
    "2s",
    "--dir-delete-on-shutdown",
    "false",
]


def publish(pub: Publication, payloads: list[bytes], timeout_s: float = 20) -> tuple[list[int], list[int]]:
    """Offer each payload with reserved value = epoch microseconds (the jetstream convention);
    returns (reserved values, end positions)."""
    reserved, ends = [], []
    deadline = time.monotonic() + timeout_s
    for payload in payloads:
        stamp = time.time_ns() // 1_000

        def taken() -> int:
            result = pub.offer(payload, reserved_value=stamp)
            if result > 0:
                return result
            assert result in (OfferResult.BACK_PRESSURED, OfferResult.ADMIN_ACTION), OfferResult(result).name
            return 0

        ends.append(wait_until(taken, max(0.0, deadline - time.monotonic()), "publishing", max_idle_s=0.001))
        reserved.append(stamp)
    return reserved, ends


@dataclass
class RecorderProcess:
    """``logbuf-archive record`` in a child process; its output goes to a file shown on failure."""

    archive_dir: str
    driver_dir: str
    channel: str
    stream_id: int
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.archive_dir, f"recorder-{self.stream_id}.log")

    def start(self) -> RecorderProcess:
        os.makedirs(self.archive_dir, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "logbuf.archive.main",
                    "-d",
                    self.archive_dir,
                    "record",
                    "--channel",
                    self.channel,
                    "--stream-id",
                    str(self.stream_id),
                    "--driver-dir",
                    self.driver_dir,
                    "--segment-length",
                    "128k",
                    *self.extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def output(self) -> str:
        return read_output(self.log_path)

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM and wait; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"recorder did not stop in {timeout_s} s:\n{self.output()}") from None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)  # reaped: its pid is gone


@pytest.fixture(scope="module")
def archive_driver(request: pytest.FixtureRequest) -> Iterator[DriverProcess]:
    """One driver for a test module (64 KiB IPC terms); its error log must stay empty."""
    with DriverSet(request) as drivers:
        yield drivers(base=ARCHIVE_DRIVER_ARGS)


@pytest.fixture
def aeron(archive_driver: DriverProcess) -> Iterator[Aeron]:
    """A client of :func:`archive_driver`, for one test."""
    with Aeron.connect(Context(dir=archive_driver.dir)) as client:
        yield client


def archive_cli(archive: str | os.PathLike[str], *args: str) -> int:
    """``logbuf-archive -d ARCHIVE ...`` in this process (the root conftest undoes the logging it configures)."""
    from logbuf.archive.main import main

    return main(["-d", str(archive), "--log-level", "error", *args])


@dataclass
class S3Server:
    """moto's S3 API server on 127.0.0.1 (a real HTTP server speaking S3, not a mock of our code)."""

    port: int
    proc: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def uri(self, bucket: str, prefix: str = "") -> str:
        """An ``s3://`` URI that pyarrow (and so the Spark source and ``upload``) resolves to this server."""
        path = f"{bucket}/{prefix}".rstrip("/")
        return f"s3://{path}?endpoint_override={self.endpoint}&scheme=http&allow_bucket_creation=true"

    def new_bucket(self) -> str:
        import pyarrow.fs as pafs

        bucket = f"logbuf-{uuid.uuid4().hex[:12]}"
        fs, _ = pafs.FileSystem.from_uri(self.uri(bucket))
        fs.create_dir(bucket)
        return bucket


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One moto S3 server for the run, on a free loopback port, stopped at the end."""
    port = free_tcp_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out
        )
    try:

        def listening() -> bool:
            assert proc.poll() is None, f"moto server exited: {log.read_text(errors='replace')}"
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
            except OSError:
                return False

        wait_until(listening, 30, "the S3 server to listen")
        yield S3Server(port, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
