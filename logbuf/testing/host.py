"""This machine, as tests and benchmarks see it: free ports on loopback and a process's memory."""

from __future__ import annotations

import contextlib
import random
import socket

__all__ = ["free_tcp_port", "free_udp_port", "free_udp_ports", "rss_bytes"]


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 that was free a moment ago (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_udp_ports(count: int) -> list[int]:
    """``count`` distinct UDP ports on 127.0.0.1 free now, below the kernel's ephemeral range (so that
    the sockets other tests bind to port 0 meanwhile cannot take them), from a random start."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    port = random.randrange(10_000, ephemeral_low - 2 * count)
    ports: list[int] = []
    while len(ports) < count:
        assert port < ephemeral_low, f"only {len(ports)} free ports below {ephemeral_low}"
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", port))
            ports.append(port)
        port += 1
    return ports


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory now (``field="VmHWM"``: its peak so far), from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")
