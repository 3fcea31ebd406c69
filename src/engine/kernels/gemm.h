/*
 * The engine's single-precision GEMM: C = bias + alpha * A * B, or C += alpha * A * B, over a
 * batch of products, with A and B read through element strides (so transposed views cost
 * nothing). One implementation serves every reference kernel that needs a matrix product: the
 * im2col Conv and ConvTranspose (ref_conv.c) and MatMul / Gemm (ref_shape.c).
 *
 * Two entry points: mts_sgemm_run splits the products over threads itself (MatMul, Gemm);
 * mts_sgemm_serial runs on the calling thread with a workspace the caller provides, for kernels
 * that already split their work into units and call the GEMM from each (Conv, ConvTranspose).
 */
#ifndef MTS_ENGINE_KERNELS_GEMM_H
#define MTS_ENGINE_KERNELS_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct mts_sgemm {
    int64_t M, N, K;
    const float *A;         /* A(i,p) = A[i*a_rs + p*a_cs] */
    int64_t a_rs, a_cs;
    const float *B;         /* B(p,j) = B[p*b_rs + j*b_cs] */
    int64_t b_rs, b_cs;
    float *C;               /* C(i,j) = C[i*ldc + j] */
    int64_t ldc;
    float alpha;
    const float *bias;      /* NULL, or M values: C(i,j) = bias[i] + alpha*(A*B)(i,j) */
    bool accumulate;        /* C += alpha*A*B (bias ignored) */
    /* Batch: nbatch products (0 counts as 1); product b reads A + a_off[b], B + b_off[b] (NULL:
     * offset 0) and writes C + c_off[b] (NULL: C + b*c_bs). */
    int64_t nbatch;
    const int64_t *a_off, *b_off, *c_off;
    int64_t c_bs;
} mts_sgemm;

/* Rows of the register tile the selected micro-kernel computes: callers that cut M into pieces
 * of their own use multiples of it so that no piece wastes a partial tile. */
int mts_sgemm_mr(void);

/* Micro-kernels. MTS_SGEMM_AUTO (the default) picks the fastest one the CPU runs. */
typedef enum mts_sgemm_kernel {
    MTS_SGEMM_AUTO,
    MTS_SGEMM_PORTABLE, /* 6 x 8 on 4-float vectors */
    MTS_SGEMM_AVX2,     /* 6 x 16, AVX2 + FMA */
    MTS_SGEMM_AVX512,   /* 6 x 32, AVX-512F */
} mts_sgemm_kernel;

/* For tests: makes later GEMMs use micro-kernel k. Returns false (and changes nothing) when this
 * CPU or build cannot run it. Not synchronized: call it while no GEMM runs. */
bool mts_sgemm_force_kernel(mts_sgemm_kernel k);

/* Floats of workspace mts_sgemm_serial needs for a product of M x N with inner dimension K. */
size_t mts_sgemm_ws_floats(int64_t M, int64_t N, int64_t K);

/* Runs g (every batch entry) on the calling thread; ws holds mts_sgemm_ws_floats(M, N, K). */
void mts_sgemm_serial(const mts_sgemm *g, float *ws);

/* Runs g on up to `threads` threads of the engine's team (fewer for small products).
 * MTS_ENOMEM when a workspace cannot be allocated. */
int mts_sgemm_run(const mts_sgemm *g, int threads);

#endif
