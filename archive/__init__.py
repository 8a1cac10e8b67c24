"""The archive: recordings of streams in segment files, replay, and the Spark data source.

The names below are imported on first use, so ``import archive`` stays light (a Spark worker
that reads segments never loads the client API):

    from archive import Catalog, Recorder, RecorderContext, Replay
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from archive.catalog import Catalog, CatalogError, RecordingDescriptor, RecordingState, UnknownRecordingError
    from archive.recorder import Recorder, RecorderContext
    from archive.replay import Replay, ReplayError
    from archive.segments import SegmentError, segment_base_position, segment_file_name, segment_files
    from archive.verify import VerifyResult, verify_recording

_EXPORTS = {
    "Catalog": "archive.catalog", "CatalogError": "archive.catalog", "RecordingDescriptor": "archive.catalog",
    "RecordingState": "archive.catalog", "UnknownRecordingError": "archive.catalog",
    "Recorder": "archive.recorder", "RecorderContext": "archive.recorder",
    "Replay": "archive.replay", "ReplayError": "archive.replay",
    "SegmentError": "archive.segments", "segment_base_position": "archive.segments",
    "segment_file_name": "archive.segments", "segment_files": "archive.segments",
    "VerifyResult": "archive.verify", "verify_recording": "archive.verify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'archive' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
