/*
 * Subgraphs of control-flow nodes: the load-time structure checks and the runner behind the
 * If/Loop/Scan kernels (kernels/ref_control.c).
 *
 * A subgraph is an mts_model of its own (onnx_pb.c builds it, sharing the root's pool and file
 * mappings), so it is planned by the ordinary planner, one plan per input signature, cached in
 * the subgraph. Each execution context keeps, in a small list, one context per subgraph it has
 * run and one state block per control-flow node (Loop-carried values, results computed during
 * shape inference), so a Loop body runs many iterations without re-planning or re-allocating.
 * At plan time (constant folding, shape inference) there is no context: a temporary one is
 * made for the run and freed after.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "engine/seqval.h"
#include "engine/subgraph.h"

typedef struct cf_entry {
    struct cf_entry *next;
    const void *key;      /* the subgraph (ctx, ins) or the node (st) */
    mts_ctx *ctx;
    int threads;
    mts_tensor *ins;
    mts_cf_state st;
} cf_entry;

/* A context's control-flow state: every entry in a list (for freeing and accounting), found by
 * key through an open-addressing table (a model with many Ifs looks one up per call). */
typedef struct cf_table {
    cf_entry *list;
    cf_entry **slots;
    size_t cap, count;
} cf_table;

mts_model *mts_subgraph(const mts_node *n, const char *name)
{
    const mts_attr *a = mts_node_attr(n, name);
    return a && a->type == MTS_ATTR_GRAPH ? a->g : NULL;
}

int mts_subgraph_n_inputs(const mts_model *g)
{
    return g->n_formal;
}

int mts_subgraph_n_outputs(const mts_model *g)
{
    return g->n_outputs;
}

mts_dtype mts_subgraph_output_dtype(const mts_model *g, int i)
{
    return i >= 0 && i < g->n_outputs ? g->values[g->outputs[i]].dtype : MTS_DTYPE_UNDEFINED;
}

int64_t mts_subgraph_max_bytes(const mts_model *g)
{
    return g->max_tensor_bytes;
}

/* ---- load-time checks ---- */

int mts__subgraph_check(const mts_model *m, const mts_node *n, const char *file, mts_err *err)
{
    (void)m;
    const char *op = n->op_type;
    int n_exp = n->n_in - n->n_implicit;
    for (int a = 0; a < n->n_attr; a++) {
        const mts_attr *at = &n->attrs[a];
        if (at->type != MTS_ATTR_GRAPH) continue;
        bool known = (!strcmp(op, "If") && (!strcmp(at->name, "then_branch") || !strcmp(at->name, "else_branch"))) ||
                     ((!strcmp(op, "Loop") || !strcmp(op, "Scan") || !strcmp(op, "SequenceMap")) &&
                      !strcmp(at->name, "body"));
        if (!known)
            return mts_err_set(err, MTS_EUNSUPPORTED, "%s: node '%s' (%s): graph attribute '%s' is not supported", file,
                               n->name, op, at->name);
    }
    if (!strcmp(op, "If")) {
        const mts_model *t = mts_subgraph(n, "then_branch"), *e = mts_subgraph(n, "else_branch");
        if (!t || !e)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (If) needs both then_branch and else_branch", file,
                               n->name);
        if (n_exp != 1)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (If) takes 1 input (cond), has %d", file, n->name,
                               n_exp);
        if (t->n_formal || e->n_formal)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (If): a branch declares inputs", file, n->name);
        if (t->n_outputs != e->n_outputs)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (If): then_branch has %d outputs, else_branch %d",
                               file, n->name, t->n_outputs, e->n_outputs);
        if (n->n_out > t->n_outputs)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (If) has %d outputs but its branches %d", file,
                               n->name, n->n_out, t->n_outputs);
        return MTS_OK;
    }
    if (!strcmp(op, "Loop")) {
        const mts_model *b = mts_subgraph(n, "body");
        if (!b) return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (Loop) has no body", file, n->name);
        int N = n_exp > 2 ? n_exp - 2 : 0;
        if (b->n_formal != 2 + N)
            return mts_err_set(err, MTS_EFORMAT,
                               "%s: node '%s' (Loop): the body takes %d inputs, expected %d (iteration, condition "
                               "and %d loop-carried values)",
                               file, n->name, b->n_formal, 2 + N, N);
        if (b->n_outputs < 1 + N)
            return mts_err_set(err, MTS_EFORMAT,
                               "%s: node '%s' (Loop): the body has %d outputs, expected at least %d (condition and "
                               "%d loop-carried values)",
                               file, n->name, b->n_outputs, 1 + N, N);
        if (n->n_out > b->n_outputs - 1)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (Loop) has %d outputs but its body only %d", file,
                               n->name, n->n_out, b->n_outputs - 1);
        return MTS_OK;
    }
    if (!strcmp(op, "Scan")) {
        const mts_model *b = mts_subgraph(n, "body");
        if (!b) return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (Scan) has no body", file, n->name);
        if (n->opset < 9)
            return mts_err_set(err, MTS_EUNSUPPORTED, "%s: node '%s': Scan before opset 9 (sequence_lens, batch "
                               "axis) is not supported", file, n->name);
        int64_t M = mts_attr_int(n, "num_scan_inputs", -1);
        if (M < 1 || M > n_exp)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (Scan): num_scan_inputs %lld is not in [1, %d]", file,
                               n->name, (long long)M, n_exp);
        if (b->n_formal != n_exp)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (Scan): the body takes %d inputs, the node has %d",
                               file, n->name, b->n_formal, n_exp);
        int N = n_exp - (int)M;
        if (b->n_outputs < N)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (Scan): the body has %d outputs, fewer than the %d "
                               "state values", file, n->name, b->n_outputs, N);
        if (n->n_out > b->n_outputs)
            return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (Scan) has %d outputs but its body only %d", file,
                               n->name, n->n_out, b->n_outputs);
        return MTS_OK;
    }
    if (!strcmp(op, "SequenceMap")) {
        const mts_model *b = mts_subgraph(n, "body");
        if (!b) return mts_err_set(err, MTS_EFORMAT, "%s: node '%s' (SequenceMap) has no body", file, n->name);
        if (n_exp < 1 || b->n_formal != n_exp || b->n_outputs != n->n_out)
            return mts_err_set(err, MTS_EFORMAT,
                               "%s: node '%s' (SequenceMap): the body takes %d inputs and gives %d outputs, the node "
                               "has %d and %d", file, n->name, b->n_formal, b->n_outputs, n_exp, n->n_out);
        return MTS_OK;
    }
    return mts_err_set(err, MTS_EUNSUPPORTED, "%s: node '%s' (%s): subgraph attributes of this op are not supported",
                       file, n->name, op);
}

/* ---- load-time rewrites ---- */

/* The constant an outer value holds when it is known at load: an initializer, or the output of
 * a Constant node with a `value` tensor. NULL otherwise. */
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

/* Load-time evaluation of the values an If condition depends on. A value is a constant
 * (an initializer, a Constant, or computed from constants), has a known shape (a graph input
 * of the root whose declared dims are all fixed: the input check enforces them on every run;
 * an initializer; what a kernel's shape inference gives from known shapes), or is unknown (a
 * subgraph's inputs, anything downstream of a symbolic dim or a run-time value). Shape and
 * Size of a known shape are constants, as in the planner. Folding is bounded per node. */
enum { LT_UNKNOWN = 0, LT_SHAPE, LT_CONST };
#define LT_FOLD_MAX_BYTES ((int64_t)64 << 10)

typedef struct lt_eval {
    uint8_t *state;
    mts_tensor *t;
    mts_pool pool;
} lt_eval;

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

/* Evaluates node i of m from the states of its inputs (see above). */
static void lt_node(const mts_model *m, int i, lt_eval *ev, const mts_tensor **kin, mts_tensor *kout)
{
    const mts_node *n = &m->nodes[i];
    if (has_graph_attr(n) || n->n_out > 16 || n->n_in > 64) return;
    if (!n->domain[0] && !mts_node_attr(n, "seed") &&
        (!strncmp(n->op_type, "Random", 6) || !strcmp(n->op_type, "Bernoulli") || !strcmp(n->op_type, "Multinomial")))
        return;
    bool dims_only = !n->domain[0] && (!strcmp(n->op_type, "Shape") || !strcmp(n->op_type, "Size"));
    bool all_const = true;
    for (int j = 0; j < n->n_in; j++) {
        int v = n->in[j];
        kin[j] = v >= 0 ? &ev->t[v] : NULL;
        if (v < 0) continue;
        if (ev->state[v] == LT_UNKNOWN) return;
        if (ev->state[v] != LT_CONST && !dims_only) all_const = false;
    }
    mts_err err = {0};
    memset(kout, 0, sizeof *kout * (size_t)n->n_out);
    mts_kctx k = {n, kin, n->n_in, kout, n->n_out, &err, 1, NULL};
    if (m->ops[i]->infer(&k)) return;
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
        for (int j = 0; j < n->n_out; j++) kout[j].data = NULL;
    }
    for (int j = 0; j < n->n_out; j++) {
        ev->t[n->out[j]] = kout[j];
        ev->state[n->out[j]] = all_const ? LT_CONST : LT_SHAPE;
    }
}

/* The Ifs of m whose condition is known at load: sets take[i] to 1 (then) or 2 (else) and
 * returns how many (0: none; negative: out of memory). Only the nodes the conditions depend on
 * are evaluated; an If's outputs count as unknown, so an If whose condition depends on another
 * one is found on a later pass. */
static int lt_find_const_ifs(const mts_model *m, uint8_t *take)
{
    int nv = m->n_values, nn = m->n_nodes, found = 0, max_io = 1;
    bool any = false;
    for (int i = 0; i < nn && !any; i++) any = is_cond_if(&m->nodes[i]);
    if (!any) return 0;
    lt_eval ev = {0};
    ev.state = calloc((size_t)nv + 1, 1);
    ev.t = calloc((size_t)nv + 1, sizeof *ev.t);
    uint8_t *need = calloc((size_t)nn + 1, 1), *vneed = calloc((size_t)nv + 1, 1);
    for (int i = 0; i < nn; i++) {
        if (m->nodes[i].n_in > max_io) max_io = m->nodes[i].n_in;
        if (m->nodes[i].n_out > max_io) max_io = m->nodes[i].n_out;
    }
    const mts_tensor **kin = calloc((size_t)max_io + 1, sizeof *kin);
    mts_tensor *kout = calloc((size_t)max_io + 1, sizeof *kout);
    if (!ev.state || !ev.t || !need || !vneed || !kin || !kout) {
        found = -1;
        goto out;
    }
    for (int i = 0; i < nn; i++)
        if (is_cond_if(&m->nodes[i])) vneed[m->nodes[i].in[0]] = 1;
    for (int i = nn - 1; i >= 0; i--) { /* the conditions' ancestors */
        const mts_node *n = &m->nodes[i];
        for (int j = 0; j < n->n_out && !need[i]; j++) need[i] = vneed[n->out[j]];
        if (need[i])
            for (int j = 0; j < n->n_in; j++)
                if (n->in[j] >= 0) vneed[n->in[j]] = 1;
    }
    for (int v = 0; v < nv; v++) {
        const mts_value *val = &m->values[v];
        if (val->kind == MTS_VALUE_INITIALIZER && (val->init.data || mts_tensor_numel(&val->init) == 0) &&
            mts_dtype_supported(val->init.dtype) && !mts_dtype_is_blob(val->init.dtype)) {
            ev.t[v] = val->init;
            ev.state[v] = LT_CONST;
        }
    }
    for (int i = 0; i < m->n_inputs && !m->root; i++) { /* fixed-shape inputs of the root */
        int v = m->inputs[i];
        const mts_value *val = &m->values[v];
        bool fixed = val->rank >= 0 && val->rank <= MTS_MAX_RANK && mts_dtype_supported(val->dtype) &&
                     !mts_dtype_is_blob(val->dtype) && !mts_dtype_is_seq(val->dtype);
        for (int d = 0; fixed && d < val->rank; d++) fixed = val->dims[d] >= 0;
        if (!fixed) continue;
        ev.t[v] = (mts_tensor){.dtype = mts_dtype_is_half(val->dtype) ? MTS_DTYPE_FLOAT : val->dtype, .rank = val->rank};
        memcpy(ev.t[v].dims, val->dims, sizeof val->dims);
        ev.state[v] = LT_SHAPE;
    }
    for (int i = 0; i < nn; i++) {
        const mts_node *n = &m->nodes[i];
        take[i] = 0;
        if (is_cond_if(n) && ev.state[n->in[0]] == LT_CONST && mts_tensor_numel(&ev.t[n->in[0]]) == 1) {
            take[i] = mts_tensor_get_f64(&ev.t[n->in[0]], 0) != 0 ? 1 : 2;
            found++;
        } else if (need[i]) {
            lt_node(m, i, &ev, kin, kout);
        }
    }
out:
    mts_pool_free(&ev.pool);
    free(ev.state);
    free(ev.t);
    free(need);
    free(vneed);
    free(kin);
    free(kout);
    return found;
}

/* "<prefix>/<name>" in m's pool. */
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

/* Inlines the Ifs of m whose condition is known at load, pass after pass (an inlined branch
 * may hold further Ifs, or make another condition decidable; passes are bounded by the nesting
 * depth in practice and by a cap), then treats m's remaining subgraphs: their captured
 * constants, and the same rewrites inside them. */
static int rewrite_graph(mts_model *root, mts_model *m, bool inline_const_ifs, mts_err *err)
{
    int rc;
    for (int pass = 0; inline_const_ifs && pass < 64; pass++) {
        uint8_t *take = calloc((size_t)m->n_nodes + 1, 1);
        if (!take) return mts_err_set(err, MTS_ENOMEM, "out of memory");
        int found = lt_find_const_ifs(m, take);
        rc = found > 0 ? inline_ifs(m, take, err) : found < 0 ? mts_err_set(err, MTS_ENOMEM, "out of memory") : 0;
        free(take);
        if (rc) return rc;
        if (found == 0) break;
    }
    for (int i = 0; i < m->n_nodes; i++) {
        const mts_node *n = &m->nodes[i];
        for (int a = 0; a < n->n_attr; a++) {
            mts_model *g = n->attrs[a].type == MTS_ATTR_GRAPH ? n->attrs[a].g : NULL;
            if (!g) continue;
            capture_consts(root, m, n, g);
            if ((rc = rewrite_graph(root, g, inline_const_ifs, err))) return rc;
        }
    }
    return MTS_OK;
}

int mts__subgraph_rewrite(mts_model *root, mts_err *err)
{
    if (root->n_subs == 0) return MTS_OK;
    const char *e = getenv("MTS_IF_INLINE"); /* "0": keep every If (to compare, and to debug) */
    return rewrite_graph(root, root, !(e && !strcmp(e, "0")), err);
}

/* ---- per-context state ---- */

static size_t key_hash(const void *key, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

static cf_entry *entry_get(mts_ctx *c, const void *key)
{
    void **slot = mts__ctx_cf_slot(c);
    cf_table *t = *slot;
    if (!t) {
        if (!(t = calloc(1, sizeof *t))) return NULL;
        *slot = t;
    }
    if (t->cap) {
        for (size_t i = key_hash(key, t->cap); t->slots[i]; i = (i + 1) & (t->cap - 1))
            if (t->slots[i]->key == key) return t->slots[i];
    }
    if ((t->count + 1) * 2 > t->cap) { /* grow and rehash */
        size_t cap = t->cap ? t->cap * 2 : 16;
        cf_entry **slots = calloc(cap, sizeof *slots);
        if (!slots) return NULL;
        for (cf_entry *e = t->list; e; e = e->next) {
            size_t i = key_hash(e->key, cap);
            while (slots[i]) i = (i + 1) & (cap - 1);
            slots[i] = e;
        }
        free(t->slots);
        t->slots = slots;
        t->cap = cap;
    }
    cf_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->key = key;
    e->next = t->list;
    t->list = e;
    size_t i = key_hash(key, t->cap);
    while (t->slots[i]) i = (i + 1) & (t->cap - 1);
    t->slots[i] = e;
    t->count++;
    return e;
}

static void state_clear(mts_cf_state *s)
{
    for (int i = 0; i < s->n; i++) free(s->t[i].data);
    free(s->t);
    free(s->cap);
    free(s->view);
    memset(s, 0, sizeof *s);
}

static void entries_free(cf_entry *e)
{
    while (e) {
        cf_entry *next = e->next;
        mts_ctx_free(e->ctx);
        free(e->ins);
        state_clear(&e->st);
        free(e);
        e = next;
    }
}

void mts__cf_free(void *cf)
{
    cf_table *t = cf;
    if (!t) return;
    entries_free(t->list);
    free(t->slots);
    free(t);
}

int64_t mts__cf_bytes(const void *cf)
{
    int64_t b = 0;
    const cf_table *t = cf;
    for (const cf_entry *e = t ? t->list : NULL; e; e = e->next) {
        if (e->ctx) b += mts_ctx_bytes(e->ctx);
        for (int i = 0; i < e->st.n; i++) b += e->st.cap[i];
    }
    return b;
}

mts_cf_state *mts_cf_state_get(mts_kctx *k, int n)
{
    if (!k->ctx) return NULL;
    cf_entry *e = entry_get(k->ctx, k->node);
    if (!e) return NULL;
    if (e->st.n != n) {
        state_clear(&e->st);
        e->st.t = calloc((size_t)n + 1, sizeof(mts_tensor));
        e->st.cap = calloc((size_t)n + 1, sizeof(int64_t));
        e->st.view = calloc((size_t)n + 1, sizeof(mts_tensor));
        if (!e->st.t || !e->st.cap || !e->st.view) {
            state_clear(&e->st);
            return NULL;
        }
        e->st.n = n;
    }
    return &e->st;
}

int mts_cf_reserve(mts_cf_state *s, int i, int64_t bytes, bool keep, mts_err *err)
{
    if (bytes < 1) bytes = 1;
    if (bytes <= s->cap[i]) return MTS_OK;
    int64_t cap = s->cap[i] * 2 > bytes ? s->cap[i] * 2 : bytes;
    void *d = keep ? realloc(s->t[i].data, (size_t)cap) : malloc((size_t)cap);
    if (!d) return mts_err_set(err, MTS_ENOMEM, "out of memory (%lld bytes)", (long long)cap);
    if (!keep) free(s->t[i].data);
    s->t[i].data = d;
    s->cap[i] = cap;
    return MTS_OK;
}

/* ---- running ---- */

/* Fills ins[0..n_inputs) of g: the formal inputs, then the node's captured values. */
static int bind_inputs(mts_kctx *k, mts_model *g, const mts_tensor *formal, int n_formal, mts_tensor *ins)
{
    if (n_formal != g->n_formal)
        return mts_err_set(k->err, MTS_EINVAL, "%s takes %d inputs, got %d", g->path, g->n_formal, n_formal);
    for (int i = 0; i < n_formal; i++) ins[i] = formal[i];
    for (int c = 0; c < g->n_inputs - g->n_formal; c++) {
        const mts_tensor *t = mts_kin(k, g->cap_slot[c]);
        if (!t)
            return mts_err_set(k->err, MTS_EINVAL, "%s: captured value '%s' is missing", g->path,
                               g->values[g->inputs[g->n_formal + c]].name);
        ins[g->n_formal + c] = *t;
    }
    return MTS_OK;
}

int mts_subgraph_shapes(mts_kctx *k, mts_model *g, const mts_tensor *formal, int n_formal, mts_tensor *out,
                        bool *known)
{
    mts_tensor *ins = calloc((size_t)g->n_inputs + 1, sizeof *ins);
    if (!ins) return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    int rc = bind_inputs(k, g, formal, n_formal, ins);
    for (int i = 0; !rc && i < g->n_inputs; i++)
        if (ins[i].dtype == MTS_DTYPE_UNDEFINED || !mts_dtype_supported(ins[i].dtype))
            rc = mts_err_set(k->err, MTS_EUNSUPPORTED, "%s: input %d has unsupported type %s", g->path, i,
                             mts_dtype_name(ins[i].dtype));
    const mts__plan *p = NULL;
    if (!rc) rc = mts__plan_get(g, ins, g->n_inputs, &p, k->err);
    free(ins);
    if (rc) return rc;
    for (int i = 0; i < g->n_outputs; i++) {
        int v = g->outputs[i];
        /* A sequence's blob size is only known from its value (plans match sequences by type). */
        known[i] = p->state[v] != MTS__V_DYNAMIC && !mts_dtype_is_blob(p->vals[v].dtype);
        out[i] = p->vals[v];
        out[i].data = NULL;
    }
    return MTS_OK;
}

int mts_subgraph_run(mts_kctx *k, mts_model *g, const mts_tensor *formal, int n_formal, const mts_tensor **outs,
                     void **tmp)
{
    *tmp = NULL;
    int threads = k->threads > 0 ? k->threads : 1;
    cf_entry *e = k->ctx ? entry_get(k->ctx, g) : calloc(1, sizeof(cf_entry));
    if (!e) return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    if (!k->ctx) *tmp = e;
    int rc;
    if (!e->ctx) {
        if ((rc = mts_ctx_create(g, threads, &e->ctx, k->err))) return rc;
        e->threads = threads;
        e->ins = calloc((size_t)g->n_inputs + 1, sizeof(mts_tensor));
        if (!e->ins) return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    } else if (threads > e->threads) {
        mts_ctx_set_threads(e->ctx, threads);
        e->threads = threads;
    }
    /* The subgraph runs on the threads its parent's run uses now (the parent's adaptive team
     * choice), not on a choice of its own. */
    mts__ctx_set_run_threads(e->ctx, threads);
    if ((rc = bind_inputs(k, g, formal, n_formal, e->ins))) return rc;
    for (int i = 0; i < g->n_inputs; i++)
        if (!mts_dtype_supported(e->ins[i].dtype))
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s: input '%s' has unsupported type %s", g->path,
                               g->values[g->inputs[i]].name, mts_dtype_name(e->ins[i].dtype));
    rc = mts_ctx_run(e->ctx, e->ins, g->n_inputs, outs, k->err);
    if (rc) mts_err_prefix(k->err, "%s: ", g->path);
    return rc;
}

void mts_subgraph_tmp_free(void *tmp)
{
    entries_free(tmp);
}
