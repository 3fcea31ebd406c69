/*
 * Graph optimizer and layout pass of the default backend, run once per plan after shapes are
 * known and constants are folded (plan.c), before buffer slots are assigned.
 *
 *   1. Identity and inference-mode Dropout are removed (their readers read the input).
 *   2. Every Conv/ConvTranspose that oneDNN can run becomes a fused step (MTS__S_DCONV), and so
 *      do MaxPool / AveragePool / GlobalAveragePool / GlobalMaxPool (no fusion) and MatMul /
 *      Gemm with constant 2-D weights (a following Add of a constant row becomes the bias):
 *      a following BatchNormalization is folded into the weights and bias, then a chain of
 *      single-reader followers becomes oneDNN post-ops: Relu, LeakyRelu, Clip, Sigmoid, Tanh,
 *      HardSwish, HardSigmoid, GELU written out as Div/Erf/Add/Mul/Mul, and a residual Add of a
 *      same-shape tensor computed earlier.
 *   3. Layout: 4-D activations are grouped (union-find) across ops that do not care about the
 *      layout (elementwise ops, channel Concat, Resize, reductions with keepdims); a group that touches a oneDNN
 *      convolution and whose every reader and writer accepts channels-last data is stored NHWC.
 *      Those ops then run the reference kernels on [N,H,W,C] views (Concat's axis, reduction
 *      axes and Resize's scales/sizes/roi rewritten to match), and convolutions read and write NHWC directly, so
 *      conversions happen only at the edges (graph inputs/outputs and other ops), inside the
 *      convolution that reads or writes the edge. Tensors with one channel or one pixel are the
 *      same bytes in both layouts and never constrain a group.
 *   4. oneDNN primitives are created with the chosen layouts; a convolution oneDNN cannot run
 *      well falls back to the reference kernel (with no fusion) and the pass starts over.
 *   5. Fast kernels (kernels/fast.c; MTS_NO_FAST=1 turns this off for comparisons): a Div/Mul by
 *      a constant scalar before a last-axis Softmax becomes the softmax's input scale; rank-4
 *      float MatMuls (attention) read their operands through the Reshape + Transpose steps before
 *      them and write through a Transpose (+ Reshape) after them as strides, so those copies go;
 *      chains of float Add/Sub/Mul/Div/Relu/Sigmoid steps (each intermediate read only by the
 *      next) become one pass at the last step's position; ReduceMean/Max/Sum, LayerNormalization
 *      and Softmax steps get the vectorized kernels.
 * The reference backend skips all of this: its plans run node by node, as the oracle.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/dnnl_ops.h"
#include "engine/model.h"
#include "util/par_items.h"

typedef struct cinfo {
    int step;
    mts_dconv_spec spec;
    float *wtmp;    /* BN-folded weights (malloc'd; freed once packed) */
    float *bfold;   /* BN-folded bias (plan pool) */
    int resid[MTS_DPOST_MAX];
    int n_resid;
    int create_rc;  /* mts_dconv_create's result (create_all) */
    mts_err create_err;
} cinfo;

typedef struct opt {
    mts_model *m;
    mts__plan *p;
    int nv, ns;
    int *nuse;       /* per value: readers among live steps (+1 when a graph output) */
    int *reader;     /* per value: one reading step */
    int *prod;       /* per value: producing step, -1 if none */
    uint8_t *is_out; /* per value: graph output */
    uint8_t *removed;/* per step */
    int *parent;     /* union-find over values */
    uint8_t *gbad, *gconv;
} opt;

static bool is_op(const mts__step *st, const char *name)
{
    return st->nd->domain[0] == 0 && !strcmp(st->nd->op_type, name);
}

static bool live_value(const mts__plan *p, int v)
{
    return v >= 0 && (p->state[v] == MTS__V_STATIC || p->state[v] == MTS__V_INPUT);
}

static bool const_value(const mts__plan *p, int v)
{
    return v >= 0 && p->state[v] == MTS__V_CONST;
}

static bool is_neutral(const mts_tensor *t)
{
    return t->rank == 4 && (t->dims[1] == 1 || t->dims[2] * t->dims[3] == 1);
}

static bool is_cand(const opt *o, int v)
{
    return v >= 0 && o->p->state[v] == MTS__V_STATIC && o->p->vals[v].rank == 4 && !is_neutral(&o->p->vals[v]);
}

static void count_uses(opt *o)
{
    mts__plan *p = o->p;
    for (int v = 0; v < o->nv; v++) o->nuse[v] = o->is_out[v], o->reader[v] = -1, o->prod[v] = -1;
    for (int s = 0; s < p->n_steps; s++) {
        if (o->removed[s]) continue;
        const mts__step *st = &p->steps[s];
        for (int j = 0; j < st->n_in; j++) {
            int v = st->in[j];
            if (v < 0) continue;
            bool again = false;
            for (int q = 0; q < j; q++)
                if (st->in[q] == v) again = true;
            if (again) {
                o->nuse[v] += 2; /* read twice by one step: never fusable */
                continue;
            }
            o->nuse[v]++;
            o->reader[v] = s;
        }
        for (int j = 0; j < st->n_out; j++)
            if (st->out[j] >= 0) o->prod[st->out[j]] = s;
    }
}

/* The only reader of v when v has exactly one and is not a graph output; else -1. */
static int sole_reader(const opt *o, int v)
{
    return (v >= 0 && o->nuse[v] == 1 && !o->is_out[v]) ? o->reader[v] : -1;
}

static void redirect(opt *o, int from, int to)
{
    for (int s = 0; s < o->p->n_steps; s++) {
        mts__step *st = &o->p->steps[s];
        for (int j = 0; j < st->n_in; j++)
            if (st->in[j] == from) st->in[j] = to;
    }
}

/* Pass 1: Identity / inference Dropout. */
static void remove_identities(opt *o)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (st->dynamic || st->n_in < 1 || st->n_out < 1) continue;
        bool drop = is_op(st, "Dropout");
        if (!is_op(st, "Identity") && !drop) continue;
        int x = st->in[0], y = st->out[0];
        if (x < 0 || y < 0 || o->is_out[y] || p->state[x] == MTS__V_DYNAMIC) continue;
        if (drop) {
            if (st->n_out > 1 && st->out[1] >= 0 && (o->nuse[st->out[1]] > 0)) continue; /* mask used */
            if (st->n_in > 2 && st->in[2] >= 0) {
                const mts_tensor *t = &p->vals[st->in[2]];
                if (!const_value(p, st->in[2]) || mts_tensor_get_int(t, 0) != 0) continue; /* training mode */
            }
        }
        redirect(o, y, x);
        o->removed[s] = 1;
        p->state[y] = MTS__V_UNUSED;
        count_uses(o);
    }
}

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
static bool as_postop(const opt *o, const mts__step *st, int x, mts_dpost *po, int *resid)
{
    const mts__plan *p = o->p;
    if (st->dynamic || st->kind != MTS__S_KERNEL || st->n_out != 1 || st->out[0] < 0) return false;
    if (p->vals[st->out[0]].dtype != MTS_DTYPE_FLOAT) return false;
    memset(po, 0, sizeof *po);
    *resid = -1;
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

static bool const_scalar(const mts__plan *p, int v, float *f)
{
    if (!const_value(p, v) || p->vals[v].dtype != MTS_DTYPE_FLOAT || mts_tensor_numel(&p->vals[v]) != 1) return false;
    *f = ((const float *)p->vals[v].data)[0];
    return true;
}

/* x * c for an elementwise step st (op "Mul" or "Div") reading x and a constant scalar: c (1/c for
 * Div), else 0. */
static float scaled_by(const mts__plan *p, const mts__step *st, int x)
{
    float f;
    if (st->dynamic || st->kind != MTS__S_KERNEL || st->n_in != 2 || st->n_out != 1) return 0;
    if (is_op(st, "Mul")) {
        int o = st->in[0] == x ? st->in[1] : st->in[0];
        return (st->in[0] == x || st->in[1] == x) && const_scalar(p, o, &f) ? f : 0;
    }
    if (is_op(st, "Div") && st->in[0] == x && const_scalar(p, st->in[1], &f) && f != 0) return 1.0f / f;
    return 0;
}

/* GELU written out, as exported from PyTorch: y = (x * (erf(x / sqrt2) + 1)) * 0.5, x read twice.
 * On a match, marks the five nodes removed and returns the last one's output; else -1. */
static int gelu_pattern(opt *o, int x)
{
    mts__plan *p = o->p;
    if (x < 0 || o->nuse[x] != 2 || o->is_out[x]) return -1;
    int rd[2], n = 0;
    for (int s = 0; s < p->n_steps && n < 2; s++) {
        if (o->removed[s]) continue;
        for (int j = 0; j < p->steps[s].n_in; j++)
            if (p->steps[s].in[j] == x) {
                rd[n++] = s;
                break;
            }
    }
    if (n != 2) return -1;
    for (int first = 0; first < 2; first++) {
        int d = rd[first], mul = rd[1 - first];
        if (fabsf(scaled_by(p, &p->steps[d], x) - 0.70710678f) > 1e-5f) continue;
        int e = sole_reader(o, p->steps[d].out[0]);
        if (e < 0 || !is_op(&p->steps[e], "Erf") || p->steps[e].dynamic) continue;
        int a = sole_reader(o, p->steps[e].out[0]);
        if (a < 0 || !is_op(&p->steps[a], "Add") || p->steps[a].n_in != 2) continue;
        int ea = p->steps[e].out[0], one = p->steps[a].in[0] == ea ? p->steps[a].in[1] : p->steps[a].in[0];
        float f;
        if (!const_scalar(p, one, &f) || f != 1.0f) continue;
        const mts__step *m1 = &p->steps[mul];
        int aa = p->steps[a].out[0];
        if (!is_op(m1, "Mul") || m1->n_in != 2 || m1->dynamic ||
            !((m1->in[0] == x && m1->in[1] == aa) || (m1->in[1] == x && m1->in[0] == aa)) ||
            sole_reader(o, aa) != mul)
            continue;
        int m2 = sole_reader(o, m1->out[0]);
        if (m2 < 0 || scaled_by(p, &p->steps[m2], m1->out[0]) != 0.5f) continue;
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

/* MatMul followed by Add of a constant [N] (or [1.., N]) row: that row is the bias. */
static bool matmul_bias(const opt *o, const mts__step *st, int x, int64_t N, const float **bias)
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
    mts__plan *p;
    cinfo *ci;
} create_job;

static void create_one(void *arg, int i)
{
    create_job *j = arg;
    cinfo *c = &j->ci[i];
    c->create_err.msg[0] = 0;
    c->create_rc = mts_dconv_create(&c->spec, &j->p->steps[c->step].dconv, &c->create_err);
}

static void create_all(mts__plan *p, cinfo *ci, int n)
{
    create_job j = {p, ci};
    mts_par_items(n, CREATE_THREADS, 4, create_one, &j); /* a few steps: not worth a thread */
}

/* Pass 2a: is step s a convolution or pooling oneDNN may run? Fills c->spec's geometry and
 * weights. */
static bool conv_eligible(opt *o, int s, const uint8_t *no_dnnl, cinfo *c)
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
    c->spec.key = st->node;
    c->spec.cache = &o->m->dnnl_cache;
    mts_err e = {0};
    mts_tensor kout[2];
    bool maxp = is_op(st, "MaxPool"), avgp = is_op(st, "AveragePool");
    if (maxp || avgp) {
        if (st->n_out < 1 || st->out[0] < 0) return false;
        if (st->n_out > 1 && st->out[1] >= 0 && (o->nuse[st->out[1]] > 0 || o->is_out[st->out[1]])) return false;
        const mts_tensor *kin[1] = {x};
        mts_kctx k = {st->nd, kin, 1, kout, 1, &e, 1};
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
    mts_kctx k = {st->nd, kin, st->n_in > 3 ? 3 : st->n_in, kout, 1, &e, 1};
    if (mts_conv_geometry(&k, tr, &c->spec.g) != MTS_OK) return false;
    /* Tiny convolutions on one pixel (attention MLPs): the reference kernel is as fast and a
     * oneDNN primitive would cost JIT code and per-call setup. */
    const mts_conv_geom *g = &c->spec.g;
    double macs = (double)g->N * (double)g->M * (double)(g->C / g->group) * (double)(g->k[0] * g->k[1] * g->k[2]) *
                  (double)(g->out[0] * g->out[1] * g->out[2]);
    if (g->out[0] * g->out[1] * g->out[2] == 1 && macs < 65536) return false;
    /* One output channel from a few (CBAM's spatial-attention conv): the direct kernel in
     * fast.c uses every vector lane, oneDNN's blocked kernels waste most of them. */
    if (!tr && mts_fast_conv_small_ok(g) && !getenv("MTS_NO_FAST")) return false;
    c->spec.kind = tr ? MTS_DPRIM_DECONV : MTS_DPRIM_CONV;
    c->spec.transpose = tr;
    c->spec.w = kin[1]->data;
    c->spec.b = kin[2] ? kin[2]->data : NULL;
    return true;
}

/* Pass 2b: folds a BatchNormalization reading the conv's output into its weights. */
static int fold_bn(opt *o, cinfo *c, int *cur, mts_err *err)
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

static int find(int *parent, int v)
{
    while (parent[v] != v) v = parent[v] = parent[parent[v]];
    return v;
}

static void unite(int *parent, int a, int b)
{
    a = find(parent, a), b = find(parent, b);
    if (a != b) parent[a] = b;
}

static bool rank4_ok(const opt *o, int v)
{
    const mts_tensor *t = &o->p->vals[v];
    return t->rank == 4 && (is_cand(o, v) || (is_neutral(t) && o->p->state[v] != MTS__V_DYNAMIC));
}

/* A Conv step the direct small-channel kernel (fast.c) runs (1-4 output channels): its source
 * and its output may each be stored either way. */
static bool small_conv_step(const opt *o, const mts__step *st)
{
    const mts__plan *p = o->p;
    if (getenv("MTS_NO_FAST") || st->dynamic || st->kind != MTS__S_KERNEL || !is_op(st, "Conv") || st->n_in < 2 ||
        st->n_out != 1 || st->in[0] < 0 || !const_value(p, st->in[1]) || (st->n_in > 2 && st->in[2] >= 0 && !const_value(p, st->in[2])))
        return false;
    const mts_tensor *x = &p->vals[st->in[0]];
    if (x->dtype != MTS_DTYPE_FLOAT || x->rank != 4) return false;
    const mts_tensor *kin[3] = {x, &p->vals[st->in[1]], st->n_in > 2 && st->in[2] >= 0 ? &p->vals[st->in[2]] : NULL};
    mts_err e = {0};
    mts_tensor kout[1];
    mts_kctx k = {st->nd, kin, st->n_in > 3 ? 3 : st->n_in, kout, 1, &e, 1};
    mts_conv_geom g;
    return mts_conv_geometry(&k, false, &g) == MTS_OK && mts_fast_conv_small_ok(&g);
}

/* Can step st run on channels-last views of its 4-D tensors? */
static bool layout_agnostic(const opt *o, const mts__step *st)
{
    static const char *const unary[] = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Elu",
                                        "Selu", "Softplus", "Exp", "Abs", "Neg", "Sqrt", "Erf", "Clip", "Identity",
                                        "Floor", "Ceil", "Reciprocal", "Softsign", "Log", NULL};
    static const char *const binary[] = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", NULL};
    const mts__plan *p = o->p;
    if (st->dynamic || st->kind != MTS__S_KERNEL || st->nd->domain[0] || st->n_out != 1 || st->out[0] < 0) return false;
    if (p->vals[st->out[0]].rank != 4) return false;
    const char *op = st->nd->op_type;
    for (int i = 0; unary[i]; i++)
        if (!strcmp(op, unary[i])) {
            if (st->n_in < 1 || st->in[0] < 0 || !rank4_ok(o, st->in[0])) return false;
            for (int j = 1; j < st->n_in; j++)
                if (st->in[j] >= 0 && !(const_value(p, st->in[j]) && mts_tensor_numel(&p->vals[st->in[j]]) == 1))
                    return false;
            return true;
        }
    for (int i = 0; binary[i]; i++)
        if (!strcmp(op, binary[i])) {
            if (!strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div"))
                if (st->nd->opset < 7) return false; /* legacy broadcast attributes */
            for (int j = 0; j < st->n_in; j++) {
                int v = st->in[j];
                if (v < 0) return false;
                if (const_value(p, v) && mts_tensor_numel(&p->vals[v]) == 1) continue;
                if (!rank4_ok(o, v)) return false;
            }
            return st->n_in >= 1;
        }
    if (!strcmp(op, "Concat")) {
        int64_t ax = mts_attr_int(st->nd, "axis", 1);
        if (ax != 1 && ax != -3) return false;
        for (int j = 0; j < st->n_in; j++)
            if (st->in[j] < 0 || !rank4_ok(o, st->in[j])) return false;
        return st->n_in >= 1;
    }
    if (!strncmp(op, "Reduce", 6)) {
        static const char *const red[] = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd",
                                          "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", NULL};
        bool known = false;
        for (int i = 0; red[i]; i++) known |= !strcmp(op, red[i]);
        if (!known || mts_attr_int(st->nd, "keepdims", 1) != 1 || st->n_in < 1 || st->in[0] < 0 ||
            !rank4_ok(o, st->in[0]) || st->n_in > 2)
            return false;
        if (st->n_in == 2 && st->in[1] >= 0) {
            const mts_tensor *a = &p->vals[st->in[1]];
            if (!const_value(p, st->in[1]) || a->dtype != MTS_DTYPE_INT64) return false;
        }
        return true;
    }
    if (!strcmp(op, "Resize")) {
        if (st->nd->opset < 11 || mts_node_attr(st->nd, "axes") || st->n_in < 1 || st->in[0] < 0 ||
            !rank4_ok(o, st->in[0]))
            return false;
        static const int64_t want[4] = {0, 8, 4, 4}; /* roi, scales, sizes: element counts when present */
        for (int j = 1; j < st->n_in && j < 4; j++) {
            int v = st->in[j];
            if (v < 0) continue;
            if (!const_value(p, v)) return false;
            int64_t n = mts_tensor_numel(&p->vals[v]);
            if (n != 0 && n != want[j]) return false;
        }
        return st->n_in <= 4;
    }
    return false;
}

/* A copy of t with its elements permuted: groups of 4 as [0,2,3,1] (NCHW order -> NHWC order). */
static const mts_tensor *permuted_const(mts__plan *p, const mts_tensor *t)
{
    int64_t n = mts_tensor_numel(t);
    size_t es = mts_dtype_size(t->dtype);
    mts_tensor *c = mts_pool_calloc(&p->pool, 1, sizeof *c);
    if (!c || es == 0) return NULL;
    *c = *t;
    if (n == 0) return c;
    char *d = mts_pool_alloc(&p->pool, (size_t)n * es);
    if (!d) return NULL;
    static const int perm[4] = {0, 2, 3, 1};
    for (int64_t g = 0; g < n / 4; g++)
        for (int i = 0; i < 4; i++) memcpy(d + (size_t)(g * 4 + i) * es, (const char *)t->data + (size_t)(g * 4 + perm[i]) * es, es);
    c->data = d;
    return c;
}

/* Resize that is a nearest-neighbour upsampling by integer factors on H and W: out[y] = in[y/s].
 * For integer s, asymmetric + floor and half_pixel + round_prefer_floor/ceil both pick y/s. */
static bool nearest_integer_upsample(const mts__plan *p, const mts__step *st)
{
    const mts_node *n = st->nd;
    if (strcmp(mts_attr_string(n, "mode", "nearest"), "nearest")) return false;
    const char *ct = mts_attr_string(n, "coordinate_transformation_mode", "half_pixel");
    const char *nm = mts_attr_string(n, "nearest_mode", "round_prefer_floor");
    bool ok = (!strcmp(ct, "asymmetric") && !strcmp(nm, "floor")) ||
              (!strcmp(ct, "half_pixel") && (!strcmp(nm, "round_prefer_floor") || !strcmp(nm, "round_prefer_ceil")));
    if (!ok || mts_attr_int(n, "antialias", 0) || mts_node_attr(n, "axes")) return false;
    const mts_tensor *x = &p->vals[st->in[0]], *y = &p->vals[st->out[0]];
    if (x->rank != 4 || y->rank != 4 || x->dims[0] != y->dims[0] || x->dims[1] != y->dims[1]) return false;
    for (int a = 2; a < 4; a++)
        if (x->dims[a] < 1 || y->dims[a] % x->dims[a] != 0) return false;
    /* The planned output shape must come from exact factors: with scales, out = floor(in * s). */
    if (st->n_in > 2 && st->in[2] >= 0 && mts_tensor_numel(&p->vals[st->in[2]]) == 4) {
        const mts_tensor *sc = &p->vals[st->in[2]];
        if (sc->dtype != MTS_DTYPE_FLOAT) return false;
        const float *s = sc->data;
        if (s[0] != 1.0f || s[1] != 1.0f) return false;
        for (int a = 2; a < 4; a++)
            if (s[a] != (float)(y->dims[a] / x->dims[a])) return false;
    }
    return true;
}

static int rewrite_nhwc_step(mts__plan *p, mts__step *st, mts_err *err)
{
    st->nhwc = 1;
    if (!strcmp(st->nd->op_type, "Concat")) {
        mts_node *n = mts_pool_alloc(&p->pool, sizeof *n);
        mts_attr *a = n ? mts_pool_alloc(&p->pool, sizeof *a * (size_t)(st->nd->n_attr + 1)) : NULL;
        if (!a) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        *n = *st->nd;
        memcpy(a, st->nd->attrs, sizeof *a * (size_t)st->nd->n_attr);
        for (int i = 0; i < n->n_attr; i++)
            if (!strcmp(a[i].name, "axis")) a[i].i = 3;
        n->attrs = a;
        st->nd = n;
        bool same = true; /* the channels-last copy kernel needs one element type */
        for (int j = 0; j < st->n_in; j++)
            if (p->vals[st->in[j]].dtype != p->vals[st->out[0]].dtype || p->vals[st->in[j]].rank != 4) same = false;
        if (same) st->op = &mts_nhwc_concat;
    } else if (!strncmp(st->nd->op_type, "Reduce", 6)) {
        /* Axes name NCHW positions; on NHWC views axis 1 is 3, 2 is 1 and 3 is 2. */
        static const int64_t map[4] = {0, 3, 1, 2};
        const mts_attr *ax = mts_node_attr(st->nd, "axes");
        if (ax && ax->n > 0) {
            mts_node *n = mts_pool_alloc(&p->pool, sizeof *n);
            mts_attr *a = n ? mts_pool_alloc(&p->pool, sizeof *a * (size_t)(st->nd->n_attr + 1)) : NULL;
            int64_t *v = a ? mts_pool_alloc(&p->pool, sizeof *v * (size_t)ax->n) : NULL;
            if (!v) return mts_err_set(err, MTS_ENOMEM, "out of memory");
            *n = *st->nd;
            memcpy(a, st->nd->attrs, sizeof *a * (size_t)st->nd->n_attr);
            for (int i = 0; i < n->n_attr; i++)
                if (!strcmp(a[i].name, "axes")) {
                    for (int j = 0; j < ax->n; j++) {
                        int64_t x = ax->ints[j] < 0 ? ax->ints[j] + 4 : ax->ints[j];
                        v[j] = x >= 0 && x < 4 ? map[x] : ax->ints[j];
                    }
                    a[i].ints = v;
                }
            n->attrs = a;
            st->nd = n;
        }
        if (st->n_in == 2 && st->in[1] >= 0) {
            const mts_tensor *t = &p->vals[st->in[1]];
            mts_tensor *c = mts_pool_calloc(&p->pool, 1, sizeof *c);
            st->cin = mts_pool_calloc(&p->pool, 2, sizeof *st->cin);
            int64_t n = mts_tensor_numel(t);
            int64_t *d = mts_pool_alloc(&p->pool, sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
            if (!c || !st->cin || !d) return mts_err_set(err, MTS_ENOMEM, "out of memory");
            *c = *t;
            for (int64_t j = 0; j < n; j++) {
                int64_t x = ((const int64_t *)t->data)[j];
                int64_t xn = x < 0 ? x + 4 : x;
                d[j] = xn >= 0 && xn < 4 ? map[xn] : x;
            }
            c->data = d;
            st->cin[1] = c;
        }
    } else if (!strcmp(st->nd->op_type, "Resize")) {
        st->cin = mts_pool_calloc(&p->pool, (size_t)st->n_in, sizeof *st->cin);
        if (!st->cin) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        for (int j = 1; j < st->n_in; j++)
            if (st->in[j] >= 0 && !(st->cin[j] = permuted_const(p, &p->vals[st->in[j]])))
                return mts_err_set(err, MTS_ENOMEM, "out of memory");
        if (nearest_integer_upsample(p, st)) st->op = &mts_nhwc_upsample_nearest;
    }
    return MTS_OK;
}

/* A plan-owned copy of st->nd with op_type `op` (NULL: unchanged) and one more attribute. */
static mts_node *node_with_attr(mts__plan *p, const mts__step *st, const char *op, mts_attr extra)
{
    mts_node *n = mts_pool_alloc(&p->pool, sizeof *n);
    mts_attr *a = n ? mts_pool_alloc(&p->pool, sizeof *a * (size_t)(st->nd->n_attr + 1)) : NULL;
    if (!a) return NULL;
    *n = *st->nd;
    memcpy(a, st->nd->attrs, sizeof *a * (size_t)st->nd->n_attr);
    a[n->n_attr++] = extra;
    n->attrs = a;
    if (op) n->op_type = op;
    return n;
}

static bool float_value(const mts__plan *p, int v)
{
    return v >= 0 && (live_value(p, v) || const_value(p, v)) && p->vals[v].dtype == MTS_DTYPE_FLOAT;
}

/* Softmax over the last axis reading x / c or x * c (c a constant scalar, the attention scale):
 * the scale becomes the fast kernel's attribute "mts_scale" and the Div/Mul step goes. */
static int fuse_softmax_scale(opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (o->removed[s] || st->kind != MTS__S_KERNEL || st->dynamic || !is_op(st, "Softmax") || st->n_in != 1 ||
            st->n_out != 1)
            continue;
        int y = st->in[0];
        const mts_tensor *t = y >= 0 ? &p->vals[y] : NULL;
        int64_t ax = mts_attr_int(st->nd, "axis", st->nd->opset >= 13 ? -1 : 1);
        if (!t || t->dtype != MTS_DTYPE_FLOAT || t->rank < 1 || !(ax == -1 || ax == t->rank - 1) ||
            p->state[y] != MTS__V_STATIC || o->prod[y] < 0 || sole_reader(o, y) != s)
            continue;
        int d = o->prod[y];
        const mts__step *ds = &p->steps[d];
        if (o->removed[d] || ds->kind != MTS__S_KERNEL || ds->n_in != 2 || ds->nd->opset < 7) continue;
        int x = ds->in[0];
        float c = scaled_by(p, ds, x);
        if (c == 0 && is_op(ds, "Mul")) c = scaled_by(p, ds, x = ds->in[1]);
        if (c == 0 || !float_value(p, x) || !mts_shape_equal(&p->vals[x], t)) continue;
        mts_attr a = {0};
        a.name = "mts_scale";
        a.type = MTS_ATTR_FLOAT;
        a.f = c;
        mts_node *n = node_with_attr(p, st, NULL, a);
        if (!n) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        st->nd = n;
        st->op = &mts_fast_softmax;
        st->in[0] = x;
        o->removed[d] = 1;
        p->state[y] = MTS__V_UNUSED;
        count_uses(o);
    }
    return MTS_OK;
}

static bool plain_step(const opt *o, int s, const char *op);

/* Reduce step r over the channel axis of a 4-D tensor, keepdims, axes by attribute or constant. */
static bool channel_reduce(const opt *o, int r, const char *op)
{
    const mts__plan *p = o->p;
    if (!plain_step(o, r, op) || mts_attr_int(p->steps[r].nd, "keepdims", 1) != 1) return false;
    const mts__step *st = &p->steps[r];
    const int64_t *ax = NULL;
    int n = 0;
    if (st->n_in >= 2 && st->in[1] >= 0) {
        const mts_tensor *t = &p->vals[st->in[1]];
        if (!const_value(p, st->in[1]) || t->dtype != MTS_DTYPE_INT64) return false;
        ax = t->data;
        n = (int)mts_tensor_numel(t);
    } else {
        ax = mts_attr_ints(st->nd, "axes", &n);
    }
    return ax && n == 1 && (ax[0] == 1 || ax[0] == -3);
}

/* CBAM spatial attention: Concat(ReduceMean(m, C), ReduceMax(m, C)) on channels-last data
 * becomes one MtsChannelPool step (at the Concat). When m = x * c with c a per-sample channel
 * vector [N,C,1,1], the pooling reads x and c, so m keeps one reader fewer (and the chain pass
 * that follows can then compute it on the fly). */
static int fuse_channel_pool(opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (!plain_step(o, s, "Concat") || st->n_in != 2) continue;
        int y = st->out[0];
        int64_t axc = mts_attr_int(st->nd, "axis", 1);
        if ((axc != 1 && axc != -3) || !is_cand(o, y) || !p->nhwc[y] || p->vals[y].dtype != MTS_DTYPE_FLOAT) continue;
        int a = st->in[0], b = st->in[1];
        int ra = a >= 0 ? o->prod[a] : -1, rb = b >= 0 ? o->prod[b] : -1;
        if (ra < 0 || rb < 0 || sole_reader(o, a) != s || sole_reader(o, b) != s || !channel_reduce(o, ra, "ReduceMean") ||
            !channel_reduce(o, rb, "ReduceMax") || p->steps[ra].in[0] != p->steps[rb].in[0])
            continue;
        int m = p->steps[ra].in[0];
        if (!is_cand(o, m) || !p->nhwc[m] || p->vals[m].dtype != MTS_DTYPE_FLOAT) continue;
        int ins[2] = {m, -1}, nin = 1;
        int q = o->prod[m];
        if (plain_step(o, q, "Mul") && p->steps[q].n_in == 2 && p->steps[q].nd->opset >= 7) {
            for (int side = 0; side < 2; side++) {
                int x = p->steps[q].in[side], c = p->steps[q].in[1 - side];
                const mts_tensor *tx = x >= 0 ? &p->vals[x] : NULL, *tc = c >= 0 ? &p->vals[c] : NULL;
                if (!tx || !tc || !is_cand(o, x) || !p->nhwc[x] || !mts_shape_equal(tx, &p->vals[m]) ||
                    !float_value(p, c) || tc->rank != 4 || tc->dims[1] != tx->dims[1] || tc->dims[2] != 1 ||
                    tc->dims[3] != 1 || (tc->dims[0] != 1 && tc->dims[0] != tx->dims[0]))
                    continue;
                ins[0] = x, ins[1] = c, nin = 2;
                break;
            }
        }
        int *io = mts_pool_alloc(&p->pool, sizeof(int) * 3);
        mts_node *n = mts_pool_alloc(&p->pool, sizeof *n);
        if (!io || !n) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        *n = *st->nd;
        n->op_type = "MtsChannelPool";
        n->n_attr = 0;
        n->attrs = NULL;
        io[0] = ins[0], io[1] = ins[1], io[nin] = y;
        st->nd = n;
        st->op = &mts_fast_cpool;
        st->in = io;
        st->n_in = nin;
        st->out = io + nin;
        o->removed[ra] = o->removed[rb] = 1;
        p->state[a] = p->state[b] = MTS__V_UNUSED;
        count_uses(o);
    }
    return MTS_OK;
}

/* The chain stage code of elementwise step st reading the chain value `cur` (-1: the step starts
 * a chain), and its other operand in *operand (-1 for unary stages); -1 when st cannot be one. */
static int chain_stage(const opt *o, const mts__step *st, int cur, int *operand)
{
    const mts__plan *p = o->p;
    *operand = -1;
    if (st->kind != MTS__S_KERNEL || st->dynamic || st->nd->domain[0] || st->n_out != 1 || st->out[0] < 0 ||
        p->vals[st->out[0]].dtype != MTS_DTYPE_FLOAT || p->state[st->out[0]] != MTS__V_STATIC)
        return -1;
    if (is_op(st, "Relu") || is_op(st, "Sigmoid")) {
        if (st->n_in != 1 || !float_value(p, st->in[0]) || (cur >= 0 && st->in[0] != cur)) return -1;
        return is_op(st, "Relu") ? MTS_CHAIN_RELU : MTS_CHAIN_SIGMOID;
    }
    int code;
    if (is_op(st, "Add")) code = MTS_CHAIN_ADD;
    else if (is_op(st, "Sub")) code = MTS_CHAIN_SUB;
    else if (is_op(st, "Mul")) code = MTS_CHAIN_MUL;
    else if (is_op(st, "Div")) code = MTS_CHAIN_DIV;
    else return -1;
    if (st->n_in != 2 || st->nd->opset < 7 || !float_value(p, st->in[0]) || !float_value(p, st->in[1])) return -1;
    if (cur < 0) {
        *operand = st->in[1];
        return code;
    }
    if (st->in[0] == st->in[1] || !mts_shape_equal(&p->vals[cur], &p->vals[st->out[0]])) return -1;
    if (st->in[0] == cur) {
        *operand = st->in[1];
        return code;
    }
    if (st->in[1] != cur) return -1;
    *operand = st->in[0];
    return code == MTS_CHAIN_SUB ? MTS_CHAIN_RSUB : code == MTS_CHAIN_DIV ? MTS_CHAIN_RDIV : code;
}

/* Chains of float elementwise steps (each intermediate read only by the next) become one fast
 * step at the position of the chain's last step, where every operand has been computed. */
static int fuse_chains(opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    enum { MAXS = 8 };
    for (int s = 0; s < p->n_steps; s++) {
        if (o->removed[s]) continue;
        int operand, code = chain_stage(o, &p->steps[s], -1, &operand);
        if (code < 0) continue;
        int64_t ops[MAXS];
        int ins[MAXS + 1], steps[MAXS], n_ops = 0, n_in = 0, n_steps = 0;
        ins[n_in++] = p->steps[s].in[0];
        ops[n_ops++] = code;
        if (operand >= 0) ins[n_in++] = operand;
        steps[n_steps++] = s;
        int cur = p->steps[s].out[0];
        while (n_ops < MAXS && n_in < MAXS) {
            int r = sole_reader(o, cur);
            if (r < 0 || o->removed[r]) break;
            code = chain_stage(o, &p->steps[r], cur, &operand);
            if (code < 0) break;
            ops[n_ops++] = code;
            if (operand >= 0) ins[n_in++] = operand;
            steps[n_steps++] = r;
            cur = p->steps[r].out[0];
        }
        int last = steps[n_steps - 1];
        mts__step *st = &p->steps[last];
        mts_attr a = {0};
        a.name = "ops";
        a.type = MTS_ATTR_INTS;
        a.n = n_ops;
        int64_t *opv = mts_pool_alloc(&p->pool, sizeof(int64_t) * (size_t)n_ops);
        int *io = mts_pool_alloc(&p->pool, sizeof(int) * (size_t)(n_in + 1));
        if (!opv || !io) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        memcpy(opv, ops, sizeof(int64_t) * (size_t)n_ops);
        a.ints = opv;
        mts_node *n = node_with_attr(p, st, "MtsEltwiseChain", a);
        if (!n) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        memcpy(io, ins, sizeof(int) * (size_t)n_in);
        io[n_in] = cur;
        st->nd = n;
        st->op = &mts_fast_chain;
        st->in = io;
        st->n_in = n_in;
        st->out = io + n_in;
        st->n_out = 1;
        for (int i = 0; i + 1 < n_steps; i++) {
            o->removed[steps[i]] = 1;
            p->state[p->steps[steps[i]].out[0]] = MTS__V_UNUSED;
        }
        count_uses(o);
    }
    return MTS_OK;
}

static void contiguous_strides(const mts_tensor *t, int64_t *st)
{
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; i--) st[i] = s, s *= t->dims[i];
}

static bool plain_float4(const mts__plan *p, int v)
{
    return live_value(p, v) && p->vals[v].rank == 4 && p->vals[v].dtype == MTS_DTYPE_FLOAT && !p->nhwc[v];
}

/* The permutation of Transpose step ts over rank 4 (default: reversed); false if malformed. */
static bool perm4(const mts__step *ts, int64_t perm[4])
{
    int n = 0;
    const int64_t *pa = mts_attr_ints(ts->nd, "perm", &n);
    bool seen[4] = {false};
    for (int i = 0; i < 4; i++) {
        perm[i] = pa ? (n == 4 ? pa[i] : -1) : 3 - i;
        if (perm[i] < 0 || perm[i] > 3 || seen[perm[i]]) return false;
        seen[perm[i]] = true;
    }
    return true;
}

static bool plain_step(const opt *o, int s, const char *op)
{
    return s >= 0 && !o->removed[s] && o->p->steps[s].kind == MTS__S_KERNEL && !o->p->steps[s].dynamic &&
           is_op(&o->p->steps[s], op) && o->p->steps[s].n_out == 1;
}

/* Operand v of MatMul step s as a strided view: through a Transpose read only by s, and a
 * Reshape before it read only by the Transpose (the bytes are the Reshape's input). */
static void operand_view(opt *o, int s, int v, int64_t st[4], int *src, int *rm, int *n_rm)
{
    mts__plan *p = o->p;
    contiguous_strides(&p->vals[v], st);
    *src = v;
    int t = o->prod[v];
    int64_t perm[4], ust[4];
    if (p->state[v] != MTS__V_STATIC || sole_reader(o, v) != s || !plain_step(o, t, "Transpose") ||
        p->steps[t].n_in != 1 || !perm4(&p->steps[t], perm) || !plain_float4(p, p->steps[t].in[0]))
        return;
    int u = p->steps[t].in[0];
    contiguous_strides(&p->vals[u], ust);
    for (int i = 0; i < 4; i++) st[i] = ust[perm[i]];
    *src = u;
    rm[(*n_rm)++] = t;
    int r = o->prod[u];
    if (p->state[u] != MTS__V_STATIC || sole_reader(o, u) != t || !plain_step(o, r, "Reshape")) return;
    int w = p->steps[r].in[0];
    if (!live_value(p, w) || p->vals[w].dtype != MTS_DTYPE_FLOAT || (p->vals[w].rank == 4 && p->nhwc[w]) ||
        mts_tensor_numel(&p->vals[w]) != mts_tensor_numel(&p->vals[u]))
        return;
    *src = w;
    rm[(*n_rm)++] = r;
}

static int64_t *pool_ints(mts__plan *p, const int64_t *v, int n)
{
    int64_t *d = mts_pool_alloc(&p->pool, sizeof(int64_t) * (size_t)n);
    if (d) memcpy(d, v, sizeof(int64_t) * (size_t)n);
    return d;
}

/* Batched float MatMuls of rank 4 (attention) run on strided views (kernels/fast.c): the
 * Reshape + Transpose steps feeding them and a Transpose (+ Reshape) after them become strides. */
static int fuse_strided_matmuls(opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (!plain_step(o, s, "MatMul") || st->n_in != 2) continue;
        int a = st->in[0], b = st->in[1], y = st->out[0];
        if (!plain_float4(p, a) || !plain_float4(p, b) || !plain_float4(p, y) || p->state[y] != MTS__V_STATIC) continue;
        const mts_tensor *ta = &p->vals[a], *tb = &p->vals[b], *ty = &p->vals[y];
        if (ta->dims[0] != tb->dims[0] || ta->dims[1] != tb->dims[1] || ta->dims[3] != tb->dims[2]) continue;
        int rm[6], n_rm = 0, sa, sb;
        int64_t as[4], bs[4], ys[4];
        operand_view(o, s, a, as, &sa, rm, &n_rm);
        operand_view(o, s, b, bs, &sb, rm, &n_rm);
        /* the output, through a Transpose (+ Reshape) that keeps columns contiguous */
        int fin = y, t2 = sole_reader(o, y);
        contiguous_strides(ty, ys);
        int64_t perm[4];
        if (plain_step(o, t2, "Transpose") && p->steps[t2].n_in == 1 && perm4(&p->steps[t2], perm) && perm[3] == 3 &&
            plain_float4(p, p->steps[t2].out[0]) && p->state[p->steps[t2].out[0]] == MTS__V_STATIC) {
            int z = p->steps[t2].out[0];
            int64_t zs[4];
            contiguous_strides(&p->vals[z], zs);
            for (int j = 0; j < 4; j++) ys[perm[j]] = zs[j];
            rm[n_rm++] = t2;
            fin = z;
            int r2 = sole_reader(o, z);
            if (plain_step(o, r2, "Reshape") && p->state[p->steps[r2].out[0]] == MTS__V_STATIC &&
                p->vals[p->steps[r2].out[0]].dtype == MTS_DTYPE_FLOAT &&
                !(p->vals[p->steps[r2].out[0]].rank == 4 && p->nhwc[p->steps[r2].out[0]])) {
                rm[n_rm++] = r2;
                fin = p->steps[r2].out[0];
            }
        }
        int64_t dims[5] = {ta->dims[0], ta->dims[1], ta->dims[2], tb->dims[3], ta->dims[3]};
        const mts_tensor *tf = &p->vals[fin];
        mts_attr at[5];
        memset(at, 0, sizeof at);
        const char *names[5] = {"dims", "a_strides", "b_strides", "y_strides", "y_dims"};
        const int64_t *vals[5] = {dims, as, bs, ys, tf->dims};
        int ns[5] = {5, 4, 4, 4, tf->rank};
        mts_node *n = mts_pool_alloc(&p->pool, sizeof *n);
        mts_attr *na = mts_pool_alloc(&p->pool, sizeof *na * 5);
        int *io = mts_pool_alloc(&p->pool, sizeof(int) * 3);
        if (!n || !na || !io) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        for (int i = 0; i < 5; i++) {
            na[i] = (mts_attr){0};
            na[i].name = names[i];
            na[i].type = MTS_ATTR_INTS;
            na[i].n = ns[i];
            if (!(na[i].ints = pool_ints(p, vals[i], ns[i]))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        *n = *st->nd;
        n->op_type = "MtsStridedMatMul";
        n->attrs = na;
        n->n_attr = 5;
        io[0] = sa, io[1] = sb, io[2] = fin;
        st->nd = n;
        st->op = &mts_fast_bmm;
        st->in = io;
        st->out = io + 2;
        for (int i = 0; i < n_rm; i++) {
            o->removed[rm[i]] = 1;
            const mts__step *r = &p->steps[rm[i]];
            /* the folded steps' values that nothing reads any more */
            if (r->out[0] != fin) p->state[r->out[0]] = MTS__V_UNUSED;
        }
        if (fin != y) p->state[y] = MTS__V_UNUSED;
        count_uses(o);
    }
    return MTS_OK;
}

/* A channel Concat on channels-last data whose input comes from a nearest integer upsampling
 * (Resize) read only by the Concat: the Concat reads the Resize's input through the factors
 * (kernels/nhwc.c, attribute "mts_up") and the Resize step goes. */
static int fuse_upsample_concat(opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (!plain_step(o, s, "Concat") || st->n_in < 1 || st->n_in > 64) continue;
        int y = st->out[0];
        int64_t ax = mts_attr_int(st->nd, "axis", 1);
        if ((ax != 1 && ax != -3) || !is_cand(o, y) || !p->nhwc[y]) continue;
        bool same = true; /* as rewrite_nhwc_step: the channels-last kernel then runs it */
        for (int j = 0; j < st->n_in; j++)
            if (st->in[j] < 0 || p->vals[st->in[j]].dtype != p->vals[y].dtype || p->vals[st->in[j]].rank != 4) same = false;
        if (!same) continue;
        int64_t up[128];
        int n_up = 0;
        for (int j = 0; j < st->n_in; j++) {
            int v = st->in[j], r = o->prod[v];
            up[2 * j] = up[2 * j + 1] = 1;
            if (!plain_step(o, r, "Resize") || sole_reader(o, v) != s || p->state[v] != MTS__V_STATIC ||
                !nearest_integer_upsample(p, &p->steps[r]))
                continue;
            int x = p->steps[r].in[0];
            const mts_tensor *tx = &p->vals[x], *tv = &p->vals[v];
            /* the Concat reads x as [N,H,W,C]: x must be stored so (or be the same bytes either way) */
            if (!live_value(p, x) || !(is_neutral(tx) || (is_cand(o, x) && p->nhwc[x]))) continue;
            up[2 * j] = tv->dims[2] / tx->dims[2];
            up[2 * j + 1] = tv->dims[3] / tx->dims[3];
            st->in[j] = x;
            o->removed[r] = 1;
            p->state[v] = MTS__V_UNUSED;
            n_up++;
        }
        if (!n_up) continue;
        mts_attr a = {0};
        a.name = "mts_up";
        a.type = MTS_ATTR_INTS;
        a.n = 2 * st->n_in;
        if (!(a.ints = pool_ints(p, up, 2 * st->n_in))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        mts_node *n = node_with_attr(p, st, NULL, a);
        if (!n) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        st->nd = n;
        count_uses(o);
    }
    return MTS_OK;
}

/* Fast kernels for single steps (kernels/fast.c; each checks its case at run time). */
static int fast_substitute(opt *o, mts__step *st, mts_err *err)
{
    mts__plan *p = o->p;
    if (small_conv_step(o, st)) {
        st->op = &mts_fast_conv_small;
        if (st->nhwc) {
            /* the context passes channels-last views of the step's 4-D tensors; which of them
             * are stored channels-last (the source and output may differ) */
            const mts_tensor *x = &p->vals[st->in[0]], *y = &p->vals[st->out[0]];
            const char *names[3] = {"mts_nhwc_views", "mts_nhwc_src", "mts_nhwc_dst"};
            int64_t vals[3] = {1, p->nhwc[st->in[0]] || is_neutral(x), p->nhwc[st->out[0]] || is_neutral(y)};
            for (int i = 0; i < 3; i++) {
                mts_attr a = {0};
                a.name = names[i];
                a.type = MTS_ATTR_INT;
                a.i = vals[i];
                mts_node *n = node_with_attr(p, st, NULL, a);
                if (!n) return mts_err_set(err, MTS_ENOMEM, "out of memory");
                st->nd = n;
            }
        }
        return MTS_OK;
    }
    if (st->kind != MTS__S_KERNEL || st->dynamic || st->nd->domain[0] || st->n_out < 1 || st->out[0] < 0 ||
        p->vals[st->out[0]].dtype != MTS_DTYPE_FLOAT)
        return MTS_OK;
    if (is_op(st, "ReduceMean") || is_op(st, "ReduceMax") || is_op(st, "ReduceSum")) st->op = &mts_fast_reduce;
    else if (is_op(st, "LayerNormalization")) st->op = &mts_fast_layernorm;
    else if (is_op(st, "Softmax")) st->op = &mts_fast_softmax;
    else if (is_op(st, "Conv") && st->n_in >= 2 && const_value(p, st->in[1]) && p->vals[st->in[0]].rank >= 3) {
        const mts_tensor *x = &p->vals[st->in[0]];
        bool one = true;
        for (int i = 2; i < x->rank; i++) one &= x->dims[i] == 1;
        if (one) st->op = &mts_fast_conv1px; /* checks the rest itself */
    }
    return MTS_OK;
}

/* The dims a kernel sees for value v in step st (channels-last steps get [N,H,W,C] views). */
static void view_of(const mts__step *st, const mts_tensor *t, mts_tensor *out)
{
    *out = *t;
    if (st->nhwc && t->rank == 4) out->dims[1] = t->dims[2], out->dims[2] = t->dims[3], out->dims[3] = t->dims[1];
}

/* Elementwise ops and keepdims reductions may run on slices of an outer axis in parallel: the
 * first output axis longer than 1 with only unit axes before it, when every input either has
 * that axis (same length, unit axes before it: a contiguous slice) or broadcasts along it. */
static int split_axis(const mts__plan *p, const mts__step *st)
{
    static const char *const ok[] = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Elu",
                                     "Selu", "Softplus", "Exp", "Abs", "Neg", "Sqrt", "Erf", "Clip", "Floor", "Ceil",
                                     "Reciprocal", "Log", "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean",
                                     "Pow", "Where", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd",
                                     "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", NULL};
    if (st->dynamic || st->kind != MTS__S_KERNEL || st->nd->domain[0] || st->n_out != 1 || st->out[0] < 0 ||
        st->n_in < 1 || st->n_in > 8)
        return -1;
    bool known = false;
    for (int i = 0; ok[i]; i++) known |= !strcmp(st->nd->op_type, ok[i]);
    /* Normalizations over trailing axes: slices of an earlier axis are independent. */
    int norm_axis = -1;
    if (!strcmp(st->nd->op_type, "Softmax") || !strcmp(st->nd->op_type, "LogSoftmax") ||
        !strcmp(st->nd->op_type, "LayerNormalization")) {
        int r = p->vals[st->out[0]].rank;
        int64_t ax = mts_attr_int(st->nd, "axis", !strcmp(st->nd->op_type, "LayerNormalization") || st->nd->opset >= 13
                                                      ? -1 : 1);
        if (ax < 0) ax += r;
        if (ax < 0 || ax >= r || st->nhwc) return -1;
        norm_axis = (int)ax;
        known = true;
    }
    if (!known) return -1;
    bool reduce = !strncmp(st->nd->op_type, "Reduce", 6);
    if (reduce && mts_attr_int(st->nd, "keepdims", 1) != 1) return -1;
    if (st->nd->opset < 7) return -1; /* legacy broadcast attributes */
    mts_tensor y;
    view_of(st, &p->vals[st->out[0]], &y);
    if (mts_tensor_numel(&y) < (1 << 16)) return -1; /* too small to be worth a team */
    int a = 0;
    while (a < y.rank && y.dims[a] == 1) a++;
    if (a >= y.rank || (norm_axis >= 0 && a >= norm_axis)) return -1;
    for (int j = 0; j < st->n_in; j++) {
        if (st->in[j] < 0) continue;
        mts_tensor t;
        view_of(st, st->cin && st->cin[j] ? st->cin[j] : &p->vals[st->in[j]], &t);
        int b = a - (y.rank - t.rank);
        if (b < 0) continue; /* broadcast along the axis */
        if (reduce && j == 0 && t.rank != y.rank) return -1;
        for (int i = 0; i < b; i++)
            if (t.dims[i] != 1) return -1;
        if (t.dims[b] != y.dims[a] && t.dims[b] != 1) return -1;
    }
    return a;
}

int mts__optimize(mts_model *m, mts__plan *p, mts_err *err)
{
    int rc = MTS_OK, ns = p->n_steps, nv = m->n_values, nci = 0;
    opt o = {m, p, nv, ns, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    mts__step *orig = malloc(sizeof *orig * (size_t)(ns + 1));
    uint8_t *no_dnnl = calloc((size_t)m->n_nodes + 1, 1);
    uint8_t *state0 = malloc((size_t)nv + 1);
    cinfo *ci = calloc((size_t)ns + 1, sizeof *ci);
    o.nuse = malloc(sizeof(int) * ((size_t)nv + 1));
    o.reader = malloc(sizeof(int) * ((size_t)nv + 1));
    o.prod = malloc(sizeof(int) * ((size_t)nv + 1));
    o.parent = malloc(sizeof(int) * ((size_t)nv + 1));
    o.is_out = calloc((size_t)nv + 1, 1);
    o.removed = calloc((size_t)ns + 1, 1);
    o.gbad = calloc((size_t)nv + 1, 1);
    o.gconv = calloc((size_t)nv + 1, 1);
    int *cstep = malloc(sizeof(int) * ((size_t)ns + 1)); /* per step: index into ci, -1 */
    if (!orig || !no_dnnl || !state0 || !ci || !o.nuse || !o.reader || !o.prod || !o.parent || !o.is_out ||
        !o.removed || !o.gbad || !o.gconv || !cstep) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    memcpy(orig, p->steps, sizeof *orig * (size_t)ns);
    memcpy(state0, p->state, (size_t)nv);
    for (int i = 0; i < m->n_outputs; i++) o.is_out[m->outputs[i]] = 1;
    for (int attempt = 0; attempt <= m->n_nodes; attempt++) {
        /* Reset to the unoptimized steps, with private copies of the index arrays. */
        for (int i = 0; i < nci; i++) free(ci[i].wtmp);
        nci = 0;
        p->n_steps = ns;
        memcpy(p->steps, orig, sizeof *orig * (size_t)ns);
        memcpy(p->state, state0, (size_t)nv);
        memset(o.removed, 0, (size_t)ns);
        memset(p->nhwc, 0, (size_t)nv);
        for (int s = 0; s < ns; s++) {
            mts__step *st = &p->steps[s];
            int *a = mts_pool_alloc(&p->pool, sizeof(int) * (size_t)(st->n_in + st->n_out + MTS_DPOST_MAX + 1));
            if (!a) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                goto out;
            }
            memcpy(a, st->in, sizeof(int) * (size_t)st->n_in);
            memcpy(a + st->n_in + MTS_DPOST_MAX, st->out, sizeof(int) * (size_t)st->n_out);
            st->in = a;
            st->out = a + st->n_in + MTS_DPOST_MAX;
            cstep[s] = -1;
        }
        count_uses(&o);
        remove_identities(&o);
        int64_t up_extra = 0; /* phase weight bytes added by upsampling folds in this attempt */

        /* Convolutions and their fusions. */
        for (int s = 0; s < ns; s++) {
            if (o.removed[s]) continue;
            cinfo *c = &ci[nci];
            if (!conv_eligible(&o, s, no_dnnl, c)) continue;
            nci++;
            cstep[s] = nci - 1;
            int cur = p->steps[s].out[0];
            if (c->spec.kind == MTS_DPRIM_CONV && (rc = fold_bn(&o, c, &cur, err))) goto out;
            for (; !mts_dprim_is_pool(c->spec.kind);) {
                int r = sole_reader(&o, cur), resid;
                mts_dpost po;
                if (r >= 0 && c->spec.kind == MTS_DPRIM_MATMUL && !c->spec.b && c->spec.n_post == 0 &&
                    matmul_bias(&o, &p->steps[r], cur, c->spec.g.M, &c->spec.b)) {
                    o.removed[r] = 1; /* MatMul + Add(constant row) -> bias */
                    p->state[cur] = MTS__V_UNUSED;
                    cur = p->steps[r].out[0];
                    continue;
                }
                if (c->spec.n_post < MTS_DPOST_MAX - 1) {
                    int gy = gelu_pattern(&o, cur);
                    if (gy >= 0) {
                        c->spec.post[c->spec.n_post++] = (mts_dpost){MTS_DPOST_GELU, 0, 0, false};
                        cur = gy;
                        continue;
                    }
                }
                if (r < 0 || c->spec.n_post >= MTS_DPOST_MAX - 1 || !as_postop(&o, &p->steps[r], cur, &po, &resid))
                    break;
                if (resid >= 0) {
                    /* The residual must exist before the conv runs. */
                    if (p->state[resid] != MTS__V_INPUT && (o.prod[resid] < 0 || o.prod[resid] >= s)) break;
                    c->resid[c->n_resid++] = resid;
                }
                c->spec.post[c->spec.n_post++] = po;
                o.removed[r] = 1;
                p->state[cur] = MTS__V_UNUSED;
                cur = p->steps[r].out[0];
            }
            mts__step *st = &p->steps[s];
            /* A nearest integer upsampling (Resize) read only by this conv: the conv reads the
             * Resize's input, one small convolution per output phase (dnnl_conv.c). */
            if (c->spec.kind == MTS_DPRIM_CONV && !getenv("MTS_NO_FAST")) {
                int u = st->in[0], r = o.prod[u];
                if (r >= 0 && !o.removed[r] && is_op(&p->steps[r], "Resize") && p->steps[r].kind == MTS__S_KERNEL &&
                    !p->steps[r].dynamic && sole_reader(&o, u) == s && p->state[u] == MTS__V_STATIC &&
                    nearest_integer_upsample(p, &p->steps[r]) && live_value(p, p->steps[r].in[0]) &&
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
                        o.removed[r] = 1;
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
            o.prod[cur] = s;
        }
        count_uses(&o);

        /* Layout groups. */
        for (int v = 0; v < nv; v++) o.parent[v] = v, o.gbad[v] = 0, o.gconv[v] = 0;
        for (int s = 0; s < ns; s++) {
            if (o.removed[s]) continue;
            const mts__step *st = &p->steps[s];
            if (cstep[s] >= 0 && ci[cstep[s]].spec.kind == MTS_DPRIM_MATMUL) continue;
            if (cstep[s] >= 0) {
                for (int j = 1; j < st->n_in; j++)
                    if (is_cand(&o, st->in[j]) && is_cand(&o, st->out[0])) unite(o.parent, st->in[j], st->out[0]);
                continue;
            }
            if (layout_agnostic(&o, st)) {
                int first = -1;
                for (int j = 0; j < st->n_in + st->n_out; j++) {
                    int v = j < st->n_in ? st->in[j] : st->out[j - st->n_in];
                    if (!is_cand(&o, v)) continue;
                    if (first < 0) first = v;
                    else unite(o.parent, v, first);
                }
            }
        }
        for (int s = 0; s < ns; s++) {
            if (o.removed[s]) continue;
            const mts__step *st = &p->steps[s];
            bool small = small_conv_step(&o, st); /* reads either layout; channels-last lets
                                                     * the CBAM pooling before it write once */
            bool conv = (cstep[s] >= 0 && ci[cstep[s]].spec.kind != MTS_DPRIM_MATMUL) || small;
            bool ok = conv || layout_agnostic(&o, st);
            for (int j = 0; j < st->n_in + st->n_out; j++) {
                int v = j < st->n_in ? st->in[j] : st->out[j - st->n_in];
                if (!is_cand(&o, v)) continue;
                if (!ok) o.gbad[find(o.parent, v)] = 1;
                if (conv) o.gconv[find(o.parent, v)] = 1;
            }
        }
        for (int v = 0; v < nv; v++)
            if (o.is_out[v] && is_cand(&o, v)) o.gbad[find(o.parent, v)] = 1;
        for (int v = 0; v < nv; v++)
            if (is_cand(&o, v)) {
                int r = find(o.parent, v);
                p->nhwc[v] = !o.gbad[r] && o.gconv[r];
            }

        /* Primitives: layouts first (in order), then the creations, which are independent and
         * mostly oneDNN's JIT compilation, on up to CREATE_THREADS threads. */
        for (int i = 0; i < nci; i++) {
            cinfo *c = &ci[i];
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
        create_all(p, ci, nci);
        int failed = -1;
        for (int i = 0; i < nci; i++) {
            cinfo *c = &ci[i];
            mts__step *st = &p->steps[c->step];
            if (c->create_rc != MTS_OK) {
                if (failed < 0) { /* the first, as when they were created in order */
                    if (getenv("MTS_PLAN_VERBOSE"))
                        fprintf(stderr, "oneDNN declines node '%s' (src %s, dst %s): %s\n", m->nodes[st->node].name,
                                c->spec.src_nhwc ? "nhwc" : "nchw", c->spec.dst_nhwc ? "nhwc" : "nchw", c->create_err.msg);
                    failed = st->node;
                }
                continue;
            }
            st->kind = MTS__S_DCONV;
            free(c->wtmp);
            c->wtmp = NULL;
        }
        if (failed >= 0) {
            for (int s = 0; s < ns; s++) {
                mts_dconv_free(p->steps[s].dconv);
                p->steps[s].dconv = NULL;
            }
            no_dnnl[failed] = 1;
            continue;
        }
        break;
    }

    /* Fusions into fast kernels. */
    count_uses(&o);
    if (!getenv("MTS_NO_FAST") && ((rc = fuse_softmax_scale(&o, err)) || (rc = fuse_strided_matmuls(&o, err)) ||
                                  (rc = fuse_channel_pool(&o, err)) || (rc = fuse_chains(&o, err)) || (rc = fuse_upsample_concat(&o, err))))
        goto out;

    /* Channels-last kernel steps, then compaction. */
    p->scratch_bytes = 0;
    int w = 0;
    for (int s = 0; s < ns; s++) {
        mts__step *st = &p->steps[s];
        if (o.removed[s]) {
            p->n_fused++;
            continue;
        }
        if (st->kind == MTS__S_DCONV) {
            size_t sb = 0;
            if ((rc = mts_dconv_prepare(st->dconv, 1, &sb, err))) goto out;
            if ((int64_t)sb > p->scratch_bytes) p->scratch_bytes = (int64_t)sb;
        } else if (!st->dynamic) {
            bool nhwc = false;
            for (int j = 0; j < st->n_in + st->n_out; j++) {
                int v = j < st->n_in ? st->in[j] : st->out[j - st->n_in];
                if (v >= 0 && is_cand(&o, v) && p->nhwc[v]) nhwc = true;
            }
            if (nhwc && (rc = rewrite_nhwc_step(p, st, err))) goto out;
            st->split_axis = split_axis(p, st);
            if (!getenv("MTS_NO_FAST") && (rc = fast_substitute(&o, st, err))) goto out;
        }
        p->steps[w++] = *st;
    }
    p->n_steps = w;
    /* Small constants read by reference kernels get plan copies, so no step reads the file
     * mapping after planning (each page fault there would map a neighbourhood of pages). */
    for (int s = 0; s < w && rc == MTS_OK; s++) {
        mts__step *st = &p->steps[s];
        if (st->kind != MTS__S_KERNEL) continue;
        for (int j = 0; j < st->n_in; j++) {
            int v = st->in[j];
            if (v < 0 || (st->cin && st->cin[j]) || m->values[v].kind != MTS_VALUE_INITIALIZER ||
                p->vals[v].data != m->values[v].init.data)
                continue;
            int64_t nb = mts_tensor_nbytes(&p->vals[v]);
            if (nb <= 0 || nb > (64 << 10)) continue;
            if (!st->cin && !(st->cin = mts_pool_calloc(&p->pool, (size_t)st->n_in, sizeof *st->cin))) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                break;
            }
            mts_tensor *c = mts_pool_alloc(&p->pool, sizeof *c);
            void *d = c ? mts_pool_alloc(&p->pool, (size_t)nb) : NULL;
            if (!d) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                break;
            }
            *c = p->vals[v];
            memcpy(d, p->vals[v].data, (size_t)nb);
            c->data = d;
            st->cin[j] = c;
        }
    }
    if (rc) goto out;
    /* Weights now live packed in the model's cache: drop the unpacked originals. */
    {
        int *cand = malloc(sizeof(int) * ((size_t)w + 1)), nc = 0;
        for (int s = 0; cand && s < w; s++) {
            const mts__step *st = &p->steps[s];
            const mts_node *nd = &m->nodes[st->node];
            if (st->kind == MTS__S_DCONV && nd->n_in >= 2 && nd->in[1] >= 0 &&
                (is_op(st, "Conv") || is_op(st, "ConvTranspose") || is_op(st, "MatMul") || is_op(st, "Gemm")))
                cand[nc++] = nd->in[1];
        }
        if (cand) mts__release_weights(m, p, cand, nc);
        free(cand);
    }
    if (p->n_steps > 0 && p->scratch_bytes == 0) {
        for (int s = 0; s < p->n_steps; s++)
            if (p->steps[s].kind == MTS__S_DCONV) p->scratch_bytes = 64; /* a stream is still needed */
    }
out:
    for (int i = 0; ci && i < nci; i++) free(ci[i].wtmp);
    free(orig);
    free(no_dnnl);
    free(state0);
    free(ci);
    free(o.nuse);
    free(o.reader);
    free(o.prod);
    free(o.parent);
    free(o.is_out);
    free(o.removed);
    free(o.gbad);
    free(o.gconv);
    free(cstep);
    return rc;
}
