/*
 * Outputs computed straight into the caller's memory (mts_ctx_run_owned), the way the server
 * hands a batch's outputs to its reply without copying them out of the execution context.
 * Checked on the generated reference models (models/out) and the small test models, with the
 * production backend, in fp32 and (lip-sync UNet, small CNN) in bf16:
 *  - the owned run's outputs equal an ordinary run's on the same inputs bit for bit, and each
 *    owned buffer is exactly where its output lies; the lip-sync UNet's and the CNNs' outputs
 *    are owned (the case the server relies on), a float16 model's are not (the context
 *    converts them into its own buffer) and no buffer is left allocated for them;
 *  - the context keeps no hold on an owned buffer: later runs with other inputs (same batch,
 *    then another batch size) leave it untouched, and the buffer outlives the context;
 *  - every buffer the engine took from the allocator is either owned by the caller or given
 *    back (allocations and frees balance);
 *  - an allocator that fails makes the run fail with a message, owning nothing, and the next
 *    ordinary run of that context still gives the right result.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdatomic.h>

#include "test_util.h"

typedef struct {
    const char *path;
    const char *precision;
    bool must_own; /* every output of this model is expected to be owned */
    bool never_own; /* float16 outputs: none is */
} model_case;

static const model_case CASES[] = {
    {"models/out/lipsync_unet_w4.onnx", "fp32", true, false},
    {"models/out/lipsync_unet_w4.onnx", "bf16", true, false},
    {"models/out/mobilenetv3.onnx", "fp32", false, false},
    {"models/out/seg_unet.onnx", "fp32", false, false},
    {"models/out/cbam_resunet.onnx", "fp32", false, false},
    {"models/out/bert_tiny.onnx", "fp32", false, false},
    {"tests/models/out/small_cnn.onnx", "fp32", true, false},
    {"tests/models/out/small_cnn.onnx", "bf16", true, false},
    {"tests/models/out/small_cnn_fp16.onnx", "fp32", false, true},
};
#define N_CASES (sizeof CASES / sizeof CASES[0])

static atomic_int n_alloc, n_free;
static atomic_int fail_after = -1; /* >= 0: that many allocations succeed, then NULL */

static void *counting_alloc(size_t bytes)
{
    if (atomic_load(&fail_after) >= 0 && atomic_fetch_sub(&fail_after, 1) <= 0) return NULL;
    atomic_fetch_add(&n_alloc, 1);
    return malloc(bytes);
}

static void counting_free(void *p)
{
    atomic_fetch_add(&n_free, 1);
    free(p);
}

static const mts_out_alloc ALLOC = {counting_alloc, counting_free};

static bool exists(const char *p)
{
    FILE *f = fopen(p, "rb");
    if (f) fclose(f);
    return f != NULL;
}

static int64_t batch_of(const mts_model *m, int64_t want)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    for (int i = 0; i < info.n_inputs; i++) {
        const mts_value *v = mts_model_input(m, i);
        for (int d = 0; d < v->rank; d++)
            if (v->dims[d] < 0) return want;
    }
    return 1;
}

/* malloc'd copies of every output of an ordinary run */
static void **plain_run(mts_model *m, mts_ctx *c, const mts_tensor *in, int64_t *bytes)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    const mts_tensor *out[16];
    mts_err err = {0};
    if (mts_ctx_run(c, in, info.n_inputs, out, &err)) fail_msg("run: %s", err.msg);
    void **copy = calloc((size_t)info.n_outputs, sizeof *copy);
    for (int o = 0; o < info.n_outputs; o++) {
        bytes[o] = mts_tensor_nbytes(out[o]);
        copy[o] = malloc((size_t)bytes[o] + 1);
        memcpy(copy[o], out[o]->data, (size_t)bytes[o]);
    }
    return copy;
}

static void check_case(const model_case *mc)
{
    char path[1024];
    test_path(path, sizeof path, mc->path);
    if (!exists(path)) fail_msg("%s missing (make models; tests/models/make_test_models.py)", path);
    mts_load_opts opts = {.backend = "default", .precision = mc->precision};
    mts_model *m = NULL;
    mts_err err = {0};
    if (mts_model_load(path, &opts, &m, &err)) fail_msg("%s: %s", path, err.msg);
    mts_model_info info;
    mts_model_get_info(m, &info);
    assert_true(info.n_outputs <= 16);
    int64_t batch = batch_of(m, 2);
    mts_ctx *c = NULL;
    assert_int_equal(mts_ctx_create(m, 2, &c, &err), MTS_OK);
    mts_tensor *in = test_make_inputs(m, batch, 11);
    int64_t ref_bytes[16];
    void **ref = plain_run(m, c, in, ref_bytes);

    atomic_store(&n_alloc, 0);
    atomic_store(&n_free, 0);
    void *owned[16];
    const mts_tensor *out[16];
    int rc = mts_ctx_run_owned(c, in, info.n_inputs, &ALLOC, owned, out, &err);
    if (rc) fail_msg("%s (%s): owned run: %s", mc->path, mc->precision, err.msg);
    int n_owned = 0;
    for (int o = 0; o < info.n_outputs; o++) {
        assert_int_equal(mts_tensor_nbytes(out[o]), ref_bytes[o]);
        if (memcmp(out[o]->data, ref[o], (size_t)ref_bytes[o]))
            fail_msg("%s (%s): output %d differs from an ordinary run", mc->path, mc->precision, o);
        if (owned[o]) {
            assert_ptr_equal(owned[o], out[o]->data);
            n_owned++;
        }
    }
    if (mc->must_own) assert_int_equal(n_owned, info.n_outputs);
    if (mc->never_own) assert_int_equal(n_owned, 0);
    assert_int_equal(atomic_load(&n_alloc) - atomic_load(&n_free), n_owned);

    /* later runs (other inputs; then another batch size) leave the owned buffers alone */
    mts_tensor *in2 = test_make_inputs(m, batch, 99);
    int64_t b2[16];
    void **other = plain_run(m, c, in2, b2);
    mts_tensor *in3 = test_make_inputs(m, batch_of(m, 3), 5);
    int64_t b3[16];
    void **third = plain_run(m, c, in3, b3);
    bool differs = false;
    for (int o = 0; o < info.n_outputs; o++) {
        differs |= memcmp(other[o], ref[o], (size_t)ref_bytes[o]) != 0;
        if (owned[o] && memcmp(owned[o], ref[o], (size_t)ref_bytes[o]))
            fail_msg("%s (%s): a later run wrote into owned output %d", mc->path, mc->precision, o);
    }
    bool float_input = false;
    for (int i = 0; i < info.n_inputs; i++) float_input |= mts_model_input(m, i)->dtype == MTS_DTYPE_FLOAT;
    if (float_input) assert_true(differs); /* the second inputs really gave other outputs */
    mts_ctx_free(c);
    for (int o = 0; o < info.n_outputs; o++)
        if (owned[o]) {
            assert_memory_equal(owned[o], ref[o], (size_t)ref_bytes[o]); /* outlives the context */
            counting_free(owned[o]);
        }
    assert_int_equal(atomic_load(&n_alloc), atomic_load(&n_free));

    /* a failing allocator: the run fails, owning nothing, and the context still works */
    if (n_owned > 0) {
        assert_int_equal(mts_ctx_create(m, 2, &c, &err), MTS_OK);
        atomic_store(&n_alloc, 0);
        atomic_store(&n_free, 0);
        atomic_store(&fail_after, n_owned - 1); /* the last buffer fails */
        err.msg[0] = 0;
        rc = mts_ctx_run_owned(c, in, info.n_inputs, &ALLOC, owned, out, &err);
        atomic_store(&fail_after, -1);
        assert_int_equal(rc, MTS_ENOMEM);
        assert_non_null(strstr(err.msg, "out of memory for output"));
        for (int o = 0; o < info.n_outputs; o++) assert_null(owned[o]);
        assert_int_equal(atomic_load(&n_alloc), atomic_load(&n_free));
        int64_t b4[16];
        void **again = plain_run(m, c, in, b4);
        for (int o = 0; o < info.n_outputs; o++) {
            assert_memory_equal(again[o], ref[o], (size_t)ref_bytes[o]);
            free(again[o]);
        }
        free(again);
        mts_ctx_free(c);
    }
    for (int o = 0; o < info.n_outputs; o++) free(ref[o]), free(other[o]), free(third[o]);
    free(ref);
    free(other);
    free(third);
    test_free_inputs(m, in);
    test_free_inputs(m, in2);
    test_free_inputs(m, in3);
    mts_model_free(m);
}

static void test_owned_outputs(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_CASES; i++) check_case(&CASES[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_owned_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
