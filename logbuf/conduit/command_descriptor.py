"""Client <-> driver commands and responses: the messages in the CnC's to-driver ring buffer and
to-clients broadcast buffer. Type ids and layouts follow Aeron's ``ControlProtocolEvents`` and
command flyweights. All fields little-endian; strings are int32 length + ASCII/UTF-8 bytes.

Correlated message (every command starts with it)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                          Client ID (int64)                    |   0
    +---------------------------------------------------------------+
    |                       Correlation ID (int64)                  |   8
    +---------------------------------------------------------------+

ADD_PUBLICATION / ADD_EXCLUSIVE_PUBLICATION: correlated (16) + stream id int32 @16 + channel length
int32 @20 + channel @24. ADD_SUBSCRIPTION: correlated + registration correlation id int64 @16 +
stream id @24 + channel length @28 + channel @32. REMOVE_*: correlated + registration id int64 @16.
ADD_DESTINATION / REMOVE_DESTINATION (Aeron's DestinationMessageFlyweight): correlated + the
publication's registration id int64 @16 + channel length int32 @24 + channel @28.
CLIENT_KEEPALIVE / CLIENT_CLOSE: correlated only. TERMINATE_DRIVER: correlated + token length int32 @16
+ token @20.

Responses: ON_ERROR (offending correlation id int64, error code int32, message), ON_PUBLICATION_READY
(correlation id, registration id, session id, stream id, publisher-limit counter id, channel-status
counter id, log file name), ON_AVAILABLE_IMAGE (correlation id, session id, stream id, subscription
registration id, subscriber-position counter id, log file name padded with zeros to a multiple of 4
bytes, source identity),
ON_UNAVAILABLE_IMAGE (correlation id, subscription registration id, stream id, channel),
ON_OPERATION_SUCCESS / ON_SUBSCRIPTION_READY (correlation id [, channel-status counter id]),
ON_CLIENT_TIMEOUT (client id).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from logbuf.errors import MalformedCommandError as MalformedCommandError  # raised here

# -- type ids -------------------------------------------------------------------------------------
ADD_PUBLICATION: Final[int] = 0x01
REMOVE_PUBLICATION: Final[int] = 0x02
ADD_EXCLUSIVE_PUBLICATION: Final[int] = 0x03
ADD_SUBSCRIPTION: Final[int] = 0x04
REMOVE_SUBSCRIPTION: Final[int] = 0x05
CLIENT_KEEPALIVE: Final[int] = 0x06
ADD_DESTINATION: Final[int] = 0x07
REMOVE_DESTINATION: Final[int] = 0x08
CLIENT_CLOSE: Final[int] = 0x0B
TERMINATE_DRIVER: Final[int] = 0x0E

ON_ERROR: Final[int] = 0x0F01
ON_AVAILABLE_IMAGE: Final[int] = 0x0F02
ON_PUBLICATION_READY: Final[int] = 0x0F03
ON_OPERATION_SUCCESS: Final[int] = 0x0F04
ON_UNAVAILABLE_IMAGE: Final[int] = 0x0F05
ON_EXCLUSIVE_PUBLICATION_READY: Final[int] = 0x0F06
ON_SUBSCRIPTION_READY: Final[int] = 0x0F07
ON_CLIENT_TIMEOUT: Final[int] = 0x0F0A

COMMAND_NAMES: Final[dict[int, str]] = {
    ADD_PUBLICATION: "ADD_PUBLICATION",
    REMOVE_PUBLICATION: "REMOVE_PUBLICATION",
    ADD_EXCLUSIVE_PUBLICATION: "ADD_EXCLUSIVE_PUBLICATION",
    ADD_SUBSCRIPTION: "ADD_SUBSCRIPTION",
    REMOVE_SUBSCRIPTION: "REMOVE_SUBSCRIPTION",
    CLIENT_KEEPALIVE: "CLIENT_KEEPALIVE",
    ADD_DESTINATION: "ADD_DESTINATION",
    REMOVE_DESTINATION: "REMOVE_DESTINATION",
    CLIENT_CLOSE: "CLIENT_CLOSE",
    TERMINATE_DRIVER: "TERMINATE_DRIVER",
}


CORRELATED: Final[struct.Struct] = struct.Struct("<qq")
CORRELATED_LENGTH: Final[int] = CORRELATED.size
PUBLICATION_FIXED: Final[struct.Struct] = struct.Struct("<qqii")
SUBSCRIPTION_FIXED: Final[struct.Struct] = struct.Struct("<qqqii")
REMOVE: Final[struct.Struct] = struct.Struct("<qqq")
DESTINATION_FIXED: Final[struct.Struct] = struct.Struct("<qqqi")
ERROR_FIXED: Final[struct.Struct] = struct.Struct("<qii")
PUBLICATION_READY_FIXED: Final[struct.Struct] = struct.Struct("<qqiiiii")
AVAILABLE_IMAGE_FIXED: Final[struct.Struct] = struct.Struct("<qiiqii")
UNAVAILABLE_IMAGE_FIXED: Final[struct.Struct] = struct.Struct("<qqii")
SUBSCRIPTION_READY: Final[struct.Struct] = struct.Struct("<qi")
OPERATION_SUCCESS: Final[struct.Struct] = struct.Struct("<q")
CLIENT_TIMEOUT: Final[struct.Struct] = struct.Struct("<q")
TERMINATE_DRIVER_FIXED: Final[struct.Struct] = struct.Struct("<qqi")
_I32: Final[struct.Struct] = struct.Struct("<i")

MAX_STRING_LENGTH: Final[int] = 4096


def _string(buffer: bytes | memoryview, offset: int, what: str) -> tuple[str, int]:
    if len(buffer) < offset + 4:
        raise MalformedCommandError(f"{what}: {len(buffer)} bytes is too short for the length at offset {offset}")
    (length,) = _I32.unpack_from(buffer, offset)
    if not 0 <= length <= MAX_STRING_LENGTH or len(buffer) < offset + 4 + length:
        raise MalformedCommandError(f"{what}: string length={length} does not fit the {len(buffer)}-byte message")
    raw = bytes(buffer[offset + 4 : offset + 4 + length])
    try:
        return raw.decode("utf-8"), offset + 4 + length
    except UnicodeDecodeError as e:
        raise MalformedCommandError(f"{what}: string is not UTF-8 ({e})") from None


def _encode_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > MAX_STRING_LENGTH:
        raise ValueError(f"string of {len(raw)} bytes exceeds {MAX_STRING_LENGTH}")
    return _I32.pack(len(raw)) + raw


def _align4(length: int) -> int:
    """Aeron's rule for a string followed by another field: its bytes are padded to a multiple of 4."""
    return (length + 3) & ~3


def _fixed(s: struct.Struct, buffer: bytes | memoryview, what: str) -> tuple[int, ...]:
    if len(buffer) < s.size:
        raise MalformedCommandError(f"{what}: {len(buffer)} bytes is shorter than its fixed {s.size}-byte part")
    return s.unpack_from(buffer, 0)


# -- commands ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PublicationCommand:
    client_id: int
    correlation_id: int
    stream_id: int
    channel: str

    def encode(self) -> bytes:
        raw = self.channel.encode("utf-8")
        return PUBLICATION_FIXED.pack(self.client_id, self.correlation_id, self.stream_id, len(raw)) + raw

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> PublicationCommand:
        client_id, correlation_id, stream_id, _ = _fixed(PUBLICATION_FIXED, buffer, "publication command")
        channel, _end = _string(buffer, PUBLICATION_FIXED.size - 4, "publication command channel")
        return cls(client_id, correlation_id, stream_id, channel)


@dataclass(frozen=True, slots=True)
class SubscriptionCommand:
    client_id: int
    correlation_id: int
    registration_correlation_id: int
    stream_id: int
    channel: str

    def encode(self) -> bytes:
        raw = self.channel.encode("utf-8")
        return (
            SUBSCRIPTION_FIXED.pack(
                self.client_id, self.correlation_id, self.registration_correlation_id, self.stream_id, len(raw)
            )
            + raw
        )

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> SubscriptionCommand:
        client_id, correlation_id, reg, stream_id, _ = _fixed(SUBSCRIPTION_FIXED, buffer, "subscription command")
        channel, _end = _string(buffer, SUBSCRIPTION_FIXED.size - 4, "subscription command channel")
        return cls(client_id, correlation_id, reg, stream_id, channel)


@dataclass(frozen=True, slots=True)
class RemoveCommand:
    client_id: int
    correlation_id: int
    registration_id: int

    def encode(self) -> bytes:
        return REMOVE.pack(self.client_id, self.correlation_id, self.registration_id)

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> RemoveCommand:
        return cls(*_fixed(REMOVE, buffer, "remove command"))


@dataclass(frozen=True, slots=True)
class DestinationCommand:
    """ADD_DESTINATION / REMOVE_DESTINATION: a destination channel for an MDC publication."""

    client_id: int
    correlation_id: int
    registration_id: int
    channel: str

    def encode(self) -> bytes:
        raw = self.channel.encode("utf-8")
        return DESTINATION_FIXED.pack(self.client_id, self.correlation_id, self.registration_id, len(raw)) + raw

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> DestinationCommand:
        client_id, correlation_id, registration_id, _ = _fixed(DESTINATION_FIXED, buffer, "destination command")
        channel, _end = _string(buffer, DESTINATION_FIXED.size - 4, "destination command channel")
        return cls(client_id, correlation_id, registration_id, channel)


@dataclass(frozen=True, slots=True)
class CorrelatedCommand:
    client_id: int
    correlation_id: int

    def encode(self) -> bytes:
        return CORRELATED.pack(self.client_id, self.correlation_id)

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> CorrelatedCommand:
        return cls(*_fixed(CORRELATED, buffer, "correlated command"))


@dataclass(frozen=True, slots=True)
class TerminateDriverCommand:
    """TERMINATE_DRIVER: correlated + token length int32 @16 + token bytes @20 (Aeron's layout)."""

    client_id: int
    correlation_id: int
    token: bytes = b""

    def encode(self) -> bytes:
        return TERMINATE_DRIVER_FIXED.pack(self.client_id, self.correlation_id, len(self.token)) + self.token

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> TerminateDriverCommand:
        if len(buffer) == CORRELATED_LENGTH:  # no token field at all
            return cls(*CORRELATED.unpack_from(buffer, 0))
        client_id, correlation_id, length = _fixed(TERMINATE_DRIVER_FIXED, buffer, "terminate driver command")
        if not 0 <= length <= MAX_STRING_LENGTH or len(buffer) < TERMINATE_DRIVER_FIXED.size + length:
            raise MalformedCommandError(
                f"terminate driver command: token length={length} does not fit the {len(buffer)}-byte message"
            )
        start = TERMINATE_DRIVER_FIXED.size
        return cls(client_id, correlation_id, bytes(buffer[start : start + length]))


# -- responses ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ErrorResponse:
    offending_correlation_id: int
    error_code: int
    message: str

    def encode(self) -> bytes:
        raw = self.message.encode("utf-8")[:MAX_STRING_LENGTH]
        return ERROR_FIXED.pack(self.offending_correlation_id, self.error_code, len(raw)) + raw

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> ErrorResponse:
        correlation_id, code, _ = _fixed(ERROR_FIXED, buffer, "error response")
        message, _end = _string(buffer, ERROR_FIXED.size - 4, "error response message")
        return cls(correlation_id, code, message)


@dataclass(frozen=True, slots=True)
class PublicationReady:
    correlation_id: int
    registration_id: int
    session_id: int
    stream_id: int
    position_limit_counter_id: int
    channel_status_indicator_id: int
    log_file_name: str

    def encode(self) -> bytes:
        raw = self.log_file_name.encode("utf-8")
        return (
            PUBLICATION_READY_FIXED.pack(
                self.correlation_id,
                self.registration_id,
                self.session_id,
                self.stream_id,
                self.position_limit_counter_id,
                self.channel_status_indicator_id,
                len(raw),
            )
            + raw
        )

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> PublicationReady:
        fields = _fixed(PUBLICATION_READY_FIXED, buffer, "publication ready")
        name, _end = _string(buffer, PUBLICATION_READY_FIXED.size - 4, "publication ready log file name")
        return cls(fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], name)


@dataclass(frozen=True, slots=True)
class ImageReady:
    correlation_id: int
    session_id: int
    stream_id: int
    subscription_registration_id: int
    subscriber_position_id: int
    log_file_name: str
    source_identity: str

    def encode(self) -> bytes:
        raw = self.log_file_name.encode("utf-8")
        return (
            AVAILABLE_IMAGE_FIXED.pack(
                self.correlation_id,
                self.session_id,
                self.stream_id,
                self.subscription_registration_id,
                self.subscriber_position_id,
                len(raw),
            )
            + raw
            + bytes(_align4(len(raw)) - len(raw))
            + _encode_string(self.source_identity)
        )

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> ImageReady:
        fields = _fixed(AVAILABLE_IMAGE_FIXED, buffer, "available image")
        name_at = AVAILABLE_IMAGE_FIXED.size - 4
        name, _end = _string(buffer, name_at, "available image log file name")
        source_at = name_at + 4 + _align4(fields[5])  # Aeron pads the log file name to 4 bytes
        source, _end = _string(buffer, source_at, "available image source identity")
        return cls(fields[0], fields[1], fields[2], fields[3], fields[4], name, source)


@dataclass(frozen=True, slots=True)
class ImageMessage:
    correlation_id: int
    subscription_registration_id: int
    stream_id: int
    channel: str

    def encode(self) -> bytes:
        raw = self.channel.encode("utf-8")
        return (
            UNAVAILABLE_IMAGE_FIXED.pack(
                self.correlation_id, self.subscription_registration_id, self.stream_id, len(raw)
            )
            + raw
        )

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> ImageMessage:
        fields = _fixed(UNAVAILABLE_IMAGE_FIXED, buffer, "unavailable image")
        channel, _end = _string(buffer, UNAVAILABLE_IMAGE_FIXED.size - 4, "unavailable image channel")
        return cls(fields[0], fields[1], fields[2], channel)


@dataclass(frozen=True, slots=True)
class SubscriptionReady:
    correlation_id: int
    channel_status_indicator_id: int

    def encode(self) -> bytes:
        return SUBSCRIPTION_READY.pack(self.correlation_id, self.channel_status_indicator_id)

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> SubscriptionReady:
        return cls(*_fixed(SUBSCRIPTION_READY, buffer, "subscription ready"))


@dataclass(frozen=True, slots=True)
class OperationSuccess:
    correlation_id: int

    def encode(self) -> bytes:
        return OPERATION_SUCCESS.pack(self.correlation_id)

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> OperationSuccess:
        return cls(*_fixed(OPERATION_SUCCESS, buffer, "operation success"))


@dataclass(frozen=True, slots=True)
class ClientTimeout:
    client_id: int

    def encode(self) -> bytes:
        return CLIENT_TIMEOUT.pack(self.client_id)

    @classmethod
    def decode(cls, buffer: bytes | memoryview) -> ClientTimeout:
        return cls(*_fixed(CLIENT_TIMEOUT, buffer, "client timeout"))
