"""``Context.pre_touch_mapped_memory`` (default on): a client maps every page of a log when it maps the
log, so no page fault lands on the data path. Read back from the kernel: the resident size of the log's
mapping in this process (``/proc/self/smaps``) right after ``add_publication``."""

from __future__ import annotations

import os
import re

import pytest

from logbuf.client import Aeron, Context
from logbuf.testing.driver_process import DriverProcess

HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+$")


def resident_kib(path: str) -> tuple[int, int]:
    """(size, Rss) in KiB of this process's mapping of ``path``."""
    size = rss = -1
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            fields = line.split()
            if fields and HEADER.match(fields[0]):  # a mapping's first line: range, perms, offset, dev, inode[, path]
                inside = len(fields) >= 6 and fields[5] == path
            elif inside and fields[0] == "Size:":
                size = int(fields[1])
            elif inside and fields[0] == "Rss:":
                rss = int(fields[1])
    assert size > 0, f"{path} is not mapped"
    return size, rss


@pytest.mark.parametrize("pre_touch", [True, False], ids=["pre-touched", "on-first-use"])
def test_a_log_is_mapped_in_full_when_pre_touched(media_driver: DriverProcess, pre_touch: bool) -> None:
    context = Context(dir=media_driver.dir, driver_timeout_ns=3_000_000_000, pre_touch_mapped_memory=pre_touch)
    with Aeron.connect(context) as aeron:
        pub = aeron.add_publication("aeron:ipc", 11)
        path = os.path.realpath(pub._log_file_name)  # type: ignore[attr-defined]
        size, rss = resident_kib(path)
        assert size >= 3 * 1024  # three 1 MiB terms (the fixture's --ipc-term-length) and the metadata
        if pre_touch:
            assert rss == size
        else:
            assert rss < size // 4  # the metadata and the first pages touched
