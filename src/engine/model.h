/*
 * Internal layout of a loaded model and of a plan, shared by the loader (loader.c, onnx_pb.c,
 * weights.c), the planner (plan.c, optimize.c), the backends (kernels/dnnl_backend.c,
 * kernels/fast_backend.c) and the executor (context.c). Nothing outside engine/ includes this.
 */
#ifndef MTS_ENGINE_MODEL_H
#define MTS_ENGINE_MODEL_H

#include <pthread.h>

#include "engine/engine.h"
#include "engine/kernels/kernel.h"
#include "util/pool.h"

/* A misaligned initializer copied out of the file mapping (malloc'd; data NULL while released). */
typedef struct mts__copy {
    void *data;
    const void *src;       /* the bytes in the mapping */
    size_t len;
    int value;             /* initializer value index, -1 for attribute tensors */
} mts__copy;

typedef struct mts__mapping {
    char *location;  /* external data location ("" for the model file itself) */
    void *addr;
    size_t len;
} mts__mapping;

/* Value states inside a plan. */
enum mts__vstate {
    MTS__V_UNUSED = 0, /* not needed by this plan */
    MTS__V_CONST,      /* data known at plan time (initializer or folded) */
    MTS__V_STATIC,     /* shape known at plan time, data computed at run time */
    MTS__V_DYNAMIC,    /* shape known only at run time */
    MTS__V_INPUT,      /* graph input: caller's data */
};

/* One executable step of a plan: a kernel call for a node, or a step a backend claimed, which
 * may stand for a group of nodes (a oneDNN convolution with the BatchNormalization, activations
 * and residual Add folded into it). in/out are value indices (-1: omitted input); they differ
 * from the node's after fusion. */
enum mts__step_kind {
    MTS__S_KERNEL = 0, /* op->run with the node's attributes */
    MTS__S_BACKEND,    /* mts_backends[backend]->run with impl (for oneDNN: in[0] source,
                        * in[1..n_in-1] residuals, out[0] destination) */
};

typedef struct mts__step {
    int node;                 /* model node index (messages; the first node of a fused group) */
    const mts_node *nd;       /* node handed to the kernel (a rewritten copy for channels-last steps) */
    const mts_op *op;
    uint8_t kind;             /* enum mts__step_kind */
    uint8_t dynamic;          /* infer runs at run time */
    uint8_t nhwc;             /* 4-D tensors are passed as [N,H,W,C] views (channels-last data) */
    uint8_t backend;          /* MTS__S_BACKEND: index in mts_backends[] */
    uint8_t rows;             /* may skip padded rows in a padding-free run (padfree.c) */
    int n_in, n_out;
    int *in, *out;
    const mts_tensor **cin;   /* per input: plan-time replacement (permuted constants), or NULL */
    int split_axis;           /* >= 0: an elementwise-like kernel that may run on slices of this
                               * (view) axis in parallel; -1 otherwise */
    void *impl;               /* MTS__S_BACKEND: the backend's compiled step (step_free frees it) */
} mts__step;

typedef struct mts__plan {
    struct mts__plan *next;
    int n_sig;
    mts_tensor *sig;       /* input signature: dtype, rank, dims (no data) */
    mts_tensor *vals;      /* per value: shape known at plan time; data for CONST */
    uint8_t *state;        /* per value: enum mts__vstate */
    uint8_t *nhwc;         /* per value: data is channels-last (4-D STATIC values only) */
    int n_steps;
    mts__step *steps;
    int *slot_of;          /* per value: buffer slot of a STATIC value, -1 otherwise */
    int n_slots;
    int64_t *slot_bytes;
    int max_io;            /* most inputs or outputs of any step */
    int64_t scratch_bytes; /* per-context scratch for backend steps (> 0 when there are any) */
    unsigned backends;     /* bit b: a step runs on mts_backends[b] */
    int n_fused;           /* nodes folded into other steps */
    double flops;
    int64_t activation_bytes;
    int n_bf16;            /* backend steps computing in bf16 */
    int n_f16w;            /* backend steps on IEEE half weights (precision fp16) */
    bool rows_ok;          /* padding-free runs may skip padded rows (padfree.c) */
    int64_t tok_B, tok_S;  /* ... of token tensors [tok_B, tok_S, ...] */
    mts_pool pool;         /* folded constants and the arrays above */
    /* Under the model's plan_lock: contexts bound to this plan (and callers between
     * mts__plan_get and mts__plan_release), the model's plan clock at its last lookup, and
     * an id no other plan of the model had (plans are freed and their memory reused). */
    int users;
    uint64_t last_use, id;
} mts__plan;

struct mts_model {
    char *path;
    mts_pool pool;
    mts__mapping *maps;
    int n_maps;
    void *owned_copy;      /* model bytes when loaded from a buffer */
    int ir_version, opset;
    const char *producer;
    int n_values, n_nodes, n_inputs, n_outputs;
    mts_value *values;
    mts_node *nodes;       /* topological order */
    const mts_op **ops;    /* per node, resolved at load */
    int *inputs, *outputs; /* value indices */
    int64_t param_bytes;
    int64_t mapped_bytes;  /* initializer bytes used in place from a file mapping */
    int64_t max_tensor_bytes;
    pthread_mutex_t plan_lock;
    mts__plan *plans;
    int n_plans;
    int64_t plan_bytes;
    uint64_t plan_clock;   /* lookups so far (plan_lock) */
    int64_t plans_evicted; /* plans freed to make room for another signature */
    mts__copy *copies;     /* misaligned initializers copied at load */
    int n_copies, cap_copies;
    int64_t copy_bytes;    /* bytes of copies held now */
    int backend;           /* mts_backend_kind */
    bool bf16;             /* oneDNN steps compute in bf16 (the root's flag holds for subgraphs) */
    bool f16w;             /* few-row MatMuls keep IEEE half weights (precision fp16; the root's) */
    mts_precision_info prec; /* precision.c */
    char prec_reason[160];
    void *bstate[MTS_MAX_BACKENDS]; /* per backend of mts_backends[]: its per-model state (the
                                     * oneDNN packed-weight cache), shared by all plans (under
                                     * plan_lock); freed by the backend's model_free */
    /* Subgraphs (subgraph.c). A subgraph is a model of its own sharing the root's IR pool,
     * mappings and copies; its inputs are n_formal formal inputs followed by captured outer
     * values, capture c being input cap_slot[c] of the control-flow node that owns it. The root
     * lists every subgraph at any depth in subs and frees them. */
    const struct mts_model *root; /* NULL for the root model */
    int depth;                    /* 0 for the root */
    int n_formal;
    int *cap_slot;
    struct mts_model **subs;
    int n_subs, cap_subs;
};

/* True when inputs `in` have exactly plan p's signature (types and shapes; never for blobs, whose
 * contents the input check reads): a context bound to p may run it without a plan lookup. */
bool mts__plan_same_shapes(const mts__plan *p, const mts_tensor *in, int n);
/* mts_ctx_run, with static graph output i computed straight into dst[i].data when dst is given
 * and dst[i] has the output's exact type and shape (outputs[i] then points there; data NULL:
 * not given). An If's branch writes its results into the If's own output buffers this way. */
int mts__ctx_run_into(mts_ctx *c, const mts_tensor *inputs, int n_inputs, const mts_tensor *dst,
                      const mts_tensor **outputs, mts_err *err);
/* Runs of c use `threads` intra-op threads as given, without the adaptive team choice (a
 * subgraph's context follows the run of its parent; 0 restores the default). */
void mts__ctx_set_run_threads(mts_ctx *c, int threads);
/* Finds or builds the plan for a signature (thread-safe) and holds it: the caller releases it
 * with mts__plan_release (a context holds the plan it is bound to until it rebinds or is
 * freed). At the model's plan limit the least recently looked-up plan nobody holds is freed
 * to make room. */
int mts__plan_get(mts_model *m, const mts_tensor *inputs, int n, const mts__plan **out, mts_err *err);
void mts__plan_release(mts_model *m, const mts__plan *p);
void mts__plan_free_all(mts_model *m);
/* Graph optimizer and layout pass (optimize.c): rewrites p->steps for the enabled backends. */
int mts__optimize(mts_model *m, mts__plan *p, mts_err *err);
/* Sets p->rows_ok, p->tok_B/tok_S and the steps' rows flags (padfree.c). */
void mts__plan_padfree(const mts_model *m, mts__plan *p);
/* Applies opts->precision to a freshly loaded model (precision.c): may run the accuracy guard,
 * which loads the model a second time with load(); on a failed guard *m is replaced by that
 * fp32 instance. */
typedef int (*mts__reload_fn)(void *arg, const mts_load_opts *opts, mts_model **out, mts_err *err);
int mts__apply_precision(mts_model **m, const mts_load_opts *opts, mts__reload_fn load, void *arg, mts_err *err);
/* Resolves the backend for a model from the load options, $MTS_BACKEND and the build default. */
int mts__resolve_backend(const mts_load_opts *opts, mts_err *err);
int mts__check_inputs(const mts_model *m, const mts_tensor *in, int n, mts_err *err);
/* A context's slot for the control-flow runner's per-context state (subgraph.c), which
 * mts__cf_free releases with the context. */
void **mts__ctx_cf_slot(mts_ctx *c);
void mts__cf_free(void *cf);
int64_t mts__cf_bytes(const void *cf); /* buffers held by that state and its contexts */

/* Wire-format parsing (onnx_pb.c). base/base_len: the whole file, for offsets in messages. */
typedef struct mts__pb_src {
    const uint8_t *base;
    size_t base_len;
    const char *file;      /* name for messages */
    mts_model *model;      /* for external data and the pool; NULL for stand-alone tensors */
    const char *dir;       /* directory for external data */
} mts__pb_src;

int mts__parse_model(const mts__pb_src *src, mts_model *m, mts_err *err);
int mts__parse_tensor(const mts__pb_src *src, const uint8_t *p, size_t len, mts_pool *pool,
                      mts_tensor *t, const char **name, mts_err *err);

/* float16/bfloat16 models computed in float (half.c): the load-time rewrite, and the conversions
 * of graph inputs and outputs. */
int mts__lower_half(mts_model *m, const char *file, mts_err *err);
void mts__half_to_f32(mts_dtype dt, const uint16_t *src, float *dst, int64_t n);
void mts__f32_to_half(mts_dtype dt, const float *src, uint16_t *dst, int64_t n);

#endif
