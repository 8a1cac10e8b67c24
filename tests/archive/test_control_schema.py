"""``control_schema.xml`` and the codec agree, judged by an independent SBE implementation.

The PyPI ``sbe`` package reads the schema file the wheel ships (``tests/support/sbe_judge.py`` says
what it had to be taught) and, for every message, decodes what our codec encodes and encodes what
our codec decodes, byte for byte. The schema attributes ``sbe`` does not read (``sinceVersion``,
``presence``, ``offset``) are compared with the codec's layouts from a plain XML reading. Together
these keep the codec, the schema and (through ``test_control_codec.py``'s hand-written vectors)
Aeron's layout from drifting apart.

Hypothesis runs with no deadline: tests hold no wall-clock limits (the machine is shared and loaded).
"""

from __future__ import annotations

import importlib.resources
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import pytest
import sbe
from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.archive import control_codec as cc
from logbuf.archive.control_codec import ControlMessage, decode, encode
from tests.support.control_messages import SAMPLES, message_strategy
from tests.support.sbe_judge import Judged, SbeJudge

SCHEMA = importlib.resources.files("logbuf.archive").joinpath("control_schema.xml")
SBE_NS = "{http://fixprotocol.io/2016/sbe}"


@pytest.fixture(scope="module")
def judge() -> Iterator[SbeJudge]:
    with SCHEMA.open("r", encoding="utf-8") as f:
        yield SbeJudge(f)


def _xml_messages() -> dict[str, ET.Element]:
    root = ET.fromstring(SCHEMA.read_text(encoding="utf-8"))
    return {m.attrib["name"]: m for m in root.iter(SBE_NS + "message")}


XML_MESSAGES = _xml_messages()
OFFSET_MESSAGES = {name for name, m in XML_MESSAGES.items() if any("offset" in f.attrib for f in m)}
JUDGED = [m for m in SAMPLES if type(m).__name__ not in OFFSET_MESSAGES]
JUDGED_IDS = [type(m).__name__ for m in JUDGED]


def test_the_schema_ships_as_package_data_with_aerons_ids(judge: SbeJudge) -> None:
    assert SCHEMA.is_file()
    assert int(judge.schema.id) == cc.SCHEMA_ID == 101
    assert int(judge.schema.version) == cc.SCHEMA_VERSION
    root = ET.fromstring(SCHEMA.read_text(encoding="utf-8"))
    assert root.attrib["byteOrder"] == "littleEndian"
    assert root.attrib["semanticVersion"] == cc.SEMANTIC_VERSION
    assert judge.header_size == cc.MESSAGE_HEADER_LENGTH


def test_schema_and_codec_have_the_same_messages(judge: SbeJudge) -> None:
    assert {m.id: m.name for m in judge.schema.messages.values()} == {
        template_id: layout.name for template_id, layout in cc.LAYOUTS.items()
    }
    assert OFFSET_MESSAGES == {"CatalogHeader", "RecordingDescriptorHeader"}  # catalog file records


@pytest.mark.parametrize("layout", cc.LAYOUTS.values(), ids=lambda layout: layout.name)
def test_schema_and_codec_have_the_same_fields_types_and_enums(judge: SbeJudge, layout: cc.MessageLayout) -> None:
    message = judge.by_name[layout.name]
    assert [f.name for f in message.fields] == [f.schema_name for f in layout.fields]
    assert judge.var_field_names(layout.name) == [v.schema_name for v in layout.var_fields]
    for schema_field, field in zip(message.fields, layout.fields, strict=True):
        sbe_type = schema_field.type
        if field.enum_type is not None:
            assert isinstance(sbe_type, sbe.Enum) and sbe_type.name == field.enum_type.__name__
            assert sbe_type.encodingType.primitiveType is sbe.PrimitiveType.INT32
            assert {v.name: int(v.value) for v in sbe_type.valid_values} == {e.name: e.value for e in field.enum_type}
        else:
            primitive = sbe_type if isinstance(sbe_type, sbe.PrimitiveType) else sbe_type.primitiveType
            assert sbe.FORMAT[primitive] == field.wire.fmt, field.name
            named = sbe_type.name if isinstance(sbe_type, sbe.Type) else primitive.value
            assert named == field.wire.sbe_type
            if isinstance(sbe_type, sbe.Type) and sbe_type.nullValue is not None:
                assert sbe_type.nullValue == field.wire.null
    for schema_field, var in zip(judge.var_fields[layout.template_id], layout.var_fields, strict=True):
        assert schema_field.type.name == var.wire.sbe_type


@pytest.mark.parametrize("layout", cc.LAYOUTS.values(), ids=lambda layout: layout.name)
def test_schema_attributes_sbe_does_not_read_match_the_codec(layout: cc.MessageLayout) -> None:
    element = XML_MESSAGES[layout.name]
    assert int(element.attrib["id"]) == layout.template_id
    assert int(element.attrib.get("sinceVersion", 0)) == layout.since_version
    fields = {f.attrib["name"]: f for f in element}
    for field in layout.fields:
        attrib = fields[field.schema_name].attrib
        assert fields[field.schema_name].tag == "field"
        assert int(attrib.get("sinceVersion", 0)) == field.since_version, field.name
        if "offset" in attrib:
            assert int(attrib["offset"]) == field.offset
    for var in layout.var_fields:
        assert fields[var.schema_name].tag == "data"
        assert int(fields[var.schema_name].attrib.get("sinceVersion", 0)) == var.since_version, var.name
    assert len(fields) == len(layout.fields) + len(layout.var_fields)


def _judge_values(message: ControlMessage) -> tuple[dict[str, Any], dict[str, bytes]]:
    layout = cc.layout_of(type(message))
    fields: dict[str, Any] = {}
    for field in layout.fields:
        value = getattr(message, field.name)
        fields[field.schema_name] = value.name if field.enum_type is not None else value
    var_fields = {}
    for var in layout.var_fields:
        value = getattr(message, var.name)
        var_fields[var.schema_name] = value.encode("ascii") if isinstance(value, str) else value
    return fields, var_fields


def _assert_judged_as(judged: Judged, message: ControlMessage) -> None:
    layout = cc.layout_of(type(message))
    assert judged.name == layout.name
    assert judged.header == {
        "blockLength": layout.block_length,
        "templateId": layout.template_id,
        "schemaId": cc.SCHEMA_ID,
        "version": cc.SCHEMA_VERSION,
    }
    fields, var_fields = _judge_values(message)
    for field in layout.fields:
        got = judged.fields[field.schema_name]
        if got is None and field.enum_type is None:  # sbe reads a type's nullValue as None
            assert fields[field.schema_name] == field.wire.null, field.name
        else:
            assert got == fields[field.schema_name], field.name
    assert judged.var_fields == var_fields


def _check_both_ways(judge: SbeJudge, message: ControlMessage) -> None:
    wire = encode(message)
    _assert_judged_as(judge.decode(wire), message)
    fields, var_fields = _judge_values(message)
    judged_wire = judge.encode(type(message).__name__, fields, var_fields)
    assert judged_wire == wire
    assert decode(judged_wire) == message


@pytest.mark.parametrize("message", JUDGED, ids=JUDGED_IDS)
def test_sbe_decodes_our_encoding_and_we_decode_its_encoding(judge: SbeJudge, message: ControlMessage) -> None:
    _check_both_ways(judge, message)


@pytest.mark.parametrize("layout", [cc.layout_of(type(m)) for m in JUDGED], ids=JUDGED_IDS)
@given(data=st.data())
@settings(max_examples=10, deadline=None)
def test_sbe_and_codec_agree_on_any_message(judge: SbeJudge, layout: cc.MessageLayout, data: st.DataObject) -> None:
    _check_both_ways(judge, data.draw(message_strategy(layout)))
