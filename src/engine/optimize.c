/*
 * Graph optimizer and layout pass of the default selection, run once per plan after shapes are
 * known and constants are folded (plan.c), before buffer slots are assigned. mts__optimize is a
 * driver over these passes; the backend-specific rewrites are the backends' own
 * (kernels/dnnl_backend.c, kernels/fast_backend.c), reached through the hooks of the backend table (kernel.h), each stage calling
 * every enabled backend in table order:
 *
 *   1. Identity, no-op Casts (float to float) and inference-mode Dropout are removed (their
 *      readers read the input); a Cast to float16/bfloat16 after a linear Resize becomes a
 *      rounding inside the Resize.
 *   2. Claims: each backend claims single nodes or fused groups (oneDNN: convolutions, pools and
 *      constant-weight MatMul/Gemm with BatchNormalization, activations and a residual Add
 *      folded in).
 *   3. Layout: 4-D activations are grouped (union-find) across ops that do not care about the
 *      layout (elementwise ops, channel Concat, Resize, reductions with keepdims, per-tensor
 *      QuantizeLinear / DequantizeLinear and the quant entry's fused integer steps); a group that
 *      touches a layout anchor (a step a backend reports as reading and writing either layout:
 *      a convolution) and whose every reader and writer accepts channels-last data is stored
 *      NHWC. Those ops then run the reference kernels on [N,H,W,C] views (Concat's axis,
 *      reduction axes and Resize's scales/sizes/roi rewritten to match), and convolutions read
 *      and write NHWC directly, so conversions happen only at the edges (graph inputs/outputs
 *      and other ops), inside the convolution that reads or writes the edge. Layout Transposes
 *      (NHWC <-> NCHW) and graph-output copies convert too, as a copy or transposing copy. Tensors with one
 *      channel or one pixel are the same bytes in both layouts and never constrain a group.
 *   4. Commit: the backends build their claimed steps with the chosen layouts; one that
 *      declines a step (oneDNN cannot run a convolution well) makes the passes start over
 *      from 1, without that claim.
 *   5. Fusions into the backends' kernels (the fast kernels: softmax scale, strided MatMuls,
 *      channel pooling, elementwise chains, upsampling Concat).
 *   6. Compaction: removed steps go; channels-last kernel steps get their rewritten nodes and
 *      constants, elementwise steps their split axis, and the backends may substitute kernels.
 *   7. Small constants read by kernel steps get plan copies.
 *   8. Finish: the backends size their scratch and release the weights they packed.
 * The reference selection skips all of this: its plans run node by node, as the oracle.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/rewrite.h"
#include "engine/seqval.h"

#define FOR_BACKENDS(o, b) for (int b = 0; mts_backends[b]; b++) if ((o)->enabled[b])

/* A Cast to float of a float value: an identity (float16 values are held as float, so the
 * widening Cast of an fp16 model's "fp16 -> fp32" round trip is one too). */
static bool noop_cast(const mts__plan *p, const mts__step *st)
{
    if (!is_op(st, "Cast") || st->n_in != 1 || st->n_out != 1 || st->in[0] < 0 || st->out[0] < 0) return false;
    const mts_attr *a = mts_node_attr(st->nd, "to");
    return a && a->type == MTS_ATTR_INT && a->i == MTS_DTYPE_FLOAT && p->vals[st->in[0]].dtype == MTS_DTYPE_FLOAT &&
           p->vals[st->out[0]].dtype == MTS_DTYPE_FLOAT;
}

/* Pass 1: Identity, no-op Casts and inference-mode Dropout are removed (their readers read the
 * input). One whose output is a graph output instead has the producer of its input write that
 * output directly, when the input has no other reader. */
static void remove_identities(mts__opt *o)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (st->dynamic || st->n_in < 1 || st->n_out < 1 || st->kind != MTS__S_KERNEL) continue;
        bool drop = is_op(st, "Dropout"), cast = noop_cast(p, st);
        if (!is_op(st, "Identity") && !drop && !cast) continue;
        int x = st->in[0], y = st->out[0];
        if (x < 0 || y < 0 || p->state[x] == MTS__V_DYNAMIC) continue;
        if (o->is_out[y]) {
            int pr = o->prod[x];
            if (drop || pr < 0 || o->removed[pr] || o->nuse[x] != 1 || o->is_out[x] || p->steps[pr].dynamic ||
                p->state[x] != MTS__V_STATIC || p->state[y] != MTS__V_STATIC ||
                p->vals[x].dtype != p->vals[y].dtype || !mts_shape_equal(&p->vals[x], &p->vals[y]))
                continue;
            mts__step *ps = &p->steps[pr];
            for (int j = 0; j < ps->n_out; j++)
                if (ps->out[j] == x) ps->out[j] = y;
            o->removed[s] = 1;
            p->state[x] = MTS__V_UNUSED;
            mts__count_uses(o);
            continue;
        }
        if (drop) {
            if (st->n_out > 1 && st->out[1] >= 0 && (o->nuse[st->out[1]] > 0)) continue; /* mask used */
            if (st->n_in > 2 && st->in[2] >= 0) {
                const mts_tensor *t = &p->vals[st->in[2]];
                if (!const_value(p, st->in[2]) || mts_tensor_get_int(t, 0) != 0) continue; /* training mode */
            }
        }
        mts__redirect(o, y, x);
        o->removed[s] = 1;
        p->state[y] = MTS__V_UNUSED;
        mts__count_uses(o);
    }
}

/* A Cast to float16 / bfloat16 whose input is written by a linear or cubic float Resize read by
 * nothing else: the Resize rounds its output rows as it writes them (attribute "mts_round",
 * kernels/ref_conv.c) and writes the Cast's output; one memory pass less per round trip of a
 * float16 model's Resize (IS-Net: 30). Nearest Resizes are left alone: the oneDNN and fast
 * backends fold those into their readers, which do not round. */
static int fuse_half_rounding(mts__opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (o->removed[s] || st->dynamic || st->kind != MTS__S_KERNEL || !is_op(st, "Cast") || st->n_in != 1 ||
            st->n_out != 1 || st->in[0] < 0 || st->out[0] < 0)
            continue;
        int64_t to = mts_attr_int(st->nd, "to", 0);
        int x = st->in[0], y = st->out[0], r = o->prod[x];
        if ((to != MTS_DTYPE_FLOAT16 && to != MTS_DTYPE_BFLOAT16) || r < 0 || o->removed[r] || o->nuse[x] != 1 ||
            o->is_out[x] || p->state[x] != MTS__V_STATIC || p->state[y] != MTS__V_STATIC ||
            p->vals[x].dtype != MTS_DTYPE_FLOAT || p->vals[y].dtype != MTS_DTYPE_FLOAT ||
            !mts_shape_equal(&p->vals[x], &p->vals[y]))
            continue;
        mts__step *rs = &p->steps[r];
        const char *mode = mts_attr_string(rs->nd, "mode", "nearest");
        if (rs->dynamic || rs->kind != MTS__S_KERNEL || !is_op(rs, "Resize") || rs->n_out != 1 ||
            mts_node_attr(rs->nd, "mts_round") || (strcmp(mode, "linear") && strcmp(mode, "cubic")))
            continue;
        if (!mts__step_set_int(p, rs, "mts_round", to)) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        rs->out[0] = y;
        o->removed[s] = 1;
        p->state[x] = MTS__V_UNUSED;
        mts__count_uses(o);
    }
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

static bool rank4_ok(const mts__opt *o, int v)
{
    const mts_tensor *t = &o->p->vals[v];
    return t->rank == 4 && (is_cand(o, v) || (is_neutral(t) && o->p->state[v] != MTS__V_DYNAMIC));
}

/* A 4-D constant of a fixed-size element type: a channels-last step reads a permuted copy
 * (rewrite_nhwc_step), e.g. the zero channels that tf2onnx's channel padding concatenates. */
static bool const4_ok(const mts__opt *o, int v)
{
    const mts_tensor *t = &o->p->vals[v];
    return const_value(o->p, v) && t->rank == 4 && t->data && !mts_dtype_is_blob(t->dtype) &&
           mts_dtype_size(t->dtype) > 0;
}

/* A Cast of float data to float, float16 or bfloat16 (all held as float): elementwise on floats. */
static bool float_cast(const mts__plan *p, const mts__step *st)
{
    if (!is_op(st, "Cast") || st->n_in != 1 || st->in[0] < 0 || p->vals[st->in[0]].dtype != MTS_DTYPE_FLOAT)
        return false;
    const mts_attr *a = mts_node_attr(st->nd, "to");
    return a && a->type == MTS_ATTR_INT &&
           (a->i == MTS_DTYPE_FLOAT || a->i == MTS_DTYPE_FLOAT16 || a->i == MTS_DTYPE_BFLOAT16);
}

/* A Transpose between NHWC and NCHW order of a 4-D tensor (tf2onnx exports wrap the network in
 * them): perm [0,3,1,2] (to NCHW) returns 1, [0,2,3,1] (to NHWC) returns 2, else 0. When its
 * NCHW side is stored channels-last, the bytes on both sides are the same: a copy. */
static int layout_transpose(const mts__plan *p, const mts__step *st)
{
    if (st->dynamic || st->kind != MTS__S_KERNEL || !is_op(st, "Transpose") || st->n_in != 1 || st->n_out != 1 ||
        st->in[0] < 0 || st->out[0] < 0 || p->vals[st->in[0]].rank != 4 || p->vals[st->out[0]].rank != 4 ||
        mts_dtype_is_blob(p->vals[st->in[0]].dtype))
        return 0;
    int n = 0;
    const int64_t *perm = mts_attr_ints(st->nd, "perm", &n);
    if (!perm || n != 4 || perm[0] != 0) return 0;
    if (perm[1] == 3 && perm[2] == 1 && perm[3] == 2) return 1;
    if (perm[1] == 2 && perm[2] == 3 && perm[3] == 1) return 2;
    return 0;
}

/* An Identity or no-op Cast writing a graph output (which stays NCHW) from a value that other
 * steps read too: it may read channels-last data, transposing as it copies, so that the graph
 * output does not pull its source's readers to NCHW. */
static bool output_copy(const mts__opt *o, const mts__step *st)
{
    const mts__plan *p = o->p;
    if (st->dynamic || st->kind != MTS__S_KERNEL || st->n_in != 1 || st->n_out != 1 || st->in[0] < 0 ||
        st->out[0] < 0 || !o->is_out[st->out[0]] || o->is_out[st->in[0]] || !is_cand(o, st->in[0]) ||
        p->vals[st->in[0]].dtype != MTS_DTYPE_FLOAT || !mts_shape_equal(&p->vals[st->in[0]], &p->vals[st->out[0]]))
        return false;
    return noop_cast(p, st) || is_op(st, "Identity");
}

/* Can step st run on channels-last views of its 4-D tensors? */
static bool layout_agnostic(const mts__opt *o, const mts__step *st)
{
    static const char *const unary[] = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Elu",
                                        "Selu", "Softplus", "Exp", "Abs", "Neg", "Sqrt", "Erf", "Clip", "Identity",
                                        "Floor", "Ceil", "Reciprocal", "Softsign", "Log", NULL};
    static const char *const binary[] = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", NULL};
    const mts__plan *p = o->p;
    if (st->dynamic || st->kind != MTS__S_KERNEL || st->nd->domain[0] || st->n_out != 1 || st->out[0] < 0) return false;
    if (p->vals[st->out[0]].rank != 4 || output_copy(o, st)) return false;
    const char *op = st->nd->op_type;
    /* Quantized steps with constant scalar parameters: per-tensor QuantizeLinear /
     * DequantizeLinear and the fused steps of QDQ models (quant_backend.c), elementwise or
     * per-pixel moves; a Concat of two along channels (axis kept as the Concat's) */
    bool qconcat = !strcmp(op, "MtsQLinearConcat");
    bool qelt = !strcmp(op, "MtsQLinearUnary") || !strcmp(op, "MtsQLinearUpsample") ||
                ((!strcmp(op, "QuantizeLinear") || !strcmp(op, "DequantizeLinear")) && st->nd->opset >= 10);
    if (qconcat) {
        int64_t ax = mts_attr_int(st->nd, "axis", 1);
        if ((ax != 1 && ax != -3) || st->n_in != 8 || st->in[0] < 0 || st->in[3] < 0 || !rank4_ok(o, st->in[0]) ||
            !rank4_ok(o, st->in[3]))
            return false;
    }
    if (!strcmp(op, "MtsQLinearAdd") || qconcat || qelt) {
        for (int j = 0; j < st->n_in; j++) {
            int v = st->in[j];
            if (v < 0 || (const_value(p, v) && mts_tensor_numel(&p->vals[v]) == 1)) continue;
            if ((qelt && j != 0) || !rank4_ok(o, v)) return false;
        }
        return st->n_in >= (qelt ? 2 : 5);
    }
    if (float_cast(p, st)) return rank4_ok(o, st->in[0]);
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
                if (!rank4_ok(o, v) && !const4_ok(o, v)) return false;
            }
            return st->n_in >= 1;
        }
    if (!strcmp(op, "Concat")) {
        int64_t ax = mts_attr_int(st->nd, "axis", 1);
        if (ax != 1 && ax != -3) return false;
        for (int j = 0; j < st->n_in; j++)
            if (st->in[j] < 0 || (!rank4_ok(o, st->in[j]) && !const4_ok(o, st->in[j]))) return false;
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
    if (!strcmp(op, "Slice")) {
        /* constant starts/ends/axes/steps: the axes are remapped to the view (rewrite_nhwc_step) */
        if (st->nd->opset < 10 || st->n_in < 3 || st->n_in > 5 || st->in[0] < 0 || !rank4_ok(o, st->in[0])) return false;
        for (int j = 1; j < st->n_in; j++) {
            int v = st->in[j];
            if (v < 0 && j >= 3) continue;
            if (!const_value(p, v) || (p->vals[v].dtype != MTS_DTYPE_INT64 && p->vals[v].dtype != MTS_DTYPE_INT32) ||
                p->vals[v].rank != 1 || !p->vals[v].data)
                return false;
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

/* A channels-last copy of a 4-D constant t: [N,C,H,W] data stored as [N,H,W,C]. */
static const mts_tensor *nhwc_const(mts__plan *p, const mts_tensor *t)
{
    size_t es = mts_dtype_size(t->dtype);
    int64_t N = t->dims[0], C = t->dims[1], H = t->dims[2], W = t->dims[3], n = mts_tensor_numel(t);
    mts_tensor *c = mts_pool_calloc(&p->pool, 1, sizeof *c);
    char *d = c && n > 0 ? mts_pool_alloc(&p->pool, (size_t)n * es) : NULL;
    if (!c || (n > 0 && !d)) return NULL;
    *c = *t;
    if (n == 0) return c;
    const char *sp = t->data;
    for (int64_t a = 0; a < N; a++)
        for (int64_t ch = 0; ch < C; ch++)
            for (int64_t i = 0; i < H * W; i++)
                memcpy(d + (size_t)(((a * H * W) + i) * C + ch) * es, sp + (size_t)(((a * C) + ch) * H * W + i) * es, es);
    c->data = d;
    return c;
}

static int rewrite_nhwc_step(mts__plan *p, mts__step *st, mts_err *err)
{
    st->nhwc = 1;
    /* 4-D constants of the ops layout_agnostic lets take them (and chains fused from those) */
    static const char *const takes_const4[] = {"Concat", "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean",
                                               "MtsEltwiseChain", NULL};
    bool c4 = false;
    for (int i = 0; takes_const4[i]; i++) c4 |= !st->nd->domain[0] && !strcmp(st->nd->op_type, takes_const4[i]);
    if (c4)
        for (int j = 0; j < st->n_in; j++) {
            int v = st->in[j];
            if (v < 0 || !const_value(p, v) || p->vals[v].rank != 4 || is_neutral(&p->vals[v])) continue;
            if (!st->cin && !(st->cin = mts_pool_calloc(&p->pool, (size_t)st->n_in, sizeof *st->cin)))
                return mts_err_set(err, MTS_ENOMEM, "out of memory");
            if (!(st->cin[j] = nhwc_const(p, &p->vals[v]))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
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
    } else if (!strcmp(st->nd->op_type, "Slice")) {
        /* Axes name NCHW positions (as Reduce above); absent axes are 0..len(starts)-1. */
        static const int64_t map[4] = {0, 3, 1, 2};
        const mts_tensor *starts = &p->vals[st->in[1]];
        bool given = st->n_in >= 4 && st->in[3] >= 0;
        const mts_tensor *ax = given ? &p->vals[st->in[3]] : NULL;
        int64_t n = given ? mts_tensor_numel(ax) : mts_tensor_numel(starts);
        mts_tensor *c = mts_pool_calloc(&p->pool, 1, sizeof *c);
        bool i32 = starts->dtype == MTS_DTYPE_INT32; /* the index inputs share one type */
        void *d = mts_pool_alloc(&p->pool, sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
        if (!c || !d) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        for (int64_t j = 0; j < n; j++) {
            int64_t x = !given ? j : ax->dtype == MTS_DTYPE_INT64 ? ((const int64_t *)ax->data)[j]
                                                                   : ((const int32_t *)ax->data)[j];
            int64_t xn = x < 0 ? x + 4 : x;
            int64_t m = xn >= 0 && xn < 4 ? map[xn] : x; /* out of range: the kernel reports it */
            if (i32) ((int32_t *)d)[j] = (int32_t)m;
            else ((int64_t *)d)[j] = m;
        }
        c->dtype = i32 ? MTS_DTYPE_INT32 : MTS_DTYPE_INT64;
        c->rank = 1;
        c->dims[0] = n;
        c->data = d;
        if (st->n_in < 4) { /* room for the added input: reset_steps leaves MTS__STEP_EXTRA_IN */
            for (int j = st->n_in; j < 4; j++) st->in[j] = -1;
            st->n_in = 4;
        }
        st->cin = mts_pool_calloc(&p->pool, (size_t)st->n_in, sizeof *st->cin);
        if (!st->cin) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        st->cin[3] = c;
    } else if (!strcmp(st->nd->op_type, "Resize")) {
        st->cin = mts_pool_calloc(&p->pool, (size_t)st->n_in, sizeof *st->cin);
        if (!st->cin) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        for (int j = 1; j < st->n_in; j++)
            if (st->in[j] >= 0 && !(st->cin[j] = permuted_const(p, &p->vals[st->in[j]])))
                return mts_err_set(err, MTS_ENOMEM, "out of memory");
        if (mts__nearest_upsample(p, st)) st->op = &mts_nhwc_upsample_nearest;
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
    bool known = float_cast(p, st);
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

/* Resets the steps to the unoptimized ones, with private copies of the index arrays (room for
 * the inputs a claimed step may add). */
static int reset_steps(mts__opt *o, const mts__step *orig, const uint8_t *state0, mts_err *err)
{
    mts__plan *p = o->p;
    p->n_steps = o->ns;
    memcpy(p->steps, orig, sizeof *orig * (size_t)o->ns);
    memcpy(p->state, state0, (size_t)o->nv);
    memset(o->removed, 0, (size_t)o->ns);
    memset(p->nhwc, 0, (size_t)o->nv);
    for (int s = 0; s < o->ns; s++) {
        mts__step *st = &p->steps[s];
        int *a = mts_pool_alloc(&p->pool, sizeof(int) * (size_t)(st->n_in + st->n_out + MTS__STEP_EXTRA_IN + 1));
        if (!a) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        memcpy(a, st->in, sizeof(int) * (size_t)st->n_in);
        memcpy(a + st->n_in + MTS__STEP_EXTRA_IN, st->out, sizeof(int) * (size_t)st->n_out);
        st->in = a;
        st->out = a + st->n_in + MTS__STEP_EXTRA_IN;
    }
    return MTS_OK;
}

/* Pass 2: the backends' claims. */
static int claim_steps(mts__opt *o, mts_err *err)
{
    int rc;
    FOR_BACKENDS(o, b)
        if (mts_backends[b]->claim && (rc = mts_backends[b]->claim(o, b, &o->m->bstate[b], err))) return rc;
    return MTS_OK;
}

static bool layout_anchor(const mts__opt *o, int s)
{
    FOR_BACKENDS(o, b)
        if (mts_backends[b]->layout_anchor && mts_backends[b]->layout_anchor(o, b, s)) return true;
    return false;
}

/* Pass 3: channels-last groups (p->nhwc). */
static void choose_layouts(mts__opt *o)
{
    mts__plan *p = o->p;
    int nv = o->nv, ns = o->ns;
    uint8_t *anchor = o->anchor;
    for (int s = 0; s < ns; s++) anchor[s] = !o->removed[s] && layout_anchor(o, s);
    for (int v = 0; v < nv; v++) o->parent[v] = v, o->gbad[v] = 0, o->gconv[v] = 0;
    for (int s = 0; s < ns; s++) {
        if (o->removed[s]) continue;
        const mts__step *st = &p->steps[s];
        if (anchor[s]) {
            for (int j = 1; j < st->n_in; j++)
                if (is_cand(o, st->in[j]) && is_cand(o, st->out[0])) unite(o->parent, st->in[j], st->out[0]);
            continue;
        }
        if (layout_agnostic(o, st)) {
            int first = -1;
            for (int j = 0; j < st->n_in + st->n_out; j++) {
                int v = j < st->n_in ? st->in[j] : st->out[j - st->n_in];
                if (!is_cand(o, v)) continue;
                if (first < 0) first = v;
                else unite(o->parent, v, first);
            }
        }
    }
    for (int s = 0; s < ns; s++) {
        if (o->removed[s]) continue;
        const mts__step *st = &p->steps[s];
        bool conv = anchor[s];
        bool ok = conv || layout_agnostic(o, st);
        /* A layout Transpose is a copy when its NCHW side is stored channels-last: that side
         * counts like a convolution's tensor, the other side must stay plain. */
        int lt = conv || ok ? 0 : output_copy(o, st) ? 2 : layout_transpose(p, st);
        for (int j = 0; j < st->n_in + st->n_out; j++) {
            int v = j < st->n_in ? st->in[j] : st->out[j - st->n_in];
            if (!is_cand(o, v)) continue;
            bool nchw_side = lt && (j < st->n_in) == (lt == 2);
            if (!ok && !nchw_side) o->gbad[find(o->parent, v)] = 1;
            if (conv || nchw_side) o->gconv[find(o->parent, v)] = 1;
        }
    }
    for (int v = 0; v < nv; v++)
        if (o->is_out[v] && is_cand(o, v)) o->gbad[find(o->parent, v)] = 1;
    for (int v = 0; v < nv; v++)
        if (is_cand(o, v)) {
            int r = find(o->parent, v);
            p->nhwc[v] = !o->gbad[r] && o->gconv[r];
        }
}

/* Pass 4: the backends build their claimed steps; MTS__RETRY when one declined a claim. */
static int commit_steps(mts__opt *o, mts_err *err)
{
    int rc;
    FOR_BACKENDS(o, b)
        if (mts_backends[b]->commit && (rc = mts_backends[b]->commit(o, b, err))) return rc;
    return MTS_OK;
}

/* Pass 5: fusions into the backends' kernels. */
static int fuse_steps(mts__opt *o, mts_err *err)
{
    int rc;
    mts__count_uses(o);
    FOR_BACKENDS(o, b)
        if (mts_backends[b]->fuse && (rc = mts_backends[b]->fuse(o, b, err))) return rc;
    return MTS_OK;
}

/* Pass 6: channels-last kernel steps, split axes and kernel substitutions, then compaction. */
static int compact_steps(mts__opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    int rc = MTS_OK, w = 0;
    for (int s = 0; s < o->ns; s++) {
        mts__step *st = &p->steps[s];
        if (o->removed[s]) {
            p->n_fused++;
            continue;
        }
        if (rc == MTS_OK && output_copy(o, st)) {
            if (p->nhwc[st->in[0]]) st->op = &mts_nhwc_to_nchw;
            p->steps[w++] = *st;
            continue;
        }
        if (rc == MTS_OK && layout_transpose(p, st)) {
            /* Its NCHW side channels-last (its other side is never): the same bytes. */
            int lt = layout_transpose(p, st), v = lt == 1 ? st->out[0] : st->in[0];
            if (is_cand(o, v) && p->nhwc[v]) {
                st->op = &mts_nhwc_copy;
                p->steps[w++] = *st;
                continue;
            }
        }
        if (rc == MTS_OK && st->kind == MTS__S_KERNEL && !st->dynamic) {
            bool nhwc = false;
            for (int j = 0; j < st->n_in + st->n_out; j++) {
                int v = j < st->n_in ? st->in[j] : st->out[j - st->n_in];
                if (v >= 0 && is_cand(o, v) && p->nhwc[v]) nhwc = true;
            }
            if (nhwc) rc = rewrite_nhwc_step(p, st, err);
            if (rc == MTS_OK) st->split_axis = split_axis(p, st);
            FOR_BACKENDS(o, b)
                if (rc == MTS_OK && mts_backends[b]->substitute) rc = mts_backends[b]->substitute(o, b, st, err);
        }
        /* After a failure the rest is still moved down unprocessed, so that every step the plan
         * owns stands once in steps[0, n_steps) and freeing the plan frees each once. */
        p->steps[w++] = *st;
    }
    p->n_steps = w;
    return rc;
}

/* Pass 7: small constants read by kernel steps get plan copies, so no step reads the file
 * mapping after planning (each page fault there would map a neighbourhood of pages). */
static int copy_small_constants(mts__opt *o, mts_err *err)
{
    mts_model *m = o->m;
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (st->kind != MTS__S_KERNEL) continue;
        for (int j = 0; j < st->n_in; j++) {
            int v = st->in[j];
            if (v < 0 || (st->cin && st->cin[j]) || m->values[v].kind != MTS_VALUE_INITIALIZER ||
                p->vals[v].data != m->values[v].init.data)
                continue;
            int64_t nb = mts_tensor_nbytes(&p->vals[v]);
            if (nb <= 0 || nb > (64 << 10)) continue;
            if (!st->cin && !(st->cin = mts_pool_calloc(&p->pool, (size_t)st->n_in, sizeof *st->cin)))
                return mts_err_set(err, MTS_ENOMEM, "out of memory");
            mts_tensor *c = mts_pool_alloc(&p->pool, sizeof *c);
            void *d = c ? mts_pool_alloc(&p->pool, (size_t)nb) : NULL;
            if (!d) return mts_err_set(err, MTS_ENOMEM, "out of memory");
            *c = p->vals[v];
            memcpy(d, p->vals[v].data, (size_t)nb);
            c->data = d;
            st->cin[j] = c;
        }
    }
    return MTS_OK;
}

/* Pass 8: the backends' scratch sizes and weight release; which backends the plan uses. */
static int finish_steps(mts__opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    int rc;
    FOR_BACKENDS(o, b)
        if (mts_backends[b]->finish && (rc = mts_backends[b]->finish(o, b, err))) return rc;
    p->backends = 0;
    for (int s = 0; s < p->n_steps; s++)
        if (p->steps[s].kind == MTS__S_BACKEND) p->backends |= 1u << p->steps[s].backend;
    return MTS_OK;
}

int mts__optimize(mts_model *m, mts__plan *p, mts_err *err)
{
    int rc = MTS_OK, ns = p->n_steps, nv = m->n_values;
    mts__opt o = {.m = m, .p = p, .nv = nv, .ns = ns};
    mts__step *orig = malloc(sizeof *orig * (size_t)(ns + 1));
    uint8_t *state0 = malloc((size_t)nv + 1);
    o.nuse = malloc(sizeof(int) * ((size_t)nv + 1));
    o.reader = malloc(sizeof(int) * ((size_t)nv + 1));
    o.prod = malloc(sizeof(int) * ((size_t)nv + 1));
    o.parent = malloc(sizeof(int) * ((size_t)nv + 1));
    o.is_out = calloc((size_t)nv + 1, 1);
    o.removed = calloc((size_t)ns + 1, 1);
    o.anchor = calloc((size_t)ns + 1, 1);
    o.gbad = calloc((size_t)nv + 1, 1);
    o.gconv = calloc((size_t)nv + 1, 1);
    if (!orig || !state0 || !o.nuse || !o.reader || !o.prod || !o.parent || !o.is_out || !o.removed || !o.anchor ||
        !o.gbad || !o.gconv) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    for (int b = 0; mts_backends[b] && b < MTS_MAX_BACKENDS; b++)
        o.enabled[b] = !mts_backends[b]->enabled || mts_backends[b]->enabled(m->backend);
    memcpy(orig, p->steps, sizeof *orig * (size_t)ns);
    memcpy(state0, p->state, (size_t)nv);
    for (int i = 0; i < m->n_outputs; i++) o.is_out[m->outputs[i]] = 1;
    for (int attempt = 0; attempt <= m->n_nodes; attempt++) {
        if ((rc = reset_steps(&o, orig, state0, err))) goto out;
        mts__count_uses(&o);
        remove_identities(&o);
        if ((rc = fuse_half_rounding(&o, err))) goto out;
        if ((rc = claim_steps(&o, err))) goto out;
        mts__count_uses(&o);
        choose_layouts(&o);
        rc = commit_steps(&o, err);
        if (rc == MTS__RETRY) {
            rc = MTS_OK;
            continue;
        }
        if (rc) goto out;
        break;
    }
    p->scratch_bytes = 0;
    if ((rc = fuse_steps(&o, err)) || (rc = compact_steps(&o, err)) || (rc = copy_small_constants(&o, err)) ||
        (rc = finish_steps(&o, err)))
        goto out;
out:
    FOR_BACKENDS(&o, b)
        if (mts_backends[b]->opt_free) mts_backends[b]->opt_free(&o, b);
    free(orig);
    free(state0);
    free(o.nuse);
    free(o.reader);
    free(o.prod);
    free(o.parent);
    free(o.is_out);
    free(o.removed);
    free(o.anchor);
    free(o.gbad);
    free(o.gconv);
    return rc;
}
