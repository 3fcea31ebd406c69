/*
 * Per-model precision (engine/precision.c): the lip-sync UNets run in bf16 stay within 2/255
 * (their outputs are pixels in [0, 1]) of fp32 at every pixel; the accuracy guard rejects bf16
 * when max_error is below what bf16 achieves (the model then runs fp32 and says why); "int8"
 * on a float model falls back to fp32; unknown names are refused; calibration .npy files are
 * used when present; fp16 keeps a transformer's few-row products on half weights. On a CPU where oneDNN makes no bf16 kernels the guard's fallback to fp32
 * is what is asserted instead. Uses the generated models (models/out) when present.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "util/npy.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static bool model_path(char *path, size_t len, const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "models/out/%s.onnx", name);
    test_path(path, len, rel);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    if (!f) printf("precision: %s not generated; skipped\n", name);
    return f != NULL;
}

static mts_model *load(const char *path, const char *precision, double max_error, const char *calib)
{
    mts_load_opts o = {0};
    o.backend = "default"; /* the sanitizer builds default to the reference kernels */
    o.precision = precision;
    o.max_error = max_error;
    o.calibration_dir = calib;
    mts_model *m = NULL;
    mts_err err = {0};
    if (mts_model_load(path, &o, &m, &err)) fail_msg("load %s (%s): %s", path, precision, err.msg);
    return m;
}

/* Max abs difference of output 0 of both models on the same random batch. */
static double max_abs_diff(mts_model *a, mts_model *b, int64_t batch)
{
    mts_tensor *in = test_make_inputs(a, batch, 7);
    mts_model_info info;
    mts_model_get_info(a, &info);
    mts_ctx *ca, *cb;
    mts_err err = {0};
    assert_int_equal(mts_ctx_create(a, 1, &ca, &err), 0);
    assert_int_equal(mts_ctx_create(b, 1, &cb, &err), 0);
    const mts_tensor *oa[8], *ob[8];
    if (mts_ctx_run(ca, in, info.n_inputs, oa, &err)) fail_msg("run: %s", err.msg);
    if (mts_ctx_run(cb, in, info.n_inputs, ob, &err)) fail_msg("run: %s", err.msg);
    assert_int_equal(oa[0]->dtype, MTS_DTYPE_FLOAT);
    int64_t n = mts_tensor_numel(oa[0]);
    assert_int_equal(n, mts_tensor_numel(ob[0]));
    double worst = 0;
    const float *x = oa[0]->data, *y = ob[0]->data;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)y[i]);
        if (!(d <= worst)) worst = d;
    }
    mts_ctx_free(ca);
    mts_ctx_free(cb);
    test_free_inputs(a, in);
    return worst;
}

static void test_lipsync_bf16_pixels(void **state)
{
    (void)state;
    static const char *names[] = {"lipsync_unet_w8", "lipsync_unet_w16", "lipsync_unet_w32"};
    for (int k = 0; k < (SANITIZED ? 1 : 3); k++) {
        char path[4096];
        if (!model_path(path, sizeof path, names[k])) continue;
        mts_model *fp = load(path, "fp32", 0, NULL), *bf = load(path, "bf16", 0, NULL);
        const mts_precision_info *pi = mts_model_precision(bf);
        assert_string_equal(mts_model_precision(fp)->effective, "fp32");
        assert_string_equal(pi->requested, "bf16");
        if (!strcmp(pi->effective, "bf16")) {
            assert_true(pi->guard_error >= 0 && pi->guard_error <= 1e-2);
            double d = max_abs_diff(fp, bf, 2);
            assert_true(mts_model_bf16_steps(bf) > 0);
            assert_int_equal(mts_model_bf16_steps(fp), 0);
            printf("precision: %s bf16 guard rel_l2 %.4g, max abs diff %.5f (limit %.5f)\n", names[k], pi->guard_error,
                   d, 2.0 / 255);
            assert_true(d <= 2.0 / 255);
        } else { /* no bf16 kernels on this CPU: the guard's fallback */
            printf("precision: %s stays fp32 here: %s\n", names[k], pi->reason);
            assert_string_equal(pi->effective, "fp32");
            assert_true(strstr(pi->reason, "no bf16 kernels") != NULL);
        }
        mts_model_free(fp);
        mts_model_free(bf);
    }
}

/* bf16 plans hand bf16 tensors on between steps: a decoder's skip Concat read only by bf16
 * convolutions writes bf16, converting its float inputs as it copies and copying those that
 * bf16 convolutions wrote as bf16 (the upsampled branch, the encoder's skip; kernels/nhwc.c);
 * the last convolution hands the 3-channel head (kernels/fast.c) bf16.
 * The outputs are the same bits as with
 * every hand-off in fp32 (MTS_BF16_NO_HANDOFF, each convolution converting its own source),
 * since both round the same floats to nearest even. */
static void test_bf16_handoff_bits(void **state)
{
    (void)state;
    char path[4096];
    if (!model_path(path, sizeof path, "lipsync_unet_w8")) return;
    setenv("MTS_NO_HEAD_FOLD", "1", 1); /* the head as a step of its own (the fused one: below) */
    setenv("MTS_BF16_NO_HANDOFF", "1", 1);
    mts_model *plain = load(path, "bf16", 0, NULL);
    if (strcmp(mts_model_precision(plain)->effective, "bf16")) {
        unsetenv("MTS_NO_HEAD_FOLD");
        unsetenv("MTS_BF16_NO_HANDOFF");
        printf("precision: no bf16 kernels here; hand-off check skipped\n");
        mts_model_free(plain);
        return;
    }
    /* its batch-2 plan is built now, while hand-offs are off */
    mts_tensor *in = test_make_inputs(plain, 2, 7);
    mts_model_info info;
    mts_model_get_info(plain, &info);
    mts_ctx *c;
    mts_err err = {0};
    const mts_tensor *o[8];
    assert_int_equal(mts_ctx_create(plain, 1, &c, &err), 0);
    if (mts_ctx_run(c, in, info.n_inputs, o, &err)) fail_msg("run: %s", err.msg);
    mts_ctx_free(c);
    test_free_inputs(plain, in);
    unsetenv("MTS_BF16_NO_HANDOFF");
    mts_model *handoff = load(path, "bf16", 0, NULL);
    unsetenv("MTS_NO_HEAD_FOLD");
    double d = max_abs_diff(plain, handoff, 2);
    int cats = mts_model_op_steps(handoff, "Concat/mts_out_bf16"), cats0 = mts_model_op_steps(plain, "Concat/mts_out_bf16");
    int cat_in = mts_model_op_steps(handoff, "Concat/mts_in_bf16");
    /* the 3-channel head reads the last convolution's bf16 output, or rounds its float one */
    int head_bf16 = mts_model_op_steps(handoff, "Conv/mts_src_bf16"), head_round = mts_model_op_steps(plain, "Conv/mts_src_round");
    printf("precision: lipsync_unet_w8 bf16 with and without hand-offs: max abs diff %g, bf16 Concats %d and %d, %d "
           "of them with bf16 inputs; head reading bf16 %d, rounding %d\n", d, cats, cats0, cat_in, head_bf16, head_round);
    assert_int_equal(head_bf16, 1);
    assert_int_equal(head_round, 1);
    assert_int_equal(mts_model_op_steps(plain, "Conv/mts_src_bf16"), 0);
    assert_true(cats >= 4);
    assert_true(cat_in >= 4); /* the four decoder levels' upsampled branches */
    assert_int_equal(cats0, 0);
    assert_true(d == 0);
    /* The head fused into the last convolution where the CPU runs the engine's bf16 3x3 kernel
     * (kernels/bfconv.c: one Conv step and the Sigmoid fewer): the same bits. */
    mts_model *fused = load(path, "bf16", 0, NULL);
    double df = max_abs_diff(handoff, fused, 2);
    int convs = mts_model_op_steps(handoff, "Conv"), convs_f = mts_model_op_steps(fused, "Conv");
    printf("precision: lipsync_unet_w8 bf16 with the head fused: max abs diff %g, Conv steps %d -> %d\n", df, convs, convs_f);
    assert_true(df == 0);
    const char *native = mts_cpu_bf16_native();
    if (native && !strcmp(native, "avx512_bf16") && __builtin_cpu_supports("avx512bw")) assert_int_equal(convs_f, convs - 1);
    mts_model_free(fused);
    mts_model_free(plain);
    mts_model_free(handoff);
}

static void test_guard_rejects(void **state)
{
    (void)state;
    char path[4096];
    if (!model_path(path, sizeof path, "lipsync_unet_w8")) return;
    mts_model *m = load(path, "bf16", 1e-9, NULL);
    const mts_precision_info *pi = mts_model_precision(m);
    assert_string_equal(pi->effective, "fp32");
    assert_string_equal(pi->requested, "bf16");
    assert_true(strstr(pi->reason, "guard failed") != NULL || strstr(pi->reason, "no bf16 kernels") != NULL);
    if (strstr(pi->reason, "guard failed")) assert_true(pi->guard_error > 1e-9);
    assert_string_equal(pi->guard_inputs, "random");
    assert_int_equal(pi->guard_runs, 1);
    mts_model_free(m);
}

static void test_int8_and_names(void **state)
{
    (void)state;
    char path[4096];
    if (!model_path(path, sizeof path, "lipsync_unet_w8")) return;
    mts_model *m = load(path, "int8", 0, NULL);
    assert_string_equal(mts_model_precision(m)->effective, "fp32");
    assert_true(strstr(mts_model_precision(m)->reason, "QDQ") != NULL);
    mts_model_free(m);
    mts_load_opts o = {0};
    o.precision = "fp8";
    mts_err err = {0};
    assert_int_equal(mts_model_load(path, &o, &m, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "unknown precision 'fp8'"));
    /* auto: bf16 only where the CPU computes it natively */
    m = load(path, "auto", 0, NULL);
    const mts_precision_info *pi = mts_model_precision(m);
    if (!mts_cpu_bf16_native()) {
        assert_string_equal(pi->effective, "fp32");
        assert_non_null(strstr(pi->reason, "lacks native bf16"));
    } else if (!strcmp(pi->effective, "bf16")) {
        assert_non_null(strstr(pi->reason, mts_cpu_bf16_native()));
    }
    mts_model_free(m);
}

/* fp16: a transformer encoder's few-row products on IEEE half weights. At batch 4 (4 x 4 = 16
 * rows) the outputs move, by about half's rounding; at batch 8 (64 rows, past the half-weight
 * limit) the products use float weights and the outputs are fp32's bit for bit. A remembered
 * verdict applies without a guard. */
static void test_fp16_weights(void **state)
{
    (void)state;
    char path[4096];
    if (!model_path(path, sizeof path, "bert_tiny")) return;
    mts_model *fp = load(path, "fp32", 0, NULL), *h = load(path, "fp16", 0, NULL);
    const mts_precision_info *pi = mts_model_precision(h);
    assert_string_equal(pi->requested, "fp16");
    if (!strcmp(pi->effective, "fp32")) { /* no AVX-512: the few-row GEMM does not run here */
        assert_non_null(strstr(pi->reason, "no few-row products"));
        assert_int_equal(mts_model_half_steps(h), 0);
    } else {
        assert_string_equal(pi->effective, "fp16");
        assert_string_equal(pi->reason, "requested, guard passed");
        assert_true(pi->guard_error > 0 && pi->guard_error < 1e-2);
        assert_true(mts_model_half_steps(h) > 0);
        double d4 = max_abs_diff(fp, h, 4), d8 = max_abs_diff(fp, h, 8);
        printf("precision: bert_tiny fp16 max abs diff batch 4 %.3g, batch 8 %.3g, guard %.3g\n", d4, d8,
               pi->guard_error);
        assert_true(d4 > 0 && d4 < 1e-2);
        assert_true(d8 == 0);
        mts_load_opts o = {0};
        o.backend = "default";
        o.precision = "fp16";
        o.guard_verdict = "fp16";
        o.guard_error = pi->guard_error;
        mts_model *r = NULL;
        mts_err err = {0};
        assert_int_equal(mts_model_load(path, &o, &r, &err), 0);
        assert_string_equal(mts_model_precision(r)->effective, "fp16");
        assert_string_equal(mts_model_precision(r)->guard_inputs, "remembered");
        assert_true(max_abs_diff(fp, r, 4) == d4);
        mts_model_free(r);
    }
    mts_model_free(fp);
    mts_model_free(h);
}

static void test_calibration_files(void **state)
{
    (void)state;
    char path[4096], dir[] = "/tmp/mts_calib_XXXXXX";
    if (!model_path(path, sizeof path, "lipsync_unet_w8")) return;
    assert_non_null(mkdtemp(dir));
    mts_model *fp = load(path, "fp32", 0, NULL);
    mts_tensor *in = test_make_inputs(fp, 1, 3);
    char f[4200];
    mts_err err = {0};
    for (int i = 0; i < 2; i++) {
        snprintf(f, sizeof f, "%s/%s.npy", dir, mts_model_input(fp, i)->name);
        assert_int_equal(mts_npy_write(f, &in[i], &err), 0);
    }
    mts_model *bf = load(path, "bf16", 0, dir);
    const mts_precision_info *pi = mts_model_precision(bf);
    if (!strstr(pi->reason, "no bf16 kernels")) {
        assert_string_equal(pi->guard_inputs, "calibration");
        assert_int_equal(pi->guard_runs, 1);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(f, sizeof f, "%s/%s.npy", dir, mts_model_input(fp, i)->name);
        unlink(f);
    }
    rmdir(dir);
    test_free_inputs(fp, in);
    mts_model_free(fp);
    mts_model_free(bf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lipsync_bf16_pixels),
        cmocka_unit_test(test_bf16_handoff_bits),
        cmocka_unit_test(test_guard_rejects),
        cmocka_unit_test(test_int8_and_names),
        cmocka_unit_test(test_calibration_files),
        cmocka_unit_test(test_fp16_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
