/*
 * Buffers for request and response bytes, with a small cache of large ones.
 *
 * The server keeps the process's malloc from holding freed memory (a low fixed mmap threshold,
 * see serve/registry.c), so every multi-megabyte block becomes a fresh anonymous mapping: each
 * request that reads a 2 MB tensor body, copies it or returns a 2 MB output would map, fault in
 * page by page and unmap that memory again. Under a flood of such requests the page faults and
 * the unmapping (TLB shootdowns across the worker threads) cost a large share of the CPU and
 * delay every other tenant's requests in the front end.
 *
 * mts_iobuf_alloc keeps blocks of at least MTS_IOBUF_MIN bytes in size classes (at most 1/8
 * rounding waste) and hands a freed block to the next request of the same class instead of
 * unmapping it. The cache is bounded: at most MTS_IOBUF_CACHE bytes, or two blocks of the
 * largest size freed within the idle window, or half the bytes of large blocks in use when a
 * block is freed, whichever is most (environment MTS_IOBUF_CACHE_MB sets a fixed cap instead,
 * 0 disables the cache), and blocks idle for longer than
 * MTS_IOBUF_IDLE_MS are unmapped, so memory goes back to the system soon after a burst.
 * Smaller blocks go to malloc.
 * Every pointer is 64-byte aligned. Thread-safe.
 */
#ifndef MTS_UTIL_IOBUF_H
#define MTS_UTIL_IOBUF_H

#include <stddef.h>

#define MTS_IOBUF_MIN ((size_t)256 << 10)
#define MTS_IOBUF_CACHE ((size_t)24 << 20)
#define MTS_IOBUF_IDLE_MS 2000

/* A block of at least n bytes (64-byte aligned), or NULL when out of memory. */
void *mts_iobuf_alloc(size_t n);

/* Frees a block of mts_iobuf_alloc / mts_iobuf_grow (NULL is ignored). */
void mts_iobuf_free(void *p);

/* A block of at least n bytes holding the first `keep` bytes of p (p may be NULL with keep 0);
 * p is freed on success and left untouched on failure (NULL). */
void *mts_iobuf_grow(void *p, size_t keep, size_t n);

/* Usable bytes of a block (at least what was asked). */
size_t mts_iobuf_capacity(const void *p);

/* Bytes held in the cache now, and blocks handed out from it / newly mapped since start. */
size_t mts_iobuf_cached_bytes(void);
void mts_iobuf_counts(unsigned long long *reused, unsigned long long *mapped);

/* Unmaps every cached block (after unloads, when the process gives memory back). */
void mts_iobuf_trim(void);

#endif
