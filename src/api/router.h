/*
 * The REST route table: method + path pattern -> handler. Each REST module (KServe, lip-sync,
 * segmentation, the front end's own metrics route) exports a table of mts_route entries ending
 * with an all-NULL entry; mts_router_dispatch walks the tables in order, calls the handler of the
 * first route whose pattern and method match, and answers everything else in one place: 404
 * "no route for ..." when no pattern matches the path, 405 "method ... is not allowed on ..."
 * with an Allow header when patterns match but none for the method. Matching copies nothing
 * and allocates nothing: captures point into the request's path.
 *
 * Patterns are literal text with captures: "{}" matches one path segment of 1..255 characters
 * (no '/'), "{#}" one made of digits only. A GET route also answers HEAD (mts_http sends the
 * headers only).
 *
 * Also here: the error answers of REST handlers, which take MTS_E* statuses and map them
 * through protocol.h, so that no handler spells an HTTP status for an error.
 */
#ifndef MTS_API_ROUTER_H
#define MTS_API_ROUTER_H

#include <stdbool.h>
#include <stddef.h>

#include "api/auth.h"
#include "api/http.h"
#include "serve/server.h"

#define MTS_ROUTE_MAX_ARGS 4
#define MTS_ROUTE_ARG_MAX 255 /* longest capture */

/* The captures of a matched pattern, in pattern order: arg[i][0..len[i]) (not NUL-terminated). */
typedef struct mts_route_args {
    int n;
    const char *arg[MTS_ROUTE_MAX_ARGS];
    size_t len[MTS_ROUTE_MAX_ARGS];
} mts_route_args;

/* Runs on the I/O thread and must not block (as mts_http_handler). A handler that answers later
 * and wants its work cancelled when the client goes away sets hr->user to a struct whose first
 * member is the mts_request it submitted (the front end's on_cancel cancels that request). */
typedef void (*mts_route_fn)(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a);

typedef struct mts_route {
    const char *method;  /* "GET" (answers HEAD too), "POST", ... */
    const char *pattern; /* "/v2/models/{}/versions/{#}/infer" */
    mts_route_fn fn;
    const char *hint;    /* optional: added in parentheses to a 405 answer on this path */
    int scope;           /* enum mts_scope (auth.h): what a token must grant; 0 = infer */
} mts_route;

/* A 404 hint: paths starting with prefix get "(hint)" added to their "no route" answer. */
typedef struct mts_route_hint {
    const char *prefix;
    const char *hint;
} mts_route_hint;

typedef struct mts_router {
    const mts_route *const *tables;     /* NULL-terminated list of route tables */
    const mts_route_hint *const *hints; /* NULL-terminated list of hint tables (NULL-prefix end), may be NULL */
} mts_router;

/* Routes hr to its handler, or answers 404 / 405 itself; with auth (NULL: none), a request to a
 * route whose scope its bearer token does not grant is answered 401 or 403 (auth.h). */
void mts_router_dispatch(const mts_router *r, const mts_auth *auth, mts_server *srv, mts_http_conn *c,
                         mts_http_req *hr);

/* Matches path against a route pattern; fills a with the captures. */
bool mts_route_match(const char *pattern, const char *path, mts_route_args *a);

/* Copies capture i into out (cap bytes, at least MTS_ROUTE_ARG_MAX + 1 to hold any); returns out. */
char *mts_route_arg(const mts_route_args *a, int i, char *out, size_t cap);

/* Answers c at once with the HTTP status of `status` (MTS_E*, mapped by protocol.h) and body
 * {"error":"<message>"}; retry_after_s > 0 adds a Retry-After header. */
void mts_route_error_text(mts_http_conn *c, int status, const char *msg, int retry_after_s);
/* The same with a printf-style message and no Retry-After. */
void mts_route_error(mts_http_conn *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The same for handlers that answer later and free their call state in a done callback
 * (mts_http_respond_error_async: the body is malloc'd into *body, a 429 gets "Retry-After: 1",
 * and done(arg) runs once the answer has been written). */
void mts_route_fail(mts_http_conn *c, char **body, void (*done)(void *arg), void *arg, int status, const char *fmt,
                    ...) __attribute__((format(printf, 6, 7)));

#endif
