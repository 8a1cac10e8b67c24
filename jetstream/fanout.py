"""The fan-out engine: every subscriber is a byte cursor into a frame file, fed by ``os.sendfile``.

Theory of operation (``protocol_spec/jetstream-relay.md`` §3-§4):

* A subscriber reads one file (plain or zstd) and is, at any time, sending one *range*
  ``[pos, range_end)`` that ends on a frame boundary. An unfiltered subscriber's range is "from where
  I am to the end of the file": each pass extends it to the current end and sends it with one
  ``sendfile``; a slow reader is simply further behind and gets a bigger copy next time, so the work
  per pass is one system call per subscriber that has something to receive, whatever it lags by.
* A filtered subscriber plans *runs*: the numpy index is masked by its filter over the next events,
  and each run of consecutive wanted frames is one range (one ``sendfile``).
* Control frames (the handshake response, pongs, pings, close) are queued in ``out`` and written only
  at a frame boundary: queueing one shortens the current range to the end of the frame being sent;
  the rest of the range is put back (unfiltered: ``next_seq`` moves back; filtered: the remainder
  becomes the next run).
* Sockets are non-blocking and registered edge-triggered for EPOLLOUT: a subscriber that got EAGAIN
  is skipped until epoll says it is writable again; a partial send leaves it writable (the next pass
  tries again and either sends or gets EAGAIN, which arms the edge).
* Before every send the range start is checked against the store's floor (the first retained
  byte): a subscriber behind retention is dropped, never sent punched-out bytes.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Final

import numpy as np
import numpy.typing as npt
from websockets.server import ServerProtocol

from .filters import SubscriberOptions
from .limits import EventRateLimiter, FrameMeter, MessageBucket
from .store import PLAIN, FrameStore
from .subscriber_state import Input, State, next_state
from .tls import TLS_CHUNK_LENGTH, TlsSession

__all__ = ["CompiledFilter", "FanOut", "Subscriber"]

#: Events scanned per planning step of a filtered subscriber.
SCAN_LIMIT: Final = 8192
#: Ranges a subscriber may send in one pass (bounds one pass for filtered replays).
MAX_STEPS_PER_PASS: Final = 64


class CompiledFilter:
    """A subscriber's filter as index lookups: allowed collection ids, sorted DID hashes, size limit.

    The DIDs are kept as their hashes only (8 bytes each, against ~100 for a string in a set): a
    10,000-DID filter costs a connection 80 kB."""

    __slots__ = ("collections", "allowed", "dids", "max_length")

    def __init__(self, options: SubscriberOptions) -> None:
        self.collections = options.collections
        self.allowed: npt.NDArray[np.bool_] = np.ones(1, np.bool_)  # id 0 (no collection) passes
        self.dids: npt.NDArray[np.int64] | None = (
            np.sort(np.fromiter(map(hash, options.dids), np.int64, len(options.dids))) if options.dids else None
        )
        self.max_length = options.max_message_size_bytes

    def allowed_for(self, store: FrameStore) -> npt.NDArray[np.bool_]:
        names = store.collection_names
        if len(self.allowed) < len(names):
            matches = self.collections.matches
            extra = np.fromiter((matches(n) for n in names[len(self.allowed) :]), np.bool_)
            self.allowed = np.concatenate((self.allowed, extra))
        return self.allowed


class Subscriber:
    """One connection's state; plain attributes, read and written by the loop thread only."""

    __slots__ = (
        "sock",
        "fd",
        "ip",
        "protocol",
        "state",
        "kind",
        "options",
        "filter",
        "pos",
        "range_end",
        "range_events",
        "next_seq",
        "runs",
        "out",
        "eof_after_out",
        "writable",
        "blocked_since_ns",
        "deadline_ns",
        "next_ping_ns",
        "bytes_sent",
        "events_sent",
        "over_limit",
        "message",
        "head",
        "head_length",
        "discarded",
        "meter",
        "listener",
        "rate_limited",
        "messages",
        "reserved",
        "reserved_since_ns",
        "queued",
        "tls",
    )

    def __init__(self, sock: socket.socket, ip: str, protocol: ServerProtocol, deadline_ns: int) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.ip = ip
        self.protocol = protocol
        self.state = State.HANDSHAKE
        self.kind = PLAIN
        self.options = SubscriberOptions()
        self.filter: CompiledFilter | None = None
        self.pos = 0
        self.range_end = 0
        self.range_events = 0  # events in the current range, counted when it completes
        self.next_seq = 0  # first event not yet planned
        self.runs: deque[tuple[int, int, int]] = deque()
        self.out = bytearray()  # control bytes, written at frame boundaries
        self.eof_after_out = False
        self.writable = True
        self.blocked_since_ns = 0
        self.deadline_ns = deadline_ns
        self.next_ping_ns = 0
        self.bytes_sent = 0
        self.events_sent = 0
        self.over_limit = ""  # "ip" or "total": answer the request with 429 / 503
        self.message: list[bytes] | None = None  # fragments of a client message being received
        self.head = b""  # the last bytes of the HTTP request head received so far (HANDSHAKE)
        self.head_length = 0
        self.discarded = 0  # bytes read and dropped after our close frame or final response
        self.listener = 0  # which port accepted it: 0 public, 1 metrics (jetstream.server PUBLIC / METRICS)
        self.rate_limited = False  # attached to the relay's EventRateLimiter (under ``ip``)
        self.messages: MessageBucket | None = None  # the client-message rate, set at the upgrade
        self.meter = FrameMeter()  # client frame headers, read before websockets buffers the payload
        self.reserved = 0  # bytes counted against the relay's incoming budget
        self.reserved_since_ns = 0  # when the message (or request head) in progress began
        self.queued = 0  # bytes of its complete messages waiting to be parsed (also in the incoming budget)
        self.tls: TlsSession | None = None  # a TLS listener's connection: bytes go through it (jetstream.tls)

    def move(self, event: Input) -> State:
        """Apply one input of the state machine (:mod:`jetstream.subscriber_state`); returns the new state."""
        self.state = next_state(self.state, event)
        return self.state


class FanOut:
    """Plans and sends every subscriber's ranges; owns the set of connections past the handshake."""

    def __init__(
        self,
        store: FrameStore,
        drop: Callable[[Subscriber, str], None],
        on_linger: Callable[[Subscriber], None],
        on_error: Callable[[Subscriber, BaseException], None],
        limiter: EventRateLimiter | None = None,
    ) -> None:
        self.store = store
        self._drop = drop
        self._on_linger = on_linger
        self._on_error = on_error
        self.limiter = limiter
        self.throttled = False
        """The last pass held someone back for want of tokens (the server passes again soon)."""
        self._pass_id = 0
        self._now_ns = 0
        self.subscribers: dict[int, Subscriber] = {}
        self.sendfile_calls = 0
        self.bytes_sent = 0

    # -- state changes ---------------------------------------------------------------------------

    def add(self, sub: Subscriber) -> None:
        self.subscribers[sub.fd] = sub

    def remove(self, sub: Subscriber) -> None:
        self.subscribers.pop(sub.fd, None)

    def start(self, sub: Subscriber, seq: int) -> None:
        """Position a subscriber that just entered STREAMING at event ``seq`` (``store.next_seq``: live)."""
        sub.next_seq = seq
        sub.pos = sub.range_end = self.store.offset_of(sub.kind, seq)
        sub.range_events = 0
        sub.runs.clear()

    def set_options(self, sub: Subscriber, options: SubscriberOptions) -> None:
        """Apply new filters from the next frame boundary on (what was planned is re-planned)."""
        self._cut_at_boundary(sub)
        if sub.runs:  # planned runs were for the old filter: plan again from them
            sub.next_seq = self.store.seq_at_or_after(sub.kind, sub.runs[0][0])
            sub.runs.clear()
        sub.filter = None if options.wants_everything else CompiledFilter(options)
        # The DID set lives on compiled (hashes) in ``sub.filter``; an update replaces it whole, so the
        # strings are not kept: ``sub.options`` holds the rest (cursor, compression, collections, size).
        sub.options = replace(options, dids=frozenset()) if options.dids else options

    def queue_control(self, sub: Subscriber, data: bytes) -> None:
        """Queue a control frame (or an HTTP response): it goes out at the next frame boundary."""
        sub.out += data
        self._cut_at_boundary(sub)

    def _cut_at_boundary(self, sub: Subscriber) -> None:
        if sub.pos >= sub.range_end:
            return
        store = self.store
        seq = store.seq_at_or_after(sub.kind, sub.pos)
        boundary = store.offset_of(sub.kind, seq)
        if boundary >= sub.range_end:
            return
        if sub.filter is None:
            remaining = sub.next_seq - seq
            sub.next_seq = seq
        else:
            remaining = store.seq_at_or_after(sub.kind, sub.range_end) - seq
            sub.runs.appendleft((boundary, sub.range_end, remaining))
        sub.range_events -= remaining
        sub.range_end = boundary

    def is_behind(self, sub: Subscriber) -> bool:
        """Whether something this subscriber still has to receive was retired."""
        if sub.state is not State.STREAMING:
            return False
        floor = self.store.floor(sub.kind)
        if sub.pos < sub.range_end and sub.pos < floor:
            return True
        if sub.runs and sub.runs[0][0] < floor:
            return True
        return sub.next_seq < self.store.first_seq

    # -- sending ---------------------------------------------------------------------------------

    def send_out(self, sub: Subscriber) -> bool:
        """Write queued control bytes; True when all are written (and the write side shut if asked)."""
        if not self._write_queued(sub):
            return False
        if sub.eof_after_out and sub.state is not State.LINGER:
            if sub.tls is not None and not sub.tls.notified:
                sub.tls.close_notify()
                if not self._write_queued(sub):
                    return False
            try:
                sub.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self._drop(sub, "socket_error")
                return False
            sub.move(Input.WRITE_SHUT)
            self._on_linger(sub)
            return False
        return True

    def _write_queued(self, sub: Subscriber) -> bool:
        """Send ``out`` (a TLS connection: encrypted, with its other pending records); True when all went."""
        tls = sub.tls
        if tls is not None:
            if sub.out:
                tls.encrypt(sub.out)
                sub.out.clear()
            return self._send_buffer(sub, tls.out)
        return self._send_buffer(sub, sub.out)

    def send_records(self, sub: Subscriber) -> bool:
        """Send a TLS connection's pending records (handshake answers) without touching ``out``."""
        return sub.tls is None or self._send_buffer(sub, sub.tls.out)

    def _send_buffer(self, sub: Subscriber, buffer: bytearray) -> bool:
        if buffer:
            try:
                sent = sub.sock.send(buffer)
            except BlockingIOError:
                sub.writable = False
                return False
            except OSError:
                self._drop(sub, "socket_error")
                return False
            del buffer[:sent]
            if buffer:
                return False
        return True

    def send_now(self, sub: Subscriber, data: bytes) -> None:
        """Best effort, at once, ahead of nothing queued later (a last close frame before closing)."""
        tls = sub.tls
        if tls is not None:
            tls.encrypt(data)
            data = bytes(tls.out)
            tls.out.clear()
        try:
            sub.sock.send(data)
        except OSError:
            pass

    def _send_tls(self, sub: Subscriber, fd: int, pos: int, count: int) -> tuple[int, int]:
        """A TLS client's ``sendfile``: encrypt up to ``count`` bytes of the file from ``pos``, one chunk at a
        time, each only once the socket took all of the last. Returns (file bytes taken, bytes written);
        an ``EAGAIN`` marks the subscriber blocked; other socket errors propagate."""
        tls = sub.tls
        assert tls is not None
        out = tls.out
        sock = sub.sock
        taken = wrote = 0
        while True:
            if out:
                try:
                    sent = sock.send(out)
                except BlockingIOError:
                    sub.writable = False
                    sub.blocked_since_ns = self._now_ns
                    return taken, wrote
                del out[:sent]
                wrote += sent
                if out:  # the socket is full: try again next pass
                    return taken, wrote
            if taken >= count:
                return taken, wrote
            chunk = os.pread(fd, min(count - taken, TLS_CHUNK_LENGTH), pos + taken)
            if not chunk:
                return taken, wrote
            tls.encrypt(chunk)
            taken += len(chunk)

    def flush(self, now_ns: int) -> int:
        """One pass over every subscriber: send what each is owed. Returns bytes sent."""
        self._pass_id += 1
        self._now_ns = now_ns
        self.throttled = False
        limited = self.limiter is not None
        store = self.store
        n = store.next_seq
        files = store.files
        ends = [f.end for f in files]
        fds = [f.fd for f in files]
        floors = [store.floor(k) for k in range(len(files))]
        sendfile = os.sendfile
        streaming = State.STREAMING
        total = 0
        calls = 0
        for sub in list(self.subscribers.values()):
            if not sub.writable:
                continue
            try:
                kind = sub.kind
                steps = 0
                while steps < MAX_STEPS_PER_PASS:
                    steps += 1
                    pos = sub.pos
                    end = sub.range_end
                    if pos >= end:
                        if sub.range_events:
                            sub.events_sent += sub.range_events
                            sub.range_events = 0
                        if sub.out or sub.eof_after_out or (sub.tls is not None and sub.tls.out):
                            if not self.send_out(sub):
                                break
                        if sub.state is not streaming or not self._plan(sub, n, ends[kind]):
                            break
                        continue
                    if sub.filter is None and end < ends[kind] and not sub.out and sub.state is streaming:
                        if limited:
                            more = self._grant(sub, n - sub.next_seq)
                            sub.range_events += more
                            sub.next_seq += more
                            end = sub.range_end = store.offset_of(kind, sub.next_seq)
                        else:
                            sub.range_events += n - sub.next_seq
                            sub.next_seq = n
                            end = sub.range_end = ends[kind]
                    if pos < floors[kind]:
                        self._drop(sub, "behind_retention")
                        break
                    if sub.tls is not None:
                        try:
                            sent, wrote = self._send_tls(sub, fds[kind], pos, end - pos)
                        except OSError:
                            self._drop(sub, "socket_error")
                            break
                        sub.pos = pos + sent
                        sub.bytes_sent += sent
                        total += wrote
                        if sent < end - pos or not sub.writable:
                            break
                        continue
                    try:
                        sent = sendfile(sub.fd, fds[kind], pos, end - pos)
                    except BlockingIOError:
                        sub.writable = False
                        sub.blocked_since_ns = now_ns
                        break
                    except OSError:
                        self._drop(sub, "socket_error")
                        break
                    finally:
                        calls += 1
                    sub.pos = pos + sent
                    sub.bytes_sent += sent
                    total += sent
                    if sent < end - pos:
                        break
            except Exception as exc:  # noqa: BLE001 - one connection's trouble must never end the pass
                self._on_error(sub, exc)
        self.sendfile_calls += calls
        self.bytes_sent += total
        return total

    def _plan(self, sub: Subscriber, n: int, file_end: int) -> bool:
        """Set the next range at a boundary; False when there is nothing to send now."""
        if sub.runs:
            return self._take_run(sub)
        if sub.next_seq >= n:
            return False
        if sub.filter is None:
            events = n - sub.next_seq if self.limiter is None else self._grant(sub, n - sub.next_seq)
            if not events:
                return False
            sub.pos = self.store.offset_of(sub.kind, sub.next_seq)
            sub.next_seq += events
            sub.range_end = file_end if sub.next_seq == n else self.store.offset_of(sub.kind, sub.next_seq)
            sub.range_events = events
            return True
        f = sub.filter
        runs, scanned = self.store.matching_runs(
            sub.kind, sub.next_seq, SCAN_LIMIT, f.allowed_for(self.store), f.dids, f.max_length
        )
        sub.next_seq = scanned
        if runs:
            sub.runs.extend(runs)
            return self._take_run(sub)
        return scanned < n  # nothing wanted in this slice: scan on (bounded by the steps)

    def _take_run(self, sub: Subscriber) -> bool:
        """Make the first planned run the current range (as much of it as the rate limit grants)."""
        start, end, events = sub.runs[0]
        if self.limiter is not None:
            granted = self._grant(sub, events)
            if not granted:
                return False
            if granted < events:  # split the run at the granted event's frame: the rest waits
                split = self.store.offset_of(sub.kind, self.store.seq_at_or_after(sub.kind, start) + granted)
                sub.runs[0] = (split, end, events - granted)
                sub.pos, sub.range_end, sub.range_events = start, split, granted
                return True
        sub.runs.popleft()
        sub.pos, sub.range_end, sub.range_events = start, end, events
        return True

    def _grant(self, sub: Subscriber, wanted: int) -> int:
        assert self.limiter is not None
        granted = self.limiter.grant(sub.ip, wanted, self._now_ns, self._pass_id)
        if granted < wanted:
            self.throttled = True
        return granted
