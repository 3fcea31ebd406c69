/*
 * `mtserve bench`: the results of a run, as text on stdout (throughput, latency quantiles,
 * errors by code, the connection pool, residency, per-model rows sorted by requests) and as
 * members of the --json object (the same figures, every model, and the server's statistics).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/bench_internal.h"

/* ---- reporting ------------------------------------------------------------------------- */

static double run_window_s(const bench_run *r)
{
    double end;
    if (r->mode == MODE_CLOSED || !isfinite(r->t_end)) end = r->a.last_done;
    else end = r->t_end;
    double w = (end - r->t_measure) / 1e3;
    return w > 0 ? w : 0;
}

void mts_bench_json_latency(mts_jw *w, const char *key, const mts_bench_hist *h)
{
    mts_jw_key(w, key);
    mts_jw_begin_object(w);
    mts_jw_key(w, "count");
    mts_jw_uint(w, h->count);
    static const struct {
        const char *k;
        double q;
    } qs[] = {{"p50", 0.5}, {"p90", 0.9}, {"p99", 0.99}, {"p999", 0.999}};
    mts_jw_key(w, "mean");
    mts_jw_double(w, mts_bench_hist_mean(h) / 1e3);
    mts_jw_key(w, "min");
    mts_jw_double(w, h->count ? (double)h->min_us / 1e3 : 0);
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
        mts_jw_key(w, qs[i].k);
        mts_jw_double(w, mts_bench_hist_quantile(h, qs[i].q) / 1e3);
    }
    mts_jw_key(w, "max");
    mts_jw_double(w, (double)h->max_us / 1e3);
    mts_jw_end_object(w);
}

void mts_bench_json_codes(mts_jw *w, const mts_bench_codes *c)
{
    mts_jw_key(w, "errors_by_code");
    mts_jw_begin_object(w);
    for (int i = 0; i < c->n; i++) {
        mts_jw_key(w, c->e[i].key);
        mts_jw_uint(w, c->e[i].count);
    }
    mts_jw_end_object(w);
    mts_jw_key(w, "error_messages");
    mts_jw_begin_object(w);
    for (int i = 0; i < c->n; i++) {
        mts_jw_key(w, c->e[i].key);
        mts_jw_string(w, c->e[i].msg);
    }
    mts_jw_end_object(w);
}

void mts_bench_json_frames(mts_jw *w, const bench_run *r, int users)
{
    const bench_agg *a = &r->a;
    mts_jw_key(w, "users");
    mts_jw_int(w, users);
    mts_jw_key(w, "frames");
    mts_jw_uint(w, a->frames);
    mts_jw_key(w, "on_time");
    mts_jw_uint(w, a->on_time);
    mts_jw_key(w, "late");
    mts_jw_uint(w, a->late);
    mts_jw_key(w, "failed");
    mts_jw_uint(w, a->failed);
    mts_jw_key(w, "on_time_ratio");
    mts_jw_double(w, a->frames ? (double)a->on_time / (double)a->frames : 0);
}

void mts_bench_json_run(mts_jw *w, const bench_run *r, const bench_model *models)
{
    const bench_opts *o = r->o;
    const bench_agg *a = &r->a;
    double win = run_window_s(r);
    mts_jw_key(w, "duration_s");
    mts_jw_double(w, win);
    mts_jw_key(w, "requests");
    mts_jw_uint(w, a->requests);
    mts_jw_key(w, "ok");
    mts_jw_uint(w, a->ok);
    mts_jw_key(w, "errors");
    mts_jw_uint(w, a->errors);
    mts_bench_json_codes(w, &a->codes);
    mts_jw_key(w, "throughput_rps");
    mts_jw_double(w, win > 0 ? (double)a->ok / win : 0);
    mts_jw_key(w, "samples_per_s");
    mts_jw_double(w, win > 0 ? (double)a->ok * (double)o->batch / win : 0);
    mts_bench_json_latency(w, "latency_ms", &a->lat);
    if (a->lat_sent.count) mts_bench_json_latency(w, "latency_from_send_ms", &a->lat_sent);
    /* the load generator's own CPU (all its threads, warm-up included) per request it sent:
     * what a client on the server's cores takes from it */
    mts_jw_key(w, "client_cpu_ms");
    mts_jw_double(w, r->cpu_ms);
    mts_jw_key(w, "client_cpu_ms_per_request");
    mts_jw_double(w, r->done_all ? r->cpu_ms / (double)r->done_all : 0);
    if (a->server_queue.count) mts_bench_json_latency(w, "server_queue_ms", &a->server_queue);
    if (a->server_compute.count) mts_bench_json_latency(w, "server_compute_ms", &a->server_compute);
    if (o->lipsync) {
        mts_jw_key(w, "lipsync");
        mts_jw_begin_object(w);
        mts_jw_key(w, "rpc");
        mts_jw_string(w, o->composite ? "composite" : "infer");
        if (o->composite) {
            mts_jw_key(w, "format");
            mts_jw_string(w, o->format);
            mts_jw_key(w, "avatar_frames");
            mts_jw_int(w, r->avatar_frames);
        }
        mts_jw_key(w, "frames_per_request");
        mts_jw_int(w, o->frames_per_request);
        mts_jw_key(w, "frames_received");
        mts_jw_uint(w, a->resp_frames);
        mts_jw_key(w, "frames_per_s");
        mts_jw_double(w, win > 0 ? (double)a->resp_frames / win : 0);
        mts_jw_key(w, "bytes_per_frame");
        mts_jw_double(w, a->resp_frames ? (double)a->resp_bytes / (double)a->resp_frames : 0);
        if (a->server_composite.count) mts_bench_json_latency(w, "server_composite_ms", &a->server_composite);
        if (a->server_encode.count) mts_bench_json_latency(w, "server_encode_ms", &a->server_encode);
        if (a->server_background.count) mts_bench_json_latency(w, "server_background_ms", &a->server_background);
        mts_jw_end_object(w);
    }
    if (r->mode != MODE_CLOSED) {
        mts_jw_key(w, "pool");
        mts_jw_begin_object(w);
        mts_jw_key(w, "connections");
        mts_jw_int(w, r->n_threads);
        mts_jw_key(w, "max_connections");
        mts_jw_int(w, r->max_threads);
        mts_jw_key(w, "late_starts");
        mts_jw_uint(w, r->late_starts);
        mts_jw_key(w, "max_start_lag_ms");
        mts_jw_double(w, r->max_lag_ms);
        mts_jw_key(w, "exhausted");
        mts_jw_bool(w, r->exhausted > 0);
        mts_jw_key(w, "exhausted_starts");
        mts_jw_uint(w, r->exhausted);
        mts_jw_end_object(w);
    }
    if (o->cold_probe) {
        mts_jw_key(w, "cold");
        mts_jw_begin_object(w);
        mts_jw_key(w, "warm_requests");
        mts_jw_uint(w, a->n_warm);
        mts_jw_key(w, "cold_requests");
        mts_jw_uint(w, a->n_cold);
        mts_jw_key(w, "probe_failed");
        mts_jw_uint(w, a->probe_failed);
        mts_jw_key(w, "hit_rate");
        mts_jw_double(w, a->n_warm + a->n_cold ? (double)a->n_warm / (double)(a->n_warm + a->n_cold) : 0);
        mts_bench_json_latency(w, "latency_warm_ms", &a->lat_warm);
        mts_bench_json_latency(w, "latency_cold_ms", &a->lat_cold);
        mts_jw_end_object(w);
    }
    mts_jw_key(w, "per_model");
    mts_jw_begin_array(w);
    for (int i = 0; i < r->n_models; i++) {
        const model_agg *m = &a->per_model[i];
        mts_jw_begin_object(w);
        mts_jw_key(w, "model");
        mts_jw_string(w, models[i].name);
        mts_jw_key(w, "requests");
        mts_jw_uint(w, m->requests);
        mts_jw_key(w, "ok");
        mts_jw_uint(w, m->ok);
        mts_jw_key(w, "errors");
        mts_jw_uint(w, m->errors);
        if (o->cold_probe) {
            mts_jw_key(w, "cold");
            mts_jw_uint(w, m->cold);
        }
        mts_jw_key(w, "throughput_rps");
        mts_jw_double(w, win > 0 ? (double)m->ok / win : 0);
        if (m->lat) {
            mts_jw_key(w, "p50_ms");
            mts_jw_double(w, mts_bench_hist_quantile(m->lat, 0.5) / 1e3);
            mts_jw_key(w, "p99_ms");
            mts_jw_double(w, mts_bench_hist_quantile(m->lat, 0.99) / 1e3);
            mts_jw_key(w, "max_ms");
            mts_jw_double(w, (double)m->lat->max_us / 1e3);
        }
        mts_jw_end_object(w);
    }
    mts_jw_end_array(w);
}

static void print_latency(const char *label, const mts_bench_hist *h)
{
    printf("%-12s mean %.2f  p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f  max %.2f  (ms, %llu requests)\n", label,
           mts_bench_hist_mean(h) / 1e3, mts_bench_hist_quantile(h, 0.5) / 1e3, mts_bench_hist_quantile(h, 0.9) / 1e3,
           mts_bench_hist_quantile(h, 0.99) / 1e3, mts_bench_hist_quantile(h, 0.999) / 1e3, (double)h->max_us / 1e3,
           (unsigned long long)h->count);
}

static int cmp_rows(const void *x, const void *y, void *ctx)
{
    const model_agg *pm = ctx;
    int a = *(const int *)x, b = *(const int *)y;
    if (pm[a].requests != pm[b].requests) return pm[a].requests < pm[b].requests ? 1 : -1;
    return a - b;
}

void mts_bench_text_run(const bench_run *r, const bench_model *models)
{
    const bench_opts *o = r->o;
    const bench_agg *a = &r->a;
    double win = run_window_s(r);
    printf("requests     %llu in %.2f s (ok %llu, errors %llu)  throughput %.2f req/s, %.2f samples/s\n",
           (unsigned long long)a->requests, win, (unsigned long long)a->ok, (unsigned long long)a->errors,
           win > 0 ? (double)a->ok / win : 0, win > 0 ? (double)a->ok * (double)o->batch / win : 0);
    print_latency("latency", &a->lat);
    if (a->lat_sent.count) print_latency("from send", &a->lat_sent);
    printf("client CPU   %.0f ms, %.2f ms per request (this process, all threads)\n", r->cpu_ms,
           r->done_all ? r->cpu_ms / (double)r->done_all : 0);
    if (a->server_queue.count) print_latency("server queue", &a->server_queue);
    if (a->server_compute.count) print_latency(o->lipsync ? "server infer" : "server comp.", &a->server_compute);
    if (o->lipsync) {
        printf("lip-sync     %s%s, %d frames/request: %llu frames received (%.2f frames/s), %.1f KB per frame\n",
               o->composite ? "composite " : "infer (raw)", o->composite ? o->format : "", o->frames_per_request, (unsigned long long)a->resp_frames,
               win > 0 ? (double)a->resp_frames / win : 0,
               a->resp_frames ? (double)a->resp_bytes / (double)a->resp_frames / 1e3 : 0);
        if (a->server_composite.count) print_latency("  composite", &a->server_composite);
        if (a->server_encode.count) print_latency("  encode", &a->server_encode);
        if (a->server_background.count) print_latency("  background", &a->server_background);
    }
    for (int i = 0; i < a->codes.n; i++)
        printf("error %-6s %llu  (%s)\n", a->codes.e[i].key, (unsigned long long)a->codes.e[i].count,
               a->codes.e[i].msg);
    if (r->mode != MODE_CLOSED)
        printf("pool         %d connections (max %d); %llu starts found no free connection (max lag %.1f ms)%s\n",
               r->n_threads, r->max_threads, (unsigned long long)r->late_starts, r->max_lag_ms,
               r->exhausted ? "; POOL EXHAUSTED: latency includes waiting for a connection" : "");
    if (o->cold_probe) {
        printf("residency    %llu warm, %llu cold: hit rate %.4f\n", (unsigned long long)a->n_warm,
               (unsigned long long)a->n_cold,
               a->n_warm + a->n_cold ? (double)a->n_warm / (double)(a->n_warm + a->n_cold) : 0);
        print_latency("  warm", &a->lat_warm);
        print_latency("  cold", &a->lat_cold);
    }
    if (r->n_models > 1 && o->per_model_rows > 0) {
        int *idx = malloc((size_t)r->n_models * sizeof *idx);
        if (!idx) return;
        for (int i = 0; i < r->n_models; i++) idx[i] = i;
        qsort_r(idx, (size_t)r->n_models, sizeof *idx, cmp_rows, a->per_model);
        printf("%-32s %10s %8s %8s %10s %9s %9s\n", "model", "requests", "ok", "errors", "req/s", "p50 ms", "p99 ms");
        int rows = r->n_models < o->per_model_rows ? r->n_models : o->per_model_rows;
        for (int k = 0; k < rows; k++) {
            const model_agg *m = &a->per_model[idx[k]];
            printf("%-32.32s %10llu %8llu %8llu %10.2f %9.2f %9.2f\n", models[idx[k]].name,
                   (unsigned long long)m->requests, (unsigned long long)m->ok, (unsigned long long)m->errors,
                   win > 0 ? (double)m->ok / win : 0, m->lat ? mts_bench_hist_quantile(m->lat, 0.5) / 1e3 : 0,
                   m->lat ? mts_bench_hist_quantile(m->lat, 0.99) / 1e3 : 0);
        }
        if (rows < r->n_models) printf("... %d more models (--per-model-rows, or --json for all)\n", r->n_models - rows);
        free(idx);
    }
}

void mts_bench_json_server(mts_jw *w, const server_stats *b, const server_stats *e, double secs)
{
    mts_jw_key(w, "server");
    mts_jw_begin_object(w);
    mts_jw_key(w, "available");
    mts_jw_bool(w, b->ok && e->ok);
    if (b->ok && e->ok) {
        mts_jw_key(w, "loads");
        mts_jw_uint(w, e->loads - b->loads);
        mts_jw_key(w, "evictions");
        mts_jw_uint(w, e->evictions - b->evictions);
        mts_jw_key(w, "loads_per_s");
        mts_jw_double(w, secs > 0 ? (double)(e->loads - b->loads) / secs : 0);
        mts_jw_key(w, "rejected_queue_full");
        mts_jw_uint(w, e->rejected_full - b->rejected_full);
        mts_jw_key(w, "timed_out");
        mts_jw_uint(w, e->timed_out - b->timed_out);
        mts_jw_key(w, "resident_models");
        mts_jw_int(w, e->resident_models);
        mts_jw_key(w, "resident_bytes");
        mts_jw_int(w, e->resident_bytes);
    }
    mts_jw_end_object(w);
}
