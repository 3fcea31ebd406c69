/*
 * Pool allocator: each allocation is its own malloc'd block with a small header linking it to
 * the previous one. That keeps large weights copies exact-sized (no slab waste) while small
 * strings stay cheap enough for a loader that runs once per model load.
 */
#include "util/pool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct mts_pool_block {
    mts_pool_block *next;
    size_t size;
    /* payload follows, aligned to 64 bytes */
};

#define MTS_POOL_ALIGN 64
#define MTS_POOL_HDR ((sizeof(mts_pool_block) + MTS_POOL_ALIGN - 1) / MTS_POOL_ALIGN * MTS_POOL_ALIGN)

void *mts_pool_alloc(mts_pool *p, size_t size)
{
    if (size > SIZE_MAX - MTS_POOL_HDR - MTS_POOL_ALIGN) return NULL;
    size_t total = (MTS_POOL_HDR + size + MTS_POOL_ALIGN - 1) / MTS_POOL_ALIGN * MTS_POOL_ALIGN;
    mts_pool_block *b = aligned_alloc(MTS_POOL_ALIGN, total);
    if (!b) return NULL;
    memset(b, 0, total);
    b->next = p->head;
    b->size = size;
    p->head = b;
    p->bytes += size;
    return (char *)b + MTS_POOL_HDR;
}

void *mts_pool_calloc(mts_pool *p, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    return mts_pool_alloc(p, (n && size) ? n * size : 1);
}

char *mts_pool_strndup(mts_pool *p, const char *s, size_t len)
{
    char *d = mts_pool_alloc(p, len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

void mts_pool_free(mts_pool *p)
{
    mts_pool_block *b = p->head;
    while (b) {
        mts_pool_block *next = b->next;
        free(b);
        b = next;
    }
    p->head = NULL;
    p->bytes = 0;
}
