/*
 * Reference (plain C) kernels for the signal-processing operators of opset 17: DFT (forward and
 * inverse, optional one-sided output and dft_length padding/truncation), STFT (framed one-sided
 * or full DFTs of a real or complex signal with an optional window), the window generators
 * HannWindow, HammingWindow and BlackmanWindow (periodic or symmetric), and MelWeightMatrix.
 *
 * Transforms run in double: an iterative radix-2 FFT for power-of-two lengths and Bluestein's
 * chirp-z algorithm (three power-of-two FFTs) for every other length, so every transform is
 * O(n log n). Lengths that come from input values (dft_length, window sizes, mel matrix sizes)
 * are bounded by SIG_MAX_LEN; independent lines are spread over mts_parallel threads.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"
#include "engine/kernels/ref_math2.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* Largest transform, window or mel-spectrum length taken from an input value (a transform of
 * this length that is not a power of two needs about 80 MB of work memory per thread). */
#define SIG_MAX_LEN ((int64_t)1 << 20)

/* ------------------------------------------------------------------------------------------ */
/* FFT                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static bool is_pow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

/* In-place radix-2 FFT of length n (a power of two); sign -1 forward, +1 inverse (unscaled). */
static void fft_pow2(double *re, double *im, int64_t n, int sign)
{
    for (int64_t i = 1, j = 0; i < n; i++) {
        int64_t bit = n >> 1;
        for (; j & bit; bit >>= 1) j ^= bit;
        j ^= bit;
        if (i < j) {
            double t = re[i]; re[i] = re[j]; re[j] = t;
            t = im[i]; im[i] = im[j]; im[j] = t;
        }
    }
    for (int64_t len = 2; len <= n; len <<= 1) {
        int64_t half = len >> 1;
        double ang = sign * 2.0 * M_PI / (double)len;
        for (int64_t k = 0; k < half; k++) {
            double wr = cos(ang * (double)k), wi = sin(ang * (double)k);
            for (int64_t s = 0; s < n; s += len) {
                int64_t a = s + k, b = a + half;
                double xr = re[b] * wr - im[b] * wi, xi = re[b] * wi + im[b] * wr;
                re[b] = re[a] - xr;
                im[b] = im[a] - xi;
                re[a] += xr;
                im[a] += xi;
            }
        }
    }
}

/* A transform of one length and direction, shared read-only by the threads. For lengths that
 * are not a power of two it holds Bluestein's chirp w_j = exp(sign*i*pi*j^2/n) and the FFT of
 * the conjugate chirp zero-padded to m = the power of two >= 2n-1. */
typedef struct fft_plan {
    int64_t n, m;
    int sign;
    double *wr, *wi, *br, *bi;
} fft_plan;

static void fft_plan_free(fft_plan *p)
{
    free(p->wr);
    memset(p, 0, sizeof *p);
}

static int fft_plan_init(fft_plan *p, int64_t n, int sign, mts_err *err)
{
    memset(p, 0, sizeof *p);
    p->n = n;
    p->sign = sign;
    p->m = n;
    if (is_pow2(n)) return MTS_OK;
    int64_t m = 1;
    while (m < 2 * n - 1) m <<= 1;
    p->m = m;
    p->wr = malloc((size_t)(2 * n + 2 * m) * sizeof(double));
    if (!p->wr) return mts_err_set(err, MTS_ENOMEM, "out of memory for a transform of length %lld", (long long)n);
    p->wi = p->wr + n;
    p->br = p->wi + n;
    p->bi = p->br + m;
    for (int64_t j = 0, q = 0; j < n; j++) { /* q = j^2 mod 2n, kept exact */
        double ang = sign * M_PI * (double)q / (double)n;
        p->wr[j] = cos(ang);
        p->wi[j] = sin(ang);
        q = (q + 2 * j + 1) % (2 * n);
    }
    memset(p->br, 0, (size_t)(2 * m) * sizeof(double));
    for (int64_t j = 0; j < n; j++) {
        p->br[j] = p->wr[j];
        p->bi[j] = -p->wi[j];
        if (j > 0) {
            p->br[m - j] = p->wr[j];
            p->bi[m - j] = -p->wi[j];
        }
    }
    fft_pow2(p->br, p->bi, m, -1);
    return MTS_OK;
}

/* Scratch doubles one thread needs to run plan p: 2*m for Bluestein, none for radix-2. */
static int64_t fft_scratch(const fft_plan *p) { return p->wr ? 2 * p->m : 0; }

/* Transforms re/im (length n) in place; work holds fft_scratch(p) doubles. */
static void fft_run(const fft_plan *p, double *re, double *im, double *work)
{
    int64_t n = p->n, m = p->m;
    if (n <= 1) return;
    if (!p->wr) {
        fft_pow2(re, im, n, p->sign);
        return;
    }
    double *ar = work, *ai = work + m;
    for (int64_t j = 0; j < n; j++) {
        ar[j] = re[j] * p->wr[j] - im[j] * p->wi[j];
        ai[j] = re[j] * p->wi[j] + im[j] * p->wr[j];
    }
    memset(ar + n, 0, (size_t)(m - n) * sizeof(double));
    memset(ai + n, 0, (size_t)(m - n) * sizeof(double));
    fft_pow2(ar, ai, m, -1);
    for (int64_t j = 0; j < m; j++) {
        double xr = ar[j] * p->br[j] - ai[j] * p->bi[j], xi = ar[j] * p->bi[j] + ai[j] * p->br[j];
        ar[j] = xr;
        ai[j] = xi;
    }
    fft_pow2(ar, ai, m, +1);
    double inv = 1.0 / (double)m;
    for (int64_t k = 0; k < n; k++) {
        double cr = ar[k] * inv, ci = ai[k] * inv;
        re[k] = cr * p->wr[k] - ci * p->wi[k];
        im[k] = cr * p->wi[k] + ci * p->wr[k];
    }
}

/* ------------------------------------------------------------------------------------------ */
/* DFT                                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct dft_geom {
    int axis;
    int64_t outer, lin, inner, comp; /* input: outer x lin x inner x comp (1 real, 2 complex) */
    int64_t n, lout;                  /* transform length, output length along the axis */
    bool inverse, onesided;
} dft_geom;

static int dft_prepare(mts_kctx *k, dft_geom *g)
{
    const mts_tensor *x;
    const mts_node *nd = k->node;
    int rc = check_arity(k, 1, 2);
    if (!rc) rc = check_in(k, 0, M_F32, &x);
    if (rc) return rc;
    if (x->rank < 3 || (x->dims[x->rank - 1] != 1 && x->dims[x->rank - 1] != 2)) {
        char s[96];
        return mts_err_set(k->err, MTS_ESHAPE, "input must be [batch, n1, ..., 1 or 2] of rank >= 3, got %s",
                           mts_shape_str(x, s, sizeof s));
    }
    int64_t axis = mts_attr_int(nd, "axis", 1), a = axis < 0 ? axis + x->rank : axis;
    if (a < 1 || a > x->rank - 2)
        return mts_err_set(k->err, MTS_EINVAL, "axis %lld must name a signal dimension (1 to %d)", (long long)axis,
                           x->rank - 2);
    g->axis = (int)a;
    g->inverse = mts_attr_int(nd, "inverse", 0) != 0;
    g->onesided = mts_attr_int(nd, "onesided", 0) != 0;
    if (g->inverse && g->onesided)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "inverse=1 with onesided=1 (inverse of a one-sided DFT) is not supported");
    g->comp = x->dims[x->rank - 1];
    if (g->onesided && g->comp == 2)
        return mts_err_set(k->err, MTS_EINVAL, "onesided=1 needs a real input (last dimension 1)");
    g->outer = 1;
    g->inner = 1;
    for (int i = 0; i < x->rank - 1; i++) {
        if (i < g->axis) g->outer *= x->dims[i];
        else if (i > g->axis) g->inner *= x->dims[i];
    }
    g->lin = x->dims[g->axis];
    g->n = g->lin;
    if (mts_kin(k, 1)) {
        if ((rc = scalar_int(k, 1, "dft_length", &g->n))) return rc;
        if (g->n < 1 || g->n > SIG_MAX_LEN)
            return mts_err_set(k->err, MTS_EINVAL, "dft_length %lld is out of range [1, %lld]", (long long)g->n,
                               (long long)SIG_MAX_LEN);
    }
    g->lout = g->onesided ? g->n / 2 + 1 : g->n;
    return MTS_OK;
}

static int dft_infer(mts_kctx *k)
{
    dft_geom g;
    int rc = dft_prepare(k, &g);
    if (rc) return rc;
    const mts_tensor *x = k->in[0];
    int64_t d[MTS_MAX_RANK];
    for (int i = 0; i < x->rank; i++) d[i] = x->dims[i];
    d[g.axis] = g.lout;
    d[x->rank - 1] = 2;
    set_out(k, 0, MTS_DTYPE_FLOAT, x->rank, d);
    return MTS_OK;
}

typedef struct dft_ctx {
    const dft_geom *g;
    const fft_plan *plan;
    const float *x;
    float *y;
    int failed;
} dft_ctx;

static void dft_part(void *ctx, int ithr, int nthr)
{
    dft_ctx *c = ctx;
    const dft_geom *g = c->g;
    int64_t lines = g->outer * g->inner, lo, hi;
    part_range(lines, ithr, nthr, &lo, &hi);
    if (lo >= hi) return;
    int64_t n = g->n;
    double *buf = malloc((size_t)(2 * n + fft_scratch(c->plan)) * sizeof(double));
    if (!buf) {
        c->failed = 1;
        return;
    }
    double *re = buf, *im = buf + n, *work = buf + 2 * n;
    double scale = g->inverse ? 1.0 / (double)n : 1.0;
    int64_t take = g->lin < n ? g->lin : n;
    for (int64_t l = lo; l < hi; l++) {
        int64_t o = l / g->inner, i = l % g->inner;
        const float *xp = c->x + (o * g->lin * g->inner + i) * g->comp;
        for (int64_t j = 0; j < take; j++) {
            re[j] = xp[j * g->inner * g->comp];
            im[j] = g->comp == 2 ? xp[j * g->inner * g->comp + 1] : 0.0;
        }
        for (int64_t j = take; j < n; j++) re[j] = im[j] = 0.0;
        fft_run(c->plan, re, im, work);
        float *yp = c->y + (o * g->lout * g->inner + i) * 2;
        for (int64_t j = 0; j < g->lout; j++) {
            yp[j * g->inner * 2] = (float)(re[j] * scale);
            yp[j * g->inner * 2 + 1] = (float)(im[j] * scale);
        }
    }
    free(buf);
}

static int dft_run(mts_kctx *k)
{
    dft_geom g;
    int rc = dft_prepare(k, &g);
    if (rc) return rc;
    if (numel(&k->out[0]) == 0) return MTS_OK;
    fft_plan plan;
    if ((rc = fft_plan_init(&plan, g.n, g.inverse ? 1 : -1, k->err))) return rc;
    dft_ctx c = {&g, &plan, k->in[0]->data, k->out[0].data, 0};
    int64_t lines = g.outer * g.inner;
    int thr = par_threads(k, lines * g.n * 8);
    if (thr > lines) thr = (int)lines;
    mts_parallel(thr, dft_part, &c);
    fft_plan_free(&plan);
    if (c.failed) return mts_err_set(k->err, MTS_ENOMEM, "out of memory for DFT work buffers");
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* STFT                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct stft_geom {
    int64_t batch, len, comp, step, fl, frames, bins;
    const float *window;
} stft_geom;

static int stft_prepare(mts_kctx *k, stft_geom *g)
{
    const mts_tensor *x, *w = mts_kin(k, 2);
    int rc = check_arity(k, 2, 4);
    if (!rc) rc = check_in(k, 0, M_F32, &x);
    if (rc) return rc;
    if (x->rank != 3 || (x->dims[2] != 1 && x->dims[2] != 2)) {
        char s[96];
        return mts_err_set(k->err, MTS_ESHAPE, "signal must be [batch, length, 1 or 2], got %s",
                           mts_shape_str(x, s, sizeof s));
    }
    g->batch = x->dims[0];
    g->len = x->dims[1];
    g->comp = x->dims[2];
    bool onesided = mts_attr_int(k->node, "onesided", 1) != 0;
    if (onesided && g->comp == 2)
        return mts_err_set(k->err, MTS_EINVAL, "onesided=1 needs a real signal (last dimension 1)");
    g->fl = -1;
    g->window = NULL;
    if (w) {
        if ((rc = check_t(k, w, 2, M_F32))) return rc;
        if (w->rank != 1) return mts_err_set(k->err, MTS_ESHAPE, "window must be 1-D, got rank %d", w->rank);
        g->fl = w->dims[0];
        g->window = w->data;
    }
    if (mts_kin(k, 3)) {
        int64_t fl = 0;
        if ((rc = scalar_int(k, 3, "frame_length", &fl))) return rc;
        if (g->fl >= 0 && fl != g->fl)
            return mts_err_set(k->err, MTS_EINVAL, "frame_length %lld differs from the window length %lld",
                               (long long)fl, (long long)g->fl);
        g->fl = fl;
    }
    if (g->fl < 0) return mts_err_set(k->err, MTS_EINVAL, "either window or frame_length must be given");
    if ((rc = scalar_int(k, 1, "frame_step", &g->step))) return rc;
    if (g->step < 1) return mts_err_set(k->err, MTS_EINVAL, "frame_step must be >= 1, got %lld", (long long)g->step);
    if (g->fl < 1 || g->fl > g->len || g->fl > SIG_MAX_LEN)
        return mts_err_set(k->err, MTS_EINVAL, "frame length %lld must be in [1, signal length %lld] and at most %lld",
                           (long long)g->fl, (long long)g->len, (long long)SIG_MAX_LEN);
    g->frames = 1 + (g->len - g->fl) / g->step;
    g->bins = onesided ? g->fl / 2 + 1 : g->fl;
    return MTS_OK;
}

static int stft_infer(mts_kctx *k)
{
    stft_geom g;
    int rc = stft_prepare(k, &g);
    if (rc) return rc;
    int64_t d[4] = {g.batch, g.frames, g.bins, 2};
    set_out(k, 0, MTS_DTYPE_FLOAT, 4, d);
    return MTS_OK;
}

typedef struct stft_ctx {
    const stft_geom *g;
    const fft_plan *plan;
    const float *x;
    float *y;
    int failed;
} stft_ctx;

static void stft_part(void *ctx, int ithr, int nthr)
{
    stft_ctx *c = ctx;
    const stft_geom *g = c->g;
    int64_t lo, hi, n = g->fl;
    part_range(g->batch * g->frames, ithr, nthr, &lo, &hi);
    if (lo >= hi) return;
    double *buf = malloc((size_t)(2 * n + fft_scratch(c->plan)) * sizeof(double));
    if (!buf) {
        c->failed = 1;
        return;
    }
    double *re = buf, *im = buf + n, *work = buf + 2 * n;
    for (int64_t l = lo; l < hi; l++) {
        int64_t b = l / g->frames, f = l % g->frames;
        const float *xp = c->x + (b * g->len + f * g->step) * g->comp;
        for (int64_t j = 0; j < n; j++) {
            double w = g->window ? g->window[j] : 1.0;
            re[j] = xp[j * g->comp] * w;
            im[j] = g->comp == 2 ? xp[j * g->comp + 1] * w : 0.0;
        }
        fft_run(c->plan, re, im, work);
        float *yp = c->y + l * g->bins * 2;
        for (int64_t j = 0; j < g->bins; j++) {
            yp[2 * j] = (float)re[j];
            yp[2 * j + 1] = (float)im[j];
        }
    }
    free(buf);
}

static int stft_run(mts_kctx *k)
{
    stft_geom g;
    int rc = stft_prepare(k, &g);
    if (rc) return rc;
    if (numel(&k->out[0]) == 0) return MTS_OK;
    fft_plan plan;
    if ((rc = fft_plan_init(&plan, g.fl, -1, k->err))) return rc;
    stft_ctx c = {&g, &plan, k->in[0]->data, k->out[0].data, 0};
    int64_t lines = g.batch * g.frames;
    int thr = par_threads(k, lines * g.fl * 8);
    if (thr > lines) thr = (int)lines;
    mts_parallel(thr, stft_part, &c);
    fft_plan_free(&plan);
    if (c.failed) return mts_err_set(k->err, MTS_ENOMEM, "out of memory for STFT work buffers");
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Window functions                                                                           */
/* ------------------------------------------------------------------------------------------ */

enum win_kind { W_HANN, W_HAMMING, W_BLACKMAN };

static int out_dtype_attr(mts_kctx *k, const char *name, mts_dtype dflt, mts_dtype *out)
{
    int64_t t = mts_attr_int(k->node, name, dflt);
    if (t <= 0 || t > 16) return mts_err_set(k->err, MTS_EINVAL, "attribute %s (%lld) is not an element type", name, (long long)t);
    if (!numeric_out_ok((mts_dtype)t))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "output type %s is not supported", mts_dtype_name((mts_dtype)t));
    *out = (mts_dtype)t;
    return MTS_OK;
}

static int win_prepare(mts_kctx *k, int64_t *size, mts_dtype *dt)
{
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = out_dtype_attr(k, "output_datatype", MTS_DTYPE_FLOAT, dt);
    if (!rc) rc = scalar_int(k, 0, "size", size);
    if (rc) return rc;
    if (*size < 0 || *size > SIG_MAX_LEN)
        return mts_err_set(k->err, MTS_EINVAL, "window size %lld is out of range [0, %lld]", (long long)*size,
                           (long long)SIG_MAX_LEN);
    return MTS_OK;
}

static int win_infer(mts_kctx *k)
{
    int64_t size;
    mts_dtype dt;
    int rc = win_prepare(k, &size, &dt);
    if (rc) return rc;
    set_out(k, 0, dt, 1, &size);
    return MTS_OK;
}

static int win_run(mts_kctx *k, int kind)
{
    int64_t size;
    mts_dtype dt;
    int rc = win_prepare(k, &size, &dt);
    if (rc) return rc;
    bool periodic = mts_attr_int(k->node, "periodic", 1) != 0;
    double N = periodic ? (double)size : (double)(size - 1);
    for (int64_t i = 0; i < size; i++) {
        double t = N > 0 ? 2.0 * M_PI * (double)i / N : 0.0, v;
        switch (kind) {
        case W_HANN: v = 0.5 - 0.5 * cos(t); break;
        case W_HAMMING: v = 25.0 / 46.0 - (21.0 / 46.0) * cos(t); break;
        default: v = 0.42 - 0.5 * cos(t) + 0.08 * cos(2.0 * t); break;
        }
        if (N <= 0) v = 1.0; /* a symmetric window of one point */
        st_f(k->out[0].data, dt, i, v);
    }
    return MTS_OK;
}

static int hann_run(mts_kctx *k) { return win_run(k, W_HANN); }
static int hamming_run(mts_kctx *k) { return win_run(k, W_HAMMING); }
static int blackman_run(mts_kctx *k) { return win_run(k, W_BLACKMAN); }

/* ------------------------------------------------------------------------------------------ */
/* MelWeightMatrix                                                                            */
/* ------------------------------------------------------------------------------------------ */

typedef struct mel_args {
    int64_t mels, dft, rate;
    double lo_hz, hi_hz;
    mts_dtype dt;
} mel_args;

static int mel_prepare(mts_kctx *k, mel_args *a)
{
    int rc = check_arity(k, 5, 5);
    if (!rc) rc = out_dtype_attr(k, "output_datatype", MTS_DTYPE_FLOAT, &a->dt);
    if (!rc) rc = scalar_int(k, 0, "num_mel_bins", &a->mels);
    if (!rc) rc = scalar_int(k, 1, "dft_length", &a->dft);
    if (!rc) rc = scalar_int(k, 2, "sample_rate", &a->rate);
    if (rc) return rc;
    if (a->mels < 1 || a->mels > SIG_MAX_LEN || a->dft < 1 || a->dft > SIG_MAX_LEN || a->rate < 1)
        return mts_err_set(k->err, MTS_EINVAL, "num_mel_bins (%lld), dft_length (%lld) and sample_rate (%lld) must "
                           "be positive (lengths at most %lld)", (long long)a->mels, (long long)a->dft,
                           (long long)a->rate, (long long)SIG_MAX_LEN);
    if ((a->dft / 2 + 1) * a->mels > SIG_MAX_LEN * 4)
        return mts_err_set(k->err, MTS_EINVAL, "a %lld x %lld mel weight matrix is too large",
                           (long long)(a->dft / 2 + 1), (long long)a->mels);
    if ((rc = scalar_float(k, 3, "lower_edge_hertz", &a->lo_hz)) || (rc = scalar_float(k, 4, "upper_edge_hertz", &a->hi_hz)))
        return rc;
    if (!isfinite(a->lo_hz) || !isfinite(a->hi_hz) || a->lo_hz < 0 || a->hi_hz < a->lo_hz)
        return mts_err_set(k->err, MTS_EINVAL, "edge frequencies must satisfy 0 <= lower (%g) <= upper (%g)", a->lo_hz,
                           a->hi_hz);
    return MTS_OK;
}

static int mel_infer(mts_kctx *k)
{
    mel_args a;
    int rc = mel_prepare(k, &a);
    if (rc) return rc;
    int64_t d[2] = {a.dft / 2 + 1, a.mels};
    set_out(k, 0, a.dt, 2, d);
    return MTS_OK;
}

/* Triangular filters between mel-spaced points, as the ONNX reference computes them: the
 * mel range is split into num_mel_bins + 2 steps and each point is mapped to the DFT bin
 * floor((dft_length + 1) * hz / sample_rate). */
static int mel_run(mts_kctx *k)
{
    mel_args a;
    int rc = mel_prepare(k, &a);
    if (rc) return rc;
    int64_t nsb = a.dft / 2 + 1, M = a.mels;
    int64_t *bin = malloc((size_t)(M + 2) * sizeof(int64_t));
    double *w = calloc((size_t)(nsb * M), sizeof(double));
    if (!bin || !w) {
        free(bin);
        free(w);
        return mts_err_set(k->err, MTS_ENOMEM, "out of memory for the mel weight matrix");
    }
    float lo_mel = 2595.0f * log10f(1.0f + (float)a.lo_hz / 700.0f);
    float hi_mel = 2595.0f * log10f(1.0f + (float)a.hi_hz / 700.0f);
    float step = (hi_mel - lo_mel) / (float)(M + 2);
    for (int64_t i = 0; i < M + 2; i++) {
        double mel = (double)i * (double)step + (double)lo_mel;
        double hz = 700.0 * (pow(10.0, mel / 2595.0) - 1.0);
        bin[i] = f2i64(floor((double)(a.dft + 1) * hz / (double)a.rate));
    }
#define MEL_SET(J, I, V)                                                                      \
    do {                                                                                      \
        if ((J) >= 0 && (J) < nsb) w[(J) * M + (I)] = (V);                                    \
    } while (0)
    for (int64_t i = 0; i < M; i++) {
        int64_t l = bin[i], c = bin[i + 1], h = bin[i + 2];
        if (c == l) {
            MEL_SET(c, i, 1.0);
        } else {
            int64_t j0 = l < 0 ? 0 : l, j1 = c > nsb - 1 ? nsb - 1 : c;
            for (int64_t j = j0; j <= j1; j++) MEL_SET(j, i, (double)(j - l) / (double)(c - l));
        }
        if (h > c) {
            int64_t j0 = c < 0 ? 0 : c, j1 = h - 1 > nsb - 1 ? nsb - 1 : h - 1;
            for (int64_t j = j0; j <= j1; j++) MEL_SET(j, i, (double)(h - j) / (double)(h - c));
        }
    }
#undef MEL_SET
    for (int64_t i = 0; i < nsb * M; i++) st_f(k->out[0].data, a.dt, i, w[i]);
    free(bin);
    free(w);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The op table                                                                               */
/* ------------------------------------------------------------------------------------------ */

const mts_op mts_ref_ops_signal[] = {
    {"DFT", dft_infer, dft_run},
    {"STFT", stft_infer, stft_run},
    {"HannWindow", win_infer, hann_run},
    {"HammingWindow", win_infer, hamming_run},
    {"BlackmanWindow", win_infer, blackman_run},
    {"MelWeightMatrix", mel_infer, mel_run},
    {NULL, NULL, NULL},
};
