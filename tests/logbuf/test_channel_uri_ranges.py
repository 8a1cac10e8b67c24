"""Integers in channel URIs (and the stream id beside a channel) must fit the fields they go into: outside
that range the error names the field and its range, never a bare ``struct.error`` from deep inside."""

from __future__ import annotations

import pytest

from logbuf.channel_uri import ChannelUri, check_int_range, check_stream_id
from logbuf.errors import ConfigurationError, InvalidChannelError

INT32 = "-2147483648..2147483647"
INT64 = "-9223372036854775808..9223372036854775807"


@pytest.mark.parametrize(
    ("uri", "field", "value", "bits"),
    [
        ("aeron:ipc?session-id=2147483648", "session-id", 2**31, 32),
        ("aeron:ipc?session-id=-2147483649", "session-id", -(2**31) - 1, 32),
        ("aeron:ipc?init-term-id=4294967296|term-id=0|term-offset=0", "init-term-id", 2**32, 32),
        ("aeron:ipc?init-term-id=0|term-id=99999999999|term-offset=0", "term-id", 99999999999, 32),
        ("aeron:ipc?init-term-id=0|term-id=0|term-offset=4294967296", "term-offset", 2**32, 32),
        ("aeron:udp?endpoint=127.0.0.1:4000|ttl=99999999999999999999", "ttl", 99999999999999999999, 32),
        ("aeron:udp?endpoint=127.0.0.1:4000|gtag=9223372036854775808", "gtag", 2**63, 64),
        ("aeron:ipc?linger=9999999999s", "linger (in ns)", 9999999999 * 10**9, 64),
        ("aeron:udp?endpoint=127.0.0.1:4000|nak-delay=99999999999999999999", "nak-delay (in ns)", 10**20 - 1, 64),
    ],
)
def test_an_integer_parameter_outside_its_field_names_the_parameter_and_the_range(
    uri: str, field: str, value: int, bits: int
) -> None:
    with pytest.raises(InvalidChannelError) as info:
        ChannelUri.parse(uri)
    message = str(info.value)
    assert f"channel parameter {field}={value} is outside the int{bits} range" in message
    assert (INT32 if bits == 32 else INT64) in message and uri in message


@pytest.mark.parametrize("uri", ["aeron:ipc?session-id=2147483647", "aeron:ipc?session-id=-2147483648"])
def test_the_ends_of_the_range_are_accepted(uri: str) -> None:
    assert ChannelUri.parse(uri).session_id() in (2**31 - 1, -(2**31))


@pytest.mark.parametrize("stream_id", [2**31, -(2**31) - 1, 2**64])
def test_a_stream_id_outside_int32_names_itself_and_the_range(stream_id: int) -> None:
    with pytest.raises(InvalidChannelError, match=rf"stream_id={stream_id} is outside the int32 range {INT32}"):
        check_stream_id(stream_id)


@pytest.mark.parametrize("stream_id", [1.5, "7", True, None])
def test_a_stream_id_that_is_not_an_integer_is_refused(stream_id: object) -> None:
    with pytest.raises(ConfigurationError, match="stream_id=.* is not an integer"):
        check_stream_id(stream_id)  # type: ignore[arg-type]


def test_check_int_range_returns_the_value() -> None:
    assert check_int_range("x", -(2**31)) == -(2**31)
    assert check_int_range("x", 2**63 - 1, 64) == 2**63 - 1
