/*
 * libFuzzer target for the gRPC front ends' request path (src/api/grpc_kserve.c and
 * grpc_lipsync.c): protobuf-c unpacking of the message and the checks that turn it into a
 * server request, against a real server core (no network, no gRPC runtime) that serves two
 * preloaded models from the seed corpus: "tiny" (tests/fuzz/corpus/fuzz_onnx/add_relu.onnx)
 * and the lip-sync-shaped "lip" (lipsync_tiny.onnx). Requests are checked, never submitted.
 * The first input byte picks the message: 0 ModelInferRequest, 1 InferBatchRequest,
 * 2 CompositeBatchRequest (modulo 3).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "api/grpc_internal.h"
#include "config/config.h"
#include "serve/server.h"

static mts_config cfg;
static mts_server *srv;
static int verbose; /* MTS_FUZZ_VERBOSE=1: print each request's outcome (for checking seeds) */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *dir = getenv("MTS_FUZZ_MODELS");
    verbose = getenv("MTS_FUZZ_VERBOSE") != NULL;
    char text[2048];
    if (!dir) dir = MTS_SOURCE_DIR "/tests/fuzz/corpus/fuzz_onnx";
    int n = snprintf(text, sizeof text,
                     "server:\n  worker_count: 1\nmodels:\n"
                     "  tiny:\n    model_path: \"%s/add_relu.onnx\"\n    preload: true\n"
                     "  lip:\n    model_path: \"%s/lipsync_tiny.onnx\"\n    preload: true\n",
                     dir, dir);
    mts_err err = {0};
    if (mts_config_parse_yaml(text, (size_t)n, "fuzz.yaml", &cfg, NULL, NULL, &err) ||
        mts_config_finalize(&cfg, &err) || mts_server_create(&cfg, &srv, &err)) {
        fprintf(stderr, "fuzz_grpc: cannot start the server core: %s\n", err.msg);
        exit(1);
    }
    /* wait (up to 10 s) until both models are loaded, so their signatures are known */
    mts_model_status *st = malloc(sizeof *st);
    for (int i = 0; st && i < 1000; i++) {
        if (!mts_server_model_status_by_name(srv, "tiny", st) && st->n_inputs > 0 &&
            !mts_server_model_status_by_name(srv, "lip", st) && st->n_inputs > 0)
            break;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    free(st);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    char msg[600] = "";
    int rc;
    switch (data[0] % 3) {
    case 0: rc = mts__grpc_kserve_check_infer(srv, data + 1, size - 1, msg, sizeof msg); break;
    case 1: rc = mts__grpc_lipsync_check(srv, false, data + 1, size - 1, msg, sizeof msg); break;
    default: rc = mts__grpc_lipsync_check(srv, true, data + 1, size - 1, msg, sizeof msg); break;
    }
    if (verbose) fprintf(stderr, "fuzz_grpc: message %d: status %d: %s\n", data[0] % 3, rc, rc ? msg : "ok");
    return 0;
}
