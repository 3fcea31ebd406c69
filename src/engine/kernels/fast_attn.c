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
 * threads when there is enough work.
 */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define ATTN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ATTN_CLONES
#endif

/* Multiply-adds (S*T*(dk+dv) per entry) from which the entries are split over threads. */
#define ATTN_MT_WORK (1 << 18)

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline __attribute__((always_inline)) v16f ld16(const float *p)
{
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void st16(float *p, v16f v)
{
    memcpy(p, &v, sizeof v);
}

static inline __attribute__((always_inline)) v16f splat16(float f)
{
    return (v16f){0} + f;
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
    int64_t N, H, S, T, dk, dv, Tp, dvp; /* Tp, dvp: T and dv rounded up to 16 */
    const int64_t *qs, *ks, *vs, *ys, *ms;
    float alpha, beta;
    int fail; /* a part could not get its buffers */
} attn_job;

/* Entries [e0, e1) of the N*H (n, h) pairs; buf: dk*Tp + Tp + dvp (+ T*dvp) floats. */
ATTN_CLONES static void attn_entries(const attn_job *j, int64_t e0, int64_t e1, float *buf)
{
    const int64_t S = j->S, T = j->T, dk = j->dk, dv = j->dv, Tp = j->Tp, dvp = j->dvp;
    float *kt = buf, *row = kt + dk * Tp, *acc = row + Tp, *vc = acc + dvp;
    const bool v_rows = j->vs[3] == 1; /* V rows are contiguous: read in place */
    for (int64_t e = e0; e < e1; e++) {
        int64_t n = e / j->H, h = e % j->H;
        const float *q = j->q + n * j->qs[0] + h * j->qs[1];
        const float *k = j->k + n * j->ks[0] + h * j->ks[1];
        const float *v = j->v + n * j->vs[0] + h * j->vs[1];
        float *y = j->y + n * j->ys[0] + h * j->ys[1];
        /* K as [dk][Tp], zero beyond T, so a row of scores is whole vectors */
        for (int64_t d = 0; d < dk; d++) {
            float *kd = kt + d * Tp;
            for (int64_t t = 0; t < T; t++) kd[t] = k[d * j->ks[2] + t * j->ks[3]];
            for (int64_t t = T; t < Tp; t++) kd[t] = 0.0f;
        }
        int64_t vstride = j->vs[2];
        if (!v_rows) {
            for (int64_t t = 0; t < T; t++)
                for (int64_t c = 0; c < dv; c++) vc[t * dvp + c] = v[t * j->vs[2] + c * j->vs[3]];
            v = vc;
            vstride = dvp;
        }
        for (int64_t i = 0; i < S; i++) {
            const float *qi = q + i * j->qs[2];
            for (int64_t t = 0; t < Tp; t += 16) {
                v16f a = splat16(0);
                for (int64_t d = 0; d < dk; d++) a += splat16(qi[d * j->qs[3]]) * ld16(kt + d * Tp + t);
                st16(row + t, a);
            }
            /* scale, mask, softmax (as fast.c's softmax_rows, with its scale beta) */
            const float *mi = j->m ? j->m + n * j->ms[0] + h * j->ms[1] + i * j->ms[2] : NULL;
            float mx = -INFINITY;
            for (int64_t t = 0; t < T; t++) {
                float s = row[t] * j->alpha;
                if (mi) s += mi[t * j->ms[3]];
                s *= j->beta;
                row[t] = s;
                mx = s > mx ? s : mx;
            }
            float *yi = y + i * j->ys[2];
            if (!(mx > -INFINITY && mx < INFINITY)) { /* all -inf or some +inf: NaN, as the reference */
                for (int64_t c = 0; c < dv; c++) yi[c] = NAN;
                continue;
            }
            v16f vm = splat16(mx), sum = splat16(0);
            int64_t t = 0;
            for (; t + 16 <= T; t += 16) {
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
            float r = 1.0f / s;
            /* the row of probabilities times V */
            for (int64_t c = 0; c < dvp; c += 16) st16(acc + c, splat16(0));
            for (t = 0; t < T; t++) {
                float p = row[t] * r;
                const float *vt = v + t * vstride;
                v16f vp = splat16(p);
                int64_t c = 0;
                for (; c + 16 <= dv; c += 16) st16(acc + c, ld16(acc + c) + vp * ld16(vt + c));
                for (; c < dv; c++) acc[c] += p * vt[c];
            }
            if (j->ys[3] == 1) memcpy(yi, acc, sizeof(float) * (size_t)dv);
            else
                for (int64_t c = 0; c < dv; c++) yi[c * j->ys[3]] = acc[c];
        }
    }
}

static int64_t attn_buf_floats(const attn_job *j)
{
    return j->dk * j->Tp + j->Tp + j->dvp + (j->vs[3] == 1 ? 0 : j->T * j->dvp);
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

/* The largest element offset a 4-D strided view reaches, or -1 with a negative stride. */
static int64_t view_extent(const int64_t *dims, const int64_t *st)
{
    int64_t off = 0;
    for (int i = 0; i < 4; i++) {
        if (st[i] < 0) return -1;
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
                  (T + 15) / 16 * 16, (dv + 15) / 16 * 16, qs, ks, vs, ys, ms,
                  mts_attr_float(k->node, "alpha", 1.0f), mts_attr_float(k->node, "beta", 1.0f), 0};
    int64_t work = N * H * S * T * (dk + dv);
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
