"""Client <-> driver commands: a table of (message, bytes) cases drives encoding and decoding; every
command is fed whole, one byte short (malformed, naming what does not fit) and with trailing bytes (ignored).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

from logbuf.conduit import command_descriptor as cmd

COMMAND_CASES: list[tuple[Any, bytes, str]] = [
    (
        cmd.PublicationCommand(1, 2, 10, "aeron:ipc"),
        struct.pack("<qqii", 1, 2, 10, 9) + b"aeron:ipc",
        r"publication command channel: string length=9 does not fit the 32-byte message",
    ),
    (
        cmd.SubscriptionCommand(3, 4, -1, 11, "aeron:ipc?x=é"),
        struct.pack("<qqqii", 3, 4, -1, 11, 14) + "aeron:ipc?x=é".encode(),
        r"subscription command channel: string length=14 does not fit the 45-byte message",
    ),
    (
        cmd.RemoveCommand(5, 6, 7),
        struct.pack("<qqq", 5, 6, 7),
        r"remove command: 23 bytes is shorter than its fixed 24-byte part",
    ),
    (
        cmd.CorrelatedCommand(8, 9),
        struct.pack("<qq", 8, 9),
        r"correlated command: 15 bytes is shorter than its fixed 16-byte part",
    ),
    (
        cmd.ErrorResponse(10, 7, "bad"),
        struct.pack("<qii", 10, 7, 3) + b"bad",
        r"error response message: string length=3 does not fit the 18-byte message",
    ),
    (
        cmd.PublicationReady(1, 2, 3, 4, 5, 6, "1.logbuffer"),
        struct.pack("<qqiiiii", 1, 2, 3, 4, 5, 6, 11) + b"1.logbuffer",
        r"publication ready log file name: string length=11 does not fit the 46-byte message",
    ),
    (
        cmd.ImageReady(1, 2, 3, 4, 5, "f", "src"),
        struct.pack("<qiiqii", 1, 2, 3, 4, 5, 1) + b"f\0\0\0" + struct.pack("<i", 3) + b"src",
        r"available image source identity: string length=3 does not fit the 42-byte message",
    ),
    (
        cmd.ImageMessage(1, 2, 3, ""),
        struct.pack("<qqii", 1, 2, 3, 0),
        r"unavailable image: 23 bytes is shorter than its fixed 24-byte part",
    ),
    (
        cmd.SubscriptionReady(1, 2),
        struct.pack("<qi", 1, 2),
        r"subscription ready: 11 bytes is shorter than its fixed 12-byte part",
    ),
    (
        cmd.OperationSuccess(42),
        struct.pack("<q", 42),
        r"operation success: 7 bytes is shorter than its fixed 8-byte part",
    ),
    (cmd.ClientTimeout(43), struct.pack("<q", 43), r"client timeout: 7 bytes is shorter than its fixed 8-byte part"),
]


COMMAND_IDS = [type(case[0]).__name__ for case in COMMAND_CASES]


@pytest.mark.parametrize(("message", "encoded", "short_error"), COMMAND_CASES, ids=COMMAND_IDS)
def test_commands_encode_and_decode_byte_for_byte(message: Any, encoded: bytes, short_error: str) -> None:
    assert message.encode() == encoded
    assert type(message).decode(encoded) == message
    assert type(message).decode(memoryview(encoded)) == message


@pytest.mark.parametrize(("message", "encoded", "short_error"), COMMAND_CASES, ids=COMMAND_IDS)
def test_a_command_one_byte_short_is_malformed_naming_what_does_not_fit(
    message: Any, encoded: bytes, short_error: str
) -> None:
    with pytest.raises(cmd.MalformedCommandError, match=short_error):
        type(message).decode(encoded[:-1])
    with pytest.raises(cmd.MalformedCommandError, match=r"bytes is shorter than its fixed|too short|does not fit"):
        type(message).decode(b"")


@pytest.mark.parametrize(("message", "encoded", "short_error"), COMMAND_CASES, ids=COMMAND_IDS)
def test_trailing_bytes_after_a_command_are_ignored_as_aerons_flyweights_do(
    message: Any, encoded: bytes, short_error: str
) -> None:
    # Records in the ring and broadcast buffers are length-delimited; decoders read their fields and
    # ignore what follows (forward compatibility, as Aeron's command flyweights).
    assert type(message).decode(encoded + b"\xff\x00\xff") == message


@pytest.mark.parametrize(
    ("encoded", "error"),
    [
        (struct.pack("<qqii", 1, 2, 10, -1), r"string length=-1 does not fit the 24-byte message"),
        (
            struct.pack("<qqii", 1, 2, 10, cmd.MAX_STRING_LENGTH + 1) + bytes(cmd.MAX_STRING_LENGTH + 1),
            r"string length=4097 does not fit",
        ),
        (struct.pack("<qqii", 1, 2, 10, 2) + b"\xff\xfe", r"publication command channel: string is not UTF-8"),
    ],
)
def test_bad_strings_in_a_command_are_malformed_naming_the_fault(encoded: bytes, error: str) -> None:
    with pytest.raises(cmd.MalformedCommandError, match=error):
        cmd.PublicationCommand.decode(encoded)
