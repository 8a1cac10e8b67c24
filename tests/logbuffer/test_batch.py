"""logbuf's vectorised paths: ``poll_batch`` into numpy arrays over the term (no Python per fragment) and
``offer_rows`` / ``offer_packed`` from numpy arrays (one claim per batch). Every message arrives once, in
order, with its exact content and reserved value, across term rotations."""

from __future__ import annotations

import numpy as np
import pytest

from logbuf.logbuffer.image import FragmentBatch, Image
from logbuf.logbuffer.publication import OfferResult, Publication
from logbuf.logbuffer.standalone import StreamLog
from tests.support.logs import MAX_PAYLOAD, SESSION_ID, TERM_LENGTH


def drain(image: Image, batch: FragmentBatch, into: list[tuple[bytes, int, int]]) -> int:
    """Poll batches until none is left; record (payload, reserved value, position after) per fragment."""
    total = 0
    while n := image.poll_batch(batch):
        assert (batch.session_ids[:n] == SESSION_ID).all() and (batch.flags[:n] == 0xC0).all()
        for i in range(n):
            into.append((batch.payload(i).tobytes(), int(batch.reserved_values[i]), int(batch.positions[i])))
        assert image.position == int(batch.positions[n - 1])  # the position counts what was handed out
        total += n
    return total


def test_rows_offered_in_batches_come_back_once_in_order_across_rotations(log: StreamLog) -> None:
    image, pub = log.add_subscriber(), log.add_publication()
    rng = np.random.default_rng(7)
    batch = FragmentBatch(100)
    got: list[tuple[bytes, int, int]] = []
    sent: list[tuple[bytes, int]] = []
    for round_ in range(60):  # 60 x 50 x 64 B frames: about three terms of 64 KiB
        rows = rng.integers(0, 256, size=(50, 30), dtype=np.uint8)
        reserved = np.arange(round_ * 50, round_ * 50 + 50, dtype=np.int64)
        while (result := pub.offer_rows(rows, reserved)) == OfferResult.ADMIN_ACTION:
            pass
        assert result > 0
        sent += [(row.tobytes(), int(r)) for row, r in zip(rows, reserved)]
        drain(image, batch, got)
    assert [(payload, reserved) for payload, reserved, _ in got] == sent
    positions = [position for _, _, position in got]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert positions[-1] > 2 * TERM_LENGTH


def test_packed_messages_of_any_length_keep_their_bytes(log: StreamLog) -> None:
    image, pub = log.add_subscriber(), log.add_publication()
    lengths = np.array([0, 1, 31, 32, 33, 500, MAX_PAYLOAD], dtype=np.int32)
    data = np.arange(int(lengths.sum()), dtype=np.int64).astype(np.uint8)
    assert pub.offer_packed(data, lengths) > 0
    got: list[tuple[bytes, int, int]] = []
    assert drain(image, FragmentBatch(16), got) == len(lengths)
    ends = np.cumsum(lengths)
    assert [p for p, _, _ in got] == [data[e - n : e].tobytes() for e, n in zip(ends, lengths)]
    assert [r for _, r, _ in got] == [0] * len(lengths)


def test_a_batch_is_bounded_by_its_capacity_and_the_fragment_limit(log: StreamLog) -> None:
    image, pub = log.add_subscriber(), log.add_publication()
    assert pub.offer_rows(np.zeros((10, 8), dtype=np.uint8)) > 0
    batch = FragmentBatch(4)
    assert image.poll_batch(batch) == 4
    assert image.poll_batch(batch, 3) == 3
    rows = batch.rows(8)
    assert rows is not None and rows.shape == (3, 8) and not rows.any()
    assert image.poll_batch(batch) == 3 and image.poll_batch(batch) == 0


def test_other_polls_go_on_after_the_batch(log: StreamLog) -> None:
    image, pub = log.add_subscriber(), log.add_publication()
    assert pub.offer_rows(np.ones((3, 8), dtype=np.uint8)) > 0
    batch = FragmentBatch(8)
    assert image.poll_batch(batch) == 3
    assert image.position == int(batch.positions[2])  # the batch counts as consumed
    assert pub.offer(b"next") > 0
    fragments: list[bytes] = []
    assert image.poll(lambda payload, header: fragments.append(bytes(payload)), 10) == 1
    assert fragments == [b"next"]


def test_bad_batches_are_refused_with_the_reason(log: StreamLog) -> None:
    pub = log.add_publication()
    with pytest.raises(ValueError, match="exceeds max_payload_length"):
        pub.offer_rows(np.zeros((2, MAX_PAYLOAD + 1), dtype=np.uint8))
    with pytest.raises(ValueError, match="lengths add up to 3 bytes but data holds 4"):
        pub.offer_packed(np.zeros(4, dtype=np.uint8), np.array([1, 2], dtype=np.int32))
    with pytest.raises(ValueError, match="reserved_values has 1 values for 2 messages"):
        pub.offer_rows(np.zeros((2, 4), dtype=np.uint8), np.zeros(1, dtype=np.int64))
    with pytest.raises(ValueError, match="exceeds max_message_length"):
        pub.offer_rows(np.zeros((2000, 1000), dtype=np.uint8))
    with pytest.raises(ValueError, match="one length"):
        from logbuf import native

        native.FragmentBatchCore(
            *(np.zeros(4, t) for t in (np.int32, np.int32, np.int32, np.uint8, np.int64)), np.zeros(5, np.int64)
        )


def test_a_closed_publication_offers_nothing(log: StreamLog) -> None:
    pub: Publication = log.add_publication()
    pub.close()
    assert pub.offer_rows(np.zeros((1, 1), dtype=np.uint8)) == OfferResult.CLOSED
