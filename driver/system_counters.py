"""System counters: the driver-wide telemetry, allocated first in the CnC counters (key = id).

Ids and labels follow Aeron's ``SystemCounterDescriptor`` where Aeron has the counter; logbuf's
own start at 100.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from logbuf import native
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersManager


class SystemCounterId(IntEnum):
    BYTES_SENT = 0
    BYTES_RECEIVED = 1
    NAK_MESSAGES_SENT = 5
    NAK_MESSAGES_RECEIVED = 6
    STATUS_MESSAGES_SENT = 7
    STATUS_MESSAGES_RECEIVED = 8
    HEARTBEATS_SENT = 9
    HEARTBEATS_RECEIVED = 10
    RETRANSMITS_SENT = 11
    FLOW_CONTROL_UNDER_RUNS = 12
    FLOW_CONTROL_OVER_RUNS = 13
    INVALID_PACKETS = 14
    ERRORS = 15
    SHORT_SENDS = 16
    UNBLOCKED_PUBLICATIONS = 19
    UNBLOCKED_COMMANDS = 20
    LOSS_GAP_FILLS = 23
    CLIENT_TIMEOUTS = 24
    CONDUCTOR_MAX_CYCLE_TIME = 26
    SENDER_MAX_CYCLE_TIME = 28
    RECEIVER_MAX_CYCLE_TIME = 30
    BYTES_CURRENTLY_MAPPED = 35
    RETRANSMITTED_BYTES = 36
    # logbuf's own
    COMMANDS_RECEIVED = 100
    DATAGRAMS_SENT = 101
    DATAGRAMS_RECEIVED = 102
    SETUPS_SENT = 103
    SETUPS_RECEIVED = 104
    ACTIVE_CLIENTS = 105
    ACTIVE_PUBLICATIONS = 106
    ACTIVE_IMAGES = 107
    IMAGES_REJECTED = 108
    SPOOFED_FRAMES_DROPPED = 109


LABELS: dict[SystemCounterId, str] = {
    SystemCounterId.BYTES_SENT: "Bytes sent",
    SystemCounterId.BYTES_RECEIVED: "Bytes received",
    SystemCounterId.NAK_MESSAGES_SENT: "NAKs sent",
    SystemCounterId.NAK_MESSAGES_RECEIVED: "NAKs received",
    SystemCounterId.STATUS_MESSAGES_SENT: "Status Messages sent",
    SystemCounterId.STATUS_MESSAGES_RECEIVED: "Status Messages received",
    SystemCounterId.HEARTBEATS_SENT: "Heartbeats sent",
    SystemCounterId.HEARTBEATS_RECEIVED: "Heartbeats received",
    SystemCounterId.RETRANSMITS_SENT: "Retransmits sent",
    SystemCounterId.FLOW_CONTROL_UNDER_RUNS: "Flow control under runs",
    SystemCounterId.FLOW_CONTROL_OVER_RUNS: "Flow control over runs",
    SystemCounterId.INVALID_PACKETS: "Invalid packets",
    SystemCounterId.ERRORS: "Errors",
    SystemCounterId.SHORT_SENDS: "Short sends",
    SystemCounterId.UNBLOCKED_PUBLICATIONS: "Unblocked Publications",
    SystemCounterId.UNBLOCKED_COMMANDS: "Unblocked Control Commands",
    SystemCounterId.LOSS_GAP_FILLS: "Loss gap fills",
    SystemCounterId.CLIENT_TIMEOUTS: "Client liveness timeouts",
    SystemCounterId.CONDUCTOR_MAX_CYCLE_TIME: "Conductor max cycle time (ns)",
    SystemCounterId.SENDER_MAX_CYCLE_TIME: "Sender max cycle time (ns)",
    SystemCounterId.RECEIVER_MAX_CYCLE_TIME: "Receiver max cycle time (ns)",
    SystemCounterId.BYTES_CURRENTLY_MAPPED: "Bytes currently mapped",
    SystemCounterId.RETRANSMITTED_BYTES: "Retransmitted bytes",
    SystemCounterId.COMMANDS_RECEIVED: "Client commands received",
    SystemCounterId.DATAGRAMS_SENT: "Datagrams sent",
    SystemCounterId.DATAGRAMS_RECEIVED: "Datagrams received",
    SystemCounterId.SETUPS_SENT: "Setups sent",
    SystemCounterId.SETUPS_RECEIVED: "Setups received",
    SystemCounterId.ACTIVE_CLIENTS: "Active clients",
    SystemCounterId.ACTIVE_PUBLICATIONS: "Active publications",
    SystemCounterId.ACTIVE_IMAGES: "Active images",
    SystemCounterId.IMAGES_REJECTED: "Images rejected",
    SystemCounterId.SPOOFED_FRAMES_DROPPED: "Spoofed frames dropped",
}


class SystemCounters:
    """The driver's system counters, allocated in a CountersManager; add/set by id."""

    def __init__(self, counters: CountersManager) -> None:
        self._values = counters.values
        self._offsets: dict[SystemCounterId, int] = {}
        for counter_id in SystemCounterId:
            allocated = counters.allocate(
                LABELS[counter_id], cd.SYSTEM_COUNTER_TYPE_ID, struct.pack("<i", int(counter_id))
            )
            self._offsets[counter_id] = cd.values_offset(allocated)

    def increment(self, counter_id: SystemCounterId, delta: int = 1) -> None:
        """Atomic add (several agents may count the same thing)."""
        native.get_and_add_int64(self._values, self._offsets[counter_id], delta)

    def count_send(self, length: int, sent: int) -> int:
        """Count one datagram of ``length`` bytes of which the socket took ``sent``: as bytes and a
        datagram sent, or as a short send. Returns the bytes sent (0 for a short send)."""
        if sent < length:
            self.increment(SystemCounterId.SHORT_SENDS)
            return 0
        self.increment(SystemCounterId.BYTES_SENT, sent)
        self.increment(SystemCounterId.DATAGRAMS_SENT)
        return sent

    def set(self, counter_id: SystemCounterId, value: int) -> None:
        native.put_int64_ordered(self._values, self._offsets[counter_id], value)

    def get(self, counter_id: SystemCounterId) -> int:
        return native.get_int64_volatile(self._values, self._offsets[counter_id])

    def propose_max(self, counter_id: SystemCounterId, value: int) -> None:
        if value > native.get_int64_volatile(self._values, self._offsets[counter_id]):
            native.put_int64_ordered(self._values, self._offsets[counter_id], value)

    def offset(self, counter_id: SystemCounterId) -> int:
        return self._offsets[counter_id]
