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
 *                the report says how often that happened and whether the pool was exhausted,
 *                and gives the latency from the actual send beside it ("from send",
 *                latency_from_send_ms: what the client's own late starts added is the difference);
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
 *
 * --api lipsync drives the lip-sync service as its avatar clients do: requests of
 * --frames-per-request frames (InferBatchComposite, or InferBatch with --rpc infer) over gRPC, or
 * POST /api/v1/lipsync/{model}/composite over HTTP; in the users mode a speaking user sends one
 * request per N frames, walking its own background frames of the avatar (start_frame_idx,
 * wrapped at the avatar's frame count), and a request is on time when its reply arrives before
 * its first frame is due: N/fps after it was sent, as a player holding one request of frames
 * would show it. The report adds frames and bytes per frame received and the server's
 * inference, composite, encode and background times.
 *
 * This file holds the entry point and option parsing; model discovery and input generation
 * are in bench_discover.c, the load loop in bench_run.c, the reports in bench_report.c.
 */
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_internal.h"

static void on_sigint(int sig)
{
    (void)sig;
    atomic_store(&mts_bench_stop, 1);
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
            "    --request-phases spread|grid  conversations offset evenly over the cycle, each moved\n"
            "                         by under one request period so that the users' requests spread\n"
            "                         over that period (default), or exactly even (grid: users\n"
            "                         speaking together may send their requests almost at once)\n"
            "  --find-capacity        ramp users to the largest count with >= --on-time-target (0.99)\n"
            "                         frames on time; --level-seconds S (default one cycle),\n"
            "                         --start-users N (1), --max-users N (1024)\n"
            "bounds: --duration S (default 10; users: one cycle), --requests N, --warmup S (default 0)\n"
            "models: --zipf S (popularity exponent, 0 = uniform), --batch B (default 1),\n"
            "        --input NAME:DATATYPE:D1,D2,... (repeatable; -1 = batch; skips metadata)\n"
            "lip-sync service (--api lipsync; default --api kserve):\n"
            "  --rpc composite|infer  InferBatchComposite (finished frames, default) or InferBatch (raw\n"
            "                         mouth regions); over HTTP: POST /api/v1/lipsync/{model}/composite,\n"
            "                         and infer is a KServe infer of the same frames\n"
            "  --frames-per-request N frames per request (default 16, at most 25); users send one request\n"
            "                         per N frames at --fps; a request is on time when its reply arrives\n"
            "                         before its first frame is due: N/fps after it was sent (the player\n"
            "                         holds one request of frames), or --frame-deadline-ms if given\n"
            "  --format jpeg|png|rgb  composited frame format (default jpeg)\n"
            "  --start-frame spread|zero  users walk the avatar from evenly spread frames (default) or\n"
            "                         all from frame 0; --avatar-frames N wraps the walk (default: the\n"
            "                         num_frames of the first composite reply)\n"
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
    o->frames_per_request = 16;
    o->format = "jpeg";
    o->composite = true;
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
/* An option with two values, OFF and ON: sets FLAG to whether it was ON (the last one given). */
#define CHOICE(OFF, ON, FLAG)                                                                     \
    do {                                                                                          \
        NEED();                                                                                   \
        if (strcmp(v, OFF) && strcmp(v, ON)) {                                                    \
            fprintf(stderr, "mtserve bench: %s '%s': expected " OFF " or " ON "\n", a, v);        \
            return 2;                                                                             \
        }                                                                                         \
        FLAG = !strcmp(v, ON);                                                                    \
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
            if (mts_bench_split_models(v, o)) return 2;
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
            if (!mts_bench_dtype_size(o->specs[o->n_specs].datatype)) {
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
            o->deadline_set = true;
        } else if (!strcmp(a, "--api")) {
            CHOICE("kserve", "lipsync", o->lipsync);
        } else if (!strcmp(a, "--rpc")) {
            CHOICE("infer", "composite", o->composite);
        } else if (!strcmp(a, "--frames-per-request")) {
            NUM(1, o->frames_per_request);
            if (o->frames_per_request > 25) {
                fprintf(stderr, "mtserve bench: --frames-per-request: the lip-sync service takes 1..25 frames\n");
                return 2;
            }
        } else if (!strcmp(a, "--format")) {
            NEED();
            if (strcmp(v, "jpeg") && strcmp(v, "png") && strcmp(v, "rgb")) {
                fprintf(stderr, "mtserve bench: --format '%s': expected jpeg, png or rgb\n", v);
                return 2;
            }
            o->format = v;
        } else if (!strcmp(a, "--start-frame")) {
            CHOICE("spread", "zero", o->start_zero);
        } else if (!strcmp(a, "--request-phases")) {
            CHOICE("spread", "grid", o->phase_grid);
        } else if (!strcmp(a, "--avatar-frames")) {
            NUM(1, o->avatar_frames);
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
    if (o->lipsync) {
        if (o->frame_timeout) {
            fprintf(stderr, "mtserve bench: --frame-timeout: the lip-sync service takes no request deadline\n");
            return 2;
        }
        if (o->n_specs) {
            fprintf(stderr, "mtserve bench: --input: lip-sync requests take the model's visual and audio inputs\n");
            return 2;
        }
        if (!o->deadline_set) o->frame_deadline_ms = o->frames_per_request * 1e3 / o->fps;
        o->batch = o->frames_per_request;
    }
    if (o->max_connections < o->connections) o->max_connections = o->connections;
    if (o->seed == 0) o->seed = 1;
    return 0;
}

/* ---- the lip-sync service -------------------------------------------------------------- */

/* Lip-sync requests carry the model's visual and audio inputs (by those names, else its first
 * two) with the frames as their first dimension: specs keeps those two, visual first. */
static int lipsync_specs(const char *model, input_spec *specs, int *n)
{
    int vi = -1, ai = -1;
    for (int i = 0; i < *n; i++) {
        if (!strcmp(specs[i].name, "visual")) vi = i;
        if (!strcmp(specs[i].name, "audio")) ai = i;
    }
    if (vi < 0 || ai < 0) vi = 0, ai = 1;
    if (*n < 2 || specs[vi].rank < 2 || specs[ai].rank < 2) {
        fprintf(stderr, "mtserve bench: '%s' is not a lip-sync model (it needs visual and audio inputs)\n", model);
        return -1;
    }
    input_spec two[2] = {specs[vi], specs[ai]};
    for (int k = 0; k < 2; k++) {
        two[k].dims[0] = -1; /* the frames */
        for (int d = 1; d < two[k].rank; d++)
            if (two[k].dims[d] < 0) {
                fprintf(stderr, "mtserve bench: '%s': input '%s' has a variable dimension besides the frames\n",
                        model, two[k].name);
                return -1;
            }
    }
    specs[0] = two[0];
    specs[1] = two[1];
    *n = 2;
    return 0;
}

/* One composite (not measured) of each model before the run: loads them, and learns how many
 * background frames the avatar has so users walk and wrap it as a real client would. A failure
 * here (no background assets, not a lip-sync model) would fail every request: it ends the run. */
static int probe_avatar(const mts_bench_transport *tp, const mts_bench_target *target, const bench_model *models,
                        int n_models, bench_opts *o)
{
    void *conn = tp->connect(target);
    if (!conn) return -1;
    int rc = 0;
    for (int i = 0; i < n_models && !rc; i++) {
        mts_bench_result res;
        tp->infer(conn, models[i].prepared, 0, o->timeout_ms, &res);
        if (res.status < 200 || res.status >= 300) {
            fprintf(stderr, "mtserve bench: the first composite of '%s' failed: %s%s%s\n", models[i].name,
                    res.code[0] ? res.code : res.status ? "" : mts_bench_error_name(res.transport_error),
                    res.code[0] || !res.status ? ": " : "", res.msg);
            rc = -1;
        } else if (res.num_frames > 0 && (o->avatar_frames == 0 || res.num_frames < o->avatar_frames)) {
            o->avatar_frames = res.num_frames;
        }
    }
    tp->close(conn);
    return rc;
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

/* The load generator keeps the memory it frees for the next request: gRPC core reads a reply
 * into heap buffers and frees them together, and glibc's defaults handed a 19.7 MB lip-sync
 * reply's back to the system every time (trimmed heap top, unmapped blocks), so each reply
 * faulted its pages in again: 1,800 page faults and 37 ms of client CPU per raw 16-frame
 * request, against about 100 faults and 14 ms with these settings, on the cores the server
 * shares. MTS_MALLOC_TUNE=0 keeps glibc's defaults. */
static void bench_alloc_policy(void)
{
#ifdef __GLIBC__
    const char *t = getenv("MTS_MALLOC_TUNE");
    if (t && !strcmp(t, "0")) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

int mts_cli_bench(int argc, char **argv)
{
    bench_opts o;
    bench_alloc_policy();
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
    bool use_grpc = tp == &mts_bench_grpc_transport;
    if (o.lipsync && use_grpc) tp = &mts_bench_lipsync_grpc_transport;
    else if (o.lipsync && o.composite) tp = &mts_bench_lipsync_http_transport;
    /* target: where requests go; http_target: control calls (when http_ctl) */
    mts_bench_target target, http_target;
    char err[300];
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
    atomic_store(&mts_bench_stop, 0);
    atomic_store(&mts_bench_server_lost, 0);

    if (o.all_models && (http_ctl ? mts_bench_fetch_index(&http_target, &o, err, sizeof err)
                                  : mts_bench_fetch_index_grpc(target.hostport, &o, err, sizeof err))) {
        fprintf(stderr, "mtserve bench: %s\n", err);
        if (use_grpc) mts_bench_grpc_finish();
        free_model_names(&o);
        return 1;
    }
    int rc = 1;
    bench_model *models = calloc((size_t)o.n_models, sizeof *models);
    void **owned = calloc((size_t)o.n_models * MTS_BENCH_MAX_INPUTS + 1, sizeof *owned);
    int n_owned = 0;
    mts_bench_popularity pop = {0};
    if (!models || !owned || mts_bench_popularity_init(&pop, o.n_models, o.zipf)) goto out;
    uint64_t data_rng = o.seed * 2654435761u + 3;
    /* shared data for --input specs: generated once, used by every model */
    bench_model shared = {0};
    if (o.n_specs &&
        mts_bench_inputs_from_specs(&shared, o.specs, o.n_specs, o.batch, &data_rng, owned, &n_owned))
        goto out;
    int meta_failed = 0;
    for (int i = 0; i < o.n_models; i++) {
        bench_model *m = &models[i];
        snprintf(m->name, sizeof m->name, "%s", o.models[i]);
        if (o.n_specs) {
            m->n_inputs = shared.n_inputs;
            memcpy(m->inputs, shared.inputs, sizeof m->inputs);
        } else {
            input_spec specs[MTS_BENCH_MAX_INPUTS];
            int n = 0;
            if (http_ctl ? mts_bench_fetch_metadata(&http_target, m->name, specs, &n, err, sizeof err)
                         : mts_bench_fetch_metadata_grpc(target.hostport, m->name, specs, &n, err, sizeof err)) {
                fprintf(stderr, "mtserve bench: metadata of '%s': %s; sending requests without inputs\n", m->name,
                        err);
                meta_failed++;
                n = 0;
            }
            if (o.lipsync && lipsync_specs(m->name, specs, &n)) goto out;
            if (mts_bench_inputs_from_specs(m, specs, n, o.batch, &data_rng, owned, &n_owned)) goto out;
        }
        mts_bench_call call = {.model = m->name,
                               .n_inputs = m->n_inputs,
                               .inputs = m->inputs,
                               .frames = o.lipsync ? o.frames_per_request : 0,
                               .composite = o.composite,
                               .format = o.format};
        if (o.server_timeout_ms > 0) call.timeout_us = (int64_t)(o.server_timeout_ms * 1e3);
        if ((o.users || o.find_capacity) && o.frame_timeout) call.timeout_us = (int64_t)(o.frame_deadline_ms * 1e3);
        if (tp->prepare(&target, &call, &m->prepared, err, sizeof err)) {
            fprintf(stderr, "mtserve bench: %s\n", err);
            goto out;
        }
        int64_t per_phase = (int64_t)ceil(o.speak_s * o.fps - 1e-9);
        if (o.lipsync && (o.users || o.find_capacity) && per_phase % o.frames_per_request) {
            /* the last request of a speaking phase: the first frames of the same data */
            mts_bench_input tail[2];
            m->tail_frames = (int)(per_phase % o.frames_per_request);
            for (int k = 0; k < 2; k++) {
                tail[k] = m->inputs[k];
                tail[k].dims[0] = m->tail_frames;
                tail[k].nbytes = m->inputs[k].nbytes / (size_t)o.frames_per_request * (size_t)m->tail_frames;
            }
            call.inputs = tail;
            call.frames = m->tail_frames;
            if (tp->prepare(&target, &call, &m->prepared_tail, err, sizeof err)) {
                fprintf(stderr, "mtserve bench: %s\n", err);
                goto out;
            }
        }
    }
    if (o.lipsync && o.composite && !o.avatar_frames && !o.start_zero &&
        probe_avatar(tp, &target, models, o.n_models, &o))
        goto out;

    int mode = o.rate > 0 ? MODE_OPEN : (o.users > 0 || o.find_capacity) ? MODE_USERS : MODE_CLOSED;
    if (mode == MODE_CLOSED && o.concurrency <= 0) o.concurrency = 1;
    server_stats before, after;
    if (o.server_stats) mts_bench_fetch_server_stats(&http_target, &before);
    double wall0 = mts_bench_now_ms();

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
        mts_jw_key(&w, "request_phases");
        mts_jw_string(&w, o.phase_grid ? "grid" : "spread");
        if (o.users > 0 && o.users <= 1024) { /* each user's place in the cycle at the start */
            double cyc = bench_cycle_ms(&o), per = bench_request_period_ms(&o);
            mts_jw_key(&w, "user_offsets_ms");
            mts_jw_begin_array(&w);
            for (int u = 0; u < o.users; u++) mts_jw_double(&w, mts_bench_user_offset_ms(u, o.users, cyc, per, o.phase_grid));
            mts_jw_end_array(&w);
        }
        mts_jw_end_object(&w);
    }
    const char *shape = mode == MODE_CLOSED ? "closed loop" : mode == MODE_OPEN ? "open loop" : "conversational users";
    if (!o.json) {
        printf("mtserve bench: %s over %s (%s), %d model%s%s, batch %lld", shape, tp->name, shown, o.n_models,
               o.n_models == 1 ? "" : "s", o.n_models > 1 ? (o.zipf > 0 ? " (zipf)" : " (uniform)") : "",
               (long long)o.batch);
        if (o.lipsync)
            printf(" (lip-sync %s, %d frames per request, deadline %.0f ms)", o.composite ? "composite" : "infer",
                   o.frames_per_request, o.frame_deadline_ms);
        if (mode == MODE_CLOSED) printf(", concurrency %d", o.concurrency);
        if (mode == MODE_OPEN) printf(", %.1f req/s%s", o.rate, o.poisson ? " (poisson)" : "");
        printf("\n");
    }

    if (!o.find_capacity) {
        bench_run r = {.o = &o, .tp = tp, .target = &target, .models = models, .n_models = o.n_models, .pop = &pop};
        int init = mode == MODE_CLOSED ? o.concurrency : mode == MODE_OPEN ? o.connections
                                                                           : (o.users < o.connections ? o.users : o.connections);
        if (mts_bench_run_load(&r, mode, o.users, init)) {
            mts_bench_run_free(&r);
            mts_jw_free(&w);
            goto out;
        }
        mts_bench_json_run(&w, &r, models);
        if (mode == MODE_USERS) {
            mts_jw_key(&w, "frames");
            mts_jw_begin_object(&w);
            mts_bench_json_frames(&w, &r, o.users);
            mts_jw_end_object(&w);
        }
        if (!o.json) {
            mts_bench_text_run(&r, models);
            if (mode == MODE_USERS)
                printf("frames       %d users: %llu frames, %llu on time (%.2f%%), %llu late, %llu failed (deadline "
                       "%.0f ms)\n",
                       o.users, (unsigned long long)r.a.frames, (unsigned long long)r.a.on_time,
                       r.a.frames ? 100.0 * (double)r.a.on_time / (double)r.a.frames : 0,
                       (unsigned long long)r.a.late, (unsigned long long)r.a.failed, o.frame_deadline_ms);
        }
        mts_bench_run_free(&r);
    } else {
        int lo = 0, hi = -1, u = o.start_users, levels = 0;
        mts_jw_key(&w, "levels");
        mts_jw_begin_array(&w);
        bench_opts lo_opts = o;
        if (lo_opts.duration_s < 0) lo_opts.duration_s = o.level_s > 0 ? o.level_s : o.speak_s + o.listen_s + o.wait_s;
        while (!atomic_load(&mts_bench_stop) && levels < 40) {
            bench_run r = {.o = &lo_opts, .tp = tp, .target = &target, .models = models, .n_models = o.n_models,
                           .pop = &pop};
            if (!o.quiet) fprintf(stderr, "level %d: %d users for %.0f s\n", levels + 1, u, lo_opts.duration_s);
            if (mts_bench_run_load(&r, MODE_USERS, u, u < o.connections ? u : o.connections)) {
                mts_bench_run_free(&r);
                break;
            }
            levels++;
            double ratio = r.a.frames ? (double)r.a.on_time / (double)r.a.frames : 0;
            bool pass = r.a.frames > 0 && ratio >= o.on_time_target && !atomic_load(&mts_bench_stop);
            mts_jw_begin_object(&w);
            mts_bench_json_frames(&w, &r, u);
            mts_jw_key(&w, "passed");
            mts_jw_bool(&w, pass);
            mts_bench_json_latency(&w, "latency_ms", &r.a.lat);
            mts_jw_key(&w, "errors");
            mts_jw_uint(&w, r.a.errors);
            mts_bench_json_codes(&w, &r.a.codes);
            mts_jw_end_object(&w);
            if (!o.json)
                printf("level %2d: %4d users  %6llu frames  on time %6.2f%%  late %llu  failed %llu  p50 %.1f ms  p99 "
                       "%.1f ms  %s\n",
                       levels, u, (unsigned long long)r.a.frames, 100 * ratio, (unsigned long long)r.a.late,
                       (unsigned long long)r.a.failed, mts_bench_hist_quantile(&r.a.lat, 0.5) / 1e3,
                       mts_bench_hist_quantile(&r.a.lat, 0.99) / 1e3, pass ? "pass" : "FAIL");
            fflush(stdout);
            mts_bench_run_free(&r);
            if (pass) lo = u;
            else hi = u;
            int next;
            if (hi < 0) next = u * 2 > o.max_users ? o.max_users : u * 2;
            else next = lo + (hi - lo) / 2;
            if ((hi >= 0 && hi - lo <= 1) || next == u || (pass && u >= o.max_users)) break;
            u = next;
            mts_bench_sleep_until(mts_bench_now_ms() + 1000); /* let the server drain */
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
    double wall = (mts_bench_now_ms() - wall0) / 1e3;
    if (o.server_stats) {
        mts_bench_fetch_server_stats(&http_target, &after);
        mts_bench_json_server(&w, &before, &after, wall);
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
        mts_bench_json_server(&w, &none, &none, wall); /* "available": false: no HTTP address for statistics */
    }
    mts_jw_key(&w, "metadata_failures");
    mts_jw_int(&w, meta_failed);
    mts_jw_key(&w, "interrupted");
    mts_jw_bool(&w, atomic_load(&mts_bench_stop) != 0);
    mts_jw_key(&w, "server_lost");
    mts_jw_bool(&w, atomic_load(&mts_bench_server_lost) != 0);
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
    if (atomic_load(&mts_bench_server_lost)) {
        fprintf(stderr, "mtserve bench: %s: %s\n", shown, mts_bench_lost_msg);
        rc = 1;
    }
out:
    for (int i = 0; models && i < o.n_models; i++) {
        if (models[i].prepared) tp->free_prepared(models[i].prepared);
        if (models[i].prepared_tail) tp->free_prepared(models[i].prepared_tail);
    }
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    free(owned);
    free(models);
    mts_bench_popularity_free(&pop);
    free_model_names(&o);
    if (use_grpc) mts_bench_grpc_finish();
    return rc;
}
