"""The system counters descriptor: Aeron 1.53's slots first, logbuf's after, and counters.md says the same.

(The slots, type ids and labels are compared with a real Aeron C driver's ``cnc.dat`` in
``tests/interop/test_aeron_counters.py``.)"""

from __future__ import annotations

import pathlib

import pytest

from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit import system_counters_descriptor as scd
from tests.test_protocol_spec import tables

COUNTERS_MD = pathlib.Path(__file__).resolve().parents[2] / "protocol_spec" / "counters.md"


def spec_system_counters() -> list[tuple[int, int, int, str]]:
    """(slot, id, type id, label) rows of counters.md's system counter table."""
    for header, body in tables(COUNTERS_MD.read_text(encoding="utf-8")):
        if header[:4] == ["slot", "id", "type id", "label"]:
            return [(int(c[0]), int(c[1]), int(c[2]), c[3]) for _, c in body]
    raise AssertionError("counters.md has no system counter table (Slot | Id | Type id | Label)")


def test_counters_md_lists_every_system_counter_in_its_slot() -> None:
    expected = [
        (slot, int(d.id), d.type_id, d.label.replace(scd.VERSION_INFO, "<version>"))
        for slot, d in enumerate(scd.DESCRIPTORS)
    ]
    assert spec_system_counters() == expected


def test_aerons_counters_sit_in_the_slots_of_their_ids_and_logbufs_follow_with_their_own_type_id() -> None:
    assert scd.AERON_SYSTEM_COUNTER_COUNT == 46  # Aeron 1.53: 0 (Bytes sent) .. 45
    for slot, d in enumerate(scd.DESCRIPTORS):
        if slot < scd.AERON_SYSTEM_COUNTER_COUNT:
            assert (int(d.id), d.type_id) == (slot, cd.SYSTEM_COUNTER_TYPE_ID)
        else:
            assert d.id >= scd.FIRST_LOGBUF_ID and d.type_id == cd.LOGBUF_SYSTEM_COUNTER_TYPE_ID
        assert scd.SLOTS[d.id] == slot and scd.SYSTEM_COUNTER_KEY.unpack(d.key) == (int(d.id),)
    assert scd.SLOTS[scd.SystemCounterId.NAK_MESSAGES_SENT] == 5  # it was once slot 2: Aeron's order puts it at 5


def test_the_descriptor_check_catches_a_counter_out_of_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    swapped = list(scd.DESCRIPTORS)
    swapped[2], swapped[5] = swapped[5], swapped[2]
    monkeypatch.setattr(scd, "DESCRIPTORS", tuple(swapped))
    with pytest.raises(ValueError, match=r"NAK_MESSAGES_SENT \(id 5\) is in slot 2"):
        scd.check_descriptors()


@pytest.mark.parametrize(
    ("version", "value"), [((1, 53, 0), 79104), ((1, 0, 0), 65536), ((0, 1, 0), 256), ((255, 255, 255), 0xFFFFFF)]
)
def test_semantic_versions_compose_as_agronas(version: tuple[int, int, int], value: int) -> None:
    assert scd.semantic_version(*version) == value  # 79104: the value a real Aeron 1.53 driver shows


def test_a_version_part_out_of_range_is_named() -> None:
    with pytest.raises(ValueError, match="minor=256 must be within 0..255"):
        scd.semantic_version(1, 256, 0)
