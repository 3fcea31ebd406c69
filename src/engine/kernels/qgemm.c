/*
 * The integer GEMM of the quantized ops (qgemm.h): operand packing, the zero-point and
 * signedness compensation, and two micro-kernels over the packed panels: AVX-512 VNNI
 * (vpdpbusd, 6 rows x 32 columns) chosen at run time when the CPU has it, and a portable C
 * loop with the same results.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/qgemm.h"
#include "util/status.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QG_X86 1
#endif

#define MR 6

int mts_qpack_a_alloc(mts_qpack_a *pa, int64_t M, int64_t K)
{
    memset(pa, 0, sizeof *pa);
    pa->M = M, pa->K = K, pa->K4 = (K + 3) / 4 * 4;
    size_t m = (size_t)(M > 0 ? M : 1);
    pa->data = malloc(m * (size_t)(pa->K4 > 0 ? pa->K4 : 4));
    pa->azp = malloc(m * sizeof(int32_t));
    pa->rowsum = malloc(m * sizeof(int32_t));
    if (!pa->data || !pa->azp || !pa->rowsum) {
        mts_qpack_a_free(pa);
        return MTS_ENOMEM;
    }
    return MTS_OK;
}

void mts_qpack_a_free(mts_qpack_a *pa)
{
    free(pa->data);
    free(pa->azp);
    free(pa->rowsum);
    memset(pa, 0, sizeof *pa);
}

int mts_qpack_b_alloc(mts_qpack_b *pb, int64_t K, int64_t N)
{
    memset(pb, 0, sizeof *pb);
    pb->K = K, pb->N = N, pb->K4 = (K + 3) / 4 * 4, pb->np = (N + MTS_QGEMM_NR - 1) / MTS_QGEMM_NR;
    size_t cols = (size_t)(pb->np > 0 ? pb->np : 1) * MTS_QGEMM_NR;
    pb->data = malloc(cols * (size_t)(pb->K4 > 0 ? pb->K4 : 4));
    pb->bzp = malloc(cols * sizeof(int32_t));
    pb->cterm = malloc(cols * sizeof(int32_t));
    if (!pb->data || !pb->bzp || !pb->cterm) {
        mts_qpack_b_free(pb);
        return MTS_ENOMEM;
    }
    return MTS_OK;
}

void mts_qpack_b_free(mts_qpack_b *pb)
{
    free(pb->data);
    free(pb->bzp);
    free(pb->cterm);
    memset(pb, 0, sizeof *pb);
}

void mts_qpack_a_fill(mts_qpack_a *pa, const void *a, bool is_signed, int64_t lda, const int32_t *zp,
                      int64_t zp_stride)
{
    for (int64_t i = 0; i < pa->M; i++) {
        uint8_t *d = pa->data + i * pa->K4;
        uint32_t sum = 0;
        if (is_signed) {
            const int8_t *s = (const int8_t *)a + i * lda;
            for (int64_t k = 0; k < pa->K; k++) d[k] = (uint8_t)(s[k] + 128);
        } else {
            memcpy(d, (const uint8_t *)a + i * lda, (size_t)pa->K);
        }
        for (int64_t k = pa->K; k < pa->K4; k++) d[k] = 0;
        for (int64_t k = 0; k < pa->K; k++) sum += d[k];
        pa->rowsum[i] = (int32_t)sum;
        pa->azp[i] = (zp ? zp[i * zp_stride] : 0) + (is_signed ? 128 : 0);
    }
}

#ifdef QG_X86
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
static bool use_vnni(void);

/* Column sums of one packed panel: vpdpbusd with a vector of ones sums each column's 4 bytes. */
static VNNI_TARGET void panel_sums_vnni(const int8_t *panel, int64_t kq, int32_t *sum)
{
    __m512i acc = _mm512_setzero_si512(), ones = _mm512_set1_epi8(1);
    for (int64_t q = 0; q < kq; q++)
        acc = _mm512_dpbusd_epi32(acc, ones, _mm512_loadu_si512((const void *)(panel + q * 4 * MTS_QGEMM_NR)));
    _mm512_storeu_si512((void *)sum, acc);
}
#endif

/* Column sums of the packed (shifted) values and the column terms, for zero points pb->bzp. */
static void b_terms(mts_qpack_b *pb)
{
    int64_t kq = pb->K4 / 4;
    for (int64_t p = 0; p < pb->np; p++) {
        const int8_t *panel = pb->data + p * kq * 4 * MTS_QGEMM_NR;
        int32_t sum[MTS_QGEMM_NR] = {0};
#ifdef QG_X86
        if (use_vnni()) {
            panel_sums_vnni(panel, kq, sum);
        } else
#endif
        {
            uint32_t us[MTS_QGEMM_NR] = {0};
            for (int64_t q = 0; q < kq; q++)
                for (int j = 0; j < MTS_QGEMM_NR; j++)
                    for (int r = 0; r < 4; r++) us[j] += (uint32_t)(int32_t)panel[(q * MTS_QGEMM_NR + j) * 4 + r];
            for (int j = 0; j < MTS_QGEMM_NR; j++) sum[j] = (int32_t)us[j];
        }
        for (int j = 0; j < MTS_QGEMM_NR; j++) {
            int64_t c = p * MTS_QGEMM_NR + j;
            pb->cterm[c] = (int32_t)((uint32_t)sum[j] - (uint32_t)pb->K * (uint32_t)pb->bzp[c]);
        }
    }
}

/* Interleaves 4 rows of 16 bytes into 16 groups of 4 (one k-quad of a panel), flipping the
 * sign bit (uint8 -> int8 shifted by -128) when flip is 0x80. */
static void quad16(const uint8_t *r0, const uint8_t *r1, const uint8_t *r2, const uint8_t *r3, uint8_t flip,
                   int8_t *dst)
{
#ifdef QG_X86
    __m128i f = _mm_set1_epi8((char)flip);
    __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)r0), f);
    __m128i b = _mm_xor_si128(_mm_loadu_si128((const __m128i *)r1), f);
    __m128i c = _mm_xor_si128(_mm_loadu_si128((const __m128i *)r2), f);
    __m128i d = _mm_xor_si128(_mm_loadu_si128((const __m128i *)r3), f);
    __m128i t0 = _mm_unpacklo_epi8(a, b), t1 = _mm_unpackhi_epi8(a, b);
    __m128i t2 = _mm_unpacklo_epi8(c, d), t3 = _mm_unpackhi_epi8(c, d);
    _mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi16(t0, t2));
    _mm_storeu_si128((__m128i *)(dst + 16), _mm_unpackhi_epi16(t0, t2));
    _mm_storeu_si128((__m128i *)(dst + 32), _mm_unpacklo_epi16(t1, t3));
    _mm_storeu_si128((__m128i *)(dst + 48), _mm_unpackhi_epi16(t1, t3));
#else
    for (int j = 0; j < 16; j++) {
        dst[4 * j] = (int8_t)(r0[j] ^ flip);
        dst[4 * j + 1] = (int8_t)(r1[j] ^ flip);
        dst[4 * j + 2] = (int8_t)(r2[j] ^ flip);
        dst[4 * j + 3] = (int8_t)(r3[j] ^ flip);
    }
#endif
}

void mts_qpack_b_fill(mts_qpack_b *pb, const void *b, bool is_signed, int64_t ldb, const int32_t *zp,
                      int64_t zp_stride)
{
    int64_t kq = pb->K4 / 4;
    uint8_t flip = is_signed ? 0 : 0x80;
    uint8_t padrow[MTS_QGEMM_NR]; /* a row of k >= K: flips to 0 */
    memset(padrow, flip, sizeof padrow);
    const uint8_t *src = b;
    for (int64_t p = 0; p < pb->np; p++) {
        int8_t *panel = pb->data + p * kq * 4 * MTS_QGEMM_NR;
        int64_t j0 = p * MTS_QGEMM_NR, nj = pb->N - j0 < MTS_QGEMM_NR ? pb->N - j0 : MTS_QGEMM_NR;
        for (int64_t q = 0; q < kq; q++) {
            const uint8_t *r[4];
            uint8_t tmp[4][MTS_QGEMM_NR];
            for (int i = 0; i < 4; i++) {
                int64_t k = 4 * q + i;
                if (k >= pb->K) {
                    r[i] = padrow;
                } else if (nj == MTS_QGEMM_NR) {
                    r[i] = src + k * ldb + j0;
                } else {
                    memset(tmp[i], flip, sizeof tmp[i]);
                    memcpy(tmp[i], src + k * ldb + j0, (size_t)nj);
                    r[i] = tmp[i];
                }
            }
            quad16(r[0], r[1], r[2], r[3], flip, panel + q * 4 * MTS_QGEMM_NR);
        }
        for (int j = 0; j < MTS_QGEMM_NR; j++) {
            int64_t c = j0 + j;
            pb->bzp[c] = c < pb->N ? (zp ? zp[c * zp_stride] : 0) - (is_signed ? 0 : 128) : 0;
        }
    }
    b_terms(pb);
}

/* ------------------------------------------------------------------------------------------ */

/* Portable micro-kernel: rows [i0, i0 + mr) x panel p. */
static void kern_portable(const mts_qpack_a *pa, const mts_qpack_b *pb, int64_t i0, int mr, int64_t p, int32_t *c,
                          int64_t ldc)
{
    int64_t kq = pb->K4 / 4, j0 = p * MTS_QGEMM_NR;
    int nj = (int)(pb->N - j0 < MTS_QGEMM_NR ? pb->N - j0 : MTS_QGEMM_NR);
    const int8_t *panel = pb->data + p * kq * 4 * MTS_QGEMM_NR;
    for (int r = 0; r < mr; r++) {
        const uint8_t *a = pa->data + (i0 + r) * pa->K4;
        uint32_t acc[MTS_QGEMM_NR] = {0};
        for (int64_t q = 0; q < kq; q++) {
            const int8_t *bq = panel + q * 4 * MTS_QGEMM_NR;
            int32_t a0 = a[4 * q], a1 = a[4 * q + 1], a2 = a[4 * q + 2], a3 = a[4 * q + 3];
            for (int j = 0; j < MTS_QGEMM_NR; j++)
                acc[j] += (uint32_t)(a0 * bq[4 * j] + a1 * bq[4 * j + 1] + a2 * bq[4 * j + 2] + a3 * bq[4 * j + 3]);
        }
        uint32_t rs = (uint32_t)pa->rowsum[i0 + r], az = (uint32_t)pa->azp[i0 + r];
        int32_t *cr = c + (i0 + r) * ldc + j0;
        for (int j = 0; j < nj; j++)
            cr[j] = (int32_t)(acc[j] - (uint32_t)pb->bzp[j0 + j] * rs - az * (uint32_t)pb->cterm[j0 + j]);
    }
}

#ifdef QG_X86
/* Rows [i0, i0 + MRC) x panels [p, p + NB): the accumulators stay in registers once MRC and NB
 * are constants (the callers below pass literals). */
static inline __attribute__((always_inline)) VNNI_TARGET void kern_vnni_t(const mts_qpack_a *pa,
                                                                          const mts_qpack_b *pb, int64_t i0,
                                                                          const int MRC, int64_t p, const int NB,
                                                                          int32_t *c, int64_t ldc)
{
    int64_t kq = pb->K4 / 4, pstride = kq * 4 * MTS_QGEMM_NR;
    const int8_t *b0 = pb->data + p * pstride;
    const uint8_t *a = pa->data + i0 * pa->K4;
    int64_t lda = pa->K4;
    __m512i acc[MR][2];
    _Pragma("GCC unroll 6") for (int r = 0; r < MRC; r++)
        _Pragma("GCC unroll 2") for (int q = 0; q < NB; q++) acc[r][q] = _mm512_setzero_si512();
    for (int64_t k = 0; k < kq; k++) {
        __m512i bv[2];
        _Pragma("GCC unroll 2") for (int q = 0; q < NB; q++) bv[q] = _mm512_loadu_si512((const void *)(b0 + q * pstride + k * 64));
        _Pragma("GCC unroll 6") for (int r = 0; r < MRC; r++) {
            int32_t av;
            memcpy(&av, a + r * lda + 4 * k, 4);
            __m512i ab = _mm512_set1_epi32(av);
            _Pragma("GCC unroll 2") for (int q = 0; q < NB; q++) acc[r][q] = _mm512_dpbusd_epi32(acc[r][q], ab, bv[q]);
        }
    }
    _Pragma("GCC unroll 2") for (int q = 0; q < NB; q++) {
        int64_t j0 = (p + q) * MTS_QGEMM_NR;
        int64_t nj = pb->N - j0 < MTS_QGEMM_NR ? pb->N - j0 : MTS_QGEMM_NR;
        __mmask16 m = (__mmask16)((1u << nj) - 1u);
        __m512i bz = _mm512_loadu_si512((const void *)(pb->bzp + j0));
        __m512i ct = _mm512_loadu_si512((const void *)(pb->cterm + j0));
        _Pragma("GCC unroll 6") for (int r = 0; r < MRC; r++) {
            __m512i v = acc[r][q];
            v = _mm512_sub_epi32(v, _mm512_mullo_epi32(bz, _mm512_set1_epi32(pa->rowsum[i0 + r])));
            v = _mm512_sub_epi32(v, _mm512_mullo_epi32(ct, _mm512_set1_epi32(pa->azp[i0 + r])));
            _mm512_mask_storeu_epi32(c + (i0 + r) * ldc + j0, m, v);
        }
    }
}

static VNNI_TARGET void kern_vnni(const mts_qpack_a *pa, const mts_qpack_b *pb, int64_t i0, int mr, int64_t p, int nb,
                                  int32_t *c, int64_t ldc)
{
#define QG_CASE(R)                                                         \
    case R:                                                                \
        if (nb == 2) kern_vnni_t(pa, pb, i0, R, p, 2, c, ldc);             \
        else kern_vnni_t(pa, pb, i0, R, p, 1, c, ldc);                     \
        break;
    switch (mr) {
        QG_CASE(1)
        QG_CASE(2)
        QG_CASE(3)
        QG_CASE(4)
        QG_CASE(5)
        QG_CASE(6)
    default:
        break;
    }
#undef QG_CASE
}
#endif

static mts_qgemm_kernel g_kernel = MTS_QGEMM_AUTO;

static bool have_vnni(void)
{
#ifdef QG_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

bool mts_qgemm_force_kernel(mts_qgemm_kernel k)
{
    if (k == MTS_QGEMM_VNNI && !have_vnni()) return false;
    g_kernel = k;
    return true;
}

#ifdef QG_X86
static bool use_vnni(void)
{
    static atomic_int cached = -1; /* every thread that races here stores the same value */
    if (g_kernel == MTS_QGEMM_PORTABLE) return false;
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c < 0) atomic_store_explicit(&cached, c = have_vnni(), memory_order_relaxed);
    return c;
}
#endif

void mts_qgemm(const mts_qpack_a *pa, const mts_qpack_b *pb, int64_t i0, int64_t i1, int32_t *c, int64_t ldc)
{
    if (pb->N <= 0 || i1 <= i0) return;
#ifdef QG_X86
    if (use_vnni()) {
        for (int64_t p = 0; p < pb->np; p += 2) {
            int nb = pb->np - p >= 2 ? 2 : 1;
            for (int64_t i = i0; i < i1; i += MR) {
                int mr = (int)(i1 - i < MR ? i1 - i : MR);
                kern_vnni(pa, pb, i, mr, p, nb, c, ldc);
            }
        }
        return;
    }
#endif
    for (int64_t p = 0; p < pb->np; p++)
        for (int64_t i = i0; i < i1; i += MR) kern_portable(pa, pb, i, (int)(i1 - i < MR ? i1 - i : MR), p, c, ldc);
}
