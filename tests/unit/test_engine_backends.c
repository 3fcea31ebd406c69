/*
 * The default backend (oneDNN + graph optimizer + channels-last layout) against the reference
 * backend. Small ONNX graphs are written here with a minimal protobuf writer so that every
 * rewrite is exercised: Conv + BatchNormalization folding, activation post-ops (Relu, Clip,
 * HardSwish, HardSigmoid, Sigmoid, Tanh, LeakyRelu, GELU), residual Add, reductions over channels and
 * over pixels (CBAM-style attention), pooling, depthwise / dilated / strided
 * / asymmetric-pad / SAME_UPPER convolutions, ConvTranspose (groups, output_padding), 1-D and
 * 3-D convolutions, MatMul/Gemm with constant weights, Resize and Concat on channels-last data, a channel-attention Mul with an
 * [N,C,1,1] operand, Identity removal, and graph outputs in the middle of a fused chain. Every
 * graph runs on both backends at 1 and 2 threads and batch 1 and 3; outputs must agree within
 * a relative L2 error of 1e-5 (and where a graph names a fused op type, the default backend's
 * plans must hold that many steps of it). The reference models in models/out (when generated) are compared
 * the same way at batch 1.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "engine/kernels/bfconv.h"
#include "engine/kernels/dnnl_ops.h"
#include "test_util.h"

/* Under ThreadSanitizer, OpenMP teams (libgomp is not instrumented) give false reports: one
 * thread there. ASan runs the teams (see __asan_default_options in src/util/crash.c). */
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
    if (!n) return; /* an empty field (a scalar's shape) may come with no buffer at all */
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
static void f_float(buf *b, int field, float f) { key(b, field, 5), put(b, &f, 4); }

typedef struct graph {
    buf g;
    unsigned seed;
    int opset;              /* 0: 17 */
    const char *expect_op;  /* compare_backends: the default backend's plans must have */
    int expect_steps;       /* this many steps of this (fused) op type */
} graph;

/* Attributes: "name=i:3", "name=f:0.5", "name=s:text", "name=ii:1,1,2,2". */
static void node(graph *G, const char *op, const char *ins, const char *outs, const char *attrs)
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
            const char *kind = eq + 1, *val = colon + 1;
            if (!strcmp(kind, "i")) f_int(&a, 3, atoll(val)), f_int(&a, 20, 2);
            else if (!strcmp(kind, "f")) f_float(&a, 2, strtof(val, NULL)), f_int(&a, 20, 1);
            else if (!strcmp(kind, "s")) f_str(&a, 4, val), f_int(&a, 20, 3);
            else {
                char *e;
                for (const char *q = val; *q; q = e + (*e == ',')) f_int(&a, 8, strtoll(q, &e, 10));
                f_int(&a, 20, 7);
            }
            f_msg(&n, 5, &a);
        }
    }
    f_msg(&G->g, 1, &n);
}

static void tensor_msg(buf *t, const char *name, int rank, const int64_t *dims, int dtype, const void *raw, size_t n)
{
    for (int i = 0; i < rank; i++) f_int(t, 1, dims[i]);
    f_int(t, 2, dtype);
    f_str(t, 8, name);
    f_bytes(t, 9, raw, n);
}

/* A float initializer with values uniform in [lo, hi). */
static void init_f(graph *G, const char *name, int rank, const int64_t *dims, float lo, float hi)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    float *d = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        G->seed = G->seed * 1103515245u + 12345u;
        d[i] = lo + (hi - lo) * (float)((G->seed >> 8) & 0xffff) / 65536.0f;
    }
    buf t = {0};
    tensor_msg(&t, name, rank, dims, 1, d, sizeof(float) * (size_t)n);
    f_msg(&G->g, 5, &t);
    free(d);
}

static void init_vals(graph *G, const char *name, int rank, const int64_t *dims, int dtype, const void *d, size_t n)
{
    buf t = {0};
    tensor_msg(&t, name, rank, dims, dtype, d, n);
    f_msg(&G->g, 5, &t);
}

/* Graph input (field 11) or output (12): float, dims < 0 symbolic "N". */
static void io(graph *G, int field, const char *name, int rank, const int64_t *dims)
{
    buf vi = {0}, tp = {0}, tt = {0}, sh = {0};
    for (int i = 0; i < rank; i++) {
        buf d = {0};
        if (dims[i] < 0) f_str(&d, 2, "N");
        else f_int(&d, 1, dims[i]);
        f_msg(&sh, 1, &d);
    }
    f_int(&tt, 1, 1);
    if (rank >= 0) f_msg(&tt, 2, &sh);
    f_msg(&tp, 1, &tt);
    f_str(&vi, 1, name);
    f_msg(&vi, 2, &tp);
    f_msg(&G->g, field, &vi);
}

static mts_model *finish_opts(graph *G, const mts_load_opts *o);

static mts_model *finish(graph *G, const char *backend)
{
    mts_load_opts o = {0};
    o.backend = backend;
    return finish_opts(G, &o);
}

static mts_model *finish_opts(graph *G, const mts_load_opts *o)
{
    buf m = {0}, op = {0};
    f_int(&m, 1, 8);
    f_str(&G->g, 2, "test");
    buf g = {0};
    put(&g, G->g.p, G->g.n);
    f_msg(&m, 7, &g);
    f_str(&op, 1, "");
    f_int(&op, 2, G->opset ? G->opset : 17);
    f_msg(&m, 8, &op);
    mts_model *model = NULL;
    mts_err err = {0};
    int rc = mts_model_load_buffer(m.p, m.n, "test.onnx", o, &model, &err);
    free(m.p);
    if (rc) fail_msg("load (%s): %s", o->backend ? o->backend : "default", err.msg);
    return model;
}

/* ------------------------------------------------------------------------------------------ */

static double rel_l2(const mts_tensor *a, const mts_tensor *b)
{
    int64_t n = mts_tensor_numel(a);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = ((const float *)a->data)[i], y = ((const float *)b->data)[i];
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Runs G on both backends (batch 1 and 3 when the first dim is symbolic, threads 1 and 2). */
static void compare_backends(graph *G, const char *what, double tol)
{
    mts_model *ref = finish(G, "reference"), *dflt = finish(G, "default");
    free(G->g.p);
    G->g.p = NULL;
    mts_model_info info;
    mts_model_get_info(ref, &info);
    for (int64_t batch = 1; batch <= 3; batch += 2)
        for (int threads = 1; threads <= MAX_THREADS; threads++) {
            mts_tensor *in = test_make_inputs(ref, batch, 7u + (unsigned)batch);
            mts_ctx *c1, *c2;
            mts_err err = {0};
            assert_int_equal(mts_ctx_create(ref, 1, &c1, &err), 0);
            assert_int_equal(mts_ctx_create(dflt, threads, &c2, &err), 0);
            const mts_tensor *o1[16], *o2[16];
            assert_true(info.n_outputs <= 16);
            if (mts_ctx_run(c1, in, info.n_inputs, o1, &err)) fail_msg("%s reference: %s", what, err.msg);
            for (int rep = 0; rep < 2; rep++) /* twice: the second run reuses the bound buffers */
                if (mts_ctx_run(c2, in, info.n_inputs, o2, &err)) fail_msg("%s default: %s", what, err.msg);
            for (int o = 0; o < info.n_outputs; o++) {
                assert_true(mts_shape_equal(o1[o], o2[o]));
                double e = rel_l2(o2[o], o1[o]);
                if (!(e <= tol))
                    fail_msg("%s output %d (batch %lld, %d threads): relative L2 error %.3g", what, o,
                             (long long)batch, threads, e);
            }
            mts_ctx_free(c1);
            mts_ctx_free(c2);
            test_free_inputs(ref, in);
        }
    if (G->expect_op && mts_model_op_steps(dflt, G->expect_op) != G->expect_steps)
        fail_msg("%s: %d %s steps in the default backend's plans, expected %d", what,
                 mts_model_op_steps(dflt, G->expect_op), G->expect_op, G->expect_steps);
    mts_model_free(ref);
    mts_model_free(dflt);
}

#define D(...) ((const int64_t[]){__VA_ARGS__})

/* Conv chain with BN, Clip, depthwise + HardSwish, residual Add + Relu, Resize, Concat,
 * dilated conv + HardSigmoid, channel attention, ConvTranspose + Tanh. mid_outputs adds graph
 * outputs inside the chain (forces NCHW groups and stops fusions). */
static void build_chain(graph *G, bool mid_outputs)
{
    memset(G, 0, sizeof *G);
    G->seed = 42;
    io(G, 11, "x", 4, D(-1, 8, 20, 20));
    init_f(G, "w1", 4, D(16, 8, 3, 3), -0.3f, 0.3f);
    init_f(G, "b1", 1, D(16), -0.1f, 0.1f);
    init_f(G, "bn_s", 1, D(16), 0.5f, 1.5f);
    init_f(G, "bn_b", 1, D(16), -0.2f, 0.2f);
    init_f(G, "bn_m", 1, D(16), -0.1f, 0.1f);
    init_f(G, "bn_v", 1, D(16), 0.5f, 1.5f);
    float lo = 0, hi = 6;
    init_vals(G, "clip_lo", 0, NULL, 1, &lo, 4);
    init_vals(G, "clip_hi", 0, NULL, 1, &hi, 4);
    init_f(G, "wdw", 4, D(16, 1, 3, 3), -0.5f, 0.5f);
    init_f(G, "bdw", 1, D(16), -0.1f, 0.1f);
    init_f(G, "wpw", 4, D(16, 16, 1, 1), -0.3f, 0.3f);
    init_f(G, "w4", 4, D(8, 32, 3, 3), -0.2f, 0.2f);
    init_f(G, "b4", 1, D(8), -0.1f, 0.1f);
    init_f(G, "wt", 4, D(8, 4, 3, 3), -0.3f, 0.3f);
    init_f(G, "wsa", 4, D(1, 2, 3, 3), -0.3f, 0.3f);
    init_f(G, "bt", 1, D(4), -0.1f, 0.1f);
    float sc[4] = {1, 1, 2, 2};
    init_vals(G, "scales", 1, D(4), 1, sc, sizeof sc);
    float sc3[4] = {1, 1, 3, 3};
    init_vals(G, "scales3", 1, D(4), 1, sc3, sizeof sc3);
    node(G, "Conv", "x w1 b1", "c1", "pads=ii:1,1,1,1");
    node(G, "BatchNormalization", "c1 bn_s bn_b bn_m bn_v", "bn1", "epsilon=f:0.001");
    node(G, "Clip", "bn1 clip_lo clip_hi", "a1", NULL);
    node(G, "Identity", "a1", "a1i", NULL);
    node(G, "Conv", "a1i wdw bdw", "c2", "group=i:16 strides=ii:2,2 pads=ii:1,1,1,1");
    node(G, "HardSwish", "c2", "a2", NULL);
    node(G, "Conv", "a2 wpw", "c3", NULL);
    node(G, "Add", "a2 c3", "s3", NULL);
    node(G, "Relu", "s3", "r3", NULL);
    node(G, "Resize", "r3 - scales", "u", "mode=s:nearest coordinate_transformation_mode=s:asymmetric nearest_mode=s:floor");
    node(G, "Concat", "u a1", "cat0", "axis=i:1");
    node(G, "Resize", "cat0 - scales3", "u3", "mode=s:nearest");
    node(G, "MaxPool", "u3", "cat", "kernel_shape=ii:3,3 strides=ii:3,3");
    node(G, "Conv", "cat w4 b4", "c4", "dilations=ii:2,2 pads=ii:2,2,2,2");
    node(G, "HardSigmoid", "c4", "a4", "alpha=f:0.3 beta=f:0.4");
    node(G, "GlobalAveragePool", "a4", "gap", NULL);
    node(G, "Sigmoid", "gap", "att", NULL);
    node(G, "Mul", "a4 att", "m4a", NULL);
    node(G, "ReduceMean", "m4a", "sam", "axes=ii:1");
    node(G, "ReduceMax", "m4a", "sax", "axes=ii:-3");
    node(G, "ReduceMax", "m4a", "cax", "axes=ii:2,3");
    node(G, "Concat", "sam sax", "sac", "axis=i:1");
    node(G, "Conv", "sac wsa", "saconv", "pads=ii:1,1,1,1");
    node(G, "Sigmoid", "saconv", "sas", NULL);
    node(G, "Mul", "m4a sas", "m4b", NULL);
    node(G, "Add", "m4b cax", "m4", NULL);
    node(G, "ConvTranspose", "m4 wt bt", "ct", "strides=ii:2,2 pads=ii:1,1,1,1 output_padding=ii:1,1");
    node(G, "Tanh", "ct", "y", NULL);
    io(G, 12, "y", 4, D(-1, 4, 40, 40));
    if (mid_outputs) {
        io(G, 12, "a1", 4, D(-1, 16, 20, 20));
        io(G, 12, "r3", 4, D(-1, 16, 10, 10));
    }
}

static void test_chain(void **state)
{
    (void)state;
    graph G;
    build_chain(&G, false);
    compare_backends(&G, "chain", 1e-5);
    build_chain(&G, true);
    compare_backends(&G, "chain with mid outputs", 1e-5);
}

/* 1-D and 3-D convolutions, LeakyRelu, asymmetric pads, SAME_UPPER, stride 3, grouped
 * ConvTranspose with dilation, a residual Add whose operand is a graph input. */
static void test_shapes(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 7;
    io(&G, 11, "x1", 3, D(-1, 4, 30));
    io(&G, 11, "x3", 5, D(-1, 2, 6, 7, 5));
    io(&G, 11, "x2", 4, D(-1, 6, 17, 19));
    init_f(&G, "k1", 3, D(5, 4, 3), -0.3f, 0.3f);
    init_f(&G, "k3", 5, D(3, 2, 3, 3, 3), -0.3f, 0.3f);
    init_f(&G, "ka", 4, D(6, 6, 3, 2), -0.3f, 0.3f);
    init_f(&G, "kb", 4, D(6, 6, 3, 3), -0.3f, 0.3f);
    init_f(&G, "kt", 4, D(6, 2, 3, 3), -0.3f, 0.3f);
    node(&G, "Conv", "x1 k1", "y1c", "pads=ii:2,1");
    node(&G, "LeakyRelu", "y1c", "y1", "alpha=f:0.2");
    node(&G, "Conv", "x3 k3", "y3c", "pads=ii:1,0,1,1,0,1");
    node(&G, "Sigmoid", "y3c", "y3", NULL);
    node(&G, "Conv", "x2 ka", "ya", "pads=ii:0,1,2,0 strides=ii:3,2");
    node(&G, "Conv", "x2 kb", "yb", "auto_pad=s:SAME_UPPER");
    node(&G, "Add", "yb x2", "yr", NULL);
    node(&G, "ConvTranspose", "yr kt", "yt", "group=i:3 dilations=ii:2,1 strides=ii:2,3");
    /* kernel == stride: runs as 1x1 conv + depth-to-space, to NHWC (then a conv) and to NCHW */
    init_f(&G, "ku", 4, D(6, 5, 2, 3), -0.3f, 0.3f);
    init_f(&G, "bu", 1, D(5), -0.3f, 0.3f);
    init_f(&G, "kc", 4, D(4, 5, 3, 3), -0.3f, 0.3f);
    node(&G, "ConvTranspose", "yr ku bu", "yu", "strides=ii:2,3");
    node(&G, "Relu", "yu", "yur", NULL);
    node(&G, "Conv", "yur kc", "yc", "pads=ii:1,1,1,1");
    node(&G, "ConvTranspose", "ya ku bu", "yv", "strides=ii:2,3");
    io(&G, 12, "y1", -1, NULL);
    io(&G, 12, "y3", -1, NULL);
    io(&G, 12, "ya", -1, NULL);
    io(&G, 12, "yt", -1, NULL);
    io(&G, 12, "yc", -1, NULL);
    io(&G, 12, "yv", -1, NULL);
    compare_backends(&G, "shapes", 1e-5);
}

/* MatMul with constant weights (+ bias row, residual, Relu), Gemm with transB and bias,
 * a MatMul whose weights are not constant (stays on the reference GEMM). */
static void test_matmul(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 11;
    io(&G, 11, "a", 3, D(-1, 24, 32));
    io(&G, 11, "g", 2, D(-1, 200));
    init_f(&G, "wm", 2, D(32, 32), -0.3f, 0.3f);
    init_f(&G, "bm", 1, D(32), -0.3f, 0.3f);
    init_f(&G, "wg", 2, D(100, 200), -0.1f, 0.1f);
    init_f(&G, "bg", 1, D(100), -0.3f, 0.3f);
    node(&G, "MatMul", "a wm", "m1", NULL);
    node(&G, "Add", "m1 bm", "m2", NULL);
    node(&G, "Add", "m2 a", "m3", NULL);
    node(&G, "Relu", "m3", "m4", NULL);
    node(&G, "Transpose", "m4", "m4t", "perm=ii:0,2,1");
    node(&G, "MatMul", "m4 m4t", "mm", NULL);
    node(&G, "Gemm", "g wg bg", "gy", "transB=i:1");
    /* GELU as exported from PyTorch, after a MatMul + bias: fused into the MatMul */
    float sqrt2 = 1.4142135f, one = 1.0f, half = 0.5f;
    init_vals(&G, "sqrt2", 0, NULL, 1, &sqrt2, 4);
    init_vals(&G, "one", 0, NULL, 1, &one, 4);
    init_vals(&G, "half", 0, NULL, 1, &half, 4);
    init_f(&G, "wq", 2, D(32, 64), -0.5f, 0.5f);
    init_f(&G, "bq", 1, D(64), -0.5f, 0.5f);
    node(&G, "MatMul", "a wq", "q1", NULL);
    node(&G, "Add", "bq q1", "q2", NULL);
    node(&G, "Div", "q2 sqrt2", "q3", NULL);
    node(&G, "Erf", "q3", "q4", NULL);
    node(&G, "Add", "q4 one", "q5", NULL);
    node(&G, "Mul", "q2 q5", "q6", NULL);
    node(&G, "Mul", "q6 half", "gel", NULL);
    io(&G, 12, "m4", -1, NULL);
    io(&G, 12, "mm", -1, NULL);
    io(&G, 12, "gy", -1, NULL);
    io(&G, 12, "gel", -1, NULL);
    /* normalizations over the last axis, big enough to run on slices in parallel */
    io(&G, 11, "big", 3, D(-1, 512, 128));
    init_f(&G, "lns", 1, D(128), 0.5f, 1.5f);
    init_f(&G, "lnb", 1, D(128), -0.5f, 0.5f);
    node(&G, "LayerNormalization", "big lns lnb", "ln", "axis=i:-1");
    node(&G, "Softmax", "ln", "sm", "axis=i:2");
    node(&G, "Mul", "sm big", "smb", NULL);
    io(&G, 12, "smb", -1, NULL);
    compare_backends(&G, "matmul", 1e-5);
}

/* Quantized graphs: a QDQ Conv and a QDQ MatMul (fused into QLinearConv / QLinearMatMul on the
 * default backend), and DynamicQuantizeLinear feeding ConvInteger and MatMulInteger (the packed
 * integer GEMM there). Integer results are exact; a fused group may differ from the float path
 * by one quantization step where the float rounding differs, hence the tolerance. */
static void test_quant(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 23;
    io(&G, 11, "x", 4, D(-1, 8, 10, 10));
    float xs = 1.0f / 255.0f, ys = 0.02f, one = 1.0f;
    uint8_t xz = 0, yz = 128;
    int8_t wq[16 * 8 * 9], wz[16] = {0}, mq[10 * 12], mz = 0;
    int32_t bq[16];
    float ws[16], bs[16], ms = 0.01f;
    uint8_t w2[6 * 4 * 4], m2[10 * 5], w2z = 3;
    for (int i = 0; i < 16 * 8 * 9; i++) wq[i] = (int8_t)((i * 37) % 255 - 127);
    for (int i = 0; i < 16; i++) ws[i] = 0.002f + 0.0005f * (float)i, bs[i] = xs * ws[i], bq[i] = (i * 97) % 400 - 200;
    for (int i = 0; i < 10 * 12; i++) mq[i] = (int8_t)((i * 53) % 251 - 125);
    for (int i = 0; i < 6 * 4 * 4; i++) w2[i] = (uint8_t)((i * 29) % 256);
    for (int i = 0; i < 10 * 5; i++) m2[i] = (uint8_t)((i * 41) % 256);
    init_vals(&G, "xs", 0, NULL, 1, &xs, 4);
    init_vals(&G, "xz", 0, NULL, 2, &xz, 1);
    init_vals(&G, "ys", 0, NULL, 1, &ys, 4);
    init_vals(&G, "yz", 0, NULL, 2, &yz, 1);
    init_vals(&G, "one", 0, NULL, 1, &one, 4);
    init_vals(&G, "wq", 4, D(16, 8, 3, 3), 3, wq, sizeof wq);
    init_vals(&G, "ws", 1, D(16), 1, ws, sizeof ws);
    init_vals(&G, "wz", 1, D(16), 3, wz, sizeof wz);
    init_vals(&G, "bq", 1, D(16), 6, bq, sizeof bq);
    init_vals(&G, "bs", 1, D(16), 1, bs, sizeof bs);
    init_vals(&G, "mq", 2, D(10, 12), 3, mq, sizeof mq);
    init_vals(&G, "ms", 0, NULL, 1, &ms, 4);
    init_vals(&G, "mz", 0, NULL, 3, &mz, 1);
    init_vals(&G, "w2", 4, D(6, 4, 2, 2), 2, w2, sizeof w2);
    init_vals(&G, "w2z", 0, NULL, 2, &w2z, 1);
    init_vals(&G, "m2", 2, D(10, 5), 2, m2, sizeof m2);
    /* QDQ convolution with per-channel weights and a bias, then a QDQ MatMul on its output */
    node(&G, "QuantizeLinear", "x xs xz", "xq", NULL);
    node(&G, "DequantizeLinear", "xq xs xz", "xf", NULL);
    node(&G, "DequantizeLinear", "wq ws wz", "wf", "axis=i:0");
    node(&G, "DequantizeLinear", "bq bs", "bf", "axis=i:0");
    node(&G, "Conv", "xf wf bf", "cf", "pads=ii:1,1,1,1");
    node(&G, "QuantizeLinear", "cf ys yz", "cq", NULL);
    node(&G, "DequantizeLinear", "cq ys yz", "y", NULL);
    node(&G, "DequantizeLinear", "mq ms mz", "mf", NULL);
    node(&G, "MatMul", "y mf", "mm", NULL);
    node(&G, "QuantizeLinear", "mm ys yz", "mmq", NULL);
    node(&G, "DequantizeLinear", "mmq ys yz", "z", NULL);
    /* dynamic quantization into the integer products */
    node(&G, "DynamicQuantizeLinear", "x", "dq ds dz", NULL);
    node(&G, "ConvInteger", "dq w2 dz w2z", "ci", "strides=ii:2,2 pads=ii:0,1,1,0 group=i:2");
    node(&G, "DequantizeLinear", "ci one", "cif", NULL);
    node(&G, "MatMulInteger", "dq m2 dz", "mi", NULL);
    node(&G, "DequantizeLinear", "mi one", "mif", NULL);
    io(&G, 12, "y", -1, NULL);
    io(&G, 12, "z", -1, NULL);
    io(&G, 12, "cif", -1, NULL);
    io(&G, 12, "mif", -1, NULL);
    compare_backends(&G, "quant", 5e-3);
}

/* Activations between quantized tensors, Q(act(DQ(x))), as 256-entry tables (MtsQLinearUnary
 * built with the reference kernels of HardSwish, HardSigmoid, Sigmoid, Tanh, Clip, Softplus and
 * Elu): equal to the unfused float steps of the reference backend, value for value, over a
 * source range of [-4, 4] that crosses every activation's bends (and a Clip with a bound from a
 * graph input stays unfused). Then a HardSwish whose output
 * is read twice, which ends an elementwise chain (fast.c) after a Mul and a Sub. */
static void test_quant_tables(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 29;
    io(&G, 11, "x", 4, D(-1, 5, 9, 11));
    float eight = 8.0f, four = 4.0f, xs = 8.0f / 255.0f, ys = 1.0f / 50.0f, lo = -1.0f, hi = 2.5f;
    uint8_t xz = 128, yz = 100;
    init_vals(&G, "eight", 0, NULL, 1, &eight, 4);
    init_vals(&G, "four", 0, NULL, 1, &four, 4);
    init_vals(&G, "xs", 0, NULL, 1, &xs, 4);
    init_vals(&G, "xz", 0, NULL, 2, &xz, 1);
    init_vals(&G, "ys", 0, NULL, 1, &ys, 4);
    init_vals(&G, "yz", 0, NULL, 2, &yz, 1);
    init_vals(&G, "lo", 0, NULL, 1, &lo, 4);
    init_vals(&G, "hi", 0, NULL, 1, &hi, 4);
    node(&G, "Mul", "x eight", "x8", NULL);
    node(&G, "Sub", "x8 four", "xc", NULL);
    node(&G, "QuantizeLinear", "xc xs xz", "xq", NULL);
    node(&G, "DequantizeLinear", "xq xs xz", "xf", NULL);
    static const char *const acts[][3] = {{"HardSwish", "-", NULL},
                                          {"HardSigmoid", "-", "alpha=f:0.3 beta=f:0.4"},
                                          {"Sigmoid", "-", NULL},
                                          {"Tanh", "-", NULL},
                                          {"Clip", "lo hi", NULL},
                                          {"Softplus", "-", NULL},
                                          {"Elu", "-", "alpha=f:0.5"}};
    int n_acts = (int)(sizeof acts / sizeof acts[0]);
    for (int i = 0; i < n_acts; i++) {
        char ins[64], a[16], q[16], y[16];
        snprintf(ins, sizeof ins, "xf%s%s", strcmp(acts[i][1], "-") ? " " : "", strcmp(acts[i][1], "-") ? acts[i][1] : "");
        snprintf(a, sizeof a, "a%d", i);
        snprintf(q, sizeof q, "q%d", i);
        snprintf(y, sizeof y, "y%d", i);
        node(&G, acts[i][0], ins, a, acts[i][2]);
        snprintf(ins, sizeof ins, "%s ys yz", a);
        node(&G, "QuantizeLinear", ins, q, NULL);
        snprintf(ins, sizeof ins, "%s ys yz", q);
        node(&G, "DequantizeLinear", ins, y, NULL);
        io(&G, 12, y, -1, NULL);
    }
    /* a Clip whose bound is a graph input is no function of its element alone: not a table */
    io(&G, 11, "hi_in", 0, NULL);
    node(&G, "Clip", "xf lo hi_in", "av", NULL);
    node(&G, "QuantizeLinear", "av ys yz", "qv", NULL);
    node(&G, "DequantizeLinear", "qv ys yz", "yv", NULL);
    io(&G, 12, "yv", -1, NULL);
    G.expect_op = "MtsQLinearUnary";
    G.expect_steps = n_acts;
    compare_backends(&G, "quantized activation tables", 0.0);

    memset(&G, 0, sizeof G);
    io(&G, 11, "x", 4, D(-1, 5, 9, 11));
    init_vals(&G, "eight", 0, NULL, 1, &eight, 4);
    init_vals(&G, "four", 0, NULL, 1, &four, 4);
    node(&G, "Mul", "x eight", "x8", NULL);
    node(&G, "Sub", "x8 four", "xc", NULL);
    node(&G, "HardSwish", "xc", "h", NULL);
    node(&G, "Add", "h x", "y", NULL);
    io(&G, 12, "h", -1, NULL);
    io(&G, 12, "y", -1, NULL);
    G.expect_op = "MtsEltwiseChain";
    G.expect_steps = 2;
    compare_backends(&G, "HardSwish chain stage", 1e-6); /* x / 6 + 1/2 is one FMA there */
}

/* Fusions into the fast kernels: a Div / Mul by a constant scalar folded into Softmax, and
 * elementwise chains with reversed Sub/Div operands, broadcast operands on either side and
 * graph inputs as operands, on NCHW data and on channels-last data next to a convolution. */
static void test_fast_fusions(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 5;
    io(&G, 11, "x", 4, D(-1, 3, 7, 19));
    io(&G, 11, "p", 4, D(-1, 1, 7, 19));
    float c8 = 8.0f, c3 = 0.3f;
    init_vals(&G, "c8", 0, NULL, 1, &c8, 4);
    init_vals(&G, "c3", 0, NULL, 1, &c3, 4);
    init_f(&G, "row", 1, D(19), 0.5f, 1.5f);
    init_f(&G, "wc", 4, D(6, 3, 3, 3), -0.3f, 0.3f);
    node(&G, "Div", "x c8", "xd", NULL);
    node(&G, "Softmax", "xd", "sm1", "axis=i:-1");
    node(&G, "Mul", "c3 x", "xm", NULL);
    node(&G, "Softmax", "xm", "sm2", "axis=i:3");
    node(&G, "Sub", "row x", "e1", NULL);
    node(&G, "Div", "p e1", "e2", NULL);
    node(&G, "Mul", "e2 p", "e3", NULL);
    node(&G, "Relu", "e3", "e4", NULL);
    node(&G, "Add", "sm1 e4", "e5", NULL);
    node(&G, "Sigmoid", "e5", "e6", NULL);
    /* channels-last: conv output times a per-pixel map plus a per-channel vector, then Relu */
    node(&G, "Conv", "x wc", "cv", "pads=ii:1,1,1,1");
    node(&G, "ReduceMean", "cv", "cm", "axes=ii:1");
    node(&G, "ReduceMax", "cv", "gm", "axes=ii:2,3");
    node(&G, "Mul", "cv cm", "f1", NULL);
    node(&G, "Sub", "gm f1", "f2", NULL);
    node(&G, "Relu", "f2", "f3", NULL);
    node(&G, "Conv", "f3 wc", "cv2", "pads=ii:1,1,1,1 group=i:2");
    io(&G, 12, "sm2", -1, NULL);
    io(&G, 12, "e6", -1, NULL);
    io(&G, 12, "cv2", -1, NULL);
    /* self-attention with 3 heads of 5: Reshape + Transpose into the MatMuls, scaled Softmax,
     * Transpose + Reshape after (folded into strided MatMuls) */
    io(&G, 11, "h", 3, D(-1, 11, 15));
    int64_t hs[4] = {0, 11, 3, 5}, ms[3] = {0, 11, 15};
    init_vals(&G, "hshape", 1, D(4), 7, hs, sizeof hs);
    init_vals(&G, "mshape", 1, D(3), 7, ms, sizeof ms);
    float rs = 2.236068f;
    init_vals(&G, "rs", 0, NULL, 1, &rs, 4);
    node(&G, "Reshape", "h hshape", "hq", NULL);
    node(&G, "Reshape", "h hshape", "hk", NULL);
    node(&G, "Transpose", "hq", "q", "perm=ii:0,2,1,3");
    node(&G, "Transpose", "hk", "kt", "perm=ii:0,2,3,1");
    node(&G, "MatMul", "q kt", "sc", NULL);
    node(&G, "Div", "sc rs", "scd", NULL);
    node(&G, "Softmax", "scd", "pr", "axis=i:-1");
    node(&G, "MatMul", "pr q", "cx", NULL);
    node(&G, "Transpose", "cx", "cxt", "perm=ii:0,2,1,3");
    node(&G, "Reshape", "cxt mshape", "att", NULL);
    io(&G, 12, "att", -1, NULL);
    compare_backends(&G, "fast fusions", 1e-5);
}

/* Layer normalizations written out as elementwise steps (older PyTorch and TensorFlow exports)
 * become one MtsLayerNorm step each: Pow 2 with scale, bias and a Relu after; d * d with
 * neither; two trailing axes with the scale and bias operands first and eps added from the left.
 * Two look-alikes stay unfused: a mean over a leading axis, and a centred value that is also a
 * graph output. Then the same at opset 18, where ReduceMean takes its axes as an input. */
static void ln_written(graph *G, const char *p, const char *x, int axes, const char *sq, bool gamma, bool beta,
                       bool relu, const char *out)
{
    char b[6][64], in[128];
    const char *ax = axes == 2 ? "axes=ii:1,2" : "axes=ii:-1";
    for (int i = 0; i < 6; i++) snprintf(b[i], sizeof b[i], "%s_%d", p, i);
    if (G->opset >= 18) {
        int64_t av[2] = {1, 2}, a1 = -1;
        char an[64];
        snprintf(an, sizeof an, "%s_axes", p);
        init_vals(G, an, 1, D(axes), 7, axes == 2 ? (const void *)av : (const void *)&a1, sizeof(int64_t) * (size_t)axes);
        snprintf(in, sizeof in, "%s %s", x, an);
        node(G, "ReduceMean", in, b[0], NULL);
    } else {
        node(G, "ReduceMean", x, b[0], ax);
    }
    snprintf(in, sizeof in, "%s %s", x, b[0]);
    node(G, "Sub", in, b[1], NULL);
    snprintf(in, sizeof in, !strcmp(sq, "pow") ? "%s two" : "%s %s", b[1], b[1]);
    node(G, !strcmp(sq, "pow") ? "Pow" : "Mul", in, b[2], NULL);
    if (G->opset >= 18) {
        snprintf(in, sizeof in, "%s %s_axes", b[2], p);
        node(G, "ReduceMean", in, b[3], NULL);
    } else {
        node(G, "ReduceMean", b[2], b[3], ax);
    }
    snprintf(in, sizeof in, axes == 2 ? "eps %s" : "%s eps", b[3]);
    node(G, "Add", in, b[4], NULL);
    node(G, "Sqrt", b[4], b[5], NULL);
    char cur[64], nx[64];
    snprintf(in, sizeof in, "%s %s", b[1], b[5]);
    snprintf(cur, sizeof cur, "%s_n", p);
    node(G, "Div", in, cur, NULL);
    const char *steps[3] = {gamma ? "Mul" : NULL, beta ? "Add" : NULL, relu ? "Relu" : NULL};
    const char *prm[3] = {"gamma", "beta", NULL};
    for (int i = 0; i < 3; i++) {
        if (!steps[i]) continue;
        snprintf(nx, sizeof nx, "%s_%c", p, 'a' + i);
        if (i < 2) {
            char pn[64];
            snprintf(pn, sizeof pn, "%s%s", prm[i], axes == 2 ? "2" : "");
            if (axes == 2) snprintf(in, sizeof in, "%s %s", pn, cur);
            else snprintf(in, sizeof in, "%s %s", cur, pn);
        } else {
            snprintf(in, sizeof in, "%s", cur);
        }
        node(G, steps[i], in, nx, NULL);
        snprintf(cur, sizeof cur, "%s", nx);
    }
    node(G, "Identity", cur, out, NULL);
}

static void build_ln_written(graph *G, int opset)
{
    memset(G, 0, sizeof *G);
    G->seed = 9;
    G->opset = opset;
    io(G, 11, "x", 3, D(-1, 6, 40));
    float two = 2.0f, eps = 1e-5f;
    init_vals(G, "two", 0, NULL, 1, &two, 4);
    init_vals(G, "eps", 0, NULL, 1, &eps, 4);
    init_f(G, "gamma", 1, D(40), 0.5f, 1.5f);
    init_f(G, "beta", 1, D(40), -0.5f, 0.5f);
    init_f(G, "gamma2", 2, D(6, 40), 0.5f, 1.5f);
    init_f(G, "beta2", 3, D(1, 6, 40), -0.5f, 0.5f);
    init_f(G, "w", 2, D(40, 40), -0.3f, 0.3f);
    node(G, "MatMul", "x w", "h", NULL);
    ln_written(G, "a", "h", 1, "pow", true, true, true, "y1");
    ln_written(G, "b", "x", 1, "mul", false, false, false, "y2");
    ln_written(G, "c", "h", 2, "pow", true, true, false, "y3");
    io(G, 12, "y1", -1, NULL);
    io(G, 12, "y2", -1, NULL);
    io(G, 12, "y3", -1, NULL);
    if (opset < 18) {
        /* a mean over the leading axis is not a layer normalization of the trailing ones */
        node(G, "ReduceMean", "h", "m0", "axes=ii:1");
        node(G, "Sub", "h m0", "d0", NULL);
        node(G, "Pow", "d0 two", "q0", NULL);
        node(G, "ReduceMean", "q0", "v0", "axes=ii:1");
        node(G, "Add", "v0 eps", "e0", NULL);
        node(G, "Sqrt", "e0", "s0", NULL);
        node(G, "Div", "d0 s0", "y4", NULL);
        /* the centred value is also an output: it must stay */
        node(G, "ReduceMean", "x", "m5", "axes=ii:-1");
        node(G, "Sub", "x m5", "y5", NULL);
        node(G, "Mul", "y5 y5", "q5", NULL);
        node(G, "ReduceMean", "q5", "v5", "axes=ii:-1");
        node(G, "Add", "v5 eps", "e5", NULL);
        node(G, "Sqrt", "e5", "s5", NULL);
        node(G, "Div", "y5 s5", "y6", NULL);
        io(G, 12, "y4", -1, NULL);
        io(G, 12, "y5", -1, NULL);
        io(G, 12, "y6", -1, NULL);
    }
    G->expect_op = "MtsLayerNorm";
    G->expect_steps = 3;
}

static void test_layernorm_written(void **state)
{
    (void)state;
    graph G;
    build_ln_written(&G, 17);
    compare_backends(&G, "written-out LayerNorm", 1e-5);
    build_ln_written(&G, 18);
    compare_backends(&G, "written-out LayerNorm, opset 18", 1e-5);
}

/* 3x3 convolutions of 32 and more channels run as Winograd on AVX-512 (blocked edges converted
 * in scratch): with a Relu post-op, a residual added before and after the activation (a sum
 * into the destination), padding on one side only, a channels-last chain and an NCHW graph
 * output; and two look-alikes that stay direct (stride 2, 16 channels). */
static void test_winograd(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 21;
    io(&G, 11, "x", 4, D(-1, 32, 12, 14));
    init_f(&G, "w1", 4, D(48, 32, 3, 3), -0.1f, 0.1f);
    init_f(&G, "b1", 1, D(48), -0.1f, 0.1f);
    init_f(&G, "w2", 4, D(48, 48, 3, 3), -0.1f, 0.1f);
    init_f(&G, "w3", 4, D(48, 48, 3, 3), -0.1f, 0.1f);
    init_f(&G, "b3", 1, D(48), -0.1f, 0.1f);
    init_f(&G, "w4", 4, D(32, 48, 3, 3), -0.1f, 0.1f);
    init_f(&G, "w5", 4, D(16, 32, 3, 3), -0.1f, 0.1f);
    node(&G, "Conv", "x w1 b1", "c1", "pads=ii:1,1,1,1");
    node(&G, "Relu", "c1", "r1", NULL);
    node(&G, "Conv", "r1 w2", "c2", "pads=ii:1,1,1,1");
    node(&G, "Add", "c2 r1", "a2", NULL); /* residual, then the activation */
    node(&G, "Relu", "a2", "r2", NULL);
    node(&G, "Conv", "r2 w3 b3", "c3", "pads=ii:1,1,1,1");
    node(&G, "Relu", "c3", "r3", NULL);
    node(&G, "Add", "r3 r2", "a3", NULL); /* the activation, then the residual */
    node(&G, "Conv", "a3 w4", "y1", "pads=ii:0,1,0,1");
    node(&G, "Conv", "a3 w4", "y2", "pads=ii:1,1,1,1 strides=ii:2,2");
    node(&G, "Conv", "x w5", "y3", "pads=ii:1,1,1,1");
    io(&G, 12, "y1", -1, NULL);
    io(&G, 12, "y2", -1, NULL);
    io(&G, 12, "y3", -1, NULL);
    int64_t before = mts_dconv_wino_created();
    compare_backends(&G, "winograd", 1e-5);
    bool avx512 = false; /* oneDNN 2.x has Winograd kernels for AVX-512 only */
#if defined(__x86_64__)
    __builtin_cpu_init();
    avx512 = __builtin_cpu_supports("avx512f") && !getenv("MTS_NO_WINOGRAD");
#endif
    if (avx512 && mts_dconv_wino_created() - before < 4)
        fail_msg("%lld Winograd convolutions created, expected 4 or more",
                 (long long)(mts_dconv_wino_created() - before));
}

/* Nearest upsampling read only by a convolution: the conv runs one small convolution per
 * output phase on the low-resolution source (factors 2x2 with 3x3 pad 1 + BN + Relu into a
 * channels-last conv; 3x2 with 5x5 pad 2 as a graph output, NCHW; 2x2 with 1x1; a strided
 * conv after an upsampling, which stays on the plain path). */
static void test_upsample_conv(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 9;
    io(&G, 11, "x", 4, D(-1, 5, 6, 7));
    float s22[4] = {1, 1, 2, 2}, s32[4] = {1, 1, 3, 2};
    init_vals(&G, "s22", 1, D(4), 1, s22, sizeof s22);
    init_vals(&G, "s32", 1, D(4), 1, s32, sizeof s32);
    init_f(&G, "w1", 4, D(8, 5, 3, 3), -0.3f, 0.3f);
    init_f(&G, "b1", 1, D(8), -0.1f, 0.1f);
    init_f(&G, "bn_s", 1, D(8), 0.5f, 1.5f);
    init_f(&G, "bn_b", 1, D(8), -0.2f, 0.2f);
    init_f(&G, "bn_m", 1, D(8), -0.1f, 0.1f);
    init_f(&G, "bn_v", 1, D(8), 0.5f, 1.5f);
    init_f(&G, "w2", 4, D(4, 8, 3, 3), -0.3f, 0.3f);
    init_f(&G, "w3", 4, D(3, 5, 5, 5), -0.3f, 0.3f);
    init_f(&G, "w4", 4, D(6, 5, 1, 1), -0.3f, 0.3f);
    init_f(&G, "w5", 4, D(4, 5, 3, 3), -0.3f, 0.3f);
    node(&G, "Resize", "x - s22", "u1", "mode=s:nearest coordinate_transformation_mode=s:asymmetric nearest_mode=s:floor");
    node(&G, "Conv", "u1 w1 b1", "c1", "pads=ii:1,1,1,1");
    node(&G, "BatchNormalization", "c1 bn_s bn_b bn_m bn_v", "n1", NULL);
    node(&G, "Relu", "n1", "r1", NULL);
    node(&G, "Conv", "r1 w2", "y1", "pads=ii:1,1,1,1");
    node(&G, "Resize", "x - s32", "u2", "mode=s:nearest");
    node(&G, "Conv", "u2 w3", "y2", "pads=ii:2,2,2,2");
    node(&G, "Resize", "x - s22", "u3", "mode=s:nearest");
    node(&G, "Conv", "u3 w4", "y3c", NULL);
    node(&G, "Sigmoid", "y3c", "y3", NULL);
    node(&G, "Resize", "x - s22", "u4", "mode=s:nearest");
    node(&G, "Conv", "u4 w5", "y4", "pads=ii:1,1,1,1 strides=ii:2,2");
    io(&G, 12, "y1", -1, NULL);
    io(&G, 12, "y2", -1, NULL);
    io(&G, 12, "y3", -1, NULL);
    io(&G, 12, "y4", -1, NULL);
    compare_backends(&G, "upsample + conv", 1e-5);
}

/* A tf2onnx-style channels-last network: NHWC input transposed to NCHW, a zero Pad before a
 * strided depthwise conv (folded into it), channel padding by Concat with a constant of zeros
 * into a residual Add, an fp16 round trip (Cast to float16 and back), a graph output copied
 * from a value a conv also reads, a Transpose back to NHWC, a residual added after a conv's
 * Relu, a linear Resize rounded to float16 and widened again, channel Slices, and scalar
 * affine steps around a HardSwish written out; Max / Min with a constant as clip post-ops. */
static void test_nhwc_export(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 5;
    io(&G, 11, "x", 4, D(1, 10, 12, 3));
    init_f(&G, "w1", 4, D(8, 3, 3, 3), -0.3f, 0.3f);
    init_f(&G, "b1", 1, D(8), -0.1f, 0.1f);
    init_f(&G, "w2", 4, D(8, 1, 3, 3), -0.3f, 0.3f);
    init_f(&G, "w3", 4, D(12, 8, 1, 1), -0.3f, 0.3f);
    init_f(&G, "w4", 4, D(6, 12, 1, 1), -0.3f, 0.3f);
    init_f(&G, "w5", 4, D(12, 12, 3, 3), -0.3f, 0.3f);
    init_f(&G, "b5", 1, D(12), -0.1f, 0.1f);
    int64_t pads[8] = {0, 0, 0, 0, 0, 0, 1, 1};
    init_vals(&G, "pads", 1, D(8), 7, pads, sizeof pads);
    float zeros[4 * 5 * 6] = {0};
    init_vals(&G, "zeros", 4, D(1, 4, 5, 6), 1, zeros, sizeof zeros);
    node(&G, "Transpose", "x", "xt", "perm=ii:0,3,1,2");
    node(&G, "Conv", "xt w1 b1", "c1", "pads=ii:1,1,1,1");
    node(&G, "Relu", "c1", "r1", NULL);
    node(&G, "Pad", "r1 pads", "p1", NULL);
    node(&G, "Conv", "p1 w2", "c2", "group=i:8 strides=ii:2,2");
    node(&G, "Concat", "c2 zeros", "cat", "axis=i:1");
    node(&G, "Conv", "c2 w3", "c3", NULL);
    node(&G, "Add", "c3 cat", "a3", NULL);
    node(&G, "Relu", "a3", "r3", NULL);
    node(&G, "Cast", "r3", "h16", "to=i:10");
    node(&G, "Cast", "h16", "h32", "to=i:1");
    node(&G, "Conv", "h32 w4", "c4", NULL);
    node(&G, "Transpose", "c4", "y1", "perm=ii:0,2,3,1");
    node(&G, "Identity", "h32", "y2", NULL);
    /* relu(conv(h)) + h, the residual added last (oneDNN's sum post-op where that is faster) */
    node(&G, "Conv", "h32 w5 b5", "c5", "pads=ii:1,1,1,1");
    node(&G, "Relu", "c5", "r5", NULL);
    node(&G, "Add", "r5 h32", "a5", NULL);
    node(&G, "Conv", "a5 w4", "y3", NULL);
    /* a linear Resize rounded to float16 (fused into the Resize) between two convs */
    float s22[4] = {1, 1, 2, 2};
    init_vals(&G, "s22", 1, D(4), 1, s22, sizeof s22);
    node(&G, "Resize", "a5 - s22", "rz", "mode=s:linear");
    node(&G, "Cast", "rz", "rh", "to=i:10");
    node(&G, "Cast", "rh", "rf", "to=i:1");
    node(&G, "Conv", "rf w4", "y4", NULL);
    /* channel Slices of a channels-last tensor: axes as tf2onnx writes them (then a Transpose
     * to NHWC, a copy), and no axes (starts/ends of the leading axes) */
    int64_t st5[4] = {0, 0, 0, 2}, en5[4] = {INT32_MAX, INT32_MAX, INT32_MAX, 6}, ax5[4] = {0, 2, 3, 1};
    int64_t st6[2] = {0, 7}, en6[2] = {1, 9};
    init_vals(&G, "st5", 1, D(4), 7, st5, sizeof st5);
    init_vals(&G, "en5", 1, D(4), 7, en5, sizeof en5);
    init_vals(&G, "ax5", 1, D(4), 7, ax5, sizeof ax5);
    init_vals(&G, "st6", 1, D(2), 7, st6, sizeof st6);
    init_vals(&G, "en6", 1, D(2), 7, en6, sizeof en6);
    init_f(&G, "w6", 4, D(4, 2, 1, 1), -0.3f, 0.3f);
    node(&G, "Slice", "a5 st5 en5 ax5", "s5", NULL);
    node(&G, "Transpose", "s5", "y5", "perm=ii:0,2,3,1");
    node(&G, "Slice", "a5 st6 en6", "s6", NULL);
    node(&G, "Conv", "s6 w6", "y6", NULL);
    io(&G, 12, "y1", -1, NULL);
    io(&G, 12, "y2", -1, NULL);
    io(&G, 12, "y3", -1, NULL);
    io(&G, 12, "y4", -1, NULL);
    /* paddle2onnx's LCNetV3 block: conv * s + t (into the weights), HardSwish written out
     * (a post-op), then * s2 + t2 (one linear post-op) */
    float sc[6] = {1.3f, 0.2f, 3.0f, 0.0f, 6.0f, 0.7f};
    const char *scn[6] = {"s7", "t7", "three", "zero", "six", "s8"};
    for (int k = 0; k < 6; k++) init_vals(&G, scn[k], 1, D(1), 1, &sc[k], sizeof(float));
    node(&G, "Conv", "a5 w5 b5", "c7", "pads=ii:1,1,1,1");
    node(&G, "Mul", "s7 c7", "m7", NULL);
    node(&G, "Add", "m7 t7", "l7", NULL);
    node(&G, "Add", "l7 three", "p7", NULL);
    node(&G, "Clip", "p7 zero six", "k7", NULL);
    node(&G, "Mul", "l7 k7", "q7", NULL);
    node(&G, "Div", "q7 six", "h7", NULL);
    node(&G, "Mul", "s8 h7", "m8", NULL);
    node(&G, "Sub", "m8 t7", "y7", NULL);
    io(&G, 12, "y5", -1, NULL);
    io(&G, 12, "y6", -1, NULL);
    io(&G, 12, "y7", -1, NULL);
    /* tf2onnx's floor after a LeakyRelu, Max(x, c) with c of shape [1,1,1,1], and a ceiling
     * Min(c, x): clip post-ops of the convolutions (no Max / Min step left) */
    float floor_c = -0.05f, ceil_c = 0.1f;
    init_vals(&G, "floor", 4, D(1, 1, 1, 1), 1, &floor_c, sizeof floor_c);
    init_vals(&G, "ceil", 0, NULL, 1, &ceil_c, sizeof ceil_c);
    node(&G, "Conv", "a5 w5 b5", "c8", "pads=ii:1,1,1,1");
    node(&G, "LeakyRelu", "c8", "l8", "alpha=f:0.2");
    node(&G, "Max", "l8 floor", "y8", NULL);
    node(&G, "Conv", "a5 w5", "c9", "pads=ii:1,1,1,1");
    node(&G, "Min", "ceil c9", "y9", NULL);
    io(&G, 12, "y8", -1, NULL);
    io(&G, 12, "y9", -1, NULL);
    G.expect_op = "Max";
    G.expect_steps = 0;
    compare_backends(&G, "nhwc export", 1e-5);
}

/* The generated reference models, when present, at batch 1. */
static void test_reference_models(void **state)
{
    (void)state;
    static const char *const names[] = {"lipsync_unet_w4", "mobilenetv3", "seg_unet", "cbam_resunet", NULL};
    for (int i = 0; names[i]; i++) {
        char rel[256], path[4096];
        snprintf(rel, sizeof rel, "models/out/%s.onnx", names[i]);
        test_path(path, sizeof path, rel);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        fclose(f);
        mts_model *ref, *dflt;
        mts_err err = {0};
        mts_load_opts ro = {0}, dop = {0};
        ro.backend = "reference";
        dop.backend = "default";
        assert_int_equal(mts_model_load(path, &ro, &ref, &err), 0);
        assert_int_equal(mts_model_load(path, &dop, &dflt, &err), 0);
        mts_model_info info;
        mts_model_get_info(ref, &info);
        mts_tensor *in = test_make_inputs(ref, 1, 3);
        mts_ctx *c1, *c2;
        assert_int_equal(mts_ctx_create(ref, MAX_THREADS, &c1, &err), 0);
        assert_int_equal(mts_ctx_create(dflt, MAX_THREADS, &c2, &err), 0);
        const mts_tensor *o1[8], *o2[8];
        if (mts_ctx_run(c1, in, info.n_inputs, o1, &err)) fail_msg("%s reference: %s", names[i], err.msg);
        if (mts_ctx_run(c2, in, info.n_inputs, o2, &err)) fail_msg("%s default: %s", names[i], err.msg);
        for (int o = 0; o < info.n_outputs; o++) {
            double e = rel_l2(o2[o], o1[o]);
            if (!(e <= 1e-4)) fail_msg("%s output %d: relative L2 error %.3g", names[i], o, e);
        }
        mts_ctx_free(c1);
        mts_ctx_free(c2);
        test_free_inputs(ref, in);
        mts_model_free(ref);
        mts_model_free(dflt);
    }
}

/* A small-channel Conv followed by a Sigmoid (a UNet's 3-channel head) or a Relu: the
 * activation is applied as the Conv writes its rows, and its step goes (two Conv steps with
 * mts_act). The source is channels-last (a oneDNN convolution's output), W = 37: vectors of 16
 * pixels and a tail. */
static void test_small_conv_act(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 13;
    io(&G, 11, "x", 4, D(-1, 8, 12, 37));
    init_f(&G, "w0", 4, D(8, 8, 3, 3), -0.3f, 0.3f);
    init_f(&G, "wh", 4, D(3, 8, 3, 3), -0.4f, 0.4f);
    init_f(&G, "bh", 1, D(3), -0.1f, 0.1f);
    init_f(&G, "wr", 4, D(2, 8, 3, 3), -0.4f, 0.4f);
    node(&G, "Conv", "x w0", "c0", "pads=ii:1,1,1,1");
    node(&G, "Relu", "c0", "r0", NULL);
    node(&G, "Conv", "r0 wh bh", "h", "pads=ii:1,1,1,1");
    node(&G, "Sigmoid", "h", "y", NULL);
    node(&G, "Conv", "r0 wr", "g", "pads=ii:1,1,1,1");
    node(&G, "Relu", "g", "y2", NULL);
    io(&G, 12, "y", 4, D(-1, 3, 12, 37));
    io(&G, 12, "y2", 4, D(-1, 2, 12, 37));
    G.expect_op = "Conv/mts_act";
    G.expect_steps = 2;
    compare_backends(&G, "small conv + activation", 1e-5);
}

/* A bf16 plan's skip Concat (read by a bf16 convolution) takes as bf16 the inputs that bf16
 * convolutions wrote for it alone or for it and other bf16 convolutions: here the skip c0, also
 * read by the strided convolution. d comes through a nearest upsampling, which the fast
 * backend folds into the Concat after the hand-offs were chosen (a Resize reads it then), so it
 * stays float and is converted as the Concat copies it; the Concat runs its upsampling form,
 * with one input of each kind. The output is the same bits as with every hand-off in fp32
 * (MTS_BF16_NO_HANDOFF). */
static void test_bf16_concat_inputs(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 5;
    io(&G, 11, "x", 4, D(-1, 8, 20, 20));
    init_f(&G, "w0", 4, D(16, 8, 3, 3), -0.3f, 0.3f);
    init_f(&G, "wd", 4, D(16, 16, 3, 3), -0.2f, 0.2f);
    init_f(&G, "w2", 4, D(8, 32, 3, 3), -0.2f, 0.2f);
    float sc[4] = {1, 1, 2, 2};
    init_vals(&G, "scales", 1, D(4), 1, sc, sizeof sc);
    node(&G, "Conv", "x w0", "c0", "pads=ii:1,1,1,1");
    node(&G, "Conv", "c0 wd", "d", "strides=ii:2,2 pads=ii:1,1,1,1");
    node(&G, "Resize", "d - scales", "u", "mode=s:nearest coordinate_transformation_mode=s:asymmetric nearest_mode=s:floor");
    node(&G, "Concat", "u c0", "cat", "axis=i:1");
    node(&G, "Conv", "cat w2", "y", "pads=ii:1,1,1,1");
    io(&G, 12, "y", 4, D(-1, 8, 20, 20));
    mts_load_opts o = {0};
    o.precision = "bf16";
    mts_model *m[2];
    const mts_tensor *out[2][1];
    mts_ctx *c[2];
    mts_tensor *in = NULL;
    for (int k = 0; k < 2; k++) { /* k = 0: fp32 hand-offs, 1: bf16 */
        if (k == 0) setenv("MTS_BF16_NO_HANDOFF", "1", 1);
        m[k] = finish_opts(&G, &o);
        if (strcmp(mts_model_precision(m[k])->effective, "bf16")) {
            unsetenv("MTS_BF16_NO_HANDOFF");
            printf("bf16 Concat inputs: no bf16 kernels here (%s); skipped\n", mts_model_precision(m[k])->reason);
            for (int i = 0; i <= k; i++) mts_model_free(m[i]);
            free(G.g.p);
            return;
        }
        if (!in) in = test_make_inputs(m[k], 2, 9);
        mts_err err = {0};
        assert_int_equal(mts_ctx_create(m[k], 2, &c[k], &err), 0);
        if (mts_ctx_run(c[k], in, 1, out[k], &err)) fail_msg("run: %s", err.msg); /* builds the batch-2 plan */
        unsetenv("MTS_BF16_NO_HANDOFF");
    }
    int64_t n = mts_tensor_numel(out[0][0]);
    assert_int_equal(n, 2 * 8 * 20 * 20);
    assert_int_equal(mts_tensor_numel(out[1][0]), n);
    assert_int_equal(mts_model_op_steps(m[0], "Concat/mts_in_bf16"), 0);
    assert_int_equal(mts_model_op_steps(m[1], "Concat/mts_out_bf16"), 1);
    assert_int_equal(mts_model_op_steps(m[1], "Concat/mts_in_bf16"), 1);
    assert_memory_equal(out[0][0]->data, out[1][0]->data, (size_t)n * sizeof(float));
    for (int k = 0; k < 2; k++) mts_ctx_free(c[k]);
    test_free_inputs(m[0], in);
    for (int k = 0; k < 2; k++) mts_model_free(m[k]);
    free(G.g.p);
}

/* Depthwise-separable pairs (a depthwise 3x3 convolution read only by a 1x1 convolution) run
 * as one step of the engine's own kernel (dwsep.c): the UNet block (8 channels, LeakyRelu
 * before, Relu between, the block's input added back), 16 -> 24 channels with Clip between and
 * Relu after, 24 -> 64 channels (a weight period of 48) with BatchNormalization, Relu and a
 * scalar Mul after, and a depthwise convolution with two readers, which stays two steps. Widths 21
 * and 13 leave half vectors and partial pixel groups at the row ends. */
static void build_dwsep(graph *G, int64_t W)
{
    memset(G, 0, sizeof *G);
    G->seed = 21;
    io(G, 11, "x", 4, D(-1, 6, 9, W));
    init_f(G, "w0", 4, D(8, 6, 3, 3), -0.4f, 0.4f);
    init_f(G, "d1", 4, D(8, 1, 3, 3), -0.5f, 0.5f);
    init_f(G, "db1", 1, D(8), -0.1f, 0.1f);
    init_f(G, "p1", 4, D(8, 8, 1, 1), -0.4f, 0.4f);
    init_f(G, "pb1", 1, D(8), -0.1f, 0.1f);
    node(G, "Conv", "x w0", "c0", "pads=ii:1,1,1,1");
    node(G, "LeakyRelu", "c0", "a0", "alpha=f:0.1");
    node(G, "Conv", "a0 d1 db1", "dw1", "group=i:8 pads=ii:1,1,1,1");
    node(G, "Relu", "dw1", "r1", NULL);
    node(G, "Conv", "r1 p1 pb1", "pw1", NULL);
    node(G, "Add", "a0 pw1", "blk1", NULL);
    init_f(G, "w2", 4, D(16, 8, 3, 3), -0.3f, 0.3f);
    init_f(G, "d2", 4, D(16, 1, 3, 3), -0.5f, 0.5f);
    init_f(G, "p2", 4, D(24, 16, 1, 1), -0.3f, 0.3f);
    init_f(G, "pb2", 1, D(24), -0.1f, 0.1f);
    float lo = 0.0f, hi = 0.4f;
    init_vals(G, "lo", 0, NULL, 1, &lo, sizeof lo);
    init_vals(G, "hi", 0, NULL, 1, &hi, sizeof hi);
    node(G, "Conv", "blk1 w2", "c2", "pads=ii:1,1,1,1");
    node(G, "Conv", "c2 d2", "dw2", "group=i:16 pads=ii:1,1,1,1");
    node(G, "Clip", "dw2 lo hi", "k2", NULL);
    node(G, "Conv", "k2 p2 pb2", "pw2", NULL);
    node(G, "Relu", "pw2", "blk2", NULL);
    init_f(G, "d3", 4, D(24, 1, 3, 3), -0.5f, 0.5f);
    init_f(G, "db3", 1, D(24), -0.1f, 0.1f);
    init_f(G, "p3", 4, D(64, 24, 1, 1), -0.3f, 0.3f);
    init_f(G, "bn_s", 1, D(64), 0.5f, 1.5f);
    init_f(G, "bn_b", 1, D(64), -0.2f, 0.2f);
    init_f(G, "bn_m", 1, D(64), -0.1f, 0.1f);
    init_f(G, "bn_v", 1, D(64), 0.5f, 1.5f);
    float two = 2.0f;
    init_vals(G, "two", 0, NULL, 1, &two, sizeof two);
    node(G, "Conv", "blk2 d3 db3", "dw3", "group=i:24 pads=ii:1,1,1,1");
    node(G, "Conv", "dw3 p3", "pw3", NULL);
    node(G, "BatchNormalization", "pw3 bn_s bn_b bn_m bn_v", "bn3", NULL);
    node(G, "Relu", "bn3", "r3", NULL);
    node(G, "Mul", "r3 two", "m3", NULL);
    init_f(G, "w5", 4, D(8, 64, 3, 3), -0.1f, 0.1f);
    node(G, "Conv", "m3 w5", "y", "pads=ii:1,1,1,1");
    init_f(G, "d4", 4, D(8, 1, 3, 3), -0.5f, 0.5f);
    init_f(G, "p4", 4, D(8, 8, 1, 1), -0.4f, 0.4f);
    node(G, "Conv", "blk1 d4", "dw4", "group=i:8 pads=ii:1,1,1,1");
    node(G, "Conv", "dw4 p4", "pw4", NULL);
    node(G, "Add", "dw4 pw4", "y2", NULL);
    io(G, 12, "y", 4, D(-1, 8, 9, W));
    io(G, 12, "y2", 4, D(-1, 8, 9, W));
    /* c0, three pairs, c2, dw4 + pw4 unpaired (two readers; y2, a graph output, is NCHW, which
     * the kernel does not write either) and the last: 8 convolution steps (11 without pairing) */
    G->expect_op = "Conv";
    G->expect_steps = 8;
}

static void test_dwsep(void **state)
{
    (void)state;
    graph G;
    build_dwsep(&G, 21);
    compare_backends(&G, "depthwise-separable pairs, width 21", 1e-5);
    build_dwsep(&G, 13);
    compare_backends(&G, "depthwise-separable pairs, width 13", 1e-5);
    setenv("MTS_NO_DWSEP", "1", 1);
    build_dwsep(&G, 13);
    G.expect_steps = 11;
    compare_backends(&G, "depthwise-separable pairs unpaired", 1e-5);
    unsetenv("MTS_NO_DWSEP");
}

/* Random pairs: channels 8-64 in and out (multiples of 8), sizes that leave partial vectors and
 * pixel groups, each of the depthwise post-ops (none, Relu, LeakyRelu, Clip) and pointwise
 * endings (none, Relu, a residual Add of the block's input, Relu then a scalar Mul), biases or
 * none; every case against the reference backend, and paired (2 convolution steps besides the
 * first and last). */
static void test_dwsep_random(void **state)
{
    (void)state;
    uint32_t r = 12345;
#define RND(n) ((r = r * 1103515245u + 12345u) >> 16) % (n)
    for (int it = 0; it < 12; it++) {
        int64_t C = 8 * (1 + (int64_t)RND(8)), M = 8 * (1 + (int64_t)RND(8)), H = 3 + (int64_t)RND(6),
                W = 5 + (int64_t)RND(20);
        int dpost = (int)RND(4), ppost = (int)RND(4);
        bool dbias = RND(2), pbias = RND(2);
        if (ppost == 2 && M != C) ppost = 1;
        graph G;
        memset(&G, 0, sizeof G);
        G.seed = 100u + (unsigned)it;
        io(&G, 11, "x", 4, D(-1, 4, H, W));
        init_f(&G, "w0", 4, D(C, 4, 3, 3), -0.4f, 0.4f);
        init_f(&G, "dw", 4, D(C, 1, 3, 3), -0.5f, 0.5f);
        init_f(&G, "db", 1, D(C), -0.2f, 0.2f);
        init_f(&G, "pw", 4, D(M, C, 1, 1), -0.3f, 0.3f);
        init_f(&G, "pb", 1, D(M), -0.2f, 0.2f);
        init_f(&G, "w9", 4, D(8, M, 3, 3), -0.2f, 0.2f);
        float lo = -0.1f, hi = 0.3f, k3 = 1.5f;
        init_vals(&G, "lo", 0, NULL, 1, &lo, sizeof lo);
        init_vals(&G, "hi", 0, NULL, 1, &hi, sizeof hi);
        init_vals(&G, "k3", 0, NULL, 1, &k3, sizeof k3);
        node(&G, "Conv", "x w0", "c0", "pads=ii:1,1,1,1");
        char gattr[64];
        snprintf(gattr, sizeof gattr, "group=i:%lld pads=ii:1,1,1,1", (long long)C);
        node(&G, "Conv", dbias ? "c0 dw db" : "c0 dw", "d", gattr);
        const char *dout = "d";
        if (dpost == 1) node(&G, "Relu", "d", "da", NULL), dout = "da";
        if (dpost == 2) node(&G, "LeakyRelu", "d", "da", "alpha=f:0.2"), dout = "da";
        if (dpost == 3) node(&G, "Clip", "d lo hi", "da", NULL), dout = "da";
        char ins[64];
        snprintf(ins, sizeof ins, pbias ? "%s pw pb" : "%s pw", dout);
        node(&G, "Conv", ins, "p", NULL);
        const char *pout = "p";
        if (ppost == 1) node(&G, "Relu", "p", "pa", NULL), pout = "pa";
        if (ppost == 2) node(&G, "Add", "c0 p", "pa", NULL), pout = "pa";
        if (ppost == 3) node(&G, "Relu", "p", "pr", NULL), node(&G, "Mul", "pr k3", "pa", NULL), pout = "pa";
        snprintf(ins, sizeof ins, "%s w9", pout);
        node(&G, "Conv", ins, "y", "pads=ii:1,1,1,1");
        io(&G, 12, "y", 4, D(-1, 8, H, W));
        G.expect_op = "Conv";
        G.expect_steps = 3;
        char what[160];
        snprintf(what, sizeof what, "pair %d: C %lld M %lld %lldx%lld, depthwise post %d, pointwise post %d, biases %d %d", it,
                 (long long)C, (long long)M, (long long)H, (long long)W, dpost, ppost, dbias, pbias);
        compare_backends(&G, what, 1e-5);
    }
#undef RND
}

/* bf16 plans: a pair whose source a bf16 convolution writes as bf16 (not also a residual) and
 * whose output a bf16 convolution reads gives the same bits with bf16 and with float hand-offs
 * (given the source as float, the kernel rounds it as the hand-off would), and stays within
 * bf16's error of the reference. */
static void test_bf16_dwsep(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 8;
    io(&G, 11, "x", 4, D(-1, 8, 11, 19));
    init_f(&G, "w0", 4, D(16, 8, 3, 3), -0.3f, 0.3f);
    init_f(&G, "d1", 4, D(16, 1, 3, 3), -0.5f, 0.5f);
    init_f(&G, "p1", 4, D(8, 16, 1, 1), -0.3f, 0.3f); /* 19 x 8 values a row: a half vector left */
    init_f(&G, "w2", 4, D(8, 8, 3, 3), -0.3f, 0.3f);
    node(&G, "Conv", "x w0", "c0", "pads=ii:1,1,1,1");
    node(&G, "Conv", "c0 d1", "dw1", "group=i:16 pads=ii:1,1,1,1");
    node(&G, "Relu", "dw1", "r1", NULL);
    node(&G, "Conv", "r1 p1", "pw1", NULL);
    node(&G, "Conv", "pw1 w2", "y", "pads=ii:1,1,1,1");
    io(&G, 12, "y", 4, D(-1, 8, 11, 19));
    mts_load_opts o = {0};
    o.precision = "bf16";
    mts_model *m[3];
    const mts_tensor *out[3][1];
    mts_ctx *c[3];
    mts_tensor *in = NULL;
    for (int k = 0; k < 3; k++) { /* 0: fp32 hand-offs, 1: bf16, 2: the reference backend */
        if (k == 0) setenv("MTS_BF16_NO_HANDOFF", "1", 1);
        mts_load_opts ok = o;
        if (k == 2) ok.precision = "fp32", ok.backend = "reference";
        m[k] = finish_opts(&G, &ok);
        if (k < 2 && strcmp(mts_model_precision(m[k])->effective, "bf16")) {
            unsetenv("MTS_BF16_NO_HANDOFF");
            printf("bf16 pairs: no bf16 kernels here (%s); skipped\n", mts_model_precision(m[k])->reason);
            for (int i = 0; i <= k; i++) mts_model_free(m[i]);
            free(G.g.p);
            return;
        }
        if (!in) in = test_make_inputs(m[k], 2, 4);
        mts_err err = {0};
        assert_int_equal(mts_ctx_create(m[k], 2, &c[k], &err), 0);
        if (mts_ctx_run(c[k], in, 1, out[k], &err)) fail_msg("run: %s", err.msg);
        unsetenv("MTS_BF16_NO_HANDOFF");
    }
    int64_t n = mts_tensor_numel(out[0][0]);
    assert_int_equal(n, 2 * 8 * 11 * 19);
    assert_int_equal(mts_model_op_steps(m[1], "Conv"), 3); /* c0, the pair, the last conv */
    assert_memory_equal(out[0][0]->data, out[1][0]->data, (size_t)n * sizeof(float));
    double e = rel_l2(out[1][0], out[2][0]);
    if (!(e <= 2e-2)) fail_msg("bf16 pair against the reference: relative L2 error %.3g", e);
    for (int k = 0; k < 3; k++) mts_ctx_free(c[k]);
    test_free_inputs(m[0], in);
    for (int k = 0; k < 3; k++) mts_model_free(m[k]);
    free(G.g.p);
}

/* The bf16 3x3 convolution to 8 channels (bfconv.c, where the CPU has AVX512-BF16 and no AMX):
 * sources of 1-8 channels straight from the model input (float), 16 channels from a bf16
 * convolution (the transposed path) and 8, 24 and 32 (word by word), the upsampled form (a nearest 2x
 * Resize before it, of the input or of a 16-channel bf16 step), widths that leave partial 16-
 * and 32-pixel blocks, each post-op kind (none, Relu, LeakyRelu, Clip, Relu then a scalar Mul,
 * a residual Add), biases or none, and a second such convolution reading the first one's bf16
 * output. Each case: bf16 plans with and without hand-offs (bits equal), against the
 * reference backend, and against oneDNN's bf16 steps (MTS_NO_BFCONV=1). */
static void test_bfconv(void **state)
{
    (void)state;
    const char *native = mts_cpu_bf16_native();
    bool here = native && !strcmp(native, "avx512_bf16") && __builtin_cpu_supports("avx512bw");
    uint32_t r = 4242;
#define RND(n) ((r = r * 1103515245u + 12345u) >> 16) % (n)
    for (int it = 0; it < 16; it++) {
        int kind = it % 4, post = (int)RND(6); /* kind 3: upsampled, of r0 (it % 8 == 3) or of x */
        bool bias = RND(2), up_x = it % 8 == 7;
        int64_t H = 3 + (int64_t)RND(5), W = 5 + (int64_t)RND(60), Cx = kind && !up_x ? 4 : 1 + (int64_t)RND(8);
        int64_t C = kind == 0 || up_x ? Cx : kind == 2 ? (it % 8 < 4 ? 24 : 8) : (it % 8 < 4 ? 16 : 32);
        int64_t Ho = kind == 3 ? 2 * H : H, Wo = kind == 3 ? 2 * W : W;
        if (kind == 3 && post == 5) post = 1;
        graph G;
        memset(&G, 0, sizeof G);
        G.seed = 300u + (unsigned)it;
        io(&G, 11, "x", 4, D(-1, Cx, H, W));
        init_f(&G, "w0", 4, D(C, Cx, 3, 3), -0.4f, 0.4f);
        init_f(&G, "w1", 4, D(8, C, 3, 3), -0.3f, 0.3f);
        init_f(&G, "b1", 1, D(8), -0.2f, 0.2f);
        init_f(&G, "wr", 4, D(8, Cx, 1, 1), -0.5f, 0.5f);
        init_f(&G, "w9", 4, D(8, 8, 3, 3), -0.2f, 0.2f);
        float lo = -0.1f, hi = 0.3f, k3 = 1.5f;
        init_vals(&G, "lo", 0, NULL, 1, &lo, sizeof lo);
        init_vals(&G, "hi", 0, NULL, 1, &hi, sizeof hi);
        init_vals(&G, "k3", 0, NULL, 1, &k3, sizeof k3);
        char ins[64];
        float s22[4] = {1, 1, 2, 2};
        init_vals(&G, "s22", 1, D(4), 1, s22, sizeof s22);
        const char *src = "x";
        if (kind && !up_x) node(&G, "Conv", "x w0", "c0", "pads=ii:1,1,1,1"), node(&G, "Relu", "c0", "r0", NULL), src = "r0";
        if (kind == 3) {
            snprintf(ins, sizeof ins, "%s - s22", src);
            node(&G, "Resize", ins, "u", "mode=s:nearest");
            src = "u";
        }
        snprintf(ins, sizeof ins, bias ? "%s w1 b1" : "%s w1", src);
        node(&G, "Conv", ins, "y0", "pads=ii:1,1,1,1");
        const char *y = "y0";
        if (post == 1) node(&G, "Relu", "y0", "y1", NULL), y = "y1";
        if (post == 2) node(&G, "LeakyRelu", "y0", "y1", "alpha=f:0.2"), y = "y1";
        if (post == 3) node(&G, "Clip", "y0 lo hi", "y1", NULL), y = "y1";
        if (post == 4) node(&G, "Relu", "y0", "yr", NULL), node(&G, "Mul", "yr k3", "y1", NULL), y = "y1";
        if (post == 5) node(&G, "Conv", "x wr", "res", NULL), node(&G, "Add", "y0 res", "y1", NULL), y = "y1";
        snprintf(ins, sizeof ins, "%s w9", y);
        node(&G, "Conv", ins, "y", "pads=ii:1,1,1,1");
        io(&G, 12, "y", 4, D(-1, 8, Ho, Wo));
        mts_model *m[4];
        const mts_tensor *out[4][1];
        mts_ctx *c[4];
        mts_tensor *in = NULL;
        int64_t made = 0;
        /* 0: bf16, fp32 hand-offs; 1: bf16; 2: bf16 on oneDNN's steps; 3: the reference backend */
        for (int k = 0; k < 4; k++) {
            mts_load_opts o = {0};
            o.precision = k == 3 ? "fp32" : "bf16";
            o.backend = k == 3 ? "reference" : NULL;
            o.max_error = 1.0; /* (the comparisons below are the check) */
            if (k == 0) setenv("MTS_BF16_NO_HANDOFF", "1", 1);
            if (k == 2) setenv("MTS_NO_BFCONV", "1", 1);
            int64_t before = mts_bfconv_created();
            m[k] = finish_opts(&G, &o);
            if (!in) in = test_make_inputs(m[k], 1 + it % 2 * 2, 5u + (unsigned)it);
            mts_err err = {0};
            assert_int_equal(mts_ctx_create(m[k], 1 + it % 2, &c[k], &err), 0);
            if (mts_ctx_run(c[k], in, 1, out[k], &err)) fail_msg("case %d run %d: %s", it, k, err.msg);
            if (k == 1) made = mts_bfconv_created() - before;
            unsetenv("MTS_BF16_NO_HANDOFF");
            unsetenv("MTS_NO_BFCONV");
        }
        if (!strcmp(mts_model_precision(m[1])->effective, "bf16")) {
            /* the 8-channel convolutions of each plan (the guard's and the run's batch), where
             * the CPU has the instructions */
            int plans = mts_model_plan_count(m[1], NULL), each = 2 + (kind && !up_x && C == 8); /* (c0 too) */
            if (here && made != each * plans)
                fail_msg("case %d: %lld bf16 kernels made for %d plans, expected %d each", it, (long long)made, plans, each);
            int64_t n = mts_tensor_numel(out[0][0]);
            assert_memory_equal(out[0][0]->data, out[1][0]->data, (size_t)n * sizeof(float));
            double e = rel_l2(out[1][0], out[3][0]), e2 = rel_l2(out[1][0], out[2][0]);
            if (!(e <= 2e-2) || !(e2 <= 1e-2))
                fail_msg("case %d (C %lld, W %lld, post %d): relative L2 error %.3g against the reference, %.3g "
                         "against oneDNN's bf16", it, (long long)C, (long long)W, post, e, e2);
        } else if (it == 0) {
            printf("bf16 convolution: no bf16 kernels here (%s); compared nothing\n", mts_model_precision(m[1])->reason);
        }
        for (int k = 0; k < 4; k++) mts_ctx_free(c[k]);
        test_free_inputs(m[0], in);
        for (int k = 0; k < 4; k++) mts_model_free(m[k]);
        free(G.g.p);
    }
#undef RND
}

typedef struct bfc_worker {
    mts_ctx *c;
    const mts_tensor *in;
    const mts_tensor *ref;
    int mismatches, failures;
} bfc_worker;

static void *bfc_worker_run(void *arg)
{
    bfc_worker *w = arg;
    for (int rep = 0; rep < 6; rep++) {
        const mts_tensor *out[1];
        mts_err err = {0};
        if (mts_ctx_run(w->c, w->in, 1, out, &err)) {
            w->failures++;
            continue;
        }
        if (memcmp(out[0]->data, w->ref->data, (size_t)mts_tensor_numel(w->ref) * sizeof(float))) w->mismatches++;
    }
    return NULL;
}

/* Contexts of one bf16 model whose 8-channel convolutions run the kernel (upsampled, plain, and
 * one reading a folded Concat with a head fused after it; two threads each), run from four
 * threads at once: every run's output equals a lone run's, bit for bit (the packed weights are
 * shared and read-only, rings, rows and head bands are per context). */
static void test_bfconv_concurrent(void **state)
{
    (void)state;
    graph G;
    memset(&G, 0, sizeof G);
    G.seed = 77;
    io(&G, 11, "x", 4, D(-1, 4, 9, 37));
    init_f(&G, "w0", 4, D(16, 4, 3, 3), -0.4f, 0.4f);
    init_f(&G, "w1", 4, D(8, 16, 3, 3), -0.3f, 0.3f);
    init_f(&G, "w2", 4, D(8, 8, 3, 3), -0.3f, 0.3f);
    init_f(&G, "w3", 4, D(8, 16, 3, 3), -0.3f, 0.3f);
    init_f(&G, "wh", 4, D(3, 8, 3, 3), -0.4f, 0.4f);
    float s22[4] = {1, 1, 2, 2};
    init_vals(&G, "s22", 1, D(4), 1, s22, sizeof s22);
    node(&G, "Conv", "x w0", "c0", "pads=ii:1,1,1,1");
    node(&G, "Relu", "c0", "r0", NULL);
    node(&G, "Resize", "r0 - s22", "u", "mode=s:nearest");
    node(&G, "Conv", "u w1", "c1", "pads=ii:1,1,1,1");
    node(&G, "Relu", "c1", "r1", NULL);
    node(&G, "Conv", "r1 w2", "c2", "pads=ii:1,1,1,1");
    node(&G, "Relu", "c2", "r2", NULL);
    /* a decoder's last stage: the skip Concat folded into the convolution, the 3-channel head
     * and its Sigmoid fused into it (where the CPU runs the kernel) */
    node(&G, "Concat", "r1 r2", "cat", "axis=i:1");
    node(&G, "Conv", "cat w3", "c3", "pads=ii:1,1,1,1");
    node(&G, "Relu", "c3", "r3", NULL);
    node(&G, "Conv", "r3 wh", "h", "pads=ii:1,1,1,1");
    node(&G, "Sigmoid", "h", "y", NULL);
    io(&G, 12, "y", 4, D(-1, 3, 18, 74));
    mts_load_opts o = {0};
    o.precision = "bf16";
    o.max_error = 1.0;
    int64_t before = mts_bfconv_created();
    mts_model *m = finish_opts(&G, &o);
    mts_tensor *in = test_make_inputs(m, 3, 11);
    mts_err err = {0};
    enum { NW = 4 };
    mts_ctx *c[NW + 1];
    for (int i = 0; i <= NW; i++) assert_int_equal(mts_ctx_create(m, 2, &c[i], &err), 0);
    const mts_tensor *ref[1];
    if (mts_ctx_run(c[NW], in, 1, ref, &err)) fail_msg("lone run: %s", err.msg);
    const char *native = mts_cpu_bf16_native();
    if (native && !strcmp(native, "avx512_bf16") && !strcmp(mts_model_precision(m)->effective, "bf16") &&
        (mts_bfconv_created() - before < 3 || mts_model_op_steps(m, "Concat") || mts_model_op_steps(m, "Conv") != 4))
        fail_msg("the bf16 convolution kernel did not run with the Concat and the head folded (%lld made, %d Concat, "
                 "%d Conv steps of 5 nodes)", (long long)(mts_bfconv_created() - before), mts_model_op_steps(m, "Concat"),
                 mts_model_op_steps(m, "Conv"));
    bfc_worker w[NW];
    pthread_t th[NW];
    for (int i = 0; i < NW; i++) {
        w[i] = (bfc_worker){c[i], in, ref[0], 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, bfc_worker_run, &w[i]), 0);
    }
    for (int i = 0; i < NW; i++) {
        pthread_join(th[i], NULL);
        if (w[i].failures || w[i].mismatches)
            fail_msg("worker %d: %d failed runs, %d outputs unlike the lone run's", i, w[i].failures, w[i].mismatches);
    }
    for (int i = 0; i <= NW; i++) mts_ctx_free(c[i]);
    test_free_inputs(m, in);
    mts_model_free(m);
    free(G.g.p);
}

/* The four plans the fold tests compare, each run once on the same inputs: 0, bf16 as planned;
 * 1, bf16 with the environment variable `off` set (the fold under test off); 2, bf16 without
 * hand-offs; 3, the reference backend in fp32. */
typedef struct fold_runs {
    mts_model *m[4];
    mts_ctx *c[4];
    const mts_tensor *out[4][1];
    mts_tensor *in;
} fold_runs;

static void fold_runs_make(fold_runs *f, graph *G, const char *off, int64_t batch, int threads, unsigned seed, int it)
{
    memset(f, 0, sizeof *f);
    for (int k = 0; k < 4; k++) {
        mts_load_opts o = {0};
        o.precision = k == 3 ? "fp32" : "bf16";
        o.backend = k == 3 ? "reference" : NULL;
        o.max_error = 1.0; /* (the comparisons are the check) */
        if (k == 1) setenv(off, "1", 1);
        if (k == 2) setenv("MTS_BF16_NO_HANDOFF", "1", 1);
        f->m[k] = finish_opts(G, &o);
        if (!f->in) f->in = test_make_inputs(f->m[k], batch, seed);
        mts_err err = {0};
        assert_int_equal(mts_ctx_create(f->m[k], threads, &f->c[k], &err), 0);
        if (mts_ctx_run(f->c[k], f->in, 1, f->out[k], &err)) fail_msg("case %d run %d: %s", it, k, err.msg);
        unsetenv(off);
        unsetenv("MTS_BF16_NO_HANDOFF");
    }
}

/* Plans 0-2 bit for bit alike, plan 0 within 2e-2 (relative L2) of the reference. */
static void fold_runs_check(const fold_runs *f, int it)
{
    int64_t n = mts_tensor_numel(f->out[0][0]);
    assert_memory_equal(f->out[0][0]->data, f->out[1][0]->data, (size_t)n * sizeof(float));
    assert_memory_equal(f->out[0][0]->data, f->out[2][0]->data, (size_t)n * sizeof(float));
    double e = rel_l2(f->out[0][0], f->out[3][0]);
    if (!(e <= 2e-2)) fail_msg("case %d: relative L2 error %.3g against the reference", it, e);
}

static void fold_runs_free(fold_runs *f, graph *G)
{
    for (int k = 0; k < 4; k++) mts_ctx_free(f->c[k]);
    test_free_inputs(f->m[0], f->in);
    for (int k = 0; k < 4; k++) mts_model_free(f->m[k]);
    free(G->g.p);
}

/* A channel Concat of two bf16 convolutions' outputs read only by a bf16 3x3 convolution to
 * 8 channels is folded into it (the kernel reads both parts; kernels/dnnl_backend.c,
 * fold_bf16_concats): parts of 8 + 8 channels (the transposed path) and 6 + 10 (word by word),
 * widths with partial 16- and 32-pixel blocks, one of the parts also read by another step (an
 * encoder's skip); outputs equal, bit for bit, to the plan that keeps the Concat
 * (MTS_NO_CAT_FOLD=1) and to the plan without bf16 hand-offs, and near the reference backend's.
 * A Concat that two convolutions read stays. */
static void test_bfconv_concat_fold(void **state)
{
    (void)state;
    const char *native = mts_cpu_bf16_native();
    bool here = native && !strcmp(native, "avx512_bf16") && __builtin_cpu_supports("avx512bw");
    for (int it = 0; it < 4; it++) {
        int64_t Ca = it == 1 ? 6 : 8, Cb = 16 - Ca, H = 5 + it, W = it == 2 ? 16 : 29 + 9 * it;
        bool twice = it == 3; /* the Concat read by two convolutions: no fold */
        graph G;
        memset(&G, 0, sizeof G);
        G.seed = 900u + (unsigned)it;
        io(&G, 11, "x", 4, D(-1, 3, H, W));
        init_f(&G, "wa", 4, D(Ca, 3, 3, 3), -0.5f, 0.5f);
        init_f(&G, "wb", 4, D(Cb, 3, 3, 3), -0.5f, 0.5f);
        init_f(&G, "w1", 4, D(8, 16, 3, 3), -0.3f, 0.3f);
        init_f(&G, "b1", 1, D(8), -0.2f, 0.2f);
        init_f(&G, "w2", 4, D(8, 8, 3, 3), -0.3f, 0.3f);
        init_f(&G, "ws", 4, D(8, Cb, 3, 3), -0.3f, 0.3f);
        node(&G, "Conv", "x wa", "ca", "pads=ii:1,1,1,1");
        node(&G, "Relu", "ca", "ra", NULL);
        node(&G, "Conv", "x wb", "cb", "pads=ii:1,1,1,1");
        node(&G, "Relu", "cb", "rb", NULL);
        node(&G, "Concat", "ra rb", "cat", "axis=i:1");
        node(&G, "Conv", "cat w1 b1", "c1", "pads=ii:1,1,1,1");
        node(&G, "Relu", "c1", "r1", NULL);
        node(&G, "Conv", "rb ws", "s1", "pads=ii:1,1,1,1"); /* rb read twice: the encoder's skip */
        node(&G, "Add", "r1 s1", "t1", NULL);
        if (twice) {
            node(&G, "Conv", "cat w1", "c2", "pads=ii:1,1,1,1");
            node(&G, "Add", "t1 c2", "t2", NULL);
        }
        node(&G, "Conv", twice ? "t2 w2" : "t1 w2", "y", "pads=ii:1,1,1,1");
        io(&G, 12, "y", 4, D(-1, 8, H, W));
        fold_runs f;
        fold_runs_make(&f, &G, "MTS_NO_CAT_FOLD", 1 + it % 2, 1 + it % 2, 40u + (unsigned)it, it);
        if (!strcmp(mts_model_precision(f.m[0])->effective, "bf16")) {
            int cats = mts_model_op_steps(f.m[0], "Concat"), kept = mts_model_op_steps(f.m[1], "Concat");
            assert_int_equal(kept, 1);
            if (here && cats != (twice ? 1 : 0)) fail_msg("case %d: %d Concat steps left, expected %d", it, cats, twice ? 1 : 0);
            fold_runs_check(&f, it);
        }
        fold_runs_free(&f, &G);
    }
}

/* A small-channel head (2-4 outputs, 3x3) on a bf16 3x3 convolution to 8 channels, and the
 * Relu or Sigmoid after it, run inside that convolution (kernels/dnnl_backend.c,
 * fold_small_heads; kernels/bfconv.c, bands of its rows): heights across several bands, widths
 * with partial blocks, one and two threads, batch 1 and 3, a bias or none, the head's output read
 * by a further convolution (stored channels-last), the convolution reading a folded Concat; one
 * output channel (not the small-channel kernel's case with 8 inputs: no fold). Each case: bits
 * equal to the plan that keeps the head apart (MTS_NO_HEAD_FOLD=1) and to the plan without bf16
 * hand-offs, near the reference backend; one Conv step fewer where the kernel runs. */
static void test_bfconv_head_fold(void **state)
{
    (void)state;
    const char *native = mts_cpu_bf16_native();
    bool here = native && !strcmp(native, "avx512_bf16") && __builtin_cpu_supports("avx512bw");
    for (int it = 0; it < 8; it++) {
        int64_t M = it == 7 ? 1 : 2 + it % 3, H = it % 2 ? 21 : 7 + it, W = 13 + 11 * it;
        int act = it % 3; /* 0: none, 1: Relu, 2: Sigmoid */
        bool bias = it % 2 == 0, after = it == 4, cat = it == 5 || it == 6;
        graph G;
        memset(&G, 0, sizeof G);
        G.seed = 1200u + (unsigned)it;
        io(&G, 11, "x", 4, D(-1, 3, H, W));
        init_f(&G, "wa", 4, D(16, 3, 3, 3), -0.5f, 0.5f);
        init_f(&G, "wc", 4, D(8, 3, 3, 3), -0.5f, 0.5f);
        init_f(&G, "wd", 4, D(8, 3, 3, 3), -0.5f, 0.5f);
        init_f(&G, "w1", 4, D(8, 16, 3, 3), -0.3f, 0.3f);
        init_f(&G, "b1", 1, D(8), -0.2f, 0.2f);
        init_f(&G, "wh", 4, D(M, 8, 3, 3), -0.4f, 0.4f);
        init_f(&G, "bh", 1, D(M), -0.3f, 0.3f);
        init_f(&G, "wz", 4, D(16, M, 3, 3), -0.3f, 0.3f);
        if (cat) { /* two 8-channel bf16 convolutions concatenated, as a UNet's last decoder stage */
            node(&G, "Conv", "x wc", "cc", "pads=ii:1,1,1,1");
            node(&G, "Relu", "cc", "rc", NULL);
            node(&G, "Conv", "x wd", "cd", "pads=ii:1,1,1,1");
            node(&G, "Relu", "cd", "rd", NULL);
            node(&G, "Concat", "rc rd", "r0", "axis=i:1");
        } else {
            node(&G, "Conv", "x wa", "c0", "pads=ii:1,1,1,1");
            node(&G, "Relu", "c0", "r0", NULL);
        }
        node(&G, "Conv", "r0 w1 b1", "c1", "pads=ii:1,1,1,1");
        node(&G, "Relu", "c1", "r1", NULL);
        node(&G, "Conv", bias ? "r1 wh bh" : "r1 wh", "h", "pads=ii:1,1,1,1");
        const char *y = "h";
        if (act == 1) node(&G, "Relu", "h", "ha", NULL), y = "ha";
        if (act == 2) node(&G, "Sigmoid", "h", "ha", NULL), y = "ha";
        if (after) {
            char ins[32];
            snprintf(ins, sizeof ins, "%s wz", y);
            node(&G, "Conv", ins, "z", "pads=ii:1,1,1,1");
            y = "z";
        }
        char yname[8];
        snprintf(yname, sizeof yname, "%s", y);
        node(&G, "Identity", yname, "y", NULL);
        io(&G, 12, "y", 4, D(-1, after ? 16 : M, H, W));
        fold_runs f;
        fold_runs_make(&f, &G, "MTS_NO_HEAD_FOLD", 1 + it % 2 * 2, 1 + (it / 2) % 2, 60u + (unsigned)it, it);
        if (!strcmp(mts_model_precision(f.m[0])->effective, "bf16")) {
            int convs = mts_model_op_steps(f.m[0], "Conv"), kept = mts_model_op_steps(f.m[1], "Conv");
            int expect = here && M > 1 ? kept - 1 : kept;
            if (convs != expect) fail_msg("case %d: %d Conv steps, %d without the fold, expected %d", it, convs, kept, expect);
            fold_runs_check(&f, it);
        }
        fold_runs_free(&f, &G);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_fast_fusions),
        cmocka_unit_test(test_quant),
        cmocka_unit_test(test_quant_tables),
        cmocka_unit_test(test_upsample_conv),
        cmocka_unit_test(test_nhwc_export),
        cmocka_unit_test(test_layernorm_written),
        cmocka_unit_test(test_winograd),
        cmocka_unit_test(test_reference_models),
        cmocka_unit_test(test_bf16_concat_inputs),
        cmocka_unit_test(test_small_conv_act),
        cmocka_unit_test(test_dwsep),
        cmocka_unit_test(test_dwsep_random),
        cmocka_unit_test(test_bf16_dwsep),
        cmocka_unit_test(test_bfconv),
        cmocka_unit_test(test_bfconv_concurrent),
        cmocka_unit_test(test_bfconv_concat_fold),
        cmocka_unit_test(test_bfconv_head_fold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
