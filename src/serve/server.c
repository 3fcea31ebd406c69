/*
 * Server object lifecycle: building entries and devices from the configuration, starting the
 * loader, worker and janitor threads, preloading, graceful shutdown (stop accepting, let queued
 * work finish within the grace period, fail the rest), and freeing. Also the name index and
 * clocks shared by the other serve/ files.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "serve/internal.h"
#include "util/log.h"

int64_t mts__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t mts__wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

mts__entry *mts__find_any(const mts_server *s, const char *name)
{
    if (!name) return NULL;
    size_t i = hash_name(name) & (s->name_cap - 1);
    int idx;
    while ((idx = atomic_load_explicit(&s->name_slots[i], memory_order_acquire)) >= 0) {
        mts__entry *e = &s->entries[idx];
        if (!strcmp(e->cfg->name, name)) return e;
        i = (i + 1) & (s->name_cap - 1);
    }
    return NULL;
}

mts__entry *mts__find(const mts_server *s, const char *name)
{
    mts__entry *e = mts__find_any(s, name);
    return e && !atomic_load(&e->removed) ? e : NULL;
}

void mts__index_add(mts_server *s, int idx)
{
    size_t k = hash_name(s->entries[idx].cfg->name) & (s->name_cap - 1);
    while (atomic_load_explicit(&s->name_slots[k], memory_order_relaxed) >= 0) k = (k + 1) & (s->name_cap - 1);
    atomic_store_explicit(&s->name_slots[k], idx, memory_order_release);
}

const char *mts_model_state_name(mts_model_state st)
{
    switch (st) {
    case MTS_MODEL_UNLOADED: return "UNLOADED";
    case MTS_MODEL_LOADING: return "LOADING";
    case MTS_MODEL_READY: return "READY";
    case MTS_MODEL_FAILED: return "FAILED";
    case MTS_MODEL_DRAINING: return "DRAINING";
    case MTS_MODEL_UNAVAILABLE: return "UNAVAILABLE";
    }
    return "?";
}

const mts_config *mts_server_config(const mts_server *s)
{
    return s->cfg;
}

int mts_server_create(const mts_config *cfg, mts_server **out, mts_err *err)
{
    mts__alloc_policy(); /* before the workers' threads make their heaps */
    mts_server *s = calloc(1, sizeof *s);
    if (!s) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    s->cfg = cfg;
    s->start_ns = mts__now_ns();
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->load_cv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    pthread_cond_init(&s->janitor_cv, NULL);
    s->n_entries = cfg->n_models;
    /* poll mode may add models later: room for them now, as entries never move */
    s->cap_entries = cfg->n_models + (cfg->model_control == MTS_CONTROL_POLL ? MTS_SERVER_ADD_HEADROOM : 0);
    s->entries = calloc((size_t)s->cap_entries + 1, sizeof *s->entries);
    s->name_cap = 16;
    while (s->name_cap < (size_t)s->cap_entries * 2 + 16) s->name_cap *= 2;
    s->name_slots = malloc(s->name_cap * sizeof *s->name_slots);
    s->n_devs = cfg->device_count > 0 ? cfg->device_count : 1;
    s->devs = calloc((size_t)s->n_devs, sizeof *s->devs);
    if (!s->entries || !s->name_slots || !s->devs) {
        mts_server_free(s);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    for (size_t k = 0; k < s->name_cap; k++) atomic_init(&s->name_slots[k], -1);
    for (int i = 0; i < cfg->n_models; i++) {
        mts__entry *e = &s->entries[i];
        e->cfg = &cfg->models[i];
        e->state = MTS_MODEL_UNLOADED;
        if (mts__find(s, e->cfg->name)) {
            mts_server_free(s);
            return mts_err_set(err, MTS_EINVAL, "model '%s' is configured twice", e->cfg->name);
        }
        mts__index_add(s, i);
    }
    const char *pre = getenv("MTS_PREEMPT");
    s->preempt = pre && strcmp(pre, "0") != 0;
    const char *inl = getenv("MTS_INLINE_SHORT"), *lane = getenv("MTS_SHORT_LANE");
    s->short_lane = !(lane && !strcmp(lane, "0"));
    /* short work on the submitting thread is the lane's work: off with the lane */
    s->inline_short = !(inl && !strcmp(inl, "0")) && s->short_lane;
    /* "0": the front ends read and parse such requests whole before submit refuses them
     * (comparisons) */
    const char *early = getenv("MTS_EARLY_REFUSAL");
    s->early_refusal = !(early && !strcmp(early, "0"));
    int total_workers = 0;
    for (int d = 0; d < s->n_devs; d++) {
        mts__device *dev = &s->devs[d];
        dev->id = d;
        dev->workers = cfg->workers_per_device > 0 ? cfg->workers_per_device : 1;
        dev->cores = cfg->threads_per_device > 0 ? cfg->threads_per_device : 1;
        dev->budget = (int64_t)(cfg->memory_gb_per_device * 1e9);
        pthread_cond_init(&dev->cv, NULL);
        pthread_cond_init(&dev->lane_cv, NULL);
        dev->w_batches = calloc((size_t)dev->workers + 1, sizeof(uint64_t));
        dev->w_busy_ns = calloc((size_t)dev->workers + 1, sizeof(int64_t));
        total_workers += dev->workers + 1; /* + the short-work lane (scheduler.c) */
    }
    s->worker_threads = calloc((size_t)total_workers, sizeof(pthread_t));
    s->workers = calloc((size_t)total_workers, sizeof *s->workers);
    if (!s->worker_threads || !s->workers) {
        mts_server_free(s);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    for (int d = 0, k = 0; d < s->n_devs; d++)
        for (int w = 0; w <= s->devs[d].workers; w++, k++) {
            s->workers[k].s = s;
            s->workers[k].device = d;
            s->workers[k].index = w;
            if (pthread_create(&s->worker_threads[k], NULL, mts__worker_main, &s->workers[k])) {
                mts_server_shutdown(s, 0);
                mts_server_free(s);
                return mts_err_set(err, MTS_ENOMEM, "cannot start worker threads");
            }
            char tn[16]; /* names shown by top -H, ps -L and perf: which thread burns the CPU */
            if (w < s->devs[d].workers)
                snprintf(tn, sizeof tn, "mts-d%d-w%d", d % 100, w % 100);
            else
                snprintf(tn, sizeof tn, "mts-d%d-lane", d % 100);
            pthread_setname_np(s->worker_threads[k], tn);
            s->n_workers = k + 1;
        }
    s->n_loaders = 2;
    for (int i = 0; i < s->n_loaders; i++)
        if (pthread_create(&s->loader_threads[i], NULL, mts__loader_main, s) == 0)
            pthread_setname_np(s->loader_threads[i], "mts-loader");
    s->janitor_started = pthread_create(&s->janitor_thread, NULL, mts__janitor_main, s) == 0;
    if (s->janitor_started) pthread_setname_np(s->janitor_thread, "mts-janitor");
    MTS_INFO("event=server_started models=%d devices=%d workers_per_device=%d threads_per_device=%d "
             "budget_per_device_mb=%.0f max_models=%d eviction=%s",
             cfg->n_models, s->n_devs, s->devs[0].workers, s->devs[0].cores, (double)s->devs[0].budget / 1e6,
             cfg->max_models, cfg->eviction == MTS_EVICT_LFU ? "lfu" : "lru");
    /* Start-up checks: a model whose file is missing is marked unavailable with the reason (its
     * requests get it; a request after the file appears loads it); missing lip-sync assets are
     * reported (the model serves inference, composites fail with the reason). */
    int64_t now = mts__now_ns();
    for (int i = 0; i < s->n_entries; i++) {
        mts__entry *e = &s->entries[i];
        const mts_model_config *mc = e->cfg;
        struct stat sb;
        if (stat(mc->model_path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            const char *why = stat(mc->model_path, &sb) != 0 ? strerror(errno) : "not a regular file";
            /* clients see no server paths; the log line has it */
            snprintf(e->reason, sizeof e->reason, "its model file is missing at start (%s)", why);
            e->state = MTS_MODEL_FAILED;
            e->retry_at_ns = now; /* the next request or load tries again */
            s->unavailable_at_start++;
            MTS_WARN("model=%s event=unavailable path=%s reason=\"%s\"", mc->name, mc->model_path, why);
            continue;
        }
        /* A missing background folder makes the model unavailable (every request would fail its
         * composite or serve a model without its avatar); poll mode makes it available again when
         * the folder appears. A missing crop_rects file only fails composites. */
        char why[256];
        if (mts_server_asset_problem(s, mc, why, sizeof why)) {
            snprintf(e->unavailable, sizeof e->unavailable, "%s", why);
            s->unavailable_at_start++;
            MTS_WARN("model=%s event=unavailable background_dir=%s reason=\"%s\"", mc->name, mc->background_dir, why);
            continue;
        }
        if (mc->crop_rects_path && (stat(mc->crop_rects_path, &sb) != 0 || !S_ISREG(sb.st_mode)))
            MTS_WARN("model=%s event=assets_missing crop_rects_path=%s: %s (inference is served; composites fail)",
                     mc->name, mc->crop_rects_path, stat(mc->crop_rects_path, &sb) != 0 ? strerror(errno)
                                                                                  : "wrong file type");
    }
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_entries; i++) {
        mts__entry *e = &s->entries[i];
        if (e->state == MTS_MODEL_FAILED || e->unavailable[0]) continue;
        if (e->cfg->preload || e->cfg->pin || cfg->model_control == MTS_CONTROL_NONE) mts__request_load(s, e);
    }
    pthread_mutex_unlock(&s->lock);
    *out = s;
    return MTS_OK;
}

/* Takes every queued request of every model out of its queue (s->lock held): one list. */
static mts_request *drain_all(mts_server *s)
{
    mts_request *left = NULL;
    for (int i = 0; i < s->n_entries; i++) {
        mts_request *l = mts__drain_queue(s, &s->entries[i]);
        while (l) {
            mts_request *n = l->next;
            l->next = left;
            left = l;
            l = n;
        }
    }
    return left;
}

void mts_server_shutdown(mts_server *s, int grace_s)
{
    pthread_mutex_lock(&s->lock);
    if (s->stop_all) {
        pthread_mutex_unlock(&s->lock);
        return;
    }
    s->stopping = true;
    int64_t deadline = mts__now_ns() + (int64_t)grace_s * 1000000000;
    MTS_INFO("event=shutdown queued=%d grace_s=%d", s->total_queued, grace_s);
    for (;;) {
        int running = 0;
        for (int i = 0; i < s->n_entries; i++) running += s->entries[i].running;
        if (s->total_queued == 0 && running == 0) break;
        if (mts__now_ns() >= deadline) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&s->idle_cv, &s->lock, &ts);
    }
    s->stop_workers = true;
    while (s->inline_running > 0) pthread_cond_wait(&s->idle_cv, &s->lock); /* short batches */
    mts_request *left = drain_all(s);
    for (int d = 0; d < s->n_devs; d++) {
        pthread_cond_broadcast(&s->devs[d].cv);
        pthread_cond_broadcast(&s->devs[d].lane_cv);
    }
    pthread_mutex_unlock(&s->lock);
    mts__fail_list(left, MTS_EUNAVAILABLE, "server shut down before the request could run");
    for (int i = 0; i < s->n_workers; i++) pthread_join(s->worker_threads[i], NULL);
    s->n_workers = 0;
    /* Lip-sync composites handed to the media threads by the workers finish (and answer their
     * clients) before the front ends stop; later callers composite inline. */
    pthread_mutex_lock(&s->lock);
    mts_workq *mq = s->media_q;
    s->media_q = NULL;
    s->media_closed = true;
    pthread_mutex_unlock(&s->lock);
    mts_workq_destroy(mq);
    pthread_mutex_lock(&s->lock);
    s->stop_all = true;
    pthread_cond_broadcast(&s->load_cv);
    pthread_cond_broadcast(&s->janitor_cv);
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < s->n_loaders; i++) pthread_join(s->loader_threads[i], NULL);
    s->n_loaders = 0;
    if (s->janitor_started) pthread_join(s->janitor_thread, NULL);
    s->janitor_started = false;
    /* Requests that arrived for models whose load was still queued. */
    pthread_mutex_lock(&s->lock);
    left = drain_all(s);
    mts__waiter *waiters = NULL;
    for (int i = 0; i < s->n_entries; i++) {
        mts__entry *e = &s->entries[i];
        mts__waiter **lists[2] = {&e->load_waiters, &e->unload_waiters};
        for (int l = 0; l < 2; l++) {
            while (*lists[l]) {
                mts__waiter *w = *lists[l];
                *lists[l] = w->next;
                w->next = waiters;
                waiters = w;
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    mts__fail_list(left, MTS_EUNAVAILABLE, "server shut down before the request could run");
    mts__notify(waiters, MTS_EUNAVAILABLE, "server shut down");
    MTS_INFO("event=shutdown_complete completed=%llu failed=%llu", (unsigned long long)s->completed,
             (unsigned long long)s->failed);
}

void mts_server_free(mts_server *s)
{
    if (!s) return;
    if (s->n_workers || s->n_loaders) mts_server_shutdown(s, 0);
    for (int i = 0; i < s->n_entries; i++) {
        mts__entry *e = &s->entries[i];
        mts__version_free(e->cur);
        while (e->draining) {
            mts__version *n = e->draining->next;
            mts__version_free(e->draining);
            e->draining = n;
        }
    }
    for (int d = 0; s->devs && d < s->n_devs; d++) {
        pthread_cond_destroy(&s->devs[d].cv);
        pthread_cond_destroy(&s->devs[d].lane_cv);
        free(s->devs[d].w_batches);
        free(s->devs[d].w_busy_ns);
        mts__inline_free(&s->devs[d]);
    }
    free(s->devs);
    free(s->entries);
    free(s->name_slots);
    for (int i = 0; i < s->n_owned_cfgs; i++) mts_model_config_free(s->owned_cfgs[i]);
    free(s->owned_cfgs);
    free(s->worker_threads);
    free(s->workers);
    free(s->jobs);
    pthread_cond_destroy(&s->load_cv);
    pthread_cond_destroy(&s->idle_cv);
    pthread_cond_destroy(&s->janitor_cv);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* The folder a client is shown for path: relative to the model repository when inside it,
 * else its last component (replies do not reveal where the server keeps its files). */
static const char *shown_path(const mts_server *s, const char *path)
{
    const char *root = s->cfg->model_repository ? s->cfg->model_repository : s->cfg->source;
    size_t rl = root ? strlen(root) : 0;
    while (rl > 1 && root[rl - 1] == '/') rl--;
    if (rl && !strncmp(path, root, rl) && path[rl] == '/' && path[rl + 1]) return path + rl + 1;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *b = path + n;
    while (b > path && b[-1] != '/') b--;
    return b;
}

bool mts_server_asset_problem(const mts_server *s, const mts_model_config *mc, char *why, size_t len)
{
    struct stat sb;
    if (!mc->background_dir) return false;
    if (stat(mc->background_dir, &sb) == 0 && S_ISDIR(sb.st_mode)) return false;
    const char *err = stat(mc->background_dir, &sb) != 0 ? strerror(errno) : "not a folder";
    const char *shown = shown_path(s, mc->background_dir);
    size_t sl = strlen(shown);
    while (sl > 1 && shown[sl - 1] == '/') sl--;
    snprintf(why, len, "background_dir '%.*s' is missing (%s)", (int)sl, shown, err);
    return true;
}

int mts_server_unavailable_at_start(const mts_server *s)
{
    return s->unavailable_at_start;
}
