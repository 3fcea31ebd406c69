/*
 * int8 convolutions on oneDNN (kernels/dnnl_backend.c, dnnl_conv.c) against the engine's own
 * integer kernels (ref_quant.c, qgemm.c). Small generated models hold one quantized
 * convolution each, in the three forms the planner hands to oneDNN: a QDQ convolution
 * (QuantizeLinear -> DequantizeLinear -> Conv -> QuantizeLinear, fused into QLinearConv by
 * quant_backend.c), a plain QLinearConv node with an int32 bias, and ConvInteger after
 * DynamicQuantizeLinear (its source zero point computed at run time). Shapes: 1x1, 3x3 with
 * stride 2, depthwise, grouped, asymmetric padding, dilation; per-tensor and per-channel
 * weight scales; uint8 and int8 activations with nonzero zero points. Each model runs on the
 * default backend (oneDNN int8), on the default backend with MTS_NO_DNNL_INT8=1 (the packed
 * VNNI integer GEMM) and on the reference backend, at batch 1 and 3 and 1 and 2 threads; the
 * quantized outputs must agree within one quantization step (oneDNN adds the bias and the
 * destination zero point in float, where the own kernels add them as integers: a value that
 * lies within float rounding of a rounding boundary may land one step apart), and
 * int32 outputs exactly. The test also checks that oneDNN did create the int8 primitives.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/kernels/dnnl_ops.h"
#include "test_util.h"

#if defined(__SANITIZE_THREAD__)
#define MAX_THREADS 1
#else
#define MAX_THREADS 2
#endif

/* ------------------------------------------------------------------------------------------ */
/* A minimal protobuf writer for ModelProto                                                     */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void varint(buf *b, uint64_t v)
{
    uint8_t t[10];
    int n = 0;
    do {
        t[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) t[n] |= 0x80;
        n++;
    } while (v);
    put(b, t, (size_t)n);
}

static void key(buf *b, int field, int wt) { varint(b, (uint64_t)field << 3 | (uint64_t)wt); }
static void f_int(buf *b, int field, int64_t v) { key(b, field, 0), varint(b, (uint64_t)v); }
static void f_bytes(buf *b, int field, const void *d, size_t n) { key(b, field, 2), varint(b, n), put(b, d, n); }
static void f_str(buf *b, int field, const char *s) { f_bytes(b, field, s, strlen(s)); }
static void f_msg(buf *b, int field, buf *sub)
{
    f_bytes(b, field, sub->p, sub->n);
    free(sub->p);
    memset(sub, 0, sizeof *sub);
}

/* Attributes: "name=i:3", "name=f:0.5", "name=s:text", "name=ii:1,1,2,2". */
static void node(buf *G, const char *op, const char *ins, const char *outs, const char *attrs)
{
    buf n = {0};
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", ins);
    for (char *t = strtok(tmp, " "); t; t = strtok(NULL, " ")) f_str(&n, 1, strcmp(t, "-") ? t : "");
    snprintf(tmp, sizeof tmp, "%s", outs);
    for (char *t = strtok(tmp, " "); t; t = strtok(NULL, " ")) f_str(&n, 2, t);
    f_str(&n, 4, op);
    if (attrs) {
        snprintf(tmp, sizeof tmp, "%s", attrs);
        char *save = NULL;
        for (char *t = strtok_r(tmp, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
            buf a = {0};
            char *eq = strchr(t, '='), *colon = strchr(t, ':');
            *eq = 0, *colon = 0;
            f_str(&a, 1, t);
            const char *val = colon + 1;
            if (!strcmp(eq + 1, "i")) {
                f_int(&a, 3, atoll(val)), f_int(&a, 20, 2);
            } else if (!strcmp(eq + 1, "f")) {
                float f = strtof(val, NULL);
                key(&a, 2, 5), put(&a, &f, 4), f_int(&a, 20, 1);
            } else if (!strcmp(eq + 1, "s")) {
                f_str(&a, 4, val), f_int(&a, 20, 3);
            } else {
                char *e;
                for (const char *q = val; *q; q = e + (*e == ',')) f_int(&a, 8, strtoll(q, &e, 10));
                f_int(&a, 20, 7);
            }
            f_msg(&n, 5, &a);
        }
    }
    f_msg(G, 1, &n);
}

/* An initializer of ONNX element type dtype (1 float, 2 uint8, 3 int8, 6 int32). */
static void init(buf *G, const char *name, int rank, const int64_t *dims, int dtype, const void *d, size_t n)
{
    buf t = {0};
    for (int i = 0; i < rank; i++) f_int(&t, 1, dims[i]);
    f_int(&t, 2, dtype);
    f_str(&t, 8, name);
    f_bytes(&t, 9, d, n);
    f_msg(G, 5, &t);
}

/* Graph input (field 11) or output (12) of element type dtype; dims < 0: symbolic "N";
 * rank < 0: no shape. */
static void io(buf *G, int field, const char *name, int dtype, int rank, const int64_t *dims)
{
    buf vi = {0}, tp = {0}, tt = {0}, sh = {0};
    for (int i = 0; i < rank; i++) {
        buf d = {0};
        if (dims[i] < 0) f_str(&d, 2, "N");
        else f_int(&d, 1, dims[i]);
        f_msg(&sh, 1, &d);
    }
    f_int(&tt, 1, dtype);
    if (rank >= 0) f_msg(&tt, 2, &sh);
    f_msg(&tp, 1, &tt);
    f_str(&vi, 1, name);
    f_msg(&vi, 2, &tp);
    f_msg(G, field, &vi);
}

static mts_model *load(const buf *G, const char *backend)
{
    buf m = {0}, op = {0}, g = {0};
    f_int(&m, 1, 8);
    put(&g, G->p, G->n);
    f_str(&g, 2, "test");
    f_msg(&m, 7, &g);
    f_str(&op, 1, "");
    f_int(&op, 2, 17);
    f_msg(&m, 8, &op);
    mts_load_opts o = {0};
    o.backend = backend;
    mts_model *model = NULL;
    mts_err err = {0};
    int rc = mts_model_load_buffer(m.p, m.n, "test.onnx", &o, &model, &err);
    free(m.p);
    if (rc) fail_msg("load (%s): %s", backend, err.msg);
    return model;
}

/* ------------------------------------------------------------------------------------------ */

typedef struct qcase {
    const char *name;
    int64_t C, M, group, k, stride, dil, H, W;
    int64_t pads[4];
    bool per_channel, x_s8, bias;
    int32_t xz, yz;
    float xs, ys;
    bool w_u8; /* uint8 weights with zero points near 128 */
} qcase;

static const qcase cases[] = {
    {"1x1", 16, 24, 1, 1, 1, 1, 20, 20, {0, 0, 0, 0}, true, false, true, 7, 128, 1.0f / 240, 0.05f, false},
    {"3x3 stride 2", 8, 16, 1, 3, 2, 1, 23, 21, {1, 1, 1, 1}, false, false, true, 128, 3, 1.0f / 128, 0.08f, false},
    {"depthwise", 16, 16, 16, 3, 1, 1, 24, 24, {1, 1, 1, 1}, true, false, true, 30, 100, 1.0f / 200, 0.01f, false},
    {"grouped, asymmetric pads", 16, 32, 4, 3, 1, 1, 18, 17, {0, 1, 2, 0}, true, false, false, 255, 0, 1.0f / 255,
     0.04f, false},
    {"int8 activations", 8, 16, 1, 3, 1, 1, 20, 20, {1, 1, 1, 1}, true, true, true, -100, 10, 1.0f / 200, 0.05f, false},
    {"dilated 3x3", 12, 20, 1, 3, 1, 2, 19, 19, {2, 2, 2, 2}, false, false, true, 0, 60, 1.0f / 255, 0.06f, false},
    {"uint8 weights", 8, 16, 1, 3, 1, 1, 20, 20, {1, 1, 1, 1}, true, false, true, 9, 128, 1.0f / 250, 0.05f, true},
    {"uint8 weights per tensor", 16, 16, 2, 3, 2, 1, 22, 22, {1, 1, 1, 1}, false, false, true, 0, 40, 1.0f / 255,
     0.05f, true},
};

static unsigned g_seed = 99;

static int rnd(int lo, int hi)
{
    g_seed = g_seed * 1103515245u + 12345u;
    return lo + (int)((g_seed >> 8) % (unsigned)(hi - lo + 1));
}

/* Builds the three forms of case q (QDQ, QLinearConv, ConvInteger) into G; outputs yq, zq, ci. */
static void build(buf *G, const qcase *q)
{
    int64_t Cg = q->C / q->group, kk = q->k * q->k, nw = q->M * Cg * kk;
    int8_t *wq = malloc((size_t)nw), wz[64] = {0};
    uint8_t wzu[64];
    float ws[64], bf[64];
    int32_t bq[64];
    for (int64_t i = 0; i < nw; i++) wq[i] = (int8_t)rnd(-127, 127);
    for (int64_t m = 0; m < q->M; m++) wzu[m] = (uint8_t)(q->per_channel ? rnd(120, 136) : 128);
    if (q->w_u8) /* w - w_zero_point still fits in int8: the oneDNN path takes it */
        for (int64_t i = 0; i < nw; i++) {
            int v = rnd(-120, 119) + wzu[q->per_channel ? i / (Cg * kk) : 0];
            ((uint8_t *)wq)[i] = (uint8_t)v;
        }
    for (int64_t m = 0; m < q->M; m++) {
        ws[m] = q->per_channel ? 0.002f + 0.0007f * (float)rnd(0, 20) : 0.003f;
        bq[m] = rnd(-3000, 3000);
        bf[m] = (float)rnd(-2000, 2000) * 0.0007f;
    }
    uint8_t xz_u = (uint8_t)q->xz, yz_u = (uint8_t)q->yz;
    int8_t xz_s = (int8_t)q->xz, yz_s = (int8_t)q->yz;
    int ad = q->x_s8 ? 3 : 2; /* activation element type */
    int64_t wdims[4] = {q->M, Cg, q->k, q->k}, md[1] = {q->M};
    init(G, "xs", 0, NULL, 1, &q->xs, 4);
    init(G, "ys", 0, NULL, 1, &q->ys, 4);
    init(G, "xz", 0, NULL, ad, q->x_s8 ? (const void *)&xz_s : (const void *)&xz_u, 1);
    init(G, "yz", 0, NULL, ad, q->x_s8 ? (const void *)&yz_s : (const void *)&yz_u, 1);
    int wd = q->w_u8 ? 2 : 3;
    const void *wzp = q->w_u8 ? (const void *)wzu : (const void *)wz;
    init(G, "wq", 4, wdims, wd, wq, (size_t)nw);
    if (q->per_channel) {
        init(G, "ws", 1, md, 1, ws, sizeof(float) * (size_t)q->M);
        init(G, "wz", 1, md, wd, wzp, (size_t)q->M);
    } else {
        init(G, "ws", 0, NULL, 1, ws, 4);
        init(G, "wz", 0, NULL, wd, wzp, 1);
    }
    init(G, "bq", 1, md, 6, bq, sizeof(int32_t) * (size_t)q->M);
    init(G, "bf", 1, md, 1, bf, sizeof(float) * (size_t)q->M);
    char attrs[160];
    snprintf(attrs, sizeof attrs, "strides=ii:%lld,%lld dilations=ii:%lld,%lld pads=ii:%lld,%lld,%lld,%lld group=i:%lld",
             (long long)q->stride, (long long)q->stride, (long long)q->dil, (long long)q->dil, (long long)q->pads[0],
             (long long)q->pads[1], (long long)q->pads[2], (long long)q->pads[3], (long long)q->group);
    node(G, "QuantizeLinear", "x xs xz", "xq", NULL);
    /* QDQ form (float bias) */
    node(G, "DequantizeLinear", "xq xs xz", "xf", NULL);
    node(G, "DequantizeLinear", "wq ws wz", "wf", "axis=i:0");
    node(G, "Conv", q->bias ? "xf wf bf" : "xf wf", "cf", attrs);
    node(G, "QuantizeLinear", "cf ys yz", "yq", NULL);
    /* QLinearConv (int32 bias) */
    node(G, "QLinearConv", q->bias ? "xq xs xz wq ws wz ys yz bq" : "xq xs xz wq ws wz ys yz", "zq", attrs);
    /* ConvInteger after dynamic quantization (uint8 source) */
    node(G, "DynamicQuantizeLinear", "x", "dq ds dz", NULL);
    node(G, "ConvInteger", "dq wq dz wz", "ci", attrs);
    io(G, 12, "yq", ad, -1, NULL);
    io(G, 12, "zq", ad, -1, NULL);
    io(G, 12, "ci", 6, -1, NULL);
    free(wq);
}

/* Largest |a - b| over the elements (uint8 / int8 / int32), and how many differ. */
static int64_t max_diff(const mts_tensor *a, const mts_tensor *b, int64_t *ndiff)
{
    int64_t n = mts_tensor_numel(a), most = 0;
    *ndiff = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t x, y;
        if (a->dtype == MTS_DTYPE_UINT8) x = ((const uint8_t *)a->data)[i], y = ((const uint8_t *)b->data)[i];
        else if (a->dtype == MTS_DTYPE_INT8) x = ((const int8_t *)a->data)[i], y = ((const int8_t *)b->data)[i];
        else x = ((const int32_t *)a->data)[i], y = ((const int32_t *)b->data)[i];
        int64_t d = x > y ? x - y : y - x;
        *ndiff += d != 0;
        if (d > most) most = d;
    }
    return most;
}

static void run_case(const qcase *q)
{
    buf G = {0};
    io(&G, 11, "x", 1, 4, (const int64_t[]){-1, q->C, q->H, q->W});
    build(&G, q);
    mts_model *dn = load(&G, "default"), *own = load(&G, "default"), *ref = load(&G, "reference");
    free(G.p);
    int64_t total_diff = 0, total = 0, before = mts_dconv_q8_created();
    for (int64_t batch = 1; batch <= 3; batch += 2)
        for (int threads = 1; threads <= MAX_THREADS; threads++) {
            mts_tensor *in = test_make_inputs(ref, batch, 5u + (unsigned)batch);
            mts_ctx *c[3];
            mts_model *ms[3] = {dn, own, ref};
            const mts_tensor *o[3][3];
            mts_err err = {0};
            for (int i = 0; i < 3; i++) {
                assert_int_equal(mts_ctx_create(ms[i], i == 2 ? 1 : threads, &c[i], &err), 0);
                /* plans are made at a signature's first run: `own` plans without oneDNN int8 */
                if (i == 1) setenv("MTS_NO_DNNL_INT8", "1", 1);
                for (int rep = 0; rep < 2; rep++)
                    if (mts_ctx_run(c[i], in, 1, o[i], &err)) fail_msg("%s run %d: %s", q->name, i, err.msg);
                unsetenv("MTS_NO_DNNL_INT8");
            }
            /* the three convolutions of the first batch size's plan ran on oneDNN */
            if (batch == 1 && threads == 1 && mts_dconv_q8_created() - before < 3)
                fail_msg("%s: %lld int8 oneDNN primitives, expected 3", q->name,
                         (long long)(mts_dconv_q8_created() - before));
            for (int k = 0; k < 3; k++) {
                int64_t nd;
                /* the own kernels agree with the reference backend bit for bit, but for the
                 * QDQ form, which the reference backend runs unfused, in float */
                assert_true(mts_shape_equal(o[1][k], o[2][k]));
                assert_true(max_diff(o[1][k], o[2][k], &nd) <= (k == 0 ? 1 : 0));
                assert_true(mts_shape_equal(o[0][k], o[1][k]));
                int64_t d = max_diff(o[0][k], o[1][k], &nd);
                if (d > (k == 2 ? 0 : 1))
                    fail_msg("%s output %d (batch %lld, %d threads): oneDNN differs by %lld (%lld elements)", q->name,
                             k, (long long)batch, threads, (long long)d, (long long)nd);
                total_diff += nd;
                total += mts_tensor_numel(o[0][k]);
            }
            for (int i = 0; i < 3; i++) mts_ctx_free(c[i]);
            test_free_inputs(ref, in);
        }
    /* one step apart is the rare exception, not the rule */
    if (total_diff * 1000 > total) fail_msg("%s: %lld of %lld elements one step apart", q->name, (long long)total_diff,
                                            (long long)total);
    print_message("%-26s %lld of %lld elements one step apart\n", q->name, (long long)total_diff, (long long)total);
    mts_model_free(dn);
    mts_model_free(own);
    mts_model_free(ref);
}

static void test_qconv_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* A QDQ convolution `name` from float value `in` (C channels) to M channels, k x k, same
 * padding, per-channel weights, float bias; its quantized output is name_q (scale s, zero
 * point z) and the dequantized one name_f. */
static void qdq_conv(buf *G, const char *name, const char *in, int64_t C, int64_t M, int64_t k, float s, uint8_t z)
{
    char b[256], t[256];
    int64_t nw = M * C * k * k;
    int8_t *w = malloc((size_t)nw), wz[64] = {0};
    float ws[64], bf[64];
    for (int64_t i = 0; i < nw; i++) w[i] = (int8_t)rnd(-127, 127);
    for (int64_t m = 0; m < M; m++) ws[m] = ldexpf(1.0f, -rnd(9, 11)), bf[m] = 0.01f * (float)rnd(-20, 20);
    snprintf(t, sizeof t, "%s_w", name);
    init(G, t, 4, (const int64_t[]){M, C, k, k}, 3, w, (size_t)nw);
    snprintf(t, sizeof t, "%s_ws", name);
    init(G, t, 1, (const int64_t[]){M}, 1, ws, sizeof(float) * (size_t)M);
    snprintf(t, sizeof t, "%s_wz", name);
    init(G, t, 1, (const int64_t[]){M}, 3, wz, (size_t)M);
    snprintf(t, sizeof t, "%s_b", name);
    init(G, t, 1, (const int64_t[]){M}, 1, bf, sizeof(float) * (size_t)M);
    snprintf(t, sizeof t, "%s_ys", name);
    init(G, t, 0, NULL, 1, &s, 4);
    snprintf(t, sizeof t, "%s_yz", name);
    init(G, t, 0, NULL, 2, &z, 1);
    snprintf(b, sizeof b, "%s_w %s_ws %s_wz", name, name, name);
    snprintf(t, sizeof t, "%s_wf", name);
    node(G, "DequantizeLinear", b, t, "axis=i:0");
    snprintf(b, sizeof b, "%s %s_wf %s_b", in, name, name);
    snprintf(t, sizeof t, "%s_c", name);
    char pads[64];
    snprintf(pads, sizeof pads, "pads=ii:%lld,%lld,%lld,%lld", (long long)(k / 2), (long long)(k / 2),
             (long long)(k / 2), (long long)(k / 2));
    node(G, "Conv", b, t, pads);
    snprintf(b, sizeof b, "%s_c %s_ys %s_yz", name, name, name);
    snprintf(t, sizeof t, "%s_q", name);
    node(G, "QuantizeLinear", b, t, NULL);
    snprintf(b, sizeof b, "%s_q %s_ys %s_yz", name, name, name);
    snprintf(t, sizeof t, "%s_f", name);
    node(G, "DequantizeLinear", b, t, NULL);
    free(w);
}

/* Q -> DQ of float value `in` (scale s, zero point z) into name_q / name_f. */
static void qdq(buf *G, const char *name, const char *in, float s, uint8_t z)
{
    char b[256], t[256];
    snprintf(t, sizeof t, "%s_s", name);
    init(G, t, 0, NULL, 1, &s, 4);
    snprintf(t, sizeof t, "%s_z", name);
    init(G, t, 0, NULL, 2, &z, 1);
    snprintf(b, sizeof b, "%s %s_s %s_z", in, name, name);
    snprintf(t, sizeof t, "%s_q", name);
    node(G, "QuantizeLinear", b, t, NULL);
    snprintf(b, sizeof b, "%s_q %s_s %s_z", name, name, name);
    snprintf(t, sizeof t, "%s_f", name);
    node(G, "DequantizeLinear", b, t, NULL);
}

/* A QDQ network in the lip-sync UNet's pattern: convolution, LeakyRelu, Relu, residual Add, nearest
 * 2x upsampling and a channel Concat between int8 convolutions, all fused into integer steps
 * that run channels-last between oneDNN's int8 convolutions (a LeakyRelu and a Relu as their
 * convolutions' post-ops), against the integer kernels
 * (NCHW). The convolutions' scale ratios x_scale * w_scale / y_scale are powers of two and their
 * output zero points even, so that no rounding differs (oneDNN rounds v + zp where the own
 * kernels round v and add zp: ties go apart for odd zero points): the outputs must be equal,
 * which checks the channels-last integer steps exactly. (The reference backend runs the QDQ
 * graph unfused, in float: a few steps apart.) */
static void test_qdq_chain(void **state)
{
    (void)state;
    buf G = {0};
    float sc[4] = {1, 1, 2, 2};
    io(&G, 11, "x", 1, 4, (const int64_t[]){-1, 4, 20, 18});
    init(&G, "up_scales", 1, (const int64_t[]){4}, 1, sc, sizeof sc);
    qdq(&G, "in", "x", 1.0f / 256, 0);
    qdq_conv(&G, "c1", "in_f", 4, 16, 3, 1.0f / 64, 128);
    node(&G, "LeakyRelu", "c1_f", "a1", "alpha=f:0.1");
    qdq(&G, "a1", "a1", 0.012f, 20);
    qdq_conv(&G, "c2", "a1_f", 16, 16, 1, 1.0f / 64, 120);
    node(&G, "Add", "a1_f c2_f", "s1", NULL);
    qdq(&G, "s1", "s1", 0.02f, 60);
    node(&G, "Resize", "s1_f - up_scales", "u1",
         "mode=s:nearest coordinate_transformation_mode=s:asymmetric nearest_mode=s:floor");
    qdq(&G, "u1", "u1", 1.0f / 64, 60);
    qdq_conv(&G, "c3", "u1_f", 16, 8, 3, 1.0f / 32, 128);
    node(&G, "Relu", "c3_f", "r3", NULL);
    qdq(&G, "r3", "r3", 0.02f, 0);
    node(&G, "Concat", "u1_f r3_f", "k1", "axis=i:1");
    qdq(&G, "k1", "k1", 1.0f / 64, 100);
    qdq_conv(&G, "c4", "k1_f", 24, 8, 3, 1.0f / 32, 128);
    io(&G, 12, "c4_q", 2, -1, NULL);
    mts_model *dn = load(&G, "default"), *own = load(&G, "default"), *ref = load(&G, "reference");
    free(G.p);
    int64_t before = mts_dconv_q8_created(), before_act = mts_dconv_q8_act_created(); /* ref: for information */
    for (int64_t batch = 1; batch <= 3; batch += 2) {
        mts_tensor *in = test_make_inputs(ref, batch, 11u + (unsigned)batch);
        mts_model *ms[3] = {dn, own, ref};
        mts_ctx *c[3];
        const mts_tensor *o[3][1];
        mts_err err = {0};
        for (int i = 0; i < 3; i++) {
            assert_int_equal(mts_ctx_create(ms[i], MAX_THREADS, &c[i], &err), 0);
            if (i == 1) setenv("MTS_NO_DNNL_INT8", "1", 1);
            if (mts_ctx_run(c[i], in, 1, o[i], &err)) fail_msg("chain run %d: %s", i, err.msg);
            unsetenv("MTS_NO_DNNL_INT8");
        }
        if (batch == 1 && mts_dconv_q8_created() - before < 4)
            fail_msg("chain: %lld int8 oneDNN primitives, expected 4", (long long)(mts_dconv_q8_created() - before));
        /* c1's LeakyRelu and c3's Relu ran as post-ops */
        if (batch == 1 && mts_dconv_q8_act_created() - before_act < 2) fail_msg("chain: activations not fused");
        int64_t n, d = max_diff(o[0][0], o[1][0], &n), dr = max_diff(o[1][0], o[2][0], &n);
        max_diff(o[0][0], o[1][0], &n);
        if (d > 0) fail_msg("chain (batch %lld): oneDNN path differs from the integer kernels by %lld (%lld of %lld)", (long long)batch,
                            (long long)d, (long long)n, (long long)mts_tensor_numel(o[0][0]));
        if (batch == 1) print_message("chain: integer kernels vs reference backend: up to %lld steps\n", (long long)dr);
        for (int i = 0; i < 3; i++) mts_ctx_free(c[i]);
        test_free_inputs(ref, in);
    }
    mts_model_free(dn);
    mts_model_free(own);
    mts_model_free(ref);
}

/* Float convolutions whose fused activations repeat a oneDNN post-op kind with other
 * parameters (Clip then HardSigmoid: two clips; Relu then LeakyRelu: two relus): this oneDNN
 * build computes the second with the first one's parameters, so such a chain must stop
 * fusing. Against the reference backend. */
static void test_float_postop_kinds(void **state)
{
    (void)state;
    static const char *const acts[][2] = {{"Clip", "HardSigmoid"}, {"Relu", "LeakyRelu"}, {"HardSigmoid", "Clip"}};
    for (int t = 0; t < 3; t++) {
        buf G = {0};
        float w[24 * 16], b[24], lo = 0.1f, hi = 0.3f;
        for (int i = 0; i < 24 * 16; i++) w[i] = (float)rnd(-100, 100) * 0.01f;
        for (int i = 0; i < 24; i++) b[i] = (float)rnd(-100, 100) * 0.002f;
        io(&G, 11, "x", 1, 4, (const int64_t[]){-1, 16, 24, 24});
        init(&G, "w", 4, (const int64_t[]){24, 16, 1, 1}, 1, w, sizeof w);
        init(&G, "b", 1, (const int64_t[]){24}, 1, b, sizeof b);
        init(&G, "lo", 0, NULL, 1, &lo, 4);
        init(&G, "hi", 0, NULL, 1, &hi, 4);
        node(&G, "Conv", "x w b", "c", NULL);
        for (int k = 0; k < 2; k++) {
            const char *op = acts[t][k], *in = k ? "a1" : "c", *out = k ? "y" : "a1";
            char ins[32];
            snprintf(ins, sizeof ins, "%s%s", in, !strcmp(op, "Clip") ? " lo hi" : "");
            node(&G, op, ins, out, !strcmp(op, "LeakyRelu") ? "alpha=f:0.3" : !strcmp(op, "HardSigmoid") ? "alpha=f:0.5" : NULL);
        }
        io(&G, 12, "y", 1, -1, NULL);
        mts_model *dn = load(&G, "default"), *ref = load(&G, "reference");
        free(G.p);
        mts_tensor *in = test_make_inputs(ref, 2, 3u);
        for (int64_t i = 0; i < mts_tensor_numel(&in[0]); i++) ((float *)in[0].data)[i] -= 0.5f;
        mts_ctx *c1, *c2;
        const mts_tensor *o1[1], *o2[1];
        mts_err err = {0};
        assert_int_equal(mts_ctx_create(dn, MAX_THREADS, &c1, &err), 0);
        assert_int_equal(mts_ctx_create(ref, 1, &c2, &err), 0);
        if (mts_ctx_run(c1, in, 1, o1, &err) || mts_ctx_run(c2, in, 1, o2, &err)) fail_msg("%s", err.msg);
        double most = 0;
        for (int64_t i = 0; i < mts_tensor_numel(o2[0]); i++) {
            double d = fabs((double)((const float *)o1[0]->data)[i] - ((const float *)o2[0]->data)[i]);
            if (d > most) most = d;
        }
        if (most > 1e-4) fail_msg("Conv + %s + %s: default backend differs by %g", acts[t][0], acts[t][1], most);
        mts_ctx_free(c1);
        mts_ctx_free(c2);
        test_free_inputs(ref, in);
        mts_model_free(dn);
        mts_model_free(ref);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qconv_cases),
        cmocka_unit_test(test_qdq_chain),
        cmocka_unit_test(test_float_postop_kinds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
