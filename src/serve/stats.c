/*
 * Statistics: consistent snapshots of models, devices and server totals (copied under the
 * lock so callers never read half-updated counters), and the Prometheus text exposition of
 * every metric: requests by model and outcome, queue and compute latency histograms, batch
 * sizes, queue depth, loads/unloads/evictions and their durations, resident models and bytes
 * per device, and per-worker busy time (utilization = rate of busy seconds); beside them Triton's
 * nv_* names (per model and version, and nv_gpu_memory_* per device) for Triton dashboards, and
 * the end-to-end request duration the front ends record when they hand an answer back.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"
#include "util/iobuf.h"

const double mts__time_buckets[MTS__HIST_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                     0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,     10};
const double mts__batch_buckets[MTS__BATCH_BUCKETS] = {1, 2, 4, 8, 16, 32, 64, 128};

void mts__hist_add(mts__hist *h, const double *bounds, int nb, double v)
{
    int i = 0;
    while (i < nb && v > bounds[i]) i++;
    h->counts[i]++;
    h->n++;
    h->sum += v;
}

static void snapshot(mts_server *s, const mts__entry *e, mts_model_status *o)
{
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", e->cfg->name);
    o->state = e->unavailable[0] ? MTS_MODEL_UNAVAILABLE : e->state;
    snprintf(o->reason, sizeof o->reason, "%s", e->unavailable[0] ? e->unavailable : e->reason);
    o->device = e->cur ? e->cur->device : -1;
    o->version = e->versions;
    o->memory_bytes = e->cur ? e->cur->base_bytes + e->cur->ctx_bytes : 0;
    o->loaded_at_ms = e->loaded_at_ms;
    o->last_used_ms = e->last_used_ms;
    o->usage_count = e->usage_count;
    o->total_inference_ms = e->total_inference_ms;
    o->inference_count = e->inference_count;
    o->execution_count = e->execution_count;
    o->success = e->success;
    o->fail = e->fail;
    o->queue = e->queue;
    o->compute_input = e->compute_input;
    o->compute_infer = e->compute_infer;
    o->compute_output = e->compute_output;
    memcpy(o->batch_infer, e->batch_infer, sizeof o->batch_infer);
    o->queue_depth = e->qlen;
    o->running = e->running;
    o->max_batch = e->cur ? e->cur->max_batch : e->cfg->max_batch;
    o->no_batching = e->cfg->no_batching;
    o->pinned = e->cfg->pin;
    o->last_load_ms = e->last_load_ms;
    o->loads = e->loads;
    o->unloads = e->unloads;
    o->evictions = e->evictions;
    o->load_failures = e->load_failures;
    o->model_version = e->cfg->version > 0 ? e->cfg->version : 1;
    o->memory_capped_batches = e->mem_capped;
    o->preempting_batches = e->n_preempt;
    memcpy(o->team_batches, e->team_batches, sizeof o->team_batches);
    o->alone_batches = e->alone_batches;
    o->hinted_batches = e->hinted_batches;
    o->padfree_batches = e->padfree_batches;
    o->padding_rows_skipped = e->padding_rows_skipped;
    mts_embed_policy_format(e->cfg, o->embedding_policy, sizeof o->embedding_policy);
    o->n_inputs = e->n_in;
    o->n_outputs = e->n_out;
    memcpy(o->inputs, e->in, sizeof o->inputs);
    memcpy(o->outputs, e->out, sizeof o->outputs);
    if (e->cur && e->cur->bg) { /* background cache (its own lock nests inside) */
        o->has_bgcache = true;
        mts_bgcache_stats_get(e->cur->bg, &o->bgcache);
    }
    if (e->cur) snprintf(o->bg_error, sizeof o->bg_error, "%s", e->cur->bg_error);
    o->guard_error = -1;
    if (e->cur) {
        const mts_precision_info *pi = mts_model_precision(e->cur->model);
        snprintf(o->precision, sizeof o->precision, "%s", pi->effective);
        snprintf(o->precision_requested, sizeof o->precision_requested, "%s", pi->requested);
        snprintf(o->precision_reason, sizeof o->precision_reason, "%s", pi->reason);
        o->guard_error = pi->guard_error;
    }
    (void)s;
}

int64_t mts_server_clock_ns(void)
{
    return mts__now_ns();
}

void mts_server_request_answered(mts_server *s, mts_request *req)
{
    if (!s || !req || req->answered || req->enqueue_ns <= 0 || !req->model) return;
    req->answered = true;
    mts__entry *e = mts__find(s, req->model); /* entries never move or go away */
    if (!e) return;
    int64_t t0 = req->arrival_ns > 0 ? req->arrival_ns : req->enqueue_ns, now = mts__now_ns();
    double sec = now > t0 ? (double)(now - t0) / 1e9 : 0;
    pthread_mutex_lock(&s->lock);
    mts__hist_add(&e->h_request, mts__time_buckets, MTS__HIST_BUCKETS, sec);
    e->request_ns += now > t0 ? (uint64_t)(now - t0) : 0;
    pthread_mutex_unlock(&s->lock);
}

bool mts_server_has_model(const mts_server *s, const char *name)
{
    return mts__find(s, name) != NULL; /* entries never move or go away */
}

int mts_server_model_version(const mts_server *s, const char *name)
{
    const mts__entry *e = mts__find(s, name);
    return e ? (e->cfg->version > 0 ? e->cfg->version : 1) : 0;
}

bool mts_server_version_ok(const mts_server *s, const char *name, const char *requested, char *msg, size_t len)
{
    if (!requested || !requested[0]) return true;
    int v = mts_server_model_version(s, name);
    char have[16];
    snprintf(have, sizeof have, "%d", v);
    if (v > 0 && !strcmp(have, requested)) return true;
    snprintf(msg, len, "model '%s' has no version '%.20s' (it serves version %d)", name, requested, v);
    return false;
}

int mts_server_model_count(const mts_server *s)
{
    return s->n_entries; /* atomic: grows at run time */
}

int mts_server_model_status(mts_server *s, int index, mts_model_status *out)
{
    int rc = MTS_ENOTFOUND;
    pthread_mutex_lock(&s->lock);
    if (index >= 0 && index < s->n_entries && !atomic_load(&s->entries[index].removed)) {
        snapshot(s, &s->entries[index], out); /* removed models are not listed */
        rc = MTS_OK;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int mts_server_model_status_by_name(mts_server *s, const char *name, mts_model_status *out)
{
    pthread_mutex_lock(&s->lock);
    mts__entry *e = mts__find(s, name);
    if (e) snapshot(s, e, out);
    pthread_mutex_unlock(&s->lock);
    return e ? MTS_OK : MTS_ENOTFOUND;
}

int mts_server_device_count(const mts_server *s)
{
    return s->n_devs;
}

void mts_server_device_status(mts_server *s, int id, mts_device_status *out)
{
    memset(out, 0, sizeof *out);
    if (id < 0 || id >= s->n_devs) return;
    pthread_mutex_lock(&s->lock);
    mts__device *d = &s->devs[id];
    out->id = id;
    out->workers = d->workers;
    out->threads = d->cores;
    out->busy_workers = d->busy_workers;
    out->models = d->models;
    out->bytes_used = d->used;
    out->bytes_budget = d->budget;
    for (int i = 0; i < s->n_entries; i++)
        if (s->entries[i].cur && s->entries[i].cur->device == id) out->queue_depth += s->entries[i].qlen;
    pthread_mutex_unlock(&s->lock);
}

void mts_server_totals_get(mts_server *s, mts_server_totals *o)
{
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&s->lock);
    o->submitted = s->submitted;
    o->completed = s->completed;
    o->failed = s->failed;
    o->rejected_full = s->rejected_full;
    o->timed_out = s->timed_out;
    o->cancelled = s->cancelled;
    o->resident_models = s->resident;
    o->queue_depth = s->total_queued;
    for (int d = 0; d < s->n_devs; d++) o->resident_bytes += s->devs[d].used;
    o->shutting_down = s->stopping;
    pthread_mutex_unlock(&s->lock);
    o->uptime_s = (double)(mts__now_ns() - s->start_ns) / 1e9;
}

/* ---- Prometheus text format ---- */

typedef struct out_buf {
    char *p;
    size_t len, cap;
    bool oom;
} out_buf;

static void outf(out_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(out_buf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1024;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

static void hist_out(out_buf *b, const char *name, const char *model, const mts__hist *h, const double *bounds, int nb)
{
    uint64_t cum = 0;
    for (int i = 0; i < nb; i++) {
        cum += h->counts[i];
        outf(b, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", name, model, bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[nb];
    outf(b, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n", name, model, (unsigned long long)cum);
    outf(b, "%s_sum{model=\"%s\"} %.9g\n%s_count{model=\"%s\"} %llu\n", name, model, h->sum, name, model,
         (unsigned long long)h->n);
}

/* A worker's metric label: its index, or "short" for the device's short-work lane. */
static const char *worker_label(const mts_server *s, int d, int w, char *buf, size_t len)
{
    if (w == s->devs[d].workers) snprintf(buf, len, "short");
    else snprintf(buf, len, "%d", w);
    return buf;
}

/* Triton's metric names (its docs/metrics.md), per model with labels model and version, so that
 * Triton dashboards work unchanged. Durations are cumulative microseconds per request; a
 * request's failure counts errors, timeouts, cancellations and queue-full rejections. The GPU
 * memory gauges report each CPU device's budget and use, labelled gpu_uuid="cpu:N". Lock held. */
static void triton_metrics(out_buf *b, const mts_server *s)
{
    static const char *names[][2] = {
        {"nv_inference_request_success", "Requests answered with a result."},
        {"nv_inference_request_failure", "Requests that failed (errors, timeouts, cancellations, full queues)."},
        {"nv_inference_count", "Samples inferred (a request counts its batch size)."},
        {"nv_inference_exec_count", "Batches executed."},
        {"nv_inference_request_duration_us", "End-to-end time of answered requests, summed (microseconds)."},
        {"nv_inference_queue_duration_us", "Time requests spent queued, load waits included, summed (microseconds)."},
        {"nv_inference_compute_input_duration_us", "Batch input gathering time, per request, summed (microseconds)."},
        {"nv_inference_compute_infer_duration_us", "Engine time, per request, summed (microseconds)."},
        {"nv_inference_compute_output_duration_us", "Output copying time, per request, summed (microseconds)."},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        outf(b, "# HELP %s %s\n# TYPE %s counter\n", names[k][0], names[k][1], names[k][0]);
        for (int i = 0; i < s->n_entries; i++) {
            const mts__entry *e = &s->entries[i];
            uint64_t v[] = {e->success.count,
                            e->fail.count + e->n_timeout + e->n_cancelled + e->n_rejected,
                            e->inference_count,
                            e->execution_count,
                            e->request_ns / 1000,
                            e->queue.ns / 1000,
                            e->req_input_ns / 1000,
                            e->req_infer_ns / 1000,
                            e->req_output_ns / 1000};
            outf(b, "%s{model=\"%s\",version=\"%d\"} %llu\n", names[k][0], e->cfg->name,
                 e->cfg->version > 0 ? e->cfg->version : 1, (unsigned long long)v[k]);
        }
    }
    outf(b, "# HELP nv_inference_pending_request_count Requests queued now.\n"
            "# TYPE nv_inference_pending_request_count gauge\n");
    for (int i = 0; i < s->n_entries; i++)
        outf(b, "nv_inference_pending_request_count{model=\"%s\",version=\"%d\"} %d\n", s->entries[i].cfg->name,
             s->entries[i].cfg->version > 0 ? s->entries[i].cfg->version : 1, s->entries[i].qlen);
    outf(b, "# HELP nv_gpu_memory_total_bytes Memory budget of each device (CPU partitions), bytes.\n"
            "# TYPE nv_gpu_memory_total_bytes gauge\n");
    for (int d = 0; d < s->n_devs; d++)
        outf(b, "nv_gpu_memory_total_bytes{gpu_uuid=\"cpu:%d\"} %lld\n", d, (long long)s->devs[d].budget);
    outf(b, "# HELP nv_gpu_memory_used_bytes Bytes used on each device (CPU partitions).\n"
            "# TYPE nv_gpu_memory_used_bytes gauge\n");
    for (int d = 0; d < s->n_devs; d++)
        outf(b, "nv_gpu_memory_used_bytes{gpu_uuid=\"cpu:%d\"} %lld\n", d, (long long)s->devs[d].used);
}

char *mts_server_metrics(mts_server *s, size_t *len)
{
    out_buf b = {malloc(65536), 0, 65536, false};
    if (!b.p) return NULL;
    pthread_mutex_lock(&s->lock);
    outf(&b, "# HELP mts_requests_total Inference requests by model and outcome.\n# TYPE mts_requests_total counter\n");
    for (int i = 0; i < s->n_entries; i++) {
        const mts__entry *e = &s->entries[i];
        const char *m = e->cfg->name;
        outf(&b,
             "mts_requests_total{model=\"%s\",outcome=\"success\"} %llu\n"
             "mts_requests_total{model=\"%s\",outcome=\"error\"} %llu\n"
             "mts_requests_total{model=\"%s\",outcome=\"timeout\"} %llu\n"
             "mts_requests_total{model=\"%s\",outcome=\"cancelled\"} %llu\n"
             "mts_requests_total{model=\"%s\",outcome=\"rejected\"} %llu\n",
             m, (unsigned long long)e->success.count, m, (unsigned long long)e->fail.count, m,
             (unsigned long long)e->n_timeout, m, (unsigned long long)e->n_cancelled, m,
             (unsigned long long)e->n_rejected);
    }
    outf(&b, "# HELP mts_request_duration_seconds End-to-end time of answered requests: arrival at the front end "
             "to the answer handed back (results and errors).\n# TYPE mts_request_duration_seconds histogram\n");
    for (int i = 0; i < s->n_entries; i++)
        hist_out(&b, "mts_request_duration_seconds", s->entries[i].cfg->name, &s->entries[i].h_request,
                 mts__time_buckets, MTS__HIST_BUCKETS);
    outf(&b, "# HELP mts_queue_duration_seconds Time from arrival to the start of the batch (includes load waits).\n"
             "# TYPE mts_queue_duration_seconds histogram\n");
    for (int i = 0; i < s->n_entries; i++)
        hist_out(&b, "mts_queue_duration_seconds", s->entries[i].cfg->name, &s->entries[i].h_queue, mts__time_buckets,
                 MTS__HIST_BUCKETS);
    outf(&b, "# HELP mts_compute_duration_seconds Engine time per batch.\n# TYPE mts_compute_duration_seconds histogram\n");
    for (int i = 0; i < s->n_entries; i++)
        hist_out(&b, "mts_compute_duration_seconds", s->entries[i].cfg->name, &s->entries[i].h_compute,
                 mts__time_buckets, MTS__HIST_BUCKETS);
    outf(&b, "# HELP mts_batch_size Samples per executed batch.\n# TYPE mts_batch_size histogram\n");
    for (int i = 0; i < s->n_entries; i++)
        hist_out(&b, "mts_batch_size", s->entries[i].cfg->name, &s->entries[i].h_batch, mts__batch_buckets,
                 MTS__BATCH_BUCKETS);
    outf(&b, "# HELP mts_model_load_duration_seconds Model load time.\n# TYPE mts_model_load_duration_seconds histogram\n");
    for (int i = 0; i < s->n_entries; i++)
        hist_out(&b, "mts_model_load_duration_seconds", s->entries[i].cfg->name, &s->entries[i].h_load,
                 mts__time_buckets, MTS__HIST_BUCKETS);
    outf(&b, "# HELP mts_queue_depth Requests waiting per model.\n# TYPE mts_queue_depth gauge\n");
    for (int i = 0; i < s->n_entries; i++)
        outf(&b, "mts_queue_depth{model=\"%s\"} %d\n", s->entries[i].cfg->name, s->entries[i].qlen);
    outf(&b, "# HELP mts_model_loads_total Loads by outcome.\n# TYPE mts_model_loads_total counter\n");
    for (int i = 0; i < s->n_entries; i++)
        outf(&b, "mts_model_loads_total{model=\"%s\",outcome=\"success\"} %llu\nmts_model_loads_total{model=\"%s\",outcome=\"failure\"} %llu\n",
             s->entries[i].cfg->name, (unsigned long long)s->entries[i].loads, s->entries[i].cfg->name,
             (unsigned long long)s->entries[i].load_failures);
    outf(&b, "# HELP mts_model_unloads_total Unloads (explicit, idle or evicted).\n# TYPE mts_model_unloads_total counter\n");
    for (int i = 0; i < s->n_entries; i++)
        outf(&b, "mts_model_unloads_total{model=\"%s\"} %llu\n", s->entries[i].cfg->name,
             (unsigned long long)s->entries[i].unloads);
    outf(&b, "# HELP mts_model_evictions_total Evictions by policy (memory, max_models, idle timeout).\n"
             "# TYPE mts_model_evictions_total counter\n");
    for (int i = 0; i < s->n_entries; i++)
        outf(&b, "mts_model_evictions_total{model=\"%s\"} %llu\n", s->entries[i].cfg->name,
             (unsigned long long)s->entries[i].evictions);
    outf(&b, "# HELP mts_batches_memory_capped_total Batches cut below max_batch to fit the device's free memory.\n"
             "# TYPE mts_batches_memory_capped_total counter\n");
    for (int i = 0; i < s->n_entries; i++)
        outf(&b, "mts_batches_memory_capped_total{model=\"%s\"} %llu\n", s->entries[i].cfg->name,
             (unsigned long long)s->entries[i].mem_capped);
    outf(&b, "# HELP mts_batches_preempting_total Batches run between two steps of another model's long batch "
             "(MTS_PREEMPT=1).\n# TYPE mts_batches_preempting_total counter\n");
    for (int i = 0; i < s->n_entries; i++)
        outf(&b, "mts_batches_preempting_total{model=\"%s\"} %llu\n", s->entries[i].cfg->name,
             (unsigned long long)s->entries[i].n_preempt);
    outf(&b, "# HELP mts_model_memory_bytes Bytes held by the resident model.\n# TYPE mts_model_memory_bytes gauge\n");
    for (int i = 0; i < s->n_entries; i++) {
        const mts__entry *e = &s->entries[i];
        outf(&b, "mts_model_memory_bytes{model=\"%s\"} %lld\n", e->cfg->name,
             (long long)(e->cur ? e->cur->base_bytes + e->cur->ctx_bytes : 0));
    }
    outf(&b, "# HELP mts_model_cost_per_sample_seconds The scheduler's estimate of a sample's engine CPU "
             "time (what fair sharing charges and the short-work lane goes by).\n"
             "# TYPE mts_model_cost_per_sample_seconds gauge\n");
    for (int i = 0; i < s->n_entries; i++)
        if (s->entries[i].cost_per_sample > 0)
            outf(&b, "mts_model_cost_per_sample_seconds{model=\"%s\"} %.9g\n", s->entries[i].cfg->name,
                 s->entries[i].cost_per_sample / 1e9);
    outf(&b, "# HELP mts_model_precision Arithmetic of the resident model (1 per model: precision, requested, "
             "reason).\n# TYPE mts_model_precision gauge\n");
    for (int i = 0; i < s->n_entries; i++) {
        const mts__entry *e = &s->entries[i];
        if (!e->cur) continue;
        const mts_precision_info *pi = mts_model_precision(e->cur->model);
        char reason[160];
        size_t k = 0;
        for (const char *q = pi->reason; *q && k + 1 < sizeof reason; q++) /* label value: no quotes, backslashes */
            reason[k++] = *q == '"' || *q == '\\' || *q == '\n' ? '\'' : *q;
        reason[k] = 0;
        outf(&b, "mts_model_precision{model=\"%s\",precision=\"%s\",requested=\"%s\",reason=\"%s\"} 1\n",
             e->cfg->name, pi->effective, pi->requested, reason);
    }
    outf(&b, "# HELP mts_model_precision_guard_error Relative L2 error of bf16 against fp32 measured at load.\n"
             "# TYPE mts_model_precision_guard_error gauge\n");
    for (int i = 0; i < s->n_entries; i++) {
        const mts__entry *e = &s->entries[i];
        if (!e->cur || mts_model_precision(e->cur->model)->guard_error < 0) continue;
        outf(&b, "mts_model_precision_guard_error{model=\"%s\"} %.6g\n", e->cfg->name,
             mts_model_precision(e->cur->model)->guard_error);
    }
    /* Background frame caches of lip-sync models (resident versions with assets). */
    static const char *bg_names[][2] = {
        {"mts_bgcache_requests_total", "Background frame lookups by composites."},
        {"mts_bgcache_hits_total", "Lookups that found the frame decoded."},
        {"mts_bgcache_misses_total", "Lookups that decoded the frame."},
        {"mts_bgcache_evictions_total", "Decoded frames evicted (LRU)."},
        {"mts_bgcache_preloads_total", "Frames decoded ahead of use."},
        {"mts_bgcache_load_errors_total", "Frame decodes that failed."},
        {"mts_bgcache_jpeg_spliced_total", "JPEG frames encoded by re-encoding only the crop rectangle's restart intervals."},
        {"mts_bgcache_jpeg_full_total", "JPEG frames encoded whole (the background's encoding was not ready)."},
        {"mts_bgcache_hit_rate", "Hits / lookups since the model loaded."},
        {"mts_bgcache_load_avg_ms", "Average PNG decode time per frame (ms)."},
        {"mts_bgcache_frames", "Frames decoded now."},
        {"mts_bgcache_bytes", "Bytes of decoded frames and their JPEG encodings held now."},
        {"mts_bgcache_capacity_bytes", "Bytes reserved in the model's budget for the cache."},
    };
    for (size_t k = 0; k < sizeof bg_names / sizeof bg_names[0]; k++) {
        bool counter = strstr(bg_names[k][0], "_total") != NULL;
        outf(&b, "# HELP %s %s\n# TYPE %s %s\n", bg_names[k][0], bg_names[k][1], bg_names[k][0],
             counter ? "counter" : "gauge");
        for (int i = 0; i < s->n_entries; i++) {
            const mts__entry *e = &s->entries[i];
            if (!e->cur || !e->cur->bg) continue;
            mts_bgcache_stats st;
            mts_bgcache_stats_get(e->cur->bg, &st);
            double v[] = {(double)st.requests, (double)st.hits, (double)st.misses, (double)st.evictions,
                          (double)st.preloads, (double)st.load_errors, (double)st.jpeg_spliced,
                          (double)st.jpeg_full, st.hit_rate, st.avg_load_ms,
                          (double)st.frames_cached, (double)st.bytes, (double)st.capacity_bytes};
            outf(&b, "%s{model=\"%s\"} %.9g\n", bg_names[k][0], e->cfg->name, v[k]);
        }
    }
    outf(&b, "# HELP mts_device_resident_models Models resident per device.\n# TYPE mts_device_resident_models gauge\n");
    for (int d = 0; d < s->n_devs; d++) outf(&b, "mts_device_resident_models{device=\"cpu:%d\"} %d\n", d, s->devs[d].models);
    outf(&b, "# HELP mts_device_memory_bytes Bytes used per device.\n# TYPE mts_device_memory_bytes gauge\n");
    for (int d = 0; d < s->n_devs; d++)
        outf(&b, "mts_device_memory_bytes{device=\"cpu:%d\"} %lld\n", d, (long long)s->devs[d].used);
    outf(&b, "# HELP mts_device_memory_budget_bytes Memory budget per device.\n# TYPE mts_device_memory_budget_bytes gauge\n");
    for (int d = 0; d < s->n_devs; d++)
        outf(&b, "mts_device_memory_budget_bytes{device=\"cpu:%d\"} %lld\n", d, (long long)s->devs[d].budget);
    char wl[16];
    outf(&b, "# HELP mts_worker_busy_seconds_total Time each worker spent running batches.\n"
             "# TYPE mts_worker_busy_seconds_total counter\n");
    for (int d = 0; d < s->n_devs; d++)
        for (int w = 0; w <= s->devs[d].workers; w++)
            outf(&b, "mts_worker_busy_seconds_total{device=\"cpu:%d\",worker=\"%s\"} %.6f\n", d,
                 worker_label(s, d, w, wl, sizeof wl), (double)s->devs[d].w_busy_ns[w] / 1e9);
    outf(&b, "# HELP mts_worker_batches_total Batches each worker ran.\n# TYPE mts_worker_batches_total counter\n");
    for (int d = 0; d < s->n_devs; d++)
        for (int w = 0; w <= s->devs[d].workers; w++)
            outf(&b, "mts_worker_batches_total{device=\"cpu:%d\",worker=\"%s\"} %llu\n", d,
                 worker_label(s, d, w, wl, sizeof wl), (unsigned long long)s->devs[d].w_batches[w]);
    outf(&b, "# HELP mts_inline_batches_total Short-work batches run by the front-end thread that read "
             "the request (also counted under worker=\"short\").\n# TYPE mts_inline_batches_total counter\n");
    for (int d = 0; d < s->n_devs; d++)
        outf(&b, "mts_inline_batches_total{device=\"cpu:%d\"} %llu\n", d, (unsigned long long)s->devs[d].inline_batches);
    outf(&b, "# HELP mts_resident_models Models resident (loading, ready or draining).\n# TYPE mts_resident_models gauge\n"
             "mts_resident_models %d\n",
         s->resident);
    outf(&b, "# HELP mts_queue_depth_total Requests waiting in all queues.\n# TYPE mts_queue_depth_total gauge\n"
             "mts_queue_depth_total %d\n",
         s->total_queued);
    triton_metrics(&b, s);
    pthread_mutex_unlock(&s->lock);
    unsigned long long io_reused, io_mapped;
    mts_iobuf_counts(&io_reused, &io_mapped);
    outf(&b, "# HELP mts_io_buffer_cached_bytes Freed request/response buffers kept for reuse.\n"
             "# TYPE mts_io_buffer_cached_bytes gauge\nmts_io_buffer_cached_bytes %zu\n"
             "# HELP mts_io_buffers_total Large request/response buffers by source (reused from the cache or "
             "newly mapped).\n# TYPE mts_io_buffers_total counter\nmts_io_buffers_total{source=\"reused\"} %llu\n"
             "mts_io_buffers_total{source=\"mapped\"} %llu\n",
         mts_iobuf_cached_bytes(), io_reused, io_mapped);
    outf(&b, "# HELP mts_uptime_seconds Seconds since start.\n# TYPE mts_uptime_seconds gauge\nmts_uptime_seconds %.3f\n",
         (double)(mts__now_ns() - s->start_ns) / 1e9);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}
