"""The relay's attachment to the media driver, rebuilt whenever it is lost.

Theory of operation
-------------------
Everything the relay holds in the driver is one *session*: an Aeron client, the event stream's
subscription (serving roles) and its exclusive publication with the ingest that feeds it (ingest
roles). The websocket server, its frame files and its clients are not part of it: they outlive any
number of sessions, so a lost driver costs clients new events for a while, never their connection.

A session is lost when the driver stops heartbeating (the client's conductor reports a
``DriverTimeoutError``), when the driver times the client out (a process paused longer than the
liveness timeout: ``ON_CLIENT_TIMEOUT``), when its subscription or publication is closed under it,
when the ingest's offer sees ``CLOSED``, or when the embedded driver's duty cycle has stopped.
:meth:`Supervisor.poll` (called by ``logbuf-jetstream`` every 200 ms) notices it, tears the session
down (stops the ingest, detaches the subscription from the server, closes the client) and builds a
new one, retrying with back-off (0.5 s doubling to 10 s) while no driver can be had:

* ``--driver embedded`` (or ``auto`` that started one): the driver this process runs is reused if its
  duty cycle still runs and heartbeats, else closed and started again in the same directory;
* ``--driver external``: wait for a live driver in the directory (a driver restarted by its service);
* ``auto`` with an external driver that died: start one here.

The new ingest starts from a floor: the newest event the server holds (``--role all``) or the last
one published (``--role ingest``). A generator's clock continues above it; an upstream is asked for
``floor - rewind`` and drops what it already had, so the events that were in the old log but not yet
read by the server come again and nothing is served twice. The recorder (``--record``) reconnects by
itself. Fatal problems are raised as :class:`RelayStopped`: a refused upstream (the ingest's own
error) and a stream another relay took meanwhile (:class:`jetstream.stream_lock.StreamTakenError`).
Only lifecycle is logged: ``jetstream.driver_lost``, ``jetstream.driver_waiting``,
``jetstream.driver_reconnected``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from logbuf.client import Aeron, Context, Publication, Subscription
from logbuf.conduit.cnc import is_driver_active
from logbuf.directory import resolve_dir
from logbuf.driver.context import DriverContext
from logbuf.driver.media_driver import MediaDriver
from logbuf.errors import LogbufError
from logbuf.jetstream.ingest import Ingest, PublicationClosedError, Source
from logbuf.jetstream.stream_lock import StreamLock, StreamTakenError

__all__ = ["EMBEDDED_IPC_TERM_LENGTH", "RelayStopped", "Supervisor", "SupervisorSettings"]

EMBEDDED_IPC_TERM_LENGTH: Final = 16 * 1024 * 1024
"""Term length of the embedded driver's IPC logs: 8 MiB window (~16 s of the generator's output),
largest message 2 MiB (real events reach ~1 MB); 3 terms = 48 MiB of /dev/shm."""
RETRY_INITIAL_S: Final = 0.5
RETRY_MAX_S: Final = 10.0
DETACH_TIMEOUT_S: Final = 5.0


class RelayStopped(LogbufError):
    """A problem a reconnect cannot fix; the message says what (``logbuf-jetstream`` exits with it)."""


class _NoDriver(LogbufError):
    """No driver to connect to yet (external mode): retry later."""


@dataclass(frozen=True)
class SupervisorSettings:
    driver_mode: str  # auto | embedded | external
    driver_dir: str | None
    driver_timeout_ns: int
    channel: str
    stream_id: int
    publish: bool  # --role all / ingest: hold the stream lock, publish, run the ingest
    subscribe: bool  # --role all / serve: subscribe and hand the subscription to the server
    holder: str  # written into the stream lock (who publishes), e.g. the listen address
    topics_stream_id: int | None = None  # also publish each event on this stream, its collection as the topic


class _Session:
    def __init__(self) -> None:
        self.aeron: Aeron | None = None
        self.subscription: Subscription | None = None
        self.publication: Publication | None = None
        self.ingest: Ingest | None = None
        self.lost = threading.Event()
        self.reason = ""

    def on_client_error(self, error: BaseException) -> None:  # the client conductor's thread
        if not self.lost.is_set():
            self.reason = f"{type(error).__name__}: {error}"
            self.lost.set()


class Supervisor:
    """Holds the session with the driver and rebuilds it; see the module docstring.

    ``make_source(floor_us)``: a fresh ingest source that publishes nothing at or below ``floor_us``.
    ``floor_us()``: the floor for a new ingest (called after the old one stopped).
    ``attach(subscription)``: hand the server its subscription (None: detach); must have taken effect
    when it returns.
    """

    def __init__(
        self,
        settings: SupervisorSettings,
        *,
        make_source: Callable[[int], Source] | None,
        floor_us: Callable[[], int],
        attach: Callable[[Subscription | None], None],
        log: Any,
    ) -> None:
        self.settings = settings
        self.directory = resolve_dir(settings.driver_dir)
        self._make_source = make_source
        self._floor_us = floor_us
        self._attach = attach
        self._log = log
        self.driver: MediaDriver | None = None
        self._lock: StreamLock | None = None
        self._session: _Session | None = None
        self._lost_at = 0.0
        self._retry_at = 0.0
        self._retry_s = RETRY_INITIAL_S
        self.reconnects = 0
        self._driver_ensured = False
        self.last_ingest_time_us = 0

    @property
    def ingest(self) -> Ingest | None:
        return None if self._session is None else self._session.ingest

    @property
    def connected(self) -> bool:
        return self._session is not None

    # -- lifecycle ----------------------------------------------------------------------------------------

    def ensure_driver(self) -> None:
        """Make sure there is a driver to connect to (before :meth:`start`, e.g. for a recorder);
        raises ``LogbufError`` when there is none and none may be started here."""
        try:
            self._ensure_driver()
        except _NoDriver as e:
            raise LogbufError(str(e)) from None
        self._driver_ensured = True

    def start(self, floor_us: int) -> None:
        """The first session; problems here are raised (``LogbufError``, ``StreamTakenError``)."""
        if not self._driver_ensured:
            self.ensure_driver()
        self._session = self._open_session(floor_us)

    def poll(self) -> None:
        """Notice a lost session and rebuild it (when its retry is due); raises :class:`RelayStopped`."""
        session = self._session
        if session is not None:
            reason = self._lost_reason(session)
            if reason is None:
                return
            self._lost_at = time.monotonic()
            self._log.warning("jetstream.driver_lost", reason=reason, driver_dir=self.directory)
            self._close_session(session)
            self._session = None
            self._retry_at = 0.0
            self._retry_s = RETRY_INITIAL_S
        if time.monotonic() < self._retry_at:
            return
        try:
            self._ensure_driver()
            floor = self._floor_us()
            self._session = self._open_session(floor)
        except StreamTakenError as e:
            raise RelayStopped(str(e)) from None
        except (_NoDriver, LogbufError, OSError) as e:
            self._retry_at = time.monotonic() + self._retry_s
            self._log.warning(
                "jetstream.driver_waiting", error=str(e), driver_dir=self.directory, retry_in_s=self._retry_s
            )
            self._retry_s = min(self._retry_s * 2, RETRY_MAX_S)
            return
        self.reconnects += 1
        self._log.info(
            "jetstream.driver_reconnected",
            driver_dir=self.directory,
            outage_s=round(time.monotonic() - self._lost_at, 3),
            floor_us=floor,
            embedded=self.driver is not None,
        )

    def close(self) -> None:
        if self._session is not None:
            self._close_session(self._session)
            self._session = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self.driver is not None:
            self.driver.close()
            self.driver = None

    # -- the driver ---------------------------------------------------------------------------------------

    def _ensure_driver(self) -> None:
        s = self.settings
        if self.driver is not None:
            if self.driver.runner.is_running and is_driver_active(self.directory, timeout_ns=s.driver_timeout_ns):
                return
            self._log.warning("jetstream.driver_restarting", driver_dir=self.directory)
            self.driver.close()  # removes its directory: a new driver starts there clean
            self.driver = None
        elif s.driver_mode != "embedded" and is_driver_active(self.directory, timeout_ns=s.driver_timeout_ns):
            self._log.info("jetstream.driver_connected", driver_dir=self.directory)
            return
        if s.driver_mode == "external":
            raise _NoDriver(f"no running media driver in {self.directory} (--driver external)")
        ctx = DriverContext(
            dir=self.directory,
            ipc_term_length=EMBEDDED_IPC_TERM_LENGTH,
            dir_delete_on_shutdown=True,
            driver_timeout_ns=s.driver_timeout_ns,
            client_liveness_timeout_ns=s.driver_timeout_ns,
        )
        self.driver = MediaDriver.launch(ctx)
        self.driver.start()
        self._log.info("jetstream.driver_embedded", driver_dir=self.directory)

    # -- sessions -----------------------------------------------------------------------------------------

    def _open_session(self, floor_us: int) -> _Session:
        s = self.settings
        session = _Session()
        try:
            session.aeron = Aeron.connect(
                Context(
                    dir=self.directory, driver_timeout_ns=s.driver_timeout_ns, error_handler=session.on_client_error
                )
            )
            if s.subscribe:
                session.subscription = session.aeron.add_subscription(s.channel, s.stream_id)
                self._attach(session.subscription)
            if s.publish:
                if self._lock is None or not self._lock.still_held():
                    if self._lock is not None:
                        self._lock.release()
                        self._lock = None
                    self._lock = StreamLock(self.directory, s.channel, s.stream_id, s.holder)
                session.publication = session.aeron.add_exclusive_publication(s.channel, s.stream_id)
                if self._make_source is not None:
                    topics = None
                    if s.topics_stream_id is not None:
                        topics = session.aeron.add_topic_publication(s.channel, s.topics_stream_id, exclusive=True)
                    session.ingest = Ingest(session.publication, self._make_source(floor_us), topics=topics)
                    session.ingest.start()
        except BaseException:
            self._close_session(session)
            raise
        return session

    def _lost_reason(self, session: _Session) -> str | None:
        if session.lost.is_set():
            return session.reason
        if session.aeron is not None and session.aeron.is_closed:
            return "the media driver closed this client"
        if session.subscription is not None and session.subscription.is_closed:
            return "the event stream's subscription was closed"
        if session.publication is not None and session.publication.is_closed:
            return "the event stream's publication was closed"
        ingest = session.ingest
        if ingest is not None and ingest.error is not None:
            if isinstance(ingest.error, PublicationClosedError):
                return str(ingest.error)
            raise RelayStopped(f"ingest failed: {ingest.error}")
        if self.driver is not None and not self.driver.runner.is_running:
            return "the embedded media driver stopped"
        return None

    def _close_session(self, session: _Session) -> None:
        if session.ingest is not None:
            session.ingest.stop()
            self.last_ingest_time_us = max(self.last_ingest_time_us, session.ingest.stats.last_time_us)
        if session.subscription is not None:
            self._attach(None)
        if session.aeron is not None:
            try:
                session.aeron.close()
            except LogbufError:
                pass
