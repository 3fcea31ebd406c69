/*
 * Fused multi-head attention ("MtsAttention"), the fast backend's kernel for the standard
 * BERT block once the optimizer has folded it (fast_backend.c): per batch entry n and head h,
 *     Y[n,h] = softmax(((Q[n,h] x K[n,h]) * alpha + mask[n,h]) * beta) x V[n,h]
 * with Q [S, dk], K [dk, T] (the keys already transposed, as the scores MatMul reads them),
 * V [T, dv] and the mask broadcast to [S, T]. Every operand is read and the output written
 * through element strides, so the Reshape/Transpose copies around attention stay folded and
 * the scores never leave a row buffer: one query row at a time, its T scores are computed,
 * scaled, masked, normalized and multiplied into V before the next row. The softmax is the
 * fast softmax's (fast.c: max, polynomial exp, sum, one reciprocal), so the result matches
 * the unfused steps up to the summation order of the products.
 * Inputs: in[0] Q, in[1] K, in[2] V, optional in[3] mask (float). Attributes (INTS unless
 * said): dims {N, H, S, T, dk, dv}; q_strides, k_strides, v_strides, y_strides, m_strides
 * {n, h, row, column} in elements (m_strides 0 on the mask's broadcast axes); y_dims, the
 * output value's shape; FLOAT alpha, beta. Entries (n, h) are split over the context's
 * threads when there is enough work. In a padding-free run (kernel.h mts_rows) entry n attends
 * over its first len[n] keys only, computes its first len[n] query rows and zeroes the rest: for
 * a model whose mask already hides padded keys (an additive -1e4 or -inf underflows exp to 0)
 * the valid rows are what the full computation gives.
 */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"
#include "engine/kernels/vec16.h"

/* Multiply-adds (S*T*(dk+dv) per entry) from which the entries are split over threads. */
#define ATTN_MT_WORK (1 << 18)

static inline __attribute__((always_inline)) v16f splat16(float f)
{
    return __builtin_shuffle((v16f){f}, (v16i){0}); /* lane 0 everywhere: one broadcast */
}

static inline __attribute__((always_inline)) float hsum16(v16f v)
{
    v = v + __builtin_shuffle(v, (v16i){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    v = v + __builtin_shuffle(v, (v16i){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    v = v + __builtin_shuffle(v, (v16i){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    return v[0] + v[1];
}

static inline __attribute__((always_inline)) v16f vmax16(v16f a, v16f b)
{
    v16f r;
    for (int l = 0; l < 16; l++) r[l] = b[l] > a[l] ? b[l] : a[l];
    return r;
}

static inline __attribute__((always_inline)) float hmax16(v16f v)
{
    v = vmax16(v, __builtin_shuffle(v, (v16i){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
    v = vmax16(v, __builtin_shuffle(v, (v16i){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
    v = vmax16(v, __builtin_shuffle(v, (v16i){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
    return v[0] > v[1] ? v[0] : v[1];
}

/* exp(x), the polynomial of fast.c's softmax (relative error ~2e-7). */
static inline __attribute__((always_inline)) v16f vexp16(v16f x)
{
    for (int l = 0; l < 16; l++) x[l] = x[l] < -87.3f ? -87.3f : x[l] > 88.3f ? 88.3f : x[l];
    const v16f magic = splat16(12582912.0f);
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

typedef struct attn_job {
    const float *q, *k, *v, *m;
    float *y;
    int64_t N, H, S, T, dk, dv, Tp, dvp; /* Tp: T rounded up to 16; dvp: dv rounded up to 32 */
    const int64_t *qs, *ks, *vs, *ys, *ms;
    float alpha, beta;
    int fail; /* a part could not get its buffers */
    const int32_t *len; /* padding-free run: entry n has len[n] queries and keys (NULL: S and T) */
} attn_job;

/* Query rows handled together: their scores share each K vector and their context sums each V
 * vector, and the independent sums keep the vector units busy. */
#define ATTN_ROWS 4

/* Floats of one part's buffers: K transposed [dk][Tp], ATTN_ROWS score rows [Tp], V padded to
 * [T][dvp] when its rows are not contiguous runs of 32-float blocks. */
static int64_t attn_buf_floats(const attn_job *j)
{
    bool v_in_place = j->vs[3] == 1 && j->dv % 32 == 0;
    return j->dk * j->Tp + ATTN_ROWS * j->Tp + (v_in_place ? 0 : j->T * j->dvp);
}

/* Scales and masks one row of T scores and replaces them by exp(s - max) (as fast.c's
 * softmax_rows); returns 1 / their sum, by which the row's context is scaled once at the end
 * (so the division's latency overlaps the products), or 0 when the row's maximum is not finite
 * (the reference then gives NaN). */
static inline __attribute__((always_inline)) float attn_softmax_row(const attn_job *j, int64_t T, float *row,
                                                                   const float *mi)
{
    const int64_t m3 = mi ? j->ms[3] : 0;
    const v16f va = splat16(j->alpha), vb = splat16(j->beta);
    v16f vmx = splat16(-INFINITY);
    int64_t t = 0;
    for (; t + 16 <= T; t += 16) {
        v16f s = ld16(row + t) * va;
        if (mi) {
            if (m3 == 1) s += ld16(mi + t);
            else if (m3 == 0) s += splat16(mi[0]);
            else
                for (int l = 0; l < 16; l++) s[l] += mi[(t + l) * m3];
        }
        s *= vb;
        st16(row + t, s);
        vmx = vmax16(vmx, s);
    }
    float mx = hmax16(vmx);
    for (; t < T; t++) {
        float s = row[t] * j->alpha;
        if (mi) s += mi[t * m3];
        s *= j->beta;
        row[t] = s;
        mx = s > mx ? s : mx;
    }
    if (!(mx > -INFINITY && mx < INFINITY)) return 0.0f;
    v16f vm = splat16(mx), sum = splat16(0);
    for (t = 0; t + 16 <= T; t += 16) {
        v16f x = vexp16(ld16(row + t) - vm);
        st16(row + t, x);
        sum += x;
    }
    float s = hsum16(sum);
    for (; t < T; t++) {
        float x = expf(row[t] - mx);
        row[t] = x;
        s += x;
    }
    return 1.0f / s;
}

/* 16 x 16 transpose in registers: four rounds, each swapping one bit of the row index with the
 * same bit of the column index through two-source shuffles. */
static inline __attribute__((always_inline)) void transpose16(v16f a[16])
{
    static const v16i lo1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
                      hi1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31},
                      lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                      hi2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
                      lo4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                      hi4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
                      lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                      hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const v16i *lo[4] = {&lo1, &lo2, &lo4, &lo8}, *hi[4] = {&hi1, &hi2, &hi4, &hi8};
    for (int b = 0; b < 4; b++) {
        int st = 1 << b;
        for (int i = 0; i < 16; i++) {
            if (i & st) continue;
            v16f x = a[i], y = a[i + st];
            a[i] = __builtin_shuffle(x, y, *lo[b]);
            a[i + st] = __builtin_shuffle(x, y, *hi[b]);
        }
    }
}

/* Entries [e0, e1) of the N*H (n, h) pairs, with the buffers of attn_buf_floats. */
MTS_VEC_CLONES static void attn_entries(const attn_job *j, int64_t e0, int64_t e1, float *buf)
{
    const int64_t dk = j->dk, dv = j->dv, dvp = j->dvp;
    const bool v_in_place = j->vs[3] == 1 && dv % 32 == 0;
    const int64_t qs3 = j->qs[3], ks2 = j->ks[2], ks3 = j->ks[3];
    for (int64_t e = e0; e < e1; e++) {
        int64_t n = e / j->H, h = e % j->H;
        /* a padding-free run: the entry's valid queries and keys only, padded query rows zero */
        const int64_t S = j->len ? j->len[n] : j->S, T = j->len ? j->len[n] : j->T, Tp = (T + 15) / 16 * 16;
        float *kt = buf, *pr = kt + dk * Tp, *vc = pr + ATTN_ROWS * Tp;
        const float *q = j->q + n * j->qs[0] + h * j->qs[1];
        const float *k = j->k + n * j->ks[0] + h * j->ks[1];
        const float *v = j->v + n * j->vs[0] + h * j->vs[1];
        float *y = j->y + n * j->ys[0] + h * j->ys[1];
        for (int64_t i = S; i < j->S; i++)
            for (int64_t c = 0; c < dv; c++) y[i * j->ys[2] + c * j->ys[3]] = 0.0f;
        /* K as [dk][Tp], zero beyond T, so a row of scores is whole vectors */
        if (ks2 == 1 && dk % 16 == 0) { /* key rows contiguous: 16 x 16 blocks in registers */
            for (int64_t t0 = 0; t0 < T; t0 += 16)
                for (int64_t d0 = 0; d0 < dk; d0 += 16) {
                    v16f blk[16];
                    for (int r = 0; r < 16; r++) blk[r] = t0 + r < T ? ld16(k + (t0 + r) * ks3 + d0) : splat16(0);
                    transpose16(blk);
                    for (int r = 0; r < 16; r++) st16(kt + (d0 + r) * Tp + t0, blk[r]);
                }
        } else {
            for (int64_t t = 0; t < T; t++)
                for (int64_t d = 0; d < dk; d++) kt[d * Tp + t] = k[t * ks3 + d * ks2];
            for (int64_t d = 0; d < dk; d++)
                for (int64_t t = T; t < Tp; t++) kt[d * Tp + t] = 0.0f;
        }
        int64_t vstride = j->vs[2];
        if (!v_in_place) { /* V as [T][dvp], zero beyond dv */
            for (int64_t t = 0; t < T; t++) {
                for (int64_t c = 0; c < dv; c++) vc[t * dvp + c] = v[t * j->vs[2] + c * j->vs[3]];
                for (int64_t c = dv; c < dvp; c++) vc[t * dvp + c] = 0.0f;
            }
            v = vc;
            vstride = dvp;
        }
        for (int64_t i0 = 0; i0 < S; i0 += ATTN_ROWS) {
            int64_t nr = S - i0 < ATTN_ROWS ? S - i0 : ATTN_ROWS;
            /* rows past the end repeat the last one; they are computed and dropped */
            const float *q0 = q + i0 * j->qs[2], *q1 = q + (i0 + (nr > 1 ? 1 : 0)) * j->qs[2],
                        *q2 = q + (i0 + (nr > 2 ? 2 : nr - 1)) * j->qs[2], *q3 = q + (i0 + nr - 1) * j->qs[2];
            for (int64_t t = 0; t < Tp; t += 16) {
                v16f a0 = splat16(0), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t d = 0; d < dk; d++) {
                    v16f kv = ld16(kt + d * Tp + t);
                    a0 += splat16(q0[d * qs3]) * kv;
                    a1 += splat16(q1[d * qs3]) * kv;
                    a2 += splat16(q2[d * qs3]) * kv;
                    a3 += splat16(q3[d * qs3]) * kv;
                }
                st16(pr + t, a0);
                st16(pr + Tp + t, a1);
                st16(pr + 2 * Tp + t, a2);
                st16(pr + 3 * Tp + t, a3);
            }
            float rs[ATTN_ROWS];
            for (int r = 0; r < ATTN_ROWS; r++) {
                int64_t i = i0 + (r < nr ? r : nr - 1);
                const float *mi = j->m ? j->m + n * j->ms[0] + h * j->ms[1] + i * j->ms[2] : NULL;
                rs[r] = attn_softmax_row(j, T, pr + r * Tp, mi);
            }
            /* exp(s - max) times V, 32 columns of the four rows at a time, then times 1 / sum */
            for (int64_t c = 0; c < dvp; c += 32) {
                v16f b0 = splat16(0), b1 = b0, b2 = b0, b3 = b0, b4 = b0, b5 = b0, b6 = b0, b7 = b0;
                for (int64_t t = 0; t < T; t++) {
                    const float *vt = v + t * vstride + c;
                    v16f lo = ld16(vt), hi = ld16(vt + 16);
                    v16f p0 = splat16(pr[t]), p1 = splat16(pr[Tp + t]), p2 = splat16(pr[2 * Tp + t]),
                         p3 = splat16(pr[3 * Tp + t]);
                    b0 += p0 * lo, b1 += p0 * hi;
                    b2 += p1 * lo, b3 += p1 * hi;
                    b4 += p2 * lo, b5 += p2 * hi;
                    b6 += p3 * lo, b7 += p3 * hi;
                }
                v16f out[2 * ATTN_ROWS] = {b0, b1, b2, b3, b4, b5, b6, b7};
                int64_t w = dv - c < 32 ? dv - c : 32;
                for (int r = 0; r < nr; r++) {
                    float *yi = y + (i0 + r) * j->ys[2] + c * j->ys[3];
                    float tmp[32];
                    st16(tmp, out[2 * r] * splat16(rs[r]));
                    st16(tmp + 16, out[2 * r + 1] * splat16(rs[r]));
                    if (rs[r] == 0.0f)
                        for (int64_t x = 0; x < w; x++) yi[x * j->ys[3]] = NAN;
                    else if (j->ys[3] == 1)
                        memcpy(yi, tmp, sizeof(float) * (size_t)w);
                    else
                        for (int64_t x = 0; x < w; x++) yi[x * j->ys[3]] = tmp[x];
                }
            }
        }
    }
}

static void attn_part(void *arg, int ithr, int nthr)
{
    attn_job *j = arg;
    int64_t ne = j->N * j->H, e0 = ne * ithr / nthr, e1 = ne * (ithr + 1) / nthr;
    if (e1 <= e0) return;
    float *buf = malloc(sizeof(float) * (size_t)attn_buf_floats(j));
    if (!buf) {
        __atomic_store_n(&j->fail, 1, __ATOMIC_RELAXED);
        return;
    }
    attn_entries(j, e0, e1, buf);
    free(buf);
}

/* The largest element offset a 4-D strided view reaches (dims >= 1), or -1 with a negative
 * stride or an offset beyond 2^62. */
static int64_t view_extent(const int64_t *dims, const int64_t *st)
{
    int64_t off = 0;
    for (int i = 0; i < 4; i++) {
        if (st[i] < 0 || (st[i] > 0 && dims[i] - 1 > ((INT64_C(1) << 62) - off) / st[i])) return -1;
        off += (dims[i] - 1) * st[i];
    }
    return off;
}

static int64_t numel_of(const mts_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->dims[i];
    return n;
}

static int attn_run(mts_kctx *k)
{
    int n[6];
    const int64_t *dims = mts_attr_ints(k->node, "dims", &n[0]);
    const int64_t *qs = mts_attr_ints(k->node, "q_strides", &n[1]);
    const int64_t *ks = mts_attr_ints(k->node, "k_strides", &n[2]);
    const int64_t *vs = mts_attr_ints(k->node, "v_strides", &n[3]);
    const int64_t *ys = mts_attr_ints(k->node, "y_strides", &n[4]);
    const int64_t *ms = mts_attr_ints(k->node, "m_strides", &n[5]);
    const mts_tensor *q = mts_kin(k, 0), *kk = mts_kin(k, 1), *v = mts_kin(k, 2), *m = mts_kin(k, 3);
    if (!dims || !qs || !ks || !vs || !ys || !ms || n[0] != 6 || n[1] != 4 || n[2] != 4 || n[3] != 4 || n[4] != 4 ||
        n[5] != 4 || !q || !kk || !v)
        return mts_err_set(k->err, MTS_EINVAL, "malformed fused attention");
    for (int i = 0; i < 6; i++)
        if (dims[i] < 1 || dims[i] > (1 << 20))
            return mts_err_set(k->err, MTS_EINVAL, "fused attention dimension %d is %lld", i, (long long)dims[i]);
    if (q->dtype != MTS_DTYPE_FLOAT || kk->dtype != MTS_DTYPE_FLOAT || v->dtype != MTS_DTYPE_FLOAT ||
        (m && m->dtype != MTS_DTYPE_FLOAT) || k->out[0].dtype != MTS_DTYPE_FLOAT)
        return mts_err_set(k->err, MTS_EINVAL, "fused attention wants float tensors");
    const int64_t N = dims[0], H = dims[1], S = dims[2], T = dims[3], dk = dims[4], dv = dims[5];
    /* every strided read and write stays inside its tensor */
    const int64_t qd[4] = {N, H, S, dk}, kd[4] = {N, H, dk, T}, vd[4] = {N, H, T, dv}, yd[4] = {N, H, S, dv},
                  md[4] = {N, H, S, T};
    int64_t eq = view_extent(qd, qs), ek = view_extent(kd, ks), ev = view_extent(vd, vs), ey = view_extent(yd, ys);
    int64_t em = m ? view_extent(md, ms) : 0;
    if (eq < 0 || eq >= numel_of(q) || ek < 0 || ek >= numel_of(kk) || ev < 0 || ev >= numel_of(v) || ey < 0 ||
        ey >= numel_of(&k->out[0]) || em < 0 || (m && em >= numel_of(m)))
        return mts_err_set(k->err, MTS_EINVAL, "fused attention views exceed their tensors");
    attn_job j = {q->data, kk->data, v->data, m ? m->data : NULL, k->out[0].data, N, H, S, T, dk, dv,
                  (T + 15) / 16 * 16, (dv + 31) / 32 * 32, qs, ks, vs, ys, ms,
                  mts_attr_float(k->node, "alpha", 1.0f), mts_attr_float(k->node, "beta", 1.0f), 0, NULL};
    const mts_rows *rows = mts_kctx_rows(k);
    if (rows && rows->B == N && rows->S == S && S == T) j.len = rows->len;
    double work = (double)N * (double)H * (double)S * (double)T * (double)(dk + dv);
    int t = work >= ATTN_MT_WORK ? k->threads : 1;
    if (t > N * H) t = (int)(N * H);
    mts_parallel(t, attn_part, &j);
    return j.fail ? mts_err_set(k->err, MTS_ENOMEM, "out of memory") : MTS_OK;
}

static int attn_infer(mts_kctx *k)
{
    int n = 0;
    const int64_t *yd = mts_attr_ints(k->node, "y_dims", &n);
    if (!yd || n < 1 || n > MTS_MAX_RANK) return mts_err_set(k->err, MTS_EINVAL, "malformed fused attention");
    k->out[0].dtype = MTS_DTYPE_FLOAT;
    k->out[0].rank = n;
    memcpy(k->out[0].dims, yd, sizeof(int64_t) * (size_t)n);
    return MTS_OK;
}

const mts_op mts_fast_attention = {"MtsAttention", attn_infer, attn_run};
