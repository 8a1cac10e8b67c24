"""protocol_spec/archive-control.md agrees with the control codec: templates, block lengths, field
tables, enums and error codes. (Its constants table is checked by tests/test_protocol_spec.py.)"""

from __future__ import annotations

import enum
import pathlib

import pytest

from logbuf.archive import control_codec as cc
from tests.test_protocol_spec import tables

SPEC = pathlib.Path(__file__).resolve().parents[2] / "protocol_spec" / "archive-control.md"
TEXT = SPEC.read_text(encoding="utf-8")


def _sections(level: str) -> dict[str, str]:
    """Heading text -> the text up to the next heading of the same level."""
    parts = TEXT.split("\n" + level + " ")
    return {part.split("\n", 1)[0].strip(): part.split("\n", 1)[1] for part in parts[1:]}


SUBSECTIONS = _sections("###")
SECTIONS = _sections("##")


def _first_table(text: str) -> tuple[list[str], list[list[str]]]:
    header, body = tables(text)[0]
    return header, [cells for _, cells in body]


def _since(cell: str) -> int:
    return int(cell) if cell else 0


def test_the_template_table_lists_every_message_in_order() -> None:
    header, rows = _first_table(SECTIONS["Messages"])
    assert header[:4] == ["template id", "message", "block length", "since"]
    listed = [(int(r[0]), r[1].split("]")[0].lstrip("["), int(r[2]), _since(r[3])) for r in rows]
    assert listed == [(t, layout.name, layout.block_length, layout.since_version) for t, layout in cc.LAYOUTS.items()]


@pytest.mark.parametrize("layout", cc.LAYOUTS.values(), ids=lambda layout: layout.name)
def test_each_message_table_matches_the_codec(layout: cc.MessageLayout) -> None:
    text = SUBSECTIONS[layout.name]
    assert text.strip().startswith(f"Template {layout.template_id}, block length {layout.block_length}")
    header, rows = _first_table(text)
    assert header == ["field", "offset", "size", "type", "since"]
    fixed = [r for r in rows if r[1] != "var"]
    end = 0
    for name, offset, size, _, _ in fixed:  # the rows tile the block, padding included
        assert int(offset) == end, f"{layout.name}: {name} starts at {offset}, the previous row ends at {end}"
        end = int(offset) + int(size)
    assert end == layout.block_length
    assert [(r[0], int(r[1]), int(r[2]), r[3], _since(r[4])) for r in fixed if r[0] != "(padding)"] == [
        (
            f.schema_name,
            f.offset,
            f.wire.size,
            f.enum_type.__name__ if f.enum_type else f.wire.sbe_type,
            f.since_version,
        )
        for f in layout.fields
    ]
    assert [(r[0], r[3], _since(r[4])) for r in rows if r[1] == "var"] == [
        (v.schema_name, v.wire.sbe_type, v.since_version) for v in layout.var_fields
    ]


ENUM_TABLES = [
    (SUBSECTIONS["ControlResponseCode"], cc.ControlResponseCode),
    (SUBSECTIONS["SourceLocation"], cc.SourceLocation),
    (SUBSECTIONS["BooleanType"], cc.BooleanType),
    (SUBSECTIONS["RecordingSignal"], cc.RecordingSignal),
    (SUBSECTIONS["RecordingState"], cc.RecordingState),
    (SECTIONS["Error codes"], cc.ArchiveErrorCode),
]


@pytest.mark.parametrize(("where", "enum_type"), ENUM_TABLES, ids=[e.__name__ for _, e in ENUM_TABLES])
def test_enum_tables_match_the_codec(where: str, enum_type: type[enum.IntEnum]) -> None:
    header, rows = _first_table(where)
    assert header[:2] == ["name", "value"]
    assert [(r[0], int(r[1])) for r in rows] == [(e.name, e.value) for e in enum_type]


def test_the_spec_keeps_a_section_for_the_session_state_machine() -> None:
    assert "Session state machine" in SECTIONS
    assert "Where logbuf differs from Aeron (wire format)" in SECTIONS
    assert "Lists and how they end" in SECTIONS
