/*
 * A bf16 3x3 convolution (stride 1, padding 1) for 8 output channels, on AVX512-BF16's pair dot
 * product (vdpbf16ps: per float lane, the sum of two bf16 products added to the lane). oneDNN's
 * bf16 kernels put output channels in the vector lanes, 16 per vector: with 8 outputs (the
 * lip-sync UNets' full-resolution layers, 16 -> 8 channels at 320 x 320) half of every
 * multiply-add is wasted. Here the lanes are 16 neighbouring pixels of one output channel.
 *
 * Per output row (image n, row y) a thread keeps the source rows y-1, y, y+1 in a ring of three
 * "pair-planar" rows: for each pair of input channels (2p, 2p+1), the row's pixels as 32-bit
 * words holding the two bf16 values, with one zero pixel before and zeros after. Source rows
 * come channels-last (bf16 or float, rounded to bf16 to nearest even as oneDNN's bf16
 * convolution rounds its source) or channels-first float; 16 channels of bf16 are transposed
 * 16 pixels at a time in registers (three rounds of two-source permutes), 8 channels with two
 * permutes per pair, other channels-last sources are copied word by word. A bf16 source may
 * come in two parts, a channel Concat folded into the step (a UNet decoder's upsampled branch
 * and its skip, each 8 channels at full resolution): each part fills its own pairs, so the
 * concatenated tensor is never written. Then, for 32 output
 * pixels at a time, 16 accumulators (8 channels x 2 blocks of 16 pixels) start at the bias and
 * take, for each of the 9 taps and each channel pair, one load of the shifted planar row and
 * one pair dot product per output channel with the weight pair broadcast. The accumulators are
 * transposed back to channels-last (three permute rounds; a channels-first destination takes
 * them as they are), the post-ops applied and the result stored as float or bf16 (narrowed to
 * nearest even in registers), a row's last pixels with masked loads and stores. The upsampled
 * form (conv_row_up) computes each output phase from a 2x2 window of the low-resolution rows
 * with summed taps. The next source row is prefetched while a row is computed.
 *
 * Accumulation is float, as in oneDNN's bf16 convolutions; the order of the sums differs, so
 * results agree with oneDNN's to float rounding, not bit for bit. Rows are split over the
 * context's threads with mts_parallel.
 */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kernels/bfconv.h"
#include "engine/kernels/dpost16.h"
#include "engine/kernels/kernel.h"
#include "util/tensor.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define BFC_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define BFC_M 8 /* output channels */
#endif
#define BFC_HEAD_BAND 8 /* fused head: its output rows per band of the convolution's rows */

struct mts_bfconv {
    int64_t N, H, W, C, P; /* H, W: the destination's; P: channel pairs, ceil(C / 2) */
    int64_t C2;            /* > 0: channels C - C2 .. C - 1 come from a second source (cat_C2) */
    int n_add;             /* residual post-ops (the second source follows them in resid) */
    int hM, hact;          /* > 0: the fused head's outputs (head_M) and activation */
    bool hb_set, hnhwc;
    float hw[4 * BFC_M * 9], hb[4]; /* the head's weights [hM][8][3][3] and bias */
    void *hwv;             /* ... broadcast (mts_fast_sconv_weights) */
    int64_t HPW, HPHW;     /* head band: floats per padded row (W + 2), per plane (BAND + 2 rows) */
    size_t band_floats;    /* head band: 8 planes, and 16 floats of slack */
    int64_t Hs, Ws;        /* the source's: H, W, or H / 2, W / 2 when upsampled */
    bool up;               /* the source is read through a nearest 2x upsampling */
    int64_t Wp;            /* 32-bit words per pair row of a planar source row */
    uint32_t *wt;          /* [9 taps][P][8]: the bf16 weight pairs of (2p, 2p+1) per output channel */
    uint32_t *wup;         /* up: [phase py*2+px][a*2+b][P][8]: the taps each phase sums */
    float bias[8];
    mts_dpost post[MTS_DPOST_MAX];
    int n_post;
    bool src_bf16, src_nhwc, dst_bf16, dst_nhwc;
    size_t row_w;          /* words of one planar row: P * Wp */
    size_t per_thread;     /* scratch bytes per thread: the ring of three rows and a zero row */
};

#if defined(__x86_64__)

static _Atomic int64_t g_created;

int64_t mts_bfconv_created(void)
{
    return g_created;
}

/* AVX512-BF16 with AVX-512BW/VL/DQ, and no AMX-BF16 (mts_cpu_bf16_native). */
static bool cpu_ok(void)
{
    const char *native = mts_cpu_bf16_native();
    return native && !strcmp(native, "avx512_bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

bool mts_bfconv_ok(const mts_dconv_spec *s)
{
    const mts_conv_geom *g = &s->g;
    if (!s->bf16 || s->kind != MTS_DPRIM_CONV || s->transpose || s->q8 || s->wino || s->half_weights || s->pw_M ||
        !s->w || (s->up[0] * s->up[1] > 1 && (s->up[0] != 2 || s->up[1] != 2 || g->in[1] % 2 || g->in[2] % 2)) ||
        g->nsp != 2 || g->group != 1 || g->M != BFC_M || g->C < 1 || g->C > 64 ||
        (!s->src_nhwc && s->src_bf16))
        return false;
    /* a fused head: 1-4 outputs, on the plain form, no residual (its rows never stored) */
    if (s->head_M && (s->head_M < 0 || s->head_M > 4 || !s->head_w || s->up[0] * s->up[1] > 1))
        return false;
    for (int i = 0; s->head_M && i < s->n_post; i++)
        if (s->post[i].kind == MTS_DPOST_ADD) return false;
    /* a folded Concat: two bf16 channels-last parts, each of whole channel pairs */
    if (s->cat_C2 && (s->cat_C2 < 0 || s->cat_C2 >= g->C || s->cat_C2 % 2 || (g->C - s->cat_C2) % 2 || !s->src_bf16 ||
                      !s->src_nhwc || s->up[0] * s->up[1] > 1))
        return false;
    for (int i = 1; i < 3; i++)
        if (g->k[i] != 3 || g->s[i] != 1 || g->d[i] != 1 || g->pb[i] != 1 || g->pe[i] != 1 || g->out[i] != g->in[i])
            return false;
    for (int i = 0; i < s->n_post; i++) {
        int k = s->post[i].kind;
        if (k != MTS_DPOST_RELU && k != MTS_DPOST_CLIP && k != MTS_DPOST_LINEAR && k != MTS_DPOST_ADD) return false;
        if (k == MTS_DPOST_ADD && s->post[i].nhwc != s->dst_nhwc) return false;
    }
    return !getenv("MTS_NO_BFCONV") && cpu_ok();
}

/* The sum of the 3x3 weights w[m][c][r0..r1][q0..q1] (ONNX layout, C input channels); 0 for a
 * channel past the last (the second half of an odd channel count's last pair). */
static float tap_sum(const float *w, int64_t C, int m, int64_t c, int r0, int r1, int q0, int q1)
{
    if (c >= C) return 0.0f;
    float sum = -0.0f; /* (-0 + x is x for every x: one tap is its weight, bit for bit) */
    for (int r = r0; r <= r1; r++)
        for (int q = q0; q <= q1; q++) sum += w[((m * C + c) * 3 + r) * 3 + q];
    return sum;
}

/* Two values as one word of bf16 (to nearest even), the first in the low half. */
static uint32_t bf16_pair(float lo, float hi)
{
    return mts_f32_to_bf16(lo) | (uint32_t)mts_f32_to_bf16(hi) << 16;
}

int mts_bfconv_create(const mts_dconv_spec *s, mts_bfconv **out, mts_err *err)
{
    const mts_conv_geom *g = &s->g;
    mts_bfconv *k = calloc(1, sizeof *k);
    if (!k) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    k->N = g->N, k->H = g->in[1], k->W = g->in[2], k->C = g->C, k->P = (g->C + 1) / 2;
    k->up = s->up[0] * s->up[1] > 1;
    k->Hs = k->up ? k->H / 2 : k->H, k->Ws = k->up ? k->W / 2 : k->W;
    k->Wp = (k->Ws + 31) / 32 * 32 + 16; /* one zero pixel before, reads up to 2 past the last block */
    size_t nw = (size_t)(9 * k->P * BFC_M), nu = k->up ? (size_t)(16 * k->P * BFC_M) : 0;
    k->wt = calloc(nw + nu, sizeof(uint32_t));
    if (!k->wt) {
        free(k);
        return mts_err_set(err, MTS_ENOMEM, "out of memory");
    }
    k->wup = k->up ? k->wt + nw : NULL;
    /* the taps (of 0..2) that an upsampled phase's tap a sums: phase 0 reads pixel j - 1 with
     * tap 0 and pixel j with taps 1, 2; phase 1 pixel j with taps 0, 1 and j + 1 with tap 2 */
    static const int lo[2][2] = {{0, 1}, {0, 2}}, hi[2][2] = {{0, 2}, {1, 2}};
    for (int64_t p = 0; p < k->P; p++)
        for (int m = 0; m < BFC_M; m++) {
            const int64_t c0 = 2 * p, c1 = 2 * p + 1;
            for (int t = 0; t < 9; t++) {
                int r = t / 3, q = t % 3;
                k->wt[(t * k->P + p) * BFC_M + m] =
                    bf16_pair(tap_sum(s->w, k->C, m, c0, r, r, q, q), tap_sum(s->w, k->C, m, c1, r, r, q, q));
            }
            for (int ph = 0; k->up && ph < 4; ph++)
                for (int ab = 0; ab < 4; ab++) {
                    int py = ph / 2, px = ph % 2, a = ab / 2, b = ab % 2;
                    int r0 = lo[py][a], r1 = hi[py][a], q0 = lo[px][b], q1 = hi[px][b];
                    k->wup[((ph * 4 + ab) * k->P + p) * BFC_M + m] =
                        bf16_pair(tap_sum(s->w, k->C, m, c0, r0, r1, q0, q1), tap_sum(s->w, k->C, m, c1, r0, r1, q0, q1));
                }
        }
    for (int m = 0; m < BFC_M; m++) k->bias[m] = s->b ? s->b[m] : 0.0f;
    k->n_post = s->n_post;
    memcpy(k->post, s->post, sizeof(mts_dpost) * (size_t)s->n_post);
    k->src_bf16 = s->src_bf16, k->src_nhwc = s->src_nhwc, k->dst_bf16 = s->dst_bf16, k->dst_nhwc = s->dst_nhwc;
    k->C2 = s->cat_C2;
    for (int i = 0; i < s->n_post; i++) k->n_add += s->post[i].kind == MTS_DPOST_ADD;
    k->row_w = (size_t)(k->P * k->Wp);
    k->per_thread = (4 * k->row_w * sizeof(uint32_t) + 63) / 64 * 64;
    if (s->head_M) {
        k->hM = s->head_M, k->hact = s->head_act, k->hnhwc = s->head_nhwc, k->hb_set = s->head_b != NULL;
        memcpy(k->hw, s->head_w, sizeof(float) * (size_t)(k->hM * BFC_M * 9));
        for (int m = 0; m < k->hM; m++) k->hb[m] = s->head_b ? s->head_b[m] : 0.0f;
        if (!(k->hwv = mts_fast_sconv_weights(k->hw, k->hM, BFC_M, 9))) {
            free(k->wt);
            free(k);
            return mts_err_set(err, MTS_ENOMEM, "out of memory");
        }
        k->HPW = k->W + 2;
        k->HPHW = (BFC_HEAD_BAND + 2) * k->HPW;
        k->band_floats = (size_t)(BFC_M * k->HPHW + 16);
        /* the band, and the head's output rows when they are interleaved (channels-last) */
        k->per_thread += ((k->band_floats + (size_t)(k->hM * k->W)) * sizeof(float) + 63) / 64 * 64;
    }
    g_created++;
    *out = k;
    return MTS_OK;
}

/* Three rounds of two-source permutes over eight registers (a is overwritten, the result in
 * b): round r pairs registers i and i + 4, then i and i + 2, then i and i + 1, the lower one of
 * each pair taking lanes lo[r] of the two and the upper one lanes hi[r]. With the right lanes
 * this is each of the kernel's transpositions of 16 x 8 words. */
BFC_TARGET static inline __attribute__((always_inline)) void net8(__m512 *a, __m512 *b, const __m512i *lo,
                                                                  const __m512i *hi)
{
    for (int i = 0; i < 4; i++) {
        b[i] = _mm512_permutex2var_ps(a[i], lo[0], a[i + 4]);
        b[i + 4] = _mm512_permutex2var_ps(a[i], hi[0], a[i + 4]);
    }
    for (int i = 0; i < 8; i += 4)
        for (int j = i; j < i + 2; j++) {
            a[j] = _mm512_permutex2var_ps(b[j], lo[1], b[j + 2]);
            a[j + 2] = _mm512_permutex2var_ps(b[j], hi[1], b[j + 2]);
        }
    for (int i = 0; i < 8; i += 2) {
        b[i] = _mm512_permutex2var_ps(a[i], lo[2], a[i + 1]);
        b[i + 1] = _mm512_permutex2var_ps(a[i], hi[2], a[i + 1]);
    }
}

/* One source row of W pixels of Cs bf16 channels, channels-last (s), into the planar pairs
 * p0 .. p0 + ceil(Cs / 2) - 1 of `row`. 16 channels: 16 pixels x 8 words (a[i]: pixels 2i,
 * 2i+1) become 8 rows of 16 pixels, one per pair, in three rounds in which registers i and
 * i + d exchange halves of their lanes. 8 channels: 16 pixels x 4 words (a[i]: pixels 4i ..
 * 4i+3); word p of pixels 0-7 gathered from a[0], a[1] and of pixels 8-15 from a[2], a[3] by one
 * two-source permute each, the two halves joined. Other counts and the last pixels: a word at a
 * time. */
BFC_TARGET static void fill_bf16(const mts_bfconv *k, const uint16_t *s, int64_t Cs, int64_t p0, uint32_t *row)
{
    const int64_t W = k->Ws, Wp = k->Wp, Ps = (Cs + 1) / 2;
    const uint32_t *sw = (const uint32_t *)s;
    uint32_t *d = row + p0 * Wp + 1;
    int64_t x = 0;
    if (Cs == 16) {
        static const int32_t t[6][16] = {{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
                                         {0, 1, 4, 5, 16, 17, 20, 21, 8, 9, 12, 13, 24, 25, 28, 29},
                                         {0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30},
                                         {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31},
                                         {2, 3, 6, 7, 18, 19, 22, 23, 10, 11, 14, 15, 26, 27, 30, 31},
                                         {1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31}};
        __m512i idx[6];
        for (int i = 0; i < 6; i++) idx[i] = _mm512_loadu_si512(t[i]);
        for (; x + 16 <= W; x += 16) {
            __m512 a[8], b[8]; /* (words moved as floats: the permutes do not look at them) */
            for (int i = 0; i < 8; i++) a[i] = _mm512_loadu_ps(sw + (x + 2 * i) * 8);
            net8(a, b, idx, idx + 3);
            for (int p = 0; p < 8; p++) _mm512_storeu_ps(d + p * Wp + x, b[p]);
        }
    } else if (Cs == 8) {
        __m512i idx[4]; /* lanes 0-7: word p of pixels 0-7 of a two-register (32-word) block */
        for (int p = 0; p < 4; p++) idx[p] = _mm512_setr_epi32(p, 4 + p, 8 + p, 12 + p, 16 + p, 20 + p, 24 + p, 28 + p,
                                                               0, 0, 0, 0, 0, 0, 0, 0);
        for (; x + 16 <= W; x += 16) {
            __m512 a[4];
            for (int i = 0; i < 4; i++) a[i] = _mm512_loadu_ps(sw + (x + 4 * i) * 4);
            for (int p = 0; p < 4; p++) {
                __m512 lo = _mm512_permutex2var_ps(a[0], idx[p], a[1]), hi = _mm512_permutex2var_ps(a[2], idx[p], a[3]);
                _mm512_storeu_ps(d + p * Wp + x, _mm512_shuffle_f32x4(lo, hi, 0x44));
            }
        }
    }
    for (; x < W; x++)
        for (int64_t p = 0; p < Ps; p++) {
            uint32_t w = s[x * Cs + 2 * p];
            if (2 * p + 1 < Cs) w |= (uint32_t)s[x * Cs + 2 * p + 1] << 16;
            d[p * Wp + x] = w;
        }
}

/* Source row (n, y) into planar row `row` (pixel x of pair p at row[p * Wp + 1 + x]); src2:
 * the second part of a folded Concat (k->C2 channels), else unused. */
BFC_TARGET static void fill_row(const mts_bfconv *k, const void *src, const void *src2, int64_t n, int64_t y,
                                uint32_t *row)
{
    const int64_t W = k->Ws, C = k->C, P = k->P, Wp = k->Wp;
    int64_t x = 0;
    if (!k->src_nhwc) { /* channels-first float: two channel rows interleaved per pair */
        const float *s = (const float *)src + (n * C * k->Hs + y) * W;
        const int64_t plane = k->Hs * W;
        for (int64_t p = 0; p < P; p++) {
            const float *a = s + 2 * p * plane, *b = 2 * p + 1 < C ? a + plane : NULL;
            uint32_t *d = row + p * Wp + 1;
            for (x = 0; x + 16 <= W; x += 16) {
                __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(a + x)));
                __m512i hi = b ? _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(b + x)))
                               : _mm512_setzero_si512();
                _mm512_storeu_si512(d + x, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
            for (; x < W; x++) d[x] = mts_f32_to_bf16(a[x]) | (b ? (uint32_t)mts_f32_to_bf16(b[x]) << 16 : 0);
        }
        return;
    }
    if (k->src_bf16) {
        /* one or two bf16 parts (a folded Concat: the second one's pairs follow the first's) */
        const int64_t C1 = C - k->C2;
        fill_bf16(k, (const uint16_t *)src + (n * k->Hs + y) * W * C1, C1, 0, row);
        if (k->C2) fill_bf16(k, (const uint16_t *)src2 + (n * k->Hs + y) * W * k->C2, k->C2, C1 / 2, row);
        return;
    }
    /* a float channels-last source: one word at a time */
    for (; x < W; x++) {
        int64_t off = ((n * k->Hs + y) * W + x) * C;
        for (int64_t p = 0; p < P; p++) {
            uint32_t w = 0;
            for (int h = 0; h < 2 && 2 * p + h < C; h++) w |= (uint32_t)mts_f32_to_bf16(((const float *)src)[off + 2 * p + h]) << (16 * h);
            row[p * Wp + 1 + x] = w;
        }
    }
}

/* The post-ops and the store of 16 floats at element offset off of the destination, the
 * lanes of mask mk only (a row's last pixels). */
BFC_TARGET static inline __attribute__((always_inline)) void put16(const mts_bfconv *k, __m512 v,
                                                                   const float *const *resid, int64_t off,
                                                                   __mmask16 mk, void *dst)
{
    for (int j = 0, r = 0; j < k->n_post; j++) {
        const mts_dpost *p = &k->post[j];
        if (p->kind != MTS_DPOST_ADD) {
            v = (__m512)post16((v16f)v, p);
        } else if (p->bf16) {
            __m256i rs = _mm256_maskz_loadu_epi16(mk, (const uint16_t *)resid[r++] + off);
            v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rs), 16)));
        } else {
            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk, resid[r++] + off));
        }
    }
    /* (masked stores only at a row's end: full ones are faster where the stores are the bound) */
    if (k->dst_bf16 && mk == 0xffff) _mm256_storeu_si256((__m256i *)((uint16_t *)dst + off), (__m256i)_mm512_cvtneps_pbh(v));
    else if (k->dst_bf16) _mm256_mask_storeu_epi16((uint16_t *)dst + off, mk, (__m256i)_mm512_cvtneps_pbh(v));
    else if (mk == 0xffff) _mm512_storeu_ps((float *)dst + off, v);
    else _mm512_mask_storeu_ps((float *)dst + off, mk, v);
}

/* [8 channels][16 pixels] -> [16 pixels][8 channels] (b[i]: pixels 2i, 2i + 1): registers i
 * and i + d interleave their lanes, d = 4, 2, 1. a is overwritten. */
BFC_TARGET static inline __attribute__((always_inline)) void to_nhwc(__m512 *a, __m512 *b)
{
    const __m512i il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i ih = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512i lo[3] = {il, il, il}, hi[3] = {ih, ih, ih};
    net8(a, b, lo, hi);
}

/* Consecutive 16-float vectors v[0..nv) from element offset off, the first `valid` elements. */
BFC_TARGET static inline __attribute__((always_inline)) void put_run(const mts_bfconv *k, const __m512 *v, int nv,
                                                                     const float *const *resid, int64_t off,
                                                                     int64_t valid, void *dst)
{
    for (int i = 0; i < nv; i++) {
        int64_t left = valid - 16 * i;
        if (left <= 0) break;
        put16(k, v[i], resid, off + 16 * i, left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1), dst);
    }
}

/* Output row (n, y) from the planar rows r0..r2 (source rows y-1, y, y+1); pf: the next
 * source row to prefetch (pfb bytes, NULL: none). */
BFC_TARGET static void conv_row(const mts_bfconv *k, const uint32_t *r0, const uint32_t *r1, const uint32_t *r2,
                                int64_t n, int64_t y, void *dst, const float *const *resid, const char *pf, size_t pfb,
                                float *hrow)
{
    const int64_t W = k->W, P = k->P, Wp = k->Wp;
    const uint32_t *rows[3] = {r0, r1, r2};
    const int64_t nblk = (W + 31) / 32;
    const size_t pstep = pf ? (pfb / (size_t)nblk + 63) & ~(size_t)63 : 0;
    size_t poff = 0;
    for (int64_t x0 = 0; x0 < W; x0 += 32) {
        for (size_t q = 0; q < pstep && poff < pfb; q += 64, poff += 64) _mm_prefetch(pf + poff, _MM_HINT_T0);
        __m512 a0[BFC_M], a1[BFC_M];
#pragma GCC unroll 8
        for (int m = 0; m < BFC_M; m++) a0[m] = a1[m] = _mm512_set1_ps(k->bias[m]);
        for (int r = 0; r < 3; r++)
            for (int kw = 0; kw < 3; kw++) {
                const uint32_t *sp = rows[r] + x0 + kw, *w = k->wt + (r * 3 + kw) * P * BFC_M;
                for (int64_t p = 0; p < P; p++, sp += Wp, w += BFC_M) {
                    __m512bh s0 = (__m512bh)_mm512_loadu_si512(sp), s1 = (__m512bh)_mm512_loadu_si512(sp + 16);
#pragma GCC unroll 8
                    for (int m = 0; m < BFC_M; m++) {
                        __m512bh wb = (__m512bh)_mm512_set1_epi32((int)w[m]);
                        a0[m] = _mm512_dpbf16_ps(a0[m], s0, wb);
                        a1[m] = _mm512_dpbf16_ps(a1[m], s1, wb);
                    }
                }
            }
        if (hrow) { /* a fused head's band row: planar floats after the post-ops, at bf16 values */
            for (int half = 0; half < 2; half++) {
                const int64_t xb = x0 + 16 * half, cnt = W - xb;
                if (cnt <= 0) break;
                __mmask16 mk = cnt >= 16 ? 0xffff : (__mmask16)((1u << cnt) - 1);
#pragma GCC unroll 8
                for (int m = 0; m < BFC_M; m++) {
                    __m512 v = half ? a1[m] : a0[m];
                    for (int j = 0; j < k->n_post; j++) v = (__m512)post16((v16f)v, &k->post[j]);
                    __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v));
                    _mm512_mask_storeu_ps(hrow + m * k->HPHW + 1 + xb, mk, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
                }
            }
            continue;
        }
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            const int64_t xb = x0 + 16 * half, cnt = W - xb;
            if (cnt <= 0) break;
            __m512 a[8], b[8];
#pragma GCC unroll 8
            for (int m = 0; m < 8; m++) a[m] = half ? a1[m] : a0[m];
            if (!k->dst_nhwc) { /* channels-first: each accumulator is a row piece of its channel */
#pragma GCC unroll 8
                for (int m = 0; m < 8; m++) put_run(k, &a[m], 1, resid, ((n * BFC_M + m) * k->H + y) * W + xb, cnt, dst);
                continue;
            }
            to_nhwc(a, b);
            put_run(k, b, 8, resid, ((n * k->H + y) * W + xb) * BFC_M, cnt * BFC_M, dst);
        }
    }
}

/* The upsampled form: output rows 2i and 2i + 1 from the planar low-resolution rows
 * r0..r2 (rows i-1, i, i+1). Output pixel X = 2j + px of row 2i + py reads low-resolution rows
 * i + py - 1 + a and pixels j + px - 1 + b (a, b in {0, 1}) with the phase's summed taps
 * (k->wup); 16 consecutive j of both phases px at a time. */
BFC_TARGET static void conv_row_up(const mts_bfconv *k, const uint32_t *r0, const uint32_t *r1,
                                   const uint32_t *r2, int64_t n, int64_t i, void *dst, const float *const *resid,
                                   const char *pf, size_t pfb)
{
    const int64_t W = k->W, Ws = k->Ws, P = k->P, Wp = k->Wp;
    const uint32_t *rows[3] = {r0, r1, r2};
    const int64_t nblk = 2 * ((Ws + 15) / 16);
    const size_t pstep = pf ? (pfb / (size_t)nblk + 63) & ~(size_t)63 : 0;
    size_t poff = 0;
    const __m512i il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i ih = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int py = 0; py < 2; py++) {
        const int64_t y = 2 * i + py;
        for (int64_t j0 = 0; j0 < Ws; j0 += 16) {
            for (size_t q = 0; q < pstep && poff < pfb; q += 64, poff += 64) _mm_prefetch(pf + poff, _MM_HINT_T0);
            __m512 a0[BFC_M], a1[BFC_M]; /* phases px = 0 and 1 */
#pragma GCC unroll 8
            for (int m = 0; m < BFC_M; m++) a0[m] = a1[m] = _mm512_set1_ps(k->bias[m]);
            for (int a = 0; a < 2; a++) {
                const uint32_t *sp = rows[py + a] + j0;
                const uint32_t *w0 = k->wup + ((py * 2 + 0) * 4 + a * 2) * P * BFC_M; /* px 0: b 0, 1 */
                const uint32_t *w1 = k->wup + ((py * 2 + 1) * 4 + a * 2) * P * BFC_M; /* px 1 */
                for (int64_t p = 0; p < P; p++, sp += Wp, w0 += BFC_M, w1 += BFC_M) {
                    __m512bh sm = (__m512bh)_mm512_loadu_si512(sp), s0 = (__m512bh)_mm512_loadu_si512(sp + 1),
                             sq = (__m512bh)_mm512_loadu_si512(sp + 2);
#pragma GCC unroll 8
                    for (int m = 0; m < BFC_M; m++) {
                        a0[m] = _mm512_dpbf16_ps(a0[m], sm, (__m512bh)_mm512_set1_epi32((int)w0[m]));
                        a0[m] = _mm512_dpbf16_ps(a0[m], s0, (__m512bh)_mm512_set1_epi32((int)w0[P * BFC_M + m]));
                        a1[m] = _mm512_dpbf16_ps(a1[m], s0, (__m512bh)_mm512_set1_epi32((int)w1[m]));
                        a1[m] = _mm512_dpbf16_ps(a1[m], sq, (__m512bh)_mm512_set1_epi32((int)w1[P * BFC_M + m]));
                    }
                }
            }
            const int64_t x0 = 2 * j0, cnt = W - x0; /* up to 32 output pixels */
            if (!k->dst_nhwc) {
#pragma GCC unroll 8
                for (int m = 0; m < BFC_M; m++) {
                    __m512 v[2] = {_mm512_permutex2var_ps(a0[m], il, a1[m]), _mm512_permutex2var_ps(a0[m], ih, a1[m])};
                    put_run(k, v, 2, resid, ((n * BFC_M + m) * k->H + y) * W + x0, cnt, dst);
                }
                continue;
            }
            __m512 b0[8], b1[8], v[16];
            to_nhwc(a0, b0);
            to_nhwc(a1, b1);
            for (int q = 0; q < 8; q++) { /* pixels j = 2q, 2q+1 of both phases: X = 4q .. 4q+3 */
                v[2 * q] = _mm512_shuffle_f32x4(b0[q], b1[q], 0x44);
                v[2 * q + 1] = _mm512_shuffle_f32x4(b0[q], b1[q], 0xee);
            }
            put_run(k, v, 16, resid, ((n * k->H + y) * W + x0) * BFC_M, cnt * BFC_M, dst);
        }
    }
}

typedef struct bfc_job {
    const mts_bfconv *k;
    const void *src, *src2;
    void *dst;
    const float *const *resid;
    char *scratch;
} bfc_job;

/* Bytes of one channels-last row of the source in[0] (of a folded Concat: its first part),
 * which a row prefetches of the next row it will read. */
static size_t src_row_bytes(const mts_bfconv *k)
{
    return (size_t)(k->Ws * (k->C - k->C2)) * (k->src_bf16 ? 2 : 4);
}

static void bfc_part(void *arg, int ithr, int nthr)
{
    const bfc_job *j = arg;
    const mts_bfconv *k = j->k;
    const int64_t H = k->Hs, rows = k->N * H, lo = rows * ithr / nthr, hi = rows * (ithr + 1) / nthr;
    uint32_t *ring = (uint32_t *)(j->scratch + (size_t)ithr * k->per_thread), *zero = ring + 3 * k->row_w;
    memset(ring, 0, sizeof(uint32_t) * 4 * k->row_w); /* the padding pixels and the zero row */
    const size_t row_bytes = src_row_bytes(k);
    int64_t have_n = -1, have_y = -2;
    for (int64_t r = lo; r < hi; r++) { /* source rows: one output row each, two when upsampled */
        int64_t n = r / H, y = r % H;
        /* ring slot (yy + 3) % 3 holds source row yy while yy is one of y-1, y, y+1 */
        for (int64_t yy = y - 1; yy <= y + 1; yy++) {
            bool held = n == have_n && yy >= have_y - 1 && yy <= have_y + 1;
            if (yy >= 0 && yy < H && !held) fill_row(k, j->src, j->src2, n, yy, ring + (size_t)((yy + 3) % 3) * k->row_w);
        }
        have_n = n, have_y = y;
        const uint32_t *rp[3];
        for (int d = 0; d < 3; d++) {
            int64_t yy = y - 1 + d;
            rp[d] = yy < 0 || yy >= H ? zero : ring + (size_t)((yy + 3) % 3) * k->row_w;
        }
        /* the row the next output row will read first (channels-last sources: one block) */
        const char *pf = NULL;
        if (k->src_nhwc && y + 2 < H && r + 1 < hi)
            pf = (const char *)j->src + (size_t)(n * H + y + 2) * row_bytes;
        if (k->up) conv_row_up(k, rp[0], rp[1], rp[2], n, y, j->dst, j->resid, pf, row_bytes);
        else conv_row(k, rp[0], rp[1], rp[2], n, y, j->dst, j->resid, pf, row_bytes, NULL);
    }
}

/* Source rows yy - 1 .. yy + 1 of image n into the ring (slot (row + 3) % 3; id: which row a
 * slot holds), then the convolution's row yy into the head band's row hrow. */
static void head_band_row(const bfc_job *j, uint32_t *ring, const uint32_t *zero, int64_t *id, int64_t n, int64_t yy,
                          float *hrow)
{
    const mts_bfconv *k = j->k;
    const int64_t H = k->H;
    const uint32_t *rp[3];
    for (int d = 0; d < 3; d++) {
        int64_t sy = yy - 1 + d, slot = (sy + 3) % 3;
        if (sy < 0 || sy >= H) {
            rp[d] = zero;
            continue;
        }
        uint32_t *row = ring + (size_t)slot * k->row_w;
        if (id[slot] != n * H + sy) {
            fill_row(k, j->src, j->src2, n, sy, row);
            id[slot] = n * H + sy;
        }
        rp[d] = row;
    }
    const size_t row_bytes = src_row_bytes(k);
    const char *pf = k->src_nhwc && yy + 2 < H ? (const char *)j->src + (size_t)(n * H + yy + 2) * row_bytes : NULL;
    conv_row(k, rp[0], rp[1], rp[2], n, yy, NULL, j->resid, pf, row_bytes, hrow);
}

/* With a fused head: the thread's head output rows, BFC_HEAD_BAND at a time. The band holds the
 * convolution's rows y0 - 1 .. y0 + BAND of the image as 8 planes of padded float rows (zero
 * columns on each side, zero rows outside the image); the next band starts from the last two
 * rows of this one. Each head row is the small-channel kernel's row (fast.c) on the band, then
 * its activation, stored channels-first or interleaved. */
static void bfc_part_head(void *arg, int ithr, int nthr)
{
    const bfc_job *j = arg;
    const mts_bfconv *k = j->k;
    const int64_t H = k->H, W = k->W, M = k->hM, rows = k->N * H, lo = rows * ithr / nthr, hi = rows * (ithr + 1) / nthr;
    const int64_t B = BFC_HEAD_BAND, HPW = k->HPW, HPHW = k->HPHW;
    uint32_t *ring = (uint32_t *)(j->scratch + (size_t)ithr * k->per_thread), *zero = ring + 3 * k->row_w;
    float *band = (float *)(zero + k->row_w), *orow = band + k->band_floats;
    memset(ring, 0, sizeof(uint32_t) * 4 * k->row_w);
    memset(band, 0, sizeof(float) * k->band_floats);
    int64_t id[3] = {-1, -1, -1};
    for (int64_t r = lo; r < hi;) {
        const int64_t n = r / H, y0 = r % H, y1 = y0 + (hi - r) < H ? y0 + (hi - r) : H;
        for (int64_t yb = y0; yb < y1; yb += B) {
            const int64_t ye = yb + B < y1 ? yb + B : y1;
            int64_t i = 0;
            if (yb > y0) { /* the previous (full) band's last two rows are this one's first two */
                for (int64_t c = 0; c < BFC_M; c++) memcpy(band + c * HPHW, band + c * HPHW + B * HPW, sizeof(float) * (size_t)(2 * HPW));
                i = 2;
            }
            for (; i < ye - yb + 2; i++) {
                const int64_t yy = yb - 1 + i;
                if (yy < 0 || yy >= H) {
                    for (int64_t c = 0; c < BFC_M; c++) memset(band + c * HPHW + i * HPW, 0, sizeof(float) * (size_t)HPW);
                    continue;
                }
                head_band_row(j, ring, zero, id, n, yy, band + i * HPW);
            }
            for (int64_t y = yb; y < ye; y++) {
                float *out[4];
                for (int64_t m = 0; m < M; m++) out[m] = k->hnhwc ? orow + m * W : (float *)j->dst + ((n * M + m) * H + y) * W;
                mts_fast_sconv_row3(band, HPW, HPHW, BFC_M, M, k->hw, k->hwv, k->hb_set ? k->hb : NULL, y - yb, W, out);
                for (int64_t m = 0; k->hact && m < M; m++) mts_fast_act(out[m], W, k->hact); /* rows still in L1 */
                if (k->hnhwc)
                    for (int64_t x = 0; x < W; x++)
                        for (int64_t m = 0; m < M; m++) ((float *)j->dst)[((n * H + y) * W + x) * M + m] = orow[m * W + x];
            }
        }
        r += y1 - y0;
    }
}

/* Threads worth using: the oneDNN steps' rule (mts_dconv_threads_for), at most one per row. */
static int bfc_threads(const mts_bfconv *k, int threads)
{
    int n = mts_dconv_threads_for((double)(k->N * k->H * k->W) * (double)(9 * k->C * BFC_M), threads);
    int64_t rows = k->N * k->Hs;
    return n > rows ? (rows < 1 ? 1 : (int)rows) : n;
}

void mts_bfconv_run(const mts_bfconv *k, int threads, const void *src, void *dst, const float *const *resid,
                    void *scratch)
{
    bfc_job j = {k, src, k->C2 ? resid[k->n_add] : NULL, dst, resid, scratch};
    mts_parallel(bfc_threads(k, threads), k->hM ? bfc_part_head : bfc_part, &j);
}

size_t mts_bfconv_scratch(const mts_bfconv *k, int threads)
{
    return (size_t)bfc_threads(k, threads) * k->per_thread;
}

#else /* not x86-64: never chosen */

int64_t mts_bfconv_created(void)
{
    return 0;
}

bool mts_bfconv_ok(const mts_dconv_spec *s)
{
    (void)s;
    return false;
}

int mts_bfconv_create(const mts_dconv_spec *s, mts_bfconv **out, mts_err *err)
{
    (void)s, (void)out;
    return mts_err_set(err, MTS_EUNSUPPORTED, "bf16 convolution kernel: x86-64 only");
}

size_t mts_bfconv_scratch(const mts_bfconv *k, int threads)
{
    (void)k, (void)threads;
    return 0;
}

void mts_bfconv_run(const mts_bfconv *k, int threads, const void *src, void *dst, const float *const *resid,
                    void *scratch)
{
    (void)k, (void)threads, (void)src, (void)dst, (void)resid, (void)scratch;
}

#endif

void mts_bfconv_free(mts_bfconv *k)
{
    if (!k) return;
    free(k->wt);
    free(k->hwv);
    free(k);
}
