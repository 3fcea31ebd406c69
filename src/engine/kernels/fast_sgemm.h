/*
 * The small-M float GEMM on packed constant weights (fast_sgemm.c), used by the oneDNN
 * backend's MatMul/Gemm steps whose source has few rows.
 */
#ifndef MTS_ENGINE_FAST_SGEMM_H
#define MTS_ENGINE_FAST_SGEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/kernels/dnnl_ops.h"

/* Rows (tokens x batch) up to which a MatMul with constant weights runs here: at 16 rows this
 * kernel is about 1.3x oneDNN's, at 128 about 1.03x, at 512 equal (minilm_like, 2 threads).
 * Each 8-row tile streams a thread's share of the weights, so past MTS_SMALL_GEMM_ROWS_SMALL
 * rows only weights of at most MTS_SMALL_GEMM_BIG_ROWS_FLOATS (a 384 x 1536 layer) qualify. */
#define MTS_SMALL_GEMM_ROWS 512
#define MTS_SMALL_GEMM_ROWS_SMALL 128
#define MTS_SMALL_GEMM_BIG_ROWS_FLOATS (640 * 1024)

/* Whether [rows, K] x [K, N] runs here: AVX-512, rows within the limits, N a multiple of 32. */
bool mts_small_gemm_ok(int64_t rows, int64_t K, int64_t N);
/* Whether the fused operations are ones the epilogue applies (Erf GELU, a plain fp32 residual). */
bool mts_small_gemm_posts_ok(const mts_dpost *post, int n_post);
/* The weights ([K, N], or [N, K] when transpose) packed as [N/32][K][32] (aligned_alloc; NULL
 * when out of memory). */
float *mts_small_gemm_pack(const float *w, bool transpose, int64_t K, int64_t N);
/* Products of up to this many rows may run on half weights (mts_small_gemm_pack_half): a text
 * of 12 tokens streams every weight once per product and runs 1.2x as fast on half weights
 * (minilm_like, 2 threads); from about 48 rows the multiply-adds set the time and the
 * conversions make half weights 5-8 % slower than float ones. */
#define MTS_SMALL_GEMM_HALF_ROWS 32
/* The largest finite IEEE half value. */
#define MTS_HALF_MAX 65504.0f
/* The same panels in IEEE half precision (rounded to nearest even), half the bytes: the
 * product then streams half as much from memory and converts in registers (exactly), still
 * multiplying and accumulating in float. NULL with *fits false when a weight is not finite or
 * beyond MTS_HALF_MAX; NULL with *fits true when out of memory. */
uint16_t *mts_small_gemm_pack_half(const float *w, bool transpose, int64_t K, int64_t N, bool *fits);
/* c[rows, N] = a[rows, K] x packed (bp: floats, or halves when half) + bias (may be NULL), then
 * the posts in order (resid: the residual tensors [rows, N] of the MTS_DPOST_ADD ones, in
 * order), on up to `threads` threads. */
void mts_small_gemm_run(const float *a, int64_t rows, int64_t K, int64_t N, const void *bp, bool half,
                        const float *bias, const mts_dpost *post, int n_post, const float *const *resid, float *c,
                        int threads);
/* The same for the n rows of a, c and the residuals listed in map (row indices, any order),
 * leaving the other rows untouched: a padding-free run computes only a batch's valid rows. */
void mts_small_gemm_run_map(const float *a, const int32_t *map, int64_t n, int64_t K, int64_t N, const void *bp,
                            bool half, const float *bias, const mts_dpost *post, int n_post,
                            const float *const *resid, float *c, int threads);

#endif
