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
    inserted: int
    def __init__(self, log: LogView, session_id: int, stream_id: int, source_key: int) -> None: ...

def udp_receive_data(
    fd: int,
    buffer: Buffer,
    slot_length: int,
    offsets: Any,
    lengths: Any,
    sources: Any,
    receivers: list[ImageReceiver],
) -> tuple[int, int]: ...
