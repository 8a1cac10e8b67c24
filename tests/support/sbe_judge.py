"""An independent SBE implementation (PyPI ``sbe`` 0.4.3) reading a schema file, as a judge of our codec.

``sbe`` 0.4.3 parses an SBE XML schema at run time and encodes and decodes messages from it, but as
shipped it cannot read Aeron's control protocol; this module teaches it three things and nothing else:

1. an enum whose ``encodingType`` is a primitive other than char/uint8/uint16 (Aeron's are int32):
   the parser looks the name up among the schema's types, so the primitives are added to them;
2. a field typed directly by a primitive (``type="int64"``): its decoder asks the type for a
   ``presence``, which ``sbe.PrimitiveType`` lacks, so the class gets ``REQUIRED``;
3. var-length ``<data>`` fields, which it does not know: it reads them as a fixed composite. Here
   they are taken out of each message (a field whose type is a composite of ``length`` and
   ``varData``, SBE's var-data form, in schema order) and put after the block by SBE's rule: at
   ``header size + blockLength``, each one a length in the ``length`` member's primitive type,
   then that many bytes.

The fixed block (which fields, their order, primitive types and sizes, enum names and values), the
message header and the block length come from ``sbe`` reading the schema. It does not read
``sinceVersion``, ``presence`` nor a field's ``offset``, so a message with a field at an explicit
offset cannot be judged by it.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import IO, Any

import sbe


def _teach_sbe() -> None:
    if getattr(sbe, "_logbuf_taught", False):
        return
    sbe.PrimitiveType.presence = sbe.Presence.REQUIRED  # (2)
    parse_impl = sbe._parse_schema_impl

    def parse_with_primitive_types(doc: Any, only_tags: Any = None, extra_types: Any = None) -> Any:  # (1)
        if extra_types is not None:
            extra_types = {p.value: sbe.Type(p.value, p, None) for p in sbe.PrimitiveType} | extra_types
        return parse_impl(doc, only_tags, extra_types)

    sbe._parse_schema_impl = parse_with_primitive_types
    sbe._logbuf_taught = True


def _is_var_data(field: Any) -> bool:
    composite = field.type
    return isinstance(composite, sbe.Composite) and [t.name for t in composite.types] == ["length", "varData"]


@dataclasses.dataclass
class Judged:
    """A message as the judge reads it: name, header, fixed fields by schema name, var fields as bytes."""

    name: str
    header: dict[str, int]
    fields: dict[str, Any]
    var_fields: dict[str, bytes]


class SbeJudge:
    def __init__(self, schema_file: IO[str]) -> None:
        _teach_sbe()
        self.schema = sbe.Schema.parse(schema_file)
        self.var_fields: dict[int, list[Any]] = {}
        self.by_name: dict[str, Any] = {}
        for template_id, message in self.schema.messages.items():
            self.var_fields[template_id] = [f for f in message.fields if _is_var_data(f)]
            message.fields = [f for f in message.fields if not _is_var_data(f)]  # (3)
            self.by_name[message.name] = message
        self.header_size: int = self.schema.header_size

    def fixed_field_names(self, name: str) -> list[str]:
        return [f.name for f in self.by_name[name].fields]

    def var_field_names(self, name: str) -> list[str]:
        return [f.name for f in self.var_fields[self.by_name[name].id]]

    def decode(self, buffer: bytes) -> Judged:
        header = self.schema.decode_header(buffer)
        decoded = self.schema.decode(buffer)
        position = self.header_size + header["blockLength"]
        var_values: dict[str, bytes] = {}
        for field in self.var_fields[header["templateId"]]:
            length_format = "<" + sbe.FORMAT[field.type.types[0].primitiveType]
            (length,) = struct.unpack_from(length_format, buffer, position)
            position += struct.calcsize(length_format)
            var_values[field.name] = buffer[position : position + length]
            position += length
        if position != len(buffer):
            raise ValueError(f"{decoded.message_name}: {len(buffer) - position} bytes after the last var field")
        return Judged(decoded.message_name, header, dict(decoded.value), var_values)

    def encode(self, name: str, fields: dict[str, Any], var_fields: dict[str, bytes]) -> bytes:
        message = self.by_name[name]
        block_length = len(self.schema.encode(message, fields)) - self.header_size
        parts = [self.schema.encode(message, fields, header={"blockLength": block_length})]
        for field in self.var_fields[message.id]:
            data = var_fields[field.name]
            parts.append(struct.pack("<" + sbe.FORMAT[field.type.types[0].primitiveType], len(data)))
            parts.append(data)
        return b"".join(parts)
