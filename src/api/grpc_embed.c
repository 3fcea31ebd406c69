/*
 * KServe v2 ModelInfer on an embedding model with texts (gRPC): one BYTES input, shape [N] or
 * [N, 1], its elements in contents.bytes_contents or in raw_input_contents[0] (each a 4-byte
 * little-endian length and the bytes). The texts go through the shared embedding path
 * (embed_common.h); the reply has one FP32 output [N, dim] named "embedding" (or the first
 * requested output's name) in raw_output_contents, as the HTTP front end's (embed_http.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/embed_common.h"
#include "api/grpc_internal.h"
#include "inference_kserve.pb-c.h"
#include "text/embed.h"

typedef struct gemb {
    mts__grpc_call *call;
    Inference__ModelInferRequest *msg;
    char out_name[MTS_TENSOR_NAME_MAX];
} gemb;

static void gemb_done(void *user, int status, const char *msg, float *vecs, int n, int64_t dim, int64_t tokens)
{
    (void)tokens;
    gemb *g = user;
    mts__grpc_call *c = g->call;
    if (status) {
        mts__grpc_fail_status(c, status, msg);
    } else {
        mts__grpc_arena a = {0};
        Inference__ModelInferResponse *r =
            MTS__GRPC_NEW(&a, Inference__ModelInferResponse, INFERENCE__MODEL_INFER_RESPONSE__INIT);
        r->model_name = g->msg->model_name;
        char ver[16];
        snprintf(ver, sizeof ver, "%d", mts_server_model_version(c->srv, g->msg->model_name));
        r->model_version = mts__grpc_strdup(&a, ver);
        r->id = g->msg->id;
        Inference__ModelInferResponse__InferOutputTensor *ot = MTS__GRPC_NEW(
            &a, Inference__ModelInferResponse__InferOutputTensor, INFERENCE__MODEL_INFER_RESPONSE__INFER_OUTPUT_TENSOR__INIT);
        ot->name = g->out_name;
        ot->datatype = (char *)"FP32";
        ot->n_shape = 2;
        ot->shape = mts__grpc_alloc(&a, 2 * sizeof(int64_t));
        ot->shape[0] = n;
        ot->shape[1] = dim;
        r->n_outputs = r->n_raw_output_contents = 1;
        r->outputs = mts__grpc_alloc(&a, sizeof *r->outputs);
        r->outputs[0] = ot;
        r->raw_output_contents = mts__grpc_alloc(&a, sizeof *r->raw_output_contents);
        r->raw_output_contents[0].data = (uint8_t *)vecs;
        r->raw_output_contents[0].len = sizeof(float) * (size_t)n * (size_t)dim;
        mts__grpc_reply(c, &r->base);
        mts__grpc_arena_free(&a);
    }
    free(vecs);
    inference__model_infer_request__free_unpacked(g->msg, NULL);
    free(g);
    mts__grpc_call_unref(c);
}

bool mts__grpc_embed_infer(mts__grpc_call *c, Inference__ModelInferRequest *m, int64_t arrival_ns)
{
    if (m->n_inputs < 1 || !m->inputs[0]->datatype || strcmp(m->inputs[0]->datatype, "BYTES") ||
        !mts_embed_is_model(c->srv, m->model_name))
        return false;
    char msg[MTS_ERR_MSG_MAX] = "";
    const Inference__ModelInferRequest__InferInputTensor *in0 = m->inputs[0];
    int64_t numel = 1;
    for (size_t d = 0; d < in0->n_shape; d++)
        numel = in0->shape[d] < 0 || in0->shape[d] > MTS_EMBED_MAX_TEXTS || numel < 0 ? -1 : numel * in0->shape[d];
    bool raw = m->n_raw_input_contents > 0;
    if (m->n_inputs != 1)
        snprintf(msg, sizeof msg, "an embedding model takes one BYTES input holding the texts (got %zu inputs)",
                 m->n_inputs);
    else if (in0->n_shape < 1 || in0->n_shape > 2 || numel < 0 || (in0->n_shape == 2 && in0->shape[1] != 1))
        snprintf(msg, sizeof msg, "input '%s': shape must be [N] or [N, 1] with N texts (1 to %d)", in0->name,
                 MTS_EMBED_MAX_TEXTS);
    else if (raw && (m->n_raw_input_contents != 1 || (in0->contents && in0->contents->n_bytes_contents)))
        snprintf(msg, sizeof msg, "input '%s': give the texts in contents.bytes_contents or in one "
                 "raw_input_contents entry, not both", in0->name);
    else if (m->n_outputs > 1)
        snprintf(msg, sizeof msg, "an embedding model has one output; 'outputs' lists at most one");
    mts_embed_input *in = msg[0] ? NULL : calloc(MTS_EMBED_MAX_TEXTS, sizeof *in);
    int n = 0;
    if (!msg[0] && !in) snprintf(msg, sizeof msg, "out of memory");
    if (!msg[0] && raw) {
        n = mts_embed_split_bytes(m->raw_input_contents[0].data, m->raw_input_contents[0].len, in,
                                  MTS_EMBED_MAX_TEXTS, msg, sizeof msg);
    } else if (!msg[0]) {
        size_t k = in0->contents ? in0->contents->n_bytes_contents : 0;
        if (k > MTS_EMBED_MAX_TEXTS) {
            snprintf(msg, sizeof msg, "%zu texts; at most %d per request", k, MTS_EMBED_MAX_TEXTS);
        } else {
            for (size_t i = 0; i < k; i++) {
                in[i].text = (const char *)in0->contents->bytes_contents[i].data;
                in[i].len = in0->contents->bytes_contents[i].len;
            }
            n = (int)k;
        }
    }
    if (!msg[0] && n >= 0 && n != numel)
        snprintf(msg, sizeof msg, "input '%s': shape says %lld texts, the data has %d", in0->name, (long long)numel, n);
    gemb *g = msg[0] ? NULL : calloc(1, sizeof *g);
    if (!msg[0] && !g) snprintf(msg, sizeof msg, "out of memory");
    if (msg[0]) {
        free(in);
        mts__grpc_fail_status(c, MTS_EINVAL, msg);
        inference__model_infer_request__free_unpacked(m, NULL);
        return true;
    }
    g->call = c;
    g->msg = m;
    snprintf(g->out_name, sizeof g->out_name, "%s", m->n_outputs ? m->outputs[0]->name : "embedding");
    mts__grpc_call_ref(c);
    int rc = mts_embed_submit(c->srv, m->model_name, in, n, arrival_ns, NULL, gemb_done, g, msg, sizeof msg);
    free(in);
    if (rc) {
        mts__grpc_fail_status(c, rc, msg);
        inference__model_infer_request__free_unpacked(m, NULL);
        free(g);
        mts__grpc_call_unref(c);
    }
    return true;
}
