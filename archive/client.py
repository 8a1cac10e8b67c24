"""``ArchiveClient``: Aeron's ``AeronArchive`` for Python, talking to a local or remote archive service.

    with ArchiveClient.connect(ArchiveClientContext()) as archive:            # local (IPC)
        for d in archive.list_recordings():
            print(d.recording_id, d.start_position, d.stop_position)
        subscription = archive.replay(0, stream_id=99)                        # an IPC replay

    remote = ArchiveClientContext(
        control_channel="aeron:udp?endpoint=10.0.0.1:8010",
        response_channel="aeron:udp?endpoint=10.0.0.2:8020",                  # this host, a free port
    )

Theory of operation. The client adds a subscription on its response channel and an exclusive
publication to the service's control channel, sends a connect request naming the response channel, and
waits for the OK that carries its control session id (answering a challenge first if the service asks
for one). Each request carries a fresh correlation id; the client polls its response stream until the
response with that id arrives (descriptors of a listing arrive first, then Aeron's end-of-list
response), and turns an ERROR into an exception named after its cause. As Aeron's ``AeronArchive`` does
from its duty cycle, the client keeps its session alive: every request and :meth:`ArchiveClient.poll`
count as traffic, and a daemon keep-alive thread (``keep_alive_thread``, on by default) sends a
``KeepAliveRequest`` when nothing was sent for ``keep_alive_interval_ns``, so an idle client is not
closed by the service's session timeout. One lock serialises the control publication between the
caller and that thread. :meth:`ArchiveClient.poll` still notices a service that went away.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from logbuf.archive import control_codec as cc
from logbuf.archive.archive_conductor import NULL_LENGTH, NULL_POSITION, challenge_answer
from logbuf.archive.service_context import DEFAULT_CONTROL_STREAM_ID
from logbuf.client import Aeron, Context, Publication, Subscription
from logbuf.durations import format_duration_ns, renamed_duration_keywords
from logbuf.errors import LogbufError
from logbuf.logbuffer.fragment_assembler import FragmentAssembler
from logbuf.logbuffer.publication import OfferResult

__all__ = [
    "ArchiveClient",
    "ArchiveClientContext",
    "ArchiveError",
    "ArchiveNotConnectedError",
    "ArchiveRequestError",
    "ArchiveTimeoutError",
    "AuthenticationRejectedError",
    "InvalidPositionError",
    "RecordingUnknownError",
    "DEFAULT_RESPONSE_STREAM_ID",
    "replay_image_session_id",
]

DEFAULT_RESPONSE_STREAM_ID = 20
"""Aeron Archive's default control response stream id."""


def replay_image_session_id(replay_session_id: int) -> int:
    """The replay image's session id: the low 32 bits of the replay session id, as a signed int32."""
    return ((replay_session_id & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


_Answer = TypeVar("_Answer", cc.SyncDigests, cc.SyncFrames)


class ArchiveError(LogbufError):
    """Base of the archive client's errors."""


class ArchiveTimeoutError(ArchiveError):
    """The service did not answer in time (the message says what was awaited)."""


class ArchiveNotConnectedError(ArchiveError):
    """No session with the service: never connected, closed, or the service went away."""


class ArchiveRequestError(ArchiveError):
    """The service answered a request with an error (``error_code``, and its message)."""

    def __init__(self, message: str, error_code: cc.ArchiveErrorCode, correlation_id: int) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.correlation_id = correlation_id


class RecordingUnknownError(ArchiveRequestError):
    """No such recording (or it was purged)."""


class InvalidPositionError(ArchiveRequestError):
    """A position out of the recording's range, or not at the start of a frame."""


class AuthenticationRejectedError(ArchiveRequestError):
    """The service refused the credentials (or needs them)."""


_ERROR_CLASSES: dict[int, type[ArchiveRequestError]] = {
    cc.ArchiveErrorCode.UNKNOWN_RECORDING: RecordingUnknownError,
    cc.ArchiveErrorCode.INVALID_POSITION: InvalidPositionError,
    cc.ArchiveErrorCode.AUTHENTICATION_REJECTED: AuthenticationRejectedError,
}


@renamed_duration_keywords(
    {
        "message_timeout_ms": ("message_timeout_ns", 1_000_000),
        "keep_alive_interval_ms": ("keep_alive_interval_ns", 1_000_000),
    }
)
@dataclass
class ArchiveClientContext:
    control_channel: str = "aeron:ipc"
    """The service's control channel: ``aeron:ipc`` on its host, ``aeron:udp?endpoint=HOST:PORT`` from another."""
    control_stream_id: int = DEFAULT_CONTROL_STREAM_ID
    response_channel: str = "aeron:ipc"
    """Where the service answers: ``aeron:ipc``, or ``aeron:udp?endpoint=THIS_HOST:PORT`` for a remote service."""
    response_stream_id: int = DEFAULT_RESPONSE_STREAM_ID
    driver_dir: str = ""
    """This host's media driver directory (when the client makes its own ``Aeron``)."""
    aeron: Aeron | None = None
    """Share an existing driver client (not closed by the archive client)."""
    message_timeout_ns: int = 5_000_000_000
    """How long to wait for the service to connect or to answer one request."""
    keep_alive_interval_ns: int = 2_000_000_000
    """Keep-alives while idle (the service closes a session that is silent for its session timeout)."""
    keep_alive_thread: bool = True
    """Send those keep-alives from a daemon thread; off: the caller must call ``poll()`` while idle."""
    auth_secret: bytes = b""
    """The service's shared secret, when it challenges connects."""
    client_info: str = "logbuf-python"


class ArchiveClient:
    """One control session with an archive service (see the module doc)."""

    def __init__(self, ctx: ArchiveClientContext) -> None:
        self.ctx = ctx
        self._owns_aeron = ctx.aeron is None
        self.aeron = ctx.aeron if ctx.aeron is not None else Aeron.connect(Context(dir=ctx.driver_dir))
        self.control_session_id = -1
        self._correlation = secrets.randbelow(1 << 48) + 1
        self._subscription: Subscription | None = None
        self._publication: Publication | None = None
        self._inbox: list[Any] = []
        self._assembler = FragmentAssembler(self._on_fragment)
        self._last_sent_ms = 0
        self._was_connected = False
        self._send_lock = threading.Lock()
        self._keep_alive_stop = threading.Event()
        self._keep_alive: threading.Thread | None = None
        self.keep_alives_sent = 0
        """Keep-alives sent (by ``poll()`` or the keep-alive thread)."""
        self.signals: list[cc.RecordingSignalEvent] = []
        """Recording signals received for this session (start/stop of recordings it started)."""
        self.errors: list[cc.ControlResponse] = []
        """Error responses not awaited by a request (a replay that failed while running)."""
        self._log = structlog.get_logger().bind(role="archive-client", control_channel=ctx.control_channel)

    # -- connecting ----------------------------------------------------------------------------------------
    @classmethod
    def connect(cls, ctx: ArchiveClientContext | None = None) -> ArchiveClient:
        client = cls(ctx or ArchiveClientContext())
        try:
            client._connect()
        except BaseException:
            client.close()
            raise
        return client

    def _connect(self) -> None:
        ctx = self.ctx
        self._subscription = self.aeron.add_subscription(ctx.response_channel, ctx.response_stream_id)
        self._publication = self.aeron.add_exclusive_publication(ctx.control_channel, ctx.control_stream_id)
        self._await(
            lambda: self._publication is not None and self._publication.is_connected,
            f"no archive service on {ctx.control_channel} stream {ctx.control_stream_id} (the control "
            f"publication did not connect within {format_duration_ns(ctx.message_timeout_ns)})",
        )
        correlation_id = self._next_correlation_id()
        if ctx.auth_secret:
            request: Any = cc.AuthConnectRequest(
                correlation_id=correlation_id,
                response_stream_id=ctx.response_stream_id,
                version=cc.PROTOCOL_SEMANTIC_VERSION,
                response_channel=ctx.response_channel,
                encoded_credentials=b"hmac-sha256",
                client_info=ctx.client_info,
            )
        else:
            request = cc.ConnectRequest(
                correlation_id=correlation_id,
                response_stream_id=ctx.response_stream_id,
                version=cc.PROTOCOL_SEMANTIC_VERSION,
                response_channel=ctx.response_channel,
            )
        self._send(request)
        while True:
            message = self._await_message(
                lambda m: isinstance(m, (cc.ControlResponse, cc.Challenge)) and m.correlation_id == correlation_id,
                f"the archive did not answer the connect request within {format_duration_ns(ctx.message_timeout_ns)} (is the response "
                f"channel {ctx.response_channel} reachable from the service? a remote service may also refuse this "
                "address or require authentication)",
            )
            if isinstance(message, cc.Challenge):
                if not ctx.auth_secret:
                    raise AuthenticationRejectedError(
                        "the archive requires authentication: give the shared secret",
                        cc.ArchiveErrorCode.AUTHENTICATION_REJECTED,
                        correlation_id,
                    )
                self.control_session_id = message.control_session_id
                self._send(
                    cc.ChallengeResponse(
                        control_session_id=message.control_session_id,
                        correlation_id=correlation_id,
                        encoded_credentials=challenge_answer(
                            ctx.auth_secret, message.encoded_challenge, message.control_session_id
                        ),
                    )
                )
                continue
            self._raise_if_error(message, "connect")
            self.control_session_id = message.control_session_id
            self._was_connected = True
            self._log.info("archive_client.connected", control_session_id=self.control_session_id)
            if ctx.keep_alive_thread:
                self._keep_alive = threading.Thread(
                    target=self._run_keep_alive, name="archive-client-keep-alive", daemon=True
                )
                self._keep_alive.start()
            return

    def _run_keep_alive(self) -> None:
        """The keep-alive thread: one try per half interval, never blocking on a full publication."""
        interval_ns = max(self.ctx.keep_alive_interval_ns, 1_000_000)
        while not self._keep_alive_stop.wait(interval_ns / 2e9):
            with self._send_lock:
                publication = self._publication
                if publication is None or self.control_session_id < 0:
                    return
                if (self._now_ms() - self._last_sent_ms) * 1_000_000 < interval_ns:
                    continue
                self._correlation += 1
                request = cc.KeepAliveRequest(
                    control_session_id=self.control_session_id, correlation_id=self._correlation
                )
                try:
                    if publication.offer(cc.encode(request)) >= 0:
                        self._last_sent_ms = self._now_ms()
                        self.keep_alives_sent += 1
                except LogbufError:
                    return  # closed under us; the caller's next request reports it

    # -- plumbing ------------------------------------------------------------------------------------------------
    def _next_correlation_id(self) -> int:
        with self._send_lock:
            self._correlation += 1
            return self._correlation

    def _now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def _await(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.ctx.message_timeout_ns / 1e9
        delay = 0.00005
        while not condition():
            if time.monotonic() > deadline:
                raise ArchiveTimeoutError(what)
            time.sleep(delay)
            delay = min(delay * 2, 0.002)

    def _send(self, message: Any) -> None:
        with self._send_lock:
            self._send_locked(message)

    def _send_locked(self, message: Any) -> None:
        publication = self._publication
        if publication is None:
            raise ArchiveNotConnectedError("the archive client is closed")
        data = cc.encode(message)
        deadline = time.monotonic() + self.ctx.message_timeout_ns / 1e9
        while (result := publication.offer(data)) < 0:
            if result in (OfferResult.CLOSED, OfferResult.MAX_POSITION_EXCEEDED):
                raise ArchiveNotConnectedError(f"the control publication is {OfferResult(result).name}")
            if result == OfferResult.NOT_CONNECTED and self._was_connected:
                raise ArchiveNotConnectedError(
                    f"the archive service on {self.ctx.control_channel} is gone (its control subscription no "
                    "longer reads this client's requests)"
                )
            if time.monotonic() > deadline:
                raise ArchiveTimeoutError(
                    f"could not send {type(message).__name__} to the archive within {format_duration_ns(self.ctx.message_timeout_ns)} "
                    f"({OfferResult(result).name})"
                )
            time.sleep(0.0001)
        self._last_sent_ms = self._now_ms()

    def _on_fragment(self, payload: memoryview, header: Any) -> None:
        try:
            message = cc.decode(payload)
        except cc.ControlCodecError as e:
            self._log.warning("archive_client.undecodable_response", error=str(e))
            return
        session_id = getattr(message, "control_session_id", None)
        if self.control_session_id >= 0 and session_id is not None and session_id != self.control_session_id:
            return  # another client's session on the same response stream
        if isinstance(message, cc.RecordingSignalEvent):
            self.signals.append(message)
        self._inbox.append(message)

    def _poll_responses(self) -> int:
        subscription = self._subscription
        if subscription is None:
            raise ArchiveNotConnectedError("the archive client is closed")
        return subscription.poll(self._assembler, 64)

    def _check_alive(self) -> None:
        subscription = self._subscription
        if self._was_connected and subscription is not None and not subscription.is_connected:
            self._was_connected = False
            raise ArchiveNotConnectedError(
                f"the archive service on {self.ctx.control_channel} is gone: its response stream closed "
                "(the service stopped or closed this session)"
            )

    def _await_message(self, match: Callable[[Any], bool], what: str) -> Any:
        deadline = time.monotonic() + self.ctx.message_timeout_ns / 1e9
        delay = 0.00005
        while True:
            for i, message in enumerate(self._inbox):
                if match(message):
                    del self._inbox[i]
                    return message
            if len(self._inbox) > 1024:  # nobody awaits these: keep the newest only
                del self._inbox[:-256]
            if self._poll_responses():
                delay = 0.00005
                continue
            self._check_alive()
            if time.monotonic() > deadline:
                raise ArchiveTimeoutError(what)
            time.sleep(delay)
            delay = min(delay * 2, 0.002)

    def _raise_if_error(self, message: Any, what: str) -> None:
        if not isinstance(message, cc.ControlResponse) or message.code == cc.ControlResponseCode.OK:
            return
        if message.code == cc.ControlResponseCode.ERROR:
            try:
                code = cc.ArchiveErrorCode(message.relevant_id)
            except ValueError:
                code = cc.ArchiveErrorCode.GENERIC
            cls = _ERROR_CLASSES.get(code, ArchiveRequestError)
            raise cls(f"archive {what} failed ({code.name}): {message.error_message}", code, message.correlation_id)
        if message.code == cc.ControlResponseCode.RECORDING_UNKNOWN:
            raise RecordingUnknownError(
                f"archive {what} failed: unknown recording {message.relevant_id}",
                cc.ArchiveErrorCode.UNKNOWN_RECORDING,
                message.correlation_id,
            )
        raise ArchiveRequestError(
            f"archive {what} failed ({message.code.name}, relevant id {message.relevant_id})",
            cc.ArchiveErrorCode.GENERIC,
            message.correlation_id,
        )

    def _request(self, build: Callable[[int], Any], what: str) -> int:
        """Send a request and await its ControlResponse; returns its relevantId (raises on error)."""
        self._check_session()
        correlation_id = self._next_correlation_id()
        self._send(build(correlation_id))
        response = self._await_message(
            lambda m: isinstance(m, cc.ControlResponse) and m.correlation_id == correlation_id,
            f"the archive did not answer {what} within {format_duration_ns(self.ctx.message_timeout_ns)}",
        )
        self._raise_if_error(response, what)
        return int(response.relevant_id)

    def _session_request(self, message_type: Callable[..., Any], what: str, **fields: Any) -> int:
        """:meth:`_request` of ``message_type(**fields)`` stamped with this client's session id and the
        request's correlation id."""
        sid = self.control_session_id
        return self._request(lambda c: message_type(control_session_id=sid, correlation_id=c, **fields), what)

    def _check_session(self) -> None:
        if self.control_session_id < 0 or self._publication is None:
            raise ArchiveNotConnectedError("not connected to an archive service")

    # -- the public API --------------------------------------------------------------------------------------------
    def poll(self) -> int:
        """Take responses that arrived (signals, errors of running replays), send a keep-alive when due, and
        raise :class:`ArchiveNotConnectedError` if the service went away. Call it now and then while idle."""
        self._check_session()
        n = self._poll_responses()
        for message in list(self._inbox):
            if isinstance(message, cc.ControlResponse) and message.code == cc.ControlResponseCode.ERROR:
                self.errors.append(message)
                self._inbox.remove(message)
        self._check_alive()
        if (self._now_ms() - self._last_sent_ms) * 1_000_000 >= self.ctx.keep_alive_interval_ns:
            self._send(
                cc.KeepAliveRequest(
                    control_session_id=self.control_session_id, correlation_id=self._next_correlation_id()
                )
            )
            self.keep_alives_sent += 1
        return n

    def archive_id(self) -> int:
        return self._session_request(cc.ArchiveIdRequest, "archive id")

    def start_recording(self, channel: str, stream_id: int, *, remote: bool = False, auto_stop: bool = False) -> int:
        """Record every image of ``channel``/``stream_id`` (a UDP channel on this driver is spied unless
        ``remote``); returns the recording subscription id."""
        return self._session_request(
            cc.StartRecordingRequest2,
            f"start recording of {channel} stream {stream_id}",
            stream_id=stream_id,
            source_location=cc.SourceLocation.REMOTE if remote else cc.SourceLocation.LOCAL,
            auto_stop=cc.BooleanType.TRUE if auto_stop else cc.BooleanType.FALSE,
            channel=channel,
        )

    def stop_recording(self, channel: str, stream_id: int) -> None:
        self._session_request(
            cc.StopRecordingRequest,
            f"stop recording of {channel} stream {stream_id}",
            stream_id=stream_id,
            channel=channel,
        )

    def stop_recording_subscription(self, subscription_id: int) -> None:
        self._session_request(
            cc.StopRecordingSubscriptionRequest,
            f"stop recording subscription {subscription_id}",
            subscription_id=subscription_id,
        )

    def stop_recording_by_identity(self, recording_id: int) -> bool:
        return bool(
            self._session_request(
                cc.StopRecordingByIdentityRequest, f"stop recording {recording_id}", recording_id=recording_id
            )
        )

    def list_recordings(
        self,
        from_recording_id: int = 0,
        count: int = 10_000,
        *,
        channel_fragment: str | None = None,
        stream_id: int = 0,
    ) -> list[cc.RecordingDescriptor]:
        """Descriptors of VALID recordings from ``from_recording_id`` (those whose channel contains
        ``channel_fragment`` and whose stream is ``stream_id``, when a fragment is given). An active
        recording's ``stop_position`` is -1 (Aeron's): ask :meth:`recording_position`."""
        self._check_session()
        sid = self.control_session_id
        correlation_id = self._next_correlation_id()
        if channel_fragment is None:
            request: Any = cc.ListRecordingsRequest(
                control_session_id=sid,
                correlation_id=correlation_id,
                from_recording_id=from_recording_id,
                record_count=count,
            )
        else:
            request = cc.ListRecordingsForUriRequest(
                control_session_id=sid,
                correlation_id=correlation_id,
                from_recording_id=from_recording_id,
                record_count=count,
                stream_id=stream_id,
                channel=channel_fragment,
            )
        self._send(request)
        found: list[cc.RecordingDescriptor] = []
        while len(found) < count:
            message = self._await_message(
                lambda m: (
                    getattr(m, "correlation_id", None) == correlation_id
                    and isinstance(m, (cc.RecordingDescriptor, cc.ControlResponse))
                ),
                f"the archive did not finish listing recordings within {format_duration_ns(self.ctx.message_timeout_ns)}",
            )
            if isinstance(message, cc.RecordingDescriptor):
                found.append(message)
                continue
            if message.code == cc.ControlResponseCode.RECORDING_UNKNOWN:
                break  # the end of the list
            self._raise_if_error(message, "list recordings")
            break
        return found

    def list_recording(self, recording_id: int) -> cc.RecordingDescriptor:
        """One recording's descriptor (:class:`RecordingUnknownError` if there is none)."""
        self._check_session()
        sid = self.control_session_id
        correlation_id = self._next_correlation_id()
        self._send(
            cc.ListRecordingRequest(control_session_id=sid, correlation_id=correlation_id, recording_id=recording_id)
        )
        message = self._await_message(
            lambda m: (
                getattr(m, "correlation_id", None) == correlation_id
                and isinstance(m, (cc.RecordingDescriptor, cc.ControlResponse))
            ),
            f"the archive did not describe recording {recording_id} within {format_duration_ns(self.ctx.message_timeout_ns)}",
        )
        if isinstance(message, cc.RecordingDescriptor):
            return message
        self._raise_if_error(message, f"describe recording {recording_id}")
        raise ArchiveError(f"unexpected answer to describe recording {recording_id}: {message}")

    def _position(self, cls: Any, recording_id: int, what: str) -> int:
        return self._session_request(cls, f"{what} of recording {recording_id}", recording_id=recording_id)

    def recording_position(self, recording_id: int) -> int:
        """The recorded position of an active recording (-1 if it is not active)."""
        return self._position(cc.RecordingPositionRequest, recording_id, "recording position")

    def stop_position(self, recording_id: int) -> int:
        """A stopped recording's stop position (-1 while it is active)."""
        return self._position(cc.StopPositionRequest, recording_id, "stop position")

    def start_position(self, recording_id: int) -> int:
        return self._position(cc.StartPositionRequest, recording_id, "start position")

    def max_recorded_position(self, recording_id: int) -> int:
        """The recorded position if active, else the stop position."""
        return self._position(cc.MaxRecordedPositionRequest, recording_id, "max recorded position")

    def position_at_time(self, recording_id: int, time_value: int) -> int:
        """The position of the recording's first message whose reserved value (the publisher's timestamp) is
        at least ``time_value``, or its recorded position if none is: the archive seeks its time index (a
        logbuf extension request, so this works from any host)."""
        return self._session_request(
            cc.RecordingPositionAtTimeRequest,
            f"position at time {time_value} of recording {recording_id}",
            recording_id=recording_id,
            time=time_value,
        )

    def find_last_matching_recording(
        self, min_recording_id: int, channel_fragment: str, stream_id: int, session_id: int
    ) -> int:
        return self._session_request(
            cc.FindLastMatchingRecordingRequest,
            "find last matching recording",
            min_recording_id=min_recording_id,
            session_id=session_id,
            stream_id=stream_id,
            channel=channel_fragment,
        )

    def start_replay(
        self,
        recording_id: int,
        *,
        stream_id: int,
        channel: str = "aeron:ipc",
        position: int | None = None,
        length: int | None = None,
        limit_counter_id: int | None = None,
    ) -> int:
        """Start a replay (``position`` None: from the start; ``length`` None: follow the recording until it
        stops); returns the replay session id, whose low 32 bits are the replay image's session id."""
        fields: dict[str, Any] = {
            "control_session_id": self.control_session_id,
            "recording_id": recording_id,
            "position": NULL_POSITION if position is None else position,
            "length": NULL_LENGTH if length is None else length,
            "replay_stream_id": stream_id,
            "file_io_max_length": cc.NULL_INT32,
            "replay_token": cc.NULL_INT64,
            "replay_channel": channel,
        }
        if limit_counter_id is None:
            return self._request(
                lambda c: cc.ReplayRequest(correlation_id=c, **fields), f"replay of recording {recording_id}"
            )
        return self._request(
            lambda c: cc.BoundedReplayRequest(correlation_id=c, limit_counter_id=limit_counter_id, **fields),
            f"bounded replay of recording {recording_id}",
        )

    def replay(
        self,
        recording_id: int,
        *,
        stream_id: int,
        channel: str = "aeron:ipc",
        position: int | None = None,
        length: int | None = None,
    ) -> tuple[Subscription, int]:
        """Subscribe to ``channel``/``stream_id`` and start a replay into it; returns the subscription and the
        replay session id (:func:`replay_image_session_id` of it is the replay image's session id)."""
        subscription = self.aeron.add_subscription(channel, stream_id)
        try:
            replay_session_id = self.start_replay(
                recording_id, stream_id=stream_id, channel=channel, position=position, length=length
            )
        except BaseException:
            subscription.close()
            raise
        return subscription, replay_session_id

    def replicate(
        self,
        src_recording_id: int,
        src_control_channel: str,
        *,
        src_control_stream_id: int = DEFAULT_CONTROL_STREAM_ID,
        dst_recording_id: int = -1,
        stop_position: int = NULL_POSITION,
        replication_channel: str = "",
        src_response_channel: str = "",
        src_auth_secret: bytes = b"",
        live_destination: str = "",
    ) -> int:
        """Ask this archive (the destination) to copy ``src_recording_id`` from the archive on
        ``src_control_channel`` (Aeron's ReplicateRequest2); returns the replication id. ``stop_position`` -1
        copies to the source recording's end, following it while it records; ``dst_recording_id`` -1 makes a
        new copy, or extends this archive's copy of the same source recording if it has one. A remote source
        needs ``src_response_channel`` (this host's endpoint for its answers) and ``replication_channel``
        (this host's endpoint for the replay). With ``live_destination`` (a channel this archive can subscribe
        to for the source's live stream) a followed copy merges onto the live stream once caught up: it copies
        from the live image and drops the replay (a MERGE signal). Progress arrives as recording signals
        (:attr:`signals`)."""
        return self._session_request(
            cc.ReplicateRequest2,
            f"replicate recording {src_recording_id} from {src_control_channel}",
            src_recording_id=src_recording_id,
            dst_recording_id=dst_recording_id,
            stop_position=stop_position,
            channel_tag_id=cc.NULL_INT64,
            subscription_tag_id=cc.NULL_INT64,
            src_control_stream_id=src_control_stream_id,
            file_io_max_length=cc.NULL_INT32,
            replication_session_id=cc.NULL_INT32,
            src_control_channel=src_control_channel,
            live_destination=live_destination,
            replication_channel=replication_channel,
            encoded_credentials=src_auth_secret,
            src_response_channel=src_response_channel,
        )

    def _ask(self, request: Any, answer: type[_Answer], what: str) -> _Answer:
        """Send ``request`` (its session and correlation ids are this client's) and await its ``answer``
        message, or raise the archive's error."""
        self._check_session()
        correlation_id = self._next_correlation_id()
        self._send(
            dataclasses.replace(request, control_session_id=self.control_session_id, correlation_id=correlation_id)
        )
        response = self._await_message(
            lambda m: isinstance(m, (answer, cc.ControlResponse)) and m.correlation_id == correlation_id,
            f"the archive did not answer {what} within {format_duration_ns(self.ctx.message_timeout_ns)}",
        )
        self._raise_if_error(response, what)
        if not isinstance(response, answer):
            raise ArchiveRequestError(
                f"archive {what}: unexpected {response.code.name}", cc.ArchiveErrorCode.GENERIC, correlation_id
            )
        return response

    def sync_digests(self, request: cc.SyncDigestRequest) -> cc.SyncDigests:
        """The archive's digests of a history's blocks (a logbuf extension: :mod:`logbuf.archive.sync` drives
        the rounds)."""
        return self._ask(request, cc.SyncDigests, "a sync digest request")

    def sync_frames(self, request: cc.SyncFramesRequest) -> cc.SyncFrames:
        """The archive's frames of a history that overlap a range, as stored (a logbuf extension)."""
        return self._ask(request, cc.SyncFrames, "a sync frames request")

    def sync_repair(self, request: cc.SyncRepairRequest) -> int:
        """Ask the archive to replace its failing frames with verifying ones; returns the bytes written."""
        return self._session_request(
            functools.partial(dataclasses.replace, request), f"sync repair at position {request.position}"
        )

    def stop_replication(self, replication_id: int) -> None:
        self._session_request(
            cc.StopReplicationRequest, f"stop replication {replication_id}", replication_id=replication_id
        )

    def stop_replay(self, replay_session_id: int) -> None:
        self._session_request(
            cc.StopReplayRequest, f"stop replay {replay_session_id}", replay_session_id=replay_session_id
        )

    def stop_all_replays(self, recording_id: int = NULL_POSITION) -> None:
        self._session_request(cc.StopAllReplaysRequest, "stop all replays", recording_id=recording_id)

    def truncate_recording(self, recording_id: int, position: int) -> None:
        self._session_request(
            cc.TruncateRecordingRequest,
            f"truncate recording {recording_id}",
            recording_id=recording_id,
            position=position,
        )

    def purge_recording(self, recording_id: int) -> None:
        self._session_request(cc.PurgeRecordingRequest, f"purge recording {recording_id}", recording_id=recording_id)

    def purge_segments(self, recording_id: int, new_start_position: int) -> int:
        """Drop whole segments before ``new_start_position``; returns how many went."""
        return self._session_request(
            cc.PurgeSegmentsRequest,
            f"purge segments of recording {recording_id}",
            recording_id=recording_id,
            new_start_position=new_start_position,
        )

    # -- closing ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._keep_alive_stop.set()
        if self._keep_alive is not None:
            self._keep_alive.join(5)
            self._keep_alive = None
        if self._publication is not None and self.control_session_id >= 0 and self._publication.is_connected:
            try:
                self._publication.offer(cc.encode(cc.CloseSessionRequest(control_session_id=self.control_session_id)))
            except LogbufError:
                pass
        self.control_session_id = -1
        for resource in (self._publication, self._subscription):
            if resource is not None:
                try:
                    resource.close()
                except LogbufError:
                    pass
        self._publication = self._subscription = None
        if self._owns_aeron:
            self.aeron.close()

    def __enter__(self) -> ArchiveClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
