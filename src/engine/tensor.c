/*
 * The engine's part of the tensor helpers (engine/tensor.h): the set of element types the
 * kernels compute with, and typed element access used by the kernels that read small index
 * tensors (shapes, axes, indices) whatever their integer type.
 */
#include "engine/tensor.h"

bool mts_dtype_supported(mts_dtype t)
{
    switch (t) {
    case MTS_DTYPE_FLOAT: case MTS_DTYPE_UINT8: case MTS_DTYPE_INT8: case MTS_DTYPE_UINT16:
    case MTS_DTYPE_INT16: case MTS_DTYPE_INT32: case MTS_DTYPE_INT64: case MTS_DTYPE_BOOL:
    case MTS_DTYPE_FLOAT16: case MTS_DTYPE_DOUBLE: case MTS_DTYPE_UINT32: case MTS_DTYPE_UINT64:
    case MTS_DTYPE_BFLOAT16:
    case MTS_DTYPE_SEQUENCE: case MTS_DTYPE_OPTIONAL: case MTS_DTYPE_STRINGS: /* blobs (engine/seqval.h) */
        return true;
    default:
        return false;
    }
}

bool mts_dtype_core(mts_dtype t)
{
    return t == MTS_DTYPE_FLOAT || t == MTS_DTYPE_UINT8 || t == MTS_DTYPE_INT8 || t == MTS_DTYPE_INT32 ||
           t == MTS_DTYPE_INT64 || t == MTS_DTYPE_BOOL;
}

int64_t mts_tensor_get_int(const mts_tensor *t, int64_t i)
{
    const void *p = t->data;
    switch (t->dtype) {
    case MTS_DTYPE_INT64: return ((const int64_t *)p)[i];
    case MTS_DTYPE_INT32: return ((const int32_t *)p)[i];
    case MTS_DTYPE_INT16: return ((const int16_t *)p)[i];
    case MTS_DTYPE_INT8: return ((const int8_t *)p)[i];
    case MTS_DTYPE_UINT8: case MTS_DTYPE_BOOL: return ((const uint8_t *)p)[i];
    case MTS_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case MTS_DTYPE_UINT32: return ((const uint32_t *)p)[i];
    case MTS_DTYPE_UINT64: return (int64_t)((const uint64_t *)p)[i];
    case MTS_DTYPE_FLOAT: return (int64_t)((const float *)p)[i];
    case MTS_DTYPE_DOUBLE: return (int64_t)((const double *)p)[i];
    case MTS_DTYPE_FLOAT16: return (int64_t)mts_f16_to_f32(((const uint16_t *)p)[i]);
    case MTS_DTYPE_BFLOAT16: return (int64_t)mts_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return 0;
    }
}

double mts_tensor_get_f64(const mts_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case MTS_DTYPE_FLOAT: return ((const float *)t->data)[i];
    case MTS_DTYPE_DOUBLE: return ((const double *)t->data)[i];
    case MTS_DTYPE_FLOAT16: return mts_f16_to_f32(((const uint16_t *)t->data)[i]);
    case MTS_DTYPE_BFLOAT16: return mts_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case MTS_DTYPE_UINT64: return (double)((const uint64_t *)t->data)[i];
    default: return (double)mts_tensor_get_int(t, i);
    }
}
