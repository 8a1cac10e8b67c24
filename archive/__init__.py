"""The archive: recordings of streams in segment files, replay, and the Spark data source.

The names below are imported on first use, so ``import archive`` stays light (a Spark worker
that reads segments never loads the client API):

    from logbuf.archive import Catalog, Recorder, RecorderContext, Replay
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logbuf.archive.catalog import Catalog, CatalogError, RecordingDescriptor, RecordingState, UnknownRecordingError
    from logbuf.archive.recorder import Recorder, RecorderContext
    from logbuf.archive.replay import Replay, ReplayError
    from logbuf.archive.segments import SegmentError, segment_base_position, segment_file_name, segment_files
    from logbuf.archive.verify import VerifyResult, verify_recording

_EXPORTS = {
    "Catalog": "logbuf.archive.catalog",
    "CatalogError": "logbuf.archive.catalog",
    "RecordingDescriptor": "logbuf.archive.catalog",
    "RecordingState": "logbuf.archive.catalog",
    "UnknownRecordingError": "logbuf.archive.catalog",
    "Recorder": "logbuf.archive.recorder",
    "RecorderContext": "logbuf.archive.recorder",
    "Replay": "logbuf.archive.replay",
    "ReplayError": "logbuf.archive.replay",
    "SegmentError": "logbuf.archive.segments",
    "segment_base_position": "logbuf.archive.segments",
    "segment_file_name": "logbuf.archive.segments",
    "segment_files": "logbuf.archive.segments",
    "VerifyResult": "logbuf.archive.verify",
    "verify_recording": "logbuf.archive.verify",
}

__all__ = [
    "Catalog",
    "CatalogError",
    "Recorder",
    "RecorderContext",
    "RecordingDescriptor",
    "RecordingState",
    "Replay",
    "ReplayError",
    "SegmentError",
    "UnknownRecordingError",
    "VerifyResult",
    "segment_base_position",
    "segment_file_name",
    "segment_files",
    "verify_recording",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'logbuf.archive' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
