"""logbuf's error vocabulary: one base class, errors that name the bad value.

Hot paths (offer, poll) return codes, not exceptions: see :class:`logbuf.logbuffer.publication.OfferResult`.
Bad network input is counted and dropped, never raised in a duty cycle. Exceptions are for misuse (bad
arguments, closed resources) and lifecycle problems, and every one logbuf raises on purpose derives from
:class:`LogbufError`. ``ValueError`` is a second base only where the error is bad input: a setting or
argument (:class:`ConfigurationError`), or bytes that do not decode (:class:`FrameError`,
:class:`MalformedCommandError`). The hierarchy of the library (base layer, conduit, log buffer, protocol)
is defined here; the modules that raise them re-export them. The components above keep their own, each
rooted here (``tests/logbuf/test_errors.py`` walks every module of the package to hold that)::

    LogbufError
    +-- ConfigurationError (ValueError)    a setting or argument is invalid
    |   +-- InvalidChannelError            a channel URI (logbuf.channel_uri)
    |   +-- LogBufferError                 a log parameter or log file (logbuf.logbuffer.log_buffer_descriptor)
    |   +-- UsageError                     logbuf-archive's command line (logbuf.archive.main)
    +-- FrameError (ValueError)            a data frame's bytes (logbuf.logbuffer.data_header_descriptor)
    |   +-- MalformedFrameError            a datagram's bytes (logbuf.protocol)
    |   +-- CorruptLogError                a frame length in a log that cannot be true (raised by the polls)
    +-- MalformedCommandError (ValueError) a client<->driver command's bytes (logbuf.conduit.command_descriptor)
    +-- ClosedError                        the client, publication or subscription is closed
    +-- DriverTimeoutError                 the media driver stopped answering or heartbeating
    +-- RegistrationError                  the media driver rejected a command (error code, correlation id)
    +-- ShmError                           a shared-memory segment or file exists, is missing or empty (logbuf.shm)
    |   +-- CncError                       the CnC file is missing, incompatible or corrupt (logbuf.conduit.cnc)
    |       +-- CncNotReadyError           ... or still being initialised: retry
    |       +-- CncVersionError            ... or written by another major version
    +-- BroadcastLappedError               a broadcast receiver was overtaken (logbuf.conduit.broadcast)
    +-- ActiveDriverError, CommandError    logbuf.driver.media_driver, logbuf.driver.client_command_adapter
    +-- CatalogError, SegmentError, ...    logbuf.archive (catalog, segments, replay, the Spark source)
    +-- IngestError, BackfillError, ...    logbuf.jetstream (ingest, backfill, subscriber options)
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


class FrameError(LogbufError, ValueError):
    """A frame's bytes do not decode: the message names the field and the bad value."""


class MalformedFrameError(FrameError):
    """Bytes that do not decode as a frame; ``reason`` says why, naming the field and value.

    Raised by the per-frame ``decode`` functions of :mod:`logbuf.protocol`,
    :func:`logbuf.protocol.codec.decode_control` and ``decode_datagram(..., strict=True)``; the driver's
    endpoints catch it and count the datagram.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CorruptLogError(FrameError):
    """A poll met a frame length that no publisher can have written (shorter than a header, past the end
    of the term, or negative with no claim that fits): the log was damaged by something that can map it.
    The image cannot move past it; the message names the image (session, stream, channel when known),
    the stream position, the term offset and the bad value. Raised by the native polls
    (:mod:`logbuf.native.reader`) when the bad frame is at the subscriber position; the fragments before
    it are delivered first."""

    def __init__(
        self,
        reason: str,
        *,
        session_id: int,
        stream_id: int,
        channel: str | None,
        position: int,
        term_offset: int,
        frame_length: int,
    ) -> None:
        where = f"session_id={session_id} stream_id={stream_id}"
        if channel:
            where += f" channel={channel}"
        super().__init__(
            f"corrupt log ({where}): frame_length={frame_length} at position={position} "
            f"(term_offset={term_offset}) is {reason}; the image cannot move past it"
        )
        self.reason = reason
        self.session_id = session_id
        self.stream_id = stream_id
        self.channel = channel
        self.position = position
        self.term_offset = term_offset
        self.frame_length = frame_length


class MalformedCommandError(LogbufError, ValueError):
    """A command or response does not decode; the message names the type and the fault."""


class InvalidChannelError(ConfigurationError):
    """A channel URI does not parse or holds a bad value; the message names the part."""


class LogBufferError(ConfigurationError):
    """A log buffer parameter or file is invalid; the message names the parameter and value."""


class ShmError(LogbufError):
    """A shared-memory name or segment is invalid, already exists, is missing or empty; the message names it.

    Not a ``ValueError``: a missing or half-made segment is a lifecycle problem (wait, retry, or start the
    driver), not bad input.
    """


class CncError(ShmError):
    """The CnC file is missing, not ready, incompatible or corrupt; the message says which."""


class CncNotReadyError(CncError):
    """The CnC file exists but its creator has not finished initialising it: retry shortly."""


class CncVersionError(CncError):
    """The CnC file was written by a driver with a different major version."""


class BroadcastLappedError(LogbufError):
    """The transmitter overwrote messages before this receiver read them: some were lost."""


__all__ = [
    "BroadcastLappedError",
    "ClosedError",
    "CncError",
    "CncNotReadyError",
    "CncVersionError",
    "ConfigurationError",
    "CorruptLogError",
    "DriverTimeoutError",
    "ErrorCode",
    "FrameError",
    "InvalidChannelError",
    "LogBufferError",
    "LogbufError",
    "MalformedCommandError",
    "MalformedFrameError",
    "RegistrationError",
    "ShmError",
]
