/*
 * Element types (sizes and ONNX names), float16/bfloat16 conversions and shape arithmetic with
 * overflow checks (see tensor.h).
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
