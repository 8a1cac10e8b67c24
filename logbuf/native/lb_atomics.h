/*
 * Memory-ordered access to shared memory for logbuf's native core.
 *
 * Every load or store whose ordering matters across processes goes through one of these.
 * They compile to the GCC/Clang __atomic builtins; on x86-64 acquire loads and release
 * stores are plain moves with compiler barriers, get-and-add is LOCK XADD and
 * compare-and-set is LOCK CMPXCHG.  Addresses must be naturally aligned (checked by callers).
 */
#ifndef LOGBUF_ATOMICS_H
#define LOGBUF_ATOMICS_H

#include <stdint.h>

static inline int32_t lb_load_acquire_i32(const void *p) { return __atomic_load_n((const int32_t *)p, __ATOMIC_ACQUIRE); }
static inline int64_t lb_load_acquire_i64(const void *p) { return __atomic_load_n((const int64_t *)p, __ATOMIC_ACQUIRE); }
static inline void lb_store_release_i32(void *p, int32_t v) { __atomic_store_n((int32_t *)p, v, __ATOMIC_RELEASE); }
static inline void lb_store_release_i64(void *p, int64_t v) { __atomic_store_n((int64_t *)p, v, __ATOMIC_RELEASE); }
static inline int32_t lb_get_and_add_i32(void *p, int32_t d) { return __atomic_fetch_add((int32_t *)p, d, __ATOMIC_SEQ_CST); }
static inline int64_t lb_get_and_add_i64(void *p, int64_t d) { return __atomic_fetch_add((int64_t *)p, d, __ATOMIC_SEQ_CST); }
static inline int lb_cas_i32(void *p, int32_t expected, int32_t desired)
{
    return __atomic_compare_exchange_n((int32_t *)p, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline int lb_cas_i64(void *p, int64_t expected, int64_t desired)
{
    return __atomic_compare_exchange_n((int64_t *)p, &expected, desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline void lb_fence_release(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }
static inline void lb_fence_acquire(void) { __atomic_thread_fence(__ATOMIC_ACQUIRE); }

#endif
