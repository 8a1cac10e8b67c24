"""The jetstream relay: ingest a Bluesky jetstream feed into a stream and serve jetstream clients."""

import importlib.util as _importlib_util
import os as _os

_MISSING = [
    name for name in ("websockets", "zstandard", "prometheus_client") if _importlib_util.find_spec(name) is None
]
if _MISSING:
    raise ImportError(
        f"logbuf.jetstream needs the [jetstream] extra ({', '.join(_MISSING)} not installed): "
        "pip install 'logbuf[jetstream]'"
    )

BUNDLED_ZSTD_DICTIONARY = _os.path.join(_os.path.dirname(__file__), "data", "jetstream-zstd.dict")
"""jetstream's zstd dictionary (id 1612007021, MIT, see data/NOTICE), for ``--zstd-dictionary``."""
