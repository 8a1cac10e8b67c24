# cython: language_level=3
"""A subscriber's topic filter: which topic ids its patterns match, cached natively.

Theory of operation
-------------------
A topic message carries its 63-bit topic id in the DATA frame's reserved value (``protocol_spec/topics.md``);
a definition frame carries the id with bit 63 set (a negative reserved value) and the topic's name as its
payload. The filtered polls of :class:`~logbuf.native.reader.ImageCore` ask :meth:`TopicFilter.accept` per
frame. The answer for an id seen before is one probe of an open-addressing table (key = the id itself: it is
already a uniform hash). An id seen for the first time calls the Python ``resolver(topic_id)`` once: it
names the topic (from the registry or a definition) and matches it against the patterns, returning True,
False, or None when the id cannot be named yet. True and False are cached until :meth:`reset`; None is not
cached (the next frame of that id asks again) and the frame is skipped and counted in ``unresolved``.
A definition frame is never delivered: it goes to ``on_definition(topic_id, name: bytes)``.

The table holds at most ``max_entries`` ids (default 4M, 36 MiB); past that an id's decision is no longer
cached and every one of its frames calls the resolver (correct, slower).
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from libc.stdint cimport int32_t, int64_t, uint8_t

DEF _INITIAL_CAPACITY = 1024

TOPIC_ID_MASK = 0x7FFF_FFFF_FFFF_FFFF
"""The bits of a reserved value that hold the topic id."""


cdef class TopicFilter:
    """``TopicFilter(resolver, on_definition, deliver_untagged=False, max_entries=4194304)``: see the module
    docstring. ``delivered``, ``skipped``, ``unresolved``, ``definitions`` and ``resolutions`` count frames
    (resolutions: resolver calls)."""

    def __cinit__(self, resolver, on_definition, bint deliver_untagged=False, Py_ssize_t max_entries=1 << 22):
        if max_entries < 1:
            raise ValueError(f"max_entries={max_entries} must be positive")
        self._keys = NULL
        self._states = NULL
        self._resolver = resolver
        self._on_definition = on_definition
        self.deliver_untagged = deliver_untagged
        self._max_entries = max_entries
        self._allocate(_INITIAL_CAPACITY)

    def __dealloc__(self):
        PyMem_Free(self._keys)
        PyMem_Free(self._states)

    cdef int _allocate(self, Py_ssize_t capacity) except -1:
        cdef int64_t *keys = <int64_t *>PyMem_Calloc(capacity, sizeof(int64_t))
        cdef uint8_t *states = <uint8_t *>PyMem_Calloc(capacity, sizeof(uint8_t))
        if keys == NULL or states == NULL:
            PyMem_Free(keys)
            PyMem_Free(states)
            raise MemoryError()
        PyMem_Free(self._keys)
        PyMem_Free(self._states)
        self._keys, self._states = keys, states
        self._mask = capacity - 1
        self._count = 0
        return 0

    @property
    def cached(self) -> int:
        """How many topic ids have a cached decision."""
        return self._count

    def reset(self) -> None:
        """Forget every cached decision (the patterns changed): each id is resolved again when next seen."""
        self._allocate(_INITIAL_CAPACITY)

    def accepts(self, int64_t value, payload=b"") -> bool:
        """:meth:`accept` from Python (tests, tools): whether a frame with this reserved value is delivered."""
        cdef const unsigned char[:] data = payload
        cdef const char *p = <const char *>&data[0] if data.shape[0] > 0 else NULL
        return self.accept(value, p, <int32_t>data.shape[0]) == 1

    cdef int _insert(self, int64_t topic_id, uint8_t state) except -1:
        cdef Py_ssize_t capacity = self._mask + 1, i, old_capacity
        cdef int64_t *old_keys
        cdef uint8_t *old_states
        if self._count >= self._max_entries:
            return 0
        if (self._count + 1) * 2 > capacity:  # keep the load under one half: short probes
            old_keys, old_states, old_capacity = self._keys, self._states, capacity
            self._keys = self._states = NULL
            try:
                self._allocate(capacity * 2)
            except MemoryError:
                self._keys, self._states, self._mask = old_keys, old_states, old_capacity - 1
                raise
            for i in range(old_capacity):
                if old_keys[i] != 0:
                    self._put(old_keys[i], old_states[i])
            PyMem_Free(old_keys)
            PyMem_Free(old_states)
        self._put(topic_id, state)
        return 0

    cdef void _put(self, int64_t topic_id, uint8_t state) noexcept:
        cdef Py_ssize_t i = <Py_ssize_t>(topic_id & self._mask)
        while self._keys[i] != 0 and self._keys[i] != topic_id:
            i = (i + 1) & self._mask
        if self._keys[i] == 0:
            self._count += 1
        self._keys[i] = topic_id
        self._states[i] = state

    cdef int _resolve(self, int64_t topic_id) except -1:
        self.resolutions += 1
        cdef object decision = self._resolver(topic_id)
        if decision is None:
            self.unresolved += 1
            return 0
        if decision:
            self._insert(topic_id, TOPIC_STATE_MATCH)
            self.delivered += 1
            return 1
        self._insert(topic_id, TOPIC_STATE_NO_MATCH)
        self.skipped += 1
        return 0

    cdef int _definition(self, int64_t value, const char *name, int32_t length) except -1:
        self.definitions += 1
        self._on_definition(value & 0x7FFFFFFFFFFFFFFF, PyBytes_FromStringAndSize(name, length))
        return 0
