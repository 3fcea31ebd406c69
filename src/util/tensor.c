/*
 * Element types (sizes and ONNX names) and shape arithmetic with overflow checks (see tensor.h).
 */
#include "util/tensor.h"

#include <stdio.h>
#include <string.h>

size_t mts_dtype_size(mts_dtype t)
{
    switch (t) {
    case MTS_DTYPE_FLOAT: case MTS_DTYPE_INT32: case MTS_DTYPE_UINT32: return 4;
    case MTS_DTYPE_UINT8: case MTS_DTYPE_INT8: case MTS_DTYPE_BOOL: return 1;
    case MTS_DTYPE_UINT16: case MTS_DTYPE_INT16: case MTS_DTYPE_FLOAT16: return 2;
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
