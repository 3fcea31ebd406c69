/*
 * The engine's single-precision GEMM (interface in gemm.h), behind every reference kernel that
 * multiplies matrices: Conv and ConvTranspose (im2col / col2im around it) and MatMul / Gemm.
 *
 * Blocking: NC-wide column panels of B, KC-deep slices of the inner dimension and MC-tall row
 * blocks of A. Each A block is packed (times alpha) into MR-row panels and each B panel into
 * NR-column panels, zero-padded, so that the micro-kernel reads both contiguously and computes
 * one MR x NR tile of C in registers. B is packed one NR-wide sliver at a time right before the
 * micro-kernel reads it: into one small buffer that stays in L1 (repacked for each row block)
 * when B's rows are contiguous or there is one row block, otherwise into a panel that the
 * later row blocks reuse. Packing reads A and B through element strides, which is how
 * transposed operands are handled.
 *
 * Micro-kernels, picked at run time from the CPU's features: 6 x 32 for AVX-512F, 6 x 16 with
 * AVX2/FMA intrinsics, and a portable 6 x 8 on 4-float vectors (SSE2 on x86-64, NEON on arm64).
 *
 * mts_sgemm_run cuts a batch of products into work blocks (whole products when the batch divides
 * evenly over the threads, rows and columns otherwise) and runs them on the engine's OpenMP
 * team (mts_parallel); mts_sgemm_serial runs on the calling thread in the caller's workspace.
 */
#include "engine/kernels/gemm.h"

#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"

#if defined(__GNUC__) && defined(__x86_64__)
#define MTS_GEMM_X86 1
#include <immintrin.h>
#endif

#define GEMM_MR_MAX 6
#define GEMM_NR_MAX 32
#define GEMM_KC 256
#define GEMM_MC 120 /* a multiple of every micro-kernel's MR */
#define GEMM_NC 2048
#define GEMM_MAX_THREADS 64
/* Below this much work per thread another thread does not pay: when one product is cut into
 * blocks (each thread packs its own copies of the shared operand), and when whole products of a
 * batch go to the threads (attention heads: nothing is packed twice). */
#define GEMM_FLOPS_PER_THREAD 1.6e7
#define GEMM_BATCH_FLOPS_PER_THREAD 6.5e4

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* ------------------------------------------------------------------------------------------ */
/* Micro-kernels: out[MR][NR] = sum over p < kc of a[p][0..MR) (outer product) b[p][0..NR),     */
/* reading the panels pack_a / pack_b write.                                                    */

typedef void (*gemm_ukernel)(int64_t kc, const float *restrict a, const float *restrict b, float *restrict out);

#if defined(__GNUC__)
/* Portable 6x8 kernel: 12 accumulators of 4 floats. */
typedef float mts_v4f __attribute__((vector_size(16)));
#define V4_ROW(i)                                                                                \
    do {                                                                                         \
        mts_v4f ai = {a[i], a[i], a[i], a[i]};                                                   \
        c##i##0 += ai * b0;                                                                      \
        c##i##1 += ai * b1;                                                                      \
    } while (0)
#define V4_STORE(i)                                                                              \
    do {                                                                                         \
        memcpy(out + 8 * (i), &c##i##0, 16);                                                     \
        memcpy(out + 8 * (i) + 4, &c##i##1, 16);                                                 \
    } while (0)
static void ukernel_6x8(int64_t kc, const float *restrict a, const float *restrict b, float *restrict out)
{
    mts_v4f c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0};
    mts_v4f c30 = {0}, c31 = {0}, c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0};
    for (int64_t p = 0; p < kc; p++, a += 6, b += 8) {
        mts_v4f b0, b1;
        memcpy(&b0, b, sizeof b0);
        memcpy(&b1, b + 4, sizeof b1);
        V4_ROW(0);
        V4_ROW(1);
        V4_ROW(2);
        V4_ROW(3);
        V4_ROW(4);
        V4_ROW(5);
    }
    V4_STORE(0);
    V4_STORE(1);
    V4_STORE(2);
    V4_STORE(3);
    V4_STORE(4);
    V4_STORE(5);
}
#undef V4_ROW
#undef V4_STORE
#else
static void ukernel_6x8(int64_t kc, const float *restrict a, const float *restrict b, float *restrict out)
{
    float c[6][8];
    memset(c, 0, sizeof c);
    for (int64_t p = 0; p < kc; p++, a += 6, b += 8)
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 8; j++) c[i][j] += a[i] * b[j];
    memcpy(out, c, sizeof c);
}
#endif

#ifdef MTS_GEMM_X86
/* AVX2/FMA: 12 accumulators of 8 floats, written with intrinsics because gcc's vectorizer does
 * not keep this tile in registers under a function-level target attribute. */
#define FMA_ROW(i)                                                                               \
    do {                                                                                         \
        __m256 av = _mm256_broadcast_ss(a + (i));                                                \
        c##i##0 = _mm256_fmadd_ps(av, b0, c##i##0);                                              \
        c##i##1 = _mm256_fmadd_ps(av, b1, c##i##1);                                              \
    } while (0)
#define STORE_ROW(i)                                                                             \
    do {                                                                                         \
        _mm256_storeu_ps(out + (i) * 16, c##i##0);                                               \
        _mm256_storeu_ps(out + (i) * 16 + 8, c##i##1);                                           \
    } while (0)

__attribute__((target("avx2,fma"))) static void ukernel_6x16_avx2(int64_t kc, const float *restrict a,
                                                                  const float *restrict b, float *restrict out)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int64_t p = 0; p < kc; p++, a += 6, b += 16) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        FMA_ROW(0);
        FMA_ROW(1);
        FMA_ROW(2);
        FMA_ROW(3);
        FMA_ROW(4);
        FMA_ROW(5);
    }
    STORE_ROW(0);
    STORE_ROW(1);
    STORE_ROW(2);
    STORE_ROW(3);
    STORE_ROW(4);
    STORE_ROW(5);
}
#undef FMA_ROW
#undef STORE_ROW

/* AVX-512F: plain loops that gcc fully unrolls and vectorizes, keeping the 6 x 32 tile in 12
 * zmm registers and emitting vfmadd. */
__attribute__((target("avx512f,fma"))) static void ukernel_6x32_avx512(int64_t kc, const float *restrict a,
                                                                      const float *restrict b, float *restrict out)
{
    float c[6][32];
    memset(c, 0, sizeof c);
    for (int64_t p = 0; p < kc; p++, a += 6, b += 32) {
        _Pragma("GCC unroll 8") for (int i = 0; i < 6; i++) {
            const float ai = a[i];
            _Pragma("GCC unroll 32") for (int j = 0; j < 32; j++) c[i][j] = __builtin_fmaf(ai, b[j], c[i][j]);
        }
    }
    memcpy(out, c, sizeof c);
}
#endif

typedef struct gemm_kernel {
    gemm_ukernel fn;
    int mr, nr;
} gemm_kernel;

/* Whether this CPU and build run micro-kernel k. */
static bool gemm_kernel_ok(mts_sgemm_kernel k)
{
    switch (k) {
    case MTS_SGEMM_AUTO:
    case MTS_SGEMM_PORTABLE: return true;
#ifdef MTS_GEMM_X86
    case MTS_SGEMM_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case MTS_SGEMM_AVX512: return __builtin_cpu_supports("avx512f");
#endif
    default: return false;
    }
}

/* The micro-kernel tests forced (mts_sgemm_force_kernel); MTS_SGEMM_AUTO otherwise. */
static mts_sgemm_kernel gemm_forced = MTS_SGEMM_AUTO;

bool mts_sgemm_force_kernel(mts_sgemm_kernel k)
{
    if (!gemm_kernel_ok(k)) return false;
    gemm_forced = k;
    return true;
}

/* The forced micro-kernel, or else the fastest one this CPU runs. */
static gemm_kernel gemm_pick_kernel(void)
{
    mts_sgemm_kernel k = gemm_forced;
#ifdef MTS_GEMM_X86
    if (k == MTS_SGEMM_AUTO)
        k = gemm_kernel_ok(MTS_SGEMM_AVX512) ? MTS_SGEMM_AVX512
            : gemm_kernel_ok(MTS_SGEMM_AVX2) ? MTS_SGEMM_AVX2
                                             : MTS_SGEMM_PORTABLE;
    if (k == MTS_SGEMM_AVX512) return (gemm_kernel){ukernel_6x32_avx512, 6, 32};
    if (k == MTS_SGEMM_AVX2) return (gemm_kernel){ukernel_6x16_avx2, 6, 16};
#endif
    return (gemm_kernel){ukernel_6x8, 6, 8};
}

int mts_sgemm_mr(void)
{
    return gemm_pick_kernel().mr;
}

/* ------------------------------------------------------------------------------------------ */
/* Packing                                                                                      */

/* Packs rows [0, mc) x columns [0, kc) of A (A(i,p) = A[i*rs + p*cs]) times alpha into panels
 * of mr rows: ap[panel][p][0..mr), zero-padded. Loops run along whichever stride is 1. */
static void pack_a(const float *A, int64_t rs, int64_t cs, int64_t mc, int64_t kc, float alpha, int mr, float *ap)
{
    for (int64_t ir = 0; ir < mc; ir += mr) {
        int h = (int)imin(mc - ir, mr);
        float *dst = ap + ir * kc;
        const float *src = A + ir * rs;
        if (cs == 1) {
            for (int i = 0; i < h; i++)
                for (int64_t p = 0; p < kc; p++) dst[p * mr + i] = alpha * src[i * rs + p];
            for (int i = h; i < mr; i++)
                for (int64_t p = 0; p < kc; p++) dst[p * mr + i] = 0.0f;
        } else {
            for (int64_t p = 0; p < kc; p++, dst += mr) {
                int i = 0;
                for (; i < h; i++) dst[i] = alpha * src[i * rs + p * cs];
                for (; i < mr; i++) dst[i] = 0.0f;
            }
        }
    }
}

/* Packs rows [0, kc) x columns [0, w) of B (B(p,j) = B[p*rs + j*cs]), w <= nr, into one panel
 * bp[p][0..nr), zero-padded. */
static void pack_b(const float *B, int64_t rs, int64_t cs, int64_t kc, int w, int nr, float *bp)
{
    if (cs == 1) {
        for (int64_t p = 0; p < kc; p++, bp += nr) {
            memcpy(bp, B + p * rs, sizeof(float) * (size_t)w);
            for (int j = w; j < nr; j++) bp[j] = 0.0f;
        }
    } else {
        for (int j = 0; j < w; j++)
            for (int64_t p = 0; p < kc; p++) bp[p * nr + j] = B[j * cs + p * rs];
        for (int j = w; j < nr; j++)
            for (int64_t p = 0; p < kc; p++) bp[p * nr + j] = 0.0f;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Blocked product                                                                              */

/* Stores of one row of a finished tile, in blocks of 16 with a scalar tail: gcc -O2 vectorizes
 * only loops whose trip count it knows. */
static inline void row_add(float *restrict c, const float *restrict a, int w)
{
    int j = 0;
    for (; j + 16 <= w; j += 16)
        for (int t = 0; t < 16; t++) c[j + t] += a[j + t];
    for (; j < w; j++) c[j] += a[j];
}

static inline void row_set_bias(float *restrict c, const float *restrict a, float b0, int w)
{
    int j = 0;
    for (; j + 16 <= w; j += 16)
        for (int t = 0; t < 16; t++) c[j + t] = a[j + t] + b0;
    for (; j < w; j++) c[j] = a[j] + b0;
}

/* Floats of the A and B packing buffers for blocks of at most m x n (inner dimension K). */
static size_t ws_a(const gemm_kernel *uk, int64_t m, int64_t K)
{
    int64_t kc = K < 1 ? 1 : imin(K, GEMM_KC);
    return (size_t)(kc * round_up(imin(m, GEMM_MC), uk->mr));
}

static size_t ws_b(const gemm_kernel *uk, int64_t n, int64_t K)
{
    int64_t kc = K < 1 ? 1 : imin(K, GEMM_KC);
    return (size_t)(kc * round_up(imin(n, GEMM_NC), uk->nr));
}

/* Rows [m0, m1) x columns [n0, n1) of batch entry bi; ap and bp hold ws_a(m1 - m0) and
 * ws_b(n1 - n0) floats. */
static void gemm_block(const mts_sgemm *g, const gemm_kernel *uk, int64_t bi, int64_t m0, int64_t m1, int64_t n0,
                       int64_t n1, float *ap, float *bp)
{
    const float *A = g->A + (g->a_off ? g->a_off[bi] : 0);
    const float *B = g->B + (g->b_off ? g->b_off[bi] : 0);
    float *C = g->C + (g->c_off ? g->c_off[bi] : bi * g->c_bs);
    const int mr = uk->mr, nr = uk->nr;
    if (g->K <= 0) {
        if (!g->accumulate)
            for (int64_t i = m0; i < m1; i++) {
                float v = g->bias ? g->bias[i] : 0.0f, *c = C + i * g->ldc;
                for (int64_t j = n0; j < n1; j++) c[j] = v;
            }
        return;
    }
    /* Each B sliver is packed into the same L1-sized buffer right before use, and packed again
     * for every row block, when there is one row block or when B's rows are contiguous (the
     * copy then reads whole cache lines, which costs about what reading a packed panel back
     * from L2 does, without the panel's evictions). A strided B (transposed view) is gathered
     * once into a panel that the later row blocks reuse. */
    bool one_pass = m1 - m0 <= GEMM_MC || g->b_cs == 1;
    for (int64_t jc = n0; jc < n1; jc += GEMM_NC) {
        int64_t nc = imin(n1 - jc, GEMM_NC);
        for (int64_t pc = 0; pc < g->K; pc += GEMM_KC) {
            int64_t kc = imin(g->K - pc, GEMM_KC);
            bool first = pc == 0 && !g->accumulate;
            const float *bsrc = B + pc * g->b_rs + jc * g->b_cs;
            for (int64_t ic = m0; ic < m1; ic += GEMM_MC) {
                int64_t mc = imin(m1 - ic, GEMM_MC);
                pack_a(A + ic * g->a_rs + pc * g->a_cs, g->a_rs, g->a_cs, mc, kc, g->alpha, mr, ap);
                for (int64_t jr = 0; jr < nc; jr += nr) {
                    int w = (int)imin(nc - jr, nr);
                    float *bpan = one_pass ? bp : bp + jr * kc;
                    if (one_pass || ic == m0) pack_b(bsrc + jr * g->b_cs, g->b_rs, g->b_cs, kc, w, nr, bpan);
                    for (int64_t ir = 0; ir < mc; ir += mr) {
                        int h = (int)imin(mc - ir, mr);
                        float acc[GEMM_MR_MAX * GEMM_NR_MAX];
                        uk->fn(kc, ap + ir * kc, bpan, acc);
                        int64_t row = ic + ir;
                        float *c = C + row * g->ldc + jc + jr;
                        for (int i = 0; i < h; i++, c += g->ldc) {
                            const float *a = acc + i * nr;
                            if (!first) row_add(c, a, w);
                            else if (g->bias) row_set_bias(c, a, g->bias[row + i], w);
                            else memcpy(c, a, sizeof(float) * (size_t)w);
                        }
                    }
                }
            }
        }
    }
}

/* The packed B panels start on a cache line, so that the micro-kernel's vector loads of B
 * never straddle two lines. */
#define GEMM_ALIGN 64

static float *align_up(float *p)
{
    return (float *)(((uintptr_t)p + GEMM_ALIGN - 1) & ~(uintptr_t)(GEMM_ALIGN - 1));
}

size_t mts_sgemm_ws_floats(int64_t M, int64_t N, int64_t K)
{
    gemm_kernel uk = gemm_pick_kernel();
    return ws_a(&uk, M, K) + ws_b(&uk, N, K) + GEMM_ALIGN / sizeof(float);
}

void mts_sgemm_serial(const mts_sgemm *g, float *ws)
{
    if (g->M <= 0 || g->N <= 0) return;
    gemm_kernel uk = gemm_pick_kernel();
    int64_t nbatch = g->nbatch > 0 ? g->nbatch : 1;
    float *bp = align_up(ws), *ap = bp + ws_b(&uk, g->N, g->K);
    for (int64_t bi = 0; bi < nbatch; bi++) gemm_block(g, &uk, bi, 0, g->M, 0, g->N, ap, bp);
}

/* ------------------------------------------------------------------------------------------ */
/* Threaded split                                                                               */

typedef struct gemm_plan {
    const mts_sgemm *g;
    gemm_kernel uk;
    int64_t ms, ns;         /* each product is cut into ms x ns work blocks ... */
    int64_t mchunk, nchunk; /* ... of mchunk x nchunk */
} gemm_plan;

/* Runs work blocks [w0, w1) of the plan with private packing buffers. */
static int gemm_range(const gemm_plan *pl, int64_t w0, int64_t w1)
{
    if (w0 >= w1) return MTS_OK;
    const mts_sgemm *g = pl->g;
    size_t asz = ws_a(&pl->uk, pl->mchunk, g->K), bsz = ws_b(&pl->uk, pl->nchunk, g->K);
    float *ap = malloc(sizeof(float) * asz);
    float *bp = aligned_alloc(GEMM_ALIGN, sizeof(float) * (size_t)round_up((int64_t)bsz, GEMM_ALIGN / sizeof(float)));
    if (!ap || !bp) {
        free(ap);
        free(bp);
        return MTS_ENOMEM;
    }
    int64_t per = pl->ms * pl->ns;
    for (int64_t w = w0; w < w1; w++) {
        int64_t bi = w / per, r = w % per;
        int64_t m0 = (r / pl->ns) * pl->mchunk, n0 = (r % pl->ns) * pl->nchunk;
        int64_t m1 = imin(m0 + pl->mchunk, g->M), n1 = imin(n0 + pl->nchunk, g->N);
        if (m0 < m1 && n0 < n1) gemm_block(g, &pl->uk, bi, m0, m1, n0, n1, ap, bp);
    }
    free(ap);
    free(bp);
    return MTS_OK;
}

typedef struct gemm_worker {
    const gemm_plan *pl;
    int64_t w0, w1;
    int rc;
} gemm_worker;

static void gemm_part(void *arg, int ithr, int nthr)
{
    (void)nthr;
    gemm_worker *w = &((gemm_worker *)arg)[ithr];
    w->rc = gemm_range(w->pl, w->w0, w->w1);
}

int mts_sgemm_run(const mts_sgemm *g, int threads)
{
    int64_t nbatch = g->nbatch > 0 ? g->nbatch : 1;
    if (g->M <= 0 || g->N <= 0) return MTS_OK;
    gemm_plan pl = {.g = g, .uk = gemm_pick_kernel(), .ms = 1, .ns = 1};
    const int64_t mr = pl.uk.mr, nr = pl.uk.nr;
    double flops = 2.0 * (double)g->M * (double)g->N * (double)(g->K > 0 ? g->K : 1) * (double)nbatch;
    int64_t nth = threads < 1 ? 1 : threads;
    if (nth > GEMM_MAX_THREADS) nth = GEMM_MAX_THREADS;
    double per_thread = nbatch >= nth ? GEMM_BATCH_FLOPS_PER_THREAD : GEMM_FLOPS_PER_THREAD;
    if ((double)nth * per_thread > flops) nth = (int64_t)(flops / per_thread);
    if (nth < 1) nth = 1;

    /* A batch that does not divide evenly over the threads: cut each product into about
     * 4 * threads / nbatch blocks (at least two tiles on a side), along N first when it is the
     * longer side. */
    if (nth > 1 && nbatch % nth != 0) {
        int64_t want = nbatch < nth ? nth : 4 * nth;
        int64_t per = (want + nbatch - 1) / nbatch;
        int64_t mmax = g->M / (2 * mr), nmax = g->N / (2 * nr);
        if (mmax < 1) mmax = 1;
        if (nmax < 1) nmax = 1;
        if (g->N >= g->M) {
            pl.ns = imin(per, nmax);
            pl.ms = imin((per + pl.ns - 1) / pl.ns, mmax);
        } else {
            pl.ms = imin(per, mmax);
            pl.ns = imin((per + pl.ms - 1) / pl.ms, nmax);
        }
    }
    pl.mchunk = round_up((g->M + pl.ms - 1) / pl.ms, mr);
    pl.ms = (g->M + pl.mchunk - 1) / pl.mchunk;
    pl.nchunk = round_up((g->N + pl.ns - 1) / pl.ns, nr);
    pl.ns = (g->N + pl.nchunk - 1) / pl.nchunk;
    int64_t nwork = nbatch * pl.ms * pl.ns;
    if (nth > nwork) nth = nwork;
    if (nth <= 1) return gemm_range(&pl, 0, nwork);

    gemm_worker wk[GEMM_MAX_THREADS];
    for (int64_t t = 0; t < nth; t++) wk[t] = (gemm_worker){&pl, nwork * t / nth, nwork * (t + 1) / nth, MTS_OK};
    mts_parallel((int)nth, gemm_part, wk);
    for (int64_t t = 0; t < nth; t++)
        if (wk[t].rc) return wk[t].rc;
    return MTS_OK;
}
