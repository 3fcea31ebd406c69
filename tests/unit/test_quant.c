/*
 * The quantized product kernels (src/engine/kernels/ref_quant.c, qgemm.c): MatMulInteger,
 * QLinearMatMul, ConvInteger and QLinearConv. The reference kernels are checked against naive
 * products and the spec's requantization written here; the fast kernels (packed integer GEMM) against the reference kernels,
 * bit for bit, with every GEMM micro-kernel this CPU runs (AVX-512 VNNI and the portable loop)
 * at 1 and 2 threads. Random shapes include odd sizes and sizes off the 16-column panels and
 * 6-row blocks; operands are uint8 and int8 in every combination with zero points 0, 128, 255
 * (uint8) or 0, -128, 127 (int8), per tensor and per row / column / output channel; convolutions
 * cover groups (depthwise included), strides, dilations, padding and 1-D to 3-D kernels.
 * DynamicQuantizeLinear feeding ConvInteger with uint8 weights, and the float bilinear Resize
 * that such models quantize (its rounding order), are checked as one case.
 * A few hostile inputs must be refused with an error, never crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <math.h>

#include "engine/kernels/kernel.h"
#include "engine/kernels/qgemm.h"

extern const mts_op mts_quant_fast_matmulinteger, mts_quant_fast_qlinearmatmul, mts_quant_fast_convinteger,
    mts_quant_fast_qlinearconv;

#if defined(__SANITIZE_THREAD__)
#define MAX_THREADS 1
#else
#define MAX_THREADS 2
#endif

static unsigned seed = 777;

static unsigned rnd(void)
{
    seed = seed * 1103515245u + 12345u;
    return seed >> 8;
}

static const mts_op *ref_op(const char *name)
{
    for (const mts_op *op = mts_ref_ops_quant; op->op_type; op++)
        if (!strcmp(op->op_type, name)) return op;
    return NULL;
}

/* A tensor owning its data (freed with tfree). */
static mts_tensor tnew(mts_dtype t, int rank, const int64_t *dims)
{
    mts_tensor x = {.dtype = t, .rank = rank};
    for (int i = 0; i < rank; i++) x.dims[i] = dims[i];
    int64_t nb = mts_tensor_nbytes(&x);
    x.data = calloc(1, nb > 0 ? (size_t)nb : 1);
    return x;
}

static void tfree(mts_tensor *t)
{
    free(t->data);
    t->data = NULL;
}

static void fill_q8(mts_tensor *t)
{
    int64_t n = mts_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) ((uint8_t *)t->data)[i] = (uint8_t)rnd();
}

/* A zero point of type t: n values (n == 0: a scalar), drawn from the edge values and random. */
static mts_tensor make_zp(mts_dtype t, int64_t n)
{
    int64_t d[1] = {n};
    mts_tensor z = tnew(t, n ? 1 : 0, d);
    int64_t cnt = n ? n : 1;
    for (int64_t i = 0; i < cnt; i++) {
        int v;
        switch (rnd() % 4) {
        case 0: v = 0; break;
        case 1: v = t == MTS_DTYPE_UINT8 ? 128 : -128; break;
        case 2: v = t == MTS_DTYPE_UINT8 ? 255 : 127; break;
        default: v = (int)(rnd() & 0xff); break;
        }
        if (t == MTS_DTYPE_UINT8) ((uint8_t *)z.data)[i] = (uint8_t)v;
        else ((int8_t *)z.data)[i] = (int8_t)v;
    }
    return z;
}

static mts_tensor make_scale(int64_t n, float lo, float hi)
{
    int64_t d[1] = {n};
    mts_tensor s = tnew(MTS_DTYPE_FLOAT, n ? 1 : 0, d);
    for (int64_t i = 0; i < (n ? n : 1); i++) ((float *)s.data)[i] = lo + (hi - lo) * (float)(rnd() & 0xffff) / 65536.0f;
    return s;
}

static int32_t zget(const mts_tensor *z, int64_t i)
{
    if (!z) return 0;
    int64_t j = mts_tensor_numel(z) == 1 ? 0 : i;
    return z->dtype == MTS_DTYPE_INT8 ? ((const int8_t *)z->data)[j] : ((const uint8_t *)z->data)[j];
}

static int32_t xget(const mts_tensor *x, int64_t i)
{
    return x->dtype == MTS_DTYPE_INT8 ? ((const int8_t *)x->data)[i] : ((const uint8_t *)x->data)[i];
}

/* The spec's requantization of an int32 result: saturate(rint(acc * scale) + zp). */
static int32_t requant_oracle(int32_t acc, float scale, int32_t zp, bool sgn)
{
    float r = rintf((float)acc * scale) + (float)zp;
    float lo = sgn ? -128.0f : 0.0f, hi = sgn ? 127.0f : 255.0f;
    return (int32_t)(r < lo ? lo : r > hi ? hi : r);
}

/* Runs op on (in, n_in) with node nd; out gets the inferred shape and fresh data. */
static int run_op(const mts_op *op, const mts_node *nd, const mts_tensor *const *in, int n_in, mts_tensor *out,
                  int threads, mts_err *err)
{
    mts_kctx k = {nd, in, n_in, out, 1, err, threads, NULL};
    memset(out, 0, sizeof *out);
    int rc = op->infer(&k);
    if (rc) return rc;
    int64_t nb = mts_tensor_nbytes(out);
    out->data = malloc(nb > 0 ? (size_t)nb : 1);
    memset(out->data, 0xa5, nb > 0 ? (size_t)nb : 1);
    return op->run(&k);
}

/* The fast op at every micro-kernel and thread count must equal `want` exactly. */
static void check_fast(const mts_op *fast, const mts_node *nd, const mts_tensor *const *in, int n_in,
                       const mts_tensor *want, const char *what)
{
    mts_qgemm_kernel ks[2] = {MTS_QGEMM_PORTABLE, MTS_QGEMM_VNNI};
    for (int ki = 0; ki < 2; ki++) {
        if (!mts_qgemm_force_kernel(ks[ki])) continue;
        for (int t = 1; t <= MAX_THREADS; t++) {
            mts_err err = {0};
            mts_tensor got;
            int rc = run_op(fast, nd, in, n_in, &got, t, &err);
            if (rc) fail_msg("%s: fast kernel failed: %s", what, err.msg);
            assert_true(mts_shape_equal(&got, want));
            assert_int_equal(got.dtype, want->dtype);
            int64_t nb = mts_tensor_nbytes(want);
            if (memcmp(got.data, want->data, (size_t)nb)) {
                int64_t n = mts_tensor_numel(want);
                for (int64_t i = 0; i < n; i++) {
                    int32_t a = want->dtype == MTS_DTYPE_INT32 ? ((int32_t *)want->data)[i] : xget(want, i);
                    int32_t b = want->dtype == MTS_DTYPE_INT32 ? ((int32_t *)got.data)[i] : xget(&got, i);
                    if (a != b) fail_msg("%s (kernel %d, %d threads): element %lld: want %d, got %d", what, ki, t,
                                         (long long)i, a, b);
                }
            }
            tfree(&got);
        }
    }
    mts_qgemm_force_kernel(MTS_QGEMM_AUTO);
}

static mts_dtype pick_q8(void)
{
    return rnd() % 2 ? MTS_DTYPE_INT8 : MTS_DTYPE_UINT8;
}

/* ------------------------------------------------------------------------------------------ */

static void test_matmul(void **state)
{
    (void)state;
    static const int64_t sizes[] = {1, 2, 3, 5, 6, 7, 13, 16, 17, 31, 33, 64, 71};
    const size_t ns = sizeof sizes / sizeof *sizes;
    mts_node nd = {.name = "", .op_type = "MatMulInteger", .domain = "", .opset = 10};
    for (int it = 0; it < 60; it++) {
        int64_t M = sizes[rnd() % ns], N = sizes[rnd() % ns], K = sizes[rnd() % ns];
        int64_t B0 = rnd() % 3 == 0 ? 2 : 0; /* batch of A; B shared or batched too */
        bool bbatch = B0 && rnd() % 2;
        mts_dtype ta = pick_q8(), tb = pick_q8();
        int64_t ad[3] = {B0, M, K}, bd[3] = {B0, K, N};
        mts_tensor A = B0 ? tnew(ta, 3, ad) : tnew(ta, 2, ad + 1);
        mts_tensor B = bbatch ? tnew(tb, 3, bd) : tnew(tb, 2, bd + 1);
        fill_q8(&A);
        fill_q8(&B);
        bool rowz = rnd() % 3 == 0, colz = rnd() % 3 == 0;
        mts_tensor az = make_zp(ta, rowz ? M : 0), bz = make_zp(tb, colz ? N : 0);
        bool qlinear = rnd() % 2;
        char what[160];
        snprintf(what, sizeof what, "%s M %lld N %lld K %lld batch %lld/%d %s x %s zp %s/%s",
                 qlinear ? "QLinearMatMul" : "MatMulInteger", (long long)M, (long long)N, (long long)K, (long long)B0,
                 bbatch, mts_dtype_name(ta), mts_dtype_name(tb), rowz ? "row" : "tensor", colz ? "col" : "tensor");
        mts_err err = {0};
        mts_tensor want;
        /* naive oracle */
        int64_t nbt = B0 ? B0 : 1;
        int32_t *oracle = malloc(sizeof(int32_t) * (size_t)(nbt * M * N));
        for (int64_t b = 0; b < nbt; b++)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    int64_t s = 0;
                    for (int64_t p = 0; p < K; p++)
                        s += (int64_t)(xget(&A, (b * M + i) * K + p) - zget(&az, i)) *
                             (xget(&B, ((bbatch ? b : 0) * K + p) * N + j) - zget(&bz, j));
                    oracle[(b * M + i) * N + j] = (int32_t)s;
                }
        if (!qlinear) {
            nd.op_type = "MatMulInteger";
            const mts_tensor *in[4] = {&A, &B, &az, &bz};
            assert_int_equal(run_op(ref_op("MatMulInteger"), &nd, in, 4, &want, 1, &err), 0);
            for (int64_t e = 0; e < nbt * M * N; e++)
                if (((int32_t *)want.data)[e] != oracle[e])
                    fail_msg("%s: reference element %lld = %d, want %d", what, (long long)e, ((int32_t *)want.data)[e],
                             oracle[e]);
            check_fast(&mts_quant_fast_matmulinteger, &nd, in, 4, &want, what);
        } else {
            nd.op_type = "QLinearMatMul";
            mts_tensor as = make_scale(0, 0.01f, 0.05f), bs = make_scale(colz ? N : 0, 0.01f, 0.05f);
            mts_tensor ys = make_scale(0, 0.5f, 2.0f), yz = make_zp(pick_q8(), 0);
            /* scale the output range to the product's magnitude so that results do not all saturate */
            ((float *)ys.data)[0] *= (float)K * 0.05f;
            const mts_tensor *in[8] = {&A, &as, &az, &B, &bs, &bz, &ys, &yz};
            assert_int_equal(run_op(ref_op("QLinearMatMul"), &nd, in, 8, &want, 1, &err), 0);
            bool ysg = yz.dtype == MTS_DTYPE_INT8;
            for (int64_t e = 0; e < nbt * M * N; e++) {
                int64_t j = e % N;
                float sc = ((float *)as.data)[0] * ((float *)bs.data)[colz ? j : 0] / ((float *)ys.data)[0];
                int32_t w = requant_oracle(oracle[e], sc, zget(&yz, 0), ysg);
                if (xget(&want, e) != w)
                    fail_msg("%s: reference element %lld = %d, want %d", what, (long long)e, xget(&want, e), w);
            }
            check_fast(&mts_quant_fast_qlinearmatmul, &nd, in, 8, &want, what);
            tfree(&as), tfree(&bs), tfree(&ys), tfree(&yz);
        }
        free(oracle);
        tfree(&want);
        tfree(&A), tfree(&B), tfree(&az), tfree(&bz);
    }
}

/* ------------------------------------------------------------------------------------------ */

typedef struct cattrs {
    int64_t strides[3], dilations[3], pads[6], group;
    mts_attr a[4];
} cattrs;

static void conv_node(mts_node *nd, cattrs *c, int nsp, const char *op)
{
    memset(nd, 0, sizeof *nd);
    nd->name = "";
    nd->op_type = op;
    nd->domain = "";
    nd->opset = 10;
    const char *names[3] = {"strides", "dilations", "pads"};
    const int64_t *vals[3] = {c->strides, c->dilations, c->pads};
    for (int i = 0; i < 3; i++) {
        memset(&c->a[i], 0, sizeof c->a[i]);
        c->a[i].name = names[i];
        c->a[i].type = MTS_ATTR_INTS;
        c->a[i].ints = vals[i];
        c->a[i].n = i == 2 ? 2 * nsp : nsp;
    }
    memset(&c->a[3], 0, sizeof c->a[3]);
    c->a[3].name = "group";
    c->a[3].type = MTS_ATTR_INT;
    c->a[3].i = c->group;
    nd->attrs = c->a;
    nd->n_attr = 4;
}

static void test_conv(void **state)
{
    (void)state;
    mts_node nd;
    cattrs ca;
    for (int it = 0; it < 60; it++) {
        int nsp = it % 5 == 4 ? (int)(rnd() % 2 ? 1 : 3) : 2;
        int64_t N = 1 + rnd() % 2, G, Cg, Mg;
        switch (rnd() % 3) {
        case 0: G = 1, Cg = 1 + rnd() % 9, Mg = 1 + rnd() % 20; break;
        case 1: G = 2 + rnd() % 2, Cg = 1 + rnd() % 4, Mg = 1 + rnd() % 7; break;
        default: G = 1 + rnd() % 8, Cg = 1, Mg = 1; break; /* depthwise */
        }
        int64_t xd[5] = {N, G * Cg}, wd[5] = {G * Mg, Cg};
        for (int i = 0; i < nsp; i++) {
            int64_t k = nsp == 3 ? 1 + rnd() % 2 : 1 + rnd() % 3;
            wd[2 + i] = k;
            ca.strides[i] = 1 + rnd() % 2;
            ca.dilations[i] = 1 + (rnd() % 4 == 0);
            ca.pads[i] = rnd() % 2;
            ca.pads[nsp + i] = rnd() % 2;
            if (it % 6 == 5) { /* pointwise: the fast kernel packs x directly */
                wd[2 + i] = k = 1;
                ca.strides[i] = 1;
                ca.pads[i] = ca.pads[nsp + i] = 0;
            }
            int64_t ek = (k - 1) * ca.dilations[i] + 1;
            xd[2 + i] = ek + rnd() % (nsp == 3 ? 5 : 19);
        }
        ca.group = G;
        bool qlinear = rnd() % 2;
        conv_node(&nd, &ca, nsp, qlinear ? "QLinearConv" : "ConvInteger");
        mts_dtype tx = pick_q8(), tw = pick_q8();
        mts_tensor X = tnew(tx, 2 + nsp, xd), W = tnew(tw, 2 + nsp, wd);
        fill_q8(&X);
        fill_q8(&W);
        int64_t M = G * Mg;
        bool chz = rnd() % 2;
        mts_tensor xz = make_zp(tx, 0), wz = make_zp(tw, chz ? M : 0);
        char what[200];
        snprintf(what, sizeof what, "%s nsp %d N %lld G %lld Cg %lld Mg %lld %s x %s w zp %s",
                 qlinear ? "QLinearConv" : "ConvInteger", nsp, (long long)N, (long long)G, (long long)Cg, (long long)Mg,
                 mts_dtype_name(tx), mts_dtype_name(tw), chz ? "channel" : "tensor");
        mts_err err = {0};
        mts_tensor want;
        /* naive oracle over the normalized geometry */
        int64_t in3[3] = {1, 1, 1}, k3[3] = {1, 1, 1}, s3[3] = {1, 1, 1}, d3[3] = {1, 1, 1}, p3[3] = {0},
                o3[3] = {1, 1, 1};
        for (int i = 0; i < nsp; i++) {
            int j = 3 - nsp + i;
            in3[j] = xd[2 + i], k3[j] = wd[2 + i], s3[j] = ca.strides[i], d3[j] = ca.dilations[i];
            p3[j] = ca.pads[i];
            o3[j] = (in3[j] + ca.pads[i] + ca.pads[nsp + i] - (k3[j] - 1) * d3[j] - 1) / s3[j] + 1;
        }
        int64_t P = o3[0] * o3[1] * o3[2], IP = in3[0] * in3[1] * in3[2], ks = k3[0] * k3[1] * k3[2];
        int32_t *oracle = malloc(sizeof(int32_t) * (size_t)(N * M * P));
        for (int64_t n = 0; n < N; n++)
            for (int64_t m = 0; m < M; m++)
                for (int64_t p = 0; p < P; p++) {
                    int64_t od = p / (o3[1] * o3[2]), oh = (p / o3[2]) % o3[1], ow = p % o3[2], s = 0;
                    int64_t g = m / Mg;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t kd = 0; kd < k3[0]; kd++)
                            for (int64_t kh = 0; kh < k3[1]; kh++)
                                for (int64_t kw = 0; kw < k3[2]; kw++) {
                                    int64_t id = od * s3[0] - p3[0] + kd * d3[0], ih = oh * s3[1] - p3[1] + kh * d3[1],
                                            iw = ow * s3[2] - p3[2] + kw * d3[2];
                                    if (id < 0 || id >= in3[0] || ih < 0 || ih >= in3[1] || iw < 0 || iw >= in3[2])
                                        continue;
                                    int64_t xi = (n * G * Cg + g * Cg + c) * IP + (id * in3[1] + ih) * in3[2] + iw;
                                    int64_t wi = (m * Cg + c) * ks + (kd * k3[1] + kh) * k3[2] + kw;
                                    s += (int64_t)(xget(&X, xi) - zget(&xz, 0)) * (xget(&W, wi) - zget(&wz, m));
                                }
                    oracle[(n * M + m) * P + p] = (int32_t)s;
                }
        if (!qlinear) {
            const mts_tensor *in[4] = {&X, &W, &xz, &wz};
            int rc = run_op(ref_op("ConvInteger"), &nd, in, 4, &want, 1, &err);
            if (rc) fail_msg("%s: %s", what, err.msg);
            assert_int_equal(mts_tensor_numel(&want), N * M * P);
            for (int64_t e = 0; e < N * M * P; e++)
                if (((int32_t *)want.data)[e] != oracle[e])
                    fail_msg("%s: reference element %lld = %d, want %d", what, (long long)e, ((int32_t *)want.data)[e],
                             oracle[e]);
            check_fast(&mts_quant_fast_convinteger, &nd, in, 4, &want, what);
        } else {
            mts_tensor xs = make_scale(0, 0.01f, 0.05f), ws = make_scale(chz ? M : 0, 0.01f, 0.05f);
            mts_tensor ys = make_scale(0, 0.5f, 2.0f), yz = make_zp(pick_q8(), 0);
            ((float *)ys.data)[0] *= (float)(Cg * wd[2]) * 0.05f;
            int64_t bdim[1] = {M};
            mts_tensor bias = tnew(MTS_DTYPE_INT32, 1, bdim);
            for (int64_t m = 0; m < M; m++) ((int32_t *)bias.data)[m] = (int32_t)(rnd() % 2001) - 1000;
            const mts_tensor *in[9] = {&X, &xs, &xz, &W, &ws, &wz, &ys, &yz, &bias};
            int nin = rnd() % 2 ? 9 : 8;
            int rc = run_op(ref_op("QLinearConv"), &nd, in, nin, &want, 1, &err);
            if (rc) fail_msg("%s: %s", what, err.msg);
            assert_int_equal(mts_tensor_numel(&want), N * M * P);
            for (int64_t e = 0; e < N * M * P; e++) {
                int64_t m = (e / P) % M;
                float sc = ((float *)xs.data)[0] * ((float *)ws.data)[chz ? m : 0] / ((float *)ys.data)[0];
                int32_t acc = oracle[e] + (nin == 9 ? ((int32_t *)bias.data)[m] : 0);
                int32_t w = requant_oracle(acc, sc, zget(&yz, 0), yz.dtype == MTS_DTYPE_INT8);
                if (xget(&want, e) != w)
                    fail_msg("%s: reference element %lld = %d, want %d", what, (long long)e, xget(&want, e), w);
            }
            check_fast(&mts_quant_fast_qlinearconv, &nd, in, nin, &want, what);
            tfree(&xs), tfree(&ws), tfree(&ys), tfree(&yz), tfree(&bias);
        }
        free(oracle);
        tfree(&want);
        tfree(&X), tfree(&W), tfree(&xz), tfree(&wz);
    }
}

/* ------------------------------------------------------------------------------------------ */

static void test_quantize_rounding(void **state)
{
    (void)state;
    mts_node nd = {.name = "", .op_type = "QuantizeLinear", .domain = "", .opset = 13};
    int64_t d[1] = {8};
    mts_tensor x = tnew(MTS_DTYPE_FLOAT, 1, d);
    float xv[8] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 1000.0f, -1000.0f, 0.0f / 0.0f};
    memcpy(x.data, xv, sizeof xv);
    mts_tensor s = make_scale(0, 1.0f, 1.0f), z = make_zp(MTS_DTYPE_INT8, 0);
    ((int8_t *)z.data)[0] = 1;
    const mts_tensor *in[3] = {&x, &s, &z};
    mts_err err = {0};
    mts_tensor y;
    assert_int_equal(run_op(ref_op("QuantizeLinear"), &nd, in, 3, &y, 1, &err), 0);
    assert_int_equal(y.dtype, MTS_DTYPE_INT8);
    const int8_t want[7] = {1, 3, 3, 1, -1, 127, -128}; /* half to even, then + 1, saturated */
    assert_memory_equal(y.data, want, 7);
    tfree(&y);
    tfree(&x), tfree(&s), tfree(&z);
}

/* QuantizeLinear and DequantizeLinear per tensor and per axis on rows long enough for the
 * vectorized loops, against the spec's formulas: halves, large values and NaN included. */
static void test_qdq_random(void **state)
{
    (void)state;
    for (int it = 0; it < 24; it++) {
        bool per_axis = it % 2, sgn = (it / 2) % 2;
        int axis = 1 + (int)(rnd() % 2);
        int64_t xd[3] = {1 + rnd() % 3, 1 + rnd() % 6, 1 + rnd() % 70};
        mts_tensor x = tnew(MTS_DTYPE_FLOAT, 3, xd);
        int64_t n = mts_tensor_numel(&x);
        for (int64_t i = 0; i < n; i++) {
            float v = (float)((int)(rnd() % 2001) - 1000) / 4.0f; /* many exact halves */
            if (rnd() % 50 == 0) v = rnd() % 2 ? 1e30f : -1e30f;
            if (rnd() % 97 == 0) v = 0.0f / 0.0f;
            ((float *)x.data)[i] = v;
        }
        int64_t na = per_axis ? xd[axis] : 0;
        mts_tensor sc = make_scale(na, 0.25f, 2.0f), zp = make_zp(sgn ? MTS_DTYPE_INT8 : MTS_DTYPE_UINT8, na);
        mts_attr ax = {.name = "axis", .type = MTS_ATTR_INT, .i = axis};
        mts_node nd = {.name = "", .op_type = "QuantizeLinear", .domain = "", .opset = 13, .n_attr = 1, .attrs = &ax};
        const mts_tensor *in[3] = {&x, &sc, &zp};
        mts_err err = {0};
        mts_tensor q, dq;
        for (int t = 1; t <= MAX_THREADS; t++) {
            int rc = run_op(ref_op("QuantizeLinear"), &nd, in, 3, &q, t, &err);
            if (rc) fail_msg("QuantizeLinear: %s", err.msg);
            int64_t inner = axis == 1 ? xd[2] : 1;
            for (int64_t i = 0; i < n; i++) {
                int64_t a = per_axis ? (i / inner) % xd[axis] : 0;
                float v = ((float *)x.data)[i] / ((float *)sc.data)[a];
                float r = v != v ? -1e9f : rintf(v) + (float)zget(&zp, a);
                float lo = sgn ? -128.0f : 0.0f, hi = sgn ? 127.0f : 255.0f;
                int32_t w = (int32_t)(r < lo ? lo : r > hi ? hi : r);
                if (xget(&q, i) != w)
                    fail_msg("QuantizeLinear element %lld (x %g, axis %d): got %d, want %d", (long long)i,
                             (double)((float *)x.data)[i], axis, xget(&q, i), w);
            }
            if (t < MAX_THREADS) tfree(&q);
        }
        nd.op_type = "DequantizeLinear";
        const mts_tensor *din[3] = {&q, &sc, &zp};
        assert_int_equal(run_op(ref_op("DequantizeLinear"), &nd, din, 3, &dq, 2, &err), 0);
        int64_t inner = axis == 1 ? xd[2] : 1;
        for (int64_t i = 0; i < n; i++) {
            int64_t a = per_axis ? (i / inner) % xd[axis] : 0;
            float w = (float)(xget(&q, i) - zget(&zp, a)) * ((float *)sc.data)[a];
            assert_true(((float *)dq.data)[i] == w);
        }
        tfree(&q), tfree(&dq), tfree(&x), tfree(&sc), tfree(&zp);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* The dynamically quantized model case: Resize (linear) -> DynamicQuantizeLinear -> ConvInteger
 * with uint8 weights and a weight zero point. DynamicQuantizeLinear turns a 1-ulp difference in
 * its input into a whole quantization step, so the float Resize in front of it must round as
 * ONNX Runtime's bilinear kernel does: coordinates and weights in float, the four taps summed
 * left to right as wx2*wy2*x11 + wx1*wy2*x21 + wx2*wy1*x12 + wx1*wy1*x22. */

static const mts_op *conv_table_op(const char *name)
{
    for (const mts_op *op = mts_ref_ops_conv; op->op_type; op++)
        if (!strcmp(op->op_type, name)) return op;
    return NULL;
}

/* half_pixel source taps of output j for in -> out, as ONNX Runtime computes them */
static void ort_taps(int64_t in, int64_t out, int64_t j, int64_t *i1, int64_t *i2, float *d1, float *d2)
{
    float s = (float)out / (float)in;
    float c = ((float)j + 0.5f) / s - 0.5f;
    c = c < (float)(in - 1) ? c : (float)(in - 1);
    c = c > 0.0f ? c : 0.0f;
    *i1 = (int64_t)c;
    *i2 = *i1 + 1 < in ? *i1 + 1 : in - 1;
    if (*i1 == *i2) {
        *d1 = *d2 = 0.5f;
    } else {
        *d1 = fabsf(c - (float)*i1);
        *d2 = fabsf(c - (float)*i2);
    }
}

static void test_resize_bilinear_order(void **state)
{
    (void)state;
    const mts_op *rs = conv_table_op("Resize");
    assert_non_null(rs);
    mts_attr at[2] = {{.name = "mode", .type = MTS_ATTR_STRING, .s = "linear"},
                      {.name = "coordinate_transformation_mode", .type = MTS_ATTR_STRING, .s = "half_pixel"}};
    mts_node nd = {.name = "", .op_type = "Resize", .domain = "", .opset = 13, .n_attr = 2, .attrs = at};
    const int64_t shapes[3][2] = {{11, 13}, {3, 13}, {5, 17}}; /* up, down x up, identity x up */
    int64_t xd[4] = {1, 3, 5, 6}, sd[1] = {4};
    mts_tensor x = tnew(MTS_DTYPE_FLOAT, 4, xd);
    float *xv = x.data;
    for (int64_t i = 0; i < mts_tensor_numel(&x); i++) xv[i] = (float)(rnd() % 1000000) / 77777.0f;
    for (int t = 0; t < 3; t++) {
        mts_tensor sz = tnew(MTS_DTYPE_INT64, 1, sd);
        int64_t *sv = sz.data;
        sv[0] = 1, sv[1] = 3, sv[2] = shapes[t][0], sv[3] = shapes[t][1];
        const mts_tensor *in[4] = {&x, NULL, NULL, &sz};
        mts_err err = {0};
        mts_tensor y;
        int rc = run_op(rs, &nd, in, 4, &y, 1, &err);
        if (rc) fail_msg("Resize: %s", err.msg);
        int64_t OH = sv[2], OW = sv[3], H = xd[2], W = xd[3];
        for (int64_t c = 0; c < 3; c++)
            for (int64_t oy = 0; oy < OH; oy++)
                for (int64_t ox = 0; ox < OW; ox++) {
                    int64_t y1, y2, x1, x2;
                    float dy1, dy2, dx1, dx2;
                    ort_taps(H, OH, oy, &y1, &y2, &dy1, &dy2);
                    ort_taps(W, OW, ox, &x1, &x2, &dx1, &dx2);
                    const float *p = xv + c * H * W;
                    float want = dx2 * dy2 * p[y1 * W + x1] + dx1 * dy2 * p[y1 * W + x2] +
                                 dx2 * dy1 * p[y2 * W + x1] + dx1 * dy1 * p[y2 * W + x2];
                    if (OH == H) want = dx2 * p[oy * W + x1] + dx1 * p[oy * W + x2];
                    float got = ((float *)y.data)[(c * OH + oy) * OW + ox];
                    if (memcmp(&got, &want, sizeof got))
                        fail_msg("Resize to %lldx%lld at (%lld, %lld, %lld): got %.9g, want %.9g", (long long)OH,
                                 (long long)OW, (long long)c, (long long)oy, (long long)ox, (double)got, (double)want);
                }
        tfree(&y), tfree(&sz);
    }
    tfree(&x);
}

/* DynamicQuantizeLinear against the spec's formulas (range widened to include 0, zero point
 * round-half-even of -min / scale, saturated), then ConvInteger of its uint8 output with
 * uint8 weights and a scalar weight zero point of 143 (the IS-Net layout: 3x3, dilation 2, pad
 * 2) against a naive sum, and the fast kernel against the reference bit for bit. */
static void test_dynq_convinteger(void **state)
{
    (void)state;
    const float ranges[4][2] = {{-1.0f, 3.0f}, {0.5f, 2.0f}, {-7.25f, -0.125f}, {-0.3f, 11.9f}};
    for (int t = 0; t < 4; t++) {
        int64_t xd[4] = {1, 5, 9, 10};
        mts_tensor x = tnew(MTS_DTYPE_FLOAT, 4, xd);
        int64_t n = mts_tensor_numel(&x);
        float *xv = x.data, lo = ranges[t][0], hi = ranges[t][1];
        for (int64_t i = 0; i < n; i++) xv[i] = lo + (hi - lo) * (float)(rnd() % 4096) / 4095.0f;
        xv[0] = lo, xv[1] = hi;
        mts_node dn = {.name = "", .op_type = "DynamicQuantizeLinear", .domain = "", .opset = 11};
        const mts_tensor *din[1] = {&x};
        mts_tensor outs[3];
        memset(outs, 0, sizeof outs);
        mts_err err = {0};
        mts_kctx k = {&dn, din, 1, outs, 3, &err, 1, NULL};
        const mts_op *dq = ref_op("DynamicQuantizeLinear");
        assert_int_equal(dq->infer(&k), 0);
        for (int o = 0; o < 3; o++) {
            int64_t nb = mts_tensor_nbytes(&outs[o]);
            outs[o].data = calloc(1, nb > 0 ? (size_t)nb : 1);
        }
        assert_int_equal(dq->run(&k), 0);
        float mn = lo < 0.0f ? lo : 0.0f, mx = hi > 0.0f ? hi : 0.0f;
        float scale = (mx - mn) / 255.0f, zf = rintf(0.0f - mn / scale);
        int32_t zp = (int32_t)(zf < 0.0f ? 0.0f : zf > 255.0f ? 255.0f : zf);
        assert_true(*(float *)outs[1].data == scale);
        assert_int_equal(*(uint8_t *)outs[2].data, zp);
        for (int64_t i = 0; i < n; i++) {
            float r = rintf(xv[i] / scale) + (float)zp;
            int32_t w = (int32_t)(r < 0.0f ? 0.0f : r > 255.0f ? 255.0f : r);
            if (((uint8_t *)outs[0].data)[i] != w)
                fail_msg("DynamicQuantizeLinear element %lld (x %g): got %d, want %d", (long long)i, (double)xv[i],
                         ((uint8_t *)outs[0].data)[i], w);
        }
        int64_t wd[4] = {7, 5, 3, 3};
        mts_tensor w = tnew(MTS_DTYPE_UINT8, 4, wd), wz = tnew(MTS_DTYPE_UINT8, 0, wd);
        fill_q8(&w);
        *(uint8_t *)wz.data = 143;
        cattrs ca = {.strides = {1, 1}, .dilations = {2, 2}, .pads = {2, 2, 2, 2}, .group = 1};
        mts_node cn;
        conv_node(&cn, &ca, 2, "ConvInteger");
        const mts_tensor *cin[4] = {&outs[0], &w, &outs[2], &wz};
        mts_tensor y;
        int rc = run_op(ref_op("ConvInteger"), &cn, cin, 4, &y, 1, &err);
        if (rc) fail_msg("ConvInteger: %s", err.msg);
        assert_int_equal(y.dims[2], 9);
        assert_int_equal(y.dims[3], 10);
        const uint8_t *q = outs[0].data, *wv = w.data;
        for (int64_t m = 0; m < 7; m++)
            for (int64_t oy = 0; oy < 9; oy++)
                for (int64_t ox = 0; ox < 10; ox++) {
                    int32_t acc = 0;
                    for (int64_t c = 0; c < 5; c++)
                        for (int64_t ky = 0; ky < 3; ky++)
                            for (int64_t kx = 0; kx < 3; kx++) {
                                int64_t iy = oy - 2 + 2 * ky, ix = ox - 2 + 2 * kx;
                                int32_t xq = iy < 0 || iy >= 9 || ix < 0 || ix >= 10 ? zp : q[(c * 9 + iy) * 10 + ix];
                                acc += (xq - zp) * (wv[((m * 5 + c) * 3 + ky) * 3 + kx] - 143);
                            }
                    assert_int_equal(((int32_t *)y.data)[(m * 9 + oy) * 10 + ox], acc);
                }
        check_fast(&mts_quant_fast_convinteger, &cn, cin, 4, &y, "ConvInteger after DynamicQuantizeLinear");
        tfree(&y), tfree(&w), tfree(&wz), tfree(&x);
        for (int o = 0; o < 3; o++) tfree(&outs[o]);
    }
}

static void test_hostile(void **state)
{
    (void)state;
    mts_err err = {0};
    mts_node nd = {.name = "", .op_type = "MatMulInteger", .domain = "", .opset = 10};
    int64_t ad[2] = {3, 4}, bd[2] = {5, 2}, zd[1] = {7};
    mts_tensor A = tnew(MTS_DTYPE_UINT8, 2, ad), B = tnew(MTS_DTYPE_UINT8, 2, bd);
    mts_tensor Z = tnew(MTS_DTYPE_UINT8, 1, zd), F = tnew(MTS_DTYPE_FLOAT, 2, ad);
    const mts_tensor *in1[2] = {&A, &B}; /* K mismatch */
    mts_tensor y;
    assert_true(run_op(ref_op("MatMulInteger"), &nd, in1, 2, &y, 1, &err) < 0);
    bd[0] = 4;
    mts_tensor B2 = tnew(MTS_DTYPE_UINT8, 2, bd);
    const mts_tensor *in2[3] = {&A, &B2, &Z}; /* zero point of 7 for 3 rows */
    assert_true(run_op(ref_op("MatMulInteger"), &nd, in2, 3, &y, 1, &err) < 0);
    const mts_tensor *in3[2] = {&F, &B2}; /* float A */
    assert_int_equal(run_op(ref_op("MatMulInteger"), &nd, in3, 2, &y, 1, &err), MTS_EUNSUPPORTED);
    nd.op_type = "DequantizeLinear";
    mts_tensor s = make_scale(7, 1.0f, 2.0f); /* per-axis scale of the wrong length */
    const mts_tensor *in4[2] = {&A, &s};
    assert_true(run_op(ref_op("DequantizeLinear"), &nd, in4, 2, &y, 1, &err) < 0);
    tfree(&A), tfree(&B), tfree(&Z), tfree(&F), tfree(&B2), tfree(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_conv),
        cmocka_unit_test(test_quantize_rounding),
        cmocka_unit_test(test_qdq_random),
        cmocka_unit_test(test_resize_bilinear_order),
        cmocka_unit_test(test_dynq_convinteger),
        cmocka_unit_test(test_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
