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

Each message is a frozen dataclass whose fields are the schema's, in schema order, snake_case; the
annotation of a field says its wire type (``Int64``, ``Int32``, ``Int8``, ``Time``, ``Version``, an
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
from typing import Annotated, Any, ClassVar, Final, TypeAlias

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
    "ControlCodecError",
    "ControlMessage",
    "ControlResponse",
    "ControlResponseCode",
    "DATA_TYPE",
    "Data",
    "DeleteDetachedSegmentsRequest",
    "DetachSegmentsRequest",
    "ExtendRecordingRequest",
    "ExtendRecordingRequest2",
    "FieldLayout",
    "FindLastMatchingRecordingRequest",
    "INT32_TYPE",
    "INT64_TYPE",
    "INT8_TYPE",
    "Int32",
    "Int64",
    "Int8",
    "KeepAliveRequest",
    "LAYOUTS",
    "ListRecordingRequest",
    "ListRecordingSubscriptionsRequest",
    "ListRecordingsForUriRequest",
    "ListRecordingsRequest",
    "MESSAGE_HEADER",
    "MESSAGE_HEADER_LENGTH",
    "MaxRecordedPositionRequest",
    "MessageLayout",
    "MigrateSegmentsRequest",
    "NULL_INT32",
    "NULL_INT64",
    "NULL_INT8",
    "NULL_VERSION",
    "PROTOCOL_SEMANTIC_VERSION",
    "Ping",
    "Primitive",
    "PurgeRecordingRequest",
    "PurgeSegmentsRequest",
    "RecordingDescriptor",
    "RecordingDescriptorHeader",
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
    "SCHEMA_ID",
    "SCHEMA_VERSION",
    "SEMANTIC_VERSION",
    "Since",
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
    "TEMPLATES",
    "TIME_TYPE",
    "TaggedReplicateRequest",
    "Time",
    "TruncateRecordingRequest",
    "UpdateChannelRequest",
    "VAR_DATA_MAX_LENGTH",
    "VAR_LENGTH",
    "VAR_LENGTH_HEADER_LENGTH",
    "VERSION_TYPE",
    "VarData",
    "VarFieldLayout",
    "Version",
    "decode",
    "encode",
    "layout_of",
    "schema_name",
    "semantic_version",
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

NULL_INT8: Final = -(1 << 7)
NULL_INT32: Final = -(1 << 31)
NULL_INT64: Final = -(1 << 63)
NULL_VERSION: Final = 0  # version_t is optional with nullValue 0


def semantic_version(major: int, minor: int, patch: int) -> int:
    """Aeron's ``SemanticVersion.compose``: one byte each for major, minor and patch."""
    return (major << 16) | (minor << 8) | patch


PROTOCOL_SEMANTIC_VERSION: Final = semantic_version(1, 12, 0)
"""The control protocol version Aeron 1.52's archive client sends in its connect request (1.12.0)."""


class ControlCodecError(ValueError):
    """A control message that cannot be encoded or decoded; the message names the problem."""


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
)

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
