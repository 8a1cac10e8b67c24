"""The archive control protocol: Aeron Archive's SBE messages (schema id 101), encoded and decoded.

Theory of operation. Every message is a Simple Binary Encoding (SBE) message, little-endian::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-------------------------------+-------------------------------+
    |      Block Length (u16)       |       Template Id (u16)       |   0
    +-------------------------------+-------------------------------+
    |     Schema Id (u16) = 101     |     Schema Version (u16)      |   4
    +-------------------------------+-------------------------------+
    |        Fixed block: the message's fixed-size fields, in     ...   8
    |        schema order at fixed offsets (Block Length bytes)   ...
    +---------------------------------------------------------------+
    |          Length (u32) of the first var-length field           |   8 + Block Length
    +---------------------------------------------------------------+
    |          its bytes (US-ASCII text or opaque data)           ...
    +---------------------------------------------------------------+
    |          Length (u32) and bytes of the next one, ...        ...
    +---------------------------------------------------------------+

The schema version in the header is the sender's ("acting") version. A decoder follows SBE's rules
for it: the var-length section starts at ``8 + Block Length`` whatever block length the decoder knows
(a newer sender's longer block is skipped over), a field added after the acting version reads as its
null value (``NULL_INT32``, ``NULL_INT64``, ``NULL_VERSION``; ``""`` / ``b""`` for var-length fields)
and is not read from the buffer. Bytes after the last var-length field are an error from a sender of
our version or older (a fragment holds exactly one message) and ignored from a newer one (it may
have appended var-length fields).

Each message is a frozen dataclass (in :mod:`logbuf.archive.control_messages`, re-exported here)
whose fields are the schema's, in schema order, snake_case; the annotation of a field says its wire type (``Int64``, ``Int32``, ``Int8``, ``Time``, ``Version``, an
``IntEnum``, ``Ascii``, ``Data``) and, through ``Since``/``At``, the version that added it and a fixed
offset. :data:`LAYOUTS` is derived from those annotations once, at import, so the offsets live in one
place; ``protocol_spec/archive-control.md`` and ``control_schema.xml`` (our SBE description of the
same messages, read by an independent SBE implementation in the tests) document them.

``encode`` and ``decode`` raise :class:`ControlCodecError` (a ``ValueError``) naming the problem, and
nothing else: ``decode`` is fed untrusted network input.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
import typing
from dataclasses import dataclass
from itertools import repeat
from typing import Annotated, Any, Final

from logbuf.archive.control_messages import *  # noqa: F403 (the messages are part of this module's interface)
from logbuf.archive.control_messages import INT32_TYPE, At, ControlMessage, Primitive, Since, VarData
from logbuf.archive.control_messages import __all__ as _MESSAGE_NAMES
from logbuf.errors import LogbufError

__all__ = [
    *_MESSAGE_NAMES,
    "SCHEMA_ID",
    "SCHEMA_VERSION",
    "SEMANTIC_VERSION",
    "MESSAGE_HEADER",
    "MESSAGE_HEADER_LENGTH",
    "VAR_LENGTH",
    "VAR_LENGTH_HEADER_LENGTH",
    "VAR_DATA_MAX_LENGTH",
    "semantic_version",
    "PROTOCOL_SEMANTIC_VERSION",
    "ControlCodecError",
    "FieldLayout",
    "VarFieldLayout",
    "MessageLayout",
    "schema_name",
    "LAYOUTS",
    "TEMPLATES",
    "layout_of",
    "encode",
    "decode",
]

SCHEMA_ID: Final = 101
"""Aeron Archive's SBE schema id."""
SCHEMA_VERSION: Final = 13
"""The schema version of Aeron's latest release (1.52.2; versions 1.49 to 1.52 all use 13)."""
SEMANTIC_VERSION: Final = "5.2"
"""The schema's ``semanticVersion`` attribute (not sent on the wire)."""

MESSAGE_HEADER: Final = struct.Struct("<HHHH")
MESSAGE_HEADER_LENGTH: Final = MESSAGE_HEADER.size  # 8: blockLength, templateId, schemaId, version (u16 each)
VAR_LENGTH: Final = struct.Struct("<I")
VAR_LENGTH_HEADER_LENGTH: Final = VAR_LENGTH.size  # 4: the u32 length before each var-length field
VAR_DATA_MAX_LENGTH: Final = 1 << 30  # the schema's maxValue of a var-length field's length (1 GiB)


def semantic_version(major: int, minor: int, patch: int) -> int:
    """Aeron's ``SemanticVersion.compose``: one byte each for major, minor and patch."""
    return (major << 16) | (minor << 8) | patch


PROTOCOL_SEMANTIC_VERSION: Final = semantic_version(1, 12, 0)
"""The control protocol version Aeron 1.52's archive client sends in its connect request (1.12.0)."""


class ControlCodecError(LogbufError, ValueError):
    """A control message that cannot be encoded or decoded; the message names the problem."""


# --- Layouts, derived from the annotations ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldLayout:
    """A fixed-size field: where it is in the block (``offset``, from the end of the message header)."""

    name: str
    schema_name: str
    wire: Primitive
    offset: int
    since_version: int
    enum_type: type[enum.IntEnum] | None


@dataclass(frozen=True, slots=True)
class VarFieldLayout:
    """A var-length field (they follow the block in this order)."""

    name: str
    schema_name: str
    wire: VarData
    since_version: int


@dataclass(frozen=True, slots=True)
class MessageLayout:
    message_type: type[ControlMessage]
    template_id: int
    since_version: int
    block_length: int
    fields: tuple[FieldLayout, ...]
    var_fields: tuple[VarFieldLayout, ...]
    block: struct.Struct  # the whole block at SCHEMA_VERSION, padding included
    # Derived, for the fast paths: the version that added the newest fixed field, and the enum fields'
    # positions with their members by value.
    newest_field_version: int = dataclasses.field(init=False)
    enums: tuple[tuple[int, dict[int, enum.IntEnum], type[enum.IntEnum]], ...] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        newest = max([f.since_version for f in self.fields] + [0])
        object.__setattr__(self, "newest_field_version", newest)
        enums = tuple(
            (i, {m.value: m for m in f.enum_type}, f.enum_type) for i, f in enumerate(self.fields) if f.enum_type
        )
        object.__setattr__(self, "enums", enums)

    @property
    def name(self) -> str:
        return self.message_type.__name__


def schema_name(name: str) -> str:
    """The schema's camelCase name of a snake_case field name."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _layout(message_type: type[ControlMessage]) -> MessageLayout:
    hints = typing.get_type_hints(message_type, include_extras=True)
    fields: list[FieldLayout] = []
    var_fields: list[VarFieldLayout] = []
    fmt = ["<"]
    offset = 0
    for field in dataclasses.fields(message_type):
        hint = hints[field.name]
        base, *extras = typing.get_args(hint) if typing.get_origin(hint) is Annotated else (hint,)
        since = next((e.version for e in extras if isinstance(e, Since)), 0)
        at = next((e.offset for e in extras if isinstance(e, At)), None)
        wire = next((e for e in extras if isinstance(e, Primitive | VarData)), None)
        enum_type = base if isinstance(base, type) and issubclass(base, enum.IntEnum) else None
        if enum_type is not None:
            if since:
                raise TypeError(f"{message_type.__name__}.{field.name}: an enum field added later has no null value")
            wire = INT32_TYPE
        if isinstance(wire, VarData):
            var_fields.append(VarFieldLayout(field.name, schema_name(field.name), wire, since))
            continue
        if wire is None or var_fields:
            raise TypeError(f"{message_type.__name__}.{field.name}: no wire type, or a fixed field after var data")
        if at is not None:
            if at < offset:
                raise TypeError(f"{message_type.__name__}.{field.name}: offset {at} overlaps the previous field")
            fmt.append(f"{at - offset}x")
            offset = at
        fields.append(FieldLayout(field.name, schema_name(field.name), wire, offset, since, enum_type))
        fmt.append(wire.fmt)
        offset += wire.size
    template_id = message_type.TEMPLATE_ID
    since_version = getattr(message_type, "SINCE_VERSION", 0)
    block = struct.Struct("".join(fmt))
    return MessageLayout(message_type, template_id, since_version, offset, tuple(fields), tuple(var_fields), block)


LAYOUTS: Final[dict[int, MessageLayout]] = {
    layout.template_id: layout for layout in map(_layout, typing.get_args(ControlMessage))
}
"""Every message's layout, by template id, in template id order."""
TEMPLATES: Final[dict[int, type[ControlMessage]]] = {tid: layout.message_type for tid, layout in LAYOUTS.items()}
_BY_TYPE: Final[dict[type, MessageLayout]] = {layout.message_type: layout for layout in LAYOUTS.values()}


def layout_of(message_type: type[ControlMessage]) -> MessageLayout:
    return _BY_TYPE[message_type]


# --- Encode --------------------------------------------------------------------------------------------


def _fixed_value(layout: MessageLayout, field: FieldLayout, value: object) -> int:
    if field.enum_type is not None:
        if type(value) is not int and type(value) is not field.enum_type:  # not a bool nor another enum's member
            raise ControlCodecError(f"{layout.name}.{field.name}: {value!r} is not a {field.enum_type.__name__}")
        try:
            return int(field.enum_type(value))
        except ValueError:
            raise ControlCodecError(
                f"{layout.name}.{field.name}: {value!r} is not a {field.enum_type.__name__}"
            ) from None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ControlCodecError(f"{layout.name}.{field.name}: {value!r} is not an int")
    if not field.wire.low <= value <= field.wire.high:
        raise ControlCodecError(f"{layout.name}.{field.name}: {value} is out of range for {field.wire.sbe_type}")
    return value


def _var_value(layout: MessageLayout, field: VarFieldLayout, value: object) -> bytes:
    if field.wire.ascii:
        if not isinstance(value, str):
            raise ControlCodecError(f"{layout.name}.{field.name}: {value!r} is not a str")
        try:
            data = value.encode("ascii")
        except UnicodeEncodeError as e:
            raise ControlCodecError(
                f"{layout.name}.{field.name}: not US-ASCII ({value[e.start : e.end]!r} at index {e.start})"
            ) from None
    elif isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    else:
        raise ControlCodecError(f"{layout.name}.{field.name}: {value!r} is not bytes")
    if len(data) > VAR_DATA_MAX_LENGTH:
        raise ControlCodecError(f"{layout.name}.{field.name}: {len(data)} bytes is over {VAR_DATA_MAX_LENGTH}")
    return data


def _bad_enum(entry: tuple[int, dict[int, enum.IntEnum], type[enum.IntEnum]], values: list[Any]) -> bool:
    i, members, enum_type = entry
    value = values[i]
    return value not in members or (type(value) is not int and type(value) is not enum_type)


def encode(message: ControlMessage) -> bytes:
    """The message as it goes on the wire: SBE header (at SCHEMA_VERSION), block, var-length fields."""
    layout = _BY_TYPE.get(type(message))
    if layout is None:
        raise ControlCodecError(f"not a control message: {type(message).__name__}")
    values = [getattr(message, f.name) for f in layout.fields]
    try:
        # struct.pack takes a bool as an int, and any int for an enum field.
        if bool in map(type, values) or (layout.enums and any(map(_bad_enum, layout.enums, repeat(values)))):
            raise ValueError
        block = layout.block.pack(*values)
    except (struct.error, TypeError, ValueError) as e:
        for field, value in zip(layout.fields, values):
            _fixed_value(layout, field, value)  # raises, naming the field
        raise ControlCodecError(f"{layout.name}: {e}") from e
    parts = [MESSAGE_HEADER.pack(layout.block_length, layout.template_id, SCHEMA_ID, SCHEMA_VERSION), block]
    for var in layout.var_fields:
        data = _var_value(layout, var, getattr(message, var.name))
        parts.append(VAR_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


# --- Decode --------------------------------------------------------------------------------------------


def _enum_name(field: FieldLayout) -> str:
    return field.enum_type.__name__ if field.enum_type is not None else field.wire.sbe_type


def _decode_fields(layout: MessageLayout, data: bytes | memoryview, block_length: int, version: int) -> list[Any]:
    """The fixed fields one by one: those of the sender's version, the others null; errors name the field."""
    name, have = layout.name, len(data)
    values: list[Any] = []
    for field in layout.fields:
        if field.since_version > version:
            values.append(field.wire.null)
            continue
        end = field.offset + field.wire.size
        if end > block_length:
            raise ControlCodecError(
                f"{name}: block length {block_length} is too short for {field.schema_name} at block offset "
                f"{field.offset} (version {version})"
            )
        at = MESSAGE_HEADER_LENGTH + field.offset
        if at + field.wire.size > have:
            raise ControlCodecError(
                f"{name}: truncated: need {at + field.wire.size} bytes for {field.schema_name} at offset {at}, "
                f"have {have}"
            )
        (value,) = struct.unpack_from("<" + field.wire.fmt, data, at)
        if field.enum_type is not None:
            try:
                value = field.enum_type(value)
            except ValueError:
                raise ControlCodecError(f"{name}: {field.schema_name} {value} is not a {_enum_name(field)}") from None
        values.append(value)
    return values


def decode(buffer: bytes | bytearray | memoryview) -> ControlMessage:
    """The message in ``buffer`` (exactly one); :class:`ControlCodecError` names whatever is wrong."""
    try:
        data = memoryview(buffer).cast("B") if not isinstance(buffer, bytes) else buffer
    except (TypeError, ValueError) as e:
        raise ControlCodecError(f"not a contiguous bytes-like buffer: {e}") from None
    have = len(data)
    if have < MESSAGE_HEADER_LENGTH:
        raise ControlCodecError(f"truncated: need {MESSAGE_HEADER_LENGTH} bytes for the message header, have {have}")
    block_length, template_id, schema_id, version = MESSAGE_HEADER.unpack_from(data, 0)
    if schema_id != SCHEMA_ID:
        raise ControlCodecError(f"schema id {schema_id} is not {SCHEMA_ID} (template id {template_id})")
    layout = LAYOUTS.get(template_id)
    if layout is None:
        raise ControlCodecError(f"unknown template id {template_id}")
    name = layout.name

    if (
        version >= layout.newest_field_version
        and block_length >= layout.block_length
        and have >= MESSAGE_HEADER_LENGTH + layout.block_length
    ):  # every field is there: one unpack
        values: list[Any] = list(layout.block.unpack_from(data, MESSAGE_HEADER_LENGTH))
        for i, members, _ in layout.enums:
            member = members.get(values[i])
            if member is None:
                field = layout.fields[i]
                raise ControlCodecError(f"{name}: {field.schema_name} {values[i]} is not a {_enum_name(field)}")
            values[i] = member
    else:
        values = _decode_fields(layout, data, block_length, version)

    position = MESSAGE_HEADER_LENGTH + block_length
    if position > have:
        raise ControlCodecError(f"{name}: truncated: need {position} bytes for a block of {block_length}, have {have}")
    for var in layout.var_fields:
        if var.since_version > version:
            values.append("" if var.wire.ascii else b"")
            continue
        if position + VAR_LENGTH_HEADER_LENGTH > have:
            raise ControlCodecError(
                f"{name}: truncated: need {position + VAR_LENGTH_HEADER_LENGTH} bytes for the length of "
                f"{var.schema_name} at offset {position}, have {have}"
            )
        (length,) = VAR_LENGTH.unpack_from(data, position)
        position += VAR_LENGTH_HEADER_LENGTH
        if length > have - position:
            raise ControlCodecError(
                f"{name}: var-length {var.schema_name} of {length} bytes runs past the end "
                f"(offset {position}, {have - position} bytes left)"
            )
        raw = data[position : position + length]
        position += length
        if var.wire.ascii:
            try:
                values.append(str(raw, "ascii"))
            except UnicodeDecodeError as e:
                raise ControlCodecError(
                    f"{name}: {var.schema_name} is not US-ASCII (byte 0x{raw[e.start]:02x} at offset "
                    f"{position - length + e.start})"
                ) from None
        else:
            values.append(bytes(raw))

    if position != have and version <= SCHEMA_VERSION:
        raise ControlCodecError(f"{name}: {have - position} trailing bytes after the message ({position} bytes)")
    return layout.message_type(*values)
