/*
 * Padding-free execution of sequence models: which steps of a plan may skip padded positions.
 *
 * A batch of texts runs as [B, S] token inputs padded to a common length; the caller knows
 * which positions are padding (an attention mask) and ignores the outputs there (the embedding
 * path pools over the valid tokens only). In an encoder almost all the work is in products
 * that treat each of the B * S token rows on its own (the projections and the feed-forward
 * layers), so a run that computes only the valid rows does the work of the texts' real lengths,
 * not of the padded batch.
 *
 * mts__plan_padfree decides at plan time whether that is safe for a plan and marks the steps
 * that may skip (mts__step.rows):
 *   - the token shape [B, S]: every rank-2 integer graph input has the same dims, S >= 2;
 *   - skipping steps: MatMul/Gemm backend steps from a [B, S, K] source to a [B, S, N]
 *     destination, and fused attention steps over B entries of S queries and S keys;
 *   - every value a skipping step writes, and everything computed from it, is "tainted" (its
 *     padded rows are zeros or garbage). A tainted value must have [B, S] as its leading
 *     dimensions, and every step reading one must be row-local (an output row is computed from
 *     the same row of its inputs): the skipping steps, elementwise kernels, normalizations over
 *     the trailing axes, a Reshape that keeps [B, S]; a fused attention may read tainted
 *     queries, keys and values (it skips padded keys itself) but not a tainted mask.
 * A Gather of position 0 along the sequence axis (the first token, which every text has: a BERT
 * pooler) reads a tainted value and gives an exact one. Anything else reading a tainted value (a
 * reduction over the sequence, a transpose, a pooling inside the graph, control flow) makes the
 * plan ineligible and every run computes whole.
 * Graph outputs may be tainted: that is the caller's side of the contract.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"

static bool lead_bs(const mts__plan *p, int v, int min_rank)
{
    if (v < 0 || (p->state[v] != MTS__V_STATIC && p->state[v] != MTS__V_INPUT)) return false;
    const mts_tensor *t = &p->vals[v];
    return t->rank >= min_rank && t->dims[0] == p->tok_B && t->dims[1] == p->tok_S;
}

/* A rank-3 [B, S, features] value: the source and destination of a skipping MatMul. */
static bool tokens3(const mts__plan *p, int v)
{
    return lead_bs(p, v, 3) && p->vals[v].rank == 3;
}

static bool is_op(const char *op, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(op, names[i])) return true;
    return false;
}

/* Kernel steps whose output row (b, s) reads only row (b, s) of inputs with the output's rank
 * and leading [B, S] (and anything of other inputs: broadcast constants, position tables). */
static const char *const g_row_local[] = {"Add", "Sub", "Mul", "Div", "Relu", "Gelu", "Erf", "Tanh", "Sigmoid",
                                          "Sqrt", "Pow", "Cast", "Identity", "Neg", "Abs", "Clip", "Where",
                                          "MtsEltwiseChain", NULL};

static bool row_local(const mts__plan *p, const mts__step *st, const uint8_t *taint)
{
    const char *op = st->nd->op_type;
    int y = st->n_out == 1 ? st->out[0] : -1;
    if (!lead_bs(p, y, 2)) return false;
    int rank = p->vals[y].rank;
    bool reshape = !strcmp(op, "Reshape");
    for (int j = 0; j < st->n_in; j++) {
        int v = st->in[j];
        if (v < 0 || !taint[v]) continue;
        if (!lead_bs(p, v, 2) || (reshape && j != 0) || (!reshape && p->vals[v].rank != rank)) return false;
    }
    if (is_op(op, g_row_local)) return true;
    if (reshape) return true;
    if (!strcmp(op, "LayerNormalization") || !strcmp(op, "MtsLayerNorm")) {
        int64_t ax = mts_attr_int(st->nd, "axis", -1);
        if (ax < 0) ax += rank;
        for (int j = 1; j < st->n_in; j++)
            if (st->in[j] >= 0 && taint[st->in[j]]) return false; /* scale and bias: per feature */
        return ax >= 2;
    }
    return false;
}

static bool matmul_skipper(const mts_model *m, const mts__plan *p, const mts__step *st)
{
    const char *op = m->nodes[st->node].op_type;
    return st->kind == MTS__S_BACKEND && (!strcmp(op, "MatMul") || !strcmp(op, "Gemm")) && st->n_out == 1 &&
           st->n_in >= 1 && tokens3(p, st->in[0]) && tokens3(p, st->out[0]);
}

static bool attention_skipper(const mts__plan *p, const mts__step *st)
{
    int n = 0;
    const int64_t *d = mts_attr_ints(st->nd, "dims", &n);
    return st->kind == MTS__S_KERNEL && !strcmp(st->nd->op_type, "MtsAttention") && d && n == 6 &&
           d[0] == p->tok_B && d[2] == p->tok_S && d[3] == p->tok_S && st->n_out == 1 && lead_bs(p, st->out[0], 3);
}

/* A Gather of position 0 along the sequence axis (a BERT pooler's first token, the exports'
 * Gather(hidden, 0, axis=1)): it reads only rows every text has, so its output is exact. */
static bool first_token(const mts__plan *p, const mts__step *st, const uint8_t *taint)
{
    if (st->kind != MTS__S_KERNEL || strcmp(st->nd->op_type, "Gather") || st->n_in != 2 || st->n_out != 1) return false;
    int x = st->in[0], ix = st->in[1];
    if (x < 0 || ix < 0 || taint[ix] || !lead_bs(p, x, 2) || mts_attr_int(st->nd, "axis", 0) != 1) return false;
    bool folded = st->cin && st->cin[1];
    const mts_tensor *t = folded ? st->cin[1] : &p->vals[ix];
    if (!folded && p->state[ix] != MTS__V_CONST) return false;
    if (!t->data || (t->dtype != MTS_DTYPE_INT64 && t->dtype != MTS_DTYPE_INT32) || mts_tensor_numel(t) != 1)
        return false;
    int64_t v = t->dtype == MTS_DTYPE_INT64 ? ((const int64_t *)t->data)[0] : ((const int32_t *)t->data)[0];
    return v == 0 || v == -p->tok_S;
}

void mts__plan_padfree(const mts_model *m, mts__plan *p)
{
    p->rows_ok = false;
    p->tok_B = p->tok_S = 0;
    for (int i = 0; i < p->n_sig; i++) {
        const mts_tensor *t = &p->sig[i];
        bool integer = t->dtype == MTS_DTYPE_INT64 || t->dtype == MTS_DTYPE_INT32;
        if (!integer || t->rank != 2) continue;
        if (p->tok_S && (t->dims[0] != p->tok_B || t->dims[1] != p->tok_S)) return;
        p->tok_B = t->dims[0], p->tok_S = t->dims[1];
    }
    if (p->tok_S < 2 || p->tok_B < 1) return;
    uint8_t *taint = calloc((size_t)m->n_values + 1, 1);
    if (!taint) return;
    bool ok = true;
    int marked = 0;
    for (int s = 0; s < p->n_steps && ok; s++) {
        mts__step *st = &p->steps[s];
        bool reads = false;
        for (int j = 0; j < st->n_in; j++) reads |= st->in[j] >= 0 && taint[st->in[j]];
        if (matmul_skipper(m, p, st)) {
            for (int j = 1; j < st->n_in; j++) /* residuals: added row by row */
                if (st->in[j] >= 0 && taint[st->in[j]] && !tokens3(p, st->in[j]))
                    ok = false;
            st->rows = 1;
        } else if (attention_skipper(p, st)) {
            if (st->n_in > 3 && st->in[3] >= 0 && taint[st->in[3]]) ok = false;
            st->rows = 1;
        } else if (reads && first_token(p, st, taint)) {
            continue; /* its output is the first position's rows, always valid: not tainted */
        } else if (reads) {
            ok = st->kind == MTS__S_KERNEL && row_local(p, st, taint);
        } else {
            continue;
        }
        for (int j = 0; j < st->n_out; j++)
            if (st->out[j] >= 0) taint[st->out[j]] = 1;
        marked += st->rows;
    }
    free(taint);
    if (!ok || !marked) {
        for (int s = 0; s < p->n_steps; s++) p->steps[s].rows = 0;
        return;
    }
    p->rows_ok = true;
}
