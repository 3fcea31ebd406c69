/*
 * Quantized ops: QuantizeLinear and DequantizeLinear (per-tensor and per-axis scales and zero
 * points, uint8/int8, int32 input for DequantizeLinear, rounding half to even with saturation),
 * DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv.
 *
 * The products are exact integer arithmetic: (x - x_zero_point) * (w - w_zero_point) summed in
 * int32 (modulo 2^32 on overflow); QLinearMatMul and QLinearConv then requantize in float as the
 * spec defines, y = saturate(round_half_even(acc * x_scale * w_scale / y_scale) + y_zero_point).
 *
 * Each of the four product ops has two run functions over the same validation and the same
 * requantization: the reference one (plain loops on int16 copies of the operands, what the
 * reference backend runs) and the fast one (the packed u8 x s8 GEMM of qgemm.h, AVX-512 VNNI
 * where the CPU has it), which the quant backend (quant_backend.c) substitutes in plans of the
 * default backend.
 *
 * Not supported (MTS_EUNSUPPORTED with a message): the float8, int4, int16 and float16 types
 * of opsets 19 to 21, blocked quantization (block_size), and zero points or scales of shapes
 * other than per-tensor and the per-axis / per-row / per-column / per-channel forms of the spec.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"
#include "engine/kernels/qgemm.h"

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define QR_SSE2 1
#endif

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int req(mts_kctx *k, int i, const char *name, const mts_tensor **out)
{
    *out = mts_kin(k, i);
    if (!*out) return mts_err_set(k->err, MTS_EINVAL, "missing required input %d (%s)", i, name);
    return MTS_OK;
}

static bool is_q8(mts_dtype t)
{
    return t == MTS_DTYPE_UINT8 || t == MTS_DTYPE_INT8;
}

static int need_q8(mts_kctx *k, const mts_tensor *t, const char *name)
{
    if (is_q8(t->dtype)) return MTS_OK;
    return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s has type %s; only uint8 and int8 are supported", name,
                       mts_dtype_name(t->dtype));
}

static int need_type(mts_kctx *k, const mts_tensor *t, mts_dtype want, const char *name)
{
    if (t->dtype == want) return MTS_OK;
    return mts_err_set(k->err, mts_dtype_supported(t->dtype) ? MTS_EINVAL : MTS_EUNSUPPORTED,
                       "%s has type %s, expected %s", name, mts_dtype_name(t->dtype), mts_dtype_name(want));
}

static int chk_outs(mts_kctx *k, int n)
{
    if (k->n_out != n)
        return mts_err_set(k->err, MTS_EINVAL, "expected %d output(s), got %d", n, k->n_out);
    return MTS_OK;
}

/* A scale or zero point: per-tensor (one element, any rank) or, when n > 0, a 1-D tensor of n
 * elements (per axis, row, column or channel). *vec tells which. */
static int chk_param(mts_kctx *k, const mts_tensor *t, const char *name, int64_t n, bool *vec)
{
    int64_t ne = mts_tensor_numel(t);
    *vec = false;
    if (ne == 1 && t->rank <= 1) return MTS_OK;
    if (n > 0 && t->rank == 1 && ne == n) {
        *vec = n != 1;
        return MTS_OK;
    }
    char s[96];
    if (n > 0)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s has shape %s; supported: a scalar or a 1-D tensor of %lld",
                           name, mts_shape_str(t, s, sizeof s), (long long)n);
    return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s has shape %s; only a scalar is supported", name,
                       mts_shape_str(t, s, sizeof s));
}

static inline int32_t q8_get(const void *d, bool is_signed, int64_t i)
{
    return is_signed ? (int32_t)((const int8_t *)d)[i] : (int32_t)((const uint8_t *)d)[i];
}

/* Element i of a zero point (NULL: 0; one element: every index). */
static inline int32_t zp_at(const mts_tensor *t, int64_t i)
{
    if (!t) return 0;
    if (t->dtype == MTS_DTYPE_INT32) return ((const int32_t *)t->data)[mts_tensor_numel(t) == 1 ? 0 : i];
    return q8_get(t->data, t->dtype == MTS_DTYPE_INT8, mts_tensor_numel(t) == 1 ? 0 : i);
}

static inline float sc_at(const mts_tensor *t, int64_t i)
{
    return ((const float *)t->data)[mts_tensor_numel(t) == 1 ? 0 : i];
}

/* round_half_even(v) + zp saturated to [lo, hi]; NaN gives lo. The rounding adds and subtracts
 * 1.5 * 2^23 (exact half-to-even in the default rounding mode for |v| < 2^22), after clamping v
 * to +-2^21, beyond which every result saturates; it needs no libm call, so loops vectorize. */
static inline int32_t sat_round(float v, int32_t zp, int32_t lo, int32_t hi)
{
    v = v > -2097152.0f ? v : -2097152.0f; /* NaN: the lower bound */
    v = v < 2097152.0f ? v : 2097152.0f;
    float r = (v + 12582912.0f) - 12582912.0f + (float)zp;
    r = r > (float)lo ? r : (float)lo;
    r = r < (float)hi ? r : (float)hi;
    return (int32_t)r;
}

static inline void q8_store(void *d, bool is_signed, int64_t i, float v, int32_t zp)
{
    if (is_signed) ((int8_t *)d)[i] = (int8_t)sat_round(v, zp, -128, 127);
    else ((uint8_t *)d)[i] = (uint8_t)sat_round(v, zp, 0, 255);
}

/* y[j] = saturate(round_half_even((acc[j] + bias) * s) + zp) for j < n, into int8 (sgn) or
 * uint8: the requantization of one output row, with the same results as sat_round; with cs,
 * column j's scale is cs[j] instead of s (per-column weight scales). */
static void requant_row_cs(const int32_t *acc, int64_t n, int32_t bias, float s, const float *cs, int32_t zp, bool sgn,
                           void *y)
{
    int64_t j = 0;
#ifdef QR_SSE2
    const __m128 lo = _mm_set1_ps(-2097152.0f), hi = _mm_set1_ps(2097152.0f), mg = _mm_set1_ps(12582912.0f);
    const __m128 sv = _mm_set1_ps(s), zv = _mm_set1_ps((float)zp);
    const __m128i bv = _mm_set1_epi32(bias);
    for (; j + 16 <= n; j += 16) {
        __m128i q[4];
        for (int t = 0; t < 4; t++) {
            __m128i a = _mm_add_epi32(_mm_loadu_si128((const __m128i *)(acc + j + 4 * t)), bv);
            __m128 v = _mm_mul_ps(_mm_cvtepi32_ps(a), cs ? _mm_loadu_ps(cs + j + 4 * t) : sv);
            v = _mm_min_ps(_mm_max_ps(v, lo), hi); /* maxps returns lo for NaN */
            v = _mm_add_ps(_mm_sub_ps(_mm_add_ps(v, mg), mg), zv);
            q[t] = _mm_cvtps_epi32(v);
        }
        __m128i h0 = _mm_packs_epi32(q[0], q[1]), h1 = _mm_packs_epi32(q[2], q[3]);
        __m128i r = sgn ? _mm_packs_epi16(h0, h1) : _mm_packus_epi16(h0, h1);
        _mm_storeu_si128((__m128i *)((uint8_t *)y + j), r);
    }
#endif
    for (; j < n; j++) {
        float v = (float)(int32_t)((uint32_t)acc[j] + (uint32_t)bias) * (cs ? cs[j] : s);
        if (sgn) ((int8_t *)y)[j] = (int8_t)sat_round(v, zp, -128, 127);
        else ((uint8_t *)y)[j] = (uint8_t)sat_round(v, zp, 0, 255);
    }
}

static void requant_row(const int32_t *acc, int64_t n, int32_t bias, float s, int32_t zp, bool sgn, void *y)
{
    requant_row_cs(acc, n, bias, s, NULL, zp, sgn, y);
}

static void set_shape(mts_tensor *o, mts_dtype t, const mts_tensor *like)
{
    o->dtype = t;
    o->rank = like->rank;
    memcpy(o->dims, like->dims, sizeof o->dims);
}

/* ------------------------------------------------------------------------------------------ */
/* QuantizeLinear / DequantizeLinear                                                           */
/* ------------------------------------------------------------------------------------------ */

typedef struct qdq_desc {
    const mts_tensor *x, *scale, *zp;
    mts_dtype ydt;
    bool per_axis;
    int64_t outer, axdim, inner; /* x as [outer, axdim, inner] around the quantized axis */
} qdq_desc;

static int qdq_setup(mts_kctx *k, bool quant, qdq_desc *d)
{
    int rc;
    memset(d, 0, sizeof *d);
    if ((rc = chk_outs(k, 1)) || (rc = req(k, 0, "x", &d->x)) || (rc = req(k, 1, "x_scale", &d->scale))) return rc;
    d->zp = mts_kin(k, 2);
    if (mts_attr_int(k->node, "block_size", 0) != 0)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "blocked quantization (block_size) is not supported");
    if ((rc = need_type(k, d->scale, MTS_DTYPE_FLOAT, "the scale"))) return rc;
    if (quant) {
        if (d->x->dtype != MTS_DTYPE_FLOAT && d->x->dtype != MTS_DTYPE_INT32)
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "x has type %s; float and int32 are supported",
                               mts_dtype_name(d->x->dtype));
        int64_t odt = mts_attr_int(k->node, "output_dtype", 0);
        if (odt != 0 && odt != MTS_DTYPE_UINT8 && odt != MTS_DTYPE_INT8)
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "output_dtype %s is not supported (uint8, int8)",
                               mts_dtype_name((mts_dtype)odt));
        d->ydt = d->zp ? d->zp->dtype : odt ? (mts_dtype)odt : MTS_DTYPE_UINT8;
        if (d->zp && (rc = need_q8(k, d->zp, "y_zero_point"))) return rc;
        if (d->zp && odt && odt != d->zp->dtype)
            return mts_err_set(k->err, MTS_EINVAL, "output_dtype %s differs from y_zero_point's type %s",
                               mts_dtype_name((mts_dtype)odt), mts_dtype_name(d->zp->dtype));
    } else {
        d->ydt = MTS_DTYPE_FLOAT;
        if (!is_q8(d->x->dtype) && d->x->dtype != MTS_DTYPE_INT32)
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "x has type %s; uint8, int8 and int32 are supported",
                               mts_dtype_name(d->x->dtype));
        if (d->zp && d->zp->dtype != d->x->dtype)
            return mts_err_set(k->err, MTS_EINVAL, "x_zero_point has type %s, expected %s like x",
                               mts_dtype_name(d->zp->dtype), mts_dtype_name(d->x->dtype));
    }
    /* per-axis only from opset 13, and only when the scale is 1-D with more than one element */
    int64_t ns = mts_tensor_numel(d->scale);
    if (ns < 0) return mts_err_set(k->err, MTS_ESHAPE, "bad scale shape");
    d->outer = mts_tensor_numel(d->x);
    if (d->outer < 0) return mts_err_set(k->err, MTS_ESHAPE, "bad x shape");
    d->axdim = d->inner = 1;
    int64_t n = 0;
    if (d->scale->rank == 1 && ns != 1) {
        if (k->node->opset < 13)
            return mts_err_set(k->err, MTS_EINVAL, "a 1-D scale needs opset 13 (per-axis quantization)");
        int ax;
        if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 1), d->x->rank, &ax, k->err))) return rc;
        n = d->x->dims[ax];
        d->outer = 1;
        for (int i = 0; i < ax; i++) d->outer *= d->x->dims[i];
        for (int i = ax + 1; i < d->x->rank; i++) d->inner *= d->x->dims[i];
        d->axdim = n;
        d->per_axis = true;
    }
    bool v;
    if ((rc = chk_param(k, d->scale, "the scale", n, &v))) return rc;
    if (d->zp) {
        if ((rc = chk_param(k, d->zp, "the zero point", n, &v))) return rc;
        if (d->per_axis && mts_tensor_numel(d->zp) != n)
            return mts_err_set(k->err, MTS_ESHAPE, "the zero point has %lld elements, the scale %lld",
                               (long long)mts_tensor_numel(d->zp), (long long)n);
    }
    if (!d->per_axis) d->axdim = 1, d->inner = 1;
    return MTS_OK;
}

static int quant_infer(mts_kctx *k)
{
    qdq_desc d;
    int rc = qdq_setup(k, true, &d);
    if (rc) return rc;
    set_shape(&k->out[0], d.ydt, d.x);
    return MTS_OK;
}

static int dequant_infer(mts_kctx *k)
{
    qdq_desc d;
    int rc = qdq_setup(k, false, &d);
    if (rc) return rc;
    set_shape(&k->out[0], MTS_DTYPE_FLOAT, d.x);
    return MTS_OK;
}

typedef struct qdq_job {
    const qdq_desc *d;
    void *y;
    int64_t n;
} qdq_job;

/* y[j] = saturate(round_half_even(x[j] / s) + zp) for j < n (sat_round's results). */
static void quantize_row(const float *x, int64_t n, float s, int32_t zp, bool sgn, void *y)
{
    int64_t j = 0;
#ifdef QR_SSE2
    const __m128 lo = _mm_set1_ps(-2097152.0f), hi = _mm_set1_ps(2097152.0f), mg = _mm_set1_ps(12582912.0f);
    const __m128 sv = _mm_set1_ps(s), zv = _mm_set1_ps((float)zp);
    for (; j + 16 <= n; j += 16) {
        __m128i q[4];
        for (int t = 0; t < 4; t++) {
            __m128 v = _mm_div_ps(_mm_loadu_ps(x + j + 4 * t), sv);
            v = _mm_min_ps(_mm_max_ps(v, lo), hi); /* maxps returns lo for NaN */
            v = _mm_add_ps(_mm_sub_ps(_mm_add_ps(v, mg), mg), zv);
            q[t] = _mm_cvtps_epi32(v);
        }
        __m128i h0 = _mm_packs_epi32(q[0], q[1]), h1 = _mm_packs_epi32(q[2], q[3]);
        __m128i r = sgn ? _mm_packs_epi16(h0, h1) : _mm_packus_epi16(h0, h1);
        _mm_storeu_si128((__m128i *)((uint8_t *)y + j), r);
    }
#endif
    for (; j < n; j++) q8_store(y, sgn, j, x[j] / s, zp);
}

/* Elements [i0, i1) of x in flat order, in runs of one axis index: element i has axis index
 * (i / inner) % axdim (inner is the whole tensor when per-tensor). */
static void quant_part(void *ctx, int ithr, int nthr)
{
    const qdq_job *j = ctx;
    const qdq_desc *d = j->d;
    int64_t i0 = j->n * ithr / nthr, i1 = j->n * (ithr + 1) / nthr;
    int64_t inner = d->per_axis ? d->inner : j->n;
    bool sgn = d->ydt == MTS_DTYPE_INT8;
    const float *scale = d->scale->data;
    for (int64_t i = i0; i < i1;) {
        int64_t row = i / inner, a = d->per_axis ? row % d->axdim : 0;
        int64_t end = (row + 1) * inner < i1 ? (row + 1) * inner : i1;
        float s = scale[a];
        int32_t zp = zp_at(d->zp, a);
        if (d->x->dtype == MTS_DTYPE_FLOAT) {
            quantize_row((const float *)d->x->data + i, end - i, s, zp, sgn, (uint8_t *)j->y + i);
        } else {
            const int32_t *xi = d->x->data;
            for (int64_t e = i; e < end; e++) q8_store(j->y, sgn, e, (float)xi[e] / s, zp);
        }
        i = end;
    }
}

static void dequant_part(void *ctx, int ithr, int nthr)
{
    const qdq_job *j = ctx;
    const qdq_desc *d = j->d;
    int64_t i0 = j->n * ithr / nthr, i1 = j->n * (ithr + 1) / nthr;
    int64_t inner = d->per_axis ? d->inner : j->n;
    const float *scale = d->scale->data;
    float *y = j->y;
    for (int64_t i = i0; i < i1;) {
        int64_t row = i / inner, a = d->per_axis ? row % d->axdim : 0;
        int64_t end = (row + 1) * inner < i1 ? (row + 1) * inner : i1;
        float s = scale[a];
        int32_t zp = zp_at(d->zp, a);
        if (d->x->dtype == MTS_DTYPE_UINT8) {
            const uint8_t *x = d->x->data;
            for (int64_t e = i; e < end; e++) y[e] = (float)(x[e] - zp) * s;
        } else if (d->x->dtype == MTS_DTYPE_INT8) {
            const int8_t *x = d->x->data;
            for (int64_t e = i; e < end; e++) y[e] = (float)(x[e] - zp) * s;
        } else {
            const int32_t *x = d->x->data;
            for (int64_t e = i; e < end; e++) y[e] = (float)((int64_t)x[e] - zp) * s;
        }
        i = end;
    }
}

static int threads_for(const mts_kctx *k, int64_t work)
{
    int64_t t = work / (1 << 15);
    if (t < 1) t = 1;
    return t < k->threads ? (int)t : k->threads;
}

static int quant_run(mts_kctx *k)
{
    qdq_desc d;
    int rc = qdq_setup(k, true, &d);
    if (rc) return rc;
    qdq_job j = {&d, k->out[0].data, mts_tensor_numel(d.x)};
    mts_parallel(threads_for(k, j.n), quant_part, &j);
    return MTS_OK;
}

static int dequant_run(mts_kctx *k)
{
    qdq_desc d;
    int rc = qdq_setup(k, false, &d);
    if (rc) return rc;
    if (d.x->dtype == MTS_DTYPE_INT32 && d.zp) {
        int64_t nz = mts_tensor_numel(d.zp);
        for (int64_t i = 0; i < nz; i++)
            if (zp_at(d.zp, i) != 0)
                return mts_err_set(k->err, MTS_EINVAL, "an int32 x needs a zero point of 0, got %d", zp_at(d.zp, i));
    }
    qdq_job j = {&d, k->out[0].data, mts_tensor_numel(d.x)};
    mts_parallel(threads_for(k, j.n), dequant_part, &j);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* DynamicQuantizeLinear                                                                       */
/* ------------------------------------------------------------------------------------------ */

static int dynq_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = chk_outs(k, 3)) || (rc = req(k, 0, "x", &x)) || (rc = need_type(k, x, MTS_DTYPE_FLOAT, "x")))
        return rc;
    set_shape(&k->out[0], MTS_DTYPE_UINT8, x);
    k->out[1].dtype = MTS_DTYPE_FLOAT;
    k->out[1].rank = 0;
    k->out[2].dtype = MTS_DTYPE_UINT8;
    k->out[2].rank = 0;
    return MTS_OK;
}

static int dynq_run(mts_kctx *k)
{
    int rc = dynq_infer(k);
    if (rc) return rc;
    const mts_tensor *x = k->in[0];
    const float *xd = x->data;
    int64_t n = mts_tensor_numel(x);
    /* the range always includes 0; NaNs are skipped */
    float mn = 0.0f, mx = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        if (xd[i] < mn) mn = xd[i];
        if (xd[i] > mx) mx = xd[i];
    }
    float scale = mx == mn ? 1.0f : (mx - mn) / 255.0f;
    int32_t zp = sat_round(0.0f - mn / scale, 0, 0, 255);
    uint8_t *y = k->out[0].data;
    for (int64_t i = 0; i < n; i++) y[i] = (uint8_t)sat_round(xd[i] / scale, zp, 0, 255);
    *(float *)k->out[1].data = scale;
    *(uint8_t *)k->out[2].data = (uint8_t)zp;
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* MatMulInteger / QLinearMatMul                                                               */
/* ------------------------------------------------------------------------------------------ */

typedef struct qmm_desc {
    const mts_tensor *a, *b, *azp, *bzp;       /* zero points may be NULL */
    const mts_tensor *as, *bs, *ys, *yzp;      /* QLinearMatMul only */
    bool qlinear, a_sgn, b_sgn, y_sgn;
    int64_t M, N, K, nbatch;
    int brank;
    int64_t bdims[MTS_MAX_RANK], adims[MTS_MAX_RANK], bbdims[MTS_MAX_RANK];
    int orank;
    int64_t odims[MTS_MAX_RANK];
} qmm_desc;

static int qmm_setup(mts_kctx *k, bool qlinear, qmm_desc *d)
{
    int rc;
    char sa[96], sb[96];
    memset(d, 0, sizeof *d);
    d->qlinear = qlinear;
    if ((rc = chk_outs(k, 1))) return rc;
    if (qlinear) {
        /* the input zero points may be omitted (0), as in DequantizeLinear */
        if ((rc = req(k, 0, "a", &d->a)) || (rc = req(k, 1, "a_scale", &d->as)) || (rc = req(k, 3, "b", &d->b)) ||
            (rc = req(k, 4, "b_scale", &d->bs)) || (rc = req(k, 6, "y_scale", &d->ys)) ||
            (rc = req(k, 7, "y_zero_point", &d->yzp)))
            return rc;
        d->azp = mts_kin(k, 2);
        d->bzp = mts_kin(k, 5);
        if ((rc = need_type(k, d->as, MTS_DTYPE_FLOAT, "a_scale")) ||
            (rc = need_type(k, d->bs, MTS_DTYPE_FLOAT, "b_scale")) ||
            (rc = need_type(k, d->ys, MTS_DTYPE_FLOAT, "y_scale")) || (rc = need_q8(k, d->yzp, "y_zero_point")))
            return rc;
        d->y_sgn = d->yzp->dtype == MTS_DTYPE_INT8;
    } else {
        if ((rc = req(k, 0, "A", &d->a)) || (rc = req(k, 1, "B", &d->b))) return rc;
        d->azp = mts_kin(k, 2);
        d->bzp = mts_kin(k, 3);
    }
    const mts_tensor *a = d->a, *b = d->b;
    if ((rc = need_q8(k, a, "A")) || (rc = need_q8(k, b, "B"))) return rc;
    if (d->azp && d->azp->dtype != a->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "A's zero point has type %s, expected %s",
                           mts_dtype_name(d->azp->dtype), mts_dtype_name(a->dtype));
    if (d->bzp && d->bzp->dtype != b->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "B's zero point has type %s, expected %s",
                           mts_dtype_name(d->bzp->dtype), mts_dtype_name(b->dtype));
    d->a_sgn = a->dtype == MTS_DTYPE_INT8;
    d->b_sgn = b->dtype == MTS_DTYPE_INT8;
    if (a->rank < 1 || b->rank < 1)
        return mts_err_set(k->err, MTS_EINVAL, "inputs must have rank >= 1, got ranks %d and %d", a->rank, b->rank);
    int ra = a->rank, rb = b->rank;
    int64_t ka = a->dims[ra - 1];
    d->M = ra == 1 ? 1 : a->dims[ra - 2];
    d->K = rb == 1 ? b->dims[0] : b->dims[rb - 2];
    d->N = rb == 1 ? 1 : b->dims[rb - 1];
    if (ka != d->K)
        return mts_err_set(k->err, MTS_ESHAPE, "inner dimensions differ: A %s, B %s", mts_shape_str(a, sa, sizeof sa),
                           mts_shape_str(b, sb, sizeof sb));
    int nba = ra > 2 ? ra - 2 : 0, nbb = rb > 2 ? rb - 2 : 0;
    d->brank = nba > nbb ? nba : nbb;
    d->nbatch = 1;
    for (int i = 0; i < d->brank; i++) {
        int ia = i - (d->brank - nba), ib = i - (d->brank - nbb);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return mts_err_set(k->err, MTS_ESHAPE, "batch dimensions of A %s and B %s cannot be broadcast",
                               mts_shape_str(a, sa, sizeof sa), mts_shape_str(b, sb, sizeof sb));
        d->adims[i] = da;
        d->bbdims[i] = db;
        d->bdims[i] = da == 1 ? db : da;
        d->nbatch *= d->bdims[i];
        d->odims[d->orank++] = d->bdims[i];
    }
    if (ra != 1) d->odims[d->orank++] = d->M;
    if (rb != 1) d->odims[d->orank++] = d->N;
    /* zero points and scales: per tensor, per row of A (M), per column of B (N) */
    bool v;
    if (d->azp && (rc = chk_param(k, d->azp, "A's zero point", d->M, &v))) return rc;
    if (d->bzp && (rc = chk_param(k, d->bzp, "B's zero point", d->N, &v))) return rc;
    if (qlinear) {
        if ((rc = chk_param(k, d->as, "a_scale", d->M, &v)) || (rc = chk_param(k, d->bs, "b_scale", d->N, &v)) ||
            (rc = chk_param(k, d->ys, "y_scale", d->M, &v)) || (rc = chk_param(k, d->yzp, "y_zero_point", d->M, &v)))
            return rc;
    }
    return MTS_OK;
}

static int qmm_infer_common(mts_kctx *k, bool qlinear)
{
    qmm_desc d;
    int rc = qmm_setup(k, qlinear, &d);
    if (rc) return rc;
    mts_tensor *o = &k->out[0];
    o->dtype = qlinear ? d.yzp->dtype : MTS_DTYPE_INT32;
    o->rank = d.orank;
    memcpy(o->dims, d.odims, sizeof d.odims);
    return MTS_OK;
}

static int mmint_infer(mts_kctx *k)
{
    return qmm_infer_common(k, false);
}

static int qlmm_infer(mts_kctx *k)
{
    return qmm_infer_common(k, true);
}

/* Element offsets of batch entry n's A and B matrices. */
static void qmm_batch(const qmm_desc *d, int64_t n, int64_t *ao, int64_t *bo)
{
    int64_t oa = 0, ob = 0, sa = d->M * d->K, sb = d->K * d->N;
    for (int i = d->brank - 1; i >= 0; i--) {
        int64_t idx = n % d->bdims[i];
        n /= d->bdims[i];
        if (d->adims[i] != 1) oa += idx * sa;
        if (d->bbdims[i] != 1) ob += idx * sb;
        sa *= d->adims[i];
        sb *= d->bbdims[i];
    }
    *ao = oa;
    *bo = ob;
}

/* Requantizes rows [i0, i1) of one product (acc: those rows, N int32 each) into y. */
/* cs: the per-column scales a_scale * b_scale[j] / y_scale when a_scale and y_scale are one
 * value for every row (NULL otherwise: computed per row here). */
static void qmm_requant(const qmm_desc *d, const float *cs, const int32_t *acc, void *y, int64_t yoff, int64_t i0,
                        int64_t i1)
{
    bool col_scales = mts_tensor_numel(d->bs) != 1;
    const float *bs = d->bs->data;
    for (int64_t i = i0; i < i1; i++) {
        float ai = sc_at(d->as, i), yi = sc_at(d->ys, i);
        int32_t zp = zp_at(d->yzp, i);
        const int32_t *a = acc + (i - i0) * d->N;
        if (!col_scales || cs) {
            requant_row_cs(a, d->N, 0, col_scales ? 0.0f : ai * bs[0] / yi, cs, zp, d->y_sgn,
                           (uint8_t *)y + yoff + i * d->N);
            continue;
        }
        for (int64_t j = 0; j < d->N; j++)
            q8_store(y, d->y_sgn, yoff + i * d->N + j, (float)a[j] * (ai * bs[j] / yi), zp);
    }
}

typedef struct qmm_job {
    const qmm_desc *d;
    void *y;
    int32_t *acc; /* QLinearMatMul: one M x N int32 buffer per thread */
    float *cs;    /* QLinearMatMul: per-column requantization scales (qmm_requant), or NULL */
    int64_t units, rows_per_unit, nru;
    bool fast;
    mts_qpack_b *pb; /* fast: packed B of every distinct batch matrix */
    int16_t *bref;   /* reference: every distinct B matrix minus its zero points */
    int failed;
} qmm_job;

/* c[j] += a * b[j] modulo 2^32, in fixed blocks of 16 so that gcc -O2 vectorizes the body. */
static inline void axpy16(uint32_t *restrict c, int16_t a, const int16_t *restrict b, int64_t n)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) /* int16 x int16 -> int32: SSE2's pmullw / pmulhw */
        for (int t = 0; t < 16; t++) c[j + t] += (uint32_t)((int32_t)a * (int32_t)b[j + t]);
    for (; j < n; j++) c[j] += (uint32_t)((int32_t)a * (int32_t)b[j]);
}

/* Reference product of rows [i0, i1) of batch entry n into c (int32, rows of N); j->bref holds
 * every distinct B matrix minus its zero points as int16. */
static void qmm_ref_rows(const qmm_desc *d, const int16_t *bref, int64_t n, int64_t i0, int64_t i1, int32_t *c)
{
    int64_t ao, bo;
    qmm_batch(d, n, &ao, &bo);
    for (int64_t i = i0; i < i1; i++) {
        uint32_t *cr = (uint32_t *)c + (i - i0) * d->N;
        for (int64_t j = 0; j < d->N; j++) cr[j] = 0;
        int32_t za = zp_at(d->azp, i);
        for (int64_t p = 0; p < d->K; p++) {
            int32_t av = q8_get(d->a->data, d->a_sgn, ao + i * d->K + p) - za;
            if (av) axpy16(cr, (int16_t)av, bref + bo + p * d->N, d->N);
        }
    }
}

/* Zero points as int32 arrays for the packing (per row of A / per column of B). */
static void zp_vec(const mts_tensor *t, int64_t n, int32_t *out)
{
    for (int64_t i = 0; i < n; i++) out[i] = zp_at(t, i);
}

/* Unit u: batch entry u / nru, rows block u % nru. */
static void qmm_part(void *ctx, int ithr, int nthr)
{
    qmm_job *j = ctx;
    const qmm_desc *d = j->d;
    int64_t u0 = j->units * ithr / nthr, u1 = j->units * (ithr + 1) / nthr;
    int32_t *acc = j->acc ? j->acc + (int64_t)ithr * j->rows_per_unit * d->N : NULL;
    mts_qpack_a pa = {0};
    int32_t *azp = NULL;
    if (j->fast) {
        azp = malloc(sizeof(int32_t) * (size_t)j->rows_per_unit);
        if (!azp || mts_qpack_a_alloc(&pa, j->rows_per_unit, d->K)) {
            j->failed = 1;
            free(azp);
            return;
        }
    }
    for (int64_t u = u0; u < u1; u++) {
        int64_t n = u / j->nru, i0 = (u % j->nru) * j->rows_per_unit;
        int64_t i1 = i0 + j->rows_per_unit < d->M ? i0 + j->rows_per_unit : d->M;
        int64_t yoff = n * d->M * d->N;
        int32_t *c = acc ? acc : (int32_t *)j->y + yoff + i0 * d->N;
        if (j->fast) {
            int64_t ao, bo;
            qmm_batch(d, n, &ao, &bo);
            for (int64_t i = i0; i < i1; i++) azp[i - i0] = zp_at(d->azp, i);
            pa.M = i1 - i0;
            const void *a = (const uint8_t *)d->a->data + ao + i0 * d->K;
            mts_qpack_a_fill(&pa, a, d->a_sgn, d->K, azp, 1);
            int64_t bi = bo / (d->K * d->N > 0 ? d->K * d->N : 1);
            mts_qgemm(&pa, &j->pb[bi], 0, pa.M, c, d->N);
        } else {
            qmm_ref_rows(d, j->bref, n, i0, i1, c);
        }
        if (acc) qmm_requant(d, j->cs, acc, j->y, yoff, i0, i1);
    }
    if (j->fast) {
        mts_qpack_a_free(&pa);
        free(azp);
    }
}

static int qmm_run_common(mts_kctx *k, bool qlinear, bool fast)
{
    qmm_desc d;
    int rc = qmm_setup(k, qlinear, &d);
    if (rc) return rc;
    if (d.nbatch == 0 || d.M == 0 || d.N == 0) return MTS_OK;
    if (d.K == 0 && !qlinear) {
        memset(k->out[0].data, 0, (size_t)mts_tensor_nbytes(&k->out[0]));
        return MTS_OK;
    }
    qmm_job j = {.d = &d, .y = k->out[0].data, .fast = fast};
    /* rows per unit: enough work per unit, a multiple of 6 (the fast kernel's row block) */
    int64_t rpu = (1 << 16) / (d.N * (d.K > 0 ? d.K : 1) + 1);
    rpu = rpu < 6 ? 6 : (rpu + 5) / 6 * 6;
    if (rpu > d.M) rpu = d.M;
    j.rows_per_unit = rpu;
    j.nru = (d.M + rpu - 1) / rpu;
    j.units = j.nru * d.nbatch;
    int nthr = j.units < k->threads ? (int)j.units : k->threads;
    if (nthr < 1) nthr = 1;
    if ((double)d.nbatch * (double)d.M * (double)d.N * (double)d.K < 1e5) nthr = 1;
    int64_t nb = 1;
    if (fast) {
        for (int i = 0; i < d.brank; i++) nb *= d.bbdims[i];
        j.pb = calloc((size_t)nb, sizeof *j.pb);
        if (!j.pb) return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
        int32_t *bzp = malloc(sizeof(int32_t) * (size_t)d.N);
        if (!bzp) rc = MTS_ENOMEM;
        else zp_vec(d.bzp, d.N, bzp);
        for (int64_t i = 0; i < nb && !rc; i++) {
            if ((rc = mts_qpack_b_alloc(&j.pb[i], d.K, d.N))) break;
            mts_qpack_b_fill(&j.pb[i], (const uint8_t *)d.b->data + i * d.K * d.N, d.b_sgn, d.N, bzp, 1);
        }
        free(bzp);
    }
    if (!fast) {
        for (int i = 0; i < d.brank; i++) nb *= d.bbdims[i];
        j.bref = malloc(sizeof(int16_t) * (size_t)(nb * d.K * d.N));
        int32_t *bzp = malloc(sizeof(int32_t) * (size_t)d.N);
        if (!j.bref || !bzp) {
            rc = MTS_ENOMEM;
        } else {
            zp_vec(d.bzp, d.N, bzp);
            for (int64_t r = 0; r < nb * d.K; r++)
                for (int64_t c = 0; c < d.N; c++)
                    j.bref[r * d.N + c] = (int16_t)(q8_get(d.b->data, d.b_sgn, r * d.N + c) - bzp[c]);
        }
        free(bzp);
    }
    if (!rc && qlinear) {
        j.acc = malloc(sizeof(int32_t) * (size_t)(rpu * d.N) * (size_t)nthr);
        if (!j.acc) rc = MTS_ENOMEM;
        if (!rc && mts_tensor_numel(d.bs) != 1 && mts_tensor_numel(d.as) == 1 && mts_tensor_numel(d.ys) == 1 &&
            (j.cs = malloc(sizeof(float) * (size_t)d.N))) {
            float ai = sc_at(d.as, 0), yi = sc_at(d.ys, 0);
            for (int64_t c = 0; c < d.N; c++) j.cs[c] = ai * ((const float *)d.bs->data)[c] / yi;
        }
    }
    if (!rc) {
        mts_parallel(nthr, qmm_part, &j);
        if (j.failed) rc = MTS_ENOMEM;
    }
    if (j.pb)
        for (int64_t i = 0; i < nb; i++) mts_qpack_b_free(&j.pb[i]);
    free(j.pb);
    free(j.bref);
    free(j.acc);
    free(j.cs);
    if (rc) return mts_err_set(k->err, rc, "out of memory");
    return MTS_OK;
}

static int mmint_run(mts_kctx *k)
{
    return qmm_run_common(k, false, false);
}

static int qlmm_run(mts_kctx *k)
{
    return qmm_run_common(k, true, false);
}

static int mmint_run_fast(mts_kctx *k)
{
    return qmm_run_common(k, false, true);
}

static int qlmm_run_fast(mts_kctx *k)
{
    return qmm_run_common(k, true, true);
}

/* ------------------------------------------------------------------------------------------ */
/* ConvInteger / QLinearConv                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct qconv_desc {
    mts_conv_geom g;
    const mts_tensor *x, *w, *xzp, *wzp, *bias; /* zero points and bias may be NULL */
    const mts_tensor *xs, *ws, *ys, *yzp;       /* QLinearConv only */
    bool qlinear, x_sgn, w_sgn, y_sgn, float_bias;
    int64_t Cg, Mg, K, P, IP, ksz;
} qconv_desc;

static int qconv_setup(mts_kctx *k, bool qlinear, qconv_desc *d)
{
    int rc;
    memset(d, 0, sizeof *d);
    d->qlinear = qlinear;
    if ((rc = chk_outs(k, 1))) return rc;
    if (qlinear) {
        /* the input zero points may be omitted (0), as in DequantizeLinear */
        if ((rc = req(k, 0, "x", &d->x)) || (rc = req(k, 1, "x_scale", &d->xs)) || (rc = req(k, 3, "w", &d->w)) ||
            (rc = req(k, 4, "w_scale", &d->ws)) || (rc = req(k, 6, "y_scale", &d->ys)) ||
            (rc = req(k, 7, "y_zero_point", &d->yzp)))
            return rc;
        d->xzp = mts_kin(k, 2);
        d->wzp = mts_kin(k, 5);
        d->bias = mts_kin(k, 8);
        /* a fused QDQ convolution (quant_backend.c) passes the float bias */
        d->float_bias = mts_attr_int(k->node, "mts_float_bias", 0) != 0;
        if ((rc = need_type(k, d->xs, MTS_DTYPE_FLOAT, "x_scale")) ||
            (rc = need_type(k, d->ws, MTS_DTYPE_FLOAT, "w_scale")) ||
            (rc = need_type(k, d->ys, MTS_DTYPE_FLOAT, "y_scale")) || (rc = need_q8(k, d->yzp, "y_zero_point")) ||
            (d->bias && (rc = need_type(k, d->bias, d->float_bias ? MTS_DTYPE_FLOAT : MTS_DTYPE_INT32, "B"))))
            return rc;
        d->y_sgn = d->yzp->dtype == MTS_DTYPE_INT8;
    } else {
        if ((rc = req(k, 0, "x", &d->x)) || (rc = req(k, 1, "w", &d->w))) return rc;
        d->xzp = mts_kin(k, 2);
        d->wzp = mts_kin(k, 3);
    }
    if ((rc = need_q8(k, d->x, "x")) || (rc = need_q8(k, d->w, "w"))) return rc;
    if (d->xzp && d->xzp->dtype != d->x->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "x's zero point has type %s, expected %s",
                           mts_dtype_name(d->xzp->dtype), mts_dtype_name(d->x->dtype));
    if (d->wzp && d->wzp->dtype != d->w->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "w's zero point has type %s, expected %s",
                           mts_dtype_name(d->wzp->dtype), mts_dtype_name(d->w->dtype));
    d->x_sgn = d->x->dtype == MTS_DTYPE_INT8;
    d->w_sgn = d->w->dtype == MTS_DTYPE_INT8;
    /* the geometry, validated by the float Conv's rules on float views of x and w */
    mts_tensor xf = *d->x, wf = *d->w;
    xf.dtype = wf.dtype = MTS_DTYPE_FLOAT;
    const mts_tensor *gin[2] = {&xf, &wf};
    mts_kctx gk = {k->node, gin, 2, k->out, k->n_out, k->err, k->threads, k->ctx};
    if ((rc = mts_conv_geometry(&gk, false, &d->g))) return rc;
    const mts_conv_geom *g = &d->g;
    d->Cg = g->C / g->group;
    d->Mg = g->M / g->group;
    d->ksz = g->k[0] * g->k[1] * g->k[2];
    d->K = d->Cg * d->ksz;
    d->P = g->out[0] * g->out[1] * g->out[2];
    d->IP = g->in[0] * g->in[1] * g->in[2];
    bool v;
    if (d->xzp && (rc = chk_param(k, d->xzp, "x's zero point", 0, &v))) return rc;
    if (d->wzp && (rc = chk_param(k, d->wzp, "w's zero point", g->M, &v))) return rc;
    if (qlinear) {
        if ((rc = chk_param(k, d->xs, "x_scale", 0, &v)) || (rc = chk_param(k, d->ws, "w_scale", g->M, &v)) ||
            (rc = chk_param(k, d->ys, "y_scale", 0, &v)) || (rc = chk_param(k, d->yzp, "y_zero_point", 0, &v)))
            return rc;
        if (d->bias && (d->bias->rank != 1 || d->bias->dims[0] != g->M))
            return mts_err_set(k->err, MTS_ESHAPE, "B must have shape [%lld]", (long long)g->M);
    }
    return MTS_OK;
}

static int qconv_infer_common(mts_kctx *k, bool qlinear)
{
    qconv_desc d;
    int rc = qconv_setup(k, qlinear, &d);
    if (rc) return rc;
    mts_tensor *o = &k->out[0];
    o->dtype = qlinear ? d.yzp->dtype : MTS_DTYPE_INT32;
    o->rank = d.g.nsp + 2;
    o->dims[0] = d.g.N;
    o->dims[1] = d.g.M;
    for (int i = 0; i < d.g.nsp; i++) o->dims[2 + i] = d.g.out[3 - d.g.nsp + i];
    return MTS_OK;
}

static int convint_infer(mts_kctx *k)
{
    return qconv_infer_common(k, false);
}

static int qlconv_infer(mts_kctx *k)
{
    return qconv_infer_common(k, true);
}

#define QC_CHUNK 256 /* output pixels per work unit (a multiple of the GEMM panel width) */

typedef struct qconv_job {
    const qconv_desc *d;
    void *y;
    bool fast;
    int16_t *wref;        /* reference: w - w_zero_point, [M, K] */
    mts_qpack_a *wpack;   /* fast: one packed A per group */
    bool pointwise;       /* 1x1 kernel, stride 1, no padding: output pixel p reads input pixel p */
    int64_t nchunks, units;
    int failed;
} qconv_job;

/* Range [*lo, *hi) of output positions o in [0, O) with 0 <= o*s + off < I. */
static void valid_range(int64_t off, int64_t st, int64_t I, int64_t O, int64_t *lo, int64_t *hi)
{
    int64_t l = off >= 0 ? 0 : (-off + st - 1) / st;
    int64_t h = I - 1 - off < 0 ? 0 : (I - 1 - off) / st + 1;
    if (l > O) l = O;
    if (h > O) h = O;
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

/* Columns [p0, p0 + nc) of the im2col matrix of image n, group gi, as raw bytes of x:
 * buf[kk * nc + j] for row kk = (c, kd, kh, kw) and output pixel p0 + j; `pad` (x's zero point)
 * in the padding, so that every entry minus the zero point is the product's operand. */
static void im2col_u8(const qconv_desc *d, int64_t n, int64_t gi, int64_t p0, int64_t nc, uint8_t pad, uint8_t *buf)
{
    const mts_conv_geom *g = &d->g;
    int64_t OH = g->out[1], OW = g->out[2], ID = g->in[0], IH = g->in[1], IW = g->in[2];
    const uint8_t *x = d->x->data;
    uint8_t *row = buf;
    for (int64_t c = 0; c < d->Cg; c++) {
        const uint8_t *xc = x + (n * g->C + gi * d->Cg + c) * d->IP;
        for (int64_t kd = 0; kd < g->k[0]; kd++)
            for (int64_t kh = 0; kh < g->k[1]; kh++)
                for (int64_t kw = 0; kw < g->k[2]; kw++, row += nc) {
                    int64_t off = kw * g->d[2] - g->pb[2], sw = g->s[2], lo, hi;
                    valid_range(off, sw, IW, OW, &lo, &hi);
                    for (int64_t j = 0, p = p0; j < nc;) {
                        int64_t od = p / (OH * OW), oh = (p / OW) % OH, ow0 = p % OW;
                        int64_t len = OW - ow0 < nc - j ? OW - ow0 : nc - j, ow1 = ow0 + len;
                        int64_t id = od * g->s[0] - g->pb[0] + kd * g->d[0];
                        int64_t ih = oh * g->s[1] - g->pb[1] + kh * g->d[1];
                        uint8_t *dst = row + j; /* dst[o - ow0] for output column o */
                        if (id < 0 || id >= ID || ih < 0 || ih >= IH) {
                            memset(dst, pad, (size_t)len);
                        } else {
                            const uint8_t *src = xc + (id * IH + ih) * IW; /* src[o * sw + off] */
                            int64_t a = lo > ow0 ? (lo < ow1 ? lo : ow1) : ow0;
                            int64_t b = hi < ow1 ? (hi > a ? hi : a) : ow1;
                            if (a > ow0) memset(dst, pad, (size_t)(a - ow0));
                            if (sw == 1) {
                                if (b > a) memcpy(dst + (a - ow0), src + (a + off), (size_t)(b - a));
                            } else {
                                for (int64_t o = a; o < b; o++) dst[o - ow0] = src[o * sw + off];
                            }
                            if (ow1 > b) memset(dst + (b - ow0), pad, (size_t)(ow1 - b));
                        }
                        j += len;
                        p += len;
                    }
                }
    }
}

/* The int32 bias of output channel oc (0 without one; a float bias requantized with
 * x_scale * w_scale[oc], rounded and saturated). */
static int32_t qconv_bias(const qconv_desc *d, int64_t oc)
{
    if (!d->qlinear || !d->bias) return 0;
    if (!d->float_bias) return ((const int32_t *)d->bias->data)[oc];
    double v = rint((double)((const float *)d->bias->data)[oc] / ((double)sc_at(d->xs, 0) * sc_at(d->ws, oc)));
    return v >= -2147483648.0 && v <= 2147483647.0 ? (int32_t)v : v > 0 ? INT32_MAX : INT32_MIN; /* NaN: min */
}

/* Writes one unit's results (acc: Mg rows of nc) into y. */
static void qconv_store(const qconv_desc *d, const int32_t *acc, void *y, int64_t n, int64_t gi, int64_t p0,
                        int64_t nc)
{
    for (int64_t m = 0; m < d->Mg; m++) {
        int64_t oc = gi * d->Mg + m, yoff = (n * d->g.M + oc) * d->P + p0;
        const int32_t *a = acc + m * nc;
        if (!d->qlinear) {
            memcpy((int32_t *)y + yoff, a, sizeof(int32_t) * (size_t)nc);
            continue;
        }
        int32_t b = qconv_bias(d, oc);
        float s = sc_at(d->xs, 0) * sc_at(d->ws, oc) / sc_at(d->ys, 0);
        requant_row(a, nc, b, s, zp_at(d->yzp, 0), d->y_sgn, (uint8_t *)y + yoff);
    }
}

/* Depthwise 2-D convolutions (one input and one output channel per group) run directly, one
 * output row at a time: for each tap, acc[ow] += (w - w_zp) * (x - x_zp) over the output columns
 * whose input column is inside the image (padding contributes x_zp - x_zp = 0), then the row is
 * requantized like qconv_store's. Same exact integer sums as the im2col path, without packing a
 * one-row GEMM per 256 pixels. Units are (image, channel) planes. */
typedef struct qdw_job {
    const qconv_desc *d;
    void *y;
    int failed;
} qdw_job;

/* acc[o] += w * (x[o] - xz) for o < n: uint8 x, |w| and |x - xz| <= 255, so the 16-bit
 * operands' 32-bit products are exact. */
static void dw_axpy_u8(int32_t *acc, const uint8_t *x, int64_t n, int32_t w, int32_t xz)
{
    int64_t o = 0;
#ifdef QR_SSE2
    const __m128i wv = _mm_set1_epi16((int16_t)w), zv = _mm_set1_epi16((int16_t)xz), z = _mm_setzero_si128();
    for (; o + 8 <= n; o += 8) {
        __m128i xv = _mm_sub_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(x + o)), z), zv);
        __m128i lo = _mm_mullo_epi16(xv, wv), hi = _mm_mulhi_epi16(xv, wv);
        __m128i *a = (__m128i *)(acc + o);
        _mm_storeu_si128(a, _mm_add_epi32(_mm_loadu_si128(a), _mm_unpacklo_epi16(lo, hi)));
        _mm_storeu_si128(a + 1, _mm_add_epi32(_mm_loadu_si128(a + 1), _mm_unpackhi_epi16(lo, hi)));
    }
#endif
    for (; o < n; o++) acc[o] += w * ((int32_t)x[o] - xz);
}

static bool qconv_is_dw(const qconv_desc *d)
{
    return d->g.nsp == 2 && d->Cg == 1 && d->Mg == 1 && d->g.group > 1;
}

static void qconv_dw_part(void *ctx, int ithr, int nthr)
{
    qdw_job *j = ctx;
    const qconv_desc *d = j->d;
    const mts_conv_geom *g = &d->g;
    int64_t units = g->N * g->M, u0 = units * ithr / nthr, u1 = units * (ithr + 1) / nthr;
    if (u0 >= u1) return;
    int64_t OH = g->out[1], OW = g->out[2], IH = g->in[1], IW = g->in[2], KH = g->k[1], KW = g->k[2];
    int32_t *acc = malloc(sizeof(int32_t) * (size_t)(OW + (KH * KW)));
    if (!acc) {
        j->failed = 1;
        return;
    }
    int32_t *wv = acc + OW, xz = zp_at(d->xzp, 0);
    for (int64_t u = u0; u < u1; u++) {
        int64_t n = u / g->M, c = u % g->M;
        int32_t wz = zp_at(d->wzp, c), b = qconv_bias(d, c);
        for (int64_t t = 0; t < KH * KW; t++) wv[t] = q8_get(d->w->data, d->w_sgn, c * KH * KW + t) - wz;
        float s = d->qlinear ? sc_at(d->xs, 0) * sc_at(d->ws, c) / sc_at(d->ys, 0) : 0;
        const uint8_t *xp = (const uint8_t *)d->x->data + (n * g->C + c) * d->IP;
        for (int64_t oh = 0; oh < OH; oh++) {
            memset(acc, 0, sizeof(int32_t) * (size_t)OW);
            for (int64_t kh = 0; kh < KH; kh++) {
                int64_t ih = oh * g->s[1] - g->pb[1] + kh * g->d[1];
                if (ih < 0 || ih >= IH) continue;
                const uint8_t *xr = xp + ih * IW;
                for (int64_t kw = 0; kw < KW; kw++) {
                    int32_t w = wv[kh * KW + kw];
                    if (!w) continue;
                    int64_t off = kw * g->d[2] - g->pb[2], sw = g->s[2], lo, hi;
                    valid_range(off, sw, IW, OW, &lo, &hi);
                    if (d->x_sgn) {
                        const int8_t *xs = (const int8_t *)xr;
                        for (int64_t o = lo; o < hi; o++) acc[o] += w * ((int32_t)xs[o * sw + off] - xz);
                    } else if (sw == 1) {
                        if (hi > lo) dw_axpy_u8(acc + lo, xr + off + lo, hi - lo, w, xz);
                    } else {
                        for (int64_t o = lo; o < hi; o++) acc[o] += w * ((int32_t)xr[o * sw + off] - xz);
                    }
                }
            }
            int64_t yoff = (n * g->M + c) * d->P + oh * OW;
            if (!d->qlinear) memcpy((int32_t *)j->y + yoff, acc, sizeof(int32_t) * (size_t)OW);
            else requant_row(acc, OW, b, s, zp_at(d->yzp, 0), d->y_sgn, (uint8_t *)j->y + yoff);
        }
    }
    free(acc);
}

static void qconv_part(void *ctx, int ithr, int nthr)
{
    qconv_job *j = ctx;
    const qconv_desc *d = j->d;
    int64_t u0 = j->units * ithr / nthr, u1 = j->units * (ithr + 1) / nthr;
    if (u0 >= u1) return;
    int32_t *acc = malloc(sizeof(int32_t) * (size_t)(d->Mg * QC_CHUNK));
    uint8_t *buf = malloc((size_t)(d->K * QC_CHUNK));
    int16_t *col = NULL;
    mts_qpack_b pb = {0};
    int rc = acc && buf ? MTS_OK : MTS_ENOMEM;
    if (!rc && j->fast) rc = mts_qpack_b_alloc(&pb, d->K, QC_CHUNK);
    else if (!rc && !(col = malloc(sizeof(int16_t) * (size_t)(d->K * QC_CHUNK)))) rc = MTS_ENOMEM;
    if (rc) {
        j->failed = 1;
        free(acc);
        free(buf);
        return;
    }
    int32_t xz = zp_at(d->xzp, 0);
    int64_t ng = d->g.group;
    for (int64_t u = u0; u < u1; u++) {
        int64_t ch = u % j->nchunks, gi = (u / j->nchunks) % ng, n = u / (j->nchunks * ng);
        int64_t p0 = ch * QC_CHUNK, nc = d->P - p0 < QC_CHUNK ? d->P - p0 : QC_CHUNK;
        if (j->fast && j->pointwise) { /* the im2col matrix is x itself: pack straight from it */
            pb.N = nc;
            pb.np = (nc + MTS_QGEMM_NR - 1) / MTS_QGEMM_NR;
            const uint8_t *xs = (const uint8_t *)d->x->data + (n * d->g.C + gi * d->Cg) * d->IP + p0;
            mts_qpack_b_fill(&pb, xs, d->x_sgn, d->IP, &xz, 0);
            mts_qgemm(&j->wpack[gi], &pb, 0, d->Mg, acc, nc);
            qconv_store(d, acc, j->y, n, gi, p0, nc);
            continue;
        }
        im2col_u8(d, n, gi, p0, nc, (uint8_t)xz, buf);
        if (j->fast) {
            pb.N = nc;
            pb.np = (nc + MTS_QGEMM_NR - 1) / MTS_QGEMM_NR;
            mts_qpack_b_fill(&pb, buf, d->x_sgn, nc, &xz, 0);
            mts_qgemm(&j->wpack[gi], &pb, 0, d->Mg, acc, nc);
        } else {
            int64_t nk = d->K * nc;
            if (d->x_sgn)
                for (int64_t i = 0; i < nk; i++) col[i] = (int16_t)((int8_t)buf[i] - xz);
            else
                for (int64_t i = 0; i < nk; i++) col[i] = (int16_t)(buf[i] - xz);
            for (int64_t m = 0; m < d->Mg; m++) {
                uint32_t *a = (uint32_t *)acc + m * nc;
                const int16_t *wr = j->wref + (gi * d->Mg + m) * d->K;
                for (int64_t jj = 0; jj < nc; jj++) a[jj] = 0;
                for (int64_t kk = 0; kk < d->K; kk++)
                    if (wr[kk]) axpy16(a, wr[kk], col + kk * nc, nc);
            }
        }
        qconv_store(d, acc, j->y, n, gi, p0, nc);
    }
    free(acc);
    free(buf);
    free(col);
    mts_qpack_b_free(&pb);
}

static int qconv_run_common(mts_kctx *k, bool qlinear, bool fast)
{
    qconv_desc d;
    int rc = qconv_setup(k, qlinear, &d);
    if (rc) return rc;
    const mts_conv_geom *g = &d.g;
    if (g->N == 0 || d.P == 0) return MTS_OK;
    if (fast && qconv_is_dw(&d)) {
        qdw_job dj = {&d, k->out[0].data, 0};
        int64_t units = g->N * g->M;
        int nthr = units < k->threads ? (int)units : k->threads;
        if ((double)g->N * (double)g->M * (double)d.P * (double)d.K < 1e5) nthr = 1;
        mts_parallel(nthr < 1 ? 1 : nthr, qconv_dw_part, &dj);
        return dj.failed ? mts_err_set(k->err, MTS_ENOMEM, "out of memory") : MTS_OK;
    }
    qconv_job j = {.d = &d, .y = k->out[0].data, .fast = fast};
    j.pointwise = d.ksz == 1 && d.P == d.IP;
    for (int i = 0; i < 3; i++)
        if (g->s[i] != 1 || g->pb[i] != 0) j.pointwise = false;
    j.nchunks = (d.P + QC_CHUNK - 1) / QC_CHUNK;
    j.units = g->N * g->group * j.nchunks;
    if (fast) {
        j.wpack = calloc((size_t)g->group, sizeof *j.wpack);
        int32_t *wz = malloc(sizeof(int32_t) * (size_t)g->M);
        if (!j.wpack || !wz) rc = MTS_ENOMEM;
        else zp_vec(d.wzp, g->M, wz);
        for (int64_t gi = 0; gi < g->group && !rc; gi++) {
            if ((rc = mts_qpack_a_alloc(&j.wpack[gi], d.Mg, d.K))) break;
            const uint8_t *w = (const uint8_t *)d.w->data + gi * d.Mg * d.K;
            mts_qpack_a_fill(&j.wpack[gi], w, d.w_sgn, d.K, wz + gi * d.Mg, 1);
        }
        free(wz);
    } else {
        j.wref = malloc(sizeof(int16_t) * (size_t)(g->M * d.K));
        if (!j.wref) rc = MTS_ENOMEM;
        else
            for (int64_t m = 0; m < g->M; m++)
                for (int64_t kk = 0; kk < d.K; kk++)
                    j.wref[m * d.K + kk] = (int16_t)(q8_get(d.w->data, d.w_sgn, m * d.K + kk) - zp_at(d.wzp, m));
    }
    if (!rc) {
        int nthr = j.units < k->threads ? (int)j.units : k->threads;
        if ((double)g->N * (double)g->M * (double)d.P * (double)d.K < 1e5) nthr = 1;
        mts_parallel(nthr < 1 ? 1 : nthr, qconv_part, &j);
        if (j.failed) rc = MTS_ENOMEM;
    }
    if (j.wpack)
        for (int64_t gi = 0; gi < g->group; gi++) mts_qpack_a_free(&j.wpack[gi]);
    free(j.wpack);
    free(j.wref);
    if (rc) return mts_err_set(k->err, rc, "out of memory");
    return MTS_OK;
}

static int convint_run(mts_kctx *k)
{
    return qconv_run_common(k, false, false);
}

static int qlconv_run(mts_kctx *k)
{
    return qconv_run_common(k, true, false);
}

static int convint_run_fast(mts_kctx *k)
{
    return qconv_run_common(k, false, true);
}

static int qlconv_run_fast(mts_kctx *k)
{
    return qconv_run_common(k, true, true);
}

/* ------------------------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------------------------ */
/* Fused QDQ elementwise steps (quant_backend.c)                                               */
/* ------------------------------------------------------------------------------------------ */

/* MtsQLinearUnary (attribute mts_qop: 1 Relu, 2 LeakyRelu with its alpha, 6 the float op named
 * by attribute mts_float_op, e.g. HardSwish, through its reference kernel) computes
 * QuantizeLinear(op(DequantizeLinear(x))) for inputs x, x_scale, x_zero_point, y_scale,
 * y_zero_point (per tensor) through a 256-entry table built with the float ops of the unfused
 * steps, so every result is the unfused one. MtsQLinearAdd does the same for
 * Q(DQ(a) + DQ(b)) on same-shape a and b (inputs a, a_scale, a_zp, b, b_scale, b_zp, y_scale,
 * y_zp), element by element with the unfused float operations in the same order. */
static int qelt_param(mts_kctx *k, int i, const char *name, bool zp, const mts_tensor *like)
{
    const mts_tensor *t = mts_kin(k, i);
    if (!t) return zp ? MTS_OK : mts_err_set(k->err, MTS_EINVAL, "missing %s", name);
    if (mts_tensor_numel(t) != 1 || !t->data)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s must be a constant scalar", name);
    if (zp && like && t->dtype != like->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "%s has type %s, expected %s", name, mts_dtype_name(t->dtype),
                           mts_dtype_name(like->dtype));
    if (!zp && t->dtype != MTS_DTYPE_FLOAT) return mts_err_set(k->err, MTS_EINVAL, "%s must be float", name);
    return MTS_OK;
}

static int qelt_infer(mts_kctx *k, bool add)
{
    int n = add ? 8 : 5, rc;
    /* a table of another float op (mts_qop 6) takes that op's constant operands after y_zero_point */
    int extra = !add && mts_attr_int(k->node, "mts_qop", 0) == 6 ? 2 : 0;
    if (k->n_in < n || k->n_in > n + extra)
        return mts_err_set(k->err, MTS_EINVAL, "expected %d inputs, got %d", n, k->n_in);
    if ((rc = chk_outs(k, 1))) return rc;
    const mts_tensor *a = mts_kin(k, 0), *b = add ? mts_kin(k, 3) : NULL, *yz = mts_kin(k, n - 1);
    if (!a || (add && !b) || !yz) return mts_err_set(k->err, MTS_EINVAL, "missing input");
    if ((rc = need_q8(k, a, "x")) || (add && (rc = need_q8(k, b, "b"))) || (rc = need_q8(k, yz, "y_zero_point")))
        return rc;
    if ((rc = qelt_param(k, 1, "x_scale", false, NULL)) || (rc = qelt_param(k, 2, "x_zero_point", true, a)) ||
        (add && ((rc = qelt_param(k, 4, "b_scale", false, NULL)) || (rc = qelt_param(k, 5, "b_zero_point", true, b)))) ||
        (rc = qelt_param(k, n - 2, "y_scale", false, NULL)) || (rc = qelt_param(k, n - 1, "y_zero_point", true, yz)))
        return rc;
    if (add && !mts_shape_equal(a, b)) return mts_err_set(k->err, MTS_ESHAPE, "a and b differ in shape");
    set_shape(&k->out[0], yz->dtype, a);
    return MTS_OK;
}

static int qunary_infer(mts_kctx *k)
{
    return qelt_infer(k, false);
}

static int qadd_infer(mts_kctx *k)
{
    return qelt_infer(k, true);
}

typedef struct qelt_job {
    const uint8_t *a, *b;
    uint8_t *y;
    int64_t n;
    uint8_t lut[256];
    bool a_sgn, b_sgn, y_sgn;
    int32_t az, bz, yz;
    float as, bs, ys;
} qelt_job;

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QR_VBMI 1
/* 64 table lookups at once: vpermi2b picks from two 128-byte halves of the table by the low 7
 * bits of each index, and the top bit chooses the half. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static int64_t lut_vbmi(const uint8_t *lut, const uint8_t *a,
                                                                              uint8_t *y, int64_t n)
{
    __m512i t0 = _mm512_loadu_si512(lut), t1 = _mm512_loadu_si512(lut + 64);
    __m512i t2 = _mm512_loadu_si512(lut + 128), t3 = _mm512_loadu_si512(lut + 192);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i x = _mm512_loadu_si512(a + i);
        __m512i lo = _mm512_permutex2var_epi8(t0, x, t1), hi = _mm512_permutex2var_epi8(t2, x, t3);
        _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi));
    }
    return i;
}

static bool have_vbmi(void)
{
    static int v = -1;
    int got = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (got < 0) {
        got = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vbmi") && !getenv("MTS_NO_VBMI");
        __atomic_store_n(&v, got, __ATOMIC_RELAXED);
    }
    return got;
}
#endif

static void qunary_part(void *ctx, int ithr, int nthr)
{
    const qelt_job *j = ctx;
    int64_t i0 = j->n * ithr / nthr, i1 = j->n * (ithr + 1) / nthr, i = i0;
#ifdef QR_VBMI
    if (have_vbmi()) i += lut_vbmi(j->lut, j->a + i0, j->y + i0, i1 - i0);
#endif
    for (; i < i1; i++) j->y[i] = j->lut[j->a[i]];
}

/* Float op `name` (its reference kernel, as the unfused step would run it, with node nd's
 * attributes and the operands ops[0..n_ops), entries NULL where absent) on 256 floats: with f,
 * the results replace f; with f NULL, only whether the op accepts such a call (its shape
 * inference, float results of the same shape). The table of MtsQLinearUnary kind 6, and the
 * planner's check before it fuses one (quant_backend.c). */
int mts_quant_table_op(const mts_node *nd, const char *name, const mts_tensor *const *ops, int n_ops, float *f,
                       mts_err *err)
{
    const mts_op *op = name ? mts_op_lookup(name) : NULL;
    if (!op) return mts_err_set(err, MTS_EUNSUPPORTED, "no float kernel '%s' for the table", name ? name : "");
    if (n_ops < 0 || n_ops > 2) return mts_err_set(err, MTS_EINVAL, "'%s': %d operands for the table", name, n_ops);
    mts_tensor x = {0}, y = {0};
    x.dtype = MTS_DTYPE_FLOAT;
    x.rank = 1;
    x.dims[0] = 256;
    x.data = f;
    const mts_tensor *in[3] = {&x, NULL, NULL};
    for (int i = 0; i < n_ops; i++) in[i + 1] = ops[i];
    float out[256];
    mts_kctx fk = {nd, in, n_ops + 1, &y, 1, err, 1, NULL};
    int rc = op->infer(&fk);
    if (rc) return rc;
    if (y.dtype != MTS_DTYPE_FLOAT || mts_tensor_numel(&y) != 256)
        return mts_err_set(err, MTS_EINVAL, "'%s' is not an elementwise float op", name);
    if (!f) return MTS_OK;
    y.data = out;
    if ((rc = op->run(&fk))) return rc;
    memcpy(f, out, sizeof out);
    return MTS_OK;
}

static int qunary_run(mts_kctx *k)
{
    int rc = qelt_infer(k, false);
    if (rc) return rc;
    const mts_tensor *x = mts_kin(k, 0);
    qelt_job j = {.a = x->data, .y = k->out[0].data, .n = mts_tensor_numel(x)};
    int op = (int)mts_attr_int(k->node, "mts_qop", 0);
    float alpha = mts_attr_float(k->node, "alpha", 0.01f), xs = sc_at(mts_kin(k, 1), 0), ys = sc_at(mts_kin(k, 3), 0);
    int32_t xz = zp_at(mts_kin(k, 2), 0), yz = zp_at(mts_kin(k, 4), 0);
    bool xsg = x->dtype == MTS_DTYPE_INT8, ysg = k->out[0].dtype == MTS_DTYPE_INT8;
    if (op != 1 && op != 2 && op != 6) return mts_err_set(k->err, MTS_EINVAL, "unknown mts_qop %d", op);
    float f[256];
    for (int v = 0; v < 256; v++) {
        int32_t q = xsg ? (int32_t)(int8_t)v : v;
        f[v] = (float)(q - xz) * xs;
        if (op != 6) f[v] = op == 1 ? (f[v] < 0 ? 0.0f : f[v]) : (f[v] < 0.0f ? f[v] * alpha : f[v]);
    }
    if (op == 6) { /* the float op's constant operands follow y_zero_point */
        const mts_tensor *ops[2] = {mts_kin(k, 5), mts_kin(k, 6)};
        if ((rc = mts_quant_table_op(k->node, mts_attr_string(k->node, "mts_float_op", NULL), ops, k->n_in - 5, f,
                                     k->err)))
            return rc;
    }
    for (int v = 0; v < 256; v++) q8_store(j.lut, ysg, v, f[v] / ys, yz);
    mts_parallel(threads_for(k, j.n), qunary_part, &j);
    return MTS_OK;
}

static void qadd_part(void *ctx, int ithr, int nthr)
{
    const qelt_job *j = ctx;
    int64_t i0 = j->n * ithr / nthr, i1 = j->n * (ithr + 1) / nthr, i = i0;
#ifdef QR_SSE2
    if (!j->a_sgn && !j->b_sgn) {
        const __m128 lo = _mm_set1_ps(-2097152.0f), hi = _mm_set1_ps(2097152.0f), mg = _mm_set1_ps(12582912.0f);
        const __m128 asv = _mm_set1_ps(j->as), bsv = _mm_set1_ps(j->bs), ysv = _mm_set1_ps(j->ys);
        const __m128 zv = _mm_set1_ps((float)j->yz);
        const __m128i azv = _mm_set1_epi32(j->az), bzv = _mm_set1_epi32(j->bz), z = _mm_setzero_si128();
        for (; i + 16 <= i1; i += 16) {
            __m128i av = _mm_loadu_si128((const __m128i *)(j->a + i)), bv = _mm_loadu_si128((const __m128i *)(j->b + i));
            __m128i a16[2] = {_mm_unpacklo_epi8(av, z), _mm_unpackhi_epi8(av, z)};
            __m128i b16[2] = {_mm_unpacklo_epi8(bv, z), _mm_unpackhi_epi8(bv, z)};
            __m128i q[4];
            for (int t = 0; t < 4; t++) {
                __m128i a32 = t & 1 ? _mm_unpackhi_epi16(a16[t >> 1], z) : _mm_unpacklo_epi16(a16[t >> 1], z);
                __m128i b32 = t & 1 ? _mm_unpackhi_epi16(b16[t >> 1], z) : _mm_unpacklo_epi16(b16[t >> 1], z);
                __m128 fa = _mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(a32, azv)), asv);
                __m128 fb = _mm_mul_ps(_mm_cvtepi32_ps(_mm_sub_epi32(b32, bzv)), bsv);
                __m128 v = _mm_div_ps(_mm_add_ps(fa, fb), ysv);
                v = _mm_min_ps(_mm_max_ps(v, lo), hi);
                v = _mm_add_ps(_mm_sub_ps(_mm_add_ps(v, mg), mg), zv);
                q[t] = _mm_cvtps_epi32(v);
            }
            __m128i h0 = _mm_packs_epi32(q[0], q[1]), h1 = _mm_packs_epi32(q[2], q[3]);
            __m128i r = j->y_sgn ? _mm_packs_epi16(h0, h1) : _mm_packus_epi16(h0, h1);
            _mm_storeu_si128((__m128i *)(j->y + i), r);
        }
    }
#endif
    for (; i < i1; i++) {
        float fa = (float)(q8_get(j->a, j->a_sgn, i) - j->az) * j->as;
        float fb = (float)(q8_get(j->b, j->b_sgn, i) - j->bz) * j->bs;
        q8_store(j->y, j->y_sgn, i, (fa + fb) / j->ys, j->yz);
    }
}

static int qadd_run(mts_kctx *k)
{
    int rc = qelt_infer(k, true);
    if (rc) return rc;
    const mts_tensor *a = mts_kin(k, 0), *b = mts_kin(k, 3);
    qelt_job j = {.a = a->data, .b = b->data, .y = k->out[0].data, .n = mts_tensor_numel(a)};
    j.a_sgn = a->dtype == MTS_DTYPE_INT8;
    j.b_sgn = b->dtype == MTS_DTYPE_INT8;
    j.y_sgn = k->out[0].dtype == MTS_DTYPE_INT8;
    j.as = sc_at(mts_kin(k, 1), 0);
    j.az = zp_at(mts_kin(k, 2), 0);
    j.bs = sc_at(mts_kin(k, 4), 0);
    j.bz = zp_at(mts_kin(k, 5), 0);
    j.ys = sc_at(mts_kin(k, 6), 0);
    j.yz = zp_at(mts_kin(k, 7), 0);
    mts_parallel(threads_for(k, j.n), qadd_part, &j);
    return MTS_OK;
}

/* MtsQLinearConcat: Q(Concat(DQ(a), DQ(b))) along the Concat's axis (inputs a, a_scale, a_zp,
 * b, b_scale, b_zp, y_scale, y_zp) and MtsQLinearUpsample: Q(nearest upsampling of DQ(x)) by
 * the integer factors mts_up_h, mts_up_w of a 4-D x (inputs x, x_scale, x_zp, y_scale, y_zp).
 * Both only move values, so each input byte maps through its own 256-entry table
 * q -> Q(DQ(q)), computed with the unfused float operations: the unfused results exactly. */
static void requant_lut(const mts_tensor *x, const mts_tensor *xs, const mts_tensor *xz, const mts_tensor *ys,
                        const mts_tensor *yz, bool ysg, uint8_t *lut)
{
    bool xsg = x->dtype == MTS_DTYPE_INT8;
    float sx = sc_at(xs, 0), sy = sc_at(ys, 0);
    int32_t zx = zp_at(xz, 0), zy = zp_at(yz, 0);
    for (int v = 0; v < 256; v++) {
        int32_t q = xsg ? (int32_t)(int8_t)v : v;
        q8_store(lut, ysg, v, (float)(q - zx) * sx / sy, zy);
    }
}

/* The concatenation axis: the node's, or the last one on channels-last views (nhwc). */
static int64_t qconcat_axis(mts_kctx *k, bool nhwc)
{
    const mts_tensor *a = mts_kin(k, 0);
    int64_t ax = nhwc ? a->rank - 1 : mts_attr_int(k->node, "axis", 0);
    return ax < 0 ? ax + a->rank : ax;
}

static int qconcat_infer_common(mts_kctx *k, bool nhwc)
{
    int rc = qelt_infer(k, true); /* same operands as MtsQLinearAdd; shapes checked below */
    if (rc && rc != MTS_ESHAPE) return rc;
    const mts_tensor *a = mts_kin(k, 0), *b = mts_kin(k, 3);
    int64_t ax = qconcat_axis(k, nhwc);
    if (a->rank != b->rank || ax < 0 || ax >= a->rank) return mts_err_set(k->err, MTS_ESHAPE, "bad concat axis");
    for (int i = 0; i < a->rank; i++)
        if (i != ax && a->dims[i] != b->dims[i]) return mts_err_set(k->err, MTS_ESHAPE, "concat shapes differ");
    set_shape(&k->out[0], mts_kin(k, 7)->dtype, a);
    k->out[0].dims[ax] = a->dims[ax] + b->dims[ax];
    return MTS_OK;
}

static int qconcat_infer(mts_kctx *k)
{
    return qconcat_infer_common(k, false);
}

/* On [N,H,W,C] views of channels-last tensors (a Concat along channels): along the last axis. */
static int qconcat_nhwc_infer(mts_kctx *k)
{
    return qconcat_infer_common(k, true);
}

typedef struct qcat_job {
    const uint8_t *x[2];
    uint8_t *y;
    int64_t outer, len[2];
    uint8_t lut[2][256];
} qcat_job;

/* Outer slices [o0, o1): each the two inputs' runs, mapped through their tables. */
static void qconcat_part(void *ctx, int ithr, int nthr)
{
    const qcat_job *j = ctx;
    int64_t o0 = j->outer * ithr / nthr, o1 = j->outer * (ithr + 1) / nthr;
    uint8_t *y = j->y + o0 * (j->len[0] + j->len[1]);
    for (int64_t o = o0; o < o1; o++)
        for (int i = 0; i < 2; i++) {
            const uint8_t *x = j->x[i] + o * j->len[i], *lut = j->lut[i];
            for (int64_t e = 0; e < j->len[i]; e++) y[e] = lut[x[e]];
            y += j->len[i];
        }
}

static int qconcat_run_common(mts_kctx *k, bool nhwc)
{
    int rc = qconcat_infer_common(k, nhwc);
    if (rc) return rc;
    const mts_tensor *in[2] = {mts_kin(k, 0), mts_kin(k, 3)};
    bool ysg = k->out[0].dtype == MTS_DTYPE_INT8;
    qcat_job j;
    for (int i = 0; i < 2; i++)
        requant_lut(in[i], mts_kin(k, 3 * i + 1), mts_kin(k, 3 * i + 2), mts_kin(k, 6), mts_kin(k, 7), ysg, j.lut[i]);
    int64_t ax = qconcat_axis(k, nhwc);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < ax; i++) outer *= in[0]->dims[i];
    for (int i = (int)ax + 1; i < in[0]->rank; i++) inner *= in[0]->dims[i];
    j.y = k->out[0].data;
    j.outer = outer;
    for (int i = 0; i < 2; i++) j.x[i] = in[i]->data, j.len[i] = in[i]->dims[ax] * inner;
    int t = threads_for(k, mts_tensor_numel(&k->out[0]));
    mts_parallel(outer < t ? (int)(outer > 0 ? outer : 1) : t, qconcat_part, &j);
    return MTS_OK;
}

static int qconcat_run(mts_kctx *k)
{
    return qconcat_run_common(k, false);
}

static int qconcat_nhwc_run(mts_kctx *k)
{
    return qconcat_run_common(k, true);
}

/* nhwc: on [N,H,W,C] views of channels-last tensors. */
static int qup_infer_common(mts_kctx *k, bool nhwc)
{
    int rc = qelt_infer(k, false);
    if (rc) return rc;
    const mts_tensor *x = mts_kin(k, 0);
    int64_t fh = mts_attr_int(k->node, "mts_up_h", 0), fw = mts_attr_int(k->node, "mts_up_w", 0);
    if (x->rank != 4 || fh < 1 || fw < 1 || fh > 64 || fw > 64)
        return mts_err_set(k->err, MTS_EINVAL, "MtsQLinearUpsample wants a 4-D input and factors in 1..64");
    int h = nhwc ? 1 : 2;
    k->out[0].dims[h] = x->dims[h] * fh;
    k->out[0].dims[h + 1] = x->dims[h + 1] * fw;
    return MTS_OK;
}

static int qup_infer(mts_kctx *k)
{
    return qup_infer_common(k, false);
}

static int qup_nhwc_infer(mts_kctx *k)
{
    return qup_infer_common(k, true);
}

typedef struct qup_job {
    const uint8_t *x;
    uint8_t *y;
    int64_t rows, W, C, fh, fw;
    uint8_t lut[256];
} qup_job;

static void qup_nhwc_part(void *ctx, int ithr, int nthr)
{
    const qup_job *j = ctx;
    int64_t r0 = j->rows * ithr / nthr, r1 = j->rows * (ithr + 1) / nthr, W = j->W, C = j->C, fw = j->fw;
    int64_t orow = W * fw * C;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *xr = j->x + r * W * C;
        uint8_t *row = j->y + r * j->fh * orow;
        for (int64_t w = 0; w < W; w++) {
            uint8_t *d = row + w * fw * C;
            for (int64_t c = 0; c < C; c++) d[c] = j->lut[xr[w * C + c]];
            for (int64_t f = 1; f < fw; f++) memcpy(d + f * C, d, (size_t)C);
        }
        for (int64_t f = 1; f < j->fh; f++) memcpy(row + f * orow, row, (size_t)orow);
    }
}

/* Channels-last: each input pixel's C bytes map through the table once, then the pixel is
 * repeated fw times along the row and the row fh times; rows of the input in parallel. */
static int qup_nhwc_run(mts_kctx *k)
{
    int rc = qup_infer_common(k, true);
    if (rc) return rc;
    const mts_tensor *x = mts_kin(k, 0);
    qup_job j = {.x = x->data, .y = k->out[0].data};
    requant_lut(x, mts_kin(k, 1), mts_kin(k, 2), mts_kin(k, 3), mts_kin(k, 4), k->out[0].dtype == MTS_DTYPE_INT8,
                j.lut);
    j.fh = mts_attr_int(k->node, "mts_up_h", 0), j.fw = mts_attr_int(k->node, "mts_up_w", 0);
    j.rows = x->dims[0] * x->dims[1], j.W = x->dims[2], j.C = x->dims[3];
    int t = threads_for(k, mts_tensor_numel(&k->out[0]));
    mts_parallel(j.rows < t ? (int)(j.rows > 0 ? j.rows : 1) : t, qup_nhwc_part, &j);
    return MTS_OK;
}

static int qup_run(mts_kctx *k)
{
    int rc = qup_infer(k);
    if (rc) return rc;
    const mts_tensor *x = mts_kin(k, 0);
    uint8_t lut[256];
    requant_lut(x, mts_kin(k, 1), mts_kin(k, 2), mts_kin(k, 3), mts_kin(k, 4), k->out[0].dtype == MTS_DTYPE_INT8,
                lut);
    int64_t fh = mts_attr_int(k->node, "mts_up_h", 0), fw = mts_attr_int(k->node, "mts_up_w", 0);
    int64_t planes = x->dims[0] * x->dims[1], H = x->dims[2], W = x->dims[3], OW = W * fw;
    const uint8_t *src = x->data;
    uint8_t *y = k->out[0].data;
    for (int64_t pl = 0; pl < planes; pl++)
        for (int64_t h = 0; h < H; h++) {
            const uint8_t *xr = src + (pl * H + h) * W;
            uint8_t *row = y + (pl * H + h) * fh * OW;
            for (int64_t w = 0; w < W; w++) {
                uint8_t v = lut[xr[w]];
                for (int64_t f = 0; f < fw; f++) row[w * fw + f] = v;
            }
            for (int64_t f = 1; f < fh; f++) memcpy(row + f * OW, row, (size_t)OW);
        }
    return MTS_OK;
}

const mts_op mts_ref_ops_quant[] = {
    {"QuantizeLinear", quant_infer, quant_run},
    {"DequantizeLinear", dequant_infer, dequant_run},
    {"DynamicQuantizeLinear", dynq_infer, dynq_run},
    {"MatMulInteger", mmint_infer, mmint_run},
    {"QLinearMatMul", qlmm_infer, qlmm_run},
    {"ConvInteger", convint_infer, convint_run},
    {"QLinearConv", qlconv_infer, qlconv_run},
    {NULL, NULL, NULL},
};

const mts_op mts_quant_fast_matmulinteger = {"MatMulInteger", mmint_infer, mmint_run_fast};
const mts_op mts_quant_fast_qlinearmatmul = {"QLinearMatMul", qlmm_infer, qlmm_run_fast};
const mts_op mts_quant_fast_convinteger = {"ConvInteger", convint_infer, convint_run_fast};
const mts_op mts_quant_fast_qlinearconv = {"QLinearConv", qlconv_infer, qlconv_run_fast};
const mts_op mts_quant_fast_qunary = {"MtsQLinearUnary", qunary_infer, qunary_run};
const mts_op mts_quant_fast_qadd = {"MtsQLinearAdd", qadd_infer, qadd_run};
const mts_op mts_quant_fast_qconcat = {"MtsQLinearConcat", qconcat_infer, qconcat_run};
const mts_op mts_quant_fast_qupsample = {"MtsQLinearUpsample", qup_infer, qup_run};
const mts_op mts_quant_fast_qconcat_nhwc = {"MtsQLinearConcat", qconcat_nhwc_infer, qconcat_nhwc_run};
const mts_op mts_quant_fast_qupsample_nhwc = {"MtsQLinearUpsample", qup_nhwc_infer, qup_nhwc_run};
