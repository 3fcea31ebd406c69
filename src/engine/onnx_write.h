/*
 * An editable view of an ONNX model at the protobuf wire level, and its writer: read a
 * ModelProto into lists of nodes, initializers and graph outputs (each keeping the bytes of its
 * original message), edit those lists (rename a node's inputs and outputs, drop nodes or
 * initializers, add new ones), and write the model back. Everything that is not edited is copied
 * byte for byte from the original file (attributes, value_info, metadata, the tensors' data), so
 * a rewrite never has to understand fields it does not touch. `mtserve quantize` uses it to
 * emit QDQ models and calibration models with extra graph outputs.
 */
#ifndef MTS_ENGINE_ONNX_WRITE_H
#define MTS_ENGINE_ONNX_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "util/pool.h"
#include "util/status.h"
#include "util/tensor.h"

/* A growable output buffer with protobuf encoders. */
typedef struct mts_pbw {
    uint8_t *p;
    size_t len, cap;
    int oom; /* an allocation failed: every later put is a no-op */
} mts_pbw;

void mts_pbw_varint(mts_pbw *w, uint64_t v);
void mts_pbw_raw(mts_pbw *w, const void *data, size_t len);
void mts_pbw_tag(mts_pbw *w, uint32_t field, uint32_t wt);
void mts_pbw_bytes(mts_pbw *w, uint32_t field, const void *data, size_t len); /* LEN field */
void mts_pbw_str(mts_pbw *w, uint32_t field, const char *s);
void mts_pbw_int(mts_pbw *w, uint32_t field, int64_t v); /* VARINT field */
void mts_pbw_free(mts_pbw *w);

/* One attribute of a node, decoded for lookups (INT, FLOAT; others only named). */
typedef struct mts_onnx_attr {
    const char *name;
    int type; /* AttributeProto.AttributeType: 1 FLOAT, 2 INT, ... */
    float f;
    int64_t i;
} mts_onnx_attr;

typedef struct mts_onnx_node {
    const char *op_type, *domain, *name;
    const char **in, **out; /* editable; "" for an omitted input */
    int n_in, n_out;
    mts_onnx_attr *attrs;
    int n_attrs;
    const uint8_t *raw; /* original NodeProto bytes; NULL for a new node */
    size_t raw_len;
    int64_t new_axis;   /* new nodes: value of an "axis" attribute, INT64_MIN for none */
    int dropped;
} mts_onnx_node;

typedef struct mts_onnx_init {
    const char *name;
    int dtype;
    int rank;
    int64_t dims[MTS_MAX_RANK];
    const uint8_t *raw; /* original TensorProto bytes; NULL for a new initializer */
    size_t raw_len;
    const void *data;   /* little-endian element data: raw_data of the original, or new data */
    size_t data_len;
    const uint8_t *float_data; /* original float_data payload (packed) when it has no raw_data */
    size_t float_data_len;
    int external;       /* data lives in an external file */
    int dropped;
} mts_onnx_init;

typedef struct mts_onnx_doc {
    const uint8_t *bytes; /* the original file (not owned) */
    size_t len;
    const char *file;     /* for messages */
    mts_pool pool;        /* names, arrays, new data */
    int64_t opset;        /* default-domain opset import (0: none) */
    int64_t new_opset;    /* written instead of opset when > opset */
    mts_onnx_node *nodes;
    int n_nodes, cap_nodes;
    mts_onnx_init *inits;
    int n_inits, cap_inits;
    const char **inputs;  /* graph input names */
    int n_inputs;
    const char **outputs; /* graph output names; those at index >= n_orig_outputs are new (float) */
    const uint8_t **out_raw;
    size_t *out_raw_len;
    int n_outputs, cap_outputs, n_orig_outputs;
} mts_onnx_doc;

/* Reads the model in bytes[0..len) (kept, not copied: it must outlive the doc). Rejects
 * malformed wire data with a message naming the message and byte offset. */
int mts_onnx_doc_read(mts_onnx_doc *d, const void *bytes, size_t len, const char *file, mts_err *err);
void mts_onnx_doc_free(mts_onnx_doc *d);

/* Appends a new node (inputs/outputs copied into the pool); NULL when out of memory. The
 * returned pointer is valid until the next append. axis: INT64_MIN for no "axis" attribute. */
mts_onnx_node *mts_onnx_add_node(mts_onnx_doc *d, const char *op_type, const char *const *in, int n_in,
                                 const char *const *out, int n_out, int64_t axis);
/* Appends a new initializer whose data (copied) is nbytes of little-endian elements. */
mts_onnx_init *mts_onnx_add_init(mts_onnx_doc *d, const char *name, int dtype, int rank, const int64_t *dims,
                                 const void *data, size_t nbytes);
/* Appends a float graph output named name (a value computed by the graph). */
int mts_onnx_add_output(mts_onnx_doc *d, const char *name);
/* Pool copy of a string. */
const char *mts_onnx_str(mts_onnx_doc *d, const char *s);
/* The float elements of initializer t (malloc'd, n of them), or NULL when t is not a float
 * tensor with data in the file. */
float *mts_onnx_init_floats(const mts_onnx_init *t, int64_t *n);
const mts_onnx_attr *mts_onnx_attr_find(const mts_onnx_node *n, const char *name);

/* Serializes the model: the original ModelProto with the edited graph; nodes are written in
 * the order given by order[0..n_order) (indices into d->nodes; dropped nodes are skipped). */
int mts_onnx_doc_write(const mts_onnx_doc *d, const int *order, int n_order, mts_pbw *out, mts_err *err);

#endif
