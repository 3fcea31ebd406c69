/*
 * The gRPC front end: one HTTP/2 port (the documents' :50051) serving the KServe v2
 * GRPCInferenceService, the lip-sync inference.InferenceService, grpc.health.v1.Health and
 * server reflection (v1 and v1alpha), on gRPC core (Debian's libgrpc, C API) with protobuf-c
 * messages generated from proto/. Like the HTTP front end it only translates wire messages to
 * and from struct mts_request; see docs/grpc.md for the design and the error mapping.
 */
#ifndef MTS_API_GRPC_SERVER_H
#define MTS_API_GRPC_SERVER_H

#include <stddef.h>

#include "api/auth.h"
#include "serve/server.h"

typedef struct mts_grpc mts_grpc;

typedef struct mts_grpc_opts {
    const char *host;        /* listen address; NULL: 127.0.0.1 */
    int port;                /* 0: ephemeral (tests); mts_grpc_port tells which */
    int threads;             /* completion-queue threads; default 2 */
    size_t max_message;      /* largest request message, bytes (server.max_message_size_mb) */
    /* TLS (all NULL: plaintext). cert + key: PEM files of the server's certificate chain and key;
     * client_ca: PEM roots that must have signed a client certificate (mutual TLS). */
    const char *tls_cert, *tls_key, *tls_client_ca;
    const mts_auth *auth; /* bearer tokens (auth.h) checked on the `authorization` metadata; NULL:
                           * every method open. Must outlive the server */
    /* "native": HTTP/2 on mtserve's own threads, one per connection (grpc_h2.c); "core": gRPC
     * core's server and polling threads. NULL: $MTS_GRPC_TRANSPORT, else native. TLS is always
     * gRPC core's. */
    const char *transport;
    /* native: a connection's thread asks for SCHED_RR 1 (util/rtprio.h) while its messages are
     * small */
    bool light_realtime;
} mts_grpc_opts;

/* Binds, starts the polling threads and returns. On failure nothing is left running. */
int mts_grpc_start(mts_server *srv, const mts_grpc_opts *opts, mts_grpc **out, mts_err *err);
int mts_grpc_port(const mts_grpc *g);
/* Stops taking new calls (GOAWAY to clients); calls in progress go on. Idempotent. */
void mts_grpc_stop_accepting(mts_grpc *g);
/* Call after mts_server_shutdown: cancels what is still open, joins threads, frees. */
void mts_grpc_stop(mts_grpc *g);

#endif
