"""Topic registry layout: ``topics.dat`` in the driver directory, the names of the topics seen on this host.

Any client appends a record when it first publishes (or learns, from a definition frame) a topic; any
reader (subscribers resolving a topic id, ``logbuf-stat --topics``) scans the records from where it last
stopped. The driver creates the file zeroed at start; it lives beside ``cnc.dat`` so the CnC stays Aeron's
layout byte for byte (Aeron's tools read our CnC), and like the CnC it can be read after a crash.

File header (128 bytes; the hot tail on its own cache line)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                      Magic ("LBTOPIC1", int64)                |   0
    +---------------------------------------------------------------+
    |                    Records Capacity (int64)                   |   8
    +---------------------------------------------------------------+
    |                     (unused to 64)                          ...  16
    +---------------------------------------------------------------+
    |               Tail (int64, get-and-add by writers)            |  64
    +---------------------------------------------------------------+
    |                     (unused to 128)                         ...  72
    +---------------------------------------------------------------+
    |                  Records (Records Capacity bytes)           ... 128
    +---------------------------------------------------------------+

One record, at an 8-byte aligned offset from the records' start::

    +---------------------------------------------------------------+
    |  Record Length (int32: 0 = free, < 0 = being written, > 0 = committed; aligned to 8)  |  0
    +---------------------------------------------------------------+
    |                       Name Length (int32)                     |   4
    +---------------------------------------------------------------+
    |                        Topic Id (int64)                       |   8
    +---------------------------------------------------------------+
    |                   Name (UTF-8), padded to 8                 ...  16
    +---------------------------------------------------------------+

Writer order: get-and-add the tail by the record's aligned length, store minus that length (release), write
the name length, id and name, then store the length (release). A reader acquire-loads the length: <= 0
ends its scan for now. A record whose id is not the id of its name (``logbuf.topic_names``) is counted and
skipped: a writer cannot bind an id to a name that does not hash to it.
"""

from __future__ import annotations

import struct
from typing import Final

TOPIC_REGISTRY_FILE: Final[str] = "topics.dat"
MAGIC: Final[int] = int.from_bytes(b"LBTOPIC1", "little")
MAGIC_OFFSET: Final[int] = 0
CAPACITY_OFFSET: Final[int] = MAGIC_OFFSET + 8
TAIL_OFFSET: Final[int] = 64
"""The writers' tail: 64 bytes from the cold header fields."""
HEADER_LENGTH: Final[int] = 128
RECORDS_OFFSET: Final[int] = HEADER_LENGTH

RECORD_LENGTH_OFFSET: Final[int] = 0
NAME_LENGTH_OFFSET: Final[int] = RECORD_LENGTH_OFFSET + 4
TOPIC_ID_OFFSET: Final[int] = NAME_LENGTH_OFFSET + 4
NAME_OFFSET: Final[int] = TOPIC_ID_OFFSET + 8
RECORD_HEADER_LENGTH: Final[int] = NAME_OFFSET
RECORD_ALIGNMENT: Final[int] = 8

DEFAULT_TOPIC_REGISTRY_LENGTH: Final[int] = 16 * 1024 * 1024
"""Records for ~400,000 topics of 24-byte names; a full registry refuses new topics with an error."""
MIN_TOPIC_REGISTRY_LENGTH: Final[int] = 4096

FILE_HEADER: Final[struct.Struct] = struct.Struct("<qq")
"""Magic, records capacity."""
RECORD_HEADER: Final[struct.Struct] = struct.Struct("<iiq")
"""Record length, name length, topic id."""


def record_length(name_length: int) -> int:
    """The aligned length of a record holding a name of ``name_length`` bytes."""
    return (RECORD_HEADER_LENGTH + name_length + RECORD_ALIGNMENT - 1) & ~(RECORD_ALIGNMENT - 1)


def check_registry_length(length: int) -> int:
    """The file length, or ValueError naming it: at least 4 KiB and a multiple of 4 KiB."""
    if length < MIN_TOPIC_REGISTRY_LENGTH or length % 4096:
        raise ValueError(f"topic registry length={length} must be a multiple of 4096, at least 4096")
    return length
