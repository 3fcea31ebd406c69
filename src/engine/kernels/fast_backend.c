/*
 * The fast direct kernels' entry in the backend table (the kernels are in fast.c and nhwc.c):
 * rewrites of the plan that let them run, after the oneDNN claims have settled. MTS_NO_FAST=1
 * turns the backend off for comparisons.
 *
 *   - A Conv with 1-4 output channels from a few inputs (CBAM's spatial attention) runs the
 *     direct small-channel kernel; it reads and writes either layout, so it anchors a
 *     channels-last group like a oneDNN convolution (layout_anchor).
 *   - Fusions (fuse), in this order: a Relu or Sigmoid after a small-channel Conv is applied as
 *     the Conv writes its rows; a Div/Mul by a constant scalar before a last-axis Softmax
 *     becomes the softmax's input scale; rank-4 float MatMuls (attention) read their operands
 *     through the Reshape + Transpose steps before them and write through a Transpose
 *     (+ Reshape) after them as strides, so those copies go; CBAM's channel pooling
 *     (Concat of ReduceMean and ReduceMax over channels) becomes one step; chains of float
 *     Add/Sub/Mul/Div/Relu/Sigmoid steps (each intermediate read only by the next) become one
 *     pass at the last step's position; a channel Concat reads nearest-upsampled inputs
 *     through their factors; a layer normalization written out as ReduceMean, Sub, Pow,
 *     ReduceMean, Add, Sqrt, Div (+ Mul, Add, Relu) becomes one step (before the chains, which
 *     would otherwise take its tail).
 *   - Substitution (substitute), per remaining step: ReduceMean/Max/Sum, LayerNormalization,
 *     Softmax and one-pixel Conv steps get the vectorized kernels.
 * Fused steps stay MTS__S_KERNEL steps (an mts_op with a rewritten node), so the executor runs
 * them like any kernel.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/rewrite.h"

bool mts_fast_enabled(void)
{
    return !getenv("MTS_NO_FAST");
}

static bool fast_enabled(int kind)
{
    return kind == MTS_BACKEND_DEFAULT && mts_fast_enabled();
}

/* A Conv step the direct small-channel kernel (fast.c) runs (1-4 output channels): its source
 * and its output may each be stored either way. */
static bool small_conv_step(const mts__opt *o, const mts__step *st)
{
    const mts__plan *p = o->p;
    if (st->dynamic || st->kind != MTS__S_KERNEL || !is_op(st, "Conv") || st->n_in < 2 ||
        st->n_out != 1 || st->in[0] < 0 || !const_value(p, st->in[1]) || (st->n_in > 2 && st->in[2] >= 0 && !const_value(p, st->in[2])))
        return false;
    const mts_tensor *x = &p->vals[st->in[0]];
    if (x->dtype != MTS_DTYPE_FLOAT || x->rank != 4) return false;
    const mts_tensor *kin[3] = {x, &p->vals[st->in[1]], st->n_in > 2 && st->in[2] >= 0 ? &p->vals[st->in[2]] : NULL};
    mts_err e = {0};
    mts_tensor kout[1];
    mts_kctx k = {st->nd, kin, st->n_in > 3 ? 3 : st->n_in, kout, 1, &e, 1, NULL};
    mts_conv_geom g;
    return mts_conv_geometry(&k, false, &g) == MTS_OK && mts_fast_conv_small_ok(&g);
}

bool mts__fast_small_conv(const mts__opt *o, const mts__step *st)
{
    for (int b = 0; mts_backends[b]; b++)
        if (mts_backends[b] == &mts_backend_fast) return o->enabled[b] && small_conv_step(o, st);
    return false;
}

/* A small-channel Conv (fast.c) whose output only a Relu or Sigmoid reads: the activation is
 * applied to each output row as it is written (attribute "mts_act", the chain stage's code) and
 * its step goes. A lip-sync UNet's 3-channel head and its final sigmoid: the output is written
 * once instead of written, read back and written again. */
static int fuse_small_conv_act(mts__opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (o->removed[s] || !small_conv_step(o, st) || mts_attr_int(st->nd, "mts_act", 0)) continue;
        int y = st->out[0], t = sole_reader(o, y);
        bool relu = plain_step(o, t, "Relu"), sig = plain_step(o, t, "Sigmoid");
        if (!relu && !sig) continue;
        const mts__step *a = &p->steps[t];
        int z = a->out[0];
        if (a->n_in != 1 || z < 0 || p->state[y] != MTS__V_STATIC || p->vals[z].dtype != MTS_DTYPE_FLOAT ||
            !mts_shape_equal(&p->vals[y], &p->vals[z]) || p->nhwc[y] != p->nhwc[z] || st->nhwc != a->nhwc)
            continue;
        int *io = mts_pool_alloc(&p->pool, sizeof(int) * (size_t)(st->n_in + 1));
        if (!io || !mts__step_set_int(p, st, "mts_act", sig ? MTS_CHAIN_SIGMOID : MTS_CHAIN_RELU))
            return mts_err_set(err, MTS_ENOMEM, "out of memory");
        memcpy(io, st->in, sizeof(int) * (size_t)st->n_in);
        io[st->n_in] = z;
        st->in = io;
        st->out = io + st->n_in;
        o->removed[t] = 1;
        p->state[y] = MTS__V_UNUSED;
        mts__count_uses(o);
    }
    return MTS_OK;
}

/* Softmax over the last axis reading x / c or x * c (c a constant scalar, the attention scale):
 * the scale becomes the fast kernel's attribute "mts_scale" and the Div/Mul step goes. */
static int fuse_softmax_scale(mts__opt *o, mts_err *err)
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
        float c = mts__scaled_by(p, ds, x);
        if (c == 0 && is_op(ds, "Mul")) c = mts__scaled_by(p, ds, x = ds->in[1]);
        if (c == 0 || !float_value(p, x) || !mts_shape_equal(&p->vals[x], t)) continue;
        mts_attr a = {0};
        a.name = "mts_scale";
        a.type = MTS_ATTR_FLOAT;
        a.f = c;
        mts_node *n = mts__node_with_attr(p, st, NULL, a);
        if (!n) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        st->nd = n;
        st->op = &mts_fast_softmax;
        st->in[0] = x;
        o->removed[d] = 1;
        p->state[y] = MTS__V_UNUSED;
        mts__count_uses(o);
    }
    return MTS_OK;
}

/* Reduce step r over the channel axis of a 4-D tensor, keepdims, axes by attribute or constant. */
static bool channel_reduce(const mts__opt *o, int r, const char *op)
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
static int fuse_channel_pool(mts__opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (!plain_step(o, s, "Concat") || st->n_in != 2 || mts_attr_int(st->nd, "mts_out_bf16", 0)) continue;
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
        mts__count_uses(o);
    }
    return MTS_OK;
}

/* The chain stage code of elementwise step st reading the chain value `cur` (-1: the step starts
 * a chain), and its other operand in *operand (-1 for unary stages); -1 when st cannot be one. */
static int chain_stage(const mts__opt *o, const mts__step *st, int cur, int *operand)
{
    const mts__plan *p = o->p;
    *operand = -1;
    if (st->kind != MTS__S_KERNEL || st->dynamic || st->nd->domain[0] || st->n_out != 1 || st->out[0] < 0 ||
        p->vals[st->out[0]].dtype != MTS_DTYPE_FLOAT || p->state[st->out[0]] != MTS__V_STATIC)
        return -1;
    if (is_op(st, "Relu") || is_op(st, "Sigmoid") || is_op(st, "HardSwish") || is_op(st, "Erf")) {
        if (st->n_in != 1 || !float_value(p, st->in[0]) || (cur >= 0 && st->in[0] != cur)) return -1;
        return is_op(st, "Relu")      ? MTS_CHAIN_RELU
               : is_op(st, "Sigmoid") ? MTS_CHAIN_SIGMOID
               : is_op(st, "Erf")     ? MTS_CHAIN_ERF
                                      : MTS_CHAIN_HARDSWISH;
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
static int fuse_chains(mts__opt *o, mts_err *err)
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
        mts_node *n = mts__node_with_attr(p, st, "MtsEltwiseChain", a);
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
        mts__count_uses(o);
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

/* Operand v of MatMul step s as a strided view: through a Transpose read only by s, and a
 * Reshape before it read only by the Transpose (the bytes are the Reshape's input). */
static void operand_view(mts__opt *o, int s, int v, int64_t st[4], int *src, int *rm, int *n_rm)
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

/* Batched float MatMuls of rank 4 (attention) run on strided views (kernels/fast.c): the
 * Reshape + Transpose steps feeding them and a Transpose (+ Reshape) after them become strides. */
static int fuse_strided_matmuls(mts__opt *o, mts_err *err)
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
            if (!(na[i].ints = mts__pool_ints(p, vals[i], ns[i]))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
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
        mts__count_uses(o);
    }
    return MTS_OK;
}

static bool same_dims4(const mts_tensor *t, const int64_t *d)
{
    return t->rank == 4 && t->dims[0] == d[0] && t->dims[1] == d[1] && t->dims[2] == d[2] && t->dims[3] == d[3];
}

static bool contiguous4(const mts_tensor *t, const int64_t *st)
{
    int64_t c[4];
    contiguous_strides(t, c);
    return t->rank == 4 && st[0] == c[0] && st[1] == c[1] && st[2] == c[2] && st[3] == c[3];
}

/* The standard attention block once fuse_strided_matmuls has run: a scores MtsStridedMatMul,
 * then Mul/Div steps by constant scalars and at most one Add of a mask that broadcasts to the
 * scores without widening them (each value read only by the next step), a last-axis Softmax,
 * and a context MtsStridedMatMul reading the probabilities as they are. All of it becomes one
 * MtsAttention step at the context product (kernels/fast_attn.c): the scores and probabilities
 * are never stored, and per head the block is one pass instead of four steps. */
static int fuse_attention(mts__opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    for (int s2 = 0; s2 < p->n_steps; s2++) {
        mts__step *st2 = &p->steps[s2];
        if (o->removed[s2] || st2->kind != MTS__S_KERNEL || st2->dynamic || st2->op != &mts_fast_bmm || st2->n_in != 2)
            continue;
        int c[5];
        const int64_t *d2 = mts_attr_ints(st2->nd, "dims", &c[0]), *as2 = mts_attr_ints(st2->nd, "a_strides", &c[1]);
        const int64_t *bs2 = mts_attr_ints(st2->nd, "b_strides", &c[2]), *ys2 = mts_attr_ints(st2->nd, "y_strides", &c[3]);
        const int64_t *yd2 = mts_attr_ints(st2->nd, "y_dims", &c[4]);
        if (!d2 || !as2 || !bs2 || !ys2 || !yd2 || c[0] != 5 || c[1] != 4 || c[2] != 4 || c[3] != 4) continue;
        int a = st2->in[0];
        if (!plain_float4(p, a) || p->state[a] != MTS__V_STATIC || sole_reader(o, a) != s2 || !contiguous4(&p->vals[a], as2))
            continue;
        int sm = o->prod[a];
        if (!plain_step(o, sm, "Softmax") || p->steps[sm].n_in != 1) continue;
        int64_t ax = mts_attr_int(p->steps[sm].nd, "axis", p->steps[sm].nd->opset >= 13 ? -1 : 1);
        if (ax != -1 && ax != 3) continue;
        float alpha = 1.0f, beta = mts_attr_float(p->steps[sm].nd, "mts_scale", 1.0f);
        int mask = -1, rm[8], n_rm = 0, s1 = -1, cur = p->steps[sm].in[0], next = sm;
        const int64_t sd[4] = {d2[0], d2[1], d2[2], d2[4]}; /* the scores' shape [N, H, S, T] */
        rm[n_rm++] = sm;
        while (n_rm < 6) {
            if (!live_value(p, cur) || p->state[cur] != MTS__V_STATIC || sole_reader(o, cur) != next ||
                !plain_float4(p, cur) || !same_dims4(&p->vals[cur], sd))
                break;
            int d = o->prod[cur];
            if (d < 0 || o->removed[d] || p->steps[d].dynamic || p->steps[d].kind != MTS__S_KERNEL) break;
            const mts__step *ds = &p->steps[d];
            if (ds->op == &mts_fast_bmm) {
                s1 = d;
                break;
            }
            if (ds->n_in != 2 || ds->n_out != 1 || ds->nd->opset < 7) break;
            float f = 0;
            if (is_op(ds, "Mul") || is_op(ds, "Div")) {
                f = mts__scaled_by(p, ds, cur = ds->in[0]);
                if (f == 0 && is_op(ds, "Mul")) f = mts__scaled_by(p, ds, cur = ds->in[1]);
                if (f == 0 || !isfinite(f)) break;
                if (mask < 0) beta *= f; /* after the mask */
                else alpha *= f;
            } else if (is_op(ds, "Add") && mask < 0) {
                int side = -1;
                for (int j = 0; j < 2 && side < 0; j++) {
                    int v = ds->in[j];
                    if (live_value(p, v) && p->state[v] == MTS__V_STATIC && sole_reader(o, v) == d &&
                        same_dims4(&p->vals[v], sd))
                        side = j;
                }
                if (side < 0) break;
                int mv = ds->in[1 - side];
                if (!float_value(p, mv)) break;
                const mts_tensor *tm = &p->vals[mv];
                bool ok = tm->rank <= 4 && !(tm->rank == 4 && is_cand(o, mv) && p->nhwc[mv]);
                for (int i = 0; ok && i < tm->rank; i++) {
                    int64_t want = sd[4 - tm->rank + i];
                    ok = tm->dims[i] == 1 || tm->dims[i] == want;
                }
                if (!ok) break;
                mask = mv;
                cur = ds->in[side];
            } else {
                break;
            }
            rm[n_rm++] = d;
            next = d;
        }
        if (s1 < 0) continue;
        const mts__step *st1 = &p->steps[s1];
        const int64_t *d1 = mts_attr_ints(st1->nd, "dims", &c[0]), *as1 = mts_attr_ints(st1->nd, "a_strides", &c[1]);
        const int64_t *bs1 = mts_attr_ints(st1->nd, "b_strides", &c[2]), *ys1 = mts_attr_ints(st1->nd, "y_strides", &c[3]);
        if (!d1 || !as1 || !bs1 || !ys1 || c[0] != 5 || c[1] != 4 || c[2] != 4 || c[3] != 4 || st1->n_in != 2 ||
            st1->out[0] != cur || d1[0] != d2[0] || d1[1] != d2[1] || d1[2] != d2[2] || d1[3] != d2[4] ||
            !contiguous4(&p->vals[cur], ys1))
            continue;
        bool pos = true;
        for (int i = 0; i < 5; i++) pos &= d1[i] > 0 && d2[i] > 0;
        if (!pos) continue;
        rm[n_rm++] = s1;
        int64_t dims[6] = {d1[0], d1[1], d1[2], d1[3], d1[4], d2[3]}, ms[4] = {0, 0, 0, 0};
        if (mask >= 0) {
            const mts_tensor *tm = &p->vals[mask];
            int64_t st = 1;
            for (int i = tm->rank - 1; i >= 0; i--) {
                ms[4 - tm->rank + i] = tm->dims[i] == 1 ? 0 : st;
                st *= tm->dims[i];
            }
        }
        const char *names[7] = {"dims", "q_strides", "k_strides", "v_strides", "y_strides", "m_strides", "y_dims"};
        const int64_t *vals[7] = {dims, as1, bs1, bs2, ys2, ms, yd2};
        int ns[7] = {6, 4, 4, 4, 4, 4, c[4]};
        mts_node *n = mts_pool_alloc(&p->pool, sizeof *n);
        mts_attr *na = mts_pool_alloc(&p->pool, sizeof *na * 9);
        int *io = mts_pool_alloc(&p->pool, sizeof(int) * 5);
        if (!n || !na || !io) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        for (int i = 0; i < 7; i++) {
            na[i] = (mts_attr){0};
            na[i].name = names[i];
            na[i].type = MTS_ATTR_INTS;
            na[i].n = ns[i];
            if (!(na[i].ints = mts__pool_ints(p, vals[i], ns[i]))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        na[7] = (mts_attr){0};
        na[7].name = "alpha";
        na[7].type = MTS_ATTR_FLOAT;
        na[7].f = alpha;
        na[8] = na[7];
        na[8].name = "beta";
        na[8].f = beta;
        *n = *st2->nd;
        n->op_type = "MtsAttention";
        n->attrs = na;
        n->n_attr = 9;
        io[0] = st1->in[0], io[1] = st1->in[1], io[2] = st2->in[1], io[3] = mask, io[4] = st2->out[0];
        st2->nd = n;
        st2->op = &mts_fast_attention;
        st2->cin = NULL; /* no plan copies of constants for the new inputs (yet) */
        st2->in = io;
        st2->n_in = mask >= 0 ? 4 : 3;
        st2->out = io + 4;
        for (int i = 0; i < n_rm; i++) {
            o->removed[rm[i]] = 1;
            p->state[p->steps[rm[i]].out[0]] = MTS__V_UNUSED;
        }
        mts__count_uses(o);
    }
    return MTS_OK;
}

/* The first reduced axis of ReduceMean step s when it reduces the trailing axes of its input
 * and keeps them (the mean of a layer normalization); -1 otherwise. */
static int trailing_mean(const mts__opt *o, int s)
{
    const mts__plan *p = o->p;
    if (!plain_step(o, s, "ReduceMean")) return -1;
    const mts__step *st = &p->steps[s];
    if (st->n_in < 1 || !float_value(p, st->in[0]) || mts_attr_int(st->nd, "keepdims", 1) != 1) return -1;
    int r = p->vals[st->in[0]].rank, n = 0;
    if (r < 1) return -1;
    const int64_t *a = NULL;
    if (st->nd->opset >= 18) {
        if (st->n_in < 2 || st->in[1] < 0) /* no axes: every axis, unless that means none */
            return mts_attr_int(st->nd, "noop_with_empty_axes", 0) ? -1 : 0;
        if (!const_value(p, st->in[1]) || p->vals[st->in[1]].dtype != MTS_DTYPE_INT64) return -1;
        n = (int)mts_tensor_numel(&p->vals[st->in[1]]);
        a = p->vals[st->in[1]].data;
    } else {
        a = mts_attr_ints(st->nd, "axes", &n);
        if (!a) return 0;
    }
    if (n < 1 || n > r) return -1;
    bool seen[MTS_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
        int64_t v = a[i] < 0 ? a[i] + r : a[i];
        if (v < r - n || v >= r || seen[v]) return -1;
        seen[v] = true;
    }
    return r - n;
}

/* The reader of v when v has exactly one and it is elementwise step `op` with two inputs, the
 * other one (in *other) a constant; -1 otherwise. */
static int const_operand_reader(const mts__opt *o, int v, const char *op, int *other)
{
    const mts__plan *p = o->p;
    int r = sole_reader(o, v);
    if (!plain_step(o, r, op) || p->steps[r].n_in != 2 || p->state[v] != MTS__V_STATIC) return -1;
    const mts__step *st = &p->steps[r];
    *other = st->in[0] == v ? st->in[1] : st->in[0];
    return (st->in[0] == v || st->in[1] == v) && const_value(p, *other) && p->vals[*other].dtype == MTS_DTYPE_FLOAT ? r : -1;
}

/* Whether constant c, applied elementwise to a value of shape x, is a per-position parameter of
 * the trailing axes from `axis` on: m values with dims (leading ones dropped) equal to x's. */
static bool ln_param(const mts__plan *p, int c, const mts_tensor *x, int axis)
{
    const mts_tensor *t = &p->vals[c];
    int64_t m = 1;
    for (int i = axis; i < x->rank; i++) m *= x->dims[i];
    if (mts_tensor_numel(t) != m || t->rank > x->rank) return false;
    for (int i = 0; i < t->rank; i++) {
        int xi = x->rank - t->rank + i;
        if (t->dims[i] != (xi < axis ? 1 : x->dims[xi])) return false;
    }
    return true;
}

/* A layer normalization written out as elementwise steps (older PyTorch exports, TensorFlow):
 *     mu = ReduceMean(x); d = x - mu; v = ReduceMean(d^2) (Pow 2 or d*d); y = d / Sqrt(v + eps)
 * over trailing axes, then optionally * gamma, + beta (constants of the normalized shape) and a
 * Relu. It becomes one MtsLayerNorm step (kernels/fast.c) at the last step's position: nine
 * small steps that each stored a tensor are one pass over the rows. */
static int fuse_layernorm(mts__opt *o, mts_err *err)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        int axis = trailing_mean(o, s);
        if (axis < 0) continue;
        int x = p->steps[s].in[0], mu = p->steps[s].out[0];
        const mts_tensor *tx = &p->vals[x];
        if (!live_value(p, x) || (tx->rank == 4 && p->nhwc[x]) || p->state[mu] != MTS__V_STATIC) continue;
        int sub = sole_reader(o, mu);
        if (!plain_step(o, sub, "Sub") || p->steps[sub].n_in != 2 || p->steps[sub].in[0] != x || p->steps[sub].in[1] != mu)
            continue;
        int d = p->steps[sub].out[0];
        if (p->state[d] != MTS__V_STATIC || o->is_out[d] || !mts_shape_equal(&p->vals[d], tx)) continue;
        int sq = -1, dv = -1, n_read = 0;
        for (int t = 0; t < p->n_steps; t++) {
            if (o->removed[t]) continue;
            const mts__step *ts = &p->steps[t];
            bool reads = false;
            for (int j = 0; j < ts->n_in; j++) reads |= ts->in[j] == d;
            if (!reads) continue;
            n_read++;
            float two = 0;
            if (plain_step(o, t, "Pow") && ts->n_in == 2 && ts->in[0] == d && mts__const_scalar(p, ts->in[1], &two) && two == 2.0f)
                sq = t;
            else if (plain_step(o, t, "Mul") && ts->n_in == 2 && ts->in[0] == d && ts->in[1] == d)
                sq = t;
            else if (plain_step(o, t, "Div") && ts->n_in == 2 && ts->in[0] == d && ts->in[1] != d)
                dv = t;
        }
        if (n_read != 2 || sq < 0 || dv < 0) continue;
        int q = p->steps[sq].out[0], rm2 = sole_reader(o, q);
        if (p->state[q] != MTS__V_STATIC || trailing_mean(o, rm2) != axis || p->steps[rm2].in[0] != q) continue;
        int var = p->steps[rm2].out[0], epsv = -1;
        int add = const_operand_reader(o, var, "Add", &epsv);
        float eps;
        if (add < 0 || !mts__const_scalar(p, epsv, &eps) || !(eps >= 0) || !isfinite(eps)) continue;
        int e = p->steps[add].out[0], sr = sole_reader(o, e);
        if (p->state[e] != MTS__V_STATIC || !plain_step(o, sr, "Sqrt") || p->steps[sr].n_in != 1) continue;
        int sd = p->steps[sr].out[0];
        if (p->state[sd] != MTS__V_STATIC || sole_reader(o, sd) != dv || p->steps[dv].in[1] != sd) continue;
        int rm[12] = {s, sub, sq, rm2, add, sr}, n_rm = 6, last = dv, y = p->steps[dv].out[0];
        int gamma = -1, beta = -1, c, r;
        if ((r = const_operand_reader(o, y, "Mul", &c)) >= 0 && ln_param(p, c, tx, axis) &&
            mts_shape_equal(&p->vals[p->steps[r].out[0]], tx)) {
            rm[n_rm++] = last, last = r, y = p->steps[r].out[0], gamma = c;
        }
        if ((r = const_operand_reader(o, y, "Add", &c)) >= 0 && ln_param(p, c, tx, axis) &&
            mts_shape_equal(&p->vals[p->steps[r].out[0]], tx)) {
            rm[n_rm++] = last, last = r, y = p->steps[r].out[0], beta = c;
        }
        int64_t relu = 0;
        r = sole_reader(o, y);
        if (p->state[y] == MTS__V_STATIC && plain_step(o, r, "Relu") && p->steps[r].n_in == 1) {
            rm[n_rm++] = last, last = r, y = p->steps[r].out[0], relu = 1;
        }
        mts__step *st = &p->steps[last];
        mts_node *n = mts_pool_alloc(&p->pool, sizeof *n);
        mts_attr *na = mts_pool_alloc(&p->pool, sizeof *na * 3);
        int *io = mts_pool_alloc(&p->pool, sizeof(int) * 4);
        if (!n || !na || !io) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        const char *names[3] = {"axis", "epsilon", "mts_relu"};
        for (int i = 0; i < 3; i++) {
            na[i] = (mts_attr){0};
            na[i].name = names[i];
            na[i].type = i == 1 ? MTS_ATTR_FLOAT : MTS_ATTR_INT;
        }
        na[0].i = axis, na[1].f = eps, na[2].i = relu;
        *n = *st->nd;
        n->op_type = "MtsLayerNorm";
        n->attrs = na;
        n->n_attr = 3;
        io[0] = x, io[1] = gamma, io[2] = beta, io[3] = y;
        st->nd = n;
        st->op = &mts_fast_layernorm_written;
        st->cin = NULL;
        st->in = io;
        st->n_in = 3;
        st->out = io + 3;
        st->n_out = 1;
        for (int i = 0; i < n_rm; i++) {
            o->removed[rm[i]] = 1;
            p->state[p->steps[rm[i]].out[0]] = MTS__V_UNUSED;
        }
        mts__count_uses(o);
    }
    return MTS_OK;
}

/* A channel Concat on channels-last data whose input comes from a nearest integer upsampling
 * (Resize) read only by the Concat: the Concat reads the Resize's input through the factors
 * (kernels/nhwc.c, attribute "mts_up") and the Resize step goes. */
static int fuse_upsample_concat(mts__opt *o, mts_err *err)
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
                !mts__nearest_upsample(p, &p->steps[r]))
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
        if (!(a.ints = mts__pool_ints(p, up, 2 * st->n_in))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        mts_node *n = mts__node_with_attr(p, st, NULL, a);
        if (!n) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        st->nd = n;
        mts__count_uses(o);
    }
    return MTS_OK;
}

/* Fast kernels for single steps (kernels/fast.c; each checks its case at run time). */
static int fast_substitute(mts__opt *o, int self, mts__step *st, mts_err *err)
{
    (void)self;
    mts__plan *p = o->p;
    if (small_conv_step(o, st)) {
        st->op = &mts_fast_conv_small;
        if (st->nhwc) {
            /* the context passes channels-last views of the step's 4-D tensors; which of them
             * are stored channels-last (the source and output may differ) */
            const mts_tensor *x = &p->vals[st->in[0]], *y = &p->vals[st->out[0]];
            const char *names[3] = {"mts_nhwc_views", "mts_nhwc_src", "mts_nhwc_dst"};
            int64_t vals[3] = {1, p->nhwc[st->in[0]] || is_neutral(x), p->nhwc[st->out[0]] || is_neutral(y)};
            for (int i = 0; i < 3; i++)
                if (!mts__step_set_int(p, st, names[i], vals[i])) return mts_err_set(err, MTS_ENOMEM, "out of memory");
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

static bool fast_layout_anchor(const mts__opt *o, int self, int s)
{
    (void)self;
    return small_conv_step(o, &o->p->steps[s]);
}

static int fast_fuse(mts__opt *o, int self, mts_err *err)
{
    (void)self;
    int rc;
    if ((rc = fuse_small_conv_act(o, err)) || (rc = fuse_softmax_scale(o, err)) || (rc = fuse_layernorm(o, err)) || (rc = fuse_strided_matmuls(o, err)) || (rc = fuse_attention(o, err)) ||
        (rc = fuse_channel_pool(o, err)) ||
        (rc = fuse_chains(o, err)) || (rc = fuse_upsample_concat(o, err)))
        return rc;
    return MTS_OK;
}

const mts_backend mts_backend_fast = {
    .name = "fast",
    .enabled = fast_enabled,
    .layout_anchor = fast_layout_anchor,
    .fuse = fast_fuse,
    .substitute = fast_substitute,
};
