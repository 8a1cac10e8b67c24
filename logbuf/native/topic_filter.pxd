# cython: language_level=3
"""The subscriber's topic filter (see topic_filter.pyx): a native cache of "does topic id X match my
patterns", filled once per topic id by a Python resolver, read per frame by the filtered polls."""

from libc.stdint cimport int32_t, int64_t, uint8_t

cdef enum:
    TOPIC_STATE_EMPTY = 0
    TOPIC_STATE_MATCH = 1
    TOPIC_STATE_NO_MATCH = 2


cdef class TopicFilter:
    cdef int64_t *_keys
    cdef uint8_t *_states
    cdef Py_ssize_t _mask
    cdef Py_ssize_t _count
    cdef Py_ssize_t _max_entries
    cdef object _resolver
    cdef object _on_definition
    cdef readonly bint deliver_untagged
    cdef readonly int64_t delivered
    cdef readonly int64_t skipped
    cdef readonly int64_t unresolved
    cdef readonly int64_t definitions
    cdef readonly int64_t resolutions

    cdef int _resolve(self, int64_t topic_id) except -1
    cdef int _definition(self, int64_t value, const char *name, int32_t length) except -1
    cdef int _insert(self, int64_t topic_id, uint8_t state) except -1
    cdef int _allocate(self, Py_ssize_t capacity) except -1
    cdef void _put(self, int64_t topic_id, uint8_t state) noexcept

    cdef inline int accept(self, int64_t value, const char *payload, int32_t length) except -1:
        """1: deliver the frame whose reserved value is ``value``; 0: skip it (counted)."""
        cdef Py_ssize_t i
        cdef int64_t key
        if value > 0:
            i = <Py_ssize_t>(value & self._mask)
            while True:
                key = self._keys[i]
                if key == value:
                    if self._states[i] == TOPIC_STATE_MATCH:
                        self.delivered += 1
                        return 1
                    self.skipped += 1
                    return 0
                if key == 0:
                    return self._resolve(value)
                i = (i + 1) & self._mask
        if value == 0:
            if self.deliver_untagged:
                self.delivered += 1
                return 1
            self.skipped += 1
            return 0
        return self._definition(value, payload, length)
