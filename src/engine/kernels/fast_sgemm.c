/*
 * A float GEMM for few rows against constant weights packed once ("small-M GEMM"): the
 * MatMul/Gemm steps of the oneDNN backend whose source has at most MTS_SMALL_GEMM_ROWS rows (a
 * BERT encoder at batch 1-32: 16-512 tokens against 384 x 1536 weights) run here instead of in
 * oneDNN, whose kernels reach about a third of the machine's multiply-add rate on the smallest
 * of these shapes (and match this one at 512 rows). A row map lets a padding-free run compute
 * only a batch's valid rows (mts_small_gemm_run_map).
 * The weights are packed into panels of 32 columns, [N/32][K][32] (each panel one contiguous
 * stream), and the product runs in 8-row x 32-column register tiles: per k, two vector loads of
 * the panel and eight broadcasts of A feed sixteen independent multiply-adds; the last one to
 * four rows (batch 1: a single row) use tiles of fewer rows across two or four panels, which
 * keep the multiply-adds independent without computing rows that are dropped. The epilogue
 * applies the step's fused operations on the tile in registers: the bias, then in order Erf
 * GELU (a vectorized erf, relative error about 1.2e-7) and the residual Add. Panels are split
 * over the context's threads. The panels may also hold IEEE half values (precision fp16,
 * mts_small_gemm_pack_half): the tiles then widen each pair of panel loads to floats in
 * registers and run the same float multiply-adds, so a product's result equals the float one on
 * weights rounded to half, bit for bit, with half the bytes to stream. AVX-512 only
 * (mts_small_gemm_ok; the kernels are compiled for it alone): with 8-float vectors the tile
 * would not fit the registers.
 */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/dnnl_ops.h"
#include "engine/kernels/fast_sgemm.h"
#include "engine/kernels/vec16.h"
#include "util/tensor.h"

#if defined(__x86_64__)
#include <immintrin.h>
/* Only ever called on AVX-512 CPUs (mts_small_gemm_ok), so compiled for AVX-512 alone. */
#define SG_TARGET __attribute__((target("avx512f")))
#define SG_INLINE static inline __attribute__((always_inline, target("avx512f")))
#else
#define SG_TARGET
#define SG_INLINE static inline __attribute__((always_inline))
#endif

#if defined(__x86_64__)
/* sixteen IEEE half values to floats (exact) */
SG_INLINE v16f ldh16(const uint16_t *p)
{
    return (v16f)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
#else
static inline v16f ldh16(const uint16_t *p)
{
    v16f v;
    for (int i = 0; i < 16; i++) v[i] = mts_f16_to_f32(p[i]);
    return v;
}
#endif

static inline __attribute__((always_inline)) v16f splat16(float f)
{
    return __builtin_shuffle((v16f){f}, (v16i){0});
}

/* a where m is set (all ones), else b: lane selection with bit operations, which compile to
 * one blend (a per-lane loop does not vectorize well inside these kernels) */
static inline __attribute__((always_inline)) v16f sel16(v16i m, v16f a, v16f b)
{
    return (v16f)((m & (v16i)a) | (~m & (v16i)b));
}

/* exp(x) for x <= 0 (fast.c's polynomial, relative error ~2e-7); below -87.3 a tiny value */
static inline __attribute__((always_inline)) v16f vexp16(v16f x)
{
    x = sel16(x < splat16(-87.3f), splat16(-87.3f), x);
    const v16f magic = splat16(12582912.0f);
    v16f n = (x * splat16(1.44269504f) + magic) - magic;
    v16f r = x - n * splat16(0.693359375f);
    r = r - n * splat16(-2.12194440e-4f);
    v16f p = splat16(1.0f / 720);
    p = p * r + splat16(1.0f / 120);
    p = p * r + splat16(1.0f / 24);
    p = p * r + splat16(1.0f / 6);
    p = p * r + splat16(0.5f);
    p = p * r + splat16(1.0f);
    p = p * r + splat16(1.0f);
    v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
    return p * (v16f)e;
}

/* x * 0.5 * (1 + erf(x / sqrt(2))) with erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2)
 * (Numerical Recipes' Chebyshev fit, fractional error below 1.2e-7 for z >= 0). */
static inline __attribute__((always_inline)) v16f vgelu16(v16f x)
{
    v16f z = x * splat16(0.70710678f);
    v16f az = (v16f)((v16i)z & ((v16i){0} + 0x7fffffff)); /* |z| */
    v16f t = splat16(1.0f) / (splat16(1.0f) + splat16(0.5f) * az);
    v16f p = splat16(0.17087277f);
    p = p * t + splat16(-0.82215223f);
    p = p * t + splat16(1.48851587f);
    p = p * t + splat16(-1.13520398f);
    p = p * t + splat16(0.27886807f);
    p = p * t + splat16(-0.18628806f);
    p = p * t + splat16(0.09678418f);
    p = p * t + splat16(0.37409196f);
    p = p * t + splat16(1.00002368f);
    p = p * t + splat16(-1.26551223f);
    v16f erfc = t * vexp16(p - az * az); /* erfc(|z|) */
    /* 1 + erf(z): 2 - erfc(|z|) for z >= 0, erfc(|z|) below */
    return x * splat16(0.5f) * sel16(z >= splat16(0), splat16(2.0f) - erfc, erfc);
}

bool mts_small_gemm_ok(int64_t rows, int64_t K, int64_t N)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return false;
#else
    return false;
#endif
    return rows >= 1 && rows <= MTS_SMALL_GEMM_ROWS && K >= 1 && N >= 32 && N % 32 == 0 && K <= (1 << 20) &&
           N <= (1 << 20) && (rows <= MTS_SMALL_GEMM_ROWS_SMALL || K * N <= MTS_SMALL_GEMM_BIG_ROWS_FLOATS);
}

/* Element (k, n) of the unpacked weights. */
static inline float sg_w(const float *w, bool transpose, int64_t K, int64_t N, int64_t k, int64_t n)
{
    return transpose ? w[n * K + k] : w[k * N + n];
}

float *mts_small_gemm_pack(const float *w, bool transpose, int64_t K, int64_t N)
{
    float *p = aligned_alloc(64, sizeof(float) * (size_t)(K * N));
    if (!p) return NULL;
    for (int64_t j0 = 0; j0 < N; j0 += 32)
        for (int64_t k = 0; k < K; k++) {
            float *d = p + j0 * K + k * 32;
            for (int64_t c = 0; c < 32; c++) d[c] = sg_w(w, transpose, K, N, k, j0 + c);
        }
    return p;
}

uint16_t *mts_small_gemm_pack_half(const float *w, bool transpose, int64_t K, int64_t N, bool *fits)
{
    *fits = true;
    for (int64_t i = 0; i < K * N; i++)
        if (!(fabsf(w[i]) <= MTS_HALF_MAX)) {
            *fits = false;
            return NULL;
        }
    uint16_t *p = aligned_alloc(64, sizeof(uint16_t) * (size_t)(K * N));
    if (!p) return NULL;
    for (int64_t j0 = 0; j0 < N; j0 += 32)
        for (int64_t k = 0; k < K; k++) {
            uint16_t *d = p + j0 * K + k * 32;
            for (int64_t c = 0; c < 32; c++) d[c] = mts_f32_to_f16(sg_w(w, transpose, K, N, k, j0 + c));
        }
    return p;
}

typedef struct sg_job {
    const float *a, *bias;
    const void *bp; /* packed weights: floats, or IEEE halves when half */
    bool half;
    float *c;
    int64_t rows, K, N;
    const mts_dpost *post;
    int n_post;
    const float *const *resid;
    const int32_t *map; /* row i of the product is row map[i] of a, c and resid (NULL: row i) */
} sg_job;

static inline __attribute__((always_inline)) int64_t sg_row(const sg_job *j, int64_t i)
{
    return j->map ? j->map[i] : i;
}

/* Sixteen weights at element e of packed panels, as floats. */
SG_INLINE v16f sg_ldw(const void *bp, int64_t e, bool half)
{
    return half ? ldh16((const uint16_t *)bp + e) : ld16((const float *)bp + e);
}

/* One register tile: rows [i0, i0 + nr) of A (R rows computed; those past nr repeat the last
 * and are dropped) against the P consecutive panels at bp (floats, or halves when half), which
 * hold output columns from jc; 2 * R * P accumulators (at most 16). Every output is the same
 * sequential multiply-add over k whatever the tile, so a row's result does not depend on how
 * many rows came with it, nor on the weights' form (half weights convert exactly). With `next`
 * (the P panels after these), the first pass also brings those towards L2: short streams (a
 * panel of K = 384 is 48 KB in floats) leave the hardware prefetcher little time to ramp up.
 * R, P and half are constants at every call, so the loops unroll and the accumulators stay in
 * registers. */
SG_INLINE void sg_tile(const sg_job *j, int64_t i0, int nr, int R, int64_t jc, int P, const void *bp,
                       const void *next, bool half)
{
    const int64_t K = j->K, N = j->N;
    const int es = half ? 2 : 4; /* bytes per weight: a k-row of a panel is 64 or 128 */
    const float *ar[8];
    for (int r = 0; r < R; r++) ar[r] = j->a + sg_row(j, i0 + (r < nr ? r : nr - 1)) * K;
    v16f c[16];
    for (int q = 0; q < 2 * R * P; q++) c[q] = splat16(0);
    for (int64_t k = 0; k < K; k++) {
        if (next)
            for (int p = 0; p < P; p++)
                for (int l = 0; l < 32 * es; l += 64)
                    __builtin_prefetch((const char *)next + (p * 32 * K + k * 32) * es + l, 0, 2);
        for (int p = 0; p < P; p++) {
            int64_t e = p * 32 * K + k * 32;
            v16f b0 = sg_ldw(bp, e, half), b1 = sg_ldw(bp, e + 16, half);
            for (int r = 0; r < R; r++) {
                v16f x = splat16(ar[r][k]);
                c[2 * (r * P + p)] += x * b0;
                c[2 * (r * P + p) + 1] += x * b1;
            }
        }
    }
    for (int p = 0; p < P; p++) {
        int64_t jp = jc + 32 * p;
        v16f bl = j->bias ? ld16(j->bias + jp) : splat16(0), bh = j->bias ? ld16(j->bias + jp + 16) : splat16(0);
        for (int r = 0; r < nr; r++) {
            int64_t off = sg_row(j, i0 + r) * N + jp;
            v16f lo = c[2 * (r * P + p)] + bl, hi = c[2 * (r * P + p) + 1] + bh;
            int e = 0;
            for (int q = 0; q < j->n_post; q++) {
                if (j->post[q].kind == MTS_DPOST_GELU) {
                    lo = vgelu16(lo);
                    hi = vgelu16(hi);
                } else { /* MTS_DPOST_ADD (mts_small_gemm_posts_ok) */
                    const float *res = j->resid[e++] + off;
                    lo += ld16(res);
                    hi += ld16(res + 16);
                }
            }
            st16(j->c + off, lo);
            st16(j->c + off + 16, hi);
        }
    }
}

/* The packed panel that holds output columns [jc, jc + 32) (the first of P when P follow). */
SG_INLINE const void *sg_panel(const sg_job *j, int64_t jc, bool half)
{
    return (const char *)j->bp + jc * j->K * (half ? 2 : 4);
}

/* Output columns [j0, j1) (multiples of 32) for every row: 8-row x 1-panel tiles while at
 * least five rows are left; the last few rows (and batch-1 products) in tiles of fewer rows
 * and more panels, so no more than a few rows' work is computed and dropped. */
SG_INLINE void sg_panels(const sg_job *j, int64_t j0, int64_t j1, bool half)
{
    const int64_t rows = j->rows;
    int64_t i0 = 0;
    for (; rows - i0 >= 5; i0 += 8) {
        int nr = rows - i0 < 8 ? (int)(rows - i0) : 8;
        for (int64_t jc = j0; jc < j1; jc += 32)
            sg_tile(j, i0, nr, 8, jc, 1, sg_panel(j, jc, half), i0 == 0 && jc + 32 < j1 ? sg_panel(j, jc + 32, half) : NULL,
                    half);
    }
    int left = (int)(rows - i0);
    if (left <= 0) return;
    for (int64_t jc = j0; jc < j1;) {
        int64_t np = (j1 - jc) / 32;
        bool first = i0 == 0;
        const void *bp = sg_panel(j, jc, half);
        if (left >= 3) {
            if (np >= 2) {
                sg_tile(j, i0, left, 4, jc, 2, bp, first && jc + 64 < j1 ? sg_panel(j, jc + 64, half) : NULL, half);
                jc += 64;
            } else {
                sg_tile(j, i0, left, 4, jc, 1, bp, NULL, half);
                jc += 32;
            }
        } else if (np >= 4) {
            const void *next = first && jc + 128 < j1 ? sg_panel(j, jc + 128, half) : NULL;
            if (left == 2) sg_tile(j, i0, 2, 2, jc, 4, bp, next, half);
            else sg_tile(j, i0, 1, 1, jc, 4, bp, next, half);
            jc += 128;
        } else if (np >= 2) {
            if (left == 2) sg_tile(j, i0, 2, 2, jc, 2, bp, NULL, half);
            else sg_tile(j, i0, 1, 1, jc, 2, bp, NULL, half);
            jc += 64;
        } else {
            if (left == 2) sg_tile(j, i0, 2, 2, jc, 1, bp, NULL, half);
            else sg_tile(j, i0, 1, 1, jc, 1, bp, NULL, half);
            jc += 32;
        }
    }
}

/* The two instances: float and half weights. */
SG_TARGET static void sg_panels_f32(const sg_job *j, int64_t j0, int64_t j1)
{
    sg_panels(j, j0, j1, false);
}

SG_TARGET static void sg_panels_f16(const sg_job *j, int64_t j0, int64_t j1)
{
    sg_panels(j, j0, j1, true);
}

static void sg_part(void *arg, int ithr, int nthr)
{
    const sg_job *j = arg;
    int64_t np = j->N / 32, p0 = np * ithr / nthr, p1 = np * (ithr + 1) / nthr;
    if (p1 <= p0) return;
    if (j->half) sg_panels_f16(j, p0 * 32, p1 * 32);
    else sg_panels_f32(j, p0 * 32, p1 * 32);
}

bool mts_small_gemm_posts_ok(const mts_dpost *post, int n_post)
{
    for (int q = 0; q < n_post; q++)
        if (!(post[q].kind == MTS_DPOST_GELU || (post[q].kind == MTS_DPOST_ADD && !post[q].nhwc && !post[q].bf16)))
            return false;
    return true;
}

static void sg_run(const sg_job *j, int threads)
{
    int64_t np = j->N / 32;
    if (threads > np) threads = (int)np;
    mts_parallel(threads < 1 ? 1 : threads, sg_part, (void *)j);
}

void mts_small_gemm_run(const float *a, int64_t rows, int64_t K, int64_t N, const void *bp, bool half,
                        const float *bias, const mts_dpost *post, int n_post, const float *const *resid, float *c,
                        int threads)
{
    sg_job j = {a, bias, bp, half, c, rows, K, N, post, n_post, resid, NULL};
    sg_run(&j, threads);
}

void mts_small_gemm_run_map(const float *a, const int32_t *map, int64_t n, int64_t K, int64_t N, const void *bp,
                            bool half, const float *bias, const mts_dpost *post, int n_post,
                            const float *const *resid, float *c, int threads)
{
    if (n <= 0) return;
    sg_job j = {a, bias, bp, half, c, n, K, N, post, n_post, resid, map};
    sg_run(&j, threads);
}
