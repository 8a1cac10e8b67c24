"""Wire frames of the UDP transport: one descriptor module per frame type, and a datagram codec.

Byte-compatible with Aeron's transport protocol version 0. Every module here is sans-IO and
pure: bytes in, frozen dataclasses out (``decode``), and back (``encode``/``encode_into``).
Decoders raise :class:`MalformedFrameError` naming what is wrong; the driver's endpoints
(:mod:`logbuf.driver.udp`) dispatch on the frame type with these modules' constants and decoders,
count a malformed datagram as an invalid packet and drop it. RES and RSP_SETUP are decoded only.

Modules: :mod:`~logbuf.protocol.frame_header` (the common 8-byte header and the type codes),
:mod:`~logbuf.protocol.data` (DATA, PAD, heartbeat; the header layout itself lives in
:mod:`logbuf.logbuffer.data_header_descriptor`), :mod:`~logbuf.protocol.setup`,
:mod:`~logbuf.protocol.status` (status messages), :mod:`~logbuf.protocol.nak`,
:mod:`~logbuf.protocol.rttm`, :mod:`~logbuf.protocol.error_frame`,
:mod:`~logbuf.protocol.resolution`, :mod:`~logbuf.protocol.response_setup`,
:mod:`~logbuf.protocol.codec`.
"""

from __future__ import annotations

from logbuf.errors import MalformedFrameError

# Imported after MalformedFrameError: the frame modules import it from this package.
from logbuf.protocol.codec import EncodableFrame, Frame, decode_control, decode_datagram, decode_exact, encode_datagram  # noqa: E402
from logbuf.protocol.data import DataFrame, HeartbeatFrame, PadFrame  # noqa: E402
from logbuf.protocol.error_frame import ErrorFrame  # noqa: E402
from logbuf.protocol.nak import NakFrame  # noqa: E402
from logbuf.protocol.resolution import ResolutionEntry, ResolutionFrame  # noqa: E402
from logbuf.protocol.response_setup import ResponseSetupFrame  # noqa: E402
from logbuf.protocol.rttm import RttMeasurementFrame  # noqa: E402
from logbuf.protocol.setup import SetupFrame  # noqa: E402
from logbuf.protocol.status import StatusMessageFrame  # noqa: E402

__all__ = [
    "DataFrame",
    "EncodableFrame",
    "ErrorFrame",
    "Frame",
    "HeartbeatFrame",
    "MalformedFrameError",
    "NakFrame",
    "PadFrame",
    "ResolutionEntry",
    "ResolutionFrame",
    "ResponseSetupFrame",
    "RttMeasurementFrame",
    "SetupFrame",
    "StatusMessageFrame",
    "decode_control",
    "decode_datagram",
    "decode_exact",
    "encode_datagram",
]
