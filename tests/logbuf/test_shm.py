"""Shared-memory segments: names and lengths rejected naming the value, space reserved when created,
modes set whatever the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from logbuf.logbuffer.log_buffer import LogBuffers
from logbuf.logbuffer.standalone import StreamLog
from logbuf.shm import OWNER_AND_GROUP, Segment, ShmError, StorageSpaceError
from tests.support.logs import TERM_LENGTH


@pytest.fixture
def log_name() -> Iterator[str]:
    name = f"t-shm-{uuid.uuid4().hex[:12]}"
    yield name
    Segment.unlink(name)


@pytest.mark.parametrize("name", ["", "a/b", "/leading-slash", "has space", "x" * 201, "tab\there", "ü", None, 7])
def test_bad_shared_memory_names_are_rejected_naming_the_name(name: Any) -> None:
    message = r"shared memory name=.* is invalid: use 1-200 letters, digits, '\.', '_' or '-' \(no '/'\)"
    with pytest.raises(ShmError, match=message) as info:
        Segment.create(name, 4096)
    assert repr(name) in str(info.value)
    with pytest.raises(ShmError, match=message):
        Segment.open(name)
    with pytest.raises(ShmError, match=message):
        StreamLog.create(name, term_length=TERM_LENGTH)
    with pytest.raises(ShmError, match=message):
        LogBuffers.open(name)


def test_a_name_of_200_allowed_characters_is_valid() -> None:
    from logbuf.shm import check_name

    assert check_name("A-z_0.9" + "x" * 193) == "/A-z_0.9" + "x" * 193


@pytest.mark.parametrize("length", [0, -1])
def test_a_segment_of_no_length_is_rejected(log_name: str, length: int) -> None:
    with pytest.raises(ShmError, match=rf"segment length={length} must be positive"):
        Segment.create(log_name, length)


@pytest.fixture
def tiny_tmpfs() -> Iterator[str]:
    """A 1 MiB tmpfs, unmounted afterwards whatever happens."""
    mount_point = tempfile.mkdtemp(prefix="logbuf-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mount_point], check=True, timeout=30)
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", mount_point], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", mount_point], check=True, timeout=30)
        os.rmdir(mount_point)


def test_a_file_segment_is_allocated_in_full_when_created(tiny_tmpfs: str) -> None:
    path = os.path.join(tiny_tmpfs, "log")
    segment = Segment.create_file(path, 512 * 1024)
    try:
        assert os.stat(path).st_blocks * 512 >= 512 * 1024  # not sparse: every page is there already
    finally:
        segment.close()


def test_a_file_segment_that_does_not_fit_is_refused_and_removed(tiny_tmpfs: str) -> None:
    path = os.path.join(tiny_tmpfs, "log")
    with pytest.raises(StorageSpaceError, match=r"cannot reserve 2097152 bytes for file .*log.* bytes available"):
        Segment.create_file(path, 2 * 1024 * 1024)
    assert not os.path.exists(path)
    assert isinstance(StorageSpaceError(28, "x"), OSError)  # callers that catch OSError see it too


def test_a_new_segment_gets_its_mode_whatever_the_umask(tmp_path: object) -> None:
    name = f"logbuf-test-mode-{os.getpid()}"
    old = os.umask(0o077)
    try:
        file_segment = Segment.create_file(os.path.join(str(tmp_path), "f"), 4096, mode=OWNER_AND_GROUP)
        shm_segment = Segment.create(name, 4096, mode=OWNER_AND_GROUP)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(os.path.join(str(tmp_path), "f")).st_mode) == 0o660
        assert stat.S_IMODE(os.stat(f"/dev/shm/{name}").st_mode) == 0o660
    finally:
        file_segment.close()
        shm_segment.close()
        Segment.unlink(name)
