"""The retransmit handler alone: per-byte linger, the concurrent retransmit cap, the bandwidth cap."""

from __future__ import annotations

from logbuf.driver.retransmit_handler import MIN_BURST_LENGTH, NakOutcome, RetransmitHandler

MS = 1_000_000


def resend(handler: RetransmitHandler, start: int, end: int, now_ns: int) -> tuple[int, int] | NakOutcome:
    """Plan a NAK and, as the publication does, report the whole planned range as resent."""
    planned = handler.plan(start, end, now_ns)
    if not isinstance(planned, NakOutcome):
        handler.on_resent(*planned, now_ns)
    return planned


def test_naks_stepping_their_offset_get_each_byte_once_per_linger() -> None:
    handler = RetransmitHandler(linger_ns=10 * MS, max_retransmits=1_000, max_rate=1 << 30)
    assert resend(handler, 0, 4096, 0) == (0, 4096)
    resent = 0
    for offset in range(32, 4096, 32):  # every later offset lies in what lingers
        planned = resend(handler, offset, offset + 65536, MS)
        if not isinstance(planned, NakOutcome):
            resent += planned[1] - planned[0]
    assert resent == 4064 + 65536 - 4096  # the bytes past 4096 up to the last NAK's end, once each
    assert resend(handler, 0, 4096, 11 * MS) == (0, 4096)  # the linger is over


def test_a_range_with_a_lingering_middle_gets_its_head_only() -> None:
    handler = RetransmitHandler(linger_ns=10 * MS, max_retransmits=16, max_rate=1 << 30)
    resend(handler, 1024, 2048, 0)
    assert handler.plan(0, 4096, 0) == (0, 1024)
    assert handler.plan(1024, 4096, 0) == (2048, 4096)
    assert handler.plan(1024, 2048, 0) is NakOutcome.NOTHING_TO_RESEND


def test_at_most_max_retransmits_linger_at_once() -> None:
    handler = RetransmitHandler(linger_ns=10 * MS, max_retransmits=4, max_rate=1 << 30)
    for i in range(4):
        assert resend(handler, i * 1024, i * 1024 + 32, 0) == (i * 1024, i * 1024 + 32)
    assert handler.plan(8192, 9216, 0) is NakOutcome.OVERFLOW
    assert handler.plan(8192, 9216, 10 * MS) == (8192, 9216)


def test_the_bandwidth_cap_shortens_then_refuses_and_refills_with_time() -> None:
    handler = RetransmitHandler(linger_ns=MS, max_retransmits=1_000, max_rate=100_000)
    assert handler.burst_length == MIN_BURST_LENGTH  # a tenth of a second is only 10,000 bytes
    assert resend(handler, 0, 1 << 20, 0) == (0, MIN_BURST_LENGTH)
    assert handler.plan(1 << 20, 2 << 20, 0) is NakOutcome.RATE_LIMITED
    assert resend(handler, 1 << 20, 2 << 20, 50 * MS) == (1 << 20, (1 << 20) + 5_000)  # 50 ms earned 5,000 bytes
    total = 0
    for i in range(1, 1001):  # a NAK every microsecond for a millisecond still earns its 100 bytes
        planned = resend(handler, (3 << 20) + i * 32, (3 << 20) + i * 32 + 32, 50 * MS + i * 1_000)
        if not isinstance(planned, NakOutcome):
            total += planned[1] - planned[0]
    assert 100 - 32 <= total <= 100 + 32


def test_new_data_sent_earns_a_quarter_as_many_retransmitted_bytes() -> None:
    handler = RetransmitHandler(linger_ns=MS, max_retransmits=1_000, max_rate=100_000)
    resend(handler, 0, 1 << 20, 0)  # the burst spent
    assert handler.plan(1 << 20, 2 << 20, 0) is NakOutcome.RATE_LIMITED
    handler.on_sent(16384)
    assert handler.plan(1 << 20, 2 << 20, 0) == (1 << 20, (1 << 20) + 4096)


def test_ranges_resent_out_of_order_still_cut_every_nak_and_expire_each_at_its_own_time() -> None:
    """The lingering ranges are kept in order of start whatever order they were resent in, and a NAK
    between two expiries sees the earlier range gone and the later one still lingering."""
    handler = RetransmitHandler(linger_ns=10 * MS, max_retransmits=1_000, max_rate=1 << 30)
    assert resend(handler, 8192, 12288, 0) == (8192, 12288)
    assert resend(handler, 0, 4096, 2 * MS) == (0, 4096)
    assert resend(handler, 4096, 8192, 4 * MS) == (4096, 8192)
    assert handler.plan(0, 12288, 5 * MS) is NakOutcome.NOTHING_TO_RESEND
    assert handler.plan(0, 16384, 5 * MS) == (12288, 16384)
    assert handler.plan(0, 12288, 11 * MS) == (8192, 12288)  # [8192, 12288) lingered until 10 ms
    assert handler.active_count(11 * MS) == 2
    assert handler.plan(0, 12288, 13 * MS) == (0, 4096)
    assert handler.active_count(14 * MS) == 0
