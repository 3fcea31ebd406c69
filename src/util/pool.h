/*
 * A memory pool: many small allocations freed together in one call. The loader keeps every
 * name, node, attribute and copied weight of a model in one pool, so freeing a model (or
 * bailing out of a half-parsed one) is a single mts_pool_free. The pool counts its bytes so
 * model memory can be accounted from real allocation sizes.
 */
#ifndef MTS_UTIL_POOL_H
#define MTS_UTIL_POOL_H

#include <stddef.h>

typedef struct mts_pool_block mts_pool_block;

typedef struct mts_pool {
    mts_pool_block *head;
    size_t bytes; /* payload bytes handed out */
} mts_pool;

/* Zeroed, 64-byte aligned memory; NULL when out of memory (or size overflow). */
void *mts_pool_alloc(mts_pool *p, size_t size);
/* Zeroed array of n elements of size bytes, with overflow check. */
void *mts_pool_calloc(mts_pool *p, size_t n, size_t size);
/* NUL-terminated copy of len bytes of s. */
char *mts_pool_strndup(mts_pool *p, const char *s, size_t len);
void mts_pool_free(mts_pool *p);

#endif
