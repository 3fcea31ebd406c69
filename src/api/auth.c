/*
 * Bearer tokens (auth.h): the token file parser and the per-request check. The file is read
 * once at start; each token keeps its scopes as a bit set. A check scans every token with a
 * constant-time comparison (no early exit on the first differing byte, and no early exit on a
 * match), so response timing does not reveal how much of a guessed token was right.
 */
#include "api/auth.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define TOKEN_MIN 16
#define TOKEN_MAX 512
#define MAX_TOKENS 4096
#define LINE_MAX_LEN 4096

#define BIT_INFER 1u
#define BIT_ADMIN 2u

typedef struct token {
    char *s;
    size_t len;
    unsigned scopes;
} token;

struct mts_auth {
    token *t;
    int n;
};

void mts_auth_free(mts_auth *a)
{
    if (!a) return;
    for (int i = 0; i < a->n; i++) {
        /* do not leave tokens in freed memory */
        volatile char *p = a->t[i].s;
        for (size_t k = 0; k < a->t[i].len; k++) p[k] = 0;
        free(a->t[i].s);
    }
    free(a->t);
    free(a);
}

int mts_auth_count(const mts_auth *a)
{
    return a ? a->n : 0;
}

static int parse_scopes(const char *s, size_t n, unsigned *out)
{
    *out = 0;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] != ',') j++;
        if (j - i == 5 && !strncmp(s + i, "infer", 5)) *out |= BIT_INFER;
        else if (j - i == 5 && !strncmp(s + i, "admin", 5)) *out |= BIT_ADMIN | BIT_INFER;
        else return -1;
        i = j + 1;
    }
    return *out ? 0 : -1;
}

int mts_auth_load(const char *path, mts_auth **out, mts_err *err)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return mts_err_set(err, MTS_EIO, "auth token file %s: cannot open it", path);
    mts_auth *a = calloc(1, sizeof *a);
    char *line = malloc(LINE_MAX_LEN + 2);
    int rc = MTS_OK, lineno = 0, cap = 0;
    if (!a || !line) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
    while (!rc && fgets(line, LINE_MAX_LEN + 2, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len > LINE_MAX_LEN && line[len - 1] != '\n') {
            rc = mts_err_set(err, MTS_EINVAL, "auth token file %s, line %d: longer than %d bytes", path, lineno,
                             LINE_MAX_LEN);
            break;
        }
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t'))
            line[--len] = 0;
        size_t i = 0;
        while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
        if (i == len || line[i] == '#') continue;
        size_t ts = i;
        while (i < len && line[i] != ' ' && line[i] != '\t') i++;
        size_t tl = i - ts;
        while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
        unsigned scopes = 0;
        if (i == len) {
            rc = mts_err_set(err, MTS_EINVAL,
                             "auth token file %s, line %d: a token needs its scopes after it (infer, admin or "
                             "infer,admin)",
                             path, lineno);
            break;
        }
        size_t ss = i;
        while (i < len && line[i] != ' ' && line[i] != '\t') i++;
        size_t sl = i - ss;
        while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
        if (i != len || parse_scopes(line + ss, sl, &scopes)) {
            rc = mts_err_set(err, MTS_EINVAL,
                             "auth token file %s, line %d: scopes must be infer, admin or infer,admin (no spaces)",
                             path, lineno);
            break;
        }
        if (tl < TOKEN_MIN || tl > TOKEN_MAX) {
            rc = mts_err_set(err, MTS_EINVAL, "auth token file %s, line %d: a token must be %d-%d characters (this one "
                             "has %zu)", path, lineno, TOKEN_MIN, TOKEN_MAX, tl);
            break;
        }
        for (size_t k = ts; k < ts + tl; k++)
            if ((unsigned char)line[k] < 0x21 || (unsigned char)line[k] > 0x7e) {
                rc = mts_err_set(err, MTS_EINVAL, "auth token file %s, line %d: a token must be printable ASCII",
                                 path, lineno);
                break;
            }
        if (rc) break;
        if (a->n == MAX_TOKENS) {
            rc = mts_err_set(err, MTS_ELIMIT, "auth token file %s: more than %d tokens", path, MAX_TOKENS);
            break;
        }
        if (a->n == cap) {
            int nc = cap ? cap * 2 : 8;
            token *nt = realloc(a->t, (size_t)nc * sizeof *nt);
            if (!nt) {
                rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
                break;
            }
            a->t = nt;
            cap = nc;
        }
        token *t = &a->t[a->n];
        t->s = malloc(tl);
        if (!t->s) {
            rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
            break;
        }
        memcpy(t->s, line + ts, tl);
        t->len = tl;
        t->scopes = scopes;
        a->n++;
    }
    if (!rc && ferror(f)) rc = mts_err_set(err, MTS_EIO, "auth token file %s: read error", path);
    if (!rc && a->n == 0) rc = mts_err_set(err, MTS_EINVAL, "auth token file %s: no tokens in it", path);
    if (line) {
        memset(line, 0, LINE_MAX_LEN + 2);
        free(line);
    }
    fclose(f);
    if (rc) {
        mts_auth_free(a);
        return rc;
    }
    *out = a;
    return MTS_OK;
}

/* Constant-time equality of two byte strings of equal length. */
static unsigned ct_diff(const char *x, const char *y, size_t n)
{
    unsigned d = 0;
    for (size_t i = 0; i < n; i++) d |= (unsigned)(unsigned char)(x[i] ^ y[i]);
    return d;
}

int mts_auth_check(const mts_auth *a, const char *value, size_t value_len, int scope, mts_err *err)
{
    if (!a || scope == MTS_SCOPE_OPEN) return MTS_OK;
    if (!value)
        return mts_err_set(err, MTS_EUNAUTHENTICATED, "authentication required: send 'Authorization: Bearer <token>'");
    while (value_len && (*value == ' ' || *value == '\t')) value++, value_len--;
    if (value_len < 7 || strncasecmp(value, "Bearer ", 7))
        return mts_err_set(err, MTS_EUNAUTHENTICATED, "the Authorization value must be 'Bearer <token>'");
    value += 7;
    value_len -= 7;
    while (value_len && (*value == ' ' || *value == '\t')) value++, value_len--;
    while (value_len && (value[value_len - 1] == ' ' || value[value_len - 1] == '\t')) value_len--;
    unsigned scopes = 0;
    for (int i = 0; i < a->n; i++) {
        const token *t = &a->t[i];
        /* compare against every token, equal length or not, so the time does not depend on which */
        size_t n = t->len < value_len ? t->len : value_len;
        unsigned d = ct_diff(t->s, value, n) | (unsigned)(t->len != value_len);
        unsigned match = (unsigned)-(int)(d == 0);
        scopes |= t->scopes & match;
    }
    if (!scopes) return mts_err_set(err, MTS_EUNAUTHENTICATED, "unknown token");
    unsigned need = scope == MTS_SCOPE_ADMIN ? BIT_ADMIN : BIT_INFER;
    if (!(scopes & need))
        return mts_err_set(err, MTS_EPERMISSION, "the token lacks the '%s' scope this request needs",
                           scope == MTS_SCOPE_ADMIN ? "admin" : "infer");
    return MTS_OK;
}

bool mts_auth_host_is_loopback(const char *host)
{
    if (!host) return true;
    return !strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcmp(host, "localhost") ||
           !strcmp(host, "[::1]");
}
