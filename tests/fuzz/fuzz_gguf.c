/*
 * libFuzzer target for the GGUF reader (src/engine/gguf.c), its BERT-to-ONNX mapping
 * (gguf_bert.c, then the ordinary ONNX loader) and the GGUF tokenizer (text/tokenizer_gguf.c):
 * the input is a GGUF file. It is parsed on its own (every tensor dequantized when the file is
 * small), loaded as a model on the reference backend with a small tensor cap, run once on a
 * [1, 4] batch of token id 0 when that is cheap, and its vocabulary built and used to encode a
 * short text; every id the tokenizer returns must lie inside the vocabulary.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/gguf.h"
#include "text/tokenizer.h"

#define FUZZ_MAX_TENSOR_BYTES (4 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("MTS_FUZZ_VERBOSE") != NULL;
    mts_err err = {0};
    mts_gguf g;
    if (mts_gguf_parse(&g, data, size, "fuzz.gguf", &err) == 0) {
        int64_t total = 0;
        for (int i = 0; i < g.n_tensors; i++) total += g.tensors[i].numel;
        for (int i = 0; i < g.n_tensors && total <= (1 << 20); i++) {
            float *v = mts_gguf_tensor_f32(&g, &g.tensors[i], &err);
            if (!v) abort(); /* every parsed tensor has a readable type and its data in the file */
            free(v);
        }
        mts_gguf_free(&g);
    } else if (verbose) {
        fprintf(stderr, "fuzz_gguf: parse: %s\n", err.msg);
    }

    mts_load_opts lo = {.max_tensor_bytes = FUZZ_MAX_TENSOR_BYTES, .backend = "reference"};
    mts_model *m = NULL;
    if (mts_model_load_buffer(data, size, "fuzz.gguf", &lo, &m, &err) == 0) {
        int64_t ids[4] = {0}, mask[4] = {1, 1, 1, 1}, types[4] = {0};
        mts_tensor in[3] = {{MTS_DTYPE_INT64, 2, {1, 4}, ids}, {MTS_DTYPE_INT64, 2, {1, 4}, mask},
                            {MTS_DTYPE_INT64, 2, {1, 4}, types}};
        double flops = 0;
        int64_t act = 0;
        int rc = mts_model_analyze(m, in, 3, &flops, &act, &err);
        if (rc == 0 && flops <= 2e6 && act <= FUZZ_MAX_TENSOR_BYTES) {
            mts_ctx *ctx = NULL;
            if ((rc = mts_ctx_create(m, 1, &ctx, &err)) == 0) {
                const mts_tensor *outs[4];
                rc = mts_ctx_run(ctx, in, 3, outs, &err);
                mts_ctx_free(ctx);
            }
        }
        if (verbose) fprintf(stderr, "fuzz_gguf: model loaded; run: %s\n", rc ? err.msg : "ok");
        mts_model_free(m);
    } else if (verbose) {
        fprintf(stderr, "fuzz_gguf: model: %s\n", err.msg);
    }

    char msg[512];
    mts_tokenizer *t = mts_tokenizer_load_gguf_mem(data, size, -1, msg, sizeof msg);
    if (t) {
        static const char text[] = "Hello worlds, caf\xc3\xa9 [SEP] x";
        int64_t out[64];
        int k = mts_tokenize(t, text, sizeof text - 1, 0, out, NULL, 64, msg, sizeof msg);
        for (int i = 0; i < k; i++)
            if (out[i] < 0 || out[i] >= mts_tokenizer_vocab_size(t)) abort();
        mts_tokenizer_free(t);
    } else if (verbose) {
        fprintf(stderr, "fuzz_gguf: tokenizer: %s\n", msg);
    }
    return 0;
}
