/*
 * multipart/form-data parser (multipart.h): boundary from the Content-Type, then a linear scan
 * of the body for delimiter lines ("\n--boundary"), part headers (Content-Disposition and
 * Content-Type) and the data between them, which is referenced in place.
 */
#include "util/multipart.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void mts_multipart_free(mts_multipart *m)
{
    free(m->parts);
    m->parts = NULL;
    m->n = 0;
}

const mts_multipart_part *mts_multipart_get(const mts_multipart *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->parts[i].name, name)) return &m->parts[i];
    return NULL;
}

/* Reads a parameter value at s (quoted-string or token) into out; returns the end, or NULL
 * when it does not fit or a quote is not closed. */
static const char *param_value(const char *s, const char *end, char *out, size_t cap)
{
    size_t n = 0;
    if (s < end && *s == '"') {
        for (s++; s < end && *s != '"'; s++) {
            if (*s == '\\' && s + 1 < end) s++;
            if (n + 1 >= cap) return NULL;
            out[n++] = *s;
        }
        if (s >= end) return NULL;
        s++;
    } else {
        for (; s < end && *s != ';' && *s != ' ' && *s != '\t'; s++) {
            if (n + 1 >= cap) return NULL;
            out[n++] = *s;
        }
    }
    out[n] = 0;
    return s;
}

/* Finds parameter `key` in a header value's "; k=v" list (case-insensitive key). 1 found, 0
 * absent, -1 malformed or too long. */
static int find_param(const char *v, const char *end, const char *key, char *out, size_t cap)
{
    size_t klen = strlen(key);
    const char *s = memchr(v, ';', (size_t)(end - v));
    while (s && s < end) {
        s++;
        while (s < end && (*s == ' ' || *s == '\t')) s++;
        const char *eq = memchr(s, '=', (size_t)(end - s));
        const char *semi = memchr(s, ';', (size_t)(end - s));
        if (!eq || (semi && semi < eq)) {
            s = semi;
            continue;
        }
        const char *k_end = eq;
        while (k_end > s && (k_end[-1] == ' ' || k_end[-1] == '\t')) k_end--;
        const char *val = eq + 1;
        while (val < end && (*val == ' ' || *val == '\t')) val++;
        if ((size_t)(k_end - s) == klen && !strncasecmp(s, key, klen))
            return param_value(val, end, out, cap) ? 1 : -1;
        char skip[1024];
        const char *after = param_value(val, end, skip, sizeof skip);
        s = after ? memchr(after, ';', (size_t)(end - after)) : memchr(val, ';', (size_t)(end - val));
    }
    return 0;
}

/* Line starting at p (ends at '\n'; a '\r' before it is dropped). Returns the next line's start
 * or NULL when there is no '\n' before end. */
static const char *line_end(const char *p, const char *end, const char **content_end)
{
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) return NULL;
    *content_end = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
    return nl + 1;
}

static int parse_headers(const char *body, const char **pp, const char *end, mts_multipart_part *part, int idx,
                         mts_err *err)
{
    const char *p = *pp, *start = p;
    bool disposition = false;
    for (;;) {
        const char *ce, *next = line_end(p, end, &ce);
        if (!next || (size_t)(next - start) > MTS_MULTIPART_MAX_HEADER) {
            if (next || (size_t)(end - start) > MTS_MULTIPART_MAX_HEADER)
                return mts_err_set(err, MTS_ELIMIT, "multipart: the headers of part %d (at byte %zu) exceed %d bytes",
                                   idx, (size_t)(start - body), MTS_MULTIPART_MAX_HEADER);
            return mts_err_set(err, MTS_EINVAL, "multipart: the headers of part %d (at byte %zu) are truncated", idx,
                               (size_t)(start - body));
        }
        if (ce == p) { /* the empty line */
            *pp = next;
            break;
        }
        const char *colon = memchr(p, ':', (size_t)(ce - p));
        if (!colon || colon == p)
            return mts_err_set(err, MTS_EINVAL, "multipart: part %d has a header line without a name at byte %zu", idx,
                               (size_t)(p - body));
        const char *v = colon + 1;
        while (v < ce && (*v == ' ' || *v == '\t')) v++;
        size_t nlen = (size_t)(colon - p);
        if (nlen == 19 && !strncasecmp(p, "Content-Disposition", 19)) {
            if ((size_t)(ce - v) < 9 || strncasecmp(v, "form-data", 9))
                return mts_err_set(err, MTS_EINVAL,
                                   "multipart: part %d: Content-Disposition at byte %zu is not form-data", idx,
                                   (size_t)(p - body));
            int r = find_param(v, ce, "name", part->name, sizeof part->name);
            if (r <= 0)
                return mts_err_set(err, MTS_EINVAL,
                                   "multipart: part %d: Content-Disposition at byte %zu has %s name parameter", idx,
                                   (size_t)(p - body), r < 0 ? "a malformed or too long" : "no");
            if (find_param(v, ce, "filename", part->filename, sizeof part->filename) < 0)
                return mts_err_set(err, MTS_EINVAL,
                                   "multipart: part %d: Content-Disposition at byte %zu has a malformed or too long "
                                   "filename", idx, (size_t)(p - body));
            disposition = true;
        } else if (nlen == 12 && !strncasecmp(p, "Content-Type", 12)) {
            size_t vl = (size_t)(ce - v);
            if (vl >= sizeof part->content_type)
                return mts_err_set(err, MTS_EINVAL, "multipart: part %d: Content-Type at byte %zu is too long", idx,
                                   (size_t)(p - body));
            memcpy(part->content_type, v, vl);
            part->content_type[vl] = 0;
        }
        p = next;
    }
    if (!disposition)
        return mts_err_set(err, MTS_EINVAL, "multipart: part %d (at byte %zu) has no Content-Disposition: form-data header",
                           idx, (size_t)(start - body));
    return MTS_OK;
}

int mts_multipart_parse(const char *content_type, const char *body, size_t len, mts_multipart *out, mts_err *err)
{
    memset(out, 0, sizeof *out);
    if (!content_type) return mts_err_set(err, MTS_EINVAL, "multipart: the request has no Content-Type header");
    const char *ct = content_type;
    while (*ct == ' ') ct++;
    if (strncasecmp(ct, "multipart/form-data", 19) || (ct[19] && ct[19] != ';' && ct[19] != ' '))
        return mts_err_set(err, MTS_EINVAL, "Content-Type is '%.100s', expected multipart/form-data", content_type);
    char boundary[80];
    int r = find_param(ct, ct + strlen(ct), "boundary", boundary, sizeof boundary);
    size_t blen = r > 0 ? strlen(boundary) : 0;
    if (r <= 0 || blen < 1 || blen > 70)
        return mts_err_set(err, MTS_EINVAL, "multipart: Content-Type has %s boundary parameter (1..70 characters)",
                           r == 0 ? "no" : "an invalid");
    char delim[84];
    size_t dlen = (size_t)snprintf(delim, sizeof delim, "\n--%s", boundary);
    const char *end = body + len, *p;
    /* the first delimiter: at the very start, or after a preamble line */
    if (len >= dlen - 1 && !memcmp(body, delim + 1, dlen - 1)) p = body + dlen - 1;
    else {
        const char *f = memmem(body, len, delim, dlen);
        if (!f) return mts_err_set(err, MTS_EINVAL, "multipart: the body has no '--%s' delimiter", boundary);
        p = f + dlen;
    }
    size_t cap = 0;
    for (int idx = 0;; idx++) {
        /* after a delimiter: "--" closes the body; otherwise blanks and a line end */
        if (end - p >= 2 && p[0] == '-' && p[1] == '-') return MTS_OK;
        while (p < end && (*p == ' ' || *p == '\t')) p++;
        if (p < end && *p == '\r') p++;
        if (p >= end || *p != '\n') {
            mts_multipart_free(out);
            return mts_err_set(err, MTS_EINVAL, "multipart: %s after the delimiter at byte %zu",
                               p >= end ? "the body ends without the closing '--boundary--'"
                                        : "unexpected characters",
                               (size_t)(p - body));
        }
        p++;
        if (out->n == MTS_MULTIPART_MAX_PARTS) {
            mts_multipart_free(out);
            return mts_err_set(err, MTS_ELIMIT, "multipart: more than %d parts", MTS_MULTIPART_MAX_PARTS);
        }
        if ((size_t)out->n == cap) {
            cap = cap ? cap * 2 : 4;
            mts_multipart_part *np = realloc(out->parts, cap * sizeof *np);
            if (!np) {
                mts_multipart_free(out);
                return mts_err_set(err, MTS_ENOMEM, "out of memory");
            }
            out->parts = np;
        }
        mts_multipart_part *part = &out->parts[out->n];
        memset(part, 0, sizeof *part);
        int rc = parse_headers(body, &p, end, part, idx, err);
        if (rc) {
            mts_multipart_free(out);
            return rc;
        }
        out->n++;
        /* the data runs to the next delimiter; the line end before it belongs to the delimiter */
        const char *f = p <= end ? memmem(p - 1, (size_t)(end - p + 1), delim, dlen) : NULL;
        if (!f) {
            rc = mts_err_set(err, MTS_EINVAL,
                             "multipart: part %d ('%s', data from byte %zu) is not terminated by a '--%s' delimiter",
                             idx, part->name, (size_t)(p - body), boundary);
            mts_multipart_free(out); /* after the message: it names the part */
            return rc;
        }
        const char *dend = f > p && f[-1] == '\r' ? f - 1 : f;
        part->data = p;
        part->len = dend > p ? (size_t)(dend - p) : 0;
        p = f + dlen;
    }
}
