/*
 * Element types (sizes and ONNX names), float16/bfloat16 conversions and shape arithmetic with
 * overflow checks (see tensor.h). The bulk float-to-bfloat16 conversion has an AVX-512 form
 * (integer rounding on 16 lanes, the same bits as the scalar one, subnormals included, which the
 * AVX512-BF16 instruction would flush), chosen at run time.
 */
#include "util/tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

size_t mts_dtype_size(mts_dtype t)
{
    switch (t) {
    case MTS_DTYPE_FLOAT: case MTS_DTYPE_INT32: case MTS_DTYPE_UINT32: return 4;
    case MTS_DTYPE_UINT8: case MTS_DTYPE_INT8: case MTS_DTYPE_BOOL: return 1;
    case MTS_DTYPE_SEQUENCE: case MTS_DTYPE_OPTIONAL: case MTS_DTYPE_STRINGS: return 1; /* blob bytes */
    case MTS_DTYPE_UINT16: case MTS_DTYPE_INT16: case MTS_DTYPE_FLOAT16: case MTS_DTYPE_BFLOAT16: return 2;
    case MTS_DTYPE_INT64: case MTS_DTYPE_DOUBLE: case MTS_DTYPE_UINT64: return 8;
    default: return 0;
    }
}

const char *mts_dtype_name(mts_dtype t)
{
    switch (t) {
    case MTS_DTYPE_FLOAT: return "float";
    case MTS_DTYPE_UINT8: return "uint8";
    case MTS_DTYPE_INT8: return "int8";
    case MTS_DTYPE_UINT16: return "uint16";
    case MTS_DTYPE_INT16: return "int16";
    case MTS_DTYPE_INT32: return "int32";
    case MTS_DTYPE_INT64: return "int64";
    case MTS_DTYPE_STRING: return "string";
    case MTS_DTYPE_BOOL: return "bool";
    case MTS_DTYPE_FLOAT16: return "float16";
    case MTS_DTYPE_DOUBLE: return "double";
    case MTS_DTYPE_UINT32: return "uint32";
    case MTS_DTYPE_UINT64: return "uint64";
    case MTS_DTYPE_COMPLEX64: return "complex64";
    case MTS_DTYPE_COMPLEX128: return "complex128";
    case MTS_DTYPE_BFLOAT16: return "bfloat16";
    case MTS_DTYPE_SEQUENCE: return "sequence";
    case MTS_DTYPE_OPTIONAL: return "optional";
    case MTS_DTYPE_STRINGS: return "string";
    default: return "undefined";
    }
}

int64_t mts_tensor_numel(const mts_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        int64_t d = t->dims[i];
        if (d < 0) return -1;
        if (d != 0 && n > INT64_MAX / d) return -1;
        n *= d;
    }
    return n;
}

int64_t mts_tensor_nbytes(const mts_tensor *t)
{
    int64_t n = mts_tensor_numel(t);
    size_t es = mts_dtype_size(t->dtype);
    if (n < 0 || es == 0) return -1;
    if (n > INT64_MAX / (int64_t)es) return -1;
    return n * (int64_t)es;
}

bool mts_shape_equal(const mts_tensor *a, const mts_tensor *b)
{
    if (a->rank != b->rank) return false;
    return memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->rank) == 0;
}

const char *mts_shape_str(const mts_tensor *t, char *buf, size_t len)
{
    size_t off = 0;
    if (len == 0) return buf;
    buf[0] = '\0';
    off += (size_t)snprintf(buf + off, len - off, "[");
    for (int i = 0; i < t->rank && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, i ? ",%lld" : "%lld", (long long)t->dims[i]);
    if (off < len) snprintf(buf + off, len - off, "]");
    return buf;
}

bool mts_dtype_is_half(mts_dtype t)
{
    return t == MTS_DTYPE_FLOAT16 || t == MTS_DTYPE_BFLOAT16;
}

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float mts_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13)); /* inf / NaN (payload kept) */
    if (e == 0) {                                                     /* zero / subnormal: m * 2^-24 */
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t mts_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu)); /* NaN stays NaN */
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                       /* >= 65520: inf */
    if (x < 0x38800000u) {                                                          /* below 2^-14 */
        float r = nearbyintf(bits_f32(x) * 16777216.0f); /* multiples of 2^-24, ties to even */
        return (uint16_t)(sign | (uint16_t)r);
    }
    x += 0xfffu + ((x >> 13) & 1u); /* round the 13 dropped bits to nearest even */
    return (uint16_t)(sign | ((x - (112u << 23)) >> 13));
}

/* d rounded toward zero to float, with the lowest bit set when inexact ("round to odd"): a
 * later rounding to a format at least two bits narrower is then the correct rounding of d. */
static float f64_to_f32_odd(double d)
{
    if (d != d) return (float)d;
    float f = (float)d;
    if (fabs((double)f) > fabs(d)) f = nextafterf(f, 0.0f);
    if ((double)f != d) f = bits_f32(f32_bits(f) | 1u);
    return f;
}

uint16_t mts_f64_to_f16(double d)
{
    return mts_f32_to_f16(f64_to_f32_odd(d));
}

float mts_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t mts_f64_to_bf16(double d)
{
    return mts_f32_to_bf16(f64_to_f32_odd(d));
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* Round to nearest even on the bit pattern, as mts_f32_to_bf16: the upper half of x + 0x7fff +
 * (bit 16 of x), or for a NaN its upper half with the quiet bit set. */
__attribute__((target("avx512f"))) static inline __m512i bf16_round16(__m512i x)
{
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
    __m512i hi = _mm512_srli_epi32(x, 16);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs_mask), inf);
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
}

/* Full vectors narrowed in a register and stored plainly (the masked narrowing store, vpmovdw
 * to memory, took 1.4x as long on a Zen 5 EPYC); the tail with masks. */
__attribute__((target("avx512f"))) static void f32_to_bf16_avx512(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((void *)(dst + i), _mm512_cvtepi32_epi16(bf16_round16(_mm512_loadu_si512(src + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, bf16_round16(_mm512_maskz_loadu_epi32(m, src + i)));
    }
}

static bool has_avx512f(void)
{
    static int v = -1;
    int got = __atomic_load_n(&v, __ATOMIC_RELAXED);
    if (got < 0) {
        __builtin_cpu_init();
        got = __builtin_cpu_supports("avx512f") ? 1 : 0;
        __atomic_store_n(&v, got, __ATOMIC_RELAXED);
    }
    return got == 1;
}
#endif

void mts_f32_to_bf16_n(const float *src, uint16_t *dst, int64_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (has_avx512f()) {
        f32_to_bf16_avx512(src, dst, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) dst[i] = mts_f32_to_bf16(src[i]);
}
