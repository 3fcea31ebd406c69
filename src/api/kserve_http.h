/*
 * The KServe v2 (Open Inference Protocol) REST front end over api/http.c: health, server and
 * model metadata, readiness, inference with JSON tensors and the binary tensor extension,
 * model configuration, repository index/load/unload, statistics, and Prometheus /metrics.
 * It only translates between the wire and struct mts_request; the server core does the rest.
 */
#ifndef MTS_API_KSERVE_HTTP_H
#define MTS_API_KSERVE_HTTP_H

#include "serve/server.h"

typedef struct mts_kserve_http mts_kserve_http;

typedef struct mts_kserve_http_opts {
    const char *host;
    int port;              /* 0: ephemeral (tests) */
    int io_threads;        /* default 1 */
    size_t max_body;       /* bytes; from server.max_message_size_mb */
} mts_kserve_http_opts;

int mts_kserve_http_start(mts_server *srv, const mts_kserve_http_opts *opts, mts_kserve_http **out, mts_err *err);
int mts_kserve_http_port(const mts_kserve_http *h);
void mts_kserve_http_stop_accepting(mts_kserve_http *h);
void mts_kserve_http_stop(mts_kserve_http *h);

/* KServe datatype names ("FP32") <-> engine types; -1 / NULL when not supported. */
const char *mts_kserve_datatype(mts_dtype t);
int mts_kserve_parse_datatype(const char *name, mts_dtype *out);
/* HTTP status for a status code (404, 400, 429, 503, ...). */
int mts_kserve_http_status(int status);

#endif
