/*
 * Reference kernels for the loss functions NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss
 * (opsets 12 and 13).
 *
 * Both take an input of shape [N, C, d1, ..., dk] (log-probabilities for NLL, raw scores for
 * SCE), an int32/int64 target of shape [N, d1, ..., dk] holding class indices in [0, C), and an
 * optional per-class weight [C]. The loss of one position is -weight[t] * logp[n, t, d]; a
 * position whose target equals the ignore_index attribute contributes 0 and has weight 0. With
 * reduction "none" the output has the target's shape; "sum" gives the scalar sum; "mean" gives
 * the sum divided by the sum of the weights of the positions not ignored (the count of them when
 * there is no weight input). SCE first takes log_softmax of the scores over axis 1 and can emit
 * it as its optional second output. Targets outside [0, C) other than ignore_index are rejected
 * with MTS_EINVAL before anything is read through them. Inputs are float or double and the
 * arithmetic is carried out in double; the work is split over positions with mts_parallel.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernel.h"
#include "engine/tensor.h"

enum { RED_NONE = 0, RED_SUM, RED_MEAN };

/* Positions per thread below which a loss runs on one thread. */
#define LOSS_GRAIN 4096

typedef struct loss_cfg {
    bool sce;
    int red;
    bool has_ii;
    int64_t ii;
    const mts_tensor *x, *t, *w;
    int64_t N, C, D; /* D: product of the trailing dims d1..dk (1 when k = 0) */
} loss_cfg;

static bool is_float(mts_dtype dt) { return dt == MTS_DTYPE_FLOAT || dt == MTS_DTYPE_DOUBLE; }

static inline double ldx(const void *p, mts_dtype dt, int64_t i)
{
    return dt == MTS_DTYPE_DOUBLE ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static inline void stx(void *p, mts_dtype dt, int64_t i, double v)
{
    if (dt == MTS_DTYPE_DOUBLE) ((double *)p)[i] = v;
    else ((float *)p)[i] = (float)v;
}

static inline int64_t ldt(const mts_tensor *t, int64_t i)
{
    return t->dtype == MTS_DTYPE_INT64 ? ((const int64_t *)t->data)[i] : (int64_t)((const int32_t *)t->data)[i];
}

static bool out_wanted(const mts_kctx *k, int j)
{
    if (j >= k->n_out) return false;
    if (k->node && j < k->node->n_out && k->node->out && k->node->out[j] < 0) return false;
    return true;
}

/* Validates inputs, attributes and shapes into *c. */
static int loss_prepare(mts_kctx *k, bool sce, loss_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->sce = sce;
    if (k->n_in < 2 || k->n_in > 3)
        return mts_err_set(k->err, MTS_EINVAL, "expected 2 or 3 inputs, got %d", k->n_in);
    if (k->n_out < 1 || k->n_out > (sce ? 2 : 1))
        return mts_err_set(k->err, MTS_EINVAL, "expected 1%s output(s), got %d", sce ? " or 2" : "", k->n_out);
    c->x = mts_kin(k, 0);
    c->t = mts_kin(k, 1);
    c->w = mts_kin(k, 2);
    if (!c->x || !c->t) return mts_err_set(k->err, MTS_EINVAL, "inputs 0 and 1 are required");
    if (!is_float(c->x->dtype))
        return mts_err_set(k->err, mts_dtype_supported(c->x->dtype) && mts_dtype_core(c->x->dtype) ? MTS_EINVAL
                                                                                                   : MTS_EUNSUPPORTED,
                           "input 0 has dtype %s; expected float or double", mts_dtype_name(c->x->dtype));
    if (c->t->dtype != MTS_DTYPE_INT32 && c->t->dtype != MTS_DTYPE_INT64)
        return mts_err_set(k->err, mts_dtype_core(c->t->dtype) ? MTS_EINVAL : MTS_EUNSUPPORTED,
                           "input 1 (target) has dtype %s; expected int32 or int64", mts_dtype_name(c->t->dtype));
    if (c->w && c->w->dtype != c->x->dtype)
        return mts_err_set(k->err, MTS_EINVAL, "input 2 (weight) has dtype %s; expected %s like input 0",
                           mts_dtype_name(c->w->dtype), mts_dtype_name(c->x->dtype));

    const char *red = mts_attr_string(k->node, "reduction", "mean");
    if (!strcmp(red, "none")) c->red = RED_NONE;
    else if (!strcmp(red, "sum")) c->red = RED_SUM;
    else if (!strcmp(red, "mean")) c->red = RED_MEAN;
    else return mts_err_set(k->err, MTS_EINVAL, "reduction '%s' is not one of none, sum, mean", red);
    c->has_ii = mts_node_attr(k->node, "ignore_index") != NULL;
    c->ii = mts_attr_int(k->node, "ignore_index", 0);

    const mts_tensor *x = c->x, *t = c->t;
    if (x->rank < 2) return mts_err_set(k->err, MTS_ESHAPE, "input 0 must have rank >= 2 ([N, C, ...]), got %d", x->rank);
    if (t->rank != x->rank - 1)
        return mts_err_set(k->err, MTS_ESHAPE, "target must have rank %d (input rank - 1), got %d", x->rank - 1,
                           t->rank);
    if (t->dims[0] != x->dims[0])
        return mts_err_set(k->err, MTS_ESHAPE, "target dim 0 is %lld, input's N is %lld", (long long)t->dims[0],
                           (long long)x->dims[0]);
    for (int i = 1; i < t->rank; i++)
        if (t->dims[i] != x->dims[i + 1])
            return mts_err_set(k->err, MTS_ESHAPE, "target dim %d is %lld, input dim %d is %lld", i,
                               (long long)t->dims[i], i + 1, (long long)x->dims[i + 1]);
    if (mts_tensor_numel(x) < 0 || mts_tensor_numel(t) < 0)
        return mts_err_set(k->err, MTS_ESHAPE, "input shape is malformed");
    c->N = x->dims[0];
    c->C = x->dims[1];
    c->D = 1;
    for (int i = 2; i < x->rank; i++) c->D *= x->dims[i];
    if (c->w && (c->w->rank != 1 || c->w->dims[0] != c->C))
        return mts_err_set(k->err, MTS_ESHAPE, "weight must have shape [C] = [%lld]", (long long)c->C);
    return MTS_OK;
}

static int loss_infer_common(mts_kctx *k, bool sce)
{
    loss_cfg c;
    int rc = loss_prepare(k, sce, &c);
    if (rc) return rc;
    mts_tensor *o = &k->out[0];
    o->dtype = c.x->dtype;
    if (c.red == RED_NONE) {
        o->rank = c.t->rank;
        for (int i = 0; i < c.t->rank; i++) o->dims[i] = c.t->dims[i];
    } else {
        o->rank = 0;
    }
    if (sce && k->n_out > 1) {
        mts_tensor *lp = &k->out[1];
        lp->dtype = c.x->dtype;
        lp->rank = c.x->rank;
        for (int i = 0; i < c.x->rank; i++) lp->dims[i] = c.x->dims[i];
    }
    return MTS_OK;
}

static int nll_infer(mts_kctx *k) { return loss_infer_common(k, false); }
static int sce_infer(mts_kctx *k) { return loss_infer_common(k, true); }

typedef struct loss_job {
    const loss_cfg *c;
    void *y;       /* per-position losses (reduction none), else NULL */
    void *logp;    /* SCE log_prob output, or NULL */
    double *part;  /* [nthr][2]: loss sum, weight sum (reductions) */
} loss_job;

static void loss_part(void *ctx, int ithr, int nthr)
{
    const loss_job *j = ctx;
    const loss_cfg *c = j->c;
    const mts_dtype dt = c->x->dtype;
    const void *x = c->x->data;
    const int64_t C = c->C, D = c->D, P = c->N * D;
    int64_t q = P / nthr, r = P % nthr;
    int64_t lo = ithr * q + (ithr < r ? ithr : r), hi = lo + q + (ithr < r ? 1 : 0);
    double lsum = 0, wsum = 0;
    for (int64_t p = lo; p < hi; p++) {
        int64_t n = p / D, d = p % D;
        int64_t base = n * C * D + d; /* element (n, 0, d) */
        int64_t tv = ldt(c->t, p);
        double lse = 0;
        if (c->sce) { /* log_softmax over the C entries at stride D */
            double mx = -INFINITY;
            for (int64_t ci = 0; ci < C; ci++) {
                double v = ldx(x, dt, base + ci * D);
                if (v > mx) mx = v;
            }
            double s = 0;
            for (int64_t ci = 0; ci < C; ci++) s += exp(ldx(x, dt, base + ci * D) - mx);
            lse = mx + log(s);
            if (j->logp)
                for (int64_t ci = 0; ci < C; ci++)
                    stx(j->logp, dt, base + ci * D, ldx(x, dt, base + ci * D) - lse);
        }
        double loss = 0, w = 0;
        if (!(c->has_ii && tv == c->ii)) {
            w = c->w ? ldx(c->w->data, dt, tv) : 1.0;
            double lp = ldx(x, dt, base + tv * D) - lse;
            if (j->logp) lp = ldx(j->logp, dt, base + tv * D); /* the value stored, as rounded */
            loss = -w * lp;
        }
        if (j->y) stx(j->y, dt, p, loss);
        lsum += loss;
        wsum += w;
    }
    if (j->part) {
        j->part[2 * ithr] = lsum;
        j->part[2 * ithr + 1] = wsum;
    }
}

static int loss_run_common(mts_kctx *k, bool sce)
{
    loss_cfg c;
    int rc = loss_prepare(k, sce, &c);
    if (rc) return rc;
    if (!c.x->data || !c.t->data || (c.w && !c.w->data))
        return mts_err_set(k->err, MTS_EINVAL, "input data is missing");
    const int64_t P = c.N * c.D;
    /* Every target must name a class, or be the ignore_index. */
    for (int64_t p = 0; p < P; p++) {
        int64_t tv = ldt(c.t, p);
        if (c.has_ii && tv == c.ii) continue;
        if (tv < 0 || tv >= c.C)
            return mts_err_set(k->err, MTS_EINVAL, "target value %lld at position %lld is outside [0, %lld)%s",
                               (long long)tv, (long long)p, (long long)c.C,
                               c.has_ii ? " and is not the ignore_index" : "");
    }
    int nthr = 1;
    if (P > 0) {
        int64_t want = P * (c.C > 0 ? c.C : 1) / LOSS_GRAIN;
        if (want > P) want = P;
        nthr = want < 1 ? 1 : want < k->threads ? (int)want : k->threads;
    }
    double part_small[2 * 16];
    double *part = NULL;
    if (c.red != RED_NONE) {
        part = nthr <= 16 ? part_small : malloc(sizeof(double) * 2 * (size_t)nthr);
        if (!part) return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
        memset(part, 0, sizeof(double) * 2 * (size_t)nthr);
    }
    loss_job j = {.c = &c, .y = c.red == RED_NONE ? k->out[0].data : NULL,
                  .logp = (sce && out_wanted(k, 1)) ? k->out[1].data : NULL, .part = part};
    if (P > 0) mts_parallel(nthr, loss_part, &j);
    if (c.red != RED_NONE) {
        double lsum = 0, wsum = 0;
        for (int i = 0; i < nthr; i++) {
            lsum += part[2 * i];
            wsum += part[2 * i + 1];
        }
        if (part != part_small) free(part);
        stx(k->out[0].data, c.x->dtype, 0, c.red == RED_SUM ? lsum : lsum / wsum);
    }
    return MTS_OK;
}

static int nll_run(mts_kctx *k) { return loss_run_common(k, false); }
static int sce_run(mts_kctx *k) { return loss_run_common(k, true); }

const mts_op mts_ref_ops_loss[] = {
    {"NegativeLogLikelihoodLoss", nll_infer, nll_run},
    {"SoftmaxCrossEntropyLoss", sce_infer, sce_run},
    {NULL, NULL, NULL},
};
