"""Term lengths: powers of two from 64 KiB to 1 GiB; anything else is rejected naming the value."""

from __future__ import annotations

from typing import Any

import pytest

from logbuf.errors import ConfigurationError
from logbuf.logbuffer import log_buffer_descriptor as lbd
from logbuf.logbuffer.log_buffer import LogParams
from tests.support.logs import TERM_LENGTH


@pytest.mark.parametrize(
    ("term_length", "message"),
    [
        (96 * 1024, r"term_length=98304 is not a power of 2"),
        (TERM_LENGTH + 32, r"term_length=65568 is not a power of 2"),
        (32 * 1024, r"term_length=32768 is less than the minimum 65536 \(64 KiB\)"),
        (0, r"term_length=0 is less than the minimum"),
        (-TERM_LENGTH, r"term_length=-65536 is less than the minimum"),
        (2 * 1024**3, r"term_length=2147483648 is greater than the maximum 1073741824 \(1 GiB\)"),
        (1.5 * 1024**2, r"term_length=1572864.0 must be an int"),
        (True, r"term_length=True must be an int"),
    ],
)
def test_bad_term_lengths_are_rejected_naming_the_value(term_length: Any, message: str) -> None:
    with pytest.raises(lbd.LogBufferError, match=message) as info:
        lbd.check_term_length(term_length)
    assert isinstance(info.value, ConfigurationError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("term_length", [64 * 1024, 128 * 1024, 1024**3])
def test_powers_of_two_from_64_kib_to_1_gib_are_valid_term_lengths(term_length: int) -> None:
    lbd.check_term_length(term_length)
    assert LogParams(term_length=term_length).check().term_length == term_length
