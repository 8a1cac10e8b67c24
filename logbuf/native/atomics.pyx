# cython: language_level=3
"""Memory-ordered access to shared memory: acquire loads, release stores, get-and-add and compare-and-set
of int32/int64 at any offset of any buffer, and the ``Position`` counter.

Plain Python writes into an mmap are neither atomic nor ordered, so every access whose ordering matters
between processes goes through the ``lb_*`` functions of ``lb_atomics.h`` (GCC ``__atomic`` builtins).
Offsets are checked: out of bounds or misaligned for the access is a ValueError naming the offset.
"""

from cpython.buffer cimport PyBuffer_Release


def get_int32_volatile(buffer, Py_ssize_t offset) -> int:
    """Acquire-load of the int32 at ``offset``."""
    cdef Py_buffer view
    cdef char *p = checked_address(&view, buffer, offset, 4, False)
    cdef int32_t v = lb_load_acquire_i32(p)
    PyBuffer_Release(&view)
    return v


def get_int64_volatile(buffer, Py_ssize_t offset) -> int:
    """Acquire-load of the int64 at ``offset``."""
    cdef Py_buffer view
    cdef char *p = checked_address(&view, buffer, offset, 8, False)
    cdef int64_t v = lb_load_acquire_i64(p)
    PyBuffer_Release(&view)
    return v


def put_int32_ordered(buffer, Py_ssize_t offset, int32_t value) -> None:
    """Release-store of an int32 at ``offset``: earlier writes are visible before it."""
    cdef Py_buffer view
    cdef char *p = checked_address(&view, buffer, offset, 4, True)
    lb_store_release_i32(p, value)
    PyBuffer_Release(&view)


def put_int64_ordered(buffer, Py_ssize_t offset, int64_t value) -> None:
    """Release-store of an int64 at ``offset``: earlier writes are visible before it."""
    cdef Py_buffer view
    cdef char *p = checked_address(&view, buffer, offset, 8, True)
    lb_store_release_i64(p, value)
    PyBuffer_Release(&view)


def get_and_add_int32(buffer, Py_ssize_t offset, int32_t delta) -> int:
    """Atomically add ``delta`` to the int32 at ``offset``; returns the previous value."""
    cdef Py_buffer view
    cdef char *p = checked_address(&view, buffer, offset, 4, True)
    cdef int32_t v = lb_get_and_add_i32(p, delta)
    PyBuffer_Release(&view)
    return v


def get_and_add_int64(buffer, Py_ssize_t offset, int64_t delta) -> int:
    """Atomically add ``delta`` to the int64 at ``offset``; returns the previous value."""
    cdef Py_buffer view
    cdef char *p = checked_address(&view, buffer, offset, 8, True)
    cdef int64_t v = lb_get_and_add_i64(p, delta)
    PyBuffer_Release(&view)
    return v


def compare_and_set_int32(buffer, Py_ssize_t offset, int32_t expected, int32_t update) -> bool:
    """Atomically set the int32 at ``offset`` to ``update`` if it holds ``expected``."""
    cdef Py_buffer view
    cdef char *p = checked_address(&view, buffer, offset, 4, True)
    cdef bint ok = lb_cas_i32(p, expected, update)
    PyBuffer_Release(&view)
    return ok


def compare_and_set_int64(buffer, Py_ssize_t offset, int64_t expected, int64_t update) -> bool:
    """Atomically set the int64 at ``offset`` to ``update`` if it holds ``expected``."""
    cdef Py_buffer view
    cdef char *p = checked_address(&view, buffer, offset, 8, True)
    cdef bint ok = lb_cas_i64(p, expected, update)
    PyBuffer_Release(&view)
    return ok


# ---------------------------------------------------------------------------------------------
# Position: an int64 counter in shared memory (publisher limit, subscriber position, ...)
# ---------------------------------------------------------------------------------------------
cdef inline void _check_open(Position position) except *:
    if position._mem is None:
        raise ValueError("position is closed")


cdef class Position:
    """A 64-bit position counter at a fixed, 8-byte aligned offset of a shared buffer."""

    def __cinit__(self, buffer, Py_ssize_t offset):
        cdef Py_buffer view
        self._p = checked_address(&view, buffer, offset, 8, True)
        PyBuffer_Release(&view)
        self._mem = memoryview(buffer)  # keeps the mapping exported (cannot be unmapped under us)
        self.offset = offset

    def get(self) -> int:
        """Plain load (only for the position's single writer)."""
        _check_open(self)
        return (<int64_t *>self._p)[0]

    def get_volatile(self) -> int:
        """Acquire-load."""
        _check_open(self)
        return lb_load_acquire_i64(self._p)

    def set_ordered(self, int64_t value) -> None:
        """Release-store."""
        _check_open(self)
        lb_store_release_i64(self._p, value)

    def propose_max_ordered(self, int64_t value) -> bool:
        """Release-store ``value`` if it is larger than the current value (single writer)."""
        _check_open(self)
        if lb_load_acquire_i64(self._p) < value:
            lb_store_release_i64(self._p, value)
            return True
        return False

    def close(self) -> None:
        if self._mem is not None:
            self._mem.release()
            self._mem = None
            self._p = NULL
