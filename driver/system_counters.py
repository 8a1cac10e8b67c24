"""System counters: the driver-wide telemetry, allocated first in the CnC counters.

Which counter sits in which slot, with which type id, key and label, is
:mod:`logbuf.conduit.system_counters_descriptor` (Aeron 1.53's order, then logbuf's own); this
module allocates them in that order and counts into them.
"""

from __future__ import annotations

from logbuf import native
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersManager
from logbuf.conduit.system_counters_descriptor import (
    CONTROL_PROTOCOL_VERSION,
    DESCRIPTORS,
    LABELS,
    LOGBUF_VERSION,
    SYSTEM_COUNTER_OWNER_ID,
    SystemCounterId,
    semantic_version,
)

__all__ = ["LABELS", "SystemCounterId", "SystemCounters"]


def _version_value(version: str) -> int:
    """``major.minor.patch[...]`` as Agrona's semantic version int (0 if it does not parse)."""
    try:
        major, minor, patch = (int(part) for part in version.split("+")[0].split("-")[0].split(".")[:3])
        return semantic_version(major, minor, patch)
    except ValueError:
        return 0


class SystemCounters:
    """The driver's system counters, allocated in a CountersManager; add/set by id."""

    def __init__(self, counters: CountersManager) -> None:
        self._values = counters.values
        self._offsets: dict[SystemCounterId, int] = {}
        self.counter_ids: dict[SystemCounterId, int] = {}
        """Slot (counter id) of each system counter."""
        for descriptor in DESCRIPTORS:
            allocated = counters.allocate(
                descriptor.label,
                descriptor.type_id,
                descriptor.key,
                registration_id=int(descriptor.id),
                owner_id=SYSTEM_COUNTER_OWNER_ID,
            )
            self.counter_ids[descriptor.id] = allocated
            self._offsets[descriptor.id] = cd.values_offset(allocated)
        self.set(SystemCounterId.AERON_VERSION, _version_value(LOGBUF_VERSION))
        self.set(SystemCounterId.CONTROL_PROTOCOL_VERSION, CONTROL_PROTOCOL_VERSION)

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

    def offset(self, counter_id: SystemCounterId) -> int:
        return self._offsets[counter_id]
