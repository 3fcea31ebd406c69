/*
 * Load-time rewrites of control flow (engine/subgraph.h: mts__subgraph_rewrite), run once a
 * model's nodes (its subgraphs' too) are sorted and resolved:
 *   - captured constants: a value a subgraph captures that is an initializer or a Constant of
 *     the enclosing graph becomes an initializer of the subgraph sharing the same bytes, so the
 *     subgraph's plans fold and pack it like a weight of their own;
 *   - Ifs decided at load: an If whose condition can be computed at load (from constants, and
 *     from what the declarations say of shapes: ranks, fixed dims, a Conv's output channels)
 *     is replaced by the nodes of the branch it takes, so it costs nothing at run time.
 * Each subgraph is treated after its parent, knowing what its parent's evaluation knows of the
 * values it captures.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "engine/seqval.h"
#include "engine/subgraph.h"

/* ---- captured constants ---- */

static const mts_tensor *load_const(const mts_model *m, int v)
{
    if (v < 0 || v >= m->n_values) return NULL;
    const mts_value *val = &m->values[v];
    if (val->kind == MTS_VALUE_INITIALIZER) return val->init.data || mts_tensor_numel(&val->init) == 0 ? &val->init : NULL;
    if (val->producer < 0) return NULL;
    const mts_node *p = &m->nodes[val->producer];
    if (p->domain[0] || strcmp(p->op_type, "Constant") || p->n_out != 1) return NULL;
    const mts_attr *a = mts_node_attr(p, "value");
    return a && a->type == MTS_ATTR_TENSOR && a->t && (a->t->data || mts_tensor_numel(a->t) == 0) ? a->t : NULL;
}

/* Keeps the copy behind root initializer v (if it is one) for the model's lifetime: a subgraph
 * now reads its bytes directly, which the root's plans do not see when they release weights. */
static void pin_copy(mts_model *root, int v)
{
    for (int c = 0; c < root->n_copies; c++)
        if (root->copies[c].value == v) root->copies[c].value = -1;
}

/* Turns the captured values of g (a subgraph of node n of model m) that are constants of m into
 * initializers of g sharing the same bytes, so g's plans fold and pack them like weights of
 * their own (a convolution inside an If branch reading the model's weights gets the backend's
 * packed-weight path instead of being handed the weights as run-time inputs). The node keeps
 * them as implicit inputs, which are constants of m. */
static void capture_consts(mts_model *root, mts_model *m, const mts_node *n, mts_model *g)
{
    int n_caps = g->n_inputs - g->n_formal, kept = 0;
    for (int c = 0; c < n_caps; c++) {
        int slot = g->cap_slot[c], gv = g->inputs[g->n_formal + c];
        int ov = slot >= 0 && slot < n->n_in ? n->in[slot] : -1;
        const mts_tensor *t = load_const(m, ov);
        if (!t || !mts_dtype_supported(t->dtype) || mts_dtype_is_blob(t->dtype)) {
            g->inputs[g->n_formal + kept] = gv;
            g->cap_slot[kept++] = slot;
            continue;
        }
        mts_value *val = &g->values[gv];
        val->kind = MTS_VALUE_INITIALIZER;
        val->init = *t;
        val->dtype = t->dtype;
        val->rank = t->rank;
        memcpy(val->dims, t->dims, sizeof val->dims);
        val->producer = -1;
        if (m == root) pin_copy(root, ov);
    }
    g->n_inputs = g->n_formal + kept;
}

/* ---- load-time evaluation ----
 *
 * What is known at load about the values an If condition (or a subgraph's captured value)
 * depends on. A value is
 *   LT_CONST   fully known: an initializer, or computed from constants by its kernel;
 *   LT_PCONST  a small int64 vector (rank 0 or 1) with some elements known: what Shape gives
 *              for a tensor with symbolic dims, and what Gather, Concat, Unsqueeze, Squeeze
 *              make of it;
 *   LT_SHAPE   data unknown, rank known, each dim known (>= 0) or not (-1): the root's inputs
 *              as declared (fixed dims are enforced on every run), what kernel shape inference
 *              gives from fully known shapes, and what the rules below give from partial ones;
 *   LT_UNKNOWN anything else (a Loop body's inputs, values computed by control flow).
 * A node whose inputs are all fully known (constants, or complete shapes for ops that read
 * only shapes, and for every op when only the output shape is asked) goes through its kernel's
 * shape inference, and runs when its inputs are constants (as in the planner; random
 * generators never, at most 64 KiB of output per node). Other nodes use the rules of
 * lt_partial, which assume the model is valid for every input its declarations allow (a
 * broadcast of an unknown dim against a known one above 1 gives the known one). */
enum { LT_UNKNOWN = 0, LT_SHAPE, LT_PCONST, LT_CONST };
#define LT_FOLD_MAX_BYTES ((int64_t)64 << 10)
#define LT_VEC_MAX 64

typedef struct lt_val {
    uint8_t state;
    mts_tensor t;    /* SHAPE: dtype, rank, dims (-1 unknown); PCONST/CONST: also data */
    uint8_t *known;  /* PCONST: per element */
} lt_val;

typedef struct lt_eval {
    lt_val *v;
    mts_pool pool;
} lt_eval;

static void lt_free(lt_eval *ev)
{
    if (!ev) return;
    mts_pool_free(&ev->pool);
    free(ev->v);
    free(ev);
}

static bool has_graph_attr(const mts_node *n)
{
    for (int a = 0; a < n->n_attr; a++)
        if (n->attrs[a].type == MTS_ATTR_GRAPH) return true;
    return false;
}

static bool is_cond_if(const mts_node *n)
{
    return !n->domain[0] && !strcmp(n->op_type, "If") && n->n_in - n->n_implicit == 1 && n->in[0] >= 0;
}

static bool shape_full(const lt_val *x)
{
    if (x->state == LT_UNKNOWN) return false;
    for (int d = 0; d < x->t.rank; d++)
        if (x->t.dims[d] < 0) return false;
    return true;
}

static void set_shape(lt_val *o, mts_dtype dt, int rank, const int64_t *dims)
{
    memset(o, 0, sizeof *o);
    if (rank < 0 || rank > MTS_MAX_RANK) return;
    o->state = LT_SHAPE;
    o->t.dtype = dt;
    o->t.rank = rank;
    for (int d = 0; d < rank; d++) o->t.dims[d] = dims[d] >= 0 ? dims[d] : -1;
}

/* An int64 vector (rank 0: one element) with known[i] per element; fully known is LT_CONST. */
static void set_vec(lt_eval *ev, lt_val *o, int rank, int len, const int64_t *vals, const uint8_t *known)
{
    memset(o, 0, sizeof *o);
    if (len < 0 || len > LT_VEC_MAX || (rank == 0 && len != 1) || rank < 0 || rank > 1) return;
    int64_t *d = mts_pool_calloc(&ev->pool, (size_t)len + 1, sizeof *d);
    uint8_t *k = mts_pool_calloc(&ev->pool, (size_t)len + 1, 1);
    if (!d || !k) return;
    bool all = true;
    for (int i = 0; i < len; i++) {
        d[i] = known[i] ? vals[i] : 0;
        k[i] = known[i];
        all = all && known[i];
    }
    o->t = (mts_tensor){.dtype = MTS_DTYPE_INT64, .rank = rank, .data = d};
    if (rank) o->t.dims[0] = len;
    o->known = k;
    o->state = all ? LT_CONST : LT_PCONST;
}

/* Element i of an int64 vector value (PCONST or CONST): true when known. */
static bool vec_get(const lt_val *x, int64_t i, int64_t *out)
{
    if (x->t.dtype != MTS_DTYPE_INT64 || x->t.rank > 1 || i < 0 || i >= mts_tensor_numel(&x->t)) return false;
    if (x->state == LT_PCONST && !x->known[i]) return false;
    if (x->state != LT_PCONST && x->state != LT_CONST) return false;
    *out = ((const int64_t *)x->t.data)[i];
    return true;
}

/* The integer list of a constant (axes, pads, perm given as an input). */
static int const_ints(const lt_val *x, int64_t *out, int max)
{
    if (!x || x->state != LT_CONST || x->t.rank > 1) return -1;
    int64_t n = mts_tensor_numel(&x->t);
    if (n > max || (x->t.dtype != MTS_DTYPE_INT64 && x->t.dtype != MTS_DTYPE_INT32)) return -1;
    for (int64_t i = 0; i < n; i++) out[i] = mts_tensor_get_int(&x->t, i);
    return (int)n;
}

/* Axes from the `axes` attribute (older opsets) or input in_j, normalized to rank r: their count,
 * -1 when not known or invalid, -2 when none are given. */
static int node_axes(const mts_node *n, const lt_val *in_j, int r, int64_t *axes)
{
    int na = 0;
    const int64_t *a = mts_attr_ints(n, "axes", &na);
    if (a) {
        if (na > MTS_MAX_RANK) return -1;
        memcpy(axes, a, sizeof *axes * (size_t)na);
    } else if (in_j) {
        na = const_ints(in_j, axes, MTS_MAX_RANK);
        if (na < 0) return -1;
    } else {
        return -2; /* none given */
    }
    for (int i = 0; i < na; i++) {
        if (axes[i] < 0) axes[i] += r;
        if (axes[i] < 0 || axes[i] >= r) return -1;
        for (int q = 0; q < i; q++)
            if (axes[q] == axes[i]) return -1;
    }
    return na;
}

static bool op_is(const mts_node *n, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(n->op_type, names[i])) return true;
    return false;
}

/* Output 0 of node n from partly known inputs (see above); leaves it unknown when no rule
 * applies. */
static void lt_partial(lt_eval *ev, const mts_node *n)
{
    static const char *const unary[] = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs",
                                        "Reciprocal", "Floor", "Ceil", "Erf", "Softplus", "HardSigmoid", "HardSwish",
                                        "Elu", "Selu", "Sin", "Cos", "Sign", "Round", "Identity", "Cast", "Not",
                                        "Softmax", "LogSoftmax", "Dropout", "IsNaN", "IsInf", "Clip", NULL};
    static const char *const binary[] = {"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater",
                                         "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "Mod", NULL};
    static const char *const boolean[] = {"Not", "IsNaN", "IsInf", "Equal", "Less", "Greater", "LessOrEqual",
                                          "GreaterOrEqual", "And", "Or", "Xor", NULL};
    static const char *const reduce[] = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                                         "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", NULL};
    if (n->domain[0] || n->n_out < 1 || n->out[0] < 0 || n->n_in < 1 || n->in[0] < 0) return;
    lt_val *o = &ev->v[n->out[0]];
    const lt_val *x = &ev->v[n->in[0]];
    const lt_val *in1 = n->n_in > 1 && n->in[1] >= 0 ? &ev->v[n->in[1]] : NULL;
    int r = x->t.rank;
    int64_t dims[MTS_MAX_RANK], vals[LT_VEC_MAX];
    uint8_t kn[LT_VEC_MAX];
    const char *op = n->op_type;
    bool is_vec = x->state == LT_PCONST || x->state == LT_CONST;

    if (!strcmp(op, "Shape")) {
        if (x->state == LT_UNKNOWN) return;
        int64_t s = mts_attr_int(n, "start", 0), e = mts_attr_int(n, "end", r);
        if (s < 0) s += r;
        if (e < 0) e += r;
        s = s < 0 ? 0 : s > r ? r : s;
        e = e < 0 ? 0 : e > r ? r : e;
        int len = e > s ? (int)(e - s) : 0;
        for (int i = 0; i < len; i++) vals[i] = x->t.dims[s + i], kn[i] = x->t.dims[s + i] >= 0;
        set_vec(ev, o, 1, len, vals, kn);
        return;
    }
    if (!strcmp(op, "Gather") && is_vec && r == 1 && in1 && in1->state == LT_CONST && in1->t.rank <= 1 &&
        (mts_attr_int(n, "axis", 0) == 0 || mts_attr_int(n, "axis", 0) == -1)) {
        int64_t len = x->t.dims[0], idx[LT_VEC_MAX];
        int ni = const_ints(in1, idx, LT_VEC_MAX);
        if (ni < 0) return;
        for (int i = 0; i < ni; i++) {
            int64_t q = idx[i] < 0 ? idx[i] + len : idx[i];
            if (q < 0 || q >= len) return;
            kn[i] = vec_get(x, q, &vals[i]);
        }
        set_vec(ev, o, in1->t.rank, ni, vals, kn);
        return;
    }
    if (is_vec && x->state == LT_PCONST &&
        (!strcmp(op, "Unsqueeze") || !strcmp(op, "Squeeze") || !strcmp(op, "Identity") ||
         (!strcmp(op, "Cast") && mts_attr_int(n, "to", 0) == MTS_DTYPE_INT64))) {
        int len = (int)mts_tensor_numel(&x->t), rank = r;
        if (!strcmp(op, "Unsqueeze")) { /* a scalar to [1]: one axis, 0 or -1 */
            int64_t axes[MTS_MAX_RANK];
            int na = node_axes(n, in1, 1, axes);
            if (r != 0 || na != 1) return;
            rank = 1;
        } else if (!strcmp(op, "Squeeze")) {
            if (r != 1 || len != 1) return;
            rank = 0;
        }
        for (int i = 0; i < len; i++) kn[i] = vec_get(x, i, &vals[i]);
        set_vec(ev, o, rank, len, vals, kn);
        return;
    }
    if (!strcmp(op, "Concat") && is_vec && r == 1 && (mts_attr_int(n, "axis", 0) == 0 || mts_attr_int(n, "axis", 0) == -1)) {
        int len = 0;
        for (int j = 0; j < n->n_in; j++) {
            const lt_val *p = n->in[j] >= 0 ? &ev->v[n->in[j]] : NULL;
            if (!p || (p->state != LT_PCONST && p->state != LT_CONST) || p->t.rank != 1 || p->t.dtype != MTS_DTYPE_INT64)
                return;
            int64_t pl = p->t.dims[0];
            if (len + pl > LT_VEC_MAX) return;
            for (int64_t i = 0; i < pl; i++, len++) kn[len] = vec_get(p, i, &vals[len]);
        }
        set_vec(ev, o, 1, len, vals, kn);
        return;
    }
    /* Shape rules: data unknown, the output's shape from the inputs' (partial) shapes. */
    if (op_is(n, unary)) {
        if (x->state == LT_UNKNOWN) return;
        mts_dtype dt = !strcmp(op, "Cast") ? (mts_dtype)mts_attr_int(n, "to", 0) : op_is(n, boolean) ? MTS_DTYPE_BOOL : x->t.dtype;
        set_shape(o, dt, r, x->t.dims);
        return;
    }
    if (op_is(n, binary)) {
        int rank = 0;
        for (int j = 0; j < n->n_in; j++) {
            if (n->in[j] < 0 || ev->v[n->in[j]].state == LT_UNKNOWN) return;
            if (ev->v[n->in[j]].t.rank > rank) rank = ev->v[n->in[j]].t.rank;
        }
        for (int d = 0; d < rank; d++) {
            int64_t res = 1;
            bool unknown = false;
            for (int j = 0; j < n->n_in; j++) {
                const mts_tensor *t = &ev->v[n->in[j]].t;
                int e = d - (rank - t->rank);
                if (e < 0) continue;
                int64_t v = t->dims[e];
                if (v < 0) unknown = true;
                else if (v != 1) {
                    if (res != 1 && res != v) return; /* cannot broadcast: leave it to the planner */
                    res = v;
                }
            }
            dims[d] = res != 1 ? res : unknown ? -1 : 1;
        }
        const lt_val *val = !strcmp(op, "Where") && n->n_in > 1 ? &ev->v[n->in[1]] : x;
        set_shape(o, op_is(n, boolean) ? MTS_DTYPE_BOOL : val->t.dtype, rank, dims);
        return;
    }
    if (x->state == LT_UNKNOWN && strcmp(op, "Conv")) return;
    if (!strcmp(op, "Unsqueeze")) {
        int64_t axes[MTS_MAX_RANK];
        int na = 0, nout;
        const int64_t *aa = mts_attr_ints(n, "axes", &na);
        if (aa) {
            if (na > MTS_MAX_RANK) return;
            memcpy(axes, aa, sizeof *axes * (size_t)na);
        } else if ((na = const_ints(in1, axes, MTS_MAX_RANK)) < 0) {
            return;
        }
        nout = r + na;
        if (nout > MTS_MAX_RANK) return;
        bool ins[MTS_MAX_RANK] = {false};
        for (int i = 0; i < na; i++) {
            int64_t a = axes[i] < 0 ? axes[i] + nout : axes[i];
            if (a < 0 || a >= nout || ins[a]) return;
            ins[a] = true;
        }
        for (int d = 0, s = 0; d < nout; d++) dims[d] = ins[d] ? 1 : x->t.dims[s++];
        set_shape(o, x->t.dtype, nout, dims);
        return;
    }
    if (!strcmp(op, "Squeeze")) {
        int64_t axes[MTS_MAX_RANK];
        int na = node_axes(n, in1, r, axes);
        if (na < 0) return;
        bool drop[MTS_MAX_RANK] = {false};
        for (int i = 0; i < na; i++) {
            if (x->t.dims[axes[i]] > 1) return;
            drop[axes[i]] = true;
        }
        int k = 0;
        for (int d = 0; d < r; d++)
            if (!drop[d]) dims[k++] = x->t.dims[d];
        set_shape(o, x->t.dtype, k, dims);
        return;
    }
    if (!strcmp(op, "Reshape")) {
        if (!in1 || (in1->state != LT_PCONST && in1->state != LT_CONST) || in1->t.rank != 1 ||
            in1->t.dtype != MTS_DTYPE_INT64 || in1->t.dims[0] > MTS_MAX_RANK)
            return;
        int rank = (int)in1->t.dims[0];
        bool allowzero = mts_attr_int(n, "allowzero", 0) != 0;
        for (int d = 0; d < rank; d++) {
            int64_t s;
            if (!vec_get(in1, d, &s) || s < -1 || s > ((int64_t)1 << 48)) dims[d] = -1; /* absurd: unknown */
            else if (s == 0 && !allowzero) dims[d] = d < r ? x->t.dims[d] : -1;
            else dims[d] = s; /* -1 (inferred) stays unknown */
        }
        set_shape(o, x->t.dtype, rank, dims);
        return;
    }
    if (!strcmp(op, "Transpose")) {
        int np = 0;
        const int64_t *perm = mts_attr_ints(n, "perm", &np);
        if (perm && np != r) return;
        for (int d = 0; d < r; d++) {
            int64_t p = perm ? perm[d] : r - 1 - d;
            if (p < 0 || p >= r) return;
            dims[d] = x->t.dims[p];
        }
        set_shape(o, x->t.dtype, r, dims);
        return;
    }
    if (!strcmp(op, "Pad")) {
        int64_t pads[2 * MTS_MAX_RANK];
        int np = 0;
        const int64_t *pa = n->opset < 11 ? mts_attr_ints(n, "pads", &np) : NULL;
        if (pa) {
            if (np != 2 * r) return;
            memcpy(pads, pa, sizeof *pads * (size_t)np);
        } else if (n->opset < 11 || (n->n_in > 3 && n->in[3] >= 0) || (np = const_ints(in1, pads, 2 * MTS_MAX_RANK)) != 2 * r) {
            return;
        }
        const int64_t lim = (int64_t)1 << 48; /* no overflow below: larger pads leave the dim unknown */
        for (int d = 0; d < r; d++) {
            int64_t v = x->t.dims[d], a = pads[d], b = pads[d + r];
            bool ok = v >= 0 && v < lim && a > -lim && a < lim && b > -lim && b < lim && v + a + b >= 0;
            dims[d] = ok ? v + a + b : -1;
        }
        set_shape(o, x->t.dtype, r, dims);
        return;
    }
    if (!strcmp(op, "Conv")) { /* rank and output channels from the weights */
        if (!in1 || in1->state == LT_UNKNOWN || in1->t.rank < 3 || in1->t.dims[0] < 0) return;
        int rank = in1->t.rank;
        if (x->state != LT_UNKNOWN && x->t.rank != rank) return;
        for (int d = 0; d < rank; d++) dims[d] = -1;
        if (x->state != LT_UNKNOWN) dims[0] = x->t.dims[0];
        dims[1] = in1->t.dims[0];
        set_shape(o, in1->t.dtype, rank, dims);
        return;
    }
    if (!strcmp(op, "Slice") && n->opset >= 10) {
        const lt_val *st = in1;
        if (!st || st->state == LT_UNKNOWN || st->t.rank != 1 || st->t.dims[0] < 0) return;
        int64_t axes[MTS_MAX_RANK];
        int na;
        if (n->n_in > 3 && n->in[3] >= 0) {
            if ((na = node_axes(n, &ev->v[n->in[3]], r, axes)) < 0) return;
        } else {
            na = (int)st->t.dims[0];
            if (na > r) return;
            for (int i = 0; i < na; i++) axes[i] = i;
        }
        memcpy(dims, x->t.dims, sizeof dims);
        for (int i = 0; i < na; i++) dims[axes[i]] = -1;
        set_shape(o, x->t.dtype, r, dims);
        return;
    }
    if (op_is(n, reduce)) {
        int64_t axes[MTS_MAX_RANK];
        bool keep = mts_attr_int(n, "keepdims", 1) != 0;
        int na = node_axes(n, in1, r, axes);
        if (na == -2) na = 0; /* no axes: like an empty list */
        if (na == 0 && !mts_attr_int(n, "noop_with_empty_axes", 0)) { /* all axes (else none) */
            na = r;
            for (int i = 0; i < r; i++) axes[i] = i;
        }
        if (na < 0) return;
        bool red[MTS_MAX_RANK] = {false};
        for (int i = 0; i < na; i++) red[axes[i]] = true;
        int k = 0;
        for (int d = 0; d < r; d++) {
            if (!red[d]) dims[k++] = x->t.dims[d];
            else if (keep) dims[k++] = 1;
        }
        set_shape(o, x->t.dtype, k, dims);
        return;
    }
}

/* Evaluates node i of m (see above). */
static void lt_node(const mts_model *m, int i, lt_eval *ev, const mts_tensor **kin, mts_tensor *kout)
{
    const mts_node *n = &m->nodes[i];
    if (has_graph_attr(n) || n->n_out > 16 || n->n_in > 64) return;
    if (!n->domain[0] && !mts_node_attr(n, "seed") &&
        (!strncmp(n->op_type, "Random", 6) || !strcmp(n->op_type, "Bernoulli") || !strcmp(n->op_type, "Multinomial")))
        return;
    bool dims_only = !n->domain[0] && (!strcmp(n->op_type, "Shape") || !strcmp(n->op_type, "Size"));
    bool all_const = true, full = true;
    for (int j = 0; j < n->n_in; j++) {
        int v = n->in[j];
        kin[j] = v >= 0 ? &ev->v[v].t : NULL;
        if (v < 0) continue;
        const lt_val *x = &ev->v[v];
        if (!shape_full(x) || (x->state == LT_PCONST && !dims_only)) full = false;
        if (x->state != LT_CONST && !dims_only) all_const = false;
    }
    if (!full) {
        lt_partial(ev, n);
        return;
    }
    mts_err err = {0};
    memset(kout, 0, sizeof *kout * (size_t)n->n_out);
    mts_kctx k = {n, kin, n->n_in, kout, n->n_out, &err, 1, NULL};
    if (m->ops[i]->infer(&k)) { /* e.g. a value it needs is not known: the shape rules may say more */
        lt_partial(ev, n);
        return;
    }
    int64_t bytes = 0;
    for (int j = 0; j < n->n_out; j++) {
        int64_t b = mts_tensor_nbytes(&kout[j]);
        if (kout[j].rank < 0 || kout[j].rank > MTS_MAX_RANK || b < 0 || !mts_dtype_supported(kout[j].dtype) ||
            mts_dtype_is_blob(kout[j].dtype))
            return;
        bytes += b;
    }
    if (all_const && bytes <= LT_FOLD_MAX_BYTES) {
        for (int j = 0; j < n->n_out; j++) {
            int64_t b = mts_tensor_nbytes(&kout[j]);
            if (!(kout[j].data = mts_pool_calloc(&ev->pool, (size_t)(b > 0 ? b : 1), 1))) return;
        }
        if (m->ops[i]->run(&k)) return;
    } else {
        all_const = false;
    }
    for (int j = 0; j < n->n_out; j++) {
        if (n->out[j] < 0) continue;
        lt_val *o = &ev->v[n->out[j]];
        memset(o, 0, sizeof *o);
        o->t = kout[j];
        if (!all_const) o->t.data = NULL;
        o->state = all_const ? LT_CONST : LT_SHAPE;
    }
}

/* Copies x into o, its data and mask into ev's pool. */
static void lt_copy(lt_eval *ev, lt_val *o, const lt_val *x)
{
    memset(o, 0, sizeof *o);
    if (x->state == LT_UNKNOWN) return;
    if (x->state == LT_PCONST) {
        int64_t vals[LT_VEC_MAX];
        int len = (int)mts_tensor_numel(&x->t);
        if (len > LT_VEC_MAX) return;
        memcpy(vals, x->t.data, sizeof *vals * (size_t)len);
        set_vec(ev, o, x->t.rank, len, vals, x->known);
        return;
    }
    *o = *x;
    if (x->state == LT_CONST) { /* a constant outer value is an initializer of the subgraph already */
        int64_t b = mts_tensor_nbytes(&x->t);
        void *d = mts_pool_alloc(&ev->pool, (size_t)(b > 0 ? b : 1));
        if (!d) {
            memset(o, 0, sizeof *o);
            return;
        }
        if (b > 0) memcpy(d, x->t.data, (size_t)b);
        o->t.data = d;
    }
}

/* Evaluates what m's If conditions and its subgraphs' captured values depend on. seeds: what
 * is known of m's captured values (capture c: seeds[c]), NULL for the root. take[i] gets 1
 * (then) or 2 (else) for each If decided now, *found how many. NULL when out of memory. */
static lt_eval *lt_run(const mts_model *m, const lt_val *seeds, uint8_t *take, int *found)
{
    int nv = m->n_values, nn = m->n_nodes, max_io = 1;
    *found = 0;
    lt_eval *ev = calloc(1, sizeof *ev);
    if (!ev || !(ev->v = calloc((size_t)nv + 1, sizeof *ev->v))) {
        free(ev);
        return NULL;
    }
    uint8_t *need = calloc((size_t)nn + 1, 1), *vneed = calloc((size_t)nv + 1, 1);
    for (int i = 0; i < nn; i++) {
        if (m->nodes[i].n_in > max_io) max_io = m->nodes[i].n_in;
        if (m->nodes[i].n_out > max_io) max_io = m->nodes[i].n_out;
    }
    const mts_tensor **kin = calloc((size_t)max_io + 1, sizeof *kin);
    mts_tensor *kout = calloc((size_t)max_io + 1, sizeof *kout);
    if (!need || !vneed || !kin || !kout) {
        lt_free(ev);
        ev = NULL;
        goto out;
    }
    for (int i = 0; i < nn; i++) { /* the conditions and the captured values, and their ancestors */
        const mts_node *n = &m->nodes[i];
        if (is_cond_if(n)) vneed[n->in[0]] = 1;
        if (has_graph_attr(n))
            for (int j = n->n_in - n->n_implicit; j < n->n_in; j++)
                if (n->in[j] >= 0) vneed[n->in[j]] = 1;
    }
    for (int i = nn - 1; i >= 0; i--) {
        const mts_node *n = &m->nodes[i];
        for (int j = 0; j < n->n_out && !need[i]; j++) need[i] = n->out[j] >= 0 && vneed[n->out[j]];
        if (need[i])
            for (int j = 0; j < n->n_in; j++)
                if (n->in[j] >= 0) vneed[n->in[j]] = 1;
    }
    for (int v = 0; v < nv; v++) {
        const mts_value *val = &m->values[v];
        if (val->kind == MTS_VALUE_INITIALIZER && (val->init.data || mts_tensor_numel(&val->init) == 0) &&
            mts_dtype_supported(val->init.dtype) && !mts_dtype_is_blob(val->init.dtype)) {
            ev->v[v].t = val->init;
            ev->v[v].state = LT_CONST;
        }
    }
    if (!m->root) { /* the root's inputs as declared: rank, fixed dims */
        for (int i = 0; i < m->n_inputs; i++) {
            const mts_value *val = &m->values[m->inputs[i]];
            if (val->rank < 0 || !mts_dtype_supported(val->dtype) || mts_dtype_is_blob(val->dtype) ||
                mts_dtype_is_seq(val->dtype))
                continue;
            set_shape(&ev->v[m->inputs[i]], mts_dtype_is_half(val->dtype) ? MTS_DTYPE_FLOAT : val->dtype, val->rank,
                      val->dims);
        }
    } else if (seeds) {
        for (int c = 0; c < m->n_inputs - m->n_formal; c++) lt_copy(ev, &ev->v[m->inputs[m->n_formal + c]], &seeds[c]);
    }
    for (int i = 0; i < nn; i++) {
        const mts_node *n = &m->nodes[i];
        take[i] = 0;
        if (is_cond_if(n) && ev->v[n->in[0]].state == LT_CONST && mts_tensor_numel(&ev->v[n->in[0]].t) == 1) {
            take[i] = mts_tensor_get_f64(&ev->v[n->in[0]].t, 0) != 0 ? 1 : 2;
            (*found)++;
        } else if (need[i]) {
            lt_node(m, i, ev, kin, kout);
        }
    }
out:
    free(need);
    free(vneed);
    free(kin);
    free(kout);
    return ev;
}

/* ---- inlining ---- */

static const char *prefixed(mts_model *m, const char *prefix, const char *name)
{
    size_t a = strlen(prefix), b = strlen(name);
    char *s = mts_pool_alloc(&m->pool, a + b + 2);
    if (!s) return NULL;
    memcpy(s, prefix, a);
    s[a] = '/';
    memcpy(s + a + 1, name, b + 1);
    return s;
}

/* How If node n of m is replaced by branch g: map[] takes each value of g to a value of m (a
 * captured value to the If input it stands for, a branch output computed by a branch node to
 * the If output, every other value to a new value numbered from *nv on); ident[j] is 1 when an
 * Identity must write If output j (the branch output is a captured value, an initializer, or an
 * output listed twice). Returns the number of Identities. */
static int plan_inline(const mts_node *n, const mts_model *g, int *map, uint8_t *ident, int *nv)
{
    int n_ident = 0;
    for (int v = 0; v < g->n_values; v++) map[v] = -1;
    for (int c = 0; c < g->n_inputs - g->n_formal; c++) {
        int slot = g->cap_slot[c];
        map[g->inputs[g->n_formal + c]] = slot >= 0 && slot < n->n_in ? n->in[slot] : -1;
    }
    for (int j = 0; j < n->n_out; j++) {
        int gv = g->outputs[j];
        ident[j] = !(g->values[gv].producer >= 0 && map[gv] < 0 && g->values[gv].kind == MTS_VALUE_INTERMEDIATE);
        if (ident[j]) n_ident++;
        else map[gv] = n->out[j];
    }
    for (int v = 0; v < g->n_values; v++)
        if (map[v] < 0 && g->values[v].kind != MTS_VALUE_INPUT) map[v] = (*nv)++;
    return n_ident;
}

/* Replaces every If node i of m with take[i] != 0 by the nodes of its branch (1: then, 2: else),
 * in one rebuild of m's value and node arrays: branch values and nodes become m's, named
 * "<if>/<branch>/<name>", and each If output is written by the branch node that computes it or
 * by an Identity. The order stays topological: a branch reads only values defined before its
 * If (the If's inputs list what it captures), and the If's readers come after it. */
static int inline_ifs(mts_model *m, const uint8_t *take, mts_err *err)
{
    const mts_op *identity = mts_op_lookup("Identity");
    if (!identity) return mts_err_set(err, MTS_EUNSUPPORTED, "Identity is not available to inline an If");
    int nv = m->n_values, nn = m->n_nodes, n_old = m->n_nodes, rc = MTS_OK;
    int **maps = calloc((size_t)m->n_nodes + 1, sizeof *maps);
    uint8_t **idents = calloc((size_t)m->n_nodes + 1, sizeof *idents);
    if (!maps || !idents) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < m->n_nodes; i++) {
        if (!take[i]) continue;
        const mts_node *n = &m->nodes[i];
        const mts_model *g = mts_subgraph(n, take[i] == 1 ? "then_branch" : "else_branch");
        maps[i] = malloc(sizeof(int) * ((size_t)g->n_values + 1));
        idents[i] = calloc((size_t)n->n_out + 1, 1);
        if (!maps[i] || !idents[i]) {
            rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
            goto out;
        }
        nn += g->n_nodes - 1 + plan_inline(n, g, maps[i], idents[i], &nv);
        if (nv > (1 << 24) || nn > (1 << 24)) {
            rc = mts_err_set(err, MTS_ELIMIT, "%s: graph too large after inlining If '%s'", m->path, n->name);
            goto out;
        }
    }
    mts_value *vals = mts_pool_calloc(&m->pool, (size_t)nv + 1, sizeof *vals);
    mts_node *nodes = mts_pool_calloc(&m->pool, (size_t)nn + 1, sizeof *nodes);
    const mts_op **ops = mts_pool_calloc(&m->pool, (size_t)nn + 1, sizeof *ops);
    if (!vals || !nodes || !ops) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    memcpy(vals, m->values, sizeof *vals * (size_t)m->n_values);
    int k = 0;
    for (int i = 0; i < m->n_nodes; i++) {
        const mts_node *n = &m->nodes[i];
        if (!take[i]) {
            nodes[k] = *n;
            ops[k++] = m->ops[i];
            continue;
        }
        const char *branch = take[i] == 1 ? "then_branch" : "else_branch";
        const mts_model *g = mts_subgraph(n, branch);
        const int *map = maps[i];
        char pre[256], anon[32];
        if (n->name[0]) snprintf(pre, sizeof pre, "%s/%s", n->name, branch);
        else snprintf(pre, sizeof pre, "If#%d/%s", i, branch);
        for (int v = 0; v < g->n_values; v++) {
            if (map[v] < m->n_values) continue; /* a captured value, or an If output */
            mts_value *d = &vals[map[v]];
            *d = g->values[v];
            d->producer = -1;
            if (!(d->name = prefixed(m, pre, g->values[v].name))) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        for (int q = 0; !rc && q < g->n_nodes; q++) {
            const mts_node *s = &g->nodes[q];
            mts_node *d = &nodes[k];
            *d = *s;
            snprintf(anon, sizeof anon, "#%d", q);
            d->name = prefixed(m, pre, s->name[0] ? s->name : anon);
            d->in = mts_pool_calloc(&m->pool, (size_t)s->n_in + 1, sizeof(int));
            d->out = mts_pool_calloc(&m->pool, (size_t)s->n_out + 1, sizeof(int));
            if (!d->in || !d->out || !d->name) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                break;
            }
            for (int j = 0; j < s->n_in; j++) {
                d->in[j] = s->in[j] >= 0 ? map[s->in[j]] : -1;
                if (s->in[j] >= 0 && d->in[j] < 0)
                    rc = mts_err_set(err, MTS_EFORMAT, "%s: captured value '%s' is missing", g->path,
                                     g->values[s->in[j]].name);
            }
            for (int j = 0; j < s->n_out; j++) d->out[j] = map[s->out[j]];
            ops[k++] = g->ops[q];
        }
        for (int j = 0; !rc && j < n->n_out; j++) {
            if (!idents[i][j]) continue;
            mts_node *d = &nodes[k];
            memset(d, 0, sizeof *d);
            d->in = mts_pool_calloc(&m->pool, 2, sizeof(int));
            d->out = mts_pool_calloc(&m->pool, 2, sizeof(int));
            snprintf(anon, sizeof anon, "output%d", j);
            d->name = prefixed(m, pre, anon);
            if (!d->in || !d->out || !d->name) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                break;
            }
            d->op_type = "Identity";
            d->domain = "";
            d->opset = n->opset;
            d->n_in = d->n_out = 1;
            d->in[0] = map[g->outputs[j]];
            d->out[0] = n->out[j];
            if (d->in[0] < 0) rc = mts_err_set(err, MTS_EFORMAT, "%s: output %d is missing", g->path, j);
            ops[k++] = identity;
        }
        if (rc) goto out;
    }
    for (int q = 0; q < nn; q++)
        for (int j = 0; j < nodes[q].n_out; j++)
            if (nodes[q].out[j] >= 0) vals[nodes[q].out[j]].producer = q;
    m->values = vals;
    m->n_values = nv;
    m->nodes = nodes;
    m->ops = ops;
    m->n_nodes = nn;
out:
    for (int i = 0; maps && i < n_old; i++) free(maps[i]);
    for (int i = 0; idents && i < n_old; i++) free(idents[i]);
    free(maps);
    free(idents);
    return rc;
}

/* Rewrites m (see the top of the file): Ifs decided at load are inlined, pass after pass (an
 * inlined branch may hold further Ifs, or make another condition decidable; passes are capped),
 * then each remaining subgraph gets its captured constants and the same rewrites, seeded with
 * what this graph's evaluation knows of the values it captures. */
static int rewrite_graph(mts_model *root, mts_model *m, const lt_val *seeds, bool inline_const_ifs, mts_err *err)
{
    int rc = MTS_OK;
    bool any = false;
    for (int i = 0; i < m->n_nodes && !any; i++) any = has_graph_attr(&m->nodes[i]);
    if (!any) return MTS_OK;
    lt_eval *ev = NULL;
    for (int pass = 0; inline_const_ifs && pass < 64; pass++) {
        int found = 0;
        uint8_t *take = calloc((size_t)m->n_nodes + 1, 1);
        lt_free(ev);
        ev = take ? lt_run(m, seeds, take, &found) : NULL;
        if (!ev) {
            free(take);
            return mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        if (found) {
            rc = inline_ifs(m, take, err);
            lt_free(ev); /* for the graph before this pass */
            ev = NULL;
        }
        free(take);
        if (rc) return rc;
        if (!found) break;
    }
    for (int i = 0; !rc && i < m->n_nodes; i++) {
        const mts_node *n = &m->nodes[i];
        for (int a = 0; !rc && a < n->n_attr; a++) {
            mts_model *g = n->attrs[a].type == MTS_ATTR_GRAPH ? n->attrs[a].g : NULL;
            if (!g) continue;
            capture_consts(root, m, n, g);
            int n_caps = g->n_inputs - g->n_formal;
            lt_val *sg = ev ? calloc((size_t)n_caps + 1, sizeof *sg) : NULL;
            for (int c = 0; sg && c < n_caps; c++) {
                int slot = g->cap_slot[c];
                if (slot >= 0 && slot < n->n_in && n->in[slot] >= 0) sg[c] = ev->v[n->in[slot]];
            }
            rc = rewrite_graph(root, g, sg, inline_const_ifs, err);
            free(sg);
        }
    }
    lt_free(ev);
    return rc;
}

int mts__subgraph_rewrite(mts_model *root, mts_err *err)
{
    if (root->n_subs == 0) return MTS_OK;
    const char *e = getenv("MTS_IF_INLINE"); /* "0": keep every If (to compare, and to debug) */
    return rewrite_graph(root, root, NULL, !(e && !strcmp(e, "0")), err);
}
