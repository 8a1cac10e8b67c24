"""Archive control messages for tests: one sample of every message, hypothesis strategies, mutated bytes.

Built from :data:`logbuf.archive.control_codec.LAYOUTS`, so a message added to the codec is covered
by every test that uses these without further work. The service's fuzz tests can draw from
:data:`MESSAGES` and :func:`mutated` as well.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from logbuf.archive import control_codec as cc
from logbuf.archive.control_codec import ControlMessage


def sample(layout: cc.MessageLayout) -> ControlMessage:
    """A message with a distinct, non-null value in every field (var-length fields non-empty)."""
    values: list[Any] = []
    for i, field in enumerate(layout.fields):
        if field.enum_type is not None:
            values.append(list(field.enum_type)[-1])
        else:
            values.append(i + 2 if field.wire.size > 1 else 1)
    for i, var in enumerate(layout.var_fields):
        values.append(f"aeron:ipc?n={i}" if var.wire.ascii else bytes([0, 255, i]))
    return layout.message_type(*values)


SAMPLES: list[ControlMessage] = [sample(layout) for layout in cc.LAYOUTS.values()]
SAMPLE_IDS: list[str] = [type(message).__name__ for message in SAMPLES]


def message_strategy(layout: cc.MessageLayout, max_var_length: int = 40) -> st.SearchStrategy[ControlMessage]:
    """Any valid message of one layout: every int in its type's range, any enum member, ASCII text, bytes."""
    parts: list[st.SearchStrategy[Any]] = []
    for field in layout.fields:
        if field.enum_type is not None:
            parts.append(st.sampled_from(list(field.enum_type)))
        else:
            parts.append(st.integers(field.wire.low, field.wire.high))
    for var in layout.var_fields:
        if var.wire.ascii:
            parts.append(st.text(st.characters(max_codepoint=127), max_size=max_var_length))
        else:
            parts.append(st.binary(max_size=max_var_length))
    return st.tuples(*parts).map(lambda values: layout.message_type(*values))


MESSAGES: st.SearchStrategy[ControlMessage] = st.one_of([message_strategy(layout) for layout in cc.LAYOUTS.values()])
"""Any valid message of any template."""


@st.composite
def mutated(draw: st.DrawFn, messages: st.SearchStrategy[ControlMessage] = MESSAGES) -> bytes:
    """The encoding of a valid message with 1-4 bytes overwritten, then cut short or padded with zeros."""
    wire = bytearray(cc.encode(draw(messages)))
    for _ in range(draw(st.integers(1, 4))):
        wire[draw(st.integers(0, len(wire) - 1))] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(wire) + 4))
    return bytes(wire[:cut]) + bytes(max(0, cut - len(wire)))
