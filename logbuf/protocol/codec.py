"""Datagram codec: the rules for a whole datagram, dispatching on the ``type`` field.

The driver's endpoints (:mod:`logbuf.driver.udp`) dispatch on the frame type themselves, with
these constants: DATA and PAD datagrams are checked in C on the hot path, and every control frame
goes through :func:`decode_control` (the one-frame, no-trailing-bytes rule below), whose
:class:`MalformedFrameError` they count as an invalid packet and drop. :func:`decode_datagram`
applies the same rules to any datagram and returns every frame in it (``[]`` for an invalid one;
``strict=True`` raises instead): the reference decoder for tests, captures and tools. Rules:

- at least the 8-byte common header, version 0, a known type;
- DATA/PAD (types 1 and 0): one or more frames, see :mod:`logbuf.protocol.data`;
- every other type: exactly one frame, and the datagram is exactly ``frame_length`` long
  (Aeron never sends trailing bytes after a control frame, so they mean corruption).

Types Aeron defines that logbuf does not speak (ATS 0x08-0x0A, EXT 0xFFFF) are invalid here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final, TypeAlias, TypeVar

from logbuf.protocol import MalformedFrameError, data, error_frame, nak, resolution, response_setup, rttm, setup, status
from logbuf.protocol.data import DataFrame, HeartbeatFrame, PadFrame
from logbuf.protocol.error_frame import ErrorFrame
from logbuf.protocol.frame_header import (
    COMMON_HEADER,
    COMMON_HEADER_LENGTH,
    CURRENT_VERSION,
    HDR_TYPE_DATA,
    HDR_TYPE_ERR,
    HDR_TYPE_NAK,
    HDR_TYPE_PAD,
    HDR_TYPE_RES,
    HDR_TYPE_RSP_SETUP,
    HDR_TYPE_RTTM,
    HDR_TYPE_SETUP,
    HDR_TYPE_SM,
    TYPE_NAMES,
    Buffer,
    type_name,
)
from logbuf.protocol.nak import NakFrame
from logbuf.protocol.resolution import ResolutionFrame
from logbuf.protocol.response_setup import ResponseSetupFrame
from logbuf.protocol.rttm import RttMeasurementFrame
from logbuf.protocol.setup import SetupFrame
from logbuf.protocol.status import StatusMessageFrame

ControlFrame: TypeAlias = (
    SetupFrame | StatusMessageFrame | NakFrame | RttMeasurementFrame | ErrorFrame | ResolutionFrame | ResponseSetupFrame
)
Frame: TypeAlias = DataFrame | HeartbeatFrame | PadFrame | ControlFrame
EncodableFrame: TypeAlias = (
    DataFrame
    | HeartbeatFrame
    | PadFrame
    | SetupFrame
    | StatusMessageFrame
    | NakFrame
    | RttMeasurementFrame
    | ErrorFrame
)
"""The frames logbuf sends or may send; RES and RSP_SETUP (name resolution, response channels) are only
decoded, so that a valid one is not counted as an invalid packet."""

CONTROL_DECODERS: Final[dict[int, Callable[[Buffer, int], ControlFrame]]] = {
    HDR_TYPE_NAK: nak.decode,
    HDR_TYPE_SM: status.decode,
    HDR_TYPE_ERR: error_frame.decode,
    HDR_TYPE_SETUP: setup.decode,
    HDR_TYPE_RTTM: rttm.decode,
    HDR_TYPE_RES: resolution.decode,
    HDR_TYPE_RSP_SETUP: response_setup.decode,
}


_Control = TypeVar("_Control", bound=ControlFrame)


def decode_exact(decoder: Callable[[Buffer, int], _Control], buffer: Buffer) -> _Control:
    """The one control frame ``decoder`` reads from ``buffer``, which it must fill exactly: Aeron never
    sends bytes after a control frame, so trailing bytes mean corruption (:class:`MalformedFrameError`)."""
    frame = decoder(buffer, 0)
    if len(buffer) != frame.frame_length:
        raise MalformedFrameError(
            f"{len(buffer) - frame.frame_length} trailing bytes after the {frame.frame_length}-byte "
            f"{TYPE_NAMES[COMMON_HEADER.unpack_from(buffer, 0)[3]]} frame"
        )
    return frame


def decode_control(buffer: Buffer) -> ControlFrame:
    """The control frame (any type but DATA and PAD) that fills ``buffer``; :class:`MalformedFrameError`
    for a type logbuf does not speak or a frame that breaks its rules."""
    frame_type = COMMON_HEADER.unpack_from(buffer, 0)[3] if len(buffer) >= COMMON_HEADER_LENGTH else -1
    decoder = CONTROL_DECODERS.get(frame_type)
    if decoder is None:
        raise MalformedFrameError(f"frame type {type_name(frame_type)} is not supported")
    return decode_exact(decoder, buffer)


def decode_datagram(buffer: Buffer, *, strict: bool = False) -> list[Frame]:
    """The frames in one datagram, or ``[]`` if it is invalid (``strict``: raise instead, naming the
    reason)."""
    try:
        return _decode(buffer)
    except MalformedFrameError:
        if strict:
            raise
        return []


def encode_datagram(frames: Iterable[EncodableFrame]) -> bytes:
    """The datagram carrying ``frames`` back to back (each DATA frame padded to 32)."""
    return b"".join(frame.encode() for frame in frames)


def _decode(buffer: Buffer) -> list[Frame]:
    length = len(buffer)
    if length < COMMON_HEADER_LENGTH:
        raise MalformedFrameError(
            f"datagram is {length} bytes, shorter than the {COMMON_HEADER_LENGTH}-byte common header"
        )
    _, version, _, frame_type = COMMON_HEADER.unpack_from(buffer, 0)
    if version != CURRENT_VERSION:
        raise MalformedFrameError(f"datagram version={version}, expected {CURRENT_VERSION}")
    if frame_type == HDR_TYPE_DATA or frame_type == HDR_TYPE_PAD:
        return list(data.decode_datagram(buffer))
    return [decode_control(buffer)]
