/*
 * Statistics for `mtserve bench`: a log-linear latency histogram (exact to 128 us, then 64
 * buckets per power of two, so any quantile is within 0.8 % of the true value), error counts by
 * key with the first message of each, Zipf popularity sampling, and a small xorshift generator.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "cli/bench.h"

#define HIST_MAX_US ((UINT64_C(1) << 41) - 1)

int mts_bench_hist_index(uint64_t us)
{
    if (us > HIST_MAX_US) us = HIST_MAX_US;
    if (us < 2 * MTS_HIST_SUB) return (int)us;
    int m = 63 - __builtin_clzll(us); /* >= 7 */
    int shift = m - 6;
    uint64_t top = us >> shift; /* 64..127 */
    return 2 * MTS_HIST_SUB + (m - 7) * MTS_HIST_SUB + (int)(top - MTS_HIST_SUB);
}

uint64_t mts_bench_hist_bucket_low(int idx)
{
    if (idx < 2 * MTS_HIST_SUB) return (uint64_t)idx;
    int k = idx - 2 * MTS_HIST_SUB;
    int m = 7 + k / MTS_HIST_SUB;
    uint64_t top = (uint64_t)(MTS_HIST_SUB + k % MTS_HIST_SUB);
    return top << (m - 6);
}

static uint64_t bucket_width(int idx)
{
    if (idx < 2 * MTS_HIST_SUB) return 1;
    int m = 7 + (idx - 2 * MTS_HIST_SUB) / MTS_HIST_SUB;
    return UINT64_C(1) << (m - 6);
}

void mts_bench_hist_init(mts_bench_hist *h)
{
    memset(h, 0, sizeof *h);
    h->min_us = UINT64_MAX;
}

void mts_bench_hist_add(mts_bench_hist *h, double us)
{
    if (!(us >= 0)) us = 0;
    uint64_t v = us > (double)HIST_MAX_US ? HIST_MAX_US : (uint64_t)llround(us);
    h->bins[mts_bench_hist_index(v)]++;
    h->count++;
    h->sum_us += us;
    if (v < h->min_us) h->min_us = v;
    if (v > h->max_us) h->max_us = v;
}

void mts_bench_hist_merge(mts_bench_hist *dst, const mts_bench_hist *src)
{
    if (!src->count) return;
    for (int i = 0; i < MTS_HIST_N; i++) dst->bins[i] += src->bins[i];
    dst->count += src->count;
    dst->sum_us += src->sum_us;
    if (src->min_us < dst->min_us) dst->min_us = src->min_us;
    if (src->max_us > dst->max_us) dst->max_us = src->max_us;
}

double mts_bench_hist_quantile(const mts_bench_hist *h, double q)
{
    if (!h->count) return 0;
    if (q >= 1) return (double)h->max_us;
    if (q <= 0) return (double)h->min_us;
    uint64_t rank = (uint64_t)ceil(q * (double)h->count);
    if (rank < 1) rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < MTS_HIST_N; i++) {
        seen += h->bins[i];
        if (seen >= rank) {
            /* middle of the bucket, clamped to what was observed */
            double v = (double)mts_bench_hist_bucket_low(i) + (double)(bucket_width(i) - 1) / 2.0;
            if (v > (double)h->max_us) v = (double)h->max_us;
            if (v < (double)h->min_us) v = (double)h->min_us;
            return v;
        }
    }
    return (double)h->max_us;
}

double mts_bench_hist_mean(const mts_bench_hist *h)
{
    return h->count ? h->sum_us / (double)h->count : 0;
}

void mts_bench_codes_add(mts_bench_codes *c, const char *key, const char *msg, uint64_t n)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].key, key)) {
            c->e[i].count += n;
            return;
        }
    if (c->n < MTS_BENCH_MAX_CODES - 1 || (c->n == MTS_BENCH_MAX_CODES - 1 && !strcmp(key, "other"))) {
        int i = c->n++;
        snprintf(c->e[i].key, sizeof c->e[i].key, "%s", key);
        snprintf(c->e[i].msg, sizeof c->e[i].msg, "%s", msg ? msg : "");
        c->e[i].count = n;
        return;
    }
    mts_bench_codes_add(c, "other", msg, n); /* the last slot absorbs further keys */
}

uint64_t mts_bench_codes_total(const mts_bench_codes *c)
{
    uint64_t t = 0;
    for (int i = 0; i < c->n; i++) t += c->e[i].count;
    return t;
}

int mts_bench_popularity_init(mts_bench_popularity *p, int n, double s)
{
    p->n = n;
    p->cdf = malloc((size_t)(n > 0 ? n : 1) * sizeof *p->cdf);
    if (!p->cdf) return -1;
    double total = 0;
    for (int i = 0; i < n; i++) {
        total += s > 0 ? pow((double)(i + 1), -s) : 1.0;
        p->cdf[i] = total;
    }
    for (int i = 0; i < n; i++) p->cdf[i] /= total;
    if (n > 0) p->cdf[n - 1] = 1.0;
    return 0;
}

void mts_bench_popularity_free(mts_bench_popularity *p)
{
    free(p->cdf);
    p->cdf = NULL;
    p->n = 0;
}

double mts_bench_user_offset_ms(int u, int n, double cycle_ms, double period_ms, bool grid)
{
    double pos = cycle_ms * u / (n > 0 ? n : 1);
    if (grid || n <= 1 || !(period_ms > 0) || period_ms >= cycle_ms) return pos;
    double want = period_ms * fmod((double)u * 0.6180339887498949, 1.0);
    double have = fmod(fmod(-pos, period_ms) + period_ms, period_ms);
    double moved = pos + fmod(have - want + period_ms, period_ms);
    if (moved >= cycle_ms) moved -= period_ms; /* the same phase, within the cycle */
    return moved >= 0 && moved < cycle_ms ? moved : pos;
}

int mts_bench_popularity_pick(const mts_bench_popularity *p, double u)
{
    int lo = 0, hi = p->n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (u < p->cdf[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

uint64_t mts_bench_rand(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * UINT64_C(2685821657736338717);
}

double mts_bench_rand01(uint64_t *state)
{
    return (double)(mts_bench_rand(state) >> 11) * (1.0 / 9007199254740992.0);
}
