/*
 * Execution contexts: one caller's run state for a shared, immutable model.
 *
 * A context binds to the plan of the current input signature: it allocates the plan's buffer
 * slots (reused across runs while the signature stays the same), points constant values at the
 * plan's or model's data and graph inputs at the caller's buffers (no copy), then runs the
 * plan's steps. Dynamic nodes infer their shapes with real values and get per-value buffers
 * that grow as needed. Nothing here takes a lock except the plan lookup.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"

struct mts_ctx {
    mts_model *m;
    int threads;
    const mts__plan *plan;
    mts_tensor *vals;
    void **slots;
    int n_slots;
    void **dyn;        /* per value: buffer of a dynamic value */
    int64_t *dyn_cap;
    const mts_tensor **kin;
    mts_tensor *kout;
    int max_io;
};

int mts_ctx_create(mts_model *m, int threads, mts_ctx **out, mts_err *err)
{
    mts_ctx *c = calloc(1, sizeof *c);
    if (!c) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    c->m = m;
    c->threads = threads > 0 ? threads : 1;
    size_t nv = (size_t)m->n_values + 1;
    c->vals = calloc(nv, sizeof *c->vals);
    c->dyn = calloc(nv, sizeof *c->dyn);
    c->dyn_cap = calloc(nv, sizeof *c->dyn_cap);
    if (!c->vals || !c->dyn || !c->dyn_cap) {
        mts_ctx_free(c);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    *out = c;
    return MTS_OK;
}

void mts_ctx_set_threads(mts_ctx *c, int threads)
{
    c->threads = threads > 0 ? threads : 1;
}

int64_t mts_ctx_bytes(const mts_ctx *c)
{
    int64_t b = 0;
    if (c->plan)
        for (int i = 0; i < c->plan->n_slots; i++) b += c->plan->slot_bytes[i];
    for (int v = 0; v < c->m->n_values; v++) b += c->dyn_cap[v];
    return b;
}

static void unbind(mts_ctx *c)
{
    for (int i = 0; i < c->n_slots; i++) free(c->slots[i]);
    free(c->slots);
    c->slots = NULL;
    c->n_slots = 0;
    c->plan = NULL;
}

void mts_ctx_free(mts_ctx *c)
{
    if (!c) return;
    unbind(c);
    if (c->dyn)
        for (int v = 0; v < c->m->n_values; v++) free(c->dyn[v]);
    free(c->dyn);
    free(c->dyn_cap);
    free(c->vals);
    free(c->kin);
    free(c->kout);
    free(c);
}

static void *alloc_buf(int64_t bytes)
{
    size_t n = (size_t)(bytes > 0 ? bytes : 1);
    n = (n + 63) / 64 * 64;
    return aligned_alloc(64, n);
}

static int bind(mts_ctx *c, const mts__plan *p, mts_err *err)
{
    unbind(c);
    c->slots = calloc((size_t)p->n_slots + 1, sizeof(void *));
    if (!c->slots) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    for (int i = 0; i < p->n_slots; i++) {
        c->slots[i] = alloc_buf(p->slot_bytes[i]);
        if (!c->slots[i]) {
            c->n_slots = i;
            unbind(c);
            return mts_err_set(err, MTS_ENOMEM, "out of memory for activations (%lld bytes)", (long long)p->slot_bytes[i]);
        }
    }
    c->n_slots = p->n_slots;
    if (p->max_io > c->max_io) {
        free(c->kin);
        free(c->kout);
        c->kin = calloc((size_t)p->max_io, sizeof *c->kin);
        c->kout = calloc((size_t)p->max_io, sizeof *c->kout);
        if (!c->kin || !c->kout) {
            c->max_io = 0;
            unbind(c);
            return mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        c->max_io = p->max_io;
    }
    for (int v = 0; v < c->m->n_values; v++) {
        c->vals[v] = p->vals[v];
        if (p->state[v] == MTS__V_STATIC) c->vals[v].data = c->slots[p->slot_of[v]];
    }
    c->plan = p;
    return MTS_OK;
}

int mts_ctx_run(mts_ctx *c, const mts_tensor *inputs, int n_inputs, const mts_tensor **outputs, mts_err *err)
{
    mts_model *m = c->m;
    const mts__plan *p;
    int rc;
    for (int i = 0; i < n_inputs && i < m->n_inputs; i++)
        if (!inputs[i].data && mts_tensor_numel(&inputs[i]) != 0)
            return mts_err_set(err, MTS_EINVAL, "input '%s' has no data", m->values[m->inputs[i]].name);
    if ((rc = mts__plan_get(m, inputs, n_inputs, &p, err))) return rc;
    if (p != c->plan && (rc = bind(c, p, err))) return rc;
    for (int i = 0; i < n_inputs; i++) c->vals[m->inputs[i]] = inputs[i];
    for (int s = 0; s < p->n_steps; s++) {
        int ni = p->steps[s];
        const mts_node *n = &m->nodes[ni];
        for (int j = 0; j < n->n_in; j++) c->kin[j] = n->in[j] >= 0 ? &c->vals[n->in[j]] : NULL;
        mts_kctx k = {n, c->kin, n->n_in, c->kout, n->n_out, err, c->threads};
        if (p->node_dynamic[ni]) {
            memset(c->kout, 0, sizeof *c->kout * (size_t)n->n_out);
            if ((rc = p->ops[ni]->infer(&k))) goto node_fail;
            for (int j = 0; j < n->n_out; j++) {
                int v = n->out[j];
                int64_t b = mts_tensor_nbytes(&c->kout[j]);
                if (c->kout[j].rank < 0 || c->kout[j].rank > MTS_MAX_RANK || b < 0 ||
                    !mts_dtype_supported(c->kout[j].dtype)) {
                    rc = mts_err_set(err, MTS_EUNSUPPORTED, "output %d has an unsupported type or shape", j);
                    goto node_fail;
                }
                if (b > m->max_tensor_bytes) {
                    rc = mts_err_set(err, MTS_ELIMIT, "output '%s' would need %lld bytes, above the limit of %lld",
                                     m->values[v].name, (long long)b, (long long)m->max_tensor_bytes);
                    goto node_fail;
                }
                if (b > c->dyn_cap[v] || !c->dyn[v]) {
                    free(c->dyn[v]);
                    c->dyn[v] = alloc_buf(b);
                    c->dyn_cap[v] = c->dyn[v] ? b : 0;
                    if (!c->dyn[v]) {
                        rc = mts_err_set(err, MTS_ENOMEM, "out of memory (%lld bytes)", (long long)b);
                        goto node_fail;
                    }
                }
                c->kout[j].data = c->dyn[v];
                c->vals[v] = c->kout[j];
            }
        } else {
            for (int j = 0; j < n->n_out; j++) c->kout[j] = c->vals[n->out[j]];
        }
        if ((rc = p->ops[ni]->run(&k))) goto node_fail;
        continue;
    node_fail:
        mts_err_prefix(err, "node '%s' (#%d, %s): ", n->name, ni, n->op_type);
        return rc;
    }
    for (int i = 0; i < m->n_outputs; i++) outputs[i] = &c->vals[m->outputs[i]];
    return MTS_OK;
}
