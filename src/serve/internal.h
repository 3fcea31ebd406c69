/*
 * Internal state of the server core shared by registry.c (residency, loads, eviction),
 * scheduler.c (queues, batching, workers) and stats.c (snapshots, metrics). One mutex,
 * server->lock, guards all of it; critical sections are short (queue hand-offs, state
 * transitions, counters). Loads and inference run outside the lock.
 *
 * Residency state machine of one entry (configured model):
 *
 *   UNLOADED --first request / load / preload--> LOADING --ok--> READY
 *   LOADING --error--> FAILED (reason kept; a request after the back-off retries)
 *   READY --evict / idle timeout (queue empty, nothing running)--> UNLOADED
 *   READY --unload--> DRAINING --queue empty and nothing running--> UNLOADED
 *   READY --load force_reload--> READY with reload_pending; the new version replaces `cur`
 *         when loaded and the old one is freed when its last running batch ends.
 *
 * Invariants: a version with refs > 0 (running batches) is never freed; an entry with queued
 * or running requests is never evicted; `resident` counts entries in LOADING, READY and
 * DRAINING; device->used includes reservations of loads in progress.
 */
#ifndef MTS_SERVE_INTERNAL_H
#define MTS_SERVE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/engine.h"
#include "media/bgcache.h"
#include "util/workq.h"
#include "serve/server.h"

#define MTS__HIST_BUCKETS 16
/* Longest a load blocked by busy, loading or pinned models waits for room (its requests stay
 * queued, each also bounded by its own timeout) before its requests are failed; a queued
 * request whose own deadline is later extends the wait to that deadline. */
#define MTS__ROOM_WAIT_NS (10 * 1000000000LL)
extern const double mts__time_buckets[MTS__HIST_BUCKETS];
#define MTS__BATCH_BUCKETS 8
extern const double mts__batch_buckets[MTS__BATCH_BUCKETS];

typedef struct mts__hist {
    uint64_t counts[MTS__HIST_BUCKETS + 1]; /* last: +Inf */
    uint64_t n;
    double sum;
} mts__hist;

void mts__hist_add(mts__hist *h, const double *bounds, int nb, double v);

/* Dashboard bookkeeping (dashboard.c), all under server->lock, fixed-size and allocation-free:
 * per model a ring of per-second buckets over the last MTS__WIN_SECONDS (request and error
 * counts, request latency and batch-size histograms, engine time), and per server a ring of the
 * last MTS__EVENTS residency events (loads, load failures, evictions, unloads). */
#define MTS__WIN_SECONDS 300
#define MTS__EVENTS 128
typedef struct mts__win_bucket {
    int64_t sec;                          /* monotonic second held; 0 = empty */
    uint32_t ok, err, batches, samples;   /* requests answered / failed, batches and samples run */
    uint32_t lat[MTS__HIST_BUCKETS + 1];  /* request latency, arrival to completion (time buckets) */
    uint32_t bsz[MTS__BATCH_BUCKETS + 1]; /* samples per batch */
    float infer_ms;                       /* engine time of the second's successful batches */
} mts__win_bucket;

typedef struct mts__event {
    uint64_t seq;       /* 1, 2, ...: lets a poller tell new events from seen ones */
    int64_t wall_ms;
    const char *kind;   /* static string: "loaded", "load_failed", "evicted", ... */
    int device;         /* -1 when none */
    char model[96];
    char reason[200];
} mts__event;

typedef struct mts__version {
    mts_model *model;
    struct mts__entry *entry;
    int number;
    int device;
    int64_t base_bytes;   /* model pool + plans + mapped weights at load */
    int64_t ctx_bytes;    /* activation buffers of its contexts */
    int64_t engine_bytes; /* of base_bytes, the engine's (held + mapped): plans, packed weights and
                           * oneDNN primitives made on first use add to it after a batch */
    int64_t transient_bytes; /* plan builds in progress: a load's (the rest of its reservation,
                              * at least the file size, until its first batch ends; parsing reads
                              * the mapping beside the copies, the first plan packs weights beside
                              * them) and those of batches of a size not run before (a plan build
                              * restores the unpacked copies) */
    int64_t file_bytes;      /* the model file's size: what one plan build holds at most */
    uint64_t sizes_run;      /* bit b: a batch of b samples (63: 63 or more) has run */
    uint64_t teams_run;      /* bit t: a batch with a team of t threads (63: 63 or more) has run */
    bool load_transient;     /* transient_bytes holds the load's part */
    int refs;             /* running batches */
    mts_ctx **ctx_free;
    int n_ctx_free, cap_ctx_free;
    bool batchable;       /* every input and output has a variable leading dimension */
    int max_batch;
    int engine_batch;     /* cfg engine_batch when batchable (runs of at most this many), else 0 */
    /* Memory-aware batching: the activation bytes of a context after its largest batch so far
     * (act_samples samples); bytes / samples is the per-sample cost the scheduler budgets. */
    int64_t act_bytes, act_samples;
    int n_in, n_out;
    mts_tensor_meta in[MTS_REQ_MAX_TENSORS], out[MTS_REQ_MAX_TENSORS];
    /* Lip-sync compositing: the background frame cache opened with this version when
     * the model has background_dir, else NULL; bg_error says why opening failed (the model still
     * serves; composites fail with it). base_bytes includes the cache's capacity bytes. */
    mts_bgcache *bg;
    char bg_error[384];
    struct mts__version *next; /* in the entry's draining list */
} mts__version;

typedef struct mts__waiter {
    mts_server_cb cb;
    void *user;
    struct mts__waiter *next;
} mts__waiter;

typedef struct mts__entry {
    /* The served configuration. Replaced (never freed while the server lives) when poll mode
     * picks up a new version folder; read without the lock by the name index and version
     * lookups, hence atomic. */
    const mts_model_config *_Atomic cfg;
    /* A newer configuration (another version folder) waiting for its load: the current version
     * keeps serving until it is loaded (registry.c, mts_server_update_model). */
    const mts_model_config *pending_cfg;
    /* Removed from the repository (poll mode): lookups by name no longer see it; the slot and
     * entry stay (requests in flight keep their pointer) and a folder of the same name that
     * appears later reuses it. */
    _Atomic bool removed;
    /* Marked unavailable (a lip-sync asset folder is missing): requests and loads are refused
     * with this reason; empty when available. */
    char unavailable[256];
    mts_model_state state;
    mts__version *cur;
    mts__version *draining;
    bool reload_pending;
    char reason[256];
    int64_t retry_at_ns;
    int fails;
    /* Load blocked by capacity held by pinned, loading or busy models (not a failure): its
     * requests stay queued and the load is retried when a model goes idle, until
     * MTS__ROOM_WAIT_NS after the first blocked attempt. 0 = not waiting. */
    int64_t room_wait_since_ns;
    bool room_retry; /* a retry of such a load is queued or running */
    mts_request *qh, *qt;
    int qlen, running;
    bool in_ready;
    struct mts__entry *ready_next;
    /* fair sharing of the device (scheduler.c): virtual time = CPU ns charged / weight, and the
     * CPU cost of one sample (ns x threads, moving average; 0 until a batch has run) */
    double vtime, cost_per_sample;
    bool cost_provisional; /* cost_per_sample is from a batch that built a plan or a context */
    bool idle; /* had no queued or running work before its last request: joins at the device's
                * virtual time when next ready */
    mts__waiter *load_waiters, *unload_waiters;
    int versions;
    /* meta of the last loaded version, kept for metadata of unloaded models */
    int n_in, n_out;
    mts_tensor_meta in[MTS_REQ_MAX_TENSORS], out[MTS_REQ_MAX_TENSORS];
    /* statistics */
    int64_t last_used_ns, last_used_ms, loaded_at_ms;
    int64_t last_bytes;     /* largest size a version of this model reached: the next load's estimate */
    /* the precision guard's verdict at the last load ("bf16"/"fp32", "" = none) and what it
     * depends on: a reload with the same key applies it instead of guarding again (registry.c) */
    char guard_verdict[8];
    double guard_error;
    char guard_key[160];
    uint64_t lfu;
    uint64_t usage_count, inference_count, execution_count;
    double total_inference_ms, last_load_ms;
    mts_duration_stat success, fail, queue, compute_input, compute_infer, compute_output;
    mts_duration_stat batch_infer[MTS_MAX_BATCH_STATS + 1];
    uint64_t loads, unloads, evictions, load_failures;
    uint64_t mem_capped;  /* batches cut below max_batch because the device's memory was short */
    uint64_t n_preempt;   /* batches run inside a pause of another model's long batch */
    uint64_t team_batches[MTS_TEAM_STATS + 1]; /* batches by intra-op threads */
    uint64_t alone_batches, hinted_batches; /* see mts_model_status */
    uint64_t padfree_batches, padding_rows_skipped;
    uint64_t n_timeout, n_cancelled, n_rejected;
    /* Per request (a batch's time counted once for each request in it), as Triton's
     * nv_inference_compute_*_duration_us; request_ns: end-to-end time of answered requests. */
    uint64_t req_input_ns, req_infer_ns, req_output_ns, request_ns;
    mts__hist h_queue, h_compute, h_batch, h_load, h_request;
    mts__win_bucket win[MTS__WIN_SECONDS]; /* dashboard window (dashboard.c) */
} mts__entry;

#define MTS__INLINE_MAX 4 /* per device: submitting threads running short work at once */

typedef struct mts__device {
    int id;
    int workers, cores;
    int busy_cores, busy_workers;
    int64_t used, budget;
    int models;
    mts__entry *ready_head, *ready_tail;
    pthread_cond_t cv;    /* regular workers wait here */
    pthread_cond_t lane_cv; /* the short-work lane waits here */
    int lane_waiting;     /* the lane is waiting on lane_cv (under the server lock) */
    uint64_t *w_batches;  /* per worker, the short-work lane last (index `workers`) */
    int64_t *w_busy_ns;
    double vclock;        /* virtual time of the last batch started (fair sharing) */
    double lane_credit_ns;/* the short-work lane's time budget (scheduler.c) */
    int64_t lane_refill_ns;
    atomic_int ready_n;   /* models in the ready list (read without the lock by preemption) */
    struct mts__worker *inline_w; /* MTS__INLINE_MAX workers for short work run by the
                                   * submitting thread (scheduler.c), allocated on first use */
    bool inline_busy[MTS__INLINE_MAX];
    uint64_t inline_batches;      /* batches run that way (also counted as the lane's) */
} mts__device;

typedef struct mts__worker {
    struct mts_server *s;
    int device, index; /* index within the device; index == workers: the short-work lane */
    bool borrowed;     /* a slot for short work on the submitting thread (scheduler.c) */
    /* batch gather buffers, one per input, and batch bookkeeping: [0] for the worker's own
     * batch, [1] for short work it runs while that batch is paused (preemption) */
    void *scratch[2][MTS_REQ_MAX_TENSORS];
    size_t scratch_cap[2][MTS_REQ_MAX_TENSORS];
    struct batch_req *br[2];
} mts__worker;

struct mts_server {
    const mts_config *cfg;
    pthread_mutex_t lock;
    mts__entry *entries;      /* cap_entries slots, never moved: entries may be added at run time */
    _Atomic int n_entries;   /* read without the lock by mts_server_model_count */
    int cap_entries;
    _Atomic int *name_slots; /* open-addressing index into entries (sized for cap_entries); a slot is
                              * published with a release store after its entry is filled, so
                              * lock-free lookups see complete entries */
    size_t name_cap;
    /* Model configurations handed over at run time (added models, new versions): freed with the
     * server, since lock-free readers may still hold a replaced one. */
    mts_model_config **owned_cfgs;
    int n_owned_cfgs, cap_owned_cfgs;
    mts__device *devs;
    int n_devs;
    pthread_t *worker_threads;
    mts__worker *workers;
    int n_workers;
    pthread_t loader_threads[2];
    int n_loaders;
    pthread_t janitor_thread;
    bool janitor_started;
    mts__entry **jobs;
    int n_jobs, cap_jobs;
    pthread_cond_t load_cv, idle_cv, janitor_cv;
    bool stopping, stop_workers, stop_all;
    bool preempt; /* MTS_PREEMPT=1: long batches pause between steps for short work (scheduler.c) */
    bool short_lane;   /* the devices run a short-work lane (MTS_SHORT_LANE=0: not) */
    bool inline_short; /* a request marked run_inline may run on its submitting thread
                        * (MTS_INLINE_SHORT=0: never) */
    bool early_refusal; /* mts_server_admit refuses for a full queue (MTS_EARLY_REFUSAL=0: never) */
    int inline_running; /* batches running on submitting threads (shutdown waits for them) */
    int total_queued;
    int resident;
    int rr_next;
    int room_waiters; /* entries with room_wait_since_ns set */
    int unavailable_at_start; /* models whose file was missing at start */
    int deadline_reqs;
    int64_t last_sweep_ns;
    int64_t start_ns;
    uint64_t submitted, completed, failed, rejected_full, timed_out, cancelled;
    /* Lip-sync compositing: media threads, created on first use (under lock),
     * drained by mts_server_shutdown after the workers have stopped. */
    mts_workq *media_q;
    bool media_closed;
    /* Dashboard: ring of recent residency events (dashboard.c). */
    mts__event events[MTS__EVENTS];
    uint64_t event_seq;
};

int64_t mts__now_ns(void);
int64_t mts__wall_ms(void);
/* The entry named name, NULL when unknown or removed (no lock needed). */
mts__entry *mts__find(const mts_server *s, const char *name);
/* Publishes entry index idx under its name (lock held; the entry is filled). */
void mts__index_add(mts_server *s, int idx);
/* Like mts__find, removed entries included. */
mts__entry *mts__find_any(const mts_server *s, const char *name);

/* registry.c */
void mts__request_load(mts_server *s, mts__entry *e);     /* lock held */
void *mts__loader_main(void *arg);
void *mts__janitor_main(void *arg);
/* Frees a version whose refs are 0 (outside the lock). */
void mts__version_free(mts__version *v);
/* Frees a chain of versions linked through ->next (outside the lock) and empties *list. */
void mts__version_free_list(mts__version **list);
void mts__alloc_policy(void); /* registry.c: allocator settings for churn, at server creation */
/* After a batch ended or a queue emptied: completes an unload if the entry is draining and idle,
 * and detaches a superseded version. Returns versions to free (outside the lock) via *to_free. */
void mts__after_idle(mts_server *s, mts__entry *e, mts__version **to_free, mts__waiter **to_notify);
void mts__notify(mts__waiter *w, int status, const char *msg);
/* Evicts idle models from device dev (never `keep`) while its bytes exceed the budget, e.g.
 * after activation buffers grew (lock held; versions to free are chained on *to_free). */
void mts__enforce_budget(mts_server *s, int dev, const mts__entry *keep, mts__version **to_free);

/* dashboard.c (lock held): window updates at request/batch completion and event records. */
void mts__win_request(mts__entry *e, int64_t now_ns, bool ok, double latency_ms);
void mts__win_error(mts__entry *e, int64_t now_ns); /* a request failed without running */
void mts__win_batch(mts__entry *e, int64_t now_ns, int64_t samples, double infer_ms);
void mts__event_add(mts_server *s, const char *kind, const mts__entry *e, int device, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* scheduler.c */
/* lock held; true when it woke a waiting thread that is to take e's batch now (the lane, or an
 * idle regular worker with e first in line) */
bool mts__ready_push(mts_server *s, mts__entry *e);
void *mts__worker_main(void *arg);
void mts__inline_free(mts__device *d); /* the device's inline worker slots (scheduler.c) */
/* Removes every queued request of e and chains them via ->next (lock held). */
mts_request *mts__drain_queue(mts_server *s, mts__entry *e);
void mts__fail_list(mts_request *list, int status, const char *msg);

#endif
