/*
 * Tensors: element types (numbered as ONNX's TensorProto.DataType), shapes and a plain tensor
 * view. A tensor never owns its data: the model, the plan, an execution context or a request
 * does. Every layer uses this type (the JSON and .npy codecs, the server's requests, the
 * engine), so it lives at the bottom, in util; what only the engine needs about it (the types
 * it computes with, typed element reads for kernels) is in engine/tensor.h.
 */
#ifndef MTS_UTIL_TENSOR_H
#define MTS_UTIL_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum mts_dtype {
    MTS_DTYPE_UNDEFINED = 0,
    MTS_DTYPE_FLOAT = 1,
    MTS_DTYPE_UINT8 = 2,
    MTS_DTYPE_INT8 = 3,
    MTS_DTYPE_UINT16 = 4,
    MTS_DTYPE_INT16 = 5,
    MTS_DTYPE_INT32 = 6,
    MTS_DTYPE_INT64 = 7,
    MTS_DTYPE_STRING = 8,
    MTS_DTYPE_BOOL = 9,
    MTS_DTYPE_FLOAT16 = 10,
    MTS_DTYPE_DOUBLE = 11,
    MTS_DTYPE_UINT32 = 12,
    MTS_DTYPE_UINT64 = 13,
    MTS_DTYPE_COMPLEX64 = 14,
    MTS_DTYPE_COMPLEX128 = 15,
    MTS_DTYPE_BFLOAT16 = 16,
    /* Not ONNX element types: the engine's sequence, optional and string-tensor values, held as
     * byte blobs (rank 1, dims[0] bytes; engine/seqval.h). A model's string (8) tensors are
     * MTS_DTYPE_STRINGS values. */
    MTS_DTYPE_SEQUENCE = 100,
    MTS_DTYPE_OPTIONAL = 101,
    MTS_DTYPE_STRINGS = 102,
} mts_dtype;

#define MTS_MAX_RANK 8

typedef struct mts_tensor {
    mts_dtype dtype;
    int rank;
    int64_t dims[MTS_MAX_RANK];
    void *data; /* NULL while the value is unknown (shape inference before run time) */
} mts_tensor;

/* Size in bytes of one element; 0 for types the engine cannot hold (string, undefined). */
size_t mts_dtype_size(mts_dtype t);
/* ONNX spelling of the type ("float", "int64", ...), or "type N" for unknown codes. */
const char *mts_dtype_name(mts_dtype t);

/* Number of elements (1 for a scalar). Returns -1 if a dimension is negative or the product
 * overflows int64 — callers must treat that as malformed input. */
int64_t mts_tensor_numel(const mts_tensor *t);
/* Bytes needed for the data, or -1 on overflow / unsupported dtype. */
int64_t mts_tensor_nbytes(const mts_tensor *t);
bool mts_shape_equal(const mts_tensor *a, const mts_tensor *b);

/* Half-precision conversions. float16 (IEEE binary16) and bfloat16 are 16-bit patterns; the
 * narrowing conversions round to nearest, ties to even, keep NaN a (quiet) NaN and the sign,
 * and give infinity past the largest finite value. The double versions round once (no double
 * rounding through float). */
float mts_f16_to_f32(uint16_t h);
uint16_t mts_f32_to_f16(float f);
uint16_t mts_f64_to_f16(double d);
float mts_bf16_to_f32(uint16_t h);
uint16_t mts_f64_to_bf16(double d);
/* Inline: per-element loops (the bf16-writing Concat, half.c's conversions) call it. */
static inline uint16_t mts_f32_to_bf16(float f)
{
    union {
        float f;
        uint32_t u;
    } b = {f};
    uint32_t x = b.u;
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}
/* n floats to bfloat16, bit for bit as mts_f32_to_bf16 (AVX-512 where the CPU has it). */
void mts_f32_to_bf16_n(const float *src, uint16_t *dst, int64_t n);
/* True for float16 and bfloat16. */
bool mts_dtype_is_half(mts_dtype t);
/* Writes "[1,3,224,224]" into buf. */
const char *mts_shape_str(const mts_tensor *t, char *buf, size_t len);

#endif
