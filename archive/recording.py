"""One recording as the catalog describes it: its state and its descriptor, read at one moment.

Plain values with no I/O, so that the modules that read recordings (verify, the Spark source) and the
catalog that stores them can all depend on them without depending on each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from logbuf.archive import catalog_descriptor as cat
from logbuf.logbuffer import log_buffer_descriptor as lbd

__all__ = ["ChecksumType", "RecordingDescriptor", "RecordingState"]


class RecordingState(IntEnum):
    INVALID = 0
    VALID = 1
    DELETED = 2


class ChecksumType(IntEnum):
    """What a recording's DATA frames carry in their session id field (see catalog_descriptor)."""

    NONE = cat.CHECKSUM_NONE
    CRC32 = cat.CHECKSUM_CRC32


@dataclass(frozen=True)
class RecordingDescriptor:
    """One recording's entry, as read at one moment."""

    recording_id: int
    state: RecordingState
    active: bool
    """A recorder is still writing it (its process is alive and heartbeating)."""
    channel: str
    source_identity: str
    stream_id: int
    session_id: int
    initial_term_id: int
    term_length: int
    mtu: int
    segment_length: int
    start_position: int
    stop_position: int
    """While active: the recorded position so far (every byte before it is written and complete)."""
    start_time_ms: int
    stop_time_ms: int
    """Epoch ms; -1 while active."""
    interrupted: bool
    """The recorder died; stop_position is the end of the verified valid prefix."""
    checksum: ChecksumType = ChecksumType.NONE
    """CRC32: each DATA frame's session id field holds the CRC-32 of its payload, not the session id."""

    @property
    def position_bits_to_shift(self) -> int:
        return self.term_length.bit_length() - 1

    @property
    def recorded_length(self) -> int:
        return self.stop_position - self.start_position

    def term_id_of(self, position: int) -> int:
        """Term id of the term holding ``position`` (wrapping as int32)."""
        return lbd.compute_term_id_from_position(position, self.position_bits_to_shift, self.initial_term_id)
