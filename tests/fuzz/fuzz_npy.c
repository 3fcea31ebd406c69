/*
 * libFuzzer target for the .npy reader (src/util/npy.c): parses the input as an in-memory .npy
 * image (an exact-size heap copy) and reads every byte of the tensor it yields.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    mts_tensor t;
    memset(&t, 0, sizeof t);
    mts_err err = {0};
    if (mts_npy_parse(copy, size, "fuzz.npy", &t, &err) == 0) {
        int64_t nb = mts_tensor_nbytes(&t);
        volatile unsigned s = 0;
        for (int64_t i = 0; i < nb; i++) s += ((const uint8_t *)t.data)[i];
        free(t.data);
    }
    free(copy);
    return 0;
}
