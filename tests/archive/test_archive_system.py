"""A real driver, real recorder processes, real publishers: record, replay, verify, kill, restart, retention."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from logbuf.archive.catalog import Catalog, RecordingDescriptor, RecordingState
from logbuf.archive.replay import Replay, ReplayError
from logbuf.archive.segments import segment_base_position, segment_file_name, segment_files
from logbuf.archive.verify import verify_recording
from logbuf.client import Aeron, Context, FragmentAssembler
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess, DriverSet
from logbuf.testing.host import free_udp_port
from tests.archive.conftest import ARCHIVE_DRIVER_ARGS, RecorderProcess, publish

pytestmark = pytest.mark.slow
STREAM = 10


@dataclass
class Published:
    payloads: list[bytes]
    reserved: list[int]
    end_positions: list[int]
    session_id: int


def payloads_for(seed: int, count: int, max_length: int = 4000) -> list[bytes]:
    rng = random.Random(seed)
    return [
        rng.randbytes(rng.choice((0, 1, 31, 100, 1376, 1377, 3000, rng.randrange(max_length)))) for _ in range(count)
    ]


def recording_of(archive_dir: str, session_id: int) -> RecordingDescriptor | None:
    try:
        with Catalog.open(archive_dir) as catalog:
            found = [d for d in catalog.recordings() if d.session_id == session_id]
    except Exception:  # not created yet
        return None
    return found[-1] if found else None


def await_stopped(archive_dir: str, session_id: int, timeout_s: float = 15) -> RecordingDescriptor:
    wait_until(
        lambda: (d := recording_of(archive_dir, session_id)) is not None and not d.active,
        timeout_s,
        f"the recording of session {session_id} to stop",
    )
    d = recording_of(archive_dir, session_id)
    assert d is not None
    return d


def replay_all(
    aeron: Aeron,
    archive_dir: str,
    recording_id: int,
    stream_id: int,
    *,
    position: int | None = None,
    length: int | None = None,
    timeout_s: float = 20,
) -> list[tuple[bytes, int, int, int]]:
    """Replay into ``stream_id`` and read it back whole: (payload, reserved value, end position, session id)."""
    got: list[tuple[bytes, int, int, int]] = []
    assembler = FragmentAssembler(lambda buf, h: got.append((bytes(buf), h.reserved_value, h.position, h.session_id)))
    with aeron.add_subscription("aeron:ipc", stream_id) as sub:
        replay = Replay(aeron, archive_dir, recording_id, stream_id=stream_id, position=position, length=length)
        deadline = time.monotonic() + timeout_s
        while not replay.is_done or sub.poll(assembler, 256):
            replay.do_work()
            sub.poll(assembler, 256)
            assert time.monotonic() < deadline, f"replay timed out at {replay.position}"
        assert replay.error is None, replay.error
    return got


@pytest.fixture(scope="module")
def aeron(archive_driver: DriverProcess) -> Iterator[Aeron]:
    with Aeron.connect(Context(dir=archive_driver.dir)) as client:
        yield client


@pytest.fixture(scope="module")
def recorder(archive_driver: DriverProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecorderProcess]:
    """One recorder for the module, recording every image of aeron:ipc stream 10."""
    r = RecorderProcess(str(tmp_path_factory.mktemp("archive")), archive_driver.dir, "aeron:ipc", STREAM).start()
    try:
        yield r
    finally:
        status = r.stop()
        assert status == 0, r.output()


@pytest.fixture(scope="module")
def recorded(recorder: RecorderProcess, aeron: Aeron) -> tuple[RecordingDescriptor, Published]:
    """2000 mixed messages (a third fragmented) recorded from a publication that then closes."""
    pub = aeron.add_publication("aeron:ipc", STREAM)
    wait_until(lambda: pub.is_connected, 20, "the recorder to subscribe")
    payloads = payloads_for(1, 2000)
    reserved, ends = publish(pub, payloads)
    session_id = pub.session_id
    pub.close()
    d = await_stopped(recorder.archive_dir, session_id)
    return d, Published(payloads, reserved, ends, session_id)


# -- recording ----------------------------------------------------------------------------------------------
def test_recording_descriptor_and_segment_files_match_the_stream(
    recorded: tuple[RecordingDescriptor, Published], recorder: RecorderProcess
) -> None:
    d, published = recorded
    assert d.state == RecordingState.VALID and not d.active and not d.interrupted
    assert (d.channel, d.source_identity, d.stream_id, d.session_id) == (
        "aeron:ipc",
        "aeron:ipc",
        STREAM,
        published.session_id,
    )
    assert (d.term_length, d.mtu, d.segment_length) == (64 * 1024, dh.DEFAULT_MTU_LENGTH, 128 * 1024)
    assert d.start_position == 0 and d.stop_position == published.end_positions[-1]
    now_ms = time.time_ns() // 1_000_000
    assert d.start_time_ms <= d.stop_time_ms <= now_ms  # stamped in order, both in the past
    files = segment_files(recorder.archive_dir, d.recording_id)
    expected_bases = sorted(
        {
            segment_base_position(d.start_position, p, d.term_length, d.segment_length)
            for p in range(d.start_position, d.stop_position, d.term_length)
        }
    )
    assert [base for base, _ in files] == expected_bases
    assert all(path.name == segment_file_name(d.recording_id, base) for base, path in files)
    # The first message's frame sits at file offset position - base, header and payload as published.
    first = files[0][1].read_bytes()
    length, version, flags, frame_type, term_offset, session_id, stream_id, term_id, reserved = dh.HEADER.unpack_from(
        first
    )
    assert (length, flags, frame_type, term_offset, session_id, term_id) == (
        len(published.payloads[0]) + 32,
        dh.UNFRAGMENTED,
        dh.HDR_TYPE_DATA,
        0,
        d.session_id,
        d.initial_term_id,
    )
    assert reserved == published.reserved[0] and first[32:length] == published.payloads[0]
    result = verify_recording(recorder.archive_dir, d)
    assert result.ok and result.end_position == d.stop_position, result


def test_replay_delivers_byte_identical_messages_at_the_original_positions(
    recorded: tuple[RecordingDescriptor, Published], recorder: RecorderProcess, aeron: Aeron
) -> None:
    d, published = recorded
    got = replay_all(aeron, recorder.archive_dir, d.recording_id, 91)
    assert [g[0] for g in got] == published.payloads
    assert [g[1] for g in got] == published.reserved
    assert [g[2] for g in got] == published.end_positions
    assert len({g[3] for g in got}) == 1 and got[0][3] != d.session_id  # the replay's own session


def test_bounded_replay_from_a_middle_position_delivers_exactly_that_range(
    recorded: tuple[RecordingDescriptor, Published], recorder: RecorderProcess, aeron: Aeron
) -> None:
    d, published = recorded
    first, last = 700, 1300
    start = published.end_positions[first - 1]
    length = published.end_positions[last] - start
    got = replay_all(aeron, recorder.archive_dir, d.recording_id, 92, position=start, length=length)
    assert [g[0] for g in got] == published.payloads[first : last + 1]
    assert [g[2] for g in got] == published.end_positions[first : last + 1]


def test_replay_rejects_bad_positions_naming_the_problem(
    recorded: tuple[RecordingDescriptor, Published], recorder: RecorderProcess, aeron: Aeron
) -> None:
    d, published = recorded
    k = next(i for i, payload in enumerate(published.payloads) if i and len(payload) > 32)
    inside_a_frame = published.end_positions[k - 1] + 32  # 32 bytes into message k
    cases = [
        (33, None, "not a multiple of 32"),
        (d.stop_position, None, "not before recording"),
        (d.stop_position + 4096, None, "not before recording"),
        (inside_a_frame, None, "not the start of a frame"),
        (0, d.stop_position + 32, "runs past recording"),
        (0, -1, "must not be negative"),
    ]
    for position, length, message in cases:
        with pytest.raises(ReplayError, match=message):
            Replay(aeron, recorder.archive_dir, d.recording_id, stream_id=93, position=position, length=length)
    with pytest.raises(ReplayError, match="no recording 999"):
        Replay(aeron, recorder.archive_dir, 999, stream_id=93)


def test_replay_follows_a_recording_that_is_still_active(recorder: RecorderProcess, aeron: Aeron) -> None:
    pub = aeron.add_publication("aeron:ipc", STREAM)
    wait_until(lambda: pub.is_connected, 10, "the recorder to subscribe")
    before, after = payloads_for(2, 300), payloads_for(3, 300)
    publish(pub, before)
    wait_until(
        lambda: (
            (r := recording_of(recorder.archive_dir, pub.session_id)) is not None and r.stop_position == pub.position
        ),
        10,
        "the recording to catch up",
    )
    d = recording_of(recorder.archive_dir, pub.session_id)
    assert d is not None and d.active and d.stop_time_ms == -1
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda buf, h: got.append(bytes(buf)))
    with aeron.add_subscription("aeron:ipc", 94) as sub:
        replay = Replay(aeron, recorder.archive_dir, d.recording_id, stream_id=94)
        deadline = time.monotonic() + 20
        pending = list(after)
        while not replay.is_done or sub.poll(assembler, 256):
            if pending:
                publish(pub, [pending.pop(0)])
                if not pending:
                    pub.close()  # the recording stops, then the replay ends at its stop position
            replay.do_work()
            sub.poll(assembler, 256)
            assert time.monotonic() < deadline, f"replay timed out at {replay.position}"
    assert replay.error is None, replay.error
    assert got == before + after
    assert not await_stopped(recorder.archive_dir, d.session_id).active


# -- CLI ------------------------------------------------------------------------------------------------------
def run_cli(archive_dir: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logbuf.archive.main", "-d", archive_dir, "--log-level", "warning", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_list_describe_and_dump_show_the_recording(
    recorded: tuple[RecordingDescriptor, Published], recorder: RecorderProcess
) -> None:
    d, published = recorded
    out = run_cli(recorder.archive_dir, "list", "--json")
    assert out.returncode == 0, out.stderr
    listed = [json.loads(line) for line in out.stdout.splitlines()]
    [entry] = [e for e in listed if e["recording_id"] == d.recording_id]
    assert entry["stop_position"] == d.stop_position and entry["state"] == "VALID"
    out = run_cli(recorder.archive_dir, "describe", str(d.recording_id))
    assert out.returncode == 0 and f"session_id       {d.session_id}" in out.stdout
    out = run_cli(recorder.archive_dir, "dump", str(d.recording_id), "--json", "--limit", "3", "--payload-bytes", "8")
    frames = [json.loads(line) for line in out.stdout.splitlines()]
    assert [f["position"] for f in frames] == [0, *published.end_positions[:2]]
    assert [f["reserved_value"] for f in frames] == published.reserved[:3]
    assert frames[1]["payload_hex"] == published.payloads[1][:8].hex()
    out = run_cli(recorder.archive_dir, "dump", str(d.recording_id), "--limit", "1")
    assert out.returncode == 0 and "DATA" in out.stdout and f"session={d.session_id}" in out.stdout
    out = run_cli(recorder.archive_dir, "describe", "4242")
    assert out.returncode == 2 and "no recording 4242" in out.stderr
    out = run_cli(os.path.join(recorder.archive_dir, "nowhere"), "list")
    assert out.returncode == 2 and "no archive catalog" in out.stderr


def copy_archive(src: str, dst: str) -> str:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.log"))
    return dst


def test_verify_reports_a_truncated_segment_and_a_corrupted_frame_at_their_positions(
    recorded: tuple[RecordingDescriptor, Published], recorder: RecorderProcess, tmp_path: Any
) -> None:
    d, published = recorded
    archive = copy_archive(recorder.archive_dir, str(tmp_path / "a"))
    assert run_cli(archive, "verify", str(d.recording_id)).returncode == 0
    # Corrupt the term id of a frame in the middle of the second segment.
    victim = next(p for p in published.end_positions if p > d.segment_length + 5000)
    base = segment_base_position(d.start_position, victim, d.term_length, d.segment_length)
    path = os.path.join(archive, segment_file_name(d.recording_id, base))
    with open(path, "r+b") as f:
        f.seek(victim - base + dh.TERM_ID_FIELD_OFFSET)
        f.write((12345).to_bytes(4, "little", signed=True))
    out = run_cli(archive, "verify", str(d.recording_id), "--json")
    assert out.returncode == 1
    report = json.loads(out.stdout)
    assert report["ok"] is False and report["position"] == victim
    assert "term id field 12345 does not match" in report["reason"]
    # Truncate the fourth segment inside a frame: verify names that frame (after restoring the first fault).
    shutil.rmtree(archive)
    archive = copy_archive(recorder.archive_dir, str(tmp_path / "b"))
    base = 3 * d.segment_length
    cut = base + 10_000
    frame_start = max(p for p in [0, *published.end_positions] if p <= cut)
    path = os.path.join(archive, segment_file_name(d.recording_id, base))
    os.truncate(path, cut - base)
    out = run_cli(archive, "verify")
    assert out.returncode == 1
    assert f"BAD at position {frame_start}: segment file {path} is truncated" in out.stdout
    # A zeroed frame length: "no frame here" at that position.
    shutil.rmtree(archive)
    archive = copy_archive(recorder.archive_dir, str(tmp_path / "c"))
    victim = published.end_positions[99]
    with open(os.path.join(archive, segment_file_name(d.recording_id, 0)), "r+b") as f:
        f.seek(victim)
        f.write(bytes(4))
    out = run_cli(archive, "verify", str(d.recording_id))
    assert out.returncode == 1 and f"BAD at position {victim}: no frame here" in out.stdout


def test_retention_drops_whole_old_segments_and_delete_removes_the_recording(
    recorded: tuple[RecordingDescriptor, Published], recorder: RecorderProcess, tmp_path: Any, aeron: Aeron
) -> None:
    d, published = recorded
    archive = copy_archive(recorder.archive_dir, str(tmp_path / "a"))
    rid = str(d.recording_id)
    before = segment_files(archive, d.recording_id)
    out = run_cli(archive, "retention", rid, "--before-position", str(2 * d.segment_length + 100))
    assert out.returncode == 0, out.stderr
    after = segment_files(archive, d.recording_id)
    assert [b for b, _ in after] == [b for b, _ in before][2:]
    with Catalog.open(archive) as catalog:
        kept = catalog.recording(d.recording_id)
    assert kept.start_position == 2 * d.segment_length and kept.stop_position == d.stop_position
    assert verify_recording(archive, kept).ok
    got = replay_all(aeron, archive, d.recording_id, 95)
    # A term boundary starts a message (messages never span terms): the replay brings back whole messages.
    expected = [i for i, p in enumerate(published.end_positions) if p > 2 * d.segment_length]
    assert [g[2] for g in got] == [published.end_positions[i] for i in expected]
    assert [g[0] for g in got] == [published.payloads[i] for i in expected]
    # By time: segments last written long ago go; the newest ones stay.
    old = time.time() - 7200
    for _, path in after[:3]:
        os.utime(path, (old, old))
    out = run_cli(archive, "retention", "--older-than", "1h")
    assert out.returncode == 0, out.stderr
    assert [b for b, _ in segment_files(archive, d.recording_id)] == [b for b, _ in after][3:]
    out = run_cli(archive, "delete", rid)
    assert out.returncode == 0, out.stderr
    assert segment_files(archive, d.recording_id) == []
    with Catalog.open(archive) as catalog:
        assert catalog.recording(d.recording_id).state == RecordingState.DELETED
    assert rid not in [line.split()[0] for line in run_cli(archive, "list").stdout.splitlines()]
    with pytest.raises(ReplayError, match="DELETED"):
        Replay(aeron, archive, d.recording_id, stream_id=96)
    out = run_cli(archive, "retention", rid)
    assert out.returncode == 2 and "needs --before-position" in out.stderr


# -- failures -------------------------------------------------------------------------------------------------
def test_recorder_killed_mid_stream_leaves_an_interrupted_recording_with_its_valid_prefix(
    archive_driver: DriverProcess, aeron: Aeron, tmp_path: Any
) -> None:
    archive = str(tmp_path / "killed")
    r = RecorderProcess(archive, archive_driver.dir, "aeron:ipc", 12).start()
    pub = aeron.add_publication("aeron:ipc", 12)
    try:
        wait_until(lambda: pub.is_connected, 20, "the recorder to subscribe")
        payloads, ends = payloads_for(4, 4000), []
        for i in range(0, len(payloads), 50):
            ends += publish(pub, payloads[i : i + 50])[1]
            d = recording_of(archive, pub.session_id)
            if d is not None and d.stop_position > 300_000:
                break
        r.kill()
    finally:
        pub.close()
    with Catalog.open(archive) as catalog:
        [seen] = catalog.recordings()
        stored = seen.stop_position
    assert seen.interrupted and not seen.active and seen.stop_time_ms > 0
    out = run_cli(archive, "recover")
    assert out.returncode == 0 and "interrupted, valid prefix kept" in out.stdout, out.stdout + out.stderr
    with Catalog.open(archive) as catalog:
        d = catalog.recording(seen.recording_id)
    assert d.interrupted and not d.active and d.stop_position >= stored > 300_000
    assert d.stop_position <= ends[-1]
    assert verify_recording(archive, d).ok
    got = replay_all(aeron, archive, d.recording_id, 97)
    count = sum(1 for end in ends if end <= d.stop_position)  # (a message cut mid-fragments is not delivered)
    assert [g[0] for g in got] == payloads[:count]
    assert [g[2] for g in got] == ends[:count]


def test_a_udp_image_is_recorded_and_replays_identically(
    archive_driver: DriverProcess, aeron: Aeron, tmp_path: Any
) -> None:
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|term-length=64k"
    archive = str(tmp_path / "udp")
    r = RecorderProcess(archive, archive_driver.dir, channel, 13).start()
    try:
        pub = aeron.add_publication(channel, 13)
        wait_until(lambda: pub.is_connected, 20, "the UDP image to connect")
        payloads = payloads_for(5, 500)
        _, ends = publish(pub, payloads)
        session_id = pub.session_id
        pub.close()
        d = await_stopped(archive, session_id, timeout_s=20)
    finally:
        assert r.stop() == 0, r.output()
    assert d.channel == channel and d.source_identity.startswith("127.0.0.1:")
    assert d.stop_position == ends[-1] and verify_recording(archive, d).ok
    got = replay_all(aeron, archive, d.recording_id, 98)
    assert [g[0] for g in got] == payloads and [g[2] for g in got] == ends


def test_recording_survives_a_driver_restart(tmp_path: Any, driver_factory: DriverSet) -> None:
    args = [a if a != "2s" else "1s" for a in ARCHIVE_DRIVER_ARGS]
    driver = driver_factory(base=args)
    archive = str(tmp_path / "restart")
    r = RecorderProcess(archive, driver.dir, "aeron:ipc", 14, ["--driver-timeout", "1s"]).start()
    try:
        with Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=1_000_000_000)) as client:
            pub = client.add_publication("aeron:ipc", 14)
            wait_until(lambda: pub.is_connected, 20, "the recorder to subscribe")
            first = payloads_for(6, 300)
            _, ends = publish(pub, first)
            session_id = pub.session_id
            wait_until(
                lambda: (x := recording_of(archive, session_id)) is not None and x.stop_position == ends[-1],
                10,
                "the recording to catch up",
            )
            driver.kill()
            d = await_stopped(archive, session_id, timeout_s=10)  # the recorder saw the driver go
        assert not d.interrupted and d.stop_position == ends[-1] and verify_recording(archive, d).ok
        driver.start()  # a new driver takes the directory over (its predecessor's heartbeat is stale by now)
        with Aeron.connect(Context(dir=driver.dir)) as client:
            pub = client.add_publication("aeron:ipc", 14)
            wait_until(lambda: pub.is_connected, 20, "the recorder to resubscribe to the new driver")
            second = payloads_for(7, 300)
            publish(pub, second)
            session2 = pub.session_id
            pub.close()
            d2 = await_stopped(archive, session2)
            assert d2.recording_id == d.recording_id + 1 and verify_recording(archive, d2).ok
            got = replay_all(client, archive, d.recording_id, 99)
            assert [g[0] for g in got] == first
    finally:
        status = r.stop()
    assert status == 0, r.output()


def test_cli_replay_serves_a_subscriber(
    recorded: tuple[RecordingDescriptor, Published],
    recorder: RecorderProcess,
    aeron: Aeron,
    archive_driver: DriverProcess,
) -> None:
    d, published = recorded
    got: list[bytes] = []
    assembler = FragmentAssembler(lambda buf, h: got.append(bytes(buf)))
    with aeron.add_subscription("aeron:ipc", 90) as sub:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "logbuf.archive.main",
                "-d",
                recorder.archive_dir,
                "--log-level",
                "warning",
                "replay",
                str(d.recording_id),
                "--stream-id",
                "90",
                "--driver-dir",
                archive_driver.dir,
                "--position",
                str(published.end_positions[1499]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 20
        while len(got) < 500:
            sub.poll(assembler, 256)
            assert time.monotonic() < deadline and proc.poll() in (None, 0), proc.communicate()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert f"replayed recording {d.recording_id} from {published.end_positions[1499]} to {d.stop_position}" in out
    assert got == published.payloads[1500:]


def test_a_recording_that_cannot_write_stops_interrupted_and_no_longer_holds_the_publisher(
    archive_driver: DriverProcess, aeron: Aeron, tmp_path: Any
) -> None:
    archive = str(tmp_path / "full")
    Catalog.open_writable(archive).close()  # the catalog exists; segment files cannot grow past 256 KiB
    # The recorder with a 256 KiB file-size limit (SIGXFSZ ignored: writes fail with EFBIG instead).
    launcher = (
        "import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024)); "
        "sys.argv = ['logbuf-archive', *sys.argv[1:]]; runpy.run_module('logbuf.archive.main', run_name='__main__')"
    )
    r = RecorderProcess(archive, archive_driver.dir, "aeron:ipc", 15)
    with open(r.log_path, "ab") as out:
        r.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                launcher,
                "-d",
                archive,
                "record",
                "--channel",
                "aeron:ipc",
                "--stream-id",
                "15",
                "--driver-dir",
                archive_driver.dir,
                "--segment-length",
                "512k",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        pub = aeron.add_publication("aeron:ipc", 15)
        wait_until(lambda: pub.is_connected, 20, "the recorder to subscribe")
        publish(pub, payloads_for(8, 600), timeout_s=20)  # several term windows: the recorder must not hold them
        d = recording_of(archive, pub.session_id)
        pub.close()
    finally:
        assert r.stop() == 0, r.output()
    assert d is not None and d.interrupted and not d.active and d.stop_position == d.start_position
    assert "recording.write_failed" in r.output() and "File too large" in r.output()


def test_a_recording_with_checksums_verifies_replays_identically_and_catches_a_changed_byte(
    archive_driver: DriverProcess, aeron: Aeron, tmp_path: Any
) -> None:
    archive = str(tmp_path / "crc")
    recorder = RecorderProcess(archive, archive_driver.dir, "aeron:ipc", 14, ["--checksum", "crc32"]).start()
    try:
        pub = aeron.add_publication("aeron:ipc", 14)
        wait_until(lambda: pub.is_connected, 20, "the recorder to subscribe")
        payloads = payloads_for(14, 400)
        reserved, ends = publish(pub, payloads)
        session_id = pub.session_id
        pub.close()
        d = await_stopped(archive, session_id)
    finally:
        assert recorder.stop() == 0, recorder.output()
    assert d.checksum.name == "CRC32" and d.session_id == session_id
    first = segment_files(archive, d.recording_id)[0][1].read_bytes()
    assert dh.HEADER.unpack_from(first)[5] != session_id  # the field holds the first payload's CRC-32
    assert verify_recording(archive, d).ok
    got = replay_all(aeron, archive, d.recording_id, 92)
    assert [g[0] for g in got] == payloads and [g[2] for g in got] == ends  # replay rewrites the field
    k = next(i for i, p in enumerate(payloads) if len(p) > 10 and i > 5)
    base, path = segment_files(archive, d.recording_id)[ends[k - 1] // d.segment_length]
    with open(path, "r+b") as f:
        f.seek(ends[k - 1] - base + dh.HEADER_LENGTH + 3)
        f.write(bytes([payloads[k][3] ^ 0x10]))
    out = run_cli(archive, "verify", str(d.recording_id))
    assert out.returncode == 1 and f"BAD at position {ends[k - 1]}: payload checksum" in out.stdout
