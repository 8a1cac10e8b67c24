"""Archives on object storage: locations, globs, ``logbuf-archive upload`` to a directory and to an S3 API
server (moto in server mode on 127.0.0.1), and reading back through the Spark source's reader (no session)."""

from __future__ import annotations

import datetime
import pathlib

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from pyspark.sql.datasource import GreaterThan

from logbuf.archive import catalog_descriptor as cat
from logbuf.archive.catalog import Catalog, CatalogError
from logbuf.archive.spark import LogbufDataSource, LogbufFilteringReader, LogbufReader, LogbufSourceError
from logbuf.archive.spark_frames import arrow_schema
from logbuf.archive.storage import (
    ArchiveLocation,
    StorageError,
    expand_locations,
    open_catalog,
    parse_location,
    upload,
)
from logbuf.testing import wait_until
from tests.archive.conftest import S3Server, archive_cli
from tests.archive.test_spark.synthetic import build_archive, recording


def read_rows(location: str, **options: str) -> pa.Table:
    source = LogbufDataSource({"path": location, **options})
    reader = source.reader(source.schema())
    assert isinstance(reader, LogbufReader)
    schema = arrow_schema(reader.options.corrupt_column_or_none)
    if reader.options.several:
        schema = schema.insert(0, pa.field("archive", pa.string()))
    return pa.Table.from_batches([b for p in reader.partitions() for b in reader.read(p)], schema=schema)


def test_locations_parse_paths_and_uris_and_globs_find_archives(tmp_path: pathlib.Path) -> None:
    assert parse_location(f"file://{tmp_path}/a%20b") == ArchiveLocation(f"{tmp_path}/a b")
    assert parse_location(f"file:{tmp_path}") == ArchiveLocation(str(tmp_path))
    assert parse_location("s3://bucket/x?scheme=http").uri == "s3://bucket/x?scheme=http"
    assert not parse_location("s3://bucket/x").is_local
    for day in ("day-1", "day-2", "other"):
        build_archive(tmp_path / day, [recording(0, 10, 5, seed=1)])
    (tmp_path / "day-3").mkdir()  # no catalog: not an archive
    assert [loc.uri for loc in expand_locations([str(tmp_path / "day-*")])] == [
        str(tmp_path / "day-1"),
        str(tmp_path / "day-2"),
    ]
    with pytest.raises(ValueError, match="no archive directory .* matches"):
        expand_locations([str(tmp_path / "night-*")])


def test_upload_to_a_directory_is_readable_like_the_original(tmp_path: pathlib.Path) -> None:
    recs = [recording(0, 10, 200, seed=2), recording(1, 20, 100, seed=3)]
    build_archive(tmp_path / "src", recs)
    assert archive_cli(tmp_path / "src", "upload", f"file://{tmp_path / 'dst'}") == 0
    original = read_rows(str(tmp_path / "src"))
    copied = read_rows(str(tmp_path / "dst"))
    assert copied.equals(original) and copied.num_rows == 300
    assert archive_cli(tmp_path / "src", "upload", str(tmp_path / "src")) == 2  # onto itself: refused


def test_upload_of_an_active_recording_stops_at_its_last_complete_segment(tmp_path: pathlib.Path) -> None:
    rec = recording(0, 10, 300, seed=4)  # about 2.5 segments of 128 KiB
    build_archive(tmp_path / "src", [rec])
    with Catalog.open_writable(tmp_path / "src") as writer:  # make it look live again: ACTIVE, this process
        cat.flags_ordered(writer._buffer, cat.entry_offset(0), cat.FLAG_ACTIVE)
        writer.position_writer(0).heartbeat(2**62)
        assert writer.recording(0).active
        report = upload(tmp_path / "src", parse_location(str(tmp_path / "dst")))
    assert report.segments == ["0-0.rec", "0-131072.rec"]  # the third is still being written
    with open_catalog(parse_location(str(tmp_path / "dst"))) as copy:
        assert copy.recording(0).stop_position == 2 * rec.segment_length
    rows = read_rows(str(tmp_path / "dst"))
    assert rows.column("position").to_pylist() == [m[2] for m in rec.messages if m[2] <= 2 * rec.segment_length]


def test_an_archive_uploaded_to_s3_reads_back_row_for_row(tmp_path: pathlib.Path, s3_server: S3Server) -> None:
    recs = [recording(0, 10, 300, seed=5), recording(1, 20, 150, seed=6)]
    build_archive(tmp_path, recs)
    bucket = s3_server.new_bucket()
    uri = s3_server.uri(bucket, "archives/a")
    assert archive_cli(tmp_path, "upload", uri) == 0
    fs, _ = pafs.FileSystem.from_uri(uri)
    names = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(f"{bucket}/archives/a")))
    assert names == sorted([cat.CATALOG_FILE_NAME] + [p.name for p in tmp_path.glob("*.rec")])
    assert archive_cli(tmp_path, "upload", uri) == 0  # nothing changed: nothing new to copy
    remote = read_rows(uri)
    assert remote.equals(read_rows(str(tmp_path)))
    assert remote.num_rows == 450
    # A position range reads only its byte range of the remote segment.
    lo, hi = recs[0].messages[100][2], recs[0].messages[120][2]
    ranged = read_rows(uri, recordingId="0", startPosition=str(lo), stopPosition=str(hi))
    assert ranged.column("position").to_pylist() == [m[2] for m in recs[0].messages[101:121]]
    # A glob over the bucket: every archive, with an archive column.
    assert archive_cli(tmp_path, "upload", s3_server.uri(bucket, "archives/b")) == 0
    both = read_rows(s3_server.uri(bucket, "archives/*"))
    assert both.column_names[0] == "archive" and both.num_rows == 900
    assert {a.split("?")[0] for a in both.column("archive").to_pylist()} == {
        f"s3://{bucket}/archives/a",
        f"s3://{bucket}/archives/b",
    }
    with pytest.raises(CatalogError, match="no archive catalog at s3://"):
        open_catalog(parse_location(s3_server.uri(bucket, "nothing-here")))
    with pytest.raises(LogbufSourceError, match="a streaming read follows one archive"):
        source = LogbufDataSource({"path": s3_server.uri(bucket, "archives/*")})
        source.streamReader(source.schema())


def test_a_missing_remote_segment_is_a_corrupt_record(tmp_path: pathlib.Path, s3_server: S3Server) -> None:
    rec = recording(0, 10, 300, seed=7)
    build_archive(tmp_path, [rec])
    bucket = s3_server.new_bucket()
    uri = s3_server.uri(bucket, "a")
    assert archive_cli(tmp_path, "upload", uri) == 0
    fs, _ = pafs.FileSystem.from_uri(uri)
    fs.delete_file(f"{bucket}/a/0-131072.rec")
    table = read_rows(uri)
    corrupt = table.filter(table.column("_corrupt_record").is_valid()).to_pylist()
    assert len(corrupt) == 1 and "is missing" in corrupt[0]["_corrupt_record"]
    assert corrupt[0]["position"] == rec.segment_length
    assert table.schema.equals(arrow_schema("_corrupt_record"))


def test_upload_follow_repeats_until_sigterm(tmp_path: pathlib.Path) -> None:
    import signal
    import subprocess
    import sys

    build_archive(tmp_path / "src", [recording(0, 10, 50, seed=8)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "logbuf.archive.main", "-d", str(tmp_path / "src"), "--log-level", "error",
         "upload", str(tmp_path / "dst"), "--follow", "100ms"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: (tmp_path / "dst" / cat.CATALOG_FILE_NAME).exists(), 30, "the first upload")
        build_archive(tmp_path / "src2", [recording(0, 10, 5, seed=9)])  # unrelated: the loop keeps going
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out.count("uploaded ") >= 1 and "uploaded 1 segment files" in out
    assert read_rows(str(tmp_path / "dst")).num_rows == 50


def test_the_time_index_goes_up_with_the_segments_and_prunes_remote_reads(
    tmp_path: pathlib.Path, s3_server: S3Server
) -> None:
    rec = recording(0, 10, 600, seed=7)  # stamped 1.7e15 + i µs, ~5 segments
    build_archive(tmp_path, [rec])
    assert archive_cli(tmp_path, "index") == 0
    uri = s3_server.uri(s3_server.new_bucket(), "timed")
    assert archive_cli(tmp_path, "upload", uri) == 0
    fs, path = pafs.FileSystem.from_uri(uri)
    assert fs.get_file_info(f"{path}/0.times").size == (tmp_path / "0.times").stat().st_size
    cut = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(microseconds=1_700_000_000_000_550)
    source = LogbufDataSource({"path": uri, "timestampFrom": "reserved_value", "maxPartitionBytes": "0"})
    reader = source.reader(source.schema())
    assert isinstance(reader, LogbufFilteringReader)
    everything = len(reader.partitions())
    list(reader.pushFilters([GreaterThan(("timestamp",), cut)]))
    assert len(reader.partitions()) == 1 < everything
    rows = pa.Table.from_batches([b for p in reader.partitions() for b in reader.read(p)])
    assert rows.column("reserved_value").to_pylist() == [m[1] for m in rec.messages[551:]]


@pytest.mark.parametrize(
    ("uri", "hint"),
    [
        ("ftp://host/archive", ""),
        ("webhdfs://127.0.0.1:9870/archive", "for WebHDFS use hdfs://"),
        ("s3a://bucket/archive", "use s3://"),
    ],
)
def test_an_unsupported_scheme_is_an_error_naming_it_when_reading_and_uploading(
    tmp_path: pathlib.Path, uri: str, hint: str
) -> None:
    scheme = uri.split("://")[0]
    with pytest.raises(LogbufSourceError, match=f"{uri}: unsupported scheme '{scheme}'.*s3://.*hdfs://.*{hint}"):
        LogbufDataSource({"path": uri}).schema()
    build_archive(tmp_path, [recording(0, 10, 5, seed=1)])
    assert archive_cli(tmp_path, "upload", uri) == 2


def test_hdfs_without_a_hadoop_client_is_an_error_naming_what_it_needs() -> None:
    """No HDFS can run here (no namenode on PyPI, Debian or npm; Spark's jars are client-only); where
    pyarrow cannot load libhdfs and a JVM, the error says what hdfs:// needs instead of pyarrow's dlopen list."""
    try:
        pafs.FileSystem.from_uri("hdfs://127.0.0.1:1/")
    except (OSError, ValueError):
        pass
    else:  # pragma: no cover - a machine with a Hadoop client
        pytest.skip("pyarrow loads libhdfs here: nothing to report")
    source = LogbufDataSource({"path": "hdfs://127.0.0.1:1/archive"})
    reader = source.reader(source.schema())
    with pytest.raises(StorageError, match=r"cannot open hdfs://127.0.0.1:1/archive: .*libhdfs.so .*JAVA_HOME"):
        reader.partitions()
