/*
 * The request/response buffer cache of iobuf.h.
 *
 * A block starts with a 64-byte header (magic, usable capacity, mapping length) in front of the
 * pointer handed out. Small blocks come from aligned_alloc. Large ones are anonymous mappings
 * whose length is the size class of the request (rounded up to 1/8 of its highest power of two,
 * at least a page), created with MAP_POPULATE so their pages are faulted in by one call rather
 * than one fault per page. Freed large blocks go to a cache ordered by the time they were freed:
 * an allocation takes the most recently freed block of its class; the oldest go first when the
 * cache is over its byte cap, full, or idle past MTS_IOBUF_IDLE_MS. Mappings are unmapped outside
 * the lock.
 */
#include "util/iobuf.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "util/clock.h"
#include "util/status.h"

#define HDR 64
#define MAGIC_SMALL 0x6d74732d696f736dULL
#define MAGIC_LARGE 0x6d74732d696f6c67ULL
#define SLOTS 128 /* blocks the cache may hold (a flood's half of 100 queued 2.5 MB requests: ~60) */

typedef struct hdr {
    uint64_t magic;
    size_t cap;     /* usable bytes after the header */
    size_t map_len; /* mapping length (large blocks), 0 for small */
    uint64_t pad[5];
} hdr;

_Static_assert(sizeof(hdr) == HDR, "the header keeps blocks 64-byte aligned");

typedef struct slot {
    void *base;
    size_t len;
    double freed_ms;
} slot;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static slot g_slots[SLOTS]; /* oldest first */
static int g_n;
static size_t g_cached;
static unsigned long long g_reused, g_mapped;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static size_t g_cap = MTS_IOBUF_CACHE;
static bool g_cap_fixed;   /* MTS_IOBUF_CACHE_MB was given: the cap is exactly that */
static size_t g_live;      /* bytes of large blocks handed out and not yet freed */
static size_t g_big;       /* the largest block freed within the idle window ... */
static double g_big_ms;    /* ... and when */

static void read_env(void)
{
    const char *e = getenv("MTS_IOBUF_CACHE_MB");
    if (e && *e) {
        char *end;
        unsigned long long mb = strtoull(e, &end, 10);
        if (*end == '\0' && mb <= ((unsigned long long)1 << 20)) g_cap = (size_t)mb << 20, g_cap_fixed = true;
    }
}

static size_t class_len(size_t n)
{
    size_t total = n + HDR, hb = 1;
    while (hb <= total / 2) hb <<= 1;
    size_t step = hb / 8 < 4096 ? 4096 : hb / 8;
    return (total + step - 1) / step * step;
}

/* Removes slot i (lock held). */
static void slot_remove(int i)
{
    g_cached -= g_slots[i].len;
    memmove(&g_slots[i], &g_slots[i + 1], sizeof(slot) * (size_t)(g_n - i - 1));
    g_n--;
}

/* Moves the blocks idle past the limit into out (lock held); returns how many. */
static int take_idle(double now, slot *out, int n_out)
{
    while (g_n > 0 && now - g_slots[0].freed_ms > MTS_IOBUF_IDLE_MS) {
        out[n_out++] = g_slots[0];
        slot_remove(0);
    }
    return n_out;
}

static void unmap_all(const slot *s, int n)
{
    for (int i = 0; i < n; i++) munmap(s[i].base, s[i].len);
}

void *mts_iobuf_alloc(size_t n)
{
    pthread_once(&g_once, read_env);
    if (n > SIZE_MAX / 2) return NULL;
    if (n + HDR < MTS_IOBUF_MIN) {
        hdr *h = aligned_alloc(64, (n + HDR + 63) / 64 * 64);
        if (!h) return NULL;
        *h = (hdr){.magic = MAGIC_SMALL, .cap = (n + HDR + 63) / 64 * 64 - HDR};
        return (char *)h + HDR;
    }
    size_t len = class_len(n);
    slot drop[SLOTS];
    int nd = 0;
    void *base = NULL;
    pthread_mutex_lock(&g_lock);
    nd = take_idle(mts_now_ms(), drop, 0);
    for (int i = g_n - 1; i >= 0; i--)
        if (g_slots[i].len == len) {
            base = g_slots[i].base;
            slot_remove(i);
            g_reused++;
            break;
        }
    if (!base) g_mapped++;
    g_live += len;
    pthread_mutex_unlock(&g_lock);
    unmap_all(drop, nd);
    if (!base) {
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (base == MAP_FAILED) {
            pthread_mutex_lock(&g_lock);
            g_live -= len;
            pthread_mutex_unlock(&g_lock);
            return NULL;
        }
    }
    hdr *h = base;
    *h = (hdr){.magic = MAGIC_LARGE, .cap = len - HDR, .map_len = len};
    return (char *)h + HDR;
}

static hdr *header_of(const void *p)
{
    hdr *h = (hdr *)((char *)p - HDR);
    MTS_ASSERT(h->magic == MAGIC_SMALL || h->magic == MAGIC_LARGE);
    return h;
}

void mts_iobuf_free(void *p)
{
    if (!p) return;
    hdr *h = header_of(p);
    if (h->magic == MAGIC_SMALL) {
        h->magic = 0;
        free(h);
        return;
    }
    size_t len = h->map_len;
    h->magic = 0;
    slot drop[SLOTS + 1];
    double now = mts_now_ms();
    pthread_mutex_lock(&g_lock);
    /* Without a configured cap, the cache may hold two blocks of the largest size in recent use
     * when that is more than the default (lip-sync requests of 16 frames are 40 MB); idle blocks
     * still go after MTS_IOBUF_IDLE_MS, so this memory is held only while such traffic lasts. */
    if (now - g_big_ms > MTS_IOBUF_IDLE_MS || len >= g_big) g_big = len, g_big_ms = now;
    /* While much is in use (a flood of large requests filling a queue: 100 queued 2.5 MB
     * requests are 250 MB), the cache may hold up to half of it, so the blocks a finished batch
     * frees (its requests and replies, 30 MB for 8 of them) wait for the next admissions
     * instead of being unmapped and mapped again; as the blocks come back the cap falls to the
     * default again. */
    size_t live = g_live;
    g_live -= len;
    size_t cap = g_cap;
    if (!g_cap_fixed) {
        if (2 * g_big > cap) cap = 2 * g_big;
        if (live / 2 > cap) cap = live / 2;
    }
    if (len > cap) {
        pthread_mutex_unlock(&g_lock);
        munmap(h, len);
        return;
    }
    int nd = take_idle(now, drop, 0);
    while (g_n > 0 && (g_cached + len > cap || g_n == SLOTS)) {
        drop[nd++] = g_slots[0];
        slot_remove(0);
    }
    g_slots[g_n++] = (slot){.base = h, .len = len, .freed_ms = now};
    g_cached += len;
    pthread_mutex_unlock(&g_lock);
    unmap_all(drop, nd);
}

void *mts_iobuf_grow(void *p, size_t keep, size_t n)
{
    if (p && mts_iobuf_capacity(p) >= n) return p;
    void *q = mts_iobuf_alloc(n);
    if (!q) return NULL;
    if (keep) memcpy(q, p, keep);
    mts_iobuf_free(p);
    return q;
}

size_t mts_iobuf_capacity(const void *p)
{
    return header_of(p)->cap;
}

size_t mts_iobuf_cached_bytes(void)
{
    pthread_mutex_lock(&g_lock);
    size_t n = g_cached;
    pthread_mutex_unlock(&g_lock);
    return n;
}

void mts_iobuf_counts(unsigned long long *reused, unsigned long long *mapped)
{
    pthread_mutex_lock(&g_lock);
    *reused = g_reused;
    *mapped = g_mapped;
    pthread_mutex_unlock(&g_lock);
}

void mts_iobuf_trim(void)
{
    slot drop[SLOTS];
    pthread_mutex_lock(&g_lock);
    int nd = g_n;
    memcpy(drop, g_slots, sizeof(slot) * (size_t)g_n);
    g_n = 0;
    g_cached = 0;
    g_big = 0; /* the cap follows the blocks freed from now on */
    pthread_mutex_unlock(&g_lock);
    unmap_all(drop, nd);
}
