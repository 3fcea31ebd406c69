/*
 * Dashboard state: the server-side half of the live dashboard (GET /dashboard polls
 * GET /api/v1/dashboard/state, src/api/dashboard_http.c). Two pieces of bookkeeping, both fixed
 * in size, allocation-free and updated under server->lock by the scheduler and the registry:
 *
 *   - per model, a ring of MTS__WIN_SECONDS per-second buckets (requests answered and failed,
 *     request latency and batch-size histograms, samples and engine time). A bucket is reused
 *     when its second comes round again, so a window sum only counts buckets whose second lies
 *     inside the window. Latency percentiles are read from the summed histogram, interpolated
 *     linearly inside the bucket that holds the rank (the bucket bounds are the Prometheus
 *     ones, mts__time_buckets);
 *   - a ring of the last MTS__EVENTS residency events with wall time, model, device and reason.
 *
 * mts_server_dashboard_json turns that plus the model, device and server snapshots into the
 * JSON document the page renders, including the conversational-user capacity estimate of
 * lip-sync models (users = frames/s x 15/4 / 25; see docs/server.md, "Dashboard").
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/internal.h"
#include "util/json.h"

#define NS_PER_S 1000000000LL

static mts__win_bucket *bucket(mts__entry *e, int64_t now_ns)
{
    int64_t sec = now_ns / NS_PER_S + 1; /* + 1: second 0 is the empty marker */
    mts__win_bucket *b = &e->win[sec % MTS__WIN_SECONDS];
    if (b->sec != sec) {
        memset(b, 0, sizeof *b);
        b->sec = sec;
    }
    return b;
}

static int hist_index(const double *bounds, int nb, double v)
{
    int i = 0;
    while (i < nb && v > bounds[i]) i++;
    return i;
}

void mts__win_request(mts__entry *e, int64_t now_ns, bool ok, double latency_ms)
{
    mts__win_bucket *b = bucket(e, now_ns);
    if (ok) b->ok++;
    else b->err++;
    b->lat[hist_index(mts__time_buckets, MTS__HIST_BUCKETS, latency_ms / 1e3)]++;
}

void mts__win_error(mts__entry *e, int64_t now_ns)
{
    bucket(e, now_ns)->err++;
}

void mts__win_batch(mts__entry *e, int64_t now_ns, int64_t samples, double infer_ms)
{
    mts__win_bucket *b = bucket(e, now_ns);
    b->batches++;
    b->samples += (uint32_t)samples;
    b->bsz[hist_index(mts__batch_buckets, MTS__BATCH_BUCKETS, (double)samples)]++;
    b->infer_ms += (float)infer_ms;
}

void mts__event_add(mts_server *s, const char *kind, const mts__entry *e, int device, const char *fmt, ...)
{
    mts__event *ev = &s->events[s->event_seq % MTS__EVENTS];
    ev->seq = ++s->event_seq;
    ev->wall_ms = mts__wall_ms();
    ev->kind = kind;
    ev->device = device;
    snprintf(ev->model, sizeof ev->model, "%s", e ? e->cfg->name : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ev->reason, sizeof ev->reason, fmt, ap);
    va_end(ap);
}

/* ---- the state document ---- */

/* Window sums of one model over the last `span` seconds (the current, partial second included). */
typedef struct win_sum {
    uint64_t ok, err, batches, samples;
    uint64_t lat[MTS__HIST_BUCKETS + 1];
    uint64_t bsz[MTS__BATCH_BUCKETS + 1];
    double infer_ms;
} win_sum;

static void win_add(win_sum *w, const mts__win_bucket *b)
{
    w->ok += b->ok;
    w->err += b->err;
    w->batches += b->batches;
    w->samples += b->samples;
    for (int i = 0; i <= MTS__HIST_BUCKETS; i++) w->lat[i] += b->lat[i];
    for (int i = 0; i <= MTS__BATCH_BUCKETS; i++) w->bsz[i] += b->bsz[i];
    w->infer_ms += b->infer_ms;
}

/* The q-quantile (0..1) in ms of a latency histogram; -1 when empty. The rank's bucket is
 * interpolated linearly between its bounds (the first from 0; the +Inf one reports its lower
 * bound). */
static double quantile_ms(const uint64_t *h, double q)
{
    uint64_t n = 0;
    for (int i = 0; i <= MTS__HIST_BUCKETS; i++) n += h[i];
    if (n == 0) return -1;
    double rank = q * (double)n, cum = 0;
    for (int i = 0; i <= MTS__HIST_BUCKETS; i++) {
        if (h[i] == 0) continue;
        if (cum + (double)h[i] >= rank) {
            double lo = i == 0 ? 0 : mts__time_buckets[i - 1];
            if (i == MTS__HIST_BUCKETS) return lo * 1e3;
            double hi = mts__time_buckets[i];
            double f = ((rank - cum) / (double)h[i]);
            return (lo + (hi - lo) * f) * 1e3;
        }
        cum += (double)h[i];
    }
    return mts__time_buckets[MTS__HIST_BUCKETS - 1] * 1e3;
}

#define SERIES_S 60   /* per-second series for the sparklines */
#define RATE_S 10     /* "now" rates */
#define THROUGHPUT_S 60

typedef struct model_win {
    win_sum rate, minute, all; /* last RATE_S, THROUGHPUT_S and MTS__WIN_SECONDS seconds */
    uint32_t series_ok[SERIES_S], series_err[SERIES_S]; /* oldest first */
} model_win;

static void collect(mts__entry *e, int64_t now_ns, model_win *m)
{
    memset(m, 0, sizeof *m);
    int64_t sec = now_ns / NS_PER_S + 1;
    for (int k = 0; k < MTS__WIN_SECONDS; k++) {
        const mts__win_bucket *b = &e->win[k];
        if (b->sec == 0 || b->sec > sec || b->sec <= sec - MTS__WIN_SECONDS) continue;
        int64_t age = sec - b->sec; /* 0 = the current second */
        win_add(&m->all, b);
        if (age < THROUGHPUT_S) win_add(&m->minute, b);
        if (age < RATE_S) win_add(&m->rate, b);
        if (age < SERIES_S) {
            m->series_ok[SERIES_S - 1 - age] = b->ok;
            m->series_err[SERIES_S - 1 - age] = b->err;
        }
    }
}

static void jw_kv_int(mts_jw *w, const char *k, int64_t v)
{
    mts_jw_key(w, k);
    mts_jw_int(w, v);
}

static void jw_kv_uint(mts_jw *w, const char *k, uint64_t v)
{
    mts_jw_key(w, k);
    mts_jw_uint(w, v);
}

static void jw_kv_num(mts_jw *w, const char *k, double v)
{
    mts_jw_key(w, k);
    mts_jw_double(w, v);
}

static void jw_kv_str(mts_jw *w, const char *k, const char *v)
{
    mts_jw_key(w, k);
    mts_jw_string(w, v);
}

/* A rate over `span` seconds, counting the elapsed part of the current second and never more
 * time than the server has been up. */
static double rate(uint64_t n, double span, double uptime_s)
{
    double t = uptime_s < span ? uptime_s : span;
    return t > 0.5 ? (double)n / t : (double)n / 0.5;
}

static void write_model(mts_jw *w, const mts_model_status *st, const mts_model_config *cfg, const model_win *m,
                        double uptime_s, double *users_total)
{
    mts_jw_begin_object(w);
    jw_kv_str(w, "name", st->name);
    jw_kv_str(w, "state", mts_model_state_name(st->state));
    mts_jw_key(w, "device");
    if (st->device >= 0) {
        char dev[24];
        snprintf(dev, sizeof dev, "cpu:%d", st->device);
        mts_jw_string(w, dev);
    } else {
        mts_jw_null(w);
    }
    /* The resident version's arithmetic (fp32, bf16 or int8) and why; configured when not resident. */
    jw_kv_str(w, "precision", st->precision[0] ? st->precision : cfg && cfg->precision ? cfg->precision : "fp32");
    jw_kv_str(w, "precision_reason", st->precision_reason);
    jw_kv_int(w, "memory_bytes", st->memory_bytes);
    jw_kv_int(w, "queue_depth", st->queue_depth);
    jw_kv_int(w, "running", st->running);
    jw_kv_int(w, "max_batch", st->max_batch);
    mts_jw_key(w, "pinned");
    mts_jw_bool(w, st->pinned);
    jw_kv_int(w, "version", st->model_version);
    jw_kv_str(w, "reason", st->reason[0] ? st->reason : st->bg_error);
    jw_kv_uint(w, "success_total", st->success.count);
    jw_kv_uint(w, "fail_total", st->fail.count);
    jw_kv_uint(w, "inference_count", st->inference_count);
    jw_kv_uint(w, "loads", st->loads);
    jw_kv_uint(w, "evictions", st->evictions);
    jw_kv_uint(w, "load_failures", st->load_failures);

    mts_jw_key(w, "rates");
    mts_jw_begin_object(w);
    jw_kv_num(w, "requests_per_s", rate(m->rate.ok + m->rate.err, RATE_S, uptime_s));
    jw_kv_num(w, "errors_per_s", rate(m->rate.err, RATE_S, uptime_s));
    jw_kv_num(w, "requests_per_s_1m", rate(m->minute.ok + m->minute.err, THROUGHPUT_S, uptime_s));
    jw_kv_num(w, "errors_per_s_1m", rate(m->minute.err, THROUGHPUT_S, uptime_s));
    jw_kv_num(w, "samples_per_s_1m", rate(m->minute.samples, THROUGHPUT_S, uptime_s));
    mts_jw_end_object(w);

    mts_jw_key(w, "latency_ms");
    mts_jw_begin_object(w);
    jw_kv_int(w, "window_s", MTS__WIN_SECONDS);
    uint64_t n_lat = 0;
    for (int i = 0; i <= MTS__HIST_BUCKETS; i++) n_lat += m->all.lat[i];
    jw_kv_uint(w, "count", n_lat);
    double p50 = quantile_ms(m->all.lat, 0.50), p99 = quantile_ms(m->all.lat, 0.99);
    mts_jw_key(w, "p50");
    if (p50 >= 0) mts_jw_double(w, p50);
    else mts_jw_null(w);
    mts_jw_key(w, "p99");
    if (p99 >= 0) mts_jw_double(w, p99);
    else mts_jw_null(w);
    mts_jw_end_object(w);

    mts_jw_key(w, "batch_sizes");
    mts_jw_begin_object(w);
    jw_kv_int(w, "window_s", MTS__WIN_SECONDS);
    mts_jw_key(w, "le");
    mts_jw_begin_array(w);
    for (int i = 0; i < MTS__BATCH_BUCKETS; i++) mts_jw_double(w, mts__batch_buckets[i]);
    mts_jw_string(w, "+Inf");
    mts_jw_end_array(w);
    mts_jw_key(w, "counts");
    mts_jw_begin_array(w);
    for (int i = 0; i <= MTS__BATCH_BUCKETS; i++) mts_jw_uint(w, m->all.bsz[i]);
    mts_jw_end_array(w);
    mts_jw_end_object(w);

    mts_jw_key(w, "series");
    mts_jw_begin_object(w);
    jw_kv_int(w, "seconds", SERIES_S);
    mts_jw_key(w, "requests");
    mts_jw_begin_array(w);
    for (int i = 0; i < SERIES_S; i++) mts_jw_uint(w, (uint64_t)m->series_ok[i] + m->series_err[i]);
    mts_jw_end_array(w);
    mts_jw_key(w, "errors");
    mts_jw_begin_array(w);
    for (int i = 0; i < SERIES_S; i++) mts_jw_uint(w, m->series_err[i]);
    mts_jw_end_array(w);
    mts_jw_end_object(w);

    mts_jw_key(w, "bgcache");
    if (st->has_bgcache) {
        const mts_bgcache_stats *b = &st->bgcache;
        mts_jw_begin_object(w);
        jw_kv_num(w, "hit_rate", b->hit_rate);
        jw_kv_uint(w, "requests", b->requests);
        jw_kv_uint(w, "hits", b->hits);
        jw_kv_uint(w, "misses", b->misses);
        jw_kv_uint(w, "evictions", b->evictions);
        jw_kv_uint(w, "frames_cached", (uint64_t)b->frames_cached);
        jw_kv_uint(w, "bytes", (uint64_t)b->bytes);
        jw_kv_uint(w, "capacity_bytes", (uint64_t)b->capacity_bytes);
        mts_jw_end_object(w);
    } else {
        mts_jw_null(w);
    }

    /* Conversational-user capacity of a lip-sync model (one with background_dir): frames/s
     * from the engine time per frame over the last minute, else over its lifetime, else its
     * measured throughput; users = fps x 15/4 / 25. */
    mts_jw_key(w, "lipsync");
    if (cfg->background_dir) {
        double ms_per_frame = -1, fps = -1;
        const char *source = "none";
        if (m->minute.samples > 0 && m->minute.infer_ms > 0) {
            ms_per_frame = m->minute.infer_ms / (double)m->minute.samples;
            source = "inference time per frame, last minute";
        } else if (st->inference_count > 0 && st->total_inference_ms > 0) {
            ms_per_frame = st->total_inference_ms / (double)st->inference_count;
            source = "inference time per frame, since start";
        }
        double throughput = rate(m->minute.samples, THROUGHPUT_S, uptime_s);
        if (ms_per_frame > 0) fps = 1000.0 / ms_per_frame;
        else if (throughput > 0) {
            fps = throughput;
            source = "throughput, last minute";
        }
        mts_jw_begin_object(w);
        jw_kv_num(w, "throughput_fps", throughput);
        mts_jw_key(w, "ms_per_frame");
        if (ms_per_frame > 0) mts_jw_double(w, ms_per_frame);
        else mts_jw_null(w);
        mts_jw_key(w, "fps");
        if (fps > 0) mts_jw_double(w, fps);
        else mts_jw_null(w);
        jw_kv_str(w, "fps_source", source);
        mts_jw_key(w, "users");
        if (fps > 0) {
            double users = fps * 15.0 / 4.0 / 25.0;
            mts_jw_double(w, users);
            *users_total += users;
        } else {
            mts_jw_null(w);
        }
        mts_jw_end_object(w);
    } else {
        mts_jw_null(w);
    }
    mts_jw_end_object(w);
}

char *mts_server_dashboard_json(mts_server *s, size_t *len)
{
    mts_model_status *st = malloc(sizeof *st);
    model_win *m = malloc(sizeof *m);
    if (!st || !m) {
        free(st);
        free(m);
        return NULL;
    }
    mts_server_totals tot;
    mts_server_totals_get(s, &tot);
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    jw_kv_int(&w, "now_ms", mts__wall_ms());
    mts_jw_key(&w, "server");
    mts_jw_begin_object(&w);
    jw_kv_num(&w, "uptime_s", tot.uptime_s);
    jw_kv_uint(&w, "submitted", tot.submitted);
    jw_kv_uint(&w, "completed", tot.completed);
    jw_kv_uint(&w, "failed", tot.failed);
    jw_kv_uint(&w, "rejected_full", tot.rejected_full);
    jw_kv_uint(&w, "timed_out", tot.timed_out);
    jw_kv_int(&w, "queue_depth", tot.queue_depth);
    jw_kv_int(&w, "resident_models", tot.resident_models);
    jw_kv_int(&w, "resident_bytes", tot.resident_bytes);
    mts_jw_key(&w, "shutting_down");
    mts_jw_bool(&w, tot.shutting_down);
    jw_kv_int(&w, "window_s", MTS__WIN_SECONDS);
    jw_kv_int(&w, "rate_window_s", RATE_S);
    mts_jw_end_object(&w);

    mts_jw_key(&w, "devices");
    mts_jw_begin_array(&w);
    for (int d = 0; d < mts_server_device_count(s); d++) {
        mts_device_status ds;
        mts_server_device_status(s, d, &ds);
        char name[24];
        snprintf(name, sizeof name, "cpu:%d", d);
        mts_jw_begin_object(&w);
        jw_kv_str(&w, "name", name);
        jw_kv_int(&w, "budget_bytes", ds.bytes_budget);
        jw_kv_int(&w, "used_bytes", ds.bytes_used);
        jw_kv_int(&w, "models", ds.models);
        jw_kv_int(&w, "workers", ds.workers);
        jw_kv_int(&w, "busy_workers", ds.busy_workers);
        jw_kv_int(&w, "threads", ds.threads);
        jw_kv_int(&w, "queue_depth", ds.queue_depth);
        mts_jw_end_object(&w);
    }
    mts_jw_end_array(&w);

    double users_total = 0;
    mts_jw_key(&w, "models");
    mts_jw_begin_array(&w);
    for (int i = 0; i < s->n_entries; i++) {
        if (mts_server_model_status(s, i, st)) continue;
        pthread_mutex_lock(&s->lock);
        collect(&s->entries[i], mts__now_ns(), m);
        pthread_mutex_unlock(&s->lock);
        write_model(&w, st, s->entries[i].cfg, m, tot.uptime_s, &users_total);
    }
    mts_jw_end_array(&w);

    mts_jw_key(&w, "capacity");
    mts_jw_begin_object(&w);
    jw_kv_str(&w, "formula", "users = frames/s x 15/4 / 25");
    jw_kv_num(&w, "users", users_total);
    mts_jw_end_object(&w);

    /* Newest first; copied under the lock into the writer (the strings are short). */
    mts_jw_key(&w, "events");
    mts_jw_begin_array(&w);
    pthread_mutex_lock(&s->lock);
    uint64_t last = s->event_seq;
    uint64_t first = last > MTS__EVENTS ? last - MTS__EVENTS + 1 : 1;
    for (uint64_t q = last; q >= first && q > 0; q--) {
        const mts__event *ev = &s->events[(q - 1) % MTS__EVENTS];
        mts_jw_begin_object(&w);
        jw_kv_uint(&w, "seq", ev->seq);
        jw_kv_int(&w, "time_ms", ev->wall_ms);
        jw_kv_str(&w, "kind", ev->kind);
        jw_kv_str(&w, "model", ev->model);
        mts_jw_key(&w, "device");
        if (ev->device >= 0) {
            char dev[24];
            snprintf(dev, sizeof dev, "cpu:%d", ev->device);
            mts_jw_string(&w, dev);
        } else {
            mts_jw_null(&w);
        }
        jw_kv_str(&w, "reason", ev->reason);
        mts_jw_end_object(&w);
    }
    pthread_mutex_unlock(&s->lock);
    mts_jw_end_array(&w);
    mts_jw_end_object(&w);
    free(st);
    free(m);
    char *out = mts_jw_take(&w, len);
    mts_jw_free(&w);
    return out;
}
