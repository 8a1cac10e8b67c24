"""The archive service on one host: a real driver process, the service (embedded on a thread, or
``logbuf-archive serve`` as a process), clients over IPC. Requests, errors, catch-up onto the live stream,
authentication, a fuzzed control stream, and kill -9 of the service mid-replay."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from logbuf.archive import control_codec as cc
from logbuf.archive.catalog import Catalog
from logbuf.archive.client import (
    ArchiveClient,
    ArchiveClientContext,
    ArchiveNotConnectedError,
    ArchiveRequestError,
    AuthenticationRejectedError,
    InvalidPositionError,
    RecordingUnknownError,
    replay_image_session_id,
)
from logbuf.archive.replay_merge import ReplayMerge, position_at_time
from logbuf.archive.service import ArchiveService
from logbuf.archive.service_context import ArchiveContext
from logbuf.client import Aeron, Subscription
from logbuf.conduit import counters_descriptor as cd
from logbuf.conduit.archive_counters import read_counters
from logbuf.conduit.counters import CountersReader
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess
from tests.archive.conftest import archive_cli, publish
from tests.archive.service_kit import Received, SequencedPublisher, ServeProcess, sequenced

TIMEOUT_S = 30
_streams = iter(range(4000, 5000))


@pytest.fixture
def service(archive_driver: DriverProcess, tmp_path: os.PathLike[str]) -> Iterator[ArchiveService]:
    ctx = ArchiveContext(
        archive_dir=os.path.join(tmp_path, "archive"),
        driver_dir=archive_driver.dir,
        segment_length=128 * 1024,
        max_concurrent_replays=2,
        events_channel="aeron:ipc",
    )
    with ArchiveService.launch(ctx) as svc:
        yield svc


@pytest.fixture
def archive(service: ArchiveService, aeron: Aeron) -> Iterator[ArchiveClient]:
    with ArchiveClient.connect(ArchiveClientContext(aeron=aeron)) as client:
        yield client


def drain(subscription: Subscription, received: Received, count: int, session_id: int | None = None) -> None:
    def step() -> int:
        """Work done (fragments polled); 0 while the replay's image is not there yet, so the wait backs off."""
        image = subscription.image_by_session_id(session_id) if session_id is not None else None
        if image is not None:
            return image.poll(received.handler, 100)
        if session_id is None:
            return subscription.poll(received.handler, 100)
        return 0

    wait_until(lambda: len(received.seqs) >= count, TIMEOUT_S, f"{count} messages", do_work=step)


def ipc_merge(archive: ArchiveClient, rid: int, stream_id: int, **kw: Any) -> ReplayMerge:
    """A ReplayMerge of recording ``rid`` onto the live IPC stream, replayed over IPC on a fresh stream."""
    return ReplayMerge(
        archive,
        rid,
        live_channel="aeron:ipc",
        live_stream_id=stream_id,
        replay_channel="aeron:ipc",
        replay_stream_id=next(_streams),
        **kw,
    )


def record_some(archive: ArchiveClient, aeron: Aeron, count: int, length: int = 100) -> tuple[int, list[int], int]:
    """Record ``count`` messages of a fresh IPC stream; returns (recording id, end positions, stream id)."""
    stream_id = next(_streams)
    archive.start_recording("aeron:ipc", stream_id)
    publication = aeron.add_publication("aeron:ipc", stream_id)
    wait_until(lambda: publication.is_connected, TIMEOUT_S, "the recording to subscribe")
    ends = []
    for i in range(count):
        offered = wait_until(
            lambda: max(0, publication.offer(sequenced(i, length))), TIMEOUT_S, f"message {i} offered", max_idle_s=0.001
        )
        ends.append(offered)
    recordings = [d for d in archive.list_recordings() if d.stream_id == stream_id]
    assert len(recordings) == 1
    rid = recordings[0].recording_id
    wait_until(lambda: archive.max_recorded_position(rid) >= ends[-1], TIMEOUT_S, "the recording to catch up")
    archive.stop_recording("aeron:ipc", stream_id)
    publication.close()
    return rid, ends, stream_id


def test_a_client_records_lists_and_replays_a_range_byte_for_byte(
    archive: ArchiveClient, aeron: Aeron, service: ArchiveService
) -> None:
    rid, ends, stream_id = record_some(archive, aeron, 2_000)
    d = archive.list_recording(rid)
    assert (d.start_position, d.stop_position, d.stream_id) == (0, ends[-1], stream_id)
    assert archive.stop_position(rid) == ends[-1]
    assert archive.recording_position(rid) == -1  # stopped: Aeron's NULL_POSITION
    assert archive.start_position(rid) == 0
    with Catalog.open(service.ctx.archive_dir) as catalog:
        local = catalog.recording(rid)
    assert (local.session_id, local.start_position, local.stop_position, local.channel) == (
        d.session_id,
        d.start_position,
        d.stop_position,
        d.original_channel,
    )
    # a range from the middle: messages 500..1499, at their original positions
    start, end = ends[499], ends[1499]
    subscription, replay_session_id = archive.replay(rid, stream_id=next(_streams), position=start, length=end - start)
    received = Received(length=100)
    drain(subscription, received, 1000, replay_image_session_id(replay_session_id))
    received.check_once_in_order(500, 1499)
    assert received.positions == ends[500:1500]
    subscription.close()


def table_lines(output: str) -> list[str]:
    """The list table's lines (the service on this process's thread logs to the same stdout)."""
    return [line for line in output.splitlines() if " VALID " in line]


def test_remote_list_prints_the_local_table(
    archive: ArchiveClient, aeron: Aeron, service: ArchiveService, capsys: pytest.CaptureFixture[str]
) -> None:
    record_some(archive, aeron, 50)
    record_some(archive, aeron, 70)
    assert archive_cli(service.ctx.archive_dir, "list") == 0
    local = table_lines(capsys.readouterr().out)
    driver_dir = aeron.context.dir
    assert (
        archive_cli(
            service.ctx.archive_dir,
            "list",
            "--control",
            "aeron:ipc",
            "--driver-dir",
            driver_dir,
            "--response-stream-id",
            "77",
        )
        == 0
    )
    remote = table_lines(capsys.readouterr().out)
    assert remote == local and len(local) == 2


def test_bad_requests_get_errors_naming_the_problem(archive: ArchiveClient, aeron: Aeron) -> None:
    rid, ends, stream_id = record_some(archive, aeron, 100)
    stop = ends[-1]
    with pytest.raises(RecordingUnknownError, match="unknown recording id 999"):
        archive.start_replay(999, stream_id=1)
    with pytest.raises(RecordingUnknownError):
        archive.recording_position(-5)
    with pytest.raises(InvalidPositionError, match="not a multiple of 32"):
        archive.start_replay(rid, stream_id=1, position=33)
    with pytest.raises(InvalidPositionError, match="not before recording .* stop position"):
        archive.start_replay(rid, stream_id=1, position=stop)
    with pytest.raises(ArchiveRequestError, match="negative"):
        archive.start_replay(rid, stream_id=1, position=0, length=-7)
    with pytest.raises(ArchiveRequestError, match="media 'tcp' is not one of ipc, udp"):
        archive.start_replay(rid, stream_id=1, channel="aeron:tcp?endpoint=x:1")
    with pytest.raises(ArchiveRequestError, match="UNKNOWN_REPLAY"):
        archive.stop_replay(12345 << 32)
    with pytest.raises(ArchiveRequestError, match="UNKNOWN_SUBSCRIPTION"):
        archive.stop_recording("aeron:ipc", 999_999)
    with pytest.raises(ArchiveRequestError, match="ACTIVE_SUBSCRIPTION"):
        archive.start_recording("aeron:ipc", 42)
        archive.start_recording("aeron:ipc", 42)
    archive.stop_recording("aeron:ipc", 42)
    with pytest.raises(InvalidPositionError, match="not the start of a frame"):
        archive.truncate_recording(rid, ends[10] + 32)
    # the cap on concurrent replays (2 here): replays that wait for a subscriber count
    a = archive.start_replay(rid, stream_id=next(_streams))
    b = archive.start_replay(rid, stream_id=next(_streams))
    with pytest.raises(ArchiveRequestError, match="MAX_REPLAYS"):
        archive.start_replay(rid, stream_id=next(_streams))
    archive.stop_replay(a)
    archive.stop_all_replays()
    with pytest.raises(ArchiveRequestError, match="UNKNOWN_REPLAY"):
        archive.stop_replay(b)
    # truncate, then purge
    archive.truncate_recording(rid, ends[49])
    assert archive.stop_position(rid) == ends[49]
    archive.purge_recording(rid)
    with pytest.raises(RecordingUnknownError):
        archive.list_recording(rid)
    assert rid not in [d.recording_id for d in archive.list_recordings()]


def test_a_late_joiner_catches_up_from_the_recording_onto_the_live_stream(archive: ArchiveClient, aeron: Aeron) -> None:
    """2 s of history (the point is the same as 10 s, at a fifth of the test time), then a merge while the
    publisher keeps publishing: every message once, in order, positions continuous."""
    stream_id = next(_streams)
    archive.start_recording("aeron:ipc", stream_id)
    publication = aeron.add_publication("aeron:ipc", stream_id)
    wait_until(lambda: publication.is_connected, TIMEOUT_S, "the recording to subscribe")
    publisher = SequencedPublisher(publication, length=64, rate=20_000).start()
    time.sleep(2.0)  # pace: the history the late joiner replays (2 s at 20,000 messages/s)
    rid = next(d.recording_id for d in archive.list_recordings() if d.stream_id == stream_id)
    received = Received(length=64)
    with ipc_merge(
        archive,
        rid,
        stream_id,
        start_position=0,
    ) as merge:
        wait_until(lambda: merge.is_merged, TIMEOUT_S, "the merge", do_work=lambda: merge.poll(received.handler, 200))
        assert merge.live_join_position > 0
        replayed = len(received.seqs)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            merge.poll(received.handler, 200)
        sent = publisher.stop()
        wait_until(
            lambda: len(received.seqs) >= sent,
            TIMEOUT_S,
            "the live tail",
            do_work=lambda: merge.poll(received.handler, 200),
        )
    received.check_once_in_order(0, sent - 1)
    assert received.positions == publisher.positions
    assert 0 < replayed < sent
    archive.stop_recording("aeron:ipc", stream_id)


def test_a_purged_start_is_an_error_or_the_oldest_position_when_asked(archive: ArchiveClient, aeron: Aeron) -> None:
    rid, ends, stream_id = record_some(archive, aeron, 3_000, length=200)  # ~700 KiB: several 128 KiB segments
    removed = archive.purge_segments(rid, 300_000)
    assert removed >= 1
    start = archive.start_position(rid)
    assert start > 0
    with pytest.raises(InvalidPositionError, match="purged"):
        archive.start_replay(rid, stream_id=1, position=0)
    with pytest.raises(InvalidPositionError, match="oldest position kept is"):
        ipc_merge(
            archive,
            rid,
            stream_id,
            start_position=0,
        )
    merge = ipc_merge(
        archive,
        rid,
        stream_id,
        start_position=0,
        oldest_if_purged=True,
    )
    assert (merge.start_position, merge.skipped) == (start, start)
    merge.close()


def test_the_shared_secret_challenge_admits_only_the_right_answer(
    archive_driver: DriverProcess, aeron: Aeron, tmp_path: os.PathLike[str]
) -> None:
    ctx = ArchiveContext(
        archive_dir=os.path.join(tmp_path, "auth"),
        driver_dir=archive_driver.dir,
        local_control_channel="aeron:ipc",
        control_stream_id=31,
        auth_secret=b"s3cret",
        authenticate_local=True,
    )
    with ArchiveService.launch(ctx) as service:
        base = dict(aeron=aeron, control_stream_id=31, message_timeout_ns=5_000_000_000)
        with pytest.raises(AuthenticationRejectedError, match="requires authentication"):
            ArchiveClient.connect(ArchiveClientContext(**base))  # type: ignore[arg-type]
        with pytest.raises(AuthenticationRejectedError, match="answer to the challenge is wrong"):
            ArchiveClient.connect(ArchiveClientContext(auth_secret=b"guess", **base))  # type: ignore[arg-type]
        with ArchiveClient.connect(ArchiveClientContext(auth_secret=b"s3cret", **base)) as client:  # type: ignore[arg-type]
            assert client.list_recordings() == []
        assert service.counters is not None and service.counters.auth_failures.get() == 1


def test_a_client_of_another_major_version_is_refused_with_a_clear_error(service: ArchiveService, aeron: Aeron) -> None:
    responses = aeron.add_subscription("aeron:ipc", 88)
    control = aeron.add_exclusive_publication("aeron:ipc", service.ctx.control_stream_id)
    wait_until(lambda: control.is_connected, TIMEOUT_S, "control connected")
    request = cc.ConnectRequest(
        correlation_id=7, response_stream_id=88, version=cc.semantic_version(2, 0, 0), response_channel="aeron:ipc"
    )
    wait_until(lambda: control.offer(cc.encode(request)) > 0, TIMEOUT_S, "the connect request offered")
    got: list[cc.ControlMessage] = []
    wait_until(
        lambda: got, TIMEOUT_S, "the refusal", do_work=lambda: responses.poll(lambda b, h: got.append(cc.decode(b)), 10)
    )
    response = got[0]
    assert isinstance(response, cc.ControlResponse) and response.code == cc.ControlResponseCode.ERROR
    assert "client protocol version 2.0.0 is not compatible" in response.error_message
    responses.close()
    control.close()


def test_fuzzed_control_messages_are_dropped_while_an_honest_client_is_served(
    archive: ArchiveClient, aeron: Aeron, service: ArchiveService
) -> None:
    rid, ends, _ = record_some(archive, aeron, 200)
    rng = random.Random(2511)
    sid = archive.control_session_id
    valid = [
        cc.ListRecordingsRequest(control_session_id=sid, correlation_id=1, from_recording_id=0, record_count=5),
        cc.ReplayRequest(
            control_session_id=sid,
            correlation_id=2,
            recording_id=rid,
            position=0,
            length=64,
            replay_stream_id=5,
            file_io_max_length=0,
            replay_token=0,
            replay_channel="aeron:ipc",
        ),
        cc.ConnectRequest(correlation_id=3, response_stream_id=20, version=0, response_channel="aeron:ipc"),
        cc.TruncateRecordingRequest(control_session_id=sid, correlation_id=4, recording_id=rid, position=1 << 62),
    ]
    encoded = [cc.encode(m) for m in valid]
    attacker = aeron.add_publication("aeron:ipc", service.ctx.control_stream_id)
    wait_until(lambda: attacker.is_connected, TIMEOUT_S, "the attacker's publication")
    before = service.counters.requests_dropped.get() if service.counters else 0
    for round_ in range(40):
        for _ in range(50):
            kind = rng.randrange(4)
            if kind == 0:
                data = rng.randbytes(rng.randrange(1, 300))
            elif kind == 1:
                data = bytearray(rng.choice(encoded))
                for _ in range(rng.randrange(1, 6)):
                    data[rng.randrange(len(data))] = rng.randrange(256)
                data = bytes(data)
            elif kind == 2:
                data = rng.choice(encoded)[: rng.randrange(1, 40)]
            else:  # a valid request of someone else's session (guessed id): dropped, never served
                data = cc.encode(
                    cc.ListRecordingsRequest(
                        control_session_id=rng.randrange(1 << 40),
                        correlation_id=9,
                        from_recording_id=0,
                        record_count=100,
                    )
                )
            wait_until(lambda: attacker.offer(data) > 0, TIMEOUT_S, "the attacker's offer", max_idle_s=0.001)
        # the honest client is served correctly meanwhile
        assert archive.stop_position(rid) == ends[-1]
        if round_ % 10 == 0:
            assert [d.recording_id for d in archive.list_recordings()][-1] == rid
    assert service.counters is not None
    assert service.counters.requests_dropped.get() - before > 500
    counters = read_counters(service.ctx.archive_dir)
    assert counters is not None and counters[1]["archive control requests dropped"] > 500
    assert len(service.conductor.sessions if service.conductor else {}) <= service.ctx.max_sessions
    attacker.close()


def test_kill_9_of_the_service_mid_replay_is_a_clear_client_error_and_a_restart_serves_the_catalog(
    archive_driver: DriverProcess, aeron: Aeron, tmp_path: os.PathLike[str]
) -> None:
    archive_dir = os.path.join(tmp_path, "killed")
    stream_id = next(_streams)
    serve = ServeProcess(
        archive_dir, archive_driver.dir, ["--control-stream-id", "41", "--record", f"aeron:ipc:{stream_id}"]
    )
    serve.start()
    try:
        publication = aeron.add_publication("aeron:ipc", stream_id)
        wait_until(lambda: publication.is_connected, TIMEOUT_S, "the service to record")
        publisher = SequencedPublisher(publication, length=64, rate=5_000).start()
        time.sleep(0.5)  # pace: a recording in progress, some 2,500 messages in, when the replay starts
        client = ArchiveClient.connect(ArchiveClientContext(aeron=aeron, control_stream_id=41))
        subscription, replay_session_id = client.replay(0, stream_id=next(_streams), position=0)
        received = Received(length=64)
        drain(subscription, received, 500, replay_image_session_id(replay_session_id))
        serve.kill()
        sent = publisher.stop()
        with pytest.raises(ArchiveNotConnectedError, match="gone"):  # raised by client.poll() in the duty cycle
            wait_until(
                lambda: False,
                TIMEOUT_S,
                "the client to see the service gone",
                do_work=lambda: (client.poll(), subscription.poll(received.handler, 100))[1],
            )
        client.close()
        subscription.close()
        publication.close()
        received.check_once_in_order(0, len(received.seqs) - 1)
        serve = ServeProcess(archive_dir, archive_driver.dir, ["--control-stream-id", "41"]).start()
        with ArchiveClient.connect(ArchiveClientContext(aeron=aeron, control_stream_id=41)) as client:
            d = client.list_recording(0)
            assert 0 < d.stop_position <= publisher.positions[-1]  # closed at its valid prefix
            count = sum(1 for p in publisher.positions if p <= d.stop_position)
            subscription, replay_session_id = client.replay(0, stream_id=next(_streams))
            again = Received(length=64)
            drain(subscription, again, count, replay_image_session_id(replay_session_id))
            again.check_once_in_order(0, count - 1)
            assert again.positions == publisher.positions[:count]
            subscription.close()
        assert sent >= count
    finally:
        serve.stop()


def test_a_udp_replay_crosses_terms_and_padding(archive: ArchiveClient, aeron: Aeron) -> None:
    """Over loopback UDP, a recording of 64 KiB terms (each ends with a PAD frame): the padding travels with
    the replay's session id, or the receiver drops it and the replay stalls at the first term's end."""
    rid, ends, _ = record_some(archive, aeron, 3_000)  # ~290 KiB: four terms and more
    port = 40000 + os.getpid() % 20000
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    subscription, replay_session_id = archive.replay(rid, stream_id=next(_streams), channel=channel)
    received = Received(length=100)
    drain(subscription, received, 3_000, replay_image_session_id(replay_session_id))
    received.check_once_in_order(0, 2_999)
    assert received.positions == ends
    subscription.close()


def test_recording_events_and_the_service_counters_in_logbuf_stat(
    archive: ArchiveClient, aeron: Aeron, service: ArchiveService
) -> None:
    events = aeron.add_subscription("aeron:ipc", service.ctx.events_stream_id)
    wait_until(lambda: events.is_connected, TIMEOUT_S, "the events stream")
    rid, ends, _ = record_some(archive, aeron, 500)
    seen: list[cc.ControlMessage] = []

    def stopped() -> bool:
        events.poll(lambda b, h: seen.append(cc.decode(b)), 100)
        return any(isinstance(m, cc.RecordingStopped) for m in seen)

    wait_until(stopped, TIMEOUT_S, "the recording stopped event")
    started = [m for m in seen if isinstance(m, cc.RecordingStarted)]
    assert [(m.recording_id, m.start_position) for m in started] == [(rid, 0)]
    progress = [m.position for m in seen if isinstance(m, cc.RecordingProgress)]
    assert progress == sorted(progress) and all(0 < p <= ends[-1] for p in progress)
    assert [(m.recording_id, m.stop_position) for m in seen if isinstance(m, cc.RecordingStopped)] == [(rid, ends[-1])]
    signals = [s.signal for s in archive.signals if s.recording_id == rid]
    assert signals == [cc.RecordingSignal.START, cc.RecordingSignal.STOP]
    events.close()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "logbuf.client.stat",
            "--dir",
            aeron.context.dir,
            "--once",
            "--json",
            "--interval",
            "0.05",
            "--archive-dir",
            service.ctx.archive_dir,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    (shown,) = json.loads(done.stdout)["archives"]
    assert shown["alive"] and shown["counters"]["archive control sessions"] == 1
    assert shown["counters"]["archive recordings started"] == 1
    assert shown["counters"]["archive bytes recorded"] == ends[-1]


def test_a_catch_up_can_start_from_a_time_through_the_time_index(
    archive: ArchiveClient, aeron: Aeron, service: ArchiveService
) -> None:
    stream_id = next(_streams)
    archive.start_recording("aeron:ipc", stream_id)
    publication = aeron.add_publication("aeron:ipc", stream_id)
    wait_until(lambda: publication.is_connected, TIMEOUT_S, "the recording to subscribe")
    stamps, ends = publish(publication, [sequenced(i, 200) for i in range(3_000)])  # ~700 KiB: 5 segments
    rid = next(d.recording_id for d in archive.list_recordings() if d.stream_id == stream_id)
    wait_until(lambda: archive.max_recorded_position(rid) >= ends[-1], TIMEOUT_S, "the recording")
    archive.stop_recording("aeron:ipc", stream_id)
    starts = [0, *ends[:-1]]
    seeks: dict[str, Callable[[int], int]] = {
        "local": lambda t: position_at_time(service.ctx.archive_dir, rid, t),  # the archive's own directory
        "remote": lambda t: archive.position_at_time(rid, t),  # through the service, as from another host
    }
    for where, seek in seeks.items():
        for k in (0, 1_234, 2_999):
            first = next(j for j, stamp in enumerate(stamps) if stamp >= stamps[k])
            assert seek(stamps[k]) == starts[first], where
        assert seek(stamps[-1] + 1) == ends[-1], where
    with pytest.raises(RecordingUnknownError):
        archive.position_at_time(rid + 1_000, stamps[0])
    for k, archive_dir in ((1_234, service.ctx.archive_dir), (2_000, None)):
        first = next(j for j, stamp in enumerate(stamps) if stamp >= stamps[k])
        merge = ipc_merge(
            archive,
            rid,
            stream_id,
            start_time=stamps[k],
            archive_dir=archive_dir,
        )
        assert merge.start_position == starts[first]
        received = Received(length=200)
        wait_until(
            lambda: len(received.seqs) >= 100,
            TIMEOUT_S,
            f"the replay from that time (archive_dir={archive_dir})",
            do_work=lambda: merge.poll(received.handler),  # noqa: B023 (awaited within this iteration)
        )
        assert received.seqs[:100] == list(range(first, first + 100))
        merge.close()


def test_a_bounded_replay_stops_at_its_limit_counter_and_goes_on_when_it_grows(
    archive: ArchiveClient, aeron: Aeron
) -> None:
    """The limit: the sub-pos counter of a subscriber this test drives (any counter of the driver will do)."""
    rid, ends, stream_id = record_some(archive, aeron, 1_000)
    assert [d.recording_id for d in archive.list_recordings(channel_fragment="ipc", stream_id=stream_id)] == [rid]
    assert archive.list_recordings(channel_fragment="udp", stream_id=stream_id) == []
    limit_stream = next(_streams)
    limit_sub = aeron.add_subscription("aeron:ipc", limit_stream)
    limit_pub = aeron.add_publication("aeron:ipc", limit_stream)
    wait_until(lambda: limit_pub.is_connected and limit_sub.image_count == 1, TIMEOUT_S, "the limit stream")
    consumed = Received(length=100)

    def advance_limit(count: int) -> None:  # the same sizes, so the limit stream's positions are the recording's
        for i in range(len(consumed.seqs), count):
            while limit_pub.offer(sequenced(i, 100)) < 0:
                limit_sub.poll(consumed.handler, count - len(consumed.seqs))
        wait_until(
            lambda: len(consumed.seqs) >= count,
            TIMEOUT_S,
            "the limit",
            do_work=lambda: limit_sub.poll(consumed.handler, count - len(consumed.seqs)),
        )

    advance_limit(300)
    reader = CountersReader(aeron.cnc.counters_metadata, aeron.cnc.counters_values)
    (counter_id,) = [
        c.counter_id
        for c in reader
        if c.type_id == cd.SUBSCRIBER_POSITION_TYPE_ID
        and f" {limit_stream} " in c.label
        and c.registration_id == limit_sub.registration_id
    ]
    assert reader.value(counter_id) == ends[299]
    replay_stream = next(_streams)
    subscription = aeron.add_subscription("aeron:ipc", replay_stream)
    replay_session_id = archive.start_replay(rid, stream_id=replay_stream, position=0, limit_counter_id=counter_id)
    received = Received(length=100)
    drain(subscription, received, 300, replay_image_session_id(replay_session_id))
    time.sleep(0.3)  # pace: the thing under test: nothing past the limit arrives in this time
    subscription.poll(received.handler, 1000)
    assert len(received.seqs) == 300  # not a message past the limit
    advance_limit(1_000)
    drain(subscription, received, 1_000, replay_image_session_id(replay_session_id))
    received.check_once_in_order(0, 999)
    with pytest.raises(ArchiveRequestError, match="limit counter id 99999"):
        archive.start_replay(rid, stream_id=1, limit_counter_id=99_999)
    for resource in (subscription, limit_sub, limit_pub):
        resource.close()
