/*
 * libFuzzer target for the TensorProto reader (mts_tensor_parse_pb in src/engine/onnx_pb.c, the
 * .pb files of ONNX test data that mts-conformance and `mtserve run --input` read): parses the
 * input and reads back every byte of the tensor.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    mts_tensor t;
    memset(&t, 0, sizeof t);
    char *name = NULL;
    mts_err err = {0};
    if (mts_tensor_parse_pb(copy, size, &t, &name, &err) == 0) {
        int64_t nb = mts_tensor_nbytes(&t);
        volatile unsigned s = name ? (unsigned)strlen(name) : 0;
        for (int64_t i = 0; i < nb; i++) s += ((const uint8_t *)t.data)[i];
        free(t.data);
        free(name);
    }
    free(copy);
    return 0;
}
