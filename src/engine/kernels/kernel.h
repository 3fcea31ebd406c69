/*
 * The kernel interface and the backend table.
 *
 * Every ONNX op is implemented as a struct mts_op: an `infer` function that computes output
 * types and shapes, and a `run` function that computes output data.
 *
 * A backend is one entry of the table mts_backends[] (kernels/backend.c), in priority order:
 * the quantized kernels (kernels/quant_backend.c: QDQ fusion and the integer GEMM), oneDNN
 * (kernels/dnnl_backend.c), the fast direct kernels (kernels/fast_backend.c) and the plain-C
 * reference kernels (kernels/backend.c), which every other backend falls back to. Each
 * entry is a set of hooks, any of them NULL when the backend has nothing to do there: the plan
 * optimizer offers it the plan's steps to claim (single nodes or fused groups, which become
 * steps it runs itself), asks it how its steps take the channels-last layout, lets it fuse and
 * substitute kernels; the executor prepares it per context and thread count and runs its steps;
 * the model and the context hand it back its caches and per-context state to free. The engine
 * core iterates the table and names no backend, so a further backend (bf16 or int8 kernels, a
 * GPU) is one more entry in mts_backends[] and one more file under kernels/.
 *
 * Calling convention, for both functions:
 *   - k->in[i] is the i-th input, or NULL for an omitted optional input (and i >= k->n_in is
 *     treated the same: use mts_kin()).
 *   - infer may run before run time, when an input's data is not known yet (in[i]->data == NULL;
 *     shapes and dtypes always are). An op whose output shape depends on input *values* (Reshape's
 *     shape, Slice's starts, ...) returns MTS_EDYNAMIC in that case; the engine then calls infer
 *     again at run time with the data present.
 *   - infer fills k->out[j].dtype, .rank and .dims; it must not touch .data.
 *   - run is called after the engine has allocated k->out[j].data for the inferred shapes;
 *     inputs are never written. run must not allocate unboundedly from input values.
 *   - Errors: return a negative status and describe the problem with mts_err_set(k->err, ...);
 *     the engine prefixes the node name and op type.
 */
#ifndef MTS_ENGINE_KERNEL_H
#define MTS_ENGINE_KERNEL_H

#include "engine/graph.h"
#include "util/status.h"

/* Padding-free execution (context.c, engine.h mts_ctx_set_padding_mask): the valid positions of
 * a run's [B, S] token tensors, len[b] leading positions of batch entry b, the rest padding
 * whose outputs the caller ignores. map lists the valid rows of a [B, S, ...] tensor seen as
 * B * S rows (b * S + s for s < len[b]), n of them. Steps the plan marked (mts__step.rows) may
 * compute only those rows; the rest of their output rows they set to zero. */
typedef struct mts_rows {
    int64_t B, S, n;
    const int32_t *len, *map;
} mts_rows;

typedef struct mts_kctx {
    const mts_node *node;
    const mts_tensor *const *in;
    int n_in;
    mts_tensor *out;
    int n_out;
    mts_err *err;
    int threads; /* intra-op threads the caller allows (>= 1) */
    /* The execution context running the step, NULL at plan time (shape inference, constant
     * folding). Only the control-flow kernels use it: they run subgraphs in contexts cached
     * in it (engine/subgraph.h). */
    struct mts_ctx *ctx;
} mts_kctx;

/* The valid rows of a padding-free run for the step being run, when the plan marked it
 * (mts__step.rows); NULL otherwise and at plan time (context.c). */
const mts_rows *mts_kctx_rows(const mts_kctx *k);

typedef int (*mts_infer_fn)(mts_kctx *k);
typedef int (*mts_run_fn)(mts_kctx *k);

typedef struct mts_op {
    const char *op_type;   /* ONNX name, e.g. "Conv" */
    mts_infer_fn infer;
    mts_run_fn run;
} mts_op;

struct mts__opt;
struct mts__plan;
struct mts__step;

#define MTS_MAX_BACKENDS 8
/* A hook's result asking the optimizer to start over (commit declined a step it had claimed). */
#define MTS__RETRY 1

typedef struct mts_backend {
    const char *name;
    /* Whether the backend takes part in plans of a model loaded with selection `kind` (enum
     * mts_backend_kind); NULL: always. */
    bool (*enabled)(int kind);
    /* The backend's kernel for op_type, or NULL (also when the hook is NULL). */
    const mts_op *(*lookup)(const char *op_type);

    /* Optimization (optimize.c), once per plan; each stage calls every enabled backend in table
     * order. `self` is the backend's index in mts_backends[] (steps it claims carry it), and
     * o->bopt[self] is its own state for this optimization.
     *   claim: after Identity removal, claims nodes or fused groups (rewriting the steps' inputs
     *     and outputs and marking the absorbed steps removed) or declines them; *mstate is the
     *     backend's per-model state (its weight cache).
     *   layout_anchor: whether step s reads and writes either layout and wants its group stored
     *     channels-last (a convolution); its extra inputs (residuals) join its output's group.
     *   commit: after the layout choice, builds the claimed steps (kind MTS__S_BACKEND); returns
     *     MTS__RETRY after declining one (it remembers which), and the optimizer starts over.
     *   fuse: fusions into the backend's kernels once the claims are settled.
     *   substitute: offered every remaining kernel step after its layout rewrite; may swap in
     *     a faster kernel.
     *   finish: after compaction: raises p->scratch_bytes for its steps, releases the weights
     *     it packed (weights.h).
     *   opt_free: frees o->bopt[self]. */
    int (*claim)(struct mts__opt *o, int self, void **mstate, mts_err *err);
    bool (*layout_anchor)(const struct mts__opt *o, int self, int s);
    int (*commit)(struct mts__opt *o, int self, mts_err *err);
    int (*fuse)(struct mts__opt *o, int self, mts_err *err);
    int (*substitute)(struct mts__opt *o, int self, struct mts__step *st, mts_err *err);
    int (*finish)(struct mts__opt *o, int self, mts_err *err);
    void (*opt_free)(struct mts__opt *o, int self);

    /* Execution (context.c) of the steps the backend claimed.
     *   prepare: per context and thread count, before the first run with them: makes its steps
     *     of plan p ready for `threads` intra-op threads (oneDNN primitives), creates its
     *     per-context state *cstate (a oneDNN stream) and raises *scratch to the bytes one of its
     *     steps needs.
     *   set_threads: before each run of a plan with its steps.
     *   run: one step; vals are the context's values, scratch the context's scratch memory; rows,
     *     for a step the plan marked, the valid rows of a padding-free run (else NULL).
     *   describe: the implementation behind a step, for MTS_PLAN_VERBOSE and `mtserve inspect`.
     *   step_free / ctx_free / model_free: a step's compiled form, a context's state, a model's
     *     state (caches); model_bytes: the bytes of a model's state (resident memory). */
    int (*prepare)(const struct mts__plan *p, int self, int threads, void **cstate, int64_t *scratch, mts_err *err);
    void (*set_threads)(int threads);
    int (*run)(const struct mts__step *st, void *cstate, const mts_tensor *vals, void *scratch, int threads,
               const mts_rows *rows, mts_err *err);
    const char *(*describe)(const struct mts__step *st);
    void (*step_free)(void *impl);
    void (*ctx_free)(void *cstate);
    void (*model_free)(void *mstate);
    int64_t (*model_bytes)(const void *mstate);
} mts_backend;

/* The backend table, NULL-terminated, in priority order (at most MTS_MAX_BACKENDS entries). */
extern const mts_backend *const mts_backends[];
extern const mts_backend mts_backend_dnnl;      /* kernels/dnnl_backend.c */
extern const mts_backend mts_backend_fast;      /* kernels/fast_backend.c */
extern const mts_backend mts_backend_reference; /* kernels/backend.c */
extern const mts_backend mts_backend_quant;     /* kernels/quant_backend.c */
/* Looks op_type up in the table: the first backend with a kernel for it (the reference kernels
 * today). NULL: unsupported op. */
const mts_op *mts_op_lookup(const char *op_type);

/* Optional-input accessor: NULL when absent. */
static inline const mts_tensor *mts_kin(const mts_kctx *k, int i)
{
    return (i < k->n_in) ? k->in[i] : NULL;
}

/* Each kernel file exports its ops through one of these tables, terminated by {NULL}. */
extern const mts_op mts_ref_ops_conv[];      /* Conv, ConvTranspose, pools, Resize, Pad */
extern const mts_op mts_ref_ops_math[];      /* elementwise, normalizations, reductions */
extern const mts_op mts_ref_ops_shape[];     /* shape/data movement, MatMul, Gemm */
extern const mts_op mts_ref_ops_math2[];     /* Mod, Round, Sign, trig, LRN, MVN, ReduceL1/LogSum*, Det */
extern const mts_op mts_ref_ops_signal[];    /* DFT, STFT, window functions, MelWeightMatrix */
extern const mts_op mts_ref_ops_random[];    /* RandomNormal/Uniform(Like), Multinomial, Bernoulli */
extern const mts_op mts_ref_ops_quant[];     /* (De)QuantizeLinear, QLinear*, *Integer */
extern const mts_op mts_ref_ops_index[];     /* indexing: TopK, Scatter*, GatherND, Einsum, ... */
extern const mts_op mts_ref_ops_control[];   /* If, Loop, Scan (ref_control.c) */
extern const mts_op mts_ref_ops_rnn[];       /* LSTM, GRU, RNN */
extern const mts_op mts_ref_ops_loss[];      /* NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss */
extern const mts_op mts_ref_ops_text[];      /* TfIdfVectorizer */
extern const mts_op mts_ref_ops_seq[];       /* sequence and optional ops (ref_seq.c) */
extern const mts_op mts_ref_ops_string[];    /* StringNormalizer (ref_string.c) */
/* Cast / CastLike to or from string tensors (ref_string.c; `to` may be MTS_DTYPE_STRING). */
int mts_str_cast_infer(mts_kctx *k, mts_dtype to);
int mts_str_cast_run(mts_kctx *k, mts_dtype to);

/* Conv/ConvTranspose geometry for the fast backends (ref_conv.c): validated like the reference
 * kernels; spatial arrays normalized to 3 entries with the real dims last (leading entries are
 * unit dims). For ConvTranspose, out = s*(in-1) + output_padding + dilated kernel - pb - pe. */
typedef struct mts_conv_geom {
    int nsp;
    int64_t N, C, M, group;
    int64_t in[3], k[3], s[3], d[3], pb[3], pe[3], out[3];
} mts_conv_geom;
int mts_conv_geometry(mts_kctx *k, bool transpose, mts_conv_geom *out);
/* MaxPool (is_max) / AveragePool window geometry in the same form (M = C, group = 1). */
int mts_pool_geometry(mts_kctx *k, bool is_max, mts_conv_geom *out);

/* Backend selection: "reference" (plain C only) or "default" (oneDNN where it applies, the
 * reference kernels elsewhere). The environment variable MTS_BACKEND, when set, overrides the
 * process default; mts_load_opts.backend overrides both per model. */
typedef enum mts_backend_kind { MTS_BACKEND_DEFAULT = 0, MTS_BACKEND_REFERENCE = 1 } mts_backend_kind;

/* Channels-last special cases the optimizer substitutes (kernels/nhwc.c). */
extern const mts_op mts_nhwc_upsample_nearest; /* [N,H,W,C] nearest upsampling by integer factors */
/* Inputs a bf16-writing channels-last Concat can take as bf16: a bit each in its integer
 * attribute "mts_in_bf16" (the bf16 hand-offs, kernels/dnnl_backend.c). */
#define MTS_CAT_BF16_INPUTS 62
extern const mts_op mts_nhwc_concat;           /* concatenation of [N,H,W,Ci] along C */
extern const mts_op mts_nhwc_copy;             /* NCHW<->NHWC Transpose of channels-last data: a copy */
extern const mts_op mts_nhwc_to_nchw;          /* graph output copied from channels-last data */

/* Whether the fast kernels take part (MTS_NO_FAST=1 turns them off for comparisons). */
bool mts_fast_enabled(void);
/* Fast float kernels (kernels/fast.c); each falls back to the reference kernel for cases it does
 * not handle. mts_fast_reduce serves ReduceMean, ReduceMax and ReduceSum (by the node's op_type). */
extern const mts_op mts_fast_reduce;
extern const mts_op mts_fast_layernorm;
extern const mts_op mts_fast_layernorm_written; /* "MtsLayerNorm": a written-out LayerNormalization (+ Relu) */
extern const mts_op mts_fast_softmax;  /* attribute "mts_scale" (float): softmax(x * scale) */
extern const mts_op mts_fast_chain;    /* "MtsEltwiseChain": in[0], then the stages in INTS "ops" */
/* "MtsStridedMatMul": Y[b0,b1] = A[b0,b1] x B[b0,b1] on strided views. INTS attributes: dims
 * {B0, B1, M, N, K}; a_strides, b_strides, y_strides {batch 0, batch 1, row, column} in elements
 * (y's column stride must be 1); y_dims, the output value's shape. */
extern const mts_op mts_fast_bmm;
/* "MtsAttention" (kernels/fast_attn.c): softmax(((Q x K) * alpha + mask) * beta) x V per batch
 * entry and head, on strided views; the attributes are described there. */
extern const mts_op mts_fast_attention;
/* "MtsChannelPool" on channels-last views: in[0] x [N,H,W,C], optional in[1] scale [N or 1,1,1,C];
 * out [N,H,W,2] = (mean over C, max over C) of x * scale. */
extern const mts_op mts_fast_cpool;
extern const mts_op mts_fast_conv1px;
/* Conv with one output and 1-4 input channels, stride 1, no dilation, group 1
 * (mts_fast_conv_small_ok); attribute mts_nhwc_src = 1: in[0] is a channels-last view. */
extern const mts_op mts_fast_conv_small;
bool mts_fast_conv_small_ok(const mts_conv_geom *g);  /* Conv: one input pixel, 1x1 kernel, group 1, no padding */
/* The small-channel conv's pieces, for a kernel that fuses it after its own output rows
 * (kernels/bfconv.c): its weights [M][C][KK] broadcast (aligned_alloc'd: free), output row y of
 * a band of padded planes (C planes PHW floats apart, rows PW apart, 3x3 kernel, 1-4 outputs
 * into out[m][0..OW)), and its fused Relu / Sigmoid (enum mts_chain_op) on n floats. */
void *mts_fast_sconv_weights(const float *w, int64_t M, int64_t C, int64_t KK);
void mts_fast_sconv_row3(const float *pad, int64_t PW, int64_t PHW, int64_t C, int64_t M, const float *w, const void *wv,
                         const float *b, int64_t y, int64_t OW, float *const *out);
void mts_fast_act(float *y, int64_t n, int act);
enum mts_chain_op {
    MTS_CHAIN_ADD = 0,  /* acc + next input */
    MTS_CHAIN_SUB,      /* acc - next input */
    MTS_CHAIN_RSUB,     /* next input - acc */
    MTS_CHAIN_MUL,
    MTS_CHAIN_DIV,      /* acc / next input */
    MTS_CHAIN_RDIV,     /* next input / acc */
    MTS_CHAIN_RELU,
    MTS_CHAIN_SIGMOID,
    MTS_CHAIN_HARDSWISH, /* x * min(max(x / 6 + 1/2, 0), 1) */
    MTS_CHAIN_ERF,
};

/* Whether a chain stage code is a unary one (no operand of its own). */
static inline int mts_chain_unary(int64_t op)
{
    return op == MTS_CHAIN_RELU || op == MTS_CHAIN_SIGMOID || op == MTS_CHAIN_HARDSWISH || op == MTS_CHAIN_ERF;
}

/* Runs fn(ctx, ithr, nthr) for ithr in [0, nthr) on `threads` threads of the calling thread's
 * OpenMP team (the one oneDNN uses; kernels/dnnl_rt.c), or inline when threads <= 1 or OpenMP
 * is unavailable. */
void mts_parallel(int threads, void (*fn)(void *ctx, int ithr, int nthr), void *ctx);

/* dst[i] = src[i] rounded to float16 (dt MTS_DTYPE_FLOAT16) or bfloat16, as a float: ties to
 * even, NaN and infinities kept, bit for bit what a Cast to that type gives (engine/half.c;
 * F16C/AVX-512 conversions where the CPU has them). src may equal dst. */
void mts_round_half(mts_dtype dt, const float *src, float *dst, int64_t n);

/* Shared helpers for kernels (kernels/common.c). */
/* Numpy-style broadcast of a and b into out (rank/dims); MTS_ESHAPE with a message on mismatch. */
int mts_broadcast_shape(const mts_tensor *a, const mts_tensor *b, mts_tensor *out, mts_err *err);
/* Normalizes a possibly negative axis into [0, rank); MTS_EINVAL with a message when out of range. */
int mts_norm_axis(int64_t axis, int rank, int *out, mts_err *err);
/* Row-major strides (in elements) of t. */
void mts_strides(const mts_tensor *t, int64_t *strides);
/* MTS_EINVAL unless the node has at least `min` outputs. */
int mts_kchk_n_out(mts_kctx *k, int min);
/* Sets output j's type and shape (nothing when the node has fewer outputs), checking the rank,
 * that no dimension is negative and that the byte size fits; errors say which output. */
int mts_kset_out(mts_kctx *k, int j, mts_dtype dt, int rank, const int64_t *dims);

#endif
