/*
 * Protobuf text format reader (pbtxt.h): a tokenizer (identifiers, numbers, quoted strings,
 * punctuation, # comments, line counting) and a recursive-descent parser into mts_pbtxt trees.
 */
#include "config/pbtxt.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    const char *p, *end, *file;
    int line, nodes;
    mts_err *err;
} lexer;

static void skip_space(lexer *l)
{
    while (l->p < l->end) {
        char c = *l->p;
        if (c == '\n') l->line++;
        if (c == '#') {
            while (l->p < l->end && *l->p != '\n') l->p++;
            continue;
        }
        if (!isspace((unsigned char)c)) break;
        l->p++;
    }
}

static int fail(lexer *l, const char *what)
{
    char near[24] = "end of file";
    if (l->p < l->end) {
        size_t n = 0;
        while (n < 16 && l->p + n < l->end && l->p[n] != '\n') n++;
        snprintf(near, sizeof near, "'%.*s'", (int)n, l->p);
    }
    return mts_err_set(l->err, MTS_EINVAL, "%s:%d: %s (at %s)", l->file, l->line, what, near);
}

static bool is_word(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-' || c == '+';
}

/* An identifier or number: [A-Za-z0-9_.+-]+ */
static char *word(lexer *l)
{
    const char *s = l->p;
    while (l->p < l->end && is_word(*l->p)) l->p++;
    if (l->p == s) return NULL;
    char *w = malloc((size_t)(l->p - s) + 1);
    if (w) {
        memcpy(w, s, (size_t)(l->p - s));
        w[l->p - s] = 0;
    }
    return w;
}

/* One or more adjacent quoted strings; simple C escapes. */
static int string_lit(lexer *l, char **out)
{
    size_t cap = 64, n = 0;
    char *s = malloc(cap);
    if (!s) return mts_err_set(l->err, MTS_ENOMEM, "out of memory");
    while (l->p < l->end && (*l->p == '"' || *l->p == '\'')) {
        char q = *l->p++;
        while (l->p < l->end && *l->p != q) {
            char c = *l->p++;
            if (c == '\n') {
                free(s);
                return fail(l, "a string runs past the end of its line");
            }
            if (c == '\\' && l->p < l->end) {
                c = *l->p++;
                c = c == 'n' ? '\n' : c == 't' ? '\t' : c;
            }
            if (n + 2 > cap) {
                char *ns = realloc(s, cap *= 2);
                if (!ns) {
                    free(s);
                    return mts_err_set(l->err, MTS_ENOMEM, "out of memory");
                }
                s = ns;
            }
            s[n++] = c;
        }
        if (l->p >= l->end) {
            free(s);
            return fail(l, "unterminated string");
        }
        l->p++;
        skip_space(l);
    }
    s[n] = 0;
    *out = s;
    return MTS_OK;
}

static mts_pbtxt *add_kid(lexer *l, mts_pbtxt *m, char *name)
{
    if (++l->nodes > MTS_PBTXT_MAX_NODES) {
        free(name);
        mts_err_set(l->err, MTS_ELIMIT, "%s:%d: more than %d fields", l->file, l->line, MTS_PBTXT_MAX_NODES);
        return NULL;
    }
    mts_pbtxt *k = realloc(m->kids, sizeof *k * (size_t)(m->n_kids + 1));
    if (!k) {
        free(name);
        mts_err_set(l->err, MTS_ENOMEM, "out of memory");
        return NULL;
    }
    m->kids = k;
    k = &k[m->n_kids++];
    memset(k, 0, sizeof *k);
    k->name = name;
    k->line = l->line;
    return k;
}

static int message(lexer *l, mts_pbtxt *m, char close, int depth);

/* A value after "name:" (or a message after "name"): scalar, { } or < >. */
static int value(lexer *l, mts_pbtxt *k, int depth)
{
    skip_space(l);
    if (l->p < l->end && (*l->p == '{' || *l->p == '<')) {
        char close = *l->p == '{' ? '}' : '>';
        l->p++;
        return message(l, k, close, depth + 1);
    }
    if (l->p < l->end && (*l->p == '"' || *l->p == '\'')) return string_lit(l, &k->scalar);
    if (!(k->scalar = word(l))) return l->err->code ? l->err->code : fail(l, "expected a value");
    return MTS_OK;
}

static int field(lexer *l, mts_pbtxt *m, int depth)
{
    char *name = word(l);
    if (!name) return fail(l, "expected a field name");
    skip_space(l);
    bool colon = l->p < l->end && *l->p == ':';
    if (colon) {
        l->p++;
        skip_space(l);
    }
    if (l->p < l->end && *l->p == '[') { /* a list: one field per element */
        l->p++;
        skip_space(l);
        bool first = true;
        while (l->p < l->end && *l->p != ']') {
            if (!first) {
                if (*l->p != ',') {
                    free(name);
                    return fail(l, "expected ',' or ']' in a list");
                }
                l->p++;
            }
            first = false;
            char *dup = strdup(name);
            mts_pbtxt *k = dup ? add_kid(l, m, dup) : NULL;
            if (!k) {
                free(name);
                return l->err->code ? l->err->code : mts_err_set(l->err, MTS_ENOMEM, "out of memory");
            }
            int rc = value(l, k, depth);
            if (rc) {
                free(name);
                return rc;
            }
            skip_space(l);
        }
        free(name);
        if (l->p >= l->end) return fail(l, "unterminated list");
        l->p++;
        return MTS_OK;
    }
    if (!colon && !(l->p < l->end && (*l->p == '{' || *l->p == '<'))) {
        free(name);
        return fail(l, "expected ':' or '{' after a field name");
    }
    mts_pbtxt *k = add_kid(l, m, name);
    if (!k) return l->err->code;
    return value(l, k, depth);
}

static int message(lexer *l, mts_pbtxt *m, char close, int depth)
{
    if (depth > MTS_PBTXT_MAX_DEPTH)
        return mts_err_set(l->err, MTS_ELIMIT, "%s:%d: messages nested deeper than %d", l->file, l->line,
                           MTS_PBTXT_MAX_DEPTH);
    for (;;) {
        skip_space(l);
        if (l->p >= l->end) return close ? fail(l, "a message is not closed") : MTS_OK;
        if (close && *l->p == close) {
            l->p++;
            return MTS_OK;
        }
        int rc = field(l, m, depth);
        if (rc) return rc;
        skip_space(l);
        if (l->p < l->end && (*l->p == ',' || *l->p == ';')) l->p++;
    }
}

int mts_pbtxt_parse(const char *text, size_t len, const char *file, mts_pbtxt *root, mts_err *err)
{
    memset(root, 0, sizeof *root);
    lexer l = {text, text + len, file, 1, 0, err};
    if (err) err->code = 0;
    mts_err local = {0};
    if (!err) l.err = &local;
    int rc = message(&l, root, 0, 0);
    if (rc) mts_pbtxt_free(root);
    return rc;
}

void mts_pbtxt_free(mts_pbtxt *n)
{
    for (int i = 0; i < n->n_kids; i++) mts_pbtxt_free(&n->kids[i]);
    free(n->kids);
    free(n->name);
    free(n->scalar);
    memset(n, 0, sizeof *n);
}

const mts_pbtxt *mts_pbtxt_get(const mts_pbtxt *m, const char *name)
{
    for (int i = 0; i < m->n_kids; i++)
        if (!strcmp(m->kids[i].name, name)) return &m->kids[i];
    return NULL;
}
