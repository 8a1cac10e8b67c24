"""protocol_spec/*.md agrees with the descriptor modules.

Convention (protocol_spec/README.md): a table with an ``Offset`` or ``Value`` column and a
``Constant`` column holding `` `module.NAME` `` (a module of the ``logbuf`` package) documents that
constant; the number in the row must equal it. An empty Constant cell means "no named constant".
"""

from __future__ import annotations

import importlib
import pathlib
import re
from dataclasses import dataclass

import pytest

from logbuf.conduit import counters_descriptor as cd
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.logbuffer import standalone

SPEC_DIR = pathlib.Path(__file__).resolve().parent.parent / "protocol_spec"
CONSTANT_CELL = re.compile(r"^`([\w.]+)\.([A-Z][A-Z0-9_]*)`$")
CELL_SPLIT = re.compile(r"(?<!\\)\|")
NUMBER_COLUMNS = ("offset", "value")


class SpecFormatError(AssertionError):
    """A table row that claims to document a constant cannot be read."""


@dataclass(frozen=True, slots=True)
class SpecRow:
    where: str  # "file.md:line"
    table: int  # index of the table in its file
    field: str
    number: int
    module: str
    constant: str


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in CELL_SPLIT.split(line.strip())[1:-1]]


SEPARATOR = re.compile(r"^\s*\|(\s*:?-+:?\s*\|)+\s*$")


def tables(text: str) -> list[tuple[list[str], list[tuple[int, list[str]]]]]:
    """The markdown tables in ``text`` (outside code fences): lower-cased header, (line number, cells) rows."""
    found: list[tuple[list[str], list[tuple[int, list[str]]]]] = []
    lines = text.splitlines()
    in_fence = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence and line.lstrip().startswith("|") and i + 1 < len(lines) and SEPARATOR.match(lines[i + 1]):
            header = [cell.lower() for cell in _cells(line)]
            i += 2
            body = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                body.append((i + 1, _cells(lines[i])))
                i += 1
            found.append((header, body))
            continue
        i += 1
    return found


def parse_tables(text: str, source: str) -> list[SpecRow]:
    """Every documented-constant row of every table in ``text`` (a markdown document)."""
    rows: list[SpecRow] = []
    for table, (header, body) in enumerate(tables(text)):
        if "constant" not in header or not any(c in header for c in NUMBER_COLUMNS):
            continue
        constant_col = header.index("constant")
        number_col = next(header.index(c) for c in NUMBER_COLUMNS if c in header)
        for line_no, cells in body:
            where = f"{source}:{line_no}"
            if len(cells) != len(header):
                raise SpecFormatError(f"{where}: {len(cells)} cells, the table header has {len(header)}")
            if not cells[constant_col]:
                continue
            match = CONSTANT_CELL.match(cells[constant_col])
            if match is None:
                raise SpecFormatError(f"{where}: constant cell {cells[constant_col]!r} is not `module.NAME`")
            try:
                number = int(cells[number_col].replace("−", "-"), 0)
            except ValueError:
                raise SpecFormatError(f"{where}: {cells[number_col]!r} is not an integer") from None
            rows.append(SpecRow(where, table, cells[0], number, match[1], match[2]))
    return rows


def mismatches(rows: list[SpecRow]) -> list[str]:
    """One message per row whose number differs from its constant (or whose constant is missing)."""
    problems = []
    for row in rows:
        try:
            module = importlib.import_module(f"logbuf.{row.module}")
        except ImportError:
            problems.append(f"{row.where}: {row.field}: no module logbuf.{row.module}")
            continue
        if not hasattr(module, row.constant):
            problems.append(f"{row.where}: {row.field}: logbuf.{row.module} has no {row.constant}")
            continue
        value = getattr(module, row.constant)
        if value != row.number:
            problems.append(
                f"{row.where}: {row.field}: spec says {row.number}, logbuf.{row.module}.{row.constant} = {value}"
            )
    return problems


def spec_rows(name: str) -> list[SpecRow]:
    return parse_tables((SPEC_DIR / name).read_text(encoding="utf-8"), name)


def documented(name: str, module: str) -> set[str]:
    return {row.constant for row in spec_rows(name) if row.module == module}


def names(module: object, pattern: str) -> set[str]:
    return {name for name in vars(module) if re.fullmatch(pattern, name)}


SPEC_FILES = sorted(path.name for path in SPEC_DIR.glob("*.md"))


def test_spec_directory_has_the_documented_files() -> None:
    assert {"README.md", "data-frame.md", "log-buffer.md", "counters.md"} <= set(SPEC_FILES)
    index = (SPEC_DIR / "README.md").read_text(encoding="utf-8")
    for name in SPEC_FILES:
        if name != "README.md":
            assert f"]({name})" in index, f"protocol_spec/README.md does not link {name}"


@pytest.mark.parametrize("name", [name for name in SPEC_FILES if name != "README.md"])
def test_every_documented_number_matches_its_descriptor_constant(name: str) -> None:
    rows = spec_rows(name)
    assert rows, f"{name} has no table with a Constant column"
    assert mismatches(rows) == []


def test_the_tables_document_enough_to_matter() -> None:
    counts = {name: len(spec_rows(name)) for name in ("data-frame.md", "log-buffer.md", "counters.md")}
    assert counts["data-frame.md"] >= 20, counts
    assert counts["log-buffer.md"] >= 40, counts
    assert counts["counters.md"] >= 30, counts


def test_every_data_header_offset_flag_and_type_is_documented() -> None:
    wanted = names(dh, r".*_OFFSET") | names(dh, r".*_FLAGS?") | {"UNFRAGMENTED"} | names(dh, r"HDR_TYPE_.*")
    wanted |= {"HEADER_LENGTH", "MIN_HEADER_LENGTH", "FRAME_ALIGNMENT", "CURRENT_VERSION", "MAX_MESSAGE_LENGTH"}
    assert {"FRAME_LENGTH_FIELD_OFFSET", "DATA_OFFSET", "BEGIN_FLAG", "HDR_TYPE_PAD"} <= wanted
    missing = wanted - documented("data-frame.md", "logbuffer.data_header_descriptor")
    assert not missing, f"data-frame.md does not document {sorted(missing)}"


def test_every_log_metadata_offset_is_documented() -> None:
    wanted = names(lbd, r".*_OFFSET") | {
        "PARTITION_COUNT",
        "LOG_META_DATA_LENGTH",
        "TERM_MIN_LENGTH",
        "TERM_MAX_LENGTH",
    }
    assert len(wanted) >= 35
    missing = wanted - documented("log-buffer.md", "logbuffer.log_buffer_descriptor")
    assert not missing, f"log-buffer.md does not document {sorted(missing)}"


def test_every_counters_offset_state_and_type_id_is_documented() -> None:
    wanted = names(cd, r".*_OFFSET") | names(cd, r".*_TYPE_ID") | names(cd, r"RECORD_(UNUSED|ALLOCATED|RECLAIMED)")
    wanted |= {"COUNTER_LENGTH", "METADATA_LENGTH"}
    missing = wanted - documented("counters.md", "conduit.counters_descriptor")
    assert not missing, f"counters.md does not document {sorted(missing)}"
    standalone_ids = names(standalone, r".*_COUNTER_ID")
    assert len(standalone_ids) == 3
    missing = standalone_ids - documented("counters.md", "logbuffer.standalone")
    assert not missing, f"counters.md does not document {sorted(missing)}"


@pytest.mark.parametrize(
    ("name", "first_constant", "length"),
    [
        ("data-frame.md", "FRAME_LENGTH_FIELD_OFFSET", dh.HEADER_LENGTH),
        ("counters.md", "VALUE_OFFSET", cd.COUNTER_LENGTH),
        ("counters.md", "RECORD_STATE_OFFSET", cd.METADATA_LENGTH),
    ],
)
def test_record_tables_tile_their_record_without_gaps(name: str, first_constant: str, length: int) -> None:
    """In a record's field table every field starts where the previous one ends."""
    rows = spec_rows(name)
    table = next(row.table for row in rows if row.constant == first_constant)
    header, body = tables((SPEC_DIR / name).read_text(encoding="utf-8"))[table]
    offset_col, size_col = header.index("offset"), header.index("size")
    end = 0
    # Every row, those without a constant (padding) included.
    for _, cells in body:
        field, offset, size = cells[0], int(cells[offset_col]), cells[size_col]
        assert offset == end, f"{name}: {field} starts at {offset}, the previous field ends at {end}"
        end = offset + int(size) if size.isdigit() else length
    assert end == length, f"{name}: fields end at {end}, the record is {length} bytes"


# -- the checker itself can fail ---------------------------------------------------------------
GOOD = """
| Field | Offset | Size | Type | Constant | Description |
|---|---|---|---|---|---|
| term id | 20 | 4 | int32 | `logbuffer.data_header_descriptor.TERM_ID_FIELD_OFFSET` | ok |
| raw tail 1 | 8 | 8 | int64 |  | no constant: not checked |
"""


def test_checker_accepts_a_correct_table() -> None:
    rows = parse_tables(GOOD, "good.md")
    assert [(r.field, r.number, r.constant) for r in rows] == [("term id", 20, "TERM_ID_FIELD_OFFSET")]
    assert mismatches(rows) == []


def test_checker_reports_a_wrong_offset_and_an_unknown_constant() -> None:
    bad = (
        GOOD.replace("| 20 |", "| 24 |")
        + "| ghost | 0x10 | 4 | int32 | `logbuffer.data_header_descriptor.NO_SUCH_OFFSET` | |\n"
    )
    problems = mismatches(parse_tables(bad, "bad.md"))
    assert len(problems) == 2
    assert "spec says 24, logbuf.logbuffer.data_header_descriptor.TERM_ID_FIELD_OFFSET = 20" in problems[0]
    assert "has no NO_SUCH_OFFSET" in problems[1]


@pytest.mark.parametrize(
    "row",
    [
        "| term id | 20 | 4 | int32 | TERM_ID_FIELD_OFFSET | no backticks, no module |",
        "| term id | twenty | 4 | int32 | `logbuffer.data_header_descriptor.TERM_ID_FIELD_OFFSET` | not a number |",
        "| term id | 20 | 4 | `logbuffer.data_header_descriptor.TERM_ID_FIELD_OFFSET` | too few cells |",
    ],
)
def test_checker_rejects_rows_it_cannot_read(row: str) -> None:
    table = GOOD.splitlines()[1:3] + [row]
    with pytest.raises(SpecFormatError):
        parse_tables("\n".join(table), "broken.md")
