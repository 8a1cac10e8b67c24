"""The frame store: events appended once as ready websocket frames, and the index that finds them.

Theory of operation (``protocol_spec/jetstream-relay.md`` has the layout):

* Two append-only files hold the frames: ``frames.ws`` (text frames, one event's JSON each) and,
  with a dictionary, ``frames-zstd.ws`` (binary frames, one standalone zstd frame each). A frame is
  written once, whole, header included, exactly as it goes on the wire (server frames are unmasked),
  so any byte range that starts and ends on frame boundaries can go to a socket unchanged.
* Events are numbered by ``seq`` (0, 1, 2, ...: the order of appends, which is also ``time_us``
  order: appends must have strictly increasing ``time_us``). The index is a set of numpy columns over
  ``seq``: ``time_us``, each file's frame offset and payload length, the DID's hash, the collection's id.
  A cursor is ``searchsorted(time_us, cursor)``: the first event at or after it, so replay is inclusive.
* Retention moves ``first_seq`` forward (by age against the newest event, or by bytes), then frees
  the file blocks that lie wholly before the first kept frame with ``fallocate(PUNCH_HOLE |
  KEEP_SIZE)``: the file's apparent size keeps growing, its disk use does not, and nothing is rewritten.
  Only whole blocks before the first kept frame are punched, so no byte a reader may still be sent
  is ever zeroed; readers check ``floor(kind)`` before each send and are dropped when behind it.
  Where the filesystem cannot punch holes, retention still applies to readers and the index (the
  space is not returned; ``punch_supported`` turns false and the server logs it once).
* The index columns grow by doubling and drop their retired head when it is more than half of them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import zstandard

__all__ = ["FRAMES_FILE", "FRAMES_ZSTD_FILE", "PLAIN", "ZSTD", "FrameStore", "StoreStats", "ws_frame_header"]

FRAMES_FILE: Final = "frames.ws"
FRAMES_ZSTD_FILE: Final = "frames-zstd.ws"
PLAIN: Final = 0
ZSTD: Final = 1

OPCODE_TEXT: Final = 0x1
OPCODE_BINARY: Final = 0x2
FIN: Final = 0x80
_LEN16: Final = struct.Struct("!BBH")
_LEN64: Final = struct.Struct("!BBQ")
#: Collection id 0: events that pass every collection filter (identity, account, commits without one).
NO_COLLECTION: Final = 0
#: Hole punching frees whole blocks only; 4 KiB divides every common filesystem block size.
PUNCH_ALIGN: Final = 4096
#: zstd window of 128 KiB (window log 17), as jetstream's one-shot compression.
ZSTD_WINDOW_LOG: Final = 17
ZSTD_LEVEL: Final = 3

FALLOC_FL_KEEP_SIZE: Final = 0x01
FALLOC_FL_PUNCH_HOLE: Final = 0x02

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_fallocate = _libc.fallocate
_fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_fallocate.restype = ctypes.c_int


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free ``[offset, offset + length)`` of a file without changing its size; raises ``OSError``."""
    if _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def ws_frame_header(opcode: int, payload_length: int) -> bytes:
    """The header of an unmasked, final server frame (RFC 6455 §5.2)."""
    if payload_length < 126:
        return bytes((FIN | opcode, payload_length))
    if payload_length < 1 << 16:
        return _LEN16.pack(FIN | opcode, 126, payload_length)
    return _LEN64.pack(FIN | opcode, 127, payload_length)


def _compressor(dictionary: bytes) -> zstandard.ZstdCompressor:
    """jetstream's one-shot compression: its dictionary (id written), a 128 KiB window, content size
    and checksum written (the legacy server's encoder writes the 4-byte checksum)."""
    params = zstandard.ZstdCompressionParameters.from_level(
        ZSTD_LEVEL, window_log=ZSTD_WINDOW_LOG, write_dict_id=1, write_content_size=1, write_checksum=1
    )
    return zstandard.ZstdCompressor(dict_data=zstandard.ZstdCompressionDict(dictionary), compression_params=params)


@dataclass(slots=True)
class StoreStats:
    events_appended: int = 0
    bytes_appended: int = 0  # JSON bytes
    events_retired: int = 0
    bytes_punched: int = 0
    punch_failures: int = 0


class _FrameFile:
    __slots__ = ("path", "fd", "end", "punched")

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.end = 0
        self.punched = 0  # bytes [0, punched) are freed

    def append(self, header: bytes, payload: bytes) -> int:
        offset = self.end
        data = header + payload
        written = os.pwrite(self.fd, data, offset)
        while written < len(data):  # regular files write whole, but be exact
            written += os.pwrite(self.fd, data[written:], offset + written)
        self.end = offset + len(data)
        return offset

    def close(self) -> None:
        os.close(self.fd)


class FrameStore:
    """Append-only frame files plus the numpy index over ``seq``; single-threaded (the relay's loop)."""

    def __init__(self, data_dir: str, *, zstd_dictionary: bytes | None = None, initial_capacity: int = 1 << 14) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.files: list[_FrameFile] = [_FrameFile(os.path.join(data_dir, FRAMES_FILE))]
        self._dictionary = zstd_dictionary
        self._compressor: zstandard.ZstdCompressor | None = None
        if zstd_dictionary is not None:
            self._compressor = _compressor(zstd_dictionary)
            self.files.append(_FrameFile(os.path.join(data_dir, FRAMES_ZSTD_FILE)))
        self.stats = StoreStats()
        self.punch_supported = True
        self.first_seq = 0  # oldest retained event
        self.next_seq = 0  # one past the newest
        self.last_time_us = 0
        self._base = 0  # seq of row 0 of the columns
        cap = max(16, initial_capacity)
        self.time_us: npt.NDArray[np.int64] = np.zeros(cap, np.int64)
        self.offsets: list[npt.NDArray[np.int64]] = [np.zeros(cap, np.int64) for _ in self.files]
        self.did_hash: npt.NDArray[np.int64] = np.zeros(cap, np.int64)
        self.collection_id: npt.NDArray[np.int32] = np.zeros(cap, np.int32)
        #: each event's payload length in each file (the JSON's; the zstd frame's): what a client's
        #: maxMessageSizeBytes is compared with, as jetstream's legacy server compares the bytes it sends.
        self.payload_length: list[npt.NDArray[np.int64]] = [np.zeros(cap, np.int64) for _ in self.files]
        #: collection name -> id (id 0 is NO_COLLECTION); names are few, ids never reused.
        self.collection_ids: dict[str, int] = {}
        self.collection_names: list[str] = [""]

    @property
    def compressed(self) -> bool:
        return self._compressor is not None

    # -- appending -----------------------------------------------------------------------------------

    def collection_id_of(self, collection: str | None) -> int:
        if not collection:
            return NO_COLLECTION
        cid = self.collection_ids.get(collection)
        if cid is None:
            cid = self.collection_ids[collection] = len(self.collection_names)
            self.collection_names.append(collection)
        return cid

    def make_compressor(self) -> zstandard.ZstdCompressor | None:
        """A compressor configured as the store's, for another thread (None without a dictionary):
        :meth:`append` takes what it made as ``packed``."""
        if self._dictionary is None:
            return None
        return _compressor(self._dictionary)

    def append(self, raw: bytes, time_us: int, did: str, collection: str | None, packed: bytes | None = None) -> bool:
        """Store one event; False (nothing stored) if ``time_us`` is not above the newest one's.
        ``packed``: the event already compressed by a :meth:`make_compressor` compressor."""
        if time_us <= self.last_time_us:
            return False
        row = self.next_seq - self._base
        if row == len(self.time_us):
            self._grow()
            row = self.next_seq - self._base
        self.offsets[PLAIN][row] = self.files[PLAIN].append(ws_frame_header(OPCODE_TEXT, len(raw)), raw)
        self.payload_length[PLAIN][row] = len(raw)
        if self._compressor is not None:
            if packed is None:
                packed = self._compressor.compress(raw)
            self.offsets[ZSTD][row] = self.files[ZSTD].append(ws_frame_header(OPCODE_BINARY, len(packed)), packed)
            self.payload_length[ZSTD][row] = len(packed)
        self.time_us[row] = time_us
        self.did_hash[row] = hash(did)
        self.collection_id[row] = self.collection_id_of(collection)
        self.next_seq += 1
        self.last_time_us = time_us
        self.stats.events_appended += 1
        self.stats.bytes_appended += len(raw)
        return True

    def _grow(self) -> None:
        """Drop the retired head if it is over half the rows, else double the capacity."""
        live = slice(self.first_seq - self._base, self.next_seq - self._base)
        n = live.stop - live.start
        cap = len(self.time_us)
        new_cap = cap if n <= cap // 2 else cap * 2

        def moved(a: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
            out = np.zeros(new_cap, a.dtype)
            out[:n] = a[live]
            return out

        self.time_us = moved(self.time_us)  # type: ignore[assignment]
        self.offsets = [moved(o) for o in self.offsets]  # type: ignore[misc]
        self.did_hash = moved(self.did_hash)  # type: ignore[assignment]
        self.collection_id = moved(self.collection_id)  # type: ignore[assignment]
        self.payload_length = [moved(p) for p in self.payload_length]  # type: ignore[misc]
        self._base = self.first_seq

    # -- reading -------------------------------------------------------------------------------------

    def end(self, kind: int) -> int:
        return self.files[kind].end

    def offset_of(self, kind: int, seq: int) -> int:
        """File offset of event ``seq``'s frame; the file end for ``seq == next_seq``."""
        if seq >= self.next_seq:
            return self.files[kind].end
        return int(self.offsets[kind][seq - self._base])

    def oldest_time_us(self) -> int:
        """``time_us`` of the oldest retained event (0 when empty)."""
        return int(self.time_us[self.first_seq - self._base]) if self.next_seq > self.first_seq else 0

    def floor(self, kind: int) -> int:
        """The first byte a reader may still be sent: the oldest retained frame."""
        return self.offset_of(kind, self.first_seq)

    def seq_for_cursor(self, cursor: int | None) -> int:
        """First retained event with ``time_us >= cursor``; ``next_seq`` (live) if none or no cursor."""
        if cursor is None:
            return self.next_seq
        lo, hi = self.first_seq - self._base, self.next_seq - self._base
        return self._base + lo + int(np.searchsorted(self.time_us[lo:hi], cursor, "left"))

    def seq_at_or_after(self, kind: int, offset: int) -> int:
        """The first event whose frame starts at or after ``offset`` (a frame boundary at or after it)."""
        lo, hi = self.first_seq - self._base, self.next_seq - self._base
        return self._base + lo + int(np.searchsorted(self.offsets[kind][lo:hi], offset, "left"))

    def matching_runs(
        self,
        kind: int,
        start_seq: int,
        limit: int,
        collections_allowed: npt.NDArray[np.bool_],
        dids: npt.NDArray[np.int64] | None,
        max_length: int,
    ) -> tuple[list[tuple[int, int, int]], int]:
        """Byte runs of the events a filter wants among ``[start_seq, start_seq + limit)``.

        ``collections_allowed[collection_id]`` (id 0 always True), ``dids``: sorted DID hashes or
        None for all, ``max_length``: 0 for no limit, else the longest payload in this file. Returns ``([(start_offset, end_offset,
        events), ...], scanned_to_seq)``; each run is contiguous matching frames.
        """
        stop_seq = min(self.next_seq, start_seq + limit)
        lo, hi = start_seq - self._base, stop_seq - self._base
        if hi <= lo:
            return [], stop_seq
        mask = collections_allowed[self.collection_id[lo:hi]]
        if dids is not None:  # sorted: a binary search per event, no sort of the filter per call
            hashes = self.did_hash[lo:hi]
            found = np.searchsorted(dids, hashes)
            np.minimum(found, len(dids) - 1, out=found)
            mask &= dids[found] == hashes
        if max_length:
            mask &= self.payload_length[kind][lo:hi] <= max_length
        rows = np.flatnonzero(mask)
        if rows.size == 0:
            return [], stop_seq
        breaks = np.flatnonzero(np.diff(rows) != 1)
        starts = np.concatenate(([rows[0]], rows[breaks + 1]))
        ends = np.concatenate((rows[breaks], [rows[-1]])) + 1
        offsets = self.offsets[kind]
        file_end = self.files[kind].end
        runs = []
        for s, e in zip(starts.tolist(), ends.tolist()):
            end_offset = int(offsets[lo + e]) if lo + e < self.next_seq - self._base else file_end
            runs.append((int(offsets[lo + s]), end_offset, e - s))
        return runs, stop_seq

    # -- retention -----------------------------------------------------------------------------------

    def retire(self, *, max_age_us: int | None, max_bytes: int | None) -> int:
        """Retire the events older than ``max_age_us`` before the newest or beyond ``max_bytes`` of
        plain frames, and punch out the blocks before the first kept frame. Returns events retired."""
        lo, hi = self.first_seq - self._base, self.next_seq - self._base
        if hi <= lo:
            return 0
        keep_from = lo
        if max_age_us is not None:
            keep_from = max(
                keep_from, lo + int(np.searchsorted(self.time_us[lo:hi], self.last_time_us - max_age_us, "left"))
            )
        if max_bytes is not None:
            threshold = self.files[PLAIN].end - max_bytes
            keep_from = max(keep_from, lo + int(np.searchsorted(self.offsets[PLAIN][lo:hi], threshold, "left")))
        retired = keep_from - lo
        if retired <= 0:
            return 0
        self.first_seq += retired
        self.stats.events_retired += retired
        for kind, f in enumerate(self.files):
            upto = (self.floor(kind) // PUNCH_ALIGN) * PUNCH_ALIGN
            if upto > f.punched and self.punch_supported:
                try:
                    punch_hole(f.fd, f.punched, upto - f.punched)
                except OSError as exc:
                    self.stats.punch_failures += 1
                    if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
                        self.punch_supported = False
                    continue
                self.stats.bytes_punched += upto - f.punched
                f.punched = upto
        return retired

    def disk_bytes(self, kind: int) -> int:
        """Blocks the file really holds (what hole punching keeps bounded)."""
        return os.fstat(self.files[kind].fd).st_blocks * 512

    def close(self) -> None:
        for f in self.files:
            f.close()
