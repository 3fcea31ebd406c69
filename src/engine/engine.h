/*
 * The engine's public API: load an ONNX model, describe it, and run it.
 *
 *   mts_model  immutable after mts_model_load; shared by any number of threads. It owns the
 *              graph IR, the weights (zero-copy views of the mmap'd file where possible) and a
 *              cache of plans, one per concrete input-shape signature (built on first use,
 *              under a short lock, then read-only).
 *   mts_ctx    one caller's execution state: its own activation buffers. Not thread-safe;
 *              give each thread its own. Cheap to create; buffers grow on first run.
 *
 * Outputs returned by mts_ctx_run are views into the context's buffers, valid until the next
 * run on that context or its destruction.
 */
#ifndef MTS_ENGINE_ENGINE_H
#define MTS_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/graph.h"
#include "engine/tensor.h"
#include "util/status.h"

typedef struct mts_ctx mts_ctx;

typedef struct mts_load_opts {
    /* Largest single tensor a plan may allocate (bytes); 0 = default (8 GiB). */
    int64_t max_tensor_bytes;
    /* Kernels: NULL or "" = $MTS_BACKEND when set, else "default" (in every build, the
     * sanitizer builds included); "default" = oneDNN with graph optimizations, the reference
     * kernels for everything else; "reference" = the plain-C reference kernels only, no fusion. */
    const char *backend;
    /* Arithmetic (engine/precision.c): NULL or "" = $MTS_PRECISION when set, else "fp32";
     * "bf16" = convolutions and MatMul/Gemm with constant weights in bfloat16 on oneDNN (fp32
     * bias, accumulation, softmax, normalizations and reductions) after an accuracy guard;
     * "auto" = "bf16" when the CPU computes bf16 natively (AVX512-BF16 or AMX) and the guard
     * passes, else "fp32"; "int8" = the quantized kernels of a QDQ model (a float model runs
     * in fp32); "fp16" = the MatMul/Gemm products with constant weights and at most 32 source
     * rows (transformer encoders at batch 1-2) keep their weights in IEEE half precision, read
     * and widened to float in registers (float arithmetic and activations; everything else
     * fp32), after the same guard: on AVX-512 CPUs, where the few-row GEMM runs. Only the
     * default backend computes in bf16 or fp16. */
    const char *precision;
    /* The guard: calibration inputs (calibration_dir, default calibration/ beside the model,
     * else one seeded random batch in [0, 1)) run in fp32 and bf16 (fp16); the reduced form is kept
     * when the relative L2 error of every output is <= max_error (0 = 1e-2), otherwise the model
     * runs in fp32. */
    double max_error;
    const char *calibration_dir;
    /* The verdict of an earlier guard of the same file with the same settings (the server keeps
     * it across evictions, so a reload costs no second model and no guard runs): "bf16", "fp16" or
     * "fp32" applies it without running the guard, guard_error being the error measured then;
     * NULL or "" runs the guard. */
    const char *guard_verdict;
    double guard_error;
} mts_load_opts;

/* Loads path (an .onnx file; external data files are looked up beside it). On error returns a
 * negative status and err->msg says what is wrong and where (node name, tensor name, byte
 * offset). *out is set only on success. */
int mts_model_load(const char *path, const mts_load_opts *opts, mts_model **out, mts_err *err);
/* Same, from bytes in memory (copied). name is used in messages. */
int mts_model_load_buffer(const void *data, size_t len, const char *name, const mts_load_opts *opts,
                          mts_model **out, mts_err *err);
void mts_model_free(mts_model *m);

typedef struct mts_model_info {
    int ir_version;
    int opset;               /* default-domain opset */
    const char *producer;    /* "" when absent */
    int n_inputs, n_outputs;
    int n_nodes;
    int64_t param_bytes;     /* bytes of all initializers */
    int64_t mapped_bytes;    /* of which used in place from the file mapping (zero-copy) */
    int64_t resident_bytes;  /* bytes the model holds in memory: copies, IR, plans (not the mmap) */
} mts_model_info;

void mts_model_get_info(const mts_model *m, mts_model_info *out /* OUT */);
/* "default" or "reference": the backend the model runs on. */
const char *mts_model_backend(const mts_model *m);
/* Declared graph inputs/outputs (initializers excluded). Dims < 0 are symbolic. */
const mts_value *mts_model_input(const mts_model *m, int i);
const mts_value *mts_model_output(const mts_model *m, int i);
const mts_node *mts_model_node(const mts_model *m, int i);  /* topological order */

/* The arithmetic a model runs in and why (mts_load_opts.precision). */
typedef struct mts_precision_info {
    const char *requested;  /* "fp32", "bf16", "fp16", "auto" or "int8" */
    const char *effective;  /* "fp32", "bf16", "fp16" or "int8" */
    const char *reason;     /* one phrase: "requested", "auto: cpu has avx512_bf16, guard passed",
                             * "guard failed", "cpu lacks native bf16", "not a QDQ model", ... */
    double guard_error;     /* worst relative L2 error of the outputs, bf16 (fp16) vs fp32; < 0: not measured */
    double max_error;       /* the guard's threshold */
    int guard_runs;         /* calibration batches run */
    const char *guard_inputs; /* "calibration" (.npy files), "random", or "remembered" (the verdict
                               * of an earlier load: mts_load_opts.guard_verdict) */
} mts_precision_info;
const mts_precision_info *mts_model_precision(const mts_model *m);
/* oneDNN steps computing in bf16 in the model's plans built so far (the most of any one plan,
 * subgraphs' plans added; 0 for an fp32 model). */
int mts_model_bf16_steps(const mts_model *m);
/* Products running on IEEE half weights (precision fp16) in the plans built so far (likewise). */
int mts_model_half_steps(const mts_model *m);
/* Steps whose (possibly fused) node has op type `op_type` in the model's plans built so far (the
 * most of any one plan, subgraphs' plans added): which rewrites a plan took, for tests and tools.
 * "OP/ATTR" counts those whose integer attribute ATTR is set ("Concat/mts_out_bf16"). */
int mts_model_op_steps(const mts_model *m, const char *op_type);
/* Plans (one per input signature) the model holds now, and in *evicted (may be NULL) how many
 * it has freed to make room for others (MTS_MAX_PLANS, default 256, are kept). */
int mts_model_plan_count(const mts_model *m, int64_t *evicted);
/* Whether this CPU computes bf16 natively ("avx512_bf16", "amx_bf16") or NULL. */
const char *mts_cpu_bf16_native(void);
/* Checks a precision name; NULL when valid, else a message naming the accepted values. */
const char *mts_precision_check(const char *name);

/* Shape-level analysis for one input signature (compiles and caches the plan): FLOPs of
 * Conv/ConvTranspose/MatMul/Gemm (2 × multiply-adds) and the bytes of all intermediate
 * values. Dynamic-shaped parts are not counted. */
int mts_model_analyze(mts_model *m, const mts_tensor *inputs, int n_inputs, double *flops /* OUT */,
                      int64_t *activation_bytes /* OUT */, mts_err *err);

/* threads: intra-op threads this context may use (>= 1). */
int mts_ctx_create(mts_model *m, int threads, mts_ctx **out, mts_err *err);
void mts_ctx_free(mts_ctx *c);
/* Changes the intra-op thread count for the next runs (>= 1). */
void mts_ctx_set_threads(mts_ctx *c, int threads);
/* A function mts_ctx_run calls on the running thread between two steps of the plan, so a
 * scheduler can run short work of other models inside a long run (a preemption point). It
 * returns nonzero when it ran something on this thread; fn NULL removes the hook. */
typedef int (*mts_step_hook)(void *arg);
void mts_ctx_set_step_hook(mts_ctx *c, mts_step_hook fn, void *arg);
/* Padding-free runs: input `input` (int64, int32 or bool [B, S]; -1 turns this off) is a padding
 * mask, ones then zeros along each row, and the caller ignores every output at the positions
 * where it is zero (an embedding pooled over the valid tokens). Runs of a plan whose token rows
 * are computed independently (engine/padfree.c) then compute the products and the attention of
 * the valid positions only; their outputs at padded positions are not those of a whole run (the
 * padded rows are zeroed where skipped). The valid positions' outputs are those of a whole run
 * up to summation order when the model's attention mask hides padded keys. Stays set for later
 * runs of this context. MTS_NO_PADFREE=1 runs every batch whole. */
void mts_ctx_set_padding_mask(mts_ctx *c, int input);
/* Token rows this context's runs skipped as padding, in all. */
int64_t mts_ctx_rows_skipped(const mts_ctx *c);
/* Runs so far and how many of them ran on one thread: all of a one-thread context's, and those
 * of a context of T > 1 threads that ran on one thread instead of its team while that was faster
 * (engine/team.h; MTS_TEAM_ADAPT=0 turns this off). */
void mts_ctx_team_stats(const mts_ctx *c, int64_t *runs, int64_t *one_thread_runs);
/* Bytes of activation buffers the context holds now. */
int64_t mts_ctx_bytes(const mts_ctx *c);
/* inputs[i] corresponds to mts_model_input(m, i) (same order, all required). Validates dtypes
 * and shapes against the model, then runs. outputs (OUT) is an array of n_outputs pointers the
 * caller provides; each is set to a view owned by the context. */
int mts_ctx_run(mts_ctx *c, const mts_tensor *inputs, int n_inputs, const mts_tensor **outputs,
                mts_err *err);

/* Where mts_ctx_run_owned gets the memory of the outputs it hands over, and how the caller
 * gives it back. */
typedef struct mts_out_alloc {
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
} mts_out_alloc;
/* mts_ctx_run, except that each graph output whose type and shape the plan fixes before the
 * run (every output of a model without data-dependent shapes, unless float16/bfloat16 or kept
 * channels-last) is computed straight into a buffer from oa->alloc, with no copy after: owned
 * (OUT, n_outputs entries) gets that buffer, which outputs[i]->data then is and the caller owns
 * (give it back with oa->free; the context keeps no reference past its next run), or NULL where
 * outputs[i] is a view owned by the context as with mts_ctx_run. A server hands large outputs
 * to its replies this way. On failure every entry is NULL. A padding-free run (a padding mask
 * set) leaves the padded rows of such a buffer as the allocator gave them. */
int mts_ctx_run_owned(mts_ctx *c, const mts_tensor *inputs, int n_inputs, const mts_out_alloc *oa, void **owned,
                      const mts_tensor **outputs, mts_err *err);

/* Parses a serialized TensorProto (as in ONNX test data .pb files) into a tensor whose data is
 * malloc'd (free with free(t->data)). name (OUT, may be NULL) gets a malloc'd copy of its name. */
int mts_tensor_parse_pb(const void *data, size_t len, mts_tensor *t /* OUT */, char **name /* OUT */,
                        mts_err *err);

#endif
