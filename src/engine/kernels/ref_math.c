/*
 * Reference (plain C) kernels for elementwise math, normalizations and reductions:
 * unary activations and math functions (Relu ... Cos, Clip), numpy-broadcasting binary and
 * ternary ops (Add ... Pow, comparisons, logic, Where, variadic Min/Max/Sum/Mean), Cast,
 * BatchNormalization (inference), InstanceNormalization, LayerNormalization, the Reduce*
 * family, Softmax/LogSoftmax and ArgMax/ArgMin.
 *
 * Every broadcasting op goes through one strided iterator (bcast_for_each) that collapses the
 * output shape into as few dimensions as possible and calls a typed row function for each
 * innermost run; the per-element work lives in small inline scalar functions selected by a
 * switch outside the loops. Floats are computed in float32 with double accumulators for sums.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"

/* ------------------------------------------------------------------------------------------ */
/* Dtype sets and common validation                                                           */
/* ------------------------------------------------------------------------------------------ */

#define DTM(t) (1u << (unsigned)(t))
#define M_F32 DTM(MTS_DTYPE_FLOAT)
#define M_I8 DTM(MTS_DTYPE_INT8)
#define M_U8 DTM(MTS_DTYPE_UINT8)
#define M_I32 DTM(MTS_DTYPE_INT32)
#define M_I64 DTM(MTS_DTYPE_INT64)
#define M_BOOL DTM(MTS_DTYPE_BOOL)
#define M_F64 DTM(MTS_DTYPE_DOUBLE)
#define M_I16 DTM(MTS_DTYPE_INT16)
#define M_U16 DTM(MTS_DTYPE_UINT16)
#define M_U32 DTM(MTS_DTYPE_UINT32)
#define M_U64 DTM(MTS_DTYPE_UINT64)
#define M_FLT (M_F32 | M_F64)
#define M_SINT (M_I8 | M_I16 | M_I32 | M_I64)
#define M_INT (M_SINT | M_U8 | M_U16 | M_U32 | M_U64)
#define M_NUM (M_FLT | M_INT)
#define M_SNUM (M_FLT | M_SINT)
#define M_ALL (M_NUM | M_BOOL)

static const char *mask_str(unsigned m, char *buf, size_t len)
{
    static const mts_dtype order[] = {MTS_DTYPE_FLOAT, MTS_DTYPE_DOUBLE, MTS_DTYPE_INT8, MTS_DTYPE_UINT8,
                                      MTS_DTYPE_INT16, MTS_DTYPE_UINT16, MTS_DTYPE_INT32, MTS_DTYPE_UINT32,
                                      MTS_DTYPE_INT64, MTS_DTYPE_UINT64, MTS_DTYPE_BOOL};
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof order / sizeof order[0] && off < len; i++)
        if (m & DTM(order[i]))
            off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "/" : "", mts_dtype_name(order[i]));
    return buf;
}

/* Checks that t (input `idx`) exists and has one of the dtypes in mask. Dtypes the engine can't
 * hold at all, and held types beyond the core ones that the op does not implement, are
 * MTS_EUNSUPPORTED; core dtypes that the op does not accept are MTS_EINVAL. */
static int check_t(mts_kctx *k, const mts_tensor *t, int idx, unsigned mask)
{
    char b[160];
    if (!t) return mts_err_set(k->err, MTS_EINVAL, "input %d is required but missing", idx);
    if (!mts_dtype_supported(t->dtype))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "input %d has dtype %s, which is not supported", idx,
                           mts_dtype_name(t->dtype));
    if (!(mask & DTM(t->dtype)))
        return mts_err_set(k->err, mts_dtype_core(t->dtype) ? MTS_EINVAL : MTS_EUNSUPPORTED,
                           "input %d has dtype %s; expected %s", idx, mts_dtype_name(t->dtype),
                           mask_str(mask, b, sizeof b));
    return MTS_OK;
}

static int check_in(mts_kctx *k, int idx, unsigned mask, const mts_tensor **out)
{
    const mts_tensor *t = mts_kin(k, idx);
    int rc = check_t(k, t, idx, mask);
    if (rc) return rc;
    *out = t;
    return MTS_OK;
}

/* Input count in [lo, hi] (hi < 0: unbounded) and at least one output. */
static int check_arity(mts_kctx *k, int lo, int hi)
{
    if (k->n_in < lo || (hi >= 0 && k->n_in > hi)) {
        if (hi < 0) return mts_err_set(k->err, MTS_EINVAL, "expected at least %d inputs, got %d", lo, k->n_in);
        if (lo == hi) return mts_err_set(k->err, MTS_EINVAL, "expected %d inputs, got %d", lo, k->n_in);
        return mts_err_set(k->err, MTS_EINVAL, "expected %d to %d inputs, got %d", lo, hi, k->n_in);
    }
    if (k->n_out < 1) return mts_err_set(k->err, MTS_EINVAL, "expected at least 1 output, got %d", k->n_out);
    return MTS_OK;
}

/* True when output j exists in the node (optional outputs may be omitted). */
static bool out_wanted(const mts_kctx *k, int j)
{
    if (j >= k->n_out) return false;
    if (k->node && j < k->node->n_out && k->node->out && k->node->out[j] < 0) return false;
    return true;
}

static void set_out(mts_kctx *k, int j, mts_dtype dt, int rank, const int64_t *dims)
{
    k->out[j].dtype = dt;
    k->out[j].rank = rank;
    for (int i = 0; i < rank; i++) k->out[j].dims[i] = dims[i];
}

static int64_t numel(const mts_tensor *t)
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

/* Typed element access for the rare mixed-type paths (Pow, Clip bounds). */
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
    case MTS_DTYPE_UINT64: return (int64_t)((const uint64_t *)p)[i];
    default: return 0;
    }
}

/* Stores an int64 into an integer element with two's-complement wrap-around. */
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

/* ------------------------------------------------------------------------------------------ */
/* The broadcast iterator                                                                     */
/* ------------------------------------------------------------------------------------------ */

#define BC_MAX_IN 3

/* Computes out[0..n) from in[k] elements; step[k] is 0 (broadcast) or 1 (contiguous). */
typedef void (*bc_row_fn)(const void *ctx, void *out, const void *const *in, const int64_t *step, int64_t n);

/* Walks the (contiguous, row-major) output `out` and the `nin` inputs, each broadcast to out's
 * shape numpy-style, calling fn once per innermost run. Adjacent dimensions are merged whenever
 * every operand allows it, so same-shape operands become one call over all elements. */
static void bcast_for_each(const mts_tensor *out, int nin, const mts_tensor *const *in, bc_row_fn fn, const void *ctx)
{
    int64_t total = numel(out);
    if (total == 0) return;
    int R = out->rank;
    int64_t dims[MTS_MAX_RANK], st[BC_MAX_IN][MTS_MAX_RANK], ist[BC_MAX_IN][MTS_MAX_RANK];
    size_t es[BC_MAX_IN];
    for (int j = 0; j < nin; j++) {
        mts_strides(in[j], ist[j]);
        es[j] = mts_dtype_size(in[j]->dtype);
    }
    size_t oes = mts_dtype_size(out->dtype);
    int r = 0;
    for (int d = 0; d < R; d++) {
        int64_t od = out->dims[d];
        if (od == 1) continue;
        int64_t cur[BC_MAX_IN];
        for (int j = 0; j < nin; j++) {
            int id = d - (R - in[j]->rank);
            cur[j] = (id < 0 || in[j]->dims[id] == 1) ? 0 : ist[j][id];
        }
        bool merge = r > 0;
        for (int j = 0; j < nin && merge; j++)
            if (st[j][r - 1] != cur[j] * od) merge = false;
        if (merge) {
            dims[r - 1] *= od;
            for (int j = 0; j < nin; j++) st[j][r - 1] = cur[j];
        } else {
            dims[r] = od;
            for (int j = 0; j < nin; j++) st[j][r] = cur[j];
            r++;
        }
    }
    if (r == 0) {
        dims[0] = 1;
        for (int j = 0; j < nin; j++) st[j][0] = 0;
        r = 1;
    }
    int64_t inner = dims[r - 1], outer = total / inner;
    int64_t step[BC_MAX_IN], off[BC_MAX_IN] = {0}, idx[MTS_MAX_RANK] = {0};
    for (int j = 0; j < nin; j++) step[j] = st[j][r - 1] ? 1 : 0;
    char *o = (char *)out->data;
    for (int64_t row = 0; row < outer; row++) {
        const void *ip[BC_MAX_IN];
        for (int j = 0; j < nin; j++) ip[j] = (const char *)in[j]->data + off[j] * (int64_t)es[j];
        fn(ctx, o + row * inner * (int64_t)oes, ip, step, inner);
        for (int d = r - 2; d >= 0; d--) {
            for (int j = 0; j < nin; j++) off[j] += st[j][d];
            if (++idx[d] < dims[d]) break;
            for (int j = 0; j < nin; j++) off[j] -= st[j][d] * dims[d];
            idx[d] = 0;
        }
    }
}

/* Row loop for a binary scalar function F over element types TA, TB into TO. The loops run in
 * blocks of 16 with a scalar tail, because gcc -O2 vectorizes only loops whose trip count it
 * knows and that need no run-time overlap check: "ivdep" states that no element depends on
 * another one written in the same loop, which holds even when the output is an input (the
 * variadic ops accumulate in place), since element i is read and written at index i only.
 * Vectorized, every element is still F of its operands (a float division stays a division). */
#define LOOP2_BLOCKS(EXPR)                                                                    \
    do {                                                                                      \
        int64_t i_ = 0;                                                                       \
        for (; i_ + 16 <= n; i_ += 16)                                                        \
            _Pragma("GCC ivdep") for (int t_ = 0; t_ < 16; t_++) {                            \
                int64_t j_ = i_ + t_;                                                         \
                o_[j_] = (EXPR);                                                              \
            }                                                                                 \
        for (int64_t j_ = i_; j_ < n; j_++) o_[j_] = (EXPR);                                  \
    } while (0)

#define LOOP2(TA, TB, TO, F)                                                                  \
    do {                                                                                      \
        TO *o_ = (TO *)out;                                                                   \
        const TA *a_ = (const TA *)in[0];                                                     \
        const TB *b_ = (const TB *)in[1];                                                     \
        if (step[0] && step[1]) {                                                             \
            LOOP2_BLOCKS(F(a_[j_], b_[j_]));                                                  \
        } else if (step[1]) {                                                                 \
            TA av_ = a_[0];                                                                   \
            LOOP2_BLOCKS(F(av_, b_[j_]));                                                     \
        } else if (step[0]) {                                                                 \
            TB bv_ = b_[0];                                                                   \
            LOOP2_BLOCKS(F(a_[j_], bv_));                                                     \
        } else {                                                                              \
            TO v_ = F(a_[0], b_[0]);                                                          \
            LOOP2_BLOCKS(v_);                                                                 \
        }                                                                                     \
    } while (0)

/* Copies (broadcasts) one operand; ctx points at the element size. */
static void copy_row(const void *ctx, void *out, const void *const *in, const int64_t *step, int64_t n)
{
    size_t es = *(const size_t *)ctx;
    if (step[0]) {
        memcpy(out, in[0], (size_t)n * es);
        return;
    }
    switch (es) {
    case 1: memset(out, *(const uint8_t *)in[0], (size_t)n); break;
    case 2: { uint16_t v = *(const uint16_t *)in[0]; for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = v; } break;
    case 4: { uint32_t v = *(const uint32_t *)in[0]; for (int64_t i = 0; i < n; i++) ((uint32_t *)out)[i] = v; } break;
    case 8: { uint64_t v = *(const uint64_t *)in[0]; for (int64_t i = 0; i < n; i++) ((uint64_t *)out)[i] = v; } break;
    default: for (int64_t i = 0; i < n; i++) memcpy((char *)out + (size_t)i * es, in[0], es); break;
    }
}

/* Broadcasts src into dst (same dtype; dst's shape already set and data allocated). */
static void bcast_copy(const mts_tensor *dst, const mts_tensor *src)
{
    size_t es = mts_dtype_size(src->dtype);
    bcast_for_each(dst, 1, &src, copy_row, &es);
}

/* ------------------------------------------------------------------------------------------ */
/* Scalar functions                                                                           */
/* ------------------------------------------------------------------------------------------ */

static inline float add_f32(float a, float b) { return a + b; }
static inline float sub_f32(float a, float b) { return a - b; }
static inline float mul_f32(float a, float b) { return a * b; }
static inline float div_f32(float a, float b) { return a / b; }
/* NaN in a propagates (in b it does through the comparison). `|` rather than `||`: no branch, so
 * the row loops vectorize to compares and blends. */
static inline float min_f32(float a, float b) { return ((a < b) | (a != a)) ? a : b; }
static inline float max_f32(float a, float b) { return ((a > b) | (a != a)) ? a : b; }
static inline float prelu_f32(float a, float b) { return a < 0.0f ? a * b : a; }
static inline double add_f64(double a, double b) { return a + b; }
static inline double sub_f64(double a, double b) { return a - b; }
static inline double mul_f64(double a, double b) { return a * b; }
static inline double div_f64(double a, double b) { return a / b; }
static inline double min_f64(double a, double b) { return ((a < b) | (a != a)) ? a : b; }
static inline double max_f64(double a, double b) { return ((a > b) | (a != a)) ? a : b; }
static inline double prelu_f64(double a, double b) { return a < 0.0 ? a * b : a; }

#define DEF_INT_COMMON(T, U, S)                                                               \
    static inline T add_##S(T a, T b) { return (T)((U)a + (U)b); }                            \
    static inline T sub_##S(T a, T b) { return (T)((U)a - (U)b); }                            \
    static inline T mul_##S(T a, T b) { return (T)((U)a * (U)b); }                            \
    static inline T min_##S(T a, T b) { return a < b ? a : b; }                               \
    static inline T max_##S(T a, T b) { return a > b ? a : b; }                               \
    static inline T neg_##S(T a) { return (T)((U)0 - (U)a); }

/* Signed: division truncates toward zero; x/0 yields 0 and MIN/-1 wraps instead of trapping. */
#define DEF_SINT(T, U, S)                                                                     \
    DEF_INT_COMMON(T, U, S)                                                                   \
    static inline T div_##S(T a, T b) { return b == 0 ? (T)0 : b == (T)-1 ? neg_##S(a) : (T)(a / b); } \
    static inline T abs_##S(T a) { return a < 0 ? neg_##S(a) : a; }                           \
    static inline T relu_##S(T a) { return a < 0 ? (T)0 : a; }                                \
    static inline T prelu_##S(T a, T b) { return a < 0 ? mul_##S(a, b) : a; }

#define DEF_UINT(T, U, S)                                                                     \
    DEF_INT_COMMON(T, U, S)                                                                   \
    static inline T div_##S(T a, T b) { return b == 0 ? (T)0 : (T)(a / b); }                  \
    static inline T abs_##S(T a) { return a; }                                                \
    static inline T relu_##S(T a) { return a; }                                               \
    static inline T prelu_##S(T a, T b) { (void)b; return a; }

/* 16-bit types compute in uint32_t: uint16_t operands would promote to (signed) int and overflow. */
DEF_SINT(int8_t, uint8_t, i8)
DEF_UINT(uint8_t, uint8_t, u8)
DEF_SINT(int16_t, uint32_t, i16)
DEF_UINT(uint16_t, uint32_t, u16)
DEF_SINT(int32_t, uint32_t, i32)
DEF_UINT(uint32_t, uint32_t, u32)
DEF_SINT(int64_t, uint64_t, i64)
DEF_UINT(uint64_t, uint64_t, u64)

#define CMP_EQ(a, b) ((a) == (b))
#define CMP_GT(a, b) ((a) > (b))
#define CMP_LT(a, b) ((a) < (b))
#define CMP_GE(a, b) ((a) >= (b))
#define CMP_LE(a, b) ((a) <= (b))
#define LOG_AND(a, b) (uint8_t)(((a) != 0) & ((b) != 0))
#define LOG_OR(a, b) (uint8_t)(((a) != 0) | ((b) != 0))
#define LOG_XOR(a, b) (uint8_t)(((a) != 0) ^ ((b) != 0))

/* ------------------------------------------------------------------------------------------ */
/* Binary ops: arithmetic, comparison, logic, Pow                                              */
/* ------------------------------------------------------------------------------------------ */

enum bin_op {
    B_ADD, B_SUB, B_MUL, B_DIV, B_MIN, B_MAX, B_PRELU,      /* arithmetic: output dtype = input */
    B_EQ, B_GT, B_LT, B_GE, B_LE,                          /* comparison: bool output */
    B_AND, B_OR, B_XOR,                                    /* logic: bool in, bool out */
    B_POW,
};

typedef struct bin_ctx {
    int op;
    mts_dtype a, b; /* input dtypes */
} bin_ctx;

#define ARITH_ROW(T, S)                                                                       \
    static void arith_row_##S(int op, void *out, const void *const *in, const int64_t *step, int64_t n) \
    {                                                                                         \
        switch (op) {                                                                         \
        case B_ADD: LOOP2(T, T, T, add_##S); break;                                           \
        case B_SUB: LOOP2(T, T, T, sub_##S); break;                                           \
        case B_MUL: LOOP2(T, T, T, mul_##S); break;                                           \
        case B_DIV: LOOP2(T, T, T, div_##S); break;                                           \
        case B_MIN: LOOP2(T, T, T, min_##S); break;                                           \
        case B_MAX: LOOP2(T, T, T, max_##S); break;                                           \
        case B_PRELU: LOOP2(T, T, T, prelu_##S); break;                                       \
        case B_EQ: LOOP2(T, T, uint8_t, CMP_EQ); break;                                       \
        case B_GT: LOOP2(T, T, uint8_t, CMP_GT); break;                                       \
        case B_LT: LOOP2(T, T, uint8_t, CMP_LT); break;                                       \
        case B_GE: LOOP2(T, T, uint8_t, CMP_GE); break;                                       \
        case B_LE: LOOP2(T, T, uint8_t, CMP_LE); break;                                       \
        default: break;                                                                       \
        }                                                                                     \
    }

ARITH_ROW(float, f32)
ARITH_ROW(double, f64)
ARITH_ROW(int8_t, i8)
ARITH_ROW(uint8_t, u8)
ARITH_ROW(int16_t, i16)
ARITH_ROW(uint16_t, u16)
ARITH_ROW(int32_t, i32)
ARITH_ROW(uint32_t, u32)
ARITH_ROW(int64_t, i64)
ARITH_ROW(uint64_t, u64)

/* a^b for integers, wrapping like repeated multiplication; negative exponents give the
 * truncated result of the real power (0 unless |a| == 1). */
static int64_t ipow(int64_t a, int64_t b)
{
    if (b < 0) {
        if (a == 1) return 1;
        if (a == -1) return (b & 1) ? -1 : 1;
        return 0;
    }
    uint64_t r = 1, x = (uint64_t)a;
    while (b) {
        if (b & 1) r *= x;
        x *= x;
        b >>= 1;
    }
    return (int64_t)r;
}

static inline float square_f32(float x, float e)
{
    (void)e;
    return x * x;
}

static void pow_row(const bin_ctx *c, void *out, const void *const *in, const int64_t *step, int64_t n)
{
    if (c->a == MTS_DTYPE_FLOAT && c->b == MTS_DTYPE_FLOAT) {
        /* x^2 (spectrogram power, variance): x * x is the correctly rounded square, which powf
         * also returns, at a fraction of powf's cost */
        if (!step[1] && ((const float *)in[1])[0] == 2.0f) {
            LOOP2(float, float, float, square_f32);
            return;
        }
        LOOP2(float, float, float, powf);
        return;
    }
    if (c->a == MTS_DTYPE_DOUBLE) {
        for (int64_t i = 0; i < n; i++)
            ((double *)out)[i] = pow(((const double *)in[0])[step[0] ? i : 0], ld_f(in[1], c->b, step[1] ? i : 0));
        return;
    }
    bool b_float = c->b == MTS_DTYPE_FLOAT || c->b == MTS_DTYPE_DOUBLE;
    for (int64_t i = 0; i < n; i++) {
        int64_t ia = step[0] ? i : 0, ib = step[1] ? i : 0;
        if (c->a == MTS_DTYPE_FLOAT) {
            ((float *)out)[i] = (float)pow(((const float *)in[0])[ia], ld_f(in[1], c->b, ib));
        } else if (b_float) {
            double r = pow((double)ld_i(in[0], c->a, ia), ld_f(in[1], c->b, ib));
            st_i(out, c->a, i, f2i64(r));
        } else {
            st_i(out, c->a, i, ipow(ld_i(in[0], c->a, ia), ld_i(in[1], c->b, ib)));
        }
    }
}

static void bin_row(const void *ctx, void *out, const void *const *in, const int64_t *step, int64_t n)
{
    const bin_ctx *c = ctx;
    if (c->op == B_POW) {
        pow_row(c, out, in, step, n);
        return;
    }
    if (c->op == B_AND || c->op == B_OR || c->op == B_XOR) {
        switch (c->op) {
        case B_AND: LOOP2(uint8_t, uint8_t, uint8_t, LOG_AND); break;
        case B_OR: LOOP2(uint8_t, uint8_t, uint8_t, LOG_OR); break;
        default: LOOP2(uint8_t, uint8_t, uint8_t, LOG_XOR); break;
        }
        return;
    }
    switch (c->a) {
    case MTS_DTYPE_FLOAT: arith_row_f32(c->op, out, in, step, n); break;
    case MTS_DTYPE_INT8: arith_row_i8(c->op, out, in, step, n); break;
    case MTS_DTYPE_UINT8: case MTS_DTYPE_BOOL: arith_row_u8(c->op, out, in, step, n); break;
    case MTS_DTYPE_INT32: arith_row_i32(c->op, out, in, step, n); break;
    case MTS_DTYPE_INT64: arith_row_i64(c->op, out, in, step, n); break;
    case MTS_DTYPE_DOUBLE: arith_row_f64(c->op, out, in, step, n); break;
    case MTS_DTYPE_INT16: arith_row_i16(c->op, out, in, step, n); break;
    case MTS_DTYPE_UINT16: arith_row_u16(c->op, out, in, step, n); break;
    case MTS_DTYPE_UINT32: arith_row_u32(c->op, out, in, step, n); break;
    case MTS_DTYPE_UINT64: arith_row_u64(c->op, out, in, step, n); break;
    default: break;
    }
}

/* Opset < 7 legacy broadcasting (broadcast=1, optional axis): B's shape is matched against A's
 * dimensions starting at `axis` (default: suffix). Rewrites *b into a same-rank view of B. */
static int legacy_bcast_view(mts_kctx *k, const mts_tensor *a, mts_tensor *b)
{
    const mts_node *nd = k->node;
    if (nd->opset >= 7 || mts_attr_int(nd, "broadcast", 0) == 0) return MTS_OK;
    if (b->rank > a->rank)
        return mts_err_set(k->err, MTS_ESHAPE, "legacy broadcast: B has rank %d > A's rank %d", b->rank, a->rank);
    int64_t axis = mts_attr_int(nd, "axis", a->rank - b->rank);
    if (axis < 0) axis += a->rank;
    if (axis < 0 || axis + b->rank > a->rank)
        return mts_err_set(k->err, MTS_EINVAL, "legacy broadcast: axis %lld does not fit B of rank %d into rank %d",
                           (long long)mts_attr_int(nd, "axis", 0), b->rank, a->rank);
    mts_tensor v = *b;
    v.rank = a->rank;
    for (int i = 0; i < a->rank; i++) v.dims[i] = 1;
    for (int i = 0; i < b->rank; i++) {
        if (b->dims[i] != a->dims[axis + i] && b->dims[i] != 1)
            return mts_err_set(k->err, MTS_ESHAPE, "legacy broadcast: B dim %d is %lld, A dim %lld is %lld", i,
                               (long long)b->dims[i], (long long)(axis + i), (long long)a->dims[axis + i]);
        v.dims[axis + i] = b->dims[i];
    }
    *b = v;
    return MTS_OK;
}

typedef struct bin_spec {
    int op;
    unsigned mask_a, mask_b; /* allowed dtypes; mask_b == 0: B must have A's dtype */
    bool bool_out;
} bin_spec;

/* Validates both operands and returns (possibly legacy-reshaped) views of them. */
static int bin_operands(mts_kctx *k, const bin_spec *s, mts_tensor *a, mts_tensor *b)
{
    const mts_tensor *ta, *tb;
    int rc = check_arity(k, 2, 2);
    if (!rc) rc = check_in(k, 0, s->mask_a, &ta);
    if (!rc) rc = check_in(k, 1, s->mask_b ? s->mask_b : s->mask_a, &tb);
    if (rc) return rc;
    if (!s->mask_b && ta->dtype != tb->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "inputs must have the same dtype, got %s and %s",
                           mts_dtype_name(ta->dtype), mts_dtype_name(tb->dtype));
    *a = *ta;
    *b = *tb;
    if (s->op == B_PRELU && k->node->opset < 7 && b->rank == 1 && a->rank >= 2 && b->dims[0] == a->dims[1]) {
        /* Before opset 7, PRelu's slope of shape [C] applies per channel (axis 1). */
        b->rank = a->rank - 1;
        for (int i = 1; i < b->rank; i++) b->dims[i] = 1;
        return MTS_OK;
    }
    return legacy_bcast_view(k, a, b);
}

static int bin_infer(mts_kctx *k, const bin_spec *s)
{
    mts_tensor a, b, o;
    int rc = bin_operands(k, s, &a, &b);
    if (rc) return rc;
    rc = mts_broadcast_shape(&a, &b, &o, k->err);
    if (rc) return rc;
    if (s->op == B_PRELU && !mts_shape_equal(&o, &a)) {
        char sa[96], sb[96];
        return mts_err_set(k->err, MTS_ESHAPE, "slope shape %s does not broadcast to X shape %s",
                           mts_shape_str(&b, sb, sizeof sb), mts_shape_str(&a, sa, sizeof sa));
    }
    set_out(k, 0, s->bool_out ? MTS_DTYPE_BOOL : a.dtype, o.rank, o.dims);
    return MTS_OK;
}

static int bin_run(mts_kctx *k, const bin_spec *s)
{
    mts_tensor a, b;
    int rc = bin_operands(k, s, &a, &b);
    if (rc) return rc;
    bin_ctx c = {s->op, a.dtype, b.dtype};
    const mts_tensor *ins[2] = {&a, &b};
    bcast_for_each(&k->out[0], 2, ins, bin_row, &c);
    return MTS_OK;
}

#define DEF_BINARY(NAME, OP, MA, MB, BOOLOUT)                                                 \
    static const bin_spec NAME##_spec = {OP, MA, MB, BOOLOUT};                                \
    static int NAME##_infer(mts_kctx *k) { return bin_infer(k, &NAME##_spec); }               \
    static int NAME##_run(mts_kctx *k) { return bin_run(k, &NAME##_spec); }

DEF_BINARY(add, B_ADD, M_NUM, 0, false)
DEF_BINARY(sub, B_SUB, M_NUM, 0, false)
DEF_BINARY(mul, B_MUL, M_NUM, 0, false)
DEF_BINARY(div, B_DIV, M_NUM, 0, false)
DEF_BINARY(prelu, B_PRELU, M_SNUM, 0, false)
DEF_BINARY(pow, B_POW, M_FLT | M_I32 | M_I64, M_NUM, false)
DEF_BINARY(equal, B_EQ, M_ALL, 0, true)
DEF_BINARY(greater, B_GT, M_NUM, 0, true)
DEF_BINARY(less, B_LT, M_NUM, 0, true)
DEF_BINARY(greater_eq, B_GE, M_NUM, 0, true)
DEF_BINARY(less_eq, B_LE, M_NUM, 0, true)
DEF_BINARY(and, B_AND, M_BOOL, 0, true)
DEF_BINARY(or, B_OR, M_BOOL, 0, true)
DEF_BINARY(xor, B_XOR, M_BOOL, 0, true)

/* ------------------------------------------------------------------------------------------ */
/* Variadic Min / Max / Sum / Mean                                                            */
/* ------------------------------------------------------------------------------------------ */

static int variadic_check(mts_kctx *k, unsigned mask, mts_tensor *shape)
{
    int rc = check_arity(k, 1, -1);
    if (rc) return rc;
    const mts_tensor *t0;
    if ((rc = check_in(k, 0, mask, &t0))) return rc;
    *shape = *t0;
    for (int i = 1; i < k->n_in; i++) {
        const mts_tensor *t;
        if ((rc = check_in(k, i, mask, &t))) return rc;
        if (t->dtype != t0->dtype)
            return mts_err_set(k->err, MTS_EINVAL, "input %d has dtype %s; expected %s like input 0", i,
                               mts_dtype_name(t->dtype), mts_dtype_name(t0->dtype));
        mts_tensor o;
        if ((rc = mts_broadcast_shape(shape, t, &o, k->err))) return rc;
        shape->rank = o.rank;
        memcpy(shape->dims, o.dims, sizeof o.dims);
    }
    return MTS_OK;
}

static int variadic_infer(mts_kctx *k, unsigned mask)
{
    mts_tensor s;
    int rc = variadic_check(k, mask, &s);
    if (rc) return rc;
    set_out(k, 0, s.dtype, s.rank, s.dims);
    return MTS_OK;
}

static int variadic_run(mts_kctx *k, int op, bool mean)
{
    mts_tensor *o = &k->out[0];
    bcast_copy(o, k->in[0]);
    bin_ctx c = {op, o->dtype, o->dtype};
    for (int i = 1; i < k->n_in; i++) {
        const mts_tensor *ins[2] = {o, k->in[i]};
        bcast_for_each(o, 2, ins, bin_row, &c);
    }
    if (mean && o->dtype == MTS_DTYPE_FLOAT) {
        float *y = o->data, inv = (float)k->n_in;
        int64_t n = numel(o);
        for (int64_t i = 0; i < n; i++) y[i] /= inv;
    } else if (mean && o->dtype == MTS_DTYPE_DOUBLE) {
        double *y = o->data, inv = (double)k->n_in;
        int64_t n = numel(o);
        for (int64_t i = 0; i < n; i++) y[i] /= inv;
    }
    return MTS_OK;
}

static int min_infer(mts_kctx *k) { return variadic_infer(k, M_NUM); }
static int min_run(mts_kctx *k) { return variadic_run(k, B_MIN, false); }
static int max_infer(mts_kctx *k) { return variadic_infer(k, M_NUM); }
static int max_run(mts_kctx *k) { return variadic_run(k, B_MAX, false); }
static int sum_infer(mts_kctx *k) { return variadic_infer(k, M_FLT); }
static int sum_run(mts_kctx *k) { return variadic_run(k, B_ADD, false); }
static int mean_infer(mts_kctx *k) { return variadic_infer(k, M_FLT); }
static int mean_run(mts_kctx *k) { return variadic_run(k, B_ADD, true); }

/* ------------------------------------------------------------------------------------------ */
/* Where                                                                                      */
/* ------------------------------------------------------------------------------------------ */

#define WHERE_LOOP(T)                                                                         \
    do {                                                                                      \
        T *o_ = (T *)out;                                                                     \
        const T *x_ = (const T *)in[1], *y_ = (const T *)in[2];                               \
        for (int64_t i = 0; i < n; i++) o_[i] = c[i * step[0]] ? x_[i * step[1]] : y_[i * step[2]]; \
    } while (0)

static void where_row(const void *ctx, void *out, const void *const *in, const int64_t *step, int64_t n)
{
    const uint8_t *c = in[0];
    switch (*(const size_t *)ctx) {
    case 1: WHERE_LOOP(uint8_t); break;
    case 2: WHERE_LOOP(uint16_t); break;
    case 4: WHERE_LOOP(uint32_t); break;
    default: WHERE_LOOP(uint64_t); break;
    }
}

static int where_infer(mts_kctx *k)
{
    const mts_tensor *c, *x, *y;
    int rc = check_arity(k, 3, 3);
    if (!rc) rc = check_in(k, 0, M_BOOL, &c);
    if (!rc) rc = check_in(k, 1, M_ALL, &x);
    if (!rc) rc = check_in(k, 2, M_ALL, &y);
    if (rc) return rc;
    if (x->dtype != y->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "X and Y must have the same dtype, got %s and %s",
                           mts_dtype_name(x->dtype), mts_dtype_name(y->dtype));
    mts_tensor s1, s2;
    if ((rc = mts_broadcast_shape(c, x, &s1, k->err))) return rc;
    if ((rc = mts_broadcast_shape(&s1, y, &s2, k->err))) return rc;
    set_out(k, 0, x->dtype, s2.rank, s2.dims);
    return MTS_OK;
}

static int where_run(mts_kctx *k)
{
    size_t es = mts_dtype_size(k->in[1]->dtype);
    bcast_for_each(&k->out[0], 3, k->in, where_row, &es);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Unary elementwise ops                                                                      */
/* ------------------------------------------------------------------------------------------ */

enum un_op {
    U_RELU, U_LEAKY, U_SIGMOID, U_TANH, U_HSIGMOID, U_HSWISH, U_ELU, U_ERF, U_EXP, U_SQRT, U_NEG,
    U_ABS, U_LOG, U_RECIP, U_FLOOR, U_CEIL, U_SOFTPLUS, U_SELU, U_SIN, U_COS, U_NOT,
};

static int unary_infer(mts_kctx *k, unsigned mask)
{
    const mts_tensor *x;
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = check_in(k, 0, mask, &x);
    if (rc) return rc;
    set_out(k, 0, x->dtype, x->rank, x->dims);
    return MTS_OK;
}

static inline float sigmoid_f(float x)
{
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

static inline float softplus_f(float x)
{
    return x > 0 ? x + log1pf(expf(-x)) : log1pf(expf(x));
}

#define UN_LOOP(EXPR) for (int64_t i = 0; i < n; i++) { float v = x[i]; y[i] = (EXPR); }

static void unary_f32(const mts_node *nd, int op, const float *x, float *y, int64_t n)
{
    switch (op) {
    case U_RELU: UN_LOOP(v < 0.0f ? 0.0f : v); break;
    case U_LEAKY: { float al = mts_attr_float(nd, "alpha", 0.01f); UN_LOOP(v < 0.0f ? v * al : v); } break;
    case U_SIGMOID: UN_LOOP(sigmoid_f(v)); break;
    case U_TANH: UN_LOOP(tanhf(v)); break;
    case U_HSIGMOID: {
        float al = mts_attr_float(nd, "alpha", 0.2f), be = mts_attr_float(nd, "beta", 0.5f);
        UN_LOOP(fmaxf(0.0f, fminf(1.0f, al * v + be)));
    } break;
    case U_HSWISH: UN_LOOP(v * fmaxf(0.0f, fminf(1.0f, v * (1.0f / 6.0f) + 0.5f))); break;
    case U_ELU: { float al = mts_attr_float(nd, "alpha", 1.0f); UN_LOOP(v < 0.0f ? al * expm1f(v) : v); } break;
    case U_ERF: UN_LOOP(erff(v)); break;
    case U_EXP: UN_LOOP(expf(v)); break;
    case U_SQRT: UN_LOOP(sqrtf(v)); break;
    case U_NEG: UN_LOOP(-v); break;
    case U_ABS: UN_LOOP(fabsf(v)); break;
    case U_LOG: UN_LOOP(logf(v)); break;
    case U_RECIP: UN_LOOP(1.0f / v); break;
    case U_FLOOR: UN_LOOP(floorf(v)); break;
    case U_CEIL: UN_LOOP(ceilf(v)); break;
    case U_SOFTPLUS: UN_LOOP(softplus_f(v)); break;
    case U_SELU: {
        float al = mts_attr_float(nd, "alpha", 1.67326319217681884765625f);
        float ga = mts_attr_float(nd, "gamma", 1.05070102214813232421875f);
        UN_LOOP(v > 0.0f ? ga * v : ga * al * expm1f(v));
    } break;
    case U_SIN: UN_LOOP(sinf(v)); break;
    case U_COS: UN_LOOP(cosf(v)); break;
    default: break;
    }
}

static inline double sigmoid_d(double x)
{
    if (x >= 0) return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

static inline double softplus_d(double x)
{
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

#define UN_LOOP_D(EXPR) for (int64_t i = 0; i < n; i++) { double v = x[i]; y[i] = (EXPR); }

/* The double versions, with the attributes (float) widened. */
static void unary_f64(const mts_node *nd, int op, const double *x, double *y, int64_t n)
{
    switch (op) {
    case U_RELU: UN_LOOP_D(v < 0.0 ? 0.0 : v); break;
    case U_LEAKY: { double al = mts_attr_float(nd, "alpha", 0.01f); UN_LOOP_D(v < 0.0 ? v * al : v); } break;
    case U_SIGMOID: UN_LOOP_D(sigmoid_d(v)); break;
    case U_TANH: UN_LOOP_D(tanh(v)); break;
    case U_HSIGMOID: {
        double al = mts_attr_float(nd, "alpha", 0.2f), be = mts_attr_float(nd, "beta", 0.5f);
        UN_LOOP_D(fmax(0.0, fmin(1.0, al * v + be)));
    } break;
    case U_HSWISH: UN_LOOP_D(v * fmax(0.0, fmin(1.0, v / 6.0 + 0.5))); break;
    case U_ELU: { double al = mts_attr_float(nd, "alpha", 1.0f); UN_LOOP_D(v < 0.0 ? al * expm1(v) : v); } break;
    case U_ERF: UN_LOOP_D(erf(v)); break;
    case U_EXP: UN_LOOP_D(exp(v)); break;
    case U_SQRT: UN_LOOP_D(sqrt(v)); break;
    case U_NEG: UN_LOOP_D(-v); break;
    case U_ABS: UN_LOOP_D(fabs(v)); break;
    case U_LOG: UN_LOOP_D(log(v)); break;
    case U_RECIP: UN_LOOP_D(1.0 / v); break;
    case U_FLOOR: UN_LOOP_D(floor(v)); break;
    case U_CEIL: UN_LOOP_D(ceil(v)); break;
    case U_SOFTPLUS: UN_LOOP_D(softplus_d(v)); break;
    case U_SELU: {
        double al = mts_attr_float(nd, "alpha", 1.67326319217681884765625f);
        double ga = mts_attr_float(nd, "gamma", 1.05070102214813232421875f);
        UN_LOOP_D(v > 0.0 ? ga * v : ga * al * expm1(v));
    } break;
    case U_SIN: UN_LOOP_D(sin(v)); break;
    case U_COS: UN_LOOP_D(cos(v)); break;
    default: break;
    }
}

#define UNARY_INT(T, S)                                                                       \
    do {                                                                                      \
        const T *x_ = (const T *)xv;                                                          \
        T *y_ = (T *)yv;                                                                      \
        switch (op) {                                                                         \
        case U_ABS: for (int64_t i = 0; i < n; i++) y_[i] = abs_##S(x_[i]); break;            \
        case U_NEG: for (int64_t i = 0; i < n; i++) y_[i] = neg_##S(x_[i]); break;            \
        case U_RELU: for (int64_t i = 0; i < n; i++) y_[i] = relu_##S(x_[i]); break;          \
        default: break;                                                                       \
        }                                                                                     \
    } while (0)

static int unary_run(mts_kctx *k, int op)
{
    const mts_tensor *x = k->in[0];
    const void *xv = x->data;
    void *yv = k->out[0].data;
    int64_t n = numel(x);
    switch (x->dtype) {
    case MTS_DTYPE_FLOAT: unary_f32(k->node, op, xv, yv, n); break;
    case MTS_DTYPE_INT8: UNARY_INT(int8_t, i8); break;
    case MTS_DTYPE_UINT8: UNARY_INT(uint8_t, u8); break;
    case MTS_DTYPE_INT32: UNARY_INT(int32_t, i32); break;
    case MTS_DTYPE_INT64: UNARY_INT(int64_t, i64); break;
    case MTS_DTYPE_DOUBLE: unary_f64(k->node, op, xv, yv, n); break;
    case MTS_DTYPE_INT16: UNARY_INT(int16_t, i16); break;
    case MTS_DTYPE_UINT16: UNARY_INT(uint16_t, u16); break;
    case MTS_DTYPE_UINT32: UNARY_INT(uint32_t, u32); break;
    case MTS_DTYPE_UINT64: UNARY_INT(uint64_t, u64); break;
    case MTS_DTYPE_BOOL: {
        const uint8_t *xb = xv;
        uint8_t *yb = yv;
        for (int64_t i = 0; i < n; i++) yb[i] = xb[i] == 0;
    } break;
    default: break;
    }
    return MTS_OK;
}

#define DEF_UNARY(NAME, OP, MASK)                                                             \
    static int NAME##_infer(mts_kctx *k) { return unary_infer(k, MASK); }                     \
    static int NAME##_run(mts_kctx *k) { return unary_run(k, OP); }

DEF_UNARY(relu, U_RELU, M_SNUM)
DEF_UNARY(leaky, U_LEAKY, M_FLT)
DEF_UNARY(sigmoid, U_SIGMOID, M_FLT)
DEF_UNARY(tanh, U_TANH, M_FLT)
DEF_UNARY(hsigmoid, U_HSIGMOID, M_FLT)
DEF_UNARY(hswish, U_HSWISH, M_FLT)
DEF_UNARY(elu, U_ELU, M_FLT)
DEF_UNARY(erf, U_ERF, M_FLT)
DEF_UNARY(exp, U_EXP, M_FLT)
DEF_UNARY(sqrt, U_SQRT, M_FLT)
DEF_UNARY(neg, U_NEG, M_SNUM)
DEF_UNARY(abs, U_ABS, M_NUM)
DEF_UNARY(log, U_LOG, M_FLT)
DEF_UNARY(recip, U_RECIP, M_FLT)
DEF_UNARY(floor, U_FLOOR, M_FLT)
DEF_UNARY(ceil, U_CEIL, M_FLT)
DEF_UNARY(softplus, U_SOFTPLUS, M_FLT)
DEF_UNARY(selu, U_SELU, M_FLT)
DEF_UNARY(sin, U_SIN, M_FLT)
DEF_UNARY(cos, U_COS, M_FLT)
DEF_UNARY(not, U_NOT, M_BOOL)

/* ------------------------------------------------------------------------------------------ */
/* Clip                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static int clip_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int v = k->node->opset;
    int rc = check_arity(k, 1, v >= 11 ? 3 : 1);
    if (!rc) rc = check_in(k, 0, v >= 12 ? M_NUM : M_F32, &x);
    if (rc) return rc;
    for (int i = 1; i <= 2 && v >= 11; i++) {
        const mts_tensor *b = mts_kin(k, i);
        if (!b) continue;
        if ((rc = check_t(k, b, i, DTM(x->dtype)))) return rc;
        if (mts_tensor_numel(b) != 1)
            return mts_err_set(k->err, MTS_ESHAPE, "input %d (%s) must be a scalar, got %lld elements", i,
                               i == 1 ? "min" : "max", (long long)mts_tensor_numel(b));
    }
    set_out(k, 0, x->dtype, x->rank, x->dims);
    return MTS_OK;
}

#define CLIP_INT(T, TMIN, TMAX)                                                               \
    do {                                                                                      \
        const T *x_ = (const T *)x->data;                                                     \
        T *y_ = (T *)k->out[0].data;                                                          \
        T lo_ = lo ? ((const T *)lo->data)[0] : (T)(TMIN);                                    \
        T hi_ = hi ? ((const T *)hi->data)[0] : (T)(TMAX);                                    \
        for (int64_t i = 0; i < n; i++) {                                                     \
            T v_ = x_[i] < lo_ ? lo_ : x_[i];                                                 \
            y_[i] = v_ > hi_ ? hi_ : v_;                                                      \
        }                                                                                     \
    } while (0)

static int clip_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    int64_t n = numel(x);
    const mts_tensor *lo = NULL, *hi = NULL;
    if (k->node->opset >= 11) {
        lo = mts_kin(k, 1);
        hi = mts_kin(k, 2);
    }
    switch (x->dtype) {
    case MTS_DTYPE_FLOAT: {
        float l, h;
        if (k->node->opset < 11) {
            l = mts_attr_float(k->node, "min", -FLT_MAX);
            h = mts_attr_float(k->node, "max", FLT_MAX);
        } else {
            l = lo ? ((const float *)lo->data)[0] : -INFINITY;
            h = hi ? ((const float *)hi->data)[0] : INFINITY;
        }
        const float *xf = x->data;
        float *y = k->out[0].data;
        for (int64_t i = 0; i < n; i++) {
            float v = xf[i] < l ? l : xf[i];
            y[i] = v > h ? h : v;
        }
    } break;
    case MTS_DTYPE_INT8: CLIP_INT(int8_t, INT8_MIN, INT8_MAX); break;
    case MTS_DTYPE_UINT8: CLIP_INT(uint8_t, 0, UINT8_MAX); break;
    case MTS_DTYPE_INT32: CLIP_INT(int32_t, INT32_MIN, INT32_MAX); break;
    case MTS_DTYPE_INT64: CLIP_INT(int64_t, INT64_MIN, INT64_MAX); break;
    case MTS_DTYPE_DOUBLE: CLIP_INT(double, -INFINITY, INFINITY); break;
    case MTS_DTYPE_INT16: CLIP_INT(int16_t, INT16_MIN, INT16_MAX); break;
    case MTS_DTYPE_UINT16: CLIP_INT(uint16_t, 0, UINT16_MAX); break;
    case MTS_DTYPE_UINT32: CLIP_INT(uint32_t, 0, UINT32_MAX); break;
    case MTS_DTYPE_UINT64: CLIP_INT(uint64_t, 0, UINT64_MAX); break;
    default: break;
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Cast                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static mts_dtype cast_target(const mts_node *nd)
{
    const mts_attr *a = mts_node_attr(nd, "to");
    if (!a) return MTS_DTYPE_UNDEFINED;
    if (a->type == MTS_ATTR_INT) return (a->i > 0 && a->i < 64) ? (mts_dtype)a->i : MTS_DTYPE_UNDEFINED;
    if (a->type == MTS_ATTR_STRING && a->s) { /* opset 1 spelled the type as a string */
        static const struct { const char *s; mts_dtype t; } names[] = {
            {"FLOAT", MTS_DTYPE_FLOAT}, {"UINT8", MTS_DTYPE_UINT8}, {"INT8", MTS_DTYPE_INT8},
            {"INT32", MTS_DTYPE_INT32}, {"INT64", MTS_DTYPE_INT64}, {"BOOL", MTS_DTYPE_BOOL},
            {"DOUBLE", MTS_DTYPE_DOUBLE}, {"FLOAT16", MTS_DTYPE_FLOAT16}, {"INT16", MTS_DTYPE_INT16},
            {"UINT16", MTS_DTYPE_UINT16}, {"UINT32", MTS_DTYPE_UINT32}, {"UINT64", MTS_DTYPE_UINT64},
            {"STRING", MTS_DTYPE_STRING}, {"BFLOAT16", MTS_DTYPE_BFLOAT16},
        };
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (strcmp(a->s, names[i].s) == 0) return names[i].t;
    }
    return MTS_DTYPE_UNDEFINED;
}

/* Output type of a cast to `to`: float16/bfloat16 values are held as float (engine/half.c). */
static int cast_check_target(mts_kctx *k, mts_dtype to, const mts_tensor *x)
{
    if (to == MTS_DTYPE_STRING || x->dtype == MTS_DTYPE_STRING)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "cast to or from string is not supported (the engine holds "
                           "no string tensors)");
    if (!mts_dtype_supported(to))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "cast to %s (type %d) is not supported",
                           mts_dtype_name(to), (int)to);
    if (k->node->opset >= 19 && mts_attr_int(k->node, "saturate", 1) != 1)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "saturate=0 applies to float8 types, which are not supported");
    set_out(k, 0, mts_dtype_is_half(to) ? MTS_DTYPE_FLOAT : to, x->rank, x->dims);
    return MTS_OK;
}

/* Whether a cast from x to `to` involves strings (kernels/ref_string.c does those). */
static bool cast_is_str(const mts_kctx *k, mts_dtype to)
{
    const mts_tensor *x = mts_kin(k, 0);
    return to == MTS_DTYPE_STRING || to == MTS_DTYPE_STRINGS || (x && x->dtype == MTS_DTYPE_STRINGS);
}

static int cast_infer(mts_kctx *k)
{
    const mts_tensor *x;
    if (k->n_in == 1 && cast_is_str(k, cast_target(k->node))) return mts_str_cast_infer(k, cast_target(k->node));
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = check_in(k, 0, M_ALL, &x);
    if (rc) return rc;
    const mts_attr *a = mts_node_attr(k->node, "to");
    if (!a) return mts_err_set(k->err, MTS_EINVAL, "required attribute 'to' is missing");
    mts_dtype to = cast_target(k->node);
    if (to == MTS_DTYPE_UNDEFINED)
        return mts_err_set(k->err, MTS_EINVAL, "attribute 'to' does not name a known element type");
    return cast_check_target(k, to, x);
}

/* Per destination type: conversion of a source value v (of any source C type). Float sources
 * truncate toward zero (saturating, NaN -> 0) and narrow with wrap-around like integer ones. */
#define CAST_TO(ST, SRC_IS_FLOAT)                                                             \
    do {                                                                                      \
        const ST *x_ = (const ST *)xv;                                                        \
        switch (to) {                                                                         \
        case MTS_DTYPE_FLOAT: for (int64_t i = 0; i < n; i++) ((float *)yv)[i] = (float)x_[i]; break; \
        case MTS_DTYPE_BOOL: for (int64_t i = 0; i < n; i++) ((uint8_t *)yv)[i] = x_[i] != 0; break; \
        case MTS_DTYPE_INT8: case MTS_DTYPE_UINT8: case MTS_DTYPE_INT32: case MTS_DTYPE_INT64: \
            for (int64_t i = 0; i < n; i++)                                                   \
                st_i(yv, to, i, SRC_IS_FLOAT ? f2i64((double)x_[i]) : (int64_t)x_[i]);        \
            break;                                                                            \
        default: break;                                                                       \
        }                                                                                     \
    } while (0)

#define M_CAST_FAST (M_F32 | M_I8 | M_U8 | M_I32 | M_I64 | M_BOOL)

/* Reads element i as a double (float sources) or an integer; *is_f says which, *is_u64 marks
 * an unsigned 64-bit integer (held in *u). */
static inline void cast_load(const void *x, mts_dtype dt, int64_t i, double *d, int64_t *v, uint64_t *u, int *cls)
{
    switch (dt) {
    case MTS_DTYPE_FLOAT: *d = ((const float *)x)[i]; *cls = 0; return;
    case MTS_DTYPE_DOUBLE: *d = ((const double *)x)[i]; *cls = 0; return;
    case MTS_DTYPE_FLOAT16: *d = mts_f16_to_f32(((const uint16_t *)x)[i]); *cls = 0; return;
    case MTS_DTYPE_BFLOAT16: *d = mts_bf16_to_f32(((const uint16_t *)x)[i]); *cls = 0; return;
    case MTS_DTYPE_UINT64: *u = ((const uint64_t *)x)[i]; *cls = 2; return;
    default: *v = ld_i(x, dt, i); *cls = 1; return;
    }
}

/* The general conversion: any supported source type to any target (float16/bfloat16 targets
 * give float values rounded to that type, ties to even, NaN and infinities kept). */
static void cast_general(const void *xv, mts_dtype from, void *yv, mts_dtype to, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double d = 0;
        int64_t v = 0;
        uint64_t u = 0;
        int cls;
        cast_load(xv, from, i, &d, &v, &u, &cls);
        switch (to) {
        case MTS_DTYPE_FLOAT:
            ((float *)yv)[i] = cls == 0 ? (float)d : cls == 1 ? (float)v : (float)u;
            break;
        case MTS_DTYPE_DOUBLE:
            ((double *)yv)[i] = cls == 0 ? d : cls == 1 ? (double)v : (double)u;
            break;
        case MTS_DTYPE_FLOAT16: {
            uint16_t h = cls == 0 ? mts_f64_to_f16(d) : cls == 1 ? mts_f64_to_f16((double)v) : mts_f64_to_f16((double)u);
            ((float *)yv)[i] = mts_f16_to_f32(h);
        } break;
        case MTS_DTYPE_BFLOAT16: {
            uint16_t h = cls == 0 ? mts_f64_to_bf16(d) : cls == 1 ? mts_f64_to_bf16((double)v) : mts_f64_to_bf16((double)u);
            ((float *)yv)[i] = mts_bf16_to_f32(h);
        } break;
        case MTS_DTYPE_BOOL:
            ((uint8_t *)yv)[i] = cls == 0 ? d != 0 : cls == 1 ? v != 0 : u != 0;
            break;
        case MTS_DTYPE_UINT64:
            if (cls == 0)
                ((uint64_t *)yv)[i] = d != d ? 0 : d >= 18446744073709551616.0 ? UINT64_MAX
                                      : d >= 9223372036854775808.0 ? (uint64_t)d : (uint64_t)f2i64(d);
            else
                ((uint64_t *)yv)[i] = cls == 1 ? (uint64_t)v : u;
            break;
        default: st_i(yv, to, i, cls == 0 ? f2i64(d) : cls == 1 ? v : (int64_t)u); break;
        }
    }
}

static void cast_elems(const mts_tensor *x, mts_dtype to, void *yv)
{
    const void *xv = x->data;
    int64_t n = numel(x);
    if (to == x->dtype) {
        memcpy(yv, xv, (size_t)n * mts_dtype_size(to));
        return;
    }
    if (x->dtype == MTS_DTYPE_FLOAT && mts_dtype_is_half(to)) { /* held as float, rounded */
        mts_round_half(to, xv, yv, n);
        return;
    }
    if (!(DTM(x->dtype) & M_CAST_FAST) || !(DTM(to) & M_CAST_FAST)) {
        cast_general(xv, x->dtype, yv, to, n);
        return;
    }
    switch (x->dtype) {
    case MTS_DTYPE_FLOAT: CAST_TO(float, 1); break;
    case MTS_DTYPE_INT8: CAST_TO(int8_t, 0); break;
    case MTS_DTYPE_UINT8: case MTS_DTYPE_BOOL: CAST_TO(uint8_t, 0); break;
    case MTS_DTYPE_INT32: CAST_TO(int32_t, 0); break;
    case MTS_DTYPE_INT64: CAST_TO(int64_t, 0); break;
    default: break;
    }
}

static int cast_run(mts_kctx *k)
{
    if (cast_is_str(k, cast_target(k->node))) return mts_str_cast_run(k, cast_target(k->node));
    cast_elems(k->in[0], cast_target(k->node), k->out[0].data);
    return MTS_OK;
}

/* CastLike (opset 15): Cast to the element type of input 1. A `like` declared float16/bfloat16
 * is rewritten at load time into a Cast (engine/half.c), since the engine holds it as float. */
static int castlike_infer(mts_kctx *k)
{
    const mts_tensor *x, *like;
    if (k->n_in == 2 && k->in[1] && cast_is_str(k, k->in[1]->dtype)) return mts_str_cast_infer(k, k->in[1]->dtype);
    int rc = check_arity(k, 2, 2);
    if (!rc) rc = check_in(k, 0, M_ALL, &x);
    if (!rc) rc = check_in(k, 1, M_ALL, &like);
    if (rc) return rc;
    return cast_check_target(k, like->dtype, x);
}

static int castlike_run(mts_kctx *k)
{
    if (cast_is_str(k, k->in[1]->dtype)) return mts_str_cast_run(k, k->in[1]->dtype);
    cast_elems(k->in[0], k->in[1]->dtype, k->out[0].data);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Normalizations                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* Checks that t is a float vector of length c (numel c, any rank with unit extra dims). */
static int check_channel_vec(mts_kctx *k, int idx, const char *what, int64_t c)
{
    const mts_tensor *t;
    int rc = check_in(k, idx, M_F32, &t);
    if (rc) return rc;
    if (t->rank != 1 || t->dims[0] != c) {
        char s[96];
        return mts_err_set(k->err, MTS_ESHAPE, "input %d (%s) must have shape [%lld], got %s", idx, what,
                           (long long)c, mts_shape_str(t, s, sizeof s));
    }
    return MTS_OK;
}

static int check_nc(mts_kctx *k, const mts_tensor **x)
{
    int rc = check_in(k, 0, M_F32, x);
    if (rc) return rc;
    if ((*x)->rank < 2)
        return mts_err_set(k->err, MTS_ESHAPE, "input 0 (X) must have rank >= 2 (N x C x ...), got rank %d",
                           (*x)->rank);
    return MTS_OK;
}

static int batchnorm_infer(mts_kctx *k)
{
    const mts_tensor *x;
    const mts_node *nd = k->node;
    int rc = check_arity(k, 5, 5);
    if (rc) return rc;
    if (nd->opset >= 14 && mts_attr_int(nd, "training_mode", 0) != 0)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "training_mode=1 is not supported (inference only)");
    if (nd->opset <= 7 && mts_attr_int(nd, "spatial", 1) == 0)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "spatial=0 is not supported");
    for (int j = 1; j < k->n_out; j++)
        if (out_wanted(k, j))
            return mts_err_set(k->err, MTS_EUNSUPPORTED,
                               "output %d (training statistics) is not supported (inference only)", j);
    if ((rc = check_nc(k, &x))) return rc;
    static const char *names[] = {"scale", "B", "input_mean", "input_var"};
    for (int i = 1; i <= 4; i++)
        if ((rc = check_channel_vec(k, i, names[i - 1], x->dims[1]))) return rc;
    set_out(k, 0, x->dtype, x->rank, x->dims);
    return MTS_OK;
}

static int batchnorm_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    const float *xs = x->data, *sc = k->in[1]->data, *bi = k->in[2]->data, *mu = k->in[3]->data,
                *var = k->in[4]->data;
    float *y = k->out[0].data;
    float eps = mts_attr_float(k->node, "epsilon", 1e-5f);
    int64_t N = x->dims[0], C = x->dims[1], S = 1;
    for (int i = 2; i < x->rank; i++) S *= x->dims[i];
    for (int64_t c = 0; c < C; c++) {
        double a = (double)sc[c] / sqrt((double)var[c] + (double)eps);
        float fa = (float)a, fb = (float)((double)bi[c] - (double)mu[c] * a);
        for (int64_t nn = 0; nn < N; nn++) {
            const float *xp = xs + (nn * C + c) * S;
            float *yp = y + (nn * C + c) * S;
            for (int64_t i = 0; i < S; i++) yp[i] = xp[i] * fa + fb;
        }
    }
    return MTS_OK;
}

static int instnorm_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc = check_arity(k, 3, 3);
    if (!rc) rc = check_nc(k, &x);
    if (!rc) rc = check_channel_vec(k, 1, "scale", x->dims[1]);
    if (!rc) rc = check_channel_vec(k, 2, "B", x->dims[1]);
    if (rc) return rc;
    set_out(k, 0, x->dtype, x->rank, x->dims);
    return MTS_OK;
}

/* Mean and biased variance of n floats, in double. */
static void mean_var(const float *x, int64_t n, double *mean, double *var)
{
    double s = 0, q = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    double m = n ? s / (double)n : 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = x[i] - m;
        q += d * d;
    }
    *mean = m;
    *var = n ? q / (double)n : 0.0;
}

static int instnorm_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    const float *xs = x->data, *sc = k->in[1]->data, *bi = k->in[2]->data;
    float *y = k->out[0].data;
    double eps = mts_attr_float(k->node, "epsilon", 1e-5f);
    int64_t N = x->dims[0], C = x->dims[1], S = 1;
    for (int i = 2; i < x->rank; i++) S *= x->dims[i];
    for (int64_t nc = 0; nc < N * C; nc++) {
        int64_t c = nc % C;
        const float *xp = xs + nc * S;
        float *yp = y + nc * S;
        double m, v;
        mean_var(xp, S, &m, &v);
        double a = (double)sc[c] / sqrt(v + eps), b = (double)bi[c] - m * a;
        for (int64_t i = 0; i < S; i++) yp[i] = (float)(xp[i] * a + b);
    }
    return MTS_OK;
}

/* LayerNormalization: Scale and B must broadcast (unidirectionally) to X's dims[axis:]. */
static int ln_param_check(mts_kctx *k, int idx, const mts_tensor *x, int axis)
{
    const mts_tensor *p = mts_kin(k, idx);
    if (!p) return MTS_OK;
    int rc = check_t(k, p, idx, M_F32);
    if (rc) return rc;
    bool ok = p->rank <= x->rank;
    for (int i = 0; i < p->rank && ok; i++) {
        int xi = x->rank - p->rank + i;
        int64_t d = p->dims[i];
        if (xi < axis ? d != 1 : (d != 1 && d != x->dims[xi])) ok = false;
    }
    if (!ok) {
        char sp[96], sx[96];
        return mts_err_set(k->err, MTS_ESHAPE, "input %d (%s) shape %s does not broadcast to the normalized "
                           "dims (axis %d) of X %s", idx, idx == 1 ? "Scale" : "B", mts_shape_str(p, sp, sizeof sp),
                           axis, mts_shape_str(x, sx, sizeof sx));
    }
    return MTS_OK;
}

static int layernorm_axis(mts_kctx *k, const mts_tensor **x, int *axis)
{
    int rc = check_arity(k, 2, 3);
    if (!rc) rc = check_in(k, 0, M_F32, x);
    if (rc) return rc;
    if ((*x)->rank < 1) return mts_err_set(k->err, MTS_ESHAPE, "input 0 (X) must have rank >= 1, got a scalar");
    return mts_norm_axis(mts_attr_int(k->node, "axis", -1), (*x)->rank, axis, k->err);
}

static int layernorm_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int axis, rc = layernorm_axis(k, &x, &axis);
    if (rc) return rc;
    int64_t st = mts_attr_int(k->node, "stash_type", 1);
    if (st != 1 && st != 11)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "stash_type %lld is not supported (float or double only)",
                           (long long)st);
    if (!mts_kin(k, 1)) return mts_err_set(k->err, MTS_EINVAL, "input 1 (Scale) is required but missing");
    if ((rc = ln_param_check(k, 1, x, axis)) || (rc = ln_param_check(k, 2, x, axis))) return rc;
    set_out(k, 0, x->dtype, x->rank, x->dims);
    int64_t sd[MTS_MAX_RANK];
    for (int i = 0; i < x->rank; i++) sd[i] = i < axis ? x->dims[i] : 1;
    for (int j = 1; j < 3 && j < k->n_out; j++) set_out(k, j, MTS_DTYPE_FLOAT, x->rank, sd);
    return MTS_OK;
}

/* Expands parameter p to the normalized shape into a fresh buffer of m floats (or returns
 * p's own data when it already has m elements). *owned is set when the caller must free. */
static int ln_expand(mts_kctx *k, const mts_tensor *p, const mts_tensor *x, int axis, int64_t m,
                     const float **out, float **owned)
{
    *owned = NULL;
    *out = NULL;
    if (!p) return MTS_OK;
    if (numel(p) == m) {
        *out = p->data;
        return MTS_OK;
    }
    float *buf = malloc((size_t)(m ? m : 1) * sizeof(float));
    if (!buf) return mts_err_set(k->err, MTS_ENOMEM, "out of memory expanding a LayerNormalization parameter");
    mts_tensor dst = {MTS_DTYPE_FLOAT, x->rank - axis, {0}, buf};
    for (int i = axis; i < x->rank; i++) dst.dims[i - axis] = x->dims[i];
    mts_tensor src = *p; /* drop leading unit dims beyond the normalized rank */
    int drop = src.rank - dst.rank;
    if (drop > 0) {
        src.rank -= drop;
        memmove(src.dims, src.dims + drop, sizeof(int64_t) * (size_t)src.rank);
    }
    bcast_copy(&dst, &src);
    *out = buf;
    *owned = buf;
    return MTS_OK;
}

static int layernorm_run(mts_kctx *k)
{
    const mts_tensor *x;
    int axis, rc = layernorm_axis(k, &x, &axis);
    if (rc) return rc;
    double eps = mts_attr_float(k->node, "epsilon", 1e-5f);
    int64_t rows = 1, m = 1;
    for (int i = 0; i < x->rank; i++) {
        if (i < axis) rows *= x->dims[i];
        else m *= x->dims[i];
    }
    const float *sc, *bi;
    float *sco, *bio;
    if ((rc = ln_expand(k, mts_kin(k, 1), x, axis, m, &sc, &sco))) return rc;
    if ((rc = ln_expand(k, mts_kin(k, 2), x, axis, m, &bi, &bio))) {
        free(sco);
        return rc;
    }
    float *mean_out = out_wanted(k, 1) ? k->out[1].data : NULL;
    float *inv_out = out_wanted(k, 2) ? k->out[2].data : NULL;
    const float *xs = x->data;
    float *y = k->out[0].data;
    for (int64_t r = 0; r < rows; r++) {
        const float *xp = xs + r * m;
        float *yp = y + r * m;
        double mu, var;
        mean_var(xp, m, &mu, &var);
        double inv = 1.0 / sqrt(var + eps);
        for (int64_t j = 0; j < m; j++) {
            double v = (xp[j] - mu) * inv * sc[j];
            if (bi) v += bi[j];
            yp[j] = (float)v;
        }
        if (mean_out) mean_out[r] = (float)mu;
        if (inv_out) inv_out[r] = (float)inv;
    }
    free(sco);
    free(bio);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Reductions                                                                                 */
/* ------------------------------------------------------------------------------------------ */

enum red_op { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_L2, R_SUMSQ };

/* Resolves which axes are reduced (attribute or input form by opset). *noop: identity. */
static int reduce_axes(mts_kctx *k, int op, const mts_tensor *x, bool *mask, bool *noop)
{
    const mts_node *nd = k->node;
    int R = x->rank;
    int64_t ax[MTS_MAX_RANK];
    int na = 0;
    *noop = false;
    for (int i = 0; i < MTS_MAX_RANK; i++) mask[i] = false;
    bool from_input = (op == R_SUM) ? nd->opset >= 13 : nd->opset >= 18;
    if (from_input) {
        const mts_tensor *a = mts_kin(k, 1);
        if (a) {
            int rc = check_t(k, a, 1, M_I64);
            if (rc) return rc;
            if (a->rank > 1) return mts_err_set(k->err, MTS_ESHAPE, "input 1 (axes) must be 1-D, got rank %d", a->rank);
            int64_t n = numel(a);
            if (n > R)
                return mts_err_set(k->err, MTS_EINVAL, "%lld axes given for an input of rank %d", (long long)n, R);
            if (n > 0 && !a->data) return MTS_EDYNAMIC;
            for (int64_t i = 0; i < n; i++) ax[na++] = ((const int64_t *)a->data)[i];
        }
        if (na == 0 && mts_attr_int(nd, "noop_with_empty_axes", 0)) {
            *noop = true;
            return MTS_OK;
        }
    } else {
        const int64_t *v = mts_attr_ints(nd, "axes", &na);
        if (na > R)
            return mts_err_set(k->err, MTS_EINVAL, "%d axes given for an input of rank %d", na, R);
        for (int i = 0; i < na; i++) ax[i] = v[i];
    }
    if (na == 0) {
        for (int i = 0; i < R; i++) mask[i] = true;
        return MTS_OK;
    }
    for (int i = 0; i < na; i++) {
        int a;
        int rc = mts_norm_axis(ax[i], R, &a, k->err);
        if (rc) return rc;
        if (mask[a]) return mts_err_set(k->err, MTS_EINVAL, "axis %lld is repeated", (long long)ax[i]);
        mask[a] = true;
    }
    return MTS_OK;
}

static int reduce_prepare(mts_kctx *k, int op, const mts_tensor **x, bool *mask, bool *noop)
{
    int rc = check_arity(k, 1, 2);
    if (!rc) rc = check_in(k, 0, M_NUM, x);
    if (!rc) rc = reduce_axes(k, op, *x, mask, noop);
    return rc;
}

static int reduce_infer(mts_kctx *k, int op)
{
    const mts_tensor *x;
    bool mask[MTS_MAX_RANK], noop;
    int rc = reduce_prepare(k, op, &x, mask, &noop);
    if (rc) return rc;
    if (noop) {
        set_out(k, 0, x->dtype, x->rank, x->dims);
        return MTS_OK;
    }
    bool keep = mts_attr_int(k->node, "keepdims", 1) != 0;
    int64_t d[MTS_MAX_RANK];
    int r = 0;
    for (int i = 0; i < x->rank; i++) {
        if (!mask[i]) d[r++] = x->dims[i];
        else if (keep) d[r++] = 1;
    }
    set_out(k, 0, x->dtype, r, d);
    return MTS_OK;
}

/* Reduction geometry: input dims collapsed to runs of reduced / kept axes; ost is the output
 * stride of each collapsed dim (0 when reduced). */
typedef struct red_geom {
    int r;
    int64_t dims[MTS_MAX_RANK], ost[MTS_MAX_RANK];
    int64_t inner, outer;
    bool inner_reduced;
} red_geom;

static void red_geometry(const mts_tensor *x, const bool *mask, red_geom *g)
{
    int r = 0;
    bool red[MTS_MAX_RANK];
    for (int i = 0; i < x->rank; i++) {
        if (x->dims[i] == 1) continue;
        if (r > 0 && red[r - 1] == mask[i]) {
            g->dims[r - 1] *= x->dims[i];
        } else {
            g->dims[r] = x->dims[i];
            red[r] = mask[i];
            r++;
        }
    }
    if (r == 0) {
        g->dims[0] = 1;
        red[0] = true;
        r = 1;
    }
    int64_t s = 1;
    for (int i = r - 1; i >= 0; i--) {
        g->ost[i] = red[i] ? 0 : s;
        if (!red[i]) s *= g->dims[i];
    }
    g->r = r;
    g->inner = g->dims[r - 1];
    g->inner_reduced = red[r - 1];
    g->outer = 1;
    for (int i = 0; i < r - 1; i++) g->outer *= g->dims[i];
}

/* Walks x in memory order; STMT updates accumulator `a` (type AT) with element `v`. */
#define RED_WALK(T, AT, STMT)                                                                 \
    do {                                                                                      \
        int64_t idx_[MTS_MAX_RANK] = {0}, oo_ = 0;                                            \
        const T *xp_ = x;                                                                     \
        for (int64_t row_ = 0; row_ < g->outer; row_++, xp_ += g->inner) {                   \
            if (g->inner_reduced) {                                                           \
                AT a = acc[oo_];                                                              \
                for (int64_t j_ = 0; j_ < g->inner; j_++) { T v = xp_[j_]; STMT; }            \
                acc[oo_] = a;                                                                 \
            } else {                                                                          \
                for (int64_t j_ = 0; j_ < g->inner; j_++) {                                   \
                    AT a = acc[oo_ + j_];                                                     \
                    T v = xp_[j_];                                                            \
                    STMT;                                                                     \
                    acc[oo_ + j_] = a;                                                        \
                }                                                                             \
            }                                                                                 \
            for (int d_ = g->r - 2; d_ >= 0; d_--) {                                          \
                oo_ += g->ost[d_];                                                            \
                if (++idx_[d_] < g->dims[d_]) break;                                          \
                oo_ -= g->ost[d_] * g->dims[d_];                                              \
                idx_[d_] = 0;                                                                 \
            }                                                                                 \
        }                                                                                     \
    } while (0)

#define REDUCE_FLT(T, S)                                                                      \
    static void reduce_##S(int op, const T *x, double *acc, const red_geom *g)                \
    {                                                                                         \
        switch (op) {                                                                         \
        case R_SUM: case R_MEAN: RED_WALK(T, double, a += v); break;                          \
        case R_SUMSQ: case R_L2: RED_WALK(T, double, a += (double)v * v); break;              \
        case R_PROD: RED_WALK(T, double, a *= v); break;                                      \
        case R_MAX: RED_WALK(T, double, if (v > a || v != v) a = v); break;                   \
        case R_MIN: RED_WALK(T, double, if (v < a || v != v) a = v); break;                   \
        default: break;                                                                       \
        }                                                                                     \
    }

REDUCE_FLT(float, f32)
REDUCE_FLT(double, f64)

#define REDUCE_INT(T, S)                                                                      \
    static void reduce_##S(int op, const T *x, int64_t *acc, const red_geom *g)               \
    {                                                                                         \
        switch (op) {                                                                         \
        case R_SUM: case R_MEAN: RED_WALK(T, int64_t, a = (int64_t)((uint64_t)a + (uint64_t)(int64_t)v)); break; \
        case R_SUMSQ: case R_L2:                                                              \
            RED_WALK(T, int64_t, a = (int64_t)((uint64_t)a + (uint64_t)(int64_t)v * (uint64_t)(int64_t)v)); \
            break;                                                                            \
        case R_PROD: RED_WALK(T, int64_t, a = (int64_t)((uint64_t)a * (uint64_t)(int64_t)v)); break; \
        case R_MAX: RED_WALK(T, int64_t, if ((int64_t)v > a) a = v); break;                            \
        case R_MIN: RED_WALK(T, int64_t, if ((int64_t)v < a) a = v); break;                            \
        default: break;                                                                       \
        }                                                                                     \
    }

REDUCE_INT(int8_t, i8)
REDUCE_INT(uint8_t, u8)
REDUCE_INT(int16_t, i16)
REDUCE_INT(uint16_t, u16)
REDUCE_INT(int32_t, i32)
REDUCE_INT(uint32_t, u32)
REDUCE_INT(int64_t, i64)
REDUCE_INT(uint64_t, u64)

static void int_range(mts_dtype dt, int64_t *lo, int64_t *hi)
{
    switch (dt) {
    case MTS_DTYPE_INT8: *lo = INT8_MIN; *hi = INT8_MAX; break;
    case MTS_DTYPE_UINT8: *lo = 0; *hi = UINT8_MAX; break;
    case MTS_DTYPE_INT32: *lo = INT32_MIN; *hi = INT32_MAX; break;
    case MTS_DTYPE_INT16: *lo = INT16_MIN; *hi = INT16_MAX; break;
    case MTS_DTYPE_UINT16: *lo = 0; *hi = UINT16_MAX; break;
    case MTS_DTYPE_UINT32: *lo = 0; *hi = UINT32_MAX; break;
    case MTS_DTYPE_UINT64: *lo = 0; *hi = INT64_MAX; break; /* values above 2^63 compare as negative */
    default: *lo = INT64_MIN; *hi = INT64_MAX; break;
    }
}

static int reduce_run(mts_kctx *k, int op)
{
    const mts_tensor *x;
    bool mask[MTS_MAX_RANK], noop;
    int rc = reduce_prepare(k, op, &x, mask, &noop);
    if (rc) return rc;
    mts_tensor *o = &k->out[0];
    int64_t on = numel(o), xn = numel(x);
    if (noop) {
        if (op != R_SUMSQ && op != R_L2) {
            memcpy(o->data, x->data, (size_t)xn * mts_dtype_size(x->dtype));
            return MTS_OK;
        }
        /* Reducing over no axes still applies the elementwise part: x^2, sqrt(x^2). */
        for (int i = 0; i < x->rank; i++) mask[i] = false;
    }
    if (on == 0) return MTS_OK;
    int64_t count = 1;
    for (int i = 0; i < x->rank; i++)
        if (mask[i]) count *= x->dims[i];
    red_geom g;
    red_geometry(x, mask, &g);
    switch (x->dtype) { /* the element types the loops below read */
    case MTS_DTYPE_FLOAT: case MTS_DTYPE_DOUBLE: case MTS_DTYPE_INT8: case MTS_DTYPE_UINT8: case MTS_DTYPE_INT16:
    case MTS_DTYPE_UINT16: case MTS_DTYPE_INT32: case MTS_DTYPE_UINT32: case MTS_DTYPE_INT64: case MTS_DTYPE_UINT64:
        break;
    default:
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s of %s is not supported", k->node->op_type,
                           mts_dtype_name(x->dtype));
    }
    if (x->dtype == MTS_DTYPE_FLOAT || x->dtype == MTS_DTYPE_DOUBLE) {
        double *acc = malloc((size_t)on * sizeof(double));
        if (!acc) return mts_err_set(k->err, MTS_ENOMEM, "out of memory for reduction accumulators");
        double init = op == R_PROD ? 1.0 : op == R_MAX ? -INFINITY : op == R_MIN ? INFINITY : 0.0;
        for (int64_t i = 0; i < on; i++) acc[i] = init;
        if (xn > 0 && x->dtype == MTS_DTYPE_FLOAT) reduce_f32(op, x->data, acc, &g);
        else if (xn > 0) reduce_f64(op, x->data, acc, &g);
        for (int64_t i = 0; i < on; i++) {
            double v = acc[i];
            if (op == R_MEAN) v /= (double)count;
            else if (op == R_L2) v = sqrt(v);
            if (x->dtype == MTS_DTYPE_FLOAT) ((float *)o->data)[i] = (float)v;
            else ((double *)o->data)[i] = v;
        }
        free(acc);
        return MTS_OK;
    }
    int64_t *acc = malloc((size_t)on * sizeof(int64_t));
    if (!acc) return mts_err_set(k->err, MTS_ENOMEM, "out of memory for reduction accumulators");
    int64_t lo, hi;
    int_range(x->dtype, &lo, &hi);
    int64_t init = op == R_PROD ? 1 : op == R_MAX ? lo : op == R_MIN ? hi : 0;
    for (int64_t i = 0; i < on; i++) acc[i] = init;
    if (xn > 0) {
        switch (x->dtype) {
        case MTS_DTYPE_INT8: reduce_i8(op, x->data, acc, &g); break;
        case MTS_DTYPE_UINT8: reduce_u8(op, x->data, acc, &g); break;
        case MTS_DTYPE_INT16: reduce_i16(op, x->data, acc, &g); break;
        case MTS_DTYPE_UINT16: reduce_u16(op, x->data, acc, &g); break;
        case MTS_DTYPE_INT32: reduce_i32(op, x->data, acc, &g); break;
        case MTS_DTYPE_UINT32: reduce_u32(op, x->data, acc, &g); break;
        case MTS_DTYPE_UINT64: reduce_u64(op, x->data, acc, &g); break;
        default: reduce_i64(op, x->data, acc, &g); break;
        }
    }
    for (int64_t i = 0; i < on; i++) {
        int64_t v = acc[i];
        if (op == R_MEAN) v = count ? v / count : 0;
        else if (op == R_L2) v = f2i64(sqrt((double)v));
        st_i(o->data, o->dtype, i, v);
    }
    free(acc);
    return MTS_OK;
}

#define DEF_REDUCE(NAME, OP)                                                                  \
    static int NAME##_infer(mts_kctx *k) { return reduce_infer(k, OP); }                      \
    static int NAME##_run(mts_kctx *k) { return reduce_run(k, OP); }

DEF_REDUCE(rsum, R_SUM)
DEF_REDUCE(rmean, R_MEAN)
DEF_REDUCE(rmax, R_MAX)
DEF_REDUCE(rmin, R_MIN)
DEF_REDUCE(rprod, R_PROD)
DEF_REDUCE(rl2, R_L2)
DEF_REDUCE(rsumsq, R_SUMSQ)

/* ------------------------------------------------------------------------------------------ */
/* Softmax / LogSoftmax                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Splits x into outer x n x inner around the softmax axis, by opset semantics. */
static int softmax_geom(mts_kctx *k, const mts_tensor **x, int64_t *outer, int64_t *n, int64_t *inner)
{
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = check_in(k, 0, M_F32, x);
    if (rc) return rc;
    const mts_tensor *t = *x;
    bool v13 = k->node->opset >= 13;
    int64_t axis = mts_attr_int(k->node, "axis", v13 ? -1 : 1);
    int a;
    if (t->rank == 0) {
        /* A scalar is one row of one element. */
        if (axis != 0 && axis != -1)
            return mts_err_set(k->err, MTS_EINVAL, "axis %lld is out of range for a scalar", (long long)axis);
        *outer = *n = *inner = 1;
        return MTS_OK;
    }
    if (v13) {
        if ((rc = mts_norm_axis(axis, t->rank, &a, k->err))) return rc;
    } else {
        /* Coerced to 2-D [prod(dims[:axis]), prod(dims[axis:])]; axis may equal rank. */
        int64_t aa = axis < 0 ? axis + t->rank : axis;
        if (aa < 0 || aa > t->rank)
            return mts_err_set(k->err, MTS_EINVAL, "axis %lld is out of range for rank %d", (long long)axis, t->rank);
        a = (int)aa;
    }
    *outer = 1;
    *n = 1;
    *inner = 1;
    for (int i = 0; i < t->rank; i++) {
        if (i < a) *outer *= t->dims[i];
        else if (i == a || !v13) *n *= t->dims[i];
        else *inner *= t->dims[i];
    }
    return MTS_OK;
}

static int softmax_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int64_t o, n, in;
    int rc = softmax_geom(k, &x, &o, &n, &in);
    if (rc) return rc;
    set_out(k, 0, x->dtype, x->rank, x->dims);
    return MTS_OK;
}

static int softmax_common(mts_kctx *k, bool log_out)
{
    const mts_tensor *x;
    int64_t outer, n, inner;
    int rc = softmax_geom(k, &x, &outer, &n, &inner);
    if (rc) return rc;
    const float *xs = x->data;
    float *y = k->out[0].data;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            const float *xp = xs + o * n * inner + i;
            float *yp = y + o * n * inner + i;
            float mx = -INFINITY;
            for (int64_t j = 0; j < n; j++)
                if (xp[j * inner] > mx) mx = xp[j * inner];
            double sum = 0;
            for (int64_t j = 0; j < n; j++) {
                float e = expf(xp[j * inner] - mx);
                sum += e;
                if (!log_out) yp[j * inner] = e;
            }
            if (log_out) {
                float ls = (float)log(sum);
                for (int64_t j = 0; j < n; j++) yp[j * inner] = xp[j * inner] - mx - ls;
            } else {
                float inv = (float)(1.0 / sum);
                for (int64_t j = 0; j < n; j++) yp[j * inner] *= inv;
            }
        }
    }
    return MTS_OK;
}

static int softmax_run(mts_kctx *k) { return softmax_common(k, false); }
static int logsoftmax_run(mts_kctx *k) { return softmax_common(k, true); }

/* ------------------------------------------------------------------------------------------ */
/* ArgMax / ArgMin                                                                            */
/* ------------------------------------------------------------------------------------------ */

static int arg_prepare(mts_kctx *k, const mts_tensor **x, int *axis)
{
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = check_in(k, 0, M_NUM, x);
    if (rc) return rc;
    if ((*x)->rank < 1) return mts_err_set(k->err, MTS_ESHAPE, "input must have rank >= 1, got a scalar");
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), (*x)->rank, axis, k->err))) return rc;
    if ((*x)->dims[*axis] == 0 && numel(*x) == 0) {
        int64_t others = 1;
        for (int i = 0; i < (*x)->rank; i++)
            if (i != *axis) others *= (*x)->dims[i];
        if (others > 0) return mts_err_set(k->err, MTS_ESHAPE, "cannot take the arg of an empty axis %d", *axis);
    }
    return MTS_OK;
}

static int arg_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int axis, rc = arg_prepare(k, &x, &axis);
    if (rc) return rc;
    bool keep = mts_attr_int(k->node, "keepdims", 1) != 0;
    int64_t d[MTS_MAX_RANK];
    int r = 0;
    for (int i = 0; i < x->rank; i++) {
        if (i != axis) d[r++] = x->dims[i];
        else if (keep) d[r++] = 1;
    }
    set_out(k, 0, MTS_DTYPE_INT64, r, d);
    return MTS_OK;
}

/* BETTER(v, best) / SAME(v, best) for the element type; NaN counts as the extreme value. */
#define ARG_LOOP(T, BETTER, SAME)                                                             \
    do {                                                                                      \
        const T *xs_ = (const T *)x->data;                                                    \
        for (int64_t o = 0; o < outer; o++)                                                   \
            for (int64_t i = 0; i < inner; i++) {                                             \
                const T *p = xs_ + o * n * inner + i;                                         \
                T best = p[0];                                                                \
                int64_t bi = 0;                                                               \
                for (int64_t j = 1; j < n; j++) {                                             \
                    T v = p[j * inner];                                                       \
                    if (BETTER(v, best) || (last && SAME(v, best))) {                         \
                        best = v;                                                             \
                        bi = j;                                                               \
                    }                                                                         \
                }                                                                             \
                y[o * inner + i] = bi;                                                        \
            }                                                                                 \
    } while (0)

#define GT_I(v, b) ((v) > (b))
#define LT_I(v, b) ((v) < (b))
#define EQ_I(v, b) ((v) == (b))
#define GT_F(v, b) ((v) > (b) || ((v) != (v) && (b) == (b)))
#define LT_F(v, b) ((v) < (b) || ((v) != (v) && (b) == (b)))
#define EQ_F(v, b) ((v) == (b) || ((v) != (v) && (b) != (b)))

static int arg_run(mts_kctx *k, bool is_max)
{
    const mts_tensor *x;
    int axis, rc = arg_prepare(k, &x, &axis);
    if (rc) return rc;
    bool last = k->node->opset >= 12 && mts_attr_int(k->node, "select_last_index", 0) != 0;
    int64_t outer = 1, n = x->dims[axis], inner = 1;
    for (int i = 0; i < x->rank; i++) {
        if (i < axis) outer *= x->dims[i];
        else if (i > axis) inner *= x->dims[i];
    }
    if (n == 0 || numel(x) == 0) return MTS_OK;
    int64_t *y = k->out[0].data;
    switch (x->dtype) {
    case MTS_DTYPE_FLOAT:
        if (is_max) ARG_LOOP(float, GT_F, EQ_F);
        else ARG_LOOP(float, LT_F, EQ_F);
        break;
#define ARG_INT_CASE(DT, T)                                                                   \
    case DT:                                                                                  \
        if (is_max) ARG_LOOP(T, GT_I, EQ_I);                                                  \
        else ARG_LOOP(T, LT_I, EQ_I);                                                         \
        break;
    ARG_INT_CASE(MTS_DTYPE_INT8, int8_t)
    ARG_INT_CASE(MTS_DTYPE_UINT8, uint8_t)
    ARG_INT_CASE(MTS_DTYPE_INT32, int32_t)
    ARG_INT_CASE(MTS_DTYPE_INT64, int64_t)
#undef ARG_INT_CASE
    default: break;
    }
    return MTS_OK;
}

static int argmax_run(mts_kctx *k) { return arg_run(k, true); }
static int argmin_run(mts_kctx *k) { return arg_run(k, false); }

/* ------------------------------------------------------------------------------------------ */
/* The op table                                                                               */
/* ------------------------------------------------------------------------------------------ */

const mts_op mts_ref_ops_math[] = {
    {"Relu", relu_infer, relu_run},
    {"LeakyRelu", leaky_infer, leaky_run},
    {"PRelu", prelu_infer, prelu_run},
    {"Sigmoid", sigmoid_infer, sigmoid_run},
    {"Tanh", tanh_infer, tanh_run},
    {"HardSigmoid", hsigmoid_infer, hsigmoid_run},
    {"HardSwish", hswish_infer, hswish_run},
    {"Clip", clip_infer, clip_run},
    {"Elu", elu_infer, elu_run},
    {"Erf", erf_infer, erf_run},
    {"Exp", exp_infer, exp_run},
    {"Sqrt", sqrt_infer, sqrt_run},
    {"Neg", neg_infer, neg_run},
    {"Abs", abs_infer, abs_run},
    {"Log", log_infer, log_run},
    {"Reciprocal", recip_infer, recip_run},
    {"Floor", floor_infer, floor_run},
    {"Ceil", ceil_infer, ceil_run},
    {"Softplus", softplus_infer, softplus_run},
    {"Selu", selu_infer, selu_run},
    {"Sin", sin_infer, sin_run},
    {"Cos", cos_infer, cos_run},
    {"Add", add_infer, add_run},
    {"Sub", sub_infer, sub_run},
    {"Mul", mul_infer, mul_run},
    {"Div", div_infer, div_run},
    {"Pow", pow_infer, pow_run},
    {"Equal", equal_infer, equal_run},
    {"Greater", greater_infer, greater_run},
    {"Less", less_infer, less_run},
    {"GreaterOrEqual", greater_eq_infer, greater_eq_run},
    {"LessOrEqual", less_eq_infer, less_eq_run},
    {"And", and_infer, and_run},
    {"Or", or_infer, or_run},
    {"Xor", xor_infer, xor_run},
    {"Not", not_infer, not_run},
    {"Where", where_infer, where_run},
    {"Min", min_infer, min_run},
    {"Max", max_infer, max_run},
    {"Sum", sum_infer, sum_run},
    {"Mean", mean_infer, mean_run},
    {"Cast", cast_infer, cast_run},
    {"CastLike", castlike_infer, castlike_run},
    {"BatchNormalization", batchnorm_infer, batchnorm_run},
    {"InstanceNormalization", instnorm_infer, instnorm_run},
    {"LayerNormalization", layernorm_infer, layernorm_run},
    {"ReduceMean", rmean_infer, rmean_run},
    {"ReduceMax", rmax_infer, rmax_run},
    {"ReduceMin", rmin_infer, rmin_run},
    {"ReduceSum", rsum_infer, rsum_run},
    {"ReduceProd", rprod_infer, rprod_run},
    {"ReduceL2", rl2_infer, rl2_run},
    {"ReduceSumSquare", rsumsq_infer, rsumsq_run},
    {"Softmax", softmax_infer, softmax_run},
    {"LogSoftmax", softmax_infer, logsoftmax_run},
    {"ArgMax", arg_infer, argmax_run},
    {"ArgMin", arg_infer, argmin_run},
    {NULL, NULL, NULL},
};
