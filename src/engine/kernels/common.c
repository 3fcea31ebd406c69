/*
 * Helpers shared by the reference kernels: numpy-style broadcasting of shapes, axis
 * normalization and row-major strides. Kept here so each kernel file states only its op.
 */
#include "engine/kernels/kernel.h"

int mts_broadcast_shape(const mts_tensor *a, const mts_tensor *b, mts_tensor *out, mts_err *err)
{
    int rank = a->rank > b->rank ? a->rank : b->rank;
    for (int i = 0; i < rank; i++) {
        int ia = i - (rank - a->rank), ib = i - (rank - b->rank);
        int64_t da = ia >= 0 ? a->dims[ia] : 1;
        int64_t db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[96], sb[96];
            return mts_err_set(err, MTS_ESHAPE, "shapes %s and %s cannot be broadcast (axis %d: %lld vs %lld)",
                               mts_shape_str(a, sa, sizeof sa), mts_shape_str(b, sb, sizeof sb), i,
                               (long long)da, (long long)db);
        }
        out->dims[i] = (da == 1) ? db : da;
    }
    out->rank = rank;
    return MTS_OK;
}

int mts_norm_axis(int64_t axis, int rank, int *out, mts_err *err)
{
    int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a >= rank)
        return mts_err_set(err, MTS_EINVAL, "axis %lld is out of range for rank %d", (long long)axis, rank);
    *out = (int)a;
    return MTS_OK;
}

void mts_strides(const mts_tensor *t, int64_t *strides)
{
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= t->dims[i];
    }
}

int mts_kchk_n_out(mts_kctx *k, int min)
{
    if (k->n_out < min)
        return mts_err_set(k->err, MTS_EINVAL, "expected at least %d output(s), got %d", min, k->n_out);
    return MTS_OK;
}

/* Fills output j (ignored when the node has fewer outputs) after checking the shape. */
int mts_kset_out(mts_kctx *k, int j, mts_dtype dt, int rank, const int64_t *dims)
{
    if (rank > MTS_MAX_RANK)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "output %d would have rank %d; at most %d is supported", j,
                           rank, MTS_MAX_RANK);
    if (j >= k->n_out) return MTS_OK;
    mts_tensor *o = &k->out[j];
    o->dtype = dt;
    o->rank = rank;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0)
            return mts_err_set(k->err, MTS_EINVAL, "output %d dimension %d would be negative (%lld)", j, i,
                               (long long)dims[i]);
        o->dims[i] = dims[i];
    }
    if (mts_tensor_nbytes(o) < 0) {
        char s[160];
        return mts_err_set(k->err, MTS_EINVAL, "output %d shape %s has too many elements", j,
                           mts_shape_str(o, s, sizeof s));
    }
    return MTS_OK;
}
