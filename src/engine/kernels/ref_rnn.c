/*
 * Reference kernels for the recurrent layers: LSTM, GRU and RNN (opsets 7 and 14). They follow
 * the ONNX operator definitions: directions forward, reverse and bidirectional; the activation
 * functions of the spec (Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh,
 * HardSigmoid, Elu, Softsign, Softplus) with activation_alpha / activation_beta consumed in
 * order by the functions that take them (the spec's defaults where absent); clip on every
 * gate's input; per-batch sequence_lens (outputs past a sequence's end are zero, Y_h / Y_c hold
 * the state at its last valid step, zeros for an empty sequence as in ONNX Runtime; the reverse
 * direction starts at each sequence's own last step); initial_h, initial_c, peepholes and
 * input_forget (LSTM); linear_before_reset (GRU); layout 0 (time-major) and 1 (batch-major);
 * every input past the first three and every output optional.
 *
 * Computation: the input projection of all time steps is one GEMM per block of time steps (all
 * directions at once when the sequence fits in one block: X x W^T for the stacked weights),
 * into a scratch buffer bounded at RNN_XW_FLOATS; a block of one to three input rows (a
 * streaming frame) uses matrix-vector products on W as stored instead, which saves the GEMM's
 * packing of W. The recurrence then runs per unit of (direction, slice of the batch), units
 * split over the context's threads with one parallel region per block: each step multiplies
 * the unit's hidden states by R^T (matrix-vector products on R as stored, 16 rows at a time,
 * for small batches; otherwise the engine's GEMM on a copy of R^T made once per run, whose
 * contiguous rows the GEMM packs fast), adds the input projection and the biases,
 * applies the gate activations in place in the unit's gate row and updates the state. Sigmoid
 * and Tanh are vectorized (polynomial exp, about 2e-7 relative).
 */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/kernels/gemm.h"
#include "engine/kernels/kernel.h"
#include "engine/tensor.h"
#include "engine/kernels/vec16.h"

/* Floats of input projection computed per block of time steps (16 MB). */
#define RNN_XW_FLOATS ((int64_t)4 << 20)
/* Scratch a node may use at most. */
#define RNN_MAX_SCRATCH ((int64_t)1 << 30)
/* Batch slices of at least this many rows multiply by R^T in the GEMM; smaller ones use
 * matrix-vector products on R as stored (the GEMM would pack R at every step). */
#define RNN_GEMM_MIN_ROWS 4
/* Recurrence multiply-adds from which the units split over threads. */
#define RNN_PAR_MIN ((int64_t)1 << 18)
/* Batch slices that take the GEMM path have at least this many rows. */
#define RNN_SPLIT_MIN_ROWS 16

enum rnn_kind { RNN_K_RNN, RNN_K_GRU, RNN_K_LSTM };

enum rnn_act_kind {
    ACT_RELU, ACT_TANH, ACT_SIGMOID, ACT_AFFINE, ACT_LEAKYRELU, ACT_THRELU, ACT_SCALEDTANH,
    ACT_HARDSIGMOID, ACT_ELU, ACT_SOFTSIGN, ACT_SOFTPLUS,
};

typedef struct rnn_act {
    int kind;
    float alpha, beta;
} rnn_act;

typedef struct rnn_spec {
    int kind;        /* enum rnn_kind */
    const char *op;  /* op name for messages */
    int G;           /* gates: 1, 3, 4 */
    int nf;          /* activation functions per direction: 1, 2, 3 */
    int nd;          /* directions */
    int reverse;     /* direction "reverse" (nd == 1) */
    int layout;
    int64_t seq, batch, in, H;
    int has_clip;
    float clip;
    int input_forget, lbr;
    rnn_act act[2][3];
    const mts_tensor *X, *W, *R, *B, *SL, *H0, *C0, *P;
} rnn_spec;

/* ------------------------------------------------------------------------------------------ */
/* Attributes and shapes                                                                       */
/* ------------------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    int kind, uses_alpha, uses_beta;
    float alpha, beta; /* defaults */
} act_table[] = {
    {"Relu", ACT_RELU, 0, 0, 0, 0},
    {"Tanh", ACT_TANH, 0, 0, 0, 0},
    {"Sigmoid", ACT_SIGMOID, 0, 0, 0, 0},
    {"Affine", ACT_AFFINE, 1, 1, 1.0f, 0.0f},
    {"LeakyRelu", ACT_LEAKYRELU, 1, 0, 0.01f, 0},
    {"ThresholdedRelu", ACT_THRELU, 1, 0, 1.0f, 0},
    {"ScaledTanh", ACT_SCALEDTANH, 1, 1, 1.0f, 1.0f},
    {"HardSigmoid", ACT_HARDSIGMOID, 1, 1, 0.2f, 0.5f},
    {"Elu", ACT_ELU, 1, 0, 1.0f, 0},
    {"Softsign", ACT_SOFTSIGN, 0, 0, 0, 0},
    {"Softplus", ACT_SOFTPLUS, 0, 0, 0, 0},
};

static int parse_acts(mts_kctx *k, rnn_spec *s)
{
    static const int dflt[3][3] = {{ACT_TANH}, {ACT_SIGMOID, ACT_TANH}, {ACT_SIGMOID, ACT_TANH, ACT_TANH}};
    int n = 0, na = 0, nb = 0;
    const char *const *names = mts_attr_strings(k->node, "activations", &n);
    const float *alphas = mts_attr_floats(k->node, "activation_alpha", &na);
    const float *betas = mts_attr_floats(k->node, "activation_beta", &nb);
    const mts_attr *a = mts_node_attr(k->node, "activations");
    if (a && a->type != MTS_ATTR_STRINGS)
        return mts_err_set(k->err, MTS_EINVAL, "attribute activations must be a list of strings");
    if (!names || n == 0) {
        for (int d = 0; d < 2; d++)
            for (int f = 0; f < s->nf; f++) s->act[d][f] = (rnn_act){dflt[s->nf - 1][f], 0, 0};
        if (na || nb)
            return mts_err_set(k->err, MTS_EINVAL, "activation_alpha/activation_beta given without activations");
        return MTS_OK;
    }
    /* One set per direction; a bidirectional node may give one set for both. */
    if (n != s->nf * s->nd && n != s->nf)
        return mts_err_set(k->err, MTS_EINVAL, "%s needs %d activation function(s) per direction (%d in all), got %d",
                           s->op, s->nf, s->nf * s->nd, n);
    int ia = 0, ib = 0;
    for (int i = 0; i < n; i++) {
        int t = -1;
        for (size_t j = 0; j < sizeof act_table / sizeof act_table[0]; j++)
            if (strcasecmp(names[i], act_table[j].name) == 0) t = (int)j;
        if (t < 0)
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "activation function '%.64s' is not supported by %s", names[i],
                               s->op);
        rnn_act r = {act_table[t].kind, act_table[t].alpha, act_table[t].beta};
        if (act_table[t].uses_alpha && ia < na) r.alpha = alphas[ia++];
        if (act_table[t].uses_beta && ib < nb) r.beta = betas[ib++];
        s->act[i / s->nf][i % s->nf] = r;
    }
    if (n == s->nf)
        for (int f = 0; f < s->nf; f++) s->act[1][f] = s->act[0][f];
    return MTS_OK;
}

static int chk_float(mts_kctx *k, const mts_tensor *t, const char *what)
{
    if (t && t->dtype != MTS_DTYPE_FLOAT)
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "%s has dtype %s; only float is supported", what,
                           mts_dtype_name(t->dtype));
    return MTS_OK;
}

static int chk_shape(mts_kctx *k, const mts_tensor *t, const char *what, int rank, int64_t d0, int64_t d1, int64_t d2)
{
    if (!t) return MTS_OK;
    int64_t want[3] = {d0, d1, d2};
    bool ok = t->rank == rank;
    for (int i = 0; ok && i < rank; i++) ok = t->dims[i] == want[i];
    if (!ok) {
        char sh[160];
        if (rank == 1)
            return mts_err_set(k->err, MTS_ESHAPE, "%s has shape %s; expected [%lld]", what, mts_shape_str(t, sh, sizeof sh),
                               (long long)d0);
        if (rank == 2)
            return mts_err_set(k->err, MTS_ESHAPE, "%s has shape %s; expected [%lld,%lld]", what,
                               mts_shape_str(t, sh, sizeof sh), (long long)d0, (long long)d1);
        return mts_err_set(k->err, MTS_ESHAPE, "%s has shape %s; expected [%lld,%lld,%lld]", what,
                           mts_shape_str(t, sh, sizeof sh), (long long)d0, (long long)d1, (long long)d2);
    }
    return MTS_OK;
}

static int rnn_parse(mts_kctx *k, int kind, rnn_spec *s)
{
    static const char *const names[] = {"RNN", "GRU", "LSTM"};
    int rc;
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->op = names[kind];
    s->G = kind == RNN_K_LSTM ? 4 : kind == RNN_K_GRU ? 3 : 1;
    s->nf = kind == RNN_K_LSTM ? 3 : kind == RNN_K_GRU ? 2 : 1;
    int max_in = kind == RNN_K_LSTM ? 8 : 6, max_out = kind == RNN_K_LSTM ? 3 : 2;
    if (k->n_in > max_in)
        return mts_err_set(k->err, MTS_EINVAL, "%s takes at most %d inputs, got %d", s->op, max_in, k->n_in);
    if (k->n_out > max_out)
        return mts_err_set(k->err, MTS_EINVAL, "%s has at most %d outputs, got %d", s->op, max_out, k->n_out);
    s->X = mts_kin(k, 0), s->W = mts_kin(k, 1), s->R = mts_kin(k, 2), s->B = mts_kin(k, 3);
    s->SL = mts_kin(k, 4), s->H0 = mts_kin(k, 5);
    if (kind == RNN_K_LSTM) s->C0 = mts_kin(k, 6), s->P = mts_kin(k, 7);
    if (!s->X || !s->W || !s->R)
        return mts_err_set(k->err, MTS_EINVAL, "%s needs inputs X, W and R", s->op);
    if ((rc = chk_float(k, s->X, "X")) || (rc = chk_float(k, s->W, "W")) || (rc = chk_float(k, s->R, "R")) ||
        (rc = chk_float(k, s->B, "B")) || (rc = chk_float(k, s->H0, "initial_h")) ||
        (rc = chk_float(k, s->C0, "initial_c")) || (rc = chk_float(k, s->P, "P")))
        return rc;
    if (s->SL && (s->SL->dtype == MTS_DTYPE_FLOAT || !mts_dtype_supported(s->SL->dtype) || s->SL->dtype == MTS_DTYPE_BOOL))
        return mts_err_set(k->err, MTS_EINVAL, "sequence_lens must be an integer tensor, got %s",
                           mts_dtype_name(s->SL->dtype));

    const char *dir = mts_attr_string(k->node, "direction", "forward");
    if (strcmp(dir, "forward") == 0) s->nd = 1;
    else if (strcmp(dir, "reverse") == 0) s->nd = 1, s->reverse = 1;
    else if (strcmp(dir, "bidirectional") == 0) s->nd = 2;
    else
        return mts_err_set(k->err, MTS_EINVAL, "direction '%.64s' is not one of forward, reverse, bidirectional", dir);
    int64_t layout = mts_attr_int(k->node, "layout", 0);
    if (layout != 0 && layout != 1) return mts_err_set(k->err, MTS_EINVAL, "layout must be 0 or 1, got %lld", (long long)layout);
    s->layout = (int)layout;
    s->input_forget = mts_attr_int(k->node, "input_forget", 0) != 0;
    s->lbr = mts_attr_int(k->node, "linear_before_reset", 0) != 0;
    const mts_attr *ca = mts_node_attr(k->node, "clip");
    if (ca) {
        s->clip = ca->f;
        if (!(s->clip > 0.0f)) return mts_err_set(k->err, MTS_EINVAL, "clip must be positive, got %g", (double)s->clip);
        s->has_clip = !isinf(s->clip);
    }

    char sh[160];
    if (s->X->rank != 3)
        return mts_err_set(k->err, MTS_ESHAPE, "X must be 3-D, got %s", mts_shape_str(s->X, sh, sizeof sh));
    if (s->W->rank != 3 || s->R->rank != 3)
        return mts_err_set(k->err, MTS_ESHAPE, "W and R must be 3-D, got W %s and R %s", mts_shape_str(s->W, sh, sizeof sh),
                           mts_shape_str(s->R, sh + 80, 80));
    s->seq = s->layout ? s->X->dims[1] : s->X->dims[0];
    s->batch = s->layout ? s->X->dims[0] : s->X->dims[1];
    s->in = s->X->dims[2];
    s->H = s->R->dims[2];
    const mts_attr *hs = mts_node_attr(k->node, "hidden_size");
    if (hs && hs->i != s->H)
        return mts_err_set(k->err, MTS_ESHAPE, "hidden_size %lld does not match R %s (hidden size %lld)", (long long)hs->i,
                           mts_shape_str(s->R, sh, sizeof sh), (long long)s->H);
    if (s->H < 1 || s->H > (INT64_C(1) << 24))
        return mts_err_set(k->err, MTS_EINVAL, "hidden size %lld is out of range [1, 2^24]", (long long)s->H);
    int64_t GH = s->G * s->H;
    if ((rc = chk_shape(k, s->W, "W", 3, s->nd, GH, s->in)) || (rc = chk_shape(k, s->R, "R", 3, s->nd, GH, s->H)) ||
        (rc = chk_shape(k, s->B, "B", 2, s->nd, 2 * GH, 0)) || (rc = chk_shape(k, s->SL, "sequence_lens", 1, s->batch, 0, 0)) ||
        (rc = chk_shape(k, s->P, "P", 2, s->nd, 3 * s->H, 0)))
        return rc;
    if (s->layout == 0) {
        if ((rc = chk_shape(k, s->H0, "initial_h", 3, s->nd, s->batch, s->H)) ||
            (rc = chk_shape(k, s->C0, "initial_c", 3, s->nd, s->batch, s->H)))
            return rc;
    } else {
        if ((rc = chk_shape(k, s->H0, "initial_h", 3, s->batch, s->nd, s->H)) ||
            (rc = chk_shape(k, s->C0, "initial_c", 3, s->batch, s->nd, s->H)))
            return rc;
    }
    if (s->seq < 0 || s->batch < 0 || s->in < 0)
        return mts_err_set(k->err, MTS_ESHAPE, "X has a negative dimension");
    return parse_acts(k, s);
}

static void set_dims(mts_tensor *o, int rank, const int64_t *d)
{
    o->dtype = MTS_DTYPE_FLOAT;
    o->rank = rank;
    for (int i = 0; i < rank; i++) o->dims[i] = d[i];
}

static int rnn_infer_kind(mts_kctx *k, int kind)
{
    rnn_spec s;
    int rc = rnn_parse(k, kind, &s);
    if (rc) return rc;
    int64_t y0[4] = {s.seq, s.nd, s.batch, s.H}, y1[4] = {s.batch, s.seq, s.nd, s.H};
    int64_t h0[3] = {s.nd, s.batch, s.H}, h1[3] = {s.batch, s.nd, s.H};
    for (int j = 0; j < k->n_out; j++) {
        if (j == 0) set_dims(&k->out[j], 4, s.layout ? y1 : y0);
        else set_dims(&k->out[j], 3, s.layout ? h1 : h0);
        if (mts_tensor_nbytes(&k->out[j]) < 0)
            return mts_err_set(k->err, MTS_EINVAL, "output %d of %s would have too many elements", j, s.op);
    }
    return MTS_OK;
}

static int lstm_infer(mts_kctx *k) { return rnn_infer_kind(k, RNN_K_LSTM); }
static int gru_infer(mts_kctx *k) { return rnn_infer_kind(k, RNN_K_GRU); }
static int rnn_infer(mts_kctx *k) { return rnn_infer_kind(k, RNN_K_RNN); }

/* ------------------------------------------------------------------------------------------ */
/* Vector helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

static inline __attribute__((always_inline)) v16f splat16(float f)
{
    return (v16f){0} + f;
}

static inline __attribute__((always_inline)) float hsum16(v16f v)
{
    typedef int32_t v16m __attribute__((vector_size(64)));
    v = v + __builtin_shuffle(v, (v16m){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    v = v + __builtin_shuffle(v, (v16m){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    v = v + __builtin_shuffle(v, (v16m){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    return v[0] + v[1];
}

/* exp(x): 2^n * p(r), r = x - n ln2, degree-6 polynomial (relative error ~2e-7); the argument
 * is clamped to [-87.3, 88.3] (NaN lanes stay NaN through the polynomial). */
static inline __attribute__((always_inline)) v16f vexp16(v16f x)
{
    for (int l = 0; l < 16; l++) x[l] = x[l] < -87.3f ? -87.3f : x[l] > 88.3f ? 88.3f : x[l];
    const v16f magic = splat16(12582912.0f);
    v16f n = (x * splat16(1.44269504f) + magic) - magic;
    v16f r = x - n * splat16(0.693359375f);
    r = r - n * splat16(-2.12194440e-4f);
    v16f p = splat16(1.0f / 720);
    p = p * r + splat16(1.0f / 120);
    p = p * r + splat16(1.0f / 24);
    p = p * r + splat16(1.0f / 6);
    p = p * r + splat16(0.5f);
    p = p * r + splat16(1.0f);
    p = p * r + splat16(1.0f);
    v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
    return p * (v16f)e;
}

static inline __attribute__((always_inline)) v16f vsigmoid16(v16f x)
{
    return splat16(1.0f) / (splat16(1.0f) + vexp16(-x));
}

/* tanh(x) = 1 - 2 / (exp(2x) + 1): absolute error about 2e-7. */
static inline __attribute__((always_inline)) v16f vtanh16(v16f x)
{
    return splat16(1.0f) - splat16(2.0f) / (vexp16(x + x) + splat16(1.0f));
}

/* In place: x[0..n) = sigmoid (tanh when is_tanh) of x. A partial vector goes through a local
 * copy so every element gets the same approximation. */
MTS_VEC_CLONES static void vec_sig_tanh(float *x, int64_t n, int is_tanh)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) st16(x + i, is_tanh ? vtanh16(ld16(x + i)) : vsigmoid16(ld16(x + i)));
    if (i < n) {
        float buf[16] = {0};
        memcpy(buf, x + i, (size_t)(n - i) * sizeof(float));
        st16(buf, is_tanh ? vtanh16(ld16(buf)) : vsigmoid16(ld16(buf)));
        memcpy(x + i, buf, (size_t)(n - i) * sizeof(float));
    }
}

/* y[j] = sum_p A[j*lda + p] * x[p] for j < N: R (or its row block) times one hidden state. */
MTS_VEC_CLONES static void gemv_rows(const float *A, int64_t lda, const float *x, float *y, int64_t N, int64_t K)
{
    int64_t K16 = K & ~(int64_t)15;
    int64_t j = 0;
    /* 16 rows at a time: 16 accumulators, then a transposing reduction tree that leaves the
     * 16 row sums in one vector in row order */
    for (; j + 16 <= N; j += 16) {
        const float *a = A + j * lda;
        v16f s[16];
        for (int r = 0; r < 16; r++) s[r] = splat16(0);
        for (int64_t p = 0; p < K16; p += 16) {
            v16f xv = ld16(x + p);
            for (int r = 0; r < 16; r++) s[r] += ld16(a + r * lda + p) * xv;
        }
        v16f c[8], e[4], f[2];
        for (int r = 0; r < 8; r++)
            c[r] = __builtin_shuffle(s[2 * r], s[2 * r + 1], (v16i){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}) +
                   __builtin_shuffle(s[2 * r], s[2 * r + 1], (v16i){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
        for (int r = 0; r < 4; r++)
            e[r] = __builtin_shuffle(c[2 * r], c[2 * r + 1], (v16i){0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}) +
                   __builtin_shuffle(c[2 * r], c[2 * r + 1], (v16i){4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
        for (int r = 0; r < 2; r++)
            f[r] = __builtin_shuffle(e[2 * r], e[2 * r + 1], (v16i){0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29}) +
                   __builtin_shuffle(e[2 * r], e[2 * r + 1], (v16i){2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31});
        v16f g = __builtin_shuffle(f[0], f[1], (v16i){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}) +
                 __builtin_shuffle(f[0], f[1], (v16i){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31});
        if (K16 < K)
            for (int r = 0; r < 16; r++)
                for (int64_t p = K16; p < K; p++) g[r] += a[r * lda + p] * x[p];
        st16(y + j, g);
    }
    for (; j + 4 <= N; j += 4) {
        const float *a0 = A + j * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
        v16f s0 = splat16(0), s1 = s0, s2 = s0, s3 = s0;
        for (int64_t p = 0; p < K16; p += 16) {
            v16f xv = ld16(x + p);
            s0 += ld16(a0 + p) * xv;
            s1 += ld16(a1 + p) * xv;
            s2 += ld16(a2 + p) * xv;
            s3 += ld16(a3 + p) * xv;
        }
        float r0 = hsum16(s0), r1 = hsum16(s1), r2 = hsum16(s2), r3 = hsum16(s3);
        for (int64_t p = K16; p < K; p++) {
            r0 += a0[p] * x[p];
            r1 += a1[p] * x[p];
            r2 += a2[p] * x[p];
            r3 += a3[p] * x[p];
        }
        y[j] = r0, y[j + 1] = r1, y[j + 2] = r2, y[j + 3] = r3;
    }
    for (; j < N; j++) {
        const float *a0 = A + j * lda;
        v16f s0 = splat16(0);
        for (int64_t p = 0; p < K16; p += 16) s0 += ld16(a0 + p) * ld16(x + p);
        float r0 = hsum16(s0);
        for (int64_t p = K16; p < K; p++) r0 += a0[p] * x[p];
        y[j] = r0;
    }
}

static inline float softplusf(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* Applies activation a to x[0..n) in place. */
static void act_apply(const rnn_act *a, float *x, int64_t n)
{
    float al = a->alpha, be = a->beta;
    switch (a->kind) {
    case ACT_SIGMOID: vec_sig_tanh(x, n, 0); break;
    case ACT_TANH: vec_sig_tanh(x, n, 1); break;
    case ACT_RELU:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
    case ACT_AFFINE:
        for (int64_t i = 0; i < n; i++) x[i] = al * x[i] + be;
        break;
    case ACT_LEAKYRELU:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] >= 0.0f ? x[i] : al * x[i];
        break;
    case ACT_THRELU:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] > al ? x[i] : 0.0f;
        break;
    case ACT_SCALEDTANH:
        for (int64_t i = 0; i < n; i++) x[i] = al * tanhf(be * x[i]);
        break;
    case ACT_HARDSIGMOID:
        for (int64_t i = 0; i < n; i++) {
            float v = al * x[i] + be;
            x[i] = v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v;
        }
        break;
    case ACT_ELU:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] >= 0.0f ? x[i] : al * expm1f(x[i]);
        break;
    case ACT_SOFTSIGN:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + fabsf(x[i]));
        break;
    case ACT_SOFTPLUS:
        for (int64_t i = 0; i < n; i++) x[i] = softplusf(x[i]);
        break;
    default: break;
    }
}

static inline void clip_row(float *x, int64_t n, float c)
{
    for (int64_t i = 0; i < n; i++) x[i] = x[i] > c ? c : x[i] < -c ? -c : x[i];
}

/* ------------------------------------------------------------------------------------------ */
/* The recurrence                                                                              */
/* ------------------------------------------------------------------------------------------ */

typedef struct rnn_job {
    const rnn_spec *s;
    int64_t GH;          /* gate rows of W and R per direction */
    const float *bias;   /* [nd][GH]: Wb + Rb (GRU with linear_before_reset: Wb only for h) */
    const float *rbh;    /* [nd][H]: GRU with linear_before_reset, Rb of the h gate */
    const int64_t *lens; /* [batch]: valid steps per sequence */
    float *xw;           /* [T][batch][nd][GH]: this block's input projections */
    int64_t t0[2], T;    /* each direction's first step in the block, steps in the block */
    float *Y;            /* NULL when absent */
    int64_t bslice;      /* batch rows per unit */
    int nunits;
    float **uws;         /* per unit: h [nb][H], c [nb][H], g [nb][GH], tmp [nb][H], GEMM workspace */
    const float *rt;     /* NULL, or per direction R^T [H][GH] for the GEMM path */
} rnn_job;

static float *y_at(const rnn_job *J, int64_t t, int d, int64_t b)
{
    const rnn_spec *s = J->s;
    if (s->layout == 0) return J->Y + ((t * s->nd + d) * s->batch + b) * s->H;
    return J->Y + ((b * s->seq + t) * s->nd + d) * s->H;
}

/* g[0..nb) = h[0..nb) x Rblock^T, Rblock rows [N][ldr]. */
static void rec_product(const rnn_spec *s, const float *Rb, const float *RTb, int64_t ldrt, int64_t N, const float *h,
                        float *g, int64_t ldg, int64_t nb, const unsigned char *act, float *ws)
{
    if (nb >= RNN_GEMM_MIN_ROWS) {
        /* B = R^T: the transposed copy when there is one (contiguous rows pack fastest) */
        mts_sgemm gm = {.M = nb, .N = N, .K = s->H, .A = h, .a_rs = s->H, .a_cs = 1, .B = RTb ? RTb : Rb,
                        .b_rs = RTb ? ldrt : 1, .b_cs = RTb ? 1 : s->H, .C = g, .ldc = ldg, .alpha = 1.0f};
        mts_sgemm_serial(&gm, ws);
        return;
    }
    for (int64_t i = 0; i < nb; i++)
        if (act[i]) gemv_rows(Rb, s->H, h + i * s->H, g + i * ldg, N, s->H);
}

static void unit_run(const rnn_job *J, int u)
{
    const rnn_spec *s = J->s;
    int64_t nbs = (s->batch + J->bslice - 1) / J->bslice;
    int d = (int)(u / nbs);
    int64_t b0 = (u % nbs) * J->bslice, nb = s->batch - b0 < J->bslice ? s->batch - b0 : J->bslice;
    int64_t H = s->H, GH = J->GH;
    float *h = J->uws[u], *c = h + nb * H, *g = c + nb * H, *tmp = g + nb * GH, *ws = tmp + nb * H;
    const float *R = (const float *)s->R->data + (int64_t)d * GH * H;
    const float *bias = J->bias + d * GH;
    const float *P = s->P ? (const float *)s->P->data + d * 3 * H : NULL;
    const rnn_act *A = s->act[d];
    int rev = s->nd == 2 ? d == 1 : s->reverse;
    unsigned char act[RNN_GEMM_MIN_ROWS];
    for (int64_t step = 0; step < J->T; step++) {
        int64_t tt = rev ? J->T - 1 - step : step; /* index in the block */
        int64_t t = J->t0[d] + tt;
        int any = 0;
        for (int64_t i = 0; i < nb && i < RNN_GEMM_MIN_ROWS; i++) act[i] = t < J->lens[b0 + i];
        for (int64_t i = 0; i < nb; i++) any |= t < J->lens[b0 + i];
        if (!any) {
            if (J->Y)
                for (int64_t i = 0; i < nb; i++) memset(y_at(J, t, d, b0 + i), 0, (size_t)H * sizeof(float));
            continue;
        }
        /* the recurrent products of every gate (GRU without linear_before_reset: z and r only) */
        int64_t N1 = (s->kind == RNN_K_GRU && !s->lbr) ? 2 * H : GH;
        const float *RT = J->rt ? J->rt + d * H * GH : NULL;
        rec_product(s, R, RT, GH, N1, h, g, GH, nb, act, ws);
        if (s->kind == RNN_K_GRU && !s->lbr) {
            /* z, r first; then (r . h) x Rh^T */
            for (int64_t i = 0; i < nb; i++) {
                if (t >= J->lens[b0 + i]) {
                    memset(tmp + i * H, 0, (size_t)H * sizeof(float)); /* read by the GEMM, result unused */
                    continue;
                }
                const float *xw = J->xw + ((tt * s->batch + b0 + i) * s->nd + d) * GH;
                float *gi = g + i * GH;
                for (int64_t j = 0; j < 2 * H; j++) gi[j] += xw[j] + bias[j];
                if (s->has_clip) clip_row(gi, 2 * H, s->clip);
                act_apply(&A[0], gi, 2 * H);
                float *ti = tmp + i * H;
                const float *hi = h + i * H;
                for (int64_t j = 0; j < H; j++) ti[j] = gi[H + j] * hi[j];
            }
            /* results land in the h slot of each gate row */
            if (nb >= RNN_GEMM_MIN_ROWS) {
                rec_product(s, R + 2 * H * H, RT ? RT + 2 * H : NULL, GH, H, tmp, g + 2 * H, GH, nb, act, ws);
            } else {
                for (int64_t i = 0; i < nb; i++)
                    if (act[i]) gemv_rows(R + 2 * H * H, H, tmp + i * H, g + i * GH + 2 * H, H, H);
            }
        }
        for (int64_t i = 0; i < nb; i++) {
            int64_t b = b0 + i;
            if (t >= J->lens[b]) {
                if (J->Y) memset(y_at(J, t, d, b), 0, (size_t)H * sizeof(float));
                continue;
            }
            const float *xw = J->xw + ((tt * s->batch + b) * s->nd + d) * GH;
            float *gi = g + i * GH, *hi = h + i * H, *ci = c + i * H;
            if (s->kind == RNN_K_RNN) {
                for (int64_t j = 0; j < H; j++) gi[j] += xw[j] + bias[j];
                if (s->has_clip) clip_row(gi, H, s->clip);
                act_apply(&A[0], gi, H);
                memcpy(hi, gi, (size_t)H * sizeof(float));
            } else if (s->kind == RNN_K_GRU) {
                float *z = gi, *r = gi + H, *hh = gi + 2 * H;
                if (s->lbr) {
                    const float *rbh = J->rbh + d * H;
                    for (int64_t j = 0; j < 2 * H; j++) gi[j] += xw[j] + bias[j];
                    if (s->has_clip) clip_row(gi, 2 * H, s->clip);
                    act_apply(&A[0], gi, 2 * H);
                    for (int64_t j = 0; j < H; j++) hh[j] = xw[2 * H + j] + bias[2 * H + j] + r[j] * (hh[j] + rbh[j]);
                } else {
                    for (int64_t j = 0; j < H; j++) hh[j] += xw[2 * H + j] + bias[2 * H + j];
                }
                if (s->has_clip) clip_row(hh, H, s->clip);
                act_apply(&A[1], hh, H);
                for (int64_t j = 0; j < H; j++) hi[j] = (1.0f - z[j]) * hh[j] + z[j] * hi[j];
            } else {
                /* gate order i, o, f, c; peepholes i, o, f */
                float *gI = gi, *gO = gi + H, *gF = gi + 2 * H, *gC = gi + 3 * H;
                for (int64_t j = 0; j < GH; j++) gi[j] += xw[j] + bias[j];
                if (P)
                    for (int64_t j = 0; j < H; j++) gI[j] += P[j] * ci[j];
                if (s->has_clip) clip_row(gI, H, s->clip);
                act_apply(&A[0], gI, H);
                if (s->input_forget) {
                    for (int64_t j = 0; j < H; j++) gF[j] = 1.0f - gI[j];
                } else {
                    if (P)
                        for (int64_t j = 0; j < H; j++) gF[j] += P[2 * H + j] * ci[j];
                    if (s->has_clip) clip_row(gF, H, s->clip);
                    act_apply(&A[0], gF, H);
                }
                if (s->has_clip) clip_row(gC, H, s->clip);
                act_apply(&A[1], gC, H);
                for (int64_t j = 0; j < H; j++) ci[j] = gF[j] * ci[j] + gI[j] * gC[j];
                if (P)
                    for (int64_t j = 0; j < H; j++) gO[j] += P[H + j] * ci[j];
                if (s->has_clip) clip_row(gO, H, s->clip);
                act_apply(&A[0], gO, H);
                memcpy(gC, ci, (size_t)H * sizeof(float));
                act_apply(&A[2], gC, H);
                for (int64_t j = 0; j < H; j++) hi[j] = gO[j] * gC[j];
            }
            if (J->Y) memcpy(y_at(J, t, d, b), hi, (size_t)H * sizeof(float));
        }
    }
}

static void par_units(void *ctx, int ithr, int nthr)
{
    const rnn_job *J = ctx;
    for (int u = ithr; u < J->nunits; u += nthr) unit_run(J, u);
}

/* Multiplies the block's inputs of directions [d0, d0+ndc) by their W into J->xw. */
static int xw_gemm(mts_kctx *k, const rnn_job *J, int d0, int ndc, int64_t t0, int64_t *aoff, int64_t *coff)
{
    const rnn_spec *s = J->s;
    int64_t ldx = s->nd * J->GH;
    if (J->T * s->batch == 0) return MTS_OK;
    if (s->in == 0) {
        for (int64_t r = 0; r < J->T * s->batch; r++)
            memset(J->xw + r * ldx + d0 * J->GH, 0, (size_t)(ndc * J->GH) * sizeof(float));
        return MTS_OK;
    }
    const float *X = s->X->data;
    if (J->T * s->batch < RNN_GEMM_MIN_ROWS) {
        /* a frame or two (streaming at batch 1): products on W as stored, no packing */
        for (int64_t tt = 0; tt < J->T; tt++)
            for (int64_t b = 0; b < s->batch; b++) {
                int64_t t = t0 + tt;
                const float *x = X + (s->layout == 0 ? t * s->batch + b : b * s->seq + t) * s->in;
                gemv_rows((const float *)s->W->data + d0 * J->GH * s->in, s->in, x,
                          J->xw + (tt * s->batch + b) * ldx + d0 * J->GH, ndc * J->GH, s->in);
            }
        return MTS_OK;
    }
    mts_sgemm g = {.N = ndc * J->GH, .K = s->in, .a_rs = s->in, .a_cs = 1,
                   .B = (const float *)s->W->data + d0 * J->GH * s->in, .b_rs = 1, .b_cs = s->in,
                   .C = J->xw + d0 * J->GH, .alpha = 1.0f};
    if (s->layout == 0) {
        g.M = J->T * s->batch;
        g.A = X + t0 * s->batch * s->in;
        g.ldc = ldx;
    } else {
        g.M = J->T;
        g.A = X;
        g.ldc = s->batch * ldx;
        g.nbatch = s->batch;
        for (int64_t b = 0; b < s->batch; b++) {
            aoff[b] = (b * s->seq + t0) * s->in;
            coff[b] = b * ldx;
        }
        g.a_off = aoff;
        g.c_off = coff;
    }
    return mts_sgemm_run(&g, k->threads);
}

/* a*b into *r; false on overflow or a negative factor. */
static bool mul_ok(int64_t a, int64_t b, int64_t *r)
{
    if (a < 0 || b < 0) return false;
    if (a && b > INT64_MAX / a) return false;
    *r = a * b;
    return true;
}

static int rnn_run_kind(mts_kctx *k, int kind)
{
    rnn_spec s;
    int rc = rnn_parse(k, kind, &s);
    if (rc) return rc;
    int64_t H = s.H, GH = s.G * H, nd = s.nd, batch = s.batch, seq = s.seq;
    float *Y = k->n_out > 0 ? k->out[0].data : NULL;
    float *Yh = k->n_out > 1 ? k->out[1].data : NULL;
    float *Yc = k->n_out > 2 ? k->out[2].data : NULL;
    if (batch == 0) return MTS_OK;

    /* Work units: one per direction, the batch split further when it pays. */
    int64_t rec_work = 0, tmp;
    int threads = k->threads > 0 ? k->threads : 1;
    int64_t bslice = batch;
    if (!mul_ok(seq, batch, &rec_work) || !mul_ok(rec_work, GH, &rec_work) || !mul_ok(rec_work, H, &rec_work))
        rec_work = INT64_MAX;
    if (threads > nd && batch > 1 && rec_work / threads >= RNN_PAR_MIN) {
        int64_t per = (threads + nd - 1) / nd;
        bslice = (batch + per - 1) / per;
        /* slices too small for the GEMM to pay for packing R^T at every step stay whole */
        if (bslice >= RNN_GEMM_MIN_ROWS && bslice < RNN_SPLIT_MIN_ROWS) bslice = batch;
    }
    int64_t nbs = (batch + bslice - 1) / bslice;
    int nunits = (int)(nd * nbs);

    /* Time block: the whole sequence when its projections fit in RNN_XW_FLOATS. */
    int64_t row = 0, T = seq;
    if (!mul_ok(batch, nd * GH, &row))
        return mts_err_set(k->err, MTS_ELIMIT, "%s: batch %lld x gates %lld is too large", s.op, (long long)batch,
                           (long long)(nd * GH));
    if (row > 0 && T > RNN_XW_FLOATS / row) T = RNN_XW_FLOATS / row;
    if (T < 1) T = 1;

    /* Scratch: xw, biases, lens, GEMM offsets, per-unit state and workspace. */
    int64_t gemm_ws = bslice >= RNN_GEMM_MIN_ROWS ? (int64_t)mts_sgemm_ws_floats(bslice, GH, H) : 0;
    int64_t unit = 0, total = 0, xwn = 0;
    /* the GEMM path over several steps multiplies by a transposed copy of R, made once: the
     * GEMM packs contiguous rows of B much faster than R's columns (R's size bounds it) */
    int64_t rtn = bslice >= RNN_GEMM_MIN_ROWS && seq > 1 ? nd * GH * H : 0;
    bool ok = mul_ok(bslice, 3 * H + GH, &unit) && (unit += gemm_ws) >= 0 && mul_ok(T, row, &xwn);
    if (ok) ok = mul_ok(unit, nunits, &total);
    if (ok) {
        tmp = total + xwn + nd * GH + nd * H + rtn + 3 * batch + nunits + 64;
        ok = tmp > 0 && tmp <= RNN_MAX_SCRATCH / 4;
        total = tmp;
    }
    if (!ok)
        return mts_err_set(k->err, MTS_ELIMIT, "%s needs more than %lld bytes of scratch for X %lld x %lld, hidden %lld",
                           s.op, (long long)RNN_MAX_SCRATCH, (long long)seq, (long long)batch, (long long)H);
    float *mem = malloc((size_t)total * sizeof(float));
    float **uws = malloc((size_t)nunits * sizeof(float *));
    int64_t *ibuf = malloc((size_t)(3 * batch) * sizeof(int64_t));
    if (!mem || !uws || !ibuf) {
        free(mem), free(uws), free(ibuf);
        return mts_err_set(k->err, MTS_ENOMEM, "%s: out of memory for %lld floats of scratch", s.op, (long long)total);
    }
    float *xw = mem, *bias = xw + xwn, *rbh = bias + nd * GH, *rt = rbh + nd * H, *up = rt + rtn;
    up += (16 - ((up - mem) & 15)) & 15; /* 64-byte aligned units relative to the block */
    for (int u = 0; u < nunits; u++) uws[u] = up + (int64_t)u * unit;
    int64_t *lens = ibuf, *aoff = ibuf + batch, *coff = aoff + batch;

    /* biases */
    const float *Bd = s.B ? s.B->data : NULL;
    for (int64_t d = 0; d < nd; d++) {
        for (int64_t j = 0; j < GH; j++) {
            float wb = Bd ? Bd[d * 2 * GH + j] : 0.0f, rb = Bd ? Bd[d * 2 * GH + GH + j] : 0.0f;
            bool split = kind == RNN_K_GRU && s.lbr && j >= 2 * H;
            bias[d * GH + j] = split ? wb : wb + rb;
            if (split) rbh[d * H + j - 2 * H] = rb;
        }
    }
    /* R^T in 32 x 32 tiles */
    for (int64_t d = 0; rtn && d < nd; d++) {
        const float *Rd = (const float *)s.R->data + d * GH * H;
        float *Td = rt + d * H * GH;
        for (int64_t j0 = 0; j0 < GH; j0 += 32)
            for (int64_t p0 = 0; p0 < H; p0 += 32)
                for (int64_t j = j0; j < j0 + 32 && j < GH; j++)
                    for (int64_t p = p0; p < p0 + 32 && p < H; p++) Td[p * GH + j] = Rd[j * H + p];
    }
    /* sequence lengths */
    rc = MTS_OK;
    for (int64_t b = 0; b < batch; b++) {
        lens[b] = s.SL ? mts_tensor_get_int(s.SL, b) : seq;
        if (lens[b] < 0 || lens[b] > seq) {
            rc = mts_err_set(k->err, MTS_EINVAL, "sequence_lens[%lld] = %lld is outside [0, %lld]", (long long)b,
                             (long long)lens[b], (long long)seq);
            goto out;
        }
    }
    /* initial states */
    const float *h0 = s.H0 ? s.H0->data : NULL, *c0 = s.C0 ? s.C0->data : NULL;
    for (int u = 0; u < nunits; u++) {
        int d = (int)(u / nbs);
        int64_t b0 = (u % nbs) * bslice, nb = batch - b0 < bslice ? batch - b0 : bslice;
        float *h = uws[u], *c = h + nb * H;
        for (int64_t i = 0; i < nb; i++) {
            int64_t b = b0 + i;
            int64_t off = s.layout == 0 ? (d * batch + b) * H : (b * nd + d) * H;
            if (h0) memcpy(h + i * H, h0 + off, (size_t)H * sizeof(float));
            else memset(h + i * H, 0, (size_t)H * sizeof(float));
            if (c0) memcpy(c + i * H, c0 + off, (size_t)H * sizeof(float));
            else memset(c + i * H, 0, (size_t)H * sizeof(float));
        }
    }

    rnn_job J = {.s = &s, .GH = GH, .bias = bias, .rbh = rbh, .lens = lens, .xw = xw, .T = T, .Y = Y,
                 .bslice = bslice, .nunits = nunits, .uws = uws, .rt = rtn ? rt : NULL};
    int par = nunits > 1 && threads > 1 && rec_work >= RNN_PAR_MIN ? (threads < nunits ? threads : nunits) : 1;
    for (int64_t blk = 0; blk * T < seq; blk++) {
        int64_t fs = blk * T;
        J.T = seq - fs < T ? seq - fs : T;
        /* forward runs blocks from the start, reverse from the end */
        for (int d = 0; d < nd; d++) {
            int rev = nd == 2 ? d == 1 : s.reverse;
            J.t0[d] = rev ? seq - fs - J.T : fs;
        }
        if (nd == 1 || J.t0[0] == J.t0[1]) {
            rc = xw_gemm(k, &J, 0, (int)nd, J.t0[0], aoff, coff);
        } else {
            rc = xw_gemm(k, &J, 0, 1, J.t0[0], aoff, coff);
            if (!rc) rc = xw_gemm(k, &J, 1, 1, J.t0[1], aoff, coff);
        }
        if (rc) goto out;
        if (par > 1) mts_parallel(par, par_units, &J);
        else
            for (int u = 0; u < nunits; u++) unit_run(&J, u);
    }

    /* final states */
    for (int u = 0; u < nunits; u++) {
        int d = (int)(u / nbs);
        int64_t b0 = (u % nbs) * bslice, nb = batch - b0 < bslice ? batch - b0 : bslice;
        const float *h = uws[u], *c = h + nb * H;
        for (int64_t i = 0; i < nb; i++) {
            int64_t b = b0 + i;
            int64_t off = s.layout == 0 ? (d * batch + b) * H : (b * nd + d) * H;
            /* an empty sequence has no last step: zeros (as ONNX Runtime), not the initial state */
            if (Yh && lens[b] == 0) memset(Yh + off, 0, (size_t)H * sizeof(float));
            else if (Yh) memcpy(Yh + off, h + i * H, (size_t)H * sizeof(float));
            if (Yc && lens[b] == 0) memset(Yc + off, 0, (size_t)H * sizeof(float));
            else if (Yc) memcpy(Yc + off, c + i * H, (size_t)H * sizeof(float));
        }
    }
out:
    free(mem);
    free(uws);
    free(ibuf);
    return rc;
}

static int lstm_run(mts_kctx *k) { return rnn_run_kind(k, RNN_K_LSTM); }
static int gru_run(mts_kctx *k) { return rnn_run_kind(k, RNN_K_GRU); }
static int rnn_run(mts_kctx *k) { return rnn_run_kind(k, RNN_K_RNN); }

const mts_op mts_ref_ops_rnn[] = {
    {"LSTM", lstm_infer, lstm_run},
    {"GRU", gru_infer, gru_run},
    {"RNN", rnn_infer, rnn_run},
    {NULL, NULL, NULL},
};
