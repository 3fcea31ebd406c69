/*
 * The oneDNN backend's entry in the backend table: which steps it claims, and how it runs them.
 *
 * Claim (once per plan, after Identity removal): every Conv/ConvTranspose that oneDNN can run
 * becomes one step, and so do MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool (no
 * fusion) and MatMul / Gemm with constant 2-D weights (a following Add of a constant row becomes
 * the bias): a following BatchNormalization is folded into the weights and bias, then a chain of
 * single-reader followers becomes oneDNN post-ops: Relu, LeakyRelu, Clip, Sigmoid, Tanh,
 * HardSwish, HardSigmoid, GELU written out as Div/Erf/Add/Mul/Mul, and a residual Add of a
 * same-shape tensor computed earlier. A convolution may also absorb the nearest integer
 * upsampling (Resize) before it, as one small convolution per output phase (dnnl_conv.c).
 * int8 convolutions (QLinearConv, the quant backend's fused QDQ convolutions among them, and
 * ConvInteger) with constant weights and parameters become int8 primitives (q8_eligible), with
 * a following integer Relu / LeakyRelu as post-ops.
 * Convolutions and pools anchor the optimizer's channels-last groups (layout_anchor).
 * Commit (after the layout choice): the primitives are created with the chosen layouts, on a
 * few threads; a step oneDNN cannot run well is declined (it then runs the reference kernel,
 * with no fusion) and the optimizer starts over. Finish: the scratch size at one thread, and the
 * unpacked weights are released (weights.c), since the packed ones live in the model's cache.
 *
 * Execution: per context, a oneDNN stream and primitives for the context's thread count
 * (prepare); each step runs its primitive with the context's scratch memory.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/bfconv.h"
#include "engine/kernels/dnnl_ops.h"
#include "engine/rewrite.h"
#include "engine/weights.h"
#include "util/par_items.h"

_Static_assert(MTS_DPOST_MAX <= MTS__STEP_EXTRA_IN, "a claimed step's residual inputs must fit");

typedef struct cinfo {
    int step;
    mts_dconv_spec spec;
    void *wtmp;     /* BN-folded float weights or zero-point-shifted int8 weights (malloc'd; freed
                     * once packed) */
    float *bfold;   /* BN-folded bias (plan pool) */
    void *wtmp2;    /* a depthwise-separable pair: the pointwise convolution's wtmp */
    bool merged;    /* folded into the depthwise convolution before it (pair_dwsep) */
    int resid[MTS_DPOST_MAX];
    int n_resid;
    int create_rc;  /* mts_dconv_create's result (create_all) */
    mts_dconv *dc;  /* ... and the primitive it made */
    mts_err create_err;
} cinfo;

static float clip_bound(const mts__plan *p, const mts__step *st, int idx, const char *attr, float dflt, bool *ok)
{
    if (st->nd->opset < 11) return mts_attr_float(st->nd, attr, dflt);
    if (idx >= st->n_in || st->in[idx] < 0) return dflt;
    int v = st->in[idx];
    if (!const_value(p, v) || p->vals[v].dtype != MTS_DTYPE_FLOAT || mts_tensor_numel(&p->vals[v]) != 1) {
        *ok = false;
        return dflt;
    }
    return ((const float *)p->vals[v].data)[0];
}

/* A post-op for step st reading x, or false. */
static bool as_postop(const mts__opt *o, const mts__step *st, int x, mts_dpost *po, int *resid)
{
    const mts__plan *p = o->p;
    if (st->dynamic || st->kind != MTS__S_KERNEL || st->n_out != 1 || st->out[0] < 0) return false;
    if (p->vals[st->out[0]].dtype != MTS_DTYPE_FLOAT) return false;
    memset(po, 0, sizeof *po);
    *resid = -1;
    /* x * c, x / c, x + c, x - c, c - x with c a constant float scalar: a linear post-op;
     * Max(x, c) and Min(x, c) (tf2onnx's floor and ceiling after an activation): a clip */
    if (st->n_in == 2 && (st->in[0] == x || st->in[1] == x) && st->in[0] != st->in[1] && st->nd->opset >= 7) {
        int k = st->in[0] == x ? st->in[1] : st->in[0];
        float c;
        if (mts__const_scalar(p, k, &c) && mts_tensor_numel(&p->vals[x]) == mts_tensor_numel(&p->vals[st->out[0]]) &&
            isfinite(c)) {
            po->kind = MTS_DPOST_LINEAR;
            if (is_op(st, "Mul")) po->alpha = c, po->beta = 0.0f;
            else if (is_op(st, "Add")) po->alpha = 1.0f, po->beta = c;
            else if (is_op(st, "Sub") && st->in[0] == x) po->alpha = 1.0f, po->beta = -c;
            else if (is_op(st, "Sub")) po->alpha = -1.0f, po->beta = c;
            else if (is_op(st, "Div") && st->in[0] == x && c != 0.0f) po->alpha = 1.0f / c, po->beta = 0.0f;
            else if (is_op(st, "Max") && st->nd->opset >= 8) po->kind = MTS_DPOST_CLIP, po->alpha = c, po->beta = FLT_MAX;
            else if (is_op(st, "Min") && st->nd->opset >= 8) po->kind = MTS_DPOST_CLIP, po->alpha = -FLT_MAX, po->beta = c;
            else po->kind = 0;
            if (po->kind) return true;
        }
    }
    if (is_op(st, "Add")) {
        if (st->n_in != 2) return false;
        int r = st->in[0] == x ? st->in[1] : st->in[0];
        if (r == x || !live_value(p, r) || !mts_shape_equal(&p->vals[r], &p->vals[x]) ||
            p->vals[r].dtype != MTS_DTYPE_FLOAT)
            return false;
        po->kind = MTS_DPOST_ADD;
        *resid = r;
        return true;
    }
    if (st->in[0] != x) return false;
    if (is_op(st, "Relu")) {
        po->kind = MTS_DPOST_RELU;
    } else if (is_op(st, "LeakyRelu")) {
        po->kind = MTS_DPOST_RELU;
        po->alpha = mts_attr_float(st->nd, "alpha", 0.01f);
    } else if (is_op(st, "Sigmoid")) {
        po->kind = MTS_DPOST_SIGMOID;
    } else if (is_op(st, "Tanh")) {
        po->kind = MTS_DPOST_TANH;
    } else if (is_op(st, "HardSwish")) {
        po->kind = MTS_DPOST_HARDSWISH;
    } else if (is_op(st, "HardSigmoid")) {
        po->kind = MTS_DPOST_HARDSIGMOID;
        po->alpha = mts_attr_float(st->nd, "alpha", 0.2f);
        po->beta = mts_attr_float(st->nd, "beta", 0.5f);
    } else if (is_op(st, "Clip")) {
        bool ok = true;
        po->kind = MTS_DPOST_CLIP;
        po->alpha = clip_bound(p, st, 1, "min", -FLT_MAX, &ok);
        po->beta = clip_bound(p, st, 2, "max", FLT_MAX, &ok);
        if (!ok || !(po->alpha <= po->beta)) return false;
    } else {
        return false;
    }
    return true;
}

/* The oneDNN eltwise post-ops (kind, alpha, beta) a fused activation becomes (dnnl_conv.c):
 * Relu / LeakyRelu one relu, Clip one clip, HardSigmoid a linear and a clip, the others one
 * each without parameters. Returns how many. */
static int post_algs(const mts_dpost *p, float a[2][3])
{
    switch (p->kind) {
    case MTS_DPOST_HARDSIGMOID:
        a[0][0] = 1, a[0][1] = p->alpha, a[0][2] = p->beta; /* linear */
        a[1][0] = 2, a[1][1] = 0.0f, a[1][2] = 1.0f;        /* clip */
        return 2;
    case MTS_DPOST_CLIP:
        a[0][0] = 2, a[0][1] = p->alpha, a[0][2] = p->beta;
        return 1;
    case MTS_DPOST_RELU:
        a[0][0] = 3, a[0][1] = p->alpha, a[0][2] = 0.0f;
        return 1;
    case MTS_DPOST_ADD:
        return 0;
    default: /* sigmoid, tanh, hardswish, gelu: no parameters */
        a[0][0] = 10 + (float)p->kind, a[0][1] = a[0][2] = 0.0f;
        return 1;
    }
}

/* Whether po would repeat an eltwise post-op kind of s's with other parameters: oneDNN 2.6's
 * brgemm convolutions (fp32 and int8) compute the later one with the earlier one's parameters
 * (a Clip then a HardSigmoid, a Relu then a LeakyRelu), so such a chain stops fusing there. */
static bool post_conflict(const mts_dconv_spec *s, const mts_dpost *po)
{
    float a[2][3], b[2][3];
    int na = post_algs(po, a);
    for (int i = 0; i < s->n_post; i++) {
        int nb = post_algs(&s->post[i], b);
        for (int x = 0; x < na; x++)
            for (int y = 0; y < nb; y++)
                if (a[x][0] == b[y][0] && (a[x][1] != b[y][1] || a[x][2] != b[y][2])) return true;
    }
    return false;
}

/* The two steps reading x, when x is read exactly twice and is no graph output (the written-out
 * activations below read their input twice). */
static bool two_readers(const mts__opt *o, int x, int rd[2])
{
    const mts__plan *p = o->p;
    if (x < 0 || o->nuse[x] != 2 || o->is_out[x]) return false;
    int n = 0;
    for (int s = 0; s < p->n_steps && n < 2; s++) {
        if (o->removed[s]) continue;
        for (int j = 0; j < p->steps[s].n_in; j++)
            if (p->steps[s].in[j] == x) {
                rd[n++] = s;
                break;
            }
    }
    return n == 2;
}

/* GELU written out, as exported from PyTorch: y = (x * (erf(x / sqrt2) + 1)) * 0.5, x read twice.
 * On a match, marks the five nodes removed and returns the last one's output; else -1. */
static int gelu_pattern(mts__opt *o, int x)
{
    mts__plan *p = o->p;
    int rd[2];
    if (!two_readers(o, x, rd)) return -1;
    for (int first = 0; first < 2; first++) {
        int d = rd[first], mul = rd[1 - first];
        if (fabsf(mts__scaled_by(p, &p->steps[d], x) - 0.70710678f) > 1e-5f) continue;
        int e = sole_reader(o, p->steps[d].out[0]);
        if (e < 0 || !is_op(&p->steps[e], "Erf") || p->steps[e].dynamic) continue;
        int a = sole_reader(o, p->steps[e].out[0]);
        if (a < 0 || !is_op(&p->steps[a], "Add") || p->steps[a].n_in != 2) continue;
        int ea = p->steps[e].out[0], one = p->steps[a].in[0] == ea ? p->steps[a].in[1] : p->steps[a].in[0];
        float f;
        if (!mts__const_scalar(p, one, &f) || f != 1.0f) continue;
        const mts__step *m1 = &p->steps[mul];
        int aa = p->steps[a].out[0];
        if (!is_op(m1, "Mul") || m1->n_in != 2 || m1->dynamic ||
            !((m1->in[0] == x && m1->in[1] == aa) || (m1->in[1] == x && m1->in[0] == aa)) ||
            sole_reader(o, aa) != mul)
            continue;
        int m2 = sole_reader(o, m1->out[0]);
        if (m2 < 0 || mts__scaled_by(p, &p->steps[m2], m1->out[0]) != 0.5f) continue;
        int steps[5] = {d, e, a, mul, m2};
        for (int i = 0; i < 5; i++) {
            o->removed[steps[i]] = 1;
            if (i < 4) p->state[p->steps[steps[i]].out[0]] = MTS__V_UNUSED;
        }
        p->state[x] = MTS__V_UNUSED;
        return p->steps[m2].out[0];
    }
    return -1;
}

/* HardSwish written out, as paddle2onnx exports it: y = x * clip(x + 3, 0, 6) / 6 (or * 1/6), x
 * read twice. On a match, marks the four nodes removed and returns the last one's output; else
 * -1. */
static int hardswish_pattern(mts__opt *o, int x)
{
    mts__plan *p = o->p;
    int rd[2];
    if (!two_readers(o, x, rd)) return -1;
    for (int first = 0; first < 2; first++) {
        int a = rd[first], mul = rd[1 - first];
        const mts__step *sa = &p->steps[a], *sm = &p->steps[mul];
        float three;
        if (!plain_step(o, a, "Add") || sa->n_in != 2) continue;
        int k = sa->in[0] == x ? sa->in[1] : sa->in[0];
        if (!mts__const_scalar(p, k, &three) || three != 3.0f) continue;
        int c = sole_reader(o, sa->out[0]);
        if (!plain_step(o, c, "Clip") || p->steps[c].in[0] != sa->out[0]) continue;
        bool ok = true;
        float lo = clip_bound(p, &p->steps[c], 1, "min", -FLT_MAX, &ok), hi = clip_bound(p, &p->steps[c], 2, "max", FLT_MAX, &ok);
        if (!ok || lo != 0.0f || hi != 6.0f) continue;
        int co = p->steps[c].out[0];
        if (!plain_step(o, mul, "Mul") || sm->n_in != 2 ||
            !((sm->in[0] == x && sm->in[1] == co) || (sm->in[1] == x && sm->in[0] == co)) || sole_reader(o, co) != mul)
            continue;
        int d = sole_reader(o, sm->out[0]);
        if (d < 0 || fabsf(mts__scaled_by(p, &p->steps[d], sm->out[0]) - 1.0f / 6.0f) > 1e-7f) continue;
        if (p->vals[p->steps[d].out[0]].dtype != MTS_DTYPE_FLOAT ||
            !mts_shape_equal(&p->vals[p->steps[d].out[0]], &p->vals[x]))
            continue;
        int steps[4] = {a, c, mul, d};
        for (int i = 0; i < 4; i++) {
            o->removed[steps[i]] = 1;
            if (i < 3) p->state[p->steps[steps[i]].out[0]] = MTS__V_UNUSED;
        }
        p->state[x] = MTS__V_UNUSED;
        return p->steps[d].out[0];
    }
    return -1;
}

/* MatMul followed by Add of a constant [N] (or [1.., N]) row: that row is the bias. */
static bool matmul_bias(const mts__opt *o, const mts__step *st, int x, int64_t N, const float **bias)
{
    const mts__plan *p = o->p;
    if (st->dynamic || st->kind != MTS__S_KERNEL || !is_op(st, "Add") || st->n_in != 2 || st->n_out != 1) return false;
    int r = st->in[0] == x ? st->in[1] : st->in[0];
    if (r == x || !const_value(p, r)) return false;
    const mts_tensor *t = &p->vals[r];
    if (t->dtype != MTS_DTYPE_FLOAT || mts_tensor_numel(t) != N || t->rank < 1 || t->dims[t->rank - 1] != N ||
        t->rank > p->vals[x].rank || !mts_shape_equal(&p->vals[st->out[0]], &p->vals[x]))
        return false;
    *bias = t->data;
    return true;
}

/* Creating the oneDNN steps of a plan (packing weights, compiling kernels) on several threads:
 * each creation is independent; w32's 60 take ~90 ms on one thread. */
#define CREATE_THREADS 4
typedef struct create_job {
    cinfo *ci;
} create_job;

static void create_one(void *arg, int i)
{
    create_job *j = arg;
    cinfo *c = &j->ci[i];
    c->create_err.msg[0] = 0;
    c->dc = NULL;
    c->create_rc = mts_dconv_create(&c->spec, &c->dc, &c->create_err);
}

/* Creations run on one thread when any is an int8 convolution: with oneDNN 2.6, an fp32
 * convolution whose primitives were created while int8 ones were created on another thread
 * sometimes computed garbage on two threads (seen on a QDQ U-Net: its first, fp32 conv, about
 * 1 run in 40; never with serial creation in 600 runs, nor without int8 primitives). */
static void create_all(cinfo *ci, int n)
{
    create_job j = {ci};
    bool q8 = false;
    for (int i = 0; i < n; i++) q8 |= ci[i].spec.q8;
    mts_par_items(n, q8 ? 1 : CREATE_THREADS, 4, create_one, &j); /* a few steps: not worth a thread */
}

/* Is step s a convolution or pooling oneDNN may run? Fills c->spec's geometry and
 * weights. */
static bool conv_eligible(mts__opt *o, int s, const uint8_t *no_dnnl, void **cache, cinfo *c)
{
    mts__plan *p = o->p;
    mts__step *st = &p->steps[s];
    if (st->dynamic || st->kind != MTS__S_KERNEL || no_dnnl[st->node] || st->n_in < 1 || !live_value(p, st->in[0]))
        return false;
    const mts_tensor *x = &p->vals[st->in[0]];
    bool mm = is_op(st, "MatMul"), gemm = is_op(st, "Gemm");
    if (x->dtype != MTS_DTYPE_FLOAT || x->rank < (mm || gemm ? 2 : 3) || x->rank > 5 || mts_tensor_numel(x) == 0)
        return false;
    memset(c, 0, sizeof *c);
    c->step = s;
    const mts_model *root = o->m;
    while (root->root) root = root->root;
    c->spec.bf16 = root->bf16;
    c->spec.half_weights = root->f16w;
    c->spec.key = st->node;
    c->spec.cache = cache;
    mts_err e = {0};
    mts_tensor kout[2];
    bool maxp = is_op(st, "MaxPool"), avgp = is_op(st, "AveragePool");
    if (maxp || avgp) {
        if (st->n_out < 1 || st->out[0] < 0) return false;
        if (st->n_out > 1 && st->out[1] >= 0 && (o->nuse[st->out[1]] > 0 || o->is_out[st->out[1]])) return false;
        const mts_tensor *kin[1] = {x};
        mts_kctx k = {st->nd, kin, 1, kout, 1, &e, 1, NULL};
        if (mts_pool_geometry(&k, maxp, &c->spec.g) != MTS_OK) return false;
        c->spec.kind = maxp ? MTS_DPRIM_POOL_MAX
                            : mts_attr_int(st->nd, "count_include_pad", 0) ? MTS_DPRIM_POOL_AVG_INCLUDE
                                                                          : MTS_DPRIM_POOL_AVG_EXCLUDE;
        return true;
    }
    bool gavg = is_op(st, "GlobalAveragePool"), gmax = is_op(st, "GlobalMaxPool");
    if (gavg || gmax) {
        if (st->n_out != 1 || st->out[0] < 0) return false;
        mts_conv_geom *g = &c->spec.g;
        g->nsp = x->rank - 2;
        g->N = x->dims[0], g->C = g->M = x->dims[1], g->group = 1;
        for (int i = 0; i < 3; i++) {
            int j = i - (3 - g->nsp);
            g->in[i] = g->k[i] = j >= 0 ? x->dims[2 + j] : 1;
            g->s[i] = g->d[i] = g->out[i] = 1;
        }
        c->spec.kind = gmax ? MTS_DPRIM_POOL_MAX : MTS_DPRIM_POOL_AVG_EXCLUDE;
        return true;
    }
    if (mm || gemm) {
        /* Constant 2-D weights; A's leading dims flatten into rows. */
        if (st->n_out != 1 || st->n_in < 2 || !const_value(p, st->in[1]) || x->rank < 2) return false;
        const mts_tensor *w = &p->vals[st->in[1]];
        if (w->dtype != MTS_DTYPE_FLOAT || w->rank != 2) return false;
        bool tb = gemm && mts_attr_int(st->nd, "transB", 0);
        int64_t K = x->dims[x->rank - 1], N = tb ? w->dims[0] : w->dims[1];
        if ((tb ? w->dims[1] : w->dims[0]) != K || K < 1 || N < 1) return false;
        const float *bias = NULL;
        if (gemm) {
            if (x->rank != 2 || mts_attr_int(st->nd, "transA", 0) || mts_attr_float(st->nd, "alpha", 1.0f) != 1.0f)
                return false;
            if (st->n_in > 2 && st->in[2] >= 0) {
                const mts_tensor *cb = &p->vals[st->in[2]];
                if (!const_value(p, st->in[2]) || cb->dtype != MTS_DTYPE_FLOAT || mts_tensor_numel(cb) != N ||
                    cb->dims[cb->rank - 1] != N || mts_attr_float(st->nd, "beta", 1.0f) != 1.0f)
                    return false;
                bias = cb->data;
            }
        } else if (st->n_in != 2) {
            return false;
        }
        int64_t rows = mts_tensor_numel(x) / K;
        if ((double)rows * (double)K * (double)N < 16384) return false; /* tiny: reference GEMM */
        mts_conv_geom *g = &c->spec.g;
        g->nsp = 0, g->N = rows, g->C = K, g->M = N, g->group = 1;
        c->spec.kind = MTS_DPRIM_MATMUL;
        c->spec.transpose = tb;
        c->spec.w = w->data;
        c->spec.b = bias;
        return true;
    }
    bool tr = is_op(st, "ConvTranspose");
    if (!tr && !is_op(st, "Conv")) return false;
    if (st->n_in < 2 || st->n_out != 1 || !const_value(p, st->in[1])) return false;
    if (st->n_in > 2 && st->in[2] >= 0 && !const_value(p, st->in[2])) return false;
    const mts_tensor *kin[3] = {x, &p->vals[st->in[1]], st->n_in > 2 && st->in[2] >= 0 ? &p->vals[st->in[2]] : NULL};
    mts_kctx k = {st->nd, kin, st->n_in > 3 ? 3 : st->n_in, kout, 1, &e, 1, NULL};
    if (mts_conv_geometry(&k, tr, &c->spec.g) != MTS_OK) return false;
    /* Tiny convolutions on one pixel (attention MLPs): the reference kernel is as fast and a
     * oneDNN primitive would cost JIT code and per-call setup. */
    const mts_conv_geom *g = &c->spec.g;
    double macs = (double)g->N * (double)g->M * (double)(g->C / g->group) * (double)(g->k[0] * g->k[1] * g->k[2]) *
                  (double)(g->out[0] * g->out[1] * g->out[2]);
    if (g->out[0] * g->out[1] * g->out[2] == 1 && macs < 65536) return false;
    /* One output channel from a few (CBAM's spatial-attention conv): the direct kernel in
     * fast.c uses every vector lane, oneDNN's blocked kernels waste most of them. */
    if (!tr && mts_fast_conv_small_ok(g) && mts_fast_enabled()) return false;
    c->spec.kind = tr ? MTS_DPRIM_DECONV : MTS_DPRIM_CONV;
    c->spec.transpose = tr;
    c->spec.w = kin[1]->data;
    c->spec.b = kin[2] ? kin[2]->data : NULL;
    return true;
}

/* A constant or absent zero point's value (element 0), or false when v is neither. */
static bool q8_const_zp(const mts__plan *p, int v, int32_t *zp)
{
    *zp = 0;
    if (v < 0) return true;
    if (!const_value(p, v)) return false;
    const mts_tensor *t = &p->vals[v];
    if (t->dtype == MTS_DTYPE_UINT8) *zp = ((const uint8_t *)t->data)[0];
    else if (t->dtype == MTS_DTYPE_INT8) *zp = ((const int8_t *)t->data)[0];
    else return false;
    return true;
}

/* Is step s an int8 convolution oneDNN may run (QLinearConv, a fused QDQ convolution among
 * them (quant_backend.c), or ConvInteger)? Constant weights (int8, or uint8 / int8 with zero
 * points such that w - w_zero_point fits in int8: those differences become the int8 weights),
 * scales, bias and destination zero point, a 1-D or 2-D kernel; the source's zero point may be
 * computed (ConvInteger after DynamicQuantizeLinear). Fills c->spec: the output scales
 * x_scale * w_scale / y_scale and the int32 bias are computed as the integer kernels
 * (ref_quant.c) compute them. MTS_NO_DNNL_INT8=1 keeps these convolutions on the integer
 * kernels. */
static bool q8_eligible(mts__opt *o, int s, const uint8_t *no_dnnl, void **cache, cinfo *c)
{
    mts__plan *p = o->p;
    mts__step *st = &p->steps[s];
    bool ql = is_op(st, "QLinearConv");
    if ((!ql && !is_op(st, "ConvInteger")) || st->dynamic || st->kind != MTS__S_KERNEL || no_dnnl[st->node] ||
        st->n_out != 1 || st->out[0] < 0 || st->n_in < 2 || getenv("MTS_NO_DNNL_INT8"))
        return false;
    /* the kernel validates the inputs (types, parameter shapes, geometry) */
    const mts_op *op = mts_op_lookup(st->nd->op_type);
    const mts_tensor *kin[9];
    int n_in = st->n_in > 9 ? 9 : st->n_in;
    for (int i = 0; i < n_in; i++) kin[i] = st->in[i] >= 0 ? &p->vals[st->in[i]] : NULL;
    mts_tensor kout = {0};
    mts_err e = {0};
    mts_kctx k = {st->nd, kin, n_in, &kout, 1, &e, 1, NULL};
    if (!op || op->infer(&k) != MTS_OK) return false;
    int ix = 0, iw = ql ? 3 : 1, ixz = 2, iwz = ql ? 5 : 3;
    int x = st->in[ix], w = st->in[iw], xz = n_in > ixz ? st->in[ixz] : -1, wz = n_in > iwz ? st->in[iwz] : -1;
    if (!live_value(p, x) || !const_value(p, w) || p->vals[x].rank > 4 || mts_tensor_numel(&p->vals[x]) == 0 ||
        (wz >= 0 && !const_value(p, wz)))
        return false;
    /* oneDNN's int8 convolutions take int8 weights without a zero point: w - w_zero_point
     * (per tensor or per output channel, uint8 or int8 weights) must fit in int8 */
    const mts_tensor *wt = &p->vals[w];
    int64_t nw = mts_tensor_numel(wt), M0 = wt->dims[0], per = M0 > 0 ? nw / M0 : 0;
    const mts_tensor *zt = wz >= 0 ? &p->vals[wz] : NULL;
    bool zs = zt && mts_tensor_numel(zt) > 1, sgn = wt->dtype == MTS_DTYPE_INT8, shift = zt || !sgn;
    if (M0 < 1) return false;
    if (shift)
        for (int64_t i = 0; i < nw; i++) {
            int64_t zi = zs ? i / per : 0;
            int32_t z = !zt ? 0 : sgn ? ((const int8_t *)zt->data)[zi] : ((const uint8_t *)zt->data)[zi];
            int32_t v = (sgn ? ((const int8_t *)wt->data)[i] : ((const uint8_t *)wt->data)[i]) - z;
            if (v < -128 || v > 127) return false;
        }
    memset(c, 0, sizeof *c);
    c->step = s;
    c->spec.key = st->node;
    c->spec.cache = cache;
    c->spec.kind = MTS_DPRIM_CONV;
    c->spec.q8 = true;
    c->spec.q8_src = p->vals[x].dtype;
    c->spec.q8_dst = kout.dtype;
    c->spec.qw = wt->data;
    bool xz_rt = xz >= 0 && !const_value(p, xz);
    if (xz_rt ? !live_value(p, xz) : !q8_const_zp(p, xz, &c->spec.q8_zp[0])) return false;
    mts_tensor xf = p->vals[x], wf = p->vals[w];
    xf.dtype = wf.dtype = MTS_DTYPE_FLOAT;
    const mts_tensor *gin[2] = {&xf, &wf};
    mts_kctx gk = {st->nd, gin, 2, &kout, 1, &e, 1, NULL};
    if (mts_conv_geometry(&gk, false, &c->spec.g) != MTS_OK || c->spec.g.nsp > 2) return false;
    const mts_conv_geom *g = &c->spec.g;
    double macs = (double)g->N * (double)g->M * (double)(g->C / g->group) * (double)(g->k[0] * g->k[1] * g->k[2]) *
                  (double)(g->out[0] * g->out[1] * g->out[2]);
    if (macs < 65536) return false; /* tiny: the integer kernel is as fast */
    int fuse_act = -1;
    if (ql) {
        int xs = st->in[1], ws = st->in[4], ys = st->in[6], yz = st->in[7], b = n_in > 8 ? st->in[8] : -1;
        if (!const_value(p, xs) || !const_value(p, ws) || !const_value(p, ys) || (b >= 0 && !const_value(p, b)) ||
            !q8_const_zp(p, yz, &c->spec.q8_zp[1]))
            return false;
        int64_t M = g->M, nw = mts_tensor_numel(&p->vals[ws]);
        float *sc = mts_pool_alloc(&p->pool, sizeof(float) * (size_t)M);
        int32_t *bq = b >= 0 ? mts_pool_alloc(&p->pool, sizeof(int32_t) * (size_t)M) : NULL;
        if (!sc || (b >= 0 && !bq)) return false;
        float fxs = ((const float *)p->vals[xs].data)[0], fys = ((const float *)p->vals[ys].data)[0];
        const float *fws = p->vals[ws].data;
        bool fb = mts_attr_int(st->nd, "mts_float_bias", 0) != 0;
        for (int64_t m = 0; m < M; m++) {
            float wsm = fws[nw == 1 ? 0 : m];
            sc[m] = fxs * wsm / fys; /* as the integer kernels' requantization */
            if (!isfinite(sc[m])) return false; /* the integer kernels' saturation rules hold */
            if (!bq) continue;
            if (!fb) {
                bq[m] = ((const int32_t *)p->vals[b].data)[m];
            } else { /* the fused QDQ convolution's float bias, requantized */
                double v = rint((double)((const float *)p->vals[b].data)[m] / ((double)fxs * wsm));
                bq[m] = v >= -2147483648.0 && v <= 2147483647.0 ? (int32_t)v : v > 0 ? INT32_MAX : INT32_MIN;
            }
        }
        c->spec.qscale = sc;
        c->spec.q8_nscale = nw == 1 ? 1 : M;
        c->spec.qbias = bq;
        /* an integer Relu / LeakyRelu reading only this output: post-ops that replay it */
        int r = sole_reader(o, st->out[0]);
        if (r >= 0 && plain_step(o, r, "MtsQLinearUnary") && p->steps[r].n_in == 5 &&
            p->steps[r].in[0] == st->out[0] && p->steps[r].out[0] >= 0 && !getenv("MTS_NO_DNNL_INT8_FUSE")) {
            const mts__step *u = &p->steps[r];
            int64_t kind = mts_attr_int(u->nd, "mts_qop", 0);
            float uxs = ((const float *)p->vals[u->in[1]].data)[0], uys = ((const float *)p->vals[u->in[3]].data)[0];
            int32_t uxz, uyz;
            if ((kind == 1 || kind == 2) && const_value(p, u->in[1]) && const_value(p, u->in[3]) &&
                q8_const_zp(p, u->in[2], &uxz) && q8_const_zp(p, u->in[4], &uyz) && u->in[4] >= 0 &&
                p->vals[u->in[2]].dtype == kout.dtype && uxz == c->spec.q8_zp[1] && isfinite(uxs) && isfinite(uys) &&
                uys != 0.0f) {
                c->spec.q8_act = true;
                c->spec.q8_mid = kout.dtype;
                c->spec.q8_mid_zp = c->spec.q8_zp[1];
                c->spec.q8_act_xs = uxs;
                c->spec.q8_act_ys = uys;
                c->spec.q8_act_alpha = kind == 1 ? 0.0f : mts_attr_float(u->nd, "alpha", 0.01f);
                c->spec.q8_dst = p->vals[u->out[0]].dtype;
                c->spec.q8_zp[1] = uyz;
                fuse_act = r;
            }
        }
    }
    if (shift) { /* the int8 weights w - w_zero_point, checked in range above */
        int8_t *sw = malloc((size_t)nw);
        if (!sw) return false;
        for (int64_t i = 0; i < nw; i++) {
            int64_t zi = zs ? i / per : 0;
            int32_t z = !zt ? 0 : sgn ? ((const int8_t *)zt->data)[zi] : ((const uint8_t *)zt->data)[zi];
            sw[i] = (int8_t)((sgn ? ((const int8_t *)wt->data)[i] : ((const uint8_t *)wt->data)[i]) - z);
        }
        c->wtmp = sw;
        c->spec.qw = sw;
    }
    if (fuse_act >= 0) { /* the activation's step goes; the convolution writes its output */
        int y = st->out[0];
        st->out[0] = p->steps[fuse_act].out[0];
        o->removed[fuse_act] = 1;
        p->state[y] = MTS__V_UNUSED;
        o->prod[st->out[0]] = s;
    }
    c->n_resid = 0;
    st->n_in = 1;
    if (xz_rt) st->in[st->n_in++] = xz; /* read at run time */
    st->in[0] = x;
    return true;
}

/* The spatial zero padding of a constant-mode Pad step pd of a 4-D float tensor: begin (pb) and
 * end (pe) amounts of H and W, all >= 0, nothing on N and C. False for anything else. */
static bool zero_spatial_pad(const mts__plan *p, const mts__step *pd, int64_t pb[2], int64_t pe[2])
{
    if (pd->dynamic || pd->kind != MTS__S_KERNEL || !is_op(pd, "Pad") || pd->n_out != 1 || pd->n_in < 1 ||
        !live_value(p, pd->in[0]) || p->vals[pd->in[0]].rank != 4 || p->vals[pd->in[0]].dtype != MTS_DTYPE_FLOAT)
        return false;
    if (strcmp(mts_attr_string(pd->nd, "mode", "constant"), "constant")) return false;
    int64_t pads[8];
    if (pd->nd->opset < 11) {
        int n = 0;
        const int64_t *a = mts_attr_ints(pd->nd, "pads", &n);
        if (!a || n != 8 || mts_attr_float(pd->nd, "value", 0.0f) != 0.0f) return false;
        memcpy(pads, a, sizeof pads);
    } else {
        if (pd->n_in < 2 || pd->n_in > 3 || !const_value(p, pd->in[1])) return false;
        const mts_tensor *t = &p->vals[pd->in[1]];
        if (t->dtype != MTS_DTYPE_INT64 || mts_tensor_numel(t) != 8) return false;
        memcpy(pads, t->data, sizeof pads);
        if (pd->n_in == 3 && pd->in[2] >= 0) {
            float f;
            if (!mts__const_scalar(p, pd->in[2], &f) || f != 0.0f) return false;
        }
    }
    for (int i = 0; i < 8; i++)
        if (pads[i] < 0 || ((i % 4) < 2 && pads[i] != 0)) return false;
    pb[0] = pads[2], pb[1] = pads[3], pe[0] = pads[6], pe[1] = pads[7];
    return true;
}

/* A 2-D convolution whose source is a zero Pad (tf2onnx writes "same" padding of strided convs
 * as an explicit Pad) read by it alone: the convolution pads instead, and reads the Pad's
 * input. */
static void fold_pad(mts__opt *o, int s, cinfo *c)
{
    mts__plan *p = o->p;
    mts__step *st = &p->steps[s];
    mts_conv_geom *g = &c->spec.g;
    int u = st->in[0], r = u >= 0 ? o->prod[u] : -1;
    int64_t pb[2], pe[2];
    if (c->spec.kind != MTS_DPRIM_CONV || g->nsp != 2 || r < 0 || o->removed[r] || sole_reader(o, u) != s ||
        p->state[u] != MTS__V_STATIC || !zero_spatial_pad(p, &p->steps[r], pb, pe))
        return;
    const mts_tensor *x = &p->vals[p->steps[r].in[0]];
    for (int i = 0; i < 2; i++) {
        int64_t kext = (g->k[1 + i] - 1) * g->d[1 + i] + 1;
        /* oneDNN takes padding up to the kernel extent; more would read only zeros */
        if (g->pb[1 + i] + pb[i] >= kext || g->pe[1 + i] + pe[i] >= kext) return;
    }
    for (int i = 0; i < 2; i++) {
        g->pb[1 + i] += pb[i];
        g->pe[1 + i] += pe[i];
        g->in[1 + i] = x->dims[2 + i];
    }
    st->in[0] = p->steps[r].in[0];
    o->removed[r] = 1;
    p->state[u] = MTS__V_UNUSED;
}

/* conv * a + b: the weights scaled by a, the bias (zero if none) becomes bias * a + b. */
static int scale_conv(mts__opt *o, cinfo *c, float a, float b, mts_err *err)
{
    mts__plan *p = o->p;
    int64_t M = c->spec.g.M, nw = mts_tensor_numel(&p->vals[p->steps[c->step].in[1]]);
    float *wt = c->wtmp ? c->wtmp : malloc(sizeof(float) * (size_t)(nw > 0 ? nw : 1));
    float *bt = mts_pool_alloc(&p->pool, sizeof(float) * (size_t)(M > 0 ? M : 1));
    if (!wt || !bt) {
        if (wt != c->wtmp) free(wt);
        return mts_err_set(err, MTS_ENOMEM, "out of memory folding a scale into a convolution");
    }
    for (int64_t i = 0; i < nw; i++) wt[i] = c->spec.w[i] * a;
    for (int64_t m = 0; m < M; m++) bt[m] = (c->spec.b ? c->spec.b[m] : 0.0f) * a + b;
    c->wtmp = wt;
    c->bfold = bt;
    c->spec.w = wt;
    c->spec.b = bt;
    return MTS_OK;
}

/* Folds a BatchNormalization reading the conv's output into its weights. */
static int fold_bn(mts__opt *o, cinfo *c, int *cur, mts_err *err)
{
    mts__plan *p = o->p;
    int r = sole_reader(o, *cur);
    if (r < 0 || c->spec.transpose || c->spec.g.group < 1) return MTS_OK;
    const mts__step *bn = &p->steps[r];
    if (!is_op(bn, "BatchNormalization") || bn->dynamic || bn->n_in < 5 || bn->in[0] != *cur) return MTS_OK;
    if (mts_attr_int(bn->nd, "training_mode", 0) != 0 || mts_attr_int(bn->nd, "spatial", 1) == 0) return MTS_OK;
    for (int j = 1; j < bn->n_out; j++)
        if (bn->out[j] >= 0 && (o->nuse[bn->out[j]] > 0 || o->is_out[bn->out[j]])) return MTS_OK;
    int64_t M = c->spec.g.M;
    const float *prm[4];
    for (int j = 1; j <= 4; j++) {
        int v = bn->in[j];
        if (!const_value(p, v) || p->vals[v].dtype != MTS_DTYPE_FLOAT || mts_tensor_numel(&p->vals[v]) != M)
            return MTS_OK;
        prm[j - 1] = p->vals[v].data;
    }
    float eps = mts_attr_float(bn->nd, "epsilon", 1e-5f);
    int64_t per = 1; /* weights per output channel */
    const mts_tensor *w = &p->vals[p->steps[c->step].in[1]];
    per = mts_tensor_numel(w) / M;
    float *wt = malloc(sizeof(float) * (size_t)(per * M));
    float *bt = mts_pool_alloc(&p->pool, sizeof(float) * (size_t)M);
    if (!wt || !bt) {
        free(wt);
        return mts_err_set(err, MTS_ENOMEM, "out of memory folding BatchNormalization");
    }
    for (int64_t mo = 0; mo < M; mo++) {
        float sc = prm[0][mo] / sqrtf(prm[3][mo] + eps);
        for (int64_t i = 0; i < per; i++) wt[mo * per + i] = c->spec.w[mo * per + i] * sc;
        float b0 = c->spec.b ? c->spec.b[mo] : 0.0f;
        bt[mo] = (b0 - prm[2][mo]) * sc + prm[1][mo];
    }
    c->wtmp = wt;
    c->bfold = bt;
    c->spec.w = wt;
    c->spec.b = bt;
    o->removed[r] = 1;
    p->state[*cur] = MTS__V_UNUSED;
    *cur = bn->out[0];
    return MTS_OK;
}

/* The backend's state for one optimization: the steps it claimed in this attempt, and the
 * nodes it declined in earlier attempts. */
typedef struct dnnl_opt {
    cinfo *ci;
    int nci;
    int *cstep;       /* per step: index into ci, -1 */
    uint8_t *no_dnnl; /* per node: declined */
    uint8_t *no_pair; /* per node: a depthwise convolution not to pair (its layouts did not fit) */
} dnnl_opt;

static void cinfo_free_tmp(cinfo *c)
{
    free(c->wtmp);
    free(c->wtmp2);
    c->wtmp = c->wtmp2 = NULL;
}

static void dnnl_opt_free(mts__opt *o, int self)
{
    dnnl_opt *d = o->bopt[self];
    if (!d) return;
    for (int i = 0; d->ci && i < d->nci; i++) cinfo_free_tmp(&d->ci[i]);
    free(d->ci);
    free(d->cstep);
    free(d->no_dnnl);
    free(d->no_pair);
    free(d);
    o->bopt[self] = NULL;
}

static bool dnnl_enabled(int kind)
{
    return kind == MTS_BACKEND_DEFAULT;
}

/* Which convolutions run as Winograd (dnnl_conv.c, mts_dconv_wino_ok): its transformed weights
 * take up to 4x a kernel's bytes, so the eligible convolutions are taken in order of output
 * pixels (the speed gained per weight byte grows with them: the multiply-adds saved scale with
 * pixels x weights) while their extra bytes stay within 10 % of the model's parameter bytes
 * (at least 2 MB), keeping resident memory near the 1.2x target. */
static void choose_winograd(const mts_model *m, cinfo *ci, int n)
{
    int *order = malloc(sizeof(int) * (size_t)(n + 1)), k = 0;
    if (!order) return; /* none: direct convolutions */
    for (int i = 0; i < n; i++) {
        ci[i].spec.wino = false;
        if (mts_dconv_wino_ok(&ci[i].spec)) order[k++] = i;
    }
    for (int i = 1; i < k; i++) { /* by output pixels, most first (insertion sort; few) */
        int v = order[i], j = i;
        int64_t pv = ci[v].spec.g.out[1] * ci[v].spec.g.out[2];
        while (j > 0 && ci[order[j - 1]].spec.g.out[1] * ci[order[j - 1]].spec.g.out[2] < pv) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
    double budget = fmax(0.10 * (double)m->param_bytes, 2e6), used = 0;
    for (int i = 0; i < k; i++) {
        double extra = (double)mts_dconv_wino_extra_bytes(&ci[order[i]].spec);
        if (used + extra > budget) continue;
        used += extra;
        ci[order[i]].spec.wino = true;
    }
    free(order);
}

/* Claims convolutions, pools and constant-weight MatMul/Gemm with their fusions. */
/* A claimed depthwise 3x3 convolution whose output only a claimed 1x1 convolution reads
 * becomes one step with it (mts_dconv_dwsep_ok; the kernel is dwsep.c): the depthwise step
 * takes the pointwise one's post-ops, residuals and destination, and the pointwise step goes.
 * The pointwise residuals must exist before the depthwise step runs. MTS_NO_DWSEP=1 (or
 * MTS_NO_FAST=1) keeps the two oneDNN steps, for comparisons. */
static void pair_dwsep(mts__opt *o, dnnl_opt *d)
{
    mts__plan *p = o->p;
    if (!mts_fast_enabled() || getenv("MTS_NO_DWSEP")) return;
    bool any = false;
    for (int i = 0; i < d->nci; i++) {
        cinfo *a = &d->ci[i];
        mts__step *sa = &p->steps[a->step];
        int v = sa->out[0], r = sole_reader(o, v);
        if (a->merged || a->n_resid || d->no_pair[sa->node] || r < 0 || d->cstep[r] < 0) continue;
        cinfo *b = &d->ci[d->cstep[r]];
        mts__step *sb = &p->steps[r];
        if (b->merged || sb->in[0] != v || !mts_dconv_dwsep_ok(&a->spec, &b->spec)) continue;
        bool ok = true;
        for (int j = 0; j < b->n_resid; j++) {
            int rv = b->resid[j];
            ok &= rv != v && (p->state[rv] == MTS__V_INPUT || (o->prod[rv] >= 0 && o->prod[rv] < a->step));
        }
        if (!ok) continue;
        a->spec.pw_M = b->spec.g.M;
        a->spec.pw_w = b->spec.w;
        a->spec.pw_b = b->spec.b;
        a->spec.n_dw_post = a->spec.n_post;
        for (int j = 0; j < b->spec.n_post; j++) a->spec.post[a->spec.n_post++] = b->spec.post[j];
        for (int j = 0; j < b->n_resid; j++) a->resid[a->n_resid++] = b->resid[j];
        a->wtmp2 = b->wtmp;
        b->wtmp = NULL;
        b->merged = any = true;
        sa->out[0] = sb->out[0];
        sa->n_in = 1 + a->n_resid;
        for (int j = 0; j < a->n_resid; j++) sa->in[1 + j] = a->resid[j];
        o->prod[sa->out[0]] = a->step;
        o->removed[r] = 1;
        p->state[v] = MTS__V_UNUSED;
    }
    if (!any) return;
    int n = 0;
    for (int i = 0; i < d->nci; i++) d->cstep[d->ci[i].step] = -1;
    for (int i = 0; i < d->nci; i++) {
        if (d->ci[i].merged) continue;
        d->ci[n] = d->ci[i];
        d->cstep[d->ci[n].step] = n;
        n++;
    }
    d->nci = n;
}

static int dnnl_claim(mts__opt *o, int self, void **mstate, mts_err *err)
{
    mts_model *m = o->m;
    mts__plan *p = o->p;
    int ns = o->ns, rc;
    dnnl_opt *d = o->bopt[self];
    if (!d) {
        d = o->bopt[self] = calloc(1, sizeof *d);
        if (d) {
            d->ci = calloc((size_t)ns + 1, sizeof *d->ci);
            d->cstep = malloc(sizeof(int) * ((size_t)ns + 1));
            d->no_dnnl = calloc((size_t)m->n_nodes + 1, 1);
            d->no_pair = calloc((size_t)m->n_nodes + 1, 1);
        }
        if (!d || !d->ci || !d->cstep || !d->no_dnnl || !d->no_pair)
            return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    /* A new attempt: nothing claimed yet. */
    for (int i = 0; i < d->nci; i++) cinfo_free_tmp(&d->ci[i]);
    d->nci = 0;
    for (int s = 0; s < ns; s++) d->cstep[s] = -1;
    cinfo *ci = d->ci;
    int64_t up_extra = 0; /* phase weight bytes added by upsampling folds in this attempt */
    for (int s = 0; s < ns; s++) {
        if (o->removed[s]) continue;
        cinfo *c = &ci[d->nci];
        if (q8_eligible(o, s, d->no_dnnl, mstate, c)) {
            d->cstep[s] = d->nci++;
            continue;
        }
        if (!conv_eligible(o, s, d->no_dnnl, mstate, c)) continue;
        d->nci++;
        d->cstep[s] = d->nci - 1;
        int cur = p->steps[s].out[0];
        fold_pad(o, s, c);
        if (c->spec.kind == MTS_DPRIM_CONV && (rc = fold_bn(o, c, &cur, err))) return rc;
        for (; !mts_dprim_is_pool(c->spec.kind);) {
            int r = sole_reader(o, cur), resid;
            mts_dpost po;
            if (r >= 0 && c->spec.kind == MTS_DPRIM_MATMUL && !c->spec.b && c->spec.n_post == 0 &&
                matmul_bias(o, &p->steps[r], cur, c->spec.g.M, &c->spec.b)) {
                o->removed[r] = 1; /* MatMul + Add(constant row) -> bias */
                p->state[cur] = MTS__V_UNUSED;
                cur = p->steps[r].out[0];
                continue;
            }
            if (c->spec.n_post < MTS_DPOST_MAX - 1) {
                int gy = gelu_pattern(o, cur);
                if (gy >= 0) {
                    c->spec.post[c->spec.n_post++] = (mts_dpost){MTS_DPOST_GELU, 0, 0, false, false};
                    cur = gy;
                    continue;
                }
                int hy = hardswish_pattern(o, cur);
                if (hy >= 0) {
                    c->spec.post[c->spec.n_post++] = (mts_dpost){MTS_DPOST_HARDSWISH, 0, 0, false, false};
                    cur = hy;
                    continue;
                }
            }
            if (r >= 0 && as_postop(o, &p->steps[r], cur, &po, &resid) && po.kind == MTS_DPOST_LINEAR) {
                int np = c->spec.n_post;
                if (np > 0 && c->spec.post[np - 1].kind == MTS_DPOST_LINEAR) {
                    /* consecutive scalar steps compose: a2 * (a1 x + b1) + b2 */
                    mts_dpost *l = &c->spec.post[np - 1];
                    l->beta = l->beta * po.alpha + po.beta;
                    l->alpha = l->alpha * po.alpha;
                } else if (np == 0 && c->spec.kind == MTS_DPRIM_CONV) {
                    /* right after the convolution: into its weights and bias */
                    if ((rc = scale_conv(o, c, po.alpha, po.beta, err))) return rc;
                } else {
                    /* one linear post-op per step: with two (linear, hardswish, linear) oneDNN
                     * 2.6's brgemm convolution gave wrong results here */
                    bool have = false;
                    for (int i = 0; i < np; i++) have |= c->spec.post[i].kind == MTS_DPOST_LINEAR;
                    if (have || np >= MTS_DPOST_MAX - 1) break;
                    c->spec.post[c->spec.n_post++] = po;
                }
                o->removed[r] = 1;
                p->state[cur] = MTS__V_UNUSED;
                cur = p->steps[r].out[0];
                continue;
            }
            if (r < 0 || c->spec.n_post >= MTS_DPOST_MAX - 1 || !as_postop(o, &p->steps[r], cur, &po, &resid) ||
                post_conflict(&c->spec, &po))
                break;
            if (resid >= 0) {
                /* The residual must exist before the conv runs. */
                if (p->state[resid] != MTS__V_INPUT && (o->prod[resid] < 0 || o->prod[resid] >= s)) break;
                c->resid[c->n_resid++] = resid;
            }
            c->spec.post[c->spec.n_post++] = po;
            o->removed[r] = 1;
            p->state[cur] = MTS__V_UNUSED;
            cur = p->steps[r].out[0];
        }
        mts__step *st = &p->steps[s];
        /* A nearest integer upsampling (Resize) read only by this conv: the conv reads the
         * Resize's input, one small convolution per output phase (dnnl_conv.c). */
        if (c->spec.kind == MTS_DPRIM_CONV && mts_fast_enabled()) {
            int u = st->in[0], r = o->prod[u];
            if (r >= 0 && !o->removed[r] && is_op(&p->steps[r], "Resize") && p->steps[r].kind == MTS__S_KERNEL &&
                !p->steps[r].dynamic && sole_reader(o, u) == s && p->state[u] == MTS__V_STATIC &&
                mts__nearest_upsample(p, &p->steps[r]) && live_value(p, p->steps[r].in[0]) &&
                p->vals[p->steps[r].in[0]].dtype == MTS_DTYPE_FLOAT) {
                const mts_tensor *tx = &p->vals[p->steps[r].in[0]], *tu = &p->vals[u];
                c->spec.up[0] = tu->dims[2] / tx->dims[2];
                c->spec.up[1] = tu->dims[3] / tx->dims[3];
                /* The phase weights take more room than the kernel they replace (16 taps
                 * for 9 at s = 2): only while a layer adds at most 3 % of the model's
                 * parameter bytes (or 256 KB) and all of them at most 5 % (or 512 KB), so
                 * resident memory stays within the 1.2x target (the widest decoder layers
                 * of big models stay plain). */
                int64_t extra = mts_dconv_up_ok(&c->spec) ? mts_dconv_up_extra_bytes(&c->spec) : -1;
                double pb = (double)m->param_bytes;
                if (extra >= 0 && (double)extra <= fmax(0.03 * pb, 256e3) &&
                    (double)(up_extra + extra) <= fmax(0.05 * pb, 512e3)) {
                    up_extra += extra;
                    st->in[0] = p->steps[r].in[0];
                    o->removed[r] = 1;
                    p->state[u] = MTS__V_UNUSED;
                } else {
                    c->spec.up[0] = c->spec.up[1] = 0;
                }
            }
        }
        st->out[0] = cur;
        st->n_out = 1;
        st->n_in = 1 + c->n_resid;
        for (int j = 0; j < c->n_resid; j++) st->in[1 + j] = c->resid[j];
        o->prod[cur] = s;
    }
    pair_dwsep(o, d);
    choose_winograd(m, d->ci, d->nci);
    return MTS_OK;
}

/* Convolutions and pools (not MatMul/Gemm, whose operands keep the plain layout). */
static bool dnnl_layout_anchor(const mts__opt *o, int self, int s)
{
    const dnnl_opt *d = o->bopt[self];
    return d && d->cstep[s] >= 0 && d->ci[d->cstep[s]].spec.kind != MTS_DPRIM_MATMUL;
}

/* Whether a bf16 step may write its destination as bf16: a plain convolution, or the
 * upsampling form with a channels-last destination (its phases then write bf16 and the scatter
 * copies 2-byte values; the depth-to-space form scatters floats), whose output is no graph
 * output and is read only by bf16 convolutions or MatMuls, as their source, by bf16-writing
 * Concats (cat[s] set; NULL: none yet) or by small-channel Convs that take a bf16 source. */
static bool bf16_readers(const mts__opt *o, const dnnl_opt *d, int v, const uint8_t *cat);

static bool bf16_out_ok(const mts__opt *o, const dnnl_opt *d, const cinfo *c, const uint8_t *cat)
{
    const mts__plan *p = o->p;
    int v = p->steps[c->step].out[0];
    if (!c->spec.bf16 || c->spec.kind != MTS_DPRIM_CONV || (c->spec.up[0] * c->spec.up[1] > 1 && !c->spec.dst_nhwc) || v < 0 ||
        o->is_out[v] || p->state[v] != MTS__V_STATIC)
        return false;
    return bf16_readers(o, d, v, cat);
}

/* Whether step st, which reads v as its source, is a small-channel Conv the fast backend runs
 * (fast.c) on channels-last views of a channels-last v: it widens a bfloat16 source as it
 * transposes it (attribute mts_src_bf16), so a lip-sync UNet's last convolution can hand its
 * 8 channels at full resolution to the 3-channel head in half the bytes. */
static bool small_bf16_reader(const mts__opt *o, const mts__step *st, int v)
{
    const mts_model *root = o->m;
    while (root->root) root = root->root;
    if (!root->bf16) return false; /* (fp32 plans hand off fp32) */
    /* (a kernel step touching a channels-last candidate value runs on channels-last views:
     * optimize.c, pass 6) */
    return st->n_in >= 1 && st->in[0] == v && is_cand(o, v) && o->p->nhwc[v] && mts__fast_small_conv(o, st);
}

/* Tells the small-channel Conv steps reading v (small_bf16_reader) that it holds bfloat16
 * (attr "mts_src_bf16"), or, with the hand-offs off, to round it to bfloat16 values as they
 * read it ("mts_src_round"), so that both give the same bits. False when out of memory, with
 * every step as it was. */
static bool mark_small_readers(mts__opt *o, int v, const char *attr)
{
    mts__plan *p = o->p;
    const mts_node **orig = calloc((size_t)p->n_steps + 1, sizeof *orig);
    if (!orig) return false;
    bool ok = true;
    for (int s = 0; ok && s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (o->removed[s] || !small_bf16_reader(o, st, v)) continue;
        orig[s] = st->nd;
        ok = mts__step_set_int(p, st, attr, 1);
    }
    for (int s = 0; !ok && s < p->n_steps; s++)
        if (orig[s]) p->steps[s].nd = orig[s];
    free(orig);
    return ok;
}

/* Whether value v is read only by bf16 convolutions or MatMuls, as their source, by
 * bf16-writing Concats (cat, may be NULL), or by small-channel Convs that take a bfloat16
 * source (small_bf16_reader), and at least once. */
static bool bf16_readers(const mts__opt *o, const dnnl_opt *d, int v, const uint8_t *cat)
{
    const mts__plan *p = o->p;
    int readers = 0;
    for (int s = 0; s < p->n_steps; s++) {
        if (o->removed[s]) continue;
        const mts__step *st = &p->steps[s];
        for (int k = 0; k < st->n_in; k++) {
            if (st->in[k] != v) continue;
            if (cat && cat[s] && k < MTS_CAT_BF16_INPUTS) { /* copied as it is into bf16 */
                readers++;
                continue;
            }
            const cinfo *r = d->cstep[s] >= 0 ? &d->ci[d->cstep[s]] : NULL;
            if (!r && k == 0 && small_bf16_reader(o, st, v)) {
                readers++;
                continue;
            }
            /* in[1..] of a claimed step are its residuals: kept fp32 (a bf16 residual costs
             * accuracy: lip-sync w8 max abs error 0.0062 -> 0.0067 of a 0.0078 budget) */
            if (!r || k != 0 || !r->spec.bf16 || mts_dprim_is_pool(r->spec.kind)) return false;
            readers++;
        }
    }
    for (int i = 0; i < d->nci; i++) /* residual readers (also in[1..] above) */
        for (int r = 0; r < d->ci[i].n_resid; r++)
            if (d->ci[i].resid[r] == v) return false;
    return readers > 0;
}

/* bf16 activations between oneDNN steps: a chain of bf16 convolutions hands bf16 tensors on
 * (half the memory traffic, no conversion at each step's source); fp32 where any other kernel
 * reads the tensor.
 *
 * A channels-last channel Concat of float tensors whose readers are all bf16 convolutions (a
 * UNet decoder's skip concat) writes bf16 (kernels/nhwc.c): its output is half the bytes and
 * the convolution reads it without a conversion of its own. Its inputs that come from bf16
 * convolutions read by nothing else (the decoder's upsampled branch; the encoder's skip, read
 * by the next encoder stage's convolution too) arrive as bf16 and are copied as they are
 * (attribute mts_in_bf16, a bit per input); the others are converted as they are copied. Both
 * round the same floats to nearest even, so the outputs are the bits of fp32 hand-offs.
 *
 * A small-channel Conv of the fast backend (a UNet's 3-channel head after its last 8-channel
 * convolution at full resolution) takes its channels-last source as bf16 too and widens it as it
 * builds its padded planes (attribute mts_src_bf16); with the hand-offs off it rounds its float
 * source to the same values (mts_src_round), so its outputs do not depend on the hand-off. */
static void bf16_handoff(mts__opt *o, dnnl_opt *d)
{
    mts__plan *p = o->p;
    uint8_t *vb = calloc((size_t)o->nv + 1, 1), *cat = calloc((size_t)p->n_steps + 1, 1);
    for (int i = 0; i < d->nci; i++) {
        cinfo *c = &d->ci[i];
        c->spec.src_bf16 = c->spec.dst_bf16 = c->spec.src_round = false;
        for (int j = 0; j < c->spec.n_post; j++) c->spec.post[j].bf16 = false;
    }
    if (!vb || !cat) { /* all fp32 hand-offs: correct, only slower */
        free(vb);
        free(cat);
        return;
    }
    /* MTS_BF16_NO_HANDOFF=1: every hand-off in fp32 (for comparisons); the choices are still
     * made, for the depthwise-separable steps' src_round */
    bool none = getenv("MTS_BF16_NO_HANDOFF") != NULL;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (o->removed[s] || st->kind != MTS__S_KERNEL || st->dynamic || !is_op(st, "Concat") || st->n_out != 1) continue;
        int v = st->out[0];
        int64_t ax = mts_attr_int(st->nd, "axis", 1);
        if (v < 0 || !is_cand(o, v) || !p->nhwc[v] || o->is_out[v] || p->vals[v].dtype != MTS_DTYPE_FLOAT ||
            (ax != 1 && ax != -3))
            continue;
        bool ok = true;
        for (int j = 0; j < st->n_in; j++)
            ok &= st->in[j] >= 0 && p->vals[st->in[j]].dtype == MTS_DTYPE_FLOAT && p->vals[st->in[j]].rank == 4;
        const mts_node *orig = st->nd;
        if (!ok || !bf16_readers(o, d, v, NULL) || (!none && !mts__step_set_int(p, st, "mts_out_bf16", 1))) continue;
        if (!none && !mts__step_set_int(p, st, "mts_in_bf16", 0)) { /* (its mask, set below) */
            st->nd = orig; /* out of memory: an fp32 hand-off */
            continue;
        }
        if (!mark_small_readers(o, v, none ? "mts_src_round" : "mts_src_bf16")) {
            st->nd = orig;
            continue;
        }
        cat[s] = 1;
        vb[v] = 1;
    }
    for (int i = 0; i < d->nci; i++)
        if (bf16_out_ok(o, d, &d->ci[i], cat)) {
            if (!mark_small_readers(o, p->steps[d->ci[i].step].out[0], none ? "mts_src_round" : "mts_src_bf16"))
                continue; /* out of memory: an fp32 hand-off */
            d->ci[i].spec.dst_bf16 = !none;
            vb[p->steps[d->ci[i].step].out[0]] = 1;
        }
    for (int s = 0; s < p->n_steps; s++) {
        if (!cat[s] || none) continue;
        mts__step *st = &p->steps[s];
        int64_t mask = 0;
        for (int j = 0; j < st->n_in && j < MTS_CAT_BF16_INPUTS; j++)
            if (vb[st->in[j]]) mask |= (int64_t)1 << j;
        for (int a = 0; a < st->nd->n_attr; a++) /* the plan's own copy of the node */
            if (!strcmp(st->nd->attrs[a].name, "mts_in_bf16")) st->nd->attrs[a].i = mask;
    }
    for (int i = 0; i < d->nci; i++) {
        cinfo *c = &d->ci[i];
        c->spec.src_round = c->spec.pw_M > 0 && vb[p->steps[c->step].in[0]];
        if (none) continue;
        c->spec.src_bf16 = vb[p->steps[c->step].in[0]];
        for (int j = 0, r = 0; j < c->spec.n_post; j++)
            if (c->spec.post[j].kind == MTS_DPOST_ADD) c->spec.post[j].bf16 = vb[c->resid[r++]];
    }
    free(vb);
    free(cat);
}

/* Input slots of live steps other than step skip that read value v; *last: the last such step
 * (counted afresh: the claims rewrote inputs since the use counts were taken). */
static int readers_of(const mts__opt *o, int v, int skip, int *last)
{
    const mts__plan *p = o->p;
    int n = 0;
    for (int t = 0; t < p->n_steps; t++) {
        if (o->removed[t] || t == skip) continue;
        for (int j = 0; j < p->steps[t].n_in; j++)
            if (p->steps[t].in[j] == v) n++, *last = t;
    }
    return n;
}

/* A bf16-writing channel Concat of two tensors that bf16 convolutions wrote (channels-last),
 * read by nothing but a convolution the engine's bf16 3x3 kernel runs (a UNet decoder's skip
 * Concat before its last convolution at full resolution, 2 x 8 channels in lipsync w8): the
 * convolution reads the two parts itself (spec.cat_C2; the second part becomes its last input)
 * and the Concat goes, so the concatenated tensor is neither written nor read back (w8 at batch
 * 16: 52 MB each way). Runs after bf16_handoff, whose choices it needs. MTS_NO_CAT_FOLD=1 keeps
 * the Concats (for comparisons). */
static void fold_bf16_concats(mts__opt *o, dnnl_opt *d)
{
    mts__plan *p = o->p;
    if (getenv("MTS_NO_CAT_FOLD")) return;
    for (int i = 0; i < d->nci; i++) {
        cinfo *c = &d->ci[i];
        mts__step *st = &p->steps[c->step];
        int v = st->in[0], s = -1, r = -1;
        if (v < 0 || !c->spec.src_bf16 || c->spec.kind != MTS_DPRIM_CONV || c->spec.cat_C2 || o->is_out[v] ||
            st->n_in + 1 > 2 + MTS__STEP_EXTRA_IN || readers_of(o, v, -1, &r) != 1)
            continue;
        for (int t = 0; t < p->n_steps; t++)
            for (int j = 0; !o->removed[t] && j < p->steps[t].n_out; j++)
                if (p->steps[t].out[j] == v) s = t;
        if (s < 0) continue;
        mts__step *cs = &p->steps[s];
        if (cs->kind != MTS__S_KERNEL || cs->dynamic || !is_op(cs, "Concat") || cs->n_in != 2 || cs->n_out != 1 ||
            !mts_attr_int(cs->nd, "mts_out_bf16", 0) || mts_attr_int(cs->nd, "mts_in_bf16", 0) != 3)
            continue;
        int a = cs->in[0], b = cs->in[1];
        if (a < 0 || b < 0 || a == b || !p->nhwc[a] || !p->nhwc[b] || p->vals[b].rank != 4) continue;
        mts_dconv_spec sp = c->spec;
        sp.cat_C2 = p->vals[b].dims[1];
        if (p->vals[a].dims[1] + sp.cat_C2 != sp.g.C || !mts_bfconv_ok(&sp)) continue;
        c->spec.cat_C2 = sp.cat_C2;
        st->in[0] = a;
        st->in[st->n_in++] = b;
        o->removed[s] = 1;
        p->state[v] = MTS__V_UNUSED; /* (no buffer for the concatenation) */
    }
}

/* A convolution on the engine's bf16 3x3 kernel whose output only a small-channel Conv of the
 * fast backend reads (1-4 outputs, 3x3, stride 1, padding 1: a lip-sync UNet's 3-channel head
 * after its last 8-channel convolution at full resolution), perhaps followed by a Relu or
 * Sigmoid that alone reads the head's output: the head (and the activation) run inside the
 * kernel on bands of its rows (spec head_M ...), so the 8-channel tensor is never stored and the
 * head's source is never rebuilt from memory. Its rows are rounded to bf16 values as the bf16
 * hand-off to the unfused head gives them (mts_src_bf16 / mts_src_round), and the head's rows
 * are the small-channel kernel's own, so the outputs are the unfused plan's bits.
 * MTS_NO_HEAD_FOLD=1 keeps the steps apart (for comparisons). */
static void fold_small_heads(mts__opt *o, dnnl_opt *d)
{
    mts__plan *p = o->p;
    if (getenv("MTS_NO_HEAD_FOLD")) return;
    for (int i = 0; i < d->nci; i++) {
        cinfo *c = &d->ci[i];
        mts__step *st = &p->steps[c->step];
        int v = st->out[0];
        if (v < 0 || c->n_resid || c->spec.head_M || o->is_out[v] || p->state[v] != MTS__V_STATIC) continue;
        static const float any = 0.0f; /* (weights to come: this checks the convolution's side) */
        mts_dconv_spec sp = c->spec;
        sp.head_M = 1, sp.head_w = &any;
        if (!mts_bfconv_ok(&sp)) continue;
        int h = -1;
        if (readers_of(o, v, -1, &h) != 1 || p->steps[h].in[0] != v || !mts__fast_small_conv(o, &p->steps[h])) continue;
        mts__step *hs = &p->steps[h];
        const mts_tensor *kin[3] = {&p->vals[v], &p->vals[hs->in[1]], hs->n_in > 2 && hs->in[2] >= 0 ? &p->vals[hs->in[2]] : NULL};
        mts_err e = {0};
        mts_tensor kout[1];
        mts_kctx kk = {hs->nd, kin, hs->n_in > 3 ? 3 : hs->n_in, kout, 1, &e, 1, NULL};
        mts_conv_geom g;
        if (mts_conv_geometry(&kk, false, &g) != MTS_OK || g.nsp != 2 || g.group != 1 || g.C != c->spec.g.M ||
            g.M < 1 || g.M > 4 || kin[1]->dtype != MTS_DTYPE_FLOAT || (kin[2] && kin[2]->dtype != MTS_DTYPE_FLOAT))
            continue;
        bool geo = true;
        for (int a = 1; a < 3; a++)
            geo &= g.k[a] == 3 && g.s[a] == 1 && g.d[a] == 1 && g.pb[a] == 1 && g.pe[a] == 1 && g.out[a] == g.in[a];
        int y = hs->out[0], act = 0, a = -1;
        if (!geo || y < 0 || p->state[y] != MTS__V_STATIC || p->vals[y].rank != 4) continue;
        /* a Relu / Sigmoid alone reading the head's output */
        if (readers_of(o, y, h, &a) == 1 && !o->is_out[y] && p->steps[a].kind == MTS__S_KERNEL && !p->steps[a].dynamic &&
            p->steps[a].n_in == 1 && p->steps[a].n_out == 1 && p->steps[a].out[0] >= 0 &&
            p->state[p->steps[a].out[0]] == MTS__V_STATIC && p->vals[p->steps[a].out[0]].dtype == MTS_DTYPE_FLOAT &&
            (is_op(&p->steps[a], "Relu") || is_op(&p->steps[a], "Sigmoid")))
            act = is_op(&p->steps[a], "Relu") ? MTS_CHAIN_RELU : MTS_CHAIN_SIGMOID;
        int fin = act ? p->steps[a].out[0] : y;
        sp = c->spec;
        sp.head_M = (int)g.M;
        sp.head_w = kin[1]->data;
        sp.head_b = kin[2] ? kin[2]->data : NULL;
        sp.head_act = act;
        sp.head_nhwc = p->nhwc[fin] && !is_neutral(&p->vals[fin]);
        sp.dst_bf16 = false;
        if (!mts_bfconv_ok(&sp)) continue;
        c->spec = sp;
        st->out[0] = fin;
        o->removed[h] = 1;
        p->state[v] = MTS__V_UNUSED;
        if (act) {
            o->removed[a] = 1;
            p->state[y] = MTS__V_UNUSED;
        }
    }
}

/* Primitives: layouts first (in order), then the creations, which are independent and mostly
 * oneDNN's JIT compilation, on up to CREATE_THREADS threads. */
static int dnnl_commit(mts__opt *o, int self, mts_err *err)
{
    (void)err;
    mts__plan *p = o->p;
    dnnl_opt *d = o->bopt[self];
    if (!d) return MTS_OK;
    for (int i = 0; i < d->nci; i++) {
        cinfo *c = &d->ci[i];
        mts__step *st = &p->steps[c->step];
        const mts_tensor *x = &p->vals[st->in[0]], *y = &p->vals[st->out[0]];
        bool mm = c->spec.kind == MTS_DPRIM_MATMUL;
        c->spec.src_nhwc = !mm && x->rank == 4 && (p->nhwc[st->in[0]] || is_neutral(x));
        c->spec.dst_nhwc = !mm && y->rank == 4 && (p->nhwc[st->out[0]] || is_neutral(y));
        for (int j = 0, r = 0; j < c->spec.n_post; j++)
            if (c->spec.post[j].kind == MTS_DPOST_ADD) {
                int rv = c->resid[r++];
                const mts_tensor *t = &p->vals[rv];
                c->spec.post[j].nhwc = !mm && t->rank == 4 && (p->nhwc[rv] || is_neutral(t));
            }
    }
    /* The depthwise-separable kernel reads and writes channels-last tensors only. */
    bool unpair = false;
    for (int i = 0; i < d->nci; i++) {
        cinfo *c = &d->ci[i];
        bool ok = c->spec.src_nhwc && c->spec.dst_nhwc;
        for (int j = 0; j < c->spec.n_post; j++) ok &= c->spec.post[j].kind != MTS_DPOST_ADD || c->spec.post[j].nhwc;
        if (c->spec.pw_M && !ok) {
            d->no_pair[p->steps[c->step].node] = 1;
            unpair = true;
        }
    }
    if (unpair) return MTS__RETRY;
    bf16_handoff(o, d);
    fold_bf16_concats(o, d);
    fold_small_heads(o, d);
    create_all(d->ci, d->nci);
    int failed = -1;
    for (int i = 0; i < d->nci; i++) {
        cinfo *c = &d->ci[i];
        mts__step *st = &p->steps[c->step];
        if (c->create_rc != MTS_OK) {
            if (failed < 0) { /* the first, as when they were created in order */
                if (getenv("MTS_PLAN_VERBOSE"))
                    fprintf(stderr, "oneDNN declines node '%s' (src %s, dst %s): %s\n", o->m->nodes[st->node].name,
                            c->spec.src_nhwc ? "nhwc" : "nchw", c->spec.dst_nhwc ? "nhwc" : "nchw", c->create_err.msg);
                failed = st->node;
            }
            continue;
        }
        cinfo_free_tmp(c);
    }
    if (failed >= 0) {
        for (int i = 0; i < d->nci; i++) {
            mts_dconv_free(d->ci[i].dc);
            d->ci[i].dc = NULL;
        }
        d->no_dnnl[failed] = 1;
        return MTS__RETRY;
    }
    for (int i = 0; i < d->nci; i++) {
        mts__step *st = &p->steps[d->ci[i].step];
        st->kind = MTS__S_BACKEND;
        st->backend = (uint8_t)self;
        st->impl = d->ci[i].dc;
        if (mts_dconv_bf16(d->ci[i].dc)) p->n_bf16++;
        if (mts_dconv_half(d->ci[i].dc)) p->n_f16w++;
        d->ci[i].dc = NULL;
    }
    return MTS_OK;
}

/* Scratch bytes at one thread; weights now live packed in the model's cache: drop the unpacked
 * originals. */
static int dnnl_finish(mts__opt *o, int self, mts_err *err)
{
    mts_model *m = o->m;
    mts__plan *p = o->p;
    int rc, mine = 0;
    for (int s = 0; s < p->n_steps; s++) {
        const mts__step *st = &p->steps[s];
        if (st->kind != MTS__S_BACKEND || st->backend != self) continue;
        size_t sb = 0;
        if ((rc = mts_dconv_prepare(st->impl, 1, &sb, err))) return rc;
        if ((int64_t)sb > p->scratch_bytes) p->scratch_bytes = (int64_t)sb;
        mine++;
    }
    int *cand = malloc(sizeof(int) * ((size_t)p->n_steps + 1)), nc = 0;
    for (int s = 0; cand && s < p->n_steps; s++) {
        const mts__step *st = &p->steps[s];
        const mts_node *nd = &m->nodes[st->node];
        if (st->kind != MTS__S_BACKEND || st->backend != self) continue;
        if (mts_dconv_q8(st->impl)) { /* the int8 weights: QLinearConv's w, ConvInteger's, or the
                                       * quantized constant behind a fused QDQ Conv's weight */
            int w = !strcmp(nd->op_type, "QLinearConv") ? (nd->n_in > 3 ? nd->in[3] : -1)
                    : nd->n_in > 1                      ? nd->in[1]
                                                        : -1;
            if (w >= 0 && !strcmp(nd->op_type, "Conv")) {
                int pr = m->values[w].producer;
                const mts_node *dq = pr >= 0 ? &m->nodes[pr] : NULL;
                w = dq && !strcmp(dq->op_type, "DequantizeLinear") && dq->n_in > 0 ? dq->in[0] : -1;
            }
            if (w >= 0 && m->values[w].kind == MTS_VALUE_INITIALIZER) cand[nc++] = w;
            continue;
        }
        if (nd->n_in >= 2 && nd->in[1] >= 0 &&
            (is_op(st, "Conv") || is_op(st, "ConvTranspose") || is_op(st, "MatMul") || is_op(st, "Gemm")))
            cand[nc++] = nd->in[1];
    }
    if (cand) mts__release_weights(m, p, cand, nc);
    free(cand);
    if (mine && p->scratch_bytes == 0) p->scratch_bytes = 64; /* a stream is still needed */
    return MTS_OK;
}

/* Creates a step's primitives for j->threads when it is one of this backend's (nothing when it
 * has them). A failure here is met again, and reported, by dnnl_prepare's own loop. */
typedef struct prep_job {
    const mts__plan *p;
    int self, threads;
} prep_job;

static void prep_one(void *arg, int i)
{
    const prep_job *j = arg;
    const mts__step *st = &j->p->steps[i];
    size_t b = 0;
    mts_err e = {0};
    if (st->kind == MTS__S_BACKEND && st->backend == j->self) (void)mts_dconv_prepare(st->impl, j->threads, &b, &e);
}

/* Sizes the scratch memory for the plan's oneDNN steps at `threads` (creating their primitives
 * for that count on first use; an adaptive context prepares its one-thread primitives only when
 * it first tries one thread) and makes the context's stream. */
static int dnnl_prepare(const mts__plan *p, int self, int threads, void **cstate, int64_t *scratch, mts_err *err)
{
    /* Primitives this thread count still lacks are compiled on a few threads first (a plan's
     * first 2-thread run: about 60 for w32), then the loop below only reads sizes. */
    int n_missing = 0;
    bool q8 = false; /* then on one thread, as in create_all */
    for (int s = 0; s < p->n_steps; s++) {
        const mts__step *st = &p->steps[s];
        if (st->kind != MTS__S_BACKEND || st->backend != self) continue;
        n_missing += !mts_dconv_ready(st->impl, threads);
        q8 |= mts_dconv_q8(st->impl);
    }
    if (n_missing >= 8 && !q8) {
        prep_job j = {p, self, threads};
        mts_par_items(p->n_steps, 4, 4, prep_one, &j);
    }
    for (int s = 0; s < p->n_steps; s++) {
        if (p->steps[s].kind != MTS__S_BACKEND || p->steps[s].backend != self) continue;
        size_t b = 0;
        int rc = mts_dconv_prepare(p->steps[s].impl, threads, &b, err);
        if (rc) return rc;
        if ((int64_t)b > *scratch) *scratch = (int64_t)b;
    }
    if (!*cstate && !(*cstate = mts_dnnl_stream_create()))
        return mts_err_set(err, MTS_EUNAVAILABLE, "cannot create a oneDNN stream");
    return MTS_OK;
}

static int dnnl_run(const mts__step *st, void *stream, const mts_tensor *vals, void *scratch, int threads,
                    const mts_rows *rows, mts_err *err)
{
    const float *resid[8];
    if (mts_dconv_q8(st->impl)) /* in[1]: the source's zero point when it is computed */
        return mts_dconv_run(st->impl, threads, stream, vals[st->in[0]].data, vals[st->out[0]].data, NULL,
                             st->n_in > 1 ? &vals[st->in[1]] : NULL, scratch, err);
    for (int j = 1; j < st->n_in && j <= 8; j++) resid[j - 1] = vals[st->in[j]].data;
    if (rows && mts_dconv_run_rows(st->impl, threads, vals[st->in[0]].data, vals[st->out[0]].data, resid, rows))
        return MTS_OK;
    return mts_dconv_run(st->impl, threads, stream, vals[st->in[0]].data, vals[st->out[0]].data, resid, NULL, scratch,
                         err);
}

static const char *dnnl_describe(const mts__step *st)
{
    return mts_dconv_impl(st->impl);
}

static void dnnl_step_free(void *impl)
{
    mts_dconv_free(impl);
}

const mts_backend mts_backend_dnnl = {
    .name = "onednn",
    .enabled = dnnl_enabled,
    .claim = dnnl_claim,
    .layout_anchor = dnnl_layout_anchor,
    .commit = dnnl_commit,
    .finish = dnnl_finish,
    .opt_free = dnnl_opt_free,
    .prepare = dnnl_prepare,
    .set_threads = mts_dnnl_set_threads,
    .run = dnnl_run,
    .describe = dnnl_describe,
    .step_free = dnnl_step_free,
    .ctx_free = mts_dnnl_stream_free,
    .model_free = mts_dnnl_cache_free,
    .model_bytes = mts_dnnl_cache_bytes,
};
