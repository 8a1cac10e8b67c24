"""A FASTPUSS client written from its README's grammar alone (plain UDP sockets, no logbuf code), run on one
namespace host by test_fastpuss_gateway: ``python -m tests.udp._fastpuss_client GW0_HOST:PORT GW1_HOST:PORT N``.

Client ``x`` subscribes at gateway 1, ``y`` at gateway 0; ``p`` publishes ``N`` PUBs of topic ``room``
alternately to gateway 0 and 1 (body ``<gateway>:<i>``), after a warm-up in which both subscribers have heard
a ``warm`` PUB taken by each gateway (so the gateways' streams are up). Prints one JSON line: the ``room`` bodies
each subscriber received, in arrival order, and the datagrams that were not ``MSG <topic> <body>``."""

from __future__ import annotations

import json
import re
import socket
import sys
import time

MESSAGE = re.compile(rb"(PUB|SUB|MSG)\s*(\S+)\s(.*)", re.S)  # message = verb, S, topic, S, body


def main() -> None:
    gateways = [(h, int(p)) for h, _, p in (a.rpartition(":") for a in sys.argv[1:3])]
    count = int(sys.argv[3])
    x, y, p = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3))
    for s in (x, y, p):
        s.bind(("0.0.0.0", 0))
        s.setblocking(False)
    homes = {"x": (x, gateways[1]), "y": (y, gateways[0])}
    got: dict[str, list[str]] = {"x": [], "y": []}
    warm: dict[str, set[str]] = {"x": set(), "y": set()}
    malformed: list[str] = []

    def drain() -> None:
        for name, (s, _) in homes.items():
            while True:
                try:
                    datagram = s.recv(70_000)
                except BlockingIOError:
                    break
                m = MESSAGE.fullmatch(datagram)
                if m is None or m.group(1) != b"MSG":
                    malformed.append(datagram.decode(errors="replace"))
                elif m.group(2) == b"room":
                    got[name].append(m.group(3).decode())
                elif m.group(2) == b"warm":
                    warm[name].add(m.group(3).decode().split(":")[0])

    deadline = time.monotonic() + 30
    n = 0
    while not all(len(w) == 2 for w in warm.values()):
        if time.monotonic() > deadline:
            print(json.dumps({"error": f"warm-up did not complete: {warm}"}))
            return
        for s, gateway in homes.values():
            s.sendto(b"SUB warm\n", gateway)
            s.sendto(b"SUB room\n", gateway)
        for k, gateway in enumerate(gateways):
            p.sendto(f"PUB warm\n{k}:{n}".encode(), gateway)
        n += 1
        time.sleep(0.05)  # pace: resend the warm-up every 50 ms until both gateways answer
        drain()
    for i in range(count):
        k = i % 2
        p.sendto(f"PUB room\n{k}:{i}".encode(), gateways[k])
        if i % 20 == 19:
            time.sleep(0.002)  # leave the gateways' socket buffers room
            drain()
    deadline = time.monotonic() + 20
    while min(len(v) for v in got.values()) < count and time.monotonic() < deadline:
        time.sleep(0.005)  # a wait, written out: this client uses no logbuf code (so not the kit's wait_until)
        drain()
    time.sleep(0.3)  # a repeat would arrive now
    drain()
    print(json.dumps({"got": got, "malformed": malformed}))


if __name__ == "__main__":
    main()
