/*
 * `mtserve bench`: a load generator for a running mtserve (or any KServe v2 server).
 *
 * Load shapes:
 *   closed loop  --concurrency N: N connections, each sending its next request when the last
 *                one answered;
 *   open loop    --rate R: requests are scheduled at fixed (or --poisson) intervals and latency
 *                counts from the intended send time, so a slow server cannot hide its queueing
 *                by slowing the client down (no coordinated omission). A pool of connections
 *                grows up to --max-connections when no connection is free at a scheduled time;
 *                the report says how often that happened and whether the pool was exhausted;
 *   users        --users N conversational users, each cycling speaking (one frame every
 *                1/--fps s for --speak-s), listening (--listen-s) and waiting (--wait-s), with
 *                phases offset evenly across users; each frame has a deadline
 *                (--frame-deadline-ms) and is on time, late or failed. Frames go through the
 *                same open-loop pool (a streaming client does not wait for the previous frame).
 *   --find-capacity ramps users (doubling, then bisection) to the largest count with at least
 *                --on-time-target of frames on time, each level for --level-seconds.
 * Runs are bounded by --duration and/or --requests, after --warmup seconds that are not counted.
 * Models: --model a,b,c or --all-models (repository index), chosen per request (per user in the
 * users mode) uniformly or by Zipf popularity (--zipf S, rank = order given). Inputs come from
 * each model's metadata (the first variable dimension becomes --batch) or from --input specs.
 * --cold-probe asks whether the model is resident (GET .../ready) before each request, so
 * latencies are split into warm and cold (a load was needed). Server statistics are read before
 * and after the run (loads, evictions, resident models and bytes).
 *
 * Output: a live progress line on stderr once per second, then a summary (throughput, latency
 * p50/p90/p99/p99.9/max of successful requests, errors by HTTP status or transport failure,
 * per-model rows) as text or, with --json, one JSON object.
 *
 * The wire protocol is behind mts_bench_transport (bench.h): KServe v2 HTTP with binary tensors
 * (--url, bench_http.c) or KServe v2 gRPC ModelInfer with raw_input_contents (--grpc HOST:PORT,
 * bench_grpc.c; client threads spread over --grpc-channels channels). gRPC errors are counted by
 * status code name. With --grpc alone, metadata and the repository index are read over gRPC and
 * server statistics are skipped; adding --url reads them over HTTP.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "util/json.h"

enum { MODE_CLOSED, MODE_OPEN, MODE_USERS };

#define LAG_MS 2.0 /* a job starting later than this after its intended time found no free connection */

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
} bench_opts;

typedef struct model_info {
    char name[256];
    int n_inputs;
    mts_bench_input inputs[MTS_BENCH_MAX_INPUTS];
    void *prepared;
} model_info;

typedef struct model_agg {
    uint64_t requests, ok, errors, cold;
    mts_bench_hist *lat; /* allocated on first success */
} model_agg;

/* Everything measured in one run (one level of --find-capacity). */
typedef struct agg {
    uint64_t requests, ok, errors;
    mts_bench_codes codes;
    mts_bench_hist lat, lat_warm, lat_cold, server_queue, server_compute;
    uint64_t n_warm, n_cold, probe_failed;
    uint64_t frames, on_time, late, failed;
    double last_done;
    model_agg *per_model;
} agg;

typedef struct user {
    double cycle_start; /* ms: position 0 of the current (or next) cycle */
    int64_t k;          /* next frame within the speaking phase */
    int model;
} user;

typedef struct job {
    double intended;
    int model;
    bool measured, frame;
} job;

typedef struct run {
    const bench_opts *o;
    const mts_bench_transport *tp;
    const mts_bench_target *target;
    const model_info *models;
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
    user *users;
    /* pool */
    pthread_t *threads;
    int n_threads, max_threads, spawn_failed;
    uint64_t late_starts, exhausted;
    double max_lag_ms;
    /* results */
    agg a;
    uint64_t done_all, errors_all; /* including warm-up, for the progress line */
    uint64_t no_server_streak;     /* requests in a row that reached no server (any thread) */
    double last_answer;            /* ms: the last response from the server (t0 before any) */
    double prog_t; /* progress line: time and count at the last print */
    uint64_t prog_done;
} run;

static atomic_int g_stop;

/* A dead server: after this many requests in a row (over all clients) reached no server, and at
 * least this long without any response, the run stops with an error instead of counting refused
 * connections as requests. Meanwhile a client whose request found no server waits a little before
 * the next, so a dead port is not hammered. */
#define LOST_STREAK 32
#define LOST_MS 1000.0
#define LOST_PAUSE_MS 20.0
static atomic_int g_server_lost;
static char g_lost_msg[400]; /* written once, by the thread that sets g_server_lost */

static void on_sigint(int sig)
{
    (void)sig;
    atomic_store(&g_stop, 1);
}

static double now_ms(void)
{
    return mts_cli_now_ms();
}

static void sleep_until(double t)
{
    for (;;) {
        double d = t - now_ms();
        if (d <= 0 || atomic_load(&g_stop)) return;
        if (d > 100) d = 100;
        struct timespec ts = {(time_t)(d / 1e3), (long)(fmod(d, 1e3) * 1e6)};
        nanosleep(&ts, NULL);
    }
}

/* ---- options --------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mtserve bench [--url http://HOST:PORT | --grpc HOST:PORT] (--model A,B,... | --all-models)\n"
            "                     [options]\n"
            "\n"
            "transport: --url http://HOST:PORT  KServe v2 HTTP, binary tensors (default http://127.0.0.1:8000)\n"
            "           --grpc HOST:PORT        KServe v2 gRPC ModelInfer, raw_input_contents (port 50051 if\n"
            "                                   omitted); with --url too, metadata/stats go over HTTP\n"
            "             --grpc-channels K     client threads share K channels (TCP connections), default 4;\n"
            "                                   0 = one channel per client thread\n"
            "\n"
            "load (one of):\n"
            "  --concurrency N        closed loop with N connections (default 1)\n"
            "  --rate R               open loop, R requests/s; latency from the intended send time\n"
            "    --poisson            exponential inter-arrival times instead of fixed ones\n"
            "    --connections N      initial connection pool (default 8; grows on demand)\n"
            "    --max-connections M  pool limit (default 512); reaching it is reported\n"
            "  --users N              conversational users (open loop of frames)\n"
            "    --speak-s 4 --listen-s 7 --wait-s 4 --fps 25 --frame-deadline-ms 200\n"
            "    --frame-timeout      also give the server each frame's deadline (stale frames dropped)\n"
            "  --find-capacity        ramp users to the largest count with >= --on-time-target (0.99)\n"
            "                         frames on time; --level-seconds S (default one cycle),\n"
            "                         --start-users N (1), --max-users N (1024)\n"
            "bounds: --duration S (default 10; users: one cycle), --requests N, --warmup S (default 0)\n"
            "models: --zipf S (popularity exponent, 0 = uniform), --batch B (default 1),\n"
            "        --input NAME:DATATYPE:D1,D2,... (repeatable; -1 = batch; skips metadata)\n"
            "other:  --timeout-ms T (client, default 30000), --server-timeout-ms T (timeout parameter),\n"
            "        --cold-probe (split latency by model residency), --no-server-stats, --seed N,\n"
            "        --json, --quiet (no progress line), --per-model-rows N (20)\n");
}

static int parse_spec(const char *s, input_spec *sp)
{
    memset(sp, 0, sizeof *sp);
    const char *c1 = strchr(s, ':');
    const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c1 || !c2 || c1 == s || (size_t)(c1 - s) >= sizeof sp->name || (size_t)(c2 - c1 - 1) >= sizeof sp->datatype)
        return -1;
    memcpy(sp->name, s, (size_t)(c1 - s));
    memcpy(sp->datatype, c1 + 1, (size_t)(c2 - c1 - 1));
    const char *p = c2 + 1;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < -1 || sp->rank >= 8) return -1;
        sp->dims[sp->rank++] = v;
        p = end;
        if (*p == ',' || *p == 'x') p++;
        else if (*p) return -1;
    }
    return sp->rank > 0 ? 0 : -1;
}

static size_t dtype_size(const char *dt)
{
    if (!strcmp(dt, "FP32") || !strcmp(dt, "INT32") || !strcmp(dt, "UINT32")) return 4;
    if (!strcmp(dt, "INT64") || !strcmp(dt, "UINT64") || !strcmp(dt, "FP64")) return 8;
    if (!strcmp(dt, "FP16") || !strcmp(dt, "INT16") || !strcmp(dt, "UINT16") || !strcmp(dt, "BF16")) return 2;
    if (!strcmp(dt, "INT8") || !strcmp(dt, "UINT8") || !strcmp(dt, "BOOL")) return 1;
    return 0;
}

static int split_models(const char *arg, bench_opts *o)
{
    char *copy = strdup(arg);
    if (!copy) return -1;
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char **nm = realloc(o->models, (size_t)(o->n_models + 1) * sizeof *nm);
        if (!nm) {
            free(copy);
            return -1;
        }
        o->models = nm;
        o->models[o->n_models++] = strdup(t);
    }
    free(copy);
    return 0;
}

static bool num_arg(const char *s, double *out, double lo)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo) || !isfinite(v)) return false;
    *out = v;
    return true;
}

static int parse_args(int argc, char **argv, bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->url = "http://127.0.0.1:8000";
    o->transport = "http";
    o->grpc_channels = 4;
    o->batch = 1;
    o->connections = 8;
    o->max_connections = 512;
    o->duration_s = -1;
    o->requests = 0;
    o->timeout_ms = 30000;
    o->speak_s = 4;
    o->listen_s = 7;
    o->wait_s = 4;
    o->fps = 25;
    o->frame_deadline_ms = 200;
    o->level_s = -1;
    o->on_time_target = 0.99;
    o->max_users = 1024;
    o->start_users = 1;
    o->seed = 1;
    o->server_stats = true;
    o->per_model_rows = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
#define NEED()                                                                \
    do {                                                                      \
        if (!v) {                                                             \
            fprintf(stderr, "mtserve bench: %s needs a value\n", a);          \
            return 2;                                                         \
        }                                                                     \
        i++;                                                                  \
    } while (0)
#define NUM(lo, dst)                                                                        \
    do {                                                                                    \
        NEED();                                                                             \
        if (!num_arg(v, &d, lo)) {                                                          \
            fprintf(stderr, "mtserve bench: %s: '%s' is not a number >= %g\n", a, v, (double)(lo)); \
            return 2;                                                                       \
        }                                                                                   \
        dst = d;                                                                            \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--url")) {
            NEED();
            o->url = v;
            o->url_set = true;
        } else if (!strcmp(a, "--grpc")) {
            NEED();
            o->grpc = v;
            o->transport = "grpc";
        } else if (!strcmp(a, "--grpc-channels")) {
            NUM(0, o->grpc_channels);
        } else if (!strcmp(a, "--transport")) {
            NEED();
            o->transport = v;
        } else if (!strcmp(a, "--model") || !strcmp(a, "-m")) {
            NEED();
            if (split_models(v, o)) return 2;
        } else if (!strcmp(a, "--all-models")) {
            o->all_models = true;
        } else if (!strcmp(a, "--zipf")) {
            NUM(0, o->zipf);
        } else if (!strcmp(a, "--batch")) {
            NUM(1, o->batch);
        } else if (!strcmp(a, "--input")) {
            NEED();
            if (o->n_specs >= MTS_BENCH_MAX_INPUTS || parse_spec(v, &o->specs[o->n_specs])) {
                fprintf(stderr, "mtserve bench: --input '%s': expected NAME:DATATYPE:D1,D2,...\n", v);
                return 2;
            }
            if (!dtype_size(o->specs[o->n_specs].datatype)) {
                fprintf(stderr, "mtserve bench: --input '%s': unknown datatype\n", v);
                return 2;
            }
            o->n_specs++;
        } else if (!strcmp(a, "--concurrency") || !strcmp(a, "-c")) {
            NUM(1, o->concurrency);
        } else if (!strcmp(a, "--rate")) {
            NUM(0.001, o->rate);
        } else if (!strcmp(a, "--poisson")) {
            o->poisson = true;
        } else if (!strcmp(a, "--connections")) {
            NUM(1, o->connections);
        } else if (!strcmp(a, "--max-connections")) {
            NUM(1, o->max_connections);
        } else if (!strcmp(a, "--duration") || !strcmp(a, "-d")) {
            NUM(0.001, o->duration_s);
        } else if (!strcmp(a, "--requests") || !strcmp(a, "-n")) {
            NUM(1, o->requests);
        } else if (!strcmp(a, "--warmup")) {
            NUM(0, o->warmup_s);
        } else if (!strcmp(a, "--timeout-ms")) {
            NUM(1, o->timeout_ms);
        } else if (!strcmp(a, "--server-timeout-ms")) {
            NUM(0, o->server_timeout_ms);
        } else if (!strcmp(a, "--users")) {
            NUM(1, o->users);
        } else if (!strcmp(a, "--speak-s")) {
            NUM(0.001, o->speak_s);
        } else if (!strcmp(a, "--listen-s")) {
            NUM(0, o->listen_s);
        } else if (!strcmp(a, "--wait-s")) {
            NUM(0, o->wait_s);
        } else if (!strcmp(a, "--fps")) {
            NUM(0.001, o->fps);
        } else if (!strcmp(a, "--frame-deadline-ms")) {
            NUM(0.001, o->frame_deadline_ms);
        } else if (!strcmp(a, "--frame-timeout")) {
            o->frame_timeout = true;
        } else if (!strcmp(a, "--find-capacity")) {
            o->find_capacity = true;
        } else if (!strcmp(a, "--level-seconds")) {
            NUM(0.001, o->level_s);
        } else if (!strcmp(a, "--on-time-target")) {
            NUM(0, o->on_time_target);
        } else if (!strcmp(a, "--max-users")) {
            NUM(1, o->max_users);
        } else if (!strcmp(a, "--start-users")) {
            NUM(1, o->start_users);
        } else if (!strcmp(a, "--cold-probe")) {
            o->cold_probe = true;
        } else if (!strcmp(a, "--no-server-stats")) {
            o->server_stats = false;
        } else if (!strcmp(a, "--seed")) {
            NUM(0, d);
            o->seed = (uint64_t)d;
        } else if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            o->quiet = true;
        } else if (!strcmp(a, "--per-model-rows")) {
            NUM(0, o->per_model_rows);
        } else {
            fprintf(stderr, "mtserve bench: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
#undef NUM
#undef NEED
    }
    if (!o->n_models && !o->all_models) {
        fprintf(stderr, "mtserve bench: name the models with --model A,B,... or --all-models\n");
        return 2;
    }
    int shapes = (o->concurrency > 0) + (o->rate > 0) + (o->users > 0 || o->find_capacity);
    if (shapes > 1) {
        fprintf(stderr, "mtserve bench: choose one of --concurrency, --rate and --users/--find-capacity\n");
        return 2;
    }
    if (o->on_time_target > 1) {
        fprintf(stderr, "mtserve bench: --on-time-target is a fraction in [0,1]\n");
        return 2;
    }
    if (o->max_connections < o->connections) o->max_connections = o->connections;
    if (o->seed == 0) o->seed = 1;
    return 0;
}

/* ---- models ---------------------------------------------------------------------------- */

static void fill_random(void *data, size_t nbytes, const char *dt, uint64_t *rng)
{
    if (!strcmp(dt, "FP32")) {
        float *f = data;
        for (size_t i = 0; i < nbytes / 4; i++) f[i] = (float)mts_bench_rand01(rng);
    } else if (!strcmp(dt, "BOOL")) {
        uint8_t *b = data;
        for (size_t i = 0; i < nbytes; i++) b[i] = (uint8_t)(mts_bench_rand(rng) & 1);
    } else {
        memset(data, 0, nbytes); /* integers: zeros are valid indices and ids */
    }
}

/* Fills m->inputs from specs (first -1 dim = batch, others 1). */
static int inputs_from_specs(model_info *m, const input_spec *specs, int n, int64_t batch, uint64_t *rng,
                             void **owned, int *n_owned)
{
    m->n_inputs = n;
    for (int i = 0; i < n; i++) {
        mts_bench_input *in = &m->inputs[i];
        memset(in, 0, sizeof *in);
        snprintf(in->name, sizeof in->name, "%s", specs[i].name);
        snprintf(in->datatype, sizeof in->datatype, "%s", specs[i].datatype);
        in->rank = specs[i].rank;
        size_t numel = 1;
        bool batch_used = false;
        for (int d = 0; d < in->rank; d++) {
            int64_t v = specs[i].dims[d];
            if (v < 0) {
                v = batch_used ? 1 : batch;
                batch_used = true;
            }
            in->dims[d] = v;
            numel *= (size_t)v;
        }
        size_t es = dtype_size(in->datatype);
        if (!es) return -1;
        in->nbytes = numel * es;
        void *data = malloc(in->nbytes ? in->nbytes : 1);
        if (!data) return -1;
        fill_random(data, in->nbytes, in->datatype, rng);
        in->data = data;
        owned[(*n_owned)++] = data;
    }
    return 0;
}

/* ModelMetadata over gRPC into input specs. 0, or -1 with a message. */
static int fetch_metadata_grpc(const char *target, const char *model, input_spec *specs, int *n, char *err,
                               size_t errlen)
{
    mts_bench_input ins[MTS_BENCH_MAX_INPUTS];
    if (mts_bench_grpc_metadata(target, model, ins, MTS_BENCH_MAX_INPUTS, n, err, errlen)) return -1;
    for (int i = 0; i < *n; i++) {
        input_spec *sp = &specs[i];
        memset(sp, 0, sizeof *sp);
        snprintf(sp->name, sizeof sp->name, "%s", ins[i].name);
        snprintf(sp->datatype, sizeof sp->datatype, "%s", ins[i].datatype);
        sp->rank = ins[i].rank;
        memcpy(sp->dims, ins[i].dims, sizeof sp->dims);
        if (!dtype_size(sp->datatype)) {
            snprintf(err, errlen, "input '%s' has datatype %s, which bench cannot generate", sp->name, sp->datatype);
            return -1;
        }
    }
    return 0;
}

static int fetch_index_grpc(const char *target, bench_opts *o, char *err, size_t errlen)
{
    char **names = NULL;
    int n = 0, ret = 0;
    if (mts_bench_grpc_index(target, &names, &n, err, errlen)) return -1;
    for (int i = 0; i < n; i++) {
        if (!ret && split_models(names[i], o)) ret = -1;
        free(names[i]);
    }
    free(names);
    if (!ret && o->n_models == 0) {
        snprintf(err, errlen, "the repository index lists no models");
        ret = -1;
    }
    return ret;
}

/* Reads GET /v2/models/NAME into input specs. 0, or -1 with a message. */
static int fetch_metadata(const mts_bench_target *t, const char *model, input_spec *specs, int *n, char *err,
                          size_t errlen)
{
    char path[400];
    snprintf(path, sizeof path, "/v2/models/%s", model);
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    int rc = mts_bench_http_simple(t, "GET", path, NULL, 120000, &status, &body, &len, err, errlen);
    if (rc) return -1;
    mts_json_doc *doc = NULL;
    mts_err e = {0};
    int ret = -1;
    if (mts_json_parse(body, len, &doc, &e)) {
        snprintf(err, errlen, "HTTP %d, unreadable metadata", status);
        goto out;
    }
    const mts_json *root = mts_json_root(doc);
    if (status != 200) {
        const char *m = mts_json_str(mts_json_get(root, "error"), NULL);
        snprintf(err, errlen, "HTTP %d: %s", status, m ? m : "?");
        goto out;
    }
    const mts_json *ins = mts_json_get(root, "inputs");
    *n = 0;
    for (size_t i = 0; i < mts_json_len(ins) && *n < MTS_BENCH_MAX_INPUTS; i++) {
        const mts_json *in = mts_json_at(ins, i);
        input_spec *sp = &specs[(*n)++];
        memset(sp, 0, sizeof *sp);
        snprintf(sp->name, sizeof sp->name, "%s", mts_json_str(mts_json_get(in, "name"), NULL) ? mts_json_str(mts_json_get(in, "name"), NULL) : "");
        const char *dt = mts_json_str(mts_json_get(in, "datatype"), NULL);
        snprintf(sp->datatype, sizeof sp->datatype, "%s", dt ? dt : "FP32");
        const mts_json *shape = mts_json_get(in, "shape");
        for (size_t d = 0; d < mts_json_len(shape) && sp->rank < 8; d++) {
            int64_t v = -1;
            if (mts_json_int(mts_json_at(shape, d), &v)) v = -1;
            sp->dims[sp->rank++] = v < 0 ? -1 : v;
        }
        if (!dtype_size(sp->datatype)) {
            snprintf(err, errlen, "input '%s' has datatype %s, which bench cannot generate", sp->name, sp->datatype);
            goto out;
        }
    }
    ret = 0;
out:
    mts_json_free(doc);
    free(body);
    return ret;
}

static int fetch_index(const mts_bench_target *t, bench_opts *o, char *err, size_t errlen)
{
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    if (mts_bench_http_simple(t, "POST", "/v2/repository/index", "{}", 30000, &status, &body, &len, err, errlen))
        return -1;
    mts_json_doc *doc = NULL;
    mts_err e = {0};
    int ret = -1;
    if (status != 200 || mts_json_parse(body, len, &doc, &e)) {
        snprintf(err, errlen, "repository index: HTTP %d", status);
        goto out;
    }
    const mts_json *root = mts_json_root(doc);
    for (size_t i = 0; i < mts_json_len(root); i++) {
        const char *nm = mts_json_str(mts_json_get(mts_json_at(root, i), "name"), NULL);
        if (nm && split_models(nm, o)) goto out;
    }
    ret = o->n_models > 0 ? 0 : -1;
    if (ret) snprintf(err, errlen, "the repository index lists no models");
out:
    mts_json_free(doc);
    free(body);
    return ret;
}

/* ---- server statistics ----------------------------------------------------------------- */

typedef struct server_stats {
    bool ok;
    uint64_t loads, evictions;
    int64_t resident_models, resident_bytes;
    uint64_t submitted, completed, rejected_full, timed_out;
} server_stats;

static void fetch_server_stats(const mts_bench_target *t, server_stats *s)
{
    memset(s, 0, sizeof *s);
    int status = 0;
    char *body = NULL;
    size_t len = 0;
    char err[200];
    if (mts_bench_http_simple(t, "GET", "/v2/models/stats", NULL, 30000, &status, &body, &len, err, sizeof err))
        return;
    mts_json_doc *doc = NULL;
    mts_err e = {0};
    if (status == 200 && !mts_json_parse(body, len, &doc, &e)) {
        const mts_json *root = mts_json_root(doc);
        const mts_json *ms = mts_json_get(root, "model_stats");
        for (size_t i = 0; i < mts_json_len(ms); i++) {
            int64_t v;
            const mts_json *m = mts_json_at(ms, i);
            if (!mts_json_int(mts_json_get(m, "loads"), &v)) s->loads += (uint64_t)v;
            if (!mts_json_int(mts_json_get(m, "evictions"), &v)) s->evictions += (uint64_t)v;
        }
        const mts_json *srv = mts_json_get(root, "server");
        int64_t v;
        if (!mts_json_int(mts_json_get(srv, "resident_models"), &v)) s->resident_models = v;
        if (!mts_json_int(mts_json_get(srv, "resident_bytes"), &v)) s->resident_bytes = v;
        if (!mts_json_int(mts_json_get(srv, "submitted"), &v)) s->submitted = (uint64_t)v;
        if (!mts_json_int(mts_json_get(srv, "completed"), &v)) s->completed = (uint64_t)v;
        if (!mts_json_int(mts_json_get(srv, "rejected_queue_full"), &v)) s->rejected_full = (uint64_t)v;
        if (!mts_json_int(mts_json_get(srv, "timed_out"), &v)) s->timed_out = (uint64_t)v;
        s->ok = true;
    }
    mts_json_free(doc);
    free(body);
}

/* ---- the run --------------------------------------------------------------------------- */

static int pick_model(run *r, uint64_t *rng)
{
    return r->n_models == 1 ? 0 : mts_bench_popularity_pick(r->pop, mts_bench_rand01(rng));
}

static bool next_job(run *r, job *j, uint64_t *rng)
{
    if (atomic_load(&g_stop)) return false;
    bool got = false;
    pthread_mutex_lock(&r->lock);
    j->frame = false;
    if (r->mode == MODE_CLOSED) {
        double t = now_ms();
        j->intended = t;
        j->measured = t >= r->t_measure;
        if (t < r->t_end && !(j->measured && r->o->requests > 0 && r->claimed >= (uint64_t)r->o->requests)) {
            if (j->measured) r->claimed++;
            j->model = pick_model(r, rng);
            got = true;
        }
    } else if (r->mode == MODE_OPEN) {
        /* fixed intervals: t0 + i / rate (no accumulated rounding); poisson: running sum */
        double t = r->o->poisson ? r->next_time : r->t0 + (double)r->ticket * 1e3 / r->o->rate;
        j->intended = t;
        j->measured = t >= r->t_measure - 1e-6;
        if (t < r->t_end - 1e-6 && !(j->measured && r->o->requests > 0 && r->claimed >= (uint64_t)r->o->requests)) {
            if (j->measured) r->claimed++;
            r->ticket++;
            if (r->o->poisson) r->next_time = t - log(1.0 - mts_bench_rand01(&r->sched_rng)) * 1e3 / r->o->rate;
            j->model = pick_model(r, &r->sched_rng);
            got = true;
        }
    } else {
        int best = 0;
        for (int u = 1; u < r->n_users; u++) {
            double tu = r->users[u].cycle_start + (double)r->users[u].k * 1e3 / r->o->fps;
            double tb = r->users[best].cycle_start + (double)r->users[best].k * 1e3 / r->o->fps;
            if (tu < tb) best = u;
        }
        user *u = &r->users[best];
        double t = u->cycle_start + (double)u->k * 1e3 / r->o->fps;
        j->intended = t;
        j->measured = t >= r->t_measure - 1e-6;
        j->frame = true;
        if (t < r->t_end - 1e-6) {
            j->model = u->model;
            u->k++;
            if ((double)u->k * 1e3 / r->o->fps >= r->o->speak_s * 1e3 - 1e-9) {
                u->k = 0;
                u->cycle_start += (r->o->speak_s + r->o->listen_s + r->o->wait_s) * 1e3;
            }
            got = true;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return got;
}

static void *worker_main(void *arg);

/* With r->lock held. */
static void spawn_worker(run *r)
{
    if (r->n_threads >= r->max_threads) return;
    if (pthread_create(&r->threads[r->n_threads], NULL, worker_main, r)) {
        r->spawn_failed++;
        r->max_threads = r->n_threads; /* no more: the pool is as large as it gets */
        return;
    }
    r->n_threads++;
}

static void note_lag(run *r, double lag, bool measured)
{
    pthread_mutex_lock(&r->lock);
    if (measured) {
        r->late_starts++;
        if (lag > r->max_lag_ms) r->max_lag_ms = lag;
    }
    if (r->n_threads < r->max_threads) spawn_worker(r);
    else if (measured) r->exhausted++;
    pthread_mutex_unlock(&r->lock);
}

/* Counts one response. Returns true when the request reached no server and the last
 * LOST_STREAK did not either: the client should pause before its next request. */
static bool record(run *r, const job *j, const mts_bench_result *res, double latency_ms, int cold)
{
    bool ok = res->status >= 200 && res->status < 300;
    char key[24];
    if (!ok) {
        if (res->code[0]) snprintf(key, sizeof key, "%s", res->code);
        else if (res->status) snprintf(key, sizeof key, "%d", res->status);
        else snprintf(key, sizeof key, "%s", mts_bench_error_name(res->transport_error));
    }
    double us = latency_ms * 1e3;
    pthread_mutex_lock(&r->lock);
    r->done_all++;
    if (!ok) r->errors_all++;
    double t = now_ms(), silent_ms = t - (r->last_answer > 0 ? r->last_answer : r->t0);
    bool pause = res->no_server && r->no_server_streak + 1 >= LOST_STREAK;
    if (!res->no_server) {
        r->no_server_streak = 0;
        r->last_answer = t;
    } else if (++r->no_server_streak >= LOST_STREAK && silent_ms >= LOST_MS && !atomic_load(&g_server_lost)) {
        snprintf(g_lost_msg, sizeof g_lost_msg,
                 "the server stopped answering: %llu requests in a row over %.1f s reached no server (last: %s); "
                 "stopping",
                 (unsigned long long)r->no_server_streak, silent_ms / 1e3,
                 res->msg[0] ? res->msg : mts_bench_error_name(res->transport_error));
        atomic_store(&g_server_lost, 1);
        atomic_store(&g_stop, 1);
    }
    if (j->measured) {
        agg *a = &r->a;
        model_agg *m = &a->per_model[j->model];
        a->requests++;
        m->requests++;
        double done = now_ms();
        if (done > a->last_done) a->last_done = done;
        if (ok) {
            a->ok++;
            m->ok++;
            mts_bench_hist_add(&a->lat, us);
            if (!m->lat && (m->lat = malloc(sizeof *m->lat))) mts_bench_hist_init(m->lat);
            if (m->lat) mts_bench_hist_add(m->lat, us);
            if (cold == 1) {
                a->n_cold++;
                m->cold++;
                mts_bench_hist_add(&a->lat_cold, us);
            } else if (cold == 0) {
                a->n_warm++;
                mts_bench_hist_add(&a->lat_warm, us);
            } else if (cold == -2) {
                a->probe_failed++;
            }
            if (res->queue_ms >= 0) mts_bench_hist_add(&a->server_queue, res->queue_ms * 1e3);
            if (res->compute_ms >= 0) mts_bench_hist_add(&a->server_compute, res->compute_ms * 1e3);
        } else {
            a->errors++;
            m->errors++;
            mts_bench_codes_add(&a->codes, key, res->msg, 1);
        }
        if (j->frame) {
            a->frames++;
            if (!ok) a->failed++;
            else if (latency_ms <= r->o->frame_deadline_ms) a->on_time++;
            else a->late++;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return pause;
}

static void *worker_main(void *arg)
{
    run *r = arg;
    pthread_mutex_lock(&r->lock);
    uint64_t rng = r->o->seed * UINT64_C(0x9E3779B97F4A7C15) + (uint64_t)r->n_threads * 7919 + 1;
    pthread_mutex_unlock(&r->lock);
    void *conn = r->tp->connect(r->target);
    if (!conn) return NULL;
    sleep_until(r->t0); /* all connections open before the clock starts */
    job j;
    while (next_job(r, &j, &rng)) {
        if (r->mode != MODE_CLOSED) {
            sleep_until(j.intended);
            if (atomic_load(&g_stop)) break;
            double lag = now_ms() - j.intended;
            if (lag > LAG_MS) note_lag(r, lag, j.measured);
        }
        const model_info *m = &r->models[j.model];
        int cold = -1; /* not probed */
        double probe_ms = 0;
        if (r->o->cold_probe && r->tp->model_ready) {
            double p0 = now_ms();
            int ready = r->tp->model_ready(conn, m->name, r->o->timeout_ms);
            probe_ms = now_ms() - p0;
            cold = ready == 1 ? 0 : ready == 0 ? 1 : -2;
        }
        double start = r->mode == MODE_CLOSED ? now_ms() : j.intended + probe_ms;
        mts_bench_result res;
        r->tp->infer(conn, m->prepared, r->o->timeout_ms, &res);
        if (record(r, &j, &res, now_ms() - start, cold)) sleep_until(now_ms() + LOST_PAUSE_MS);
    }
    r->tp->close(conn);
    return NULL;
}

static void print_progress(run *r, bool final)
{
    double t = now_ms();
    pthread_mutex_lock(&r->lock);
    uint64_t done = r->done_all, errs = r->errors_all;
    double p99 = mts_bench_hist_quantile(&r->a.lat, 0.99) / 1e3;
    uint64_t frames = r->a.frames, on_time = r->a.on_time;
    int threads = r->n_threads;
    pthread_mutex_unlock(&r->lock);
    if (!r->prog_t) r->prog_t = r->t0;
    double rps = final ? (t > r->t0 ? (double)done * 1e3 / (t - r->t0) : 0) : t > r->prog_t ? (double)(done - r->prog_done) * 1e3 / (t - r->prog_t) : 0;
    r->prog_t = t;
    r->prog_done = done;
    char extra[96] = "";
    if (r->mode == MODE_USERS)
        snprintf(extra, sizeof extra, "  users %d  on time %.1f%%", r->n_users,
                 frames ? 100.0 * (double)on_time / (double)frames : 100.0);
    else if (r->mode == MODE_OPEN)
        snprintf(extra, sizeof extra, "  conns %d", threads);
    bool tty = isatty(2);
    fprintf(stderr, "%s[%6.1fs%s] requests %llu  rps %.1f  p99 %.2f ms  errors %llu%s%s", tty ? "\r\033[K" : "",
            (t - r->t0) / 1e3, t < r->t_measure ? " warm-up" : "", (unsigned long long)done, rps, p99,
            (unsigned long long)errs, extra, tty && !final ? "" : "\n");
    fflush(stderr);
}

/* Runs one load shape to completion; results in r->a. */
static int run_load(run *r, int mode, int n_users, int initial_threads)
{
    const bench_opts *o = r->o;
    r->mode = mode;
    r->n_users = n_users;
    pthread_mutex_init(&r->lock, NULL);
    memset(&r->a, 0, sizeof r->a);
    mts_bench_hist_init(&r->a.lat);
    mts_bench_hist_init(&r->a.lat_warm);
    mts_bench_hist_init(&r->a.lat_cold);
    mts_bench_hist_init(&r->a.server_queue);
    mts_bench_hist_init(&r->a.server_compute);
    r->a.per_model = calloc((size_t)r->n_models, sizeof *r->a.per_model);
    r->max_threads = mode == MODE_CLOSED ? initial_threads : o->max_connections;
    if (initial_threads > r->max_threads) initial_threads = r->max_threads;
    r->threads = calloc((size_t)r->max_threads, sizeof *r->threads);
    if (!r->a.per_model || !r->threads) return -1;
    double duration = o->duration_s;
    if (mode == MODE_USERS && duration < 0) duration = o->speak_s + o->listen_s + o->wait_s;
    if (duration < 0 && o->requests <= 0) duration = 10;
    r->t0 = now_ms() + 20; /* a moment for the threads to start */
    r->t_measure = r->t0 + o->warmup_s * 1e3;
    r->t_end = duration > 0 ? r->t_measure + duration * 1e3 : INFINITY;
    r->next_time = r->t0;
    r->sched_rng = o->seed * 31 + 17;
    if (mode == MODE_USERS) {
        r->users = calloc((size_t)n_users, sizeof *r->users);
        if (!r->users) return -1;
        double cycle = (o->speak_s + o->listen_s + o->wait_s) * 1e3, fi = 1e3 / o->fps;
        for (int u = 0; u < n_users; u++) {
            uint64_t urng = o->seed * 1000003 + (uint64_t)u * 7 + 1;
            double pos = cycle * u / n_users; /* position in the cycle at t0 */
            int64_t k = (int64_t)ceil(pos / fi - 1e-9);
            double cs = r->t0 - pos;
            if ((double)k * fi >= o->speak_s * 1e3 - 1e-9) {
                k = 0;
                cs += cycle;
            }
            r->users[u].cycle_start = cs;
            r->users[u].k = k;
            r->users[u].model = r->n_models == 1 ? 0 : mts_bench_popularity_pick(r->pop, mts_bench_rand01(&urng));
        }
    }
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < initial_threads; i++) spawn_worker(r);
    pthread_mutex_unlock(&r->lock);
    /* progress until the schedule is over and the workers are gone */
    int joined = 0;
    double next_progress = r->t0 + 1000;
    for (;;) {
        pthread_mutex_lock(&r->lock);
        int n = r->n_threads;
        pthread_mutex_unlock(&r->lock);
        if (joined < n) {
            /* join with a periodic wake-up for the progress line */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            if (pthread_timedjoin_np(r->threads[joined], NULL, &ts) == 0) joined++;
        } else {
            break;
        }
        if (!o->quiet && now_ms() >= next_progress) {
            print_progress(r, false);
            next_progress += 1000;
        }
    }
    if (!o->quiet && (now_ms() - r->prog_t > 300 || !r->prog_t)) print_progress(r, true);
    return 0;
}

static void run_free(run *r)
{
    if (r->a.per_model)
        for (int i = 0; i < r->n_models; i++) free(r->a.per_model[i].lat);
    free(r->a.per_model);
    free(r->threads);
    free(r->users);
    pthread_mutex_destroy(&r->lock);
}

/* ---- reporting ------------------------------------------------------------------------- */

static double run_window_s(const run *r)
{
    double end;
    if (r->mode == MODE_CLOSED || !isfinite(r->t_end)) end = r->a.last_done;
    else end = r->t_end;
    double w = (end - r->t_measure) / 1e3;
    return w > 0 ? w : 0;
}

static void json_latency(mts_jw *w, const char *key, const mts_bench_hist *h)
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

static void json_codes(mts_jw *w, const mts_bench_codes *c)
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

static void json_frames(mts_jw *w, const run *r, int users)
{
    const agg *a = &r->a;
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

static void json_run(mts_jw *w, const run *r, const model_info *models)
{
    const bench_opts *o = r->o;
    const agg *a = &r->a;
    double win = run_window_s(r);
    mts_jw_key(w, "duration_s");
    mts_jw_double(w, win);
    mts_jw_key(w, "requests");
    mts_jw_uint(w, a->requests);
    mts_jw_key(w, "ok");
    mts_jw_uint(w, a->ok);
    mts_jw_key(w, "errors");
    mts_jw_uint(w, a->errors);
    json_codes(w, &a->codes);
    mts_jw_key(w, "throughput_rps");
    mts_jw_double(w, win > 0 ? (double)a->ok / win : 0);
    mts_jw_key(w, "samples_per_s");
    mts_jw_double(w, win > 0 ? (double)a->ok * (double)o->batch / win : 0);
    json_latency(w, "latency_ms", &a->lat);
    if (a->server_queue.count) json_latency(w, "server_queue_ms", &a->server_queue);
    if (a->server_compute.count) json_latency(w, "server_compute_ms", &a->server_compute);
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
        json_latency(w, "latency_warm_ms", &a->lat_warm);
        json_latency(w, "latency_cold_ms", &a->lat_cold);
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

static void text_run(const run *r, const model_info *models)
{
    const bench_opts *o = r->o;
    const agg *a = &r->a;
    double win = run_window_s(r);
    printf("requests     %llu in %.2f s (ok %llu, errors %llu)  throughput %.2f req/s, %.2f samples/s\n",
           (unsigned long long)a->requests, win, (unsigned long long)a->ok, (unsigned long long)a->errors,
           win > 0 ? (double)a->ok / win : 0, win > 0 ? (double)a->ok * (double)o->batch / win : 0);
    print_latency("latency", &a->lat);
    if (a->server_queue.count) print_latency("server queue", &a->server_queue);
    if (a->server_compute.count) print_latency("server comp.", &a->server_compute);
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

static void json_server(mts_jw *w, const server_stats *b, const server_stats *e, double secs)
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

/* ---- entry point ----------------------------------------------------------------------- */

static const char *mode_name(int mode, bool capacity)
{
    if (capacity) return "find-capacity";
    return mode == MODE_CLOSED ? "closed" : mode == MODE_OPEN ? "open" : "users";
}

static void free_model_names(bench_opts *o)
{
    for (int i = 0; i < o->n_models; i++) free(o->models[i]);
    free(o->models);
    o->models = NULL;
    o->n_models = 0;
}

int mts_cli_bench(int argc, char **argv)
{
    bench_opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc) {
        free_model_names(&o);
        return prc == 1 ? 0 : prc;
    }
    const mts_bench_transport *tp = NULL;
    if (!strcmp(o.transport, "http")) tp = &mts_bench_http_transport;
    else if (!strcmp(o.transport, "grpc")) tp = &mts_bench_grpc_transport;
    if (!tp) {
        fprintf(stderr, "mtserve bench: unknown transport '%s' (available: http, grpc)\n", o.transport);
        free_model_names(&o);
        return 2;
    }
    if (tp == &mts_bench_grpc_transport && !o.grpc) {
        fprintf(stderr, "mtserve bench: --transport grpc needs --grpc HOST:PORT\n");
        free_model_names(&o);
        return 2;
    }
    /* target: where requests go; http_target: control calls (when http_ctl) */
    mts_bench_target target, http_target;
    char err[300];
    bool use_grpc = tp == &mts_bench_grpc_transport;
    bool http_ctl = !use_grpc || o.url_set;
    if (mts_bench_parse_url(o.url, &http_target, err, sizeof err)) {
        fprintf(stderr, "mtserve bench: %s\n", err);
        free_model_names(&o);
        return 2;
    }
    target = http_target;
    if (use_grpc) {
        if (strstr(o.grpc, "://") || mts_bench_parse_url(o.grpc, &target, err, sizeof err)) {
            fprintf(stderr, "mtserve bench: --grpc '%s': expected HOST:PORT\n", o.grpc);
            free_model_names(&o);
            return 2;
        }
        if (!strchr(o.grpc, ':')) {
            target.port = 50051;
            snprintf(target.hostport, sizeof target.hostport, "%s:%d", target.host, target.port);
        }
        mts_bench_grpc_configure(o.grpc_channels);
    }
    if (!http_ctl) o.server_stats = false;
    const char *shown = use_grpc ? target.hostport : o.url;
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    atomic_store(&g_stop, 0);
    atomic_store(&g_server_lost, 0);

    if (o.all_models && (http_ctl ? fetch_index(&http_target, &o, err, sizeof err)
                                  : fetch_index_grpc(target.hostport, &o, err, sizeof err))) {
        fprintf(stderr, "mtserve bench: %s\n", err);
        if (use_grpc) mts_bench_grpc_finish();
        free_model_names(&o);
        return 1;
    }
    int rc = 1;
    model_info *models = calloc((size_t)o.n_models, sizeof *models);
    void **owned = calloc((size_t)o.n_models * MTS_BENCH_MAX_INPUTS + 1, sizeof *owned);
    int n_owned = 0;
    mts_bench_popularity pop = {0};
    if (!models || !owned || mts_bench_popularity_init(&pop, o.n_models, o.zipf)) goto out;
    uint64_t data_rng = o.seed * 2654435761u + 3;
    /* shared data for --input specs: generated once, used by every model */
    model_info shared = {0};
    if (o.n_specs && inputs_from_specs(&shared, o.specs, o.n_specs, o.batch, &data_rng, owned, &n_owned)) goto out;
    int meta_failed = 0;
    for (int i = 0; i < o.n_models; i++) {
        model_info *m = &models[i];
        snprintf(m->name, sizeof m->name, "%s", o.models[i]);
        if (o.n_specs) {
            m->n_inputs = shared.n_inputs;
            memcpy(m->inputs, shared.inputs, sizeof m->inputs);
        } else {
            input_spec specs[MTS_BENCH_MAX_INPUTS];
            int n = 0;
            if (http_ctl ? fetch_metadata(&http_target, m->name, specs, &n, err, sizeof err)
                         : fetch_metadata_grpc(target.hostport, m->name, specs, &n, err, sizeof err)) {
                fprintf(stderr, "mtserve bench: metadata of '%s': %s; sending requests without inputs\n", m->name,
                        err);
                meta_failed++;
                n = 0;
            }
            if (inputs_from_specs(m, specs, n, o.batch, &data_rng, owned, &n_owned)) goto out;
        }
        mts_bench_call call = {.model = m->name, .n_inputs = m->n_inputs, .inputs = m->inputs};
        if (o.server_timeout_ms > 0) call.timeout_us = (int64_t)(o.server_timeout_ms * 1e3);
        if ((o.users || o.find_capacity) && o.frame_timeout) call.timeout_us = (int64_t)(o.frame_deadline_ms * 1e3);
        if (tp->prepare(&target, &call, &m->prepared, err, sizeof err)) {
            fprintf(stderr, "mtserve bench: %s\n", err);
            goto out;
        }
    }

    int mode = o.rate > 0 ? MODE_OPEN : (o.users > 0 || o.find_capacity) ? MODE_USERS : MODE_CLOSED;
    if (mode == MODE_CLOSED && o.concurrency <= 0) o.concurrency = 1;
    server_stats before, after;
    if (o.server_stats) fetch_server_stats(&http_target, &before);
    double wall0 = now_ms();

    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "mode");
    mts_jw_string(&w, mode_name(mode, o.find_capacity));
    mts_jw_key(&w, "transport");
    mts_jw_string(&w, tp->name);
    mts_jw_key(&w, "url");
    mts_jw_string(&w, shown);
    if (use_grpc) {
        mts_jw_key(&w, "grpc_channels");
        mts_jw_int(&w, o.grpc_channels);
    }
    mts_jw_key(&w, "models");
    mts_jw_int(&w, o.n_models);
    mts_jw_key(&w, "zipf");
    mts_jw_double(&w, o.zipf);
    mts_jw_key(&w, "batch");
    mts_jw_int(&w, o.batch);
    mts_jw_key(&w, "warmup_s");
    mts_jw_double(&w, o.warmup_s);
    if (mode == MODE_CLOSED) {
        mts_jw_key(&w, "concurrency");
        mts_jw_int(&w, o.concurrency);
    } else if (mode == MODE_OPEN) {
        mts_jw_key(&w, "rate");
        mts_jw_double(&w, o.rate);
        mts_jw_key(&w, "poisson");
        mts_jw_bool(&w, o.poisson);
    } else {
        mts_jw_key(&w, "cycle");
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "speak_s");
        mts_jw_double(&w, o.speak_s);
        mts_jw_key(&w, "listen_s");
        mts_jw_double(&w, o.listen_s);
        mts_jw_key(&w, "wait_s");
        mts_jw_double(&w, o.wait_s);
        mts_jw_key(&w, "fps");
        mts_jw_double(&w, o.fps);
        mts_jw_key(&w, "frame_deadline_ms");
        mts_jw_double(&w, o.frame_deadline_ms);
        mts_jw_key(&w, "duty_cycle");
        mts_jw_double(&w, o.speak_s / (o.speak_s + o.listen_s + o.wait_s));
        mts_jw_end_object(&w);
    }
    const char *shape = mode == MODE_CLOSED ? "closed loop" : mode == MODE_OPEN ? "open loop" : "conversational users";
    if (!o.json) {
        printf("mtserve bench: %s over %s (%s), %d model%s%s, batch %lld", shape, tp->name, shown, o.n_models,
               o.n_models == 1 ? "" : "s", o.n_models > 1 ? (o.zipf > 0 ? " (zipf)" : " (uniform)") : "",
               (long long)o.batch);
        if (mode == MODE_CLOSED) printf(", concurrency %d", o.concurrency);
        if (mode == MODE_OPEN) printf(", %.1f req/s%s", o.rate, o.poisson ? " (poisson)" : "");
        printf("\n");
    }

    if (!o.find_capacity) {
        run r = {.o = &o, .tp = tp, .target = &target, .models = models, .n_models = o.n_models, .pop = &pop};
        int init = mode == MODE_CLOSED ? o.concurrency : mode == MODE_OPEN ? o.connections
                                                                           : (o.users < o.connections ? o.users : o.connections);
        if (run_load(&r, mode, o.users, init)) {
            run_free(&r);
            mts_jw_free(&w);
            goto out;
        }
        json_run(&w, &r, models);
        if (mode == MODE_USERS) {
            mts_jw_key(&w, "frames");
            mts_jw_begin_object(&w);
            json_frames(&w, &r, o.users);
            mts_jw_end_object(&w);
        }
        if (!o.json) {
            text_run(&r, models);
            if (mode == MODE_USERS)
                printf("frames       %d users: %llu frames, %llu on time (%.2f%%), %llu late, %llu failed (deadline "
                       "%.0f ms)\n",
                       o.users, (unsigned long long)r.a.frames, (unsigned long long)r.a.on_time,
                       r.a.frames ? 100.0 * (double)r.a.on_time / (double)r.a.frames : 0,
                       (unsigned long long)r.a.late, (unsigned long long)r.a.failed, o.frame_deadline_ms);
        }
        run_free(&r);
    } else {
        int lo = 0, hi = -1, u = o.start_users, levels = 0;
        mts_jw_key(&w, "levels");
        mts_jw_begin_array(&w);
        bench_opts lo_opts = o;
        if (lo_opts.duration_s < 0) lo_opts.duration_s = o.level_s > 0 ? o.level_s : o.speak_s + o.listen_s + o.wait_s;
        while (!atomic_load(&g_stop) && levels < 40) {
            run r = {.o = &lo_opts, .tp = tp, .target = &target, .models = models, .n_models = o.n_models, .pop = &pop};
            if (!o.quiet) fprintf(stderr, "level %d: %d users for %.0f s\n", levels + 1, u, lo_opts.duration_s);
            if (run_load(&r, MODE_USERS, u, u < o.connections ? u : o.connections)) {
                run_free(&r);
                break;
            }
            levels++;
            double ratio = r.a.frames ? (double)r.a.on_time / (double)r.a.frames : 0;
            bool pass = r.a.frames > 0 && ratio >= o.on_time_target && !atomic_load(&g_stop);
            mts_jw_begin_object(&w);
            json_frames(&w, &r, u);
            mts_jw_key(&w, "passed");
            mts_jw_bool(&w, pass);
            json_latency(&w, "latency_ms", &r.a.lat);
            mts_jw_key(&w, "errors");
            mts_jw_uint(&w, r.a.errors);
            json_codes(&w, &r.a.codes);
            mts_jw_end_object(&w);
            if (!o.json)
                printf("level %2d: %4d users  %6llu frames  on time %6.2f%%  late %llu  failed %llu  p50 %.1f ms  p99 "
                       "%.1f ms  %s\n",
                       levels, u, (unsigned long long)r.a.frames, 100 * ratio, (unsigned long long)r.a.late,
                       (unsigned long long)r.a.failed, mts_bench_hist_quantile(&r.a.lat, 0.5) / 1e3,
                       mts_bench_hist_quantile(&r.a.lat, 0.99) / 1e3, pass ? "pass" : "FAIL");
            fflush(stdout);
            run_free(&r);
            if (pass) lo = u;
            else hi = u;
            int next;
            if (hi < 0) next = u * 2 > o.max_users ? o.max_users : u * 2;
            else next = lo + (hi - lo) / 2;
            if ((hi >= 0 && hi - lo <= 1) || next == u || (pass && u >= o.max_users)) break;
            u = next;
            sleep_until(now_ms() + 1000); /* let the server drain */
        }
        mts_jw_end_array(&w);
        mts_jw_key(&w, "capacity");
        mts_jw_begin_object(&w);
        mts_jw_key(&w, "max_users");
        mts_jw_int(&w, lo);
        mts_jw_key(&w, "first_failing_users");
        mts_jw_int(&w, hi);
        mts_jw_key(&w, "on_time_target");
        mts_jw_double(&w, o.on_time_target);
        mts_jw_key(&w, "level_s");
        mts_jw_double(&w, lo_opts.duration_s);
        mts_jw_end_object(&w);
        if (!o.json) {
            printf("capacity     %d users with >= %.1f%% of frames on time", lo, 100 * o.on_time_target);
            if (hi >= 0) printf(" (%d users failed)\n", hi);
            else printf(" (no level failed up to --max-users %d)\n", o.max_users);
        }
    }
    double wall = (now_ms() - wall0) / 1e3;
    if (o.server_stats) {
        fetch_server_stats(&http_target, &after);
        json_server(&w, &before, &after, wall);
        if (!o.json && before.ok && after.ok)
            printf("server       %llu loads (%.2f/s), %llu evictions, %llu rejected (queue full), %llu timed out; "
                   "resident %lld models, %.1f MB\n",
                   (unsigned long long)(after.loads - before.loads),
                   wall > 0 ? (double)(after.loads - before.loads) / wall : 0,
                   (unsigned long long)(after.evictions - before.evictions),
                   (unsigned long long)(after.rejected_full - before.rejected_full),
                   (unsigned long long)(after.timed_out - before.timed_out), (long long)after.resident_models,
                   (double)after.resident_bytes / 1e6);
    } else if (!http_ctl) {
        server_stats none = {0};
        json_server(&w, &none, &none, wall); /* "available": false: no HTTP address for statistics */
    }
    mts_jw_key(&w, "metadata_failures");
    mts_jw_int(&w, meta_failed);
    mts_jw_key(&w, "interrupted");
    mts_jw_bool(&w, atomic_load(&g_stop) != 0);
    mts_jw_key(&w, "server_lost");
    mts_jw_bool(&w, atomic_load(&g_server_lost) != 0);
    mts_jw_end_object(&w);
    if (o.json) {
        size_t len = 0;
        char *text = mts_jw_take(&w, &len);
        if (text) {
            fwrite(text, 1, len, stdout);
            fputc('\n', stdout);
            free(text);
        }
    }
    mts_jw_free(&w);
    rc = 0;
    if (atomic_load(&g_server_lost)) {
        fprintf(stderr, "mtserve bench: %s: %s\n", shown, g_lost_msg);
        rc = 1;
    }
out:
    for (int i = 0; models && i < o.n_models; i++)
        if (models[i].prepared) tp->free_prepared(models[i].prepared);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    free(owned);
    free(models);
    mts_bench_popularity_free(&pop);
    free_model_names(&o);
    if (use_grpc) mts_bench_grpc_finish();
    return rc;
}
