/*
 * KServe BYTES tensors <-> the engine's string tensors, for every front end. A model whose graph
 * inputs or outputs are ONNX strings takes and returns them as KServe datatype BYTES: the front
 * end declares the input (mts_proto_input_decl gives a tensor of type MTS_DTYPE_STRINGS with the
 * client's shape), then turns its strings -- JSON strings, the binary form (each element a
 * 4-byte little-endian length and that many bytes, as HTTP binary_data and gRPC
 * raw_input_contents carry it) or gRPC bytes_contents -- into the engine's string blob
 * (engine/seqval.h) with one of the mts_bytes_in_* calls. The request then carries the blob
 * (dtype MTS_DTYPE_STRINGS, rank 1, dims[0] = its bytes); the scheduler reads the string
 * shape inside it. A string output comes back as such a blob and is written out as JSON strings
 * or in the binary form with the mts_bytes_out_* calls.
 *
 * Every count is checked against the shape before anything is allocated, and allocations are
 * bounded by the request's own size: a BYTES element takes at least 4 bytes in the binary form
 * and a JSON string at least 2, and a tensor holds at most MTS_BYTES_MAX_ELEMENTS strings.
 */
#ifndef MTS_API_BYTES_TENSOR_H
#define MTS_API_BYTES_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/server.h"
#include "util/json.h"
#include "util/tensor.h"

#define MTS_BYTES_MAX_ELEMENTS (1 << 24)

/* One string: bytes (not NUL-terminated). */
typedef struct mts_bytes_elem {
    const char *p;
    size_t len;
} mts_bytes_elem;

/* Builds the string blob for declared input t (type MTS_DTYPE_STRINGS, the client's shape in
 * rank/dims) from n strings: *owned gets the malloc'd blob and t becomes the blob tensor.
 * MTS_EINVAL with msg naming the input when n is not the shape's element count. */
int mts_bytes_in_elems(const char *name, mts_tensor *t, const mts_bytes_elem *e, int64_t n, void **owned, char *msg,
                       size_t len);
/* The same from the binary form p[0..size) (split by mts_embed_split_bytes); what names the
 * field in messages ("binary data", "raw_input_contents[0]"). */
int mts_bytes_in_binary(const char *name, mts_tensor *t, const uint8_t *p, size_t size, const char *what,
                        void **owned, char *msg, size_t len);
/* The same from a JSON data array of strings (nested row-major or flat). */
int mts_bytes_in_json(const char *name, mts_tensor *t, const mts_json *data, void **owned, char *msg, size_t len);

/* A string output, validated: its shape and strings. */
typedef struct mts_bytes_out {
    int rank;
    int64_t dims[MTS_MAX_RANK];
    int64_t count;
    const void *blob;
} mts_bytes_out;
/* Reads output t (a string blob); MTS_EINVAL with msg when it is malformed. */
int mts_bytes_out_view(const char *name, const mts_tensor *t, mts_bytes_out *o, char *msg, size_t len);
/* String i of o (*n bytes). */
const char *mts_bytes_out_at(const mts_bytes_out *o, int64_t i, size_t *n);
/* Bytes of o's binary form. */
size_t mts_bytes_out_binary_size(const mts_bytes_out *o);
/* Writes o's binary form into dst (mts_bytes_out_binary_size bytes). */
void mts_bytes_out_binary(const mts_bytes_out *o, void *dst);
/* JSON strings carry text: the index of the first string that is not valid UTF-8, or -1. */
int64_t mts_bytes_out_non_utf8(const mts_bytes_out *o);

/* Whether a model has string inputs or outputs: the scheduler runs its requests one at a time
 * (no dynamic batching), so its configuration reports max_batch_size 0 and full shapes. */
bool mts_bytes_status_has_strings(const mts_model_status *st);

#endif
