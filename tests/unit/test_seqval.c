/*
 * Sequence, optional and string-tensor values (src/engine/seqval.c) and their kernels
 * (kernels/ref_seq.c, kernels/ref_string.c), called directly: blobs round-trip; every corrupted
 * header or entry byte of a blob is either rejected or still yields elements inside the blob;
 * hostile positions and split counts are refused; Cast to string formats numbers like numpy's
 * str(); StringNormalizer changes case of UTF-8 Latin-1 letters and drops stop words.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/kernels/kernel.h"
#include "engine/seqval.h"

typedef struct nodebuf {
    mts_node n;
    mts_attr a[4];
    int in[3], out[1];
} nodebuf;

static void mknode(nodebuf *b, const char *op, int n_in)
{
    memset(b, 0, sizeof *b);
    b->n.name = "t";
    b->n.op_type = op;
    b->n.domain = "";
    b->n.opset = 17;
    b->n.n_in = n_in;
    b->n.n_out = 1;
    for (int i = 0; i < 3; i++) b->in[i] = i;
    b->out[0] = 3;
    b->n.in = b->in;
    b->n.out = b->out;
    b->n.attrs = b->a;
}

static mts_attr *attr(nodebuf *b, const char *name, mts_attr_type t)
{
    mts_attr *a = &b->a[b->n.n_attr++];
    memset(a, 0, sizeof *a);
    a->name = name;
    a->type = t;
    return a;
}

/* Infers and runs node n; returns the status, *out gets the output (data malloc'd). */
static int run_node(const mts_node *n, const mts_tensor **in, int n_in, mts_tensor *out)
{
    const mts_op *op = mts_op_lookup(n->op_type);
    assert_non_null(op);
    mts_err err = {0};
    memset(out, 0, sizeof *out);
    mts_kctx k = {n, in, n_in, out, 1, &err, 1, NULL};
    int rc = op->infer(&k);
    if (rc) return rc;
    int64_t nb = mts_tensor_nbytes(out);
    assert_true(nb >= 0);
    out->data = calloc((size_t)nb + 1, 1);
    rc = op->run(&k);
    if (rc) {
        free(out->data);
        out->data = NULL;
    }
    return rc;
}

static mts_tensor make_seq(float *a, float *b)
{
    mts_tensor x = {MTS_DTYPE_FLOAT, 1, {3}, a}, y = {MTS_DTYPE_FLOAT, 2, {2, 2}, b};
    const mts_tensor *items[2] = {&x, &y};
    int64_t nb = mts_seq_bytes(2, items);
    mts_tensor s = {MTS_DTYPE_SEQUENCE, 1, {nb}, calloc((size_t)nb, 1)};
    mts_seq_write(s.data, MTS_SEQ_SEQ, MTS_DTYPE_FLOAT, 2, items);
    return s;
}

static void test_seq_roundtrip_and_corruption(void **state)
{
    (void)state;
    float a[3] = {1, 2, 3}, b[4] = {4, 5, 6, 7};
    mts_tensor s = make_seq(a, b);
    mts_seqv v;
    mts_err err = {0};
    assert_int_equal(mts_seq_view(&s, &v, &err), MTS_OK);
    assert_int_equal(v.count, 2);
    mts_tensor e;
    mts_seq_item(&v, 1, &e);
    assert_int_equal(e.rank, 2);
    assert_memory_equal(e.data, b, sizeof b);
    /* Every byte of the header and entries, set to a few hostile values. */
    const uint8_t vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    uint8_t *p = s.data;
    for (int64_t i = 0; i < 24 + 2 * 88; i++) {
        uint8_t keep = p[i];
        for (size_t j = 0; j < sizeof vals; j++) {
            p[i] = vals[j];
            if (mts_seq_view(&s, &v, &err) != MTS_OK) continue;
            for (int64_t q = 0; q < v.count; q++) {
                mts_seq_item(&v, q, &e);
                int64_t nb = mts_tensor_nbytes(&e);
                assert_true(nb >= 0);
                assert_true((uint8_t *)e.data >= p && (uint8_t *)e.data + nb <= p + s.dims[0]);
            }
        }
        p[i] = keep;
    }
    /* Truncated: every shorter length is rejected or stays in bounds. */
    for (int64_t n = 0; n < s.dims[0]; n++) {
        mts_tensor t = s;
        t.dims[0] = n;
        if (mts_seq_view(&t, &v, &err) == MTS_OK)
            for (int64_t q = 0; q < v.count; q++) {
                mts_seq_item(&v, q, &e);
                assert_true((uint8_t *)e.data + mts_tensor_nbytes(&e) <= p + n);
            }
    }
    free(s.data);
}

static void test_str_roundtrip_and_corruption(void **state)
{
    (void)state;
    const char *strs[3] = {"ab", "", "caf\xc3\xa9"};
    int64_t lens[3] = {2, 0, 5}, dims[2] = {1, 3};
    int64_t nb = mts_str_bytes(3, 7);
    mts_tensor t = {MTS_DTYPE_STRINGS, 1, {nb}, calloc((size_t)nb, 1)};
    mts_str_write(t.data, 2, dims, 3, strs, lens);
    mts_strv v;
    mts_err err = {0};
    assert_int_equal(mts_str_view(&t, &v, &err), MTS_OK);
    assert_int_equal(v.rank, 2);
    assert_int_equal(v.dims[1], 3);
    int64_t l;
    const char *s2 = mts_str_at(&v, 2, &l);
    assert_int_equal(l, 5);
    assert_memory_equal(s2, strs[2], 5);
    uint8_t *p = t.data;
    const uint8_t vals[] = {0x00, 0x01, 0x7f, 0x80, 0xff};
    for (int64_t i = 0; i < nb - 7; i++) {
        uint8_t keep = p[i];
        for (size_t j = 0; j < sizeof vals; j++) {
            p[i] = vals[j];
            if (mts_str_view(&t, &v, &err) != MTS_OK) continue;
            for (int64_t q = 0; q < v.count; q++) {
                const char *s = mts_str_at(&v, q, &l);
                assert_true(l >= 0 && (const uint8_t *)s >= p && (const uint8_t *)s + l <= p + nb);
            }
        }
        p[i] = keep;
    }
    free(t.data);
}

static void test_hostile_positions(void **state)
{
    (void)state;
    float a[3] = {1, 2, 3}, b[4] = {4, 5, 6, 7};
    mts_tensor s = make_seq(a, b), out;
    int64_t pos = 2;
    mts_tensor tp = {MTS_DTYPE_INT64, 0, {0}, &pos};
    const mts_tensor *in[2] = {&s, &tp};
    nodebuf nb;
    mknode(&nb, "SequenceAt", 2);
    assert_int_equal(run_node(&nb.n, in, 2, &out), MTS_EINVAL);
    pos = -2;
    assert_int_equal(run_node(&nb.n, in, 2, &out), MTS_OK);
    assert_int_equal(out.dims[0], 3);
    free(out.data);
    /* A sequence handed where a tensor is expected, and a mangled blob. */
    ((uint8_t *)s.data)[0] ^= 1;
    assert_int_equal(run_node(&nb.n, in, 2, &out), MTS_EINVAL);
    free(s.data);
    /* SplitToSequence beyond the element cap. */
    int64_t big = MTS_SEQ_MAX_ITEMS + 1;
    mts_tensor x = {MTS_DTYPE_UINT8, 1, {big}, calloc((size_t)big, 1)};
    const mts_tensor *in1[1] = {&x};
    mknode(&nb, "SplitToSequence", 1);
    assert_int_equal(run_node(&nb.n, in1, 1, &out), MTS_ELIMIT);
    free(x.data);
}

/* Cast float -> string -> float. */
static void test_cast_strings(void **state)
{
    (void)state;
    float f[] = {100.0f, 0.5f, 1e-5f, 1.5e20f, -0.0f, 0.1f, 123456.7f, NAN, -INFINITY, 0.00012f};
    const char *want[] = {"100.0", "0.5", "1e-05", "1.5e+20", "-0.0", "0.1", "123456.7", "NaN", "-INF", "0.00012"};
    int n = (int)(sizeof f / sizeof f[0]);
    mts_tensor x = {MTS_DTYPE_FLOAT, 1, {n}, f}, s, y;
    const mts_tensor *in[1] = {&x};
    nodebuf nb;
    mknode(&nb, "Cast", 1);
    attr(&nb, "to", MTS_ATTR_INT)->i = MTS_DTYPE_STRING;
    assert_int_equal(run_node(&nb.n, in, 1, &s), MTS_OK);
    mts_strv v;
    mts_err err = {0};
    assert_int_equal(mts_str_view(&s, &v, &err), MTS_OK);
    for (int i = 0; i < n; i++) {
        int64_t l;
        const char *p = mts_str_at(&v, i, &l);
        assert_int_equal(l, (int64_t)strlen(want[i]));
        assert_memory_equal(p, want[i], (size_t)l);
    }
    in[0] = &s;
    mknode(&nb, "Cast", 1);
    attr(&nb, "to", MTS_ATTR_INT)->i = MTS_DTYPE_FLOAT;
    assert_int_equal(run_node(&nb.n, in, 1, &y), MTS_OK);
    for (int i = 0; i < n; i++) {
        float g = ((float *)y.data)[i];
        if (isnan(f[i])) assert_true(isnan(g));
        else assert_true(g == f[i]);
    }
    free(s.data);
    free(y.data);
}

static void test_string_normalizer(void **state)
{
    (void)state;
    const char *strs[3] = {"caf\xc3\xa9", "Monday", "x"};
    int64_t lens[3] = {5, 6, 1}, dims[1] = {3};
    int64_t bytes = mts_str_bytes(3, 12);
    mts_tensor t = {MTS_DTYPE_STRINGS, 1, {bytes}, calloc((size_t)bytes, 1)}, out;
    mts_str_write(t.data, 1, dims, 3, strs, lens);
    const mts_tensor *in[1] = {&t};
    nodebuf nb;
    mknode(&nb, "StringNormalizer", 1);
    attr(&nb, "case_change_action", MTS_ATTR_STRING)->s = "UPPER";
    static const char *const stop[] = {"monday"};
    mts_attr *a = attr(&nb, "stopwords", MTS_ATTR_STRINGS);
    a->strings = stop;
    a->n = 1;
    assert_int_equal(run_node(&nb.n, in, 1, &out), MTS_OK);
    mts_strv v;
    mts_err err = {0};
    assert_int_equal(mts_str_view(&out, &v, &err), MTS_OK);
    assert_int_equal(v.count, 2);
    int64_t l;
    const char *p = mts_str_at(&v, 0, &l);
    assert_int_equal(l, 5);
    assert_memory_equal(p, "CAF\xc3\x89", 5);
    free(out.data);
    attr(&nb, "locale", MTS_ATTR_STRING)->s = "tr_TR";
    assert_int_equal(run_node(&nb.n, in, 1, &out), MTS_EUNSUPPORTED);
    free(t.data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seq_roundtrip_and_corruption),
        cmocka_unit_test(test_str_roundtrip_and_corruption),
        cmocka_unit_test(test_hostile_positions),
        cmocka_unit_test(test_cast_strings),
        cmocka_unit_test(test_string_normalizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
