/*
 * Padding-free runs (engine/padfree.c, engine.h mts_ctx_set_padding_mask) on the small BERT-style
 * encoders of tests/models (make_test_models.py: 2 layers, hidden 64, the export's (1 - mask) *
 * -10000 attention mask): with the padding mask set, a batch of texts of mixed lengths skips
 * exactly its padded rows, and every valid row's output equals the whole run's (up to the
 * attention's summation order) at 1 and 2 threads, over several shapes, batch sizes and a
 * length-1 text. A mask that is not ones-then-zeros (a hole, all ones) and a model whose output
 * pools across the tokens inside the graph run whole, bit-identical to a run without the mask
 * set; a BERT pooler (the first token's dense + tanh) keeps the plan eligible and its output
 * exact; four threads run padding-free batches on one model at once, two per plan with
 * different lengths.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "test_util.h"

#if defined(__SANITIZE_THREAD__)
#define MAX_THREADS 1
#else
#define MAX_THREADS 2
#endif

static unsigned seed = 977;

static int irand(int n)
{
    seed = seed * 1103515245u + 12345u;
    return (int)((seed >> 8) % (unsigned)n);
}

typedef struct batch {
    int64_t B, S;
    int64_t *ids, *mask, *types;
    mts_tensor in[3];
} batch;

/* B texts of lengths len[b] (1..S) padded to S, ids below 1000 (the test vocabulary). */
static void make_batch(batch *x, int64_t B, int64_t S, const int *len)
{
    x->B = B, x->S = S;
    x->ids = calloc((size_t)(B * S), sizeof(int64_t));
    x->mask = calloc((size_t)(B * S), sizeof(int64_t));
    x->types = calloc((size_t)(B * S), sizeof(int64_t));
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) {
            x->ids[b * S + s] = s < len[b] ? 100 + irand(900) : 0;
            x->mask[b * S + s] = s < len[b];
            x->types[b * S + s] = s < len[b] ? irand(2) : 0;
        }
    int64_t *data[3] = {x->ids, x->mask, x->types};
    for (int i = 0; i < 3; i++) x->in[i] = (mts_tensor){.dtype = MTS_DTYPE_INT64, .rank = 2, .dims = {B, S}, .data = data[i]};
}

static void free_batch(batch *x)
{
    free(x->ids), free(x->mask), free(x->types);
}

static mts_model *load(const char *name)
{
    char rel[256], path[4096];
    snprintf(rel, sizeof rel, "tests/models/out/%s.onnx", name);
    mts_model *m = NULL;
    mts_err err = {0};
    if (mts_model_load(test_path(path, sizeof path, rel), NULL, &m, &err))
        fail_msg("%s: %s (make_test_models.py writes it)", path, err.msg);
    return m;
}

/* Runs x whole on a fresh context and returns a copy of output o. */
static float *run_whole(mts_model *m, batch *x, int threads, int o, int64_t *numel)
{
    mts_ctx *c;
    mts_err err = {0};
    assert_int_equal(mts_ctx_create(m, threads, &c, &err), 0);
    const mts_tensor *out[2];
    if (mts_ctx_run(c, x->in, 3, out, &err)) fail_msg("%s", err.msg);
    *numel = mts_tensor_numel(out[o]);
    float *copy = malloc(sizeof(float) * (size_t)*numel);
    memcpy(copy, out[o]->data, sizeof(float) * (size_t)*numel);
    assert_int_equal(mts_ctx_rows_skipped(c), 0);
    mts_ctx_free(c);
    return copy;
}

/* A context of `threads` threads with the padding mask on input 1, after one run of x. */
static mts_ctx *run_padded(mts_model *m, batch *x, int threads, const mts_tensor **out)
{
    mts_ctx *c;
    mts_err err = {0};
    assert_int_equal(mts_ctx_create(m, threads, &c, &err), 0);
    mts_ctx_set_padding_mask(c, 1);
    if (mts_ctx_run(c, x->in, 3, out, &err)) fail_msg("%s", err.msg);
    return c;
}

static void test_valid_rows_match(void **state)
{
    (void)state;
    mts_model *m = load("bert_mask_small");
    static const int64_t shapes[][2] = {{5, 19}, {8, 16}, {1, 7}, {3, 33}, {12, 10}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int64_t B = shapes[k][0], S = shapes[k][1], valid = 0;
        int len[16];
        for (int64_t b = 0; b < B; b++) len[b] = 1 + irand((int)S);
        len[0] = (int)S;             /* the longest text sets the padded length */
        if (B > 2) len[B - 1] = 1;   /* a text of one token */
        for (int64_t b = 0; b < B; b++) valid += len[b];
        batch x;
        make_batch(&x, B, S, len);
        for (int th = 1; th <= MAX_THREADS; th++) {
            int64_t n;
            float *ref = run_whole(m, &x, th, 0, &n);
            mts_ctx *c;
            mts_err err = {0};
            assert_int_equal(mts_ctx_create(m, th, &c, &err), 0);
            mts_ctx_set_padding_mask(c, 1);
            const mts_tensor *out[1];
            for (int rep = 0; rep < 2; rep++) { /* the second run reuses the context's buffers */
                if (mts_ctx_run(c, x.in, 3, out, &err)) fail_msg("%s", err.msg);
                assert_int_equal(mts_ctx_rows_skipped(c), (rep + 1) * (B * S - valid));
                const float *got = out[0]->data;
                int64_t H = out[0]->dims[2];
                double worst = 0, scale = 0;
                for (int64_t b = 0; b < B; b++)
                    for (int64_t s = 0; s < len[b]; s++)
                        for (int64_t h = 0; h < H; h++) {
                            int64_t i = (b * S + s) * H + h;
                            if (!isfinite(got[i])) fail_msg("[%lld,%lld] row %lld,%lld: not finite", (long long)B,
                                                            (long long)S, (long long)b, (long long)s);
                            double d = fabs((double)got[i] - ref[i]);
                            worst = d > worst ? d : worst;
                            scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
                        }
                if (!(worst <= 1e-5 * (scale > 1 ? scale : 1)))
                    fail_msg("[%lld,%lld] %d threads: valid rows differ from the whole run by %.3g (largest %.3g)",
                             (long long)B, (long long)S, th, worst, scale);
            }
            mts_ctx_free(c);
            free(ref);
        }
        free_batch(&x);
    }
    mts_model_free(m);
}

static void test_runs_whole_when_not_padding(void **state)
{
    (void)state;
    mts_model *m = load("bert_mask_small");
    int len[4] = {9, 4, 6, 2};
    batch x;
    make_batch(&x, 4, 9, len);
    mts_ctx *c;
    mts_err err = {0};
    assert_int_equal(mts_ctx_create(m, MAX_THREADS, &c, &err), 0);
    mts_ctx_set_padding_mask(c, 1);
    const mts_tensor *out[1];
    int64_t n;
    /* a hole in a row (a zero before a one): the mask is not right padding */
    x.mask[1 * 9 + 1] = 0;
    float *ref = run_whole(m, &x, MAX_THREADS, 0, &n);
    if (mts_ctx_run(c, x.in, 3, out, &err)) fail_msg("%s", err.msg);
    assert_int_equal(mts_ctx_rows_skipped(c), 0);
    assert_memory_equal(out[0]->data, ref, sizeof(float) * (size_t)n);
    free(ref);
    /* all ones: nothing to skip */
    for (int i = 0; i < 36; i++) x.mask[i] = 1;
    ref = run_whole(m, &x, MAX_THREADS, 0, &n);
    if (mts_ctx_run(c, x.in, 3, out, &err)) fail_msg("%s", err.msg);
    assert_int_equal(mts_ctx_rows_skipped(c), 0);
    assert_memory_equal(out[0]->data, ref, sizeof(float) * (size_t)n);
    free(ref);
    /* the mask input turned off again */
    x.mask[3 * 9 + 8] = 0;
    mts_ctx_set_padding_mask(c, -1);
    if (mts_ctx_run(c, x.in, 3, out, &err)) fail_msg("%s", err.msg);
    assert_int_equal(mts_ctx_rows_skipped(c), 0);
    mts_ctx_free(c);
    free_batch(&x);
    mts_model_free(m);
}

static void test_pooled_in_graph_runs_whole(void **state)
{
    (void)state;
    mts_model *m = load("bert_mask_pooled");
    int len[3] = {11, 3, 7};
    batch x;
    make_batch(&x, 3, 11, len);
    int64_t n;
    float *ref = run_whole(m, &x, MAX_THREADS, 1, &n);
    const mts_tensor *out[2];
    mts_ctx *c = run_padded(m, &x, MAX_THREADS, out);
    assert_int_equal(mts_ctx_rows_skipped(c), 0); /* the ReduceMean reads every token row */
    assert_int_equal(n, 3 * 64);
    assert_memory_equal(out[1]->data, ref, sizeof(float) * (size_t)n);
    free(ref);
    mts_ctx_free(c);
    free_batch(&x);
    mts_model_free(m);
}

static void test_first_token_pooler_stays_exact(void **state)
{
    (void)state;
    /* pooler_output = tanh(dense(first token)): the first position is valid in every text, so
     * the plan stays eligible and the pooled output is the whole run's */
    mts_model *m = load("bert_mask_pooler");
    int len[4] = {13, 2, 9, 5};
    batch x;
    make_batch(&x, 4, 13, len);
    int64_t n;
    float *ref = run_whole(m, &x, MAX_THREADS, 1, &n);
    const mts_tensor *out[2];
    mts_ctx *c = run_padded(m, &x, MAX_THREADS, out);
    assert_int_equal(mts_ctx_rows_skipped(c), 4 * 13 - (13 + 2 + 9 + 5));
    assert_int_equal(n, 4 * 64);
    const float *got = out[1]->data;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - ref[i]) <= 1e-5)) fail_msg("pooler_output[%lld]: %g, whole run %g", (long long)i, got[i], ref[i]);
    free(ref);
    mts_ctx_free(c);
    free_batch(&x);
    mts_model_free(m);
}

/* Several contexts of one model run padding-free batches of different lengths at once (the
 * server's workers): each thread's valid rows must equal its batch's whole run, computed
 * beforehand. Under TSan this checks what the contexts share (the plan, its step flags, the
 * packed weights) against what each owns (its row list). */
typedef struct pf_worker {
    mts_model *m;
    batch x;
    float *ref;
    int len[6];
    int bad;
} pf_worker;

static void *pf_worker_main(void *arg)
{
    pf_worker *w = arg;
    mts_ctx *c;
    mts_err err = {0};
    if (mts_ctx_create(w->m, 1, &c, &err)) {
        w->bad = 1;
        return NULL;
    }
    mts_ctx_set_padding_mask(c, 1);
    const mts_tensor *out[1];
    for (int rep = 0; rep < 20 && !w->bad; rep++) {
        if (mts_ctx_run(c, w->x.in, 3, out, &err)) {
            w->bad = 1;
            break;
        }
        const float *got = out[0]->data;
        int64_t S = w->x.S, H = out[0]->dims[2];
        for (int64_t b = 0; b < w->x.B; b++)
            for (int64_t i = b * S * H; i < (b * S + w->len[b]) * H; i++)
                if (!(fabs((double)got[i] - w->ref[i]) <= 1e-5 * (fabs(w->ref[i]) > 1 ? fabs(w->ref[i]) : 1)))
                    w->bad = 2;
    }
    if (mts_ctx_rows_skipped(c) == 0) w->bad = 3;
    mts_ctx_free(c);
    return NULL;
}

static void test_concurrent_contexts(void **state)
{
    (void)state;
    mts_model *m = load("bert_mask_small");
    pf_worker w[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        w[k] = (pf_worker){.m = m};
        int64_t B = 3 + k % 2, S = 9 + 4 * (k % 2); /* two threads per plan, different lengths */
        for (int64_t b = 0; b < B; b++) w[k].len[b] = 1 + irand((int)S);
        w[k].len[0] = (int)S;
        make_batch(&w[k].x, B, S, w[k].len);
        int64_t n;
        w[k].ref = run_whole(m, &w[k].x, 1, 0, &n);
    }
    for (int k = 0; k < 4; k++) assert_int_equal(pthread_create(&th[k], NULL, pf_worker_main, &w[k]), 0);
    for (int k = 0; k < 4; k++) pthread_join(th[k], NULL);
    for (int k = 0; k < 4; k++) {
        if (w[k].bad) fail_msg("thread %d: %s", k, w[k].bad == 1 ? "run failed" : w[k].bad == 2 ? "valid rows differ" : "nothing skipped");
        free(w[k].ref);
        free_batch(&w[k].x);
    }
    mts_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_rows_match),
        cmocka_unit_test(test_runs_whole_when_not_padding),
        cmocka_unit_test(test_pooled_in_graph_runs_whole),
        cmocka_unit_test(test_first_token_pooler_stays_exact),
        cmocka_unit_test(test_concurrent_contexts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
