/*
 * Re-entrancy of the engine: one shared model, 8 threads each with its own execution context,
 * 100 runs each on inputs of varying batch size; every output must be bit-identical to a
 * single-threaded run of the same input. The small CNN in fp32 and in bf16, and a QDQ CNN on
 * the int8 kernels. Run under ThreadSanitizer in `make test`.
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
#define MAX_OUT 4

static mts_model *model;
static int n_out;
static mts_tensor *inputs[BATCHES];
static void *expected[BATCHES][MAX_OUT];
static int64_t expected_bytes[BATCHES][MAX_OUT];

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
        const mts_tensor *outs[MAX_OUT];
        if (mts_ctx_run(ctx, inputs[b], 1, outs, &err)) {
            w->errors++;
            continue;
        }
        for (int o = 0; o < n_out; o++)
            if (mts_tensor_nbytes(outs[o]) != expected_bytes[b][o] ||
                memcmp(outs[o]->data, expected[b][o], (size_t)expected_bytes[b][o]) != 0)
                w->mismatches++;
    }
    mts_ctx_free(ctx);
    return NULL;
}

/* Loads rel at the given precision, computes the expected outputs of three batch sizes on one
 * context, then runs THREADS threads of RUNS runs each and compares every output bit for bit. */
static void run_threads(const char *rel, const char *precision, const char *want_effective)
{
    char path[4096];
    mts_err err = {0};
    mts_load_opts opts = {.precision = precision};
    int rc = mts_model_load(test_path(path, sizeof path, rel), &opts, &model, &err);
    if (rc) fail_msg("load %s: %s", rel, err.msg);
    assert_string_equal(mts_model_precision(model)->effective, want_effective);
    mts_model_info info;
    mts_model_get_info(model, &info);
    n_out = info.n_outputs;
    assert_true(info.n_inputs == 1 && n_out <= MAX_OUT);
    mts_ctx *ref;
    assert_int_equal(mts_ctx_create(model, 1, &ref, &err), 0);
    for (int b = 0; b < BATCHES; b++) {
        inputs[b] = test_make_inputs(model, b + 1, 100u + (unsigned)b);
        const mts_tensor *outs[MAX_OUT];
        rc = mts_ctx_run(ref, inputs[b], 1, outs, &err);
        if (rc) fail_msg("run: %s", err.msg);
        for (int o = 0; o < n_out; o++) {
            expected_bytes[b][o] = mts_tensor_nbytes(outs[o]);
            expected[b][o] = malloc((size_t)expected_bytes[b][o] + 1);
            memcpy(expected[b][o], outs[o]->data, (size_t)expected_bytes[b][o]);
        }
        assert_int_equal(outs[0]->dims[0], b + 1);
    }
    mts_ctx_free(ref);

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
    printf("%s (%s): %d threads x %d runs: %d mismatches, %d errors\n", rel, want_effective, THREADS, RUNS, mismatches,
           errors);
    assert_int_equal(errors, 0);
    assert_int_equal(mismatches, 0);
    for (int b = 0; b < BATCHES; b++) {
        test_free_inputs(model, inputs[b]);
        for (int o = 0; o < n_out; o++) free(expected[b][o]);
    }
}

static void test_threads_bit_identical(void **state)
{
    (void)state;
    run_threads("tests/models/out/small_cnn.onnx", "fp32", "fp32");
    /* Probabilities sum to 1: the model really computed something. */
    mts_ctx *c;
    mts_err err = {0};
    assert_int_equal(mts_ctx_create(model, 1, &c, &err), 0);
    mts_tensor *in = test_make_inputs(model, 1, 3);
    const mts_tensor *outs[MAX_OUT];
    assert_int_equal(mts_ctx_run(c, in, 1, outs, &err), 0);
    assert_int_equal(outs[0]->dims[1], 10);
    float sum = 0;
    for (int k = 0; k < 10; k++) sum += ((const float *)outs[0]->data)[k];
    assert_true(sum > 0.999f && sum < 1.001f);
    test_free_inputs(model, in);
    mts_ctx_free(c);
    mts_model_free(model);
}

/* The reduced-precision kernels shared the same way: bf16 weights converted and packed once at
 * load, read by every context (oneDNN emulates bf16 where the CPU lacks it). The guard may keep
 * a model in fp32 on its error; the small CNN passes it. */
static void test_threads_bf16(void **state)
{
    (void)state;
    run_threads("tests/models/out/small_cnn.onnx", "bf16", "bf16");
    assert_true(mts_model_bf16_steps(model) > 0);
    mts_model_free(model);
}

/* A QDQ model on the int8 kernels: its quantized weights, scales and the int8 primitives are the
 * model's, shared by every context; three convolutions run as int8 (DequantizeLinear -> Conv ->
 * QuantizeLinear fused). */
static void test_threads_int8(void **state)
{
    (void)state;
    run_threads("tests/models/out/qdq_cnn.onnx", "int8", "int8");
    assert_int_equal(mts_model_op_steps(model, "QuantizeLinear"), 1); /* the input's; the rest fused */
    mts_model_free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads_bit_identical), cmocka_unit_test(test_threads_bf16),
                                       cmocka_unit_test(test_threads_int8)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
