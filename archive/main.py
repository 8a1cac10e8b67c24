"""``logbuf-archive``: record, replay, list, describe, verify, dump, delete, retention, index and upload.

    logbuf-archive -d ARCHIVE_DIR record --channel aeron:ipc --stream-id 10
    logbuf-archive -d ARCHIVE_DIR list
    logbuf-archive -d ARCHIVE_DIR replay 0 --stream-id 99
    logbuf-archive -d ARCHIVE_DIR upload s3://bucket/archive --follow 30s

The archive directory comes from ``-d/--archive-dir`` or ``LOGBUF_ARCHIVE_DIR``. Exit status: 0
on success, 1 when verify finds a bad recording or list, verify or recover find a damaged catalog
(an entry INVALID after it was added, a truncated file), 2 for bad input (the message names it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import structlog

from logbuf.archive.catalog import Catalog, CatalogError, CatalogProblem, RecordingDescriptor
from logbuf.archive.dump import iter_frames
from logbuf.archive.maintenance import delete_recording, purge_segments
from logbuf.archive.recorder import Recorder, RecorderContext
from logbuf.archive.remote_cli import (
    REMOTE_COMMANDS,
    ArchiveError,
    add_control_arguments,
    add_serve_arguments,
    cmd_serve,
    list_line,
    remote_stop,
)
from logbuf.archive.replication import read_replications, read_source
from logbuf.archive.segments import DEFAULT_SEGMENT_LENGTH, SegmentError, segment_files
from logbuf.archive.verify import verify_recording
from logbuf.durations import duration_argument
from logbuf.errors import ConfigurationError, LogbufError
from logbuf.logging_config import configure_logging

ENV_ARCHIVE_DIR = "LOGBUF_ARCHIVE_DIR"


class UsageError(ConfigurationError):
    """Bad command-line input (exit status 2)."""


def _size(text: str) -> int:
    """Sizes: a number of bytes with an optional k/m/g suffix (powers of 1024)."""
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024**2, "g": 1024**3}.get(t[-1:], 1)
    try:
        return int(t[:-1] if mult != 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or with a k/m/g suffix)") from None


def _time_ms(text: str) -> int:
    """A point in time: epoch milliseconds, or ISO 8601 (UTC unless it says otherwise)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither epoch milliseconds nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must not be negative")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="logbuf-archive",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Record streams into an archive directory, replay them, and inspect or trim the archive.",
        epilog="examples:\n"
        "  logbuf-archive -d /data/archive record --channel aeron:ipc --stream-id 10\n"
        "  logbuf-archive -d /data/archive list\n"
        "  logbuf-archive -d /data/archive verify\n"
        "  logbuf-archive -d /data/archive replay 0 --stream-id 99",
    )
    parser.add_argument(
        "-d",
        "--archive-dir",
        default=os.environ.get(ENV_ARCHIVE_DIR),
        help=f"archive directory (default ${ENV_ARCHIVE_DIR})",
    )
    parser.add_argument("--log-level", default="info", help="structlog level (debug, info, warning, error)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-d", "--archive-dir", dest="sub_archive_dir", default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:  # every command also takes -d
        return sub.add_parser(name, help=help, parents=[common])

    p = command("serve", "run the archive service: control requests from local and remote clients")
    add_serve_arguments(p)

    p = command("sync", "make archive services hold the union of their stream histories (fetching only what differs)")
    p.add_argument(
        "--peer",
        action="append",
        required=True,
        metavar="CHANNEL@STREAM",
        help="an archive service on this host by its IPC control channel and stream, e.g. aeron:ipc@10 (twice or more)",
    )
    p.add_argument("--driver-dir", default="", help="the media driver's directory (default $LOGBUF_DIR)")
    p.add_argument("--stream-id", type=int, action="append", help="only these recorded streams (default: all)")
    p.add_argument("--bandwidth", type=int, default=0, help="bytes/s the fetches may ask for (default: unbounded)")
    p.add_argument(
        "--interval",
        type=duration_argument("s"),
        default=0,
        metavar="DURATION",
        help="time between rounds, for continuous anti-entropy (e.g. 30s, 5m; a bare number is seconds; default: "
        "one round)",
    )
    p.add_argument(
        "--timeout",
        type=duration_argument("s"),
        default=60_000_000_000,
        metavar="DURATION",
        help="how long one fetch may take (a bare number is seconds; default 60s)",
    )

    p = command("stop", "stop a recording on an archive service (--control)")
    add_control_arguments(p, required=True)
    p.add_argument("--channel", help="the recorded channel (with --stream-id)")
    p.add_argument("--stream-id", type=int)
    p.add_argument("--subscription-id", type=int, help="the recording subscription id that record printed")

    p = command("list", "one line per recording")
    add_control_arguments(p)
    p.add_argument("--json", action="store_true", help="JSON lines (every descriptor field)")
    p.add_argument("--all", action="store_true", help="include DELETED recordings")

    p = command("describe", "every field of one recording, and its segment files")
    add_control_arguments(p)
    p.add_argument("recording_id", type=_non_negative)
    p.add_argument("--json", action="store_true")

    p = command("verify", "walk every frame; report the first bad position and why (exit 1)")
    p.add_argument("recording_id", type=_non_negative, nargs="?", help="default: every VALID recording")
    p.add_argument("--json", action="store_true")

    p = command("dump", "the frames of a recording as text or JSON lines")
    p.add_argument("recording_id", type=_non_negative)
    p.add_argument("--from-position", type=_non_negative, help="default: the start position")
    p.add_argument("--to-position", type=_non_negative, help="default: the stop position")
    p.add_argument("--limit", type=_non_negative, help="at most this many frames")
    p.add_argument("--payload-bytes", type=_non_negative, default=32, help="payload bytes shown per frame (hex)")
    p.add_argument("--json", action="store_true", help="one JSON object per frame")

    p = command("delete", "mark a recording DELETED and remove its segment files")
    p.add_argument("recording_id", type=_non_negative)

    p = command("retention", "drop whole segments before a position or a time")
    p.add_argument("recording_id", type=_non_negative, nargs="?", help="default: every VALID recording")
    p.add_argument("--before-position", type=_non_negative, help="drop segments that end at or before this position")
    p.add_argument(
        "--older-than", type=duration_argument("s"), help="drop segments last written longer ago than this (2h, 7d)"
    )
    p.add_argument("--before-time", type=_time_ms, help="drop segments last written before this (epoch ms or ISO)")

    p = command("recover", "close recordings whose recorder died, at their valid prefix")

    p = command("index", "write time index entries for stopped recordings' segments that have none")
    p.add_argument("recording_id", type=_non_negative, nargs="?", help="default: every VALID recording")

    p = command("upload", "copy complete segments, then the catalog, to a directory or URI (s3://, hdfs://, file://)")
    p.add_argument("destination", help="e.g. s3://bucket/archive?endpoint_override=host:9000&scheme=http")
    p.add_argument(
        "--follow",
        type=duration_argument("s"),
        metavar="INTERVAL",
        help="repeat every INTERVAL (e.g. 10s) until SIGINT/SIGTERM, uploading each segment as it completes",
    )

    p = command("record", "record every image of a channel and stream until SIGINT/SIGTERM (or on a service)")
    add_control_arguments(p, driver_dir=False)
    p.add_argument("--remote-source", action="store_true", help="with --control: the stream comes from another host")
    p.add_argument("--channel", required=True, help="e.g. aeron:ipc or aeron:udp?endpoint=localhost:40123")
    p.add_argument("--stream-id", type=int, required=True)
    p.add_argument("--driver-dir", default="", help="the media driver's directory (default $LOGBUF_DIR)")
    p.add_argument(
        "--segment-length",
        type=_size,
        default=DEFAULT_SEGMENT_LENGTH,
        help="segment file length, a power of two 64k..1g (default 64m; at least the term length)",
    )
    p.add_argument(
        "--driver-timeout",
        type=duration_argument("s"),
        default=10_000_000_000,
        help="driver liveness timeout (default 10s)",
    )
    p.add_argument("--no-reconnect", action="store_true", help="end when the driver goes away")
    p.add_argument(
        "--checksum",
        choices=("none", "crc32"),
        default="none",
        help="crc32: record each frame's payload CRC-32 (in its session id field) for verify and Spark to check",
    )
    p.add_argument(
        "--no-time-index",
        action="store_true",
        help="do not bound each segment's reserved values in <id>.times (timestamp filters then read every segment)",
    )

    p = command("replay", "replay a recording into a publication (IPC, or UDP to a subscriber's host)")
    add_control_arguments(p, driver_dir=False)
    p.add_argument("recording_id", type=_non_negative)
    p.add_argument("--stream-id", type=int, required=True, help="the replay publication's stream id")
    p.add_argument(
        "--channel", default="aeron:ipc", help="replay channel: aeron:ipc, or aeron:udp?endpoint=SUBSCRIBER:PORT"
    )
    p.add_argument("--position", type=_non_negative, help="default: the start position")
    p.add_argument("--length", type=_non_negative, help="bytes to replay (default: to the end, following a live one)")
    p.add_argument("--driver-dir", default="", help="the media driver's directory (default $LOGBUF_DIR)")
    p.add_argument(
        "--connect-timeout",
        type=duration_argument("s"),
        default=30_000_000_000,
        help="how long to wait for a subscriber (default 30s)",
    )
    return parser


# -- commands ---------------------------------------------------------------------------------------------
def _descriptor_dict(d: RecordingDescriptor) -> dict[str, Any]:
    data = asdict(d)
    data["state"] = d.state.name
    data["checksum"] = d.checksum.name
    return data


def _report_problems(problems: list[CatalogProblem], as_json: bool) -> int:
    """Print the catalog's damage (one line each, as verify reports a bad recording); 1 if there is any."""
    for problem in problems:
        if as_json:
            print(
                json.dumps(
                    {
                        "recording_id": problem.first_recording_id,
                        "last_recording_id": problem.last_recording_id,
                        "ok": False,
                        "reason": problem.reason,
                    }
                )
            )
        else:
            print(f"catalog BAD: {problem.reason}")
    return 1 if problems else 0


def _cmd_list(archive_dir: str, args: argparse.Namespace) -> int:
    with Catalog.open(archive_dir) as catalog:
        recordings = catalog.recordings()
        problems = catalog.problems()
    copying = {r["dst_recording_id"]: r for r in read_replications(archive_dir)}
    for d in recordings:
        if d.state.name == "DELETED" and not args.all:
            continue
        source = read_source(archive_dir, d.recording_id)
        replication = copying.get(d.recording_id)
        if args.json:
            print(
                json.dumps(
                    {**_descriptor_dict(d), "source": asdict(source) if source else None, "replication": replication}
                )
            )
        else:
            status = "active" if d.active else ("interrupted" if d.interrupted else "stopped")
            if source is not None:
                status += f" copy:{source.source_archive_id}/{source.source_recording_id}"
                if source.source_identity:
                    status += f" from:{source.source_identity}"
            if replication is not None:
                status += f" lag:{replication['lag']}"
            print(
                list_line(
                    d.recording_id,
                    d.state.name,
                    status,
                    d.stream_id,
                    d.session_id,
                    d.start_position,
                    d.stop_position,
                    d.channel,
                )
            )
    return _report_problems(problems, args.json)


def _sync_summary(report: Any) -> dict[str, Any]:
    return {
        "fetched": [
            {"peer": name, "stream_id": f.key.stream_id, "session_id": f.key.session_id, "start": f.start, "end": f.end}
            for name, f in report.fetched
        ],
        "fetched_bytes": report.fetched_bytes,
        "unfetchable": [
            {"peer": name, "stream_id": k.stream_id, "start": i[0], "end": i[1]} for name, k, i in report.unfetchable
        ],
        "failed": [{"peer": name, "error": error} for name, _, error in report.failed],
        "conflicts": [
            {
                "peers": list(c.peers),
                "stream_id": c.key.stream_id,
                "session_id": c.key.session_id,
                "start": c.interval[0],
                "end": c.interval[1],
                "verdicts": [v.name for v in c.verdicts],
                "winner": c.winner,
                "repaired": c.repaired,
            }
            for c in report.conflicts
        ],
        "behind_bytes": report.behind_bytes,
        "compared_bytes": report.compared_bytes,
        "digest_rounds": report.digest_rounds,
        "exchanged_bytes": report.exchanged_bytes,
    }


def cmd_sync(args: argparse.Namespace) -> int:
    """``sync``: one round, or rounds every ``--interval`` seconds until interrupted (anti-entropy: a lost
    peer is connected again), between archives reached through this host's driver."""
    import functools
    import threading

    from logbuf.archive.client import ArchiveClient, ArchiveClientContext
    from logbuf.archive.sync import Peer, sync_forever, sync_once
    from logbuf.client import Aeron, Context

    if len(args.peer) < 2:
        raise ValueError("give at least two --peer archives")
    stream_ids = set(args.stream_id) if args.stream_id else None
    with Aeron.connect(Context(dir=args.driver_dir)) as aeron:
        peers: list[Peer] = []
        try:
            for spec in args.peer:
                channel, _, stream = spec.rpartition("@")
                if not channel or not stream.lstrip("-").isdigit():
                    raise ValueError(f"--peer {spec!r} must be CHANNEL@STREAM, e.g. aeron:ipc@10")
                ctx = ArchiveClientContext(aeron=aeron, control_channel=channel, control_stream_id=int(stream))
                peers.append(
                    Peer(
                        spec,
                        ArchiveClient.connect(ctx),
                        channel,
                        int(stream),
                        connect=functools.partial(ArchiveClient.connect, ctx),
                    )
                )
            if args.interval <= 0:
                report = sync_once(
                    peers, stream_ids=stream_ids, bandwidth_bytes_per_s=args.bandwidth, timeout_ns=args.timeout
                )
                print(json.dumps(_sync_summary(report)), flush=True)
                return 1 if report.failed or report.conflicts else 0
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            try:
                sync_forever(
                    peers,
                    stop,
                    interval_ns=args.interval,
                    on_report=lambda report: print(json.dumps(_sync_summary(report)), flush=True),
                    stream_ids=stream_ids,
                    bandwidth_bytes_per_s=args.bandwidth,
                    timeout_ns=args.timeout,
                )
            except KeyboardInterrupt:
                pass
            return 0
        finally:
            for peer in peers:
                peer.client.close()


def _cmd_describe(archive_dir: str, args: argparse.Namespace) -> int:
    with Catalog.open(archive_dir) as catalog:
        d = catalog.recording(args.recording_id)
    segments = [
        {"base_position": base, "file": path.name, "bytes": path.stat().st_size}
        for base, path in segment_files(archive_dir, d.recording_id)
    ]
    if args.json:
        print(json.dumps({**_descriptor_dict(d), "segments": segments}))
        return 0
    for key, value in _descriptor_dict(d).items():
        print(f"{key:<16} {value}")
    print(f"{'segments':<16} {len(segments)}")
    for segment in segments:
        print(f"  {segment['file']}")
    return 0


def _cmd_verify(archive_dir: str, args: argparse.Namespace) -> int:
    with Catalog.open(archive_dir) as catalog:
        problems = catalog.problems()
        if args.recording_id is not None:
            problems = [p for p in problems if p.first_recording_id <= args.recording_id <= p.last_recording_id]
            recordings = [] if problems else [catalog.recording(args.recording_id)]
        else:
            recordings = [d for d in catalog.recordings() if d.state.name == "VALID"]
    bad = _report_problems(problems, args.json)
    for d in recordings:
        bad += not _print_verified(archive_dir, d, args.json)
    return 1 if bad else 0


def _print_verified(archive_dir: str, d: RecordingDescriptor, as_json: bool) -> bool:
    result = verify_recording(archive_dir, d)
    if as_json:
        print(
            json.dumps(
                {
                    "recording_id": d.recording_id,
                    "ok": result.ok,
                    "frames": result.frames,
                    "position": result.end_position,
                    "reason": result.reason,
                    "checksum": d.checksum.name,
                }
            )
        )
    elif result.ok:
        checked = ", payload checksums checked" if d.checksum else ""
        print(f"recording {d.recording_id}: OK, {result.frames} frames, {d.start_position}..{d.stop_position}{checked}")
    else:
        print(f"recording {d.recording_id}: BAD at position {result.end_position}: {result.reason}")
    return result.ok


def _cmd_dump(archive_dir: str, args: argparse.Namespace) -> int:
    with Catalog.open(archive_dir) as catalog:
        d = catalog.recording(args.recording_id)
    if not args.json:
        print(
            f"recording {d.recording_id} stream={d.stream_id} session={d.session_id} "
            f"{d.start_position}..{d.stop_position} {d.channel}"
        )
    for count, frame in enumerate(iter_frames(archive_dir, d, args.from_position, args.to_position)):
        if args.limit is not None and count >= args.limit:
            break
        print(json.dumps(frame.as_dict(args.payload_bytes)) if args.json else frame.text(args.payload_bytes))
    return 0


def _cmd_delete(archive_dir: str, args: argparse.Namespace) -> int:
    with Catalog.open_writable(archive_dir, create=False) as catalog:
        removed = delete_recording(catalog, args.recording_id)
    print(f"recording {args.recording_id} deleted, {len(removed)} segment files removed")
    return 0


def _cmd_retention(archive_dir: str, args: argparse.Namespace) -> int:
    before_time = args.before_time
    if args.older_than is not None:
        older = (time.time_ns() - args.older_than) // 1_000_000
        before_time = older if before_time is None else min(before_time, older)
    if args.before_position is None and before_time is None:
        raise UsageError("retention needs --before-position, --older-than or --before-time")
    with Catalog.open_writable(archive_dir, create=False) as catalog:
        if args.recording_id is not None:
            ids = [args.recording_id]
        else:
            ids = [d.recording_id for d in catalog.recordings() if d.state.name == "VALID"]
        for recording_id in ids:
            removed = purge_segments(
                catalog, recording_id, before_position=args.before_position, before_time_ms=before_time
            )
            start = catalog.recording(recording_id).start_position
            print(f"recording {recording_id}: {len(removed)} segment files removed, start position {start}")
    return 0


def _cmd_recover(archive_dir: str, args: argparse.Namespace) -> int:
    """Close interrupted recordings at the end of the valid frames after their stored stop position, then
    verify each from its start: damage before the stored stop position is reported (exit 1), not hidden."""
    bad = 0
    with Catalog.open_writable(archive_dir, create=False, recover=False) as catalog:
        recovered = catalog.recover_interrupted()
        for recording_id in recovered:
            d = catalog.recording(recording_id)
            result = verify_recording(archive_dir, d)
            if result.ok:
                print(f"recording {recording_id}: interrupted, valid prefix kept up to {d.stop_position}")
            else:
                bad += 1
                print(
                    f"recording {recording_id}: interrupted, closed at {d.stop_position}; "
                    f"BAD at position {result.end_position}: {result.reason}"
                )
        bad += _report_problems(catalog.problems(), False)
    if not recovered:
        print("no interrupted recordings")
    return 1 if bad else 0


def _cmd_index(archive_dir: str, args: argparse.Namespace) -> int:
    """Time index entries for archives recorded before the recorder wrote them (it does as it records);
    a recording whose frames do not verify is left without (exit 1), so its segments are always read."""
    from logbuf.archive.time_index import build_index

    with Catalog.open(archive_dir) as catalog:
        if args.recording_id is not None:
            recordings = [catalog.recording(args.recording_id)]
        else:
            recordings = [d for d in catalog.recordings() if d.state.name == "VALID"]
    bad = 0
    for d in recordings:
        if d.active:
            print(f"recording {d.recording_id}: active (its recorder indexes each segment as it completes)")
            continue
        if not verify_recording(archive_dir, d).ok:
            bad += 1
            print(f"recording {d.recording_id}: not indexed, its frames do not verify (see logbuf-archive verify)")
            continue
        added = build_index(archive_dir, d)
        print(f"recording {d.recording_id}: {len(added)} segment(s) indexed")
    return 1 if bad else 0


def _cmd_upload(archive_dir: str, args: argparse.Namespace) -> int:
    from logbuf.archive.storage import parse_location, upload

    destination = parse_location(args.destination)
    if destination.is_local and os.path.abspath(destination.local_path) == os.path.abspath(archive_dir):
        raise UsageError(f"the destination {destination} is the archive itself")
    stop: list[bool] = []
    if args.follow is not None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.append(True))
    while True:
        report = upload(archive_dir, destination)
        print(
            f"uploaded {len(report.segments)} segment files and the catalog ({report.recordings} recordings) "
            f"to {destination}",
            flush=True,
        )
        if args.follow is None:
            return 0
        deadline = time.monotonic() + args.follow / 1e9
        while not stop and time.monotonic() < deadline:
            time.sleep(0.05)
        if stop:
            return 0


def _cmd_record(archive_dir: str, args: argparse.Namespace) -> int:
    ctx = RecorderContext(
        archive_dir=archive_dir,
        channel=args.channel,
        stream_id=args.stream_id,
        driver_dir=args.driver_dir,
        segment_length=args.segment_length,
        driver_timeout_ns=args.driver_timeout,
        reconnect=not args.no_reconnect,
        checksum=args.checksum,
        time_index=not args.no_time_index,
    )
    recorder = Recorder(ctx)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: recorder.stop())
    recorder.run()
    return 0


def _cmd_replay(archive_dir: str, args: argparse.Namespace) -> int:
    from logbuf.archive.replay import Replay, check_replay_bounds, replay_channel
    from logbuf.client import Aeron, Context

    with Catalog.open(archive_dir) as catalog:  # bad input is reported before connecting to a driver
        d = catalog.recording(args.recording_id)
    check_replay_bounds(archive_dir, d, d.start_position if args.position is None else args.position, args.length)
    replay_channel(args.channel, d, d.start_position)
    with Aeron.connect(Context(dir=args.driver_dir)) as aeron:
        replay = Replay(
            aeron,
            archive_dir,
            args.recording_id,
            stream_id=args.stream_id,
            position=args.position,
            length=args.length,
            channel=args.channel,
            connect_timeout_ns=args.connect_timeout,
        )
        stop = []
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.append(True))
        try:
            while not replay.is_done and not stop:
                if not replay.do_work():
                    time.sleep(0.0002)
        finally:
            replay.close()
        if replay.error is not None:
            print(f"logbuf-archive: replay of recording {args.recording_id} failed: {replay.error}", file=sys.stderr)
            return 1
        print(
            f"replayed recording {args.recording_id} from {replay.start_position} to {replay.position} "
            f"on {replay.channel} stream {args.stream_id}"
        )
    return 0


COMMANDS = {
    "serve": cmd_serve,
    "stop": remote_stop,
    "list": _cmd_list,
    "describe": _cmd_describe,
    "verify": _cmd_verify,
    "dump": _cmd_dump,
    "delete": _cmd_delete,
    "retention": _cmd_retention,
    "recover": _cmd_recover,
    "index": _cmd_index,
    "upload": _cmd_upload,
    "record": _cmd_record,
    "replay": _cmd_replay,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    log = structlog.get_logger().bind(role="archive-cli", command=args.command)
    archive_dir = args.sub_archive_dir or args.archive_dir
    remote = REMOTE_COMMANDS.get(args.command) if getattr(args, "control", None) else None
    if remote is not None:
        try:
            return remote(args)
        except (ArchiveError, LogbufError, ValueError, OSError) as e:
            log.debug("archive.command_failed", error=str(e))
            print(f"logbuf-archive {args.command}: {e}", file=sys.stderr)
            return 2
    if args.command == "sync":
        try:
            return cmd_sync(args)
        except (ArchiveError, LogbufError, ValueError, OSError) as e:
            print(f"logbuf-archive sync: {e}", file=sys.stderr)
            return 2
    if not archive_dir:
        print(f"logbuf-archive: no archive directory: give -d/--archive-dir or set {ENV_ARCHIVE_DIR}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[args.command](archive_dir, args)
    except BrokenPipeError:  # `dump | head`
        sys.stderr.close()
        return 0
    except (CatalogError, SegmentError, UsageError, LogbufError, ValueError, OSError) as e:
        log.debug("archive.command_failed", error=str(e))
        print(f"logbuf-archive {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
