"""What one NAK costs the sender agent: the per-NAK path from datagram to decision, on the sans-IO kit.

A multicast publication with one receiver (its SM names it) takes NAKs from a stranger (dropped as from a
non-receiver), forged stepped NAKs from the receiver's address for data already resent (dropped by the
linger), and NAKs for a term a window behind (dropped as stale). Each case times ``on_datagram`` over
``--naks`` NAKs, five times, and reports the median nanoseconds per NAK; no sockets, so the figure is the
sender's own CPU per NAK (a loaded machine still adds noise: compare cases of one run). Run it on two
commits with ``--label before``/``after``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

from _common import new_results, quiet, write_results

from logbuf.driver.udp import SendChannelEndpoint
from logbuf.protocol import NakFrame, StatusMessageFrame
from logbuf.testing.link import LinkNetwork
from logbuf.testing.udp_pair import TERM_LENGTH, Wire, connect

GROUP = ("239.1.2.3", 4000)
SENDER = ("10.0.0.1", 5000)
RECEIVER = ("10.0.0.2", 4000)
STRANGER = ("10.6.6.6", 4000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", default="after")
    parser.add_argument("--naks", type=int, default=20_000)
    args = parser.parse_args()
    quiet()
    results = new_results(f"nak_path_{args.label}", naks=args.naks)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as workdir:
        network, publication, _, _, _, now = connect(workdir)
        endpoint = SendChannelEndpoint("bench", GROUP, LinkNetwork().bind(SENDER), network.system_counters, lambda: now)
        endpoint.publications[(network.session_id, network.stream_id)] = network
        start = network.sender_position.get()
        term_id, offset = network.log.term_of(start)
        for _ in range(64):
            assert publication.offer(b"x" * 100) > 0
        network.send(now, Wire().send)
        sm = StatusMessageFrame(77, 5, term_id, offset, TERM_LENGTH // 2, 9).encode()
        endpoint.on_datagram(memoryview(sm), RECEIVER)
        stepped = [memoryview(NakFrame(77, 5, term_id, offset + o, 1 << 20).encode()) for o in range(0, 64 * 160, 32)]
        endpoint.on_datagram(stepped[0], RECEIVER)  # resent once: the rest linger
        stale = memoryview(NakFrame(77, 5, term_id - 1, 0, 1 << 20).encode())
        cases: dict[str, tuple[list[memoryview], Any]] = {
            "from a non-receiver": (stepped, STRANGER),
            "from the receiver, lingering": (stepped, RECEIVER),
            "from the receiver, a term behind": ([stale], RECEIVER),
        }
        for name, (naks, source) in cases.items():
            times = []
            for _ in range(5):
                on_datagram = endpoint.on_datagram
                n = len(naks)
                began = time.perf_counter_ns()
                for i in range(args.naks):
                    on_datagram(naks[i % n], source)
                times.append((time.perf_counter_ns() - began) / args.naks)
            case = {"case": name, "ns_per_nak_median": round(statistics.median(times)), "ns_per_nak": times}
            print(case["case"], case["ns_per_nak_median"], flush=True)
            results["cases"].append(case)
    write_results(results)


if __name__ == "__main__":
    main()
