"""The archive service's agent: control sessions, recordings and replays on one duty cycle.

Theory of operation
-------------------
:class:`ArchiveConductor` is Aeron's ``ArchiveConductor``, ``ControlSessionAdapter`` and the recorder and
replayer agents in one agent (``do_work()``), run by :class:`archive.service.ArchiveService` on one thread
with the client conductor driven from the same loop, so callbacks, polls and handlers never race.

A duty cycle: run the client conductor (image events start and stop recordings); take up to
``requests_per_poll`` control fragments (local IPC and remote UDP subscriptions), each decoded by
:mod:`archive.control_codec` and dispatched to an ``on_*`` handler; step every session (connect, challenge,
time-outs, queued responses); record a block from each recorded image; append a block to each replay;
publish recording progress.

Nothing a client sends is trusted. A fragment that is too long or does not decode is counted and
dropped (there is no session to answer yet); a request naming a session that does not exist, or that
came from another image than the session's connect, is counted and dropped (a guessed session id buys
nothing); a connect beyond ``max_sessions``, from an address outside ``allowed_clients``, or naming a
response channel that is not the requester's own host is counted and dropped. Every other bad request
gets an ERROR response with Aeron's error code in ``relevantId`` and a message naming the problem. No
handler raises out of the duty cycle: an unexpected exception is logged, counted and answered as
GENERIC error.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from logbuf.archive import control_codec as cc
from logbuf.archive.catalog import Catalog, CatalogError, RecordingDescriptor, RecordingState, UnknownRecordingError
from logbuf.archive.control_session import ControlSession, SessionOrigin
from logbuf.archive.control_session_state import ControlSessionStateError, SessionEvent, SessionState
from logbuf.archive.maintenance import delete_recording, purge_segments, truncate_recording
from logbuf.archive.recorder import RecordingSession
from logbuf.archive.recording import ChecksumType
from logbuf.archive.replay import Replay, ReplayError
from logbuf.archive.service_context import ArchiveContext
from logbuf.archive.time_seek import seek_time
from logbuf.channel_uri import ChannelUri
from logbuf.client import Aeron, Image, Publication, Subscription
from logbuf.conduit.archive_counters import ArchiveCounters
from logbuf.errors import LogbufError
from logbuf.logbuffer.fragment_assembler import FragmentAssembler
from logbuf.logbuffer.publication import OfferResult

__all__ = ["ArchiveConductor", "ConductorExtension", "NULL_POSITION", "NULL_LENGTH", "challenge_answer"]

NULL_POSITION = -1
"""Aeron's "no position": a replay from the start, the stop position of an active recording."""
NULL_LENGTH = -1
"""Aeron's replay length for "follow the recording until it stops" (also ``2**63 - 1``)."""
_FOLLOW_LENGTHS = (NULL_LENGTH, (1 << 63) - 1)
ERR = cc.ArchiveErrorCode


def challenge_answer(secret: bytes, challenge: bytes, control_session_id: int) -> bytes:
    """What a client sends back for a challenge: HMAC-SHA256(secret, challenge || session id as int64 LE)."""
    message = challenge + (control_session_id & ((1 << 64) - 1)).to_bytes(8, "little")
    return hmac.new(secret, message, hashlib.sha256).digest()


class RequestError(LogbufError):
    """A request that cannot be served: answered with an ERROR response (code and message)."""

    def __init__(self, code: cc.ArchiveErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConductorExtension(Protocol):
    """A family of requests served on the conductor's duty cycle (see :meth:`ArchiveConductor.add_extension`)."""

    def handlers(self) -> dict[type[Any], Callable[[ControlSession, Any], None]]: ...

    def do_work(self) -> int: ...

    def close(self) -> None: ...


@dataclass
class RecordingSubscription:
    """One start-recording request: a subscription whose images are each recorded."""

    subscription_id: int
    channel: str
    stream_id: int
    subscription: Subscription
    control_session_id: int
    correlation_id: int
    auto_stop: bool
    sessions: dict[int, RecordingSession] = field(default_factory=dict)
    """Recordings by image correlation id."""


@dataclass
class ReplaySlot:
    replay_session_id: int
    control_session_id: int
    correlation_id: int
    replay: Replay


class ArchiveConductor:
    """The archive service's agent (see the module doc)."""

    role_name = "archive-conductor"

    def __init__(self, ctx: ArchiveContext, aeron: Aeron, catalog: Catalog, counters: ArchiveCounters) -> None:
        self.ctx = ctx
        self.aeron = aeron
        self.catalog = catalog
        self.counters = counters
        self.sessions: dict[int, ControlSession] = {}
        self.recording_subscriptions: dict[int, RecordingSubscription] = {}
        self.replays: dict[int, ReplaySlot] = {}
        self._control_subscriptions: list[tuple[str, Subscription]] = []
        self._assemblers: list[tuple[str, Subscription, FragmentAssembler]] = []
        self._events: Publication | None = None
        self._next_session_id = secrets.randbelow(1 << 40) + 1
        self._next_replay_id = 1
        self._progress: dict[int, tuple[int, int]] = {}
        """recording id -> (last position reported, time ms)."""
        self._checksum = ChecksumType.CRC32 if ctx.checksum.lower() == "crc32" else ChecksumType.NONE
        self._archive_id = ctx.archive_id if ctx.archive_id >= 0 else zlib.crc32(str(catalog.path).encode())
        self._current: tuple[str, Subscription] | None = None
        self._log = structlog.get_logger().bind(role="archive")
        self._handlers: dict[type[Any], Callable[[ControlSession, Any], None]] = {
            cc.CloseSessionRequest: self.on_close_session,
            cc.KeepAliveRequest: self.on_keep_alive,
            cc.Ping: self.on_keep_alive,
            cc.StartRecordingRequest: self.on_start_recording,
            cc.StartRecordingRequest2: self.on_start_recording,
            cc.StopRecordingRequest: self.on_stop_recording,
            cc.StopRecordingSubscriptionRequest: self.on_stop_recording_subscription,
            cc.StopRecordingByIdentityRequest: self.on_stop_recording_by_identity,
            cc.ReplayRequest: self.on_replay,
            cc.BoundedReplayRequest: self.on_replay,
            cc.StopReplayRequest: self.on_stop_replay,
            cc.StopAllReplaysRequest: self.on_stop_all_replays,
            cc.ListRecordingsRequest: self.on_list_recordings,
            cc.ListRecordingsForUriRequest: self.on_list_recordings,
            cc.ListRecordingRequest: self.on_list_recording,
            cc.FindLastMatchingRecordingRequest: self.on_find_last_matching_recording,
            cc.ListRecordingSubscriptionsRequest: self.on_list_recording_subscriptions,
            cc.RecordingPositionRequest: self.on_position_request,
            cc.StopPositionRequest: self.on_position_request,
            cc.StartPositionRequest: self.on_position_request,
            cc.RecordingPositionAtTimeRequest: self.on_position_at_time,
            cc.MaxRecordedPositionRequest: self.on_position_request,
            cc.TruncateRecordingRequest: self.on_truncate_recording,
            cc.PurgeRecordingRequest: self.on_purge_recording,
            cc.PurgeSegmentsRequest: self.on_purge_segments,
            cc.ArchiveIdRequest: self.on_archive_id,
        }
        self._extensions: list[ConductorExtension] = []

    # -- lifecycle ----------------------------------------------------------------------------------------
    def on_start(self) -> None:
        ctx = self.ctx
        if ctx.local_control_channel:
            sub = self.aeron.add_subscription(ctx.local_control_channel, ctx.control_stream_id)
            self._control_subscriptions.append(("local", sub))
        if ctx.control_channel:
            sub = self.aeron.add_subscription(ctx.control_channel, ctx.control_stream_id)
            self._control_subscriptions.append(("remote", sub))
        for kind, sub in self._control_subscriptions:
            self._assemblers.append((kind, sub, FragmentAssembler(self._on_fragment)))
        if ctx.events_channel:
            self._events = self.aeron.add_publication(ctx.events_channel, ctx.events_stream_id)
        self._log.info(
            "archive.started",
            archive_dir=ctx.archive_dir,
            local_control_channel=ctx.local_control_channel,
            control_channel=ctx.control_channel,
            control_stream_id=ctx.control_stream_id,
            events_channel=ctx.events_channel,
            authentication=bool(ctx.auth_secret),
            allowed_clients=ctx.allowed_clients,
        )

    def add_extension(self, extension: ConductorExtension) -> None:
        """Serve more request types on this duty cycle (replication, sync): the extension's handlers are
        dispatched like the conductor's own, its ``do_work()`` runs each cycle and ``close()`` on close."""
        self._extensions.append(extension)
        self._handlers.update(extension.handlers())

    def on_close(self) -> None:
        for extension in self._extensions:
            extension.close()
        for slot in list(self.replays.values()):
            slot.replay.close()
        self.replays.clear()
        for rs in list(self.recording_subscriptions.values()):
            self._stop_recording_subscription(rs, "archive closed")
        for session in list(self.sessions.values()):
            if not session.is_done:
                session.on_event(SessionEvent.CLOSE, "archive closed")
            session.close()
        self.sessions.clear()
        for _, sub in self._control_subscriptions:
            sub.close()
        self._control_subscriptions.clear()
        if self._events is not None:
            self._events.close()
            self._events = None
        self._log.info("archive.closed")

    # -- duty cycle ------------------------------------------------------------------------------------------
    def do_work(self) -> int:
        now_ms = time.monotonic_ns() // 1_000_000
        work = 0
        for kind, sub, assembler in self._assemblers:
            self._current = (kind, sub)
            work += sub.poll(assembler, self.ctx.requests_per_poll)
        self._current = None
        for session in tuple(self.sessions.values()):
            work += self._step_session(session, now_ms)
        epoch_ms = time.time_ns() // 1_000_000
        for rs in tuple(self.recording_subscriptions.values()):
            for key, recording in tuple(rs.sessions.items()):
                n = recording.do_work()
                if n:
                    self.counters.add_bytes_recorded(n)
                    work += 1
                recording.heartbeat(epoch_ms)
                if recording.stopped and recording.failed:
                    self._recording_ended(rs, key, recording)
        for replay_id, slot in tuple(self.replays.items()):
            n = slot.replay.do_work()
            if n:
                self.counters.add_bytes_replayed(n)
                work += 1
            if slot.replay.is_done:
                self._replay_ended(replay_id, slot)
        for extension in self._extensions:
            work += extension.do_work()
        work += self._publish_progress(now_ms)
        self.counters.set_active(len(self.sessions), self._active_recordings(), len(self.replays))
        return work

    # -- control input ----------------------------------------------------------------------------------------
    def _on_fragment(self, payload: memoryview, header: Any) -> None:
        assert self._current is not None
        kind, sub = self._current
        self.counters.requests.increment()
        if len(payload) > self.ctx.max_request_length:
            self._drop("request.too_long", length=len(payload))
            return
        try:
            message = cc.decode(payload)
        except cc.ControlCodecError as e:
            self._drop("request.undecodable", error=str(e))
            return
        image = sub.image_by_session_id(header.session_id)
        source = image.source_identity if image is not None else ""
        origin = SessionOrigin(kind, header.session_id, source)
        try:
            if isinstance(message, (cc.ConnectRequest, cc.AuthConnectRequest)):
                self.on_connect(message, origin)
                return
            session_id = getattr(message, "control_session_id", None)
            session = self.sessions.get(session_id) if isinstance(session_id, int) else None
            if session is None or session.is_done:
                self._drop("request.unknown_session", template_id=type(message).TEMPLATE_ID)
                return
            if session.origin != origin:
                self._drop("request.foreign_session", control_session_id=session_id)
                return
            if isinstance(message, cc.ChallengeResponse):
                self.on_challenge_response(session, message)
                return
            handler = self._handlers.get(type(message))
            correlation_id = getattr(message, "correlation_id", 0)
            if session.state is not SessionState.ACTIVE:
                if isinstance(message, cc.CloseSessionRequest):
                    self.on_close_session(session, message)
                else:
                    self._drop("request.session_not_active", state=session.state.value)
                return
            session.on_event(SessionEvent.REQUEST)
            session.deadline_ms = self._now_ms() + self.ctx.session_timeout_ns // 1_000_000
            if handler is None:
                session.send_error(
                    correlation_id,
                    ERR.GENERIC,
                    f"{type(message).__name__} (template id {type(message).TEMPLATE_ID}) is not supported by "
                    "this archive",
                )
                return
            try:
                handler(session, message)
            except RequestError as e:
                self.counters.errors.increment()
                session.send_error(correlation_id, e.code, str(e))
            except (CatalogError, ReplayError, ValueError, OSError, LogbufError) as e:
                self.counters.errors.increment()
                code = ERR.UNKNOWN_RECORDING if isinstance(e, UnknownRecordingError) else ERR.GENERIC
                session.send_error(correlation_id, code, str(e))
        except ControlSessionStateError as e:
            self._drop("request.bad_state", error=str(e))
        except Exception as e:  # a bug: counted, logged, never the end of the service
            self.counters.errors.increment()
            self._log.exception("request.failed", template_id=type(message).TEMPLATE_ID, error=str(e))

    def _drop(self, event: str, **kw: Any) -> None:
        self.counters.requests_dropped.increment()
        self._log.debug(event, **kw)

    @staticmethod
    def _now_ms() -> int:
        return time.monotonic_ns() // 1_000_000

    # -- sessions ---------------------------------------------------------------------------------------------
    def on_connect(self, request: cc.ConnectRequest | cc.AuthConnectRequest, origin: SessionOrigin) -> None:
        ctx = self.ctx
        if len(self.sessions) >= ctx.max_sessions:
            self._drop("connect.too_many_sessions", max_sessions=ctx.max_sessions)
            return
        host = origin.source_identity.rsplit(":", 1)[0].strip("[]") if origin.source_identity else ""
        if origin.control_stream == "remote" and not ctx.client_allowed(host):
            self._drop("connect.not_allowed", source=origin.source_identity)
            return
        try:
            uri = ChannelUri.parse(request.response_channel)
        except ValueError as e:
            self._drop("connect.bad_response_channel", error=str(e))
            return
        if uri.prefix or uri.media not in ("ipc", "udp"):
            self._drop("connect.bad_response_channel", channel=request.response_channel)
            return
        if origin.control_stream == "remote":
            endpoint = uri.get("endpoint")
            if uri.media != "udp" or endpoint is None:
                self._drop("connect.bad_response_channel", channel=request.response_channel)
                return
            if ctx.response_to_source_only and endpoint.rsplit(":", 1)[0].strip("[]") != host:
                self._drop("connect.response_elsewhere", channel=request.response_channel, source=host)
                return
        session_id = self._next_session_id
        self._next_session_id += 1
        session = ControlSession(
            control_session_id=session_id,
            connect_correlation_id=request.correlation_id,
            response_channel=request.response_channel,
            response_stream_id=request.response_stream_id,
            origin=origin,
            client_version=request.version,
            deadline_ms=self._now_ms() + ctx.connect_timeout_ns // 1_000_000,
            queue_limit=ctx.response_queue_length,
        )
        self.sessions[session_id] = session
        try:
            session.publication = self.aeron.add_exclusive_publication(
                request.response_channel, request.response_stream_id
            )
        except (LogbufError, ValueError) as e:
            session.on_event(SessionEvent.REJECT, f"response channel refused: {e}")
            self._drop("connect.response_refused", error=str(e))
            return
        session.on_event(SessionEvent.RESPONSE_ADDED)
        major = request.version >> 16
        if request.version != cc.NULL_VERSION and major != cc.PROTOCOL_SEMANTIC_VERSION >> 16:
            session.reject_code = ERR.GENERIC
            session.reject_message = (
                f"client protocol version {major}.{(request.version >> 8) & 0xFF}.{request.version & 0xFF} is not "
                f"compatible with the archive's {cc.PROTOCOL_SEMANTIC_VERSION >> 16}."
                f"{(cc.PROTOCOL_SEMANTIC_VERSION >> 8) & 0xFF}.{cc.PROTOCOL_SEMANTIC_VERSION & 0xFF} "
                "(the major versions differ)"
            )
        elif self._needs_auth(origin) and not isinstance(request, cc.AuthConnectRequest):
            session.reject_code = ERR.AUTHENTICATION_REJECTED
            session.reject_message = "this archive requires authentication: connect with the shared secret"
        self.counters.sessions_opened.increment()
        self._log.info(
            "control_session.connecting",
            control_session_id=session_id,
            response_channel=request.response_channel,
            response_stream_id=request.response_stream_id,
            source=origin.source_identity or origin.control_stream,
        )

    def _needs_auth(self, origin: SessionOrigin) -> bool:
        if not self.ctx.auth_secret:
            return False
        return origin.control_stream == "remote" or self.ctx.authenticate_local

    def _step_session(self, session: ControlSession, now_ms: int) -> int:
        work = 0
        try:
            if session.state is SessionState.CONNECTING:
                publication = session.publication
                if publication is not None and publication.is_connected:
                    work += 1
                    session.deadline_ms = now_ms + self.ctx.connect_timeout_ns // 1_000_000
                    if session.reject_message:
                        session.on_event(SessionEvent.REJECT, session.reject_message)
                        session.send_error(
                            session.connect_correlation_id,
                            cc.ArchiveErrorCode(session.reject_code),
                            session.reject_message,
                        )
                    elif self._needs_auth(session.origin):
                        session.challenge = secrets.token_bytes(32)
                        session.on_event(SessionEvent.CHALLENGE_SENT)
                        session.send(
                            cc.Challenge(
                                control_session_id=session.control_session_id,
                                correlation_id=session.connect_correlation_id,
                                version=cc.PROTOCOL_SEMANTIC_VERSION,
                                encoded_challenge=session.challenge,
                            )
                        )
                    else:
                        self._activate(session, now_ms)
            work += session.flush()
            if session.state is SessionState.REJECTED and not session.queue:
                session.on_event(SessionEvent.FLUSHED, session.reject_message)
            if not session.is_done and now_ms > session.deadline_ms:
                session.on_event(SessionEvent.TIMEOUT, f"timed out in state {session.state.value}")
        except ControlSessionStateError as e:
            self._log.warning("control_session.bad_transition", error=str(e))
            session.state = SessionState.DONE
        if session.is_done:
            self._end_session(session)
            work += 1
        return work

    def _activate(self, session: ControlSession, now_ms: int) -> None:
        session.on_event(
            SessionEvent.RESPONSE_CONNECTED
            if session.state is SessionState.CONNECTING
            else SessionEvent.CHALLENGE_ANSWERED
        )
        session.deadline_ms = now_ms + self.ctx.session_timeout_ns // 1_000_000
        session.send_ok(session.connect_correlation_id, session.control_session_id)
        self._log.info("control_session.active", control_session_id=session.control_session_id)

    def on_challenge_response(self, session: ControlSession, message: cc.ChallengeResponse) -> None:
        if session.state is not SessionState.CHALLENGED:
            self._drop("request.unexpected_challenge_response", state=session.state.value)
            return
        expected = challenge_answer(self.ctx.auth_secret, session.challenge, session.control_session_id)
        if hmac.compare_digest(expected, message.encoded_credentials):
            self._activate(session, self._now_ms())
            return
        self.counters.auth_failures.increment()
        session.reject_message = "authentication failed: the answer to the challenge is wrong"
        session.on_event(SessionEvent.REJECT, session.reject_message)
        session.send_error(session.connect_correlation_id, ERR.AUTHENTICATION_REJECTED, session.reject_message)
        self._log.warning("control_session.authentication_failed", source=session.origin.source_identity)

    def _end_session(self, session: ControlSession) -> None:
        self.counters.sessions_closed.increment()  # first: whoever sees the session gone sees it counted
        self.sessions.pop(session.control_session_id, None)
        session.close()  # its replays run on: they end with their subscribers, the recording or stop-replay
        self._log.info(
            "control_session.closed", control_session_id=session.control_session_id, reason=session.closed_reason
        )

    def on_close_session(self, session: ControlSession, message: cc.CloseSessionRequest) -> None:
        session.on_event(SessionEvent.CLOSE, "closed by the client")

    def on_keep_alive(self, session: ControlSession, message: cc.KeepAliveRequest | cc.Ping) -> None:
        pass  # the deadline moved already

    def on_archive_id(self, session: ControlSession, message: cc.ArchiveIdRequest) -> None:
        session.send_ok(message.correlation_id, self._archive_id)

    # -- recordings -------------------------------------------------------------------------------------------
    def _active_recordings(self) -> int:
        return sum(len(rs.sessions) for rs in self.recording_subscriptions.values())

    def on_start_recording(
        self, session: ControlSession, message: cc.StartRecordingRequest | cc.StartRecordingRequest2
    ) -> None:
        channel, stream_id = message.channel, message.stream_id
        try:
            uri = ChannelUri.parse(channel)
        except ValueError as e:
            raise RequestError(ERR.GENERIC, f"cannot record channel {channel!r}: {e}") from None
        if uri.prefix:
            raise RequestError(ERR.GENERIC, f"cannot record channel {channel!r}: give it without a prefix")
        if message.source_location == cc.SourceLocation.REMOTE and uri.media != "udp":
            raise RequestError(ERR.GENERIC, f"a REMOTE source needs an aeron:udp channel, not {channel!r}")
        for rs in self.recording_subscriptions.values():
            if rs.channel == channel and rs.stream_id == stream_id:
                raise RequestError(
                    ERR.ACTIVE_SUBSCRIPTION,
                    f"{channel} stream {stream_id} is already recorded (subscription {rs.subscription_id})",
                )
        if len(self.recording_subscriptions) >= self.ctx.max_recording_subscriptions:
            raise RequestError(
                ERR.MAX_RECORDINGS,
                f"max recording subscriptions reached ({self.ctx.max_recording_subscriptions})",
            )
        if self._active_recordings() >= self.ctx.max_concurrent_recordings:
            raise RequestError(
                ERR.MAX_RECORDINGS, f"max concurrent recordings reached ({self.ctx.max_concurrent_recordings})"
            )
        auto_stop = isinstance(message, cc.StartRecordingRequest2) and message.auto_stop == cc.BooleanType.TRUE
        rs = self.start_recording_locally(
            channel,
            stream_id,
            remote=message.source_location == cc.SourceLocation.REMOTE,
            auto_stop=auto_stop,
            control_session_id=session.control_session_id,
            correlation_id=message.correlation_id,
            on_registered=lambda rs: session.send_ok(message.correlation_id, rs.subscription_id),
        )
        del rs

    def start_recording_locally(
        self,
        channel: str,
        stream_id: int,
        *,
        remote: bool = False,
        auto_stop: bool = False,
        control_session_id: int = -1,
        correlation_id: int = -1,
        on_registered: Callable[[RecordingSubscription], None] | None = None,
    ) -> RecordingSubscription:
        """Subscribe to ``channel``/``stream_id`` and record each image (``serve --record`` and the request)."""
        uri = ChannelUri.parse(channel)
        subscribe_channel = channel
        if not remote and uri.media == "udp":
            subscribe_channel = "aeron-spy:" + channel  # the local publication's log, not the network
        holder: list[RecordingSubscription] = []
        subscription = self.aeron.add_subscription(
            subscribe_channel,
            stream_id,
            lambda image: self._on_recorded_image(holder[0], image) if holder else None,
            lambda image: self._on_recorded_image_gone(holder[0], image) if holder else None,
        )
        rs = RecordingSubscription(
            subscription.registration_id,
            channel,
            stream_id,
            subscription,
            control_session_id,
            correlation_id,
            auto_stop,
        )
        holder.append(rs)
        self.recording_subscriptions[rs.subscription_id] = rs
        if on_registered is not None:
            on_registered(rs)  # the OK goes before the START signals of the images below
        for image in subscription.images:  # images that arrived with the registration
            self._on_recorded_image(rs, image)
        self._log.info(
            "recording_subscription.started", subscription_id=rs.subscription_id, channel=channel, stream_id=stream_id
        )
        return rs

    def _on_recorded_image(self, rs: RecordingSubscription, image: Image) -> None:
        if image.correlation_id in rs.sessions:
            return
        if self._active_recordings() >= self.ctx.max_concurrent_recordings:
            self.counters.errors.increment()
            self._log.error(
                "recording.refused",
                reason=f"max concurrent recordings reached ({self.ctx.max_concurrent_recordings})",
                session_id=image.session_id,
                stream_id=image.stream_id,
            )
            return
        recording = RecordingSession(
            self.catalog,
            image,
            rs.channel,
            self.ctx.segment_length,
            self.ctx.block_length,
            self._checksum,
            time_index=self.ctx.time_index,
        )
        rs.sessions[image.correlation_id] = recording
        self.counters.recordings_started.increment()
        self._progress[recording.recording_id] = (recording.start_position, self._now_ms())
        self._send_event(
            cc.RecordingStarted(
                recording_id=recording.recording_id,
                start_position=recording.start_position,
                session_id=image.session_id,
                stream_id=image.stream_id,
                channel=rs.channel,
                source_identity=image.source_identity,
            )
        )
        self._signal(rs, recording.recording_id, recording.start_position, cc.RecordingSignal.START)

    def _on_recorded_image_gone(self, rs: RecordingSubscription, image: Image) -> None:
        recording = rs.sessions.get(image.correlation_id)
        if recording is not None:
            recording.stop("image unavailable")
            self._recording_ended(rs, image.correlation_id, recording)
        if rs.auto_stop and not rs.sessions and rs.subscription_id in self.recording_subscriptions:
            self._stop_recording_subscription(rs, "auto stop")

    def _recording_ended(self, rs: RecordingSubscription, key: int, recording: RecordingSession) -> None:
        rs.sessions.pop(key, None)
        self._progress.pop(recording.recording_id, None)
        self._send_event(
            cc.RecordingStopped(
                recording_id=recording.recording_id,
                start_position=recording.start_position,
                stop_position=recording.position,
            )
        )
        self._signal(rs, recording.recording_id, recording.position, cc.RecordingSignal.STOP)

    def _signal(self, rs: RecordingSubscription, recording_id: int, position: int, signal: cc.RecordingSignal) -> None:
        session = self.sessions.get(rs.control_session_id)
        if session is not None and session.state is SessionState.ACTIVE:
            session.send(
                cc.RecordingSignalEvent(
                    control_session_id=session.control_session_id,
                    correlation_id=rs.correlation_id,
                    recording_id=recording_id,
                    subscription_id=rs.subscription_id,
                    position=position,
                    signal=signal,
                )
            )

    def _send_event(self, message: cc.ControlMessage) -> None:
        """Recording events are best effort (as Aeron's): one that the events stream cannot take is counted."""
        if self._events is None:
            return
        result = self._events.offer(cc.encode(message))
        if result < 0 and result != OfferResult.NOT_CONNECTED:
            self.counters.events_dropped.increment()

    def _publish_progress(self, now_ms: int) -> int:
        if self._events is None:
            return 0
        sent = 0
        for rs in self.recording_subscriptions.values():
            for recording in rs.sessions.values():
                last, at_ms = self._progress.get(recording.recording_id, (-1, 0))
                if recording.position != last and (now_ms - at_ms) * 1_000_000 >= self.ctx.progress_interval_ns:
                    self._progress[recording.recording_id] = (recording.position, now_ms)
                    self._send_event(
                        cc.RecordingProgress(
                            recording_id=recording.recording_id,
                            start_position=recording.start_position,
                            position=recording.position,
                        )
                    )
                    sent += 1
        return sent

    def _stop_recording_subscription(self, rs: RecordingSubscription, reason: str) -> None:
        self.recording_subscriptions.pop(rs.subscription_id, None)
        for key, recording in list(rs.sessions.items()):
            recording.stop(reason)
            self._recording_ended(rs, key, recording)
        rs.subscription.close()
        self._log.info("recording_subscription.stopped", subscription_id=rs.subscription_id, reason=reason)

    def on_stop_recording(self, session: ControlSession, message: cc.StopRecordingRequest) -> None:
        for rs in tuple(self.recording_subscriptions.values()):
            if rs.channel == message.channel and rs.stream_id == message.stream_id:
                self._stop_recording_subscription(rs, "stop requested")
                session.send_ok(message.correlation_id)
                return
        raise RequestError(
            ERR.UNKNOWN_SUBSCRIPTION, f"no recording of {message.channel} stream {message.stream_id} to stop"
        )

    def on_stop_recording_subscription(
        self, session: ControlSession, message: cc.StopRecordingSubscriptionRequest
    ) -> None:
        rs = self.recording_subscriptions.get(message.subscription_id)
        if rs is None:
            raise RequestError(ERR.UNKNOWN_SUBSCRIPTION, f"no recording subscription {message.subscription_id}")
        self._stop_recording_subscription(rs, "stop requested")
        session.send_ok(message.correlation_id)

    def on_stop_recording_by_identity(
        self, session: ControlSession, message: cc.StopRecordingByIdentityRequest
    ) -> None:
        self._descriptor(message.recording_id)
        for rs in tuple(self.recording_subscriptions.values()):
            for key, recording in tuple(rs.sessions.items()):
                if recording.recording_id == message.recording_id:
                    recording.stop("stop requested")
                    self._recording_ended(rs, key, recording)
                    if not rs.sessions:
                        self._stop_recording_subscription(rs, "its last recording stopped")
                    session.send_ok(message.correlation_id, 1)
                    return
        session.send_ok(message.correlation_id, 0)  # Aeron: relevantId 0 = it was not being recorded

    # -- queries ----------------------------------------------------------------------------------------------
    def _descriptor(self, recording_id: int) -> RecordingDescriptor:
        try:
            d = self.catalog.recording(recording_id)
        except UnknownRecordingError:
            raise RequestError(ERR.UNKNOWN_RECORDING, f"unknown recording id {recording_id}") from None
        if d.state != RecordingState.VALID:
            raise RequestError(ERR.UNKNOWN_RECORDING, f"recording {recording_id} is {d.state.name}")
        return d

    def _recorded_position(self, d: RecordingDescriptor) -> int:
        for rs in self.recording_subscriptions.values():
            for recording in rs.sessions.values():
                if recording.recording_id == d.recording_id:
                    return recording.position
        return d.stop_position

    def _wire_descriptor(self, session: ControlSession, correlation_id: int, d: RecordingDescriptor) -> Any:
        try:
            stripped = ChannelUri.parse(d.channel).canonical_form()
        except ValueError:
            stripped = d.channel
        return cc.RecordingDescriptor(
            control_session_id=session.control_session_id,
            correlation_id=correlation_id,
            recording_id=d.recording_id,
            start_timestamp=d.start_time_ms,
            stop_timestamp=-1 if d.active else d.stop_time_ms,
            start_position=d.start_position,
            stop_position=NULL_POSITION if d.active else d.stop_position,
            initial_term_id=d.initial_term_id,
            segment_file_length=d.segment_length,
            term_buffer_length=d.term_length,
            mtu_length=d.mtu,
            session_id=d.session_id,
            stream_id=d.stream_id,
            stripped_channel=stripped,
            original_channel=d.channel,
            source_identity=d.source_identity,
        )

    def on_list_recordings(
        self, session: ControlSession, message: cc.ListRecordingsRequest | cc.ListRecordingsForUriRequest
    ) -> None:
        if session.pending is not None:
            session.flush()  # a listing whose last descriptor went out ends at its next step: take that step now
        if session.pending is not None:
            raise RequestError(ERR.ACTIVE_LISTING, "a listing is already in progress on this session")
        if message.record_count < 0:
            raise RequestError(ERR.GENERIC, f"record count {message.record_count} must not be negative")
        if message.record_count == 0:
            return  # Aeron's: a count of 0 sends nothing at all
        if message.from_recording_id < 0:
            raise RequestError(ERR.GENERIC, f"from recording id {message.from_recording_id} must not be negative")
        count = min(message.record_count, self.ctx.max_list_count)
        match: Callable[[RecordingDescriptor], bool] = lambda d: True  # noqa: E731
        if isinstance(message, cc.ListRecordingsForUriRequest):
            fragment, stream_id = message.channel, message.stream_id
            match = lambda d: d.stream_id == stream_id and fragment in d.channel  # noqa: E731
        session.pending = self._list(session, message.correlation_id, message.from_recording_id, count, match)
        session.flush()

    def _list(
        self,
        session: ControlSession,
        correlation_id: int,
        from_id: int,
        count: int,
        match: Callable[[RecordingDescriptor], bool],
    ) -> Iterator[Any]:
        """Descriptors from ``from_id`` on, then (if fewer than ``count``) Aeron's end of list: a
        RECORDING_UNKNOWN response whose relevantId is the id where the search stopped."""
        sent = 0
        recording_id = from_id
        while sent < count:
            if recording_id >= self.catalog.next_recording_id:
                yield cc.ControlResponse(
                    control_session_id=session.control_session_id,
                    correlation_id=correlation_id,
                    relevant_id=recording_id,
                    code=cc.ControlResponseCode.RECORDING_UNKNOWN,
                    version=cc.PROTOCOL_SEMANTIC_VERSION,
                    error_message="",
                )
                return
            try:
                d = self.catalog.recording(recording_id)
            except CatalogError:
                d = None
            recording_id += 1
            if d is None or d.state != RecordingState.VALID or not match(d):
                continue
            sent += 1
            yield self._wire_descriptor(session, correlation_id, d)

    def on_list_recording(self, session: ControlSession, message: cc.ListRecordingRequest) -> None:
        try:
            d = self._descriptor(message.recording_id)
        except RequestError:
            session.send_response(
                message.correlation_id, cc.ControlResponseCode.RECORDING_UNKNOWN, message.recording_id
            )
            return
        session.send(self._wire_descriptor(session, message.correlation_id, d))

    def on_find_last_matching_recording(
        self, session: ControlSession, message: cc.FindLastMatchingRecordingRequest
    ) -> None:
        found = NULL_POSITION
        for d in self.catalog.recordings():
            if (
                d.recording_id >= message.min_recording_id
                and d.state == RecordingState.VALID
                and d.session_id == message.session_id
                and d.stream_id == message.stream_id
                and message.channel in d.channel
            ):
                found = d.recording_id
        session.send_ok(message.correlation_id, found)

    def on_list_recording_subscriptions(
        self, session: ControlSession, message: cc.ListRecordingSubscriptionsRequest
    ) -> None:
        matching = [
            rs
            for rs in self.recording_subscriptions.values()
            if message.channel in rs.channel
            and (message.apply_stream_id != cc.BooleanType.TRUE or rs.stream_id == message.stream_id)
        ]
        start = max(message.pseudo_index, 0)
        chosen = matching[start : start + max(min(message.subscription_count, self.ctx.max_list_count), 0)]
        for rs in chosen:
            session.send(
                cc.RecordingSubscriptionDescriptor(
                    control_session_id=session.control_session_id,
                    correlation_id=message.correlation_id,
                    subscription_id=rs.subscription_id,
                    stream_id=rs.stream_id,
                    stripped_channel=rs.channel,
                )
            )
        if len(chosen) < message.subscription_count:
            session.send_response(message.correlation_id, cc.ControlResponseCode.SUBSCRIPTION_UNKNOWN, 0)

    def on_position_request(self, session: ControlSession, message: Any) -> None:
        d = self._descriptor(message.recording_id)
        recorded = self._recorded_position(d)
        if isinstance(message, cc.StartPositionRequest):
            position = d.start_position
        elif isinstance(message, cc.StopPositionRequest):
            position = NULL_POSITION if d.active else d.stop_position
        elif isinstance(message, cc.RecordingPositionRequest):
            position = recorded if d.active else NULL_POSITION
        else:  # MaxRecordedPositionRequest
            position = recorded
        session.send_ok(message.correlation_id, position)

    def on_position_at_time(self, session: ControlSession, message: cc.RecordingPositionAtTimeRequest) -> None:
        d = self._descriptor(message.recording_id)
        position = seek_time(self.ctx.archive_dir, d, message.time, self._recorded_position(d))
        session.send_ok(message.correlation_id, position)

    # -- replays ------------------------------------------------------------------------------------------------
    def on_replay(self, session: ControlSession, message: cc.ReplayRequest | cc.BoundedReplayRequest) -> None:
        if len(self.replays) >= self.ctx.max_concurrent_replays:
            raise RequestError(ERR.MAX_REPLAYS, f"max concurrent replays reached ({self.ctx.max_concurrent_replays})")
        d = self._descriptor(message.recording_id)
        position = d.start_position if message.position == NULL_POSITION else message.position
        if message.length in _FOLLOW_LENGTHS:
            length: int | None = None
        elif message.length < 0:
            raise RequestError(
                ERR.GENERIC, f"replay length {message.length} is negative (-1 follows the recording to its end)"
            )
        else:
            length = message.length
            if not d.active and position + length > d.stop_position and position < d.stop_position:
                length = d.stop_position - position  # Aeron clips a length past the end of a stopped recording
        if position < d.start_position and d.start_position > 0:
            raise RequestError(
                ERR.INVALID_POSITION,
                f"replay position {position} is before recording {d.recording_id}'s start position "
                f"{d.start_position} (the segments before it were purged)",
            )
        limit: Callable[[], int] | None = None
        if isinstance(message, cc.BoundedReplayRequest):
            limit = self._counter_reader(message.limit_counter_id)
        try:
            replay = Replay(
                self.aeron,
                self.ctx.archive_dir,
                d.recording_id,
                stream_id=message.replay_stream_id,
                position=position,
                length=length,
                channel=message.replay_channel,
                connect_timeout_ns=self.ctx.connect_timeout_ns,
                limit_position=limit,
            )
        except ReplayError as e:
            raise RequestError(ERR.INVALID_POSITION if "position" in str(e) else ERR.GENERIC, str(e)) from None
        replay_id = self._next_replay_id
        self._next_replay_id += 1
        replay_session_id = (replay_id << 32) | (replay.session_id & 0xFFFFFFFF)
        self.replays[replay_id] = ReplaySlot(
            replay_session_id, session.control_session_id, message.correlation_id, replay
        )
        self.counters.replays_started.increment()
        session.send_ok(message.correlation_id, replay_session_id)

    def _counter_reader(self, counter_id: int) -> Callable[[], int]:
        from logbuf import native
        from logbuf.conduit import counters_descriptor as cd

        cnc = self.aeron.cnc
        in_range = 0 <= counter_id < len(cnc.counters_values) // cd.COUNTER_LENGTH
        state_offset = cd.metadata_offset(counter_id) + cd.RECORD_STATE_OFFSET if in_range else 0
        if not in_range or native.get_int32_volatile(cnc.counters_metadata, state_offset) != cd.RECORD_ALLOCATED:
            raise RequestError(ERR.GENERIC, f"limit counter id {counter_id} is not an allocated counter of this driver")
        values, offset = cnc.counters_values, cd.values_offset(counter_id)
        return lambda: native.get_int64_volatile(values, offset)

    def _replay_ended(self, replay_id: int, slot: ReplaySlot) -> None:
        self.replays.pop(replay_id, None)
        if slot.replay.error is not None and not slot.replay.subscriber_left:
            self.counters.errors.increment()
            session = self.sessions.get(slot.control_session_id)
            if session is not None and session.state is SessionState.ACTIVE:
                # logbuf's addition: Aeron ends a failed replay's image and says nothing; this names why
                session.send_error(
                    slot.correlation_id, ERR.GENERIC, f"replay {slot.replay_session_id} failed: {slot.replay.error}"
                )

    def on_stop_replay(self, session: ControlSession, message: cc.StopReplayRequest) -> None:
        replay_id = message.replay_session_id >> 32
        slot = self.replays.get(replay_id)
        if slot is None or slot.replay_session_id != message.replay_session_id:
            raise RequestError(ERR.UNKNOWN_REPLAY, f"no active replay {message.replay_session_id}")
        slot.replay.close()
        self._replay_ended(replay_id, slot)
        session.send_ok(message.correlation_id)

    def on_stop_all_replays(self, session: ControlSession, message: cc.StopAllReplaysRequest) -> None:
        for replay_id, slot in tuple(self.replays.items()):
            if message.recording_id == NULL_POSITION or slot.replay.recording_id == message.recording_id:
                slot.replay.close()
                self._replay_ended(replay_id, slot)
        session.send_ok(message.correlation_id)

    # -- storage ------------------------------------------------------------------------------------------------
    def _check_not_in_use(self, recording_id: int, what: str) -> RecordingDescriptor:
        d = self._descriptor(recording_id)
        if d.active:
            raise RequestError(ERR.ACTIVE_RECORDING, f"cannot {what} recording {recording_id}: it is being recorded")
        if any(slot.replay.recording_id == recording_id for slot in self.replays.values()):
            raise RequestError(ERR.ACTIVE_RECORDING, f"cannot {what} recording {recording_id}: it is being replayed")
        return d

    def on_truncate_recording(self, session: ControlSession, message: cc.TruncateRecordingRequest) -> None:
        self._check_not_in_use(message.recording_id, "truncate")
        try:
            truncate_recording(self.catalog, message.recording_id, message.position)
        except CatalogError as e:
            raise RequestError(ERR.INVALID_POSITION, str(e)) from None
        session.send_ok(message.correlation_id)

    def on_purge_recording(self, session: ControlSession, message: cc.PurgeRecordingRequest) -> None:
        self._check_not_in_use(message.recording_id, "purge")
        delete_recording(self.catalog, message.recording_id)
        session.send_ok(message.correlation_id)

    def on_purge_segments(self, session: ControlSession, message: cc.PurgeSegmentsRequest) -> None:
        d = self._descriptor(message.recording_id)
        if any(slot.replay.recording_id == d.recording_id for slot in self.replays.values()):
            raise RequestError(ERR.ACTIVE_RECORDING, f"recording {d.recording_id} is being replayed")
        if not d.start_position <= message.new_start_position <= d.stop_position:
            raise RequestError(
                ERR.INVALID_POSITION,
                f"new start position {message.new_start_position} is outside recording {d.recording_id}'s "
                f"{d.start_position}..{d.stop_position}",
            )
        removed = purge_segments(self.catalog, d.recording_id, before_position=message.new_start_position)
        session.send_ok(message.correlation_id, len(removed))
