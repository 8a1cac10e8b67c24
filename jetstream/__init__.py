"""The jetstream relay: ingest a Bluesky jetstream feed into a stream and serve jetstream clients."""

import os as _os

BUNDLED_ZSTD_DICTIONARY = _os.path.join(_os.path.dirname(__file__), "data", "jetstream-zstd.dict")
"""jetstream's zstd dictionary (id 1612007021, MIT, see data/NOTICE), for ``--zstd-dictionary``."""
