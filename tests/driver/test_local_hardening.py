"""Local hardening: a local process that can reach the driver directory, and the machine's limits.

Every test here plays the attacker (or the full disk) against a real driver process and shows the
driver, and its honest clients, carry on.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from logbuf import native
from logbuf.client import Aeron, Context, DirectoryPermissionError, RegistrationError
from logbuf.conduit import command_descriptor as cmd
from logbuf.conduit import ring_buffer_descriptor as rd
from logbuf.conduit.cnc import CncFile, cnc_driver_heartbeat_ms, is_driver_active, wait_for_driver
from logbuf.conduit.counters import CountersReader
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer
from logbuf.driver.system_counters import SystemCounterId
from logbuf.errors import ErrorCode
from logbuf.testing import wait_until
from logbuf.testing.driver_process import system_counter_name_matches
from logbuf.testing.host import rss_bytes
from tests.archive.conftest import RecorderProcess
from tests.driver.conftest import DriverProcess, unique_dir


class Cnc:
    """The attacker's view: the driver's CnC mapped read-write, as any process that can open it."""

    def __init__(self, directory: str) -> None:
        self.file = CncFile.open(directory)
        self.ring = ManyToOneRingBuffer(self.file.to_driver)
        self.counters = CountersReader(self.file.counters_metadata, self.file.counters_values)
        self._system_ids: dict[str, int] = {}

    def counter(self, label: str) -> int:
        """A system counter's value (their ids never change, so each is looked up once)."""
        if label not in self._system_ids:
            ids = [c.counter_id for c in self.counters if system_counter_name_matches(c.label, label)]
            assert len(ids) == 1, f"{label!r}: {ids}"
            self._system_ids[label] = ids[0]
        return self.counters.value(self._system_ids[label])

    def heartbeat_ms(self) -> int:
        return cnc_driver_heartbeat_ms(self.file)

    def claim(self, length: int) -> int:
        """Claim ``length`` bytes of the command ring as a producer does (CAS on the tail)."""
        offset = self.ring._claim_capacity(rd.align(length))
        assert offset >= 0, "command ring full"
        return offset

    def close(self) -> None:
        del self.ring, self.counters
        self.file.close()


@pytest.fixture
def cnc(media_driver: DriverProcess) -> Iterator[Cnc]:
    view = Cnc(media_driver.dir)
    try:
        yield view
    finally:
        view.close()


def connect(directory: str) -> Aeron:
    return Aeron.connect(Context(dir=directory, driver_timeout_ns=8_000_000_000))


def round_trip(aeron: Aeron, stream_id: int, message: bytes = b"hello") -> None:
    """A publication and a subscription on ``stream_id`` that carry ``message``."""
    sub = aeron.add_subscription("aeron:ipc", stream_id)
    pub = aeron.add_publication("aeron:ipc", stream_id)
    wait_until(lambda: pub.is_connected, what="publication connected")
    assert pub.offer(message) > 0
    got: list[bytes] = []
    wait_until(lambda: sub.poll(lambda b, h: got.append(bytes(b)), 10) > 0, what="message")
    assert got == [message]
    pub.close()
    sub.close()


# -- item 6: the command ring cannot be wedged --------------------------------------------------------------
def test_a_command_record_with_an_impossible_length_is_skipped_and_counted(
    media_driver: DriverProcess, cnc: Cnc
) -> None:
    media_driver.expected_errors.append("command ring record of length 2147483632")
    offset = cnc.claim(rd.HEADER_LENGTH)
    rd.MSG_TYPE_ID.pack_into(cnc.ring.buffer, offset + rd.TYPE_OFFSET, cmd.ADD_PUBLICATION)
    rd.record_length_ordered(cnc.ring.buffer, offset, 0x7FFFFFF0)
    with connect(media_driver.dir) as aeron:
        round_trip(aeron, 61)
    assert any("command ring record of length 2147483632" in e for e in media_driver.errors())
    assert cnc.counter("Errors") >= 1


def test_a_client_killed_between_claim_and_commit_is_unblocked_and_counted(
    media_driver: DriverProcess, cnc: Cnc
) -> None:
    with connect(media_driver.dir) as aeron:  # connected before the stall: its keepalives queue behind it
        offset = cnc.claim(rd.HEADER_LENGTH + 40)
        rd.record_length_fenced(cnc.ring.buffer, offset, -(rd.HEADER_LENGTH + 40))  # ... and dies here
        round_trip(aeron, 62)  # waits behind the dead claim for the unblock timeout (1 s here)
        assert not aeron.is_closed  # its keepalives arrived in time
    assert cnc.counter("Unblocked Control Commands") == 1


def test_a_tail_moved_far_ahead_is_put_back(media_driver: DriverProcess, cnc: Cnc) -> None:
    tail_offset = cnc.ring.capacity + rd.TAIL_POSITION_OFFSET
    head = cnc.ring.consumer_position()
    native.put_int64_ordered(cnc.ring.buffer, tail_offset, head + 1000 * cnc.ring.capacity)
    with connect(media_driver.dir) as aeron:  # its first command waits for room in the ring
        round_trip(aeron, 63)
    assert cnc.counter("Unblocked Control Commands") == 1


@dataclass
class DriverLoggingToFile(DriverProcess):
    """A driver whose (lifecycle) log goes to a file (a flood of clients logs more than a pipe holds),
    optionally under another umask or as another user."""

    umask: int = -1
    user: int | None = None
    log_path: str = ""

    def start(self, timeout_s: float = 20.0) -> DriverLoggingToFile:
        log_dir = tempfile.mkdtemp(prefix="logbuf-driver-log-")
        if self.user is not None:
            os.chown(log_dir, self.user, -1)
        self.log_path = os.path.join(log_dir, "driver.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "logbuf.driver.main", "--dir", self.dir, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                umask=self.umask,
                user=self.user,
                cwd=log_dir,
            )
        try:
            wait_for_driver(self.dir, timeout_ns=round(timeout_s * 1e9), heartbeat_timeout_ns=5_000_000_000)
        except TimeoutError:
            raise AssertionError(f"driver did not start: {self.stop()}") from None
        return self

    def stop(self, timeout_s: float = 10.0) -> str:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        with open(self.log_path, encoding="utf-8", errors="replace") as log:
            out = log.read()
        shutil.rmtree(os.path.dirname(self.log_path), ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        return out


def test_a_flood_of_silent_clients_is_reaped_over_several_timer_ticks() -> None:
    """5,000 forged keepalives make 5,000 clients that time out together; the heartbeat must keep
    ticking while they are reaped, not stop until the last one is gone."""
    driver = DriverLoggingToFile(unique_dir(), ["--client-liveness-timeout", "2s"]).start()
    try:
        cnc = Cnc(driver.dir)
        try:
            flood_clients(cnc)
        finally:
            cnc.close()
    finally:
        driver.stop()


def flood_clients(cnc: Cnc) -> None:
    flood = 5_000
    for client_id in range(10_000_000, 10_000_000 + flood):
        payload = cmd.CorrelatedCommand(client_id, 0).encode()
        wait_until(lambda: cnc.ring.write(cmd.CLIENT_KEEPALIVE, payload), 10, "room in the command ring")
    heartbeats_while_reaping: set[int] = set()
    deadline = time.monotonic() + 60
    while (timeouts := cnc.counter("Client liveness timeouts")) < flood:
        assert time.monotonic() < deadline, f"{timeouts} of {flood} clients timed out"
        if timeouts > 0:
            heartbeats_while_reaping.add(cnc.heartbeat_ms())
        time.sleep(0.002)  # pace: samples the heartbeat every 2 ms, well inside the 100 ms reaping tick
    assert cnc.counter("Active clients") == 0
    # 64 per 100 ms tick at most: some 80 ticks, each with its own heartbeat (sampling may miss a few)
    assert len(heartbeats_while_reaping) >= 10, sorted(heartbeats_while_reaping)


# -- item 11: thousands of streams ------------------------------------------------------------------------
def allocated_counters(cnc: Cnc) -> list[str]:
    return [c.label for c in cnc.counters]


@pytest.mark.parametrize(
    "driver_args",
    [
        [
            *("--counters-buffer-length", "16k", "--client-counters-share", "1"),
            *("--publication-linger-timeout", "100ms", "--dir-delete-on-shutdown", "false"),
        ]
    ],
)
def test_a_stream_refused_for_want_of_counters_leaves_nothing_behind(media_driver: DriverProcess, cnc: Cnc) -> None:
    media_driver.expected_errors.append("counters are full")
    publications_dir = os.path.join(media_driver.dir, "publications")
    with connect(media_driver.dir) as aeron:
        pairs = []
        with pytest.raises(RegistrationError, match="counters are full") as refused:
            for stream_id in range(100, 200):
                sub = aeron.add_subscription("aeron:ipc", stream_id)
                pairs.append((aeron.add_publication("aeron:ipc", stream_id), sub))
        assert "capacity 128" in str(refused.value) and "counters_buffer_length" in str(refused.value)
        # 128 records (64 no longer leave room for a pair beside the 63 system counters): the system counters,
        # this client's heartbeat, then 3 per pair (pub-lmt, pub-pos, sub-pos)
        system = len(SystemCounterId)
        assert len(pairs) == (128 - system - 1) // 3 > 0
        before = allocated_counters(cnc)
        assert len(os.listdir(publications_dir)) == len(pairs)  # the refused log was never created
        with pytest.raises(RegistrationError, match="needs 3 counters"):  # again: still nothing leaks
            aeron.add_publication("aeron:ipc", 100 + len(pairs))
        assert allocated_counters(cnc) == before
        assert len(os.listdir(publications_dir)) == len(pairs)
        pub, sub = pairs.pop()
        pub.close()
        sub.close()

        # linger (100 ms) and the counters' free-to-reuse time (1 s) later, the room is there again
        def added() -> bool:
            try:
                pairs.append((aeron.add_publication("aeron:ipc", 300), aeron.add_subscription("aeron:ipc", 300)))
            except RegistrationError:
                return False
            return True

        wait_until(added, 10, "freed counters to be reused", max_idle_s=0.2)  # each refusal is a driver error


@pytest.mark.parametrize(  # one client takes every counter: no per-client share
    "driver_args",
    [["--counters-buffer-length", "16k", "--client-counters-share", "1", "--dir-delete-on-shutdown", "false"]],
)
def test_the_counter_capacity_is_a_setting(media_driver: DriverProcess, cnc: Cnc) -> None:
    media_driver.expected_errors.append("counters are full")
    assert cnc.counters.max_counter_id + 1 == 128
    with connect(media_driver.dir) as aeron:
        added = 0
        with pytest.raises(RegistrationError, match="capacity 128"):
            for stream_id in range(100, 200):
                aeron.add_subscription("aeron:ipc", stream_id)
                aeron.add_publication("aeron:ipc", stream_id)
                added += 1
    assert added == (128 - len(SystemCounterId) - 1) // 3


# -- item 10: a full /dev/shm -------------------------------------------------------------------------------
SMALL_CNC = [
    "--to-driver-buffer-length",
    "64k",
    "--to-clients-buffer-length",
    "64k",
    "--counters-buffer-length",
    "64k",
    "--error-buffer-length",
    "64k",
    "--loss-report-buffer-length",
    "4k",
    "--topic-registry-length",
    "4k",
    "--dir-delete-on-shutdown",
    "false",
]


@pytest.fixture
def small_tmpfs() -> Iterator[str]:
    """A 4 MiB tmpfs of its own: the driver directory on it fills up long before /dev/shm would."""
    mount_point = tempfile.mkdtemp(prefix="logbuf-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mount_point], check=True, timeout=30)
    try:
        yield mount_point
    finally:
        done = subprocess.run(["umount", mount_point], capture_output=True, timeout=30)
        if done.returncode != 0:  # something still maps a file there: detach now, freed when unmapped
            subprocess.run(["umount", "-l", mount_point], check=True, timeout=30)
        os.rmdir(mount_point)


PUBLISH_INTO_A_SECOND_LOG = """
import json, sys
from logbuf.client import Aeron, Context, DirectoryPermissionError, RegistrationError
from logbuf.testing import wait_until
directory = sys.argv[1]
with Aeron.connect(Context(dir=directory, driver_timeout_ns=8_000_000_000)) as aeron:
    first_sub = aeron.add_subscription("aeron:ipc", 1)
    first = aeron.add_publication("aeron:ipc", 1)
    wait_until(lambda: first.is_connected, 30, "the first publication connected")

    def send(publication, subscription, length):
        sent = 0
        while sent < length:  # a page that cannot be had when first written is a SIGBUS
            if publication.offer(bytes(4000)) > 0:
                sent += 4000
            subscription.poll(lambda b, h: None, 100)
        return sent

    send(first, first_sub, 3 * 1024 * 1024 + 8000)  # every page of the first log is now in use
    sub = aeron.add_subscription("aeron:ipc", 2)
    try:
        second = aeron.add_publication("aeron:ipc", 2)
    except RegistrationError as e:
        wait_until(lambda: first.offer(b"the first log still works") > 0, 30, "the offer on the first log")
        got = []
        while not got:
            first_sub.poll(lambda b, h: got.append(bytes(b)), 1)
        print(json.dumps({"refused": e.error_code, "message": str(e), "first": got[0].decode()}))
        sys.exit(0)
    wait_until(lambda: second.is_connected, 30, "the second publication connected")
    print(json.dumps({"sent": send(second, sub, 3 * 1024 * 1024)}))
"""


def test_a_log_that_does_not_fit_is_refused_with_storage_space_instead_of_a_sigbus(small_tmpfs: str) -> None:
    directory = os.path.join(small_tmpfs, "driver")
    driver = DriverProcess(directory, [*SMALL_CNC, "--ipc-term-length", "1m"]).start()
    try:
        child = subprocess.run(
            [sys.executable, "-c", PUBLISH_INTO_A_SECOND_LOG, directory], capture_output=True, text=True, timeout=120
        )
        assert child.returncode == 0, f"publisher died ({child.returncode}): {child.stderr[-2000:]}"
        result = json.loads(child.stdout.strip().splitlines()[-1])
        assert result["refused"] == ErrorCode.STORAGE_SPACE, result
        assert "cannot reserve 3149824 bytes" in result["message"] and "available" in result["message"]
        assert result["first"] == "the first log still works"
        refused_log = re.search(r"log (\S+\.logbuffer)", result["message"])
        assert refused_log is not None and refused_log.group(1).startswith(directory), result["message"]
        assert not os.path.exists(refused_log.group(1))  # no half-made file left behind
        assert driver.proc is not None and driver.proc.poll() is None
        assert any("STORAGE_SPACE" in e for e in driver.errors())
    finally:
        driver.stop()


SUBSCRIBE_AND_POLL = """
import json, sys, time
from logbuf.client import Aeron, Context
with Aeron.connect(Context(dir=sys.argv[1], driver_timeout_ns=8_000_000_000)) as aeron:
    sub = aeron.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{sys.argv[2]}", 7)
    print("ready", flush=True)
    deadline = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < deadline:
        if not sub.poll(lambda b, h: None, 100):
            time.sleep(0.001)  # pace: idle between empty polls for the whole period the test holds it
    print(json.dumps({"images": sub.image_count}), flush=True)
"""


def test_an_image_that_does_not_fit_is_refused_and_the_receiving_driver_stays_up(small_tmpfs: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    receiver = DriverProcess(os.path.join(small_tmpfs, "driver"), SMALL_CNC).start()
    sender = DriverProcess(unique_dir(), ["--dir-delete-on-shutdown", "true"]).start()
    receiver.expected_errors.append("rejected")
    subscriber = subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBE_AND_POLL, receiver.dir, str(port), "3"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert subscriber.stdout is not None and subscriber.stdout.readline().strip() == "ready"
        with connect(sender.dir) as sending:
            # a 2 MiB term: the image's log (6 MiB) cannot fit in the 4 MiB tmpfs
            pub = sending.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|term-length=2m", 7)
            sent, deadline = 0, time.monotonic() + 30
            while sent < 5 * 1024 * 1024 and receiver.proc.poll() is None:  # type: ignore[union-attr]
                if any("rejected" in e for e in receiver.errors()):
                    break
                assert time.monotonic() < deadline, f"sent {sent}, no rejection recorded"
                if pub.offer(bytes(4000)) > 0:
                    sent += 4000
                else:
                    time.sleep(0.001)  # pace: back off on back pressure while streaming until the rejection
            assert receiver.proc is not None and receiver.proc.poll() is None, (
                f"receiving driver died ({receiver.proc.returncode if receiver.proc else None}) after {sent} bytes"
            )
            assert any("cannot reserve" in e for e in receiver.errors())
            assert os.listdir(os.path.join(receiver.dir, "images")) == []
        out, _ = subscriber.communicate(timeout=30)
        assert subscriber.returncode == 0, f"subscriber died ({subscriber.returncode})"
        assert json.loads(out.strip().splitlines()[-1]) == {"images": 0}
    finally:
        subscriber.kill()
        subscriber.communicate(timeout=10)
        sender.stop()
        receiver.stop()


# -- item 9: modes set explicitly, never through the umask ----------------------------------------------
def modes_under(directory: str) -> dict[str, int]:
    """Permission bits of everything under ``directory`` (itself as ".")."""
    found = {".": stat.S_IMODE(os.stat(directory).st_mode)}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, directory)] = stat.S_IMODE(os.stat(path).st_mode)
    return found


def test_group_access_under_umask_077_shares_every_file_and_directory_with_the_group() -> None:
    driver = DriverLoggingToFile(unique_dir(), ["--group-access", "true"], umask=0o077).start()
    try:
        with connect(driver.dir) as aeron:
            aeron.add_subscription("aeron:ipc", 91)
            pub = aeron.add_publication("aeron:ipc", 91)
            modes = modes_under(driver.dir)
        log = os.path.relpath(pub._log_file_name, driver.dir)  # type: ignore[attr-defined]
        assert {k: modes[k] for k in (".", "cnc.dat", "publications", "images", log)} == {
            ".": 0o770,
            "cnc.dat": 0o660,
            "publications": 0o770,
            "images": 0o770,
            log: 0o660,
        }
    finally:
        driver.stop()


@pytest.mark.parametrize(("group_access", "file_mode"), [("false", 0o600), ("true", 0o660)])
def test_archive_files_get_the_drivers_modes_not_the_umasks(
    tmp_path: object, group_access: str, file_mode: int
) -> None:
    driver = DriverLoggingToFile(unique_dir(), ["--group-access", group_access, "--ipc-term-length", "64k"]).start()
    archive_dir = os.path.join(str(tmp_path), "archive")
    recorder = RecorderProcess(archive_dir, driver.dir, "aeron:ipc", 92).start()  # umask 022: files would be 0644
    try:
        with connect(driver.dir) as aeron:
            pub = aeron.add_publication("aeron:ipc", 92)
            wait_until(lambda: pub.is_connected, timeout_s=20, what="recorder subscribed")
            wait_until(lambda: pub.offer(b"recorded") > 0, what="the offer")
            wait_until(lambda: any(n.endswith(".rec") for n in os.listdir(archive_dir)), what="a segment file")
        modes = modes_under(archive_dir)
        written = {name: mode for name, mode in modes.items() if name.endswith((".rec", ".catalog"))}
        assert "archive.catalog" in written and len(written) >= 2, written
        assert set(written.values()) == {file_mode}, written
    finally:
        recorder.stop()
        driver.stop()


# -- item 8: a driver directory squatted by another user --------------------------------------------------
NOBODY = 65534


def test_a_client_refuses_a_driver_directory_owned_by_another_user(media_driver: DriverProcess) -> None:
    """Another user ran a driver at the directory the client uses: it must not connect (that user
    would read every message), and it says why at once instead of waiting out the driver timeout."""
    os.chown(media_driver.dir, NOBODY, 0)
    with pytest.raises(DirectoryPermissionError, match=r"owned by nobody \(uid 65534.*not by root \(uid 0\)"):
        Aeron.connect(Context(dir=media_driver.dir, driver_timeout_ns=30_000_000_000))
    # under group access a directory of one of the user's groups (root's group here) is trusted
    with Aeron.connect(Context(dir=media_driver.dir, driver_timeout_ns=8_000_000_000, group_access=True)) as aeron:
        assert aeron.add_publication("aeron:ipc", 81).registration_id > 0
    os.chown(media_driver.dir, 0, 0)


def test_a_client_refuses_a_driver_directory_writable_by_everyone(media_driver: DriverProcess) -> None:
    os.chmod(media_driver.dir, 0o777)
    with pytest.raises(DirectoryPermissionError, match="writable by every user"):
        Aeron.connect(Context(dir=media_driver.dir, driver_timeout_ns=30_000_000_000))


def test_the_driver_refuses_a_directory_another_user_made_first() -> None:
    directory = unique_dir()
    os.mkdir(directory, 0o755)
    os.chown(directory, NOBODY, NOBODY)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "logbuf.driver.main", "--dir", directory], capture_output=True, timeout=60
        )
        assert done.returncode != 0
        assert b"is owned by nobody (uid 65534" in done.stdout + done.stderr
        assert os.stat(directory).st_uid == NOBODY and os.listdir(directory) == []  # left as it was
    finally:
        shutil.rmtree(directory, ignore_errors=True)


CONNECT_AS_NOBODY = """
import json, os, sys
from logbuf.client import Aeron, Context
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
try:
    Aeron.connect(Context(dir=sys.argv[1], driver_timeout_ns=3_000_000_000))
    print(json.dumps({"connected": True}))
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e), "permission": isinstance(e, PermissionError)}))
"""


def test_a_client_without_permission_is_told_so_not_that_there_is_no_driver(media_driver: DriverProcess) -> None:
    """A group member trusts the directory (its group's), but the driver runs without --group-access (0700)."""
    os.chown(media_driver.dir, 0, NOBODY)
    done = subprocess.run(
        [sys.executable, "-c", CONNECT_AS_NOBODY, media_driver.dir],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LOGBUF_GROUP_ACCESS": "true"},
    )
    os.chown(media_driver.dir, 0, 0)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["permission"] and result["error"] == "DirectoryPermissionError", result
    assert "permission denied" in result["message"] and "no CnC file" not in result["message"]


# -- item 7: commands that name a client act only for that client ----------------------------------------
@pytest.mark.parametrize(
    "driver_args",
    [["--ipc-term-length", "1m", "--client-liveness-timeout", "30s", "--dir-delete-on-shutdown", "false"]],
)
def test_a_client_close_naming_another_client_is_refused_and_the_victim_goes_on(
    media_driver: DriverProcess, cnc: Cnc
) -> None:
    media_driver.expected_errors.append("refused: that client is still open")
    victim = connect(media_driver.dir)
    try:
        sub = victim.add_subscription("aeron:ipc", 71)
        pub = victim.add_publication("aeron:ipc", 71)
        wait_until(lambda: pub.is_connected, what="victim connected")
        assert cnc.counter("Active clients") == 1
        assert cnc.ring.write(cmd.CLIENT_CLOSE, cmd.CorrelatedCommand(victim.client_id, 0).encode())  # forged
        wait_until(
            lambda: any("refused: that client is still open" in e for e in media_driver.errors()), what="refusal"
        )
        assert cnc.counter("Active clients") == 1
        # the victim's stream goes on well past one term window (512 KiB): its limit still moves
        received = 0

        def count(buffer: memoryview, header: object) -> None:
            nonlocal received
            received += 1

        deadline = time.monotonic() + 30
        for _ in range(1_000):
            while pub.offer(bytes(2000)) < 0:
                assert time.monotonic() < deadline, f"victim's offers stuck after {received} messages"
                sub.poll(count, 100)
            sub.poll(count, 100)
        while received < 1_000:
            assert time.monotonic() < deadline, f"received {received}"
            sub.poll(count, 100)
    finally:
        victim.close()
    # its own close is honoured at once (not after the 30 s liveness timeout): it let go of its lock first
    wait_until(lambda: cnc.counter("Active clients") == 0, timeout_s=10, what="the victim's own close")
    assert cnc.counter("Client liveness timeouts") == 0


# -- item 6, soak: random records into a live driver's command ring -------------------------------------------
STREAM_PUBLISHER = """
import json, os, struct, sys, time
from logbuf.client import Aeron, Context
from logbuf.testing import wait_until
directory, stop_path = sys.argv[1], sys.argv[2]
with Aeron.connect(Context(dir=directory, driver_timeout_ns=10_000_000_000)) as aeron:
    pub = aeron.add_publication("aeron:ipc", 55)
    wait_until(lambda: pub.is_connected, 60, "the subscriber")
    body, seq, deadline = bytearray(64), 0, time.monotonic() + 120
    while seq == 0 or not os.path.exists(stop_path):
        struct.pack_into("<q", body, 0, seq)
        if pub.offer(body) > 0:
            seq += 1
            if seq % 64 == 0:
                time.sleep(0.0005)  # a steady stream, not a flood: it must outlast the fuzzing
        assert time.monotonic() < deadline, f"publisher stuck at {seq}"
    struct.pack_into("<q", body, 0, -1)
    while pub.offer(body) < 0:
        assert time.monotonic() < deadline
    print(json.dumps({"published": seq}))
"""

STREAM_SUBSCRIBER = """
import json, struct, sys, time
from logbuf.client import Aeron, Context
state = {"next": 0, "errors": 0, "done": False}
def on_message(buffer, header):
    (seq,) = struct.unpack_from("<q", buffer, 0)
    if seq == -1:
        state["done"] = True
    elif seq != state["next"]:
        state["errors"] += 1
        state["next"] = seq + 1
    else:
        state["next"] += 1
with Aeron.connect(Context(dir=sys.argv[1], driver_timeout_ns=10_000_000_000)) as aeron:
    sub = aeron.add_subscription("aeron:ipc", 55)
    print("ready", flush=True)
    deadline = time.monotonic() + 150
    while not state["done"]:
        if not sub.poll(on_message, 256):
            time.sleep(0.0002)  # pace: idle between empty polls until the end marker
        assert time.monotonic() < deadline, f"subscriber stuck at {state['next']}"
    print(json.dumps({"received": state["next"], "errors": state["errors"]}))
"""


def fuzz_command_ring(cnc: Cnc, rng: random.Random, count: int) -> dict[str, int]:
    """Write ``count`` random records: framed with random type ids and payloads, committed with lying
    lengths, claims left uncommitted (one at a time, each waited out), and bytes scribbled past the tail."""
    ring, done = cnc.ring, {"framed": 0, "lying": 0, "dead": 0, "scribbled": 0}
    type_ids = [t for t in range(1, 0x20) if t != cmd.TERMINATE_DRIVER]  # the interop helper's part of item 7
    for _ in range(count):
        kind = rng.random()
        if kind < 0.70:
            type_id = rng.choice(type_ids) if rng.random() < 0.8 else rng.randint(1, (1 << 31) - 1)
            while type_id == cmd.TERMINATE_DRIVER:
                type_id = rng.randint(1, (1 << 31) - 1)
            payload = rng.randbytes(rng.randint(0, 300))
            wait_until(lambda: ring.write(type_id, payload), 10, "room in the command ring")
            done["framed"] += 1
        elif kind < 0.95:
            claimed = rng.randint(1, 40) * rd.ALIGNMENT
            offset = ring._claim_capacity(claimed)
            if offset < 0:
                time.sleep(0.001)  # pace: the ring is full; let the driver drain it, then draw again
                continue
            ring.buffer[offset + rd.HEADER_LENGTH : offset + claimed] = rng.randbytes(claimed - rd.HEADER_LENGTH)
            rd.MSG_TYPE_ID.pack_into(ring.buffer, offset + rd.TYPE_OFFSET, rng.choice(type_ids))
            lie = rng.choice(
                [rng.randint(1, 7), rng.randint(claimed + 1, 1 << 31 - 1), rng.randint(1 << 20, (1 << 31) - 1)]
            )
            rd.record_length_ordered(ring.buffer, offset, lie)
            done["lying"] += 1
        elif kind < 0.99 or done["dead"] >= 3:
            start = ring.producer_position() & (ring.capacity - 1)
            length = min(rng.randint(1, 256), ring.capacity - start)
            ring.buffer[start : start + length] = rng.randbytes(length)  # unclaimed: never read
            done["scribbled"] += 1
        else:
            offset = ring._claim_capacity(64)
            if offset < 0:
                continue
            claimed_at = ring.producer_position() - 64
            ring.buffer[offset : offset + 64] = bytes(64)  # as a producer finds it (scribbles aside)
            if rng.random() < 0.5:
                rd.record_length_fenced(ring.buffer, offset, -64)  # died after its first store, or before it
            done["dead"] += 1
            wait_until(lambda: ring.consumer_position() > claimed_at, timeout_s=20, what="dead claim unblocked")
    return done


@pytest.mark.slow
def test_random_records_in_the_command_ring_leave_the_driver_and_a_live_stream_unharmed(tmp_path: object) -> None:
    driver = DriverLoggingToFile(
        unique_dir(),
        ["--ipc-term-length", "1m", "--client-liveness-timeout", "6s", "--command-unblock-timeout", "500ms"],
    ).start()
    stop_path = os.path.join(str(tmp_path), "stop")
    subscriber = subprocess.Popen(
        [sys.executable, "-c", STREAM_SUBSCRIBER, driver.dir], stdout=subprocess.PIPE, text=True
    )
    publisher: subprocess.Popen[str] | None = None
    cnc = Cnc(driver.dir)
    try:
        assert subscriber.stdout is not None and subscriber.stdout.readline().strip() == "ready"
        publisher = subprocess.Popen(
            [sys.executable, "-c", STREAM_PUBLISHER, driver.dir, stop_path], stdout=subprocess.PIPE, text=True
        )
        assert driver.proc is not None

        def stream_position() -> int:
            return max([c.value for c in cnc.counters if c.label.startswith("pub-pos")], default=0)

        wait_until(lambda: stream_position() > 0, timeout_s=20, what="the stream flowing")
        position_before = stream_position()
        rss_before = rss_bytes(driver.proc.pid)
        heartbeat_before = cnc.heartbeat_ms()
        done = fuzz_command_ring(cnc, random.Random(14), 3_000)
        assert stream_position() > position_before  # the stream ran while the ring was attacked
        wait_until(lambda: cnc.ring.consumer_position() == cnc.ring.producer_position(), what="ring drained")
        assert driver.proc.poll() is None, "the driver died"
        assert cnc.heartbeat_ms() > heartbeat_before
        assert is_driver_active(driver.dir, timeout_ns=2_000_000_000)
        rss_after = rss_bytes(driver.proc.pid)
        assert rss_after - rss_before < 64 * 1024 * 1024, (rss_before, rss_after)
        assert done["dead"] == 3 and cnc.counter("Unblocked Control Commands") >= 3
        assert any("cannot be valid: skipped" in e for e in driver.errors())  # lies were caught and counted
        # the stream: every message, in order, after 3,000 hostile records
        with open(stop_path, "w"):
            pass
        published = json.loads(publisher.communicate(timeout=60)[0].strip().splitlines()[-1])["published"]
        received = json.loads(subscriber.communicate(timeout=60)[0].strip().splitlines()[-1])
        assert received == {"received": published, "errors": 0}
        assert publisher.returncode == 0 and subscriber.returncode == 0
    finally:
        cnc.close()
        for child in (publisher, subscriber):
            if child is not None and child.poll() is None:
                child.kill()
                child.communicate(timeout=10)
        driver.stop()
