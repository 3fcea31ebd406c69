/*
 * The dashboard's server-side bookkeeping through mts_server_dashboard_json, with a real model on
 * real worker threads: per-model window sums (answered and failed requests, latency count and
 * percentiles, batch-size histogram, per-second series), device and server figures, and the
 * event ring (loads, evictions through max_models 1, a failed load with its reason, wrap-around
 * after more than 128 events, newest first with contiguous sequence numbers). Runs plain, under
 * ASan+UBSan and under TSan in `make test`.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "serve/server.h"
#include "test_util.h"
#include "util/json.h"
#include "util/log.h"

typedef struct call {
    mts_request req;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status;
    float input[3 * 32 * 32 * 2];
} call;

static void on_done(mts_request *r, int status, const char *msg)
{
    call *c = (call *)r;
    pthread_mutex_lock(&c->mu);
    c->status = status;
    c->done = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Runs one request of `batch` samples (width 32, or 31 to be refused by validation). */
static int run(mts_server *s, const char *model, int batch, int width)
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
    t->dims[3] = width;
    t->data = c->input;
    c->req.done = on_done;
    mts_err err = {0};
    int retry = 0;
    int rc = mts_server_submit(s, &c->req, &retry, &err);
    if (!rc) {
        pthread_mutex_lock(&c->mu);
        while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
        rc = c->status;
    }
    mts_request_release(&c->req);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
    return rc;
}

static mts_json_doc *state(mts_server *s)
{
    size_t len = 0;
    char *text = mts_server_dashboard_json(s, &len);
    assert_non_null(text);
    mts_json_doc *doc = NULL;
    mts_err err = {0};
    if (mts_json_parse(text, len, &doc, &err)) fail_msg("state is not JSON: %s", err.msg);
    free(text);
    return doc;
}

static const mts_json *model_of(const mts_json_doc *doc, const char *name)
{
    const mts_json *models = mts_json_get(mts_json_root(doc), "models");
    for (size_t i = 0; i < mts_json_len(models); i++) {
        const mts_json *m = mts_json_at(models, i);
        if (!strcmp(mts_json_str(mts_json_get(m, "name"), NULL), name)) return m;
    }
    fail_msg("model %s missing", name);
    return NULL;
}

static double num(const mts_json *obj, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const mts_json *v = obj;
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save)) v = mts_json_get(v, k);
    return mts_json_num(v);
}

static const char *str(const mts_json *obj, const char *key)
{
    const char *s = mts_json_str(mts_json_get(obj, key), NULL);
    return s ? s : "(null)";
}

static char model_path[4096];

static void test_windows_and_events(void **unused)
{
    (void)unused;
    mts_config cfg;
    mts_config_defaults(&cfg);
    cfg.max_models = 1;
    cfg.device_count = 1;
    cfg.workers_per_device = 1;
    cfg.threads_per_device = 1;
    cfg.max_memory_gb = 4;
    cfg.n_models = 3;
    cfg.models = calloc(3, sizeof *cfg.models);
    const char *names[] = {"a", "b", "broken"};
    for (int i = 0; i < 3; i++) {
        cfg.models[i].name = strdup(names[i]);
        cfg.models[i].model_path = strdup(i < 2 ? model_path : "/nonexistent/dashboard-test.onnx");
        cfg.models[i].preferred_device = -1;
        cfg.models[i].max_batch = 8;
    }
    mts_err err = {0};
    if (mts_config_finalize(&cfg, &err)) fail_msg("finalize: %s", err.msg);
    mts_server *s;
    assert_int_equal(mts_server_create(&cfg, &s, &err), 0);

    /* a fresh server: every model unloaded, no events, empty windows */
    mts_json_doc *doc = state(s);
    const mts_json *root = mts_json_root(doc);
    assert_int_equal(mts_json_len(mts_json_get(root, "events")), 0);
    assert_int_equal(mts_json_len(mts_json_get(root, "models")), 3);
    assert_string_equal(str(model_of(doc, "a"), "state"), "UNLOADED");
    assert_string_equal(str(model_of(doc, "a"), "precision"), "fp32");
    assert_true(mts_json_type(mts_json_get(mts_json_get(model_of(doc, "a"), "latency_ms"), "p50")) == MTS_JSON_NULL);
    assert_true(mts_json_type(mts_json_get(model_of(doc, "a"), "lipsync")) == MTS_JSON_NULL);
    assert_int_equal((int)num(root, "server.window_s"), 300);
    assert_int_equal(mts_json_len(mts_json_get(root, "devices")), 1);
    mts_json_free(doc);

    /* traffic on a: 5 single requests, one of 2 samples, one refused by validation */
    for (int i = 0; i < 5; i++) assert_int_equal(run(s, "a", 1, 32), 0);
    assert_int_equal(run(s, "a", 2, 32), 0);
    assert_int_not_equal(run(s, "a", 1, 31), 0);
    doc = state(s);
    root = mts_json_root(doc);
    const mts_json *a = model_of(doc, "a");
    assert_string_equal(str(a, "state"), "READY");
    assert_string_equal(str(a, "device"), "cpu:0");
    assert_true(num(a, "memory_bytes") > 0);
    assert_int_equal((int)num(a, "success_total"), 6);
    assert_int_equal((int)num(a, "latency_ms.count"), 6);
    double p50 = num(a, "latency_ms.p50"), p99 = num(a, "latency_ms.p99");
    assert_true(p50 > 0 && p99 >= p50);
    assert_true(num(a, "rates.requests_per_s") > 0);
    assert_true(num(a, "rates.errors_per_s") > 0); /* the refused request */
    const mts_json *counts = mts_json_get(mts_json_get(a, "batch_sizes"), "counts");
    assert_int_equal(mts_json_len(counts), 9);
    assert_int_equal((int)mts_json_num(mts_json_at(counts, 0)), 5); /* le 1 */
    assert_int_equal((int)mts_json_num(mts_json_at(counts, 1)), 1); /* le 2 */
    const mts_json *series = mts_json_get(mts_json_get(a, "series"), "requests");
    assert_int_equal(mts_json_len(series), 60);
    double total = 0;
    for (size_t i = 0; i < 60; i++) total += mts_json_num(mts_json_at(series, i));
    assert_true(total == 7); /* 6 answered + 1 refused, all within the last minute */
    const mts_json *dev = mts_json_at(mts_json_get(root, "devices"), 0);
    assert_true(num(dev, "used_bytes") > 0 && num(dev, "budget_bytes") > num(dev, "used_bytes"));
    const mts_json *ev = mts_json_get(root, "events");
    assert_int_equal(mts_json_len(ev), 1);
    assert_string_equal(str(mts_json_at(ev, 0), "kind"), "loaded");
    assert_string_equal(str(mts_json_at(ev, 0), "model"), "a");
    mts_json_free(doc);

    /* a failed load: its reason in the event and the model's row */
    assert_int_not_equal(run(s, "broken", 1, 32), 0);
    doc = state(s);
    ev = mts_json_get(mts_json_root(doc), "events");
    assert_string_equal(str(mts_json_at(ev, 0), "kind"), "load_failed");
    assert_string_equal(str(mts_json_at(ev, 0), "model"), "broken");
    assert_non_null(strstr(str(mts_json_at(ev, 0), "reason"), "dashboard-test.onnx"));
    assert_string_equal(str(model_of(doc, "broken"), "state"), "FAILED");
    assert_non_null(strstr(str(model_of(doc, "broken"), "reason"), "dashboard-test.onnx"));
    assert_true(num(model_of(doc, "broken"), "rates.errors_per_s") > 0); /* its queued request failed */
    mts_json_free(doc);

    /* max_models 1: alternating a and b evicts one for the other each time (loaded + evicted);
     * 70 rounds are 140 events, more than the ring's 128 */
    for (int i = 0; i < 70; i++) assert_int_equal(run(s, i % 2 ? "a" : "b", 1, 32), 0);
    doc = state(s);
    ev = mts_json_get(mts_json_root(doc), "events");
    assert_int_equal(mts_json_len(ev), 128);
    double first = mts_json_num(mts_json_get(mts_json_at(ev, 0), "seq"));
    assert_true(first >= 142);
    int evicted = 0;
    for (size_t i = 0; i < 128; i++) {
        const mts_json *e = mts_json_at(ev, i);
        assert_true(mts_json_num(mts_json_get(e, "seq")) == first - (double)i); /* newest first, contiguous */
        if (!strcmp(str(e, "kind"), "evicted")) {
            evicted++;
            assert_non_null(strstr(str(e, "reason"), "max_models"));
        }
    }
    assert_true(evicted >= 60);
    assert_true(num(model_of(doc, "a"), "evictions") >= 30);
    mts_json_free(doc);

    mts_server_shutdown(s, 5);
    mts_server_free(s);
    mts_config_free(&cfg);
}

int main(void)
{
    mts_log_set_level(MTS_LOG_OFF);
    test_path(model_path, sizeof model_path, "tests/models/out/small_cnn.onnx");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_windows_and_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
