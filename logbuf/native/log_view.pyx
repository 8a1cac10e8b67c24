# cython: language_level=3
"""A log buffer (three terms and the metadata) mapped in this process, resolved to pointers once, so
that the publication and image cores reach a term with no Python in between."""

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer

from logbuf.native.constants cimport (
    INITIAL_TERM_ID_OFFSET,
    LOG_META_DATA_LENGTH,
    MTU_LENGTH_OFFSET,
    PARTITION_COUNT,
    TERM_LENGTH_OFFSET,
    TERM_MAX_LENGTH,
    TERM_MIN_LENGTH,
)
from logbuf.native.term cimport log2_of


cdef inline void _check_open(LogView log) except *:
    if log._mem is None:
        raise ValueError("log view is closed")


cdef class LogView:
    """A whole log buffer (3 terms + metadata) mapped in this process, resolved to pointers."""

    def __cinit__(self, buffer):
        cdef Py_buffer view
        PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
        cdef Py_ssize_t n = view.len
        cdef char *base = <char *>view.buf
        PyBuffer_Release(&view)
        if n < 3 * TERM_MIN_LENGTH + LOG_META_DATA_LENGTH:
            raise ValueError(f"log buffer of {n} bytes is too short for three 64 KiB terms and metadata")
        if (<size_t>base) % 64 != 0:
            raise ValueError("log buffer is not 64-byte aligned")
        self._mem = memoryview(buffer)
        self.base = base
        # The metadata sits right after the three terms; find it from the term length recorded there,
        # validating the candidate against the mapping length.
        cdef Py_ssize_t meta_offset
        cdef int32_t term_length = _find_term_length(base, n)
        if term_length <= 0:
            raise ValueError(f"log buffer of {n} bytes holds no valid term_length in its metadata")
        meta_offset = 3 * <Py_ssize_t>term_length
        self.meta = base + meta_offset
        self.terms[0] = base
        self.terms[1] = base + term_length
        self.terms[2] = base + 2 * <Py_ssize_t>term_length
        self.term_length = term_length
        self.position_bits_to_shift = log2_of(term_length)
        self.initial_term_id = (<int32_t *>(self.meta + INITIAL_TERM_ID_OFFSET))[0]
        self.mtu_length = (<int32_t *>(self.meta + MTU_LENGTH_OFFSET))[0]
        ro = self._mem.toreadonly()
        self._term_views = [ro[i * term_length:(i + 1) * term_length] for i in range(3)]

    @property
    def closed(self) -> bool:
        return self._mem is None

    def term_buffer(self, int index) -> memoryview:
        """Writable view of partition ``index``."""
        _check_open(self)
        if not 0 <= index < PARTITION_COUNT:
            raise ValueError(f"partition index={index} must be 0, 1 or 2")
        return self._mem[index * self.term_length:(index + 1) * self.term_length]

    def metadata(self) -> memoryview:
        """Writable view of the metadata section."""
        _check_open(self)
        cdef Py_ssize_t off = 3 * <Py_ssize_t>self.term_length
        return self._mem[off:off + LOG_META_DATA_LENGTH]

    def close(self) -> None:
        """Drop this view's exports of the mapping (the owner can then unmap it)."""
        if self._mem is not None:
            for v in self._term_views:
                v.release()
            self._term_views = None
            self._mem.release()
            self._mem = None
            self.base = NULL
            self.meta = NULL


cdef int32_t _find_term_length(char *base, Py_ssize_t n) noexcept:
    """The metadata is at 3 * term_length; its term_length field must match that placement.

    Candidates are tried largest first: the largest term length whose 3 terms and metadata fit
    the mapping is the real one for any page size up to the term length.
    """
    cdef int32_t tl = TERM_MAX_LENGTH
    cdef int32_t recorded
    while tl >= TERM_MIN_LENGTH:
        if 3 * <Py_ssize_t>tl + LOG_META_DATA_LENGTH <= n:
            recorded = (<int32_t *>(base + 3 * <Py_ssize_t>tl + TERM_LENGTH_OFFSET))[0]
            if recorded == tl:
                return tl
        tl >>= 1
    return -1
