/*
 * The registry: residency of configured models (the state machine in internal.h), loads on
 * loader threads, placement on devices, eviction by policy when max_models or a device's memory
 * budget would be exceeded, idle unloading, explicit load/unload with force_reload, and load
 * failures with exponential back-off. One log line per load, unload and eviction, with the
 * duration and bytes. Poll mode changes the model set at run time: models are added into free
 * slots of the entry table, switched to another version's configuration (the loaded version
 * answers until the new one is loaded), removed (hidden from lookups, then drained), and marked
 * unavailable while a lip-sync asset folder is missing.
 *
 * Memory is accounted from real sizes: a version's bytes are the engine's own allocations
 * (IR, copied weights, plans, packed weights, a constant per oneDNN primitive), the mapped
 * weight bytes and its contexts' activation buffers, refreshed after each batch (plans and
 * primitives are made on first use), plus a file size while a plan is being built (the load's
 * until its first batch ends; a batch of a new size reserves its own). Before a load, that
 * much and the file size are reserved on the device so concurrent loads cannot overcommit;
 * eviction happens before the load, never after a failure to allocate. Freed versions go back
 * to the system at once (mts__alloc_policy: large blocks mmapped, heaps trimmed).
 */
#include <stdio.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "serve/internal.h"
#include "util/iobuf.h"
#include "util/log.h"

void mts__notify(mts__waiter *w, int status, const char *msg)
{
    while (w) {
        mts__waiter *next = w->next;
        if (w->cb) w->cb(w->user, status, msg);
        free(w);
        w = next;
    }
}

static int add_waiter(mts__waiter **list, mts_server_cb cb, void *user)
{
    mts__waiter *w = calloc(1, sizeof *w);
    if (!w) return MTS_ENOMEM;
    w->cb = cb;
    w->user = user;
    w->next = *list;
    *list = w;
    return MTS_OK;
}

void mts__version_free(mts__version *v)
{
    if (!v) return;
    for (int i = 0; i < v->n_ctx_free; i++) mts_ctx_free(v->ctx_free[i]);
    free(v->ctx_free);
    mts_bgcache_unref(v->bg); /* composites in flight may keep it a little longer */
    mts_model_free(v->model);
    free(v);
}

/* The allocator's policy for a server whose models come and go. glibc's default mmap threshold
 * is dynamic: once a large mmapped block is freed, blocks up to that size (32 MB at most) come
 * from the heaps instead, and a heap keeps what is freed inside it. Under churn an evicted
 * model's activation buffers and plans then stay in the process (measured by
 * scripts/bench-memory.py: RSS 424 MB under a 100 MB budget). A fixed threshold of 128 KB
 * sends every large buffer to its own mapping, returned to the system on free, and
 * malloc_trim after an unload hands back the free pages inside the heaps.
 * MTS_MALLOC_TUNE=0 keeps glibc's defaults, MTS_MALLOC_TUNE=trim keeps them but trims after
 * unloads, MTS_MMAP_THRESHOLD / MTS_TRIM_THRESHOLD (bytes) override the two values (to measure
 * the trade-off). Request and response buffers, which a flood of large requests would otherwise
 * map and unmap once each, come from the bounded cache of util/iobuf.h instead.
 * The trim threshold (free space at a heap's top that free() hands back at once) is high, 64 MB:
 * gRPC core reads each large message into many heap-sized buffers and frees them together, and
 * with a low threshold every message's buffers were handed back and faulted in again (2.4 MB
 * requests from 4 clients: 380 page faults and 1.6-1.9 ms of front-end CPU per request at 1 MB,
 * 32-38 faults and 0.8-1.0 ms at 32-64 MB). What the heaps keep goes back once the server is
 * idle: the janitor trims them after MTS__TRIM_IDLE_S seconds without a new request. */
#define MTS__TRIM_THRESHOLD ((size_t)64 << 20)
#define MTS__TRIM_IDLE_S 2
static _Atomic bool g_trim = false; /* set by every server's creation, read by janitors */

void mts__alloc_policy(void)
{
#ifdef __GLIBC__
    const char *t = getenv("MTS_MALLOC_TUNE");
    if (t && !strcmp(t, "0")) return;
    if (t && !strcmp(t, "trim")) {
        g_trim = true;
        return;
    }
    const char *mt = getenv("MTS_MMAP_THRESHOLD"), *tt = getenv("MTS_TRIM_THRESHOLD");
    mallopt(M_MMAP_THRESHOLD, mt ? atoi(mt) : 128 * 1024);
    mallopt(M_TRIM_THRESHOLD, tt ? atoi(tt) : (int)MTS__TRIM_THRESHOLD);
    g_trim = true;
#endif
}

void mts__version_free_list(mts__version **list)
{
    mts__version *v = *list;
    bool freed = v != NULL;
    while (v) {
        mts__version *next = v->next;
        mts__version_free(v);
        v = next;
    }
    *list = NULL; /* callers keep using the variable for later batches of work */
#ifdef __GLIBC__
    if (freed && g_trim) malloc_trim(0); /* free pages inside the heaps go back to the system */
#endif
    if (freed) mts_iobuf_trim(); /* and the cached request/response buffers */
}

/* What a precision guard's verdict depends on: the precision asked for (config or
 * MTS_PRECISION), the threshold, the model file (size, modification time) and the calibration
 * folder beside it (modification time: .npy files added or removed). Loads run on the loader
 * threads one at a time per model, so the entry's verdict needs no lock. */
static void guard_key(const mts_model_config *cfg, char *key, size_t len)
{
    struct stat st = {0}, cs = {0};
    stat(cfg->model_path, &st);
    const char *slash = strrchr(cfg->model_path, '/');
    char calib[4096];
    snprintf(calib, sizeof calib, "%.*s/calibration", slash ? (int)(slash - cfg->model_path) : 1,
             slash ? cfg->model_path : ".");
    stat(calib, &cs);
    const char *req = cfg->precision && *cfg->precision ? cfg->precision : getenv("MTS_PRECISION");
    snprintf(key, len, "%.16s|%.9g|%lld|%lld.%09ld|%lld.%09ld", req ? req : "", cfg->max_error,
             (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
             (long long)cs.st_mtim.tv_sec, cs.st_mtim.tv_nsec);
}

static int64_t version_bytes(const mts__version *v)
{
    return v->base_bytes + v->ctx_bytes + v->transient_bytes;
}

void mts__request_load(mts_server *s, mts__entry *e)
{
    if (e->state != MTS_MODEL_READY) e->state = MTS_MODEL_LOADING;
    if (s->n_jobs == s->cap_jobs) {
        int cap = s->cap_jobs ? s->cap_jobs * 2 : 16;
        mts__entry **j = realloc(s->jobs, sizeof *j * (size_t)cap);
        if (!j) return; /* the request stays queued; the janitor retries */
        s->jobs = j;
        s->cap_jobs = cap;
    }
    s->jobs[s->n_jobs++] = e;
    if (e->state == MTS_MODEL_LOADING) s->resident++;
    pthread_cond_signal(&s->load_cv);
}

/* Queues a retry of every load waiting for room (lock held): a model went idle or unloaded,
 * or a reservation was released. */
static void retry_room_waiters(mts_server *s)
{
    if (s->stopping) return;
    for (int i = 0; i < s->n_entries; i++) {
        mts__entry *w = &s->entries[i];
        if (w->room_wait_since_ns && !w->room_retry && w->state == MTS_MODEL_LOADING) {
            w->room_retry = true;
            mts__request_load(s, w);
        }
    }
}

/* Detaches e's current version after eviction or unload (lock held); returns it for freeing. */
static mts__version *detach(mts_server *s, mts__entry *e)
{
    mts__version *v = e->cur;
    if (!v) return NULL;
    mts__device *d = &s->devs[v->device];
    d->used -= version_bytes(v);
    d->models--;
    s->resident--;
    e->cur = NULL;
    e->state = MTS_MODEL_UNLOADED;
    e->unloads++;
    return v;
}

static bool evictable(const mts__entry *e)
{
    return e->state == MTS_MODEL_READY && e->cur && !e->cfg->pin && e->qlen == 0 && e->running == 0 &&
           e->cur->refs == 0 && !e->reload_pending;
}

static mts__entry *pick_victim(mts_server *s, int device, const mts__entry *except)
{
    mts__entry *best = NULL;
    for (int i = 0; i < s->n_entries; i++) {
        mts__entry *e = &s->entries[i];
        if (e == except || !evictable(e) || (device >= 0 && e->cur->device != device)) continue;
        if (!best) {
            best = e;
            continue;
        }
        if (s->cfg->eviction == MTS_EVICT_LFU) {
            if (e->lfu < best->lfu || (e->lfu == best->lfu && e->last_used_ns < best->last_used_ns)) best = e;
        } else if (e->last_used_ns < best->last_used_ns) {
            best = e;
        }
    }
    return best;
}

static void evict(mts_server *s, mts__entry *e, const char *why, mts__version **to_free)
{
    mts__version *v = e->cur;
    int64_t bytes = version_bytes(v);
    if (bytes - v->transient_bytes > e->last_bytes) e->last_bytes = bytes - v->transient_bytes;
    int dev = v->device;
    detach(s, e);
    e->evictions++;
    v->next = *to_free;
    *to_free = v;
    MTS_INFO("model=%s event=evicted reason=%s policy=%s version=%d load=%d device=cpu:%d bytes=%lld idle_s=%.1f",
             e->cfg->name, why, s->cfg->eviction == MTS_EVICT_LFU ? "lfu" : "lru",
             e->cfg->version > 0 ? e->cfg->version : 1, v->number, dev, (long long)bytes,
             (double)(mts__now_ns() - e->last_used_ns) / 1e9);
    mts__event_add(s, "evicted", e, dev, "%s (%s), %lld bytes freed", why,
                   s->cfg->eviction == MTS_EVICT_LFU ? "lfu" : "lru", (long long)bytes);
}

void mts__enforce_budget(mts_server *s, int dev, const mts__entry *keep, mts__version **to_free)
{
    mts__device *d = &s->devs[dev];
    while (d->used > d->budget) {
        mts__entry *victim = pick_victim(s, dev, keep);
        if (!victim) break; /* everything left is pinned or busy: the next load will fail instead */
        evict(s, victim, "memory", to_free);
    }
}

static int choose_device(mts_server *s, const mts__entry *e)
{
    if (e->cfg->preferred_device >= 0 && e->cfg->preferred_device < s->n_devs) return e->cfg->preferred_device;
    if (s->cfg->placement == MTS_PLACE_LEAST_LOADED) {
        int best = 0;
        for (int i = 1; i < s->n_devs; i++)
            if (s->devs[i].used < s->devs[best].used) best = i;
        return best;
    }
    return s->rr_next++ % s->n_devs;
}

/* Makes room for `need` bytes on device dev and one more resident model (lock held). The entry
 * being loaded is already counted in resident. */
static int make_room(mts_server *s, mts__entry *e, int dev, int64_t need, mts__version **to_free, char *msg,
                     size_t len)
{
    while (s->resident > s->cfg->max_models) {
        mts__entry *victim = pick_victim(s, -1, e);
        if (!victim) {
            snprintf(msg, len, "max_models (%d) reached and every resident model is pinned, loading or busy",
                     s->cfg->max_models);
            return MTS_ELIMIT;
        }
        evict(s, victim, "max_models", to_free);
    }
    mts__device *d = &s->devs[dev];
    while (d->used + need > d->budget) {
        mts__entry *victim = pick_victim(s, dev, e);
        if (!victim) {
            snprintf(msg, len,
                     "device cpu:%d memory budget is %.1f MB: the model needs %.1f MB and %.1f MB are held by pinned, "
                     "loading or busy models",
                     dev, (double)d->budget / 1e6, (double)need / 1e6, (double)d->used / 1e6);
            return MTS_ELIMIT;
        }
        evict(s, victim, "memory", to_free);
    }
    return MTS_OK;
}

/* Replaces each occurrence of `from` in msg (NUL-terminated, cap bytes) by `to`, cutting at cap. */
static void replace_all(char *msg, size_t cap, const char *from, const char *to)
{
    size_t fl = strlen(from), tl = strlen(to);
    if (!fl) return;
    char out[1024];
    size_t o = 0;
    for (const char *p = msg; *p && o + 1 < sizeof out;) {
        if (!strncmp(p, from, fl)) {
            size_t n = tl < sizeof out - 1 - o ? tl : sizeof out - 1 - o;
            memcpy(out + o, to, n);
            o += n;
            p += fl;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    snprintf(msg, cap, "%s", out);
}

/* What clients see of a server-side message about a model's files: the model's folder named
 * relative to the repository (or by its own name when it lives elsewhere), so replies do not
 * reveal where the server keeps its files. The log keeps the full message. */
static void client_paths(const mts_server *s, const mts_model_config *cfg, char *msg, size_t cap)
{
    const char *path = cfg->model_path;
    const char *slash = path ? strrchr(path, '/') : NULL;
    if (!slash || slash == path) return;
    char dir[1024], shown[1024];
    snprintf(dir, sizeof dir, "%.*s/", (int)(slash - path), path);
    const char *root = s->cfg->model_repository;
    size_t rl = root ? strlen(root) : 0;
    while (rl > 1 && root[rl - 1] == '/') rl--;
    if (rl && !strncmp(dir, root, rl) && dir[rl] == '/') {
        snprintf(shown, sizeof shown, "%s", dir + rl + 1);
    } else {
        const char *b = slash;
        while (b > path && b[-1] != '/') b--;
        snprintf(shown, sizeof shown, "%.*s/", (int)(slash - b), b);
    }
    replace_all(msg, cap, dir, shown);
    if (rl) {
        char rootdir[1024];
        snprintf(rootdir, sizeof rootdir, "%.*s/", (int)rl, root);
        replace_all(msg, cap, rootdir, "");
    }
}

static void fill_meta(mts__version *v, const mts_model_config *cfg)
{
    mts_model_info info;
    mts_model_get_info(v->model, &info);
    v->n_in = info.n_inputs; /* at most MTS_REQ_MAX_TENSORS (check_io_kinds) */
    v->n_out = info.n_outputs;
    v->batchable = true;
    for (int pass = 0; pass < 2; pass++) {
        int n = pass ? v->n_out : v->n_in;
        for (int i = 0; i < n; i++) {
            const mts_value *val = pass ? mts_model_output(v->model, i) : mts_model_input(v->model, i);
            mts_tensor_meta *m = pass ? &v->out[i] : &v->in[i];
            snprintf(m->name, sizeof m->name, "%s", val->name);
            m->dtype = val->dtype;
            m->rank = val->rank < 0 ? 0 : val->rank;
            for (int d = 0; d < m->rank; d++) m->dims[d] = val->dims[d] >= 0 ? val->dims[d] : -1;
            if (val->rank < 1 || val->dims[0] >= 0) v->batchable = false;
            /* string tensors are blobs with their shape inside: each request runs alone */
            if (val->dtype == MTS_DTYPE_STRINGS) v->batchable = false;
        }
    }
    v->max_batch = v->batchable ? (cfg->max_batch > 0 ? cfg->max_batch : 1) : 1;
    v->engine_batch = v->batchable && cfg->engine_batch > 0 ? cfg->engine_batch : 0;
}

/* The engine holds sequence and optional values inside a graph; the protocols carry tensors
 * (numbers, and strings as KServe BYTES: api/bytes_tensor.h), so a model whose graph inputs or
 * outputs are sequences or optionals is refused at load with the reason, as is one with more
 * inputs or outputs than a request holds. */
static int check_io_kinds(const mts_model *m, char *msg, size_t len)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    /* a request carries at most MTS_REQ_MAX_TENSORS of each, and a batch's run hands over every
     * output of the graph */
    if (info.n_inputs > MTS_REQ_MAX_TENSORS || info.n_outputs > MTS_REQ_MAX_TENSORS) {
        snprintf(msg, len, "the graph has %d inputs and %d outputs: the server serves models of at most %d of each",
                 info.n_inputs, info.n_outputs, MTS_REQ_MAX_TENSORS);
        return MTS_EUNSUPPORTED;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < (pass ? info.n_outputs : info.n_inputs); i++) {
            const mts_value *val = pass ? mts_model_output(m, i) : mts_model_input(m, i);
            const char *kind = val->dtype == MTS_DTYPE_SEQUENCE   ? "a sequence"
                               : val->dtype == MTS_DTYPE_OPTIONAL ? "an optional value"
                                                                  : NULL;
            if (kind) {
                snprintf(msg, len, "graph %s '%s' is %s: the server exchanges tensors (numbers, and strings as "
                         "BYTES) over its protocols (such values may live inside the graph)", pass ? "output" : "input",
                         val->name, kind);
                return MTS_EUNSUPPORTED;
            }
        }
    return MTS_OK;
}

static void load_one(mts_server *s, mts__entry *e)
{
    char msg[512] = "";
    mts__version *to_free = NULL;
    /* a newer version folder waiting to replace the served one (mts_server_update_model) */
    pthread_mutex_lock(&s->lock);
    const mts_model_config *cfg = e->pending_cfg ? e->pending_cfg : e->cfg;
    pthread_mutex_unlock(&s->lock);
    struct stat st;
    int64_t file_bytes = stat(cfg->model_path, &st) == 0 ? (int64_t)st.st_size : 0, need = file_bytes;
    /* Lip-sync assets: open the background cache with the version and reserve its
     * capacity (background_cache_frames decoded frames) in the device budget. Asset problems do
     * not fail the load: the model serves InferBatch and composites report bg_error. */
    mts_bgcache *bg = NULL;
    char bg_error[384] = "";
    if (cfg->background_dir) {
        mts_err berr = {0};
        mts_bgcache_config bc = {cfg->name, cfg->background_dir, cfg->crop_rects_path, cfg->num_frames,
                                 cfg->background_cache_frames > 0 ? cfg->background_cache_frames
                                 : s->cfg->background_cache_frames > 0 ? s->cfg->background_cache_frames : 50};
        if (mts_bgcache_open(&bc, &bg, &berr)) {
            snprintf(bg_error, sizeof bg_error, "%s", berr.msg);
            MTS_WARN("model=%s event=assets_failed error=\"%s\"", cfg->name, berr.msg);
        } else {
            need += mts_bgcache_capacity_bytes(bg);
        }
    }
    pthread_mutex_lock(&s->lock);
    /* A model seen before is expected to need what it reached then (weights, plans and
     * activations), not just its file size. */
    if (e->last_bytes > need) need = e->last_bytes;
    /* Parsing reads the whole file mapping beside the weights it copies, and the first batch's
     * plan packs weights beside those copies: the load holds about a file size more than the
     * model keeps, so that is reserved too and charged until the first batch ends. */
    bool reload = e->reload_pending;
    int dev = choose_device(s, e);
    /* (a model that fits the device only without it still loads, with the whole budget) */
    need = need <= s->devs[dev].budget && need + file_bytes > s->devs[dev].budget ? s->devs[dev].budget
                                                                                     : need + file_bytes;
    int rc = make_room(s, e, dev, need, &to_free, msg, sizeof msg);
    /* no room now, but the model fits the device: the models in the way are busy, loading or
     * pinned, which is not a failure of this model */
    bool blocked = rc == MTS_ELIMIT && need <= s->devs[dev].budget && !reload;
    bool reserved = rc == MTS_OK;
    if (reserved) s->devs[dev].used += need; /* released when the load ends */
    pthread_mutex_unlock(&s->lock);
    mts__version_free_list(&to_free);
    mts__version *v = NULL;
    int64_t t0 = mts__now_ns();
    if (!rc) {
        mts_err err = {0};
        mts_model *m = NULL;
        mts_load_opts lo = {0};
        lo.precision = cfg->precision;
        lo.max_error = cfg->max_error;
        char gkey[sizeof e->guard_key];
        guard_key(cfg, gkey, sizeof gkey);
        if (e->guard_verdict[0] && !strcmp(e->guard_key, gkey)) {
            lo.guard_verdict = e->guard_verdict;
            lo.guard_error = e->guard_error;
        }
        rc = mts_model_load(cfg->model_path, &lo, &m, &err);
        const mts_precision_info *pi = rc ? NULL : mts_model_precision(m);
        e->guard_verdict[0] = '\0';
        if (pi && pi->guard_error >= 0 && (!strcmp(pi->effective, "bf16") || !strcmp(pi->effective, "fp16") ||
                                           !strcmp(pi->effective, "fp32"))) {
            snprintf(e->guard_verdict, sizeof e->guard_verdict, "%s", pi->effective);
            e->guard_error = pi->guard_error;
            snprintf(e->guard_key, sizeof e->guard_key, "%s", gkey);
        }
        if (pi && (strcmp(pi->requested, "fp32") || strcmp(pi->effective, "fp32")))
            MTS_INFO("model=%s event=precision precision=%s requested=%s reason=\"%s\" guard_error=%.3g max_error=%.3g",
                     cfg->name, pi->effective, pi->requested, pi->reason, pi->guard_error, pi->max_error);
        if (rc) snprintf(msg, sizeof msg, "%s", err.msg);
        else if ((rc = check_io_kinds(m, msg, sizeof msg))) mts_model_free(m);
        else if (!(v = calloc(1, sizeof *v))) {
            mts_model_free(m);
            rc = MTS_ENOMEM;
            snprintf(msg, sizeof msg, "out of memory");
        } else {
            v->model = m;
            v->entry = e;
            v->device = dev;
            mts_model_info info;
            mts_model_get_info(m, &info);
            v->base_bytes = v->engine_bytes = info.resident_bytes + info.mapped_bytes;
            v->transient_bytes = v->file_bytes = file_bytes;
            /* the first batch builds the plan, its primitives and activations: keep what was
             * reserved for the model (what it reached before, on a reload) until it ends */
            if (need - v->base_bytes > v->transient_bytes) v->transient_bytes = need - v->base_bytes;
            v->load_transient = true;
            fill_meta(v, cfg);
            v->bg = bg; /* the cache's capacity counts in the version's bytes */
            bg = NULL;
            if (v->bg) v->base_bytes += mts_bgcache_capacity_bytes(v->bg);
            snprintf(v->bg_error, sizeof v->bg_error, "%s", bg_error);
            client_paths(s, cfg, v->bg_error, sizeof v->bg_error);
        }
    }
    mts_bgcache_unref(bg); /* the load failed */
    double ms = (double)(mts__now_ns() - t0) / 1e6;
    mts__waiter *notify = NULL;
    mts_request *failed = NULL;
    pthread_mutex_lock(&s->lock);
    if (reserved) s->devs[dev].used -= need;
    notify = e->load_waiters;
    e->load_waiters = NULL;
    e->room_retry = false;
    bool wait = false;
    if (blocked) {
        int64_t now = mts__now_ns();
        if (!e->room_wait_since_ns) {
            e->room_wait_since_ns = now;
            s->room_waiters++;
            MTS_INFO("model=%s event=load_waiting queued=%d reason=\"%s\"", cfg->name, e->qlen, msg);
            mts__event_add(s, "load_waiting", e, -1, "%s", msg);
        }
        /* A queued request with its own deadline is waited for until that deadline (its timeout
         * fails it then, as any queued request); without one, MTS__ROOM_WAIT_NS. */
        int64_t until = e->room_wait_since_ns + MTS__ROOM_WAIT_NS;
        for (const mts_request *r = e->qh; r; r = r->next)
            if (r->deadline_ns > until) until = r->deadline_ns;
        wait = (e->qlen > 0 || notify) && now < until && !s->stopping;
    }
    if (!wait && e->room_wait_since_ns) {
        e->room_wait_since_ns = 0;
        s->room_waiters--;
    }
    if (!rc || !blocked) mts__hist_add(&e->h_load, mts__time_buckets, MTS__HIST_BUCKETS, ms / 1e3);
    if (wait) {
        /* requests and load callers stay; retried when a model goes idle (mts__after_idle) and
         * by the janitor each second */
        e->load_waiters = notify;
        notify = NULL;
        s->resident--; /* state stays LOADING, with no job until the retry */
        snprintf(e->reason, sizeof e->reason, "waiting for room: %s", msg);
    } else if (rc) {
        e->load_failures++;
        int64_t backoff_ms = 0;
        if (!blocked) { /* a real failure backs off: 1 s, 2 s, ... 64 s */
            e->fails++;
            backoff_ms = 1000LL << (e->fails < 7 ? e->fails - 1 : 6);
        }
        e->retry_at_ns = mts__now_ns() + backoff_ms * 1000000;
        snprintf(e->reason, sizeof e->reason, "%s", msg);
        client_paths(s, cfg, e->reason, sizeof e->reason);
        if (reload && e->cur) {
            e->reload_pending = false; /* the old version keeps serving */
        } else {
            e->state = MTS_MODEL_FAILED;
            s->resident--;
            failed = mts__drain_queue(s, e);
            for (mts_request *r = failed; r; r = r->next) mts__win_error(e, mts__now_ns());
        }
        MTS_ERROR("model=%s event=load_failed ms=%.1f retry_in_s=%lld error=\"%s\"", cfg->name, ms,
                  (long long)backoff_ms / 1000, msg);
        mts__event_add(s, "load_failed", e, -1, "%s", e->reason);
    } else {
        if (cfg == e->pending_cfg) { /* the new version serves from now on */
            MTS_INFO("model=%s event=version_switched version=%d previous=%d", cfg->name, cfg->version,
                     e->cfg->version);
            e->cfg = cfg;
            e->pending_cfg = NULL;
        }
        mts__device *d = &s->devs[dev];
        d->used += version_bytes(v);
        d->models++;
        e->fails = 0;
        e->reason[0] = '\0';
        e->loads++;
        e->versions++;
        v->number = e->versions;
        e->last_load_ms = ms;
        e->loaded_at_ms = mts__wall_ms();
        e->last_used_ns = mts__now_ns();
        e->lfu = 0;
        e->n_in = v->n_in;
        e->n_out = v->n_out;
        memcpy(e->in, v->in, sizeof e->in);
        memcpy(e->out, v->out, sizeof e->out);
        if (reload && e->cur) {
            mts__version *old = e->cur;
            mts__device *od = &s->devs[old->device];
            od->used -= version_bytes(old);
            od->models--;
            old->next = e->draining;
            e->draining = old;
            e->reload_pending = false;
        }
        e->cur = v;
        e->state = MTS_MODEL_READY;
        MTS_INFO("model=%s event=loaded version=%d load=%d device=cpu:%d ms=%.1f bytes=%lld reload=%d", cfg->name,
                 cfg->version > 0 ? cfg->version : 1, v->number, dev, ms, (long long)version_bytes(v), reload ? 1 : 0);
        mts__event_add(s, "loaded", e, dev, "load %d in %.0f ms, %lld bytes%s", v->number, ms,
                       (long long)version_bytes(v), reload ? " (reload)" : "");
        mts__ready_push(s, e);
        /* removed from the repository or marked unavailable while it loaded: queued work
         * finishes, then it unloads */
        if (atomic_load(&e->removed) || e->unavailable[0]) e->state = MTS_MODEL_DRAINING;
        mts__after_idle(s, e, &to_free, &notify);
        mts__enforce_budget(s, dev, e, &to_free);
    }
    if (rc && cfg == e->pending_cfg) {
        e->pending_cfg = NULL;
        if (!e->cur) e->cfg = cfg; /* nothing else to serve: the new version, failed, is the model */
        else MTS_WARN("model=%s event=version_kept version=%d: version %d failed to load", cfg->name, e->cfg->version,
                      cfg->version);
    }
    if (e->pending_cfg && e->pending_cfg != cfg) { /* a newer version arrived during this load */
        if (e->cur && e->state == MTS_MODEL_READY && !e->reload_pending) {
            e->reload_pending = true;
            mts__request_load(s, e);
        } else if (!e->cur && e->state != MTS_MODEL_LOADING) {
            e->cfg = e->pending_cfg;
            e->pending_cfg = NULL;
            e->retry_at_ns = 0;
        }
    }
    char reason[300];
    snprintf(reason, sizeof reason, "model '%s' failed to load: %s", cfg->name, e->reason);
    if (rc && reserved && s->room_waiters > 0) retry_room_waiters(s); /* its reservation is free again */
    pthread_mutex_unlock(&s->lock);
    mts__fail_list(failed, MTS_EUNAVAILABLE, reason);
    mts__notify(notify, rc, rc ? reason : "loaded");
    mts__version_free_list(&to_free);
}

void *mts__loader_main(void *arg)
{
    mts_server *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stop_all) {
        if (s->n_jobs == 0) {
            pthread_cond_wait(&s->load_cv, &s->lock);
            continue;
        }
        mts__entry *e = s->jobs[0];
        memmove(s->jobs, s->jobs + 1, sizeof *s->jobs * (size_t)(s->n_jobs - 1));
        s->n_jobs--;
        pthread_mutex_unlock(&s->lock);
        load_one(s, e);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

void mts__after_idle(mts_server *s, mts__entry *e, mts__version **to_free, mts__waiter **to_notify)
{
    /* Superseded versions go when their last batch ends. */
    mts__version **pv = &e->draining;
    while (*pv) {
        mts__version *v = *pv;
        if (v->refs == 0) {
            *pv = v->next;
            v->next = *to_free;
            *to_free = v;
        } else {
            pv = &v->next;
        }
    }
    if (e->state == MTS_MODEL_DRAINING && e->qlen == 0 && e->running == 0 && (!e->cur || e->cur->refs == 0)) {
        mts__version *v = e->cur;
        int64_t bytes = v ? version_bytes(v) : 0;
        if (v) {
            detach(s, e);
            v->next = *to_free;
            *to_free = v;
        }
        e->state = MTS_MODEL_UNLOADED;
        if (e->pending_cfg) { /* a new version folder arrived while it drained: it loads on use */
            e->cfg = e->pending_cfg;
            e->pending_cfg = NULL;
        }
        MTS_INFO("model=%s event=unloaded version=%d load=%d bytes=%lld", e->cfg->name,
                 e->cfg->version > 0 ? e->cfg->version : 1, v ? v->number : e->versions, (long long)bytes);
        mts__event_add(s, "unloaded", e, -1, "unload request, %lld bytes freed", (long long)bytes);
        mts__waiter *w = e->unload_waiters;
        while (w && w->next) w = w->next;
        if (w) {
            w->next = *to_notify;
            *to_notify = e->unload_waiters;
        }
        e->unload_waiters = NULL;
    }
    if (s->room_waiters > 0 && e->qlen == 0 && e->running == 0) retry_room_waiters(s);
}

int mts_server_load(mts_server *s, const char *model, bool force_reload, mts_server_cb cb, void *user, mts_err *err)
{
    pthread_mutex_lock(&s->lock);
    mts__entry *e = mts__find(s, model);
    int rc = MTS_OK;
    bool done_now = false;
    if (!e) rc = mts_err_set(err, MTS_ENOTFOUND, "unknown model '%s'", model);
    else if (s->stopping) rc = mts_err_set(err, MTS_EUNAVAILABLE, "server is shutting down");
    else if (e->unavailable[0]) rc = mts_err_set(err, MTS_EUNAVAILABLE, "model '%s' is unavailable: %s", model, e->unavailable);
    else if (e->state == MTS_MODEL_DRAINING)
        rc = mts_err_set(err, MTS_EUNAVAILABLE, "model '%s' is being unloaded; load it again when that finishes", model);
    else if (e->state == MTS_MODEL_READY && !force_reload && !e->reload_pending) done_now = true;
    else if ((rc = add_waiter(&e->load_waiters, cb, user))) rc = mts_err_set(err, rc, "out of memory");
    else if (e->state == MTS_MODEL_READY && !e->reload_pending) {
        e->reload_pending = true;
        mts__request_load(s, e);
    } else if (e->state == MTS_MODEL_UNLOADED || e->state == MTS_MODEL_FAILED) {
        mts__request_load(s, e);
    }
    pthread_mutex_unlock(&s->lock);
    if (done_now && cb) cb(user, MTS_OK, "already loaded");
    return rc;
}

int mts_server_unload(mts_server *s, const char *model, mts_server_cb cb, void *user, mts_err *err)
{
    mts__version *to_free = NULL;
    mts__waiter *notify = NULL;
    bool done_now = false;
    int rc = MTS_OK;
    pthread_mutex_lock(&s->lock);
    mts__entry *e = mts__find(s, model);
    if (!e) rc = mts_err_set(err, MTS_ENOTFOUND, "unknown model '%s'", model);
    else if (e->state == MTS_MODEL_LOADING || e->reload_pending)
        rc = mts_err_set(err, MTS_EUNAVAILABLE, "model '%s' is loading; unload it when the load finishes", model);
    else if (e->state == MTS_MODEL_UNLOADED || e->state == MTS_MODEL_FAILED) done_now = true;
    else {
        if (cb && (rc = add_waiter(&e->unload_waiters, cb, user))) rc = mts_err_set(err, rc, "out of memory");
        if (!rc) {
            e->state = MTS_MODEL_DRAINING;
            mts__after_idle(s, e, &to_free, &notify);
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (done_now && cb) cb(user, MTS_OK, "not loaded");
    mts__notify(notify, MTS_OK, "unloaded");
    mts__version_free_list(&to_free);
    return rc;
}

void *mts__janitor_main(void *arg)
{
    mts_server *s = arg;
    uint64_t seen = 0, trimmed_at = 0; /* requests submitted at the last tick, at the last trim */
    int quiet = 0;                     /* ticks since a request was submitted */
    pthread_mutex_lock(&s->lock);
    while (!s->stop_all) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->janitor_cv, &s->lock, &ts);
        if (s->stop_all) continue;
        if (s->room_waiters > 0) retry_room_waiters(s); /* also ends waits past MTS__ROOM_WAIT_NS */
        quiet = s->submitted == seen ? quiet + 1 : 0;
        seen = s->submitted;
#ifdef __GLIBC__
        if (g_trim && quiet >= MTS__TRIM_IDLE_S && trimmed_at != seen) { /* idle after traffic */
            trimmed_at = seen;
            pthread_mutex_unlock(&s->lock);
            malloc_trim(0);
            pthread_mutex_lock(&s->lock);
        }
#endif
        if (s->cfg->idle_timeout_minutes <= 0) continue;
        int64_t limit = (int64_t)(s->cfg->idle_timeout_minutes * 60e9);
        int64_t now = mts__now_ns();
        mts__version *to_free = NULL;
        for (int i = 0; i < s->n_entries; i++) {
            mts__entry *e = &s->entries[i];
            if (evictable(e) && now - e->last_used_ns > limit) evict(s, e, "idle_timeout", &to_free);
        }
        if (to_free) {
            pthread_mutex_unlock(&s->lock);
            mts__version_free_list(&to_free);
            pthread_mutex_lock(&s->lock);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* ---- Run-time changes of the model set (poll mode) ---- */

/* Keeps a configuration handed over at run time until the server is freed (lock held). */
static int own_cfg(mts_server *s, mts_model_config *m)
{
    if (s->n_owned_cfgs == s->cap_owned_cfgs) {
        int cap = s->cap_owned_cfgs ? s->cap_owned_cfgs * 2 : 16;
        mts_model_config **o = realloc(s->owned_cfgs, sizeof *o * (size_t)cap);
        if (!o) return MTS_ENOMEM;
        s->owned_cfgs = o;
        s->cap_owned_cfgs = cap;
    }
    s->owned_cfgs[s->n_owned_cfgs++] = m;
    return MTS_OK;
}

/* Loads an idle model now when its configuration or the control mode says so (lock held). */
static void load_if_eager(mts_server *s, mts__entry *e)
{
    if (s->stopping || e->unavailable[0] || e->state != MTS_MODEL_UNLOADED) return;
    if (e->cfg->preload || e->cfg->pin || s->cfg->model_control == MTS_CONTROL_NONE) mts__request_load(s, e);
}

int mts_server_add_model(mts_server *s, mts_model_config *m, mts_err *err)
{
    char why[256] = "";
    bool missing = mts_server_asset_problem(s, m, why, sizeof why);
    int rc = MTS_OK;
    pthread_mutex_lock(&s->lock);
    mts__entry *e = mts__find_any(s, m->name);
    if (s->stopping) rc = mts_err_set(err, MTS_EUNAVAILABLE, "server is shutting down");
    else if (e && !atomic_load(&e->removed)) rc = mts_err_set(err, MTS_EINVAL, "model '%s' is served already", m->name);
    else if (!e && s->n_entries >= s->cap_entries)
        rc = mts_err_set(err, MTS_ELIMIT,
                         "the model table is full (%d models, at most %d added after start); restart the server "
                         "to serve more",
                         s->n_entries, s->cap_entries - s->cfg->n_models);
    else if (own_cfg(s, m)) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
    if (rc) {
        pthread_mutex_unlock(&s->lock);
        mts_model_config_free(m);
        return rc;
    }
    if (e) { /* back in its old entry, which keeps its statistics */
        e->cfg = m;
        e->pending_cfg = NULL;
        e->fails = 0;
        e->retry_at_ns = 0;
        e->reason[0] = '\0';
        if (e->state == MTS_MODEL_FAILED) e->state = MTS_MODEL_UNLOADED;
        snprintf(e->unavailable, sizeof e->unavailable, "%s", missing ? why : "");
        atomic_store(&e->removed, false);
    } else { /* a fresh slot: filled before its index slot is published to lock-free lookups */
        int idx = s->n_entries;
        e = &s->entries[idx];
        e->cfg = m;
        e->state = MTS_MODEL_UNLOADED;
        snprintf(e->unavailable, sizeof e->unavailable, "%s", missing ? why : "");
        mts__index_add(s, idx);
        s->n_entries = idx + 1;
    }
    mts__event_add(s, "added", e, -1, "version %d%s%s", m->version, missing ? ", unavailable: " : "", missing ? why : "");
    load_if_eager(s, e);
    pthread_mutex_unlock(&s->lock);
    return MTS_OK;
}

int mts_server_update_model(mts_server *s, mts_model_config *m, mts_err *err)
{
    int rc = MTS_OK;
    pthread_mutex_lock(&s->lock);
    mts__entry *e = mts__find(s, m->name);
    if (!e) rc = mts_err_set(err, MTS_ENOTFOUND, "unknown model '%s'", m->name);
    else if (own_cfg(s, m)) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
    if (rc) {
        pthread_mutex_unlock(&s->lock);
        mts_model_config_free(m);
        return rc;
    }
    if (e->cur || e->state == MTS_MODEL_LOADING || e->state == MTS_MODEL_DRAINING) {
        /* the served version answers until m's model is loaded (or, draining, m loads on use) */
        e->pending_cfg = m;
        if (e->cur && e->state == MTS_MODEL_READY && !e->reload_pending) {
            e->reload_pending = true;
            mts__request_load(s, e);
        }
    } else { /* nothing loaded: m is the model from now on */
        e->cfg = m;
        e->pending_cfg = NULL;
        e->fails = 0;
        e->retry_at_ns = 0;
        e->reason[0] = '\0';
        if (e->state == MTS_MODEL_FAILED) e->state = MTS_MODEL_UNLOADED;
        load_if_eager(s, e);
    }
    mts__event_add(s, "new_version", e, -1, "version %d", m->version);
    pthread_mutex_unlock(&s->lock);
    return MTS_OK;
}

int mts_server_remove_model(mts_server *s, const char *name, mts_err *err)
{
    mts__version *to_free = NULL;
    mts__waiter *notify = NULL;
    pthread_mutex_lock(&s->lock);
    mts__entry *e = mts__find(s, name);
    if (!e) {
        pthread_mutex_unlock(&s->lock);
        return mts_err_set(err, MTS_ENOTFOUND, "unknown model '%s'", name);
    }
    atomic_store(&e->removed, true);
    e->pending_cfg = NULL;
    /* a load in progress drains when it ends (load_one) */
    if (e->state == MTS_MODEL_READY && !e->reload_pending) {
        e->state = MTS_MODEL_DRAINING;
        mts__after_idle(s, e, &to_free, &notify);
    }
    mts__event_add(s, "removed", e, -1, "left the repository");
    pthread_mutex_unlock(&s->lock);
    mts__notify(notify, MTS_OK, "unloaded");
    mts__version_free_list(&to_free);
    return MTS_OK;
}

int mts_server_recheck_assets(mts_server *s, const char *name)
{
    pthread_mutex_lock(&s->lock);
    mts__entry *e = mts__find(s, name);
    const mts_model_config *cfg = e ? e->cfg : NULL;
    pthread_mutex_unlock(&s->lock);
    if (!cfg) return 0;
    char why[256] = "";
    bool missing = mts_server_asset_problem(s, cfg, why, sizeof why); /* stat outside the lock */
    mts__version *to_free = NULL;
    mts__waiter *notify = NULL;
    int change = 0;
    pthread_mutex_lock(&s->lock);
    if (e->cfg == cfg && !atomic_load(&e->removed)) { /* else changed meanwhile: the next poll looks again */
        if (missing && !e->unavailable[0]) {
            snprintf(e->unavailable, sizeof e->unavailable, "%s", why);
            change = 1;
            MTS_WARN("model=%s event=unavailable background_dir=%s reason=\"%s\"", cfg->name, cfg->background_dir, why);
            mts__event_add(s, "unavailable", e, -1, "%s", why);
            if (e->state == MTS_MODEL_READY && !e->reload_pending) { /* queued work finishes, then it unloads */
                e->state = MTS_MODEL_DRAINING;
                mts__after_idle(s, e, &to_free, &notify);
            }
        } else if (!missing && e->unavailable[0]) {
            e->unavailable[0] = '\0';
            change = -1;
            MTS_INFO("model=%s event=available background_dir=%s", cfg->name, cfg->background_dir);
            mts__event_add(s, "available", e, -1, "background_dir is back");
            load_if_eager(s, e);
        }
    }
    pthread_mutex_unlock(&s->lock);
    mts__notify(notify, MTS_OK, "unloaded");
    mts__version_free_list(&to_free);
    return change;
}

/* ---- Lip-sync compositing hooks ---- */

int mts_server_bgcache_acquire(mts_server *s, const char *model, mts_bgcache **out, mts_err *err)
{
    *out = NULL;
    int rc = MTS_OK;
    pthread_mutex_lock(&s->lock);
    mts__entry *e = mts__find(s, model);
    if (!e) rc = mts_err_set(err, MTS_ENOTFOUND, "unknown model '%s'", model);
    else if (!e->cfg->background_dir)
        rc = mts_err_set(err, MTS_EUNSUPPORTED,
                         "model '%s' has no background_dir (configure background_dir, crop_rects_path and num_frames "
                         "to composite)", model);
    else if (!e->cur) rc = mts_err_set(err, MTS_EUNAVAILABLE, "model '%s' is not loaded", model);
    else if (!e->cur->bg)
        rc = mts_err_set(err, MTS_EINVAL, "model '%s': background assets are unusable: %s", model, e->cur->bg_error);
    else {
        mts_bgcache_ref(e->cur->bg);
        *out = e->cur->bg;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

mts_workq *mts_server_media_queue(mts_server *s)
{
    pthread_mutex_lock(&s->lock);
    if (!s->media_q && !s->media_closed) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        const char *t = getenv("MTS_MEDIA_THREADS"), *n = getenv("MTS_MEDIA_NICE");
        int threads = t && atoi(t) > 0 ? atoi(t) : (int)(cpus / 4 > 1 ? cpus / 4 : 1);
        mts_err err = {0};
        if (mts_workq_create(threads, n ? atoi(n) : 0, "mts-media", &s->media_q, &err))
            MTS_WARN("event=media_threads_failed error=\"%s\"", err.msg);
        else
            MTS_INFO("event=media_threads_started threads=%d", threads);
    }
    mts_workq *q = s->media_q;
    pthread_mutex_unlock(&s->lock);
    return q;
}
