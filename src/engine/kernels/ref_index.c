/*
 * Reference kernels for the indexing and data-movement operators: TopK, NonMaxSuppression,
 * RoiAlign, ScatterND, ScatterElements (and the deprecated Scatter), GatherND, CumSum, Einsum,
 * OneHot, NonZero, DepthToSpace, SpaceToDepth, Trilu, Compress, Unique, ReverseSequence,
 * EyeLike, GridSample, MaxUnpool and Hardmax.
 *
 * Copies are written by element size so that they serve every element type the engine holds;
 * arithmetic (scatter reductions, CumSum, Einsum, interpolation) switches on the element type
 * outside the inner loops. Ops whose output shape depends on input values (NonZero, Unique,
 * Compress, TopK's K, OneHot's depth, NonMaxSuppression, MaxUnpool's output_shape) answer
 * MTS_EDYNAMIC from infer until the data is known, and check every value read from an input
 * against the shapes before using it as an index or a size. Einsum runs plain two-operand
 * float contractions through the engine's GEMM after permuting the operands into
 * batch x M x K and batch x K x N; every other equation runs a direct loop over the labels.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/gemm.h"
#include "engine/kernels/kernel.h"

/* ------------------------------------------------------------------------------------------ */
/* Shared helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

static int req_in(mts_kctx *k, int i, const char *what, const mts_tensor **t)
{
    *t = mts_kin(k, i);
    if (!*t) return mts_err_set(k->err, MTS_EINVAL, "required input %d (%s) is missing", i, what);
    return MTS_OK;
}

static int chk_dtype(mts_kctx *k, const mts_tensor *t, const char *what)
{
    if (!mts_dtype_supported(t->dtype) || mts_dtype_size(t->dtype) == 0)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s has dtype %s, which the engine does not support", what,
                           mts_dtype_name(t->dtype));
    return MTS_OK;
}

static int64_t prod(const int64_t *d, int from, int to)
{
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= d[i];
    return p;
}

static int chk_index_dtype(mts_kctx *k, const mts_tensor *t, const char *what)
{
    if (t->dtype != MTS_DTYPE_INT64 && t->dtype != MTS_DTYPE_INT32)
        return mts_err_set(k->err, MTS_EINVAL, "%s must be int64 or int32, got %s", what, mts_dtype_name(t->dtype));
    return MTS_OK;
}

static int64_t idx_at(const mts_tensor *t, int64_t i)
{
    return t->dtype == MTS_DTYPE_INT64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
}

/* Reads index i of an int32/int64 tensor, normalizes a negative one against dim, checks range. */
static int get_index(mts_kctx *k, const mts_tensor *ind, int64_t i, int64_t dim, int64_t *out)
{
    int64_t v = idx_at(ind, i);
    int64_t w = v < 0 ? v + dim : v;
    if (w < 0 || w >= dim)
        return mts_err_set(k->err, MTS_EINVAL, "index %lld (at position %lld) is out of range for a dimension of %lld",
                           (long long)v, (long long)i, (long long)dim);
    *out = w;
    return MTS_OK;
}

/* Reads a one-element integer tensor (0-D or [1]); MTS_EDYNAMIC while its data is unknown. */
static int read_scalar_int(mts_kctx *k, const mts_tensor *t, const char *what, int64_t *v)
{
    if (t->dtype != MTS_DTYPE_INT64 && t->dtype != MTS_DTYPE_INT32)
        return mts_err_set(k->err, MTS_EINVAL, "%s must be int64 or int32, got %s", what, mts_dtype_name(t->dtype));
    if (t->rank > 1 || mts_tensor_numel(t) != 1)
        return mts_err_set(k->err, MTS_EINVAL, "%s must hold exactly one value", what);
    if (!t->data) return MTS_EDYNAMIC;
    *v = idx_at(t, 0);
    return MTS_OK;
}

/* half / bfloat16 to float, for comparisons and reads of types only stored by the engine. */
static float half_to_float(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        if (m == 0) {
            bits = s;
        } else { /* subnormal */
            e = 127 - 15 + 1;
            while (!(m & 0x400)) {
                m <<= 1;
                e--;
            }
            m &= 0x3ff;
            bits = s | (e << 23) | (m << 13);
        }
    } else if (e == 31) {
        bits = s | 0x7f800000u | (m << 13);
    } else {
        bits = s | ((e + 127 - 15) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Element p (of type dt) as double; 0 for types without a numeric reading. */
static double elem_f64(const void *p, mts_dtype dt)
{
    switch (dt) {
    case MTS_DTYPE_FLOAT: return *(const float *)p;
    case MTS_DTYPE_DOUBLE: return *(const double *)p;
    case MTS_DTYPE_INT8: return *(const int8_t *)p;
    case MTS_DTYPE_UINT8: case MTS_DTYPE_BOOL: return *(const uint8_t *)p;
    case MTS_DTYPE_INT16: return *(const int16_t *)p;
    case MTS_DTYPE_UINT16: return *(const uint16_t *)p;
    case MTS_DTYPE_INT32: return *(const int32_t *)p;
    case MTS_DTYPE_UINT32: return *(const uint32_t *)p;
    case MTS_DTYPE_INT64: return (double)*(const int64_t *)p;
    case MTS_DTYPE_UINT64: return (double)*(const uint64_t *)p;
    case MTS_DTYPE_FLOAT16: return half_to_float(*(const uint16_t *)p);
    case MTS_DTYPE_BFLOAT16: {
        uint32_t b = (uint32_t)*(const uint16_t *)p << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    default: return 0;
    }
}

/* Whether dt has a numeric value (elem_f64 and cmp_elem understand it). */
static bool dtype_numeric(mts_dtype dt)
{
    switch (dt) {
    case MTS_DTYPE_FLOAT: case MTS_DTYPE_DOUBLE: case MTS_DTYPE_INT8: case MTS_DTYPE_UINT8: case MTS_DTYPE_BOOL:
    case MTS_DTYPE_INT16: case MTS_DTYPE_UINT16: case MTS_DTYPE_INT32: case MTS_DTYPE_UINT32:
    case MTS_DTYPE_INT64: case MTS_DTYPE_UINT64: case MTS_DTYPE_FLOAT16: case MTS_DTYPE_BFLOAT16:
        return true;
    default:
        return false;
    }
}

/* Total order on elements of type dt: -1, 0, 1; NaN sorts above every number and equals NaN. */
static int cmp_elem(const void *a, const void *b, mts_dtype dt)
{
    if (dt == MTS_DTYPE_INT64) {
        int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
        return x < y ? -1 : x > y;
    }
    if (dt == MTS_DTYPE_UINT64) {
        uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
        return x < y ? -1 : x > y;
    }
    double x = elem_f64(a, dt), y = elem_f64(b, dt);
    bool nx = isnan(x), ny = isnan(y);
    if (nx || ny) return nx == ny ? 0 : (nx ? 1 : -1);
    return x < y ? -1 : x > y;
}

/* Stable merge sort of idx[0..n) with cmp(ctx, a, b); tmp holds n entries. */
typedef int (*idx_cmp)(const void *ctx, int64_t a, int64_t b);
static void msort_idx(int64_t *idx, int64_t *tmp, int64_t n, idx_cmp cmp, const void *ctx)
{
    if (n < 2) return;
    if (n <= 16) { /* insertion sort */
        for (int64_t i = 1; i < n; i++) {
            int64_t v = idx[i], j = i;
            while (j > 0 && cmp(ctx, idx[j - 1], v) > 0) {
                idx[j] = idx[j - 1];
                j--;
            }
            idx[j] = v;
        }
        return;
    }
    int64_t h = n / 2;
    msort_idx(idx, tmp, h, cmp, ctx);
    msort_idx(idx + h, tmp, n - h, cmp, ctx);
    int64_t i = 0, j = h, o = 0;
    while (i < h && j < n) tmp[o++] = cmp(ctx, idx[j], idx[i]) < 0 ? idx[j++] : idx[i++];
    while (i < h) tmp[o++] = idx[i++];
    while (j < n) tmp[o++] = idx[j++];
    memcpy(idx, tmp, sizeof(int64_t) * (size_t)n);
}

/* Copies the array of shape dims (row-major into contiguous dst) whose element at index idx is
 * src[sum(idx[d] * sstr[d])] (strides in elements). rank <= GS_MAX. */
#define GS_MAX 64
static void gather_strided(void *dstv, const void *srcv, int rank, const int64_t *dims, const int64_t *sstr,
                           size_t es)
{
    for (int i = 0; i < rank; i++)
        if (dims[i] == 0) return;
    uint8_t *dst = dstv;
    const uint8_t *src = srcv;
    if (rank == 0) {
        memcpy(dst, src, es);
        return;
    }
    int64_t idx[GS_MAX] = {0};
    int64_t inner = dims[rank - 1], is = sstr[rank - 1] * (int64_t)es, off = 0;
    for (;;) {
        const uint8_t *sp = src + off * (int64_t)es;
        if (is == (int64_t)es) {
            memcpy(dst, sp, (size_t)(inner * (int64_t)es));
        } else if (es == 4) {
            for (int64_t i = 0; i < inner; i++) memcpy(dst + i * 4, sp + i * is, 4);
        } else if (es == 8) {
            for (int64_t i = 0; i < inner; i++) memcpy(dst + i * 8, sp + i * is, 8);
        } else {
            for (int64_t i = 0; i < inner; i++) memcpy(dst + i * (int64_t)es, sp + i * is, es);
        }
        dst += inner * (int64_t)es;
        int j = rank - 2;
        for (; j >= 0; j--) {
            off += sstr[j];
            if (++idx[j] < dims[j]) break;
            off -= sstr[j] * dims[j];
            idx[j] = 0;
        }
        if (j < 0) break;
    }
}

/* Writes the value 1 of type dt at p; false for types without one. */
static bool put_one(void *p, mts_dtype dt)
{
    switch (dt) {
    case MTS_DTYPE_FLOAT: *(float *)p = 1.0f; return true;
    case MTS_DTYPE_DOUBLE: *(double *)p = 1.0; return true;
    case MTS_DTYPE_INT8: case MTS_DTYPE_UINT8: case MTS_DTYPE_BOOL: *(uint8_t *)p = 1; return true;
    case MTS_DTYPE_INT16: case MTS_DTYPE_UINT16: *(uint16_t *)p = 1; return true;
    case MTS_DTYPE_INT32: case MTS_DTYPE_UINT32: *(uint32_t *)p = 1; return true;
    case MTS_DTYPE_INT64: case MTS_DTYPE_UINT64: *(uint64_t *)p = 1; return true;
    case MTS_DTYPE_FLOAT16: *(uint16_t *)p = 0x3c00; return true;
    case MTS_DTYPE_BFLOAT16: *(uint16_t *)p = 0x3f80; return true;
    default: return false;
    }
}

/* Whether element p of type dt is nonzero (-0.0 counts as zero). */
static bool elem_nonzero(const uint8_t *p, mts_dtype dt, size_t es)
{
    switch (dt) {
    case MTS_DTYPE_FLOAT: return *(const float *)p != 0.0f;
    case MTS_DTYPE_DOUBLE: return *(const double *)p != 0.0;
    case MTS_DTYPE_FLOAT16: case MTS_DTYPE_BFLOAT16: return (*(const uint16_t *)p & 0x7fff) != 0;
    default:
        for (size_t i = 0; i < es; i++)
            if (p[i]) return true;
        return false;
    }
}

/* Float to an integer index without undefined conversions: NaN and values beyond +-2^62 map to
 * the given sentinel. */
static int64_t f2idx(double v, int64_t bad)
{
    if (!(v > -4.6e18 && v < 4.6e18)) return bad;
    return (int64_t)v;
}

/* ------------------------------------------------------------------------------------------ */
/* Scatter reductions                                                                          */
/* ------------------------------------------------------------------------------------------ */

enum { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN };

/* The "reduction" attribute of ScatterND / ScatterElements (add, mul from opset 16; max, min
 * from opset 18). */
static int parse_reduction(mts_kctx *k, const mts_tensor *data, int *red)
{
    const char *r = mts_attr_string(k->node, "reduction", "none");
    int op = k->node->opset;
    if (strcmp(r, "none") == 0) {
        *red = RED_NONE;
        return MTS_OK;
    }
    if (strcmp(r, "add") == 0 && op >= 16) *red = RED_ADD;
    else if (strcmp(r, "mul") == 0 && op >= 16) *red = RED_MUL;
    else if (strcmp(r, "max") == 0 && op >= 18) *red = RED_MAX;
    else if (strcmp(r, "min") == 0 && op >= 18) *red = RED_MIN;
    else
        return mts_err_set(k->err, MTS_EINVAL, "reduction '%s' is not valid at opset %d", r, op);
    switch (data->dtype) {
    case MTS_DTYPE_FLOAT: case MTS_DTYPE_DOUBLE: case MTS_DTYPE_INT8: case MTS_DTYPE_UINT8: case MTS_DTYPE_BOOL:
    case MTS_DTYPE_INT16: case MTS_DTYPE_UINT16: case MTS_DTYPE_INT32: case MTS_DTYPE_UINT32:
    case MTS_DTYPE_INT64: case MTS_DTYPE_UINT64:
        return MTS_OK;
    default:
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "reduction '%s' on %s data is not supported", r,
                           mts_dtype_name(data->dtype));
    }
}

#define RED_CASE(T, UT)                                                                                      \
    {                                                                                                        \
        T *d = dst;                                                                                          \
        const T *s = src;                                                                                    \
        for (int64_t i = 0; i < n; i++) {                                                                    \
            switch (red) {                                                                                   \
            case RED_ADD: d[i] = (T)((UT)d[i] + (UT)s[i]); break;                                            \
            case RED_MUL: d[i] = (T)((UT)d[i] * (UT)s[i]); break;                                            \
            case RED_MAX: if (s[i] > d[i]) d[i] = s[i]; break;                                               \
            default: if (s[i] < d[i]) d[i] = s[i]; break;                                                    \
            }                                                                                                \
        }                                                                                                    \
        return;                                                                                              \
    }

/* dst[i] = dst[i] (red) src[i] for n elements of type dt (a type parse_reduction accepted). */
static void reduce_into(void *dst, const void *src, int64_t n, mts_dtype dt, int red)
{
    switch (dt) {
    case MTS_DTYPE_FLOAT: RED_CASE(float, float)
    case MTS_DTYPE_DOUBLE: RED_CASE(double, double)
    case MTS_DTYPE_INT8: RED_CASE(int8_t, uint32_t)
    case MTS_DTYPE_UINT8: RED_CASE(uint8_t, uint32_t)
    case MTS_DTYPE_INT16: RED_CASE(int16_t, uint32_t)
    case MTS_DTYPE_UINT16: RED_CASE(uint16_t, uint32_t)
    case MTS_DTYPE_INT32: RED_CASE(int32_t, uint32_t)
    case MTS_DTYPE_UINT32: RED_CASE(uint32_t, uint32_t)
    case MTS_DTYPE_INT64: RED_CASE(int64_t, uint64_t)
    case MTS_DTYPE_UINT64: RED_CASE(uint64_t, uint64_t)
    case MTS_DTYPE_BOOL: {
        uint8_t *d = dst;
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            bool a = d[i] != 0, b = s[i] != 0;
            d[i] = (red == RED_ADD || red == RED_MAX) ? (a || b) : (a && b);
        }
        return;
    }
    default:
        return;
    }
}

/* Stores n elements of src at dst, or reduces them into dst. */
static void scatter_put(void *dst, const void *src, int64_t n, size_t es, mts_dtype dt, int red)
{
    if (red == RED_NONE)
        memcpy(dst, src, (size_t)n * es);
    else
        reduce_into(dst, src, n, dt, red);
}

/* ------------------------------------------------------------------------------------------ */
/* ScatterND, ScatterElements, Scatter                                                         */
/* ------------------------------------------------------------------------------------------ */

static int scatternd_check(mts_kctx *k, int *red)
{
    const mts_tensor *x, *ind, *upd;
    int rc;
    char s0[160], s1[160], s2[160];
    if ((rc = req_in(k, 0, "data", &x)) || (rc = req_in(k, 1, "indices", &ind)) ||
        (rc = req_in(k, 2, "updates", &upd)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "data")) ||
        (rc = chk_index_dtype(k, ind, "indices")) || (rc = parse_reduction(k, x, red)))
        return rc;
    if (upd->dtype != x->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "updates dtype %s differs from data dtype %s",
                           mts_dtype_name(upd->dtype), mts_dtype_name(x->dtype));
    if (x->rank < 1 || ind->rank < 1)
        return mts_err_set(k->err, MTS_EINVAL, "ScatterND data and indices must have rank >= 1");
    int64_t m = ind->dims[ind->rank - 1];
    int ok = m >= 1 && m <= x->rank;
    /* updates: indices.shape[:-1] + data.shape[m:] */
    if (ok && upd->rank != ind->rank - 1 + x->rank - (int)m) ok = 0;
    for (int i = 0; ok && i < ind->rank - 1; i++)
        if (upd->dims[i] != ind->dims[i]) ok = 0;
    for (int i = (int)m; ok && i < x->rank; i++)
        if (upd->dims[ind->rank - 1 + i - (int)m] != x->dims[i]) ok = 0;
    if (!ok)
        return mts_err_set(k->err, MTS_ESHAPE,
                           "ScatterND shapes do not fit: data %s, indices %s, updates %s (updates must be "
                           "indices.shape[:-1] + data.shape[indices.shape[-1]:])",
                           mts_shape_str(x, s0, sizeof s0), mts_shape_str(ind, s1, sizeof s1),
                           mts_shape_str(upd, s2, sizeof s2));
    return MTS_OK;
}

static int scatternd_infer(mts_kctx *k)
{
    int red, rc = scatternd_check(k, &red);
    if (rc) return rc;
    return mts_kset_out(k, 0, k->in[0]->dtype, k->in[0]->rank, k->in[0]->dims);
}

static int scatternd_run(mts_kctx *k)
{
    int red, rc = scatternd_check(k, &red);
    if (rc) return rc;
    const mts_tensor *x = k->in[0], *ind = k->in[1], *upd = k->in[2];
    size_t es = mts_dtype_size(x->dtype);
    int64_t nb = mts_tensor_nbytes(x);
    if (nb > 0) memcpy(k->out[0].data, x->data, (size_t)nb);
    int m = (int)ind->dims[ind->rank - 1];
    int64_t n = prod(ind->dims, 0, ind->rank - 1), slice = prod(x->dims, m, x->rank);
    int64_t xs[MTS_MAX_RANK];
    mts_strides(x, xs);
    uint8_t *o = k->out[0].data;
    const uint8_t *u = upd->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int j = 0; j < m; j++) {
            int64_t v = 0;
            if ((rc = get_index(k, ind, i * m + j, x->dims[j], &v))) return rc;
            off += v * xs[j];
        }
        scatter_put(o + off * (int64_t)es, u + i * slice * (int64_t)es, slice, es, x->dtype, red);
    }
    return MTS_OK;
}

static int scatterel_check(mts_kctx *k, int *red, int *axis)
{
    const mts_tensor *x, *ind, *upd;
    int rc;
    char s0[160], s1[160], s2[160];
    if ((rc = req_in(k, 0, "data", &x)) || (rc = req_in(k, 1, "indices", &ind)) ||
        (rc = req_in(k, 2, "updates", &upd)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "data")) ||
        (rc = chk_index_dtype(k, ind, "indices")))
        return rc;
    if (strcmp(k->node->op_type, "Scatter") == 0)
        *red = RED_NONE;
    else if ((rc = parse_reduction(k, x, red)))
        return rc;
    if (upd->dtype != x->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "updates dtype %s differs from data dtype %s",
                           mts_dtype_name(upd->dtype), mts_dtype_name(x->dtype));
    if (x->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "data must have rank >= 1");
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), x->rank, axis, k->err))) return rc;
    int ok = ind->rank == x->rank && mts_shape_equal(ind, upd);
    for (int i = 0; ok && i < x->rank; i++)
        if (i != *axis && ind->dims[i] > x->dims[i]) ok = 0;
    if (!ok)
        return mts_err_set(k->err, MTS_ESHAPE,
                           "indices %s and updates %s must have one shape, of the rank of data %s and no larger "
                           "off axis %d",
                           mts_shape_str(ind, s1, sizeof s1), mts_shape_str(upd, s2, sizeof s2),
                           mts_shape_str(x, s0, sizeof s0), *axis);
    return MTS_OK;
}

static int scatterel_infer(mts_kctx *k)
{
    int red, axis, rc = scatterel_check(k, &red, &axis);
    if (rc) return rc;
    return mts_kset_out(k, 0, k->in[0]->dtype, k->in[0]->rank, k->in[0]->dims);
}

static int scatterel_run(mts_kctx *k)
{
    int red, axis, rc = scatterel_check(k, &red, &axis);
    if (rc) return rc;
    const mts_tensor *x = k->in[0], *ind = k->in[1], *upd = k->in[2];
    size_t es = mts_dtype_size(x->dtype);
    int64_t nb = mts_tensor_nbytes(x);
    if (nb > 0) memcpy(k->out[0].data, x->data, (size_t)nb);
    int64_t n = mts_tensor_numel(ind), dim = x->dims[axis];
    int64_t xs[MTS_MAX_RANK], idx[MTS_MAX_RANK] = {0}, off = 0;
    mts_strides(x, xs);
    uint8_t *o = k->out[0].data;
    const uint8_t *u = upd->data;
    for (int64_t e = 0; e < n; e++) {
        int64_t v = 0;
        if ((rc = get_index(k, ind, e, dim, &v))) return rc;
        scatter_put(o + (off + v * xs[axis]) * (int64_t)es, u + e * (int64_t)es, 1, es, x->dtype, red);
        for (int j = ind->rank - 1; j >= 0; j--) {
            if (j != axis) off += xs[j];
            if (++idx[j] < ind->dims[j]) break;
            if (j != axis) off -= xs[j] * ind->dims[j];
            idx[j] = 0;
        }
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* GatherND                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static int gathernd_check(mts_kctx *k, int *bd, int *m)
{
    const mts_tensor *x, *ind;
    int rc;
    char s0[160], s1[160];
    if ((rc = req_in(k, 0, "data", &x)) || (rc = req_in(k, 1, "indices", &ind)) || (rc = mts_kchk_n_out(k, 1)) ||
        (rc = chk_dtype(k, x, "data")) || (rc = chk_index_dtype(k, ind, "indices")))
        return rc;
    int64_t b = k->node->opset >= 12 ? mts_attr_int(k->node, "batch_dims", 0) : 0;
    if (x->rank < 1 || ind->rank < 1)
        return mts_err_set(k->err, MTS_EINVAL, "GatherND data and indices must have rank >= 1");
    if (b < 0 || b >= x->rank || b >= ind->rank)
        return mts_err_set(k->err, MTS_EINVAL, "batch_dims %lld must be in [0, min(rank(data), rank(indices)))",
                           (long long)b);
    int64_t mm = ind->dims[ind->rank - 1];
    if (mm < 1 || mm > x->rank - b)
        return mts_err_set(k->err, MTS_ESHAPE, "indices %s: last dimension must be in [1, %lld] for data %s",
                           mts_shape_str(ind, s1, sizeof s1), (long long)(x->rank - b),
                           mts_shape_str(x, s0, sizeof s0));
    for (int i = 0; i < b; i++)
        if (ind->dims[i] != x->dims[i])
            return mts_err_set(k->err, MTS_ESHAPE, "batch dimension %d differs: data %s, indices %s", i,
                               mts_shape_str(x, s0, sizeof s0), mts_shape_str(ind, s1, sizeof s1));
    *bd = (int)b;
    *m = (int)mm;
    return MTS_OK;
}

static int gathernd_infer(mts_kctx *k)
{
    int b, m, rc = gathernd_check(k, &b, &m);
    if (rc) return rc;
    const mts_tensor *x = k->in[0], *ind = k->in[1];
    int64_t d[2 * MTS_MAX_RANK];
    int n = 0;
    for (int i = 0; i < ind->rank - 1; i++) d[n++] = ind->dims[i];
    for (int i = b + m; i < x->rank; i++) d[n++] = x->dims[i];
    return mts_kset_out(k, 0, x->dtype, n, d);
}

static int gathernd_run(mts_kctx *k)
{
    int b, m, rc = gathernd_check(k, &b, &m);
    if (rc) return rc;
    const mts_tensor *x = k->in[0], *ind = k->in[1];
    size_t es = mts_dtype_size(x->dtype);
    int64_t nbatch = prod(x->dims, 0, b);
    int64_t per = prod(ind->dims, b, ind->rank - 1); /* index tuples per batch entry */
    int64_t slice = prod(x->dims, b + m, x->rank) * (int64_t)es;
    int64_t bstride = prod(x->dims, b, x->rank);
    int64_t xs[MTS_MAX_RANK];
    mts_strides(x, xs);
    const uint8_t *src = x->data;
    uint8_t *o = k->out[0].data;
    for (int64_t bi = 0; bi < nbatch; bi++)
        for (int64_t t = 0; t < per; t++) {
            int64_t row = bi * per + t, off = bi * bstride;
            for (int j = 0; j < m; j++) {
                int64_t v = 0;
                if ((rc = get_index(k, ind, row * m + j, x->dims[b + j], &v))) return rc;
                off += v * xs[b + j];
            }
            if (slice > 0) memcpy(o + row * slice, src + off * (int64_t)es, (size_t)slice);
        }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* TopK                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static int topk_check(mts_kctx *k, int *axis, int64_t *kk)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "X", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "X"))) return rc;
    if (!dtype_numeric(x->dtype) || x->dtype == MTS_DTYPE_BOOL)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "TopK of %s is not supported", mts_dtype_name(x->dtype));
    if (x->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "TopK input must have rank >= 1");
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", -1), x->rank, axis, k->err))) return rc;
    if (k->node->opset < 10) {
        if (!mts_node_attr(k->node, "k")) return mts_err_set(k->err, MTS_EINVAL, "TopK attribute k is missing");
        *kk = mts_attr_int(k->node, "k", 0);
    } else {
        const mts_tensor *kt;
        if ((rc = req_in(k, 1, "K", &kt))) return rc;
        if (kt->dtype != MTS_DTYPE_INT64)
            return mts_err_set(k->err, MTS_EINVAL, "TopK K must be int64, got %s", mts_dtype_name(kt->dtype));
        if ((rc = read_scalar_int(k, kt, "K", kk))) return rc;
    }
    if (*kk < 0 || *kk > x->dims[*axis])
        return mts_err_set(k->err, MTS_EINVAL, "TopK K = %lld is out of range for axis %d of size %lld",
                           (long long)*kk, *axis, (long long)x->dims[*axis]);
    if (k->node->opset < 11 && mts_attr_int(k->node, "largest", 1) != 1)
        return mts_err_set(k->err, MTS_EINVAL, "TopK attribute largest needs opset 11");
    return MTS_OK;
}

static int topk_infer(mts_kctx *k)
{
    int axis, rc;
    int64_t kk;
    if ((rc = topk_check(k, &axis, &kk))) return rc;
    const mts_tensor *x = k->in[0];
    int64_t d[MTS_MAX_RANK];
    memcpy(d, x->dims, sizeof d);
    d[axis] = kk;
    if ((rc = mts_kset_out(k, 0, x->dtype, x->rank, d))) return rc;
    return mts_kset_out(k, 1, MTS_DTYPE_INT64, x->rank, d);
}

typedef struct topk_cmp_ctx {
    const uint8_t *base; /* first element of the slice */
    int64_t stride;      /* bytes between elements of the slice */
    mts_dtype dt;
    int largest;
} topk_cmp_ctx;

/* Orders the slice's positions: larger (or smaller) values first, then lower positions. */
static int topk_cmp(const void *ctxv, int64_t a, int64_t b)
{
    const topk_cmp_ctx *c = ctxv;
    int r = cmp_elem(c->base + a * c->stride, c->base + b * c->stride, c->dt);
    return c->largest ? -r : r;
}

/* topk_cmp with ties broken by position: a strict total order. */
static int topk_cmp_pos(const void *ctxv, int64_t a, int64_t b)
{
    int r = topk_cmp(ctxv, a, b);
    return r ? r : (a < b ? -1 : (a > b));
}

/* Moves heap[i] down a heap whose root is the entry that sorts last. */
static void topk_sift(int64_t *heap, int64_t n, int64_t i, const topk_cmp_ctx *c)
{
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && topk_cmp_pos(c, heap[l], heap[m]) > 0) m = l;
        if (r < n && topk_cmp_pos(c, heap[r], heap[m]) > 0) m = r;
        if (m == i) return;
        int64_t t = heap[i];
        heap[i] = heap[m];
        heap[m] = t;
        i = m;
    }
}

/* The first kk positions of the slice in sorted order, into idx: a full sort, or for small kk a
 * bounded heap of the best kk entries seen, then a sort of those. */
static void topk_select(int64_t *idx, int64_t *tmp, int64_t dim, int64_t kk, const topk_cmp_ctx *c)
{
    if (kk * 8 >= dim) {
        for (int64_t p = 0; p < dim; p++) idx[p] = p;
        msort_idx(idx, tmp, dim, topk_cmp, c);
        return;
    }
    int64_t n = 0;
    for (int64_t p = 0; p < dim; p++) {
        if (n < kk) { /* sift up */
            int64_t i = n++;
            idx[i] = p;
            while (i > 0 && topk_cmp_pos(c, idx[(i - 1) / 2], idx[i]) < 0) {
                int64_t t = idx[i];
                idx[i] = idx[(i - 1) / 2];
                idx[(i - 1) / 2] = t;
                i = (i - 1) / 2;
            }
        } else if (topk_cmp_pos(c, p, idx[0]) < 0) {
            idx[0] = p;
            topk_sift(idx, n, 0, c);
        }
    }
    msort_idx(idx, tmp, n, topk_cmp_pos, c);
}

typedef struct topk_job {
    mts_kctx *k;
    int64_t outer, inner, dim, kk;
    int largest;
    int64_t *ws; /* per thread: 2 * dim */
} topk_job;

static void topk_part(void *ctx, int ithr, int nthr)
{
    topk_job *j = ctx;
    const mts_tensor *x = j->k->in[0];
    size_t es = mts_dtype_size(x->dtype);
    int64_t *idx = j->ws + (int64_t)ithr * 2 * j->dim, *tmp = idx + j->dim;
    int64_t rows = j->outer * j->inner, r0 = rows * ithr / nthr, r1 = rows * (ithr + 1) / nthr;
    uint8_t *vals = j->k->out[0].data;
    int64_t *inds = j->k->n_out > 1 ? j->k->out[1].data : NULL;
    for (int64_t r = r0; r < r1; r++) {
        int64_t o = r / j->inner, i = r % j->inner;
        topk_cmp_ctx c = {(const uint8_t *)x->data + (o * j->dim * j->inner + i) * (int64_t)es,
                          j->inner * (int64_t)es, x->dtype, j->largest};
        topk_select(idx, tmp, j->dim, j->kk, &c);
        for (int64_t p = 0; p < j->kk; p++) {
            int64_t dst = o * j->kk * j->inner + p * j->inner + i;
            memcpy(vals + dst * (int64_t)es, c.base + idx[p] * c.stride, es);
            if (inds) inds[dst] = idx[p];
        }
    }
}

static int topk_run(mts_kctx *k)
{
    int axis, rc;
    int64_t kk;
    if ((rc = topk_check(k, &axis, &kk))) return rc;
    const mts_tensor *x = k->in[0];
    topk_job j = {k, prod(x->dims, 0, axis), prod(x->dims, axis + 1, x->rank), x->dims[axis], kk,
                  mts_attr_int(k->node, "largest", 1) != 0, NULL};
    int64_t rows = j.outer * j.inner;
    if (rows == 0 || kk == 0) return MTS_OK;
    int nthr = k->threads;
    if (rows < nthr) nthr = (int)rows;
    if (rows * j.dim < 32768) nthr = 1;
    j.ws = malloc(sizeof(int64_t) * 2 * (size_t)j.dim * (size_t)nthr);
    if (!j.ws) return mts_err_set(k->err, MTS_ENOMEM, "TopK: no memory for the sort workspace");
    mts_parallel(nthr, topk_part, &j);
    free(j.ws);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* CumSum                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static int cumsum_check(mts_kctx *k)
{
    const mts_tensor *x, *ax;
    int rc;
    if ((rc = req_in(k, 0, "x", &x)) || (rc = req_in(k, 1, "axis", &ax)) || (rc = mts_kchk_n_out(k, 1)) ||
        (rc = chk_dtype(k, x, "x")))
        return rc;
    switch (x->dtype) {
    case MTS_DTYPE_FLOAT: case MTS_DTYPE_DOUBLE: case MTS_DTYPE_INT32: case MTS_DTYPE_INT64:
    case MTS_DTYPE_UINT32: case MTS_DTYPE_UINT64:
        break;
    default:
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "CumSum of %s is not supported", mts_dtype_name(x->dtype));
    }
    if (x->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "CumSum input must have rank >= 1");
    return MTS_OK;
}

static int cumsum_infer(mts_kctx *k)
{
    int rc = cumsum_check(k);
    if (rc) return rc;
    return mts_kset_out(k, 0, k->in[0]->dtype, k->in[0]->rank, k->in[0]->dims);
}

#define CUMSUM_LOOP(T, ACC)                                                                                  \
    {                                                                                                        \
        const T *s = x->data;                                                                                \
        T *d = k->out[0].data;                                                                               \
        for (int64_t o = 0; o < outer; o++)                                                                  \
            for (int64_t i = 0; i < inner; i++) {                                                            \
                ACC acc = 0;                                                                                 \
                for (int64_t t = 0; t < dim; t++) {                                                          \
                    int64_t p = rev ? dim - 1 - t : t;                                                       \
                    int64_t e = (o * dim + p) * inner + i;                                                   \
                    if (excl) {                                                                              \
                        d[e] = (T)acc;                                                                       \
                        acc += (ACC)s[e];                                                                    \
                    } else {                                                                                 \
                        acc += (ACC)s[e];                                                                    \
                        d[e] = (T)acc;                                                                       \
                    }                                                                                        \
                }                                                                                            \
            }                                                                                                \
        break;                                                                                               \
    }

static int cumsum_run(mts_kctx *k)
{
    int rc = cumsum_check(k), axis;
    if (rc) return rc;
    const mts_tensor *x = k->in[0];
    int64_t a;
    if ((rc = read_scalar_int(k, k->in[1], "axis", &a))) return rc;
    if ((rc = mts_norm_axis(a, x->rank, &axis, k->err))) return rc;
    int excl = mts_attr_int(k->node, "exclusive", 0) != 0, rev = mts_attr_int(k->node, "reverse", 0) != 0;
    int64_t outer = prod(x->dims, 0, axis), dim = x->dims[axis], inner = prod(x->dims, axis + 1, x->rank);
    switch (x->dtype) {
    case MTS_DTYPE_FLOAT: CUMSUM_LOOP(float, float)
    case MTS_DTYPE_DOUBLE: CUMSUM_LOOP(double, double)
    case MTS_DTYPE_INT32: CUMSUM_LOOP(int32_t, uint32_t)
    case MTS_DTYPE_UINT32: CUMSUM_LOOP(uint32_t, uint32_t)
    case MTS_DTYPE_INT64: CUMSUM_LOOP(int64_t, uint64_t)
    default: CUMSUM_LOOP(uint64_t, uint64_t)
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* NonZero                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int nonzero_count(mts_kctx *k, int64_t *cnt)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "X", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "X"))) return rc;
    int64_t n = mts_tensor_numel(x);
    if (n > 0 && !x->data) return MTS_EDYNAMIC;
    size_t es = mts_dtype_size(x->dtype);
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += elem_nonzero((const uint8_t *)x->data + i * (int64_t)es, x->dtype, es);
    *cnt = c;
    return MTS_OK;
}

static int nonzero_infer(mts_kctx *k)
{
    int64_t c;
    int rc = nonzero_count(k, &c);
    if (rc) return rc;
    int64_t d[2] = {k->in[0]->rank, c};
    return mts_kset_out(k, 0, MTS_DTYPE_INT64, 2, d);
}

static int nonzero_run(mts_kctx *k)
{
    int64_t c;
    int rc = nonzero_count(k, &c);
    if (rc) return rc;
    const mts_tensor *x = k->in[0];
    if (k->out[0].dims[1] != c) return mts_err_set(k->err, MTS_EINVAL, "NonZero output was sized for other data");
    size_t es = mts_dtype_size(x->dtype);
    int64_t n = mts_tensor_numel(x), idx[MTS_MAX_RANK] = {0}, w = 0;
    int64_t *o = k->out[0].data;
    for (int64_t i = 0; i < n; i++) {
        if (elem_nonzero((const uint8_t *)x->data + i * (int64_t)es, x->dtype, es)) {
            for (int d = 0; d < x->rank; d++) o[d * c + w] = idx[d];
            w++;
        }
        for (int d = x->rank - 1; d >= 0; d--) {
            if (++idx[d] < x->dims[d]) break;
            idx[d] = 0;
        }
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* OneHot                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static int onehot_check(mts_kctx *k, int64_t *depth, int *axis)
{
    const mts_tensor *ind, *dep, *val;
    int rc;
    if ((rc = req_in(k, 0, "indices", &ind)) || (rc = req_in(k, 1, "depth", &dep)) ||
        (rc = req_in(k, 2, "values", &val)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, ind, "indices")) ||
        (rc = chk_dtype(k, dep, "depth")) || (rc = chk_dtype(k, val, "values")))
        return rc;
    if (!dtype_numeric(ind->dtype) || !dtype_numeric(dep->dtype))
        return mts_err_set(k->err, MTS_EINVAL, "OneHot indices and depth must be numeric");
    if (val->rank != 1 || val->dims[0] != 2)
        return mts_err_set(k->err, MTS_EINVAL, "OneHot values must have shape [2] (off, on)");
    if (dep->rank > 1 || mts_tensor_numel(dep) != 1)
        return mts_err_set(k->err, MTS_EINVAL, "OneHot depth must hold exactly one value");
    if (ind->rank + 1 > MTS_MAX_RANK)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "OneHot output rank %d exceeds %d", ind->rank + 1,
                           MTS_MAX_RANK);
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", -1), ind->rank + 1, axis, k->err))) return rc;
    if (!dep->data) return MTS_EDYNAMIC;
    double dv = elem_f64(dep->data, dep->dtype);
    int64_t d = f2idx(dv, -1);
    if (d < 1)
        return mts_err_set(k->err, MTS_EINVAL, "OneHot depth %g must be a positive integer", dv);
    *depth = d;
    return MTS_OK;
}

static int onehot_infer(mts_kctx *k)
{
    int64_t depth;
    int axis, rc = onehot_check(k, &depth, &axis);
    if (rc) return rc;
    const mts_tensor *ind = k->in[0];
    int64_t d[MTS_MAX_RANK];
    int n = 0;
    for (int i = 0; i <= ind->rank; i++) {
        if (i == axis) d[n++] = depth;
        if (i < ind->rank) d[n++] = ind->dims[i];
    }
    return mts_kset_out(k, 0, k->in[2]->dtype, ind->rank + 1, d);
}

static int onehot_run(mts_kctx *k)
{
    int64_t depth;
    int axis, rc = onehot_check(k, &depth, &axis);
    if (rc) return rc;
    const mts_tensor *ind = k->in[0], *val = k->in[2];
    size_t es = mts_dtype_size(val->dtype), ies = mts_dtype_size(ind->dtype);
    int64_t outer = prod(ind->dims, 0, axis), inner = prod(ind->dims, axis, ind->rank);
    const uint8_t *off = val->data, *on = off + es;
    uint8_t *o = k->out[0].data;
    int64_t total = outer * depth * inner;
    for (int64_t e = 0; e < total; e++) memcpy(o + e * (int64_t)es, off, es);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t v = f2idx(elem_f64((const uint8_t *)ind->data + (a * inner + i) * (int64_t)ies, ind->dtype),
                              INT64_MIN);
            if (v == INT64_MIN || v < -depth || v >= depth) continue; /* all off values */
            if (v < 0) v += depth;
            memcpy(o + ((a * depth + v) * inner + i) * (int64_t)es, on, es);
        }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* DepthToSpace, SpaceToDepth                                                                  */
/* ------------------------------------------------------------------------------------------ */

static int d2s_check(mts_kctx *k, bool to_space, int64_t *b, bool *crd)
{
    const mts_tensor *x;
    int rc;
    char s[160];
    if ((rc = req_in(k, 0, "input", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "input"))) return rc;
    if (x->rank != 4)
        return mts_err_set(k->err, MTS_EINVAL, "input must be 4-D [N,C,H,W], got %s", mts_shape_str(x, s, sizeof s));
    *b = mts_attr_int(k->node, "blocksize", 0);
    if (*b < 1 || *b > (1 << 20))
        return mts_err_set(k->err, MTS_EINVAL, "blocksize %lld must be a positive integer", (long long)*b);
    *crd = false;
    if (to_space) {
        const char *mode = mts_attr_string(k->node, "mode", "DCR");
        if (strcmp(mode, "CRD") == 0) *crd = true;
        else if (strcmp(mode, "DCR") != 0)
            return mts_err_set(k->err, MTS_EINVAL, "mode '%s' must be DCR or CRD", mode);
        if (x->dims[1] % (*b * *b))
            return mts_err_set(k->err, MTS_ESHAPE, "channels %lld are not divisible by blocksize^2 = %lld",
                               (long long)x->dims[1], (long long)(*b * *b));
    } else if (x->dims[2] % *b || x->dims[3] % *b) {
        return mts_err_set(k->err, MTS_ESHAPE, "H and W of %s are not divisible by blocksize %lld",
                           mts_shape_str(x, s, sizeof s), (long long)*b);
    }
    return MTS_OK;
}

static int d2s_infer_impl(mts_kctx *k, bool to_space)
{
    int64_t b;
    bool crd;
    int rc = d2s_check(k, to_space, &b, &crd);
    if (rc) return rc;
    const int64_t *x = k->in[0]->dims;
    int64_t d[4];
    if (to_space) {
        int64_t d0[4] = {x[0], x[1] / (b * b), x[2] * b, x[3] * b};
        memcpy(d, d0, sizeof d);
    } else {
        int64_t d0[4] = {x[0], x[1] * b * b, x[2] / b, x[3] / b};
        memcpy(d, d0, sizeof d);
    }
    return mts_kset_out(k, 0, k->in[0]->dtype, 4, d);
}

static int d2s_run_impl(mts_kctx *k, bool to_space)
{
    int64_t b;
    bool crd;
    int rc = d2s_check(k, to_space, &b, &crd);
    if (rc) return rc;
    const mts_tensor *x = k->in[0];
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
    int64_t dims[6], str[6];
    if (to_space) {
        int64_t Co = C / (b * b);
        /* output [N, Co, H, b, W, b]; source channel = DCR: (bh*b + bw)*Co + c, CRD: c*b*b + bh*b + bw */
        int64_t cs = crd ? b * b * H * W : H * W, bhs = crd ? b * H * W : b * Co * H * W;
        int64_t bws = crd ? H * W : Co * H * W;
        int64_t d0[6] = {N, Co, H, b, W, b}, s0[6] = {C * H * W, cs, W, bhs, 1, bws};
        memcpy(dims, d0, sizeof dims);
        memcpy(str, s0, sizeof str);
    } else {
        int64_t Ho = H / b, Wo = W / b;
        /* output [N, b, b, C, Ho, Wo] from input [N, C, Ho, b, Wo, b] */
        int64_t d0[6] = {N, b, b, C, Ho, Wo}, s0[6] = {C * H * W, W, 1, H * W, b * W, b};
        memcpy(dims, d0, sizeof dims);
        memcpy(str, s0, sizeof str);
    }
    gather_strided(k->out[0].data, x->data, 6, dims, str, mts_dtype_size(x->dtype));
    return MTS_OK;
}

static int d2s_infer(mts_kctx *k) { return d2s_infer_impl(k, true); }
static int d2s_run(mts_kctx *k) { return d2s_run_impl(k, true); }
static int s2d_infer(mts_kctx *k) { return d2s_infer_impl(k, false); }
static int s2d_run(mts_kctx *k) { return d2s_run_impl(k, false); }

/* ------------------------------------------------------------------------------------------ */
/* Trilu                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static int trilu_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "input"))) return rc;
    if (x->rank < 2) return mts_err_set(k->err, MTS_EINVAL, "Trilu input must have rank >= 2");
    return mts_kset_out(k, 0, x->dtype, x->rank, x->dims);
}

static int trilu_run(mts_kctx *k)
{
    int rc = trilu_infer(k);
    if (rc) return rc;
    const mts_tensor *x = k->in[0], *kt = mts_kin(k, 1);
    int64_t kk = 0;
    if (kt && (rc = read_scalar_int(k, kt, "k", &kk))) {
        if (rc == MTS_EDYNAMIC) return mts_err_set(k->err, MTS_EINVAL, "Trilu k has no data");
        return rc;
    }
    bool upper = mts_attr_int(k->node, "upper", 1) != 0;
    int64_t R = x->dims[x->rank - 2], C = x->dims[x->rank - 1], nmat = prod(x->dims, 0, x->rank - 2);
    size_t es = mts_dtype_size(x->dtype);
    int64_t nb = mts_tensor_nbytes(x);
    if (nb > 0) memcpy(k->out[0].data, x->data, (size_t)nb);
    uint8_t *o = k->out[0].data;
    if (kk > C) kk = C + 1; /* keep the arithmetic below in range */
    if (kk < -R) kk = -R - 1;
    for (int64_t m = 0; m < nmat; m++)
        for (int64_t i = 0; i < R; i++) {
            uint8_t *row = o + (m * R + i) * C * (int64_t)es;
            /* upper keeps j - i >= k: zero j < i + k; lower keeps j - i <= k: zero j > i + k */
            int64_t lim = i + kk;
            if (upper) {
                int64_t z = lim < 0 ? 0 : (lim > C ? C : lim);
                memset(row, 0, (size_t)z * es);
            } else {
                int64_t s = lim + 1 < 0 ? 0 : (lim + 1 > C ? C : lim + 1);
                memset(row + s * (int64_t)es, 0, (size_t)(C - s) * es);
            }
        }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Hardmax                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int hardmax_dims(mts_kctx *k, int64_t *outer, int64_t *dim, int64_t *inner)
{
    const mts_tensor *x;
    int rc, axis;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "input"))) return rc;
    if (x->dtype != MTS_DTYPE_FLOAT && x->dtype != MTS_DTYPE_DOUBLE && x->dtype != MTS_DTYPE_FLOAT16 &&
        x->dtype != MTS_DTYPE_BFLOAT16)
        return mts_err_set(k->err, MTS_EINVAL, "Hardmax input must be a float type, got %s",
                           mts_dtype_name(x->dtype));
    bool v13 = k->node->opset >= 13;
    if (x->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "Hardmax input must have rank >= 1");
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", v13 ? -1 : 1), x->rank, &axis, k->err))) return rc;
    *outer = prod(x->dims, 0, axis);
    if (v13) {
        *dim = x->dims[axis];
        *inner = prod(x->dims, axis + 1, x->rank);
    } else { /* the input is taken as 2-D [outer, rest] */
        *dim = prod(x->dims, axis, x->rank);
        *inner = 1;
    }
    return MTS_OK;
}

static int hardmax_infer(mts_kctx *k)
{
    int64_t a, b, c;
    int rc = hardmax_dims(k, &a, &b, &c);
    if (rc) return rc;
    return mts_kset_out(k, 0, k->in[0]->dtype, k->in[0]->rank, k->in[0]->dims);
}

static int hardmax_run(mts_kctx *k)
{
    int64_t outer, dim, inner;
    int rc = hardmax_dims(k, &outer, &dim, &inner);
    if (rc) return rc;
    const mts_tensor *x = k->in[0];
    size_t es = mts_dtype_size(x->dtype);
    int64_t nb = mts_tensor_nbytes(x);
    if (nb > 0) memset(k->out[0].data, 0, (size_t)nb);
    const uint8_t *src = x->data;
    uint8_t *o = k->out[0].data;
    for (int64_t a = 0; a < outer; a++)
        for (int64_t i = 0; i < inner; i++) {
            if (dim == 0) continue;
            int64_t best = 0, base = a * dim * inner + i;
            for (int64_t t = 1; t < dim; t++)
                if (cmp_elem(src + (base + t * inner) * (int64_t)es, src + (base + best * inner) * (int64_t)es,
                             x->dtype) > 0)
                    best = t;
            put_one(o + (base + best * inner) * (int64_t)es, x->dtype);
        }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* EyeLike                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int eyelike_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = mts_kchk_n_out(k, 1))) return rc;
    if (x->rank != 2) return mts_err_set(k->err, MTS_EINVAL, "EyeLike input must be 2-D, got rank %d", x->rank);
    mts_dtype dt = (mts_dtype)mts_attr_int(k->node, "dtype", x->dtype);
    mts_tensor probe = {.dtype = dt};
    if ((rc = chk_dtype(k, &probe, "the output")) || !dtype_numeric(dt))
        return rc ? rc : mts_err_set(k->err, MTS_EUNSUPPORTED, "EyeLike output dtype %s", mts_dtype_name(dt));
    return mts_kset_out(k, 0, dt, 2, x->dims);
}

static int eyelike_run(mts_kctx *k)
{
    int rc = eyelike_infer(k);
    if (rc) return rc;
    mts_tensor *y = &k->out[0];
    int64_t R = y->dims[0], C = y->dims[1], kk = mts_attr_int(k->node, "k", 0);
    size_t es = mts_dtype_size(y->dtype);
    int64_t nb = mts_tensor_nbytes(y);
    if (nb > 0) memset(y->data, 0, (size_t)nb);
    for (int64_t i = 0; i < R; i++) {
        if (kk > C || kk < -R) break;
        int64_t j = i + kk;
        if (j >= 0 && j < C) put_one((uint8_t *)y->data + (i * C + j) * (int64_t)es, y->dtype);
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Compress                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* axis < 0 after the call: no axis (the input is flattened). *kept: selected entries. */
static int compress_check(mts_kctx *k, int *axis, int64_t *kept)
{
    const mts_tensor *x, *c;
    int rc;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = req_in(k, 1, "condition", &c)) || (rc = mts_kchk_n_out(k, 1)) ||
        (rc = chk_dtype(k, x, "input")))
        return rc;
    if (c->dtype != MTS_DTYPE_BOOL || c->rank != 1)
        return mts_err_set(k->err, MTS_EINVAL, "Compress condition must be a 1-D bool tensor");
    *axis = -1;
    if (mts_node_attr(k->node, "axis")) {
        if (x->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "Compress with an axis needs rank >= 1");
        if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), x->rank, axis, k->err))) return rc;
    }
    int64_t dim = *axis >= 0 ? x->dims[*axis] : mts_tensor_numel(x);
    if (c->dims[0] > 0 && !c->data) return MTS_EDYNAMIC;
    int64_t n = c->dims[0] < dim ? c->dims[0] : dim, cnt = 0;
    for (int64_t i = 0; i < n; i++) cnt += ((const uint8_t *)c->data)[i] != 0;
    *kept = cnt;
    return MTS_OK;
}

static int compress_infer(mts_kctx *k)
{
    int axis;
    int64_t kept;
    int rc = compress_check(k, &axis, &kept);
    if (rc) return rc;
    const mts_tensor *x = k->in[0];
    if (axis < 0) return mts_kset_out(k, 0, x->dtype, 1, &kept);
    int64_t d[MTS_MAX_RANK];
    memcpy(d, x->dims, sizeof d);
    d[axis] = kept;
    return mts_kset_out(k, 0, x->dtype, x->rank, d);
}

static int compress_run(mts_kctx *k)
{
    int axis;
    int64_t kept;
    int rc = compress_check(k, &axis, &kept);
    if (rc) return rc;
    const mts_tensor *x = k->in[0], *c = k->in[1];
    int64_t es = (int64_t)mts_dtype_size(x->dtype);
    int64_t outer = axis < 0 ? 1 : prod(x->dims, 0, axis);
    int64_t dim = axis < 0 ? mts_tensor_numel(x) : x->dims[axis];
    int64_t inner = (axis < 0 ? 1 : prod(x->dims, axis + 1, x->rank)) * es;
    int64_t n = c->dims[0] < dim ? c->dims[0] : dim;
    const uint8_t *cond = c->data, *src = x->data;
    uint8_t *o = k->out[0].data;
    for (int64_t a = 0; a < outer; a++)
        for (int64_t i = 0; i < n; i++)
            if (cond[i]) {
                memcpy(o, src + (a * dim + i) * inner, (size_t)inner);
                o += inner;
            }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* ReverseSequence                                                                             */
/* ------------------------------------------------------------------------------------------ */

static int revseq_check(mts_kctx *k, int *tax, int *bax)
{
    const mts_tensor *x, *sl;
    int rc;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = req_in(k, 1, "sequence_lens", &sl)) || (rc = mts_kchk_n_out(k, 1)) ||
        (rc = chk_dtype(k, x, "input")) || (rc = chk_index_dtype(k, sl, "sequence_lens")))
        return rc;
    if (x->rank < 2) return mts_err_set(k->err, MTS_EINVAL, "ReverseSequence input must have rank >= 2");
    int64_t t = mts_attr_int(k->node, "time_axis", 0), b = mts_attr_int(k->node, "batch_axis", 1);
    if (!((t == 0 && b == 1) || (t == 1 && b == 0)))
        return mts_err_set(k->err, MTS_EINVAL, "time_axis (%lld) and batch_axis (%lld) must be 0 and 1",
                           (long long)t, (long long)b);
    if (sl->rank != 1 || sl->dims[0] != x->dims[b])
        return mts_err_set(k->err, MTS_ESHAPE, "sequence_lens must have shape [%lld]", (long long)x->dims[b]);
    *tax = (int)t;
    *bax = (int)b;
    return MTS_OK;
}

static int revseq_infer(mts_kctx *k)
{
    int t, b, rc = revseq_check(k, &t, &b);
    if (rc) return rc;
    return mts_kset_out(k, 0, k->in[0]->dtype, k->in[0]->rank, k->in[0]->dims);
}

static int revseq_run(mts_kctx *k)
{
    int t, b, rc = revseq_check(k, &t, &b);
    if (rc) return rc;
    const mts_tensor *x = k->in[0], *sl = k->in[1];
    int64_t es = (int64_t)mts_dtype_size(x->dtype);
    int64_t T = x->dims[t], B = x->dims[b], inner = prod(x->dims, 2, x->rank) * es;
    int64_t ts = (t == 0 ? B : 1) * inner, bs = (b == 0 ? T : 1) * inner;
    const uint8_t *src = x->data;
    uint8_t *o = k->out[0].data;
    for (int64_t bi = 0; bi < B; bi++) {
        int64_t len = idx_at(sl, bi);
        if (len < 0 || len > T)
            return mts_err_set(k->err, MTS_EINVAL, "sequence_lens[%lld] = %lld is outside [0, %lld]", (long long)bi,
                               (long long)len, (long long)T);
        for (int64_t ti = 0; ti < T; ti++) {
            int64_t from = ti < len ? len - 1 - ti : ti;
            if (inner > 0) memcpy(o + bi * bs + ti * ts, src + bi * bs + from * ts, (size_t)inner);
        }
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Einsum                                                                                      */
/* ------------------------------------------------------------------------------------------ */

#define EIN_MAXIN 16
#define EIN_LETTERS 52 /* 'A'..'Z' -> 0..25, 'a'..'z' -> 26..51: ids sort as the characters do */
#define EIN_MAXL (EIN_LETTERS + MTS_MAX_RANK)
#define EIN_MAX_WORK ((int64_t)1 << 40)

typedef struct ein {
    int nin;
    int rank[EIN_MAXIN];
    int lab[EIN_MAXIN][MTS_MAX_RANK]; /* label of each input axis */
    int nout;
    int out[EIN_MAXL];                /* output labels in order */
    int64_t size[EIN_MAXL];
    bool used[EIN_MAXL], in_out[EIN_MAXL];
    int64_t str[EIN_MAXIN][EIN_MAXL]; /* element stride of each label in each input (0: absent) */
    bool diag;                        /* some input repeats a label */
} ein;

/* Parses one term (letters and at most one "...") into tokens: label ids, -1 for the ellipsis. */
static int ein_term(mts_kctx *k, const char *s, const char *e, int *tok, int *ntok)
{
    int n = 0, ell = 0;
    for (const char *p = s; p < e; p++) {
        char c = *p;
        if (c == ' ') continue;
        int id;
        if (c >= 'A' && c <= 'Z') {
            id = c - 'A';
        } else if (c >= 'a' && c <= 'z') {
            id = 26 + (c - 'a');
        } else if (c == '.') {
            if (e - p < 3 || p[1] != '.' || p[2] != '.' || ell)
                return mts_err_set(k->err, MTS_EINVAL, "Einsum equation: a term has a malformed or repeated '...'");
            ell = 1;
            p += 2;
            id = -1;
        } else {
            return mts_err_set(k->err, MTS_EINVAL, "Einsum equation: unexpected character '%c'", c);
        }
        if (n >= MTS_MAX_RANK + 1)
            return mts_err_set(k->err, MTS_EINVAL, "Einsum equation: a term has too many labels");
        tok[n++] = id;
    }
    *ntok = n;
    return MTS_OK;
}

static int ein_parse(mts_kctx *k, ein *q)
{
    memset(q, 0, sizeof *q);
    const char *eq = mts_attr_string(k->node, "equation", NULL);
    if (!eq) return mts_err_set(k->err, MTS_EINVAL, "Einsum attribute equation is missing");
    if (k->n_in < 1 || k->n_in > EIN_MAXIN)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Einsum with %d inputs (1 to %d are supported)", k->n_in,
                           EIN_MAXIN);
    q->nin = k->n_in;
    const char *arrow = strstr(eq, "->"), *lhs_end = arrow ? arrow : eq + strlen(eq);
    if (arrow && strstr(arrow + 2, "->")) return mts_err_set(k->err, MTS_EINVAL, "Einsum equation has two '->'");
    int tok[EIN_MAXIN][MTS_MAX_RANK + 1], ntok[EIN_MAXIN], ellr[EIN_MAXIN], E = 0, rc;
    const char *s = eq;
    for (int i = 0; i < q->nin; i++) {
        const char *c = s;
        while (c < lhs_end && *c != ',') c++;
        if ((c == lhs_end) != (i == q->nin - 1))
            return mts_err_set(k->err, MTS_EINVAL, "Einsum equation does not have one term per input (%d inputs)",
                               q->nin);
        if ((rc = ein_term(k, s, c, tok[i], &ntok[i]))) return rc;
        s = c + 1;
        const mts_tensor *t = mts_kin(k, i);
        if (!t) return mts_err_set(k->err, MTS_EINVAL, "Einsum input %d is missing", i);
        int nlet = 0, has_ell = 0;
        for (int j = 0; j < ntok[i]; j++) {
            if (tok[i][j] < 0) has_ell = 1;
            else nlet++;
        }
        ellr[i] = t->rank - nlet;
        if (ellr[i] < 0 || (!has_ell && ellr[i] != 0))
            return mts_err_set(k->err, MTS_EINVAL, "Einsum term %d has %d labels for an input of rank %d", i, nlet,
                               t->rank);
        if (ellr[i] > E) E = ellr[i];
        q->rank[i] = t->rank;
    }
    /* label the input axes; the ellipsis dims are right-aligned over E shared ids */
    int occ[EIN_MAXL] = {0};
    for (int i = 0; i < q->nin; i++) {
        const mts_tensor *t = k->in[i];
        int64_t ts[MTS_MAX_RANK];
        mts_strides(t, ts);
        int ax = 0;
        for (int j = 0; j < ntok[i]; j++) {
            if (tok[i][j] >= 0) {
                q->lab[i][ax++] = tok[i][j];
                continue;
            }
            for (int e = 0; e < ellr[i]; e++) q->lab[i][ax++] = EIN_LETTERS + (E - ellr[i]) + e;
        }
        bool seen[EIN_MAXL] = {false};
        for (int a = 0; a < t->rank; a++) {
            int l = q->lab[i][a];
            int64_t d = t->dims[a];
            occ[l]++;
            if (seen[l]) {
                q->diag = true;
                if (d != q->size[l] && !(l >= EIN_LETTERS && (d == 1 || q->size[l] == 1)))
                    return mts_err_set(k->err, MTS_ESHAPE, "Einsum: repeated label of input %d has dims %lld and %lld",
                                       i, (long long)q->size[l], (long long)d);
            }
            if (!q->used[l]) {
                q->used[l] = true;
                q->size[l] = d;
            } else if (q->size[l] != d) {
                if (l >= EIN_LETTERS && (d == 1 || q->size[l] == 1)) { /* broadcast ellipsis dim */
                    if (d > q->size[l]) q->size[l] = d;
                } else {
                    return mts_err_set(k->err, MTS_ESHAPE, "Einsum: label '%c' has dims %lld and %lld",
                                       l < 26 ? 'A' + l : 'a' + (l - 26), (long long)q->size[l], (long long)d);
                }
            }
            seen[l] = true;
        }
    }
    /* strides, after the sizes are settled (a broadcast dim of 1 gets stride 0) */
    for (int i = 0; i < q->nin; i++) {
        const mts_tensor *t = k->in[i];
        int64_t ts[MTS_MAX_RANK];
        mts_strides(t, ts);
        for (int a = 0; a < t->rank; a++) {
            int l = q->lab[i][a];
            if (t->dims[a] == 1 && q->size[l] != 1) continue;
            q->str[i][l] += ts[a];
        }
    }
    /* output labels */
    if (arrow) {
        int otok[MTS_MAX_RANK + 1], no;
        if ((rc = ein_term(k, arrow + 2, arrow + 2 + strlen(arrow + 2), otok, &no))) return rc;
        for (int j = 0; j < no; j++) {
            if (otok[j] < 0) {
                for (int e = 0; e < E; e++) q->out[q->nout++] = EIN_LETTERS + e;
                continue;
            }
            int l = otok[j];
            if (!q->used[l] || q->in_out[l])
                return mts_err_set(k->err, MTS_EINVAL, "Einsum output label '%c' is repeated or not in any input",
                                   l < 26 ? 'A' + l : 'a' + (l - 26));
            q->in_out[l] = true;
            q->out[q->nout++] = l;
        }
        for (int e = 0; e < q->nout; e++) q->in_out[q->out[e]] = true;
    } else {
        for (int e = 0; e < E; e++) q->out[q->nout++] = EIN_LETTERS + e;
        for (int l = 0; l < EIN_LETTERS; l++)
            if (occ[l] == 1) q->out[q->nout++] = l;
        for (int e = 0; e < q->nout; e++) q->in_out[q->out[e]] = true;
    }
    if (q->nout > MTS_MAX_RANK)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Einsum output rank %d exceeds %d", q->nout, MTS_MAX_RANK);
    return MTS_OK;
}

static int ein_check(mts_kctx *k, ein *q)
{
    int rc;
    if ((rc = mts_kchk_n_out(k, 1))) return rc;
    if (k->n_in < 1) return mts_err_set(k->err, MTS_EINVAL, "Einsum needs at least one input");
    for (int i = 0; i < k->n_in; i++) {
        const mts_tensor *t = mts_kin(k, i);
        if (!t) return mts_err_set(k->err, MTS_EINVAL, "Einsum input %d is missing", i);
        if ((rc = chk_dtype(k, t, "Einsum input"))) return rc;
        if (t->dtype != k->in[0]->dtype)
            return mts_err_set(k->err, MTS_EINVAL, "Einsum inputs must share a dtype (%s vs %s)",
                               mts_dtype_name(t->dtype), mts_dtype_name(k->in[0]->dtype));
    }
    switch (k->in[0]->dtype) {
    case MTS_DTYPE_FLOAT: case MTS_DTYPE_DOUBLE: case MTS_DTYPE_INT32: case MTS_DTYPE_INT64:
    case MTS_DTYPE_UINT32: case MTS_DTYPE_UINT64:
        break;
    default:
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Einsum on %s is not supported",
                           mts_dtype_name(k->in[0]->dtype));
    }
    return ein_parse(k, q);
}

static int einsum_infer(mts_kctx *k)
{
    ein q;
    int rc = ein_check(k, &q);
    if (rc) return rc;
    int64_t d[MTS_MAX_RANK];
    for (int i = 0; i < q.nout; i++) d[i] = q.size[q.out[i]];
    return mts_kset_out(k, 0, k->in[0]->dtype, q.nout, d);
}

static int64_t ein_read_int(const void *p, mts_dtype dt)
{
    switch (dt) {
    case MTS_DTYPE_INT32: return *(const int32_t *)p;
    case MTS_DTYPE_UINT32: return *(const uint32_t *)p;
    default: return *(const int64_t *)p; /* int64; uint64 wraps identically */
    }
}

/* The direct evaluation: every output element sums the product of the inputs over the labels
 * that are not in the output. */
static int ein_direct(mts_kctx *k, const ein *q)
{
    int L[EIN_MAXL], nl = 0;
    for (int i = 0; i < q->nout; i++) L[nl++] = q->out[i];
    for (int l = 0; l < EIN_MAXL; l++)
        if (q->used[l] && !q->in_out[l]) L[nl++] = l;
    int64_t tot_out = 1, tot_red = 1;
    for (int i = 0; i < nl; i++) {
        int64_t s = q->size[L[i]];
        if (i < q->nout) tot_out *= s;
        else if (s == 0) tot_red = 0;
        else if (tot_red > EIN_MAX_WORK / s) tot_red = EIN_MAX_WORK + 1;
        else tot_red *= s;
    }
    if (tot_out > 0 && tot_red > 0 && tot_red > EIN_MAX_WORK / tot_out)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Einsum needs more than 2^40 multiply-adds in its direct form");
    mts_dtype dt = k->in[0]->dtype;
    size_t es = mts_dtype_size(dt);
    bool fl = dt == MTS_DTYPE_FLOAT || dt == MTS_DTYPE_DOUBLE;
    int64_t idx[EIN_MAXL] = {0}, off[EIN_MAXIN] = {0};
    const uint8_t *base[EIN_MAXIN];
    for (int i = 0; i < q->nin; i++) base[i] = k->in[i]->data;
    uint8_t *o = k->out[0].data;
    for (int64_t e = 0; e < tot_out; e++) {
        double accf = 0;
        uint64_t acci = 0;
        for (int64_t r = 0; r < tot_red; r++) {
            if (fl) {
                double p = 1;
                for (int i = 0; i < q->nin; i++) p *= elem_f64(base[i] + off[i] * (int64_t)es, dt);
                accf += p;
            } else {
                uint64_t p = 1;
                for (int i = 0; i < q->nin; i++) p *= (uint64_t)ein_read_int(base[i] + off[i] * (int64_t)es, dt);
                acci += p;
            }
            for (int j = nl - 1; j >= 0; j--) {
                int l = L[j];
                for (int i = 0; i < q->nin; i++) off[i] += q->str[i][l];
                if (++idx[j] < q->size[l]) break;
                for (int i = 0; i < q->nin; i++) off[i] -= q->str[i][l] * q->size[l];
                idx[j] = 0;
            }
        }
        uint8_t *dst = o + e * (int64_t)es;
        switch (dt) {
        case MTS_DTYPE_FLOAT: *(float *)dst = (float)accf; break;
        case MTS_DTYPE_DOUBLE: *(double *)dst = accf; break;
        case MTS_DTYPE_INT32: case MTS_DTYPE_UINT32: *(uint32_t *)dst = (uint32_t)acci; break;
        default: *(uint64_t *)dst = acci; break;
        }
        if (tot_red == 0) { /* the odometer did not move: step over the output labels by hand */
            for (int j = q->nout - 1; j >= 0; j--) {
                int l = L[j];
                for (int i = 0; i < q->nin; i++) off[i] += q->str[i][l];
                if (++idx[j] < q->size[l]) break;
                for (int i = 0; i < q->nin; i++) off[i] -= q->str[i][l] * q->size[l];
                idx[j] = 0;
            }
        }
    }
    return MTS_OK;
}

/* Two float operands without diagonals whose every label is a batch (both inputs and the
 * output), M (first input and output), N (second input and output) or K (both inputs only)
 * label: permute into batch x M x K and batch x K x N and run the GEMM. 1 when it does not
 * apply. */
static int ein_gemm(mts_kctx *k, const ein *q)
{
    if (q->nin != 2 || q->diag || k->in[0]->dtype != MTS_DTYPE_FLOAT) return 1;
    int gb[EIN_MAXL], gm[EIN_MAXL], gn[EIN_MAXL], gk[EIN_MAXL], nb = 0, nm = 0, nn = 0, nk = 0;
    int64_t B = 1, M = 1, N = 1, K = 1;
    for (int l = 0; l < EIN_MAXL; l++) {
        if (!q->used[l]) continue;
        bool a = false, b = false;
        for (int ax = 0; ax < q->rank[0]; ax++) a |= q->lab[0][ax] == l;
        for (int ax = 0; ax < q->rank[1]; ax++) b |= q->lab[1][ax] == l;
        if (a && b && q->in_out[l]) gb[nb++] = l, B *= q->size[l];
        else if (a && !b && q->in_out[l]) gm[nm++] = l, M *= q->size[l];
        else if (b && !a && q->in_out[l]) gn[nn++] = l, N *= q->size[l];
        else if (a && b) gk[nk++] = l, K *= q->size[l];
        else return 1; /* a label summed within one operand */
    }
    if (B * M * N == 0) return MTS_OK; /* empty output */
    /* permuted copies are the size of the operands unless a broadcast ellipsis dim repeats one:
     * allow at most that much, and never a size that overflows */
    int64_t na = mts_tensor_numel(k->in[0]), nbn = mts_tensor_numel(k->in[1]), lim = INT64_MAX / 64;
    if (K > 0 && (B > lim / K || B * K > lim / (M > N ? M : N))) return 1;
    if (B * M * K > 4 * (na + B * M * N) || B * K * N > 4 * (nbn + B * M * N)) return 1;
    float *ap = malloc(sizeof(float) * (size_t)(B * M * K + B * K * N + B * M * N + 1));
    int64_t *offs = malloc(sizeof(int64_t) * 2 * (size_t)B);
    if (!ap || !offs) {
        free(ap);
        free(offs);
        return mts_err_set(k->err, MTS_ENOMEM, "Einsum: no memory for the permuted operands");
    }
    float *bp = ap + B * M * K, *cp = bp + B * K * N;
    int64_t dims[EIN_MAXL], str[EIN_MAXL];
    int n = 0;
    for (int i = 0; i < nb; i++) dims[n] = q->size[gb[i]], str[n++] = q->str[0][gb[i]];
    for (int i = 0; i < nm; i++) dims[n] = q->size[gm[i]], str[n++] = q->str[0][gm[i]];
    for (int i = 0; i < nk; i++) dims[n] = q->size[gk[i]], str[n++] = q->str[0][gk[i]];
    gather_strided(ap, k->in[0]->data, n, dims, str, sizeof(float));
    n = 0;
    for (int i = 0; i < nb; i++) dims[n] = q->size[gb[i]], str[n++] = q->str[1][gb[i]];
    for (int i = 0; i < nk; i++) dims[n] = q->size[gk[i]], str[n++] = q->str[1][gk[i]];
    for (int i = 0; i < nn; i++) dims[n] = q->size[gn[i]], str[n++] = q->str[1][gn[i]];
    gather_strided(bp, k->in[1]->data, n, dims, str, sizeof(float));
    for (int64_t b = 0; b < B; b++) offs[b] = b * M * K, offs[B + b] = b * K * N;
    mts_sgemm g = {.M = M, .N = N, .K = K, .A = ap, .a_rs = K, .a_cs = 1, .B = bp, .b_rs = N, .b_cs = 1,
                   .C = cp, .ldc = N, .alpha = 1.0f, .nbatch = B, .a_off = offs, .b_off = offs + B,
                   .c_bs = M * N};
    int rc = MTS_OK;
    if (K == 0)
        memset(cp, 0, sizeof(float) * (size_t)(B * M * N));
    else
        rc = mts_sgemm_run(&g, k->threads);
    if (rc == MTS_OK) {
        /* C is [batch..., M..., N...]: its stride for each label, then the output's order */
        int64_t cstr[EIN_MAXL] = {0}, s = 1;
        for (int i = nn - 1; i >= 0; i--) cstr[gn[i]] = s, s *= q->size[gn[i]];
        for (int i = nm - 1; i >= 0; i--) cstr[gm[i]] = s, s *= q->size[gm[i]];
        for (int i = nb - 1; i >= 0; i--) cstr[gb[i]] = s, s *= q->size[gb[i]];
        for (int i = 0; i < q->nout; i++) dims[i] = q->size[q->out[i]], str[i] = cstr[q->out[i]];
        gather_strided(k->out[0].data, cp, q->nout, dims, str, sizeof(float));
    } else {
        mts_err_set(k->err, rc, "Einsum: the GEMM failed");
    }
    free(ap);
    free(offs);
    return rc;
}

static int einsum_run(mts_kctx *k)
{
    ein q;
    int rc = ein_check(k, &q);
    if (rc) return rc;
    rc = ein_gemm(k, &q);
    if (rc <= 0) return rc;
    return ein_direct(k, &q);
}

/* ------------------------------------------------------------------------------------------ */
/* NonMaxSuppression                                                                           */
/* ------------------------------------------------------------------------------------------ */

typedef struct nms_box {
    float y0, x0, y1, x1; /* corners with y0 <= y1, x0 <= x1 */
} nms_box;

static nms_box nms_get(const float *p, int center)
{
    nms_box b;
    if (center) { /* [x_center, y_center, width, height] */
        float hw = p[2] / 2, hh = p[3] / 2;
        b.x0 = p[0] - hw;
        b.x1 = p[0] + hw;
        b.y0 = p[1] - hh;
        b.y1 = p[1] + hh;
    } else { /* [y1, x1, y2, x2], either corner order */
        b.y0 = fminf(p[0], p[2]);
        b.y1 = fmaxf(p[0], p[2]);
        b.x0 = fminf(p[1], p[3]);
        b.x1 = fmaxf(p[1], p[3]);
    }
    return b;
}

/* Whether the intersection over union of a and b exceeds thr. */
static bool nms_overlaps(const nms_box *a, const nms_box *b, float thr)
{
    float ix0 = fmaxf(a->x0, b->x0), iy0 = fmaxf(a->y0, b->y0);
    float ix1 = fminf(a->x1, b->x1), iy1 = fminf(a->y1, b->y1);
    if (!(ix1 > ix0) || !(iy1 > iy0)) return false;
    float aa = (a->y1 - a->y0) * (a->x1 - a->x0), ab = (b->y1 - b->y0) * (b->x1 - b->x0);
    if (!(aa > 0) || !(ab > 0)) return false;
    float inter = (ix1 - ix0) * (iy1 - iy0);
    float uni = aa + ab - inter;
    if (!(uni > 0)) return false;
    return inter / uni > thr;
}

typedef struct nms_sort_ctx {
    const float *scores;
} nms_sort_ctx;

static int nms_cmp(const void *ctxv, int64_t a, int64_t b)
{
    const float *s = ((const nms_sort_ctx *)ctxv)->scores;
    return s[a] > s[b] ? -1 : (s[a] < s[b] ? 1 : 0); /* higher score first; stable keeps lower index first */
}

/* Runs the selection; writes the triples to out (NULL: counts only) and the count to *count. */
static int nms_exec(mts_kctx *k, int64_t *out, int64_t *count)
{
    const mts_tensor *boxes, *scores;
    int rc;
    char s0[160], s1[160];
    if ((rc = req_in(k, 0, "boxes", &boxes)) || (rc = req_in(k, 1, "scores", &scores)) || (rc = mts_kchk_n_out(k, 1)))
        return rc;
    if (boxes->dtype != MTS_DTYPE_FLOAT || scores->dtype != MTS_DTYPE_FLOAT)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "NonMaxSuppression supports float boxes and scores only");
    if (boxes->rank != 3 || boxes->dims[2] != 4 || scores->rank != 3 || scores->dims[0] != boxes->dims[0] ||
        scores->dims[2] != boxes->dims[1])
        return mts_err_set(k->err, MTS_ESHAPE, "boxes %s must be [B,N,4] and scores %s [B,C,N]",
                           mts_shape_str(boxes, s0, sizeof s0), mts_shape_str(scores, s1, sizeof s1));
    const mts_tensor *tmax = mts_kin(k, 2), *tiou = mts_kin(k, 3), *tsc = mts_kin(k, 4);
    int64_t maxout = 0;
    float iou = 0, sthr = 0;
    bool has_sthr = false;
    if (tmax && mts_tensor_numel(tmax) != 0 &&
        (rc = read_scalar_int(k, tmax, "max_output_boxes_per_class", &maxout)))
        return rc;
    const mts_tensor *ft[2] = {tiou, tsc};
    float *fv[2] = {&iou, &sthr};
    for (int i = 0; i < 2; i++) {
        const mts_tensor *t = ft[i];
        if (!t || mts_tensor_numel(t) == 0) continue;
        if (t->dtype != MTS_DTYPE_FLOAT || t->rank > 1 || mts_tensor_numel(t) != 1)
            return mts_err_set(k->err, MTS_EINVAL, "%s must be one float", i ? "score_threshold" : "iou_threshold");
        if (!t->data) return MTS_EDYNAMIC;
        *fv[i] = *(const float *)t->data;
        if (i) has_sthr = true;
    }
    if (!(iou >= 0 && iou <= 1))
        return mts_err_set(k->err, MTS_EINVAL, "iou_threshold %g must be in [0, 1]", (double)iou);
    int64_t center = mts_attr_int(k->node, "center_point_box", 0);
    if (center != 0 && center != 1)
        return mts_err_set(k->err, MTS_EINVAL, "center_point_box must be 0 or 1, got %lld", (long long)center);
    int64_t B = boxes->dims[0], N = boxes->dims[1], C = scores->dims[1];
    if (B * N > 0 && (!boxes->data || !scores->data)) return MTS_EDYNAMIC;
    if (maxout < 0) maxout = 0;
    if (maxout > N) maxout = N;
    int64_t total = 0;
    if (maxout == 0 || N == 0) {
        *count = 0;
        return MTS_OK;
    }
    int64_t *cand = malloc(sizeof(int64_t) * 3 * (size_t)N);
    nms_box *sel = malloc(sizeof(nms_box) * (size_t)N);
    if (!cand || !sel) {
        free(cand);
        free(sel);
        return mts_err_set(k->err, MTS_ENOMEM, "NonMaxSuppression: no memory for %lld boxes", (long long)N);
    }
    int64_t *tmp = cand + N, *selidx = cand + 2 * N;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++) {
            const float *sc = (const float *)scores->data + (b * C + c) * N;
            const float *bx = (const float *)boxes->data + b * N * 4;
            int64_t nc = 0, ns = 0;
            for (int64_t i = 0; i < N; i++)
                if (!has_sthr || sc[i] > sthr) cand[nc++] = i;
            nms_sort_ctx sctx = {sc};
            msort_idx(cand, tmp, nc, nms_cmp, &sctx);
            for (int64_t i = 0; i < nc && ns < maxout; i++) {
                nms_box cb = nms_get(bx + cand[i] * 4, (int)center);
                bool keep = true;
                for (int64_t j = 0; j < ns && keep; j++)
                    if (nms_overlaps(&cb, &sel[j], iou)) keep = false;
                if (!keep) continue;
                sel[ns] = cb;
                selidx[ns++] = cand[i];
            }
            if (out)
                for (int64_t j = 0; j < ns; j++) {
                    out[(total + j) * 3 + 0] = b;
                    out[(total + j) * 3 + 1] = c;
                    out[(total + j) * 3 + 2] = selidx[j];
                }
            total += ns;
        }
    free(cand);
    free(sel);
    *count = total;
    return MTS_OK;
}

static int nms_infer(mts_kctx *k)
{
    int64_t n;
    int rc = nms_exec(k, NULL, &n);
    if (rc) return rc;
    int64_t d[2] = {n, 3};
    return mts_kset_out(k, 0, MTS_DTYPE_INT64, 2, d);
}

static int nms_run(mts_kctx *k)
{
    int64_t n;
    int rc = nms_exec(k, NULL, &n);
    if (rc) return rc;
    if (k->out[0].dims[0] != n)
        return mts_err_set(k->err, MTS_EINVAL, "NonMaxSuppression output was sized for other data");
    return nms_exec(k, k->out[0].data, &n);
}

/* ------------------------------------------------------------------------------------------ */
/* RoiAlign                                                                                    */
/* ------------------------------------------------------------------------------------------ */

#define ROI_MAX_GRID 4096

typedef struct roi_args {
    int64_t oh, ow, sr;
    float scale;
    bool half_pixel, is_max;
} roi_args;

static int roi_check(mts_kctx *k, roi_args *a)
{
    const mts_tensor *x, *rois, *bi;
    int rc;
    char s0[160], s1[160], s2[160];
    if ((rc = req_in(k, 0, "X", &x)) || (rc = req_in(k, 1, "rois", &rois)) ||
        (rc = req_in(k, 2, "batch_indices", &bi)) || (rc = mts_kchk_n_out(k, 1)) ||
        (rc = chk_index_dtype(k, bi, "batch_indices")))
        return rc;
    if (x->dtype != MTS_DTYPE_FLOAT || rois->dtype != MTS_DTYPE_FLOAT)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "RoiAlign supports float X and rois only, got %s and %s",
                           mts_dtype_name(x->dtype), mts_dtype_name(rois->dtype));
    if (x->rank != 4 || rois->rank != 2 || rois->dims[1] != 4 || bi->rank != 1 || bi->dims[0] != rois->dims[0])
        return mts_err_set(k->err, MTS_ESHAPE, "RoiAlign needs X [N,C,H,W], rois [R,4], batch_indices [R]; got %s, %s, %s",
                           mts_shape_str(x, s0, sizeof s0), mts_shape_str(rois, s1, sizeof s1),
                           mts_shape_str(bi, s2, sizeof s2));
    a->oh = mts_attr_int(k->node, "output_height", 1);
    a->ow = mts_attr_int(k->node, "output_width", 1);
    a->sr = mts_attr_int(k->node, "sampling_ratio", 0);
    a->scale = mts_attr_float(k->node, "spatial_scale", 1.0f);
    if (a->oh < 1 || a->ow < 1 || a->oh > (1 << 20) || a->ow > (1 << 20))
        return mts_err_set(k->err, MTS_EINVAL, "output_height %lld and output_width %lld must be positive",
                           (long long)a->oh, (long long)a->ow);
    if (a->sr < 0 || a->sr > ROI_MAX_GRID)
        return mts_err_set(k->err, MTS_EINVAL, "sampling_ratio %lld must be in [0, %d]", (long long)a->sr,
                           ROI_MAX_GRID);
    if (!isfinite(a->scale)) return mts_err_set(k->err, MTS_EINVAL, "spatial_scale must be finite");
    const char *mode = mts_attr_string(k->node, "mode", "avg");
    if (strcmp(mode, "avg") && strcmp(mode, "max"))
        return mts_err_set(k->err, MTS_EINVAL, "mode '%s' must be avg or max", mode);
    a->is_max = strcmp(mode, "max") == 0;
    a->half_pixel = false;
    if (k->node->opset >= 16) {
        const char *ct = mts_attr_string(k->node, "coordinate_transformation_mode", "half_pixel");
        if (strcmp(ct, "half_pixel") == 0) a->half_pixel = true;
        else if (strcmp(ct, "output_half_pixel") != 0)
            return mts_err_set(k->err, MTS_EINVAL, "coordinate_transformation_mode '%s' is not valid", ct);
    }
    return MTS_OK;
}

static int roi_infer(mts_kctx *k)
{
    roi_args a;
    int rc = roi_check(k, &a);
    if (rc) return rc;
    int64_t d[4] = {k->in[1]->dims[0], k->in[0]->dims[1], a.oh, a.ow};
    return mts_kset_out(k, 0, MTS_DTYPE_FLOAT, 4, d);
}

/* The four taps (offsets into an H x W plane) and weights of a bilinear read at (y, x); ok is
 * false outside [-1, H] x [-1, W], where the sample counts as 0. */
typedef struct roi_pt {
    int64_t o[4];
    float w[4];
    bool ok;
} roi_pt;

static roi_pt roi_point(float y, float x, int64_t H, int64_t W)
{
    roi_pt p = {{0, 0, 0, 0}, {0, 0, 0, 0}, false};
    if (!(y >= -1.0f && y <= (float)H && x >= -1.0f && x <= (float)W)) return p;
    if (y <= 0) y = 0;
    if (x <= 0) x = 0;
    int64_t yl = (int64_t)y, xl = (int64_t)x, yh, xh;
    if (yl >= H - 1) {
        yh = yl = H - 1;
        y = (float)yl;
    } else {
        yh = yl + 1;
    }
    if (xl >= W - 1) {
        xh = xl = W - 1;
        x = (float)xl;
    } else {
        xh = xl + 1;
    }
    float ly = y - (float)yl, lx = x - (float)xl, hy = 1.0f - ly, hx = 1.0f - lx;
    p.o[0] = yl * W + xl;
    p.o[1] = yl * W + xh;
    p.o[2] = yh * W + xl;
    p.o[3] = yh * W + xh;
    p.w[0] = hy * hx;
    p.w[1] = hy * lx;
    p.w[2] = ly * hx;
    p.w[3] = ly * lx;
    p.ok = true;
    return p;
}

/* One roi's sampling geometry, validated before the parallel part. */
typedef struct roi_geom {
    int64_t b, gh, gw, cnt;
    float sw, sh, bw, bh;
} roi_geom;

typedef struct roi_job {
    const roi_args *a;
    const roi_geom *g;
    const float *X;
    float *Y;
    int64_t C, H, W, units; /* units: R * C planes */
} roi_job;

static void roi_part(void *ctx, int ithr, int nthr)
{
    const roi_job *j = ctx;
    const roi_args *a = j->a;
    int64_t u0 = j->units * ithr / nthr, u1 = j->units * (ithr + 1) / nthr;
    for (int64_t u = u0; u < u1; u++) {
        int64_t r = u / j->C, c = u % j->C;
        const roi_geom *q = &j->g[r];
        const float *P = j->X + (q->b * j->C + c) * j->H * j->W;
        float *O = j->Y + u * a->oh * a->ow;
        for (int64_t ph = 0; ph < a->oh; ph++)
            for (int64_t pw = 0; pw < a->ow; pw++) {
                double acc = 0;
                float mx = 0;
                bool first = true;
                for (int64_t iy = 0; iy < q->gh; iy++) {
                    float yy = q->sh + (float)ph * q->bh + ((float)iy + 0.5f) * q->bh / (float)q->gh;
                    for (int64_t ix = 0; ix < q->gw; ix++) {
                        float xx = q->sw + (float)pw * q->bw + ((float)ix + 0.5f) * q->bw / (float)q->gw;
                        roi_pt p = roi_point(yy, xx, j->H, j->W);
                        if (!a->is_max) {
                            if (p.ok)
                                acc += p.w[0] * P[p.o[0]] + p.w[1] * P[p.o[1]] + p.w[2] * P[p.o[2]] +
                                       p.w[3] * P[p.o[3]];
                            continue;
                        }
                        float v = 0;
                        if (p.ok)
                            v = fmaxf(fmaxf(p.w[0] * P[p.o[0]], p.w[1] * P[p.o[1]]),
                                      fmaxf(p.w[2] * P[p.o[2]], p.w[3] * P[p.o[3]]));
                        if (first || v > mx) mx = v;
                        first = false;
                    }
                }
                O[ph * a->ow + pw] = a->is_max ? mx : (float)(acc / (double)q->cnt);
            }
    }
}

static int roi_run(mts_kctx *k)
{
    roi_args a;
    int rc = roi_check(k, &a);
    if (rc) return rc;
    const mts_tensor *x = k->in[0], *rois = k->in[1], *bi = k->in[2];
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3], R = rois->dims[0];
    if (R == 0 || C == 0) return MTS_OK;
    if (H == 0 || W == 0) return mts_err_set(k->err, MTS_EINVAL, "RoiAlign input has an empty spatial plane");
    const float *rv = rois->data;
    float off = a.half_pixel ? 0.5f : 0.0f;
    roi_geom *g = malloc(sizeof(roi_geom) * (size_t)R);
    if (!g) return mts_err_set(k->err, MTS_ENOMEM, "RoiAlign: no memory for %lld rois", (long long)R);
    for (int64_t r = 0; r < R; r++) {
        roi_geom *q = &g[r];
        int64_t bv = idx_at(bi, r);
        if (bv < 0 || bv >= N) {
            free(g);
            return mts_err_set(k->err, MTS_EINVAL, "batch_indices[%lld] = %lld is out of range for N = %lld",
                               (long long)r, (long long)bv, (long long)N);
        }
        q->b = bv;
        const float *p = rv + r * 4;
        q->sw = p[0] * a.scale - off;
        q->sh = p[1] * a.scale - off;
        float rw = p[2] * a.scale - off - q->sw, rh = p[3] * a.scale - off - q->sh;
        if (!a.half_pixel) {
            rw = fmaxf(rw, 1.0f);
            rh = fmaxf(rh, 1.0f);
        }
        if (!isfinite(q->sw) || !isfinite(q->sh) || !isfinite(rw) || !isfinite(rh)) {
            free(g);
            return mts_err_set(k->err, MTS_EINVAL, "roi %lld has non-finite coordinates", (long long)r);
        }
        q->bh = rh / (float)a.oh;
        q->bw = rw / (float)a.ow;
        double gh = a.sr > 0 ? (double)a.sr : ceil((double)rh / (double)a.oh);
        double gw = a.sr > 0 ? (double)a.sr : ceil((double)rw / (double)a.ow);
        if (gh > ROI_MAX_GRID || gw > ROI_MAX_GRID) {
            free(g);
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "roi %lld needs a sampling grid above %d per bin",
                               (long long)r, ROI_MAX_GRID);
        }
        q->gh = gh > 0 ? (int64_t)gh : 0;
        q->gw = gw > 0 ? (int64_t)gw : 0;
        q->cnt = q->gh * q->gw > 1 ? q->gh * q->gw : 1;
    }
    roi_job j = {&a, g, x->data, k->out[0].data, C, H, W, R * C};
    int nthr = k->threads;
    if (j.units < nthr) nthr = (int)j.units;
    if (j.units * a.oh * a.ow < 1024) nthr = 1;
    mts_parallel(nthr, roi_part, &j);
    free(g);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* GridSample                                                                                  */
/* ------------------------------------------------------------------------------------------ */

enum { GS_BILINEAR, GS_NEAREST, GS_BICUBIC };
enum { GS_ZEROS, GS_BORDER, GS_REFLECTION };

typedef struct gs_args {
    int mode, pad;
    bool align;
} gs_args;

static int gs_check(mts_kctx *k, gs_args *a)
{
    const mts_tensor *x, *g;
    int rc;
    char s0[160], s1[160];
    if ((rc = req_in(k, 0, "X", &x)) || (rc = req_in(k, 1, "grid", &g)) || (rc = mts_kchk_n_out(k, 1))) return rc;
    if (x->dtype != MTS_DTYPE_FLOAT || g->dtype != MTS_DTYPE_FLOAT)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "GridSample supports float X and grid only, got %s and %s",
                           mts_dtype_name(x->dtype), mts_dtype_name(g->dtype));
    if (x->rank != 4 || g->rank != 4 || g->dims[0] != x->dims[0] || g->dims[3] != 2)
        return mts_err_set(k->err, x->rank == 5 ? MTS_EUNSUPPORTED : MTS_ESHAPE,
                           "GridSample needs X [N,C,H,W] and grid [N,Ho,Wo,2] (2-D sampling only); got %s and %s",
                           mts_shape_str(x, s0, sizeof s0), mts_shape_str(g, s1, sizeof s1));
    const char *m = mts_attr_string(k->node, "mode", "bilinear"), *p = mts_attr_string(k->node, "padding_mode", "zeros");
    if (!strcmp(m, "bilinear") || !strcmp(m, "linear")) a->mode = GS_BILINEAR;
    else if (!strcmp(m, "nearest")) a->mode = GS_NEAREST;
    else if (!strcmp(m, "bicubic") || !strcmp(m, "cubic")) a->mode = GS_BICUBIC;
    else return mts_err_set(k->err, MTS_EINVAL, "GridSample mode '%s' is not valid", m);
    if (!strcmp(p, "zeros")) a->pad = GS_ZEROS;
    else if (!strcmp(p, "border")) a->pad = GS_BORDER;
    else if (!strcmp(p, "reflection")) a->pad = GS_REFLECTION;
    else return mts_err_set(k->err, MTS_EINVAL, "GridSample padding_mode '%s' is not valid", p);
    a->align = mts_attr_int(k->node, "align_corners", 0) != 0;
    return MTS_OK;
}

static int gs_infer(mts_kctx *k)
{
    gs_args a;
    int rc = gs_check(k, &a);
    if (rc) return rc;
    int64_t d[4] = {k->in[0]->dims[0], k->in[0]->dims[1], k->in[1]->dims[1], k->in[1]->dims[2]};
    return mts_kset_out(k, 0, MTS_DTYPE_FLOAT, 4, d);
}

/* Reflects x into [lo, hi] (the coordinate range of the padding). */
static double gs_reflect(double x, double lo, double hi)
{
    double range = hi - lo;
    if (!(range > 0)) return lo;
    if (x >= lo && x <= hi) return x;
    double d = x < lo ? lo - x : x - hi;
    double n = floor(d / range), r = d - n * range;
    bool even = fmod(n, 2.0) == 0.0;
    double v = x < lo ? (even ? lo + r : hi - r) : (even ? hi - r : lo + r);
    return v < lo ? lo : (v > hi ? hi : v); /* rounding at huge |x| may leave the range */
}

typedef struct gs_plane {
    const float *p;
    int64_t H, W;
    const gs_args *a;
    double lo_x, hi_x, lo_y, hi_y;
} gs_plane;

static float gs_pixel(const gs_plane *g, int64_t r, int64_t c)
{
    if (g->a->pad == GS_ZEROS) {
        if (r < 0 || r >= g->H || c < 0 || c >= g->W) return 0.0f;
    } else if (g->a->pad == GS_BORDER) {
        c = c < 0 ? 0 : (c >= g->W ? g->W - 1 : c);
        r = r < 0 ? 0 : (r >= g->H ? g->H - 1 : r);
    } else {
        c = (int64_t)gs_reflect((double)c, g->lo_x, g->hi_x);
        r = (int64_t)gs_reflect((double)r, g->lo_y, g->hi_y);
        c = c < 0 ? 0 : (c >= g->W ? g->W - 1 : c);
        r = r < 0 ? 0 : (r >= g->H ? g->H - 1 : r);
    }
    return g->p[r * g->W + c];
}

static void gs_cubic_coeffs(double t, double *c)
{
    const double A = -0.75;
    double x = fabs(t);
    c[0] = ((A * (x + 1) - 5 * A) * (x + 1) + 8 * A) * (x + 1) - 4 * A;
    c[1] = ((A + 2) * x - (A + 3)) * x * x + 1;
    c[2] = ((A + 2) * (1 - x) - (A + 3)) * (1 - x) * (1 - x) + 1;
    c[3] = ((A * (2 - x) - 5 * A) * (2 - x) + 8 * A) * (2 - x) - 4 * A;
}

static float gs_sample(const gs_plane *g, double nx, double ny)
{
    const gs_args *a = g->a;
    double W = (double)g->W, H = (double)g->H;
    double x = a->align ? (nx + 1) / 2 * (W - 1) : ((nx + 1) * W - 1) / 2;
    double y = a->align ? (ny + 1) / 2 * (H - 1) : ((ny + 1) * H - 1) / 2;
    if (isnan(x) || isnan(y)) return NAN;
    /* far-away coordinates read only padding: keep them in a range where conversions are exact */
    double lim_x = 4 * W + 8, lim_y = 4 * H + 8;
    if (a->pad != GS_REFLECTION) {
        x = x < -lim_x ? -lim_x : (x > lim_x ? lim_x : x);
        y = y < -lim_y ? -lim_y : (y > lim_y ? lim_y : y);
    }
    if (a->mode == GS_NEAREST) {
        x = nearbyint(x);
        y = nearbyint(y);
    }
    if (x < g->lo_x || x > g->hi_x || y < g->lo_y || y > g->hi_y) {
        if (a->pad == GS_BORDER && a->mode != GS_BICUBIC) { /* bicubic clamps each tap instead */
            x = x < 0 ? 0 : (x > W - 1 ? W - 1 : x);
            y = y < 0 ? 0 : (y > H - 1 ? H - 1 : y);
        } else if (a->pad == GS_REFLECTION) {
            x = gs_reflect(x, g->lo_x, g->hi_x);
            y = gs_reflect(y, g->lo_y, g->hi_y);
        }
    }
    if (!isfinite(x) || !isfinite(y)) return NAN;
    if (a->mode == GS_NEAREST) return gs_pixel(g, (int64_t)y, (int64_t)x);
    if (a->mode == GS_BILINEAR) {
        double fx = floor(x), fy = floor(y);
        int64_t x1 = (int64_t)fx, y1 = (int64_t)fy;
        double dx1 = x - fx, dx2 = 1 - dx1, dy1 = y - fy, dy2 = 1 - dy1;
        double p11 = gs_pixel(g, y1, x1), p12 = gs_pixel(g, y1, x1 + 1);
        double p21 = gs_pixel(g, y1 + 1, x1), p22 = gs_pixel(g, y1 + 1, x1 + 1);
        return (float)(dy2 * (dx2 * p11 + dx1 * p12) + dy1 * (dx2 * p21 + dx1 * p22));
    }
    double fx = floor(x), fy = floor(y);
    int64_t x0 = (int64_t)fx - 1, y0 = (int64_t)fy - 1;
    double cx[4], cy[4], v = 0;
    gs_cubic_coeffs(x - fx, cx);
    gs_cubic_coeffs(y - fy, cy);
    for (int i = 0; i < 4; i++) {
        double row = 0;
        for (int j = 0; j < 4; j++) row += cx[j] * gs_pixel(g, y0 + i, x0 + j);
        v += cy[i] * row;
    }
    return (float)v;
}

typedef struct gs_job {
    const gs_args *a;
    const float *X, *G;
    float *Y;
    int64_t C, H, W, Ho, Wo;
    int64_t units; /* N * C * Ho output rows */
} gs_job;

static void gs_part(void *ctx, int ithr, int nthr)
{
    const gs_job *j = ctx;
    int64_t u0 = j->units * ithr / nthr, u1 = j->units * (ithr + 1) / nthr;
    gs_plane g = {NULL, j->H, j->W, j->a, 0, 0, 0, 0};
    bool al = j->a->align;
    g.lo_x = al ? 0 : -0.5;
    g.hi_x = al ? (double)j->W - 1 : (double)j->W - 0.5;
    g.lo_y = al ? 0 : -0.5;
    g.hi_y = al ? (double)j->H - 1 : (double)j->H - 0.5;
    for (int64_t u = u0; u < u1; u++) {
        int64_t row = u % j->Ho, nc = u / j->Ho, n = nc / j->C;
        g.p = j->X + nc * j->H * j->W;
        const float *G = j->G + (n * j->Ho + row) * j->Wo * 2;
        float *O = j->Y + (nc * j->Ho + row) * j->Wo;
        for (int64_t i = 0; i < j->Wo; i++) O[i] = gs_sample(&g, G[2 * i], G[2 * i + 1]);
    }
}

static int gs_run(mts_kctx *k)
{
    gs_args a;
    int rc = gs_check(k, &a);
    if (rc) return rc;
    const mts_tensor *x = k->in[0], *gr = k->in[1];
    int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
    gs_job j = {&a, x->data, gr->data, k->out[0].data, C, H, W, gr->dims[1], gr->dims[2], N * C * gr->dims[1]};
    if (H == 0 || W == 0) { /* nothing to sample: every point reads padding */
        int64_t nb = mts_tensor_nbytes(&k->out[0]);
        if (nb > 0) memset(j.Y, 0, (size_t)nb);
        return MTS_OK;
    }
    if (j.units == 0 || j.Wo == 0) return MTS_OK;
    int nthr = k->threads;
    if (j.units < nthr) nthr = (int)j.units;
    if (j.units * j.Wo < 4096) nthr = 1;
    mts_parallel(nthr, gs_part, &j);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* MaxUnpool                                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* d: the output shape; dd: the shape MaxPool's indices refer to (the one the attributes give). */
static int unpool_shape(mts_kctx *k, int64_t *d, int64_t *dd, int *rank)
{
    const mts_tensor *x, *ind;
    int rc;
    char s0[160], s1[160];
    if ((rc = req_in(k, 0, "X", &x)) || (rc = req_in(k, 1, "I", &ind)) || (rc = mts_kchk_n_out(k, 1)) ||
        (rc = chk_dtype(k, x, "X")))
        return rc;
    if (ind->dtype != MTS_DTYPE_INT64) return mts_err_set(k->err, MTS_EINVAL, "MaxUnpool indices must be int64");
    if (x->rank < 3 || !mts_shape_equal(x, ind))
        return mts_err_set(k->err, MTS_ESHAPE, "MaxUnpool X %s and I %s must share a shape of rank >= 3",
                           mts_shape_str(x, s0, sizeof s0), mts_shape_str(ind, s1, sizeof s1));
    int nsp = x->rank - 2, nk = 0, np = 0, ns = 0;
    const int64_t *ks = mts_attr_ints(k->node, "kernel_shape", &nk), *pads = mts_attr_ints(k->node, "pads", &np);
    const int64_t *st = mts_attr_ints(k->node, "strides", &ns);
    if (!ks || nk != nsp || (pads && np != 2 * nsp) || (st && ns != nsp))
        return mts_err_set(k->err, MTS_EINVAL, "MaxUnpool kernel_shape / pads / strides do not fit %d spatial dims",
                           nsp);
    *rank = x->rank;
    dd[0] = x->dims[0];
    dd[1] = x->dims[1];
    for (int i = 0; i < nsp; i++) {
        int64_t s = st ? st[i] : 1, kk = ks[i], pb = pads ? pads[i] : 0, pe = pads ? pads[nsp + i] : 0;
        if (s < 1 || kk < 1 || pb < 0 || pe < 0 || s > (1 << 20) || kk > (1 << 20) || pb > (1 << 20) ||
            pe > (1 << 20))
            return mts_err_set(k->err, MTS_EINVAL, "MaxUnpool kernel, stride or pad of axis %d is out of range", i);
        dd[2 + i] = (x->dims[2 + i] - 1) * s + kk - pb - pe;
        if (x->dims[2 + i] == 0) dd[2 + i] = 0;
        if (dd[2 + i] < 0)
            return mts_err_set(k->err, MTS_ESHAPE, "MaxUnpool output axis %d would be negative", 2 + i);
    }
    memcpy(d, dd, sizeof(int64_t) * (size_t)x->rank);
    const mts_tensor *os = mts_kin(k, 2);
    if (os) {
        if ((os->dtype != MTS_DTYPE_INT64 && os->dtype != MTS_DTYPE_INT32) || os->rank != 1 ||
            os->dims[0] != x->rank)
            return mts_err_set(k->err, MTS_EINVAL, "MaxUnpool output_shape must be a 1-D integer tensor of %d values",
                               x->rank);
        if (!os->data) return MTS_EDYNAMIC;
        for (int i = 0; i < x->rank; i++) d[i] = idx_at(os, i);
        if (d[0] != x->dims[0] || d[1] != x->dims[1])
            return mts_err_set(k->err, MTS_ESHAPE, "MaxUnpool output_shape must keep N and C of X");
    }
    return MTS_OK;
}

static int unpool_infer(mts_kctx *k)
{
    int64_t d[MTS_MAX_RANK], dd[MTS_MAX_RANK];
    int rank, rc = unpool_shape(k, d, dd, &rank);
    if (rc) return rc;
    return mts_kset_out(k, 0, k->in[0]->dtype, rank, d);
}

static int unpool_run(mts_kctx *k)
{
    int64_t d[MTS_MAX_RANK], dd[MTS_MAX_RANK];
    int rank, rc = unpool_shape(k, d, dd, &rank);
    if (rc) return rc;
    const mts_tensor *x = k->in[0], *ind = k->in[1];
    mts_tensor *y = &k->out[0];
    size_t es = mts_dtype_size(x->dtype);
    int64_t nb = mts_tensor_nbytes(y), n = mts_tensor_numel(x), dtotal = prod(dd, 0, rank);
    if (nb > 0) memset(y->data, 0, (size_t)nb);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = ((const int64_t *)ind->data)[i];
        if (v < 0 || v >= dtotal)
            return mts_err_set(k->err, MTS_EINVAL, "MaxUnpool index %lld (at %lld) is outside the pooled input's "
                               "%lld elements", (long long)v, (long long)i, (long long)dtotal);
        /* the index counts positions of shape dd; place the value at the same coordinates of d */
        int64_t rem = v, off = 0, mul = 1;
        for (int a = rank - 1; a >= 0; a--) {
            int64_t c = rem % dd[a];
            rem /= dd[a];
            if (c >= d[a])
                return mts_err_set(k->err, MTS_EINVAL, "MaxUnpool index %lld falls outside output_shape", (long long)v);
            off += c * mul;
            mul *= d[a];
        }
        memcpy((uint8_t *)y->data + off * (int64_t)es, (const uint8_t *)x->data + i * (int64_t)es, es);
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Unique                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct uniq_ctx {
    const uint8_t *x;
    int64_t outer, dim, inner, es;
    mts_dtype dt;
} uniq_ctx;

/* Lexicographic order of slices a and b along the axis (outer index major). */
static int uniq_cmp(const void *cv, int64_t a, int64_t b)
{
    const uniq_ctx *c = cv;
    for (int64_t o = 0; o < c->outer; o++)
        for (int64_t i = 0; i < c->inner; i++) {
            const uint8_t *pa = c->x + ((o * c->dim + a) * c->inner + i) * c->es;
            const uint8_t *pb = c->x + ((o * c->dim + b) * c->inner + i) * c->es;
            int r = cmp_elem(pa, pb, c->dt);
            if (r) return r;
        }
    return 0;
}

static int uniq_first_cmp(const void *cv, int64_t a, int64_t b)
{
    const int64_t *first = cv;
    return first[a] < first[b] ? -1 : first[a] > first[b];
}

typedef struct uniq_res {
    int64_t n, nu;
    int64_t *first;   /* per unique entry (output order): first occurrence */
    int64_t *count;   /* per unique entry */
    int64_t *inverse; /* per input slice: its unique entry */
    int axis;         /* -1: flattened */
    uniq_ctx c;
} uniq_res;

static void uniq_free(uniq_res *r)
{
    free(r->first);
}

static int uniq_exec(mts_kctx *k, uniq_res *r)
{
    const mts_tensor *x;
    int rc;
    memset(r, 0, sizeof *r);
    if ((rc = req_in(k, 0, "X", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "X"))) return rc;
    if (!dtype_numeric(x->dtype))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Unique of %s is not supported", mts_dtype_name(x->dtype));
    r->axis = -1;
    if (mts_node_attr(k->node, "axis")) {
        if (x->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "Unique with an axis needs rank >= 1");
        if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), x->rank, &r->axis, k->err))) return rc;
    }
    int64_t numel = mts_tensor_numel(x);
    if (numel > 0 && !x->data) return MTS_EDYNAMIC;
    r->c.x = x->data;
    r->c.es = (int64_t)mts_dtype_size(x->dtype);
    r->c.dt = x->dtype;
    if (r->axis < 0) {
        r->c.outer = 1;
        r->c.dim = numel;
        r->c.inner = 1;
    } else {
        r->c.outer = prod(x->dims, 0, r->axis);
        r->c.dim = x->dims[r->axis];
        r->c.inner = prod(x->dims, r->axis + 1, x->rank);
    }
    int64_t n = r->n = r->c.dim;
    /* first, count, inverse, order, tmp, group */
    r->first = malloc(sizeof(int64_t) * (size_t)(6 * n + 1));
    if (!r->first) return mts_err_set(k->err, MTS_ENOMEM, "Unique: no memory for %lld entries", (long long)n);
    r->count = r->first + n;
    r->inverse = r->count + n;
    int64_t *order = r->inverse + n, *tmp = order + n, *grp = tmp + n;
    for (int64_t i = 0; i < n; i++) order[i] = i;
    if (r->c.outer * r->c.inner > 0) msort_idx(order, tmp, n, uniq_cmp, &r->c);
    int64_t nu = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || (r->c.outer * r->c.inner > 0 && uniq_cmp(&r->c, order[i - 1], order[i]) != 0)) {
            r->first[nu] = order[i];
            r->count[nu] = 0;
            nu++;
        }
        r->count[nu - 1]++;
        r->inverse[order[i]] = nu - 1;
    }
    r->nu = nu;
    if (!mts_attr_int(k->node, "sorted", 1) && nu > 1) { /* order of first occurrence */
        for (int64_t u = 0; u < nu; u++) grp[u] = u;
        msort_idx(grp, tmp, nu, uniq_first_cmp, r->first);
        int64_t *pos = order; /* old entry -> new position */
        for (int64_t u = 0; u < nu; u++) pos[grp[u]] = u;
        for (int64_t u = 0; u < nu; u++) tmp[u] = r->first[grp[u]];
        memcpy(r->first, tmp, sizeof(int64_t) * (size_t)nu);
        for (int64_t u = 0; u < nu; u++) tmp[u] = r->count[grp[u]];
        memcpy(r->count, tmp, sizeof(int64_t) * (size_t)nu);
        for (int64_t i = 0; i < n; i++) r->inverse[i] = pos[r->inverse[i]];
    }
    return MTS_OK;
}

static int unique_infer(mts_kctx *k)
{
    uniq_res r;
    int rc = uniq_exec(k, &r);
    if (rc) {
        uniq_free(&r);
        return rc;
    }
    const mts_tensor *x = k->in[0];
    int64_t d[MTS_MAX_RANK];
    if (r.axis < 0) {
        rc = mts_kset_out(k, 0, x->dtype, 1, &r.nu);
    } else {
        memcpy(d, x->dims, sizeof d);
        d[r.axis] = r.nu;
        rc = mts_kset_out(k, 0, x->dtype, x->rank, d);
    }
    if (!rc) rc = mts_kset_out(k, 1, MTS_DTYPE_INT64, 1, &r.nu);
    if (!rc) rc = mts_kset_out(k, 2, MTS_DTYPE_INT64, 1, &r.n);
    if (!rc) rc = mts_kset_out(k, 3, MTS_DTYPE_INT64, 1, &r.nu);
    uniq_free(&r);
    return rc;
}

static int unique_run(mts_kctx *k)
{
    uniq_res r;
    int rc = uniq_exec(k, &r);
    if (rc) {
        uniq_free(&r);
        return rc;
    }
    if (k->out[0].dims[r.axis < 0 ? 0 : r.axis] != r.nu) {
        uniq_free(&r);
        return mts_err_set(k->err, MTS_EINVAL, "Unique output was sized for other data");
    }
    uint8_t *y = k->out[0].data;
    int64_t es = r.c.es, inner = r.c.inner * es;
    for (int64_t o = 0; o < r.c.outer; o++)
        for (int64_t u = 0; u < r.nu; u++)
            if (inner > 0)
                memcpy(y + (o * r.nu + u) * inner, r.c.x + (o * r.c.dim + r.first[u]) * inner, (size_t)inner);
    if (k->n_out > 1 && k->out[1].data) memcpy(k->out[1].data, r.first, sizeof(int64_t) * (size_t)r.nu);
    if (k->n_out > 2 && k->out[2].data) memcpy(k->out[2].data, r.inverse, sizeof(int64_t) * (size_t)r.n);
    if (k->n_out > 3 && k->out[3].data) memcpy(k->out[3].data, r.count, sizeof(int64_t) * (size_t)r.nu);
    uniq_free(&r);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Op table                                                                                    */
/* ------------------------------------------------------------------------------------------ */

const mts_op mts_ref_ops_index[] = {
    {"TopK", topk_infer, topk_run},
    {"ScatterND", scatternd_infer, scatternd_run},
    {"ScatterElements", scatterel_infer, scatterel_run},
    {"Scatter", scatterel_infer, scatterel_run},
    {"GatherND", gathernd_infer, gathernd_run},
    {"CumSum", cumsum_infer, cumsum_run},
    {"NonZero", nonzero_infer, nonzero_run},
    {"OneHot", onehot_infer, onehot_run},
    {"DepthToSpace", d2s_infer, d2s_run},
    {"SpaceToDepth", s2d_infer, s2d_run},
    {"Trilu", trilu_infer, trilu_run},
    {"Hardmax", hardmax_infer, hardmax_run},
    {"EyeLike", eyelike_infer, eyelike_run},
    {"Compress", compress_infer, compress_run},
    {"ReverseSequence", revseq_infer, revseq_run},
    {"Einsum", einsum_infer, einsum_run},
    {"NonMaxSuppression", nms_infer, nms_run},
    {"RoiAlign", roi_infer, roi_run},
    {"GridSample", gs_infer, gs_run},
    {"MaxUnpool", unpool_infer, unpool_run},
    {"Unique", unique_infer, unique_run},
    {NULL, NULL, NULL},
};
