/*
 * What the parts of `mtserve bench` share (cli_bench.c has the overview): the parsed options
 * (cli_bench.c), the models with their generated inputs and the server statistics read over the
 * control connection (bench_discover.c), the state of one load run and everything it measured
 * (bench_run.c), and the text and JSON reports of a run (bench_report.c).
 */
#ifndef MTS_CLI_BENCH_INTERNAL_H
#define MTS_CLI_BENCH_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "util/json.h"

enum { MODE_CLOSED, MODE_OPEN, MODE_USERS };

typedef struct input_spec {
    char name[128];
    char datatype[16];
    int rank;
    int64_t dims[8];
} input_spec;

typedef struct bench_opts {
    const char *url;
    bool url_set;
    const char *grpc;  /* --grpc host:port */
    int grpc_channels; /* 0: one channel per client thread */
    const char *transport;
    char **models;
    int n_models;
    bool all_models;
    double zipf;
    int64_t batch;
    input_spec specs[MTS_BENCH_MAX_INPUTS];
    int n_specs;
    int concurrency;
    double rate;
    bool poisson;
    int connections, max_connections;
    double duration_s, warmup_s;
    int64_t requests;
    double timeout_ms, server_timeout_ms;
    int users;
    double speak_s, listen_s, wait_s, fps, frame_deadline_ms;
    bool frame_timeout;
    bool find_capacity;
    double level_s, on_time_target;
    int max_users, start_users;
    bool cold_probe;
    uint64_t seed;
    bool json, quiet, server_stats;
    int per_model_rows;
    /* --api lipsync: requests of frames_per_request frames to the lip-sync service; composite:
     * InferBatchComposite (else InferBatch); format of the composited frames; avatar_frames: the
     * background frame count users walk over (0: learned from the first composite reply). */
    bool lipsync, composite, deadline_set, start_zero;
    bool phase_grid; /* users: conversation offsets exactly even (else request phases spread) */
    int frames_per_request, avatar_frames;
    const char *format;
} bench_opts;

/* Users mode: one conversation cycle (speak, listen, wait), and the time between a speaking
 * user's requests (one request's frames at fps), in ms. */
static inline double bench_cycle_ms(const bench_opts *o)
{
    return (o->speak_s + o->listen_s + o->wait_s) * 1e3;
}
static inline double bench_request_period_ms(const bench_opts *o)
{
    return (o->lipsync ? o->frames_per_request : 1) * 1e3 / o->fps;
}

typedef struct bench_model {
    char name[256];
    int n_inputs;
    mts_bench_input inputs[MTS_BENCH_MAX_INPUTS];
    void *prepared;
    /* Lip-sync users: the last request of a speaking phase when the phase's frame count is not a
     * multiple of --frames-per-request (tail_frames frames; NULL when it is). */
    void *prepared_tail;
    int tail_frames;
} bench_model;

typedef struct model_agg {
    uint64_t requests, ok, errors, cold;
    mts_bench_hist *lat; /* allocated on first success */
} model_agg;

/* Everything measured in one run (one level of --find-capacity). */
typedef struct bench_agg {
    uint64_t requests, ok, errors;
    mts_bench_codes codes;
    mts_bench_hist lat, lat_warm, lat_cold, server_queue, server_compute;
    mts_bench_hist lat_sent; /* open loop and users: from the actual send, without the start lag */
    uint64_t n_warm, n_cold, probe_failed;
    uint64_t frames, on_time, late, failed;
    /* lip-sync replies: server times per request, frames and payload bytes received */
    mts_bench_hist server_composite, server_encode, server_background;
    uint64_t resp_frames, resp_bytes;
    double last_done;
    model_agg *per_model;
} bench_agg;

typedef struct bench_run {
    const bench_opts *o;
    const mts_bench_transport *tp;
    const mts_bench_target *target;
    const bench_model *models;
    int n_models;
    const mts_bench_popularity *pop;
    int mode;
    int n_users;
    double t0, t_measure, t_end; /* ms, monotonic; t_end = INFINITY when bounded by requests only */
    pthread_mutex_t lock;
    /* schedule */
    uint64_t claimed;         /* measured jobs handed out */
    double next_time;         /* open loop, poisson */
    uint64_t ticket;          /* open loop: requests scheduled so far */
    uint64_t sched_rng;
    uint64_t frame_ticket;    /* lip-sync, closed and open loop: frames handed out (avatar walk) */
    int avatar_frames;        /* lip-sync: the avatar's frame count, 0 while unknown */
    struct user *users;
    /* pool */
    pthread_t *threads;
    int n_threads, max_threads, spawn_failed;
    uint64_t late_starts, exhausted;
    double max_lag_ms;
    /* results */
    bench_agg a;
    uint64_t done_all, errors_all; /* including warm-up, for the progress line */
    uint64_t no_server_streak;     /* requests in a row that reached no server (any thread) */
    double last_answer;            /* ms: the last response from the server (t0 before any) */
    double cpu_ms;                 /* this process's CPU from the workers' start to their end */
    double prog_t; /* progress line: time and count at the last print */
    uint64_t prog_done;
} bench_run;

typedef struct server_stats {
    bool ok;
    uint64_t loads, evictions;
    int64_t resident_models, resident_bytes;
    uint64_t submitted, completed, rejected_full, timed_out;
} server_stats;

/* Set by SIGINT or when the server is lost: the run stops scheduling and every client ends. */
extern atomic_int mts_bench_stop;
/* Set once the server stopped answering (bench_run.c); mts_bench_lost_msg says how. */
extern atomic_int mts_bench_server_lost;
extern char mts_bench_lost_msg[400];

static inline double mts_bench_now_ms(void)
{
    return mts_cli_now_ms();
}

/* Sleeps until monotonic time t (ms), waking early when the run is stopped. */
void mts_bench_sleep_until(double t);

/* ---- models, inputs and server statistics (bench_discover.c) --------------------------- */

/* Appends the comma-separated names in arg to o->models (--model and the repository index). */
int mts_bench_split_models(const char *arg, bench_opts *o);
/* Bytes per element of a KServe datatype; 0 for types bench cannot generate. */
size_t mts_bench_dtype_size(const char *dt);
/* Fills m->inputs from specs (first -1 dim = batch, others 1) with generated data; each buffer
 * is also appended to owned[*n_owned] for the caller to free. */
int mts_bench_inputs_from_specs(bench_model *m, const input_spec *specs, int n, int64_t batch, uint64_t *rng,
                                void **owned, int *n_owned);
/* Model metadata into input specs: over HTTP (t) or gRPC (target "host:port"). 0, or -1 with a
 * message. */
int mts_bench_fetch_metadata(const mts_bench_target *t, const char *model, input_spec *specs, int *n, char *err,
                             size_t errlen);
int mts_bench_fetch_metadata_grpc(const char *target, const char *model, input_spec *specs, int *n, char *err,
                                  size_t errlen);
/* Every model of the repository index appended to o->models, over HTTP or gRPC. 0, or -1 with a
 * message. */
int mts_bench_fetch_index(const mts_bench_target *t, bench_opts *o, char *err, size_t errlen);
int mts_bench_fetch_index_grpc(const char *target, bench_opts *o, char *err, size_t errlen);
/* GET /v2/models/stats summed over models; s->ok is false when it could not be read. */
void mts_bench_fetch_server_stats(const mts_bench_target *t, server_stats *s);

/* ---- the run (bench_run.c) ------------------------------------------------------------- */

/* Runs one load shape to completion; results in r->a. */
int mts_bench_run_load(bench_run *r, int mode, int n_users, int initial_threads);
void mts_bench_run_free(bench_run *r);

/* ---- reporting (bench_report.c) -------------------------------------------------------- */

void mts_bench_json_latency(mts_jw *w, const char *key, const mts_bench_hist *h);
void mts_bench_json_codes(mts_jw *w, const mts_bench_codes *c);
/* The frame counters of a users run (keys of the enclosing object). */
void mts_bench_json_frames(mts_jw *w, const bench_run *r, int users);
/* The measurements of one run (keys of the enclosing object). */
void mts_bench_json_run(mts_jw *w, const bench_run *r, const bench_model *models);
void mts_bench_text_run(const bench_run *r, const bench_model *models);
/* The "server" object: what changed in the server's statistics between b and e. */
void mts_bench_json_server(mts_jw *w, const server_stats *b, const server_stats *e, double secs);

#endif
