/*
 * Reference kernels for the random generators: RandomUniform and RandomNormal (shape from the
 * `shape` attribute), RandomUniformLike and RandomNormalLike (shape of the input), Bernoulli
 * (one draw per input probability) and Multinomial (samples from each row of unnormalized
 * log-probabilities).
 *
 * The generator is counter based: element i of a draw is a SplitMix64 hash of (key, i), so the
 * values do not depend on the thread count or on the order the elements are computed in. With
 * the `seed` attribute the key is derived from the seed alone and every run of the node yields
 * the same values; without it, each run takes a fresh key from a process-wide counter mixed with
 * the clock. Normal deviates use the Box-Muller transform of two uniform draws. The engine holds
 * float and double outputs for the continuous generators (float16 and bfloat16 are declined as
 * unsupported); Bernoulli takes float or double probabilities.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/kernels/kernel.h"
#include "engine/kernels/ref_math2.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* Largest Multinomial sample_size. */
#define RND_MAX_SAMPLES ((int64_t)1 << 24)

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The i-th 64-bit value of the stream `key`. */
static inline uint64_t rnd_u64(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * 0x9e3779b97f4a7c15ULL); }

/* Uniform in [0, 1) with 53 random bits. */
static inline double rnd_unit(uint64_t key, uint64_t i) { return (double)(rnd_u64(key, i) >> 11) * 0x1.0p-53; }

/* Standard normal deviate number i (uses stream values 2i and 2i+1). */
static inline double rnd_normal(uint64_t key, uint64_t i)
{
    double u1 = 1.0 - rnd_unit(key, 2 * i), u2 = rnd_unit(key, 2 * i + 1); /* u1 in (0, 1] */
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static _Atomic uint64_t rnd_counter;

/* The key of one run of node k: from the seed attribute, or fresh. */
static uint64_t rnd_key(const mts_kctx *k)
{
    const mts_attr *s = mts_node_attr(k->node, "seed");
    if (s) {
        float f = s->type == MTS_ATTR_FLOAT ? s->f : (float)s->i;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        return mix64(0x5eed000000000000ULL ^ bits);
    }
    uint64_t c = atomic_fetch_add(&rnd_counter, 1);
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return mix64(c * 0x9e3779b97f4a7c15ULL ^ mix64((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec));
}

/* ------------------------------------------------------------------------------------------ */
/* RandomUniform / RandomNormal and their *Like forms                                         */
/* ------------------------------------------------------------------------------------------ */

static bool is_like(const mts_kctx *k) { return strstr(k->node->op_type, "Like") != NULL; }
static bool is_normal(const mts_kctx *k) { return strstr(k->node->op_type, "Normal") != NULL; }

/* Checks the output element type: float and double are computed; float16 and bfloat16 are
 * declined. */
static int float_out_type(mts_kctx *k, int64_t t, mts_dtype *dt)
{
    if (t == MTS_DTYPE_FLOAT || t == MTS_DTYPE_DOUBLE) {
        *dt = (mts_dtype)t;
        return MTS_OK;
    }
    if (t == MTS_DTYPE_FLOAT16 || t == MTS_DTYPE_BFLOAT16)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "output type %s is not supported (float and double only)",
                           mts_dtype_name((mts_dtype)t));
    return mts_err_set(k->err, MTS_EINVAL, "dtype %lld is not a floating-point type", (long long)t);
}

static int rnd_infer(mts_kctx *k)
{
    mts_dtype dt;
    int64_t dims[MTS_MAX_RANK];
    int rank, rc;
    if (is_like(k)) {
        const mts_tensor *x = mts_kin(k, 0);
        if ((rc = check_arity(k, 1, 1))) return rc;
        if (!x) return mts_err_set(k->err, MTS_EINVAL, "input 0 is required but missing");
        if (!mts_dtype_supported(x->dtype))
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "input 0 has dtype %s, which is not supported",
                               mts_dtype_name(x->dtype));
        if ((rc = float_out_type(k, mts_attr_int(k->node, "dtype", x->dtype), &dt))) return rc;
        rank = x->rank;
        memcpy(dims, x->dims, sizeof dims);
    } else {
        if (k->n_in != 0) return mts_err_set(k->err, MTS_EINVAL, "expected no inputs, got %d", k->n_in);
        if (k->n_out < 1) return mts_err_set(k->err, MTS_EINVAL, "expected 1 output");
        if ((rc = float_out_type(k, mts_attr_int(k->node, "dtype", MTS_DTYPE_FLOAT), &dt))) return rc;
        const int64_t *s = mts_attr_ints(k->node, "shape", &rank);
        if (!s) return mts_err_set(k->err, MTS_EINVAL, "required attribute shape is missing");
        if (rank > MTS_MAX_RANK)
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "shape of rank %d is above the supported %d", rank, MTS_MAX_RANK);
        for (int i = 0; i < rank; i++) {
            if (s[i] < 0) return mts_err_set(k->err, MTS_EINVAL, "shape[%d] is negative (%lld)", i, (long long)s[i]);
            dims[i] = s[i];
        }
        mts_tensor t = {dt, rank, {0}, NULL};
        memcpy(t.dims, dims, sizeof dims);
        if (mts_tensor_numel(&t) < 0) return mts_err_set(k->err, MTS_EINVAL, "shape has too many elements");
    }
    set_out(k, 0, dt, rank, dims);
    return MTS_OK;
}

typedef struct rnd_ctx {
    void *y;
    mts_dtype dt;
    int64_t n;
    uint64_t key;
    double a, b; /* uniform: low, high; normal: mean, scale */
    bool normal;
} rnd_ctx;

static void rnd_part(void *ctx, int ithr, int nthr)
{
    const rnd_ctx *c = ctx;
    int64_t lo, hi;
    part_range(c->n, ithr, nthr, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        double v = c->normal ? c->a + c->b * rnd_normal(c->key, (uint64_t)i)
                             : c->a + (c->b - c->a) * rnd_unit(c->key, (uint64_t)i);
        if (c->dt == MTS_DTYPE_DOUBLE) ((double *)c->y)[i] = v;
        else ((float *)c->y)[i] = (float)v;
    }
}

static int rnd_run(mts_kctx *k)
{
    const mts_node *nd = k->node;
    rnd_ctx c = {k->out[0].data, k->out[0].dtype, numel(&k->out[0]), rnd_key(k), 0, 0, is_normal(k)};
    if (c.normal) {
        c.a = mts_attr_float(nd, "mean", 0.0f);
        c.b = mts_attr_float(nd, "scale", 1.0f);
    } else {
        c.a = mts_attr_float(nd, "low", 0.0f);
        c.b = mts_attr_float(nd, "high", 1.0f);
    }
    mts_parallel(par_threads(k, c.n * 4), rnd_part, &c);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Bernoulli                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static int bern_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = check_in(k, 0, M_F32 | M_F64, &x);
    if (rc) return rc;
    int64_t t = mts_attr_int(k->node, "dtype", x->dtype);
    if (t <= 0 || t > 16) return mts_err_set(k->err, MTS_EINVAL, "dtype %lld is not an element type", (long long)t);
    if (!numeric_out_ok((mts_dtype)t))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "output type %s is not supported", mts_dtype_name((mts_dtype)t));
    set_out(k, 0, (mts_dtype)t, x->rank, x->dims);
    return MTS_OK;
}

static int bern_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    mts_tensor *o = &k->out[0];
    uint64_t key = rnd_key(k);
    int64_t n = numel(x);
    for (int64_t i = 0; i < n; i++)
        st_i(o->data, o->dtype, i, rnd_unit(key, (uint64_t)i) < ld_f(x->data, x->dtype, i) ? 1 : 0);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Multinomial                                                                                */
/* ------------------------------------------------------------------------------------------ */

static int multi_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = check_in(k, 0, M_F32, &x);
    if (rc) return rc;
    if (x->rank != 2) return mts_err_set(k->err, MTS_ESHAPE, "input must be [batch_size, class_size], got rank %d", x->rank);
    int64_t t = mts_attr_int(k->node, "dtype", MTS_DTYPE_INT32);
    if (t != MTS_DTYPE_INT32 && t != MTS_DTYPE_INT64)
        return mts_err_set(k->err, MTS_EINVAL, "dtype must be int32 (6) or int64 (7), got %lld", (long long)t);
    int64_t s = mts_attr_int(k->node, "sample_size", 1);
    if (s < 1 || s > RND_MAX_SAMPLES)
        return mts_err_set(k->err, MTS_EINVAL, "sample_size %lld is out of range [1, %lld]", (long long)s,
                           (long long)RND_MAX_SAMPLES);
    int64_t d[2] = {x->dims[0], s};
    set_out(k, 0, (mts_dtype)t, 2, d);
    return MTS_OK;
}

static int multi_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    mts_tensor *o = &k->out[0];
    int64_t B = x->dims[0], C = x->dims[1], S = o->dims[1];
    if (B == 0) return MTS_OK;
    if (C == 0) return mts_err_set(k->err, MTS_ESHAPE, "class_size is 0: nothing to sample from");
    double *cdf = malloc((size_t)C * sizeof(double));
    if (!cdf) return mts_err_set(k->err, MTS_ENOMEM, "out of memory for the class distribution");
    uint64_t key = rnd_key(k);
    const float *xs = x->data;
    for (int64_t b = 0; b < B; b++) {
        const float *row = xs + b * C;
        double mx = -INFINITY, sum = 0;
        for (int64_t c = 0; c < C; c++)
            if (row[c] > mx) mx = row[c];
        for (int64_t c = 0; c < C; c++) {
            double e = isfinite(mx) ? exp((double)row[c] - mx) : 1.0;
            if (e != e) e = 0; /* NaN logits count as impossible */
            sum += e;
            cdf[c] = sum;
        }
        for (int64_t s = 0; s < S; s++) {
            double u = rnd_unit(key, (uint64_t)(b * S + s)) * sum;
            int64_t lo = 0, hi = C - 1; /* first class with cdf > u */
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                if (cdf[mid] > u) hi = mid;
                else lo = mid + 1;
            }
            st_i(o->data, o->dtype, b * S + s, lo);
        }
    }
    free(cdf);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The op table                                                                               */
/* ------------------------------------------------------------------------------------------ */

const mts_op mts_ref_ops_random[] = {
    {"RandomUniform", rnd_infer, rnd_run},
    {"RandomNormal", rnd_infer, rnd_run},
    {"RandomUniformLike", rnd_infer, rnd_run},
    {"RandomNormalLike", rnd_infer, rnd_run},
    {"Bernoulli", bern_infer, bern_run},
    {"Multinomial", multi_infer, multi_run},
    {NULL, NULL, NULL},
};
