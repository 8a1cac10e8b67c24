"""``logbuf-archive serve`` and the commands that talk to a service (``--control CHANNEL``).

    logbuf-archive -d /data/archive serve --control-channel 'aeron:udp?endpoint=10.0.0.1:8010'
    logbuf-archive list --control 'aeron:udp?endpoint=10.0.0.1:8010' --response-channel 'aeron:udp?endpoint=10.0.0.2:8020'
    logbuf-archive record --control aeron:ipc --channel aeron:ipc --stream-id 10
    logbuf-archive replay 0 --control aeron:ipc --stream-id 99
    logbuf-archive stop --control aeron:ipc --channel aeron:ipc --stream-id 10

A remote ``list`` prints the same table as a local one (an active recording's stop column is its recorded
position, asked of the service).
"""

from __future__ import annotations

import argparse
import json
import signal
from collections.abc import Callable

from logbuf.archive import control_codec as cc
from logbuf.archive.client import (
    DEFAULT_RESPONSE_STREAM_ID,
    ArchiveClient,
    ArchiveClientContext,
    ArchiveError,
    replay_image_session_id,
)
from logbuf.archive.service_context import DEFAULT_CONTROL_STREAM_ID, DEFAULT_EVENTS_STREAM_ID, ArchiveContext
from logbuf.durations import duration_argument

__all__ = [
    "REMOTE_COMMANDS",
    "ArchiveError",
    "add_control_arguments",
    "add_serve_arguments",
    "cmd_serve",
    "list_line",
    "remote_stop",
]


def list_line(
    recording_id: int, state: str, status: str, stream_id: int, session_id: int, start: int, stop: int, channel: str
) -> str:
    """One line of ``list``'s table (local and remote print the same)."""
    return (
        f"{recording_id:>4} {state:<7} {status:<11} stream={stream_id} session={session_id} "
        f"start={start} stop={stop} bytes={stop - start} {channel}"
    )


def _secret(path: str | None) -> bytes:
    if not path:
        return b""
    with open(path, "rb") as f:
        secret = f.read().strip()
    if not secret:
        raise ValueError(f"the secret file {path} is empty")
    return secret


def add_control_arguments(p: argparse.ArgumentParser, *, required: bool = False, driver_dir: bool = True) -> None:
    """``--control`` and its companions (``driver_dir``: also ``--driver-dir``, for commands without one)."""
    p.add_argument(
        "--control",
        required=required,
        metavar="CHANNEL",
        help="talk to an archive service on this control channel (aeron:ipc, or aeron:udp?endpoint=HOST:PORT)",
    )
    p.add_argument("--control-stream-id", type=int, default=DEFAULT_CONTROL_STREAM_ID)
    p.add_argument(
        "--response-channel",
        default="aeron:ipc",
        help="where the service answers (a remote service: aeron:udp?endpoint=THIS_HOST:PORT)",
    )
    p.add_argument("--response-stream-id", type=int, default=DEFAULT_RESPONSE_STREAM_ID)
    p.add_argument("--auth-secret-file", help="the service's shared secret (a file holding it)")
    if driver_dir:
        p.add_argument("--driver-dir", default="", help="this host's media driver directory (default $LOGBUF_DIR)")
    p.add_argument(
        "--timeout",
        type=duration_argument("s"),
        default=5_000_000_000,
        metavar="DURATION",
        help="how long to wait for each answer (e.g. 500ms, 5s; a bare number is seconds; default 5s)",
    )


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    defaults = ArchiveContext(archive_dir="-")
    p.add_argument("--driver-dir", default="", help="the media driver's directory (default $LOGBUF_DIR)")
    p.add_argument("--local-control-channel", default=defaults.local_control_channel, help="IPC control ('' for none)")
    p.add_argument(
        "--control-channel", default="", help="remote control, aeron:udp?endpoint=ADDRESS:PORT (default: none)"
    )
    p.add_argument("--control-stream-id", type=int, default=DEFAULT_CONTROL_STREAM_ID)
    p.add_argument("--events-channel", default="", help="recording events channel (default: none)")
    p.add_argument("--events-stream-id", type=int, default=DEFAULT_EVENTS_STREAM_ID)
    p.add_argument("--allowed-clients", default="", help="comma-separated addresses/networks allowed to connect")
    p.add_argument("--auth-secret-file", help="a file holding the shared secret that every remote connect must prove")
    p.add_argument("--max-sessions", type=int, default=defaults.max_sessions)
    p.add_argument("--max-replays", type=int, default=defaults.max_concurrent_replays)
    p.add_argument("--max-recordings", type=int, default=defaults.max_concurrent_recordings)
    p.add_argument(
        "--session-timeout",
        type=duration_argument("s"),
        default=defaults.session_timeout_ns,
        metavar="DURATION",
        help=f"close a silent session after this (a bare number is seconds; default {defaults.session_timeout_ns // 10**9}s)",
    )
    p.add_argument("--segment-length", type=int, default=defaults.segment_length)
    p.add_argument("--checksum", choices=("none", "crc32"), default="none")
    p.add_argument(
        "--record",
        action="append",
        default=[],
        metavar="CHANNEL:STREAM",
        help="start recording this channel's stream at start (repeatable), e.g. aeron:ipc:10",
    )


def cmd_serve(archive_dir: str, args: argparse.Namespace) -> int:
    from logbuf.archive.service import ArchiveService

    ctx = ArchiveContext(
        archive_dir=archive_dir,
        driver_dir=args.driver_dir,
        local_control_channel=args.local_control_channel,
        control_channel=args.control_channel,
        control_stream_id=args.control_stream_id,
        events_channel=args.events_channel,
        events_stream_id=args.events_stream_id,
        allowed_clients=[a for a in args.allowed_clients.split(",") if a.strip()],
        auth_secret=_secret(args.auth_secret_file),
        max_sessions=args.max_sessions,
        max_concurrent_replays=args.max_replays,
        max_concurrent_recordings=args.max_recordings,
        session_timeout_ns=args.session_timeout,
        segment_length=args.segment_length,
        checksum=args.checksum,
    )
    service = ArchiveService(ctx).start()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: service.stop())
    assert service.conductor is not None
    for spec in args.record:
        channel, _, stream = spec.rpartition(":")
        service.conductor.start_recording_locally(channel, int(stream))
    print(
        f"archive service on {ctx.local_control_channel or '-'} {ctx.control_channel or ''} serving {archive_dir}",
        flush=True,
    )
    service.run()
    return 0


def _client(args: argparse.Namespace) -> ArchiveClient:
    return ArchiveClient.connect(
        ArchiveClientContext(
            control_channel=args.control,
            control_stream_id=args.control_stream_id,
            response_channel=args.response_channel,
            response_stream_id=args.response_stream_id,
            driver_dir=args.driver_dir,
            auth_secret=_secret(args.auth_secret_file),
            message_timeout_ns=args.timeout,
        )
    )


def _wire_dict(d: cc.RecordingDescriptor, stop: int) -> dict[str, object]:
    return {
        "recording_id": d.recording_id,
        "state": "VALID",
        "active": d.stop_position == -1,
        "channel": d.original_channel,
        "source_identity": d.source_identity,
        "stream_id": d.stream_id,
        "session_id": d.session_id,
        "initial_term_id": d.initial_term_id,
        "term_length": d.term_buffer_length,
        "mtu": d.mtu_length,
        "segment_length": d.segment_file_length,
        "start_position": d.start_position,
        "stop_position": stop,
        "start_time_ms": d.start_timestamp,
        "stop_time_ms": d.stop_timestamp,
    }


def _stop_of(client: ArchiveClient, d: cc.RecordingDescriptor) -> int:
    return d.stop_position if d.stop_position != -1 else client.max_recorded_position(d.recording_id)


def remote_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        for d in client.list_recordings():
            stop = _stop_of(client, d)
            if args.json:
                print(json.dumps(_wire_dict(d, stop)))
            else:
                status = "active" if d.stop_position == -1 else "stopped"
                print(
                    list_line(
                        d.recording_id,
                        "VALID",
                        status,
                        d.stream_id,
                        d.session_id,
                        d.start_position,
                        stop,
                        d.original_channel,
                    )
                )
    return 0


def remote_describe(args: argparse.Namespace) -> int:
    with _client(args) as client:
        d = client.list_recording(args.recording_id)
        data = _wire_dict(d, _stop_of(client, d))
    if args.json:
        print(json.dumps(data))
    else:
        for key, value in data.items():
            print(f"{key:<16} {value}")
    return 0


def remote_record(args: argparse.Namespace) -> int:
    with _client(args) as client:
        subscription_id = client.start_recording(args.channel, args.stream_id, remote=args.remote_source)
    print(f"recording {args.channel} stream {args.stream_id}: subscription {subscription_id}")
    return 0


def remote_stop(archive_dir: str, args: argparse.Namespace) -> int:
    return _remote_stop(args)


def _remote_stop(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.subscription_id is not None:
            client.stop_recording_subscription(args.subscription_id)
            print(f"recording subscription {args.subscription_id} stopped")
        elif args.channel is not None and args.stream_id is not None:
            client.stop_recording(args.channel, args.stream_id)
            print(f"recording of {args.channel} stream {args.stream_id} stopped")
        else:
            raise ValueError("stop needs --subscription-id, or --channel and --stream-id")
    return 0


def remote_replay(args: argparse.Namespace) -> int:
    """Start a replay on the service; it runs there until its subscriber (elsewhere) has it all or goes away."""
    with _client(args) as client:
        replay_session_id = client.start_replay(
            args.recording_id,
            stream_id=args.stream_id,
            channel=args.channel,
            position=args.position,
            length=args.length,
        )
    print(
        f"replaying recording {args.recording_id} on {args.channel} stream {args.stream_id} "
        f"(replay session {replay_session_id}, image session id {replay_image_session_id(replay_session_id)})"
    )
    return 0


REMOTE_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": remote_list,
    "describe": remote_describe,
    "record": remote_record,
    "stop": _remote_stop,
    "replay": remote_replay,
}
