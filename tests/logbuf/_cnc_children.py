"""Child-process entry points for the CnC-structure tests (``python -m tests.logbuf._cnc_children``).

Each role maps a shared file itself, as a separate client process would, and prints one JSON line.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import subprocess
import sys
import time

from logbuf.conduit.broadcast import CopyBroadcastReceiver
from logbuf.conduit.cnc import CncFile
from logbuf.conduit.error_log import DistinctErrorLog
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer

PRODUCER_MSG = struct.Struct("<ii")
"""producer id, sequence number; followed by (sequence % 23) filler bytes so record lengths vary."""
PRODUCER_MSG_TYPE_ID = 7


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spawn(role: str, **args: object) -> subprocess.Popen[str]:
    """Start ``role`` in a new Python process (run from the parent test)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.logbuf._cnc_children", role, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def result_of(proc: subprocess.Popen[str], timeout_s: float) -> dict[str, object]:
    """The child's last JSON line; fails with its stderr if it failed or hung."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
        raise AssertionError(f"child timed out after {timeout_s} s; stderr:\n{err}") from None
    assert proc.returncode == 0, f"child exited {proc.returncode}; stderr:\n{err}"
    return dict(json.loads(out.strip().splitlines()[-1]))


def _map(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def ring_producer(path: str, producer_id: int, count: int, timeout_s: float) -> dict[str, int]:
    mm = _map(path)
    ring = ManyToOneRingBuffer(memoryview(mm))
    deadline = time.monotonic() + timeout_s
    full = 0
    for seq in range(count):
        payload = PRODUCER_MSG.pack(producer_id, seq) + bytes([producer_id]) * (seq % 23)
        while not ring.write(PRODUCER_MSG_TYPE_ID, payload):
            full += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"producer {producer_id} stuck at seq {seq}")
            time.sleep(0)  # pace: yield to the consumer while the ring is full
    return {"written": count, "full": full}


def broadcast_listener(path: str, count: int, timeout_s: float) -> dict[str, object]:
    mm = _map(path)
    receiver = CopyBroadcastReceiver(memoryview(mm))
    print(json.dumps({"ready": True}), flush=True)
    received: list[list[object]] = []
    deadline = time.monotonic() + timeout_s
    while len(received) < count:
        if receiver.receive(lambda type_id, payload: received.append([type_id, payload.hex()])) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"received {len(received)} of {count}")
            time.sleep(0.0005)  # pace: idle between empty reads
    return {"received": received, "lapped_count": receiver.lapped_count}


def error_writer_then_crash(path: str, repeats: int) -> None:
    mm = _map(path)
    log = DistinctErrorLog(memoryview(mm), clock_ms=lambda: 1_000)
    for _ in range(repeats):
        try:
            raise RuntimeError("disk on fire")
        except RuntimeError as e:
            log.record(e)
    log.record("plain text error")
    os._exit(3)  # no clean-up at all: the log must already be readable


def cnc_client(directory: str) -> dict[str, object]:
    cnc = CncFile.open(directory)
    ring = ManyToOneRingBuffer(cnc.to_driver)
    correlation_id = ring.next_correlation_id()
    assert ring.write(0x01, b"hello driver")
    result = {"pid": cnc.pid, "version": cnc.version, "correlation_id": correlation_id}
    del ring
    cnc.close()
    return result


if __name__ == "__main__":
    role, args = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps(globals()[role](**args)), flush=True)
