"""The archive's modules import each other without cycles (the catalog uses verify to recover
interrupted recordings; verify and the catalog share the recording descriptor, not each other)."""

from __future__ import annotations

import ast
import pathlib

ARCHIVE = pathlib.Path(__file__).resolve().parent.parent.parent / "archive"


def archive_imports() -> dict[str, set[str]]:
    """Module -> the archive modules it imports, anywhere in the file (TYPE_CHECKING and late imports too)."""
    modules = {p.stem: p for p in ARCHIVE.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "logbuf.archive":
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("logbuf.archive."):
                found.add((node.module or "").split(".")[2])
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("logbuf.archive."))
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import path that comes back to where it started (each cycle once, from its smallest module)."""
    found: list[list[str]] = []

    def visit(path: list[str]) -> None:
        for nxt in sorted(graph[path[-1]]):
            if nxt == path[0]:
                found.append([*path, nxt])
            elif nxt not in path and nxt > path[0]:
                visit([*path, nxt])

    for start in sorted(graph):
        visit([start])
    return found


def test_the_checker_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_archive_modules_import_each_other_without_cycles() -> None:
    graph = archive_imports()
    assert "verify" in graph["catalog"] and "recording" in graph["verify"]  # the edges this rule is about
    assert cycles(graph) == []
