/*
 * Configuration loading: the lip-sync deployment's YAML format (sections server, gpus,
 * capacity, onnx, models, plus mtserve's own keys) and Triton-style model repository folders,
 * turned into a validated mts_config.
 *
 * libyaml's event API builds a small tree (every node keeps its line; nesting depth, node count
 * and input size are bounded; anchors and aliases are resolved by reference, never expanded).
 * The tree is then walked against a fixed schema: every known key is type- and range-checked
 * with "FILE:LINE: key 'a.b': expected ..., got '...'" errors; unknown keys and keys that do not
 * apply to mtserve are reported once through the warning callback and ignored. Relative paths
 * are resolved against the folder of the file they appear in. Values that default from other
 * values (per-model queue sizes, per-device memory, workers, threads) stay unset (0 / -1) until
 * mts_config_finalize fills them and checks the rules that span fields.
 */
#include "config/config.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "config/pbtxt.h"
#include "engine/gguf.h"
#include "util/suggest.h"

#define CFG_MAX_FILE_BYTES ((size_t)4 << 20) /* 4 MiB */
#define CFG_MAX_DEPTH 64
#define CFG_MAX_NODES 1000000
#define CFG_MAX_NAME 128
#define CFG_KEY_MAX 384

/* ------------------------------------------------------------------------------------------ */
/* YAML tree                                                                                  */

typedef enum { YN_SCALAR, YN_MAP, YN_SEQ } yn_kind;

typedef struct ynode {
    yn_kind kind;
    int line;             /* 1-based */
    bool plain;           /* plain (unquoted) scalar */
    size_t len;           /* scalar length */
    char *val;            /* scalar text, NUL-terminated */
    int n, cap;           /* children; a mapping holds key, value, key, value, ... */
    struct ynode **kids;
} ynode;

typedef struct yanchor {
    char *name;
    ynode *node;
} yanchor;

typedef struct ydoc {
    ynode *root;
    ynode **all; /* every node, for freeing (aliases only add references) */
    size_t n_all, cap_all;
    yanchor *anchors;
    size_t n_anchors, cap_anchors;
} ydoc;

static void ydoc_free(ydoc *d)
{
    for (size_t i = 0; i < d->n_all; i++) {
        free(d->all[i]->val);
        free(d->all[i]->kids);
        free(d->all[i]);
    }
    free(d->all);
    for (size_t i = 0; i < d->n_anchors; i++) free(d->anchors[i].name);
    free(d->anchors);
    memset(d, 0, sizeof *d);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 8;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

static ynode *ynode_new(ydoc *d, yn_kind kind, int line)
{
    if (grow((void **)&d->all, &d->cap_all, d->n_all + 1, sizeof *d->all)) return NULL;
    ynode *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = line;
    d->all[d->n_all++] = n;
    return n;
}

static int ynode_add(ynode *parent, ynode *child)
{
    size_t cap = (size_t)parent->cap;
    if (grow((void **)&parent->kids, &cap, (size_t)parent->n + 1, sizeof *parent->kids)) return -1;
    if (cap > INT_MAX) return -1;
    parent->cap = (int)cap;
    parent->kids[parent->n++] = child;
    return 0;
}

static int anchor_add(ydoc *d, const char *name, ynode *node)
{
    if (!name) return 0;
    if (grow((void **)&d->anchors, &d->cap_anchors, d->n_anchors + 1, sizeof *d->anchors)) return -1;
    char *s = strdup(name);
    if (!s) return -1;
    d->anchors[d->n_anchors].name = s;
    d->anchors[d->n_anchors].node = node;
    d->n_anchors++;
    return 0;
}

static ynode *anchor_find(const ydoc *d, const char *name)
{
    for (size_t i = d->n_anchors; i-- > 0;)
        if (strcmp(d->anchors[i].name, name) == 0) return d->anchors[i].node;
    return NULL;
}

/* Parses text into d. Every error names `name` and a line. */
static int ydoc_parse(const char *text, size_t len, const char *name, ydoc *d, mts_err *err)
{
    memset(d, 0, sizeof *d);
    if (len > CFG_MAX_FILE_BYTES)
        return mts_err_set(err, MTS_ELIMIT, "%s: configuration is %zu bytes; the limit is %zu bytes (4 MiB)", name,
                           len, CFG_MAX_FILE_BYTES);
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) return mts_err_set(err, MTS_ENOMEM, "%s: out of memory", name);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);

    ynode *stack[CFG_MAX_DEPTH + 1];
    char *stack_anchor[CFG_MAX_DEPTH + 1];
    int depth = 0, docs = 0, rc = MTS_OK;
    bool done = false;
    while (!done && rc == MTS_OK) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            if (p.error == YAML_MEMORY_ERROR) {
                rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory while parsing YAML", name);
            } else {
                size_t at = p.problem_mark.index;
                const char *hint = at < len && text[at] == '\t' ? " (tabs cannot indent YAML; use spaces)" : "";
                if (p.context)
                    rc = mts_err_set(err, MTS_EINVAL, "%s:%zu: YAML syntax error: %s %s at line %zu%s", name,
                                     p.problem_mark.line + 1, p.problem ? p.problem : "malformed input", p.context,
                                     p.context_mark.line + 1, hint);
                else
                    rc = mts_err_set(err, MTS_EINVAL, "%s:%zu: YAML syntax error: %s%s", name,
                                     p.problem_mark.line + 1, p.problem ? p.problem : "malformed input", hint);
            }
            break;
        }
        int line = (int)ev.start_mark.line + 1;
        ynode *node = NULL;
        const char *anchor = NULL;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = true; break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1)
                rc = mts_err_set(err, MTS_EINVAL,
                                 "%s:%d: a second YAML document starts here; a configuration is one document", name,
                                 line);
            break;
        case YAML_ALIAS_EVENT:
            node = anchor_find(d, (const char *)ev.data.alias.anchor);
            if (!node)
                rc = mts_err_set(err, MTS_EINVAL, "%s:%d: alias '*%s' names no (completed) anchor", name, line,
                                 (const char *)ev.data.alias.anchor);
            break;
        case YAML_SCALAR_EVENT:
            if (memchr(ev.data.scalar.value, 0, ev.data.scalar.length)) {
                rc = mts_err_set(err, MTS_EINVAL, "%s:%d: value holds a NUL character", name, line);
                break;
            }
            node = ynode_new(d, YN_SCALAR, line);
            if (node) node->val = malloc(ev.data.scalar.length + 1);
            if (!node || !node->val) {
                rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", name);
                break;
            }
            memcpy(node->val, ev.data.scalar.value, ev.data.scalar.length);
            node->val[ev.data.scalar.length] = '\0';
            node->len = ev.data.scalar.length;
            node->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
            anchor = (const char *)ev.data.scalar.anchor;
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            if (depth >= CFG_MAX_DEPTH) {
                rc = mts_err_set(err, MTS_ELIMIT, "%s:%d: nesting is deeper than %d levels", name, line,
                                 CFG_MAX_DEPTH);
                break;
            }
            node = ynode_new(d, ev.type == YAML_MAPPING_START_EVENT ? YN_MAP : YN_SEQ, line);
            if (!node) rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", name);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            if (depth > 0) {
                depth--;
                if (anchor_add(d, stack_anchor[depth], stack[depth]))
                    rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", name);
                free(stack_anchor[depth]);
            }
            break;
        default: break;
        }
        if (rc == MTS_OK && node) {
            if (d->n_all > CFG_MAX_NODES) {
                rc = mts_err_set(err, MTS_ELIMIT, "%s:%d: more than %d YAML nodes", name, line, CFG_MAX_NODES);
            } else if (depth > 0) {
                if (ynode_add(stack[depth - 1], node)) rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", name);
            } else if (!d->root) {
                d->root = node;
            }
        }
        if (rc == MTS_OK && node && ev.type == YAML_SCALAR_EVENT && anchor_add(d, anchor, node))
            rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", name);
        if (rc == MTS_OK && node &&
            (ev.type == YAML_SEQUENCE_START_EVENT || ev.type == YAML_MAPPING_START_EVENT)) {
            const char *a = (const char *)(ev.type == YAML_MAPPING_START_EVENT ? ev.data.mapping_start.anchor
                                                                               : ev.data.sequence_start.anchor);
            stack[depth] = node;
            stack_anchor[depth] = a ? strdup(a) : NULL;
            depth++;
            if (a && !stack_anchor[depth - 1]) rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", name);
        }
        yaml_event_delete(&ev);
    }
    while (depth > 0) free(stack_anchor[--depth]);
    yaml_parser_delete(&p);
    if (rc != MTS_OK) ydoc_free(d);
    return rc;
}

static bool yn_is_null(const ynode *n)
{
    if (!n) return true;
    if (n->kind != YN_SCALAR || !n->plain) return false;
    return n->len == 0 || strcmp(n->val, "~") == 0 || strcmp(n->val, "null") == 0 || strcmp(n->val, "Null") == 0 ||
           strcmp(n->val, "NULL") == 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Schema walk                                                                                */

typedef struct pctx {
    const char *name; /* file name used in messages */
    const char *base; /* folder relative paths are resolved against; NULL: keep as written */
    mts_config *c;
    mts_config_warn_fn warn;
    void *user;
    mts_err *err;
} pctx;

/* "'text'" (shortened), "a mapping" or "a sequence". */
static const char *describe(const ynode *n, char *buf, size_t len)
{
    if (n->kind == YN_MAP) return "a mapping";
    if (n->kind == YN_SEQ) return "a sequence";
    if (n->len > 60)
        snprintf(buf, len, "'%.57s...'", n->val);
    else
        snprintf(buf, len, "'%s'", n->val);
    return buf;
}

static int key_err(pctx *x, const ynode *n, const char *key, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int key_err(pctx *x, const ynode *n, const char *key, const char *fmt, ...)
{
    char what[MTS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mts_err_set(x->err, MTS_EINVAL, "%s:%d: key '%s': %s", x->name, n->line, key, what);
}

static int type_err(pctx *x, const ynode *v, const char *key, const char *expected)
{
    char buf[80];
    return key_err(x, v, key, "expected %s, got %s", expected, describe(v, buf, sizeof buf));
}

static void warnf(pctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warnf(pctx *x, const char *fmt, ...)
{
    if (!x->warn) return;
    char msg[MTS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    x->warn(x->user, msg);
}

/* The keys each section knows, for "did you mean" suggestions on unknown keys. */
static const char *const server_keys[] = {
    "port", "http_port", "host", "max_message_size_mb", "worker_count", "worker_count_per_gpu", "queue_size",
    "max_queue_total", "default_timeout_ms", "shutdown_grace_s", "max_connections", "max_connections_per_client",
    "http_threads", "keepalive_timeout_s", "header_timeout_s", "tls_cert_path", "tls_key_path",
    "tls_client_ca_path", "auth_token_file", "grpc_transport", "light_io_realtime"};
static const char *const gpus_keys[] = {"count", "memory_gb_per_gpu", "assignment_strategy", "worker_count_per_gpu",
                                        "threads_per_gpu"};
static const char *const capacity_keys[] = {"max_models", "max_memory_gb", "eviction_policy", "idle_timeout_minutes",
                                            "background_cache_frames"};
static const char *const model_keys[] = {
    "model_path", "background_dir", "crop_rects_path", "num_frames", "preload", "pin", "preferred_gpu",
    "preferred_device", "max_batch", "engine_batch", "max_queue_delay_us", "max_queue_delay_ms", "queue_size", "instances",
    "weight", "priority", "background_cache_frames", "tokenizer", "pooling", "normalize", "lowercase",
    "max_tokens", "input_ids_name", "attention_mask_name", "token_type_ids_name", "output_name", "precision",
    "max_error", "embedding_policy"};
static const char *const top_keys[] = {"server", "gpus", "capacity", "onnx", "models", "model_repository"};
#define KEYS(a) a, sizeof a / sizeof a[0]

static void warn_unknown(pctx *x, const ynode *k, const char *key, const char *const *known, size_t n_known)
{
    const char *near = known ? mts_suggest(k->val, known, n_known) : NULL;
    if (near)
        warnf(x, "%s:%d: unknown key '%s'; ignored (did you mean '%s'?)", x->name, k->line, key, near);
    else
        warnf(x, "%s:%d: unknown key '%s'; ignored", x->name, k->line, key);
}

/* Integer in [lo, hi]; a null value leaves *out unchanged. Returns 1 when a value was set. */
static int get_int(pctx *x, const ynode *v, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    if (yn_is_null(v)) return 0;
    char expected[96];
    if (lo == 1)
        snprintf(expected, sizeof expected, "a positive integer");
    else if (lo == 0)
        snprintf(expected, sizeof expected, "a non-negative integer");
    else
        snprintf(expected, sizeof expected, "an integer from %lld to %lld", (long long)lo, (long long)hi);
    if (v->kind != YN_SCALAR) return type_err(x, v, key, expected);
    const char *s = v->val;
    bool ok = v->len > 0;
    size_t i = (s[0] == '+' || s[0] == '-') ? 1 : 0;
    if (i >= v->len) ok = false;
    for (; ok && i < v->len; i++)
        if (s[i] < '0' || s[i] > '9') ok = false;
    if (!ok) return type_err(x, v, key, expected);
    errno = 0;
    long long n = strtoll(s, NULL, 10);
    if (errno == ERANGE || n < lo) return type_err(x, v, key, expected);
    if (n > hi) {
        if (lo != 0 && lo != 1) return type_err(x, v, key, expected);
        char buf[80];
        return key_err(x, v, key, "expected %s no larger than %lld, got %s", expected, (long long)hi,
                       describe(v, buf, sizeof buf));
    }
    *out = n;
    return 1;
}

static int get_int32(pctx *x, const ynode *v, const char *key, int lo, int hi, int *out)
{
    int64_t n;
    int rc = get_int(x, v, key, lo, hi, &n);
    if (rc == 1) *out = (int)n;
    return rc;
}

/* Finite number; positive when !allow_zero, non-negative otherwise; at most hi. */
static int get_num(pctx *x, const ynode *v, const char *key, bool allow_zero, double hi, double *out)
{
    if (yn_is_null(v)) return 0;
    const char *expected = allow_zero ? "a non-negative number" : "a positive number";
    if (v->kind != YN_SCALAR || v->len == 0) return type_err(x, v, key, expected);
    char *end;
    errno = 0;
    double d = strtod(v->val, &end);
    if (*end != '\0' || end == v->val || errno == ERANGE || !isfinite(d) || d < 0 || (!allow_zero && d == 0))
        return type_err(x, v, key, expected);
    if (d > hi) {
        char buf[80];
        return key_err(x, v, key, "expected %s no larger than %g, got %s", expected, hi, describe(v, buf, sizeof buf));
    }
    *out = d;
    return 1;
}

static int get_bool(pctx *x, const ynode *v, const char *key, bool *out)
{
    if (yn_is_null(v)) return 0;
    if (v->kind == YN_SCALAR) {
        static const char *yes[] = {"true", "yes", "on"}, *no[] = {"false", "no", "off"};
        for (size_t i = 0; i < 3; i++) {
            if (strcasecmp(v->val, yes[i]) == 0) return *out = true, 1;
            if (strcasecmp(v->val, no[i]) == 0) return *out = false, 1;
        }
    }
    return type_err(x, v, key, "true or false");
}

/* Non-empty string (borrowed from the tree). */
static int get_str(pctx *x, const ynode *v, const char *key, const char **out)
{
    if (yn_is_null(v)) return 0;
    if (v->kind != YN_SCALAR || v->len == 0) return type_err(x, v, key, "a non-empty string");
    *out = v->val;
    return 1;
}

/* Case-insensitive choice among names[]; *out gets the index. */
static int get_enum(pctx *x, const ynode *v, const char *key, const char *const *names, int n, int *out)
{
    if (yn_is_null(v)) return 0;
    if (v->kind == YN_SCALAR)
        for (int i = 0; i < n; i++)
            if (strcasecmp(v->val, names[i]) == 0) return *out = i, 1;
    char expected[160] = "one of ";
    for (int i = 0; i < n; i++) {
        size_t l = strlen(expected);
        snprintf(expected + l, sizeof expected - l, "%s'%s'", i ? ", " : "", names[i]);
    }
    return type_err(x, v, key, expected);
}

static int set_string(char **dst, const char *src)
{
    char *s = strdup(src);
    if (!s) return -1;
    free(*dst);
    *dst = s;
    return 0;
}

/* base + "/" + p for relative p (when base is known), else p. */
static char *resolve_path(const char *base, const char *p)
{
    if (!base || p[0] == '/') return strdup(p);
    size_t bl = strlen(base), pl = strlen(p);
    while (pl > 2 && p[0] == '.' && p[1] == '/') p += 2, pl -= 2;
    char *r = malloc(bl + pl + 2);
    if (!r) return NULL;
    memcpy(r, base, bl);
    size_t o = bl;
    if (bl == 0 || base[bl - 1] != '/') r[o++] = '/';
    memcpy(r + o, p, pl + 1);
    return r;
}

/* Folder part of a file name; NULL (no resolving) when the name has no '/'. */
static char *dir_of(const char *name)
{
    const char *slash = name ? strrchr(name, '/') : NULL;
    if (!slash) return NULL;
    if (slash == name) return strdup("/");
    return strndup(name, (size_t)(slash - name));
}

static int get_path(pctx *x, const ynode *v, const char *key, char **dst)
{
    const char *s = NULL;
    int rc = get_str(x, v, key, &s);
    if (rc != 1) return rc;
    char *r = resolve_path(x->base, s);
    if (!r) return mts_err_set(x->err, MTS_ENOMEM, "%s: out of memory", x->name);
    free(*dst);
    *dst = r;
    return 1;
}

typedef int (*key_fn)(pctx *x, const char *key, const char *full, const ynode *k, const ynode *v, void *arg);

typedef struct keyref {
    const ynode *k;
    int idx;
} keyref;

static int keyref_cmp(const void *a, const void *b)
{
    const keyref *p = a, *q = b;
    int c = strcmp(p->k->val, q->k->val);
    return c ? c : (p->idx > q->idx) - (p->idx < q->idx);
}

static void join_key(char *buf, size_t len, const char *prefix, const char *key)
{
    if (prefix && prefix[0])
        snprintf(buf, len, "%s.%s", prefix, key);
    else
        snprintf(buf, len, "%s", key);
}

/* Checks that map is a mapping (or null) with distinct scalar keys, then calls fn per pair. */
static int walk_map(pctx *x, const ynode *map, const char *prefix, const char *what, key_fn fn, void *arg)
{
    if (yn_is_null(map)) return MTS_OK;
    if (map->kind != YN_MAP && !(prefix && prefix[0])) {
        char buf[80];
        return mts_err_set(x->err, MTS_EINVAL, "%s:%d: the top level must be a mapping of %s, got %s", x->name,
                           map->line, what, describe(map, buf, sizeof buf));
    }
    if (map->kind != YN_MAP) {
        char expected[128];
        snprintf(expected, sizeof expected, "a mapping of %s", what);
        return type_err(x, map, prefix, expected);
    }
    int np = map->n / 2;
    char full[CFG_KEY_MAX];
    for (int i = 0; i < np; i++) {
        const ynode *k = map->kids[2 * i];
        if (k->kind != YN_SCALAR) {
            char buf[80];
            return mts_err_set(x->err, MTS_EINVAL, "%s:%d: in '%s': keys must be plain names, got %s", x->name,
                               k->line, prefix && prefix[0] ? prefix : "(top level)", describe(k, buf, sizeof buf));
        }
    }
    if (np > 1) {
        keyref *refs = malloc((size_t)np * sizeof *refs);
        if (!refs) return mts_err_set(x->err, MTS_ENOMEM, "%s: out of memory", x->name);
        for (int i = 0; i < np; i++) refs[i] = (keyref){map->kids[2 * i], i};
        qsort(refs, (size_t)np, sizeof *refs, keyref_cmp);
        for (int i = 1; i < np; i++) {
            if (strcmp(refs[i].k->val, refs[i - 1].k->val) == 0) {
                join_key(full, sizeof full, prefix, refs[i].k->val);
                int first = refs[i - 1].k->line;
                const ynode *dup = refs[i].k;
                free(refs);
                return mts_err_set(x->err, MTS_EINVAL, "%s:%d: key '%s': given twice (first at line %d)", x->name,
                                   dup->line, full, first);
            }
        }
        free(refs);
    }
    for (int i = 0; i < np; i++) {
        const ynode *k = map->kids[2 * i], *v = map->kids[2 * i + 1];
        join_key(full, sizeof full, prefix, k->val);
        int rc = fn(x, k->val, full, k, v, arg);
        if (rc < 0) return rc;
    }
    return MTS_OK;
}

/* server.port: 50051, ":50051", "0.0.0.0:50051" or "[::1]:50051". */
typedef struct server_state {
    char *port_host; /* host part of server.port, if any */
    bool host_set;
} server_state;

static int parse_port(pctx *x, const ynode *v, const char *full, server_state *st)
{
    if (yn_is_null(v)) return MTS_OK;
    static const char *expected = "a port number, \":PORT\" or \"HOST:PORT\"";
    if (v->kind != YN_SCALAR || v->len == 0) return type_err(x, v, full, expected);
    const char *s = v->val, *colon = strrchr(s, ':');
    const char *digits = colon ? colon + 1 : s;
    bool ok = *digits != '\0' && strlen(digits) <= 5;
    for (const char *q = digits; ok && *q; q++)
        if (*q < '0' || *q > '9') ok = false;
    long port = ok ? strtol(digits, NULL, 10) : -1;
    if (!ok) return type_err(x, v, full, expected);
    if (port > 65535) {
        char buf[80];
        return key_err(x, v, full, "port must be 0 to 65535, got %s", describe(v, buf, sizeof buf));
    }
    if (colon && colon > s) {
        const char *h = s;
        size_t hl = (size_t)(colon - s);
        if (h[0] == '[') {
            if (hl < 3 || h[hl - 1] != ']') return type_err(x, v, full, expected);
            h++;
            hl -= 2;
        } else if (memchr(h, ':', hl)) {
            return type_err(x, v, full, "a port number, \":PORT\" or \"HOST:PORT\" (IPv6 hosts in brackets)");
        }
        char *host = strndup(h, hl);
        if (!host) return mts_err_set(x->err, MTS_ENOMEM, "%s: out of memory", x->name);
        free(st->port_host);
        st->port_host = host;
    }
    x->c->grpc_port = (int)port;
    return MTS_OK;
}

static int server_key(pctx *x, const char *key, const char *full, const ynode *k, const ynode *v, void *arg)
{
    server_state *st = arg;
    mts_config *c = x->c;
    int64_t i64;
    int rc = 0;
    if (strcmp(key, "port") == 0) return parse_port(x, v, full, st);
    if (strcmp(key, "http_port") == 0) rc = get_int32(x, v, full, 0, 65535, &c->http_port);
    else if (strcmp(key, "host") == 0) {
        const char *s = NULL;
        rc = get_str(x, v, full, &s);
        if (rc == 1) {
            if (set_string(&c->host, s)) return mts_err_set(x->err, MTS_ENOMEM, "%s: out of memory", x->name);
            st->host_set = true;
        }
    } else if (strcmp(key, "max_message_size_mb") == 0) rc = get_int32(x, v, full, 1, 4096, &c->max_message_size_mb);
    else if (strcmp(key, "worker_count") == 0) rc = get_int32(x, v, full, 1, 1024, &c->worker_count);
    else if (strcmp(key, "worker_count_per_gpu") == 0) rc = get_int32(x, v, full, 1, 1024, &c->workers_per_device);
    else if (strcmp(key, "queue_size") == 0) rc = get_int32(x, v, full, 1, 1000000, &c->queue_size);
    else if (strcmp(key, "max_queue_total") == 0) rc = get_int32(x, v, full, 1, 100000000, &c->max_queue_total);
    else if (strcmp(key, "default_timeout_ms") == 0) {
        rc = get_int(x, v, full, 0, 86400000, &i64);
        if (rc == 1) c->default_timeout_ms = i64;
    } else if (strcmp(key, "shutdown_grace_s") == 0) rc = get_int32(x, v, full, 0, 3600, &c->shutdown_grace_s);
    else if (strcmp(key, "max_connections") == 0) rc = get_int32(x, v, full, 1, 1000000, &c->max_connections);
    else if (strcmp(key, "max_connections_per_client") == 0)
        rc = get_int32(x, v, full, 0, 1000000, &c->max_connections_per_client);
    else if (strcmp(key, "http_threads") == 0) rc = get_int32(x, v, full, 1, 64, &c->http_threads);
    else if (strcmp(key, "keepalive_timeout_s") == 0) rc = get_int32(x, v, full, 1, 86400, &c->keepalive_timeout_s);
    else if (strcmp(key, "header_timeout_s") == 0) rc = get_int32(x, v, full, 1, 3600, &c->header_timeout_s);
    else if (strcmp(key, "tls_cert_path") == 0) rc = get_path(x, v, full, &c->tls_cert_path);
    else if (strcmp(key, "tls_key_path") == 0) rc = get_path(x, v, full, &c->tls_key_path);
    else if (strcmp(key, "tls_client_ca_path") == 0) rc = get_path(x, v, full, &c->tls_client_ca_path);
    else if (strcmp(key, "auth_token_file") == 0) rc = get_path(x, v, full, &c->auth_token_file);
    else if (strcmp(key, "grpc_transport") == 0) {
        static const char *const names[] = {"native", "core"};
        int i;
        rc = get_enum(x, v, full, names, 2, &i);
        if (rc == 1) c->grpc_transport = i == 0 ? "native" : "core";
    } else if (strcmp(key, "light_io_realtime") == 0) {
        bool b;
        rc = get_bool(x, v, full, &b);
        if (rc == 1) c->light_io_realtime = b;
    }
    else warn_unknown(x, k, full, KEYS(server_keys));
    return rc < 0 ? rc : MTS_OK;
}

static int gpus_key(pctx *x, const char *key, const char *full, const ynode *k, const ynode *v, void *arg)
{
    mts_config *c = x->c;
    int rc = 0;
    if (strcmp(key, "count") == 0) rc = get_int32(x, v, full, 1, 1024, &c->device_count);
    else if (strcmp(key, "memory_gb_per_gpu") == 0) rc = get_num(x, v, full, false, 1e6, &c->memory_gb_per_device);
    else if (strcmp(key, "assignment_strategy") == 0) {
        static const char *const names[] = {"round-robin", "least-loaded"};
        int i;
        rc = get_enum(x, v, full, names, 2, &i);
        if (rc == 1) c->placement = i == 0 ? MTS_PLACE_ROUND_ROBIN : MTS_PLACE_LEAST_LOADED;
    } else if (strcmp(key, "worker_count_per_gpu") == 0) rc = get_int32(x, v, full, 1, 1024, &c->workers_per_device);
    else if (strcmp(key, "threads_per_gpu") == 0) rc = get_int32(x, v, full, 1, 4096, &c->threads_per_device);
    else warn_unknown(x, k, full, KEYS(gpus_keys));
    return rc < 0 ? rc : MTS_OK;
}

static int capacity_key(pctx *x, const char *key, const char *full, const ynode *k, const ynode *v, void *arg)
{
    mts_config *c = x->c;
    int rc = 0;
    if (strcmp(key, "max_models") == 0) rc = get_int32(x, v, full, 1, 1000000, &c->max_models);
    else if (strcmp(key, "max_memory_gb") == 0) rc = get_num(x, v, full, false, 1e6, &c->max_memory_gb);
    else if (strcmp(key, "eviction_policy") == 0) {
        static const char *const names[] = {"lru", "lfu"};
        int i;
        rc = get_enum(x, v, full, names, 2, &i);
        if (rc == 1) c->eviction = i == 0 ? MTS_EVICT_LRU : MTS_EVICT_LFU;
    } else if (strcmp(key, "idle_timeout_minutes") == 0) rc = get_num(x, v, full, true, 1e7, &c->idle_timeout_minutes);
    else if (strcmp(key, "background_cache_frames") == 0)
        rc = get_int32(x, v, full, 0, 1000000, &c->background_cache_frames);
    else warn_unknown(x, k, full, KEYS(capacity_keys));
    return rc < 0 ? rc : MTS_OK;
}

static int onnx_key(pctx *x, const char *key, const char *full, const ynode *k, const ynode *v, void *arg)
{
    warnf(x, "%s:%d: key '%s' does not apply to mtserve (it has its own engine); ignored", x->name, k->line, full);
    return MTS_OK;
}

/* Per-model keys, shared by models.<name> and <repository>/<name>/config.yaml. */
typedef struct model_state {
    mts_model_config *m;
    bool repo;             /* keys of a repository folder's config.yaml */
    int us_line, ms_line;  /* where max_queue_delay_us / _ms were given */
    const ynode *us_node, *ms_node;
} model_state;

/* ---- embedding_policy (config.h mts_embed_policy) ---- */

/* Entry i against itself and entry i - 1; 0, or -1 with the reason in msg. */
static int policy_check(const mts_embed_policy *p, int i, char *msg, size_t len)
{
    if (p[i].workers > p[i].max_batch) {
        snprintf(msg, len, "workers %d is more than max_batch %d (a batch splits into at most one text per worker)",
                 p[i].workers, p[i].max_batch);
        return -1;
    }
    if (i > 0 && p[i].max_batch <= p[i - 1].max_batch) {
        snprintf(msg, len, "max_batch %d is not above the previous entry's %d (entries go in ascending max_batch)",
                 p[i].max_batch, p[i - 1].max_batch);
        return -1;
    }
    return 0;
}

/* A decimal integer in [lo, hi] at *s (advanced past it); -1 when there is none or it is out of range. */
static long policy_num(const char **s, long lo, long hi)
{
    const char *p = *s;
    long v = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 9) v = v * 10 + (*p++ - '0'), digits++;
    if (digits == 0 || (*p >= '0' && *p <= '9') || v < lo || v > hi) return -1;
    *s = p;
    return v;
}

int mts_embed_policy_parse(const char *text, mts_embed_policy *out, int *n, char *err, size_t errlen)
{
    int k = 0;
    const char *s = text;
    if (!s || !*s) return snprintf(err, errlen, "the policy is empty"), -1;
    if (strlen(s) > 1024) return snprintf(err, errlen, "the policy is %zu characters; at most 1024", strlen(s)), -1;
    while (*s) {
        const char *start = s;
        while (*s == ' ') s++;
        if (k == MTS_EMBED_POLICY_MAX)
            return snprintf(err, errlen, "more than %d entries", MTS_EMBED_POLICY_MAX), -1;
        mts_embed_policy p = {0, 1, 0};
        long v = policy_num(&s, 1, 4096);
        const char *what = "max_batch (an integer from 1 to 4096)";
        if (v > 0) {
            p.max_batch = (int)v;
            what = "':' after max_batch";
            if (*s == ':') {
                s++;
                what = "workers (an integer from 1 to 256)";
                if ((v = policy_num(&s, 1, 256)) > 0) {
                    p.workers = (int)v;
                    what = NULL;
                    if (*s == 'x' || *s == 'X') {
                        s++;
                        what = "threads (an integer from 0 to 1024) after 'x'";
                        if ((v = policy_num(&s, 0, 1024)) >= 0) p.threads = (int)v, what = NULL;
                    }
                }
            }
        }
        while (!what && *s == ' ') s++;
        if (!what && *s && *s != ',') what = "',' or the end after an entry";
        if (what) {
            const char *end = strchr(start, ',');
            int shown = end ? (int)(end - start) : (int)strlen(start);
            snprintf(err, errlen, "entry %d ('%.*s'): expected %s, at character %d (the form is "
                     "max_batch:workers x threads, e.g. '4:1x2,32:2x1')", k + 1, shown > 40 ? 40 : shown, start, what,
                     (int)(s - text) + 1);
            return -1;
        }
        out[k] = p;
        char msg[200];
        if (policy_check(out, k, msg, sizeof msg)) return snprintf(err, errlen, "entry %d: %s", k + 1, msg), -1;
        k++;
        if (*s == ',') {
            s++;
            if (!*s) return snprintf(err, errlen, "a ',' ends the policy: entry %d is missing", k + 1), -1;
        }
    }
    *n = k;
    return 0;
}

void mts_embed_policy_format(const mts_model_config *m, char *buf, size_t len)
{
    size_t o = 0;
    if (len) buf[0] = 0;
    for (int i = 0; i < m->n_embed_policy && o < len; i++) {
        const mts_embed_policy *p = &m->embed_policy[i];
        int w = snprintf(buf + o, len - o, "%s%d:%dx%d", i ? "," : "", p->max_batch, p->workers, p->threads);
        if (w < 0) break;
        o += (size_t)w;
    }
}

const mts_embed_policy *mts_embed_policy_for(const mts_model_config *m, int n)
{
    if (!m || m->n_embed_policy < 1) return NULL;
    for (int i = 0; i < m->n_embed_policy; i++)
        if (n <= m->embed_policy[i].max_batch) return &m->embed_policy[i];
    return &m->embed_policy[m->n_embed_policy - 1];
}

typedef struct policy_state {
    mts_embed_policy *p;
    bool coarse;
    const ynode *threads_node, *coarse_node;
} policy_state;

static int policy_entry_key(pctx *x, const char *key, const char *full, const ynode *k, const ynode *v, void *arg)
{
    policy_state *ps = arg;
    int rc;
    if (!strcmp(key, "max_batch")) rc = get_int32(x, v, full, 1, 4096, &ps->p->max_batch);
    else if (!strcmp(key, "workers")) rc = get_int32(x, v, full, 1, 256, &ps->p->workers);
    else if (!strcmp(key, "threads") || !strcmp(key, "num_threads")) {
        if (ps->threads_node)
            return key_err(x, k, full, "conflicts with '%s' (line %d); give only one of them", ps->threads_node->val,
                           ps->threads_node->line);
        ps->threads_node = k;
        rc = get_int32(x, v, full, 0, 1024, &ps->p->threads);
    } else if (!strcmp(key, "disable_matmul_parallel")) {
        ps->coarse_node = k;
        rc = get_bool(x, v, full, &ps->coarse);
    } else
        return key_err(x, k, full, "unknown key in an embedding_policy entry (the keys are max_batch, workers, "
                       "threads or num_threads, disable_matmul_parallel)");
    return rc < 0 ? rc : MTS_OK;
}

/* models.NAME.embedding_policy: a sequence of {max_batch, workers, threads} or the compact text. */
static int parse_policy(pctx *x, const ynode *v, const char *full, mts_model_config *m)
{
    char msg[MTS_ERR_MSG_MAX];
    if (yn_is_null(v)) return 0;
    if (v->kind == YN_SCALAR) {
        if (mts_embed_policy_parse(v->val, m->embed_policy, &m->n_embed_policy, msg, sizeof msg))
            return key_err(x, v, full, "%s", msg);
        return 1;
    }
    if (v->kind == YN_SEQ && v->n < 1)
        return key_err(x, v, full, "the sequence is empty: give at least one {max_batch, workers, threads} entry");
    if (v->kind != YN_SEQ) return type_err(x, v, full, "a sequence of {max_batch, workers, threads} entries");
    if (v->n > MTS_EMBED_POLICY_MAX)
        return key_err(x, v, full, "%d entries; at most %d", v->n, MTS_EMBED_POLICY_MAX);
    for (int i = 0; i < v->n; i++) {
        const ynode *e = v->kids[i];
        char pre[CFG_KEY_MAX];
        snprintf(pre, sizeof pre, "%s[%d]", full, i + 1);
        if (e->kind != YN_MAP) return type_err(x, e, pre, "a mapping {max_batch, workers, threads}");
        mts_embed_policy p = {0, 1, 0};
        policy_state ps = {.p = &p};
        int rc = walk_map(x, e, pre, "embedding_policy settings", policy_entry_key, &ps);
        if (rc < 0) return rc;
        if (ps.coarse && p.threads > 1)
            return key_err(x, ps.coarse_node, pre, "disable_matmul_parallel: true runs 1 thread per sub-batch, but "
                           "threads is %d", p.threads);
        if (ps.coarse) p.threads = 1;
        if (p.max_batch < 1) return key_err(x, e, pre, "the entry has no max_batch");
        m->embed_policy[i] = p;
        if (policy_check(m->embed_policy, i, msg, sizeof msg)) return key_err(x, e, pre, "%s", msg);
    }
    m->n_embed_policy = v->n;
    return 1;
}

static int model_key(pctx *x, const char *key, const char *full, const ynode *k, const ynode *v, void *arg)
{
    model_state *st = arg;
    mts_model_config *m = st->m;
    int64_t i64;
    int rc = 0;
    if (strcmp(key, "model_path") == 0) {
        if (st->repo) {
            warnf(x, "%s:%d: key '%s' does not apply in a model repository folder (the model is %s); ignored",
                  x->name, k->line, full, m->model_path);
            return MTS_OK;
        }
        rc = get_path(x, v, full, &m->model_path);
    } else if (strcmp(key, "background_dir") == 0) rc = get_path(x, v, full, &m->background_dir);
    else if (strcmp(key, "crop_rects_path") == 0) rc = get_path(x, v, full, &m->crop_rects_path);
    else if (strcmp(key, "num_frames") == 0) rc = get_int32(x, v, full, 0, 100000000, &m->num_frames);
    else if (strcmp(key, "preload") == 0) rc = get_bool(x, v, full, &m->preload);
    else if (strcmp(key, "pin") == 0) rc = get_bool(x, v, full, &m->pin);
    else if (strcmp(key, "preferred_gpu") == 0 || strcmp(key, "preferred_device") == 0)
        rc = get_int32(x, v, full, -1, 1023, &m->preferred_device);
    else if (strcmp(key, "max_batch") == 0) {
        rc = get_int32(x, v, full, 0, 4096, &m->max_batch);
        if (rc == 1) m->no_batching = m->max_batch == 0; /* 0: no batch dimension (Triton's max_batch_size 0) */
    }
    else if (strcmp(key, "engine_batch") == 0) rc = get_int32(x, v, full, 0, 4096, &m->engine_batch);
    else if (strcmp(key, "max_queue_delay_us") == 0) {
        rc = get_int(x, v, full, 0, 60000000, &i64);
        if (rc == 1) m->max_queue_delay_us = i64, st->us_node = k;
    } else if (strcmp(key, "max_queue_delay_ms") == 0) {
        double ms;
        rc = get_num(x, v, full, true, 60000, &ms);
        if (rc == 1) m->max_queue_delay_us = llround(ms * 1000.0), st->ms_node = k;
    } else if (strcmp(key, "queue_size") == 0) rc = get_int32(x, v, full, 1, 1000000, &m->queue_size);
    else if (strcmp(key, "instances") == 0) rc = get_int32(x, v, full, 1, 1024, &m->instances);
    else if (strcmp(key, "weight") == 0) rc = get_num(x, v, full, false, 1000, &m->weight);
    else if (strcmp(key, "priority") == 0) rc = get_int32(x, v, full, 1, MTS_PRIORITY_LEVELS, &m->priority);
    else if (strcmp(key, "background_cache_frames") == 0)
        rc = get_int32(x, v, full, 0, 1000000, &m->background_cache_frames);
    else if (strcmp(key, "tokenizer") == 0) rc = get_path(x, v, full, &m->tokenizer_path);
    else if (strcmp(key, "pooling") == 0) {
        static const char *const names[] = {"mean", "cls", "last"};
        rc = get_enum(x, v, full, names, 3, &m->pooling);
    } else if (strcmp(key, "normalize") == 0) rc = get_bool(x, v, full, &m->normalize);
    else if (strcmp(key, "lowercase") == 0) {
        bool lc = true;
        rc = get_bool(x, v, full, &lc);
        if (rc == 1) m->lowercase = lc ? 1 : 2;
    } else if (strcmp(key, "max_tokens") == 0) rc = get_int32(x, v, full, 2, 65536, &m->max_tokens);
    else if (strcmp(key, "input_ids_name") == 0 || strcmp(key, "attention_mask_name") == 0 ||
             strcmp(key, "token_type_ids_name") == 0 || strcmp(key, "output_name") == 0) {
        const char *s = NULL;
        char **dst = key[0] == 'i' ? &m->input_ids_name : key[0] == 'a' ? &m->attention_mask_name
                     : key[0] == 't' ? &m->token_type_ids_name : &m->output_name;
        rc = get_str(x, v, full, &s);
        if (rc == 1 && set_string(dst, s)) return mts_err_set(x->err, MTS_ENOMEM, "%s: out of memory", x->name);
    }
    else if (strcmp(key, "precision") == 0) {
        static const char *const names[] = {"auto", "fp32", "bf16", "int8", "fp16"};
        int i;
        rc = get_enum(x, v, full, names, 5, &i);
        if (rc == 1 && set_string(&m->precision, names[i])) return mts_err_set(x->err, MTS_ENOMEM, "out of memory");
    } else if (strcmp(key, "max_error") == 0)
        rc = get_num(x, v, full, false, 1e6, &m->max_error);
    else if (strcmp(key, "embedding_policy") == 0) rc = parse_policy(x, v, full, m);
    else warn_unknown(x, k, full, KEYS(model_keys));
    if (rc < 0) return rc;
    if (st->us_node && st->ms_node) {
        const ynode *later = st->us_node->line > st->ms_node->line ? st->us_node : st->ms_node;
        const ynode *earlier = later == st->us_node ? st->ms_node : st->us_node;
        return key_err(x, later, full, "conflicts with '%s' (line %d); give only one of them", earlier->val,
                       earlier->line);
    }
    return MTS_OK;
}

static bool valid_model_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > CFG_MAX_NAME || s[0] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
              ch == '-' || ch == '.'))
            return false;
    }
    return true;
}

/* Appends a model with every optional value unset; returns NULL when out of memory. */
static mts_model_config *add_model(mts_config *c, const char *name)
{
    if (c->n_models >= INT_MAX - 1) return NULL;
    mts_model_config *nm = realloc(c->models, (size_t)(c->n_models + 1) * sizeof *nm);
    if (!nm) return NULL;
    c->models = nm;
    mts_model_config *m = &nm[c->n_models];
    memset(m, 0, sizeof *m);
    m->name = strdup(name);
    if (!m->name) return NULL;
    m->max_queue_delay_us = -1;
    m->preferred_device = -1;
    m->background_cache_frames = -1;
    m->version = 1;
    c->n_models++;
    return m;
}

static int models_key(pctx *x, const char *key, const char *full, const ynode *k, const ynode *v, void *arg)
{
    if (!valid_model_name(key))
        return key_err(x, k, full,
                       "a model name is 1 to %d letters, digits, '_', '-' or '.' (not starting with '.')",
                       CFG_MAX_NAME);
    if (!yn_is_null(v) && v->kind != YN_MAP) return type_err(x, v, full, "a mapping of model settings");
    mts_model_config *m = add_model(x->c, key);
    if (!m) return mts_err_set(x->err, MTS_ENOMEM, "%s: out of memory", x->name);
    model_state st = {.m = m};
    int rc = walk_map(x, v, full, "model settings", model_key, &st);
    if (rc < 0) return rc;
    if (!m->model_path) return key_err(x, k, full, "model '%s' has no model_path", key);
    size_t pl = strlen(m->model_path);
    if (!m->tokenizer_path && pl > 5 && !strcmp(m->model_path + pl - 5, ".gguf") && /* its own vocabulary */
        !(m->tokenizer_path = strdup(m->model_path)))
        return mts_err_set(x->err, MTS_ENOMEM, "%s: out of memory", x->name);
    return MTS_OK;
}

static int top_key(pctx *x, const char *key, const char *full, const ynode *k, const ynode *v, void *arg)
{
    if (strcmp(key, "server") == 0) {
        server_state *st = arg;
        return walk_map(x, v, full, "server settings", server_key, st);
    }
    if (strcmp(key, "gpus") == 0) return walk_map(x, v, full, "device settings", gpus_key, NULL);
    if (strcmp(key, "capacity") == 0) return walk_map(x, v, full, "capacity settings", capacity_key, NULL);
    if (strcmp(key, "onnx") == 0) {
        if (!yn_is_null(v) && v->kind != YN_MAP) return onnx_key(x, key, full, k, v, NULL);
        return walk_map(x, v, full, "onnx settings", onnx_key, NULL);
    }
    if (strcmp(key, "models") == 0) return walk_map(x, v, full, "model names to model settings", models_key, NULL);
    if (strcmp(key, "model_repository") == 0) {
        int rc = get_path(x, v, full, &x->c->model_repository);
        return rc < 0 ? rc : MTS_OK;
    }
    warn_unknown(x, k, full, KEYS(top_keys));
    return MTS_OK;
}

static int parse_internal(const char *text, size_t len, const char *name, mts_config *c, mts_config_warn_fn warn,
                          void *user, mts_err *err)
{
    mts_config_defaults(c);
    if (!c->host || set_string(&c->source, name)) return mts_err_set(err, MTS_ENOMEM, "%s: out of memory", name);
    ydoc d;
    int rc = ydoc_parse(text, len, name, &d, err);
    if (rc != MTS_OK) return rc;
    char *base = dir_of(name);
    pctx x = {name, base, c, warn, user, err};
    server_state st = {0};
    if (name && strchr(name, '/') && !base) rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", name);
    if (rc == MTS_OK && d.root && !yn_is_null(d.root))
        rc = walk_map(&x, d.root, "", "sections (server, gpus, capacity, models, ...)", top_key, &st);
    if (rc == MTS_OK && st.port_host && !st.host_set) {
        free(c->host);
        c->host = st.port_host;
        st.port_host = NULL;
    }
    free(st.port_host);
    free(base);
    ydoc_free(&d);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                 */

void mts_config_defaults(mts_config *c)
{
    memset(c, 0, sizeof *c);
    c->host = strdup("127.0.0.1");
    c->http_port = 8000;
    c->grpc_port = 50051;
    c->queue_size = 100;
    c->max_message_size_mb = 50;
    c->shutdown_grace_s = 30;
    c->max_connections = 4096;
    c->http_threads = 2;
    c->light_io_realtime = -1;
    c->keepalive_timeout_s = 60;
    c->header_timeout_s = 10;
    c->device_count = 1;
    c->placement = MTS_PLACE_ROUND_ROBIN;
    c->max_models = 100;
    c->eviction = MTS_EVICT_LRU;
    c->background_cache_frames = 50;
    /* Left 0 (= derive in mts_config_finalize): worker_count, max_queue_total,
     * memory_gb_per_device, workers_per_device, threads_per_device, max_memory_gb. */
}

int mts_config_parse_yaml(const char *text, size_t len, const char *name, mts_config *c, mts_config_warn_fn warn,
                          void *user, mts_err *err)
{
    if (!name) name = "<config>";
    int rc = parse_internal(text ? text : "", text ? len : 0, name, c, warn, user, err);
    if (rc != MTS_OK) mts_config_free(c);
    return rc;
}

/* Reads at most limit bytes of path (rejecting longer files); NUL-terminates. */
static int read_small_file(const char *path, size_t limit, char **out, size_t *out_len, mts_err *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return mts_err_set(err, errno == ENOENT ? MTS_ENOTFOUND : MTS_EIO, "%s: cannot open: %s", path,
                           strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) {
            fclose(f);
            return mts_err_set(err, MTS_EINVAL, "%s: is a folder, not a configuration file", path);
        }
        if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > limit) {
            fclose(f);
            return mts_err_set(err, MTS_ELIMIT, "%s: configuration file is %lld bytes; the limit is %zu bytes (4 MiB)",
                               path, (long long)sb.st_size, limit);
        }
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return mts_err_set(err, MTS_ENOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n == cap) {
            if (cap > limit) break;
            size_t nc = cap * 2;
            char *nb = realloc(buf, nc + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return mts_err_set(err, MTS_ENOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return mts_err_set(err, MTS_EIO, "%s: read error", path);
    }
    if (n > limit) {
        free(buf);
        return mts_err_set(err, MTS_ELIMIT, "%s: configuration file is larger than the limit of %zu bytes (4 MiB)",
                           path, limit);
    }
    buf[n] = '\0';
    *out = buf;
    *out_len = n;
    return MTS_OK;
}

int mts_config_load_yaml(const char *path, mts_config *c, mts_config_warn_fn warn, void *user, mts_err *err)
{
    char *text;
    size_t len;
    int rc = read_small_file(path, CFG_MAX_FILE_BYTES, &text, &len, err);
    if (rc != MTS_OK) {
        mts_config_defaults(c);
        mts_config_free(c);
        return rc;
    }
    rc = parse_internal(text, len, path, c, warn, user, err);
    free(text);
    if (rc != MTS_OK) mts_config_free(c);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *path_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *r = malloc(la + lb + 2);
    if (!r) return NULL;
    memcpy(r, a, la);
    size_t o = la;
    if (la == 0 || a[la - 1] != '/') r[o++] = '/';
    memcpy(r + o, b, lb + 1);
    return r;
}

/* ---- Triton's config.pbtxt (the fields that map onto mtserve's model settings) ---- */

static int pb_int(const mts_pbtxt *n, const char *file, long long lo, long long hi, long long *out, mts_err *err)
{
    char *end = NULL;
    long long v = n->scalar ? strtoll(n->scalar, &end, 10) : 0;
    if (!n->scalar || !n->scalar[0] || *end || v < lo || v > hi)
        return mts_err_set(err, MTS_EINVAL, "%s:%d: %s must be an integer %lld..%lld, got '%.40s'", file, n->line,
                           n->name, lo, hi, n->scalar ? n->scalar : "{...}");
    *out = v;
    return MTS_OK;
}

/* The version folder to serve: the highest <N>/<file> present, among the versions a
 * version_policy { specific { versions: [...] } } lists when it has one (Triton's default
 * policy, latest 1, otherwise). 0 when there is none. */
static long long pick_version(const char *folder, const char *file, const mts_pbtxt *pb)
{
    const mts_pbtxt *pol = pb ? mts_pbtxt_get(pb, "version_policy") : NULL;
    const mts_pbtxt *spec = pol ? mts_pbtxt_get(pol, "specific") : NULL;
    DIR *dp = opendir(folder);
    if (!dp) return 0;
    long long best = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        size_t n = strlen(e->d_name);
        if (n == 0 || n > 9 || strspn(e->d_name, "0123456789") != n) continue;
        long long v = atoll(e->d_name);
        if (v < 1 || v <= best) continue;
        if (spec) {
            bool listed = false;
            for (int i = 0; i < spec->n_kids; i++)
                if (!strcmp(spec->kids[i].name, "versions") && spec->kids[i].scalar &&
                    atoll(spec->kids[i].scalar) == v)
                    listed = true;
            if (!listed) continue;
        }
        char sub[1100];
        snprintf(sub, sizeof sub, "%s/%s/%s", folder, e->d_name, file);
        struct stat sb;
        if (stat(sub, &sb) == 0 && S_ISREG(sb.st_mode)) best = v;
    }
    closedir(dp);
    return best;
}

/* parameters { key: "precision" value: { string_value: "bf16" } }, keys "max_error" and
 * "engine_batch". */
static int pb_parameter(mts_model_config *m, const mts_pbtxt *k, const char *file, mts_err *err)
{
    const mts_pbtxt *key = mts_pbtxt_get(k, "key"), *val = mts_pbtxt_get(k, "value");
    const mts_pbtxt *sv = val ? mts_pbtxt_get(val, "string_value") : NULL;
    bool prec = !strcmp(key->scalar, "precision"); /* else max_error or engine_batch: the caller routes only these */
    if (!sv || !sv->scalar)
        return mts_err_set(err, MTS_EINVAL, "%s:%d: parameter '%s' needs value { string_value: \"...\" }", file, k->line,
                           key->scalar);
    if (!strcmp(key->scalar, "engine_batch")) {
        char *e;
        long n = strtol(sv->scalar, &e, 10);
        if (e == sv->scalar || *e || n < 0 || n > 4096)
            return mts_err_set(err, MTS_EINVAL, "%s:%d: parameter 'engine_batch': expected an integer from 0 to 4096, got '%.40s'",
                               file, sv->line, sv->scalar);
        m->engine_batch = (int)n;
        return MTS_OK;
    }
    if (prec) {
        static const char *const names[] = {"auto", "fp32", "bf16", "int8", "fp16"};
        for (int i = 0; i < 5; i++)
            if (!strcasecmp(sv->scalar, names[i])) {
                char *d = strdup(names[i]);
                if (!d) return mts_err_set(err, MTS_ENOMEM, "out of memory");
                free(m->precision);
                m->precision = d;
                return MTS_OK;
            }
        return mts_err_set(err, MTS_EINVAL, "%s:%d: parameter 'precision': expected auto, fp32, bf16, fp16 or int8, got '%.40s'",
                           file, sv->line, sv->scalar);
    }
    char *end;
    double d = strtod(sv->scalar, &end);
    if (end == sv->scalar || *end || !(d > 0) || d > 1e6)
        return mts_err_set(err, MTS_EINVAL, "%s:%d: parameter 'max_error': expected a positive number, got '%.40s'", file,
                           sv->line, sv->scalar);
    m->max_error = d;
    return MTS_OK;
}

/* One `parameters { key: "K" value: { string_value: "V" } }` entry: the embedding keys (the
 * same as in config.yaml; a relative tokenizer path is taken from the model folder). */
static int apply_pb_param(mts_model_config *m, const mts_pbtxt *p, const char *folder, const char *file,
                          mts_config_warn_fn warn, void *user, mts_err *err)
{
    const mts_pbtxt *k = mts_pbtxt_get(p, "key"), *v = mts_pbtxt_get(p, "value");
    const mts_pbtxt *sv = v ? mts_pbtxt_get(v, "string_value") : NULL;
    if (!k || !k->scalar || !sv || !sv->scalar)
        return mts_err_set(err, MTS_EINVAL, "%s:%d: parameters needs key: \"...\" and value: { string_value: \"...\" }",
                           file, p->line);
    const char *key = k->scalar, *val = sv->scalar;
    char **str = !strcmp(key, "tokenizer")             ? &m->tokenizer_path
                 : !strcmp(key, "input_ids_name")      ? &m->input_ids_name
                 : !strcmp(key, "attention_mask_name") ? &m->attention_mask_name
                 : !strcmp(key, "token_type_ids_name") ? &m->token_type_ids_name
                 : !strcmp(key, "output_name")         ? &m->output_name
                                                       : NULL;
    if (str) {
        if (!val[0]) return mts_err_set(err, MTS_EINVAL, "%s:%d: parameter '%s' must not be empty", file, sv->line, key);
        char *r = str == &m->tokenizer_path ? resolve_path(folder, val) : strdup(val);
        if (!r) return mts_err_set(err, MTS_ENOMEM, "%s: out of memory", file);
        free(*str);
        *str = r;
    } else if (!strcmp(key, "pooling")) {
        if (!strcasecmp(val, "mean")) m->pooling = MTS_POOL_MEAN;
        else if (!strcasecmp(val, "cls")) m->pooling = MTS_POOL_CLS;
        else if (!strcasecmp(val, "last")) m->pooling = MTS_POOL_LAST;
        else return mts_err_set(err, MTS_EINVAL, "%s:%d: parameter 'pooling' must be mean, cls or last, got '%.60s'",
                                file, sv->line, val);
    } else if (!strcmp(key, "normalize") || !strcmp(key, "lowercase")) {
        bool yes = !strcasecmp(val, "true") || !strcasecmp(val, "yes") || !strcasecmp(val, "on");
        if (!yes && strcasecmp(val, "false") && strcasecmp(val, "no") && strcasecmp(val, "off"))
            return mts_err_set(err, MTS_EINVAL, "%s:%d: parameter '%s' must be true or false, got '%.60s'", file,
                               sv->line, key, val);
        if (key[0] == 'n') m->normalize = yes;
        else m->lowercase = yes ? 1 : 2;
    } else if (!strcmp(key, "max_tokens")) {
        char *end;
        long n = strtol(val, &end, 10);
        if (*end || end == val || n < 2 || n > 65536)
            return mts_err_set(err, MTS_EINVAL, "%s:%d: parameter 'max_tokens' must be an integer from 2 to 65536, got "
                               "'%.60s'", file, sv->line, val);
        m->max_tokens = (int)n;
    } else if (!strcmp(key, "embedding_policy")) {
        char msg[300];
        if (mts_embed_policy_parse(val, m->embed_policy, &m->n_embed_policy, msg, sizeof msg))
            return mts_err_set(err, MTS_EINVAL, "%s:%d: parameter 'embedding_policy': %s", file, sv->line, msg);
    } else if (warn) {
        char msg[MTS_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s:%d: parameter '%.100s' does not apply to mtserve; ignored", file, k->line, key);
        warn(user, msg);
    }
    return MTS_OK;
}

/* Applies max_batch_size, dynamic_batching.max_queue_delay_microseconds, instance_group counts
 * and parameters; warns about fields that would change behaviour elsewhere. */
static int apply_pbtxt(mts_model_config *m, const mts_pbtxt *pb, const char *folder, const char *file,
                       mts_config_warn_fn warn, void *user, mts_err *err)
{
    static const char *quiet[] = {"name", "platform", "backend", "input", "output", "version_policy",
                                  "max_batch_size", "dynamic_batching", "instance_group", "default_model_filename"};
    char msg[MTS_ERR_MSG_MAX];
    long long v;
    int instances = 0;
    bool batching = false;
    for (int i = 0; i < pb->n_kids; i++) {
        const mts_pbtxt *k = &pb->kids[i];
        if (!strcmp(k->name, "max_batch_size")) {
            if (pb_int(k, file, 0, 4096, &v, err)) return MTS_EINVAL;
            m->max_batch = v > 0 ? (int)v : 1; /* 0: the model does not take a batch dimension */
            m->no_batching = v == 0;
        } else if (!strcmp(k->name, "dynamic_batching")) {
            batching = true;
            const mts_pbtxt *d = mts_pbtxt_get(k, "max_queue_delay_microseconds");
            if (d) {
                if (pb_int(d, file, 0, 60000000, &v, err)) return MTS_EINVAL;
                m->max_queue_delay_us = v;
            }
        } else if (!strcmp(k->name, "instance_group")) {
            const mts_pbtxt *cnt = mts_pbtxt_get(k, "count");
            v = 1;
            if (cnt && pb_int(cnt, file, 1, 1024, &v, err)) return MTS_EINVAL;
            instances += (int)v;
        } else if (!strcmp(k->name, "parameters")) {
            /* precision keys here, the embedding keys (and the warning for others) there */
            const mts_pbtxt *pk = mts_pbtxt_get(k, "key");
            bool prec = pk && pk->scalar && (!strcmp(pk->scalar, "precision") || !strcmp(pk->scalar, "max_error") ||
                                             !strcmp(pk->scalar, "engine_batch"));
            int prc = prec ? pb_parameter(m, k, file, err) : apply_pb_param(m, k, folder, file, warn, user, err);
            if (prc) return prc;
        } else if (!strcmp(k->name, "name") && k->scalar && strcmp(k->scalar, m->name)) {
            snprintf(msg, sizeof msg, "%s:%d: name '%.100s' differs from the folder name; the model is served as '%s'",
                     file, k->line, k->scalar, m->name);
            if (warn) warn(user, msg);
        } else if ((!strcmp(k->name, "platform") || !strcmp(k->name, "backend")) && k->scalar &&
                   strncmp(k->scalar, "onnxruntime", 11) && strcmp(k->scalar, "onnx")) {
            snprintf(msg, sizeof msg, "%s:%d: %s '%.60s': mtserve runs ONNX models only (the ONNX file is used)", file,
                     k->line, k->name, k->scalar);
            if (warn) warn(user, msg);
        } else {
            bool known = false;
            for (size_t q = 0; q < sizeof quiet / sizeof quiet[0]; q++) known |= !strcmp(k->name, quiet[q]);
            const char *near = known ? NULL : mts_suggest(k->name, quiet, sizeof quiet / sizeof quiet[0]);
            if (!known && warn && near) {
                snprintf(msg, sizeof msg, "%s:%d: unknown field '%s'; ignored (did you mean '%s'?)", file, k->line,
                         k->name, near);
                warn(user, msg);
            } else if (!known && warn) {
                snprintf(msg, sizeof msg, "%s:%d: field '%s' does not apply to mtserve; ignored", file, k->line, k->name);
                warn(user, msg);
            }
        }
    }
    if (!batching) m->max_queue_delay_us = 0; /* Triton without dynamic_batching does not wait to batch */
    if (instances > 0) m->instances = instances > 1024 ? 1024 : instances;
    return MTS_OK;
}

/* One repository folder: model.onnx (or Triton's <version>/model.onnx, or a GGUF encoder
 * model.gguf, whose own vocabulary and pooling are the defaults) plus an optional config.pbtxt
 * (Triton) and/or config.yaml (mtserve's per-model keys, applied last). */
static int scan_one(mts_config *c, const char *dir, const char *sub, mts_config_warn_fn warn, void *user,
                    mts_err *err)
{
    char *folder = path_join(dir, sub), *onnx = folder ? path_join(folder, "model.onnx") : NULL;
    char *cfg = folder ? path_join(folder, "config.yaml") : NULL;
    char *pbpath = folder ? path_join(folder, "config.pbtxt") : NULL;
    int rc = MTS_OK;
    char *text = NULL;
    ydoc d = {0};
    mts_pbtxt pb = {0};
    long long version = 1;
    if (!folder || !onnx || !cfg || !pbpath) {
        rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", dir);
        goto done;
    }
    struct stat sb;
    if (stat(folder, &sb) != 0 || !S_ISDIR(sb.st_mode)) goto done;
    if (stat(pbpath, &sb) == 0) {
        size_t len;
        rc = read_small_file(pbpath, CFG_MAX_FILE_BYTES, &text, &len, err);
        if (rc == MTS_OK) rc = mts_pbtxt_parse(text, len, pbpath, &pb, err);
        free(text);
        text = NULL;
        if (rc) goto done;
    }
    int gguf = 0;
    if (stat(onnx, &sb) != 0 || !S_ISREG(sb.st_mode)) { /* a GGUF encoder instead (engine/gguf.h) */
        char *g = path_join(folder, "model.gguf");
        if (g && stat(g, &sb) == 0 && S_ISREG(sb.st_mode)) {
            free(onnx);
            onnx = g;
            gguf = 1;
        } else {
            free(g);
        }
    }
    if (!gguf && (stat(onnx, &sb) != 0 || !S_ISREG(sb.st_mode))) {
        const mts_pbtxt *fn = mts_pbtxt_get(&pb, "default_model_filename");
        const char *file = fn && fn->scalar && !strchr(fn->scalar, '/') ? fn->scalar : "model.onnx";
        version = pick_version(folder, file, &pb);
        if (version > 0) {
            char vf[1200];
            snprintf(vf, sizeof vf, "%s/%lld/%s", folder, version, file);
            free(onnx);
            if (!(onnx = strdup(vf))) {
                rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", dir);
                goto done;
            }
        } else {
            if (warn) {
                char msg[MTS_ERR_MSG_MAX];
                snprintf(msg, sizeof msg, "%s: no model.onnx in this folder or in a version folder (1/model.onnx); "
                         "skipped", folder);
                warn(user, msg);
            }
            goto done;
        }
    }
    if (mts_config_find_model(c, sub)) goto done; /* configured explicitly: that wins */
    if (!valid_model_name(sub)) {
        if (warn) {
            char msg[MTS_ERR_MSG_MAX];
            snprintf(msg, sizeof msg,
                     "%s: '%s' is not a valid model name (letters, digits, '_', '-', '.'; at most %d); skipped",
                     folder, sub, CFG_MAX_NAME);
            warn(user, msg);
        }
        goto done;
    }
    mts_model_config *m = add_model(c, sub);
    if (!m || !(m->model_path = strdup(onnx))) {
        rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", dir);
        goto done;
    }
    m->version = (int)version;
    if (gguf) { /* an embedding model as it is: its tokenizer and pooling come from the file */
        int pool = 0;
        int64_t ctx = 0;
        mts_gguf_embed_defaults(onnx, &pool, &ctx);
        if (!(m->tokenizer_path = strdup(onnx))) {
            rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", dir);
            goto done;
        }
        m->pooling = pool == 2 ? MTS_POOL_CLS : pool == 3 ? MTS_POOL_LAST : MTS_POOL_MEAN;
        if (ctx > 0 && ctx < 512) m->max_tokens = (int)ctx; /* no more tokens than positions */
    }
    if (pb.n_kids && (rc = apply_pbtxt(m, &pb, folder, pbpath, warn, user, err))) goto done;
    if (stat(cfg, &sb) != 0) goto done;
    size_t len;
    rc = read_small_file(cfg, CFG_MAX_FILE_BYTES, &text, &len, err);
    if (rc == MTS_OK) rc = ydoc_parse(text, len, cfg, &d, err);
    if (rc == MTS_OK && d.root && !yn_is_null(d.root)) {
        pctx x = {cfg, folder, c, warn, user, err};
        model_state st = {.m = m, .repo = true};
        rc = walk_map(&x, d.root, "", "model settings (max_batch, preload, ...)", model_key, &st);
    }
done:
    ydoc_free(&d);
    mts_pbtxt_free(&pb);
    free(text);
    free(folder);
    free(onnx);
    free(cfg);
    free(pbpath);
    return rc;
}

int mts_config_scan_repository(mts_config *c, const char *dir, mts_config_warn_fn warn, void *user, mts_err *err)
{
    DIR *dp = opendir(dir);
    if (!dp)
        return mts_err_set(err, errno == ENOENT ? MTS_ENOTFOUND : MTS_EIO, "model repository %s: %s", dir,
                           strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = MTS_OK;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.') continue;
        if (grow((void **)&names, &cap, n + 1, sizeof *names) || !(names[n] = strdup(e->d_name))) {
            rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", dir);
            break;
        }
        n++;
    }
    closedir(dp);
    if (rc == MTS_OK && !c->source && set_string(&c->source, dir))
        rc = mts_err_set(err, MTS_ENOMEM, "%s: out of memory", dir);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && rc == MTS_OK; i++) rc = scan_one(c, dir, names[i], warn, user, err);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

static int env_int(const char *name, const char *v, long lo, long hi, long *out, mts_err *err)
{
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!v[0] || *end || errno || x < lo || x > hi)
        return mts_err_set(err, MTS_EINVAL, "environment %s='%.64s': expected an integer %ld..%ld", name, v, lo, hi);
    *out = x;
    return MTS_OK;
}

int mts_config_apply_env(mts_config *c, const char *(*getenv_fn)(const char *name), mts_config_warn_fn note,
                         void *user, mts_err *err)
{
    char line[256];
    const char *v;
    long x;
    if ((v = getenv_fn("ML_INFERENCE_WORKERS"))) {
        if (env_int("ML_INFERENCE_WORKERS", v, 1, 256, &x, err)) return MTS_EINVAL;
        c->workers_per_device = c->worker_count = (int)x;
        snprintf(line, sizeof line, "environment ML_INFERENCE_WORKERS=%ld: %ld workers per device", x, x);
        if (note) note(user, line);
    }
    if ((v = getenv_fn("ML_MEMORY_LIMIT_GB"))) {
        char *end = NULL;
        double g = strtod(v, &end);
        if (!v[0] || *end || !(g > 0) || g > 1e6)
            return mts_err_set(err, MTS_EINVAL, "environment ML_MEMORY_LIMIT_GB='%.64s': expected a number of GB > 0", v);
        c->max_memory_gb = g;
        int n = c->device_count > 0 ? c->device_count : 1;
        if (c->memory_gb_per_device > g / n) c->memory_gb_per_device = g / n;
        snprintf(line, sizeof line, "environment ML_MEMORY_LIMIT_GB=%g: memory budget %g GB in all", g, g);
        if (note) note(user, line);
    }
    if ((v = getenv_fn("ML_CONCURRENT_MODELS"))) {
        if (env_int("ML_CONCURRENT_MODELS", v, 1, 1000000, &x, err)) return MTS_EINVAL;
        c->max_models = (int)x;
        snprintf(line, sizeof line, "environment ML_CONCURRENT_MODELS=%ld: at most %ld resident models", x, x);
        if (note) note(user, line);
    }
    if ((v = getenv_fn("ML_ENABLE_PARALLEL_INFERENCE"))) {
        bool on;
        if (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes")) on = true;
        else if (!strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "no")) on = false;
        else
            return mts_err_set(err, MTS_EINVAL, "environment ML_ENABLE_PARALLEL_INFERENCE='%.64s': expected true or false",
                               v);
        if (!on)
            for (int i = 0; i < c->n_models; i++) c->models[i].instances = 1;
        snprintf(line, sizeof line, "environment ML_ENABLE_PARALLEL_INFERENCE=%s: %s", on ? "true" : "false",
                 on ? "batches of one model may run concurrently (the default)" : "one batch at a time per model");
        if (note) note(user, line);
    }
    return MTS_OK;
}

int mts_config_finalize(mts_config *c, mts_err *err)
{
    const char *src = c->source ? c->source : "configuration";
    if (!c->host && !(c->host = strdup("127.0.0.1"))) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    if (c->device_count < 1) c->device_count = 1;
    if (c->workers_per_device < 1) c->workers_per_device = c->worker_count > 0 ? c->worker_count : 2;
    if (c->worker_count < 1) c->worker_count = c->workers_per_device;
    if (c->threads_per_device < 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cores < 1) cores = 1;
        long t = cores / c->device_count;
        c->threads_per_device = t < 1 ? 1 : (int)t;
    }
    if (!(c->max_memory_gb > 0)) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        double gb = (pages > 0 && psz > 0) ? (double)pages * (double)psz / (1024.0 * 1024.0 * 1024.0) : 8.0;
        c->max_memory_gb = 0.5 * gb;
    }
    if (!(c->memory_gb_per_device > 0)) c->memory_gb_per_device = c->max_memory_gb / c->device_count;
    if (c->queue_size < 1) c->queue_size = 100;
    if (c->max_queue_total < 1) {
        int64_t t = 16 * (int64_t)c->queue_size;
        c->max_queue_total = t > INT_MAX ? INT_MAX : (int)t;
    }
    if (c->background_cache_frames < 0) c->background_cache_frames = 50;
    int pinned = 0;
    for (int i = 0; i < c->n_models; i++) {
        mts_model_config *m = &c->models[i];
        if (m->queue_size < 1) m->queue_size = c->queue_size;
        if (m->background_cache_frames < 0) m->background_cache_frames = c->background_cache_frames;
        if (m->max_batch < 1) m->max_batch = m->no_batching ? 1 : 8;
        if (m->max_queue_delay_us < 0) m->max_queue_delay_us = 2000;
        if (m->instances < 1) m->instances = c->workers_per_device;
        if (!(m->weight > 0)) m->weight = 1.0;
        if (m->priority < 1) m->priority = MTS_DEFAULT_PRIORITY;
        if (m->preferred_device < -1 || m->preferred_device >= c->device_count)
            return mts_err_set(err, MTS_EINVAL,
                               "%s: model '%s': preferred_gpu %d is out of range: gpus.count is %d (use -1 or 0 to %d)",
                               src, m->name, m->preferred_device, c->device_count, c->device_count - 1);
        if (m->pin) pinned++;
        if (m->n_embed_policy > 0 && !m->tokenizer_path)
            return mts_err_set(err, MTS_EINVAL, "%s: model '%s': embedding_policy applies to embedding models only (it "
                               "has no 'tokenizer')", src, m->name);
    }
    if (!c->tls_cert_path != !c->tls_key_path)
        return mts_err_set(err, MTS_EINVAL, "%s: server.tls_cert_path and server.tls_key_path go together (got only %s)",
                           src, c->tls_cert_path ? "tls_cert_path" : "tls_key_path");
    if (c->tls_client_ca_path && !c->tls_cert_path)
        return mts_err_set(err, MTS_EINVAL, "%s: server.tls_client_ca_path needs tls_cert_path and tls_key_path", src);
    if (pinned > c->max_models)
        return mts_err_set(err, MTS_EINVAL, "%s: %d models have pin: true but capacity.max_models is %d", src, pinned,
                           c->max_models);
    return MTS_OK;
}

const mts_model_config *mts_config_find_model(const mts_config *c, const char *name)
{
    for (int i = 0; i < c->n_models; i++)
        if (strcmp(c->models[i].name, name) == 0) return &c->models[i];
    return NULL;
}

void mts_config_free(mts_config *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_models; i++) {
        mts_model_config *m = &c->models[i];
        free(m->name);
        free(m->model_path);
        free(m->background_dir);
        free(m->tokenizer_path);
        free(m->input_ids_name);
        free(m->attention_mask_name);
        free(m->token_type_ids_name);
        free(m->output_name);
        free(m->crop_rects_path);
        free(m->precision);
    }
    free(c->models);
    free(c->source);
    free(c->host);
    free(c->model_repository);
    free(c->tls_cert_path);
    free(c->tls_key_path);
    free(c->tls_client_ca_path);
    free(c->auth_token_file);
    memset(c, 0, sizeof *c);
}

int mts_config_scan_model(const mts_config *base, const char *dir, const char *name,
                          const char *(*getenv_fn)(const char *name), mts_model_config **out, mts_config_warn_fn warn,
                          void *user, mts_err *err)
{
    *out = NULL;
    mts_config t;
    mts_config_defaults(&t);
    /* the server-wide values the per-model defaults derive from */
    t.queue_size = base->queue_size;
    t.background_cache_frames = base->background_cache_frames;
    t.workers_per_device = base->workers_per_device;
    t.worker_count = base->worker_count;
    t.threads_per_device = base->threads_per_device;
    t.device_count = base->device_count;
    t.max_models = base->max_models;
    t.max_memory_gb = base->max_memory_gb;
    t.memory_gb_per_device = base->memory_gb_per_device;
    int rc = scan_one(&t, dir, name, warn, user, err);
    if (!rc && t.n_models == 1 && getenv_fn) rc = mts_config_apply_env(&t, getenv_fn, NULL, NULL, err);
    if (!rc && t.n_models == 1) rc = mts_config_finalize(&t, err);
    if (!rc && t.n_models == 1) {
        mts_model_config *m = malloc(sizeof *m);
        if (!m) rc = mts_err_set(err, MTS_ENOMEM, "out of memory");
        else {
            *m = t.models[0]; /* the strings move with it */
            t.n_models = 0;
            *out = m;
        }
    }
    mts_config_free(&t);
    return rc;
}

void mts_model_config_free(mts_model_config *m)
{
    if (!m) return;
    free(m->name);
    free(m->model_path);
    free(m->background_dir);
    free(m->crop_rects_path);
    free(m);
}
