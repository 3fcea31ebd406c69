/*
 * The REST front end (rest.h): starts the HTTP server with the route tables of the REST modules
 * (the dashboard's and the embeddings endpoint's included) and the front end's own /metrics route, dispatches every request
 * through the router, and cancels the request of a client that went away. A large KServe infer
 * or lip-sync composite upload whose model's queue is full is refused (429) from its head,
 * before its body is read.
 */
#include "api/rest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/dashboard_http.h"
#include "api/embed_http.h"
#include "api/http.h"
#include "api/kserve_http.h"
#include "api/lipsync_http.h"
#include "api/protocol.h"
#include "api/router.h"
#include "api/segment_http.h"

struct mts_rest {
    mts_server *srv;
    mts_http_server *http;
    const mts_auth *auth;
    bool metrics_only;
};

static void route_metrics(mts_server *srv, mts_http_conn *c, mts_http_req *hr, const mts_route_args *a)
{
    size_t len = 0;
    char *text = mts_server_metrics(srv, &len);
    if (!text) {
        mts_route_error(c, MTS_ENOMEM, "out of memory");
        return;
    }
    mts_http_respond(c, 200, "text/plain; version=0.0.4", NULL, text, len);
    free(text);
}

static const mts_route metrics_routes[] = {
    {"GET", "/metrics", route_metrics, NULL, MTS_SCOPE_INFER},
    {NULL, NULL, NULL, NULL, 0},
};

/* Inference first: the table is walked in order, and /v2 requests are the common case. */
static const mts_route *const route_tables[] = {
    mts_kserve_routes, mts_segment_routes, mts_lipsync_routes, metrics_routes, mts_dashboard_routes, mts_embed_routes,
    NULL,
};
static const mts_route_hint *const route_hints[] = {mts_lipsync_hints, NULL};
static const mts_router router = {route_tables, route_hints};
static const mts_route *const metrics_tables[] = {metrics_routes, NULL};
static const mts_route_hint *const no_hints[] = {NULL};
static const mts_router metrics_router = {metrics_tables, no_hints};

static void handler(void *user, mts_http_conn *c, mts_http_req *hr)
{
    mts_rest *r = user;
    mts_router_dispatch(r->metrics_only ? &metrics_router : &router, r->auth, r->srv, c, hr);
}

static void on_cancel(void *user, mts_http_conn *c, mts_http_req *hr)
{
    if (hr->user) mts_request_cancel((mts_request *)hr->user);
}

/* Early refusal of a large inference upload whose model's queue is full: its body is then not
 * read (mts_http_admit_fn). The paths: POST /v2/models/NAME[/versions/V]/infer (KServe) and
 * POST /api/v1/lipsync/NAME/composite. Not with bearer tokens, where an unauthenticated client
 * must not learn a model's queue state. */
static int admit(void *user, const char *method, const char *path, size_t content_length, char *msg, size_t cap,
                 int *retry_after_s)
{
    static const char *const uploads[] = {"/v2/models/{}/infer", "/v2/models/{}/versions/{#}/infer",
                                          MTS_LIPSYNC_HTTP_PREFIX "{}/composite", NULL};
    mts_rest *r = user;
    (void)content_length;
    if (r->auth || r->metrics_only || strcmp(method, "POST")) return 0;
    mts_route_args a;
    int i = 0;
    while (uploads[i] && !mts_route_match(uploads[i], path, &a)) i++;
    if (!uploads[i]) return 0;
    mts_err e = {0};
    int rc = mts_server_admit(r->srv, a.arg[0], a.len[0], &e);
    if (!rc) return 0;
    snprintf(msg, cap, "%s", e.msg);
    *retry_after_s = 1; /* as the full queue's answer after submit */
    return mts_proto_http_status(rc);
}

int mts_rest_start(mts_server *srv, const mts_rest_opts *o, mts_rest **out, mts_err *err)
{
    mts_rest *r = calloc(1, sizeof *r);
    if (!r) return mts_err_set(err, MTS_ENOMEM, "out of memory");
    r->srv = srv;
    r->auth = o->auth;
    r->metrics_only = o->metrics_only;
    mts_http_opts ho = {0};
    ho.host = o->host ? o->host : "127.0.0.1";
    ho.port = o->port;
    ho.io_threads = o->io_threads > 0 ? o->io_threads : 1;
    ho.max_body = o->max_body;
    ho.max_header = 64 * 1024;
    ho.idle_timeout_ms = o->idle_timeout_ms > 0 ? o->idle_timeout_ms : 0; /* 0: http.c's default */
    ho.max_connections = o->max_connections > 0 ? o->max_connections : 4096;
    ho.header_timeout_ms = o->header_timeout_ms;
    ho.max_per_client = o->max_per_client;
    ho.tls_cert = o->tls_cert;
    ho.tls_key = o->tls_key;
    ho.tls_client_ca = o->tls_client_ca;
    ho.align_header = "Inference-Header-Content-Length"; /* binary tensors read in place */
    ho.handler = handler;
    ho.on_cancel = on_cancel;
    ho.admit = admit; /* mts_server_admit never refuses with MTS_EARLY_REFUSAL=0 */
    /* small exchanges get I/O threads of their own ("0": they share the listening threads) */
    const char *light = getenv("MTS_HTTP_LIGHT_IO");
    ho.light_io = !o->metrics_only && !(light && !strcmp(light, "0"));
    ho.light_realtime = o->light_realtime;
    ho.user = r;
    int rc = mts_http_start(&ho, &r->http, err);
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    return MTS_OK;
}

int mts_rest_port(const mts_rest *r)
{
    return mts_http_port(r->http);
}

void mts_rest_stop_accepting(mts_rest *r)
{
    mts_http_stop_accepting(r->http);
}

void mts_rest_stop(mts_rest *r)
{
    if (!r) return;
    mts_http_stop(r->http);
    free(r);
}
