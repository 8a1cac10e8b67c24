# cython: language_level=3
"""A mapped log buffer resolved to pointers, shared by the publication and image cores."""

from libc.stdint cimport int32_t


cdef class LogView:
    cdef object _mem
    cdef char *base
    cdef char *meta
    cdef char *terms[3]
    cdef object _term_views
    cdef readonly int32_t term_length
    cdef readonly int32_t position_bits_to_shift
    cdef readonly int32_t initial_term_id
    cdef readonly int32_t mtu_length
