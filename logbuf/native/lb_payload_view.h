/*
 * The payload view a poll hands to fragment handlers, reused from one fragment to the next.
 *
 * A poll hands each fragment's payload to the handler as a read-only memoryview over the term.
 * Making a fresh one per fragment (a slice: two ints, a slice object, a memoryview, then freeing
 * them) cost more than the rest of the poll.  Instead the image keeps one memoryview over the log's
 * mapping and points it at the next payload, but only when nobody else can see it: its reference
 * count is 1 (the image's own reference; a handler that kept it, in a list or a closure, holds
 * another), it exports no buffer (numpy.frombuffer and the like re-export it), it is not released
 * and has no weak reference.  Otherwise the image gives up that object to whoever holds it, exactly
 * as a fresh slice would have been given up, and makes a new one.  So a handler can keep a payload
 * view exactly as before (it then stays pointing at its own fragment); only its id() repeats.
 *
 * The view keeps the mapping's managed buffer (the term views' exporter) alive, as a slice does, so
 * it never points outside the mapping.  The fields touched are CPython's PyMemoryViewObject, whose
 * layout is the same from 3.3 to 3.13; reader.pyx checks once, at import, that retargeting works as
 * described, and falls back to fresh slices if it does not (or under a free-threaded build).
 */
#ifndef LOGBUF_PAYLOAD_VIEW_H
#define LOGBUF_PAYLOAD_VIEW_H

#include <Python.h>

/* Point the unshared one-dimensional byte memoryview ``o`` at ``length`` bytes from ``buf``: 1 if done,
 * 0 if ``o`` is shared (or not such a view) and must be replaced. */
static inline int lb_payload_view_retarget(PyObject *o, const char *buf, Py_ssize_t length)
{
#if defined(Py_GIL_DISABLED) || defined(Py_LIMITED_API)
    (void)o; (void)buf; (void)length;
    return 0;
#else
    PyMemoryViewObject *mv = (PyMemoryViewObject *)o;
    if (Py_REFCNT(o) != 1 || mv->exports != 0 || (mv->flags & _Py_MEMORYVIEW_RELEASED) ||
        mv->weakreflist != NULL || mv->view.ndim != 1 || mv->view.itemsize != 1) {
        return 0;
    }
    mv->view.buf = (void *)buf;
    mv->view.len = length;
    mv->view.shape[0] = length;
    mv->hash = -1;
    return 1;
#endif
}

#endif
