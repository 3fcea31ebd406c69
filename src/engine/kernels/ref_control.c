/*
 * Control-flow kernels: If, Loop and Scan, running their subgraphs through the subgraph runner
 * (engine/subgraph.h).
 *
 *   If    infer picks the branch when the condition is known (a constant at plan time, or at
 *         run time) and takes its output shapes from the branch's plan; with an unknown
 *         condition the shapes are static only when both branches agree. When the branch's
 *         shapes depend on run-time values, infer runs the branch itself (at run time) and run
 *         copies its results (views into the branch's context) into the outputs. Ifs whose
 *         condition is known at load are not here at all: subgraph_rewrite.c inlines them.
 *   Loop  and Scan run entirely during run-time shape inference (their output shapes are only
 *         known once the loop has run): loop-carried values alternate between two buffers of
 *         the node's per-context state, scan outputs grow in place, and run copies the results
 *         into the output buffers. Iterations are capped at MTS_LOOP_MAX_ITERS and every
 *         output's bytes at the model's tensor limit.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"
#include "engine/subgraph.h"

#define MTS_LOOP_MAX_ITERS ((int64_t)10000000)

static int copy_out(mts_kctx *k, int j, const mts_tensor *src, const char *what)
{
    mts_tensor *o = &k->out[j];
    char a[128], b[128];
    if (src->dtype != o->dtype || !mts_shape_equal(src, o))
        return mts_err_set(k->err, MTS_ESHAPE, "%s output %d is %s %s, expected %s %s", what, j,
                           mts_dtype_name(src->dtype), mts_shape_str(src, a, sizeof a), mts_dtype_name(o->dtype),
                           mts_shape_str(o, b, sizeof b));
    int64_t n = mts_tensor_nbytes(o);
    if (n > 0 && o->data != src->data) memmove(o->data, src->data, (size_t)n); /* same: computed in place */
    return MTS_OK;
}

static void set_shape(mts_tensor *o, const mts_tensor *src)
{
    o->dtype = src->dtype;
    o->rank = src->rank;
    memcpy(o->dims, src->dims, sizeof o->dims);
}

/* ---- If ---- */

#define IF_FEW_OUTPUTS 16

/* The condition: 1 known, 0 false, MTS_EDYNAMIC while its value is unknown. */
static int if_cond(mts_kctx *k, bool *c)
{
    const mts_tensor *t = mts_kin(k, 0);
    char shp[128];
    if (!t) return mts_err_set(k->err, MTS_EINVAL, "the condition input is missing");
    if (mts_tensor_numel(t) != 1)
        return mts_err_set(k->err, MTS_ESHAPE, "the condition must have one element, has shape %s",
                           mts_shape_str(t, shp, sizeof shp));
    if (!t->data) return MTS_EDYNAMIC;
    *c = mts_tensor_get_f64(t, 0) != 0;
    return MTS_OK;
}

static int if_branch(mts_kctx *k, mts_model **then_g, mts_model **else_g)
{
    *then_g = mts_subgraph(k->node, "then_branch");
    *else_g = mts_subgraph(k->node, "else_branch");
    if (!*then_g || !*else_g) return mts_err_set(k->err, MTS_EINVAL, "If needs then_branch and else_branch");
    if (k->n_out > mts_subgraph_n_outputs(*then_g))
        return mts_err_set(k->err, MTS_EINVAL, "If has more outputs than its branches");
    return MTS_OK;
}

/* Runs branch g now (infer at run time) and keeps views of its outputs in the node's state:
 * they stay valid until g runs again in this context, and run, the next thing the step does,
 * copies them into the node's outputs (one copy, no buffer of the state's own). */
static int if_prerun(mts_kctx *k, mts_model *g, mts_cf_state *st)
{
    int nb = mts_subgraph_n_outputs(g);
    const mts_tensor *few[IF_FEW_OUTPUTS], **outs = few;
    if (nb > IF_FEW_OUTPUTS && !(outs = calloc((size_t)nb, sizeof *outs)))
        return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    void *tmp;
    int rc = mts_subgraph_run(k, g, NULL, 0, outs, &tmp);
    for (int j = 0; !rc && j < k->n_out; j++) {
        st->view[j] = *outs[j];
        set_shape(&k->out[j], outs[j]);
    }
    mts_subgraph_tmp_free(tmp);
    if (outs != few) free(outs);
    if (!rc) st->ready = 1;
    return rc;
}

static int if_infer(mts_kctx *k)
{
    mts_model *tg, *eg;
    int rc = if_branch(k, &tg, &eg);
    if (rc) return rc;
    bool c = false;
    int crc = if_cond(k, &c);
    if (crc && crc != MTS_EDYNAMIC) return crc;
    int nb = mts_subgraph_n_outputs(tg);
    mts_tensor *sh = calloc((size_t)nb * 2 + 2, sizeof *sh);
    bool *known = calloc((size_t)nb * 2 + 2, sizeof *known);
    if (!sh || !known) {
        free(sh);
        free(known);
        return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    }
    mts_cf_state *st = mts_cf_state_get(k, k->n_out);
    if (st) st->ready = 0;
    bool all = true;
    if (crc == MTS_OK) {
        mts_model *g = c ? tg : eg;
        rc = mts_subgraph_shapes(k, g, NULL, 0, sh, known);
        for (int j = 0; !rc && j < k->n_out; j++) all = all && known[j];
        if (!rc && all) {
            for (int j = 0; j < k->n_out; j++) set_shape(&k->out[j], &sh[j]);
        } else if (!rc) {
            rc = st ? if_prerun(k, g, st) : MTS_EDYNAMIC;
        }
    } else {
        /* Unknown condition: static only when both branches have the same known shapes. A
         * branch that cannot be planned for these shapes is left to run time. */
        rc = mts_subgraph_shapes(k, tg, NULL, 0, sh, known);
        if (!rc) rc = mts_subgraph_shapes(k, eg, NULL, 0, sh + nb, known + nb);
        if (rc) {
            mts_err_clear(k->err);
            rc = MTS_EDYNAMIC;
        }
        for (int j = 0; !rc && j < k->n_out; j++)
            if (!known[j] || !known[nb + j] || sh[j].dtype != sh[nb + j].dtype || !mts_shape_equal(&sh[j], &sh[nb + j]))
                rc = MTS_EDYNAMIC;
        for (int j = 0; !rc && j < k->n_out; j++) set_shape(&k->out[j], &sh[j]);
    }
    free(sh);
    free(known);
    return rc;
}

static int if_run(mts_kctx *k)
{
    int rc = MTS_OK;
    mts_cf_state *st = mts_cf_state_get(k, k->n_out);
    if (st && st->ready) {
        st->ready = 0;
        for (int j = 0; !rc && j < k->n_out; j++) rc = copy_out(k, j, &st->view[j], "branch");
        return rc;
    }
    bool c = false;
    if ((rc = if_cond(k, &c))) return rc == MTS_EDYNAMIC ? mts_err_set(k->err, MTS_EINVAL, "condition has no data") : rc;
    mts_model *g = mts_subgraph(k->node, c ? "then_branch" : "else_branch"); /* only the branch taken */
    if (!g) return mts_err_set(k->err, MTS_EINVAL, "If needs then_branch and else_branch");
    int nb = mts_subgraph_n_outputs(g);
    if (k->n_out > nb) return mts_err_set(k->err, MTS_EINVAL, "If has more outputs than its branches");
    const mts_tensor *few[IF_FEW_OUTPUTS], **outs = few; /* no allocation per call for a few */
    mts_tensor few_dst[IF_FEW_OUTPUTS], *dst = few_dst;
    if (nb > IF_FEW_OUTPUTS) {
        outs = calloc((size_t)nb, sizeof *outs);
        dst = calloc((size_t)nb, sizeof *dst);
        if (!outs || !dst) {
            free(outs);
            free(dst);
            return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
        }
    }
    /* The branch computes its results straight into the If's output buffers where it can (a
     * static branch output of exactly that type and shape); copy_out copies the others. */
    for (int j = 0; j < nb; j++) {
        memset(&dst[j], 0, sizeof dst[j]);
        if (j < k->n_out) dst[j] = k->out[j];
    }
    void *tmp;
    rc = mts_subgraph_run_into(k, g, NULL, 0, dst, outs, &tmp);
    for (int j = 0; !rc && j < k->n_out; j++) rc = copy_out(k, j, outs[j], c ? "then_branch" : "else_branch");
    mts_subgraph_tmp_free(tmp);
    if (outs != few) {
        free(outs);
        free(dst);
    }
    return rc;
}

/* ---- Loop and Scan: shared pieces ---- */

/* Copies body output src into carried buffer set `set` (0 or 1) entry i of st (entries
 * [set*N, set*N+N)) and points *cur at it. */
static int carry(mts_kctx *k, mts_cf_state *st, int N, int set, int i, const mts_tensor *src, mts_tensor *cur)
{
    int e = set * N + i;
    int64_t n = mts_tensor_nbytes(src);
    int rc = mts_cf_reserve(st, e, n, false, k->err);
    if (rc) return rc;
    void *d = st->t[e].data;
    st->t[e] = *src;
    st->t[e].data = d;
    if (n > 0) memcpy(d, src->data, (size_t)n);
    *cur = st->t[e];
    return MTS_OK;
}

/* Writes per-iteration value src into stacked output entry e at position pos along axis, the
 * output having `len` positions there (grown when len < 0: Loop's unknown count). */
static int stack(mts_kctx *k, mts_cf_state *st, int e, int64_t iter, int64_t pos, int64_t len, int axis,
                 const mts_tensor *src, mts_tensor *first, const char *what)
{
    char a[128], b[128];
    if (src->dtype == MTS_DTYPE_SEQUENCE || src->dtype == MTS_DTYPE_OPTIONAL || src->dtype == MTS_DTYPE_STRINGS)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s: stacking %s values is not supported", what,
                           mts_dtype_name(src->dtype));
    if (iter == 0) {
        if (src->rank + 1 > MTS_MAX_RANK)
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s: per-iteration rank %d leaves no room to stack", what,
                               src->rank);
        *first = *src;
    } else if (src->dtype != first->dtype || !mts_shape_equal(src, first)) {
        return mts_err_set(k->err, MTS_ESHAPE, "%s: iteration %lld gives %s, earlier iterations %s", what,
                           (long long)iter, mts_shape_str(src, a, sizeof a), mts_shape_str(first, b, sizeof b));
    }
    int64_t per = mts_tensor_nbytes(src);
    int64_t count = len >= 0 ? len : iter + 1;
    int64_t limit = mts_subgraph_max_bytes(mts_subgraph(k->node, "body"));
    if (per > 0 && count > limit / per)
        return mts_err_set(k->err, MTS_ELIMIT, "%s: %lld iterations of %lld bytes exceed the limit of %lld bytes", what,
                           (long long)count, (long long)per, (long long)limit);
    int rc = mts_cf_reserve(st, e, per * count, len < 0, k->err);
    if (rc) return rc;
    mts_tensor *o = &st->t[e];
    o->dtype = src->dtype;
    o->rank = src->rank + 1;
    for (int d = 0, s = 0; d < o->rank; d++) o->dims[d] = d == axis ? count : src->dims[s++];
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= src->dims[d];
    for (int d = axis; d < src->rank; d++) inner *= src->dims[d];
    size_t es = mts_dtype_size(src->dtype), blk = (size_t)inner * es;
    for (int64_t q = 0; q < outer && blk > 0; q++)
        memcpy((char *)o->data + ((size_t)(q * count + pos)) * blk, (const char *)src->data + (size_t)q * blk, blk);
    return MTS_OK;
}

/* Copies the results infer kept (views [0, n_out) of the node's state of n entries). */
static int results_run(mts_kctx *k, int n)
{
    mts_cf_state *st = mts_cf_state_get(k, n);
    if (!st || !st->ready)
        return mts_err_set(k->err, MTS_EINVAL, "%s has no results (it runs during run-time shape inference)",
                           k->node->op_type);
    st->ready = 0;
    int rc = MTS_OK;
    for (int j = 0; !rc && j < k->n_out; j++) rc = copy_out(k, j, &st->view[j], k->node->op_type);
    return rc;
}

/* Sets the node's outputs from views [0, n_out) and marks the results ready. */
static void results_publish(mts_kctx *k, mts_cf_state *st)
{
    for (int j = 0; j < k->n_out; j++) set_shape(&k->out[j], &st->view[j]);
    st->ready = 1;
}

/* ---- Loop ---- */

typedef struct loop_geom {
    mts_model *body;
    int N, K;       /* loop-carried values, scan outputs */
} loop_geom;

static int loop_geom_get(mts_kctx *k, loop_geom *g)
{
    g->body = mts_subgraph(k->node, "body");
    if (!g->body) return mts_err_set(k->err, MTS_EINVAL, "Loop has no body");
    int n_exp = k->n_in - k->node->n_implicit;
    g->N = n_exp > 2 ? n_exp - 2 : 0;
    g->K = mts_subgraph_n_outputs(g->body) - 1 - g->N;
    if (g->K < 0 || mts_subgraph_n_inputs(g->body) != 2 + g->N || k->n_out > g->N + g->K)
        return mts_err_set(k->err, MTS_EINVAL, "Loop body does not match the node's inputs and outputs");
    return MTS_OK;
}

static int loop_infer(mts_kctx *k)
{
    loop_geom g;
    int rc = loop_geom_get(k, &g);
    if (rc) return rc;
    int n_exp = k->n_in - k->node->n_implicit;
    const mts_tensor *tM = n_exp > 0 ? mts_kin(k, 0) : NULL, *tc = n_exp > 1 ? mts_kin(k, 1) : NULL;
    char shp[128];
    if (tM && (mts_tensor_numel(tM) != 1 || tM->dtype == MTS_DTYPE_FLOAT))
        return mts_err_set(k->err, MTS_EINVAL, "trip count M must be one integer, is %s %s", mts_dtype_name(tM->dtype),
                           mts_shape_str(tM, shp, sizeof shp));
    if (tc && mts_tensor_numel(tc) != 1)
        return mts_err_set(k->err, MTS_EINVAL, "condition must have one element, has shape %s",
                           mts_shape_str(tc, shp, sizeof shp));
    for (int i = 0; i < g.N; i++)
        if (!mts_kin(k, 2 + i)) return mts_err_set(k->err, MTS_EINVAL, "loop-carried input %d is missing", i);
    if (!k->ctx) return MTS_EDYNAMIC; /* runs at run time */
    if ((tM && !tM->data) || (tc && !tc->data)) return MTS_EDYNAMIC;
    int64_t trip = tM ? mts_tensor_get_int(tM, 0) : -1;
    bool cond = tc ? mts_tensor_get_f64(tc, 0) != 0 : true;
    mts_cf_state *st = mts_cf_state_get(k, 2 * g.N + g.K);
    mts_tensor *formal = calloc((size_t)(2 + g.N) + 1, sizeof *formal);
    mts_tensor *first = calloc((size_t)g.K + 1, sizeof *first);
    const mts_tensor **outs = calloc((size_t)(1 + g.N + g.K) + 1, sizeof *outs);
    if (!st || !formal || !first || !outs) {
        rc = mts_err_set(k->err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    st->ready = 0;
    int64_t iter_v = 0;
    uint8_t cond_v = 1;
    formal[0] = (mts_tensor){.dtype = MTS_DTYPE_INT64, .rank = 0, .data = &iter_v};
    formal[1] = (mts_tensor){.dtype = MTS_DTYPE_BOOL, .rank = 0, .data = &cond_v};
    for (int i = 0; i < g.N; i++) formal[2 + i] = *mts_kin(k, 2 + i);
    int64_t it = 0;
    for (;; it++) {
        if (tM && it >= trip) break;
        if (tc && !cond) break;
        if (it >= MTS_LOOP_MAX_ITERS) {
            rc = mts_err_set(k->err, MTS_ELIMIT, "more than %lld iterations", (long long)MTS_LOOP_MAX_ITERS);
            goto out;
        }
        iter_v = it;
        cond_v = cond;
        void *tmp;
        rc = mts_subgraph_run(k, g.body, formal, 2 + g.N, outs, &tmp);
        if (rc) goto out;
        if (mts_tensor_numel(outs[0]) != 1 || !mts_dtype_supported(outs[0]->dtype)) {
            rc = mts_err_set(k->err, MTS_EINVAL, "the body's condition output must have one element");
            goto out;
        }
        if (tc) cond = mts_tensor_get_f64(outs[0], 0) != 0;
        for (int i = 0; i < g.N; i++)
            if ((rc = carry(k, st, g.N, (int)(it & 1), i, outs[1 + i], &formal[2 + i]))) goto out;
        for (int j = 0; j < g.K; j++)
            if ((rc = stack(k, st, 2 * g.N + j, it, it, -1, 0, outs[1 + g.N + j], &first[j], "scan output")))
                goto out;
    }
    for (int i = 0; i < g.N; i++) st->view[i] = formal[2 + i];
    for (int j = 0; j < g.K; j++) {
        mts_tensor *v = &st->view[g.N + j];
        if (it > 0) {
            *v = st->t[2 * g.N + j];
        } else { /* no iteration: an empty tensor of the declared type */
            mts_dtype dt = mts_subgraph_output_dtype(g.body, 1 + g.N + j);
            *v = (mts_tensor){.dtype = dt == MTS_DTYPE_UNDEFINED ? MTS_DTYPE_FLOAT : dt, .rank = 1};
            v->data = NULL;
        }
    }
    results_publish(k, st);
out:
    free(formal);
    free(first);
    free(outs);
    return rc;
}

static int loop_run(mts_kctx *k)
{
    loop_geom g;
    int rc = loop_geom_get(k, &g);
    return rc ? rc : results_run(k, 2 * g.N + g.K);
}

/* ---- Scan ---- */

typedef struct scan_geom {
    mts_model *body;
    int N, M, K;    /* state values, scan inputs, scan outputs */
    int64_t L;      /* sequence length */
    int in_axis[MTS_MAX_RANK * 4], out_axis[MTS_MAX_RANK * 4];
} scan_geom;

static int scan_geom_get(mts_kctx *k, scan_geom *g)
{
    g->body = mts_subgraph(k->node, "body");
    if (!g->body) return mts_err_set(k->err, MTS_EINVAL, "Scan has no body");
    int n_exp = k->n_in - k->node->n_implicit;
    int64_t M = mts_attr_int(k->node, "num_scan_inputs", -1);
    if (M < 1 || M > n_exp) return mts_err_set(k->err, MTS_EINVAL, "num_scan_inputs %lld is out of range", (long long)M);
    g->M = (int)M;
    g->N = n_exp - g->M;
    g->K = mts_subgraph_n_outputs(g->body) - g->N;
    if (g->K < 0 || mts_subgraph_n_inputs(g->body) != n_exp || k->n_out > g->N + g->K)
        return mts_err_set(k->err, MTS_EINVAL, "Scan body does not match the node's inputs and outputs");
    if (g->M > MTS_MAX_RANK * 4 || g->K > MTS_MAX_RANK * 4)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "more than %d scan inputs or outputs", MTS_MAX_RANK * 4);
    int na, nd, noa, nod;
    const int64_t *ia = mts_attr_ints(k->node, "scan_input_axes", &na);
    const int64_t *id = mts_attr_ints(k->node, "scan_input_directions", &nd);
    const int64_t *oa = mts_attr_ints(k->node, "scan_output_axes", &noa);
    const int64_t *od = mts_attr_ints(k->node, "scan_output_directions", &nod);
    if ((ia && na != g->M) || (id && nd != g->M) || (oa && noa != g->K) || (od && nod != g->K))
        return mts_err_set(k->err, MTS_EINVAL, "scan axes/directions attributes must list one entry per scan input "
                           "(%d) or output (%d)", g->M, g->K);
    for (int i = 0; i < nd; i++)
        if (id[i] != 0 && id[i] != 1) return mts_err_set(k->err, MTS_EINVAL, "scan_input_directions must be 0 or 1");
    for (int i = 0; i < nod; i++)
        if (od[i] != 0 && od[i] != 1) return mts_err_set(k->err, MTS_EINVAL, "scan_output_directions must be 0 or 1");
    g->L = -1;
    for (int i = 0; i < g->M; i++) {
        const mts_tensor *t = mts_kin(k, g->N + i);
        if (!t) return mts_err_set(k->err, MTS_EINVAL, "scan input %d is missing", i);
        int rc = mts_norm_axis(ia ? ia[i] : 0, t->rank, &g->in_axis[i], k->err);
        if (rc) return rc;
        int64_t len = t->dims[g->in_axis[i]];
        if (g->L >= 0 && len != g->L)
            return mts_err_set(k->err, MTS_ESHAPE, "scan inputs have different lengths (%lld and %lld)",
                               (long long)g->L, (long long)len);
        g->L = len;
    }
    for (int i = 0; i < g->N; i++)
        if (!mts_kin(k, i)) return mts_err_set(k->err, MTS_EINVAL, "state input %d is missing", i);
    for (int j = 0; j < g->K; j++) g->out_axis[j] = oa ? (int)oa[j] : 0; /* normalized per output rank later */
    return MTS_OK;
}

static int scan_infer(mts_kctx *k)
{
    scan_geom g;
    int rc = scan_geom_get(k, &g);
    if (rc) return rc;
    if (!k->ctx) return MTS_EDYNAMIC;
    for (int i = 0; i < g.N + g.M; i++)
        if (!k->in[i]->data && mts_tensor_numel(k->in[i]) != 0) return MTS_EDYNAMIC;
    int n_st = 2 * g.N + g.K + g.M; /* carried x2, scan outputs, scan input slices */
    mts_cf_state *st = mts_cf_state_get(k, n_st);
    mts_tensor *formal = calloc((size_t)(g.N + g.M) + 1, sizeof *formal);
    mts_tensor *first = calloc((size_t)g.K + 1, sizeof *first);
    const mts_tensor **outs = calloc((size_t)(g.N + g.K) + 1, sizeof *outs);
    int nd, nod;
    const int64_t *id = mts_attr_ints(k->node, "scan_input_directions", &nd);
    const int64_t *od = mts_attr_ints(k->node, "scan_output_directions", &nod);
    if (!st || !formal || !first || !outs) {
        rc = mts_err_set(k->err, MTS_ENOMEM, "out of memory");
        goto out;
    }
    st->ready = 0;
    for (int i = 0; i < g.N; i++) formal[i] = *k->in[i];
    for (int64_t t = 0; t < g.L; t++) {
        for (int i = 0; i < g.M; i++) { /* slice t (or L-1-t) of scan input i along its axis */
            const mts_tensor *x = k->in[g.N + i];
            int a = g.in_axis[i];
            int64_t pos = id && id[i] ? g.L - 1 - t : t;
            mts_tensor *f = &formal[g.N + i];
            *f = *x;
            f->rank = x->rank - 1;
            for (int d = 0, s = 0; d < x->rank; d++)
                if (d != a) f->dims[s++] = x->dims[d];
            int64_t outer = 1, inner = 1;
            for (int d = 0; d < a; d++) outer *= x->dims[d];
            for (int d = a + 1; d < x->rank; d++) inner *= x->dims[d];
            size_t es = mts_dtype_size(x->dtype), blk = (size_t)inner * es;
            if (outer == 1) {
                f->data = (char *)x->data + (size_t)pos * blk;
                continue;
            }
            int e = 2 * g.N + g.K + i;
            if ((rc = mts_cf_reserve(st, e, (int64_t)(blk * (size_t)outer), false, k->err))) goto out;
            for (int64_t q = 0; q < outer; q++)
                memcpy((char *)st->t[e].data + (size_t)q * blk, (const char *)x->data + (size_t)(q * g.L + pos) * blk,
                       blk);
            f->data = st->t[e].data;
        }
        void *tmp;
        rc = mts_subgraph_run(k, g.body, formal, g.N + g.M, outs, &tmp);
        if (rc) goto out;
        for (int i = 0; i < g.N; i++)
            if ((rc = carry(k, st, g.N, (int)(t & 1), i, outs[i], &formal[i]))) goto out;
        for (int j = 0; j < g.K; j++) {
            int axis;
            if ((rc = mts_norm_axis(g.out_axis[j], outs[g.N + j]->rank + 1, &axis, k->err))) goto out;
            int64_t pos = od && od[j] ? g.L - 1 - t : t;
            if ((rc = stack(k, st, 2 * g.N + j, t, pos, g.L, axis, outs[g.N + j], &first[j], "scan output"))) goto out;
        }
    }
    for (int i = 0; i < g.N; i++) st->view[i] = formal[i];
    for (int j = 0; j < g.K; j++) {
        mts_tensor *v = &st->view[g.N + j];
        if (g.L > 0) {
            *v = st->t[2 * g.N + j];
        } else {
            mts_dtype dt = mts_subgraph_output_dtype(g.body, g.N + j);
            *v = (mts_tensor){.dtype = dt == MTS_DTYPE_UNDEFINED ? MTS_DTYPE_FLOAT : dt, .rank = 1};
        }
    }
    results_publish(k, st);
out:
    free(formal);
    free(first);
    free(outs);
    return rc;
}

static int scan_run(mts_kctx *k)
{
    scan_geom g;
    int rc = scan_geom_get(k, &g);
    return rc ? rc : results_run(k, 2 * g.N + g.K + g.M);
}

const mts_op mts_ref_ops_control[] = {
    {"If", if_infer, if_run},
    {"Loop", loop_infer, loop_run},
    {"Scan", scan_infer, scan_run},
    {NULL, NULL, NULL},
};
