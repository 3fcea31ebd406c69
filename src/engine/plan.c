/*
 * Plans: the model compiled for one concrete input-shape signature.
 *
 * Building a plan walks the nodes in topological order and, for each, runs the kernel's shape
 * inference with the shapes (and, where known, the values) of its inputs:
 *   - a node whose inputs are all constant is run right away and its outputs become constants
 *     (this folds weight preprocessing); Shape and Size of a tensor whose shape is known here
 *     count as constant too, which folds Shape→Gather→Concat→Reshape chains (random generators
 *     without a seed are the exception: they run on every run);
 *   - a node whose output shape depends on values only known at run time is marked dynamic and
 *     its shapes are inferred again on every run;
 *   - every other node gets static output shapes, and its outputs get a buffer slot.
 * Slots are reused by liveness: when a value's last reader has run, its slot can hold a later
 * value of at most the same size (best fit), so a context's memory is the plan's peak, not the
 * sum of all intermediates. Nodes whose outputs reach no graph output are dropped.
 *
 * Plans are cached in the model, keyed by the signature, built once under the model's plan
 * lock and read-only afterwards, so execution contexts on many threads share them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "engine/seqval.h"
#include "engine/weights.h"

#define MTS__FOLD_MAX_BYTES ((int64_t)256 << 20)
#define MTS__MAX_PLANS 256

/* Plans a model keeps (MTS_MAX_PLANS, default 256): one per input signature seen, the least
 * recently used one freed to make room for a new signature beyond that. */
static int max_plans(void)
{
    static int v; /* set by whichever worker plans first; every thread computes the same */
    int n = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (!n) {
        const char *e = getenv("MTS_MAX_PLANS");
        n = e ? atoi(e) : 0;
        n = n >= 1 && n <= 65536 ? n : MTS__MAX_PLANS;
        __atomic_store_n(&v, n, __ATOMIC_RELAXED);
    }
    return n;
}

bool mts__plan_same_shapes(const mts__plan *p, const mts_tensor *in, int n)
{
    if (p->n_sig != n) return false;
    for (int i = 0; i < n; i++)
        if (mts_dtype_is_blob(in[i].dtype) || p->sig[i].dtype != in[i].dtype || !mts_shape_equal(&p->sig[i], &in[i]))
            return false;
    return true;
}

static bool sig_match(const mts__plan *p, const mts_tensor *in, int n)
{
    if (p->n_sig != n) return false;
    for (int i = 0; i < n; i++)
        if (p->sig[i].dtype != in[i].dtype ||
            (!mts_dtype_is_blob(in[i].dtype) && !mts_shape_equal(&p->sig[i], &in[i])))
            return false; /* blobs match by type: their readers are dynamic steps */
    return true;
}

int mts__check_inputs(const mts_model *m, const mts_tensor *in, int n, mts_err *err)
{
    if (n != m->n_inputs)
        return mts_err_set(err, MTS_EINVAL, "model takes %d inputs, got %d", m->n_inputs, n);
    for (int i = 0; i < n; i++) {
        const mts_value *v = &m->values[m->inputs[i]];
        char got[128], want[128];
        /* float16/bfloat16 inputs arrive converted to float (half.c); undefined: a subgraph input */
        if (in[i].dtype != v->dtype && v->dtype != MTS_DTYPE_UNDEFINED &&
            !(mts_dtype_is_half(v->dtype) && in[i].dtype == MTS_DTYPE_FLOAT))
            return mts_err_set(err, MTS_EINVAL, "input '%s' has type %s, the model expects %s", v->name,
                               mts_dtype_name(in[i].dtype), mts_dtype_name(v->dtype));
        if (in[i].rank < 0 || in[i].rank > MTS_MAX_RANK || mts_tensor_numel(&in[i]) < 0)
            return mts_err_set(err, MTS_ESHAPE, "input '%s' has an invalid shape", v->name);
        if (v->rank < 0 || mts_dtype_is_seq(v->dtype)) continue;
        const mts_tensor *x = &in[i];
        mts_tensor shp = {MTS_DTYPE_UINT8, 0, {0}, NULL};
        if (v->dtype == MTS_DTYPE_STRINGS) { /* a blob: its shape is inside (checked when it has data) */
            mts_strv sv;
            if (!in[i].data) continue;
            int rc = mts_str_view(&in[i], &sv, err);
            if (rc) {
                mts_err_prefix(err, "input '%s': ", v->name);
                return rc;
            }
            shp.rank = sv.rank;
            memcpy(shp.dims, sv.dims, sizeof shp.dims);
            x = &shp;
        }
        bool ok = x->rank == v->rank;
        for (int d = 0; ok && d < v->rank; d++)
            if (v->dims[d] >= 0 && v->dims[d] != x->dims[d]) ok = false;
        if (!ok) {
            size_t o = 0;
            o += (size_t)snprintf(want + o, sizeof want - o, "[");
            for (int d = 0; d < v->rank && o < sizeof want; d++) {
                if (v->dims[d] >= 0)
                    o += (size_t)snprintf(want + o, sizeof want - o, d ? ",%lld" : "%lld", (long long)v->dims[d]);
                else
                    o += (size_t)snprintf(want + o, sizeof want - o, d ? ",%s" : "%s",
                                          v->dim_params[d] ? v->dim_params[d] : "?");
            }
            if (o < sizeof want) snprintf(want + o, sizeof want - o, "]");
            return mts_err_set(err, MTS_ESHAPE, "input '%s' has shape %s, the model expects %s", v->name,
                               mts_shape_str(x, got, sizeof got), want);
        }
    }
    return MTS_OK;
}

static double node_flops(const mts_node *n, const mts_tensor *const *in, const mts_tensor *out)
{
    const char *op = n->op_type;
    if ((!strcmp(op, "Conv") || !strcmp(op, "ConvTranspose")) && in[1] && in[1]->rank >= 3) {
        /* weights: Conv [M, C/g, k...]; ConvTranspose [C, M/g, k...] */
        double kvol = 1;
        for (int i = 2; i < in[1]->rank; i++) kvol *= (double)in[1]->dims[i];
        if (!strcmp(op, "Conv")) {
            double outvol = (double)mts_tensor_numel(out); /* N*M*spatial */
            return 2.0 * outvol * (double)in[1]->dims[1] * kvol;
        }
        double invol = (double)mts_tensor_numel(in[0]);
        return 2.0 * invol * (double)in[1]->dims[1] * kvol;
    }
    if ((!strcmp(op, "MatMul") || !strcmp(op, "Gemm")) && in[0] && in[0]->rank >= 1) {
        int64_t k = in[0]->dims[in[0]->rank - 1];
        if (!strcmp(op, "Gemm") && mts_attr_int(n, "transA", 0) && in[0]->rank == 2) k = in[0]->dims[0];
        return 2.0 * (double)mts_tensor_numel(out) * (double)k;
    }
    return 0;
}

static void plan_free(mts__plan *p)
{
    for (int s = 0; p->steps && s < p->n_steps; s++) {
        const mts__step *st = &p->steps[s];
        if (st->kind == MTS__S_BACKEND && st->impl && mts_backends[st->backend]->step_free)
            mts_backends[st->backend]->step_free(st->impl);
    }
    mts_pool_free(&p->pool);
    free(p);
}

/* Appends node i as a kernel step (arrays point at the node's; the optimizer copies before it
 * rewrites). */
static void add_step(mts_model *m, mts__plan *p, int i, bool dynamic)
{
    mts__step *st = &p->steps[p->n_steps++];
    const mts_node *n = &m->nodes[i];
    memset(st, 0, sizeof *st);
    st->node = i;
    st->nd = n;
    st->op = m->ops[i];
    st->kind = MTS__S_KERNEL;
    st->dynamic = dynamic;
    st->n_in = n->n_in;
    st->n_out = n->n_out;
    st->in = n->in;
    st->out = n->out;
    st->split_axis = -1;
}

/* The implementation behind a backend step ("" for kernel steps). */
static const char *describe_step(const mts__step *st)
{
    if (st->kind != MTS__S_BACKEND || !mts_backends[st->backend]->describe) return "";
    return mts_backends[st->backend]->describe(st);
}

/* MTS_PLAN_VERBOSE=1: one line per step on stderr (kind, layout, backend implementation). */
static void dump_plan(const mts_model *m, const mts__plan *p)
{
    fprintf(stderr, "plan for %s: %d steps (%d nodes fused), scratch %lld bytes%s\n", m->path, p->n_steps, p->n_fused,
            (long long)p->scratch_bytes, p->rows_ok ? ", padding-free runs possible (steps marked 'rows')" : "");
    for (int s = 0; s < p->n_steps; s++) {
        const mts__step *st = &p->steps[s];
        int y = st->n_out > 0 ? st->out[0] : -1;
        if (st->split_axis >= 0) fprintf(stderr, "  [split on axis %d]", st->split_axis);
        bool special = st->kind == MTS__S_KERNEL && st->op != m->ops[st->node];
        char note[96] = "";
        if (special && strcmp(st->nd->op_type, m->nodes[st->node].op_type))
            snprintf(note, sizeof note, " (special kernel: %s)", st->nd->op_type);
        else if (special)
            snprintf(note, sizeof note, " (special kernel)");
        else if (st->dynamic)
            snprintf(note, sizeof note, " dynamic");
        fprintf(stderr, "  %3d %-18s %-24s -> %-24s %s%s%s%s\n", s, m->nodes[st->node].op_type, m->nodes[st->node].name,
                y >= 0 ? m->values[y].name : "-", describe_step(st),
                st->nhwc || (y >= 0 && p->nhwc[y]) ? " nhwc" : "", note, st->rows ? " rows" : "");
    }
}

static int build(mts_model *m, const mts_tensor *inputs, int n_in, mts__plan **out, mts_err *err)
{
    if (m->backend == MTS_BACKEND_DEFAULT) {
        int rc0 = mts__restore_weights(m, err);
        if (rc0) return rc0;
    }
    mts__plan *p = calloc(1, sizeof *p);
    if (!p) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    mts_pool *pool = &p->pool;
    int nv = m->n_values, nn = m->n_nodes;
    int rc = MTS_OK;
    uint8_t *needed = calloc((size_t)nn + 1, 1);
    uint8_t *vneeded = calloc((size_t)nv + 1, 1);
    const mts_tensor **kin = NULL;
    mts_tensor *kout = NULL;
    p->sig = mts_pool_calloc(pool, (size_t)n_in + 1, sizeof(mts_tensor));
    p->vals = mts_pool_calloc(pool, (size_t)nv + 1, sizeof(mts_tensor));
    p->state = mts_pool_calloc(pool, (size_t)nv + 1, 1);
    p->steps = mts_pool_calloc(pool, (size_t)nn + 1, sizeof(mts__step));
    p->nhwc = mts_pool_calloc(pool, (size_t)nv + 1, 1);
    p->slot_of = mts_pool_calloc(pool, (size_t)nv + 1, sizeof(int));
    int max_io = 1;
    for (int i = 0; i < nn; i++) {
        if (m->nodes[i].n_in > max_io) max_io = m->nodes[i].n_in;
        if (m->nodes[i].n_out > max_io) max_io = m->nodes[i].n_out;
    }
    p->max_io = max_io;
    kin = calloc((size_t)max_io, sizeof *kin);
    kout = calloc((size_t)max_io, sizeof *kout);
    if (!needed || !vneeded || !p->sig || !p->vals || !p->state || !p->steps || !p->nhwc || !p->slot_of ||
        !kin || !kout) {
        rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        goto fail;
    }
    p->n_sig = n_in;
    for (int i = 0; i < n_in; i++) {
        p->sig[i] = inputs[i];
        p->sig[i].data = NULL;
    }
    /* Liveness from the graph outputs backwards. */
    for (int i = 0; i < m->n_outputs; i++) vneeded[m->outputs[i]] = 1;
    for (int i = nn - 1; i >= 0; i--) {
        const mts_node *n = &m->nodes[i];
        for (int j = 0; j < n->n_out; j++)
            if (vneeded[n->out[j]]) needed[i] = 1;
        if (needed[i])
            for (int j = 0; j < n->n_in; j++)
                if (n->in[j] >= 0) vneeded[n->in[j]] = 1;
    }
    for (int v = 0; v < nv; v++) {
        const mts_value *val = &m->values[v];
        p->slot_of[v] = -1;
        if (val->kind == MTS_VALUE_INITIALIZER) {
            p->vals[v] = val->init;
            p->state[v] = MTS__V_CONST;
        }
    }
    for (int i = 0; i < n_in; i++) {
        p->vals[m->inputs[i]] = p->sig[i];
        p->state[m->inputs[i]] = MTS__V_INPUT;
    }
    for (int i = 0; i < nn; i++) {
        if (!needed[i]) continue;
        const mts_node *n = &m->nodes[i];
        bool dynamic = false, all_const = true;
        /* Shape and Size read only their input's dims, known here unless it is dynamic. */
        bool dims_only = !n->domain[0] && (!strcmp(n->op_type, "Shape") || !strcmp(n->op_type, "Size"));
        /* A random generator without a seed draws anew on every run: never folded. */
        if (!n->domain[0] && !mts_node_attr(n, "seed") &&
            (!strncmp(n->op_type, "Random", 6) || !strcmp(n->op_type, "Bernoulli") || !strcmp(n->op_type, "Multinomial")))
            all_const = false;
        for (int j = 0; j < n->n_in; j++) {
            int v = n->in[j];
            kin[j] = v >= 0 ? &p->vals[v] : NULL;
            if (v < 0) continue;
            if (p->state[v] == MTS__V_DYNAMIC) dynamic = true;
            if (mts_dtype_is_blob(p->vals[v].dtype) && p->state[v] != MTS__V_DYNAMIC) {
                if (!mts_blob_op_accepts(n->domain, n->op_type, p->vals[v].dtype)) {
                    rc = mts_err_set(err, MTS_EUNSUPPORTED, "input '%s' is a %s, which %s does not take",
                                     m->values[v].name, mts_dtype_name(p->vals[v].dtype), n->op_type);
                    goto node_fail;
                }
                if (p->state[v] == MTS__V_INPUT) dynamic = true; /* its size varies per run */
            }
            if (p->state[v] != MTS__V_CONST && !dims_only) all_const = false;
            if (p->state[v] != MTS__V_DYNAMIC && !mts_dtype_supported(p->vals[v].dtype)) {
                rc = mts_err_set(err, MTS_EUNSUPPORTED, "input '%s' has unsupported type %s", m->values[v].name,
                                 mts_dtype_name(p->vals[v].dtype));
                goto node_fail;
            }
        }
        memset(kout, 0, sizeof *kout * (size_t)max_io);
        mts_kctx k = {n, kin, n->n_in, kout, n->n_out, err, 1, NULL};
        if (!dynamic) {
            rc = m->ops[i]->infer(&k);
            if (rc == MTS_EDYNAMIC) {
                dynamic = true;
                mts_err_clear(err);
                rc = MTS_OK;
            } else if (rc) {
                goto node_fail;
            }
        }
        if (dynamic) {
            for (int j = 0; j < n->n_out; j++) p->state[n->out[j]] = MTS__V_DYNAMIC;
            add_step(m, p, i, true);
            continue;
        }
        int64_t out_bytes = 0;
        for (int j = 0; j < n->n_out; j++) {
            int64_t b = mts_tensor_nbytes(&kout[j]);
            char shp[128];
            if (kout[j].rank < 0 || kout[j].rank > MTS_MAX_RANK || b < 0 || !mts_dtype_supported(kout[j].dtype)) {
                rc = mts_err_set(err, MTS_EUNSUPPORTED, "output %d has unsupported type %s or shape %s", j,
                                 mts_dtype_name(kout[j].dtype), mts_shape_str(&kout[j], shp, sizeof shp));
                goto node_fail;
            }
            if (b > m->max_tensor_bytes) {
                rc = mts_err_set(err, MTS_ELIMIT, "output '%s' would need %lld bytes (shape %s), above the limit of %lld",
                                 m->values[n->out[j]].name, (long long)b, mts_shape_str(&kout[j], shp, sizeof shp),
                                 (long long)m->max_tensor_bytes);
                goto node_fail;
            }
            out_bytes += b;
        }
        if (all_const && out_bytes <= MTS__FOLD_MAX_BYTES) {
            for (int j = 0; j < n->n_out; j++) {
                int64_t b = mts_tensor_nbytes(&kout[j]);
                kout[j].data = mts_pool_alloc(pool, b > 0 ? (size_t)b : 1);
                if (!kout[j].data) {
                    rc = mts_err_set(err, MTS_ENOMEM, "out of memory folding constants");
                    goto node_fail;
                }
            }
            if ((rc = m->ops[i]->run(&k))) goto node_fail;
            for (int j = 0; j < n->n_out; j++) {
                p->vals[n->out[j]] = kout[j];
                p->state[n->out[j]] = MTS__V_CONST;
            }
            continue;
        }
        p->flops += node_flops(n, kin, &kout[0]);
        for (int j = 0; j < n->n_out; j++) {
            kout[j].data = NULL;
            p->vals[n->out[j]] = kout[j];
            p->state[n->out[j]] = MTS__V_STATIC;
        }
        add_step(m, p, i, false);
        continue;
    node_fail:
        mts_err_prefix(err, "%s: node '%s' (#%d, %s): ", m->path, n->name, i, n->op_type);
        goto fail;
    }
    if (m->backend == MTS_BACKEND_DEFAULT && (rc = mts__optimize(m, p, err))) goto fail;
    mts__plan_padfree(m, p);
    if (getenv("MTS_PLAN_VERBOSE")) dump_plan(m, p);
    for (int s = 0; s < p->n_steps; s++) {
        if (p->steps[s].n_in > p->max_io) p->max_io = p->steps[s].n_in;
        if (p->steps[s].n_out > p->max_io) p->max_io = p->steps[s].n_out;
    }
    /* Buffer slots by liveness over the steps. */
    {
        int *last_use = malloc(sizeof(int) * ((size_t)nv + 1));
        int64_t *slot_bytes = calloc((size_t)nv + 1, sizeof(int64_t));
        uint8_t *slot_free = calloc((size_t)nv + 1, 1);
        if (!last_use || !slot_bytes || !slot_free) {
            free(last_use);
            free(slot_bytes);
            free(slot_free);
            rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
            goto fail;
        }
        for (int v = 0; v < nv; v++) last_use[v] = -1;
        for (int s = 0; s < p->n_steps; s++) {
            const mts__step *n = &p->steps[s];
            for (int j = 0; j < n->n_in; j++)
                if (n->in[j] >= 0) last_use[n->in[j]] = s;
        }
        for (int i = 0; i < m->n_outputs; i++) last_use[m->outputs[i]] = p->n_steps; /* never dies */
        int n_slots = 0;
        for (int s = 0; s < p->n_steps; s++) {
            const mts__step *n = &p->steps[s];
            for (int j = 0; j < n->n_out; j++) {
                int v = n->out[j];
                if (v < 0 || p->state[v] != MTS__V_STATIC) continue;
                int64_t b = mts_tensor_nbytes(&p->vals[v]);
                int best = -1;
                for (int q = 0; q < n_slots; q++)
                    if (slot_free[q] && slot_bytes[q] >= b && (best < 0 || slot_bytes[q] < slot_bytes[best])) best = q;
                if (best < 0) { /* grow the largest free slot if any, else a new one */
                    for (int q = 0; q < n_slots; q++)
                        if (slot_free[q] && (best < 0 || slot_bytes[q] > slot_bytes[best])) best = q;
                    if (best < 0) best = n_slots++;
                    slot_bytes[best] = b;
                }
                slot_free[best] = 0;
                p->slot_of[v] = best;
            }
            /* Values whose last reader is this step free their slots (after outputs are placed). */
            for (int j = 0; j < n->n_in; j++) {
                int v = n->in[j];
                if (v >= 0 && last_use[v] == s && p->slot_of[v] >= 0) {
                    bool again = false; /* same value twice as input: free once */
                    for (int q = 0; q < j; q++)
                        if (n->in[q] == v) again = true;
                    if (!again) slot_free[p->slot_of[v]] = 1;
                }
            }
            /* Outputs nobody reads die at once. */
            for (int j = 0; j < n->n_out; j++) {
                int v = n->out[j];
                if (v >= 0 && p->slot_of[v] >= 0 && last_use[v] < 0) slot_free[p->slot_of[v]] = 1;
            }
        }
        p->n_slots = n_slots;
        p->slot_bytes = mts_pool_calloc(pool, (size_t)n_slots + 1, sizeof(int64_t));
        if (!p->slot_bytes) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        else memcpy(p->slot_bytes, slot_bytes, sizeof(int64_t) * (size_t)n_slots);
        for (int q = 0; q < n_slots; q++) p->activation_bytes += slot_bytes[q];
        free(last_use);
        free(slot_bytes);
        free(slot_free);
        if (rc) goto fail;
    }
    free(needed);
    free(vneeded);
    free(kin);
    free(kout);
    *out = p;
    return MTS_OK;
fail:
    free(needed);
    free(vneeded);
    free(kin);
    free(kout);
    plan_free(p);
    return rc;
}

int mts__plan_get(mts_model *m, const mts_tensor *inputs, int n, const mts__plan **out, mts_err *err)
{
    int rc = mts__check_inputs(m, inputs, n, err);
    if (rc) return rc;
    /* A float16/bfloat16 input is computed in float (half.c): plans see it as float. */
    mts_tensor *norm = NULL;
    for (int i = 0; i < n; i++)
        if (mts_dtype_is_half(inputs[i].dtype)) {
            if (!norm) {
                norm = malloc(sizeof *norm * (size_t)n);
                if (!norm) return mts_err_set(err, MTS_ENOMEM, "out of memory");
                memcpy(norm, inputs, sizeof *norm * (size_t)n);
            }
            norm[i].dtype = MTS_DTYPE_FLOAT;
            norm[i].data = NULL;
        }
    if (norm) {
        rc = mts__plan_get(m, norm, n, out, err);
        free(norm);
        return rc;
    }
    pthread_mutex_lock(&m->plan_lock);
    for (mts__plan *p = m->plans; p; p = p->next)
        if (sig_match(p, inputs, n)) {
            p->users++;
            p->last_use = ++m->plan_clock;
            *out = p;
            pthread_mutex_unlock(&m->plan_lock);
            return MTS_OK;
        }
    int limit = max_plans();
    while (m->n_plans >= limit) { /* make room: the least recently used plan nobody holds */
        mts__plan **victim = NULL;
        for (mts__plan **pp = &m->plans; *pp; pp = &(*pp)->next)
            if ((*pp)->users == 0 && (!victim || (*pp)->last_use < (*victim)->last_use)) victim = pp;
        if (!victim) {
            pthread_mutex_unlock(&m->plan_lock);
            return mts_err_set(err, MTS_ELIMIT, "%s: %d distinct input shapes are in use at once (the limit)", m->path,
                               limit);
        }
        mts__plan *v = *victim;
        *victim = v->next;
        m->n_plans--;
        m->plan_bytes -= (int64_t)v->pool.bytes;
        m->plans_evicted++;
        plan_free(v);
    }
    mts__plan *p = NULL;
    rc = build(m, inputs, n, &p, err);
    if (rc == MTS_OK) {
        p->next = m->plans;
        m->plans = p;
        m->n_plans++;
        m->plan_bytes += (int64_t)p->pool.bytes;
        p->users = 1;
        p->last_use = ++m->plan_clock;
        p->id = m->plan_clock;
        *out = p;
    }
    pthread_mutex_unlock(&m->plan_lock);
    return rc;
}

void mts__plan_release(mts_model *m, const mts__plan *p)
{
    if (!p) return;
    pthread_mutex_lock(&m->plan_lock);
    ((mts__plan *)p)->users--;
    pthread_mutex_unlock(&m->plan_lock);
}

int mts_model_plan_count(const mts_model *m, int64_t *evicted)
{
    pthread_mutex_lock((pthread_mutex_t *)&m->plan_lock);
    int n = m->n_plans;
    if (evicted) *evicted = m->plans_evicted;
    pthread_mutex_unlock((pthread_mutex_t *)&m->plan_lock);
    return n;
}

void mts__plan_free_all(mts_model *m)
{
    mts__plan *p = m->plans;
    while (p) {
        mts__plan *next = p->next;
        plan_free(p);
        p = next;
    }
    m->plans = NULL;
    m->n_plans = 0;
}

int mts_model_analyze(mts_model *m, const mts_tensor *inputs, int n_inputs, double *flops, int64_t *act, mts_err *err)
{
    const mts__plan *p;
    int rc = mts__plan_get(m, inputs, n_inputs, &p, err);
    if (rc) return rc;
    *flops = p->flops;
    *act = p->activation_bytes;
    mts__plan_release(m, p);
    return MTS_OK;
}

static int op_steps(mts_model *m, const char *op_type)
{
    int n = 0;
    const char *slash = strchr(op_type, '/');
    size_t len = slash ? (size_t)(slash - op_type) : strlen(op_type);
    pthread_mutex_lock(&m->plan_lock);
    for (const mts__plan *p = m->plans; p; p = p->next) {
        int k = 0;
        for (int s = 0; s < p->n_steps; s++) {
            const mts_node *nd = p->steps[s].nd;
            k += nd && strlen(nd->op_type) == len && !strncmp(nd->op_type, op_type, len) &&
                 (!slash || mts_attr_int(nd, slash + 1, 0) != 0);
        }
        n = k > n ? k : n;
    }
    pthread_mutex_unlock(&m->plan_lock);
    for (int i = 0; i < m->n_subs; i++) n += op_steps(m->subs[i], op_type);
    return n;
}

int mts_model_op_steps(const mts_model *m, const char *op_type)
{
    while (m->root) m = m->root;
    return op_steps((mts_model *)m, op_type); /* takes the plan locks only */
}
