/*
 * The engine's integer GEMM for quantized ops: C(i,j) = sum_k (A(i,k) - azp(i)) * (B(k,j) - bzp(j))
 * in exact int32 arithmetic (modulo 2^32), with A and B uint8 or int8, a zero point per row of A
 * and per column of B. The fast kernels of MatMulInteger, QLinearMatMul, ConvInteger and
 * QLinearConv (ref_quant.c) use it; the reference kernels keep their own plain loops.
 *
 * Both operands are packed first: A into rows of uint8 (int8 values shifted by +128) with the
 * inner dimension padded to a multiple of 4, B into panels of 16 columns of int8 (uint8 values
 * shifted by -128) holding 4 consecutive k per column, the layout of the AVX-512 VNNI
 * instruction vpdpbusd (u8 x s8 products summed in fours into s32). The shifts and the zero
 * points are compensated with the row sums of A and the column sums of B, so the inner loop is
 * the plain product. The micro-kernel is chosen at run time: AVX-512 VNNI where the CPU has it,
 * a portable C loop otherwise.
 */
#ifndef MTS_ENGINE_KERNELS_QGEMM_H
#define MTS_ENGINE_KERNELS_QGEMM_H

#include <stdbool.h>
#include <stdint.h>

/* Columns of one packed panel of B. */
#define MTS_QGEMM_NR 16

/* Packed A: M rows of K4 = K rounded up to 4 bytes, and per row the effective zero point and
 * the row sum of the packed values. */
typedef struct mts_qpack_a {
    int64_t M, K, K4;
    uint8_t *data;
    int32_t *azp, *rowsum;
} mts_qpack_a;

/* Packed B: np = ceil(N / 16) panels of K4 x 16 bytes, and per column (padded to np * 16) the
 * effective zero point and colsum - K * zp. */
typedef struct mts_qpack_b {
    int64_t K, N, K4, np;
    int8_t *data;
    int32_t *bzp, *cterm;
} mts_qpack_b;

/* Allocates pa for M x K (MTS_ENOMEM when it cannot); mts_qpack_a_free releases it. */
int mts_qpack_a_alloc(mts_qpack_a *pa, int64_t M, int64_t K);
void mts_qpack_a_free(mts_qpack_a *pa);
int mts_qpack_b_alloc(mts_qpack_b *pb, int64_t K, int64_t N);
void mts_qpack_b_free(mts_qpack_b *pb);

/* Packs A(i,k) = a[i*lda + k] (int8 when is_signed, else uint8) with zero point zp[i] (zp NULL:
 * 0; zp_stride 0: one zero point for every row). */
void mts_qpack_a_fill(mts_qpack_a *pa, const void *a, bool is_signed, int64_t lda, const int32_t *zp,
                      int64_t zp_stride);
/* Packs B(k,j) = b[k*ldb + j] with zero point zp[j * zp_stride] (zp NULL: 0; zp_stride 0: one
 * zero point for every column). */
void mts_qpack_b_fill(mts_qpack_b *pb, const void *b, bool is_signed, int64_t ldb, const int32_t *zp,
                      int64_t zp_stride);

/* C(i,j) for rows [i0, i1) of A and all columns; C(i,j) = c[i*ldc + j]. Runs on the calling
 * thread. */
void mts_qgemm(const mts_qpack_a *pa, const mts_qpack_b *pb, int64_t i0, int64_t i1, int32_t *c, int64_t ldc);

/* Micro-kernels; MTS_QGEMM_AUTO picks the fastest one this CPU runs. */
typedef enum mts_qgemm_kernel { MTS_QGEMM_AUTO, MTS_QGEMM_PORTABLE, MTS_QGEMM_VNNI } mts_qgemm_kernel;
/* For tests: makes later GEMMs use k; false (nothing changed) when the CPU cannot run it. Not
 * synchronized: call it while no GEMM runs. */
bool mts_qgemm_force_kernel(mts_qgemm_kernel k);

#endif
