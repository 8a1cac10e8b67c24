"""MkDocs hook: pages that list the driver's settings and system counters get them from the code itself, so
the documentation cannot fall behind a new setting or counter."""

from __future__ import annotations

import os
import pathlib
from dataclasses import fields
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE_TREE = ROOT / "build" / "docs-src"


def lay_out_sources() -> None:
    """``build/docs-src/logbuf``: the package as it installs (driver/ as logbuf/driver, ...), as symlinks,
    for mkdocstrings to read (it reads files, and the repository keeps those folders at its root)."""
    package = SOURCE_TREE / "logbuf"
    package.mkdir(parents=True, exist_ok=True)
    entries = {entry.name: entry for entry in (ROOT / "logbuf").iterdir()}
    entries.update({name: ROOT / name for name in ("driver", "client", "archive", "jetstream")})
    for name, target in entries.items():
        link = package / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and os.readlink(link) == str(target):
                continue
            link.unlink()
        link.symlink_to(target)


lay_out_sources()  # at import: the hook is loaded before mkdocstrings reads its paths


def driver_settings_table() -> str:
    from logbuf.driver.context import DriverContext, env_name, flag_name, format_default

    rows = ["| flag | environment | default | what it trades |", "|---|---|---|---|"]
    for f in fields(DriverContext):
        if "kind" not in f.metadata:
            continue
        default = f.metadata.get("default_text") or format_default(f.metadata["kind"], f.default)
        doc = " ".join(str(f.metadata["doc"]).split()).replace("|", "\\|")
        rows.append(f"| `{flag_name(f)}` | `{env_name(f)}` | `{default}` | {doc} |")
    return "\n".join(rows)


def system_counters_table() -> str:
    from logbuf.conduit.system_counters_descriptor import DESCRIPTORS

    rows = ["| id | label |", "|---|---|"]
    rows += [f"| {int(d.id)} | {d.label} |" for d in DESCRIPTORS]
    return "\n".join(rows)


PLACEHOLDERS = {
    "<!-- driver-settings -->": driver_settings_table,
    "<!-- system-counters -->": system_counters_table,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    for placeholder, table in PLACEHOLDERS.items():
        if placeholder in markdown:
            markdown = markdown.replace(placeholder, table())
    return markdown
