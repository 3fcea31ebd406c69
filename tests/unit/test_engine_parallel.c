/*
 * Two execution contexts of one intra-op thread each, running the same model at the same time
 * on two threads: their outputs must equal a lone context's bit for bit, and the aggregate
 * throughput is printed against one context alone (the target is >= 1.8x on the 2-core
 * machine for conv-heavy models; the figure depends on what else the machine runs, so it is
 * reported, not asserted). Uses models/out/lipsync_unet_w8.onnx when generated (override with
 * MTS_PARALLEL_MODEL), else the small test CNN. Also: a context switching batch sizes reuses its
 * buffers (no growth, results bit-identical to fresh contexts).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <time.h>

#include "test_util.h"

#define RUNS 6

static mts_model *model;
static mts_tensor *input;
static int n_inputs;
static float *expected;
static int64_t expected_n;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct worker {
    int runs, mismatches, errors;
    double seconds;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    mts_ctx *c;
    mts_err err = {0};
    if (mts_ctx_create(model, 1, &c, &err)) {
        w->errors++;
        return NULL;
    }
    const mts_tensor *out[8];
    if (mts_ctx_run(c, input, n_inputs, out, &err)) w->errors++; /* warm-up: binds buffers */
    double t0 = now();
    for (int r = 0; r < w->runs; r++) {
        if (mts_ctx_run(c, input, n_inputs, out, &err)) {
            w->errors++;
            continue;
        }
        if (mts_tensor_numel(out[0]) != expected_n || memcmp(out[0]->data, expected, (size_t)expected_n * 4) != 0)
            w->mismatches++;
    }
    w->seconds = now() - t0;
    mts_ctx_free(c);
    return NULL;
}

static void test_two_single_thread_contexts(void **state)
{
    (void)state;
    char path[4096];
    const char *rel = getenv("MTS_PARALLEL_MODEL");
    mts_err err = {0};
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    if (!rel) rel = "tests/models/out/small_cnn.onnx"; /* sanitizers: correctness only, quickly */
#endif
    test_path(path, sizeof path, rel ? rel : "models/out/lipsync_unet_w8.onnx");
    if (mts_model_load(path, NULL, &model, &err)) {
        test_path(path, sizeof path, "tests/models/out/small_cnn.onnx");
        assert_int_equal(mts_model_load(path, NULL, &model, &err), 0);
    }
    mts_model_info info;
    mts_model_get_info(model, &info);
    n_inputs = info.n_inputs;
    input = test_make_inputs(model, 1, 5);
    mts_ctx *c;
    const mts_tensor *out[8];
    assert_int_equal(mts_ctx_create(model, 1, &c, &err), 0);
    if (mts_ctx_run(c, input, n_inputs, out, &err)) fail_msg("%s", err.msg);
    expected_n = mts_tensor_numel(out[0]);
    expected = malloc((size_t)expected_n * 4);
    memcpy(expected, out[0]->data, (size_t)expected_n * 4);
    mts_ctx_free(c);

    worker alone = {RUNS, 0, 0, 0};
    work(&alone);
    worker w[2] = {{RUNS, 0, 0, 0}, {RUNS, 0, 0, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, work, &w[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    double both = w[0].seconds > w[1].seconds ? w[0].seconds : w[1].seconds;
    assert_int_equal(alone.errors + w[0].errors + w[1].errors, 0);
    assert_int_equal(alone.mismatches + w[0].mismatches + w[1].mismatches, 0);
    double one = RUNS / alone.seconds, agg = (w[0].runs + w[1].runs) / both;
    printf("parallel: %s (%s backend): one 1-thread context %.2f runs/s, two concurrently %.2f runs/s "
           "(aggregate %.2fx)\n",
           path, mts_model_backend(model), one, agg, agg / one);
    free(expected);
    test_free_inputs(model, input);
    mts_model_free(model);
}

/* Changing the batch size (as dynamic batching does) re-binds the context to another plan: the
 * new plan's slots reuse the buffers already held when they are large enough, so alternating
 * batch sizes neither grows nor re-allocates the context, and every result equals a fresh
 * context's bit for bit (buffers come back holding the other plan's data). */
static void test_signature_switch_reuses_buffers(void **state)
{
    (void)state;
    char path[4096];
    mts_err err = {0};
    mts_model *m;
    test_path(path, sizeof path, "tests/models/out/small_cnn.onnx");
    assert_int_equal(mts_model_load(path, NULL, &m, &err), 0);
    mts_model_info info;
    mts_model_get_info(m, &info);
    mts_tensor *in1 = test_make_inputs(m, 1, 3), *in4 = test_make_inputs(m, 4, 4);
    float *want[2];
    int64_t n[2];
    for (int k = 0; k < 2; k++) { /* references from fresh contexts */
        mts_ctx *f;
        const mts_tensor *out[8];
        assert_int_equal(mts_ctx_create(m, 1, &f, &err), 0);
        assert_int_equal(mts_ctx_run(f, k ? in4 : in1, info.n_inputs, out, &err), 0);
        n[k] = mts_tensor_numel(out[0]);
        want[k] = malloc((size_t)n[k] * 4);
        memcpy(want[k], out[0]->data, (size_t)n[k] * 4);
        mts_ctx_free(f);
    }
    mts_ctx *c;
    assert_int_equal(mts_ctx_create(m, 1, &c, &err), 0);
    const mts_tensor *out[8];
    assert_int_equal(mts_ctx_run(c, in4, info.n_inputs, out, &err), 0);
    int64_t b4 = mts_ctx_bytes(c);
    for (int r = 0; r < 6; r++) {
        int k = r % 2 == 0; /* batch 1, 4, 1, 4, ... */
        assert_int_equal(mts_ctx_run(c, k ? in1 : in4, info.n_inputs, out, &err), 0);
        int w = k ? 0 : 1;
        assert_int_equal(mts_tensor_numel(out[0]), n[w]);
        assert_memory_equal(out[0]->data, want[w], (size_t)n[w] * 4);
        assert_int_equal(mts_ctx_bytes(c), b4); /* batch 1 runs in batch 4's buffers */
    }
    mts_ctx_free(c);
    for (int k = 0; k < 2; k++) free(want[k]);
    test_free_inputs(m, in1);
    test_free_inputs(m, in4);
    mts_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_two_single_thread_contexts),
                                       cmocka_unit_test(test_signature_switch_reuses_buffers)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
