/*
 * Plans of one model for several batch sizes share its weights. Building a plan drops the
 * unpacked copies of weights its oneDNN steps packed, and a plan for another batch size may run
 * the same node with a kernel of its own that still reads the copy (a batch-1 plan's direct
 * 1x1 conv beside a batch-8 plan's oneDNN conv). Checked on every generated reference model
 * (models/out) and the small test models:
 *  - sequential: batch 1, then batches 2..8 (each builds a new plan), then batch 1 again in the
 *    first context: its outputs equal the first run's bit for bit (before the fix the batch-1
 *    plan read unmapped or freed weights: SIGSEGV in the release build, heap-use-after-free
 *    under ASan, where weight copies come from malloc);
 *  - concurrent: two threads run the batch-1 plan over and over while a third builds plans for
 *    new batch sizes in a fresh model, each thread with its own one-thread context (the
 *    server's workers sharing a model under dynamic batching);
 *  - eviction: the binary runs with MTS_MAX_PLANS=3, so the two checks above also free plans
 *    while others are held and run; then one context walks batches 1..6 twice (the second pass
 *    rebuilds evicted plans; outputs identical bit for bit), and with three contexts each
 *    holding a plan a fourth signature is refused until one of them is freed.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdatomic.h>

#include "test_util.h"

static const char *const MODELS[] = {
    "models/out/mobilenetv3.onnx",  "models/out/lipsync_unet_w4.onnx", "models/out/cbam_resunet.onnx",
    "models/out/bert_tiny.onnx",    "models/out/seg_unet.onnx",        "tests/models/out/small_cnn.onnx",
};
#define N_MODELS (sizeof MODELS / sizeof MODELS[0])

/* The production backend (oneDNN, the optimizer, the fast kernels) also in sanitizer builds. */
static const mts_load_opts OPTS = {.backend = "default"};

static bool exists(const char *p)
{
    FILE *f = fopen(p, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* A model's inputs with a batch dimension: symbolic dims become the batch. Models whose inputs
 * have no symbolic dim have only one signature and are skipped. */
static bool has_symbolic_dim(const mts_model *m)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    for (int i = 0; i < info.n_inputs; i++) {
        const mts_value *v = mts_model_input(m, i);
        for (int d = 0; d < v->rank; d++)
            if (v->dims[d] < 0) return true;
    }
    return false;
}

/* Runs the context on inputs of the given batch; returns a malloc'd copy of output 0. */
static float *run_copy(mts_model *m, mts_ctx *c, int64_t batch, int64_t *n)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    mts_tensor *in = test_make_inputs(m, batch, 7);
    const mts_tensor *out[16];
    mts_err err = {0};
    if (mts_ctx_run(c, in, info.n_inputs, out, &err)) fail_msg("batch %lld: %s", (long long)batch, err.msg);
    *n = mts_tensor_numel(out[0]);
    float *copy = malloc((size_t)mts_tensor_nbytes(out[0]) + 1);
    memcpy(copy, out[0]->data, (size_t)mts_tensor_nbytes(out[0]));
    test_free_inputs(m, in);
    return copy;
}

static void test_sequential_batch_switch(void **state)
{
    (void)state;
    int checked = 0;
    for (size_t i = 0; i < N_MODELS; i++) {
        char path[4096];
        test_path(path, sizeof path, MODELS[i]);
        if (!exists(path)) continue;
        mts_err err = {0};
        mts_model *m;
        assert_int_equal(mts_model_load(path, &OPTS, &m, &err), 0);
        if (!has_symbolic_dim(m)) {
            mts_model_free(m);
            continue;
        }
        mts_ctx *c1, *cb;
        assert_int_equal(mts_ctx_create(m, 1, &c1, &err), 0);
        assert_int_equal(mts_ctx_create(m, 1, &cb, &err), 0);
        int64_t n0, n;
        float *first = run_copy(m, c1, 1, &n0);
        for (int64_t b = 2; b <= 8; b++) free(run_copy(m, cb, b, &n));
        float *again = run_copy(m, c1, 1, &n);
        assert_int_equal(n, n0);
        if (memcmp(first, again, (size_t)n0 * sizeof(float)) != 0)
            fail_msg("%s: batch-1 outputs changed after plans for batches 2-8 were built", MODELS[i]);
        printf("plans: %-36s batch 1 -> 2..8 -> 1: outputs identical (%lld values)\n", MODELS[i], (long long)n0);
        free(first);
        free(again);
        mts_ctx_free(c1);
        mts_ctx_free(cb);
        mts_model_free(m);
        checked++;
    }
    assert_true(checked >= 1);
}

typedef struct shared {
    mts_model *m;
    const float *expected;
    int64_t n;
    atomic_int stop;
    int runs, mismatches, errors;
} shared;

static void *runner(void *arg)
{
    shared *s = arg;
    mts_ctx *c;
    mts_err err = {0};
    if (mts_ctx_create(s->m, 1, &c, &err)) {
        s->errors++;
        return NULL;
    }
    mts_tensor *in = test_make_inputs(s->m, 1, 7);
    mts_model_info info;
    mts_model_get_info(s->m, &info);
    while (!atomic_load(&s->stop) || s->runs < 2) {
        const mts_tensor *out[16];
        if (mts_ctx_run(c, in, info.n_inputs, out, &err)) {
            s->errors++;
            break;
        }
        if (mts_tensor_numel(out[0]) != s->n || memcmp(out[0]->data, s->expected, (size_t)s->n * 4)) s->mismatches++;
        s->runs++;
    }
    test_free_inputs(s->m, in);
    mts_ctx_free(c);
    return NULL;
}

static void test_concurrent_plan_builds(void **state)
{
    (void)state;
    char path[4096];
    test_path(path, sizeof path, MODELS[0]);
    if (!exists(path)) test_path(path, sizeof path, "tests/models/out/small_cnn.onnx");
    if (!exists(path)) {
        printf("plans: no model with a batch dimension generated; skipped\n");
        return;
    }
    mts_err err = {0};
    /* The expected batch-1 output, from a model of its own. */
    mts_model *ref;
    assert_int_equal(mts_model_load(path, &OPTS, &ref, &err), 0);
    mts_ctx *rc;
    assert_int_equal(mts_ctx_create(ref, 1, &rc, &err), 0);
    int64_t n;
    float *expected = run_copy(ref, rc, 1, &n);
    mts_ctx_free(rc);
    mts_model_free(ref);

    mts_model *m;
    assert_int_equal(mts_model_load(path, &OPTS, &m, &err), 0);
    shared s[2] = {{m, expected, n, 0, 0, 0, 0}, {m, expected, n, 0, 0, 0, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, runner, &s[i]);
    mts_ctx *cb;
    assert_int_equal(mts_ctx_create(m, 1, &cb, &err), 0);
    for (int64_t b = 2; b <= 8; b++) {
        int64_t nb;
        free(run_copy(m, cb, b, &nb));
        assert_int_equal(nb, n * b);
    }
    for (int i = 0; i < 2; i++) atomic_store(&s[i].stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    mts_ctx_free(cb);
    for (int i = 0; i < 2; i++) {
        printf("plans: runner %d: %d batch-1 runs beside plan builds for batches 2-8, %d mismatches, %d errors\n", i,
               s[i].runs, s[i].mismatches, s[i].errors);
        assert_int_equal(s[i].errors, 0);
        assert_int_equal(s[i].mismatches, 0);
        assert_true(s[i].runs >= 2);
    }
    mts_model_free(m);
    free(expected);
}

static void test_plan_eviction(void **state)
{
    (void)state;
    char path[4096] = "";
    for (size_t i = 0; i < N_MODELS && !path[0]; i++) {
        test_path(path, sizeof path, MODELS[i]);
        if (!exists(path)) path[0] = 0;
    }
    if (!path[0]) {
        printf("plans: no model with a batch dimension generated; skipped\n");
        return;
    }
    mts_err err = {0};
    mts_model *m;
    assert_int_equal(mts_model_load(path, &OPTS, &m, &err), 0);
    mts_ctx *c;
    assert_int_equal(mts_ctx_create(m, 1, &c, &err), 0);
    float *first[7] = {0};
    int64_t n[7], n2, evicted = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int64_t b = 1; b <= 6; b++) {
            float *o = run_copy(m, c, b, &n2);
            assert_true(mts_model_plan_count(m, &evicted) <= 3);
            if (!pass) {
                first[b] = o, n[b] = n2;
                continue;
            }
            assert_int_equal(n2, n[b]);
            if (memcmp(o, first[b], (size_t)n2 * sizeof(float)))
                fail_msg("%s batch %lld: outputs differ after its plan was evicted and rebuilt", path, (long long)b);
            free(o);
        }
    printf("plans: %s, limit 3: 12 runs over 6 batch sizes, %lld plans evicted, outputs identical\n", path,
           (long long)evicted);
    assert_true(evicted >= 9);
    /* three contexts hold three plans: a fourth signature cannot evict any of them */
    mts_ctx_free(c); /* c held batch 6's plan */
    mts_ctx *h[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(mts_ctx_create(m, 1, &h[i], &err), 0);
        free(run_copy(m, h[i], i + 1, &n2));
    }
    mts_model_info info;
    mts_model_get_info(m, &info);
    mts_tensor *in = test_make_inputs(m, 4, 7);
    const mts_tensor *out[16];
    assert_int_equal(mts_ctx_create(m, 1, &c, &err), 0);
    int rc = mts_ctx_run(c, in, info.n_inputs, out, &err);
    assert_int_equal(rc, MTS_ELIMIT);
    assert_non_null(strstr(err.msg, "in use at once"));
    mts_ctx_free(h[0]);
    err = (mts_err){0};
    if (mts_ctx_run(c, in, info.n_inputs, out, &err)) fail_msg("batch 4 after a plan was let go: %s", err.msg);
    assert_true(mts_model_plan_count(m, NULL) <= 3);
    test_free_inputs(m, in);
    for (int i = 1; i < 3; i++) mts_ctx_free(h[i]);
    mts_ctx_free(c);
    for (int b = 1; b <= 6; b++) free(first[b]);
    mts_model_free(m);
}

int main(void)
{
    setenv("MTS_MAX_PLANS", "3", 1); /* before any plan: every test here runs at the limit */
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sequential_batch_switch),
                                       cmocka_unit_test(test_concurrent_plan_builds),
                                       cmocka_unit_test(test_plan_eviction)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
