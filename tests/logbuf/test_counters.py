"""CountersManager over real shared mappings: allocation order, reuse, and its cost."""

from __future__ import annotations

import mmap

import pytest

from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersManager
from logbuf.testing import wait_until

CAPACITY = 64


@pytest.fixture
def buffers() -> tuple[memoryview, memoryview]:
    metadata = mmap.mmap(-1, CAPACITY * cd.METADATA_LENGTH)  # shared anonymous memory, as a CnC's
    values = mmap.mmap(-1, CAPACITY * cd.COUNTER_LENGTH)
    return memoryview(metadata), memoryview(values)


class CountingManager(CountersManager):
    """Counts the records an allocation tries to claim."""

    tries = 0

    def _try_claim(self, counter_id: int, expected_state: int) -> bool:
        self.tries += 1
        return super()._try_claim(counter_id, expected_state)


def test_allocation_takes_the_next_never_used_record(buffers: tuple[memoryview, memoryview]) -> None:
    counters = CountersManager(*buffers)
    ids = [counters.allocate(f"c{i}", type_id=7, registration_id=i, initial_value=i * 10) for i in range(5)]
    assert ids == [0, 1, 2, 3, 4]
    info = counters.info(3)
    assert (info.label, info.type_id, info.registration_id, info.value) == ("c3", 7, 3, 30)
    assert [c.counter_id for c in counters] == ids


def test_allocation_tries_one_record_however_many_are_allocated(buffers: tuple[memoryview, memoryview]) -> None:
    counters = CountingManager(*buffers)
    for i in range(CAPACITY - 1):
        counters.tries = 0
        counters.allocate(f"c{i}")
        assert counters.tries == 1, f"allocation {i} tried {counters.tries} records"
    counters.free(10)
    counters.tries = 0
    assert counters.allocate("reuse") == 10
    assert counters.tries == 1


def test_a_freed_record_waits_out_its_reuse_timeout_oldest_first(buffers: tuple[memoryview, memoryview]) -> None:
    counters = CountersManager(*buffers, free_to_reuse_timeout_ns=200_000_000)
    for i in range(CAPACITY):
        counters.allocate(f"c{i}")
    counters.free(5)
    counters.free(2)
    assert not counters.has_room(1)
    with pytest.raises(MemoryError, match=f"capacity {CAPACITY}.*'late'"):
        counters.allocate("late")
    wait_until(lambda: counters.has_room(2), 10, "room for two counters")
    assert counters.allocate("first") == 5
    assert counters.allocate("second") == 2
    assert counters.label(5) == "first"


def test_records_freed_by_another_process_are_found_once_the_rest_are_used(
    buffers: tuple[memoryview, memoryview],
) -> None:
    ours = CountersManager(*buffers)
    theirs = CountersManager(*buffers)  # another process's manager over the same shared memory
    for i in range(CAPACITY):
        ours.allocate(f"c{i}")
    theirs.free(40)
    assert ours.allocate("found by a scan") == 40
    with pytest.raises(MemoryError):
        ours.allocate("none left")


def test_has_room_counts_never_used_and_reusable_records(buffers: tuple[memoryview, memoryview]) -> None:
    counters = CountersManager(*buffers)
    for i in range(CAPACITY - 2):
        counters.allocate(f"c{i}")
    assert counters.has_room(2) and not counters.has_room(3)
    counters.free(0)
    assert counters.has_room(3) and not counters.has_room(4)
