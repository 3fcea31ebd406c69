/*
 * Unit tests of the engine API and utilities: tensor arithmetic and broadcasting, .npy
 * round-trips and malformed .npy files, loading from memory, input validation messages, and
 * plan reuse across runs and batch sizes.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <unistd.h>

#include "engine/kernels/kernel.h"
#include "test_util.h"
#include "util/npy.h"

static void test_numel_overflow(void **state)
{
    (void)state;
    mts_tensor t = {MTS_DTYPE_FLOAT, 3, {1 << 20, 1 << 20, 1 << 20}, NULL};
    assert_true(mts_tensor_numel(&t) > 0);
    t.dims[2] = (int64_t)1 << 40;
    assert_int_equal(mts_tensor_numel(&t), -1);
    t.dims[2] = -3;
    assert_int_equal(mts_tensor_numel(&t), -1);
    mts_tensor s = {MTS_DTYPE_FLOAT, 0, {0}, NULL};
    assert_int_equal(mts_tensor_numel(&s), 1);
    assert_int_equal(mts_tensor_nbytes(&s), 4);
}

static void test_broadcast(void **state)
{
    (void)state;
    mts_tensor a = {MTS_DTYPE_FLOAT, 3, {2, 1, 4}, NULL}, b = {MTS_DTYPE_FLOAT, 2, {3, 1}, NULL}, o = {0};
    mts_err err = {0};
    assert_int_equal(mts_broadcast_shape(&a, &b, &o, &err), 0);
    assert_int_equal(o.rank, 3);
    assert_int_equal(o.dims[0], 2);
    assert_int_equal(o.dims[1], 3);
    assert_int_equal(o.dims[2], 4);
    mts_tensor c = {MTS_DTYPE_FLOAT, 1, {5}, NULL};
    assert_int_equal(mts_broadcast_shape(&a, &c, &o, &err), MTS_ESHAPE);
    assert_non_null(strstr(err.msg, "cannot be broadcast"));
}

static void test_npy_roundtrip_and_errors(void **state)
{
    (void)state;
    char path[] = "/tmp/mts_test_XXXXXX.npy";
    int fd = mkstemps(path, 4);
    assert_true(fd >= 0);
    close(fd);
    float data[6] = {1, 2, 3, 4, 5, 6.5f};
    mts_tensor t = {MTS_DTYPE_FLOAT, 2, {2, 3}, data}, r;
    mts_err err = {0};
    assert_int_equal(mts_npy_write(path, &t, &err), 0);
    assert_int_equal(mts_npy_read(path, &r, &err), 0);
    assert_int_equal(r.rank, 2);
    assert_int_equal(r.dims[1], 3);
    assert_memory_equal(r.data, data, sizeof data);
    free(r.data);
    unlink(path);

    const char *bad_magic = "NOTNUMPY";
    assert_int_not_equal(mts_npy_parse(bad_magic, 8, "x", &r, &err), 0);
    assert_non_null(strstr(err.msg, "bad magic"));
    /* A header claiming more data than present. */
    char buf[128];
    const char *hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 1000), }";
    size_t hl = strlen(hdr);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (char)hl;
    buf[9] = 0;
    memcpy(buf + 10, hdr, hl);
    assert_int_equal(mts_npy_parse(buf, 10 + hl + 8, "x", &r, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "payload is 8 bytes"));
    /* Unsupported dtype. */
    const char *hdr2 = "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }";
    hl = strlen(hdr2);
    buf[8] = (char)hl;
    memcpy(buf + 10, hdr2, hl);
    assert_int_equal(mts_npy_parse(buf, 10 + hl + 8, "x", &r, &err), MTS_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "<c8"));
}

/* float16/bfloat16 conversions: exact values, ties to even, overflow to infinity, subnormals,
 * NaN kept, and one rounding from double (no double rounding through float). */
static void test_half_conversions(void **state)
{
    (void)state;
    assert_int_equal(mts_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(mts_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(mts_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(mts_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(mts_f32_to_f16(65520.0f), 0x7c00);          /* halfway to 65536: even is inf */
    assert_int_equal(mts_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie: to the even 1.0 */
    assert_int_equal(mts_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02); /* tie: to the even 1+2/1024 */
    assert_int_equal(mts_f32_to_f16(5.9604644775390625e-8f), 0x0001); /* smallest subnormal */
    assert_int_equal(mts_f32_to_f16(2.98023223876953125e-8f), 0x0000); /* half of it: tie to 0 */
    assert_int_equal(mts_f32_to_f16(-INFINITY), 0xfc00);
    assert_true((mts_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (mts_f32_to_f16(NAN) & 0x3ff) != 0);
    assert_true(mts_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
    assert_true(mts_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(isnan(mts_f16_to_f32(0x7e00)));
    /* 1 + 2^-11 + 2^-40 is just above the tie: rounds up; through float it would tie to 1.0 */
    assert_int_equal(mts_f64_to_f16(1.0 + 1.0 / 2048 + 1.0 / 1099511627776.0), 0x3c01);
    assert_int_equal(mts_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(mts_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);  /* tie to even */
    assert_int_equal(mts_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
    assert_int_equal(mts_f32_to_bf16(FLT_MAX), 0x7f80);            /* rounds past bf16's max */
    assert_true(mts_bf16_to_f32(0xc040) == -3.0f);
    assert_true(isnan(mts_bf16_to_f32(mts_f32_to_bf16(NAN))));
    assert_int_equal(mts_f64_to_bf16(1.0 + 1.0 / 256 + 1e-12), 0x3f81);
    /* the bulk conversion (AVX-512 on CPUs that have it) gives mts_f32_to_bf16's bits for every
     * kind of value (ties, subnormals, infinities, NaNs of both signs and payloads, random bit
     * patterns) and every tail length, and writes nothing past n */
    enum { N = 4099 };
    float *src = malloc(sizeof(float) * N);
    uint16_t *dst = malloc(sizeof(uint16_t) * (N + 16));
    assert_non_null(src);
    assert_non_null(dst);
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u,
                                       0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7f8000u, 0x7f800000u,
                                       0xff800000u, 0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu, 0xffffffffu,
                                       0x7f80ffffu, 0x7fbf0000u};
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = i < (int)(sizeof special / sizeof special[0]) ? special[i] : (uint32_t)(st >> 32);
        memcpy(&src[i], &u, sizeof u);
    }
    for (int n = 0; n <= N; n += n < 40 ? 1 : 1021) {
        for (int i = 0; i < N + 16; i++) dst[i] = 0xabcd;
        mts_f32_to_bf16_n(src, dst, n);
        for (int i = 0; i < n; i++)
            if (dst[i] != mts_f32_to_bf16(src[i])) fail_msg("n %d, element %d: %04x, want %04x", n, i, dst[i], mts_f32_to_bf16(src[i]));
        for (int i = n; i < N + 16; i++) assert_int_equal(dst[i], 0xabcd);
    }
    free(src);
    free(dst);
}

static void test_load_buffer_garbage(void **state)
{
    (void)state;
    mts_model *m = NULL;
    mts_err err = {0};
    unsigned char junk[64];
    for (int i = 0; i < 64; i++) junk[i] = (unsigned char)(i * 37 + 11);
    assert_true(mts_model_load_buffer(junk, sizeof junk, "junk", NULL, &m, &err) < 0);
    assert_null(m);
    assert_true(strlen(err.msg) > 0);
    assert_true(mts_model_load_buffer(junk, 0, "empty", NULL, &m, &err) < 0);
    assert_non_null(strstr(err.msg, "empty"));
}

static void test_input_validation_and_plans(void **state)
{
    (void)state;
    char path[4096];
    mts_model *m;
    mts_err err = {0};
    int rc = mts_model_load(test_path(path, sizeof path, "tests/models/out/small_cnn.onnx"), NULL, &m, &err);
    if (rc) fail_msg("load: %s", err.msg);
    mts_ctx *ctx;
    assert_int_equal(mts_ctx_create(m, 1, &ctx, &err), 0);
    mts_tensor *in = test_make_inputs(m, 2, 1);
    const mts_tensor *outs[2];
    /* Wrong channel count. */
    in[0].dims[1] = 4;
    assert_int_equal(mts_ctx_run(ctx, in, 1, outs, &err), MTS_ESHAPE);
    assert_non_null(strstr(err.msg, "input 'x' has shape [2,4,32,32], the model expects [N,3,32,32]"));
    in[0].dims[1] = 3;
    /* Wrong dtype. */
    in[0].dtype = MTS_DTYPE_INT64;
    assert_int_equal(mts_ctx_run(ctx, in, 1, outs, &err), MTS_EINVAL);
    assert_non_null(strstr(err.msg, "has type int64, the model expects float"));
    in[0].dtype = MTS_DTYPE_FLOAT;
    /* Wrong input count. */
    assert_int_equal(mts_ctx_run(ctx, in, 0, outs, &err), MTS_EINVAL);
    /* Two runs give the same answer; a batch of 2 holds each sample's batch-1 answer. */
    assert_int_equal(mts_ctx_run(ctx, in, 1, outs, &err), 0);
    float first[20];
    memcpy(first, outs[0]->data, sizeof first);
    assert_int_equal(mts_ctx_run(ctx, in, 1, outs, &err), 0);
    assert_memory_equal(first, outs[0]->data, sizeof first);
    mts_tensor one = in[0];
    one.dims[0] = 1;
    one.data = (float *)in[0].data + 3 * 32 * 32;
    assert_int_equal(mts_ctx_run(ctx, &one, 1, outs, &err), 0);
    const float *second = outs[0]->data;
    for (int k = 0; k < 10; k++) assert_float_equal(second[k], first[10 + k], 1e-6);
    mts_model_info info;
    mts_model_get_info(m, &info);
    assert_true(info.param_bytes > 0);
    assert_true(info.resident_bytes > 0);
    mts_ctx_free(ctx);
    test_free_inputs(m, in);
    mts_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numel_overflow),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_npy_roundtrip_and_errors),
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_load_buffer_garbage),
        cmocka_unit_test(test_input_validation_and_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
