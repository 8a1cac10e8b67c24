"""The driver's fuzz and soak test: a legitimate UDP stream between two real drivers carries on, intact,
while everything an outsider can reach is fed random and mutated input.

For about 30 s (seeded; the number of rounds depends on the machine's speed, the choices do not):

- mutations of real SETUP, DATA, PAD, heartbeat, SM, NAK and RTTM frames of the live session (and of
  other sessions): bit flips, field extremes, truncations, lying lengths, junk tails, two frames glued
  together, and plain random bytes, at the receiver's data port and the sender's control port;
- random records in both drivers' command rings (``fuzz_command_ring`` of the local hardening tests:
  framed garbage, lying lengths, dead claims, scribbles past the tail);
- randomly damaged archives (segment and catalog bytes flipped, overwritten, truncated) given to
  ``logbuf-archive verify``, which must answer with an exit code, never a crash.

Then: every message of the stream arrived once and in order, both drivers are up and heartbeating,
neither driver's RSS grew by more than 64 MiB, and neither error log holds an exception from the
network path (the command-ring fuzz leaves its own, expected, errors).
"""

from __future__ import annotations

import json
import pathlib
import random
import select
import shutil
import socket
import struct
import subprocess
import sys
import time

import pytest

from logbuf.archive.catalog import Catalog
from logbuf.conduit.cnc import is_driver_active
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.protocol import (
    DataFrame,
    HeartbeatFrame,
    NakFrame,
    PadFrame,
    RttMeasurementFrame,
    SetupFrame,
    StatusMessageFrame,
)
from logbuf.testing.driver_process import DriverProcess, DriverSet
from logbuf.testing.host import free_udp_port, rss_bytes
from tests.archive.test_catalog import add, write_recording
from tests.driver.test_local_hardening import Cnc, fuzz_command_ring
from tests.driver.test_udp import BASE_ARGS

SEED = 1414
FUZZ_SECONDS = 30.0
STREAM_ID = 77
RSS_BOUND = 64 * 1024 * 1024
NETWORK_MODULES = ("udp.py", "receiver.py", "sender.py", "network_publication.py", "publication_image.py", "_udp")
"""An exception raised from any of these is a bad frame that reached the duty cycle."""

PUBLISHER = """
import json, os, struct, sys, time
from logbuf.client import Aeron, Context
from logbuf.testing import wait_until
directory, channel, stream_id, stop_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with Aeron.connect(Context(dir=directory, driver_timeout_ns=20_000_000_000)) as aeron:
    pub = aeron.add_publication(channel, stream_id)
    wait_until(lambda: pub.is_connected, 60, "the publication connected")
    body, seq, deadline = bytearray(200), 0, time.monotonic() + 150
    while seq == 0 or not os.path.exists(stop_path):
        struct.pack_into("<q", body, 0, seq)
        body[8:16] = struct.pack("<q", seq * 7919)
        if pub.offer(body) > 0:
            seq += 1
            if seq % 32 == 0:
                time.sleep(0.001)  # pace: a steady stream that outlasts the fuzzing
        else:
            time.sleep(0.0002)  # pace: back off on back pressure
        assert time.monotonic() < deadline, f"publisher stuck at {seq}"
    struct.pack_into("<q", body, 0, -1)
    wait_until(lambda: pub.offer(body) > 0, max(1.0, deadline - time.monotonic()), "the end marker taken")
    print(json.dumps({"published": seq}), flush=True)
"""

SUBSCRIBER = """
import json, struct, sys, time
from logbuf.client import Aeron, Context
from logbuf.testing import wait_until
directory, channel, stream_id, session_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
state = {"next": 0, "errors": 0, "done": False, "session": None}
def on_message(buffer, header):
    if header.session_id != state["session"]:
        return  # a fuzzed SETUP's image: nothing of the stream
    seq, check = struct.unpack_from("<qq", buffer, 0)
    if seq == -1:
        state["done"] = True
    elif seq != state["next"] or check != seq * 7919 or len(buffer) != 200:
        state["errors"] += 1
        state["next"] = seq + 1
    else:
        state["next"] += 1
with Aeron.connect(Context(dir=directory, driver_timeout_ns=20_000_000_000)) as aeron:
    sub = aeron.add_subscription(channel, stream_id)
    print("ready", flush=True)
    deadline = time.monotonic() + 180
    wait_until(lambda: sub.images, 180, "the stream's image")
    image = sub.images[0]
    state["session"] = image.session_id
    print(json.dumps({"session_id": image.session_id, "initial_term_id": image.initial_term_id,
                      "term_length": image.term_length, "source": image.source_identity}), flush=True)
    while not state["done"]:
        if not sub.poll(on_message, 256):
            time.sleep(0.0002)  # pace: idle between empty polls until the end marker
        assert time.monotonic() < deadline, f"subscriber stuck at {state['next']}"
    print(json.dumps({"received": state["next"], "errors": state["errors"]}), flush=True)
"""


def read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no output from child {proc.args!r} within {timeout_s} s"
    return proc.stdout.readline().strip()


# -- frames and mutations ------------------------------------------------------------------------------------
class FrameFuzzer:
    """Real frames of the live stream (or of another session), mutated."""

    EXTREMES = (0, -1, 1, 0x7FFFFFFF, -0x80000000, 1000, 0xFFFF, 32, -32)

    def __init__(self, rng: random.Random, stream: dict[str, int | str]) -> None:
        self.rng = rng
        self.session_id = int(stream["session_id"])
        self.initial_term_id = int(stream["initial_term_id"])
        self.term_length = int(stream["term_length"])

    def real_frame(self) -> bytes:
        r = self.rng
        session = self.session_id if r.random() < 0.7 else r.getrandbits(31)
        stream = STREAM_ID if r.random() < 0.9 else r.getrandbits(31)
        term_id = self.initial_term_id + r.choice((0, 0, 1, 2, 3, r.randint(-5, 100)))
        offset = r.randrange(0, self.term_length // 32) * 32
        kind = r.randrange(7)
        if kind == 0:
            return SetupFrame(offset, session, stream, self.initial_term_id, term_id, self.term_length, 1408).encode()
        if kind == 1:
            return DataFrame(offset, session, stream, term_id, r.randbytes(r.randint(0, 300))).encode()
        if kind == 2:
            return PadFrame(offset, session, stream, term_id, r.choice((0, 32, 64, 1024))).encode()
        if kind == 3:
            flags = dh.BEGIN_END_AND_EOS_FLAGS if r.random() < 0.5 else dh.UNFRAGMENTED
            return HeartbeatFrame(offset, session, stream, term_id, flags=flags).encode()
        if kind == 4:
            window = r.choice((0, 65536, 1 << 20, 0x7FFFFFFF))
            flags = r.choice((0, 0, 0x80, 0x40))
            return StatusMessageFrame(session, stream, term_id, offset, window, r.getrandbits(63), None, flags).encode()
        if kind == 5:
            return NakFrame(session, stream, term_id, offset, r.choice((1, 1408, 65536, 0x7FFFFFFF))).encode()
        return RttMeasurementFrame(session, stream, r.getrandbits(62), 0, r.getrandbits(62), 0x80).encode()

    def datagram(self) -> bytes:
        r = self.rng
        frame = bytearray(self.real_frame())
        kind = r.random()
        if kind < 0.2:
            return bytes(frame)  # as it is: for another session, or a duplicate, or ahead
        if kind < 0.4:
            for _ in range(r.randint(1, 8)):
                bit = r.randrange(len(frame) * 8)
                frame[bit // 8] ^= 1 << (bit % 8)
        elif kind < 0.6:
            at = r.randrange(0, len(frame) - 3, 4) if len(frame) >= 4 else 0
            struct.pack_into("<i", frame, at, r.choice(self.EXTREMES) if r.random() < 0.8 else r.getrandbits(31))
        elif kind < 0.7:
            del frame[r.randrange(len(frame)) :]
        elif kind < 0.8:
            struct.pack_into("<i", frame, 0, r.choice((0, 8, 31, len(frame) + 32, 65536, -1, 0x7FFFFFFF)))
        elif kind < 0.9:
            frame += r.randbytes(r.randint(1, 100))
        elif kind < 0.95:
            frame += self.real_frame()
        else:
            return r.randbytes(r.randint(0, 200))
        return bytes(frame)


# -- archives --------------------------------------------------------------------------------------------------
def pristine_archive(directory: pathlib.Path) -> int:
    """A recording of 600 messages; returns its length in bytes (what verify walks)."""
    directory.mkdir()
    ends = write_recording(directory, 0, 600)
    with Catalog.open_writable(directory) as writer:
        add(writer)
        writer.stop_recording(0, ends[-1])
    return ends[-1]


def damage(rng: random.Random, source: pathlib.Path, target: pathlib.Path, recorded: int) -> None:
    """Flip, overwrite or truncate bytes: mostly where verify looks (the recorded frames and the
    catalog's first entry), sometimes anywhere."""
    shutil.copytree(source, target)
    files = sorted(target.iterdir())
    for _ in range(rng.randint(1, 6)):
        victim = rng.choice(files)
        data = bytearray(victim.read_bytes())
        hot = recorded if victim.suffix == ".rec" else 2048
        kind = rng.random()
        if kind < 0.1 and data:
            del data[rng.randrange(min(len(data), hot)) :]  # truncated
        elif data:
            at = rng.randrange(min(len(data), hot) if rng.random() < 0.8 else len(data))
            if kind < 0.5:
                data[at] ^= 1 << rng.randrange(8)
            elif kind < 0.8:
                value = rng.choice((0, -1, 0x7FFFFFFF, -0x80000000, 3, rng.getrandbits(31)))
                data[at : at + 4] = struct.pack("<i", value)[: len(data) - at]
            else:
                span = rng.randbytes(rng.randint(1, 256))
                data[at : at + len(span)] = span
        victim.write_bytes(bytes(data))


def verify_damaged_archive(
    rng: random.Random, pristine: pathlib.Path, recorded: int, work: pathlib.Path, round_: int
) -> int:
    target = work / f"damaged-{round_}"
    damage(rng, pristine, target, recorded)
    done = subprocess.run(
        [sys.executable, "-m", "logbuf.archive.main", "-d", str(target), "--log-level", "error", "verify", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1, 2), (
        f"logbuf-archive verify on a damaged archive (round {round_}, seed {SEED}) exited with {done.returncode}:"
        f" {done.stderr[-3000:]}"
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    shutil.rmtree(target)
    return done.returncode


# -- the test ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_stream_survives_fuzzed_frames_command_rings_and_archives(
    driver_factory: DriverSet, tmp_path: pathlib.Path
) -> None:
    rng = random.Random(SEED)
    args = ["--command-unblock-timeout", "500ms", "--max-images-per-endpoint", "32", "--max-image-term-length", "4m"]
    a: DriverProcess = driver_factory(*args, base=BASE_ARGS)
    b: DriverProcess = driver_factory(*args, base=BASE_ARGS)
    for driver in (a, b):
        driver.check_errors = False  # the command-ring fuzz leaves errors on purpose; the network's are checked below
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    stop_path = str(tmp_path / "stop")
    pristine = tmp_path / "pristine"
    recorded = pristine_archive(pristine)
    children: list[subprocess.Popen[str]] = []

    def child(script: str, *argv: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", script, *argv], stdout=subprocess.PIPE, text=True)
        children.append(proc)
        return proc

    cnc_a, cnc_b = Cnc(a.dir), Cnc(b.dir)
    try:
        subscriber = child(SUBSCRIBER, b.dir, channel, str(STREAM_ID), "")
        assert read_line(subscriber, 60) == "ready"
        publisher = child(PUBLISHER, a.dir, channel, str(STREAM_ID), stop_path)
        stream = json.loads(read_line(subscriber, 60))
        host, control_port = str(stream["source"]).rsplit(":", 1)
        targets = [("127.0.0.1", port), (host, int(control_port))]
        fuzzer = FrameFuzzer(rng, stream)
        rss_before = {d.dir: rss_bytes(d.pid) for d in (a, b)}
        sent = {"datagrams": 0, "ring_records": 0, "archives": 0}
        exits: list[int] = []
        deadline = time.monotonic() + FUZZ_SECONDS
        next_ring, next_archive = time.monotonic() + 1, time.monotonic() + 2
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            raw.bind(("127.0.0.1", 0))
            raw.setblocking(False)
            while time.monotonic() < deadline:
                for _ in range(100):
                    raw.sendto(fuzzer.datagram(), rng.choice(targets))
                sent["datagrams"] += 100
                try:
                    while True:
                        raw.recv(65536)  # what the drivers answer (SMs eliciting SETUPs, RTT replies)
                except BlockingIOError:
                    pass
                now = time.monotonic()
                if now >= next_ring:
                    done = fuzz_command_ring(rng.choice((cnc_a, cnc_b)), rng, 40)
                    sent["ring_records"] += sum(done.values())
                    next_ring = time.monotonic() + 1
                if now >= next_archive:
                    exits.append(verify_damaged_archive(rng, pristine, recorded, tmp_path, sent["archives"]))
                    sent["archives"] += 1
                    next_archive = time.monotonic() + 2
                time.sleep(0.01)  # pace: the fuzzing rate, 100 datagrams per 10 ms for FUZZ_SECONDS
                for proc in children:
                    assert proc.poll() is None, f"a client died during the fuzzing: {proc.args!r}"
        # the stream: every message once, in order
        with open(stop_path, "w"):
            pass
        published = json.loads(read_line(publisher, 120))["published"]
        received = json.loads(read_line(subscriber, 120))
        assert received == {"received": published, "errors": 0}, (sent, published, received)
        assert published > 0 and sent["archives"] >= 3 and sent["ring_records"] > 0
        for d in (a, b):
            assert d.alive, f"driver {d.dir} died"
            assert is_driver_active(d.dir, timeout_ns=5_000_000_000)
            growth = rss_bytes(d.pid) - rss_before[d.dir]
            assert growth < RSS_BOUND, f"driver {d.dir} grew by {growth / 2**20:.1f} MiB"
            network_errors = [e for e in d.errors() if any(m in e for m in NETWORK_MODULES)]
            assert network_errors == [], network_errors
        assert cnc_b.counter("Invalid packets") > 0 and cnc_a.counter("Invalid packets") > 0
        assert cnc_b.counter("Spoofed frames dropped") > 0 and cnc_a.counter("Spoofed frames dropped") > 0
        print(json.dumps({"sent": sent, "published": published, "verify_exits": sorted(set(exits))}))
    finally:
        cnc_a.close()
        cnc_b.close()
        for proc in children:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=10)
