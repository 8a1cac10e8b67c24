"""Counters and the loss report against a real Aeron 1.53 C driver (pyaeron), read with logbuf's readers.

- System counters: slot -> type id -> label in the C driver's ``cnc.dat`` and in logbuf's are the same
  for Aeron's 46 (labels compared with the version text taken out); logbuf's own follow with type 1003.
- Stream counters: the same streams on either driver give the same type ids, label shapes, key
  layouts and value-record links.
- Loss: with loss injected, the C driver's ``loss-report.dat`` reads with logbuf's reader, and
  logbuf's holds entries of the same shape, whose observations are logbuf's NAKs.
- ``logbuf-stat --loss`` prints Aeron LossStat's table from either driver's directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from logbuf.client.stat import LOSS_REPORT_CSV_HEADER, CounterStat, StatReader
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit import loss_report_descriptor as lrd
from logbuf.conduit import system_counters_descriptor as scd
from logbuf.conduit.cnc import CncFile
from logbuf.conduit.counters import CounterInfo, CountersReader
from logbuf.conduit.loss_report import LossEntry, LossReportFile
from logbuf.testing import wait_until
from logbuf.testing.host import free_udp_port
from tests.interop.conftest import Interop
from tests.interop.test_aeron_interop import check_messages, start_driver, transfer

VERSION = re.compile(r"version=\S+ commit=\S*")
NUMBER = re.compile(r"-?\d+")
AERON_STREAM_TYPES = {
    cd.PUBLISHER_LIMIT_TYPE_ID,
    cd.SENDER_POSITION_TYPE_ID,
    cd.RECEIVER_HWM_TYPE_ID,
    cd.SUBSCRIBER_POSITION_TYPE_ID,
    cd.RECEIVER_POSITION_TYPE_ID,
    cd.SENDER_LIMIT_TYPE_ID,
    cd.PUBLISHER_POSITION_TYPE_ID,
    cd.SENDER_BPE_TYPE_ID,
    cd.SENDER_NAKS_RECEIVED_TYPE_ID,
    cd.RECEIVER_NAKS_SENT_TYPE_ID,
}


def system_counters(directory: str) -> list[CounterStat]:
    with StatReader(directory) as reader:
        return [c for c in reader.sample().counters if c.system_id is not None]


@contextmanager
def counters_of(directory: str) -> Iterator[list[CounterInfo]]:
    cnc = CncFile.open(directory)
    try:
        yield list(CountersReader(cnc.counters_metadata, cnc.counters_values))
    finally:
        cnc.close()


def test_system_counters_sit_in_aerons_slots_with_aerons_type_ids_keys_and_labels(interop: Interop) -> None:
    aeron = system_counters(start_driver(interop, "aeron"))
    logbuf = system_counters(start_driver(interop, "logbuf"))
    n = scd.AERON_SYSTEM_COUNTER_COUNT
    assert len(aeron) == n, f"the C driver has {len(aeron)} system counters, the descriptor knows {n}"

    def row(c: CounterStat) -> tuple[int, int, int | None, str]:
        return c.id, c.type_id, c.system_id, VERSION.sub("<version>", c.label)

    assert [row(c) for c in logbuf[:n]] == [row(c) for c in aeron]
    versioned = [slot for slot, c in enumerate(aeron) if "version=" in c.label]
    assert versioned == [15, 34]  # "Errors: version=..." and "Aeron software: version=..."
    assert all("version=1.53" in aeron[slot].label and scd.VERSION_INFO in logbuf[slot].label for slot in versioned)
    nak = scd.SLOTS[scd.SystemCounterId.NAK_MESSAGES_SENT]
    assert (logbuf[nak].label, aeron[nak].label, nak) == ("NAKs sent", "NAKs sent", 5)
    own = logbuf[n:]
    assert own and all(c.type_id == cd.LOGBUF_SYSTEM_COUNTER_TYPE_ID for c in own)
    assert [c.system_id for c in own] == [int(d.id) for d in scd.DESCRIPTORS[n:]]
    # the two values Aeron sets at start: control protocol 1.0.0 on both, each its own software version
    assert logbuf[43].value == aeron[43].value == scd.CONTROL_PROTOCOL_VERSION
    ours = scd.semantic_version(*(int(part) for part in scd.LOGBUF_VERSION.split(".")[:3]))
    assert aeron[34].value == scd.semantic_version(1, 53, 0) and logbuf[34].value == ours


def stream_shape(counters: list[CounterInfo], stream_id: int) -> list[tuple[int, str, str, int, bool, bool]]:
    """(type id, label with numbers as N, key channel, key stream id, owner is a client, reference
    names a publication) of a stream's Aeron counters, in allocation order."""
    registrations = {c.registration_id for c in counters if c.type_id == cd.PUBLISHER_LIMIT_TYPE_ID}
    registrations |= {c.registration_id for c in counters if c.type_id == cd.RECEIVER_POSITION_TYPE_ID}
    shape = []
    for c in counters:
        if c.type_id not in AERON_STREAM_TYPES:
            continue
        registration_id, session_id, key_stream_id, _ = cd.STREAM_KEY.unpack_from(c.key)
        if key_stream_id != stream_id:
            continue
        assert registration_id == c.registration_id, c
        channel = cd.stream_key_channel(c.key)
        label = NUMBER.sub("N", c.label.replace(channel, "<channel>"))
        reference_ok = c.reference_id in registrations if c.type_id == cd.SUBSCRIBER_POSITION_TYPE_ID else True
        shape.append((c.type_id, label, NUMBER.sub("N", channel), key_stream_id, c.owner_id != 0, reference_ok))
    return shape


def test_stream_counters_have_aerons_type_ids_labels_keys_and_links(interop: Interop) -> None:
    """One IPC stream and one UDP stream (published and subscribed on the same driver) on each driver,
    by the C client; their counters compared after taking out the numbers."""
    shapes = {}
    for kind in ("aeron", "logbuf"):
        directory = start_driver(interop, kind)
        udp = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
        peers = []
        for channel, stream_id in (("aeron:ipc", 71), (udp, 72)):
            sub = interop.peer(
                "subscribe", "pyaeron", directory, channel=channel, stream_id=stream_id, count=10**9, timeout=30
            )
            sub.wait("ready")
            pub = interop.peer(
                "publish", "pyaeron", directory, channel=channel, stream_id=stream_id, until_stdin=True, pace_ms=20
            )
            pub.wait("ready")
            peers.append(pub)

        def udp_image() -> bool:  # the UDP image (rcv-hwm, rcv-pos, its sub-pos) comes once the SETUP is answered
            with counters_of(directory) as counters:
                shapes[kind] = {71: stream_shape(counters, 71), 72: stream_shape(counters, 72)}
            types = [s[0] for s in shapes[kind][72]]
            return cd.RECEIVER_POSITION_TYPE_ID in types and types.count(cd.SUBSCRIBER_POSITION_TYPE_ID) == 1

        try:
            wait_until(udp_image, 30, f"{kind}: an image for the UDP stream", max_idle_s=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}: {shapes[kind][72]}") from None
        for pub in peers:
            pub.go()
    for stream_id in (71, 72):
        aeron, logbuf = shapes["aeron"][stream_id], shapes["logbuf"][stream_id]
        assert sorted(logbuf) == sorted(aeron), f"stream {stream_id}:\naeron  {aeron}\nlogbuf {logbuf}"
    assert {s[0] for s in shapes["logbuf"][72]} >= {
        cd.PUBLISHER_POSITION_TYPE_ID,
        cd.PUBLISHER_LIMIT_TYPE_ID,
        cd.SENDER_POSITION_TYPE_ID,
        cd.SENDER_LIMIT_TYPE_ID,
        cd.RECEIVER_HWM_TYPE_ID,
        cd.RECEIVER_POSITION_TYPE_ID,
        cd.SUBSCRIBER_POSITION_TYPE_ID,
        cd.SENDER_BPE_TYPE_ID,
        cd.SENDER_NAKS_RECEIVED_TYPE_ID,
        cd.RECEIVER_NAKS_SENT_TYPE_ID,
    }


def loss_entries(directory: str) -> tuple[int, list[LossEntry]]:
    with LossReportFile.open(directory) as report:
        return len(report.buffer), report.entries()


def check_entry(entry: LossEntry, channel: str) -> None:
    assert entry.observation_count > 0 and entry.total_bytes_lost >= entry.observation_count * 32
    assert 0 < entry.first_observation_ms <= entry.last_observation_ms
    assert entry.stream_id == 1001 and entry.channel == channel
    assert re.fullmatch(r"127\.0\.0\.1:\d+", entry.source), entry.source
    assert entry.offset % lrd.ENTRY_ALIGNMENT == 0


def loss_stat(directory: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "logbuf.client.stat", "--dir", directory, "--loss"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


LOSS_LINE = re.compile(
    r"(\d+),(\d+),(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d{4}),(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}[+-]\d{4}),"
    r"(-?\d+),(-?\d+),(.*),(.*)"
)


def check_loss_stat(directory: str, entries: list[LossEntry]) -> None:
    """``logbuf-stat --loss`` prints LossStat's header, one line per entry, and the count."""
    lines = loss_stat(directory)
    assert lines[0] == LOSS_REPORT_CSV_HEADER and lines[-1] == f"{len(entries)} loss entries"
    assert len(lines) == len(entries) + 2
    for line, entry in zip(lines[1:-1], entries):
        match = LOSS_LINE.fullmatch(line)
        assert match, line
        assert (int(match[5]), int(match[6]), match[7], match[8]) == (
            entry.session_id,
            entry.stream_id,
            entry.channel,
            entry.source,
        )
        assert int(match[1]) >= entry.observation_count  # a running driver may have observed more since


def test_the_c_drivers_loss_report_reads_with_logbufs_reader_and_logbuf_stat(interop: Interop) -> None:
    """logbuf driver -> C driver with Aeron's loss interceptor on the C side: its receiver reports."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    sub_result, _, _ = transfer(interop, ("logbuf", "logbuf"), ("aeron", "pyaeron"), channel, 1024, 2_000, loss=True)
    check_messages(sub_result, 2_000)
    c_dir = interop.dirs[0]  # the subscriber's driver starts first
    length, entries = loss_entries(c_dir)
    assert length == lrd.DEFAULT_LOSS_REPORT_LENGTH  # 1 MiB on both drivers
    assert len(entries) == 1, entries
    check_entry(entries[0], channel)
    check_loss_stat(c_dir, entries)


def test_logbufs_loss_report_has_aerons_entries_one_observation_per_nak(interop: Interop) -> None:
    """C driver -> logbuf driver with logbuf's 5 % receive drop: logbuf's receiver reports."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    sub_result, _, _ = transfer(interop, ("aeron", "pyaeron"), ("logbuf", "logbuf"), channel, 1024, 2_000, loss=True)
    check_messages(sub_result, 2_000)
    logbuf_dir = interop.dirs[0]
    length, entries = loss_entries(logbuf_dir)
    assert length == lrd.DEFAULT_LOSS_REPORT_LENGTH
    assert len(entries) == 1, entries
    check_entry(entries[0], channel)
    naks = next(c.value for c in system_counters(logbuf_dir) if c.system_id == scd.SystemCounterId.NAK_MESSAGES_SENT)
    assert entries[0].observation_count == naks > 0
    check_loss_stat(logbuf_dir, entries)
    assert os.path.exists(os.path.join(logbuf_dir, lrd.LOSS_REPORT_FILE))
