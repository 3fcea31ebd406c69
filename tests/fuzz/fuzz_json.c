/*
 * libFuzzer target for the JSON parser (src/util/json.c): parses the input, walks the whole DOM
 * through the accessors, flattens number arrays as the KServe front end does (when small), and
 * writes the document back with the streaming writer.
 */
#include <stdint.h>
#include <stdlib.h>

#include "util/json.h"

static void walk(const mts_json *v, mts_jw *w, int depth)
{
    size_t n = mts_json_len(v);
    switch (mts_json_type(v)) {
    case MTS_JSON_NULL: mts_jw_null(w); break;
    case MTS_JSON_BOOL: mts_jw_bool(w, mts_json_bool(v)); break;
    case MTS_JSON_NUMBER: {
        int64_t i;
        if (mts_json_int(v, &i) == 0) mts_jw_int(w, i);
        else mts_jw_double(w, mts_json_num(v));
        mts_jw_float(w, (float)mts_json_num(v));
        break;
    }
    case MTS_JSON_STRING: {
        size_t len;
        const char *s = mts_json_str(v, &len);
        mts_jw_string_n(w, s, len);
        break;
    }
    case MTS_JSON_ARRAY:
        mts_jw_begin_array(w);
        for (size_t i = 0; i < n; i++) walk(mts_json_at(v, i), w, depth + 1);
        mts_jw_end_array(w);
        break;
    case MTS_JSON_OBJECT:
        mts_jw_begin_object(w);
        for (size_t i = 0; i < n; i++) {
            size_t kl;
            const char *k = mts_json_key_at_n(v, i, &kl);
            mts_jw_key_n(w, k, kl);
            const mts_json *m = mts_json_get_n(v, k, kl);
            walk(m, w, depth + 1);
        }
        mts_jw_end_object(w);
        break;
    default: break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mts_json_doc *doc = NULL;
    mts_err err = {0};
    if (mts_json_parse((const char *)data, size, &doc, &err) != 0) return 0;
    const mts_json *root = mts_json_root(doc);
    mts_jw w;
    mts_jw_init(&w);
    walk(root, &w, 0);
    const char *text;
    size_t len;
    (void)mts_jw_finish(&w, &text, &len, &err);
    mts_jw_free(&w);
    /* the KServe "data" path: element count, then flattening into each supported dtype */
    int64_t n = mts_json_numel(root);
    if (n > 0 && n <= 4096) {
        static const mts_dtype types[] = {MTS_DTYPE_FLOAT, MTS_DTYPE_INT64, MTS_DTYPE_INT32,
                                          MTS_DTYPE_INT8, MTS_DTYPE_UINT8, MTS_DTYPE_BOOL};
        void *out = malloc((size_t)n * 8);
        for (size_t t = 0; out && t < sizeof types / sizeof types[0]; t++)
            (void)mts_json_flatten(root, types[t], out, n, &err);
        free(out);
    }
    mts_json_free(doc);
    return 0;
}
