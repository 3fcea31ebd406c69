/*
 * The BERT-encoder kernels against plain double-precision loops, at 1 and 2 threads: the fused
 * attention step "MtsAttention" (kernels/fast_attn.c) on Q/K/V read through the strides of the
 * [N, S, H, d] projections (and of plain [N, H, S, d] tensors), lengths that are not multiples
 * of the vector width, with and without a broadcast mask, scales before and after the mask, and
 * a fully masked row (NaN, as the unfused softmax gives); and the small-M GEMM
 * (kernels/fast_sgemm.c) with row counts 1-128, transposed and plain weights, bias, Erf GELU and
 * a residual in both orders, and through a row map (the rows a padding-free run computes). The
 * fusion that produces MtsAttention steps is checked end to end against ONNX Runtime by
 * tests/server/test_embeddings.py and tests/models/compare_ort.py.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/kernels/dnnl_ops.h"
#include "engine/kernels/fast_sgemm.h"
#include "engine/kernels/kernel.h"
#include "util/tensor.h"

#if defined(__SANITIZE_THREAD__)
#define MAX_THREADS 1
#else
#define MAX_THREADS 2
#endif

static unsigned seed = 4242;

static float frand(float lo, float hi)
{
    seed = seed * 1103515245u + 12345u;
    return lo + (hi - lo) * (float)((seed >> 8) & 0xffff) / 65536.0f;
}

static int irand(int n)
{
    seed = seed * 1103515245u + 12345u;
    return (int)((seed >> 8) % (unsigned)n);
}

static float *frands(int64_t n, float lo, float hi)
{
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = frand(lo, hi);
    return p;
}

static void expect_close(const float *got, const double *ref, int64_t n, double rel, const char *what)
{
    double scale = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs(ref[i]) > scale) scale = fabs(ref[i]);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(ref[i]) || isnan(got[i])) {
            if (!(isnan(ref[i]) && isnan(got[i])))
                fail_msg("%s: element %lld: got %g, reference %g", what, (long long)i, got[i], ref[i]);
            continue;
        }
        if (fabs(got[i] - ref[i]) > rel * (scale > 1e-30 ? scale : 1.0))
            fail_msg("%s: element %lld: got %.8g, reference %.8g", what, (long long)i, got[i], ref[i]);
    }
}

static void test_attention(void **state)
{
    (void)state;
    static const int64_t lens[] = {1, 5, 16, 17, 33};
    static const int64_t dks[] = {8, 20, 32, 40};
    for (int iter = 0; iter < 40; iter++) {
        int64_t N = 1 + irand(3), H = 1 + irand(4), S = lens[irand(5)], T = lens[irand(5)];
        int64_t dk = dks[irand(4)], dv = dks[irand(4)];
        if (iter % 8 == 0) N = 4, H = 12, S = T = 16, dk = dv = 32; /* BERT-sized, threaded */
        bool bert = irand(2), use_mask = iter % 3 != 0, dead = iter % 7 == 3;
        float alpha = frand(0.1f, 0.5f), beta = irand(2) ? 1.0f : frand(0.5f, 2.0f);
        /* Q [N,S,H,dk] (bert) or [N,H,S,dk]; K likewise with T; V with T, dv; Y [N,S,H,dv] */
        float *q = frands(N * S * H * dk, -1, 1), *k = frands(N * T * H * dk, -1, 1), *v = frands(N * T * H * dv, -1, 1);
        float *m = frands(N * T, -1, 1);
        for (int64_t i = 0; i < N * T; i++)
            if (irand(4) == 0) m[i] = -10000.0f;
        if (dead && use_mask)
            for (int64_t t = 0; t < T; t++) m[t] = -INFINITY; /* batch entry 0: every key masked */
        int64_t qs[4], ks[4], vs[4], ys[4] = {S * H * dv, dv, H * dv, 1}, ms[4] = {T, 0, 0, 1};
        if (bert) {
            int64_t a[4] = {S * H * dk, dk, H * dk, 1}, b[4] = {T * H * dk, dk, 1, H * dk}, c[4] = {T * H * dv, dv, H * dv, 1};
            memcpy(qs, a, sizeof qs), memcpy(ks, b, sizeof ks), memcpy(vs, c, sizeof vs);
        } else {
            int64_t a[4] = {H * S * dk, S * dk, dk, 1}, b[4] = {H * T * dk, T * dk, 1, dk}, c[4] = {H * T * dv, T * dv, dv, 1};
            memcpy(qs, a, sizeof qs), memcpy(ks, b, sizeof ks), memcpy(vs, c, sizeof vs);
        }
        /* the reference, in Y's layout */
        double *ref = calloc((size_t)(N * S * H * dv), sizeof(double)), *row = malloc(sizeof(double) * (size_t)T);
        for (int64_t n = 0; n < N; n++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < S; i++) {
                    double mx = -INFINITY, sum = 0;
                    for (int64_t t = 0; t < T; t++) {
                        double s = 0;
                        for (int64_t d = 0; d < dk; d++)
                            s += (double)q[n * qs[0] + h * qs[1] + i * qs[2] + d] * k[n * ks[0] + h * ks[1] + d * ks[2] + t * ks[3]];
                        s = (s * alpha + (use_mask ? m[n * T + t] : 0.0)) * beta;
                        row[t] = s;
                        if (s > mx) mx = s;
                    }
                    double *y = ref + n * ys[0] + h * ys[1] + i * ys[2];
                    if (!isfinite(mx)) {
                        for (int64_t c = 0; c < dv; c++) y[c] = NAN;
                        continue;
                    }
                    for (int64_t t = 0; t < T; t++) sum += row[t] = exp(row[t] - mx);
                    for (int64_t t = 0; t < T; t++)
                        for (int64_t c = 0; c < dv; c++) y[c] += row[t] / sum * v[n * vs[0] + h * vs[1] + t * vs[2] + c];
                }
        int64_t dims[6] = {N, H, S, T, dk, dv}, yd[4] = {N, S, H, dv};
        mts_attr at[9];
        memset(at, 0, sizeof at);
        const char *names[7] = {"dims", "q_strides", "k_strides", "v_strides", "y_strides", "m_strides", "y_dims"};
        const int64_t *vals[7] = {dims, qs, ks, vs, ys, ms, yd};
        int ns[7] = {6, 4, 4, 4, 4, 4, 4};
        for (int i = 0; i < 7; i++) at[i].name = names[i], at[i].type = MTS_ATTR_INTS, at[i].n = ns[i], at[i].ints = vals[i];
        at[7].name = "alpha", at[7].type = MTS_ATTR_FLOAT, at[7].f = alpha;
        at[8].name = "beta", at[8].type = MTS_ATTR_FLOAT, at[8].f = beta;
        int io[5] = {0, 1, 2, 3, 4};
        mts_node nd = {0};
        nd.name = "t", nd.op_type = "MtsAttention", nd.domain = "", nd.opset = 1;
        nd.n_in = use_mask ? 4 : 3, nd.n_out = 1, nd.in = io, nd.out = io + 4, nd.attrs = at, nd.n_attr = 9;
        int64_t qd[4] = {N, bert ? S : H, bert ? H : S, dk}, kd[4] = {N, bert ? T : H, bert ? H : T, dk},
                vd[4] = {N, bert ? T : H, bert ? H : T, dv}, md[4] = {N, 1, 1, T};
        mts_tensor tq = {MTS_DTYPE_FLOAT, 4, {0}, q}, tk = {MTS_DTYPE_FLOAT, 4, {0}, k}, tv = {MTS_DTYPE_FLOAT, 4, {0}, v},
                   tm = {MTS_DTYPE_FLOAT, 4, {0}, m};
        memcpy(tq.dims, qd, sizeof qd), memcpy(tk.dims, kd, sizeof kd), memcpy(tv.dims, vd, sizeof vd),
            memcpy(tm.dims, md, sizeof md);
        const mts_tensor *in[4] = {&tq, &tk, &tv, &tm};
        for (int th = 1; th <= MAX_THREADS; th++) {
            mts_err err = {0};
            mts_tensor out = {0};
            mts_kctx kc = {&nd, in, nd.n_in, &out, 1, &err, th, NULL};
            if (mts_fast_attention.infer(&kc)) fail_msg("infer: %s", err.msg);
            assert_int_equal(out.rank, 4);
            out.data = calloc((size_t)(N * S * H * dv), sizeof(float));
            if (mts_fast_attention.run(&kc)) fail_msg("run: %s", err.msg);
            char what[128];
            snprintf(what, sizeof what, "attention N%lld H%lld S%lld T%lld dk%lld dv%lld %s%s threads %d", (long long)N,
                     (long long)H, (long long)S, (long long)T, (long long)dk, (long long)dv, bert ? "bert" : "plain",
                     use_mask ? " masked" : "", th);
            expect_close(out.data, ref, N * S * H * dv, 2e-6, what);
            free(out.data);
        }
        /* a view reaching past its tensor is refused */
        int64_t bad[4] = {qs[0], qs[1], qs[2], qs[3] + 1000000};
        at[1].ints = bad;
        {
            mts_err err = {0};
            mts_tensor out = {0};
            mts_kctx kc = {&nd, in, nd.n_in, &out, 1, &err, 1, NULL};
            assert_int_equal(mts_fast_attention.infer(&kc), MTS_OK);
            out.data = calloc((size_t)(N * S * H * dv), sizeof(float));
            assert_true(mts_fast_attention.run(&kc) < 0);
            free(out.data);
        }
        free(q), free(k), free(v), free(m), free(ref), free(row);
    }
}

static void test_small_gemm(void **state)
{
    (void)state;
    if (!mts_small_gemm_ok(16, 384, 384)) skip(); /* no AVX-512: the kernel is not used */
    static const int64_t Ks[] = {1, 7, 64, 384};
    for (int iter = 0; iter < 40; iter++) {
        /* the first iterations take 1-12 rows (every tile shape of the last rows), N up to nine
         * panels (groups of four, two and one panel) */
        int64_t rows = iter < 24 ? 1 + iter % 12 : 1 + irand(128), K = Ks[irand(4)], N = 32 * (1 + irand(9));
        bool tr = irand(2), has_bias = irand(3) != 0;
        mts_dpost post[2] = {{0}};
        int n_post = irand(4); /* 0: none, 1: GELU, 2: GELU then Add, 3: Add then GELU */
        if (n_post == 1) post[0].kind = MTS_DPOST_GELU;
        if (n_post == 2) post[0].kind = MTS_DPOST_GELU, post[1].kind = MTS_DPOST_ADD;
        if (n_post == 3) post[0].kind = MTS_DPOST_ADD, post[1].kind = MTS_DPOST_GELU;
        int np = n_post == 0 ? 0 : n_post == 1 ? 1 : 2;
        assert_true(mts_small_gemm_ok(rows, K, N) && mts_small_gemm_posts_ok(post, np));
        float *a = frands(rows * K, -1, 1), *w = frands(K * N, -1, 1), *b = frands(N, -1, 1), *r = frands(rows * N, -2, 2);
        double *ref = malloc(sizeof(double) * (size_t)(rows * N));
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = has_bias ? b[j] : 0;
                for (int64_t k = 0; k < K; k++) s += (double)a[i * K + k] * (tr ? w[j * K + k] : w[k * N + j]);
                for (int q = 0; q < np; q++)
                    s = post[q].kind == MTS_DPOST_GELU ? s * 0.5 * (1 + erf(s / sqrt(2.0))) : s + r[i * N + j];
                ref[i * N + j] = s;
            }
        float *packed = mts_small_gemm_pack(w, tr, K, N);
        assert_non_null(packed);
        const float *resid[1] = {r};
        for (int th = 1; th <= MAX_THREADS; th++) {
            float *c = calloc((size_t)(rows * N), sizeof(float));
            mts_small_gemm_run(a, rows, K, N, packed, false, has_bias ? b : NULL, post, np, resid, c, th);
            char what[96];
            snprintf(what, sizeof what, "small GEMM %lldx%lldx%lld%s posts %d threads %d", (long long)rows, (long long)K,
                     (long long)N, tr ? " transposed" : "", n_post, th);
            expect_close(c, ref, rows * N, 2e-6, what);
            /* a row computed alone is bit-identical to the same row in the batch */
            int64_t i = irand((int)rows);
            float *c1 = calloc((size_t)N, sizeof(float));
            const float *resid1[1] = {r + i * N};
            mts_small_gemm_run(a + i * K, 1, K, N, packed, false, has_bias ? b : NULL, post, np, resid1, c1, th);
            if (memcmp(c1, c + i * N, sizeof(float) * (size_t)N))
                fail_msg("%s: row %lld alone differs from the batch", what, (long long)i);
            free(c1);
            /* a row map (a padding-free run): the listed rows as in the whole product, bit for
             * bit, the others untouched */
            int32_t *map = malloc(sizeof(int32_t) * (size_t)rows);
            uint8_t *in_map = calloc((size_t)rows, 1);
            int64_t nm = 0;
            for (int64_t x = 0; x < rows; x++)
                if (irand(2) || (x == rows - 1 && nm == 0)) map[nm++] = (int32_t)x, in_map[x] = 1;
            float *cm = malloc(sizeof(float) * (size_t)(rows * N));
            for (int64_t x = 0; x < rows * N; x++) cm[x] = 7.0f;
            mts_small_gemm_run_map(a, map, nm, K, N, packed, false, has_bias ? b : NULL, post, np, resid, cm, th);
            for (int64_t x = 0; x < rows; x++) {
                if (in_map[x] && memcmp(cm + x * N, c + x * N, sizeof(float) * (size_t)N))
                    fail_msg("%s: mapped row %lld differs from the whole product", what, (long long)x);
                for (int64_t y = 0; !in_map[x] && y < N; y++)
                    if (cm[x * N + y] != 7.0f) fail_msg("%s: unmapped row %lld was written", what, (long long)x);
            }
            free(map), free(in_map), free(cm);
            free(c);
        }
        /* half weights: bit for bit the float product on the weights rounded to half (the
         * widening is exact and the multiply-adds run in the same order), whole and mapped */
        bool fits = false;
        uint16_t *ph = mts_small_gemm_pack_half(w, tr, K, N, &fits);
        assert_true(fits);
        assert_non_null(ph);
        for (int64_t x = 0; x < K * N; x++) w[x] = mts_f16_to_f32(mts_f32_to_f16(w[x]));
        float *pr = mts_small_gemm_pack(w, tr, K, N);
        assert_non_null(pr);
        for (int th = 1; th <= MAX_THREADS; th++) {
            float *ch = calloc((size_t)(rows * N), sizeof(float)), *cr = calloc((size_t)(rows * N), sizeof(float));
            mts_small_gemm_run(a, rows, K, N, ph, true, has_bias ? b : NULL, post, np, resid, ch, th);
            mts_small_gemm_run(a, rows, K, N, pr, false, has_bias ? b : NULL, post, np, resid, cr, th);
            if (memcmp(ch, cr, sizeof(float) * (size_t)(rows * N)))
                fail_msg("half-weight small GEMM %lldx%lldx%lld threads %d differs from float on rounded weights",
                         (long long)rows, (long long)K, (long long)N, th);
            int32_t one = (int32_t)irand((int)rows);
            float *cm = calloc((size_t)(rows * N), sizeof(float));
            mts_small_gemm_run_map(a, &one, 1, K, N, ph, true, has_bias ? b : NULL, post, np, resid, cm, th);
            if (memcmp(cm + one * N, cr + one * N, sizeof(float) * (size_t)N))
                fail_msg("half-weight mapped row %d differs", (int)one);
            free(ch), free(cr), free(cm);
        }
        free(ph), free(pr);
        free(packed), free(a), free(w), free(b), free(r), free(ref);
    }
    /* every finite half value survives the widening and the packing's rounding back (an F16
     * GGUF file's weights reach the half panels unchanged) */
    for (uint32_t h = 0; h < 0x10000; h++)
        if ((h & 0x7c00) != 0x7c00 && mts_f32_to_f16(mts_f16_to_f32((uint16_t)h)) != h)
            fail_msg("half 0x%04x does not round-trip", (unsigned)h);
    /* weights half cannot hold are refused, so the step keeps float weights */
    float big[32 * 2] = {0};
    big[5] = 70000.0f;
    bool fits = true;
    assert_null(mts_small_gemm_pack_half(big, false, 2, 32, &fits));
    assert_false(fits);
    big[5] = NAN;
    fits = true;
    assert_null(mts_small_gemm_pack_half(big, false, 2, 32, &fits));
    assert_false(fits);
    big[5] = 65504.0f;
    uint16_t *okh = mts_small_gemm_pack_half(big, false, 2, 32, &fits);
    assert_true(fits);
    assert_non_null(okh);
    free(okh);
    assert_false(mts_small_gemm_ok(MTS_SMALL_GEMM_ROWS + 1, 384, 384));
    if (mts_small_gemm_ok(16, 384, 384)) { /* (AVX-512 machines) */
        assert_true(mts_small_gemm_ok(MTS_SMALL_GEMM_ROWS, 384, 1536));
        assert_false(mts_small_gemm_ok(MTS_SMALL_GEMM_ROWS, 1024, 1024)); /* large weights: oneDNN */
        assert_true(mts_small_gemm_ok(MTS_SMALL_GEMM_ROWS_SMALL, 1024, 1024));
    }
    assert_false(mts_small_gemm_ok(16, 384, 100));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_small_gemm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
