"""One client's control session: its state, its response stream and what it has queued to send.

The session is Aeron's ``ControlSession`` and ``ControlResponseProxy`` in one small class: the conductor
(:mod:`archive.archive_conductor`) feeds it events and messages; it encodes responses onto the response
publication it owns. A response that the publication cannot take now (back-pressure) waits in a bounded
queue, sent before anything newer; a session whose queue overflows is closed (its client is not reading),
so one slow client never holds the service's memory. Long answers (lists of descriptors) are a
generator drained only while the queue is empty, so they are paced by the client too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import structlog

from logbuf.archive import control_codec as cc
from logbuf.archive.control_session_state import SessionEvent, SessionState, next_state
from logbuf.client import Publication
from logbuf.logbuffer.publication import OfferResult

__all__ = ["ControlSession", "SessionOrigin"]


@dataclass(frozen=True)
class SessionOrigin:
    """Where a session's requests come from: requests for it from any other image are dropped."""

    control_stream: str
    """``local`` or ``remote`` (which control subscription)."""
    image_session_id: int
    source_identity: str


@dataclass
class ControlSession:
    control_session_id: int
    connect_correlation_id: int
    response_channel: str
    response_stream_id: int
    origin: SessionOrigin
    client_version: int
    deadline_ms: int
    """When the current state times out (connecting, challenged) or the session goes idle (active)."""
    queue_limit: int
    publication: Publication | None = None
    state: SessionState = SessionState.INIT
    challenge: bytes = b""
    reject_message: str = ""
    reject_code: int = 0
    queue: deque[bytes] = field(default_factory=deque)
    pending: Iterator[cc.ControlMessage] | None = None
    """A long answer (a list of descriptors) not yet sent in full."""
    closed_reason: str = ""

    def __post_init__(self) -> None:
        self._log = structlog.get_logger().bind(role="archive", control_session_id=self.control_session_id)

    # -- state ----------------------------------------------------------------------------------------
    def on_event(self, event: SessionEvent, reason: str = "") -> None:
        """Apply ``event`` (ControlSessionStateError if the state does not allow it)."""
        before = self.state
        self.state = next_state(self.state, event)
        if self.state is SessionState.DONE and not self.closed_reason:
            self.closed_reason = reason or event.value.lower()
        if before is not self.state:
            self._log.debug("control_session.state", state=self.state.value, cause=event.value)

    @property
    def is_done(self) -> bool:
        return self.state is SessionState.DONE

    # -- sending --------------------------------------------------------------------------------------
    def send(self, message: cc.ControlMessage) -> None:
        """Send ``message`` now, or queue it behind what is queued."""
        data = cc.encode(message)
        if self.queue or not self._offer(data):
            if self.is_done:
                return
            if len(self.queue) >= self.queue_limit:
                self.queue.clear()
                self.pending = None
                self.on_event(SessionEvent.QUEUE_OVERFLOW, "response queue overflow (the client is not reading)")
                return
            self.queue.append(data)

    def _offer(self, data: bytes) -> bool:
        publication = self.publication
        if publication is None or self.is_done:
            return False
        result = publication.offer(data)
        if result >= 0:
            return True
        if result in (OfferResult.NOT_CONNECTED, OfferResult.CLOSED, OfferResult.MAX_POSITION_EXCEEDED):
            if self.state in (SessionState.ACTIVE, SessionState.CHALLENGED, SessionState.REJECTED):
                self.on_event(SessionEvent.RESPONSE_LOST, "response stream lost")
        return False

    def flush(self) -> int:
        """Send what is queued, then more of a pending long answer; returns messages sent."""
        sent = 0
        while self.queue and not self.is_done:
            if not self._offer(self.queue[0]):
                return sent
            self.queue.popleft()
            sent += 1
        while self.pending is not None and not self.queue and not self.is_done and sent < 64:
            message = next(self.pending, None)
            if message is None:
                self.pending = None
                break
            self.send(message)
            sent += 1
        return sent

    def send_response(
        self,
        correlation_id: int,
        code: cc.ControlResponseCode,
        relevant_id: int = 0,
        error_message: str = "",
    ) -> None:
        self.send(
            cc.ControlResponse(
                control_session_id=self.control_session_id,
                correlation_id=correlation_id,
                relevant_id=relevant_id,
                code=code,
                version=cc.PROTOCOL_SEMANTIC_VERSION,
                error_message=error_message,
            )
        )

    def send_ok(self, correlation_id: int, relevant_id: int = 0) -> None:
        self.send_response(correlation_id, cc.ControlResponseCode.OK, relevant_id)

    def send_error(self, correlation_id: int, error_code: cc.ArchiveErrorCode, message: str) -> None:
        """An ERROR response: Aeron's convention puts the ArchiveErrorCode in relevantId."""
        self.send_response(correlation_id, cc.ControlResponseCode.ERROR, int(error_code), message)

    def close(self) -> None:
        if self.publication is not None:
            publication, self.publication = self.publication, None
            try:
                publication.close()
            except Exception as e:  # the driver may be gone: the session ends anyway
                self._log.debug("control_session.close_failed", error=str(e))
        self.queue.clear()
        self.pending = None
