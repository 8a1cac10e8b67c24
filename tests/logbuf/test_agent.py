"""Agent settings: CPU lists for the duty cycle's affinity."""

from __future__ import annotations

import pytest

from logbuf.errors import ConfigurationError


def test_cpu_lists_parse_and_name_what_is_wrong() -> None:
    from logbuf.agent import parse_cpu_list

    assert parse_cpu_list("") == frozenset()
    assert parse_cpu_list("0") == {0}
    assert parse_cpu_list("0-1") == {0, 1} == parse_cpu_list("1, 0")
    with pytest.raises(ConfigurationError, match=r"'x' is not a CPU number or a range like 0-3"):
        parse_cpu_list("0,x")
    with pytest.raises(ConfigurationError, match=r"'3-1' is not a CPU number"):
        parse_cpu_list("3-1")
    with pytest.raises(ConfigurationError, match=r"CPU \[4096\] not available"):
        parse_cpu_list("4096")
