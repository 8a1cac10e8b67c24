# cython: language_level=3
"""Memory-ordered access for the native modules: the ``lb_atomics.h`` primitives, the checked address of
an atomic field in a Python buffer, and the ``Position`` counter."""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int32_t, int64_t

cdef extern from "lb_atomics.h" nogil:
    int32_t lb_load_acquire_i32(const void *p)
    int64_t lb_load_acquire_i64(const void *p)
    void lb_store_release_i32(void *p, int32_t v)
    void lb_store_release_i64(void *p, int64_t v)
    int32_t lb_get_and_add_i32(void *p, int32_t d)
    int64_t lb_get_and_add_i64(void *p, int64_t d)
    bint lb_cas_i32(void *p, int32_t expected, int32_t desired)
    bint lb_cas_i64(void *p, int64_t expected, int64_t desired)
    void lb_fence_release()
    void lb_fence_acquire()


cdef inline char *checked_address(Py_buffer *view, object buffer, Py_ssize_t offset, Py_ssize_t size,
                                  bint writable) except NULL:
    """Address of the ``size``-byte field at ``offset`` of ``buffer``, bounds and alignment checked
    (ValueError naming the offset). ``view`` is acquired; the caller releases it."""
    cdef int flags = PyBUF_WRITABLE if writable else PyBUF_SIMPLE
    PyObject_GetBuffer(buffer, view, flags)
    if offset < 0 or offset > view.len - size:  # not offset + size: that can overflow
        PyBuffer_Release(view)
        raise ValueError(f"offset={offset} is out of bounds for a {size}-byte access in a buffer of {view.len} bytes")
    cdef char *p = <char *>view.buf + offset
    if (<size_t>p) % size != 0:
        PyBuffer_Release(view)
        raise ValueError(f"offset={offset} is not {size}-byte aligned (address alignment required for atomic access)")
    return p


cdef class Position:
    cdef object _mem
    cdef char *_p
    cdef readonly Py_ssize_t offset
