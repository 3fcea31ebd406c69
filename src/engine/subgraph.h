/*
 * Subgraphs of control-flow nodes (If, Loop, Scan): load-time checks of their structure, and
 * the runner the control-flow kernels use. A subgraph is loaded as a model of its own (its IR
 * in the root model's pool, its initializers in the root's mappings); its inputs are its formal
 * inputs followed by the outer-scope values it captures, which the owning node lists as its
 * last n_implicit inputs. Running one goes through the ordinary plan cache (one plan per input
 * signature) and an execution context kept per parent context, so a Loop body runs every
 * iteration without re-planning or re-allocating.
 */
#ifndef MTS_ENGINE_SUBGRAPH_H
#define MTS_ENGINE_SUBGRAPH_H

#include <stdbool.h>

#include "engine/kernels/kernel.h"

/* The subgraph of GRAPH attribute `name`, or NULL. */
mts_model *mts_subgraph(const mts_node *n, const char *name);
/* Formal inputs and outputs of a subgraph. */
int mts_subgraph_n_inputs(const mts_model *g);
int mts_subgraph_n_outputs(const mts_model *g);
/* Declared element type of output i (MTS_DTYPE_UNDEFINED when not declared). */
mts_dtype mts_subgraph_output_dtype(const mts_model *g, int i);
/* The model's limit on one tensor's bytes (what Loop and Scan outputs may grow to). */
int64_t mts_subgraph_max_bytes(const mts_model *g);

/* Load-time checks of a node with subgraphs (formal input and output counts of If branches,
 * Loop and Scan bodies); unknown ops with subgraphs are refused. file names the model. */
int mts__subgraph_check(const mts_model *m, const mts_node *n, const char *file, mts_err *err);

/* Load-time rewrites of a freshly loaded root model (nodes sorted and resolved, subgraphs
 * included; subgraph_rewrite.c): outer constants a subgraph captures become initializers of the
 * subgraph, and an If whose condition is known at load is replaced by the branch it takes
 * (MTS_IF_INLINE=0 keeps every If). */
int mts__subgraph_rewrite(mts_model *root, mts_err *err);

/* Output shapes of g for these formal inputs (shapes only; data may be NULL) and the node's
 * captured inputs, from g's plan: out[i] gets dtype/rank/dims, known[i] false when the shape
 * depends on run-time values. */
int mts_subgraph_shapes(mts_kctx *k, mts_model *g, const mts_tensor *formal, int n_formal, mts_tensor *out,
                        bool *known);

/* Runs g with these formal inputs (and the node's captured inputs). outs[i] are views valid
 * until g runs again in this context; with no context (plan time) a temporary one is made and
 * returned in *tmp, to free with mts_subgraph_tmp_free once the outputs have been read. */
int mts_subgraph_run(mts_kctx *k, mts_model *g, const mts_tensor *formal, int n_formal, const mts_tensor **outs,
                     void **tmp);
void mts_subgraph_tmp_free(void *tmp);
/* mts_subgraph_run computing g's static output i straight into dst[i].data when dst[i] has its
 * exact type and shape (other outputs: views as above). */
int mts_subgraph_run_into(mts_kctx *k, mts_model *g, const mts_tensor *formal, int n_formal, const mts_tensor *dst,
                          const mts_tensor **outs, void **tmp);

/* Per execution context and node: n owned tensors with growable buffers, kept between runs
 * (Loop/Scan state and results, an If branch run during shape inference). NULL without a
 * context. */
typedef struct mts_cf_state {
    int n;
    mts_tensor *t;
    int64_t *cap;
    mts_tensor *view; /* per entry: a view the kernel may set (not owned) */
    int ready;     /* results computed by infer, for run to copy */
} mts_cf_state;
mts_cf_state *mts_cf_state_get(mts_kctx *k, int n);
/* Makes t[i] hold `bytes` (keeps the contents when growing if keep). */
int mts_cf_reserve(mts_cf_state *s, int i, int64_t bytes, bool keep, mts_err *err);

#endif
