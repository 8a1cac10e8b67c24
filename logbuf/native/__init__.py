"""logbuf's native core, one Cython module per concern (DESIGN.md §1).

- :mod:`~logbuf.native.atomics`: acquire loads, release stores, get-and-add and compare-and-set at any
  offset of any buffer, and the :class:`Position` counter.
- :mod:`~logbuf.native.term`: the small pure term algorithms (scan block, scan for availability, append,
  rotate, clean, gap scan, rebuild insert, datagram check, frame count and index).
- :mod:`~logbuf.native.log_view`: a mapped log resolved to pointers (:class:`LogView`).
- :mod:`~logbuf.native.reader`: :class:`Header`, :func:`term_read` and :class:`ImageCore` (poll) and :class:`SubscriptionCore` (a subscription's poll over its images).
- :mod:`~logbuf.native.publisher`: :class:`PublicationCore` (offer), :class:`BufferClaim` and :class:`TopicHandle`
  (offers to one topic).
- :mod:`~logbuf.native.topic_filter`: :class:`TopicFilter`, a subscriber's cached topic-id decisions, read per
  frame by the filtered polls (``ImageCore.poll_filtered`` ...) and :class:`TopicSubscriptionCore`.
- :mod:`~logbuf.native.constants`: the shared constants (``constants.pxd``) as ``NATIVE_CONSTANTS``.

The driver's datagram syscalls live in the driver's own native module, :mod:`logbuf.driver._udp`.
"""

import sys

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("logbuf supports little-endian hosts only (frames and metadata are little-endian)")

from logbuf.native.atomics import (  # noqa: E402
    Position,
    compare_and_set_int32,
    compare_and_set_int64,
    get_and_add_int32,
    get_and_add_int64,
    get_int32_volatile,
    get_int64_volatile,
    put_int32_ordered,
    put_int64_ordered,
)
from logbuf.native.constants import NATIVE_CONSTANTS  # noqa: E402
from logbuf.native.log_view import LogView  # noqa: E402
from logbuf.native.publisher import BufferClaim, PublicationCore, TopicHandle, TopicOffers  # noqa: E402
from logbuf.native.reader import (  # noqa: E402
    FragmentBatchCore,
    Header,
    ImageCore,
    SubscriptionCore,
    TopicSubscriptionCore,
    term_read,
)
from logbuf.native.term import (  # noqa: E402
    check_data_datagram,
    count_frames,
    frame_index,
    reserved_value_bounds,
    rotate_log,
    term_append_unfragmented,
    term_clean,
    term_gap_scan,
    term_rebuild_insert,
    term_scan_block,
    term_scan_for_availability,
)
from logbuf.native.topic_filter import TopicFilter  # noqa: E402

__all__ = [
    "FragmentBatchCore",
    "NATIVE_CONSTANTS",
    "BufferClaim",
    "Header",
    "ImageCore",
    "SubscriptionCore",
    "TopicFilter",
    "TopicHandle",
    "TopicOffers",
    "TopicSubscriptionCore",
    "LogView",
    "Position",
    "PublicationCore",
    "check_data_datagram",
    "compare_and_set_int32",
    "compare_and_set_int64",
    "count_frames",
    "frame_index",
    "get_and_add_int32",
    "get_and_add_int64",
    "get_int32_volatile",
    "get_int64_volatile",
    "put_int32_ordered",
    "put_int64_ordered",
    "reserved_value_bounds",
    "rotate_log",
    "term_append_unfragmented",
    "term_clean",
    "term_gap_scan",
    "term_read",
    "term_rebuild_insert",
    "term_scan_block",
    "term_scan_for_availability",
]
