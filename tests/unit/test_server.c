/*
 * The server core through its C API, with real models on real worker threads: lazy loading (a
 * storm of requests to a cold model causes one load), dynamic batching, eviction with 20 models
 * through max_models 5 and no failed request, queue-full rejection, per-request timeouts,
 * unload with requests in flight, force_reload, failed loads with back-off, memory-aware batch
 * caps, memory budgets with
 * LFU, placement over two devices, idle unloading, fair sharing, priorities, preemption between
 * engine steps, statistics and metrics. Runs plain, under ASan+UBSan and under TSan in `make test`.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <stdlib.h>
#include <cmocka.h>
#include <time.h>
#include <unistd.h>

#include "serve/server.h"
#include "test_util.h"
#include "util/log.h"

typedef struct call {
    mts_request req;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status;
    bool gated; /* on_done waits for gate_open first: the thread that answers it stays busy */
    char msg[512];
    float input[3 * 32 * 32 * 4];
} call;

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_open = true;

static void gate_set(bool open)
{
    pthread_mutex_lock(&gate_mu);
    gate_open = open;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

static void on_done(mts_request *r, int status, const char *msg)
{
    call *c = (call *)r;
    if (c->gated) {
        pthread_mutex_lock(&gate_mu);
        while (!gate_open) pthread_cond_wait(&gate_cv, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
    }
    pthread_mutex_lock(&c->mu);
    c->status = status;
    snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "");
    c->done = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static call *call_new(const char *model, int batch)
{
    call *c = calloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->req.model = model;
    c->req.n_inputs = 1;
    c->req.input_names[0] = "x";
    mts_tensor *t = &c->req.inputs[0];
    t->dtype = MTS_DTYPE_FLOAT;
    t->rank = 4;
    t->dims[0] = batch;
    t->dims[1] = 3;
    t->dims[2] = 32;
    t->dims[3] = 32;
    for (int i = 0; i < 3 * 32 * 32 * batch; i++) c->input[i] = (float)((i * 7919) % 1000) / 1000.0f;
    t->data = c->input;
    c->req.done = on_done;
    return c;
}

static int call_wait(call *c)
{
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    return c->status;
}

static void call_free(call *c)
{
    mts_request_release(&c->req);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

static char model_path[4096];

static void make_config(mts_config *cfg, int n_models, int max_models, const char *path)
{
    mts_config_defaults(cfg);
    cfg->max_models = max_models;
    cfg->device_count = 1;
    cfg->workers_per_device = 2;
    cfg->threads_per_device = 2;
    cfg->max_memory_gb = 4;
    cfg->n_models = n_models;
    cfg->models = calloc((size_t)n_models, sizeof *cfg->models);
    for (int i = 0; i < n_models; i++) {
        char name[32];
        snprintf(name, sizeof name, "m%02d", i);
        cfg->models[i].name = strdup(name);
        cfg->models[i].model_path = strdup(path);
        cfg->models[i].preferred_device = -1;
        cfg->models[i].max_batch = 8;
    }
    mts_err err = {0};
    if (mts_config_finalize(cfg, &err)) fail_msg("finalize: %s", err.msg);
}

static int submit(mts_server *s, call *c)
{
    mts_err err = {0};
    int retry;
    int rc = mts_server_submit(s, &c->req, &retry, &err);
    if (rc) {
        c->status = rc;
        c->done = 1;
        snprintf(c->msg, sizeof c->msg, "%s", err.msg);
    }
    return rc;
}

static void test_storm_one_load_and_batching(void **state)
{
    (void)state;
    mts_config cfg;
    make_config(&cfg, 1, 4, model_path);
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    enum { N = 64 };
    call *calls[N];
    for (int i = 0; i < N; i++) {
        calls[i] = call_new("m00", 1 + i % 2);
        assert_int_equal(submit(s, calls[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(call_wait(calls[i]), 0);
        assert_int_equal(calls[i]->req.n_outputs, 2);
        assert_int_equal(calls[i]->req.outputs[0].dims[0], 1 + i % 2);
        assert_int_equal(calls[i]->req.outputs[0].dims[1], 10);
    }
    /* Batched answers equal an unbatched run of the same input. */
    call *solo = call_new("m00", 2);
    assert_int_equal(submit(s, solo), 0);
    assert_int_equal(call_wait(solo), 0);
    assert_memory_equal(solo->req.outputs[0].data, calls[1]->req.outputs[0].data, 20 * sizeof(float));
    mts_model_status st;
    assert_int_equal(mts_server_model_status_by_name(s, "m00", &st), 0);
    printf("storm: loads=%llu executions=%llu requests=%llu\n", (unsigned long long)st.loads,
           (unsigned long long)st.execution_count, (unsigned long long)st.usage_count);
    assert_int_equal(st.loads, 1);
    assert_int_equal(st.usage_count, N + 1);
    assert_true(st.execution_count < (uint64_t)N); /* some requests shared a batch */
    assert_int_equal(st.state, MTS_MODEL_READY);
    assert_true(st.memory_bytes > 0);
    size_t len;
    char *metrics = mts_server_metrics(s, &len);
    assert_non_null(strstr(metrics, "mts_requests_total{model=\"m00\",outcome=\"success\"} 65"));
    assert_non_null(strstr(metrics, "mts_model_loads_total{model=\"m00\",outcome=\"success\"} 1"));
    free(metrics);
    for (int i = 0; i < N; i++) call_free(calls[i]);
    call_free(solo);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
}

static void test_eviction_20_through_5(void **state)
{
    (void)state;
    mts_config cfg;
    make_config(&cfg, 20, 5, model_path);
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    /* Skewed sequence: model 0 and 1 are hot, the rest cold. */
    unsigned seed = 1;
    int failures = 0;
    for (int round = 0; round < 120; round++) {
        seed = seed * 1103515245u + 12345u;
        int m = (seed >> 16) % 4 == 0 ? (int)((seed >> 8) % 20) : (int)((seed >> 8) % 2);
        char name[8];
        snprintf(name, sizeof name, "m%02d", m);
        call *c = call_new(strdup(name), 1);
        if (submit(s, c) || call_wait(c)) {
            printf("request %d to %s failed: %s\n", round, name, c->msg);
            failures++;
        }
        free((char *)c->req.model);
        call_free(c);
        mts_server_totals t;
        mts_server_totals_get(s, &t);
        assert_true(t.resident_models <= 5);
    }
    uint64_t evictions = 0;
    for (int i = 0; i < 20; i++) {
        mts_model_status st;
        mts_server_model_status(s, i, &st);
        evictions += st.evictions;
    }
    printf("eviction: %llu evictions, %d failed requests\n", (unsigned long long)evictions, failures);
    assert_int_equal(failures, 0);
    assert_true(evictions > 0);
    mts_model_status hot;
    mts_server_model_status_by_name(s, "m00", &hot);
    assert_int_equal(hot.state, MTS_MODEL_READY); /* LRU kept the hot model */
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
}

typedef struct cb_result {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status;
    char msg[512];
} cb_result;

static void on_cb(void *user, int status, const char *msg)
{
    cb_result *r = user;
    pthread_mutex_lock(&r->mu);
    r->status = status;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    r->done = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static int cb_wait(cb_result *r)
{
    pthread_mutex_lock(&r->mu);
    while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return r->status;
}

static void test_queue_full_timeout_unload(void **state)
{
    (void)state;
    mts_config cfg;
    make_config(&cfg, 1, 4, model_path);
    cfg.models[0].queue_size = 4;
    cfg.models[0].max_batch = 4; /* = the requests' 4 samples: one request a batch (more is refused) */
    cfg.workers_per_device = 1;
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    cb_result loaded = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, ""};
    assert_int_equal(mts_server_load(s, "m00", false, on_cb, &loaded, &err), 0);
    assert_int_equal(cb_wait(&loaded), 0);
    enum { N = 40 };
    call *calls[N];
    bool rejected[N] = {false}; /* calls[i]->status is the worker's to write once accepted */
    int full = 0, accepted = 0;
    for (int i = 0; i < N; i++) {
        calls[i] = call_new("m00", 4);
        int rc = submit(s, calls[i]);
        if (rc == MTS_EFULL) {
            rejected[i] = true;
            full++;
            assert_non_null(strstr(calls[i]->msg, "queue is full"));
        } else {
            assert_int_equal(rc, 0);
            accepted++;
        }
    }
    printf("queue: %d accepted, %d rejected as full\n", accepted, full);
    assert_true(full > 0);
    /* Unload while requests are queued: they complete, then the model is unloaded. */
    assert_int_equal(mts_server_unload(s, "m00", NULL, NULL, &err), 0);
    call *late = call_new("m00", 1);
    assert_int_equal(submit(s, late), MTS_EUNAVAILABLE);
    for (int i = 0; i < N; i++)
        if (!rejected[i]) assert_int_equal(call_wait(calls[i]), 0);
    for (int k = 0; k < 100; k++) {
        mts_model_status st;
        mts_server_model_status_by_name(s, "m00", &st);
        if (st.state == MTS_MODEL_UNLOADED) break;
        usleep(10000);
    }
    mts_model_status st;
    mts_server_model_status_by_name(s, "m00", &st);
    assert_int_equal(st.state, MTS_MODEL_UNLOADED);
    /* Timeouts: a 1 µs deadline cannot be met behind a cold load. */
    call *t = call_new("m00", 1);
    t->req.timeout_us = 1;
    assert_int_equal(submit(s, t), 0);
    assert_int_equal(call_wait(t), MTS_ETIMEDOUT);
    for (int i = 0; i < N; i++) call_free(calls[i]);
    call_free(late);
    call_free(t);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
}

static void test_reload_and_failed_load(void **state)
{
    (void)state;
    mts_config cfg;
    make_config(&cfg, 2, 4, model_path);
    free(cfg.models[1].model_path);
    cfg.models[1].model_path = strdup("/nonexistent/model.onnx");
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    cb_result r1 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, ""};
    assert_int_equal(mts_server_load(s, "m00", false, on_cb, &r1, &err), 0);
    assert_int_equal(cb_wait(&r1), 0);
    /* force_reload while requests flow: every request succeeds, the version advances. */
    call *calls[16];
    cb_result r2 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, ""};
    for (int i = 0; i < 16; i++) {
        calls[i] = call_new("m00", 1);
        assert_int_equal(submit(s, calls[i]), 0);
        if (i == 4) assert_int_equal(mts_server_load(s, "m00", true, on_cb, &r2, &err), 0);
    }
    for (int i = 0; i < 16; i++) assert_int_equal(call_wait(calls[i]), 0);
    assert_int_equal(cb_wait(&r2), 0);
    mts_model_status st;
    mts_server_model_status_by_name(s, "m00", &st);
    assert_int_equal(st.version, 2);
    assert_int_equal(st.state, MTS_MODEL_READY);
    /* A model whose file is missing fails with its reason, then is in back-off. */
    call *bad = call_new("m01", 1);
    assert_int_equal(submit(s, bad), 0);
    assert_int_equal(call_wait(bad), MTS_EUNAVAILABLE);
    /* the reply names the file by its folder, not by where the server keeps it */
    assert_non_null(strstr(bad->msg, "cannot open nonexistent/model.onnx"));
    assert_null(strstr(bad->msg, "/nonexistent"));
    call *again = call_new("m01", 1);
    assert_int_equal(submit(s, again), MTS_EUNAVAILABLE);
    assert_non_null(strstr(again->msg, "next retry in"));
    mts_server_model_status_by_name(s, "m01", &st);
    assert_int_equal(st.state, MTS_MODEL_FAILED);
    assert_int_equal(st.load_failures, 1);
    /* Unknown model. */
    call *unknown = call_new("nope", 1);
    assert_int_equal(submit(s, unknown), MTS_ENOTFOUND);
    /* Wrong input shape: a precise error from the worker. */
    call *wrong = call_new("m00", 1);
    wrong->req.inputs[0].dims[1] = 2;
    assert_int_equal(submit(s, wrong), 0);
    assert_int_equal(call_wait(wrong), MTS_EINVAL);
    assert_non_null(strstr(wrong->msg, "input 'x' has shape [1,2,32,32], the model expects [-1,3,32,32]"));
    for (int i = 0; i < 16; i++) call_free(calls[i]);
    call_free(bad);
    call_free(again);
    call_free(unknown);
    call_free(wrong);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
}

/* Runs one request on `name` and returns its status. */
static int infer_once(mts_server *s, const char *name)
{
    call *c = call_new(name, 1);
    int rc = submit(s, c);
    if (!rc) rc = call_wait(c);
    call_free(c);
    return rc;
}

static void test_memory_budget_and_lfu(void **state)
{
    (void)state;
    /* Measure one model's real bytes first. */
    mts_config probe;
    make_config(&probe, 1, 4, model_path);
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&probe, &s, &err), 0);
    assert_int_equal(infer_once(s, "m00"), 0);
    mts_model_status st;
    mts_server_model_status_by_name(s, "m00", &st);
    int64_t one = st.memory_bytes;
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&probe);
    assert_true(one > 0);

    /* A device budget of 2.5 models: the third load evicts, whatever max_models says. */
    mts_config cfg;
    make_config(&cfg, 4, 100, model_path);
    cfg.memory_gb_per_device = (double)one * 2.5 / 1e9;
    cfg.eviction = MTS_EVICT_LFU;
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    /* m00 is used often but long ago; m01 once, recently. LFU must evict m01, not m00. */
    for (int i = 0; i < 5; i++) assert_int_equal(infer_once(s, "m00"), 0);
    assert_int_equal(infer_once(s, "m01"), 0);
    assert_int_equal(infer_once(s, "m02"), 0);
    mts_model_status a, b, c;
    mts_server_model_status_by_name(s, "m00", &a);
    mts_server_model_status_by_name(s, "m01", &b);
    mts_server_model_status_by_name(s, "m02", &c);
    printf("budget %lld bytes: m00 %s, m01 %s, m02 %s\n", (long long)(cfg.memory_gb_per_device * 1e9),
           mts_model_state_name(a.state), mts_model_state_name(b.state), mts_model_state_name(c.state));
    assert_int_equal(a.state, MTS_MODEL_READY);
    assert_int_equal(b.state, MTS_MODEL_UNLOADED);
    assert_int_equal(b.evictions, 1);
    assert_int_equal(c.state, MTS_MODEL_READY);
    mts_device_status ds;
    mts_server_device_status(s, 0, &ds);
    assert_true(ds.bytes_used <= ds.bytes_budget);
    assert_int_equal(ds.models, 2);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
}

/* Runs one request of `batch` samples on m00; returns the model's memory bytes afterwards. */
static int64_t run_and_measure(mts_server *s, int batch)
{
    call *c = call_new("m00", batch);
    assert_int_equal(submit(s, c), 0);
    assert_int_equal(call_wait(c), 0);
    call_free(c);
    mts_model_status st;
    mts_server_model_status_by_name(s, "m00", &st);
    return st.memory_bytes;
}

/* 48 single-sample requests at once; returns the status afterwards (all must succeed). */
static void storm_status(mts_server *s, mts_model_status *st)
{
    enum { N = 48 };
    call *calls[N];
    for (int i = 0; i < N; i++) {
        calls[i] = call_new("m00", 1);
        assert_int_equal(submit(s, calls[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(call_wait(calls[i]), 0);
        call_free(calls[i]);
    }
    mts_server_model_status_by_name(s, "m00", st);
}

static int largest_batch(const mts_model_status *st)
{
    int b = 0;
    for (int k = 1; k <= MTS_MAX_BATCH_STATS; k++)
        if (st->batch_infer[k].count) b = k;
    return b;
}

/* Memory-aware batching: with memory to spare batches reach max_batch; on a device whose budget
 * leaves room for only a few samples of activations, batches are capped (and counted) and every
 * request still succeeds. */
static void test_memory_aware_batching(void **state)
{
    (void)state;
    /* One context: the arithmetic below is exact. So no short-work lane, which runs a batch its
     * cost estimate calls short in a second context while the worker runs another (a batch of
     * one always runs, budget or not): seen once in an ASan run under make test's load, 48
     * engine runs for 49 requests and 128 KiB over the budget worked out here for one context. */
    setenv("MTS_SHORT_LANE", "0", 1);
    mts_config cfg;
    make_config(&cfg, 1, 4, model_path);
    cfg.workers_per_device = 1;
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    int64_t m1 = run_and_measure(s, 1), m4 = run_and_measure(s, 4); /* call_new holds up to 4 samples */
    /* Each new batch size also adds its plan (and oneDNN primitives) to the model's bytes: a
     * batch of 2 adds one more plan and no activations (the context already holds 4 samples). */
    int64_t plan = run_and_measure(s, 2) - m4;
    mts_model_status roomy;
    storm_status(s, &roomy);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
    int64_t per = (m4 - m1 - plan) / 3;
    printf("memory-aware batching: model %lld bytes at batch 1, %lld at batch 4 (%lld per sample); largest batch "
           "with room %d, capped %llu\n", (long long)m1, (long long)m4, (long long)per, largest_batch(&roomy),
           (unsigned long long)roomy.memory_capped_batches);
    assert_true(per > 0);
    assert_int_equal(roomy.memory_capped_batches, 0);
    assert_true(largest_batch(&roomy) > 4);

    /* Budget: the model after a batch of 1, plus 2 samples' worth. */
    make_config(&cfg, 1, 4, model_path);
    cfg.workers_per_device = 1;
    cfg.memory_gb_per_device = (double)(m1 + 2 * per) / 1e9;
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    run_and_measure(s, 1);
    mts_model_status tight;
    storm_status(s, &tight);
    mts_device_status ds;
    mts_server_device_status(s, 0, &ds);
    printf("memory-aware batching: budget %lld bytes: largest batch %d, capped batches %llu, executions %llu, used "
           "%lld\n", (long long)ds.bytes_budget, largest_batch(&tight), (unsigned long long)tight.memory_capped_batches,
           (unsigned long long)tight.execution_count, (long long)ds.bytes_used);
    assert_true(tight.memory_capped_batches > 0);
    assert_true(largest_batch(&tight) <= 3);
    assert_true(ds.bytes_used <= ds.bytes_budget);
    size_t len;
    char *metrics = mts_server_metrics(s, &len);
    assert_non_null(strstr(metrics, "mts_batches_memory_capped_total{model=\"m00\"} "));
    free(metrics);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
    unsetenv("MTS_SHORT_LANE");
}

static void test_devices_and_idle_timeout(void **state)
{
    (void)state;
    mts_config cfg;
    make_config(&cfg, 4, 10, model_path);
    cfg.device_count = 2;
    cfg.threads_per_device = 1;
    cfg.workers_per_device = 1;
    cfg.memory_gb_per_device = 1;
    cfg.placement = MTS_PLACE_ROUND_ROBIN;
    cfg.models[3].preferred_device = 1;
    cfg.idle_timeout_minutes = 0.02; /* 1.2 s */
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    assert_int_equal(infer_once(s, "m00"), 0);
    assert_int_equal(infer_once(s, "m01"), 0);
    assert_int_equal(infer_once(s, "m03"), 0);
    mts_model_status a, b, d;
    mts_server_model_status_by_name(s, "m00", &a);
    mts_server_model_status_by_name(s, "m01", &b);
    mts_server_model_status_by_name(s, "m03", &d);
    printf("placement: m00 on cpu:%d, m01 on cpu:%d, m03 (preferred 1) on cpu:%d\n", a.device, b.device, d.device);
    assert_int_not_equal(a.device, b.device); /* round-robin */
    assert_int_equal(d.device, 1);
    mts_device_status d0, d1;
    mts_server_device_status(s, 0, &d0);
    mts_server_device_status(s, 1, &d1);
    assert_int_equal(d0.models + d1.models, 3);
    /* Idle timeout: with no traffic, all three are unloaded within a few seconds. */
    int resident = 3;
    for (int k = 0; k < 60 && resident > 0; k++) {
        usleep(100000);
        mts_server_totals t;
        mts_server_totals_get(s, &t);
        resident = t.resident_models;
    }
    assert_int_equal(resident, 0);
    mts_server_model_status_by_name(s, "m00", &a);
    assert_int_equal(a.state, MTS_MODEL_UNLOADED);
    assert_int_equal(a.evictions, 1);
    /* And it comes back on the next request. */
    assert_int_equal(infer_once(s, "m00"), 0);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
}


/* Fair sharing by compute time: m00 sends requests of 4 samples (max_batch 4: one request a
 * batch), m01 single samples with max_batch 1, so one turn of m00 costs several turns of m01.
 * Both are backlogged; when m00's last request completes, each model's share of the device time
 * its batches took so far (the sum of its requests' compute_ms: one request a batch) must match
 * its weight (equal weights: 50 % +- 10 %; m01 at weight 3: 60-85 %, 0.71-0.75 typically).
 * Taking turns gave m01 36 %. */
static double done_compute_ms(call **c, int n, int *done)
{
    double ms = 0;
    *done = 0;
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&c[i]->mu);
        if (c[i]->done && c[i]->status == 0) {
            ms += c[i]->req.compute_ms;
            (*done)++;
        }
        pthread_mutex_unlock(&c[i]->mu);
    }
    return ms;
}

/* The weighted share of the regular workers. The short-work lane is off here: it runs light
 * requests (m01's single samples) beside the weighted queue, and with it on m01 at weight 3
 * measured anywhere from 0.51 to 0.75 over ten runs (with it off: 0.753-0.757); the lane has
 * tests of its own below. */
static void fair_share_run(double w1, double want)
{
    setenv("MTS_SHORT_LANE", "0", 1);
    mts_config cfg;
    make_config(&cfg, 2, 4, model_path);
    cfg.models[0].max_batch = 4;
    cfg.models[1].max_batch = 1;
    cfg.models[1].weight = w1;
    /* m01's backlog must outlast m00's 150 batches at 3x m00's share whatever the two models'
     * costs are on this machine and build: m01's 12,000 single samples are over 3x m00's 150
     * batches of 4 while such a batch costs less than 26 single ones (measured: 3.8 in a release
     * build, 10.4 under ThreadSanitizer, where 3,000 single samples ran out first). What m01 has
     * left when m00 is done is failed by a shutdown without grace: the backlog costs no more. */
    cfg.models[0].queue_size = cfg.models[1].queue_size = 12000;
    cfg.max_queue_total = 24000;
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    /* warm both models (load, plans, cost estimates) */
    for (int r = 0; r < 3; r++) {
        call *w0 = call_new("m00", 4), *w1c = call_new("m01", 1);
        assert_int_equal(submit(s, w0), 0);
        assert_int_equal(submit(s, w1c), 0);
        assert_int_equal(call_wait(w0), 0);
        assert_int_equal(call_wait(w1c), 0);
        call_free(w0);
        call_free(w1c);
    }
    enum { N0 = 150, N1 = 12000 };
    call **c0 = calloc(N0, sizeof *c0), **c1 = calloc(N1, sizeof *c1);
    for (int i = 0; i < N1; i++) {
        c1[i] = call_new("m01", 1);
        if (i < N0) c0[i] = call_new("m00", 4);
    }
    for (int i = 0; i < N1; i++) {
        if (i < N0) assert_int_equal(submit(s, c0[i]), 0);
        assert_int_equal(submit(s, c1[i]), 0);
    }
    for (int i = 0; i < N0; i++) assert_int_equal(call_wait(c0[i]), 0);
    int d0, d1;
    double t1 = done_compute_ms(c1, N1, &d1), t0 = done_compute_ms(c0, N0, &d0);
    printf("fair share (m01 weight %.0f): m00 %.1f ms of batches (%d requests of 4 samples), m01 %.1f ms (%d of %d "
           "single-sample requests done): m01 share %.3f, want %.2f\n",
           w1, t0, d0, t1, d1, N1, t1 / (t0 + t1), want);
    assert_true(d1 < N1); /* m01 was still backlogged */
    /* equal weights: the isolation target, 50 % +- 10 %; 3 : 1 well above that, near 75 % (the
     * charge is CPU time, this measures wall time: preemption makes it noisier) */
    if (w1 == 1.0) assert_true(fabs(t1 / (t0 + t1) - want) <= 0.10);
    else assert_true(t1 / (t0 + t1) >= 0.6 && t1 / (t0 + t1) <= 0.85);
    mts_server_shutdown(s, 0); /* fails m01's remaining backlog */
    for (int i = 0; i < N1; i++) {
        call_wait(c1[i]);
        call_free(c1[i]);
        if (i < N0) call_free(c0[i]);
    }
    free(c0);
    free(c1);
    mts_server_free(s);
    mts_config_free(&cfg);
    unsetenv("MTS_SHORT_LANE");
}

static void test_fair_share_by_compute_time(void **state)
{
    (void)state;
    fair_share_run(1.0, 0.5);
    fair_share_run(3.0, 0.75);
}


/* Batches the short-work lane ("short") or the regular workers have run, from /metrics. */
static unsigned long long worker_batches(mts_server *s, bool lane)
{
    size_t len = 0;
    char *m = mts_server_metrics(s, &len);
    assert_non_null(m);
    unsigned long long total = 0;
    for (char *p = m; (p = strstr(p, "mts_worker_batches_total{")); p++) {
        char *w = strstr(p, "worker=\""), *end = strchr(p, '}');
        assert_true(w && end && w < end);
        bool is_lane = !strncmp(w + 8, "short\"", 6);
        if (is_lane == lane) total += strtoull(end + 1, NULL, 10);
    }
    free(m);
    return total;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The scheduler's cost estimate for model's samples, from the metrics (seconds; -1 before its
 * first batch). */
static double cost_estimate(mts_server *s, const char *model)
{
    size_t len = 0;
    char *m = mts_server_metrics(s, &len);
    assert_non_null(m);
    char key[128];
    snprintf(key, sizeof key, "mts_model_cost_per_sample_seconds{model=\"%s\"} ", model);
    char *p = strstr(m, key);
    double v = p ? strtod(p + strlen(key), NULL) : -1;
    free(m);
    return v;
}

/* n requests to model, one at a time, each answered before the next, with a pause after each
 * (every thread back to waiting, and the lane's time budget refilled). Counts the ones submit
 * reported prompt and the ones already answered when submit returned; the largest cost
 * estimate seen between them goes to *max_est_us. The pause is 5 ms or 20 times the request's
 * round trip, whichever is longer: the lane earns 10 % of the wall time, so it earns more than
 * the batch took even where sanitizers and a slow machine make a batch take 0.5 ms or more
 * (at a fixed 5 ms it then spent its budget, and a third of the batches went to the regular
 * workers); at most 200 ms. */
static void one_at_a_time(mts_server *s, const char *model, int n, bool run_inline, int *prompt, int *at_return,
                          double *max_est_us)
{
    *prompt = *at_return = 0;
    *max_est_us = 0;
    for (int i = 0; i < n; i++) {
        call *c = call_new(model, 1);
        c->req.run_inline = run_inline;
        int64_t t0 = now_ns();
        assert_int_equal(submit(s, c), 0);
        *prompt += c->req.prompt; /* (set by submit on this thread) */
        pthread_mutex_lock(&c->mu);
        *at_return += c->done;
        pthread_mutex_unlock(&c->mu);
        assert_int_equal(call_wait(c), 0);
        int64_t took_us = (now_ns() - t0) / 1000;
        call_free(c);
        double est = 1e6 * cost_estimate(s, model);
        if (est > *max_est_us) *max_est_us = est;
        int64_t pause_us = took_us * 20 > 5000 ? took_us * 20 : 5000;
        usleep((useconds_t)(pause_us < 200000 ? pause_us : 200000));
    }
}

/* Light requests one at a time on an idle device wake the short-work lane alone: a ready model
 * wakes one thread, not every worker, so every one of their batches runs on the lane (when every
 * idle worker was woken, one of the regular workers took some of them). */
static void test_light_work_wakes_the_lane(void **state)
{
    (void)state;
    mts_config cfg;
    make_config(&cfg, 1, 4, model_path);
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    for (int i = 0; i < 20; i++) { /* loaded, planned, its batch cost measured, lane budget earned */
        assert_int_equal(infer_once(s, "m00"), 0);
        usleep(3000);
    }
    unsigned long long lane0 = worker_batches(s, true), regular0 = worker_batches(s, false);
    int prompt, at_return;
    double max_est;
    one_at_a_time(s, "m00", 100, false, &prompt, &at_return, &max_est);
    unsigned long long lane = worker_batches(s, true) - lane0, regular = worker_batches(s, false) - regular0;
    printf("100 light requests on an idle device: %llu batches on the lane, %llu on regular workers, %d "
           "reported prompt; cost estimate at most %.0f us (the lane takes up to 2000)\n", lane, regular, prompt,
           max_est);
    assert_int_equal(lane + regular, 100);
    /* a few may go to a worker: a stalled batch raises the model's cost estimate above what the
     * lane takes for a while (0-2 here, up to 8 seen under ThreadSanitizer). Waking every idle
     * worker sent 11-16 % of them there. */
    assert_true(regular <= 9);
    /* each found a waiting thread woken for it (the lane, or an idle worker) */
    assert_true(prompt >= 90);
    /* a burst: requests that find others queued before them are not prompt (a front end
     * watches those for cancellation). Each burst request's answer holds the thread that ran
     * it until the whole burst is in, so the lane and the 2 workers take one batch each at
     * most: <= 3 found a thread free for them, one more may find a worker still answering,
     * and from then on every request finds the one before it queued. (Without the hold, a
     * fast thread could take each request before the next was submitted, all 16 prompt.) */
    call *burst[16];
    int burst_prompt = 0;
    gate_set(false);
    for (int i = 0; i < 16; i++) {
        burst[i] = call_new("m00", 1);
        burst[i]->gated = true;
        assert_int_equal(submit(s, burst[i]), 0);
        burst_prompt += burst[i]->req.prompt;
    }
    gate_set(true);
    for (int i = 0; i < 16; i++) {
        assert_int_equal(call_wait(burst[i]), 0);
        call_free(burst[i]);
    }
    printf("a burst of 16: %d reported prompt\n", burst_prompt);
    assert_true(burst_prompt <= 4);
    /* requests the front end lets run on its own thread: the lane waits, so the submitting
     * thread runs each batch itself, answered before submit returns, counted as the lane's */
    usleep(20000);
    lane0 = worker_batches(s, true), regular0 = worker_batches(s, false);
    one_at_a_time(s, "m00", 100, true, &prompt, &at_return, &max_est);
    lane = worker_batches(s, true) - lane0, regular = worker_batches(s, false) - regular0;
    printf("100 requests run_inline: %d answered before submit returned; %llu lane batches, %llu regular; cost "
           "estimate at most %.0f us\n", at_return, lane, regular, max_est);
    assert_int_equal(lane + regular, 100);
    assert_true(at_return >= 90);
    /* a run_inline request behind one the lane was just woken for (queued, the lane not yet on
     * a core): the submitting thread runs the model's batch, both requests, instead of leaving
     * its own to a lane the OS may not schedule for a long while */
    int pairs_done = 0;
    for (int i = 0; i < 50; i++) {
        call *first = call_new("m00", 1), *second = call_new("m00", 1);
        second->req.run_inline = true;
        assert_int_equal(submit(s, first), 0);
        assert_int_equal(submit(s, second), 0);
        pthread_mutex_lock(&second->mu);
        pairs_done += second->done;
        pthread_mutex_unlock(&second->mu);
        assert_int_equal(call_wait(first), 0);
        assert_int_equal(call_wait(second), 0);
        call_free(first);
        call_free(second);
        usleep(5000);
    }
    printf("50 run_inline requests behind one queued for the lane: %d answered before submit returned\n",
           pairs_done);
    assert_true(pairs_done >= 25);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
}

/* The scheduler's cost estimate, which decides what the short-work lane takes, is not moved
 * by batches that build a plan for a new batch size (one such batch made a light model look
 * long: its next requests went to the regular workers, behind a heavy model's batches). */
static void test_cost_estimate_ignores_plan_builds(void **state)
{
    (void)state;
    mts_config cfg;
    make_config(&cfg, 1, 4, model_path);
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    /* the first batch builds the model's plan and context: the estimate it sets is replaced by
     * the second batch's */
    assert_int_equal(infer_once(s, "m00"), 0);
    double first = cost_estimate(s, "m00");
    assert_int_equal(infer_once(s, "m00"), 0);
    double second = cost_estimate(s, "m00");
    printf("cost estimate per sample after the first batch %.1f us, after the second %.1f us\n", first * 1e6,
           second * 1e6);
    assert_true(first > 0 && second > 0 && second < first / 2);
    for (int i = 0; i < 30; i++) { /* batches of one sample, the estimate settled */
        assert_int_equal(infer_once(s, "m00"), 0);
        usleep(2000);
    }
    double before = cost_estimate(s, "m00");
    assert_true(before > 0);
    /* batches of sizes 2..4, each the first of its size (a plan built in it) */
    for (int size = 2; size <= 4; size++) { /* (a call holds at most 4 samples) */
        call *c = call_new("m00", size);
        assert_int_equal(submit(s, c), 0);
        assert_int_equal(call_wait(c), 0);
        call_free(c);
    }
    double after = cost_estimate(s, "m00");
    printf("cost estimate per sample: %.1f us after 30 single-sample batches, %.1f us after the first "
           "batches of sizes 2-4\n", before * 1e6, after * 1e6);
    assert_true(after <= before * 1.0001);
    /* and ordinary batches still move it */
    for (int i = 0; i < 5; i++) assert_int_equal(infer_once(s, "m00"), 0);
    double later = cost_estimate(s, "m00");
    printf("after 5 more single-sample batches: %.1f us\n", later * 1e6);
    assert_true(later > 0 && later != after);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
}

static int count_done(call **c, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&c[i]->mu);
        k += c[i]->done;
        pthread_mutex_unlock(&c[i]->mu);
    }
    return k;
}

/* Priorities: with one worker (and the short-work lane off, so order is the worker's), m00 at
 * level 1 overtakes m01's backlog at the default level 5: its request completes while nearly all
 * of m01's 200 are still queued. A second m00 request that lowers its own priority to 9 (the
 * KServe 'priority' parameter) runs only after all of them. */
static void test_priorities(void **state)
{
    (void)state;
    setenv("MTS_SHORT_LANE", "0", 1);
    mts_config cfg;
    make_config(&cfg, 2, 4, model_path);
    cfg.workers_per_device = 1;
    cfg.models[0].priority = 1;
    cfg.models[1].max_batch = 1;
    cfg.models[0].queue_size = cfg.models[1].queue_size = 1000;
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    for (int m = 0; m < 2; m++) { /* loaded and warm */
        call *w = call_new(m ? "m01" : "m00", 1);
        assert_int_equal(submit(s, w), 0);
        assert_int_equal(call_wait(w), 0);
        call_free(w);
    }
    enum { N = 200 };
    call *c1[N];
    for (int i = 0; i < N; i++) {
        c1[i] = call_new("m01", 1);
        assert_int_equal(submit(s, c1[i]), 0);
    }
    call *first = call_new("m00", 1), *last = call_new("m00", 1);
    last->req.priority = 9;
    int before = count_done(c1, N); /* run while the backlog was being queued */
    assert_int_equal(submit(s, first), 0);
    assert_int_equal(submit(s, last), 0);
    assert_int_equal(call_wait(first), 0);
    int at_first = count_done(c1, N);
    assert_int_equal(call_wait(last), 0);
    int at_last = count_done(c1, N);
    printf("priorities: m00 (level 1) done after %d of m01's %d (level 5) (%d before it was queued); m00 at "
           "request priority 9 after %d\n", at_first, N, before, at_last);
    /* The batch running and a few more finishing while this thread is descheduled on a loaded
     * machine, but never the backlog: at least half of what was queued is still waiting. */
    assert_true(2 * (at_first - before) <= N - before);
    assert_int_equal(at_last, N);
    for (int i = 0; i < N; i++) call_free(c1[i]);
    call_free(first);
    call_free(last);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
    unsetenv("MTS_SHORT_LANE");
}

/* A load blocked by a busy model waits for it instead of failing: with room for one model,
 * m01's request arrives while m00 works through a backlog; it is answered once m00 has gone
 * idle and been evicted, with no load failure and no back-off. (Failing at once put m01 into a
 * 1 s back-off and answered 503.) */
static void test_load_waits_for_busy_model(void **state)
{
    (void)state;
    mts_config cfg;
    make_config(&cfg, 2, 1, model_path);
    cfg.models[0].max_batch = 1;
    cfg.models[0].queue_size = 1000;
    cfg.max_queue_total = 2000;
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);
    assert_int_equal(infer_once(s, "m00"), 0);
    enum { N = 200 };
    call *c0[N];
    for (int i = 0; i < N; i++) {
        c0[i] = call_new("m00", 1);
        assert_int_equal(submit(s, c0[i]), 0);
    }
    call *c1 = call_new("m01", 1);
    assert_int_equal(submit(s, c1), 0);
    int rc1 = call_wait(c1);
    int done0 = count_done(c0, N);
    printf("load behind a busy model: m01 status %d (%s) after %d of m00's %d requests\n", rc1, c1->msg, done0, N);
    assert_int_equal(rc1, 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(call_wait(c0[i]), 0);
        call_free(c0[i]);
    }
    mts_model_status st;
    mts_server_model_status_by_name(s, "m01", &st);
    assert_int_equal(st.load_failures, 0);
    assert_int_equal(st.state, MTS_MODEL_READY);
    call_free(c1);
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
}

/* Preemption between engine steps (MTS_PREEMPT=1, the short-work lane off, one worker): a short
 * request of a light model arriving while a long batch of a heavy model (seg_unet, batch 4, tens
 * of steps) runs is answered between two of its steps, before that batch ends; without
 * preemption it would wait for the whole batch. The light model's status counts the batch. */
typedef struct heavy_call {
    mts_request req;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status;
    float *input;
} heavy_call;

static void heavy_done(mts_request *r, int status, const char *msg)
{
    (void)msg;
    heavy_call *c = (heavy_call *)r;
    pthread_mutex_lock(&c->mu);
    c->status = status;
    c->done = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static heavy_call *heavy_new(int batch)
{
    heavy_call *c = calloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->req.model = "heavy";
    c->req.n_inputs = 1;
    c->req.input_names[0] = "image";
    mts_tensor *t = &c->req.inputs[0];
    t->dtype = MTS_DTYPE_FLOAT;
    t->rank = 4;
    t->dims[0] = batch, t->dims[1] = 3, t->dims[2] = 256, t->dims[3] = 256;
    size_t n = (size_t)batch * 3 * 256 * 256;
    c->input = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) c->input[i] = (float)(i % 255) / 255.0f;
    t->data = c->input;
    c->req.done = heavy_done;
    return c;
}

static int heavy_wait(heavy_call *c)
{
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    return c->status;
}

static int heavy_is_done(heavy_call *c)
{
    pthread_mutex_lock(&c->mu);
    int d = c->done;
    pthread_mutex_unlock(&c->mu);
    return d;
}

static void heavy_free(heavy_call *c)
{
    mts_request_release(&c->req);
    free(c->input);
    free(c);
}

/* A server for the preemption tests (the short-work lane off, preemption on): "heavy" is
 * seg_unet with max_batch heavy_batch, m01 the small test model; the environment is restored by
 * preempt_server_free. */
static mts_server *preempt_server(mts_config *cfg, int workers, int heavy_batch, int light_batch)
{
    char heavy_path[4096];
    test_path(heavy_path, sizeof heavy_path, "models/out/seg_unet.onnx");
    if (access(heavy_path, R_OK) != 0) fail_msg("%s is missing: run make models", heavy_path);
    setenv("MTS_SHORT_LANE", "0", 1);
    setenv("MTS_PREEMPT", "1", 1);
    make_config(cfg, 2, 4, model_path);
    cfg->workers_per_device = workers;
    free(cfg->models[0].name);
    free(cfg->models[0].model_path);
    cfg->models[0].name = strdup("heavy");
    cfg->models[0].model_path = strdup(heavy_path);
    cfg->models[0].max_batch = heavy_batch;
    cfg->models[1].max_batch = light_batch;
    mts_server *s;
    mts_err err = {0};
    assert_int_equal(mts_server_create(cfg, &s, &err), 0);
    return s;
}

static void preempt_server_free(mts_server *s, mts_config *cfg)
{
    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(cfg);
    unsetenv("MTS_SHORT_LANE");
    unsetenv("MTS_PREEMPT");
}

static void test_preemption_between_steps(void **state)
{
    (void)state;
    mts_config cfg;
    mts_server *s = preempt_server(&cfg, 1, 4, 1);
    mts_err err = {0};
    for (int r = 0; r < 2; r++) { /* loaded, planned, costs measured */
        heavy_call *h = heavy_new(4);
        call *l = call_new("m01", 1);
        assert_int_equal(mts_server_submit(s, &h->req, NULL, &err), 0);
        assert_int_equal(submit(s, l), 0);
        assert_int_equal(heavy_wait(h), 0);
        assert_int_equal(call_wait(l), 0);
        heavy_free(h);
        call_free(l);
    }
    int preempted = 0, rounds = 0;
    double light_ms = 0, heavy_ms = 0;
    for (; rounds < 5 && !preempted; rounds++) {
        heavy_call *h = heavy_new(4);
        int64_t t0 = now_ns();
        assert_int_equal(mts_server_submit(s, &h->req, NULL, &err), 0);
        usleep(20000); /* the heavy batch is under way */
        call *l = call_new("m01", 1);
        int64_t t1 = now_ns();
        assert_int_equal(submit(s, l), 0);
        assert_int_equal(call_wait(l), 0);
        int64_t t2 = now_ns();
        int heavy_still_running = !heavy_is_done(h);
        assert_int_equal(heavy_wait(h), 0);
        int64_t t3 = now_ns();
        light_ms = (double)(t2 - t1) / 1e6;
        heavy_ms = (double)(t3 - t0) / 1e6;
        preempted = heavy_still_running;
        heavy_free(h);
        call_free(l);
    }
    mts_model_status st;
    mts_server_model_status_by_name(s, "m01", &st);
    printf("preemption: light request answered in %.1f ms while the heavy batch took %.1f ms (round %d); %llu "
           "preempting batches\n", light_ms, heavy_ms, rounds, (unsigned long long)st.preempting_batches);
    assert_true(preempted);
    assert_true(st.preempting_batches >= 1);
    preempt_server_free(s, &cfg);
}

/* Preemption with two regular workers under concurrent load (the sanitizer builds run it): one
 * thread keeps both workers busy with heavy batches while two threads send light requests for as
 * long as it runs, so light batches run inside preempted heavy batches on both workers at once.
 * Every request must succeed, every light answer must equal the first, and light batches must
 * have preempted. */
static atomic_int heavy_running;

typedef struct stress_arg {
    mts_server *s;
    int n, errors, mismatches;
    float ref[16];
    int have_ref;
} stress_arg;

static void *stress_light(void *arg)
{
    stress_arg *a = arg;
    for (int i = 0; i < 5000 && (i < a->n || atomic_load(&heavy_running)); i++) {
        call *l = call_new("m01", 1);
        if (submit(a->s, l) || call_wait(l)) {
            a->errors++;
        } else {
            const float *o = l->req.outputs[0].data;
            int64_t n = mts_tensor_numel(&l->req.outputs[0]);
            if (n > 16) n = 16;
            if (!a->have_ref) {
                memcpy(a->ref, o, (size_t)n * sizeof(float));
                a->have_ref = 1;
            } else {
                for (int64_t k = 0; k < n; k++)
                    if (fabsf(o[k] - a->ref[k]) > 1e-4f * (1.0f + fabsf(a->ref[k]))) a->mismatches++;
            }
        }
        call_free(l);
    }
    return NULL;
}

static void *stress_heavy(void *arg)
{
    stress_arg *a = arg;
    for (int i = 0; i < a->n; i++) {
        heavy_call *h[2];
        for (int k = 0; k < 2; k++) {
            h[k] = heavy_new(1);
            mts_err err = {0};
            if (mts_server_submit(a->s, &h[k]->req, NULL, &err)) h[k]->status = -1, h[k]->done = 1;
        }
        for (int k = 0; k < 2; k++) {
            if (heavy_wait(h[k])) a->errors++;
            heavy_free(h[k]);
        }
    }
    atomic_store(&heavy_running, 0);
    return NULL;
}

static void test_preemption_two_workers_under_load(void **state)
{
    (void)state;
    mts_config cfg;
    mts_server *s = preempt_server(&cfg, 2, 1, 4); /* two heavy requests: a batch on each worker */
    stress_arg warm = {.s = s, .n = 1}, warm_light = {.s = s, .n = 2};
    stress_heavy(&warm); /* loaded and costs measured before the load starts */
    stress_light(&warm_light);
    assert_int_equal(warm.errors + warm_light.errors, 0);
    atomic_store(&heavy_running, 1);
    stress_arg heavy = {.s = s, .n = 3}, light[2] = {{.s = s, .n = 10}, {.s = s, .n = 10}};
    pthread_t th[3];
    pthread_create(&th[0], NULL, stress_heavy, &heavy);
    for (int i = 0; i < 2; i++) pthread_create(&th[1 + i], NULL, stress_light, &light[i]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    mts_model_status st;
    mts_server_model_status_by_name(s, "m01", &st);
    printf("preemption on 2 workers under load: %llu preempting batches of the light model\n",
           (unsigned long long)st.preempting_batches);
    assert_int_equal(heavy.errors + light[0].errors + light[1].errors, 0);
    assert_int_equal(light[0].mismatches + light[1].mismatches, 0);
    assert_true(st.preempting_batches >= 1);
    for (int k = 0; k < 16; k++) assert_true(fabsf(light[0].ref[k] - light[1].ref[k]) <= 1e-4f * (1.0f + fabsf(light[0].ref[k])));
    preempt_server_free(s, &cfg);
}

int main(void)
{
    mts_log_set_level(MTS_LOG_WARN);
    /* No per-primitive charge: oneDNN makes a primitive per team size, and the team size a batch
     * gets depends on the other workers, so the charge would make the byte arithmetic of the
     * memory-aware batching test depend on timing. */
    setenv("MTS_DNNL_PRIM_BYTES", "0", 1);
    test_path(model_path, sizeof model_path, "tests/models/out/small_cnn.onnx");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_storm_one_load_and_batching),
        cmocka_unit_test(test_eviction_20_through_5),
        cmocka_unit_test(test_queue_full_timeout_unload),
        cmocka_unit_test(test_reload_and_failed_load),
        cmocka_unit_test(test_memory_budget_and_lfu),
        cmocka_unit_test(test_memory_aware_batching),
        cmocka_unit_test(test_devices_and_idle_timeout),
        cmocka_unit_test(test_fair_share_by_compute_time),
        cmocka_unit_test(test_light_work_wakes_the_lane),
        cmocka_unit_test(test_cost_estimate_ignores_plan_builds),
        cmocka_unit_test(test_priorities),
        cmocka_unit_test(test_load_waits_for_busy_model),
        cmocka_unit_test(test_preemption_between_steps),
        cmocka_unit_test(test_preemption_two_workers_under_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
