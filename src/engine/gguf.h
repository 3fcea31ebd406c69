/*
 * GGUF reader (the file format of llama.cpp / ggml): the header (magic "GGUF", versions 2 and 3,
 * little-endian), the metadata key/values of every type (scalars, strings, arrays of scalars or
 * strings; an array of arrays is refused), the tensor infos and the data section at
 * `general.alignment` (default 32). Tensors of type F32, F16, BF16 and Q8_0 are dequantized to
 * float32 on request. The file is not copied: the parsed view points into the caller's bytes,
 * which must outlive it.
 *
 * Every count, length, offset, dimension and type is checked against the file's size and fixed
 * caps before anything is allocated from it; an error names what is wrong and its byte offset.
 * gguf_bert.c turns a BERT-architecture file into an ONNX model (mts_gguf_to_onnx);
 * text/tokenizer_gguf.c builds its WordPiece tokenizer from the metadata.
 */
#ifndef MTS_ENGINE_GGUF_H
#define MTS_ENGINE_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "engine/onnx_write.h"
#include "util/status.h"

#define MTS_GGUF_MAX_TENSORS 65536
#define MTS_GGUF_MAX_KV 65536
#define MTS_GGUF_MAX_DIMS 4
#define MTS_GGUF_MAX_NAME 256        /* bytes of a tensor name (ggml's own limit is 64) */
#define MTS_GGUF_MAX_KEY 65536       /* bytes of a metadata key */

/* Metadata value types (the file's numbering). */
enum {
    MTS_GGUF_U8 = 0, MTS_GGUF_I8, MTS_GGUF_U16, MTS_GGUF_I16, MTS_GGUF_U32, MTS_GGUF_I32, MTS_GGUF_F32,
    MTS_GGUF_BOOL, MTS_GGUF_STRING, MTS_GGUF_ARRAY, MTS_GGUF_U64, MTS_GGUF_I64, MTS_GGUF_F64,
};
/* Tensor types read (ggml's numbering). */
enum { MTS_GGML_F32 = 0, MTS_GGML_F16 = 1, MTS_GGML_Q8_0 = 8, MTS_GGML_BF16 = 30 };

typedef struct mts_gguf_kv {
    const char *key;       /* NUL-terminated copy */
    int type;              /* MTS_GGUF_* */
    int arr_type;          /* element type of an array */
    uint64_t count;        /* elements of an array (1 for a scalar) */
    size_t off;            /* byte offset of the value (an array: of its first element) */
    int64_t i;             /* integer and bool values */
    double f;              /* float values */
    const char *s;         /* string value (not NUL-terminated), s_len bytes */
    size_t s_len;
    size_t key_at;         /* offset of the key in the names arena */
} mts_gguf_kv;

typedef struct mts_gguf_tensor {
    const char *name;      /* NUL-terminated copy */
    int n_dims;
    int64_t ne[MTS_GGUF_MAX_DIMS]; /* ggml order: ne[0] is the fastest-varying dimension */
    int64_t numel;
    int type;              /* MTS_GGML_* */
    uint64_t offset;       /* from the start of the data section */
    size_t bytes;
    const uint8_t *data;
    size_t info_off;       /* byte offset of the tensor's info, for messages */
    size_t name_at;        /* offset of the name in the names arena */
} mts_gguf_tensor;

typedef struct mts_gguf {
    const uint8_t *bytes;
    size_t len;
    const char *file;
    uint32_t version;
    uint32_t alignment;
    size_t data_off;
    mts_gguf_kv *kv;
    int n_kv;
    mts_gguf_tensor *tensors;
    int n_tensors;
    char *names;           /* arena of the keys and names */
} mts_gguf;

/* Whether bytes[0..len) starts with the GGUF magic. */
int mts_gguf_is(const void *bytes, size_t len);
/* Parses the file (kept, not copied). Returns 0, or an error naming the problem and its offset. */
int mts_gguf_parse(mts_gguf *g, const void *bytes, size_t len, const char *file, mts_err *err);
void mts_gguf_free(mts_gguf *g);

const mts_gguf_kv *mts_gguf_find(const mts_gguf *g, const char *key);
/* Integer value of key (any integer or bool type); dflt when absent; -1 + error when of another
 * type. */
int mts_gguf_get_int(const mts_gguf *g, const char *key, int64_t dflt, int64_t *out, mts_err *err);
int mts_gguf_get_float(const mts_gguf *g, const char *key, double dflt, double *out, mts_err *err);
/* String value of key, or NULL (absent, or not a string). */
const char *mts_gguf_get_str(const mts_gguf *g, const char *key, size_t *len);
/* Walks the strings of an array of strings: *pos starts at kv->off; returns the next string
 * (len in *n) and advances *pos. The array was checked by mts_gguf_parse. */
const char *mts_gguf_next_str(const mts_gguf *g, size_t *pos, size_t *n);
/* Element i of an array of integers, or dflt when kv is not one or i is out of range. */
int64_t mts_gguf_arr_int(const mts_gguf *g, const mts_gguf_kv *kv, uint64_t i, int64_t dflt);

const mts_gguf_tensor *mts_gguf_tensor_find(const mts_gguf *g, const char *name);
/* The float32 values of tensor t (malloc'd, t->numel of them), or NULL + error. */
float *mts_gguf_tensor_f32(const mts_gguf *g, const mts_gguf_tensor *t, mts_err *err);
const char *mts_ggml_type_name(int type);

/* A BERT-architecture GGUF file (general.architecture "bert") as an ONNX ModelProto in out:
 * inputs input_ids, attention_mask, token_type_ids (int64 [N, S]), output last_hidden_state
 * (float [N, S, H]), the op pattern of a Hugging Face BERT export, all weights float32. Missing
 * tensors, shapes that do not fit the hyperparameters and other architectures are errors. */
int mts_gguf_to_onnx(const void *bytes, size_t len, const char *file, mts_pbw *out, mts_err *err);
/* The embedding defaults a BERT GGUF file carries, read from its metadata only: the pooling
 * (bert.pooling_type: 1 mean, 2 cls, 3 last; 0 none or absent) and the longest sequence
 * (bert.context_length; 0 absent). Returns 0, or -1 when the file cannot be read (both 0). */
int mts_gguf_embed_defaults(const char *path, int *pooling, int64_t *context_length);

#endif
