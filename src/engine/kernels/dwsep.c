/*
 * A depthwise-separable block in one pass: a depthwise 3x3 convolution (stride 1, padding 1,
 * with its Relu / LeakyRelu / Clip) and the 1x1 convolution that alone reads it (with its own
 * activations, scalar affine steps and residual Adds), on channels-last tensors, row by row. The
 * depthwise output lives only in a row buffer, so the pair reads its source and writes its
 * destination once: in the lip-sync UNets' full-resolution encoder block (8 channels at 320 x
 * 320) oneDNN's two steps spent most of their time moving the tensor between them, with 8 of a
 * vector's 16 lanes idle.
 *
 * Per output row (image n, row y) a thread keeps the source rows y-1, y, y+1 as padded float
 * rows (a ring of three: one new row per output row, a zero row outside the image), widened
 * from bf16 or rounded to bf16 as the step's precision asks. The depthwise pass runs over the
 * flat row (W*C floats, 16 at a time): the taps' weights repeat with period lcm(16, C), so each
 * tap is one load of the shifted row and one multiply-add. The pointwise pass takes 8 pixels
 * (4 when more than 16 output channels) at a time: each depthwise value, broadcast, times the
 * weight row of its channel. Then the post-ops, and the store as float or bf16.
 *
 * bf16 plans: the step computes in float (float weights, the depthwise output kept float), reads
 * a bf16 source where its producer hands one on, and writes bf16 for bf16 readers. A source
 * that a bf16 hand-off would give it but that comes as float (hand-offs off) is rounded to
 * bf16 as it is read (spec.src_round), so the results do not depend on the hand-offs.
 *
 * GCC vector extensions (16 floats) with AVX-512 / AVX2 clones chosen at load, as in fast.c;
 * rows are split over the context's threads with mts_parallel.
 */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <stdlib.h>
#include <string.h>

#include "engine/kernels/dpost16.h"
#include "engine/kernels/dwsep.h"
#include "engine/kernels/vec16.h"

#define MTS_DWSEP_BF16_MAX_CM 512

typedef float v8f __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) v8f ld8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void st8(float *p, v8f v)
{
    memcpy(p, &v, sizeof v);
}

struct mts_dwsep {
    int64_t N, H, W, C, M, L; /* L = lcm(16, C): the period of the depthwise weight patterns */
    float *wpat;              /* [9][L + 64]: tap t's weight of channel (j mod C) at j */
    float *bpat;              /* [L + 64] */
    float *wp;                /* [C][M]: the pointwise weights of input channel c */
    float *bp;                /* [M] */
    mts_dpost dpost[MTS_DPOST_MAX], ppost[MTS_DPOST_MAX];
    int n_dpost, n_ppost;
    bool rnd;                 /* round a float source to bf16 as it is read (spec.src_round) */
    bool src_bf16, dst_bf16;
    size_t row_f;             /* floats per padded source row */
    size_t t_f, o_f;          /* floats of the depthwise and pointwise row buffers */
    size_t per_thread;        /* scratch bytes per thread */
};

bool mts_dconv_dwsep_ok(const mts_dconv_spec *dw, const mts_dconv_spec *pw)
{
    const mts_conv_geom *a = &dw->g, *b = &pw->g;
    if (dw->kind != MTS_DPRIM_CONV || pw->kind != MTS_DPRIM_CONV || dw->q8 || pw->q8 || dw->transpose ||
        pw->transpose || dw->wino || pw->wino || dw->up[0] * dw->up[1] > 1 || pw->up[0] * pw->up[1] > 1 ||
        dw->pw_M || pw->pw_M || !dw->w || !pw->w || a->nsp != 2 || b->nsp != 2)
        return false;
    if (a->group != a->C || a->M != a->C || a->C % 8 || a->C < 8 || a->C > 64) return false;
    if (b->group != 1 || b->C != a->C || b->M % 8 || b->M < 8 || b->M > 64 || b->N != a->N) return false;
    /* bf16 plans: only while the pointwise product is small (C x M <= 512), where the pair is
     * bound by moving the tensors; beyond it oneDNN's bf16 1x1 convolution (twice the
     * multiply-adds per instruction of the pair's float one) wins (lip-sync w8 and w16, the
     * 32- and 64-channel blocks: 1.75 ms unpaired against 2.2 ms paired, Zen 5). */
    if (dw->bf16 && a->C * b->M > MTS_DWSEP_BF16_MAX_CM) return false;
    for (int i = 1; i < 3; i++) {
        if (a->k[i] != 3 || a->s[i] != 1 || a->d[i] != 1 || a->pb[i] != 1 || a->pe[i] != 1 || a->out[i] != a->in[i])
            return false;
        if (b->k[i] != 1 || b->s[i] != 1 || b->pb[i] != 0 || b->pe[i] != 0 || b->in[i] != a->out[i] ||
            b->out[i] != b->in[i])
            return false;
    }
    if (dw->n_post > 2 || dw->n_post + pw->n_post > MTS_DPOST_MAX) return false;
    for (int i = 0; i < dw->n_post; i++)
        if (dw->post[i].kind != MTS_DPOST_RELU && dw->post[i].kind != MTS_DPOST_CLIP) return false;
    for (int i = 0; i < pw->n_post; i++) {
        int k = pw->post[i].kind;
        if (k != MTS_DPOST_RELU && k != MTS_DPOST_CLIP && k != MTS_DPOST_LINEAR && k != MTS_DPOST_ADD) return false;
    }
    return true;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

int mts_dwsep_create(const mts_dconv_spec *s, mts_dwsep **out, mts_err *err)
{
    const mts_conv_geom *g = &s->g;
    int64_t C = g->C, M = s->pw_M, L = 16 / gcd64(16, C) * C;
    mts_dwsep *k = calloc(1, sizeof *k);
    if (!k) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    k->wpat = malloc(sizeof(float) * (size_t)(10 * (L + 64)));
    k->wp = malloc(sizeof(float) * (size_t)(C * M + M));
    if (!k->wpat || !k->wp) {
        mts_dwsep_free(k);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    k->bpat = k->wpat + 9 * (L + 64);
    k->bp = k->wp + C * M;
    k->N = g->N, k->H = g->in[1], k->W = g->in[2], k->C = C, k->M = M, k->L = L;
    k->rnd = s->src_round && !s->src_bf16;
    k->src_bf16 = s->src_bf16;
    k->dst_bf16 = s->dst_bf16;
    for (int64_t j = 0; j < L + 64; j++) { /* L + 64: four vectors from any offset below L */
        int64_t c = j % C;
        for (int t = 0; t < 9; t++) k->wpat[t * (L + 64) + j] = s->w[c * 9 + t];
        k->bpat[j] = s->b ? s->b[c] : 0.0f;
    }
    for (int64_t c = 0; c < C; c++)
        for (int64_t m = 0; m < M; m++) k->wp[c * M + m] = s->pw_w[m * C + c];
    for (int64_t m = 0; m < M; m++) k->bp[m] = s->pw_b ? s->pw_b[m] : 0.0f;
    k->n_dpost = s->n_dw_post;
    k->n_ppost = s->n_post - s->n_dw_post;
    memcpy(k->dpost, s->post, sizeof(mts_dpost) * (size_t)k->n_dpost);
    memcpy(k->ppost, s->post + k->n_dpost, sizeof(mts_dpost) * (size_t)k->n_ppost);
    /* A padded row: C zeros, W*C values, C zeros and room for the last vector's overrun. */
    k->row_f = (size_t)((k->W + 2) * C + 32);
    k->t_f = (size_t)(k->W * C + 32);
    k->o_f = (size_t)(k->W * M + 32);
    k->per_thread = ((4 * k->row_f + k->t_f + k->o_f) * sizeof(float) + 63) / 64 * 64;
    *out = k;
    return MTS_OK;
}

void mts_dwsep_free(mts_dwsep *k)
{
    if (!k) return;
    free(k->wpat);
    free(k->wp);
    free(k);
}

const char *mts_dwsep_impl(const mts_dwsep *k)
{
    (void)k;
    return "mts:dw3x3+pw1x1";
}

/* Threads worth using: the oneDNN steps' rule (mts_dconv_threads_for), at most one per row. */
static int dws_threads(const mts_dwsep *k, int threads)
{
    int n = mts_dconv_threads_for((double)(k->N * k->H * k->W) * (double)(9 * k->C + k->C * k->M), threads);
    int64_t rows = k->N * k->H;
    return n > rows ? (rows < 1 ? 1 : (int)rows) : n;
}

size_t mts_dwsep_scratch(const mts_dwsep *k, int threads)
{
    return (size_t)dws_threads(k, threads) * k->per_thread;
}

/* Source row (n, y) into the data part of a padded row: widened from bf16, rounded to bf16
 * (k->rnd: the value a bf16 convolution reads, mts_f32_to_bf16), or copied. */
static MTS_VEC_CLONES void fill_row(const mts_dwsep *k, const void *src, int64_t n, int64_t y, float *row)
{
    int64_t cnt = k->W * k->C, off = (n * k->H + y) * cnt;
    float *d = row + k->C;
    if (k->src_bf16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < cnt; i++) {
            uint32_t u = (uint32_t)s[i] << 16;
            memcpy(d + i, &u, sizeof u);
        }
    } else if (k->rnd) {
        const float *s = (const float *)src + off;
        for (int64_t i = 0; i < cnt; i++) {
            uint32_t u = (uint32_t)mts_f32_to_bf16(s[i]) << 16;
            memcpy(d + i, &u, sizeof u);
        }
    } else {
        memcpy(d, (const float *)src + off, sizeof(float) * (size_t)cnt);
    }
}

/* One vector of the depthwise pass: the 9 taps at flat index i of the rows r0..r2, weights at
 * pattern offset v (w: [9][L + 64]). */
static inline __attribute__((always_inline)) v16f dw_vec(const float *r0, const float *r1, const float *r2,
                                                         const float *w, const float *bias, int64_t C,
                                                         int64_t WL, int64_t i, int64_t v)
{
    v16f a0 = ld16(bias + v), a1, a2;
    a0 += ld16(r0 + i) * ld16(w + 0 * WL + v);
    a1 = ld16(r0 + i + C) * ld16(w + 1 * WL + v);
    a2 = ld16(r0 + i + 2 * C) * ld16(w + 2 * WL + v);
    a0 += ld16(r1 + i) * ld16(w + 3 * WL + v);
    a1 += ld16(r1 + i + C) * ld16(w + 4 * WL + v);
    a2 += ld16(r1 + i + 2 * C) * ld16(w + 5 * WL + v);
    a0 += ld16(r2 + i) * ld16(w + 6 * WL + v);
    a1 += ld16(r2 + i + C) * ld16(w + 7 * WL + v);
    a2 += ld16(r2 + i + 2 * C) * ld16(w + 8 * WL + v);
    return a0 + a1 + a2;
}

/* The depthwise pass over one output row: t[x*C + c] from the padded rows r0..r2 (source rows
 * y-1, y, y+1), four vectors at a time (independent chains of multiply-adds). Writes up to 15
 * floats past W*C (t's slack). */
static MTS_VEC_CLONES void dw_row(const mts_dwsep *k, const float *r0, const float *r1, const float *r2, float *t)
{
    const int64_t C = k->C, L = k->L, WL = L + 64, n = k->W * C;
    const float *w = k->wpat, *bias = k->bpat;
    const int np = k->n_dpost;
    mts_dpost post[2];
    for (int j = 0; j < np; j++) post[j] = k->dpost[j];
    int64_t v = 0, i = 0;
    if (L == 16) { /* 8 or 16 channels: the nine tap vectors stay in registers */
        v16f wt[9], b0 = ld16(bias);
        for (int q = 0; q < 9; q++) wt[q] = ld16(w + q * WL);
        for (; i + 32 <= n; i += 32) {
            v16f y0 = b0 + ld16(r0 + i) * wt[0], y1 = b0 + ld16(r0 + i + 16) * wt[0];
            v16f z0 = ld16(r0 + i + C) * wt[1], z1 = ld16(r0 + i + 16 + C) * wt[1];
            y0 += ld16(r0 + i + 2 * C) * wt[2], y1 += ld16(r0 + i + 16 + 2 * C) * wt[2];
            z0 += ld16(r1 + i) * wt[3], z1 += ld16(r1 + i + 16) * wt[3];
            y0 += ld16(r1 + i + C) * wt[4], y1 += ld16(r1 + i + 16 + C) * wt[4];
            z0 += ld16(r1 + i + 2 * C) * wt[5], z1 += ld16(r1 + i + 16 + 2 * C) * wt[5];
            y0 += ld16(r2 + i) * wt[6], y1 += ld16(r2 + i + 16) * wt[6];
            z0 += ld16(r2 + i + C) * wt[7], z1 += ld16(r2 + i + 16 + C) * wt[7];
            y0 += ld16(r2 + i + 2 * C) * wt[8], y1 += ld16(r2 + i + 16 + 2 * C) * wt[8];
            y0 += z0, y1 += z1;
            for (int j = 0; j < np; j++) y0 = post16(y0, &post[j]), y1 = post16(y1, &post[j]);
            st16(t + i, y0);
            st16(t + i + 16, y1);
        }
    }
    for (; i + 64 <= n; i += 64) {
        v16f y[4];
        for (int q = 0; q < 4; q++) y[q] = dw_vec(r0, r1, r2, w, bias, C, WL, i + 16 * q, v + 16 * q);
        for (int q = 0; q < 4; q++) {
            for (int j = 0; j < np; j++) y[q] = post16(y[q], &post[j]);
            st16(t + i + 16 * q, y[q]);
        }
        v = (v + 64) % L;
    }
    for (; i < n; i += 16) {
        v16f y = dw_vec(r0, r1, r2, w, bias, C, WL, i, v);
        for (int j = 0; j < np; j++) y = post16(y, &post[j]);
        st16(t + i, y);
        v = (v + 16) % L;
    }
}

/* PX pixels from x0 of the pointwise pass: o[x*M + m] = bp[m] + sum_c t[x*C + c] wp[c*M + m],
 * M = 16*MB + 8*H8. Constant PX, MB, H8 (inlined per case) keep the accumulators in registers. */
static inline __attribute__((always_inline)) void pw_block(const mts_dwsep *k, const float *t, float *o, int64_t x0,
                                                           const int PX, const int MB, const int H8)
{
    const int64_t C = k->C, M = k->M;
    v16f acc[8][4];
    v8f acc8[8];
    for (int p = 0; p < PX; p++) {
        for (int b = 0; b < MB; b++) acc[p][b] = ld16(k->bp + 16 * b);
        if (H8) acc8[p] = ld8(k->bp + 16 * MB);
    }
    const float *tx = t + x0 * C;
    for (int64_t c = 0; c < C; c++) {
        const float *wc = k->wp + c * M;
        v16f w[4];
        v8f w8 = {0};
        for (int b = 0; b < MB; b++) w[b] = ld16(wc + 16 * b);
        if (H8) w8 = ld8(wc + 16 * MB);
        for (int p = 0; p < PX; p++) {
            float s = tx[p * C + c];
            for (int b = 0; b < MB; b++) acc[p][b] += s * w[b];
            if (H8) acc8[p] += s * w8;
        }
    }
    for (int p = 0; p < PX; p++) {
        float *op = o + (x0 + p) * M;
        for (int b = 0; b < MB; b++) st16(op + 16 * b, acc[p][b]);
        if (H8) st8(op + 16 * MB, acc8[p]);
    }
}

static inline __attribute__((always_inline)) void pw_case(const mts_dwsep *k, const float *t, float *o, const int PX,
                                                          const int MB, const int H8)
{
    int64_t x = 0;
    for (; x + PX <= k->W; x += PX) pw_block(k, t, o, x, PX, MB, H8);
    for (; x < k->W; x++) pw_block(k, t, o, x, 1, MB, H8);
}

static MTS_VEC_CLONES void pw_row(const mts_dwsep *k, const float *t, float *o)
{
    switch (k->M) {
    case 8: pw_case(k, t, o, 8, 0, 1); break;
    case 16: pw_case(k, t, o, 8, 1, 0); break;
    case 24: pw_case(k, t, o, 4, 1, 1); break;
    case 32: pw_case(k, t, o, 4, 2, 0); break;
    case 40: pw_case(k, t, o, 4, 2, 1); break;
    case 48: pw_case(k, t, o, 4, 3, 0); break;
    case 56: pw_case(k, t, o, 4, 3, 1); break;
    default: pw_case(k, t, o, 4, 4, 0); break; /* 64 (mts_dconv_dwsep_ok) */
    }
}

/* 16 floats to bf16 in a register, bit for bit as mts_f32_to_bf16 (nearest even, NaN kept
 * quiet). */
static inline __attribute__((always_inline)) v16h to_bf16(v16f x)
{
    v16u u;
    memcpy(&u, &x, sizeof u);
    v16u r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    v16u nan = (v16u)((u & 0x7fffffffu) > 0x7f800000u);
    return __builtin_convertvector((r & ~nan) | (q & nan), v16h);
}

/* The pointwise post-ops on row o (W*M floats at element offset off of the destination), then
 * the store (bf16 narrowed in registers). */
static MTS_VEC_CLONES void post_row(const mts_dwsep *k, float *o, const float *const *resid, int64_t off, void *dst)
{
    const int64_t n = k->W * k->M;
    const bool bf = k->dst_bf16;
    float *df = bf ? o : (float *)dst + off;
    uint16_t *dh = (uint16_t *)dst + off;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v16f v = ld16(o + i);
        for (int j = 0, r = 0; j < k->n_ppost; j++) {
            const mts_dpost *p = &k->ppost[j];
            if (p->kind != MTS_DPOST_ADD) {
                v = post16(v, p);
            } else if (p->bf16) {
                const uint16_t *rs = (const uint16_t *)resid[r++] + off + i;
                v16u u;
                for (int l = 0; l < 16; l++) u[l] = (uint32_t)rs[l] << 16;
                v16f f;
                memcpy(&f, &u, sizeof f);
                v += f;
            } else {
                v += ld16(resid[r++] + off + i);
            }
        }
        if (bf) {
            v16h h = to_bf16(v);
            memcpy(dh + i, &h, sizeof h);
        } else {
            st16(df + i, v);
        }
    }
    int64_t tail = i;
    for (; i < n; i++) {
        float v = o[i];
        for (int j = 0, r = 0; j < k->n_ppost; j++) {
            const mts_dpost *p = &k->ppost[j];
            if (p->kind != MTS_DPOST_ADD) v = post1(v, p);
            else if (p->bf16) v += mts_bf16_to_f32(((const uint16_t *)resid[r++])[off + i]);
            else v += resid[r++][off + i];
        }
        df[i] = v;
    }
    if (bf && tail < n) mts_f32_to_bf16_n(o + tail, dh + tail, n - tail);
}

typedef struct dws_job {
    const mts_dwsep *k;
    const void *src;
    void *dst;
    const float *const *resid;
    char *scratch;
} dws_job;

static void dws_part(void *arg, int ithr, int nthr)
{
    const dws_job *j = arg;
    const mts_dwsep *k = j->k;
    int64_t rows = k->N * k->H, lo = rows * ithr / nthr, hi = rows * (ithr + 1) / nthr;
    float *ring = (float *)(j->scratch + (size_t)ithr * k->per_thread), *zero = ring + 3 * k->row_f;
    float *t = zero + k->row_f, *o = t + k->t_f;
    memset(ring, 0, sizeof(float) * 4 * k->row_f); /* the padding columns and the zero row */
    int64_t have_n = -1, have_y = -2;
    for (int64_t r = lo; r < hi; r++) {
        int64_t n = r / k->H, y = r % k->H;
        /* ring slot (yy + 3) % 3 holds source row yy while yy is one of y-1, y, y+1 */
        for (int64_t yy = y - 1; yy <= y + 1; yy++) {
            bool held = n == have_n && yy >= have_y - 1 && yy <= have_y + 1;
            if (yy >= 0 && yy < k->H && !held) fill_row(k, j->src, n, yy, ring + (size_t)((yy + 3) % 3) * k->row_f);
        }
        have_n = n, have_y = y;
        const float *rp[3];
        for (int d = 0; d < 3; d++) {
            int64_t yy = y - 1 + d;
            rp[d] = yy < 0 || yy >= k->H ? zero : ring + (size_t)((yy + 3) % 3) * k->row_f;
        }
        dw_row(k, rp[0], rp[1], rp[2], t);
        pw_row(k, t, o);
        post_row(k, o, j->resid, r * k->W * k->M, j->dst);
    }
}

void mts_dwsep_run(const mts_dwsep *k, int threads, const void *src, void *dst, const float *const *resid,
                   void *scratch)
{
    dws_job j = {k, src, dst, resid, scratch};
    mts_parallel(dws_threads(k, threads), dws_part, &j);
}
