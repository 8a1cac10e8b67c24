"""Record checksums: a CRC-32 of each DATA frame's payload, stored in the frame's session id field.

Placement follows Aeron Archive's record checksum (``RecordingWriter.computeChecksum``): the
recorder writes each DATA frame with its session id field replaced by a checksum of the frame's
body, and verification recomputes it. The session id is redundant inside a recording (every frame
of a recording has the recording's session id, which the catalog entry holds), so the field can
carry the checksum without growing the frame or moving any byte, and replay already rewrites the
field to its own publication's session id. Differences from Aeron, and why:

- The checksum covers ``frame_length - 32`` payload bytes, not the payload plus alignment padding:
  the padding is not part of the message and a reader never looks at it.
- CRC-32 is zlib's (IEEE 802.3 polynomial, as Aeron's ``crc32`` option and Java's ``CRC32``): in the
  standard library, no extra dependency. The value is stored as the little-endian int32 with the
  same 32 bits.
- PAD frames are left as they are (only their header is recorded; Aeron skips them too).

Which recordings carry checksums is the catalog entry's checksum field (``catalog_descriptor``).
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Final

import numpy as np

from logbuf import native
from logbuf.logbuffer import data_header_descriptor as dh

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["checksum_mismatch", "payload_checksum", "stamp_block"]

_SESSION: Final[int] = dh.SESSION_ID_FIELD_OFFSET


def payload_checksum(payload: Buffer) -> int:
    """The CRC-32 of ``payload`` as the signed int32 stored in the session id field."""
    crc = zlib.crc32(payload)
    return crc - (1 << 32) if crc >= 1 << 31 else crc


def checksum_mismatch(stored: int, payload: Buffer) -> str | None:
    """None if ``stored`` (the session id field, signed) is the payload's checksum, else the reason."""
    computed = payload_checksum(payload)
    if computed == stored:
        return None
    return (
        f"payload checksum {computed & 0xFFFFFFFF:#010x} (CRC-32) does not match the recorded "
        f"{stored & 0xFFFFFFFF:#010x}: the payload was changed after it was recorded"
    )


def stamp_block(block: memoryview) -> bytearray:
    """A copy of ``block`` (whole frames from a term) with each DATA frame's session id field set to its
    payload's checksum. The frames are found by the native frame index (PAD frames are skipped); one
    zlib call per frame, and the fields are written with one numpy store."""
    copy = bytearray(block)
    capacity = max(1, len(copy) // dh.HEADER_LENGTH)
    offsets = np.empty(capacity, dtype=np.int32)
    lengths = np.empty(capacity, dtype=np.int32)
    n = native.frame_index(copy, offsets, lengths)
    if n == 0:
        return copy
    with memoryview(copy) as view:
        crcs = [zlib.crc32(view[o : o + length]) for o, length in zip(offsets[:n].tolist(), lengths[:n].tolist())]
    words = np.frombuffer(copy, dtype="<u4", count=len(copy) // 4)
    words[(offsets[:n] - dh.HEADER_LENGTH + _SESSION) // 4] = crcs
    del words  # releases the export, so the bytearray may be resized by its owner
    return copy
