/*
 * Reference (plain C) kernels for the less common math operators: the unary functions Softsign,
 * Celu, ThresholdedRelu, Shrink, Round (half to even), Sign, IsNaN, IsInf and the trigonometric
 * and hyperbolic functions (Tan ... Atanh); the broadcasting binary ops Mod (fmod 0 and 1) and
 * BitShift; LRN and MeanVarianceNormalization; the reductions ReduceL1, ReduceLogSum and
 * ReduceLogSumExp (axes as attribute or, from opset 18, as input); and Det (batched LU).
 *
 * Element types are dispatched by one switch per kernel over the core types (float, int8, uint8,
 * int32, int64, bool); the generic paths read and write elements through ld_f/ld_i and
 * st_f/st_i, which also cover double, int16 and uint16/32/64, so an op takes a further type by
 * naming it in its mask. Mod takes all of those numeric types (unsigned ones stay unsigned up to
 * 2^64), BitShift uint8/16/32/64, the three reductions double as well. Floats are computed in
 * float (elementwise) or with double accumulators (reductions, normalizations, Det).
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"
#include "engine/kernels/ref_math2.h"

/* ------------------------------------------------------------------------------------------ */
/* Unary elementwise                                                                          */
/* ------------------------------------------------------------------------------------------ */

enum u2_op {
    U2_SOFTSIGN, U2_CELU, U2_THRELU, U2_SHRINK, U2_ROUND, U2_SIGN, U2_TAN, U2_ASIN, U2_ACOS, U2_ATAN,
    U2_SINH, U2_COSH, U2_ASINH, U2_ACOSH, U2_ATANH, U2_ISNAN, U2_ISINF,
};

typedef struct u2_ctx {
    int op;
    mts_dtype dt;
    const void *x;
    void *y;
    int64_t n;
    float a, b;    /* op parameters (alpha, bias/lambd) */
    bool neg, pos; /* IsInf detection */
} u2_ctx;

static inline float sign_f(float v) { return v > 0.0f ? 1.0f : v < 0.0f ? -1.0f : v; /* keeps 0 and NaN */ }

static void u2_float(const u2_ctx *c, int64_t lo, int64_t hi)
{
    const float *x = c->x;
    float *y = c->y;
    float a = c->a, b = c->b;
#define U2L(EXPR) for (int64_t i = lo; i < hi; i++) { float v = x[i]; y[i] = (EXPR); } break
    switch (c->op) {
    case U2_SOFTSIGN: U2L(v / (1.0f + fabsf(v)));
    case U2_CELU: U2L(fmaxf(0.0f, v) + fminf(0.0f, a * expm1f(v / a)));
    case U2_THRELU: U2L(v > a ? v : 0.0f);
    case U2_SHRINK: U2L(v < -b ? v + a : v > b ? v - a : 0.0f);
    case U2_ROUND: U2L(nearbyintf(v));
    case U2_SIGN: U2L(sign_f(v));
    case U2_TAN: U2L(tanf(v));
    case U2_ASIN: U2L(asinf(v));
    case U2_ACOS: U2L(acosf(v));
    case U2_ATAN: U2L(atanf(v));
    case U2_SINH: U2L(sinhf(v));
    case U2_COSH: U2L(coshf(v));
    case U2_ASINH: U2L(asinhf(v));
    case U2_ACOSH: U2L(acoshf(v));
    case U2_ATANH: U2L(atanhf(v));
    default: break;
    }
#undef U2L
}

/* Integer Sign and Shrink through int64 / double; other ops take floats only. */
static void u2_int(const u2_ctx *c, int64_t lo, int64_t hi)
{
    for (int64_t i = lo; i < hi; i++) {
        int64_t v = ld_i(c->x, c->dt, i);
        if (c->op == U2_SIGN) {
            st_i(c->y, c->dt, i, v > 0 ? 1 : v < 0 ? -1 : 0);
        } else { /* U2_SHRINK */
            double d = (double)v, r = d < -c->b ? d + c->a : d > c->b ? d - c->a : 0.0;
            st_i(c->y, c->dt, i, f2i64(r));
        }
    }
}

static void u2_pred(const u2_ctx *c, int64_t lo, int64_t hi)
{
    uint8_t *y = c->y;
    if (c->dt != MTS_DTYPE_FLOAT) { /* integers are never NaN or infinite */
        memset(y + lo, 0, (size_t)(hi - lo));
        return;
    }
    const float *x = c->x;
    for (int64_t i = lo; i < hi; i++) {
        float v = x[i];
        if (c->op == U2_ISNAN) y[i] = v != v;
        else y[i] = (c->pos && v == INFINITY) || (c->neg && v == -INFINITY);
    }
}

static void u2_part(void *ctx, int ithr, int nthr)
{
    const u2_ctx *c = ctx;
    int64_t lo, hi;
    part_range(c->n, ithr, nthr, &lo, &hi);
    if (lo >= hi) return;
    if (c->op == U2_ISNAN || c->op == U2_ISINF) u2_pred(c, lo, hi);
    else if (c->dt == MTS_DTYPE_FLOAT) u2_float(c, lo, hi);
    else u2_int(c, lo, hi);
}

static unsigned u2_mask(int op)
{
    switch (op) {
    case U2_SIGN: return M_NUM;
    case U2_SHRINK: return M_NUM;
    case U2_ISNAN: case U2_ISINF: return M_F32;
    default: return M_F32;
    }
}

static int u2_infer(mts_kctx *k, int op)
{
    const mts_tensor *x;
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = check_in(k, 0, u2_mask(op), &x);
    if (rc) return rc;
    if (op == U2_CELU && mts_attr_float(k->node, "alpha", 1.0f) == 0.0f)
        return mts_err_set(k->err, MTS_EINVAL, "attribute alpha must not be 0");
    bool pred = op == U2_ISNAN || op == U2_ISINF;
    set_out(k, 0, pred ? MTS_DTYPE_BOOL : x->dtype, x->rank, x->dims);
    return MTS_OK;
}

static int u2_run(mts_kctx *k, int op)
{
    const mts_tensor *x = k->in[0];
    const mts_node *nd = k->node;
    u2_ctx c = {op, x->dtype, x->data, k->out[0].data, numel(x), 0, 0, true, true};
    switch (op) {
    case U2_CELU: c.a = mts_attr_float(nd, "alpha", 1.0f); break;
    case U2_THRELU: c.a = mts_attr_float(nd, "alpha", 1.0f); break;
    case U2_SHRINK:
        c.a = mts_attr_float(nd, "bias", 0.0f);
        c.b = mts_attr_float(nd, "lambd", 0.5f);
        break;
    case U2_ISINF:
        c.neg = mts_attr_int(nd, "detect_negative", 1) != 0;
        c.pos = mts_attr_int(nd, "detect_positive", 1) != 0;
        break;
    default: break;
    }
    mts_parallel(par_threads(k, c.n), u2_part, &c);
    return MTS_OK;
}

#define DEF_U2(NAME, OP)                                                                      \
    static int NAME##_infer(mts_kctx *k) { return u2_infer(k, OP); }                          \
    static int NAME##_run(mts_kctx *k) { return u2_run(k, OP); }

DEF_U2(softsign, U2_SOFTSIGN)
DEF_U2(celu, U2_CELU)
DEF_U2(threlu, U2_THRELU)
DEF_U2(shrink, U2_SHRINK)
DEF_U2(round, U2_ROUND)
DEF_U2(sign, U2_SIGN)
DEF_U2(tan, U2_TAN)
DEF_U2(asin, U2_ASIN)
DEF_U2(acos, U2_ACOS)
DEF_U2(atan, U2_ATAN)
DEF_U2(sinh, U2_SINH)
DEF_U2(cosh, U2_COSH)
DEF_U2(asinh, U2_ASINH)
DEF_U2(acosh, U2_ACOSH)
DEF_U2(atanh, U2_ATANH)
DEF_U2(isnan, U2_ISNAN)
DEF_U2(isinf, U2_ISINF)

/* ------------------------------------------------------------------------------------------ */
/* Broadcasting binary ops: Mod, BitShift                                                     */
/* ------------------------------------------------------------------------------------------ */

enum b2_op { B2_MOD, B2_FMOD, B2_SHL, B2_SHR };

/* Python-style integer remainder (sign of the divisor); x % 0 yields 0. */
static inline int64_t imod(int64_t a, int64_t b)
{
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

/* C-style remainder (sign of the dividend); x % 0 yields 0. */
static inline int64_t ifmod(int64_t a, int64_t b) { return (b == 0 || b == -1) ? 0 : a % b; }

static inline uint64_t ushift(uint64_t a, uint64_t s, bool left, unsigned bits)
{
    if (s >= bits) return 0;
    return left ? a << s : a >> s;
}

static void b2_elem(int op, mts_dtype dt, void *y, int64_t i, const void *a, int64_t ia, const void *b, int64_t ib)
{
    if (dt == MTS_DTYPE_FLOAT) { /* Mod with fmod=1 */
        ((float *)y)[i] = fmodf(((const float *)a)[ia], ((const float *)b)[ib]);
        return;
    }
    if (dt == MTS_DTYPE_DOUBLE) {
        ((double *)y)[i] = fmod(((const double *)a)[ia], ((const double *)b)[ib]);
        return;
    }
    int64_t va = ld_i(a, dt, ia), vb = ld_i(b, dt, ib);
    if ((op == B2_MOD || op == B2_FMOD) && (DTM(dt) & M_UINT)) { /* both remainders agree; uint64 stays unsigned */
        uint64_t ua = (uint64_t)va, ub = (uint64_t)vb;
        st_i(y, dt, i, (int64_t)(ub == 0 ? 0 : ua % ub));
        return;
    }
    switch (op) {
    case B2_MOD: st_i(y, dt, i, imod(va, vb)); break;
    case B2_FMOD: st_i(y, dt, i, ifmod(va, vb)); break;
    default: {
        unsigned bits = (unsigned)(8 * mts_dtype_size(dt));
        uint64_t mask = bits >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
        uint64_t r = ushift((uint64_t)va & mask, (uint64_t)vb & mask, op == B2_SHL, bits) & mask;
        st_i(y, dt, i, (int64_t)r);
    } break;
    }
}

static int b2_op_of(mts_kctx *k, mts_dtype dt, int *op)
{
    const mts_node *nd = k->node;
    if (!strcmp(nd->op_type, "Mod")) {
        int64_t f = mts_attr_int(nd, "fmod", 0);
        if (f != 0 && f != 1) return mts_err_set(k->err, MTS_EINVAL, "attribute fmod must be 0 or 1, got %lld", (long long)f);
        if (f == 0 && (dt == MTS_DTYPE_FLOAT || dt == MTS_DTYPE_DOUBLE))
            return mts_err_set(k->err, MTS_EINVAL, "fmod=0 is only defined for integer inputs; float inputs need fmod=1");
        *op = f ? B2_FMOD : B2_MOD;
        return MTS_OK;
    }
    const char *dir = mts_attr_string(nd, "direction", NULL);
    if (!dir) return mts_err_set(k->err, MTS_EINVAL, "required attribute direction is missing");
    if (!strcmp(dir, "LEFT")) *op = B2_SHL;
    else if (!strcmp(dir, "RIGHT")) *op = B2_SHR;
    else return mts_err_set(k->err, MTS_EINVAL, "attribute direction must be LEFT or RIGHT, got '%s'", dir);
    return MTS_OK;
}

static int b2_infer(mts_kctx *k, unsigned mask)
{
    const mts_tensor *a, *b;
    int rc = check_arity(k, 2, 2), op;
    if (!rc) rc = check_in(k, 0, mask, &a);
    if (!rc) rc = check_in(k, 1, mask, &b);
    if (rc) return rc;
    if (a->dtype != b->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "inputs must have the same dtype, got %s and %s",
                           mts_dtype_name(a->dtype), mts_dtype_name(b->dtype));
    if ((rc = b2_op_of(k, a->dtype, &op))) return rc;
    mts_tensor o;
    if ((rc = mts_broadcast_shape(a, b, &o, k->err))) return rc;
    set_out(k, 0, a->dtype, o.rank, o.dims);
    return MTS_OK;
}

typedef struct b2_ctx {
    int op;
    const mts_tensor *a, *b;
    mts_tensor *o;
    int64_t sa[MTS_MAX_RANK], sb[MTS_MAX_RANK];
} b2_ctx;

/* Output elements [lo, hi) of the broadcast walk, starting from lo's multi-index. */
static void b2_part(void *ctx, int ithr, int nthr)
{
    const b2_ctx *c = ctx;
    const mts_tensor *o = c->o;
    int64_t lo, hi, idx[MTS_MAX_RANK] = {0}, oa = 0, ob = 0;
    part_range(numel(o), ithr, nthr, &lo, &hi);
    if (lo >= hi) return;
    int R = o->rank;
    int64_t rem = lo;
    for (int d = R - 1; d >= 0; d--) {
        idx[d] = rem % o->dims[d];
        rem /= o->dims[d];
        oa += idx[d] * c->sa[d];
        ob += idx[d] * c->sb[d];
    }
    for (int64_t i = lo; i < hi; i++) {
        b2_elem(c->op, c->a->dtype, o->data, i, c->a->data, oa, c->b->data, ob);
        for (int d = R - 1; d >= 0; d--) {
            oa += c->sa[d];
            ob += c->sb[d];
            if (++idx[d] < o->dims[d]) break;
            oa -= c->sa[d] * o->dims[d];
            ob -= c->sb[d] * o->dims[d];
            idx[d] = 0;
        }
    }
}

static int b2_run(mts_kctx *k)
{
    b2_ctx c = {0, k->in[0], k->in[1], &k->out[0], {0}, {0}};
    int rc = b2_op_of(k, c.a->dtype, &c.op);
    if (rc) return rc;
    int64_t n = numel(c.o);
    if (n == 0) return MTS_OK;
    bcast_strides(c.a, c.o, c.sa);
    bcast_strides(c.b, c.o, c.sb);
    mts_parallel(par_threads(k, n), b2_part, &c);
    return MTS_OK;
}

static int mod_infer(mts_kctx *k) { return b2_infer(k, M_F32 | M_F64 | M_INT_ALL); }
static int bitshift_infer(mts_kctx *k) { return b2_infer(k, M_UINT); }

/* ------------------------------------------------------------------------------------------ */
/* LRN                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static int lrn_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = check_in(k, 0, M_F32, &x);
    if (rc) return rc;
    if (x->rank < 2)
        return mts_err_set(k->err, MTS_ESHAPE, "input must have rank >= 2 (N x C x ...), got rank %d", x->rank);
    int64_t size = mts_attr_int(k->node, "size", 0);
    if (size < 1) return mts_err_set(k->err, MTS_EINVAL, "attribute size must be >= 1, got %lld", (long long)size);
    set_out(k, 0, x->dtype, x->rank, x->dims);
    return MTS_OK;
}

typedef struct lrn_ctx {
    const float *x;
    float *y;
    int64_t N, C, S, lo_off, hi_off;
    double alpha, beta, bias;
} lrn_ctx;

static void lrn_part(void *ctx, int ithr, int nthr)
{
    const lrn_ctx *c = ctx;
    int64_t lo, hi;
    part_range(c->N * c->C, ithr, nthr, &lo, &hi);
    for (int64_t nc = lo; nc < hi; nc++) {
        int64_t n = nc / c->C, ch = nc % c->C;
        int64_t c0 = ch - c->lo_off < 0 ? 0 : ch - c->lo_off;
        int64_t c1 = ch + c->hi_off > c->C - 1 ? c->C - 1 : ch + c->hi_off;
        const float *xp = c->x + nc * c->S;
        float *yp = c->y + nc * c->S;
        for (int64_t s = 0; s < c->S; s++) {
            double sq = 0;
            for (int64_t j = c0; j <= c1; j++) {
                double v = c->x[(n * c->C + j) * c->S + s];
                sq += v * v;
            }
            yp[s] = (float)(xp[s] / pow(c->bias + c->alpha * sq, c->beta));
        }
    }
}

static int lrn_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    const mts_node *nd = k->node;
    int64_t size = mts_attr_int(nd, "size", 1);
    lrn_ctx c = {x->data, k->out[0].data, x->dims[0], x->dims[1], 1, (size - 1) / 2, size / 2,
                 (double)mts_attr_float(nd, "alpha", 1e-4f) / (double)size, mts_attr_float(nd, "beta", 0.75f),
                 mts_attr_float(nd, "bias", 1.0f)};
    for (int i = 2; i < x->rank; i++) c.S *= x->dims[i];
    mts_parallel(par_threads(k, numel(x) * (size < 64 ? size : 64)), lrn_part, &c);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Reduction helpers shared by MeanVarianceNormalization and the Reduce ops here               */
/* ------------------------------------------------------------------------------------------ */

/* Reads axes (attribute, or input 1 when from_input) into mask. *noop: empty axes with
 * noop_with_empty_axes. Empty axes otherwise select every axis. */
static int axes_mask(mts_kctx *k, const mts_tensor *x, bool from_input, const int64_t *dflt, int ndflt, bool *mask,
                     bool *noop)
{
    const mts_node *nd = k->node;
    int R = x->rank, na = 0;
    int64_t ax[MTS_MAX_RANK];
    *noop = false;
    for (int i = 0; i < MTS_MAX_RANK; i++) mask[i] = false;
    if (from_input) {
        const mts_tensor *a = mts_kin(k, 1);
        if (a) {
            int rc = check_t(k, a, 1, M_I64);
            if (rc) return rc;
            if (a->rank > 1) return mts_err_set(k->err, MTS_ESHAPE, "input 1 (axes) must be 1-D, got rank %d", a->rank);
            int64_t n = numel(a);
            if (n > R) return mts_err_set(k->err, MTS_EINVAL, "%lld axes given for an input of rank %d", (long long)n, R);
            if (n > 0 && !a->data) return MTS_EDYNAMIC;
            for (int64_t i = 0; i < n; i++) ax[na++] = ((const int64_t *)a->data)[i];
        }
        if (na == 0 && mts_attr_int(nd, "noop_with_empty_axes", 0)) {
            *noop = true;
            return MTS_OK;
        }
    } else {
        const int64_t *v = mts_attr_ints(nd, "axes", &na);
        if (!v) {
            v = dflt;
            na = ndflt;
        }
        if (na > R) return mts_err_set(k->err, MTS_EINVAL, "%d axes given for an input of rank %d", na, R);
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

/* Strides of the kept-axes output for every input axis (0 on reduced axes). */
static void reduced_strides(const mts_tensor *x, const bool *mask, int64_t *ost)
{
    int64_t s = 1;
    for (int i = x->rank - 1; i >= 0; i--) {
        ost[i] = mask[i] ? 0 : s;
        if (!mask[i]) s *= x->dims[i];
    }
}

/* Calls STMT for every element of x with `xi` its index and `oi` its output (reduced) index. */
#define WALK_REDUCED(x, ost, STMT)                                                            \
    do {                                                                                      \
        int64_t n_ = numel(x), idx_[MTS_MAX_RANK] = {0}, oi = 0;                              \
        for (int64_t xi = 0; xi < n_; xi++) {                                                 \
            STMT;                                                                             \
            for (int d_ = (x)->rank - 1; d_ >= 0; d_--) {                                     \
                oi += (ost)[d_];                                                              \
                if (++idx_[d_] < (x)->dims[d_]) break;                                        \
                oi -= (ost)[d_] * (x)->dims[d_];                                              \
                idx_[d_] = 0;                                                                 \
            }                                                                                 \
        }                                                                                     \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* MeanVarianceNormalization                                                                  */
/* ------------------------------------------------------------------------------------------ */

static const int64_t mvn_default_axes[] = {0, 2, 3};

static int mvn_prepare(mts_kctx *k, const mts_tensor **x, bool *mask)
{
    bool noop;
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = check_in(k, 0, M_F32, x);
    if (rc) return rc;
    int nd = mts_node_attr(k->node, "axes") ? 0 : 3;
    if (nd == 3 && (*x)->rank < 4)
        return mts_err_set(k->err, MTS_ESHAPE, "the default axes [0,2,3] need an input of rank >= 4, got rank %d",
                           (*x)->rank);
    return axes_mask(k, *x, false, mvn_default_axes, 3, mask, &noop);
}

static int mvn_infer(mts_kctx *k)
{
    const mts_tensor *x;
    bool mask[MTS_MAX_RANK];
    int rc = mvn_prepare(k, &x, mask);
    if (rc) return rc;
    set_out(k, 0, x->dtype, x->rank, x->dims);
    return MTS_OK;
}

static int mvn_run(mts_kctx *k)
{
    const mts_tensor *x;
    bool mask[MTS_MAX_RANK];
    int rc = mvn_prepare(k, &x, mask);
    if (rc) return rc;
    int64_t ost[MTS_MAX_RANK], on = 1, cnt = 1;
    for (int i = 0; i < x->rank; i++) {
        if (mask[i]) cnt *= x->dims[i];
        else on *= x->dims[i];
    }
    if (numel(x) == 0) return MTS_OK;
    reduced_strides(x, mask, ost);
    double *acc = calloc((size_t)on * 2, sizeof(double));
    if (!acc) return mts_err_set(k->err, MTS_ENOMEM, "out of memory for normalization statistics");
    const float *xs = x->data;
    float *y = k->out[0].data;
    WALK_REDUCED(x, ost, acc[oi] += xs[xi]);
    for (int64_t i = 0; i < on; i++) acc[i] /= (double)cnt;
    WALK_REDUCED(x, ost, { double d = xs[xi] - acc[oi]; acc[on + oi] += d * d; });
    for (int64_t i = 0; i < on; i++) acc[on + i] = sqrt(acc[on + i] / (double)cnt) + 1e-9;
    WALK_REDUCED(x, ost, y[xi] = (float)((xs[xi] - acc[oi]) / acc[on + oi]));
    free(acc);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* ReduceL1 / ReduceLogSum / ReduceLogSumExp                                                  */
/* ------------------------------------------------------------------------------------------ */

enum r2_op { R2_L1, R2_LOGSUM, R2_LOGSUMEXP };

static int r2_prepare(mts_kctx *k, const mts_tensor **x, bool *mask, bool *noop)
{
    int rc = check_arity(k, 1, 2);
    if (!rc) rc = check_in(k, 0, M_F32 | M_F64 | M_INT, x);
    if (rc) return rc;
    return axes_mask(k, *x, k->node->opset >= 18, NULL, 0, mask, noop);
}

static int r2_infer(mts_kctx *k)
{
    const mts_tensor *x;
    bool mask[MTS_MAX_RANK], noop;
    int rc = r2_prepare(k, &x, mask, &noop);
    if (rc) return rc;
    bool keep = mts_attr_int(k->node, "keepdims", 1) != 0;
    int64_t d[MTS_MAX_RANK];
    int r = 0;
    for (int i = 0; i < x->rank; i++) {
        if (noop || !mask[i]) d[r++] = x->dims[i];
        else if (keep) d[r++] = 1;
    }
    set_out(k, 0, x->dtype, r, d);
    return MTS_OK;
}

static int r2_run(mts_kctx *k, int op)
{
    const mts_tensor *x;
    bool mask[MTS_MAX_RANK], noop;
    int rc = r2_prepare(k, &x, mask, &noop);
    if (rc) return rc;
    mts_tensor *o = &k->out[0];
    int64_t on = numel(o);
    mts_dtype dt = x->dtype;
    if (noop) { /* identity, but still the op's elementwise part */
        for (int i = 0; i < x->rank; i++) mask[i] = false;
    }
    if (on == 0) return MTS_OK;
    int64_t ost[MTS_MAX_RANK];
    reduced_strides(x, mask, ost);
    double *acc = malloc((size_t)on * 2 * sizeof(double));
    if (!acc) return mts_err_set(k->err, MTS_ENOMEM, "out of memory for reduction accumulators");
    double *mx = acc + on;
    for (int64_t i = 0; i < on; i++) {
        acc[i] = 0;
        mx[i] = -INFINITY;
    }
    const void *xd = x->data;
    switch (op) {
    case R2_L1: WALK_REDUCED(x, ost, acc[oi] += fabs(ld_f(xd, dt, xi))); break;
    case R2_LOGSUM: WALK_REDUCED(x, ost, acc[oi] += ld_f(xd, dt, xi)); break;
    default:
        WALK_REDUCED(x, ost, { double v = ld_f(xd, dt, xi); if (v > mx[oi]) mx[oi] = v; });
        for (int64_t i = 0; i < on; i++)
            if (!isfinite(mx[i])) mx[i] = 0; /* all -inf (or +inf/NaN present): no shift */
        WALK_REDUCED(x, ost, acc[oi] += exp(ld_f(xd, dt, xi) - mx[oi]));
        break;
    }
    for (int64_t i = 0; i < on; i++) {
        double v = acc[i];
        if (op == R2_LOGSUM) v = log(v);
        else if (op == R2_LOGSUMEXP) v = log(v) + mx[i];
        st_f(o->data, dt, i, v);
    }
    free(acc);
    return MTS_OK;
}

static int rl1_run(mts_kctx *k) { return r2_run(k, R2_L1); }
static int rlogsum_run(mts_kctx *k) { return r2_run(k, R2_LOGSUM); }
static int rlogsumexp_run(mts_kctx *k) { return r2_run(k, R2_LOGSUMEXP); }

/* ------------------------------------------------------------------------------------------ */
/* Det                                                                                        */
/* ------------------------------------------------------------------------------------------ */

/* Square matrices up to this order; larger ones are declined (the work is cubic). */
#define DET_MAX_ORDER 4096

static int det_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc = check_arity(k, 1, 1);
    if (!rc) rc = check_in(k, 0, M_F32, &x);
    if (rc) return rc;
    if (x->rank < 2 || x->dims[x->rank - 1] != x->dims[x->rank - 2]) {
        char s[96];
        return mts_err_set(k->err, MTS_ESHAPE, "input must be [..., M, M], got %s", mts_shape_str(x, s, sizeof s));
    }
    if (x->dims[x->rank - 1] > DET_MAX_ORDER)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "matrices of order %lld are above the supported %d",
                           (long long)x->dims[x->rank - 1], DET_MAX_ORDER);
    set_out(k, 0, x->dtype, x->rank - 2, x->dims);
    return MTS_OK;
}

static int det_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    int64_t M = x->dims[x->rank - 1], B = numel(&k->out[0]);
    if (B == 0) return MTS_OK;
    double *a = malloc((size_t)(M * M > 0 ? M * M : 1) * sizeof(double));
    if (!a) return mts_err_set(k->err, MTS_ENOMEM, "out of memory for the LU factorization");
    const float *xs = x->data;
    float *y = k->out[0].data;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < M * M; i++) a[i] = xs[b * M * M + i];
        double det = 1.0;
        for (int64_t c = 0; c < M && det != 0.0; c++) {
            int64_t p = c;
            for (int64_t r = c + 1; r < M; r++)
                if (fabs(a[r * M + c]) > fabs(a[p * M + c])) p = r;
            if (a[p * M + c] == 0.0) {
                det = 0.0;
                break;
            }
            if (p != c) {
                for (int64_t j = 0; j < M; j++) {
                    double t = a[c * M + j];
                    a[c * M + j] = a[p * M + j];
                    a[p * M + j] = t;
                }
                det = -det;
            }
            double piv = a[c * M + c];
            det *= piv;
            for (int64_t r = c + 1; r < M; r++) {
                double f = a[r * M + c] / piv;
                if (f == 0.0) continue;
                for (int64_t j = c + 1; j < M; j++) a[r * M + j] -= f * a[c * M + j];
            }
        }
        y[b] = (float)det;
    }
    free(a);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The op table                                                                               */
/* ------------------------------------------------------------------------------------------ */

const mts_op mts_ref_ops_math2[] = {
    {"Softsign", softsign_infer, softsign_run},
    {"Celu", celu_infer, celu_run},
    {"ThresholdedRelu", threlu_infer, threlu_run},
    {"Shrink", shrink_infer, shrink_run},
    {"Round", round_infer, round_run},
    {"Sign", sign_infer, sign_run},
    {"Tan", tan_infer, tan_run},
    {"Asin", asin_infer, asin_run},
    {"Acos", acos_infer, acos_run},
    {"Atan", atan_infer, atan_run},
    {"Sinh", sinh_infer, sinh_run},
    {"Cosh", cosh_infer, cosh_run},
    {"Asinh", asinh_infer, asinh_run},
    {"Acosh", acosh_infer, acosh_run},
    {"Atanh", atanh_infer, atanh_run},
    {"IsNaN", isnan_infer, isnan_run},
    {"IsInf", isinf_infer, isinf_run},
    {"Mod", mod_infer, b2_run},
    {"BitShift", bitshift_infer, b2_run},
    {"LRN", lrn_infer, lrn_run},
    {"MeanVarianceNormalization", mvn_infer, mvn_run},
    {"ReduceL1", r2_infer, rl1_run},
    {"ReduceLogSum", r2_infer, rlogsum_run},
    {"ReduceLogSumExp", r2_infer, rlogsumexp_run},
    {"Det", det_infer, det_run},
    {NULL, NULL, NULL},
};
