"""The driver stays readable the way Aeron's is: no function in ``driver/`` over 60 lines, no class over 500.

A function is counted from its ``def`` line to its last line (docstring, comments and blank lines
included), nested functions and methods alike; a class from its ``class`` line to its last line.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 500


def oversized(source: str, name: str) -> list[str]:
    """``name:line kind qualname (n lines)`` for each function or class in ``source`` over its limit."""
    found: list[str] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                qualname = f"{prefix}{child.name}"
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                is_class = isinstance(child, ast.ClassDef)
                if lines > (MAX_CLASS_LINES if is_class else MAX_FUNCTION_LINES):
                    found.append(f"{name}:{child.lineno} {'class' if is_class else 'def'} {qualname} ({lines} lines)")
                visit(child, qualname + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_the_size_check_counts_from_def_to_last_line_nested_functions_and_classes_too() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    assert oversized(f"def fits():\n{body}", "m.py") == []  # 60 lines
    assert oversized(f"def too_long():\n{body}    pass\n", "m.py") == ["m.py:1 def too_long (61 lines)"]
    inner_body = "".join(f"        {line}" for line in body.splitlines(keepends=True))
    nested = "class C:\n    def outer(self):\n        def inner():\n" + inner_body + "            pass\n"
    assert oversized(nested, "m.py") == ["m.py:2 def C.outer (62 lines)", "m.py:3 def C.outer.inner (61 lines)"]
    methods = "".join(f"    def m{i}(self):\n        pass\n" for i in range(250))
    assert oversized(f"class Big:\n{methods}", "m.py") == ["m.py:1 class Big (501 lines)"]


def test_no_driver_function_is_over_60_lines_and_no_class_over_500() -> None:
    found = [
        problem
        for path in sorted((ROOT / "driver").glob("*.py"))
        for problem in oversized(path.read_text(), path.relative_to(ROOT).as_posix())
    ]
    assert found == [], "split these as Aeron splits its driver (agents, handlers, proxies):\n" + "\n".join(found)
