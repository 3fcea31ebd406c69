/*
 * Reference kernel for TfIdfVectorizer (opset 9) over integer token ids.
 *
 * The input is a row [C] or a batch [N, C] of int32/int64 tokens. The pool_int64s attribute
 * lists n-grams level by level: ngram_counts[i] is where the (i+1)-grams start in the pool, and
 * the j-th n-gram of the pool (all levels in order) is counted into output column
 * ngram_indexes[j]. For every start position and every skip distance 1 .. max_skip_count + 1,
 * the n-grams of lengths min_gram_length .. max_gram_length whose tokens are that distance apart
 * are looked up in the pool; unigrams are counted once (at distance 1) rather than once per
 * distance. The output [max(ngram_indexes) + 1] (or [N, ...]) holds the counts (mode TF), the
 * weight of each column seen at least once (IDF; 1 without weights) or counts times weights
 * (TFIDF); weights[j] belongs to the j-th n-gram of the pool (and so to its output column). Each level of the pool is sorted once per run
 * so that a lookup is a binary search. String tokens (pool_strings) are not supported.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"
#include "engine/tensor.h"

enum { TF_TF = 0, TF_IDF, TF_TFIDF };

/* Largest number of output columns. */
#define TFIDF_MAX_COLS ((int64_t)1 << 28)
/* Longest n-gram. */
#define TFIDF_MAX_LEVELS 64

typedef struct tfidf_cfg {
    int mode;
    int64_t min_n, max_n, max_skip;
    int levels;                 /* pool levels that exist (and are within max_gram_length) */
    const int64_t *counts;      /* ngram_counts */
    int n_counts;
    const int64_t *pool;
    int n_pool;
    const int64_t *idx;         /* ngram_indexes */
    int n_idx;
    const float *w;             /* weights, or NULL */
    int n_w;
    int64_t cols;
} tfidf_cfg;

static int tfidf_prepare(mts_kctx *k, tfidf_cfg *c)
{
    const mts_node *nd = k->node;
    memset(c, 0, sizeof *c);
    if (k->n_in != 1 || !k->in[0]) return mts_err_set(k->err, MTS_EINVAL, "expected 1 input, got %d", k->n_in);
    if (k->n_out < 1) return mts_err_set(k->err, MTS_EINVAL, "expected 1 output");
    const mts_tensor *x = k->in[0];
    if (x->dtype != MTS_DTYPE_INT32 && x->dtype != MTS_DTYPE_INT64)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "input has dtype %s; only int32 and int64 tokens are supported",
                           mts_dtype_name(x->dtype));
    if (x->rank != 1 && x->rank != 2)
        return mts_err_set(k->err, MTS_ESHAPE, "input must have rank 1 or 2, got %d", x->rank);
    if (mts_tensor_numel(x) < 0) return mts_err_set(k->err, MTS_ESHAPE, "input shape is malformed");
    int ns = 0;
    if (mts_attr_strings(nd, "pool_strings", &ns) && ns > 0)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "pool_strings (string tokens) are not supported");

    const char *mode = mts_attr_string(nd, "mode", NULL);
    if (!mode) return mts_err_set(k->err, MTS_EINVAL, "required attribute mode is missing");
    if (!strcmp(mode, "TF")) c->mode = TF_TF;
    else if (!strcmp(mode, "IDF")) c->mode = TF_IDF;
    else if (!strcmp(mode, "TFIDF")) c->mode = TF_TFIDF;
    else return mts_err_set(k->err, MTS_EINVAL, "mode '%s' is not one of TF, IDF, TFIDF", mode);
    c->min_n = mts_attr_int(nd, "min_gram_length", -1);
    c->max_n = mts_attr_int(nd, "max_gram_length", -1);
    c->max_skip = mts_attr_int(nd, "max_skip_count", -1);
    if (c->min_n < 1 || c->max_n < c->min_n)
        return mts_err_set(k->err, MTS_EINVAL, "min_gram_length (%lld) and max_gram_length (%lld) must satisfy 1 <= min <= max",
                           (long long)c->min_n, (long long)c->max_n);
    if (c->max_skip < 0)
        return mts_err_set(k->err, MTS_EINVAL, "max_skip_count must be >= 0, got %lld", (long long)c->max_skip);

    c->counts = mts_attr_ints(nd, "ngram_counts", &c->n_counts);
    c->idx = mts_attr_ints(nd, "ngram_indexes", &c->n_idx);
    c->pool = mts_attr_ints(nd, "pool_int64s", &c->n_pool);
    if (!c->counts || c->n_counts < 1) return mts_err_set(k->err, MTS_EINVAL, "attribute ngram_counts is missing or empty");
    if (!c->idx) return mts_err_set(k->err, MTS_EINVAL, "attribute ngram_indexes is missing");
    if (!c->pool) {
        c->n_pool = 0;
        static const int64_t none = 0;
        c->pool = &none;
    }
    /* Levels: n-grams of length i+1 occupy [counts[i], counts[i+1]) (the last up to the pool's end). */
    int64_t total = 0;
    for (int i = 0; i < c->n_counts; i++) {
        int64_t lo = c->counts[i], hi = i + 1 < c->n_counts ? c->counts[i + 1] : c->n_pool;
        if (lo < 0 || hi < lo || hi > c->n_pool)
            return mts_err_set(k->err, MTS_EINVAL, "ngram_counts[%d] = %lld does not give a range within the pool of %d",
                               i, (long long)lo, c->n_pool);
        if ((hi - lo) % (i + 1) != 0)
            return mts_err_set(k->err, MTS_EINVAL, "the %d-gram level of the pool has %lld tokens, not a multiple of %d",
                               i + 1, (long long)(hi - lo), i + 1);
        total += (hi - lo) / (i + 1);
    }
    if (total != c->n_idx)
        return mts_err_set(k->err, MTS_EINVAL, "ngram_indexes has %d entries but the pool holds %lld n-grams", c->n_idx,
                           (long long)total);
    int64_t mx = -1;
    for (int j = 0; j < c->n_idx; j++) {
        if (c->idx[j] < 0 || c->idx[j] >= TFIDF_MAX_COLS)
            return mts_err_set(k->err, MTS_EINVAL, "ngram_indexes[%d] = %lld is outside [0, %lld)", j,
                               (long long)c->idx[j], (long long)TFIDF_MAX_COLS);
        if (c->idx[j] > mx) mx = c->idx[j];
    }
    c->cols = mx + 1;
    c->w = mts_attr_floats(nd, "weights", &c->n_w);
    if (c->w && c->n_w == 0) c->w = NULL;
    if (c->w && c->n_w != c->n_idx)
        return mts_err_set(k->err, MTS_EINVAL, "weights has %d entries; expected one per n-gram (%d)", c->n_w,
                           c->n_idx);
    c->levels = c->n_counts < c->max_n ? c->n_counts : (int)c->max_n;
    if (c->levels > TFIDF_MAX_LEVELS)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "n-grams longer than %d tokens are not supported", TFIDF_MAX_LEVELS);
    return MTS_OK;
}

static int tfidf_infer(mts_kctx *k)
{
    tfidf_cfg c;
    int rc = tfidf_prepare(k, &c);
    if (rc) return rc;
    const mts_tensor *x = k->in[0];
    mts_tensor *o = &k->out[0];
    o->dtype = MTS_DTYPE_FLOAT;
    o->rank = x->rank;
    if (x->rank == 2) o->dims[0] = x->dims[0];
    o->dims[x->rank - 1] = c.cols;
    if (mts_tensor_numel(o) < 0) return mts_err_set(k->err, MTS_ESHAPE, "output would have too many elements");
    return MTS_OK;
}

/* One n-gram of the pool: its tokens, length and output column. */
typedef struct tf_gram {
    const int64_t *tok;
    int64_t n;
    int64_t col;
} tf_gram;

static int gram_cmp(const void *pa, const void *pb)
{
    const tf_gram *a = pa, *b = pb;
    for (int64_t i = 0; i < a->n; i++)
        if (a->tok[i] != b->tok[i]) return a->tok[i] < b->tok[i] ? -1 : 1;
    return 0;
}

static inline int64_t tok_at(const mts_tensor *x, int64_t i)
{
    return x->dtype == MTS_DTYPE_INT64 ? ((const int64_t *)x->data)[i] : (int64_t)((const int32_t *)x->data)[i];
}

/* Column of the n-gram x[s], x[s+d], ..., (n tokens) in the sorted level g[0..cnt), or -1. */
static int64_t gram_find(const tf_gram *g, int64_t cnt, const mts_tensor *x, int64_t s, int64_t d, int64_t n)
{
    int64_t lo = 0, hi = cnt;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int r = 0;
        for (int64_t i = 0; i < n && !r; i++) {
            int64_t t = tok_at(x, s + i * d), p = g[mid].tok[i];
            r = t < p ? -1 : t > p ? 1 : 0;
        }
        if (!r) return g[mid].col;
        if (r < 0) hi = mid;
        else lo = mid + 1;
    }
    return -1;
}

typedef struct tf_job {
    const tfidf_cfg *c;
    const mts_tensor *x;
    float *y;
    const tf_gram *g;
    const int64_t *lstart;
    int64_t rows, len;
} tf_job;

/* Counts the n-grams of rows [lo, hi) into y. */
static void tf_part(void *ctx, int ithr, int nthr)
{
    const tf_job *jb = ctx;
    const tfidf_cfg *c = jb->c;
    const int64_t len = jb->len, levels = c->levels;
    int64_t q = jb->rows / nthr, rm = jb->rows % nthr;
    int64_t lo = ithr * q + (ithr < rm ? ithr : rm), hi = lo + q + (ithr < rm ? 1 : 0);
    /* Skip distances past the row length find nothing. */
    int64_t max_d = c->max_skip < len ? c->max_skip + 1 : len;
    for (int64_t r = lo; r < hi; r++) {
        float *yr = jb->y + r * c->cols;
        int64_t base = r * len, start_n = c->min_n;
        for (int64_t d = 1; d <= max_d && start_n <= levels; d++) {
            for (int64_t s = 0; s < len; s++) {
                for (int64_t n = start_n; n <= levels; n++) {
                    if (s + (n - 1) * d >= len) break;
                    int64_t cnt = jb->lstart[n] - jb->lstart[n - 1];
                    if (cnt == 0) continue;
                    int64_t col = gram_find(jb->g + jb->lstart[n - 1], cnt, jb->x, base + s, d, n);
                    if (col >= 0) yr[col] += 1.0f;
                }
            }
            if (start_n == 1) start_n = 2; /* unigrams are counted on the first pass only */
        }
    }
}

static int tfidf_run(mts_kctx *k)
{
    tfidf_cfg c;
    int rc = tfidf_prepare(k, &c);
    if (rc) return rc;
    const mts_tensor *x = k->in[0];
    float *y = k->out[0].data;
    int64_t rows = x->rank == 2 ? x->dims[0] : 1, len = x->dims[x->rank - 1];
    int64_t ny = rows * c.cols;
    for (int64_t i = 0; i < ny; i++) y[i] = 0.0f;
    if (rows == 0 || c.cols == 0) return MTS_OK;

    tf_gram *g = malloc(sizeof(tf_gram) * (size_t)(c.n_idx > 0 ? c.n_idx : 1));
    if (!g) return mts_err_set(k->err, MTS_ENOMEM, "out of memory for the n-gram pool");
    int64_t lstart[TFIDF_MAX_LEVELS + 1] = {0}; /* level i's grams are g[lstart[i] .. lstart[i+1]) */
    int levels = c.levels;
    int64_t j = 0;
    for (int i = 0; i < c.n_counts; i++) {
        int64_t lo = c.counts[i], hi = i + 1 < c.n_counts ? c.counts[i + 1] : c.n_pool;
        if (i <= levels) lstart[i] = j;
        for (int64_t p = lo; p < hi; p += i + 1, j++) g[j] = (tf_gram){c.pool + p, i + 1, c.idx[j]};
    }
    if (levels == c.n_counts) lstart[levels] = j;
    for (int i = 0; i < levels; i++)
        qsort(g + lstart[i], (size_t)(lstart[i + 1] - lstart[i]), sizeof(tf_gram), gram_cmp);

    tf_job jb = {&c, x, y, g, lstart, rows, len};
    if (c.min_n <= levels && len > 0) {
        double work = (double)rows * (double)len * (double)(c.max_skip < len ? c.max_skip + 1 : len) * levels;
        double t = work / 16384;
        int nthr = t < 1 ? 1 : t < k->threads ? (int)t : k->threads;
        if (nthr > rows) nthr = (int)rows;
        mts_parallel(nthr, tf_part, &jb);
    }
    if (c.mode != TF_TF) {
        /* The weight of each column: that of the (last) n-gram counted into it. */
        float *cw = malloc(sizeof(float) * (size_t)c.cols);
        if (!cw) {
            free(g);
            return mts_err_set(k->err, MTS_ENOMEM, "out of memory for the column weights");
        }
        for (int64_t col = 0; col < c.cols; col++) cw[col] = 1.0f;
        if (c.w)
            for (int i = 0; i < c.n_idx; i++) cw[c.idx[i]] = c.w[i];
        for (int64_t i = 0; i < ny; i++) {
            float f = y[i], w = cw[i % c.cols];
            y[i] = c.mode == TF_IDF ? (f > 0 ? w : 0.0f) : f * w;
        }
        free(cw);
    }
    free(g);
    return MTS_OK;
}

const mts_op mts_ref_ops_text[] = {
    {"TfIdfVectorizer", tfidf_infer, tfidf_run},
    {NULL, NULL, NULL},
};
