"""Spark test kit: one SparkSession (local[2]) for the whole run, one driver, recorded archives.

Spark's fixed costs are seconds (session 5-8 s, first Python data source query 5-10 s), so every
Spark test shares the session fixture; the archive is recorded once per run by a real driver and
a real recorder process and copied where a test corrupts it.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from logbuf.archive.catalog import Catalog, RecordingDescriptor
from logbuf.client import Aeron, Context, Publication
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet
from tests.archive.conftest import RecorderProcess
from tests.archive.conftest import publish as publish_stamped

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STREAM = 10
MAX_PAYLOAD = 1376  # MTU 1408 - 32: longer messages are fragmented


@dataclass
class Published:
    payloads: list[bytes]
    reserved: list[int]
    end_positions: list[int]
    session_id: int


def payloads_for(seed: int, count: int, max_length: int = 8000) -> list[bytes]:
    """Mixed sizes: empty, tiny, exactly one frame, one byte into a second fragment, up to 8000 B."""
    rng = random.Random(seed)
    return [
        rng.randbytes(rng.choice((0, 1, 31, 100, MAX_PAYLOAD, MAX_PAYLOAD + 1, 3000, rng.randrange(max_length))))
        for _ in range(count)
    ]


def publish(pub: Publication, payloads: list[bytes], timeout_s: float = 30) -> Published:
    """Offer each payload with reserved value = epoch microseconds (the jetstream convention)."""
    reserved, ends = publish_stamped(pub, payloads, timeout_s)
    return Published(payloads, reserved, ends, pub.session_id)


def recording_of(archive_dir: str, session_id: int) -> RecordingDescriptor | None:
    if not os.path.exists(os.path.join(archive_dir, "archive.catalog")):
        return None
    with Catalog.open(archive_dir) as catalog:
        found = [d for d in catalog.recordings() if d.session_id == session_id]
    return found[-1] if found else None


def await_recorded(archive_dir: str, session_id: int, position: int, timeout_s: float = 20) -> RecordingDescriptor:
    """Wait until the recording of ``session_id`` holds everything up to ``position``."""
    wait_until(
        lambda: (d := recording_of(archive_dir, session_id)) is not None and d.stop_position >= position,
        timeout_s,
        f"session {session_id} recorded up to {position}",
    )
    d = recording_of(archive_dir, session_id)
    assert d is not None
    return d


SPARK_DRIVER_ARGS = [
    "--ipc-term-length",
    "64k",
    "--driver-timeout",
    "10s",
    "--client-liveness-timeout",
    "10s",
    "--publication-linger-timeout",
    "1s",
    "--dir-delete-on-shutdown",
    "false",
]
"""Aeron's default liveness timeouts: this driver lives for the whole session, beside a Spark JVM and its
Python workers that keep both cores busy. A 2 s client liveness timeout (the archive tests' setting, where
a driver lives for one module) once timed out a client here: its keepalive thread was held off that long
(a full garbage collection of this big process holds the GIL for a quarter of a second on an idle machine,
several times that on a loaded one), and the next test got "client is closed"."""


@pytest.fixture(scope="session")
def spark_driver(request: pytest.FixtureRequest) -> Iterator[DriverProcess]:
    with DriverSet(request) as drivers:
        yield drivers(base=SPARK_DRIVER_ARGS)


@pytest.fixture
def aeron(spark_driver: DriverProcess) -> Iterator[Aeron]:
    """A client per test: none idles through other tests' Spark jobs."""
    with Aeron.connect(Context(dir=spark_driver.dir)) as client:
        yield client


@dataclass
class RecordedArchive:
    archive_dir: str
    recording: RecordingDescriptor
    published: Published


def record_archive(
    driver: DriverProcess, archive_dir: str, stream_id: int, count: int, seed: int, extra: list[str]
) -> RecordedArchive:
    """``count`` mixed messages published on aeron:ipc ``stream_id``, recorded by a recorder process
    (with ``extra`` options) and stopped. Its own client, closed after: none idles between tests."""
    recorder = RecorderProcess(archive_dir, driver.dir, "aeron:ipc", stream_id, extra).start()
    try:
        with Aeron.connect(Context(dir=driver.dir)) as aeron:
            pub = aeron.add_publication("aeron:ipc", stream_id)
            wait_until(lambda: pub.is_connected, 20, "the recorder to subscribe")
            published = publish(pub, payloads_for(seed, count))
            await_recorded(archive_dir, published.session_id, published.end_positions[-1])
            pub.close()
            wait_until(
                lambda: (d := recording_of(archive_dir, published.session_id)) is not None and not d.active,
                20,
                "the recording to stop",
            )
    finally:
        assert recorder.stop() == 0, recorder.output()
    d = recording_of(archive_dir, published.session_id)
    assert d is not None
    return RecordedArchive(archive_dir, d, published)


@pytest.fixture(scope="session")
def recorded(spark_driver: DriverProcess, tmp_path_factory: pytest.TempPathFactory) -> RecordedArchive:
    """3000 mixed messages (about a third fragmented) on aeron:ipc stream 10, recorded and stopped."""
    return record_archive(spark_driver, str(tmp_path_factory.mktemp("spark-archive")), STREAM, 3000, 1, [])


@pytest.fixture(scope="session")
def recorded_with_checksums(spark_driver: DriverProcess, tmp_path_factory: pytest.TempPathFactory) -> RecordedArchive:
    """500 mixed messages on aeron:ipc stream 12, recorded with ``--checksum crc32``."""
    archive_dir = str(tmp_path_factory.mktemp("spark-archive-crc"))
    return record_archive(spark_driver, archive_dir, 12, 500, 12, ["--checksum", "crc32"])


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local[2] session for the run: UI off, 2 shuffle partitions, workers on this Python."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from logbuf.archive.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("logbuf-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()
