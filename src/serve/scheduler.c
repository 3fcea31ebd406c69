/*
 * The scheduler: bounded per-model queues, dynamic batching and the device workers.
 *
 * mts_server_submit appends a request to its model's queue (rejecting at once when the model's
 * queue or the global cap is full) and, if the model is not resident, asks the registry to load
 * it; requests simply wait in the queue while the load runs, so a storm of requests to a cold
 * model causes one load.
 *
 * Each device keeps the set of models that are ready and have queued work. A worker takes the
 * model of the best priority level with the least virtual time (device time charged / weight:
 * fair sharing by compute time, not turns), forms a batch from its queue (requests whose inputs
 * match the first one in every dimension but the leading batch dimension, up to max_batch
 * samples; cancelled and expired requests are dropped here, before they cost compute), puts the
 * model back if work remains — so one model's flood cannot starve the others — and runs the
 * batch outside the lock with an execution context taken from the model version's pool. A
 * model's queue is in priority order: a request may lower its level below its model's.
 * A model with string inputs or outputs (engine blobs with their shape inside) is not batched:
 * each of its requests runs alone.
 *
 * Each device also has a short-work lane, an extra worker for batches measured to be short
 * (see LANE_MAX_NS), so light tenants do not wait behind heavy batches.
 *
 * Memory-aware batching (the ML service design's "dynamic batch sizing based on available
 * memory"): once a model has run, the scheduler knows what a context's activations cost per
 * sample (bytes after its largest batch / that batch). A batch is then capped at what fits in
 * the device's free budget (plus what the reused context already holds), at least 1, so a full
 * device runs smaller batches instead of evicting other models or exceeding the budget; with
 * room to spare batches grow to max_batch. Capped batches are counted per model.
 *
 * Intra-op threads per batch come from the backlog: when no other work is waiting on the
 * device, a batch gets every idle core of the device (a small load runs wide); when work is
 * waiting, each batch gets cores / workers, so workers × threads never exceeds the device's
 * cores.
 *
 * A request may set both itself (an embedding model's embedding_policy, api/embed_common.c):
 * mts_request.threads fixes the team size of the batch it leads (capped at the device's cores;
 * such batches stay off the short-work lane, which runs one thread), and mts_request.alone keeps
 * it a batch of its own, so the sub-batches a policy split a request into are not merged back.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/seqval.h"
#include "serve/internal.h"
#include "util/crash.h"
#include "util/iobuf.h"
#include "util/log.h"

void mts_request_release(mts_request *req)
{
    for (int i = 0; i < req->n_outputs; i++) {
        mts_iobuf_free(req->outputs[i].data);
        req->outputs[i].data = NULL;
    }
    req->n_outputs = 0;
}

void mts_request_cancel(mts_request *req)
{
    atomic_store(&req->cancelled, 1);
}

int mts_request_set_priority(mts_request *req, int64_t priority, char *msg, size_t len)
{
    if (priority < 0 || priority > MTS_PRIORITY_LEVELS) {
        snprintf(msg, len, "parameter 'priority' must be an integer from 0 (the model's level) to %d (last); a "
                 "request can lower its priority, not raise it", MTS_PRIORITY_LEVELS);
        return MTS_EINVAL;
    }
    req->priority = (int)priority;
    return MTS_OK;
}

void mts__fail_list(mts_request *list, int status, const char *msg)
{
    while (list) {
        mts_request *next = list->next;
        list->next = NULL;
        list->done(list, status, msg);
        list = next;
    }
}

/* The short-work lane: a batch whose estimated engine time is at most LANE_MAX_NS may run on the
 * device's extra worker, which takes nothing else, runs one thread and is not counted against
 * the device's cores: a light model's requests do not wait behind a heavy model's batches that
 * fill the regular workers (the OS shares the cores; the light batch takes microseconds). The
 * lane may use LANE_SHARE of the wall time, in bursts of up to LANE_BURST_NS, so a light model
 * that floods is served by the regular workers under fair sharing instead of taking a third
 * core's worth of time from the others. */
#define LANE_MAX_NS 2e6
#define LANE_SHARE 0.10
#define LANE_BURST_NS 50e6
/* What a worker looks for: regular work, the short-work lane's, or short work it runs inside
 * a pause of a long batch of its own (preemption, see preempt_hook). */
enum { PICK_REGULAR, PICK_LANE, PICK_PREEMPT };

/* Moving-average weight of a batch's measured cost per sample. */
#define COST_ALPHA 0.2
#define COST_JUMP 4.0 /* the most one batch's per-sample cost counts, against the estimate */

static int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double entry_weight(const mts__entry *e)
{
    return e->cfg->weight > 0 ? e->cfg->weight : 1.0;
}

static int entry_priority(const mts__entry *e)
{
    return e->cfg->priority > 0 ? e->cfg->priority : MTS_DEFAULT_PRIORITY;
}

/* The level a ready model competes at: its first queued request's (requests are queued in level
 * order, and a request's level is never better than its model's). */
static int ready_priority(const mts__entry *e)
{
    return e->qh && e->qh->priority > 0 ? e->qh->priority : entry_priority(e);
}

static bool lane_takes(mts__device *d, const mts__entry *e);

/* Links e into its device's ready list (lock held): the device, or NULL when e has nothing to
 * run or runs as many batches as it may. */
static mts__device *ready_link(mts_server *s, mts__entry *e)
{
    if (e->in_ready || !e->cur || e->qlen == 0) return NULL;
    int limit = e->cfg->instances > 0 ? e->cfg->instances : s->devs[e->cur->device].workers;
    if (e->running >= limit) return NULL;
    mts__device *d = &s->devs[e->cur->device];
    /* A model that was idle starts at the device's virtual time: no credit for the time it
     * did not use. (One that only waited for its own batches to finish keeps its place.) */
    if (e->idle && e->vtime < d->vclock) e->vtime = d->vclock;
    e->idle = false;
    e->in_ready = true;
    e->ready_next = NULL;
    if (d->ready_tail) d->ready_tail->ready_next = e;
    else d->ready_head = e;
    d->ready_tail = e;
    atomic_fetch_add_explicit(&d->ready_n, 1, memory_order_relaxed);
    return d;
}

/* Wakes one thread for e, just made ready on d: true when that thread is to take e's batch now.
 * One thread, not every worker: a light request costs one wake-up (each one a pair of context
 * switches taken from the busy workers). The lane when it waits and would take the batch, else a
 * regular worker; a lane that then cannot take it hands it on. */
static bool wake_one(mts__device *d, mts__entry *e)
{
    if (d->lane_waiting > 0 && lane_takes(d, e)) {
        pthread_cond_signal(&d->lane_cv);
        return true;
    }
    pthread_cond_signal(&d->cv);
    return d->ready_head == e && d->busy_workers < d->workers;
}

bool mts__ready_push(mts_server *s, mts__entry *e)
{
    mts__device *d = ready_link(s, e);
    return d && wake_one(d, e);
}

/* Engine time a batch of the model's next requests is expected to cost (core-ns); 0 when the
 * model has not run yet. */
static double batch_estimate(const mts__entry *e)
{
    /* samples of the next batch: the first request's whole (one larger than max_batch runs
     * alone), then the following ones while they fit; a request's samples are its first
     * input's leading dimension when the model batches */
    const mts__version *v = e->cur;
    int64_t n = 0, cap = v && v->max_batch > 0 ? v->max_batch : 1;
    for (const mts_request *r = e->qh; r; r = r->next) {
        int64_t k = 1;
        if (v && v->batchable && r->n_inputs > 0 && r->inputs[0].rank > 0 && r->inputs[0].dims[0] > 0)
            k = r->inputs[0].dims[0];
        if (n > 0 && n + k > cap) break;
        n += k;
        if (n >= cap) break;
    }
    return e->cost_per_sample * (double)(n > 0 ? n : 1);
}

/* The short-work lane runs a batch beside the regular workers' only when the device has room
 * for its activations as well (a context of its own when the model has none free), so it never
 * takes the memory that memory-aware batching keeps for them. */
static bool lane_fits(const mts__device *d, const mts__entry *e)
{
    const mts__version *v = e->cur;
    if (!v || v->act_samples <= 0) return false;
    int64_t n = e->qlen < v->max_batch ? e->qlen : v->max_batch;
    int64_t need = v->act_bytes / v->act_samples * (n > 0 ? n : 1);
    return need <= d->budget - d->used;
}

/* e's next batch as one-thread short work: its estimated cost when that is known, at most
 * short_ns and the device has room for its activations (lane_fits), else -1. */
static double short_work(const mts__device *d, const mts__entry *e, double short_ns)
{
    if (e->qh && e->qh->threads > 1) return -1; /* asks for a team: not one-thread lane work */
    double est = batch_estimate(e);
    return e->cost_per_sample > 0 && est <= short_ns && lane_fits(d, e) ? est : -1;
}

/* Fair sharing: the ready model of the best priority with the least virtual time (compute
 * charged divided by weight), so each model gets device time in proportion to its weight
 * whatever its batches cost, not turns. The short-work lane takes only models whose next batch
 * is measured to be short, while it has time budget. */
static mts__entry *ready_pick(mts__device *d, int mode, const mts__entry *outer, double outer_ns)
{
    /* short: what the lane takes, or for a pause, also anything under 1/16 of the paused batch */
    double short_ns = mode == PICK_PREEMPT && outer_ns / 16 > LANE_MAX_NS ? outer_ns / 16 : LANE_MAX_NS;
    mts__entry *best = NULL, *best_prev = NULL, *prev = NULL;
    for (mts__entry *e = d->ready_head; e; prev = e, e = e->ready_next) {
        if (mode != PICK_REGULAR) {
            double est = short_work(d, e, short_ns);
            if (est < 0 || (mode == PICK_LANE && est > d->lane_credit_ns)) continue;
            if (mode == PICK_PREEMPT && (e == outer || ready_priority(e) > entry_priority(outer) ||
                                         e->vtime > outer->vtime))
                continue;
        }
        if (!best || ready_priority(e) < ready_priority(best) ||
            (ready_priority(e) == ready_priority(best) && e->vtime < best->vtime)) {
            best = e;
            best_prev = prev;
        }
    }
    if (!best) return NULL;
    if (best_prev) best_prev->ready_next = best->ready_next;
    else d->ready_head = best->ready_next;
    if (d->ready_tail == best) d->ready_tail = best_prev;
    best->in_ready = false;
    best->ready_next = NULL;
    atomic_fetch_sub_explicit(&d->ready_n, 1, memory_order_relaxed);
    if (best->vtime > d->vclock) d->vclock = best->vtime;
    return best;
}

static void lane_refill(mts__device *d, int64_t now)
{
    if (d->lane_refill_ns) d->lane_credit_ns += (double)(now - d->lane_refill_ns) * LANE_SHARE;
    if (d->lane_credit_ns > LANE_BURST_NS) d->lane_credit_ns = LANE_BURST_NS;
    d->lane_refill_ns = now;
}

/* Whether the short-work lane would take e's next batch now (ready_pick's test for it, with
 * the lane's time budget brought up to date). */
static bool lane_takes(mts__device *d, const mts__entry *e)
{
    double est = short_work(d, e, LANE_MAX_NS);
    if (est < 0) return false;
    lane_refill(d, mts__now_ns());
    return est <= d->lane_credit_ns;
}

static void queue_remove(mts_server *s, mts__entry *e, mts_request *prev, mts_request *r)
{
    if (prev) prev->next = r->next;
    else e->qh = r->next;
    if (e->qt == r) e->qt = prev;
    r->next = NULL;
    e->qlen--;
    s->total_queued--;
    if (r->deadline_ns) s->deadline_reqs--;
}

mts_request *mts__drain_queue(mts_server *s, mts__entry *e)
{
    mts_request *list = e->qh;
    for (mts_request *r = list; r; r = r->next) {
        s->total_queued--;
        if (r->deadline_ns) s->deadline_reqs--;
    }
    e->qh = e->qt = NULL;
    e->qlen = 0;
    return list;
}

static bool run_inline(mts_server *s, mts__device *d, mts__entry *e, mts_request *req);

/* Under s->lock: MTS_EFULL (counted as a rejection) when e's queue or the server's is full. */
static int queue_full(mts_server *s, mts__entry *e, mts_err *err)
{
    if (e->qlen < e->cfg->queue_size && s->total_queued < s->cfg->max_queue_total) return MTS_OK;
    bool model_full = e->qlen >= e->cfg->queue_size;
    e->n_rejected++;
    s->rejected_full++;
    return mts_err_set(err, MTS_EFULL, "%s queue is full (%d requests queued, limit %d)",
                       model_full ? "the model's" : "the server's", model_full ? e->qlen : s->total_queued,
                       model_full ? e->cfg->queue_size : s->cfg->max_queue_total);
}

int mts_server_admit(mts_server *s, const char *model, size_t len, mts_err *err)
{
    char name[256];
    if (!s->early_refusal || len == 0 || len >= sizeof name) return MTS_OK; /* submit answers those */
    memcpy(name, model, len);
    name[len] = '\0';
    pthread_mutex_lock(&s->lock);
    mts__entry *e = mts__find(s, name);
    int rc = e && !s->stopping ? queue_full(s, e, err) : MTS_OK;
    if (rc) mts__win_error(e, mts__now_ns());
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int mts_server_submit(mts_server *s, mts_request *req, int *retry_after_s, mts_err *err)
{
    if (retry_after_s) *retry_after_s = 0;
    if (req->n_inputs < 0 || req->n_inputs > MTS_REQ_MAX_TENSORS || req->n_requested < 0 ||
        req->n_requested > MTS_REQ_MAX_TENSORS || !req->done)
        return mts_err_set(err, MTS_EINVAL, "malformed request");
    req->n_outputs = 0;
    req->next = NULL;
    req->reject_msg = NULL;
    req->answered = false;
    req->enqueue_ns = 0;
    atomic_store(&req->cancelled, 0);
    pthread_mutex_lock(&s->lock);
    mts__entry *e = mts__find(s, req->model);
    int rc = MTS_OK;
    if (!e) {
        rc = mts_err_set(err, MTS_ENOTFOUND, "unknown model '%s'", req->model);
    } else if (s->stopping) {
        rc = mts_err_set(err, MTS_EUNAVAILABLE, "server is shutting down");
    } else if (e->unavailable[0]) {
        rc = mts_err_set(err, MTS_EUNAVAILABLE, "model '%s' is unavailable: %s", req->model, e->unavailable);
    } else if (e->state == MTS_MODEL_DRAINING) {
        rc = mts_err_set(err, MTS_EUNAVAILABLE, "model '%s' is being unloaded", req->model);
    } else if (e->state == MTS_MODEL_FAILED && mts__now_ns() < e->retry_at_ns) {
        rc = mts_err_set(err, MTS_EUNAVAILABLE, "model '%s' failed to load: %s (next retry in %.1f s)", req->model,
                         e->reason, (double)(e->retry_at_ns - mts__now_ns()) / 1e9);
        if (retry_after_s) *retry_after_s = (int)((e->retry_at_ns - mts__now_ns()) / 1000000000) + 1;
    } else if (s->cfg->model_control == MTS_CONTROL_EXPLICIT &&
               (e->state == MTS_MODEL_UNLOADED || e->state == MTS_MODEL_FAILED)) {
        rc = mts_err_set(err, MTS_EUNAVAILABLE,
                         "model '%s' is not loaded (model control mode explicit: load it with POST "
                         "/v2/repository/models/%s/load)%s%s",
                         req->model, req->model, e->state == MTS_MODEL_FAILED ? "; last load failed: " : "",
                         e->state == MTS_MODEL_FAILED ? e->reason : "");
    } else if ((rc = queue_full(s, e, err))) {
        if (retry_after_s) *retry_after_s = 1;
    }
    if (rc) {
        if (e) mts__win_error(e, mts__now_ns()); /* refused: shutting down, unloading, back-off, full */
        pthread_mutex_unlock(&s->lock);
        return rc;
    }
    int64_t now = mts__now_ns();
    req->enqueue_ns = now;
    if (req->arrival_ns <= 0 || req->arrival_ns > now) req->arrival_ns = now;
    int64_t timeout_us = req->timeout_us > 0 ? req->timeout_us : s->cfg->default_timeout_ms * 1000;
    req->deadline_ns = timeout_us > 0 ? now + timeout_us * 1000 : 0;
    if (req->deadline_ns) s->deadline_reqs++;
    if (e->qlen == 0 && e->running == 0) e->idle = true; /* work again after none */
    int level = entry_priority(e);
    if (req->priority < level) req->priority = level;
    if (!e->qt || e->qt->priority <= req->priority) { /* the usual case: append */
        if (e->qt) e->qt->next = req;
        else e->qh = req;
        e->qt = req;
    } else { /* before the first request of a later level (one whose priority was lowered) */
        mts_request *prev = NULL, *r = e->qh;
        while (r && r->priority <= req->priority) prev = r, r = r->next;
        req->next = r;
        if (prev) prev->next = req;
        else e->qh = req;
    }
    e->qlen++;
    s->total_queued++;
    s->submitted++;
    req->cold = e->state != MTS_MODEL_READY;
    req->prompt = false;
    if (e->state == MTS_MODEL_UNLOADED || e->state == MTS_MODEL_FAILED) {
        mts__request_load(s, e);
    } else if (e->cur) {
        bool alone = e->qlen == 1;
        mts__device *d = ready_link(s, e);
        if (d) {
            if (!run_inline(s, d, e, req)) req->prompt = wake_one(d, e) && alone;
        } else if (e->in_ready) { /* queued already, a thread woken for it: this one may be sooner */
            run_inline(s, &s->devs[e->cur->device], e, req);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return MTS_OK;
}

/* ---- validation and batching ---- */

typedef struct batch_req {
    int order[MTS_REQ_MAX_TENSORS];  /* model input i -> request input index */
    int outs[MTS_REQ_MAX_TENSORS];   /* requested outputs as model output indices */
    int n_outs;
} batch_req;

static int validate(const mts__version *v, mts_request *r, batch_req *b, char *msg, size_t len)
{
    for (int j = 0; j < r->n_inputs; j++) {
        bool known = false;
        for (int i = 0; i < v->n_in; i++) known |= !strcmp(r->input_names[j], v->in[i].name);
        if (!known) {
            snprintf(msg, len, "'%s' is not an input of model '%s' (its inputs are", r->input_names[j], r->model);
            for (int k = 0; k < v->n_in; k++) {
                size_t o = strlen(msg);
                snprintf(msg + o, len - o, "%s '%s'", k ? "," : "", v->in[k].name);
            }
            size_t o = strlen(msg);
            snprintf(msg + o, len - o, ")");
            return MTS_EINVAL;
        }
    }
    if (r->n_inputs != v->n_in) {
        snprintf(msg, len, "model '%s' takes %d input%s, the request has %d", r->model, v->n_in, v->n_in == 1 ? "" : "s",
                 r->n_inputs);
        return MTS_EINVAL;
    }
    for (int i = 0; i < v->n_in; i++) {
        const mts_tensor_meta *m = &v->in[i];
        int found = -1;
        for (int j = 0; j < r->n_inputs; j++)
            if (!strcmp(r->input_names[j], m->name)) found = j;
        if (found < 0) {
            snprintf(msg, len, "input '%s' is missing (the model's inputs are", m->name);
            for (int k = 0; k < v->n_in; k++) {
                size_t o = strlen(msg);
                snprintf(msg + o, len - o, "%s '%s'", k ? "," : "", v->in[k].name);
            }
            size_t o = strlen(msg);
            snprintf(msg + o, len - o, ")");
            return MTS_EINVAL;
        }
        const mts_tensor *t = &r->inputs[found];
        if ((t->dtype == MTS_DTYPE_STRINGS) != (m->dtype == MTS_DTYPE_STRINGS)) {
            snprintf(msg, len, "input '%s' %s, the model expects %s%s", m->name,
                     t->dtype == MTS_DTYPE_STRINGS ? "holds strings (datatype BYTES)" : "holds numbers",
                     mts_dtype_name(m->dtype), m->dtype == MTS_DTYPE_STRINGS ? "s (datatype BYTES)" : "");
            return MTS_EINVAL;
        }
        mts_tensor shp;
        if (t->dtype == MTS_DTYPE_STRINGS) { /* a string blob: the shape is inside */
            mts_strv sv;
            mts_err err = {0};
            if (mts_str_view(t, &sv, &err)) {
                snprintf(msg, len, "input '%s': %s", m->name, err.msg);
                return MTS_EINVAL;
            }
            shp = (mts_tensor){MTS_DTYPE_STRINGS, sv.rank, {0}, NULL};
            memcpy(shp.dims, sv.dims, sizeof shp.dims);
            t = &shp;
        }
        if (v->batchable && t->rank >= 1 && t->dims[0] == 0) {
            snprintf(msg, len, "input '%s' has an empty batch (dimension 0 is 0); send at least one sample", m->name);
            return MTS_EINVAL;
        }
        if (t->dtype != m->dtype) {
            snprintf(msg, len, "input '%s' has type %s, the model expects %s", m->name, mts_dtype_name(t->dtype),
                     mts_dtype_name(m->dtype));
            return MTS_EINVAL;
        }
        bool ok = t->rank == m->rank;
        for (int d = 0; ok && d < m->rank; d++)
            if (m->dims[d] >= 0 && t->dims[d] != m->dims[d]) ok = false;
        if (!ok || (v->batchable && (t->rank < 1 || t->dims[0] < 1))) {
            char got[128], want[160];
            mts_shape_str(t, got, sizeof got);
            size_t o = (size_t)snprintf(want, sizeof want, "[");
            for (int d = 0; d < m->rank && o < sizeof want; d++)
                o += (size_t)snprintf(want + o, sizeof want - o, d ? ",%lld" : "%lld", (long long)m->dims[d]);
            if (o < sizeof want) snprintf(want + o, sizeof want - o, "]");
            snprintf(msg, len, "input '%s' has shape %s, the model expects %s (-1: any size)", m->name, got, want);
            return MTS_EINVAL;
        }
        b->order[i] = found;
    }
    r->samples = v->batchable ? r->inputs[b->order[0]].dims[0] : 1;
    if (v->batchable)
        for (int i = 1; i < v->n_in; i++)
            if (r->inputs[b->order[i]].dims[0] != r->samples) {
                snprintf(msg, len, "inputs disagree on the batch size (%lld vs %lld)", (long long)r->samples,
                         (long long)r->inputs[b->order[i]].dims[0]);
                return MTS_EINVAL;
            }
    /* The configured max batch bounds one request's batch, as Triton's max_batch_size does
     * (max_batch_size 0: the leading dimension is the model's own, not limited here). */
    const mts_model_config *cfg = v->entry ? v->entry->cfg : NULL;
    if (v->batchable && cfg && !cfg->no_batching && r->samples > v->max_batch) {
        snprintf(msg, len, "input '%s' has batch size %lld (dimension 0), more than the max_batch_size %d of model "
                 "'%s'; split the request", v->in[0].name, (long long)r->samples, v->max_batch, r->model);
        return MTS_EINVAL;
    }
    b->n_outs = 0;
    if (r->n_requested == 0) {
        for (int o = 0; o < v->n_out; o++) b->outs[b->n_outs++] = o;
    } else {
        for (int k = 0; k < r->n_requested; k++) {
            int found = -1;
            for (int o = 0; o < v->n_out; o++)
                if (!strcmp(r->requested[k], v->out[o].name)) found = o;
            if (found < 0) {
                snprintf(msg, len, "requested output '%s' is not an output of model '%s'", r->requested[k], r->model);
                return MTS_EINVAL;
            }
            b->outs[b->n_outs++] = found;
        }
    }
    return MTS_OK;
}

static bool compatible(const mts__version *v, const mts_request *a, const batch_req *ba, const mts_request *b,
                       const batch_req *bb)
{
    for (int i = 0; i < v->n_in; i++) {
        const mts_tensor *x = &a->inputs[ba->order[i]], *y = &b->inputs[bb->order[i]];
        for (int d = 1; d < x->rank; d++)
            if (x->dims[d] != y->dims[d]) return false;
    }
    if (ba->n_outs != bb->n_outs) return false;
    return memcmp(ba->outs, bb->outs, sizeof(int) * (size_t)ba->n_outs) == 0;
}

#define MTS__MAX_BATCH_REQS 256
#define MTS__WORKER_NICE 10 /* MTS_WORKER_NICE overrides; 0 = the process's priority */

static void *scratch_get(mts__worker *w, int depth, int i, size_t bytes)
{
    if (w->scratch_cap[depth][i] < bytes) {
        free(w->scratch[depth][i]);
        size_t cap = bytes + bytes / 4 + 64;
        w->scratch[depth][i] = aligned_alloc(64, (cap + 63) / 64 * 64);
        w->scratch_cap[depth][i] = w->scratch[depth][i] ? cap : 0;
    }
    return w->scratch[depth][i];
}

/* Runs one batch outside the lock. On failure, status and msg apply to every request. */
static int run_chunks(const mts__version *v, mts_ctx *ctx, const mts_tensor *in, int64_t samples,
                      const mts_tensor **outs, mts_tensor *staged, int *n_staged, mts_err *err);
static int finish_outputs(const mts__version *v, mts_request **reqs, const batch_req *br, int n, int64_t samples,
                          const mts_tensor **outs, mts_tensor *staged, int n_staged, char *msg, size_t len);

static int run_batch(mts__worker *w, mts__version *v, mts_ctx *ctx, mts_request **reqs, batch_req *br, int n,
                     int64_t samples, int depth, double *input_ms, double *infer_ms, double *output_ms, int *runs,
                     char *msg, size_t len)
{
    mts_tensor in[MTS_REQ_MAX_TENSORS];
    const mts_tensor *outs[MTS_REQ_MAX_TENSORS];
    mts_err err = {0};
    int64_t t0 = mts__now_ns();
    for (int i = 0; i < v->n_in; i++) {
        in[i] = reqs[0]->inputs[br[0].order[i]];
        if (n == 1) continue;
        in[i].dims[0] = samples;
        int64_t bytes = mts_tensor_nbytes(&in[i]);
        char *dst = scratch_get(w, depth, i, (size_t)bytes);
        if (!dst) {
            snprintf(msg, len, "out of memory gathering a batch of %lld", (long long)samples);
            return MTS_ENOMEM;
        }
        for (int k = 0; k < n; k++) {
            const mts_tensor *src = &reqs[k]->inputs[br[k].order[i]];
            int64_t b = mts_tensor_nbytes(src);
            memcpy(dst, src->data, (size_t)b);
            dst += b;
        }
        in[i].data = w->scratch[depth][i];
    }
    int64_t t1 = mts__now_ns();
    /* every request of the batch ignores its padded positions: a padding-free run */
    int pad = -1;
    for (int i = 0; i < v->n_in && reqs[0]->padding_mask; i++)
        if (!strcmp(reqs[0]->input_names[br[0].order[i]], reqs[0]->padding_mask)) pad = i;
    for (int k = 1; k < n && pad >= 0; k++)
        if (!reqs[k]->padding_mask || strcmp(reqs[k]->padding_mask, reqs[0]->padding_mask)) pad = -1;
    mts_ctx_set_padding_mask(ctx, pad);
    mts_tensor staged[MTS_REQ_MAX_TENSORS];
    int n_staged = 0;
    bool chunks = v->engine_batch > 0 && samples > v->engine_batch;
    *runs = chunks ? (int)((samples + v->engine_batch - 1) / v->engine_batch) : 1;
    int rc;
    if (chunks) {
        rc = run_chunks(v, ctx, in, samples, outs, staged, &n_staged, &err);
    } else if (n == 1 && pad < 0) {
        /* A request alone in its batch: the engine computes its outputs straight into I/O
         * buffers, which the request then owns (a lip-sync batch's 19.7 MB output is not copied
         * out of the context), as staged blocks. Not in a padding-free run: that leaves the
         * padded rows of its outputs unwritten, and a reused I/O buffer may hold another
         * request's bytes. */
        static const mts_out_alloc iobufs = {mts_iobuf_alloc, mts_iobuf_free};
        void *owned[MTS_REQ_MAX_TENSORS];
        rc = mts_ctx_run_owned(ctx, in, v->n_in, &iobufs, owned, outs, &err);
        for (int o = 0; !rc && o < v->n_out; o++) {
            staged[o].data = NULL;
            if (!owned[o]) continue;
            staged[o] = *outs[o];
            outs[o] = &staged[o];
        }
        if (!rc) n_staged = v->n_out;
    } else {
        rc = mts_ctx_run(ctx, in, v->n_in, outs, &err);
    }
    int64_t t2 = mts__now_ns();
    mts_ctx_set_padding_mask(ctx, -1);
    *input_ms = (double)(t1 - t0) / 1e6;
    *infer_ms = (double)(t2 - t1) / 1e6;
    if (rc) {
        for (int o = 0; o < n_staged; o++) mts_iobuf_free(staged[o].data);
        snprintf(msg, len, "%s", err.msg);
        return rc;
    }
    rc = finish_outputs(v, reqs, br, n, samples, outs, staged, n_staged, msg, len);
    for (int o = 0; o < n_staged; o++) mts_iobuf_free(staged[o].data);
    *output_ms = (double)(mts__now_ns() - t2) / 1e6;
    return rc;
}

/* A batch of more than engine_batch samples: engine runs over consecutive slices of the batch
 * (every input carries it first, which batchable guarantees), each output gathered into a
 * staging block (staged[0..*n_staged), freed by the caller) that outs then points at. A
 * context's activations grow with the batch; a model whose large batches run from memory (bf16
 * lip-sync UNets at 16 frames) runs faster in two halves. */
static int run_chunks(const mts__version *v, mts_ctx *ctx, const mts_tensor *in, int64_t samples,
                      const mts_tensor **outs, mts_tensor *staged, int *n_staged, mts_err *err)
{
    int64_t chunk = v->engine_batch;
    for (int64_t c0 = 0; c0 < samples; c0 += chunk) {
        int64_t cs = samples - c0 < chunk ? samples - c0 : chunk;
        mts_tensor part[MTS_REQ_MAX_TENSORS];
        for (int i = 0; i < v->n_in; i++) {
            if (in[i].rank < 1 || in[i].dims[0] != samples)
                return mts_err_set(err, MTS_EUNSUPPORTED, "input %d does not carry the batch first; set engine_batch: 0", i);
            int64_t per = mts_tensor_nbytes(&in[i]) / samples;
            part[i] = in[i];
            part[i].dims[0] = cs;
            part[i].data = (char *)in[i].data + per * c0;
        }
        const mts_tensor *po[MTS_REQ_MAX_TENSORS];
        int rc = mts_ctx_run(ctx, part, v->n_in, po, err);
        if (rc) return rc;
        for (int o = 0; o < v->n_out; o++) {
            if (po[o]->rank < 1 || po[o]->dims[0] != cs)
                return mts_err_set(err, MTS_EUNSUPPORTED, "output '%s' does not carry the batch as its first dimension; "
                                   "set engine_batch: 0", v->out[o].name);
            int64_t per = mts_tensor_nbytes(po[o]) / cs;
            if (c0 == 0) {
                staged[o] = *po[o];
                staged[o].dims[0] = samples;
                if (!(staged[o].data = mts_iobuf_alloc((size_t)(per * samples > 0 ? per * samples : 1))))
                    return mts_err_set(err, MTS_ENOMEM, "out of memory staging a batch of %lld", (long long)samples);
                *n_staged = o + 1;
            } else if (po[o]->dtype != staged[o].dtype || per * samples != mts_tensor_nbytes(&staged[o])) {
                return mts_err_set(err, MTS_EUNSUPPORTED, "output '%s' changed shape between slices of a batch",
                                   v->out[o].name);
            }
            memcpy((char *)staged[o].data + per * c0, po[o]->data, (size_t)(per * cs));
        }
    }
    for (int o = 0; o < v->n_out; o++) outs[o] = &staged[o];
    return MTS_OK;
}

/* Hands each request its slice of the batch's outputs (a request alone in its batch takes a
 * staged output block as it is). */
static int finish_outputs(const mts__version *v, mts_request **reqs, const batch_req *br, int n, int64_t samples,
                          const mts_tensor **outs, mts_tensor *staged, int n_staged, char *msg, size_t len)
{
    for (int o = 0; o < v->n_out; o++)
        if (n > 1 && (outs[o]->rank < 1 || outs[o]->dims[0] != samples)) {
            snprintf(msg, len, "output '%s' does not carry the batch as its first dimension; set max_batch: 1",
                     v->out[o].name);
            return MTS_EUNSUPPORTED;
        }
    int64_t offset_samples = 0;
    for (int k = 0; k < n; k++) {
        mts_request *r = reqs[k];
        r->n_outputs = 0;
        for (int j = 0; j < br[k].n_outs; j++) {
            int o = br[k].outs[j];
            mts_tensor t = *outs[o];
            int64_t per_sample = 0, total = mts_tensor_nbytes(outs[o]);
            if (n > 1) {
                per_sample = total / samples;
                t.dims[0] = r->samples;
            }
            int64_t bytes = n > 1 ? per_sample * r->samples : total;
            if (n == 1 && o < n_staged && outs[o] == &staged[o] && staged[o].data) {
                t.data = staged[o].data; /* the request owns it now */
                staged[o].data = NULL;
            } else {
                t.data = mts_iobuf_alloc(bytes > 0 ? (size_t)bytes : 1);
                if (!t.data) {
                    mts_request_release(r);
                    snprintf(msg, len, "out of memory for outputs");
                    return MTS_ENOMEM;
                }
                memcpy(t.data, (const char *)outs[o]->data + per_sample * offset_samples, (size_t)bytes);
            }
            snprintf(r->output_name_buf[r->n_outputs], sizeof r->output_name_buf[0], "%s", v->out[o].name);
            r->output_names[r->n_outputs] = r->output_name_buf[r->n_outputs];
            r->outputs[r->n_outputs++] = t;
        }
        offset_samples += r->samples;
    }
    return MTS_OK;
}

static void dur_add(mts_duration_stat *d, double ms)
{
    d->count++;
    d->ns += (uint64_t)(ms * 1e6);
}

/* Drops cancelled and expired requests from every queue (lock held); chains them for failing. */
static void sweep(mts_server *s, mts_request **cancelled, mts_request **expired)
{
    int64_t now = mts__now_ns();
    for (int i = 0; i < s->n_entries; i++) {
        mts__entry *e = &s->entries[i];
        mts_request *prev = NULL, *r = e->qh;
        while (r) {
            mts_request *next = r->next;
            bool c = atomic_load(&r->cancelled), x = r->deadline_ns && now > r->deadline_ns;
            if (c || x) {
                queue_remove(s, e, prev, r);
                if (c) {
                    r->next = *cancelled;
                    *cancelled = r;
                    e->n_cancelled++;
                    s->cancelled++;
                } else {
                    r->next = *expired;
                    *expired = r;
                    e->n_timeout++;
                    s->timed_out++;
                    mts__win_error(e, now);
                }
            } else {
                prev = r;
            }
            r = next;
        }
    }
}

/* Completes requests dropped while forming a batch (outside the lock). */
static void finish_dropped(mts_request *cancelled, mts_request *expired, mts_request *invalid)
{
    mts__fail_list(cancelled, MTS_ECANCELLED, "request cancelled: the client went away");
    mts__fail_list(expired, MTS_ETIMEDOUT, "request timed out before it could run");
    while (invalid) {
        mts_request *next = invalid->next;
        char *m = invalid->reject_msg;
        invalid->reject_msg = NULL;
        invalid->next = NULL;
        invalid->done(invalid, MTS_EINVAL, m ? m : "invalid request");
        free(m);
        invalid = next;
    }
}


/* One round of a worker, entered and left with the lock held: sweeps expired requests, picks a
 * model, forms a batch, runs it outside the lock and completes it. Returns 0 when there was
 * nothing to do. `outer` is the model whose batch is paused (PICK_PREEMPT), else NULL. */
static int serve_one(mts__worker *w, mts__device *d, int mode, mts__entry *outer, double outer_ns);

/* A worker's batch bookkeeping, one per depth ([0] its own batch, [1] short work run inside a
 * pause of it), and its gather buffers (grown by scratch_get). */
static void worker_buffers_alloc(mts__worker *w)
{
    for (int k = 0; k < 2; k++) w->br[k] = calloc(MTS__MAX_BATCH_REQS, sizeof(batch_req));
}

static bool worker_buffers_ok(const mts__worker *w)
{
    return w->br[0] && w->br[1];
}

static void worker_buffers_free(mts__worker *w)
{
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < MTS_REQ_MAX_TENSORS; i++) free(w->scratch[k][i]);
        free(w->br[k]);
    }
}

/* Short work on the submitting thread. When a request the front end marked run_inline arrives
 * and the short-work lane would take its model's batch at once, the submitting thread (a gRPC
 * polling thread) runs the lane's next batch itself instead of waking the lane: the wake-up and
 * the hand-back were most of what a light request cost the server (docs/server.md). It does so
 * whether the lane waits or not: a lane that is running, or woken but not yet given a core by
 * the OS (tens of ms on a loaded VM), would otherwise hold this request and every one queued
 * behind it, while the submitting thread demonstrably has a core now. The batch is picked and
 * charged exactly as the lane's (PICK_LANE, the lane's credit and counters); the thread borrows
 * one of MTS__INLINE_MAX worker slots of the device (their gather buffers), and when none is
 * free the lane is woken as usual. */
static mts__worker *inline_get(mts_server *s, mts__device *d)
{
    if (!d->inline_w) {
        d->inline_w = calloc(MTS__INLINE_MAX, sizeof *d->inline_w);
        if (!d->inline_w) return NULL;
        for (int i = 0; i < MTS__INLINE_MAX; i++) {
            mts__worker *w = &d->inline_w[i];
            *w = (mts__worker){.s = s, .device = d->id, .index = d->workers, .borrowed = true}; /* the lane's counters */
            worker_buffers_alloc(w);
        }
    }
    for (int i = 0; i < MTS__INLINE_MAX; i++)
        if (!d->inline_busy[i] && worker_buffers_ok(&d->inline_w[i])) {
            d->inline_busy[i] = true;
            return &d->inline_w[i];
        }
    return NULL;
}

void mts__inline_free(mts__device *d)
{
    for (int i = 0; d->inline_w && i < MTS__INLINE_MAX; i++) worker_buffers_free(&d->inline_w[i]);
    free(d->inline_w);
    d->inline_w = NULL;
}

/* Lock held (and held again on return). True when the batch ran (or was tried) here; req may then
 * be answered and gone. */
static bool run_inline(mts_server *s, mts__device *d, mts__entry *e, mts_request *req)
{
    if (!req->run_inline || !s->inline_short || !lane_takes(d, e)) return false;
    mts__worker *w = inline_get(s, d);
    if (!w) return false;
    req->prompt = true;
    s->inline_running++;
    serve_one(w, d, PICK_LANE, NULL, 0);
    d->inline_busy[w - d->inline_w] = false;
    s->inline_running--;
    /* whatever is still ready (another model picked first, the credit ran out) gets its thread */
    if (d->ready_head) wake_one(d, d->ready_head);
    pthread_cond_broadcast(&s->idle_cv);
    return true;
}

/* Preemption between engine steps (MTS_PREEMPT=1; off by default: the short-work lane is the
 * measured better choice, see docs/server.md): a regular worker's batch estimated to cost more
 * than PREEMPT_MIN_NS calls preempt_hook between its steps, which runs waiting short batches
 * (estimated <= LANE_MAX_NS or <= 1/16 of the paused batch, of a priority at least as good and a virtual time no later than
 * the paused model's) on the same thread, one thread each, before the long batch goes on. */
#define PREEMPT_MIN_NS 10e6

typedef struct preempt_arg {
    mts__worker *w;
    mts__device *d;
    mts__entry *e; /* the paused model */
    double ns;     /* its batch's estimated cost */
} preempt_arg;

static int preempt_hook(void *arg)
{
    preempt_arg *pa = arg;
    mts_server *s = pa->w->s;
    /* cheap test first: models are ready (the paused one is usually among them) */
    if (atomic_load_explicit(&pa->d->ready_n, memory_order_relaxed) == 0) return 0;
    if (pthread_mutex_trylock(&s->lock)) return 0; /* busy: the next step looks again */
    int ran = 0;
    while (!s->stop_workers && serve_one(pa->w, pa->d, PICK_PREEMPT, pa->e, pa->ns)) ran++;
    pthread_mutex_unlock(&s->lock);
    return ran;
}

void *mts__worker_main(void *arg)
{
    mts__worker *w = arg;
    mts_server *s = w->s;
    mts__device *d = &s->devs[w->device];
    bool lane = w->index == d->workers; /* the short-work lane */
    if (lane && !s->short_lane) return NULL; /* off (MTS_SHORT_LANE=0): for comparisons */
    worker_buffers_alloc(w);
    /* Regular workers (and the intra-op threads they start, which inherit it) run at a lower
     * CPU priority than the front ends, the lane and the loaders: a request arriving while the
     * workers fill the cores is read, parsed and queued (or run on the lane) at once instead of
     * after the OS's time slice. With nothing else runnable the workers still get every core. */
    const char *nice_env = getenv("MTS_WORKER_NICE");
    int nice = nice_env && *nice_env ? atoi(nice_env) : MTS__WORKER_NICE;
    if (!lane && nice > 0 && nice < 20) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice);
    pthread_mutex_lock(&s->lock);
    while (!s->stop_workers) {
        if (worker_buffers_ok(w) && serve_one(w, d, lane ? PICK_LANE : PICK_REGULAR, NULL, 0)) continue;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        if (lane) {
            /* ready work the lane does not take (woken for it, but its credit ran short):
             * a regular worker's */
            if (atomic_load_explicit(&d->ready_n, memory_order_relaxed) > 0) pthread_cond_signal(&d->cv);
            d->lane_waiting++;
            pthread_cond_timedwait(&d->lane_cv, &s->lock, &ts);
            d->lane_waiting--;
        } else {
            pthread_cond_timedwait(&d->cv, &s->lock, &ts);
        }
    }
    pthread_mutex_unlock(&s->lock);
    worker_buffers_free(w);
    return NULL;
}

static int serve_one(mts__worker *w, mts__device *d, int mode, mts__entry *outer, double outer_ns)
{
    mts_server *s = w->s;
    bool lane = mode != PICK_REGULAR; /* one thread, not counted against the device's cores */
    int depth = mode == PICK_PREEMPT;
    mts_request *reqs[MTS__MAX_BATCH_REQS];
    batch_req *br = w->br[depth];
    char msg[512];
    mts_request *cancelled = NULL, *expired = NULL, *invalid = NULL;
    int64_t now = mts__now_ns();
    if ((s->deadline_reqs > 0 || s->total_queued > 0) && now - s->last_sweep_ns > 20000000) {
        s->last_sweep_ns = now;
        sweep(s, &cancelled, &expired);
    }
    if (mode == PICK_LANE) lane_refill(d, now);
    mts__entry *e = ready_pick(d, mode, outer, outer_ns);
    if (!e && !cancelled && !expired) return 0;
    int n = 0;
    int64_t samples = 0;
    mts__version *v = e ? e->cur : NULL;
    int64_t limit = v ? v->max_batch : 1;
    bool capped = false;
    if (v && v->batchable && limit > 1 && v->act_samples > 0) {
        int64_t per = v->act_bytes / v->act_samples, room = d->budget - d->used;
        /* only a tight device needs the bytes the reused context already holds (a walk
         * over its buffers, under the lock) */
        if (per > 0 && room < per * limit && v->n_ctx_free > 0)
            room += mts_ctx_bytes(v->ctx_free[v->n_ctx_free - 1]);
        int64_t fit = per > 0 ? room / per : limit;
        if (fit < limit) {
            limit = fit < 1 ? 1 : fit;
            capped = true;
        }
    }
    if (e && v) {
        mts_request *prev = NULL, *r = e->qh;
        int scanned = 0;
        while (r && n < MTS__MAX_BATCH_REQS && scanned++ < 4 * MTS__MAX_BATCH_REQS) {
            mts_request *next = r->next;
            if (atomic_load(&r->cancelled)) {
                queue_remove(s, e, prev, r);
                r->next = cancelled;
                cancelled = r;
                e->n_cancelled++;
                s->cancelled++;
            } else if (r->deadline_ns && now > r->deadline_ns) {
                queue_remove(s, e, prev, r);
                r->next = expired;
                expired = r;
                e->n_timeout++;
                s->timed_out++;
                mts__win_error(e, now);
            } else if (validate(v, r, &br[n], msg, sizeof msg)) {
                queue_remove(s, e, prev, r);
                r->next = invalid;
                invalid = r;
                e->fail.count++;
                s->failed++;
                mts__win_error(e, now);
                r->reject_msg = strdup(msg);
            } else if (n == 0 || (v->batchable && !reqs[0]->alone && !r->alone && r->priority <= reqs[0]->priority &&
                                  compatible(v, reqs[0], &br[0], r, &br[n]) && samples + r->samples <= limit)) {
                queue_remove(s, e, prev, r);
                reqs[n++] = r;
                samples += r->samples;
                if (!v->batchable || samples >= limit || r->alone) break;
            } else {
                prev = r;
            }
            r = next;
        }
    }
    if (n == 0) {
        if (e) mts__ready_push(s, e);
        mts__version *to_free = NULL;
        mts__waiter *notify = NULL;
        if (e) mts__after_idle(s, e, &to_free, &notify);
        pthread_cond_broadcast(&s->idle_cv);
        pthread_mutex_unlock(&s->lock);
        finish_dropped(cancelled, expired, invalid);
        mts__notify(notify, 0, "unloaded");
        mts__version_free_list(&to_free);
        pthread_mutex_lock(&s->lock);
        return 1;
    }
    if (capped && samples >= limit && e->qh) e->mem_capped++; /* work was left for a later batch */
    e->running++;
    v->refs++;
    /* A batch of a size not run before builds a plan, which holds the unpacked weights
     * beside the packed ones until it is built: reserve that (the first batch uses the
     * load's reservation), making room by eviction before the build, not after. */
    int size_bit = samples < 63 ? (int)samples : 63;
    int64_t plan_reserve = 0;
    mts__version *pre_free = NULL;
    bool new_size = !(v->sizes_run & (1ULL << size_bit));
    if (new_size) {
        if (v->load_transient) {
            v->load_transient = false;
            plan_reserve = v->transient_bytes; /* this batch releases the load's part */
        } else if (v->file_bytes > 0) {
            plan_reserve = v->file_bytes;
            v->transient_bytes += plan_reserve;
            d->used += plan_reserve;
            mts__enforce_budget(s, v->device, e, &pre_free);
        }
    }
    /* Charged now with the estimate (so the next pick already sees it), corrected with the
     * measured time when the batch ends. */
    double charged = e->cost_per_sample * (double)samples;
    e->vtime += charged / entry_weight(e);
    mts__ready_push(s, e);
    int threads = d->ready_head ? (d->cores / (d->workers > 0 ? d->workers : 1)) : d->cores - d->busy_cores;
    if (threads < 1 || lane) threads = 1;
    bool hinted = reqs[0]->threads > 0; /* (the lane takes only hints of 1 thread: ready_pick) */
    if (hinted && !lane) threads = reqs[0]->threads < d->cores ? reqs[0]->threads : d->cores;
    /* the model can only grow in a batch that may build a plan or a team size's primitives */
    int team_bit = threads < 63 ? threads : 63;
    bool new_team = !(v->teams_run & (1ULL << team_bit));
    bool may_grow = plan_reserve || new_team;
    /* a batch that builds a plan, a team size's primitives or a context costs more than the
     * model's batches do: it does not move the cost estimate (once there is one), and an
     * estimate it set is replaced by the next batch's */
    bool first_of_kind = new_size || new_team || v->n_ctx_free == 0;
    if (!lane) {
        d->busy_cores += threads;
        d->busy_workers++;
    }
    mts_ctx *ctx = v->n_ctx_free > 0 ? v->ctx_free[--v->n_ctx_free] : NULL;
    pthread_mutex_unlock(&s->lock);

    finish_dropped(cancelled, expired, invalid);
    mts__version_free_list(&pre_free);
    int64_t t_start = mts__now_ns(), cpu_start = thread_cpu_ns();
    int rc = MTS_OK;
    mts_err err = {0};
    msg[0] = '\0';
    if (!ctx && (rc = mts_ctx_create(v->model, threads, &ctx, &err))) snprintf(msg, sizeof msg, "%s", err.msg);
    int64_t ctx_before = ctx ? mts_ctx_bytes(ctx) : 0;
    double in_ms = 0, infer_ms = 0, out_ms = 0;
    int runs = 1;
    int64_t skipped = ctx ? mts_ctx_rows_skipped(ctx) : 0;
    if (!rc) {
        mts_ctx_set_threads(ctx, threads);
        mts_crash_set_model(e->cfg->name);
        /* A long batch of a regular worker pauses between its steps for short work (preemption,
         * MTS_PREEMPT=1), which then waits one step, not the batch. */
        preempt_arg pa = {w, d, e, charged};
        bool hook = mode == PICK_REGULAR && s->preempt && charged > PREEMPT_MIN_NS;
        mts_ctx_set_step_hook(ctx, hook ? preempt_hook : NULL, &pa);
        rc = run_batch(w, v, ctx, reqs, br, n, samples, depth, &in_ms, &infer_ms, &out_ms, &runs, msg, sizeof msg);
        mts_ctx_set_step_hook(ctx, NULL, NULL);
        skipped = mts_ctx_rows_skipped(ctx) - skipped;
        mts_crash_set_model(outer ? outer->cfg->name : NULL);
    }
    int64_t ctx_after = ctx ? mts_ctx_bytes(ctx) : 0;
    int64_t t_end = mts__now_ns(), cpu_end = thread_cpu_ns();
    /* plans for a new batch size, oneDNN primitives for a new team size: the model grew */
    int64_t engine_after = -1; /* not measured: unchanged */
    if (may_grow) { /* (the plan lock: only then may it wait for another batch's build) */
        mts_model_info minfo;
        mts_model_get_info(v->model, &minfo);
        engine_after = minfo.resident_bytes + minfo.mapped_bytes;
    }

    pthread_mutex_lock(&s->lock);
    if (!lane) {
        d->busy_cores -= threads;
        d->busy_workers--;
    }
    d->w_batches[w->index]++;
    if (w->borrowed) d->inline_batches++;
    d->w_busy_ns[w->index] += t_end - t_start;
    /* CPU time, not wall time: a batch that waited for a core (the OS shares them with the
     * short-work lane, the front ends and other processes) did not cost more. A team's other
     * threads are taken to have worked as long as the calling one. */
    double cost = (double)(cpu_end - cpu_start) * threads;
    e->vtime += (cost - charged) / entry_weight(e);
    if (mode == PICK_LANE) d->lane_credit_ns -= cost;
    if (mode == PICK_PREEMPT) e->n_preempt++;
    e->team_batches[threads < MTS_TEAM_STATS ? threads : MTS_TEAM_STATS]++;
    if (hinted) e->hinted_batches++;
    if (n == 1 && reqs[0]->alone) e->alone_batches++;
    if (!rc && skipped > 0) e->padfree_batches++, e->padding_rows_skipped += (uint64_t)skipped;
    if (!rc && samples > 0 && !(first_of_kind && e->cost_per_sample > 0)) {
        /* One sample moves the estimate at most COST_JUMP-fold: a batch that did some rare
         * extra work, or whose thread a VM stalled (without steal-time accounting a guest
         * counts that as CPU time), is not what the model costs, and one such sample made a
         * light model's next batches look long: they went to the regular workers and waited
         * behind a heavy model's batches (docs/server.md). A real change of cost is followed
         * within a few batches. */
        double per = cost / (double)samples;
        if (e->cost_per_sample <= 0 || e->cost_provisional) e->cost_per_sample = per; /* the first, or the first real one */
        else e->cost_per_sample += COST_ALPHA * (fmin(per, COST_JUMP * e->cost_per_sample) - e->cost_per_sample);
        e->cost_provisional = first_of_kind;
    }
    /* A version replaced during the batch (force_reload) left the device's bytes with what
     * it held then; only the current version's changes move them. */
    bool live = e->cur == v;
    if (may_grow) v->teams_run |= 1ULL << team_bit;
    if (plan_reserve) { /* the plan is built and its weights packed */
        v->sizes_run |= 1ULL << size_bit;
        v->transient_bytes -= plan_reserve;
        if (live) d->used -= plan_reserve;
    }
    bool grew = live && engine_after > v->engine_bytes;
    if (engine_after >= 0 && engine_after != v->engine_bytes) {
        v->base_bytes += engine_after - v->engine_bytes;
        if (live) d->used += engine_after - v->engine_bytes;
        v->engine_bytes = engine_after;
        if (v->base_bytes + v->ctx_bytes > e->last_bytes) e->last_bytes = v->base_bytes + v->ctx_bytes;
    }
    if (ctx) {
        if (v->n_ctx_free == v->cap_ctx_free) {
            int cap = v->cap_ctx_free ? v->cap_ctx_free * 2 : 4;
            mts_ctx **nc = realloc(v->ctx_free, sizeof *nc * (size_t)cap);
            if (nc) {
                v->ctx_free = nc;
                v->cap_ctx_free = cap;
            }
        }
        if (v->n_ctx_free < v->cap_ctx_free) {
            v->ctx_free[v->n_ctx_free++] = ctx;
            ctx = NULL;
        }
        v->ctx_bytes += ctx_after - ctx_before;
        d->used += ctx_after - ctx_before;
        if (!rc && samples >= v->act_samples && ctx_after > 0) {
            v->act_samples = samples;
            v->act_bytes = ctx_after;
        }
        if (v->base_bytes + v->ctx_bytes > e->last_bytes) e->last_bytes = v->base_bytes + v->ctx_bytes;
        if (ctx) {
            v->ctx_bytes -= ctx_after;
            d->used -= ctx_after;
        }
    }
    v->refs--;
    e->running--;
    int64_t now_ms = mts__wall_ms();
    e->last_used_ns = t_end;
    e->last_used_ms = now_ms;
    e->execution_count += (uint64_t)runs; /* engine runs: more than one for a batch split by engine_batch */
    if (!rc) {
        e->inference_count += (uint64_t)samples;
        e->usage_count += (uint64_t)n;
        e->lfu += (uint64_t)n;
        e->total_inference_ms += infer_ms;
        dur_add(&e->compute_input, in_ms);
        dur_add(&e->compute_infer, infer_ms);
        dur_add(&e->compute_output, out_ms);
        if (samples <= MTS_MAX_BATCH_STATS) dur_add(&e->batch_infer[samples], infer_ms);
        mts__hist_add(&e->h_compute, mts__time_buckets, MTS__HIST_BUCKETS, infer_ms / 1e3);
        mts__hist_add(&e->h_batch, mts__batch_buckets, MTS__BATCH_BUCKETS, (double)samples);
        mts__win_batch(e, t_end, samples, infer_ms);
    }
    for (int k = 0; k < n; k++) {
        double q_ms = (double)(t_start - reqs[k]->enqueue_ns) / 1e6;
        reqs[k]->queue_ms = q_ms;
        reqs[k]->compute_ms = (double)(t_end - t_start) / 1e6;
        reqs[k]->device = d->id;
        reqs[k]->batch_size = (int)samples;
        dur_add(&e->queue, q_ms);
        mts__hist_add(&e->h_queue, mts__time_buckets, MTS__HIST_BUCKETS, q_ms / 1e3);
        if (!rc) {
            e->req_input_ns += (uint64_t)(in_ms * 1e6);
            e->req_infer_ns += (uint64_t)(infer_ms * 1e6);
            e->req_output_ns += (uint64_t)(out_ms * 1e6);
        }
        double total_ms = (double)(t_end - reqs[k]->enqueue_ns) / 1e6;
        mts__win_request(e, t_end, !rc, total_ms);
        if (!rc) {
            dur_add(&e->success, total_ms);
            s->completed++;
        } else {
            dur_add(&e->fail, total_ms);
            s->failed++;
        }
    }
    mts__ready_push(s, e);
    mts__version *to_free = NULL;
    mts__waiter *notify = NULL;
    mts__after_idle(s, e, &to_free, &notify);
    if (ctx_after > ctx_before || grew) mts__enforce_budget(s, v->device, e, &to_free);
    pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->lock);

    if (ctx) mts_ctx_free(ctx);
    if (rc) MTS_WARN("model=%s event=batch_failed batch=%lld error=\"%s\"", e->cfg->name, (long long)samples, msg);
    for (int k = 0; k < n; k++) {
        reqs[k]->next = NULL;
        if (rc) {
            mts_request_release(reqs[k]);
            reqs[k]->done(reqs[k], rc == MTS_ESHAPE || rc == MTS_EINVAL ? MTS_EINVAL : rc, msg);
        } else {
            reqs[k]->done(reqs[k], MTS_OK, NULL);
        }
    }
    mts__notify(notify, 0, "unloaded");
    mts__version_free_list(&to_free);
    pthread_mutex_lock(&s->lock);
    return 1;
}
