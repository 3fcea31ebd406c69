/*
 * Sequence and optional ops on the engine's blob values (engine/seqval.h): SequenceEmpty,
 * SequenceConstruct, SequenceInsert, SequenceErase, SequenceAt, SequenceLength,
 * SplitToSequence, ConcatFromSequence, SequenceMap (its body runs once per element through the
 * subgraph runner, during run-time shape inference like Loop), Optional, OptionalHasElement
 * and OptionalGetElement.
 *
 * A kernel that builds a sequence lists its elements (views into its inputs), sizes the blob in
 * infer and writes it in run. Ops that need a sequence's contents to know their output (the
 * element at a position, the shapes after an insert) return MTS_EDYNAMIC until the data is
 * there. Sequences of sequences are declined (MTS_EUNSUPPORTED).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"
#include "engine/seqval.h"
#include "engine/subgraph.h"

/* ---- shared ---- */

/* The list of elements of a sequence being built: views, with their data possibly NULL. */
typedef struct items {
    int64_t n;
    const mts_tensor **p;
    mts_tensor *own; /* element views the list points into */
} items;

static void items_free(items *it)
{
    free(it->p);
    free(it->own);
    memset(it, 0, sizeof *it);
}

static int items_alloc(mts_kctx *k, items *it, int64_t n)
{
    if (n < 0 || n > MTS_SEQ_MAX_ITEMS)
        return mts_err_set(k->err, MTS_ELIMIT, "a sequence of %lld elements exceeds the limit of %d", (long long)n,
                           MTS_SEQ_MAX_ITEMS);
    it->n = n;
    it->p = calloc((size_t)n + 1, sizeof *it->p);
    it->own = calloc((size_t)n + 1, sizeof *it->own);
    if (!it->p || !it->own) {
        items_free(it);
        return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    }
    for (int64_t i = 0; i < n; i++) it->p[i] = &it->own[i];
    return MTS_OK;
}

/* Sets output j to a blob of these elements (infer), or writes it (run: write = true). */
static int put_blob(mts_kctx *k, int j, int kind, mts_dtype elem, const items *it, bool write)
{
    if (j >= k->n_out) return MTS_OK;
    if (write) {
        mts_seq_write(k->out[j].data, kind, elem, it->n, it->p);
        return MTS_OK;
    }
    int64_t nb = mts_seq_bytes(it->n, it->p);
    if (nb < 0) return mts_err_set(k->err, MTS_ELIMIT, "the sequence would be too large");
    int64_t dims[1] = {nb};
    return mts_kset_out(k, j, mts_seq_dtype(kind), 1, dims);
}

/* Input i as a validated sequence (kind SEQ); MTS_EDYNAMIC while its data is unknown. */
static int in_seq(mts_kctx *k, int i, mts_seqv *v)
{
    const mts_tensor *t = mts_kin(k, i);
    if (!t) return mts_err_set(k->err, MTS_EINVAL, "input %d (a sequence) is missing", i);
    if (t->dtype != MTS_DTYPE_SEQUENCE)
        return mts_err_set(k->err, MTS_EINVAL, "input %d must be a sequence, is %s", i, mts_dtype_name(t->dtype));
    if (!t->data) return MTS_EDYNAMIC;
    int rc = mts_seq_view(t, v, k->err);
    if (rc) mts_err_prefix(k->err, "input %d: ", i);
    return rc;
}

/* Checks that tensor t may be an element of a sequence of type elem (UNDEFINED: any). */
static int chk_elem(mts_kctx *k, const mts_tensor *t, mts_dtype elem, const char *what)
{
    if (mts_dtype_is_blob(t->dtype))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s: sequences of sequences, optionals or strings are not "
                           "supported", what);
    if (!mts_dtype_supported(t->dtype))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s has unsupported type %s", what, mts_dtype_name(t->dtype));
    if (elem != MTS_DTYPE_UNDEFINED && t->dtype != elem)
        return mts_err_set(k->err, MTS_EINVAL, "%s has type %s, the sequence holds %s", what,
                           mts_dtype_name(t->dtype), mts_dtype_name(elem));
    return MTS_OK;
}

/* A position input (scalar integer), or dflt when absent; MTS_EDYNAMIC while unknown. */
static int in_pos(mts_kctx *k, int i, int64_t dflt, int64_t *pos)
{
    const mts_tensor *t = mts_kin(k, i);
    *pos = dflt;
    if (!t) return MTS_OK;
    if ((t->dtype != MTS_DTYPE_INT64 && t->dtype != MTS_DTYPE_INT32) || mts_tensor_numel(t) != 1)
        return mts_err_set(k->err, MTS_EINVAL, "position must be one int32 or int64 value");
    if (!t->data) return MTS_EDYNAMIC;
    *pos = mts_tensor_get_int(t, 0);
    return MTS_OK;
}

/* ---- SequenceEmpty, SequenceConstruct ---- */

static int seq_empty_do(mts_kctx *k, bool write)
{
    int64_t dt = mts_attr_int(k->node, "dtype", MTS_DTYPE_FLOAT);
    if (!mts_dtype_supported((mts_dtype)dt) || mts_dtype_is_seq((mts_dtype)dt))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "SequenceEmpty dtype %lld is not supported", (long long)dt);
    items it = {0};
    return put_blob(k, 0, MTS_SEQ_SEQ, (mts_dtype)dt, &it, write);
}
static int seq_empty_infer(mts_kctx *k) { return seq_empty_do(k, false); }
static int seq_empty_run(mts_kctx *k) { return seq_empty_do(k, true); }

static int seq_construct_do(mts_kctx *k, bool write)
{
    if (k->n_in < 1) return mts_err_set(k->err, MTS_EINVAL, "SequenceConstruct needs at least one input");
    items it = {0};
    int rc = items_alloc(k, &it, k->n_in);
    for (int i = 0; !rc && i < k->n_in; i++) {
        if (!k->in[i]) rc = mts_err_set(k->err, MTS_EINVAL, "input %d is missing", i);
        else if (!(rc = chk_elem(k, k->in[i], k->in[0]->dtype, "input"))) it.p[i] = k->in[i];
    }
    if (!rc) rc = put_blob(k, 0, MTS_SEQ_SEQ, k->in[0]->dtype, &it, write);
    items_free(&it);
    return rc;
}
static int seq_construct_infer(mts_kctx *k) { return seq_construct_do(k, false); }
static int seq_construct_run(mts_kctx *k) { return seq_construct_do(k, true); }

/* ---- SequenceInsert, SequenceErase ---- */

static int seq_insert_do(mts_kctx *k, bool write)
{
    mts_seqv v;
    int64_t pos;
    const mts_tensor *x = mts_kin(k, 1);
    if (!x) return mts_err_set(k->err, MTS_EINVAL, "the tensor to insert is missing");
    int rc = in_seq(k, 0, &v);
    if (rc) return rc;
    if ((rc = chk_elem(k, x, v.count ? v.elem : MTS_DTYPE_UNDEFINED, "the inserted tensor"))) return rc;
    if ((rc = in_pos(k, 2, v.count, &pos))) return rc;
    if (pos < -v.count || pos > v.count)
        return mts_err_set(k->err, MTS_EINVAL, "position %lld is outside [%lld, %lld]", (long long)pos,
                           (long long)-v.count, (long long)v.count);
    if (pos < 0) pos += v.count;
    items it = {0};
    if ((rc = items_alloc(k, &it, v.count + 1))) return rc;
    for (int64_t i = 0, s = 0; i < it.n; i++) {
        if (i == pos) it.p[i] = x;
        else mts_seq_item(&v, s++, &it.own[i]);
    }
    rc = put_blob(k, 0, MTS_SEQ_SEQ, x->dtype, &it, write);
    items_free(&it);
    return rc;
}
static int seq_insert_infer(mts_kctx *k) { return seq_insert_do(k, false); }
static int seq_insert_run(mts_kctx *k) { return seq_insert_do(k, true); }

static int seq_erase_do(mts_kctx *k, bool write)
{
    mts_seqv v;
    int64_t pos;
    int rc = in_seq(k, 0, &v);
    if (rc) return rc;
    if ((rc = in_pos(k, 1, v.count - 1, &pos))) return rc;
    if (v.count == 0 || pos < -v.count || pos >= v.count)
        return mts_err_set(k->err, MTS_EINVAL, "position %lld is outside the sequence of %lld elements",
                           (long long)pos, (long long)v.count);
    if (pos < 0) pos += v.count;
    items it = {0};
    if ((rc = items_alloc(k, &it, v.count - 1))) return rc;
    for (int64_t i = 0, s = 0; s < v.count; s++)
        if (s != pos) mts_seq_item(&v, s, &it.own[i++]);
    rc = put_blob(k, 0, MTS_SEQ_SEQ, v.elem, &it, write);
    items_free(&it);
    return rc;
}
static int seq_erase_infer(mts_kctx *k) { return seq_erase_do(k, false); }
static int seq_erase_run(mts_kctx *k) { return seq_erase_do(k, true); }

/* ---- SequenceAt, SequenceLength ---- */

static int seq_at_get(mts_kctx *k, mts_tensor *e)
{
    mts_seqv v;
    int64_t pos;
    int rc = in_seq(k, 0, &v);
    if (rc) return rc;
    if (!mts_kin(k, 1)) return mts_err_set(k->err, MTS_EINVAL, "position is missing");
    if ((rc = in_pos(k, 1, 0, &pos))) return rc;
    if (pos < -v.count || pos >= v.count)
        return mts_err_set(k->err, MTS_EINVAL, "position %lld is outside the sequence of %lld elements",
                           (long long)pos, (long long)v.count);
    mts_seq_item(&v, pos < 0 ? pos + v.count : pos, e);
    return MTS_OK;
}

static int seq_at_infer(mts_kctx *k)
{
    mts_tensor e;
    int rc = seq_at_get(k, &e);
    return rc ? rc : mts_kset_out(k, 0, e.dtype, e.rank, e.dims);
}

static int seq_at_run(mts_kctx *k)
{
    mts_tensor e;
    int rc = seq_at_get(k, &e);
    if (rc) return rc;
    if (e.dtype != k->out[0].dtype || !mts_shape_equal(&e, &k->out[0]))
        return mts_err_set(k->err, MTS_ESHAPE, "the element changed shape since inference");
    int64_t nb = mts_tensor_nbytes(&e);
    if (nb > 0) memcpy(k->out[0].data, e.data, (size_t)nb);
    return MTS_OK;
}

static int seq_length_infer(mts_kctx *k)
{
    const mts_tensor *t = mts_kin(k, 0);
    if (!t || t->dtype != MTS_DTYPE_SEQUENCE) return mts_err_set(k->err, MTS_EINVAL, "input must be a sequence");
    return mts_kset_out(k, 0, MTS_DTYPE_INT64, 0, NULL);
}

static int seq_length_run(mts_kctx *k)
{
    mts_seqv v;
    int rc = in_seq(k, 0, &v);
    if (rc == MTS_EDYNAMIC) return mts_err_set(k->err, MTS_EINVAL, "the sequence has no data");
    if (rc) return rc;
    *(int64_t *)k->out[0].data = v.count;
    return MTS_OK;
}

/* ---- SplitToSequence ---- */

/* Element shapes of the split (it.own), and each one's start along the axis in *starts. */
static int split_plan(mts_kctx *k, int *axis_out, items *it, int64_t **starts)
{
    const mts_tensor *x = mts_kin(k, 0), *sp = mts_kin(k, 1);
    *starts = NULL;
    if (!x) return mts_err_set(k->err, MTS_EINVAL, "input is missing");
    int rc = chk_elem(k, x, MTS_DTYPE_UNDEFINED, "input");
    if (rc) return rc;
    if (x->rank < 1) return mts_err_set(k->err, MTS_EINVAL, "input must have rank >= 1");
    int axis;
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), x->rank, &axis, k->err))) return rc;
    int64_t dim = x->dims[axis], n, chunk = 1;
    bool squeeze = false;
    if (!sp) {
        n = dim;
        squeeze = mts_attr_int(k->node, "keepdims", 1) == 0;
    } else {
        if (sp->dtype != MTS_DTYPE_INT64 && sp->dtype != MTS_DTYPE_INT32)
            return mts_err_set(k->err, MTS_EINVAL, "split must be int32 or int64");
        if (sp->rank > 1) return mts_err_set(k->err, MTS_EINVAL, "split must be a scalar or 1-D");
        if (!sp->data) return MTS_EDYNAMIC;
        if (sp->rank == 0) {
            chunk = mts_tensor_get_int(sp, 0);
            if (chunk <= 0) return mts_err_set(k->err, MTS_EINVAL, "split %lld must be positive", (long long)chunk);
            n = dim / chunk + (dim % chunk != 0);
        } else {
            n = sp->dims[0];
        }
    }
    if ((rc = items_alloc(k, it, n))) return rc;
    *starts = calloc((size_t)n + 1, sizeof **starts);
    if (!*starts) {
        items_free(it);
        return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    }
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = !sp ? 1 : sp->rank == 0 ? (dim - at < chunk ? dim - at : chunk) : mts_tensor_get_int(sp, i);
        if (len < 0 || len > dim - at) {
            rc = mts_err_set(k->err, MTS_EINVAL, "split sizes do not add up to the axis length %lld", (long long)dim);
            break;
        }
        mts_tensor *e = &it->own[i];
        *e = *x;
        e->data = NULL;
        e->dims[axis] = len;
        if (squeeze) {
            for (int d = axis; d + 1 < x->rank; d++) e->dims[d] = x->dims[d + 1];
            e->rank--;
        }
        (*starts)[i] = at;
        at += len;
    }
    if (!rc && at != dim)
        rc = mts_err_set(k->err, MTS_EINVAL, "split sizes add up to %lld, the axis has %lld", (long long)at,
                         (long long)dim);
    if (rc) {
        items_free(it);
        free(*starts);
        *starts = NULL;
    }
    *axis_out = axis;
    return rc;
}

static int split_seq_infer(mts_kctx *k)
{
    items it;
    int64_t *starts;
    int axis;
    int rc = split_plan(k, &axis, &it, &starts);
    if (rc) return rc;
    rc = put_blob(k, 0, MTS_SEQ_SEQ, k->in[0]->dtype, &it, false);
    items_free(&it);
    free(starts);
    return rc;
}

static int split_seq_run(mts_kctx *k)
{
    items it;
    int64_t *starts;
    int axis;
    int rc = split_plan(k, &axis, &it, &starts);
    if (rc) return rc;
    const mts_tensor *x = k->in[0];
    mts_seq_write(k->out[0].data, MTS_SEQ_SEQ, x->dtype, it.n, it.p); /* elements have no data: header only */
    mts_seqv v;
    if (!(rc = mts_seq_view(&k->out[0], &v, k->err))) {
        int64_t outer = 1, inner = 1;
        for (int d = 0; d < axis; d++) outer *= x->dims[d];
        for (int d = axis + 1; d < x->rank; d++) inner *= x->dims[d];
        size_t es = mts_dtype_size(x->dtype);
        for (int64_t i = 0; i < it.n; i++) {
            mts_tensor e;
            mts_seq_item(&v, i, &e);
            int64_t len = it.own[i].rank == x->rank ? it.own[i].dims[axis] : 1;
            size_t blk = (size_t)(len * inner) * es;
            for (int64_t o = 0; o < outer && blk; o++)
                memcpy((char *)e.data + (size_t)o * blk,
                       (const char *)x->data + ((size_t)(o * x->dims[axis] + starts[i]) * (size_t)inner) * es, blk);
        }
    }
    items_free(&it);
    free(starts);
    return rc;
}

/* ---- ConcatFromSequence ---- */

static int concat_seq_get(mts_kctx *k, mts_seqv *v, int *axis, bool *stack, mts_tensor *out)
{
    int rc = in_seq(k, 0, v);
    if (rc) return rc;
    if (v->count == 0) return mts_err_set(k->err, MTS_EINVAL, "cannot concatenate an empty sequence");
    *stack = mts_attr_int(k->node, "new_axis", 0) != 0;
    mts_tensor e0;
    mts_seq_item(v, 0, &e0);
    int r = e0.rank + (*stack ? 1 : 0);
    if (r < 1 || r > MTS_MAX_RANK) return mts_err_set(k->err, MTS_EINVAL, "elements of rank %d cannot be joined", e0.rank);
    if ((rc = mts_norm_axis(mts_attr_int(k->node, "axis", 0), r, axis, k->err))) return rc;
    *out = e0;
    out->rank = r;
    if (*stack) {
        for (int d = r - 1; d > *axis; d--) out->dims[d] = e0.dims[d - 1];
        out->dims[*axis] = v->count;
    }
    for (int64_t i = 1; i < v->count; i++) {
        mts_tensor e;
        mts_seq_item(v, i, &e);
        bool ok = e.rank == e0.rank;
        for (int d = 0; ok && d < e0.rank; d++) ok = e.dims[d] == e0.dims[d] || (!*stack && d == *axis);
        if (!ok) return mts_err_set(k->err, MTS_ESHAPE, "element %lld's shape does not match element 0's", (long long)i);
        if (!*stack) {
            if (out->dims[*axis] > INT64_MAX / 2 - e.dims[*axis])
                return mts_err_set(k->err, MTS_ELIMIT, "the concatenation is too large");
            out->dims[*axis] += e.dims[*axis];
        }
    }
    return MTS_OK;
}

static int concat_seq_infer(mts_kctx *k)
{
    mts_seqv v;
    int axis;
    bool stack;
    mts_tensor o;
    int rc = concat_seq_get(k, &v, &axis, &stack, &o);
    return rc ? rc : mts_kset_out(k, 0, o.dtype, o.rank, o.dims);
}

static int concat_seq_run(mts_kctx *k)
{
    mts_seqv v;
    int axis;
    bool stack;
    mts_tensor o;
    int rc = concat_seq_get(k, &v, &axis, &stack, &o);
    if (rc) return rc;
    if (!mts_shape_equal(&o, &k->out[0])) return mts_err_set(k->err, MTS_ESHAPE, "the sequence changed since inference");
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= o.dims[d];
    for (int d = axis + 1; d < o.rank; d++) inner *= o.dims[d];
    size_t es = mts_dtype_size(o.dtype);
    int64_t at = 0;
    for (int64_t i = 0; i < v.count; i++) {
        mts_tensor e;
        mts_seq_item(&v, i, &e);
        int64_t len = stack ? 1 : e.dims[axis];
        size_t blk = (size_t)(len * inner) * es;
        for (int64_t q = 0; q < outer && blk; q++)
            memcpy((char *)k->out[0].data + ((size_t)(q * o.dims[axis] + at) * (size_t)inner) * es,
                   (const char *)e.data + (size_t)q * blk, blk);
        at += len;
    }
    return MTS_OK;
}

/* ---- Optional, OptionalHasElement, OptionalGetElement ---- */

static int optional_do(mts_kctx *k, bool write)
{
    const mts_tensor *x = mts_kin(k, 0);
    items it = {0};
    int rc = MTS_OK, kind;
    mts_dtype elem = MTS_DTYPE_UNDEFINED;
    if (!x) {
        if (!mts_node_attr(k->node, "type"))
            return mts_err_set(k->err, MTS_EINVAL, "Optional without an input needs the 'type' attribute");
        kind = MTS_SEQ_OPT_NONE;
    } else if (x->dtype == MTS_DTYPE_SEQUENCE) {
        mts_seqv v;
        if ((rc = in_seq(k, 0, &v))) return rc;
        if ((rc = items_alloc(k, &it, v.count))) return rc;
        for (int64_t i = 0; i < v.count; i++) mts_seq_item(&v, i, &it.own[i]);
        kind = MTS_SEQ_OPT_SEQ;
        elem = v.elem;
    } else {
        if ((rc = chk_elem(k, x, MTS_DTYPE_UNDEFINED, "input"))) return rc;
        if ((rc = items_alloc(k, &it, 1))) return rc;
        it.p[0] = x;
        kind = MTS_SEQ_OPT_TENSOR;
        elem = x->dtype;
    }
    rc = put_blob(k, 0, kind, elem, &it, write);
    items_free(&it);
    return rc;
}
static int optional_infer(mts_kctx *k) { return optional_do(k, false); }
static int optional_run(mts_kctx *k) { return optional_do(k, true); }

static int opt_has_infer(mts_kctx *k)
{
    return mts_kset_out(k, 0, MTS_DTYPE_BOOL, 0, NULL);
}

static int opt_has_run(mts_kctx *k)
{
    const mts_tensor *x = mts_kin(k, 0);
    bool has = x != NULL;
    if (x && x->dtype == MTS_DTYPE_OPTIONAL) {
        mts_seqv v;
        if (!x->data) return mts_err_set(k->err, MTS_EINVAL, "the optional has no data");
        int rc = mts_seq_view(x, &v, k->err);
        if (rc) return rc;
        has = v.kind != MTS_SEQ_OPT_NONE;
    }
    *(uint8_t *)k->out[0].data = has;
    return MTS_OK;
}

static int opt_get_do(mts_kctx *k, bool write)
{
    const mts_tensor *x = mts_kin(k, 0);
    if (!x) return mts_err_set(k->err, MTS_EINVAL, "input is missing");
    if (x->dtype != MTS_DTYPE_OPTIONAL) { /* opset 18: a tensor or sequence passes through */
        if (!write) return mts_kset_out(k, 0, x->dtype, x->rank, x->dims);
        int64_t nb = mts_tensor_nbytes(x);
        if (nb > 0) memcpy(k->out[0].data, x->data, (size_t)nb);
        return MTS_OK;
    }
    if (!x->data) return MTS_EDYNAMIC;
    mts_seqv v;
    int rc = mts_seq_view(x, &v, k->err);
    if (rc) return rc;
    if (v.kind == MTS_SEQ_OPT_NONE) return mts_err_set(k->err, MTS_EINVAL, "the optional input is empty");
    if (v.kind == MTS_SEQ_OPT_TENSOR) {
        mts_tensor e;
        mts_seq_item(&v, 0, &e);
        if (!write) return mts_kset_out(k, 0, e.dtype, e.rank, e.dims);
        if (!mts_shape_equal(&e, &k->out[0])) return mts_err_set(k->err, MTS_ESHAPE, "the optional changed since inference");
        int64_t nb = mts_tensor_nbytes(&e);
        if (nb > 0) memcpy(k->out[0].data, e.data, (size_t)nb);
        return MTS_OK;
    }
    items it = {0};
    if ((rc = items_alloc(k, &it, v.count))) return rc;
    for (int64_t i = 0; i < v.count; i++) mts_seq_item(&v, i, &it.own[i]);
    rc = put_blob(k, 0, MTS_SEQ_SEQ, v.elem, &it, write);
    items_free(&it);
    return rc;
}
static int opt_get_infer(mts_kctx *k) { return opt_get_do(k, false); }
static int opt_get_run(mts_kctx *k) { return opt_get_do(k, true); }

/* ---- SequenceMap ---- */

/* Runs the body once per element during run-time inference; the node's state keeps one blob per
 * output (entries [0, n_out)), which run copies. */
static int seq_map_infer(mts_kctx *k)
{
    mts_model *body = mts_subgraph(k->node, "body");
    int n_exp = k->n_in - k->node->n_implicit;
    if (!body) return mts_err_set(k->err, MTS_EINVAL, "SequenceMap has no body");
    if (n_exp < 1 || mts_subgraph_n_inputs(body) != n_exp || mts_subgraph_n_outputs(body) != k->n_out)
        return mts_err_set(k->err, MTS_EINVAL, "SequenceMap body takes %d inputs and gives %d outputs; the node has "
                           "%d and %d", mts_subgraph_n_inputs(body), mts_subgraph_n_outputs(body), n_exp, k->n_out);
    for (int i = 0; i < n_exp; i++)
        if (!mts_kin(k, i)) return mts_err_set(k->err, MTS_EINVAL, "input %d is missing", i);
    if (!k->ctx) return MTS_EDYNAMIC;
    for (int i = 0; i < n_exp; i++)
        if (!k->in[i]->data && mts_tensor_numel(k->in[i]) != 0) return MTS_EDYNAMIC;
    mts_seqv *sv = calloc((size_t)n_exp + 1, sizeof *sv);
    mts_tensor *formal = calloc((size_t)n_exp + 1, sizeof *formal);
    const mts_tensor **outs = calloc((size_t)k->n_out + 1, sizeof *outs);
    mts_tensor **res = calloc((size_t)k->n_out + 1, sizeof *res); /* per output: copies of the results */
    mts_cf_state *st = mts_cf_state_get(k, k->n_out);
    int64_t L = 0;
    int rc = sv && formal && outs && res && st ? MTS_OK : mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    if (!rc && k->in[0]->dtype != MTS_DTYPE_SEQUENCE)
        rc = mts_err_set(k->err, MTS_EINVAL, "input 0 must be a sequence, is %s", mts_dtype_name(k->in[0]->dtype));
    for (int i = 0; !rc && i < n_exp; i++) {
        if (k->in[i]->dtype == MTS_DTYPE_OPTIONAL)
            rc = mts_err_set(k->err, MTS_EUNSUPPORTED, "optional inputs of SequenceMap are not supported");
        else if (k->in[i]->dtype == MTS_DTYPE_SEQUENCE && !(rc = mts_seq_view(k->in[i], &sv[i], k->err))) {
            if (i == 0) L = sv[i].count;
            else if (sv[i].count != L)
                rc = mts_err_set(k->err, MTS_ESHAPE, "sequence input %d has %lld elements, input 0 %lld", i,
                                 (long long)sv[i].count, (long long)L);
        }
    }
    for (int j = 0; !rc && j < k->n_out; j++)
        if (!(res[j] = calloc((size_t)L + 1, sizeof **res))) rc = mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    if (st) st->ready = 0;
    int64_t limit = mts_subgraph_max_bytes(body), total = 0;
    for (int64_t t = 0; !rc && t < L; t++) {
        for (int i = 0; i < n_exp; i++) {
            if (k->in[i]->dtype == MTS_DTYPE_SEQUENCE) mts_seq_item(&sv[i], t, &formal[i]);
            else formal[i] = *k->in[i];
        }
        void *tmp;
        rc = mts_subgraph_run(k, body, formal, n_exp, outs, &tmp);
        for (int j = 0; !rc && j < k->n_out; j++) {
            if ((rc = chk_elem(k, outs[j], t ? res[j][0].dtype : MTS_DTYPE_UNDEFINED, "a body output"))) break;
            int64_t nb = mts_tensor_nbytes(outs[j]);
            if (nb > limit - total) {
                rc = mts_err_set(k->err, MTS_ELIMIT, "the output sequences exceed the limit of %lld bytes",
                                 (long long)limit);
                break;
            }
            total += nb;
            res[j][t] = *outs[j];
            res[j][t].data = malloc(nb > 0 ? (size_t)nb : 1);
            if (!res[j][t].data) {
                rc = mts_err_set(k->err, MTS_ENOMEM, "out of memory");
                break;
            }
            if (nb > 0) memcpy(res[j][t].data, outs[j]->data, (size_t)nb);
        }
        mts_subgraph_tmp_free(tmp);
    }
    items it = {0};
    if (!rc && (rc = items_alloc(k, &it, L)) == MTS_OK) {
        for (int j = 0; !rc && j < k->n_out; j++) {
            for (int64_t t = 0; t < L; t++) it.p[t] = &res[j][t];
            mts_dtype elem = L ? res[j][0].dtype : mts_subgraph_output_dtype(body, j);
            int64_t nb = mts_seq_bytes(L, it.p);
            if (nb < 0 || nb > limit) rc = mts_err_set(k->err, MTS_ELIMIT, "output sequence %d is too large", j);
            else if (!(rc = mts_cf_reserve(st, j, nb, false, k->err))) {
                mts_seq_write(st->t[j].data, MTS_SEQ_SEQ, elem, L, it.p);
                st->view[j] = (mts_tensor){.dtype = MTS_DTYPE_SEQUENCE, .rank = 1, .dims = {nb}, .data = st->t[j].data};
                k->out[j] = st->view[j];
                k->out[j].data = NULL;
            }
        }
        items_free(&it);
    }
    if (!rc) st->ready = 1;
    for (int j = 0; res && j < k->n_out; j++) {
        for (int64_t t = 0; res[j] && t < L; t++) free(res[j][t].data);
        free(res[j]);
    }
    free(res);
    free(sv);
    free(formal);
    free(outs);
    return rc;
}

static int seq_map_run(mts_kctx *k)
{
    mts_cf_state *st = mts_cf_state_get(k, k->n_out);
    if (!st || !st->ready) return mts_err_set(k->err, MTS_EINVAL, "SequenceMap has no results");
    st->ready = 0;
    for (int j = 0; j < k->n_out; j++) {
        if (st->view[j].dims[0] != k->out[j].dims[0])
            return mts_err_set(k->err, MTS_ESHAPE, "output %d changed size since inference", j);
        memcpy(k->out[j].data, st->view[j].data, (size_t)st->view[j].dims[0]);
    }
    return MTS_OK;
}

const mts_op mts_ref_ops_seq[] = {
    {"SequenceEmpty", seq_empty_infer, seq_empty_run},
    {"SequenceConstruct", seq_construct_infer, seq_construct_run},
    {"SequenceInsert", seq_insert_infer, seq_insert_run},
    {"SequenceErase", seq_erase_infer, seq_erase_run},
    {"SequenceAt", seq_at_infer, seq_at_run},
    {"SequenceLength", seq_length_infer, seq_length_run},
    {"SplitToSequence", split_seq_infer, split_seq_run},
    {"ConcatFromSequence", concat_seq_infer, concat_seq_run},
    {"SequenceMap", seq_map_infer, seq_map_run},
    {"Optional", optional_infer, optional_run},
    {"OptionalHasElement", opt_has_infer, opt_has_run},
    {"OptionalGetElement", opt_get_infer, opt_get_run},
    {NULL, NULL, NULL},
};
