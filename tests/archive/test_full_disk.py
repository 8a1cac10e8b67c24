"""An archive on a filesystem that fills up: the catalog is memory-mapped, so a page of it that the
filesystem cannot back must never be written (that is a SIGBUS, and the recorder with every recording
dies). On a small tmpfs of its own, filled to the last page, a new recording fails with a clear error
and the recorder goes on recording the others."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from logbuf.archive import catalog_descriptor as cat
from logbuf.archive.catalog import Catalog, CatalogError
from logbuf.client import Aeron, Context
from logbuf.testing import wait_until
from logbuf.testing.driver_process import DriverProcess
from tests.archive.conftest import RecorderProcess, publish

STREAM = 16


@pytest.fixture
def small_tmpfs() -> Iterator[str]:
    """An 8 MiB tmpfs of its own, unmounted at the end (lazily if a recorder still maps a file there)."""
    mount_point = tempfile.mkdtemp(prefix="logbuf-archive-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mount_point], check=True, timeout=30)
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", mount_point], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", mount_point], check=True, timeout=30)
        os.rmdir(mount_point)


def fill(directory: str) -> str:
    """Write a file into ``directory`` until its filesystem has no page left; returns its path."""
    path = os.path.join(directory, "filler")
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096):
            while True:
                try:
                    f.write(bytes(chunk))
                except OSError as e:
                    assert e.errno == errno.ENOSPC
                    break
    assert os.statvfs(directory).f_bavail == 0
    return path


ADD_A_FOURTH_ENTRY = """
import json, os, sys
from logbuf.archive import catalog_descriptor as cat
from logbuf.archive.catalog import Catalog, CatalogError
from tests.archive.test_full_disk import entry_fields, fill
mount_point = sys.argv[1]
archive = os.path.join(mount_point, "archive")
with Catalog.open_writable(archive, capacity=cat.HEADER_LENGTH + 3 * cat.ENTRY_LENGTH) as catalog:
    ids = [catalog.add_recording(**entry_fields(i)) for i in range(3)]  # one page: the 4th must grow the file
    fill(mount_point)
    try:
        catalog.add_recording(**entry_fields(3))
        error = None
    except CatalogError as e:
        error = str(e)
    print(json.dumps({"error": error, "next": catalog.next_recording_id,
                      "ids": [d.recording_id for d in catalog.recordings()]}))
"""


def test_a_full_filesystem_refuses_a_new_catalog_entry_with_an_error_not_a_sigbus(small_tmpfs: str) -> None:
    child = subprocess.run(  # in a child: the old catalog died of SIGBUS here
        [sys.executable, "-c", ADD_A_FOURTH_ENTRY, small_tmpfs], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, f"rc {child.returncode}: {child.stderr[-2000:]}"
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["error"] is not None and "cannot add recording 3 to catalog" in result["error"]
    assert "No space left on device" in result["error"]
    assert result["next"] == 3 and result["ids"] == [0, 1, 2]  # unchanged
    os.unlink(os.path.join(small_tmpfs, "filler"))
    with Catalog.open_writable(os.path.join(small_tmpfs, "archive")) as catalog:  # room again: it goes in
        assert catalog.add_recording(**entry_fields(3)) == 3


def test_a_new_catalog_is_allocated_whole_or_not_made(small_tmpfs: str) -> None:
    fill(small_tmpfs)
    os.mkdir(os.path.join(small_tmpfs, "archive"))
    with pytest.raises(CatalogError, match="cannot reserve"):
        Catalog.open_writable(os.path.join(small_tmpfs, "archive"))


def entry_fields(i: int) -> dict[str, object]:
    return {
        "channel": "aeron:ipc",
        "source_identity": "aeron:ipc",
        "stream_id": STREAM,
        "session_id": 100 + i,
        "initial_term_id": 0,
        "term_length": 65536,
        "mtu": 1408,
        "segment_length": 131072,
        "start_position": 0,
    }


def test_the_recorder_fails_a_recording_that_does_not_fit_and_keeps_recording_the_others(
    archive_driver: DriverProcess, small_tmpfs: str
) -> None:
    archive = os.path.join(small_tmpfs, "archive")
    Catalog.open_writable(archive, capacity=cat.HEADER_LENGTH + 3 * cat.ENTRY_LENGTH).close()
    recorder = RecorderProcess(archive, archive_driver.dir, "aeron:ipc", STREAM).start()
    try:
        with Aeron.connect(Context(dir=archive_driver.dir, driver_timeout_ns=8_000_000_000)) as aeron:
            pubs = [aeron.add_exclusive_publication("aeron:ipc", STREAM) for _ in range(3)]
            for pub in pubs:
                wait_until(lambda: pub.is_connected, 20, "the recorder to subscribe")  # noqa: B023
                publish(pub, [b"before the disk filled"] * 10)
            wait_until(lambda: recorded(archive) == {p.session_id: p.position for p in pubs}, 20, "three recordings")
            filler = fill(small_tmpfs)
            fourth = aeron.add_exclusive_publication("aeron:ipc", STREAM)
            wait_until(lambda: "recording.start_failed" in recorder.output(), 20, "the fourth recording to fail")
            assert recorder.proc is not None and recorder.proc.poll() is None, recorder.output()  # alive: no SIGBUS
            assert "No space left on device" in recorder.output() and "cannot add recording 3" in recorder.output()
            publish(fourth, [b"not recorded"] * 200)  # drained and discarded: its publisher is not held back
            os.unlink(filler)
            publish(pubs[0], [b"after"] * 10)  # the recorder goes on recording the others
            wait_until(lambda: recorded(archive).get(pubs[0].session_id) == pubs[0].position, 20, "the first to go on")
            assert set(recorded(archive)) == {p.session_id for p in pubs}
    finally:
        assert recorder.stop() == 0, recorder.output()


def recorded(archive: str) -> dict[int, int]:
    """Stop position of each recording in the catalog, by session id."""
    with Catalog.open(archive) as catalog:
        return {d.session_id: d.stop_position for d in catalog.recordings()}
