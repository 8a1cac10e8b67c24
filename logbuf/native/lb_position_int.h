/*
 * The position int an offer hands back, reused from one offer to the next.
 *
 * ``offer`` returns the new stream position, a Python int. Positions grow past 2^30 within seconds and
 * every one is a fresh int: an allocation and a free per message (on CPython 3.12+ each one also looks
 * up the interpreter through thread-local storage), about a tenth of a 32-byte offer loop from Python
 * (measured: 135 -> 125 ns on 3.12, 119-131 -> 106 ns on 3.11). Instead the publication keeps one int object with room for any int64 and writes the next
 * position into it, but only when nobody else can see it: its reference count is 1, the publication's
 * own reference (a caller that kept a position, in a variable, a list or a closure, holds another).
 * Otherwise the publication gives that object up to whoever holds it, exactly as a fresh int would have
 * been given up, and makes a new one. So a kept position never changes; only id() repeats, as it may
 * for any two ints whose lifetimes do not overlap.
 *
 * Ints carry no cached hash and are not tracked by the garbage collector; the fields written are
 * CPython's PyLongObject digits and size (``ob_size`` on 3.11, ``lv_tag`` on 3.12 and 3.13). Only
 * positive values go this way (offers' failure codes are small ints, which CPython caches). publisher.pyx
 * checks once, at import, that rewritten ints compare, hash, print and compute like fresh ones, and falls
 * back to fresh ints if they do not (or on a free-threaded, limited-API or other CPython build).
 */
#ifndef LOGBUF_POSITION_INT_H
#define LOGBUF_POSITION_INT_H

#include <Python.h>
#include <stdint.h>

#if !defined(Py_GIL_DISABLED) && !defined(Py_LIMITED_API) && PY_VERSION_HEX >= 0x030B0000 && \
    PY_VERSION_HEX < 0x030E0000
#define LB_POSITION_INT_REUSE 1
#else
#define LB_POSITION_INT_REUSE 0
#endif

/* ``value`` (> 0) as a new reference, written into ``*cache`` when that is unshared; ``*cache`` is the
 * publication's own reference, replaced when shared. NULL with an exception set on failure. */
static inline PyObject *lb_position_int(PyObject **cache, int64_t value, int reuse)
{
#if LB_POSITION_INT_REUSE
    if (reuse && value > 0) {
        PyObject *o = *cache;
        if (o == NULL || Py_REFCNT(o) != 1) {
            /* INT64_MAX: room for the digits of any position. */
            PyObject *fresh = PyLong_FromLongLong(INT64_MAX);
            if (fresh == NULL) {
                return NULL;
            }
            Py_XSETREF(*cache, fresh);
            o = fresh;
        }
#if PY_VERSION_HEX >= 0x030C0000
        digit *digits = ((PyLongObject *)o)->long_value.ob_digit;
#else
        digit *digits = ((PyLongObject *)o)->ob_digit;
#endif
        uint64_t rest = (uint64_t)value;
        Py_ssize_t count = 0;
        while (rest != 0) {
            digits[count++] = (digit)(rest & PyLong_MASK);
            rest >>= PyLong_SHIFT;
        }
#if PY_VERSION_HEX >= 0x030C0000
        ((PyLongObject *)o)->long_value.lv_tag = ((uintptr_t)count) << _PyLong_NON_SIZE_BITS; /* sign 0: positive */
#else
        Py_SET_SIZE(o, count);
#endif
        Py_INCREF(o);
        return o;
    }
#else
    (void)cache;
    (void)reuse;
#endif
    return PyLong_FromLongLong(value);
}

#endif
