/*
 * The REST front end: one mts_http server whose requests go through the route table (router.h)
 * assembled from the REST modules: KServe v2 (kserve_http.h), segmentation uploads
 * (segment_http.h), lip-sync compositing (lipsync_http.h) and the Prometheus /metrics route
 * (here). A module is added by listing its route table (and 404 hints) in rest.c. When a client
 * goes away before its answer, the front end cancels the request a route keeps in hr->user
 * (a call struct that starts with its mts_request).
 */
#ifndef MTS_API_REST_H
#define MTS_API_REST_H

#include <stdbool.h>
#include <stddef.h>

#include "api/auth.h"
#include "serve/server.h"

typedef struct mts_rest mts_rest;

typedef struct mts_rest_opts {
    const char *host;
    int port;              /* 0: ephemeral (tests) */
    int io_threads;        /* default 1 */
    size_t max_body;       /* bytes; from server.max_message_size_mb */
    int max_connections;   /* 0: 4096 */
    int max_per_client;    /* connections of one client address; 0: no limit */
    int idle_timeout_ms;   /* keep-alive idle close; 0: 60000 */
    int header_timeout_ms; /* request head deadline (slowloris); 0: 10000 */
    const mts_auth *auth;  /* bearer tokens (auth.h); NULL: every route open. Must outlive the server */
    const char *tls_cert, *tls_key, *tls_client_ca; /* PEM files: HTTPS (http.h); NULL: plaintext */
    bool metrics_only;     /* serve only GET /metrics (Triton's separate --metrics-port) */
    bool light_realtime;   /* the light I/O threads ask for SCHED_RR 1 (util/rtprio.h) */
} mts_rest_opts;

int mts_rest_start(mts_server *srv, const mts_rest_opts *opts, mts_rest **out, mts_err *err);
int mts_rest_port(const mts_rest *r);
void mts_rest_stop_accepting(mts_rest *r);
void mts_rest_stop(mts_rest *r);

#endif
