"""archive/examples/stream_rates.py run as a script uses the installed logbuf, never the source tree
around it (with a non-editable install, the tree's logbuf has no compiled native core: "cannot import
name '_native'")."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent.parent / "archive" / "examples" / "stream_rates.py"

# Runs the script as ``python stream_rates.py ...`` does (as __main__), then says whether the tree around it
# ended up on sys.path.
RUNNER = """
import json, os, runpy, sys
script, root = sys.argv[1], sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
sys.path[0] = os.path.dirname(script)  # as the interpreter sets it for a script
try:
    runpy.run_path(script, run_name="__main__")
    code = 0
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "tree_on_path": root in [os.path.abspath(p) for p in sys.path]}))
"""


def test_the_script_runs_on_the_installed_package_not_the_tree_around_it(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "checkout"  # laid out like the repository, with a logbuf/ that is not the installed one
    (root / "logbuf").mkdir(parents=True)
    (root / "logbuf" / "__init__.py").write_text('raise ImportError("the source tree was imported")\n')
    script = root / "archive" / "examples" / "stream_rates.py"
    script.parent.mkdir(parents=True)
    shutil.copy(SCRIPT, script)
    missing = tmp_path / "no-such-archive"
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(script), str(root), str(missing), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert "Traceback" not in done.stderr and "source tree" not in done.stderr, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"code": 2, "tree_on_path": False}
    assert f"stream_rates: {missing} is not a directory" in done.stderr  # after importing the installed logbuf
