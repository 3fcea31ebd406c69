/*
 * The engine's float GEMM (src/engine/kernels/gemm.c) against a naive double-precision product:
 * mts_sgemm_serial and mts_sgemm_run at 1 and 2 threads, for every micro-kernel this CPU runs
 * (forced with mts_sgemm_force_kernel), over shapes from 1 to a few hundred that are and are not
 * multiples of the register tile and of the cache blocks, K = 0, empty products, A and B read
 * transposed or through padded strides, batches whose entries sit at arbitrary offsets (and
 * whose outputs are placed by c_bs or by c_off), alpha, bias and accumulation. Every output
 * element outside the product (row padding, gaps between batch entries) must stay untouched.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/kernels/gemm.h"
#include "engine/kernels/kernel.h"

/* TSan cannot see into OpenMP teams (libgomp is not instrumented): one thread there. */
#if defined(__SANITIZE_THREAD__)
#define MAX_THREADS 1
#else
#define MAX_THREADS 2
#endif

static unsigned seed = 4242;

static unsigned rnd(void)
{
    seed = seed * 1103515245u + 12345u;
    return seed >> 8;
}

static float frand(void)
{
    return -1.0f + 2.0f * (float)(rnd() & 0xffff) / 65536.0f;
}

static int64_t pick(const int64_t *v, size_t n)
{
    return v[rnd() % n];
}

/* One test case: the product's shape and how its operands are laid out. */
typedef struct gcase {
    int64_t M, N, K, nbatch;
    bool a_trans, b_trans; /* A stored K x M, B stored N x K */
    int64_t a_pad, b_pad;  /* extra elements per stored row */
    int64_t c_pad;         /* ldc = N + c_pad */
    bool c_by_off;         /* outputs placed by c_off (reversed order) instead of c_bs */
    float alpha;
    bool bias, accumulate;
} gcase;

static void describe(const gcase *c, char *buf, size_t len)
{
    snprintf(buf, len, "M=%lld N=%lld K=%lld batch=%lld aT=%d bT=%d pads=%lld/%lld/%lld coff=%d alpha=%g bias=%d acc=%d",
             (long long)c->M, (long long)c->N, (long long)c->K, (long long)c->nbatch, c->a_trans, c->b_trans,
             (long long)c->a_pad, (long long)c->b_pad, (long long)c->c_pad, c->c_by_off, (double)c->alpha, c->bias,
             c->accumulate);
}

/* Runs case c through the three entry points and checks each result. */
static void run_case(const gcase *c)
{
    char what[256];
    describe(c, what, sizeof what);
    const int64_t M = c->M, N = c->N, K = c->K, nb = c->nbatch > 0 ? c->nbatch : 1;

    /* A entry: rows of length a_ld; entries laid out in reverse order with a gap of 3. */
    int64_t a_rows = c->a_trans ? K : M, a_ld = (c->a_trans ? M : K) + c->a_pad;
    int64_t a_ent = a_rows * a_ld + 3;
    int64_t b_rows = c->b_trans ? N : K, b_ld = (c->b_trans ? K : N) + c->b_pad;
    int64_t b_ent = b_rows * b_ld + 5;
    int64_t ldc = N + c->c_pad, c_ent = M * ldc + 2;
    size_t a_n = (size_t)(a_ent * nb + 1), b_n = (size_t)(b_ent * nb + 1), c_n = (size_t)(c_ent * nb + 1);

    float *A = malloc(sizeof(float) * a_n), *B = malloc(sizeof(float) * b_n);
    float *C0 = malloc(sizeof(float) * c_n), *C = malloc(sizeof(float) * c_n);
    float *bias = malloc(sizeof(float) * (size_t)(M > 0 ? M : 1));
    double *ref = malloc(sizeof(double) * c_n), *tol = malloc(sizeof(double) * c_n);
    int64_t *off = malloc(sizeof(int64_t) * 3 * (size_t)nb);
    assert_non_null(A);
    assert_non_null(B);
    assert_non_null(C0);
    assert_non_null(C);
    assert_non_null(bias);
    assert_non_null(ref);
    assert_non_null(tol);
    assert_non_null(off);
    for (size_t i = 0; i < a_n; i++) A[i] = frand();
    for (size_t i = 0; i < b_n; i++) B[i] = frand();
    for (size_t i = 0; i < c_n; i++) C0[i] = frand();
    for (int64_t i = 0; i < M; i++) bias[i] = frand();
    for (int64_t b = 0; b < nb; b++) {
        off[b] = (nb - 1 - b) * a_ent + 1;
        off[nb + b] = (nb - 1 - b) * b_ent;
        off[2 * nb + b] = c->c_by_off ? (nb - 1 - b) * c_ent : b * c_ent;
    }

    mts_sgemm g = {.M = M, .N = N, .K = K,
                   .A = A, .a_rs = c->a_trans ? 1 : a_ld, .a_cs = c->a_trans ? a_ld : 1,
                   .B = B, .b_rs = c->b_trans ? 1 : b_ld, .b_cs = c->b_trans ? b_ld : 1,
                   .C = C, .ldc = ldc, .alpha = c->alpha, .bias = c->bias ? bias : NULL,
                   .accumulate = c->accumulate, .nbatch = c->nbatch, .a_off = off, .b_off = off + nb,
                   .c_off = c->c_by_off ? off + 2 * nb : NULL, .c_bs = c_ent};

    /* Expected result: untouched elements keep C0 exactly (tolerance 0). */
    for (size_t i = 0; i < c_n; i++) ref[i] = C0[i], tol[i] = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        const float *a = A + off[b], *bb = B + off[nb + b];
        int64_t co = off[2 * nb + b];
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0.0, mag = 0.0;
                for (int64_t p = 0; p < K; p++) {
                    double x = (double)a[i * g.a_rs + p * g.a_cs] * (double)bb[p * g.b_rs + j * g.b_cs];
                    s += x;
                    mag += fabs(x);
                }
                size_t at = (size_t)(co + i * ldc + j);
                double base = c->accumulate ? (double)C0[at] : c->bias ? (double)bias[i] : 0.0;
                ref[at] = base + (double)c->alpha * s;
                tol[at] = 1e-6 * (fabs(base) + 1.0) + 2.4e-7 * (double)(K + 4) * fabs((double)c->alpha) * mag;
            }
    }

    float *ws = malloc(sizeof(float) * mts_sgemm_ws_floats(M, N, K));
    assert_non_null(ws);
    for (int mode = 0; mode < 3; mode++) {
        memcpy(C, C0, sizeof(float) * c_n);
        if (mode == 0) mts_sgemm_serial(&g, ws);
        else assert_int_equal(mts_sgemm_run(&g, mode == 1 ? 1 : MAX_THREADS), MTS_OK);
        for (size_t i = 0; i < c_n; i++) {
            double d = fabs((double)C[i] - ref[i]);
            if (!(d <= tol[i])) fail_msg("%s mode %d: element %zu is %.9g, want %.9g (tol %.3g)", what, mode, i,
                                         (double)C[i], ref[i], tol[i]);
        }
    }
    free(ws);
    free(A);
    free(B);
    free(C0);
    free(C);
    free(bias);
    free(ref);
    free(tol);
    free(off);
}

static const int64_t small_dims[] = {1, 2, 3, 5, 6, 7, 8, 9, 12, 15, 16, 17, 31, 32, 33, 47, 64, 65};
static const int64_t mid_dims[] = {1, 6, 13, 31, 96, 119, 120, 121, 130, 200};
#define NDIMS(a) (sizeof(a) / sizeof(a[0]))

/* Random cases on the selected micro-kernel. */
static void random_cases(int count, const int64_t *dims, size_t ndims)
{
    static const float alphas[] = {1.0f, 1.0f, 0.5f, -1.25f};
    for (int t = 0; t < count; t++) {
        gcase c = {.M = pick(dims, ndims), .N = pick(dims, ndims), .K = pick(dims, ndims),
                   .nbatch = (int64_t)(rnd() % 4), .a_trans = rnd() & 1, .b_trans = rnd() & 1,
                   .a_pad = (int64_t)(rnd() % 3), .b_pad = (int64_t)(rnd() % 3), .c_pad = (int64_t)(rnd() % 3),
                   .c_by_off = rnd() & 1, .alpha = alphas[rnd() % 4]};
        unsigned mode = rnd() % 3;
        c.bias = mode == 1;
        c.accumulate = mode == 2;
        run_case(&c);
    }
}

/* Fixed cases: degenerate shapes and the ones that cross cache blocks or split over threads. */
static void fixed_cases(void)
{
    static const gcase cases[] = {
        {.M = 0, .N = 5, .K = 3, .alpha = 1.0f},
        {.M = 4, .N = 0, .K = 3, .alpha = 1.0f},
        {.M = 7, .N = 9, .K = 0, .alpha = 1.0f},
        {.M = 7, .N = 9, .K = 0, .alpha = 1.0f, .bias = true, .c_pad = 2},
        {.M = 7, .N = 9, .K = 0, .alpha = 1.0f, .accumulate = true, .nbatch = 3},
        {.M = 1, .N = 1, .K = 1, .alpha = 2.0f},
        {.M = 1, .N = 300, .K = 257, .alpha = 1.0f, .b_trans = true},
        {.M = 300, .N = 1, .K = 257, .alpha = 1.0f, .a_trans = true},
        {.M = 5, .N = 2100, .K = 3, .alpha = 1.0f, .bias = true},                            /* > NC */
        {.M = 5, .N = 2100, .K = 3, .alpha = 1.0f, .b_trans = true, .accumulate = true},
        {.M = 257, .N = 301, .K = 300, .alpha = 1.0f},                                       /* threads */
        {.M = 257, .N = 301, .K = 300, .alpha = 0.75f, .a_trans = true, .b_trans = true, .bias = true},
        {.M = 250, .N = 70, .K = 270, .alpha = 1.0f, .b_trans = true, .accumulate = true, .c_pad = 3},
        {.M = 130, .N = 190, .K = 200, .nbatch = 3, .alpha = 1.0f, .c_by_off = true},         /* odd batch */
        {.M = 64, .N = 64, .K = 64, .nbatch = 4, .alpha = 0.125f, .b_trans = true, .c_by_off = true},
        {.M = 190, .N = 100, .K = 150, .nbatch = 5, .alpha = 1.0f, .a_trans = true, .bias = true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

static void kernel_cases(mts_sgemm_kernel k, const char *name)
{
    if (!mts_sgemm_force_kernel(k)) {
        print_message("micro-kernel %s: not supported here, skipped\n", name);
        return;
    }
    random_cases(60, small_dims, NDIMS(small_dims));
    random_cases(12, mid_dims, NDIMS(mid_dims));
    fixed_cases();
    assert_true(mts_sgemm_force_kernel(MTS_SGEMM_AUTO));
}

static void test_auto(void **state)
{
    (void)state;
    kernel_cases(MTS_SGEMM_AUTO, "auto");
}

static void test_portable(void **state)
{
    (void)state;
    kernel_cases(MTS_SGEMM_PORTABLE, "portable");
}

static void test_avx2(void **state)
{
    (void)state;
    kernel_cases(MTS_SGEMM_AVX2, "avx2");
}

static void test_avx512(void **state)
{
    (void)state;
    kernel_cases(MTS_SGEMM_AVX512, "avx512");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_portable),
        cmocka_unit_test(test_avx2),
        cmocka_unit_test(test_avx512),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
