/*
 * The OpenAI-compatible embeddings endpoint:
 *
 *   POST /v1/embeddings  {"model": "m", "input": "text" | ["text", ...] | [id, ...] | [[id, ...], ...],
 *                         "encoding_format": "float" (default) | "base64"}
 *   -> {"object": "list", "data": [{"object": "embedding", "embedding": [...] | "<base64>",
 *       "index": i}, ...], "model": "m", "usage": {"prompt_tokens": N, "total_tokens": N}}
 *
 * base64 is the little-endian float32 bytes of each vector. Token-id inputs are used as given
 * (no special tokens added). `user` is accepted and ignored; `dimensions` is refused unless it
 * equals the model's. Errors are {"error": "..."}: 400 malformed body, empty or non-string
 * input, too many inputs (MTS_EMBED_MAX_TEXTS), a model that is not an embedding model; 404
 * unknown model; 429 queue full; 503 unavailable. Auth scope: infer.
 *
 * Also here: KServe v2 BYTES inference on embedding models (mts_embed_kserve_infer).
 */
#ifndef MTS_API_EMBED_HTTP_H
#define MTS_API_EMBED_HTTP_H

#include "api/router.h"

extern const mts_route mts_embed_routes[];

/* KServe v2 inference on an embedding model with texts (kserve_http.c hands every request to an
 * embedding model here first): one input of datatype BYTES, shape [N] or [N, 1], its elements in
 * "data" (JSON strings) or in the binary section (each a 4-byte little-endian length and the
 * bytes). The answer has one FP32 output [N, dim] named "embedding" (or the first requested
 * output's name), in JSON or, with binary_data_output / binary_data, in the binary section.
 * Returns false, answering nothing, when the request's first input is not BYTES (a tensor
 * request, run as any model's); true when it answered or will answer. */
bool mts_embed_kserve_infer(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const char *model,
                            int64_t arrival_ns);

#endif
