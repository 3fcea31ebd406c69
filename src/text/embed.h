/*
 * Sentence embeddings on top of an encoder model (BERT-style ONNX): the parts shared by the
 * server (api/embed_common.c) and the command line (cli/cli_embed.c). An mts_embedder binds a
 * model's embedding settings (config.h: tokenizer, pooling, normalize, max_tokens, input and
 * output names) to the model's declared inputs and outputs; with it a caller tokenizes texts,
 * picks each text's length bucket, fills the padded int64 input batch and pools the model's
 * output into one float32 vector per text.
 *
 * Length buckets: a batch is padded to the bucket of its longest text, the next power of two
 * from MTS_EMBED_MIN_BUCKET up to max_tokens (or the model's fixed sequence length). Texts of
 * one bucket have the same input shape, so the scheduler batches them across requests, and short
 * texts never pay for long ones.
 */
#ifndef MTS_TEXT_EMBED_H
#define MTS_TEXT_EMBED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "serve/server.h"
#include "text/tokenizer.h"
#include "util/tensor.h"

#define MTS_EMBED_MIN_BUCKET 8
#define MTS_EMBED_DEFAULT_MAX_TOKENS 512
#define MTS_EMBED_MAX_TEXTS 2048         /* texts in one request */
#define MTS_EMBED_MAX_TEXT_BYTES (1 << 20) /* bytes of one text */

typedef struct mts_embedder {
    int pooling;                            /* MTS_POOL_* */
    bool normalize;
    int max_tokens;                         /* per text, after the model's fixed length */
    int fixed_len;                          /* the model's sequence length when fixed, else 0 */
    int64_t pad_id;
    char ids_name[MTS_TENSOR_NAME_MAX];
    char mask_name[MTS_TENSOR_NAME_MAX];    /* "" when the model has none */
    char types_name[MTS_TENSOR_NAME_MAX];   /* "" when the model has none */
    char out_name[MTS_TENSOR_NAME_MAX];
    int n_inputs;                           /* 1 to 3 */
} mts_embedder;

/* The max_tokens a model config asks for (its key, else the default). */
int mts_embed_config_max_tokens(const mts_model_config *m);

/* Resolves the inputs and output of an embedding model from its declared signature: configured
 * names must exist; otherwise input_ids is the input called "input_ids" (or the only int64 input
 * of three that is neither mask nor type ids), attention_mask and token_type_ids by name, the
 * output is the first one. Every input must be an int64 [batch, sequence] and be one of these
 * three. Returns 0, or -1 with the reason in err. */
int mts_embedder_init(mts_embedder *e, const mts_model_config *m, int64_t pad_id, int n_in,
                      const mts_tensor_meta *in, int n_out, const mts_tensor_meta *out, char *err, size_t errlen);

/* The padded length of a batch whose longest text has n tokens. */
int mts_embed_bucket(const mts_embedder *e, int n);

/* Fills the k x len input rows: ids[i] (n[i] tokens, n[i] <= len) then pad_id, mask 1 then 0,
 * type ids (types[i] may be NULL: zeros). ids_out, mask_out, types_out hold k * len each
 * (mask_out / types_out may be NULL when the model lacks them). */
void mts_embed_fill(const mts_embedder *e, int k, int len, const int64_t *const *ids, const int64_t *const *types,
                    const int *n, int64_t *ids_out, int64_t *mask_out, int64_t *types_out);

/* The vector dimension output t of a batch of k texts padded to len gives (its last dim), or -1
 * with the reason in err when it is not float32 [k, len, H] or [k, H]. */
int64_t mts_embed_output_dim(const mts_tensor *t, int k, int len, char *err, size_t errlen);

/* Pools output t (checked by mts_embed_output_dim) of a batch of k texts padded to len (n[i]
 * real tokens each) into dst[k * dim]: rank 3 [k, len, H] is pooled (mean over the real tokens,
 * the first token, or the last real token), rank 2 [k, H] is taken as is; then L2-normalized
 * when configured. */
void mts_embed_pool(const mts_embedder *e, const mts_tensor *t, int k, int len, const int *n, float *dst);

/* The OpenAI embeddings document ({"object": "list", "data": [{"object": "embedding",
 * "embedding", "index"}...], "model", "usage"}) of n vectors of dim floats; b64: each embedding
 * as base64 of its little-endian float32 bytes. A malloc'd text (its length in *len), or NULL
 * when out of memory. Used by POST /v1/embeddings and `mtserve embed --json`. */
char *mts_embed_openai_json(const char *model, const float *vecs, int n, int64_t dim, int64_t tokens, bool b64,
                            size_t *len);

#endif
