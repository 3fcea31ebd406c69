/*
 * libFuzzer target for the ONNX model reader (src/engine/onnx_pb.c, loader.c, graph checks):
 * loads the input as a model from memory on the reference backend with a small tensor cap.
 * When that succeeds and the model is small, it also compiles a plan for zero-filled inputs
 * (symbolic dimensions set to 1, at most 4096 elements each) and, when the plan's estimated
 * work is small (at most 2e6 FLOPs and 4 MiB of activations), runs it once on one thread.
 * Sequence and optional inputs get an empty sequence / an empty optional, string inputs empty
 * strings of the declared shape (engine/seqval.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/graph.h"
#include "engine/seqval.h"

#define FUZZ_MAX_INPUTS 8
#define FUZZ_MAX_ELEMS 4096
#define FUZZ_MAX_TENSOR_BYTES (4 << 20)

static int verbose = -1; /* MTS_FUZZ_VERBOSE=1: print how far each input got (for checking seeds) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (verbose < 0) verbose = getenv("MTS_FUZZ_VERBOSE") != NULL;
    mts_load_opts lo = {.max_tensor_bytes = FUZZ_MAX_TENSOR_BYTES, .backend = "reference"};
    mts_model *m = NULL;
    mts_err err = {0};
    if (mts_model_load_buffer(data, size, "fuzz.onnx", &lo, &m, &err) != 0) {
        if (verbose) fprintf(stderr, "fuzz_onnx: load: %s\n", err.msg);
        return 0;
    }
    mts_model_info info;
    mts_model_get_info(m, &info);
    mts_tensor in[FUZZ_MAX_INPUTS];
    memset(in, 0, sizeof in);
    int n_in = info.n_inputs;
    bool ok = n_in <= FUZZ_MAX_INPUTS && info.n_nodes <= 64 && info.n_outputs <= 16;
    for (int i = 0; ok && i < n_in; i++) {
        const mts_value *v = mts_model_input(m, i);
        if (mts_dtype_is_seq(v->dtype)) { /* an empty sequence or optional */
            int kind = v->dtype == MTS_DTYPE_SEQUENCE ? MTS_SEQ_SEQ : MTS_SEQ_OPT_NONE;
            int64_t nb = mts_seq_bytes(0, NULL);
            in[i] = (mts_tensor){.dtype = v->dtype, .rank = 1, .dims = {nb}, .data = calloc((size_t)nb, 1)};
            if (!in[i].data) ok = false;
            else mts_seq_write(in[i].data, kind, MTS_DTYPE_FLOAT, 0, NULL);
            continue;
        }
        if (v->dtype == MTS_DTYPE_STRINGS && v->rank >= 0 && v->rank <= MTS_MAX_RANK) { /* empty strings */
            mts_tensor shp = {MTS_DTYPE_UINT8, v->rank, {0}, NULL};
            for (int d = 0; d < v->rank; d++) shp.dims[d] = v->dims[d] < 0 ? 1 : v->dims[d];
            int64_t n = mts_tensor_numel(&shp), nb = n >= 0 && n <= FUZZ_MAX_ELEMS ? mts_str_bytes(n, 0) : -1;
            if (nb < 0 || !(in[i].data = calloc((size_t)nb, 1))) {
                ok = false;
                break;
            }
            in[i] = (mts_tensor){.dtype = v->dtype, .rank = 1, .dims = {nb}, .data = in[i].data};
            mts_str_begin(in[i].data, shp.rank, shp.dims, n);
            for (int64_t j = 0; j < n; j++) mts_str_put(in[i].data, n, j, 0);
            continue;
        }
        if (v->rank < 0 || v->rank > MTS_MAX_RANK || mts_dtype_size(v->dtype) == 0) {
            ok = false;
            break;
        }
        in[i].dtype = v->dtype;
        in[i].rank = v->rank;
        for (int d = 0; d < v->rank; d++) in[i].dims[d] = v->dims[d] < 0 ? 1 : v->dims[d];
        int64_t n = mts_tensor_numel(&in[i]);
        if (n < 0 || n > FUZZ_MAX_ELEMS) {
            ok = false;
            break;
        }
        in[i].data = calloc((size_t)n + 1, mts_dtype_size(v->dtype));
        if (!in[i].data) ok = false;
    }
    double flops = 0;
    int64_t act = 0;
    int rc = ok ? mts_model_analyze(m, in, n_in, &flops, &act, &err) : -1;
    if (rc == 0 && flops <= 2e6 && act <= FUZZ_MAX_TENSOR_BYTES) {
        mts_ctx *ctx = NULL;
        if ((rc = mts_ctx_create(m, 1, &ctx, &err)) == 0) {
            const mts_tensor *outs[16];
            rc = mts_ctx_run(ctx, in, n_in, outs, &err);
            mts_ctx_free(ctx);
        }
        if (verbose) fprintf(stderr, "fuzz_onnx: run: %s\n", rc ? err.msg : "ok");
    } else if (verbose) {
        fprintf(stderr, "fuzz_onnx: not run: %s\n", !ok ? "inputs over the caps" : rc ? err.msg : "over the work caps");
    }
    for (int i = 0; i < FUZZ_MAX_INPUTS; i++) free(in[i].data);
    mts_model_free(m);
    return 0;
}
