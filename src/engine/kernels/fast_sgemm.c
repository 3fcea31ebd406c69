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
 * over the context's threads. AVX-512 only (mts_small_gemm_ok): with 8-float vectors the tile
 * would not fit the registers.
 */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/dnnl_ops.h"
#include "engine/kernels/fast_sgemm.h"

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define SG_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define SG_CLONES
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) v16f ld16(const float *p)
{
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void st16(float *p, v16f v)
{
    memcpy(p, &v, sizeof v);
}

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

float *mts_small_gemm_pack(const float *w, bool transpose, int64_t K, int64_t N)
{
    float *p = aligned_alloc(64, sizeof(float) * (size_t)(K * N));
    if (!p) return NULL;
    for (int64_t j0 = 0; j0 < N; j0 += 32)
        for (int64_t k = 0; k < K; k++) {
            float *d = p + j0 * K + k * 32;
            for (int64_t c = 0; c < 32; c++) d[c] = transpose ? w[(j0 + c) * K + k] : w[k * N + j0 + c];
        }
    return p;
}

typedef struct sg_job {
    const float *a, *bp, *bias;
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

/* One register tile: rows [i0, i0 + nr) of A (R rows computed; those past nr repeat the last
 * and are dropped) against P panels from column jc, 2 * R * P accumulators (at most 16). Every
 * output is the same sequential multiply-add over k whatever the tile, so a row's result does
 * not depend on how many rows came with it. With `next`, the first pass also brings the next
 * P panels towards L2: short streams (a panel of K = 384 is 48 KB) leave the hardware
 * prefetcher little time to ramp up. R and P are constants at every call, so the loops unroll
 * and the accumulators stay in registers. */
static inline __attribute__((always_inline)) void sg_tile(const sg_job *j, int64_t i0, int nr, int R, int64_t jc, int P,
                                                          const float *next)
{
    const int64_t K = j->K, N = j->N;
    const float *ar[8];
    for (int r = 0; r < R; r++) ar[r] = j->a + sg_row(j, i0 + (r < nr ? r : nr - 1)) * K;
    const float *bp = j->bp + jc * K;
    v16f c[16];
    for (int q = 0; q < 2 * R * P; q++) c[q] = splat16(0);
    for (int64_t k = 0; k < K; k++) {
        if (next)
            for (int p = 0; p < P; p++) {
                __builtin_prefetch(next + p * 32 * K + k * 32, 0, 2);
                __builtin_prefetch(next + p * 32 * K + k * 32 + 16, 0, 2);
            }
        for (int p = 0; p < P; p++) {
            v16f b0 = ld16(bp + p * 32 * K + k * 32), b1 = ld16(bp + p * 32 * K + k * 32 + 16);
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

/* Output columns [j0, j1) (multiples of 32) for every row: 8-row x 1-panel tiles while at
 * least five rows are left; the last few rows (and batch-1 products) in tiles of fewer rows
 * and more panels, so no more than a few rows' work is computed and dropped. */
SG_CLONES static void sg_panels(const sg_job *j, int64_t j0, int64_t j1)
{
    const int64_t K = j->K, rows = j->rows;
    int64_t i0 = 0;
    for (; rows - i0 >= 5; i0 += 8) {
        int nr = rows - i0 < 8 ? (int)(rows - i0) : 8;
        for (int64_t jc = j0; jc < j1; jc += 32)
            sg_tile(j, i0, nr, 8, jc, 1, i0 == 0 && jc + 32 < j1 ? j->bp + (jc + 32) * K : NULL);
    }
    int left = (int)(rows - i0);
    if (left <= 0) return;
    for (int64_t jc = j0; jc < j1;) {
        int64_t np = (j1 - jc) / 32;
        bool first = i0 == 0;
        if (left >= 3) {
            if (np >= 2) {
                sg_tile(j, i0, left, 4, jc, 2, first && jc + 64 < j1 ? j->bp + (jc + 64) * K : NULL);
                jc += 64;
            } else {
                sg_tile(j, i0, left, 4, jc, 1, NULL);
                jc += 32;
            }
        } else if (np >= 4) {
            const float *next = first && jc + 128 < j1 ? j->bp + (jc + 128) * K : NULL;
            if (left == 2) sg_tile(j, i0, 2, 2, jc, 4, next);
            else sg_tile(j, i0, 1, 1, jc, 4, next);
            jc += 128;
        } else if (np >= 2) {
            if (left == 2) sg_tile(j, i0, 2, 2, jc, 2, NULL);
            else sg_tile(j, i0, 1, 1, jc, 2, NULL);
            jc += 64;
        } else {
            if (left == 2) sg_tile(j, i0, 2, 2, jc, 1, NULL);
            else sg_tile(j, i0, 1, 1, jc, 1, NULL);
            jc += 32;
        }
    }
}

static void sg_part(void *arg, int ithr, int nthr)
{
    const sg_job *j = arg;
    int64_t np = j->N / 32, p0 = np * ithr / nthr, p1 = np * (ithr + 1) / nthr;
    if (p1 > p0) sg_panels(j, p0 * 32, p1 * 32);
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

void mts_small_gemm_run(const float *a, int64_t rows, int64_t K, int64_t N, const float *bp, const float *bias,
                        const mts_dpost *post, int n_post, const float *const *resid, float *c, int threads)
{
    sg_job j = {a, bp, bias, c, rows, K, N, post, n_post, resid, NULL};
    sg_run(&j, threads);
}

void mts_small_gemm_run_map(const float *a, const int32_t *map, int64_t n, int64_t K, int64_t N, const float *bp,
                            const float *bias, const mts_dpost *post, int n_post, const float *const *resid, float *c,
                            int threads)
{
    if (n <= 0) return;
    sg_job j = {a, bp, bias, c, n, K, N, post, n_post, resid, map};
    sg_run(&j, threads);
}
