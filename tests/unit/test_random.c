/*
 * The random generator kernels (src/engine/kernels/ref_random.c), called directly: with a seed
 * the output is the same on every run and at every thread count, and different seeds give
 * different draws; without a seed two runs differ. RandomUniform stays in [low, high) with the
 * uniform mean and variance, RandomNormal has the requested mean and standard deviation, the
 * *Like forms take their input's shape, Bernoulli follows its probabilities (0 and 1 exactly)
 * and Multinomial's class frequencies follow the softmax of its logits. Also the generators'
 * validation of hostile attributes.
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
    mts_attr a[8];
    int in[2], out[1];
} nodebuf;

static void mknode(nodebuf *b, const char *op, int n_in)
{
    memset(b, 0, sizeof *b);
    b->n.name = "t";
    b->n.op_type = op;
    b->n.domain = "";
    b->n.opset = 15;
    b->n.n_in = n_in;
    b->n.n_out = 1;
    b->in[0] = 0;
    b->in[1] = 1;
    b->out[0] = 2;
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

static void attr_f(nodebuf *b, const char *name, float v) { attr(b, name, MTS_ATTR_FLOAT)->f = v; }
static void attr_i(nodebuf *b, const char *name, int64_t v) { attr(b, name, MTS_ATTR_INT)->i = v; }
static void attr_ints(nodebuf *b, const char *name, const int64_t *v, int n)
{
    mts_attr *a = attr(b, name, MTS_ATTR_INTS);
    a->ints = v;
    a->n = n;
}

/* Infers and runs node n on the inputs into a fresh output; returns the output (data malloc'ed). */
static mts_tensor run_node(const mts_node *n, const mts_tensor **in, int n_in, int threads)
{
    const mts_op *op = mts_op_lookup(n->op_type);
    assert_non_null(op);
    mts_err err = {0};
    mts_tensor out = {0};
    mts_kctx k = {n, in, n_in, &out, 1, &err, threads, NULL};
    if (op->infer(&k)) fail_msg("%s infer: %s", n->op_type, err.msg);
    int64_t nb = mts_tensor_nbytes(&out);
    assert_true(nb >= 0);
    out.data = calloc(1, nb > 0 ? (size_t)nb : 1);
    if (op->run(&k)) fail_msg("%s run: %s", n->op_type, err.msg);
    return out;
}

/* The infer status of node n (for attribute validation). */
static int infer_status(const mts_node *n, const mts_tensor **in, int n_in)
{
    mts_err err = {0};
    mts_tensor out = {0};
    mts_kctx k = {n, in, n_in, &out, 1, &err, 1, NULL};
    return mts_op_lookup(n->op_type)->infer(&k);
}

static void moments(const mts_tensor *t, double *mean, double *var)
{
    int64_t n = mts_tensor_numel(t);
    double s = 0, q = 0;
    for (int64_t i = 0; i < n; i++) s += ((const float *)t->data)[i];
    *mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) {
        double d = ((const float *)t->data)[i] - *mean;
        q += d * d;
    }
    *var = q / (double)n;
}

static const int64_t big_shape[] = {400, 500};

static void test_uniform(void **state)
{
    (void)state;
    nodebuf nb;
    mknode(&nb, "RandomUniform", 0);
    attr_ints(&nb, "shape", big_shape, 2);
    attr_f(&nb, "low", -2.0f);
    attr_f(&nb, "high", 5.0f);
    attr_f(&nb, "seed", 3.0f);
    mts_tensor a = run_node(&nb.n, NULL, 0, 1), b = run_node(&nb.n, NULL, 0, MAX_THREADS);
    assert_int_equal(a.rank, 2);
    assert_int_equal(a.dims[0], 400);
    assert_int_equal(a.dims[1], 500);
    assert_memory_equal(a.data, b.data, 400 * 500 * sizeof(float));
    const float *v = a.data;
    for (int i = 0; i < 400 * 500; i++)
        if (!(v[i] >= -2.0f && v[i] <= 5.0f)) fail_msg("element %d = %g is outside [-2, 5]", i, v[i]);
    double m, var;
    moments(&a, &m, &var);
    assert_true(fabs(m - 1.5) < 0.03);
    assert_true(fabs(var - 49.0 / 12.0) < 0.05);
    nb.a[3].f = 4.0f; /* another seed: other values */
    mts_tensor c = run_node(&nb.n, NULL, 0, 1);
    int same = 0;
    for (int i = 0; i < 400 * 500; i++) same += ((float *)c.data)[i] == v[i];
    assert_true(same < 100);
    free(a.data), free(b.data), free(c.data);
}

static void test_normal(void **state)
{
    (void)state;
    nodebuf nb;
    mknode(&nb, "RandomNormal", 0);
    attr_ints(&nb, "shape", big_shape, 2);
    attr_f(&nb, "mean", 2.0f);
    attr_f(&nb, "scale", 3.0f);
    attr_f(&nb, "seed", 11.0f);
    mts_tensor a = run_node(&nb.n, NULL, 0, MAX_THREADS), b = run_node(&nb.n, NULL, 0, 1);
    assert_memory_equal(a.data, b.data, 400 * 500 * sizeof(float));
    double m, var;
    moments(&a, &m, &var);
    assert_true(fabs(m - 2.0) < 0.05);
    assert_true(fabs(sqrt(var) - 3.0) < 0.05);
    /* Without a seed, two runs draw different values. */
    nb.n.n_attr = 3;
    mts_tensor c = run_node(&nb.n, NULL, 0, 1), d = run_node(&nb.n, NULL, 0, 1);
    assert_true(memcmp(c.data, d.data, 400 * 500 * sizeof(float)) != 0);
    free(a.data), free(b.data), free(c.data), free(d.data);
}

static void test_like(void **state)
{
    (void)state;
    float xs[6] = {0};
    mts_tensor x = {MTS_DTYPE_FLOAT, 3, {1, 2, 3}, xs};
    const mts_tensor *in[1] = {&x};
    nodebuf nb;
    mknode(&nb, "RandomUniformLike", 1);
    attr_f(&nb, "seed", 1.0f);
    mts_tensor a = run_node(&nb.n, in, 1, 1);
    assert_int_equal(a.rank, 3);
    assert_int_equal(a.dims[2], 3);
    assert_int_equal(a.dtype, MTS_DTYPE_FLOAT);
    mknode(&nb, "RandomNormalLike", 1);
    attr_f(&nb, "seed", 1.0f);
    mts_tensor b = run_node(&nb.n, in, 1, 1);
    assert_int_equal(b.dims[1], 2);
    /* An integer input without dtype is rejected; a double output is drawn in double (the
     * uniform's values in [0, 1)); float16 output is declined. */
    int64_t is[6] = {0};
    mts_tensor xi = {MTS_DTYPE_INT64, 1, {6}, is};
    const mts_tensor *ini[1] = {&xi};
    assert_int_equal(infer_status(&nb.n, ini, 1), MTS_EINVAL);
    mknode(&nb, "RandomUniformLike", 1);
    attr_f(&nb, "seed", 1.0f);
    attr_i(&nb, "dtype", MTS_DTYPE_DOUBLE);
    mts_tensor c = run_node(&nb.n, in, 1, 1);
    assert_int_equal(c.dtype, MTS_DTYPE_DOUBLE);
    for (int i = 0; i < 6; i++) {
        double v = ((const double *)c.data)[i];
        assert_true(v >= 0.0 && v < 1.0);
        assert_true(fabs(v - ((const float *)a.data)[i]) < 1e-6); /* the same draws as float */
    }
    nb.a[1].i = MTS_DTYPE_FLOAT16;
    assert_int_equal(infer_status(&nb.n, in, 1), MTS_EUNSUPPORTED);
    free(a.data), free(b.data), free(c.data);
}

static void test_bernoulli(void **state)
{
    (void)state;
    enum { N = 100000 };
    float *p = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) p[i] = i % 3 == 0 ? 0.0f : i % 3 == 1 ? 1.0f : 0.3f;
    mts_tensor x = {MTS_DTYPE_FLOAT, 1, {N}, p};
    const mts_tensor *in[1] = {&x};
    nodebuf nb;
    mknode(&nb, "Bernoulli", 1);
    attr_f(&nb, "seed", 5.0f);
    mts_tensor a = run_node(&nb.n, in, 1, 1), b = run_node(&nb.n, in, 1, 1);
    assert_memory_equal(a.data, b.data, N * sizeof(float));
    const float *y = a.data;
    int ones = 0, n3 = 0;
    for (int i = 0; i < N; i++) {
        if (i % 3 == 0) assert_true(y[i] == 0.0f);
        else if (i % 3 == 1) assert_true(y[i] == 1.0f);
        else {
            assert_true(y[i] == 0.0f || y[i] == 1.0f);
            ones += y[i] == 1.0f;
            n3++;
        }
    }
    assert_true(fabs((double)ones / n3 - 0.3) < 0.015);
    attr_i(&nb, "dtype", MTS_DTYPE_BOOL);
    mts_tensor c = run_node(&nb.n, in, 1, 1);
    assert_int_equal(c.dtype, MTS_DTYPE_BOOL);
    for (int i = 0; i < N; i++) assert_int_equal(((uint8_t *)c.data)[i], y[i] == 1.0f);
    free(a.data), free(b.data), free(c.data), free(p);
}

static void test_multinomial(void **state)
{
    (void)state;
    float logits[6] = {logf(0.2f), logf(0.5f), logf(0.3f), 0.0f, -INFINITY, -INFINITY};
    mts_tensor x = {MTS_DTYPE_FLOAT, 2, {2, 3}, logits};
    const mts_tensor *in[1] = {&x};
    nodebuf nb;
    mknode(&nb, "Multinomial", 1);
    attr_i(&nb, "sample_size", 50000);
    attr_f(&nb, "seed", 9.0f);
    mts_tensor a = run_node(&nb.n, in, 1, 1), b = run_node(&nb.n, in, 1, 1);
    assert_int_equal(a.dtype, MTS_DTYPE_INT32);
    assert_int_equal(a.dims[1], 50000);
    assert_memory_equal(a.data, b.data, 2 * 50000 * sizeof(int32_t));
    const int32_t *y = a.data;
    int count[3] = {0};
    for (int i = 0; i < 50000; i++) {
        assert_true(y[i] >= 0 && y[i] < 3);
        count[y[i]]++;
        assert_int_equal(y[50000 + i], 0); /* the second row puts all its mass on class 0 */
    }
    assert_true(fabs(count[0] / 50000.0 - 0.2) < 0.01);
    assert_true(fabs(count[1] / 50000.0 - 0.5) < 0.01);
    assert_true(fabs(count[2] / 50000.0 - 0.3) < 0.01);
    nb.a[0].i = 0; /* sample_size 0 */
    assert_int_equal(infer_status(&nb.n, in, 1), MTS_EINVAL);
    free(a.data), free(b.data);
}

static void test_hostile_shapes(void **state)
{
    (void)state;
    nodebuf nb;
    mknode(&nb, "RandomNormal", 0);
    static const int64_t neg[] = {3, -1};
    attr_ints(&nb, "shape", neg, 2);
    assert_int_equal(infer_status(&nb.n, NULL, 0), MTS_EINVAL);
    static const int64_t huge[] = {(int64_t)1 << 40, (int64_t)1 << 40};
    nb.a[0].ints = huge;
    assert_int_equal(infer_status(&nb.n, NULL, 0), MTS_EINVAL);
    mknode(&nb, "RandomUniform", 0); /* shape is required */
    assert_int_equal(infer_status(&nb.n, NULL, 0), MTS_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform),
        cmocka_unit_test(test_normal),
        cmocka_unit_test(test_like),
        cmocka_unit_test(test_bernoulli),
        cmocka_unit_test(test_multinomial),
        cmocka_unit_test(test_hostile_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
