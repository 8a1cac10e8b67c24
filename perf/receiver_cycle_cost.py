"""The receiver agent's duty cycle with 1 and 1,000 idle UDP endpoints, in one process, no driver.

    python perf/receiver_cycle_cost.py

Each case registers the endpoints (real sockets on 127.0.0.1) with a :class:`Receiver` and times
``do_work()``: idle (nothing arrived) and with one datagram waiting on one endpoint (an 8-byte frame,
counted invalid through the Python dispatch). Minimum and median in microseconds over many cycles: the
minimum is what the code costs, the median what the loaded machine adds. Run it on two checkouts to
compare them (``perf/results/receiver_cycle_cost.json``); there is no peer, this is the driver's own cost.
"""

from __future__ import annotations

import socket
import statistics
import time
from typing import Any

from _common import new_results, quiet, write_results

from logbuf.conduit.counters import CountersManager
from logbuf.driver.receiver import Receiver
from logbuf.driver.system_counters import SystemCounters
from logbuf.driver.udp import ReceiveChannelEndpoint, SocketSettings, UdpTransport


class _NoConductor:
    def create_publication_image(self, *args: Any) -> None:
        pass


def _micros(samples: list[float]) -> dict[str, float]:
    return {"min_us": round(min(samples), 2), "median_us": round(statistics.median(samples), 2)}


def measure(endpoint_count: int, cycles: int, system_counters: SystemCounters) -> dict[str, Any]:
    receiver = Receiver(time.monotonic_ns)
    endpoints = []
    for _ in range(endpoint_count):
        transport = UdpTransport(
            ("127.0.0.1", 0),
            sockets=SocketSettings(1 << 16, 1 << 16, True),
            faults=None,
            system_counters=system_counters,
        )
        endpoint = ReceiveChannelEndpoint(
            "aeron:udp",
            transport,
            system_counters,
            time.monotonic_ns,
            _NoConductor(),  # type: ignore[arg-type]
        )
        receiver.on_register_receive_channel_endpoint(endpoint)
        endpoints.append(endpoint)
    idle, one = [], []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        target = endpoints[-1].transport.local_address
        for _ in range(cycles):
            started = time.perf_counter_ns()
            receiver.do_work()
            idle.append((time.perf_counter_ns() - started) / 1e3)
        for _ in range(cycles):
            sender.sendto(bytes(8), target)
            started = time.perf_counter_ns()
            receiver.do_work()
            one.append((time.perf_counter_ns() - started) / 1e3)
    receiver.on_close()
    return {"endpoints": endpoint_count, "idle": _micros(idle), "one_datagram": _micros(one)}


def main() -> None:
    quiet()
    results = new_results("receiver_cycle_cost")
    counters = CountersManager(memoryview(bytearray(512 * 256)), memoryview(bytearray(128 * 256)))
    system_counters = SystemCounters(counters)
    for endpoint_count, cycles in ((1, 3_000), (1_000, 300)):
        case = measure(endpoint_count, cycles, system_counters)
        print(case, flush=True)
        results["cases"].append(case)
    write_results(results)


if __name__ == "__main__":
    main()
