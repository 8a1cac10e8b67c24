"""One peer of an interop test, run as its own process with either client library.

    python aeron_peer.py ROLE --client {pyaeron,logbuf} --dir DIR [options]

pyaeron needs Python >= 3.12 and logbuf runs on 3.11, so the two never share an interpreter: the
test starts this script with whichever Python has the library. Standard library only, besides the
client. stdout carries JSON lines only: ``{"event": "ready", ...}`` once set up, then the result
(``{"event": "result", ...}``). A line on stdin (or EOF) tells a waiting peer to go on.

Roles:
- ``driver`` (pyaeron): the real Aeron C media driver in ``--dir``, until stdin says stop. Loss is
  Aeron's own interceptor, set through the ``AERON_UDP_CHANNEL_*`` environment by the caller.
- ``publish``: wait for a subscriber, offer ``--count`` messages of ``--size`` bytes, then wait
  for stdin and close (``--close``): the result holds the close time and whether offers after the
  subscriber left saw NOT_CONNECTED.
- ``watch``: receive from every image until stdin says stop, and report per session (image) the
  first sequence number, the count and any gap or duplicate (see ``run_watch``).
- ``subscribe``: receive ``--count`` messages and check each (sequence, length, content), then
  with ``--await-unavailable S`` wait up to S seconds for the image to go unavailable. Polls take
  ``--fragment-limit`` fragments; pyaeron's fragments are reassembled here (``SessionAssembler``)
  unless ``--library-assembler`` asks for its own.

Message ``seq`` (from 0): ``seq`` int64 LE, ``size`` int32 LE, then bytes ``(seq + i) & 0xFF``.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import threading
import time
from typing import Any

HEADER = struct.Struct("<qi")
PATTERN = bytes(range(256)) * 2


def message(seq: int, size: int) -> bytes:
    body_length = size - HEADER.size
    start = seq & 0xFF
    reps = body_length // 256 + 1
    body = (PATTERN[start : start + 256] * reps)[:body_length]
    return HEADER.pack(seq, size) + body


_EMIT_LOCK = threading.Lock()


def emit(**fields: Any) -> None:
    with _EMIT_LOCK:  # image callbacks emit from the client's own thread
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def stdin_line() -> threading.Event:
    """An event set once a line (or EOF) arrives on stdin."""
    done = threading.Event()

    def read() -> None:
        sys.stdin.readline()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    return done


def wait_stdin(timeout_s: float) -> None:
    stdin_line().wait(timeout_s)


class SessionAssembler:
    """Fragments to messages, per session, kept across polls (Aeron's FragmentAssembler rule: a
    fragment joins the message only at the term offset where the previous one ended)."""

    BEGIN, END = 0x80, 0x40

    def __init__(self, on_message: Any) -> None:
        self.on_message = on_message
        self.partial: dict[int, tuple[bytearray, int]] = {}  # session id -> (bytes, next term offset)

    def on_fragment(self, buffer: Any, header: Any) -> None:
        flags = header.flags
        if flags & self.BEGIN and flags & self.END:
            self.on_message(bytes(buffer), header.session_id)
            return
        next_offset = header.term_offset + ((header.frame_length + 31) & ~31)
        if flags & self.BEGIN:
            self.partial[header.session_id] = (bytearray(buffer), next_offset)
            return
        partial = self.partial.pop(header.session_id, None)
        if partial is None or partial[1] != header.term_offset:
            return  # a fragment of a message whose start we never saw
        message = partial[0]
        message += bytes(buffer)
        if flags & self.END:
            self.on_message(bytes(message), header.session_id)
        else:
            self.partial[header.session_id] = (message, next_offset)


# -- the two client libraries behind one small face -------------------------------------------------
class Client:
    """``report_images`` emits ``available`` / ``unavailable`` events with each image's session id."""

    def __init__(self, kind: str, directory: str, report_images: bool = False) -> None:
        self.kind = kind
        self.report_images = report_images
        self.unavailable_at: float | None = None
        self.available_at: float | None = None
        if kind == "pyaeron":
            import pyaeron

            self.lib = pyaeron
            self.aeron = pyaeron.Aeron(dir=directory)
        else:
            from logbuf.client import Aeron, Context

            self.aeron = Aeron.connect(
                Context(
                    dir=directory,
                    on_available_image=self._available,
                    on_unavailable_image=self._unavailable,
                )
            )

    def _available(self, *args: Any) -> None:  # pyaeron passes (subscription, image), logbuf (image)
        self.available_at = time.time()
        if self.report_images:
            emit(event="available", session_id=args[-1].session_id, at=self.available_at)

    def _unavailable(self, *args: Any) -> None:
        self.unavailable_at = time.time()
        if self.report_images:
            emit(event="unavailable", session_id=args[-1].session_id, at=self.unavailable_at)

    def publication(self, channel: str, stream_id: int) -> Any:
        return self.aeron.add_publication(channel, stream_id)

    def subscription(self, channel: str, stream_id: int) -> Any:
        if self.kind == "pyaeron":
            return self.aeron.add_subscription(
                channel, stream_id, available_image=self._available, unavailable_image=self._unavailable
            )
        return self.aeron.add_subscription(channel, stream_id)

    def offer(self, publication: Any, data: bytes) -> int:
        """1 if taken, 0 if back pressured or admin action, -1 if not connected."""
        result = publication.offer(data)
        if self.kind == "pyaeron":
            if result is True:
                return 1
            return -1 if result == self.lib.NOT_CONNECTED else 0
        return 1 if result > 0 else (-1 if result == -1 else 0)

    def poller(self, subscription: Any, on_message: Any, fragment_limit: int, library_assembler: bool) -> Any:
        if self.kind == "pyaeron":
            if library_assembler:
                return lambda: subscription.poll(
                    lambda buffer, header: on_message(bytes(buffer), header.session_id), fragment_limit
                )
            # pyaeron 0.1.0's poll(assemble=True) forgets a partly assembled message when the poll
            # ends (test_pyaerons_own_assembler_drops_a_message_split_across_polls), so the C client
            # hands us fragments and SessionAssembler rebuilds messages across polls.
            session_assembler = SessionAssembler(on_message)
            return lambda: subscription.poll(session_assembler.on_fragment, fragment_limit, assemble=False)
        from logbuf.client import FragmentAssembler

        assembler = FragmentAssembler(lambda buffer, header: on_message(bytes(buffer), header.session_id))
        return lambda: subscription.poll(assembler, fragment_limit)

    def close(self) -> None:
        self.aeron.close()


def wait_for(condition: Any, timeout_s: float, what: str, idle: Any = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            emit(event="result", ok=False, error=f"timed out after {timeout_s} s waiting for {what}")
            sys.exit(2)
        if idle is None or not idle():
            time.sleep(0.0005)


# -- roles ------------------------------------------------------------------------------------------
def run_driver(args: argparse.Namespace) -> None:
    import pyaeron

    driver = pyaeron.MediaDriver(dir=args.dir, dir_delete_on_start=True)
    emit(event="ready", dir=driver.dir, pid=os.getpid(), aeron_version=pyaeron.aeron_version)
    wait_stdin(args.timeout)
    driver.close()
    emit(event="result", ok=True)


def run_publish(args: argparse.Namespace) -> None:
    client = Client(args.client, args.dir)
    publication = client.publication(args.channel, args.stream_id)
    emit(event="ready", session_id=publication.session_id)
    wait_for(lambda: publication.is_connected, args.timeout, "a subscriber")
    started = time.perf_counter()
    back_pressured = 0
    deadline = time.monotonic() + args.timeout
    stop = stdin_line() if args.until_stdin else None
    disconnected = False
    seq = 0
    while seq < args.count or stop is not None:
        if stop is not None and stop.is_set():
            break
        data = message(seq, args.size)
        while (taken := client.offer(publication, data)) <= 0:
            if taken < 0 and not disconnected and seq > 0:
                disconnected = True  # the receiver went away (or its driver did)
                emit(event="disconnected", seq=seq, at=time.time())
            if (taken < 0 and args.count_not_connected) or (stop is not None and stop.is_set()):
                break
            back_pressured += 1
            if time.monotonic() > deadline:
                emit(event="result", ok=False, error=f"offer of seq {seq} timed out ({taken})")
                sys.exit(2)
        if taken > 0 and disconnected:
            disconnected = False
            emit(event="reconnected", seq=seq, at=time.time())
        if taken <= 0 and not args.count_not_connected:
            break  # told to stop while waiting: seq was not sent
        seq += 1
        if args.pace_ms:
            time.sleep(args.pace_ms / 1000)
    elapsed = time.perf_counter() - started
    emit(event="sent", count=seq, seconds=elapsed, msgs_per_s=seq / elapsed if elapsed else 0.0)
    wait_stdin(args.timeout)  # the subscriber has everything (or left)
    not_connected = taken_after = 0
    if args.count_not_connected:
        wait_for(lambda: not publication.is_connected, args.timeout, "the subscriber to leave")
        for _ in range(1000):
            result = client.offer(publication, message(0, args.size))
            not_connected += result < 0
            taken_after += result > 0
    closed_at = time.time()
    publication.close()
    wait_stdin(args.timeout)  # linger: a receiver drains the end of stream before the client goes
    client.close()
    emit(
        event="result",
        ok=True,
        closed_at=closed_at,
        back_pressured=back_pressured,
        not_connected=not_connected,
        taken_after_receiver_left=taken_after,
    )


def run_subscribe(args: argparse.Namespace) -> None:
    client = Client(args.client, args.dir)
    subscription = client.subscription(args.channel, args.stream_id)
    received: list[int] = []
    errors: list[str] = []

    def on_message(data: bytes, session_id: int) -> None:
        seq, size = HEADER.unpack_from(data, 0) if len(data) >= HEADER.size else (-1, -1)
        expected = len(received)
        if seq != expected and len(errors) < 10:
            errors.append(f"message {expected}: got seq {seq}")
        elif (size != args.size or data != message(seq, args.size)) and len(errors) < 10:
            errors.append(f"message {seq}: {len(data)} bytes, content differs")
        received.append(seq)

    poll = client.poller(subscription, on_message, args.fragment_limit, args.library_assembler)
    emit(event="ready")
    started = None
    wait_for(lambda: subscription.image_count > 0, args.timeout, "an image")
    deadline = time.monotonic() + args.timeout
    while len(received) < args.count and time.monotonic() < deadline:
        if poll() and started is None:
            started = time.perf_counter()
    elapsed = time.perf_counter() - (started or time.perf_counter())
    emit(event="received", count=len(received), msgs_per_s=len(received) / elapsed if elapsed else 0.0)
    extra = 0
    if args.await_unavailable:
        deadline = time.monotonic() + args.await_unavailable
        while client.unavailable_at is None and time.monotonic() < deadline:
            extra += poll()
            time.sleep(0.001)
    client.close()
    emit(
        event="result",
        ok=len(received) == args.count and not errors and extra == 0,
        received=len(received),
        duplicates=len(received) - len(set(received)),
        errors=errors,
        extra=extra,
        unavailable_at=client.unavailable_at,
        msgs_per_s=len(received) / elapsed if elapsed else 0.0,
    )


class SessionLog:
    """What one session (image) delivered: the first sequence number, how many, and any gap,
    duplicate or bad content after the first."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.next = first
        self.count = 0
        self.gaps = 0
        self.duplicates = 0
        self.errors: list[str] = []

    def on_message(self, seq: int, data: bytes, size: int) -> None:
        if seq < self.next:
            self.duplicates += 1
        elif seq > self.next:
            self.gaps += 1
            if len(self.errors) < 10:
                self.errors.append(f"gap: expected seq {self.next}, got {seq}")
        if data != message(seq, size) and len(self.errors) < 10:
            self.errors.append(f"message {seq}: {len(data)} bytes, content differs")
        self.next = max(self.next, seq + 1)
        self.count += 1


def run_watch(args: argparse.Namespace) -> None:
    """Receive from every image, per session, until stdin says stop: an empty line at once, a JSON
    line ``{"session_id": S, "until": N}`` once session S has delivered seq N - 1 (or on timeout).
    Emits ``available`` / ``unavailable`` per image and ``flowing`` once a session has delivered
    ``--count`` messages."""
    client = Client(args.client, args.dir, report_images=True)
    subscription = client.subscription(args.channel, args.stream_id)
    sessions: dict[int, SessionLog] = {}

    def on_message(data: bytes, session_id: int) -> None:
        seq = HEADER.unpack_from(data, 0)[0] if len(data) >= HEADER.size else -1
        log = sessions.get(session_id)
        if log is None:
            log = sessions[session_id] = SessionLog(seq)
        log.on_message(seq, data, args.size)
        if log.count == args.count:
            emit(event="flowing", session_id=session_id, first=log.first)

    lines: list[str] = []

    def read() -> None:
        lines.append(sys.stdin.readline())

    threading.Thread(target=read, daemon=True).start()
    poll = client.poller(subscription, on_message, args.fragment_limit, args.library_assembler)
    emit(event="ready")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if not poll():
            time.sleep(0.0005)
        if lines:
            target = json.loads(lines[0]) if lines[0].strip() else None
            log = sessions.get(target["session_id"]) if target else None
            if target is None or (log is not None and log.next >= target["until"]):
                break
    client.close()
    emit(
        event="result",
        ok=time.monotonic() < deadline,
        sessions={str(k): vars(v) for k, v in sessions.items()},
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["driver", "publish", "subscribe", "watch"])
    parser.add_argument("--client", choices=["pyaeron", "logbuf"], default="pyaeron")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--channel", default="aeron:ipc")
    parser.add_argument("--stream-id", type=int, default=1001)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--await-unavailable", type=float, default=0.0)
    parser.add_argument("--count-not-connected", action="store_true")
    parser.add_argument("--until-stdin", action="store_true", help="publish until a line on stdin (publish)")
    parser.add_argument("--pace-ms", type=float, default=0.0, help="pause between messages (publish)")
    parser.add_argument("--fragment-limit", type=int, default=256, help="fragments per poll (subscribe)")
    parser.add_argument("--library-assembler", action="store_true", help="pyaeron's poll(assemble=True)")
    args = parser.parse_args(argv)
    {"driver": run_driver, "publish": run_publish, "subscribe": run_subscribe, "watch": run_watch}[args.role](args)


if __name__ == "__main__":
    main()
