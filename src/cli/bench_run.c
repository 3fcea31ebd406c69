/*
 * `mtserve bench`: one load run. Worker threads each own a connection and take jobs from a shared
 * schedule (closed loop: as soon as the last answer came; open loop: fixed or Poisson intended
 * send times; users: each user's next frame, or with the lip-sync API its next request of up to
 * --frames-per-request frames, each user walking its own background frames of the avatar); in
 * the open-loop shapes the pool of workers grows
 * when a job finds no free connection at its intended time. Every response is recorded into the
 * run's counters and histograms, a live progress line goes to stderr, and a server that stops
 * answering ends the run.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cli/bench_internal.h"

#define LAG_MS 2.0 /* a job starting later than this after its intended time found no free connection */

typedef struct user {
    double cycle_start; /* ms: position 0 of the current (or next) cycle */
    int64_t k;          /* next frame within the speaking phase */
    int model;
    int64_t walk;       /* lip-sync: frames sent so far (position in the avatar's frames) */
} user;

typedef struct job {
    double intended;
    int model;
    bool measured, frame;
    int frames;          /* frames the request carries (1 outside the lip-sync API) */
    int64_t start_frame; /* lip-sync: the first background frame */
} job;

atomic_int mts_bench_stop;

/* A dead server: after this many requests in a row (over all clients) reached no server, and at
 * least this long without any response, the run stops with an error instead of counting refused
 * connections as requests. Meanwhile a client whose request found no server waits a little before
 * the next, so a dead port is not hammered. */
#define LOST_STREAK 32
#define LOST_MS 1000.0
#define LOST_PAUSE_MS 20.0
atomic_int mts_bench_server_lost;
char mts_bench_lost_msg[400]; /* written once, by the thread that sets mts_bench_server_lost */

void mts_bench_sleep_until(double t)
{
    for (;;) {
        double d = t - mts_bench_now_ms();
        if (d <= 0 || atomic_load(&mts_bench_stop)) return;
        if (d > 100) d = 100;
        struct timespec ts = {(time_t)(d / 1e3), (long)(fmod(d, 1e3) * 1e6)};
        nanosleep(&ts, NULL);
    }
}

/* ---- the run --------------------------------------------------------------------------- */

static int pick_model(bench_run *r, uint64_t *rng)
{
    return r->n_models == 1 ? 0 : mts_bench_popularity_pick(r->pop, mts_bench_rand01(rng));
}

/* Frame slots of a speaking phase: frame k is shown at k / fps while k / fps < speak_s. */
static int64_t phase_frames(const bench_opts *o)
{
    return (int64_t)ceil(o->speak_s * o->fps - 1e-9);
}

/* The background frame for position pos of a walk that starts at base, wrapped over the
 * avatar's frames when their count is known (the server wraps the same way otherwise). With
 * r->lock held. */
static int64_t avatar_frame(const bench_run *r, int64_t base, int64_t pos)
{
    int64_t f = base + pos;
    return r->avatar_frames > 0 ? f % r->avatar_frames : f % (INT64_C(1) << 30);
}

/* Where user u's walk starts: frame 0 with --start-frame zero, else users spread evenly over
 * the avatar (or 997 frames apart while its length is unknown). With r->lock held. */
static int64_t user_base(const bench_run *r, int u)
{
    if (r->o->start_zero) return 0;
    return r->avatar_frames > 0 ? (int64_t)u * r->avatar_frames / r->n_users : (int64_t)u * 997;
}

static bool next_job(bench_run *r, job *j, uint64_t *rng)
{
    if (atomic_load(&mts_bench_stop)) return false;
    bool got = false;
    pthread_mutex_lock(&r->lock);
    j->frame = false;
    j->frames = r->o->lipsync ? r->o->frames_per_request : 1;
    j->start_frame = 0;
    if (r->o->lipsync && r->mode != MODE_USERS) {
        j->start_frame = avatar_frame(r, 0, (int64_t)r->frame_ticket);
        r->frame_ticket += (uint64_t)j->frames;
    }
    if (r->mode == MODE_CLOSED) {
        double t = mts_bench_now_ms();
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
            if (r->o->lipsync) {
                int64_t left = phase_frames(r->o) - u->k;
                if (left < j->frames) j->frames = (int)left;
                j->start_frame = avatar_frame(r, user_base(r, best), u->walk);
                u->walk += j->frames;
            }
            u->k += j->frames;
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
static void spawn_worker(bench_run *r)
{
    if (r->n_threads >= r->max_threads) return;
    if (pthread_create(&r->threads[r->n_threads], NULL, worker_main, r)) {
        r->spawn_failed++;
        r->max_threads = r->n_threads; /* no more: the pool is as large as it gets */
        return;
    }
    r->n_threads++;
}

static void note_lag(bench_run *r, double lag, bool measured)
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
static bool record(bench_run *r, const job *j, const mts_bench_result *res, double latency_ms, double sent_ms,
                   int cold)
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
    double t = mts_bench_now_ms(), silent_ms = t - (r->last_answer > 0 ? r->last_answer : r->t0);
    bool pause = res->no_server && r->no_server_streak + 1 >= LOST_STREAK;
    if (!res->no_server) {
        r->no_server_streak = 0;
        r->last_answer = t;
    } else if (++r->no_server_streak >= LOST_STREAK && silent_ms >= LOST_MS && !atomic_load(&mts_bench_server_lost)) {
        snprintf(mts_bench_lost_msg, sizeof mts_bench_lost_msg,
                 "the server stopped answering: %llu requests in a row over %.1f s reached no server (last: %s); "
                 "stopping",
                 (unsigned long long)r->no_server_streak, silent_ms / 1e3,
                 res->msg[0] ? res->msg : mts_bench_error_name(res->transport_error));
        atomic_store(&mts_bench_server_lost, 1);
        atomic_store(&mts_bench_stop, 1);
    }
    if (j->measured) {
        bench_agg *a = &r->a;
        model_agg *m = &a->per_model[j->model];
        a->requests++;
        m->requests++;
        double done = mts_bench_now_ms();
        if (done > a->last_done) a->last_done = done;
        if (ok) {
            a->ok++;
            m->ok++;
            mts_bench_hist_add(&a->lat, us);
            if (r->mode != MODE_CLOSED) mts_bench_hist_add(&a->lat_sent, sent_ms * 1e3);
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
            if (res->composite_ms >= 0) mts_bench_hist_add(&a->server_composite, res->composite_ms * 1e3);
            if (res->encode_ms >= 0) mts_bench_hist_add(&a->server_encode, res->encode_ms * 1e3);
            if (res->background_ms >= 0) mts_bench_hist_add(&a->server_background, res->background_ms * 1e3);
            a->resp_frames += (uint64_t)res->frames;
            a->resp_bytes += res->bytes;
        } else {
            a->errors++;
            m->errors++;
            mts_bench_codes_add(&a->codes, key, res->msg, 1);
        }
        if (j->frame) {
            uint64_t n = (uint64_t)j->frames;
            a->frames += n;
            if (!ok) a->failed += n;
            else if (latency_ms <= r->o->frame_deadline_ms) a->on_time += n;
            else a->late += n;
        }
    }
    if (ok && res->num_frames > 0 && r->avatar_frames <= 0) r->avatar_frames = res->num_frames;
    pthread_mutex_unlock(&r->lock);
    return pause;
}

static void *worker_main(void *arg)
{
    bench_run *r = arg;
    pthread_mutex_lock(&r->lock);
    uint64_t rng = r->o->seed * UINT64_C(0x9E3779B97F4A7C15) + (uint64_t)r->n_threads * 7919 + 1;
    pthread_mutex_unlock(&r->lock);
    void *conn = r->tp->connect(r->target);
    if (!conn) return NULL;
    mts_bench_sleep_until(r->t0); /* all connections open before the clock starts */
    job j;
    while (next_job(r, &j, &rng)) {
        if (r->mode != MODE_CLOSED) {
            mts_bench_sleep_until(j.intended);
            if (atomic_load(&mts_bench_stop)) break;
            double lag = mts_bench_now_ms() - j.intended;
            if (lag > LAG_MS) note_lag(r, lag, j.measured);
        }
        const bench_model *m = &r->models[j.model];
        int cold = -1; /* not probed */
        double probe_ms = 0;
        if (r->o->cold_probe && r->tp->model_ready) {
            double p0 = mts_bench_now_ms();
            int ready = r->tp->model_ready(conn, m->name, r->o->timeout_ms);
            probe_ms = mts_bench_now_ms() - p0;
            cold = ready == 1 ? 0 : ready == 0 ? 1 : -2;
        }
        double start = r->mode == MODE_CLOSED ? mts_bench_now_ms() : j.intended + probe_ms;
        mts_bench_result res;
        const void *prepared = j.frames != r->o->frames_per_request && m->prepared_tail ? m->prepared_tail : m->prepared;
        double sent = mts_bench_now_ms();
        r->tp->infer(conn, prepared, j.start_frame, r->o->timeout_ms, &res);
        double end = mts_bench_now_ms();
        if (record(r, &j, &res, end - start, end - sent, cold))
            mts_bench_sleep_until(mts_bench_now_ms() + LOST_PAUSE_MS);
    }
    r->tp->close(conn);
    return NULL;
}

static void print_progress(bench_run *r, bool final)
{
    double t = mts_bench_now_ms();
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

static double tv_ms(const struct timeval *t)
{
    return (double)t->tv_sec * 1e3 + (double)t->tv_usec / 1e3;
}

/* Runs one load shape to completion; results in r->a. */
int mts_bench_run_load(bench_run *r, int mode, int n_users, int initial_threads)
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
    mts_bench_hist_init(&r->a.lat_sent);
    mts_bench_hist_init(&r->a.server_compute);
    mts_bench_hist_init(&r->a.server_composite);
    mts_bench_hist_init(&r->a.server_encode);
    mts_bench_hist_init(&r->a.server_background);
    r->a.per_model = calloc((size_t)r->n_models, sizeof *r->a.per_model);
    r->max_threads = mode == MODE_CLOSED ? initial_threads : o->max_connections;
    if (initial_threads > r->max_threads) initial_threads = r->max_threads;
    r->threads = calloc((size_t)r->max_threads, sizeof *r->threads);
    if (!r->a.per_model || !r->threads) return -1;
    double duration = o->duration_s;
    if (mode == MODE_USERS && duration < 0) duration = o->speak_s + o->listen_s + o->wait_s;
    if (duration < 0 && o->requests <= 0) duration = 10;
    r->t0 = mts_bench_now_ms() + 20; /* a moment for the threads to start */
    r->t_measure = r->t0 + o->warmup_s * 1e3;
    r->t_end = duration > 0 ? r->t_measure + duration * 1e3 : INFINITY;
    r->next_time = r->t0;
    r->sched_rng = o->seed * 31 + 17;
    r->avatar_frames = o->avatar_frames;
    if (mode == MODE_USERS) {
        r->users = calloc((size_t)n_users, sizeof *r->users);
        if (!r->users) return -1;
        double cycle = bench_cycle_ms(o), fi = 1e3 / o->fps, period = bench_request_period_ms(o);
        int64_t step = o->lipsync ? o->frames_per_request : 1; /* requests start at multiples of it */
        for (int u = 0; u < n_users; u++) {
            uint64_t urng = o->seed * 1000003 + (uint64_t)u * 7 + 1;
            /* position in the cycle at t0 */
            double pos = mts_bench_user_offset_ms(u, n_users, cycle, period, o->phase_grid);
            int64_t k = (int64_t)ceil(pos / fi / (double)step - 1e-9) * step;
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
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
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
        if (!o->quiet && mts_bench_now_ms() >= next_progress) {
            print_progress(r, false);
            next_progress += 1000;
        }
    }
    if (!o->quiet && (mts_bench_now_ms() - r->prog_t > 300 || !r->prog_t)) print_progress(r, true);
    getrusage(RUSAGE_SELF, &ru1);
    r->cpu_ms = tv_ms(&ru1.ru_utime) + tv_ms(&ru1.ru_stime) - tv_ms(&ru0.ru_utime) - tv_ms(&ru0.ru_stime);
    return 0;
}

void mts_bench_run_free(bench_run *r)
{
    if (r->a.per_model)
        for (int i = 0; i < r->n_models; i++) free(r->a.per_model[i].lat);
    free(r->a.per_model);
    free(r->threads);
    free(r->users);
    pthread_mutex_destroy(&r->lock);
}
