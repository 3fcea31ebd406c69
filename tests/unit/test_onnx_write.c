/*
 * The ONNX model editor and writer (src/engine/onnx_write.c): a model built here with the
 * writer's own encoders reads back into the expected nodes, initializers and outputs and
 * re-emits byte for byte; edits (a new graph output, a new node and initializer, a raised opset)
 * produce a model the engine loads and runs with the expected results; every truncation and
 * random corruption of the file is read without a crash (under ASan in make test) and
 * truncations inside the graph are refused with a message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "engine/onnx_write.h"

static void sub(mts_pbw *w, uint32_t field, mts_pbw *s)
{
    mts_pbw_bytes(w, field, s->p, s->len);
    mts_pbw_free(s);
}

static void value_info(mts_pbw *g, uint32_t field, const char *name, int64_t dim)
{
    mts_pbw d = {0}, sh = {0}, tt = {0}, ty = {0}, vi = {0};
    mts_pbw_int(&d, 1, dim);
    sub(&sh, 1, &d);
    mts_pbw_int(&tt, 1, MTS_DTYPE_FLOAT);
    sub(&tt, 2, &sh);
    sub(&ty, 1, &tt);
    mts_pbw_str(&vi, 1, name);
    sub(&vi, 2, &ty);
    sub(g, field, &vi);
}

static void node(mts_pbw *g, const char *op, const char *a, const char *b, const char *out)
{
    mts_pbw n = {0};
    mts_pbw_str(&n, 1, a);
    if (b) mts_pbw_str(&n, 1, b);
    mts_pbw_str(&n, 2, out);
    mts_pbw_str(&n, 3, out);
    mts_pbw_str(&n, 4, op);
    sub(g, 1, &n);
}

/* z = Relu(x) + c, c = [0.5, 1.5]; x, z float [2]; opset 13. */
static mts_pbw make_model(void)
{
    mts_pbw m = {0}, g = {0}, t = {0}, o = {0};
    node(&g, "Relu", "x", NULL, "y");
    node(&g, "Add", "y", "c", "z");
    mts_pbw_str(&g, 2, "g");
    const float c[2] = {0.5f, 1.5f};
    mts_pbw_int(&t, 1, 2);
    mts_pbw_int(&t, 2, MTS_DTYPE_FLOAT);
    mts_pbw_str(&t, 8, "c");
    mts_pbw_bytes(&t, 9, c, sizeof c);
    sub(&g, 5, &t);
    value_info(&g, 11, "x", 2);
    value_info(&g, 12, "z", 2);
    mts_pbw_int(&m, 1, 8);
    mts_pbw_str(&m, 2, "test");
    sub(&m, 7, &g);
    mts_pbw_str(&o, 1, "");
    mts_pbw_int(&o, 2, 13);
    sub(&m, 8, &o);
    assert_false(m.oom);
    return m;
}

static int *identity(int n)
{
    int *o = malloc(sizeof(int) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) o[i] = i;
    return o;
}

static void test_roundtrip(void **state)
{
    (void)state;
    mts_pbw m = make_model();
    mts_onnx_doc d;
    mts_err err = {0};
    assert_int_equal(mts_onnx_doc_read(&d, m.p, m.len, "model", &err), MTS_OK);
    assert_int_equal(d.n_nodes, 2);
    assert_int_equal(d.n_inits, 1);
    assert_int_equal(d.n_outputs, 1);
    assert_int_equal(d.opset, 13);
    assert_string_equal(d.nodes[1].op_type, "Add");
    assert_string_equal(d.nodes[1].in[1], "c");
    assert_string_equal(d.inits[0].name, "c");
    int64_t n = 0;
    float *c = mts_onnx_init_floats(&d.inits[0], &n);
    assert_non_null(c);
    assert_int_equal(n, 2);
    assert_true(c[1] == 1.5f);
    free(c);
    int *order = identity(d.n_nodes);
    mts_pbw w = {0};
    assert_int_equal(mts_onnx_doc_write(&d, order, d.n_nodes, &w, &err), MTS_OK);
    assert_int_equal(w.len, m.len);
    assert_memory_equal(w.p, m.p, m.len);
    free(order);
    mts_pbw_free(&w);
    mts_onnx_doc_free(&d);
    mts_pbw_free(&m);
}

/* Adds y as an output, a Mul node z2 = z * k with a new initializer k, raises the opset, and
 * runs the result. */
static void test_edit_and_run(void **state)
{
    (void)state;
    mts_pbw m = make_model();
    mts_onnx_doc d;
    mts_err err = {0};
    assert_int_equal(mts_onnx_doc_read(&d, m.p, m.len, "model", &err), MTS_OK);
    const float k[2] = {2.0f, -1.0f};
    const int64_t dims[1] = {2};
    assert_non_null(mts_onnx_add_init(&d, "k", MTS_DTYPE_FLOAT, 1, dims, k, sizeof k));
    const char *in[2] = {"z", "k"}, *out[1] = {"z2"};
    assert_non_null(mts_onnx_add_node(&d, "Mul", in, 2, out, 1, INT64_MIN));
    assert_int_equal(mts_onnx_add_output(&d, "y"), MTS_OK);
    assert_int_equal(mts_onnx_add_output(&d, "z2"), MTS_OK);
    d.new_opset = 14;
    int *order = identity(d.n_nodes);
    mts_pbw w = {0};
    assert_int_equal(mts_onnx_doc_write(&d, order, d.n_nodes, &w, &err), MTS_OK);
    mts_model *mod = NULL;
    int rc = mts_model_load_buffer(w.p, w.len, "edited", NULL, &mod, &err);
    if (rc) fail_msg("edited model does not load: %s", err.msg);
    mts_model_info info;
    mts_model_get_info(mod, &info);
    assert_int_equal(info.opset, 14);
    assert_int_equal(info.n_outputs, 3);
    mts_ctx *ctx = NULL;
    assert_int_equal(mts_ctx_create(mod, 1, &ctx, &err), MTS_OK);
    float xv[2] = {-1.0f, 2.0f};
    mts_tensor x = {.dtype = MTS_DTYPE_FLOAT, .rank = 1, .dims = {2}, .data = xv};
    const mts_tensor *outs[3];
    assert_int_equal(mts_ctx_run(ctx, &x, 1, outs, &err), MTS_OK);
    const float *z = outs[0]->data, *y = outs[1]->data, *z2 = outs[2]->data;
    assert_true(z[0] == 0.5f && z[1] == 3.5f);
    assert_true(y[0] == 0.0f && y[1] == 2.0f);
    assert_true(z2[0] == 1.0f && z2[1] == -3.5f);
    mts_ctx_free(ctx);
    mts_model_free(mod);
    free(order);
    mts_pbw_free(&w);
    mts_onnx_doc_free(&d);
    mts_pbw_free(&m);
}

static void test_hostile(void **state)
{
    (void)state;
    mts_pbw m = make_model();
    mts_err err = {0};
    mts_onnx_doc d;
    /* every truncation: no crash; one that cuts into the graph message fails with a message */
    for (size_t len = 0; len < m.len; len++) {
        uint8_t *copy = malloc(len ? len : 1);
        memcpy(copy, m.p, len);
        err.msg[0] = 0;
        int rc = mts_onnx_doc_read(&d, copy, len, "truncated", &err);
        if (rc) assert_true(err.msg[0] != 0);
        else {
            int *order = identity(d.n_nodes);
            mts_pbw w = {0};
            (void)mts_onnx_doc_write(&d, order, d.n_nodes, &w, &err);
            mts_pbw_free(&w);
            free(order);
        }
        mts_onnx_doc_free(&d);
        free(copy);
    }
    /* random byte corruptions: read and write again without a crash */
    unsigned s = 12345;
    for (int it = 0; it < 2000; it++) {
        uint8_t *copy = malloc(m.len);
        memcpy(copy, m.p, m.len);
        for (int f = 0; f < 3; f++) {
            s = s * 1103515245u + 12345u;
            copy[(s >> 8) % m.len] = (uint8_t)(s >> 20);
        }
        if (mts_onnx_doc_read(&d, copy, m.len, "corrupt", &err) == MTS_OK) {
            int *order = identity(d.n_nodes);
            mts_pbw w = {0};
            (void)mts_onnx_doc_write(&d, order, d.n_nodes, &w, &err);
            mts_pbw_free(&w);
            free(order);
        }
        mts_onnx_doc_free(&d);
        free(copy);
    }
    mts_pbw_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_edit_and_run),
        cmocka_unit_test(test_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
