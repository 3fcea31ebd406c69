/*
 * Sequence and optional values (ONNX sequence(T) and optional(T)).
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

/* True for the two blob types. */
static inline bool mts_dtype_is_seq(mts_dtype t)
{
    return t == MTS_DTYPE_SEQUENCE || t == MTS_DTYPE_OPTIONAL;
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

/* Whether node op_type (default domain) may take sequence or optional inputs: the sequence and
 * optional ops, Identity, If, Loop and SequenceMap. The engine declines any other op handed one
 * (MTS_EUNSUPPORTED), so byte-moving kernels never see a blob. */
bool mts_seq_op_accepts(const char *domain, const char *op_type);

/* Parses a serialized SequenceProto (declared == MTS_DTYPE_SEQUENCE) or OptionalProto
 * (MTS_DTYPE_OPTIONAL) of tensors, as in ONNX test data, into a blob tensor whose data is
 * malloc'd (free with free(t->data)). */
int mts_seq_parse_pb(const void *data, size_t len, mts_dtype declared, mts_tensor *t, mts_err *err);

#endif
