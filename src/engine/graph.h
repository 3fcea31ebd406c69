/*
 * The graph IR built by the loader: values (every named tensor: graph inputs, initializers,
 * node outputs), nodes in topological order with their attributes, and the model that owns
 * them. Everything here is immutable once mts_model_load returns; plans and execution contexts
 * only read it.
 */
#ifndef MTS_ENGINE_GRAPH_H
#define MTS_ENGINE_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/tensor.h"

/* Attribute types, numbered as ONNX's AttributeProto.AttributeType. */
typedef enum mts_attr_type {
    MTS_ATTR_UNDEFINED = 0,
    MTS_ATTR_FLOAT = 1,
    MTS_ATTR_INT = 2,
    MTS_ATTR_STRING = 3,
    MTS_ATTR_TENSOR = 4,
    MTS_ATTR_GRAPH = 5,
    MTS_ATTR_FLOATS = 6,
    MTS_ATTR_INTS = 7,
    MTS_ATTR_STRINGS = 8,
} mts_attr_type;

typedef struct mts_attr {
    const char *name;
    mts_attr_type type;
    float f;
    int64_t i;
    const char *s;        /* NUL-terminated copy of a STRING attribute */
    int n;                /* element count of floats / ints / strings */
    const float *floats;
    const int64_t *ints;
    const char *const *strings; /* STRINGS: NUL-terminated copies */
    const mts_tensor *t;  /* TENSOR attribute (data owned by the model) */
    struct mts_model *g;  /* GRAPH attribute: the subgraph, loaded as a model of its own whose
                           * inputs are its formal inputs followed by the outer-scope values it
                           * captures (engine/subgraph.h) */
} mts_attr;

typedef struct mts_node {
    const char *name;     /* never NULL: "" when the file has none */
    const char *op_type;
    const char *domain;   /* "" for the default ONNX domain */
    int opset;            /* opset version in force for the node's domain */
    int n_in, n_out;
    int *in;              /* value indices; -1 marks an omitted optional input */
    int n_implicit;       /* the last n_implicit inputs are outer-scope values its subgraphs
                           * read (If/Loop/Scan), listed so that liveness and order see them */
    int *out;
    int n_attr;
    mts_attr *attrs;
} mts_node;

typedef enum mts_value_kind {
    MTS_VALUE_INTERMEDIATE = 0,
    MTS_VALUE_INPUT,        /* graph input supplied by the caller */
    MTS_VALUE_INITIALIZER,  /* constant weight from the file */
} mts_value_kind;

typedef struct mts_value {
    const char *name;
    mts_value_kind kind;
    /* Declared type and shape (graph inputs/outputs/value_info). dims[i] < 0 marks a symbolic
     * or unknown dimension; dim_params[i] names it when the file does. rank -1: unknown. */
    mts_dtype dtype;
    int rank;
    int64_t dims[MTS_MAX_RANK];
    const char *dim_params[MTS_MAX_RANK];
    mts_tensor init;        /* INITIALIZER only: the constant (data in mmap or owned copy) */
    int producer;           /* node index, -1 for inputs and initializers */
} mts_value;

typedef struct mts_model mts_model;

/* Attribute lookup helpers: the default is returned when the attribute is absent. */
const mts_attr *mts_node_attr(const mts_node *n, const char *name);
int64_t mts_attr_int(const mts_node *n, const char *name, int64_t dflt);
float mts_attr_float(const mts_node *n, const char *name, float dflt);
const char *mts_attr_string(const mts_node *n, const char *name, const char *dflt);
/* Returns the INTS array (and its length in *n_out) or NULL when absent. */
const int64_t *mts_attr_ints(const mts_node *n, const char *name, int *n_out);
const float *mts_attr_floats(const mts_node *n, const char *name, int *n_out);
/* Returns the STRINGS array (and its length in *n_out) or NULL when absent. */
const char *const *mts_attr_strings(const mts_node *n, const char *name, int *n_out);

#endif
