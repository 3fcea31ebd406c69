/*
 * Unit tests of the request/response buffer cache (util/iobuf.h): alignment and capacity of small
 * and large blocks, reuse of a freed large block by the next request of its size class, growth
 * that keeps the bytes, the byte cap on what the cache holds (and how it follows the largest
 * blocks in use and the bytes in use), trimming, and many threads
 * allocating, filling, checking and freeing blocks at once (run under TSan and ASan in CI).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "util/iobuf.h"

static void test_alignment_and_capacity(void **state)
{
    (void)state;
    static const size_t sizes[] = {1, 63, 64, 1000, 200000, MTS_IOBUF_MIN, 300000, 2457600, 5000000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = mts_iobuf_alloc(sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        size_t cap = mts_iobuf_capacity(p);
        assert_true(cap >= sizes[i]);
        assert_true(cap <= sizes[i] + sizes[i] / 8 + 8192); /* at most 1/8 rounding (+ a page) */
        memset(p, 0xa5, cap);                                /* the whole capacity is usable */
        mts_iobuf_free(p);
    }
    mts_iobuf_free(NULL);
    mts_iobuf_trim();
}

static void test_reuse_of_a_size_class(void **state)
{
    (void)state;
    mts_iobuf_trim();
    unsigned long long r0, m0, r1, m1;
    mts_iobuf_counts(&r0, &m0);
    char *a = mts_iobuf_alloc(2457600);
    assert_non_null(a);
    memset(a, 1, 2457600);
    mts_iobuf_free(a);
    assert_true(mts_iobuf_cached_bytes() >= 2457600);
    char *b = mts_iobuf_alloc(2457600 + 1000); /* same class: the block comes back */
    assert_non_null(b);
    mts_iobuf_counts(&r1, &m1);
    assert_int_equal(m1 - m0, 1);
    assert_int_equal(r1 - r0, 1);
    assert_int_equal(mts_iobuf_cached_bytes(), 0);
    char *c = mts_iobuf_alloc(4 * 2457600); /* another class: a new mapping */
    mts_iobuf_counts(&r1, &m1);
    assert_int_equal(m1 - m0, 2);
    mts_iobuf_free(b);
    mts_iobuf_free(c);
    mts_iobuf_trim();
    assert_int_equal(mts_iobuf_cached_bytes(), 0);
}

static void test_grow_keeps_bytes(void **state)
{
    (void)state;
    char *p = mts_iobuf_grow(NULL, 0, 100);
    assert_non_null(p);
    for (int i = 0; i < 100; i++) p[i] = (char)i;
    char *q = mts_iobuf_grow(p, 100, 3 << 20);
    assert_non_null(q);
    for (int i = 0; i < 100; i++) assert_int_equal(q[i], (char)i);
    assert_ptr_equal(mts_iobuf_grow(q, 100, 1 << 20), q); /* big enough already: unchanged */
    mts_iobuf_free(q);
    mts_iobuf_trim();
}

static void test_cache_is_bounded(void **state)
{
    (void)state;
    mts_iobuf_trim();
    enum { N = 40 };
    char *blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = mts_iobuf_alloc((size_t)(1 + i % 5) << 20);
        assert_non_null(blocks[i]);
    }
    /* the cap: the default, two of the largest blocks, or half of what is in use at a free */
    size_t live = 0, largest = 0;
    for (int i = 0; i < N; i++) live += mts_iobuf_capacity(blocks[i]) + 64;
    for (int i = 0; i < N; i++) {
        size_t len = mts_iobuf_capacity(blocks[i]) + 64;
        if (len > largest) largest = len;
        size_t cap = MTS_IOBUF_CACHE;
        if (2 * largest > cap) cap = 2 * largest;
        if (live / 2 > cap) cap = live / 2;
        mts_iobuf_free(blocks[i]);
        live -= len;
        assert_true(mts_iobuf_cached_bytes() <= cap);
    }
    /* all back: the last free brought the cache to the default cap (two 5 MB blocks are less) */
    assert_true(mts_iobuf_cached_bytes() > 0);
    assert_true(mts_iobuf_cached_bytes() <= MTS_IOBUF_CACHE);
    mts_iobuf_trim();
    assert_int_equal(mts_iobuf_cached_bytes(), 0);
}

/* A flood of large requests: with 150 MB of 2.5 MB blocks in use, the twelve a finished batch
 * frees (30 MB, more than the default cap) are all kept and the next twelve allocations reuse
 * them without mapping anything; once every block is back the cache is within the default. */
static void test_cache_follows_the_bytes_in_use(void **state)
{
    (void)state;
    mts_iobuf_trim();
    enum { N = 60, BATCH = 12 };
    size_t n = 2457600;
    char *blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = mts_iobuf_alloc(n);
        assert_non_null(blocks[i]);
    }
    for (int i = 0; i < BATCH; i++) mts_iobuf_free(blocks[i]);
    assert_true(mts_iobuf_cached_bytes() >= BATCH * n);
    assert_true(mts_iobuf_cached_bytes() > MTS_IOBUF_CACHE);
    unsigned long long r0, m0, r1, m1;
    mts_iobuf_counts(&r0, &m0);
    for (int i = 0; i < BATCH; i++) {
        blocks[i] = mts_iobuf_alloc(n);
        assert_non_null(blocks[i]);
    }
    mts_iobuf_counts(&r1, &m1);
    assert_int_equal(m1 - m0, 0);
    assert_int_equal(r1 - r0, BATCH);
    for (int i = 0; i < N; i++) mts_iobuf_free(blocks[i]);
    assert_true(mts_iobuf_cached_bytes() <= MTS_IOBUF_CACHE);
    mts_iobuf_trim();
    assert_int_equal(mts_iobuf_cached_bytes(), 0);
}

/* Without MTS_IOBUF_CACHE_MB, a block larger than the default cap (a 40 MB lip-sync request) is
 * kept for the next request of its size while such requests keep coming. */
static void test_large_blocks_cached_while_in_use(void **state)
{
    (void)state;
    mts_iobuf_trim();
    size_t big = (size_t)40 << 20;
    assert_true(big > MTS_IOBUF_CACHE);
    unsigned long long r0, m0, r1, m1;
    mts_iobuf_counts(&r0, &m0);
    for (int i = 0; i < 3; i++) {
        char *p = mts_iobuf_alloc(big);
        assert_non_null(p);
        p[big - 1] = 1;
        mts_iobuf_free(p);
        assert_true(mts_iobuf_cached_bytes() >= big);
        assert_true(mts_iobuf_cached_bytes() <= 2 * (big + big / 8));
    }
    mts_iobuf_counts(&r1, &m1);
    assert_int_equal(m1 - m0, 1); /* mapped once, then reused */
    assert_int_equal(r1 - r0, 2);
    mts_iobuf_trim();
    assert_int_equal(mts_iobuf_cached_bytes(), 0);
}

static void *churn(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < 400; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t n = (seed >> 8) % 3 == 0 ? (seed >> 4) % 4096 : ((seed >> 4) % 6 + 1) * 300000;
        unsigned char *p = mts_iobuf_alloc(n);
        if (!p) return (void *)1;
        memset(p, (int)(seed & 0xff), n);
        for (size_t k = 0; k < n; k += 4093)
            if (p[k] != (seed & 0xff)) return (void *)1;
        mts_iobuf_free(p);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, churn, (void *)(i + 1)), 0);
    for (int i = 0; i < 4; i++) {
        void *rc;
        pthread_join(t[i], &rc);
        assert_null(rc);
    }
    assert_true(mts_iobuf_cached_bytes() <= MTS_IOBUF_CACHE);
    mts_iobuf_trim();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alignment_and_capacity),
        cmocka_unit_test(test_large_blocks_cached_while_in_use),
        cmocka_unit_test(test_reuse_of_a_size_class),
        cmocka_unit_test(test_grow_keeps_bytes),
        cmocka_unit_test(test_cache_is_bounded),
        cmocka_unit_test(test_cache_follows_the_bytes_in_use),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
