"""protocol_spec/cnc.md's field tables agree with the descriptor modules."""

from __future__ import annotations

import importlib
import pathlib
import re

SPEC = pathlib.Path(__file__).resolve().parent.parent / "protocol_spec" / "cnc.md"
ROW = re.compile(r"^\|([^|]+)\|\s*(\d+)\s*\|[^|]*\|[^|]*\|\s*`([\w.]+)\.(\w+)`\s*\|$")


def rows() -> list[tuple[str, int, str, str]]:
    found = []
    for line in SPEC.read_text().splitlines():
        match = ROW.match(line.strip())
        if match:
            found.append((match[1].strip(), int(match[2]), match[3], match[4]))
    return found


def test_every_documented_offset_matches_its_constant() -> None:
    table = rows()
    assert len(table) >= 25
    for field, offset, module, constant in table:
        value = getattr(importlib.import_module(f"logbuf.{module}"), constant)
        assert value == offset, f"{field}: spec says {offset}, logbuf.{module}.{constant} = {value}"


def test_every_cnc_header_field_is_documented() -> None:
    from logbuf.conduit import cnc_descriptor

    documented = {constant for _, _, module, constant in rows() if module == "conduit.cnc_descriptor"}
    fields = {name for name in vars(cnc_descriptor) if name.endswith("_FIELD_OFFSET")}
    assert fields <= documented, f"undocumented CnC header fields: {sorted(fields - documented)}"
