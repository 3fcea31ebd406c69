/*
 * Texts in, vectors out, through the scheduler: the embedding path every front end shares
 * (POST /v1/embeddings, KServe v2 BYTES inputs over HTTP and gRPC). mts_embed_submit tokenizes
 * the texts (the model's tokenizer is loaded once and kept), makes sure the model is loaded so
 * its signature is known, groups the texts by length bucket (text/embed.h), submits one request
 * per bucket (split at the model's max_batch) so that the scheduler's dynamic batching joins
 * same-bucket texts of concurrent requests, pools each batch's output on the worker thread and,
 * once every part is back, hands the vectors to the caller.
 */
#ifndef MTS_API_EMBED_COMMON_H
#define MTS_API_EMBED_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "serve/server.h"

/* The answer: status 0 with n vectors of dim floats in text order (vecs is the caller's to
 * free), tokens counted over all texts; or an MTS_E* status (MTS_EFULL: retry later) and msg.
 * Runs exactly once, on a worker or loader thread, or inside mts_embed_submit. */
typedef void (*mts_embed_done)(void *user, int status, const char *msg, float *vecs, int n, int64_t dim,
                               int64_t tokens);

/* One text: bytes (UTF-8, not NUL-terminated), or token ids already (ids != NULL). */
typedef struct mts_embed_input {
    const char *text;
    size_t len;
    const int64_t *ids;
    int n_ids;
} mts_embed_input;

/* Whether model is configured as an embedding model (has a tokenizer). */
bool mts_embed_is_model(const mts_server *s, const char *model);

/* Starts embedding n texts with model (the texts are read before it returns). Returns 0 when
 * done will be called, or an MTS_E* status with msg set and done not called: MTS_ENOTFOUND
 * unknown model, MTS_EINVAL not an embedding model / no texts / too many / a text too long or
 * not valid for the tokenizer, MTS_EUNAVAILABLE the tokenizer does not load. cancel (may be
 * NULL) is a request the front end marks cancelled when its client goes away (mts_request_cancel):
 * parts not yet submitted are then dropped and done gets MTS_ECANCELLED; it must stay valid until
 * done has run. */
int mts_embed_submit(mts_server *s, const char *model, const mts_embed_input *in, int n, int64_t arrival_ns,
                     const mts_request *cancel, mts_embed_done done, void *user, char *msg, size_t msglen);

/* Splits a KServe BYTES tensor's binary form (each element a 4-byte little-endian length and
 * that many bytes) into texts pointing into p: returns the count, or -1 with msg saying which
 * element is truncated or too long. At most cap elements. */
int mts_embed_split_bytes(const uint8_t *p, size_t len, mts_embed_input *out, int cap, char *msg, size_t msglen);

/* Frees the tokenizers kept for the server's models (at shutdown). */
void mts_embed_shutdown(void);

#endif
