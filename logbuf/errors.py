"""logbuf's error vocabulary: one base class, errors that name the bad value.

Hot paths (offer, poll) return codes, not exceptions: see :class:`logbuf.logbuffer.publication.OfferResult`.
Exceptions are for misuse (bad arguments, closed resources) and lifecycle problems.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Aeron's error codes carried by ON_ERROR (values as in Aeron's ErrorCode)."""

    UNKNOWN_CODE_VALUE = -1
    UNUSED = 0
    INVALID_CHANNEL = 1
    UNKNOWN_SUBSCRIPTION = 2
    UNKNOWN_PUBLICATION = 3
    CHANNEL_ENDPOINT_ERROR = 4
    UNKNOWN_COUNTER = 5
    UNKNOWN_COMMAND_TYPE_ID = 6
    MALFORMED_COMMAND = 7
    NOT_SUPPORTED = 8
    UNKNOWN_HOST = 9
    RESOURCE_TEMPORARILY_UNAVAILABLE = 10
    GENERIC_ERROR = 11
    STORAGE_SPACE = 12
    IMAGE_REJECTED = 13
    PUBLICATION_REVOKED = 14


class LogbufError(Exception):
    """Base of every error logbuf raises on purpose."""


class ConfigurationError(LogbufError, ValueError):
    """A setting or argument is invalid; the message names it and its value."""


class ClosedError(LogbufError):
    """The client, publication or subscription is closed."""


class DriverTimeoutError(LogbufError):
    """The media driver did not answer or stopped heartbeating within the driver timeout."""


class RegistrationError(LogbufError):
    """The media driver rejected a command: ``error_code`` (an ErrorCode) and its message."""

    def __init__(self, correlation_id: int, error_code: int, message: str) -> None:
        try:
            code_name = ErrorCode(error_code).name
        except ValueError:
            code_name = str(error_code)
        super().__init__(f"{code_name}: {message} (correlation_id={correlation_id})")
        self.correlation_id = correlation_id
        self.error_code = error_code
        self.driver_message = message
