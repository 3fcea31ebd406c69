/*
 * Subgraphs of control-flow nodes: the load-time structure checks and the runner behind the
 * If/Loop/Scan kernels (kernels/ref_control.c). The load-time rewrites (captured constants,
 * Ifs decided at load) are in subgraph_rewrite.c.
 *
 * A subgraph is an mts_model of its own (onnx_pb.c builds it, sharing the root's pool and file
 * mappings), so it is planned by the ordinary planner, one plan per input signature, cached in
 * the subgraph. Each execution context keeps, in a table keyed by subgraph and node, one
 * context per subgraph it has run and one state block per control-flow node (Loop-carried
 * values, results computed during shape inference), so a Loop body runs many iterations without
 * re-planning or re-allocating.
 * At plan time (constant folding, shape inference) there is no context: a temporary one is
 * made for the run and freed after.
 */
#include <stdint.h>
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
    mts__plan_release(g, p);
    return MTS_OK;
}

int mts_subgraph_run(mts_kctx *k, mts_model *g, const mts_tensor *formal, int n_formal, const mts_tensor **outs,
                     void **tmp)
{
    return mts_subgraph_run_into(k, g, formal, n_formal, NULL, outs, tmp);
}

int mts_subgraph_run_into(mts_kctx *k, mts_model *g, const mts_tensor *formal, int n_formal, const mts_tensor *dst,
                          const mts_tensor **outs, void **tmp)
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
    rc = mts__ctx_run_into(e->ctx, e->ins, g->n_inputs, dst, outs, k->err);
    if (rc) mts_err_prefix(k->err, "%s: ", g->path);
    return rc;
}

void mts_subgraph_tmp_free(void *tmp)
{
    entries_free(tmp);
}
