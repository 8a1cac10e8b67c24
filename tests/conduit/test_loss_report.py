"""The loss report (``loss-report.dat``): Aeron's entry layout, written and read back, and a reader that
survives whatever the file holds."""

from __future__ import annotations

import os
import struct
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logbuf.conduit import loss_report_descriptor as lrd
from logbuf.conduit.loss_report import LossEntry, LossReport, LossReportError, LossReportFile, read_loss_report

CHANNEL = "aeron:udp?endpoint=127.0.0.1:40123"
SOURCE = "127.0.0.1:55555"


def buffer(length: int = 4096) -> memoryview:
    return memoryview(bytearray(length))


def aeron_entry(
    count: int, total: int, first: int, last: int, session: int, stream: int, channel: str, source: str
) -> bytes:
    """An entry laid out field by field as Aeron's ``aeron_loss_reporter_create_entry`` writes it."""
    raw_channel, raw_source = channel.encode(), source.encode()
    head = struct.pack("<qqqqii", count, total, first, last, session, stream)
    channel_part = struct.pack("<i", len(raw_channel)) + raw_channel
    channel_part += b"\0" * (-len(channel_part) % 4)
    return head + channel_part + struct.pack("<i", len(raw_source)) + raw_source


ENTRY_CASES = [
    (1, 1408, 1_700_000_000_000, 1_700_000_000_000, 7, 1001, CHANNEL, SOURCE),
    (3, 96, 5, 9, -2006971732, -1, "aeron:udp?endpoint=h:1", "10.0.0.1:9"),  # channel padded by 2
    (2**40, 2**50, 0, 1, 0, 0, "", ""),
]


@pytest.mark.parametrize("fields", ENTRY_CASES)
def test_aerons_bytes_read_back_as_the_fields(fields: tuple[int, int, int, int, int, int, str, str]) -> None:
    buf = buffer()
    raw = aeron_entry(*fields)
    buf[: len(raw)] = raw
    [entry] = read_loss_report(buf)
    assert entry == LossEntry(*fields, offset=0)


@pytest.mark.parametrize("fields", ENTRY_CASES)
def test_the_writer_lays_an_entry_out_as_aeron_does(fields: tuple[int, int, int, int, int, int, str, str]) -> None:
    _, total, first, _, session, stream, channel, source = fields
    buf = buffer()
    report = LossReport(buf, clock_ms=lambda: first)
    assert report.create_entry(total, session, stream, channel, source) == 0
    assert bytes(buf[: lrd.align(len(aeron_entry(*fields)), 64) + 64]).rstrip(b"\0") == aeron_entry(
        1, total, first, first, session, stream, channel, source
    ).rstrip(b"\0")


def test_an_observation_adds_bytes_and_count_and_moves_only_the_last_time() -> None:
    now = [1000]
    report = LossReport(buffer(), clock_ms=lambda: now[0])
    offset = report.create_entry(64, 1, 2, CHANNEL, SOURCE)
    now[0] = 1500
    report.record_observation(offset, 128)
    report.record_observation(offset, 32, now_ms=1700)
    [entry] = read_loss_report(report.buffer)
    assert (entry.observation_count, entry.total_bytes_lost) == (3, 224)
    assert (entry.first_observation_ms, entry.last_observation_ms) == (1000, 1700)
    report.record_observation(-1, 10)  # an image whose entry did not fit: nothing happens
    assert read_loss_report(report.buffer) == [entry]


def test_entries_start_on_64_byte_lines_one_after_another() -> None:
    report = LossReport(buffer(), clock_ms=lambda: 1)
    offsets = [report.create_entry(i, i, i, "c" * (i * 30), SOURCE) for i in range(5)]
    expected = [0]
    for i in range(4):
        expected.append(expected[-1] + lrd.align(lrd.entry_length(i * 30, len(SOURCE)), lrd.ENTRY_ALIGNMENT))
    assert offsets == expected and all(o % 64 == 0 for o in offsets)
    assert [(e.session_id, e.channel, e.offset) for e in read_loss_report(report.buffer)] == [
        (i, "c" * (i * 30), offsets[i]) for i in range(5)
    ]


def test_a_full_report_refuses_an_entry_and_writes_nothing() -> None:
    report = LossReport(buffer(128), clock_ms=lambda: 1)
    assert report.create_entry(1, 1, 1, CHANNEL, SOURCE) == 0  # 44 + 36 + 4 + 15 = 99 bytes: one line pair
    before = bytes(report.buffer)
    assert report.create_entry(1, 2, 2, "x", "y") == -1
    assert bytes(report.buffer) == before
    assert len(read_loss_report(report.buffer)) == 1


def test_a_report_reopened_in_place_appends_after_its_entries() -> None:
    buf = buffer()
    LossReport(buf, clock_ms=lambda: 1).create_entry(1, 1, 1, CHANNEL, SOURCE)
    again = LossReport(buf, clock_ms=lambda: 2)
    assert again.create_entry(2, 2, 2, CHANNEL, SOURCE) == 128
    assert [e.session_id for e in read_loss_report(buf)] == [1, 2]


def test_the_reader_stops_at_lengths_it_cannot_trust() -> None:
    report = LossReport(buffer(), clock_ms=lambda: 1)
    report.create_entry(1, 1, 1, CHANNEL, SOURCE)
    second = report.create_entry(1, 2, 2, CHANNEL, SOURCE)
    for bad_length in (-1, 1 << 30, lrd.MAX_STRING_LENGTH + 1):
        corrupt = buffer()
        corrupt[:] = report.buffer
        struct.pack_into("<i", corrupt, second + lrd.CHANNEL_OFFSET, bad_length)
        assert [e.session_id for e in read_loss_report(corrupt)] == [1]


@pytest.mark.parametrize("cut", [0, 1, 40, 44, 99 - 1])
def test_a_buffer_cut_short_reads_only_whole_entries(cut: int) -> None:
    """Whole (99 bytes), one byte short, and shorter: no entry that runs past the end is read."""
    raw = aeron_entry(*ENTRY_CASES[0])
    assert len(raw) == 99
    assert read_loss_report(memoryview(bytearray(raw[:cut]))) == []
    assert len(read_loss_report(memoryview(bytearray(raw)))) == 1
    assert len(read_loss_report(memoryview(bytearray(raw + b"\0" * 29)))) == 1  # trailing zeros end it


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.integers(0, 2**40),
            st.integers(-(2**31), 2**31 - 1),
            st.integers(-(2**31), 2**31 - 1),
            st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=200),
            st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60),
        ),
        max_size=12,
    )
)
def test_whatever_is_written_reads_back(entries: list[tuple[int, int, int, str, str]]) -> None:
    report = LossReport(buffer(8192), clock_ms=lambda: 42)
    written = []
    for total, session, stream, channel, source in entries:
        offset = report.create_entry(total, session, stream, channel, source)
        if offset >= 0:
            written.append(LossEntry(1, total, 42, 42, session, stream, channel, source, offset))
    assert read_loss_report(report.buffer) == written


def test_the_file_is_page_aligned_zeroed_and_readable_read_only() -> None:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as directory:
        with pytest.raises(LossReportError, match="loss-report.dat"):
            LossReportFile.open(directory)
        created = LossReportFile.create(directory, 5000)
        assert len(created.buffer) == 8192 and bytes(created.buffer) == bytes(8192)
        LossReport(created.buffer, clock_ms=lambda: 7).create_entry(64, 3, 4, CHANNEL, SOURCE)
        os.chmod(os.path.join(directory, lrd.LOSS_REPORT_FILE), 0o400)
        with LossReportFile.open(directory) as reader:
            assert reader.segment.buffer.closed is False
            [entry] = reader.entries()
        assert (entry.session_id, entry.stream_id, entry.total_bytes_lost) == (3, 4, 64)
        created.close()


def test_a_length_that_is_not_whole_lines_is_refused() -> None:
    with pytest.raises(ValueError, match="loss report length=100 must be a positive multiple of 64"):
        LossReport(buffer(100), clock_ms=lambda: 1)
