/*
 * The signal and math kernels of ref_signal.c and ref_math2.c, called directly: DFT against a
 * plain O(n^2) transform in double for every length 1-70 and a few larger ones (powers of two
 * take the radix-2 path, the rest Bluestein's), forward and inverse, real and complex input,
 * with dft_length padding and truncation, one-sided output, at 1 and several threads; STFT
 * frames against DFTs of the windowed frames; the window generators against their formulas;
 * Det against known determinants; Mod's two remainder conventions and BitShift's out-of-range
 * shifts.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/kernels/kernel.h"

#if defined(__SANITIZE_THREAD__)
#define MAX_THREADS 1
#else
#define MAX_THREADS 3
#endif

typedef struct nodebuf {
    mts_node n;
    mts_attr a[6];
    int in[5], out[1];
} nodebuf;

static void mknode(nodebuf *b, const char *op, int n_in, int opset)
{
    memset(b, 0, sizeof *b);
    b->n.name = "t";
    b->n.op_type = op;
    b->n.domain = "";
    b->n.opset = opset;
    b->n.n_in = n_in;
    b->n.n_out = 1;
    for (int i = 0; i < 5; i++) b->in[i] = i;
    b->out[0] = 5;
    b->n.in = b->in;
    b->n.out = b->out;
    b->n.attrs = b->a;
}

static void attr_i(nodebuf *b, const char *name, int64_t v)
{
    mts_attr *a = &b->a[b->n.n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = MTS_ATTR_INT;
    a->i = v;
}

static void attr_s(nodebuf *b, const char *name, const char *v)
{
    mts_attr *a = &b->a[b->n.n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = MTS_ATTR_STRING;
    a->s = v;
}

static mts_tensor run_node(const mts_node *n, const mts_tensor **in, int n_in, int threads)
{
    const mts_op *op = mts_op_lookup(n->op_type);
    assert_non_null(op);
    mts_err err = {0};
    mts_tensor out = {0};
    mts_kctx k = {n, in, n_in, &out, 1, &err, threads, NULL};
    if (op->infer(&k)) fail_msg("%s infer: %s", n->op_type, err.msg);
    int64_t nb = mts_tensor_nbytes(&out);
    assert_true(nb >= 0);
    out.data = calloc(1, nb > 0 ? (size_t)nb : 1);
    if (op->run(&k)) fail_msg("%s run: %s", n->op_type, err.msg);
    return out;
}

static unsigned rs = 777;
static float frand(void)
{
    rs = rs * 1103515245u + 12345u;
    return (float)((rs >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* Naive DFT of x (n complex points, zero beyond len) in double. */
static void naive_dft(const double *xr, const double *xi, int64_t len, int64_t n, int sign, double *yr, double *yi)
{
    for (int64_t k = 0; k < n; k++) {
        double sr = 0, si = 0;
        for (int64_t j = 0; j < len && j < n; j++) {
            double a = sign * 2.0 * M_PI * (double)((j * k) % n) / (double)n;
            sr += xr[j] * cos(a) - xi[j] * sin(a);
            si += xr[j] * sin(a) + xi[j] * cos(a);
        }
        yr[k] = sr;
        yi[k] = si;
    }
}

/* One DFT case: x [B=2, len, C=3, comp], transform along axis 1. */
static void dft_case(int64_t len, int64_t dft_len, int comp, bool inverse, bool onesided, int threads)
{
    const int64_t B = 2, C = 3;
    mts_tensor x = {MTS_DTYPE_FLOAT, 4, {B, len, C, comp}, NULL};
    int64_t nx = B * len * C * comp;
    float *xs = malloc((size_t)nx * sizeof(float));
    for (int64_t i = 0; i < nx; i++) xs[i] = frand();
    x.data = xs;
    int64_t lv = dft_len;
    mts_tensor L = {MTS_DTYPE_INT64, 0, {0}, &lv};
    const mts_tensor *in[2] = {&x, &L};
    nodebuf nb;
    mknode(&nb, "DFT", dft_len > 0 ? 2 : 1, 17);
    attr_i(&nb, "inverse", inverse);
    attr_i(&nb, "onesided", onesided);
    mts_tensor y = run_node(&nb.n, in, nb.n.n_in, threads);
    int64_t n = dft_len > 0 ? dft_len : len, lout = onesided ? n / 2 + 1 : n;
    assert_int_equal(y.rank, 4);
    assert_int_equal(y.dims[1], lout);
    assert_int_equal(y.dims[3], 2);
    double *xr = calloc((size_t)len, sizeof(double)), *xi = calloc((size_t)len, sizeof(double));
    double *yr = malloc((size_t)n * sizeof(double)), *yi = malloc((size_t)n * sizeof(double));
    const float *ys = y.data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++) {
            double mag = 0;
            for (int64_t j = 0; j < len; j++) {
                xr[j] = xs[((b * len + j) * C + c) * comp];
                xi[j] = comp == 2 ? xs[((b * len + j) * C + c) * comp + 1] : 0.0;
                mag += fabs(xr[j]) + fabs(xi[j]);
            }
            naive_dft(xr, xi, len, n, inverse ? 1 : -1, yr, yi);
            double scale = inverse ? 1.0 / (double)n : 1.0;
            for (int64_t k = 0; k < lout; k++) {
                const float *p = ys + ((b * lout + k) * C + c) * 2;
                double er = fabs(p[0] - yr[k] * scale), ei = fabs(p[1] - yi[k] * scale);
                if (er > 1e-5 * (mag + 1) || ei > 1e-5 * (mag + 1))
                    fail_msg("DFT len %lld n %lld comp %d inv %d onesided %d: bin %lld got (%g, %g) want (%g, %g)",
                             (long long)len, (long long)n, comp, inverse, onesided, (long long)k, p[0], p[1],
                             yr[k] * scale, yi[k] * scale);
            }
        }
    free(xr), free(xi), free(yr), free(yi), free(xs), free(y.data);
}

static void test_dft(void **state)
{
    (void)state;
    for (int64_t len = 1; len <= 70; len++) {
        dft_case(len, 0, 1, false, false, 1);
        dft_case(len, 0, 2, len % 2 == 0, false, len % 3 == 0 ? MAX_THREADS : 1);
        dft_case(len, 0, 1, false, true, 1);
    }
    static const int64_t big[] = {97, 128, 250, 256, 1000};
    for (int i = 0; i < 5; i++) dft_case(big[i], 0, 2, false, false, MAX_THREADS);
    dft_case(10, 16, 1, false, false, 1); /* padding */
    dft_case(16, 7, 2, true, false, 1);   /* truncation */
    dft_case(12, 30, 1, false, true, MAX_THREADS);
}

static void test_stft(void **state)
{
    (void)state;
    const int64_t len = 50, fl = 12, step = 5;
    float xs[50], ws[12];
    for (int i = 0; i < len; i++) xs[i] = frand();
    for (int i = 0; i < fl; i++) ws[i] = 0.5f + 0.5f * frand();
    mts_tensor x = {MTS_DTYPE_FLOAT, 3, {1, len, 1}, xs}, w = {MTS_DTYPE_FLOAT, 1, {fl}, ws};
    int64_t sv = step;
    mts_tensor s = {MTS_DTYPE_INT64, 0, {0}, &sv};
    const mts_tensor *in[3] = {&x, &s, &w};
    nodebuf nb;
    mknode(&nb, "STFT", 3, 17);
    mts_tensor y = run_node(&nb.n, in, 3, 2);
    int64_t frames = 1 + (len - fl) / step, bins = fl / 2 + 1;
    assert_int_equal(y.dims[1], frames);
    assert_int_equal(y.dims[2], bins);
    double fr[12], fi[12] = {0}, yr[12], yi[12];
    for (int64_t f = 0; f < frames; f++) {
        for (int j = 0; j < fl; j++) fr[j] = (double)xs[f * step + j] * ws[j];
        naive_dft(fr, fi, fl, fl, -1, yr, yi);
        for (int64_t k = 0; k < bins; k++) {
            const float *p = (const float *)y.data + (f * bins + k) * 2;
            assert_true(fabs(p[0] - yr[k]) < 1e-4 && fabs(p[1] - yi[k]) < 1e-4);
        }
    }
    free(y.data);
}

static void test_windows(void **state)
{
    (void)state;
    static const char *const ops[] = {"HannWindow", "HammingWindow", "BlackmanWindow"};
    for (int o = 0; o < 3; o++)
        for (int periodic = 0; periodic <= 1; periodic++) {
            int32_t size = 11;
            mts_tensor sz = {MTS_DTYPE_INT32, 0, {0}, &size};
            const mts_tensor *in[1] = {&sz};
            nodebuf nb;
            mknode(&nb, ops[o], 1, 17);
            attr_i(&nb, "periodic", periodic);
            mts_tensor y = run_node(&nb.n, in, 1, 1);
            assert_int_equal(y.dims[0], 11);
            double N = periodic ? 11 : 10;
            for (int i = 0; i < 11; i++) {
                double t = 2 * M_PI * i / N, want = o == 0   ? 0.5 - 0.5 * cos(t)
                                                  : o == 1 ? 25.0 / 46 - 21.0 / 46 * cos(t)
                                                           : 0.42 - 0.5 * cos(t) + 0.08 * cos(2 * t);
                assert_true(fabs(((float *)y.data)[i] - want) < 1e-6);
            }
            free(y.data);
        }
}

static void test_det(void **state)
{
    (void)state;
    float m[3][9] = {
        {2, 0, 0, 0, 3, 0, 0, 0, 4},  /* 24 */
        {0, 1, 0, 1, 0, 0, 0, 0, 1},  /* a row swap: -1 */
        {1, 2, 3, 4, 5, 6, 7, 8, 9},  /* singular */
    };
    mts_tensor x = {MTS_DTYPE_FLOAT, 3, {3, 3, 3}, m};
    const mts_tensor *in[1] = {&x};
    nodebuf nb;
    mknode(&nb, "Det", 1, 11);
    mts_tensor y = run_node(&nb.n, in, 1, 1);
    assert_int_equal(y.rank, 1);
    const float *d = y.data;
    assert_true(fabs(d[0] - 24) < 1e-5 && fabs(d[1] + 1) < 1e-6 && fabs(d[2]) < 1e-5);
    free(y.data);
}

static void test_mod_bitshift(void **state)
{
    (void)state;
    int32_t a[6] = {-7, 7, -7, 7, 5, INT32_MIN}, b[6] = {3, -3, -3, 3, 0, -1};
    mts_tensor ta = {MTS_DTYPE_INT32, 1, {6}, a}, tb = {MTS_DTYPE_INT32, 1, {6}, b};
    const mts_tensor *in[2] = {&ta, &tb};
    nodebuf nb;
    mknode(&nb, "Mod", 2, 13);
    mts_tensor y = run_node(&nb.n, in, 2, 1);
    static const int32_t py[6] = {2, -2, -1, 1, 0, 0}; /* sign of the divisor; x % 0 and MIN % -1 give 0 */
    assert_memory_equal(y.data, py, sizeof py);
    free(y.data);
    attr_i(&nb, "fmod", 1);
    y = run_node(&nb.n, in, 2, 1);
    static const int32_t c[6] = {-1, 1, -1, 1, 0, 0}; /* sign of the dividend */
    assert_memory_equal(y.data, c, sizeof c);
    free(y.data);

    uint8_t x[4] = {1, 0x80, 0xff, 3}, s[4] = {7, 1, 8, 200};
    mts_tensor tx = {MTS_DTYPE_UINT8, 1, {4}, x}, ts = {MTS_DTYPE_UINT8, 1, {4}, s};
    const mts_tensor *bin[2] = {&tx, &ts};
    mknode(&nb, "BitShift", 2, 11);
    attr_s(&nb, "direction", "LEFT");
    y = run_node(&nb.n, bin, 2, 1);
    static const uint8_t l[4] = {0x80, 0, 0, 0};
    assert_memory_equal(y.data, l, sizeof l);
    free(y.data);
    nb.a[0].s = "RIGHT";
    y = run_node(&nb.n, bin, 2, 1);
    static const uint8_t r[4] = {0, 0x40, 0, 0};
    assert_memory_equal(y.data, r, sizeof r);
    free(y.data);

    /* uint64 keeps values past INT64_MAX unsigned, in Mod and in BitShift. */
    uint64_t ux[3] = {UINT64_MAX, (uint64_t)1 << 63, 10}, us[3] = {10, 3, 0};
    mts_tensor tux = {MTS_DTYPE_UINT64, 1, {3}, ux}, tus = {MTS_DTYPE_UINT64, 1, {3}, us};
    const mts_tensor *uin[2] = {&tux, &tus};
    mknode(&nb, "Mod", 2, 13);
    y = run_node(&nb.n, uin, 2, 1);
    static const uint64_t um[3] = {UINT64_MAX % 10, ((uint64_t)1 << 63) % 3, 0};
    assert_memory_equal(y.data, um, sizeof um);
    free(y.data);
    mknode(&nb, "BitShift", 2, 11);
    attr_s(&nb, "direction", "RIGHT");
    y = run_node(&nb.n, uin, 2, 1);
    static const uint64_t ur[3] = {UINT64_MAX >> 10, (uint64_t)1 << 60, 10};
    assert_memory_equal(y.data, ur, sizeof ur);
    free(y.data);

    /* int16 Mod follows the divisor's sign; double Mod needs fmod=1. */
    int16_t ia[3] = {-7, 7, INT16_MIN}, ib[3] = {3, -3, -1};
    mts_tensor tia = {MTS_DTYPE_INT16, 1, {3}, ia}, tib = {MTS_DTYPE_INT16, 1, {3}, ib};
    const mts_tensor *iin[2] = {&tia, &tib};
    mknode(&nb, "Mod", 2, 13);
    y = run_node(&nb.n, iin, 2, 1);
    static const int16_t im[3] = {2, -2, 0};
    assert_memory_equal(y.data, im, sizeof im);
    free(y.data);
    double da[2] = {-7.5, 7.5}, db[2] = {2, -2};
    mts_tensor tda = {MTS_DTYPE_DOUBLE, 1, {2}, da}, tdb = {MTS_DTYPE_DOUBLE, 1, {2}, db};
    const mts_tensor *din[2] = {&tda, &tdb};
    {
        mts_err err = {0};
        mts_tensor out = {0};
        mts_kctx k = {&nb.n, din, 2, &out, 1, &err, 1, NULL};
        assert_int_equal(mts_op_lookup("Mod")->infer(&k), MTS_EINVAL);
    }
    attr_i(&nb, "fmod", 1);
    y = run_node(&nb.n, din, 2, 1);
    static const double dm[2] = {-1.5, 1.5};
    assert_memory_equal(y.data, dm, sizeof dm);
    free(y.data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dft),
        cmocka_unit_test(test_stft),
        cmocka_unit_test(test_windows),
        cmocka_unit_test(test_det),
        cmocka_unit_test(test_mod_bitshift),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
