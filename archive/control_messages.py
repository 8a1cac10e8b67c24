"""The archive control protocol's messages: Aeron Archive's enums and one frozen dataclass per message.

The declarative half of :mod:`logbuf.archive.control_codec` (which re-exports every name here):
the schema's enums with Aeron's names and values, the wire types as annotations, and the 50 messages
of schema version 13, each with its ``TEMPLATE_ID``, its fields in schema order under snake_case
names of Aeron's, typed by wire type. A field added after version 0 is ``Annotated[..., Since(n)]``;
a field at an explicit offset is ``Annotated[..., At(n)]``. The codec derives every layout from
these annotations.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Annotated, ClassVar, Final, TypeAlias

__all__ = [
    "ASCII_TYPE",
    "ArchiveErrorCode",
    "ArchiveIdRequest",
    "Ascii",
    "At",
    "AttachSegmentsRequest",
    "AuthConnectRequest",
    "BooleanType",
    "BoundedReplayRequest",
    "CatalogHeader",
    "Challenge",
    "ChallengeResponse",
    "CloseSessionRequest",
    "ConnectRequest",
    "ControlMessage",
    "ControlResponse",
    "ControlResponseCode",
    "DATA_TYPE",
    "Data",
    "DeleteDetachedSegmentsRequest",
    "DetachSegmentsRequest",
    "ExtendRecordingRequest",
    "ExtendRecordingRequest2",
    "FindLastMatchingRecordingRequest",
    "INT32_TYPE",
    "INT64_TYPE",
    "INT8_TYPE",
    "Int32",
    "Int64",
    "Int8",
    "KeepAliveRequest",
    "LOGBUF_TEMPLATE_ID_BASE",
    "ListRecordingRequest",
    "ListRecordingSubscriptionsRequest",
    "ListRecordingsForUriRequest",
    "ListRecordingsRequest",
    "MaxRecordedPositionRequest",
    "MigrateSegmentsRequest",
    "NULL_INT32",
    "NULL_INT64",
    "NULL_INT8",
    "NULL_VERSION",
    "Ping",
    "Primitive",
    "PurgeRecordingRequest",
    "PurgeSegmentsRequest",
    "RecordingDescriptor",
    "RecordingDescriptorHeader",
    "RecordingPositionAtTimeRequest",
    "RecordingPositionRequest",
    "RecordingProgress",
    "RecordingSignal",
    "RecordingSignalEvent",
    "RecordingStarted",
    "RecordingState",
    "RecordingStopped",
    "RecordingSubscriptionDescriptor",
    "ReplayRequest",
    "ReplayTokenRequest",
    "ReplicateRequest",
    "ReplicateRequest2",
    "Since",
    "SYNC_TEMPLATE_ID_BASE",
    "SourceLocation",
    "StartPositionRequest",
    "StartRecordingRequest",
    "StartRecordingRequest2",
    "StopAllReplaysRequest",
    "StopPositionRequest",
    "StopRecordingByIdentityRequest",
    "StopRecordingRequest",
    "StopRecordingSubscriptionRequest",
    "StopReplayRequest",
    "StopReplicationRequest",
    "SyncDigestRequest",
    "SyncDigests",
    "SyncFrames",
    "SyncFramesRequest",
    "SyncRepairRequest",
    "TIME_TYPE",
    "TaggedReplicateRequest",
    "Time",
    "TruncateRecordingRequest",
    "UpdateChannelRequest",
    "VERSION_TYPE",
    "VarData",
    "Version",
]

NULL_INT8: Final = -(1 << 7)
NULL_INT32: Final = -(1 << 31)
NULL_INT64: Final = -(1 << 63)
NULL_VERSION: Final = 0  # version_t is optional with nullValue 0


# --- Enums (Aeron's names and values; every one is encoded as an int32) ----------------------------------


class ControlResponseCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    RECORDING_UNKNOWN = 2  # also ends a list of descriptors: see protocol_spec/archive-control.md
    SUBSCRIPTION_UNKNOWN = 3  # also ends a list of recording subscriptions


class SourceLocation(enum.IntEnum):
    LOCAL = 0  # the recorded stream is on the archive's own driver (IPC or spied)
    REMOTE = 1


class BooleanType(enum.IntEnum):
    FALSE = 0
    TRUE = 1


class RecordingSignal(enum.IntEnum):
    START = 0
    STOP = 1
    EXTEND = 2
    REPLICATE = 3
    MERGE = 4
    SYNC = 5
    DELETE = 6
    REPLICATE_END = 7


class RecordingState(enum.IntEnum):
    """State of a recording in Aeron's catalog (RecordingDescriptorHeader)."""

    INVALID = 0
    VALID = 1
    DELETED = 2  # since schema version 10


class ArchiveErrorCode(enum.IntEnum):
    """Aeron's ``ArchiveException`` codes, sent as the relevantId of a ControlResponse with code ERROR."""

    GENERIC = 0
    ACTIVE_LISTING = 1
    ACTIVE_RECORDING = 2
    ACTIVE_SUBSCRIPTION = 3
    UNKNOWN_SUBSCRIPTION = 4
    UNKNOWN_RECORDING = 5
    UNKNOWN_REPLAY = 6
    MAX_REPLAYS = 7
    MAX_RECORDINGS = 8
    INVALID_EXTENSION = 9
    AUTHENTICATION_REJECTED = 10
    STORAGE_SPACE = 11
    UNKNOWN_REPLICATION = 12
    UNAUTHORISED_ACTION = 13
    REPLICATION_CONNECTION_FAILURE = 14
    EMPTY_RECORDING = 15
    INVALID_POSITION = 16


# --- Wire types, as annotations -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Primitive:
    """A fixed-size wire type: its SBE type name, struct format, size, null value and range."""

    sbe_type: str
    fmt: str
    size: int
    null: int
    low: int
    high: int


@dataclass(frozen=True, slots=True)
class VarData:
    """A var-length wire type: a u32 length, then US-ASCII text (``ascii``) or opaque bytes."""

    sbe_type: str
    ascii: bool


@dataclass(frozen=True, slots=True)
class Since:
    """The schema version that added a field (or a message)."""

    version: int


@dataclass(frozen=True, slots=True)
class At:
    """A fixed offset in the block for a field that does not follow the previous one."""

    offset: int


INT8_TYPE: Final = Primitive("int8", "b", 1, NULL_INT8, -(1 << 7), (1 << 7) - 1)
INT32_TYPE: Final = Primitive("int32", "i", 4, NULL_INT32, -(1 << 31), (1 << 31) - 1)
INT64_TYPE: Final = Primitive("int64", "q", 8, NULL_INT64, -(1 << 63), (1 << 63) - 1)
TIME_TYPE: Final = Primitive("time_t", "q", 8, NULL_INT64, -(1 << 63), (1 << 63) - 1)  # epoch ms
VERSION_TYPE: Final = Primitive("version_t", "i", 4, NULL_VERSION, -(1 << 31), (1 << 31) - 1)
ASCII_TYPE: Final = VarData("varAsciiEncoding", ascii=True)
DATA_TYPE: Final = VarData("varDataEncoding", ascii=False)

Int8: TypeAlias = Annotated[int, INT8_TYPE]
Int32: TypeAlias = Annotated[int, INT32_TYPE]
Int64: TypeAlias = Annotated[int, INT64_TYPE]
Time: TypeAlias = Annotated[int, TIME_TYPE]
Version: TypeAlias = Annotated[int, VERSION_TYPE]
Ascii: TypeAlias = Annotated[str, ASCII_TYPE]
Data: TypeAlias = Annotated[bytes, DATA_TYPE]


# --- Messages, in template id order -------------------------------------------------------------------
# Control responses and descriptors go from the archive to a client's response channel; requests from a
# client to the control channel; RecordingStarted/Progress/Stopped on the recording events channel;
# CatalogHeader and RecordingDescriptorHeader are Aeron's catalog file records (no SBE header there).


@dataclass(frozen=True, slots=True)
class ControlResponse:
    """The archive's answer to a request; ``relevant_id`` is an id, or an ArchiveErrorCode with ERROR."""

    TEMPLATE_ID: ClassVar[int] = 1
    control_session_id: Int64
    correlation_id: Int64
    relevant_id: Int64
    code: ControlResponseCode
    version: Annotated[Version, Since(4)]
    error_message: Ascii


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """Open a control session (Aeron 1.52 clients send AuthConnectRequest; removed after version 13)."""

    TEMPLATE_ID: ClassVar[int] = 2
    correlation_id: Int64
    response_stream_id: Int32
    version: Annotated[Version, Since(2)]
    response_channel: Ascii


@dataclass(frozen=True, slots=True)
class CloseSessionRequest:
    TEMPLATE_ID: ClassVar[int] = 3
    control_session_id: Int64


@dataclass(frozen=True, slots=True)
class StartRecordingRequest:
    TEMPLATE_ID: ClassVar[int] = 4
    control_session_id: Int64
    correlation_id: Int64
    stream_id: Int32
    source_location: SourceLocation
    channel: Ascii


@dataclass(frozen=True, slots=True)
class StopRecordingRequest:
    TEMPLATE_ID: ClassVar[int] = 5
    control_session_id: Int64
    correlation_id: Int64
    stream_id: Int32
    channel: Ascii


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """Replay ``length`` bytes (``-1`` or more than recorded: follow a live recording) from ``position``."""

    TEMPLATE_ID: ClassVar[int] = 6
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    position: Int64
    length: Int64
    replay_stream_id: Int32
    file_io_max_length: Annotated[Int32, Since(7)]
    replay_token: Annotated[Int64, Since(10)]
    replay_channel: Ascii


@dataclass(frozen=True, slots=True)
class StopReplayRequest:
    TEMPLATE_ID: ClassVar[int] = 7
    control_session_id: Int64
    correlation_id: Int64
    replay_session_id: Int64


@dataclass(frozen=True, slots=True)
class ListRecordingsRequest:
    TEMPLATE_ID: ClassVar[int] = 8
    control_session_id: Int64
    correlation_id: Int64
    from_recording_id: Int64
    record_count: Int32


@dataclass(frozen=True, slots=True)
class ListRecordingsForUriRequest:
    TEMPLATE_ID: ClassVar[int] = 9
    control_session_id: Int64
    correlation_id: Int64
    from_recording_id: Int64
    record_count: Int32
    stream_id: Int32
    channel: Ascii


@dataclass(frozen=True, slots=True)
class ListRecordingRequest:
    TEMPLATE_ID: ClassVar[int] = 10
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class ExtendRecordingRequest:
    TEMPLATE_ID: ClassVar[int] = 11
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    stream_id: Int32
    source_location: SourceLocation
    channel: Ascii


@dataclass(frozen=True, slots=True)
class RecordingPositionRequest:
    TEMPLATE_ID: ClassVar[int] = 12
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class TruncateRecordingRequest:
    TEMPLATE_ID: ClassVar[int] = 13
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    position: Int64


@dataclass(frozen=True, slots=True)
class StopRecordingSubscriptionRequest:
    TEMPLATE_ID: ClassVar[int] = 14
    control_session_id: Int64
    correlation_id: Int64
    subscription_id: Int64


@dataclass(frozen=True, slots=True)
class StopPositionRequest:
    TEMPLATE_ID: ClassVar[int] = 15
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class FindLastMatchingRecordingRequest:
    TEMPLATE_ID: ClassVar[int] = 16
    control_session_id: Int64
    correlation_id: Int64
    min_recording_id: Int64
    session_id: Int32
    stream_id: Int32
    channel: Ascii


@dataclass(frozen=True, slots=True)
class ListRecordingSubscriptionsRequest:
    TEMPLATE_ID: ClassVar[int] = 17
    control_session_id: Int64
    correlation_id: Int64
    pseudo_index: Int32
    subscription_count: Int32
    apply_stream_id: BooleanType
    stream_id: Int32
    channel: Ascii


@dataclass(frozen=True, slots=True)
class BoundedReplayRequest:
    """A replay that never passes the value of counter ``limit_counter_id`` (for a growing recording)."""

    TEMPLATE_ID: ClassVar[int] = 18
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    position: Int64
    length: Int64
    limit_counter_id: Int32
    replay_stream_id: Int32
    file_io_max_length: Annotated[Int32, Since(7)]
    replay_token: Annotated[Int64, Since(10)]
    replay_channel: Ascii


@dataclass(frozen=True, slots=True)
class StopAllReplaysRequest:
    """Stop every replay of ``recording_id`` (``NULL_INT64``: of every recording)."""

    TEMPLATE_ID: ClassVar[int] = 19
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class CatalogHeader:
    """First record of Aeron's catalog file (32 bytes; ``reserved`` pads it)."""

    TEMPLATE_ID: ClassVar[int] = 20
    version: Int32
    length: Int32
    next_recording_id: Int64
    alignment: Int32
    reserved: Annotated[Int8, At(31)]


@dataclass(frozen=True, slots=True)
class RecordingDescriptorHeader:
    """Header of each entry of Aeron's catalog file (32 bytes; ``reserved`` pads it)."""

    TEMPLATE_ID: ClassVar[int] = 21
    length: Int32
    state: RecordingState
    checksum: Int32
    reserved: Annotated[Int8, At(31)]


@dataclass(frozen=True, slots=True)
class RecordingDescriptor:
    """One recording, answering a list request (see the list-end convention in the spec)."""

    TEMPLATE_ID: ClassVar[int] = 22
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    start_timestamp: Time
    stop_timestamp: Time
    start_position: Int64
    stop_position: Int64
    initial_term_id: Int32
    segment_file_length: Int32
    term_buffer_length: Int32
    mtu_length: Int32
    session_id: Int32
    stream_id: Int32
    stripped_channel: Ascii
    original_channel: Ascii
    source_identity: Ascii


@dataclass(frozen=True, slots=True)
class RecordingSubscriptionDescriptor:
    TEMPLATE_ID: ClassVar[int] = 23
    control_session_id: Int64
    correlation_id: Int64
    subscription_id: Int64
    stream_id: Int32
    stripped_channel: Ascii


@dataclass(frozen=True, slots=True)
class RecordingSignalEvent:
    TEMPLATE_ID: ClassVar[int] = 24
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    subscription_id: Int64
    position: Int64
    signal: RecordingSignal


@dataclass(frozen=True, slots=True)
class ReplicateRequest:
    TEMPLATE_ID: ClassVar[int] = 50
    control_session_id: Int64
    correlation_id: Int64
    src_recording_id: Int64
    dst_recording_id: Int64
    src_control_stream_id: Int32
    src_control_channel: Ascii
    live_destination: Ascii


@dataclass(frozen=True, slots=True)
class StopReplicationRequest:
    TEMPLATE_ID: ClassVar[int] = 51
    control_session_id: Int64
    correlation_id: Int64
    replication_id: Int64


@dataclass(frozen=True, slots=True)
class StartPositionRequest:
    TEMPLATE_ID: ClassVar[int] = 52
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class DetachSegmentsRequest:
    TEMPLATE_ID: ClassVar[int] = 53
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    new_start_position: Int64


@dataclass(frozen=True, slots=True)
class DeleteDetachedSegmentsRequest:
    TEMPLATE_ID: ClassVar[int] = 54
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class PurgeSegmentsRequest:
    TEMPLATE_ID: ClassVar[int] = 55
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    new_start_position: Int64


@dataclass(frozen=True, slots=True)
class AttachSegmentsRequest:
    TEMPLATE_ID: ClassVar[int] = 56
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class MigrateSegmentsRequest:
    TEMPLATE_ID: ClassVar[int] = 57
    control_session_id: Int64
    correlation_id: Int64
    src_recording_id: Int64
    dst_recording_id: Int64


@dataclass(frozen=True, slots=True)
class AuthConnectRequest:
    """Open a control session, with credentials (the connect request Aeron's clients send)."""

    TEMPLATE_ID: ClassVar[int] = 58
    correlation_id: Int64
    response_stream_id: Int32
    version: Version
    response_channel: Ascii
    encoded_credentials: Data
    client_info: Annotated[Ascii, Since(12)]


@dataclass(frozen=True, slots=True)
class Challenge:
    TEMPLATE_ID: ClassVar[int] = 59
    control_session_id: Int64
    correlation_id: Int64
    version: Version
    encoded_challenge: Data


@dataclass(frozen=True, slots=True)
class ChallengeResponse:
    TEMPLATE_ID: ClassVar[int] = 60
    control_session_id: Int64
    correlation_id: Int64
    encoded_credentials: Data


@dataclass(frozen=True, slots=True)
class KeepAliveRequest:
    TEMPLATE_ID: ClassVar[int] = 61
    control_session_id: Int64
    correlation_id: Int64


@dataclass(frozen=True, slots=True)
class TaggedReplicateRequest:
    TEMPLATE_ID: ClassVar[int] = 62
    control_session_id: Int64
    correlation_id: Int64
    src_recording_id: Int64
    dst_recording_id: Int64
    channel_tag_id: Int64
    subscription_tag_id: Int64
    src_control_stream_id: Int32
    src_control_channel: Ascii
    live_destination: Ascii


@dataclass(frozen=True, slots=True)
class StartRecordingRequest2:
    TEMPLATE_ID: ClassVar[int] = 63
    control_session_id: Int64
    correlation_id: Int64
    stream_id: Int32
    source_location: SourceLocation
    auto_stop: BooleanType
    channel: Ascii


@dataclass(frozen=True, slots=True)
class ExtendRecordingRequest2:
    TEMPLATE_ID: ClassVar[int] = 64
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    stream_id: Int32
    source_location: SourceLocation
    auto_stop: BooleanType
    channel: Ascii


@dataclass(frozen=True, slots=True)
class StopRecordingByIdentityRequest:
    TEMPLATE_ID: ClassVar[int] = 65
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class ReplicateRequest2:
    TEMPLATE_ID: ClassVar[int] = 66
    SINCE_VERSION: ClassVar[int] = 6
    control_session_id: Int64
    correlation_id: Int64
    src_recording_id: Int64
    dst_recording_id: Int64
    stop_position: Int64
    channel_tag_id: Int64
    subscription_tag_id: Int64
    src_control_stream_id: Int32
    file_io_max_length: Annotated[Int32, Since(7)]
    replication_session_id: Annotated[Int32, Since(8)]
    src_control_channel: Ascii
    live_destination: Ascii
    replication_channel: Ascii
    encoded_credentials: Annotated[Data, Since(8)]
    src_response_channel: Annotated[Ascii, Since(10)]


@dataclass(frozen=True, slots=True)
class MaxRecordedPositionRequest:
    TEMPLATE_ID: ClassVar[int] = 67
    SINCE_VERSION: ClassVar[int] = 9
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class ArchiveIdRequest:
    TEMPLATE_ID: ClassVar[int] = 68
    SINCE_VERSION: ClassVar[int] = 9
    control_session_id: Int64
    correlation_id: Int64


@dataclass(frozen=True, slots=True)
class RecordingStarted:
    TEMPLATE_ID: ClassVar[int] = 101
    recording_id: Int64
    start_position: Int64
    session_id: Int32
    stream_id: Int32
    channel: Ascii
    source_identity: Ascii


@dataclass(frozen=True, slots=True)
class RecordingProgress:
    TEMPLATE_ID: ClassVar[int] = 102
    recording_id: Int64
    start_position: Int64
    position: Int64


@dataclass(frozen=True, slots=True)
class RecordingStopped:
    TEMPLATE_ID: ClassVar[int] = 103
    recording_id: Int64
    start_position: Int64
    stop_position: Int64


@dataclass(frozen=True, slots=True)
class PurgeRecordingRequest:
    TEMPLATE_ID: ClassVar[int] = 104
    SINCE_VERSION: ClassVar[int] = 5
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class ReplayTokenRequest:
    TEMPLATE_ID: ClassVar[int] = 105
    SINCE_VERSION: ClassVar[int] = 10
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64


@dataclass(frozen=True, slots=True)
class Ping:
    TEMPLATE_ID: ClassVar[int] = 106
    SINCE_VERSION: ClassVar[int] = 11
    control_session_id: Int64


@dataclass(frozen=True, slots=True)
class UpdateChannelRequest:
    TEMPLATE_ID: ClassVar[int] = 107
    SINCE_VERSION: ClassVar[int] = 13
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    channel: Ascii


LOGBUF_TEMPLATE_ID_BASE: Final = 1000
"""logbuf's own messages take template ids from here on, far outside Aeron's (1 to 68, 101 to 107)."""


@dataclass(frozen=True, slots=True)
class RecordingPositionAtTimeRequest:
    """logbuf extension: the position of a recording's first message stamped (reserved value) at or after
    ``time``; the OK response's relevantId, or the recorded position if no message is that recent."""

    TEMPLATE_ID: ClassVar[int] = LOGBUF_TEMPLATE_ID_BASE + 1
    control_session_id: Int64
    correlation_id: Int64
    recording_id: Int64
    time: Int64


SYNC_TEMPLATE_ID_BASE: Final = 0x4C00
"""Archive sync's digest exchange (``protocol_spec/archive-sync.md``): logbuf messages from 0x4C00 on."""


@dataclass(frozen=True, slots=True)
class SyncDigestRequest:
    """logbuf extension: digests of ``blocks`` of one stream history, each over the block clipped to
    ``common`` (both int64 LE ``[start, end)`` pairs); with ``verify`` TRUE, also whether the frames that
    overlap each block verify. The history is the archive's recordings of this publication."""

    TEMPLATE_ID: ClassVar[int] = SYNC_TEMPLATE_ID_BASE
    control_session_id: Int64
    correlation_id: Int64
    session_id: Int32
    stream_id: Int32
    initial_term_id: Int32
    term_buffer_length: Int32
    verify: BooleanType
    channel: Ascii
    common: Data
    blocks: Data


@dataclass(frozen=True, slots=True)
class SyncDigests:
    """logbuf extension: the answer to a SyncDigestRequest: ``block_count`` 16-byte digests in the request's
    block order and, when asked, one :class:`logbuf.archive.sync_digest.Verdict` byte per block."""

    TEMPLATE_ID: ClassVar[int] = SYNC_TEMPLATE_ID_BASE + 1
    control_session_id: Int64
    correlation_id: Int64
    block_count: Int32
    digests: Data
    verdicts: Data


@dataclass(frozen=True, slots=True)
class SyncFramesRequest:
    """logbuf extension: the frames of one stream history that overlap ``[start, end)``, as stored (for the
    repair of a conflict from the side whose frames verify); answered by SyncFrames."""

    TEMPLATE_ID: ClassVar[int] = SYNC_TEMPLATE_ID_BASE + 2
    control_session_id: Int64
    correlation_id: Int64
    session_id: Int32
    stream_id: Int32
    initial_term_id: Int32
    term_buffer_length: Int32
    start: Int64
    end: Int64
    channel: Ascii


@dataclass(frozen=True, slots=True)
class SyncFrames:
    """logbuf extension: whole frames as stored, the first at ``position``."""

    TEMPLATE_ID: ClassVar[int] = SYNC_TEMPLATE_ID_BASE + 3
    control_session_id: Int64
    correlation_id: Int64
    position: Int64
    frames: Data


@dataclass(frozen=True, slots=True)
class SyncRepairRequest:
    """logbuf extension: replace this archive's frames at ``position`` with ``frames``; done only if every
    given frame verifies (well formed at its position, CRC-32 matching) and this archive's own frames there
    fail to. The OK response's relevantId is the bytes written."""

    TEMPLATE_ID: ClassVar[int] = SYNC_TEMPLATE_ID_BASE + 4
    control_session_id: Int64
    correlation_id: Int64
    session_id: Int32
    stream_id: Int32
    initial_term_id: Int32
    term_buffer_length: Int32
    position: Int64
    channel: Ascii
    frames: Data


ControlMessage: TypeAlias = (
    ControlResponse
    | ConnectRequest
    | CloseSessionRequest
    | StartRecordingRequest
    | StopRecordingRequest
    | ReplayRequest
    | StopReplayRequest
    | ListRecordingsRequest
    | ListRecordingsForUriRequest
    | ListRecordingRequest
    | ExtendRecordingRequest
    | RecordingPositionRequest
    | TruncateRecordingRequest
    | StopRecordingSubscriptionRequest
    | StopPositionRequest
    | FindLastMatchingRecordingRequest
    | ListRecordingSubscriptionsRequest
    | BoundedReplayRequest
    | StopAllReplaysRequest
    | CatalogHeader
    | RecordingDescriptorHeader
    | RecordingDescriptor
    | RecordingSubscriptionDescriptor
    | RecordingSignalEvent
    | ReplicateRequest
    | StopReplicationRequest
    | StartPositionRequest
    | DetachSegmentsRequest
    | DeleteDetachedSegmentsRequest
    | PurgeSegmentsRequest
    | AttachSegmentsRequest
    | MigrateSegmentsRequest
    | AuthConnectRequest
    | Challenge
    | ChallengeResponse
    | KeepAliveRequest
    | TaggedReplicateRequest
    | StartRecordingRequest2
    | ExtendRecordingRequest2
    | StopRecordingByIdentityRequest
    | ReplicateRequest2
    | MaxRecordedPositionRequest
    | ArchiveIdRequest
    | RecordingStarted
    | RecordingProgress
    | RecordingStopped
    | PurgeRecordingRequest
    | ReplayTokenRequest
    | Ping
    | UpdateChannelRequest
    | RecordingPositionAtTimeRequest
    | SyncDigestRequest
    | SyncDigests
    | SyncFramesRequest
    | SyncFrames
    | SyncRepairRequest
)
