"""CnC file: create/open round trip, readiness and version checks, driver liveness, another process."""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from logbuf import native
from logbuf.conduit import cnc_descriptor as cnd
from logbuf.conduit.broadcast import BroadcastTransmitter, CopyBroadcastReceiver
from logbuf.conduit.cnc import (
    ClientLivenessLock,
    CncError,
    CncFile,
    CncNotReadyError,
    CncVersionError,
    client_liveness_lock_held,
    cnc_driver_heartbeat_ms,
    cnc_path,
    initialising_cnc_pid,
    is_driver_active,
)
from logbuf.conduit.error_log import DistinctErrorLog, read_error_log
from logbuf.conduit.ring_buffer import ManyToOneRingBuffer
from tests.logbuf._cnc_children import result_of, spawn

SMALL = dict(to_driver_capacity=4096, to_clients_capacity=2048, counters_values_length=1024, error_log_length=1024)


@pytest.fixture
def directory(tmp_path: object) -> str:
    return os.path.join(str(tmp_path), "driver")


@pytest.fixture
def driver_cnc(directory: str) -> Iterator[CncFile]:
    cnc = CncFile.create(directory, client_liveness_timeout_ns=5_000_000_000, **SMALL)
    yield cnc
    cnc.close()


def set_version(directory: str, version: int) -> None:
    with open(cnc_path(directory), "r+b") as f:
        f.write(struct.pack("<i", version))


def test_open_sees_what_create_wrote(driver_cnc: CncFile, directory: str) -> None:
    before_ms = time.time_ns() // 1_000_000
    client = CncFile.open(directory)
    try:
        assert client.version == cnd.CNC_VERSION == 512
        assert client.path == cnc_path(directory) == os.path.join(directory, "cnc.dat")
        assert client.pid == os.getpid()
        assert client.client_liveness_timeout_ns == 5_000_000_000
        assert abs(client.start_timestamp_ms - before_ms) < 60_000
        assert client.start_timestamp_ms == driver_cnc.start_timestamp_ms
        assert len(client.to_driver) == 4096 + 768
        assert len(client.to_clients) == 2048 + 128
        assert len(client.counters_metadata) == 4 * 1024
        assert len(client.counters_values) == 1024
        assert len(client.error_log) == 1024
        assert os.path.getsize(client.path) == 128 + 4864 + 2176 + 4096 + 1024 + 1024
        # The header is Aeron's: lengths at 4..20, timeout @24, start @32, pid @40.
        with open(client.path, "rb") as f:
            header = struct.unpack_from("<iiiiiiqqq", f.read(48))
        assert header == (512, 4864, 2176, 4096, 1024, 1024, 5_000_000_000, client.start_timestamp_ms, os.getpid())
        # The sections are the same memory from both mappings.
        client_ring = ManyToOneRingBuffer(client.to_driver)
        driver_ring = ManyToOneRingBuffer(driver_cnc.to_driver)
        assert client_ring.write(3, b"command")
        got: list[tuple[int, bytes]] = []
        assert driver_ring.read(lambda t, m: got.append((t, bytes(m)))) == 1
        assert got == [(3, b"command")]
        responses = CopyBroadcastReceiver(client.to_clients)
        BroadcastTransmitter(driver_cnc.to_clients).transmit(9, b"response")
        assert responses.receive(lambda t, p: got.append((t, p))) == 1
        assert got[-1] == (9, b"response")
        DistinctErrorLog(driver_cnc.error_log).record("driver error")
        assert [o.text for o in read_error_log(client.error_log)] == ["driver error"]
        native.put_int64_ordered(driver_cnc.counters_values, 128, 42)
        assert native.get_int64_volatile(client.counters_values, 128) == 42
        del client_ring, driver_ring, responses
    finally:
        client.close()


def test_the_file_is_created_with_the_requested_mode(tmp_path: object) -> None:
    directory = os.path.join(str(tmp_path), "d")
    with CncFile.create(directory, mode=0o640, **SMALL) as cnc:
        assert stat.S_IMODE(os.stat(cnc.path).st_mode) == 0o640


def test_default_sizes_are_aerons(tmp_path: object) -> None:
    with CncFile.create(os.path.join(str(tmp_path), "d")) as cnc:
        assert len(cnc.to_driver) == 1024 * 1024 + 768
        assert len(cnc.to_clients) == 1024 * 1024 + 128
        assert len(cnc.counters_values) == 1024 * 1024
        assert len(cnc.counters_metadata) == 4 * 1024 * 1024
        assert len(cnc.error_log) == 1024 * 1024
        assert cnc.client_liveness_timeout_ns == 10_000_000_000


def test_create_refuses_an_existing_file(driver_cnc: CncFile, directory: str) -> None:
    with pytest.raises(CncError, match="already exists"):
        CncFile.create(directory, **SMALL)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("to_driver_capacity", 5000, "to_driver_capacity=5000 must be a power of 2"),
        ("to_clients_capacity", 512, "to_clients_capacity=512 must be a power of 2 >= 1024"),
        ("counters_values_length", 1000, "values_length=1000 must be a positive multiple of 128"),
        ("error_log_length", 1001, "error_log_length=1001 must be a multiple of 8"),
        ("to_driver_capacity", 1 << 31, "to_driver_capacity makes a 2147484416-byte buffer"),
    ],
)
def test_create_rejects_bad_sizes_naming_them(directory: str, setting: str, value: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CncFile.create(directory, **{**SMALL, setting: value})
    assert not os.path.exists(cnc_path(directory))


def test_open_without_a_file_names_the_directory(directory: str) -> None:
    with pytest.raises(CncError, match=f"no CnC file at {cnc_path(directory)}"):
        CncFile.open(directory)


def test_a_file_still_at_version_zero_is_not_ready(driver_cnc: CncFile, directory: str) -> None:
    set_version(directory, 0)
    with pytest.raises(CncNotReadyError, match="being initialised"):
        CncFile.open(directory)


def test_an_empty_or_short_file_is_not_ready(tmp_path: object) -> None:
    directory = str(tmp_path)
    open(cnc_path(directory), "wb").close()
    with pytest.raises(CncNotReadyError, match="being initialised"):
        CncFile.open(directory)
    with open(cnc_path(directory), "wb") as f:
        f.write(b"\0" * 64)
    with pytest.raises(CncNotReadyError, match="being initialised"):
        CncFile.open(directory)


def test_another_major_version_is_rejected_naming_both(driver_cnc: CncFile, directory: str) -> None:
    set_version(directory, cnd.semantic_version(1, 0, 3))
    with pytest.raises(CncVersionError, match=r"has version 1\.0\.3 \(65539\), this client expects 0\.2\.0 \(512\)"):
        CncFile.open(directory)
    assert not is_driver_active(directory, timeout_ns=10_000_000_000)


def test_another_minor_version_is_accepted(driver_cnc: CncFile, directory: str) -> None:
    set_version(directory, cnd.semantic_version(0, 3, 1))
    with CncFile.open(directory) as cnc:
        assert cnc.version == cnd.semantic_version(0, 3, 1)


def test_a_file_whose_lengths_do_not_add_up_is_corrupt(driver_cnc: CncFile, directory: str) -> None:
    with open(cnc_path(directory), "r+b") as f:
        f.seek(cnd.ERROR_LOG_BUFFER_LENGTH_FIELD_OFFSET)
        f.write(struct.pack("<i", 2048))
    with pytest.raises(CncError, match="is corrupt: .* add up to 14336 bytes, the file has 13312"):
        CncFile.open(directory)


def test_a_fresh_driver_heartbeat_means_an_active_driver(driver_cnc: CncFile, directory: str) -> None:
    assert is_driver_active(directory, timeout_ns=1_000_000_000)  # create stamps the heartbeat with the start time
    assert cnc_driver_heartbeat_ms(driver_cnc) == driver_cnc.start_timestamp_ms
    ring = ManyToOneRingBuffer(driver_cnc.to_driver)
    now_ms = time.time_ns() // 1_000_000
    ring.set_consumer_heartbeat_time(now_ms - 5_000)
    assert cnc_driver_heartbeat_ms(driver_cnc) == now_ms - 5_000
    assert not is_driver_active(directory, timeout_ns=1_000_000_000)
    assert is_driver_active(directory, timeout_ns=10_000_000_000)
    assert is_driver_active(directory, timeout_ns=1_000_000_000, now_ms=now_ms - 4_500)
    del ring


def test_no_file_means_no_active_driver(directory: str) -> None:
    assert not is_driver_active(directory, timeout_ns=1_000_000_000)


def test_a_file_that_never_gets_ready_is_inactive(driver_cnc: CncFile, directory: str) -> None:
    set_version(directory, 0)
    assert not is_driver_active(directory, timeout_ns=200_000_000)


def test_a_file_still_being_initialised_is_waited_for(driver_cnc: CncFile, directory: str) -> None:
    set_version(directory, 0)  # as its creator leaves it until the header is complete
    ready = threading.Timer(0.2, set_version, (directory, cnd.CNC_VERSION))
    ready.start()  # the creator finishes while is_driver_active waits
    try:
        assert is_driver_active(directory, timeout_ns=10_000_000_000)
    finally:
        ready.join(10)


def test_a_file_left_half_initialised_by_a_dead_creator_is_not_waited_for(driver_cnc: CncFile, directory: str) -> None:
    """A driver killed while creating its CnC never finishes it: its pid (written before the version)
    is dead, so nobody waits the driver timeout for it (a relay restarted after SIGKILL did, twice)."""
    set_version(directory, 0)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(10)
    with open(cnc_path(directory), "r+b") as f:
        f.seek(cnd.PID_FIELD_OFFSET)
        f.write(struct.pack("<q", child.pid))
    assert initialising_cnc_pid(directory) == child.pid
    ready = threading.Timer(30.0, set_version, (directory, cnd.CNC_VERSION))
    ready.start()  # would make it active, were it waited for
    try:
        assert not is_driver_active(directory, timeout_ns=60_000_000_000)  # had it waited, the file would be finished
    finally:
        ready.cancel()
    assert initialising_cnc_pid(os.path.join(directory, "missing")) == 0


def test_close_refuses_to_unmap_under_a_live_view(tmp_path: object) -> None:
    cnc = CncFile.create(os.path.join(str(tmp_path), "d"), **SMALL)
    kept = cnc.to_driver[0:8]
    with pytest.raises(BufferError, match="cannot unmap .*cnc.dat"):
        cnc.close()
    kept.release()
    cnc.close()


def test_a_client_in_another_process_opens_the_file_and_sends_a_command(driver_cnc: CncFile, directory: str) -> None:
    driver_ring = ManyToOneRingBuffer(driver_cnc.to_driver)
    first_id = driver_ring.next_correlation_id()
    result = result_of(spawn("cnc_client", directory=directory), 30)
    assert result == {"pid": os.getpid(), "version": 512, "correlation_id": first_id + 1}
    got: list[tuple[int, bytes]] = []
    assert driver_ring.read(lambda t, m: got.append((t, bytes(m)))) == 1
    assert got == [(1, b"hello driver")]
    del driver_ring


def test_a_client_liveness_lock_is_seen_while_held_and_gone_once_released(driver_cnc: CncFile) -> None:
    lock = ClientLivenessLock(driver_cnc.path, 42)
    assert lock.held
    assert client_liveness_lock_held(driver_cnc.path, 42)
    assert not client_liveness_lock_held(driver_cnc.path, 41) and not client_liveness_lock_held(driver_cnc.path, 43)
    assert not client_liveness_lock_held(driver_cnc.path, -1)
    lock.release()
    lock.release()
    assert not client_liveness_lock_held(driver_cnc.path, 42)


def test_a_client_liveness_lock_goes_with_its_process(driver_cnc: CncFile) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from logbuf.conduit.cnc import ClientLivenessLock\n"
            "lock = ClientLivenessLock(sys.argv[1], 7)\n"
            "print(lock.held, flush=True)\n"
            "time.sleep(60)  # pace: hold the lock until the test kills this process\n",
            driver_cnc.path,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        assert client_liveness_lock_held(driver_cnc.path, 7)
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    assert not client_liveness_lock_held(driver_cnc.path, 7)  # the kernel let go when the process died
