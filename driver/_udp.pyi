"""Type stubs for logbuf.driver._udp (_udp.pyx)."""

from typing import Any

from typing_extensions import Buffer

from logbuf.native.log_view import LogView

UDP_GRO_SEGMENTS: int
UDP_GRO_OPTION: int
UDP_SEGMENT_OPTION: int

def term_send_datagrams(
    fd: int,
    term_buffer: Buffer,
    term_offset: int,
    max_length: int,
    mtu: int,
    address: bytes,
    max_datagrams: int,
    gso: bool = False,
) -> tuple[int, int, int, bool]: ...
def term_datagrams(
    term_buffer: Buffer,
    term_offset: int,
    max_length: int,
    mtu: int,
    max_datagrams: int,
    offsets: Any,
    lengths: Any,
    covers: Any,
) -> int: ...
def wait_readable(fd: int, timeout_ns: int) -> bool: ...
def udp_receive_batch(fd: int, buffer: Buffer, slot_length: int, offsets: Any, lengths: Any, sources: Any) -> int: ...

class ImageReceiver:
    session_id: int
    stream_id: int
    term_length: int
    initial_term_id: int
    source_key: int
    rebuild: int
    floor: int
    hwm: int
    eos_position: int
    received: int
    inserted: int
    heartbeats: int
    over_runs: int
    under_runs: int
    def __init__(self, log: LogView, session_id: int, stream_id: int, source_key: int) -> None: ...
    def on_datagram(self, packet: Buffer) -> int: ...

DATA_NOT_TAKEN: int
DATA_INSERTED: int
DATA_HEARTBEAT: int
DATA_BEHIND: int
DATA_OVER_RUN: int
DATA_UNDER_RUN: int

def insert_data_batch(
    buffer: Buffer, count: int, offsets: Any, lengths: Any, sources: Any, receivers: list[ImageReceiver]
) -> int: ...
def udp_receive_data(
    fd: int,
    buffer: Buffer,
    slot_length: int,
    offsets: Any,
    lengths: Any,
    sources: Any,
    receivers: list[ImageReceiver],
) -> tuple[int, int]: ...
