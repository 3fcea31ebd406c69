/*
 * Helpers shared by the unit tests: locating test files under the source tree (MTS_SOURCE_DIR,
 * set by ctest) and making deterministic random inputs for a model's declared signature.
 */
#ifndef MTS_TEST_UTIL_H
#define MTS_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

static inline const char *test_path(char *buf, size_t len, const char *rel)
{
    const char *root = getenv("MTS_SOURCE_DIR");
    snprintf(buf, len, "%s/%s", root ? root : ".", rel);
    return buf;
}

/* Allocates inputs for every model input: symbolic dims become `batch`; floats in [0,1). */
static inline mts_tensor *test_make_inputs(const mts_model *m, int64_t batch, unsigned seed)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    mts_tensor *in = calloc((size_t)info.n_inputs + 1, sizeof *in);
    for (int i = 0; i < info.n_inputs; i++) {
        const mts_value *v = mts_model_input(m, i);
        in[i].dtype = v->dtype;
        in[i].rank = v->rank < 0 ? 0 : v->rank;
        for (int d = 0; d < in[i].rank; d++) in[i].dims[d] = v->dims[d] >= 0 ? v->dims[d] : batch;
        int64_t n = mts_tensor_numel(&in[i]);
        int64_t nb = mts_tensor_nbytes(&in[i]);
        in[i].data = calloc(1, nb > 0 ? (size_t)nb : 1);
        for (int64_t k = 0; k < n; k++) {
            seed = seed * 1103515245u + 12345u;
            if (v->dtype == MTS_DTYPE_FLOAT) ((float *)in[i].data)[k] = (float)((seed >> 8) & 0xffff) / 65536.0f;
        }
    }
    return in;
}

static inline void test_free_inputs(const mts_model *m, mts_tensor *in)
{
    mts_model_info info;
    mts_model_get_info(m, &info);
    for (int i = 0; i < info.n_inputs; i++) free(in[i].data);
    free(in);
}

#endif
