/*
 * KServe BYTES tensors <-> the engine's string blobs (bytes_tensor.h): building an input blob
 * from JSON strings, the length-prefixed binary form (split by the embeddings path's parser,
 * mts_embed_split_bytes) or a list of byte strings, and reading a string output back out as
 * strings or in the binary form.
 */
#include "api/bytes_tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/embed_common.h"
#include "engine/seqval.h"
#include "text/unicode.h"
#include "util/status.h"

/* The element count the declared shape needs, or -1 (with msg) when it is over the cap. */
static int64_t shape_count(const char *name, const mts_tensor *t, char *msg, size_t len)
{
    int64_t n = mts_tensor_numel(t);
    if (n < 0 || n > MTS_BYTES_MAX_ELEMENTS) {
        char shp[128];
        snprintf(msg, len, "input '%s': shape %s of BYTES holds more than %d strings, the most one tensor may hold",
                 name, mts_shape_str(t, shp, sizeof shp), MTS_BYTES_MAX_ELEMENTS);
        return -1;
    }
    return n;
}

static int count_mismatch(const char *name, const mts_tensor *t, const char *what, int64_t have, int64_t need,
                          char *msg, size_t len)
{
    char shp[128];
    snprintf(msg, len, "input '%s': %s %lld strings, shape %s of BYTES needs %lld", name, what, (long long)have,
             mts_shape_str(t, shp, sizeof shp), (long long)need);
    return MTS_EINVAL;
}

int mts_bytes_in_elems(const char *name, mts_tensor *t, const mts_bytes_elem *e, int64_t n, void **owned, char *msg,
                       size_t len)
{
    int64_t need = shape_count(name, t, msg, len);
    if (need < 0) return MTS_EINVAL;
    if (n != need) return count_mismatch(name, t, "the data has", n, need, msg, len);
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (e[i].len > (size_t)(INT64_MAX / 4) - (size_t)total) {
            snprintf(msg, len, "input '%s': the strings are too large", name);
            return MTS_EINVAL;
        }
        total += (int64_t)e[i].len;
    }
    int64_t nb = mts_str_bytes(n, total);
    if (nb < 0 || (uint64_t)nb > SIZE_MAX / 2) {
        snprintf(msg, len, "input '%s': the strings are too large", name);
        return MTS_EINVAL;
    }
    uint8_t *blob = malloc((size_t)nb);
    if (!blob) {
        snprintf(msg, len, "input '%s': out of memory for %lld bytes of strings", name, (long long)nb);
        return MTS_ENOMEM;
    }
    mts_str_begin(blob, t->rank, t->dims, n);
    for (int64_t i = 0; i < n; i++) {
        char *dst = mts_str_put(blob, n, i, (int64_t)e[i].len);
        if (e[i].len) memcpy(dst, e[i].p, e[i].len);
    }
    free(*owned);
    *owned = blob;
    t->dtype = MTS_DTYPE_STRINGS;
    t->rank = 1;
    memset(t->dims, 0, sizeof t->dims);
    t->dims[0] = nb;
    t->data = blob;
    return MTS_OK;
}

int mts_bytes_in_binary(const char *name, mts_tensor *t, const uint8_t *p, size_t size, const char *what,
                        void **owned, char *msg, size_t len)
{
    int64_t need = shape_count(name, t, msg, len);
    if (need < 0) return MTS_EINVAL;
    /* every element takes its 4-byte length at least: a shape the bytes cannot hold is refused
     * before the element table is allocated */
    if ((uint64_t)need > size / 4) {
        char shp[128];
        snprintf(msg, len, "input '%s': %s has %zu bytes, too few for the %lld length-prefixed strings of shape %s "
                 "(4 bytes each at least)", name, what, size, (long long)need, mts_shape_str(t, shp, sizeof shp));
        return MTS_EINVAL;
    }
    mts_embed_input *in = malloc(((size_t)need + 1) * sizeof *in);
    mts_bytes_elem *e = malloc(((size_t)need + 1) * sizeof *e);
    if (!in || !e) {
        free(in);
        free(e);
        snprintf(msg, len, "input '%s': out of memory", name);
        return MTS_ENOMEM;
    }
    char why[256];
    /* room for one element beyond the shape, so that "too many" is told apart from malformed */
    int n = mts_embed_split_bytes(p, size, in, (int)need + 1, why, sizeof why);
    int rc;
    if (n < 0 && !strncmp(why, "more than", 9)) {
        char shp[128];
        snprintf(msg, len, "input '%s': %s holds more than %lld strings, shape %s of BYTES needs %lld", name, what,
                 (long long)need + 1, mts_shape_str(t, shp, sizeof shp), (long long)need);
        rc = MTS_EINVAL;
    } else if (n < 0) {
        snprintf(msg, len, "input '%s': %s: %s", name, what, why);
        rc = MTS_EINVAL;
    } else {
        for (int i = 0; i < n; i++) e[i] = (mts_bytes_elem){in[i].text, in[i].len};
        char w[96];
        snprintf(w, sizeof w, "%s holds", what);
        rc = n != need ? count_mismatch(name, t, w, n, need, msg, len) : mts_bytes_in_elems(name, t, e, n, owned, msg, len);
    }
    free(in);
    free(e);
    return rc;
}

/* Collects the leaves of a nested JSON array in row-major order; they must all be strings. */
static int json_leaves(const mts_json *v, mts_bytes_elem *e, int64_t *n, int64_t cap, const char *name, char *msg,
                       size_t len)
{
    if (mts_json_type(v) == MTS_JSON_ARRAY) {
        for (size_t i = 0; i < mts_json_len(v); i++)
            if (json_leaves(mts_json_at(v, i), e, n, cap, name, msg, len)) return MTS_EINVAL;
        return MTS_OK;
    }
    if (mts_json_type(v) != MTS_JSON_STRING) {
        snprintf(msg, len, "input '%s': data element %lld is %s; BYTES data must be strings", name, (long long)*n,
                 mts_json_type_name(mts_json_type(v)));
        return MTS_EINVAL;
    }
    if (*n < cap) e[*n].p = mts_json_str(v, &e[*n].len);
    (*n)++;
    return MTS_OK;
}

int mts_bytes_in_json(const char *name, mts_tensor *t, const mts_json *data, void **owned, char *msg, size_t len)
{
    int64_t need = shape_count(name, t, msg, len);
    if (need < 0) return MTS_EINVAL;
    int64_t have = mts_json_numel(data);
    if (have != need) return count_mismatch(name, t, "data has", have, need, msg, len);
    mts_bytes_elem *e = malloc(((size_t)need + 1) * sizeof *e);
    if (!e) {
        snprintf(msg, len, "input '%s': out of memory", name);
        return MTS_ENOMEM;
    }
    int64_t n = 0;
    int rc = json_leaves(data, e, &n, need, name, msg, len);
    if (!rc) rc = mts_bytes_in_elems(name, t, e, n, owned, msg, len);
    free(e);
    return rc;
}

int mts_bytes_out_view(const char *name, const mts_tensor *t, mts_bytes_out *o, char *msg, size_t len)
{
    mts_strv v;
    mts_err err = {0};
    if (mts_str_view(t, &v, &err)) {
        snprintf(msg, len, "output '%s': %s", name, err.msg);
        return MTS_EINVAL;
    }
    o->rank = v.rank;
    memcpy(o->dims, v.dims, sizeof o->dims);
    o->count = v.count;
    o->blob = v.base;
    for (int64_t i = 0; i < o->count; i++) { /* the binary form's lengths are 32-bit */
        size_t n;
        mts_bytes_out_at(o, i, &n);
        if (n > UINT32_MAX) {
            snprintf(msg, len, "output '%s': string %lld is %zu bytes, more than BYTES can carry", name, (long long)i, n);
            return MTS_EINVAL;
        }
    }
    return MTS_OK;
}

const char *mts_bytes_out_at(const mts_bytes_out *o, int64_t i, size_t *n)
{
    mts_strv v = {o->rank, {0}, o->count, o->blob};
    int64_t l;
    const char *s = mts_str_at(&v, i, &l);
    *n = (size_t)l;
    return s;
}

size_t mts_bytes_out_binary_size(const mts_bytes_out *o)
{
    size_t total = 0;
    for (int64_t i = 0; i < o->count; i++) {
        size_t n;
        mts_bytes_out_at(o, i, &n);
        total += 4 + n;
    }
    return total;
}

void mts_bytes_out_binary(const mts_bytes_out *o, void *dst)
{
    uint8_t *d = dst;
    for (int64_t i = 0; i < o->count; i++) {
        size_t n;
        const char *s = mts_bytes_out_at(o, i, &n);
        uint32_t l = (uint32_t)n; /* checked by mts_bytes_out_view */
        d[0] = (uint8_t)l;
        d[1] = (uint8_t)(l >> 8);
        d[2] = (uint8_t)(l >> 16);
        d[3] = (uint8_t)(l >> 24);
        if (n) memcpy(d + 4, s, n);
        d += 4 + n;
    }
}

int64_t mts_bytes_out_non_utf8(const mts_bytes_out *o)
{
    for (int64_t i = 0; i < o->count; i++) {
        size_t n;
        const unsigned char *s = (const unsigned char *)mts_bytes_out_at(o, i, &n);
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            int step = s[k] < 0x80 ? 1 : mts_utf8_decode(s + k, n - k, &cp);
            if (!step) return i;
            k += (size_t)step;
        }
    }
    return -1;
}

bool mts_bytes_status_has_strings(const mts_model_status *st)
{
    for (int i = 0; i < st->n_inputs; i++)
        if (st->inputs[i].dtype == MTS_DTYPE_STRINGS) return true;
    for (int i = 0; i < st->n_outputs; i++)
        if (st->outputs[i].dtype == MTS_DTYPE_STRINGS) return true;
    return false;
}
