/*
 * Reference kernels for the matrix products and the shape / data-movement ops: MatMul, Gemm,
 * Concat, Split, Slice, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Shape, Size, Gather,
 * GatherElements, Constant, ConstantOfShape, Identity, Dropout (inference), Expand, Tile, Range.
 *
 * Data movement is dtype independent: it works on bytes with the element size from
 * mts_dtype_size(), mostly through one strided-copy routine (Transpose, Slice, Expand, Tile).
 * MatMul and Gemm on floats compute their operand views (batch offsets, transposes as strides)
 * and run the engine's GEMM (gemm.h), which splits large products over up to k->threads threads.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/gemm.h"
#include "engine/kernels/kernel.h"

/* ------------------------------------------------------------------------------------------ */
/* Shared helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

static int req_in(mts_kctx *k, int i, const char *what, const mts_tensor **t)
{
    *t = mts_kin(k, i);
    if (!*t) return mts_err_set(k->err, MTS_EINVAL, "required input %d (%s) is missing", i, what);
    return MTS_OK;
}

static int chk_dtype(mts_kctx *k, const mts_tensor *t, const char *what)
{
    if (!mts_dtype_supported(t->dtype))
        return mts_err_set(k->err, MTS_EUNSUPPORTED,
                           "%s has dtype %s; supported: float, double, float16, bfloat16, 8/16/32/64-bit "
                           "integers, bool", what,
                           mts_dtype_name(t->dtype));
    return MTS_OK;
}

static int set_out_like(mts_kctx *k, int j, const mts_tensor *t)
{
    return mts_kset_out(k, j, t->dtype, t->rank, t->dims);
}

static int64_t prod(const int64_t *d, int from, int to)
{
    int64_t p = 1;
    for (int i = from; i < to; i++) p *= d[i];
    return p;
}

/* Element count of a 0-D or 1-D tensor. */
static int64_t vec_len(const mts_tensor *t)
{
    return t->rank == 0 ? 1 : t->dims[0];
}

/* Checks that t is a 0-D/1-D int32/int64 tensor of at most max elements. */
static int chk_ints(mts_kctx *k, const mts_tensor *t, const char *what, int64_t max)
{
    if (t->dtype != MTS_DTYPE_INT64 && t->dtype != MTS_DTYPE_INT32)
        return mts_err_set(k->err, MTS_EINVAL, "%s must be int64 (or int32), got %s", what, mts_dtype_name(t->dtype));
    if (t->rank > 1) return mts_err_set(k->err, MTS_EINVAL, "%s must be 1-D, got rank %d", what, t->rank);
    int64_t n = vec_len(t);
    if (n < 0 || n > max)
        return mts_err_set(k->err, MTS_EINVAL, "%s has %lld elements; at most %lld are allowed here", what,
                           (long long)n, (long long)max);
    return MTS_OK;
}

/* Validates (see chk_ints) and reads an integer vector; MTS_EDYNAMIC while its data is unknown. */
static int read_ints(mts_kctx *k, const mts_tensor *t, const char *what, int64_t max, int64_t *v, int *n)
{
    int rc = chk_ints(k, t, what, max);
    if (rc) return rc;
    int64_t cnt = vec_len(t);
    if (cnt > 0 && !t->data) return MTS_EDYNAMIC;
    for (int64_t i = 0; i < cnt; i++) v[i] = mts_tensor_get_int(t, i);
    *n = (int)cnt;
    return MTS_OK;
}

/* Reads the axes given either as an attribute (opset < from_opset) or as input in_idx.
 * *present = 0 when neither is given. */
static int read_axes(mts_kctx *k, int from_opset, int in_idx, int64_t max, int64_t *v, int *n, int *present)
{
    *present = 0;
    *n = 0;
    if (k->node->opset >= from_opset) {
        const mts_tensor *t = mts_kin(k, in_idx);
        if (!t) return MTS_OK;
        *present = 1;
        return read_ints(k, t, "axes", max, v, n);
    }
    int na = 0;
    const int64_t *a = mts_attr_ints(k->node, "axes", &na);
    if (!a) return MTS_OK;
    if (na > max)
        return mts_err_set(k->err, MTS_EINVAL, "axes has %d entries; at most %lld are allowed here", na,
                           (long long)max);
    memcpy(v, a, sizeof(int64_t) * (size_t)na);
    *n = na;
    *present = 1;
    return MTS_OK;
}

/* Copies an array of shape dims (row-major, contiguous destination) whose element at index idx
 * comes from src at element offset base + sum(idx[d] * sstr[d]). Strides may be 0 (broadcast)
 * or negative. rank may be up to 2 * MTS_MAX_RANK. */
#define SC_MAX (2 * MTS_MAX_RANK)
static void copy_strided(void *dstv, const void *srcv, int64_t base, int rank, const int64_t *dims,
                         const int64_t *sstr, size_t es)
{
    int64_t d[SC_MAX], s[SC_MAX];
    int n = 0;
    for (int i = 0; i < rank; i++) {
        if (dims[i] == 0) return;
        if (dims[i] == 1) continue;
        if (n > 0 && s[n - 1] == sstr[i] * dims[i]) { /* merge with the previous dimension */
            d[n - 1] *= dims[i];
            s[n - 1] = sstr[i];
            continue;
        }
        d[n] = dims[i];
        s[n] = sstr[i];
        n++;
    }
    uint8_t *dst = dstv;
    const uint8_t *src = srcv;
    if (n == 0) {
        memcpy(dst, src + base * (int64_t)es, es);
        return;
    }
    int64_t inner = d[n - 1], is = s[n - 1];
    int64_t idx[SC_MAX] = {0};
    int64_t off = base;
    for (;;) {
        const uint8_t *sp = src + off * (int64_t)es;
        if (is == 1) {
            memcpy(dst, sp, (size_t)inner * es);
        } else {
            switch (es) {
            case 1:
                for (int64_t i = 0; i < inner; i++) dst[i] = sp[i * is];
                break;
            case 4: {
                uint32_t *o = (uint32_t *)dst;
                for (int64_t i = 0; i < inner; i++) memcpy(&o[i], sp + i * is * 4, 4);
                break;
            }
            case 8: {
                uint64_t *o = (uint64_t *)dst;
                for (int64_t i = 0; i < inner; i++) memcpy(&o[i], sp + i * is * 8, 8);
                break;
            }
            default:
                for (int64_t i = 0; i < inner; i++) memcpy(dst + i * (int64_t)es, sp + i * is * (int64_t)es, es);
                break;
            }
        }
        dst += inner * (int64_t)es;
        int j = n - 2;
        for (; j >= 0; j--) {
            off += s[j];
            if (++idx[j] < d[j]) break;
            off -= s[j] * d[j];
            idx[j] = 0;
        }
        if (j < 0) break;
    }
}

static void copy_all(mts_kctx *k, const mts_tensor *in, mts_tensor *out)
{
    int64_t nb = mts_tensor_nbytes(in);
    if (nb > 0 && out->data != in->data) memmove(out->data, in->data, (size_t)nb);
}

/* ------------------------------------------------------------------------------------------ */
/* MatMul                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct mm_shape {
    int64_t M, N, K;
    int brank;                     /* rank of the broadcast batch shape */
    int64_t bdims[MTS_MAX_RANK];   /* output batch dims */
    int64_t adims[MTS_MAX_RANK];   /* A's batch dims, right-aligned to brank, padded with 1 */
    int64_t bbdims[MTS_MAX_RANK];  /* B's batch dims, same */
} mm_shape;

static int mm_infer_shape(mts_kctx *k, const mts_tensor *a, const mts_tensor *b, mm_shape *s)
{
    char sa[160], sb[160];
    if (a->rank < 1 || b->rank < 1)
        return mts_err_set(k->err, MTS_EINVAL, "MatMul inputs must have rank >= 1, got ranks %d and %d", a->rank,
                           b->rank);
    int ra = a->rank, rb = b->rank;
    int64_t ka;
    if (ra == 1) {
        s->M = 1;
        ka = a->dims[0];
    } else {
        s->M = a->dims[ra - 2];
        ka = a->dims[ra - 1];
    }
    if (rb == 1) {
        s->K = b->dims[0];
        s->N = 1;
    } else {
        s->K = b->dims[rb - 2];
        s->N = b->dims[rb - 1];
    }
    if (ka != s->K)
        return mts_err_set(k->err, MTS_ESHAPE, "MatMul inner dimensions differ: A %s has K=%lld, B %s has K=%lld",
                           mts_shape_str(a, sa, sizeof sa), (long long)ka, mts_shape_str(b, sb, sizeof sb),
                           (long long)s->K);
    int nba = ra > 2 ? ra - 2 : 0, nbb = rb > 2 ? rb - 2 : 0;
    s->brank = nba > nbb ? nba : nbb;
    for (int i = 0; i < s->brank; i++) {
        int ia = i - (s->brank - nba), ib = i - (s->brank - nbb);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return mts_err_set(k->err, MTS_ESHAPE,
                               "MatMul batch dimensions of A %s and B %s cannot be broadcast (%lld vs %lld)",
                               mts_shape_str(a, sa, sizeof sa), mts_shape_str(b, sb, sizeof sb), (long long)da,
                               (long long)db);
        s->adims[i] = da;
        s->bbdims[i] = db;
        s->bdims[i] = da == 1 ? db : da;
    }
    return MTS_OK;
}

static int matmul_infer(mts_kctx *k)
{
    const mts_tensor *a, *b;
    int rc;
    if ((rc = req_in(k, 0, "A", &a)) || (rc = req_in(k, 1, "B", &b)) || (rc = mts_kchk_n_out(k, 1))) return rc;
    if (a->dtype != b->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "MatMul inputs must have the same dtype, got %s and %s",
                           mts_dtype_name(a->dtype), mts_dtype_name(b->dtype));
    if (a->dtype != MTS_DTYPE_FLOAT && a->dtype != MTS_DTYPE_INT32 && a->dtype != MTS_DTYPE_INT64)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "MatMul dtype %s is not supported (float, int32, int64)",
                           mts_dtype_name(a->dtype));
    mm_shape s;
    int rc2 = mm_infer_shape(k, a, b, &s);
    if (rc2) return rc2;
    int64_t od[MTS_MAX_RANK + 2];
    int orank = 0;
    for (int i = 0; i < s.brank; i++) od[orank++] = s.bdims[i];
    if (a->rank != 1) od[orank++] = s.M;
    if (b->rank != 1) od[orank++] = s.N;
    return mts_kset_out(k, 0, a->dtype, orank, od);
}

/* Per-batch element offsets into A (matrices of M*K) and B (K*N) for the broadcast batch. */
static int mm_offsets(const mm_shape *s, int64_t nbatch, int64_t **aoff, int64_t **boff)
{
    int64_t *ao = malloc(sizeof(int64_t) * (size_t)nbatch), *bo = malloc(sizeof(int64_t) * (size_t)nbatch);
    if (!ao || !bo) {
        free(ao);
        free(bo);
        return MTS_ENOMEM;
    }
    int64_t astr[MTS_MAX_RANK], bstr[MTS_MAX_RANK], idx[MTS_MAX_RANK] = {0};
    int64_t sa = s->M * s->K, sb = s->K * s->N;
    for (int i = s->brank - 1; i >= 0; i--) {
        astr[i] = s->adims[i] == 1 ? 0 : sa;
        bstr[i] = s->bbdims[i] == 1 ? 0 : sb;
        sa *= s->adims[i];
        sb *= s->bbdims[i];
    }
    int64_t oa = 0, ob = 0;
    for (int64_t n = 0; n < nbatch; n++) {
        ao[n] = oa;
        bo[n] = ob;
        for (int j = s->brank - 1; j >= 0; j--) {
            oa += astr[j];
            ob += bstr[j];
            if (++idx[j] < s->bdims[j]) break;
            oa -= astr[j] * s->bdims[j];
            ob -= bstr[j] * s->bdims[j];
            idx[j] = 0;
        }
    }
    *aoff = ao;
    *boff = bo;
    return MTS_OK;
}

#define DEFINE_IMATMUL(NAME, T, UT)                                                                          \
    static void NAME(const mm_shape *s, int64_t nbatch, const int64_t *ao, const int64_t *bo, const T *A,     \
                     const T *B, T *C)                                                                       \
    {                                                                                                        \
        for (int64_t n = 0; n < nbatch; n++) {                                                               \
            const T *a = A + (ao ? ao[n] : 0);                                                               \
            const T *b = B + (bo ? bo[n] : 0);                                                               \
            T *c = C + n * s->M * s->N;                                                                      \
            for (int64_t i = 0; i < s->M; i++) {                                                             \
                UT *row = (UT *)(c + i * s->N);                                                              \
                for (int64_t j = 0; j < s->N; j++) row[j] = 0;                                               \
                for (int64_t p = 0; p < s->K; p++) {                                                         \
                    UT av = (UT)a[i * s->K + p];                                                             \
                    const T *brow = b + p * s->N;                                                            \
                    for (int64_t j = 0; j < s->N; j++) row[j] += av * (UT)brow[j];                           \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
    }
DEFINE_IMATMUL(imatmul_i32, int32_t, uint32_t)
DEFINE_IMATMUL(imatmul_i64, int64_t, uint64_t)

static int matmul_run(mts_kctx *k)
{
    const mts_tensor *a = k->in[0], *b = k->in[1];
    mts_tensor *y = &k->out[0];
    mm_shape s;
    int rc = mm_infer_shape(k, a, b, &s);
    if (rc) return rc;
    int64_t nbatch = prod(s.bdims, 0, s.brank);
    if (nbatch == 0 || s.M == 0 || s.N == 0) return MTS_OK;
    int64_t bprod = prod(s.bbdims, 0, s.brank);
    int64_t *ao = NULL, *bo = NULL;
    int64_t M = s.M;
    if (bprod == 1) { /* B is one matrix: fold A's batch into its rows (A is contiguous) */
        M = s.M * nbatch;
        nbatch = 1;
    } else if ((rc = mm_offsets(&s, nbatch, &ao, &bo))) {
        return rc;
    }
    if (a->dtype == MTS_DTYPE_FLOAT) {
        mts_sgemm g = {.M = M, .N = s.N, .K = s.K, .A = a->data, .a_rs = s.K, .a_cs = 1, .B = b->data,
                       .b_rs = s.N, .b_cs = 1, .C = y->data, .ldc = s.N, .alpha = 1.0f,
                       .nbatch = nbatch, .a_off = ao, .b_off = bo, .c_bs = s.M * s.N};
        rc = mts_sgemm_run(&g, k->threads);
    } else {
        mm_shape f = s;
        f.M = M;
        if (a->dtype == MTS_DTYPE_INT32)
            imatmul_i32(&f, nbatch, ao, bo, a->data, b->data, y->data);
        else
            imatmul_i64(&f, nbatch, ao, bo, a->data, b->data, y->data);
    }
    free(ao);
    free(bo);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Gemm                                                                                        */
/* ------------------------------------------------------------------------------------------ */

static int gemm_dims(mts_kctx *k, int64_t *M, int64_t *N, int64_t *K)
{
    const mts_tensor *a, *b;
    int rc;
    char sa[160], sb[160];
    if ((rc = req_in(k, 0, "A", &a)) || (rc = req_in(k, 1, "B", &b)) || (rc = mts_kchk_n_out(k, 1))) return rc;
    if (a->dtype != MTS_DTYPE_FLOAT || b->dtype != MTS_DTYPE_FLOAT)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Gemm supports float only, got %s and %s",
                           mts_dtype_name(a->dtype), mts_dtype_name(b->dtype));
    if (a->rank != 2 || b->rank != 2)
        return mts_err_set(k->err, MTS_EINVAL, "Gemm inputs A and B must be 2-D, got %s and %s",
                           mts_shape_str(a, sa, sizeof sa), mts_shape_str(b, sb, sizeof sb));
    int ta = mts_attr_int(k->node, "transA", 0) != 0, tb = mts_attr_int(k->node, "transB", 0) != 0;
    *M = ta ? a->dims[1] : a->dims[0];
    *K = ta ? a->dims[0] : a->dims[1];
    int64_t kb = tb ? b->dims[1] : b->dims[0];
    *N = tb ? b->dims[0] : b->dims[1];
    if (kb != *K)
        return mts_err_set(k->err, MTS_ESHAPE, "Gemm inner dimensions differ: A %s%s gives K=%lld, B %s%s gives K=%lld",
                           mts_shape_str(a, sa, sizeof sa), ta ? " (transposed)" : "", (long long)*K,
                           mts_shape_str(b, sb, sizeof sb), tb ? " (transposed)" : "", (long long)kb);
    const mts_tensor *c = mts_kin(k, 2);
    if (c) {
        if (c->dtype != MTS_DTYPE_FLOAT)
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "Gemm C must be float, got %s", mts_dtype_name(c->dtype));
        int ok = c->rank <= 2;
        if (ok && c->rank >= 1) ok = c->dims[c->rank - 1] == *N || c->dims[c->rank - 1] == 1;
        if (ok && c->rank == 2) ok = c->dims[0] == *M || c->dims[0] == 1;
        if (!ok)
            return mts_err_set(k->err, MTS_ESHAPE, "Gemm C %s cannot be broadcast to [%lld,%lld]",
                               mts_shape_str(c, sa, sizeof sa), (long long)*M, (long long)*N);
    }
    return MTS_OK;
}

static int gemm_infer(mts_kctx *k)
{
    int64_t M, N, K;
    int rc = gemm_dims(k, &M, &N, &K);
    if (rc) return rc;
    int64_t d[2] = {M, N};
    return mts_kset_out(k, 0, MTS_DTYPE_FLOAT, 2, d);
}

static int gemm_run(mts_kctx *k)
{
    int64_t M, N, K;
    int rc = gemm_dims(k, &M, &N, &K);
    if (rc) return rc;
    const mts_tensor *a = k->in[0], *b = k->in[1], *c = mts_kin(k, 2);
    float *y = k->out[0].data;
    float alpha = mts_attr_float(k->node, "alpha", 1.0f), beta = mts_attr_float(k->node, "beta", 1.0f);
    int ta = mts_attr_int(k->node, "transA", 0) != 0, tb = mts_attr_int(k->node, "transB", 0) != 0;
    if (M == 0 || N == 0) return MTS_OK;
    bool acc = false;
    if (c && beta != 0.0f) {
        const float *cd = c->data;
        int64_t sm = 0, sn = 0;
        if (c->rank >= 1 && c->dims[c->rank - 1] != 1) sn = 1;
        if (c->rank == 2 && c->dims[0] != 1) sm = c->dims[1];
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) y[i * N + j] = beta * cd[i * sm + j * sn];
        acc = true;
    }
    /* transA / transB: the same storage read through swapped strides */
    mts_sgemm g = {.M = M, .N = N, .K = K, .A = a->data, .a_rs = ta ? 1 : K, .a_cs = ta ? M : 1,
                   .B = b->data, .b_rs = tb ? 1 : N, .b_cs = tb ? K : 1, .C = y, .ldc = N,
                   .alpha = alpha, .accumulate = acc};
    return mts_sgemm_run(&g, k->threads);
}

/* ------------------------------------------------------------------------------------------ */
/* Identity, Constant, ConstantOfShape, Shape, Size, Dropout                                   */
/* ------------------------------------------------------------------------------------------ */

static int identity_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "input"))) return rc;
    return set_out_like(k, 0, x);
}

static int identity_run(mts_kctx *k)
{
    copy_all(k, k->in[0], &k->out[0]);
    return MTS_OK;
}

/* The single value attribute of a Constant node, validated. */
static int constant_attr(mts_kctx *k, const mts_attr **out)
{
    static const char *const unsupported[] = {"value_string", "value_strings", "sparse_value"};
    static const char *const names[] = {"value", "value_float", "value_floats", "value_int", "value_ints"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
        if (mts_node_attr(k->node, unsupported[i]))
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "Constant attribute '%s' is not supported", unsupported[i]);
    const mts_attr *found = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const mts_attr *a = mts_node_attr(k->node, names[i]);
        if (!a) continue;
        if (found)
            return mts_err_set(k->err, MTS_EINVAL, "Constant has both '%s' and '%s'; exactly one value is allowed",
                               found->name, a->name);
        found = a;
    }
    if (!found) return mts_err_set(k->err, MTS_EINVAL, "Constant has no value attribute");
    mts_attr_type want = MTS_ATTR_TENSOR;
    if (!strcmp(found->name, "value_float")) want = MTS_ATTR_FLOAT;
    else if (!strcmp(found->name, "value_floats")) want = MTS_ATTR_FLOATS;
    else if (!strcmp(found->name, "value_int")) want = MTS_ATTR_INT;
    else if (!strcmp(found->name, "value_ints")) want = MTS_ATTR_INTS;
    if (found->type != want || (want == MTS_ATTR_TENSOR && !found->t))
        return mts_err_set(k->err, MTS_EINVAL, "Constant attribute '%s' has attribute type %d, expected %d",
                           found->name, (int)found->type, (int)want);
    if ((want == MTS_ATTR_FLOATS || want == MTS_ATTR_INTS) && found->n < 0)
        return mts_err_set(k->err, MTS_EINVAL, "Constant attribute '%s' has a negative length", found->name);
    *out = found;
    return MTS_OK;
}

static int constant_infer(mts_kctx *k)
{
    const mts_attr *a;
    int rc;
    if ((rc = mts_kchk_n_out(k, 1)) || (rc = constant_attr(k, &a))) return rc;
    int64_t n = a->n;
    switch (a->type) {
    case MTS_ATTR_FLOAT: return mts_kset_out(k, 0, MTS_DTYPE_FLOAT, 0, NULL);
    case MTS_ATTR_INT: return mts_kset_out(k, 0, MTS_DTYPE_INT64, 0, NULL);
    case MTS_ATTR_FLOATS: return mts_kset_out(k, 0, MTS_DTYPE_FLOAT, 1, &n);
    case MTS_ATTR_INTS: return mts_kset_out(k, 0, MTS_DTYPE_INT64, 1, &n);
    default:
        if ((rc = chk_dtype(k, a->t, "Constant value"))) return rc;
        if (mts_tensor_numel(a->t) > 0 && !a->t->data)
            return mts_err_set(k->err, MTS_EINVAL, "Constant value tensor has no data");
        return set_out_like(k, 0, a->t);
    }
}

static int constant_run(mts_kctx *k)
{
    const mts_attr *a;
    int rc = constant_attr(k, &a);
    if (rc) return rc;
    void *o = k->out[0].data;
    switch (a->type) {
    case MTS_ATTR_FLOAT: memcpy(o, &a->f, sizeof(float)); break;
    case MTS_ATTR_INT: memcpy(o, &a->i, sizeof(int64_t)); break;
    case MTS_ATTR_FLOATS: if (a->n) memcpy(o, a->floats, sizeof(float) * (size_t)a->n); break;
    case MTS_ATTR_INTS: if (a->n) memcpy(o, a->ints, sizeof(int64_t) * (size_t)a->n); break;
    default: copy_all(k, a->t, &k->out[0]); break;
    }
    return MTS_OK;
}

static int cos_value(mts_kctx *k, const mts_tensor **v)
{
    const mts_attr *a = mts_node_attr(k->node, "value");
    *v = NULL;
    if (!a) return MTS_OK;
    if (a->type != MTS_ATTR_TENSOR || !a->t)
        return mts_err_set(k->err, MTS_EINVAL, "ConstantOfShape 'value' must be a tensor attribute");
    int rc = chk_dtype(k, a->t, "ConstantOfShape value");
    if (rc) return rc;
    if (mts_tensor_numel(a->t) != 1 || !a->t->data)
        return mts_err_set(k->err, MTS_EINVAL, "ConstantOfShape 'value' must hold exactly one element, got %lld",
                           (long long)mts_tensor_numel(a->t));
    *v = a->t;
    return MTS_OK;
}

static int cos_infer(mts_kctx *k)
{
    const mts_tensor *x, *v;
    int rc;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = cos_value(k, &v))) return rc;
    if (x->dtype != MTS_DTYPE_INT64 && x->dtype != MTS_DTYPE_INT32)
        return mts_err_set(k->err, MTS_EINVAL, "ConstantOfShape input must be int64, got %s", mts_dtype_name(x->dtype));
    if (x->rank != 1)
        return mts_err_set(k->err, MTS_EINVAL, "ConstantOfShape input must be 1-D, got rank %d", x->rank);
    if (x->dims[0] > MTS_MAX_RANK)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "ConstantOfShape output rank %lld exceeds %d",
                           (long long)x->dims[0], MTS_MAX_RANK);
    int64_t d[MTS_MAX_RANK];
    int n = 0;
    if ((rc = read_ints(k, x, "ConstantOfShape shape", MTS_MAX_RANK, d, &n))) return rc;
    for (int i = 0; i < n; i++)
        if (d[i] < 0)
            return mts_err_set(k->err, MTS_EINVAL, "ConstantOfShape shape[%d] is negative (%lld)", i, (long long)d[i]);
    return mts_kset_out(k, 0, v ? v->dtype : MTS_DTYPE_FLOAT, n, d);
}

static int cos_run(mts_kctx *k)
{
    const mts_tensor *v;
    int rc = cos_value(k, &v);
    if (rc) return rc;
    mts_tensor *y = &k->out[0];
    int64_t n = mts_tensor_numel(y);
    size_t es = mts_dtype_size(y->dtype);
    uint8_t val[8] = {0};
    if (v) memcpy(val, v->data, es);
    uint8_t *o = y->data;
    for (int64_t i = 0; i < n; i++) memcpy(o + i * (int64_t)es, val, es);
    return MTS_OK;
}

static void shape_range(const mts_kctx *k, int rank, int64_t *start, int64_t *end)
{
    int64_t s = mts_attr_int(k->node, "start", 0), e = mts_attr_int(k->node, "end", rank);
    if (s < 0) s += rank;
    if (e < 0) e += rank;
    s = s < 0 ? 0 : (s > rank ? rank : s);
    e = e < 0 ? 0 : (e > rank ? rank : e);
    if (e < s) e = s;
    *start = s;
    *end = e;
}

static int shape_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "data", &x)) || (rc = mts_kchk_n_out(k, 1))) return rc;
    int64_t s, e;
    shape_range(k, x->rank, &s, &e);
    int64_t n = e - s;
    return mts_kset_out(k, 0, MTS_DTYPE_INT64, 1, &n);
}

static int shape_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    int64_t s, e;
    shape_range(k, x->rank, &s, &e);
    int64_t *o = k->out[0].data;
    for (int64_t i = s; i < e; i++) o[i - s] = x->dims[i];
    return MTS_OK;
}

static int size_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "data", &x)) || (rc = mts_kchk_n_out(k, 1))) return rc;
    if (mts_tensor_numel(x) < 0) return mts_err_set(k->err, MTS_EINVAL, "Size input has an invalid shape");
    return mts_kset_out(k, 0, MTS_DTYPE_INT64, 0, NULL);
}

static int size_run(mts_kctx *k)
{
    *(int64_t *)k->out[0].data = mts_tensor_numel(k->in[0]);
    return MTS_OK;
}

/* Dropout in inference: the output is the input, the optional mask is all ones. Training mode
 * with a nonzero ratio is random and not supported. */
static int dropout_check_training(mts_kctx *k)
{
    if (k->node->opset < 12) return MTS_OK;
    const mts_tensor *r = mts_kin(k, 1), *t = mts_kin(k, 2);
    if (r && (r->dtype != MTS_DTYPE_FLOAT || mts_tensor_numel(r) != 1))
        return mts_err_set(k->err, r->dtype == MTS_DTYPE_FLOAT ? MTS_EINVAL : MTS_EUNSUPPORTED,
                           "Dropout ratio must be a float scalar, got %s with %lld elements",
                           mts_dtype_name(r->dtype), (long long)mts_tensor_numel(r));
    if (!t) return MTS_OK;
    if (t->dtype != MTS_DTYPE_BOOL || mts_tensor_numel(t) != 1)
        return mts_err_set(k->err, MTS_EINVAL, "Dropout training_mode must be a bool scalar");
    if (!t->data || !*(const uint8_t *)t->data) return MTS_OK;
    float ratio = 0.5f;
    if (r) {
        if (!r->data) return MTS_OK; /* checked again at run time */
        ratio = *(const float *)r->data;
    }
    if (ratio != 0.0f)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Dropout in training mode with ratio %g is not supported",
                           (double)ratio);
    return MTS_OK;
}

static int dropout_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "data", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "data"))) return rc;
    if ((rc = dropout_check_training(k))) return rc;
    if ((rc = set_out_like(k, 0, x))) return rc;
    if (k->n_out > 1) return mts_kset_out(k, 1, k->node->opset >= 10 ? MTS_DTYPE_BOOL : x->dtype, x->rank, x->dims);
    return MTS_OK;
}

static int dropout_run(mts_kctx *k)
{
    int rc = dropout_check_training(k);
    if (rc) return rc;
    copy_all(k, k->in[0], &k->out[0]);
    if (k->n_out > 1 && k->out[1].data) {
        mts_tensor *m = &k->out[1];
        int64_t n = mts_tensor_numel(m);
        if (m->dtype == MTS_DTYPE_BOOL || m->dtype == MTS_DTYPE_UINT8 || m->dtype == MTS_DTYPE_INT8) {
            memset(m->data, 1, (size_t)n);
        } else if (m->dtype == MTS_DTYPE_FLOAT) {
            for (int64_t i = 0; i < n; i++) ((float *)m->data)[i] = 1.0f;
        } else if (m->dtype == MTS_DTYPE_INT32) {
            for (int64_t i = 0; i < n; i++) ((int32_t *)m->data)[i] = 1;
        } else if (m->dtype == MTS_DTYPE_INT64) {
            for (int64_t i = 0; i < n; i++) ((int64_t *)m->data)[i] = 1;
        }
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Reshape, Flatten, Squeeze, Unsqueeze (the data is copied unchanged)                         */
/* ------------------------------------------------------------------------------------------ */

static int reshape_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "data", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "data"))) return rc;
    int64_t sh[MTS_MAX_RANK];
    int n = 0;
    int na = 0;
    const int64_t *a = k->node->opset < 5 ? mts_attr_ints(k->node, "shape", &na) : NULL;
    if (k->node->opset < 5 && !a && !mts_kin(k, 1)) { /* opset 1-4 without a shape: keep the shape */
        return set_out_like(k, 0, x);
    } else if (a) {
        if (na > MTS_MAX_RANK)
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "Reshape target rank %d exceeds %d", na, MTS_MAX_RANK);
        memcpy(sh, a, sizeof(int64_t) * (size_t)na);
        n = na;
    } else {
        const mts_tensor *s;
        if ((rc = req_in(k, 1, "shape", &s))) return rc;
        if ((rc = chk_ints(k, s, "Reshape shape", INT64_MAX))) return rc;
        if (vec_len(s) > MTS_MAX_RANK)
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "Reshape target rank %lld exceeds %d",
                               (long long)vec_len(s), MTS_MAX_RANK);
        if ((rc = read_ints(k, s, "Reshape shape", MTS_MAX_RANK, sh, &n))) return rc;
    }
    int allowzero = k->node->opset >= 14 && mts_attr_int(k->node, "allowzero", 0) != 0;
    int infer_at = -1;
    int64_t known = 1;
    for (int i = 0; i < n; i++) {
        if (sh[i] == -1) {
            if (infer_at >= 0)
                return mts_err_set(k->err, MTS_EINVAL, "Reshape shape has more than one -1 (at %d and %d)",
                                   infer_at, i);
            infer_at = i;
            continue;
        }
        if (sh[i] < -1)
            return mts_err_set(k->err, MTS_EINVAL, "Reshape shape[%d] is %lld; dimensions must be >= -1", i,
                               (long long)sh[i]);
        if (sh[i] == 0 && !allowzero) {
            if (i >= x->rank)
                return mts_err_set(k->err, MTS_EINVAL,
                                   "Reshape shape[%d] is 0 (copy input dimension) but the input has rank %d", i,
                                   x->rank);
            sh[i] = x->dims[i];
        }
        if (sh[i] != 0 && known > INT64_MAX / sh[i])
            return mts_err_set(k->err, MTS_EINVAL, "Reshape target shape has too many elements");
        known *= sh[i];
    }
    int64_t total = mts_tensor_numel(x);
    if (total < 0) return mts_err_set(k->err, MTS_EINVAL, "Reshape input has an invalid shape");
    if (infer_at >= 0) {
        if (allowzero && known == 0)
            return mts_err_set(k->err, MTS_EINVAL, "Reshape shape has both 0 and -1 with allowzero=1");
        if (known == 0 || total % known != 0)
            return mts_err_set(k->err, MTS_EINVAL,
                               "Reshape cannot infer the -1 dimension: input has %lld elements, the other "
                               "dimensions multiply to %lld",
                               (long long)total, (long long)known);
        sh[infer_at] = total / known;
        known = total;
    }
    if (known != total) {
        char s1[160];
        mts_tensor t = {.rank = n};
        memcpy(t.dims, sh, sizeof(int64_t) * (size_t)n);
        char s2[160];
        return mts_err_set(k->err, MTS_EINVAL,
                           "Reshape element count mismatch: input %s has %lld elements, target shape %s has %lld",
                           mts_shape_str(x, s1, sizeof s1), (long long)total, mts_shape_str(&t, s2, sizeof s2),
                           (long long)known);
    }
    return mts_kset_out(k, 0, x->dtype, n, sh);
}

static int flatten_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "input"))) return rc;
    int64_t axis = mts_attr_int(k->node, "axis", 1);
    int r = x->rank;
    if (axis < 0 && k->node->opset >= 11) axis += r;
    if (axis < 0 || axis > r)
        return mts_err_set(k->err, MTS_EINVAL, "Flatten axis %lld is out of range for rank %d",
                           (long long)mts_attr_int(k->node, "axis", 1), r);
    int64_t d[2] = {prod(x->dims, 0, (int)axis), prod(x->dims, (int)axis, r)};
    return mts_kset_out(k, 0, x->dtype, 2, d);
}

static int squeeze_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "data", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "data"))) return rc;
    int64_t ax[MTS_MAX_RANK];
    int n = 0, present = 0;
    if ((rc = read_axes(k, 13, 1, x->rank, ax, &n, &present))) return rc;
    int drop[MTS_MAX_RANK] = {0};
    if (!present || n == 0) { /* no (or empty) axes: drop every dimension of size 1 */
        for (int i = 0; i < x->rank; i++) drop[i] = x->dims[i] == 1;
    } else {
        for (int i = 0; i < n; i++) {
            int a;
            if ((rc = mts_norm_axis(ax[i], x->rank, &a, k->err))) return rc;
            if (drop[a]) return mts_err_set(k->err, MTS_EINVAL, "Squeeze axes repeat axis %d", a);
            if (x->dims[a] != 1)
                return mts_err_set(k->err, MTS_EINVAL, "Squeeze axis %d has size %lld, expected 1", a,
                                   (long long)x->dims[a]);
            drop[a] = 1;
        }
    }
    int64_t d[MTS_MAX_RANK];
    int r = 0;
    for (int i = 0; i < x->rank; i++)
        if (!drop[i]) d[r++] = x->dims[i];
    return mts_kset_out(k, 0, x->dtype, r, d);
}

static int unsqueeze_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "data", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "data"))) return rc;
    int64_t nax = 0;
    if (k->node->opset >= 13) {
        const mts_tensor *t;
        if ((rc = req_in(k, 1, "axes", &t)) || (rc = chk_ints(k, t, "axes", INT64_MAX))) return rc;
        nax = vec_len(t);
    } else {
        int na = 0;
        mts_attr_ints(k->node, "axes", &na);
        nax = na;
    }
    if (x->rank + nax > MTS_MAX_RANK)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Unsqueeze output rank %lld exceeds %d",
                           (long long)(x->rank + nax), MTS_MAX_RANK);
    int64_t ax[MTS_MAX_RANK];
    int n = 0, present = 0;
    if ((rc = read_axes(k, 13, 1, MTS_MAX_RANK - x->rank, ax, &n, &present))) return rc;
    if (!present) return mts_err_set(k->err, MTS_EINVAL, "Unsqueeze needs axes");
    int r = x->rank + n;
    int ins[MTS_MAX_RANK] = {0};
    for (int i = 0; i < n; i++) {
        int a;
        if ((rc = mts_norm_axis(ax[i], r, &a, k->err))) return rc;
        if (ins[a]) return mts_err_set(k->err, MTS_EINVAL, "Unsqueeze axes repeat axis %d", a);
        ins[a] = 1;
    }
    int64_t d[MTS_MAX_RANK];
    for (int i = 0, j = 0; i < r; i++) d[i] = ins[i] ? 1 : x->dims[j++];
    return mts_kset_out(k, 0, x->dtype, r, d);
}

/* Run for every op whose output holds the input's bytes unchanged. */
static int copy_run(mts_kctx *k)
{
    copy_all(k, k->in[0], &k->out[0]);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Transpose, Expand, Tile                                                                     */
/* ------------------------------------------------------------------------------------------ */

static int transpose_perm(mts_kctx *k, const mts_tensor *x, int *perm)
{
    int n = 0;
    const int64_t *p = mts_attr_ints(k->node, "perm", &n);
    if (!p) {
        for (int i = 0; i < x->rank; i++) perm[i] = x->rank - 1 - i;
        return MTS_OK;
    }
    if (n != x->rank)
        return mts_err_set(k->err, MTS_EINVAL, "Transpose perm has %d entries for an input of rank %d", n, x->rank);
    int seen[MTS_MAX_RANK] = {0};
    for (int i = 0; i < n; i++) {
        if (p[i] < 0 || p[i] >= n || seen[p[i]])
            return mts_err_set(k->err, MTS_EINVAL, "Transpose perm is not a permutation of 0..%d (entry %d is %lld)",
                               n - 1, i, (long long)p[i]);
        seen[p[i]] = 1;
        perm[i] = (int)p[i];
    }
    return MTS_OK;
}

static int transpose_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc, perm[MTS_MAX_RANK];
    if ((rc = req_in(k, 0, "data", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "data"))) return rc;
    if ((rc = transpose_perm(k, x, perm))) return rc;
    int64_t d[MTS_MAX_RANK];
    for (int i = 0; i < x->rank; i++) d[i] = x->dims[perm[i]];
    return mts_kset_out(k, 0, x->dtype, x->rank, d);
}

static int transpose_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    int perm[MTS_MAX_RANK];
    int rc = transpose_perm(k, x, perm);
    if (rc) return rc;
    int64_t st[MTS_MAX_RANK], d[MTS_MAX_RANK], s[MTS_MAX_RANK];
    mts_strides(x, st);
    for (int i = 0; i < x->rank; i++) {
        d[i] = x->dims[perm[i]];
        s[i] = st[perm[i]];
    }
    copy_strided(k->out[0].data, x->data, 0, x->rank, d, s, mts_dtype_size(x->dtype));
    return MTS_OK;
}

static int expand_infer(mts_kctx *k)
{
    const mts_tensor *x, *s;
    int rc;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = req_in(k, 1, "shape", &s)) || (rc = mts_kchk_n_out(k, 1)) ||
        (rc = chk_dtype(k, x, "input")))
        return rc;
    if ((rc = chk_ints(k, s, "Expand shape", INT64_MAX))) return rc;
    if (vec_len(s) > MTS_MAX_RANK)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Expand shape has %lld dimensions; at most %d supported",
                           (long long)vec_len(s), MTS_MAX_RANK);
    mts_tensor t = {.dtype = x->dtype};
    int n = 0;
    if ((rc = read_ints(k, s, "Expand shape", MTS_MAX_RANK, t.dims, &n))) return rc;
    t.rank = n;
    for (int i = 0; i < n; i++)
        if (t.dims[i] < 0)
            return mts_err_set(k->err, MTS_EINVAL, "Expand shape[%d] is negative (%lld)", i, (long long)t.dims[i]);
    mts_tensor o;
    if ((rc = mts_broadcast_shape(x, &t, &o, k->err))) return rc;
    return mts_kset_out(k, 0, x->dtype, o.rank, o.dims);
}

static int expand_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    mts_tensor *y = &k->out[0];
    int64_t st[MTS_MAX_RANK], s[MTS_MAX_RANK];
    mts_strides(x, st);
    int off = y->rank - x->rank;
    for (int i = 0; i < y->rank; i++) {
        int xi = i - off;
        s[i] = (xi < 0 || x->dims[xi] == 1) ? 0 : st[xi];
    }
    copy_strided(y->data, x->data, 0, y->rank, y->dims, s, mts_dtype_size(x->dtype));
    return MTS_OK;
}

static int tile_infer(mts_kctx *k)
{
    const mts_tensor *x, *r;
    int rc;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = req_in(k, 1, "repeats", &r)) || (rc = mts_kchk_n_out(k, 1)) ||
        (rc = chk_dtype(k, x, "input")))
        return rc;
    if ((rc = chk_ints(k, r, "Tile repeats", INT64_MAX))) return rc;
    if (r->rank != 1 || r->dims[0] != x->rank)
        return mts_err_set(k->err, MTS_EINVAL, "Tile repeats must be 1-D with %d entries (the input rank), got %lld",
                           x->rank, (long long)vec_len(r));
    int64_t rep[MTS_MAX_RANK], d[MTS_MAX_RANK];
    int n = 0;
    if ((rc = read_ints(k, r, "Tile repeats", MTS_MAX_RANK, rep, &n))) return rc;
    for (int i = 0; i < n; i++) {
        if (rep[i] < 0)
            return mts_err_set(k->err, MTS_EINVAL, "Tile repeats[%d] is negative (%lld)", i, (long long)rep[i]);
        if (rep[i] != 0 && x->dims[i] > INT64_MAX / rep[i])
            return mts_err_set(k->err, MTS_EINVAL, "Tile output dimension %d overflows", i);
        d[i] = x->dims[i] * rep[i];
    }
    return mts_kset_out(k, 0, x->dtype, x->rank, d);
}

static int tile_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    mts_tensor *y = &k->out[0];
    /* Output index (rep, i) along each axis is rep * dim + i: a row-major [r0, d0, r1, d1, ...]. */
    int64_t st[MTS_MAX_RANK], d[SC_MAX], s[SC_MAX];
    mts_strides(x, st);
    for (int i = 0; i < x->rank; i++) {
        d[2 * i] = x->dims[i] ? y->dims[i] / x->dims[i] : 0;
        s[2 * i] = 0;
        d[2 * i + 1] = x->dims[i];
        s[2 * i + 1] = st[i];
    }
    copy_strided(y->data, x->data, 0, 2 * x->rank, d, s, mts_dtype_size(x->dtype));
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Slice                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct slice_spec {
    int64_t start[MTS_MAX_RANK], step[MTS_MAX_RANK], len[MTS_MAX_RANK];
} slice_spec;

static int slice_spec_get(mts_kctx *k, const mts_tensor *x, slice_spec *sp)
{
    int r = x->rank, rc;
    int64_t st[MTS_MAX_RANK], en[MTS_MAX_RANK], ax[MTS_MAX_RANK], stp[MTS_MAX_RANK];
    int ns = 0, ne = 0, na = -1, nst = -1;
    if (k->node->opset < 10) {
        int n1 = 0, n2 = 0, n3 = 0;
        const int64_t *a1 = mts_attr_ints(k->node, "starts", &n1), *a2 = mts_attr_ints(k->node, "ends", &n2);
        const int64_t *a3 = mts_attr_ints(k->node, "axes", &n3);
        if (!a1 || !a2)
            return mts_err_set(k->err, MTS_EINVAL, "Slice (opset %d) needs 'starts' and 'ends'", k->node->opset);
        if (n1 > r || n2 > r || n3 > r)
            return mts_err_set(k->err, MTS_EINVAL, "Slice has more starts/ends/axes than the input rank %d", r);
        memcpy(st, a1, sizeof(int64_t) * (size_t)n1);
        memcpy(en, a2, sizeof(int64_t) * (size_t)n2);
        ns = n1;
        ne = n2;
        if (a3) {
            memcpy(ax, a3, sizeof(int64_t) * (size_t)n3);
            na = n3;
        }
    } else {
        const mts_tensor *ts, *te, *ta = mts_kin(k, 3), *tst = mts_kin(k, 4);
        if ((rc = req_in(k, 1, "starts", &ts)) || (rc = req_in(k, 2, "ends", &te))) return rc;
        if ((rc = chk_ints(k, ts, "Slice starts", r)) || (rc = chk_ints(k, te, "Slice ends", r))) return rc;
        if (ta && (rc = chk_ints(k, ta, "Slice axes", r))) return rc;
        if (tst && (rc = chk_ints(k, tst, "Slice steps", r))) return rc;
        if ((rc = read_ints(k, ts, "Slice starts", r, st, &ns)) || (rc = read_ints(k, te, "Slice ends", r, en, &ne)))
            return rc;
        if (ta && (rc = read_ints(k, ta, "Slice axes", r, ax, &na))) return rc;
        if (tst && (rc = read_ints(k, tst, "Slice steps", r, stp, &nst))) return rc;
    }
    if (ns != ne)
        return mts_err_set(k->err, MTS_EINVAL, "Slice starts has %d entries but ends has %d", ns, ne);
    if (na < 0) {
        na = ns;
        for (int i = 0; i < ns; i++) ax[i] = i;
    }
    if (nst < 0) {
        nst = ns;
        for (int i = 0; i < ns; i++) stp[i] = 1;
    }
    if (na != ns || nst != ns)
        return mts_err_set(k->err, MTS_EINVAL, "Slice starts/ends have %d entries but axes has %d and steps %d", ns, na,
                           nst);
    int seen[MTS_MAX_RANK] = {0};
    for (int i = 0; i < r; i++) {
        sp->start[i] = 0;
        sp->step[i] = 1;
        sp->len[i] = x->dims[i];
    }
    for (int i = 0; i < ns; i++) {
        int a;
        if ((rc = mts_norm_axis(ax[i], r, &a, k->err))) return rc;
        if (seen[a]) return mts_err_set(k->err, MTS_EINVAL, "Slice axes repeat axis %d", a);
        seen[a] = 1;
        int64_t d = x->dims[a], s = st[i], e = en[i], step = stp[i];
        if (step == 0) return mts_err_set(k->err, MTS_EINVAL, "Slice step for axis %d is 0", a);
        if (s < 0) s += d;
        if (e < 0) e += d;
        int64_t len;
        if (step > 0) {
            s = s < 0 ? 0 : (s > d ? d : s);
            e = e < 0 ? 0 : (e > d ? d : e);
            len = e > s ? (e - s - 1) / step + 1 : 0;
        } else {
            s = s < 0 ? 0 : (s > d - 1 ? d - 1 : s);
            e = e < -1 ? -1 : (e > d - 1 ? d - 1 : e);
            len = s > e ? (s - e - 1) / (step == INT64_MIN ? INT64_MAX : -step) + 1 : 0;
        }
        sp->start[a] = len > 0 ? s : 0;
        sp->step[a] = step;
        sp->len[a] = len;
    }
    return MTS_OK;
}

static int slice_infer(mts_kctx *k)
{
    const mts_tensor *x;
    int rc;
    if ((rc = req_in(k, 0, "data", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "data"))) return rc;
    slice_spec sp;
    if ((rc = slice_spec_get(k, x, &sp))) return rc;
    return mts_kset_out(k, 0, x->dtype, x->rank, sp.len);
}

static int slice_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0];
    slice_spec sp;
    int rc = slice_spec_get(k, x, &sp);
    if (rc) return rc;
    int64_t st[MTS_MAX_RANK], s[MTS_MAX_RANK], base = 0;
    mts_strides(x, st);
    for (int i = 0; i < x->rank; i++) {
        base += sp.start[i] * st[i];
        s[i] = sp.step[i] * st[i];
    }
    copy_strided(k->out[0].data, x->data, base, x->rank, sp.len, s, mts_dtype_size(x->dtype));
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Concat, Split                                                                               */
/* ------------------------------------------------------------------------------------------ */

static int concat_axis(mts_kctx *k, const mts_tensor *x0, int *axis)
{
    const mts_attr *a = mts_node_attr(k->node, "axis");
    int64_t ax;
    if (a && a->type == MTS_ATTR_INT)
        ax = a->i;
    else if (k->node->opset < 4)
        ax = 1;
    else
        return mts_err_set(k->err, MTS_EINVAL, "Concat needs the 'axis' attribute");
    return mts_norm_axis(ax, x0->rank, axis, k->err);
}

static int concat_infer(mts_kctx *k)
{
    int rc;
    if ((rc = mts_kchk_n_out(k, 1))) return rc;
    const mts_tensor *x0 = NULL;
    for (int i = 0; i < k->n_in && !x0; i++) x0 = k->in[i];
    if (!x0) return mts_err_set(k->err, MTS_EINVAL, "Concat needs at least one input");
    if ((rc = chk_dtype(k, x0, "input"))) return rc;
    if (x0->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "Concat inputs must have rank >= 1");
    int axis;
    if ((rc = concat_axis(k, x0, &axis))) return rc;
    int64_t d[MTS_MAX_RANK];
    memcpy(d, x0->dims, sizeof d);
    d[axis] = 0;
    for (int i = 0; i < k->n_in; i++) {
        const mts_tensor *t = k->in[i];
        if (!t) continue;
        char s0[160], s1[160];
        if (t->dtype != x0->dtype)
            return mts_err_set(k->err, MTS_EINVAL, "Concat input %d has dtype %s, expected %s", i,
                               mts_dtype_name(t->dtype), mts_dtype_name(x0->dtype));
        int ok = t->rank == x0->rank;
        for (int j = 0; ok && j < t->rank; j++)
            if (j != axis && t->dims[j] != x0->dims[j]) ok = 0;
        if (!ok)
            return mts_err_set(k->err, MTS_ESHAPE, "Concat input %d has shape %s, incompatible with %s on axis %d", i,
                               mts_shape_str(t, s1, sizeof s1), mts_shape_str(x0, s0, sizeof s0), axis);
        if (t->dims[axis] < 0 || d[axis] > INT64_MAX - t->dims[axis])
            return mts_err_set(k->err, MTS_EINVAL, "Concat output dimension overflows");
        d[axis] += t->dims[axis];
    }
    return mts_kset_out(k, 0, x0->dtype, x0->rank, d);
}

static int concat_run(mts_kctx *k)
{
    mts_tensor *y = &k->out[0];
    const mts_tensor *x0 = NULL;
    for (int i = 0; i < k->n_in && !x0; i++) x0 = k->in[i];
    int axis, rc = concat_axis(k, x0, &axis);
    if (rc) return rc;
    int64_t es = (int64_t)mts_dtype_size(y->dtype);
    int64_t outer = prod(y->dims, 0, axis), inner = prod(y->dims, axis + 1, y->rank) * es;
    int64_t orow = y->dims[axis] * inner;
    uint8_t *o = y->data;
    int64_t pos = 0;
    for (int i = 0; i < k->n_in; i++) {
        const mts_tensor *t = k->in[i];
        if (!t) continue;
        int64_t row = t->dims[axis] * inner;
        if (row > 0) {
            const uint8_t *src = t->data;
            for (int64_t j = 0; j < outer; j++) memcpy(o + j * orow + pos, src + j * row, (size_t)row);
        }
        pos += row;
    }
    return MTS_OK;
}

/* Sizes of the split parts along the axis into sz[0..n_out). */
static int split_sizes(mts_kctx *k, const mts_tensor *x, int axis, int64_t *sz)
{
    int n = k->n_out, rc;
    int64_t d = x->dims[axis];
    const mts_tensor *st = mts_kin(k, 1);
    int na = 0;
    const int64_t *sa = (k->node->opset < 13) ? mts_attr_ints(k->node, "split", &na) : NULL;
    if (st && (k->node->opset >= 13 || k->node->opset < 2)) {
        if ((rc = chk_ints(k, st, "Split split", INT64_MAX))) return rc;
        if (vec_len(st) != n)
            return mts_err_set(k->err, MTS_EINVAL, "Split 'split' has %lld entries for %d outputs",
                               (long long)vec_len(st), n);
        if (!st->data) return MTS_EDYNAMIC;
        for (int i = 0; i < n; i++) sz[i] = mts_tensor_get_int(st, i);
    } else if (sa) {
        if (na != n)
            return mts_err_set(k->err, MTS_EINVAL, "Split 'split' has %d entries for %d outputs", na, n);
        for (int i = 0; i < n; i++) sz[i] = sa[i];
    } else {
        int64_t parts = n;
        const mts_attr *no = mts_node_attr(k->node, "num_outputs");
        if (no && no->type == MTS_ATTR_INT) {
            if (no->i != n)
                return mts_err_set(k->err, MTS_EINVAL, "Split num_outputs is %lld but the node has %d outputs",
                                   (long long)no->i, n);
            int64_t chunk = (d + parts - 1) / parts;
            for (int i = 0; i < n; i++) {
                int64_t left = d - chunk * i;
                sz[i] = left < 0 ? 0 : (left < chunk ? left : chunk);
            }
        } else {
            if (d % parts != 0)
                return mts_err_set(k->err, MTS_EINVAL, "Split cannot cut axis %d of size %lld into %d equal parts",
                                   axis, (long long)d, n);
            for (int i = 0; i < n; i++) sz[i] = d / parts;
        }
    }
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        if (sz[i] < 0 || sz[i] > d)
            return mts_err_set(k->err, MTS_EINVAL, "Split size %d is %lld, outside [0, %lld]", i, (long long)sz[i],
                               (long long)d);
        sum += sz[i];
    }
    if (sum != d)
        return mts_err_set(k->err, MTS_EINVAL, "Split sizes add up to %lld but axis %d has size %lld", (long long)sum,
                           axis, (long long)d);
    return MTS_OK;
}

static int split_prep(mts_kctx *k, int *axis, int64_t **sz)
{
    const mts_tensor *x;
    int rc;
    *sz = NULL;
    if ((rc = req_in(k, 0, "input", &x)) || (rc = mts_kchk_n_out(k, 1)) || (rc = chk_dtype(k, x, "input"))) return rc;
    if (x->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "Split input must have rank >= 1");
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), x->rank, axis, k->err))) return rc;
    int64_t *s = malloc(sizeof(int64_t) * (size_t)k->n_out);
    if (!s) return MTS_ENOMEM;
    if ((rc = split_sizes(k, x, *axis, s))) {
        free(s);
        return rc;
    }
    *sz = s;
    return MTS_OK;
}

static int split_infer(mts_kctx *k)
{
    int axis, rc;
    int64_t *sz;
    if ((rc = split_prep(k, &axis, &sz))) return rc;
    const mts_tensor *x = k->in[0];
    int64_t d[MTS_MAX_RANK];
    memcpy(d, x->dims, sizeof d);
    for (int j = 0; j < k->n_out && !rc; j++) {
        d[axis] = sz[j];
        rc = mts_kset_out(k, j, x->dtype, x->rank, d);
    }
    free(sz);
    return rc;
}

static int split_run(mts_kctx *k)
{
    int axis, rc;
    int64_t *sz;
    if ((rc = split_prep(k, &axis, &sz))) return rc;
    const mts_tensor *x = k->in[0];
    int64_t es = (int64_t)mts_dtype_size(x->dtype);
    int64_t outer = prod(x->dims, 0, axis), inner = prod(x->dims, axis + 1, x->rank) * es;
    int64_t irow = x->dims[axis] * inner, pos = 0;
    const uint8_t *src = x->data;
    for (int j = 0; j < k->n_out; j++) {
        int64_t row = sz[j] * inner;
        uint8_t *o = k->out[j].data;
        if (row > 0 && o)
            for (int64_t i = 0; i < outer; i++) memcpy(o + i * row, src + i * irow + pos, (size_t)row);
        pos += row;
    }
    free(sz);
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Gather, GatherElements                                                                      */
/* ------------------------------------------------------------------------------------------ */

static int chk_indices(mts_kctx *k, const mts_tensor *ind)
{
    if (ind->dtype != MTS_DTYPE_INT64 && ind->dtype != MTS_DTYPE_INT32)
        return mts_err_set(k->err, MTS_EINVAL, "indices must be int32 or int64, got %s", mts_dtype_name(ind->dtype));
    return MTS_OK;
}

/* Reads index i, normalizes a negative one, checks the range. */
static int get_index(mts_kctx *k, const mts_tensor *ind, int64_t i, int64_t dim, int64_t *out)
{
    int64_t v = ind->dtype == MTS_DTYPE_INT64 ? ((const int64_t *)ind->data)[i] : ((const int32_t *)ind->data)[i];
    int64_t w = v < 0 ? v + dim : v;
    if (w < 0 || w >= dim)
        return mts_err_set(k->err, MTS_EINVAL, "index %lld (at position %lld) is out of range for a dimension of %lld",
                           (long long)v, (long long)i, (long long)dim);
    *out = w;
    return MTS_OK;
}

static int gather_infer(mts_kctx *k)
{
    const mts_tensor *x, *ind;
    int rc, axis;
    if ((rc = req_in(k, 0, "data", &x)) || (rc = req_in(k, 1, "indices", &ind)) || (rc = mts_kchk_n_out(k, 1)) ||
        (rc = chk_dtype(k, x, "data")) || (rc = chk_indices(k, ind)))
        return rc;
    if (x->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "Gather data must have rank >= 1");
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), x->rank, &axis, k->err))) return rc;
    int r = x->rank - 1 + ind->rank;
    if (r > MTS_MAX_RANK)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Gather output rank %d exceeds %d", r, MTS_MAX_RANK);
    int64_t d[MTS_MAX_RANK];
    int n = 0;
    for (int i = 0; i < axis; i++) d[n++] = x->dims[i];
    for (int i = 0; i < ind->rank; i++) d[n++] = ind->dims[i];
    for (int i = axis + 1; i < x->rank; i++) d[n++] = x->dims[i];
    return mts_kset_out(k, 0, x->dtype, r, d);
}

static int gather_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0], *ind = k->in[1];
    int axis, rc;
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), x->rank, &axis, k->err))) return rc;
    int64_t es = (int64_t)mts_dtype_size(x->dtype);
    int64_t outer = prod(x->dims, 0, axis), inner = prod(x->dims, axis + 1, x->rank) * es;
    int64_t dim = x->dims[axis], ni = mts_tensor_numel(ind);
    const uint8_t *src = x->data;
    uint8_t *o = k->out[0].data;
    if (outer == 0 || inner == 0) return MTS_OK;
    for (int64_t j = 0; j < ni; j++) {
        int64_t v;
        if ((rc = get_index(k, ind, j, dim, &v))) return rc;
        for (int64_t i = 0; i < outer; i++)
            memcpy(o + (i * ni + j) * inner, src + (i * dim + v) * inner, (size_t)inner);
    }
    return MTS_OK;
}

static int gather_el_infer(mts_kctx *k)
{
    const mts_tensor *x, *ind;
    int rc, axis;
    char s0[160], s1[160];
    if ((rc = req_in(k, 0, "data", &x)) || (rc = req_in(k, 1, "indices", &ind)) || (rc = mts_kchk_n_out(k, 1)) ||
        (rc = chk_dtype(k, x, "data")) || (rc = chk_indices(k, ind)))
        return rc;
    if (x->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "GatherElements data must have rank >= 1");
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), x->rank, &axis, k->err))) return rc;
    int ok = ind->rank == x->rank;
    for (int i = 0; ok && i < x->rank; i++)
        if (i != axis && ind->dims[i] > x->dims[i]) ok = 0;
    if (!ok)
        return mts_err_set(k->err, MTS_ESHAPE,
                           "GatherElements indices %s must have the rank of data %s and no larger dims off axis %d",
                           mts_shape_str(ind, s1, sizeof s1), mts_shape_str(x, s0, sizeof s0), axis);
    return mts_kset_out(k, 0, x->dtype, ind->rank, ind->dims);
}

static int gather_el_run(mts_kctx *k)
{
    const mts_tensor *x = k->in[0], *ind = k->in[1];
    mts_tensor *y = &k->out[0];
    int axis, rc;
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), x->rank, &axis, k->err))) return rc;
    size_t es = mts_dtype_size(x->dtype);
    int64_t n = mts_tensor_numel(ind), dim = x->dims[axis];
    int64_t xs[MTS_MAX_RANK], idx[MTS_MAX_RANK] = {0}, off = 0;
    mts_strides(x, xs);
    const uint8_t *src = x->data;
    uint8_t *o = y->data;
    for (int64_t e = 0; e < n; e++) {
        int64_t v;
        if ((rc = get_index(k, ind, e, dim, &v))) return rc;
        memcpy(o + e * (int64_t)es, src + (off + v * xs[axis]) * (int64_t)es, es);
        for (int j = ind->rank - 1; j >= 0; j--) {
            if (j != axis) off += xs[j];
            if (++idx[j] < ind->dims[j]) break;
            if (j != axis) off -= xs[j] * ind->dims[j];
            idx[j] = 0;
        }
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Range                                                                                       */
/* ------------------------------------------------------------------------------------------ */

static int range_count(mts_kctx *k, int64_t *count)
{
    const mts_tensor *t[3];
    static const char *const names[3] = {"start", "limit", "delta"};
    int rc;
    for (int i = 0; i < 3; i++) {
        if ((rc = req_in(k, i, names[i], &t[i]))) return rc;
        if (t[i]->dtype != t[0]->dtype)
            return mts_err_set(k->err, MTS_EINVAL, "Range inputs must share a dtype: %s is %s, start is %s", names[i],
                               mts_dtype_name(t[i]->dtype), mts_dtype_name(t[0]->dtype));
        if (mts_tensor_numel(t[i]) != 1 || t[i]->rank > 1)
            return mts_err_set(k->err, MTS_EINVAL, "Range %s must be a scalar", names[i]);
    }
    mts_dtype dt = t[0]->dtype;
    if (dt != MTS_DTYPE_FLOAT && dt != MTS_DTYPE_INT32 && dt != MTS_DTYPE_INT64)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "Range dtype %s is not supported (float, int32, int64)",
                           mts_dtype_name(dt));
    for (int i = 0; i < 3; i++)
        if (!t[i]->data) return MTS_EDYNAMIC;
    if (dt == MTS_DTYPE_FLOAT) {
        float s = *(const float *)t[0]->data, l = *(const float *)t[1]->data, d = *(const float *)t[2]->data;
        if (d == 0.0f) return mts_err_set(k->err, MTS_EINVAL, "Range delta is 0");
        float n = ceilf((l - s) / d);
        if (!isfinite(n) || n > 9.0e15f)
            return mts_err_set(k->err, MTS_EINVAL, "Range (%g, %g, %g) has an invalid element count", (double)s,
                               (double)l, (double)d);
        *count = n > 0 ? (int64_t)n : 0;
    } else {
        int64_t s = mts_tensor_get_int(t[0], 0), l = mts_tensor_get_int(t[1], 0), d = mts_tensor_get_int(t[2], 0);
        if (d == 0) return mts_err_set(k->err, MTS_EINVAL, "Range delta is 0");
        if ((s < 0 && l > INT64_MAX + s) || (s > 0 && l < INT64_MIN + s))
            return mts_err_set(k->err, MTS_EINVAL, "Range span from %lld to %lld overflows", (long long)s,
                               (long long)l);
        int64_t span = l - s;
        int64_t n;
        if ((span > 0) != (d > 0) || span == 0)
            n = 0;
        else if (d > 0)
            n = (span - 1) / d + 1;
        else
            n = (span + 1) / d + 1;
        *count = n;
    }
    return MTS_OK;
}

static int range_infer(mts_kctx *k)
{
    int64_t n;
    int rc;
    if ((rc = mts_kchk_n_out(k, 1)) || (rc = range_count(k, &n))) return rc;
    return mts_kset_out(k, 0, k->in[0]->dtype, 1, &n);
}

static int range_run(mts_kctx *k)
{
    int64_t n;
    int rc = range_count(k, &n);
    if (rc) return rc;
    const mts_tensor *ts = k->in[0], *td = k->in[2];
    void *o = k->out[0].data;
    switch (ts->dtype) {
    case MTS_DTYPE_FLOAT: {
        double s = *(const float *)ts->data, d = *(const float *)td->data;
        for (int64_t i = 0; i < n; i++) ((float *)o)[i] = (float)(s + (double)i * d);
        break;
    }
    case MTS_DTYPE_INT32: {
        int64_t s = mts_tensor_get_int(ts, 0), d = mts_tensor_get_int(td, 0);
        for (int64_t i = 0; i < n; i++) ((int32_t *)o)[i] = (int32_t)(s + i * d);
        break;
    }
    default: {
        int64_t s = mts_tensor_get_int(ts, 0), d = mts_tensor_get_int(td, 0);
        for (int64_t i = 0; i < n; i++) ((int64_t *)o)[i] = s + i * d;
        break;
    }
    }
    return MTS_OK;
}

/* ------------------------------------------------------------------------------------------ */

const mts_op mts_ref_ops_shape[] = {
    {"MatMul", matmul_infer, matmul_run},
    {"Gemm", gemm_infer, gemm_run},
    {"Concat", concat_infer, concat_run},
    {"Split", split_infer, split_run},
    {"Slice", slice_infer, slice_run},
    {"Reshape", reshape_infer, copy_run},
    {"Flatten", flatten_infer, copy_run},
    {"Transpose", transpose_infer, transpose_run},
    {"Squeeze", squeeze_infer, copy_run},
    {"Unsqueeze", unsqueeze_infer, copy_run},
    {"Shape", shape_infer, shape_run},
    {"Size", size_infer, size_run},
    {"Gather", gather_infer, gather_run},
    {"GatherElements", gather_el_infer, gather_el_run},
    {"Constant", constant_infer, constant_run},
    {"ConstantOfShape", cos_infer, cos_run},
    {"Identity", identity_infer, identity_run},
    {"Dropout", dropout_infer, dropout_run},
    {"Expand", expand_infer, expand_run},
    {"Tile", tile_infer, tile_run},
    {"Range", range_infer, range_run},
    {NULL, NULL, NULL},
};
