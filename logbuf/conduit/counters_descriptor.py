"""Counters layout: Agrona's CountersManager buffers (a metadata record and a value record per counter).

Counter id = record index. Values are int64 in native (little-endian) order; each value record
is two cache lines so that two hot counters never share one.

Values buffer, one 128-byte record per counter::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                        Counter Value (int64)                  |   0
    +---------------------------------------------------------------+
    |                       Registration Id (int64)                 |   8
    +---------------------------------------------------------------+
    |                          Owner Id (int64)                     |  16
    +---------------------------------------------------------------+
    |                        Reference Id (int64)                   |  24
    +---------------------------------------------------------------+
    |                     96 bytes of padding                      ...  32
    +---------------------------------------------------------------+

Metadata buffer (4x the values buffer), one 512-byte record per counter::

    +---------------------------------------------------------------+
    |                        Record State (int32)                   |   0
    +---------------------------------------------------------------+
    |                          Type Id (int32)                      |   4
    +---------------------------------------------------------------+
    |              Free-for-reuse Deadline, ms (int64)              |   8
    +---------------------------------------------------------------+
    |                      112 bytes of key                        ...  16
    +---------------------------------------------------------------+
    |                       Label Length (int32)                    | 128
    +---------------------------------------------------------------+
    |                    380 bytes of label (UTF-8)                ... 132
    +---------------------------------------------------------------+

Record states: UNUSED 0 (iteration stops at the first), ALLOCATED 1, RECLAIMED -1.
Stream-counter key (Aeron's ``aeron_stream_position_counter_key_layout_t``): registration_id int64 @0,
session_id @8, stream_id @12, channel length @16, channel @20 (at most 92 bytes, cut to fit). Label:
``<name>: <registration_id> <session_id> <stream_id> <channel>[ <suffix>]`` (sub-pos: `` @<join>``).
"""

from __future__ import annotations

import struct
from typing import Final

COUNTER_LENGTH: Final[int] = 128
VALUE_OFFSET: Final[int] = 0
REGISTRATION_ID_OFFSET: Final[int] = VALUE_OFFSET + 8
OWNER_ID_OFFSET: Final[int] = REGISTRATION_ID_OFFSET + 8
REFERENCE_ID_OFFSET: Final[int] = OWNER_ID_OFFSET + 8

METADATA_LENGTH: Final[int] = 512
RECORD_STATE_OFFSET: Final[int] = 0
TYPE_ID_OFFSET: Final[int] = RECORD_STATE_OFFSET + 4
FREE_FOR_REUSE_DEADLINE_OFFSET: Final[int] = TYPE_ID_OFFSET + 4
KEY_OFFSET: Final[int] = FREE_FOR_REUSE_DEADLINE_OFFSET + 8
MAX_KEY_LENGTH: Final[int] = 112
LABEL_LENGTH_OFFSET: Final[int] = KEY_OFFSET + MAX_KEY_LENGTH
LABEL_OFFSET: Final[int] = LABEL_LENGTH_OFFSET + 4
MAX_LABEL_LENGTH: Final[int] = METADATA_LENGTH - LABEL_OFFSET

assert LABEL_LENGTH_OFFSET == 128 and LABEL_OFFSET == 132 and MAX_LABEL_LENGTH == 380

RECORD_UNUSED: Final[int] = 0
RECORD_ALLOCATED: Final[int] = 1
RECORD_RECLAIMED: Final[int] = -1
NOT_FREE_TO_REUSE: Final[int] = (1 << 63) - 1

# -- type ids (Aeron's AeronCounters) ---------------------------------------------------------
SYSTEM_COUNTER_TYPE_ID: Final[int] = 0
PUBLISHER_LIMIT_TYPE_ID: Final[int] = 1
SENDER_POSITION_TYPE_ID: Final[int] = 2
RECEIVER_HWM_TYPE_ID: Final[int] = 3
SUBSCRIBER_POSITION_TYPE_ID: Final[int] = 4
RECEIVER_POSITION_TYPE_ID: Final[int] = 5
SENDER_LIMIT_TYPE_ID: Final[int] = 9
CLIENT_HEARTBEAT_TYPE_ID: Final[int] = 11
PUBLISHER_POSITION_TYPE_ID: Final[int] = 12
SENDER_BPE_TYPE_ID: Final[int] = 13
"""Sender flow-control limits (back-pressure events) of one network publication."""
FLOW_CONTROL_RECEIVERS_TYPE_ID: Final[int] = 17
"""Per multicast/MDC publication: receivers its flow-control strategy counts in the group."""
MDC_DESTINATIONS_TYPE_ID: Final[int] = 18
"""Per MDC publication: destinations its endpoint sends to."""
SENDER_NAKS_RECEIVED_TYPE_ID: Final[int] = 19
RECEIVER_NAKS_SENT_TYPE_ID: Final[int] = 20
# logbuf's own, outside Aeron's ranges:
LOG_CLEAN_POSITION_TYPE_ID: Final[int] = 1001
"""Standalone logs: how far the log has been cleaned (zeroed) for reuse."""
FLOW_CONTROL_LOCK_TYPE_ID: Final[int] = 1002
"""Standalone logs: pid of the process currently updating the publisher limit (0 = free)."""
LOGBUF_SYSTEM_COUNTER_TYPE_ID: Final[int] = 1003
"""A driver system counter that Aeron does not have (key = its logbuf id, from 100); see
:mod:`logbuf.conduit.system_counters_descriptor`."""
FLOW_CONTROL_RECEIVER_POSITION_TYPE_ID: Final[int] = 1004
"""Per receiver of a multicast/MDC publication: the position of its last status message (label names
the receiver id and its address), so tools show who is slow across hosts."""

STREAM_KEY: Final[struct.Struct] = struct.Struct("<qiii")
"""registration_id, session_id, stream_id, channel_length; the channel follows at 20."""
STREAM_KEY_CHANNEL_OFFSET: Final[int] = STREAM_KEY.size
STREAM_KEY_MAX_CHANNEL_LENGTH: Final[int] = MAX_KEY_LENGTH - STREAM_KEY_CHANNEL_OFFSET
"""Bytes of channel a stream counter's key holds (92); a longer channel is cut (the label has more)."""

PUBLISHER_POSITION_CONCURRENT_NAME: Final[str] = "pub-pos (concurrent)"
PUBLISHER_POSITION_EXCLUSIVE_NAME: Final[str] = "pub-pos (exclusive)"
"""Aeron 1.53 names a publication's position counter by its kind (type id 12 either way)."""

LABEL_PREFIXES: Final[dict[int, str]] = {
    PUBLISHER_LIMIT_TYPE_ID: "pub-lmt",
    SENDER_POSITION_TYPE_ID: "snd-pos",
    RECEIVER_HWM_TYPE_ID: "rcv-hwm",
    SUBSCRIBER_POSITION_TYPE_ID: "sub-pos",
    RECEIVER_POSITION_TYPE_ID: "rcv-pos",
    SENDER_LIMIT_TYPE_ID: "snd-lmt",
    CLIENT_HEARTBEAT_TYPE_ID: "client-heartbeat",
    FLOW_CONTROL_RECEIVERS_TYPE_ID: "fc-receivers",
    MDC_DESTINATIONS_TYPE_ID: "mdc-num-dest",
    FLOW_CONTROL_RECEIVER_POSITION_TYPE_ID: "fc-rcv-pos",
    PUBLISHER_POSITION_TYPE_ID: "pub-pos",  # then " (concurrent)" or " (exclusive)"
    SENDER_BPE_TYPE_ID: "snd-bpe",
    SENDER_NAKS_RECEIVED_TYPE_ID: "snd-naks-received",
    RECEIVER_NAKS_SENT_TYPE_ID: "rcv-naks-sent",
    LOG_CLEAN_POSITION_TYPE_ID: "log-clean-pos",
    FLOW_CONTROL_LOCK_TYPE_ID: "fc-lock",
}


def values_offset(counter_id: int) -> int:
    """Offset of a counter's value record in the values buffer."""
    return counter_id * COUNTER_LENGTH


def metadata_offset(counter_id: int) -> int:
    """Offset of a counter's metadata record in the metadata buffer."""
    return counter_id * METADATA_LENGTH


def check_values_length(values_length: int) -> None:
    """A values buffer holds a whole, non-zero number of records."""
    if values_length <= 0 or values_length % COUNTER_LENGTH != 0:
        raise ValueError(f"counters values_length={values_length} must be a positive multiple of {COUNTER_LENGTH}")


def stream_label(
    name: str, registration_id: int, session_id: int, stream_id: int, channel: str, suffix: str = ""
) -> str:
    """Aeron's stream-counter label (a subscriber position's suffix is ``@<join position>``)."""
    label = f"{name}: {registration_id} {session_id} {stream_id} {channel}"
    return f"{label} {suffix}" if suffix else label


def stream_key(registration_id: int, session_id: int, stream_id: int, channel: str) -> bytes:
    """Aeron's stream-counter key: the ids, then the channel (ASCII) cut to what the key holds."""
    encoded = channel.encode("ascii", "replace")[:STREAM_KEY_MAX_CHANNEL_LENGTH]
    return STREAM_KEY.pack(registration_id, session_id, stream_id, len(encoded)) + encoded


def stream_key_channel(key: bytes) -> str:
    """The channel stored in a stream counter's key ('' if none, as in standalone logs)."""
    length = STREAM_KEY.unpack_from(key)[3]
    if not 0 < length <= STREAM_KEY_MAX_CHANNEL_LENGTH:
        return ""
    start = STREAM_KEY_CHANNEL_OFFSET
    return bytes(key[start : start + length]).decode("ascii", "replace")
