/*
 * Sequence and optional values (ONNX sequence(T) and optional(T)), and string tensors.
 *
 * The engine holds every value as an mts_tensor in a buffer its plan or context owns. A
 * sequence or optional value fits that scheme as a self-describing byte blob: a tensor of
 * element type MTS_DTYPE_SEQUENCE or MTS_DTYPE_OPTIONAL, rank 1, dims[0] = the blob's bytes.
 * Buffers, copies (If branch results, Loop-carried values), the per-tensor byte limit and the
 * planner's dynamic values then work unchanged; only the kernels that read or build sequences
 * look inside.
 *
 * Blob layout (host byte order, every field 8-byte aligned):
 *   header   magic (int64), kind (int32: enum mts_seq_kind), element type (int32), count (int64)
 *   entries  count x {rank, dims[MTS_MAX_RANK], offset, nbytes} (int64 each)
 *   data     element data, each at a 64-byte aligned offset from the blob start
 * A sequence is kind SEQ; an optional holds a tensor (OPT_TENSOR, count 1), a sequence
 * (OPT_SEQ: the sequence's entries) or nothing (OPT_NONE, count 0). Every reader validates the
 * whole layout (a blob may come from a hostile model through byte-moving ops), and a sequence
 * holds at most MTS_SEQ_MAX_ITEMS elements.
 *
 * A string tensor (ONNX element type string) is a blob of type MTS_DTYPE_STRINGS too, its shape
 * inside: magic, rank, dims[MTS_MAX_RANK], count (int64 each), then count + 1 offsets (int64,
 * from 0 to the total length) into the string bytes that follow. Strings are byte strings (UTF-8
 * in practice), not NUL-terminated.
 */
#ifndef MTS_ENGINE_SEQVAL_H
#define MTS_ENGINE_SEQVAL_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/tensor.h"
#include "util/status.h"

#define MTS_SEQ_MAX_ITEMS 65536

enum mts_seq_kind {
    MTS_SEQ_SEQ = 0,        /* a sequence */
    MTS_SEQ_OPT_TENSOR = 1, /* an optional holding a tensor */
    MTS_SEQ_OPT_SEQ = 2,    /* an optional holding a sequence */
    MTS_SEQ_OPT_NONE = 3,   /* an empty optional */
};

/* A validated view of a blob. */
typedef struct mts_seqv {
    int kind;          /* enum mts_seq_kind */
    mts_dtype elem;    /* element type (MTS_DTYPE_UNDEFINED: unknown, only when empty) */
    int64_t count;
    const uint8_t *base;
} mts_seqv;

/* True for the two sequence/optional blob types. */
static inline bool mts_dtype_is_seq(mts_dtype t)
{
    return t == MTS_DTYPE_SEQUENCE || t == MTS_DTYPE_OPTIONAL;
}
/* True for every blob type (sequence, optional, string tensor). */
static inline bool mts_dtype_is_blob(mts_dtype t)
{
    return t == MTS_DTYPE_SEQUENCE || t == MTS_DTYPE_OPTIONAL || t == MTS_DTYPE_STRINGS;
}

/* Validates blob t (type, rank 1, layout, element types and sizes) into *v. t->data must be set. */
int mts_seq_view(const mts_tensor *t, mts_seqv *v, mts_err *err);
/* Element i (0 <= i < v->count) as a tensor view into the blob. */
void mts_seq_item(const mts_seqv *v, int64_t i, mts_tensor *out);
/* Bytes of a blob holding `count` elements of these shapes (items may have NULL data);
 * -1 when a size overflows. */
int64_t mts_seq_bytes(int64_t count, const mts_tensor *const *items);
/* Writes a blob of `kind` with these elements into dst (mts_seq_bytes(count, items) bytes). */
void mts_seq_write(void *dst, int kind, mts_dtype elem, int64_t count, const mts_tensor *const *items);
/* The blob tensor's type for a kind: MTS_DTYPE_SEQUENCE for SEQ, MTS_DTYPE_OPTIONAL otherwise. */
mts_dtype mts_seq_dtype(int kind);

/* Whether node op_type (default domain) may take an input of blob type dt: sequences and
 * optionals go to the sequence and optional ops, Identity, If, Loop and SequenceMap; string
 * tensors to Identity, If, Loop (carried values), Cast, CastLike and StringNormalizer. The
 * engine declines any other op handed one (MTS_EUNSUPPORTED), so byte-moving kernels never see
 * a blob. */
bool mts_blob_op_accepts(const char *domain, const char *op_type, mts_dtype dt);

/* A validated string tensor. */
typedef struct mts_strv {
    int rank;
    int64_t dims[MTS_MAX_RANK];
    int64_t count;
    const uint8_t *base;
} mts_strv;
/* Validates string blob t (type, rank 1, shape, offsets) into *v. */
int mts_str_view(const mts_tensor *t, mts_strv *v, mts_err *err);
/* String i: its bytes (*len of them). */
const char *mts_str_at(const mts_strv *v, int64_t i, int64_t *len);
/* Bytes of a string blob of `count` strings of `total` bytes in all; -1 on overflow. */
int64_t mts_str_bytes(int64_t count, int64_t total);
/* Writes a string blob of shape (rank, dims) whose strings are s[i] (len[i] bytes). */
void mts_str_write(void *dst, int rank, const int64_t *dims, int64_t count, const char *const *s, const int64_t *len);
/* Incremental writing: mts_str_begin writes the header, then mts_str_put appends string i (in
 * order, i from 0) and returns where its len bytes go. */
void mts_str_begin(void *dst, int rank, const int64_t *dims, int64_t count);
char *mts_str_put(void *dst, int64_t count, int64_t i, int64_t len);
/* Parses a serialized TensorProto of type string into a string blob (data malloc'd). */
int mts_str_parse_pb(const void *data, size_t len, mts_tensor *t, mts_err *err);

/* Parses a serialized SequenceProto (declared == MTS_DTYPE_SEQUENCE) or OptionalProto
 * (MTS_DTYPE_OPTIONAL) of tensors, as in ONNX test data, into a blob tensor whose data is
 * malloc'd (free with free(t->data)). */
int mts_seq_parse_pb(const void *data, size_t len, mts_dtype declared, mts_tensor *t, mts_err *err);

#endif
