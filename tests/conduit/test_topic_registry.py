"""The topic registry file (topics.dat): append, scan, and what a reader refuses."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from logbuf.conduit import topic_registry_descriptor as trd
from logbuf.conduit.topic_registry import (
    TopicCollisionError,
    TopicRegistry,
    TopicRegistryError,
    TopicRegistryFullError,
)
from logbuf.testing.driver_process import unique_dir
from logbuf.topic_names import topic_id


@pytest.fixture
def directory() -> Iterator[str]:
    path = unique_dir()
    os.makedirs(path, mode=0o700)
    yield path
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)


def test_names_written_by_one_mapping_are_read_by_another(directory: str) -> None:
    with TopicRegistry.create(directory, 4096) as writer, TopicRegistry.open(directory) as reader:
        assert writer.register("a.b") == topic_id("a.b") == writer.register("a.b")
        writer.register("é.x")
        assert reader.poll() == 2 and reader.names == {topic_id("a.b"): "a.b", topic_id("é.x"): "é.x"}
        assert reader.poll() == 0 and writer.used_length == trd.record_length(3) + trd.record_length(4) == 48


def test_a_forged_record_is_counted_and_skipped(directory: str) -> None:
    with TopicRegistry.create(directory, 4096) as writer, TopicRegistry.open(directory) as reader:
        writer.append(topic_id("real.name"), b"other.name")  # an id that is not its name's
        writer.append(topic_id("a b"[:1]), b"a")
        assert reader.poll() == 1 and reader.invalid_records == 1 and reader.name_of(topic_id("a")) == "a"
        reader.names[topic_id("c.d")] = "x.y"  # as if another name had c.d's id
        with pytest.raises(TopicCollisionError, match="c.d"):
            reader.register("c.d")


def test_a_full_registry_refuses_a_name_loudly(directory: str) -> None:
    with TopicRegistry.create(directory, 4096) as registry:
        with pytest.raises(TopicRegistryFullError, match="topic_registry_length"):
            for i in range(1000):
                registry.register(f"topic.{i}")


def test_a_record_length_that_cannot_be_true_ends_the_scan(directory: str) -> None:
    with TopicRegistry.create(directory, 4096) as writer, TopicRegistry.open(directory) as reader:
        writer.register("a")
        trd.RECORD_HEADER.pack_into(writer.buffer, trd.RECORDS_OFFSET, 12, 1, topic_id("a"))
        with pytest.raises(TopicRegistryError, match="length 12"):
            reader.poll()


def test_a_file_that_is_not_a_registry_is_refused(directory: str) -> None:
    with open(os.path.join(directory, trd.TOPIC_REGISTRY_FILE), "wb") as f:
        f.write(bytes(4096))
    with pytest.raises(TopicRegistryError, match="magic"):
        TopicRegistry.open(directory)
