/*
 * Fast float kernels the optimizer substitutes for reference kernels in the default backend
 * (optimize.c). Each one checks at run time that it handles the case in front of it and
 * otherwise calls the reference kernel, which stays the oracle (tests/unit/test_engine_fast.c
 * compares the two on random data):
 *   - Reduce{Mean,Max,Sum} over one contiguous range of axes, viewed as [outer, R, inner]: the
 *     channel mean/max of spatial attention (inner = 1) and the global pooling of channel
 *     attention on channels-last data (inner = C); sums are accumulated in float blocks flushed
 *     into double, max propagates NaN like the reference;
 *   - LayerNormalization over trailing axes with full-size scale/bias and no saved statistics;
 *   - Softmax over the last axis, with an optional input scale (attribute "mts_scale", set when
 *     the optimizer folds a Div/Mul by a constant scalar into it);
 *   - an elementwise chain ("MtsEltwiseChain"): in[0] followed by stages listed in the INTS
 *     attribute "ops" (Add, Sub, Mul, Div with the next input, broadcast numpy-style to the
 *     output, or Relu / Sigmoid / HardSwish / Erf), computed in one pass over the output;
 *   - the spatial-attention pooling of CBAM ("MtsChannelPool"): per pixel of a channels-last
 *     [N,H,W,C] tensor, optionally times a per-channel scale [N,1,1,C] (the channel attention,
 *     so its product is never stored for the pooling), the channel mean and max written as the
 *     two channels of one [N,H,W,2] output (the Concat that followed);
 *   - Conv with 1-4 output channels (stride 1; at most 4 input channels with one output,
 *     64 with more and a kernel of 3x3 or more: CBAM's 7x7 2->1 spatial attention, the
 *     lip-sync UNets' 3-channel heads):
 *     direct, all output channels of 16 pixels per pass over bands of zero-padded input rows
 *     (oneDNN's blocked kernels compute 16 output channels at a time, so 1-4 waste most lanes);
 *     source and output each channels-last or not (a channels-last source is transposed into
 *     the padded planes 16 pixels at a time; in bf16 plans it may hold bfloat16, attribute
 *     "mts_src_bf16", widened to float as it is transposed, or floats to be rounded to
 *     bfloat16 values, attribute "mts_src_round": the same numbers when bf16 hand-offs are
 *     off); a Relu or Sigmoid fused into it (attribute "mts_act") is applied to each output
 *     row as it is written;
 *   - Conv on one input pixel with a 1x1 kernel (squeeze-and-excitation and attention MLPs):
 *     a matrix-vector product per sample on the weights as stored, where the reference
 *     GEMM would pack the weights on every call;
 *   - a batched MatMul on strided views ("MtsStridedMatMul", attention): A, B and Y are read and
 *     written through explicit element strides over two batch dims, so the Reshape/Transpose
 *     steps around attention MatMuls become strides instead of copies; the products run in the
 *     engine's GEMM (gemm.c), which reads its operands through strides.
 * The vector code uses GCC vector extensions (16 floats), so it compiles to whatever vector
 * instructions the target has; target_clones builds AVX-512 and AVX2 variants chosen at load.
 * Large kernels split their work over the context's threads with mts_parallel.
 */
/* The v16f helpers are inlined into every clone, so their by-value ABI never matters. */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/gemm.h"
#include "engine/kernels/kernel.h"
#include "engine/kernels/vec16.h"

/* Multiply-adds from which the small-channel conv splits over the context's threads. */
#define FAST_SCONV_MT (1 << 21)
/* The small-channel conv: at most this many output channels (oneDNN's kernels compute 16 output
 * channels at a time, so 1-4 leave 75-94 % of each vector idle) and, with more than one output,
 * input channels; output rows per band of padded input it builds. */
#define FAST_SCONV_MAX_M 4
#define FAST_SCONV_MAX_C 64
#define FAST_SCONV_BAND 8

static inline __attribute__((always_inline)) v16f splat16(float f)
{
    return (v16f){0} + f; /* scalar operands broadcast; +0 is exact for every f but -0 */
}

static inline __attribute__((always_inline)) float hsum16(v16f v)
{
    typedef int32_t v16m __attribute__((vector_size(64)));
    v = v + __builtin_shuffle(v, (v16m){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    v = v + __builtin_shuffle(v, (v16m){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    v = v + __builtin_shuffle(v, (v16m){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    return v[0] + v[1];
}

/* max(a, b) lane by lane (a where b is NaN). Written per lane so that the vectorizer emits a
 * compare-and-blend with AVX-512 mask registers (a vector mask would need AVX512DQ). */
static inline __attribute__((always_inline)) v16f vmax16(v16f a, v16f b)
{
    v16f r;
    for (int l = 0; l < 16; l++) r[l] = b[l] > a[l] ? b[l] : a[l];
    return r;
}

static inline __attribute__((always_inline)) float hmax16(v16f v)
{
    typedef int32_t v16m __attribute__((vector_size(64)));
    v = vmax16(v, __builtin_shuffle(v, (v16m){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
    v = vmax16(v, __builtin_shuffle(v, (v16m){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
    v = vmax16(v, __builtin_shuffle(v, (v16m){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
    return v[0] > v[1] ? v[0] : v[1];
}

/* exp(x) for |x| within float range: 2^n * p(r), r = x - n ln2, |r| <= ln2/2, degree-6
 * polynomial (relative error ~2e-7); x below -87.3 gives 0 (with the clamp, a tiny denormal). */
static inline __attribute__((always_inline)) v16f vexp16(v16f x)
{
    for (int l = 0; l < 16; l++) x[l] = x[l] < -87.3f ? -87.3f : x[l] > 88.3f ? 88.3f : x[l];
    const v16f magic = splat16(12582912.0f); /* 1.5 * 2^23: rounds to nearest */
    v16f n = (x * splat16(1.44269504f) + magic) - magic;
    v16f r = x - n * splat16(0.693359375f);
    r = r - n * splat16(-2.12194440e-4f);
    v16f p = splat16(1.0f / 720);
    p = p * r + splat16(1.0f / 120);
    p = p * r + splat16(1.0f / 24);
    p = p * r + splat16(1.0f / 6);
    p = p * r + splat16(0.5f);
    p = p * r + splat16(1.0f);
    p = p * r + splat16(1.0f);
    v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
    return p * (v16f)e;
}

/* erf(x), 16 lanes: for |x| < 1/2 the Maclaurin series to x^15 (its next term is below 1e-9 of
 * the sum), else 1 - (a1 t + ... + a5 t^5) exp(-x^2), t = 1 / (1 + p |x|) (Abramowitz and Stegun
 * 7.1.26, absolute error below 1.5e-7), with |x| clamped at 4 (erf(4) is 1 in float) and the
 * sign put back; NaN stays NaN. */
static inline __attribute__((always_inline)) v16f verf16(v16f x)
{
    const v16i sign = (v16i){0} + INT32_MIN; /* the sign bit (splat16 cannot make -0) */
    v16f ax = (v16f)((v16i)x & ~sign);
    for (int l = 0; l < 16; l++) ax[l] = ax[l] > 4.0f ? 4.0f : ax[l]; /* NaN stays */
    v16f x2 = ax * ax;
    /* 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)), n = 0..7, in Horner form over x^2 */
    v16f s = splat16(-1.0f / 75600);
    s = s * x2 + splat16(1.0f / 9360);
    s = s * x2 + splat16(-1.0f / 1320);
    s = s * x2 + splat16(1.0f / 216);
    s = s * x2 + splat16(-1.0f / 42);
    s = s * x2 + splat16(1.0f / 10);
    s = s * x2 + splat16(-1.0f / 3);
    s = s * x2 + splat16(1.0f);
    s = s * ax * splat16(1.12837917f);
    v16f t = splat16(1.0f) / (splat16(1.0f) + splat16(0.3275911f) * ax);
    v16f q = splat16(1.061405429f);
    q = q * t + splat16(-1.453152027f);
    q = q * t + splat16(1.421413741f);
    q = q * t + splat16(-0.284496736f);
    q = q * t + splat16(0.254829592f);
    v16f big = splat16(1.0f) - q * t * vexp16(-x2), r;
    for (int l = 0; l < 16; l++) r[l] = ax[l] < 0.5f ? s[l] : big[l]; /* NaN: big is NaN */
    return (v16f)((v16i)r | ((v16i)x & sign));
}

/* Relu (NaN kept), Sigmoid, HardSwish or Erf (MTS_CHAIN_RELU / _SIGMOID / _HARDSWISH / _ERF) on n floats in
 * place: the elementwise chains' stages and the small-channel conv's fused activation. HardSwish
 * is the reference kernel's x * clamp(x / 6 + 1/2, 0, 1), with x / 6 + 1/2 one fused
 * multiply-add (this file contracts them), so within a rounding of the reference. */
static inline __attribute__((always_inline)) void act_inplace(float *b, int64_t n, int op)
{
    int64_t i = 0;
    if (op == MTS_CHAIN_RELU) {
        for (; i + 16 <= n; i += 16) st16(b + i, vmax16(ld16(b + i), splat16(0)));
        for (; i < n; i++) b[i] = b[i] > 0 ? b[i] : (b[i] != b[i] ? b[i] : 0.0f);
    } else if (op == MTS_CHAIN_ERF) {
        for (; i + 16 <= n; i += 16) st16(b + i, verf16(ld16(b + i)));
        for (; i < n; i++) b[i] = erff(b[i]);
    } else if (op == MTS_CHAIN_HARDSWISH) {
        for (; i + 16 <= n; i += 16) {
            v16f v = ld16(b + i), t = v * splat16(1.0f / 6.0f) + splat16(0.5f);
            for (int l = 0; l < 16; l++) t[l] = t[l] > 1.0f ? 1.0f : t[l] > 0.0f ? t[l] : 0.0f;
            st16(b + i, v * t);
        }
        for (; i < n; i++) b[i] = b[i] * fmaxf(0.0f, fminf(1.0f, b[i] * (1.0f / 6.0f) + 0.5f));
    } else {
        for (; i + 16 <= n; i += 16) st16(b + i, splat16(1.0f) / (splat16(1.0f) + vexp16(-ld16(b + i))));
        for (; i < n; i++) b[i] = 1.0f / (1.0f + expf(-b[i]));
    }
}

/* The reference kernel of the same op type (the fallback). */
static int ref_run(mts_kctx *k, const char *op_type)
{
    const mts_op *op = mts_op_lookup(op_type);
    return op ? op->run(k) : mts_err_set(k->err, MTS_EUNSUPPORTED, "no reference kernel for %s", op_type);
}

static int ref_infer(mts_kctx *k, const char *op_type)
{
    const mts_op *op = mts_op_lookup(op_type);
    return op ? op->infer(k) : mts_err_set(k->err, MTS_EUNSUPPORTED, "no reference kernel for %s", op_type);
}

static int64_t numel_of(const mts_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->dims[i];
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* Reductions                                                                                 */
/* ------------------------------------------------------------------------------------------ */

enum { FR_SUM, FR_MEAN, FR_MAX };

typedef struct red_job {
    int op;
    const float *x;
    int64_t outer, R, inner;
    int nsplit;    /* R is cut into nsplit parts (outer < threads) */
    double *part;  /* [outer][nsplit][inner] partial sums or maxima */
    float *y;      /* inner == 1 with nsplit == 1: results directly */
} red_job;

/* One row of R contiguous values. */
MTS_VEC_CLONES static double red_row(int op, const float *x, int64_t R)
{
    int64_t i = 0;
    if (op == FR_MAX) {
        v16f a = splat16(-INFINITY), chk = splat16(0); /* chk: NaN once a NaN or inf was seen */
        for (; i + 16 <= R; i += 16) {
            v16f v = ld16(x + i);
            chk += v * splat16(0);
            a = vmax16(a, v);
        }
        float m = hmax16(a);
        bool nan = false;
        if (hsum16(chk) != 0)
            for (int64_t q = 0; q < i; q++) nan |= x[q] != x[q];
        for (; i < R; i++) {
            if (x[i] != x[i]) nan = true;
            if (x[i] > m) m = x[i];
        }
        return nan ? NAN : m;
    }
    double s = 0;
    while (i < R) {
        int64_t e = i + 4096 < R ? i + 4096 : R;
        v16f a = splat16(0);
        for (; i + 16 <= e; i += 16) a += ld16(x + i);
        float f = hsum16(a);
        for (; i < e; i++) f += x[i];
        s += f;
    }
    return s;
}

/* Rows [r0, r1) of x ([R][inner]) reduced into acc[inner] (doubles; acc holds the start value). */
MTS_VEC_CLONES static void red_cols(int op, const float *x, int64_t r0, int64_t r1, int64_t inner, double *acc,
                                    float *tmp)
{
    float chk[256];
    for (int64_t c0 = 0; c0 < inner; c0 += 256) {
        int64_t w = inner - c0 < 256 ? inner - c0 : 256;
        for (int64_t rb = r0; rb < r1; rb += 64) {
            int64_t re = rb + 64 < r1 ? rb + 64 : r1;
            if (op == FR_MAX) {
                for (int64_t c = 0; c < w; c++) tmp[c] = (float)acc[c0 + c], chk[c] = 0;
            } else
                memset(tmp, 0, sizeof(float) * (size_t)w);
            for (int64_t r = rb; r < re; r++) {
                const float *xr = x + r * inner + c0;
                int64_t c = 0;
                if (op == FR_MAX) {
                    for (; c + 16 <= w; c += 16) {
                        v16f v = ld16(xr + c);
                        st16(tmp + c, vmax16(ld16(tmp + c), v));
                        st16(chk + c, ld16(chk + c) + v * splat16(0));
                    }
                    for (; c < w; c++) {
                        if (xr[c] > tmp[c]) tmp[c] = xr[c];
                        chk[c] += xr[c] * 0.0f;
                    }
                } else {
                    for (; c + 16 <= w; c += 16) st16(tmp + c, ld16(tmp + c) + ld16(xr + c));
                    for (; c < w; c++) tmp[c] += xr[c];
                }
            }
            if (op == FR_MAX)
                for (int64_t c = 0; c < w; c++) {
                    acc[c0 + c] = tmp[c];
                    if (chk[c] != 0) /* a NaN or inf in this column: NaN wins, as in the reference */
                        for (int64_t r = rb; r < re; r++)
                            if (x[r * inner + c0 + c] != x[r * inner + c0 + c]) acc[c0 + c] = NAN;
                }
            else
                for (int64_t c = 0; c < w; c++) acc[c0 + c] += tmp[c];
        }
    }
}

static void red_part(void *arg, int ithr, int nthr)
{
    red_job *j = arg;
    float tmp[256];
    int64_t items = j->outer * j->nsplit;
    int64_t lo = items * ithr / nthr, hi = items * (ithr + 1) / nthr;
    for (int64_t it = lo; it < hi; it++) {
        int64_t o = it / j->nsplit, sp = it % j->nsplit;
        int64_t r0 = j->R * sp / j->nsplit, r1 = j->R * (sp + 1) / j->nsplit;
        const float *x = j->x + o * j->R * j->inner;
        if (j->inner == 1) {
            double v = red_row(j->op, x + r0, r1 - r0);
            if (j->y) {
                if (j->op == FR_MEAN) v /= (double)j->R;
                j->y[o] = (float)v;
            } else {
                j->part[it] = v;
            }
            continue;
        }
        double *acc = j->part + it * j->inner;
        double init = j->op == FR_MAX ? -INFINITY : 0.0;
        for (int64_t c = 0; c < j->inner; c++) acc[c] = init;
        red_cols(j->op, x, r0, r1, j->inner, acc, tmp);
    }
}

/* Reduced axes as one contiguous range [*a0, *a1]; false otherwise (or when there are none). */
static bool red_axes(const mts_kctx *k, const mts_tensor *x, int *a0, int *a1)
{
    const int64_t *ax = NULL;
    int n = 0;
    const mts_tensor *at = mts_kin(k, 1);
    if (at) {
        if (at->dtype != MTS_DTYPE_INT64 || !at->data || at->rank != 1) return false;
        ax = at->data;
        n = (int)at->dims[0];
    } else {
        ax = mts_attr_ints(k->node, "axes", &n);
    }
    if (!ax || n <= 0 || n > x->rank) return false;
    bool red[MTS_MAX_RANK] = {false};
    for (int i = 0; i < n; i++) {
        int64_t a = ax[i] < 0 ? ax[i] + x->rank : ax[i];
        if (a < 0 || a >= x->rank || red[a]) return false;
        red[a] = true;
    }
    int lo = -1, hi = -1;
    for (int i = 0; i < x->rank; i++)
        if (red[i]) {
            if (lo < 0) lo = i;
            else if (hi != i - 1) return false;
            hi = i;
        }
    *a0 = lo, *a1 = hi;
    return true;
}

static int fast_reduce_run(mts_kctx *k)
{
    const char *opn = k->node->op_type;
    int op = !strcmp(opn, "ReduceMax") ? FR_MAX : !strcmp(opn, "ReduceMean") ? FR_MEAN : FR_SUM;
    const mts_tensor *x = mts_kin(k, 0);
    int a0, a1;
    if (!x || x->dtype != MTS_DTYPE_FLOAT || k->n_out != 1 || !red_axes(k, x, &a0, &a1)) return ref_run(k, opn);
    int64_t outer = 1, R = 1, inner = 1;
    for (int i = 0; i < x->rank; i++) {
        if (i < a0) outer *= x->dims[i];
        else if (i <= a1) R *= x->dims[i];
        else inner *= x->dims[i];
    }
    if (R < 1 || numel_of(&k->out[0]) != outer * inner) return ref_run(k, opn);
    if (outer * inner == 0) return MTS_OK;
    int threads = k->threads;
    if (outer * R * inner < (1 << 15)) threads = 1;
    red_job j = {op, x->data, outer, R, inner, 1, NULL, NULL};
    if (outer < threads && R >= 4 * threads) j.nsplit = threads;
    if (inner == 1 && j.nsplit == 1) {
        j.y = k->out[0].data;
        mts_parallel(threads, red_part, &j);
        return MTS_OK;
    }
    j.part = malloc(sizeof(double) * (size_t)(outer * j.nsplit * inner));
    if (!j.part) return mts_err_set(k->err, MTS_ENOMEM, "out of memory for reduction partials");
    mts_parallel(threads, red_part, &j);
    float *y = k->out[0].data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t c = 0; c < inner; c++) {
            double v = j.part[o * j.nsplit * inner + c];
            for (int s = 1; s < j.nsplit; s++) {
                double w = j.part[(o * j.nsplit + s) * inner + c];
                if (op == FR_MAX) v = (w > v || w != w || v != v) ? (v != v ? v : w) : v;
                else v += w;
            }
            if (op == FR_MEAN) v /= (double)R;
            y[o * inner + c] = (float)v;
        }
    free(j.part);
    return MTS_OK;
}

static int fast_reduce_infer(mts_kctx *k)
{
    return ref_infer(k, k->node->op_type);
}

/* ------------------------------------------------------------------------------------------ */
/* LayerNormalization and Softmax over trailing axes                                          */
/* ------------------------------------------------------------------------------------------ */

MTS_VEC_CLONES static void ln_rows(const float *x, float *y, int64_t rows, int64_t m, const float *sc, const float *bi,
                                   float eps, bool relu)
{
    for (int64_t r = 0; r < rows; r++, x += m, y += m) {
        v16f a = splat16(0);
        int64_t i = 0;
        for (; i + 16 <= m; i += 16) a += ld16(x + i);
        float s = hsum16(a);
        for (; i < m; i++) s += x[i];
        float mu = s / (float)m;
        v16f vm = splat16(mu);
        a = splat16(0);
        float q = 0;
        for (i = 0; i + 16 <= m; i += 16) {
            v16f d = ld16(x + i) - vm;
            a += d * d;
        }
        q = hsum16(a);
        for (; i < m; i++) q += (x[i] - mu) * (x[i] - mu);
        float inv = 1.0f / sqrtf(q / (float)m + eps);
        v16f vi = splat16(inv);
        for (i = 0; i + 16 <= m; i += 16) {
            v16f v = (ld16(x + i) - vm) * vi;
            if (sc) v *= ld16(sc + i);
            if (bi) v += ld16(bi + i);
            if (relu) v = vmax16(v, splat16(0));
            st16(y + i, v);
        }
        for (; i < m; i++) {
            float v = (x[i] - mu) * inv * (sc ? sc[i] : 1.0f) + (bi ? bi[i] : 0.0f);
            y[i] = relu && !(v > 0) ? 0.0f : v;
        }
    }
}

static int fast_layernorm_run(mts_kctx *k)
{
    const mts_tensor *x = mts_kin(k, 0), *sc = mts_kin(k, 1), *bi = mts_kin(k, 2);
    bool ok = x && sc && x->dtype == MTS_DTYPE_FLOAT && x->rank >= 1 && sc->dtype == MTS_DTYPE_FLOAT &&
              (!bi || bi->dtype == MTS_DTYPE_FLOAT);
    for (int j = 1; j < k->n_out; j++)
        if (!(j < k->node->n_out && k->node->out[j] < 0)) ok = false; /* statistics wanted */
    int64_t ax = mts_attr_int(k->node, "axis", -1);
    if (ok) {
        if (ax < 0) ax += x->rank;
        ok = ax >= 0 && ax < x->rank;
    }
    int64_t rows = 1, m = 1;
    if (ok) {
        for (int i = 0; i < x->rank; i++) {
            if (i < ax) rows *= x->dims[i];
            else m *= x->dims[i];
        }
        ok = numel_of(sc) == m && (!bi || numel_of(bi) == m) && m > 0;
    }
    if (!ok) return ref_run(k, "LayerNormalization");
    ln_rows(x->data, k->out[0].data, rows, m, sc->data, bi ? bi->data : NULL, mts_attr_float(k->node, "epsilon", 1e-5f),
            false);
    return MTS_OK;
}

static int fast_layernorm_infer(mts_kctx *k)
{
    return ref_infer(k, "LayerNormalization");
}

/* "MtsLayerNorm": a layer normalization the plan found written out as elementwise steps
 * (fast_backend.c): X, then an optional scale and bias of the normalized shape (the trailing
 * axes from attribute "axis"), epsilon, and "mts_relu" = 1 for a Relu after it. */
static int fast_ln_written_infer(mts_kctx *k)
{
    const mts_tensor *x = mts_kin(k, 0);
    if (!x || x->dtype != MTS_DTYPE_FLOAT || x->rank < 1 || k->n_out != 1)
        return mts_err_set(k->err, MTS_EINVAL, "malformed MtsLayerNorm step: X must be a float tensor");
    return mts_kset_out(k, 0, x->dtype, x->rank, x->dims);
}

static int fast_ln_written_run(mts_kctx *k)
{
    const mts_tensor *x = mts_kin(k, 0), *sc = mts_kin(k, 1), *bi = mts_kin(k, 2);
    int64_t ax = mts_attr_int(k->node, "axis", -1), rows = 1, m = 1;
    if (ax < 0) ax += x->rank;
    if (ax < 0 || ax >= x->rank)
        return mts_err_set(k->err, MTS_EINVAL, "MtsLayerNorm axis %lld out of range for rank %d", (long long)ax, x->rank);
    for (int i = 0; i < x->rank; i++) {
        if (i < ax) rows *= x->dims[i];
        else m *= x->dims[i];
    }
    if ((sc && (sc->dtype != MTS_DTYPE_FLOAT || numel_of(sc) != m)) || (bi && (bi->dtype != MTS_DTYPE_FLOAT || numel_of(bi) != m)))
        return mts_err_set(k->err, MTS_EINVAL, "MtsLayerNorm scale and bias must be %lld floats", (long long)m);
    if (m > 0)
        ln_rows(x->data, k->out[0].data, rows, m, sc ? sc->data : NULL, bi ? bi->data : NULL,
                mts_attr_float(k->node, "epsilon", 1e-5f), mts_attr_int(k->node, "mts_relu", 0) != 0);
    return MTS_OK;
}

MTS_VEC_CLONES static void softmax_rows(const float *x, float *y, int64_t rows, int64_t n, float scale)
{
    v16f vs = splat16(scale);
    for (int64_t r = 0; r < rows; r++, x += n, y += n) {
        v16f a = splat16(-INFINITY);
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) a = vmax16(a, ld16(x + i) * vs);
        float mx = hmax16(a);
        for (; i < n; i++) mx = x[i] * scale > mx ? x[i] * scale : mx;
        if (!(mx > -INFINITY && mx < INFINITY)) { /* all -inf or some +inf: NaN, as the reference */
            for (i = 0; i < n; i++) y[i] = NAN;
            continue;
        }
        v16f vm = splat16(mx), sum = splat16(0);
        for (i = 0; i + 16 <= n; i += 16) {
            v16f e = vexp16(ld16(x + i) * vs - vm);
            st16(y + i, e);
            sum += e;
        }
        float s = hsum16(sum);
        for (; i < n; i++) {
            float e = expf(x[i] * scale - mx);
            y[i] = e;
            s += e;
        }
        v16f vr = splat16(1.0f / s);
        for (i = 0; i + 16 <= n; i += 16) st16(y + i, ld16(y + i) * vr);
        for (; i < n; i++) y[i] *= 1.0f / s;
    }
}

static int fast_softmax_run(mts_kctx *k)
{
    const mts_tensor *x = mts_kin(k, 0);
    float scale = mts_attr_float(k->node, "mts_scale", 1.0f);
    bool v13 = k->node->opset >= 13;
    int64_t ax = mts_attr_int(k->node, "axis", v13 ? -1 : 1);
    bool ok = x && x->dtype == MTS_DTYPE_FLOAT && x->rank >= 1 && k->n_out == 1 &&
              (ax == -1 || ax == x->rank - 1) && x->dims[x->rank - 1] > 0;
    if (!ok) {
        if (scale != 1.0f) return mts_err_set(k->err, MTS_EINVAL, "scaled softmax needs float data and the last axis");
        return ref_run(k, "Softmax");
    }
    int64_t n = x->dims[x->rank - 1];
    softmax_rows(x->data, k->out[0].data, numel_of(x) / n, n, scale);
    return MTS_OK;
}

static int fast_softmax_infer(mts_kctx *k)
{
    return ref_infer(k, "Softmax");
}

/* ------------------------------------------------------------------------------------------ */
/* Elementwise chains                                                                         */
/* ------------------------------------------------------------------------------------------ */

#define CHAIN_MAX_IN 8
#define CHAIN_BLOCK 512

typedef struct chain_job {
    const int64_t *ops;
    int n_ops, n_in;
    int rank;                                  /* coalesced */
    int64_t dims[MTS_MAX_RANK];
    int64_t str[CHAIN_MAX_IN][MTS_MAX_RANK];   /* per input, in elements; 0 = broadcast */
    const float *in[CHAIN_MAX_IN];
    float *y;
    int64_t total;
} chain_job;

MTS_VEC_CLONES static void chain_block(const chain_job *j, const float *const *src, const bool *vec, int64_t n, float *y)
{
    float buf[CHAIN_BLOCK] __attribute__((aligned(64)));
    int64_t i;
    if (vec[0]) memcpy(buf, src[0], sizeof(float) * (size_t)n);
    else
        for (i = 0; i < n; i++) buf[i] = src[0][0];
    int in = 1;
    for (int s = 0; s < j->n_ops; s++) {
        int op = (int)j->ops[s];
        if (mts_chain_unary(op)) {
            act_inplace(buf, n, op);
            continue;
        }
        const float *b = src[in];
        bool bv = vec[in];
        in++;
        v16f bs = splat16(b[0]);
#define CHAIN_OP(EXPR)                                                                        \
    do {                                                                                      \
        if (bv) {                                                                             \
            for (i = 0; i + 16 <= n; i += 16) {                                               \
                v16f a = ld16(buf + i), c = ld16(b + i);                                      \
                st16(buf + i, EXPR);                                                          \
            }                                                                                 \
        } else {                                                                              \
            for (i = 0; i + 16 <= n; i += 16) {                                               \
                v16f a = ld16(buf + i), c = bs;                                               \
                st16(buf + i, EXPR);                                                          \
            }                                                                                 \
        }                                                                                     \
        for (; i < n; i++) {                                                                  \
            float a = buf[i], c = bv ? b[i] : b[0];                                           \
            buf[i] = EXPR;                                                                    \
        }                                                                                     \
    } while (0)
        switch (op) {
        case MTS_CHAIN_ADD: CHAIN_OP(a + c); break;
        case MTS_CHAIN_SUB: CHAIN_OP(a - c); break;
        case MTS_CHAIN_RSUB: CHAIN_OP(c - a); break;
        case MTS_CHAIN_MUL: CHAIN_OP(a * c); break;
        case MTS_CHAIN_DIV: CHAIN_OP(a / c); break;
        case MTS_CHAIN_RDIV: CHAIN_OP(c / a); break;
        default: break;
        }
#undef CHAIN_OP
    }
    memcpy(y, buf, sizeof(float) * (size_t)n);
}

/* Short rows (channels-last data times a per-channel operand: rows of C elements) are processed
 * several at a time: an operand that repeats one row across rows is tiled into a block-sized
 * copy (redone only when its row moves, e.g. to the next sample), an operand that walks the rows
 * contiguously is read in place. Returns false when some operand walks the rows another way. */
static bool chain_tiled(const chain_job *j, int64_t lo, int64_t hi)
{
    int r = j->rank;
    int64_t L = j->dims[r - 1];
    if (r < 2 || L * 4 > CHAIN_BLOCK) return false;
    for (int q = 0; q < j->n_in; q++) {
        int64_t si = j->str[q][r - 1], so = j->str[q][r - 2];
        if (!((si == 1 && (so == L || so == 0)) || (si == 0 && so == 0))) return false;
    }
    int64_t R = j->dims[r - 2], m = CHAIN_BLOCK / L;
    float tile[CHAIN_MAX_IN][CHAIN_BLOCK] __attribute__((aligned(64)));
    const float *tiled_from[CHAIN_MAX_IN] = {0};
    const float *src[CHAIN_MAX_IN];
    bool vec[CHAIN_MAX_IN];
    for (int64_t idx = lo; idx < hi;) {
        /* idx is at a row start (lo and hi are multiples of L); rows up to the end of dim r-2 */
        int64_t row = idx / L, in_row = row % R, outer = row / R;
        int64_t n_rows = R - in_row;
        if (n_rows > m) n_rows = m;
        if (n_rows > (hi - idx) / L) n_rows = (hi - idx) / L;
        for (int q = 0; q < j->n_in; q++) {
            int64_t off = 0, rest = outer;
            for (int d = r - 3; d >= 0; d--) {
                off += (rest % j->dims[d]) * j->str[q][d];
                rest /= j->dims[d];
            }
            const float *base = j->in[q] + off;
            if (j->str[q][r - 1] == 0) {
                src[q] = base, vec[q] = false;
            } else if (j->str[q][r - 2] == L) {
                src[q] = base + in_row * L, vec[q] = true;
            } else {
                if (tiled_from[q] != base) {
                    for (int64_t t = 0; t < m; t++) memcpy(tile[q] + t * L, base, sizeof(float) * (size_t)L);
                    tiled_from[q] = base;
                }
                src[q] = tile[q], vec[q] = true;
            }
        }
        chain_block(j, src, vec, n_rows * L, j->y + idx);
        idx += n_rows * L;
    }
    return true;
}

static void chain_part(void *arg, int ithr, int nthr)
{
    const chain_job *j = arg;
    int64_t lo = j->total * ithr / nthr, hi = j->total * (ithr + 1) / nthr;
    int r = j->rank;
    int64_t L = j->dims[r - 1];
    if (lo >= hi) return;
    if (r >= 2) {
        /* whole rows per thread for the tiled path */
        int64_t rows = j->total / L, rlo = rows * ithr / nthr * L, rhi = rows * (ithr + 1) / nthr * L;
        if (chain_tiled(j, rlo, rhi)) return;
    }
    const float *src[CHAIN_MAX_IN];
    bool vec[CHAIN_MAX_IN];
    int64_t idx_[MTS_MAX_RANK] = {0}, off[CHAIN_MAX_IN] = {0};
    for (int q = 0; q < j->n_in; q++) vec[q] = j->str[q][r - 1] != 0;
    /* Coordinates of the first row, then an odometer over the outer dims. */
    int64_t row = lo / L, col = lo % L, rr = row;
    for (int d = r - 2; d >= 0; d--) {
        idx_[d] = rr % j->dims[d];
        rr /= j->dims[d];
    }
    for (int q = 0; q < j->n_in; q++)
        for (int d = r - 2; d >= 0; d--) off[q] += idx_[d] * j->str[q][d];
    for (int64_t idx = lo; idx < hi;) {
        int64_t n = L - col;
        if (n > hi - idx) n = hi - idx;
        if (n > CHAIN_BLOCK) n = CHAIN_BLOCK;
        for (int q = 0; q < j->n_in; q++) src[q] = j->in[q] + off[q] + col * j->str[q][r - 1];
        chain_block(j, src, vec, n, j->y + idx);
        idx += n;
        col += n;
        if (col == L) {
            col = 0;
            for (int d = r - 2; d >= 0; d--) {
                for (int q = 0; q < j->n_in; q++) off[q] += j->str[q][d];
                if (++idx_[d] < j->dims[d]) break;
                for (int q = 0; q < j->n_in; q++) off[q] -= j->str[q][d] * j->dims[d];
                idx_[d] = 0;
            }
        }
    }
}

static int fast_chain_run(mts_kctx *k)
{
    int n_ops = 0;
    const int64_t *ops = mts_attr_ints(k->node, "ops", &n_ops);
    const mts_tensor *y = &k->out[0];
    chain_job jb;
    memset(&jb, 0, sizeof jb);
    chain_job *j = &jb;
    j->ops = ops;
    j->n_ops = n_ops;
    j->n_in = k->n_in;
    j->y = y->data;
    j->total = numel_of(y);
    int r = y->rank > 0 ? y->rank : 1;
    int64_t dims[MTS_MAX_RANK];
    for (int d = 0; d < r; d++) dims[d] = y->rank > 0 ? y->dims[d] : 1;
    for (int q = 0; q < k->n_in; q++) {
        const mts_tensor *t = k->in[q];
        int64_t s = 1;
        for (int d = r - 1; d >= 0; d--) {
            int td = d - (r - t->rank);
            int64_t len = td >= 0 ? t->dims[td] : 1;
            j->str[q][d] = len == 1 ? 0 : s;
            s *= len;
        }
        j->in[q] = t->data;
    }
    /* Coalesce adjacent dims that every input walks the same way. */
    int64_t cd[MTS_MAX_RANK], cs[CHAIN_MAX_IN][MTS_MAX_RANK];
    int cr = 0;
    for (int d = 0; d < r; d++) {
        if (dims[d] == 1) continue;
        bool merge = cr > 0;
        for (int q = 0; q < k->n_in && merge; q++)
            if (cs[q][cr - 1] != j->str[q][d] * dims[d]) merge = false;
        if (merge) {
            cd[cr - 1] *= dims[d];
            for (int q = 0; q < k->n_in; q++) cs[q][cr - 1] = j->str[q][d];
        } else {
            cd[cr] = dims[d];
            for (int q = 0; q < k->n_in; q++) cs[q][cr] = j->str[q][d];
            cr++;
        }
    }
    if (cr == 0) {
        cd[0] = 1;
        for (int q = 0; q < k->n_in; q++) cs[q][0] = 0;
        cr = 1;
    }
    j->rank = cr;
    memcpy(j->dims, cd, sizeof(int64_t) * (size_t)cr);
    for (int q = 0; q < k->n_in; q++) memcpy(j->str[q], cs[q], sizeof(int64_t) * (size_t)cr);
    int threads = j->total >= (1 << 15) ? k->threads : 1;
    if (j->total > 0) mts_parallel(threads, chain_part, j);
    return MTS_OK;
}

static int fast_chain_infer(mts_kctx *k)
{
    int n_ops = 0, need = 1;
    const int64_t *ops = mts_attr_ints(k->node, "ops", &n_ops);
    for (int s = 0; ops && s < n_ops; s++) need += !mts_chain_unary(ops[s]);
    if (!ops || k->n_in != need || k->n_in > CHAIN_MAX_IN || k->n_out != 1)
        return mts_err_set(k->err, MTS_EINVAL, "malformed elementwise chain");
    mts_tensor acc = *k->in[0];
    for (int q = 0; q < k->n_in; q++) {
        if (!k->in[q] || k->in[q]->dtype != MTS_DTYPE_FLOAT)
            return mts_err_set(k->err, MTS_EINVAL, "elementwise chain input %d must be float", q);
        if (q > 0) {
            mts_tensor o;
            int rc = mts_broadcast_shape(&acc, k->in[q], &o, k->err);
            if (rc) return rc;
            acc.rank = o.rank;
            memcpy(acc.dims, o.dims, sizeof acc.dims);
        }
    }
    k->out[0].dtype = MTS_DTYPE_FLOAT;
    k->out[0].rank = acc.rank;
    memcpy(k->out[0].dims, acc.dims, sizeof acc.dims);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Batched MatMul on strided views                                                            */
/* ------------------------------------------------------------------------------------------ */

/* The product runs in the engine's GEMM (gemm.c), which reads A and B through their row and
 * column strides; the two batch dimensions become one batch with per-entry offsets. */
static int fast_bmm_run(mts_kctx *k)
{
    int n[5];
    const int64_t *dims = mts_attr_ints(k->node, "dims", &n[0]);
    const int64_t *as = mts_attr_ints(k->node, "a_strides", &n[1]);
    const int64_t *bs = mts_attr_ints(k->node, "b_strides", &n[2]);
    const int64_t *ys = mts_attr_ints(k->node, "y_strides", &n[3]);
    if (!dims || !as || !bs || !ys || n[0] != 5 || n[1] != 4 || n[2] != 4 || n[3] != 4 || k->n_in != 2 ||
        ys[3] != 1)
        return mts_err_set(k->err, MTS_EINVAL, "malformed strided MatMul");
    int64_t B1 = dims[1], nb = dims[0] * dims[1];
    if (nb * dims[2] * dims[3] == 0) return MTS_OK;
    int64_t *off = malloc(sizeof(int64_t) * 3 * (size_t)nb);
    if (!off) return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    for (int64_t b = 0; b < nb; b++) {
        int64_t b0 = b / B1, b1 = b % B1;
        off[b] = b0 * as[0] + b1 * as[1];
        off[nb + b] = b0 * bs[0] + b1 * bs[1];
        off[2 * nb + b] = b0 * ys[0] + b1 * ys[1];
    }
    mts_sgemm g = {.M = dims[2], .N = dims[3], .K = dims[4],
                   .A = k->in[0]->data, .a_rs = as[2], .a_cs = as[3],
                   .B = k->in[1]->data, .b_rs = bs[2], .b_cs = bs[3],
                   .C = k->out[0].data, .ldc = ys[2], .alpha = 1.0f,
                   .nbatch = nb, .a_off = off, .b_off = off + nb, .c_off = off + 2 * nb};
    int rc = mts_sgemm_run(&g, k->threads);
    free(off);
    return rc ? mts_err_set(k->err, rc, "out of memory") : MTS_OK;
}

static int fast_bmm_infer(mts_kctx *k)
{
    int n = 0;
    const int64_t *yd = mts_attr_ints(k->node, "y_dims", &n);
    if (!yd || n < 1 || n > MTS_MAX_RANK) return mts_err_set(k->err, MTS_EINVAL, "malformed strided MatMul");
    k->out[0].dtype = MTS_DTYPE_FLOAT;
    k->out[0].rank = n;
    memcpy(k->out[0].dims, yd, sizeof(int64_t) * (size_t)n);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Channel mean + max per pixel (CBAM spatial attention)                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct cpool_job {
    const float *x, *sc; /* sc: [Ns][C] or NULL */
    float *y;
    int64_t N, P, C, Ns;
} cpool_job;

MTS_VEC_CLONES static void cpool_rows(const float *x, const float *sc, float *y, int64_t n, int64_t C)
{
    for (int64_t p = 0; p < n; p++, x += C, y += 2) {
        v16f s = splat16(0), m = splat16(-INFINITY), chk = splat16(0);
        int64_t c = 0;
        for (; c + 16 <= C; c += 16) {
            v16f v = ld16(x + c);
            if (sc) v *= ld16(sc + c);
            s += v;
            m = vmax16(m, v);
            chk += v * splat16(0);
        }
        float fs = hsum16(s), fm = hmax16(m);
        bool nan = false;
        for (; c < C; c++) {
            float v = sc ? x[c] * sc[c] : x[c];
            fs += v;
            if (v > fm) fm = v;
            nan |= v != v;
        }
        if (hsum16(chk) != 0)
            for (int64_t q = 0; q < C; q++) {
                float v = sc ? x[q] * sc[q] : x[q];
                nan |= v != v;
            }
        y[0] = fs / (float)C;
        y[1] = nan ? NAN : fm;
    }
}

static void cpool_part(void *arg, int ithr, int nthr)
{
    const cpool_job *j = arg;
    int64_t rows = j->N * j->P, lo = rows * ithr / nthr, hi = rows * (ithr + 1) / nthr;
    while (lo < hi) {
        int64_t n = lo / j->P, e = (n + 1) * j->P < hi ? (n + 1) * j->P : hi;
        const float *sc = j->sc ? j->sc + (j->Ns == 1 ? 0 : n) * j->C : NULL;
        cpool_rows(j->x + lo * j->C, sc, j->y + lo * 2, e - lo, j->C);
        lo = e;
    }
}

static int fast_cpool_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0], *sc = k->n_in > 1 ? k->in[1] : NULL;
    const mts_tensor *y = &k->out[0];
    if (x->rank != 4 || y->rank != 4 || y->dims[3] != 2 || x->dims[0] != y->dims[0] || x->dims[1] != y->dims[1] ||
        x->dims[2] != y->dims[2] || x->dims[3] < 1 ||
        (sc && (mts_tensor_numel(sc) % x->dims[3] || (mts_tensor_numel(sc) / x->dims[3] != 1 &&
                                                     mts_tensor_numel(sc) / x->dims[3] != x->dims[0]))))
        return mts_err_set(k->err, MTS_ESHAPE, "channel pooling shapes do not match");
    cpool_job j = {x->data, sc ? sc->data : NULL, y->data, x->dims[0], x->dims[1] * x->dims[2], x->dims[3],
                   sc ? mts_tensor_numel(sc) / x->dims[3] : 1};
    int threads = mts_tensor_numel(x) >= (1 << 15) ? k->threads : 1;
    mts_parallel(threads, cpool_part, &j);
    return MTS_OK;
}

static int fast_cpool_infer(mts_kctx *k)
{
    return mts_err_set(k->err, MTS_EUNSUPPORTED, "channel pooling runs only in static plans");
}

/* ------------------------------------------------------------------------------------------ */
/* Conv on one pixel with a 1x1 kernel: y[n, m] = b[m] + W[m, :] . x[n, :]                     */
/* ------------------------------------------------------------------------------------------ */

MTS_VEC_CLONES static void gemv_rows(const float *W, const float *x, const float *b, float *y, int64_t M, int64_t C)
{
    for (int64_t m = 0; m < M; m++) {
        const float *w = W + m * C;
        v16f a = splat16(0);
        int64_t c = 0;
        for (; c + 16 <= C; c += 16) a += ld16(w + c) * ld16(x + c);
        float s = hsum16(a);
        for (; c < C; c++) s += w[c] * x[c];
        y[m] = s + (b ? b[m] : 0.0f);
    }
}

static int fast_conv1px_run(mts_kctx *k)
{
    const mts_tensor *x = mts_kin(k, 0), *w = mts_kin(k, 1), *b = mts_kin(k, 2);
    const mts_node *n = k->node;
    bool ok = x && w && x->dtype == MTS_DTYPE_FLOAT && w->dtype == MTS_DTYPE_FLOAT && x->rank >= 3 &&
              w->rank == x->rank && mts_attr_int(n, "group", 1) == 1 && w->dims[1] == x->dims[1] &&
              (!b || (b->dtype == MTS_DTYPE_FLOAT && mts_tensor_numel(b) == w->dims[0])) &&
              strcmp(mts_attr_string(n, "auto_pad", "NOTSET"), "NOTSET") == 0 && k->n_out == 1;
    for (int i = 2; ok && i < x->rank; i++) ok = x->dims[i] == 1 && w->dims[i] == 1;
    int np = 0;
    const int64_t *pads = mts_attr_ints(n, "pads", &np);
    for (int i = 0; ok && pads && i < np; i++) ok = pads[i] == 0;
    if (!ok) return ref_run(k, "Conv");
    int64_t N = x->dims[0], C = x->dims[1], M = w->dims[0];
    for (int64_t i = 0; i < N; i++)
        gemv_rows(w->data, (const float *)x->data + i * C, b ? b->data : NULL, (float *)k->out[0].data + i * M, M, C);
    return MTS_OK;
}

static int fast_conv1px_infer(mts_kctx *k)
{
    return ref_infer(k, "Conv");
}

/* ------------------------------------------------------------------------------------------ */
/* Conv with few channels: direct, on padded planes                                           */
/* ------------------------------------------------------------------------------------------ */

bool mts_fast_conv_small_ok(const mts_conv_geom *g)
{
    /* with one output or a 1x1 kernel, building the padded planes costs as much as the
     * multiply-adds (measured: seg_unet's 1x1 16 -> 1 head 0.68 ms in oneDNN, 5.7 ms here) */
    bool shape_ok = g->M == 1 ? g->C <= 4 : g->C <= FAST_SCONV_MAX_C && g->k[1] * g->k[2] >= 9;
    return g->nsp == 2 && g->group == 1 && g->M >= 1 && g->M <= FAST_SCONV_MAX_M && g->C >= 1 && shape_ok && g->s[1] == 1 && g->s[2] == 1 && g->d[1] == 1 && g->d[2] == 1 &&
           g->k[1] <= 15 && g->k[2] <= 15 && g->pb[1] >= 0 && g->pb[2] >= 0 && g->pe[1] >= 0 && g->pe[2] >= 0;
}

/* out[m][x..x+16) for all M output channels at once (each input vector loaded once, used M
 * times): bias + sum over c, ky, kx of w[m] * padded plane rows. wv: the weights broadcast,
 * [c][ky][kx][m] (an FMA reads one straight from memory). M is a constant after inlining. */
static inline __attribute__((always_inline)) void sconv_row_m(const float *pad, int64_t PW, int64_t PHW, int64_t C,
                                                              int64_t KH, int64_t KW, const int M, const float *w,
                                                              const v16f *wv, const float *b, int64_t y, int64_t x,
                                                              int64_t OW, float *const *out)
{
    int64_t CKK = C * KH * KW;
    for (; x + 16 <= OW; x += 16) {
        v16f acc[FAST_SCONV_MAX_M];
        for (int m = 0; m < M; m++) acc[m] = splat16(b ? b[m] : 0.0f);
        const v16f *wp = wv;
        for (int64_t c = 0; c < C; c++)
            for (int64_t ky = 0; ky < KH; ky++) {
                const float *row = pad + c * PHW + (y + ky) * PW + x;
                for (int64_t kx = 0; kx < KW; kx++, wp += M) {
                    v16f v = ld16(row + kx);
                    for (int m = 0; m < M; m++) acc[m] += wp[m] * v;
                }
            }
        for (int m = 0; m < M; m++) st16(out[m] + x, acc[m]);
    }
    for (; x < OW; x++)
        for (int m = 0; m < M; m++) {
            float a = b ? b[m] : 0.0f;
            for (int64_t c = 0; c < C; c++)
                for (int64_t ky = 0; ky < KH; ky++)
                    for (int64_t kx = 0; kx < KW; kx++)
                        a += w[m * CKK + (c * KH + ky) * KW + kx] * pad[c * PHW + (y + ky) * PW + x + kx];
            out[m][x] = a;
        }
}

/* The same for kernels three wide, NB blocks of 16 outputs at a time, for x < OW rounded down
 * to 16 NB; returns where it stopped. One block alone is a chain of C KH 3 dependent FMAs per
 * output channel (at four cycles each: a quarter of the FMA units busy); NB M independent
 * accumulators keep them full. Per kernel row the three taps of a block are the vectors at x,
 * x + 1 and x + 2, made from NB + 1 loads by lane shifts of neighbouring pairs (valignd)
 * instead of 3 NB loads, two of three of them split across cache lines, and the 3 M broadcast
 * weights of that row are loaded once for the NB blocks. (Reads up to 14 floats past x + 16 NB
 * + 1, within the padded row or the band's slack.) */
static inline __attribute__((always_inline)) int64_t sconv_row3_m(const float *pad, int64_t PW, int64_t PHW,
                                                                  int64_t C, int64_t KH, const int M, const int NB,
                                                                  const v16f *wv, const float *b, int64_t y,
                                                                  int64_t OW, float *const *out)
{
    static const v16i sh1 = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    static const v16i sh2 = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    int64_t x = 0;
    for (; x + 16 * NB <= OW; x += 16 * NB) {
        v16f acc[4][FAST_SCONV_MAX_M];
        for (int q = 0; q < NB; q++)
            for (int m = 0; m < M; m++) acc[q][m] = splat16(b ? b[m] : 0.0f);
        const v16f *wp = wv;
        for (int64_t c = 0; c < C; c++)
            for (int64_t ky = 0; ky < KH; ky++, wp += 3 * M) {
                const float *row = pad + c * PHW + (y + ky) * PW + x;
                v16f wt[3][FAST_SCONV_MAX_M], a[5];
                for (int t = 0; t < 3; t++)
                    for (int m = 0; m < M; m++) wt[t][m] = wp[t * M + m];
                for (int q = 0; q <= NB; q++) a[q] = ld16(row + 16 * q);
                for (int q = 0; q < NB; q++) {
                    v16f v1 = __builtin_shuffle(a[q], a[q + 1], sh1), v2 = __builtin_shuffle(a[q], a[q + 1], sh2);
                    for (int m = 0; m < M; m++) {
                        acc[q][m] += wt[0][m] * a[q];
                        acc[q][m] += wt[1][m] * v1;
                        acc[q][m] += wt[2][m] * v2;
                    }
                }
            }
        for (int q = 0; q < NB; q++)
            for (int m = 0; m < M; m++) st16(out[m] + x + 16 * q, acc[q][m]);
    }
    return x;
}

/* A row with M outputs: the three-wide kernel's blocks of NB x 16 first where the kernel is three
 * wide, the general one for the rest. M and NB are constants after inlining. */
static inline __attribute__((always_inline)) void sconv_row_mn(const float *pad, int64_t PW, int64_t PHW, int64_t C,
                                                               int64_t KH, int64_t KW, const int M, const int NB,
                                                               const float *w, const v16f *wv, const float *b,
                                                               int64_t y, int64_t OW, float *const *out)
{
    int64_t x = KW == 3 ? sconv_row3_m(pad, PW, PHW, C, KH, M, NB, wv, b, y, OW, out) : 0;
    sconv_row_m(pad, PW, PHW, C, KH, KW, M, w, wv, b, y, x, OW, out);
}

MTS_VEC_CLONES static void sconv_row(const float *pad, int64_t PW, int64_t PHW, int64_t C, int64_t KH, int64_t KW,
                                     int64_t M, const float *w, const v16f *wv, const float *b, int64_t y, int64_t OW,
                                     float *const *out)
{
    switch (M) {
    case 1: sconv_row_mn(pad, PW, PHW, C, KH, KW, 1, 4, w, wv, b, y, OW, out); break;
    case 2: sconv_row_mn(pad, PW, PHW, C, KH, KW, 2, 4, w, wv, b, y, OW, out); break;
    case 3: sconv_row_mn(pad, PW, PHW, C, KH, KW, 3, 4, w, wv, b, y, OW, out); break;
    default: sconv_row_mn(pad, PW, PHW, C, KH, KW, 4, 3, w, wv, b, y, OW, out); break;
    }
}

typedef struct sconv_job {
    mts_conv_geom g;
    const float *x, *w, *b;
    const v16f *wv;     /* the weights broadcast, [c][ky][kx][m] */
    float *y, *pad; /* pad: per thread C planes of (BAND + KH - 1) x PW (+16 floats of slack) */
    int64_t PW, band_floats;
    int nhwc, nhwc_dst; /* source is [N,H,W,C]; output is [N,OH,OW,M] */
    int src_bf16;       /* attribute mts_src_bf16: the channels-last source holds bfloat16 */
    int src_round;      /* attribute mts_src_round: the float source rounded to bfloat16 values */
    int act;            /* attribute mts_act: 0, or the Relu / Sigmoid applied to each row */
} sconv_job;

/* A fused Relu / Sigmoid (the chain stage codes) on n outputs in place. */
MTS_VEC_CLONES static void act_all(float *y, int64_t n, int act)
{
    act_inplace(y, n, act);
}

/* 16 channels-last pixels of C channels (C a power of two, 2..FAST_SCONV_MAX_C) into C planes:
 * plane c's 16 values at dst + c * cs. The 16 x C block is C vectors of one stream; a perfect
 * unshuffle of the stream (evens, then odds: one two-source shuffle per output vector) moves
 * the lowest channel bit to the top of the vector index, so log2(C) of them leave vector c
 * holding channel c of the 16 pixels, in order. */
static inline __attribute__((always_inline)) void transpose16_c(const float *src, const int C, float *dst, int64_t cs)
{
    static const v16i even = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    static const v16i odd = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    v16f a[FAST_SCONV_MAX_C], b[FAST_SCONV_MAX_C];
    for (int i = 0; i < C; i++) a[i] = ld16(src + 16 * i);
    for (int w = C; w > 1; w /= 4) { /* two unshuffles per round, so the result is back in a */
        for (int k = 0; k < C / 2; k++) {
            b[k] = __builtin_shuffle(a[2 * k], a[2 * k + 1], even);
            b[C / 2 + k] = __builtin_shuffle(a[2 * k], a[2 * k + 1], odd);
        }
        if (w == 2) {
            for (int c = 0; c < C; c++) st16(dst + c * cs, b[c]);
            return;
        }
        for (int k = 0; k < C / 2; k++) {
            a[k] = __builtin_shuffle(b[2 * k], b[2 * k + 1], even);
            a[C / 2 + k] = __builtin_shuffle(b[2 * k], b[2 * k + 1], odd);
        }
    }
    for (int c = 0; c < C; c++) st16(dst + c * cs, a[c]);
}

/* C a constant in each case, so the vectors stay in registers (with a variable C the rounds'
 * copies went through memory: a memmove call per round). */
MTS_VEC_CLONES static void sconv_transpose16(const float *src, int64_t C, float *dst, int64_t cs)
{
    switch (C) {
    case 2: transpose16_c(src, 2, dst, cs); break;
    case 4: transpose16_c(src, 4, dst, cs); break;
    case 8: transpose16_c(src, 8, dst, cs); break;
    case 16: transpose16_c(src, 16, dst, cs); break;
    case 32: transpose16_c(src, 32, dst, cs); break;
    default: transpose16_c(src, 64, dst, cs); break;
    }
}

/* n bfloat16 values (n a multiple of 16) widened to floats: a bfloat16 is the high half of
 * the float with the same bits, so each is its 16 bits shifted up. */
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
MTS_VEC_CLONES static void bf16_widen16(const uint16_t *src, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        v16h h;
        memcpy(&h, src + i, sizeof h);
        v16u u = __builtin_convertvector(h, v16u) << 16;
        memcpy(dst + i, &u, sizeof u);
    }
}

/* One channels-last row of W pixels of C bfloat16 channels into the C planes at d0 (stride cs),
 * as floats: 16 pixels at a time widened into a block that stays in L1, then transposed as
 * a float row is. */
static void sconv_row_bf16(const uint16_t *src, int64_t W, int64_t C, float *d0, int64_t cs)
{
    float blk[16 * FAST_SCONV_MAX_C] __attribute__((aligned(64)));
    int64_t x = 0;
    if (C >= 2 && (C & (C - 1)) == 0 && C <= FAST_SCONV_MAX_C)
        for (; x + 16 <= W; x += 16, src += 16 * C) {
            bf16_widen16(src, blk, 16 * C);
            sconv_transpose16(blk, C, d0 + x, cs);
        }
    for (; x < W; x++, src += C)
        for (int64_t c = 0; c < C; c++) d0[c * cs + x] = mts_bf16_to_f32(src[c]);
}

/* Padded rows [r0, r1) of image n, as C planes of rows of PW (row r0 first). */
static void sconv_pad_rows(const sconv_job *j, int64_t n, int64_t r0, int64_t r1, float *pad)
{
    const mts_conv_geom *g = &j->g;
    int64_t C = g->C, H = g->in[1], W = g->in[2], PW = j->PW, rows = r1 - r0, pl = g->pb[2];
    for (int64_t r = r0; r < r1; r++) {
        int64_t sy = r - g->pb[1];
        for (int64_t c = 0; c < C; c++) {
            float *d = pad + (c * rows + (r - r0)) * PW;
            if (sy < 0 || sy >= H) {
                memset(d, 0, sizeof(float) * (size_t)PW);
                continue;
            }
            for (int64_t q = 0; q < pl; q++) d[q] = 0.0f; /* a few columns: no memset calls */
            for (int64_t q = pl + W; q < PW; q++) d[q] = 0.0f;
            if (!j->nhwc) memcpy(d + pl, j->x + ((n * C + c) * H + sy) * W, sizeof(float) * (size_t)W);
        }
        if (sy < 0 || sy >= H) continue;
        float *d0 = pad + (r - r0) * PW + pl;
        int64_t cs = rows * PW, x = 0;
        if (j->nhwc && j->src_bf16) {
            sconv_row_bf16((const uint16_t *)j->x + ((n * H + sy) * W) * C, W, C, d0, cs);
            continue;
        }
        if (j->nhwc) { /* channels-last source: one pass over the row's pixels, C planes side by side */
            const float *src = j->x + ((n * H + sy) * W) * C;
            if (C >= 2 && (C & (C - 1)) == 0 && C <= FAST_SCONV_MAX_C)
                for (; x + 16 <= W; x += 16, src += 16 * C) sconv_transpose16(src, C, d0 + x, cs);
            for (; x < W; x++, src += C)
                for (int64_t c = 0; c < C; c++) d0[c * cs + x] = src[c];
        }
        if (j->src_round)
            for (int64_t c = 0; c < C; c++) mts_round_half(MTS_DTYPE_BFLOAT16, d0 + c * cs, d0 + c * cs, W);
    }
}

static void sconv_part(void *arg, int ithr, int nthr)
{
    const sconv_job *j = arg;
    const mts_conv_geom *g = &j->g;
    int64_t C = g->C, M = g->M, OH = g->out[1], OW = g->out[2], KH = g->k[1], KW = g->k[2];
    float *pad = j->pad + (size_t)ithr * (size_t)(j->band_floats + 16);
    float *row = pad + j->band_floats - (size_t)(M * OW); /* NHWC output: M rows, then interleaved */
    /* by images when there are enough, else by output rows of each image */
    bool by_img = g->N >= nthr;
    for (int64_t n = by_img ? ithr : 0; n < g->N; n += by_img ? nthr : 1) {
        int64_t y0 = by_img ? 0 : OH * ithr / nthr, y1 = by_img ? OH : OH * (ithr + 1) / nthr;
        for (int64_t b0 = y0; b0 < y1; b0 += FAST_SCONV_BAND) {
            int64_t b1 = b0 + FAST_SCONV_BAND < y1 ? b0 + FAST_SCONV_BAND : y1, rows = b1 - b0 + KH - 1;
            sconv_pad_rows(j, n, b0, b1 + KH - 1, pad); /* padded rows b0 .. b1 + KH - 2 */
            for (int64_t y = b0; y < b1; y++) {
                float *out[FAST_SCONV_MAX_M];
                for (int64_t m = 0; m < M; m++) out[m] = j->nhwc_dst ? row + m * OW : j->y + ((n * M + m) * OH + y) * OW;
                sconv_row(pad, j->PW, rows * j->PW, C, KH, KW, M, j->w, j->wv, j->b, y - b0, OW, out);
                for (int64_t m = 0; j->act && m < M; m++) act_all(out[m], OW, j->act); /* rows still in L1 */
                if (j->nhwc_dst)
                    for (int64_t x = 0; x < OW; x++)
                        for (int64_t q = 0; q < M; q++) j->y[((n * OH + y) * OW + x) * M + q] = row[q * OW + x];
            }
        }
    }
}

/* The small-channel kernel's pieces for a kernel that produces its source rows itself (the
 * engine's bf16 3x3 convolution with a 3-channel head fused after it, bfconv.c): the weights
 * broadcast as sconv_row reads them, one output row from padded planes, the fused activation.
 * The same code as the unfused step's, so the fused outputs are its bits. */
void *mts_fast_sconv_weights(const float *w, int64_t M, int64_t C, int64_t KK)
{
    v16f *wb = aligned_alloc(64, sizeof(v16f) * (size_t)(M * C * KK));
    if (!wb) return NULL;
    for (int64_t c = 0; c < C; c++)
        for (int64_t t = 0; t < KK; t++)
            for (int64_t m = 0; m < M; m++) wb[(c * KK + t) * M + m] = splat16(w[(m * C + c) * KK + t]);
    return wb;
}

void mts_fast_sconv_row3(const float *pad, int64_t PW, int64_t PHW, int64_t C, int64_t M, const float *w, const void *wv,
                         const float *b, int64_t y, int64_t OW, float *const *out)
{
    sconv_row(pad, PW, PHW, C, 3, 3, M, w, wv, b, y, OW, out);
}

void mts_fast_act(float *y, int64_t n, int act)
{
    act_all(y, n, act);
}

/* The 4-D inputs may be channels-last views ([N,H,W,C], attribute mts_nhwc_views = 1, the
 * default being mts_nhwc_src); the source is stored channels-last when mts_nhwc_src = 1, the
 * output when mts_nhwc_dst = 1 (with one output channel both layouts are the same bytes). */
static int fast_conv_small_run(mts_kctx *k)
{
    mts_conv_geom g;
    bool nhwc = mts_attr_int(k->node, "mts_nhwc_src", 0) != 0;
    bool views = mts_attr_int(k->node, "mts_nhwc_views", nhwc) != 0;
    mts_tensor xv;
    const mts_tensor *kin[3] = {mts_kin(k, 0), mts_kin(k, 1), mts_kin(k, 2)};
    mts_tensor wv;
    if (views && kin[0] && kin[0]->rank == 4 && kin[1] && kin[1]->rank == 4) {
        /* the context passes [N,H,W,C] views of every 4-D input; the geometry wants NCHW dims
         * (the weights' bytes are NCHW-ordered as always) */
        xv = *kin[0];
        xv.dims[1] = kin[0]->dims[3], xv.dims[2] = kin[0]->dims[1], xv.dims[3] = kin[0]->dims[2];
        kin[0] = &xv;
        wv = *kin[1];
        wv.dims[1] = kin[1]->dims[3], wv.dims[2] = kin[1]->dims[1], wv.dims[3] = kin[1]->dims[2];
        kin[1] = &wv;
    }
    mts_kctx kk = *k;
    kk.in = kin;
    kk.n_in = k->n_in > 3 ? 3 : k->n_in;
    int act = (int)mts_attr_int(k->node, "mts_act", 0);
    if (act && act != MTS_CHAIN_RELU && act != MTS_CHAIN_SIGMOID)
        return mts_err_set(k->err, MTS_EINVAL, "small conv: unknown fused activation %d", act);
    bool src_bf16 = mts_attr_int(k->node, "mts_src_bf16", 0) != 0;
    if (src_bf16 && !nhwc) return mts_err_set(k->err, MTS_EINVAL, "small conv: a bfloat16 source must be channels-last");
    if (!kin[0] || kin[0]->dtype != MTS_DTYPE_FLOAT || mts_conv_geometry(&kk, false, &g) != MTS_OK ||
        !mts_fast_conv_small_ok(&g)) {
        if (views || src_bf16) return mts_err_set(k->err, MTS_EINVAL, "channels-last small conv with an unsupported geometry");
        int rc = ref_run(k, "Conv");
        if (!rc && act) act_all(k->out[0].data, mts_tensor_numel(&k->out[0]), act);
        return rc;
    }
    sconv_job j;
    memset(&j, 0, sizeof j);
    j.g = g;
    j.x = kin[0]->data;
    j.w = kin[1]->data;
    j.b = kin[2] ? kin[2]->data : NULL;
    j.y = k->out[0].data;
    j.PW = g.in[2] + g.pb[2] + g.pe[2];
    j.nhwc = nhwc;
    j.src_bf16 = src_bf16;
    j.src_round = mts_attr_int(k->node, "mts_src_round", 0) != 0;
    j.act = act;
    j.nhwc_dst = g.M > 1 && mts_attr_int(k->node, "mts_nhwc_dst", 0) != 0;
    /* the band's padded planes, plus M output rows when the output is interleaved */
    j.band_floats = g.C * (FAST_SCONV_BAND + g.k[1] - 1) * j.PW + (j.nhwc_dst ? g.M * g.out[2] : 0);
    int threads = g.N * g.M * g.out[1] * g.out[2] * g.C * g.k[1] * g.k[2] >= FAST_SCONV_MT ? k->threads : 1;
    if (threads > g.N * g.out[1]) threads = (int)(g.N * g.out[1]);
    if (threads < 1) threads = 1;
    v16f *wb = mts_fast_sconv_weights(j.w, g.M, g.C, g.k[1] * g.k[2]);
    j.pad = malloc(sizeof(float) * (size_t)(j.band_floats + 16) * (size_t)threads);
    if (!j.pad || !wb) {
        free(j.pad), free(wb);
        return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    }
    j.wv = wb;
    mts_parallel(threads, sconv_part, &j);
    free(j.pad);
    free(wb);
    return MTS_OK;
}

static int fast_conv_small_infer(mts_kctx *k)
{
    return ref_infer(k, "Conv");
}

const mts_op mts_fast_reduce = {"Reduce", fast_reduce_infer, fast_reduce_run};
const mts_op mts_fast_layernorm = {"LayerNormalization", fast_layernorm_infer, fast_layernorm_run};
const mts_op mts_fast_layernorm_written = {"MtsLayerNorm", fast_ln_written_infer, fast_ln_written_run};
const mts_op mts_fast_softmax = {"Softmax", fast_softmax_infer, fast_softmax_run};
const mts_op mts_fast_chain = {"MtsEltwiseChain", fast_chain_infer, fast_chain_run};
const mts_op mts_fast_bmm = {"MtsStridedMatMul", fast_bmm_infer, fast_bmm_run};
const mts_op mts_fast_conv1px = {"Conv", fast_conv1px_infer, fast_conv1px_run};
const mts_op mts_fast_conv_small = {"Conv", fast_conv_small_infer, fast_conv_small_run};
const mts_op mts_fast_cpool = {"MtsChannelPool", fast_cpool_infer, fast_cpool_run};
