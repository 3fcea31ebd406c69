/*
 * Reference kernels for convolutions and spatial ops: Conv, ConvTranspose, MaxPool, AveragePool,
 * GlobalAveragePool, GlobalMaxPool, Resize, Upsample and Pad.
 *
 * Spatial ops accept 1 to 3 spatial dimensions; their geometry is padded to 3-D with unit
 * dimensions so one loop nest serves all ranks. Conv runs as im2col (skipped for 1x1 stride-1
 * kernels) followed by the engine's GEMM (gemm.h) on each chunk of output pixels; convolutions
 * with one input channel per group (depthwise) run as a direct loop. ConvTranspose runs as
 * GEMM + col2im. Large convolutions are split over k->threads threads (the OpenMP team of
 * kernels/dnnl_rt.c), each running the GEMM serially on its own chunks. Resize and Upsample
 * interpolate separably, one axis at a time (nearest, linear, cubic).
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/gemm.h"
#include "engine/kernels/kernel.h"

#define NSP 3                 /* spatial dims after normalization */
#define ATTR_MAX ((int64_t)1 << 30)
#define COL_FLOATS ((int64_t)1 << 17) /* target im2col / col2im chunk, in floats */
#define PAR_MAX 64
#define PAR_MIN_FLOPS 4000000.0

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ------------------------------------------------------------------------------------------ */
/* Shared validation helpers                                                                   */

static const mts_tensor *req_in(mts_kctx *k, int i, const char *name)
{
    const mts_tensor *t = mts_kin(k, i);
    if (!t) mts_err_set(k->err, MTS_EINVAL, "missing required input %d (%s)", i, name);
    return t;
}

static int dtype_err(mts_kctx *k, const char *what, mts_dtype t, const char *expected)
{
    return mts_err_set(k->err, mts_dtype_core(t) ? MTS_EINVAL : MTS_EUNSUPPORTED,
                       "%s has type %s, expected %s", what, mts_dtype_name(t), expected);
}

static int need_float(mts_kctx *k, const mts_tensor *t, const char *what)
{
    return t->dtype == MTS_DTYPE_FLOAT ? MTS_OK : dtype_err(k, what, t->dtype, "float");
}

/* Reads an INTS attribute of exactly n values into out (dflt when absent). */
static int attr_ints_n(mts_kctx *k, const char *name, int n, int64_t dflt, int64_t *out, bool *present)
{
    int cnt = 0;
    const int64_t *v = mts_attr_ints(k->node, name, &cnt);
    if (!v || cnt == 0) {
        if (present) *present = false;
        for (int i = 0; i < n; i++) out[i] = dflt;
        return MTS_OK;
    }
    if (present) *present = true;
    if (cnt != n)
        return mts_err_set(k->err, MTS_EINVAL, "attribute %s has %d values, expected %d", name, cnt, n);
    memcpy(out, v, (size_t)n * sizeof *out);
    return MTS_OK;
}

enum { AP_NOTSET, AP_SAME_UPPER, AP_SAME_LOWER, AP_VALID };

static int parse_auto_pad(mts_kctx *k, int *ap)
{
    const char *s = mts_attr_string(k->node, "auto_pad", "NOTSET");
    if (!strcmp(s, "NOTSET") || !*s) *ap = AP_NOTSET;
    else if (!strcmp(s, "SAME_UPPER")) *ap = AP_SAME_UPPER;
    else if (!strcmp(s, "SAME_LOWER")) *ap = AP_SAME_LOWER;
    else if (!strcmp(s, "VALID")) *ap = AP_VALID;
    else
        return mts_err_set(k->err, MTS_EINVAL,
                           "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", s);
    return MTS_OK;
}

/* Spatial geometry, normalized to 3 dims: real dims sit in the last nsp slots. */
typedef struct geom {
    int nsp;
    int64_t in[NSP], k[NSP], s[NSP], d[NSP], pb[NSP], pe[NSP], out[NSP];
} geom;

static void geom_normalize(geom *g)
{
    int n = g->nsp, sh = NSP - n;
    for (int i = NSP - 1; i >= 0; i--) {
        if (i >= sh) {
            int j = i - sh;
            g->in[i] = g->in[j], g->k[i] = g->k[j], g->s[i] = g->s[j], g->d[i] = g->d[j];
            g->pb[i] = g->pb[j], g->pe[i] = g->pe[j], g->out[i] = g->out[j];
        } else {
            g->in[i] = g->k[i] = g->s[i] = g->d[i] = g->out[i] = 1;
            g->pb[i] = g->pe[i] = 0;
        }
    }
}

static int check_spatial_attrs(mts_kctx *k, const geom *g)
{
    for (int i = 0; i < g->nsp; i++) {
        if (g->k[i] < 1 || g->k[i] > ATTR_MAX)
            return mts_err_set(k->err, MTS_EINVAL, "kernel size %lld on spatial axis %d is out of range",
                               (long long)g->k[i], i);
        if (g->s[i] < 1 || g->s[i] > ATTR_MAX)
            return mts_err_set(k->err, MTS_EINVAL, "stride %lld on spatial axis %d must be in [1, 2^30]",
                               (long long)g->s[i], i);
        if (g->d[i] < 1 || g->d[i] > ATTR_MAX)
            return mts_err_set(k->err, MTS_EINVAL, "dilation %lld on spatial axis %d must be in [1, 2^30]",
                               (long long)g->d[i], i);
    }
    return MTS_OK;
}

/* Fills strides, dilations, pads and output sizes of a Conv/pool window (g->nsp, g->in, g->k set),
 * then normalizes g to 3 dims. */
static int geom_forward(mts_kctx *k, geom *g, bool ceil_mode)
{
    int n = g->nsp, ap, rc;
    int64_t pads[2 * NSP];
    if ((rc = attr_ints_n(k, "strides", n, 1, g->s, NULL)) ||
        (rc = attr_ints_n(k, "dilations", n, 1, g->d, NULL)) ||
        (rc = attr_ints_n(k, "pads", 2 * n, 0, pads, NULL)) || (rc = parse_auto_pad(k, &ap)) ||
        (rc = check_spatial_attrs(k, g)))
        return rc;
    for (int i = 0; i < n; i++) {
        int64_t in = g->in[i], s = g->s[i], ek = (g->k[i] - 1) * g->d[i] + 1;
        if (ap == AP_NOTSET) {
            if (pads[i] < 0 || pads[n + i] < 0 || pads[i] > ATTR_MAX || pads[n + i] > ATTR_MAX)
                return mts_err_set(k->err, MTS_EINVAL, "pads (%lld, %lld) on spatial axis %d must be in [0, 2^30]",
                                   (long long)pads[i], (long long)pads[n + i], i);
            g->pb[i] = pads[i];
            g->pe[i] = pads[n + i];
        } else if (ap == AP_VALID) {
            g->pb[i] = g->pe[i] = 0;
        }
        if (ap == AP_SAME_UPPER || ap == AP_SAME_LOWER) {
            int64_t out = cdiv(in, s);
            int64_t total = imax(0, (out - 1) * s + ek - in);
            g->pb[i] = ap == AP_SAME_UPPER ? total / 2 : total - total / 2;
            g->pe[i] = total - g->pb[i];
            g->out[i] = out;
        } else {
            int64_t num = in + g->pb[i] + g->pe[i] - ek;
            if (num < 0)
                return mts_err_set(k->err, MTS_ESHAPE,
                                   "spatial axis %d: padded input size %lld is smaller than the dilated kernel %lld",
                                   i, (long long)(in + g->pb[i] + g->pe[i]), (long long)ek);
            int64_t out = (ceil_mode ? cdiv(num, s) : num / s) + 1;
            /* The last window must start inside the input or its leading padding. */
            if (ceil_mode && out > 1 && (out - 1) * s >= in + g->pb[i]) out--;
            g->out[i] = out;
        }
        if (g->out[i] < 1)
            return mts_err_set(k->err, MTS_ESHAPE, "spatial axis %d: output size %lld is empty (input %lld)", i,
                               (long long)g->out[i], (long long)in);
    }
    geom_normalize(g);
    return MTS_OK;
}

/* Range [*lo, *hi) of output positions o in [0, O) with 0 <= o*s + off < I. */
static void valid_range(int64_t off, int64_t s, int64_t I, int64_t O, int64_t *lo, int64_t *hi)
{
    int64_t l = off >= 0 ? 0 : cdiv(-off, s);
    int64_t h = (I - 1 - off) < 0 ? 0 : (I - 1 - off) / s + 1;
    l = imin(l, O);
    h = imin(h, O);
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

/* ------------------------------------------------------------------------------------------ */
/* Vectorizable loops. gcc -O2 vectorizes only loops whose trip count it knows, so the bodies  */
/* run in fixed blocks of 16 with a scalar tail.                                               */

static inline void vaxpy(float *restrict y, const float *restrict x, float a, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) y[i + j] += a * x[i + j];
    for (; i < n; i++) y[i] += a * x[i];
}

static inline void vscale(float *restrict y, const float *restrict x, float a, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) y[i + j] = a * x[i + j];
    for (; i < n; i++) y[i] = a * x[i];
}

static inline void vadd(float *restrict y, const float *restrict x, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) y[i + j] += x[i + j];
    for (; i < n; i++) y[i] += x[i];
}

static inline void vfill(float *y, float v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = v;
}

/* ------------------------------------------------------------------------------------------ */
/* Parallel loop: units 0..n_units-1 spread over up to `threads` threads (interleaved). Each    */
/* worker gets its own scratch buffer of `scratch` floats.                                     */

typedef int (*unit_fn)(void *ctx, int64_t unit, float *scratch);

typedef struct par_worker {
    unit_fn fn;
    void *ctx;
    int64_t n_units;
    int tid, nt;
    size_t scratch;
    int rc;
} par_worker;

static void par_main(par_worker *w)
{
    float *s = NULL;
    if (w->scratch) {
        s = malloc(w->scratch * sizeof(float));
        if (!s) {
            w->rc = MTS_ENOMEM;
            return;
        }
    }
    for (int64_t u = w->tid; u < w->n_units; u += w->nt) {
        int rc = w->fn(w->ctx, u, s);
        if (rc) {
            w->rc = rc;
            break;
        }
    }
    free(s);
}

static void par_part(void *arg, int ithr, int nthr)
{
    (void)nthr;
    par_main(&((par_worker *)arg)[ithr]);
}

/* Runs the units on the OpenMP team oneDNN uses (passive waiting; no thread creation per call). */
static int par_run(int threads, int64_t n_units, size_t scratch, unit_fn fn, void *ctx)
{
    if (n_units <= 0) return MTS_OK;
    int nt = threads < 1 ? 1 : threads > PAR_MAX ? PAR_MAX : threads;
    if (nt > n_units) nt = (int)n_units;
    par_worker w[PAR_MAX];
    for (int i = 0; i < nt; i++) w[i] = (par_worker){fn, ctx, n_units, i, nt, scratch, 0};
    mts_parallel(nt, par_part, w);
    for (int i = 0; i < nt; i++)
        if (w[i].rc) return w[i].rc;
    return MTS_OK;
}

static int pick_threads(const mts_kctx *k, double flops)
{
    if (k->threads <= 1 || flops < PAR_MIN_FLOPS) return 1;
    double t = flops / PAR_MIN_FLOPS;
    return t < k->threads ? (int)t : k->threads;
}

/* ------------------------------------------------------------------------------------------ */
/* Conv                                                                                        */

typedef struct conv_desc {
    geom g;
    int64_t N, C, M, group, Cg, Mg, ksz, K, P, IP;
    const float *x, *w, *b;
    float *y;
    bool direct1x1;
    int64_t nc, nchunks; /* output pixels per work unit */
    int64_t mbs, nmb;    /* output channels (of a group) per work unit */
    size_t ws;           /* GEMM workspace (floats) at the start of each unit's scratch */
} conv_desc;

static int conv_setup(mts_kctx *k, conv_desc *d)
{
    const mts_tensor *X = req_in(k, 0, "X"), *W = X ? req_in(k, 1, "W") : NULL, *B = mts_kin(k, 2);
    int rc;
    if (!X || !W) return MTS_EINVAL;
    if ((rc = need_float(k, X, "X")) || (rc = need_float(k, W, "W"))) return rc;
    if (X->rank < 3)
        return mts_err_set(k->err, MTS_ESHAPE, "X has rank %d, expected at least 3 (N, C, spatial...)", X->rank);
    if (X->rank > 2 + NSP)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "X has %d spatial dims; only 1 to 3 are supported",
                           X->rank - 2);
    if (W->rank != X->rank)
        return mts_err_set(k->err, MTS_ESHAPE, "W has rank %d, expected %d like X", W->rank, X->rank);
    memset(d, 0, sizeof *d);
    int n = X->rank - 2;
    d->g.nsp = n;
    d->N = X->dims[0];
    d->C = X->dims[1];
    d->M = W->dims[0];
    d->group = mts_attr_int(k->node, "group", 1);
    if (d->group < 1 || d->group > d->C || d->C % d->group)
        return mts_err_set(k->err, MTS_EINVAL, "group %lld must divide the %lld input channels",
                           (long long)d->group, (long long)d->C);
    d->Cg = d->C / d->group;
    if (W->dims[1] != d->Cg)
        return mts_err_set(k->err, MTS_ESHAPE, "W has %lld input channels per group, expected %lld (C %lld / group %lld)",
                           (long long)W->dims[1], (long long)d->Cg, (long long)d->C, (long long)d->group);
    if (d->M < 1 || d->M % d->group)
        return mts_err_set(k->err, MTS_ESHAPE, "W has %lld output channels, expected a positive multiple of group %lld",
                           (long long)d->M, (long long)d->group);
    d->Mg = d->M / d->group;
    int64_t ks[NSP];
    bool has_ks;
    if ((rc = attr_ints_n(k, "kernel_shape", n, 0, ks, &has_ks))) return rc;
    for (int i = 0; i < n; i++) {
        if (has_ks && ks[i] != W->dims[2 + i])
            return mts_err_set(k->err, MTS_ESHAPE, "kernel_shape[%d] = %lld does not match W's dim %lld", i,
                               (long long)ks[i], (long long)W->dims[2 + i]);
        d->g.k[i] = W->dims[2 + i];
        d->g.in[i] = X->dims[2 + i];
    }
    if (B) {
        if ((rc = need_float(k, B, "B"))) return rc;
        if (B->rank != 1 || B->dims[0] != d->M)
            return mts_err_set(k->err, MTS_ESHAPE, "B must have shape [%lld], got rank %d dim %lld", (long long)d->M,
                               B->rank, (long long)(B->rank ? B->dims[0] : 0));
    }
    if ((rc = geom_forward(k, &d->g, false))) return rc;
    const geom *g = &d->g;
    d->ksz = g->k[0] * g->k[1] * g->k[2];
    d->K = d->Cg * d->ksz;
    d->P = g->out[0] * g->out[1] * g->out[2];
    d->IP = g->in[0] * g->in[1] * g->in[2];
    d->x = X->data;
    d->w = W->data;
    d->b = B ? B->data : NULL;
    return MTS_OK;
}

/* Output shape [N, M, spatial...] of a Conv or ConvTranspose with geometry g. */
static void set_conv_output(mts_tensor *o, int64_t N, int64_t M, const geom *g)
{
    o->dtype = MTS_DTYPE_FLOAT;
    o->rank = g->nsp + 2;
    o->dims[0] = N;
    o->dims[1] = M;
    for (int i = 0; i < g->nsp; i++) o->dims[2 + i] = g->out[NSP - g->nsp + i];
}

static int conv_infer(mts_kctx *k)
{
    conv_desc d;
    int rc = conv_setup(k, &d);
    if (rc) return rc;
    set_conv_output(&k->out[0], d.N, d.M, &d.g);
    return MTS_OK;
}

/* Columns [p0, p1) of the im2col matrix of one group: row (c, kd, kh, kw), column = output pixel. */
static void im2col(const float *x, int64_t Cg, const geom *g, int64_t p0, int64_t p1, float *col)
{
    int64_t ID = g->in[0], IH = g->in[1], IW = g->in[2], OH = g->out[1], OW = g->out[2];
    int64_t IP = ID * IH * IW, n = p1 - p0, r0 = p0 / OW, r1 = (p1 - 1) / OW;
    float *dst = col;
    for (int64_t c = 0; c < Cg; c++) {
        const float *xc = x + c * IP;
        for (int64_t kd = 0; kd < g->k[0]; kd++)
            for (int64_t kh = 0; kh < g->k[1]; kh++)
                for (int64_t kw = 0; kw < g->k[2]; kw++) {
                    int64_t offw = kw * g->d[2] - g->pb[2], sw = g->s[2], lo, hi;
                    valid_range(offw, sw, IW, OW, &lo, &hi);
                    for (int64_t r = r0; r <= r1; r++) {
                        int64_t od = r / OH, oh = r % OH;
                        int64_t a = r == r0 ? p0 - r * OW : 0, b = r == r1 ? p1 - r * OW : OW;
                        float *drow = dst + (r * OW - p0); /* drow[ow] is pixel (r, ow) */
                        int64_t id = od * g->s[0] - g->pb[0] + kd * g->d[0];
                        int64_t ih = oh * g->s[1] - g->pb[1] + kh * g->d[1];
                        if (id < 0 || id >= ID || ih < 0 || ih >= IH) {
                            memset(drow + a, 0, (size_t)(b - a) * sizeof(float));
                            continue;
                        }
                        int64_t l = imin(imax(lo, a), b), h = imin(imax(hi, l), b);
                        const float *src = xc + (id * IH + ih) * IW;
                        if (l > a) memset(drow + a, 0, (size_t)(l - a) * sizeof(float));
                        if (sw == 1) {
                            if (h > l) memcpy(drow + l, src + l + offw, (size_t)(h - l) * sizeof(float));
                        } else {
                            for (int64_t ow = l; ow < h; ow++) drow[ow] = src[ow * sw + offw];
                        }
                        if (b > h) memset(drow + h, 0, (size_t)(b - h) * sizeof(float));
                    }
                    dst += n;
                }
    }
}

static int conv_gemm_unit(void *ctx, int64_t u, float *scratch)
{
    const conv_desc *d = ctx;
    int64_t mb = u % d->nmb, chunk = (u / d->nmb) % d->nchunks, ng = u / d->nmb / d->nchunks;
    int64_t n = ng / d->group, g = ng % d->group;
    int64_t p0 = chunk * d->nc, p1 = imin(p0 + d->nc, d->P);
    int64_t m0 = mb * d->mbs, m1 = imin(m0 + d->mbs, d->Mg);
    const float *xg = d->x + (n * d->C + g * d->Cg) * d->IP;
    const float *wg = d->w + (g * d->Mg + m0) * d->K;
    float *yg = d->y + (n * d->M + g * d->Mg + m0) * d->P;
    const float *bg = d->b ? d->b + g * d->Mg + m0 : NULL;
    float *col = scratch + d->ws;
    /* Y_g[m0:m1, p0:p1] = bias + W_g[m0:m1, :] * (X_g or its im2col columns)[:, p0:p1] */
    mts_sgemm gm = {.M = m1 - m0, .N = p1 - p0, .K = d->K, .A = wg, .a_rs = d->K, .a_cs = 1,
                    .B = xg + p0, .b_rs = d->P, .b_cs = 1, .C = yg + p0, .ldc = d->P, .alpha = 1.0f, .bias = bg};
    if (!d->direct1x1) {
        im2col(xg, d->Cg, &d->g, p0, p1, col);
        gm.B = col;
        gm.b_rs = p1 - p0;
    }
    mts_sgemm_serial(&gm, scratch);
    return MTS_OK;
}

/* One output plane of a convolution with one input channel per group. */
static int conv_direct_unit(void *ctx, int64_t u, float *scratch)
{
    const conv_desc *d = ctx;
    const geom *g = &d->g;
    int64_t n = u / d->M, m = u % d->M, cin = m / d->Mg;
    int64_t ID = g->in[0], IH = g->in[1], IW = g->in[2], OD = g->out[0], OH = g->out[1], OW = g->out[2];
    const float *x = d->x + (n * d->C + cin) * d->IP;
    const float *w = d->w + m * d->ksz;
    float *y = d->y + (n * d->M + m) * d->P;
    vfill(y, d->b ? d->b[m] : 0.0f, d->P);
    for (int64_t kd = 0; kd < g->k[0]; kd++)
        for (int64_t kh = 0; kh < g->k[1]; kh++)
            for (int64_t kw = 0; kw < g->k[2]; kw++) {
                float wv = w[(kd * g->k[1] + kh) * g->k[2] + kw];
                int64_t offw = kw * g->d[2] - g->pb[2], sw = g->s[2], lo, hi;
                valid_range(offw, sw, IW, OW, &lo, &hi);
                if (hi <= lo || wv == 0.0f) continue;
                for (int64_t od = 0; od < OD; od++) {
                    int64_t id = od * g->s[0] - g->pb[0] + kd * g->d[0];
                    if (id < 0 || id >= ID) continue;
                    for (int64_t oh = 0; oh < OH; oh++) {
                        int64_t ih = oh * g->s[1] - g->pb[1] + kh * g->d[1];
                        if (ih < 0 || ih >= IH) continue;
                        const float *src = x + (id * IH + ih) * IW;
                        float *dst = y + (od * OH + oh) * OW;
                        if (sw == 1) {
                            vaxpy(dst + lo, src + lo + offw, wv, hi - lo);
                        } else {
                            for (int64_t ow = lo; ow < hi; ow++) dst[ow] += wv * src[ow * sw + offw];
                        }
                    }
                }
            }
    return MTS_OK;
}

static int conv_run(mts_kctx *k)
{
    conv_desc d;
    int rc = conv_setup(k, &d);
    if (rc) return rc;
    d.y = k->out[0].data;
    if (d.N == 0 || d.P == 0) return MTS_OK;
    double flops = 2.0 * (double)d.N * (double)d.M * (double)d.P * (double)d.K;
    int nt = pick_threads(k, flops);
    if (d.Cg == 1) return par_run(nt, d.N * d.M, 0, conv_direct_unit, &d);

    const geom *g = &d.g;
    d.direct1x1 = d.ksz == 1;
    for (int i = 0; i < NSP; i++)
        if (g->s[i] != 1 || g->pb[i] || g->pe[i]) d.direct1x1 = false;
    /* Pixel chunks: the im2col block stays about L2-sized (at least 64 pixels wide). */
    int64_t nc = d.direct1x1 ? 1024 : imax(64, COL_FLOATS / imax(d.K, 1));
    nc = imin(nc, d.P);
    int64_t ng = d.N * d.group, want = 2 * (int64_t)nt;
    if (nt > 1 && ng * cdiv(d.P, nc) < want) {
        int64_t pieces = cdiv(want, ng);
        nc = imin(nc, imax(cdiv(d.P, pieces), 64));
    }
    d.nc = nc;
    d.nchunks = cdiv(d.P, nc);
    /* Few pixels for the threads: split output channels too (blocks of at least 16). */
    d.mbs = d.Mg;
    d.nmb = 1;
    int64_t units = ng * d.nchunks;
    if (nt > 1 && units < want && d.Mg >= 32) {
        int64_t nmb = imin(cdiv(want, units), d.Mg / 16);
        int64_t mr = mts_sgemm_mr();
        d.mbs = cdiv(cdiv(d.Mg, nmb), mr) * mr;
        d.nmb = cdiv(d.Mg, d.mbs);
    }
    d.ws = mts_sgemm_ws_floats(d.mbs, nc, d.K);
    size_t scratch = d.ws + (d.direct1x1 ? 0 : (size_t)(d.K * nc));
    return par_run(nt, ng * d.nchunks * d.nmb, scratch, conv_gemm_unit, &d);
}

/* ------------------------------------------------------------------------------------------ */
/* ConvTranspose                                                                               */

typedef struct convt_desc {
    geom g;
    int64_t N, C, M, group, Cg, Mg, ksz, K2, P, IP;
    const float *x, *w, *b;
    float *y;
    /* per-chunk state for the parallel phases */
    int64_t n, gi, p0, p1, rows_per_unit;
    float *col;
    size_t ws; /* GEMM workspace (floats) per unit */
} convt_desc;

static int convt_setup(mts_kctx *k, convt_desc *d)
{
    const mts_tensor *X = req_in(k, 0, "X"), *W = X ? req_in(k, 1, "W") : NULL, *B = mts_kin(k, 2);
    int rc, ap;
    if (!X || !W) return MTS_EINVAL;
    if ((rc = need_float(k, X, "X")) || (rc = need_float(k, W, "W"))) return rc;
    if (X->rank < 3)
        return mts_err_set(k->err, MTS_ESHAPE, "X has rank %d, expected at least 3 (N, C, spatial...)", X->rank);
    if (X->rank > 2 + NSP)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "X has %d spatial dims; only 1 to 3 are supported",
                           X->rank - 2);
    if (W->rank != X->rank)
        return mts_err_set(k->err, MTS_ESHAPE, "W has rank %d, expected %d like X", W->rank, X->rank);
    memset(d, 0, sizeof *d);
    int n = X->rank - 2;
    geom *g = &d->g;
    g->nsp = n;
    d->N = X->dims[0];
    d->C = X->dims[1];
    d->group = mts_attr_int(k->node, "group", 1);
    if (d->group < 1 || d->group > d->C || d->C % d->group)
        return mts_err_set(k->err, MTS_EINVAL, "group %lld must divide the %lld input channels",
                           (long long)d->group, (long long)d->C);
    if (W->dims[0] != d->C)
        return mts_err_set(k->err, MTS_ESHAPE, "W has %lld input channels, expected %lld like X",
                           (long long)W->dims[0], (long long)d->C);
    d->Cg = d->C / d->group;
    d->Mg = W->dims[1];
    d->M = d->Mg * d->group;
    if (d->Mg < 1) return mts_err_set(k->err, MTS_ESHAPE, "W has no output channels");
    int64_t ks[NSP], op[NSP], pads[2 * NSP], oshape[NSP + 2];
    bool has_ks, has_os = false;
    if ((rc = attr_ints_n(k, "kernel_shape", n, 0, ks, &has_ks)) ||
        (rc = attr_ints_n(k, "strides", n, 1, g->s, NULL)) ||
        (rc = attr_ints_n(k, "dilations", n, 1, g->d, NULL)) ||
        (rc = attr_ints_n(k, "pads", 2 * n, 0, pads, NULL)) ||
        (rc = attr_ints_n(k, "output_padding", n, 0, op, NULL)) || (rc = parse_auto_pad(k, &ap)))
        return rc;
    int os_n = 0;
    const int64_t *os = mts_attr_ints(k->node, "output_shape", &os_n);
    if (os && os_n > 0) {
        if (os_n != n && os_n != n + 2)
            return mts_err_set(k->err, MTS_EINVAL, "output_shape has %d values, expected %d", os_n, n);
        memcpy(oshape, os + (os_n - n), (size_t)n * sizeof(int64_t));
        has_os = true;
    }
    for (int i = 0; i < n; i++) {
        if (has_ks && ks[i] != W->dims[2 + i])
            return mts_err_set(k->err, MTS_ESHAPE, "kernel_shape[%d] = %lld does not match W's dim %lld", i,
                               (long long)ks[i], (long long)W->dims[2 + i]);
        g->k[i] = W->dims[2 + i];
        g->in[i] = X->dims[2 + i];
    }
    if ((rc = check_spatial_attrs(k, g))) return rc;
    for (int i = 0; i < n; i++) {
        int64_t in = g->in[i], s = g->s[i], ek = (g->k[i] - 1) * g->d[i] + 1;
        if (op[i] < 0 || op[i] > ATTR_MAX)
            return mts_err_set(k->err, MTS_EINVAL, "output_padding %lld on spatial axis %d must be in [0, 2^30]",
                               (long long)op[i], i);
        int64_t full = s * (in - 1) + op[i] + ek;
        if (has_os || ap == AP_SAME_UPPER || ap == AP_SAME_LOWER) {
            int64_t out = has_os ? oshape[i] : in * s;
            if (out < 0 || out > ((int64_t)1 << 40))
                return mts_err_set(k->err, MTS_EINVAL, "output_shape[%d] = %lld is out of range", i, (long long)out);
            int64_t total = imax(0, full - out);
            if (ap == AP_SAME_UPPER) g->pb[i] = total / 2;
            else if (ap == AP_SAME_LOWER) g->pb[i] = total - total / 2;
            else g->pb[i] = total / 2;
            g->pe[i] = full - out - g->pb[i]; /* negative: output extends past the last input tap */
            g->out[i] = out;
        } else {
            if (ap == AP_VALID) {
                g->pb[i] = g->pe[i] = 0;
            } else {
                if (pads[i] < 0 || pads[n + i] < 0 || pads[i] > ATTR_MAX || pads[n + i] > ATTR_MAX)
                    return mts_err_set(k->err, MTS_EINVAL, "pads (%lld, %lld) on spatial axis %d must be in [0, 2^30]",
                                       (long long)pads[i], (long long)pads[n + i], i);
                g->pb[i] = pads[i];
                g->pe[i] = pads[n + i];
            }
            g->out[i] = full - g->pb[i] - g->pe[i];
        }
        if (g->out[i] < 1)
            return mts_err_set(k->err, MTS_ESHAPE, "spatial axis %d: output size %lld is empty", i,
                               (long long)g->out[i]);
    }
    if (B) {
        if ((rc = need_float(k, B, "B"))) return rc;
        if (B->rank != 1 || B->dims[0] != d->M)
            return mts_err_set(k->err, MTS_ESHAPE, "B must have shape [%lld], got rank %d dim %lld", (long long)d->M,
                               B->rank, (long long)(B->rank ? B->dims[0] : 0));
    }
    geom_normalize(g);
    d->ksz = g->k[0] * g->k[1] * g->k[2];
    d->K2 = d->Mg * d->ksz;
    d->P = g->out[0] * g->out[1] * g->out[2];
    d->IP = g->in[0] * g->in[1] * g->in[2];
    d->x = X->data;
    d->w = W->data;
    d->b = B ? B->data : NULL;
    return MTS_OK;
}

/* Geometry of a Conv (transpose = false) or ConvTranspose node for the fast backends: the same
 * validation as the reference kernels, spatial dims normalized to 3 (real dims last). */
int mts_conv_geometry(mts_kctx *k, bool transpose, mts_conv_geom *out)
{
    int rc;
    const geom *g;
    conv_desc cd; /* both outlive g's uses below */
    convt_desc td;
    memset(out, 0, sizeof *out);
    if (!transpose) {
        if ((rc = conv_setup(k, &cd))) return rc;
        g = &cd.g;
        out->N = cd.N, out->C = cd.C, out->M = cd.M, out->group = cd.group;
    } else {
        if ((rc = convt_setup(k, &td))) return rc;
        g = &td.g;
        out->N = td.N, out->C = td.C, out->M = td.M, out->group = td.group;
    }
    out->nsp = g->nsp;
    for (int i = 0; i < NSP; i++) {
        out->in[i] = g->in[i], out->k[i] = g->k[i], out->s[i] = g->s[i], out->d[i] = g->d[i];
        out->pb[i] = g->pb[i], out->pe[i] = g->pe[i], out->out[i] = g->out[i];
    }
    return MTS_OK;
}

static int convt_infer(mts_kctx *k)
{
    convt_desc d;
    int rc = convt_setup(k, &d);
    if (rc) return rc;
    set_conv_output(&k->out[0], d.N, d.M, &d.g);
    return MTS_OK;
}

/* Phase 1: rows [u*rpu, (u+1)*rpu) of col = W_g^T * X_g[:, p0:p1]. */
static int convt_gemm_unit(void *ctx, int64_t u, float *scratch)
{
    const convt_desc *d = ctx;
    int64_t r0 = u * d->rows_per_unit, r1 = imin(r0 + d->rows_per_unit, d->K2), nc = d->p1 - d->p0;
    const float *xg = d->x + (d->n * d->C + d->gi * d->Cg) * d->IP + d->p0;
    const float *wg = d->w + d->gi * d->Cg * d->K2;
    /* W_g is [Cg, K2]; its rows r0..r1 of the transposed view are columns of the storage */
    mts_sgemm gm = {.M = r1 - r0, .N = nc, .K = d->Cg, .A = wg + r0, .a_rs = 1, .a_cs = d->K2, .B = xg,
                    .b_rs = d->IP, .b_cs = 1, .C = d->col + r0 * nc, .ldc = nc, .alpha = 1.0f};
    mts_sgemm_serial(&gm, scratch);
    return MTS_OK;
}

/* Phase 2: scatter-add the col rows of output channel m of the group into the output. */
static int convt_col2im_unit(void *ctx, int64_t m, float *scratch)
{
    const convt_desc *d = ctx;
    const geom *g = &d->g;
    int64_t IH = g->in[1], IW = g->in[2], OD = g->out[0], OH = g->out[1], OW = g->out[2];
    int64_t nc = d->p1 - d->p0, r0 = d->p0 / IW, r1 = (d->p1 - 1) / IW;
    float *y = d->y + (d->n * d->M + d->gi * d->Mg + m) * d->P;
    const float *col = d->col + m * d->ksz * nc;
    for (int64_t kd = 0; kd < g->k[0]; kd++)
        for (int64_t kh = 0; kh < g->k[1]; kh++)
            for (int64_t kw = 0; kw < g->k[2]; kw++, col += nc) {
                int64_t offw = kw * g->d[2] - g->pb[2], sw = g->s[2], lo, hi;
                valid_range(offw, sw, OW, IW, &lo, &hi);
                for (int64_t r = r0; r <= r1; r++) {
                    int64_t id = r / IH, ih = r % IH;
                    int64_t a = r == r0 ? d->p0 - r * IW : 0, b = r == r1 ? d->p1 - r * IW : IW;
                    int64_t od = id * g->s[0] - g->pb[0] + kd * g->d[0];
                    int64_t oh = ih * g->s[1] - g->pb[1] + kh * g->d[1];
                    if (od < 0 || od >= OD || oh < 0 || oh >= OH) continue;
                    int64_t l = imin(imax(lo, a), b), h = imin(imax(hi, l), b);
                    const float *src = col + (r * IW - d->p0);
                    float *dst = y + (od * OH + oh) * OW;
                    if (sw == 1) {
                        if (h > l) vadd(dst + l + offw, src + l, h - l);
                    } else {
                        for (int64_t iw = l; iw < h; iw++) dst[iw * sw + offw] += src[iw];
                    }
                }
            }
    return MTS_OK;
}

static int convt_run(mts_kctx *k)
{
    convt_desc d;
    int rc = convt_setup(k, &d);
    if (rc) return rc;
    d.y = k->out[0].data;
    for (int64_t i = 0; i < d.N * d.M; i++) vfill(d.y + i * d.P, d.b ? d.b[i % d.M] : 0.0f, d.P);
    if (d.N == 0 || d.IP == 0 || d.Cg == 0) return MTS_OK;
    double flops = 2.0 * (double)d.N * (double)d.C * (double)d.IP * (double)d.K2;
    int nt = pick_threads(k, flops);
    int64_t IW = d.g.in[2];
    /* chunks of whole input rows, col at most about 16 * COL_FLOATS (at least one row): wide
     * enough that repacking W per chunk stays cheap */
    int64_t rows = imax(1, 16 * COL_FLOATS / imax(1, d.K2 * IW));
    int64_t nc = imin(rows * IW, d.IP);
    d.col = malloc((size_t)(d.K2 * nc) * sizeof(float));
    if (!d.col) return mts_err_set(k->err, MTS_ENOMEM, "ConvTranspose: no memory for a %lld x %lld column buffer",
                                   (long long)d.K2, (long long)nc);
    int64_t mr = mts_sgemm_mr();
    d.rows_per_unit = imax(mr, cdiv(cdiv(d.K2, nt), mr) * mr);
    d.ws = mts_sgemm_ws_floats(d.rows_per_unit, nc, d.Cg);
    int64_t gemm_units = cdiv(d.K2, d.rows_per_unit);
    for (d.n = 0; d.n < d.N && !rc; d.n++)
        for (d.gi = 0; d.gi < d.group && !rc; d.gi++)
            for (d.p0 = 0; d.p0 < d.IP && !rc; d.p0 += nc) {
                d.p1 = imin(d.p0 + nc, d.IP);
                rc = par_run(nt, gemm_units, d.ws, convt_gemm_unit, &d);
                if (!rc) rc = par_run(nt, d.Mg, 0, convt_col2im_unit, &d);
            }
    free(d.col);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* MaxPool, AveragePool                                                                        */

typedef struct pool_desc {
    geom g;
    int64_t planes, IP, OP;
    int rank;
    int64_t N, C;
} pool_desc;

static int pool_setup(mts_kctx *k, pool_desc *d, bool is_max)
{
    const mts_tensor *X = req_in(k, 0, "X");
    int rc;
    if (!X) return MTS_EINVAL;
    if (is_max) {
        if (X->dtype != MTS_DTYPE_FLOAT && X->dtype != MTS_DTYPE_INT8 && X->dtype != MTS_DTYPE_UINT8)
            return dtype_err(k, "X", X->dtype, "float, int8 or uint8");
    } else if ((rc = need_float(k, X, "X"))) {
        return rc;
    }
    if (X->rank < 3)
        return mts_err_set(k->err, MTS_ESHAPE, "X has rank %d, expected at least 3 (N, C, spatial...)", X->rank);
    if (X->rank > 2 + NSP)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "X has %d spatial dims; only 1 to 3 are supported",
                           X->rank - 2);
    memset(d, 0, sizeof *d);
    int n = X->rank - 2;
    bool has_ks;
    d->g.nsp = n;
    if ((rc = attr_ints_n(k, "kernel_shape", n, 0, d->g.k, &has_ks))) return rc;
    if (!has_ks) return mts_err_set(k->err, MTS_EINVAL, "required attribute kernel_shape is missing");
    for (int i = 0; i < n; i++) d->g.in[i] = X->dims[2 + i];
    int64_t ceil_mode = mts_attr_int(k->node, "ceil_mode", 0);
    if ((rc = geom_forward(k, &d->g, ceil_mode != 0))) return rc;
    d->rank = X->rank;
    d->N = X->dims[0];
    d->C = X->dims[1];
    d->planes = d->N * d->C;
    d->IP = d->g.in[0] * d->g.in[1] * d->g.in[2];
    d->OP = d->g.out[0] * d->g.out[1] * d->g.out[2];
    return MTS_OK;
}

/* Geometry of a MaxPool / AveragePool node for the fast backends (kernel.h). */
int mts_pool_geometry(mts_kctx *k, bool is_max, mts_conv_geom *out)
{
    pool_desc d;
    int rc = pool_setup(k, &d, is_max);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    out->nsp = d.g.nsp;
    out->N = d.N, out->C = d.C, out->M = d.C, out->group = 1;
    for (int i = 0; i < NSP; i++) {
        out->in[i] = d.g.in[i], out->k[i] = d.g.k[i], out->s[i] = d.g.s[i], out->d[i] = d.g.d[i];
        out->pb[i] = d.g.pb[i], out->pe[i] = d.g.pe[i], out->out[i] = d.g.out[i];
    }
    return MTS_OK;
}

static void pool_out_shape(const pool_desc *d, mts_tensor *o, mts_dtype dt)
{
    o->dtype = dt;
    o->rank = d->rank;
    o->dims[0] = d->N;
    o->dims[1] = d->C;
    for (int i = 0; i < d->g.nsp; i++) o->dims[2 + i] = d->g.out[NSP - d->g.nsp + i];
}

static int maxpool_infer(mts_kctx *k)
{
    pool_desc d;
    int rc = pool_setup(k, &d, true);
    if (rc) return rc;
    int64_t so = mts_attr_int(k->node, "storage_order", 0);
    if (so != 0 && so != 1)
        return mts_err_set(k->err, MTS_EINVAL, "storage_order %lld must be 0 or 1", (long long)so);
    pool_out_shape(&d, &k->out[0], k->in[0]->dtype);
    if (k->n_out >= 2) pool_out_shape(&d, &k->out[1], MTS_DTYPE_INT64);
    return MTS_OK;
}

#define DEFINE_MAXPOOL(NAME, T, LOWEST)                                                                  \
    static void NAME(const T *x, T *y, int64_t *ind, const pool_desc *pd, bool col_major)               \
    {                                                                                                    \
        const geom *g = &pd->g;                                                                          \
        int64_t ID = g->in[0], IH = g->in[1], IW = g->in[2];                                             \
        for (int64_t pl = 0; pl < pd->planes; pl++) {                                                    \
            const T *xp = x + pl * pd->IP;                                                               \
            for (int64_t od = 0; od < g->out[0]; od++) {                                                 \
                int64_t ds = od * g->s[0] - g->pb[0];                                                    \
                for (int64_t oh = 0; oh < g->out[1]; oh++) {                                             \
                    int64_t hs = oh * g->s[1] - g->pb[1];                                                \
                    for (int64_t ow = 0; ow < g->out[2]; ow++) {                                         \
                        int64_t wst = ow * g->s[2] - g->pb[2];                                           \
                        T best = LOWEST;                                                                 \
                        int64_t bd = -1, bh = 0, bw = 0;                                                 \
                        for (int64_t kd = 0; kd < g->k[0]; kd++) {                                       \
                            int64_t id = ds + kd * g->d[0];                                              \
                            if (id < 0 || id >= ID) continue;                                            \
                            for (int64_t kh = 0; kh < g->k[1]; kh++) {                                   \
                                int64_t ih = hs + kh * g->d[1];                                          \
                                if (ih < 0 || ih >= IH) continue;                                        \
                                const T *row = xp + (id * IH + ih) * IW;                                 \
                                for (int64_t kw = 0; kw < g->k[2]; kw++) {                               \
                                    int64_t iw = wst + kw * g->d[2];                                     \
                                    if (iw < 0 || iw >= IW) continue;                                    \
                                    if (bd < 0 || row[iw] > best) {                                      \
                                        best = row[iw];                                                  \
                                        bd = id, bh = ih, bw = iw;                                       \
                                    }                                                                    \
                                }                                                                        \
                            }                                                                            \
                        }                                                                                \
                        *y++ = best;                                                                     \
                        if (ind) {                                                                       \
                            int64_t off = col_major ? bd + bh * ID + bw * ID * IH : (bd * IH + bh) * IW + bw; \
                            *ind++ = bd < 0 ? -1 : pl * pd->IP + off;                                    \
                        }                                                                                \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
    }

DEFINE_MAXPOOL(maxpool_f32, float, -FLT_MAX)
DEFINE_MAXPOOL(maxpool_i8, int8_t, INT8_MIN)
DEFINE_MAXPOOL(maxpool_u8, uint8_t, 0)

static int maxpool_run(mts_kctx *k)
{
    pool_desc d;
    int rc = pool_setup(k, &d, true);
    if (rc) return rc;
    bool col_major = mts_attr_int(k->node, "storage_order", 0) == 1;
    int64_t *ind = k->n_out >= 2 ? k->out[1].data : NULL;
    const void *x = k->in[0]->data;
    switch (k->in[0]->dtype) {
    case MTS_DTYPE_FLOAT: maxpool_f32(x, k->out[0].data, ind, &d, col_major); break;
    case MTS_DTYPE_INT8: maxpool_i8(x, k->out[0].data, ind, &d, col_major); break;
    default: maxpool_u8(x, k->out[0].data, ind, &d, col_major); break;
    }
    return MTS_OK;
}

static int avgpool_infer(mts_kctx *k)
{
    pool_desc d;
    int rc = pool_setup(k, &d, false);
    if (rc) return rc;
    pool_out_shape(&d, &k->out[0], MTS_DTYPE_FLOAT);
    return MTS_OK;
}

/* Taps j < K of a window starting at st (step dl) that land in [lo_lim, hi_lim). */
static int64_t taps_in(int64_t st, int64_t dl, int64_t K, int64_t lo_lim, int64_t hi_lim)
{
    int64_t c = 0;
    for (int64_t j = 0; j < K; j++) {
        int64_t p = st + j * dl;
        c += p >= lo_lim && p < hi_lim;
    }
    return c;
}

static int avgpool_run(mts_kctx *k)
{
    pool_desc d;
    int rc = pool_setup(k, &d, false);
    if (rc) return rc;
    bool incl = mts_attr_int(k->node, "count_include_pad", 0) != 0;
    const geom *g = &d.g;
    int64_t ID = g->in[0], IH = g->in[1], IW = g->in[2];
    const float *x = k->in[0]->data;
    float *y = k->out[0].data;
    for (int64_t pl = 0; pl < d.planes; pl++) {
        const float *xp = x + pl * d.IP;
        for (int64_t od = 0; od < g->out[0]; od++) {
            int64_t ds = od * g->s[0] - g->pb[0];
            int64_t cd = incl ? taps_in(ds, g->d[0], g->k[0], -g->pb[0], ID + g->pe[0])
                              : taps_in(ds, g->d[0], g->k[0], 0, ID);
            for (int64_t oh = 0; oh < g->out[1]; oh++) {
                int64_t hs = oh * g->s[1] - g->pb[1];
                int64_t ch = incl ? taps_in(hs, g->d[1], g->k[1], -g->pb[1], IH + g->pe[1])
                                  : taps_in(hs, g->d[1], g->k[1], 0, IH);
                for (int64_t ow = 0; ow < g->out[2]; ow++) {
                    int64_t wst = ow * g->s[2] - g->pb[2];
                    int64_t cw = incl ? taps_in(wst, g->d[2], g->k[2], -g->pb[2], IW + g->pe[2])
                                      : taps_in(wst, g->d[2], g->k[2], 0, IW);
                    double sum = 0.0;
                    for (int64_t kd = 0; kd < g->k[0]; kd++) {
                        int64_t id = ds + kd * g->d[0];
                        if (id < 0 || id >= ID) continue;
                        for (int64_t kh = 0; kh < g->k[1]; kh++) {
                            int64_t ih = hs + kh * g->d[1];
                            if (ih < 0 || ih >= IH) continue;
                            const float *row = xp + (id * IH + ih) * IW;
                            for (int64_t kw = 0; kw < g->k[2]; kw++) {
                                int64_t iw = wst + kw * g->d[2];
                                if (iw >= 0 && iw < IW) sum += row[iw];
                            }
                        }
                    }
                    int64_t cnt = cd * ch * cw;
                    *y++ = cnt > 0 ? (float)(sum / (double)cnt) : 0.0f;
                }
            }
        }
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* GlobalAveragePool, GlobalMaxPool                                                            */

static int gpool_infer(mts_kctx *k)
{
    const mts_tensor *X = req_in(k, 0, "X");
    int rc;
    if (!X) return MTS_EINVAL;
    if ((rc = need_float(k, X, "X"))) return rc;
    if (X->rank < 2) return mts_err_set(k->err, MTS_ESHAPE, "X has rank %d, expected at least 2 (N, C, ...)", X->rank);
    mts_tensor *o = &k->out[0];
    o->dtype = MTS_DTYPE_FLOAT;
    o->rank = X->rank;
    o->dims[0] = X->dims[0];
    o->dims[1] = X->dims[1];
    for (int i = 2; i < X->rank; i++) o->dims[i] = 1;
    return MTS_OK;
}

static int gpool_run_common(mts_kctx *k, bool is_max)
{
    int rc = gpool_infer(k);
    if (rc) return rc;
    const mts_tensor *X = k->in[0];
    int64_t planes = X->dims[0] * X->dims[1], sz = 1;
    for (int i = 2; i < X->rank; i++) sz *= X->dims[i];
    const float *x = X->data;
    float *y = k->out[0].data;
    for (int64_t p = 0; p < planes; p++) {
        const float *xp = x + p * sz;
        if (is_max) {
            float m = sz > 0 ? xp[0] : -FLT_MAX;
            for (int64_t i = 1; i < sz; i++)
                if (xp[i] > m) m = xp[i];
            y[p] = m;
        } else {
            double s = 0.0;
            for (int64_t i = 0; i < sz; i++) s += xp[i];
            y[p] = sz > 0 ? (float)(s / (double)sz) : 0.0f;
        }
    }
    return MTS_OK;
}

static int gavgpool_run(mts_kctx *k) { return gpool_run_common(k, false); }
static int gmaxpool_run(mts_kctx *k) { return gpool_run_common(k, true); }

/* ------------------------------------------------------------------------------------------ */
/* Resize, Upsample                                                                            */

enum { RM_NEAREST, RM_LINEAR, RM_CUBIC };
enum { CT_HALF_PIXEL, CT_PYTORCH_HALF_PIXEL, CT_ALIGN_CORNERS, CT_ASYMMETRIC, CT_TF_HALF_PIXEL_NN,
       CT_TF_CROP_AND_RESIZE, CT_HALF_PIXEL_SYMMETRIC };
enum { NM_ROUND_PREFER_FLOOR, NM_ROUND_PREFER_CEIL, NM_FLOOR, NM_CEIL, NM_LEGACY };

typedef struct rs_desc {
    int rank, mode, ctm, nmode;
    bool exclude_outside;
    double cubic_a;
    float extrap;
    int64_t in[MTS_MAX_RANK], out[MTS_MAX_RANK];
    double scale[MTS_MAX_RANK];   /* coordinate scale per axis */
    double len_res[MTS_MAX_RANK]; /* "length_resized" as the ONNX reference computes it: in * scale */
    double roi_s[MTS_MAX_RANK], roi_e[MTS_MAX_RANK];
} rs_desc;

static bool tensor_empty(const mts_tensor *t) { return !t || mts_tensor_numel(t) == 0; }

static int rs_setup(mts_kctx *k, bool upsample, rs_desc *d)
{
    const mts_node *nd = k->node;
    int opset = nd->opset, rc;
    const char *op = upsample ? "Upsample" : "Resize";
    const mts_tensor *X = req_in(k, 0, "X");
    if (!X) return MTS_EINVAL;
    if (!mts_dtype_supported(X->dtype)) return dtype_err(k, "X", X->dtype, "an engine-supported type");
    if (X->rank < 1) return mts_err_set(k->err, MTS_ESHAPE, "%s needs X of rank >= 1", op);
    memset(d, 0, sizeof *d);
    int r = X->rank;
    d->rank = r;
    const char *mode = mts_attr_string(nd, "mode", "nearest");
    if (!strcmp(mode, "nearest")) d->mode = RM_NEAREST;
    else if (!strcmp(mode, "linear") || (upsample && !strcmp(mode, "bilinear"))) d->mode = RM_LINEAR;
    else if (!upsample && !strcmp(mode, "cubic")) d->mode = RM_CUBIC;
    else return mts_err_set(k->err, MTS_EINVAL, "%s mode '%s' is not one of nearest, linear%s", op, mode,
                            upsample ? "" : ", cubic");
    if (d->mode != RM_NEAREST && X->dtype != MTS_DTYPE_FLOAT)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s mode '%s' on %s data: only float is implemented", op, mode,
                           mts_dtype_name(X->dtype));
    bool legacy = upsample || opset < 11;
    d->cubic_a = -0.75;
    if (legacy) {
        d->ctm = CT_ASYMMETRIC;
        d->nmode = NM_LEGACY;
    } else {
        const char *ct = mts_attr_string(nd, "coordinate_transformation_mode", "half_pixel");
        if (!strcmp(ct, "half_pixel")) d->ctm = CT_HALF_PIXEL;
        else if (!strcmp(ct, "pytorch_half_pixel")) d->ctm = CT_PYTORCH_HALF_PIXEL;
        else if (!strcmp(ct, "align_corners")) d->ctm = CT_ALIGN_CORNERS;
        else if (!strcmp(ct, "asymmetric")) d->ctm = CT_ASYMMETRIC;
        else if (!strcmp(ct, "tf_half_pixel_for_nearest") || !strcmp(ct, "tf_half_pixel_for_nn")) d->ctm = CT_TF_HALF_PIXEL_NN;
        else if (!strcmp(ct, "tf_crop_and_resize")) d->ctm = CT_TF_CROP_AND_RESIZE;
        else if (!strcmp(ct, "half_pixel_symmetric") && opset >= 19) d->ctm = CT_HALF_PIXEL_SYMMETRIC;
        else return mts_err_set(k->err, MTS_EINVAL, "unknown coordinate_transformation_mode '%s'", ct);
        const char *nm = mts_attr_string(nd, "nearest_mode", "round_prefer_floor");
        if (!strcmp(nm, "round_prefer_floor")) d->nmode = NM_ROUND_PREFER_FLOOR;
        else if (!strcmp(nm, "round_prefer_ceil")) d->nmode = NM_ROUND_PREFER_CEIL;
        else if (!strcmp(nm, "floor")) d->nmode = NM_FLOOR;
        else if (!strcmp(nm, "ceil")) d->nmode = NM_CEIL;
        else return mts_err_set(k->err, MTS_EINVAL, "unknown nearest_mode '%s'", nm);
        d->cubic_a = mts_attr_float(nd, "cubic_coeff_a", -0.75f);
        d->exclude_outside = mts_attr_int(nd, "exclude_outside", 0) != 0;
        d->extrap = mts_attr_float(nd, "extrapolation_value", 0.0f);
    }
    /* axes and aspect-ratio policy (opset 18+) */
    int naxes = r, axes[MTS_MAX_RANK];
    for (int i = 0; i < r; i++) axes[i] = i;
    const char *policy = "stretch";
    if (!upsample && opset >= 18) {
        if (mts_attr_int(nd, "antialias", 0) != 0)
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "Resize antialias=1 is not implemented");
        policy = mts_attr_string(nd, "keep_aspect_ratio_policy", "stretch");
        if (strcmp(policy, "stretch") && strcmp(policy, "not_larger") && strcmp(policy, "not_smaller"))
            return mts_err_set(k->err, MTS_EINVAL, "unknown keep_aspect_ratio_policy '%s'", policy);
        int cnt = 0;
        const int64_t *av = mts_attr_ints(nd, "axes", &cnt);
        if (av && cnt > 0) {
            if (cnt > r) return mts_err_set(k->err, MTS_EINVAL, "axes has %d values for rank %d", cnt, r);
            bool seen[MTS_MAX_RANK] = {false};
            for (int i = 0; i < cnt; i++) {
                if ((rc = mts_norm_axis(av[i], r, &axes[i], k->err))) return rc;
                if (seen[axes[i]]) return mts_err_set(k->err, MTS_EINVAL, "axes repeats axis %lld", (long long)av[i]);
                seen[axes[i]] = true;
            }
            naxes = cnt;
        }
    }
    for (int i = 0; i < r; i++) {
        d->in[i] = d->out[i] = X->dims[i];
        d->scale[i] = 1.0;
        d->len_res[i] = (double)X->dims[i];
        d->roi_s[i] = 0.0;
        d->roi_e[i] = 1.0;
    }
    /* the scales / sizes / roi sources for this version */
    const mts_tensor *scales_t = NULL, *sizes_t = NULL, *roi_t = NULL;
    const float *attr_scales = NULL;
    int n_attr_scales = 0;
    if (upsample && opset < 7) {
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Upsample-%d (height_scale/width_scale) is not implemented", opset);
    } else if (upsample && opset < 9) {
        attr_scales = mts_attr_floats(nd, "scales", &n_attr_scales);
        if (!attr_scales || n_attr_scales != r)
            return mts_err_set(k->err, MTS_EINVAL, "Upsample needs attribute scales with %d values, got %d", r,
                               attr_scales ? n_attr_scales : 0);
    } else if (legacy) {
        scales_t = req_in(k, 1, "scales");
        if (!scales_t) return MTS_EINVAL;
    } else {
        roi_t = mts_kin(k, 1);
        scales_t = mts_kin(k, 2);
        sizes_t = mts_kin(k, 3);
        if (tensor_empty(scales_t)) scales_t = NULL;
        if (tensor_empty(sizes_t)) sizes_t = NULL;
        if (tensor_empty(roi_t)) roi_t = NULL;
        if (scales_t && sizes_t)
            return mts_err_set(k->err, MTS_EINVAL, "Resize: only one of scales and sizes may be given");
        if (!scales_t && !sizes_t)
            return mts_err_set(k->err, MTS_EINVAL, "Resize: one of scales and sizes is required");
    }
    if (d->ctm == CT_TF_CROP_AND_RESIZE && roi_t) {
        if (roi_t->dtype != MTS_DTYPE_FLOAT && roi_t->dtype != MTS_DTYPE_DOUBLE)
            return dtype_err(k, "roi", roi_t->dtype, "float");
        if (mts_tensor_numel(roi_t) != 2 * naxes)
            return mts_err_set(k->err, MTS_ESHAPE, "roi has %lld values, expected %d", (long long)mts_tensor_numel(roi_t),
                               2 * naxes);
        if (!roi_t->data) return MTS_EDYNAMIC;
        for (int i = 0; i < naxes; i++) {
            d->roi_s[axes[i]] = mts_tensor_get_f64(roi_t, i);
            d->roi_e[axes[i]] = mts_tensor_get_f64(roi_t, naxes + i);
        }
    }
    if (scales_t || attr_scales) {
        if (scales_t) {
            if (scales_t->dtype != MTS_DTYPE_FLOAT) return dtype_err(k, "scales", scales_t->dtype, "float");
            if (mts_tensor_numel(scales_t) != naxes)
                return mts_err_set(k->err, MTS_ESHAPE, "scales has %lld values, expected %d",
                                   (long long)mts_tensor_numel(scales_t), naxes);
            if (!scales_t->data) return MTS_EDYNAMIC;
        }
        for (int i = 0; i < naxes; i++) {
            int a = axes[i];
            double s = scales_t ? ((const float *)scales_t->data)[i] : attr_scales[i];
            if (!(s > 0.0) || !isfinite(s))
                return mts_err_set(k->err, MTS_EINVAL, "scales[%d] = %g must be positive", i, s);
            double extent = d->ctm == CT_TF_CROP_AND_RESIZE ? d->roi_e[a] - d->roi_s[a] : 1.0;
            double o = floor((double)d->in[a] * extent * s);
            if (!(o >= 0.0) || o > (double)((int64_t)1 << 40))
                return mts_err_set(k->err, MTS_EINVAL, "axis %d: output size %g from scale %g is out of range", a, o, s);
            d->out[a] = (int64_t)o;
            d->scale[a] = s;
            d->len_res[a] = (double)d->in[a] * s;
        }
    } else {
        if (sizes_t->dtype != MTS_DTYPE_INT64) return dtype_err(k, "sizes", sizes_t->dtype, "int64");
        if (mts_tensor_numel(sizes_t) != naxes)
            return mts_err_set(k->err, MTS_ESHAPE, "sizes has %lld values, expected %d",
                               (long long)mts_tensor_numel(sizes_t), naxes);
        if (!sizes_t->data) return MTS_EDYNAMIC;
        const int64_t *sz = sizes_t->data;
        for (int i = 0; i < naxes; i++) {
            int a = axes[i];
            if (sz[i] < 0 || sz[i] > ((int64_t)1 << 40))
                return mts_err_set(k->err, MTS_EINVAL, "sizes[%d] = %lld is out of range", i, (long long)sz[i]);
            if (d->in[a] == 0 && sz[i] != 0)
                return mts_err_set(k->err, MTS_ESHAPE, "axis %d: cannot resize an empty dimension to %lld", a,
                                   (long long)sz[i]);
        }
        if (strcmp(policy, "stretch")) {
            bool larger = !strcmp(policy, "not_smaller");
            double s = larger ? 0.0 : INFINITY;
            for (int i = 0; i < naxes; i++) {
                int a = axes[i];
                if (d->in[a] == 0) continue;
                double si = (double)sz[i] / (double)d->in[a];
                s = larger ? fmax(s, si) : fmin(s, si);
            }
            if (!isfinite(s) || s <= 0.0) s = 1.0;
            for (int i = 0; i < naxes; i++) {
                int a = axes[i];
                d->out[a] = (int64_t)floor((double)d->in[a] * s + 0.5);
                d->scale[a] = s;
                d->len_res[a] = (double)d->in[a] * s;
            }
        } else {
            for (int i = 0; i < naxes; i++) {
                int a = axes[i];
                d->out[a] = sz[i];
                d->scale[a] = d->in[a] ? (double)sz[i] / (double)d->in[a] : 1.0;
                d->len_res[a] = (double)sz[i];
            }
        }
    }
    return MTS_OK;
}

static int rs_infer_common(mts_kctx *k, bool upsample)
{
    rs_desc d;
    int rc = rs_setup(k, upsample, &d);
    if (rc) return rc;
    mts_tensor *o = &k->out[0];
    o->dtype = k->in[0]->dtype;
    o->rank = d.rank;
    for (int i = 0; i < d.rank; i++) o->dims[i] = d.out[i];
    return MTS_OK;
}

static int resize_infer(mts_kctx *k) { return rs_infer_common(k, false); }
static int upsample_infer(mts_kctx *k) { return rs_infer_common(k, true); }

/* Input coordinate of output index j on axis a. */
static double rs_coord(const rs_desc *d, int a, int64_t j)
{
    double s = d->scale[a], in = (double)d->in[a], x = (double)j;
    double out = (double)d->out[a], lr = d->len_res[a];
    switch (d->ctm) {
    case CT_HALF_PIXEL: return (x + 0.5) / s - 0.5;
    case CT_PYTORCH_HALF_PIXEL: return out > 1 ? (x + 0.5) / s - 0.5 : 0.0;
    case CT_ALIGN_CORNERS: return lr == 1.0 ? 0.0 : x * (in - 1) / (lr - 1);
    case CT_ASYMMETRIC: return x / s;
    case CT_TF_HALF_PIXEL_NN: return (x + 0.5) / s;
    case CT_TF_CROP_AND_RESIZE: {
        double st = d->roi_s[a], en = d->roi_e[a];
        return out > 1 ? st * (in - 1) + x * (en - st) * (in - 1) / (out - 1) : 0.5 * (st + en) * (in - 1);
    }
    default: { /* half_pixel_symmetric */
        double adj = out / (s * in), center = in / 2;
        return center * (1 - adj) + (x + 0.5) / s - 0.5;
    }
    }
}

/* Source coordinate of output index j, or false when it falls outside the crop box
 * (tf_crop_and_resize: extrapolation_value). The result is clamped to a finite range. */
static bool rs_source(const rs_desc *d, int a, int64_t j, double *xo)
{
    double x = rs_coord(d, a, j), in = (double)d->in[a];
    if (d->ctm == CT_TF_CROP_AND_RESIZE && (x < 0 || x > in - 1)) return false;
    if (!(x >= -4.0)) x = -4.0; /* also NaN */
    if (x > in + 4.0) x = in + 4.0;
    *xo = x;
    return true;
}

static int64_t clamp_idx(int64_t i, int64_t n) { return i < 0 ? 0 : i >= n ? n - 1 : i; }

static bool rs_nearest(const rs_desc *d, int a, int64_t j, int64_t *idx)
{
    double x;
    if (!rs_source(d, a, j, &x)) return false;
    double fl = floor(x), fr = x - fl, v;
    switch (d->nmode) {
    case NM_ROUND_PREFER_FLOOR: v = fr <= 0.5 ? fl : fl + 1; break;
    case NM_ROUND_PREFER_CEIL: v = fr < 0.5 ? fl : fl + 1; break;
    case NM_FLOOR: v = fl; break;
    case NM_CEIL: v = ceil(x); break;
    default: v = d->scale[a] < 1.0 ? ceil(x) : fl; break;
    }
    *idx = clamp_idx((int64_t)v, d->in[a]);
    return true;
}

/* Linear/cubic taps of output index j on axis a: up to 4 (clamped index, weight) pairs. */
static bool rs_taps(const rs_desc *d, int a, int64_t j, int64_t *idx, float *w, int *nt)
{
    double x;
    if (!rs_source(d, a, j, &x)) return false;
    int64_t in = d->in[a];
    double fl = floor(x), r = x - fl, c[4];
    int64_t x0 = (int64_t)fl, base;
    if (r == 0.0) { /* the reference prefers the left neighbour: ratio in (0, 1] */
        x0 -= 1;
        r = 1.0;
    }
    int n;
    if (d->mode == RM_LINEAR) {
        n = 2;
        base = x0;
        c[0] = 1.0 - r;
        c[1] = r;
    } else {
        double A = d->cubic_a, t;
        n = 4;
        base = x0 - 1;
        t = r + 1;
        c[0] = ((A * t - 5 * A) * t + 8 * A) * t - 4 * A;
        c[1] = ((A + 2) * r - (A + 3)) * r * r + 1;
        t = 1 - r;
        c[2] = ((A + 2) * t - (A + 3)) * t * t + 1;
        t = 2 - r;
        c[3] = ((A * t - 5 * A) * t + 8 * A) * t - 4 * A;
    }
    if (d->exclude_outside) {
        double sum = 0;
        for (int t = 0; t < n; t++) {
            if (base + t < 0 || base + t >= in) c[t] = 0;
            sum += c[t];
        }
        if (sum != 0)
            for (int t = 0; t < n; t++) c[t] /= sum;
    }
    for (int t = 0; t < n; t++) {
        idx[t] = clamp_idx(base + t, in);
        w[t] = (float)c[t];
    }
    *nt = n;
    return true;
}

/* Nearest: a gather through per-axis index maps (-1: extrapolation value), any element size. */
static int rs_run_nearest(mts_kctx *k, const rs_desc *d)
{
    const mts_tensor *X = k->in[0];
    mts_tensor *Y = &k->out[0];
    int r = d->rank;
    int64_t total = 0, istr[MTS_MAX_RANK];
    mts_strides(X, istr);
    int64_t onum = 1;
    for (int a = 0; a < r; a++) onum *= d->out[a];
    if (onum == 0) return MTS_OK;
    for (int a = 0; a < r; a++) total += d->out[a];
    int64_t *maps = malloc((size_t)total * sizeof(int64_t)), *mp[MTS_MAX_RANK];
    if (!maps) return mts_err_set(k->err, MTS_ENOMEM, "Resize: no memory for index maps");
    int64_t off = 0;
    for (int a = 0; a < r; a++) {
        mp[a] = maps + off;
        off += d->out[a];
        for (int64_t j = 0; j < d->out[a]; j++) {
            int64_t i;
            mp[a][j] = rs_nearest(d, a, j, &i) ? i * istr[a] : -1;
        }
    }
    size_t es = mts_dtype_size(X->dtype);
    int64_t L = d->out[r - 1], rows = onum / L;
    int64_t cnt[MTS_MAX_RANK] = {0};
    union { float f; double d; int8_t i8; uint8_t u8; int16_t i16; uint16_t u16; int32_t i32; uint32_t u32;
            int64_t i64; uint64_t u64; } ev;
    memset(&ev, 0, sizeof ev);
    /* the value as an integer, defined for any float (out of range: 0) */
    int64_t ei = isfinite(d->extrap) && fabs((double)d->extrap) < 9.0e18 ? (int64_t)d->extrap : 0;
    switch (X->dtype) {
    case MTS_DTYPE_FLOAT: ev.f = d->extrap; break;
    case MTS_DTYPE_DOUBLE: ev.d = d->extrap; break;
    case MTS_DTYPE_INT16: ev.i16 = (int16_t)(uint16_t)(uint64_t)ei; break;
    case MTS_DTYPE_UINT16: ev.u16 = (uint16_t)(uint64_t)ei; break;
    case MTS_DTYPE_UINT32: ev.u32 = (uint32_t)(uint64_t)ei; break;
    case MTS_DTYPE_UINT64: ev.u64 = (uint64_t)ei; break;
    case MTS_DTYPE_INT8: ev.i8 = (int8_t)d->extrap; break;
    case MTS_DTYPE_INT32: ev.i32 = (int32_t)d->extrap; break;
    case MTS_DTYPE_INT64: ev.i64 = (int64_t)d->extrap; break;
    default: ev.u8 = (uint8_t)d->extrap; break;
    }
    const char *x = X->data;
    char *y = Y->data;
    const int64_t *lm = mp[r - 1];
    int64_t prev_src = -2;
    for (int64_t row = 0; row < rows; row++) {
        int64_t src = 0;
        bool ext = false;
        for (int a = 0; a < r - 1; a++) {
            int64_t v = mp[a][cnt[a]];
            if (v < 0) ext = true;
            src += v;
        }
        if (ext) src = -1;
        char *yr = y + (size_t)(row * L) * es;
        if (src == prev_src) { /* same source row as the previous output row (upsampling) */
            memcpy(yr, yr - (size_t)L * es, (size_t)L * es);
        } else if (ext) {
            for (int64_t j = 0; j < L; j++) memcpy(yr + (size_t)j * es, &ev, es);
        } else if (es == 4) {
            const uint32_t *xs = (const uint32_t *)(const void *)x + src;
            uint32_t *yd = (uint32_t *)(void *)yr, e;
            memcpy(&e, &ev, 4);
            for (int64_t j = 0; j < L; j++) yd[j] = lm[j] < 0 ? e : xs[lm[j]];
        } else if (es == 1) {
            const uint8_t *xs = (const uint8_t *)x + src;
            uint8_t *yd = (uint8_t *)yr, e;
            memcpy(&e, &ev, 1);
            for (int64_t j = 0; j < L; j++) yd[j] = lm[j] < 0 ? e : xs[lm[j]];
        } else {
            for (int64_t j = 0; j < L; j++) {
                const void *s = lm[j] < 0 ? (const void *)&ev : (const void *)(x + (size_t)(src + lm[j]) * es);
                memcpy(yr + (size_t)j * es, s, es);
            }
        }
        prev_src = src;
        for (int a = r - 2; a >= 0; a--) {
            if (++cnt[a] < d->out[a]) break;
            cnt[a] = 0;
        }
    }
    free(maps);
    return MTS_OK;
}

/* Linear resizing of one or two axes with the source coordinates, the weights and the sums
 * in float, evaluated in the order of ONNX Runtime's CPU bilinear kernel: for axes A < B,
 * y = wB2*wA2*x[a1][b1] + wB1*wA2*x[a1][b2] + wB2*wA1*x[a2][b1] + wB1*wA1*x[a2][b2], left
 * to right, with the coordinate clamped to [0, in - 1] (so no tap is outside). The spec allows
 * any rounding; this order makes models that quantize Resize outputs dynamically
 * (DynamicQuantizeLinear rounds them, and one flipped step is amplified layer by layer)
 * reproduce ONNX Runtime's results. */
typedef struct rs_ltap {
    int64_t i1, i2;
    float d1, d2; /* weights of i2 and i1 */
} rs_ltap;

static bool rs_lin_float_axes(const rs_desc *d, int *ax, int *nax)
{
    if (d->mode != RM_LINEAR || d->exclude_outside) return false;
    if (d->ctm != CT_HALF_PIXEL && d->ctm != CT_PYTORCH_HALF_PIXEL && d->ctm != CT_ASYMMETRIC) return false;
    int n = 0;
    for (int a = 0; a < d->rank; a++) {
        if (d->out[a] == d->in[a] && d->scale[a] == 1.0) continue;
        if (n == 2 || d->in[a] == 0) return false;
        ax[n++] = a;
    }
    *nax = n;
    return n > 0;
}

static void rs_lin_float_taps(const rs_desc *d, int a, rs_ltap *t)
{
    float s = (float)d->scale[a], lim = (float)(d->in[a] - 1);
    for (int64_t j = 0; j < d->out[a]; j++) {
        float x = (float)j, c;
        if (d->ctm == CT_ASYMMETRIC) c = x / s;
        else if (d->ctm == CT_PYTORCH_HALF_PIXEL && d->out[a] <= 1) c = 0.0f;
        else c = (x + 0.5f) / s - 0.5f;
        c = lim < c ? lim : c;
        c = c > 0.0f ? c : 0.0f; /* also NaN */
        int64_t i1 = (int64_t)c;
        if (i1 > d->in[a] - 1) i1 = d->in[a] - 1;
        int64_t i2 = i1 + 1 < d->in[a] ? i1 + 1 : d->in[a] - 1;
        t[j].i1 = i1;
        t[j].i2 = i2;
        if (i1 == i2) {
            t[j].d1 = t[j].d2 = 0.5f;
        } else {
            t[j].d1 = fabsf(c - (float)i1);
            t[j].d2 = fabsf(c - (float)i2);
        }
    }
}

typedef struct rs_lin_job {
    const float *x;
    float *y;
    const rs_ltap *ta, *tb;
    int64_t outer, LA, LB, mid, inner, IA, IB;
    bool two;
    int round_to; /* MTS_DTYPE_FLOAT16 / BFLOAT16: each output row rounded to it while in cache */
} rs_lin_job;

/* yo[i] = w11 * x11[i] + w21 * x21[i] + w12 * x12[i] + w22 * x22[i], left to right with a
 * rounding after each operation (no fused multiply-add: the sums must stay ONNX Runtime's).
 * Eight lanes at a time where the CPU has AVX (the target enables no FMA, so the compiler
 * cannot contract), the same operations per element as the scalar loop. */
#if defined(__x86_64__) && defined(__GNUC__)
typedef float rs_v8 __attribute__((vector_size(32), aligned(4)));
__attribute__((target("avx"))) static int64_t rs_lin4_avx(float *yo, const float *x11, const float *x21,
                                                          const float *x12, const float *x22, float w11, float w21,
                                                          float w12, float w22, int64_t n)
{
    rs_v8 a = {w11, w11, w11, w11, w11, w11, w11, w11}, b = {w21, w21, w21, w21, w21, w21, w21, w21};
    rs_v8 c = {w12, w12, w12, w12, w12, w12, w12, w12}, d = {w22, w22, w22, w22, w22, w22, w22, w22};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        rs_v8 p = a * *(const rs_v8 *)(x11 + i), q = b * *(const rs_v8 *)(x21 + i);
        rs_v8 r = c * *(const rs_v8 *)(x12 + i), t = d * *(const rs_v8 *)(x22 + i);
        *(rs_v8 *)(yo + i) = ((p + q) + r) + t;
    }
    return i;
}

static bool rs_have_avx(void)
{
    static int have = -1;
    int v = __atomic_load_n(&have, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx") ? 1 : 0;
        __atomic_store_n(&have, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

static void rs_lin4(float *yo, const float *x11, const float *x21, const float *x12, const float *x22, float w11,
                    float w21, float w12, float w22, int64_t n)
{
    int64_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (n >= 8 && rs_have_avx()) i = rs_lin4_avx(yo, x11, x21, x12, x22, w11, w21, w12, w22, n);
#endif
    for (; i < n; i++) yo[i] = w11 * x11[i] + w21 * x21[i] + w12 * x12[i] + w22 * x22[i];
}

/* Output rows [o, ja] of the job, split over the threads (each element is computed the same
 * way whatever the split). */
static void rs_lin_part(void *arg, int ithr, int nthr)
{
    const rs_lin_job *j = arg;
    int64_t rows = j->outer * j->LA, lo = rows * ithr / nthr, hi = rows * (ithr + 1) / nthr;
    int64_t LA = j->LA, LB = j->LB, mid = j->mid, inner = j->inner, IA = j->IA, IB = j->IB;
    for (int64_t row = lo; row < hi; row++) {
        int64_t o = row / LA, ja = row % LA;
        const rs_ltap *pa = &j->ta[ja];
        for (int64_t m = 0; m < mid; m++) {
            const float *r1 = j->x + ((o * IA + pa->i1) * mid + m) * IB * inner;
            const float *r2 = j->x + ((o * IA + pa->i2) * mid + m) * IB * inner;
            float *yr = j->y + ((o * LA + ja) * mid + m) * LB * inner;
            if (!j->two) {
                for (int64_t i = 0; i < inner; i++) yr[i] = pa->d2 * r1[i] + pa->d1 * r2[i];
                if (j->round_to) mts_round_half((mts_dtype)j->round_to, yr, yr, inner);
                continue;
            }
            for (int64_t jb = 0; jb < LB; jb++) {
                const rs_ltap *pb = &j->tb[jb];
                float w11 = pb->d2 * pa->d2, w21 = pb->d1 * pa->d2, w12 = pb->d2 * pa->d1, w22 = pb->d1 * pa->d1;
                const float *x11 = r1 + pb->i1 * inner, *x21 = r1 + pb->i2 * inner;
                const float *x12 = r2 + pb->i1 * inner, *x22 = r2 + pb->i2 * inner;
                rs_lin4(yr + jb * inner, x11, x21, x12, x22, w11, w21, w12, w22, inner);
            }
            if (j->round_to) mts_round_half((mts_dtype)j->round_to, yr, yr, LB * inner);
        }
    }
}

/* The optimizer's fusion of a following Cast to float16 / bfloat16 (optimize.c): attribute
 * "mts_round" names the type the float output is rounded to; 0 when absent or another value. */
static int rs_round_to(const mts_node *n)
{
    int64_t t = mts_attr_int(n, "mts_round", 0);
    return t == MTS_DTYPE_FLOAT16 || t == MTS_DTYPE_BFLOAT16 ? (int)t : 0;
}

static int rs_run_lin_float(mts_kctx *k, const rs_desc *d, const int *ax, int nax)
{
    const float *x = k->in[0]->data;
    float *y = k->out[0].data;
    int A = ax[0], B = nax == 2 ? ax[1] : -1;
    int64_t LA = d->out[A], LB = B >= 0 ? d->out[B] : 1;
    rs_ltap *ta = malloc((size_t)(LA + LB) * sizeof *ta), *tb = ta ? ta + LA : NULL;
    if (!ta) return mts_err_set(k->err, MTS_ENOMEM, "Resize: no memory for interpolation tables");
    rs_lin_float_taps(d, A, ta);
    if (B >= 0) rs_lin_float_taps(d, B, tb);
    int64_t outer = 1, mid = 1, inner = 1;
    for (int a = 0; a < A; a++) outer *= d->in[a];
    if (B >= 0) {
        for (int a = A + 1; a < B; a++) mid *= d->in[a];
        for (int a = B + 1; a < d->rank; a++) inner *= d->in[a];
    } else {
        for (int a = A + 1; a < d->rank; a++) inner *= d->in[a];
    }
    rs_lin_job j = {x, y, ta, tb, outer, LA, LB, mid, inner, d->in[A], B >= 0 ? d->in[B] : 1, B >= 0,
                    rs_round_to(k->node)};
    /* about 64k outputs per thread, and no more threads than rows */
    int64_t t = mts_tensor_numel(&k->out[0]) / 65536;
    if (t > k->threads) t = k->threads;
    if (t > outer * LA) t = outer * LA;
    mts_parallel(t < 1 ? 1 : (int)t, rs_lin_part, &j);
    free(ta);
    return MTS_OK;
}

/* Linear / cubic: one axis at a time, shrinking axes first so no intermediate exceeds the
 * larger of input and output. */
static int rs_run_interp(mts_kctx *k, const rs_desc *d)
{
    const mts_tensor *X = k->in[0];
    int r = d->rank, order[MTS_MAX_RANK], n_ord = 0;
    int64_t onum = 1;
    for (int a = 0; a < r; a++) onum *= d->out[a];
    if (onum == 0) return MTS_OK;
    int64_t inum = mts_tensor_numel(X);
    float *yout = k->out[0].data;
    int64_t maxlen = 0;
    for (int a = 0; a < r; a++) maxlen = imax(maxlen, d->out[a]);
    int64_t *tidx = malloc((size_t)maxlen * 4 * sizeof(int64_t));
    float *tw = malloc((size_t)maxlen * 4 * sizeof(float));
    signed char *tn = malloc((size_t)maxlen);
    if (!tidx || !tw || !tn) {
        free(tidx), free(tw), free(tn);
        return mts_err_set(k->err, MTS_ENOMEM, "Resize: no memory for interpolation tables");
    }
    /* axes that are not the identity, shrinking ones first */
    for (int pass = 0; pass < 2; pass++)
        for (int a = 0; a < r; a++) {
            bool shrink = d->out[a] < d->in[a];
            if ((pass == 0) != shrink) continue;
            bool ident = d->out[a] == d->in[a];
            for (int64_t j = 0; ident && j < d->out[a]; j++) {
                int64_t ix[4];
                float w[4];
                int nt;
                if (!rs_taps(d, a, j, ix, w, &nt)) {
                    ident = false;
                    break;
                }
                double self = 0;
                for (int t = 0; t < nt; t++) {
                    if (ix[t] == j) self += w[t];
                    else if (w[t] != 0.0f) ident = false;
                }
                if (self != 1.0) ident = false;
            }
            if (!ident) order[n_ord++] = a;
        }
    int64_t dims[MTS_MAX_RANK];
    for (int a = 0; a < r; a++) dims[a] = d->in[a];
    const float *cur = X->data;
    float *owned = NULL;
    int rc = MTS_OK;
    if (n_ord == 0) memcpy(yout, cur, (size_t)inum * sizeof(float));
    for (int s = 0; s < n_ord; s++) {
        int a = order[s];
        int64_t outer = 1, inner = 1, L = dims[a], Lo = d->out[a];
        for (int i = 0; i < a; i++) outer *= dims[i];
        for (int i = a + 1; i < r; i++) inner *= dims[i];
        float *next = s == n_ord - 1 ? yout : malloc((size_t)(outer * Lo * inner) * sizeof(float));
        if (!next) {
            rc = mts_err_set(k->err, MTS_ENOMEM, "Resize: no memory for an intermediate of %lld floats",
                             (long long)(outer * Lo * inner));
            break;
        }
        for (int64_t j = 0; j < Lo; j++) {
            int nt;
            tn[j] = rs_taps(d, a, j, tidx + 4 * j, tw + 4 * j, &nt) ? (signed char)nt : -1;
        }
        for (int64_t o = 0; o < outer; o++) {
            const float *src = cur + o * L * inner;
            float *dst = next + o * Lo * inner;
            for (int64_t j = 0; j < Lo; j++) {
                float *dj = dst + j * inner;
                int nt = tn[j];
                const int64_t *ix = tidx + 4 * j;
                const float *w = tw + 4 * j;
                if (nt < 0) {
                    vfill(dj, d->extrap, inner);
                } else if (inner == 1) {
                    float acc = 0.0f;
                    for (int t = 0; t < nt; t++) acc += w[t] * src[ix[t]];
                    *dj = acc;
                } else {
                    vscale(dj, src + ix[0] * inner, w[0], inner);
                    for (int t = 1; t < nt; t++) vaxpy(dj, src + ix[t] * inner, w[t], inner);
                }
            }
        }
        free(owned);
        owned = next == yout ? NULL : next;
        cur = next;
        dims[a] = Lo;
    }
    free(owned);
    free(tidx), free(tw), free(tn);
    return rc;
}

static int rs_run_common(mts_kctx *k, bool upsample)
{
    rs_desc d;
    int rc = rs_setup(k, upsample, &d);
    if (rc) return rc;
    int ax[2], nax;
    if (k->in[0]->dtype == MTS_DTYPE_FLOAT && rs_lin_float_axes(&d, ax, &nax)) {
        int64_t onum = 1;
        for (int a = 0; a < d.rank; a++) onum *= d.out[a];
        if (onum == 0) return MTS_OK;
        return rs_run_lin_float(k, &d, ax, nax);
    }
    rc = d.mode == RM_NEAREST ? rs_run_nearest(k, &d) : rs_run_interp(k, &d);
    int rt = rs_round_to(k->node);
    if (!rc && rt && k->out[0].dtype == MTS_DTYPE_FLOAT)
        mts_round_half((mts_dtype)rt, k->out[0].data, k->out[0].data, mts_tensor_numel(&k->out[0]));
    return rc;
}

static int resize_run(mts_kctx *k) { return rs_run_common(k, false); }
static int upsample_run(mts_kctx *k) { return rs_run_common(k, true); }

/* ------------------------------------------------------------------------------------------ */
/* Pad                                                                                         */

enum { PM_CONSTANT, PM_REFLECT, PM_EDGE, PM_WRAP };

typedef struct pad_desc {
    int rank, mode;
    int64_t pb[MTS_MAX_RANK], pe[MTS_MAX_RANK], out[MTS_MAX_RANK];
} pad_desc;

static int pad_setup(mts_kctx *k, pad_desc *d)
{
    const mts_node *nd = k->node;
    int opset = nd->opset, rc;
    const mts_tensor *X = req_in(k, 0, "data");
    if (!X) return MTS_EINVAL;
    if (!mts_dtype_supported(X->dtype)) return dtype_err(k, "data", X->dtype, "an engine-supported type");
    memset(d, 0, sizeof *d);
    int r = X->rank;
    d->rank = r;
    const char *mode = mts_attr_string(nd, "mode", "constant");
    if (!strcmp(mode, "constant")) d->mode = PM_CONSTANT;
    else if (!strcmp(mode, "reflect")) d->mode = PM_REFLECT;
    else if (!strcmp(mode, "edge")) d->mode = PM_EDGE;
    else if (!strcmp(mode, "wrap") && opset >= 19) d->mode = PM_WRAP;
    else return mts_err_set(k->err, MTS_EINVAL, "Pad mode '%s' is not one of constant, reflect, edge", mode);
    int64_t pads[2 * MTS_MAX_RANK];
    if (opset < 11) {
        int cnt = 0;
        const int64_t *p = mts_attr_ints(nd, opset < 2 ? "paddings" : "pads", &cnt);
        if (!p && r > 0) return mts_err_set(k->err, MTS_EINVAL, "required attribute pads is missing");
        if (cnt != 2 * r) return mts_err_set(k->err, MTS_EINVAL, "pads has %d values, expected %d", cnt, 2 * r);
        if (cnt) memcpy(pads, p, (size_t)cnt * sizeof(int64_t));
    } else {
        const mts_tensor *P = req_in(k, 1, "pads"), *A = opset >= 18 ? mts_kin(k, 3) : NULL;
        if (!P) return MTS_EINVAL;
        if (P->dtype != MTS_DTYPE_INT64) return dtype_err(k, "pads", P->dtype, "int64");
        int naxes = r, axes[MTS_MAX_RANK];
        for (int i = 0; i < r; i++) axes[i] = i;
        if (A) {
            if (A->dtype != MTS_DTYPE_INT64 && A->dtype != MTS_DTYPE_INT32)
                return dtype_err(k, "axes", A->dtype, "int32 or int64");
            int64_t na = mts_tensor_numel(A);
            if (na > r) return mts_err_set(k->err, MTS_EINVAL, "axes has %lld values for rank %d", (long long)na, r);
            if (na > 0 && !A->data) return MTS_EDYNAMIC;
            naxes = (int)na;
            bool seen[MTS_MAX_RANK] = {false};
            for (int i = 0; i < naxes; i++) {
                int64_t v = mts_tensor_get_int(A, i);
                if ((rc = mts_norm_axis(v, r, &axes[i], k->err))) return rc;
                if (seen[axes[i]]) return mts_err_set(k->err, MTS_EINVAL, "axes repeats axis %lld", (long long)v);
                seen[axes[i]] = true;
            }
        }
        if (mts_tensor_numel(P) != 2 * naxes)
            return mts_err_set(k->err, MTS_ESHAPE, "pads has %lld values, expected %d",
                               (long long)mts_tensor_numel(P), 2 * naxes);
        if (naxes > 0 && !P->data) return MTS_EDYNAMIC;
        for (int i = 0; i < 2 * r; i++) pads[i] = 0;
        for (int i = 0; i < naxes; i++) {
            pads[axes[i]] = ((const int64_t *)P->data)[i];
            pads[r + axes[i]] = ((const int64_t *)P->data)[naxes + i];
        }
        const mts_tensor *V = mts_kin(k, 2);
        if (V && V->dtype != X->dtype) return dtype_err(k, "constant_value", V->dtype, mts_dtype_name(X->dtype));
        if (V && mts_tensor_numel(V) > 1)
            return mts_err_set(k->err, MTS_ESHAPE, "constant_value must hold one value, got %lld",
                               (long long)mts_tensor_numel(V));
    }
    for (int a = 0; a < r; a++) {
        int64_t in = X->dims[a], b = pads[a], e = pads[r + a];
        if (b < -((int64_t)1 << 40) || b > ((int64_t)1 << 40) || e < -((int64_t)1 << 40) || e > ((int64_t)1 << 40))
            return mts_err_set(k->err, MTS_EINVAL, "pads (%lld, %lld) of axis %d are out of range", (long long)b,
                               (long long)e, a);
        int64_t kept = in - imax(0, -b) - imax(0, -e);
        if (kept < 0 || in + b + e < 0)
            return mts_err_set(k->err, MTS_ESHAPE, "pads (%lld, %lld) remove more than the %lld elements of axis %d",
                               (long long)b, (long long)e, (long long)in, a);
        if (d->mode != PM_CONSTANT && kept == 0 && (b > 0 || e > 0))
            return mts_err_set(k->err, MTS_EINVAL, "Pad mode '%s' cannot pad axis %d, which has no elements", mode, a);
        d->pb[a] = b;
        d->pe[a] = e;
        d->out[a] = in + b + e;
    }
    return MTS_OK;
}

static int pad_infer(mts_kctx *k)
{
    pad_desc d;
    int rc = pad_setup(k, &d);
    if (rc) return rc;
    mts_tensor *o = &k->out[0];
    o->dtype = k->in[0]->dtype;
    o->rank = d.rank;
    for (int i = 0; i < d.rank; i++) o->dims[i] = d.out[i];
    return MTS_OK;
}

static int pad_run(mts_kctx *k)
{
    pad_desc d;
    int rc = pad_setup(k, &d);
    if (rc) return rc;
    const mts_tensor *X = k->in[0];
    size_t es = mts_dtype_size(X->dtype);
    int r = d.rank;
    /* constant value bytes */
    unsigned char cv[8] = {0};
    if (k->node->opset < 11) {
        float v = mts_attr_float(k->node, "value", 0.0f);
        switch (X->dtype) {
        case MTS_DTYPE_FLOAT: memcpy(cv, &v, 4); break;
        case MTS_DTYPE_INT8: { int8_t t = (int8_t)v; memcpy(cv, &t, 1); break; }
        case MTS_DTYPE_INT32: { int32_t t = (int32_t)v; memcpy(cv, &t, 4); break; }
        case MTS_DTYPE_INT64: { int64_t t = (int64_t)v; memcpy(cv, &t, 8); break; }
        case MTS_DTYPE_BOOL: cv[0] = v != 0.0f; break;
        default: { uint8_t t = (uint8_t)v; memcpy(cv, &t, 1); break; }
        }
    } else {
        const mts_tensor *V = mts_kin(k, 2);
        if (V && mts_tensor_numel(V) == 1 && V->data) memcpy(cv, V->data, es);
    }
    int64_t onum = 1;
    for (int a = 0; a < r; a++) onum *= d.out[a];
    if (onum == 0) return MTS_OK;
    if (r == 0) {
        memcpy(k->out[0].data, X->data, es);
        return MTS_OK;
    }
    int64_t istr[MTS_MAX_RANK], total = 0;
    mts_strides(X, istr);
    for (int a = 0; a < r; a++) total += d.out[a];
    int64_t *maps = malloc((size_t)total * sizeof(int64_t)), *mp[MTS_MAX_RANK];
    if (!maps) return mts_err_set(k->err, MTS_ENOMEM, "Pad: no memory for index maps");
    int64_t off = 0;
    for (int a = 0; a < r; a++) {
        mp[a] = maps + off;
        off += d.out[a];
        int64_t in = X->dims[a], lo = imax(0, -d.pb[a]), L = in - lo - imax(0, -d.pe[a]), pbp = imax(0, d.pb[a]);
        for (int64_t o = 0; o < d.out[a]; o++) {
            int64_t t = o - pbp, src;
            if (t >= 0 && t < L) {
                src = lo + t;
            } else if (d.mode == PM_CONSTANT) {
                mp[a][o] = -1;
                continue;
            } else if (d.mode == PM_EDGE) {
                src = t < 0 ? lo : lo + L - 1;
            } else if (d.mode == PM_WRAP) {
                src = lo + ((t % L) + L) % L;
            } else if (L == 1) {
                src = lo;
            } else {
                int64_t per = 2 * (L - 1), m = ((t % per) + per) % per;
                src = lo + (m >= L ? per - m : m);
            }
            mp[a][o] = src * istr[a];
        }
    }
    /* the last axis: the run of output indices copied contiguously */
    int64_t Lo = d.out[r - 1], rows = onum / Lo, cnt[MTS_MAX_RANK] = {0};
    const int64_t *lm = mp[r - 1];
    int64_t c0 = imin(imax(0, d.pb[r - 1]), Lo), c1 = c0;
    while (c1 < Lo && lm[c1] == lm[c0] + (c1 - c0)) c1++;
    if (c0 < Lo && lm[c0] < 0) c1 = c0;
    const char *x = X->data;
    char *y = k->out[0].data;
    for (int64_t row = 0; row < rows; row++) {
        int64_t src = 0;
        bool cst = false;
        for (int a = 0; a < r - 1; a++) {
            int64_t v = mp[a][cnt[a]];
            if (v < 0) cst = true;
            src += v;
        }
        char *yr = y + (size_t)(row * Lo) * es;
        if (cst) {
            for (int64_t j = 0; j < Lo; j++) memcpy(yr + (size_t)j * es, cv, es);
        } else {
            for (int64_t j = 0; j < Lo; j++) {
                if (j == c0 && c1 > c0) {
                    memcpy(yr + (size_t)j * es, x + (size_t)(src + lm[j]) * es, (size_t)(c1 - c0) * es);
                    j = c1 - 1;
                    continue;
                }
                const void *s = lm[j] < 0 ? (const void *)cv : (const void *)(x + (size_t)(src + lm[j]) * es);
                memcpy(yr + (size_t)j * es, s, es);
            }
        }
        for (int a = r - 2; a >= 0; a--) {
            if (++cnt[a] < d.out[a]) break;
            cnt[a] = 0;
        }
    }
    free(maps);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */

const mts_op mts_ref_ops_conv[] = {
    {"Conv", conv_infer, conv_run},
    {"ConvTranspose", convt_infer, convt_run},
    {"MaxPool", maxpool_infer, maxpool_run},
    {"AveragePool", avgpool_infer, avgpool_run},
    {"GlobalAveragePool", gpool_infer, gavgpool_run},
    {"GlobalMaxPool", gpool_infer, gmaxpool_run},
    {"Resize", resize_infer, resize_run},
    {"Upsample", upsample_infer, upsample_run},
    {"Pad", pad_infer, pad_run},
    {NULL, NULL, NULL},
};
