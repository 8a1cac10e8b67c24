"""A real multi-host network on this machine: one network namespace per host, joined by a bridge.

:class:`NetnsNetwork` makes ``<tag>-sw`` (the switch: a bridge with multicast snooping off, so every
group floods to every port) and ``<tag>-0`` .. ``<tag>-<n-1>`` (the hosts), each with ``eth0`` on a
veth pair into the bridge, address ``10.13.0.<i+1>/24``, ``lo`` up and a route for 224.0.0.0/4 out
of ``eth0``. :meth:`NetnsNetwork.add_loss` drops a random fraction of the UDP datagrams one host
receives (``iptables -m statistic --mode random``, commented ``h13mcast``; this kernel has no netem).
:meth:`NetnsNetwork.close` deletes every namespace, which takes the veth pairs and iptables rules
with it; it runs even when making the network failed half-way, and again at exit.

:class:`NetnsDriverProcess` is a media driver run in one host's namespace (``ip netns exec``, which
execs, so the pid is the driver's). Clients need no namespace: they meet the driver in /dev/shm.

Making namespaces needs root and ``ip``; loss needs ``iptables`` (``.ci/install-tools`` installs it).
When something is missing the fixture fails with what and why, rather than skipping.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pytest

from logbuf.errors import LogbufError
from logbuf.testing.driver_process import DriverProcess, DriverSet

SUBNET = "10.13.0"
TAG_PREFIX = "h13"
COMMAND_TIMEOUT_S = 30


requires_netns = pytest.mark.skipif(
    os.environ.get("CI") != "true" and os.geteuid() != 0, reason="network namespaces need root (run in CI)"
)
"""The mark of a test module that makes namespaces: skipped only off CI for a user who is not root."""


class NetnsError(LogbufError, AssertionError):
    """The network could not be made: the message names the command and what it printed."""


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetnsError(f"cannot run {' '.join(args)}: {e}") from None
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


@dataclass
class NetnsNetwork:
    hosts: int
    tag: str = field(default_factory=lambda: f"{TAG_PREFIX}mc{uuid.uuid4().hex[:6]}")
    namespaces: list[str] = field(default_factory=list)
    """Every namespace made so far (the switch first), deleted by :meth:`close`."""

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def host(self, index: int) -> str:
        return f"{self.tag}-{index}"

    def address(self, index: int) -> str:
        return f"{SUBNET}.{index + 1}"

    def _add_namespace(self, name: str) -> None:
        run("ip", "netns", "add", name)
        self.namespaces.append(name)
        run("ip", "-n", name, "link", "set", "lo", "up")

    def create(self) -> NetnsNetwork:
        if shutil.which("ip") is None:
            raise NetnsError("the multi-host tests need iproute2's ip command, and it is not installed")
        atexit.register(self.close)
        try:
            self._add_namespace(self.switch)
            run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
            run("ip", "-n", self.switch, "link", "set", "br0", "up")
            for i in range(self.hosts):
                ns = self.host(i)
                self._add_namespace(ns)
                run(
                    "ip",
                    "link",
                    "add",
                    "eth0",
                    "netns",
                    ns,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    f"p{i}",
                    "netns",
                    self.switch,
                )
                run("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0", "up")
                run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                run("ip", "-n", ns, "link", "set", "eth0", "multicast", "on", "up")
                run("ip", "-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0")
        except NetnsError:
            self.close()
            raise
        return self

    def add_loss(self, index: int, probability: float) -> None:
        """Drop ``probability`` of the UDP datagrams host ``index`` receives."""
        if shutil.which("iptables") is None:
            raise NetnsError("loss on a link needs iptables (bash .ci/install-tools installs it)")
        run(
            *("ip", "netns", "exec", self.host(index), "iptables", "-A", "INPUT", "-p", "udp"),
            *("-m", "statistic", "--mode", "random", "--probability", str(probability)),
            *("-m", "comment", "--comment", "h13mcast", "-j", "DROP"),
        )

    def clear_loss(self, index: int) -> None:
        run("ip", "netns", "exec", self.host(index), "iptables", "-F", "INPUT")

    def dropped(self, index: int) -> int:
        """Datagrams the loss rule of host ``index`` dropped so far."""
        out = run("ip", "netns", "exec", self.host(index), "iptables", "-L", "INPUT", "-v", "-n", "-x").stdout
        return sum(int(line.split()[0]) for line in out.splitlines() if "h13mcast" in line)

    def steer_port(self, index: int, cpus: set[int]) -> None:
        """Process what host ``index`` sends into the switch on ``cpus`` (RPS on its switch port).

        Without it the bridge forwards (and for multicast, copies to every port) in the sending thread's
        system call, charged to the sender: on a real network a switch does that work, off the host.
        """
        mask = format(sum(1 << c for c in cpus), "x")
        run(
            "ip",
            "netns",
            "exec",
            self.switch,
            "sh",
            "-c",
            f"echo {mask} > /sys/class/net/p{index}/queues/rx-0/rps_cpus",
        )

    def close(self) -> None:
        for name in reversed(self.namespaces):
            run("ip", "netns", "del", name, check=False)
        self.namespaces.clear()


@dataclass(eq=False)
class NetnsDriverProcess(DriverProcess):
    """A media driver in one namespace."""

    namespace: str = ""

    @property
    def command(self) -> list[str]:
        return [
            "ip",
            "netns",
            "exec",
            self.namespace,
            sys.executable,
            "-m",
            "logbuf.driver.main",
            "--dir",
            self.dir,
            *self.args,
        ]


def make_network(hosts: int) -> NetnsNetwork:
    """A network of ``hosts`` hosts, or a test failure naming why it cannot be made."""
    try:
        return NetnsNetwork(hosts).create()
    except NetnsError as e:
        pytest.fail(f"cannot make the network namespaces this test needs (root and iproute2 required): {e}")


def network_fixture(hosts: int) -> Callable[[], Iterator[NetnsNetwork]]:
    """A module-scoped fixture yielding a network of ``hosts`` hosts, closed after the module's last test:
    ``net = network_fixture(2)`` in a test module."""

    @pytest.fixture(scope="module")
    def net() -> Iterator[NetnsNetwork]:
        network = make_network(hosts)
        try:
            yield network
        finally:
            network.close()

    return net


def start_drivers(
    drivers: DriverSet, net: NetnsNetwork, args: Sequence[str], hosts: Sequence[int] | None = None
) -> list[DriverProcess]:
    """A driver with ``args`` in each of ``hosts`` (every host by default), looked after by ``drivers``."""
    return [
        drivers.start(NetnsDriverProcess(args=list(args), namespace=net.host(i)))
        for i in (range(net.hosts) if hosts is None else hosts)
    ]


def drivers_fixture(args: Sequence[str]) -> Callable[..., Iterator[list[DriverProcess]]]:
    """A module-scoped fixture yielding a driver with ``args`` on every host of the module's ``net`` fixture,
    in host order: ``hosts = drivers_fixture(DRIVER_ARGS)`` in a test module."""

    @pytest.fixture(scope="module")
    def hosts(net: NetnsNetwork, request: pytest.FixtureRequest) -> Iterator[list[DriverProcess]]:
        with DriverSet(request) as drivers:
            yield start_drivers(drivers, net, args)

    return hosts
