/*
 * Small helpers shared by the reference kernel files ref_math2.c, ref_signal.c and ref_random.c:
 * dtype masks and input validation, output shape setting, typed element reads and writes through
 * double / int64 (one switch per element type, so a further type is one more case), scalar
 * reads of size-like inputs, and the split of a range over mts_parallel threads.
 */
#ifndef MTS_ENGINE_KERNELS_REF_MATH2_H
#define MTS_ENGINE_KERNELS_REF_MATH2_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/kernels/kernel.h"
#include "engine/tensor.h"

#define DTM(t) (1u << (unsigned)(t))
#define M_F32 DTM(MTS_DTYPE_FLOAT)
#define M_I8 DTM(MTS_DTYPE_INT8)
#define M_U8 DTM(MTS_DTYPE_UINT8)
#define M_I32 DTM(MTS_DTYPE_INT32)
#define M_I64 DTM(MTS_DTYPE_INT64)
#define M_BOOL DTM(MTS_DTYPE_BOOL)
#define M_SINT (M_I8 | M_I32 | M_I64)
#define M_INT (M_SINT | M_U8)
#define M_NUM (M_F32 | M_INT)
/* The wider held types, which an op takes only where its mask names them. */
#define M_F64 DTM(MTS_DTYPE_DOUBLE)
#define M_I16 DTM(MTS_DTYPE_INT16)
#define M_U16 DTM(MTS_DTYPE_UINT16)
#define M_U32 DTM(MTS_DTYPE_UINT32)
#define M_U64 DTM(MTS_DTYPE_UINT64)
#define M_UINT (M_U8 | M_U16 | M_U32 | M_U64)
#define M_INT_ALL (M_INT | M_I16 | M_U16 | M_U32 | M_U64)
/* The element types ld_f/ld_i/st_i/st_f have cases for. A type the engine learns later is
 * declined as unsupported by these kernels until it gets its case here and in their masks. */
#define M_HELD (M_NUM | M_BOOL | M_F64 | M_I16 | M_U16 | M_U32 | M_U64)

/* Elements per thread below which a kernel runs on one thread. */
#define REF2_GRAIN 32768

/* Checks that t (input idx) exists and has a dtype in mask: types the engine cannot hold, and
 * held types beyond the core ones that the op does not implement, are MTS_EUNSUPPORTED; core
 * types the op does not take are MTS_EINVAL. */
static inline int check_t(mts_kctx *k, const mts_tensor *t, int idx, unsigned mask)
{
    if (!t) return mts_err_set(k->err, MTS_EINVAL, "input %d is required but missing", idx);
    if (!mts_dtype_supported(t->dtype) || (unsigned)t->dtype >= 32 || !(M_HELD & DTM(t->dtype)))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "input %d has dtype %s, which is not supported", idx,
                           mts_dtype_name(t->dtype));
    if (!(mask & DTM(t->dtype))) {
        if (!mts_dtype_core(t->dtype))
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "input %d has dtype %s, which is not supported", idx,
                               mts_dtype_name(t->dtype));
        return mts_err_set(k->err, MTS_EINVAL, "input %d has dtype %s, which this op does not take", idx,
                           mts_dtype_name(t->dtype));
    }
    return MTS_OK;
}

static inline int check_in(mts_kctx *k, int idx, unsigned mask, const mts_tensor **out)
{
    const mts_tensor *t = mts_kin(k, idx);
    int rc = check_t(k, t, idx, mask);
    if (rc) return rc;
    *out = t;
    return MTS_OK;
}

static inline int check_arity(mts_kctx *k, int lo, int hi)
{
    if (k->n_in < lo || k->n_in > hi) {
        if (lo == hi) return mts_err_set(k->err, MTS_EINVAL, "expected %d inputs, got %d", lo, k->n_in);
        return mts_err_set(k->err, MTS_EINVAL, "expected %d to %d inputs, got %d", lo, hi, k->n_in);
    }
    if (k->n_out < 1) return mts_err_set(k->err, MTS_EINVAL, "expected at least 1 output, got %d", k->n_out);
    return MTS_OK;
}

static inline void set_out(mts_kctx *k, int j, mts_dtype dt, int rank, const int64_t *dims)
{
    k->out[j].dtype = dt;
    k->out[j].rank = rank;
    for (int i = 0; i < rank; i++) k->out[j].dims[i] = dims[i];
}

static inline int64_t numel(const mts_tensor *t)
{
    int64_t n = mts_tensor_numel(t);
    return n < 0 ? 0 : n;
}

/* Float -> int64 as C truncation, made total: NaN -> 0, out of range saturates. */
static inline int64_t f2i64(double v)
{
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

static inline double ld_f(const void *p, mts_dtype dt, int64_t i)
{
    switch (dt) {
    case MTS_DTYPE_FLOAT: return ((const float *)p)[i];
    case MTS_DTYPE_INT8: return ((const int8_t *)p)[i];
    case MTS_DTYPE_UINT8: case MTS_DTYPE_BOOL: return ((const uint8_t *)p)[i];
    case MTS_DTYPE_INT32: return ((const int32_t *)p)[i];
    case MTS_DTYPE_INT64: return (double)((const int64_t *)p)[i];
    case MTS_DTYPE_DOUBLE: return ((const double *)p)[i];
    case MTS_DTYPE_INT16: return ((const int16_t *)p)[i];
    case MTS_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case MTS_DTYPE_UINT32: return ((const uint32_t *)p)[i];
    case MTS_DTYPE_UINT64: return (double)((const uint64_t *)p)[i];
    default: return 0;
    }
}

static inline int64_t ld_i(const void *p, mts_dtype dt, int64_t i)
{
    switch (dt) {
    case MTS_DTYPE_FLOAT: return f2i64(((const float *)p)[i]);
    case MTS_DTYPE_INT8: return ((const int8_t *)p)[i];
    case MTS_DTYPE_UINT8: case MTS_DTYPE_BOOL: return ((const uint8_t *)p)[i];
    case MTS_DTYPE_INT32: return ((const int32_t *)p)[i];
    case MTS_DTYPE_INT64: return ((const int64_t *)p)[i];
    case MTS_DTYPE_DOUBLE: return f2i64(((const double *)p)[i]);
    case MTS_DTYPE_INT16: return ((const int16_t *)p)[i];
    case MTS_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case MTS_DTYPE_UINT32: return ((const uint32_t *)p)[i];
    case MTS_DTYPE_UINT64: return (int64_t)((const uint64_t *)p)[i]; /* the bits, reinterpreted */
    default: return 0;
    }
}

/* Stores an int64 with two's-complement wrap-around (bool: nonzero -> 1). */
static inline void st_i(void *p, mts_dtype dt, int64_t i, int64_t v)
{
    switch (dt) {
    case MTS_DTYPE_INT8: ((int8_t *)p)[i] = (int8_t)(uint8_t)(uint64_t)v; break;
    case MTS_DTYPE_UINT8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)v; break;
    case MTS_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case MTS_DTYPE_INT32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
    case MTS_DTYPE_INT64: ((int64_t *)p)[i] = v; break;
    case MTS_DTYPE_FLOAT: ((float *)p)[i] = (float)v; break;
    case MTS_DTYPE_DOUBLE: ((double *)p)[i] = (double)v; break;
    case MTS_DTYPE_INT16: ((int16_t *)p)[i] = (int16_t)(uint16_t)(uint64_t)v; break;
    case MTS_DTYPE_UINT16: ((uint16_t *)p)[i] = (uint16_t)(uint64_t)v; break;
    case MTS_DTYPE_UINT32: ((uint32_t *)p)[i] = (uint32_t)(uint64_t)v; break;
    case MTS_DTYPE_UINT64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    default: break;
    }
}

/* Stores a double: floats round, integers truncate toward zero (saturating, NaN -> 0). */
static inline void st_f(void *p, mts_dtype dt, int64_t i, double v)
{
    switch (dt) {
    case MTS_DTYPE_FLOAT: ((float *)p)[i] = (float)v; break;
    case MTS_DTYPE_DOUBLE: ((double *)p)[i] = v; break;
    case MTS_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case MTS_DTYPE_UINT64: /* values past INT64_MAX keep their magnitude */
        ((uint64_t *)p)[i] = v != v || v <= 0 ? 0 : v >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)v;
        break;
    default: st_i(p, dt, i, f2i64(v)); break;
    }
}

/* Whether the engine can produce outputs of element type dt from a double (output_datatype
 * and dtype attributes). */
static inline bool numeric_out_ok(mts_dtype dt)
{
    return (unsigned)dt < 32 && (M_HELD & DTM(dt)) && mts_dtype_supported(dt);
}

/* Reads the single element of a scalar-like integer input (rank 0, or one element) into *v.
 * MTS_EDYNAMIC when the value is not known yet. */
static inline int scalar_int(mts_kctx *k, int idx, const char *what, int64_t *v)
{
    const mts_tensor *t = mts_kin(k, idx);
    int rc = check_t(k, t, idx, M_I32 | M_I64);
    if (rc) return rc;
    if (numel(t) != 1 || t->rank > 1)
        return mts_err_set(k->err, MTS_ESHAPE, "input %d (%s) must be a scalar", idx, what);
    if (!t->data) return MTS_EDYNAMIC;
    *v = mts_tensor_get_int(t, 0);
    return MTS_OK;
}

static inline int scalar_float(mts_kctx *k, int idx, const char *what, double *v)
{
    const mts_tensor *t = mts_kin(k, idx);
    int rc = check_t(k, t, idx, M_NUM);
    if (rc) return rc;
    if (numel(t) != 1 || t->rank > 1)
        return mts_err_set(k->err, MTS_ESHAPE, "input %d (%s) must be a scalar", idx, what);
    if (!t->data) return MTS_EDYNAMIC;
    *v = ld_f(t->data, t->dtype, 0);
    return MTS_OK;
}

/* Strides of t's elements when broadcast to out's shape (0 along broadcast axes). */
static inline void bcast_strides(const mts_tensor *t, const mts_tensor *out, int64_t *st)
{
    int64_t s = 1;
    for (int d = out->rank - 1; d >= 0; d--) {
        int id = d - (out->rank - t->rank);
        int64_t td = id >= 0 ? t->dims[id] : 1;
        st[d] = td == 1 ? 0 : s;
        s *= td;
    }
}

/* Thread ithr's share [lo, hi) of n items. */
static inline void part_range(int64_t n, int ithr, int nthr, int64_t *lo, int64_t *hi)
{
    int64_t q = n / nthr, r = n % nthr;
    *lo = ithr * q + (ithr < r ? ithr : r);
    *hi = *lo + q + (ithr < r ? 1 : 0);
}

/* Threads worth using for `work` element operations. */
static inline int par_threads(const mts_kctx *k, int64_t work)
{
    int64_t t = work / REF2_GRAIN;
    if (t < 1) t = 1;
    return t < k->threads ? (int)t : k->threads;
}

#endif
