"""Test kit for the archive service: a sequenced publisher thread, a checker of what a subscriber got, and
``logbuf-archive serve`` as a child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from logbuf.client import Publication
from logbuf.logbuffer.publication import OfferResult
from logbuf.testing import wait_until
from logbuf.testing.driver_process import read_output

SEQ_BYTES = 8


NETNS_DRIVER_ARGS = [
    *("--dir-delete-on-shutdown", "false", "--driver-timeout", "5s", "--client-liveness-timeout", "5s"),
    *("--image-liveness-timeout", "2s", "--publication-connection-timeout", "2s", "--term-length", "1m"),
    *("--publication-linger-timeout", "1s"),
]
"""Drivers on namespace hosts for archive tests: short timeouts, so a cut link or a kill shows in seconds."""


def sequenced(seq: int, length: int) -> bytes:
    """A payload of ``length`` bytes that starts with its sequence number (the rest derived from it)."""
    head = seq.to_bytes(SEQ_BYTES, "little")
    return head + bytes((seq + i) & 0xFF for i in range(length - SEQ_BYTES))


@dataclass
class SequencedPublisher:
    """Publishes sequence-numbered messages on a thread until :meth:`stop` (``rate`` per second, 0: flat out)."""

    publication: Publication
    length: int = 64
    rate: int = 0
    sent: int = 0
    positions: list[int] = field(default_factory=list)
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> SequencedPublisher:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        payloads = [sequenced(i, self.length) for i in range(256)]
        try:
            while not self._stop.is_set():
                if self.rate and self.sent >= (time.monotonic() - started) * self.rate:
                    time.sleep(0.0005)  # pace: the publisher's rate
                    continue
                payload = payloads[self.sent & 0xFF]
                message = self.sent.to_bytes(SEQ_BYTES, "little") + payload[SEQ_BYTES:]
                while (result := self.publication.offer(message)) < 0:
                    if result not in (OfferResult.BACK_PRESSURED, OfferResult.ADMIN_ACTION, OfferResult.NOT_CONNECTED):
                        self.error = OfferResult(result).name
                        return
                    if self._stop.is_set():
                        return
                    time.sleep(0.0001)  # pace: back off on back pressure, retrying the same message
                self.positions.append(result)
                self.sent += 1
        except Exception as e:  # reported by the test
            self.error = repr(e)

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        assert self.error is None, f"publisher failed: {self.error}"
        return self.sent


@dataclass
class Received:
    """What a subscriber got: sequence numbers and end positions, checked for once-each, in order."""

    first: int | None = None
    seqs: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    bad_payloads: int = 0
    length: int = 64

    def handler(self, payload: memoryview, header: Any) -> None:
        seq = int.from_bytes(payload[:SEQ_BYTES], "little")
        if bytes(payload[SEQ_BYTES:]) != sequenced(seq, self.length)[SEQ_BYTES:]:
            self.bad_payloads += 1
        self.seqs.append(seq)
        self.positions.append(header.position)

    def check_once_in_order(self, first: int, last: int) -> None:
        """Every sequence number first..last exactly once, in order, and nothing else."""
        assert self.bad_payloads == 0, f"{self.bad_payloads} payloads differ from what was published"
        assert self.seqs, "nothing received"
        assert self.seqs[0] == first, f"first message {self.seqs[0]}, expected {first}"
        expected = list(range(first, last + 1))
        if self.seqs != expected:
            for i, (got, want) in enumerate(zip(self.seqs, expected, strict=False)):
                if got != want:
                    raise AssertionError(f"message {i}: got seq {got}, expected {want} (a gap or a duplicate)")
            raise AssertionError(f"got {len(self.seqs)} messages, expected {len(expected)}")


@dataclass
class ServeProcess:
    """``logbuf-archive -d DIR serve ...`` as a child process (output to a file shown on failure)."""

    archive_dir: str
    driver_dir: str
    extra: list[str] = field(default_factory=list)
    namespace: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.archive_dir, "serve.log")

    def start(self) -> ServeProcess:
        os.makedirs(self.archive_dir, exist_ok=True)
        prefix = ["ip", "netns", "exec", self.namespace] if self.namespace else []
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    *prefix,
                    sys.executable,
                    "-m",
                    "logbuf.archive.main",
                    "-d",
                    self.archive_dir,
                    "--log-level",
                    "info",
                    "serve",
                    "--driver-dir",
                    self.driver_dir,
                    *self.extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(
            lambda: "archive.started" in self.output() or self.proc is None or self.proc.poll() is not None,
            30,
            "the archive service to start",
        )
        assert self.proc.poll() is None, f"the archive service exited:\n{self.output()}"
        return self

    def output(self) -> str:
        return read_output(self.log_path)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def recorded_stream(archive_dir: str, start: int, end: int) -> bytes:
    """Positions ``start..end`` of a stream as recorded, from whichever of the archive's recordings holds each."""
    from pathlib import Path

    from logbuf.archive.catalog import Catalog
    from logbuf.archive.segments import segment_base_position, segment_file_name

    with Catalog.open(archive_dir) as catalog:
        recordings = catalog.recordings()
    out = bytearray()
    position = start
    while position < end:
        d = next(r for r in recordings if r.start_position <= position < r.stop_position)
        base = segment_base_position(d.start_position, position, d.term_length, d.segment_length)
        stop = min(end, d.stop_position, base + d.segment_length)
        with open(Path(archive_dir) / segment_file_name(d.recording_id, base), "rb") as f:
            f.seek(position - base)
            out += f.read(stop - position)
        position = stop
    return bytes(out)


def recorded_seqs(data: bytes, length: int) -> list[int]:
    """Sequence numbers of the DATA frames in recorded bytes (payloads checked; PAD frames skipped)."""
    from logbuf.logbuffer import data_header_descriptor as dh

    seqs, offset = [], 0
    while offset < len(data):
        frame_length = int.from_bytes(data[offset : offset + 4], "little", signed=True)
        assert frame_length > 0, f"no frame at offset {offset}"
        if data[offset + dh.TYPE_FIELD_OFFSET] == dh.HDR_TYPE_DATA:
            payload = data[offset + dh.HEADER_LENGTH : offset + frame_length]
            seq = int.from_bytes(payload[:SEQ_BYTES], "little")
            assert payload[SEQ_BYTES:] == sequenced(seq, length)[SEQ_BYTES:], f"payload of message {seq} differs"
            seqs.append(seq)
        offset += (frame_length + 31) & ~31
    return seqs
