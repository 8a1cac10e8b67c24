"""A client's TopicDirectory learning names from definition frames: checked once, shared through the host's
registry, and never an exception out of a poll (the filter calls it from inside the native scan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from logbuf.client.topics import TopicDirectory
from logbuf.conduit.topic_registry import TopicRegistry
from logbuf.topic_names import topic_id


@pytest.fixture
def directory(tmp_path: Path) -> str:
    return str(tmp_path)


def test_a_learnt_name_is_shared_through_the_registry_and_bad_definitions_are_counted(directory: str) -> None:
    TopicRegistry.create(directory, 4096).close()
    learner, other = TopicDirectory(directory), TopicDirectory(directory)
    try:
        assert learner.learn(topic_id("md.a"), b"md.a") == "md.a" == learner.learn(topic_id("md.a"), b"md.a")
        assert other.name_of(topic_id("md.a")) == "md.a"  # another client on the host names it
        assert learner.learn(topic_id("md.a"), b"md.b") is None  # not the name of that id
        assert learner.learn(topic_id("md.c"), b"md.d") is None
        assert learner.learn(topic_id("md.c"), b"md..c") is None  # not a topic name
        assert learner.learn(topic_id("md.c"), b"\xff") is None
        assert learner.invalid_definitions == 4 and learner.name_of(topic_id("md.c")) is None
        assert other.learn(topic_id("md.a"), b"md.a") == "md.a"  # known: no second record
        with TopicRegistry.open(directory, writable=False) as registry:
            assert registry.poll() == 1
    finally:
        learner.close()
        other.close()


def test_a_full_registry_leaves_a_learnt_name_known_to_its_client_instead_of_raising(directory: str) -> None:
    TopicRegistry.create(directory, 4096).close()
    learner = TopicDirectory(directory)
    try:
        names = [f"t.{i:04d}" for i in range(200)]  # 24-byte records: about 165 fit in 3,968 bytes
        for name in names:
            assert learner.learn(topic_id(name), name.encode()) == name
        assert all(learner.name_of(topic_id(name)) == name for name in names)
        assert 0 < learner.unshared_names < len(names)
    finally:
        learner.close()
