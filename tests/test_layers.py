"""The import rules of DESIGN.md's map hold: each layer imports only the layers below it."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# folder in the repository -> (its package, the logbuf packages it may import besides itself and logbuf's base)
LAYERS: dict[str, tuple[str, frozenset[str]]] = {
    "logbuf/native": ("logbuf.native", frozenset()),
    "logbuf/conduit": ("logbuf.conduit", frozenset({"logbuf.native"})),
    "logbuf/logbuffer": ("logbuf.logbuffer", frozenset({"logbuf.native", "logbuf.conduit"})),
    "logbuf/protocol": ("logbuf.protocol", frozenset({"logbuf.native", "logbuf.logbuffer"})),
    "client": ("logbuf.client", frozenset({"logbuf.native", "logbuf.conduit", "logbuf.logbuffer"})),
    "driver": ("logbuf.driver", frozenset({"logbuf.native", "logbuf.conduit", "logbuf.logbuffer", "logbuf.protocol"})),
    "archive": ("logbuf.archive", frozenset({"logbuf.native", "logbuf.conduit", "logbuf.logbuffer", "logbuf.client"})),
    "jetstream": (
        "logbuf.jetstream",
        frozenset({"logbuf.native", "logbuf.conduit", "logbuf.logbuffer", "logbuf.client", "logbuf.archive"}),
    ),
    # The test kit builds drivers and clients to test them with: it may import every layer but the services.
    "logbuf/testing": (
        "logbuf.testing",
        frozenset(
            {"logbuf.native", "logbuf.conduit", "logbuf.logbuffer", "logbuf.protocol", "logbuf.driver", "logbuf.client"}
        ),
    ),
}
LAYERED = {package for package, _ in LAYERS.values()}
# The relay may run a media driver inside its own process (embedded): its entry point starts one and its
# supervisor restarts it when it is lost. Nothing else in the relay may import the driver.
EXCEPTIONS = {("jetstream/main.py", "logbuf.driver"), ("jetstream/supervisor.py", "logbuf.driver")}


def imported_modules(path: pathlib.Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "logbuf" or name.startswith("logbuf.")}


def layer_of(module: str) -> str | None:
    """The layered package ``module`` belongs to, or None for logbuf's base modules."""
    for package in LAYERED:
        if module == package or module.startswith(package + "."):
            return package
    return None


def violations(folder: str) -> list[str]:
    package, allowed = LAYERS[folder]
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for module in sorted(imported_modules(path)):
            layer = layer_of(module)
            if layer is None or layer == package or layer in allowed or (relative, layer) in EXCEPTIONS:
                continue
            found.append(f"{relative} imports {module} ({package} may not import {layer})")
    return found


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_layer_imports_only_what_the_map_allows(folder: str) -> None:
    if not (ROOT / folder).is_dir():
        pytest.skip(f"{folder} is not in this tree")
    assert violations(folder) == []


def test_base_modules_import_no_layer_above_the_native_core() -> None:
    found = []
    for path in sorted((ROOT / "logbuf").glob("*.py")):
        for module in sorted(imported_modules(path)):
            layer = layer_of(module)
            if layer not in (None, "logbuf.native"):
                found.append(f"{path.name} imports {module}")
    assert found == []


def test_the_checker_sees_a_forbidden_import(tmp_path: pathlib.Path) -> None:
    source = tmp_path / "bad.py"
    source.write_text("from logbuf.driver.context import DriverContext\nimport logbuf.client.aeron\n")
    assert imported_modules(source) >= {"logbuf.driver.context", "logbuf.client.aeron"}
    assert layer_of("logbuf.driver.context") == "logbuf.driver"
    assert layer_of("logbuf.errors") is None


def test_benchmarks_import_no_test_module() -> None:
    """``perf/`` is run by users and CI alike; what it shares with the tests lives in ``logbuf.testing`` (or,
    perf-only, in ``perf/_common.py``), never in a test module."""
    found = []
    for path in sorted((ROOT / "perf").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            found += [f"{path.name} imports {name}" for name in names if name == "tests" or name.startswith("tests.")]
    assert found == []
