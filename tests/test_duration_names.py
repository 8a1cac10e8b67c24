"""One unit convention for durations (DESIGN.md, "Units"): a duration held in code is an ``int`` of nanoseconds
named ``*_ns``; people type ``10ms`` or ``5s`` under the flag and variable names they always used; an old keyword
keeps working for one release with a DeprecationWarning naming the new one."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import re
import warnings
from dataclasses import fields
from typing import Any

import pytest

from logbuf.archive.client import ArchiveClientContext
from logbuf.archive.recorder import RecorderContext
from logbuf.archive.replay import Replay
from logbuf.archive.replay_merge import ReplayMerge
from logbuf.archive.service_context import ArchiveContext
from logbuf.archive.sync import sync_forever, sync_once
from logbuf.client import Context
from logbuf.client.aio import AsyncAeron, AsyncIdle
from logbuf.client.fastpuss import FastpussGateway, GatewayContext
from logbuf.client.stat import StatReader
from logbuf.driver.context import DriverContext, env_name, flag_name
from logbuf.durations import duration_argument
from logbuf.jetstream.ingest import UpstreamSource
from logbuf.jetstream.server import RelayConfig
from logbuf.jetstream.supervisor import SupervisorSettings

DURATION_WORDS = re.compile(r"(timeout|interval|delay|linger|backoff|duration|period|sleep|park|retention)(_|$)")
"""Words that make a name a duration (unless it ends in a unit that is not time, as ``retention_bytes``)."""
NOT_TIME = re.compile(r"_(bytes|length|count)$")
INJECTED_CLOCKS = {"clock_ns", "epoch_clock_ms"}
"""Clocks, not durations: ``epoch_clock_ms`` reads the wall clock in the CnC heartbeat's unit (epoch ms)."""
SETTINGS = [
    DriverContext,
    Context,
    StatReader,
    ArchiveContext,
    ArchiveClientContext,
    RecorderContext,
    Replay,
    ReplayMerge,
    AsyncIdle,
    AsyncAeron,
    RelayConfig,
    UpstreamSource,
    SupervisorSettings,
    sync_once,
    sync_forever,
    GatewayContext,
    FastpussGateway,
]
"""Every class that takes durations from its caller: the settings of the driver, client, tools, archive and relay."""


def misnamed_durations(cls: Any) -> list[str]:
    """Settings of ``cls`` (a dataclass's fields, else its constructor's parameters) that hold a duration but
    do not end in ``_ns``: every ``duration``-kind driver setting, and any setting named like a duration."""
    if dataclasses.is_dataclass(cls):
        names = {f.name: f.metadata.get("kind") == "duration" for f in fields(cls)}
    else:
        names = {name: False for name in inspect.signature(cls).parameters}
    return [
        name
        for name, is_duration in names.items()
        if name not in INJECTED_CLOCKS
        and (is_duration or (DURATION_WORDS.search(name) is not None and NOT_TIME.search(name) is None))
        and not name.endswith("_ns")
    ]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda cls: cls.__name__)
def test_every_duration_setting_is_named_in_nanoseconds(settings: Any) -> None:
    assert misnamed_durations(settings) == []


def test_the_driver_has_duration_settings_to_check() -> None:
    durations = [f.name for f in fields(DriverContext) if f.metadata.get("kind") == "duration"]
    assert len(durations) >= 15 and "nak_delay_ns" in durations


def test_duration_flags_and_variables_keep_their_names_and_take_units() -> None:
    by_name = {f.name: f for f in fields(DriverContext)}
    assert flag_name(by_name["nak_delay_ns"]) == "--nak-delay"
    assert env_name(by_name["client_liveness_timeout_ns"]) == "LOGBUF_CLIENT_LIVENESS_TIMEOUT"
    assert flag_name(by_name["term_length"]) == "--term-length"
    ctx = DriverContext.from_sources(
        ["--nak-delay", "250us", "--timer-interval", "20ms"],
        env={"LOGBUF_CLIENT_LIVENESS_TIMEOUT": "3s", "LOGBUF_NAK_RETRY_DELAY": "5000"},  # bare: nanoseconds
    )
    assert (ctx.nak_delay_ns, ctx.timer_interval_ns) == (250_000, 20_000_000)
    assert (ctx.client_liveness_timeout_ns, ctx.nak_retry_delay_ns) == (3_000_000_000, 5_000)


def test_a_bad_duration_names_the_setting_as_typed() -> None:
    with pytest.raises(Exception, match=r"nak_retry_delay=0ns must be a positive duration"):
        DriverContext.from_sources(["--dir", "/dev/shm/logbuf-never-made", "--nak-retry-delay", "0"], env={}).conclude()


ARCHIVE = functools.partial(ArchiveContext, archive_dir="/nonexistent")
RELAY = functools.partial(RelayConfig, data_dir="/nonexistent")
RECORDER = functools.partial(RecorderContext, archive_dir="/nonexistent", channel="aeron:ipc", stream_id=1)


@pytest.mark.parametrize(
    ("cls", "old", "value", "new", "expected_ns"),
    [
        (DriverContext, "nak_delay", 250_000, "nak_delay_ns", 250_000),
        (DriverContext, "client_liveness_timeout", 3_000_000_000, "client_liveness_timeout_ns", 3_000_000_000),
        (Context, "driver_timeout_ms", 3_000, "driver_timeout_ns", 3_000_000_000),
        (Context, "keepalive_interval_ms", 250, "keepalive_interval_ns", 250_000_000),
        (ARCHIVE, "session_timeout_ms", 600, "session_timeout_ns", 600_000_000),
        (ArchiveClientContext, "message_timeout_ms", 1_500, "message_timeout_ns", 1_500_000_000),
        (RECORDER, "max_idle_sleep_s", 0.5, "max_idle_sleep_ns", 500_000_000),
        (RELAY, "retention", 3600.0, "retention_ns", 3_600_000_000_000),
        (RELAY, "flush_interval_s", 0.002, "flush_interval_ns", 2_000_000),
        (AsyncIdle, "max_park_s", 0.01, "max_park_ns", 10_000_000),
        (GatewayContext, "client_expiry_s", 90.0, "client_expiry_ns", 90_000_000_000),
    ],
)
def test_an_old_keyword_still_works_and_warns_naming_the_new_one(
    cls: Any, old: str, value: float, new: str, expected_ns: int
) -> None:
    name = getattr(cls, "func", cls).__name__
    with pytest.warns(DeprecationWarning, match=rf"{name}\.{old} is deprecated.*use {new}"):
        ctx: Any = cls(**{old: value})
    assert getattr(ctx, new) == expected_ns
    with pytest.warns(DeprecationWarning, match=rf"use {new}"):
        assert getattr(ctx, old) == value
    with pytest.raises(TypeError, match=rf"both {old}= and its new name {new}="):
        cls(**{old: value, new: expected_ns})


def test_new_keywords_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert DriverContext(nak_delay_ns=1).nak_delay_ns == 1
        assert Context(driver_timeout_ns=2_000_000_000).driver_timeout_ns == 2_000_000_000


def test_an_old_keyword_argument_of_a_function_still_works_and_warns() -> None:
    with pytest.warns(DeprecationWarning, match=r"sync_once\.timeout_s is deprecated.*use timeout_ns"):
        report = sync_once([], timeout_s=1.5)
    assert not report.failed


def test_a_duration_flag_reads_units_and_its_old_bare_unit() -> None:
    seconds, positive_ms = duration_argument("s"), duration_argument("ms", positive=True)
    assert (seconds("30"), seconds("250ms"), seconds("0")) == (30_000_000_000, 250_000_000, 0)
    assert positive_ms("500") == 500_000_000
    for parse, text, problem in [
        (seconds, "soon", "'soon' is not a duration"),
        (seconds, "-1s", "'-1s' must be a non-negative duration"),
        (positive_ms, "0", "'0' must be a positive duration"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=problem):
            parse(text)
