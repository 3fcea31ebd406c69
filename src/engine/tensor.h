/*
 * What only the engine needs to know about tensors (the type itself is util/tensor.h): which
 * element types it computes with, and typed element reads for the kernels that take small index
 * tensors (shapes, axes, indices) whatever their integer type.
 */
#ifndef MTS_ENGINE_TENSOR_H
#define MTS_ENGINE_TENSOR_H

#include <stdbool.h>
#include <stdint.h>

#include "util/tensor.h"

/* True for the types the engine holds: float, double, the 8/16/32/64-bit integers, bool, and
 * float16/bfloat16 (which a loaded model computes in float; engine/half.c). Not string or
 * complex. */
bool mts_dtype_supported(mts_dtype t);

/* True for the types every kernel of the engine computes with (float, uint8, int8, int32,
 * int64, bool). A kernel handed another held type that it does not implement (double, 16-bit
 * floats and integers, uint32/64) answers MTS_EUNSUPPORTED rather than MTS_EINVAL: the model
 * may be valid, the kernel just lacks that type. */
bool mts_dtype_core(mts_dtype t);

/* Reads element i of an integer-typed tensor (int8/16/32/64, uint8/16/32/64, bool) as int64. */
int64_t mts_tensor_get_int(const mts_tensor *t, int64_t i);
/* Reads element i of any numeric tensor as double. */
double mts_tensor_get_f64(const mts_tensor *t, int64_t i);

#endif
