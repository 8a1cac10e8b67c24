"""Client addresses behind reverse proxies: ``X-Forwarded-For`` / ``X-Real-IP`` from trusted proxies only.

Theory of operation
-------------------
The relay keys its per-address limits (connections, events per second) and its per-address metrics on
the client's IP. Behind nginx, Caddy or a load balancer every connection comes from the proxy, so
the relay must read the address the proxy forwards, but only from a proxy it trusts: anyone else could
write any address into a header and escape every limit. :class:`TrustedProxies` holds the operator's
list (addresses or networks, ``--trusted-proxy``) and :meth:`TrustedProxies.client_ip` decides:

* the connection's peer is not trusted: the peer is the client, headers are ignored;
* ``X-Forwarded-For`` (all of its lines, comma-separated hops): walked from the right (the hop the
  nearest proxy added) past every trusted address; the first untrusted one is the client. If every
  hop is trusted, the leftmost is. A hop that is not an IP address (``unknown``, garbage) stops the
  walk: the client is then the trusted hop just to its right (counted in ``forwarded_invalid``);
* else ``X-Real-IP`` (nginx's ``proxy_set_header X-Real-IP $remote_addr``), if it is an IP address;
* else the peer (the proxy itself).

Addresses are normalised (``::ffff:10.0.0.1`` is ``10.0.0.1``; ``[2001:db8::1]:443`` and
``10.0.0.1:5000`` lose their port), so one client has one label.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Final

__all__ = ["TrustedProxies", "normalize_ip"]

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

FORWARDED_FOR: Final = "X-Forwarded-For"
REAL_IP: Final = "X-Real-IP"
#: Hops read from X-Forwarded-For at most (a longer chain is someone's attempt to cost us work).
MAX_FORWARDED_HOPS: Final = 32


def _parse_ip(text: str) -> IpAddress | None:
    text = text.strip()
    if text.startswith("["):  # [v6] or [v6]:port
        end = text.find("]")
        text = text[1:end] if end > 0 else text
    elif text.count(":") == 1:  # v4:port
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def normalize_ip(text: str) -> str:
    """``text`` as one canonical address string (itself if it is not an IP address)."""
    ip = _parse_ip(text)
    return text if ip is None else str(ip)


class TrustedProxies:
    """The proxies whose forwarding headers are believed; see the module docstring."""

    def __init__(self, specs: Iterable[str] = ()) -> None:
        networks: list[IpNetwork] = []
        for spec in specs:
            try:
                networks.append(ipaddress.ip_network(spec.strip(), strict=False))
            except ValueError:
                raise ValueError(
                    f"trusted proxy {spec!r} is not an IP address or network (e.g. 10.0.0.1, 10.0.0.0/8, ::1)"
                ) from None
        self.networks = tuple(networks)
        self.forwarded_invalid = 0
        """Forwarded hops from a trusted proxy that were not IP addresses."""

    def __bool__(self) -> bool:
        return bool(self.networks)

    def _trusts(self, ip: IpAddress) -> bool:
        return any(ip.version == net.version and ip in net for net in self.networks)

    def trusts(self, ip: str) -> bool:
        parsed = _parse_ip(ip)
        return parsed is not None and self._trusts(parsed)

    def client_ip(self, peer: str, headers: Iterable[tuple[str, str]]) -> str:
        """The client's address for a connection from ``peer`` carrying ``headers``."""
        peer_ip = _parse_ip(peer)
        if peer_ip is None or not self._trusts(peer_ip):
            return peer if peer_ip is None else str(peer_ip)
        forwarded: list[str] = []
        real_ip: str | None = None
        for name, value in headers:
            lowered = name.lower()
            if lowered == "x-forwarded-for":
                forwarded.extend(value.split(","))
            elif lowered == "x-real-ip" and real_ip is None:
                real_ip = value
        if forwarded:
            nearest = peer_ip
            for hop in reversed(forwarded[-MAX_FORWARDED_HOPS:]):
                ip = _parse_ip(hop)
                if ip is None:
                    self.forwarded_invalid += 1
                    return str(nearest)
                if not self._trusts(ip):
                    return str(ip)
                nearest = ip
            return str(nearest)
        if real_ip is not None:
            ip = _parse_ip(real_ip)
            if ip is not None:
                return str(ip)
            self.forwarded_invalid += 1
        return str(peer_ip)
