"""The documentation site builds in strict mode (a broken link, a missing page or an API name that no longer
resolves fails it), and every Python example in it runs as written, against a real media driver."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from logbuf.testing.driver_process import DriverProcess, DriverSet

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_RUN = re.compile(r"<!-- example not run: (?P<reason>[^>]+?) -->\n```python\n")
EXAMPLE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

pytestmark = pytest.mark.slow


def examples() -> list[tuple[str, str]]:
    """(page:line, code) of every Python example that runs; one marked not run must say why."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        skipped = {m.end() - len("```python\n") for m in NOT_RUN.finditer(text)}
        for m in EXAMPLE.finditer(text):
            if m.start() not in skipped:
                found.append((f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", m.group(1)))
    return found


def test_the_site_builds_in_strict_mode(tmp_path: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    site = tmp_path / "site"
    reference = (site / "reference" / "client" / "index.html").read_text(encoding="utf-8")
    for name in ("Publication.offer", "Publication.offer_async", "Subscription.poll", "Subscription.messages"):
        assert f'id="logbuf.client.aeron.{name}"' in reference, name  # the API reference has the calls
    operations = (site / "operations" / "index.html").read_text(encoding="utf-8")
    assert "LOGBUF_IPC_TERM_LENGTH" in operations and "<!-- driver-settings -->" not in operations


def test_every_example_that_is_not_run_says_why() -> None:
    for page in DOCS.rglob("*.md"):
        for comment in re.findall(r"<!-- example not run[^>]*-->", page.read_text(encoding="utf-8")):
            assert re.fullmatch(r"<!-- example not run: [^>]{10,} -->", comment), (page, comment)


@pytest.fixture(scope="module")
def docs_driver(request: pytest.FixtureRequest) -> DriverProcess:
    drivers = DriverSet(request)
    request.addfinalizer(drivers.close)
    return drivers("--ipc-term-length", "1m", base=[])


EXAMPLES = examples()


@pytest.mark.parametrize(("where", "code"), EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_the_example_runs(where: str, code: str, docs_driver: DriverProcess) -> None:
    """Each example runs in a fresh interpreter; ``Aeron.connect()`` finds the test's driver by ``LOGBUF_DIR``."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "LOGBUF_DIR": docs_driver.dir},
    )
    assert done.returncode == 0, f"{where}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
