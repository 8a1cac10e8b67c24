"""Type stubs for logbuf.driver._udp (_udp.pyx)."""

from typing import Any

from typing_extensions import Buffer

def term_send_datagrams(
    fd: int, term_buffer: Buffer, term_offset: int, max_length: int, mtu: int, address: bytes, max_datagrams: int
) -> tuple[int, int, int]: ...
def udp_receive_batch(fd: int, buffer: Buffer, slot_length: int, lengths: Any, sources: Any) -> int: ...
