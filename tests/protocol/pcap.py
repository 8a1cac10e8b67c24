"""A tiny pure-Python reader for classic pcap files: UDP-over-IPv4 payloads, nothing more.

Enough to use packet captures as byte vectors in tests. Supports the classic pcap format
(either byte order, microsecond or nanosecond timestamps; not pcapng) and the link types
tcpdump/Wireshark use on Linux and BSD loopback: Ethernet (with 802.1Q tags), Linux cooked
capture v1 and v2, BSD loopback (``DLT_NULL``/``DLT_LOOP``) and raw IP. Non-IPv4 and non-UDP
packets are skipped; IPv4 fragments and truncated packets raise :class:`PcapError`, since a
test vector that is not whole is no test vector.
"""

from __future__ import annotations

import pathlib
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

# -- file and record headers ------------------------------------------------------------------
MAGIC_MICROSECONDS: Final[int] = 0xA1B2C3D4
MAGIC_NANOSECONDS: Final[int] = 0xA1B23C4D
FILE_HEADER_LENGTH: Final[int] = 24
RECORD_HEADER_LENGTH: Final[int] = 16

# -- link types (https://www.tcpdump.org/linktypes.html) ---------------------------------------
LINKTYPE_NULL: Final[int] = 0  # BSD loopback: 4-byte address family, host byte order
LINKTYPE_ETHERNET: Final[int] = 1
LINKTYPE_RAW: Final[int] = 101
LINKTYPE_LOOP: Final[int] = 108  # OpenBSD loopback: 4-byte address family, network byte order
LINKTYPE_LINUX_SLL: Final[int] = 113
LINKTYPE_IPV4: Final[int] = 228
LINKTYPE_LINUX_SLL2: Final[int] = 276

ETHERTYPE_IPV4: Final[int] = 0x0800
ETHERTYPE_VLAN: Final[tuple[int, ...]] = (0x8100, 0x88A8)
IPPROTO_UDP: Final[int] = 17
UDP_HEADER_LENGTH: Final[int] = 8
AF_INET_VALUES: Final[tuple[int, ...]] = (2,)


class PcapError(ValueError):
    """The capture cannot be read: the message names the record and the problem."""


@dataclass(frozen=True, slots=True)
class UdpDatagram:
    """One captured UDP datagram: when, from where to where, and its payload."""

    index: int  # 1-based record number in the file, as Wireshark and tcpdump count
    timestamp_ns: int
    src: str
    src_port: int
    dst: str
    dst_port: int
    payload: bytes


def read_udp(path: str | pathlib.Path) -> list[UdpDatagram]:
    """Every UDP-over-IPv4 datagram in the classic pcap file at ``path``, in capture order."""
    return list(iter_udp(pathlib.Path(path).read_bytes()))


def iter_udp(data: bytes) -> Iterator[UdpDatagram]:
    if len(data) < FILE_HEADER_LENGTH:
        raise PcapError(f"file is {len(data)} bytes, shorter than the {FILE_HEADER_LENGTH}-byte pcap header")
    for endian in ("<", ">"):
        (magic,) = struct.unpack_from(endian + "I", data, 0)
        if magic in (MAGIC_MICROSECONDS, MAGIC_NANOSECONDS):
            break
    else:
        raise PcapError(f"magic 0x{data[:4].hex()} is not classic pcap (pcapng is not supported)")
    tick_ns = 1 if magic == MAGIC_NANOSECONDS else 1000
    _major, _minor, _zone, _sigfigs, _snaplen, linktype = struct.unpack_from(endian + "HHiIII", data, 4)
    linktype &= 0x0FFFFFFF  # the top bits may carry FCS information
    record = struct.Struct(endian + "IIII")
    offset, index = FILE_HEADER_LENGTH, 0
    while offset < len(data):
        index += 1
        if offset + RECORD_HEADER_LENGTH > len(data):
            raise PcapError(f"record {index}: truncated record header at byte {offset}")
        seconds, fraction, captured, original = record.unpack_from(data, offset)
        offset += RECORD_HEADER_LENGTH
        if captured != original:
            raise PcapError(f"record {index}: captured {captured} of {original} bytes (snap length too small)")
        frame = data[offset : offset + captured]
        if len(frame) != captured:
            raise PcapError(f"record {index}: file ends inside the record")
        offset += captured
        ip = _ip_packet(frame, linktype, endian, index)
        if ip is None:
            continue
        udp = _udp(ip, index)
        if udp is None:
            continue
        src, src_port, dst, dst_port, payload = udp
        yield UdpDatagram(index, seconds * 1_000_000_000 + fraction * tick_ns, src, src_port, dst, dst_port, payload)


def _ip_packet(frame: bytes, linktype: int, endian: str, index: int) -> bytes | None:
    """The IPv4 packet inside one link-layer frame, or None for anything else."""
    if linktype == LINKTYPE_ETHERNET:
        offset = 12
        (ethertype,) = struct.unpack_from("!H", frame, offset)
        while ethertype in ETHERTYPE_VLAN:
            offset += 4
            (ethertype,) = struct.unpack_from("!H", frame, offset)
        return frame[offset + 2 :] if ethertype == ETHERTYPE_IPV4 else None
    if linktype == LINKTYPE_LINUX_SLL:
        (protocol,) = struct.unpack_from("!H", frame, 14)
        return frame[16:] if protocol == ETHERTYPE_IPV4 else None
    if linktype == LINKTYPE_LINUX_SLL2:
        (protocol,) = struct.unpack_from("!H", frame, 0)
        return frame[20:] if protocol == ETHERTYPE_IPV4 else None
    if linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        order = "!" if linktype == LINKTYPE_LOOP else endian
        (family,) = struct.unpack_from(order + "I", frame, 0)
        return frame[4:] if family in AF_INET_VALUES else None
    if linktype in (LINKTYPE_RAW, LINKTYPE_IPV4):
        return frame if frame and frame[0] >> 4 == 4 else None
    raise PcapError(f"record {index}: link type {linktype} is not supported")


def _udp(ip: bytes, index: int) -> tuple[str, int, str, int, bytes] | None:
    """(src, src_port, dst, dst_port, payload) of a UDP-over-IPv4 packet, or None if not UDP."""
    if len(ip) < 20 or ip[0] >> 4 != 4:
        return None
    header_length = (ip[0] & 0x0F) * 4
    (total_length, flags_fragment, protocol) = struct.unpack_from("!H2xHxB", ip, 2)
    if protocol != IPPROTO_UDP:
        return None
    if flags_fragment & 0x3FFF:
        raise PcapError(f"record {index}: IPv4 fragment (reassembly is not supported)")
    if total_length > len(ip):
        raise PcapError(f"record {index}: IPv4 total length {total_length} exceeds the {len(ip)} captured bytes")
    src, dst = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
    udp = ip[header_length:total_length]  # drop any link-layer trailer (Ethernet minimum-size padding)
    src_port, dst_port, udp_length = struct.unpack_from("!HHH", udp, 0)
    if udp_length != len(udp):
        raise PcapError(f"record {index}: UDP length {udp_length} but the IPv4 packet holds {len(udp)} bytes")
    return src, src_port, dst, dst_port, udp[UDP_HEADER_LENGTH:]
