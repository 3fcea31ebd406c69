/*
 * Re-entrancy of the engine: one shared model, 8 threads each with its own execution context,
 * 100 runs each on inputs of varying batch size; every output must be bit-identical to a
 * single-threaded run of the same input. Run under ThreadSanitizer in `make test`.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "test_util.h"

#define THREADS 8
#define RUNS 100
#define BATCHES 3

static mts_model *model;
static mts_tensor *inputs[BATCHES];
static float *expected[BATCHES][2];
static int64_t expected_n[BATCHES][2];

typedef struct worker {
    int id;
    int mismatches;
    int errors;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    mts_ctx *ctx;
    mts_err err = {0};
    if (mts_ctx_create(model, 1, &ctx, &err)) {
        w->errors++;
        return NULL;
    }
    for (int r = 0; r < RUNS; r++) {
        int b = (w->id + r) % BATCHES;
        const mts_tensor *outs[2];
        if (mts_ctx_run(ctx, inputs[b], 1, outs, &err)) {
            w->errors++;
            continue;
        }
        for (int o = 0; o < 2; o++)
            if (mts_tensor_numel(outs[o]) != expected_n[b][o] ||
                memcmp(outs[o]->data, expected[b][o], (size_t)expected_n[b][o] * sizeof(float)) != 0)
                w->mismatches++;
    }
    mts_ctx_free(ctx);
    return NULL;
}

static void test_threads_bit_identical(void **state)
{
    (void)state;
    char path[4096];
    mts_err err = {0};
    int rc = mts_model_load(test_path(path, sizeof path, "tests/models/out/small_cnn.onnx"), NULL, &model, &err);
    if (rc) fail_msg("load: %s", err.msg);
    mts_ctx *ref;
    assert_int_equal(mts_ctx_create(model, 1, &ref, &err), 0);
    for (int b = 0; b < BATCHES; b++) {
        inputs[b] = test_make_inputs(model, b + 1, 100u + (unsigned)b);
        const mts_tensor *outs[2];
        rc = mts_ctx_run(ref, inputs[b], 1, outs, &err);
        if (rc) fail_msg("run: %s", err.msg);
        for (int o = 0; o < 2; o++) {
            expected_n[b][o] = mts_tensor_numel(outs[o]);
            expected[b][o] = malloc((size_t)expected_n[b][o] * sizeof(float));
            memcpy(expected[b][o], outs[o]->data, (size_t)expected_n[b][o] * sizeof(float));
        }
        assert_int_equal(outs[0]->dims[0], b + 1);
        assert_int_equal(outs[0]->dims[1], 10);
    }
    mts_ctx_free(ref);
    /* Probabilities sum to 1: the model really computed something. */
    float sum = 0;
    for (int k = 0; k < 10; k++) sum += expected[0][0][k];
    assert_true(sum > 0.999f && sum < 1.001f);

    pthread_t th[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){i, 0, 0};
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    int mismatches = 0, errors = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        mismatches += w[i].mismatches;
        errors += w[i].errors;
    }
    printf("%d threads x %d runs: %d mismatches, %d errors\n", THREADS, RUNS, mismatches, errors);
    assert_int_equal(errors, 0);
    assert_int_equal(mismatches, 0);
    for (int b = 0; b < BATCHES; b++) {
        test_free_inputs(model, inputs[b]);
        free(expected[b][0]);
        free(expected[b][1]);
    }
    mts_model_free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads_bit_identical)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
