/*
 * String tensors (blobs of type MTS_DTYPE_STRINGS, engine/seqval.h): Cast and CastLike to and
 * from string (called by the Cast kernels in ref_math.c), and StringNormalizer.
 *
 * Number to string follows the ONNX test data (numpy's str()): the shortest decimal that reads
 * back to the same float (or double), positional for 1e-4 <= |x| < 1e16 ("100.0", "0.5"),
 * scientific otherwise ("1e-05"); "NaN", "INF" and "-INF"; integers in decimal. String to
 * number reads with strtod/strtoll and accepts "NaN", "INF", "+INF", "-INF" in any case; a
 * string that is not a number is an error. float16/bfloat16 and bool are declined both ways.
 * StringNormalizer changes case for ASCII and the Latin-1 letters of UTF-8 (U+00C0..U+00FE),
 * the locale "en_US" (or none) only.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/kernels/kernel.h"
#include "engine/seqval.h"

/* ---- Cast ---- */

static bool str_num_type(mts_dtype t)
{
    return t == MTS_DTYPE_FLOAT || t == MTS_DTYPE_DOUBLE || t == MTS_DTYPE_INT8 || t == MTS_DTYPE_UINT8 ||
           t == MTS_DTYPE_INT16 || t == MTS_DTYPE_UINT16 || t == MTS_DTYPE_INT32 || t == MTS_DTYPE_UINT32 ||
           t == MTS_DTYPE_INT64 || t == MTS_DTYPE_UINT64;
}

/* The shortest decimal that reads back to d (as a float when is_float), written like numpy's
 * str(): positional for 1e-4 <= |d| < 1e16 with at least one fractional digit ("100.0",
 * "0.00012"), scientific otherwise ("1e-05", "1.5e+20"). buf holds >= 48 bytes. */
static int fmt_real(double d, bool is_float, char *buf)
{
    if (isnan(d)) return snprintf(buf, 48, "NaN");
    if (isinf(d)) return snprintf(buf, 48, d < 0 ? "-INF" : "INF");
    char e[48];
    int o = 0;
    if (signbit(d)) buf[o++] = '-', d = -d;
    if (d == 0) return o + snprintf(buf + o, (size_t)(48 - o), "0.0");
    int maxp = is_float ? 9 : 17;
    for (int p = 1; p <= maxp; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, d);
        if (is_float ? strtof(e, NULL) == (float)d : strtod(e, NULL) == d) break;
    }
    char dig[24];
    int nd = 0;
    const char *q = e;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9' && nd < 23) dig[nd++] = *q;
    int x = *q == 'e' ? atoi(q + 1) : 0;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (x >= -4 && x < 16) {
        if (x < 0) {
            o += snprintf(buf + o, (size_t)(48 - o), "0.");
            for (int i = 0; i < -x - 1; i++) buf[o++] = '0';
            for (int i = 0; i < nd; i++) buf[o++] = dig[i];
        } else {
            for (int i = 0; i <= x; i++) buf[o++] = i < nd ? dig[i] : '0';
            buf[o++] = '.';
            if (nd <= x + 1) buf[o++] = '0';
            for (int i = x + 1; i < nd; i++) buf[o++] = dig[i];
        }
        buf[o] = '\0';
        return o;
    }
    buf[o++] = dig[0];
    if (nd > 1) {
        buf[o++] = '.';
        for (int i = 1; i < nd; i++) buf[o++] = dig[i];
    }
    return o + snprintf(buf + o, (size_t)(48 - o), "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
}

/* Formats element i of x into buf (>= 48 bytes); returns the length. */
static int fmt_elem(const mts_tensor *x, int64_t i, char *buf)
{
    if (x->dtype == MTS_DTYPE_FLOAT || x->dtype == MTS_DTYPE_DOUBLE)
        return fmt_real(mts_tensor_get_f64(x, i), x->dtype == MTS_DTYPE_FLOAT, buf);
    if (x->dtype == MTS_DTYPE_UINT64) return snprintf(buf, 48, "%llu", (unsigned long long)((const uint64_t *)x->data)[i]);
    return snprintf(buf, 48, "%lld", (long long)mts_tensor_get_int(x, i));
}

static int parse_elem(mts_kctx *k, const char *s, int64_t len, mts_dtype to, void *y, int64_t i)
{
    char buf[128];
    if (len >= (int64_t)sizeof buf)
        return mts_err_set(k->err, MTS_EINVAL, "string %lld is too long to be a number", (long long)i);
    memcpy(buf, s, (size_t)len);
    buf[len] = '\0';
    char *end = NULL;
    errno = 0;
    if (to == MTS_DTYPE_FLOAT || to == MTS_DTYPE_DOUBLE) {
        const char *b = buf + (buf[0] == '+' || buf[0] == '-');
        double d;
        if (!strcasecmp(b, "inf") || !strcasecmp(b, "infinity")) d = buf[0] == '-' ? -INFINITY : INFINITY;
        else if (!strcasecmp(b, "nan")) d = NAN;
        else {
            d = strtod(buf, &end);
            if (end == buf || *end) return mts_err_set(k->err, MTS_EINVAL, "string %lld ('%s') is not a number", (long long)i, buf);
        }
        if (to == MTS_DTYPE_FLOAT) ((float *)y)[i] = (float)d;
        else ((double *)y)[i] = d;
        return MTS_OK;
    }
    if (to == MTS_DTYPE_UINT64) {
        unsigned long long u = strtoull(buf, &end, 10);
        if (end == buf || *end || errno) return mts_err_set(k->err, MTS_EINVAL, "string %lld ('%s') is not a uint64", (long long)i, buf);
        ((uint64_t *)y)[i] = u;
        return MTS_OK;
    }
    long long v = strtoll(buf, &end, 10);
    if (end == buf || *end || errno)
        return mts_err_set(k->err, MTS_EINVAL, "string %lld ('%s') is not an integer", (long long)i, buf);
    switch (to) { /* narrowing wraps around, as for integer casts */
    case MTS_DTYPE_INT8: ((int8_t *)y)[i] = (int8_t)v; break;
    case MTS_DTYPE_UINT8: ((uint8_t *)y)[i] = (uint8_t)v; break;
    case MTS_DTYPE_INT16: ((int16_t *)y)[i] = (int16_t)v; break;
    case MTS_DTYPE_UINT16: ((uint16_t *)y)[i] = (uint16_t)v; break;
    case MTS_DTYPE_INT32: ((int32_t *)y)[i] = (int32_t)v; break;
    case MTS_DTYPE_UINT32: ((uint32_t *)y)[i] = (uint32_t)v; break;
    default: ((int64_t *)y)[i] = v; break;
    }
    return MTS_OK;
}

static int cast_str_do(mts_kctx *k, mts_dtype to, bool write)
{
    const mts_tensor *x = mts_kin(k, 0);
    if (!x) return mts_err_set(k->err, MTS_EINVAL, "input is missing");
    if (to == MTS_DTYPE_STRING) to = MTS_DTYPE_STRINGS;
    if (x->dtype == MTS_DTYPE_STRINGS && to == MTS_DTYPE_STRINGS) { /* string to string: a copy */
        if (!write) return mts_kset_out(k, 0, to, x->rank, x->dims);
        memcpy(k->out[0].data, x->data, (size_t)x->dims[0]);
        return MTS_OK;
    }
    if (to == MTS_DTYPE_STRINGS) {
        if (!str_num_type(x->dtype))
            return mts_err_set(k->err, MTS_EUNSUPPORTED, "cast from %s to string is not supported",
                               mts_dtype_name(x->dtype));
        if (!x->data) return MTS_EDYNAMIC;
        int64_t n = mts_tensor_numel(x), total = 0;
        char buf[48];
        if (!write) {
            for (int64_t i = 0; i < n; i++) total += fmt_elem(x, i, buf);
            int64_t nb = mts_str_bytes(n, total), dims[1] = {nb};
            if (nb < 0) return mts_err_set(k->err, MTS_ELIMIT, "the string tensor would be too large");
            return mts_kset_out(k, 0, MTS_DTYPE_STRINGS, 1, dims);
        }
        mts_str_begin(k->out[0].data, x->rank, x->dims, n);
        for (int64_t i = 0; i < n; i++) {
            int l = fmt_elem(x, i, buf);
            memcpy(mts_str_put(k->out[0].data, n, i, l), buf, (size_t)l);
        }
        return MTS_OK;
    }
    if (x->dtype != MTS_DTYPE_STRINGS) return mts_err_set(k->err, MTS_EINVAL, "not a string cast");
    if (!str_num_type(to))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "cast from string to %s is not supported", mts_dtype_name(to));
    if (!x->data) return MTS_EDYNAMIC;
    mts_strv v;
    int rc = mts_str_view(x, &v, k->err);
    if (rc) return rc;
    if (!write) return mts_kset_out(k, 0, to, v.rank, v.dims);
    for (int64_t i = 0; i < v.count; i++) {
        int64_t len;
        const char *s = mts_str_at(&v, i, &len);
        if ((rc = parse_elem(k, s, len, to, k->out[0].data, i))) return rc;
    }
    return MTS_OK;
}

int mts_str_cast_infer(mts_kctx *k, mts_dtype to)
{
    return cast_str_do(k, to, false);
}

int mts_str_cast_run(mts_kctx *k, mts_dtype to)
{
    return cast_str_do(k, to, true);
}

/* ---- StringNormalizer ---- */

/* Case change in place: ASCII letters and the two-byte UTF-8 Latin-1 letters (C3 80..9E upper,
 * C3 A0..BE lower, except the multiplication and division signs). */
static void change_case(char *s, int64_t n, bool upper)
{
    for (int64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            s[i] = (char)(upper ? toupper(c) : tolower(c));
        } else if (c == 0xC3 && i + 1 < n) {
            unsigned char d = (unsigned char)s[i + 1];
            if (upper && d >= 0xA0 && d <= 0xBE && d != 0xB7) s[i + 1] = (char)(d - 0x20);
            if (!upper && d >= 0x80 && d <= 0x9E && d != 0x97) s[i + 1] = (char)(d + 0x20);
            i++;
        }
    }
}

static bool stop_match(const char *s, int64_t n, const char *w, bool sensitive, char *tmp, char *tmpw)
{
    int64_t wl = (int64_t)strlen(w);
    if (wl != n) return false;
    if (sensitive) return memcmp(s, w, (size_t)n) == 0;
    memcpy(tmp, s, (size_t)n);
    memcpy(tmpw, w, (size_t)n);
    change_case(tmp, n, false);
    change_case(tmpw, n, false);
    return memcmp(tmp, tmpw, (size_t)n) == 0;
}

typedef struct strnorm {
    mts_strv v;
    int action; /* 0 none, 1 lower, 2 upper */
    bool sensitive;
    const char *const *stop;
    int n_stop;
    int64_t keep, total, maxlen;
} strnorm;

static int strnorm_setup(mts_kctx *k, strnorm *s)
{
    const mts_tensor *x = mts_kin(k, 0);
    if (!x || x->dtype != MTS_DTYPE_STRINGS) return mts_err_set(k->err, MTS_EINVAL, "input must be a string tensor");
    const char *act = mts_attr_string(k->node, "case_change_action", "NONE");
    const char *loc = mts_attr_string(k->node, "locale", "");
    if (!strcmp(act, "NONE")) s->action = 0;
    else if (!strcmp(act, "LOWER")) s->action = 1;
    else if (!strcmp(act, "UPPER")) s->action = 2;
    else return mts_err_set(k->err, MTS_EINVAL, "case_change_action '%s' is not NONE, LOWER or UPPER", act);
    if (loc[0] && strcmp(loc, "en_US") && strcmp(loc, "en_US.UTF-8"))
        return mts_err_set(k->err, MTS_EUNSUPPORTED, "locale '%s' is not supported (only en_US)", loc);
    s->sensitive = mts_attr_int(k->node, "is_case_sensitive", 0) != 0;
    s->stop = mts_attr_strings(k->node, "stopwords", &s->n_stop);
    if (!s->stop) s->n_stop = 0;
    if (!x->data) return MTS_EDYNAMIC;
    int rc = mts_str_view(x, &s->v, k->err);
    if (rc) return rc;
    if (!(s->v.rank == 1 || (s->v.rank == 2 && s->v.dims[0] == 1)))
        return mts_err_set(k->err, MTS_EINVAL, "input must have shape [C] or [1, C]");
    s->keep = s->total = s->maxlen = 0;
    for (int64_t i = 0; i < s->v.count; i++) {
        int64_t l;
        mts_str_at(&s->v, i, &l);
        if (l > s->maxlen) s->maxlen = l;
    }
    return MTS_OK;
}

/* Whether string i is a stop word (tmp buffers of maxlen bytes). */
static bool is_stop(const strnorm *s, int64_t i, char *tmp, char *tmpw)
{
    int64_t l;
    const char *p = mts_str_at(&s->v, i, &l);
    for (int w = 0; w < s->n_stop; w++)
        if (stop_match(p, l, s->stop[w], s->sensitive, tmp, tmpw)) return true;
    return false;
}

static int strnorm_do(mts_kctx *k, bool write)
{
    strnorm s;
    int rc = strnorm_setup(k, &s);
    if (rc) return rc;
    char *tmp = malloc((size_t)s.maxlen * 2 + 2);
    if (!tmp) return mts_err_set(k->err, MTS_ENOMEM, "out of memory");
    char *tmpw = tmp + s.maxlen + 1;
    for (int64_t i = 0; i < s.v.count; i++)
        if (!is_stop(&s, i, tmp, tmpw)) {
            int64_t l;
            mts_str_at(&s.v, i, &l);
            s.keep++;
            s.total += l;
        }
    /* Everything filtered: one empty string ([1] or [1, 1]). */
    int64_t n_out = s.keep ? s.keep : 1;
    int64_t dims[2] = {1, 1};
    dims[s.v.rank - 1] = n_out;
    if (!write) {
        free(tmp);
        int64_t nb = mts_str_bytes(n_out, s.total), d1[1] = {nb};
        if (nb < 0) return mts_err_set(k->err, MTS_ELIMIT, "the string tensor would be too large");
        return mts_kset_out(k, 0, MTS_DTYPE_STRINGS, 1, d1);
    }
    mts_str_begin(k->out[0].data, s.v.rank, dims, n_out);
    int64_t j = 0;
    for (int64_t i = 0; i < s.v.count; i++) {
        if (is_stop(&s, i, tmp, tmpw)) continue;
        int64_t l;
        const char *p = mts_str_at(&s.v, i, &l);
        char *d = mts_str_put(k->out[0].data, n_out, j++, l);
        if (l) memcpy(d, p, (size_t)l);
        if (s.action) change_case(d, l, s.action == 2);
    }
    if (!s.keep) mts_str_put(k->out[0].data, n_out, 0, 0);
    free(tmp);
    return MTS_OK;
}

static int strnorm_infer(mts_kctx *k)
{
    return strnorm_do(k, false);
}

static int strnorm_run(mts_kctx *k)
{
    return strnorm_do(k, true);
}

const mts_op mts_ref_ops_string[] = {
    {"StringNormalizer", strnorm_infer, strnorm_run},
    {NULL, NULL, NULL},
};
