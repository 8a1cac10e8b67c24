"""Counter factories: one method per counter type the conductor allocates, with Aeron's labels and keys.

After Aeron's ``PublisherPos``, ``SenderPos``, ``ReceiverHwm`` ... allocators: a stream's counters
share a label (``<name>: <registration id> <session id> <stream id> <channel>``, the channel as the
client gave it) and a key (the ids, then the channel), and are owned by the client that caused
them (flow-control and MDC counters by none, as Aeron's). The subscriber positions are made by the
publication or image they track (:meth:`~logbuf.driver.ipc_publication.IpcPublication.add_subscriber`).
"""

from __future__ import annotations

from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.counters import CountersManager

__all__ = ["StreamCounters", "allocate_client_heartbeat"]


def allocate_client_heartbeat(counters: CountersManager, client_id: int, epoch_ms: int) -> int:
    """A client's heartbeat counter (``client-heartbeat: id=N``): Aeron clients find it by its key, their id."""
    return counters.allocate(
        f"client-heartbeat: id={client_id}",
        cd.CLIENT_HEARTBEAT_TYPE_ID,
        client_id.to_bytes(8, "little", signed=True),
        registration_id=client_id,
        owner_id=client_id,
        initial_value=epoch_ms,
    )


class StreamCounters:
    """The counters of one stream (a publication or an image), labelled and keyed alike."""

    def __init__(
        self,
        counters: CountersManager,
        registration_id: int,
        session_id: int,
        stream_id: int,
        channel: str,
        owner_id: int,
    ) -> None:
        self.counters = counters
        self.registration_id = registration_id
        self.owner_id = owner_id
        self._label = cd.stream_label("{}", registration_id, session_id, stream_id, channel)
        self._key = cd.stream_key(registration_id, session_id, stream_id, channel)

    def _allocate(self, name: str, type_id: int, initial_value: int = 0, *, owned: bool = True) -> int:
        return self.counters.allocate(
            self._label.format(name),
            type_id,
            self._key,
            registration_id=self.registration_id,
            owner_id=self.owner_id if owned else 0,
            initial_value=initial_value,
        )

    # -- publications -----------------------------------------------------------------------------------
    def publisher_position(self, start: int, *, exclusive: bool) -> int:
        name = cd.PUBLISHER_POSITION_EXCLUSIVE_NAME if exclusive else cd.PUBLISHER_POSITION_CONCURRENT_NAME
        return self._allocate(name, cd.PUBLISHER_POSITION_TYPE_ID, start)

    def publisher_limit(self, start: int) -> int:
        return self._allocate("pub-lmt", cd.PUBLISHER_LIMIT_TYPE_ID, start)

    def sender_position(self, start: int) -> int:
        return self._allocate("snd-pos", cd.SENDER_POSITION_TYPE_ID, start)

    def sender_limit(self, start: int) -> int:
        return self._allocate("snd-lmt", cd.SENDER_LIMIT_TYPE_ID, start)

    def sender_bpe(self) -> int:
        return self._allocate(cd.LABEL_PREFIXES[cd.SENDER_BPE_TYPE_ID], cd.SENDER_BPE_TYPE_ID)

    def sender_naks_received(self) -> int:
        type_id = cd.SENDER_NAKS_RECEIVED_TYPE_ID
        return self._allocate(cd.LABEL_PREFIXES[type_id], type_id)

    def flow_control_receivers(self) -> int:
        return self._allocate("fc-receivers", cd.FLOW_CONTROL_RECEIVERS_TYPE_ID, owned=False)

    def mdc_destinations(self) -> int:
        return self._allocate("mdc-num-dest", cd.MDC_DESTINATIONS_TYPE_ID, owned=False)

    # -- images -----------------------------------------------------------------------------------------
    def receiver_hwm(self, join: int) -> int:
        return self._allocate("rcv-hwm", cd.RECEIVER_HWM_TYPE_ID, join)

    def receiver_position(self, join: int) -> int:
        return self._allocate("rcv-pos", cd.RECEIVER_POSITION_TYPE_ID, join)

    def receiver_naks_sent(self) -> int:
        return self._allocate("rcv-naks-sent", cd.RECEIVER_NAKS_SENT_TYPE_ID)
