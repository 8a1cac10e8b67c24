"""The ``topic`` column and ``topic`` filter pushdown: names from the recording's definition frames (before a
partition and inside it), definition frames making no row, rows exact with and without pushdown, payloads of
non-matching rows never gathered, and end to end through a real driver, recorder and SparkSession."""

from __future__ import annotations

import pathlib
import random
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import EqualTo, Filter, In, StringContains, StringEndsWith, StringStartsWith

from logbuf.archive.spark import LogbufDataSource, LogbufFilteringReader, planned_segments
from logbuf.archive.spark_frames import RowSpec, arrow_schema, parse_chunk, select_rows
from logbuf.archive.spark_topics import definitions_in
from logbuf.client import Aeron, Context
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess
from logbuf.topic_names import definition_value, topic_id
from tests.archive.conftest import RecorderProcess
from tests.archive.test_spark.conftest import await_recorded, recording_of
from tests.archive.test_spark.synthetic import SyntheticRecording, build_archive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOPICS = ("md.equities.AAPL", "md.equities.MSFT", "md.fx.EURUSD", "news.equities")


def topic_recording() -> tuple[SyntheticRecording, list[tuple[str | None, bytes]]]:
    """Definitions up front (as a publication writes them before a topic's first message), then 600 messages
    over three segments; a frame with a negative reserved value that is no definition; an unnamed topic id."""
    rec = SyntheticRecording(recording_id=0, stream_id=10, session_id=5)
    rng = random.Random(3)
    for name in TOPICS:
        rec.offer(name.encode(), reserved=definition_value(topic_id(name)))
    rec.offer(b"not a definition", reserved=-5)  # a plain message whose reserved value is negative
    expected: list[tuple[str | None, bytes]] = [(None, b"not a definition")]
    for i in range(600):
        name = TOPICS[i % len(TOPICS)] if i % 50 else None
        payload = rng.randbytes(rng.choice((0, 40, 300, 3000)))
        rec.offer(payload, reserved=topic_id(name) if name else topic_id("never.defined"))
        expected.append((name, payload))
    assert rec.position > 2 * rec.segment_length  # partitions after the first segment get names from the driver
    return rec, expected


def filtered_rows(archive: pathlib.Path, filters: list[Filter]) -> tuple[list[tuple[str | None, bytes]], list[Filter]]:
    source = LogbufDataSource({"path": str(archive)})
    reader = source.reader(source.schema())
    assert isinstance(reader, LogbufFilteringReader)
    rest = list(reader.pushFilters(filters))
    partitions = reader.partitions()
    assert len(planned_segments(partitions)) >= 3
    batches = [b for p in partitions for b in reader.read(p)]
    table = pa.Table.from_batches(batches, schema=arrow_schema("_corrupt_record"))
    assert table.column("_corrupt_record").null_count == table.num_rows
    return list(zip(table.column("topic").to_pylist(), table.column("payload").to_pylist())), rest


def test_topic_names_rows_and_pushed_topic_filters_are_exact(tmp_path: pathlib.Path) -> None:
    rec, expected = topic_recording()
    build_archive(tmp_path, [rec])
    rows, _ = filtered_rows(tmp_path, [])
    assert rows == expected  # no definition row; names in every segment; unnamed ids and plain frames: null
    cases: list[tuple[Filter, object]] = [
        (EqualTo(("topic",), "md.fx.EURUSD"), lambda t: t == "md.fx.EURUSD"),
        (StringStartsWith(("topic",), "md.equities."), lambda t: t.startswith("md.equities.")),
        (StringEndsWith(("topic",), ".equities"), lambda t: t.endswith(".equities")),
        (StringContains(("topic",), "equities"), lambda t: "equities" in t),
        (In(("topic",), ("md.equities.MSFT", "nope")), lambda t: t == "md.equities.MSFT"),
    ]
    for f, wanted in cases:
        got, rest = filtered_rows(tmp_path, [f])
        assert rest == [], f
        assert got == [(t, p) for t, p in expected if t is not None and wanted(t)], f  # type: ignore[operator]


def test_non_matching_rows_are_dropped_before_their_payloads_are_gathered(tmp_path: pathlib.Path) -> None:
    rec, expected = topic_recording()
    segment = np.frombuffer(bytes(rec.segment(0)), dtype="uint8")
    frames = parse_chunk(segment, 0, 0, rec.term_length, rec.descriptor())
    names: dict[int, str] = {}
    definitions = definitions_in(frames, names)
    assert sorted(names.values()) == sorted(TOPICS) and int(definitions.sum()) == len(TOPICS)
    wanted = topic_id("md.fx.EURUSD")
    rows = select_rows(
        frames, RowSpec(), -1, rec.position, rec.descriptor(), definitions, lambda reserved: reserved == wanted
    )
    in_term = [m for m in rec.messages if m[2] <= rec.term_length and m[1] == wanted]
    assert len(rows) == len(in_term) > 0
    assert rows.payload_values.tobytes() == b"".join(m[0] for m in in_term)  # only the kept rows' bytes


def test_spark_reads_topics_recorded_from_a_topic_publication_with_the_filter_pushed(
    spark: SparkSession, spark_driver: DriverProcess, tmp_path: pathlib.Path
) -> None:
    archive_dir = str(tmp_path / "archive")
    stream = 14
    recorder = RecorderProcess(archive_dir, spark_driver.dir, "aeron:ipc", stream, []).start()
    sent: list[tuple[str, bytes]] = []
    try:
        with Aeron.connect(Context(dir=spark_driver.dir)) as aeron:
            pub = aeron.add_topic_publication("aeron:ipc", stream)
            wait_until(lambda: pub.is_connected, 20, "the recorder to subscribe")
            for i in range(400):
                name = TOPICS[i % len(TOPICS)]
                payload = f"{name}:{i}".encode() * (1 + i % 5)
                while (end := pub.offer(name, payload)) < 0:
                    pass
                sent.append((name, payload))
            session_id = pub.publication.session_id
            await_recorded(archive_dir, session_id, end)
            pub.close()
            wait_until(
                lambda: (d := recording_of(archive_dir, session_id)) is not None and not d.active, 20, "the stop"
            )
    finally:
        assert recorder.stop() == 0, recorder.output()
    df = spark.read.format("logbuf").load(archive_dir)
    everything = [(r.topic, bytes(r.payload)) for r in df.select("topic", "payload").collect()]
    assert everything == sent
    like = df.filter("topic LIKE 'md.equities.%'").select("topic", "payload")
    plan = spark.sparkContext._jvm.PythonSQLUtils.explainString(like._jdf.queryExecution(), "formatted")  # type: ignore[union-attr]
    assert "StringStartsWith(topic,md.equities.)" in plan.split("PushedFilters:")[1].splitlines()[0], plan
    assert [(r.topic, bytes(r.payload)) for r in like.collect()] == [s for s in sent if s[0].startswith("md.equities.")]
    exact = df.filter(df.topic == "md.fx.EURUSD").select("payload").collect()
    assert [bytes(r.payload) for r in exact] == [p for t, p in sent if t == "md.fx.EURUSD"]
