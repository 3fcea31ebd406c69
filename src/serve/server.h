/*
 * The server core: configured models and their residency (registry), CPU devices with memory
 * budgets and workers, per-model bounded queues with dynamic batching (scheduler), and
 * statistics. Front ends (api/) translate wire formats into struct mts_request and call
 * mts_server_submit; everything else about serving lives behind this header.
 *
 * Threads: front-end I/O threads call submit/load/unload/stats; they never block here (loads
 * run on loader threads, inference on device workers). Completions are delivered through the
 * request's callback on a worker or loader thread.
 */
#ifndef MTS_SERVE_SERVER_H
#define MTS_SERVE_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "util/tensor.h"
#include "media/bgcache.h"
#include "util/workq.h"
#include "util/status.h"

typedef struct mts_server mts_server;

#define MTS_REQ_MAX_TENSORS 16

typedef struct mts_request mts_request;
/* Called exactly once per submitted request (unless submit itself failed). status 0: outputs
 * are set; otherwise err_msg says why. Runs on a worker or loader thread. */
#define MTS_TENSOR_NAME_MAX 128 /* longest input/output name kept, with its NUL */

typedef void (*mts_request_done)(mts_request *req, int status, const char *err_msg);

struct mts_request {
    /* Filled by the front end. */
    const char *model;                         /* configured model name */
    int n_inputs;
    const char *input_names[MTS_REQ_MAX_TENSORS];
    mts_tensor inputs[MTS_REQ_MAX_TENSORS];    /* views into the request buffer (not copied) */
    int n_requested;                           /* 0 = all outputs */
    const char *requested[MTS_REQ_MAX_TENSORS];
    int64_t timeout_us;                        /* 0 = server default; enforced before execution */
    int priority;                              /* 0 = the model's level; 1 (first) .. 9 (last): a
                                                * request may lower its priority below its model's,
                                                * never raise it (the server keeps the lower) */
    mts_request_done done;
    void *user;
    /* Set by the server before done(status 0): outputs in model order (or requested order). */
    int n_outputs;
    const char *output_names[MTS_REQ_MAX_TENSORS]; /* point into output_name_buf */
    char output_name_buf[MTS_REQ_MAX_TENSORS][MTS_TENSOR_NAME_MAX]; /* the request's own copies:
                                                * replies may be encoded on another thread after
                                                * the model version is gone */
    mts_tensor outputs[MTS_REQ_MAX_TENSORS];   /* data malloc'd; freed by mts_request_release */
    double queue_ms, compute_ms;               /* time queued (incl. load wait) and in the engine */
    int device;                                /* device that ran it */
    int batch_size;                            /* samples in the batch it ran in */
    bool cold;                                 /* the model was not resident when it arrived */
    bool run_inline;                           /* the front end lets the submitting thread run
                                                * the request's batch itself when it is short
                                                * work the lane would take at once: done may then
                                                * be called before mts_server_submit returns */
    bool prompt;                               /* set by mts_server_submit: run at once, or a
                                                * waiting worker was woken to run it now (a
                                                * front end may skip watching a prompt request
                                                * for cancellation) */
    int64_t arrival_ns;                        /* when the front end received it (mts_server_clock_ns);
                                                * 0: the submit time */
    int threads;                               /* 0: the scheduler decides; else the intra-op threads
                                                * of the batch this request leads (at most the
                                                * device's cores; an embedding_policy entry's) */
    bool alone;                                /* runs as a batch of its own, never merged with
                                                * other requests (an embedding_policy sub-batch) */
    const char *padding_mask;                  /* the name of an input that is a padding mask
                                                * (ones then zeros per row) when the caller ignores
                                                * the outputs at padded positions (the embedding
                                                * path): a batch of such requests runs
                                                * padding-free (engine.h mts_ctx_set_padding_mask) */
    /* Internal. */
    _Atomic int cancelled;
    int64_t enqueue_ns, deadline_ns;
    int64_t samples;
    char *reject_msg;                          /* why validation refused it (malloc'd) */
    bool answered;                             /* its end-to-end time was recorded */
    struct mts_request *next;
};

/* The server's monotonic clock in ns, for mts_request.arrival_ns. */
int64_t mts_server_clock_ns(void);
/* Records a submitted request's end-to-end time (arrival_ns to now) in its model's request
 * duration histogram and counters; front ends call it once the answer (result or error) is
 * handed back to the connection. Later calls for the same request do nothing. */
void mts_server_request_answered(mts_server *s, mts_request *req);

/* Frees output buffers (call after encoding the response). */
void mts_request_release(mts_request *req);
/* Marks a queued request cancelled (client went away); it is dropped before it costs compute
 * and completed with MTS_ECANCELLED. Safe from any thread. */
void mts_request_cancel(mts_request *req);
/* Sets a request's priority from the KServe 'priority' parameter (both front ends): 0 (the
 * model's level) to MTS_PRIORITY_LEVELS. MTS_EINVAL with the reason in msg when out of range. */
int mts_request_set_priority(mts_request *req, int64_t priority, char *msg, size_t len);

/* Takes a finalized config (ownership stays with the caller, which must outlive the server).
 * Starts loader, worker and janitor threads and preloads models marked preload/pin. */
int mts_server_create(const mts_config *cfg, mts_server **out, mts_err *err);
/* Stops accepting, lets queued work finish for up to grace_s seconds, fails what remains with
 * MTS_EUNAVAILABLE, joins threads, frees all models. */
void mts_server_shutdown(mts_server *s, int grace_s);
void mts_server_free(mts_server *s);
const mts_config *mts_server_config(const mts_server *s);

/* Queues a request. Returns 0 (done will be called) or an error without calling done:
 * MTS_ENOTFOUND unknown model, MTS_EFULL queue full (*retry_after_s set), MTS_EUNAVAILABLE
 * shutting down, unloading, or the model's last load failed and it is in back-off (the message
 * has the reason). */
int mts_server_submit(mts_server *s, mts_request *req, int *retry_after_s, mts_err *err);

/* Whether a request for `model` (name of len bytes) would be refused for a full queue right
 * now: MTS_EFULL with submit's message (and the same rejection counted), else 0. Front ends ask
 * it before reading a large request, so that a flood they would refuse is not read at all;
 * every other check stays with mts_server_submit. Always 0 with MTS_EARLY_REFUSAL=0. */
int mts_server_admit(mts_server *s, const char *model, size_t len, mts_err *err);

/* Residency control. The callback (may be NULL) fires once the operation completes, with 0 or
 * an error status and message; it may run before these functions return. */
typedef void (*mts_server_cb)(void *user, int status, const char *msg);
int mts_server_load(mts_server *s, const char *model, bool force_reload, mts_server_cb cb, void *user,
                    mts_err *err);
int mts_server_unload(mts_server *s, const char *model, mts_server_cb cb, void *user, mts_err *err);

/* ---- Run-time changes of the model set (poll mode) ---- */

/* Models that can be added at run time beyond those configured at start (poll mode only; 0
 * otherwise): the entry table is sized once, since entries never move. */
#define MTS_SERVER_ADD_HEADROOM 256
/* Adds a model (a folder that appeared in the repository). Takes ownership of m (malloc'd, freed
 * with mts_model_config_free) in every case. A removed model of the same name is brought back in
 * its old entry. It loads on its first request (at once with preload or pin). MTS_EINVAL when
 * the name is served already, MTS_ELIMIT when the table is full (the message says the cap). */
int mts_server_add_model(mts_server *s, mts_model_config *m, mts_err *err);
/* Replaces a model's configuration with m (another version folder; ownership taken in every
 * case). A resident model keeps serving its current version until m's model is loaded (a failed
 * load keeps the current one); otherwise m applies at once. */
int mts_server_update_model(mts_server *s, mts_model_config *m, mts_err *err);
/* Removes a model from the set (its folder left the repository): new requests get "unknown
 * model"; queued and running ones finish, then it is unloaded. */
int mts_server_remove_model(mts_server *s, const char *name, mts_err *err);
/* Checks a model's lip-sync asset folder again (poll mode): a missing background_dir marks it
 * unavailable (requests, loads and the index report the folder; a resident version is
 * unloaded), one that appeared makes it available (it loads on use, or at once with preload or
 * pin). Returns 1 when it became unavailable, -1 when it became available, 0 otherwise; logs
 * one line per change. */
int mts_server_recheck_assets(mts_server *s, const char *name);
/* Why mc's background_dir is unusable ("background_dir 'm/frames' is missing (...)", named
 * relative to the model repository), or false when it is fine or not configured. */
bool mts_server_asset_problem(const mts_server *s, const mts_model_config *mc, char *why, size_t len);

typedef enum mts_model_state {
    MTS_MODEL_UNLOADED = 0,
    MTS_MODEL_LOADING,
    MTS_MODEL_READY,
    MTS_MODEL_FAILED,
    MTS_MODEL_DRAINING,
    MTS_MODEL_UNAVAILABLE, /* reported only (status snapshots): marked unavailable, e.g. a lip-sync
                            * asset folder is missing; the reason says which */
} mts_model_state;
const char *mts_model_state_name(mts_model_state st);

typedef struct mts_duration_stat {
    uint64_t count, ns;
} mts_duration_stat;

#define MTS_MAX_BATCH_STATS 64

typedef struct mts_tensor_meta {
    char name[MTS_TENSOR_NAME_MAX];
    mts_dtype dtype;
    int rank;
    int64_t dims[MTS_MAX_RANK]; /* -1: variable */
} mts_tensor_meta;

/* A consistent copy of one model's state and statistics. */
typedef struct mts_model_status {
    char name[128];
    mts_model_state state;
    char reason[256];          /* last load failure */
    int device;                /* -1 when not resident */
    int version;               /* load count: 1 for the first load (see model_version) */
    int64_t memory_bytes;      /* MemoryBytes: real bytes held (weights, plans, activations) */
    int64_t loaded_at_ms;      /* LoadedAt, ms since epoch (0 if never) */
    int64_t last_used_ms;      /* LastUsed */
    uint64_t usage_count;      /* UsageCount: requests completed successfully */
    double total_inference_ms; /* TotalInferenceMs: engine time of all batches */
    uint64_t inference_count;  /* samples inferred (KServe inference_count) */
    uint64_t execution_count;  /* batches run */
    mts_duration_stat success, fail, queue, compute_input, compute_infer, compute_output;
    mts_duration_stat batch_infer[MTS_MAX_BATCH_STATS + 1]; /* by batch size */
    int queue_depth, running;
    int max_batch;
    bool no_batching;          /* config.pbtxt max_batch_size 0: no batch dimension */
    bool pinned;
    double last_load_ms;
    uint64_t loads, unloads, evictions, load_failures;
    uint64_t memory_capped_batches; /* batches cut below max_batch to fit the device's free memory */
    uint64_t preempting_batches;    /* batches run between two steps of another model's long batch */
#define MTS_TEAM_STATS 16
    uint64_t team_batches[MTS_TEAM_STATS + 1]; /* batches by intra-op threads (the last: that many or more) */
    uint64_t alone_batches;    /* batches of one request marked alone (embedding_policy sub-batches) */
    uint64_t hinted_batches;   /* batches whose threads came from the request (mts_request.threads) */
    uint64_t padfree_batches;  /* batches that ran padding-free (mts_request.padding_mask) */
    uint64_t padding_rows_skipped; /* token rows those batches did not compute */
    char embedding_policy[256];/* the policy in force, compact form "4:1x2,32:2x1"; "" when none */
    int model_version;         /* the repository version served (mts_server_model_version) */
    int n_inputs, n_outputs;   /* metadata (known once loaded at least once) */
    mts_tensor_meta inputs[MTS_REQ_MAX_TENSORS], outputs[MTS_REQ_MAX_TENSORS];
    /* Lip-sync background cache of the resident version: has_bgcache when it opened;
     * bg_error when the model has background_dir but its assets did not open. */
    bool has_bgcache;
    mts_bgcache_stats bgcache;
    char bg_error[384];
    /* Arithmetic of the resident version (engine.h mts_precision_info); "" when not resident. */
    char precision[8], precision_requested[8];
    char precision_reason[160];
    double guard_error;        /* bf16 guard's relative L2 error; < 0 when not measured */
} mts_model_status;

int mts_server_model_count(const mts_server *s);
/* Models marked unavailable at start because their model file was missing. */
int mts_server_unavailable_at_start(const mts_server *s);
/* True when name is a configured model (cheap; no snapshot). */
bool mts_server_has_model(const mts_server *s, const char *name);
/* The repository version a model serves (its Triton version folder, else 1); 0 if unknown. */
int mts_server_model_version(const mts_server *s, const char *name);
/* Whether a client's version string ("" or NULL: any) names the version the model serves; when
 * it does not, msg gets "model 'm' has no version 'v' (it serves version N)". */
bool mts_server_version_ok(const mts_server *s, const char *name, const char *requested, char *msg, size_t len);
/* By index (configuration order) or by name. */
int mts_server_model_status(mts_server *s, int index, mts_model_status *out);
int mts_server_model_status_by_name(mts_server *s, const char *name, mts_model_status *out);

typedef struct mts_device_status {
    int id;
    int workers, threads, busy_workers, models;
    int64_t bytes_used, bytes_budget;
    int queue_depth;
} mts_device_status;
int mts_server_device_count(const mts_server *s);
void mts_server_device_status(mts_server *s, int id, mts_device_status *out);

typedef struct mts_server_totals {
    uint64_t submitted, completed, failed, rejected_full, timed_out, cancelled;
    int resident_models, queue_depth;
    int64_t resident_bytes;
    double uptime_s;
    bool shutting_down;
} mts_server_totals;
void mts_server_totals_get(mts_server *s, mts_server_totals *out);

/* ---- Lip-sync compositing hooks (src/media) ---- */

/* The background cache of the model's resident version, with a reference the caller drops with
 * mts_bgcache_unref. MTS_ENOTFOUND unknown model; MTS_EUNAVAILABLE not resident (load it
 * first); MTS_EUNSUPPORTED no background_dir configured; MTS_EINVAL its assets did not open
 * (err has the reason). */
int mts_server_bgcache_acquire(mts_server *s, const char *model, mts_bgcache **out, mts_err *err);
/* The media work queue (compositing and encoding off the device workers), started on first
 * use with $MTS_MEDIA_THREADS threads (default: a quarter of the online cores, at least 1) at
 * nice $MTS_MEDIA_NICE (default 0). NULL once shutdown has drained it (callers then do the
 * work inline). */
mts_workq *mts_server_media_queue(mts_server *s);

/* The live dashboard's state document (JSON, malloc'd; NULL when out of memory): server totals,
 * devices, every model with its rates, p50/p99 latency and batch sizes over the last minutes,
 * background-cache and lip-sync capacity figures, and the recent residency events
 * (serve/dashboard.c; the fields are described in docs/server.md, "Dashboard"). */
char *mts_server_dashboard_json(mts_server *s, size_t *len);

/* Prometheus text exposition of every metric. Returns a malloc'd string. */
char *mts_server_metrics(mts_server *s, size_t *len);

#endif
