/*
 * The REST route table (router.h): pattern matching over the request path without copying,
 * dispatch to the first route whose pattern and method match, and the one place where 404 (no
 * route) and 405 (method not allowed, with Allow) are answered. Also the MTS_E*-status error
 * answers the REST handlers use.
 */
#include "api/router.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/protocol.h"
#include "util/json.h"

/* Answers {"error": msg} (JSON-escaped by the writer, UTF-8 kept). */
static void json_error(mts_http_conn *c, int http_status, const char *extra, const char *msg)
{
    mts_jw w;
    mts_jw_init(&w);
    mts_jw_begin_object(&w);
    mts_jw_key(&w, "error");
    mts_jw_string(&w, msg);
    mts_jw_end_object(&w);
    size_t len = 0;
    char *text = mts_jw_take(&w, &len);
    mts_jw_free(&w);
    if (text) mts_http_respond(c, http_status, "application/json", extra, text, len);
    else mts_http_respond(c, mts_proto_http_status(MTS_ENOMEM), "application/json", NULL,
                         "{\"error\":\"response encoding failed\"}", 36);
    free(text);
}

bool mts_route_match(const char *pattern, const char *path, mts_route_args *a)
{
    const char *p = pattern, *s = path;
    a->n = 0;
    while (*p) {
        if (p[0] == '{' && (p[1] == '}' || (p[1] == '#' && p[2] == '}'))) {
            bool digits = p[1] == '#';
            size_t n = strcspn(s, "/");
            if (n == 0 || n > MTS_ROUTE_ARG_MAX || a->n == MTS_ROUTE_MAX_ARGS) return false;
            for (size_t i = 0; digits && i < n; i++)
                if (s[i] < '0' || s[i] > '9') return false;
            a->arg[a->n] = s;
            a->len[a->n++] = n;
            s += n;
            p += digits ? 3 : 2;
        } else {
            if (*p != *s) return false;
            p++, s++;
        }
    }
    return *s == 0;
}

static bool method_ok(const char *route, const char *method)
{
    return !strcmp(route, method) || (!strcmp(route, "GET") && !strcmp(method, "HEAD"));
}

static const char *hint_for(const mts_router *r, const char *path)
{
    for (const mts_route_hint *const *t = r->hints; t && *t; t++)
        for (const mts_route_hint *h = *t; h->prefix; h++)
            if (!strncmp(path, h->prefix, strlen(h->prefix))) return h->hint;
    return NULL;
}

void mts_router_dispatch(const mts_router *r, const mts_auth *auth, mts_server *srv, mts_http_conn *c,
                         mts_http_req *hr)
{
    mts_route_args a;
    char allow[96] = "";
    size_t alen = 0;
    const char *hint = NULL;
    bool path_known = false;
    for (const mts_route *const *t = r->tables; *t; t++)
        for (const mts_route *rt = *t; rt->pattern; rt++) {
            if (!mts_route_match(rt->pattern, hr->path, &a)) continue;
            if (method_ok(rt->method, hr->method)) {
                mts_err e = {0};
                const char *v = auth ? mts_http_header(hr, "Authorization") : NULL;
                int rc = mts_auth_check(auth, v, v ? strlen(v) : 0, rt->scope, &e);
                if (rc) {
                    json_error(c, mts_proto_http_status(rc),
                               rc == MTS_EUNAUTHENTICATED ? "WWW-Authenticate: Bearer realm=\"mtserve\"\r\n" : NULL,
                               e.msg);
                    return;
                }
                rt->fn(srv, c, hr, &a);
                return;
            }
            path_known = true;
            if (!hint) hint = rt->hint;
            if (!strstr(allow, rt->method) && alen + strlen(rt->method) + 12 < sizeof allow)
                alen += (size_t)snprintf(allow + alen, sizeof allow - alen, "%s%s%s", alen ? ", " : "", rt->method,
                                         strcmp(rt->method, "GET") ? "" : ", HEAD");
        }
    char msg[400];
    if (!path_known) {
        snprintf(msg, sizeof msg, "no route for %s %.200s", hr->method, hr->path);
        hint = hint_for(r, hr->path);
    } else {
        snprintf(msg, sizeof msg, "method %s is not allowed on %.200s", hr->method, hr->path);
    }
    size_t n = strlen(msg);
    if (hint) snprintf(msg + n, sizeof msg - n, " (%s)", hint);
    if (!path_known) {
        json_error(c, mts_proto_http_status(MTS_ENOTFOUND), NULL, msg);
        return;
    }
    /* 405 is the router's own answer: no MTS_E* status means "wrong method" */
    char extra[128];
    snprintf(extra, sizeof extra, "Allow: %s\r\n", allow);
    json_error(c, 405, extra, msg);
}

char *mts_route_arg(const mts_route_args *a, int i, char *out, size_t cap)
{
    snprintf(out, cap, "%.*s", i < a->n ? (int)a->len[i] : 0, i < a->n ? a->arg[i] : "");
    return out;
}

void mts_route_error_text(mts_http_conn *c, int status, const char *msg, int retry_after_s)
{
    char extra[64] = "";
    if (retry_after_s > 0) snprintf(extra, sizeof extra, "Retry-After: %d\r\n", retry_after_s);
    json_error(c, mts_proto_http_status(status), extra[0] ? extra : NULL, msg);
}

void mts_route_error(mts_http_conn *c, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mts_route_error_text(c, status, msg, 0);
}

void mts_route_fail(mts_http_conn *c, char **body, void (*done)(void *arg), void *arg, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mts_http_respond_error_async(c, mts_proto_http_status(status), msg, body, done, arg);
}
