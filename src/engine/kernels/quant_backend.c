/*
 * The quantized kernels' entry in the backend table, for plans of the default backend (plans of
 * the reference backend keep the reference kernels; MTS_NO_FAST=1 turns this entry off for
 * comparisons, like the fast float kernels):
 *
 *   - QDQ fusion (claim; the entry stands first in the table so that it sees the float
 *     convolutions before oneDNN claims them): a float Conv or 2-D-weight MatMul whose data
 *     input is a DequantizeLinear step (uint8/int8, per-tensor constant scale), whose weight is
 *     a constant DequantizeLinear of a constant (per tensor, or per output channel / column),
 *     whose float bias (Conv) is constant, and whose output's only reader is a QuantizeLinear
 *     with constant per-tensor scale and zero point, becomes one QLinearConv / QLinearMatMul
 *     step on the quantized tensors (the Conv's float bias is requantized to int32 with
 *     x_scale * w_scale at run time: node attribute "mts_float_bias"). The DequantizeLinear of
 *     the data goes too when nothing else reads it. Results can differ from the float path by
 *     one quantization step where the float rounding differs.
 *   - Then the float ops between quantized tensors (fuse_qdq_eltwise): Q(Relu / LeakyRelu(DQ))
 *     and Q(activation(DQ)) for the activations of table_unary (HardSwish, Sigmoid, Clip, ...),
 *     Q(Add(DQ, DQ)), Q(Concat(DQ, DQ)) and Q(nearest integer upsample(DQ)) become integer steps
 *     (MtsQLinearUnary / Add / Concat / Upsample in ref_quant.c) that compute exactly what the
 *     unfused float steps would; DequantizeLinear steps left without readers are dropped.
 *   - Substitution: the packed integer-GEMM kernels (qgemm.h, AVX-512 VNNI where the CPU has
 *     it) replace the reference MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv
 *     kernels (ref_quant.c); both share their validation and requantization, so only the
 *     product differs.
 */
#include <string.h>

#include "engine/rewrite.h"

extern const mts_op mts_quant_fast_matmulinteger, mts_quant_fast_qlinearmatmul, mts_quant_fast_convinteger,
    mts_quant_fast_qlinearconv, mts_quant_fast_qunary, mts_quant_fast_qadd, mts_quant_fast_qconcat,
    mts_quant_fast_qupsample, mts_quant_fast_qconcat_nhwc, mts_quant_fast_qupsample_nhwc;
int mts_quant_table_op(const mts_node *nd, const char *name, const mts_tensor *const *ops, int n_ops, float *f,
                       mts_err *err);

static bool quant_enabled(int kind)
{
    return kind == MTS_BACKEND_DEFAULT && mts_fast_enabled();
}

/* v's constant scalar-or-vector of numel 1 or n (n > 0): per tensor or along one axis. */
static bool const_param(const mts__plan *p, int v, mts_dtype t, int64_t n)
{
    if (!const_value(p, v) || p->vals[v].dtype != t) return false;
    int64_t ne = mts_tensor_numel(&p->vals[v]);
    return (ne == 1 && p->vals[v].rank <= 1) || (n > 1 && p->vals[v].rank == 1 && ne == n);
}

static bool q8_type(mts_dtype t)
{
    return t == MTS_DTYPE_UINT8 || t == MTS_DTYPE_INT8;
}

/* The quantized form (q, scale, zero point; zp -1 when absent) of float value v produced by a
 * DequantizeLinear: a live step (st_out: its index) or, for a folded constant, the model node.
 * nparam: 0 for per-tensor only, else the axis length allowed per axis, along axis `axis`. */
static bool dq_source(const mts__opt *o, int v, bool want_const, int64_t nparam, int axis, int *q, int *sc, int *zp,
                      int *st_out)
{
    const mts__plan *p = o->p;
    const mts_node *n = NULL;
    *st_out = -1;
    if (v < 0) return false;
    int s = o->prod[v];
    if (s >= 0) {
        if (!plain_step(o, s, "DequantizeLinear") || p->steps[s].nhwc) return false;
        n = p->steps[s].nd;
        *st_out = s;
        const mts__step *st = &p->steps[s];
        *q = st->in[0];
        *sc = st->n_in > 1 ? st->in[1] : -1;
        *zp = st->n_in > 2 ? st->in[2] : -1;
    } else {
        if (!const_value(p, v) || o->m->values[v].producer < 0) return false;
        n = &o->m->nodes[o->m->values[v].producer];
        if (n->domain[0] || strcmp(n->op_type, "DequantizeLinear") || n->n_in < 2) return false;
        *q = n->in[0];
        *sc = n->in[1];
        *zp = n->n_in > 2 ? n->in[2] : -1;
    }
    if (*q < 0 || *sc < 0 || !q8_type(p->vals[*q].dtype) || (want_const && !const_value(p, *q))) return false;
    if (p->state[*q] == MTS__V_DYNAMIC || mts_attr_int(n, "block_size", 0) != 0) return false;
    const mts_tensor *qt = &p->vals[*q];
    bool vec = mts_tensor_numel(&p->vals[*sc]) != 1;
    if (vec) {
        int64_t ax = mts_attr_int(n, "axis", 1);
        if (ax < 0) ax += qt->rank;
        if (nparam <= 1 || ax != axis || qt->rank <= axis) return false;
    }
    if (!const_param(p, *sc, MTS_DTYPE_FLOAT, vec ? nparam : 0)) return false;
    if (*zp >= 0 && !const_param(p, *zp, qt->dtype, vec ? nparam : 0)) return false;
    return true;
}

/* Rewrites step s (a float Conv or MatMul) into a QLinear step when its QDQ pattern holds. */
static int fuse_qdq(mts__opt *o, int s, mts_err *err)
{
    mts__plan *p = o->p;
    mts__step *st = &p->steps[s];
    bool conv = is_op(st, "Conv");
    if (st->n_out != 1 || st->out[0] < 0 || st->n_in < 2 || st->n_in > (conv ? 3 : 2)) return MTS_OK;
    int y = st->out[0];
    const mts_tensor *yv = &p->vals[y], *wv = &p->vals[st->in[1]];
    if (yv->dtype != MTS_DTYPE_FLOAT || p->state[y] != MTS__V_STATIC) return MTS_OK;
    int64_t M = conv ? wv->dims[0] : wv->rank == 2 ? wv->dims[1] : 0;
    if ((conv && wv->rank < 3) || (!conv && wv->rank != 2) || M < 1) return MTS_OK;
    int xq, xs, xz, xst, wq, ws, wz, wst;
    if (!dq_source(o, st->in[0], false, 0, 0, &xq, &xs, &xz, &xst) ||
        !dq_source(o, st->in[1], true, M, conv ? 0 : 1, &wq, &ws, &wz, &wst) || wst >= 0)
        return MTS_OK;
    int b = conv && st->n_in > 2 ? st->in[2] : -1;
    if (b >= 0 && !(const_value(p, b) && p->vals[b].dtype == MTS_DTYPE_FLOAT)) return MTS_OK;
    int qs = sole_reader(o, y);
    if (!plain_step(o, qs, "QuantizeLinear") || p->steps[qs].nhwc) return MTS_OK;
    const mts__step *qst = &p->steps[qs];
    if (qst->in[0] != y || qst->n_in < 3 || qst->in[2] < 0 || qst->out[0] < 0 ||
        mts_attr_int(qst->nd, "block_size", 0) != 0)
        return MTS_OK;
    int ys = qst->in[1], yz = qst->in[2];
    if (!const_param(p, ys, MTS_DTYPE_FLOAT, 0) || !const_param(p, yz, p->vals[yz].dtype, 0) ||
        !q8_type(p->vals[yz].dtype))
        return MTS_OK;
    mts_attr a = {0};
    a.name = "mts_float_bias";
    a.type = MTS_ATTR_INT;
    a.i = b >= 0;
    mts_node *nd = mts__node_with_attr(p, st, conv ? "QLinearConv" : "QLinearMatMul", a);
    if (!nd) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    int in[9] = {xq, xs, xz, wq, ws, wz, ys, yz, b};
    /* the fused kernel must accept the step and produce the QuantizeLinear's output */
    const mts_op *op = conv ? &mts_quant_fast_qlinearconv : &mts_quant_fast_qlinearmatmul;
    const mts_tensor *kin[9];
    for (int i = 0; i < 9; i++) kin[i] = in[i] >= 0 ? &p->vals[in[i]] : NULL;
    mts_tensor kout = {0};
    mts_err e = {0};
    mts_kctx k = {nd, kin, b >= 0 ? 9 : 8, &kout, 1, &e, 1, NULL};
    const mts_tensor *qy = &p->vals[qst->out[0]];
    if (op->infer(&k) || kout.dtype != qy->dtype || !mts_shape_equal(&kout, qy)) return MTS_OK;
    st->nd = nd;
    st->n_in = b >= 0 ? 9 : 8;
    memcpy(st->in, in, sizeof(int) * (size_t)st->n_in);
    st->out[0] = qst->out[0];
    st->op = op;
    o->removed[qs] = 1;
    p->state[y] = MTS__V_UNUSED;
    if (xst >= 0 && sole_reader(o, p->steps[xst].out[0]) == s) {
        p->state[p->steps[xst].out[0]] = MTS__V_UNUSED;
        o->removed[xst] = 1;
    }
    mts__count_uses(o);
    return MTS_OK;
}

/* Removes DequantizeLinear steps that fusion left without readers. */
static void drop_dead_dq(mts__opt *o)
{
    mts__plan *p = o->p;
    for (int s = 0; s < p->n_steps; s++) {
        if (!plain_step(o, s, "DequantizeLinear")) continue;
        int v = p->steps[s].out[0];
        if (v >= 0 && o->nuse[v] == 0 && !o->is_out[v]) {
            o->removed[s] = 1;
            p->state[v] = MTS__V_UNUSED;
        }
    }
    mts__count_uses(o);
}

/* Whether st is a float activation whose value depends on its input element alone and whose
 * other operands (Clip's bounds) are constants: a QuantizeLinear of it applied to a
 * DequantizeLinear is then a 256-entry table built with its reference kernel (ref_quant.c). */
static bool table_unary(const mts__plan *p, const mts__step *st)
{
    static const char *const ops[] = {"HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "Elu", "Selu",
                                      "Softplus", "Softsign", "Clip", NULL};
    if (st->nd->domain[0] || st->n_in < 1 || st->n_in > 3 || st->in[0] < 0 ||
        p->vals[st->in[0]].dtype != MTS_DTYPE_FLOAT)
        return false;
    bool known = false;
    for (int i = 0; ops[i] && !known; i++) known = is_op(st, ops[i]);
    if (!known || (st->n_in > 1 && !is_op(st, "Clip"))) return false;
    for (int i = 1; i < st->n_in; i++)
        if (st->in[i] >= 0 && (!const_value(p, st->in[i]) || mts_tensor_numel(&p->vals[st->in[i]]) != 1))
            return false;
    /* the table will run the op on 256 floats with these operands: it must accept them */
    const mts_tensor *operands[2] = {NULL, NULL};
    for (int i = 1; i < st->n_in; i++) operands[i - 1] = st->in[i] >= 0 ? &p->vals[st->in[i]] : NULL;
    mts_err e = {0};
    return mts_quant_table_op(st->nd, st->nd->op_type, operands, st->n_in - 1, NULL, &e) == MTS_OK;
}

/* QuantizeLinear step qs reading the only output of a Relu / LeakyRelu or of another
 * table_unary activation of a DequantizeLinear, of an Add of two same-shape DequantizeLinears, of a two-input Concat of DequantizeLinears or
 * of a nearest integer-factor upsampling (Resize) of one (all per tensor, constant parameters)
 * becomes one MtsQLinearUnary / MtsQLinearAdd / MtsQLinearConcat / MtsQLinearUpsample step on
 * the quantized tensors (ref_quant.c), with the unfused steps' results. */
static int fuse_qdq_eltwise(mts__opt *o, int qs, mts_err *err)
{
    mts__plan *p = o->p;
    const mts__step *qst = &p->steps[qs];
    if (qst->nhwc || qst->n_in < 3 || qst->in[2] < 0 || qst->out[0] < 0 || mts_attr_int(qst->nd, "block_size", 0) != 0)
        return MTS_OK;
    int y = qst->in[0], ys = qst->in[1], yz = qst->in[2];
    if (!const_param(p, ys, MTS_DTYPE_FLOAT, 0) || !const_param(p, yz, p->vals[yz].dtype, 0) ||
        !q8_type(p->vals[yz].dtype) || y < 0 || p->state[y] != MTS__V_STATIC || sole_reader(o, y) != qs)
        return MTS_OK;
    int u = o->prod[y];
    if (u < 0 || o->removed[u] || p->steps[u].kind != MTS__S_KERNEL || p->steps[u].dynamic || p->steps[u].nhwc ||
        p->steps[u].n_out != 1)
        return MTS_OK;
    mts__step *ust = &p->steps[u];
    int kind = is_op(ust, "Relu") ? 1 : is_op(ust, "LeakyRelu") ? 2 : is_op(ust, "Add") ? 3 : is_op(ust, "Concat") ? 4
             : is_op(ust, "Resize") && mts__nearest_upsample(p, ust) ? 5 : table_unary(p, ust) ? 6 : 0;
    int n_data = kind == 3 || kind == 4 ? 2 : 1;
    if (!kind || (kind != 5 && kind != 6 && ust->n_in != n_data) || ust->n_in < 1) return MTS_OK;
    int in[8], n = 0;
    for (int i = 0; i < n_data; i++) {
        int q, sc, zp, st;
        if (!dq_source(o, ust->in[i], false, 0, 0, &q, &sc, &zp, &st) || st < 0 ||
            (kind <= 3 && !mts_shape_equal(&p->vals[ust->in[i]], &p->vals[y])))
            return MTS_OK;
        in[n++] = q;
        in[n++] = sc;
        in[n++] = zp;
    }
    in[n++] = ys;
    in[n++] = yz;
    if (kind == 6) /* the float op's constant operands (Clip's bounds), for its table */
        for (int i = 1; i < ust->n_in; i++) in[n++] = ust->in[i];
    mts_attr a = {0};
    a.name = "mts_qop";
    a.type = MTS_ATTR_INT;
    a.i = kind;
    static const char *const names[] = {"", "MtsQLinearUnary", "MtsQLinearUnary", "MtsQLinearAdd",
                                        "MtsQLinearConcat", "MtsQLinearUpsample", "MtsQLinearUnary"};
    static const mts_op *const ops[] = {NULL, &mts_quant_fast_qunary, &mts_quant_fast_qunary, &mts_quant_fast_qadd,
                                        &mts_quant_fast_qconcat, &mts_quant_fast_qupsample, &mts_quant_fast_qunary};
    mts_node *nd = mts__node_with_attr(p, ust, names[kind], a);
    if (nd && kind == 6) { /* the float op the table replays */
        mts__step tmp = *ust;
        tmp.nd = nd;
        mts_attr f = {0};
        f.name = "mts_float_op";
        f.type = MTS_ATTR_STRING;
        f.s = ust->nd->op_type;
        nd = mts__node_with_attr(p, &tmp, NULL, f);
    }
    if (nd && kind == 5) { /* the integer factors, for the kernel */
        const mts_tensor *xv = &p->vals[ust->in[0]], *yv = &p->vals[y];
        mts__step tmp = *ust;
        tmp.nd = nd;
        a.name = "mts_up_h";
        a.i = yv->dims[2] / xv->dims[2];
        if ((nd = mts__node_with_attr(p, &tmp, NULL, a))) {
            tmp.nd = nd;
            a.name = "mts_up_w";
            a.i = yv->dims[3] / xv->dims[3];
            nd = mts__node_with_attr(p, &tmp, NULL, a);
        }
    }
    if (!nd) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    const mts_op *op = ops[kind];
    const mts_tensor *kin[8];
    for (int i = 0; i < n; i++) kin[i] = in[i] >= 0 ? &p->vals[in[i]] : NULL;
    mts_tensor kout = {0};
    mts_err e = {0};
    mts_kctx k = {nd, kin, n, &kout, 1, &e, 1, NULL};
    const mts_tensor *qy = &p->vals[qst->out[0]];
    if (op->infer(&k) || kout.dtype != qy->dtype || !mts_shape_equal(&kout, qy)) return MTS_OK;
    ust->nd = nd;
    ust->n_in = n;
    memcpy(ust->in, in, sizeof(int) * (size_t)n);
    ust->out[0] = qst->out[0];
    ust->op = op;
    o->removed[qs] = 1;
    p->state[y] = MTS__V_UNUSED;
    mts__count_uses(o);
    drop_dead_dq(o);
    return MTS_OK;
}

static int quant_claim(mts__opt *o, int self, void **mstate, mts_err *err)
{
    (void)self, (void)mstate;
    mts__plan *p = o->p;
    int rc;
    for (int s = 0; s < p->n_steps; s++) {
        mts__step *st = &p->steps[s];
        if (o->removed[s] || st->kind != MTS__S_KERNEL || st->dynamic || st->nhwc) continue;
        if ((is_op(st, "Conv") || is_op(st, "MatMul")) && (rc = fuse_qdq(o, s, err))) return rc;
    }
    for (int s = 0; s < p->n_steps; s++)
        if (plain_step(o, s, "QuantizeLinear") && (rc = fuse_qdq_eltwise(o, s, err))) return rc;
    drop_dead_dq(o);
    return MTS_OK;
}

static int quant_substitute(mts__opt *o, int self, mts__step *st, mts_err *err)
{
    (void)o, (void)self, (void)err;
    if (st->kind == MTS__S_KERNEL && st->nhwc) { /* in a channels-last group between int8 convolutions */
        if (is_op(st, "MtsQLinearConcat")) st->op = &mts_quant_fast_qconcat_nhwc;
        else if (is_op(st, "MtsQLinearUpsample")) st->op = &mts_quant_fast_qupsample_nhwc;
        return MTS_OK;
    }
    if (st->kind != MTS__S_KERNEL || st->nhwc) return MTS_OK;
    if (is_op(st, "MatMulInteger")) st->op = &mts_quant_fast_matmulinteger;
    else if (is_op(st, "QLinearMatMul")) st->op = &mts_quant_fast_qlinearmatmul;
    else if (is_op(st, "ConvInteger")) st->op = &mts_quant_fast_convinteger;
    else if (is_op(st, "QLinearConv")) st->op = &mts_quant_fast_qlinearconv;
    return MTS_OK;
}

const mts_backend mts_backend_quant = {
    .name = "quant",
    .enabled = quant_enabled,
    .claim = quant_claim,
    .substitute = quant_substitute,
};
