"""Log buffer layout: three term partitions followed by a 4 KiB metadata section.

Same layout and metadata offsets as Aeron's ``LogBufferDescriptor`` (``aeron_logbuffer_metadata_t``),
so a log written here reads like one of Aeron's. Metadata fields are in native byte order
(logbuf supports little-endian hosts only, so native is little-endian); frames in the terms
are little-endian by definition.

::

    +----------------------------+
    |           Term 0           |  term_length
    +----------------------------+
    |           Term 1           |  term_length
    +----------------------------+
    |           Term 2           |  term_length
    +----------------------------+
    |      Log metadata (4 KiB)  |  LOG_META_DATA_LENGTH
    +----------------------------+   file length = align(3 * term_length + 4096, page_size)

Metadata section (offsets from its start; hot fields are kept 64+ bytes from cold ones)::

      0  raw tail, partition 0  (int64: term_id << 32 | term_offset)      -+ hot: publishers
      8  raw tail, partition 1                                              |
     16  raw tail, partition 2                                              |
     24  active_term_count (int32; active partition = count % 3)           -+
    128  end_of_stream_position (int64)                                    -+ warm
    136  is_connected (int32)                                               |
    140  active_transport_count (int32)                                    -+
    256  correlation_id (int64)                                            -+ cold: written once
    264  initial_term_id  268 default_frame_header_length  272 mtu_length   |
    276  term_length      280 page_size   284 publication_window_length     |
    288  receiver_window_length ... 316 max_resend                          |
    320  default frame header (128 bytes reserved, 32 used)                 |
    448  entity_tag ... 495 tether                                         -+

Positions: ``position = ((term_id - initial_term_id) << log2(term_length)) + term_offset``, the
subtraction done in 32 bits so term ids may wrap.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Final

from logbuf import native
from logbuf.errors import LogBufferError as LogBufferError  # raised here

if TYPE_CHECKING:
    from typing_extensions import Buffer

PARTITION_COUNT: Final[int] = 3

TERM_MIN_LENGTH: Final[int] = 64 * 1024
TERM_MAX_LENGTH: Final[int] = 1024 * 1024 * 1024
PAGE_MIN_SIZE: Final[int] = 4 * 1024
PAGE_MAX_SIZE: Final[int] = 1024 * 1024 * 1024

CACHE_LINE_LENGTH: Final[int] = 64
LOG_META_DATA_LENGTH: Final[int] = PAGE_MIN_SIZE

# -- metadata offsets ---------------------------------------------------------------------------
TERM_TAIL_COUNTERS_OFFSET: Final[int] = 0
LOG_ACTIVE_TERM_COUNT_OFFSET: Final[int] = TERM_TAIL_COUNTERS_OFFSET + 8 * PARTITION_COUNT
LOG_END_OF_STREAM_POSITION_OFFSET: Final[int] = 2 * 64
LOG_IS_CONNECTED_OFFSET: Final[int] = LOG_END_OF_STREAM_POSITION_OFFSET + 8
LOG_ACTIVE_TRANSPORT_COUNT_OFFSET: Final[int] = LOG_IS_CONNECTED_OFFSET + 4
LOG_CORRELATION_ID_OFFSET: Final[int] = 4 * 64
LOG_INITIAL_TERM_ID_OFFSET: Final[int] = LOG_CORRELATION_ID_OFFSET + 8
LOG_DEFAULT_FRAME_HEADER_LENGTH_OFFSET: Final[int] = LOG_INITIAL_TERM_ID_OFFSET + 4
LOG_MTU_LENGTH_OFFSET: Final[int] = LOG_DEFAULT_FRAME_HEADER_LENGTH_OFFSET + 4
LOG_TERM_LENGTH_OFFSET: Final[int] = LOG_MTU_LENGTH_OFFSET + 4
LOG_PAGE_SIZE_OFFSET: Final[int] = LOG_TERM_LENGTH_OFFSET + 4
LOG_PUBLICATION_WINDOW_LENGTH_OFFSET: Final[int] = LOG_PAGE_SIZE_OFFSET + 4
LOG_RECEIVER_WINDOW_LENGTH_OFFSET: Final[int] = LOG_PUBLICATION_WINDOW_LENGTH_OFFSET + 4
LOG_SOCKET_SNDBUF_LENGTH_OFFSET: Final[int] = LOG_RECEIVER_WINDOW_LENGTH_OFFSET + 4
LOG_OS_DEFAULT_SOCKET_SNDBUF_LENGTH_OFFSET: Final[int] = LOG_SOCKET_SNDBUF_LENGTH_OFFSET + 4
LOG_OS_MAX_SOCKET_SNDBUF_LENGTH_OFFSET: Final[int] = LOG_OS_DEFAULT_SOCKET_SNDBUF_LENGTH_OFFSET + 4
LOG_SOCKET_RCVBUF_LENGTH_OFFSET: Final[int] = LOG_OS_MAX_SOCKET_SNDBUF_LENGTH_OFFSET + 4
LOG_OS_DEFAULT_SOCKET_RCVBUF_LENGTH_OFFSET: Final[int] = LOG_SOCKET_RCVBUF_LENGTH_OFFSET + 4
LOG_OS_MAX_SOCKET_RCVBUF_LENGTH_OFFSET: Final[int] = LOG_OS_DEFAULT_SOCKET_RCVBUF_LENGTH_OFFSET + 4
LOG_MAX_RESEND_OFFSET: Final[int] = LOG_OS_MAX_SOCKET_RCVBUF_LENGTH_OFFSET + 4
LOG_DEFAULT_FRAME_HEADER_OFFSET: Final[int] = LOG_MAX_RESEND_OFFSET + 4
LOG_DEFAULT_FRAME_HEADER_MAX_LENGTH: Final[int] = 128
LOG_ENTITY_TAG_OFFSET: Final[int] = LOG_DEFAULT_FRAME_HEADER_OFFSET + LOG_DEFAULT_FRAME_HEADER_MAX_LENGTH
LOG_RESPONSE_CORRELATION_ID_OFFSET: Final[int] = LOG_ENTITY_TAG_OFFSET + 8
LOG_LINGER_TIMEOUT_NS_OFFSET: Final[int] = LOG_RESPONSE_CORRELATION_ID_OFFSET + 8
LOG_UNTETHERED_WINDOW_LIMIT_TIMEOUT_NS_OFFSET: Final[int] = LOG_LINGER_TIMEOUT_NS_OFFSET + 8
LOG_UNTETHERED_RESTING_TIMEOUT_NS_OFFSET: Final[int] = LOG_UNTETHERED_WINDOW_LIMIT_TIMEOUT_NS_OFFSET + 8
LOG_GROUP_OFFSET: Final[int] = LOG_UNTETHERED_RESTING_TIMEOUT_NS_OFFSET + 8
LOG_IS_RESPONSE_OFFSET: Final[int] = LOG_GROUP_OFFSET + 1
LOG_REJOIN_OFFSET: Final[int] = LOG_IS_RESPONSE_OFFSET + 1
LOG_RELIABLE_OFFSET: Final[int] = LOG_REJOIN_OFFSET + 1
LOG_SPARSE_OFFSET: Final[int] = LOG_RELIABLE_OFFSET + 1
LOG_SIGNAL_EOS_OFFSET: Final[int] = LOG_SPARSE_OFFSET + 1
LOG_SPIES_SIMULATE_CONNECTION_OFFSET: Final[int] = LOG_SIGNAL_EOS_OFFSET + 1
LOG_TETHER_OFFSET: Final[int] = LOG_SPIES_SIMULATE_CONNECTION_OFFSET + 1
LOG_META_DATA_USED_LENGTH: Final[int] = LOG_TETHER_OFFSET + 1

assert LOG_DEFAULT_FRAME_HEADER_OFFSET == 320 and LOG_ENTITY_TAG_OFFSET == 448 and LOG_TETHER_OFFSET == 495

COLD_FIELDS: Final[struct.Struct] = struct.Struct("=qiiiiiiii")
"""correlation_id, initial_term_id, default_frame_header_length, mtu, term_length, page_size,
publication_window_length, receiver_window_length, socket_sndbuf_length (at LOG_CORRELATION_ID_OFFSET)."""


def check_term_length(term_length: int) -> None:
    """A term length is a power of two from 64 KiB to 1 GiB."""
    if not isinstance(term_length, int) or isinstance(term_length, bool):
        raise LogBufferError(f"term_length={term_length!r} must be an int")
    if term_length < TERM_MIN_LENGTH:
        raise LogBufferError(f"term_length={term_length} is less than the minimum {TERM_MIN_LENGTH} (64 KiB)")
    if term_length > TERM_MAX_LENGTH:
        raise LogBufferError(f"term_length={term_length} is greater than the maximum {TERM_MAX_LENGTH} (1 GiB)")
    if term_length & (term_length - 1):
        raise LogBufferError(f"term_length={term_length} is not a power of 2")


def check_page_size(page_size: int) -> None:
    """A page size is a power of two from 4 KiB to 1 GiB."""
    if page_size < PAGE_MIN_SIZE or page_size > PAGE_MAX_SIZE or page_size & (page_size - 1):
        raise LogBufferError(f"page_size={page_size} must be a power of 2 from {PAGE_MIN_SIZE} to {PAGE_MAX_SIZE}")


def compute_log_length(term_length: int, page_size: int) -> int:
    """Total length of a log file: 3 terms plus metadata, rounded up to whole pages."""
    raw = PARTITION_COUNT * term_length + LOG_META_DATA_LENGTH
    return (raw + page_size - 1) & ~(page_size - 1)


def metadata_offset(term_length: int) -> int:
    """Where the metadata section starts in the file."""
    return PARTITION_COUNT * term_length


def position_bits_to_shift(term_length: int) -> int:
    """log2(term_length): how far term counts shift into a position."""
    return term_length.bit_length() - 1


def pack_tail(term_id: int, term_offset: int) -> int:
    """A raw tail as stored: term id in the upper 32 bits, tail offset in the lower 32 (signed int64)."""
    raw = ((term_id & 0xFFFFFFFF) << 32) | (term_offset & 0xFFFFFFFF)
    return raw - (1 << 64) if raw >= (1 << 63) else raw


def term_id(raw_tail: int) -> int:
    """Term id held in a raw tail (signed 32-bit)."""
    return raw_tail >> 32


def term_offset(raw_tail: int, term_length: int) -> int:
    """Tail offset held in a raw tail, clamped to the term length (a failed claim runs past it)."""
    return min(raw_tail & 0xFFFFFFFF, term_length)


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= (1 << 31) else value


def compute_position(active_term_id: int, offset: int, shift: int, initial_term_id: int) -> int:
    """Stream position of ``offset`` in term ``active_term_id``; term ids may wrap around."""
    term_count = _int32(active_term_id - initial_term_id)
    return (term_count << shift) + offset


def compute_term_id_from_position(position: int, shift: int, initial_term_id: int) -> int:
    """Term id that holds ``position``."""
    return _int32((position >> shift) + initial_term_id)


def index_by_position(position: int, shift: int) -> int:
    """Partition index (0..2) that holds ``position``."""
    return (position >> shift) % PARTITION_COUNT


def index_by_term(initial_term_id: int, active_term_id: int) -> int:
    """Partition index (0..2) that holds term ``active_term_id``."""
    return _int32(active_term_id - initial_term_id) % PARTITION_COUNT


def index_by_term_count(term_count: int) -> int:
    """Partition index (0..2) for the ``term_count``-th term of the log."""
    return term_count % PARTITION_COUNT


def max_possible_position(term_length: int) -> int:
    """Largest position a log with ``term_length`` can reach: term_length * 2^31."""
    return term_length * (1 << 31)


def raw_tail_volatile(metadata: Buffer, partition_index: int) -> int:
    """Acquire-load of a partition's raw tail."""
    return native.get_int64_volatile(metadata, TERM_TAIL_COUNTERS_OFFSET + 8 * partition_index)


def active_term_count_volatile(metadata: Buffer) -> int:
    """Acquire-load of the active term count."""
    return native.get_int32_volatile(metadata, LOG_ACTIVE_TERM_COUNT_OFFSET)


def is_connected_volatile(metadata: Buffer) -> bool:
    """Acquire-load of the is-connected flag."""
    return native.get_int32_volatile(metadata, LOG_IS_CONNECTED_OFFSET) == 1


def end_of_stream_position_volatile(metadata: Buffer) -> int:
    """Acquire-load of the end-of-stream position (max int64 while the stream is open)."""
    return native.get_int64_volatile(metadata, LOG_END_OF_STREAM_POSITION_OFFSET)
