/*
 * The loss kernels (src/engine/kernels/ref_loss.c) and TfIdfVectorizer (ref_text.c), called
 * directly: NegativeLogLikelihoodLoss's reductions, weights and ignore_index on a small case
 * worked by hand; SoftmaxCrossEntropyLoss against log_softmax computed here, with the same
 * result at every thread count; targets outside the classes rejected with MTS_EINVAL; and
 * TfIdfVectorizer's counting (skip-grams, unigrams once), IDF weights and the validation of a
 * hostile pool layout.
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

#if defined(__SANITIZE_THREAD__)
#define MAX_THREADS 1
#else
#define MAX_THREADS 4
#endif

typedef struct nodebuf {
    mts_node n;
    mts_attr a[10];
    int in[3], out[2];
} nodebuf;

static void mknode(nodebuf *b, const char *op, int n_in, int n_out, int opset)
{
    memset(b, 0, sizeof *b);
    b->n.name = "t";
    b->n.op_type = op;
    b->n.domain = "";
    b->n.opset = opset;
    b->n.n_in = n_in;
    b->n.n_out = n_out;
    for (int i = 0; i < 3; i++) b->in[i] = i;
    b->out[0] = 3;
    b->out[1] = 4;
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

static void attr_i(nodebuf *b, const char *name, int64_t v) { attr(b, name, MTS_ATTR_INT)->i = v; }
static void attr_s(nodebuf *b, const char *name, const char *v) { attr(b, name, MTS_ATTR_STRING)->s = v; }
static void attr_ints(nodebuf *b, const char *name, const int64_t *v, int n)
{
    mts_attr *a = attr(b, name, MTS_ATTR_INTS);
    a->ints = v;
    a->n = n;
}
static void attr_floats(nodebuf *b, const char *name, const float *v, int n)
{
    mts_attr *a = attr(b, name, MTS_ATTR_FLOATS);
    a->floats = v;
    a->n = n;
}

/* Infers and runs node n into fresh outputs out[0..n_out); returns the run status. */
static int run_node(const mts_node *n, const mts_tensor **in, int n_in, mts_tensor *out, int n_out, int threads)
{
    const mts_op *op = mts_op_lookup(n->op_type);
    assert_non_null(op);
    mts_err err = {0};
    memset(out, 0, sizeof(mts_tensor) * (size_t)n_out);
    mts_kctx k = {n, in, n_in, out, n_out, &err, threads, NULL};
    int rc = op->infer(&k);
    if (rc) return rc;
    for (int j = 0; j < n_out; j++) {
        int64_t nb = mts_tensor_nbytes(&out[j]);
        assert_true(nb >= 0);
        out[j].data = calloc(1, nb > 0 ? (size_t)nb : 1);
    }
    rc = op->run(&k);
    return rc;
}

static void free_out(mts_tensor *out, int n)
{
    for (int j = 0; j < n; j++) free(out[j].data);
}

static void test_nll(void **state)
{
    (void)state;
    /* x [2, 3, 2]: x[n, c, d] = -(10n + 3c + d + 1) / 10, so loss[n, d] = (10n + 3t + d + 1) / 10. */
    float xs[12];
    for (int n = 0; n < 2; n++)
        for (int c = 0; c < 3; c++)
            for (int d = 0; d < 2; d++) xs[n * 6 + c * 2 + d] = -(float)(10 * n + 3 * c + d + 1) / 10.0f;
    int64_t ts[4] = {2, 0, 1, 2};
    float ws[3] = {1.0f, 2.0f, 0.5f};
    mts_tensor x = {MTS_DTYPE_FLOAT, 3, {2, 3, 2}, xs}, t = {MTS_DTYPE_INT64, 2, {2, 2}, ts},
               w = {MTS_DTYPE_FLOAT, 1, {3}, ws};
    const mts_tensor *in[3] = {&x, &t, &w};
    nodebuf nb;
    mts_tensor y;
    mknode(&nb, "NegativeLogLikelihoodLoss", 3, 1, 13);
    attr_s(&nb, "reduction", "none");
    assert_int_equal(run_node(&nb.n, in, 3, &y, 1, 1), MTS_OK);
    assert_int_equal(y.rank, 2);
    const float want[4] = {0.5f * 0.7f, 1.0f * 0.2f, 2.0f * 1.4f, 0.5f * 1.8f};
    for (int i = 0; i < 4; i++) assert_true(fabsf(((float *)y.data)[i] - want[i]) < 1e-6f);
    free_out(&y, 1);

    /* mean with ignore_index 2: positions 1 and 2 count, weights 1 and 2. */
    nb.a[0].s = "mean";
    attr_i(&nb, "ignore_index", 2);
    assert_int_equal(run_node(&nb.n, in, 3, &y, 1, 1), MTS_OK);
    assert_int_equal(y.rank, 0);
    assert_true(fabsf(*(float *)y.data - (0.2f + 2.8f) / 3.0f) < 1e-6f);
    free_out(&y, 1);

    /* A target outside [0, C) that is not the ignore_index is rejected before any read. */
    ts[3] = 3;
    assert_int_equal(run_node(&nb.n, in, 3, &y, 1, 1), MTS_EINVAL);
    free_out(&y, 1);
    ts[3] = -1000000000000LL;
    assert_int_equal(run_node(&nb.n, in, 3, &y, 1, 1), MTS_EINVAL);
    free_out(&y, 1);
    ts[3] = 2;

    /* Shape and attribute validation. */
    nb.a[0].s = "average";
    assert_int_equal(run_node(&nb.n, in, 3, &y, 1, 1), MTS_EINVAL);
    free_out(&y, 1);
    nb.a[0].s = "sum";
    mts_tensor w2 = {MTS_DTYPE_FLOAT, 1, {2}, ws};
    const mts_tensor *in2[3] = {&x, &t, &w2};
    assert_int_equal(run_node(&nb.n, in2, 3, &y, 1, 1), MTS_ESHAPE);
    free_out(&y, 1);
    mts_tensor t2 = {MTS_DTYPE_INT64, 2, {2, 3}, ts};
    const mts_tensor *in3[3] = {&x, &t2, &w};
    assert_int_equal(run_node(&nb.n, in3, 3, &y, 1, 1), MTS_ESHAPE);
    free_out(&y, 1);
    mts_tensor tf = {MTS_DTYPE_FLOAT, 2, {2, 2}, xs};
    const mts_tensor *in4[3] = {&x, &tf, &w};
    assert_int_equal(run_node(&nb.n, in4, 3, &y, 1, 1), MTS_EINVAL);
    free_out(&y, 1);
}

static void test_sce(void **state)
{
    (void)state;
    enum { N = 64, C = 7, D = 300 };
    float *xs = malloc(sizeof(float) * N * C * D);
    int32_t *ts = malloc(sizeof(int32_t) * N * D);
    unsigned r = 12345;
    for (int i = 0; i < N * C * D; i++) {
        r = r * 1103515245u + 12345u;
        xs[i] = (float)((r >> 8) & 0xffff) / 4096.0f - 8.0f;
    }
    for (int i = 0; i < N * D; i++) ts[i] = i % 11 == 0 ? -5 : (i * 7) % C;
    mts_tensor x = {MTS_DTYPE_FLOAT, 3, {N, C, D}, xs}, t = {MTS_DTYPE_INT32, 2, {N, D}, ts};
    const mts_tensor *in[2] = {&x, &t};
    nodebuf nb;
    mknode(&nb, "SoftmaxCrossEntropyLoss", 2, 2, 13);
    attr_s(&nb, "reduction", "mean");
    attr_i(&nb, "ignore_index", -5);
    mts_tensor a[2], b[2];
    assert_int_equal(run_node(&nb.n, in, 2, a, 2, 1), MTS_OK);
    assert_int_equal(run_node(&nb.n, in, 2, b, 2, MAX_THREADS), MTS_OK);
    assert_int_equal(a[1].rank, 3);
    assert_memory_equal(a[1].data, b[1].data, sizeof(float) * N * C * D);
    assert_true(fabsf(*(float *)a[0].data - *(float *)b[0].data) < 1e-6f * fabsf(*(float *)a[0].data));
    /* Against log_softmax and the mean computed here. */
    double sum = 0, cnt = 0;
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++) {
            double mx = -INFINITY, s = 0;
            for (int c = 0; c < C; c++) mx = fmax(mx, xs[(n * C + c) * D + d]);
            for (int c = 0; c < C; c++) s += exp(xs[(n * C + c) * D + d] - mx);
            for (int c = 0; c < C; c++) {
                double lp = xs[(n * C + c) * D + d] - mx - log(s);
                assert_true(fabs(((float *)a[1].data)[(n * C + c) * D + d] - lp) < 1e-5);
            }
            int tv = ts[n * D + d];
            if (tv == -5) continue;
            sum -= xs[(n * C + tv) * D + d] - mx - log(s);
            cnt += 1;
        }
    assert_true(fabs(*(float *)a[0].data - sum / cnt) < 1e-5 * fabs(sum / cnt));
    free_out(a, 2);
    free_out(b, 2);
    /* Out-of-range class with ignore_index set elsewhere. */
    ts[5] = C;
    assert_int_equal(run_node(&nb.n, in, 2, a, 2, 1), MTS_EINVAL);
    free_out(a, 2);
    free(xs);
    free(ts);
}

static void test_tfidf(void **state)
{
    (void)state;
    /* Pool: unigrams {7, 3}, bigrams {(7, 3), (3, 3)}. */
    static const int64_t counts[2] = {0, 2}, idx[4] = {3, 0, 1, 2}, pool[6] = {7, 3, 7, 3, 3, 3};
    static const float w[4] = {0.5f, 2.0f, 4.0f, 8.0f};
    int64_t xs[6] = {7, 3, 3, 7, 9, 3};
    mts_tensor x = {MTS_DTYPE_INT64, 1, {6}, xs};
    const mts_tensor *in[1] = {&x};
    nodebuf nb;
    mknode(&nb, "TfIdfVectorizer", 1, 1, 9);
    attr_s(&nb, "mode", "TF");
    attr_i(&nb, "min_gram_length", 1);
    attr_i(&nb, "max_gram_length", 2);
    attr_i(&nb, "max_skip_count", 1);
    attr_ints(&nb, "ngram_counts", counts, 2);
    attr_ints(&nb, "ngram_indexes", idx, 4);
    attr_ints(&nb, "pool_int64s", pool, 6);
    mts_tensor y;
    assert_int_equal(run_node(&nb.n, in, 1, &y, 1, 1), MTS_OK);
    assert_int_equal(y.rank, 1);
    assert_int_equal(y.dims[0], 4);
    /* Unigrams (counted at distance 1 only): 7 twice, 3 three times. Bigrams at distance 1:
     * (7,3) once, (3,3) once; at distance 2: (7,3) at positions 0/2 and 3/5. */
    const float tf[4] = {3.0f, 3.0f, 1.0f, 2.0f}; /* columns: 3 -> col 0, (7,3) -> 1, (3,3) -> 2, 7 -> 3 */
    assert_memory_equal(y.data, tf, sizeof tf);
    free_out(&y, 1);
    nb.a[0].s = "IDF";
    attr_floats(&nb, "weights", w, 4);
    assert_int_equal(run_node(&nb.n, in, 1, &y, 1, 1), MTS_OK);
    const float idf[4] = {2.0f, 4.0f, 8.0f, 0.5f};
    assert_memory_equal(y.data, idf, sizeof idf);
    free_out(&y, 1);

    /* Hostile layouts: a level not a multiple of its length, counts past the pool, an index
     * count that does not match the pool, a negative column, a string pool. */
    static const int64_t bad_counts[2] = {0, 3}, far_counts[2] = {0, 9}, neg_idx[4] = {0, -1, 2, 3};
    nb.a[4].ints = bad_counts;
    assert_int_equal(run_node(&nb.n, in, 1, &y, 1, 1), MTS_EINVAL);
    nb.a[4].ints = far_counts;
    assert_int_equal(run_node(&nb.n, in, 1, &y, 1, 1), MTS_EINVAL);
    nb.a[4].ints = counts;
    nb.a[5].n = 3;
    assert_int_equal(run_node(&nb.n, in, 1, &y, 1, 1), MTS_EINVAL);
    nb.a[5].n = 4;
    nb.a[5].ints = neg_idx;
    assert_int_equal(run_node(&nb.n, in, 1, &y, 1, 1), MTS_EINVAL);
    nb.a[5].ints = idx;
    nb.a[0].s = "BM25";
    assert_int_equal(run_node(&nb.n, in, 1, &y, 1, 1), MTS_EINVAL);
    nb.a[0].s = "TF";
    static const char *const strs[1] = {"a"};
    mts_attr *sa = attr(&nb, "pool_strings", MTS_ATTR_STRINGS);
    sa->strings = strs;
    sa->n = 1;
    assert_int_equal(run_node(&nb.n, in, 1, &y, 1, 1), MTS_EUNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nll),
        cmocka_unit_test(test_sce),
        cmocka_unit_test(test_tfidf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
