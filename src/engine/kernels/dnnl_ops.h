/*
 * The oneDNN backend's interface to the planner and the executor (dnnl_conv.c).
 *
 * A mts_dconv is one Conv, ConvTranspose, pooling op or MatMul/Gemm with constant weights
 * compiled for one plan: a oneDNN primitive with its
 * fused post-ops (activations, a residual Add), the activation layouts the planner chose
 * (NCHW or NHWC for the source and destination) and the weights in the layout oneDNN prefers
 * (format_tag::any), packed once per model and shared by every plan and context through a
 * model-level cache. Primitives are immutable after creation and run concurrently from many
 * contexts; each context passes its own stream and scratchpad memory.
 */
#ifndef MTS_ENGINE_DNNL_OPS_H
#define MTS_ENGINE_DNNL_OPS_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/kernels/kernel.h"

enum mts_dpost_kind {
    MTS_DPOST_RELU,        /* alpha: negative slope (LeakyRelu) */
    MTS_DPOST_CLIP,        /* alpha: min, beta: max */
    MTS_DPOST_SIGMOID,
    MTS_DPOST_TANH,
    MTS_DPOST_HARDSWISH,
    MTS_DPOST_HARDSIGMOID, /* max(0, min(1, alpha*x + beta)) */
    MTS_DPOST_ADD,         /* + a residual tensor of the destination's shape */
    MTS_DPOST_GELU,        /* x * 0.5 * (1 + erf(x / sqrt(2))) */
    MTS_DPOST_LINEAR,      /* alpha*x + beta (a Mul/Div/Add/Sub by constant scalars) */
};

#define MTS_DPOST_MAX 6

typedef struct mts_dpost {
    int kind;
    float alpha, beta;
    bool nhwc; /* MTS_DPOST_ADD: layout of the residual */
    bool bf16; /* MTS_DPOST_ADD: the residual holds bf16 values (converted inside the step) */
} mts_dpost;

enum mts_dprim_kind {
    MTS_DPRIM_CONV = 0,
    MTS_DPRIM_DECONV,
    MTS_DPRIM_POOL_MAX,
    MTS_DPRIM_POOL_AVG_INCLUDE, /* count_include_pad = 1 */
    MTS_DPRIM_POOL_AVG_EXCLUDE,
    MTS_DPRIM_MATMUL,    /* g.nsp = 0, g.N = rows, g.C = K, g.M = columns; transpose: B is [N, K] */
};

static inline bool mts_dprim_is_pool(int kind)
{
    return kind >= MTS_DPRIM_POOL_MAX && kind <= MTS_DPRIM_POOL_AVG_EXCLUDE;
}

typedef struct mts_dconv_spec {
    int kind;            /* enum mts_dprim_kind; pools have no weights and no post-ops */
    bool transpose;      /* kind == MTS_DPRIM_DECONV */
    mts_conv_geom g;
    const float *w, *b;  /* ONNX layouts (w: Conv [M, C/g, k...], ConvTranspose [C, M/g, k...]); b may be NULL */
    bool src_nhwc, dst_nhwc;
    int n_post;
    mts_dpost post[MTS_DPOST_MAX];
    int64_t up[2];       /* > 1: the source is read through a nearest upsampling by these (H, W)
                          * factors first; g describes the conv on the upsampled source (see
                          * mts_dconv_up_ok) */
    bool bf16;           /* compute in bfloat16: bf16 source (converted inside the step) and weights
                          * (packed once), fp32 bias, accumulation and destination; falls back
                          * to fp32 when oneDNN has no fast bf16 implementation (mts_dconv_bf16) */
    bool src_bf16;       /* bf16: the source tensor already holds bf16 values (written by a bf16
                          * step with dst_bf16), in the planner's layout */
    bool dst_bf16;       /* bf16: write the destination as bf16 (its readers are bf16 steps) */
    int64_t cat_C2;      /* > 0: a channel Concat of two bf16 channels-last tensors folded into
                          * the step: in[0] holds the source's first g.C - cat_C2 channels, the
                          * step's last input (after the residuals, so the kernel receives it
                          * after them in resid) the other cat_C2. Only the engine's bf16 3x3
                          * kernel takes it (mts_bfconv_ok). */
    /* > 0: a small convolution to head_M (1-4) channels, 3x3, stride 1, padding 1, on this
     * step's output (a lip-sync UNet's 3-channel head), fused after it: weights head_w
     * [head_M][g.M][3][3] and bias head_b (may be NULL) in the model's constants, then
     * head_act (0 or an enum mts_chain_op Relu / Sigmoid); the destination is the head's
     * output, channels-last when head_nhwc. This step's own output is never stored; it is
     * rounded to bf16 values as a bf16 hand-off would round it. Only the engine's bf16 3x3
     * kernel takes it (mts_bfconv_ok). */
    int head_M;
    const float *head_w, *head_b;
    int head_act;
    bool head_nhwc;
    bool half_weights;   /* a MatMul run by the small-M GEMM with at most
                          * MTS_SMALL_GEMM_HALF_ROWS rows keeps its weights in IEEE half
                          * precision (fast_sgemm.c); arithmetic in float */
    bool wino;           /* run as Winograd where oneDNN can (the planner sets it for convs that
                          * pass mts_dconv_wino_ok, within the model's memory budget) */
    /* A depthwise-separable pair (mts_dconv_dwsep_ok; the planner pairs them): this step is a
     * depthwise 3x3 convolution (g, w, b, the first n_dw_post post-ops) whose output only a 1x1
     * convolution to pw_M channels reads (pw_w [pw_M, C], pw_b, the post-ops after the first
     * n_dw_post); both run in one pass of the engine's own kernel (dwsep.c), the destination
     * has pw_M channels. pw_M == 0: a plain step. */
    int64_t pw_M;
    const float *pw_w, *pw_b;
    int n_dw_post;
    bool src_round;      /* pw_M > 0 in a bf16 plan: the source is the output of a step that
                          * hands bf16 on; when it is given as float (MTS_BF16_NO_HANDOFF) it is
                          * rounded to bf16 as it is read, so the results do not depend on the
                          * hand-offs. (The pair computes in float otherwise.) */
    /* int8 convolution (QLinearConv / ConvInteger, kind MTS_DPRIM_CONV, no post-ops): q8 set,
     * w and b unused. Source uint8 or int8 (q8_src), weights int8 in the ONNX layout (qw),
     * destination uint8 / int8 with output scales qscale (one per output channel, or one when
     * q8_nscale is 1), or int32 without scales (ConvInteger: qscale NULL); int32 bias qbias
     * (NULL: none). */
    bool q8;
    mts_dtype q8_src, q8_dst;
    const int8_t *qw;
    const int32_t *qbias;
    const float *qscale;
    int64_t q8_nscale;
    int32_t q8_zp[2];    /* zero points of source and destination (0 for an int32 destination) */
    /* An integer Relu / LeakyRelu after the convolution (a fused QDQ one, MtsQLinearUnary) as
     * post-ops that replay the unfused steps: the convolution's requantization (qscale, round
     * half to even, saturation to q8_mid's range with zero point q8_mid_zp), the activation's
     * dequantization (same zero point, scale q8_act_xs), Relu / LeakyRelu (slope q8_act_alpha)
     * and division by q8_act_ys; the destination (type q8_dst, zero point q8_zp[1]) is the
     * activation's output. */
    bool q8_act;
    mts_dtype q8_mid;
    int32_t q8_mid_zp;
    float q8_act_xs, q8_act_alpha, q8_act_ys;
    int key;             /* weight cache key (the node index; unique per model) */
    void **cache;        /* model-level packed-weight cache (caller holds the plan lock) */
} mts_dconv_spec;

typedef struct mts_dconv mts_dconv;

/* Whether s (with s->up set) can run as one small convolution per output phase on the
 * low-resolution source: 2-D, group 1, stride 1, dilation 1, output the size of the upsampled
 * source, no residual post-ops, and every phase's taps within the padding. Nearest upsampling
 * by s then a k x k convolution reads, for output row s*i + p, source rows i + d with
 * d = floor((p + ky - pad) / s): fewer distinct taps (2 x 2 instead of 3 x 3 for s = 2). */
bool mts_dconv_up_ok(const mts_dconv_spec *s);
/* Packed weight bytes the phase convolutions of s need beyond the plain convolution's. */
int64_t mts_dconv_up_extra_bytes(const mts_dconv_spec *s);
/* Whether s may run as Winograd (fp32 3x3 stride-1 2-D, 32+ channels; MTS_NO_WINOGRAD unset),
 * and the weight bytes that would add at most (the transformed weights, up to 4x the kernel's,
 * plus the plain copy the step keeps, less the usual packed copy). */
bool mts_dconv_wino_ok(const mts_dconv_spec *s);
int64_t mts_dconv_wino_extra_bytes(const mts_dconv_spec *s);

/* Whether dw (a claimed convolution) and pw (the claimed convolution that alone reads dw's
 * output) can run as one depthwise-separable step: dw depthwise 3x3, stride 1, padding 1, 8-64
 * channels (a multiple of 8), with at most two Relu / LeakyRelu / Clip post-ops and no
 * residual; pw 1x1, stride 1, no padding, 8-64 output channels (a multiple of 8), with Relu /
 * LeakyRelu / Clip / scalar affine / residual Add post-ops; neither int8, upsampled nor
 * Winograd; together at most MTS_DPOST_MAX post-ops; in bf16 plans, C x M at most 512. */
bool mts_dconv_dwsep_ok(const mts_dconv_spec *dw, const mts_dconv_spec *pw);

/* Threads worth giving a step of `macs` multiply-adds: one per 100k (about 4 us of work), at
 * least one, at most `threads`. The oneDNN steps and the engine's own kernels share the rule. */
static inline int mts_dconv_threads_for(double macs, int threads)
{
    double t = macs / 1e5;
    return t < 1 ? 1 : t < threads ? (int)t : threads;
}

/* Creates the primitive (MTS_EUNSUPPORTED when oneDNN has no good implementation). */
int mts_dconv_create(const mts_dconv_spec *s, mts_dconv **out, mts_err *err);
void mts_dconv_free(mts_dconv *c);
/* Makes sure a primitive for `threads` intra-op threads exists (oneDNN fixes the team size when
 * a primitive is created; one is made per thread count on first use, thread-safely) and returns
 * the scratch bytes one execution with it needs (scratchpad plus layout-conversion buffers). */
#define MTS_DNNL_MAX_THREADS 64
int mts_dconv_prepare(const mts_dconv *c, int threads, size_t *scratch, mts_err *err);
/* Whether c's primitives for `threads` exist already (mts_dconv_prepare would create none). */
bool mts_dconv_ready(const mts_dconv *c, int threads);
/* oneDNN's implementation name ("brg:avx512_core", ...), for `mtserve inspect` and tests. */
const char *mts_dconv_impl(const mts_dconv *c);
/* Whether c computes in bf16 (spec.bf16 asked for it and oneDNN had a fast implementation). */
bool mts_dconv_bf16(const mts_dconv *c);
/* Whether c runs the small-M GEMM on IEEE half weights (spec.half_weights, few rows). */
bool mts_dconv_half(const mts_dconv *c);
/* Runs on the calling thread's OpenMP team. resid: the MTS_DPOST_ADD tensors in post-op order;
 * src_zp: an int8 convolution's source zero point when it is computed at run time (NULL: the
 * spec's q8_zp[0]). */
int mts_dconv_run(const mts_dconv *c, int threads, void *stream, const void *src, void *dst, const float *const *resid,
                  const mts_tensor *src_zp, void *scratch, mts_err *err);
/* A padding-free run of a MatMul step on the small-M GEMM whose source and destination are
 * rows->B * rows->S rows: computes the valid rows only and zeroes the others. Returns false
 * (nothing done) for any other step, which then runs whole. */
bool mts_dconv_run_rows(const mts_dconv *c, int threads, const void *src, void *dst, const float *const *resid,
                        const mts_rows *rows);
/* Whether c is an int8 convolution (spec.q8). */
bool mts_dconv_q8(const mts_dconv *c);
/* int8 convolution primitives created so far in this process, and how many of them with a
 * fused activation (spec.q8_act) (for tests). */
int64_t mts_dconv_q8_created(void);
int64_t mts_dconv_q8_act_created(void);
/* Convolutions created to run as Winograd so far in this process (for tests). */
int64_t mts_dconv_wino_created(void);

/* A oneDNN stream for one execution context (NULL on failure). */
void *mts_dnnl_stream_create(void);
void mts_dnnl_stream_free(void *stream);
/* The model-level packed-weight cache. */
void mts_dnnl_cache_free(void *cache);
int64_t mts_dnnl_cache_bytes(const void *cache);
/* Sets the OpenMP team size of the calling thread for the next oneDNN calls. */
void mts_dnnl_set_threads(int threads);

#endif
